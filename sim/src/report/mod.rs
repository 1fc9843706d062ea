//! The report: the numbers a user asks for, from a run. Its JSON form is the public
//! contract documented in `docs/report.md`; keys carry their units.

pub mod breakdown;
pub mod memory;
pub mod perfetto;
pub mod timeline;
pub mod trace;
pub mod trace_filter;

use crate::engine::RunResult;
use crate::lower::Program;
use crate::scenario::Scenario;
use serde::Serialize;
use timeline::MemoryBreakdown;

#[derive(Clone, Debug, Serialize)]
pub struct StageReport {
    pub stage: u32,
    /// A representative device of the stage.
    pub device: u32,
    pub layers: u32,
    /// Time the device's compute stream was busy in one iteration (within `[0, iteration_s]`).
    pub compute_busy_s: f64,
    /// Time it waited in the pipeline (0 without pipeline parallelism).
    pub bubble_s: f64,
    pub peak_memory_bytes: f64,
}

/// TeraPipe's token slicing: the slices chosen and what they bought.
#[derive(Clone, Debug, Serialize)]
pub struct TokenSlicing {
    /// [sub-batch size, [tokens of each slice]] per sub-batch.
    pub slices: Vec<(u32, Vec<u32>)>,
    /// The same plan pipelining whole micro-batches instead.
    pub iteration_s_without: f64,
    pub speedup: f64,
    /// The optimiser's objective at its optimum (per pipeline, its own cost estimate: every
    /// stage charged the slowest one's time, so above the simulated time when stages differ),
    /// if it chose (absent for slices the scenario gave).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub estimated_latency_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub t_max_s: Option<f64>,
}

/// At most this many [`LiveActivation`]s are listed (the largest); the rest are summed in
/// [`Report::peak_activations_omitted`], so that a GPipe run of thousands of micro-batches
/// does not write a report of megabytes.
pub const MAX_LISTED_ACTIVATIONS: usize = 256;

/// The live activations at the peak that are not listed: how many entries, how many bytes.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct OmittedActivations {
    pub entries: u64,
    pub bytes: f64,
}

