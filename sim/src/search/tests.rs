//! The search against an exhaustive one on small spaces, and the bounds against simulation.

use super::*;
use crate::scenario::parse_for_search;

fn input(text: &str) -> SearchInput {
    parse_for_search(text, &|_| Err("no files".into())).expect("a valid search scenario")
}

/// GPT-3 1.3B on one DGX-1 (8 x V100 16 GB): memory rules out much of the space.
fn small(plan: &str) -> SearchInput {
    input(&format!(
        r#"{{"workload": {{"preset": "gpt3-1.3b"}}, "cluster": {{"node": "dgx-1-v100", "nodes": 1}},
            "training": {{"global_batch": 16, "seq_len": 1024}}, "plan": {plan}}}"#
    ))
}

/// A 4-layer model of 8 experts (top 2) on two DGX H100 nodes.
fn small_moe(plan: &str) -> SearchInput {
    input(&format!(
        r#"{{"workload": {{"transformer": {{"layers": 4, "hidden": 1024, "heads": 16, "vocab": 32000,
                "moe": {{"experts": 8, "top_k": 2, "expert_ffn": 2048, "imbalance": 1.2}}}}}},
            "cluster": {{"node": "dgx-h100", "nodes": 2}},
            "training": {{"global_batch": 32, "seq_len": 2048}}, "plan": {plan}}}"#
    ))
}

fn indices(v: &[Evaluated]) -> Vec<usize> {
    v.iter().map(|e| e.index).collect()
}

fn none(_: &Progress) {}

/// The exhaustive and the pruned search of `inp` (top 3), checked to agree on the top and the
/// front (`what` names the case in a failure).
fn exhaustive_and_pruned(inp: &SearchInput, what: &str) -> (Outcome, Outcome) {
    let all = search(inp, Options { top: 3, prune: false, extrapolate: false }, &none).unwrap();
    let pruned = search(inp, Options { top: 3, prune: true, extrapolate: true }, &none).unwrap();
    assert_eq!(indices(&pruned.top), indices(&all.top), "{what}");
    assert_eq!(indices(&pruned.pareto), indices(&all.pareto), "{what}");
    (all, pruned)
}

#[test]
fn pruned_search_finds_the_exhaustive_best_top_and_front() {
    // A sub-space (1F1B and interleaved, no offload) keeps the exhaustive run short.
    for plan in [r#"{"rank_order": "tp-dp-pp", "offload": "none"}"#, r#"{"tp": 2, "recompute": "full"}"#] {
        let inp = small(plan);
        let (all, pruned) = exhaustive_and_pruned(&inp, plan);
        assert!(all.best.is_some(), "{plan}: nothing fits");
        assert_eq!(pruned.best.as_ref().map(|e| e.index), all.best.as_ref().map(|e| e.index));
        let p = pruned.progress;
        assert_eq!(p.evaluated + p.pruned() + p.invalid, p.enumerated, "{p:?}");
        assert!(p.pruned() > 0, "{plan}: nothing pruned: {p:?}");
        assert!(p.evaluated < all.progress.evaluated, "{p:?}");
        // The front is sorted by time, with memory falling.
        for w in all.pareto.windows(2) {
            assert!(w[0].iteration_s <= w[1].iteration_s && w[0].peak_memory_bytes > w[1].peak_memory_bytes);
        }
    }
}

#[test]
fn bounds_are_never_above_the_simulated_values() {
    let h100 = input(
        r#"{"workload": {"preset": "gpt3-2.7b"}, "cluster": {"node": "dgx-h100", "nodes": 2},
            "training": {"global_batch": 32, "seq_len": 2048},
            "plan": {"rank_order": "tp-dp-pp", "recompute": "selective", "offload": "none", "tp_mode": "1d"}}"#,
    );
    for inp in [small(r#"{"rank_order": "tp-dp-pp"}"#), h100] {
        check_bounds(&inp, 50);
    }
}

/// A mixture-of-experts model with dense first layers (two layer kinds, the bound takes the
/// cheaper): bounds stay below simulation.
#[test]
fn bounds_hold_for_experts_with_dense_first_layers() {
    let moe = input(
        r#"{"workload": {"transformer": {"layers": 8, "hidden": 1024, "heads": 16, "vocab": 32000, "mlp": "swiglu",
                "norm": "rmsnorm", "rotary": true, "bias": false, "dropout": false, "ffn_hidden": 256,
                "moe": {"experts": 8, "top_k": 2, "expert_ffn": 1024, "shared_ffn": 512, "dense_layers": 6}}},
            "cluster": {"node": "dgx-h100", "nodes": 1},
            "training": {"global_batch": 32, "seq_len": 2048},
            "plan": {"rank_order": "tp-dp-pp", "offload": "none", "tp_mode": "1d", "recompute": "none"}}"#,
    );
    check_bounds(&moe, 50);
}

