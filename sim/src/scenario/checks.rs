//! Checks and notes that span sections: what the training asks of the cluster's devices, and
//! what the user should know about how the plan sits on the cluster.

use super::reader::{Result, invalid};
use super::training::Training;
use crate::hardware::{ClusterSpec, Precision};
use crate::plan::Plan;

/// fp8 training needs fp8 matrix units on every device class: a device without them would
/// silently run at its bf16 rate while the report claimed fp8.
pub(super) fn check_fp8(cluster: &ClusterSpec, training: &Training) -> Result<()> {
    if training.precision != Precision::Fp8 {
        return Ok(());
    }
    match cluster.classes().find(|d| d.peak_flops.fp8.is_none()) {
        None => Ok(()),
        Some(d) => Err(invalid(
            "training.precision",
            format!(
                "\"fp8\" needs fp8 tensor cores, and device {} has no fp8 peak; use \"bf16\" or \"fp16\", \
                 or a device with fp8 (H100, H200, B200, MI300X), or give the device a peak_flops.fp8",
                d.name
            ),
        )),
    }
}

/// FlashAttention-3 is written for Hopper's tensor-memory accelerator and warp-group MMA
/// (Dao-AILab/flash-attention README: "FlashAttention-3 ... optimized for Hopper GPUs (e.g.
/// H100)"); on another device the kernel named does not exist, and timing it at
/// FlashAttention-2's rates would be a silent substitution.
pub(super) fn check_attention(cluster: &ClusterSpec, training: &Training) -> Result<()> {
    use crate::hardware::kernels::{Attention, FlashKernel, GpuArch, arch_of};
    if training.attention != Some(Attention::Fused(FlashKernel::V3)) {
        return Ok(());
    }
    match cluster.classes().find(|d| arch_of(d) != Some(GpuArch::Hopper)) {
        None => Ok(()),
        Some(d) => Err(invalid(
            "training.attention",
            format!(
                "\"flash3\" (FlashAttention-3) runs on Hopper GPUs (H100, H200) only, and device {} is not one; \
                 use \"flash\" (the device's generation), \"flash2\", \"cudnn\" or \"naive\"",
                d.name
            ),
        )),
    }
}

/// Notes on a plan outside common practice: tensor parallelism across nodes; a head dimension
/// the fused attention kernel has no compiled version of, which it runs padded to the next one
/// (`FlashKernel::padded_head_dim`: the kernel-selection cliff); and a non-causal model under
/// PyTorch's context parallelism, which refuses it unless load balancing is turned off.
pub(super) fn plan_notes(plan: &Plan, cluster: &ClusterSpec, workload: &crate::workload::Workload) -> Vec<String> {
    use crate::hardware::kernels::arch_of;
    let mut notes = Vec::new();
    if workload.net.is_none() {
        let d = workload.transformer.attention_head_dim();
        let sixteen_bit = plan.layer_shape().activation_bytes == 2.0;
        if let Some(kernel) = plan.attention.fused_kernel(d, sixteen_bit) {
            let mut seen = Vec::new();
            for dev in cluster.classes() {
                let k = kernel.resolve(arch_of(dev));
                let padded = k.padded_head_dim(d);
                if padded > d && !seen.contains(&k) {
                    seen.push(k);
                    notes.push(format!(
                        "attention: head dimension {d} has no kernel of its own in `{}`; it runs as {padded} \
                         on {}, doing {:.0}% more work than its FLOPs (a head dimension of {padded} would cost the same)",
                        crate::hardware::kernels::Attention::Fused(k).name(),
                        dev.name,
                        100.0 * (padded / d - 1.0)
                    ));
                }
            }
        }
    }
    let pytorch_ring = matches!(
        plan.framework.cp_ring,
        crate::framework::CpRing::PytorchAllgather | crate::framework::CpRing::PytorchAlltoall
    );
    if plan.cp > 1 && pytorch_ring && workload.net.is_none() && !workload.transformer.causal {
        notes.push(
            "context parallelism: PyTorch's context_parallel balances load only under a causal mask and, \
             with its default enable_load_balance, refuses is_causal=False (its error: Load balancing \
             requires is_causal=True); this non-causal model is charged as its ring runs with load \
             balancing turned off (_cp_options.enable_load_balance = False): every step a full square"
                .to_string(),
        );
    }
    if plan.cp > 1 {
        let without = match plan.framework.name.as_str() {
            "megatron-lm-2021" => Some("Megatron-LM of 2021 has no context parallelism"),
            "deepspeed" => {
                Some("DeepSpeed splits sequences by all-to-alls of attention heads (Ulysses), not by a ring")
            }
            _ => None,
        };
        if let Some(why) = without {
            notes.push(format!(
                "context parallelism: {why}; plan.cp runs as the ring training.framework.cp_ring names ({})",
                plan.framework.cp_ring.name()
            ));
        }
    }
    let mut capped = Vec::new();
    for dev in cluster.classes() {
        if let Some(p) = dev.power.filter(|p| p.limit_w < p.rated_w)
            && !capped.contains(&dev.name)
        {
            capped.push(dev.name.clone());
            notes.push(format!(
                "power: {} runs at a {:.0} W limit of its rated {:.0} W; its GEMMs and attention run at {:.1}% \
                 of their speed at the rated power (the clock as the cube root of the power left above its \
                 {:.0} W idle draw), memory-bound kernels at theirs",
                dev.name,
                p.limit_w,
                p.rated_w,
                100.0 * p.compute_speed(),
                p.idle_w
            ));
        }
    }
    if plan.tp > cluster.node.devices {
        notes.push(format!(
            "tensor parallelism of {} spans {} nodes of {} devices: its collectives cross the inter-node \
             network on every layer (as Colossal-AI's 2D/2.5D/3D modes run over 16-64 GPUs); Megatron-LM \
             keeps tp inside a node",
            plan.tp,
            plan.tp.div_ceil(cluster.node.devices),
            cluster.node.devices
        ));
    }
    notes
}
