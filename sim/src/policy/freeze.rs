//! PipeTransformer's freeze-driven elastic pipelining (SEEDS §1.2–§1.4): AutoFreeze decides how
//! many transformer blocks are frozen in each epoch, AutoPipe re-partitions the remaining
//! (active) sub-layers and compresses the pipeline, and AutoDP fills the freed GPUs with more
//! pipeline replicas.
//!
//! Everything here is pure and deterministic: no I/O, no clock, no global state.
//!
//! # AutoFreeze
//!
//! [`autofreeze_closed_form`] is the released code's hand-crafted schedule
//! (`calculate_frozen_layer_num`, used by default since `is_hand_crafted = True`):
//!
//! ```text
//! L_frozen(e) = ceil( (1−α)^e · [ αL/(1−α) + Σ_{t=2..e} αL/(1−α)^t ] )   for e ≥ 1,  L_frozen(0) = 0
//!             = ceil( L · (1 − (1−α)^e) )                               in exact arithmetic
//! ```
//!
//! It is evaluated with the code's floating-point arithmetic (the first line, summed left to
//! right in `f64`, powers by `powf` like Python's `**`), not the second line: the two differ by
//! one layer at some ceil boundaries (e.g. `L = 27, α = 1/3, e = 3`: exact 19, the code's sum
//! gives 19.000000000000004 → 20; `L = 9, α = 1/9, e = 1`: exact 1, the plain form gives
//! 1.0000000000000004 → 2 while the code's sum gives 1). [`autofreeze_plain`] is the second line in
//! `f64`, for comparison. None of SEEDS §1.2's table rows sits on such a boundary; both forms
//! reproduce them. The code's sum can also exceed `L` once `(1−α)^e` is tiny (e.g. `L = 1,
//! α = 0.99, e = 10` gives 2): the result is clamped to `L`.
//!
//! [`gradient_rule`] is the code's gradient-norm path (`is_hand_crafted = False`), over a given
//! trace of per-layer gradient norms; [`synthetic_trace`] makes a plausible such trace.
//!
//! # AutoPipe
//!
//! The model is flattened into sub-layers (`vit_partition.py`): `[embedding] + [MHA_i, MLP_i for
//! each active block i] + [encoder_norm, head]` ([`transformer_sublayers`], [`vit_sublayers`]);
//! the cost proxy is the parameter count in millions. Once `f ≥ 1` blocks are frozen, the
//! embedding and the MHA/MLP of blocks `0..f` move to the `FrozenLayer` module on the first GPU
//! of the pipeline and leave the partitioned sequence ([`active_sublayers`]); the encoder norm
//! and the head always stay.
//!
//! [`greedy_partition`] is the code's `generate_parameter_size_wise_balance`, reproduced with its
//! quirks (the `mean + var` threshold mixing Mparams and Mparams², population variance, the last
//! device taking the rest). [`compressed_length`] halves the pipeline length `K` while the
//! largest partition of the active sub-layers over `K/2` GPUs is at most `S_max(0)`, the largest
//! partition of the whole model over `K0` GPUs (blog Eq. 1, `_auto_pipe_length`).
//!
//! The partitions used for compression and reported in the plans weigh nothing for the frozen
//! module (`frozen_on_first = 0`): that is the code's normal path and the one that reproduces
//! SEEDS §1.3's K-per-epoch traces. Counting the frozen module on the first GPU at 1/6 of its
//! size would keep `K = 2` at 11 of 12 frozen ViT-B/16 blocks (its 78.7 M frozen parameters
//! weigh 13.1 M, plus 7.9 M active, over `S_max(0) = 14.18 M`), where the trace has `K = 1`.
//!
//! # AutoDP and micro-batches
//!
//! With `N` nodes and pipeline length `K`, each node runs `K0/K` pipelines, so there are
//! `R = N·K0/K` replicas ([`elastic_schedule`]). The number of micro-batches is the code's
//! hard-coded table ([`micro_batches_for`]).

