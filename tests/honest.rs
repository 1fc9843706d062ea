//! Honest answers: inputs the simulator cannot model faithfully are refused or flagged, and
//! "fits" leaves the allocator its reserve.

use crate::util::*;
use serde_json::json;

fn gpt_on(node: &str, precision: &str, simulation: serde_json::Value) -> String {
    json!({
        "workload": small_transformer(4, 1024, 16),
        "cluster": {"node": node, "nodes": 1},
        "training": {"global_batch": 8, "micro_batch": 1, "seq_len": 1024, "precision": precision},
        "plan": {"dp": 8, "tp": 1, "pp": 1},
        "simulation": simulation,
    })
    .to_string()
}

/// A plan whose peak is 95% of the device's memory fits without headroom, and not with the
/// default allocator reserve; the default is stated in `defaults_applied`.
#[test]
fn memory_headroom_keeps_the_allocator_reserve() {
    let base = simulate(&gpt_on("dgx-a100-80gb", "bf16", json!({"memory_headroom": 0.0})));
    assert!(base.fits && base.memory_headroom_bytes == 0.0);
    // A custom device whose memory the same peak fills to 95%.
    let hbm = base.peak_memory_bytes / 0.95;
    let on_device = |simulation: serde_json::Value| {
        let mut v: serde_json::Value = serde_json::from_str(&gpt_on("dgx-a100-80gb", "bf16", simulation)).unwrap();
        v["cluster"]["node"] =
            json!({"preset": "dgx-a100-80gb", "device": {"preset": "a100-sxm-80gb", "hbm_bytes": hbm}});
        parse(&v.to_string())
    };
    let tight = sim::simulate(&on_device(json!({"memory_headroom": 0.0})), false).report;
    assert_close(tight.peak_memory_bytes, base.peak_memory_bytes, 1e-12, "same plan, same peak");
    assert!(tight.fits, "95% of memory fits when no headroom is kept");
    let s = on_device(json!({}));
    assert!(
        s.defaults_applied.iter().any(|d| d.starts_with("simulation.memory_headroom = 0.1")),
        "{:?}",
        s.defaults_applied
    );
    let r = sim::simulate(&s, false).report;
    assert!(!r.fits && !r.fits_hbm, "95% of memory must not fit beside a 10% allocator reserve");
    assert_close(r.memory_headroom_bytes, 0.1 * hbm, 1e-12, "headroom bytes");
    let small = sim::simulate(&on_device(json!({"memory_headroom": 0.04})), false).report;
    assert!(small.fits, "a 4% reserve leaves room for a 95% peak");
    let err = sim::scenario::parse(&gpt_on("dgx-a100-80gb", "bf16", json!({"memory_headroom": 0.95})), &no_files)
        .expect_err("a 95% headroom leaves nothing");
    assert!(err.to_string().contains("simulation.memory_headroom"), "{err}");
}

/// fp8 is refused on a device without fp8 tensor cores (naming the key and the device) and
/// accepted where the device has them.
#[test]
fn fp8_needs_fp8_tensor_cores() {
    let err = sim::scenario::parse(&gpt_on("dgx-a100-80gb", "fp8", json!({})), &no_files).expect_err("A100 has no fp8");
    let msg = err.to_string();
    assert!(msg.contains("training.precision") && msg.contains("a100-sxm-80gb"), "{msg}");
    let r = simulate(&gpt_on("dgx-h100", "fp8", json!({})));
    assert!(r.iteration_s > 0.0 && r.mfu > 0.0 && r.mfu <= 1.0);
}

