//! The executor: replaying a lowered plan on the CPU backend, and the CLI around it.

use crate::util::run_cli;
use executor::OpContext;
use executor::replay::{ReplayOptions, replay};
use sim::report::timeline::StreamKind;

fn scenario(plan: &str) -> sim::scenario::Scenario {
    let text = format!(
        r#"{{"workload": {{"transformer": {{"layers": 2, "hidden": 128, "heads": 4, "vocab": 512}}}},
            "cluster": {{"node": "host-cpu", "nodes": 1}},
            "training": {{"global_batch": 8, "micro_batch": 2, "seq_len": 64, "precision": "fp32", "optimizer": "adam"}},
            "plan": {plan}}}"#
    );
    sim::scenario::parse(&text, &|_| Err("no files".into())).expect("valid scenario")
}

/// A replay runs every task once per repeat, keeps each stream in order, and respects the
/// program's cross-device dependencies in real time.
#[test]
fn cpu_replay_runs_every_task_in_dependency_order() {
    for plan in [r#"{"dp": 1, "pp": 2, "schedule": "1f1b"}"#, r#"{"dp": 2, "pp": 1}"#] {
        let s = scenario(plan);
        let out = sim::simulate(&s, false);
        let p = &out.program;
        let backend = executor::backend("cpu").expect("cpu backend");
        let ctx = OpContext { hidden: 128, seq_len: 64, element_bytes: 4.0 };
        let m = replay(p, backend.as_ref(), ctx, ReplayOptions { warmup: 0, repeats: 2 }).expect("replay");
        assert_eq!(m.iterations_s.len(), 2);
        assert!(m.iterations_s.iter().all(|t| *t > 0.0));
        let compute_tasks = p.tasks.iter().filter(|t| t.kind == sim::lower::TaskKind::Compute).count();
        let samples: usize = m.ops.iter().map(|o| o.samples_s.len()).sum();
        assert_eq!(samples, 2 * compute_tasks, "{plan}: every compute task measured in each repeat");
        // One span per task per stream it sits on, in the last repeat.
        let expected: usize = p.streams.iter().map(Vec::len).sum();
        assert_eq!(m.timeline.spans.len(), expected, "{plan}");
        // Each stream's spans in order, so the k-th span of a stream is its k-th task.
        let mut at = std::collections::HashMap::new();
        for (di, d) in p.devices.iter().enumerate() {
            for kind in StreamKind::ALL {
                let mut spans: Vec<_> =
                    m.timeline.spans.iter().filter(|s| s.device == *d && s.stream == kind).collect();
                spans.sort_by_key(|s| s.start_ns);
                for w in spans.windows(2) {
                    assert!(w[0].end_ns <= w[1].start_ns, "{plan}: dev {d} {kind:?} overlaps itself");
                }
                let stream = sim::lower::Program::stream_index(di as u32, kind) as usize;
                for (k, &t) in p.streams[stream].iter().enumerate() {
                    at.insert(t, (spans[k].start_ns, spans[k].end_ns));
                }
            }
        }
        for &(a, b) in &p.deps {
            assert!(at[&a].1 <= at[&b].0, "{plan}: task {b} started before task {a} it depends on ended");
        }
    }
}

#[test]
fn cuda_backend_without_a_gpu_fails_clearly() {
    let dir = crate::util::TempDir::new("cuda");
    let path = dir.path().join("s.json");
    std::fs::write(
        &path,
        r#"{"workload": {"transformer": {"layers": 2, "hidden": 128, "heads": 4, "vocab": 512}},
            "cluster": {"node": "host-cpu", "nodes": 1},
            "training": {"global_batch": 4, "micro_batch": 2, "seq_len": 64},
            "plan": {"dp": 2}}"#,
    )
    .expect("write");
    let out = run_cli(&["replay", path.to_str().expect("utf-8"), "--backend", "cuda"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr).to_lowercase();
    assert!(err.contains("cuda") && (err.contains("gpu") || err.contains("driver") || err.contains("built")), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn calibrate_then_validate_writes_a_profile_and_compares() {
    let dir = crate::util::TempDir::new("calib");
    let out = run_cli(&["calibrate", "--backend", "cpu", "--quick", "--out", dir.path().to_str().expect("utf-8")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let profile = dir.path().join("profile.json");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&profile).expect("profile")).expect("json");
    assert_eq!(v["schema"], "trainsim-profile/1");
    let rate = v["gemm"]["flops_per_s"].as_f64().expect("rate");
    let ci = v["gemm"]["flops_per_s_ci95"].as_array().expect("interval");
    assert!(rate > 1e8 && ci[0].as_f64().expect("lo") <= rate && rate <= ci[1].as_f64().expect("hi"));
    assert!(dir.path().join("README.md").exists());
    // The launch-to-launch spread of a kernel, which a calibrated simulation takes as its
    // kernel_jitter (and says so) unless the scenario gives one.
    let spread = v["kernel_jitter"].as_f64().expect("kernel_jitter");
    assert!((0.0..1.0).contains(&spread), "{spread}");
    let tiny = concat!(env!("CARGO_MANIFEST_DIR"), "/experiments/executor/pp2-1f1b-m4.json");
    let out = run_cli(&["simulate", tiny, "--profile", profile.to_str().expect("utf-8"), "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let sim: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json report");
    let noted =
        sim["notes"].as_array().expect("notes").iter().any(|n| n.as_str().unwrap_or("").contains("kernel_jitter"));
    assert_eq!(noted, spread > 0.0, "{}", sim["notes"]);
    let scenario = concat!(env!("CARGO_MANIFEST_DIR"), "/experiments/executor/pp2-1f1b-m4.json");
    let out = run_cli(&[
        "validate",
        scenario,
        "--backend",
        "cpu",
        "--profile",
        profile.to_str().expect("utf-8"),
        "--json",
        "--repeats",
        "1",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json report");
    for k in ["iteration_s_predicted", "iteration_s_measured", "error", "ops"] {
        assert!(!r[k].is_null(), "missing {k}");
    }
    assert!(r["iteration_s_measured"].as_f64().expect("measured") > 0.0);
}
