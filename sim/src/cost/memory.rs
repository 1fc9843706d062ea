//! Static memory per device: weights, gradients and optimizer states (the "model states" of
//! the ZeRO paper, Rajbhandari et al. 2020, section 3.1: 2 + 2 + 12 bytes per parameter with
//! mixed-precision Adam), sharded by tensor and pipeline parallelism and, for ZeRO stage 1,
//! the optimizer states over the data-parallel group.

use crate::hardware::Precision;
use crate::plan::{Optimizer, Plan, Tier};

/// Bytes per parameter of (weights, gradients, optimizer states), unsharded.
pub fn bytes_per_parameter(precision: Precision, optimizer: Optimizer, master_weights: bool) -> (f64, f64, f64) {
    let mixed = precision != Precision::Fp32;
    let w = precision.activation_bytes();
    let g = w;
    if mixed && !master_weights {
        // No master copy: Adam's two moments (SGD's momentum) in the training precision.
        return (w, g, if optimizer == Optimizer::Adam { 2.0 * w } else { w });
    }
    let opt = match (optimizer, mixed) {
        // fp32 master weights + momentum + variance.
        (Optimizer::Adam, true) => 12.0,
        (Optimizer::Adam, false) => 8.0,
        // fp32 master weights + momentum.
        (Optimizer::Sgd, true) => 8.0,
        (Optimizer::Sgd, false) => 4.0,
    };
    (w, g, opt)
}

/// Bytes the optimizer step reads and writes per parameter it updates.
pub fn optimizer_traffic_bytes(precision: Precision, optimizer: Optimizer, master_weights: bool) -> f64 {
    let (w, g, opt) = bytes_per_parameter(precision, optimizer, master_weights);
    // Read gradient and states, write states and the low-precision copy of the weights (or,
    // without a master copy, read and write the weights themselves).
    let in_place = precision == Precision::Fp32 || !master_weights;
    let master = if in_place { 0.0 } else { w };
    g + 2.0 * opt + master + if in_place { 2.0 * w } else { 0.0 }
}

/// Gradient bytes per (tensor-sharded) parameter that a micro-batch's backward adds into the
/// kept gradients on its device: all of them, ZeRO-2/3's shard over the data-parallel group,
/// or none when ZeRO-Offload streams gradients to the host optimizer.
pub fn accumulated_grad_bytes(plan: &Plan) -> f64 {
    let (_, g, _) = bytes_per_parameter(plan.precision, plan.optimizer, plan.master_weights);
    match (plan.offload.optimizer != Tier::Device, plan.zero_stage >= plan.gradient_shard_stage()) {
        (true, true) => 0.0,
        (false, true) => g / plan.shard_degree() as f64,
        (_, false) => g,
    }
}

/// Bytes of model state per parameter on one device, as the lowering keeps them: weights,
/// gradients (in the framework's reduction dtype) and optimizer states, each sharded by ZeRO
/// from its stage on over the data-parallel replicas (ZeRO applies with more than one replica
/// or with parameters offloaded); for the routed experts over the `dp / ep` replicas that hold
/// the same experts. States offloaded to the host take no device memory. Returns (dense,
/// routed expert).
pub fn state_bytes_per_parameter(plan: &Plan) -> (f64, f64) {
    let (wb, gb, ob) = bytes_per_parameter(plan.precision, plan.optimizer, plan.master_weights);
    let sync = plan.shard_degree().max(1) as f64;
    let host_params = plan.offload.params != Tier::Device;
    let host_opt = plan.offload.optimizer != Tier::Device;
    let z = if sync > 1.0 || host_params { plan.zero_stage } else { 0 };
    let weights = if host_params { 0.0 } else { wb };
    let grads = if host_opt && z >= 2 { 0.0 } else { plan.framework.grad_reduce_bytes(gb) };
    let opt = if host_opt { 0.0 } else { ob };
    let per = |replicas: f64| {
        let shard = |stage: u8| if z >= stage { replicas.max(1.0) } else { 1.0 };
        weights / shard(3) + grads / shard(plan.gradient_shard_stage()) + opt / shard(1)
    };
    (per(sync), per(sync / plan.ep.max(1) as f64))
}
