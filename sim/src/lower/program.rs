//! The Program: a plan lowered to per-device streams of tasks. The contract between the
//! simulator (which times it) and the executor (which runs it).
//!
//! A task sits on one or more device streams (a collective sits on every member's stream)
//! and may also wait for explicit dependencies on other streams (a pipeline receive waits
//! for its send). A stream runs its tasks in order; a task starts when it is at the head of
//! all its streams and its dependencies are done.

use crate::report::timeline::{Label, MemoryBreakdown, StreamKind};
use crate::workload::OpSpec;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum TaskKind {
    /// A kernel: payload indexes [`Program::ops`].
    Compute,
    /// A collective: payload indexes [`Program::collectives`].
    Collective,
    /// A point-to-point transfer: payload indexes [`Program::transfers`].
    Transfer,
    /// A copy between a device and host memory: payload indexes [`Program::host_copies`].
    HostCopy,
}

pub const NONE: u32 = u32::MAX;

/// Streams per device (one per [`StreamKind`]).
pub const STREAMS: usize = StreamKind::ALL.len();

#[derive(Clone, Copy, Debug)]
pub struct Task {
    pub kind: TaskKind,
    /// Number of streams the task sits on (a collective: one per simulated member, so as many
    /// as the cluster has devices).
    pub streams: u32,
    pub payload: u32,
    pub label: u32,
    pub micro_batch: u32,
    /// Index into [`Program::memory_events`], or [`NONE`].
    pub memory: u32,
    /// Index of the (first) stream the task sits on.
    pub stream: u32,
}

/// A unique op instance: an op spec run forward or backward. Many tasks share one.
#[derive(Clone, Debug)]
pub struct OpInstance {
    pub spec: OpSpec,
    pub backward: bool,
    /// Runs on the host CPU (an offloaded optimizer step), not on the device.
    pub on_host: bool,
    /// Bytes the op also streams from and to NVMe (ZeRO-Infinity), overlapped with its work.
    pub nvme_bytes: f64,
    /// Device class it runs on (`ClusterSpec::class`).
    pub class: u16,
    /// Fraction of the device's compute units the op runs on (1 but for a GEMM that shares
    /// them with an overlapped collective's kernel, see `TpOverlap`).
    pub sm_share: f64,
    /// The part of the op it runs: all of it, or one product of a GEMM's backward.
    pub part: OpPart,
    /// The share of the op's rows (tokens) each of the instance's kernels computes: 1 but for
    /// a GEMM cut into chunks along its rows, one per rank of a fused tensor-parallel
    /// collective or per split of a pipelined one (`TpOverlap`): a kernel of that many rows,
    /// its own tiles and waves (`cost::ComputeModel::op_rows_s`).
    pub rows: f64,
    /// The kernels of `rows` each the instance runs one after the other (1 but for the chunks
    /// of a fused collective's GEMM that run beside it; a fraction where the last runs fewer
    /// chunks at once than the others, `Builder::rows_of`): `rows x chunks` of the op's rows.
    pub chunks: f64,
}

/// The part of an op a task runs: all of it, or one of the two products of a GEMM's backward
/// (a layer whose communication runs between them: `TpOverlap::column_backward`), each half
/// the backward's time in the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpPart {
    Whole,
    /// dX = dY . W^T.
    DataGrad,
    /// dW = X^T . dY.
    WeightGrad,
}

impl OpInstance {
    /// The share of its rows' time the instance takes: a part of a GEMM's backward half
    /// (`cost::ComputeModel::op_rows_s` gives the rows' time).
    pub fn share(&self) -> f64 {
        if self.part == OpPart::Whole { 1.0 } else { 0.5 }
    }

    /// The product the instance runs, as `(batch, m, n, k, backward)` of `Y = X . W` with X
    /// m x k and W k x n (backward: dX and dW both): the spec's for the whole op, the one
    /// product for a part (dX = dY . W^T is m x n by n x k; dW = X^T . dY is k x m by m x n).
    /// `None` for an op that is not a product. A chunk of the rows ([`OpInstance::rows`])
    /// has that share of m (the weight gradient's contraction over the chunk's tokens); an
    /// instance of several chunks is replayed as one kernel of all their rows.
    pub fn gemm(&self) -> Option<(f64, f64, f64, f64, bool)> {
        let (b, m, n, k) = self.spec.class.gemm_shape()?;
        let m = m * self.rows * self.chunks;
        Some(match self.part {
            OpPart::Whole => (b, m, n, k, self.backward),
            OpPart::DataGrad => (b, m, k, n, false),
            OpPart::WeightGrad => (b, k, n, m, false),
        })
    }
}

/// Collectives are the workload's communication kinds.
pub use crate::workload::Comm as CollectiveKind;

#[derive(Clone, Debug)]
pub struct Collective {
    pub kind: CollectiveKind,
    /// Members in cluster device numbering (ring order), simulated or not.
    pub members: Vec<u32>,
    /// Size of the full buffer on each member, per call.
    pub bytes: f64,
    /// Identical calls one task stands for, back to back on one stream (a post-step
    /// all-gather in many equal buckets): each pays the collective's latency and moves its
    /// bytes, as that many tasks in a row would without other traffic. At least 1.
    pub calls: u64,
}

