//! How NCCL runs a collective: which algorithm (ring, tree, NVLS) and protocol (LL, LL128,
//! Simple) it picks for a message size, the latency it pays, the bandwidth each protocol
//! reaches and how many channels a message of that size uses.
//!
//! Every constant is NCCL's own, from NVIDIA/nccl v2.30.7 (commit
//! 5067397c2676d5aed50042fc39e5c8ee96eb0027): `src/graph/tuning.cc` (base and hardware
//! latencies, per-protocol bandwidth refinements, the tree correction factors),
//! `src/enqueue.cc` (channel and thread choice per message), `src/include/comm.h` and
//! `src/include/device.h` (thread thresholds and thread counts), `src/graph/search.cc` and
//! `src/graph/connect.cc` (how many channels a ring graph has), `src/transport/nvls.cc` (NVLS
//! channels). The link bandwidths come from this crate's link presets (`catalog.rs`), which
//! cite measured nccl-tests bus bandwidths; nothing here is fitted to a training run.
//!
//! What NCCL calls the bus bandwidth of an algorithm is, in this model, the data rate on each
//! GPU's busiest link. The engine moves the bytes over the links (so concurrent collectives
//! share them) with a ceiling per flow taken from the chosen algorithm, protocol and channels.

use super::{ClusterSpec, DeviceKind, DeviceSpec, Vendor};
use serde::Serialize;

pub const SOURCE: &str = "NVIDIA/nccl v2.30.7 (commit 5067397c2676d5aed50042fc39e5c8ee96eb0027)";

/// GPU generation, as NCCL indexes its tables (compute capability < 80, 8x, 9x, >= 100).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    Volta,
    Ampere,
    Hopper,
    Blackwell,
}

impl Arch {
    /// The generation of an NVIDIA GPU, from its name; an unknown NVIDIA GPU is taken as
    /// Ampere. `None` for CPUs, FPGAs and GPUs of other vendors: NCCL does not run there (an
    /// AMD GPU runs RCCL, whose algorithms and tuning differ; it takes the generic
    /// collectives, `engine::collective`).
    pub fn of(device: &DeviceSpec) -> Option<Arch> {
        use super::kernels::{GpuArch, generation_in_name};
        if device.kind != DeviceKind::Gpu || device.vendor != Vendor::Nvidia {
            return None;
        }
        Some(match generation_in_name(&device.name) {
            Some(GpuArch::Volta | GpuArch::Turing) => Arch::Volta,
            Some(GpuArch::Hopper) => Arch::Hopper,
            Some(GpuArch::Blackwell) => Arch::Blackwell,
            Some(GpuArch::Ampere) | None => Arch::Ampere,
        })
    }