/// With a fixed `plan.ep` (the search does not choose it) the bounds stay bounds: expert
/// weights split by ep, all-to-alls bounded by 0.
#[test]
fn bounds_stay_below_the_simulated_values_under_expert_parallelism() {
    let moe = small_moe(r#"{"ep": 2, "rank_order": "tp-dp-pp", "offload": "none", "tp_mode": "1d"}"#);
    check_bounds(&moe, 10);
}

/// A narrow model with a large vocabulary (fuzz case 111, seed 2903, made small): the loss's
/// saved logits outweigh the layers, and under GPipe the last stage keeps one copy per
/// micro-batch. The memory bound counts the output layer's saved tensors for each micro-batch
/// the last stage holds, so it still bounds every plan and now rules out the GPipe plans
/// that the layers alone let through (each was simulated in full, thousands of micro-batches
/// long, before).
#[test]
fn the_memory_bound_counts_the_logits_each_held_micro_batch_keeps() {
    let wide = input(
        r#"{"workload": {"transformer": {"layers": 4, "hidden": 64, "heads": 1, "vocab": 131072}},
            "cluster": {"node": "dgx-1-v100", "nodes": 1},
            "training": {"global_batch": 256, "seq_len": 1024},
            "plan": {"rank_order": "tp-dp-pp", "offload": "none"}}"#,
    );
    check_bounds(&wide, 50);
    let all = search(&wide, Options { top: 1, prune: false, extrapolate: false }, &none).unwrap();
    let gpipe = |e: &&Evaluated| e.plan["schedule"] == "gpipe" && e.micro_batch == 1;
    let held: Vec<&Evaluated> = all.simulated.iter().filter(gpipe).collect();
    assert!(!held.is_empty());
    for e in held {
        assert!(!e.fits && !e.bounds.may_fit, "{}: {:?}", e.plan, e.bounds);
    }
}

fn check_bounds(inp: &SearchInput, at_least: usize) {
    let all = search(inp, Options { top: 1, prune: false, extrapolate: false }, &none).unwrap();
    assert!(all.simulated.len() > at_least, "{}", all.simulated.len());
    let mut tight = 0.0f64;
    for e in &all.simulated {
        assert!(
            e.bounds.iteration_s <= e.iteration_s,
            "time bound {} > simulated {} for {}",
            e.bounds.iteration_s,
            e.iteration_s,
            e.plan
        );
        assert!(
            e.bounds.peak_memory_bytes <= e.peak_memory_bytes,
            "memory bound {} > simulated {} for {}",
            e.bounds.peak_memory_bytes,
            e.peak_memory_bytes,
            e.plan
        );
        if !e.bounds.may_fit {
            assert!(!e.fits, "{} fits though its bound says it cannot", e.plan);
        }
        tight = tight.max(e.bounds.iteration_s / e.iteration_s);
    }
    // The bounds are informative, not zero.
    assert!(tight > 0.5, "the best time bound is {tight} of its simulated time");
}

#[test]
fn given_plan_keys_are_constraints() {
    let inp = small(r#"{"tp": 2, "schedule": "gpipe"}"#);
    let cands = space::enumerate(&inp);
    assert!(!cands.is_empty());
    for c in &cands {
        assert_eq!(c.plan["tp"], 2, "{}", c.plan);
        assert_eq!(c.plan["schedule"], "gpipe", "{}", c.plan);
    }
    let fixed_mb = input(
        r#"{"workload": {"preset": "gpt3-1.3b"}, "cluster": {"node": "dgx-1-v100", "nodes": 1},
            "training": {"global_batch": 16, "micro_batch": 2, "seq_len": 1024}}"#,
    );
    assert!(space::enumerate(&fixed_mb).iter().all(|c| c.micro_batch == 2));
    // Without constraints the space spans every searched dimension.
    let free = space::enumerate(&small("{}"));
    for key in crate::scenario::SEARCHED_KEYS {
        if *key == "partition" {
            continue;
        }
        let values: std::collections::BTreeSet<String> = free.iter().map(|c| c.plan[*key].to_string()).collect();
        assert!(values.len() > 1, "{key} takes one value: {values:?}");
    }
}

