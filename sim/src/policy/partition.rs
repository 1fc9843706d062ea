//! BaPipe's balanced partition (SEEDS §3) of a model's layers over the stages of one pipeline,
//! with the memory rules of the pipeline schedules of SEEDS §3 and §5.1 (GPipe, 1F1B with a
//! flush, PipeDream-2BW).
//!
//! Everything here is pure and deterministic: no I/O, no clock, no global state.
//!
//! # Objective
//!
//! The layers `0..L` are cut into `p = devices.len()` contiguous, non-empty stages; stage `k`
//! (0-based) runs on `devices[k]`. A stage covering layers `[i, j]` (inclusive) costs
//!
//! ```text
//! time_k   = max( Σ_{l=i..j} compute_s[l] / speed_k ,
//!                 output_bytes[j] / link_bytes_per_s_k + link_latency_s_k )   (k < p−1)
//! time_k   =      Σ_{l=i..j} compute_s[l] / speed_k                           (k = p−1: no next stage)
//! memory_k = copies(rule) · Σ weight_bytes[l] + in_flight(rule, k) · Σ activation_bytes[l]
//! ```
//!
//! and the plan's bottleneck is `max_k time_k`. A stage fits when `memory_k ≤
//! devices[k].memory_bytes` (inclusive). The weight copies and the micro-batches in flight are
//! [`StashRule::weight_copies`] and [`StashRule::in_flight`]:
//!
//! | rule | in flight on stage `k` of `p` (`m` micro-batches) | weight copies |
//! |---|---|---|
//! | [`StashRule::GPipe`] | `m` | 1 |
//! | [`StashRule::OneFOneB`] | `min(p − k, m)` | 1 |
//! | [`StashRule::TwoBW`] | `min(p − k, m)` | 2 (the whole `weight_bytes`, gradients and optimizer state included, is doubled: a deliberate simplification) |
//!
//! # Dynamic programs, and which optimum
//!
//! The min-max objective alone leaves many optimal plans (every plan whose stages all stay
//! under the bottleneck), some badly lopsided away from the bottleneck stage. [`balanced`]
//! returns, among the min-max optima, the one whose **fastest stage is slowest** (max-min), so
//! the other stages are as close to the bottleneck as the layers allow. Two exact DPs, each
//! `O(p·L²)` time and `O(p·L)` memory:
//!
//! ```text
//! 1. best[0][j] = time_0(0, j)                                    if stage 0 on [0, j] fits
//!    best[k][j] = min_{k ≤ i ≤ j, stage k on [i, j] fits}  max(best[k−1][i−1], time_k(i, j))
//!    B* = best[p−1][L−1]                                          (none: no plan fits)
//! 2. low[0][j]  = time_0(0, j)                                    if it fits and is ≤ B*
//!    low[k][j]  = max_{k ≤ i ≤ j, stage k on [i, j] fits, time_k(i, j) ≤ B*}  min(low[k−1][i−1], time_k(i, j))
//! ```
//!
//! and the plan is read back from `low[p−1][L−1]`. A one-pass DP on the pair (max, min) would
//! not be exact (a prefix with a larger max can win once the last stage dominates both), hence
//! the two passes, the second with `B*` fixed. (The leximax rule — stage times sorted
//! descending, lexicographically least — is exact in one pass but does not balance: with equal
//! speeds it can leave a stage more than a layer's time below the others when a split within
//! one layer exists, e.g. layers `[0.90, 0.85, 0.92, 0.24, 0.70, 0.78, 0.78]` on 4 stages.)
//!
//! Rather than prefix sums, each start `i` accumulates its sums forward over `j = i, i+1, …`,
//! in the same order as [`evaluate`] sums a stage, so both DPs' stage times and memories are
//! bit-identical to those [`evaluate`] reports for the chosen split (no prefix-sum
//! cancellation; the `≤ B*` test of pass 2 sees exactly pass 1's numbers; no plan the DP thought
//! fitting can fail [`evaluate`]'s memory check). Because every byte count is non-negative, a
//! stage's memory only grows with `j`, so the scan for a start stops at the first end that does
//! not fit.
//!
//! # Tie-breaking
//!
//! Comparisons are exact on `f64`. In pass 2 the starts `i` are tried in increasing order and a
//! candidate replaces the incumbent only when strictly better, so among the plans with the
//! optimal `(B*, min)` the last stage starts as early as any of them allows (it is as long as
//! possible, like [`uniform`] giving the extra layers to the later stages), and the layers
//! before it are split, by the same rule, as the max-min plan of that prefix over the first
//! `p − 1` devices among those whose stages all take `≤ B*`, each stage costed as it stands in
//! the full pipeline (stage `p − 2` still pays for its link, and 1F1B stashes count `p`
//! stages).
//!
//! With the compute-only objective on equal-speed devices the tests check, on random profiles,
//! that the plan's stage times all lie within the largest single layer's time of each other.
//!
//! # Preconditions
//!
//! All byte counts and times are finite and non-negative, speeds are positive, link bandwidths
//! positive (`f64::INFINITY` means a free link), memory capacities non-negative (may be
//! infinite). NaN inputs do not panic, but a stage whose time is NaN is never chosen by
//! [`balanced`], and a plan whose bottleneck is infinite (a zero bandwidth, a zero speed) counts
//! as no plan.

