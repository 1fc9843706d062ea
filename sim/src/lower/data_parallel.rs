//! Data-parallel synchronisation: gradient reduction in buckets during backward (all-reduce,
//! or reduce-scatter under ZeRO), the all-gather of updated parameter shards under ZeRO-1 and
//! 2 (after the optimizer step, or overlapped with the next forward), and the collectives
//! shared across replicas. (ZeRO-3's parameter gathers before each use are in `gather.rs`.)
//!
//! The decisions a framework profile changes live here, each in one named place:
//! [`GRAD_SYNC_STREAM`] and [`PARAM_GATHER_STREAM`] (what the collectives overlap with),
//! [`GradSync::reduces`] (which backward steps reduce), [`GradSync::bucket_bytes`] (bucket
//! size per chunk) and [`grad_sync`]'s `after` (what a bucket waits for),
//! [`gather_updated_params`] (the post-step all-gather's buckets and what they wait for), and
//! [`ParamPrefetch`] (the all-gather in the next forward and what dispatches each bucket).

use super::builder::{Builder, Shared};
use super::context::{Lowering, Stage};
use super::program::*;
use crate::plan::Plan;
use crate::report::timeline::{Label, Phase, StreamKind};
use crate::schedule::{Pass, Step};
use std::collections::HashMap;

/// The stream gradient reductions (and ZeRO-1/2's post-step all-gathers) run on: their own,
/// so they overlap the backward compute that follows the bucket.
pub(super) const GRAD_SYNC_STREAM: StreamKind = StreamKind::DataParallel;

/// The stream ZeRO-3's per-unit parameter all-gathers run on: their own, so a gather overlaps
/// the previous unit's compute (and the gradient reductions).
pub(super) const PARAM_GATHER_STREAM: StreamKind = StreamKind::Gather;

/// Data-parallel collectives of (stage, tp rank) across replicas (under hybrid sharding,
/// across replica `r`'s shard group: [`Plan::shard_members`]), one per member group, created
/// by the first replica that lowers it; later replicas find it by sequence number.
/// `(bytes, calls)`: `calls` back-to-back calls of `bytes` each as one task ([`Collective::calls`]).
pub(super) fn dp_collective(
    b: &mut Builder,
    plan: &Plan,
    r: u32,
    stage: u32,
    x: u32,
    kind: CollectiveKind,
    (bytes, calls): (f64, u64),
    name: &'static str,
    stream: StreamKind,
) -> u32 {
    let s = stream.index() as u32;
    // Under ring sequence parallelism one collective spans the whole stage; under hybrid
    // sharding each shard group has its own.
    let part = r / plan.shard_degree();
    let group = [stage, if plan.ring() { 0 } else { x + plan.tp * part }, s];
    // On the compute stream each lowered member joins the collective where its own walk
    // reaches it; on a communication stream it is queued for every member at once, but under
    // hybrid sharding, whose shard all-reduces join member by member
    // ([`replicate_all_reduce`]): a member's reductions and all-reduces then queue in its
    // own walk's order.
    let on_compute = stream == StreamKind::Compute || plan.hybrid_shard();
    let own = Program::stream_index(b.dev_index[plan.device(r, stage, x) as usize], stream);
    b.shared_sync(
        Shared::Data,
        (group, [r, stage, x, s]),
        (own, on_compute),
        (kind, || plan.shard_members(r, stage, x), stream),
        (bytes, calls),
        Label { op: name, layer: -1, phase: Phase::Sync, chunk: stage },
    )
}

