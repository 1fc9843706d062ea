//! Training runs with freezing (PipeTransformer): the epoch table, the bounds freezing must
//! respect, and the CLI.

use crate::util::run_cli;

fn vit_run(extra_freeze: &str) -> sim::scenario::Scenario {
    let text = format!(
        r#"{{"workload": {{"preset": "vit-b16"}}, "cluster": {{"node": "rtx5000-pcie-2x8", "nodes": 2}},
            "training": {{"global_batch": 800, "micro_batch": 25, "seq_len": 197, "precision": "fp32", "optimizer": "sgd"}},
            "plan": {{"dp": 2, "pp": 8, "schedule": "gpipe", "freeze": {{"policy": "autofreeze", "alpha": 0.333{extra_freeze}}}}},
            "run": {{"dataset_samples": 100000, "epochs": 8}}}}"#
    );
    sim::scenario::parse(&text, &|_| Err("no files".into())).expect("valid")
}

/// The run follows PipeTransformer's published trace of K and R for ViT-B/16, alpha 1/3.
#[test]
fn the_run_follows_the_elastic_schedule() {
    let r = sim::run::training_run(&vit_run(""));
    let k: Vec<u32> = r.epochs.iter().map(|e| e.pipeline_length).take(6).collect();
    let rr: Vec<u32> = r.epochs.iter().map(|e| e.replicas).take(6).collect();
    let f: Vec<u32> = r.epochs.iter().map(|e| e.frozen_layers).take(6).collect();
    assert_eq!(f, vec![0, 4, 7, 9, 10, 11]);
    assert_eq!(k, vec![8, 8, 4, 2, 2, 1]);
    assert_eq!(rr, vec![2, 2, 4, 8, 8, 16]);
    assert!(r.speedup > 1.0, "speedup {}", r.speedup);
    assert!((r.baseline_total_s / r.total_s - r.speedup).abs() < 1e-9);
}

/// Freezing with AutoPipe, AutoDP and AutoCache off cannot beat the baseline by more than the
/// backward work of the frozen layers (two thirds of their compute).
#[test]
fn freezing_alone_saves_at_most_the_frozen_backward() {
    let s = vit_run("");
    let r = sim::run::training_run(&s);
    let alone = r.breakdown.iter().find(|v| v.name == "freezing alone").expect("breakdown");
    let layers = s.workload.transformer.layers as f64;
    let epochs = r.epochs.len() as f64;
    let bound: f64 = r.epochs.iter().map(|e| 1.0 - 2.0 / 3.0 * e.frozen_layers as f64 / layers).sum::<f64>() / epochs;
    assert!(
        alone.total_s >= r.baseline_total_s * bound * (1.0 - 1e-9),
        "{} vs {}",
        alone.total_s,
        r.baseline_total_s * bound
    );
    // With every part on, the run is at least as fast as with AutoCache off.
    let all = r.breakdown.iter().find(|v| v.name == "+ AutoCache").expect("breakdown");
    let no_cache = r.breakdown.iter().find(|v| v.name == "+ AutoDP").expect("breakdown");
    assert!(all.total_s <= no_cache.total_s * (1.0 + 1e-9));
}

#[test]
fn turning_parts_off_keeps_the_pipeline() {
    let r = sim::run::training_run(&vit_run(r#", "auto_pipe": false"#));
    assert!(r.epochs.iter().all(|e| e.replicas == 2), "AutoDP needs AutoPipe's freed GPUs");
    assert!(r.epochs.iter().all(|e| e.pipeline_length == 8 || e.pipeline_length + e.frozen_layers == 12));
}

#[test]
fn train_run_prints_json_and_rejects_a_scenario_without_a_run() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/experiments/pipetransformer/bert-large-squad.json");
    let out = run_cli(&["train-run", path, "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    for k in ["epochs", "total_s", "baseline_total_s", "speedup"] {
        assert!(!v[k].is_null(), "missing {k}");
    }
    for k in ["epoch", "frozen_layers", "pipeline_length", "replicas", "iteration_s", "epoch_s"] {
        assert!(!v["epochs"][0][k].is_null(), "missing epochs[].{k}");
    }
    let plain = concat!(env!("CARGO_MANIFEST_DIR"), "/experiments/core/custom-transformer-small.json");
    let out = run_cli(&["train-run", plain]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("run"));
}

/// AutoCache holds what host DRAM can; with little DRAM the cache is read from disk, which
/// is never faster.
#[test]
fn autocache_respects_host_memory() {
    let big = sim::run::training_run(&vit_run(""));
    let mut small = vit_run("");
    small.cluster.node.host.dram_bytes = 1e9;
    let small = sim::run::training_run(&small);
    assert!(small.total_s >= big.total_s * (1.0 - 1e-12), "{} vs {}", small.total_s, big.total_s);
    assert!(small.total_s > big.total_s || small.epochs.iter().all(|e| !e.cached));
}

/// An epoch whose plan does not fit the devices' memory says so, in the report and on the
/// terminal: its times are those of a plan that would not run.
#[test]
fn epochs_that_do_not_fit_are_flagged() {
    let fitting = sim::run::training_run(&vit_run(""));
    assert!(fitting.fits && fitting.baseline_fits, "ViT-B/16 on 16 GB RTX 5000s fits");
    assert!(fitting.epochs.iter().all(|e| e.fits && e.peak_memory_bytes > 0.0));
    // The same run on 2 GB devices: the early epochs (few layers frozen) do not fit.
    let mut small = vit_run("");
    small.cluster.node.device.hbm_bytes = 2e9;
    let r = sim::run::training_run(&small);
    assert!(!r.fits && !r.baseline_fits);
    let first = &r.epochs[0];
    assert!(!first.fits);
    assert!(first.peak_memory_bytes > first.memory_capacity_bytes - first.memory_headroom_bytes);
    let dir = crate::util::TempDir::new("small-memory");
    let mut v: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/experiments/pipetransformer/bert-large-squad.json"
        ))
        .expect("read"),
    )
    .expect("json");
    v["cluster"]["node"] = serde_json::json!({"preset": v["cluster"]["node"].clone(), "device": {"preset": "quadro-rtx5000", "hbm_bytes": 2e9}});
    let path = dir.write("small.json", &v.to_string());
    let out = run_cli(&["train-run", path.to_str().expect("utf-8")]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("DOES NOT FIT"), "{text}");
}