use serde::{Deserialize, Serialize};

/// Per-layer profile for partitioning (one entry per layer, in model order).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LayerProfile {
    /// Forward + backward seconds of one micro-batch on a reference-speed (`speed = 1.0`) device.
    pub compute_s: f64,
    /// Bytes of weights + gradients + optimizer state the layer needs on its stage.
    pub weight_bytes: f64,
    /// Bytes the layer stashes per in-flight micro-batch.
    pub activation_bytes: f64,
    /// Bytes of activation the layer sends to the next stage per micro-batch when it is the
    /// stage's last layer (forward; backward sends the same size back).
    pub output_bytes: f64,
}

/// One pipeline stage's device: relative speed (1.0 = the reference), memory capacity, and the
/// bandwidth (bytes/s) + latency (s) of its link to the next stage.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StageDevice {
    /// Compute speed relative to the reference device the layer times were profiled on.
    pub speed: f64,
    /// Memory capacity in bytes.
    pub memory_bytes: f64,
    /// Bandwidth of the link to the next stage, bytes/s (`f64::INFINITY`: free). Unused on the
    /// last stage.
    pub link_bytes_per_s: f64,
    /// Latency of the link to the next stage, seconds. Unused on the last stage.
    pub link_latency_s: f64,
}

/// How many micro-batches a stage keeps in flight under the schedule: GPipe `m`; 1F1B
/// `min(p − k, m)` for stage `k` (0-based) of `p`; 2BW like 1F1B plus a second weight copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StashRule {
    /// F-then-B (GPipe): every stage stashes all `m` micro-batches.
    GPipe,
    /// 1F1B with a flush (DAPPLE / PipeDream-Flush): stage `k` stashes `min(p − k, m)`.
    OneFOneB,
    /// PipeDream-2BW: stashes like 1F1B, and keeps two weight versions.
    TwoBW,
}

impl StashRule {
    /// Micro-batches stage `stage` (0-based) of a `stages`-stage pipeline keeps stashed, with
    /// `micro_batches` per mini-batch.
    pub fn in_flight(self, stage: usize, stages: usize, micro_batches: u32) -> u32 {
        match self {
            StashRule::GPipe => micro_batches,
            StashRule::OneFOneB | StashRule::TwoBW => {
                let ahead = stages.saturating_sub(stage);
                u32::try_from(ahead).unwrap_or(u32::MAX).min(micro_batches)
            }
        }
    }

    /// How many times a stage holds its `weight_bytes`: 2 for 2BW, else 1.
    pub fn weight_copies(self) -> f64 {
        match self {
            StashRule::TwoBW => 2.0,
            StashRule::GPipe | StashRule::OneFOneB => 1.0,
        }
    }
}

/// One stage of a plan.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StagePlan {
    /// First layer of the stage (0-based).
    pub first_layer: u32,
    /// Last layer of the stage, inclusive.
    pub last_layer: u32,
    /// `max(compute / speed, transfer)` as in the objective (compute only on the last stage).
    pub time_s: f64,
    /// Memory the stage needs under the schedule's stash rule.
    pub memory_bytes: f64,
}

/// A partition of the layers over the pipeline's stages.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PartitionPlan {
    /// The stages, in pipeline order; they cover the layers contiguously.
    pub stages: Vec<StagePlan>,
    /// `max` of the stages' `time_s`.
    pub bottleneck_s: f64,
}

