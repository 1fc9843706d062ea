//! Activation offload (kept activations copied to host memory after a layer's forward and
//! fetched back one layer ahead of its backward, with their memory events), and AutoCache's
//! read of a frozen prefix's cached output from host memory or disk.

use super::blocks::UnitBlocks;
use super::builder::{Builder, StepCtx};
use super::compute::emit_group_compute;
use super::context::Lowering;
use super::program::*;
use crate::plan::Tier;
use crate::report::timeline::{Label, Phase};
use std::collections::HashMap;

/// Activation offload on one stage.
pub(super) struct ActOffload {
    /// Whether `plan.offload.activations` moves kept activations off the device.
    enabled: bool,
    /// Copies out per (chunk, unit, layer), until the layer's backward fetches it back.
    stashed: HashMap<(u32, u32, u32), Vec<u32>>,
    /// Device-0 id of the previous backward layer's first task: the next layer's fetch waits
    /// for it (fetches run one layer ahead of the backward that needs them).
    prev_bwd_first: u32,
}

impl ActOffload {
    pub(super) fn new(lw: &Lowering) -> ActOffload {
        ActOffload {
            enabled: lw.plan.offload.activations != Tier::Device,
            stashed: HashMap::new(),
            prev_bwd_first: NONE,
        }
    }

    /// After layer `l`'s forward (last task of the group's last device `last`), copy its
    /// `saved` bytes out to the host.
    pub(super) fn offload(
        &mut self,
        b: &mut Builder,
        ctx: &StepCtx,
        saved: f64,
        (c, mb, l): (u32, u32, u32),
        last: u32,
    ) {
        if !self.enabled {
            return;
        }
        let t = ctx.streams.len() as u32;
        let outs = act_copies(b, ctx, false, saved, l as i32, c, mb);
        for (x, &o) in outs.iter().enumerate() {
            b.p.deps.push((last - (t - 1) + x as u32, o));
        }
        self.stashed.insert((c, mb, l), outs);
    }

    /// Before layer `l`'s backward: fetch its `saved` bytes back, after they went out and
    /// after the previous backward layer started. Returns the fetches (none when disabled).
    pub(super) fn fetch(
        &mut self,
        b: &mut Builder,
        ctx: &StepCtx,
        saved: f64,
        (c, mb, l): (u32, u32, u32),
    ) -> Vec<u32> {
        if !self.enabled {
            return Vec::new();
        }
        let t = ctx.streams.len() as u32;
        let fetched = act_copies(b, ctx, true, saved, l as i32, c, mb);
        let outs = self.stashed.remove(&(c, mb, l)).expect("forward stashed this layer");
        for x in 0..t as usize {
            b.p.deps.push((outs[x], fetched[x]));
            if self.prev_bwd_first != NONE {
                b.p.deps.push((self.prev_bwd_first + x as u32, fetched[x]));
            }
        }
        fetched
    }

    /// The layer's backward (first task `unit_first`, recomputation included) waits for its
    /// fetches; it is what the next layer's fetch waits for.
    pub(super) fn fetched_before(&mut self, b: &mut Builder, fetched: &[u32], unit_first: u32) {
        for (x, &fch) in fetched.iter().enumerate() {
            b.p.deps.push((fch, unit_first + x as u32));
        }
        self.prev_bwd_first = unit_first;
    }
}

/// Copy a layer's kept activations out to host memory (freed on the device when the copy
/// ends) or back (allocated when the copy starts), for every lowered device of the group.
fn act_copies(
    b: &mut Builder,
    ctx: &StepCtx,
    to_device: bool,
    bytes: f64,
    layer: i32,
    chunk: u32,
    mb: u32,
) -> Vec<u32> {
    let name = if to_device { "act_fetch" } else { "act_offload" };
    let phase = if to_device { Phase::Backward } else { Phase::Forward };
    let label = b.label(Label { op: name, layer, phase, chunk });
    ctx.lowered()
        .iter()
        .map(|&d| {
            let task = b.host_copy(d, to_device, bytes, false, label);
            b.p.tasks[task as usize].micro_batch = mb;
            let device = b.dev_index[d as usize];
            let ev = if to_device {
                MemoryEvent {
                    device,
                    at_end: false,
                    activation_bytes: bytes,
                    buffer_bytes: 0.0,
                    next: NONE,
                    tag: memory_tag(layer),
                }
            } else {
                MemoryEvent {
                    device,
                    at_end: true,
                    activation_bytes: -bytes,
                    buffer_bytes: 0.0,
                    next: NONE,
                    tag: memory_tag(layer),
                }
            };
            b.memory_event(task, ev);
            task
        })
        .collect()
}

/// AutoCache: the cached prefix's output (of the first `plan.frozen.cached_layers` layers)
/// comes back over PCIe, what does not fit in host DRAM from the node's disks; a marker op on
/// each device's compute stream waits for the reads. Returns the marker's first and last
/// task ids as `emit_block` does.
pub(super) fn frozen_cache_read(b: &mut Builder, lw: &Lowering, ctx: &StepCtx, ub: &UnitBlocks, mb: u32) -> (u32, u32) {
    let plan = lw.plan;
    let label = b.label(Label { op: "frozen_cache_read", layer: -1, phase: Phase::Forward, chunk: 0 });
    let disk = plan.frozen.cache_on_disk.clamp(0.0, 1.0);
    let mut reads: Vec<u32> = Vec::new();
    for &d in ctx.lowered() {
        let mut last_read = NONE;
        for (share, nvme) in [(1.0 - disk, false), (disk, true)] {
            if share > 0.0 {
                let r = b.host_copy(d, true, share * ub.boundary[plan.frozen.cached_layers as usize - 1], nvme, label);
                last_read = r;
            }
        }
        reads.push(last_read);
    }
    let marker = emit_group_compute(b, ctx, lw.cache_op, label, mb);
    for (x, &rd) in reads.iter().enumerate() {
        b.p.deps.push((rd, marker + x as u32));
    }
    (marker, marker + lw.ranks - 1)
}
