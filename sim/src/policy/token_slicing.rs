//! TeraPipe's token-slicing optimiser (SEEDS §2.2): how to cut a batch of `B` sequences of
//! `L` tokens into sub-batches and each sub-batch's sequence into token slices, so that the
//! pipeline of `K` stages finishes soonest.
//!
//! # Objective
//!
//! Every slice `i` (of `b` sequences, `l` tokens, attending to `c` earlier tokens) costs one
//! stage `t_i = cost(b, l, c)`; the slices of all sub-batches run through the stages one after
//! another, so the pipeline's latency is
//!
//! ```text
//! T* = min over schemes of  Σ_i t_i + (K−1) · max_i t_i            (Eq. 5)
//!    = min over t_max   of  S*(t_max) + (K−1) · t_max              (Eq. 6)
//! ```
//!
//! with `S*(t_max)` the least `Σ t_i` of a scheme whose slices all take at most `t_max`. For one
//! `t_max`, `S*` is the joint batch × token dynamic program (§3.4 of the paper), over token
//! *units* of `granularity` tokens (the code's `STEP_GAP = 8`; the last unit is shorter when
//! `L` is not a multiple), `N = ⌈L / granularity⌉` units:
//!
//! ```text
//! f[b][n] = min_{k ≤ n, cost(b, len(k units), ctx(n−k units)) ≤ t_max} f[b][n−k] + cost(…),  f[b][0] = 0
//! g[B']   = min_{b ≤ B'} g[B'−b] + f[b][N],                                                   g[0] = 0
//! T(t_max) = g[B] + (K−1) · t_max
//! ```
//!
//! The optimal scheme's largest slice is one of the table's values, so enumerating every
//! distinct value `cost(b, k units, c units)` as `t_max` finds `T*` exactly.
//!
//! # Sub-batch sizes
//!
//! [`sub_batch_sizes`]: every size `1..=B` when `B ≤` [`ALL_SUB_BATCH_SIZES_UP_TO`]; above that
//! the sizes `1..=8` and the divisors of `B` (the paper's reported schemes are uniform over
//! sub-batches, and a size that neither is small nor divides the batch leaves a ragged
//! remainder). `g` still combines them freely (a batch of 40 may be cut 8+8+8+8+8). The
//! optimum is exact over schemes whose sub-batch sizes lie in that set.
//!
//! # How it is made fast, without losing exactness
//!
//! The reference code solves the `O(N²)` DP afresh for every candidate `t_max` (`O(N⁴)` in
//! all, times the sub-batch sizes). Here the cost table is computed once per sub-batch size
//! (`N(N+1)/2` entries), and then:
//!
//! 1. **A good incumbent first.** The unconstrained optimum (`S_min = S*(∞)`, its scheme) and
//!    every uniform scheme (equal sub-batches of a dividing size, equal unit slices) seed the
//!    best latency. Any scheme whose slices reach `t_max` costs at least
//!    `LB(t_max) = (K−1)·t_max + max(t_max, S_min) ≥ K·t_max`, so only the table entries with
//!    `LB < best` are kept and sorted, ascending (ties by size, start, end).
//! 2. **One ascending sweep, incremental DP.** Raising `t_max` only *admits* slices (edges of
//!    the DAG over unit boundaries). Each size's DP stays dormant until `t_max` reaches its
//!    bottleneck (the least `t_max` at which its sequence can be cut at all, a min-max path;
//!    before it `f[b][N] = ∞`), is then solved once over the admitted edges, and from then on
//!    each admitted edge `a → m` is relaxed (`f[a] + w < f[m]`) and any drop is propagated
//!    forward, node by node, through the admitted out-edges of the nodes that fell. This keeps
//!    `f` equal to the DP for the current `t_max` at a cost proportional to what changes.
//! 3. **Breakpoints only.** `g` and `T(t_max)` are evaluated only where some `f[b][N]` fell:
//!    between such breakpoints `S*` is constant and `T` grows with `t_max`, so no other
//!    candidate can be the minimum.
//! 4. **Early stop.** The sweep stops at the first candidate with `LB(t_max) ≥ best`; this is
//!    at least as early as the code's `K·t_max ≥ best`, and as safe. `K = 1` is settled by
//!    the unconstrained optimum without a sweep.
//!
//! 2048 tokens in units of 8 (256 units), 40 stages and a batch of 32 (all 32 sizes) take
//! about 40 ms in release on a 2-core machine, about 10 ms of it building and sorting the tables.
//!
//! # Near-equal candidates
//!
//! As in the code, candidates within a relative [`Options::candidate_tolerance`] (default
//! `1e-5`) of the first value of their group are merged into one evaluation; here the group
//! is evaluated at its *largest* value, so every edge of the group is admitted and the result
//! is within that relative tolerance of the exact optimum (and exact when no two distinct
//! slice costs are that close, or with tolerance `0`).
//!
//! # Result
//!
//! The reported latency is the true objective of the reconstructed scheme (`Σ t_i + (K−1) ·`
//! the largest slice it uses), which is at most `T(t_max)` of the candidate that found it and
//! equals [`latency`] of [`SlicingPlan::sub_batches`]. Everything is deterministic: equal
//! sums keep the path found first and the smallest sub-batch size, and sub-batches are listed
//! by size, largest first.
//!
//! Long slices come first when later slices cost more, but with TeraPipe's cost (attention
//! linear in the context) `Σ t_i` does not depend on the order of a sub-batch's slices, so
//! orders with the same largest slice tie and the one returned need not be sorted; a cost
//! strictly concave in the context makes the optimum's slice lengths non-increasing.

