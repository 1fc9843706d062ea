//! `train-run` over a whole run: its phases from the simulator, then failures, checkpoints
//! and restarts in seeded Monte Carlo runs.

use crate::util::{TempDir, num, repo, run_cli, scenario, small_transformer, stderr, stdout};
use serde_json::{Value, json};

fn whole(run: Value) -> String {
    let mut v: Value = serde_json::from_str(&scenario(
        small_transformer(4, 512, 8),
        1,
        json!({"global_batch": 32, "micro_batch": 4, "seq_len": 512, "precision": "bf16"}),
        json!({"dp": 2, "pp": 4, "schedule": "1f1b"}),
    ))
    .expect("json");
    v["run"] = run;
    v.to_string()
}

fn train_run(dir: &TempDir, text: &str, extra: &[&str]) -> (bool, Value, String) {
    let f = dir.write("run.json", text);
    let mut args = vec!["train-run", f.to_str().expect("utf-8"), "--json"];
    args.extend_from_slice(extra);
    let o = run_cli(&args);
    let v = if o.status.success() { serde_json::from_str(&stdout(&o)).expect("json") } else { Value::Null };
    (o.status.success(), v, stderr(&o))
}

/// With no failures and no variability the run takes its iterations times the simulated
/// iteration, exactly; the iterations are the tokens over the global batch's, rounded up.
#[test]
fn without_failures_the_run_is_iterations_times_the_iteration() {
    let dir = TempDir::new("whole-none");
    let tokens = 1e9f64;
    let (ok, r, err) = train_run(&dir, &whole(json!({"tokens": tokens})), &[]);
    assert!(ok, "{err}");
    let per = 32.0 * 512.0;
    assert_eq!(num(&r, "/iterations"), (tokens / per).ceil());
    let t = num(&r, "/epochs/0/iteration_s");
    // Exact up to the conversion to days.
    let (wall, expected) = (num(&r, "/wall_days") * 86400.0, num(&r, "/iterations") * t);
    assert!((wall - expected).abs() <= 1e-12 * expected, "{wall} vs {expected}");
    assert_eq!(num(&r, "/goodput"), 1.0);
    assert_eq!(num(&r, "/interruptions"), 0.0);
    assert!(r["checkpoint"]["interval_s"].is_null());
    // The same run given in iterations.
    let (ok, i, err) = train_run(&dir, &whole(json!({"iterations": num(&r, "/iterations")})), &[]);
    assert!(ok, "{err}");
    assert_eq!(i["wall_days"], r["wall_days"]);
}

/// Failures cost time; the same seed gives a byte-identical report, another seed another run;
/// several runs give percentiles.
#[test]
fn failures_cost_time_and_the_draws_are_seeded() {
    let dir = TempDir::new("whole-fail");
    // Failure rates high enough that a short run sees several interruptions.
    let run = |seed: u64| {
        json!({"iterations": 1000000, "seed": seed,
               "failures": {"preset": "llama3-2024", "gpu": 0.5},
               "checkpoint": {"interval_s": "optimal"}, "restart_s": 120})
    };
    let (ok, a, err) = train_run(&dir, &whole(run(1)), &[]);
    assert!(ok, "{err}");
    let useful = num(&a, "/total_s");
    assert!(num(&a, "/wall_days") * 86400.0 > useful);
    assert!(num(&a, "/interruptions") >= 1.0, "{a}");
    let g = num(&a, "/goodput");
    assert!(g > 0.0 && g < 1.0, "{g}");
    assert_eq!(a["failures"]["name"], "llama3-2024 (adjusted)");
    assert_eq!(a["checkpoint"]["optimal"], true);
    let f = dir.write("again.json", &whole(run(1)));
    let once = run_cli(&["train-run", f.to_str().expect("utf-8"), "--json"]);
    let twice = run_cli(&["train-run", f.to_str().expect("utf-8"), "--json"]);
    assert_eq!(once.stdout, twice.stdout, "same seed, same bytes");
    let (_, b, _) = train_run(&dir, &whole(run(2)), &[]);
    assert_ne!(a["wall_days"], b["wall_days"]);
    let mut jittery = run(1);
    jittery["variability"] = json!({"iteration_jitter": 0.5, "slow_node_probability": 0.2, "slow_node_slowdown": 0.5});
    let (ok, m, err) = train_run(&dir, &whole(jittery), &["--runs", "20", "--price-per-gpu-hour", "2.5"]);
    assert!(ok, "{err}");
    let (p50, p90) = (num(&m, "/wall_days/p50"), num(&m, "/wall_days/p90"));
    assert!(p50 <= p90 && p50 * 86400.0 > useful);
    assert!(num(&m, "/goodput/p90") <= 1.0 && num(&m, "/lost/slow_s") > 0.0, "{m}");
    let cost = num(&m, "/cost_dollars/mean");
    assert!((cost - 2.5 * num(&m, "/gpu_hours/mean")).abs() < 1e-6 * cost);
}

