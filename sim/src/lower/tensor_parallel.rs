//! Tensor-parallel collectives: the all-reduces, all-gathers and reduce-scatters inside a
//! block, as collective tasks shared by the group's compute streams (they block compute), or
//! beside the neighbouring GEMM on the tensor-parallel streams where the framework overlaps
//! them ([`TpOverlap`]).

use super::builder::{Builder, StepCtx};
use super::compute::emit_group_compute;
use super::context_parallel::{Beside, cp_collective};
use super::program::*;
use crate::report::timeline::{Label, Phase};
use crate::workload::{Axis, LayerOp, OpClass, OpSpec};

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
/// - an all-gather before a GEMM (ring exchange, `num_splits` tp): the GEMM works on the
///   chunk it holds while the next one arrives, so the all-gather runs on the tensor-parallel
///   stream beside all of the GEMM's chunks of rows but the last, which follows it
///   (`OpInstance::rows`); in backward the GEMM is a row-parallel layer's data gradient, and
///   its weight gradient, which reads the whole gathered output gradient, follows too;
/// - a reduce-scatter after a GEMM (pipelined, `num_splits` 4 by default): each of the GEMM's
///   4 chunks is scattered while the next is computed, so the first chunk runs alone, 3/4 of
///   the bytes run beside the other three and the last chunk's 1/4 follows them on the
///   compute stream; meanwhile the GEMM runs
///   on the SMs the communication kernels leave it (`StepCtx::tp_sm_share`, `num_sm` 16 with
///   `set_sm_margin`). Ring exchange uses the copy engines and leaves the GEMM all its SMs.
///
/// Sources: transformer_engine/pytorch/module/base.py `initialize_ub` (default `num_sm` 1
/// for ring_exchange and 16 otherwise, `set_sm_margin` off for ring_exchange, `num_splits`
/// tp for ring_exchange and 4 for pipeline). Each chunk is a GEMM of its own rows, its tiles
/// and waves its own (`OpInstance::rows`), issued round-robin on up to three compute streams
/// ([`TE_CHUNK_STREAMS`]), so that up to three run at once.
///
/// PyTorch's micro-pipelined TP (`StepCtx::micro_pipeline`) runs its fused ops differently
/// (`torch/distributed/_symmetric_memory/__init__.py`): the transfers are copy-engine reads of
/// the peers' symmetric-memory buffers, which take no SM, and the GEMM is cut into one chunk
/// of rows per rank (`OpInstance::rows`), the chunks alternating between two streams so that
/// two run at once ([`TORCH_CHUNK_STREAMS`]):
///
/// - all-gather-matmul (`_pipelined_all_gather_and_consume`): each rank first copies its shard
///   into its symmetric buffer on the compute stream (`tp_symm_copy`), then computes its own
///   chunk while the peers' shards arrive, each chunk after its shard; every GEMM reading the
///   gathered input is fused in (torchtitan's separate q, k, v and w1, w3). So the GEMMs but
///   one rank's chunk of each run beside the gather, and that chunk after it. In backward the
///   consumer is the row-parallel layer's data gradient; its weight gradient reads the whole
///   gathered gradient, after the gather.
/// - matmul-reduce-scatter (`_pipelined_produce_and_all2all`): the chunk for the first peer
///   is computed before any transfer, the others beside the transfers, and the partial sums
///   pulled from the peers are added on the compute stream once all have arrived
///   (`tp_reduce_partials`).
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
    /// PyTorch's fused all-gather-matmul whose consumer GEMMs are being emitted.
    fused_gather: Option<FusedGather>,
}

