//! The compute kernels' catalog: per GPU architecture and kernel generation, the constants
//! the cost model needs beyond a device's datasheet (tile shapes cuBLAS picks, fused
//! attention's measured throughput, the fp8 casts), each with its source.
//!
//! Nothing here is fitted to a training run. The fused-attention rates are the published
//! microbenchmarks themselves (one number per head dimension and mask at the longest
//! sequence measured, plus a per-query-block overhead read off the shortest one); the
//! model in `cost::attention` derives every other shape from them.

use super::{DeviceKind, DeviceSpec, Vendor};

/// GPU architecture, which sets the kernels available and their shapes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuArch {
    /// sm70 (V100).
    Volta,
    /// sm75 (T4, RTX 5000).
    Turing,
    /// sm80 (A100).
    Ampere,
    /// sm90 (H100, H200).
    Hopper,
    /// sm100 (B200, GB200). No fused-attention or GEMM-tiling measurement of its own is in
    /// the catalog: it borrows Hopper's, as fractions of peak ([`attention_rates`],
    /// [`gemm_tiling`]).
    Blackwell,
}

/// The architecture of an NVIDIA device, from the model number in its name
/// ([`generation_in_name`]); `None` for CPUs, FPGAs, other vendors' GPUs (an AMD MI300X keeps
/// the generic model: no CDNA kernel measurement is in the catalog) and GPUs the catalog does
/// not know.
pub fn arch_of(device: &DeviceSpec) -> Option<GpuArch> {
    if device.kind != DeviceKind::Gpu || device.vendor != Vendor::Nvidia {
        return None;
    }
    generation_in_name(&device.name)
}

/// The GPU generation a device's name gives by a model number among its words, whatever the
/// case and the words around it: the presets' names (`h100-sxm`, `a100-sxm-80gb`), the names
/// `nvidia-smi` prints (`NVIDIA H100 80GB HBM3`, `NVIDIA A800-SXM4-80GB`) and export parts
/// (H800, H20, A800). `None` when no word names a known part. The one place a name becomes a
/// generation: the kernel model reads it here and NCCL's tables (`nccl::Arch::of`) too.
pub fn generation_in_name(name: &str) -> Option<GpuArch> {
    let n = name.to_ascii_lowercase();
    let words: Vec<&str> = n.split(|c: char| !c.is_ascii_alphanumeric()).filter(|w| !w.is_empty()).collect();
    let word = |parts: &[&str]| words.iter().any(|w| parts.contains(w));
    let starts = |parts: &[&str]| words.iter().any(|w| parts.iter().any(|p| w.starts_with(p)));
    // Model numbers alone or with a memory suffix (`h100`, `h100sxm`, `a100`): prefixes of
    // a word, longest first where one is a prefix of another.
    if starts(&["gh200", "h100", "h200", "h800"]) || word(&["h20"]) {
        Some(GpuArch::Hopper)
    } else if starts(&["gb200", "gb300", "b100", "b200", "b300"]) {
        Some(GpuArch::Blackwell)
    } else if starts(&["a100", "a800"]) {
        Some(GpuArch::Ampere)
    } else if starts(&["v100"]) {
        Some(GpuArch::Volta)
    } else if starts(&["rtx5000"]) || n.contains("rtx 5000") || n.contains("rtx-5000") || word(&["t4"]) {
        Some(GpuArch::Turing)
    } else {
        None
    }
}

/// A fused-attention kernel family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FlashKernel {
    /// The generation appropriate to the device (`"flash"`): FlashAttention-2 on Ampere and
    /// Hopper (flash-attn 2.x, and PyTorch's SDPA, which vendors it), cuDNN's on Blackwell,
    /// FlashAttention (v1) before. FlashAttention-3 is named (`"flash3"`): a separate Hopper
    /// build of flash-attn (`flash_attn_interface`), in beta from July 2024.
    Auto,
    /// What Transformer Engine's `DotProductAttention` runs (`"te"`, Megatron-Core's default):
    /// cuDNN's fused attention on Hopper and later (Transformer Engine turns FlashAttention off
    /// there "to give FusedAttention preference on Hopper+ for performance reasons",
    /// `get_attention_backend`), FlashAttention-2 on Ampere.
    Te,
    /// FlashAttention (Dao et al. 2022), flash-attn 1.x.
    V1,
    /// FlashAttention-2 (Dao 2023), flash-attn 2.x.
    V2,
    /// FlashAttention-3 (Shah et al. 2024), Hopper only.
    V3,
    /// cuDNN's fused attention (PyTorch SDPA's cuDNN backend, Transformer Engine).
    Cudnn,
    /// OpenAI's fused attention in Triton (`triton.ops.flash_attention`, the tutorial
    /// `06-fused-attention.py`): the kernel the FlashAttention-2 and -3 papers benchmark as
    /// "Triton" (`benchmarks/benchmark_flash_attention.py` imports
    /// `triton.ops.flash_attention`).
    Triton,
    /// FlashAttention (v1) written in Triton by its author (flash-attn's
    /// `flash_attn/flash_attn_triton.py`, Triton 2.0.0.dev20221202), which llm-foundry
    /// copied and ran as `attn_impl: triton` (`llmfoundry/models/layers/flash_attn_triton.py`).
    #[serde(rename = "flash1-triton")]
    Flash1Triton,
}

