//! Tests of `policy/gemini.rs`.
use super::*;
use rand::{RngExt, SeedableRng};
use rand_pcg::Pcg64Mcg;

/// Brute force (tests only, tiny traces): the minimum number of fetches any schedule needs,
/// by dynamic programming over (step, resident set) with every choice allowed at each step:
/// any resident set containing the accessed chunk within the step's limit, evicting any
/// chunks and even prefetching (each chunk brought in costs one fetch). This covers the
/// exhaustive search over which resident chunk to evict at each miss. `None` if a step
/// admits no chunk.
fn brute_force_min_fetches(trace: &[Access], chunks: usize, cb: f64, cap: f64, init: &[usize]) -> Option<usize> {
    assert!(chunks <= 8);
    let full = 1usize << chunks;
    let mut best_from = vec![0usize; full]; // cost from step i on, by resident set before step i
    for a in trace.iter().rev() {
        let limit = ((cap - a.non_model_bytes) / cb).floor();
        if limit < 1.0 {
            return None;
        }
        let limit = limit as u32;
        let mut cur = vec![usize::MAX; full];
        for (s, slot) in cur.iter_mut().enumerate() {
            for (t, &rest) in best_from.iter().enumerate() {
                if t & (1 << a.chunk) == 0 || t.count_ones() > limit {
                    continue;
                }
                let cost = (t & !s).count_ones() as usize + rest;
                *slot = (*slot).min(cost);
            }
        }
        best_from = cur;
    }
    Some(best_from[init.iter().fold(0, |m, &c| m | (1 << c))])
}

/// Replays `p.moves` step by step and checks every invariant of [`place`]; returns nothing,
/// panics with `ctx` on a violation.
fn check_replay(trace: &[Access], chunks: usize, cb: f64, cap: f64, init: &[usize], p: &Placement, ctx: &str) {
    let mut resident = vec![false; chunks];
    for &c in init {
        resident[c] = true;
    }
    let mut count = init.len();
    let mut k = 0;
    let (mut fetches, mut evictions, mut peak, mut feasible) = (0, 0, 0.0f64, true);
    let mut last_step_with_moves = None;
    for (i, a) in trace.iter().enumerate() {
        let room = cap - a.non_model_bytes;
        let fit = if room.is_infinite() { chunks } else { ((room / cb) + 1e-9).floor().max(0.0) as usize };
        if fit == 0 {
            feasible = false;
        }
        let limit = fit.max(1);
        let mut fetched_here = 0;
        while k < p.moves.len() && p.moves[k].step == i {
            let m = p.moves[k];
            assert!(m.chunk < chunks, "{ctx}: bad chunk");
            if m.to_device {
                assert!(!resident[m.chunk], "{ctx}: fetch of a resident chunk at step {i}");
                assert_eq!(m.chunk, a.chunk, "{ctx}: fetch of a chunk not accessed at step {i}");
                resident[m.chunk] = true;
                count += 1;
                fetches += 1;
                fetched_here += 1;
                assert!(count <= limit, "{ctx}: {count} chunks over the limit {limit} at step {i}");
            } else {
                assert!(resident[m.chunk], "{ctx}: eviction of a non-resident chunk at step {i}");
                assert_ne!(m.chunk, a.chunk, "{ctx}: evicted the accessed chunk at step {i}");
                assert_eq!(fetched_here, 0, "{ctx}: eviction after the fetch at step {i}");
                resident[m.chunk] = false;
                count -= 1;
                evictions += 1;
            }
            last_step_with_moves = Some(i);
            k += 1;
        }
        assert!(resident[a.chunk], "{ctx}: accessed chunk {} not resident at step {i}", a.chunk);
        assert!(count <= limit, "{ctx}: {count} chunks over the limit {limit} at step {i}");
        if fit > 0 {
            assert!(
                count as f64 * cb + a.non_model_bytes <= cap + 1e-9 * cb,
                "{ctx}: device bytes over capacity at step {i}"
            );
        }
        peak = peak.max(count as f64 * cb + a.non_model_bytes);
    }
    assert_eq!(k, p.moves.len(), "{ctx}: moves at steps beyond the trace (last used {last_step_with_moves:?})");
    assert_eq!((fetches, evictions), (p.fetches, p.evictions), "{ctx}: move counts");
    assert_eq!(peak, p.peak_device_bytes, "{ctx}: peak");
    assert_eq!(feasible, p.feasible, "{ctx}: feasibility");
    assert_eq!(resident_after(chunks, init, &p.moves), (0..chunks).filter(|&c| resident[c]).collect::<Vec<_>>());
}

