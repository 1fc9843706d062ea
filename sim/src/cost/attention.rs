//! Fused attention's time per shape, from the published kernel rates in the hardware
//! catalog (`hardware::kernels::ATTENTION_RATES`).
//!
//! A FlashAttention-style kernel walks, for each block of 128 queries, the 128-key blocks
//! that block attends to, plus a fixed amount of work per query block (loading Q, the final
//! rescale and the write of O; in backward the dQ accumulation), `c` key blocks' worth. With
//! `nq` query blocks and `nk` key blocks:
//!
//! - without a mask every query block visits all `nk` key blocks: useful / done = nk / (nk + c);
//! - under a causal mask query block i visits the context's `cb` blocks and i + 1 of its own,
//!   the last (diagonal) one half masked: useful / done = (cb + nq/2) / (cb + (nq + 1)/2 + c).
//!
//! The rate at long sequences comes from the kernel's published rate at 16k tokens (that
//! rate divided by the ramp above at 16k); head dimensions run padded to the kernel's next
//! compiled one (`FlashKernel::padded_head_dim`), doing the padded work for the useful FLOPs
//! of the real one. Rates are fractions of the measured device's 16-bit peak, applied to
//! the simulated device's; attention stays in 16 bits under fp8 training (Transformer
//! Engine runs its fused attention in bf16 unless told otherwise).

use crate::hardware::kernels::{self, AttentionRates, FlashKernel, GpuArch};
use crate::workload::context_ring::RingPart;

const BLOCK: f64 = 128.0;
const REFERENCE_TOKENS: f64 = 16384.0;

/// useful / done work of one head's pass (see the module docs).
fn ramp(q: f64, context: f64, causal: bool, c: f64) -> f64 {
    let nq = q / BLOCK;
    let cb = context / BLOCK;
    if causal {
        (cb + nq / 2.0) / (cb + (nq + 1.0) / 2.0 + c)
    } else {
        let nk = cb + nq;
        nk / (nk + c)
    }
}

/// Published 16k rate at a (padded) head dimension: linear in the head dimension below 64
/// (the per-tile softmax work does not shrink with it), between 64 and 128, and from 128 to
/// 256 by the kernel's measured hdim-256 ratio, reached at 256 or, with `step`, at once above
/// 128.
fn rate_16k(table: &[[f64; 2]; 2], ratio256: f64, step: bool, dp: f64, causal: bool) -> f64 {
    let i = usize::from(causal);
    let (r64, r128) = (table[0][i], table[1][i]);
    if dp <= 64.0 {
        r64 * dp / 64.0
    } else if dp <= 128.0 {
        r64 + (r128 - r64) * (dp - 64.0) / 64.0
    } else if step {
        r128 * ratio256
    } else {
        r128 * (1.0 + (ratio256 - 1.0) * ((dp - 128.0) / 128.0).min(1.0))
    }
}

/// Fraction of the device's 16-bit peak a fused attention pass reaches.
pub fn efficiency(
    arch: Option<GpuArch>,
    kernel: FlashKernel,
    q: f64,
    context: f64,
    head_dim: f64,
    causal: bool,
    backward: bool,
) -> f64 {
    let (rates, measured_on): (&AttentionRates, GpuArch) = kernels::attention_rates(arch, kernel.resolve(arch));
    let dp = rates.kernel.padded_head_dim(head_dim).max(head_dim);
    let (table, c, ratio256, step) = if backward {
        (&rates.bwd_16k_tflops, rates.bwd_overhead_blocks, rates.bwd_hdim256_over_128, rates.bwd_hdim_step_above_128)
    } else {
        (&rates.fwd_16k_tflops, rates.fwd_overhead_blocks, rates.hdim256_over_128, false)
    };
    let at_16k = rate_16k(table, ratio256, step, dp, causal) / kernels::measured_peak_tflops(measured_on);
    let long = at_16k / ramp(REFERENCE_TOKENS, 0.0, causal, c);
    (long * ramp(q.max(1.0), context, causal, c) * head_dim / dp).clamp(1e-3, 1.0)
}

