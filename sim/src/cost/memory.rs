//! Static memory per device: weights, gradients and optimizer states (the "model states" of
//! the ZeRO paper, Rajbhandari et al. 2020, section 3.1: 2 + 2 + 12 bytes per parameter with
//! mixed-precision Adam), sharded by tensor and pipeline parallelism and, for ZeRO stage 1,
//! the optimizer states over the data-parallel group.

use crate::hardware::Precision;
use crate::plan::{Optimizer, Plan, Tier};

/// Bytes per parameter of (weights, gradients, optimizer states), unsharded.
pub fn bytes_per_parameter(precision: Precision, optimizer: Optimizer) -> (f64, f64, f64) {
    let mixed = precision != Precision::Fp32;
    let w = precision.activation_bytes();
    let g = w;
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
pub fn optimizer_traffic_bytes(precision: Precision, optimizer: Optimizer) -> f64 {
    let (w, g, opt) = bytes_per_parameter(precision, optimizer);
    // Read gradient and states, write states and the low-precision copy of the weights.
    let master = if precision == Precision::Fp32 { 0.0 } else { w };
    g + 2.0 * opt + master + if precision == Precision::Fp32 { 2.0 * w } else { 0.0 }
}

/// Gradient bytes per (tensor-sharded) parameter that a micro-batch's backward adds into the
/// kept gradients on its device: all of them, ZeRO-2/3's shard over the data-parallel group,
/// or none when ZeRO-Offload streams gradients to the host optimizer.
pub fn accumulated_grad_bytes(plan: &Plan) -> f64 {
    let (_, g, _) = bytes_per_parameter(plan.precision, plan.optimizer);
    match (plan.offload.optimizer != Tier::Device, plan.zero_stage >= plan.gradient_shard_stage()) {
        (true, true) => 0.0,
        (false, true) => g / plan.sync_degree() as f64,
        (_, false) => g,
    }
}