use serde::{Deserialize, Serialize};

/// Tokens per slicing unit when not given (the reference code's `STEP_GAP`).
pub const DEFAULT_GRANULARITY: u32 = 8;
/// Relative distance under which candidate `t_max` values are merged (the reference code's).
pub const DEFAULT_CANDIDATE_TOLERANCE: f64 = 1e-5;
/// Batches up to this size consider every sub-batch size; larger ones `1..=8` and divisors.
pub const ALL_SUB_BATCH_SIZES_UP_TO: u32 = 32;

/// The most slice costs the optimiser tabulates (8 bytes each, plus the sort's copy).
pub const MAX_TABLE_ENTRIES: u64 = 50_000_000;

/// The most sequences per replica the optimiser cuts into sub-batches.
pub const MAX_BATCH: u32 = 1 << 20;

/// The least granularity whose tables fit [`MAX_TABLE_ENTRIES`].
fn min_granularity(seq_len: u32, batch: u32) -> u32 {
    let mut g = 1u32;
    while (SliceProblem { seq_len, batch, stages: 1, granularity: g }).table_entries() > MAX_TABLE_ENTRIES
        && g < seq_len
    {
        g = g.saturating_mul(2);
    }
    g.min(seq_len)
}

/// The slicing problem for one pipeline: `batch` sequences of `seq_len` tokens through `stages` stages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SliceProblem {
    pub seq_len: u32,
    pub batch: u32,
    pub stages: u32,
    /// Tokens per unit: slices are whole units. `seq_len` need not be a multiple: the last
    /// unit is shorter.
    pub granularity: u32,
}

impl SliceProblem {
    /// The problem with the default granularity of [`DEFAULT_GRANULARITY`] tokens.
    pub fn new(seq_len: u32, batch: u32, stages: u32) -> Self {
        SliceProblem { seq_len, batch, stages, granularity: DEFAULT_GRANULARITY }
    }

    /// Number of token units, `⌈seq_len / granularity⌉`.
    pub fn units(&self) -> usize {
        self.seq_len.div_ceil(self.granularity.max(1)) as usize
    }

    /// Token position of unit boundary `i` (`0..=units()`).
    fn boundary(&self, i: usize) -> u32 {
        (i as u64 * self.granularity as u64).min(self.seq_len as u64) as u32
    }