    fn index(self) -> usize {
        self as usize
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Algo {
    Ring,
    Tree,
    Nvls,
    /// Grouped send/recv (all-to-all), scheduled as NCCL schedules point-to-point work
    /// (`nccl_p2p`).
    P2p,
}

impl Algo {
    pub fn name(self) -> &'static str {
        match self {
            Algo::Ring => "ring",
            Algo::Tree => "tree",
            Algo::Nvls => "nvls",
            Algo::P2p => "p2p",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Proto {
    #[serde(rename = "LL")]
    Ll,
    #[serde(rename = "LL128")]
    Ll128,
    Simple,
}

impl Proto {
    pub const ALL: [Proto; 3] = [Proto::Ll, Proto::Ll128, Proto::Simple];

    pub fn name(self) -> &'static str {
        match self {
            Proto::Ll => "LL",
            Proto::Ll128 => "LL128",
            Proto::Simple => "Simple",
        }
    }

    pub(super) fn index(self) -> usize {
        self as usize
    }
}

/// The collectives NCCL tunes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coll {
    AllReduce,
    ReduceScatter,
    AllGather,
    Broadcast,
    Reduce,
}

// ---- tuning.cc: latencies in microseconds, [LL, LL128, Simple] ----

/// `baseLatencies` of Tree and Ring.
const BASE_LAT_TREE_US: [f64; 3] = [6.8, 14.0, 8.4];
pub(super) const BASE_LAT_RING_US: [f64; 3] = [6.6, 14.0, 8.4];
/// `hwLatencies[NVLINK]` for Tree, Ring and NVLS.
const NVLINK_TREE_US: [f64; 3] = [0.6, 1.25, 4.0];
pub(super) const NVLINK_RING_US: [f64; 3] = [0.6, 1.9, 3.4];
const NVLINK_NVLS_US: [f64; 3] = [0.0, 0.0, 25.0];
/// `hwLatencies[PCI]` for Tree and Ring.
const PCI_TREE_US: [f64; 3] = [1.0, 1.9, 4.0];
pub(super) const PCI_RING_US: [f64; 3] = [1.0, 2.5, 5.7];
/// `hwLatencies[NET]` for Tree and Ring.
const NET_TREE_US: [f64; 3] = [5.0, 8.5, 14.0];
pub(super) const NET_RING_US: [f64; 3] = [2.7, 4.0, 14.0];
/// `getNetOverhead` on x86 Intel hosts (AMD: 2.0), tripled for Simple.
pub(super) const NET_OVERHEAD_US: f64 = 1.0;

// ---- tuning.cc: bandwidth ceilings in GB/s, [arch][1 node, 2 nodes, more] ----

/// `llMaxBws`: single node by GPU generation; several nodes by host CPU (row 0, Intel).
const LL_MAX_BWS: [[f64; 3]; 4] = [[39.0, 39.0, 20.4], [87.7, 22.5, 19.0], [141.0, 45.0, 35.0], [282.0, 90.0, 70.0]];
const PER_CH_MAX_RING_LL128_BWS: [[f64; 3]; 4] =
    [[20.0, 20.0, 20.0], [20.0, 20.0, 20.0], [36.7, 36.7, 36.7], [40.0, 40.0, 40.0]];
const PER_CH_MAX_TREE_LL128_BWS: [[f64; 3]; 4] =
    [[20.0, 20.0, 20.0], [20.0, 20.0, 20.0], [36.7, 36.7, 29.0], [55.6, 31.67, 20.0]];
const PER_CH_MAX_TREE_BWS: [[f64; 3]; 4] =
    [[26.5, 18.5, 10.0], [24.0, 23.6, 17.8], [38.7, 41.4, 36.0], [70.0, 42.8, 24.0]];
/// `nvlsEfficiency` (Volta and Ampere have no NVLS).
const NVLS_EFFICIENCY: [f64; 4] = [0.0, 0.0, 0.85, 0.74];
/// LL carries 4 bytes of data and 4 of flag per 8-byte store (tuning.cc halves its bandwidth;
/// sjeaugey, NVIDIA/nccl #281).
pub(super) const LL_DATA_FRACTION: f64 = 0.5;
/// LL128 carries 120 data bytes per 128-byte line; tuning.cc rounds the ring's to 0.92.
const LL128_RING_FRACTION: f64 = 0.92;
const LL128_DATA_FRACTION: f64 = 120.0 / 128.0;
/// Tree all-reduce's bandwidth refinements.
const TREE_ALLREDUCE_FRACTION: f64 = 0.92;
const TREE_LL_DIVISOR: f64 = 3.8;
const TREE_LL128_ONE_NODE_FRACTION: f64 = 7.0 / 9.0;
/// Ring Simple all-reduce across nodes: latency x1.4 on compute capability >= 80 (x1.9
/// before) once each channel-rank slice reaches 64 bytes ("plateau effect of ring").
const RING_PLATEAU: [f64; 2] = [1.9, 1.4];

/// `treeCorrectionFactor[proto][log2(bytes / 64)]`, 64 B to 256 MB.
const TREE_CORRECTION: [[f64; 24]; 3] = [
    [
        1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.7, 0.7, 0.7, 0.7, 0.6, 0.5, 0.4, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.0, 1.0,
        1.0, 1.0,
    ],
    [
        1.0, 1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.8, 0.8, 0.7, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.8, 0.9, 0.9, 0.9, 0.9, 1.0,
        1.0, 1.0,
    ],
    [
        0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.8, 0.7, 0.6, 0.6, 0.5, 0.5, 0.5, 0.5, 0.6, 0.7, 0.8, 0.7, 0.7, 0.8, 0.9,
        0.9, 0.9,
    ],
];

// ---- channels and threads (device.h, comm.h, enqueue.cc, search.cc, connect.cc, nvls.cc) ----

/// Threads per channel: `NCCL_LL_MAX_NTHREADS`, `NCCL_LL128_MAX_NTHREADS`,
/// `NCCL_SIMPLE_MAX_NTHREADS`.
const MAX_THREADS: [f64; 3] = [512.0, 640.0, 512.0];
/// Bytes per thread before another channel is used: `NCCL_LL_THREAD_THRESHOLD` (times the
/// ranks for a ring), `NCCL_LL128_THREAD_THRESHOLD`, `NCCL_SIMPLE_THREAD_THRESHOLD`.
const THREAD_THRESHOLD: [f64; 3] = [8.0, 8.0, 64.0];
/// `MAXCHANNELS`.
pub(super) const MAX_CHANNELS: u32 = 64;
/// Ring search speeds per channel (GB/s), `speedArrayIntra`, `sm90SpeedArrayIntra`,
/// `sm100SpeedArrayIntra`.
const SPEEDS: [f64; 13] = [40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0];
const SPEEDS_SM90: [f64; 11] = [60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0];
const SPEEDS_SM100: [f64; 12] = [90.0, 80.0, 70.0, 60.0, 50.0, 45.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0];
/// The same search's speeds for graphs that cross nodes (`speedArrayInter`,
/// `sm90SpeedArrayInter`, `sm100SpeedArrayInter`; the tails under 3 GB/s left out).
const SPEEDS_INTER: [f64; 15] = [48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0];
const SPEEDS_INTER_SM90: [f64; 13] = [48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0];
const SPEEDS_INTER_SM100: [f64; 16] =
    [96.0, 86.0, 80.0, 48.0, 45.1, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0];
/// `NVLS_NCHANNELS_SM90`, `NVLS_NCHANNELS_SM100`.
const NVLS_CHANNELS: [u32; 4] = [0, 0, 16, 32];
/// `NCCL_NVLS_CHUNKSIZE`'s default (`src/transport/nvls.cc`), bytes.
pub(crate) const NVLS_CHUNK_BYTES: f64 = 131072.0;
/// Warp groups an NVLS all-reduce's chunks pass through on one node (`src/device/all_reduce.h`,
/// `RunWorkColl<.., NCCL_ALGO_NVLS, ..>`): scatter into the NVLS buffer, reduce and multicast
/// through the switch, gather out of it. NCCL splits a channel's warps among them.
const NVLS_STAGES: f64 = 3.0;

/// The chunk NCCL gives each head of an NVLS all-reduce of `bytes` (`calcCollChunking` in
/// `src/enqueue.cc`): 128 KiB, halved to 64, 32 and 16 KiB while the message is under 64, 8
/// and 2 chunks per concurrent operation (channels x heads).
fn nvls_chunk_bytes(bytes: f64, concurrent_ops: f64) -> f64 {
    let mut chunk = NVLS_CHUNK_BYTES;
    for (times, to) in [(64.0, 65536.0), (8.0, 32768.0), (2.0, 16384.0)] {
        if bytes < times * concurrent_ops * chunk && chunk > to {
            chunk = to;
        }
    }
    chunk
}

/// The share of NVLS's rate an all-reduce of `bytes` over `ranks` GPUs on `channels` gets:
/// each channel loops over its part, `ranks` chunks (one per head) a loop, and the loops pass
/// through [`NVLS_STAGES`] warp groups in a pipeline; the first loop's scatter and the last
/// loop's gather are not overlapped, so `loops` loops take `loops + stages - 1` loop times.
/// A medium message has few loops of small chunks: 2 on 8 GPUs at 8 MiB, where the bandwidth
/// term doubles.
fn nvls_pipeline_share(bytes: f64, ranks: f64, channels: f64) -> f64 {
    let chunk = nvls_chunk_bytes(bytes, channels * ranks);
    let loops = (bytes / channels / (ranks * chunk)).ceil().max(1.0);
    loops / (loops + NVLS_STAGES - 1.0)
}

pub(super) const GB: f64 = 1e9;
pub(super) const US: f64 = 1e-6;
/// Line rate of one NVLink per direction: 25 GB/s for NVLink 2 to 4 (V100 6 links, A100 12,
/// H100 18), 50 GB/s for NVLink 5 (B200 18 links). NCCL counts a GPU's links as its NVLink
/// path bandwidth over `ncclTopoNVLinkBw` (`src/graph/paths.cc`, `ncclTopoGetNchannels`).
const NVLINK_LINE_GBPS: [f64; 4] = [25.0, 25.0, 25.0, 50.0];
/// `NCCL_P2P_PER_CHANNEL_NET_BW` (GB/s, `src/graph/paths.cc`): the network bandwidth NCCL
/// expects one point-to-point channel to carry when it sizes the channels per network peer.
pub(super) const P2P_PER_CHANNEL_NET_GBPS: f64 = 14.0;

/// What NCCL knows of a cluster's hardware.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NcclSystem {
    pub arch: Arch,
    /// GPUs of a node talk over NVLink (else over PCIe).
    pub nvlink: bool,
    /// NVLink SHARP: Hopper or later on NVSwitch (an NVLink node of more than two GPUs on a
    /// switch, not a pairwise mesh).
    pub nvls: bool,
    /// Effective bandwidth of a GPU's port to its node's switch, per direction.
    pub intra_bytes_per_s: f64,
    /// Channels of NCCL's ring graph inside a node and of a communicator (twice the graph's);
    /// for a communicator across nodes, [`NcclSystem::across_nodes`]'s.
    pub graph_channels: u32,
    pub channels: u32,
    /// The bandwidth one graph channel carries (search.cc's `bwIntra`, `bwInter` across
    /// nodes): the port's over the graph's channels inside a node, the search's speed across.
    pub channel_bytes_per_s: f64,
    /// Line rate of one NIC (bytes/s, per direction), as NCCL reads the port's speed.
    pub nic_line_bytes_per_s: f64,
    /// NICs per node.
    pub nics: u32,
    /// NVLinks of each GPU (0 without NVLink): its port's line rate over one link's.
    pub nvlinks: u32,
    /// Point-to-point channels NCCL gives a network peer (`ncclTopoGetNchannels`): at least
    /// one per NIC local to the GPU, more to reach the NICs' bandwidth at 14 GB/s each.
    pub net_channels: u32,
    /// The algorithms and protocols the run lets NCCL use (`NCCL_ALGO`, `NCCL_PROTO`).
    pub env: super::nccl_env::NcclEnv,
}

impl NcclSystem {
    /// NCCL's view of a cluster of NVIDIA GPUs; `None` for CPUs, FPGAs and other vendors' GPUs.
    pub fn new(cluster: &ClusterSpec) -> Option<NcclSystem> {
        let node = &cluster.node;
        let arch = Arch::of(&node.device)?;
        let intra = node.intra_node.as_ref();
        let nvlink = intra.is_some_and(|l| is_nvlink(&l.name));
        let intra_bytes_per_s =
            node.intra_group_bytes_per_s(node.devices).unwrap_or_else(|| node.nic.effective_bytes_per_s());
        let graph_channels = ring_graph_channels(arch, intra_bytes_per_s / GB);
        let nvlinks = match intra {
            Some(l) if nvlink => {
                ((l.bandwidth_bytes_per_s / GB / NVLINK_LINE_GBPS[arch.index()]).round() as u32).max(1)
            }
            _ => 0,
        };
        // The NICs local to a GPU (one when GPUs share NICs) and their line rate in whole GB/s.
        let nets = (node.nics / node.devices.max(1)).max(1);
        let net_gbps = (nets as f64 * node.nic.bandwidth_bytes_per_s / GB).floor();
        let net_channels = nets.max((net_gbps / P2P_PER_CHANNEL_NET_GBPS).ceil() as u32);
        Some(NcclSystem {
            arch,
            nvlink,
            // NVLink SHARP reduces in the NVSwitch: none on a board whose GPUs are linked
            // pairwise (HGX H100/H200 4-GPU boards), where NCCL finds no NVLS-capable switch.
            nvls: arch >= Arch::Hopper
                && nvlink
                && node.devices > 2
                && node.intra_topology == super::IntraTopology::Switch,
            intra_bytes_per_s,
            graph_channels,
            channels: (2 * graph_channels).min(MAX_CHANNELS),
            channel_bytes_per_s: intra_bytes_per_s / graph_channels.max(1) as f64,
            nic_line_bytes_per_s: node.nic.bandwidth_bytes_per_s,
            nics: node.nics,
            nvlinks,
            net_channels,
            env: cluster.nccl.clone(),
        })
    }