/// A fused all-gather-matmul under way (see [`TpOverlap`]): the gather's task, the group's
/// size, and per consumer GEMM so far its group's first task and its whole op.
struct FusedGather {
    task: u32,
    ranks: f64,
    consumers: Vec<(u32, u32)>,
    /// Only the GEMM right after the gather is fused (Transformer Engine's userbuffers: one
    /// GEMM per communicator); PyTorch's fuses every GEMM reading the gathered input.
    one_consumer: bool,
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

/// Compute streams Transformer Engine's userbuffers issue a GEMM's chunks on, round-robin
/// (`NVTE_COMM_OVERLAP_MAX_STREAMS`, transformer_engine/common/include/transformer_engine/
/// comm_gemm_overlap.h; `_stream_compute[i % _stream_compute.size()]` in
/// comm_gemm_overlap.cpp's `split_overlap_ag` and `split_overlap_rs`).
pub(crate) const TE_CHUNK_STREAMS: f64 = 3.0;

/// Streams PyTorch's fused ops alternate a GEMM's chunks between (the current stream and its
/// backend stream, "computation/computation overlapping, greatly reducing quantization
/// inefficiency": `_pipelined_multi_all_gather_and_consume` and
/// `_pipelined_produce_and_all2all` in torch/distributed/_symmetric_memory/__init__.py).
pub(crate) const TORCH_CHUNK_STREAMS: f64 = 2.0;

/// `chunks` kernels of `rows` of a GEMM's rows each, up to `streams` at once, as kernels run
/// one after the other: (rows per kernel, kernels). Kernels that run at once share out their
/// tiles as one kernel of all their rows would, so `s = min(streams, chunks)` of them count as
/// one of `s x rows`, `chunks / s` times (a fraction where the last runs fewer).
pub(crate) fn chunk_kernels(rows: f64, chunks: f64, streams: f64) -> (f64, f64) {
    let at_once = streams.min(chunks).max(1.0);
    (rows * at_once, chunks / at_once)
}

/// The streams a GEMM's chunks run on under the group's tensor-parallel overlap.
fn chunk_streams(ctx: &StepCtx) -> f64 {
    if ctx.micro_pipeline { TORCH_CHUNK_STREAMS } else { TE_CHUNK_STREAMS }
}

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
    pub(super) fn after_split(&mut self, b: &mut Builder, ctx: &StepCtx, (dgrad, wgrad): (u32, u32)) {
        self.after_compute(b, ctx, wgrad, false);
        self.halves = Some((dgrad, wgrad));
    }