#[test]
fn an_impossible_constraint_is_the_readers_error() {
    let e = search(&small(r#"{"tp": 3}"#), Options::default(), &none).unwrap_err();
    assert!(e.path.starts_with("plan"), "{e}");
}

#[test]
fn the_outcome_does_not_depend_on_the_thread_count() {
    let inp = small(r#"{"rank_order": "tp-dp-pp", "recompute": "selective"}"#);
    let run = |threads| {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| serde_json::to_string(&search(&inp, Options::default(), &none).unwrap()).unwrap())
    };
    assert_eq!(run(1), run(3));
}

/// A twin's result is exactly what simulating it gives: every evaluated plan of a space with
/// both rank orders (tensor parallelism filling a 2-GPU node) and selective recomputation under
/// fused attention, simulated on its own, matches the search's entry bit for bit.
#[test]
fn twins_take_exactly_their_own_simulated_result() {
    let inp = input(
        r#"{"workload": {"preset": "gpt3-2.7b"}, "cluster": {"node": {"preset": "dgx-h100", "devices": 2}, "nodes": 4},
            "training": {"global_batch": 16, "seq_len": 1024, "precision": "bf16", "attention": "flash"},
            "plan": {"offload": "none", "zero_stage": 1, "tp_mode": "1d"}}"#,
    );
    let all = search(&inp, Options { top: 1, prune: false, extrapolate: false }, &none).unwrap();
    let p = all.progress;
    assert!(p.simulated < p.evaluated, "no twins: {p:?}");
    let c = space::enumerate(&inp);
    for e in &all.simulated {
        let s = scenario_of(&inp, &c[e.index]).unwrap();
        let r = crate::try_simulate(&s, false).unwrap().report;
        assert_eq!(
            (r.iteration_s, r.peak_memory_bytes, r.fits),
            (e.iteration_s, e.peak_memory_bytes, e.fits),
            "{}",
            e.plan
        );
    }
}

/// Expert parallelism is searched for a mixture-of-experts workload (every divisor of dp
/// that divides the experts, where the reader models it), the pruned search still finds the
/// exhaustive one's best, top and front, and the bounds hold for every ep.
#[test]
fn expert_parallelism_is_searched() {
    let moe = small_moe(
        r#"{"rank_order": "tp-dp-pp", "offload": "none", "tp_mode": "1d", "recompute": "none", "zero_stage": 1}"#,
    );
    let space = super::space::enumerate(&moe);
    let eps: std::collections::BTreeSet<u64> = space.iter().filter_map(|c| c.plan["ep"].as_u64()).collect();
    assert_eq!(eps.into_iter().collect::<Vec<_>>(), vec![1, 2, 4, 8]);
    // Megatron-Core's rule: expert parallelism with tensor parallelism needs sequence parallelism.
    assert!(space.iter().all(|c| c.plan["ep"] == 1 || c.plan["tp"] == 1 || c.plan["sequence_parallel"] == true));
    let (all, _) = exhaustive_and_pruned(&moe, "expert parallelism");
    assert_eq!(all.progress.invalid, 0, "every enumerated plan is one the reader accepts");
    assert!(all.simulated.iter().any(|e| e.plan["ep"].as_u64() > Some(1)));
    check_bounds(&moe, 10);
}

/// Context parallelism is searched for long sequences (powers of two leaving each rank at
/// least 4,096 tokens), not for short ones; the pruned search finds the exhaustive one's best,
/// top and front, every enumerated plan is one the reader accepts, and the bounds hold.
#[test]
fn context_parallelism_is_searched_for_long_sequences() {
    let long = input(
        r#"{"workload": {"transformer": {"layers": 4, "hidden": 1024, "heads": 16, "vocab": 32000}},
            "cluster": {"node": "dgx-h100", "nodes": 1},
            "training": {"global_batch": 8, "seq_len": 16384, "precision": "bf16", "attention": "flash"},
            "plan": {"rank_order": "tp-dp-pp", "offload": "none", "tp_mode": "1d", "recompute": "none",
                     "zero_stage": 1, "pp": 1}}"#,
    );
    let space = super::space::enumerate(&long);
    let cps: std::collections::BTreeSet<u64> =
        space.iter().map(|c| c.plan.get("cp").and_then(|v| v.as_u64()).unwrap_or(1)).collect();
    assert_eq!(cps.into_iter().collect::<Vec<_>>(), vec![1, 2, 4]);
    let (all, _) = exhaustive_and_pruned(&long, "context parallelism");
    assert_eq!(all.progress.invalid, 0, "every enumerated plan is one the reader accepts");
    assert!(all.simulated.iter().any(|e| e.plan["cp"].as_u64() > Some(1)));
    check_bounds(&long, 10);
    // Short sequences: no context parallelism.
    assert!(space::enumerate(&small("{}")).iter().all(|c| c.plan.get("cp").is_none()));
}

