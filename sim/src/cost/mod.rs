//! Cost models: how long an op takes on a device, and the static memory of a plan.
//!
//! Compute follows a roofline: `max(flops / (peak x efficiency(shape)), bytes / (bandwidth x
//! mem_efficiency)) + launch` per kernel. The GEMM efficiency starts from the device's
//! large-GEMM efficiency and loses what tile quantization (partial output tiles of the tile
//! cuBLAS picks on the architecture), wave quantization (the last wave of tiles leaves SMs
//! idle) and a short K loop (the pipeline's prologue steps) cost; the tilings are in
//! `hardware::kernels`. Fused attention follows the published kernel rates ([`attention`]).
//! Under fp8 only the GEMMs run at the fp8 peak, each paying Transformer Engine's
//! cast-transpose kernels as memory-bound work; attention's products stay 16-bit. A
//! [`Calibration`] from measurements replaces the device defaults.
//! Communication time is not here: the engine moves bytes over links (see `network`).

pub mod attention;
pub mod memory;
pub mod slice;

use crate::hardware::kernels::{self, GemmTiling, GpuArch};
use crate::hardware::{DeviceKind, DeviceSpec, Precision};
use crate::workload::context_ring::RingPart;
use crate::workload::{OpClass, OpSpec};

/// The kernel family a memory-bound op belongs to (ops of a family cost the same per byte;
/// calibration measures one rate per family).
pub fn memory_kernel(name: &str) -> &'static str {
    match name {
        "ln1" | "ln2" | "final_norm" => "ln1",
        "softmax" | "attn_scale" | "attn_mask" => "softmax",
        "act" => "act",
        "attn_dropout" => "attn_dropout",
        "dropout_residual" | "dropout" | "fp8_cast" => "dropout_residual",
        "optimizer" | "cpu_optimizer" => "optimizer",
        // Eager frameworks' multi-pass Adam (see `hardware::kernels::memory_kernel_efficiency`).
        "optimizer_foreach" => "optimizer_foreach",
        _ => "embedding",
    }
}

/// Whether op `name` is an optimizer step (on the device, eager or fused, or on the host): the
/// executors run it as Adam over its bytes' parameters.
pub fn is_optimizer_step(name: &str) -> bool {
    matches!(memory_kernel(name), "optimizer" | "optimizer_foreach")
}

/// Measured corrections of a device's defaults (from the executor's calibration).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Calibration {
    pub gemm_efficiency: f64,
    pub mem_efficiency: f64,
    pub kernel_launch_s: f64,
}

