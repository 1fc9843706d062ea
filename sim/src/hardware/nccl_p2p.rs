//! How NCCL runs point-to-point work, which is what an all-to-all is: `ncclAlltoAll` appends
//! one send and one receive of `count` elements per peer (`src/enqueue.cc`, `taskAppend`), and
//! nccl-tests' `alltoall_perf` issues the same grouped `ncclSend`/`ncclRecv` itself when the
//! library has no `ncclAlltoAll`. Every constant below is NCCL 2.30.7's (commit
//! 5067397c2676d5aed50042fc39e5c8ee96eb0027):
//!
//! - Channels. A communicator has `p2pnChannels` point-to-point channels: its collective
//!   channels rounded up to a power of two (`src/graph/paths.cc`,
//!   `ncclTopoComputeP2pChannels`). Each peer gets up to `p2pnChannelsPerPeer`: the fewest any
//!   peer is given by `ncclTopoGetNchannels` (an NVLink peer 2 per NVLink between the two, a PCIe peer 2, a
//!   network peer one per local NIC and enough to carry the NICs at
//!   `NCCL_P2P_PER_CHANNEL_NET_BW` = 14 GB/s each), a power of two; across nodes it is halved
//!   until a channel holds at most 8 peers (`NCCL_MAX_DEV_WORK_P2P_PER_BATCH`).
//!   `scheduleP2pTasksToPlan` (`src/enqueue.cc`) starts each peer on `nChannelsMin` channels
//!   (halved until all peers fit the communicator's channels at once) and `addP2pToPlan`
//!   splits a transfer into parts of at least `chunk/8` (one node) or `chunk/2` (several
//!   nodes), doubling the channels while a part exceeds `32 x chunk` (`chunk`).
//! - Chunk. `NCCL_P2P_NVL_CHUNKSIZE` 512 KiB inside an all-NVLink node,
//!   `NCCL_P2P_PCI_CHUNKSIZE` 128 KiB over PCIe, `NCCL_P2P_NET_CHUNKSIZE` 128 KiB as soon as
//!   the communicator spans nodes, at most `NCCL_BUFFSIZE / NCCL_STEPS` = 4 MiB / 8
//!   (`src/init.cc`, `computeBuffSizes`).
//! - Protocol. LL when the peer's bytes fit `NCCL_P2P_LL_THRESHOLD` (16 KiB) per channel and
//!   the connection has LL buffers; network connections have none unless
//!   `NCCL_ALLOC_P2P_NET_LL_BUFFERS` is set (`src/transport/net.cc`), so they use Simple.
//! - PXN. A GPU sends to a peer on another node through the NIC of its own node's GPU with the
//!   peer's local index, relayed over NVLink (`NCCL_P2P_PXN_LEVEL` 2, `src/graph/search.cc`,
//!   `ncclTopoGetNetDev`); the receiver uses its own NIC. Traffic stays on its rail.
//!
//! NCCL has no latency model for point-to-point work (`tuning.cc` tunes collectives only).
//! trainsim charges a pair one step of NCCL's ring: the ring's base latency for the protocol
//! plus one hop of `hwLatencies` (NVLink or PCIe inside the node; the network, with its
//! overhead, between nodes, plus an NVLink hop when PXN relays), all pairs at once. A channel
//! moves at most the ring graph's per-channel speed inside a node (as for collectives) and
//! 14 GB/s over the network (NCCL's own sizing figure).

use super::nccl::{
    BASE_LAT_RING_US, GB, LL_DATA_FRACTION, MAX_CHANNELS, NET_OVERHEAD_US, NET_RING_US, NVLINK_RING_US, NcclSystem,
    P2P_PER_CHANNEL_NET_GBPS, PCI_RING_US, Proto, US,
};

/// `NCCL_P2P_NET_CHUNKSIZE`, `NCCL_P2P_PCI_CHUNKSIZE`, `NCCL_P2P_NVL_CHUNKSIZE`.
const P2P_NET_CHUNK: f64 = 131072.0;
const P2P_PCI_CHUNK: f64 = 131072.0;
const P2P_NVL_CHUNK: f64 = 524288.0;
/// `DEFAULT_BUFFSIZE` (Simple) over `NCCL_STEPS`: the largest point-to-point chunk.
const MAX_CHUNK: f64 = 4194304.0 / 8.0;
/// `NCCL_P2P_LL_THRESHOLD`: bytes per channel up to which a transfer uses LL.
const P2P_LL_THRESHOLD: f64 = 16384.0;
/// `NCCL_MAX_DEV_WORK_P2P_PER_BATCH`: peers one channel serves at once.
const P2P_PER_BATCH: u32 = 8;

fn pow2_up(n: u32) -> u32 {
    n.max(1).next_power_of_two()
}

/// A communicator's point-to-point channels.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct P2pChannels {
    /// `p2pnChannels`.
    pub total: u32,
    /// `p2pnChannelsPerPeer`: the most channels one peer's transfer may use.
    pub per_peer: u32,
    /// `nChannelsMin`: the channels a peer starts on.
    pub min_per_peer: u32,
    /// `p2pChunkSize`.
    pub chunk_bytes: f64,
}

