//! Pipeline partitioning for a scenario: per-layer profiles from the workload and the cost
//! model, per-stage devices from the cluster, the partition policies (`policy::partition`,
//! `policy::freeze`'s greedy), and BaPipe's exploration over schedules and micro-batch sizes.

use crate::cost::ComputeModel;
use crate::cost::memory::bytes_per_parameter;
use crate::hardware::Topology;
use crate::plan::{PartitionPolicy, Recompute};
use crate::policy::partition::{self, LayerProfile, PartitionPlan, StageDevice, StashRule};
use crate::scenario::Scenario;
use crate::schedule::ScheduleKind;
use crate::workload::LayerOp;
use serde::Serialize;

fn ops_s(model: &ComputeModel, ops: &[LayerOp], recompute: bool) -> f64 {
    ops.iter()
        .filter_map(LayerOp::compute)
        .map(|op| {
            let f = model.op_s(op, false);
            f + model.op_s(op, true) + if recompute { f } else { 0.0 }
        })
        .sum()
}

/// Forward seconds of `ops` only (a frozen layer takes no backward).
fn forward_s(model: &ComputeModel, ops: &[LayerOp]) -> f64 {
    ops.iter().filter_map(LayerOp::compute).map(|op| model.op_s(op, false)).sum()
}

/// One profile per layer the pipeline's partition covers (the embedding folded into the
/// first, the head into the last). A frozen prefix (`plan.frozen`) is outside the partition:
/// it runs forward only on the first stage and keeps only its weights there, so its cost is
/// folded into the first active layer's profile.
pub fn layer_profiles(s: &Scenario) -> Vec<LayerProfile> {
    let mut all = all_layer_profiles(s);
    let frozen = &s.plan.frozen;
    let f = (frozen.layers as usize).min(all.len().saturating_sub(1));
    if f == 0 || s.workload.net.is_some() {
        return all;
    }
    let w = &s.workload.transformer;
    let plan = &s.plan;
    let sh = s.plan.layer_shape();
    let model =
        ComputeModel::new(&s.cluster.node.device, plan.precision, None).with_op_rates(&s.op_rates).with_fp8_plan(plan);
    let (wb, _, _) = bytes_per_parameter(plan.precision, plan.optimizer, plan.master_weights);
    let t = plan.tp_mode.weight_shards(plan.tp) as f64;
    let embed_params = w.embedding_parameters_without_head();
    // The layers frozen since the cache was written run forward; the cached ones are read back.
    let recomputed = f.saturating_sub(frozen.cached_layers as usize) as f64;
    let prefix_s = forward_s(&model, &w.embedding_ops(sh)) + recomputed * forward_s(&model, &w.layer_ops(sh));
    let prefix_weight_bytes = (embed_params / plan.embedding_shards() + f as f64 * w.layer_parameters() / t) * wb;
    // Layer `f` (f > 0) is a plain layer (or the last, with the head): add the prefix.
    let mut active = all.split_off(f);
    active[0].compute_s += prefix_s;
    active[0].weight_bytes += prefix_weight_bytes;
    active
}

