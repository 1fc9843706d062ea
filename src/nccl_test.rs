//! `trainsim nccl-test`: one collective alone over a range of sizes, printed as nccl-tests
//! prints it (size, time, algbw, busbw; NVIDIA/nccl-tests doc/PERFORMANCE.md), with the
//! algorithm, protocol and channels NCCL would use. The simulation is `sim::engine::lone`.

use sim::engine::lone::{LoneRun, lone_collective};
use sim::hardware::nccl_env::NcclEnv;
use sim::hardware::{ClusterSpec, catalog};
use sim::lower::CollectiveKind;
use sim::network::NetworkKind;

/// Most nodes a run may span, and the largest size (1 TiB).
const MAX_NODES: u32 = 4096;
const MAX_BYTES: u64 = 1 << 40;
/// Most ranks of an all-to-all: it simulates a flow per pair of GPUs that exchange data
/// (p(k-1) over NVLink and p(N-1) over the network with PXN), and max-min fair sharing of that
/// many flows costs about their square: 256 ranks take seconds, 512 a minute.
const MAX_ALL_TO_ALL_RANKS: u32 = 256;

#[derive(clap::Args)]
pub struct Args {
    /// The collective: all_reduce, all_gather, reduce_scatter, broadcast, reduce or all_to_all
    /// (alltoall; its size is each rank's whole send buffer, as nccl-tests' alltoall_perf).
    #[arg(long, default_value = "all_reduce")]
    op: String,
    /// Node preset (trainsim presets lists them), or a JSON file holding a node as a scenario's
    /// `cluster.node` gives one (a preset's name, or an object: a preset's values overridden, or
    /// all given; docs/scenario.md).
    #[arg(long, default_value = "dgx-a100-80gb")]
    node: String,
    /// Nodes the collective spans.
    #[arg(long, default_value_t = 1)]
    nodes: u32,
    /// NICs per node, overriding the preset's.
    #[arg(long)]
    nics: Option<u32>,
    /// NIC link preset, overriding the preset's (e.g. ib-hdr, eth-100g).
    #[arg(long)]
    nic: Option<String>,
    /// GPUs taking part on each node (default: all of the node's).
    #[arg(long)]
    gpus: Option<u32>,
    /// Smallest size in bytes (suffixes K, M, G: powers of 1024, as nccl-tests).
    #[arg(long, default_value = "8")]
    min_bytes: String,
    /// Largest size in bytes.
    #[arg(long, default_value = "8G")]
    max_bytes: String,
    /// Each size is this many times the previous one.
    #[arg(long, default_value_t = 2)]
    step_factor: u32,
    /// The algorithms NCCL may use, as NCCL_ALGO says it (e.g. ring,tree; ^nvls disables
    /// NVLS). Default: all.
    #[arg(long)]
    algo: Option<String>,
    /// The protocols NCCL may use, as NCCL_PROTO says it (e.g. Simple; ^LL128). Default: all.
    #[arg(long)]
    proto: Option<String>,
    /// The NCCL release the run uses (e.g. 2.19): before 2.22 the communicator connects its
    /// rings, trees and NVLS when created, so the buffers line counts them all. Default: 2.30.
    #[arg(long)]
    nccl_version: Option<String>,
    /// Link sharing model: fair or ideal.
    #[arg(long, default_value = "fair")]
    network: String,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

fn parse_op(s: &str) -> Result<CollectiveKind, String> {
    Ok(match s.replace('-', "_").as_str() {
        "all_reduce" | "allreduce" => CollectiveKind::AllReduce,
        "all_gather" | "allgather" => CollectiveKind::AllGather,
        "reduce_scatter" | "reducescatter" => CollectiveKind::ReduceScatter,
        "broadcast" => CollectiveKind::Broadcast,
        "reduce" => CollectiveKind::Reduce,
        "all_to_all" | "alltoall" => CollectiveKind::AllToAll,
        _ => {
            return Err(format!(
                "--op: unknown collective {s:?}; expected all_reduce, all_gather, reduce_scatter, broadcast, reduce or \
                 all_to_all"
            ));
        }
    })
}

/// A size as nccl-tests reads it: a number with an optional K, M or G (powers of 1024).
fn parse_size(key: &str, s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mult) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 1u64 << 10),
        Some('M') => (&t[..t.len() - 1], 1 << 20),
        Some('G') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    let v: u64 =
        num.parse().map_err(|_| format!("{key}: {s:?} is not a size (a whole number, optionally with K, M or G)"))?;
    match v.checked_mul(mult) {
        Some(b) if (1..=MAX_BYTES).contains(&b) => Ok(b),
        _ => Err(format!("{key}: {s:?} is outside 1 byte to 1T")),
    }
}