use serde::{Deserialize, Serialize};

/// λ_frozen: the memory cost of a frozen layer relative to the same layer when active (SEEDS
/// §1.3), used by [`greedy_partition`] for frozen parameters counted on the first device.
pub const FROZEN_COST_FACTOR: f64 = 1.0 / 6.0;

fn check_alpha(alpha: f64) {
    assert!(alpha > 0.0 && alpha < 1.0, "AutoFreeze needs 0 < alpha < 1, got {alpha}");
}

/// AutoFreeze's closed form, as the released code computes it: the number of frozen layers
/// (blocks) of a model of `layers` layers during epoch `epoch`, `0` at epoch 0, then
/// `ceil((1−α)^e · [αL/(1−α) + Σ_{t=2..e} αL/(1−α)^t])` in `f64`, clamped to `layers`.
///
/// See the module documentation for where this differs from the plain `ceil(L·(1−(1−α)^e))`.
///
/// # Panics
///
/// Unless `0 < alpha < 1`.
pub fn autofreeze_closed_form(layers: u32, alpha: f64, epoch: u32) -> u32 {
    check_alpha(alpha);
    if epoch == 0 || layers == 0 {
        return 0;
    }
    let (l, keep) = (layers as f64, 1.0 - alpha);
    let mut sum = alpha * l / keep;
    for t in 2..=epoch {
        sum += alpha * l / keep.powf(t as f64);
    }
    finish_closed_form(layers, keep, epoch, sum)
}

/// `ceil((1−α)^e · sum)` clamped to `layers`. For huge epochs `(1−α)^e` underflows and the
/// product is NaN or infinite (Python would raise `ZeroDivisionError`); the limit is `layers`.
fn finish_closed_form(layers: u32, keep: f64, epoch: u32, sum: f64) -> u32 {
    let v = (keep.powf(epoch as f64) * sum).ceil();
    if !v.is_finite() || v >= layers as f64 { layers } else { v.max(0.0) as u32 }
}

/// The plain closed form `ceil(L·(1 − (1−α)^e))` evaluated in `f64` (`0` at epoch 0, clamped to
/// `layers`): equal to the exact value but for floating-point error, and to
/// [`autofreeze_closed_form`] except at some ceil boundaries. For comparison only.
///
/// # Panics
///
/// Unless `0 < alpha < 1`.
pub fn autofreeze_plain(layers: u32, alpha: f64, epoch: u32) -> u32 {
    check_alpha(alpha);
    if epoch == 0 {
        return 0;
    }
    let v = (layers as f64 * (1.0 - (1.0 - alpha).powf(epoch as f64))).ceil();
    (v.max(0.0) as u32).min(layers)
}

/// The AutoFreeze schedule for epochs `0..epochs`: entry `e` is the number of frozen layers while
/// epoch `e` trains, [`autofreeze_closed_form`] kept as a running maximum (layers are never
/// unfrozen; no floating-point wobble of the closed form was found for `L ≤ 48`, α in
/// hundredths and `e < 200`, but the maximum guards against one).
///
/// # Panics
///
/// Unless `0 < alpha < 1`.
pub fn autofreeze_schedule(layers: u32, alpha: f64, epochs: u32) -> Vec<u32> {
    check_alpha(alpha);
    let (l, keep) = (layers as f64, 1.0 - alpha);
    // The code's sum, accumulated in the same order as `autofreeze_closed_form` (bit for bit).
    let (mut sum, mut frozen) = (0.0, 0);
    (0..epochs)
        .map(|e| {
            if e >= 1 && layers > 0 {
                sum = if e == 1 { alpha * l / keep } else { sum + alpha * l / keep.powf(e as f64) };
                frozen = frozen.max(finish_closed_form(layers, keep, e, sum));
            }
            frozen
        })
        .collect()
}

