//! The cost of one token slice on one pipeline stage, for TeraPipe's slicing optimiser:
//! t(b, l, c) = the stage's layers' forward and backward (and recomputation) of `b`
//! sequences' `l`-token slice attending to `c` earlier tokens, from the same op list and
//! compute model the simulation uses, plus its tensor-parallel all-reduces and the
//! activations and gradients it passes to the neighbouring stages (alpha-beta on the links).
//! Derived from the workload and hardware, not fitted: it follows any model, device and
//! tensor-parallel degree.

use super::ComputeModel;
use crate::plan::Recompute;
use crate::scenario::Scenario;
use crate::workload::{LayerOp, LayerShape};

/// Seconds one (the largest) stage spends on a slice.
pub fn slice_cost_s(s: &Scenario, model: &ComputeModel, b: u32, l: u32, c: u32) -> f64 {
    let plan = &s.plan;
    let w = &s.workload.transformer;
    let shape = LayerShape {
        micro_batch: b,
        seq_len: l,
        tp: plan.tp,
        tp_mode: plan.tp_mode,
        context: c,
        sequence_parallel: plan.sequence_parallel,
        flash_attention: plan.flash_attention,
        activation_bytes: plan.precision.activation_bytes(),
    };
    let intra = s.cluster.node.intra_node.as_ref();
    let t = plan.tp as f64;
    let mut layer_s = 0.0;
    for op in w.layer_ops(shape) {
        match op {
            LayerOp::Compute(spec) => {
                let f = model.op_s(&spec, false);
                layer_s += f + model.op_s(&spec, true) + if plan.recompute == Recompute::Full { f } else { 0.0 };
            }
            LayerOp::Comm { bytes, forward, backward, .. } => {
                if let Some(link) = intra {
                    let bw = link.effective_bytes_per_s();
                    let passes = forward.is_some() as u32 + backward.is_some() as u32;
                    let one = 2.0 * (t - 1.0) / t * bytes / bw + 2.0 * (t - 1.0) * link.latency_s;
                    layer_s += passes as f64 * one;
                }
            }
        }
    }
    let layers = plan.partition.iter().copied().max().unwrap_or(w.layers) as f64;
    let boundary = shape.activation_bytes * b as f64 * l as f64 * w.hidden as f64;
    let nic = &s.cluster.node.nic;
    let p2p = if plan.pp > 1 { 2.0 * (boundary / nic.effective_bytes_per_s() + nic.latency_s) } else { 0.0 };
    layers * layer_s + p2p
}
