//! Tests of `policy/token_slicing.rs`.
use super::*;
use rand::{RngExt, SeedableRng};
use rand_pcg::Pcg64Mcg;

const EXACT: Options = Options { candidate_tolerance: 0.0 };

fn rel_close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * a.abs().max(b.abs())
}

/// TeraPipe's shape: `b · (a0 + a1·l + a2·l·(l + c))` plus a fixed per-slice overhead, so
/// short slices are inefficient.
fn terapipe_cost(overhead: f64, a0: f64, a1: f64, a2: f64) -> impl Fn(u32, u32, u32) -> f64 {
    move |b, l, c| {
        let (b, l, c) = (b as f64, l as f64, c as f64);
        overhead + b * (a0 + a1 * l + a2 * l * (l + c))
    }
}

fn random_terapipe_cost(rng: &mut Pcg64Mcg) -> impl Fn(u32, u32, u32) -> f64 + use<> {
    terapipe_cost(
        rng.random_range(1e-4..5e-3),
        rng.random_range(0.0..1e-4),
        rng.random_range(1e-6..2e-5),
        rng.random_range(1e-9..2e-8),
    )
}

/// A random table over `b ≤ 3`, `l ≤ 48`, `c < 48`: integers in `[100, 10000)` (distinct
/// values more than 1e-5 apart, many exact ties), or log-uniform reals in `[0.01, 10)`.
fn random_table(rng: &mut Pcg64Mcg, integers: bool) -> Vec<f64> {
    (0..4 * 49 * 48)
        .map(
            |_| {
                if integers { rng.random_range(100..10_000u32) as f64 } else { 10f64.powf(rng.random_range(-2.0..1.0)) }
            },
        )
        .collect()
}

fn table_cost(table: &[f64]) -> impl Fn(u32, u32, u32) -> f64 + '_ {
    move |b, l, c| table[(b as usize * 49 + l as usize) * 48 + c as usize]
}

/// The scheme is well formed: every sub-batch's slices are positive, cover the sequence
/// and are whole units but for the last; the sizes are the optimiser's, largest first,
/// and cover the batch; the reported latency and largest slice are the scheme's own.
fn check_plan(p: &SliceProblem, plan: &SlicingPlan, cost: &SliceCost<'_>) {
    let sizes = sub_batch_sizes(p.batch);
    assert_eq!(plan.sub_batches.iter().map(|s| s.sequences).sum::<u32>(), p.batch, "{p:?} {plan:?}");
    for (k, sb) in plan.sub_batches.iter().enumerate() {
        assert!(sizes.contains(&sb.sequences), "{p:?} {sb:?}");
        assert!(k == 0 || plan.sub_batches[k - 1].sequences >= sb.sequences, "{p:?} {plan:?}");
        assert_eq!(sb.slices.iter().sum::<u32>(), p.seq_len, "{p:?} {sb:?}");
        assert!(sb.slices.iter().all(|&l| l > 0), "{p:?} {sb:?}");
        let whole = &sb.slices[..sb.slices.len() - 1];
        assert!(whole.iter().all(|l| l % p.granularity == 0), "{p:?} {sb:?}");
    }
    assert_eq!(plan.latency_s, latency(p, &plan.sub_batches, cost), "{p:?}");
    let max = plan
        .sub_batches
        .iter()
        .flat_map(|sb| {
            let mut c = 0;
            sb.slices.iter().map(move |&l| {
                c += l;
                cost(sb.sequences, l, c - l)
            })
        })
        .fold(0.0, f64::max);
    assert_eq!(plan.t_max_s, max, "{p:?}");
    assert!(plan.candidates.windows(2).all(|w| w[0].t_max_s < w[1].t_max_s), "{p:?}");
}

/// Pareto front of `(Σ t_i, max t_i)` pairs: no kept pair is matched or beaten in both.
fn pareto(mut pairs: Vec<(f64, f64)>) -> Vec<(f64, f64)> {
    pairs.sort_by(|x, y| x.0.total_cmp(&y.0).then(x.1.total_cmp(&y.1)));
    let mut front: Vec<(f64, f64)> = Vec::new();
    for q in pairs {
        if front.last().is_none_or(|last| q.1 < last.1) {
            front.push(q);
        }
    }
    front
}

/// Every multiset of sizes (non-increasing) summing to `left`.
fn partitions(left: u32, sizes: &[u32], parts: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
    if left == 0 {
        out.push(parts.clone());
        return;
    }
    for (i, &b) in sizes.iter().enumerate().rev() {
        if b <= left && parts.last().is_none_or(|&j| i <= j) {
            parts.push(i);
            partitions(left - b, sizes, parts, out);
            parts.pop();
        }
    }
}