fn random_subset(rng: &mut Pcg64Mcg, chunks: usize) -> Vec<usize> {
    let mut v: Vec<usize> = (0..chunks).filter(|_| rng.random_bool(0.4)).collect();
    // shuffle so the LRU order of initially resident chunks is not the index order
    for i in (1..v.len()).rev() {
        let j = rng.random_range(0..=i);
        v.swap(i, j);
    }
    v
}

#[test]
fn belady_equals_brute_force_minimum_and_lru_is_never_better() {
    let mut rng = Pcg64Mcg::seed_from_u64(2024);
    let cb = 1.0; // chunk bytes; every size below is a multiple of 0.5, so all arithmetic is exact
    let (mut cases, mut lru_worse, mut forced_on_hit) = (0, 0, 0);
    for case in 0..6000 {
        let chunks = rng.random_range(1..=5usize);
        let len = rng.random_range(1..=12usize);
        let cap_chunks = rng.random_range(1..=4usize);
        let varying = case % 2 == 1;
        let cap = cap_chunks as f64 + if varying { 0.5 * rng.random_range(0..2) as f64 } else { 0.0 };
        let trace: Vec<Access> = (0..len)
            .map(|_| Access {
                chunk: rng.random_range(0..chunks),
                // keep at least one chunk of room so every case is feasible
                non_model_bytes: if varying { 0.5 * rng.random_range(0..=2 * (cap_chunks - 1)) as f64 } else { 0.0 },
            })
            .collect();
        let init = random_subset(&mut rng, chunks);
        let ctx = format!("case {case}: trace {trace:?} cap {cap} init {init:?}");
        let opt = brute_force_min_fetches(&trace, chunks, cb, cap, &init).expect("feasible by construction");
        let b = place(&trace, chunks, cb, cap, &init, Eviction::Belady);
        let l = place(&trace, chunks, cb, cap, &init, Eviction::Lru);
        assert!(b.feasible && l.feasible, "{ctx}");
        check_replay(&trace, chunks, cb, cap, &init, &b, &ctx);
        check_replay(&trace, chunks, cb, cap, &init, &l, &ctx);
        assert_eq!(b.fetches, opt, "{ctx}: Belady {:?}", b.moves);
        assert!(l.fetches >= b.fetches, "{ctx}: LRU {} better than Belady {}", l.fetches, b.fetches);
        cases += 1;
        lru_worse += usize::from(l.fetches > b.fetches);
        forced_on_hit += usize::from(
            b.moves.iter().any(|m| !m.to_device && !b.moves.iter().any(|f| f.to_device && f.step == m.step)),
        );
    }
    // The comparison must be able to tell policies apart, and the varying non-model memory
    // must actually force evictions on hits.
    assert!(lru_worse > cases / 50, "LRU worse than Belady in only {lru_worse} of {cases} cases");
    assert!(forced_on_hit > 0, "no case forced an eviction on a hit");
}

