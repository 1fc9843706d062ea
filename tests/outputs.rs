//! Files beside the report: traces a person can open (filtered by default on large runs,
//! Perfetto's protobuf on request), output paths checked before the work, replays refused
//! when they would run too long.

use crate::util::*;
use serde_json::{Value, json};
use std::collections::BTreeSet;

/// 32 simulated devices: tensor parallelism 8, four pipeline stages, one replica, every
/// device simulated (`symmetry` off; with it, one tensor rank per stage stands for the group).
fn pipeline_32() -> String {
    json!({"name": "pp4 tp8", "workload": small_transformer(8, 1024, 16),
        "cluster": {"node": "dgx-a100-80gb", "nodes": 4},
        "training": {"global_batch": 8, "micro_batch": 1, "seq_len": 512},
        "plan": {"dp": 1, "tp": 8, "pp": 4},
        "simulation": {"symmetry": false}})
    .to_string()
}

fn traced_pids(path: &std::path::Path) -> BTreeSet<u64> {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X" && e["cat"] != "flow")
        .map(|e| e["pid"].as_u64().unwrap())
        .collect()
}

#[test]
fn large_runs_are_traced_on_one_device_per_stage_unless_asked() {
    let dir = TempDir::new("trace-filter");
    let s = dir.write("s.json", &pipeline_32());
    let t = dir.path().join("t.json");
    let o = run(&[&"simulate", &s, &"--trace", &t]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("--trace-devices all"), "{}", stderr(&o));
    // One device per stage: 4 processes with spans (tensor rank 0 of each stage).
    assert_eq!(traced_pids(&t).len(), 4);
    let o = run(&[&"simulate", &s, &"--trace", &t, &"--trace-devices", &"all"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(traced_pids(&t).len(), 32);
    let o = run(&[&"simulate", &s, &"--trace", &t, &"--trace-devices", &"0-1", &"--trace-streams", &"pp-send"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&t).unwrap()).unwrap();
    let spans: Vec<&Value> =
        v["traceEvents"].as_array().unwrap().iter().filter(|e| e["ph"] == "X" && e["cat"] != "flow").collect();
    assert!(!spans.is_empty() && spans.iter().all(|e| e["name"].as_str().unwrap().contains("send")), "only sends");
    let bad = run(&[&"simulate", &s, &"--trace", &t, &"--trace-streams", &"bogus"]);
    assert!(!bad.status.success() && stderr(&bad).contains("--trace-streams") && !stderr(&bad).contains("panicked"));
    // Under symmetry the same plan simulates tensor rank 0 of each stage: 4 devices, all traced.
    let mut v: Value = serde_json::from_str(&pipeline_32()).unwrap();
    v.as_object_mut().unwrap().remove("simulation");
    let folded = dir.write("folded.json", &v.to_string());
    let o = run(&[&"simulate", &folded, &"--trace", &t]);
    assert!(o.status.success() && !stderr(&o).contains("--trace-devices all"), "{}", stderr(&o));
    assert_eq!(traced_pids(&t).len(), 4);
}

#[test]
fn a_pftrace_file_is_perfetto_protobuf_and_smaller_than_json() {
    let dir = TempDir::new("pftrace");
    let s = dir.write("s.json", &pipeline_32());
    let (j, p) = (dir.path().join("t.json"), dir.path().join("t.pftrace"));
    for t in [&j, &p] {
        let o = run(&[&"simulate", &s, &"--trace", t, &"--trace-devices", &"all"]);
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let (jb, pb) = (std::fs::read(&j).unwrap(), std::fs::read(&p).unwrap());
    // Field 1 of Trace (a length-delimited TracePacket) first; no JSON.
    assert_eq!(pb[0], 0x0a);
    assert!(pb.len() * 2 < jb.len(), "protobuf {} bytes vs JSON {} bytes", pb.len(), jb.len());
}

#[test]
fn output_paths_are_checked_before_the_work() {
    let dir = TempDir::new("paths");
    let s = dir.write("s.json", &pipeline_32());
    for flag in ["--trace", "--gantt", "--memory", "--memory-plot"] {
        let missing = dir.path().join("no-such-folder").join("out.png");
        let o = run(&[&"simulate", &s, &flag, &missing]);
        let err = stderr(&o);
        assert!(!o.status.success(), "{flag} into a missing folder succeeded");
        assert!(err.contains(flag) && err.contains("cannot be written"), "{flag}: {err}");
        assert!(stdout(&o).is_empty(), "{flag}: the simulation ran before the path was checked");
    }
    // A path that is fine leaves no empty file behind when the check passes but the work fails.
    let ok = dir.path().join("fine.json");
    let o = run(&[&"simulate", &dir.write("bad.json", "{}"), &"--trace", &ok]);
    assert!(!o.status.success());
    assert!(!ok.exists());
}

#[test]
fn a_replay_estimated_over_the_limit_is_refused_with_its_estimate() {
    let o = run(&[&"replay", &repo("experiments/executor/dp2.json"), &"--max-seconds", &"0.000001"]);
    let err = stderr(&o);
    assert!(!o.status.success(), "a replay over the limit ran");
    assert!(err.contains("would take about") && err.contains("--max-seconds") && err.contains("tasks"), "{err}");
}
