//! Physical possibility of a report printed with exit 0, per command. Each failed check is
//! named; the name is the bug's signature.
//!
//! The compute lower bound: the report has no `compute_lower_bound_s`, so it is built from
//! `model_flops_per_iteration` and `devices` (report keys) and the fastest device's peak at
//! the training precision (from the scenario and the preset catalog), and independently from
//! 6 x matmul parameters x tokens (see `bound.rs`).

use crate::bound::Context;
use serde_json::Value;

/// Relative slack for float comparisons of quantities the report computes in other orders.
const REL: f64 = 1e-6;
/// The simulator's clock counts u64 nanoseconds: 2^64 ns is about 1.84e10 s.
const CLOCK_LIMIT_S: f64 = 1.8e10;

type Check = Result<(), String>;

fn fail(msg: impl Into<String>) -> Check {
    Err(msg.into())
}

fn f(v: &Value, k: &str) -> Option<f64> {
    v.get(k).and_then(Value::as_f64)
}

/// Keys that hold a quantity: a number >= 0 (serde_json prints NaN and infinities as null).
fn is_quantity(k: &str) -> bool {
    ["_s", "_bytes", "_per_s", "_per_iteration", "_per_device", "_fraction", "mfu", "_utilization"]
        .iter()
        .any(|s| k.ends_with(s))
        || matches!(k, "parameters" | "speedup" | "max_params" | "bytes")
}

/// Every quantity in the report is a finite number >= 0 (paths with `[]` for indices); every
/// number in a `*_breakdown` object is one.
fn quantities(v: &Value, path: &str) -> Check {
    match v {
        Value::Object(m) => {
            let breakdown = path.ends_with("_breakdown");
            for (k, x) in m {
                let p = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                if breakdown || is_quantity(k) {
                    match x {
                        Value::Number(n) if n.as_f64().is_some_and(|y| y.is_finite() && y >= 0.0) => {}
                        Value::Number(_) => return fail(format!("negative {p}")),
                        Value::Null => return fail(format!("{p} is null (NaN or infinite?)")),
                        _ => {}
                    }
                }
                quantities(x, &p)?;
            }
        }
        Value::Array(a) => {
            for x in a {
                quantities(x, &format!("{path}[]"))?;
            }
        }
        _ => {}
    }
    Ok(())
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= REL * a.abs().max(b.abs()) + 1e-12
}

fn simulate(r: &Value, ctx: &Context) -> Check {
    let Some(it) = f(r, "iteration_s") else { return fail("no iteration_s") };
    if it <= 0.0 {
        return fail("iteration_s <= 0");
    }
    if it >= CLOCK_LIMIT_S {
        return fail("iteration_s at the nanosecond clock's limit");
    }
    if let Some(m) = f(r, "mfu") {
        if m > 1.0 + 1e-9 {
            return fail("mfu > 1");
        }
        if m <= 0.0 {
            return fail("mfu <= 0");
        }
    }
    if f(r, "network_flops_utilization").is_some_and(|u| u > 1.0 + 1e-9) {
        return fail("network_flops_utilization > 1");
    }
    if f(r, "bubble_fraction").is_some_and(|b| b > 1.0 + 1e-9) {
        return fail("bubble_fraction > 1");
    }
    let devices = r.get("devices").and_then(Value::as_u64);
    if let (Some(d), Some(want)) = (devices, ctx.devices)
        && d as u128 != want
    {
        return fail("devices differ from nodes x devices per node");
    }
    if let (Some(flops), Some(d), Some(peak)) = (f(r, "model_flops_per_iteration"), devices, ctx.peak_flops)
        && it < flops / (d as f64 * peak) * (1.0 - REL)
    {
        return fail("iteration_s below model_flops_per_iteration / (devices x peak)");
    }
    if let (Some(flops), Some(d), Some(peak)) = (ctx.min_flops, ctx.devices, ctx.peak_flops)
        && it < flops / (d as f64 * peak) * (1.0 - REL)
    {
        return fail("iteration_s below 6 x matmul parameters x tokens / (devices x peak)");
    }
    if let (Some(sps), Some(gb)) = (f(r, "samples_per_s"), ctx.global_batch)
        && !close(sps * it, gb as f64)
    {
        return fail("samples_per_s x iteration_s != global_batch");
    }
    for s in r.get("stages").and_then(Value::as_array).into_iter().flatten() {
        let busy = f(s, "compute_busy_s").unwrap_or(0.0);
        let bubble = f(s, "bubble_s").unwrap_or(0.0);
        if busy > it * (1.0 + REL) {
            return fail("stages[].compute_busy_s > iteration_s");
        }
        if bubble > it * (1.0 + REL) {
            return fail("stages[].bubble_s > iteration_s");
        }
    }
    if r.get("fits_hbm") == Some(&Value::Bool(true))
        && let (Some(peak), Some(cap)) = (f(r, "peak_memory_bytes"), f(r, "memory_capacity_bytes"))
        && peak > cap * (1.0 + REL)
    {
        return fail("fits_hbm with peak_memory_bytes above memory_capacity_bytes");
    }
    Ok(())
}