#[test]
fn belady_hand_trace() {
    // capacity 2 chunks, trace a b c a b: on c, evict b (next use 4) rather than a (next use 3);
    // on the last b, a and c are both never used again and the tie goes to the lower index, a.
    let t = |cs: &[usize]| cs.iter().map(|&c| Access { chunk: c, non_model_bytes: 0.0 }).collect::<Vec<_>>();
    let p = place(&t(&[0, 1, 2, 0, 1]), 3, 1.0, 2.0, &[], Eviction::Belady);
    assert_eq!(
        p.moves,
        vec![
            Move { step: 0, chunk: 0, to_device: true },
            Move { step: 1, chunk: 1, to_device: true },
            Move { step: 2, chunk: 1, to_device: false },
            Move { step: 2, chunk: 2, to_device: true },
            Move { step: 4, chunk: 0, to_device: false },
            Move { step: 4, chunk: 1, to_device: true },
        ]
    );
    assert_eq!((p.fetches, p.evictions, p.peak_device_bytes, p.feasible), (4, 2, 2.0, true));
    // LRU evicts a on c, then misses a and b again.
    let l = place(&t(&[0, 1, 2, 0, 1]), 3, 1.0, 2.0, &[], Eviction::Lru);
    assert_eq!(l.fetches, 5);
    // Never-used-again goes first even when another chunk is used late: trace 0 1 2 then 1.
    let p = place(&t(&[0, 1, 2, 1]), 3, 1.0, 2.0, &[], Eviction::Belady);
    assert_eq!(p.moves[2], Move { step: 2, chunk: 0, to_device: false });
    assert_eq!(p.fetches, 3);
    // Non-model memory forcing an eviction on a hit: two chunks resident, then a step with
    // 1.5 bytes of non-model memory in a capacity of 3 leaves room for one.
    let tr = vec![
        Access { chunk: 0, non_model_bytes: 0.0 },
        Access { chunk: 1, non_model_bytes: 0.0 },
        Access { chunk: 1, non_model_bytes: 1.5 },
    ];
    let p = place(&tr, 2, 1.0, 3.0, &[], Eviction::Belady);
    assert_eq!(p.moves.last(), Some(&Move { step: 2, chunk: 0, to_device: false }));
    assert_eq!(p.peak_device_bytes, 2.5);
    assert_eq!(resident_after(2, &[], &p.moves), vec![1]);
}

#[test]
fn policies_never_exceed_capacity_on_random_traces() {
    let mut rng = Pcg64Mcg::seed_from_u64(77);
    for case in 0..800 {
        let chunks = rng.random_range(1..=30usize);
        let cb = rng.random_range(1.0..100.0);
        let cap = cb * rng.random_range(0.5..12.0);
        let len = rng.random_range(0..200usize);
        let trace: Vec<Access> = (0..len)
            .map(|_| Access {
                chunk: rng.random_range(0..chunks),
                non_model_bytes: if rng.random_bool(0.5) { 0.0 } else { rng.random_range(0.0..cap) },
            })
            .collect();
        let init = random_subset(&mut rng, chunks);
        for ev in [Eviction::Belady, Eviction::Lru] {
            let p = place(&trace, chunks, cb, cap, &init, ev);
            check_replay(&trace, chunks, cb, cap, &init, &p, &format!("case {case} {ev:?}"));
            if p.feasible {
                assert!(p.peak_device_bytes <= cap + 1e-9 * cb, "case {case} {ev:?}: peak over capacity");
            }
        }
    }
}

#[test]
fn infeasible_step_is_reported_and_peak_shows_the_overflow() {
    let tr = vec![
        Access { chunk: 0, non_model_bytes: 0.0 },
        Access { chunk: 1, non_model_bytes: 9.0 },
        Access { chunk: 0, non_model_bytes: 0.0 },
    ];
    // Capacity 10: step 1 has room for exactly one chunk, so chunk 0 must leave.
    let p = place(&tr, 2, 1.0, 10.0, &[], Eviction::Belady);
    assert!(p.feasible);
    assert_eq!((p.fetches, p.evictions, p.peak_device_bytes), (3, 1, 10.0));
    check_replay(&tr, 2, 1.0, 10.0, &[], &p, "feasible");
    // Capacity 9.4: step 1 has 0.4 bytes of room, less than a chunk.
    let p = place(&tr, 2, 1.0, 9.4, &[], Eviction::Belady);
    assert!(!p.feasible);
    assert_eq!((p.fetches, p.evictions, p.peak_device_bytes), (3, 1, 10.0));
    check_replay(&tr, 2, 1.0, 9.4, &[], &p, "infeasible");
}

