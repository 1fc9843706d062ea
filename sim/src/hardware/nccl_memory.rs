//! GPU memory that NCCL's communicators hold: the buffers each connection between two ranks
//! keeps for its protocols, per channel, and NVLink SHARP's buffers. PyTorch and Megatron
//! open one communicator per process group, and none of this memory goes through the
//! framework's caching allocator: `torch.cuda.max_memory_allocated` and `memory_reserved` do
//! not count it, `nvidia-smi` does.
//!
//! Every size is NCCL 2.30.7's (commit 5067397c2676d5aed50042fc39e5c8ee96eb0027):
//!
//! - A connection's buffer per protocol (`src/init.cc`, `computeBuffSizes`, from
//!   `src/include/device.h`): LL 8 lines x 512 threads x 8 steps x 16 B = 512 KiB, LL128 120
//!   elements x 640 threads x 8 steps x 8 B = 4,915,200 B, Simple 4 MiB.
//! - Over NVLink or PCIe (`src/transport/p2p.cc`) the receiving end holds the three (Simple on
//!   the sending end instead when it reads), each end rounded up to `CUDA_IPC_MIN` (2 MiB):
//!   10 MiB on the receiver and 2 MiB on the sender, the two sizes NCCL's allocation log shows
//!   for every channel of an all-to-all on 8 H100s (NVIDIA/nccl#1685, `NCCL_DEBUG_SUBSYS=ALLOC`).
//! - Over the network with GPUDirect RDMA (`src/transport/net.cc`, `sendProxyConnect` and
//!   `recvProxyConnect`) both ends keep their buffers in GPU memory: the sender LL128 and
//!   Simple, the receiver all three, each rounded up to 2 MiB: 10 MiB each. Point-to-point
//!   work over the network uses one shared buffer per communicator instead
//!   (`sharedNetBuffersInit`: p2p channels x 16 steps x the 128 KiB chunk, for sends and for
//!   receives).
//! - A ring channel connects each rank to its predecessor and its successor: one receiving
//!   and one sending end per rank (`src/transport/generic.cc`, `ncclTransportRingConnect`).
//!   A tree channel connects each rank to its parent and children (`ncclTransportTreeConnect`,
//!   up to 3 children): inside a node a chain, two each way; trainsim counts two for every
//!   rank (a node's head on the tree across nodes has up to two more on its channels).
//! - NVLS (`src/transport/nvls.cc`, `ncclNvlsBufferSetup`): its channels (16 on Hopper) x 2
//!   x (the 128 KiB NVLS chunk x 8 steps) x its heads (one per GPU of the node).
//! - All-to-all runs as point-to-point work: every peer in the node on up to
//!   `p2pnChannelsPerPeer` channels (`hardware::nccl_p2p`; 32 on 8 H100s, as #1685's log shows),
//!   each a receiving and a sending end.
//!
//! Since NCCL 2.22 a communicator connects an algorithm's channels the first time a
//! collective runs on it (`NCCL_RUNTIME_CONNECT`, default 1; `src/enqueue.cc`,
//! `initAlgoChannels`), so only the algorithms its collectives use cost memory. Before it
//! (`cluster.nccl.version` below 2.22, or `runtime_connect` false) a communicator connected its
//! rings and trees on every channel, and set up NVLS where the node has it, when it was created
//! (`src/init.cc` at v2.19.4-1); and before 2.21 an NVLS buffer was the Simple protocol's 4 MiB,
//! not 8 steps of 128 KiB (`src/transport/nvls.cc` at v2.19.4-1 against v2.21.5-1): 1 GiB per
//! communicator of 8 H100s, why NeMo's launcher and JAX's containers set `NCCL_NVLS_ENABLE=0` for memory
//! (NVIDIA/NeMo-Framework-Launcher#127, NVIDIA/JAX-Toolbox#383).
//!
//! Checked against #1685: 7 peers x 32 channels x 12 MiB = 2.82 GB where the user measured
//! 3.28 GB more after the first all-to-all (-14%); NCCL's maintainer in NVIDIA/nccl#986: "Ring
//! uses a limited amount of memory as it only has 2 connections regardless of the scale",
//! memory "linearly tied to the number of channels".