/// How attention runs: materialised scores, or one fused kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Attention {
    /// QK^T, softmax, dropout and PV as separate kernels (Megatron-LM 2021, eager PyTorch).
    Naive,
    Fused(FlashKernel),
}

impl serde::Serialize for Attention {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl Attention {
    /// Values of `training.attention`.
    pub const NAMES: [&'static str; 9] =
        ["naive", "flash", "te", "flash1", "flash2", "flash3", "cudnn", "triton", "flash1-triton"];

    pub fn parse(name: &str) -> Option<Attention> {
        Some(match name {
            "naive" => Attention::Naive,
            "flash" => Attention::Fused(FlashKernel::Auto),
            "te" => Attention::Fused(FlashKernel::Te),
            "flash1" => Attention::Fused(FlashKernel::V1),
            "flash2" => Attention::Fused(FlashKernel::V2),
            "flash3" => Attention::Fused(FlashKernel::V3),
            "cudnn" => Attention::Fused(FlashKernel::Cudnn),
            "triton" => Attention::Fused(FlashKernel::Triton),
            "flash1-triton" => Attention::Fused(FlashKernel::Flash1Triton),
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Attention::Naive => "naive",
            Attention::Fused(k) => match k {
                FlashKernel::Auto => "flash",
                FlashKernel::Te => "te",
                FlashKernel::V1 => "flash1",
                FlashKernel::V2 => "flash2",
                FlashKernel::V3 => "flash3",
                FlashKernel::Cudnn => "cudnn",
                FlashKernel::Triton => "triton",
                FlashKernel::Flash1Triton => "flash1-triton",
            },
        }
    }

    pub fn is_fused(self) -> bool {
        matches!(self, Attention::Fused(_))
    }

    /// The fused kernel, if it can run a head dimension of `head_dim` at 16-bit precision
    /// (`sixteen_bit`); otherwise attention falls back to the materialised path, as PyTorch's
    /// SDPA does. Limits: flash-attn 2.x and 3.x and cuDNN take head dimensions that are
    /// multiples of 8 up to 256 (flash-attn README, "head dimensions up to 256"); flash-attn
    /// 1.x and the Triton kernels up to 128 (`flash_attn_triton.py`: `assert d <= 128`; the
    /// Triton tutorial's `assert Lk in {16, 32, 64, 128}`); none runs fp32.
    pub fn fused_kernel(self, head_dim: f64, sixteen_bit: bool) -> Option<FlashKernel> {
        let Attention::Fused(k) = self else { return None };
        let max = match k {
            FlashKernel::V1 | FlashKernel::Triton | FlashKernel::Flash1Triton => 128.0,
            _ => 256.0,
        };
        let whole = head_dim.fract() == 0.0 && (head_dim as u64).is_multiple_of(8);
        (sixteen_bit && whole && head_dim <= max).then_some(k)
    }
}

impl FlashKernel {
    /// The kernel `Auto` and `Te` stand for on `arch`. On Blackwell FlashAttention-2 and -3 do
    /// not run (FlashAttention-3 is written for Hopper's TMA and WGMMA); the fused kernel that
    /// frameworks run there is cuDNN's (Transformer Engine's default backend), so `"flash"`
    /// means cuDNN.
    pub fn resolve(self, arch: Option<GpuArch>) -> FlashKernel {
        match (self, arch) {
            (FlashKernel::Te, Some(GpuArch::Hopper | GpuArch::Blackwell)) => FlashKernel::Cudnn,
            (FlashKernel::Auto, Some(GpuArch::Blackwell)) => FlashKernel::Cudnn,
            (FlashKernel::Auto | FlashKernel::Te, Some(GpuArch::Ampere | GpuArch::Hopper) | None) => FlashKernel::V2,
            (FlashKernel::Auto | FlashKernel::Te, _) => FlashKernel::V1,
            (k, _) => k,
        }
    }

    /// Head dimensions the kernel is compiled for: a head dimension in between runs padded
    /// to the next one (the kernel-selection cliff). flash-attn 2.x instantiates hdim 32, 64,
    /// 96, 128, 192, 256 (`csrc/flash_attn/src/flash_fwd_hdim*.cu`), flash-attn 3.x hdim 64,
    /// 96, 128, 192, 256 (`hopper/instantiations/`), flash-attn 1.x 16, 32, 64, 128; the
    /// Triton kernels pad to the next power of two (`flash_attn_triton.py`: `BLOCK_HEADDIM =
    /// max(next_power_of_2(d), 16)`; the tutorial compiles powers of two only); cuDNN, measured,
    /// behaves as if compiled for 64, 96, 128, 192 and 256. Dao-AILab/flash-attention at
    /// 0251105a2fb19d2957484b7f023cd8c115286ced.
    pub fn padded_head_dim(self, head_dim: f64) -> f64 {
        let templates: &[f64] = match self {
            FlashKernel::V1 => &[16.0, 32.0, 64.0, 128.0],
            FlashKernel::V2 | FlashKernel::Auto | FlashKernel::Te => &[32.0, 64.0, 96.0, 128.0, 192.0, 256.0],
            FlashKernel::V3 => &[64.0, 96.0, 128.0, 192.0, 256.0],
            FlashKernel::Triton | FlashKernel::Flash1Triton => return head_dim.max(16.0).log2().ceil().exp2(),
            // cuDNN's fused attention runs head dimensions above 64 as 96, 128, 192 or 256:
            // measured through PyTorch 2.11 (cuDNN 9.19) on an H100 SXM at 4,096 tokens
            // (traces/2026-11-26-cuda-h100/microbench.json `attention_hdim`), 72 and 80 run at
            // hdim 96's rate for their FLOPs (forward 384 and 441 TFLOP/s against 523 x 72/96
            // = 392 and 436), 112 at 128's (592 against 592), 160 at 192's, 224 at 256's.
            // Below 64 nothing was measured: no padding assumed.
            FlashKernel::Cudnn if head_dim <= 64.0 => return head_dim,
            FlashKernel::Cudnn => &[96.0, 128.0, 192.0, 256.0],
        };
        templates.iter().copied().find(|&t| t >= head_dim).unwrap_or(head_dim)
    }
}

/// Published throughput of a fused-attention kernel on one architecture, in TFLOP/s with
/// the FlashAttention benchmarks' FLOP count (4·s²·d per head forward, halved under a causal
/// mask; backward 2.5x the forward), batch x sequence = 16k tokens, hidden 2048.
#[derive(Clone, Copy, Debug)]
pub struct AttentionRates {
    pub arch: GpuArch,
    pub kernel: FlashKernel,
    /// Forward and backward at sequence 16k: `[head dim 64, 128][non-causal, causal]`.
    pub fwd_16k_tflops: [[f64; 2]; 2],
    pub bwd_16k_tflops: [[f64; 2]; 2],
    /// A head dimension of 256 against 128, same kernel and mask (forward).
    pub hdim256_over_128: f64,
    /// The same for backward: the forward's where nobody measured the backward apart.
    pub bwd_hdim256_over_128: f64,
    /// Whether that backward rate holds from just above 128 (a separate, slower kernel, as
    /// cuDNN's measured backward is) rather than growing in linearly up to 256.
    pub bwd_hdim_step_above_128: bool,
    /// Per query block (128 queries), the fixed work (load Q, rescale and write O; in
    /// backward also dQ's accumulation) in units of one 128-key block's work, read off the
    /// 512-token point against the 16k one (see `cost::attention`).
    pub fwd_overhead_blocks: f64,
    pub bwd_overhead_blocks: f64,
    pub source: &'static str,
}

/// Where only forward + backward was published, the split uses the kernel's
/// backward-to-forward rate ratio: FlashAttention-2 on A100 reaches 73% of peak forward
/// (230 TFLOP/s) and 203 TFLOP/s forward + backward at hdim 128 (Dao 2023, section 4.1 and
/// Figure 4b), so backward runs at 2.5 / (3.5/203 - 1/230) = 194 TFLOP/s, 0.843 of forward.
const A100_BWD_OVER_FWD: f64 = 0.843;

/// Split a forward + backward rate `r` into (forward, backward) with backward = k x forward.
const fn split(r: f64, k: f64) -> (f64, f64) {
    let fwd = r * (1.0 + 2.5 / k) / 3.5;
    (fwd, k * fwd)
}

const fn from_combined(r: [[f64; 2]; 2]) -> ([[f64; 2]; 2], [[f64; 2]; 2]) {
    let k = A100_BWD_OVER_FWD;
    let (a, b) = (split(r[0][0], k), split(r[0][1], k));
    let (c, d) = (split(r[1][0], k), split(r[1][1], k));
    ([[a.0, b.0], [c.0, d.0]], [[a.1, b.1], [c.1, d.1]])
}

const FA2_A100: ([[f64; 2]; 2], [[f64; 2]; 2]) = from_combined([[176.0, 171.0], [203.0, 189.0]]);
const FA1_A100: ([[f64; 2]; 2], [[f64; 2]; 2]) = from_combined([[110.0, 97.0], [83.0, 83.0]]);
const TRITON_A100: ([[f64; 2]; 2], [[f64; 2]; 2]) = from_combined([[100.0, 80.0], [95.0, 80.0]]);

const FA2_PAPER_FIG4: &str = "Dao 2023 (FlashAttention-2, arXiv 2307.08691) Figure 4, A100 80GB SXM4 forward + backward \
     (= flash-attn assets/flash2_a100_fwd_bwd_benchmark.png)";
const FA3_PAPER_FIG56: &str = "Shah et al. 2024 (FlashAttention-3, arXiv 2407.08608) Figures 5 (forward) and 6 (backward, non-causal), H100 80GB SXM5";

/// Every published kernel/architecture pair. Causal backward on H100 was not published: it
/// takes the forward's causal-to-non-causal ratio. Triton on H100 has no backward figure: it
/// takes FlashAttention-2's backward-to-forward ratio there.
pub const ATTENTION_RATES: &[AttentionRates] = &[
    AttentionRates {
        arch: GpuArch::Ampere,
        kernel: FlashKernel::V2,
        fwd_16k_tflops: FA2_A100.0,
        bwd_16k_tflops: FA2_A100.1,
        // FA3 paper Figure 5e vs 5c: FlashAttention-2 at hdim 256 runs 326 against 370 at 128.
        hdim256_over_128: 326.0 / 370.0,
        bwd_hdim256_over_128: 326.0 / 370.0,
        bwd_hdim_step_above_128: false,
        // 512 tokens at 0.75 of 16k (Figure 4a, hdim 64: 132 vs 176).
        fwd_overhead_blocks: 1.39,
        bwd_overhead_blocks: 1.39,
        source: FA2_PAPER_FIG4,
    },
    AttentionRates {
        arch: GpuArch::Ampere,
        kernel: FlashKernel::V1,
        fwd_16k_tflops: FA1_A100.0,
        bwd_16k_tflops: FA1_A100.1,
        hdim256_over_128: 1.0,
        bwd_hdim256_over_128: 1.0,
        bwd_hdim_step_above_128: false,
        // Figure 4a, FlashAttention: 91 vs 110.
        fwd_overhead_blocks: 0.87,
        bwd_overhead_blocks: 0.87,
        source: FA2_PAPER_FIG4,
    },
    AttentionRates {
        arch: GpuArch::Ampere,
        kernel: FlashKernel::Triton,
        fwd_16k_tflops: TRITON_A100.0,
        bwd_16k_tflops: TRITON_A100.1,
        hdim256_over_128: 1.0,
        bwd_hdim256_over_128: 1.0,
        bwd_hdim_step_above_128: false,
        // Figure 4a, FlashAttention Triton: 90 vs 100.
        fwd_overhead_blocks: 0.46,
        bwd_overhead_blocks: 0.46,
        source: FA2_PAPER_FIG4,
    },
    AttentionRates {
        arch: GpuArch::Hopper,
        kernel: FlashKernel::V3,
        fwd_16k_tflops: [[497.0, 473.0], [648.0, 616.0]],
        bwd_16k_tflops: [[474.0, 474.0 * 473.0 / 497.0], [561.0, 561.0 * 616.0 / 648.0]],
        hdim256_over_128: 756.0 / 648.0,
        bwd_hdim256_over_128: 756.0 / 648.0,
        bwd_hdim_step_above_128: false,
        // hdim 128, 512 vs 16k: forward 467 vs 648, backward 316 vs 561.
        fwd_overhead_blocks: 1.62,
        bwd_overhead_blocks: 3.28,
        source: FA3_PAPER_FIG56,
    },
    AttentionRates {
        arch: GpuArch::Hopper,
        kernel: FlashKernel::V2,
        fwd_16k_tflops: [[324.0, 299.0], [370.0, 335.0]],
        bwd_16k_tflops: [[291.0, 291.0 * 299.0 / 324.0], [322.0, 322.0 * 335.0 / 370.0]],
        hdim256_over_128: 326.0 / 370.0,
        bwd_hdim256_over_128: 326.0 / 370.0,
        bwd_hdim_step_above_128: false,
        // hdim 128: forward 309 vs 370, backward 214 vs 322.
        fwd_overhead_blocks: 0.82,
        bwd_overhead_blocks: 2.12,
        source: FA3_PAPER_FIG56,
    },
    AttentionRates {
        arch: GpuArch::Hopper,
        kernel: FlashKernel::Cudnn,
        fwd_16k_tflops: [[413.0, 388.0], [595.0, 539.0]],
        bwd_16k_tflops: [[433.0, 433.0 * 388.0 / 413.0], [516.0, 516.0 * 539.0 / 595.0]],
        hdim256_over_128: 581.0 / 595.0,
        // Backward at head dimension 256 (not in the paper's figures): cuDNN 9.19 through
        // PyTorch 2.11 on an H100 SXM, 4,096 tokens, non-causal 332 vs 486 TFLOP/s, causal
        // 320 vs 415 (traces/2026-11-26-cuda-h100/microbench.json `attention_hdim`): mean 0.73;
        // from 160 up already (160: 276, 192: 308, 224: 327 non-causal, run as 192 and 256).
        bwd_hdim256_over_128: 0.73,
        bwd_hdim_step_above_128: true,
        // hdim 128: forward 497 vs 595, backward 305 vs 516.
        fwd_overhead_blocks: 0.82,
        bwd_overhead_blocks: 2.92,
        source: FA3_PAPER_FIG56,
    },
    AttentionRates {
        arch: GpuArch::Hopper,
        kernel: FlashKernel::Triton,
        fwd_16k_tflops: [[404.0, 363.0], [395.0, 378.0]],
        bwd_16k_tflops: [
            [404.0 * 291.0 / 324.0, 363.0 * 291.0 / 324.0],
            [395.0 * 322.0 / 370.0, 378.0 * 322.0 / 370.0],
        ],
        hdim256_over_128: 1.0,
        bwd_hdim256_over_128: 1.0,
        bwd_hdim_step_above_128: false,
        // Figure 5c, Triton: 323 vs 395; backward as FlashAttention-2's.
        fwd_overhead_blocks: 0.93,
        bwd_overhead_blocks: 2.12,
        source: FA3_PAPER_FIG56,
    },
];

/// The published rates for `kernel` (resolved) on `arch`. A pair nobody measured borrows
/// the nearest one, named in `cost::attention`'s notes: cuDNN on Ampere takes
/// FlashAttention-2's rates, FlashAttention-3 off Hopper (it does not run there) takes
/// FlashAttention-2's, and Volta/Turing (no FlashAttention-2 there) take the Ampere
/// FlashAttention (v1) fractions of peak. Blackwell has no published number in the catalog:
/// it takes Hopper's rates for the same kernel as fractions of Hopper's peak
/// ([`BLACKWELL_ATTENTION_SOURCE`]), which the cost model applies to the Blackwell device's own
/// peak. Unknown GPUs (and AMD's, which have no CDNA measurement here) take A100's.
pub fn attention_rates(arch: Option<GpuArch>, kernel: FlashKernel) -> (&'static AttentionRates, GpuArch) {
    let arch = arch.unwrap_or(GpuArch::Ampere);
    let find = |a: GpuArch, k: FlashKernel| ATTENTION_RATES.iter().find(|r| r.arch == a && r.kernel == k);
    let k = kernel.resolve(Some(arch));
    if k == FlashKernel::Flash1Triton {
        // No benchmark of this kernel was published; see FLASH1_TRITON_SOURCE.
        return (
            find(GpuArch::Ampere, FlashKernel::V1).expect("FlashAttention on A100 is in the catalog"),
            GpuArch::Ampere,
        );
    }
    let r = match arch {
        GpuArch::Hopper => find(arch, k),
        // Assumed: Hopper's fractions of peak (see BLACKWELL_ATTENTION_SOURCE).
        GpuArch::Blackwell => find(GpuArch::Hopper, k),
        GpuArch::Ampere => find(arch, k).or_else(|| find(arch, FlashKernel::V2)),
        GpuArch::Volta | GpuArch::Turing => find(GpuArch::Ampere, k).or_else(|| find(GpuArch::Ampere, FlashKernel::V1)),
    };
    let r = r.or_else(|| find(GpuArch::Ampere, FlashKernel::V2)).expect("FlashAttention-2 on A100 is in the catalog");
    (r, r.arch)
}

/// Why `flash1-triton` runs at FlashAttention (v1)'s published A100 rates, as fractions of
/// peak on every device: nobody published its own. Its author's docstring says its forward is
/// generally faster than the CUDA FlashAttention's, its backward slower, and forward plus
/// backward "slightly slower"; llm-foundry's TUTORIAL.md (June 2023) says `triton` was
/// "slightly faster than `flash`" (flash-attn 1.0.x) in MosaicML's experience. The rates the
/// FlashAttention-2 paper gives for "Triton" are OpenAI's kernel (`triton`), not this one.
pub const FLASH1_TRITON_SOURCE: &str = "no published benchmark: FlashAttention (v1)'s rates (Dao 2023, Figure 4, A100), \
     after flash-attn's flash_attn_triton.py docstring (forward + backward slightly slower than the CUDA FlashAttention) \
     and llm-foundry TUTORIAL.md (triton slightly faster than flash 1.0.x in MosaicML's experience)";

/// Where Blackwell's fused-attention rates come from: no published B200/GB200 microbenchmark
/// is in the catalog, so they are an assumption.
pub const BLACKWELL_ATTENTION_SOURCE: &str = "assumed: Hopper's fractions of peak (cuDNN, and FlashAttention-2 / Triton \
     when named; Shah et al. 2024 Figures 5-6 on H100) applied to the Blackwell device's peak; no published B200 \
     number used";

/// Peak dense 16-bit tensor rate (TFLOP/s) of the devices the attention rates were measured
/// on: A100 SXM 312, H100 SXM 989 (datasheets). A rate becomes a fraction of this peak and
/// is applied to the simulated device's own peak. Blackwell's rates are Hopper's
/// ([`attention_rates`] reports Hopper as the measured architecture), so its entry is
/// Hopper's peak too.
pub fn measured_peak_tflops(arch: GpuArch) -> f64 {
    match arch {
        GpuArch::Hopper | GpuArch::Blackwell => 989.4,
        _ => 312.0,
    }
}

/// The GEMM tiling cuBLAS uses on an architecture: the output tiles its heuristics choose
/// between (the best-utilised one is modelled as picked) and the K loop (K per main-loop
/// step, and the pipeline stages its prologue fills before the first MMA).
#[derive(Clone, Copy, Debug)]
pub struct GemmTiling {
    pub tiles: &'static [(f64, f64)],
    pub k_step: f64,
    pub prologue_steps: f64,
    /// Fixed seconds per GEMM kernel beyond its launch and its K loop (what a kernel's first
    /// loads and last stores cost when they do not overlap the main loop), read off a measured
    /// per-shape table where one is in the catalog; 0 where none is.
    pub fixed_s: f64,
    pub source: &'static str,
}

/// Blackwell's fixed cost per GEMM kernel: OpenXLA's measured sm_100 table
/// (experiments/validation/kernels/gemm_xla_sm100.json, 375 shapes, bf16 and fp8) runs every
/// shape a near-constant time longer than Hopper's tiling and a 3 us launch explain: the
/// median gap is 1.6 us in bf16 and 2.3 us in fp8 (quartiles 0.9-2.2 and 1.7-2.7 us), read at
/// the model without it. 2 us, their middle, is charged per kernel. On sm_90 the same gap is
/// -0.6 us (median over OpenXLA's table): Hopper's and Ampere's kernels take none.
pub const BLACKWELL_GEMM_FIXED_S: f64 = 2e-6;

/// cuBLAS kernel names carry their tiling: Ampere's `ampere_bf16_s16816gemm_bf16_256x128_ldg8_
/// f2f_stages_32x3_tn` and `..._128x128_..._stages_32x3` (256x128 or 128x128 tiles, K step 32, three
/// stages: two fill the pipeline); Hopper's `sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_
/// tilesize128x256x64_warpgroupsize2x1x1_..._stage4` and `tilesize128x128x64` (K step 64, four
/// stages of TMA loads, three ahead of the first WGMMA) — as Nsight Systems traces of PyTorch
/// training show them. Volta/Turing and unknown GPUs keep the generic 128x128, K 32, two-step
/// prologue. Blackwell (sm100) borrows Hopper's tiling: an assumption, no traced sm100 kernel
/// name is in the catalog (its 2-SM tcgen05 kernels use larger tiles, which would only make
/// tile quantisation coarser than modelled).
pub fn gemm_tiling(arch: Option<GpuArch>) -> GemmTiling {
    match arch {
        Some(GpuArch::Blackwell) => GemmTiling {
            fixed_s: BLACKWELL_GEMM_FIXED_S,
            source: "assumed: cuBLAS sm90 tiling (128x256x64 / 128x128x64, stage4), no sm100 kernel names used; \
                     2 us per kernel read off OpenXLA's measured sm_100 GEMM table",
            ..gemm_tiling(Some(GpuArch::Hopper))
        },
        Some(GpuArch::Ampere) => GemmTiling {
            tiles: &[(256.0, 128.0), (128.0, 256.0), (128.0, 128.0)],
            k_step: 32.0,
            prologue_steps: 2.0,
            fixed_s: 0.0,
            source: "cuBLAS sm80 kernel names (256x128 / 128x128, stages_32x3)",
        },
        Some(GpuArch::Hopper) => GemmTiling {
            tiles: &[(128.0, 256.0), (256.0, 128.0), (128.0, 128.0)],
            k_step: 64.0,
            prologue_steps: 3.0,
            fixed_s: 0.0,
            source: "cuBLAS sm90 kernel names (tilesize128x256x64 / 128x128x64, stage4)",
        },
        _ => GemmTiling {
            tiles: &[(128.0, 128.0)],
            k_step: 32.0,
            prologue_steps: 2.0,
            fixed_s: 0.0,
            source: "generic 128x128 tile, K step 32",
        },
    }
}

/// Which compute kernels of an architecture are persistent: launched with one block per SM
/// (or per cluster slot), each looping over output tiles until the kernel ends. The block
/// scheduler never preempts a running block, so a communication kernel issued while one runs
/// finds no free SM and starts only when it ends (NCCL's blocks do not share an SM with
/// compute: they take all its registers, NVIDIA/nccl#689).
///
/// Measured (trainsim's `experiments/executor/gpu/interference.py --delays` on one H200 and one
/// H100 SXM with PyTorch 2.11 / CUDA 13.0, `traces/2026-11-27-cuda-h200/delays.json` and
/// `traces/2026-11-27-cuda-h100/delays.json`): cuBLAS's sm90 GEMMs (`nvjet_sm90_tst_*`) launch
/// a grid of 2x66 = 132 blocks of 384 threads, 168 registers each, and cuDNN's sm90 flash
/// forward and backward a grid of 132; a 16-block copy issued at a random moment beside
/// back-to-back 1.5-2.8 ms calls of them ended a median 1.0-2.2 ms later than alone (about half
/// a call: it waited for the running one), beside LayerNorm's and an add's 16k-131k one-shot
/// blocks no wait beyond sharing the memory. FlashAttention-3 on Hopper schedules its
/// tiles persistently too (flash-attention `hopper/tile_scheduler.hpp`, static and dynamic
/// persistent schedulers). NVIDIA/nccl#1431 reports the same from the other side: a send
/// launched after a long GEMM waits for it. Ampere's cuBLAS kernels (`ampere_*_s16816gemm_*`)
/// and FlashAttention-2 launch one block per output tile and free SMs as tiles finish: not
/// persistent here (no A100 was measured). Blackwell's cuBLAS schedules tiles through cluster
/// launch control, unmeasured: not persistent here. Checked against the files by
/// `hopper_gemm_and_cudnn_attention_kernels_are_persistent` (tests/gpu_microbench.rs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Persistent {
    pub gemm: bool,
    /// The architecture's cuDNN and FlashAttention-3 kernels are persistent.
    attention: bool,
    arch: Option<GpuArch>,
}

impl Persistent {
    /// Whether a fused-attention kernel of this family is persistent here.
    pub fn attention(self, kernel: FlashKernel) -> bool {
        self.attention && matches!(kernel.resolve(self.arch), FlashKernel::Cudnn | FlashKernel::V3)
    }
}

pub fn persistent_kernels(arch: Option<GpuArch>) -> Persistent {
    let hopper = arch == Some(GpuArch::Hopper);
    Persistent { gemm: hopper, attention: hopper, arch }
}

/// Threads an SM keeps resident at most (CUDA C Programming Guide, "Technical Specifications
/// per Compute Capability": 2,048 on compute capabilities 7.0, 8.0, 9.0 and 10.0, the parts
/// NCCL runs on here).
pub const RESIDENT_THREADS_PER_SM: f64 = 2048.0;

/// Bytes/s that communication kernels keeping `threads` resident on a GPU of `sms` SMs move
/// through its memory beside a memory-bound kernel, when alone they would move `demand`: their
/// share of the bytes kept in flight, of the GPU's streaming bandwidth `stream`, or `demand`
/// if less. At one memory latency each kernel's bandwidth follows the requests it keeps in
/// flight (Little's law). The communication kernels' threads keep theirs; the memory-bound
/// kernel fills every thread slot they leave, each with `kernel_efficiency` of a streaming
/// thread's bytes in flight (its family's measured rate over a copy's,
/// [`memory_kernel_efficiency`]: LayerNorm's reductions leave fewer loads outstanding than an
/// add's). The share is at most half.
///
/// Measured on both Hopper cards (`traces/2026-11-27-cuda-h200/interference.json` and the
/// H100's, session 32, checked by `memory_bound_kernels_beside_streaming_side_kernels` in
/// tests/gpu_microbench.rs): a copy of 8-32 blocks of 512 threads issued as ~1 ms kernels ran
/// 3.2-5.3x slower beside an add and 1.7-2.4x beside LayerNorm, where this share says 4.3-7.0x
/// and 2.4-3.8x (1.30-1.57x the measured: pessimistic for the copy on every point); the kernels
/// beside it took 1.01-1.32x as long, losing the share's bytes charges them 1.01-1.13x (4-5%
/// mean error).
pub fn memory_share_beside_kernel(threads: f64, sms: f64, stream: f64, demand: f64, kernel_efficiency: f64) -> f64 {
    let slots = sms * RESIDENT_THREADS_PER_SM;
    if slots <= 0.0 {
        return demand;
    }
    let threads = threads.min(slots);
    let kernel = kernel_efficiency.max(0.0) * (slots - threads);
    let share = if threads > 0.0 { (threads / (threads + kernel)).min(0.5) } else { 0.0 };
    demand.min(share * stream)
}

/// The most slices cuBLAS's split-K GEMMs cut K into, and the least K each slice keeps,
/// in the model. cuBLAS names these kernels `..._splitK_...` (with a separate
/// `splitKreduce_kernel`) and picks the split by heuristic; modelled: the split that takes
/// least time, partial sums in fp32. Assumed bounds (not read from cuBLAS): 16 slices, 256
/// of K each (8 main-loop steps on Ampere, 4 on Hopper). Checked against measured per-shape
/// throughput on sm_90 (experiments/validation/kernels/gemm_xla_sm90.json).
pub const MAX_SPLIT_K: u32 = 16;
pub const MIN_SPLIT_K: f64 = 256.0;

/// Bytes per element that Transformer Engine's fp8 casts move around a GEMM: its fused
/// cast-transpose reads the 16-bit tensor once and writes the fp8 copy and its transpose
/// (2 + 1 + 1 bytes), for the input and the weight in forward and the output gradient in
/// backward (Transformer Engine docs, "FP8 primer": the `cast_transpose` kernels, and
/// delayed scaling's amax bookkeeping, negligible next to them).
pub const FP8_CAST_TRANSPOSE_BYTES_PER_ELEM: f64 = 4.0;

/// Bytes per element of one of torchao's dynamic tensor-wise casts of a 16-bit tensor to fp8
/// (`hp_tensor_to_float8_dynamic`): an abs-max pass that reads it (2) and a scaled cast that
/// reads it again and writes the fp8 copy (2 + 1), two kernels however torch.compile fuses
/// them, since the cast needs the whole tensor's maximum first (`torchao/float8/
/// float8_scaling_utils.py`, `tensor_to_scale` then `hp_tensor_and_scale_to_float8`).
/// trainsim's eager H200 run of the same three steps (abs-max, scale, cast) moved about 15
/// bytes per element (traces/2026-11-26-cuda-h200/README.md); compiled, they fuse to these 5.
pub const FP8_DYNAMIC_CAST_BYTES_PER_ELEM: f64 = 5.0;

/// Achieved bandwidth of each memory-bound kernel family (`cost::memory_kernel`) on an NVIDIA
/// GPU, as a fraction of the device's streaming (copy) bandwidth, `mem_efficiency` x peak.
///
/// Source: trainsim's own kernel microbenchmark, `experiments/executor/gpu/microbench.py`,
/// through PyTorch 2.11 (CUDA 13.0) on one H200 on 2026-11-26, bf16, 512 MiB tensors
/// (`traces/2026-11-26-cuda-h200/microbench.json`, `memory`). A copy moved 4.18 TB/s (0.87 of
/// the 4.8 TB/s peak, about the presets' 0.85 streaming efficiency); each family's rate over
/// that copy's:
/// - `ln1`, LayerNorm: 1.70, 2.71, 2.43 TB/s at widths 1,024, 4,096, 8,192: 0.40, 0.65, 0.58,
///   mean 0.54;
/// - `softmax` (also the scale and mask passes): 2.69 and 1.29 TB/s over rows of 1,024 and
///   4,096: 0.64, 0.31, mean 0.48;
/// - `act`, GeLU: 3.13 TB/s (erf) and 3.67 (tanh): mean 0.81;
/// - `attn_dropout` and `dropout_residual`, dropout with its mask: 3.05 TB/s, 0.73;
/// - `optimizer`, fused AdamW (`fused=True`, one multi-tensor kernel) over 28 bytes a
///   parameter: 3.56 TB/s, 0.85 (0.84 in the two runs before); `optimizer_foreach`, PyTorch's default foreach AdamW (a
///   multi-tensor kernel per elementwise step): 1.28 TB/s over the same 28 bytes, 0.31;
/// - anything else (embedding lookups, copies, casts, the loss): 1.
///
/// Five runs the same day gave the same fractions within 0.04 (the first timed one call per
/// event pair; the file is the fifth). One GPU, one library version: other NVIDIA
/// generations are assumed to keep the same fractions of their own copy bandwidth (they run
/// the same kernels).
/// `trainsim calibrate` replaces them with the machine's own measured rates. Checked against
/// the file by `memory_kernel_fractions_are_the_measured_ones` (tests/gpu_microbench.rs).
pub fn memory_kernel_efficiency(arch: Option<GpuArch>, family: &str) -> f64 {
    if arch.is_none() {
        return 1.0;
    }
    match family {
        "ln1" => 0.54,
        "softmax" => 0.48,
        "act" => 0.81,
        "attn_dropout" | "dropout_residual" => 0.73,
        "optimizer" => 0.84,
        "optimizer_foreach" => 0.31,
        _ => 1.0,
    }
}