#[test]
fn unlimited_device_memory_moves_nothing_after_initial_residency() {
    let mut rng = Pcg64Mcg::seed_from_u64(5);
    for case in 0..300 {
        let chunks = rng.random_range(1..=20usize);
        let cb = rng.random_range(0.1..10.0);
        let trace: Vec<Access> = (0..rng.random_range(0..100usize))
            .map(|_| Access { chunk: rng.random_range(0..chunks), non_model_bytes: rng.random_range(0.0..50.0) })
            .collect();
        let max_nm = trace.iter().map(|a| a.non_model_bytes).fold(0.0, f64::max);
        let all: Vec<usize> = (0..chunks).collect();
        for cap in [chunks as f64 * cb + max_nm, f64::INFINITY] {
            for ev in [Eviction::Belady, Eviction::Lru] {
                let p = place(&trace, chunks, cb, cap, &all, ev);
                assert!(p.moves.is_empty(), "case {case} cap {cap} {ev:?}: {:?}", p.moves);
                assert!(p.feasible);
                // Starting with nothing resident: each accessed chunk comes in once, nothing leaves.
                let p = place(&trace, chunks, cb, cap, &[], ev);
                let mut distinct: Vec<usize> = trace.iter().map(|a| a.chunk).collect();
                distinct.sort_unstable();
                distinct.dedup();
                assert_eq!(p.evictions, 0, "case {case} cap {cap} {ev:?}");
                assert_eq!(p.fetches, distinct.len(), "case {case} cap {cap} {ev:?}");
                check_replay(&trace, chunks, cb, cap, &[], &p, &format!("case {case}"));
            }
        }
    }
}

/// Transformer-like parameter list (GPT-2 style, first-use order): token and position
/// embeddings, then per layer LN, QKV, projection, LN, MLP, then the final LN.
fn transformer(h: u64, layers: usize, vocab: u64, positions: u64) -> Vec<u64> {
    let mut p = vec![vocab * h, positions * h];
    for _ in 0..layers {
        p.extend([h, h, 3 * h * h, 3 * h, h * h, h, h, h, 4 * h * h, 4 * h, 4 * h * h, h]);
    }
    p.extend([h, h]);
    p
}

/// Independent re-implementation of the search's scan: the outlier limit by two-pass
/// statistics, the candidates by stepping, the waste from [`pack`].
fn direct_scan(params: &[u64], s: &ChunkSearch) -> (Vec<u64>, Vec<(u64, u64)>) {
    let n = params.len() as f64;
    let mean = params.iter().sum::<u64>() as f64 / n;
    let sd = (params.iter().map(|&p| (p as f64 - mean) * (p as f64 - mean)).sum::<f64>() / n).sqrt();
    let kept: Vec<u64> = params.iter().copied().filter(|&p| (p as f64) <= mean + 3.0 * sd).collect();
    let max = *kept.iter().max().unwrap();
    let mut start = s.interval;
    while start < max {
        start += s.interval;
    }
    let mut scan = Vec::new();
    let mut c = start;
    while c <= start + s.search_range {
        let waste: u64 = pack(&kept, c).iter().map(|ch| ch.capacity - ch.used).sum();
        scan.push((c, waste));
        c += s.interval;
    }
    (kept, scan)
}

fn check_search(params: &[u64], s: &ChunkSearch, ctx: &str) -> u64 {
    let got = search_chunk_size(params, s);
    let (kept, scan) = direct_scan(params, s);
    assert_eq!(drop_outliers(params), kept, "{ctx}: outliers");
    assert_eq!(candidate_sizes(params, s), scan.iter().map(|&(c, _)| c).collect::<Vec<_>>(), "{ctx}: candidates");
    let min_waste = scan.iter().map(|&(_, w)| w).min().unwrap();
    let best = scan.iter().find(|&&(_, w)| w == min_waste).unwrap().0;
    assert_eq!(got, best.div_ceil(s.dp_lcm) * s.dp_lcm, "{ctx}: scan {scan:?}");
    assert_eq!(got % s.dp_lcm, 0, "{ctx}");
    assert!(got >= *kept.iter().max().unwrap(), "{ctx}: smaller than the largest kept tensor");
    if s.interval.is_multiple_of(s.dp_lcm) {
        assert_eq!(got % s.interval, 0, "{ctx}");
        let w = chunk_waste(&kept, got);
        assert!(scan.iter().all(|&(_, sw)| w <= sw), "{ctx}: waste {w} above a candidate: {scan:?}");
    }
    got
}

