//! Tensor-parallel collectives: the all-reduces, all-gathers and reduce-scatters inside a
//! block, as collective tasks shared by the group's compute streams (they block compute), or
//! beside the neighbouring GEMM on the tensor-parallel streams where the framework overlaps
//! them ([`TpOverlap`]).

use super::builder::{Builder, StepCtx};
use super::context_parallel::{Beside, cp_collective};
use super::program::*;
use crate::report::timeline::Phase;
use crate::workload::{Axis, LayerOp, OpClass};

/// A collective of `bytes` among the group's devices along `axis` (the whole group, or each
/// line of the tensor-parallel grid along one dimension, rooted at `root`), on their compute
/// streams, its tasks labelled `label`.
pub(super) fn collective_on_compute(
    b: &mut Builder,
    ctx: &StepCtx,
    kind: CollectiveKind,
    (axis, root): (Axis, u32),
    bytes: f64,
    label: u32,
    mb: u32,
) {
    if axis == Axis::Expert {
        super::expert_parallel::ep_collective(b, ctx, kind, label, bytes, mb);
        return;
    }
    let Some(n) = axis.dim() else {
        // The whole group: one task on all its compute streams.
        let id = b.collective_id(kind, &ctx.group, bytes);
        b.task(TaskKind::Collective, id, label, mb, &ctx.streams);
        return;
    };
    // Along grid dimension n: one collective per line of the grid, all at once.
    let dims = &ctx.dims;
    let size = dims[n];
    if size <= 1 {
        return;
    }
    let stride: u32 = dims[n + 1..].iter().product();
    // Grids of more than one dimension are lowered rank by rank (never folded).
    debug_assert_eq!(ctx.streams.len(), ctx.group.len());
    for x in 0..ctx.group.len() as u32 {
        if !(x / stride).is_multiple_of(size) {
            continue;
        }
        // Members in coordinate order, rotated so the root comes first.
        let idx: Vec<usize> = (0..size).map(|k| (x + ((k + root) % size) * stride) as usize).collect();
        let members: Vec<u32> = idx.iter().map(|&i| ctx.group[i]).collect();
        let streams: Vec<u32> = idx.iter().map(|&i| ctx.streams[i]).collect();
        let id = b.collective_id(kind, &members, bytes);
        b.task(TaskKind::Collective, id, label, mb, &streams);
    }
}

/// Megatron-Core's overlap of tensor-parallel communication with GEMMs (and, through the same
/// bookkeeping, context parallelism's ring beside the attention kernel: `context_parallel`) (Transformer Engine's
/// userbuffers, `tp_comm_overlap`), for one block's walk. The configurations Megatron-Core
/// and NeMo ship (`ub_cfg`: `qkv_fprop`, `fc1_fprop`, `proj_dgrad`, `fc2_dgrad` by
/// `ring_exchange`; `proj_fprop`, `fc2_fprop` by `pipeline`) overlap each sequence-parallel
/// all-gather with the GEMM that consumes it and each reduce-scatter with the GEMM that
/// produces it:
///
/// - an all-gather before a GEMM (ring exchange): the GEMM works on the chunk it holds while
///   the next one arrives, so the whole all-gather runs on the tensor-parallel stream beside
///   the GEMM and the task after the GEMM waits for it;
/// - a reduce-scatter after a GEMM (pipelined, `num_splits` 4 by default): each of the GEMM's
///   4 chunks is scattered while the next is computed, so 3/4 of the bytes run beside the
///   GEMM and the last chunk's 1/4 follows it on the compute stream; meanwhile the GEMM runs
///   on the SMs the communication kernels leave it (`StepCtx::tp_sm_share`, `num_sm` 16 with
///   `set_sm_margin`). Ring exchange uses the copy engines and leaves the GEMM all its SMs.
///
/// Sources: transformer_engine/pytorch/module/base.py `initialize_ub` (default `num_sm` 1
/// for ring_exchange and 16 otherwise, `set_sm_margin` off for ring_exchange, `num_splits`
/// tp for ring_exchange and 4 for pipeline). Not modelled: the lower efficiency of the
/// chunked GEMMs.
#[derive(Default)]
pub(super) struct TpOverlap {
    /// Per group member, the compute stream's last task before the latest GEMM.
    tails: Vec<u32>,
    /// Overlapped collectives the task after the next compute op waits for, per compute
    /// stream: (stream, task).
    after_next: Vec<(u32, u32)>,
    /// The first of the group's tasks of the latest compute op.
    last_compute: u32,
    /// The first of the group's tasks of the latest op's two backward products, where it was
    /// split ([`TpOverlap::splits`]): (data gradient, weight gradient).
    halves: Option<(u32, u32)>,
}

