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

/// The most slice costs the optimiser tabulates. Each is a layer's ops through the cost model,
/// about 8 us on one core, so 4 M take about half a minute (at the earlier 50 M a fuzzed
/// problem of 1-token units ran five minutes before answering); TeraPipe's own settings need
/// about 1 M (2,048 tokens in 8-token units, 32 sub-batch sizes).
pub const MAX_TABLE_ENTRIES: u64 = 4_000_000;

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

    /// Refuse a problem whose tables exceed [`MAX_TABLE_ENTRIES`] (time) or whose batch is
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

/// Whether token slicing applies to the workload: a transformer whose attention is causal (a
/// later token must not be read by an earlier one), not a net of distinct layers.
pub fn applies(w: &crate::workload::Workload) -> Result<(), String> {
    if w.net.is_some() {
        return Err(format!(
            "token slicing (TeraPipe) cuts a transformer's sequences into slices; {} is a network of distinct layers (CNN or RNN)",
            w.name
        ));
    }
    if !w.transformer.causal {
        return Err(
            "token slicing needs causal attention (a later token must not be read by an earlier one); this workload is bidirectional".into(),
        );
    }
    Ok(())
}

/// `cost(b, l, c)`: seconds one stage spends on a slice of `l` tokens of `b` sequences whose
/// causal attention reads `c` earlier tokens (forward + backward; the caller's cost model).
/// Must be finite and > 0 for `l > 0`; the optimiser returns an error naming the first slice
/// whose cost is not.
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
pub fn optimize(p: &SliceProblem, cost: &SliceCost<'_>) -> Result<SlicingPlan, String> {
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
    fn new(p: &SliceProblem, sequences: u32, cost: &SliceCost<'_>) -> Result<Self, String> {
        let n = p.units();
        let mut w = vec![0.0; n * (n + 1) / 2];
        for m in 1..=n {
            for a in 0..m {
                let (c, l) = (p.boundary(a), p.boundary(m) - p.boundary(a));
                let t = cost(sequences, l, c);
                if !(t.is_finite() && t > 0.0) {
                    return Err(format!(
                        "a slice of {l} tokens of {sequences} sequence(s) after {c} earlier tokens costs {t} s; a slice's time must be finite and above zero (check the device's peak_flops, bandwidths and kernel_launch_s)"
                    ));
                }
                w[tri(a, m)] = t;
            }
        }
        let mut h = vec![f64::INFINITY; n + 1];
        h[0] = 0.0;
        for m in 1..=n {
            h[m] = (0..m).map(|a| h[a].max(w[tri(a, m)])).fold(f64::INFINITY, f64::min);
        }
        Ok(Table { sequences, w, bottleneck: h[n] })
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
pub fn optimize_with(p: &SliceProblem, cost: &SliceCost<'_>, opts: Options) -> Result<SlicingPlan, String> {
    p.validate();
    let tol = opts.candidate_tolerance;
    assert!(tol >= 0.0 && tol.is_finite(), "candidate tolerance must be finite and >= 0");
    let n = p.units();
    let batch = p.batch as usize;
    let k1 = (p.stages - 1) as f64;
    let tables: Vec<Table> =
        sub_batch_sizes(p.batch).into_iter().map(|b| Table::new(p, b, cost)).collect::<Result<_, _>>()?;

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
    Ok(SlicingPlan {
        latency_s: latency(p, &sub_batches, cost),
        t_max_s,
        sub_batches,
        candidates,
        evaluated,
        stopped_early,
    })
}

#[cfg(test)]
#[path = "token_slicing_tests.rs"]
mod tests;