fn check_pack(params: &[u64], chunk: u64, ctx: &str) {
    let chunks = pack(params, chunk);
    let order: Vec<usize> = chunks.iter().flat_map(|c| c.tensors.iter().copied()).collect();
    assert_eq!(order, (0..params.len()).collect::<Vec<_>>(), "{ctx}: every tensor once, in order");
    for (k, c) in chunks.iter().enumerate() {
        assert_eq!(c.used, c.tensors.iter().map(|&i| params[i]).sum::<u64>(), "{ctx}");
        assert!(c.used <= c.capacity, "{ctx}: chunk {k} overflows");
        if c.capacity != chunk {
            // An oversized tensor's own chunk; only zero-size tensors can follow it there.
            assert!(params[c.tensors[0]] > chunk && c.capacity == params[c.tensors[0]], "{ctx}: chunk {k}");
            assert!(c.tensors[1..].iter().all(|&i| params[i] == 0), "{ctx}: chunk {k} shares an oversized chunk");
        }
        if k > 0 {
            let prev = &chunks[k - 1];
            assert!(prev.used + params[c.tensors[0]] > prev.capacity, "{ctx}: chunk {k} opened needlessly");
        }
    }
    let waste: u64 = chunks.iter().map(|c| c.capacity - c.used).sum();
    assert_eq!(chunk_waste(params, chunk), waste, "{ctx}: chunk_waste disagrees with pack");
}

#[test]
fn chunk_search_on_transformer_like_models() {
    let cases = [
        (768, 12, 50257, 8, true),
        (1024, 24, 50304, 4, true),
        (1600, 48, 50257, 64, true),
        // A small vocabulary: the 82 M-element embedding, 1.2× the MLP weight, is no outlier.
        (4096, 4, 20000, 2, false),
    ];
    for (h, layers, vocab, dp, embedding_outlier) in cases {
        let params = transformer(h, layers, vocab, 1024);
        let s = ChunkSearch { interval: h, search_range: 64 * h * h / 8, dp_lcm: dp };
        let ctx = format!("h={h} L={layers}");
        let got = check_search(&params, &s, &ctx);
        check_pack(&params, got, &ctx);
        assert_eq!(!drop_outliers(&params).contains(&(vocab * h)), embedding_outlier, "{ctx}");
        if embedding_outlier {
            // The outlier gets its own chunk of its size; the search ignores it.
            assert!(got < vocab * h, "{ctx}");
            assert_eq!(pack(&params, got)[0], Chunk { tensors: vec![0], used: vocab * h, capacity: vocab * h });
            assert!(got >= 4 * h * h, "{ctx}: below the MLP weight");
        } else {
            assert!(got >= vocab * h, "{ctx}");
        }
    }
}

#[test]
fn chunk_search_hand_cases() {
    let s = |interval, search_range, dp_lcm| ChunkSearch { interval, search_range, dp_lcm };
    // Four tensors of 3: chunk 3 wastes nothing; 4 wastes 4; 5 wastes 8; 6 wastes 0 (tie, 3 first).
    assert_eq!(search_chunk_size(&[3, 3, 3, 3], &s(1, 3, 1)), 3);
    assert_eq!(chunk_waste(&[3, 3, 3, 3], 4), 4);
    assert_eq!(chunk_waste(&[3, 3, 3, 3], 5), 8);
    // Sizes 5,3,4: chunk 5 packs [5][3][4] → 0+2+1 = 3; 6: [5][3][4] → 1+3+2 = 6; 7: [5][3,4]
    // → 2+0 = 2; 8: [5,3][4] → 0+4 = 4; 12: [5,3,4] → 0.
    assert_eq!(chunk_waste(&[5, 3, 4], 5), 3);
    assert_eq!(chunk_waste(&[5, 3, 4], 7), 2);
    assert_eq!(search_chunk_size(&[5, 3, 4], &s(1, 3, 1)), 7);
    assert_eq!(search_chunk_size(&[5, 3, 4], &s(1, 7, 1)), 12);
    // Rounding to dp_lcm happens after the scan: 7 → 9 with dp_lcm 3, although 9 wastes
    // [5,3][4] → 1+5 = 6, more than 7 did.
    assert_eq!(search_chunk_size(&[5, 3, 4], &s(1, 3, 3)), 9);
    // Interval rounding of the start: max 5, interval 4 → start 8.
    assert_eq!(candidate_sizes(&[5, 3, 4], &s(4, 8, 1)), vec![8, 12, 16]);
    // One huge tensor among many small ones is dropped from the search.
    let mut p = vec![10u64; 20];
    p.push(1000);
    assert_eq!(drop_outliers(&p), vec![10u64; 20]);
    assert_eq!(search_chunk_size(&p, &s(10, 100, 1)), 10);
    let packed = pack(&p, 10);
    assert_eq!(packed.len(), 21);
    assert_eq!(packed[20], Chunk { tensors: vec![20], used: 1000, capacity: 1000 });
    // Equal sizes: σ = 0, nothing dropped.
    assert_eq!(drop_outliers(&[7, 7, 7]), vec![7, 7, 7]);
}