    /// An upper bound on the cost-table entries the optimiser keeps (one triangular table of
    /// `units() x (units() + 1) / 2` per sub-batch size; a batch above
    /// [`ALL_SUB_BATCH_SIZES_UP_TO`] has at most `8 + 2 sqrt(batch)` sizes).
    pub fn table_entries(&self) -> u64 {
        let n = self.units() as u64;
        let sizes = if self.batch <= ALL_SUB_BATCH_SIZES_UP_TO {
            self.batch as u64
        } else {
            8 + 2 * (self.batch as f64).sqrt().ceil() as u64
        };
        sizes.saturating_mul(n * (n + 1) / 2)
    }

    /// Refuse a problem whose tables exceed [`MAX_TABLE_ENTRIES`] (memory) or whose batch is
    /// too large to enumerate sub-batch sizes for, naming what to change.
    pub fn check_size(&self) -> Result<(), String> {
        if self.batch > MAX_BATCH {
            return Err(format!(
                "{} sequences per replica to cut into sub-batches; the optimiser allows at most {MAX_BATCH} (raise plan.dp or lower training.global_batch)",
                self.batch
            ));
        }
        if self.table_entries() > MAX_TABLE_ENTRIES {
            return Err(format!(
                "{} units of {} tokens per sequence need about {:.3e} slice costs (limit {MAX_TABLE_ENTRIES:.0e}); raise the granularity (plan.token_granularity or --granularity) to at least {}",
                self.units(),
                self.granularity,
                self.table_entries() as f64,
                min_granularity(self.seq_len, self.batch)
            ));
        }
        Ok(())
    }

    fn validate(&self) {
        assert!(self.seq_len >= 1, "token slicing needs seq_len >= 1");
        assert!(self.batch >= 1, "token slicing needs batch >= 1");
        assert!(self.stages >= 1, "token slicing needs stages >= 1");
        assert!(self.granularity >= 1, "token slicing needs granularity >= 1");
    }
}

/// `cost(b, l, c)`: seconds one stage spends on a slice of `l` tokens of `b` sequences whose
/// causal attention reads `c` earlier tokens (forward + backward; the caller's cost model).
/// Must be finite and > 0 for `l > 0`.
pub type SliceCost<'a> = dyn Fn(u32, u32, u32) -> f64 + 'a;

/// A group of sequences that travel together, cut into token slices.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SubBatch {
    /// Sequences in the sub-batch.
    pub sequences: u32,
    /// Token counts of the slices, in order, summing to `seq_len`.
    pub slices: Vec<u32>,
}

/// One evaluated `t_max`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Candidate {
    pub t_max_s: f64,
    /// `g[B] + (K−1)·t_max`.
    pub total_s: f64,
}

/// The optimiser's answer.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SlicingPlan {
    /// The scheme, largest sub-batches first.
    pub sub_batches: Vec<SubBatch>,
    /// The objective `Σ t_i + (K−1)·max t_i` of `sub_batches`.
    pub latency_s: f64,
    /// The largest slice time in `sub_batches`.
    pub t_max_s: f64,
    /// The `t_max` values at which `S*(t_max)` dropped (every other candidate is dominated by
    /// the breakpoint before it), ascending, with their `T(t_max)`.
    pub candidates: Vec<Candidate>,
    /// Candidate `t_max` values (after merging near-equal ones) the sweep reached.
    pub evaluated: usize,
    /// Whether the bound stopped the sweep before the largest candidate.
    pub stopped_early: bool,
}

/// Tuning of [`optimize_with`].
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Options {
    /// Candidates within this relative distance of their group's first value are evaluated
    /// once, at the group's largest value. `0` makes the optimiser exact.
    pub candidate_tolerance: f64,
}

impl Default for Options {
    fn default() -> Self {
        Options { candidate_tolerance: DEFAULT_CANDIDATE_TOLERANCE }
    }
}

/// The sub-batch sizes the optimiser considers for a batch, ascending: all of `1..=batch` up
/// to [`ALL_SUB_BATCH_SIZES_UP_TO`], else `1..=8` and the divisors of `batch`.
pub fn sub_batch_sizes(batch: u32) -> Vec<u32> {
    if batch <= ALL_SUB_BATCH_SIZES_UP_TO {
        return (1..=batch).collect();
    }
    (1..=batch).filter(|&b| b <= 8 || batch.is_multiple_of(b)).collect()
}

