//! Pipeline partitioning policies and BaPipe's exploration through the scenario and the CLI.

use crate::util::{TempDir, run_cli, scenario, simulate};
use serde_json::json;

fn training(mb: u32) -> serde_json::Value {
    json!({"global_batch": 32, "micro_batch": mb, "seq_len": 1024, "precision": "fp16", "optimizer": "adam"})
}

fn gpt(layers: u32) -> serde_json::Value {
    json!({"transformer": {"layers": layers, "hidden": 1024, "heads": 16, "vocab": 50257}})
}

/// With a heavy head on the last stage, the balanced partition moves layers off it and runs
/// no slower than the uniform one; its stages cover every layer.
#[test]
fn balanced_partition_beats_uniform_with_a_heavy_head() {
    let uniform = simulate(&scenario(gpt(16), 1, training(1), json!({"dp": 1, "pp": 8, "partition": "uniform"})));
    let balanced = simulate(&scenario(gpt(16), 1, training(1), json!({"dp": 1, "pp": 8, "partition": "balanced"})));
    assert_eq!(balanced.plan.partition.iter().sum::<u32>(), 16);
    assert!(balanced.plan.partition.last() < uniform.plan.partition.last(), "{:?}", balanced.plan.partition);
    assert!(balanced.iteration_s <= uniform.iteration_s * 1.001, "{} vs {}", balanced.iteration_s, uniform.iteration_s);
}

/// A mixture-of-experts model's layers hold their routed experts split over the
/// expert-parallel group and their optimizer states split by ZeRO, as the simulation keeps
/// them: the balanced partition of Qwen3-30B-A3B (128 experts, a 152k-entry head) over 4 stages
/// of expert-parallel H100s fits and moves layers off the head's stage. Until session 22 the
/// partitioner counted every expert on every device, found no partition that fits, and kept
/// the uniform one without a word.
#[test]
fn balanced_partition_of_a_mixture_of_experts_model_splits_its_experts() {
    let run = |partition: &str| {
        simulate(&format!(
            r#"{{"workload": {{"preset": "qwen3-30b-a3b"}}, "cluster": {{"node": "dgx-h100", "nodes": 2}},
                "training": {{"global_batch": 64, "micro_batch": 1, "seq_len": 4096, "precision": "bf16", "optimizer": "adam"}},
                "plan": {{"dp": 4, "pp": 4, "ep": 4, "zero_stage": 1, "recompute": "full", "partition": "{partition}"}}}}"#
        ))
    };
    let (uniform, balanced) = (run("uniform"), run("balanced"));
    assert!(balanced.fits, "{:?}", balanced.plan.partition);
    assert_eq!(balanced.plan.partition.iter().sum::<u32>(), 48);
    assert!(balanced.plan.partition.last() < uniform.plan.partition.last(), "{:?}", balanced.plan.partition);
    assert!(balanced.iteration_s < uniform.iteration_s, "{} vs {}", balanced.iteration_s, uniform.iteration_s);
}

#[test]
fn parameters_partition_covers_every_layer() {
    let r = simulate(&scenario(gpt(16), 1, training(1), json!({"dp": 1, "pp": 8, "partition": "parameters"})));
    assert_eq!(r.plan.partition.len(), 8);
    assert_eq!(r.plan.partition.iter().sum::<u32>(), 16);
    assert!(r.plan.partition.iter().all(|&n| n >= 1));
}