#[test]
fn chunk_search_and_pack_on_random_lists() {
    let mut rng = Pcg64Mcg::seed_from_u64(31);
    for case in 0..1500 {
        let n = rng.random_range(1..60usize);
        let big = rng.random_range(1..5000u64);
        let params: Vec<u64> = (0..n)
            .map(|_| if rng.random_bool(0.05) { rng.random_range(0..50 * big) } else { rng.random_range(0..=big) })
            .collect();
        let interval = rng.random_range(1..300u64);
        let dp_lcm =
            if rng.random_bool(0.5) { [1, 2, 4, 8][rng.random_range(0..4usize)] } else { rng.random_range(1..20) };
        let s = ChunkSearch { interval, search_range: rng.random_range(0..20 * interval), dp_lcm };
        let ctx = format!("case {case}: {params:?} {s:?}");
        let got = check_search(&params, &s, &ctx);
        check_pack(&params, got, &ctx);
        check_pack(&params, rng.random_range(1..=2 * big), &ctx);
    }
}

/// Chunks of different sizes (an embedding's own chunk): at every feasible step the
/// resident bytes plus the non-model bytes stay within the capacity, every access finds its
/// chunk resident, and infeasibility is flagged exactly when the chunk alone cannot fit.
/// (Equal sizes are checked against the brute-force optimum above, through `place`.)
#[test]
fn sized_placement_never_exceeds_the_capacity() {
    let mut rng = Pcg64Mcg::seed_from_u64(77);
    for case in 0..3000 {
        let chunks = rng.random_range(1..10usize);
        let sizes: Vec<f64> = (0..chunks).map(|_| rng.random_range(1..6u32) as f64).collect();
        let cap = rng.random_range(1..30u32) as f64;
        let trace: Vec<Access> = (0..rng.random_range(0..40usize))
            .map(|_| Access { chunk: rng.random_range(0..chunks), non_model_bytes: rng.random_range(0..8u32) as f64 })
            .collect();
        let init = random_subset(&mut rng, chunks);
        let eviction = if rng.random_bool(0.5) { Eviction::Belady } else { Eviction::Lru };
        let p = place_sized(&trace, &sizes, cap, &init, eviction);
        let mut resident = vec![false; chunks];
        for &c in &init {
            resident[c] = true;
        }
        let mut k = 0;
        let mut feasible = true;
        for (i, a) in trace.iter().enumerate() {
            while k < p.moves.len() && p.moves[k].step == i {
                resident[p.moves[k].chunk] = p.moves[k].to_device;
                k += 1;
            }
            assert!(resident[a.chunk], "case {case} step {i}: accessed chunk not resident");
            let bytes: f64 = (0..chunks).filter(|&c| resident[c]).map(|c| sizes[c]).sum();
            if sizes[a.chunk] + a.non_model_bytes <= cap {
                assert!(
                    bytes + a.non_model_bytes <= cap + 1e-9,
                    "case {case} step {i}: {bytes} + {} > {cap}",
                    a.non_model_bytes
                );
            } else {
                feasible = false;
            }
        }
        assert_eq!(p.feasible, feasible, "case {case}");
    }
}

/// Few tensors and many candidates (a small step over a wide range): the search scans only the
/// candidates at the sums of consecutive tensors, and finds what the full scan finds.
#[test]
fn chunk_search_with_many_candidates_matches_the_full_scan() {
    let mut rng = Pcg64Mcg::seed_from_u64(32);
    for case in 0..400 {
        let n = rng.random_range(1..14usize);
        let big = rng.random_range(1..3000u64);
        let params: Vec<u64> = (0..n).map(|_| rng.random_range(0..=big)).collect();
        let interval = rng.random_range(1..40u64);
        let s = ChunkSearch { interval, search_range: rng.random_range(500..4000) * interval, dp_lcm: 1 };
        check_search(&params, &s, &format!("case {case}: {params:?} {s:?}"));
    }
}