/// Every composition of the units for every sub-batch split, the objective computed
/// directly. A sub-batch only enters the objective through its `(Σ, max)` pair, so it
/// chooses among its compositions' Pareto-optimal pairs (which loses nothing).
fn brute_force(p: &SliceProblem, cost: &SliceCost<'_>) -> f64 {
    let n = p.units();
    let pos: Vec<u32> = (0..=n).map(|i| (i as u32 * p.granularity).min(p.seq_len)).collect();
    let k1 = (p.stages - 1) as f64;
    let sizes = sub_batch_sizes(p.batch);
    let fronts: Vec<Vec<(f64, f64)>> = sizes
        .iter()
        .map(|&b| {
            let all = (0..1u64 << (n - 1))
                .map(|cuts| {
                    let (mut sum, mut max, mut start) = (0.0, 0.0f64, 0);
                    for end in 1..=n {
                        if end == n || cuts >> (end - 1) & 1 == 1 {
                            let t = cost(b, pos[end] - pos[start], pos[start]);
                            sum += t;
                            max = max.max(t);
                            start = end;
                        }
                    }
                    (sum, max)
                })
                .collect();
            pareto(all)
        })
        .collect();
    let mut splits = Vec::new();
    partitions(p.batch, &sizes, &mut Vec::new(), &mut splits);
    let mut best = f64::INFINITY;
    for split in splits {
        let mut choice = vec![0usize; split.len()];
        loop {
            let (mut sum, mut max) = (0.0, 0.0f64);
            for (part, &k) in split.iter().zip(&choice) {
                let (s, m) = fronts[*part][k];
                sum += s;
                max = max.max(m);
            }
            best = best.min(sum + k1 * max);
            // Next choice (odometer).
            let mut d = 0;
            while d < split.len() {
                choice[d] += 1;
                if choice[d] < fronts[split[d]].len() {
                    break;
                }
                choice[d] = 0;
                d += 1;
            }
            if d == split.len() {
                break;
            }
        }
    }
    best
}

/// The plain algorithm: every distinct slice cost as `t_max`, the full DP for each, no
/// early stop; `min T(t_max)`.
fn naive(p: &SliceProblem, cost: &SliceCost<'_>) -> f64 {
    let n = p.units();
    let pos: Vec<u32> = (0..=n).map(|i| (i as u32 * p.granularity).min(p.seq_len)).collect();
    let sizes = sub_batch_sizes(p.batch);
    let table = |b: u32, a: usize, m: usize| cost(b, pos[m] - pos[a], pos[a]);
    let mut values: Vec<f64> =
        sizes.iter().flat_map(|&b| (1..=n).flat_map(move |m| (0..m).map(move |a| table(b, a, m)))).collect();
    values.sort_by(f64::total_cmp);
    values.dedup();
    let mut best = f64::INFINITY;
    for t in values {
        let finals: Vec<f64> = sizes
            .iter()
            .map(|&b| {
                let mut f = vec![f64::INFINITY; n + 1];
                f[0] = 0.0;
                for m in 1..=n {
                    for a in 0..m {
                        let w = table(b, a, m);
                        if w <= t {
                            f[m] = f[m].min(f[a] + w);
                        }
                    }
                }
                f[n]
            })
            .collect();
        let mut g = vec![f64::INFINITY; p.batch as usize + 1];
        g[0] = 0.0;
        for x in 1..g.len() {
            for (i, &b) in sizes.iter().enumerate() {
                if b as usize <= x {
                    g[x] = g[x].min(g[x - b as usize] + finals[i]);
                }
            }
        }
        best = best.min(g[p.batch as usize] + (p.stages - 1) as f64 * t);
    }
    best
}

#[test]
fn dp_finds_the_brute_force_optimum_on_random_tables() {
    let mut rng = Pcg64Mcg::seed_from_u64(11);
    for case in 0..400 {
        let p = SliceProblem {
            seq_len: rng.random_range(1..=48),
            batch: rng.random_range(1..=3),
            stages: rng.random_range(1..=6),
            granularity: if rng.random_bool(0.5) { 4 } else { 8 },
        };
        // Integer costs keep distinct values 1e-4 apart, so the default merging is exact;
        // real-valued ones are checked exactly with tolerance 0.
        let integers = case % 2 == 0;
        let table = random_table(&mut rng, integers);
        let cost = table_cost(&table);
        let plan = optimize_with(&p, &cost, if integers { Options::default() } else { EXACT }).unwrap();
        check_plan(&p, &plan, &cost);
        let best = brute_force(&p, &cost);
        assert!(rel_close(plan.latency_s, best, 1e-9), "case {case} {p:?}: dp {} brute {best}", plan.latency_s);
    }
}

