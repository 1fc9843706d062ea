//! Colossal-AI's Gemini heterogeneous chunk manager (SEEDS §4.4): parameters are packed into
//! equal-size chunks, the chunk size is searched to minimise wasted space, and during training
//! chunks move between GPU (device) and CPU memory under a placement policy that, in steady
//! state, evicts the chunk needed furthest in the future (Belady/OPT).
//!
//! Everything here is pure and deterministic: no I/O, no clock, no global state.
//!
//! # Chunk-size search
//!
//! [`search_chunk_size`] follows the released `search_chunk_configuration`
//! (`colossalai/zero/gemini/chunk/search_utils.py`) for one DP group:
//!
//! 1. drop outliers, tensors larger than `mean + 3σ` ([`drop_outliers`]; population σ, as
//!    `np.std`; a tensor equal to the limit is kept);
//! 2. scan the candidates `start, start + interval, …, start + search_range` (inclusive), with
//!    `start = ceil(max_kept / interval) · interval` ([`candidate_sizes`]);
//! 3. keep the first (smallest) candidate with the least waste under greedy sequential packing of
//!    the *kept* tensors ([`chunk_waste`], the code's `_get_unused_byte`: the free tail of every
//!    chunk, the last one included);
//! 4. round it up to a multiple of `dp_lcm`.
//!
//! Step 4 comes after the scan, as in the code, so the result is a multiple of `interval` only
//! when `dp_lcm` divides it (the usual case: interval = hidden size, power-of-two DP degrees), and
//! its own waste is not re-checked. Not modelled: the code's `min_chunk_size` (32 Mi elements by
//! default), which floors `max_kept` before the scan and keeps DP groups whose parameters total
//! less than it gathered (`keep_gathered`, never chunked); a caller can apply both around this
//! function (skip small groups; pick the first candidate at or above the floor).
//!
//! [`pack`] is the chunk manager's registration: tensors in first-use order go into the last open
//! chunk while they fit, otherwise a new chunk opens; a tensor larger than the chunk size (an
//! outlier) gets a chunk of exactly its size (the code also rounds that to the DP degree).
//!
//! # Placement
//!
//! [`place`] replays `AutoPlacementPolicy.evict_tensors` over an access trace (the warm-up's
//! `compute_list`, flattened into one chunk access per step). At step `i` the device may hold at
//! most `floor((cap_bytes − non_model_bytes(i)) / chunk_bytes)` chunks (with a 1e-9-chunk
//! tolerance against rounding), the accessed chunk included; a miss fetches the chunk and, before
//! that, evicts until it fits; a step whose non-model memory grew can force evictions on a hit.
//! Chunks stay on the device after use (HOLD) until evicted: nothing is prefetched or evicted
//! early. The chunk accessed at a step is never its victim.
//!
//! The caller passes the capacity the policy uses: in steady state that is
//! `GPU memory × `[`STEADY_CUDA_CAP_RATIO`]; during warm-up Gemini reserves
//! [`WARMUP_NON_MODEL_RATIO`] of the GPU for non-model data instead of using the statistics.
//! The other policies map onto [`place`] as: `cuda` = `cap_bytes = f64::INFINITY` with every
//! chunk initially resident (never evicts; compare the total with the GPU to detect OOM), `const`
//! = `cap_bytes = `[`CONST_POLICY_BYTES`] with zero non-model memory, `cpu` = every chunk goes
//! back after each use (not a cache; a caller simply counts one fetch per access).
//!
//! Belady looks only at the trace it is given: a chunk not used again in it counts as never used
//! again (Gemini looks within the current iteration's `compute_list`); pass two iterations to see
//! across the boundary. Ties go to the lowest chunk index, like Python's stable sort over the
//! chunk list. LRU, for comparison, evicts the chunk least recently accessed; initially resident
//! chunks count as accessed before step 0 in the order given.
//!
//! Hybrid Adam runs each chunk's optimizer update where the chunk lives after the iteration:
//! [`resident_after`] replays the moves to say which chunks those are.
//!
//! Operators that need several chunks at once are flattened into consecutive steps, and the
//! earlier chunks of the same operator are not pinned at the later steps: Belady may evict one of
//! them while fetching the next if its next use is far off, where Gemini (all of an operator's
//! chunks in COMPUTE) would evict another chunk or fail. LRU never picks them while an older
//! chunk is resident.