/// `--node`: a preset's name, or a JSON file (a name ending in `.json`, or a file that exists)
/// holding a node as `cluster.node` takes one.
fn node_arg(arg: &str) -> Result<sim::hardware::NodeSpec, String> {
    if let Some(node) = catalog::node_preset(arg) {
        return Ok(node);
    }
    let path = std::path::Path::new(arg);
    if arg.ends_with(".json") || path.is_file() {
        let text = std::fs::read_to_string(path).map_err(|e| format!("--node: cannot read {arg}: {e}"))?;
        return sim::scenario::parse_node(&text).map_err(|e| format!("--node {arg}: {}: {}", e.path, e.message));
    }
    let names: Vec<String> = catalog::nodes().into_iter().map(|n| n.name).collect();
    Err(format!(
        "--node: unknown node preset {arg:?}; expected one of {}, or a JSON file holding a node",
        names.join(", ")
    ))
}

pub fn run(a: &Args) -> Result<(), String> {
    let kind = parse_op(&a.op)?;
    let mut node = node_arg(&a.node)?;
    if let Some(n) = a.nics {
        if n == 0 || n > node.devices {
            return Err(format!("--nics: {n} is outside 1 to {} (one per GPU at most)", node.devices));
        }
        node.nics = n;
    }
    if let Some(name) = &a.nic {
        node.nic = catalog::link_preset(name).ok_or_else(|| {
            let names: Vec<String> = catalog::links().into_iter().map(|l| l.name).collect();
            format!("--nic: unknown link preset {name:?}; expected one of {}", names.join(", "))
        })?;
    }
    if a.nodes == 0 || a.nodes > MAX_NODES {
        return Err(format!("--nodes: {} is outside 1 to {MAX_NODES}", a.nodes));
    }
    let gpus = a.gpus.unwrap_or(node.devices);
    if gpus == 0 || gpus > node.devices {
        return Err(format!("--gpus: {gpus} is outside 1 to {} (GPUs of a {} node)", node.devices, node.name));
    }
    // A node from a file may hold up to a scenario's 2^20 devices: the product is checked
    // before it is used (it overflowed a u32 before the limit).
    let ranks = sim::scenario::limits::device_count(a.nodes, gpus, "--nodes x --gpus")
        .map_err(|e| format!("{}: {}", e.path, e.message))?;
    if ranks < 2 {
        return Err("--nodes x --gpus: a collective needs at least 2 ranks".into());
    }
    if kind == CollectiveKind::AllToAll && ranks > MAX_ALL_TO_ALL_RANKS {
        return Err(format!(
            "--nodes x --gpus: {ranks} ranks; all_to_all simulates a flow per pair of GPUs, so its cost grows with the \
             square of the ranks: at most {MAX_ALL_TO_ALL_RANKS}"
        ));
    }
    let network = NetworkKind::parse(&a.network)
        .ok_or_else(|| format!("--network: {:?} is not one of {}", a.network, NetworkKind::NAMES.join(", ")))?;
    let min = parse_size("--min-bytes", &a.min_bytes)?;
    let max = parse_size("--max-bytes", &a.max_bytes)?;
    if min > max {
        return Err(format!("--min-bytes ({min}) is larger than --max-bytes ({max})"));
    }
    if a.step_factor < 2 {
        return Err(format!("--step-factor: {} must be at least 2", a.step_factor));
    }
    let mut cluster = ClusterSpec::new(node, a.nodes);
    cluster.nccl = NcclEnv::parse(a.algo.as_deref(), None)
        .map_err(|e| format!("--algo: {e}"))
        .and_then(|_| NcclEnv::parse(a.algo.as_deref(), a.proto.as_deref()).map_err(|e| format!("--proto: {e}")))?
        .with_release(a.nccl_version.as_deref(), None)
        .map_err(|e| format!("--nccl-version: {e}"))?;
    let mut rows: Vec<LoneRun> = Vec::new();
    let mut size = min;
    loop {
        rows.push(lone_collective(&cluster, kind, gpus, size as f64, network).map_err(|e| e.to_string())?);
        match size.checked_mul(a.step_factor as u64) {
            Some(next) if next <= max => size = next,
            _ => break,
        }
    }
    let sizes: Vec<f64> = rows.iter().map(|r| r.bytes).collect();
    let buffers = sim::engine::lone::sweep_buffer_bytes(&cluster, kind, gpus, &sizes);
    if a.json {
        let results: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| {
                serde_json::json!({
                    "size_bytes": r.bytes,
                    "time_us": r.time_s * 1e6,
                    "algbw_GBps": r.algbw_bytes_per_s / 1e9,
                    "busbw_GBps": r.busbw_bytes_per_s / 1e9,
                    "algorithm": r.plan.map(|p| p.algo.name()),
                    "protocol": r.plan.map(|p| p.proto.name()),
                    "channels": r.plan.map(|p| p.channels),
                })
            })
            .collect();
        let v = serde_json::json!({
            "op": a.op.replace('-', "_"),
            "node": a.node,
            "nodes": a.nodes,
            "gpus_per_node": gpus,
            "ranks": ranks,
            "network": a.network,
            "nccl_algo": a.algo,
            "nccl_proto": a.proto,
            "nccl_version": a.nccl_version,
            "results": results,
            "nccl_buffer_bytes": buffers,
        });
        println!("{}", serde_json::to_string_pretty(&v).expect("serializable"));
        return Ok(());
    }
    println!("# trainsim nccl-test: {} over {ranks} ranks ({} x {gpus} GPUs of {})", a.op, a.nodes, a.node);
    println!("# busbw as nccl-tests defines it (doc/PERFORMANCE.md); algorithm and protocol as NCCL 2.30 would pick");
    if cluster.nccl.restricted() {
        println!("# among those {} allows", cluster.nccl.describe());
    }
    if sim::hardware::nccl::NcclSystem::new(&cluster).is_none() {
        println!(
            "# {} is not an NVIDIA GPU: generic ring and hierarchical collectives, no NCCL plan",
            cluster.node.device.name
        );
    }
    if buffers > 0.0 {
        println!(
            "# the communicator's buffers after the sweep: {:.0} MiB per GPU ({}, NCCL {}'s sizes)",
            buffers / 1048576.0,
            if cluster.nccl.connects_at_creation() { "all it connects when created" } else { "the algorithms it used" },
            cluster.nccl.version.as_deref().unwrap_or("2.30")
        );
    }
    println!(
        "#{:>14} {:>12} {:>9} {:>9}  {:<5} {:<6} {:>8}",
        "size(B)", "time(us)", "algbw", "busbw", "algo", "proto", "channels"
    );
    for r in &rows {
        let (algo, proto, ch) = r.plan.map_or(("-", "-", String::from("-")), |p| {
            (p.algo.name(), p.proto.name(), format!("{}/{}", p.channels, p.max_channels))
        });
        println!(
            "{:>15} {:>12.2} {:>9.2} {:>9.2}  {:<5} {:<6} {:>8}",
            r.bytes,
            r.time_s * 1e6,
            r.algbw_bytes_per_s / 1e9,
            r.busbw_bytes_per_s / 1e9,
            algo,
            proto,
            ch
        );
    }
    Ok(())
}
