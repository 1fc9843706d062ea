//! Compute tasks: a block's ops for one pass on every device of a tensor-parallel group (with
//! the block's tensor-parallel collectives in between), recomputation, and gradient
//! accumulation.

use super::blocks::Block;
use super::builder::{Builder, PH, StepCtx};
use super::program::*;
use super::tensor_parallel::{TpOverlap, collective_on_compute, is_gemm};
use crate::report::timeline::{Label, Phase};
use crate::workload::{LayerOp, OpSpec};

/// Emit one block (a layer, the embedding or the head) for a pass on every lowered device of
/// the group. Compute ops get consecutive ids per op (lowered rank x at `id + x`), so the
/// returned first and last ids are those of the group's rank 0 and its last lowered rank. The first
/// compute op allocates `alloc` activation bytes when it starts; the last frees `free` when
/// it ends.
pub(super) fn emit_block(
    b: &mut Builder,
    ctx: &StepCtx,
    blk: &Block,
    layer: i32,
    phase: Phase,
    chunk: u32,
    mb: u32,
    alloc: f64,
    free: f64,
) -> (u32, u32) {
    let backward = phase == Phase::Backward;
    let n = blk.ops.len();
    let t = ctx.streams.len() as u32;
    let mut first = NONE;
    let mut last = NONE;
    let compute_ops = blk.ops.iter().filter(|o| o.compute().is_some()).count();
    let mut seen = 0;
    let mut overlap = TpOverlap::default();
    let walk = |i: usize| if backward { n - 1 - i } else { i };
    for i in 0..n {
        let j = walk(i);
        match &blk.ops[j] {
            LayerOp::Compute(spec) => {
                seen += 1;
                let op = if backward { blk.bwd[j] } else { blk.fwd[j] };
                let label = layer_label(b, layer, j, spec.name, phase, chunk);
                overlap.before_compute(b, ctx);
                let next = if i + 1 < n { blk.ops.get(walk(i + 1)) } else { None };
                // A column-parallel layer's backward communicates between its two products.
                let f = if backward && overlap.splits(ctx, &blk.ops[j], next) {
                    let (d, w) = (b.part_of(op, OpPart::DataGrad), b.part_of(op, OpPart::WeightGrad));
                    let dgrad = emit_group_compute(b, ctx, d, label, mb);
                    let wgrad = emit_group_compute(b, ctx, w, label, mb);
                    overlap.after_split(b, ctx, (dgrad, wgrad));
                    if transient_of(blk, j, backward) > 0.0 {
                        for x in 0..t {
                            let di = Program::stream_device(ctx.streams[x as usize]);
                            b.memory_while(dgrad + x, di, transient_of(blk, j, backward), layer);
                        }
                    }
                    dgrad
                } else {
                    let f = emit_group_compute(b, ctx, op, label, mb);
                    overlap.after_compute(b, ctx, f, is_gemm(next));
                    f
                };
                // The op's last tasks (the weight-gradient product's where it was split).
                let tail = b.p.tasks.len() as u32 - t;
                if first == NONE {
                    first = f;
                    if alloc > 0.0 {
                        for x in 0..t {
                            let di = Program::stream_device(ctx.streams[x as usize]);
                            b.memory(f + x, di, false, alloc, layer);
                        }
                    }
                }
                last = tail + t - 1;
                let transient = transient_of(blk, j, backward);
                if transient > 0.0 {
                    for x in 0..t {
                        let di = Program::stream_device(ctx.streams[x as usize]);
                        b.memory_while(tail + x, di, transient, layer);
                    }
                }
                if seen == compute_ops && free > 0.0 {
                    for x in 0..t {
                        let di = Program::stream_device(ctx.streams[x as usize]);
                        b.memory(tail + x, di, true, -free, layer);
                    }
                }
            }
            LayerOp::Comm { name, bytes, axis, forward, backward: bwd, root, forward_bytes } => {
                let kind = if backward { *bwd } else { *forward };
                let bytes = if backward { bytes } else { forward_bytes.as_ref().unwrap_or(bytes) };
                if let Some(kind) = kind {
                    let near =
                        (i > 0 && is_gemm(blk.ops.get(walk(i - 1))), i + 1 < n && is_gemm(blk.ops.get(walk(i + 1))));
                    let label = layer_label(b, layer, j, name, phase, chunk);
                    if !overlap.collective(b, ctx, kind, *axis, near, (name, *bytes, label), mb) {
                        collective_on_compute(b, ctx, kind, (*axis, *root), *bytes, label, mb);
                    }
                }
            }
        }
    }
    (first, last)
}

/// Bytes op `j` of `blk` holds while it runs, forward or backward.
fn transient_of(blk: &Block, j: usize, backward: bool) -> f64 {
    blk.transient[j][usize::from(backward)]
}

/// What a recomputation reruns of a layer's forward.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Rerun {
    /// All of it.
    Full,
    /// All of it up to the last tensor its backward keeps (`framework.recompute_early_stop`):
    /// PyTorch's non-reentrant checkpoint stops recomputing once every tensor the backward
    /// saved has been rebuilt, and a GEMM saves its input before it runs, so a layer ending in
    /// a GEMM (the MLP's down projection) and a residual add skips both (see
    /// [`crate::workload::recompute::early_stop_end`]).
    EarlyStop,
    /// What selective recomputation's modules rerun (the core attention by default; see
    /// `workload::recompute`).
    Selective,
}

