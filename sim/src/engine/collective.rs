//! Collectives as steps of point-to-point flows over the real topology.
//!
//! A ring over p members moves n/p bytes per member per step: all-reduce takes 2(p-1)
//! steps (reduce-scatter then all-gather), reduce-scatter and all-gather p-1 each. When
//! the members span several nodes with k > 1 members on each, the collective is
//! hierarchical, as NCCL and Horovod do:
//!
//! ```text
//! all-reduce(n) = reduce-scatter(n) inside each node      k-1 steps of n/k over NVLink
//!               + all-reduce(n/k) across nodes, k rings    2(N-1) steps of n/(kN) over NICs
//!               + all-gather(n) inside each node           k-1 steps of n/k
//! ```
//! Every step ends when its slowest flow ends (the members synchronise each step).

use crate::hardware::Topology;
use crate::lower::{Collective, CollectiveKind};

/// One flow of a step, in cluster device numbering.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepFlow {
    pub source: u32,
    pub target: u32,
    pub bytes: f64,
}

/// One step: flows that all start together; the step ends with the last. A chain's hops
/// (broadcast, reduce) forward data as it arrives, so their latencies add up.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Step {
    pub flows: Vec<StepFlow>,
    pub chain: bool,
}

pub type Steps = Vec<Step>;

fn ring_steps(out: &mut Steps, rings: &[Vec<u32>], steps: u32, chunk_bytes: f64) {
    for _ in 0..steps {
        let mut step = Vec::new();
        for ring in rings {
            let p = ring.len();
            for i in 0..p {
                step.push(StepFlow { source: ring[i], target: ring[(i + 1) % p], bytes: chunk_bytes });
            }
        }
        out.push(Step { flows: step, chain: false });
    }
}

/// Expand a collective into its steps.
pub fn expand(c: &Collective, topo: &Topology) -> Steps {
    let p = c.members.len() as u32;
    let mut out = Vec::new();
    if p <= 1 || c.bytes <= 0.0 {
        return out;
    }
    // Broadcast and reduce: a pipelined chain from (to) the first member; all hops move the
    // whole message at once, so the chain costs its latency plus n / bandwidth.
    if matches!(c.kind, CollectiveKind::Broadcast | CollectiveKind::Reduce) {
        let m = &c.members;
        let hops = (0..m.len() - 1).map(|i| {
            let (a, b) = if c.kind == CollectiveKind::Broadcast { (m[i], m[i + 1]) } else { (m[i + 1], m[i]) };
            StepFlow { source: a, target: b, bytes: c.bytes }
        });
        out.push(Step { flows: hops.collect(), chain: true });
        return out;
    }
    // Group members by node, keeping ring order.
    let mut nodes: Vec<(u32, Vec<u32>)> = Vec::new();
    for &m in &c.members {
        let n = topo.node_of(m);
        match nodes.iter_mut().find(|(x, _)| *x == n) {
            Some((_, v)) => v.push(m),
            None => nodes.push((n, vec![m])),
        }
    }
    let k = nodes[0].1.len();
    let hierarchical = nodes.len() > 1
        && k > 1
        && nodes.iter().all(|(_, v)| v.len() == k)
        && topo.same_switch(nodes[0].1[0], nodes[0].1[1]);
    let n = c.bytes;
    if !hierarchical {
        let ring = vec![c.members.clone()];
        let steps = match c.kind {
            CollectiveKind::AllReduce => 2 * (p - 1),
            _ => p - 1,
        };
        ring_steps(&mut out, &ring, steps, n / p as f64);
        return out;
    }
    let intra: Vec<Vec<u32>> = nodes.iter().map(|(_, v)| v.clone()).collect();
    let inter: Vec<Vec<u32>> = (0..k).map(|i| nodes.iter().map(|(_, v)| v[i]).collect()).collect();
    let (k32, nn) = (k as u32, nodes.len() as u32);
    let kf = k as f64;
    let shard = n / kf / nn as f64;
    match c.kind {
        CollectiveKind::AllReduce => {
            ring_steps(&mut out, &intra, k32 - 1, n / kf);
            ring_steps(&mut out, &inter, 2 * (nn - 1), shard);
            ring_steps(&mut out, &intra, k32 - 1, n / kf);
        }
        CollectiveKind::ReduceScatter => {
            ring_steps(&mut out, &intra, k32 - 1, n / kf);
            ring_steps(&mut out, &inter, nn - 1, shard);
        }
        CollectiveKind::AllGather => {
            ring_steps(&mut out, &inter, nn - 1, shard);
            ring_steps(&mut out, &intra, k32 - 1, n / kf);
        }
        CollectiveKind::Broadcast | CollectiveKind::Reduce => unreachable!("handled above"),
    }
    out
}
