//! Tests of `policy/partition.rs`.
use super::*;
use rand::{RngExt, SeedableRng};
use rand_pcg::Pcg64Mcg;

const RULES: [StashRule; 3] = [StashRule::GPipe, StashRule::OneFOneB, StashRule::TwoBW];

fn rel_close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * a.abs().max(b.abs())
}

fn layer(compute_s: f64) -> LayerProfile {
    LayerProfile { compute_s, weight_bytes: 0.0, activation_bytes: 0.0, output_bytes: 0.0 }
}

fn free_device(speed: f64) -> StageDevice {
    StageDevice { speed, memory_bytes: f64::INFINITY, link_bytes_per_s: f64::INFINITY, link_latency_s: 0.0 }
}

/// Every composition of `n` into `p` positive parts, in lexicographic order.
fn compositions(n: u32, p: u32) -> Vec<Vec<u32>> {
    if p == 1 {
        return if n >= 1 { vec![vec![n]] } else { vec![] };
    }
    let mut all = Vec::new();
    for first in 1..=n.saturating_sub(p - 1) {
        for mut rest in compositions(n - first, p - 1) {
            rest.insert(0, first);
            all.push(rest);
        }
    }
    all
}

/// The objective of stage `k` of `p` on `layers[first..first + count]`, written out
/// independently of the module: (time, fits).
fn reference_stage(
    layers: &[LayerProfile],
    devices: &[StageDevice],
    m: u32,
    rule: StashRule,
    k: usize,
    first: usize,
    count: usize,
) -> (f64, bool) {
    let p = devices.len();
    let stage = &layers[first..first + count];
    let d = &devices[k];
    let compute: f64 = stage.iter().map(|l| l.compute_s).sum::<f64>() / d.speed;
    let transfer =
        if k + 1 < p { stage.last().unwrap().output_bytes / d.link_bytes_per_s + d.link_latency_s } else { 0.0 };
    let in_flight = match rule {
        StashRule::GPipe => m,
        _ => ((p - k) as u32).min(m),
    };
    let copies = if rule == StashRule::TwoBW { 2.0 } else { 1.0 };
    let memory = copies * stage.iter().map(|l| l.weight_bytes).sum::<f64>()
        + in_flight as f64 * stage.iter().map(|l| l.activation_bytes).sum::<f64>();
    (compute.max(transfer), memory <= d.memory_bytes)
}

/// Stage times (in order) of the first `counts.len()` stages of a `devices.len()`-stage
/// pipeline, and whether they all fit.
fn reference_cost(
    layers: &[LayerProfile],
    devices: &[StageDevice],
    m: u32,
    rule: StashRule,
    counts: &[u32],
) -> (Vec<f64>, bool) {
    let (mut first, mut times, mut fits) = (0, Vec::new(), true);
    for (k, &c) in counts.iter().enumerate() {
        let (time, stage_fits) = reference_stage(layers, devices, m, rule, k, first, c as usize);
        times.push(time);
        fits &= stage_fits;
        first += c as usize;
    }
    (times, fits)
}

fn max_of(times: &[f64]) -> f64 {
    times.iter().copied().fold(f64::NEG_INFINITY, f64::max)
}

fn min_of(times: &[f64]) -> f64 {
    times.iter().copied().fold(f64::INFINITY, f64::min)
}

/// Brute force over all compositions: the least bottleneck `B*` of the fitting plans, the
/// largest least stage time among those reaching it, and the plans reaching both.
fn brute_force(
    layers: &[LayerProfile],
    devices: &[StageDevice],
    m: u32,
    rule: StashRule,
) -> Option<(f64, f64, Vec<Vec<u32>>)> {
    let plans: Vec<(Vec<u32>, Vec<f64>)> = compositions(layers.len() as u32, devices.len() as u32)
        .into_iter()
        .filter_map(|counts| {
            let (times, fits) = reference_cost(layers, devices, m, rule, &counts);
            fits.then_some((counts, times))
        })
        .collect();
    let bottleneck = plans.iter().map(|(_, t)| max_of(t)).reduce(f64::min)?;
    let optimal = plans.iter().filter(|(_, t)| max_of(t) == bottleneck);
    let low = optimal.clone().map(|(_, t)| min_of(t)).reduce(f64::max).unwrap();
    let argmins = optimal.filter(|(_, t)| min_of(t) == low).map(|(c, _)| c.clone()).collect();
    Some((bottleneck, low, argmins))
}