#[test]
fn dp_matches_the_plain_enumeration_on_larger_problems() {
    let mut rng = Pcg64Mcg::seed_from_u64(12);
    for case in 0..24 {
        let wide = case % 4 == 3;
        let p = SliceProblem {
            seq_len: if wide { rng.random_range(8..=40) } else { rng.random_range(64..=200) },
            batch: if wide { rng.random_range(33..=40) } else { rng.random_range(1..=6) },
            stages: rng.random_range(1..=48),
            granularity: 8,
        };
        let cost = random_terapipe_cost(&mut rng);
        let plan = optimize_with(&p, &cost, EXACT).unwrap();
        check_plan(&p, &plan, &cost);
        let best = naive(&p, &cost);
        assert!(rel_close(plan.latency_s, best, 1e-9), "case {case} {p:?}: dp {} naive {best}", plan.latency_s);
        let merged = optimize(&p, &cost).unwrap();
        check_plan(&p, &merged, &cost);
        assert!(merged.latency_s >= best * (1.0 - 1e-12) && merged.latency_s <= best * (1.0 + 1e-5), "{p:?}");
    }
}

#[test]
fn one_uniform_slice_is_the_plain_pipeline_of_one_micro_batch() {
    let mut rng = Pcg64Mcg::seed_from_u64(13);
    for _ in 0..50 {
        let p = SliceProblem {
            seq_len: rng.random_range(1..=4096),
            batch: rng.random_range(1..=64),
            stages: rng.random_range(1..=96),
            granularity: rng.random_range(1..=16),
        };
        let cost = random_terapipe_cost(&mut rng);
        let scheme = uniform(&p, 1);
        assert_eq!(scheme, vec![SubBatch { sequences: p.batch, slices: vec![p.seq_len] }]);
        let plain = p.stages as f64 * cost(p.batch, p.seq_len, 0);
        assert!(rel_close(latency(&p, &scheme, &cost), plain, 1e-12), "{p:?}");
    }
}

#[test]
fn uniform_slices_are_whole_units_longest_first_then_tokens() {
    let p = SliceProblem { seq_len: 20, batch: 3, stages: 4, granularity: 8 };
    assert_eq!(uniform(&p, 2)[0].slices, vec![16, 4]);
    assert_eq!(uniform(&p, 3)[0].slices, vec![8, 8, 4]);
    assert_eq!(uniform(&p, 5)[0].slices, vec![4, 4, 4, 4, 4]);
    assert_eq!(uniform(&p, 0)[0].slices, vec![20]);
    assert_eq!(uniform(&p, 99)[0].slices, vec![1; 20]);
    let p = SliceProblem { seq_len: 2048, batch: 2, stages: 4, granularity: 8 };
    assert_eq!(uniform(&p, 3)[0].slices, vec![688, 680, 680]);
}

#[test]
fn long_slices_come_first_when_context_costs_more() {
    // With attention linear in the context, Σ t_i does not depend on the order of the
    // slices and equal-objective orders can tie; a strictly concave context term (here
    // √c) makes every ascending neighbour pair strictly improvable by a swap (lower sum,
    // no higher max), so the exact optimum must be non-increasing.
    let mut rng = Pcg64Mcg::seed_from_u64(14);
    let mut sliced = 0;
    for case in 0..40 {
        let granularity = if rng.random_bool(0.5) { 4 } else { 8 };
        let p = SliceProblem {
            seq_len: granularity * rng.random_range(4..=48),
            batch: rng.random_range(1..=4),
            stages: rng.random_range(1..=32),
            granularity,
        };
        let (o, a1, a2, a3) = (
            rng.random_range(0.05..2.0),
            rng.random_range(0.0..0.05),
            rng.random_range(1e-4..2e-3),
            rng.random_range(1e-3..0.05),
        );
        let cost = move |b: u32, l: u32, c: u32| {
            let (b, l, c) = (b as f64, l as f64, c as f64);
            o + b * (a1 * l + a2 * l * (l + c) + a3 * l * c.sqrt())
        };
        let plan = optimize_with(&p, &cost, EXACT).unwrap();
        check_plan(&p, &plan, &cost);
        for sb in &plan.sub_batches {
            assert!(sb.slices.windows(2).all(|w| w[0] >= w[1]), "case {case} {p:?}: {sb:?}");
            sliced += usize::from(sb.slices.iter().collect::<std::collections::BTreeSet<_>>().len() > 2);
        }
    }
    assert!(sliced >= 40, "only {sliced} sub-batches have three distinct slice lengths");
}

