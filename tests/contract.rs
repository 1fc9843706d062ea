//! The public contract of `shared/SCENARIO.md`: the example scenarios run and report every
//! required key with consistent values, the planned ones are refused clearly, output is
//! deterministic, bad input gives exit status 2 and a one-paragraph error naming the key path,
//! `presets` lists the required presets and `--gantt` draws PNG and SVG files.

use crate::util::{self, TempDir, assert_close, num, run, stderr, stdout};
use serde_json::{Value, json};
use std::path::Path;

const REQUIRED_KEYS: [&str; 12] = [
    "iteration_s",
    "samples_per_s",
    "tokens_per_s",
    "model_flops_per_iteration",
    "mfu",
    "bubble_fraction",
    "fits",
    "peak_memory_bytes",
    "memory_breakdown",
    "devices",
    "events",
    "defaults_applied",
];

const BREAKDOWN_KEYS: [&str; 5] = ["weights", "gradients", "optimizer", "activations", "buffers"];

/// Check a `--json` report of the scenario file at `path` against the contract.
fn check_report(path: &Path, r: &Value) {
    let text = std::fs::read_to_string(path).expect("read scenario");
    let s: Value = serde_json::from_str(&text).expect("scenario is JSON");
    for k in REQUIRED_KEYS {
        assert!(r.get(k).is_some(), "{}: report lacks required key {k}", path.display());
    }
    let mb = &r["memory_breakdown"];
    for k in BREAKDOWN_KEYS {
        let x = mb.get(k).and_then(Value::as_f64).unwrap_or_else(|| panic!("memory_breakdown.{k} is not a number"));
        assert!(x.is_finite() && x >= 0.0, "memory_breakdown.{k} = {x}");
    }
    assert!(r["fits"].is_boolean(), "fits is not a boolean");
    assert!(r["defaults_applied"].is_array(), "defaults_applied is not a list");
    assert!(
        r["defaults_applied"].as_array().unwrap().iter().all(Value::is_string),
        "defaults_applied holds non-strings"
    );
    assert!(r["events"].as_u64().is_some_and(|e| e > 0), "events = {}", r["events"]);

    let global_batch = s["training"]["global_batch"].as_f64().unwrap();
    let seq_len = s["training"]["seq_len"].as_f64().unwrap();
    let iteration_s = num(r, "/iteration_s");
    assert!(iteration_s.is_finite() && iteration_s > 0.0, "iteration_s = {iteration_s}");
    let samples = num(r, "/samples_per_s");
    assert_close(samples, global_batch / iteration_s, 1e-9, "samples_per_s vs global_batch / iteration_s");
    assert_close(num(r, "/tokens_per_s"), samples * seq_len, 1e-9, "tokens_per_s vs samples_per_s x seq_len");

    let mfu = num(r, "/mfu");
    assert!(mfu > 0.0 && mfu < 1.0, "mfu = {mfu} is not in (0, 1)");
    let bubble = num(r, "/bubble_fraction");
    assert!((0.0..1.0).contains(&bubble), "bubble_fraction = {bubble} is not in [0, 1)");

    // Devices, model FLOPs and MFU from the scenario, independently of the report code.
    let scen = sim::scenario::parse(&text, &util::no_files).expect("runnable scenario parses");
    let devices = scen.cluster.device_count();
    assert_eq!(r["devices"].as_u64(), Some(devices as u64), "devices");
    let tf = &scen.workload.transformer;
    let (l, h) = (tf.layers as f64, tf.hidden as f64);
    let per_sample = 6.0 * scen.workload.flop_parameters() * seq_len + 12.0 * l * h * seq_len * seq_len;
    let model_flops = num(r, "/model_flops_per_iteration");
    assert_close(model_flops, global_batch * per_sample, 1e-9, "model_flops_per_iteration");
    let peak = scen.cluster.node.device.peak_flops.at(scen.training.precision);
    assert_close(mfu, model_flops / iteration_s / (devices as f64 * peak), 1e-9, "mfu");

    // The breakdown is that of the device with the peak, and fits says whether it fits.
    let peak_mem = num(r, "/peak_memory_bytes");
    let sum: f64 = BREAKDOWN_KEYS.iter().map(|k| mb[k].as_f64().unwrap()).sum();
    assert_close(peak_mem, sum, 1e-9, "peak_memory_bytes vs the sum of memory_breakdown");
    // A plan fits when its peak leaves the allocator's headroom free (docs/report.md), and the
    // host and NVMe hold what is offloaded to them.
    let capacity = scen.cluster.node.device.hbm_bytes;
    let usable = capacity - num(r, "/memory_headroom_bytes");
    let fits_hbm = r["fits_hbm"].as_bool().expect("fits_hbm");
    if r["chunk_placement"].as_array().is_none_or(|c| c.iter().all(|c| c["feasible"] == json!(true))) {
        assert_eq!(fits_hbm, peak_mem <= usable, "fits_hbm with peak {peak_mem}, capacity {capacity}, usable {usable}");
    }
    let all = fits_hbm && r["fits_host"].as_bool() == Some(true) && r["fits_nvme"].as_bool() == Some(true);
    assert_eq!(r["fits"].as_bool(), Some(all), "fits is fits_hbm, fits_host and fits_nvme");
}

