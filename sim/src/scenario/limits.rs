//! Bounds on what a scenario may ask for, checked once the whole scenario is read.
//!
//! Every count the simulator stores has a type wide enough for these bounds (device ids,
//! stream and task indices are u32; times are u64 nanoseconds), and every rate is bounded
//! away from zero and infinity so that no duration is infinite or wraps the clock. The
//! bounds are far beyond any real system (a million devices, 134 M tokens per sequence,
//! links from 1 kB/s to 10 PB/s); a value outside them is refused with the key that holds it.

use super::reader::{Result, invalid};
use super::{Scenario, Training};
use crate::hardware::{ClusterSpec, DeviceSpec, LinkSpec, NodeSpec, Precision};
use crate::workload::Workload;

/// Devices in a cluster (`cluster.nodes` x the node's devices).
pub const MAX_DEVICES: u64 = 1 << 20;
/// NICs per node.
pub const MAX_NICS: u32 = 1024;
/// Entries of `cluster.device_overrides` (device classes are u16).
pub const MAX_OVERRIDES: usize = 1024;
/// Tokens per sequence (`training.seq_len`, position tables).
pub const MAX_SEQ_LEN: u32 = 1 << 27;
/// Transformer layers (a layer's memory tag is an i32).
pub const MAX_LAYERS: u32 = 1 << 16;
/// Hidden and feed-forward widths, heads.
pub const MAX_WIDTH: u32 = 1 << 20;
/// Vocabulary entries.
pub const MAX_VOCAB: u32 = 1 << 24;
/// Rates: FLOP/s of a device at its efficiency, bytes/s of memory and links at theirs.
pub const MIN_FLOPS: f64 = 1e6;
pub const MAX_FLOPS: f64 = 1e19;
pub const MIN_BYTES_PER_S: f64 = 1e3;
pub const MAX_BYTES_PER_S: f64 = 1e16;
/// Latencies and fixed per-op costs, in seconds.
pub const MAX_LATENCY_S: f64 = 10.0;
/// Memory capacities and allowances, in bytes (1 EiB).
pub const MAX_BYTES: f64 = (1u64 << 60) as f64;
/// Smallest gradient / parameter bucket: each bucket is a task.
pub const MIN_BUCKET_BYTES: f64 = 256.0;

/// Check the bounds of a parsed scenario.
pub fn check(s: &Scenario) -> Result<()> {
    check_workload(&s.workload)?;
    check_training(&s.training)?;
    check_cluster(&s.cluster, s.training.precision)?;
    if let Some(h) = s.options.host_op_s
        && h > MAX_LATENCY_S
    {
        return Err(invalid("simulation.host_op_s", format!("{h} s; allowed: 0 to {MAX_LATENCY_S} s")));
    }
    if let Some(b) = s.options.framework_overhead_bytes
        && b as f64 > MAX_BYTES
    {
        return Err(invalid("simulation.framework_overhead_bytes", format!("{b}; allowed: 0 to 2^60 bytes")));
    }
    if s.plan.bucket_bytes < MIN_BUCKET_BYTES {
        return Err(invalid(
            "plan.bucket_bytes",
            format!(
                "{}; allowed: at least {MIN_BUCKET_BYTES} bytes (each bucket is a collective)",
                s.plan.bucket_bytes
            ),
        ));
    }
    check_program_size(s)
}

/// The device count of `nodes` nodes of `per_node` devices, refused above [`MAX_DEVICES`].
pub fn device_count(nodes: u32, per_node: u32, path: &str) -> Result<u32> {
    let n = nodes as u64 * per_node as u64;
    if n > MAX_DEVICES {
        return Err(invalid(
            path,
            format!("{nodes} nodes x {per_node} devices = {n} devices; allowed: at most {MAX_DEVICES} devices in all"),
        ));
    }
    Ok(n as u32)
}