    /// NVLS channels (NCCL's `nvlsChannels`), 0 where the node has no NVLink SHARP.
    pub fn nvls_channels(&self) -> u32 {
        if self.nvls { NVLS_CHANNELS[self.arch.index()] } else { 0 }
    }

    /// The system as a communicator across nodes sees it, its rings leaving each node through
    /// `nics` NICs: NCCL's search for such a graph (`ncclTopoCompute` with `system->inter`)
    /// takes the fastest inter-node speed per channel that a NIC's path carries and puts on
    /// each NIC as many channels as its bandwidth holds at that speed (one where the NIC is
    /// slower than every speed); `ncclTopoDupChannels` then doubles them where the speed is
    /// 25 GB/s or more (not on Hopper or later below 50 GB/s with more than 4 channels), and
    /// `ncclTopoPostset` doubles the communicator's. On DGX A100 (8 x 25 GB/s): 8 channels at
    /// 24 GB/s, 16 a communicator; DGX H100 (8 x 50): 8 at 48, 16; 4 x 12.5 GB/s (AWS p4d):
    /// 4 at 12, 8. The GPU's PCIe path to its NIC is taken as no slower than the NIC.
    pub fn across_nodes(&self, nics: u32) -> NcclSystem {
        let speeds: &[f64] = match self.arch {
            Arch::Volta | Arch::Ampere => &SPEEDS_INTER,
            Arch::Hopper => &SPEEDS_INTER_SM90,
            Arch::Blackwell => &SPEEDS_INTER_SM100,
        };
        let nic = self.nic_line_bytes_per_s / GB;
        let speed = speeds.iter().copied().find(|&s| s <= nic).unwrap_or(speeds[speeds.len() - 1]);
        let per_nic = ((nic / speed).floor() as u32).max(1);
        let n = (nics.max(1) * per_nic).min(MAX_CHANNELS);
        let dup = speed >= 25.0 && !(self.arch > Arch::Ampere && speed < 50.0 && n > 4);
        let graph = if dup { (2 * n).min(MAX_CHANNELS) } else { n };
        let per_channel = if dup { speed / 2.0 } else { speed };
        NcclSystem {
            graph_channels: graph,
            channels: (2 * graph).min(MAX_CHANNELS),
            channel_bytes_per_s: per_channel * GB,
            ..self.clone()
        }
    }
}

/// Channels of the ring graph that NCCL's search finds on a switch giving `total_gbps` per
/// GPU: the fastest speed per channel that fits, as many channels as fit at it, then doubled
/// at half the speed when the speed is high (`ncclTopoDupChannels`).
fn ring_graph_channels(arch: Arch, total_gbps: f64) -> u32 {
    let speeds: &[f64] = match arch {
        Arch::Volta | Arch::Ampere => &SPEEDS,
        Arch::Hopper => &SPEEDS_SM90,
        Arch::Blackwell => &SPEEDS_SM100,
    };
    let speed = speeds.iter().copied().find(|&s| s <= total_gbps).unwrap_or(speeds[speeds.len() - 1]);
    let n = ((total_gbps / speed).floor() as u32).max(1);
    let dup = speed >= 25.0 && !(arch > Arch::Ampere && speed < 50.0 && n > 4);
    if dup { (2 * n).min(MAX_CHANNELS) } else { n }
}

/// Whether a link's name says NVLink (or NVSwitch, its switch) anywhere, whatever the case:
/// NCCL's NVLink latencies, LL128 and NVLS need it. The one place a link's name is read.
pub fn is_nvlink(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    n.contains("nvlink") || n.contains("nvswitch")
}

/// How NCCL runs one collective.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Plan {
    pub algo: Algo,
    pub proto: Proto,
    /// Channels this message uses, of the communicator's.
    pub channels: u32,
    pub max_channels: u32,
    /// Fixed time of the collective (NCCL's latency model).
    pub latency_s: f64,
    /// Data rate on each GPU's busiest link that this algorithm, protocol and channel count
    /// allow (at most the links' own rate).
    pub bus_bytes_per_s: f64,
    /// The same on all the communicator's channels (what NCCL's choice compares).
    #[serde(skip)]
    pub full_bus_bytes_per_s: f64,
    /// Bytes on the wire per byte of data (protocol flags).
    pub wire_factor: f64,
    /// Bytes each GPU's busiest link carries per byte of the message (ring all-reduce
    /// 2(p-1)/p, tree 2, NVLS (p+1)/p, ring all-gather and reduce-scatter (p-1)/p, chain 1; an
    /// all-to-all's busiest link, (p-1)/p of a port inside a node).
    pub link_bytes_per_byte: f64,
}