/// With `--frameworks` every plan is searched under each profile (outermost), each simulated
/// under its own, and the pruned search still finds the exhaustive one's best, top and front.
#[test]
fn framework_profiles_are_searched_when_asked() {
    let mut inp = small(r#"{"rank_order": "tp-dp-pp", "offload": "none", "tp": 2, "recompute": "full"}"#);
    let plain = space::enumerate(&inp).len();
    inp.frameworks = vec!["megatron-core", "deepspeed"];
    let space = space::enumerate(&inp);
    assert_eq!(space.len(), 2 * plain);
    assert!(space[..plain].iter().all(|c| c.framework == Some("megatron-core")));
    assert!(space[plain..].iter().all(|c| c.framework == Some("deepspeed")));
    let s = scenario_of(&inp, &space[plain]).unwrap();
    assert_eq!(s.plan.framework.name, "deepspeed");
    let (all, _) = exhaustive_and_pruned(&inp, "frameworks");
    let best = all.best.expect("a plan fits");
    assert!(best.framework.is_some());
    // Both profiles were simulated.
    let times = |f: &str| -> Vec<f64> {
        all.simulated.iter().filter(|e| e.framework == Some(f)).map(|e| e.iteration_s).collect()
    };
    assert!(!times("megatron-core").is_empty() && !times("deepspeed").is_empty());
}

/// Given recompute modules (torchtitan's per-op checkpointing) say what the selective
/// candidates rerun; the candidates that recompute all or nothing leave them out rather than
/// being refused for naming modules, so the search still weighs all three.
#[test]
fn given_recompute_modules_apply_to_the_selective_candidates() {
    let inp =
        small(r#"{"rank_order": "tp-dp-pp", "offload": "none", "tp": 1, "pp": 1, "recompute_modules": ["op_sac"]}"#);
    let cands = space::enumerate(&inp);
    let mut seen = std::collections::BTreeSet::new();
    for c in &cands {
        let rc = c.plan["recompute"].as_str().expect("recompute").to_string();
        assert_eq!(c.plan.get("recompute_modules").is_some(), rc == "selective", "{}", c.plan);
        seen.insert(rc);
    }
    assert_eq!(seen.len(), 3, "{seen:?}");
    let out = search(&inp, Options { top: 3, prune: true, extrapolate: true }, &none).unwrap();
    assert!(out.best.is_some());
    let p = out.progress;
    assert_eq!(p.invalid, 0, "no candidate refused for its modules: {p:?}");
}

/// A small model whose replicas run many micro-batches (`global_batch` 512 on 8 GPUs), with
/// the plan keys `plan` fixed, under the default kernel jitter.
fn many_micro_batches(plan: &str) -> SearchInput {
    many_micro_batches_under(plan, "{}")
}

/// [`many_micro_batches`] with the `simulation` object `sim`.
fn many_micro_batches_under(plan: &str, sim: &str) -> SearchInput {
    input(&format!(
        r#"{{"workload": {{"transformer": {{"layers": 4, "hidden": 512, "heads": 8, "vocab": 32000}}}},
            "cluster": {{"node": "dgx-1-v100", "nodes": 1}},
            "training": {{"global_batch": 512, "seq_len": 512}}, "plan": {plan}, "simulation": {sim}}}"#
    ))
}

