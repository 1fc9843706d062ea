//! Regressions of the commands built on policies (train-run, partition, capacity): inputs that
//! panicked or misreported (copies of `shared/regressions` in `tests/data/regressions`) end in
//! a sane report or a clear error.

use crate::util::{TempDir, repo, run_cli, stderr, stdout};
use serde_json::{Value, json};

fn regression(name: &str) -> String {
    repo(&format!("tests/data/regressions/{name}")).to_str().expect("utf-8 path").to_string()
}

/// Runs a command with `--json`; asserts it did not panic and returns (exit ok, JSON or null,
/// stderr).
fn json_cmd(args: &[&str]) -> (bool, Value, String) {
    let mut all: Vec<&str> = args.to_vec();
    all.push("--json");
    let o = run_cli(&all);
    let err = stderr(&o);
    assert!(!err.contains("panicked"), "{args:?} panicked:\n{err}");
    assert!(o.status.code().is_some(), "{args:?} was killed by a signal:\n{err}");
    let v = serde_json::from_str(&stdout(&o)).unwrap_or(Value::Null);
    (o.status.success(), v, err)
}

fn positive_finite(v: &Value, what: &str) -> f64 {
    let x = v.as_f64().unwrap_or_else(|| panic!("{what} is not a number: {v}"));
    assert!(x.is_finite() && x > 0.0, "{what} = {x}");
    x
}

/// A training run whose every number is finite and positive, with one entry per epoch.
fn assert_sane_run(r: &Value, epochs: usize) {
    let e = r["epochs"].as_array().expect("epochs");
    assert_eq!(e.len(), epochs);
    for ep in e {
        positive_finite(&ep["iteration_s"], "iteration_s");
        positive_finite(&ep["samples_per_s"], "samples_per_s");
        assert!(ep["pipeline_length"].as_u64().expect("K") >= 1);
        assert!(ep["replicas"].as_u64().expect("R") >= 1);
    }
    positive_finite(&r["total_s"], "total_s");
    positive_finite(&r["baseline_total_s"], "baseline_total_s");
    positive_finite(&r["speedup"], "speedup");
    assert!(r["plan_changes"].is_array(), "plan_changes missing: {r}");
}

/// Freezing with each partition policy: the policy partitions the active layers only.
#[test]
fn freezing_with_a_partition_policy_runs() {
    for name in ["b_min_parameters.json", "b_min_balanced.json", "b_min_explore.json"] {
        let (ok, r, err) = json_cmd(&["train-run", &regression(name)]);
        assert!(ok, "{name}: {err}");
        assert_sane_run(&r, 1);
    }
    let (ok, r, err) = json_cmd(&["train-run", &regression("vit_trainrun_orig.json")]);
    assert!(ok, "{err}");
    assert_sane_run(&r, 10);
    // AutoPipe shortened the pipeline and AutoDP added replicas: both are listed.
    let keys: Vec<&str> =
        r["plan_changes"].as_array().expect("list").iter().filter_map(|c| c["key"].as_str()).collect();
    assert!(keys.contains(&"plan.pp") && keys.contains(&"plan.dp"), "{keys:?}");
}

/// Pipeline depths the elastic schedule cannot take are refused when the scenario is read.
#[test]
fn freezing_checks_the_pipeline_depth_at_read() {
    for (name, allowed) in [("freeze_k0_exceeds_node.json", "<= 2"), ("freeze_k0_not_pow2.json", "power of two")] {
        let (ok, _, err) = json_cmd(&["train-run", &regression(name)]);
        assert!(!ok, "{name} was accepted");
        assert!(err.contains("plan.pp") && err.contains(allowed), "{name}: {err}");
    }
}

fn pipelined(plan: Value, run: bool) -> Value {
    let mut v = json!({
        "workload": {"transformer": {"layers": 8, "hidden": 512, "heads": 8, "vocab": 1024}},
        "cluster": {"node": "dgx-a100-80gb", "nodes": 1},
        "training": {"global_batch": 32, "micro_batch": 2, "seq_len": 256, "precision": "bf16"},
        "plan": plan,
    });
    if run {
        v["run"] = json!({"dataset_samples": 3200, "epochs": 2});
    }
    v
}

/// Without freezing, train-run runs the plan as written (tp, schedule, micro-batches) and
/// says nothing changed; its iteration is simulate's.
#[test]
fn train_run_without_freezing_keeps_the_plan() {
    let dir = TempDir::new("keep-plan");
    let plan = json!({"dp": 2, "tp": 2, "pp": 2, "schedule": "1f1b"});
    let path = dir.write("s.json", &pipelined(plan, true).to_string());
    let (ok, r, err) = json_cmd(&["train-run", path.to_str().expect("utf-8")]);
    assert!(ok, "{err}");
    assert_sane_run(&r, 2);
    assert_eq!(r["plan_changes"], json!([]));
    let (ok, sim, err) = json_cmd(&["simulate", path.to_str().expect("utf-8")]);
    assert!(ok, "{err}");
    for e in r["epochs"].as_array().expect("epochs") {
        assert_eq!(e["pipeline_length"], 2);
        assert_eq!(e["replicas"], 2);
        assert_eq!(e["micro_batches"], 8);
        assert_eq!(e["iteration_s"], sim["iteration_s"]);
    }
    // The human output says so too.
    let o = run_cli(&["train-run", path.to_str().expect("utf-8")]);
    assert!(stdout(&o).contains("as written"), "{}", stdout(&o));
}