fn all_layer_profiles(s: &Scenario) -> Vec<LayerProfile> {
    let w = &s.workload.transformer;
    let plan = &s.plan;
    let sh = s.plan.layer_shape();
    let model =
        ComputeModel::new(&s.cluster.node.device, plan.precision, None).with_op_rates(&s.op_rates).with_fp8_plan(plan);
    let (wb, gb, ob) = bytes_per_parameter(plan.precision, plan.optimizer, plan.master_weights);
    let per_param = wb + gb + ob;
    if let Some(net) = &s.workload.net {
        let e = sh.activation_bytes;
        return net
            .layers
            .iter()
            .map(|l| {
                let ops = l.layer_ops(plan.micro_batch, e);
                LayerProfile {
                    compute_s: ops_s(&model, &ops, plan.recompute == Recompute::Full),
                    weight_bytes: l.parameters() * per_param,
                    activation_bytes: ops
                        .iter()
                        .filter_map(LayerOp::compute)
                        .map(|o| o.saved.bytes(plan.recompute))
                        .sum(),
                    output_bytes: e * plan.micro_batch as f64 * l.output_elems,
                }
            })
            .collect();
    }
    let t = plan.tp_mode.weight_shards(plan.tp) as f64;
    // Layers of a mixture-of-experts model differ: dense ones first, then routed ones.
    let layer_s_at = |l: u32| ops_s(&model, &w.layer_ops_at(l, sh), plan.recompute == Recompute::Full);
    let routed_s = layer_s_at(w.layers.saturating_sub(1));
    let dense_s = if w.mixed_layers() { layer_s_at(0) } else { routed_s };
    let act = w.layer_activation_bytes_with(sh, plan.recompute, plan.recompute_modules);
    let output = sh.activation_bytes * sh.micro_batch as f64 * sh.seq_len as f64 * w.hidden as f64;
    let embed_s = ops_s(&model, &w.embedding_ops(sh), false);
    let head_s = ops_s(&model, &w.head_ops(sh), false);
    let head_params = if w.tied_embeddings { 0.0 } else { w.head_classes() * w.hidden as f64 };
    let embed_params = w.embedding_parameters_without_head();
    let (dense_per_param, expert_per_param) = crate::cost::memory::state_bytes_per_parameter(plan);
    let ep = plan.ep.max(1) as f64;
    let n = w.layers as usize;
    (0..n)
        .map(|i| {
            let l = i as u32;
            // Expert parallelism splits the routed experts; ZeRO shards each part's states
            // over the replicas that hold it, as the simulation does.
            let routed = w.routed_expert_parameters_at(l);
            let dense = w.layer_parameters_at(l) - routed;
            let mut p = LayerProfile {
                compute_s: if w.is_moe_layer(l) { routed_s } else { dense_s },
                weight_bytes: dense / t * dense_per_param + routed / ep / t * expert_per_param,
                activation_bytes: act,
                output_bytes: output,
            };
            if i == 0 {
                p.compute_s += embed_s;
                p.weight_bytes += embed_params / plan.embedding_shards() * dense_per_param;
            }
            if i + 1 == n {
                p.compute_s += head_s;
                // A tied head keeps its own copy of the embedding on the last stage.
                let head = if w.tied_embeddings && n > 1 { w.head_classes() * w.hidden as f64 } else { head_params };
                p.weight_bytes += head / plan.tp as f64 * dense_per_param;
            }
            p
        })
        .collect()
}

/// The stages' devices: the node's device (all equal speed), HBM less the framework
/// allowance, and the link from each stage to the next on the real topology.
pub fn stage_devices(s: &Scenario) -> Vec<StageDevice> {
    let plan = &s.plan;
    let topo = Topology::new(&s.cluster);
    let node_device = &s.cluster.node.device;
    let reference = node_device.peak_flops.at(plan.precision) * node_device.gemm_efficiency_at(plan.precision);
    (0..plan.pp)
        .map(|k| {
            // Each stage's own device: its speed relative to the node's, its memory.
            let dev = s.cluster.device_of(plan.device(0, k, 0));
            let speed = dev.peak_flops.at(plan.precision) * dev.gemm_efficiency_at(plan.precision) / reference;
            let memory = s.options.usable_bytes(dev) - s.options.framework_bytes(dev);
            let (bw, lat) = if k + 1 < plan.pp {
                let (a, b) = (plan.device(0, k, 0), plan.device(0, k + 1, 0));
                let r = topo.route(a, b);
                // The route's slowest link, and in a mesh node the pair's one link.
                let bw = r.links().iter().map(|&l| topo.capacities()[l as usize]).fold(topo.pair_cap(a, b), f64::min);
                (bw, r.latency_s)
            } else {
                (f64::INFINITY, 0.0)
            };
            StageDevice { speed, memory_bytes: memory, link_bytes_per_s: bw, link_latency_s: lat }
        })
        .collect()
}

pub fn stash_rule(kind: ScheduleKind) -> StashRule {
    match kind {
        ScheduleKind::GPipe => StashRule::GPipe,
        ScheduleKind::TwoBW => StashRule::TwoBW,
        _ => StashRule::OneFOneB,
    }
}

