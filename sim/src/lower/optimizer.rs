//! The optimizer step of each stage's devices after their gradient reduction: on the device,
//! on the host CPU (ZeRO-Offload, with the copies of gradients down and weights back), or
//! split by Gemini's placement.

use super::builder::{Builder, StepCtx};
use super::context::{Lowering, Stage};
use super::gemini;
use super::program::*;
use crate::cost::memory::{bytes_per_parameter, optimizer_traffic_bytes};
use crate::plan::{Plan, Tier};
use crate::report::timeline::{Label, Phase};
use crate::workload::OpSpec;

/// The stage's optimizer step, each device's after `last_sync[x]` (its last gradient
/// reduction; empty without any). Returns, per device, the task after which its updated
/// parameters are on the device.
pub(super) fn step(
    b: &mut Builder,
    lw: &Lowering,
    st: &Stage,
    last_sync: &[u32],
    placement: Option<&gemini::StagePlacement>,
) -> Vec<u32> {
    match placement {
        Some(pl) => optimizer_split(b, lw.plan, &st.ctx, &st.my_chunks, last_sync, st.params / lw.shard(1), pl.split),
        None => optimizer_step(b, lw.plan, &st.ctx, &st.my_chunks, last_sync, st.params, lw.sharded(st, 1)),
    }
}

/// Gemini's hybrid Adam on each device of a stage, after its gradient sync: the share of
/// `local` parameters (this device's shard) whose chunk and states are on the device steps
/// there; chunks on the device with states on the host send their gradients down, step on the
/// CPU and copy their weights back; chunks on the host step on the CPU in place. Returns, per
/// device, the task after which its parameters are updated.
fn optimizer_split(
    b: &mut Builder,
    plan: &Plan,
    ctx: &StepCtx,
    my_chunks: &[u32],
    last_sync: &[u32],
    local: f64,
    split: gemini::Split,
) -> Vec<u32> {
    let (wb, gb, _) = bytes_per_parameter(plan.precision, plan.optimizer, plan.master_weights);
    let device_op = (split.device > 0.0).then(|| optimizer_op(b, plan, false, split.device * local, 0.0, my_chunks[0]));
    let host_share = split.resident_host_states + split.host;
    let host_op = (host_share > 0.0).then(|| optimizer_op(b, plan, true, host_share * local, 0.0, my_chunks[0]));
    let down = b.label(Label { op: "grad_to_host", layer: -1, phase: Phase::Sync, chunk: my_chunks[0] });
    let up = b.label(Label { op: "param_to_device", layer: -1, phase: Phase::Optimizer, chunk: my_chunks[0] });
    let moved = split.resident_host_states * local;
    let mut ready = Vec::new();
    for (x, &stream) in ctx.streams.iter().enumerate() {
        let device = ctx.group[x];
        // Without a data-parallel sync, after the device's pipeline work.
        let wait =
            last_sync.get(x).copied().unwrap_or_else(|| *b.p.streams[stream as usize].last().expect("pipeline tasks"));
        let mut last = wait;
        if let Some((o, label)) = device_op {
            let task = b.task(TaskKind::Compute, o, label, NONE, &[stream]);
            if wait != NONE {
                b.p.deps.push((wait, task));
            }
            foreach_temporary(b, plan, task, stream, split.device * local);
            last = task;
        }
        if let Some((o, label)) = host_op {
            let mut before = wait;
            if moved > 0.0 {
                let copy = b.host_copy(device, false, moved * gb, false, down);
                if wait != NONE {
                    b.p.deps.push((wait, copy));
                }
                before = copy;
            }
            let task = b.task(TaskKind::Compute, o, label, NONE, &[stream]);
            if before != NONE {
                b.p.deps.push((before, task));
            }
            last = task;
            if moved > 0.0 {
                let copy = b.host_copy(device, true, moved * wb, false, up);
                b.p.deps.push((task, copy));
                last = copy;
            }
        }
        ready.push(last);
    }
    ready
}

