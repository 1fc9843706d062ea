//! Token slicing (TeraPipe): the plan it lowers to and the report.

use crate::util::{scenario, simulate};
use serde_json::json;

fn w() -> serde_json::Value {
    json!({"transformer": {"layers": 8, "hidden": 1024, "heads": 16, "vocab": 1024}})
}

/// One slice of the whole sequence is the plain pipeline of whole micro-batches.
#[test]
fn one_slice_per_sequence_is_the_plain_pipeline() {
    let training = json!({"global_batch": 8, "micro_batch": 1, "seq_len": 1024, "precision": "fp16"});
    let plain = simulate(&scenario(w(), 1, training.clone(), json!({"dp": 1, "tp": 2, "pp": 4, "schedule": "gpipe"})));
    let sliced = simulate(&scenario(
        w(),
        1,
        training,
        json!({"dp": 1, "tp": 2, "pp": 4, "schedule": "gpipe", "token_slices": [1024]}),
    ));
    let rel = (sliced.iteration_s - plain.iteration_s).abs() / plain.iteration_s;
    assert!(rel < 0.01, "{} vs {}", sliced.iteration_s, plain.iteration_s);
    let ts = sliced.token_slicing.expect("token slicing reported");
    assert_eq!(ts.slices.len(), 8);
    assert!(ts.slices.iter().all(|(b, s)| *b == 1 && s == &vec![1024]));
    // With data parallelism across two nodes too (same placement, same all-reduce).
    let training = json!({"global_batch": 8, "micro_batch": 1, "seq_len": 1024, "precision": "fp16"});
    let plan = json!({"dp": 4, "tp": 1, "pp": 4, "schedule": "gpipe"});
    let plain = simulate(&scenario(w(), 2, training.clone(), plan.clone()));
    let mut sliced_plan = plan;
    sliced_plan["token_slices"] = json!([1024]);
    let sliced = simulate(&scenario(w(), 2, training, sliced_plan));
    let rel = (sliced.iteration_s - plain.iteration_s).abs() / plain.iteration_s;
    assert!(rel < 0.01, "dp 4 x pp 4: {} vs {}", sliced.iteration_s, plain.iteration_s);
}

/// `auto` picks slices covering every sequence, long slices first on a causal model, and
/// beats whole sequences on a deep pipeline with few sequences.
#[test]
fn auto_slicing_covers_the_batch_and_speeds_up_a_deep_pipeline() {
    let training = json!({"global_batch": 2, "micro_batch": 1, "seq_len": 2048, "precision": "fp16"});
    let r = simulate(&scenario(w(), 1, training, json!({"dp": 1, "tp": 1, "pp": 8, "token_slices": "auto"})));
    let ts = r.token_slicing.expect("token slicing reported");
    assert_eq!(ts.slices.iter().map(|(b, _)| b).sum::<u32>(), 2);
    for (_, s) in &ts.slices {
        assert_eq!(s.iter().sum::<u32>(), 2048);
    }
    assert!(ts.speedup > 1.0, "speedup {}", ts.speedup);
    assert!((ts.iteration_s_without / r.iteration_s - ts.speedup).abs() < 1e-9);
}

/// Later slices read the keys and values earlier ones keep: a sequence cut in slices keeps
/// at least the activations of its whole (the K/V of every slice stay until backward).
#[test]
fn sliced_sequences_keep_their_keys_and_values() {
    // Materialised scores (fused attention keeps no scores to shrink).
    let training =
        json!({"global_batch": 1, "micro_batch": 1, "seq_len": 1024, "precision": "fp16", "attention": "naive"});
    let one = simulate(&scenario(w(), 1, training.clone(), json!({"dp": 1, "tp": 1, "pp": 8, "token_slices": [1024]})));
    let four =
        simulate(&scenario(w(), 1, training, json!({"dp": 1, "tp": 1, "pp": 8, "token_slices": [256, 256, 256, 256]})));
    // Per-token activations are the same; only the attention scores shrink (each slice's
    // queries against its context instead of all queries against all keys).
    let (a1, a4) = (one.memory_breakdown.activations, four.memory_breakdown.activations);
    assert!(a4 < a1 && a4 > 0.5 * a1, "four slices {a4} vs one {a1}");
}