impl PartitionPlan {
    /// Layers per stage, in pipeline order (the `counts` that [`evaluate`] takes).
    pub fn counts(&self) -> Vec<u32> {
        self.stages.iter().map(|s| s.last_layer - s.first_layer + 1).collect()
    }
}

/// The running sums of a stage's layers.
#[derive(Clone, Copy, Default)]
struct Sums {
    compute_s: f64,
    weight_bytes: f64,
    activation_bytes: f64,
}

impl Sums {
    fn add(&mut self, layer: &LayerProfile) {
        self.compute_s += layer.compute_s;
        self.weight_bytes += layer.weight_bytes;
        self.activation_bytes += layer.activation_bytes;
    }
}

/// Time and memory of stage `stage` of `stages`, from its sums and its last layer. The single
/// place the objective is computed, shared by the DP and [`evaluate`].
fn stage_cost(
    sums: Sums,
    last: &LayerProfile,
    device: &StageDevice,
    stage: usize,
    stages: usize,
    micro_batches: u32,
    rule: StashRule,
) -> (f64, f64) {
    let compute = sums.compute_s / device.speed;
    let time = if stage + 1 < stages {
        let transfer = last.output_bytes / device.link_bytes_per_s + device.link_latency_s;
        compute.max(transfer)
    } else {
        compute
    };
    let memory = rule.weight_copies() * sums.weight_bytes
        + f64::from(rule.in_flight(stage, stages, micro_batches)) * sums.activation_bytes;
    (time, memory)
}

/// Calls `visit(k, i, j, time)` for every stage `k` on layers `[i, j]` that can be part of a
/// plan (stage 0 starts at layer 0, stage `k` leaves a layer to each other stage, the last
/// stage ends at the last layer) and fits its device's memory, with a time that is not NaN; in
/// order of `k`, then `i`, then `j`, all increasing. Sums accumulate forward, as in
/// [`evaluate`].
fn scan(
    layers: &[LayerProfile],
    devices: &[StageDevice],
    micro_batches: u32,
    rule: StashRule,
    mut visit: impl FnMut(usize, usize, usize, f64),
) {
    let (n, p) = (layers.len(), devices.len());
    for (k, device) in devices.iter().enumerate() {
        let last_end = n - (p - k);
        let starts = if k == 0 { 0..=0 } else { k..=last_end };
        for i in starts {
            let mut sums = Sums::default();
            for (j, layer) in layers.iter().enumerate().take(last_end + 1).skip(i) {
                sums.add(layer);
                if k + 1 == p && j + 1 < n {
                    continue;
                }
                let (time, memory) = stage_cost(sums, layer, device, k, p, micro_batches, rule);
                // Memory never shrinks as the stage grows (non-negative bytes): stop here. A NaN
                // memory does not fit either.
                if memory.is_nan() || memory > device.memory_bytes {
                    break;
                }
                if !time.is_nan() {
                    visit(k, i, j, time);
                }
            }
        }
    }
}

fn layer_index(i: usize) -> u32 {
    u32::try_from(i).expect("more than u32::MAX layers")
}

