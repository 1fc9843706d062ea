//! `run` (a whole training run: its length, failures, checkpoints and variability) and
//! `plan.freeze` (PipeTransformer's freezing over it), with what freezing's elastic pipelines
//! need of the plan.

use super::keys;
use super::reader::{self, Obj, Result, invalid, show};
use super::suggest::did_you_mean;
use crate::hardware::ClusterSpec;
use crate::plan::Plan;
use crate::run::failures::{COMPONENTS, FailureRates, PRESETS};
use crate::workload::Workload;
use serde::Serialize;
use serde_json::Value;

/// `run`: a whole training run. Its length is given as `dataset_samples` and `epochs`, or as
/// `tokens` or `iterations` (one phase); the scenario resolves the latter to samples and one
/// epoch once the training section is read ([`resolve_length`]).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunSpec {
    pub dataset_samples: u64,
    pub epochs: u32,
    /// How the length was given: "epochs", "tokens" or "iterations".
    pub length: &'static str,
    /// `tokens` or `iterations` as written (resolved by [`resolve_length`]).
    #[serde(skip)]
    given: f64,
    pub failures: FailureRates,
    pub checkpoint: CheckpointSpec,
    /// Rescheduling and re-initialising the job after an interruption, seconds.
    pub restart_s: f64,
    pub variability: RunVariability,
    pub seed: u64,
}