/// Per stage, the bytes the simulator's memory model holds beyond the partition's estimate
/// (transient buffers, the head's logits, gradient accumulation, ...): `simulated`'s peaks for
/// the partition `counts` less [`partition::evaluate`]'s memory for it, never negative.
fn memory_offsets(s: &Scenario, counts: &[u32], simulated: &crate::report::Report) -> Vec<f64> {
    let layers = layer_profiles(s);
    let devices = stage_devices(s);
    if counts.len() != devices.len() || counts.iter().map(|&c| c as usize).sum::<usize>() != layers.len() {
        return vec![0.0; devices.len()];
    }
    let (estimate, _) =
        partition::evaluate(&layers, &devices, s.plan.micro_batches, stash_rule(s.plan.schedule), counts);
    estimate
        .stages
        .iter()
        .enumerate()
        .map(|(k, st)| {
            let peak = simulated.stages.iter().find(|r| r.stage == k as u32).map_or(0.0, |r| r.peak_memory_bytes);
            (peak - st.memory_bytes).max(0.0)
        })
        .collect()
}

/// The balanced partition with each stage's memory cap lowered by `offsets` bytes.
fn balanced_counts(s: &Scenario, offsets: &[f64]) -> Result<Vec<u32>, String> {
    let plan = &s.plan;
    let layers = layer_profiles(s);
    let mut devices = stage_devices(s);
    for (d, extra) in devices.iter_mut().zip(offsets) {
        d.memory_bytes -= extra;
    }
    let p = partition::balanced(&layers, &devices, plan.micro_batches, stash_rule(plan.schedule)).ok_or_else(|| {
        format!("no partition of {} layers into {} stages fits the devices' memory", active_layers(s), plan.pp)
    })?;
    Ok(counts(&p))
}

/// The balanced partition again, its memory caps lowered by what the simulation of `counts`
/// (`simulated`, which did not fit) held beyond the partition's estimate, so that what it
/// calls fitting agrees with the simulator; `None` when that gives no other partition.
pub fn refit(s: &Scenario, counts: &[u32], simulated: &crate::report::Report) -> Option<Vec<u32>> {
    let offsets = memory_offsets(s, counts, simulated);
    balanced_counts(s, &offsets).ok().filter(|p| p != counts)
}

/// Layers per stage under the scenario's partition policy; `Err` when no partition fits.
pub fn resolve(s: &Scenario) -> Result<Vec<u32>, String> {
    let plan = &s.plan;
    match plan.partition_policy {
        None => Ok(plan.partition.clone()),
        Some(PartitionPolicy::Balanced) => balanced_counts(s, &[]),
        Some(PartitionPolicy::Explore) => {
            let mut b = s.clone();
            b.plan.partition_policy = Some(PartitionPolicy::Balanced);
            resolve(&b)
        }
        Some(PartitionPolicy::Parameters) => {
            let sizes: Vec<f64> = layer_profiles(s).iter().map(|l| l.weight_bytes).collect();
            let g = crate::policy::freeze::greedy_partition(plan.pp, &sizes, 0.0);
            if g.units.contains(&0) || g.units.len() != plan.pp as usize {
                return Err(format!("the parameter greedy left a stage empty: {:?}", g.units));
            }
            Ok(g.units)
        }
    }
}

/// The layers a pipeline partition covers: all but a frozen prefix.
pub fn active_layers(s: &Scenario) -> u32 {
    s.workload.layers() - s.plan.frozen.layers
}

pub fn counts(p: &PartitionPlan) -> Vec<u32> {
    p.stages.iter().map(|st| st.last_layer - st.first_layer + 1).collect()
}

