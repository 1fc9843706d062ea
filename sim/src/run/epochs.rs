//! The phases of a training run: its epochs, with PipeTransformer's freezing and elastic
//! pipelines when the plan asks for them (SEEDS.md 1); a run given in tokens or iterations is
//! one epoch of the plan as written.
//!
//! For each epoch: the frozen layers (AutoFreeze, the gradient rule, or a given schedule);
//! AutoPipe's pipeline compression and AutoDP's replicas (`policy::freeze`); AutoCache (the
//! frozen prefix's output read back over PCIe when that is cheaper than recomputing it, from
//! host DRAM as far as the node's DRAM holds the dataset's cached activations, the rest from
//! its disks); the
//! transition cost when the pipeline length changes; and the simulated iteration of that
//! epoch's plan. Each epoch runs the plan as the user wrote it (tensor parallelism, schedule,
//! micro-batches, partition policy) except what the asked-for policies change (the pipeline
//! length, the replicas, and for a shortened pipeline PipeTransformer's micro-batch count);
//! the report lists those changes. The baseline is that plan with nothing frozen.
//!
//! Modelling choices: the simulator partitions whole layers, so an epoch's pipeline takes the
//! active layers evenly over K stages (AutoPipe's greedy over half-layer units decides K, not
//! the cut); with every layer frozen the last one stays in the pipeline (the head still
//! trains); a transition broadcasts the active model state (weights and optimizer) to the new
//! replicas over a NIC, and rebuilding process groups is not charged (no measurement of it is
//! known).

use crate::policy::freeze::{self, SubLayer};
use crate::scenario::{FreezePolicy, Scenario};
use crate::schedule::ScheduleKind;
use serde::Serialize;

#[derive(Clone, Debug, Serialize)]
pub struct EpochReport {
    pub epoch: u32,
    pub frozen_layers: u32,
    pub pipeline_length: u32,
    pub replicas: u32,
    pub micro_batches: u32,
    pub cached: bool,
    /// Iterations in the epoch, and samples in each.
    pub iterations: u64,
    pub samples_per_iteration: u32,
    pub iteration_s: f64,
    pub samples_per_s: f64,
    pub transition_s: f64,
    pub epoch_s: f64,
    /// Whether the epoch's plan fits the devices' memory (its times are those of a plan that
    /// would not run when it does not), and its peak on the fullest device.
    pub fits: bool,
    pub peak_memory_bytes: f64,
    /// That device's memory, and the part kept free for the allocator.
    pub memory_capacity_bytes: f64,
    pub memory_headroom_bytes: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Variant {
    pub name: String,
    pub total_s: f64,
    pub speedup: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    pub epochs: Vec<EpochReport>,
    pub total_s: f64,
    pub baseline_total_s: f64,
    pub speedup: f64,
    /// Whether every epoch's plan fits the devices' memory, and whether the baseline's does.
    pub fits: bool,
    pub baseline_fits: bool,
    /// Freezing alone, then adding AutoPipe, AutoDP and AutoCache in turn.
    pub breakdown: Vec<Variant>,
    /// What the policies changed in the plan as written (empty: the plan ran as written).
    pub plan_changes: Vec<PlanChange>,
}

/// The sub-layer units of the scenario's transformer, in millions of parameters.
fn sublayers(s: &Scenario) -> Vec<SubLayer> {
    let w = &s.workload.transformer;
    let h = w.hidden as f64;
    let f = w.ffn_hidden as f64;
    let norm = 2.0 * h;
    let kv = w.kv_width();
    let bias = if w.bias { 1.0 } else { 0.0 };
    let mha = h * (h + 2.0 * kv) + h * h + bias * (h + 2.0 * kv + h) + norm;
    let mlp_mats = match w.mlp {
        crate::workload::transformer::Mlp::Gelu => 2.0,
        crate::workload::transformer::Mlp::SwiGlu => 3.0,
    };
    let mlp = mlp_mats * h * f + bias * (f + h) + norm;
    let classes = w.head_classes();
    let head = match w.input {
        crate::workload::transformer::Input::Patches { .. } => h * classes + classes,
        crate::workload::transformer::Input::Tokens { .. } if w.tied_embeddings => 0.0,
        crate::workload::transformer::Input::Tokens { .. } => h * classes,
    };
    let embedding = w.embedding_parameters() - head - norm;
    let m = 1e-6;
    freeze::transformer_sublayers(w.layers, embedding * m, mha * m, mlp * m, norm * m, head * m)
}

/// Frozen layers during each epoch.
fn frozen_schedule(s: &Scenario, epochs: u32) -> Vec<u32> {
    let layers = s.workload.transformer.layers;
    let spec = s.freeze.as_ref().expect("freeze policy");
    let mut v = match &spec.policy {
        FreezePolicy::Autofreeze { alpha } => freeze::autofreeze_schedule(layers, *alpha, epochs),
        FreezePolicy::Gradient { trace } => freeze::gradient_rule(trace),
        FreezePolicy::Schedule { frozen_layers } => frozen_layers.clone(),
    };
    let last = v.last().copied().unwrap_or(0);
    v.resize(epochs as usize, last);
    v
}

/// Which PipeTransformer parts are on.
#[derive(Clone, Copy, Debug)]
struct Parts {
    freeze: bool,
    pipe: bool,
    dp: bool,
    cache: bool,
}

/// A change a policy made to the plan the user wrote: `to` holds one value per epoch when it
/// varies over the run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PlanChange {
    pub key: String,
    pub from: serde_json::Value,
    pub to: serde_json::Value,
    pub why: String,
}

