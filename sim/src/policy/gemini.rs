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
    let (start, n) = candidate_range(params, s);
    (0..n).map(|k| start + k * s.interval).collect()
}

/// The first of [`candidate_sizes`] and how many there are, without listing them (a tiny
/// interval makes millions).
fn candidate_range(params: &[u64], s: &ChunkSearch) -> (u64, u64) {
    assert!(s.interval > 0, "search interval must be positive");
    let max = drop_outliers(params).into_iter().max().unwrap_or(0).max(1);
    (max.div_ceil(s.interval) * s.interval, s.search_range / s.interval + 1)
}

/// Tensor visits one chunk-size search may make before it thins its candidates (2^25, some
/// tens of milliseconds).
pub const SEARCH_WORK_LIMIT: usize = 1 << 25;

/// Chunk-size search (`search_chunk_configuration` for one DP group): the first candidate of
/// [`candidate_sizes`] with the least [`chunk_waste`] of the kept tensors, rounded up to a
/// multiple of `s.dp_lcm`. See the module documentation. Exact, except past
/// [`SEARCH_WORK_LIMIT`] tensor visits (thousands of tensors and a fine step, where the
/// sums of consecutive tensors are too many as well), where every k-th candidate is scanned.
///
/// # Panics
///
/// If `s.interval == 0` or `s.dp_lcm == 0`.
pub fn search_chunk_size(params: &[u64], s: &ChunkSearch) -> u64 {
    assert!(s.dp_lcm > 0, "dp_lcm must be positive");
    let kept = drop_outliers(params);
    let (first, n) = candidate_range(params, s);
    let last = first + (n - 1) * s.interval;
    let nth = |k: u64| first + k * s.interval;
    // Between two sums of consecutive tensors (the sizes at which one more tensor fits in a
    // chunk) the packing keeps its chunks, so the waste grows with the chunk size: the first
    // least-waste candidate is the first candidate at or above one of those sums, or the
    // first candidate. Scan only those when they are fewer (same answer, much faster when the
    // step is small, e.g. a tiny hidden size).
    let mut points: Vec<u64> = vec![first];
    let budget = usize::try_from(n).unwrap_or(usize::MAX);
    'sums: for i in 0..kept.len() {
        let mut sum = 0u64;
        for &t in &kept[i..] {
            sum = sum.saturating_add(t);
            if sum > last {
                break;
            }
            if sum > first {
                points.push(first + (sum - first).div_ceil(s.interval) * s.interval);
                if points.len() > budget {
                    break 'sums;
                }
            }
        }
    }
    let candidates = if points.len() <= budget {
        points.sort_unstable();
        points.dedup();
        points
    } else if budget.saturating_mul(kept.len()) > SEARCH_WORK_LIMIT {
        // Thousands of tensors and a fine step (models thousands of layers deep): every
        // `stride`-th candidate, so that one search stays near SEARCH_WORK_LIMIT tensor visits.
        let stride = budget.saturating_mul(kept.len()).div_ceil(SEARCH_WORK_LIMIT);
        (0..n).step_by(stride).map(nth).collect()
    } else {
        (0..n).map(nth).collect()
    };
    let mut best: Option<(u64, u64)> = None;
    for c in candidates {
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

    // Resident chunks ordered by eviction preference, the first evicted first: Belady the
    // latest next use, LRU the earliest last use; ties to the lowest chunk index. (A scan of
    // every chunk per eviction made long traces quadratic: a 36k-layer model took minutes.)
    let priority = |next: usize, last: i64| -> i128 {
        match eviction {
            Eviction::Belady => -(next as i128),
            Eviction::Lru => last as i128,
        }
    };
    let mut order: std::collections::BTreeSet<(i128, usize)> =
        (0..chunks).filter(|&v| resident[v]).map(|v| (priority(next_use[v], last_use[v]), v)).collect();
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
            let Some(&(key, victim)) = order.iter().find(|&&(_, v)| v != c) else {
                break;
            };
            order.remove(&(key, victim));
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
        order.remove(&(priority(next_use[c], last_use[c]), c));
        next_use[c] = next_after[i];
        last_use[c] = i as i64;
        order.insert((priority(next_use[c], last_use[c]), c));
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
#[path = "gemini_tests.rs"]
mod tests;
