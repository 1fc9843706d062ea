//! The loss and a trainer's metrics over the logits: what their kernels read and write.

use super::{OpClass, OpSpec, Saved};

/// How a framework runs the loss when it is not one fused kernel
/// (`training.framework.unfused_loss`; see [`UNFUSED_LOSS_SOURCE`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum UnfusedLoss {
    /// Megatron's vocab-parallel cross-entropy: one fp32 copy of the logits, worked on in place
    /// and kept for backward, which writes its gradient into it.
    InPlace,
    /// PyTorch's `F.cross_entropy` after `.float()`: the fp32 copy, `log_softmax`'s fp32
    /// output (kept) and dense fp32 gradients backward.
    Fp32,
    /// PyTorch's `F.cross_entropy` on the 16-bit logits as the model returns them: its output
    /// and gradients in the same dtype.
    Native,
    /// `F.cross_entropy` after `.float()` on logits sharded over the vocabulary, under PyTorch's
    /// `loss_parallel` (DTensor; torchtitan's loss whenever tensor parallelism is on): its
    /// `log_softmax` is decomposed into separate max, shift, exp, sum and subtraction kernels,
    /// and its backward builds the gradient from a zero fill, an exp, a sum and a product, each
    /// a dense fp32 tensor.
    LossParallel,
}