fn train_run(r: &Value, ctx: &Context) -> Check {
    let total = f(r, "total_s").unwrap_or(0.0);
    if total <= 0.0 || f(r, "baseline_total_s").unwrap_or(0.0) <= 0.0 {
        return fail("total_s or baseline_total_s <= 0");
    }
    let epochs = r.get("epochs").and_then(Value::as_array).cloned().unwrap_or_default();
    if let Some(n) = ctx.epochs
        && epochs.len() as u64 != n
    {
        return fail("epochs[] length differs from run.epochs");
    }
    let mut sum = 0.0;
    for e in &epochs {
        let it = f(e, "iteration_s").unwrap_or(0.0);
        if it <= 0.0 || it >= CLOCK_LIMIT_S {
            return fail("epochs[].iteration_s <= 0 or at the clock's limit");
        }
        if f(e, "epoch_s").unwrap_or(0.0) < it * (1.0 - REL) {
            return fail("epochs[].epoch_s shorter than one iteration");
        }
        sum += f(e, "epoch_s").unwrap_or(0.0);
        if let (Some(f), Some(l)) = (e.get("frozen_layers").and_then(Value::as_u64), ctx.layers)
            && f > l
        {
            return fail("epochs[].frozen_layers > layers");
        }
        // With nothing frozen yet, the plan is the user's.
        // (A policy the user asked for may change it, and then says so in plan_changes.)
        let changes = r.get("plan_changes").and_then(Value::as_array).is_some_and(|c| !c.is_empty());
        if !changes && e.get("frozen_layers").and_then(Value::as_u64) == Some(0) {
            let g = |k: &str| e.get(k).and_then(Value::as_u64);
            if ctx.pp.is_some() && g("pipeline_length") != ctx.pp
                || ctx.dp.is_some() && g("replicas") != ctx.dp
                || ctx.micro_batches.is_some() && g("micro_batches") != ctx.micro_batches
            {
                return fail("train-run changed pp, dp or micro-batches with no layer frozen");
            }
        }
    }
    // The run fits where every epoch's plan does; an epoch that fits has its peak within its
    // device's memory less the allocator's headroom.
    let fits = |v: &Value| v.get("fits").and_then(Value::as_bool);
    if let Some(all) = fits(r)
        && all != epochs.iter().all(|e| fits(e) != Some(false))
    {
        return fail("train-run fits disagrees with its epochs' fits");
    }
    for e in &epochs {
        if let (Some(true), Some(peak), Some(cap), Some(head)) =
            (fits(e), f(e, "peak_memory_bytes"), f(e, "memory_capacity_bytes"), f(e, "memory_headroom_bytes"))
            && peak > (cap - head) * (1.0 + REL)
        {
            return fail("an epoch that fits peaks above its device's usable memory");
        }
    }
    if !epochs.is_empty() && sum > total * (1.0 + REL) + 1e-9 && !close(sum, total) {
        // Caching and transitions can only add to the epochs' time, never remove from it.
        return fail("sum of epochs[].epoch_s > total_s");
    }
    if let (Some(s), Some(b)) = (f(r, "speedup"), f(r, "baseline_total_s"))
        && !close(s, b / total)
    {
        return fail("speedup != baseline_total_s / total_s");
    }
    whole_run(r, total, ctx.jitter)
}

