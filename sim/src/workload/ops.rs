//! Constructors of a layer's ops: a GEMM and a memory-bound kernel, and what a transformer
//! MLP's activation moves and keeps.

use super::transformer::Mlp;
use super::{OpClass, OpSpec, Saved};

/// A GEMM of `batch` products `m x k` by `k x n` at `e` bytes an element, keeping `saved`.
pub fn gemm_op(name: &'static str, batch: f64, m: f64, n: f64, k: f64, e: f64, saved: Saved) -> OpSpec {
    let flops = 2.0 * batch * m * n * k;
    let bytes = batch * e * (m * k + k * n + m * n);
    OpSpec {
        name,
        class: OpClass::Gemm { batch, m, n, k },
        forward_flops: flops,
        forward_bytes: bytes,
        // dX = dY W^T and dW = X^T dY.
        backward_flops: 2.0 * flops,
        backward_bytes: 2.0 * bytes,
        saved,
    }
}

/// Bytes the MLP's activation moves and keeps, per element of its output (`f` wide): GeLU
/// reads and writes once and keeps its input (2, 1); fused SwiGLU reads gate and up, writes
/// the product and keeps both (3, 2); eager SwiGLU runs SiLU (read, write) and then the
/// product (two reads, a write), and autograd keeps the gate, its SiLU and up (5, 3).
pub(super) fn act_bytes(mlp: Mlp, fused: bool) -> (f64, f64) {
    match (mlp, fused) {
        (Mlp::Gelu, _) => (2.0, 1.0),
        (Mlp::SwiGlu, true) => (3.0, 2.0),
        (Mlp::SwiGlu, false) => (5.0, 3.0),
    }
}

pub(super) fn mem_op(name: &'static str, bytes: f64, saved: Saved) -> OpSpec {
    OpSpec {
        name,
        class: OpClass::Memory,
        forward_flops: 0.0,
        forward_bytes: bytes,
        backward_flops: 0.0,
        backward_bytes: 1.5 * bytes,
        saved,
    }
}