/// NumPy's `percentile(v, 50)` with its default linear interpolation (`v` non-empty).
fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let pos = 0.5 * (s.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = pos.ceil() as usize;
    let t = pos - lo as f64;
    let (a, b) = (s[lo], s[hi]);
    // NumPy's `_lerp`: `a + (b−a)·t`, or `b − (b−a)·(1−t)` when `t ≥ 0.5`.
    if t >= 0.5 { b - (b - a) * (1.0 - t) } else { a + (b - a) * t }
}

/// The released code's gradient-norm freezing rule (`is_hand_crafted = False`,
/// `freeze_interval = 1`) over a trace of gradient norms.
///
/// `trace[e][l]` is `G_ℓ` measured over epoch `e`: the sum over layer `l`'s parameters of the
/// L1 norm of the gradient accumulated during that epoch. Every row must have the same number
/// of layers `L`. The result has one entry per row: entry `e` is the number of frozen layers
/// while epoch `e` trains.
///
/// Which values are compared: the rule is evaluated at the end of every epoch. The evaluation
/// at the end of epoch 0 only records `G^prev = trace[0]`, so epochs 0 and 1 train with nothing
/// frozen. The evaluation at the end of epoch `e ≥ 1` compares `trace[e−1]` (as `G^prev`) with
/// `trace[e]` (as `G`) and sets the frozen count of epoch `e + 1`; the last row therefore only
/// decides an epoch beyond the result. For each layer `r_ℓ = |G^prev_ℓ − G_ℓ| / G^prev_ℓ`,
/// with `r_ℓ = 0` where `G_ℓ = 0` or `G^prev_ℓ = 0`, and `r_ℓ = 0` for layers already frozen
/// (they have no gradient in a real run; a trace given here may still hold values for them).
/// The threshold `τ` is the median (NumPy's 50th percentile, linear interpolation) of `r` over
/// the layers not yet frozen; `ℓ*` is the first layer, counting from 0, with `r_ℓ* ≥ τ`, and the
/// new count is `max(previous, ℓ* + 1)`. Once all `L` layers are frozen nothing changes.
///
/// When `τ > 0` each evaluation freezes at least one more layer (frozen layers have `r = 0 < τ`).
/// When `τ = 0` (at least half the active layers' `r` are 0) layer 0 matches, so the count only
/// becomes `max(previous, 1)`: the search starts at layer 0, as in the code. SEEDS gives
/// `r = 0` for `G_ℓ = 0`; the `G^prev_ℓ = 0` case (a division by zero) is this module's choice.
///
/// # Panics
///
/// If the rows differ in length.
pub fn gradient_rule(trace: &[Vec<f64>]) -> Vec<u32> {
    let layers = trace.first().map_or(0, Vec::len);
    assert!(trace.iter().all(|row| row.len() == layers), "every row of a gradient trace needs the same layer count");
    let mut out = Vec::with_capacity(trace.len());
    let mut frozen = 0usize;
    for e in 0..trace.len() {
        out.push(frozen as u32);
        // The evaluation at the end of epoch `e` sets the count of epoch `e + 1`.
        if e == 0 || frozen >= layers {
            continue;
        }
        let (prev, cur) = (&trace[e - 1], &trace[e]);
        let r: Vec<f64> =
            (0..layers)
                .map(|l| {
                    if l < frozen || cur[l] == 0.0 || prev[l] == 0.0 { 0.0 } else { (prev[l] - cur[l]).abs() / prev[l] }
                })
                .collect();
        let tau = median(&r[frozen..]);
        if let Some(star) = r.iter().position(|&x| x >= tau) {
            frozen = frozen.max(star + 1);
        }
    }
    out
}

