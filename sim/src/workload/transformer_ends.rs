//! A transformer's ops before its first layer and after its last: the embedding lookup (or a
//! ViT's patch projection), the final norm, the output layer, the loss and the trainer's
//! metrics; and DTensor's layout copies, which the layers' tensor-parallel collectives share
//! (`layout_copy`).

use super::loss::{loss_op, metric_bytes};
use super::ops::{gemm_op, mem_op};
use super::transformer::{Input, Norm, TransformerConfig};
use super::{Axis, Comm, LayerOp, LayerShape, OpClass, OpSpec, Saved};

impl TransformerConfig {
    /// Ops before the first layer (embedding lookup, or ViT's patch projection).
    pub fn embedding_ops(&self, shape: LayerShape) -> Vec<LayerOp> {
        let b = shape.micro_batch as f64;
        let s = shape.seq_len as f64;
        let h = self.hidden as f64;
        let e = shape.activation_bytes;
        let mut ops = match self.input {
            Input::Tokens { .. } => vec![LayerOp::Compute(OpSpec {
                name: "embedding",
                class: OpClass::Memory,
                forward_flops: 0.0,
                forward_bytes: 2.0 * s * b * h * e,
                backward_flops: 0.0,
                backward_bytes: 3.0 * s * b * h * e,
                saved: Saved {
                    // The dropout mask on the embedding output (Korthikanti's s*b*h*p/t term
                    // appears only on the first stage).
                    replicated_bytes: if self.dropout { s * b * h } else { 0.0 },
                    ..Saved::default()
                },
            })],
            Input::Patches { patch, channels, .. } => {
                let k = (channels * patch * patch) as f64;
                vec![LayerOp::Compute(gemm_op(
                    "patch_embed",
                    1.0,
                    b * (s - 1.0),
                    h,
                    k,
                    e,
                    Saved { replicated_bytes: e * b * (s - 1.0) * k, ..Saved::default() },
                ))]
            }
        };
        // A vocabulary-parallel embedding sums the ranks' partial lookups. A replicated one
        // looks up every token on each rank: under sequence parallelism each keeps its shard
        // of the output (no forward collective) and gathers the output's gradient back.
        let sp = shape.sequence_parallel;
        let replicated = shape.fusion.replicated_embedding;
        if shape.tp > 1 && matches!(self.input, Input::Tokens { .. }) && (sp || !replicated) {
            if sp && shape.fusion.layout_copies {
                // The reduce-scatter's input (forward) and the gathered gradient (backward).
                ops.push(layout_copy(if replicated { 0.0 } else { e * s * b * h }, e * s * b * h));
            }
            ops.push(LayerOp::Comm {
                name: "embed_out",
                bytes: e * s * b * h,
                axis: Axis::Tensor,
                root: 0,
                forward: match (replicated, sp) {
                    (true, _) => None,
                    (false, true) => Some(Comm::ReduceScatter),
                    (false, false) => Some(Comm::AllReduce),
                },
                backward: if sp { Some(Comm::AllGather) } else { None },
                forward_bytes: None,
            });
        }
        ops
    }