/// Times ops on one device at one precision.
#[derive(Clone, Debug)]
pub struct ComputeModel {
    peak_flops: f64,
    gemm_efficiency: f64,
    mem_bytes_per_s: f64,
    launch_s: f64,
    units: f64,
    quantize: bool,
    /// Measured bytes per second per memory-kernel family (overrides the roofline).
    op_rates: Vec<(&'static str, f64)>,
    /// Efficiency factor per op name (the device's `op_efficiency`).
    op_factors: Vec<(String, f64)>,
    /// GEMM weights sit in on-chip memory (an FPGA whose stage fits its SRAM): they are not
    /// read from device memory.
    weights_on_chip: bool,
    arch: Option<GpuArch>,
    tiling: GemmTiling,
    /// The 16-bit tensor peak and large-GEMM efficiency: the GEMMs that stay 16-bit under fp8
    /// training.
    peak16_flops: f64,
    gemm16_efficiency: f64,
    /// GEMMs run in fp8 (with cast-transpose kernels around them).
    fp8: bool,
    /// Which casts surround an fp8 GEMM (the framework's).
    fp8_casts: crate::framework::Fp8Casts,
    /// Share of a GEMM's forward calls that cast its weight: Transformer Engine casts each
    /// weight once per step and reuses the fp8 copy over the step's micro-batches
    /// (`is_first_microbatch`), 1 / micro-batches; torchao casts it every call, 1.
    fp8_weight_casts: f64,
    /// Tensor-parallel ranks over whose sequence shards a column-parallel module's input is
    /// cast to fp8 before its all-gather (torchao's float8 tensor parallelism,
    /// `workload::Fusion::fp8_tp_gather`); 1 otherwise.
    fp8_input_shards: f64,
}

/// The GEMMs that stay 16-bit under fp8 training, with no cast around them: the attention's
/// products; the output layer (`logits`), which no framework runs in fp8 (Megatron-Core builds
/// it as its own `tensor_parallel.ColumnParallelLinear`, outside Transformer Engine's fp8
/// autocast, `megatron/core/models/gpt/gpt_model.py`; torchtitan converts every linear but
/// `output`, `torchtitan/float8.py` `module_filter_fn`, December 2024; DeepSeek-V3 keeps "the
/// output head" and "MoE gating modules" in BF16 or FP32, technical report section 3.3.1); and
/// the MoE router (Megatron-Core's `TopKRouter` multiplies by its weight with
/// `torch.nn.functional.linear`, also outside Transformer Engine).
pub(crate) fn sixteen_bit_gemm(name: &str) -> bool {
    matches!(name, "scores" | "attn_v" | "flash_attn" | "logits" | "router")
}

/// The GEMMs that read the input of the GEMM before them: the key and value projections after
/// the query's, the up projection after the gate's, when the model runs a GEMM each
/// (`workload::Fusion::projections` off). Under fp8 they share that input's cast: torch.compile
/// deduplicates the identical abs-max and cast of one tensor (AOTAutograd's common
/// subexpression elimination), and torchtitan's tensor parallelism under Float8 casts a
/// module's input once before its all-gather (`PrepareFloat8ModuleInput`,
/// `torchtitan/parallelisms/parallelize_llama.py` at 9dec370). Eager torchao without tensor
/// parallelism would cast it once per GEMM; trainsim charges one cast.
pub(crate) fn shares_input_cast(name: &str) -> bool {
    matches!(name, "k_proj" | "v_proj" | "up_proj")
}

/// The column-parallel GEMMs whose input a module gathers over the tensor-parallel group
/// under sequence parallelism (and casts first, under torchao's float8 tensor parallelism):
/// the attention's and the MLP's input projections, fused or the first of each group.
pub(crate) fn column_parallel_input(name: &str) -> bool {
    matches!(name, "qkv" | "q_proj" | "fc1" | "gate_proj")
}

/// Whose fp8 cast a GEMM's input takes ([`ComputeModel::fp8_cast_s`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum InputCast {
    /// The GEMM casts its own input.
    Own,
    /// Another GEMM on the same input cast it ([`shares_input_cast`]).
    Shared,
    /// Cast on each of this many sequence shards before an fp8 all-gather (torchao's float8
    /// tensor parallelism); the GEMM reads the gathered fp8 tensor.
    Sharded(f64),
}

/// How well one output tile shape fits a GEMM on `units` SMs: its utilisation (partial edge
/// tiles times the last wave's filling) and its tile count, `split` slices of K each.
fn tile_fit(units: f64, batch: f64, m: f64, n: f64, (tile_m, tile_n): (f64, f64), split: f64) -> (f64, f64) {
    let tm = (m / tile_m).ceil().max(1.0);
    let tn = (n / tile_n).ceil().max(1.0);
    let tile_util = (m * n) / (tm * tn * tile_m * tile_n);
    let tiles = batch * tm * tn * split;
    let waves = (tiles / units).ceil().max(1.0);
    (tile_util * tiles / (waves * units), tiles)
}

/// The output tiles of a GEMM under the tile the cost model takes cuBLAS to pick on `units`
/// SMs (the best-utilised of `kernels::gemm_tiling(arch)`'s, K not split): the units its
/// waves are counted in, also when collectives hold some of the SMs (`engine::contention`).
pub fn gemm_tiles(arch: Option<kernels::GpuArch>, units: f64, batch: f64, m: f64, n: f64) -> f64 {
    let mut best = (f64::NEG_INFINITY, 1.0);
    for &tile in kernels::gemm_tiling(arch).tiles {
        let fit = tile_fit(units.max(1.0), batch, m, n, tile, 1.0);
        if fit.0 > best.0 {
            best = fit;
        }
    }
    best.1
}