fn check_workload(w: &Workload) -> Result<()> {
    let t = &w.transformer;
    let key = |k: &str| format!("workload.transformer.{k}");
    let bounded = [
        ("layers", t.layers, MAX_LAYERS),
        ("hidden", t.hidden, MAX_WIDTH),
        ("heads", t.heads, MAX_WIDTH),
        ("kv_heads", t.kv_heads, MAX_WIDTH),
        ("ffn_hidden", t.ffn_hidden, MAX_WIDTH),
        ("vocab", t.vocab, MAX_VOCAB),
    ];
    for (k, v, max) in bounded {
        if v > max {
            return Err(invalid(&key(k), format!("{v}; allowed: at most {max}")));
        }
    }
    if w.net.is_none() && (t.kv_heads == 0 || t.heads == 0 || !t.heads.is_multiple_of(t.kv_heads)) {
        return Err(invalid(
            &key("kv_heads"),
            format!("{} key-value heads for {} heads; allowed: a divisor of heads", t.kv_heads, t.heads),
        ));
    }
    if let crate::workload::transformer::Input::Tokens { positions, token_types } = t.input
        && positions.max(token_types) > MAX_SEQ_LEN
    {
        return Err(invalid(&key("max_positions"), format!("{positions}; allowed: at most {MAX_SEQ_LEN}")));
    }
    Ok(())
}

fn check_training(t: &Training) -> Result<()> {
    if t.seq_len > MAX_SEQ_LEN {
        return Err(invalid("training.seq_len", format!("{}; allowed: 1 to {MAX_SEQ_LEN} tokens", t.seq_len)));
    }
    Ok(())
}

/// The limits on a node's links and NIC count (`path` names the node: `cluster.node`, or
/// `node` where `nccl-test --node` reads one from a file).
pub fn check_node_links(n: &NodeSpec, path: &str) -> Result<()> {
    if n.nics > MAX_NICS {
        return Err(invalid(&format!("{path}.nics"), format!("{}; allowed: 1 to {MAX_NICS}", n.nics)));
    }
    if let Some(l) = &n.intra_node {
        check_link(l, &format!("{path}.intra_node"))?;
    }
    check_link(&n.host.pcie, &format!("{path}.pcie"))
}

fn check_cluster(c: &ClusterSpec, precision: Precision) -> Result<()> {
    device_count(c.nodes, c.node.devices, "cluster.nodes")?;
    check_node_links(&c.node, "cluster.node")?;
    if c.overrides.len() > MAX_OVERRIDES {
        return Err(invalid(
            "cluster.device_overrides",
            format!("{} entries; allowed: at most {MAX_OVERRIDES}", c.overrides.len()),
        ));
    }
    check_device(&c.node.device, precision, "cluster.node.device")?;
    for (i, o) in c.overrides.iter().enumerate() {
        check_device(&o.device, precision, &format!("cluster.device_overrides[{i}].device"))?;
    }
    check_link(&c.node.nic, "cluster.inter_node")?;
    if c.node.host.dram_bytes > MAX_BYTES {
        return Err(invalid(
            "cluster.node.host_dram_bytes",
            format!("{}; allowed: at most 2^60", c.node.host.dram_bytes),
        ));
    }
    Ok(())
}

fn out_of(x: f64, min: f64, max: f64) -> bool {
    !(x.is_finite() && x >= min && x <= max)
}