use serde::{Deserialize, Serialize};

/// `_steady_cuda_cap_ratio`: in steady state Gemini uses this fraction of the GPU's memory as the
/// capacity passed to [`place`].
pub const STEADY_CUDA_CAP_RATIO: f64 = 0.9;

/// `_warmup_non_model_data_ratio`: during warm-up Gemini reserves this fraction of the GPU for
/// non-model data, since no statistics exist yet.
pub const WARMUP_NON_MODEL_RATIO: f64 = 0.95;

/// The `const` placement policy's fixed device budget for accessed chunks: 512 MiB.
pub const CONST_POLICY_BYTES: f64 = 512.0 * 1024.0 * 1024.0;

/// Chunk-size search: parameter tensor sizes (elements, first-use order) packed greedily into
/// equal chunks; [`search_chunk_size`] returns the chunk size (elements) minimizing wasted space,
/// following the released code: drop outliers > mean + 3σ; candidates from
/// `ceil(max_param/interval)*interval` up to that + `search_range` in steps of `interval`; round
/// up to a multiple of `dp_lcm`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkSearch {
    /// Step between candidate sizes, in elements (`search_interval`; ideally the hidden size).
    /// Must be positive.
    pub interval: u64,
    /// Width of the scanned range above the first candidate, in elements (`search_range`,
    /// inclusive of the top).
    pub search_range: u64,
    /// Least common multiple of the DP degrees; the result is rounded up to a multiple of it.
    /// Must be positive.
    pub dp_lcm: u64,
}

/// The tensors the search keeps: those no larger than `mean + 3σ` of all sizes (population σ, in
/// `f64`, as `np.std`), in their original order. Never empty unless `params` is.
pub fn drop_outliers(params: &[u64]) -> Vec<u64> {
    if params.is_empty() {
        return Vec::new();
    }
    let n = params.len() as f64;
    let mean = params.iter().map(|&p| p as f64).sum::<f64>() / n;
    let var = params.iter().map(|&p| (p as f64 - mean).powi(2)).sum::<f64>() / n;
    let limit = mean + 3.0 * var.sqrt();
    params.iter().copied().filter(|&p| p as f64 <= limit).collect()
}

/// Wasted elements when `params` are packed in order into chunks of `chunk` elements: the sum of
/// the free tails of all chunks, the last one included (the code's `_get_unused_byte`). A tensor
/// larger than `chunk` gets its own chunk of its size and wastes nothing (the code never meets
/// one, since the candidates are at least the largest kept tensor). Equals the sum of
/// `capacity − used` over [`pack`]`(params, chunk)`, and the code's value except for a
/// non-empty list of only zero-size tensors (one empty chunk here, nothing there).
///
/// # Panics
///
/// If `chunk == 0`.
pub fn chunk_waste(params: &[u64], chunk: u64) -> u64 {
    assert!(chunk > 0, "chunk size must be positive");
    let (mut acc, mut left) = (0u64, 0u64);
    let mut open = false;
    for &s in params {
        if s > chunk {
            // its own chunk, full; only zero-size tensors can join it
            acc += left;
            left = 0;
            open = true;
        } else if !open || s > left {
            acc += left;
            left = chunk - s;
            open = true;
        } else {
            left -= s;
        }
    }
    acc + left
}