/// The whole run's keys: a number, or {p50, p90, mean} over several runs.
fn whole_run(r: &Value, total: f64, jitter: bool) -> Check {
    let stat = |k: &str| r.get(k).and_then(|v| v.as_f64().or_else(|| f(v, "p50")));
    let Some(days) = stat("wall_days") else { return fail("train-run without wall_days") };
    if !days.is_finite() || (!jitter && days * 86400.0 < total * (1.0 - REL)) {
        return fail("wall_days shorter than the run's useful time (total_s)");
    }
    match stat("goodput") {
        Some(g) if g > 0.0 && g <= 1.0 + REL => {}
        _ => return fail("goodput outside (0, 1]"),
    }
    if stat("interruptions").is_none_or(|n| n < 0.0 || !n.is_finite()) {
        return fail("interruptions missing, negative or not finite");
    }
    if let (Some(h), Some(n)) = (stat("gpu_hours"), f(r, "devices"))
        && r.get("runs").and_then(Value::as_u64) == Some(1)
        && !close(h, days * 24.0 * n)
    {
        return fail("gpu_hours != wall_days x 24 x devices");
    }
    Ok(())
}

fn partition(r: &Value, ctx: &Context) -> Check {
    let mut all: Vec<&Value> = r.get("candidates").and_then(Value::as_array).into_iter().flatten().collect();
    all.extend(r.get("best").filter(|b| !b.is_null()));
    for c in all {
        let it = f(c, "iteration_s").unwrap_or(0.0);
        if it <= 0.0 || it >= CLOCK_LIMIT_S {
            return fail("candidate iteration_s <= 0 or at the clock's limit");
        }
        if let (Some(tps), Some(gb)) = (f(c, "time_per_sample_s"), ctx.global_batch)
            && !close(tps * gb as f64, it)
        {
            return fail("time_per_sample_s x global_batch != iteration_s");
        }
        let stages = c.get("stages").and_then(Value::as_array).cloned().unwrap_or_default();
        let mut next = 0;
        for s in &stages {
            if f(s, "time_s").unwrap_or(0.0) > it * (1.0 + REL) {
                return fail("stages[].time_s > iteration_s");
            }
            let (a, b) = (s.get("first_layer").and_then(Value::as_u64), s.get("last_layer").and_then(Value::as_u64));
            if a != Some(next) || b.is_none_or(|b| b < next) {
                return fail("stages[] are not contiguous from layer 0");
            }
            next = b.unwrap_or(0) + 1;
        }
        if let Some(l) = ctx.layers
            && !stages.is_empty()
            && next != l
        {
            return fail("stages[] do not end at the last layer");
        }
    }
    Ok(())
}

fn slices(r: &Value, ctx: &Context) -> Check {
    if f(r, "t_max_s").unwrap_or(0.0) <= 0.0 || f(r, "latency_s").unwrap_or(0.0) <= 0.0 {
        return fail("t_max_s or latency_s <= 0");
    }
    if f(r, "latency_s").unwrap_or(0.0) >= CLOCK_LIMIT_S {
        return fail("latency_s at the clock's limit");
    }
    for b in r.get("sub_batches").and_then(Value::as_array).into_iter().flatten() {
        let sum: u64 = b.get("slices").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_u64).sum();
        if ctx.seq_len.is_some_and(|s| s != sum) {
            return fail("sub_batches[].slices do not sum to seq_len");
        }
    }
    Ok(())
}

/// `nccl-test`: every size took a positive, finite time, and its bus bandwidth is its
/// algorithm bandwidth times nccl-tests' factor for the collective (at most 2(n-1)/n < 2).
fn nccl_test(r: &Value) -> Check {
    let results = r.get("results").and_then(Value::as_array).ok_or("no results")?;
    if results.is_empty() {
        return fail("no results");
    }
    for x in results {
        let t = f(x, "time_us").ok_or("time_us is null (NaN or infinite?)")?;
        if !(t > 0.0 && t.is_finite()) {
            return fail("time_us <= 0");
        }
        let (alg, bus) = (f(x, "algbw_GBps").unwrap_or(-1.0), f(x, "busbw_GBps").unwrap_or(-1.0));
        if !(alg >= 0.0 && bus >= 0.0) {
            return fail("negative or missing algbw_GBps or busbw_GBps");
        }
        if bus > 2.0 * alg * (1.0 + REL) + 1e-12 {
            return fail("busbw_GBps above twice algbw_GBps");
        }
    }
    Ok(())
}

/// A searched plan's degrees: dp x cp x tp x pp devices (missing keys count 1).
fn plan_devices(plan: &Value) -> u64 {
    ["dp", "cp", "tp", "pp"].iter().map(|k| plan.get(*k).and_then(Value::as_u64).unwrap_or(1)).product()
}