/// Objective of a given scheme: `Σ` over sub-batches and their slices of `t_i` plus
/// `(K−1)·max t_i`, each slice's context being the tokens before it in its sub-batch.
pub fn latency(p: &SliceProblem, sub_batches: &[SubBatch], cost: &SliceCost<'_>) -> f64 {
    let (sum, max) = sum_and_max(sub_batches, cost);
    sum + p.stages.saturating_sub(1) as f64 * max
}

fn sum_and_max(sub_batches: &[SubBatch], cost: &SliceCost<'_>) -> (f64, f64) {
    let mut sum = 0.0;
    let mut max = 0.0f64;
    for sb in sub_batches {
        let mut context = 0;
        for &l in &sb.slices {
            let t = cost(sb.sequences, l, context);
            sum += t;
            max = max.max(t);
            context += l;
        }
    }
    (sum, max)
}

/// `slices` equal slices of the whole batch as one sub-batch, longer ones first when they
/// cannot all be equal: whole units when `slices ≤ units()`, else (finer than the granularity)
/// whole tokens. `slices` is clamped to `1..=seq_len`.
pub fn uniform(p: &SliceProblem, slices: u32) -> Vec<SubBatch> {
    p.validate();
    let n = slices.clamp(1, p.seq_len);
    let units = p.units();
    let lengths: Vec<u32> = if n as usize <= units {
        equal_units(units, n as usize).into_iter().map(|(a, m)| p.boundary(m) - p.boundary(a)).collect()
    } else {
        let (q, r) = (p.seq_len / n, p.seq_len % n);
        (0..n).map(|i| q + u32::from(i < r)).collect()
    };
    vec![SubBatch { sequences: p.batch, slices: lengths }]
}

/// Unit ranges of `slices ≤ units` slices of equal unit counts, longer ones first.
fn equal_units(units: usize, slices: usize) -> Vec<(usize, usize)> {
    let (q, r) = (units / slices, units % slices);
    let mut start = 0;
    (0..slices)
        .map(|i| {
            let end = start + q + usize::from(i < r);
            let range = (start, end);
            start = end;
            range
        })
        .collect()
}

/// The optimal scheme with the default [`Options`].
pub fn optimize(p: &SliceProblem, cost: &SliceCost<'_>) -> SlicingPlan {
    optimize_with(p, cost, Options::default())
}

/// Index of the edge `a → m` (`a < m`) in a triangular table.
fn tri(a: usize, m: usize) -> usize {
    m * (m - 1) / 2 + a
}

/// The cost table of one sub-batch size.
struct Table {
    sequences: u32,
    /// `w[tri(a, m)]`: the slice from unit `a` to unit `m`.
    w: Vec<f64>,
    /// Least `t_max` at which the sequence can be cut (min over paths of the max edge).
    bottleneck: f64,
}

impl Table {
    fn new(p: &SliceProblem, sequences: u32, cost: &SliceCost<'_>) -> Self {
        let n = p.units();
        let mut w = vec![0.0; n * (n + 1) / 2];
        for m in 1..=n {
            for a in 0..m {
                let (c, l) = (p.boundary(a), p.boundary(m) - p.boundary(a));
                let t = cost(sequences, l, c);
                assert!(
                    t.is_finite() && t > 0.0,
                    "slice cost must be finite and > 0: cost({sequences}, {l}, {c}) = {t}"
                );
                w[tri(a, m)] = t;
            }
        }
        let mut h = vec![f64::INFINITY; n + 1];
        h[0] = 0.0;
        for m in 1..=n {
            h[m] = (0..m).map(|a| h[a].max(w[tri(a, m)])).fold(f64::INFINITY, f64::min);
        }
        Table { sequences, w, bottleneck: h[n] }
    }

    /// Unconstrained least-sum DP: `(f, back-pointers)`.
    fn min_sum(&self, n: usize) -> (Vec<f64>, Vec<u32>) {
        let mut f = vec![f64::INFINITY; n + 1];
        let mut bp = vec![u32::MAX; n + 1];
        f[0] = 0.0;
        for m in 1..=n {
            for a in 0..m {
                let v = f[a] + self.w[tri(a, m)];
                if v < f[m] {
                    f[m] = v;
                    bp[m] = a as u32;
                }
            }
        }
        (f, bp)
    }
}

