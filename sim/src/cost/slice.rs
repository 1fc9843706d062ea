//! The cost of one token slice on one pipeline stage, for TeraPipe's slicing optimiser:
//! t(b, l, c) = the slowest stage's forward and backward (and recomputation) of `b`
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
use crate::workload::{LayerOp, LayerShape, OpSpec};

/// Device and host seconds of one block's forward pass and backward pass (with any
/// recomputation), and the weight gradients it accumulates.
#[derive(Clone, Copy, Debug, Default)]
struct Passes {
    gpu_f: f64,
    gpu_b: f64,
    host_f: f64,
    host_b: f64,
}

impl Passes {
    fn add(self, o: Passes, times: f64) -> Passes {
        Passes {
            gpu_f: self.gpu_f + times * o.gpu_f,
            gpu_b: self.gpu_b + times * o.gpu_b,
            host_f: self.host_f + times * o.host_f,
            host_b: self.host_b + times * o.host_b,
        }
    }

    /// A pass starts when its input arrives, and the host (blocked on that receive) then
    /// issues its ops while the device runs them: the slower of the two sets the pace.
    fn seconds(self) -> f64 {
        self.gpu_f.max(self.host_f) + self.gpu_b.max(self.host_b)
    }
}

/// Seconds the slowest pipeline stage spends on a slice: the stage with the most layers, or
/// the first stage with the embedding or the last one with the output layer and the loss,
/// whichever takes longest. Charging every stage the slowest one's time is TeraPipe's
/// latency model (Eq. 5) for stages that are not all equal: the slowest stage paces the
/// slices, and the fill is bounded by it.
pub fn slice_cost_s(s: &Scenario, model: &ComputeModel, b: u32, l: u32, c: u32) -> f64 {
    let plan = &s.plan;
    let w = &s.workload.transformer;
    let shape = LayerShape {
        micro_batch: b,
        seq_len: l,
        tp: plan.tp,
        tp_mode: plan.tp_mode,
        ep: plan.ep,
        cp: 1,
        context: c,
        sequence_parallel: plan.sequence_parallel,
        attention: plan.attention,
        fusion: plan.fusion,
        activation_bytes: plan.precision.activation_bytes(),
    };
    let intra = s.cluster.node.intra_node.as_ref();
    let t = plan.tp as f64;
    let host_op = s.options.host_op_s(&s.cluster.node.device);
    // Each slice's weight gradients are added into the ones kept from the earlier slices (the
    // first backward of the iteration has nothing to add to; every slice is charged alike).
    let grad_bytes = super::memory::accumulated_grad_bytes(plan);
    let tp_shards = plan.tp_mode.weight_shards(plan.tp) as f64;
    let passes = |ops: Vec<LayerOp>, params: f64| {
        let mut p = Passes::default();
        let recompute = plan.recompute == Recompute::Full;
        for op in ops {
            match op {
                LayerOp::Compute(spec) => {
                    let f = model.op_s(&spec, false);
                    p.gpu_f += f;
                    p.gpu_b += model.op_s(&spec, true) + if recompute { f } else { 0.0 };
                    p.host_f += host_op;
                    p.host_b += host_op * (super::launches(&spec, true) + if recompute { 1.0 } else { 0.0 });
                }
                LayerOp::Comm { bytes, forward, backward, forward_bytes, .. } => {
                    if let Some(link) = intra {
                        // The port, or in a mesh the links to the other t - 1 ranks.
                        let bw =
                            s.cluster.node.intra_group_bytes_per_s(plan.tp).unwrap_or(link.effective_bytes_per_s());
                        let one = |bytes: f64| 2.0 * (t - 1.0) / t * bytes / bw + 2.0 * (t - 1.0) * link.latency_s;
                        if forward.is_some() {
                            p.gpu_f += one(forward_bytes.unwrap_or(bytes));
                            p.host_f += host_op;
                        }
                        if backward.is_some() {
                            p.gpu_b += one(bytes);
                            p.host_b += host_op;
                        }
                    }
                }
            }
        }
        if grad_bytes > 0.0 && params > 0.0 {
            p.gpu_b += model.op_s(&OpSpec::grad_accumulate(params / tp_shards, grad_bytes), true);
            p.host_b += host_op;
        }
        p
    };
    let layer = passes(w.layer_ops(shape), w.layer_parameters());
    let stage = |layers: u32| Passes::default().add(layer, layers as f64);
    let most = plan.partition.iter().copied().max().unwrap_or(w.layers);
    let first = plan.partition.first().copied().unwrap_or(w.layers);
    let last = plan.partition.last().copied().unwrap_or(w.layers);
    let head_params = w.head_classes() * w.hidden as f64;
    let embedding_params = w.embedding_parameters_without_head();
    let with_embedding = stage(first).add(passes(w.embedding_ops(shape), embedding_params), 1.0);
    // A tied output layer on a single stage is the embedding itself (its gradients counted once).
    let head = passes(w.head_ops(shape), if plan.pp == 1 && w.tied_embeddings { 0.0 } else { head_params });
    let compute = if plan.pp > 1 {
        stage(most).seconds().max(with_embedding.seconds()).max(stage(last).add(head, 1.0).seconds())
    } else {
        with_embedding.add(head, 1.0).seconds()
    };
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