fn search(r: &Value) -> Check {
    let counts = |k: &str| r.get(k).and_then(Value::as_u64).unwrap_or(0);
    if counts("enumerated") != counts("invalid") + counts("pruned_memory") + counts("pruned_time") + counts("evaluated")
    {
        return fail("enumerated != invalid + pruned_memory + pruned_time + evaluated");
    }
    if counts("simulated") > counts("evaluated") || counts("failed") > counts("evaluated") {
        return fail("more plans simulated or failed than evaluated");
    }
    if counts("extrapolated") > counts("simulated") {
        return fail("more plans extrapolated than simulated");
    }
    if r.get("best").and_then(|b| b.get("extrapolated")).and_then(Value::as_bool) == Some(true) {
        return fail("the best plan was not confirmed by a full simulation");
    }
    let gpus: Vec<u64> =
        r.get("gpus_searched").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_u64).collect();
    let list = |k: &str| r.get(k).and_then(Value::as_array).cloned().unwrap_or_default();
    let (top, pareto) = (list("top"), list("pareto"));
    let best = r.get("best").filter(|b| !b.is_null());
    for c in top.iter().chain(&pareto).chain(best) {
        let it = f(c, "iteration_s").unwrap_or(0.0);
        if it <= 0.0 || it >= CLOCK_LIMIT_S {
            return fail("a searched plan's iteration_s <= 0 or at the clock's limit");
        }
        if f(c, "mfu").is_some_and(|m| m > 1.0) {
            return fail("a searched plan's mfu > 1");
        }
        if c.get("fits").is_some_and(|x| x != &Value::Bool(true)) {
            return fail("a listed plan does not fit");
        }
        if let Some(plan) = c.get("plan")
            && !gpus.is_empty()
            && !gpus.contains(&plan_devices(plan))
        {
            return fail("a searched plan's dp x cp x tp x pp is not a searched GPU count");
        }
    }
    if top.windows(2).any(|w| f(&w[0], "iteration_s") > f(&w[1], "iteration_s")) {
        return fail("top is not sorted by iteration_s");
    }
    match (best, top.first()) {
        (Some(b), Some(t)) if !close(f(b, "iteration_s").unwrap_or(0.0), f(t, "iteration_s").unwrap_or(0.0)) => {
            return fail("best is not the fastest of top");
        }
        (Some(_), None) | (None, Some(_)) => return fail("best and top disagree on whether a plan fits"),
        _ => {}
    }
    let pareto_ok = pareto.windows(2).all(|w| {
        f(&w[0], "iteration_s") <= f(&w[1], "iteration_s")
            && f(&w[0], "peak_memory_bytes") > f(&w[1], "peak_memory_bytes")
    });
    if !pareto_ok {
        return fail("pareto is not faster-first with falling peak memory");
    }
    Ok(())
}