impl Collective {
    /// One call of `bytes` over `members`.
    pub fn new(kind: CollectiveKind, members: Vec<u32>, bytes: f64) -> Collective {
        Collective { kind, members, bytes, calls: 1 }
    }
}

#[derive(Clone, Copy, Debug)]
pub struct Transfer {
    pub source: u32,
    pub target: u32,
    pub bytes: f64,
}

#[derive(Clone, Copy, Debug)]
pub struct HostCopy {
    pub device: u32,
    /// Host to device (true) or device to host.
    pub to_device: bool,
    pub bytes: f64,
    /// The host side is the node's NVMe rather than DRAM.
    pub nvme: bool,
}

/// A change of a device's dynamic memory when a task starts or ends.
#[derive(Clone, Copy, Debug)]
pub struct MemoryEvent {
    /// Index into [`Program::devices`].
    pub device: u32,
    pub at_end: bool,
    pub activation_bytes: f64,
    /// Model data moving in (positive) or out: Gemini's chunks. Reported as weights.
    pub buffer_bytes: f64,
    /// Next event of the same task, or [`NONE`].
    pub next: u32,
    /// What the bytes belong to, with the task's micro-batch: see [`memory_tag`].
    pub tag: u32,
}

/// The unit number of the embedding (its ops' labels, gathers and memory).
pub const EMBEDDING: i32 = -1;
/// The unit number of the output layer, the loss and the trainer's metrics.
pub const HEAD: i32 = -2;
/// The memory tag of the optimizer step's temporaries.
pub const OPTIMIZER: i32 = -3;

/// The memory tag of a layer's activations ([`EMBEDDING`], [`HEAD`] and [`OPTIMIZER`]
/// included).
pub fn memory_tag(layer: i32) -> u32 {
    (layer - OPTIMIZER) as u32
}

/// The layer of a memory tag.
pub fn tag_layer(tag: u32) -> i32 {
    tag as i32 + OPTIMIZER
}

#[derive(Clone, Debug, Default)]
pub struct Program {
    /// Simulated devices, in cluster numbering.
    pub devices: Vec<u32>,
    /// Pipeline stage of each simulated device.
    pub stages: Vec<u32>,
    /// For every cluster device, the index of the simulated device that stands for it
    /// (itself when simulated; its replica-0 twin under symmetry).
    pub mirror: Vec<u32>,
    pub tasks: Vec<Task>,
    /// Task ids of each stream, in order; stream `i` is device `i / STREAMS`, kind `i % STREAMS`.
    pub streams: Vec<Vec<u32>>,
    /// Explicit dependencies as (before, after).
    pub deps: Vec<(u32, u32)>,
    pub ops: Vec<OpInstance>,
    pub collectives: Vec<Collective>,
    pub transfers: Vec<Transfer>,
    pub host_copies: Vec<HostCopy>,
    pub labels: Vec<Label>,
    pub memory_events: Vec<MemoryEvent>,
    /// Memory that is constant over the iteration, per simulated device.
    pub static_memory: Vec<MemoryBreakdown>,
    /// What each simulated device keeps in host DRAM (offloaded states).
    pub host_memory: Vec<MemoryBreakdown>,
    /// Bytes each simulated device keeps on its node's NVMe.
    pub nvme_bytes: Vec<f64>,
    /// Per simulated device: how many tasks at the head of its compute stream are the
    /// pipeline (the rest is the optimizer step); the bubble is measured over them.
    pub compute_marks: Vec<u32>,
    /// Whether one data-parallel replica stands for all.
    pub symmetric: bool,
    /// How many of its node's devices each simulated device stands for on the node's NVMe
    /// drives (1: none mirrored there); the engine divides the drives' bandwidth by it
    /// ([`super::nvme_mirrors`]).
    pub nvme_share: u32,
    /// Gemini's chunk placement per pipeline stage (replica 0), when the plan uses it.
    pub chunk_placement: Vec<ChunkPlacement>,
}

/// What Gemini's chunk manager decided for one pipeline stage (per device, per iteration).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct ChunkPlacement {
    pub stage: u32,
    /// Chunk size found by the search, in parameters (before data-parallel sharding).
    pub chunk_params: u64,
    pub chunks: usize,
    /// Chunk copies host to device and back per iteration.
    pub fetches: usize,
    pub evictions: usize,
    /// Bytes those copies move per device.
    pub moved_bytes: f64,
    /// Share of the parameters whose optimizer step runs on the device (the rest on the CPU).
    pub optimizer_on_device: f64,
    /// Whether every unit found room for its chunks beside the non-model memory.
    pub feasible: bool,
}

impl Program {
    pub fn stream_index(device_index: u32, kind: StreamKind) -> u32 {
        device_index * STREAMS as u32 + kind.index() as u32
    }

    pub fn stream_device(stream: u32) -> u32 {
        stream / STREAMS as u32
    }

    pub fn stream_kind(stream: u32) -> StreamKind {
        StreamKind::ALL[(stream % STREAMS as u32) as usize]
    }
}