/// Fraction of the 16-bit peak of context parallelism's ring attention on one rank: `cp`
/// kernels over its `q` local queries (Transformer Engine's `AttnFuncWithCPAndKVP2P`,
/// PyTorch's `_templated_ring_attention`), or `part` of them (the first step alone, or the
/// others). With the causal load balancing both use, a rank holds sequence chunks i and
/// 2cp - 1 - i (of 2cp): its first step is causal over its own keys (1/cp of its work), and
/// each of the other cp - 1 steps does half a square without a mask, either all its queries
/// against the first half of the arriving keys or its second half of queries against all of
/// them, equally often. Without a mask every step is a full square. The steps' times add up,
/// so the fractions combine weighted by work (a harmonic mean).
pub fn ring_efficiency(
    arch: Option<GpuArch>,
    kernel: FlashKernel,
    q: f64,
    head_dim: f64,
    causal: bool,
    backward: bool,
    (cp, part): (u32, RingPart),
) -> f64 {
    let eff = |keys: f64, causal: bool| efficiency(arch, kernel, keys, 0.0, head_dim, causal, backward);
    let n = cp.max(1) as f64;
    if !causal {
        return eff(q, false);
    }
    // Each off-diagonal step's time per unit of work, half of the steps each way.
    let off = 0.5 / eff(q / 2.0, false) + 0.5 / eff(q, false);
    match part {
        RingPart::Local => eff(q, true),
        RingPart::Remote => 1.0 / off,
        RingPart::All => 1.0 / ((1.0 / eff(q, true) + (n - 1.0) * off) / n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tflops(arch: GpuArch, k: FlashKernel, s: f64, d: f64, causal: bool, bwd: bool) -> f64 {
        efficiency(Some(arch), k, s, 0.0, d, causal, bwd) * kernels::measured_peak_tflops(arch)
    }

    #[test]
    fn reproduces_the_anchor_points_and_grows_with_sequence_length() {
        let at = |s| tflops(GpuArch::Hopper, FlashKernel::V3, s, 128.0, false, false);
        assert!((at(16384.0) - 648.0).abs() < 1e-6);
        assert!((at(512.0) - 467.0).abs() < 3.0, "{}", at(512.0));
        assert!(at(1024.0) < at(4096.0));
    }

    #[test]
    fn a_causal_mask_costs_more_at_short_sequences_than_long_ones() {
        let r = |s| {
            tflops(GpuArch::Ampere, FlashKernel::V2, s, 64.0, true, false)
                / tflops(GpuArch::Ampere, FlashKernel::V2, s, 64.0, false, false)
        };
        assert!(r(512.0) < 0.75 && r(16384.0) > 0.95, "{} {}", r(512.0), r(16384.0));
    }

    #[test]
    fn an_odd_head_dimension_pays_for_the_padded_one() {
        // FlashAttention-2 has no hdim-80 kernel: 80 runs as 96.
        let e80 = efficiency(Some(GpuArch::Ampere), FlashKernel::V2, 4096.0, 0.0, 80.0, false, false);
        let e96 = efficiency(Some(GpuArch::Ampere), FlashKernel::V2, 4096.0, 0.0, 96.0, false, false);
        assert!((e80 / e96 - 80.0 / 96.0).abs() < 1e-9);
    }

    /// Context parallelism's ring: one rank's cp kernels over its share of a sequence run
    /// less efficiently as the chunks shrink (the per-query-block work is paid at every step,
    /// on shorter key ranges), below one kernel over the whole sequence on small chunks (on
    /// large ones the unmasked off-diagonal steps run at the unmasked kernel's rate, above the
    /// causal one's); one step is the plain kernel; without a mask every step is the rank's
    /// square.
    #[test]
    fn ring_steps_on_small_chunks_run_below_one_kernel_over_the_sequence() {
        let (arch, k, d) = (Some(GpuArch::Hopper), FlashKernel::V3, 128.0);
        let whole = efficiency(arch, k, 65536.0, 0.0, d, true, false);
        let ring = |cp: u32| ring_efficiency(arch, k, 65536.0 / cp as f64, d, true, false, (cp, RingPart::All));
        assert_eq!(ring(1), whole);
        assert!(
            ring(8) < ring(2) && ring(32) < ring(8) && ring(32) < whole,
            "{whole} {} {} {}",
            ring(2),
            ring(8),
            ring(32)
        );
        let plain = efficiency(arch, k, 2048.0, 0.0, d, false, true);
        assert_eq!(ring_efficiency(arch, k, 2048.0, d, false, true, (8, RingPart::All)), plain);
    }
}
