//! `run` (a whole training run: dataset and epochs) and `plan.freeze` (PipeTransformer's
//! freezing over it), with what freezing's elastic pipelines need of the plan.

use super::keys;
use super::reader::{Obj, Result, invalid, show};
use super::suggest::did_you_mean;
use crate::hardware::ClusterSpec;
use crate::plan::Plan;
use crate::workload::Workload;
use serde::Serialize;
use serde_json::Value;

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunSpec {
    pub dataset_samples: u64,
    pub epochs: u32,
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

/// `run`: {"dataset_samples": N, "epochs": E}.
pub(super) fn parse_run(root: &Obj) -> Result<Option<RunSpec>> {
    let run = match root.obj("run")? {
        None => None,
        Some(r) => {
            r.only(keys::RUN)?;
            let samples = match r.get("dataset_samples") {
                Some(v) => v.as_u64().filter(|n| *n > 0).ok_or_else(|| {
                    invalid(&r.key("dataset_samples"), format!("expected a positive integer, got {}", show(v)))
                })?,
                None => return Err(invalid(&r.key("dataset_samples"), "required key is missing")),
            };
            Some(RunSpec { dataset_samples: samples, epochs: r.req("epochs", Obj::uint)? })
        }
    };
    Ok(run)
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
    if run.is_none() {
        return Err(invalid(
            &f.key("policy"),
            "freezing acts over a training run: add \"run\": {\"dataset_samples\": N, \"epochs\": E}",
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
    Ok(())
}