/// Whether `m` micro-batches of a `k`-stage pipeline suit `kind` (PipeDream-2BW accumulates
/// over at least as many micro-batches as stages).
fn schedule_takes(kind: ScheduleKind, k: u32, m: u32) -> bool {
    let shape = crate::schedule::ScheduleShape { stages: k, micro_batches: m, virtual_stages: 1 };
    crate::schedule::validate(kind, shape).is_ok() && (kind != ScheduleKind::TwoBW || m >= k)
}

/// Micro-batches per replica for a `k`-stage pipeline: `target` or the nearest count below it
/// that divides the replica's batch and suits the schedule; failing that, the nearest above.
fn micro_batches_near(kind: ScheduleKind, k: u32, b_pipe: u32, target: u32) -> u32 {
    let ok = |m: &u32| b_pipe.is_multiple_of(*m) && schedule_takes(kind, k, *m);
    let t = target.clamp(1, b_pipe);
    (1..=t).rev().find(ok).or_else(|| (t..=b_pipe).find(ok)).unwrap_or(b_pipe)
}

/// One epoch's plan: the scenario as the user wrote it, with `f` layers frozen, `k` stages and
/// `r` replicas. Where the pipeline keeps the user's length it keeps their micro-batches;
/// where AutoPipe shortened it, PipeTransformer's count for that length
/// ([`freeze::micro_batches_for`]). The partition is the user's policy, resolved over the
/// active layers, or else uniform over them when the user's list no longer covers them.
fn epoch_scenario(s: &Scenario, f: u32, k: u32, r: u32) -> Scenario {
    let (k0, r0) = (s.plan.pp, s.plan.dp);
    let b_pipe = s.training.global_batch / r0;
    let layers = s.workload.transformer.layers;
    let m = if k == k0 {
        s.plan.micro_batches
    } else {
        micro_batches_near(s.plan.schedule, k, b_pipe, freeze::micro_batches_for(k))
    };
    let mut es = s.clone();
    es.freeze = None;
    es.run = None;
    es.plan.pp = k;
    es.plan.dp = r;
    es.plan.micro_batches = m;
    es.plan.micro_batch = b_pipe / m;
    es.training.micro_batch = b_pipe / m;
    es.training.global_batch = r * b_pipe;
    if f > 0 || k != k0 {
        es.plan.partition = crate::plan::Plan::uniform_partition(layers - f, k);
    }
    // The devices in use: all with AutoDP, else the pipelines that exist (each replica's
    // context-parallel ranks included; freezing, which changes them, is refused with cp).
    es.cluster.node.devices = (r * s.plan.cp * k * s.plan.tp).div_ceil(s.cluster.nodes);
    es
}

/// Simulate the run with `parts` on; also each epoch's scenario.
/// Simulations already run in this training run: epochs, variants and the baseline often run
/// the same plan (every epoch, without freezing), so each distinct plan is simulated once.
type Memo = std::cell::RefCell<Vec<(Scenario, crate::report::Report)>>;

fn simulate_once(memo: &Memo, x: &Scenario) -> Result<crate::report::Report, crate::SimError> {
    if let Some((_, r)) = memo.borrow().iter().find(|(y, _)| y == x) {
        return Ok(r.clone());
    }
    let r = crate::try_simulate(x, false)?.report;
    memo.borrow_mut().push((x.clone(), r.clone()));
    Ok(r)
}