impl ComputeModel {
    pub fn new(device: &DeviceSpec, precision: Precision, calibration: Option<Calibration>) -> ComputeModel {
        let (ge, me, launch) = match calibration {
            Some(c) => (c.gemm_efficiency, c.mem_efficiency, c.kernel_launch_s),
            None => (device.gemm_efficiency_at(precision), device.mem_efficiency, device.kernel_launch_s),
        };
        // Compute-bound kernels at a board power limit below the rated one run at a lower
        // clock (`hardware::power`); a calibration measured the machine as it runs.
        let clock = match (&calibration, device.power) {
            (None, Some(p)) => p.compute_speed(),
            _ => 1.0,
        };
        ComputeModel {
            peak_flops: device.peak_flops.at(precision) * clock,
            gemm_efficiency: ge,
            mem_bytes_per_s: device.mem_bandwidth_bytes_per_s * me,
            launch_s: launch,
            units: device.compute_units.max(1) as f64,
            quantize: device.kind == DeviceKind::Gpu,
            op_rates: Vec::new(),
            op_factors: device.op_efficiency.clone(),
            weights_on_chip: false,
            arch: kernels::arch_of(device),
            tiling: kernels::gemm_tiling(kernels::arch_of(device)),
            peak16_flops: device.peak_flops.at(if precision == Precision::Fp16 {
                Precision::Fp16
            } else {
                Precision::Bf16
            }) * clock,
            gemm16_efficiency: device.gemm_efficiency,
            fp8: precision == Precision::Fp8 && device.peak_flops.fp8.is_some(),
            fp8_casts: crate::framework::Fp8Casts::Te,
            fp8_weight_casts: 1.0,
            fp8_input_shards: 1.0,
        }
    }

    /// The plan's fp8 casts ([`ComputeModel::with_fp8_casts`]) and, under torchao's float8
    /// tensor parallelism with sequence parallelism, the column-parallel inputs cast on their
    /// shards.
    pub fn with_fp8_plan(self, plan: &crate::plan::Plan) -> ComputeModel {
        let mut m = self.with_fp8_casts(plan.framework.fp8_casts, plan.micro_batches);
        if plan.fusion.fp8_tp_gather && plan.sequence_parallel && plan.tp > 1 {
            m.fp8_input_shards = f64::from(plan.tp);
        }
        m
    }

    /// The framework's casts around fp8 GEMMs (Transformer Engine's unless set), for steps of
    /// `micro_batches` micro-batches: Transformer Engine's modules cast each weight on the
    /// step's first micro-batch and reuse the cached fp8 copy on the others (the
    /// `is_first_microbatch` argument of `transformer_engine.pytorch.Linear.forward`: "during
    /// FP8 training, it allows caching of the FP8 versions of the weights"; Megatron-Core's
    /// `forward_step` calls `set_is_first_microbatch` on the first, `pipeline_parallel/
    /// schedules.py`).
    pub fn with_fp8_casts(mut self, casts: crate::framework::Fp8Casts, micro_batches: u32) -> ComputeModel {
        self.fp8_casts = casts;
        self.fp8_weight_casts = match casts {
            crate::framework::Fp8Casts::Te => 1.0 / f64::from(micro_batches.max(1)),
            crate::framework::Fp8Casts::Torchao => 1.0,
        };
        self
    }

    /// Keep GEMM weights on chip (not read from device memory).
    pub fn with_weights_on_chip(mut self, on_chip: bool) -> ComputeModel {
        self.weights_on_chip = on_chip;
        self
    }

    /// Use measured streaming rates per memory-kernel family (name, bytes/s).
    pub fn with_op_rates(mut self, rates: &[(String, f64)]) -> ComputeModel {
        self.op_rates = rates.iter().map(|(n, r)| (memory_kernel(n), *r)).collect();
        self
    }

