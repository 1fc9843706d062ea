//! Where the time goes (`time_breakdown`): each device class's parts add up to the iteration,
//! parts that a plan cannot have are zero, slower links expose more communication, and HFU
//! counts recomputation.

use crate::util::{TempDir, repo, run, scenario, simulate, small_transformer, stdout, with_intra_node_bandwidth};
use serde_json::{Value, json};
use sim::report::Report;
use sim::report::breakdown::DeviceTime;

fn training(global_batch: u32, micro_batch: u32, seq_len: u32) -> Value {
    json!({"global_batch": global_batch, "micro_batch": micro_batch, "seq_len": seq_len,
           "precision": "bf16", "optimizer": "adam"})
}

fn example(rel: &str) -> Report {
    simulate(&std::fs::read_to_string(repo(rel)).unwrap_or_else(|e| panic!("{rel}: {e}")))
}

fn part(t: &DeviceTime, key: &str) -> f64 {
    t.parts().iter().find(|(k, _)| *k == key).unwrap_or_else(|| panic!("no part {key}")).1
}

/// The largest value of a part over the report's entries.
fn most(r: &Report, key: &str) -> f64 {
    r.time_breakdown.iter().map(|t| part(t, key)).fold(0.0, f64::max)
}

/// Every entry's parts are non-negative and add up to the iteration; the classes cover every
/// device once; the critical device comes first and is the busiest.
fn assert_adds_up(r: &Report, what: &str) {
    assert!(r.time_breakdown.len() >= 2, "{what}: no critical device and classes: {:?}", r.time_breakdown);
    assert_eq!(r.time_breakdown[0].role, "critical_device", "{what}");
    for t in &r.time_breakdown {
        for (k, v) in t.parts() {
            assert!(v >= 0.0 && v.is_finite(), "{what}: {k} = {v} in {t:?}");
        }
        let total = t.total_s();
        assert!(
            (total - r.iteration_s).abs() <= 1e-6 * r.iteration_s,
            "{what}: parts add up to {total} s, the iteration is {} s: {t:?}",
            r.iteration_s
        );
    }
    let classes = &r.time_breakdown[1..];
    assert!(classes.iter().all(|t| t.role == "device_class"), "{what}");
    assert_eq!(classes.iter().map(|t| t.devices).sum::<u32>(), r.devices, "{what}: classes do not cover the cluster");
    let stages: std::collections::BTreeSet<u32> = classes.iter().map(|t| t.stage).collect();
    assert_eq!(stages.len() as u32, r.plan.pp, "{what}: a class per stage");
    let busiest = classes.iter().map(|t| t.compute_s()).fold(0.0, f64::max);
    assert!(
        r.time_breakdown[0].compute_s() >= 0.999 * busiest - 1e-9,
        "{what}: the critical device is not the busiest"
    );
    r.check_invariants().unwrap_or_else(|e| panic!("{what}: {e}"));
}

#[test]
fn parts_add_up_to_the_iteration_on_every_kind_of_plan() {
    let cases = [
        ("experiments/parallelism/gpt3-6.7b-pp-1f1b.json", vec!["bubble_s", "exposed_pp_comm_s", "exposed_tp_comm_s"]),
        ("experiments/parallelism/gpt3-6.7b-zero3.json", vec!["exposed_dp_comm_s", "recompute_s"]),
        ("experiments/parallelism/gpt3-6.7b-zero-infinity.json", vec!["offload_wait_s", "exposed_dp_comm_s"]),
        ("experiments/offload/gpt2-10b-gemini.json", vec!["offload_wait_s"]),
        ("experiments/parallelism/gpt3-6.7b-tp16-across-nodes.json", vec!["exposed_tp_comm_s"]),
        ("experiments/terapipe/heldout-setting1-gpt3-1b.json", vec!["bubble_s"]),
    ];
    for (rel, nonzero) in cases {
        let r = example(rel);
        assert_adds_up(&r, rel);
        for key in nonzero {
            assert!(most(&r, key) > 0.0, "{rel}: {key} is zero: {:?}", r.time_breakdown);
        }
        // Every plan computes: GEMMs and the embedding or head.
        assert!(most(&r, "gemm_s") > 0.0 && most(&r, "embedding_head_s") > 0.0, "{rel}: {:?}", r.time_breakdown);
    }
    // PipeDream-2BW reports one batch's share of two runs; its parts still add up.
    let w = json!({"transformer": {"layers": 8, "hidden": 1024, "heads": 16, "vocab": 1024}});
    let two_bw = simulate(&scenario(w, 1, training(16, 2, 512), json!({"dp": 2, "pp": 4, "schedule": "2bw"})));
    assert_eq!(two_bw.plan.schedule, "2bw");
    assert_adds_up(&two_bw, "2bw");
}