fn run_with(s: &Scenario, parts: Parts, memo: &Memo) -> Result<(Vec<EpochReport>, Vec<Scenario>), crate::SimError> {
    let run = s.run.as_ref().expect("run");
    let layers = s.workload.transformer.layers;
    let frozen: Vec<u32> = if parts.freeze { frozen_schedule(s, run.epochs) } else { vec![0; run.epochs as usize] };
    let node = &s.cluster.node;
    let (k0, r0) = (s.plan.pp, s.plan.dp);
    let subs = sublayers(s);
    let plans = if parts.pipe {
        // Checked when the scenario was read: K0 a power of two, pipelines inside a node.
        freeze::elastic_schedule(&frozen, k0, s.cluster.nodes, node.devices / s.plan.tp, &subs)
    } else {
        Vec::new()
    };
    let b_pipe = s.training.global_batch / r0;
    let mut out = Vec::new();
    let mut scenarios = Vec::new();
    let mut prev_k = k0;
    let mut prev_f = 0;
    for (e, &f) in frozen.iter().enumerate() {
        // With every layer frozen the head still trains: keep the last layer in the pipeline.
        let f = f.min(layers - 1);
        // Whole layers per stage: never more stages than active layers (the rest idle).
        let k = if parts.pipe { plans[e].pipeline_length } else { k0 }.min(layers - f);
        let r = if parts.dp { r0 * (k0 / k) } else { r0 };
        let mut es = epoch_scenario(s, f, k, r);
        // AutoCache keeps one activation per sample in host DRAM (shared by the node's
        // processes), the rest on disk.
        let sample_bytes =
            s.training.precision.activation_bytes() * s.plan.seq_len as f64 * s.workload.transformer.hidden as f64;
        let cache_bytes = run.dataset_samples as f64 * sample_bytes / s.cluster.nodes as f64;
        let cache_on_disk = (1.0 - node.host.dram_bytes / cache_bytes).max(0.0);
        let iteration = |es: &Scenario, cached_layers: u32| {
            let mut x = es.clone();
            x.plan.frozen = crate::plan::Frozen { layers: f, cached_layers, cache_on_disk };
            simulate_once(memo, &x)
        };
        let recomputed = iteration(&es, 0)?;
        // What ran: a partition policy ("explore") may choose the schedule and micro-batches.
        // The epoch keeps that plan with its frozen prefix cached (exploring once per epoch).
        resolve_explored(&mut es, &recomputed.plan);
        // AutoCache: the output of the layers frozen before this epoch was written last epoch.
        let (report, cached) = if parts.cache && prev_f > 0 && f > 0 {
            let c = iteration(&es, prev_f.min(f))?;
            if c.iteration_s < recomputed.iteration_s { (c, true) } else { (recomputed, false) }
        } else {
            (recomputed, false)
        };
        let iteration_s = report.iteration_s;
        let m = es.plan.micro_batches;
        let iterations = run.dataset_samples.div_ceil(r as u64 * b_pipe as u64);
        let transition_s = if k != prev_k { transition_s(s, &subs, f) } else { 0.0 };
        out.push(EpochReport {
            epoch: e as u32,
            frozen_layers: f,
            pipeline_length: k,
            replicas: r,
            micro_batches: m,
            cached,
            iterations,
            samples_per_iteration: r * b_pipe,
            iteration_s,
            samples_per_s: (r * b_pipe) as f64 / iteration_s,
            transition_s,
            epoch_s: iterations as f64 * iteration_s + transition_s,
            fits: report.fits,
            peak_memory_bytes: report.peak_memory_bytes,
            memory_capacity_bytes: report.memory_capacity_bytes,
            memory_headroom_bytes: report.memory_headroom_bytes,
        });
        scenarios.push(es);
        prev_k = k;
        prev_f = f;
    }
    Ok((out, scenarios))
}

/// Where `explore` chose the epoch's plan, that plan as it ran (`ran`: the report's plan), so
/// that the epoch's other variants (its frozen prefix cached) and its listing use it.
fn resolve_explored(es: &mut Scenario, ran: &crate::report::PlanSummary) {
    if es.plan.partition_policy != Some(crate::plan::PartitionPolicy::Explore) {
        return;
    }
    es.plan.schedule = crate::plan::parse_schedule(ran.schedule).unwrap_or(es.plan.schedule);
    es.plan.virtual_stages = ran.virtual_stages;
    es.plan.micro_batches = ran.micro_batches;
    es.plan.micro_batch = ran.micro_batch;
    es.training.micro_batch = ran.micro_batch;
    es.plan.partition = ran.partition.clone();
    es.plan.partition_policy = None;
}

