//! A whole training run: its phases (epochs, each with PipeTransformer's freezing and elastic
//! pipelines when asked; or one phase of a run given in tokens or iterations), each phase's
//! iteration from the simulator ([`epochs`]); then, over that useful time, failures,
//! checkpoints, restarts and slow nodes drawn in seeded Monte Carlo runs ([`goodput`], with the
//! rates of [`failures`]). One engine: freezing is a policy of the phases, failures act on
//! whatever the phases add up to.

pub mod epochs;
pub mod failures;
pub mod goodput;

pub use epochs::{EpochReport, PlanChange, RunReport, Variant, training_run, try_training_run};

use crate::scenario::{CheckpointInterval, Scenario};
use serde::Serialize;

/// A number for one run, or its distribution over several.
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(untagged)]
pub enum Stat {
    One(f64),
    Many { p50: f64, p90: f64, mean: f64 },
}

impl Stat {
    fn of(values: &[f64]) -> Stat {
        if values.len() == 1 {
            return Stat::One(values[0]);
        }
        let mean = values.iter().sum::<f64>() / values.len() as f64;
        Stat::Many { p50: goodput::quantile(values, 0.5), p90: goodput::quantile(values, 0.9), mean }
    }

    /// The median (the value itself for one run).
    pub fn p50(&self) -> f64 {
        match self {
            Stat::One(x) => *x,
            Stat::Many { p50, .. } => *p50,
        }
    }
}

/// The checkpoint: its size, what saving and restoring it cost, and its interval.
#[derive(Clone, Debug, Serialize)]
pub struct CheckpointReport {
    /// Weights and optimizer state of one model replica.
    pub bytes: f64,
    /// How long a save stalls training (with async saves, the copy to host memory).
    pub save_s: f64,
    /// Writing it to storage (equal to `save_s` unless async).
    pub write_s: f64,
    pub restore_s: f64,
    /// Compute time between checkpoints (absent: never, with no failures).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interval_s: Option<f64>,
    /// Whether the interval is Daly's optimum for the failure rate and save stall.
    pub optimal: bool,
}

/// `train-run`'s report: the phases and their policies, then the whole run's time and goodput.
#[derive(Clone, Debug, Serialize)]
pub struct WholeRunReport {
    #[serde(flatten)]
    pub training: RunReport,
    /// Iterations of the whole run.
    pub iterations: u64,
    /// Tokens of the whole run (samples x sequence length).
    pub tokens: f64,
    /// Devices the run holds (its GPU-hours count all of them).
    pub devices: u32,
    /// Seeded runs drawn (`--runs`).
    pub runs: u32,
    pub seed: u64,
    /// The failure preset and the rates used, per device-hour.
    pub failures: failures::FailureRates,
    pub checkpoint: CheckpointReport,
    pub restart_s: f64,
    /// Wall-clock days to the end of training.
    pub wall_days: Stat,
    pub gpu_hours: Stat,
    /// Useful compute time over wall-clock time.
    pub goodput: Stat,
    pub interruptions: Stat,
    /// Mean interruptions per component over the runs.
    pub interruptions_by_component: std::collections::BTreeMap<String, f64>,
    /// Mean wall-clock seconds lost, by cause.
    pub lost: goodput::LostSeconds,
    /// Dollars at `--price-per-gpu-hour` (absent without a price).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost_dollars: Option<Stat>,
    /// Each run's wall-clock days, in run order (for the distribution plot).
    #[serde(skip)]
    pub wall_days_per_run: Vec<f64>,
    /// The first run's progress: (wall-clock seconds, fraction of the work checkpointed).
    #[serde(skip)]
    pub progress: Vec<(f64, f64)>,
}

/// Bytes of a checkpoint: one replica's weights and optimizer state (gradients are not saved).
pub fn checkpoint_bytes(s: &Scenario) -> f64 {
    let (w, _, o) =
        crate::cost::memory::bytes_per_parameter(s.training.precision, s.training.optimizer, s.training.master_weights);
    s.workload.parameters() * (w + o)
}