/// Every plan the search measures from three short runs has the full simulation's time (to the
/// bit: both are whole nanoseconds), peak, fit and MFU (GPT-style layers, 1F1B, interleaved, GPipe, 2BW, ZeRO 0-3, offload and
/// recomputation as the space holds them); plans whose short runs do not settle on a line are
/// simulated in full. Without kernel jitter most plans settle; with it (the GPU default) the
/// plans whose gradient reduction waits out a stretch over every micro-batch do not, and the
/// rest are still exact.
#[test]
fn every_extrapolated_plan_equals_its_full_simulation() {
    for (sim, settled) in [(r#"{"kernel_jitter": 0}"#, 4), ("{}", 8)] {
        let inp = many_micro_batches_under(r#"{"rank_order": "tp-dp-pp"}"#, sim);
        let full = search(&inp, Options { top: 3, prune: false, extrapolate: false }, &none).unwrap();
        let short = search(&inp, Options { top: 3, prune: false, extrapolate: true }, &none).unwrap();
        assert_eq!(full.progress.extrapolated, 0);
        assert!(short.progress.extrapolated * settled > short.progress.simulated, "{sim}: {:?}", short.progress);
        assert_eq!(full.simulated.len(), short.simulated.len());
        for (f, s) in full.simulated.iter().zip(&short.simulated) {
            assert_eq!((f.index, f.fits, f.peak_memory_bytes), (s.index, s.fits, s.peak_memory_bytes), "{}", s.plan);
            assert_eq!(f.iteration_s, s.iteration_s, "{sim} {}: {f:?} {s:?}", s.plan);
            assert!((f.mfu - s.mfu).abs() <= 1e-9 * f.mfu, "{}", s.plan);
        }
        assert_eq!(indices(&short.top), indices(&full.top));
        assert_eq!(indices(&short.pareto), indices(&full.pareto));
        // The best plan is confirmed by a full simulation.
        assert!(!short.best.as_ref().unwrap().extrapolated);
    }
}

/// Under kernel jitter the search prunes by each plan's jitter-free short runs, taken
/// `JITTER_FREE_SLACK` lower: on every plan of the space they bound the jittered simulation's
/// time and peak from below, and the pruned search returns the exhaustive one's top and front
/// while simulating fewer plans.
#[test]
fn jitter_free_runs_bound_the_jittered_plan_and_prune_exactly() {
    let inp = many_micro_batches(r#"{"rank_order": "tp-dp-pp", "offload": "none", "recompute": "none"}"#);
    let all = search(&inp, Options { top: 3, prune: false, extrapolate: false }, &none).unwrap();
    let cands = space::enumerate(&inp);
    let mut checked = 0;
    for e in &all.simulated {
        let mut calm = scenario_of(&inp, &cands[e.index]).unwrap();
        assert!(calm.options.kernel_jitter(&calm.cluster) > 0.0);
        calm.options.kernel_jitter = Some(0.0);
        if let Some(c) = extrapolate::extrapolated(&calm) {
            let slack = 1.0 - JITTER_FREE_SLACK;
            assert!(c.iteration_s * slack <= e.iteration_s, "{}: {} > {}", e.plan, c.iteration_s, e.iteration_s);
            assert!(c.peak_memory_bytes * slack <= e.peak_memory_bytes, "{}", e.plan);
            checked += 1;
        }
    }
    assert!(checked * 4 > all.simulated.len(), "{checked} of {}", all.simulated.len());
    let pruned = search(&inp, Options { top: 3, prune: true, extrapolate: true }, &none).unwrap();
    assert_eq!(indices(&pruned.top), indices(&all.top));
    assert_eq!(indices(&pruned.pareto), indices(&all.pareto));
    let p = pruned.progress;
    assert_eq!(p.evaluated + p.pruned() + p.invalid, p.enumerated, "{p:?}");
    assert!(p.simulated * 2 < all.progress.simulated, "{p:?} against {:?}", all.progress);
}

/// The short runs: past the warm-up, congruent to the plan's count modulo the pipeline depth,
/// two periods apart, and only where they are a quarter of the plan's count or less.
#[test]
fn short_runs_keep_the_period_and_pay_off() {
    assert_eq!(extrapolate::short_counts(1, 1, 512), Some([4, 6, 8]));
    assert_eq!(extrapolate::short_counts(4, 1, 1023), Some([11, 19, 27]));
    assert_eq!(extrapolate::short_counts(4, 2, 1024), Some([20, 28, 36]));
    for (pp, v, m) in [(8, 1, 4096), (3, 2, 999), (2, 4, 250)] {
        let c = extrapolate::short_counts(pp, v, m).unwrap();
        assert!(c[0] > 2 * pp * v && c.iter().all(|x| x % pp == m % pp) && c[1] - c[0] == 2 * pp, "{c:?}");
    }
    assert_eq!(extrapolate::short_counts(1, 1, 31), None);
    assert_eq!(extrapolate::short_counts(8, 1, 200), None);
}

/// GPipe holds every micro-batch's activations until its backwards: the short runs' peaks
/// differ, so the plan is simulated in full.
#[test]
fn a_peak_that_grows_with_the_micro_batches_is_simulated_in_full() {
    let inp = many_micro_batches(
        r#"{"dp": 2, "tp": 1, "pp": 4, "schedule": "gpipe", "recompute": "none", "zero_stage": 0, "offload": "none"}"#,
    );
    let s = scenario_of(&inp, &space::enumerate(&inp)[0]).unwrap();
    assert!(s.plan.micro_batches >= 4 * 26, "{}", s.plan.micro_batches);
    assert_eq!(extrapolate::extrapolated(&s), None);
}