/// The documented rule, by brute force: the plan of the first `len` layers over the first
/// `stages` stages (costed as in the full pipeline) whose stages all fit and take `≤ cap`,
/// with the largest least stage time; among those the longest last stage; the prefix by the
/// same rule, recursively.
fn reference_plan(
    layers: &[LayerProfile],
    devices: &[StageDevice],
    m: u32,
    rule: StashRule,
    stages: usize,
    len: usize,
    cap: f64,
) -> Option<Vec<u32>> {
    let plans: Vec<(Vec<u32>, f64)> = compositions(len as u32, stages as u32)
        .into_iter()
        .filter_map(|counts| {
            let (times, fits) = reference_cost(layers, devices, m, rule, &counts);
            (fits && max_of(&times) <= cap).then(|| (counts, min_of(&times)))
        })
        .collect();
    let low = plans.iter().map(|(_, t)| *t).reduce(f64::max)?;
    let last = plans.iter().filter(|(_, t)| *t == low).map(|(c, _)| *c.last().unwrap()).max().unwrap();
    let mut counts = if stages == 1 {
        vec![]
    } else {
        reference_plan(layers, devices, m, rule, stages - 1, len - last as usize, cap).unwrap()
    };
    counts.push(last);
    Some(counts)
}

/// Structural checks on a plan returned by `balanced`: contiguous non-empty stages covering
/// every layer, each fitting, and identical to `evaluate` of its counts.
fn check_plan(layers: &[LayerProfile], devices: &[StageDevice], m: u32, rule: StashRule, plan: &PartitionPlan) {
    assert_eq!(plan.stages.len(), devices.len());
    let mut next = 0u32;
    for (s, d) in plan.stages.iter().zip(devices) {
        assert_eq!(s.first_layer, next);
        assert!(s.last_layer >= s.first_layer);
        assert!(s.memory_bytes <= d.memory_bytes, "stage {s:?} exceeds {}", d.memory_bytes);
        next = s.last_layer + 1;
    }
    assert_eq!(next as usize, layers.len());
    let max = plan.stages.iter().map(|s| s.time_s).fold(0.0, f64::max);
    assert_eq!(plan.bottleneck_s, max);
    let (again, fits) = evaluate(layers, devices, m, rule, &plan.counts());
    assert!(fits);
    assert_eq!(&again, plan);
}

fn random_case(rng: &mut Pcg64Mcg, integer_times: bool) -> (Vec<LayerProfile>, Vec<StageDevice>, u32, StashRule) {
    let n = rng.random_range(1..=10usize);
    let p = rng.random_range(1..=5usize);
    let m = rng.random_range(1..=8u32);
    let rule = RULES[rng.random_range(0..3usize)];
    let layers: Vec<LayerProfile> = (0..n)
        .map(|_| LayerProfile {
            compute_s: if integer_times { rng.random_range(1..=4u32) as f64 } else { rng.random_range(0.1..1.0) },
            weight_bytes: rng.random_range(0.0..100.0),
            activation_bytes: rng.random_range(0.0..20.0),
            output_bytes: rng.random_range(0.0..1e9),
        })
        .collect();
    // A typical stage's memory, to scale capacities around: from all fitting to none fitting.
    let total: f64 = layers.iter().map(|l| 2.0 * l.weight_bytes + m as f64 * l.activation_bytes).sum();
    let typical = total / p as f64;
    let memory_mode = rng.random_range(0..4u32);
    let devices = (0..p)
        .map(|_| StageDevice {
            speed: if integer_times { 1.0 } else { rng.random_range(0.5..2.0) },
            memory_bytes: match memory_mode {
                0 => f64::INFINITY,
                1 => typical * rng.random_range(0.8..2.0),
                2 => typical * rng.random_range(0.2..1.2),
                _ => typical * rng.random_range(0.0..0.5),
            },
            link_bytes_per_s: if rng.random_bool(0.3) { f64::INFINITY } else { rng.random_range(5e8..1e10) },
            link_latency_s: if integer_times { 0.0 } else { rng.random_range(0.0..0.3) },
        })
        .collect();
    (layers, devices, m, rule)
}