/// SplitMix64 step: the seeded noise of [`synthetic_trace`].
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A **synthetic** gradient trace (not measured on any model) for tests and examples, in the
/// shape [`gradient_rule`] takes: `epochs` rows of `layers` values,
///
/// ```text
/// G_ℓ(e) = 100 · (0.02 + 0.98 · exp(−(e+1) / τ_ℓ)) · (1 + 0.02·u),   τ_ℓ = 1 + ℓ/2 epochs
/// ```
///
/// with `u` uniform in `[−1, 1)` from a SplitMix64 stream seeded by `seed`: every layer's
/// gradient decays to a small floor, lower layers (smaller `τ_ℓ`) converging earlier, with 2 %
/// multiplicative noise. The same seed gives the same trace.
pub fn synthetic_trace(layers: u32, epochs: u32, seed: u64) -> Vec<Vec<f64>> {
    let mut state = seed;
    (0..epochs)
        .map(|e| {
            (0..layers)
                .map(|l| {
                    let u = (splitmix64(&mut state) >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0;
                    let tau = 1.0 + 0.5 * l as f64;
                    100.0 * (0.02 + 0.98 * (-(e as f64 + 1.0) / tau).exp()) * (1.0 + 0.02 * u)
                })
                .collect()
        })
        .collect()
}

/// What a partition unit of a transformer is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SubLayerKind {
    /// Patch/token embedding (with class token and position embeddings for ViT).
    Embedding,
    /// A block's multi-head attention with its pre-norm and residual add.
    Attention,
    /// A block's MLP with its pre-norm and residual add.
    Mlp,
    /// The encoder's final norm.
    Norm,
    /// The classification head.
    Head,
}

/// A partition unit of a transformer for AutoPipe, with its parameter count.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SubLayer {
    /// `embedding`, `mha_{i}`, `mlp_{i}`, `encoder_norm` or `head`.
    pub name: String,
    /// What the unit is.
    pub kind: SubLayerKind,
    /// The transformer block index of an MHA or MLP unit; `None` for the others.
    pub block: Option<u32>,
    /// Parameters in millions (`count_parameters / 1e6`, the code's cost proxy).
    pub params_m: f64,
}

/// The sub-layer sequence `[embedding] + [MHA_i, MLP_i for i in 0..layers] + [encoder_norm,
/// head]` of a transformer of `layers` identical blocks, from the units' sizes in millions of
/// parameters.
pub fn transformer_sublayers(
    layers: u32,
    embedding_m: f64,
    attention_m: f64,
    mlp_m: f64,
    norm_m: f64,
    head_m: f64,
) -> Vec<SubLayer> {
    let unit = |name: String, kind, block, params_m| SubLayer { name, kind, block, params_m };
    let mut v = vec![unit("embedding".into(), SubLayerKind::Embedding, None, embedding_m)];
    for i in 0..layers {
        v.push(unit(format!("mha_{i}"), SubLayerKind::Attention, Some(i), attention_m));
        v.push(unit(format!("mlp_{i}"), SubLayerKind::Mlp, Some(i), mlp_m));
    }
    v.push(unit("encoder_norm".into(), SubLayerKind::Norm, None, norm_m));
    v.push(unit("head".into(), SubLayerKind::Head, None, head_m));
    v
}

/// The shape of a Vision Transformer, enough to count its parameters exactly.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VitShape {
    /// Transformer blocks.
    pub layers: u32,
    /// Hidden size.
    pub hidden: u64,
    /// MLP inner size.
    pub mlp_dim: u64,
    /// Image side in pixels.
    pub image_size: u64,
    /// Patch side in pixels.
    pub patch_size: u64,
    /// Input channels.
    pub channels: u64,
    /// Classes of the head.
    pub classes: u64,
}

impl VitShape {
    /// ViT-B/16 at 224 px (12 blocks, hidden 768, MLP 3072, 197 tokens) with a head of `classes`.
    pub fn b16(classes: u64) -> Self {
        VitShape { layers: 12, hidden: 768, mlp_dim: 3072, image_size: 224, patch_size: 16, channels: 3, classes }
    }

    /// Tokens per image: the patches plus the class token.
    pub fn tokens(&self) -> u64 {
        (self.image_size / self.patch_size).pow(2) + 1
    }

    /// Patch projection (conv weight and bias), class token and position embeddings.
    pub fn embedding_params(&self) -> u64 {
        let h = self.hidden;
        self.channels * self.patch_size * self.patch_size * h + h + h + self.tokens() * h
    }