/// The run's Monte Carlo model: the useful time from `report`, the rest from `s.run`.
pub fn run_model(s: &Scenario, report: &RunReport) -> Result<(goodput::RunModel, CheckpointReport), String> {
    let run = s.run.as_ref().ok_or("the scenario has no \"run\"")?;
    let devices = s.plan.devices();
    let per_node = s.cluster.node.devices.max(1);
    let nodes = devices.div_ceil(per_node).max(1);
    let bytes = checkpoint_bytes(s);
    let storage = run.checkpoint.storage_bytes_per_s_per_node * f64::from(nodes);
    let write_s = bytes / storage;
    // An async save stalls only while each device copies its shard to host memory: the unique
    // shards are spread over tp x pp devices, and over the data-parallel group too with ZeRO.
    let save_s = if run.checkpoint.asynchronous {
        let p = &s.plan;
        let holders = f64::from(p.tp * p.pp) * if p.zero_stage >= 1 { f64::from(p.replicas()) } else { 1.0 };
        bytes / holders / s.cluster.node.host.pcie.effective_bytes_per_s()
    } else {
        write_s
    };
    let restore_s = write_s;
    let unexpected = run.failures.unexpected_per_s(devices);
    let mtbf = if unexpected > 0.0 { 1.0 / unexpected } else { f64::INFINITY };
    let iterations: u64 = report.epochs.iter().map(|e| e.iterations).sum();
    let useful_s = report.total_s;
    let iteration_s = if iterations > 0 { useful_s / iterations as f64 } else { 0.0 };
    let (interval_s, optimal) = match run.checkpoint.interval {
        CheckpointInterval::Optimal => (failures::daly_interval_s(save_s, mtbf).max(iteration_s), true),
        CheckpointInterval::Seconds(x) => (x, false),
    };
    let model = goodput::RunModel {
        useful_s,
        iteration_s,
        devices,
        nodes,
        rates: run.failures.clone(),
        interval_s,
        save_s,
        restore_s,
        restart_s: run.restart_s,
        iteration_jitter: run.variability.iteration_jitter,
        slow_node_probability: run.variability.slow_node_probability,
        slow_node_slowdown: run.variability.slow_node_slowdown,
    };
    goodput::check(&model)?;
    let checkpoint = CheckpointReport {
        bytes,
        save_s,
        write_s,
        restore_s,
        interval_s: interval_s.is_finite().then_some(interval_s),
        optimal,
    };
    Ok((model, checkpoint))
}

/// What `train-run` says of a scenario without a `run` section (the CLI and the Python package).
pub const NEEDS_RUN: &str = "train-run needs \"run\": the run's length, {\"tokens\": T}, {\"iterations\": I} or {\"dataset_samples\": N, \"epochs\": E} (docs/scenario.md, \"run\")";

/// The whole run: the phases simulated, then `runs` seeded Monte Carlo runs of failures and
/// checkpoints over them. `price` is dollars per GPU-hour.
pub fn try_whole_run(s: &Scenario, runs: u32, price: Option<f64>) -> Result<WholeRunReport, String> {
    let run = s.run.as_ref().ok_or("the scenario has no \"run\"")?;
    let training = try_training_run(s).map_err(|e| e.to_string())?;
    let (model, checkpoint) = run_model(s, &training)?;
    let runs = runs.max(1);
    let samples = goodput::samples(&model, run.seed, runs);
    let wall: Vec<f64> = samples.iter().map(|x| x.wall_s).collect();
    let days: Vec<f64> = wall.iter().map(|w| w / 86400.0).collect();
    let hours: Vec<f64> = wall.iter().map(|w| w / 3600.0 * f64::from(model.devices)).collect();
    // The compute time the run kept (the iterations' jitter included) over its wall time.
    let good: Vec<f64> =
        samples.iter().map(|x| if x.wall_s > 0.0 { 1.0 - x.lost.total_s() / x.wall_s } else { 1.0 }).collect();
    let inter: Vec<f64> = samples.iter().map(|x| x.interruptions as f64).collect();
    let by_component = failures::COMPONENTS
        .iter()
        .enumerate()
        .map(|(i, c)| (c.to_string(), samples.iter().map(|x| x.by_component[i] as f64).sum::<f64>() / f64::from(runs)))
        .collect();
    let iterations = training.epochs.iter().map(|e| e.iterations).sum();
    let samples_total: f64 = training.epochs.iter().map(|e| e.iterations as f64 * e.samples_per_iteration as f64).sum();
    Ok(WholeRunReport {
        iterations,
        tokens: samples_total * f64::from(s.plan.seq_len),
        devices: model.devices,
        runs,
        seed: run.seed,
        failures: model.rates.clone(),
        checkpoint,
        restart_s: model.restart_s,
        wall_days: Stat::of(&days),
        gpu_hours: Stat::of(&hours),
        goodput: Stat::of(&good),
        interruptions: Stat::of(&inter),
        interruptions_by_component: by_component,
        lost: goodput::mean_lost(&samples),
        cost_dollars: price.map(|p| Stat::of(&hours.iter().map(|h| h * p).collect::<Vec<_>>())),
        wall_days_per_run: days,
        progress: samples.into_iter().next().map(|x| x.progress).unwrap_or_default(),
        training,
    })
}