/// The named check that `report` (from `command --json`) fails, if any.
pub fn check(command: &str, report: &Value, ctx: &Context) -> Check {
    quantities(report, "")?;
    match command {
        "simulate" => simulate(report, ctx),
        "train-run" => train_run(report, ctx),
        "partition" => partition(report, ctx),
        "slices" => slices(report, ctx),
        "search" => search(report),
        "nccl-test" => nccl_test(report),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sim(extra: Value) -> Value {
        let mut r = json!({"iteration_s": 2.0, "mfu": 0.4, "devices": 4, "model_flops_per_iteration": 8e15,
            "samples_per_s": 16.0, "stages": [{"compute_busy_s": 1.5, "bubble_s": 0.5, "peak_memory_bytes": 1e9}]});
        for (k, v) in extra.as_object().unwrap() {
            r[k] = v.clone();
        }
        r
    }

    #[test]
    fn nccl_test_results_need_a_positive_time_and_a_bus_bandwidth_within_twice_the_algorithm_s() {
        let row =
            |t: f64, alg: f64, bus: f64| json!({"size_bytes": 8, "time_us": t, "algbw_GBps": alg, "busbw_GBps": bus});
        assert_eq!(check("nccl-test", &json!({"results": [row(12.0, 1.0, 1.75)]}), &Context::default()), Ok(()));
        for (r, want) in [
            (json!({"results": []}), "no results"),
            (json!({"results": [row(0.0, 1.0, 1.0)]}), "time_us <= 0"),
            (json!({"results": [row(5.0, 1.0, 2.5)]}), "busbw_GBps above twice algbw_GBps"),
            (json!({"results": [row(5.0, -1.0, 0.0)]}), "negative or missing algbw_GBps or busbw_GBps"),
        ] {
            assert_eq!(check("nccl-test", &r, &Context::default()), Err(want.to_string()), "{r}");
        }
    }

    #[test]
    fn a_plausible_report_passes() {
        let ctx = Context { devices: Some(4), peak_flops: Some(1e15), global_batch: Some(32), ..Context::default() };
        assert_eq!(check("simulate", &sim(json!({})), &ctx), Ok(()));
    }

    #[test]
    fn each_impossible_number_is_named() {
        let ctx = Context { devices: Some(4), peak_flops: Some(1e15), global_batch: Some(32), ..Context::default() };
        let stage = |b: f64, u: f64| json!({"stages": [{"compute_busy_s": b, "bubble_s": u}]});
        for (extra, want) in [
            (json!({"mfu": 1.5}), "mfu > 1"),
            (json!({"mfu": null}), "mfu is null (NaN or infinite?)"),
            (json!({"iteration_s": -1.0}), "negative iteration_s"),
            (json!({"iteration_s": 0.0, "samples_per_s": 0.0}), "iteration_s <= 0"),
            (
                json!({"iteration_s": 1.9e10, "samples_per_s": 32.0 / 1.9e10}),
                "iteration_s at the nanosecond clock's limit",
            ),
            (json!({"devices": 2}), "devices differ from nodes x devices per node"),
            (
                json!({"model_flops_per_iteration": 1e16}),
                "iteration_s below model_flops_per_iteration / (devices x peak)",
            ),
            (stage(2.5, 0.0), "stages[].compute_busy_s > iteration_s"),
            (stage(1.5, 2.5), "stages[].bubble_s > iteration_s"),
            (
                json!({"memory_breakdown": {"weights": 1.0, "activations": -4.0}}),
                "negative memory_breakdown.activations",
            ),
            (json!({"samples_per_s": 10.0}), "samples_per_s x iteration_s != global_batch"),
            (
                json!({"fits_hbm": true, "peak_memory_bytes": 2e9, "memory_capacity_bytes": 1e9}),
                "fits_hbm with peak_memory_bytes above memory_capacity_bytes",
            ),
        ] {
            assert_eq!(check("simulate", &sim(extra.clone()), &ctx), Err(want.to_string()), "{extra}");
        }
        let bound = Context { min_flops: Some(1e17), ..ctx };
        assert_eq!(
            check("simulate", &sim(json!({})), &bound),
            Err("iteration_s below 6 x matmul parameters x tokens / (devices x peak)".into())
        );
    }

    #[test]
    fn train_run_keeps_the_plan_until_layers_freeze() {
        let ctx = Context { dp: Some(2), pp: Some(4), micro_batches: Some(8), layers: Some(12), ..Context::default() };
        let epoch = |frozen: u64, pp: u64| {
            json!({"epoch": 0, "epoch_s": 10.0, "iteration_s": 1.0, "frozen_layers": frozen,
            "pipeline_length": pp, "replicas": 2, "micro_batches": 8, "samples_per_s": 1.0, "transition_s": 0.0})
        };
        let run = |e: Vec<Value>| {
            json!({"total_s": 20.0, "baseline_total_s": 30.0, "speedup": 1.5, "epochs": e,
                "wall_days": 25.0 / 86400.0, "goodput": 0.8, "interruptions": 1, "gpu_hours": 25.0 / 3600.0 * 8.0,
                "devices": 8, "runs": 1})
        };
        assert_eq!(check("train-run", &run(vec![epoch(0, 4), epoch(6, 2)]), &ctx), Ok(()));
        assert_eq!(
            check("train-run", &run(vec![epoch(0, 2)]), &ctx),
            Err("train-run changed pp, dp or micro-batches with no layer frozen".into())
        );
        assert_eq!(check("train-run", &run(vec![epoch(13, 4)]), &ctx), Err("epochs[].frozen_layers > layers".into()));
        let mut fast = run(vec![epoch(0, 4)]);
        fast["wall_days"] = json!(10.0 / 86400.0);
        assert_eq!(
            check("train-run", &fast, &ctx),
            Err("wall_days shorter than the run's useful time (total_s)".into())
        );
        let mut both = run(vec![epoch(0, 4)]);
        both["fits"] = json!(true);
        both["epochs"][0]["fits"] = json!(true);
        both["epochs"][0]["peak_memory_bytes"] = json!(70.0);
        both["epochs"][0]["memory_capacity_bytes"] = json!(80.0);
        both["epochs"][0]["memory_headroom_bytes"] = json!(8.0);
        assert_eq!(check("train-run", &both, &ctx), Ok(()));
        both["epochs"][0]["peak_memory_bytes"] = json!(75.0);
        assert_eq!(
            check("train-run", &both, &ctx),
            Err("an epoch that fits peaks above its device's usable memory".into())
        );
        both["epochs"][0]["fits"] = json!(false);
        assert_eq!(check("train-run", &both, &ctx), Err("train-run fits disagrees with its epochs' fits".into()));
        let mut over = run(vec![epoch(0, 4)]);
        over["goodput"] = json!(1.5);
        assert_eq!(check("train-run", &over, &ctx), Err("goodput outside (0, 1]".into()));
    }

    #[test]
    fn partition_stages_cover_the_layers_within_the_iteration() {
        let ctx = Context { layers: Some(4), global_batch: Some(2), ..Context::default() };
        let cand = |last: u64, t: f64| {
            json!({"iteration_s": 2.0, "micro_batch": 1, "micro_batches": 2, "time_per_sample_s": 1.0,
            "stages": [{"first_layer": 0, "last_layer": 1, "time_s": t}, {"first_layer": 2, "last_layer": last, "time_s": 1.0}]})
        };
        assert_eq!(check("partition", &json!({"candidates": [cand(3, 1.0)], "best": null}), &ctx), Ok(()));
        assert_eq!(
            check("partition", &json!({"candidates": [cand(2, 1.0)]}), &ctx),
            Err("stages[] do not end at the last layer".into())
        );
        assert_eq!(
            check("partition", &json!({"candidates": [], "best": cand(3, 3.0)}), &ctx),
            Err("stages[].time_s > iteration_s".into())
        );
    }

    #[test]
    fn a_search_lists_fitting_plans_fastest_first() {
        let plan = |dp: u64, tp: u64| json!({"dp": dp, "tp": tp, "pp": 1});
        let row = |it: f64, peak: f64, dp: u64| json!({"iteration_s": it, "mfu": 0.4, "fits": true, "peak_memory_bytes": peak, "plan": plan(dp, 8 / dp)});
        let ok = json!({"enumerated": 10, "invalid": 1, "pruned_memory": 4, "pruned_time": 2, "evaluated": 3,
            "simulated": 2, "extrapolated": 1, "failed": 0, "gpus_searched": [8], "best": row(1.0, 9.0, 2),
            "top": [row(1.0, 9.0, 2), row(2.0, 5.0, 4)],
            "pareto": [{"iteration_s": 1.0, "peak_memory_bytes": 9.0, "plan": plan(2, 4)},
                       {"iteration_s": 2.0, "peak_memory_bytes": 5.0, "plan": plan(4, 2)}]});
        let ctx = Context::default();
        assert_eq!(check("search", &ok, &ctx), Ok(()));
        for (key, value, want) in [
            ("enumerated", json!(11), "enumerated != invalid + pruned_memory + pruned_time + evaluated"),
            ("simulated", json!(4), "more plans simulated or failed than evaluated"),
            ("extrapolated", json!(3), "more plans extrapolated than simulated"),
            (
                "best",
                json!({"iteration_s": 1.0, "fits": true, "extrapolated": true}),
                "the best plan was not confirmed by a full simulation",
            ),
            ("top", json!([row(2.0, 5.0, 4), row(1.0, 9.0, 2)]), "top is not sorted by iteration_s"),
            ("best", row(2.0, 5.0, 4), "best is not the fastest of top"),
            ("best", json!(null), "best and top disagree on whether a plan fits"),
            ("top", json!([row(1.0, 9.0, 3)]), "a searched plan's dp x cp x tp x pp is not a searched GPU count"),
            ("top", json!([{"iteration_s": 1.0, "mfu": 1.2, "fits": true}]), "a searched plan's mfu > 1"),
            ("top", json!([{"iteration_s": 1.0, "fits": false}]), "a listed plan does not fit"),
            (
                "pareto",
                json!([{"iteration_s": 1.0, "peak_memory_bytes": 5.0}, {"iteration_s": 2.0, "peak_memory_bytes": 9.0}]),
                "pareto is not faster-first with falling peak memory",
            ),
        ] {
            let mut bad = ok.clone();
            bad[key] = value;
            assert_eq!(check("search", &bad, &ctx), Err(want.into()), "{key}");
        }
    }
}