#[test]
fn balanced_matches_brute_force_on_random_cases() {
    let mut rng = Pcg64Mcg::seed_from_u64(31);
    let (mut feasible, mut infeasible, mut fewer_layers) = (0, 0, 0);
    let mut per_rule = [0usize; 3];
    for case in 0..4000 {
        let (layers, devices, m, rule) = random_case(&mut rng, false);
        let got = balanced(&layers, &devices, m, rule);
        let want = brute_force(&layers, &devices, m, rule);
        if layers.len() < devices.len() {
            fewer_layers += 1;
        }
        match (&got, &want) {
            (None, None) => infeasible += 1,
            (Some(plan), Some((b, low, _))) => {
                feasible += 1;
                per_rule[RULES.iter().position(|&r| r == rule).unwrap()] += 1;
                assert!(
                    rel_close(plan.bottleneck_s, *b, 1e-12),
                    "case {case}: dp {} vs brute force {b}",
                    plan.bottleneck_s
                );
                let got_low = plan.stages.iter().map(|s| s.time_s).fold(f64::INFINITY, f64::min);
                assert!(rel_close(got_low, *low, 1e-12), "case {case}: fastest stage {got_low} vs {low}");
                check_plan(&layers, &devices, m, rule, plan);
            }
            _ => panic!("case {case}: feasibility differs: dp {got:?} vs brute force {want:?}"),
        }
    }
    // The generator covers both outcomes and every rule among the feasible cases.
    assert!(feasible > 1000 && infeasible > 500 && fewer_layers > 100, "{feasible} {infeasible} {fewer_layers}");
    assert!(per_rule.iter().all(|&c| c > 200), "{per_rule:?}");
}

#[test]
fn the_plan_is_the_documented_one_among_optima() {
    // Integer times on unit-speed devices make many plans tie exactly; real times too.
    let mut rng = Pcg64Mcg::seed_from_u64(32);
    let mut ties = 0;
    for case in 0..3000 {
        let (layers, devices, m, rule) = random_case(&mut rng, case % 2 == 0);
        let Some(plan) = balanced(&layers, &devices, m, rule) else { continue };
        let (b, _, argmins) = brute_force(&layers, &devices, m, rule).unwrap();
        assert_eq!(plan.bottleneck_s, b, "case {case}");
        ties += usize::from(argmins.len() > 1);
        let counts = plan.counts();
        assert!(argmins.contains(&counts), "case {case}: {counts:?} not among {argmins:?}");
        let longest_last = argmins.iter().map(|c| *c.last().unwrap()).max().unwrap();
        assert_eq!(*counts.last().unwrap(), longest_last, "case {case}: {argmins:?}");
        let want = reference_plan(&layers, &devices, m, rule, devices.len(), layers.len(), b).unwrap();
        assert_eq!(counts, want, "case {case}");
    }
    assert!(ties > 150, "{ties}");
}