/// One explored plan.
#[derive(Clone, Debug, Serialize)]
pub struct Candidate {
    pub schedule: &'static str,
    /// Chunks per stage (above 1 only for the interleaved schedule).
    pub virtual_stages: u32,
    pub micro_batch: u32,
    pub micro_batches: u32,
    /// Layers of each chunk, in model order (pp x virtual_stages entries): the scenario's
    /// `plan.partition`.
    pub partition: Vec<u32>,
    /// Per chunk: its layers, its time under the partition's objective, and the simulated
    /// peak memory of the device that holds it.
    pub stages: Vec<crate::policy::partition::StagePlan>,
    /// Whether the simulation fits every memory.
    pub fits: bool,
    pub iteration_s: f64,
    pub time_per_sample_s: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Exploration {
    pub best: Option<Candidate>,
    /// The simulated plans, in the order explored (schedule, then micro-batch size).
    pub candidates: Vec<Candidate>,
    /// How many plans (schedule, micro-batch size) the partition objective ranked; the
    /// `candidates` are the ones simulated.
    pub explored: usize,
    /// Plans left unsimulated because none of those simulated fit and the search for one spent
    /// its budget ([`FALLBACK_TASK_BUDGET`]); 0 otherwise.
    pub not_simulated: usize,
    /// Data parallelism over all the devices (no pipeline), if it fits; and the plan's own
    /// schedule with the uniform partition.
    /// (Absent when the baseline does not fit or cannot be formed.)
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_parallel_time_per_sample_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uniform_gpipe_time_per_sample_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speedup_vs_data_parallel: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speedup_vs_uniform_gpipe: Option<f64>,
}

/// Time per sample and whether it fits; a plan the simulator refuses (too large, past the
/// clock) counts as not fitting.
fn per_sample(s: &Scenario) -> (f64, bool) {
    match crate::try_simulate(s, false) {
        Ok(x) => (x.report.iteration_s / s.training.global_batch as f64, x.report.fits),
        Err(_) => (f64::INFINITY, false),
    }
}

/// A candidate from a scenario whose plan is fully resolved (partition policy none), and its
/// simulated report.
/// `None` when the simulator refuses the plan (too large, past the clock).
fn candidate(c: &Scenario) -> Option<(Candidate, crate::report::Report)> {
    let r = crate::try_simulate(c, false).ok()?.report;
    let plan = &c.plan;
    // The objective per chunk, each chunk on its stage's device.
    let devices = stage_devices(c);
    let chunk_devices: Vec<StageDevice> = (0..plan.chunks()).map(|k| devices[(k % plan.pp) as usize].clone()).collect();
    let (mut est, _) = partition::evaluate(
        &layer_profiles(c),
        &chunk_devices,
        plan.micro_batches,
        stash_rule(plan.schedule),
        &plan.partition,
    );
    // Memory and time as simulated: each stage's peak, and its compute time in the iteration
    // (an interleaved stage's chunks share it in proportion to the partition objective's
    // estimates, which ignore overlap and so can exceed the simulated iteration).
    let mut estimated = vec![0.0; plan.pp as usize];
    for (k, st) in est.stages.iter().enumerate() {
        estimated[k % plan.pp as usize] += st.time_s;
    }
    for (k, st) in est.stages.iter_mut().enumerate() {
        let stage = k as u32 % plan.pp;
        let sim = r.stages.iter().find(|x| x.stage == stage);
        st.memory_bytes = sim.map_or(0.0, |x| x.peak_memory_bytes);
        let share = if estimated[stage as usize] > 0.0 { st.time_s / estimated[stage as usize] } else { 0.0 };
        st.time_s = sim.map_or(0.0, |x| x.compute_busy_s) * share;
    }
    let t = r.iteration_s / c.training.global_batch as f64;
    let cand = Candidate {
        schedule: crate::plan::schedule_name(plan.schedule),
        virtual_stages: plan.virtual_stages,
        micro_batch: plan.micro_batch,
        micro_batches: plan.micro_batches,
        partition: plan.partition.clone(),
        stages: est.stages,
        fits: r.fits,
        iteration_s: r.iteration_s,
        time_per_sample_s: t,
    };
    Some((cand, r))
}

/// `f` over `items` on the machine's cores, results in the items' order (each item is a whole
/// simulation, independent of the others, so the answer does not depend on the thread count).
fn parallel_map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(items.len()).max(1);
    if threads == 1 {
        return items.iter().map(f).collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut out: Vec<(usize, R)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(item) = items.get(i) else { break };
                        done.push((i, f(item)));
                    }
                    done
                })
            })
            .collect();
        workers.into_iter().flat_map(|w| w.join().expect("an exploration worker panicked")).collect()
    });
    out.sort_by_key(|(i, _)| *i);
    out.into_iter().map(|(_, r)| r).collect()
}