/// The candidate chunk sizes the search scans for `params`, before the `dp_lcm` rounding:
/// `start, start + interval, …` up to `start + search_range`, where `start` is the largest kept
/// tensor ([`drop_outliers`]) rounded up to a multiple of `interval` (at least `interval`).
///
/// # Panics
///
/// If `s.interval == 0`.
pub fn candidate_sizes(params: &[u64], s: &ChunkSearch) -> Vec<u64> {
    assert!(s.interval > 0, "search interval must be positive");
    let max = drop_outliers(params).into_iter().max().unwrap_or(0).max(1);
    let start = max.div_ceil(s.interval) * s.interval;
    (0..=s.search_range / s.interval).map(|k| start + k * s.interval).collect()
}

/// Chunk-size search (`search_chunk_configuration` for one DP group): the first candidate of
/// [`candidate_sizes`] with the least [`chunk_waste`] of the kept tensors, rounded up to a
/// multiple of `s.dp_lcm`. See the module documentation.
///
/// # Panics
///
/// If `s.interval == 0` or `s.dp_lcm == 0`.
pub fn search_chunk_size(params: &[u64], s: &ChunkSearch) -> u64 {
    assert!(s.dp_lcm > 0, "dp_lcm must be positive");
    let kept = drop_outliers(params);
    let mut best: Option<(u64, u64)> = None;
    for c in candidate_sizes(params, s) {
        let w = chunk_waste(&kept, c);
        if best.is_none_or(|(bw, _)| w < bw) {
            best = Some((w, c));
        }
    }
    let (_, c) = best.expect("at least one candidate");
    c.div_ceil(s.dp_lcm) * s.dp_lcm
}

/// One chunk of [`pack`]'s result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chunk {
    /// Indices into `params` of the tensors in this chunk, increasing and consecutive.
    pub tensors: Vec<usize>,
    /// Elements occupied by those tensors.
    pub used: u64,
    /// Elements the chunk holds: the chunk size, or the tensor's size for an oversized tensor.
    pub capacity: u64,
}

/// Pack tensors in order into chunks of `chunk` elements (a tensor larger than a chunk gets its
/// own chunk of its size); returns, per chunk, the tensor indices and used elements. A tensor
/// goes into the last chunk if it fits in its free tail, otherwise into a new chunk; chunks are
/// never back-filled. As in the chunk manager, which closes a chunk only when an append fails,
/// zero-size tensors right after an oversized tensor join its (full) chunk.
///
/// # Panics
///
/// If `chunk == 0`.
pub fn pack(params: &[u64], chunk: u64) -> Vec<Chunk> {
    assert!(chunk > 0, "chunk size must be positive");
    let mut out: Vec<Chunk> = Vec::new();
    for (i, &s) in params.iter().enumerate() {
        match out.last_mut() {
            Some(last) if s <= last.capacity - last.used => {
                last.tensors.push(i);
                last.used += s;
            }
            _ => out.push(Chunk { tensors: vec![i], used: s, capacity: chunk.max(s) }),
        }
    }
    out
}

/// One access of a chunk at a step of the iteration (the chunks an operator needs, in order),
/// with the non-model memory (bytes) the step needs besides chunks (activations, buffers) from
/// the warm-up statistics.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Access {
    /// The chunk that must be on the device at this step.
    pub chunk: usize,
    /// Non-model memory (bytes) on the device at this step; finite and non-negative.
    pub non_model_bytes: f64,
}

/// Eviction order used by [`place`] when chunks must leave the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Eviction {
    /// Gemini's steady state: the resident chunk whose next use is furthest in the future,
    /// never-used-again first; ties to the lowest chunk index.
    Belady,
    /// For comparison: the resident chunk least recently accessed.
    Lru,
}

/// One chunk movement decided by [`place`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Move {
    /// The trace step at which it happens (before the access of that step).
    pub step: usize,
    /// The chunk moved.
    pub chunk: usize,
    /// `true` for a fetch CPU → device, `false` for an eviction device → CPU.
    pub to_device: bool,
}

