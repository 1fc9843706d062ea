//! One collective alone on a cluster, as nccl-tests runs it: the time of one call, and what
//! NCCL would choose for it. Bus bandwidth follows nccl-tests' definitions
//! (NVIDIA/nccl-tests doc/PERFORMANCE.md): algbw = S / t; busbw = algbw x 2(n-1)/n for
//! all-reduce, x (n-1)/n for all-gather, reduce-scatter and all-to-all, x 1 for broadcast and
//! reduce.

use super::collective::nccl_plan;
use super::{HostCosts, RunError, RunOptions, run};
use crate::hardware::nccl::Plan;
use crate::hardware::{ClusterSpec, Topology};
use crate::lower::{Collective, CollectiveKind, NONE, Program, STREAMS, Task, TaskKind};
use crate::network::NetworkKind;
use crate::report::timeline::{Label, MemoryBreakdown, Phase, StreamKind};

/// One timed collective.
#[derive(Clone, Copy, Debug)]
pub struct LoneRun {
    pub bytes: f64,
    pub time_s: f64,
    pub algbw_bytes_per_s: f64,
    pub busbw_bytes_per_s: f64,
    /// NCCL's algorithm, protocol and channels (`None` off NVIDIA GPUs).
    pub plan: Option<Plan>,
}

/// GPU memory (bytes, on the member that holds the most) of the NCCL communicator a sweep of
/// `kind` over `sizes` runs on, the first `per_node` devices of each node: every algorithm its
/// calls take connects once (`engine::communicators`); 0 off NVIDIA GPUs.
pub fn sweep_buffer_bytes(cluster: &ClusterSpec, kind: CollectiveKind, per_node: u32, sizes: &[f64]) -> f64 {
    let topo = Topology::new(cluster);
    let members = lone_members(cluster, per_node);
    let devices = cluster.device_count();
    let p = Program {
        devices: (0..devices).collect(),
        mirror: (0..devices).collect(),
        collectives: sizes.iter().map(|&b| Collective::new(kind, members.clone(), b)).collect(),
        ..Program::default()
    };
    super::communicators::nccl_buffer_bytes(&p, &topo).into_iter().fold(0.0, f64::max)
}

/// The first `per_node` devices of each of the cluster's nodes.
fn lone_members(cluster: &ClusterSpec, per_node: u32) -> Vec<u32> {
    let per_node = per_node.clamp(1, cluster.node.devices);
    (0..cluster.nodes).flat_map(|n| (0..per_node).map(move |i| n * cluster.node.devices + i)).collect()
}

/// nccl-tests' bus-bandwidth factor for `kind` over `ranks`.
pub fn bus_factor(kind: CollectiveKind, ranks: u32) -> f64 {
    let n = ranks as f64;
    match kind {
        CollectiveKind::AllReduce => 2.0 * (n - 1.0) / n,
        // All-to-all: 1/n of each buffer stays local (nccl-tests src/alltoall.cu, AlltoAllGetBw).
        CollectiveKind::AllGather | CollectiveKind::ReduceScatter | CollectiveKind::AllToAll => (n - 1.0) / n,
        CollectiveKind::Broadcast | CollectiveKind::Reduce => 1.0,
    }
}

/// Run `kind` over the first `per_node` devices of each of the cluster's nodes, `bytes` on
/// each rank (nccl-tests' size: the whole buffer of all-reduce, broadcast and reduce, the
/// gathered buffer of all-gather, the input of reduce-scatter, each rank's whole send buffer
/// of all-to-all, `bytes / n` of it for each rank). The time includes the
/// device's kernel launch, as in a training step.
pub fn lone_collective(
    cluster: &ClusterSpec,
    kind: CollectiveKind,
    per_node: u32,
    bytes: f64,
    network: NetworkKind,
) -> Result<LoneRun, RunError> {
    let topo = Topology::new(cluster);
    let members = lone_members(cluster, per_node);
    let devices = cluster.device_count();
    let mut p = Program {
        devices: (0..devices).collect(),
        stages: vec![0; devices as usize],
        mirror: (0..devices).collect(),
        streams: vec![Vec::new(); devices as usize * STREAMS],
        static_memory: vec![MemoryBreakdown::default(); devices as usize],
        labels: vec![Label { op: "collective", layer: -1, phase: Phase::Forward, chunk: 0 }],
        ..Program::default()
    };
    let collective = Collective::new(kind, members.clone(), bytes);
    let plan = nccl_plan(&collective, &topo);
    p.collectives.push(collective);
    let streams: Vec<u32> = members.iter().map(|&d| Program::stream_index(d, StreamKind::Compute)).collect();
    p.tasks.push(Task {
        kind: TaskKind::Collective,
        streams: streams.len() as u32,
        payload: 0,
        label: 0,
        micro_batch: 0,
        memory: NONE,
        stream: streams[0],
    });
    for &s in &streams {
        p.streams[s as usize].push(0);
    }
    let launch_ns = (cluster.node.device.kernel_launch_s * 1e9).round() as u64;
    let opts = RunOptions {
        network,
        record: false,
        collective_launch_ns: launch_ns,
        kernel_jitter: 0.0,
        kernel_jitter_correlation_s: 0.0,
        kernel_jitter_draws: false,
        seed: 0,
    };
    let r = run(&p, &topo, &[], &HostCosts::default(), opts)?;
    let time_s = r.iteration_ns as f64 * 1e-9;
    let algbw = if time_s > 0.0 { bytes / time_s } else { 0.0 };
    Ok(LoneRun {
        bytes,
        time_s,
        algbw_bytes_per_s: algbw,
        busbw_bytes_per_s: algbw * bus_factor(kind, members.len() as u32),
        plan,
    })
}