    /// After a compute op is emitted (its group's first task `first`; `next_gemm`: the op
    /// after it is a GEMM): the next task on each compute stream waits for the all-gather
    /// that ran beside it. A fused all-gather-matmul's consumer runs all but one rank's chunk
    /// beside the gather, and that chunk after it once the consumers end.
    pub(super) fn after_compute(&mut self, b: &mut Builder, ctx: &StepCtx, first: u32, next_gemm: bool) {
        self.halves = None;
        self.last_compute = first;
        if let Some(mut g) = self.fused_gather.take() {
            let op = b.p.tasks[first as usize].payload;
            let (gemm, backward) = (is_gemm_op(b, op), b.p.ops[op as usize].backward);
            // In backward the consumer is a row-parallel layer's data gradient; its weight
            // gradient reads the whole gathered gradient, after the gather.
            let consumer = if gemm && backward { b.part_of(op, OpPart::DataGrad) } else { op };
            if gemm {
                let beside = b.rows_of(consumer, 1.0 / g.ranks, g.ranks - 1.0, chunk_streams(ctx));
                set_payload(b, ctx, first, beside);
                g.consumers.push((first, consumer));
            }
            if gemm && next_gemm && !g.one_consumer && !backward {
                self.fused_gather = Some(g);
            } else {
                finish_gather(b, ctx, &g);
                if gemm && backward {
                    let (label, mb) = (b.p.tasks[first as usize].label, b.p.tasks[first as usize].micro_batch);
                    let wgrad = b.part_of(op, OpPart::WeightGrad);
                    emit_group_compute(b, ctx, wgrad, label, mb);
                }
            }
        }
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
                let ranks = ctx.group.len() as f64;
                // PyTorch's copies the rank's shard into symmetric memory first.
                if ctx.micro_pipeline {
                    extra_op(b, ctx, &OpSpec::tp_symm_copy(bytes / ranks), label, mb);
                }
                let id = b.collective_id(kind, &ctx.group, bytes);
                let task = b.task(TaskKind::Collective, id, label, mb, &ctx.tp_streams);
                for &s in &ctx.streams {
                    b.after_stream_tail(s, task);
                }
                let one_consumer = !ctx.micro_pipeline;
                self.fused_gather = Some(FusedGather { task, ranks, consumers: Vec::new(), one_consumer });
                true
            }
            CollectiveKind::ReduceScatter if prev_gemm && ctx.micro_pipeline => {
                let ranks = ctx.group.len() as f64;
                let op = b.p.tasks[self.last_compute as usize].payload;
                let pulls = first_chunk_beside(b, ctx, (self.last_compute, op, ranks), (kind, bytes), (label, mb));
                for &s in &ctx.streams {
                    b.held_tp[s as usize].push(pulls);
                }
                extra_op(b, ctx, &OpSpec::tp_reduce_partials(bytes, ranks), label, mb);
                true
            }
            CollectiveKind::ReduceScatter if prev_gemm => {
                // The GEMM shares its SMs with the reduce-scatter's kernels.
                let narrow = b.narrowed(b.p.tasks[self.last_compute as usize].payload, ctx.tp_sm_share);
                let part = bytes * (PIPELINE_SPLITS - 1.0) / PIPELINE_SPLITS;
                let beside =
                    first_chunk_beside(b, ctx, (self.last_compute, narrow, PIPELINE_SPLITS), (kind, part), (label, mb));
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
        // (PyTorch's fused ops move the bytes by copy engine: no SM taken.)
        if bulk && !ctx.micro_pipeline {
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

/// Whether op `op` of the program is a GEMM.
fn is_gemm_op(b: &Builder, op: u32) -> bool {
    matches!(b.p.ops[op as usize].spec.class, OpClass::Gemm { .. })
}

/// Points the group's tasks from `first` (one per compute stream) at op `op`.
fn set_payload(b: &mut Builder, ctx: &StepCtx, first: u32, op: u32) {
    for x in 0..ctx.streams.len() as u32 {
        b.p.tasks[(first + x) as usize].payload = op;
    }
}

/// A memory-bound op of a fused collective (`spec`) on the group's compute streams, labelled
/// by its own name in the collective's layer and pass.
fn extra_op(b: &mut Builder, ctx: &StepCtx, spec: &OpSpec, label: u32, mb: u32) {
    let l = b.p.labels[label as usize].clone();
    let backward = l.phase == Phase::Backward;
    let op = b.shared_op(spec, backward);
    let own = b.label(Label { op: spec.name, ..l });
    emit_group_compute(b, ctx, op, own, mb);
}

/// The rank's own chunk of each consumer of a fused all-gather-matmul, after the gather.
fn finish_gather(b: &mut Builder, ctx: &StepCtx, g: &FusedGather) {
    for &s in &ctx.streams {
        b.held_tp[s as usize].push(g.task);
    }
    for &(first, op) in &g.consumers {
        let (label, mb) = (b.p.tasks[first as usize].label, b.p.tasks[first as usize].micro_batch);
        let own = b.rows_of(op, 1.0 / g.ranks, 1.0, 1.0);
        emit_group_compute(b, ctx, own, label, mb);
    }
}

/// The GEMM whose group's tasks start at `head` (op `op`) cut into `chunks` chunks of rows
/// before a reduce-scatter of `bytes` (kind `kind`) pipelined with it: the first chunk before
/// anything is scattered, the rest on the compute streams beside the collective, which runs on
/// the tensor-parallel streams once the first chunk is done. Returns the collective's task.
fn first_chunk_beside(
    b: &mut Builder,
    ctx: &StepCtx,
    (head, op, chunks): (u32, u32, f64),
    (kind, bytes): (CollectiveKind, f64),
    (label, mb): (u32, u32),
) -> u32 {
    let first = b.rows_of(op, 1.0 / chunks, 1.0, 1.0);
    set_payload(b, ctx, head, first);
    let rest = b.rows_of(op, 1.0 / chunks, chunks - 1.0, chunk_streams(ctx));
    let gemm_label = b.p.tasks[head as usize].label;
    emit_group_compute(b, ctx, rest, gemm_label, mb);
    let id = b.collective_id(kind, &ctx.group, bytes);
    let task = b.task(TaskKind::Collective, id, label, mb, &ctx.tp_streams);
    for x in 0..ctx.streams.len() as u32 {
        b.p.deps.push((head + x, task));
    }
    task
}