/// When a checkpoint is saved.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckpointInterval {
    /// Daly's optimum for the failure rate and the save stall.
    Optimal,
    /// Every this many seconds of compute.
    Seconds(f64),
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CheckpointSpec {
    pub interval: CheckpointInterval,
    /// Write (and read) bandwidth to checkpoint storage per node of the job, bytes/s.
    pub storage_bytes_per_s_per_node: f64,
    /// Saves copy to host memory and write in the background.
    pub asynchronous: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunVariability {
    pub iteration_jitter: f64,
    /// Per-kernel spread of the run's simulated iterations: `simulation.kernel_jitter`, given
    /// here (the scenario reader moves it there, seeded by the run's seed).
    pub kernel_jitter: Option<f64>,
    pub slow_node_probability: f64,
    pub slow_node_slowdown: f64,
}

/// Default checkpoint storage bandwidth per node: Llama 3's checkpoint storage (Tectonic)
/// sustained 2 TB/s for its 16,384 GPUs (arXiv 2407.21783, section 3.3.1), 2,048 nodes of 8:
/// about 0.98 GB/s per node.
pub const DEFAULT_STORAGE_BYTES_PER_S_PER_NODE: f64 = 2e12 / 2048.0;

/// Default restart time, seconds: an assumption (no public measurement of a large job's
/// restart that is not in a reserved source was found); set `run.restart_s`.
pub const DEFAULT_RESTART_S: f64 = 600.0;

/// `run`: the length ({"dataset_samples": N, "epochs": E} | {"tokens": T} | {"iterations":
/// I}), and the failures, checkpoints, restarts and variability of the whole run.
pub(super) fn parse_run(root: &Obj, defaults: &mut Vec<String>) -> Result<Option<RunSpec>> {
    let Some(r) = root.obj("run")? else { return Ok(None) };
    r.only(keys::RUN)?;
    // A key given as null is left out, as everywhere in the reader.
    let given: Vec<&str> =
        ["dataset_samples", "tokens", "iterations"].into_iter().filter(|k| r.get(k).is_some()).collect();
    if given.len() != 1 {
        return Err(invalid(
            &r.path,
            format!(
                "give the run's length as exactly one of: \"dataset_samples\" (with \"epochs\"), \"tokens\", \"iterations\"; got {}",
                if given.is_empty() { "none".to_string() } else { given.join(", ") }
            ),
        ));
    }
    let (length, samples, epochs, amount) = match given[0] {
        "dataset_samples" => {
            let v = r.get("dataset_samples").expect("present");
            let samples = v.as_u64().filter(|n| *n > 0).ok_or_else(|| {
                invalid(&r.key("dataset_samples"), format!("expected a positive integer, got {}", show(v)))
            })?;
            ("epochs", samples, r.req("epochs", Obj::uint)?, 0.0)
        }
        other => {
            if r.has("epochs") {
                return Err(invalid(
                    &r.key("epochs"),
                    format!("\"epochs\" goes with \"dataset_samples\"; a run of \"{other}\" is one phase"),
                ));
            }
            let x = r.req(other, Obj::positive)?;
            if x > 1e18 {
                return Err(invalid(&r.key(other), format!("{x}; allowed: at most 1e18")));
            }
            (if other == "tokens" { "tokens" } else { "iterations" }, 0, 1, x)
        }
    };
    let failures = match r.get("failures") {
        None => {
            defaults
                .push("run.failures = \"none\" (no interruptions; \"llama3-2024\" is Llama 3's 16K-GPU rates)".into());
            FailureRates::none()
        }
        Some(Value::String(name)) => preset(&r.key("failures"), name)?,
        Some(_) => {
            let f = r.req("failures", Obj::obj)?;
            f.only(keys::RUN_FAILURES)?;
            let mut rates = match f.string("preset")? {
                Some(name) => preset(&f.key("preset"), name)?,
                None => FailureRates::none(),
            };
            rates.name = match f.string("preset")? {
                Some(n) if COMPONENTS.iter().all(|c| !f.has(c)) => n.to_string(),
                Some(n) => format!("{n} (adjusted)"),
                None => "custom".into(),
            };
            for (i, c) in COMPONENTS.iter().enumerate() {
                if let Some(x) = f.non_negative(c)? {
                    if x > 1.0 {
                        return Err(invalid(&f.key(c), format!("{x} interruptions per device-hour; allowed: 0 to 1")));
                    }
                    rates.per_device_hour[i] = x;
                }
            }
            rates
        }
    };
    let checkpoint = match r.obj("checkpoint")? {
        None => CheckpointSpec {
            interval: CheckpointInterval::Optimal,
            storage_bytes_per_s_per_node: DEFAULT_STORAGE_BYTES_PER_S_PER_NODE,
            asynchronous: false,
        },
        Some(c) => {
            c.only(keys::RUN_CHECKPOINT)?;
            let interval = match c.get("interval_s") {
                None => CheckpointInterval::Optimal,
                Some(Value::String(x)) if x == "optimal" => CheckpointInterval::Optimal,
                Some(Value::String(x)) => {
                    return Err(invalid(&c.key("interval_s"), format!("\"{x}\"; allowed: \"optimal\" or seconds > 0")));
                }
                Some(_) => CheckpointInterval::Seconds(c.req("interval_s", Obj::positive)?),
            };
            CheckpointSpec {
                interval,
                storage_bytes_per_s_per_node: c
                    .positive("storage_bytes_per_s_per_node")?
                    .unwrap_or(DEFAULT_STORAGE_BYTES_PER_S_PER_NODE),
                asynchronous: c.boolean("async")?.unwrap_or(false),
            }
        }
    };
    let variability = match r.obj("variability")? {
        None => RunVariability {
            iteration_jitter: 0.0,
            kernel_jitter: None,
            slow_node_probability: 0.0,
            slow_node_slowdown: 0.0,
        },
        Some(v) => {
            v.only(keys::RUN_VARIABILITY)?;
            let jitter = v.non_negative("iteration_jitter")?.unwrap_or(0.0);
            if jitter > 1.0 {
                return Err(invalid(&v.key("iteration_jitter"), format!("{jitter}; allowed: 0 to 1")));
            }
            let kernel_jitter = v.non_negative("kernel_jitter")?;
            if let Some(k) = kernel_jitter.filter(|&k| k > 1.0) {
                return Err(invalid(&v.key("kernel_jitter"), format!("{k}; allowed: 0 to 1")));
            }
            let p = v.non_negative("slow_node_probability")?.unwrap_or(0.0);
            if p > 1.0 {
                return Err(invalid(&v.key("slow_node_probability"), format!("{p}; allowed: 0 to 1")));
            }
            let slowdown = v.non_negative("slow_node_slowdown")?.unwrap_or(0.0);
            if slowdown > 100.0 {
                return Err(invalid(&v.key("slow_node_slowdown"), format!("{slowdown}; allowed: 0 to 100")));
            }
            RunVariability {
                iteration_jitter: jitter,
                kernel_jitter,
                slow_node_probability: p,
                slow_node_slowdown: slowdown,
            }
        }
    };
    let restart_s = match r.non_negative("restart_s")? {
        Some(x) if x > 1e7 => return Err(invalid(&r.key("restart_s"), format!("{x} s; allowed: 0 to 1e7"))),
        Some(x) => x,
        None => {
            if failures.per_device_hour.iter().any(|&x| x > 0.0) {
                defaults.push(format!("run.restart_s = {DEFAULT_RESTART_S} (an assumption: set it from your cluster)"));
            }
            DEFAULT_RESTART_S
        }
    };
    let seed = match r.get("seed") {
        None => 0,
        Some(v) => {
            v.as_u64().ok_or_else(|| invalid(&r.key("seed"), format!("expected an integer >= 0, got {}", show(v))))?
        }
    };
    Ok(Some(RunSpec {
        dataset_samples: samples,
        epochs,
        length,
        given: amount,
        failures,
        checkpoint,
        restart_s,
        variability,
        seed,
    }))
}

fn preset(path: &str, name: &str) -> Result<FailureRates> {
    FailureRates::preset(name).ok_or_else(|| {
        invalid(
            path,
            format!("\"{name}\" is not one of: {}{}", PRESETS.join(", "), did_you_mean(name, PRESETS.iter().copied())),
        )
    })
}

/// A run given in tokens or iterations becomes one epoch of whole iterations of the global
/// batch (tokens rounded up to whole iterations).
pub(super) fn resolve_length(run: &mut RunSpec, global_batch: u32, seq_len: u32) -> Result<()> {
    let per_iteration = f64::from(global_batch) * f64::from(seq_len.max(1));
    let iterations = match run.length {
        "tokens" => (run.given / per_iteration).ceil(),
        "iterations" => run.given.ceil(),
        _ => return Ok(()),
    };
    let samples = iterations * f64::from(global_batch);
    if samples > 1e18 {
        return Err(invalid(
            "run",
            format!("{iterations:.3e} iterations of {global_batch} samples; allowed: at most 1e18 samples"),
        ));
    }
    run.dataset_samples = samples as u64;
    run.epochs = 1;
    Ok(())
}

/// Which layers are frozen in each epoch.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FreezePolicy {
    /// AutoFreeze's closed form with this alpha.
    Autofreeze { alpha: f64 },
    /// The gradient-norm rule over a per-layer gradient trace (epoch x layer).
    Gradient { trace: Vec<Vec<f64>> },
    /// Frozen layers given per epoch.
    Schedule { frozen_layers: Vec<u32> },
}