/// Re-run a layer's forward before its backward: all of it, all of it up to the last tensor
/// its backward keeps, or what selective recomputation reruns ([`Rerun`]). Returns the first and last task ids
/// as [`emit_block`] does.
pub(super) fn emit_recompute(
    b: &mut Builder,
    ctx: &StepCtx,
    blk: &Block,
    layer: i32,
    chunk: u32,
    mb: u32,
    rerun: Rerun,
    alloc: f64,
) -> (u32, u32) {
    let mut first = NONE;
    let mut last = NONE;
    let mut overlap = TpOverlap::default();
    let selective_only = rerun == Rerun::Selective;
    let end = if rerun == Rerun::EarlyStop { blk.early_stop_end } else { blk.ops.len() };
    for (j, op) in blk.ops[..end].iter().enumerate() {
        match op {
            LayerOp::Compute(spec) => {
                if selective_only && !blk.rerun[j] {
                    continue;
                }
                let label = layer_label(b, layer, j, spec.name, Phase::Recompute, chunk);
                overlap.before_compute(b, ctx);
                let f = emit_group_compute(b, ctx, blk.fwd[j], label, mb);
                overlap.after_compute(b, ctx, f, is_gemm(blk.ops.get(j + 1)));
                if first == NONE {
                    first = f;
                    if alloc > 0.0 {
                        for x in 0..ctx.streams.len() as u32 {
                            let di = Program::stream_device(ctx.streams[x as usize]);
                            b.memory(f + x, di, false, alloc, layer);
                        }
                    }
                }
                last = f + ctx.streams.len() as u32 - 1;
            }
            LayerOp::Comm { name, bytes, axis, forward: Some(kind), root, forward_bytes, .. } => {
                if selective_only && !blk.rerun[j] {
                    continue;
                }
                let bytes = forward_bytes.as_ref().unwrap_or(bytes);
                let near = (j > 0 && is_gemm(blk.ops.get(j - 1)), is_gemm(blk.ops.get(j + 1)));
                let label = layer_label(b, layer, j, name, Phase::Recompute, chunk);
                if !overlap.collective(b, ctx, *kind, *axis, near, (name, *bytes, label), mb) {
                    collective_on_compute(b, ctx, *kind, (*axis, *root), *bytes, label, mb);
                }
            }
            LayerOp::Comm { .. } => {}
        }
    }
    (first, last)
}

/// The label of block op `j` of `layer` in `phase`, interned once per (layer, op, phase): a
/// layer's ops and collectives are labelled in every micro-batch.
fn layer_label(b: &mut Builder, layer: i32, j: usize, name: &'static str, phase: Phase, chunk: u32) -> u32 {
    let ph = PH.iter().position(|p| *p == phase).expect("layer phase");
    if layer >= 0 {
        let l = layer as usize;
        if b.layer_labels[l].len() <= j {
            b.layer_labels[l].resize(j + 1, [NONE; 3]);
        }
        let cached = b.layer_labels[l][j][ph];
        if cached != NONE {
            return cached;
        }
        let id = b.label(Label { op: name, layer, phase, chunk });
        b.layer_labels[l][j][ph] = id;
        id
    } else {
        b.label(Label { op: name, layer, phase, chunk })
    }
}

/// One compute op on every lowered device of the group; ids are consecutive.
pub(super) fn emit_group_compute(b: &mut Builder, ctx: &StepCtx, op: u32, label: u32, mb: u32) -> u32 {
    let first = b.p.tasks.len() as u32;
    for &s in &ctx.streams {
        b.task(TaskKind::Compute, op, label, mb, &[s]);
    }
    first
}

/// Adds a unit's new weight gradients (`params` on each device of the group) into those kept
/// from the earlier micro-batches ([`OpSpec::grad_accumulate`]). Returns the last of the
/// group's tasks, or `None` when there is nothing to add.
pub(super) fn emit_grad_accumulate(
    b: &mut Builder,
    ctx: &StepCtx,
    params: f64,
    grad_bytes: f64,
    layer: i32,
    chunk: u32,
    mb: u32,
) -> Option<u32> {
    let spec = OpSpec::grad_accumulate(params, grad_bytes);
    if spec.backward_bytes <= 0.0 {
        return None;
    }
    let op = b.shared_op(&spec, true);
    let label = b.label(Label { op: spec.name, layer, phase: Phase::Backward, chunk });
    Some(emit_group_compute(b, ctx, op, label, mb) + ctx.streams.len() as u32 - 1)
}

/// FSDP2's copy of a unit's all-gathered parameters (`bytes` on each device) out of the flat
/// all-gather buffer into the parameters, on the compute stream before the unit's `phase`
/// (`training.framework.gather_copy_out`): one copy kernel reading and writing them. Returns
/// its first and last task.
/// With `copies` (`training.framework.gather_per_tensor`), a list collective's copies
/// instead, named `copies.0`: one kernel per rank and tensor ([`OpSpec::list_copies`]).
pub(super) fn emit_gather_copy_out(
    b: &mut Builder,
    ctx: &StepCtx,
    (bytes, copies): (f64, Option<(&'static str, f64)>),
    layer: i32,
    phase: Phase,
    chunk: u32,
    mb: u32,
) -> Option<(u32, u32)> {
    if bytes <= 0.0 {
        return None;
    }
    let spec = match copies {
        Some((name, n)) => OpSpec::list_copies(name, bytes, n),
        None => OpSpec::gather_copy_out(bytes),
    };
    let op = b.shared_op(&spec, phase == Phase::Backward);
    let label = b.label(Label { op: spec.name, layer, phase, chunk });
    let first = emit_group_compute(b, ctx, op, label, mb);
    Some((first, first + ctx.streams.len() as u32 - 1))
}
