//! What the passes share: sizes derived once from the plan ([`Lowering`]) and the stage being
//! lowered ([`Stage`]).

use super::blocks::{self, UnitBlocks};
use super::builder::{Builder, StepCtx};
use super::program::Program;
use crate::cost::memory::bytes_per_parameter;
use crate::plan::{Dynamic, Plan, Tier};
use crate::report::timeline::StreamKind;
use crate::scenario::Scenario;
use crate::schedule::{self, Pass, ScheduleShape, Step};
use crate::workload::{OpClass, OpSpec, Saved};

/// The scenario and everything derived from it that every stage's lowering reads.
pub(super) struct Lowering<'s> {
    pub(super) s: &'s Scenario,
    pub(super) plan: &'s Plan,
    /// Tensor-parallel degree.
    pub(super) t: u32,
    /// Tensor ranks lowered per group (`Builder::ranks`): `t`, or 1 under tensor symmetry.
    pub(super) ranks: u32,
    /// The pipeline's units: micro-batches, or token slices of sub-batches (TeraPipe).
    pub(super) m: u32,
    /// Model chunks (stages times virtual stages) and the first layer of each (and one past
    /// the last).
    pub(super) chunks: u32,
    pub(super) starts: Vec<u32>,
    /// The replicas lowered: all, or replica 0 under symmetry.
    pub(super) replicas: Vec<u32>,
    /// Blocks per unit shape and device class; the shape of each unit.
    pub(super) unit_blocks: Vec<Vec<UnitBlocks>>,
    pub(super) block_of: Vec<usize>,
    /// Largest activation on any stage boundary.
    pub(super) max_boundary: f64,
    /// Whether a prefix of layers is frozen (`plan.frozen`).
    pub(super) frozen: bool,
    /// A zero-cost marker op that stands for "the cached prefix output is here".
    pub(super) cache_op: u32,
    pub(super) sched_shape: ScheduleShape,
    /// Parameters of each layer on one device.
    pub(super) lp: Vec<f64>,
    /// Of those, the routed experts' (split over `plan.ep` replicas; reduced and sharded by
    /// ZeRO over the `dp / ep` replicas holding the same experts).
    pub(super) lp_expert: Vec<f64>,
    /// Whether the embedding and head are units of their own (a transformer, not a net).
    pub(super) edges: bool,
    /// Parameters on one device of the embedding (without a separate head matrix) and of
    /// the output layer on the last chunk.
    pub(super) first_params: f64,
    pub(super) last_params: f64,
    /// Bytes per parameter of weights, gradients and optimizer states.
    pub(super) wb: f64,
    pub(super) gb: f64,
    pub(super) ob: f64,
    /// The data-parallel (gradient synchronisation) degree.
    pub(super) sync: u32,
    pub(super) dp: f64,
    /// Optimizer step on the host; parameters kept off the device.
    pub(super) host_opt: bool,
    pub(super) host_params: bool,
    /// The ZeRO stage in effect: without data parallelism ZeRO shards nothing, except that
    /// offloaded parameters are still fetched layer by layer (ZeRO-Infinity on one GPU).
    pub(super) z: u8,
    /// ZeRO-3: parameters are all-gathered before every use (FSDP, one unit per layer).
    pub(super) z3: bool,
    /// Gemini's dynamic chunk placement (`plan.offload.dynamic`).
    pub(super) dynamic: Option<Dynamic>,
    /// Parameters are fetched or gathered before every use of a unit (ZeRO-3 or Gemini).
    pub(super) per_unit: bool,
    /// ZeRO-3 gathers and reduces each parameter tensor on its own, with a copy per rank
    /// (`framework.gather_per_tensor`; transformers, not Gemini).
    pub(super) per_tensor: bool,
}