/// Freezing runs through the same engine: its report keeps the epochs, and with no failures
/// the wall time is the epochs' total.
#[test]
fn freezing_runs_through_the_whole_run_engine() {
    let vit = repo("experiments/pipetransformer/vit-b16-imagenet.json");
    let o = run_cli(&["train-run", vit.to_str().expect("utf-8"), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r: Value = serde_json::from_slice(&o.stdout).expect("json");
    let s = crate::util::parse(&std::fs::read_to_string(&vit).expect("read"));
    let direct = sim::run::training_run(&s);
    assert_eq!(num(&r, "/total_s"), direct.total_s);
    assert!((num(&r, "/wall_days") * 86400.0 - direct.total_s).abs() <= 1e-12 * direct.total_s);
    assert_eq!(r["epochs"].as_array().expect("epochs").len(), direct.epochs.len());
}

#[test]
fn bad_run_sections_are_refused_with_their_key() {
    let dir = TempDir::new("whole-bad");
    for (run, key) in [
        (json!({"tokens": 1e9, "epochs": 2}), "run.epochs"),
        (json!({"tokens": 1e9, "iterations": 5}), "run"),
        (json!({"epochs": 2}), "run"),
        (json!({"tokens": 1e9, "failures": "llama3"}), "run.failures"),
        (json!({"tokens": 1e9, "failures": {"gpu": 2.0}}), "run.failures.gpu"),
        (json!({"tokens": 1e9, "checkpoint": {"interval_s": "often"}}), "run.checkpoint.interval_s"),
        (
            json!({"tokens": 1e9, "variability": {"slow_node_probability": 1.5}}),
            "run.variability.slow_node_probability",
        ),
        (json!({"tokens": -1}), "run.tokens"),
        (json!({"tokens": 1e9, "variability": {"kernel_jitter": 2.0}}), "run.variability.kernel_jitter"),
        (json!({"tokens": 1e9, "sed": 1}), "run"),
    ] {
        let (ok, _, err) = train_run(&dir, &whole(run.clone()), &[]);
        assert!(!ok, "{run} was accepted");
        assert!(err.contains(key), "{run}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    let (_, _, err) = train_run(&dir, &whole(json!({"tokens": 1e9, "failures": "llama3"})), &[]);
    assert!(err.contains("llama3-2024"), "did you mean: {err}");
    // A checkpoint every millisecond over a long run is refused before drawing.
    let (ok, _, err) = train_run(
        &dir,
        &whole(json!({"tokens": 1e13, "failures": "llama3-2024", "checkpoint": {"interval_s": 0.001}})),
        &[],
    );
    assert!(!ok && err.contains("interval_s"), "{err}");
    // Checkpoints so slow that almost every interval is interrupted: refused, not run forever.
    let (ok, _, err) = train_run(
        &dir,
        &whole(json!({"iterations": 1e6, "failures": {"gpu": 0.5}, "checkpoint": {"storage_bytes_per_s_per_node": 1}})),
        &[],
    );
    assert!(!ok && err.contains("would not finish"), "{err}");
    let (ok, _, err) = train_run(&dir, &whole(json!({"tokens": 1e9})), &["--runs", "0"]);
    assert!(!ok && err.contains("--runs"), "{err}");
}

/// `run.variability.kernel_jitter` is the engine's per-kernel spread for the run's iterations:
/// each of the pipeline's collectives waits for its slowest member, so the iteration (and the
/// run) is longer than without any (`simulation.kernel_jitter` 0; the GPU default is on); the
/// run's seed draws it, the same seed the same run. Given again under `simulation` with another
/// value it is refused.
#[test]
fn per_kernel_jitter_lengthens_the_run_s_iterations() {
    let dir = TempDir::new("whole-jitter");
    let mut calm: Value = serde_json::from_str(&whole(json!({"tokens": 1e9}))).expect("json");
    calm["simulation"] = json!({"kernel_jitter": 0});
    let plain = train_run(&dir, &calm.to_string(), &[]);
    let jitter = |seed: u64| whole(json!({"tokens": 1e9, "seed": seed, "variability": {"kernel_jitter": 0.05}}));
    let (a, b) = (train_run(&dir, &jitter(3), &[]), train_run(&dir, &jitter(3), &[]));
    assert!(plain.0 && a.0, "{} {}", plain.2, a.2);
    let it = |r: &Value| num(r, "/epochs/0/iteration_s");
    assert!(it(&a.1) > it(&plain.1), "{} s vs {} s", it(&a.1), it(&plain.1));
    assert_eq!(a.1, b.1);
    let mut both: Value = serde_json::from_str(&jitter(3)).expect("json");
    both["simulation"] = json!({"kernel_jitter": 0.01});
    let (ok, _, err) = train_run(&dir, &both.to_string(), &[]);
    assert!(!ok && err.contains("give the per-kernel spread once"), "{err}");
}