    /// Pre-norm (2h), fused QKV projection with bias, output projection with bias.
    pub fn attention_params(&self) -> u64 {
        let h = self.hidden;
        2 * h + (h * 3 * h + 3 * h) + (h * h + h)
    }

    /// Pre-norm (2h) and the two linear layers with biases.
    pub fn mlp_params(&self) -> u64 {
        let (h, m) = (self.hidden, self.mlp_dim);
        2 * h + (h * m + m) + (m * h + h)
    }

    /// The encoder's final LayerNorm.
    pub fn norm_params(&self) -> u64 {
        2 * self.hidden
    }

    /// The linear head with bias.
    pub fn head_params(&self) -> u64 {
        self.hidden * self.classes + self.classes
    }
}

/// The sub-layers of a ViT (see [`transformer_sublayers`]), sizes counted from its shape. For
/// ViT-B/16 with 1000 classes: embedding 0.742656, MHA 2.363904, MLP 4.723968, norm 0.001536,
/// head 0.769 M (86.567656 M in all).
pub fn vit_sublayers(shape: &VitShape) -> Vec<SubLayer> {
    let m = |p: u64| p as f64 / 1e6;
    transformer_sublayers(
        shape.layers,
        m(shape.embedding_params()),
        m(shape.attention_params()),
        m(shape.mlp_params()),
        m(shape.norm_params()),
        m(shape.head_params()),
    )
}

/// Number of transformer blocks among `sublayers` (one more than the largest block index).
pub fn block_count(sublayers: &[SubLayer]) -> u32 {
    sublayers.iter().filter_map(|s| s.block).map(|b| b + 1).max().unwrap_or(0)
}

/// Whether a sub-layer stays in the pipeline once `frozen_blocks` blocks are frozen.
fn is_active(s: &SubLayer, frozen_blocks: u32) -> bool {
    match s.kind {
        SubLayerKind::Embedding => frozen_blocks == 0,
        SubLayerKind::Attention | SubLayerKind::Mlp => s.block.is_none_or(|b| b >= frozen_blocks),
        SubLayerKind::Norm | SubLayerKind::Head => true,
    }
}

/// The sub-layers that stay in the pipeline once `frozen_blocks` blocks are frozen, in order:
/// all of them at 0; from 1 on, the embedding and the MHA/MLP of blocks `0..frozen_blocks` go to
/// the frozen module on the first GPU, and the encoder norm and head stay.
pub fn active_sublayers(sublayers: &[SubLayer], frozen_blocks: u32) -> Vec<&SubLayer> {
    sublayers.iter().filter(|s| is_active(s, frozen_blocks)).collect()
}

/// Parameters (millions) of the frozen module once `frozen_blocks` blocks are frozen: the
/// sub-layers [`active_sublayers`] leaves out (0 at 0 blocks).
pub fn frozen_params_m(sublayers: &[SubLayer], frozen_blocks: u32) -> f64 {
    // A fold from +0.0: `Sum` for f64 starts from −0.0, which would print as `-0.0` when empty.
    sublayers.iter().filter(|s| !is_active(s, frozen_blocks)).fold(0.0, |acc, s| acc + s.params_m)
}

fn active_sizes(sublayers: &[SubLayer], frozen_blocks: u32) -> Vec<f64> {
    active_sublayers(sublayers, frozen_blocks).iter().map(|s| s.params_m).collect()
}

/// A split of a sequence of units into consecutive runs, one per device.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Partition {
    /// Units per device, in pipeline order (a device may get 0 when units run out).
    pub units: Vec<u32>,
    /// Sum of the units' sizes per device (raw sizes, without the frozen weighting).
    pub params_m: Vec<f64>,
}

impl Partition {
    /// The largest per-device size (0 for no devices).
    pub fn max_params_m(&self) -> f64 {
        self.params_m.iter().copied().fold(0.0, f64::max)
    }
}

