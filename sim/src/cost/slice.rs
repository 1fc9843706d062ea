//! The cost of one token slice on one pipeline stage, for TeraPipe's slicing optimiser:
//! t(b, l, c) = the stage's layers' forward and backward (and recomputation) of `b`
//! sequences' `l`-token slice attending to `c` earlier tokens, from the same op list and
//! compute model the simulation uses (with the accumulation of its weight gradients into
//! the earlier slices'), plus its tensor-parallel all-reduces and the
//! activations and gradients it passes to the neighbouring stages (alpha-beta on the links,
//! averaged over the stage boundaries, with the NIC shared by the replicas that cross it at once).
//! Each pass costs the larger of the device's time and the host's time to issue its ops
//! (the host waits for the pass's input, as the engine models it).
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
    let host_op = s.options.host_op_s(&s.cluster.node.device);
    // Device and host time of one pass (forward, or backward with any recomputation): a
    // pass starts when its input arrives, and the host (blocked on that receive) then issues
    // its ops while the device runs them, so the slower of the two sets the pace.
    let (mut gpu_f, mut gpu_b, mut host_f, mut host_b) = (0.0, 0.0, 0.0, 0.0);
    for op in w.layer_ops(shape) {
        match op {
            LayerOp::Compute(spec) => {
                let f = model.op_s(&spec, false);
                let recompute = plan.recompute == Recompute::Full;
                gpu_f += f;
                gpu_b += model.op_s(&spec, true) + if recompute { f } else { 0.0 };
                host_f += host_op;
                host_b += host_op * (super::launches(&spec, true) + if recompute { 1.0 } else { 0.0 });
            }
            LayerOp::Comm { bytes, forward, backward, .. } => {
                if let Some(link) = intra {
                    let bw = link.effective_bytes_per_s();
                    let one = 2.0 * (t - 1.0) / t * bytes / bw + 2.0 * (t - 1.0) * link.latency_s;
                    if forward.is_some() {
                        gpu_f += one;
                        host_f += host_op;
                    }
                    if backward.is_some() {
                        gpu_b += one;
                        host_b += host_op;
                    }
                }
            }
        }
    }
    // Each slice's weight gradients are added into the ones kept from the earlier slices (the
    // first backward of the iteration has nothing to add to; every slice is charged alike).
    let (_, grad_bytes, _) = super::memory::bytes_per_parameter(plan.precision, plan.optimizer);
    let offloaded = plan.offload.optimizer != crate::plan::Tier::Device && plan.zero_stage >= 2;
    if !offloaded {
        let shards = if plan.zero_stage >= 2 { plan.sync_degree() as f64 } else { 1.0 };
        let params = w.layer_parameters() / plan.tp_mode.weight_shards(plan.tp) as f64 / shards;
        gpu_b += model.op_s(&crate::workload::OpSpec::grad_accumulate(params, grad_bytes), true);
        host_b += host_op;
    }
    let layers = plan.partition.iter().copied().max().unwrap_or(w.layers) as f64;
    let compute = layers * (gpu_f.max(host_f) + gpu_b.max(host_b));
    let boundary = shape.activation_bytes * b as f64 * l as f64 * w.hidden as f64;
    compute + if plan.pp > 1 { 2.0 * mean_hop_s(s, boundary) } else { 0.0 }
}

/// Mean seconds for a stage boundary to pass `boundary` bytes per replica (so that the
/// latency term (K - 1) x t_max sums the hops a slice really crosses): over the NIC
/// (shared by the replicas whose same boundary leaves that node at once) when the next stage
/// sits on another node, else over the node's device links (split over the tensor ranks, as
/// Megatron's scatter-gather sends do).
fn mean_hop_s(s: &Scenario, boundary: f64) -> f64 {
    let plan = &s.plan;
    let node = &s.cluster.node;
    let per_node = node.devices.max(1);
    let nic = &node.nic;
    let nic_s = |bytes: f64| bytes / (nic.effective_bytes_per_s() * node.nics.max(1) as f64) + nic.latency_s;
    let mut total = 0.0;
    for stage in 0..plan.pp - 1 {
        let from = plan.device(0, stage, 0) / per_node;
        let to = plan.device(0, stage + 1, 0) / per_node;
        let hop = if from != to {
            let sharing = (0..plan.dp).filter(|&r| plan.device(r, stage, 0) / per_node == from).count() as f64;
            nic_s(sharing * boundary)
        } else {
            match node.intra_node.as_ref() {
                Some(link) => boundary / plan.tp as f64 / link.effective_bytes_per_s() + link.latency_s,
                None => nic_s(boundary),
            }
        };
        total += hop;
    }
    total / (plan.pp - 1) as f64
}