/// The result of [`place`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Placement {
    /// Every move, in order; within a step the evictions come before the fetch.
    pub moves: Vec<Move>,
    /// Number of fetches (moves with `to_device`).
    pub fetches: usize,
    /// Number of evictions (moves without `to_device`).
    pub evictions: usize,
    /// Resident chunks × `chunk_bytes` + non-model bytes, at the worst step (0 for an empty
    /// trace). Exceeds the capacity only at infeasible steps.
    pub peak_device_bytes: f64,
    /// `false` if at some step even one chunk cannot fit beside the non-model memory.
    pub feasible: bool,
}

const NEVER: usize = usize::MAX;

/// Placement decisions over an access trace: which chunks must come in before each access,
/// which to evict, with device capacity `cap_bytes`, chunk bytes `chunk_bytes` (all chunks
/// equal), and the eviction order: Belady (evict the resident chunk whose next use is furthest
/// in the future; never-used-again first) or LRU for comparison.
///
/// `chunks` is the number of chunks (accesses and `initially_resident` index below it);
/// `initially_resident` are the chunks on the device before step 0, which may exceed what step
/// 0 allows (the excess is evicted at step 0). `cap_bytes` is the capacity the policy uses:
/// pass `GPU bytes × `[`STEADY_CUDA_CAP_RATIO`] for Gemini's steady state, or
/// `f64::INFINITY` for no limit.
///
/// At each step at most `floor((cap_bytes − non_model_bytes) / chunk_bytes)` chunks are resident
/// after the step's moves. At an infeasible step (not even one chunk fits) `feasible` becomes
/// `false` and the walk goes on with only the accessed chunk resident, so the peak shows the
/// overflow. See the module documentation.
///
/// # Panics
///
/// If `chunk_bytes` is not positive and finite, `cap_bytes` is NaN, a non-model size is negative
/// or not finite, or a chunk index is out of range or repeated in `initially_resident`.
pub fn place(
    trace: &[Access],
    chunks: usize,
    chunk_bytes: f64,
    cap_bytes: f64,
    initially_resident: &[usize],
    eviction: Eviction,
) -> Placement {
    assert!(chunk_bytes > 0.0 && chunk_bytes.is_finite(), "chunk_bytes must be positive and finite");
    place_sized(trace, &vec![chunk_bytes; chunks], cap_bytes, initially_resident, eviction)
}