#[test]
fn gpt3_175b_reports_every_required_key() {
    let path = util::gpt3_175b();
    let r = util::simulate_json(&path);
    check_report(&path, &r);
    assert_eq!(r["devices"], json!(1024));
    // Full recomputation, ZeRO 1, 16 stages: Megatron reports this fitting in 80 GB.
    assert_eq!(r["fits"], json!(true));
}

#[test]
fn custom_transformer_reports_every_required_key() {
    let path = util::custom_small();
    let r = util::simulate_json(&path);
    check_report(&path, &r);
    assert_eq!(r["devices"], json!(8));
    // The pipeline has two stages under GPipe: some bubble must show.
    assert!(num(&r, "/bubble_fraction") > 0.0, "a 2-stage pipeline reports no bubble");
}

#[test]
fn human_summary_runs() {
    let o = run(&[&"simulate", &util::custom_small()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("iteration"), "summary lacks the iteration time:\n{out}");
    assert!(serde_json::from_str::<Value>(&out).is_err(), "without --json the summary is not JSON");
}

/// The example scenarios that name features added over time (copies in `tests/data`): each
/// either runs and reports every required key, or is refused with "not supported yet" naming
/// one of the keys of the feature, without a crash and without a report on stdout.
#[test]
fn planned_feature_scenarios_run_or_are_refused_clearly() {
    for (name, keys) in [
        ("terapipe-gpt3-13b.json", &["plan.token_slices"][..]),
        ("fpga-vgg16-pipeline.json", &["workload.preset", "plan.partition"][..]),
        ("zero3-offload-gpt2-10b.json", &["plan.zero_stage", "plan.offload"][..]),
    ] {
        let path = util::repo("tests/data").join(name);
        let o = run(&[&"simulate", &path, &"--json"]);
        let err = stderr(&o);
        assert!(!err.contains("panicked") && !err.contains("backtrace"), "{name} crashed: {err}");
        if o.status.success() {
            let r: Value = serde_json::from_str(&stdout(&o)).expect("report is JSON");
            check_report(&path, &r);
            continue;
        }
        assert_eq!(o.status.code(), Some(2), "{name}: {err}");
        assert!(err.contains("not supported yet"), "{name}: stderr lacks \"not supported yet\": {err}");
        assert!(keys.iter().any(|k| err.contains(k)), "{name}: stderr names none of {keys:?}: {err}");
        assert!(stdout(&o).trim().is_empty(), "{name}: a refused scenario printed a report");
    }
}

/// Every file in `shared/scenarios` is either simulated or refused with "not supported yet".
#[test]
fn shared_scenarios_are_accepted_or_planned() {
    let dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/scenarios"));
    let Ok(entries) = std::fs::read_dir(dir) else {
        eprintln!("skipping: {} is missing", dir.display());
        return;
    };
    let mut seen = 0;
    for e in entries {
        let path = e.expect("read folder").path();
        if path.extension().is_none_or(|x| x != "json") {
            continue;
        }
        seen += 1;
        let o = run(&[&"simulate", &path, &"--json"]);
        let err = stderr(&o);
        assert!(!err.contains("panicked") && !err.contains("backtrace"), "{} crashed: {err}", path.display());
        if o.status.success() {
            let r: Value = serde_json::from_str(&stdout(&o)).expect("report is JSON");
            check_report(&path, &r);
        } else {
            assert!(
                err.contains("not supported yet"),
                "{} refused without \"not supported yet\": {err}",
                path.display()
            );
        }
    }
    assert!(seen >= 5, "expected the five example scenarios in {}, found {seen}", dir.display());
}

#[test]
fn output_and_trace_are_deterministic() {
    let tmp = TempDir::new("determinism");
    let (t1, t2) = (tmp.path().join("one.trace.json"), tmp.path().join("two.trace.json"));
    let path = util::custom_small();
    let a = run(&[&"simulate", &path, &"--json", &"--trace", &t1]);
    let b = run(&[&"simulate", &path, &"--json", &"--trace", &t2]);
    assert!(a.status.success() && b.status.success(), "{}{}", stderr(&a), stderr(&b));
    assert!(!a.stdout.is_empty());
    assert!(a.stdout == b.stdout, "two runs printed different reports");
    let (x, y) = (std::fs::read(&t1).expect("trace written"), std::fs::read(&t2).expect("trace written"));
    assert!(x.len() > 1000, "trace is only {} bytes", x.len());
    assert!(x == y, "two runs wrote different traces");
    // A Chrome trace: a JSON array of events, or an object with "traceEvents".
    let v: Value = serde_json::from_slice(&x).expect("trace is JSON");
    let events = v.as_array().or_else(|| v["traceEvents"].as_array()).expect("trace has events");
    assert!(!events.is_empty(), "trace has no events");
    // Without --trace the report is the same.
    let c = run(&[&"simulate", &path, &"--json"]);
    assert!(a.stdout == c.stdout, "--trace changed the report");
}

// ---- invalid input ----

/// A valid base scenario (8 devices of one DGX A100 80GB node) that the cases below break.
fn base() -> Value {
    json!({
        "name": "base",
        "workload": {"transformer": {"layers": 4, "hidden": 1024, "heads": 16, "vocab": 32000}},
        "cluster": {"node": "dgx-a100-80gb", "nodes": 1},
        "training": {"global_batch": 16, "micro_batch": 2, "seq_len": 512, "precision": "bf16", "optimizer": "adam"},
        "plan": {"dp": 2, "tp": 2, "pp": 2}
    })
}

fn with(edit: impl FnOnce(&mut Value)) -> String {
    let mut v = base();
    edit(&mut v);
    v.to_string()
}

/// Does `text` name `path` as a whole key path (not as part of a longer one)?
fn names_key(text: &str, path: &str) -> bool {
    let key_char = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '.';
    text.match_indices(path).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let rest = &text[i + path.len()..];
        let continues = |c: char| c.is_ascii_alphanumeric() || c == '_';
        // "plan.foo" does not name "plan"; "plan." ending a sentence does.
        let longer = rest.chars().next().is_some_and(continues)
            || rest.starts_with('.') && rest[1..].chars().next().is_some_and(continues);
        !before.is_some_and(key_char) && !longer
    })
}