#[test]
fn partition_command_explores_and_writes_the_best_plan() {
    let dir = TempDir::new("partition");
    let s = dir.write("s.json", &scenario(gpt(8), 1, training(2), json!({"dp": 1, "pp": 8})));
    let out_path = dir.path().join("best.json");
    let out =
        run_cli(&["partition", s.to_str().expect("utf-8"), "--json", "--write", out_path.to_str().expect("utf-8")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let best = &v["best"];
    for k in ["schedule", "micro_batches", "stages", "time_per_sample_s"] {
        assert!(!best[k].is_null(), "best.{k} missing");
    }
    let stages = best["stages"].as_array().expect("stages");
    assert_eq!(stages.len(), 8);
    for k in ["first_layer", "last_layer", "time_s", "memory_bytes"] {
        assert!(!stages[0][k].is_null(), "stages[].{k} missing");
    }
    // The best is the fastest fitting candidate.
    let t = best["time_per_sample_s"].as_f64().expect("t");
    for c in v["candidates"].as_array().expect("candidates") {
        if c["fits"] == true {
            assert!(c["time_per_sample_s"].as_f64().expect("t") >= t);
        }
    }
    // The written plan runs as a scenario.
    let again = run_cli(&["simulate", out_path.to_str().expect("utf-8"), "--json"]);
    assert!(again.status.success(), "{}", String::from_utf8_lossy(&again.stderr));
}

/// `"partition": "explore"` simulates the plan `trainsim partition` finds best.
#[test]
fn explore_key_runs_the_best_explored_plan() {
    let text = scenario(gpt(8), 1, training(2), json!({"dp": 1, "pp": 8, "partition": "explore"}));
    let r = simulate(&text);
    let mut v: serde_json::Value = serde_json::from_str(&text).expect("json");
    v["plan"]["partition"] = json!("balanced");
    let s = sim::scenario::parse(&v.to_string(), &|_| Err("no files".into())).expect("valid");
    let e = sim::partition::explore(&s);
    let best = e.best.expect("a plan fits");
    assert_eq!(r.plan.schedule, best.schedule);
    assert_eq!(r.plan.micro_batch, best.micro_batch);
    assert!(
        (r.iteration_s - best.iteration_s).abs() <= 1e-9 * best.iteration_s,
        "{} vs {}",
        r.iteration_s,
        best.iteration_s
    );
}

/// A heterogeneous cluster: the balanced partition gives the faster boards more of the work,
/// and a stage may not mix device kinds.
#[test]
fn heterogeneous_clusters_are_partitioned_by_device_speed() {
    let text = |overrides: serde_json::Value, pp: u32| {
        json!({
            "workload": {"transformer": {"layers": 16, "hidden": 1024, "heads": 16, "vocab": 1024}},
            "cluster": {"nodes": 1, "node": {"preset": "dgx-1-v100"}, "device_overrides": overrides},
            "training": {"global_batch": 32, "micro_batch": 1, "seq_len": 1024, "precision": "fp16"},
            "plan": {"dp": 8 / pp, "pp": pp, "partition": "balanced"}
        })
        .to_string()
    };
    // Stages 4-7 on A100s (2.5x the V100's fp16 tensor rate).
    let r = simulate(&text(json!([{"devices": [4, 7], "device": "a100-sxm-80gb"}]), 8));
    let p = &r.plan.partition;
    let (slow, fast): (u32, u32) = (p[..4].iter().sum(), p[4..].iter().sum());
    assert!(fast > slow, "A100 stages got {fast} layers, V100 stages {slow}: {p:?}");
    let err =
        sim::scenario::parse(&text(json!([{"devices": [3, 7], "device": "a100-sxm-80gb"}]), 4), &|_| Err("x".into()))
            .expect_err("stage 1 mixes V100 and A100");
    assert_eq!(err.path, "cluster.device_overrides");
}

/// The exploration simulates only each schedule's most promising plans (ranked by the
/// partition objective), and its best is within 1% of an exhaustive exploration's on pipelines
/// whose micro-batch size matters.
#[test]
fn ranked_exploration_matches_the_exhaustive_one() {
    for (layers, pp, batch) in [(8, 8, 32), (16, 8, 64), (24, 8, 96)] {
        let t =
            json!({"global_batch": batch, "micro_batch": 1, "seq_len": 1024, "precision": "fp16", "optimizer": "adam"});
        let text = scenario(gpt(layers), 1, t, json!({"dp": 1, "pp": pp, "partition": "balanced"}));
        let s = sim::scenario::parse(&text, &|_| Err("no files".into())).expect("valid");
        let ranked = sim::partition::explore(&s);
        let all = sim::partition::explore_with(&s, usize::MAX);
        assert_eq!(all.candidates.len(), all.explored, "exhaustive simulates every plan");
        let limit = 3 * sim::partition::SIMULATED_PER_SCHEDULE;
        assert!(
            ranked.candidates.len() <= limit && ranked.candidates.len() < ranked.explored,
            "{}",
            ranked.candidates.len()
        );
        let (r, a) = (ranked.best.expect("ranked fits"), all.best.expect("exhaustive fits"));
        assert!(
            r.time_per_sample_s <= 1.01 * a.time_per_sample_s,
            "{layers} layers, pp {pp}: ranked {} vs exhaustive {}",
            r.time_per_sample_s,
            a.time_per_sample_s
        );
    }
}