/// [`place`] with a size per chunk (`chunk_bytes[c]`, positive and finite): a model's chunks
/// are equal except an oversized tensor's own chunk (an embedding). At each step the resident
/// chunks' bytes plus the non-model bytes stay within `cap_bytes` (with a tolerance of 1e-9 of
/// the smallest chunk); a miss evicts, in the policy's order, until the accessed chunk fits. With
/// equal sizes it decides exactly as [`place`]'s chunk count. A step is infeasible when the
/// accessed chunk alone does not fit; the walk then keeps only it.
///
/// # Panics
///
/// As [`place`], for any chunk size.
pub fn place_sized(
    trace: &[Access],
    chunk_bytes: &[f64],
    cap_bytes: f64,
    initially_resident: &[usize],
    eviction: Eviction,
) -> Placement {
    let chunks = chunk_bytes.len();
    assert!(chunk_bytes.iter().all(|&b| b > 0.0 && b.is_finite()), "chunk_bytes must be positive and finite");
    assert!(!cap_bytes.is_nan(), "cap_bytes must not be NaN");
    let tolerance = 1e-9 * chunk_bytes.iter().copied().fold(f64::INFINITY, f64::min);
    let mut resident = vec![false; chunks];
    // Resident chunks, counted per size so that the sum is exact for equal chunks.
    let mut bytes = 0.0;
    let mut count = 0usize;
    let all_equal = chunk_bytes.windows(2).all(|w| w[0] == w[1]);
    let resident_bytes =
        |count: usize, bytes: f64| if all_equal && chunks > 0 { count as f64 * chunk_bytes[0] } else { bytes };
    // LRU clock: initially resident chunks were accessed before step 0, in the order given.
    let mut last_use = vec![i64::MIN; chunks];
    for (k, &c) in initially_resident.iter().enumerate() {
        assert!(c < chunks, "initially resident chunk {c} out of range (chunks = {chunks})");
        assert!(!resident[c], "chunk {c} listed twice as initially resident");
        resident[c] = true;
        count += 1;
        bytes += chunk_bytes[c];
        last_use[c] = k as i64 - initially_resident.len() as i64;
    }
    // Belady: next_after[i] is the next step using trace[i].chunk; next_use[c] is c's next use
    // from the current step on.
    let mut next_after = vec![NEVER; trace.len()];
    let mut next_use = vec![NEVER; chunks];
    for (i, a) in trace.iter().enumerate().rev() {
        assert!(a.chunk < chunks, "access of chunk {} out of range (chunks = {chunks})", a.chunk);
        assert!(
            a.non_model_bytes.is_finite() && a.non_model_bytes >= 0.0,
            "non-model bytes must be finite and non-negative, got {}",
            a.non_model_bytes
        );
        next_after[i] = next_use[a.chunk];
        next_use[a.chunk] = i;
    }

    let mut p = Placement { moves: Vec::new(), fetches: 0, evictions: 0, peak_device_bytes: 0.0, feasible: true };
    for (i, a) in trace.iter().enumerate() {
        let c = a.chunk;
        let room = cap_bytes - a.non_model_bytes + tolerance;
        if chunk_bytes[c] > room {
            p.feasible = false;
        }
        let hit = resident[c];
        let need = |count: usize, bytes: f64| {
            resident_bytes(count + usize::from(!hit), bytes + if hit { 0.0 } else { chunk_bytes[c] })
        };
        while need(count, bytes) > room {
            let Some(victim) = (0..chunks).filter(|&v| resident[v] && v != c).reduce(|best, v| {
                let better = match eviction {
                    Eviction::Belady => next_use[v] > next_use[best],
                    Eviction::Lru => last_use[v] < last_use[best],
                };
                if better { v } else { best }
            }) else {
                break;
            };
            resident[victim] = false;
            count -= 1;
            bytes -= chunk_bytes[victim];
            p.evictions += 1;
            p.moves.push(Move { step: i, chunk: victim, to_device: false });
        }
        if !hit {
            resident[c] = true;
            count += 1;
            bytes += chunk_bytes[c];
            p.fetches += 1;
            p.moves.push(Move { step: i, chunk: c, to_device: true });
        }
        p.peak_device_bytes = p.peak_device_bytes.max(resident_bytes(count, bytes) + a.non_model_bytes);
        next_use[c] = next_after[i];
        last_use[c] = i as i64;
    }
    p
}

/// The chunks on the device after applying `moves` to `initially_resident`, in increasing
/// order: where hybrid Adam updates each chunk's optimizer states (on the device for these, on
/// the CPU for the rest).
pub fn resident_after(chunks: usize, initially_resident: &[usize], moves: &[Move]) -> Vec<usize> {
    let mut resident = vec![false; chunks];
    for &c in initially_resident {
        resident[c] = true;
    }
    for m in moves {
        resident[m.chunk] = m.to_device;
    }
    (0..chunks).filter(|&c| resident[c]).collect()
}

#[cfg(test)]
mod tests {
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
                    non_model_bytes: if varying {
                        0.5 * rng.random_range(0..=2 * (cap_chunks - 1)) as f64
                    } else {
                        0.0
                    },
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
                .map(|_| Access {
                    chunk: rng.random_range(0..chunks),
                    non_model_bytes: rng.random_range(0..8u32) as f64,
                })
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
}