impl P2pChannels {
    /// For a communicator of `ranks` over `nodes` nodes of `sys`: `p2pnChannels` is the
    /// communicator's collective channels rounded up to a power of two, across nodes its
    /// inter-node graph's (one ring per NIC its GPUs reach, [`NcclSystem::across_nodes`]).
    pub fn new(sys: &NcclSystem, ranks: u32, nodes: u32) -> P2pChannels {
        let collective = if nodes > 1 {
            let ppn = ranks / nodes.max(1);
            sys.across_nodes(sys.nics.min(ppn).max(1)).channels
        } else {
            sys.channels
        };
        let total = pow2_up(collective.min(MAX_CHANNELS)).min(MAX_CHANNELS);
        // A V100 node (DGX-1, AWS p3) wires its GPUs as a hybrid cube-mesh, not through a
        // switch: a pair shares one or two of a GPU's six NVLinks (NVIDIA DGX-1 System
        // Architecture whitepaper, 2017), so a peer gets at most 2 x 2 channels.
        let pair_links = if sys.arch == super::nccl::Arch::Volta { sys.nvlinks.min(2) } else { sys.nvlinks };
        let local = if sys.nvlink { 2 * pair_links.max(1) } else { 2 };
        let mut per_peer = pow2_up(if nodes > 1 { local.min(sys.net_channels) } else { local });
        if nodes > 1 {
            while per_peer * ranks.div_ceil(P2P_PER_BATCH) > total && per_peer > 1 {
                per_peer /= 2;
            }
        } else {
            per_peer = per_peer.min(total);
        }
        let mut min_per_peer = per_peer;
        while min_per_peer * ranks > total && min_per_peer > 1 {
            min_per_peer /= 2;
        }
        let chunk = if nodes > 1 {
            P2P_NET_CHUNK
        } else if sys.nvlink {
            P2P_NVL_CHUNK
        } else {
            P2P_PCI_CHUNK
        };
        P2pChannels { total, per_peer, min_per_peer, chunk_bytes: chunk.min(MAX_CHUNK) }
    }

    /// Channels one transfer of `bytes` uses (`addP2pToPlan`).
    pub fn for_bytes(&self, bytes: f64, nodes: u32) -> u32 {
        if bytes <= 0.0 {
            return 1;
        }
        let c = self.chunk_bytes;
        let (min_part, max_part) = if nodes > 1 { (c / 2.0, c) } else { (c / 8.0, c * 32.0) };
        let mut n = self.min_per_peer.min((bytes / min_part).ceil() as u32).max(1);
        let mut part = min_part.max((bytes / n as f64).ceil());
        while part > max_part && n <= self.per_peer / 2 {
            n *= 2;
            part = (bytes / n as f64).ceil();
        }
        n
    }
}

/// How NCCL runs the transfer between one pair of ranks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PairPlan {
    pub proto: Proto,
    pub channels: u32,
    /// Bytes on the wire per byte of data (LL: 2).
    pub wire_factor: f64,
    /// The most data (bytes/s) the pair's channels move.
    pub cap_bytes_per_s: f64,
    /// Fixed time before its bytes move.
    pub latency_s: f64,
}

/// How NCCL runs an all-to-all of `bytes` per rank over `ranks` ranks on `nodes` nodes: the
/// plan of a pair inside a node and of a pair across nodes (`None` where there is none).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AllToAll {
    pub channels: P2pChannels,
    pub intra: Option<PairPlan>,
    pub inter: Option<PairPlan>,
    /// Inter-node transfers are relayed over NVLink to the NIC of the peer's rail (PXN).
    pub pxn: bool,
}

impl AllToAll {
    /// `local_peers`: whether some pair shares a node; `remote_peers`: whether some pair
    /// does not.
    pub fn new(
        sys: &NcclSystem,
        ranks: u32,
        nodes: u32,
        bytes: f64,
        local_peers: bool,
        remote_peers: bool,
    ) -> AllToAll {
        let ch = P2pChannels::new(sys, ranks, nodes);
        let block = bytes / ranks.max(1) as f64;
        let n = ch.for_bytes(block, nodes);
        // Inside a node a channel moves at most the ring graph's per-channel speed.
        let local_channel = sys.intra_bytes_per_s / sys.graph_channels.max(1) as f64;
        let pxn = nodes > 1 && sys.nvlink;
        let intra = local_peers.then(|| {
            let proto = if block <= n as f64 * P2P_LL_THRESHOLD { Proto::Ll } else { Proto::Simple };
            let k = proto.index();
            let wire = if proto == Proto::Ll { 1.0 / LL_DATA_FRACTION } else { 1.0 };
            let hop = if sys.nvlink { NVLINK_RING_US[k] } else { PCI_RING_US[k] };
            PairPlan {
                proto,
                channels: n,
                wire_factor: wire,
                cap_bytes_per_s: n as f64 * local_channel / wire,
                latency_s: (BASE_LAT_RING_US[k] + hop) * US,
            }
        });
        let inter = remote_peers.then(|| {
            let k = Proto::Simple.index();
            let relay = if pxn { NVLINK_RING_US[k] } else { 0.0 };
            PairPlan {
                proto: Proto::Simple,
                channels: n,
                wire_factor: 1.0,
                cap_bytes_per_s: n as f64 * P2P_PER_CHANNEL_NET_GBPS * GB,
                latency_s: (BASE_LAT_RING_US[k] + NET_RING_US[k] + 3.0 * NET_OVERHEAD_US + relay) * US,
            }
        });
        AllToAll { channels: ch, intra, inter, pxn }
    }