#[test]
fn equal_layers_and_devices_match_uniform() {
    let mut rng = Pcg64Mcg::seed_from_u64(33);
    let mut compute_bound = 0;
    for _ in 0..500 {
        let p = rng.random_range(1..=6usize);
        let n = rng.random_range(p..=30usize);
        let m = rng.random_range(1..=8u32);
        let rule = RULES[rng.random_range(0..3usize)];
        let l = LayerProfile {
            compute_s: rng.random_range(0.1..1.0),
            weight_bytes: 10.0,
            activation_bytes: 1.0,
            output_bytes: rng.random_range(0.0..1e9),
        };
        let d = StageDevice {
            speed: 1.5,
            memory_bytes: 1e12,
            link_bytes_per_s: 1e9,
            link_latency_s: rng.random_range(0.0..0.5),
        };
        let (layers, devices) = (vec![l.clone(); n], vec![d.clone(); p]);
        let plan = balanced(&layers, &devices, m, rule).unwrap();
        let (even, fits) = uniform(&layers, &devices, m, rule);
        assert!(fits);
        assert!(plan.bottleneck_s <= even.bottleneck_s);
        // Identical layers: the optimum is ⌈n/p⌉ layers' compute, or a link if slower.
        let compute = (0..n.div_ceil(p)).fold(0.0, |s, _| s + l.compute_s) / 1.5;
        let link = if p > 1 { l.output_bytes / 1e9 + d.link_latency_s } else { 0.0 };
        assert_eq!(plan.bottleneck_s, compute.max(link));
        if n % p == 0 {
            assert_eq!(plan.bottleneck_s, even.bottleneck_s, "n {n} p {p}");
            if compute > link {
                // No stage may then hold more than n/p layers: the split is the uniform one.
                assert_eq!(plan.counts(), even.counts());
                compute_bound += 1;
            }
        }
    }
    assert!(compute_bound > 30, "{compute_bound}");
}

#[test]
fn balanced_is_never_worse_than_uniform() {
    let mut rng = Pcg64Mcg::seed_from_u64(34);
    let mut strictly_better = 0;
    for _ in 0..2000 {
        let (layers, devices, m, rule) = random_case(&mut rng, false);
        if layers.len() < devices.len() {
            continue;
        }
        let (even, fits) = uniform(&layers, &devices, m, rule);
        let (want_times, want_fits) = reference_cost(&layers, &devices, m, rule, &even.counts());
        assert_eq!(fits, want_fits);
        assert!(rel_close(even.bottleneck_s, max_of(&want_times), 1e-12));
        let plan = balanced(&layers, &devices, m, rule);
        if fits {
            let plan = plan.expect("uniform fits, so some plan does");
            assert!(plan.bottleneck_s <= even.bottleneck_s);
            strictly_better += usize::from(plan.bottleneck_s < even.bottleneck_s);
        }
    }
    assert!(strictly_better > 200, "{strictly_better}");
}

#[test]
fn uniform_gives_the_extra_layers_to_the_later_stages() {
    let layers = vec![layer(1.0); 11];
    let devices = vec![free_device(1.0); 4];
    let (plan, fits) = uniform(&layers, &devices, 4, StashRule::OneFOneB);
    assert!(fits);
    assert_eq!(plan.counts(), vec![2, 3, 3, 3]);
    assert_eq!(plan.bottleneck_s, 3.0);
    let firsts: Vec<u32> = plan.stages.iter().map(|s| s.first_layer).collect();
    assert_eq!(firsts, vec![0, 2, 5, 8]);
}

#[test]
fn compute_only_stage_times_are_within_one_layer_of_each_other() {
    let mut rng = Pcg64Mcg::seed_from_u64(35);
    for case in 0..3000 {
        let p = rng.random_range(1..=8usize);
        let n = rng.random_range(p..=40usize);
        let heavy_tail = rng.random_bool(0.3);
        let layers: Vec<LayerProfile> = (0..n)
            .map(|_| {
                layer(if heavy_tail { 10f64.powf(rng.random_range(-2.0..1.0)) } else { rng.random_range(0.1..1.0) })
            })
            .collect();
        let devices = vec![free_device(1.0); p];
        let rule = RULES[rng.random_range(0..3usize)];
        let plan = balanced(&layers, &devices, 4, rule).unwrap();
        let max_layer = layers.iter().map(|l| l.compute_s).fold(0.0, f64::max);
        let (lo, hi) =
            plan.stages.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), s| (lo.min(s.time_s), hi.max(s.time_s)));
        assert!(
            hi - lo <= max_layer * (1.0 + 1e-12),
            "case {case}: spread {} > max layer {max_layer}: {plan:?}",
            hi - lo
        );
    }
}