/// Activations live at the peak, for one layer and micro-batch.
#[derive(Clone, Debug, Serialize)]
pub struct LiveActivation {
    /// Transformer layer; -1 the embedding, -2 the head (the output layer, the loss and the trainer's metrics), -3 the optimizer step's temporaries.
    pub layer: i32,
    /// Whose activations; absent for the optimizer step's temporaries, which belong to none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub micro_batch: Option<u32>,
    pub bytes: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct PlanSummary {
    pub dp: u32,
    pub tp: u32,
    pub pp: u32,
    pub ep: u32,
    pub cp: u32,
    pub schedule: &'static str,
    pub virtual_stages: u32,
    pub micro_batches: u32,
    pub micro_batch: u32,
    pub recompute: crate::plan::Recompute,
    /// What selective recomputation reruns (only with `recompute` selective).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recompute_modules: Option<crate::plan::RecomputeModules>,
    /// Layers of each model chunk that recompute (only where part of them do).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recompute_layers: Option<u32>,
    pub zero_stage: u8,
    /// Data-parallel ranks one ZeRO shard spans (only under hybrid sharding).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dp_shard: Option<u32>,
    pub partition: Vec<u32>,
}

/// The result of simulating one iteration.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub name: String,
    pub workload: String,
    pub parameters: f64,
    /// A mixture-of-experts model's parameters one token uses (absent for dense models).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub active_parameters: Option<f64>,
    pub cluster: String,
    pub device: String,
    pub iteration_s: f64,
    pub samples_per_s: f64,
    pub tokens_per_s: f64,
    /// `tokens_per_s` over the devices.
    pub tokens_per_s_per_device: f64,
    pub model_flops_per_iteration: f64,
    /// Achieved model FLOP/s per device.
    pub model_flops_per_s_per_device: f64,
    pub mfu: f64,
    /// FLOPs the devices run per iteration: the model FLOPs plus the recomputed forward ops.
    pub hardware_flops_per_iteration: f64,
    /// Achieved hardware FLOP/s per device, and its share of the peak (equal to MFU without
    /// recomputation).
    pub hardware_flops_per_s_per_device: f64,
    pub hfu: f64,
    /// The least time the model FLOPs could take: `model_flops_per_iteration` over the
    /// cluster's summed peak at the training precision (the iteration at MFU 1). Every
    /// report's `iteration_s` is at least this.
    pub compute_lower_bound_s: f64,
    /// FLOPs the network's forward and backward run per iteration (for CNNs far more than
    /// 6 x parameters x samples), and the utilisation they give.
    pub network_flops_per_iteration: f64,
    pub network_flops_utilization: f64,
    /// Share of the iteration the average device's compute stream waits in the pipeline (0
    /// with `pp` = 1: there is no pipeline to wait in).
    pub bubble_fraction: f64,
    /// Share of the iteration the average device's compute stream is idle for any reason
    /// (the pipeline, communication, copies to and from the host).
    pub compute_idle_fraction: f64,
    pub fits: bool,
    pub peak_memory_bytes: f64,
    /// The memory of the device with the peak (`peak_memory_device`).
    pub memory_capacity_bytes: f64,
    /// Memory kept free for the allocator on that device (`simulation.memory_headroom`):
    /// a plan fits when its peak is at most `memory_capacity_bytes - memory_headroom_bytes`.
    pub memory_headroom_bytes: f64,
    /// The fullest memory tier: the largest of each device's peak over its usable bytes and
    /// each node's host and NVMe use over their capacity (infinite when Gemini finds no room
    /// for a unit's chunks). The plan fits when it is at most 1. Not printed: `fits`,
    /// `peak_memory_bytes` and the capacities say the same to a reader; capacity searches
    /// interpolate on it.
    #[serde(skip)]
    pub memory_pressure: f64,
    pub peak_memory_device: u32,
    /// The breakdown's buffers include this allowance for the framework (CUDA context,
    /// library workspaces); set it with `simulation.framework_overhead_bytes`.
    pub framework_overhead_bytes: f64,
    /// The breakdown's buffers also hold the peak device's NCCL communicator buffers: each
    /// connection's protocol buffers on every channel of the algorithms its collectives use,
    /// NVLS's, all-to-all's and pipeline sends' (`hardware::nccl_memory`; 0 off NVIDIA GPUs).
    /// Outside the framework's caching allocator: `nvidia-smi` counts them,
    /// `torch.cuda.memory_reserved` does not.
    pub nccl_buffer_bytes: f64,
    /// Host time to issue one kernel on the (first class of) device; see
    /// `simulation.host_op_s`.
    pub host_op_s: f64,
    pub memory_breakdown: MemoryBreakdown,
    /// The activations behind the peak device's peak, by layer and micro-batch: the largest
    /// [`MAX_LISTED_ACTIVATIONS`], in layer then micro-batch order.
    pub peak_activations: Vec<LiveActivation>,
    /// The entries beyond [`MAX_LISTED_ACTIVATIONS`], summed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_activations_omitted: Option<OmittedActivations>,
    /// Whether every device's HBM peak fits.
    pub fits_hbm: bool,
    /// Host DRAM the busiest node needs for offloaded states, and what it has.
    pub host_memory_bytes: f64,
    pub host_capacity_bytes: f64,
    pub fits_host: bool,
    /// NVMe the busiest node needs, and what it has.
    pub nvme_bytes: f64,
    pub nvme_capacity_bytes: f64,
    pub fits_nvme: bool,
    /// What one device keeps in host DRAM, by kind.
    pub host_memory_breakdown: MemoryBreakdown,
    pub devices: u32,
    pub simulated_devices: u32,
    /// Some devices simulated and mirrored onto the rest: one data-parallel replica (exact
    /// when every node holds one replica's devices only) and/or one tensor rank per group
    /// (exact when its peers share no link it does not mirror; `lower::simulates_one_tensor_rank`).
    pub symmetric: bool,
    pub events: u64,
    pub flows: u64,
    pub tasks: u64,
    pub stages: Vec<StageReport>,
    /// Where the time goes: the critical device, then each device class (device model and
    /// pipeline stage); each entry's parts add up to `iteration_s`.
    pub time_breakdown: Vec<breakdown::DeviceTime>,
    pub plan: PlanSummary,
    pub defaults_applied: Vec<String>,
    /// What to know about how this scenario was simulated (see `Scenario::notes`).
    pub notes: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_slicing: Option<TokenSlicing>,
    /// Gemini's chunk placement per pipeline stage, when the plan's offload policy is dynamic.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub chunk_placement: Vec<crate::lower::ChunkPlacement>,
}