/// The released code's greedy `generate_parameter_size_wise_balance(K, sizes)`: consecutive
/// runs of `sizes` onto `k` devices.
///
/// ```text
/// rem = Σ sizes; cnt = 0
/// for device i in 0..k:
///     mean = rem / (k−i);  var = Var(sizes[cnt..]) / (k−i)      (population variance)
///     for idx in cnt..len:
///         crit = size[i] + sizes[idx]  − (i == 0 ? frozen_on_first·(1 − 1/6) : 0)
///         if i == k−1 or crit < mean + var: take idx (size[i] += sizes[idx]; rem −= sizes[idx]; cnt++)
///         else: break
/// ```
///
/// `frozen_on_first` is the size of frozen parameters counted among device 0's units (0 on the
/// code's normal path); subtracting 5/6 of it weighs them at [`FROZEN_COST_FACTOR`]. The
/// threshold `mean + var` adds Mparams to Mparams², exactly as the code does. The last device
/// takes whatever remains, so the result is not always balanced.
///
/// # Panics
///
/// If `k == 0`.
pub fn greedy_partition(k: u32, sizes: &[f64], frozen_on_first: f64) -> Partition {
    assert!(k >= 1, "a partition needs at least one device");
    let mut rem: f64 = sizes.iter().sum();
    let mut cnt = 0usize;
    let mut units = Vec::with_capacity(k as usize);
    let mut params_m = Vec::with_capacity(k as usize);
    for i in 0..k {
        let left = (k - i) as f64;
        let mean = rem / left;
        let tail = &sizes[cnt..];
        let var = if tail.is_empty() {
            0.0
        } else {
            let m = tail.iter().sum::<f64>() / tail.len() as f64;
            tail.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / tail.len() as f64
        } / left;
        let discount = if i == 0 { frozen_on_first * (1.0 - FROZEN_COST_FACTOR) } else { 0.0 };
        let (mut n, mut size) = (0u32, 0.0f64);
        while cnt < sizes.len() {
            let p = sizes[cnt];
            let crit = size + p - discount;
            if i == k - 1 || crit < mean + var {
                size += p;
                rem -= p;
                cnt += 1;
                n += 1;
            } else {
                break;
            }
        }
        units.push(n);
        params_m.push(size);
    }
    Partition { units, params_m }
}

/// `S_max(0)`: the largest per-GPU size of the whole model (nothing frozen) over `k0` GPUs.
pub fn initial_max_params_m(sublayers: &[SubLayer], k0: u32) -> f64 {
    greedy_partition(k0, &active_sizes(sublayers, 0), 0.0).max_params_m()
}

fn compress(active: &[f64], mut k: u32, s_max0: f64) -> u32 {
    while k > 1 && greedy_partition(k / 2, active, 0.0).max_params_m() <= s_max0 {
        k /= 2;
    }
    k
}

fn check_power_of_two(k: u32, what: &str) {
    assert!(k >= 1 && k.is_power_of_two(), "{what} must be a power of two >= 1, got {k}");
}

/// AutoPipe's compression: starting from `current_k` (pass `k0` for the length from scratch),
/// halve the pipeline length while the active sub-layers (after freezing `frozen_blocks`
/// blocks) re-partitioned by [`greedy_partition`] onto half as many GPUs have a largest
/// partition `≤ S_max(0)` ([`initial_max_params_m`] over `k0`). Never below 1; the result is a
/// power of two dividing `k0`. The frozen module is not counted (see the module documentation).
///
/// # Panics
///
/// Unless `k0` and `current_k` are powers of two with `current_k ≤ k0`.
pub fn compressed_length(sublayers: &[SubLayer], k0: u32, current_k: u32, frozen_blocks: u32) -> u32 {
    check_power_of_two(k0, "K0");
    check_power_of_two(current_k, "the current pipeline length");
    assert!(current_k <= k0, "the current pipeline length {current_k} exceeds K0 = {k0}");
    compress(&active_sizes(sublayers, frozen_blocks), current_k, initial_max_params_m(sublayers, k0))
}

