//! Static memory of each stage's devices: model states on the device, host and NVMe after
//! ZeRO sharding and offload, the framework's buffers, and under Gemini the steady-state chunk
//! placement. (Activation memory is events on the tasks that allocate and free it.)

use super::builder::Builder;
use super::context::{Lowering, Stage};
use super::gemini;
use super::program::ChunkPlacement;
use crate::plan::Tier;
use crate::report::timeline::MemoryBreakdown;

/// Writes the static, host and NVMe memory of the stage's devices; under Gemini with its
/// warm-up `stats`, places the stage's chunks and returns the placement.
pub(super) fn stage_memory(
    b: &mut Builder,
    lw: &Lowering,
    st: &Stage,
    stats: Option<&[(gemini::UnitAccess, f64)]>,
) -> Option<gemini::StagePlacement> {
    let (plan, s) = (lw.plan, lw.s);
    let (params, wb, gb, ob) = (st.params, lw.wb, lw.gb, lw.ob);
    let off = plan.offload;
    let buffers = s.options.framework_bytes(s.cluster.class(st.class))
        + if lw.sync > 1 { 2.0 * plan.bucket_bytes.min(params * gb) } else { 0.0 }
        + if plan.pp > 1 { 2.0 * lw.max_boundary } else { 0.0 }
        + if lw.z3 { 2.0 * largest_unit(lw, &st.my_chunks) * wb } else { 0.0 };
    // A frozen prefix keeps only its weights, on the first stage.
    let frozen_weights = if lw.frozen && st.my_chunks.contains(&0) {
        (lw.first_params + lw.lp[..plan.frozen.layers as usize].iter().sum::<f64>()) * wb
    } else {
        0.0
    };
    let mut device = MemoryBreakdown {
        weights: frozen_weights
            + if lw.host_params { 0.0 } else { lw.sharded_bytes(st, 3, wb) }
            + te_fp8_weight_copies(lw, st),
        // With the optimizer on the host, gradients go there bucket by bucket. They are kept
        // in the dtype they are reduced in: Megatron accumulates into fp32 `main_grad` buffers
        // under bf16 (`accumulate_allreduce_grads_in_fp32`; Megatron-Core's distributed
        // optimizer guide: 4 bytes of gradient per parameter, 18 in all without sharding).
        gradients: if lw.host_opt && lw.z >= 2 {
            0.0
        } else {
            lw.sharded_bytes(st, plan.gradient_shard_stage(), plan.framework.grad_reduce_bytes(gb))
        },
        optimizer: if lw.host_opt { 0.0 } else { lw.sharded_bytes(st, 1, ob) },
        activations: 0.0,
        buffers,
    };
    let mut host = MemoryBreakdown {
        weights: if lw.host_params { params * wb / lw.shard(3) } else { 0.0 },
        // ZeRO-Offload keeps fp32 gradients next to the states it updates.
        gradients: if lw.host_opt { params * 4.0 / lw.shard(1) } else { 0.0 },
        optimizer: if off.optimizer == Tier::Cpu { params * ob / lw.shard(1) } else { 0.0 },
        activations: 0.0,
        buffers: 0.0,
    };
    // Gemini's steady state: chunks resident at the start are static, moves are dynamic (on
    // their copies); gradients reuse the chunks' memory.
    let placement = match (lw.dynamic, stats) {
        (Some(_), Some(stats)) => {
            Some(gemini_placement(b, lw, st, stats, buffers + frozen_weights, frozen_weights, &mut device, &mut host))
        }
        (Some(_), None) => {
            device.gradients = 0.0;
            None
        }
        _ => None,
    };
    let nvme = if off.optimizer == Tier::Nvme { params * ob / lw.shard(1) } else { 0.0 }
        + if off.params == Tier::Nvme { params * wb / lw.shard(3) } else { 0.0 };
    for &d in st.ctx.lowered() {
        let di = b.dev_index[d as usize] as usize;
        let n = b.p.devices.len();
        for v in [&mut b.p.static_memory, &mut b.p.host_memory] {
            if v.len() < n {
                v.resize(n, MemoryBreakdown::default());
            }
        }
        if b.p.nvme_bytes.len() < n {
            b.p.nvme_bytes.resize(n, 0.0);
        }
        b.p.static_memory[di] = device;
        b.p.host_memory[di] = host;
        b.p.nvme_bytes[di] = nvme;
    }
    placement
}