    /// Fraction of peak a GEMM of this shape reaches: the large-GEMM efficiency, times the
    /// best tile's output utilisation (partial edge tiles) and wave utilisation (the last of
    /// `ceil(tiles / SMs)` waves part-empty), times the K loop's share outside its prologue.
    ///
    /// When the output has too few tiles to fill the GPU, cuBLAS splits K (its `splitK`
    /// kernels): `s` slices of K run as `s` times the tiles, and the fp32 partial sums are
    /// written and read back once more by a reduction. The split (1 to
    /// [`kernels::MAX_SPLIT_K`], each slice at least [`kernels::MIN_SPLIT_K`] deep) that
    /// takes the least time is modelled as chosen; its reduction's traffic is folded into
    /// the efficiency.
    pub fn gemm_efficiency(&self, batch: f64, m: f64, n: f64, k: f64) -> f64 {
        self.shape_efficiency(self.gemm_efficiency, self.peak_flops, batch, m, n, k)
    }

    /// [`Self::gemm_efficiency`] from a large-GEMM efficiency `base` at a `peak` (the training
    /// precision's, or the 16-bit one for the GEMMs that stay 16-bit under fp8).
    fn shape_efficiency(&self, base: f64, peak: f64, batch: f64, m: f64, n: f64, k: f64) -> f64 {
        let t = &self.tiling;
        let k_eff = |k: f64| (k / t.k_step) / (k / t.k_step + t.prologue_steps);
        if !self.quantize {
            return base * k_eff(k);
        }
        let util = |tile: (f64, f64), split: f64| tile_fit(self.units, batch, m, n, tile, split).0;
        let at = |split: f64| {
            let tiles = t.tiles.iter().map(|&tile| util(tile, split)).fold(0.0, f64::max);
            base * tiles * k_eff(k / split)
        };
        let mut best = at(1.0);
        let flops = 2.0 * batch * m * n * k;
        if flops.is_nan() || flops <= 0.0 {
            return best;
        }
        for s in 2..=kernels::MAX_SPLIT_K {
            let split = s as f64;
            if k / split < kernels::MIN_SPLIT_K {
                break;
            }
            // The split's compute and its partial sums' round trip, as one efficiency.
            let compute_s = flops / (peak * at(split));
            let reduce_s = self.memory_s(2.0 * split * batch * m * n * 4.0);
            best = best.max(flops / (peak * (compute_s + reduce_s)));
        }
        best
    }

    pub fn memory_s(&self, bytes: f64) -> f64 {
        bytes / self.mem_bytes_per_s
    }

    /// Seconds for one op, forward or backward, with the launch of each kernel it runs.
    pub fn op_s(&self, op: &OpSpec, backward: bool) -> f64 {
        self.op_rows_s(op, backward, 1.0)
    }