/// Micro-batches per mini-batch for a pipeline of `k` stages, as the released code hard-codes
/// (`_get_optimal_chunk_num_by_pipe_len`): 16 for `k` = 8 (2K), 4 (4K) and 2 (8K); `4k`
/// otherwise (4 for `k = 1`).
///
/// # Panics
///
/// If `k == 0`.
pub fn micro_batches_for(k: u32) -> u32 {
    assert!(k >= 1, "a pipeline needs at least one stage");
    match k {
        8 | 4 | 2 => 16,
        _ => 4 * k,
    }
}

/// One epoch of PipeTransformer's elastic run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EpochPlan {
    /// Epoch index, from 0.
    pub epoch: u32,
    /// Frozen blocks while this epoch trains.
    pub frozen_layers: u32,
    /// Pipeline length `K` (GPUs per pipeline).
    pub pipeline_length: u32,
    /// Pipeline replicas `R = N·K0/K` in data parallel.
    pub replicas: u32,
    /// Micro-batches per mini-batch, [`micro_batches_for`] `K`.
    pub micro_batches: u32,
    /// Active sub-layers per stage, in pipeline order (the greedy over the active sub-layers).
    pub partition: Vec<u32>,
    /// Active parameters (millions) per stage.
    pub stage_params_m: Vec<f64>,
    /// Parameters (millions) in the frozen module on each pipeline's first GPU (forward only).
    pub frozen_params_m: f64,
    /// Parameters (millions) still trained: what DDP all-reduces across the replicas.
    pub active_params_m: f64,
}

/// The elastic schedule: for each epoch `e`, with `frozen_per_epoch[e]` blocks frozen, the
/// pipeline length, replicas, micro-batches and partition.
///
/// Epoch 0 starts at `K = k0`. Whenever the frozen count grows, `K` is compressed from its
/// current value ([`compressed_length`]); it never grows back. There are `k0 / K` pipelines
/// per node, `R = nodes·k0/K` in all (AutoDP; the released code has `k0 = gpus_per_node`).
///
/// # Panics
///
/// If `k0` is not a power of two in `1..=gpus_per_node`, `nodes == 0`, or `frozen_per_epoch`
/// decreases or exceeds the blocks in `sublayers`.
pub fn elastic_schedule(
    frozen_per_epoch: &[u32],
    k0: u32,
    nodes: u32,
    gpus_per_node: u32,
    sublayers: &[SubLayer],
) -> Vec<EpochPlan> {
    check_power_of_two(k0, "K0");
    assert!(k0 <= gpus_per_node, "K0 = {k0} exceeds the {gpus_per_node} GPUs of a node");
    assert!(nodes >= 1, "the cluster needs at least one node");
    let blocks = block_count(sublayers);
    let s_max0 = initial_max_params_m(sublayers, k0);
    let (mut k, mut prev) = (k0, 0u32);
    let mut plans = Vec::with_capacity(frozen_per_epoch.len());
    for (e, &f) in frozen_per_epoch.iter().enumerate() {
        assert!(f >= prev, "frozen layers decrease at epoch {e}: {prev} -> {f}");
        assert!(f <= blocks, "{f} frozen layers at epoch {e} exceed the model's {blocks} blocks");
        let active = active_sizes(sublayers, f);
        if f > prev {
            k = compress(&active, k, s_max0);
        }
        prev = f;
        let part = greedy_partition(k, &active, 0.0);
        plans.push(EpochPlan {
            epoch: e as u32,
            frozen_layers: f,
            pipeline_length: k,
            replicas: nodes * (k0 / k),
            micro_batches: micro_batches_for(k),
            partition: part.units,
            stage_params_m: part.params_m,
            frozen_params_m: frozen_params_m(sublayers, f),
            active_params_m: active.iter().sum(),
        });
    }
    plans
}

#[cfg(test)]
#[path = "freeze_tests.rs"]
mod tests;
