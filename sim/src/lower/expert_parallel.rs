//! Expert parallelism (`plan.ep`, Megatron-Core's layout): the all-to-all dispatch and
//! combine of an MoE layer's rows among the `ep` consecutive data-parallel replicas that split
//! its routed experts (same stage and tensor rank), on the compute streams (they block the
//! experts).
//!
//! One collective task serves the whole expert-parallel group: the first replica of the group
//! that lowers it creates it on its own compute stream; the others find it by sequence number
//! (the group's replicas run the same schedule, so their n-th all-to-alls match) and join it
//! on their compute stream where they reach it, so full lowering orders every stream as its
//! own replica's schedule does. Under data-parallel symmetry only replica 0 is lowered; the
//! collective still names every member (the engine maps the others' links onto replica 0's
//! mirror links), as data-parallel collectives do.

use super::builder::{Builder, StepCtx};
use super::program::*;

/// The expert-parallel collective of `bytes` (each member's send buffer) for every tensor
/// rank of the group being lowered, labelled `label`.
pub(super) fn ep_collective(b: &mut Builder, ctx: &StepCtx, kind: CollectiveKind, label: u32, bytes: f64, mb: u32) {
    for (x, members) in ctx.ep_members.iter().enumerate() {
        let x32 = x as u32;
        let n = *b.ep_seq.entry((ctx.replica, ctx.stage, x32)).and_modify(|v| *v += 1).or_insert(0) as usize;
        let stream = ctx.streams[x];
        let key = (ctx.ep_group, ctx.stage, x32);
        if let Some(&task) = b.ep_tasks.get(&key).and_then(|list| list.get(n)) {
            b.join(task, stream);
            continue;
        }
        let id = b.collective_id(kind, members, bytes);
        let task = b.task(TaskKind::Collective, id, label, mb, &[stream]);
        b.ep_tasks.entry(key).or_default().push(task);
    }
}
