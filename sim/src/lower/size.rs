//! How large a lowered [`Program`](super::Program) would be, computed from the plan without
//! building it, so that a plan too large to simulate is refused with its estimate before
//! memory runs out (one task costs the lowering and the engine about [`BYTES_PER_TASK`]).
//!
//! The estimate follows the lowering's structure: every simulated device runs, per unit
//! (micro-batch or token slice), each layer's ops forward, backward and (with recomputation)
//! forward again, plus per-layer parameter gathers, activation copies and gradient buckets;
//! the pipeline adds sends per stage boundary; ZeRO 1-2 gather the updated parameters in
//! `bucket_bytes` buckets, at most two tasks per device (the equal buckets are one task of
//! that many calls, `Collective::calls`). It overestimates rather than under (within about 2x of the real
//! count on the repository's experiments).

use crate::plan::{Recompute, Tier, TokenSlices};
use crate::scenario::Scenario;
use crate::workload::LayerShape;

/// The largest program trainsim builds: about 2.2 GB at [`BYTES_PER_TASK`], and up to about
/// twice that while its vectors grow (a fuzzed capacity search near the limit failed to
/// allocate under a 4 GiB address-space limit; the fuzzer allows 8 GiB).
pub const MAX_TASKS: u64 = 40_000_000;

/// Memory per task of the lowering and the engine together (the GPT-3 175B example: 6.1 M
/// tasks in 336 MB peak resident memory).
pub const BYTES_PER_TASK: u64 = 56;

/// The estimate, by what drives it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ProgramSize {
    /// Devices lowered (one data-parallel replica under symmetry).
    pub simulated_devices: u64,
    /// Units (micro-batches or token slices) each replica pipelines.
    pub units: u64,
    /// Tasks of the pipeline (layers x units x devices).
    pub pipeline_tasks: u64,
    /// Tasks of the bucketed parameter gathers after the optimizer step (ZeRO 1-2).
    pub bucket_tasks: u64,
}

impl ProgramSize {
    pub fn tasks(&self) -> u64 {
        self.pipeline_tasks.saturating_add(self.bucket_tasks)
    }

    /// Whether it exceeds [`MAX_TASKS`].
    pub fn too_large(&self) -> bool {
        self.tasks() > MAX_TASKS
    }

    /// Why it is too large and which key to change.
    pub fn explain(&self) -> (&'static str, String) {
        let gb = self.tasks() as f64 * BYTES_PER_TASK as f64 / 1e9;
        let head = format!(
            "the plan lowers to about {:.3e} tasks (about {gb:.0} GB; the limit is {MAX_TASKS} tasks)",
            self.tasks() as f64
        );
        (
            "training.micro_batch",
            format!(
                "{head}: {} simulated devices x {} micro-batches (or token slices) per replica; raise training.micro_batch, lower training.global_batch, use fewer layers or keep simulation.symmetry on",
                self.simulated_devices, self.units
            ),
        )
    }
}

/// Units each replica pipelines, without building them (see `Plan::units`). With `auto`
/// token slicing, the fewest the optimiser can choose (one whole sequence each): the slices it
/// does choose are sized again, exactly, before they are lowered.
fn units(s: &Scenario) -> u64 {
    let plan = &s.plan;
    match &plan.token_slices {
        None => plan.micro_batches as u64,
        Some(TokenSlices::Explicit(subs)) => subs.iter().map(|sb| sb.slices.len() as u64).sum(),
        Some(TokenSlices::Auto { .. }) => (s.training.global_batch / plan.dp.max(1)) as u64,
    }
}

/// The size of the program `lower` would build for `s`, with `micro_batches` units per
/// replica instead of the plan's when given (policies that try other micro-batch sizes).
pub fn estimate(s: &Scenario, micro_batches: Option<u32>) -> ProgramSize {
    let plan = &s.plan;
    let (dp, pp) = (plan.replicas() as u64, plan.pp as u64);
    let replicas = if super::simulates_one_replica(s) { 1 } else { dp };
    // Tensor ranks lowered per group.
    let tp = if super::simulates_one_tensor_rank(s) { 1 } else { plan.tp as u64 };
    let units = micro_batches.map_or_else(|| units(s), u64::from);
    let w = &s.workload.transformer;
    let passes: u64 = if plan.recompute == Recompute::None { 2 } else { 3 };
    // Ops per unit on one replica's devices, all layers and the edges together.
    let ops_per_unit: u64 = match &s.workload.net {
        Some(net) => {
            net.layers.iter().map(|l| l.layer_ops(plan.micro_batch, 2.0).len() as u64).sum::<u64>() * passes * tp
        }
        None => {
            let shape = LayerShape { activation_bytes: 2.0, ..plan.layer_shape() };
            let layer = w.layer_ops(shape).len() as u64;
            let edges = (w.embedding_ops(shape).len()
                + w.head_ops(shape).len()
                + w.metric_ops(shape, &plan.framework.train_metrics).len()) as u64;
            (layer * passes * w.layers as u64 + 2 * edges) * tp
        }
    };
    // Per layer and unit: parameter gathers (ZeRO-3, Gemini), activation copies, a gradient
    // bucket (two under expert parallelism); per stage boundary: sends and their receives.
    let gathers = plan.zero_stage >= 3 || plan.offload.dynamic.is_some() || plan.offload.params != Tier::Device;
    let per_layer_extra: u64 = 1
        + if gathers { 3 } else { 0 }
        + if plan.offload.activations != Tier::Device { 2 } else { 0 }
        + if plan.ep > 1 { 1 } else { 0 };
    let per_unit = ops_per_unit + (per_layer_extra * w.layers as u64 + 4 * pp * plan.virtual_stages as u64) * tp;
    let pipeline_tasks = replicas.saturating_mul(units).saturating_mul(per_unit);
    let bucket_tasks = if (1..3).contains(&plan.zero_stage) && plan.sync_degree() > 1 {
        let (wb, _, _) = crate::cost::memory::bytes_per_parameter(plan.precision, plan.optimizer, plan.master_weights);
        let per_device = s.workload.parameters() * wb / (pp * plan.tp as u64) as f64;
        let buckets = if per_device > plan.bucket_bytes { 2 } else { 1 };
        (replicas * pp * tp).saturating_mul(buckets)
    } else {
        0
    };
    ProgramSize { simulated_devices: replicas * pp * tp, units, pipeline_tasks, bucket_tasks }
}