#[test]
fn a_plan_without_pipeline_has_no_bubble_and_without_data_parallelism_no_dp_exposure() {
    for plan in
        [json!({"dp": 8, "tp": 1, "pp": 1}), json!({"dp": 2, "tp": 4, "pp": 1}), json!({"dp": 1, "tp": 8, "pp": 1})]
    {
        let r = simulate(&scenario(small_transformer(4, 2048, 16), 1, training(16, 2, 1024), plan.clone()));
        assert_adds_up(&r, &plan.to_string());
        assert_eq!(most(&r, "bubble_s"), 0.0, "{plan}: {:?}", r.time_breakdown);
        assert_eq!(most(&r, "exposed_pp_comm_s"), 0.0, "{plan}: {:?}", r.time_breakdown);
        if plan["dp"] == 1 {
            assert_eq!(most(&r, "exposed_dp_comm_s"), 0.0, "{plan}: {:?}", r.time_breakdown);
        }
        if plan["tp"] == 1 {
            assert_eq!(most(&r, "exposed_tp_comm_s"), 0.0, "{plan}: {:?}", r.time_breakdown);
        }
    }
    // The 1F1B example has dp = 1: pipeline waits, no data-parallel ones.
    let r = example("experiments/parallelism/gpt3-6.7b-pp-1f1b.json");
    assert_eq!(r.plan.dp, 1);
    assert_eq!(most(&r, "exposed_dp_comm_s"), 0.0, "{:?}", r.time_breakdown);
    assert_eq!(most(&r, "offload_wait_s"), 0.0, "{:?}", r.time_breakdown);
}

#[test]
fn a_slower_network_exposes_more_communication_of_the_plans_kind() {
    let cases = [
        (json!({"dp": 8, "tp": 1, "pp": 1}), "exposed_dp_comm_s"),
        (json!({"dp": 8, "tp": 1, "pp": 1, "zero_stage": 3}), "exposed_dp_comm_s"),
        (json!({"dp": 1, "tp": 8, "pp": 1}), "exposed_tp_comm_s"),
        (json!({"dp": 2, "tp": 1, "pp": 4, "schedule": "1f1b"}), "exposed_pp_comm_s"),
    ];
    for (plan, key) in cases {
        let base = scenario(small_transformer(8, 2048, 16), 1, training(16, 1, 1024), plan.clone());
        let fast = simulate(&with_intra_node_bandwidth(&base, 300e9));
        let slow = simulate(&with_intra_node_bandwidth(&base, 3e9));
        assert_adds_up(&fast, &plan.to_string());
        assert_adds_up(&slow, &plan.to_string());
        let (f, s) = (part(&fast.time_breakdown[0], key), part(&slow.time_breakdown[0], key));
        assert!(s > 2.0 * f && s > 0.0, "{plan}: {key} {f} s on a fast link, {s} s on a 100x slower one");
        // Compute depends on the link only through the SMs that overlapping NCCL collectives
        // take (one per channel, whose count follows the link's speed; at most half): the
        // data-parallel ones with dp > 1, and under Megatron-Core, the default here, the
        // column-parallel layers' backward collectives with tp > 1 (`tp_async_backward`);
        // within a factor 2. Pipeline traffic takes none. (Under Megatron-Core a pipeline
        // stage after the first reduces its gradients in one bucket after its last backward,
        // overlapping no compute of its own.)
        let (cf, cs) = (fast.time_breakdown[0].compute_s(), slow.time_breakdown[0].compute_s());
        if plan["dp"] != 1 || plan["tp"] != 1 {
            assert!(cs <= 2.0 * cf && cf <= 2.0 * cs, "{plan}: compute {cf} s vs {cs} s");
            assert!(cs != cf || plan["pp"] != 1, "{plan}: compute {cf} s vs {cs} s");
        } else {
            assert!((cf - cs).abs() <= 1e-6 * cf, "{plan}: compute {cf} s vs {cs} s");
        }
    }
}

/// Expert parallelism's all-to-alls have their own part: a slower network exposes more of them
/// under `exposed_ep_comm_s`, none under the tensor-parallel key (tp = 1), and a dense plan
/// has none.
#[test]
fn expert_all_to_alls_are_counted_apart_from_tensor_parallelism() {
    let mut w = small_transformer(8, 2048, 16);
    w["transformer"]["moe"] = json!({"experts": 8, "top_k": 2, "expert_ffn": 2048});
    let base = scenario(w, 1, training(16, 1, 1024), json!({"dp": 8, "ep": 8}));
    let fast = simulate(&with_intra_node_bandwidth(&base, 300e9));
    let slow = simulate(&with_intra_node_bandwidth(&base, 3e9));
    assert_adds_up(&fast, "ep 8");
    assert_adds_up(&slow, "ep 8");
    let (f, s) =
        (part(&fast.time_breakdown[0], "exposed_ep_comm_s"), part(&slow.time_breakdown[0], "exposed_ep_comm_s"));
    assert!(s > 2.0 * f && f > 0.0, "exposed_ep_comm_s {f} s on a fast link, {s} s on a 100x slower one");
    assert_eq!(most(&slow, "exposed_tp_comm_s"), 0.0, "{:?}", slow.time_breakdown);
    let dense = example("experiments/parallelism/gpt3-6.7b-pp-1f1b.json");
    assert_eq!(most(&dense, "exposed_ep_comm_s"), 0.0);
}