    /// Seconds for `rows` of an op's rows (tokens), forward or backward: a GEMM cut into
    /// chunks along its rows (PyTorch's and Transformer Engine's fused tensor-parallel
    /// collectives, `lower::OpInstance::rows`) is a kernel of its own, m x rows by k by n:
    /// its tiles and waves are the chunk's, it pays its launch and fixed cost in full and
    /// reads the whole weight; its fp8 casts are the chunk's share of the op's (the weight is
    /// cast once for every chunk). Any other op takes that share of its time.
    pub fn op_rows_s(&self, op: &OpSpec, backward: bool, rows: f64) -> f64 {
        let (mut flops, mut bytes) =
            if backward { (op.backward_flops, op.backward_bytes) } else { (op.forward_flops, op.forward_bytes) };
        let whole = rows >= 1.0;
        if !whole && !matches!(op.class, OpClass::Gemm { .. }) {
            return self.op_rows_s(op, backward, 1.0) * rows;
        }
        let factor = self.op_factors.iter().find(|(n, _)| n == op.name).map_or(1.0, |(_, f)| *f);
        let mut extra_s = 0.0;
        let compute = match op.class {
            OpClass::Gemm { batch, m, n, k } => {
                let passes = if backward { 2.0 } else { 1.0 };
                let elem = bytes_per_elem(op, batch, m, n, k, backward);
                if self.weights_on_chip {
                    // The weight matrix (k x n) is read from SRAM, not device memory.
                    bytes = (bytes - passes * batch * k * n * elem).max(0.0);
                }
                if !whole {
                    // The chunk's rows of the input and output; the weight's bytes stay.
                    bytes = (bytes - passes * batch * elem * (1.0 - rows) * m * (k + n)).max(0.0);
                    flops *= rows;
                }
                let m_all = m;
                let m = m * rows.min(1.0);
                let (peak, base) = if self.fp8 && sixteen_bit_gemm(op.name) {
                    (self.peak16_flops, self.gemm16_efficiency)
                } else {
                    (self.peak_flops, self.gemm_efficiency)
                };
                if self.fp8 && !sixteen_bit_gemm(op.name) {
                    let input = match shares_input_cast(op.name) {
                        true => InputCast::Shared,
                        false if self.fp8_input_shards > 1.0 && column_parallel_input(op.name) => {
                            InputCast::Sharded(self.fp8_input_shards)
                        }
                        false => InputCast::Own,
                    };
                    extra_s = self.fp8_cast_s(batch, m_all, n, k, backward, input) * rows.min(1.0);
                }
                let kernels = if backward { 2.0 } else { 1.0 };
                let efficiency = self.shape_efficiency(base, peak, batch, m, n, k);
                flops / (peak * efficiency * factor) + kernels * self.tiling.fixed_s
            }
            OpClass::Attention { q, context, head_dim, causal, kernel, ring, part, .. } => {
                let e = if ring > 1 {
                    attention::ring_efficiency(self.arch, kernel, q, head_dim, causal, backward, (ring, part))
                } else {
                    attention::efficiency(self.arch, kernel, q, context, head_dim, causal, backward)
                };
                flops / (self.peak16_flops * e * factor)
            }
            OpClass::Memory | OpClass::Copies { .. } => {
                let family = memory_kernel(op.name);
                if let Some(&(_, rate)) = self.op_rates.iter().find(|(f, _)| *f == family) {
                    return bytes / rate + launches(op, backward) * self.launch_s;
                }
                // The family's kernel reaches only a share of the streaming bandwidth.
                let share = kernels::memory_kernel_efficiency(self.arch, family);
                return bytes / (self.mem_bytes_per_s * share) + launches(op, backward) * self.launch_s;
            }
        };
        compute.max(self.memory_s(bytes)) + extra_s + launches(op, backward) * self.launch_s
    }

    /// The fp8 casts around one GEMM (input m x k, weight k x n, output m x n), as memory-bound
    /// kernels. Transformer Engine: forward casts (and transposes) the input, and the weight on
    /// the step's first micro-batch only (amortised over the micro-batches), backward the output
    /// gradient. torchao's dynamic casts: forward casts the input and the
    /// weight (an abs-max pass and a cast each); backward casts the output gradient for each
    /// of its two GEMMs (one abs-max, two casts) and the kept 16-bit input and weight again.
    /// The input's casts are the GEMM's own, another GEMM's ([`shares_input_cast`]), or made
    /// on its sequence shards before an fp8 all-gather ([`InputCast::Sharded`]).
    pub fn fp8_cast_s(&self, batch: f64, m: f64, n: f64, k: f64, backward: bool, input: InputCast) -> f64 {
        use crate::framework::Fp8Casts;
        if let (InputCast::Sharded(shards), Fp8Casts::Torchao) = (input, self.fp8_casts) {
            // Forward: the shard's cast (an abs-max and a cast of m / shards rows) where the
            // GEMM would cast all m. Backward: the weight's cast as always, the output gradient's
            // too, and the gathered fp8 input only copied to the column-major layout the weight
            // gradient's scaled GEMM reads (torchao's float8 mm: `t().contiguous().t()`), a
            // read and a write of a byte an element, in place of its re-cast from 16 bits.
            let own = self.fp8_cast_s(batch, m, n, k, backward, InputCast::Shared);
            let mk = m * k;
            let extra = if backward {
                self.memory_s(2.0 * mk * batch)
            } else {
                self.memory_s(kernels::FP8_DYNAMIC_CAST_BYTES_PER_ELEM * mk / shards * batch) + 2.0 * self.launch_s
            };
            return own + extra + if backward { self.launch_s } else { 0.0 };
        }
        let (mk, input_casts) = if matches!(input, InputCast::Shared) { (0.0, 0.0) } else { (m * k, 1.0) };
        let (bytes, casts) = match (self.fp8_casts, backward) {
            (Fp8Casts::Te, false) => {
                let w = self.fp8_weight_casts;
                (kernels::FP8_CAST_TRANSPOSE_BYTES_PER_ELEM * (mk + w * k * n), input_casts + w)
            }
            (Fp8Casts::Te, true) => (kernels::FP8_CAST_TRANSPOSE_BYTES_PER_ELEM * m * n, 1.0),
            (Fp8Casts::Torchao, false) => {
                (kernels::FP8_DYNAMIC_CAST_BYTES_PER_ELEM * (mk + k * n), 2.0 + 2.0 * input_casts)
            }
            (Fp8Casts::Torchao, true) => {
                // The gradient: one abs-max (2 bytes) and two casts (3 each); input and weight
                // cast again.
                let grad = (2.0 + 2.0 * (kernels::FP8_DYNAMIC_CAST_BYTES_PER_ELEM - 2.0)) * m * n;
                (grad + kernels::FP8_DYNAMIC_CAST_BYTES_PER_ELEM * (mk + k * n), 5.0 + 2.0 * input_casts)
            }
        };
        self.memory_s(bytes * batch) + casts * self.launch_s
    }