    /// Channels the kernel runs on: each round (one per rank) starts on its own channels.
    pub fn kernel_channels(&self, ranks: u32) -> u32 {
        let n = self.intra.iter().chain(&self.inter).map(|p| p.channels).max().unwrap_or(1);
        (ranks * n).min(self.channels.total)
    }

    /// The fixed time of the whole exchange: its slowest pair's.
    pub fn latency_s(&self) -> f64 {
        self.intra.iter().chain(&self.inter).map(|p| p.latency_s).fold(0.0, f64::max)
    }

    /// The protocol reported for the exchange: Simple as soon as any pair uses it.
    pub fn proto(&self) -> Proto {
        if self.intra.iter().chain(&self.inter).any(|p| p.proto == Proto::Simple) { Proto::Simple } else { Proto::Ll }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::{ClusterSpec, catalog};

    fn system(node: &str) -> NcclSystem {
        NcclSystem::new(&ClusterSpec::new(catalog::node_preset(node).expect("preset"), 1)).expect("gpu")
    }

    #[test]
    fn channels_follow_nccl_topo_compute_p2p_channels() {
        // DGX A100: 24 collective channels -> 32 p2p channels; an NVLink peer 2 x 12 links
        // -> 32; 8 ranks start on 4 channels each so that all fit the 32 at once.
        let a100 = system("dgx-a100-80gb");
        assert_eq!(a100.nvlinks, 12);
        assert_eq!(a100.net_channels, 2, "HDR 25 GB/s over 14 GB/s per channel");
        let one = P2pChannels::new(&a100, 8, 1);
        assert_eq!((one.total, one.per_peer, one.min_per_peer), (32, 32, 4));
        assert_eq!(one.chunk_bytes, 524288.0);
        // Two nodes: the communicator's inter-node graph has 16 channels (one per HDR NIC,
        // doubled), so 16 p2p channels; the network peer's 2 channels bound every peer, and 16
        // ranks start on 1 each.
        let two = P2pChannels::new(&a100, 16, 2);
        assert_eq!((two.total, two.per_peer, two.min_per_peer, two.chunk_bytes), (16, 2, 1, 131072.0));
        let h100 = system("dgx-h100");
        assert_eq!((h100.nvlinks, h100.net_channels), (18, 4));
        // NDR 50 GB/s: 4 channels per network peer (4 x 16/8 = 8 of the 16 fit); 16 ranks
        // start on 1 each.
        let h2 = P2pChannels::new(&h100, 16, 2);
        assert_eq!((h2.total, h2.per_peer, h2.min_per_peer), (16, 4, 1));
        // 128 ranks: 4 x 128/8 = 64 > 16 channels, halved to 1 per peer.
        let h16 = P2pChannels::new(&h100, 128, 16);
        assert_eq!((h16.per_peer, h16.min_per_peer), (1, 1));
        assert_eq!(P2pChannels::new(&h100, 4, 1).min_per_peer, 8);
    }

    #[test]
    fn small_transfers_use_ll_and_few_channels_large_ones_simple() {
        let a100 = system("dgx-a100-80gb");
        let ch = P2pChannels::new(&a100, 8, 1);
        // Parts of at least chunk/8 = 64 KiB; at most 32 x 512 KiB before doubling.
        assert_eq!(ch.for_bytes(1000.0, 1), 1);
        assert_eq!(ch.for_bytes(200e3, 1), 4);
        assert_eq!(ch.for_bytes(128.0 * 1048576.0, 1), 8);
        let small = AllToAll::new(&a100, 8, 1, 8.0 * 1024.0, true, false);
        assert_eq!(small.intra.expect("intra").proto, Proto::Ll);
        let large = AllToAll::new(&a100, 8, 1, 1e9, true, false);
        assert_eq!(large.proto(), Proto::Simple);
        assert_eq!(large.kernel_channels(8), 32);
        // Across nodes the network pairs use Simple whatever the size.
        let two = AllToAll::new(&a100, 16, 2, 16.0 * 1024.0, true, true);
        assert_eq!(two.inter.expect("inter").proto, Proto::Simple);
        assert!(two.pxn);
        assert!(two.latency_s() > small.latency_s());
    }
}
