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
//!
//! Expert data parallelism (`dp` > `ep`): the routed experts' gradients are reduced (and
//! under ZeRO-1 their updated shards all-gathered) over the `dp / ep` replicas that hold the
//! same experts (replica r's peers are the replicas ≡ r modulo ep), in buckets of their own
//! on [`EXPERT_SYNC_STREAM`], created by the first replica of each such group and found by the
//! others by sequence number, as `data_parallel::dp_collective` does for the whole group.
//! Under hybrid sharding those collectives span the replicas of the shard group that hold the
//! same experts (`Plan::expert_shard_members`), and each reduced expert shard is then
//! all-reduced with the same shard of the other groups, as the dense shards are.

use super::builder::{Builder, Shared, StepCtx};
use super::program::*;
use crate::plan::Plan;
use crate::report::timeline::{Label, Phase, StreamKind};

/// The stream expert gradient reductions and ZeRO-1's expert parameter all-gathers run on:
/// apart from the data-parallel stream (Megatron-Core issues them on the expert-data-parallel
/// communicator, separately from the dense gradients' buckets), so they overlap backward.
/// (ZeRO-3's gathers, the stream's other user, are refused with expert parallelism.)
pub(super) const EXPERT_SYNC_STREAM: StreamKind = StreamKind::Gather;

/// The expert-data-parallel collective of replica `r`'s tensor rank `x` of `stage`: created
/// by the first of its group to lower it (on every lowered member's stream), found by the
/// others by sequence number.
#[allow(clippy::too_many_arguments)]
pub(super) fn edp_collective(
    b: &mut Builder,
    plan: &Plan,
    r: u32,
    stage: u32,
    x: u32,
    kind: CollectiveKind,
    (bytes, calls): (f64, u64),
    name: &'static str,
) -> u32 {
    // (Under hybrid sharding each shard group's replicas of an expert are a group of their own,
    // and each member joins where its own walk reaches the collective, as the dense ones do:
    // its reductions and the all-reduces of their shards then queue in its own order.)
    let group = [r % plan.ep + plan.ep * (r / plan.shard_degree()), stage, x];
    let own = Program::stream_index(b.dev_index[plan.device(r, stage, x) as usize], EXPERT_SYNC_STREAM);
    b.shared_sync(
        Shared::ExpertData,
        (group, [r, stage, x, 0]),
        (own, plan.hybrid_shard()),
        (kind, || plan.expert_shard_members(r, stage, x), EXPERT_SYNC_STREAM),
        (bytes, calls),
        Label { op: name, layer: -1, phase: Phase::Sync, chunk: stage },
    )
}

/// The expert-parallel collective of `bytes` (each member's send buffer) for every tensor
/// rank of the group being lowered, labelled `label`.
///
/// Where the all-to-alls overlap another micro-batch's compute (`Plan::ep_overlap`:
/// Megatron-Core's combined 1F1B schedule, DeepSeek's DualPipe) they run on the rank's
/// communication stream from where its compute stream stands, and the compute stream waits
/// for them only at the start of its next schedule step (`Builder::held_step`): the rest of
/// the step's compute stands in for the other micro-batch's that hides them. An all-to-all
/// longer than that compute is exposed there; its traffic still shares the links.
pub(super) fn ep_collective(b: &mut Builder, ctx: &StepCtx, kind: CollectiveKind, label: u32, bytes: f64, mb: u32) {
    let overlap = !ctx.ep_streams.is_empty();
    for (x, members) in ctx.ep_members.iter().enumerate() {
        let x32 = x as u32;
        let stream = ctx.streams[x];
        let on = if overlap { ctx.ep_streams[x] } else { stream };
        let at = ([ctx.ep_group, ctx.stage, x32], [ctx.replica, ctx.stage, x32, 0]);
        let task = b.shared_collective(Shared::Expert, at, (kind, members, bytes), (label, mb), on);
        if overlap {
            b.after_stream_tail(stream, task);
            b.held_step[stream as usize].push(task);
        }
    }
}

/// At the start of a schedule step, the compute streams' next task waits for the expert
/// all-to-alls the previous step left running beside it.
pub(super) fn release_held_steps(b: &mut Builder, ctx: &StepCtx) {
    if ctx.ep_streams.is_empty() {
        return;
    }
    for &s in &ctx.streams {
        let held = std::mem::take(&mut b.held_step[s as usize]);
        b.held_tp[s as usize].extend(held);
    }
}