#[test]
fn a_twice_as_fast_device_gets_twice_the_layers() {
    let free = |speeds: &[f64], n: usize| {
        let plan = balanced(
            &vec![layer(1.0); n],
            &speeds.iter().map(|&s| free_device(s)).collect::<Vec<_>>(),
            1,
            StashRule::GPipe,
        )
        .unwrap();
        (plan.counts(), plan.bottleneck_s)
    };
    // Optimum L·t / Σ speeds when it divides: 9 / 3 = 3, 8 / 4 = 2, 12 / 6 = 2.
    assert_eq!(free(&[2.0, 1.0], 9), (vec![6, 3], 3.0));
    assert_eq!(free(&[1.0, 2.0], 9), (vec![3, 6], 3.0));
    assert_eq!(free(&[1.0, 2.0, 1.0], 8), (vec![2, 4, 2], 2.0));
    assert_eq!(free(&[4.0, 2.0], 12), (vec![8, 4], 2.0));
    // Not dividing: min over a of max(a/2, 10 − a) is 3.5 at a = 7.
    assert_eq!(free(&[2.0, 1.0], 10), (vec![7, 3], 3.5));
    // Uniform on the same devices is worse: 5 layers on the slow one.
    let devices = [free_device(2.0), free_device(1.0)];
    assert_eq!(uniform(&vec![layer(1.0); 10], &devices, 1, StashRule::GPipe).0.bottleneck_s, 5.0);
}

#[test]
fn a_slow_link_moves_the_cut_to_a_small_activation() {
    // Four equal layers on two devices; the middle cut's activation takes 10 s on the link,
    // the cut after layer 0 only 1 s, so the plan cuts there despite the compute imbalance.
    let mut layers = vec![layer(1.0); 4];
    for (l, bytes) in layers.iter_mut().zip([1e9, 1e10, 1e10, 1e10]) {
        l.output_bytes = bytes;
    }
    let devices = vec![StageDevice { link_bytes_per_s: 1e9, ..free_device(1.0) }; 2];
    let plan = balanced(&layers, &devices, 1, StashRule::OneFOneB).unwrap();
    assert_eq!(plan.counts(), vec![1, 3]);
    assert_eq!(plan.bottleneck_s, 3.0);
    assert_eq!(plan.stages[0].time_s, 1.0);
    assert_eq!(uniform(&layers, &devices, 1, StashRule::OneFOneB).0.bottleneck_s, 10.0);
}