#[test]
fn token_slices_are_validated() {
    let training = json!({"global_batch": 2, "micro_batch": 1, "seq_len": 1024});
    for (plan, key) in [
        (json!({"pp": 8, "token_slices": [1000]}), "plan.token_slices"),
        (json!({"pp": 8, "token_slices": [[1, [1024]]]}), "plan.token_slices"),
        (json!({"pp": 8, "token_slices": [[1, [512, 256]], [1, [1024]]]}), "plan.token_slices[0]"),
        (json!({"pp": 8, "token_slices": "auto", "schedule": "1f1b"}), "plan.token_slices"),
        (json!({"pp": 8, "token_granularity": 8}), "plan.token_granularity"),
    ] {
        let text = scenario(w(), 1, training.clone(), plan.clone());
        let err = sim::scenario::parse(&text, &|_| Err("no files".into())).expect_err("rejected");
        assert_eq!(err.path, key, "{plan}: {err}");
    }
}

/// A slice's stage time is bounded below by the host issuing its ops: with a slow host
/// (200 us per op), the optimiser cuts each sequence into fewer, longer slices than with a
/// free host, and the simulated iteration is slower.
#[test]
fn a_slow_host_makes_the_optimiser_cut_longer_slices() {
    let training = json!({"global_batch": 2, "micro_batch": 1, "seq_len": 2048, "precision": "fp16"});
    let run = |host_op_s: f64| {
        let mut v: serde_json::Value = serde_json::from_str(&scenario(
            w(),
            1,
            training.clone(),
            json!({"dp": 1, "tp": 1, "pp": 8, "token_slices": "auto"}),
        ))
        .unwrap();
        v["simulation"] = json!({"host_op_s": host_op_s});
        simulate(&v.to_string())
    };
    let (free, slow) = (run(0.0), run(200e-6));
    let slices = |r: &sim::report::Report| {
        let ts = r.token_slicing.as_ref().expect("token slicing reported");
        ts.slices.iter().map(|(_, s)| s.len()).sum::<usize>()
    };
    assert!(
        slices(&slow) < slices(&free),
        "{} slices with a slow host vs {} with a free one",
        slices(&slow),
        slices(&free)
    );
    assert!(slow.iteration_s > free.iteration_s);
}

/// The slice cost is the slowest stage's: with one layer per stage, a large vocabulary makes
/// the last stage (its layer, the output layer and the loss) the slowest, so a slice costs
/// more than with a small one; on one stage everything is charged once.
#[test]
fn the_slice_cost_is_the_slowest_stage_s() {
    let cost = |vocab: u32, pp: u32| {
        let w = json!({"transformer": {"layers": 8, "hidden": 1024, "heads": 16, "vocab": vocab}});
        let training = json!({"global_batch": 8, "micro_batch": 1, "seq_len": 1024, "precision": "fp16"});
        let s = crate::util::parse(&scenario(w, 1, training, json!({"dp": 8 / pp, "tp": 1, "pp": pp})));
        let model = sim::cost::ComputeModel::new(&s.cluster.node.device, s.plan.precision, None);
        sim::cost::slice::slice_cost_s(&s, &model, 1, 256, 512)
    };
    let (small, large) = (cost(1024, 8), cost(256 * 1024, 8));
    assert!(large > 1.5 * small, "a 256k vocabulary: {large} s vs {small} s per slice");
    // The output layer's share is the same on one stage of 8 layers as on the last of 8 stages
    // (up to the embedding, charged to the first stage, which is cheaper than the last here).
    let (one_small, one_large) = (cost(1024, 1), cost(256 * 1024, 1));
    assert!(one_large > one_small);
    let rel = ((one_large - one_small) - (large - small)).abs() / (large - small);
    assert!(rel < 0.05, "head share on one stage {} vs on the last stage {}", one_large - one_small, large - small);
}

/// The human summary says what slicing bought and lists the chosen slices.
#[test]
fn the_summary_lists_the_slices_and_the_speedup() {
    let path = crate::util::repo("experiments/terapipe/setting10-gpt3-175b.json");
    let o = crate::util::run_cli(&["simulate", path.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", crate::util::stderr(&o));
    let text = crate::util::stdout(&o);
    let line = text.lines().find(|l| l.starts_with("token slices:")).expect("a token slices line");
    assert!(line.contains("without slicing") && line.contains("speedup"), "{line}");
    let listed: u32 = text
        .lines()
        .filter_map(|l| l.trim().split_once(" x ").filter(|(_, rest)| rest.contains("cut into")))
        .map(|(n, _)| n.parse::<u32>().unwrap())
        .sum();
    assert_eq!(listed, 2, "both sequences' sub-batches listed:\n{text}");
}