/// The collectives into a column-parallel GEMM (Megatron's `f`: the attention's and the MLP's
/// input projections and the output layer), whose backward reduces the input gradient.
const COLUMN_INPUTS: [&str; 3] = ["attn_in", "mlp_in", "head_in"];

/// The collectives into a block's input projections, whose backward reduces the sum of the
/// projections' input gradients where the projections are separate GEMMs.
const SUMMED_INPUTS: [&str; 2] = ["attn_in", "mlp_in"];

/// Whether collective `name` is a block input's whose backward reduce-scatter PyTorch's
/// micro-pipelined TP leaves unfused (`StepCtx::summed_input_grads`).
fn unfused_summed(ctx: &StepCtx, name: &str) -> bool {
    ctx.summed_input_grads && SUMMED_INPUTS.contains(&name)
}

/// Chunks of a pipelined reduce-scatter (Transformer Engine's default `num_splits`).
pub(crate) const PIPELINE_SPLITS: f64 = 4.0;

/// Whether block op `op` is a GEMM (the ops tensor-parallel communication overlaps).
pub(super) fn is_gemm(op: Option<&LayerOp>) -> bool {
    matches!(op, Some(LayerOp::Compute(spec)) if matches!(spec.class, OpClass::Gemm { .. }))
}

impl TpOverlap {
    /// Before a compute op is emitted: remember where each compute stream stands.
    pub(super) fn before_compute(&mut self, b: &Builder, ctx: &StepCtx) {
        if ctx.tp_streams.is_empty() && ctx.cp_streams.is_empty() && ctx.tp_async_streams.is_empty() {
            return;
        }
        self.tails.clear();
        self.tails.extend(ctx.streams.iter().map(|&s| b.p.streams[s as usize].last().copied().unwrap_or(NONE)));
    }

    /// Whether block op `op`'s backward runs as its two products with `next`, the collective
    /// after it in backward order, between and beside them: a GEMM into which a column-parallel
    /// layer's input collective feeds, whose backward reduces the input gradient, where the
    /// framework runs that beside the GEMMs ([`TpOverlap::column_backward`]).
    pub(super) fn splits(&self, ctx: &StepCtx, op: &LayerOp, next: Option<&LayerOp>) -> bool {
        if ctx.tp_streams.is_empty() && ctx.tp_async_streams.is_empty()
            || !is_gemm(Some(op))
            || matches!(next, Some(LayerOp::Comm { name, .. }) if unfused_summed(ctx, name))
        {
            return false;
        }
        matches!(
            next,
            Some(LayerOp::Comm {
                name,
                axis: Axis::Tensor,
                backward: Some(CollectiveKind::ReduceScatter | CollectiveKind::AllReduce),
                ..
            }) if COLUMN_INPUTS.contains(name)
        )
    }

    /// After a GEMM's backward is emitted as its two products (each group's first task).
    pub(super) fn after_split(&mut self, b: &mut Builder, (dgrad, wgrad): (u32, u32)) {
        self.after_compute(b, wgrad);
        self.halves = Some((dgrad, wgrad));
    }

    /// After a compute op is emitted: the next task on each compute stream waits for the
    /// all-gather that ran beside it.
    pub(super) fn after_compute(&mut self, b: &mut Builder, first: u32) {
        self.halves = None;
        self.last_compute = first;
        for (s, task) in self.after_next.drain(..) {
            b.held_tp[s as usize].push(task);
        }
    }

