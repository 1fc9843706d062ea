//! What the engine records: every task's start and end on its device stream, every flow on
//! the links, and each device's memory over time.

use serde::Serialize;

/// A device's in-order queue. Compute holds kernels and blocking tensor-parallel
/// collectives; the others overlap with it, as CUDA streams do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StreamKind {
    Compute,
    /// Data-parallel gradient collectives and ZeRO parameter gathers.
    DataParallel,
    /// Pipeline sends.
    PipelineSend,
    /// Parameter gathers (ZeRO-3).
    Gather,
    /// Copies between host (or NVMe) and device memory: offloaded states, Gemini's chunks,
    /// activations.
    HostCopy,
    /// Tensor-parallel collectives that overlap the neighbouring GEMM
    /// (`framework.tp_comm_overlap`), and context parallelism's ring beside attention.
    TensorParallel,
    /// Expert parallelism's all-to-alls where they overlap another micro-batch's compute
    /// (`framework.ep_comm_overlap`).
    ExpertParallel,
    /// Tensor-parallel NCCL collectives a column-parallel layer's backward runs beside its
    /// GEMMs (`framework.tp_async_backward`); their kernels take SMs from compute.
    TensorAsync,
}

impl StreamKind {
    pub const ALL: [StreamKind; 8] = [
        StreamKind::Compute,
        StreamKind::DataParallel,
        StreamKind::PipelineSend,
        StreamKind::Gather,
        StreamKind::HostCopy,
        StreamKind::TensorParallel,
        StreamKind::ExpertParallel,
        StreamKind::TensorAsync,
    ];
    pub fn index(self) -> usize {
        self as usize
    }
    pub fn name(self) -> &'static str {
        match self {
            StreamKind::Compute => "compute",
            StreamKind::DataParallel => "dp-comm",
            StreamKind::PipelineSend => "pp-send",
            StreamKind::Gather => "gather",
            StreamKind::HostCopy => "host-copy",
            StreamKind::TensorParallel => "tp-comm",
            StreamKind::ExpertParallel => "ep-comm",
            StreamKind::TensorAsync => "tp-async",
        }
    }
}

/// Which part of the iteration a task belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Forward,
    Backward,
    /// Forward ops re-run before backward (activation recomputation).
    Recompute,
    Optimizer,
    /// Communication not tied to one pass (gradient sync).
    Sync,
}

impl Phase {
    pub fn short(self) -> &'static str {
        match self {
            Phase::Forward => "F",
            Phase::Backward => "B",
            Phase::Recompute => "R",
            Phase::Optimizer => "opt",
            Phase::Sync => "sync",
        }
    }
}

/// What a task is, for traces and plots. Interned: tasks point at these by index.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Label {
    /// Op name (`qkv`, `fc1`, `attn_allreduce`, `send`, `grad_allreduce`, ...).
    pub op: &'static str,
    /// Transformer layer index, -1 for embedding/head/optimizer/whole-model ops.
    pub layer: i32,
    pub phase: Phase,
    /// Pipeline chunk (virtual stage) the op belongs to.
    pub chunk: u32,
}

/// One executed task on one device stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Span {
    pub device: u32,
    pub stream: StreamKind,
    pub start_ns: u64,
    pub end_ns: u64,
    pub label: u32,
    /// Micro-batch, or u32::MAX for per-iteration work.
    pub micro_batch: u32,
}

/// One flow's life on the interconnect.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct FlowSpan {
    pub links: [u32; 2],
    pub source: u32,
    pub target: u32,
    pub start_ns: u64,
    pub end_ns: u64,
    pub bytes: f64,
}

/// A device's memory at a moment, by kind (bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct MemoryBreakdown {
    pub weights: f64,
    pub gradients: f64,
    pub optimizer: f64,
    pub activations: f64,
    pub buffers: f64,
}

impl MemoryBreakdown {
    pub fn total(&self) -> f64 {
        self.weights + self.gradients + self.optimizer + self.activations + self.buffers
    }
}

/// A change of one device's activation/buffer memory at a time (the static parts do not
/// change during an iteration).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct MemorySample {
    pub device: u32,
    pub time_ns: u64,
    pub activations: f64,
    /// Model data moved onto the device less what moved off it so far (Gemini's chunks).
    pub moved_weights: f64,
}

/// The recorded iteration. Spans and flows are filled only when recording was asked for.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Timeline {
    pub labels: Vec<Label>,
    pub spans: Vec<Span>,
    pub flows: Vec<FlowSpan>,
    pub memory: Vec<MemorySample>,
    /// Devices that were simulated (all, or one data-parallel replica under symmetry).
    pub devices: Vec<u32>,
    /// Pipeline stage of each simulated device (same order as `devices`).
    pub stages: Vec<u32>,
    /// Memory that stays constant over the iteration, per simulated device and tier
    /// (same order as `devices`). Activations and buffers there are zero or fixed; the
    /// dynamic part is in `memory`.
    pub static_hbm: Vec<MemoryBreakdown>,
    pub static_host: Vec<MemoryBreakdown>,
    /// Capacity of each tier per device: HBM, and the device's share of host DRAM.
    pub hbm_capacity_bytes: f64,
    pub host_capacity_bytes: f64,
    pub iteration_ns: u64,
    /// Busy time of each stream, recorded or not (indices as in `Program::streams`: device
    /// `i / STREAMS`, kind `i % STREAMS`).
    #[serde(skip)]
    pub stream_busy_ns: Vec<u64>,
}