/// How many of each schedule's most promising plans are simulated (before more, when none of
/// them fits).
pub const SIMULATED_PER_SCHEDULE: usize = 3;

/// Tasks (the lowering's size estimate, summed over the plans simulated) past which the rounds
/// that look for a fitting plan when none of the most promising fits stop: at the engine's
/// few million tasks per second and up to three simulations per plan (balanced, refit,
/// uniform), about a minute. The first round always runs whatever its size.
pub const FALLBACK_TASK_BUDGET: u64 = 100_000_000;

/// One plan of the exploration before simulation: its schedule, chunks per stage and
/// micro-batch size, and the partition objective's estimate of its time per sample.
#[derive(Clone, Copy)]
struct Job {
    kind: ScheduleKind,
    virtual_stages: u32,
    micro_batch: u32,
    /// The scenario's own schedule and partition (else the balanced partition).
    own: bool,
    /// The objective's estimate of seconds per sample: each stage's time per micro-batch
    /// (compute, or the boundary transfer when slower) times the pipeline's slots (see
    /// [`estimate_per_sample_s`]); infinite when no partition fits the objective's memory.
    estimate_s: f64,
}

/// The partition objective's estimate for `c` (a scenario with its schedule, micro-batching and
/// partition resolved): the slowest stage's time per micro-batch, each stage summing its
/// chunks, times the pipeline's slots, per sample of the replica. A flushed schedule takes
/// `m + (p − 1)/v` slots (its fill and drain); PipeDream-2BW, which never flushes, `m` in the
/// steady state the simulator reports.
fn estimate_per_sample_s(c: &Scenario) -> f64 {
    let plan = &c.plan;
    let devices = stage_devices(c);
    let layers = layer_profiles(c);
    let chunk_devices: Vec<StageDevice> = (0..plan.chunks()).map(|k| devices[(k % plan.pp) as usize].clone()).collect();
    let valid = plan.partition.len() == chunk_devices.len()
        && plan.partition.iter().all(|&n| n > 0)
        && plan.partition.iter().map(|&n| n as usize).sum::<usize>() == layers.len();
    if !valid {
        return f64::INFINITY;
    }
    let (est, fits) =
        partition::evaluate(&layers, &chunk_devices, plan.micro_batches, stash_rule(plan.schedule), &plan.partition);
    if !fits {
        return f64::INFINITY;
    }
    let mut per_stage = vec![0.0; plan.pp as usize];
    for (k, st) in est.stages.iter().enumerate() {
        per_stage[k % plan.pp as usize] += st.time_s;
    }
    let slowest = per_stage.iter().copied().fold(0.0, f64::max);
    let v = f64::from(plan.virtual_stages.max(1));
    let fill = if plan.schedule == ScheduleKind::TwoBW { 0.0 } else { f64::from(plan.pp - 1) / v };
    let slots = f64::from(plan.micro_batches) + fill;
    slowest * slots / f64::from(plan.micro_batches * plan.micro_batch)
}

/// `f` over the jobs in order of promise (estimate, then position; plans the objective cannot
/// rank, cheapest first by `tasks`), results at the jobs'
/// positions (`None` where not run): each schedule's `per_schedule` most promising plans first, then, while none of the results fits, the rest in rounds of that size. The
/// rounds are fixed, so which jobs run never depends on the thread count.
fn simulate_in_order(
    jobs: &[Job],
    per_schedule: usize,
    tasks: impl Fn(&Job) -> u64,
    f: impl Fn(&Job) -> Option<Candidate> + Sync,
) -> (Vec<Option<Candidate>>, usize) {
    let cost: Vec<u64> = jobs.iter().map(&tasks).collect();
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    // Plans the objective cannot rank (no partition fits its memory estimate) go cheapest first.
    order.sort_by(|&a, &b| {
        let unranked = jobs[a].estimate_s.is_infinite() && jobs[b].estimate_s.is_infinite();
        jobs[a]
            .estimate_s
            .total_cmp(&jobs[b].estimate_s)
            .then(if unranked { cost[a].cmp(&cost[b]) } else { a.cmp(&b) })
            .then(a.cmp(&b))
    });
    let mut first: Vec<usize> = Vec::new();
    for &i in &order {
        let key = (jobs[i].kind, jobs[i].own);
        if first.iter().filter(|&&j| (jobs[j].kind, jobs[j].own) == key).count() < per_schedule {
            first.push(i);
        }
    }
    let rest: Vec<usize> = order.iter().copied().filter(|i| !first.contains(i)).collect();
    let mut out: Vec<Option<Candidate>> = vec![None; jobs.len()];
    let run = |batch: &[usize], out: &mut Vec<Option<Candidate>>| {
        let picked: Vec<Job> = batch.iter().map(|&i| jobs[i]).collect();
        for (&i, r) in batch.iter().zip(parallel_map(&picked, &f)) {
            out[i] = r;
        }
    };
    run(&first, &mut out);
    let mut spent: u64 = first.iter().map(|&i| cost[i]).sum();
    let mut skipped = 0;
    for (k, round) in rest.chunks(per_schedule.max(1)).enumerate() {
        if out.iter().flatten().any(|c| c.fits) {
            break;
        }
        if spent > FALLBACK_TASK_BUDGET {
            skipped = rest.len() - k * per_schedule.max(1);
            break;
        }
        spent += round.iter().map(|&i| cost[i]).sum::<u64>();
        run(round, &mut out);
    }
    (out, skipped)
}