#[test]
fn more_stages_never_help_and_the_optimum_beats_uniform_slicing() {
    let mut rng = Pcg64Mcg::seed_from_u64(15);
    for case in 0..12 {
        let base = SliceProblem {
            seq_len: rng.random_range(128..=400),
            batch: rng.random_range(1..=6),
            stages: 1,
            granularity: 8,
        };
        let cost = random_terapipe_cost(&mut rng);
        let mut previous = 0.0;
        for stages in 1..=12 {
            let p = SliceProblem { stages, ..base };
            let exact = optimize_with(&p, &cost, EXACT).unwrap();
            let merged = optimize(&p, &cost).unwrap();
            check_plan(&p, &exact, &cost);
            check_plan(&p, &merged, &cost);
            assert!(exact.latency_s >= previous * (1.0 - 1e-12), "case {case} {p:?}");
            assert!(merged.latency_s >= exact.latency_s * (1.0 - 1e-12), "case {case} {p:?}");
            previous = exact.latency_s;
            for slices in 1..=16 {
                let u = latency(&p, &uniform(&p, slices), &cost);
                assert!(exact.latency_s <= u * (1.0 + 1e-12), "case {case} {p:?} {slices} slices");
                assert!(merged.latency_s <= u * (1.0 + 1e-5), "case {case} {p:?} {slices} slices");
            }
        }
    }
}

#[test]
fn slices_cover_the_sequence_in_whole_units() {
    let mut rng = Pcg64Mcg::seed_from_u64(16);
    for _ in 0..60 {
        let p = SliceProblem {
            seq_len: rng.random_range(1..=300),
            batch: rng.random_range(1..=12),
            stages: rng.random_range(1..=24),
            granularity: rng.random_range(1..=16),
        };
        let cost = random_terapipe_cost(&mut rng);
        check_plan(&p, &optimize(&p, &cost).unwrap(), &cost);
    }
}

#[test]
fn gpt_sized_problem_is_solved_consistently() {
    // 2048 tokens in units of 8 through 40 stages, a batch of 32: correctness only.
    let p = SliceProblem::new(2048, 32, 40);
    let cost = terapipe_cost(2e-3, 1e-4, 1e-5, 5e-9);
    let plan = optimize(&p, &cost).unwrap();
    check_plan(&p, &plan, &cost);
    assert!(plan.stopped_early && plan.evaluated > 0 && !plan.candidates.is_empty());
    assert!(plan.sub_batches.iter().all(|sb| sb.slices.len() > 1), "{plan:?}");
    let best_total = plan.candidates.iter().map(|c| c.total_s).fold(f64::INFINITY, f64::min);
    assert!(plan.latency_s <= best_total * (1.0 + 1e-12));
    for c in &plan.candidates {
        assert!(c.total_s >= plan.latency_s * (1.0 - 1e-5), "{c:?}");
    }
    let best_uniform = (1..=16).map(|s| latency(&p, &uniform(&p, s), &cost)).fold(f64::INFINITY, f64::min);
    assert!(plan.latency_s <= best_uniform);
    let exact = optimize_with(&p, &cost, EXACT).unwrap();
    check_plan(&p, &exact, &cost);
    assert!(exact.latency_s <= plan.latency_s * (1.0 + 1e-12));
    assert!(plan.latency_s <= exact.latency_s * (1.0 + 1e-5));
}

#[test]
fn sub_batch_sizes_are_all_up_to_32_then_small_or_dividing() {
    assert_eq!(sub_batch_sizes(1), vec![1]);
    assert_eq!(sub_batch_sizes(32), (1..=32).collect::<Vec<_>>());
    assert_eq!(sub_batch_sizes(72), vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 18, 24, 36, 72]);
}

#[test]
fn one_stage_takes_the_least_total_work() {
    // K = 1: the objective is Σ t_i, settled by the unconstrained DP without a sweep.
    let p = SliceProblem { seq_len: 37, batch: 2, stages: 1, granularity: 4 };
    let mut rng = Pcg64Mcg::seed_from_u64(17);
    let table = random_table(&mut rng, false);
    let cost = table_cost(&table);
    let plan = optimize_with(&p, &cost, EXACT).unwrap();
    assert_eq!(plan.evaluated, 0);
    assert!(rel_close(plan.latency_s, brute_force(&p, &cost), 1e-9));
}

#[test]
fn the_plan_is_deterministic() {
    let p = SliceProblem { seq_len: 300, batch: 6, stages: 8, granularity: 8 };
    let cost = terapipe_cost(1e-3, 1e-4, 1e-5, 5e-9);
    let (a, b) = (optimize(&p, &cost).unwrap(), optimize(&p, &cost).unwrap());
    assert_eq!(a, b);
    assert_eq!(serde_json::to_string(&a).unwrap(), serde_json::to_string(&b).unwrap());
}