impl Plan {
    /// The time NCCL's model gives this plan alone: latency plus link bytes at the bus rate.
    pub fn time_s(&self, bytes: f64) -> f64 {
        self.latency_s + bytes * self.link_bytes_per_byte / self.bus_bytes_per_s
    }

    /// Threads its kernel keeps resident on each member: one block per channel of the
    /// protocol's `NCCL_*_MAX_NTHREADS`.
    pub fn threads(&self) -> f64 {
        self.channels as f64 * MAX_THREADS[self.proto.index()]
    }
}

/// The shape of a collective as NCCL sees it.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub coll: Coll,
    pub ranks: u32,
    pub nodes: u32,
    /// Bytes of the whole buffer on each rank.
    pub bytes: f64,
    /// Bus bandwidth the links give a ring over these ranks (bytes/s): the GPU port inside a
    /// node, the NICs the rings cross between nodes.
    pub link_bus_bytes_per_s: f64,
}

fn log2i(n: u32) -> f64 {
    (31 - n.max(1).leading_zeros()) as f64
}

/// Every (algorithm, protocol) NCCL may use here, each with its plan; NCCL picks the fastest.
pub fn candidates(sys: &NcclSystem, s: &Shape) -> Vec<Plan> {
    let mut out = Vec::new();
    if s.ranks < 2 {
        return out;
    }
    let (p, n) = (s.ranks as f64, s.nodes.max(1));
    let ppn = p / n as f64;
    let a = sys.arch.index();
    let i2 = (n.min(3) - 1) as usize;
    let ll_max = if n == 1 { LL_MAX_BWS[a][0] } else { LL_MAX_BWS[0][i2] } * GB;
    let graph_ch = sys.graph_channels as f64;
    let link = s.link_bus_bytes_per_s;
    let nsteps = match s.coll {
        Coll::AllReduce => 2.0 * (p - 1.0),
        Coll::ReduceScatter | Coll::AllGather => p - 1.0,
        Coll::Broadcast | Coll::Reduce => p,
    };
    let (intra_tree, intra_ring) =
        if sys.nvlink { (NVLINK_TREE_US, NVLINK_RING_US) } else { (PCI_TREE_US, PCI_RING_US) };
    // LL128 needs NVLink inside the node (tuning.cc enables it up to PATH_NVB).
    let ll128_ok = sys.nvlink;
    for proto in Proto::ALL {
        let k = proto.index();
        if proto == Proto::Ll128 && !ll128_ok {
            continue;
        }
        let wire = match proto {
            Proto::Ll => 1.0 / LL_DATA_FRACTION,
            Proto::Ll128 => 1.0 / LL128_RING_FRACTION,
            Proto::Simple => 1.0,
        };
        // Ring (every collective).
        let bus = match proto {
            Proto::Ll => (link * LL_DATA_FRACTION).min(ll_max),
            Proto::Ll128 => (link * LL128_RING_FRACTION).min(graph_ch * PER_CH_MAX_RING_LL128_BWS[a][i2] * GB),
            Proto::Simple => link,
        };
        let mut lat = BASE_LAT_RING_US[k];
        let intra_lat = intra_ring[k];
        match s.coll {
            Coll::Broadcast | Coll::Reduce => lat += if n == 1 { intra_lat } else { NET_RING_US[k] },
            _ => {
                let overhead =
                    if n > 1 { NET_OVERHEAD_US * if proto == Proto::Simple { 3.0 } else { 1.0 } } else { 0.0 };
                let inter_lat = if ppn <= 1.0 { NET_TREE_US[k] } else { NET_RING_US[k] };
                let inter_steps = match (n, s.coll) {
                    (1, _) => 0.0,
                    (_, Coll::AllReduce) => 2.0 * (n - 1) as f64,
                    _ => (n - 1) as f64,
                };
                lat += (nsteps - inter_steps) * intra_lat.max(overhead) + inter_steps * inter_lat;
                let slice = s.bytes / (sys.channels as f64 * p);
                if proto == Proto::Simple && n > 1 && s.coll == Coll::AllReduce && slice >= 64.0 {
                    lat *= RING_PLATEAU[usize::from(sys.arch >= Arch::Ampere)];
                }
            }
        }
        let link_bytes = match s.coll {
            Coll::AllReduce => nsteps / p,
            Coll::ReduceScatter | Coll::AllGather => (p - 1.0) / p,
            Coll::Broadcast | Coll::Reduce => 1.0,
        };
        let thr = THREAD_THRESHOLD[k] * if proto == Proto::Ll { p } else { 1.0 };
        out.push(finish(sys, s, Algo::Ring, proto, lat * US, bus, wire, link_bytes, thr));
        if s.coll != Coll::AllReduce {
            continue;
        }
        // Tree (all-reduce): a chain inside each node, a double binary tree across nodes.
        // Each GPU's port carries 2 bytes per byte along the chain (reduce up, broadcast
        // down). Between two nodes each node is the other's child in one tree and its parent
        // in the other, so the NICs carry the message once each way, not twice: the chain
        // inside the node is the bound unless the NICs are under half its rate. Over more
        // nodes an interior node's NICs carry 2 bytes per byte too.
        let tree_link = if n == 2 { sys.intra_bytes_per_s.min(2.0 * link) } else { link };
        let base = (tree_link * TREE_ALLREDUCE_FRACTION).min(graph_ch * PER_CH_MAX_TREE_BWS[a][i2] * GB);
        let mut bus = match proto {
            Proto::Ll => (base / TREE_LL_DIVISOR).min(ll_max),
            Proto::Ll128 => {
                let f = if n == 1 { TREE_LL128_ONE_NODE_FRACTION } else { LL128_DATA_FRACTION };
                (base * f).min(graph_ch * PER_CH_MAX_TREE_LL128_BWS[a][i2] * GB)
            }
            Proto::Simple => base,
        };
        let log_size = (s.bytes as u64 >> 6).max(1).ilog2() as usize;
        if (s.bytes as u64 >> 6) >= 1 && log_size < 23 {
            bus *= TREE_CORRECTION[k][log_size];
        }
        let lat = BASE_LAT_TREE_US[k] + 2.0 * ((ppn - 1.0) * intra_tree[k] + log2i(n) * NET_TREE_US[k]);
        out.push(finish(sys, s, Algo::Tree, proto, lat * US, bus, wire, 2.0, THREAD_THRESHOLD[k]));
        // NVLS (all-reduce inside one NVSwitch node, Simple only): the switch reduces and
        // multicasts. Each GPU reduces its 1/p shard with `multimem.ld_reduce`, so the switch
        // reads every shard from every GPU (the message out of each port, the GPU's own shard
        // included) and returns the reduced shard (1/p in); then each GPU stores its shard
        // with `multimem.st` (1/p out) and the switch writes every shard into every GPU (the
        // message in). Each port so carries (p+1)/p of the message each way, at NCCL's
        // `nvlsEfficiency` x (channels - 1) / channels of its rate. The choice compares that
        // rate (NCCL's model has no chunk pipeline either); the bytes move at the share the
        // chunk pipeline leaves (`nvls_pipeline_share`).
        if sys.nvls && n == 1 && proto == Proto::Simple {
            let ch = NVLS_CHANNELS[a] as f64;
            let port_bw = sys.intra_bytes_per_s * NVLS_EFFICIENCY[a] * (ch - 1.0) / ch;
            let lat = NVLINK_NVLS_US[k];
            let plan = Plan {
                algo: Algo::Nvls,
                proto,
                channels: NVLS_CHANNELS[a],
                max_channels: NVLS_CHANNELS[a],
                latency_s: lat * US,
                bus_bytes_per_s: port_bw.min(link) * nvls_pipeline_share(s.bytes, p, ch),
                full_bus_bytes_per_s: port_bw.min(link),
                wire_factor: 1.0,
                link_bytes_per_byte: (p + 1.0) / p,
            };
            out.push(plan);
        }
    }
    out
}

