//! A transformer layer under sequence parallelism with ring self-attention (Li, Xue,
//! Baranwal, Li, You 2021; SEEDS.md 4.2): each of the N devices holds L/N tokens of every
//! sequence and the whole weights. Attention needs every key and value: their chunks go
//! around the ring (N-1 steps, an all-gather) for the scores and again for the weighted sum;
//! in backward the chunks circulate once more and the key/value gradients come back the
//! other way (a reduce-scatter), about twice the forward traffic. Weight gradients are
//! summed over the ring like data-parallel ones (the lowering widens the gradient sync).
//!
//! ```text
//! forward:  ln1 qkv [all-gather K] scores softmax dropout [all-gather V] attn_v out ... mlp
//! backward: ... out' [all-gather V] attn_v' [reduce-scatter dV] ... [all-gather K] scores' [reduce-scatter dK] qkv' ln1'
//! ```

use super::transformer::{Mlp, TransformerConfig};
use super::{Axis, Comm, LayerOp, LayerShape, OpClass, OpSpec, Saved};

fn op(name: &'static str, class: OpClass, flops: f64, bytes: f64, saved: Saved) -> LayerOp {
    LayerOp::Compute(OpSpec {
        name,
        class,
        forward_flops: flops,
        forward_bytes: bytes,
        backward_flops: 2.0 * flops,
        backward_bytes: if flops > 0.0 { 2.0 * bytes } else { 1.5 * bytes },
        saved,
    })
}

fn gemm(name: &'static str, batch: f64, m: f64, n: f64, k: f64, e: f64, saved: Saved) -> LayerOp {
    op(name, OpClass::Gemm { batch, m, n, k }, 2.0 * batch * m * n * k, batch * e * (m * k + k * n + m * n), saved)
}

fn ring(name: &'static str, bytes: f64, forward: Option<Comm>, backward: Option<Comm>) -> LayerOp {
    LayerOp::Comm { name, bytes, axis: Axis::Tensor, forward, backward, root: 0, forward_bytes: None }
}

pub fn layer_ops(cfg: &TransformerConfig, shape: LayerShape) -> Vec<LayerOp> {
    let n = shape.tp as f64;
    let b = shape.micro_batch as f64;
    let s = shape.seq_len as f64;
    let h = cfg.hidden as f64;
    let f = cfg.ffn_hidden as f64;
    let a = cfg.heads as f64;
    let e = shape.activation_bytes;
    let kv = cfg.kv_width();
    let d = cfg.head_dim();
    let local = b * s / n;
    let lh = local * h;
    // Every device's queries against all keys.
    let scores = b * a * (s / n) * s;
    let kept = |bytes| Saved { sharded_bytes: bytes, ..Saved::default() };
    // All keys (or values) of the sequence: what circulates.
    let kv_bytes = b * s * kv * e;
    let mut ops = vec![
        op("ln1", OpClass::Memory, 0.0, 2.0 * lh * e, kept(e * lh)),
        gemm("qkv", 1.0, local, h + 2.0 * kv, h, e, kept(e * lh)),
        ring("dk_reducescatter", kv_bytes, None, Some(Comm::ReduceScatter)),
        ring("k_ring", kv_bytes, Some(Comm::AllGather), None),
        gemm("scores", b * a, s / n, s, d, e, kept(e * (lh + local * kv))),
        ring("k_ring_bwd", kv_bytes, None, Some(Comm::AllGather)),
        op(
            "softmax",
            OpClass::Memory,
            0.0,
            2.0 * scores * e,
            Saved { selective_bytes: e * scores, ..Saved::default() },
        ),
    ];
    if cfg.dropout {
        ops.push(op(
            "attn_dropout",
            OpClass::Memory,
            0.0,
            (2.0 * e + 1.0) * scores,
            Saved { selective_bytes: scores, ..Saved::default() },
        ));
    }
    ops.extend([
        ring("dv_reducescatter", kv_bytes, None, Some(Comm::ReduceScatter)),
        ring("v_ring", kv_bytes, Some(Comm::AllGather), None),
        gemm(
            "attn_v",
            b * a,
            s / n,
            d,
            s,
            e,
            Saved { sharded_bytes: e * local * kv, selective_bytes: e * scores, ..Saved::default() },
        ),
        ring("v_ring_bwd", kv_bytes, None, Some(Comm::AllGather)),
        gemm("out_proj", 1.0, local, h, h, e, kept(e * lh)),
    ]);
    let drop = if cfg.dropout { lh } else { 0.0 };
    let residual = |name| op(name, OpClass::Memory, 0.0, 3.0 * lh * e + drop, kept(drop));
    let up = match cfg.mlp {
        Mlp::Gelu => 1.0,
        Mlp::SwiGlu => 2.0,
    };
    ops.extend([
        residual("dropout_residual"),
        op("ln2", OpClass::Memory, 0.0, 2.0 * lh * e, kept(e * lh)),
        gemm("fc1", 1.0, local, up * f, h, e, kept(e * lh)),
        op("act", OpClass::Memory, 0.0, (up + 1.0) * e * local * f, kept(up * e * local * f)),
        gemm("fc2", 1.0, local, h, f, e, kept(e * local * f)),
        residual("dropout_residual"),
    ]);
    ops
}
