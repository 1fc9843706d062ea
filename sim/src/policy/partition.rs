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
mod tests {
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
        let layers =
            vec![LayerProfile { compute_s: 1.0, weight_bytes: 10.0, activation_bytes: 1.0, output_bytes: 0.0 }; 6];
        let cap = |c0: f64, c1: f64| {
            vec![
                StageDevice { memory_bytes: c0, ..free_device(1.0) },
                StageDevice { memory_bytes: c1, ..free_device(1.0) },
            ]
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
}
