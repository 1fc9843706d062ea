//! The GPU memory of the NCCL communicators a program opens (`hardware::nccl_memory` has the
//! sizes and their sources).
//!
//! A communicator is a set of members: every process group a framework creates runs its
//! collectives on a communicator of its own. Its memory on each member is what the algorithms
//! its collectives take (as NCCL's tuning picks them, [`nccl_plan`]) connect, each once:
//! rings and trees on all of the communicator's channels, NVLS on its own, all-to-all on
//! every peer's point-to-point channels. Before NCCL 2.22 (`cluster.nccl.version`, or
//! `runtime_connect` false) its first collective connected rings, trees and NVLS at once.
//! Pipeline sends connect their two ranks on the pair's point-to-point channels (inside a
//! node) or the shared network buffers (across).

use std::collections::HashMap;

use super::collective::{by_node, nccl_plan};
use crate::hardware::Topology;
use crate::hardware::nccl::Algo;
use crate::hardware::nccl_memory as mem;
use crate::hardware::nccl_p2p::P2pChannels;
use crate::lower::{Collective, CollectiveKind, NONE, Program};

/// What a communicator's collectives connected: channels of each algorithm used (0: unused).
#[derive(Default)]
struct Connected {
    ring: u32,
    tree: u32,
    nvls: u32,
    all_to_all: bool,
}

