//! A transformer layer under 2D (SUMMA), 2.5D and 3D tensor parallelism (Colossal-AI's
//! modes; SEEDS.md 4.1), as ops and the collectives along the device grid's axes.
//!
//! Every linear layer Y = X A becomes:
//!
//! ```text
//! 2D, q x q (2.5D: the same in each of d depth slices, batch rows split d*q ways):
//!   forward   for t in 0..q: broadcast X[i,t] along row i, A[t,j] along column j; local GEMM
//!   backward  dX = dY A^T: for t: broadcast A[t,j] along column j, reduce dX[i,t] along row i
//!             dA = X^T dY: for t: broadcast X[i,t] along row i, reduce dA[t,j] along column j
//!             (2.5D: dA then all-reduced across the depth slices, which share weights)
//! 3D, q x q x q:
//!   forward   all-gather X over j, all-gather A over i, local GEMM, reduce-scatter Y over l
//!   backward  all-gather dY over l, local GEMMs, reduce-scatter dA over i and dX over j
//! ```
//!
//! The local GEMMs of a linear are one op (SUMMA's q steps as a batch of q). Activations and
//! the non-GEMM ops are split over all the group's devices; weights over q^2 (2D, 2.5D) or q^3.

use super::ops::{gemm_op, mem_op};
use super::transformer::TransformerConfig;
use super::{Axis, Comm, LayerOp, LayerShape, OpClass, OpSpec, Saved, TpMode};

fn gemm(name: &'static str, batch: f64, m: f64, n: f64, k: f64, e: f64, saved: f64) -> LayerOp {
    LayerOp::Compute(gemm_op(name, batch, m, n, k, e, Saved { sharded_bytes: saved, ..Saved::default() }))
}

fn mem(name: &'static str, bytes: f64, saved: Saved) -> LayerOp {
    LayerOp::Compute(mem_op(name, bytes, saved))
}

fn comm(
    name: &'static str,
    bytes: f64,
    axis: Axis,
    forward: Option<Comm>,
    backward: Option<Comm>,
    root: u32,
) -> LayerOp {
    LayerOp::Comm { name, bytes, axis, forward, backward, root, forward_bytes: None }
}

/// The ops of a linear layer of `tokens` rows, `h_in` -> `h_out`, whose input it keeps.
fn linear(ops: &mut Vec<LayerOp>, mode: TpMode, name: &'static str, tokens: f64, h_in: f64, h_out: f64, e: f64) {
    match mode {
        TpMode::OneD | TpMode::Ring => unreachable!("built in transformer.rs and ring.rs"),
        TpMode::TwoD { q } | TpMode::TwoPointFiveD { q, .. } => {
            let d = if let TpMode::TwoPointFiveD { d, .. } = mode { d } else { 1 };
            let qf = q as f64;
            let rows = tokens / (d as f64 * qf);
            let x = rows * h_in / qf * e;
            let a = h_in / qf * h_out / qf * e;
            // Listed so that forward runs top-down and backward bottom-up.
            for t in 0..q {
                ops.push(comm("dx_reduce", x, Axis::Dim2, None, Some(Comm::Reduce), t));
            }
            for t in 0..q {
                ops.push(comm("da_reduce", a, Axis::Dim1, None, Some(Comm::Reduce), t));
            }
            if d > 1 {
                ops.push(comm("da_depth_allreduce", a, Axis::Dim0, None, Some(Comm::AllReduce), 0));
            }
            for t in 0..q {
                ops.push(comm("x_bcast", x, Axis::Dim2, Some(Comm::Broadcast), None, t));
                ops.push(comm("a_bcast", a, Axis::Dim1, Some(Comm::Broadcast), None, t));
            }
            ops.push(gemm(name, qf, rows, h_out / qf, h_in / qf, e, x));
            for t in 0..q {
                ops.push(comm("a_bcast_bwd", a, Axis::Dim1, None, Some(Comm::Broadcast), t));
                ops.push(comm("x_bcast_bwd", x, Axis::Dim2, None, Some(Comm::Broadcast), t));
            }
        }
        TpMode::ThreeD { q } => {
            let qf = q as f64;
            // X[i,j,l]: tokens/q^2 x h_in/q, gathered over j to tokens/q x h_in/q.
            let x_gathered = tokens / qf * h_in / qf * e;
            let a_gathered = h_in / qf * h_out / qf * e;
            let y_partial = tokens / qf * h_out / qf * e;
            ops.push(comm("x_allgather", x_gathered, Axis::Dim1, Some(Comm::AllGather), Some(Comm::ReduceScatter), 0));
            ops.push(comm("a_allgather", a_gathered, Axis::Dim0, Some(Comm::AllGather), Some(Comm::ReduceScatter), 0));
            ops.push(gemm(name, 1.0, tokens / qf, h_out / qf, h_in / qf, e, x_gathered / qf));
            ops.push(comm(
                "y_reducescatter",
                y_partial,
                Axis::Dim2,
                Some(Comm::ReduceScatter),
                Some(Comm::AllGather),
                0,
            ));
        }
    }
}