/// BaPipe's exploration: every schedule in {GPipe, 1F1B, 2BW} with every micro-batch size
/// that divides a replica's batch and the balanced partition for it, and the scenario's own
/// schedule (interleaved, flush) and partition with each size. The partition objective ranks
/// them all (see [`estimate_per_sample_s`]); each schedule's [`SIMULATED_PER_SCHEDULE`] most
/// promising are simulated, then more, in order, until one fits, so a plan the simulator
/// accepts is always found. A simulated balanced plan that does
/// not fit is retried with the balanced partition under the simulator's memory ([`refit`]),
/// then the uniform partition. The best time per sample among the simulated plans that fit.
pub fn explore(s: &Scenario) -> Exploration {
    explore_with(s, SIMULATED_PER_SCHEDULE)
}

/// [`explore`] simulating each schedule's `per_schedule` most promising plans first
/// (`usize::MAX`: every plan, an exhaustive exploration).
pub fn explore_with(s: &Scenario, per_schedule: usize) -> Exploration {
    let per_replica = s.training.global_batch / s.plan.dp;
    let layers = active_layers(s);
    let sizes: Vec<u32> = (1..=per_replica).filter(|b| per_replica.is_multiple_of(*b)).collect();
    // A defaulted `plan.p2p` follows the schedule, as it would had the scenario named it.
    let p2p_defaulted = s.defaults_applied.iter().any(|d| d.starts_with(crate::scenario::P2P_DEFAULT));
    let with = |kind: ScheduleKind, v: u32, mb: u32, partition: Vec<u32>| {
        let mut c = s.clone();
        c.plan.schedule = kind;
        if p2p_defaulted {
            c.plan.p2p = crate::scenario::default_p2p(kind, &c.plan.framework);
        }
        c.plan.virtual_stages = v;
        c.plan.micro_batch = mb;
        c.training.micro_batch = mb;
        c.plan.micro_batches = per_replica / mb;
        c.plan.partition = partition;
        c.plan.partition_policy = None;
        c
    };
    let balanced_for = |kind: ScheduleKind, mb: u32| -> Result<Vec<u32>, String> {
        let mut c = with(kind, 1, mb, Vec::new());
        c.plan.partition_policy = Some(PartitionPolicy::Balanced);
        resolve(&c)
    };
    let mut jobs = Vec::new();
    for kind in [ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::TwoBW] {
        for &mb in &sizes {
            // PipeDream-2BW accumulates over at least as many micro-batches as stages.
            if kind == ScheduleKind::TwoBW && per_replica / mb < s.plan.pp {
                continue;
            }
            let estimate_s =
                balanced_for(kind, mb).map_or(f64::INFINITY, |parts| estimate_per_sample_s(&with(kind, 1, mb, parts)));
            jobs.push(Job { kind, virtual_stages: 1, micro_batch: mb, own: false, estimate_s });
        }
    }
    // The scenario's own schedule and partition, where the loop above does not cover them.
    let uneven = s.plan.partition != crate::plan::Plan::uniform_partition(layers, s.plan.chunks());
    let own = s.plan.partition_policy.is_none()
        && (uneven
            || s.plan.virtual_stages > 1
            || !matches!(s.plan.schedule, ScheduleKind::GPipe | ScheduleKind::OneFOneB));
    if own && s.plan.token_slices.is_none() {
        for &mb in &sizes {
            let c = with(s.plan.schedule, s.plan.virtual_stages, mb, s.plan.partition.clone());
            let shape = crate::schedule::ScheduleShape {
                stages: c.plan.pp,
                micro_batches: c.plan.micro_batches,
                virtual_stages: c.plan.virtual_stages,
            };
            let two_bw_short = c.plan.schedule == ScheduleKind::TwoBW && c.plan.micro_batches < c.plan.pp;
            // The loop above already explores this exact plan (the balanced partition is the
            // scenario's own): listed once.
            let explored = c.plan.virtual_stages <= 1
                && matches!(c.plan.schedule, ScheduleKind::GPipe | ScheduleKind::OneFOneB | ScheduleKind::TwoBW)
                && balanced_for(c.plan.schedule, mb).is_ok_and(|parts| parts == c.plan.partition);
            if crate::schedule::validate(c.plan.schedule, shape).is_err() || two_bw_short || explored {
                continue;
            }
            let estimate_s = estimate_per_sample_s(&c);
            jobs.push(Job {
                kind: s.plan.schedule,
                virtual_stages: s.plan.virtual_stages,
                micro_batch: mb,
                own: true,
                estimate_s,
            });
        }
    }
    let explore_one = |job: &Job| -> Option<Candidate> {
        let (kind, mb) = (job.kind, job.micro_batch);
        if job.own {
            return candidate(&with(kind, job.virtual_stages, mb, s.plan.partition.clone())).map(|(cand, _)| cand);
        }
        let mut c = with(kind, 1, mb, Vec::new());
        c.plan.partition_policy = Some(PartitionPolicy::Balanced);
        let mut tried: Vec<(Vec<u32>, Candidate)> = Vec::new();
        // The balanced partition; where the simulation says it does not fit, the balanced
        // partition under the simulator's memory (see `refit`); then the uniform one.
        if let Ok(parts) = resolve(&c)
            && let Some((cand, report)) = candidate(&with(kind, 1, mb, parts.clone()))
        {
            let refit = if cand.fits { None } else { refit(&c, &parts, &report) };
            tried.push((parts, cand));
            if let Some(parts) = refit
                && let Some((cand, _)) = candidate(&with(kind, 1, mb, parts.clone()))
            {
                tried.push((parts, cand));
            }
        }
        if layers >= s.plan.pp && !tried.iter().any(|(_, c)| c.fits) {
            let parts = crate::plan::Plan::uniform_partition(layers, s.plan.pp);
            if !tried.iter().any(|(p, _)| *p == parts)
                && let Some((cand, _)) = candidate(&with(kind, 1, mb, parts.clone()))
            {
                tried.push((parts, cand));
            }
        }
        let chosen = tried.iter().position(|(_, c)| c.fits).or((!tried.is_empty()).then_some(0))?;
        Some(tried.swap_remove(chosen).1)
    };
    let explored = jobs.len();
    let mut candidates: Vec<Candidate> = Vec::new();
    let tasks = |job: &Job| {
        let parts =
            if job.own { s.plan.partition.clone() } else { crate::plan::Plan::uniform_partition(layers, s.plan.pp) };
        crate::lower::size::estimate(&with(job.kind, job.virtual_stages, job.micro_batch, parts), None).tasks()
    };
    let (simulated, not_simulated) = simulate_in_order(&jobs, per_schedule, tasks, explore_one);
    // A scenario's own plan can meet a balanced job's fallback (its uniform partition): listed once.
    for c in simulated.into_iter().flatten() {
        let key = |c: &Candidate| (c.schedule, c.virtual_stages, c.micro_batch, c.partition.clone());
        if !candidates.iter().any(|d| key(d) == key(&c)) {
            candidates.push(c);
        }
    }
    let best = candidates
        .iter()
        .filter(|c| c.fits)
        .min_by(|a, b| a.time_per_sample_s.total_cmp(&b.time_per_sample_s))
        .cloned();
    // Baselines: data parallelism over every device; the scenario's micro-batching under
    // GPipe with uniform stages.
    let dp = {
        let n = s.plan.devices();
        if s.training.global_batch.is_multiple_of(n) {
            let mut c = with(ScheduleKind::OneFOneB, 1, s.training.global_batch / n, vec![layers]);
            c.plan.dp = n;
            c.plan.cp = 1;
            // Expert-parallel groups are consecutive replicas: kept where they divide them.
            if !n.is_multiple_of(c.plan.ep) {
                c.plan.ep = 1;
            }
            c.plan.pp = 1;
            c.plan.tp = 1;
            c.plan.tp_mode = crate::workload::TpMode::OneD;
            c.plan.sequence_parallel = false;
            c.plan.micro_batches = 1;
            let (t, fits) = per_sample(&c);
            fits.then_some(t)
        } else {
            None
        }
    };
    // (Absent, not infinite, when the simulator refuses the baseline: too large, past the clock.)
    let uniform = (layers >= s.plan.pp)
        .then(|| {
            let c = with(
                ScheduleKind::GPipe,
                1,
                s.plan.micro_batch,
                crate::plan::Plan::uniform_partition(layers, s.plan.pp),
            );
            per_sample(&c).0
        })
        .filter(|t| t.is_finite());
    let speedup =
        |base: Option<f64>| base.zip(best.as_ref()).map(|(b, c)| b / c.time_per_sample_s).filter(|x| x.is_finite());
    Exploration {
        explored,
        not_simulated,
        speedup_vs_data_parallel: speedup(dp),
        speedup_vs_uniform_gpipe: speedup(uniform),
        data_parallel_time_per_sample_s: dp,
        uniform_gpipe_time_per_sample_s: uniform,
        best,
        candidates,
    }
}

