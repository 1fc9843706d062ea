//! Context parallelism (`plan.cp`, Megatron-Core with Transformer Engine): the ring that
//! passes each rank's keys and values to the others of its context-parallel group (the same
//! tensor rank of `cp` consecutive replicas), beside the attention kernel.
//!
//! Transformer Engine's `AttnFuncWithCPAndKVP2P` sends the key/value chunk it holds to the
//! next rank and receives the previous rank's on a separate stream while it computes
//! attention on the chunk it has, `cp` steps in all: the ring's traffic (an all-gather of the
//! keys and values) runs beside the attention kernel, and the op after attention waits for
//! both. In backward the chunks go around again and the key/value gradients come back
//! (a reduce-scatter), beside the attention's backward. Pipelined this way a rank waits for
//! communication only where a step's transfer outlasts a step's compute, which the engine
//! sees as the ring outlasting the kernel; not modelled: the first step's compute (1/cp of
//! the kernel), which cannot overlap a transfer, is counted as overlapped.
//!
//! PyTorch's `context_parallel` (`training.framework.cp_ring`, `workload::context_ring`) runs
//! the same traffic differently, and the workload says so in its ops: with the all-gather
//! rotater the kernel is split into the local step, which the all-gather runs beside, and the
//! remote steps, which wait for it; the key/value gradients travel in fp32, and the wait for
//! the last of them (`Axis::ContextExposed`) is on the compute stream ([`Beside::Blocking`]).
//!
//! The collective is one task for the whole group, on each member's communication stream
//! (`StreamKind::TensorParallel`, shared with Transformer Engine's tensor-parallel overlap):
//! the first replica of the group that lowers it creates it, the others find it by sequence
//! number and join it where they reach it (as `expert_parallel::ep_collective` does). Under
//! replica symmetry only replica 0 is lowered and the engine maps the other members' links
//! onto its mirror links.

use super::builder::{Builder, Shared, StepCtx};
use super::program::*;

/// Where a ring collective goes relative to the attention kernel it serves.
pub(super) enum Beside {
    /// The kernel comes next (forward and recomputation): the collective starts when the
    /// compute stream reaches it; the task after the next compute op waits for it.
    Next,
    /// The kernel was just emitted (backward, walked in reverse): the collective starts with
    /// it (after the tasks before it, `tails`, per lowered rank); the next compute task waits.
    Previous { tails: Vec<u32> },
    /// Not beside anything: on the compute stream, which waits for it (PyTorch's wait for the
    /// last key/value gradients of its ring, `workload::context_ring`).
    Blocking,
}

/// Lowers one context-parallel collective of `bytes` for every lowered tensor rank, its tasks
/// labelled `label`.
/// Returns, for [`Beside::Next`], the (compute stream, task) pairs the task after the next
/// compute op must wait for.
pub(super) fn cp_collective(
    b: &mut Builder,
    ctx: &StepCtx,
    kind: CollectiveKind,
    bytes: f64,
    (label, mb): (u32, u32),
    beside: &Beside,
) -> Vec<(u32, u32)> {
    let mut after_next = Vec::new();
    for (x, members) in ctx.cp_members.iter().enumerate() {
        let x32 = x as u32;
        let compute = ctx.streams[x];
        let side = if matches!(beside, Beside::Blocking) { compute } else { ctx.cp_streams[x] };
        let at = ([ctx.cp_group, ctx.stage, x32], [ctx.replica, ctx.stage, x32, 0]);
        let task = b.shared_collective(Shared::Context, at, (kind, members, bytes), (label, mb), side);
        match beside {
            Beside::Next => {
                b.after_stream_tail(compute, task);
                after_next.push((compute, task));
            }
            Beside::Previous { tails } => {
                if let Some(&tail) = tails.get(x).filter(|&&t| t != NONE) {
                    b.p.deps.push((tail, task));
                }
                b.held_tp[compute as usize].push(task);
            }
            Beside::Blocking => {}
        }
    }
    after_next
}
