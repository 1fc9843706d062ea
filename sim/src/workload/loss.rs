//! The loss and a trainer's metrics over the logits: what their kernels read and write.

use super::{OpClass, OpSpec, Saved};

/// Bytes the loss moves per logit, as (forward, backward, kept for backward), at `e` bytes
/// per logit as the output layer writes them.
///
/// Fused (flash-attn's `xentropy`, Megatron-Core's `cross_entropy_loss_fusion`): forward reads
/// the logits twice (the row maximum, then the sum of exponentials), backward reads them once
/// and writes their gradient; the logits are what backward keeps.
///
/// Unfused (PyTorch's `F.cross_entropy`, under autocast or after `.float()`; pytorch/pytorch
/// `aten/src/ATen/native/cuda/SoftMax.cu` and `Loss.cu`): an fp32 copy of the logits (`e`
/// read, 4 written, none in fp32 training); `log_softmax` over a vocabulary row too long for
/// the shared-memory variant (`cunn_SoftMaxForward`: a max pass, a sum-of-exponentials pass and
/// the write pass, 3 reads and 1 write of 4 bytes); `nll_loss` reads one logit per row.
/// Backward: `nll_loss_backward` zero-fills an fp32 gradient (4) and scatters one value per
/// row; `log_softmax_backward` (`cunn_SoftMaxBackward`) sums the incoming gradient (4), then
/// reads it and the saved output and writes its gradient (12); the copy's backward reads 4
/// and writes `e`. Backward keeps `log_softmax`'s fp32 output. Megatron's unfused
/// `vocab_parallel_cross_entropy` (max, subtract, exp, sum in place on an fp32 copy, and a
/// softmax-minus-one-hot backward) makes about as many passes.
pub fn loss_bytes(fused: bool, e: f64) -> (f64, f64, f64) {
    if fused {
        return (2.0 * e, 2.0 * e, e);
    }
    let (cast_fwd, cast_bwd) = if e < 4.0 { (e + 4.0, 4.0 + e) } else { (0.0, 0.0) };
    (cast_fwd + 16.0, 4.0 + 16.0 + cast_bwd, 4.0)
}

/// Bytes a training metric moves per logit of `e` bytes: Composer's cross-entropy and
/// perplexity each run PyTorch's unfused cross-entropy forward over the logits (the forward
/// of [`loss_bytes`], unfused), token accuracy an argmax reading each logit once.
pub fn metric_bytes(m: crate::framework::TrainMetric, e: f64) -> f64 {
    use crate::framework::TrainMetric;
    match m {
        TrainMetric::CrossEntropy | TrainMetric::Perplexity => loss_bytes(false, e).0,
        TrainMetric::TokenAccuracy => e,
    }
}

/// The loss over `logits` logits per micro-batch (see [`loss_bytes`]).
pub(super) fn loss_op(fused: bool, logits: f64, e: f64) -> OpSpec {
    let (forward, backward, kept) = loss_bytes(fused, e);
    OpSpec {
        name: "loss",
        class: OpClass::Memory,
        forward_flops: 0.0,
        forward_bytes: forward * logits,
        backward_flops: 0.0,
        backward_bytes: backward * logits,
        saved: Saved { sharded_bytes: kept * logits, ..Saved::default() },
    }
}