/// The largest [`MAX_LISTED_ACTIVATIONS`] of the live `(tag, micro-batch, bytes)` entries, in
/// their order, and the rest summed.
fn listed_activations(live: &[(u32, u32, f64)]) -> (Vec<LiveActivation>, Option<OmittedActivations>) {
    let mut order: Vec<usize> = (0..live.len()).collect();
    let mut omitted = None;
    if live.len() > MAX_LISTED_ACTIVATIONS {
        // Largest first, ties in list order; the kept ones go back to list order.
        order.sort_by(|&a, &b| live[b].2.total_cmp(&live[a].2).then(a.cmp(&b)));
        let rest = order.split_off(MAX_LISTED_ACTIVATIONS);
        omitted = Some(OmittedActivations { entries: rest.len() as u64, bytes: rest.iter().map(|&i| live[i].2).sum() });
        order.sort_unstable();
    }
    let listed = order
        .into_iter()
        .map(|i| {
            let (tag, mb, bytes) = live[i];
            LiveActivation {
                layer: crate::lower::tag_layer(tag),
                micro_batch: (mb != crate::lower::NONE).then_some(mb),
                bytes,
            }
        })
        .collect();
    (listed, omitted)
}

pub fn build(s: &Scenario, p: &Program, r: &RunResult) -> Report {
    let plan = &s.plan;
    let iteration_s = r.iteration_ns as f64 * 1e-9;
    let devices = plan.devices();
    let model_flops = s.training.global_batch as f64 * s.workload.trained_flops_per_sample(plan.seq_len, &plan.frozen);
    let network_flops = s.training.global_batch as f64 * s.workload.network_flops_per_sample(plan.seq_len);
    // Peak of the whole cluster (devices may differ).
    let cluster_peak: f64 = (0..devices).map(|d| s.cluster.device_of(d).peak_flops.at(plan.precision)).sum();
    let samples_per_s = s.training.global_batch as f64 / iteration_s;
    let nd = p.devices.len();
    // Recomputed forward ops, over the simulated devices and scaled to the cluster.
    let recompute_flops = r.recompute_flops * devices as f64 / nd.max(1) as f64;
    let hardware_flops = model_flops + recompute_flops;
    // Bubble: idle time of each compute stream until the last device ends its pipeline part
    // (before gradient sync and optimizer), averaged over devices.
    // Without pipeline parallelism nothing waits in a pipeline: a single stage's idle time is
    // communication or host copies (`compute_idle_fraction`).
    let pipeline_end = r.pipeline_end_ns.iter().copied().max().unwrap_or(0);
    let bubble_ns: Vec<f64> = (0..nd)
        .map(|d| if plan.pp > 1 { pipeline_end.saturating_sub(r.pipeline_busy_ns[d]) as f64 } else { 0.0 })
        .collect();
    let bubble_fraction = bubble_ns.iter().sum::<f64>() / nd as f64 / r.iteration_ns.max(1) as f64;
    let idle_ns: f64 = (0..nd).map(|d| r.iteration_ns.saturating_sub(r.compute_busy_ns[d]) as f64).sum();
    let compute_idle_fraction = idle_ns / nd.max(1) as f64 / r.iteration_ns.max(1) as f64;
    let totals: Vec<MemoryBreakdown> = (0..nd)
        .map(|d| MemoryBreakdown {
            activations: r.peak_activations[d],
            // The engine's dynamic buffer bytes are model chunks moving in and out (Gemini).
            weights: p.static_memory[d].weights + r.peak_buffers[d],
            ..p.static_memory[d]
        })
        .collect();
    let worst = (0..nd).max_by(|&a, &b| totals[a].total().total_cmp(&totals[b].total()).then(b.cmp(&a))).unwrap_or(0);
    // The capacity of the device with the peak (device overrides may give it another memory).
    let peak_device = s.cluster.device_of(p.devices[worst]);
    let capacity = peak_device.hbm_bytes;
    // Each device's memory less the allocator's headroom; Gemini fails when a unit's chunks
    // find no room beside its non-model memory.
    let usable: Vec<f64> = (0..nd).map(|d| s.options.usable_bytes(s.cluster.device_of(p.devices[d]))).collect();
    let fits_hbm = (0..nd).all(|d| totals[d].total() <= usable[d]) && p.chunk_placement.iter().all(|c| c.feasible);
    let hbm_pressure = (0..nd).map(|d| totals[d].total() / usable[d].max(1.0)).fold(0.0, f64::max);
    // Host and NVMe are per node: the node's devices' shares add up.
    let per_node = s.cluster.node.devices as f64;
    let host_worst = p.host_memory.iter().copied().max_by(|a, b| a.total().total_cmp(&b.total())).unwrap_or_default();
    let host_node = host_worst.total() * per_node;
    let nvme_node = p.nvme_bytes.iter().copied().fold(0.0, f64::max) * per_node;
    let fits_host = host_node <= s.cluster.node.host.dram_bytes;
    let fits_nvme = nvme_node <= s.cluster.node.host.nvme_bytes;
    let starts = plan.chunk_starts();
    let stages = (0..plan.pp)
        .map(|stage| {
            let d = (0..nd).find(|&d| p.stages[d] == stage).unwrap_or(0);
            let layers = (0..plan.chunks())
                .filter(|c| c % plan.pp == stage)
                .map(|c| starts[c as usize + 1] - starts[c as usize])
                .sum();
            StageReport {
                stage,
                device: p.devices[d],
                layers,
                compute_busy_s: r.compute_busy_ns[d] as f64 * 1e-9,
                bubble_s: bubble_ns[d] * 1e-9,
                peak_memory_bytes: totals[d].total(),
            }
        })
        .collect();
    let (peak_activations, peak_activations_omitted) = listed_activations(&r.peak_live[worst]);
    Report {
        name: s.name.clone(),
        workload: s.workload.name.clone(),
        parameters: s.workload.parameters(),
        active_parameters: s.workload.transformer.moe.is_some().then(|| s.workload.transformer.active_parameters()),
        cluster: format!("{} x {}", s.cluster.nodes, s.cluster.node.name),
        device: s.cluster.node.device.name.clone(),
        iteration_s,
        samples_per_s,
        tokens_per_s: samples_per_s * plan.seq_len as f64,
        tokens_per_s_per_device: samples_per_s * plan.seq_len as f64 / devices as f64,
        model_flops_per_iteration: model_flops,
        model_flops_per_s_per_device: model_flops / iteration_s / devices as f64,
        mfu: model_flops / iteration_s / cluster_peak,
        hardware_flops_per_iteration: hardware_flops,
        hardware_flops_per_s_per_device: hardware_flops / iteration_s / devices as f64,
        hfu: hardware_flops / iteration_s / cluster_peak,
        compute_lower_bound_s: model_flops / cluster_peak,
        network_flops_per_iteration: network_flops,
        network_flops_utilization: network_flops / iteration_s / cluster_peak,
        bubble_fraction,
        compute_idle_fraction,
        fits: fits_hbm && fits_host && fits_nvme,
        fits_hbm,
        host_memory_bytes: host_node,
        host_capacity_bytes: s.cluster.node.host.dram_bytes,
        fits_host,
        nvme_bytes: nvme_node,
        nvme_capacity_bytes: s.cluster.node.host.nvme_bytes,
        fits_nvme,
        host_memory_breakdown: host_worst,
        peak_memory_bytes: totals[worst].total(),
        memory_capacity_bytes: capacity,
        memory_headroom_bytes: capacity - s.options.usable_bytes(peak_device),
        memory_pressure: if p.chunk_placement.iter().all(|c| c.feasible) {
            hbm_pressure
                .max(host_node / s.cluster.node.host.dram_bytes.max(1.0))
                .max(nvme_node / s.cluster.node.host.nvme_bytes.max(1.0))
        } else {
            f64::INFINITY
        },
        peak_memory_device: p.devices[worst],
        framework_overhead_bytes: s.options.framework_bytes(&s.cluster.node.device),
        nccl_buffer_bytes: r.nccl_buffer_bytes.get(worst).copied().unwrap_or(0.0),
        host_op_s: s.options.host_op_s(&s.cluster.node.device),
        memory_breakdown: totals[worst],
        peak_activations,
        peak_activations_omitted,
        devices,
        simulated_devices: nd as u32,
        symmetric: p.symmetric,
        events: r.events,
        flows: r.flows,
        tasks: p.tasks.len() as u64,
        stages,
        time_breakdown: breakdown::build(s, p, &r.time_parts_ns, &r.compute_busy_ns),
        plan: PlanSummary {
            dp: plan.dp,
            tp: plan.tp,
            pp: plan.pp,
            ep: plan.ep,
            cp: plan.cp,
            schedule: crate::plan::schedule_name(plan.schedule),
            virtual_stages: plan.virtual_stages,
            micro_batches: plan.micro_batches,
            micro_batch: plan.micro_batch,
            recompute: plan.recompute,
            recompute_modules: (plan.recompute == crate::plan::Recompute::Selective).then_some(plan.recompute_modules),
            recompute_layers: plan.recompute_layers,
            zero_stage: plan.zero_stage,
            dp_shard: plan.dp_shard,
            partition: plan.partition.clone(),
        },
        defaults_applied: s.defaults_applied.clone(),
        notes: s.notes.clone(),
        token_slicing: None,
        chunk_placement: p.chunk_placement.clone(),
    }
}