#[test]
fn compute_parts_are_the_busy_time_of_the_compute_stream() {
    // Without tensor parallelism the compute stream runs kernels only: the compute parts of
    // each stage are its measured busy time.
    let w = json!({"transformer": {"layers": 8, "hidden": 1024, "heads": 16, "vocab": 1024}});
    for plan in [json!({"dp": 2, "pp": 4, "schedule": "1f1b", "recompute": "full"}), json!({"dp": 8})] {
        let r = simulate(&scenario(w.clone(), 1, training(32, 2, 512), plan.clone()));
        assert_adds_up(&r, &plan.to_string());
        for t in &r.time_breakdown[1..] {
            let st = r.stages.iter().find(|s| s.stage == t.stage).expect("stage");
            assert!(
                (t.compute_s() - st.compute_busy_s).abs() <= 1e-6 * st.compute_busy_s,
                "{plan}: stage {}: compute parts {} s, busy {} s",
                t.stage,
                t.compute_s(),
                st.compute_busy_s
            );
        }
    }
}

#[test]
fn hfu_counts_recomputation_and_only_it() {
    let w = small_transformer(8, 2048, 16);
    let at = |recompute: &str| {
        // Materialised scores: what selective recomputation runs again.
        let mut t = training(16, 2, 1024);
        t["attention"] = json!("naive");
        simulate(&scenario(w.clone(), 1, t, json!({"dp": 8, "recompute": recompute})))
    };
    let (none, selective, full) = (at("none"), at("selective"), at("full"));
    assert_eq!(none.hfu, none.mfu);
    assert_eq!(none.hardware_flops_per_iteration, none.model_flops_per_iteration);
    assert_eq!(most(&none, "recompute_s"), 0.0);
    // Full recomputation runs the forward (a third of forward and backward) twice.
    let ratio = full.hardware_flops_per_iteration / full.model_flops_per_iteration;
    assert!((1.25..1.34).contains(&ratio), "full recomputation: hardware / model FLOPs = {ratio}");
    assert!(full.hfu > full.mfu && most(&full, "recompute_s") > 0.0);
    let sel = selective.hardware_flops_per_iteration / selective.model_flops_per_iteration;
    assert!(sel > 1.0 && sel < ratio, "selective recomputation: hardware / model FLOPs = {sel}");
    for r in [&none, &selective, &full] {
        assert_eq!(r.tokens_per_s_per_device, r.tokens_per_s / r.devices as f64);
        let hw = r.hardware_flops_per_iteration / r.iteration_s / r.devices as f64;
        assert!((r.hardware_flops_per_s_per_device - hw).abs() <= 1e-9 * hw);
    }
}

#[test]
fn a_slow_host_shows_as_host_time() {
    let base = |host: f64| {
        let mut v: Value =
            serde_json::from_str(&scenario(small_transformer(4, 512, 8), 1, training(8, 1, 256), json!({"dp": 8})))
                .unwrap();
        v["simulation"] = json!({"host_op_s": host});
        simulate(&v.to_string())
    };
    let (none, slow) = (base(0.0), base(2e-4));
    assert_adds_up(&none, "no host cost");
    assert_adds_up(&slow, "slow host");
    assert_eq!(most(&none, "host_s"), 0.0);
    assert!(most(&slow, "host_s") > 0.2 * slow.iteration_s, "{:?}", slow.time_breakdown);
}

#[test]
fn the_summary_prints_the_breakdown_table() {
    let tmp = TempDir::new("breakdown-summary");
    let file = tmp.write(
        "s.json",
        &scenario(
            small_transformer(8, 1024, 16),
            1,
            training(16, 1, 512),
            json!({"dp": 2, "pp": 4, "schedule": "1f1b"}),
        ),
    );
    let out = run(&[&"simulate", &file]);
    assert!(out.status.success());
    let text = stdout(&out);
    let table: Vec<&str> = text.lines().skip_while(|l| !l.starts_with("time split:")).take(8).collect();
    assert!(table.len() == 8, "no time split table:\n{text}");
    assert!(table[0].contains("% of the") && table[1].contains("gemm") && table[1].contains("bubble"), "{text}");
    assert!(table[2].contains("critical: device") && table[3].contains("stage 0: 2 x"), "{text}");
    assert!(table[7].contains("critical, ms"), "{text}");
    // The critical device's parts in milliseconds stand apart and add up to the iteration.
    let iteration_s: f64 = table[0].split_whitespace().find_map(|w| w.parse().ok()).expect("iteration in the title");
    let ms: f64 = table[7].split_whitespace().filter_map(|w| w.parse::<f64>().ok()).sum();
    assert!((ms - 1e3 * iteration_s).abs() < 0.01 * 1e3 * iteration_s, "{ms} ms against {iteration_s} s: {}", table[7]);
    // Each class row's percentages add up to 100.
    for row in &table[2..7] {
        let pct: f64 = row.split_whitespace().filter_map(|w| w.parse::<f64>().ok()).skip(1).sum();
        assert!((pct - 100.0).abs() < 1.0, "row adds up to {pct}%: {row}");
    }
}