/// Transformer Engine's fp8 copies of the stage's GEMM weights: under fp8 each TE module
/// keeps its weight cast to fp8 and that cast's transpose (1 byte each a parameter) in
/// persistent placeholders, reused over the step's micro-batches (`weight1_fp8`,
/// `weight1_t_fp8`: transformer_engine/pytorch/module/linear.py `get_fp8_weights_scratchpad`
/// at v1.3, used whenever the caller passes `is_first_microbatch`, as Megatron-Core does). The
/// layers' parameters only: the embedding and the output layer stay 16-bit. Not under ZeRO-3
/// (a gathered unit's weights are transient) nor with torchao's casts (cast at every use).
fn te_fp8_weight_copies(lw: &Lowering, st: &Stage) -> f64 {
    let plan = lw.plan;
    let device = lw.s.cluster.class(st.class);
    let fp8 = plan.precision == crate::hardware::Precision::Fp8 && device.peak_flops.fp8.is_some();
    if !fp8 || lw.z3 || plan.framework.fp8_casts != crate::framework::Fp8Casts::Te {
        return 0.0;
    }
    let layers: f64 = st
        .my_chunks
        .iter()
        .map(|&c| (lw.starts[c as usize]..lw.starts[c as usize + 1]).map(|l| lw.lp[l as usize]).sum::<f64>())
        .sum();
    2.0 * layers
}

/// Largest unit gathered at once under ZeRO-3 (two in flight with prefetch).
fn largest_unit(lw: &Lowering, my_chunks: &[u32]) -> f64 {
    my_chunks
        .iter()
        .map(|&c| {
            let mut u =
                (lw.starts[c as usize]..lw.starts[c as usize + 1]).map(|l| lw.lp[l as usize]).fold(0.0, f64::max);
            if c == 0 {
                u = u.max(lw.first_params);
            }
            if c == lw.chunks - 1 {
                u = u.max(lw.last_params);
            }
            u
        })
        .fold(0.0, f64::max)
}

/// Gemini's steady-state placement of the stage's chunks from its warm-up accesses: sets the
/// device and host model states, and records the placement (once, for the first replica).
fn gemini_placement(
    b: &mut Builder,
    lw: &Lowering,
    st: &Stage,
    stats: &[(gemini::UnitAccess, f64)],
    static_non_model: f64,
    frozen_weights: f64,
    device: &mut MemoryBreakdown,
    host: &mut MemoryBreakdown,
) -> gemini::StagePlacement {
    let s = lw.s;
    let dy = lw.dynamic.expect("Gemini placement under a dynamic offload");
    let w = &s.workload.transformer;
    let d0 = b.dev_index[st.group()[0] as usize];
    let accesses: Vec<(gemini::UnitAccess, f64)> = stats.iter().filter(|(a, _)| a.device == d0).copied().collect();
    let input = gemini::StageInput {
        eviction: dy.eviction,
        budget_bytes: dy.budget_bytes,
        hbm_bytes: s.options.usable_bytes(s.cluster.class(st.class)),
        weight_bytes: lw.wb,
        state_bytes: lw.ob,
        shards: lw.sync,
        interval: s.workload.net.as_ref().map_or(w.hidden as u64, |_| 1024),
        split_layers: lw.edges,
        static_non_model,
    };
    let pl = gemini::place_stage(&accesses, &input);
    device.weights = frozen_weights + pl.resident_bytes;
    device.gradients = 0.0;
    device.optimizer = pl.device_state_bytes;
    host.weights = pl.total_bytes - pl.min_resident_bytes;
    host.optimizer = (1.0 - pl.split.device) * st.params * lw.ob / lw.shard(1);
    if st.r == lw.replicas[0] {
        let moves = pl.moves.iter().flatten();
        b.p.chunk_placement.push(ChunkPlacement {
            stage: st.stage,
            chunk_params: pl.chunk_elems,
            chunks: pl.chunks,
            fetches: moves.clone().filter(|m| m.0).count(),
            evictions: moves.clone().filter(|m| !m.0).count(),
            moved_bytes: moves.map(|m| m.1).sum::<f64>() + 0.0,
            optimizer_on_device: pl.split.device,
            feasible: pl.feasible,
        });
    }
    pl
}
