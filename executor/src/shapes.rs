//! Shapes of the work a device runs: whole counts from a Program's f64 shapes, and GEMMs
//! shrunk to fit a buffer cap with the factor their time is scaled by. Shared by the
//! backends.

use crate::{ExecError, Result};

/// A GEMM shrunk to fit the buffer cap, and the factor its time is scaled by.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct GemmFit {
    pub batch: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// FLOPs of the requested GEMM over those of the one run.
    pub scale: f64,
}

/// Shrinks a GEMM until each operand (all of the batch) fits in `cap` elements: first halves the
/// larger side of any single matrix too big, then runs fewer of the batch. Time is linear in each
/// dimension and in the batch, so the run's time times `scale` estimates the whole. (The CPU
/// backend's rule, so both shrink alike.) A cap under 2^31 elements also keeps every dimension,
/// leading dimension and batch count within cuBLAS's 32-bit arguments.
pub(crate) fn fit_gemm(batch: usize, m: usize, n: usize, k: usize, cap: usize) -> GemmFit {
    let cap = cap.max(1);
    let (mut m2, mut n2, mut k2) = (m, n, k);
    loop {
        if m2.saturating_mul(k2) > cap {
            if m2 >= k2 { m2 = m2.div_ceil(2) } else { k2 = k2.div_ceil(2) }
        } else if k2.saturating_mul(n2) > cap {
            if k2 >= n2 { k2 = k2.div_ceil(2) } else { n2 = n2.div_ceil(2) }
        } else if m2.saturating_mul(n2) > cap {
            if m2 >= n2 { m2 = m2.div_ceil(2) } else { n2 = n2.div_ceil(2) }
        } else {
            break;
        }
    }
    let per_product = (m2 * k2).max(k2 * n2).max(m2 * n2);
    let b2 = batch.min((cap / per_product).max(1));
    let flops = |b: usize, m: usize, n: usize, k: usize| b as f64 * m as f64 * n as f64 * k as f64;
    GemmFit { batch: b2, m: m2, n: n2, k: k2, scale: flops(batch, m, n, k) / flops(b2, m2, n2, k2) }
}

/// A non-negative whole count from a Program's f64 shape.
pub(crate) fn count(op: &str, what: &str, x: f64) -> Result<usize> {
    if !(x.is_finite() && x >= 0.0) {
        return Err(ExecError(format!("op {op}: {what} = {x} is not a non-negative number")));
    }
    Ok(x.round() as usize)
}