/// The token DP of one sub-batch size over the edges admitted so far, kept up to date as
/// edges are admitted (once active: before its size's bottleneck it cannot reach `N`).
struct TokenDp {
    f: Vec<f64>,
    bp: Vec<u32>,
    /// Admitted outgoing edges `(w, m)` of each node.
    outgoing: Vec<Vec<(f64, u32)>>,
    /// Nodes whose `f` fell and whose outgoing edges are still to relax.
    changed: Vec<bool>,
    active: bool,
}

impl TokenDp {
    fn new(n: usize) -> Self {
        let mut f = vec![f64::INFINITY; n + 1];
        f[0] = 0.0;
        TokenDp {
            f,
            bp: vec![u32::MAX; n + 1],
            outgoing: vec![Vec::new(); n + 1],
            changed: vec![false; n + 1],
            active: false,
        }
    }

    fn admit(&mut self, a: usize, m: usize, w: f64) {
        self.outgoing[a].push((w, m as u32));
        if self.active && self.f[a] + w < self.f[m] {
            self.f[m] = self.f[a] + w;
            self.bp[m] = a as u32;
            self.propagate(m);
        }
    }

    /// Relaxes, in node order, the outgoing edges of every node whose `f` fell, from `from`.
    fn propagate(&mut self, from: usize) {
        let TokenDp { f, bp, outgoing, changed, .. } = self;
        changed[from] = true;
        for j in from..f.len() {
            if !std::mem::take(&mut changed[j]) {
                continue;
            }
            for &(w, k) in &outgoing[j] {
                let v = f[j] + w;
                if v < f[k as usize] {
                    f[k as usize] = v;
                    bp[k as usize] = j as u32;
                    changed[k as usize] = true;
                }
            }
        }
    }

    /// Solves the DP over the table's edges of cost `≤ t_max` (all admitted), then follows admissions.
    fn activate(&mut self, table: &Table, t_max: f64) {
        let n = self.f.len() - 1;
        for m in 1..=n {
            for a in 0..m {
                let w = table.w[tri(a, m)];
                let v = self.f[a] + w;
                if w <= t_max && v < self.f[m] {
                    self.f[m] = v;
                    self.bp[m] = a as u32;
                }
            }
        }
        self.active = true;
    }
}

/// Unit ranges of the slices that a token DP's back-pointers give.
fn unit_slices(bp: &[u32]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut m = bp.len() - 1;
    while m > 0 {
        let a = bp[m] as usize;
        out.push((a, m));
        m = a;
    }
    out.reverse();
    out
}

/// Splits the batch over sub-batch sizes into `g` and, per batch prefix, the size index used
/// last (ties keep the smaller size).
fn split_batch(tables: &[Table], finals: &[f64], g: &mut [f64], arg: &mut [usize]) {
    g.fill(f64::INFINITY);
    arg.fill(usize::MAX);
    g[0] = 0.0;
    for x in 1..g.len() {
        for (i, t) in tables.iter().enumerate() {
            let b = t.sequences as usize;
            if b > x {
                break;
            }
            let v = g[x - b] + finals[i];
            if v < g[x] {
                g[x] = v;
                arg[x] = i;
            }
        }
    }
}

/// `(Σ t_i, max t_i)` of the scheme that `g`'s back-pointers and the token DPs' (`bp_of`) give.
fn traced_sum_max<'a>(tables: &[Table], g_arg: &[usize], bp_of: impl Fn(usize) -> &'a [u32]) -> (f64, f64) {
    let (mut sum, mut max) = (0.0, 0.0f64);
    let mut x = g_arg.len() - 1;
    while x > 0 {
        let i = g_arg[x];
        let bp = bp_of(i);
        let mut m = bp.len() - 1;
        while m > 0 {
            let a = bp[m] as usize;
            let t = tables[i].w[tri(a, m)];
            sum += t;
            max = max.max(t);
            m = a;
        }
        x -= tables[i].sequences as usize;
    }
    (sum, max)
}