/// `plan.freeze`: the policy, and which of PipeTransformer's system parts are on.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FreezeSpec {
    pub policy: FreezePolicy,
    pub auto_pipe: bool,
    pub auto_dp: bool,
    pub auto_cache: bool,
}

/// `plan.freeze`: {"policy": "autofreeze", "alpha": a} | {"policy": "gradient", "trace": FILE}
/// | {"policy": "schedule", "frozen_layers": [...]}, with "auto_pipe", "auto_dp", "auto_cache"
/// (default true).
pub(super) fn parse_freeze(
    o: &Obj,
    w: &Workload,
    run: Option<&RunSpec>,
    load: &dyn Fn(&str) -> std::result::Result<String, String>,
) -> Result<Option<FreezeSpec>> {
    let Some(f) = o.obj("freeze")? else { return Ok(None) };
    if w.net.is_some() {
        return Err(invalid(
            &f.path,
            format!("freezing is modelled for transformers; \"{}\" is a network of distinct layers", w.name),
        ));
    }
    f.only(keys::FREEZE)?;
    let layers = w.transformer.layers;
    let policy = match f.req("policy", Obj::string)? {
        "autofreeze" => {
            let alpha = f.req("alpha", Obj::positive)?;
            if alpha >= 1.0 {
                return Err(invalid(&f.key("alpha"), format!("{alpha} is not in (0, 1)")));
            }
            FreezePolicy::Autofreeze { alpha }
        }
        "gradient" => {
            let path = f.req("trace", Obj::string)?;
            let text = load(path).map_err(|e| invalid(&f.key("trace"), format!("cannot read \"{path}\": {e}")))?;
            let v: Value = serde_json::from_str(&text)
                .map_err(|e| invalid(&f.key("trace"), format!("\"{path}\" is not JSON: {e}")))?;
            let rows = v.get("grad_l1").unwrap_or(&v);
            let trace: Option<Vec<Vec<f64>>> = rows.as_array().and_then(|a| {
                a.iter().map(|r| r.as_array().and_then(|c| c.iter().map(Value::as_f64).collect())).collect()
            });
            let trace = trace.filter(|t| !t.is_empty() && t.iter().all(|r| r.len() == layers as usize)).ok_or_else(|| {
                invalid(&f.key("trace"), format!("\"{path}\" must hold an array of epochs, each an array of {layers} per-layer gradient norms (or {{\"grad_l1\": ...}})"))
            })?;
            FreezePolicy::Gradient { trace }
        }
        "schedule" => {
            let v =
                f.get("frozen_layers").ok_or_else(|| invalid(&f.key("frozen_layers"), "required with \"schedule\""))?;
            let l: Option<Vec<u32>> =
                v.as_array().and_then(|a| a.iter().map(|x| x.as_u64().map(|n| n as u32)).collect());
            let l = l.filter(|l| l.windows(2).all(|w| w[0] <= w[1]) && l.iter().all(|&n| n <= layers)).ok_or_else(
                || {
                    invalid(
                        &f.key("frozen_layers"),
                        format!(
                            "expected non-decreasing counts of frozen layers, each at most {layers}, got {}",
                            show(v)
                        ),
                    )
                },
            )?;
            FreezePolicy::Schedule { frozen_layers: l }
        }
        other => {
            return Err(invalid(
                &f.key("policy"),
                format!(
                    "\"{other}\" is not one of: autofreeze, gradient, schedule{}",
                    did_you_mean(other, keys::FREEZE_POLICIES.iter().copied())
                ),
            ));
        }
    };
    if run.is_none_or(|r| r.length != "epochs") {
        return Err(invalid(
            &f.key("policy"),
            "freezing acts over the epochs of a training run: add \"run\": {\"dataset_samples\": N, \"epochs\": E}",
        ));
    }
    Ok(Some(FreezeSpec {
        policy,
        auto_pipe: f.boolean("auto_pipe")?.unwrap_or(true),
        auto_dp: f.boolean("auto_dp")?.unwrap_or(true),
        auto_cache: f.boolean("auto_cache")?.unwrap_or(true),
    }))
}