    /// Lowers the collective overlapped with its neighbouring GEMM where the framework does
    /// that (see [`TpOverlap`]), its tasks labelled `label`; `false` when it is not overlapped
    /// (the caller lowers it on the compute streams).
    pub(super) fn collective(
        &mut self,
        b: &mut Builder,
        ctx: &StepCtx,
        kind: CollectiveKind,
        axis: Axis,
        (prev_gemm, next_gemm): (bool, bool),
        (name, bytes, label): (&'static str, f64, u32),
        mb: u32,
    ) -> bool {
        if matches!(axis, Axis::Context | Axis::ContextExposed) {
            let backward = b.p.labels[label as usize].phase == Phase::Backward;
            let beside = match (axis, backward) {
                (Axis::ContextExposed, _) => Beside::Blocking,
                (_, true) => Beside::Previous { tails: self.tails.clone() },
                (_, false) => Beside::Next,
            };
            let pairs = cp_collective(b, ctx, kind, bytes, (label, mb), &beside);
            self.after_next.extend(pairs);
            return true;
        }
        // The collective after a GEMM split into its backward products ([`TpOverlap::splits`]).
        if self.column_backward(b, ctx, kind, bytes, label, mb) {
            return true;
        }
        // The expert-parallel dispatcher's all-gather and reduce-scatter of the routed rows
        // (Megatron-Core's `gather_from_sequence_parallel_region` in the alltoall token
        // dispatcher) are plain collectives, not Transformer Engine userbuffers.
        if ctx.tp_streams.is_empty() || axis != Axis::Tensor || name.starts_with("ep_") {
            return false;
        }
        // PyTorch's micro-pipelined TP fuses a reduce-scatter only with the one GEMM producing
        // its input: the sum of separate projections' input gradients goes unfused.
        let backward = b.p.labels[label as usize].phase == Phase::Backward;
        if backward && kind == CollectiveKind::ReduceScatter && unfused_summed(ctx, name) {
            return false;
        }
        match kind {
            CollectiveKind::AllGather if next_gemm => {
                let id = b.collective_id(kind, &ctx.group, bytes);
                let task = b.task(TaskKind::Collective, id, label, mb, &ctx.tp_streams);
                for &s in &ctx.streams {
                    b.after_stream_tail(s, task);
                }
                self.after_next.extend(ctx.streams.iter().map(|&s| (s, task)));
                true
            }
            CollectiveKind::ReduceScatter if prev_gemm && self.tails.len() == ctx.streams.len() => {
                // The GEMM shares its SMs with the reduce-scatter's kernels.
                for x in 0..ctx.streams.len() as u32 {
                    let task = (self.last_compute + x) as usize;
                    let op = b.p.tasks[task].payload;
                    b.p.tasks[task].payload = b.narrowed(op, ctx.tp_sm_share);
                }
                let id = b.collective_id(kind, &ctx.group, bytes * (PIPELINE_SPLITS - 1.0) / PIPELINE_SPLITS);
                let beside = b.task(TaskKind::Collective, id, label, mb, &ctx.tp_streams);
                for &tail in &self.tails {
                    if tail != NONE {
                        b.p.deps.push((tail, beside));
                    }
                }
                let last = b.collective_id(kind, &ctx.group, bytes / PIPELINE_SPLITS);
                let exposed = b.task(TaskKind::Collective, last, label, mb, &ctx.streams);
                b.p.deps.push((beside, exposed));
                true
            }
            _ => false,
        }
    }

    /// A column-parallel layer's backward communication between and beside its two products
    /// (just emitted, [`TpOverlap::splits`]), as Megatron's and Transformer Engine's column-
    /// parallel layers run it: under sequence parallelism (`kind` a reduce-scatter) the input
    /// the layer kept sharded is all-gathered again beside the data-gradient product, and the
    /// weight-gradient product waits for it; the input gradient's reduction (`kind`) starts
    /// once the data gradient is computed and runs beside the weight-gradient product; the
    /// compute stream's next task waits for it. On Transformer Engine's userbuffers
    /// (`Plan::tp_overlap`: the bulk overlaps `*_dgrad` and `*_wgrad`) both products run on
    /// the SMs their kernels leave; on an NCCL stream (`Plan::tp_async`: Megatron's
    /// asynchronous backward) the engine takes the collectives' SMs while they run. `false`
    /// when the op before was not split.
    fn column_backward(
        &mut self,
        b: &mut Builder,
        ctx: &StepCtx,
        kind: CollectiveKind,
        bytes: f64,
        label: u32,
        mb: u32,
    ) -> bool {
        let Some((dgrad, wgrad)) = self.halves.take() else { return false };
        let bulk = !ctx.tp_streams.is_empty();
        let side = if bulk { &ctx.tp_streams } else { &ctx.tp_async_streams };
        if bulk {
            for x in 0..ctx.streams.len() as u32 {
                for task in [dgrad + x, wgrad + x] {
                    let op = b.p.tasks[task as usize].payload;
                    b.p.tasks[task as usize].payload = b.narrowed(op, ctx.tp_sm_share);
                }
            }
        }
        // PyTorch's micro-pipelined TP keeps the gathered input: nothing to gather again.
        if kind == CollectiveKind::ReduceScatter && !(bulk && ctx.micro_pipeline) {
            let id = b.collective_id(CollectiveKind::AllGather, &ctx.group, bytes);
            let gather = b.task(TaskKind::Collective, id, label, mb, side);
            for (x, &tail) in self.tails.iter().enumerate() {
                if tail != NONE {
                    b.p.deps.push((tail, gather));
                }
                b.p.deps.push((gather, wgrad + x as u32));
            }
        }
        let id = b.collective_id(kind, &ctx.group, bytes);
        let reduce = b.task(TaskKind::Collective, id, label, mb, side);
        for x in 0..ctx.streams.len() as u32 {
            b.p.deps.push((dgrad + x, reduce));
        }
        for &s in &ctx.streams {
            b.held_tp[s as usize].push(reduce);
        }
        true
    }
}