/// What the epochs' plans changed in the plan the user wrote, and why.
fn plan_changes(s: &Scenario, epochs: &[Scenario]) -> Vec<PlanChange> {
    use serde_json::{Value, json};
    let mut out = Vec::new();
    let mut add = |key: &str, from: Value, per_epoch: Vec<Value>, why: &str| {
        if per_epoch.iter().any(|v| *v != from) {
            let to = if per_epoch.windows(2).all(|w| w[0] == w[1]) {
                per_epoch.into_iter().next().unwrap_or(Value::Null)
            } else {
                Value::Array(per_epoch)
            };
            out.push(PlanChange { key: key.into(), from, to, why: why.into() });
        }
    };
    let per = |f: &dyn Fn(&Scenario) -> Value| epochs.iter().map(f).collect::<Vec<_>>();
    add(
        "plan.pp",
        json!(s.plan.pp),
        per(&|e| json!(e.plan.pp)),
        "AutoPipe shortens the pipeline as layers freeze (never more stages than active layers)",
    );
    add(
        "plan.dp",
        json!(s.plan.dp),
        per(&|e| json!(e.plan.dp)),
        "AutoDP runs a replica on the devices a shorter pipeline frees (R = dp x K0 / K)",
    );
    add(
        "plan.schedule",
        json!(crate::plan::schedule_name(s.plan.schedule)),
        per(&|e| json!(crate::plan::schedule_name(e.plan.schedule))),
        "the partition policy \"explore\" chose the schedule",
    );
    add(
        "training.micro_batch",
        json!(s.training.micro_batch),
        per(&|e| json!(e.training.micro_batch)),
        "a shortened pipeline takes PipeTransformer's micro-batch count for its length (or \"explore\" chose it)",
    );
    if s.plan.partition_policy.is_none() {
        add(
            "plan.partition",
            json!(s.plan.partition),
            per(&|e| json!(e.plan.partition)),
            "frozen layers leave the pipeline; the active layers are cut evenly over its stages",
        );
    }
    out
}

/// Broadcasting the trained part of the model (its weights and optimizer state) to the new
/// replicas over one NIC.
fn transition_s(s: &Scenario, subs: &[SubLayer], frozen: u32) -> f64 {
    let active_m: f64 = freeze::active_sublayers(subs, frozen).iter().map(|u| u.params_m).sum();
    let (w, _, o) =
        crate::cost::memory::bytes_per_parameter(s.training.precision, s.training.optimizer, s.training.master_weights);
    let bytes = active_m * 1e6 * (w + o);
    let nic = &s.cluster.node.nic;
    bytes / nic.effective_bytes_per_s() + nic.latency_s
}

/// Simulate the scenario's training run with freezing, and the baseline and breakdown (see
/// [`try_training_run`]); panics where the simulator refuses an epoch's plan.
pub fn training_run(s: &Scenario) -> RunReport {
    try_training_run(s).unwrap_or_else(|e| panic!("{e}"))
}

/// Simulate the scenario's training run with freezing, and the baseline and breakdown. The
/// baseline is the plan as written with nothing frozen. An epoch's plan the simulator refuses
/// (too large, past the clock, impossible) ends the run with its error.
pub fn try_training_run(s: &Scenario) -> Result<RunReport, crate::SimError> {
    let total = |v: &[EpochReport]| v.iter().map(|e| e.epoch_s).sum::<f64>();
    let all = Parts { freeze: true, pipe: true, dp: true, cache: true };
    let spec = s.freeze.as_ref();
    let chosen = Parts {
        freeze: spec.is_some(),
        pipe: spec.is_some_and(|f| f.auto_pipe),
        dp: spec.is_some_and(|f| f.auto_pipe && f.auto_dp),
        cache: spec.is_some_and(|f| f.auto_cache),
    };
    let memo = Memo::default();
    let (epochs, scenarios) = run_with(s, chosen, &memo)?;
    let base = run_with(s, Parts { freeze: false, pipe: false, dp: false, cache: false }, &memo)?.0;
    let (baseline, baseline_fits) = (total(&base), base.iter().all(|e| e.fits));
    let steps = [
        ("freezing alone", Parts { pipe: false, dp: false, cache: false, ..all }),
        ("+ AutoPipe", Parts { dp: false, cache: false, ..all }),
        ("+ AutoDP", Parts { cache: false, ..all }),
        ("+ AutoCache", all),
    ];
    let breakdown = if spec.is_some() {
        steps
            .iter()
            .map(|(name, p)| {
                let t = total(&run_with(s, *p, &memo)?.0);
                Ok(Variant { name: name.to_string(), total_s: t, speedup: baseline / t })
            })
            .collect::<Result<_, crate::SimError>>()?
    } else {
        Vec::new()
    };
    let t = total(&epochs);
    let fits = epochs.iter().all(|e| e.fits);
    Ok(RunReport {
        fits,
        baseline_fits,
        plan_changes: plan_changes(s, &scenarios),
        epochs,
        total_s: t,
        baseline_total_s: baseline,
        speedup: baseline / t,
        breakdown,
    })
}