/// Freezing with AutoPipe: the changes are listed with the value as written and the reason.
#[test]
fn train_run_lists_what_freezing_changed() {
    let dir = TempDir::new("changes");
    let plan = json!({"dp": 2, "pp": 4, "schedule": "1f1b",
        "freeze": {"policy": "schedule", "frozen_layers": [0, 6]}});
    let path = dir.write("s.json", &pipelined(plan, true).to_string());
    let (ok, r, err) = json_cmd(&["train-run", path.to_str().expect("utf-8")]);
    assert!(ok, "{err}");
    assert_sane_run(&r, 2);
    let changes = r["plan_changes"].as_array().expect("list");
    let pp = changes.iter().find(|c| c["key"] == "plan.pp").expect("plan.pp changed");
    assert_eq!(pp["from"], 4);
    assert!(pp["why"].as_str().expect("why").contains("AutoPipe"));
    let ks: Vec<u64> =
        r["epochs"].as_array().expect("e").iter().map(|e| e["pipeline_length"].as_u64().expect("K")).collect();
    assert_eq!(ks[0], 4);
    assert!(ks[1] < 4, "{ks:?}");
    let o = run_cli(&["train-run", path.to_str().expect("utf-8")]);
    assert!(stdout(&o).contains("plan change:  plan.pp 4 ->"), "{}", stdout(&o));
}

/// Interleaved scenarios explore their own schedule; the written plan keeps its virtual stages
/// and simulates.
#[test]
fn partition_handles_interleaved_schedules() {
    let (ok, e, err) = json_cmd(&["partition", &regression("partition_interleaved.json")]);
    assert!(ok, "{err}");
    assert!(e["best"]["fits"].as_bool().expect("fits"));
    let dir = TempDir::new("interleaved");
    let out = dir.path().join("best.json");
    let src = repo("experiments/parallelism/gpt3-6.7b-pp-interleaved.json");
    let (ok, e, err) = json_cmd(&["partition", src.to_str().expect("utf-8"), "--write", out.to_str().expect("utf-8")]);
    assert!(ok, "{err}");
    let interleaved: Vec<&Value> =
        e["candidates"].as_array().expect("c").iter().filter(|c| c["schedule"] == "interleaved").collect();
    assert!(!interleaved.is_empty());
    for c in &interleaved {
        assert_eq!(c["virtual_stages"], 2);
        assert_eq!(c["partition"].as_array().expect("p").len(), 16);
    }
    let (ok, r, err) = json_cmd(&["simulate", out.to_str().expect("utf-8")]);
    assert!(ok, "{err}");
    assert_eq!(r["fits"], true);
    positive_finite(&e["best"]["iteration_s"], "best iteration");
    assert!((r["iteration_s"].as_f64().expect("t") - e["best"]["iteration_s"].as_f64().expect("t")).abs() < 1e-9);
}

/// A Llama 3 70B 1F1B plan at 8K tokens that simulate accepts: partition finds a fitting plan
/// and writes it; the written plan fits when simulated.
#[test]
fn partition_finds_what_simulate_accepts() {
    let src = repo("experiments/parallelism/llama3-70b-pp-1f1b-8k.json");
    let (ok, r, err) = json_cmd(&["simulate", src.to_str().expect("utf-8")]);
    assert!(ok, "{err}");
    assert_eq!(r["fits"], true);
    let dir = TempDir::new("llama70");
    let out = dir.path().join("best.json");
    let (ok, e, err) = json_cmd(&["partition", src.to_str().expect("utf-8"), "--write", out.to_str().expect("utf-8")]);
    assert!(ok, "{err}");
    assert_eq!(e["best"]["fits"], true);
    // Every candidate's fit is the simulator's: a fitting one has every chunk under capacity.
    let cap = 80.0 * 1024f64.powi(3);
    for c in e["candidates"].as_array().expect("c") {
        let worst = c["stages"]
            .as_array()
            .expect("s")
            .iter()
            .map(|s| s["memory_bytes"].as_f64().expect("m"))
            .fold(0.0, f64::max);
        assert_eq!(c["fits"].as_bool().expect("fits"), worst <= cap, "{c}");
    }
    let (ok, w, err) = json_cmd(&["simulate", out.to_str().expect("utf-8")]);
    assert!(ok, "{err}");
    assert_eq!(w["fits"], true);
}