/// PyTorch's foreach Adam (`fused.adam` off and `foreach_optimizer` on, the PyTorch
/// profiles' default) builds the denominator of every parameter's update as new tensors
/// before it applies them (`torch/optim/adam.py` `_multi_tensor_adam`, v2.1: `exp_avg_sq_sqrt
/// = torch._foreach_sqrt(device_exp_avg_sqs)`, divided and offset in place, then
/// `_foreach_addcdiv_`): 4 bytes per fp32 parameter of the device's shard, held while the step
/// runs on device `stream`'s task. Fused Adam (apex, Transformer Engine, `fused=True`), a loop
/// over the parameters (one parameter's temporaries at a time, left out) and SGD hold none.
fn foreach_temporary(b: &mut Builder, plan: &Plan, task: u32, stream: u32, params: f64) {
    let f = &plan.framework;
    if f.fused.adam || !f.foreach_optimizer || plan.optimizer != crate::plan::Optimizer::Adam || params <= 0.0 {
        return;
    }
    b.memory_while(task, Program::stream_device(stream), 4.0 * params, OPTIMIZER);
}

/// An optimizer-step op over `params` parameters, on the device or (`host`) on the host CPU,
/// streaming `nvme_bytes` of states from NVMe; returns the op and its label.
fn optimizer_op(b: &mut Builder, plan: &Plan, host: bool, params: f64, nvme_bytes: f64, chunk: u32) -> (u32, u32) {
    let (wb, _, ob) = bytes_per_parameter(plan.precision, plan.optimizer, plan.master_weights);
    let traffic = if host {
        // fp32 gradient in, states read and written, the low-precision weights out.
        (4.0 + 2.0 * ob + wb) * params
    } else {
        optimizer_traffic_bytes(plan.precision, plan.optimizer, plan.master_weights) * params
    };
    // An eager framework's Adam runs a multi-tensor kernel per elementwise step (PyTorch's
    // foreach default); a fused one, one kernel over all of it.
    let name = match (host, plan.framework.fused.adam) {
        (true, _) => "cpu_optimizer",
        (false, true) => "optimizer",
        (false, false) => "optimizer_foreach",
    };
    let spec = OpSpec::streaming(name, traffic);
    b.p.ops.push(OpInstance {
        spec,
        backward: false,
        on_host: host,
        nvme_bytes,
        class: b.class,
        sm_share: 1.0,
        part: OpPart::Whole,
        rows: 1.0,
        chunks: 1.0,
    });
    let label = b.label(Label { op: name, layer: -1, phase: Phase::Optimizer, chunk });
    ((b.p.ops.len() - 1) as u32, label)
}

/// The optimizer step of each device of a stage, after its gradient sync: on the device, or
/// (offloaded) on the host CPU followed by the copy of the updated weights back. Returns,
/// per device, the task after which its updated parameter shard is on the device.
fn optimizer_step(
    b: &mut Builder,
    plan: &Plan,
    ctx: &StepCtx,
    my_chunks: &[u32],
    last_sync: &[u32],
    params: f64,
    local: f64,
) -> Vec<u32> {
    let (wb, gb, ob) = bytes_per_parameter(plan.precision, plan.optimizer, plan.master_weights);
    let off = plan.offload;
    let host = off.optimizer != Tier::Device;
    let nvme = if off.optimizer == Tier::Nvme { 2.0 * ob * local } else { 0.0 };
    let (op, label) = optimizer_op(b, plan, host, local, nvme, my_chunks[0]);
    let copy_label = b.label(Label { op: "param_to_device", layer: -1, phase: Phase::Optimizer, chunk: my_chunks[0] });
    let grad_label = b.label(Label { op: "grad_to_host", layer: -1, phase: Phase::Sync, chunk: my_chunks[0] });
    let mut ready = Vec::new();
    for (x, &stream) in ctx.streams.iter().enumerate() {
        let device = ctx.group[x];
        let mut wait = last_sync.get(x).copied().unwrap_or(NONE);
        if host && wait == NONE {
            // No data-parallel sync: copy the whole gradient after the pipeline.
            let pipeline_last = *b.p.streams[stream as usize].last().expect("pipeline tasks");
            let copy = b.host_copy(device, false, params * gb, false, grad_label);
            b.p.deps.push((pipeline_last, copy));
            wait = copy;
        }
        let task = b.task(TaskKind::Compute, op, label, NONE, &[stream]);
        if wait != NONE {
            b.p.deps.push((wait, task));
        }
        if !host {
            foreach_temporary(b, plan, task, stream, local);
        }
        if host && off.params == Tier::Device {
            let copy = b.host_copy(device, true, local * wb, false, copy_label);
            b.p.deps.push((task, copy));
            ready.push(copy);
        } else {
            ready.push(task);
        }
    }
    ready
}
