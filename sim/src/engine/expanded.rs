//! A collective's steps as the engine runs them: routes resolved, mirrored devices mapped
//! onto the simulated ones, and consecutive ring steps over the same pairs merged.

use super::collective::{Steps, expand, nccl_plan};
use crate::hardware::Topology;
use crate::lower::{Collective, NONE, Program};

/// A collective's expansion with routes resolved and symmetry applied.
pub(super) struct Expanded {
    pub(super) steps: Vec<ExpStep>,
    /// SMs its kernel holds on each member (NCCL's channels; 0 off GPUs).
    pub(super) sms: u32,
    /// Memory bandwidth it takes on each member while it runs alone (bytes/s): its kernel's
    /// copies and, across nodes, the NIC's DMA.
    pub(super) hbm_bytes_per_s: f64,
    /// The NIC's share of that (reading the send buffers, writing the receive buffers).
    pub(super) dma_bytes_per_s: f64,
    /// Threads its kernel keeps resident on each member (`Plan::threads`).
    pub(super) threads: f64,
    /// Simulated members, as device indices.
    pub(super) members: Vec<u32>,
}

pub(super) struct ExpStep {
    /// (links, bytes, source, target, ceiling in bytes/s)
    pub(super) flows: Vec<([u32; 2], f64, u32, u32, f64)>,
    pub(super) latency_ns: u64,
}

fn ns(s: f64) -> u64 {
    (s * 1e9).round() as u64
}

impl Expanded {
    pub(super) fn new(col: &Collective, p: &Program, topo: &Topology) -> Expanded {
        let steps: Steps = expand(col, topo);
        let simulated = |d: u32| {
            let m = p.mirror[d as usize];
            m != NONE && p.devices[m as usize] == d
        };
        let map = |d: u32| p.devices[p.mirror[d as usize] as usize];
        // `calls` back-to-back calls: every step pays its latency and moves its bytes that
        // many times (as merged ring steps do, below).
        let calls = col.calls.max(1) as f64;
        let steps = steps
            .into_iter()
            .map(|st| {
                let mut latency = 0.0f64;
                let chain = st.chain;
                let fixed = st.latency_s;
                let flows = st
                    .flows
                    .iter()
                    .filter(|f| simulated(f.source))
                    .map(|f| {
                        let r = topo.route(f.source, f.target);
                        latency = if chain { latency + r.latency_s } else { latency.max(r.latency_s) };
                        let mut links = r.links;
                        if p.symmetric {
                            for l in links.iter_mut() {
                                *l = topo.map_link(*l, &map);
                            }
                        }
                        (links, f.bytes * calls, f.source, f.target, f.cap_bytes_per_s)
                    })
                    .collect();
                (ExpStep { flows, latency_ns: ns(fixed.unwrap_or(latency) * calls) }, chain)
            })
            .collect::<Vec<_>>();
        let members = col.members.iter().filter(|&&d| simulated(d)).map(|&d| p.mirror[d as usize]).collect();
        let plan = nccl_plan(col, topo);
        let sms = plan.map_or(0, |plan| plan.channels);
        let (traffic, dma) = plan.map_or((0.0, 0.0), |plan| hbm_traffic(col, plan.algo, topo));
        let bus = plan.map_or(0.0, |plan| plan.bus_bytes_per_s);
        let threads = plan.map_or(0.0, |plan| plan.threads());
        Expanded {
            steps: merge_ring_runs(steps),
            members,
            sms,
            hbm_bytes_per_s: traffic * bus,
            dma_bytes_per_s: dma * bus,
            threads,
        }
    }
}