impl UnfusedLoss {
    pub const NAMES: [&'static str; 4] = ["in_place", "fp32", "native", "loss_parallel"];

    pub fn parse(name: &str) -> Option<UnfusedLoss> {
        Some(match name {
            "in_place" => UnfusedLoss::InPlace,
            "fp32" => UnfusedLoss::Fp32,
            "native" => UnfusedLoss::Native,
            "loss_parallel" => UnfusedLoss::LossParallel,
            _ => return None,
        })
    }
}

/// Where `unfused_loss` comes from.
pub const UNFUSED_LOSS_SOURCE: &str = "in_place: megatron/core/tensor_parallel/cross_entropy.py (core_r0.9.0; megatron/mpu/cross_entropy.py in v2.5, which Megatron-DeepSpeed's GPT models run) _VocabParallelCrossEntropy: one fp32 copy of the logits (vocab_parallel_logits.float()), max subtraction, exp and division in place, that buffer saved for backward, and the backward's softmax-minus-one-hot written into it; fp32: F.cross_entropy(pred.float(), labels) as torchtitan's train.py loss_fn (9dec370) and Hugging Face's Llama (logits.float()) run it: the fp32 copy and log_softmax's saved fp32 output forward, nll_loss_backward's dense fp32 gradient and log_softmax_backward's fp32 output backward; native: torch.nn.CrossEntropyLoss on the model's 16-bit logits, as hpcaitech/ColossalAI-Benchmark zero/common/gpt2.py GPTLMLoss (a contiguous copy of the shifted logits first) and Colossal-AI's GPT examples run it; loss_parallel: torch/distributed/tensor/parallel/loss.py (read at pytorch/pytorch 02eef6b8; loss_parallel exists since PyTorch 2.3, and torchtitan's train.py at 9dec370 enters it whenever tp > 1, get_train_context) _log_softmax (x.to(fp32), amax, x - max, exp, sum, log, shifted - logsumexp: the shifted logits and their exp beside the fp32 copy) and _nll_loss_and_log_softmax_backward (zeros_like, exp, the sum and its product with the incoming gradient, all fp32)";

/// Bytes the loss moves per logit, as (forward, backward, kept for backward), at `e` bytes
/// per logit as the output layer writes them.
///
/// Fused (flash-attn's `xentropy`, Megatron-Core's `cross_entropy_loss_fusion`): forward reads
/// the logits twice (the row maximum, then the sum of exponentials), backward reads them once
/// and writes their gradient; the logits are what backward keeps.
///
/// Unfused after an fp32 copy (PyTorch's `F.cross_entropy` after `.float()`; pytorch/pytorch
/// `aten/src/ATen/native/cuda/SoftMax.cu` and `Loss.cu`): the copy (`e` read, 4 written, none
/// in fp32 training); `log_softmax` over a vocabulary row too long for the shared-memory
/// variant (`cunn_SoftMaxForward`: a max pass, a sum-of-exponentials pass and the write pass,
/// 3 reads and 1 write of 4 bytes); `nll_loss` reads one logit per row. Backward:
/// `nll_loss_backward` zero-fills an fp32 gradient (4) and scatters one value per row;
/// `log_softmax_backward` (`cunn_SoftMaxBackward`) sums the incoming gradient (4), then reads
/// it and the saved output and writes its gradient (12); the copy's backward reads 4 and
/// writes `e`. Backward keeps `log_softmax`'s fp32 output. Megatron's in-place loss (max,
/// subtract, exp, sum in place on its fp32 copy, and a softmax-minus-one-hot backward) makes
/// about as many passes. Native (on the 16-bit logits): the same passes at `e` bytes, no copy,
/// the 16-bit output kept. Under `loss_parallel` (DTensor's decomposition, every step its own
/// fp32 kernel): forward the copy, the max (4 read), the shift (4 + 4), the exp (4 + 4), the sum
/// (4) and the subtraction (4 + 4), 32 bytes beside the copy; backward the zero fill (4), the
/// exp (4 + 4), the sum (4 + 4 + 4) and the product (4 + 4), 32 beside the copy's backward;
/// `log_softmax`'s fp32 output kept.
pub fn loss_bytes(fused: bool, unfused: UnfusedLoss, e: f64) -> (f64, f64, f64) {
    if fused {
        return (2.0 * e, 2.0 * e, e);
    }
    if unfused == UnfusedLoss::Native {
        return (4.0 * e, 5.0 * e, e);
    }
    let (cast_fwd, cast_bwd) = if e < 4.0 { (e + 4.0, 4.0 + e) } else { (0.0, 0.0) };
    if unfused == UnfusedLoss::LossParallel {
        return (cast_fwd + 32.0, 32.0 + cast_bwd, 4.0);
    }
    (cast_fwd + 16.0, 4.0 + 16.0 + cast_bwd, 4.0)
}

/// Bytes the loss holds per logit beside what it keeps (the logits' 16-bit copy is not kept
/// by the output layer, whose backward reads its input), while its forward runs and while its
/// backward runs, at `e` bytes per logit as the output layer writes them.
///
/// Fused: nothing forward (the kernel keeps the logits themselves), the gradient it writes
/// backward (`e`). In place: the 16-bit logits beside the fp32 copy it keeps forward, the
/// 16-bit gradient beside it backward (`e`, `e`; nothing in fp32 training, where the copy is
/// the logits). After an fp32 copy: the 16-bit logits and their fp32 copy beside the kept fp32
/// `log_softmax` output (`e + 4`; 4 in fp32), and backward `nll_loss_backward`'s dense fp32
/// gradient and `log_softmax_backward`'s fp32 output beside it (8). Native: the logits beside
/// the kept output (`e`), the two gradients beside it backward (`2e`). `loss_parallel`: at
/// most the 16-bit logits, their fp32 copy, the shifted copy and its exp at once forward, or
/// the shifted copy beside the kept output (`e + 8` beside the kept 4; 8 in fp32 training,
/// where the logits are the copy), and backward the zero-filled gradient, the exp and their
/// sum, or the sum and the product, beside the kept output (12).
pub fn loss_transient_bytes(fused: bool, unfused: UnfusedLoss, e: f64) -> [f64; 2] {
    let copy = e < 4.0;
    match (fused, unfused) {
        (true, _) => [0.0, e],
        (false, UnfusedLoss::InPlace) if copy => [e, e],
        (false, UnfusedLoss::InPlace) => [0.0, 0.0],
        (false, UnfusedLoss::Fp32) => [if copy { e + 4.0 } else { 4.0 }, 8.0],
        (false, UnfusedLoss::Native) => [e, 2.0 * e],
        (false, UnfusedLoss::LossParallel) => [if copy { e + 8.0 } else { 8.0 }, 12.0],
    }
}

/// Bytes a training metric moves per logit of `e` bytes: Composer's cross-entropy and
/// perplexity each run PyTorch's unfused cross-entropy forward over the logits (the forward
/// of [`loss_bytes`], unfused), token accuracy an argmax reading each logit once.
pub fn metric_bytes(m: crate::framework::TrainMetric, e: f64) -> f64 {
    use crate::framework::TrainMetric;
    match m {
        TrainMetric::CrossEntropy | TrainMetric::Perplexity => loss_bytes(false, UnfusedLoss::Fp32, e).0,
        TrainMetric::TokenAccuracy => e,
    }
}

/// The loss over `logits` logits per micro-batch (see [`loss_bytes`] and
/// [`loss_transient_bytes`]).
pub(super) fn loss_op(fused: bool, unfused: UnfusedLoss, logits: f64, e: f64) -> OpSpec {
    let (forward, backward, kept) = loss_bytes(fused, unfused, e);
    let [tf, tb] = loss_transient_bytes(fused, unfused, e);
    OpSpec {
        name: "loss",
        class: OpClass::Memory,
        forward_flops: 0.0,
        forward_bytes: forward * logits,
        backward_flops: 0.0,
        backward_bytes: backward * logits,
        saved: Saved { sharded_bytes: kept * logits, transient_bytes: [tf * logits, tb * logits], ..Saved::default() },
    }
}