/// NCCL's buffers on each simulated device (indices as in `Program::devices`), in bytes;
/// zeros off NVIDIA GPUs.
pub fn nccl_buffer_bytes(p: &Program, topo: &Topology) -> Vec<f64> {
    let mut out = vec![0.0; p.devices.len()];
    let Some(sys) = topo.nccl() else {
        return out;
    };
    let simulated = |d: u32| {
        let m = p.mirror.get(d as usize).copied().unwrap_or(NONE);
        (m != NONE && p.devices[m as usize] == d).then_some(m as usize)
    };
    // Distinct calls per member list, then per communicator (the member set, in sorted order).
    let mut lists: HashMap<&[u32], Vec<(CollectiveKind, u64)>> = HashMap::new();
    for c in &p.collectives {
        if c.members.len() < 2 || c.bytes <= 0.0 {
            continue;
        }
        let calls = lists.entry(&c.members[..]).or_default();
        let call = (c.kind, c.bytes.to_bits());
        if !calls.contains(&call) {
            calls.push(call);
        }
    }
    let mut comms: HashMap<Vec<u32>, Vec<(CollectiveKind, u64)>> = HashMap::new();
    for (members, calls) in lists {
        let mut key = members.to_vec();
        key.sort_unstable();
        let all = comms.entry(key).or_default();
        for call in calls {
            if !all.contains(&call) {
                all.push(call);
            }
        }
    }
    let mut keys: Vec<&Vec<u32>> = comms.keys().collect();
    keys.sort_unstable();
    let at_creation = sys.env.connects_at_creation();
    for members in keys {
        let mut used = Connected::default();
        for &(kind, bits) in &comms[members] {
            let c = Collective::new(kind, members.clone(), f64::from_bits(bits));
            let Some(plan) = nccl_plan(&c, topo) else { continue };
            match plan.algo {
                Algo::Ring => used.ring = used.ring.max(plan.max_channels),
                Algo::Tree => used.tree = used.tree.max(plan.max_channels),
                Algo::Nvls => used.nvls = used.nvls.max(plan.max_channels),
                Algo::P2p => used.all_to_all = true,
            }
        }
        let nodes = by_node(members, topo);
        if at_creation && (used.ring + used.tree + used.nvls > 0 || used.all_to_all) {
            // Created by its first collective, the communicator connected its rings and trees
            // on all of its channels (those of its ring graph: a large all-gather's), and NVLS
            // where the node has it and it holds two GPUs of a node.
            let gather = Collective::new(CollectiveKind::AllGather, members.clone(), 1e9);
            let channels = nccl_plan(&gather, topo).map_or(sys.channels, |p| p.max_channels);
            used.ring = used.ring.max(channels);
            used.tree = used.tree.max(channels);
            if nodes.iter().any(|(_, local)| local.len() >= 2) {
                used.nvls = used.nvls.max(sys.nvls_channels());
            }
        }
        let per_node = members.len() as f64 / nodes.len() as f64;
        let n = nodes.len() as u32;
        let ring = mem::ring_channel_bytes(per_node, n);
        if used.ring + used.tree + used.nvls == 0 && !used.all_to_all {
            continue;
        }
        // A tree's chain gives an inner rank two neighbours; of two ranks each has one.
        let tree_links = if members.len() <= 2 { 1.0 } else { 2.0 };
        let common = used.ring as f64 * ring + used.tree as f64 * tree_links * ring;
        let a2a = P2pChannels::new(sys, members.len() as u32, n);
        for (_, local) in &nodes {
            // NVLS needs two of the communicator's GPUs on the node (`ncclNvlsInit`).
            let heads = if local.len() >= 2 { local.len() as u32 } else { 0 };
            let mut bytes = common + mem::nvls_bytes(used.nvls, heads, sys.env.nvls_buffer_bytes());
            if used.all_to_all {
                // Peers in the node on their point-to-point channels; those across nodes
                // through the communicator's shared network buffers.
                bytes += (local.len() - 1) as f64 * a2a.per_peer as f64 * mem::p2p_connection_bytes();
                if n > 1 {
                    bytes += mem::shared_net_bytes(a2a.total);
                }
            }
            for &d in local {
                if let Some(i) = simulated(d) {
                    out[i] += bytes;
                }
            }
        }
    }
    // Pipeline sends: each pair of neighbouring stages, connected both ways.
    let mut pairs: Vec<(u32, u32)> = p
        .transfers
        .iter()
        .filter(|t| t.source != t.target)
        .map(|t| (t.source.min(t.target), t.source.max(t.target)))
        .collect();
    pairs.sort_unstable();
    pairs.dedup();
    let in_node = P2pChannels::new(sys, 2, 1).per_peer as f64 * mem::p2p_connection_bytes();
    let network = mem::shared_net_bytes(P2pChannels::new(sys, 2, 2).total);
    let mut across = vec![false; out.len()];
    for (a, b) in pairs {
        let same_node = topo.node_of(a) == topo.node_of(b);
        for d in [a, b] {
            let Some(i) = simulated(d) else { continue };
            if same_node {
                out[i] += in_node;
            } else if !across[i] {
                across[i] = true;
                out[i] += network;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::nccl_buffer_bytes;
    use crate::hardware::{ClusterSpec, Topology, catalog};
    use crate::lower::{Collective, CollectiveKind as K, Program, Transfer};

    const MIB: f64 = 1_048_576.0;

    fn program(devices: u32, collectives: Vec<Collective>, transfers: Vec<Transfer>) -> Program {
        Program {
            devices: (0..devices).collect(),
            mirror: (0..devices).collect(),
            collectives,
            transfers,
            ..Program::default()
        }
    }

    fn topology(node: &str, nodes: u32) -> Topology {
        Topology::new(&ClusterSpec::new(catalog::node_preset(node).expect("preset"), nodes))
    }

    #[test]
    fn a_ring_holds_one_connection_per_channel_once_per_communicator() {
        let topo = topology("dgx-a100-80gb", 1);
        let all: Vec<u32> = (0..8).collect();
        let mut reversed = all.clone();
        reversed.reverse();
        // FSDP's gathers and reductions on one process group: the ring, on DGX A100's 24
        // channels (`nccl::tests::ring_graph_channels_follow_the_search`), 12 MiB each.
        let calls = vec![
            Collective::new(K::AllGather, all.clone(), 1e9),
            Collective::new(K::ReduceScatter, reversed, 1e9),
            Collective::new(K::AllGather, all, 3e8),
        ];
        let bytes = nccl_buffer_bytes(&program(8, calls, vec![]), &topo);
        assert_eq!(bytes, vec![24.0 * 12.0 * MIB; 8]);
        // A second process group over half the GPUs is a communicator of its own.
        let half = Collective::new(K::AllGather, (0..4).collect(), 1e9);
        let first = Collective::new(K::AllGather, (0..8).collect(), 1e9);
        let bytes = nccl_buffer_bytes(&program(8, vec![first, half], vec![]), &topo);
        assert!(bytes[0] > bytes[7] && bytes[7] == 24.0 * 12.0 * MIB, "{bytes:?}");
    }

    #[test]
    fn an_all_to_all_on_eight_h100s_connects_every_peer_as_nccl_1685_measured() {
        // NVIDIA/nccl#1685: 32 channels per pair, 10 MiB + 2 MiB each; the user's GPUs held
        // 3.28 GB more after the first all-to-all. trainsim: 7 x 32 x 12 MiB = 2.82 GB.
        let topo = topology("dgx-h100", 1);
        let a2a = Collective::new(K::AllToAll, (0..8).collect(), 64e6);
        let bytes = nccl_buffer_bytes(&program(8, vec![a2a], vec![]), &topo);
        assert_eq!(bytes[3], 7.0 * 32.0 * 12.0 * MIB);
        let measured = 4.34e9 - 1.06e9;
        assert!((bytes[3] / measured - 1.0).abs() < 0.15, "{} vs {measured}", bytes[3]);
    }

    #[test]
    fn nvls_adds_its_buffers_and_pipeline_peers_their_channels() {
        let topo = topology("dgx-h100", 2);
        // A large all-reduce in one H100 node takes NVLS: 16 x 2 x 1 MiB x 8 heads.
        let ar = Collective::new(K::AllReduce, (0..8).collect(), 1e9);
        let alone = nccl_buffer_bytes(&program(16, vec![ar.clone()], vec![]), &topo);
        assert_eq!(alone[0], 256.0 * MIB);
        assert_eq!(alone[8], 0.0);
        // Pipeline sends: 0 -> 1 in the node, 1 -> 9 across nodes (shared network buffers).
        let send = |source, target| Transfer { source, target, bytes: 1e7 };
        let piped = nccl_buffer_bytes(&program(16, vec![ar], vec![send(0, 1), send(1, 0), send(1, 9)]), &topo);
        assert!(piped[0] > alone[0] && piped[1] > piped[0] - alone[0] && piped[9] > 0.0, "{piped:?}");
        assert_eq!(piped[2], 256.0 * MIB);
    }

    #[test]
    fn before_nccl_2_22_a_communicator_connects_everything_when_created() {
        let node = catalog::node_preset("dgx-h100").expect("preset");
        let topo = |version: Option<&str>, connect: Option<bool>| {
            let mut cluster = ClusterSpec::new(node.clone(), 1);
            cluster.nccl = crate::hardware::nccl_env::NcclEnv::default().with_release(version, connect).expect("valid");
            Topology::new(&cluster)
        };
        let gather = || vec![Collective::new(K::AllGather, (0..8).collect(), 1e9)];
        let at = |version, connect| nccl_buffer_bytes(&program(8, gather(), vec![]), &topo(version, connect))[0];
        // 2.30: the all-gather's ring only, 24 x 12 MiB.
        assert_eq!(at(None, None), 288.0 * MIB);
        // NCCL_RUNTIME_CONNECT=0: the ring, the tree (two links a rank, 24 x 24 MiB) and NVLS
        // (16 x 2 x 1 MiB x 8 heads).
        assert_eq!(at(None, Some(false)), (288.0 + 576.0 + 256.0) * MIB);
        // 2.19: the same with NVLS buffers of 4 MiB (src/transport/nvls.cc at v2.19.4-1).
        assert_eq!(at(Some("2.19"), None), (288.0 + 576.0 + 1024.0) * MIB);
        // Two ranks: a tree link each; NVLS over the two.
        let pair = vec![Collective::new(K::AllGather, vec![0, 1], 1e9)];
        let bytes = nccl_buffer_bytes(&program(8, pair, vec![]), &topo(Some("2.21"), None))[0];
        assert_eq!(bytes, (288.0 + 288.0 + 16.0 * 2.0 * 2.0) * MIB);
    }

    #[test]
    fn no_nccl_no_buffers() {
        let topo = Topology::new(&ClusterSpec::new(catalog::node_preset("host-cpu").expect("preset"), 1));
        let c = Collective::new(K::AllReduce, (0..2).collect(), 1e6);
        assert!(nccl_buffer_bytes(&program(2, vec![c], vec![]), &topo).iter().all(|&b| b == 0.0));
    }
}
