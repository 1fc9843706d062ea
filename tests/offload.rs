//! Offload policies through the CLI: the one `offload` key, Gemini's report, the capacity
//! command's JSON.

use crate::util::{TempDir, run, scenario, small_transformer, stderr, stdout};
use serde_json::{Value, json};

fn plan(offload: Value) -> String {
    scenario(
        small_transformer(8, 2048, 16),
        1,
        json!({"global_batch": 16, "micro_batch": 2, "seq_len": 512, "precision": "fp16", "optimizer": "adam"}),
        json!({"dp": 8, "offload": offload}),
    )
}

/// An unknown policy names the key and lists the policies; nothing is simulated.
#[test]
fn an_unknown_policy_is_rejected_with_the_choices() {
    let dir = TempDir::new("offload-bad");
    for bad in [json!("gemeni"), json!({"policy": "gemeni"}), json!({"policy": "gemini", "params": "cpu"})] {
        let f = dir.write("bad.json", &plan(bad.clone()));
        let o = run(&[&"simulate", &f]);
        assert_ne!(o.status.code(), Some(0), "{bad} accepted");
        let e = stderr(&o);
        assert!(e.contains("plan.offload"), "{bad}: {e}");
        assert!(stdout(&o).is_empty(), "{bad}: printed a result");
        if bad.get("params").is_none() {
            assert!(e.contains("gemini") && e.contains("zero-offload"), "{bad}: {e}");
        }
    }
}

/// Every spelling of a policy reaches the same plan, and Gemini's report says what moved.
#[test]
fn policies_through_one_key_and_chunk_placement_in_the_report() {
    let dir = TempDir::new("offload-keys");
    let report = |off: Value| -> Value {
        let f = dir.write("s.json", &plan(off));
        let o = run(&[&"simulate", &f, &"--json"]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        serde_json::from_str(&stdout(&o)).expect("JSON report")
    };
    for (a, b) in [
        (json!("gemini"), json!({"policy": "gemini"})),
        (json!("zero-offload"), json!({"policy": "zero-offload"})),
        (json!("const"), json!({"policy": "const", "budget_bytes": 536870912.0})),
    ] {
        assert_eq!(report(a.clone())["iteration_s"], report(b)["iteration_s"], "{a}");
    }
    let g = report(json!("gemini"));
    let c = &g["chunk_placement"][0];
    assert!(c["chunks"].as_u64().unwrap() >= 8 && c["feasible"].as_bool() == Some(true), "{c}");
    assert!(report(json!("none")).get("chunk_placement").is_none());
}

/// `trainsim capacity --json` gives every policy's largest model and its throughput.
#[test]
fn capacity_json_lists_every_policy() {
    let dir = TempDir::new("capacity");
    let f = dir.write("s.json", &plan(json!("none")));
    let o = run(&[&"capacity", &f, &"--vary", &"hidden", &"--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).expect("JSON");
    let policies = v["policies"].as_array().expect("policies");
    let names: Vec<&str> = policies.iter().map(|p| p["policy"].as_str().unwrap()).collect();
    for want in ["device", "zero-offload", "zero3-cpu", "zero-infinity", "gemini", "const"] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
    let get = |n: &str| policies.iter().find(|p| p["policy"] == n).unwrap()["max_params"].as_f64().unwrap();
    assert!(get("zero3-cpu") > get("device") && get("gemini") > get("device"), "{v}");
    assert!(policies.iter().all(|p| p["samples_per_s"].as_f64().unwrap() > 0.0), "{v}");
}

/// Gemini packs every unit's parameters into chunks, the untied output layer's as well as the
/// embedding's: the head is a unit of its own (it once shared the embedding's number, and
/// Gemini's warm-up took it for the embedding and placed nothing of it: an untied model's
/// states on the device were a tied one's). Everything fits on the device here, so the
/// optimizer states there grow with the parameters.
#[test]
fn gemini_places_an_untied_head_as_well_as_the_embedding() {
    let run = |tied: bool| {
        let r = crate::util::simulate(&scenario(
            json!({"transformer": {"layers": 4, "hidden": 1024, "heads": 16, "vocab": 65536, "tied_embeddings": tied}}),
            1,
            json!({"global_batch": 16, "micro_batch": 2, "seq_len": 512, "precision": "bf16", "optimizer": "adam"}),
            json!({"dp": 8, "zero_stage": 3, "offload": "gemini"}),
        ));
        (r.memory_breakdown.optimizer, r.parameters)
    };
    let ((tied_states, tied_params), (untied_states, untied_params)) = (run(true), run(false));
    assert!((untied_params - tied_params - 65536.0 * 1024.0).abs() < 1.0, "the untied head's parameters");
    crate::util::assert_close(untied_states / tied_states, untied_params / tied_params, 1e-3, "states per parameter");
}