/// A mixture-of-experts Hugging Face config is simulated with its experts, never as a dense
/// model: a Mixtral config of the same shape as a dense Mistral one has 7 more MLPs' worth of
/// parameters, reports the active ones, and runs two experts' MLP work per token. An expert
/// config this reader does not understand (DBRX's `ffn_config`) is refused as not supported.
#[test]
fn mixture_of_experts_configs_are_modelled_or_refused() {
    let dir = TempDir::new("moe");
    let dense = json!({"model_type": "mistral", "num_hidden_layers": 4, "hidden_size": 512,
        "num_attention_heads": 8, "num_key_value_heads": 8, "vocab_size": 32000, "intermediate_size": 1024,
        "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 1e6});
    let mut moe = dense.clone();
    moe["model_type"] = json!("mixtral");
    moe["num_local_experts"] = json!(8);
    moe["num_experts_per_tok"] = json!(2);
    let mut dbrx = dense.clone();
    dbrx["model_type"] = json!("dbrx");
    dbrx["ffn_config"] = json!({"moe_num_experts": 16, "moe_top_k": 4});
    dir.write("dense.json", &dense.to_string());
    dir.write("moe.json", &moe.to_string());
    dir.write("dbrx.json", &dbrx.to_string());
    let scenario = |config: &str| {
        json!({"workload": {"hf_config": config}, "cluster": {"node": "dgx-a100-80gb", "nodes": 1},
            "training": {"global_batch": 8, "seq_len": 512}, "plan": {"dp": 8, "tp": 1, "pp": 1}})
        .to_string()
    };
    let report = |name: &str| {
        let o =
            run(&[&"simulate", &dir.write(&format!("{name}-s.json"), &scenario(&format!("{name}.json"))), &"--json"]);
        assert!(o.status.success(), "{}", stderr(&o));
        serde_json::from_str::<serde_json::Value>(&stdout(&o)).unwrap()
    };
    let (d, m) = (report("dense"), report("moe"));
    let mlp = 3.0 * 512.0 * 1024.0;
    let router = 512.0 * 8.0;
    let extra = m["parameters"].as_f64().unwrap() - d["parameters"].as_f64().unwrap();
    assert!((extra - 4.0 * (7.0 * mlp + router)).abs() < 1.0, "{extra}");
    assert!(d.get("active_parameters").is_none(), "{d}");
    let active = m["active_parameters"].as_f64().unwrap() - d["parameters"].as_f64().unwrap();
    assert!((active - 4.0 * (mlp + router)).abs() < 1.0, "{active}");
    assert!(m["iteration_s"].as_f64().unwrap() > d["iteration_s"].as_f64().unwrap(), "{m} {d}");
    let mfu = m["mfu"].as_f64().unwrap();
    assert!(mfu > 0.0 && mfu <= 1.0, "{mfu}");
    let o = run(&[&"simulate", &dir.write("dbrx-s.json", &scenario("dbrx.json")), &"--json"]);
    let err = stderr(&o);
    assert!(!o.status.success(), "a DBRX config was simulated as a dense model");
    assert!(
        err.contains("not supported yet") && err.contains("mixture-of-experts") && err.contains("moe_num_experts"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

/// A CPU calibration profile is refused on a GPU scenario unless forced, and then the
/// report's notes say so.
#[test]
fn a_profile_from_another_device_needs_force() {
    let profile = repo("traces/2026-11-22-cpu-amd-epyc-2t/profile.json");
    let o = run(&[&"simulate", &custom_small(), &"--json", &"--profile", &profile]);
    let err = stderr(&o);
    assert!(!o.status.success(), "a CPU profile was applied to a GPU cluster");
    assert!(err.contains("--force-profile") && err.contains("Cpu"), "{err}");
    let o = run(&[&"simulate", &custom_small(), &"--json", &"--profile", &profile, &"--force-profile"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let notes = v["notes"].as_array().expect("notes");
    assert!(notes.iter().any(|n| n.as_str().unwrap_or("").contains("--force-profile")), "{notes:?}");
    // The CPU profile on the CPU node it was made for needs no force.
    let host = repo("experiments/executor/dp2.json");
    {
        let o = run(&[&"simulate", &host, &"--json", &"--profile", &profile]);
        assert!(o.status.success(), "{}", stderr(&o));
    }
}

/// Tensor parallelism across nodes runs, says so in the report, sends its collectives over
/// the NICs (a slower inter-node network slows it although dp = 1 sends nothing else across),
/// and the symmetric simulation matches the full one.
#[test]
fn tensor_parallelism_across_nodes_is_simulated_with_a_note() {
    let plan = |dp: u32, nodes: u32, nic_bytes_per_s: f64| {
        json!({"workload": {"preset": "gpt3-6.7b"},
            "cluster": {"node": "dgx-a100-80gb", "nodes": nodes,
                "inter_node": {"preset": "ib-hdr", "bandwidth_bytes_per_s": nic_bytes_per_s}},
            "training": {"global_batch": 8, "micro_batch": 1, "seq_len": 1024},
            "plan": {"dp": dp, "tp": 16, "pp": 1}})
        .to_string()
    };
    let across = parse(&plan(2, 4, 25e9));
    assert!(across.notes.iter().any(|n| n.contains("spans 2 nodes")), "{:?}", across.notes);
    let sym = sim::simulate(&across, false).report;
    assert!(!sym.notes.is_empty());
    let mut full = across.clone();
    full.options.symmetry = false;
    assert_eq!(sim::simulate(&full, false).report.iteration_s, sym.iteration_s);
    let fast = simulate(&plan(1, 2, 25e9));
    let slow = simulate(&plan(1, 2, 1e9));
    assert!(
        slow.iteration_s > 1.5 * fast.iteration_s,
        "{} s with 1 GB/s NICs vs {} s",
        slow.iteration_s,
        fast.iteration_s
    );
}