impl<'s> Lowering<'s> {
    /// Creates every block's ops (first, in unit order), then the frozen-cache marker op.
    pub(super) fn new(b: &mut Builder, s: &'s Scenario) -> Lowering<'s> {
        let plan = &s.plan;
        let w = &s.workload.transformer;
        // Units of one shape share their blocks.
        let units = plan.units();
        let (unit_blocks, block_of) = blocks::unit_blocks(b, s, &units);
        b.layer_labels = vec![Vec::new(); w.layers as usize];

        let chunks = plan.chunks();
        let m = units.len() as u32;
        let max_boundary = unit_blocks.iter().flatten().flat_map(|u| u.boundary.iter().copied()).fold(0.0, f64::max);
        let cache_op = b.op(
            &OpSpec {
                name: "frozen_cache_ready",
                class: OpClass::Memory,
                forward_flops: 0.0,
                forward_bytes: 0.0,
                backward_flops: 0.0,
                backward_bytes: 0.0,
                saved: Saved::default(),
            },
            false,
        );
        let t = plan.tp;
        let (wb, gb, ob) = bytes_per_parameter(plan.precision, plan.optimizer, plan.master_weights);
        let tf = if plan.ring() { 1.0 } else { t as f64 };
        let shards = plan.tp_mode.weight_shards(t) as f64;
        let ep = plan.ep as f64;
        let lp_expert: Vec<f64> = match &s.workload.net {
            Some(net) => vec![0.0; net.layers.len()],
            None if plan.ep > 1 => (0..w.layers).map(|l| w.routed_expert_parameters_at(l) / ep / shards).collect(),
            None => vec![0.0; w.layers as usize],
        };
        let lp: Vec<f64> = match &s.workload.net {
            Some(net) => net.layers.iter().map(|l| l.parameters()).collect(),
            None if plan.ep > 1 => (0..w.layers)
                .map(|l| (w.layer_parameters_at(l) - w.routed_expert_parameters_at(l)) / shards + lp_expert[l as usize])
                .collect(),
            None => (0..w.layers).map(|l| w.layer_parameters_at(l) / shards).collect(),
        };
        let edges = s.workload.net.is_none();
        let vocab_params = w.head_classes() * w.hidden as f64 / tf;
        let first_params = if edges { w.embedding_parameters_without_head() / plan.embedding_shards() } else { 0.0 };
        // The output layer: its own matrix, or (tied) a copy of the embedding on the last
        // stage; with one chunk, the tied head is the embedding itself.
        let last_params = if !edges || (w.tied_embeddings && chunks == 1) { 0.0 } else { vocab_params };
        let sync = plan.sync_degree();
        let off = plan.offload;
        let host_params = off.params != Tier::Device;
        let z = if sync > 1 || host_params { plan.zero_stage } else { 0 };
        Lowering {
            s,
            plan,
            t,
            ranks: b.ranks,
            m,
            chunks,
            starts: plan.chunk_starts(),
            replicas: if b.one_replica { vec![0] } else { (0..plan.replicas()).collect() },
            unit_blocks,
            block_of,
            max_boundary,
            frozen: plan.frozen.layers > 0,
            cache_op,
            sched_shape: ScheduleShape { stages: plan.pp, micro_batches: m, virtual_stages: plan.virtual_stages },
            lp,
            lp_expert,
            edges,
            first_params,
            last_params,
            wb,
            gb,
            ob,
            sync,
            dp: plan.shard_degree() as f64,
            host_opt: off.optimizer != Tier::Device,
            host_params,
            z,
            z3: z >= 3,
            dynamic: off.dynamic,
            per_unit: z >= 3 || off.dynamic.is_some(),
            per_tensor: z >= 3 && plan.framework.gather_per_tensor && off.dynamic.is_none() && s.workload.net.is_none(),
        }
    }

    /// What ZeRO divides a model state by: the data-parallel degree from `stage_at_least` on
    /// (1: optimizer states, 2: gradients, 3: parameters).
    pub(super) fn shard(&self, stage_at_least: u8) -> f64 {
        if self.z >= stage_at_least { self.dp } else { 1.0 }
    }

    /// What ZeRO divides the routed experts' states by from `stage_at_least` on: the replicas
    /// holding the same experts (`dp x cp / ep`).
    pub(super) fn expert_shard(&self, stage_at_least: u8) -> f64 {
        if self.z >= stage_at_least { self.dp / self.plan.ep as f64 } else { 1.0 }
    }

    /// A stage's parameters on one device after ZeRO's sharding from `stage_at_least` on:
    /// the routed experts over `dp / ep` replicas, the rest over `dp`.
    pub(super) fn sharded(&self, st: &Stage, stage_at_least: u8) -> f64 {
        (st.params - st.expert_params) / self.shard(stage_at_least)
            + st.expert_params / self.expert_shard(stage_at_least)
    }

    /// [`Lowering::sharded`] in bytes at `per` bytes per parameter.
    pub(super) fn sharded_bytes(&self, st: &Stage, stage_at_least: u8, per: f64) -> f64 {
        if st.expert_params == 0.0 {
            return st.params * per / self.shard(stage_at_least);
        }
        self.sharded(st, stage_at_least) * per
    }

    /// Parameters on one device of chunk `c`'s routed experts.
    pub(super) fn chunk_expert_params(&self, c: u32) -> f64 {
        (self.starts[c as usize]..self.starts[c as usize + 1]).map(|l| self.lp_expert[l as usize]).sum()
    }

    /// Parameters on one device of chunk `c`'s layers (and its embedding or head).
    pub(super) fn chunk_params(&self, c: u32) -> f64 {
        let mut p: f64 = (self.starts[c as usize]..self.starts[c as usize + 1]).map(|l| self.lp[l as usize]).sum();
        if c == 0 && !self.frozen {
            p += self.first_params;
        }
        if c == self.chunks - 1 {
            p += self.last_params;
        }
        p
    }
}

/// One pipeline stage of one replica, as every pass on it sees it.
pub(super) struct Stage {
    pub(super) r: u32,
    pub(super) stage: u32,
    /// The device class of the stage's devices.
    pub(super) class: u16,
    pub(super) ctx: StepCtx,
    /// The stage's (micro-batch, chunk, pass) steps in execution order.
    pub(super) order: Vec<Step>,
    /// The chunks this stage holds, and their parameters on one device.
    pub(super) my_chunks: Vec<u32>,
    pub(super) params: f64,
    /// Of those, the routed experts' ([`Lowering::lp_expert`]).
    pub(super) expert_params: f64,
}

/// Compute units (SMs) Transformer Engine's pipelined and bulk overlaps keep for their
/// communication kernels, taken from the GEMM (`num_sm` 16 with `set_sm_margin`:
/// transformer_engine/pytorch/module/base.py `initialize_ub` defaults, TE 1.x-2.x).
const TE_COMM_SMS: f64 = 16.0;

/// The share of a device's SMs a GEMM keeps while Transformer Engine's pipelined
/// reduce-scatter runs beside it (`TE_COMM_SMS` taken; devices without that many keep all).
pub(crate) fn tp_sm_share(compute_units: u32) -> f64 {
    let units = compute_units as f64;
    if units > TE_COMM_SMS { (units - TE_COMM_SMS) / units } else { 1.0 }
}

impl Stage {
    /// Sets the builder's device class to the stage's.
    pub(super) fn new(b: &mut Builder, lw: &Lowering, r: u32, stage: u32) -> Stage {
        let plan = lw.plan;
        let m = lw.m;
        let group: Vec<u32> = (0..lw.t).map(|x| plan.device(r, stage, x)).collect();
        let lowered = &group[..b.ranks as usize];
        let class = lw.s.cluster.class_of(group[0]);
        b.class = class;
        // The lowered ranks' communication streams of a kind, where something runs there.
        let comm_streams = |on: bool, kind: StreamKind| -> Vec<u32> {
            if !on {
                return Vec::new();
            }
            lowered.iter().map(|&d| Program::stream_index(b.dev_index[d as usize], kind)).collect()
        };
        let tp_streams = comm_streams(plan.tp_overlap(), StreamKind::TensorParallel);
        let tp_async_streams = comm_streams(plan.tp_async(), StreamKind::TensorAsync);
        let cp_streams = comm_streams(plan.cp > 1, StreamKind::TensorParallel);
        let ep_streams = comm_streams(plan.ep_overlap(), StreamKind::ExpertParallel);
        let tp_sm_share = tp_sm_share(lw.s.cluster.class(class).compute_units);
        let ctx = StepCtx {
            streams: b.compute_streams(lowered),
            dims: plan.tp_mode.dims(lw.t),
            group,
            tp_streams,
            tp_async_streams,
            tp_sm_share,
            micro_pipeline: plan.tp_overlap() && plan.framework.tp_micro_pipeline,
            summed_input_grads: plan.tp_overlap() && plan.framework.tp_micro_pipeline && !plan.fusion.projections,
            replica: r,
            stage,
            ep_group: r / plan.ep,
            ep_members: if plan.ep > 1 {
                (0..b.ranks).map(|x| plan.ep_members(r, stage, x)).collect()
            } else {
                Vec::new()
            },
            cp_group: r / plan.cp,
            cp_members: if plan.cp > 1 {
                (0..b.ranks).map(|x| plan.cp_members(r, stage, x)).collect()
            } else {
                Vec::new()
            },
            cp_streams,
            ep_streams,
        };
        let order = if plan.token_slices.is_some() {
            // TeraPipe: every slice forward in order, then backward in exact reverse (a
            // slice's backward feeds gradients into the earlier slices it attended to).
            let mut o: Vec<Step> = (0..m).map(|u| Step { micro_batch: u, chunk: stage, pass: Pass::Forward }).collect();
            o.extend((0..m).rev().map(|u| Step { micro_batch: u, chunk: stage, pass: Pass::Backward }));
            o
        } else {
            schedule::stage_order(plan.schedule, lw.sched_shape, stage).expect("schedule validated at parse")
        };
        let my_chunks: Vec<u32> = (0..lw.chunks).filter(|c| c % plan.pp == stage).collect();
        let params: f64 = my_chunks.iter().map(|&c| lw.chunk_params(c)).sum();
        let expert_params: f64 = my_chunks.iter().map(|&c| lw.chunk_expert_params(c)).sum();
        Stage { r, stage, class, ctx, order, my_chunks, params, expert_params }
    }

    /// The tensor-parallel group's devices.
    pub(super) fn group(&self) -> &[u32] {
        &self.ctx.group
    }
}