/// A scheme by table indices: per sub-batch, its size index and unit ranges.
type Scheme = Vec<(usize, Vec<(usize, usize)>)>;

/// The scheme that `g`'s back-pointers and the token DPs' (`bp_of`) give.
fn traced_scheme<'a>(tables: &[Table], g_arg: &[usize], bp_of: impl Fn(usize) -> &'a [u32]) -> Scheme {
    let mut out = Vec::new();
    let mut x = g_arg.len() - 1;
    while x > 0 {
        let i = g_arg[x];
        out.push((i, unit_slices(bp_of(i))));
        x -= tables[i].sequences as usize;
    }
    out
}

/// The optimal scheme (see the module doc).
pub fn optimize_with(p: &SliceProblem, cost: &SliceCost<'_>, opts: Options) -> SlicingPlan {
    p.validate();
    let tol = opts.candidate_tolerance;
    assert!(tol >= 0.0 && tol.is_finite(), "candidate tolerance must be finite and >= 0");
    let n = p.units();
    let batch = p.batch as usize;
    let k1 = (p.stages - 1) as f64;
    let tables: Vec<Table> = sub_batch_sizes(p.batch).into_iter().map(|b| Table::new(p, b, cost)).collect();

    // The unconstrained optimum: S_min for the bound, and the first incumbent.
    let unconstrained: Vec<(Vec<f64>, Vec<u32>)> = tables.iter().map(|t| t.min_sum(n)).collect();
    let mut finals: Vec<f64> = unconstrained.iter().map(|(f, _)| f[n]).collect();
    let (mut g, mut g_arg) = (vec![0.0; batch + 1], vec![0; batch + 1]);
    split_batch(&tables, &finals, &mut g, &mut g_arg);
    let s_min = g[batch];
    let (sum, max) = traced_sum_max(&tables, &g_arg, |i| &unconstrained[i].1);
    let mut best_objective = sum + k1 * max;
    let mut best = traced_scheme(&tables, &g_arg, |i| &unconstrained[i].1);
    // Uniform schemes (equal sub-batches of a dividing size, equal unit slices) tighten the
    // bound before the sweep, so that only the edges that can matter are sorted.
    let mut best_uniform = None;
    for (i, table) in tables.iter().enumerate().filter(|(_, t)| p.batch.is_multiple_of(t.sequences)) {
        let copies = (p.batch / table.sequences) as f64;
        for slices in 1..=n {
            let (mut sum, mut max) = (0.0, 0.0f64);
            for (a, m) in equal_units(n, slices) {
                sum += table.w[tri(a, m)];
                max = max.max(table.w[tri(a, m)]);
            }
            if copies * sum + k1 * max < best_objective {
                best_objective = copies * sum + k1 * max;
                best_uniform = Some((i, slices));
            }
        }
    }
    if let Some((i, slices)) = best_uniform {
        best = vec![(i, equal_units(n, slices)); batch / tables[i].sequences as usize];
    }
    let bound = |t: f64| k1 * t + t.max(s_min);

    // The edges that can matter (the first value of a group of near-equal candidates must pass
    // the bound), by cost; ties by size, start, end, so that the sweep is deterministic.
    let shrink = (1.0 - 4.0 * f64::EPSILON) / (1.0 + tol);
    let mut events: Vec<(u64, u32, u32, u32)> = Vec::new();
    let mut filtered = false;
    for (i, table) in tables.iter().enumerate() {
        for m in 1..=n {
            for a in 0..m {
                let w = table.w[tri(a, m)];
                if bound(w * shrink) < best_objective {
                    events.push((w.to_bits(), i as u32, a as u32, m as u32));
                } else {
                    filtered = true;
                }
            }
        }
    }
    events.sort_unstable();

    let mut dps: Vec<TokenDp> = tables.iter().map(|_| TokenDp::new(n)).collect();
    finals.fill(f64::INFINITY);
    let mut candidates = Vec::new();
    let mut evaluated = 0;
    let mut stopped_early = filtered;
    let mut next = 0;
    while next < events.len() {
        let first = f64::from_bits(events[next].0);
        if bound(first) >= best_objective {
            stopped_early = true;
            break;
        }
        let limit = first * (1.0 + tol);
        let mut t_max = first;
        while let Some(&(bits, i, a, m)) = events.get(next) {
            let w = f64::from_bits(bits);
            if w > limit {
                break;
            }
            dps[i as usize].admit(a as usize, m as usize, w);
            t_max = w;
            next += 1;
        }
        evaluated += 1;
        let mut dropped = false;
        for (i, dp) in dps.iter_mut().enumerate() {
            if !dp.active && t_max >= tables[i].bottleneck {
                dp.activate(&tables[i], t_max);
            }
            if dp.f[n] < finals[i] {
                finals[i] = dp.f[n];
                dropped = true;
            }
        }
        if !dropped {
            continue;
        }
        split_batch(&tables, &finals, &mut g, &mut g_arg);
        if !g[batch].is_finite() {
            continue;
        }
        candidates.push(Candidate { t_max_s: t_max, total_s: g[batch] + k1 * t_max });
        let (sum, max) = traced_sum_max(&tables, &g_arg, |i| &dps[i].bp);
        if sum + k1 * max < best_objective {
            best_objective = sum + k1 * max;
            best = traced_scheme(&tables, &g_arg, |i| &dps[i].bp);
        }
    }

    best.sort_by(|x, y| tables[y.0].sequences.cmp(&tables[x.0].sequences));
    let sub_batches: Vec<SubBatch> = best
        .iter()
        .map(|(i, slices)| SubBatch {
            sequences: tables[*i].sequences,
            slices: slices.iter().map(|&(a, m)| p.boundary(m) - p.boundary(a)).collect(),
        })
        .collect();
    let (_, t_max_s) = sum_and_max(&sub_batches, cost);
    SlicingPlan {
        latency_s: latency(p, &sub_batches, cost),
        t_max_s,
        sub_batches,
        candidates,
        evaluated,
        stopped_early,
    }
}