/// A device must have a peak at the training precision (or a wider one it falls back to),
/// and rates a clock of nanoseconds can count.
fn check_device(d: &DeviceSpec, precision: Precision, path: &str) -> Result<()> {
    let peak = d.peak_flops.at(precision);
    if peak <= 0.0 {
        let has: Vec<&str> = [
            ("fp32", d.peak_flops.fp32),
            ("fp16", d.peak_flops.fp16),
            ("bf16", d.peak_flops.bf16),
            ("fp8", d.peak_flops.fp8),
        ]
        .iter()
        .filter(|(_, v)| v.is_some())
        .map(|(n, _)| *n)
        .collect();
        return Err(invalid(
            &format!("{path}.peak_flops"),
            format!(
                "no peak for the training precision {} (nor fp32 to fall back to); the device gives {}; add \"{}\" (FLOP/s), or set training.precision to one it has",
                precision.name(),
                if has.is_empty() { "none".to_string() } else { has.join(", ") },
                precision.name()
            ),
        ));
    }
    let flops = peak * d.gemm_efficiency_at(precision);
    if out_of(flops, MIN_FLOPS, MAX_FLOPS) {
        return Err(invalid(
            &format!("{path}.peak_flops"),
            format!(
                "{peak:e} FLOP/s at {} x gemm_efficiency {} = {flops:e}; allowed: {MIN_FLOPS:e} to {MAX_FLOPS:e} FLOP/s",
                precision.name(),
                d.gemm_efficiency_at(precision)
            ),
        ));
    }
    let mem = d.mem_bandwidth_bytes_per_s * d.mem_efficiency;
    if out_of(mem, MIN_BYTES_PER_S, MAX_BYTES_PER_S) {
        return Err(invalid(
            &format!("{path}.mem_bandwidth_bytes_per_s"),
            format!(
                "{:e} x mem_efficiency {} = {mem:e} bytes/s; allowed: {MIN_BYTES_PER_S:e} to {MAX_BYTES_PER_S:e} bytes/s",
                d.mem_bandwidth_bytes_per_s, d.mem_efficiency
            ),
        ));
    }
    if out_of(d.kernel_launch_s, 0.0, MAX_LATENCY_S) {
        return Err(invalid(
            &format!("{path}.kernel_launch_s"),
            format!("{}; allowed: 0 to {MAX_LATENCY_S} s", d.kernel_launch_s),
        ));
    }
    if out_of(d.hbm_bytes, 0.0, MAX_BYTES) {
        return Err(invalid(&format!("{path}.hbm_bytes"), format!("{}; allowed: at most 2^60 bytes", d.hbm_bytes)));
    }
    if let Some((name, e)) = d.op_efficiency.iter().find(|(_, e)| out_of(flops * e, MIN_FLOPS, MAX_FLOPS)) {
        return Err(invalid(
            &format!("{path}.op_efficiency.{name}"),
            format!("{e} gives {:e} FLOP/s; allowed: at least {MIN_FLOPS:e} FLOP/s", flops * e),
        ));
    }
    Ok(())
}

pub(super) fn check_link(l: &LinkSpec, path: &str) -> Result<()> {
    let bw = l.effective_bytes_per_s();
    if out_of(bw, MIN_BYTES_PER_S, MAX_BYTES_PER_S) {
        return Err(invalid(
            &format!("{path}.bandwidth_bytes_per_s"),
            format!(
                "{:e} x efficiency {} = {bw:e} bytes/s; allowed: {MIN_BYTES_PER_S:e} to {MAX_BYTES_PER_S:e} bytes/s",
                l.bandwidth_bytes_per_s, l.efficiency
            ),
        ));
    }
    if out_of(l.latency_s, 0.0, MAX_LATENCY_S) {
        return Err(invalid(&format!("{path}.latency_s"), format!("{}; allowed: 0 to {MAX_LATENCY_S} s", l.latency_s)));
    }
    Ok(())
}

/// Refuse a plan whose lowered program would not fit in memory (see `lower::size`). Policies
/// that try smaller micro-batches (partition exploration, training runs) are sized for one
/// sample per micro-batch.
fn check_program_size(s: &Scenario) -> Result<()> {
    let explores = s.plan.partition_policy == Some(crate::plan::PartitionPolicy::Explore) || s.run.is_some();
    let most = explores.then(|| s.training.global_batch / s.plan.dp.max(1));
    let size = crate::lower::size::estimate(s, most);
    if size.too_large() {
        let (key, why) = size.explain();
        return Err(invalid(key, why));
    }
    if let Some(crate::plan::TokenSlices::Auto { granularity }) = s.plan.token_slices {
        let problem = crate::policy::token_slicing::SliceProblem {
            seq_len: s.plan.seq_len,
            batch: s.training.global_batch / s.plan.dp.max(1),
            stages: s.plan.pp,
            granularity,
        };
        problem.check_size().map_err(|e| invalid("plan.token_granularity", e))?;
    }
    Ok(())
}