/// The ops of one layer under a grid mode.
pub fn layer_ops(cfg: &TransformerConfig, shape: LayerShape) -> Vec<LayerOp> {
    let b = shape.micro_batch as f64;
    let s = shape.seq_len as f64;
    let h = cfg.hidden as f64;
    let a = cfg.heads as f64;
    let f = cfg.ffn_hidden as f64;
    let e = shape.activation_bytes;
    let p = shape.tp as f64;
    let kv = cfg.kv_width();
    let d = cfg.head_dim();
    let tokens = b * s;
    let sbh = tokens * h;
    let mode = shape.tp_mode;
    let mut ops = Vec::with_capacity(64);
    let norm = |name| mem(name, 2.0 * sbh * e / p, Saved { sharded_bytes: e * sbh / p, ..Saved::default() });
    ops.push(norm("ln1"));
    linear(&mut ops, mode, "qkv", tokens, h, h + 2.0 * kv, e);
    // Core attention on the device's share of (batch x heads): local, no communication.
    let heads = b * a / p;
    let scores = b * a * s * s / p;
    ops.push(LayerOp::Compute(OpSpec {
        name: "scores",
        class: OpClass::Gemm { batch: heads, m: s, n: s, k: d },
        forward_flops: 2.0 * heads * s * s * d,
        forward_bytes: heads * e * (2.0 * s * d + s * s),
        backward_flops: 4.0 * heads * s * s * d,
        backward_bytes: 2.0 * heads * e * (2.0 * s * d + s * s),
        saved: Saved { sharded_bytes: e * (sbh + tokens * kv) / p, ..Saved::default() },
    }));
    ops.push(mem("softmax", 2.0 * scores * e, Saved { selective_bytes: e * scores, ..Saved::default() }));
    if cfg.dropout {
        ops.push(mem("attn_dropout", (2.0 * e + 1.0) * scores, Saved { selective_bytes: scores, ..Saved::default() }));
    }
    ops.push(LayerOp::Compute(OpSpec {
        name: "attn_v",
        class: OpClass::Gemm { batch: heads, m: s, n: d, k: s },
        forward_flops: 2.0 * heads * s * s * d,
        forward_bytes: heads * e * (2.0 * s * d + s * s),
        backward_flops: 4.0 * heads * s * s * d,
        backward_bytes: 2.0 * heads * e * (2.0 * s * d + s * s),
        saved: Saved { sharded_bytes: e * tokens * kv / p, selective_bytes: e * scores, ..Saved::default() },
    }));
    linear(&mut ops, mode, "out_proj", tokens, h, h, e);
    let residual = |name| {
        let drop = if cfg.dropout { sbh / p } else { 0.0 };
        mem(name, 3.0 * sbh / p * e + drop, Saved { sharded_bytes: drop, ..Saved::default() })
    };
    ops.push(residual("dropout_residual"));
    ops.push(norm("ln2"));
    let up = match cfg.mlp {
        super::transformer::Mlp::Gelu => 1.0,
        super::transformer::Mlp::SwiGlu => 2.0,
    };
    linear(&mut ops, mode, "fc1", tokens, h, up * f, e);
    ops.push(mem(
        "act",
        (up + 1.0) * e * tokens * f / p,
        Saved { sharded_bytes: up * e * tokens * f / p, ..Saved::default() },
    ));
    linear(&mut ops, mode, "fc2", tokens, f, h, e);
    ops.push(residual("dropout_residual"));
    ops
}

/// Bytes one device sends for a collective of `bytes` over `members` devices (ring
/// all-reduce 2(p-1)/p n; all-gather, reduce-scatter, chained broadcast and reduce (p-1)/p n
/// on average; all-to-all (p-1)/p n, its blocks for the others), for checking volumes against
/// the published cost table.
pub fn bytes_sent_per_device(kind: Comm, bytes: f64, members: u32) -> f64 {
    let p = members as f64;
    match kind {
        Comm::AllReduce => 2.0 * (p - 1.0) / p * bytes,
        Comm::ReduceScatter | Comm::AllGather | Comm::Broadcast | Comm::Reduce | Comm::AllToAll => {
            (p - 1.0) / p * bytes
        }
    }
}