#[test]
fn a_memory_cap_forces_the_split_under_each_rule() {
    // Six identical layers (1 s, 10 B of weights, 1 B stashed per micro-batch), m = 4, two
    // equal devices. Unconstrained the split is 3 + 3. Device 0 holds 36 B:
    //   GPipe: stash 4 → 3 layers need 42 B, 2 need 28 B → 2 + 4, bottleneck 4.
    //   1F1B:  stash min(2, 4) = 2 → 3 layers need 36 B (fits, inclusive) → 3 + 3.
    //   2BW:   stash 2, weights doubled → 2 layers need 44 B, 1 needs 22 B → 1 + 5.
    let layers = vec![LayerProfile { compute_s: 1.0, weight_bytes: 10.0, activation_bytes: 1.0, output_bytes: 0.0 }; 6];
    let cap = |c0: f64, c1: f64| {
        vec![StageDevice { memory_bytes: c0, ..free_device(1.0) }, StageDevice { memory_bytes: c1, ..free_device(1.0) }]
    };
    let devices = cap(36.0, 200.0);
    for (rule, counts, bottleneck, memory) in [
        (StashRule::GPipe, vec![2, 4], 4.0, vec![28.0, 56.0]),
        (StashRule::OneFOneB, vec![3, 3], 3.0, vec![36.0, 33.0]),
        (StashRule::TwoBW, vec![1, 5], 5.0, vec![22.0, 105.0]),
    ] {
        let plan = balanced(&layers, &devices, 4, rule).unwrap();
        check_plan(&layers, &devices, 4, rule, &plan);
        assert_eq!(plan.counts(), counts, "{rule:?}");
        assert_eq!(plan.bottleneck_s, bottleneck, "{rule:?}");
        assert_eq!(plan.stages.iter().map(|s| s.memory_bytes).collect::<Vec<_>>(), memory, "{rule:?}");
    }
    // Uniform's 3 + 3 does not fit under GPipe, and says so.
    let (even, fits) = uniform(&layers, &devices, 4, StashRule::GPipe);
    assert!(!fits);
    assert_eq!(even.stages[0].memory_bytes, 42.0);
    // A cap on device 1 as well: GPipe needs both stages ≤ 2 layers' 28 B, impossible for 6.
    assert_eq!(balanced(&layers, &cap(36.0, 41.0), 4, StashRule::GPipe), None);
    // 1F1B: stage 1 stashes 1 → 3 layers need 33 B: 3 + 3 fits.
    assert_eq!(balanced(&layers, &cap(36.0, 33.0), 4, StashRule::OneFOneB).unwrap().counts(), vec![3, 3]);
    // A single layer too big anywhere: nothing fits.
    assert_eq!(balanced(&layers, &cap(13.0, 1e9), 4, StashRule::GPipe), None);
}

#[test]
fn degenerate_shapes() {
    let layers = vec![layer(1.0); 3];
    assert_eq!(balanced(&layers, &[], 1, StashRule::GPipe), None);
    assert_eq!(balanced(&layers, &vec![free_device(1.0); 4], 1, StashRule::GPipe), None);
    assert_eq!(balanced(&[], &[free_device(1.0)], 1, StashRule::GPipe), None);
    // One layer per stage when they are as many.
    let plan = balanced(&layers, &vec![free_device(1.0); 3], 1, StashRule::GPipe).unwrap();
    assert_eq!(plan.counts(), vec![1, 1, 1]);
    // One stage: everything, no link.
    let one = StageDevice { link_bytes_per_s: 1.0, link_latency_s: 100.0, ..free_device(2.0) };
    let plan = balanced(&layers, &[one], 1, StashRule::GPipe).unwrap();
    assert_eq!((plan.counts(), plan.bottleneck_s), (vec![3], 1.5));
}

#[test]
#[should_panic(expected = "do not cover")]
fn evaluate_rejects_counts_that_do_not_cover_the_layers() {
    evaluate(&vec![layer(1.0); 3], &vec![free_device(1.0); 2], 1, StashRule::GPipe, &[1, 1]);
}

#[test]
fn stash_rules() {
    assert_eq!(StashRule::GPipe.in_flight(0, 4, 8), 8);
    assert_eq!(StashRule::GPipe.in_flight(3, 4, 8), 8);
    assert_eq!(StashRule::OneFOneB.in_flight(0, 4, 8), 4);
    assert_eq!(StashRule::OneFOneB.in_flight(3, 4, 8), 1);
    assert_eq!(StashRule::OneFOneB.in_flight(0, 4, 2), 2);
    assert_eq!(StashRule::TwoBW.in_flight(1, 4, 8), 3);
    assert_eq!(StashRule::TwoBW.weight_copies(), 2.0);
    assert_eq!(StashRule::OneFOneB.weight_copies(), 1.0);
}

#[test]
fn plans_serialize() {
    let plan = balanced(&vec![layer(1.0); 2], &vec![free_device(1.0); 2], 1, StashRule::GPipe).unwrap();
    let json = serde_json::to_value(&plan).unwrap();
    assert_eq!(json["bottleneck_s"], 1.0);
    assert_eq!(json["stages"][1]["first_layer"], 1);
    assert_eq!(serde_json::to_value(StashRule::TwoBW).unwrap(), "TwoBW");
}