/// `NCCL_STEPS`: slots in a connection's buffer.
const STEPS: f64 = 8.0;
/// Per-connection buffers (bytes) of LL, LL128 and Simple.
pub const LL_BYTES: f64 = 8.0 * 512.0 * STEPS * 16.0;
pub const LL128_BYTES: f64 = 120.0 * 640.0 * STEPS * 8.0;
pub const SIMPLE_BYTES: f64 = 4_194_304.0;
/// `CUDA_IPC_MIN`: the granularity each end's allocation is rounded up to.
const IPC_MIN: f64 = 2_097_152.0;
/// `NCCL_NVLS_CHUNKSIZE` default: an NVLS buffer's step since NCCL 2.21.
pub const NVLS_CHUNK: f64 = super::nccl::NVLS_CHUNK_BYTES;
/// `NCCL_SHARED_STEPS` and `NCCL_P2P_NET_CHUNKSIZE`: the shared network buffer's slots.
const SHARED_STEPS: f64 = 16.0;
const P2P_NET_CHUNK: f64 = 131_072.0;

/// Rounded up to the allocation granularity (a header of NCCL's own always rides along).
fn rounded(bytes: f64) -> f64 {
    ((bytes + 1.0) / IPC_MIN).ceil() * IPC_MIN
}

/// A rank's share of one connection over NVLink or PCIe in each direction: the receiving
/// end's buffers and the sending end's control block (12 MiB).
pub fn p2p_connection_bytes() -> f64 {
    rounded(LL_BYTES + LL128_BYTES + SIMPLE_BYTES) + IPC_MIN
}

/// A rank's share of one connection over the network in each direction: the receiving end's
/// three buffers and the sending end's LL128 and Simple, all in GPU memory (20 MiB).
pub fn net_connection_bytes() -> f64 {
    rounded(LL_BYTES + LL128_BYTES + SIMPLE_BYTES) + rounded(LL128_BYTES + SIMPLE_BYTES)
}

/// One ring channel's bytes on a rank of a communicator with `per_node` ranks in each node,
/// over `nodes` nodes: a ring leaves each node once, so `1 / per_node` of a rank's
/// connections (averaged over the channels, which start at different GPUs) cross the
/// network.
pub fn ring_channel_bytes(per_node: f64, nodes: u32) -> f64 {
    if nodes <= 1 {
        return p2p_connection_bytes();
    }
    let net = 1.0 / per_node.max(1.0);
    (1.0 - net) * p2p_connection_bytes() + net * net_connection_bytes()
}

/// NVLS's buffers on each GPU: `channels` x 2 x `buffer` x `heads`, a buffer being
/// [`nvls_buffer_bytes`].
pub fn nvls_bytes(channels: u32, heads: u32, buffer: f64) -> f64 {
    channels as f64 * 2.0 * buffer * heads as f64
}

/// One NVLS buffer: [`NVLS_CHUNK`] x 8 steps (1 MiB) since NCCL 2.21, the Simple protocol's
/// whole buffer ([`SIMPLE_BYTES`], 4 MiB) before (`with_chunk` false).
pub fn nvls_buffer_bytes(with_chunk: bool) -> f64 {
    if with_chunk { NVLS_CHUNK * STEPS } else { SIMPLE_BYTES }
}

/// The shared buffers of a communicator's point-to-point work over the network, for sends and
/// receives, on `p2p_channels` channels.
pub fn shared_net_bytes(p2p_channels: u32) -> f64 {
    2.0 * p2p_channels as f64 * SHARED_STEPS * P2P_NET_CHUNK
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: f64 = 1_048_576.0;

    #[test]
    fn connection_sizes_follow_nccls_allocations() {
        // #1685's allocation log: 10,485,760 B on the receiver, 2,097,152 B on the sender.
        assert_eq!(LL_BYTES + LL128_BYTES + SIMPLE_BYTES, 9_633_792.0);
        assert_eq!(p2p_connection_bytes(), 12.0 * MIB);
        assert_eq!(net_connection_bytes(), 20.0 * MIB);
        assert_eq!(ring_channel_bytes(8.0, 1), 12.0 * MIB);
        assert_eq!(ring_channel_bytes(1.0, 4), 20.0 * MIB);
        assert_eq!(ring_channel_bytes(4.0, 2), 14.0 * MIB);
        // 16 channels x 2 x 1 MiB x 8 heads.
        assert_eq!(nvls_bytes(16, 8, nvls_buffer_bytes(true)), 256.0 * MIB);
        // Before NCCL 2.21 a step was the Simple buffer: 1 GiB on 8 GPUs.
        assert_eq!(nvls_bytes(16, 8, nvls_buffer_bytes(false)), 1024.0 * MIB);
        assert_eq!(shared_net_bytes(16), 64.0 * MIB);
    }
}