/// Exact min-max partition of the layers into `devices.len()` contiguous non-empty stages,
/// each fitting its device's memory with `micro_batches` under `rule`; `None` if no partition
/// fits (including when there are fewer layers than devices, or no devices). Among min-max
/// optima it returns the one whose fastest stage is slowest, exact ties broken as the module
/// documentation says (the last stage as long as possible, recursively).
pub fn balanced(
    layers: &[LayerProfile],
    devices: &[StageDevice],
    micro_batches: u32,
    rule: StashRule,
) -> Option<PartitionPlan> {
    let (n, p) = (layers.len(), devices.len());
    if p == 0 || n < p {
        return None;
    }
    // Pass 1: the least bottleneck B*.
    let mut best = vec![f64::INFINITY; p * n];
    scan(layers, devices, micro_batches, rule, |k, i, j, time| {
        let before = if k == 0 { 0.0 } else { best[(k - 1) * n + i - 1] };
        if before < f64::INFINITY {
            let candidate = before.max(time);
            if candidate < best[k * n + j] {
                best[k * n + j] = candidate;
            }
        }
    });
    let bottleneck = best[(p - 1) * n + n - 1];
    if bottleneck == f64::INFINITY {
        return None;
    }
    // Pass 2: among plans with every stage ≤ B*, the largest least stage time; start[k * n + j]
    // is stage k's first layer in the plan of layers 0..=j over stages 0..=k.
    let mut low = vec![f64::NEG_INFINITY; p * n];
    let mut start = vec![usize::MAX; p * n];
    scan(layers, devices, micro_batches, rule, |k, i, j, time| {
        if time > bottleneck {
            return;
        }
        let before = if k == 0 { f64::INFINITY } else { low[(k - 1) * n + i - 1] };
        if k > 0 && start[(k - 1) * n + i - 1] == usize::MAX {
            return;
        }
        let candidate = before.min(time);
        if start[k * n + j] == usize::MAX || candidate > low[k * n + j] {
            low[k * n + j] = candidate;
            start[k * n + j] = i;
        }
    });
    let mut counts = vec![0u32; p];
    let mut end = n - 1;
    for k in (0..p).rev() {
        let i = start[k * n + end];
        counts[k] = layer_index(end - i + 1);
        if k > 0 {
            end = i - 1;
        }
    }
    let (plan, fits) = evaluate(layers, devices, micro_batches, rule, &counts);
    debug_assert!(fits);
    debug_assert_eq!(plan.bottleneck_s, bottleneck);
    debug_assert_eq!(plan.stages.iter().map(|s| s.time_s).fold(f64::INFINITY, f64::min), low[(p - 1) * n + n - 1]);
    Some(plan)
}

/// Layers split as evenly as possible by count (`⌊L/p⌋` each, the `L mod p` extra layers one
/// each to the last stages), evaluated with the same objective; the flag says whether every
/// stage fits its device's memory (the plan is reported either way).
///
/// # Panics
///
/// If there are no devices or fewer layers than devices.
pub fn uniform(
    layers: &[LayerProfile],
    devices: &[StageDevice],
    micro_batches: u32,
    rule: StashRule,
) -> (PartitionPlan, bool) {
    let (n, p) = (layers.len(), devices.len());
    assert!(p > 0 && n >= p, "uniform: {n} layers cannot fill {p} non-empty stages");
    let (base, extra) = (n / p, n % p);
    let counts: Vec<u32> = (0..p).map(|k| layer_index(base + usize::from(k >= p - extra))).collect();
    evaluate(layers, devices, micro_batches, rule, &counts)
}

/// Evaluates a given split (`counts[k]` layers on stage `k`, in order) with the objective; the
/// flag says whether every stage fits its device's memory.
///
/// # Panics
///
/// If `counts` does not have one non-zero entry per device, or does not sum to the number of
/// layers.
pub fn evaluate(
    layers: &[LayerProfile],
    devices: &[StageDevice],
    micro_batches: u32,
    rule: StashRule,
    counts: &[u32],
) -> (PartitionPlan, bool) {
    let p = devices.len();
    assert_eq!(counts.len(), p, "evaluate: one count per device");
    assert!(counts.iter().all(|&c| c > 0), "evaluate: empty stage in {counts:?}");
    let total: u64 = counts.iter().map(|&c| u64::from(c)).sum();
    assert_eq!(total, layers.len() as u64, "evaluate: counts {counts:?} do not cover {} layers", layers.len());
    let mut stages = Vec::with_capacity(p);
    let mut fits = true;
    let mut bottleneck = 0.0f64;
    let mut first = 0usize;
    for (k, (&count, device)) in counts.iter().zip(devices).enumerate() {
        let last = first + count as usize - 1;
        let mut sums = Sums::default();
        for layer in &layers[first..=last] {
            sums.add(layer);
        }
        let (time_s, memory_bytes) = stage_cost(sums, &layers[last], device, k, p, micro_batches, rule);
        fits &= memory_bytes <= device.memory_bytes;
        bottleneck = bottleneck.max(time_s);
        stages.push(StagePlan { first_layer: layer_index(first), last_layer: layer_index(last), time_s, memory_bytes });
        first = last + 1;
    }
    (PartitionPlan { stages, bottleneck_s: bottleneck }, fits)
}

#[cfg(test)]
#[path = "partition_tests.rs"]
mod tests;