/// A plan with its channel count: NCCL drops channels while each would get fewer than
/// `threads x threshold` bytes (enqueue.cc). A channel moves at most the ring graph's speed
/// per channel (search.cc's `bwIntra`: the port's bandwidth over the graph's channels) times
/// the protocol's data fraction, so a message on few channels cannot fill the links.
#[allow(clippy::too_many_arguments)]
fn finish(
    sys: &NcclSystem,
    s: &Shape,
    algo: Algo,
    proto: Proto,
    latency_s: f64,
    bus: f64,
    wire: f64,
    link_bytes: f64,
    thr: f64,
) -> Plan {
    let per_channel = MAX_THREADS[proto.index()] * thr;
    let mut nc = sys.channels;
    while nc >= 2 && s.bytes < nc as f64 * per_channel {
        nc -= 1;
    }
    let channel_bw = sys.channel_bytes_per_s / wire;
    Plan {
        algo,
        proto,
        channels: nc,
        max_channels: sys.channels,
        latency_s,
        bus_bytes_per_s: bus.min(nc as f64 * channel_bw),
        full_bus_bytes_per_s: bus,
        wire_factor: wire,
        link_bytes_per_byte: link_bytes,
    }
}

/// The plan NCCL picks among those the run allows (`NCCL_ALGO`, `NCCL_PROTO`): the least time
/// by its model at full channels (as `getAlgoInfo` does), then run on the channels the message
/// size allows. `None` when the run allows none of them (NCCL fails the call).
pub fn choose(sys: &NcclSystem, s: &Shape) -> Option<Plan> {
    let all = candidates(sys, s).into_iter().filter(|p| sys.env.allows(p.algo, p.proto));
    let full = |p: &Plan| p.latency_s + s.bytes * p.link_bytes_per_byte / p.full_bus_bytes_per_s;
    all.min_by(|a, b| full(a).total_cmp(&full(b)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::catalog;

    fn system(node: &str) -> NcclSystem {
        NcclSystem::new(&ClusterSpec::new(catalog::node_preset(node).expect("preset"), 1)).expect("gpu")
    }

    #[test]
    fn ring_graph_channels_follow_the_search() {
        // DGX A100: 240 GB/s per GPU, 40 GB/s channels x 6, doubled: 12 (24 in a
        // communicator, as NCCL's logs show "Channel 23/24" on HGX A100, nccl-tests #100).
        let a100 = system("dgx-a100-80gb");
        assert_eq!((a100.graph_channels, a100.channels), (12, 24));
        assert!(!a100.nvls);
        let h100 = system("dgx-h100");
        assert_eq!((h100.graph_channels, h100.channels), (12, 24));
        assert!(h100.nvls);
    }

    #[test]
    fn small_messages_pick_ll_and_large_ones_simple() {
        let sys = system("dgx-a100-80gb");
        let shape = |bytes: f64| Shape {
            coll: Coll::AllReduce,
            ranks: 8,
            nodes: 1,
            bytes,
            link_bus_bytes_per_s: sys.intra_bytes_per_s,
        };
        let small = choose(&sys, &shape(8.0)).expect("plan");
        assert_eq!(small.proto, Proto::Ll);
        assert_eq!(small.channels, 1);
        let large = choose(&sys, &shape(1e9)).expect("plan");
        assert_eq!((large.algo, large.proto), (Algo::Ring, Proto::Simple));
        assert_eq!(large.channels, 24);
        // Ring LL on 8 NVLink GPUs: 6.6 + 14 x 0.6 us.
        assert!((small.latency_s - 15.0e-6).abs() < 1e-9, "{}", small.latency_s);
    }

    #[test]
    fn nvls_wins_large_all_reduce_on_h100_only() {
        let sys = system("dgx-h100");
        let s = Shape {
            coll: Coll::AllReduce,
            ranks: 8,
            nodes: 1,
            bytes: 1e9,
            link_bus_bytes_per_s: sys.intra_bytes_per_s,
        };
        assert_eq!(choose(&sys, &s).expect("plan").algo, Algo::Nvls);
        let ag = Shape { coll: Coll::AllGather, ..s };
        assert_eq!(choose(&sys, &ag).expect("plan").algo, Algo::Ring);
    }

    #[test]
    fn nvls_chunks_shrink_and_few_loops_leave_a_share_of_the_rate() {
        // 8 GPUs x 16 channels = 128 concurrent operations (calcCollChunking's thresholds).
        let mib = 1048576.0;
        assert_eq!(nvls_chunk_bytes(2.0 * mib, 128.0), 16384.0);
        assert_eq!(nvls_chunk_bytes(8.0 * mib, 128.0), 32768.0);
        assert_eq!(nvls_chunk_bytes(64.0 * mib, 128.0), 65536.0);
        assert_eq!(nvls_chunk_bytes(1024.0 * mib, 128.0), 131072.0);
        // 8 MiB: 512 KiB a channel, 8 heads x 32 KiB a loop, 2 loops through 3 stages.
        assert!((nvls_pipeline_share(8.0 * mib, 8.0, 16.0) - 0.5).abs() < 1e-12);
        assert!((nvls_pipeline_share(1024.0 * mib, 8.0, 16.0) - 64.0 / 66.0).abs() < 1e-12);
        assert!(nvls_pipeline_share(64.0 * 1024.0 * mib, 8.0, 16.0) > 0.999);
        // The choice compares the unpipelined rate; the bytes move at the pipeline's share.
        let sys = system("dgx-h100");
        let s = Shape {
            coll: Coll::AllReduce,
            ranks: 8,
            nodes: 1,
            bytes: 8.0 * mib,
            link_bus_bytes_per_s: sys.intra_bytes_per_s,
        };
        let plan = choose(&sys, &s).expect("plan");
        assert_eq!(plan.algo, Algo::Nvls);
        assert!((plan.bus_bytes_per_s / plan.full_bus_bytes_per_s - 0.5).abs() < 1e-12);
    }

    #[test]
    fn an_nvls_port_carries_p_plus_one_over_p_of_the_message() {
        // nccl-tests' busbw of NVLS, 2(p-1)/p x algbw, is 2(p-1)/(p+1) of the port's NVLS
        // rate: it grows with the GPUs (NVIDIA/nccl #1455 measured 370 GB/s with 2-4 H100s,
        // then 420, 440, 460, 480 with 5-8), so the ring wins up to 4 GPUs.
        let sys = system("dgx-h100");
        let plan = |ranks: u32| {
            let s = Shape {
                coll: Coll::AllReduce,
                ranks,
                nodes: 1,
                bytes: 8e9,
                link_bus_bytes_per_s: sys.intra_bytes_per_s,
            };
            choose(&sys, &s).expect("plan")
        };
        let busbw = |ranks: u32| {
            let p = plan(ranks);
            let algbw = 8e9 / p.time_s(8e9);
            algbw * 2.0 * (ranks as f64 - 1.0) / ranks as f64
        };
        for ranks in 2..=4 {
            assert_eq!(plan(ranks).algo, Algo::Ring, "{ranks} GPUs");
        }
        assert_eq!(plan(5).algo, Algo::Nvls);
        assert!((plan(8).link_bytes_per_byte - 9.0 / 8.0).abs() < 1e-12);
        let (five, eight) = (busbw(5), busbw(8));
        assert!(eight > five * 1.1 && eight > busbw(4) * 1.2, "{five} {eight}");
        let port = sys.intra_bytes_per_s * NVLS_EFFICIENCY[2] * 15.0 / 16.0;
        assert!((eight / (port * 14.0 / 9.0) - 1.0).abs() < 0.01, "{eight}");
    }
}