/// Bytes an NCCL kernel reads and writes in a member GPU's memory per byte of its bus
/// bandwidth (what nccl-tests' busbw counts through each GPU). Each bus byte leaves one GPU and
/// arrives at another: read from memory where it is sent, written where it lands; a reduction
/// also reads the local operand it adds (NCCL's `recvReduceSend` reads the incoming chunk and
/// its own: `src/device/prims_simple.h`), but for NVLS, whose switch reduces (`all_reduce.h`,
/// `multimem.ld_reduce`). Across nodes the network transport stages each byte through buffers
/// in GPU memory (the kernel writes the send buffer the NIC reads, the NIC writes the receive
/// buffer the kernel reads: `src/transport/net.cc`), 4 more, for the share of a member's
/// traffic that crosses the NIC: one hop in `ppn` of a ring through `ppn` GPUs of each node.
/// Two of those 4 are the NIC's DMA, not the kernel's threads (returned apart, as the second).
/// The rate is the plan's bus bandwidth, an upper bound where the links are shared.
fn hbm_traffic(col: &Collective, algo: crate::hardware::nccl::Algo, topo: &Topology) -> (f64, f64) {
    use crate::lower::CollectiveKind as K;
    let base = match col.kind {
        _ if algo == crate::hardware::nccl::Algo::Nvls => 2.0,
        K::AllReduce | K::ReduceScatter | K::Reduce => 3.0,
        K::AllGather | K::Broadcast | K::AllToAll => 2.0,
    };
    let nodes = super::collective::by_node(&col.members, topo);
    if nodes.len() <= 1 {
        return (base, 0.0);
    }
    let ppn = col.members.len() as f64 / nodes.len() as f64;
    (base + 4.0 / ppn.max(1.0), 2.0 / ppn.max(1.0))
}

/// Consecutive ring steps over the same pairs move the same bytes over the same links, one
/// after another: one step of their summed bytes and latencies costs the same without other
/// traffic, and the engine far fewer flows. Chained steps are kept apart.
fn merge_ring_runs(steps: Vec<(ExpStep, bool)>) -> Vec<ExpStep> {
    let mut merged: Vec<ExpStep> = Vec::with_capacity(steps.len());
    let mut last_chain = true;
    for (st, chain) in steps {
        let same = !chain
            && !last_chain
            && merged.last().is_some_and(|m: &ExpStep| {
                m.flows.len() == st.flows.len()
                    && m.flows.iter().zip(&st.flows).all(|(a, b)| a.0 == b.0 && a.2 == b.2 && a.3 == b.3 && a.4 == b.4)
            });
        if same {
            let m = merged.last_mut().expect("checked");
            for (a, b) in m.flows.iter_mut().zip(&st.flows) {
                a.1 += b.1;
            }
            m.latency_ns += st.latency_ns;
        } else {
            merged.push(st);
        }
        last_chain = chain;
    }
    merged
}

#[cfg(test)]
mod tests {
    use super::hbm_traffic;
    use crate::hardware::nccl::Algo;
    use crate::hardware::{ClusterSpec, Topology, catalog};
    use crate::lower::{Collective, CollectiveKind as K};

    /// NCCL's memory accesses per bus byte: 2 for a gather, 3 for a reduction, 2 for NVLS's
    /// switch reduction; across nodes 4 more on the one hop in `ppn` through the NIC, 2 of them
    /// the NIC's.
    #[test]
    fn a_collectives_memory_traffic_follows_nccls_copies() {
        let node = catalog::node_preset("dgx-h100").expect("preset");
        let topo = Topology::new(&ClusterSpec::new(node, 2));
        let one: Vec<u32> = (0..8).collect();
        let two: Vec<u32> = (0..16).collect();
        let c = |k, m: &Vec<u32>| Collective::new(k, m.clone(), 1e9);
        assert_eq!(hbm_traffic(&c(K::AllGather, &one), Algo::Ring, &topo), (2.0, 0.0));
        assert_eq!(hbm_traffic(&c(K::ReduceScatter, &one), Algo::Ring, &topo), (3.0, 0.0));
        assert_eq!(hbm_traffic(&c(K::AllReduce, &one), Algo::Nvls, &topo), (2.0, 0.0));
        assert_eq!(hbm_traffic(&c(K::ReduceScatter, &two), Algo::Ring, &topo), (3.5, 0.25));
        // One GPU of each node: every hop through the NIC.
        assert_eq!(hbm_traffic(&c(K::AllGather, &vec![0, 8]), Algo::Ring, &topo), (6.0, 2.0));
    }
}