/// What PipeTransformer's elastic pipelines (`policy::freeze::elastic_schedule`) need of the
/// plan: the initial pipeline length K0 = pp a power of two whose pipelines (pp x tp devices)
/// fit inside one node, one chunk per stage, and no token slicing.
pub(super) fn check_elastic(o: &Obj, plan: &Plan, c: &ClusterSpec) -> Result<()> {
    let (pp, tp, per_node) = (plan.pp, plan.tp, c.node.devices);
    if !pp.is_power_of_two() {
        return Err(invalid(
            &o.key("pp"),
            format!(
                "{pp}: with \"freeze\", AutoPipe halves the pipeline length; allowed: a power of two (1, 2, 4, ...)"
            ),
        ));
    }
    if u64::from(pp) * u64::from(tp) > u64::from(per_node) {
        return Err(invalid(
            &o.key("pp"),
            format!(
                "{pp}: with \"freeze\", each pipeline (pp x tp = {} devices) stays inside one node of {per_node} devices; allowed: pp a power of two <= {}",
                u64::from(pp) * u64::from(tp),
                per_node / tp.max(1)
            ),
        ));
    }
    if plan.virtual_stages > 1 || plan.schedule == crate::schedule::ScheduleKind::Interleaved {
        return Err(invalid(
            &o.key("schedule"),
            "\"interleaved\" with \"freeze\": AutoPipe re-cuts the pipeline each epoch into one chunk per stage; allowed: gpipe, 1f1b, flush, 2bw",
        ));
    }
    if plan.token_slices.is_some() {
        return Err(invalid(
            &o.key("token_slices"),
            "token slicing with \"freeze\" is not modelled; use one or the other",
        ));
    }
    if plan.cp > 1 {
        return Err(reader::unsupported(
            &o.key("cp"),
            format!(
                "{}: context parallelism with \"freeze\" is not modelled (AutoDP's replica counts assume whole sequences per replica); allowed: cp = 1",
                plan.cp
            ),
        ));
    }
    Ok(())
}

/// `run.variability.kernel_jitter` is the engine's per-kernel spread for the run's simulated
/// iterations (`simulation.kernel_jitter`, one mechanism: `engine::jitter`), drawn from the
/// run's seed unless `simulation.seed` is given. Both keys, with different spreads, are refused.
pub(super) fn share_kernel_jitter(r: &RunSpec, options: &mut super::SimOptions) -> Result<()> {
    let Some(k) = r.variability.kernel_jitter else { return Ok(()) };
    if let Some(given) = options.kernel_jitter.filter(|&g| g != k) {
        return Err(invalid(
            "run.variability.kernel_jitter",
            format!("{k} but simulation.kernel_jitter is {given}: give the per-kernel spread once"),
        ));
    }
    options.kernel_jitter = Some(k);
    // The run's iterations each draw their own waits.
    options.kernel_jitter_draws = true;
    if options.seed == 0 {
        options.seed = r.seed;
    }
    Ok(())
}