#[cfg(test)]
mod tests {
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
            .map(|_| {
                if integers { rng.random_range(100..10_000u32) as f64 } else { 10f64.powf(rng.random_range(-2.0..1.0)) }
            })
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
            let plan = optimize_with(&p, &cost, if integers { Options::default() } else { EXACT });
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
            let plan = optimize_with(&p, &cost, EXACT);
            check_plan(&p, &plan, &cost);
            let best = naive(&p, &cost);
            assert!(rel_close(plan.latency_s, best, 1e-9), "case {case} {p:?}: dp {} naive {best}", plan.latency_s);
            let merged = optimize(&p, &cost);
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
            let plan = optimize_with(&p, &cost, EXACT);
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
                let exact = optimize_with(&p, &cost, EXACT);
                let merged = optimize(&p, &cost);
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
            check_plan(&p, &optimize(&p, &cost), &cost);
        }
    }

    #[test]
    fn gpt_sized_problem_is_solved_consistently() {
        // 2048 tokens in units of 8 through 40 stages, a batch of 32: correctness only.
        let p = SliceProblem::new(2048, 32, 40);
        let cost = terapipe_cost(2e-3, 1e-4, 1e-5, 5e-9);
        let plan = optimize(&p, &cost);
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
        let exact = optimize_with(&p, &cost, EXACT);
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
        let plan = optimize_with(&p, &cost, EXACT);
        assert_eq!(plan.evaluated, 0);
        assert!(rel_close(plan.latency_s, brute_force(&p, &cost), 1e-9));
    }

    #[test]
    fn the_plan_is_deterministic() {
        let p = SliceProblem { seq_len: 300, batch: 6, stages: 8, granularity: 8 };
        let cost = terapipe_cost(1e-3, 1e-4, 1e-5, 5e-9);
        let (a, b) = (optimize(&p, &cost), optimize(&p, &cost));
        assert_eq!(a, b);
        assert_eq!(serde_json::to_string(&a).unwrap(), serde_json::to_string(&b).unwrap());
    }
}