/// Under hybrid sharding, the all-reduce of replica `r`'s reduced shard of a bucket (`bytes`
/// of it) with the same shard of every other shard group ([`Plan::replicate_members`]): FSDP's
/// `HYBRID_SHARD` runs it on the reduce-scatter's stream once that ends
/// (`_post_backward_hook`: `_reduce_scatter` then `dist.all_reduce` over `_inter_node_pg`).
fn replicate_all_reduce(
    b: &mut Builder,
    plan: &Plan,
    (r, stage, x): (u32, u32, u32),
    bytes: f64,
    (stream, name): (StreamKind, &'static str),
) -> u32 {
    let s = stream.index() as u32;
    let group = [stage, x + plan.tp * (r % plan.shard_degree()), s];
    // Each member joins the all-reduce where its own walk reaches it (as on the compute stream
    // in `dp_collective`): its members belong to different shard groups, whose lowerings
    // would otherwise queue one group's all-reduces on another's stream ahead of the
    // reduce-scatters they wait for.
    let own = Program::stream_index(b.dev_index[plan.device(r, stage, x) as usize], stream);
    let label = b.label(Label { op: name, layer: -1, phase: Phase::Sync, chunk: stage });
    let members = plan.replicate_members(r, stage, x);
    b.shared_collective(
        Shared::Replicate,
        (group, [r, stage, x, s]),
        (CollectiveKind::AllReduce, &members, bytes),
        (label, NONE),
        own,
    )
}

/// `total` bytes in buckets of `bucket`, as (bytes per call, calls): the full buckets as one
/// task of that many calls (`Collective::calls`: a million buckets of a few KB stay one task),
/// then the remainder.
fn buckets(total: f64, bucket: f64) -> Vec<(f64, u64)> {
    let n = (total / bucket).ceil().max(1.0) as u64;
    if n == 1 {
        return vec![(total, 1)];
    }
    vec![(bucket, n - 1), (total - bucket * (n - 1) as f64, 1)]
}

/// Gradient sync of one bucket for every device of the group, each after that device's
/// task `after + x - (t-1)`; with the optimizer on the host, each device then copies its
/// reduced shard to host memory. Returns the last task per device.
/// `calls`: the reduction as that many back-to-back calls of an even share of `bytes` each.
#[allow(clippy::too_many_arguments)]
fn grad_sync(
    b: &mut Builder,
    plan: &Plan,
    r: u32,
    stage: u32,
    bytes: f64,
    after: u32,
    to_host: bool,
    calls: u64,
) -> Vec<u32> {
    let kind = if plan.zero_stage >= 1 { CollectiveKind::ReduceScatter } else { CollectiveKind::AllReduce };
    let t = b.ranks;
    let label = b.label(Label { op: "grad_to_host", layer: -1, phase: Phase::Sync, chunk: stage });
    let alone = plan.sync_degree() == 1;
    (0..t)
        .map(|x| {
            let done = after + x - (t - 1);
            // Without peers there is nothing to reduce, only the copy to the host.
            let task = if alone {
                done
            } else {
                let calls = calls.max(1);
                // A framework that reduces on the compute stream holds up the backward.
                let stream = if plan.framework.grad_reduce == crate::framework::GradReduce::Blocking {
                    StreamKind::Compute
                } else {
                    GRAD_SYNC_STREAM
                };
                let task =
                    dp_collective(b, plan, r, stage, x, kind, (bytes / calls as f64, calls), "grad_sync", stream);
                b.p.deps.push((done, task));
                if plan.hybrid_shard() {
                    let shard = bytes / plan.shard_degree() as f64;
                    let all_reduce =
                        replicate_all_reduce(b, plan, (r, stage, x), shard, (stream, "grad_allreduce_shard"));
                    b.p.deps.push((task, all_reduce));
                    all_reduce
                } else {
                    task
                }
            };
            if !to_host {
                return task;
            }
            let shard = if kind == CollectiveKind::ReduceScatter { bytes / plan.shard_degree() as f64 } else { bytes };
            let copy = b.host_copy(plan.device(r, stage, x), false, shard, false, label);
            b.p.deps.push((task, copy));
            copy
        })
        .collect()
}

/// Reduction of one bucket of routed-expert gradients over the expert-data-parallel group
/// (see [`super::expert_parallel`]), each device's after its task `after + x - (t-1)`.
fn expert_grad_sync(b: &mut Builder, plan: &Plan, r: u32, stage: u32, bytes: f64, after: u32) -> Vec<u32> {
    let kind = if plan.zero_stage >= 1 { CollectiveKind::ReduceScatter } else { CollectiveKind::AllReduce };
    let t = b.ranks;
    let stream = super::expert_parallel::EXPERT_SYNC_STREAM;
    (0..t)
        .map(|x| {
            let mut task = after + x - (t - 1);
            if plan.expert_shard_degree() > 1 {
                let reduce =
                    super::expert_parallel::edp_collective(b, plan, r, stage, x, kind, (bytes, 1), "expert_grad_sync");
                b.p.deps.push((task, reduce));
                task = reduce;
            }
            if plan.hybrid_shard() {
                // The reduced expert shard with the same shard of every other shard group.
                let shard = bytes / plan.expert_shard_degree().max(1) as f64;
                let name = "expert_grad_allreduce_shard";
                let all_reduce = replicate_all_reduce(b, plan, (r, stage, x), shard, (stream, name));
                b.p.deps.push((task, all_reduce));
                task = all_reduce;
            }
            task
        })
        .collect()
}

/// Gradient reduction of one stage, bucket by bucket as backward produces the gradients.
pub(super) struct GradSync {
    r: u32,
    stage: u32,
    /// Whether the stage reduces gradients at all: with data-parallel peers, or with the
    /// optimizer on the host under ZeRO-2 and 3 (gradients stream there even without peers).
    enabled: bool,
    /// ZeRO-2 and 3 reduce every micro-batch's gradients (into this device's shard); below,
    /// and with `grad_reduce: after_backward`, only each chunk's last backward micro-batch
    /// reduces the accumulated gradients ([`Plan::gradient_shard_stage`]).
    every_micro_batch: bool,
    /// The last backward micro-batch of each chunk on the stage.
    last_bwd: HashMap<u32, u32>,
    /// A bucket is reduced once it holds at least this many bytes (of gradients as they
    /// travel), in the chunk being walked (see [`GradSync::bucket_bytes`]).
    bucket_bytes: f64,
    /// The stage's chunks' bucket sizes.
    chunk_buckets: HashMap<u32, f64>,
    /// Bytes a gradient travels in per byte it is kept in: 2 for fp32 reduction of 16-bit
    /// gradients (Megatron's `accumulate_allreduce_grads_in_fp32`).
    dtype_scale: f64,
    /// Gradient bytes in the open bucket.
    pending_bytes: f64,
    /// Under expert data parallelism (`dp` > `ep` > 1), the routed experts' gradient bytes in
    /// their own open bucket, reduced over the replicas holding the same experts; `None`
    /// when they are not reduced (ep = 1: they are in `pending_bytes`; dp = ep: no peers).
    pending_expert: Option<f64>,
    /// With the optimizer on the host, each reduced bucket is copied there.
    to_host: bool,
    /// Calls per bucket's reduction: a layer's parameter tensors under
    /// `framework.gather_per_tensor` (DeepSpeed 2021's reduce-scatter per tensor), else 1.
    calls: u64,
    /// Per device of the group, the last task of the latest bucket's reduction (and copy);
    /// empty before the first. The optimizer step waits for it.
    pub(super) last_sync: Vec<u32>,
    /// Per device, the last task of the latest expert bucket's reduction.
    pub(super) last_expert_sync: Vec<u32>,
}

impl GradSync {
    pub(super) fn new(lw: &Lowering, st: &Stage) -> GradSync {
        GradSync {
            r: st.r,
            stage: st.stage,
            enabled: lw.sync > 1 || (lw.host_opt && lw.z >= 2),
            every_micro_batch: lw.z >= lw.plan.gradient_shard_stage(),
            last_bwd: last_backward(&st.order),
            bucket_bytes: Self::bucket_bytes(lw, st.my_chunks.first().copied().unwrap_or(0)),
            chunk_buckets: st.my_chunks.iter().map(|&c| (c, Self::bucket_bytes(lw, c))).collect(),
            dtype_scale: lw.plan.framework.grad_reduce_bytes(lw.gb) / lw.gb.max(f64::MIN_POSITIVE),
            pending_bytes: 0.0,
            pending_expert: (lw.plan.ep > 1 && lw.plan.replicas() > lw.plan.ep).then_some(0.0),
            to_host: lw.host_opt,
            calls: if lw.per_tensor { super::gather::layer_tensors(&lw.s.workload.transformer) as u64 } else { 1 },
            last_sync: Vec::new(),
            last_expert_sync: Vec::new(),
        }
    }

    /// Chunk `c`'s bucket size: `plan.bucket_bytes` (PyTorch DDP's `bucket_cap_mb`,
    /// DeepSpeed's `reduce_bucket_size`, Megatron-Core's `bucket_size`); ZeRO-3
    /// reduce-scatters each layer's gradients as soon as they exist. A framework that reduces
    /// after backward (Megatron-LM 2021) has one bucket, reduced when the stage's backward
    /// ends; one that buckets only the first chunk (`framework.bucket_first_chunk_only`,
    /// Megatron-Core) one bucket for every other chunk, reduced when its backward ends.
    pub(super) fn bucket_bytes(lw: &Lowering, c: u32) -> f64 {
        let framework = &lw.plan.framework;
        if lw.z3 {
            0.0
        } else if framework.grad_reduce == crate::framework::GradReduce::AfterBackward
            || (framework.bucket_first_chunk_only && c > 0)
        {
            f64::INFINITY
        } else {
            lw.plan.bucket_bytes
        }
    }

    /// Before a backward step of chunk `c`: its bucket size.
    pub(super) fn enter_chunk(&mut self, c: u32) {
        if let Some(&bucket) = self.chunk_buckets.get(&c) {
            self.bucket_bytes = bucket;
        }
    }

    /// Whether the backward of chunk `c` on unit `mb` reduces its gradients.
    pub(super) fn reduces(&self, c: u32, mb: u32) -> bool {
        self.enabled && (self.every_micro_batch || self.last_bwd.get(&c) == Some(&mb))
    }

    /// Add a unit's gradients to the open bucket without closing it (the head's, the
    /// embedding's).
    pub(super) fn add(&mut self, bytes: f64) {
        self.pending_bytes += bytes * self.dtype_scale;
    }

    /// Add a layer's gradients; when the bucket is full, reduce it after the layer's backward
    /// (`after`: the last task of the group's last device, see [`grad_sync`]).
    /// `expert_bytes`: the layer's routed experts' gradients under expert parallelism (not in
    /// `bytes`), reduced in their own buckets over the expert-data-parallel group.
    pub(super) fn add_layer(&mut self, b: &mut Builder, plan: &Plan, bytes: f64, expert_bytes: f64, after: u32) {
        self.pending_bytes += bytes * self.dtype_scale;
        if self.pending_bytes >= self.bucket_bytes {
            self.last_sync =
                grad_sync(b, plan, self.r, self.stage, self.pending_bytes, after, self.to_host, self.calls);
            self.pending_bytes = 0.0;
        }
        if let Some(pending) = self.pending_expert.as_mut() {
            *pending += expert_bytes * self.dtype_scale;
            if *pending >= self.bucket_bytes {
                let bytes = std::mem::take(pending);
                self.last_expert_sync = expert_grad_sync(b, plan, self.r, self.stage, bytes, after);
            }
        }
    }

    /// At the end of a reducing backward step: reduce what the open bucket holds after the
    /// step's last task `after`.
    pub(super) fn flush(&mut self, b: &mut Builder, plan: &Plan, after: u32) {
        if self.pending_bytes > 0.0 {
            self.last_sync =
                grad_sync(b, plan, self.r, self.stage, self.pending_bytes, after, self.to_host, self.calls);
            self.pending_bytes = 0.0;
        }
        if let Some(pending) = self.pending_expert.as_mut().filter(|p| **p > 0.0) {
            let bytes = std::mem::take(pending);
            self.last_expert_sync = expert_grad_sync(b, plan, self.r, self.stage, bytes, after);
        }
    }
}

/// The last backward micro-batch of each chunk in a stage's order.
fn last_backward(order: &[Step]) -> HashMap<u32, u32> {
    order.iter().filter(|st| st.pass == Pass::Backward).map(|st| (st.chunk, st.micro_batch)).collect()
}

/// ZeRO-1 and 2: after the optimizer step, all-gather the updated parameter shards in buckets
/// like the gradients; the first bucket of device x waits for its step `opt_tasks[x]`, the
/// others follow it on [`GRAD_SYNC_STREAM`].
pub(super) fn gather_updated_params(b: &mut Builder, lw: &Lowering, st: &Stage, opt_tasks: &[u32]) {
    let plan = lw.plan;
    if !(1..3).contains(&lw.z) || overlapped_param_gather(lw) {
        return;
    }
    // Routed experts under expert parallelism are gathered over their own group.
    expert_gather_updated_params(b, lw, st, opt_tasks);
    let total = (st.params - st.expert_params) * lw.wb;
    let bucket = if plan.framework.bucket_first_chunk_only && st.stage > 0 { total } else { plan.bucket_bytes };
    for (i, bytes) in buckets(total, bucket).into_iter().enumerate() {
        for (x, &o) in opt_tasks.iter().enumerate() {
            let g = dp_collective(
                b,
                plan,
                st.r,
                st.stage,
                x as u32,
                CollectiveKind::AllGather,
                bytes,
                "param_allgather",
                GRAD_SYNC_STREAM,
            );
            if i == 0 {
                b.p.deps.push((o, g));
            }
        }
    }
}

/// ZeRO-1 under expert data parallelism: the all-gather of the routed experts' updated
/// shards over the replicas holding the same experts, in buckets (nothing when no other replica
/// of the shard group holds them: dp = ep, or dp_shard = ep under hybrid sharding).
fn expert_gather_updated_params(b: &mut Builder, lw: &Lowering, st: &Stage, opt_tasks: &[u32]) {
    let plan = lw.plan;
    if plan.ep <= 1 || plan.expert_shard_degree() <= 1 || st.expert_params <= 0.0 {
        return;
    }
    let total = st.expert_params * lw.wb;
    for (i, bytes) in buckets(total, plan.bucket_bytes).into_iter().enumerate() {
        for (x, &o) in opt_tasks.iter().enumerate() {
            let kind = CollectiveKind::AllGather;
            let g = super::expert_parallel::edp_collective(
                b,
                plan,
                st.r,
                st.stage,
                x as u32,
                kind,
                bytes,
                "expert_param_allgather",
            );
            if i == 0 {
                b.p.deps.push((o, g));
            }
        }
    }
}

/// Whether ZeRO-1 and 2's all-gather of the updated shards runs at the start of the next
/// forward, overlapped with it ([`ParamPrefetch`]), instead of ending the step
/// (`framework.param_gather_overlap`: Megatron-Core's distributed optimizer with
/// `overlap_param_gather`).
pub(super) fn overlapped_param_gather(lw: &Lowering) -> bool {
    (1..3).contains(&lw.z) && lw.plan.framework.param_gather_overlap && lw.sync > 1 && !lw.per_unit
}

/// Per unit of a chunk in forward order, the (dense, expert) bytes of the bucket it opens.
type UnitBuckets = Vec<Option<(f64, f64)>>;

/// The overlapped all-gather of the updated parameter shards (see [`overlapped_param_gather`]),
/// as Megatron-Core runs it (`megatron/core/distributed/distributed_data_parallel.py` and
/// `param_and_grad_buffer.py`, bucket groups' `start_param_sync` and `finish_param_sync`;
/// `megatron/core/pipeline_parallel/schedules.py`; read at Megatron-LM d98e8a6, 2026): the
/// steady-state iteration begins with the previous step's update still to gather, and the
/// forward of each model chunk's first micro-batch waits in each module's pre-hook for the
/// bucket holding its parameters. Without an interleaved schedule (`align_param_gather` is
/// then off) the first pre-hook dispatches the first bucket, once the chunk's input has
/// arrived, and each wait dispatches the next bucket's gather: one bucket ahead of the
/// forward. With one (`align_param_gather`, on by default) every bucket is dispatched up
/// front; the model dispatches them all as the iteration starts, in chunk order on the one
/// stream (Megatron dispatches chunks 0 and 1 then, and each later chunk when the one before
/// it starts; the stream's order makes the two nearly alike). The optimizer step then ends the
/// iteration. Buckets are formed as the gradient buckets are, from the chunk's last parameters
/// backwards (the remainder is the first bucket the forward meets); routed experts under
/// expert data parallelism are gathered beside them over their own group.
pub(super) struct ParamPrefetch {
    /// Per chunk of the stage: its first forward micro-batch, and per unit in forward order
    /// (the embedding, each layer, the head, as the walk meets them) the gathers it opens as
    /// (dense bytes, expert bytes) when it is the first unit of a bucket.
    chunks: HashMap<u32, (u32, UnitBuckets)>,
    /// Every bucket of a chunk dispatched up front (interleaved schedules).
    aligned: bool,
    /// Units of the current chunk's first forward met so far.
    cursor: usize,
    /// The current chunk's buckets' gathers so far, each per lowered device as (dense,
    /// expert) ([`NONE`] where none), and the bucket the walk is in (`None` before the first).
    buckets: Vec<Vec<[u32; 2]>>,
    bucket: Option<usize>,
    /// Per lowered device, what the next bucket's dispatch waits for (chained dispatch): the
    /// chunk's input arriving, then the first compute task of the unit that opened the
    /// current bucket. Empty: nothing.
    release: Vec<u32>,
    /// Whether the unit being emitted opened a bucket.
    opened: bool,
}

impl ParamPrefetch {
    pub(super) fn new(lw: &Lowering, st: &Stage) -> ParamPrefetch {
        let mut chunks = HashMap::new();
        if overlapped_param_gather(lw) {
            let grad = lw.plan.framework.grad_reduce_bytes(lw.gb);
            let experts_gathered = lw.plan.ep > 1 && lw.plan.expert_shard_degree() > 1;
            for &c in &st.my_chunks {
                let first = st.order.iter().find(|s| s.chunk == c && s.pass == Pass::Forward);
                if let Some(first) = first {
                    let bucket = GradSync::bucket_bytes(lw, c);
                    chunks.insert(c, (first.micro_batch, Self::buckets(lw, c, bucket, grad, experts_gathered)));
                }
            }
        }
        ParamPrefetch {
            chunks,
            aligned: st.my_chunks.len() > 1,
            cursor: 0,
            buckets: Vec::new(),
            bucket: None,
            release: Vec::new(),
            opened: false,
        }
    }

    /// Chunk `c`'s units in forward order, each with the gathers of the bucket it opens.
    fn buckets(lw: &Lowering, c: u32, bucket: f64, grad: f64, experts: bool) -> UnitBuckets {
        let mut units: Vec<(f64, f64)> = Vec::new();
        if c == 0 && lw.edges && lw.plan.frozen.cached_layers == 0 {
            // A frozen model's embedding is not updated, so nothing to gather.
            units.push((if lw.frozen { 0.0 } else { lw.first_params }, 0.0));
        }
        for l in lw.starts[c as usize]..lw.starts[c as usize + 1] {
            let e = lw.lp_expert[l as usize];
            units.push((lw.lp[l as usize] - e, e));
        }
        if c == lw.chunks - 1 && lw.edges {
            units.push((lw.last_params, 0.0));
        }
        let mut opens = vec![None; units.len()];
        let (mut dense, mut expert) = (0.0, 0.0);
        for i in (0..units.len()).rev() {
            // Routed experts under expert parallelism are gathered over the replicas holding
            // the same experts, and not at all when no other does (dp = ep: ZeRO shards
            // nothing of them); without it they are in `dense`.
            dense += units[i].0;
            expert += if experts { units[i].1 } else { 0.0 };
            if (dense + expert) * grad >= bucket || i == 0 {
                if dense + expert > 0.0 {
                    opens[i] = Some((dense * lw.wb, expert * lw.wb));
                }
                (dense, expert) = (0.0, 0.0);
            }
        }
        opens
    }

    /// Whether step (`c`, `mb`) is its chunk's first forward, which gathers.
    pub(super) fn gathers_at(&self, c: u32, mb: u32, phase: Phase) -> bool {
        phase == Phase::Forward && self.chunks.get(&c).is_some_and(|(first, _)| *first == mb)
    }

    /// Before a forward step that gathers (see [`ParamPrefetch::gathers_at`]): `arrivals`
    /// (per lowered device, the send of its input; empty on the first chunk) are what its first
    /// bucket's dispatch waits for.
    pub(super) fn begin(&mut self, arrivals: Vec<u32>) {
        if !self.aligned {
            self.release = arrivals;
        }
    }

    /// One bucket's gathers for every lowered device, each after `release` (if any).
    fn dispatch(
        b: &mut Builder,
        plan: &Plan,
        st: &Stage,
        (dense, expert): (f64, f64),
        release: &[u32],
    ) -> Vec<[u32; 2]> {
        let kind = CollectiveKind::AllGather;
        (0..b.ranks)
            .map(|x| {
                let (r, stage) = (st.r, st.stage);
                let dense = (dense > 0.0).then(|| {
                    dp_collective(b, plan, r, stage, x, kind, (dense, 1), "param_allgather", GRAD_SYNC_STREAM)
                });
                let expert = (expert > 0.0).then(|| {
                    let name = "expert_param_allgather";
                    super::expert_parallel::edp_collective(b, plan, r, stage, x, kind, (expert, 1), name)
                });
                let pair = [dense.unwrap_or(NONE), expert.unwrap_or(NONE)];
                let after = release.get(x as usize).copied().unwrap_or(NONE);
                for g in pair.into_iter().filter(|&g| g != NONE && after != NONE) {
                    b.p.deps.push((after, g));
                }
                pair
            })
            .collect()
    }

    /// Before a unit's compute on chunk `c`, micro-batch `mb`, `phase`: the gathers it waits
    /// for, per lowered device (empty when none).
    pub(super) fn before(
        &mut self,
        b: &mut Builder,
        plan: &Plan,
        st: &Stage,
        (c, mb): (u32, u32),
        phase: Phase,
    ) -> Vec<[u32; 2]> {
        self.opened = false;
        if !self.gathers_at(c, mb, phase) {
            return Vec::new();
        }
        let units = &self.chunks[&c].1;
        if self.cursor == 0 {
            self.buckets.clear();
            self.bucket = None;
            if self.aligned {
                for &bytes in units.iter().flatten() {
                    let g = Self::dispatch(b, plan, st, bytes, &[]);
                    self.buckets.push(g);
                }
            }
        }
        let opens = units.get(self.cursor).copied().flatten();
        self.cursor = if self.cursor + 1 >= units.len() { 0 } else { self.cursor + 1 };
        if let Some(bytes) = opens {
            self.bucket = Some(self.bucket.map_or(0, |k| k + 1));
            if !self.aligned {
                let g = Self::dispatch(b, plan, st, bytes, &self.release);
                self.buckets.push(g);
                self.opened = true;
            }
        }
        self.bucket.and_then(|k| self.buckets.get(k)).cloned().unwrap_or_default()
    }

    /// The unit whose first compute task (device 0's; device x's is x later) is `first` waits
    /// for `gathers`; the unit that opened a bucket releases the next bucket's dispatch.
    pub(super) fn after(&mut self, b: &mut Builder, gathers: &[[u32; 2]], first: u32) {
        for (x, pair) in gathers.iter().enumerate() {
            for &g in pair.iter().filter(|&&g| g != NONE) {
                b.p.deps.push((g, first + x as u32));
            }
        }
        if self.opened {
            self.release = (0..gathers.len() as u32).map(|x| first + x).collect();
        }
    }
}