/// When nothing fits, partition says so, exits non-zero and writes nothing.
#[test]
fn partition_with_no_fitting_plan_is_an_error() {
    let dir = TempDir::new("nofit");
    let v = json!({
        "workload": {"preset": "llama3-70b"},
        "cluster": {"node": "dgx-a100-80gb", "nodes": 1},
        "training": {"global_batch": 8, "micro_batch": 1, "seq_len": 8192, "precision": "bf16"},
        "plan": {"dp": 1, "tp": 4, "pp": 2, "schedule": "1f1b"}
    });
    let path = dir.write("s.json", &v.to_string());
    let out = dir.path().join("never.json");
    let o = run_cli(&["partition", path.to_str().expect("utf-8"), "--write", out.to_str().expect("utf-8")]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.contains("no plan fits") && err.contains("nothing written"), "{err}");
    assert!(!stdout(&o).contains("written:"), "{}", stdout(&o));
    assert!(!out.exists());
}

/// Capacity on a pipelined scenario: an answer for every policy, no panic.
#[test]
fn capacity_runs_on_pipelined_scenarios() {
    let src = repo("experiments/parallelism/gpt3-6.7b-pp-1f1b.json");
    let (ok, r, err) = json_cmd(&["capacity", src.to_str().expect("utf-8"), "--vary", "params"]);
    assert!(ok, "{err}");
    let policies = r["policies"].as_array().expect("policies");
    assert_eq!(policies.len(), 7);
    for p in policies {
        // 16 A100 80GB hold at least the scenario's own 6.7B model.
        assert!(p["max_params"].as_f64().expect("params") > 6e9, "{p}");
        positive_finite(&p["samples_per_s"], "samples_per_s");
    }
}

/// Llama 3 405B's 126 layers on 16 interleaved stages: Meta's uneven chunks as written, and
/// the same as the default, stated in defaults_applied; a list with the wrong sum is refused.
#[test]
fn interleaved_chunks_may_be_uneven() {
    let src = repo("experiments/parallelism/llama3-405b-interleaved.json");
    let (ok, r, err) = json_cmd(&["simulate", src.to_str().expect("utf-8")]);
    assert!(ok, "{err}");
    assert_eq!(r["fits"], true);
    let p: Vec<u64> = r["plan"]["partition"].as_array().expect("p").iter().map(|x| x.as_u64().expect("n")).collect();
    assert_eq!(p.len(), 64);
    assert_eq!((p[0], p[63], p.iter().sum::<u64>()), (1, 1, 126));
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&src).expect("read")).expect("json");
    v["plan"].as_object_mut().expect("plan").remove("partition");
    let dir = TempDir::new("405b");
    let path = dir.write("default.json", &v.to_string());
    let (ok, d, err) = json_cmd(&["simulate", path.to_str().expect("utf-8")]);
    assert!(ok, "{err}");
    assert_eq!(d["plan"]["partition"], r["plan"]["partition"]);
    let defaults = d["defaults_applied"].to_string();
    assert!(defaults.contains("plan.partition = uneven"), "{defaults}");
    v["plan"]["partition"] = json!(vec![2; 64]);
    let path = dir.write("wrong-sum.json", &v.to_string());
    let (ok, _, err) = json_cmd(&["simulate", path.to_str().expect("utf-8")]);
    assert!(!ok);
    assert!(err.contains("plan.partition") && err.contains("summing to 126"), "{err}");
}

/// Without virtual stages too, layers the stages do not divide leave the ends short (the
/// first stage carries the embedding, the last the head and the loss): DeepSeek-V3's 61
/// layers over 16 stages are 3, 3, 4, ..., 4, 3, stated in defaults_applied; until session 22
/// the extra layers went to the last stages, beside the head. `"uniform"` still does that.
#[test]
fn uneven_stages_leave_the_ends_short_by_default() {
    let text = |partition: Option<&str>| {
        let mut v = json!({"workload": {"preset": "deepseek-v3"}, "cluster": {"node": "dgx-h100", "nodes": 128},
            "training": {"global_batch": 1024, "micro_batch": 1, "seq_len": 4096, "precision": "bf16"},
            "plan": {"dp": 64, "pp": 16, "ep": 64, "zero_stage": 1, "recompute": "full"}});
        if let Some(p) = partition {
            v["plan"]["partition"] = json!(p);
        }
        v.to_string()
    };
    let s = sim::scenario::parse(&text(None), &|_| Err("no files".into())).expect("valid");
    let mut want = vec![4u32; 16];
    for c in [0, 1, 15] {
        want[c] = 3;
    }
    assert_eq!(s.plan.partition, want);
    assert!(s.defaults_applied.iter().any(|d| d.contains("plan.partition = uneven")), "{:?}", s.defaults_applied);
    let u = sim::scenario::parse(&text(Some("uniform")), &|_| Err("no files".into())).expect("valid");
    assert_eq!(u.plan.partition[..3], [3, 3, 3]);
    assert_eq!(u.plan.partition[15], 4);
}