    pub fn launch_s(&self) -> f64 {
        self.launch_s
    }
}

/// Kernels an op launches: the backward of a GEMM is two GEMMs (data and weight
/// gradients); FlashAttention-2's backward is three (`flash_bwd_dot_do_o`, the main
/// `flash_bwd_dq_dk_dv` loop and `flash_bwd_convert_dq`; flash-attn
/// `csrc/flash_attn/src/flash_bwd_launch_template.h`).
pub fn launches(op: &OpSpec, backward: bool) -> f64 {
    match op.class {
        OpClass::Gemm { .. } if backward => 2.0,
        OpClass::Attention { ring, part, .. } => {
            let steps = match part {
                RingPart::All => ring.max(1) as f64,
                RingPart::Local => 1.0,
                RingPart::Remote => ring.saturating_sub(1).max(1) as f64,
            };
            if backward { 3.0 * steps } else { steps }
        }
        OpClass::Copies { kernels } => kernels,
        _ => 1.0,
    }
}

/// Bytes per element of a GEMM op, recovered from its byte count (batch x e x (mk + kn + mn)
/// per pass).
fn bytes_per_elem(op: &OpSpec, batch: f64, m: f64, n: f64, k: f64, backward: bool) -> f64 {
    let (bytes, passes) = if backward { (op.backward_bytes, 2.0) } else { (op.forward_bytes, 1.0) };
    let elems = passes * batch * (m * k + k * n + m * n);
    if elems > 0.0 { bytes / elems } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::catalog;
    use crate::workload::Saved;

    fn gemm(name: &'static str, m: f64, n: f64, k: f64) -> OpSpec {
        let flops = 2.0 * m * n * k;
        let bytes = 2.0 * (m * k + k * n + m * n);
        OpSpec {
            name,
            class: OpClass::Gemm { batch: 1.0, m, n, k },
            forward_flops: flops,
            forward_bytes: bytes,
            backward_flops: 2.0 * flops,
            backward_bytes: 2.0 * bytes,
            saved: Saved::default(),
        }
    }

    #[test]
    fn op_kind_efficiency_scales_compute_bound_gemms() {
        let mut dev = catalog::device("alveo-u280").expect("preset");
        dev.op_efficiency = vec![("slow".into(), 0.5)];
        dev.kernel_launch_s = 0.0;
        let m = ComputeModel::new(&dev, Precision::Fp16, None);
        let (a, b) = (
            m.op_s(&gemm("conv", 4096.0, 4096.0, 4096.0), false),
            m.op_s(&gemm("slow", 4096.0, 4096.0, 4096.0), false),
        );
        assert!((b / a - 2.0).abs() < 1e-9, "{b} vs {a}");
    }

    /// Below its rated power an H100's GEMMs take 1/speed as long, its memory-bound kernels
    /// as long as before; a calibrated model keeps what it measured.
    #[test]
    fn a_power_limit_slows_compute_bound_kernels_only() {
        let mut dev = catalog::device("h100-sxm").expect("preset");
        dev.kernel_launch_s = 0.0;
        let big = gemm("fc", 8192.0, 8192.0, 8192.0);
        let copy = OpSpec { class: OpClass::Memory, forward_flops: 0.0, ..gemm("residual", 8192.0, 8192.0, 8192.0) };
        let rated = ComputeModel::new(&dev, Precision::Bf16, None);
        let mut power = dev.power.expect("a GPU preset has its rated power");
        power.limit_w = 500.0;
        dev.power = Some(power);
        let capped = ComputeModel::new(&dev, Precision::Bf16, None);
        let ratio = capped.op_s(&big, false) / rated.op_s(&big, false);
        assert!((ratio - 1.0 / power.compute_speed()).abs() < 1e-9, "{ratio}");
        assert!(ratio > 1.1, "{ratio}");
        assert_eq!(capped.op_s(&copy, false), rated.op_s(&copy, false));
    }

    /// A GEMM cut into eight chunks of rows (a fused tensor-parallel all-gather's) is eight
    /// kernels: on an H100 the 16,384 x 1,792 x 4,096 product fills 6.8 waves of 128 x 256
    /// tiles, each 2,048-row chunk 0.85 of one, so the chunks together take longer than the
    /// whole, and each pays a launch; a memory-bound op takes its share of the time.
    #[test]
    fn a_gemm_chunk_of_rows_has_its_own_waves_and_launch() {
        let dev = catalog::device("h100-sxm").expect("preset");
        let model = ComputeModel::new(&dev, Precision::Bf16, None);
        let op = gemm("fc1", 16384.0, 1792.0, 4096.0);
        for backward in [false, true] {
            let whole = model.op_s(&op, backward);
            assert_eq!(model.op_rows_s(&op, backward, 1.0), whole);
            let chunks = 8.0 * model.op_rows_s(&op, backward, 0.125);
            assert!(chunks > 1.08 * whole && chunks < 1.3 * whole, "backward {backward}: {chunks} vs {whole}");
        }
        // Launch-bound: a tiny GEMM's chunks each pay the whole launch and fixed cost.
        let tiny = gemm("fc1", 64.0, 64.0, 64.0);
        assert!(8.0 * model.op_rows_s(&tiny, false, 0.125) > 4.0 * model.op_s(&tiny, false));
        let copy = OpSpec { class: OpClass::Memory, forward_flops: 0.0, ..gemm("residual", 8192.0, 8192.0, 8192.0) };
        let share = model.op_rows_s(&copy, false, 0.25) / model.op_s(&copy, false);
        assert!((share - 0.25).abs() < 1e-12, "{share}");
    }

    #[test]
    fn weights_on_chip_free_a_weight_bound_gemm_from_device_memory() {
        let mut dev = catalog::device("alveo-u280").expect("preset");
        dev.kernel_launch_s = 0.0;
        // A fully connected layer at batch 1: all weight traffic, memory bound.
        let fc = gemm("fc", 1.0, 4096.0, 4096.0);
        let off = ComputeModel::new(&dev, Precision::Fp16, None).op_s(&fc, false);
        let on = ComputeModel::new(&dev, Precision::Fp16, None).with_weights_on_chip(true).op_s(&fc, false);
        assert!(on < 0.5 * off, "on chip {on} vs off {off}");
    }

    #[test]
    fn fp8_training_keeps_the_output_layer_and_the_router_in_16_bit() {
        let dev = catalog::device("h100-sxm").expect("preset");
        let bf16 = ComputeModel::new(&dev, Precision::Bf16, None);
        let fp8 = ComputeModel::new(&dev, Precision::Fp8, None);
        // A large compute-bound shape: fp8 halves a block GEMM (less its casts), not the head's.
        let (m, n, k) = (16384.0, 16384.0, 8192.0);
        for name in ["logits", "router"] {
            let op = gemm(name, m, n, k);
            for backward in [false, true] {
                let (a, b) = (bf16.op_s(&op, backward), fp8.op_s(&op, backward));
                assert!((a - b).abs() < 1e-12 * a, "{name}: bf16 {a} s, fp8 {b} s");
            }
        }
        let fc1 = gemm("fc1", m, n, k);
        let (a, b) = (bf16.op_s(&fc1, false), fp8.op_s(&fc1, false));
        // Twice the peak at a smaller share of it (0.64 against 0.72 on H100), plus the casts.
        assert!(b < 0.7 * a && b > 0.5 * a, "fc1: bf16 {a} s, fp8 {b} s");
        assert!(b > fp8.fp8_cast_s(1.0, m, n, k, false, InputCast::Own), "fc1's fp8 time includes its casts");
    }

    /// torchao's dynamic casts move 5 bytes per element where Transformer Engine's fused
    /// cast-transpose moves 4, and its backward casts the gradient twice and the input and
    /// weight again: 18 bytes per (square) GEMM's element where Transformer Engine moves 4;
    /// torchao casts the weight on every micro-batch, Transformer Engine on the first.
    #[test]
    fn torchao_casts_move_what_its_float8_linear_reads_and_writes() {
        let mut dev = catalog::device("h100-sxm").expect("preset");
        dev.kernel_launch_s = 0.0;
        let te = ComputeModel::new(&dev, Precision::Fp8, None);
        let ao = ComputeModel::new(&dev, Precision::Fp8, None).with_fp8_casts(crate::framework::Fp8Casts::Torchao, 4);
        let d = 4096.0;
        let elem = te.memory_s(d * d);
        for (backward, te_bytes, ao_bytes) in [(false, 8.0, 10.0), (true, 4.0, 18.0)] {
            let (a, b) = (
                te.fp8_cast_s(1.0, d, d, d, backward, InputCast::Own),
                ao.fp8_cast_s(1.0, d, d, d, backward, InputCast::Own),
            );
            assert!((a / elem - te_bytes).abs() < 1e-9, "te backward={backward}: {} bytes", a / elem);
            assert!((b / elem - ao_bytes).abs() < 1e-9, "torchao backward={backward}: {} bytes", b / elem);
        }
        // Over four micro-batches Transformer Engine casts each weight once: forward 4 + 4/4.
        let te4 = ComputeModel::new(&dev, Precision::Fp8, None).with_fp8_casts(crate::framework::Fp8Casts::Te, 4);
        assert!((te4.fp8_cast_s(1.0, d, d, d, false, InputCast::Own) / elem - 5.0).abs() < 1e-9);
        assert!((te4.fp8_cast_s(1.0, d, d, d, true, InputCast::Own) / elem - 4.0).abs() < 1e-9);
        // A GEMM sharing the previous one's input (the key projection after the query's) casts
        // only its weight forward and its gradient and weight backward: 5 and 13 bytes.
        for (backward, bytes) in [(false, 5.0), (true, 13.0)] {
            let b = ao.fp8_cast_s(1.0, d, d, d, backward, InputCast::Shared);
            assert!((b / elem - bytes).abs() < 1e-9, "shared input, backward={backward}: {} bytes", b / elem);
        }
        let (q, k) = (gemm("q_proj", d, d, d), gemm("k_proj", d, d, d));
        assert!(ao.op_s(&k, false) < ao.op_s(&q, false), "the key projection shares the query's cast");
        // Under float8 tensor parallelism over 8 ranks the query projection's input is cast on
        // its shard (5/8 of a byte an element of the gathered input) and, backward, copied to
        // column-major fp8 (2 bytes) where it would be cast again (5): 5 + 0.625 and 13 + 2.
        for (backward, bytes) in [(false, 5.625), (true, 15.0)] {
            let b = ao.fp8_cast_s(1.0, d, d, d, backward, InputCast::Sharded(8.0));
            assert!((b / elem - bytes).abs() < 1e-9, "sharded input, backward={backward}: {} bytes", b / elem);
        }
    }
}