/// The scenario `text` is refused with exit status 2, an error paragraph on stderr that names
/// one of `keys` and mentions every string of `mentions`, and nothing on stdout.
#[track_caller]
fn assert_rejected(text: &str, keys: &[&str], mentions: &[&str]) {
    let tmp = TempDir::new("invalid");
    let path = tmp.write("input.json", text);
    let o = run(&[&"simulate", &path, &"--json"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "exit status for {text}\nstderr: {err}");
    assert!(!err.contains("panicked") && !err.to_lowercase().contains("backtrace"), "crash on {text}: {err}");
    assert!(!err.trim().is_empty(), "no error message for {text}");
    assert!(!err.trim().contains("\n\n"), "the error is more than one paragraph: {err}");
    assert!(keys.iter().any(|k| names_key(&err, k)), "the error does not name {keys:?}: {err}");
    for m in mentions {
        assert!(err.contains(m), "the error does not mention {m:?}: {err}");
    }
    assert!(stdout(&o).trim().is_empty(), "a refused scenario printed: {}", stdout(&o));
}

#[test]
fn base_of_invalid_cases_is_valid() {
    let tmp = TempDir::new("base");
    let path = tmp.write("input.json", &base().to_string());
    check_report(&path, &util::simulate_json(&path));
}

#[test]
fn names_key_matches_whole_paths_only() {
    assert!(names_key("invalid scenario: plan.foo: unknown key", "plan.foo"));
    assert!(names_key("invalid scenario: plan: dp x tp", "plan"));
    assert!(!names_key("invalid scenario: plan.foo: unknown key", "plan"));
    assert!(!names_key("invalid scenario: plan.foobar: unknown key", "plan.foo"));
    assert!(!names_key("invalid scenario: xplan.foo: unknown key", "plan.foo"));
}

#[test]
fn rejects_text_that_is_not_json() {
    assert_rejected("{\"workload\": {\"preset\": \"gpt3-175b\"},", &["(file)", "JSON", "json"], &["JSON"]);
}

#[test]
fn rejects_missing_workload() {
    let text = with(|v| {
        v.as_object_mut().unwrap().remove("workload");
    });
    assert_rejected(&text, &["workload"], &["missing"]);
}

#[test]
fn rejects_unknown_key() {
    assert_rejected(&with(|v| v["plan"]["foo"] = json!(1)), &["plan.foo"], &["unknown"]);
}

#[test]
fn rejects_degrees_not_matching_device_count() {
    // 2 x 2 x 4 = 16 devices on an 8-device cluster.
    assert_rejected(&with(|v| v["plan"]["pp"] = json!(4)), &["plan", "plan.dp", "plan.tp", "plan.pp"], &["16", "8"]);
}

#[test]
fn rejects_negative_hidden() {
    assert_rejected(
        &with(|v| v["workload"]["transformer"]["hidden"] = json!(-1024)),
        &["workload.transformer.hidden"],
        &["-1024"],
    );
}

#[test]
fn rejects_unknown_preset() {
    assert_rejected(
        &with(|v| v["workload"] = json!({"preset": "gpt5-1t"})),
        &["workload.preset"],
        &["gpt5-1t", "gpt3-175b"],
    );
}

#[test]
fn rejects_bad_precision() {
    assert_rejected(&with(|v| v["training"]["precision"] = json!("bf17")), &["training.precision"], &["bf17", "bf16"]);
}

#[test]
fn rejects_tp_not_dividing_heads() {
    // 12 heads over 8 tensor-parallel ranks.
    let text = with(|v| {
        v["workload"]["transformer"]["hidden"] = json!(768);
        v["workload"]["transformer"]["heads"] = json!(12);
        v["plan"] = json!({"dp": 1, "tp": 8, "pp": 1});
    });
    assert_rejected(&text, &["plan.tp"], &["8", "12"]);
}

#[test]
fn rejects_global_batch_not_divisible_by_dp_times_micro_batch() {
    // 18 samples over dp=2 is 9 per replica, not whole micro-batches of 2.
    assert_rejected(&with(|v| v["training"]["global_batch"] = json!(18)), &["training.global_batch"], &["18"]);
}

#[test]
fn rejects_interleaved_with_micro_batches_not_a_multiple_of_stages() {
    // 12 / (dp 2 x micro-batch 2) = 3 micro-batches over 2 stages.
    let text = with(|v| {
        v["training"]["global_batch"] = json!(12);
        v["plan"]["schedule"] = json!("interleaved");
        v["plan"]["virtual_stages"] = json!(2);
    });
    assert_rejected(&text, &["plan.schedule", "plan.virtual_stages", "training.global_batch"], &["3"]);
}

#[test]
fn rejects_zero_stage_7() {
    assert_rejected(&with(|v| v["plan"]["zero_stage"] = json!(7)), &["plan.zero_stage"], &["7"]);
}

#[test]
fn rejects_partition_with_wrong_sum() {
    // 4 layers over 2 stages, given as 1 + 2.
    assert_rejected(&with(|v| v["plan"]["partition"] = json!([1, 2])), &["plan.partition"], &["[1,2]"]);
}

#[test]
fn rejects_missing_scenario_file() {
    let tmp = TempDir::new("missing");
    let o = run(&[&"simulate", &tmp.path().join("nowhere.json")]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("nowhere.json") && !err.contains("panicked"), "{err}");
}

// ---- presets and drawings ----

const DEVICES: [&str; 11] = [
    "v100-sxm2-16gb",
    "v100-sxm2-32gb",
    "a100-sxm-40gb",
    "a100-sxm-80gb",
    "h100-sxm",
    "h200",
    "quadro-rtx5000",
    "host-cpu",
    "alveo-u280",
    "alveo-u250",
    "vu9p",
];
const NODES: [&str; 8] = [
    "dgx-1-v100",
    "p3.16xlarge",
    "p3dn.24xlarge",
    "dgx-a100-40gb",
    "dgx-a100-80gb",
    "p4d.24xlarge",
    "dgx-h100",
    "hgx-h200",
];
const MORE_NODES: [&str; 1] = ["rtx5000-pcie-2x8"];
const WORKLOADS: [&str; 5] = ["gpt3-175b", "gpt3-13b", "llama3-405b", "bert-large", "vit-b16"];

#[test]
fn presets_lists_required_presets() {
    let o = run(&[&"presets", &"--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).expect("presets --json is JSON");
    let names = |k: &str| -> Vec<String> {
        v[k].as_array()
            .unwrap_or_else(|| panic!("presets --json has no list {k}"))
            .iter()
            .map(|x| x["name"].as_str().expect("a named preset").to_string())
            .collect()
    };
    let (devices, nodes, workloads) = (names("devices"), names("nodes"), names("workloads"));
    for (want, have, kind) in [
        (&DEVICES[..], &devices, "device"),
        (&NODES[..], &nodes, "node"),
        (&MORE_NODES[..], &nodes, "node"),
        (&WORKLOADS[..], &workloads, "workload"),
    ] {
        for w in want {
            assert!(have.iter().any(|h| h == w), "{kind} preset {w} is missing; have {have:?}");
        }
    }

    let o = run(&[&"presets"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    for w in DEVICES.iter().chain(&NODES).chain(&MORE_NODES).chain(&WORKLOADS) {
        assert!(text.contains(w), "`trainsim presets` does not list {w}");
    }
}

#[test]
fn gantt_writes_png_and_svg() {
    let tmp = TempDir::new("gantt");
    let (png, svg) = (tmp.path().join("schedule.png"), tmp.path().join("schedule.svg"));
    for out in [&png, &svg] {
        let o = run(&[&"simulate", &util::custom_small(), &"--gantt", &out]);
        assert!(o.status.success(), "--gantt {}: {}", out.display(), stderr(&o));
    }
    let bytes = std::fs::read(&png).expect("PNG written");
    assert_eq!(&bytes[..8.min(bytes.len())], b"\x89PNG\r\n\x1a\n", "not a PNG signature");
    assert!(bytes.len() > 1000, "PNG of {} bytes", bytes.len());
    let text = std::fs::read_to_string(&svg).expect("SVG written");
    assert!(text.contains("<svg") && text.trim_end().ends_with("</svg>"), "not an SVG document");
}

/// The rank order, the send mode and the host issue time are checked where they are read.
#[test]
fn rank_order_and_host_op_time_are_validated() {
    assert_rejected(&with(|v| v["plan"]["p2p"] = json!("async")), &["plan.p2p"], &["blocking", "overlapped"]);
    assert_rejected(
        &with(|v| v["plan"]["rank_order"] = json!("pp-dp-tp")),
        &["plan.rank_order"],
        &["tp-dp-pp", "tp-pp-dp"],
    );
    assert_rejected(&with(|v| v["simulation"] = json!({"host_op_s": -1e-6})), &["simulation.host_op_s"], &[]);
    assert_rejected(&with(|v| v["simulation"] = json!({"host_op_s": "fast"})), &["simulation.host_op_s"], &[]);
}