    /// Ops after the last layer: final norm, output projection (vocabulary split over t, as
    /// Megatron does), and the loss.
    pub fn head_ops(&self, shape: LayerShape) -> Vec<LayerOp> {
        let b = shape.micro_batch as f64;
        let s = shape.seq_len as f64;
        let h = self.hidden as f64;
        let t = shape.tp as f64;
        let e = shape.activation_bytes;
        let c = self.head_classes();
        let rows = self.head_rows(shape);
        let final_norm = if self.norm == Norm::RmsNorm && !shape.fusion.rms_norm {
            let (moved, kept) = shape.fusion.norm_bytes(true, e);
            mem_op("final_norm", moved * b * s * h, Saved { replicated_bytes: kept * b * s * h, ..Saved::default() })
        } else {
            mem_op("final_norm", 2.0 * b * s * h * e, Saved { replicated_bytes: e * b * s * h, ..Saved::default() })
        };
        let mut ops = vec![LayerOp::Compute(final_norm)];
        if shape.tp > 1 {
            // Megatron's f before the column-parallel output layer.
            let sp = shape.sequence_parallel;
            ops.push(LayerOp::Comm {
                name: "head_in",
                bytes: e * rows * h,
                axis: Axis::Tensor,
                root: 0,
                forward: if sp { Some(Comm::AllGather) } else { None },
                backward: Some(if sp { Comm::ReduceScatter } else { Comm::AllReduce }),
                forward_bytes: None,
            });
            if sp && shape.fusion.layout_copies {
                ops.push(layout_copy(e * rows * h, e * rows * h));
            }
        }
        ops.push(LayerOp::Compute(gemm_op(
            "logits",
            1.0,
            rows,
            c / t,
            h,
            e,
            Saved { replicated_bytes: e * rows * h, ..Saved::default() },
        )));
        // DTensor's head with a replicated output: the vocabulary shards all-gathered to every
        // rank (the gradient's way back is each rank's own slice: no collective), and the loss
        // on the whole vocabulary, on every rank.
        let replicated = shape.tp > 1 && shape.fusion.replicated_logits;
        if replicated {
            ops.push(LayerOp::Comm {
                name: "logits_gather",
                bytes: e * rows * c,
                axis: Axis::Tensor,
                root: 0,
                forward: Some(Comm::AllGather),
                backward: None,
                forward_bytes: None,
            });
            if shape.fusion.layout_copies {
                // Gathered along the vocabulary, the last dimension.
                ops.push(layout_copy(e * rows * c, 0.0));
            }
        }
        let logits = if replicated { rows * c } else { self.logits(shape) };
        ops.push(LayerOp::Compute(loss_op(shape.fusion.cross_entropy, shape.fusion.unfused_loss, logits, e)));
        ops
    }

    /// The metrics a trainer computes over each micro-batch's logits after its backward, as
    /// one op run forward without gradients on the device holding the logits (none without
    /// metrics; see [`crate::framework::TrainMetric`] and [`metric_bytes`]).
    pub fn metric_ops(&self, shape: LayerShape, metrics: &[crate::framework::TrainMetric]) -> Vec<LayerOp> {
        if metrics.is_empty() {
            return Vec::new();
        }
        let e = shape.activation_bytes;
        let per_logit: f64 = metrics.iter().map(|&m| metric_bytes(m, e)).sum();
        let metrics = mem_op("train_metrics", per_logit * self.logits(shape), Saved::default());
        vec![LayerOp::Compute(OpSpec { backward_bytes: 0.0, ..metrics })]
    }

    /// Logits one device computes per micro-batch: every token's row of the vocabulary (one
    /// row per sample for a classification head), split over the tensor ranks.
    pub(super) fn logits(&self, shape: LayerShape) -> f64 {
        self.head_rows(shape) * self.head_classes() / shape.tp as f64
    }

    /// Rows the head reads per micro-batch: a language model every token, a classification
    /// head one token per sample.
    pub(super) fn head_rows(&self, shape: LayerShape) -> f64 {
        let b = shape.micro_batch as f64;
        match self.input {
            Input::Tokens { .. } => b * shape.seq_len as f64,
            Input::Patches { .. } => b,
        }
    }
}

/// DTensor's concatenation of a tensor-parallel collective's chunks along a dimension other
/// than the first (`fusion.layout_copies`, `framework.tp_layout_copies`): a read and a write
/// of the whole tensor on the compute stream, `forward` bytes of it in the forward pass and
/// `backward` in the backward (0 where that pass's collective runs along the first dimension,
/// or there is none).
pub(super) fn layout_copy(forward: f64, backward: f64) -> LayerOp {
    LayerOp::Compute(OpSpec {
        name: "tp_layout_copy",
        class: OpClass::Memory,
        forward_flops: 0.0,
        forward_bytes: 2.0 * forward,
        backward_flops: 0.0,
        backward_bytes: 2.0 * backward,
        saved: Saved::default(),
    })
}