#[cfg(test)]
mod order_tests {
    use super::*;

    fn job(micro_batch: u32, estimate_s: f64) -> Job {
        Job { kind: ScheduleKind::OneFOneB, virtual_stages: 1, micro_batch, own: false, estimate_s }
    }

    fn none_fits(job: &Job) -> Option<Candidate> {
        Some(Candidate {
            schedule: "1f1b",
            virtual_stages: 1,
            micro_batch: job.micro_batch,
            micro_batches: 1,
            partition: Vec::new(),
            stages: Vec::new(),
            fits: false,
            iteration_s: 1.0,
            time_per_sample_s: 1.0,
        })
    }

    /// Plans the objective cannot rank are simulated cheapest first, and once nothing fits and
    /// the budget is spent the rest are left out and counted.
    #[test]
    fn unranked_plans_go_cheapest_first_within_the_budget() {
        // Task counts fall with the micro-batch size, as the program's units do.
        let tasks = |j: &Job| 2 * FALLBACK_TASK_BUDGET / u64::from(j.micro_batch);
        let jobs: Vec<Job> = [1, 2, 4, 8, 16, 32, 64, 128].iter().map(|&mb| job(mb, f64::INFINITY)).collect();
        let order = std::sync::Mutex::new(Vec::new());
        let (out, skipped) = simulate_in_order(&jobs, 1, tasks, |j| {
            order.lock().unwrap().push(j.micro_batch);
            none_fits(j)
        });
        let order = order.into_inner().unwrap();
        assert_eq!(order[0], 128, "{order:?}");
        assert!(order.windows(2).all(|w| w[0] > w[1]), "{order:?}");
        assert_eq!(out.iter().filter(|c| c.is_some()).count(), order.len());
        assert_eq!(skipped, jobs.len() - order.len());
        assert!(skipped > 0 && !order.contains(&1), "{order:?}");
        // A ranked plan still goes by its estimate, whatever its cost.
        let mut ranked = jobs.clone();
        ranked[0].estimate_s = 1.0;
        let first = std::sync::Mutex::new(None);
        simulate_in_order(&ranked, 1, tasks, |j| {
            first.lock().unwrap().get_or_insert(j.micro_batch);
            none_fits(j)
        });
        assert_eq!(first.into_inner().unwrap(), Some(1));
    }
}