impl Report {
    /// The physical bounds every report keeps: numbers finite, `0 < mfu <= 1`, the iteration
    /// no shorter than [`Report::compute_lower_bound_s`], per-stage times within the
    /// iteration, fractions within `[0, 1]`. `Err` names the first one broken.
    pub fn check_invariants(&self) -> Result<(), String> {
        let tolerance = 1e-9;
        let finite = [
            ("iteration_s", self.iteration_s),
            ("samples_per_s", self.samples_per_s),
            ("tokens_per_s", self.tokens_per_s),
            ("model_flops_per_iteration", self.model_flops_per_iteration),
            ("model_flops_per_s_per_device", self.model_flops_per_s_per_device),
            ("mfu", self.mfu),
            ("hfu", self.hfu),
            ("hardware_flops_per_iteration", self.hardware_flops_per_iteration),
            ("tokens_per_s_per_device", self.tokens_per_s_per_device),
            ("compute_lower_bound_s", self.compute_lower_bound_s),
            ("network_flops_per_iteration", self.network_flops_per_iteration),
            ("network_flops_utilization", self.network_flops_utilization),
            ("bubble_fraction", self.bubble_fraction),
            ("compute_idle_fraction", self.compute_idle_fraction),
            ("peak_memory_bytes", self.peak_memory_bytes),
            ("host_memory_bytes", self.host_memory_bytes),
            ("nvme_bytes", self.nvme_bytes),
        ];
        if let Some((k, v)) = finite.iter().find(|(_, v)| !v.is_finite()) {
            return Err(format!("{k} is {v}"));
        }
        if self.iteration_s <= 0.0 {
            return Err(format!("iteration_s {} is not positive", self.iteration_s));
        }
        if !(self.mfu > 0.0 && self.mfu <= 1.0 + tolerance) {
            return Err(format!("mfu {} is outside (0, 1]", self.mfu));
        }
        if self.iteration_s < self.compute_lower_bound_s * (1.0 - tolerance) {
            return Err(format!(
                "iteration_s {} is shorter than the compute lower bound {}",
                self.iteration_s, self.compute_lower_bound_s
            ));
        }
        for (k, v) in [("bubble_fraction", self.bubble_fraction), ("compute_idle_fraction", self.compute_idle_fraction)]
        {
            if !(0.0..=1.0).contains(&v) {
                return Err(format!("{k} {v} is outside [0, 1]"));
            }
        }
        let within = |x: f64| x.is_finite() && x >= 0.0 && x <= self.iteration_s * (1.0 + tolerance);
        for st in &self.stages {
            if !within(st.compute_busy_s) || !within(st.bubble_s) {
                return Err(format!(
                    "stage {}: compute_busy_s {} or bubble_s {} is outside [0, iteration_s = {}]",
                    st.stage, st.compute_busy_s, st.bubble_s, self.iteration_s
                ));
            }
        }
        if self.hfu < self.mfu * (1.0 - tolerance) {
            return Err(format!("hfu {} is below mfu {}", self.hfu, self.mfu));
        }
        // Each device's parts add up to the iteration (to 1 ns per part, for rounding).
        for t in &self.time_breakdown {
            if let Some((k, v)) = t.parts().into_iter().find(|&(_, v)| !within(v)) {
                return Err(format!(
                    "time_breakdown (stage {}, device {}): {k} {v} is outside [0, iteration_s = {}]",
                    t.stage, t.device, self.iteration_s
                ));
            }
            let total = t.total_s();
            if (total - self.iteration_s).abs() > 1e-6 * self.iteration_s + 13e-9 {
                return Err(format!(
                    "time_breakdown (stage {}, device {}): the parts add up to {total} s, not the iteration's {} s",
                    t.stage, t.device, self.iteration_s
                ));
            }
        }
        Ok(())
    }
}
