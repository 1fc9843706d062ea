//! The schedule walk: a stage's (unit, chunk, pass) steps in the schedule's order, each
//! expanded into its blocks' compute tasks (with recomputation before a layer's backward and
//! gradient accumulation after it), and the other passes called at the points where they hook
//! in: ZeRO-3 gathers around each unit, activation offload around each layer, gradient
//! buckets after each backward layer, pipeline sends after each step.

use super::blocks::{Block, UnitBlocks};
use super::builder::Builder;
use super::compute::{Rerun, emit_block, emit_gather_copy_out, emit_grad_accumulate, emit_recompute};
use super::context::{Lowering, Stage};
use super::data_parallel::GradSync;
use super::data_parallel::ParamPrefetch;
use super::gather::Gathers;
use super::offload::{self, ActOffload};
use super::p2p::{self, Links};
use super::program::*;
use crate::plan::Recompute;
use crate::report::timeline::Phase;
use crate::schedule::Pass;
use std::collections::HashMap;

/// Walk the stage's schedule; `moves` are Gemini's steady-state chunk moves per access.
/// Records where each device's pipeline compute ends (`compute_marks`) and returns, per device,
/// the last task of its last gradient reduction and of its last expert gradient reduction
/// (each empty without any).
pub(super) fn walk_stage(
    b: &mut Builder,
    lw: &Lowering,
    st: &Stage,
    links: &mut Links,
    moves: Option<Vec<Vec<(bool, f64)>>>,
) -> (Vec<u32>, Vec<u32>) {
    let mut walk = Walk {
        lw,
        st,
        grads: GradSync::new(lw, st),
        act: ActOffload::new(lw),
        gathers: Gathers::new(lw, moves),
        prefetch: ParamPrefetch::new(lw, st),
        accumulate_gb: crate::cost::memory::accumulated_grad_bytes(lw.plan),
        first_bwd: first_backward(st),
    };
    for step in &st.order {
        super::expert_parallel::release_held_steps(b, &st.ctx);
        let at = walk.at(step.chunk, step.micro_batch);
        match step.pass {
            Pass::Forward => walk.forward(b, links, &at),
            Pass::Backward => walk.backward(b, links, &at),
        }
    }
    for &sidx in &st.ctx.streams {
        let d = Program::stream_device(sidx) as usize;
        if b.p.compute_marks.len() <= d {
            b.p.compute_marks.resize(b.p.devices.len(), 0);
        }
        b.p.compute_marks[d] = b.p.streams[sidx as usize].len() as u32;
    }
    (walk.grads.last_sync, walk.grads.last_expert_sync)
}

/// The first backward micro-batch of each chunk: every later backward adds its weight
/// gradients into the ones kept (ZeRO-2 and 3: into this device's shard; with the optimizer on
/// the host and gradients streamed there, nothing accumulates on the device).
fn first_backward(st: &Stage) -> HashMap<u32, u32> {
    let mut first_bwd: HashMap<u32, u32> = HashMap::new();
    for step in st.order.iter().filter(|step| step.pass == Pass::Backward) {
        first_bwd.entry(step.chunk).or_insert(step.micro_batch);
    }
    first_bwd
}

/// One stage's walk: the passes' state along it.
struct Walk<'a> {
    lw: &'a Lowering<'a>,
    st: &'a Stage,
    grads: GradSync,
    act: ActOffload,
    gathers: Gathers,
    /// The overlapped all-gather of the previous step's updated shards (ZeRO-1 and 2).
    prefetch: ParamPrefetch,
    /// Bytes per parameter that gradient accumulation adds (0: none).
    accumulate_gb: f64,
    first_bwd: HashMap<u32, u32>,
}

/// One step: chunk `c` on unit `mb`, and what it decides once.
struct At<'a> {
    c: u32,
    mb: u32,
    ub: &'a UnitBlocks,
    /// Whether this backward reduces its gradients (see [`GradSync::reduces`]).
    sync_grads: bool,
    /// Whether this backward adds its gradients into those kept.
    accumulate: bool,
    /// Bytes entering and leaving this chunk per unit.
    bnd_in: f64,
    bnd_out: f64,
}

impl<'a> Walk<'a> {
    fn at(&self, c: u32, mb: u32) -> At<'a> {
        let lw = self.lw;
        let starts = &lw.starts;
        let ub = &lw.unit_blocks[lw.block_of[mb as usize]][self.st.class as usize];
        At {
            c,
            mb,
            ub,
            sync_grads: self.grads.reduces(c, mb),
            accumulate: self.accumulate_gb > 0.0 && self.first_bwd.get(&c) != Some(&mb),
            bnd_in: if starts[c as usize] > 0 { ub.boundary[starts[c as usize] as usize - 1] } else { 0.0 },
            bnd_out: ub.boundary[starts[c as usize + 1] as usize - 1],
        }
    }

    /// A unit (a layer, the embedding, the head) for one pass, between its parameter gather
    /// and the gather's release.
    fn unit(
        &mut self,
        b: &mut Builder,
        at: &At,
        blk: &Block,
        layer: i32,
        phase: Phase,
        (alloc, free): (f64, f64),
        unit_params: f64,
    ) -> (u32, u32) {
        let (lw, st) = (self.lw, self.st);
        let g =
            if lw.per_unit { self.gathers.before(b, lw.plan, st.r, st.stage, unit_params, layer) } else { Vec::new() };
        let updated = self.prefetch.before(b, lw.plan, st, (at.c, at.mb), phase);
        let copy = self.copy_out(b, at, unit_params, layer, phase);
        let (f, l) = emit_block(b, &st.ctx, blk, layer, phase, at.c, at.mb, alloc, free);
        let f = copy.map_or(f, |c| c.0);
        self.prefetch.after(b, &updated, f);
        if lw.per_unit {
            self.gathers.after(b, &st.ctx, &g, f, l);
        }
        (f, l)
    }

    /// The copy of a unit's gathered parameters out of the all-gather buffer, before the
    /// unit's `phase` on the compute stream, with a data-parallel gather: FSDP2's one kernel
    /// (`training.framework.gather_copy_out`), or a list all-gather's kernel per rank and
    /// tensor (`gather_per_tensor`; see [`super::gather::Gathers::list_copies`]). Its first
    /// and last task.
    fn copy_out(&self, b: &mut Builder, at: &At, params: f64, layer: i32, phase: Phase) -> Option<(u32, u32)> {
        let lw = self.lw;
        if !lw.per_unit || lw.plan.shard_degree() <= 1 {
            return None;
        }
        let copies = self.gathers.list_copies(lw.plan, layer, true).map(|n| ("gather_list_copies", n));
        if copies.is_none() && !lw.plan.framework.gather_copy_out {
            return None;
        }
        emit_gather_copy_out(b, &self.st.ctx, (self.gathers.unit_bytes(params), copies), layer, phase, at.c, at.mb)
    }

    /// Under `framework.gather_per_tensor`, a layer's list reduce-scatters copy each rank's
    /// share of its `bytes` of gradients into one buffer first (PyTorch's list
    /// `reduce_scatter`): a kernel per rank and tensor, on the compute stream after the layer's
    /// backward; the last task of the group's last device.
    fn reduce_copies(&self, b: &mut Builder, at: &At, bytes: f64, layer: u32) -> Option<u32> {
        let lw = self.lw;
        if !lw.per_tensor || lw.plan.shard_degree() <= 1 {
            return None;
        }
        let n = self.gathers.list_copies(lw.plan, layer as i32, false)?;
        emit_gather_copy_out(
            b,
            &self.st.ctx,
            (bytes, Some(("reduce_list_copies", n))),
            layer as i32,
            Phase::Backward,
            at.c,
            at.mb,
        )
        .map(|c| c.1)
    }

    /// Gradient accumulation of a unit's `params` after its backward, if this step
    /// accumulates; returns its last task.
    fn accumulate(&self, b: &mut Builder, at: &At, params: f64, layer: i32) -> Option<u32> {
        if !at.accumulate {
            return None;
        }
        emit_grad_accumulate(b, &self.st.ctx, params, self.accumulate_gb, layer, at.c, at.mb)
    }

    fn forward(&mut self, b: &mut Builder, links: &mut Links, at: &At) {
        let (lw, st) = (self.lw, self.st);
        let (plan, ctx, ub, c, mb) = (lw.plan, &st.ctx, at.ub, at.c, at.mb);
        let gathered = if c > 0 { p2p::receive(b, lw, ctx, Phase::Forward, at.bnd_in, c, mb) } else { NONE };
        if self.prefetch.gathers_at(c, mb, Phase::Forward) {
            let arrivals = if c > 0 {
                (0..lw.ranks).map(|x| links.fwd_send[links.key(st.r, c - 1, mb, x)]).collect()
            } else {
                Vec::new()
            };
            self.prefetch.begin(arrivals);
        }
        let mut first = NONE;
        let mut last = NONE;
        if c == 0 && plan.frozen.cached_layers > 0 {
            // AutoCache: the layers frozen since the cache was written run forward on top.
            (first, last) = offload::frozen_cache_read(b, lw, ctx, ub, mb);
            for fl in plan.frozen.cached_layers..plan.frozen.layers {
                let (_, la) = emit_block(b, ctx, ub.layer(fl), fl as i32, Phase::Forward, c, mb, 0.0, 0.0);
                last = la;
            }
        } else if c == 0 && ub.edges {
            let alloc = if lw.frozen { 0.0 } else { ub.embed.saved };
            (first, last) = self.unit(b, at, &ub.embed, -1, Phase::Forward, (alloc, 0.0), lw.first_params);
            // The frozen layers: forward only, nothing kept for backward.
            for fl in 0..plan.frozen.layers {
                let (_, la) = emit_block(b, ctx, ub.layer(fl), fl as i32, Phase::Forward, c, mb, 0.0, 0.0);
                last = la;
            }
        }
        for l in lw.starts[c as usize]..lw.starts[c as usize + 1] {
            let layer = ub.layer(l);
            let (f, la) = self.unit(b, at, layer, l as i32, Phase::Forward, (layer.saved, 0.0), lw.lp[l as usize]);
            self.act.offload(b, ctx, layer.saved, (c, mb, l), la);
            if first == NONE {
                first = f;
            }
            last = la;
        }
        if c == lw.chunks - 1 && ub.edges {
            let (_, la) = self.unit(b, at, &ub.head, HEAD, Phase::Forward, (ub.head.saved, 0.0), lw.last_params);
            last = la;
        }
        self.link(b, links, at, Pass::Forward, gathered, (first, last));
    }

    fn backward(&mut self, b: &mut Builder, links: &mut Links, at: &At) {
        let (lw, st) = (self.lw, self.st);
        let (plan, ctx, ub, c, mb, gb) = (lw.plan, &st.ctx, at.ub, at.c, at.mb, lw.gb);
        let gathered =
            if c + 1 < lw.chunks { p2p::receive(b, lw, ctx, Phase::Backward, at.bnd_out, c, mb) } else { NONE };
        self.grads.enter_chunk(c);
        let mut first = NONE;
        let mut last = NONE;
        if c == lw.chunks - 1 && ub.edges {
            (first, last) = self.unit(b, at, &ub.head, HEAD, Phase::Backward, (0.0, ub.head.saved), lw.last_params);
            if let Some(a) = self.accumulate(b, at, lw.last_params, HEAD) {
                last = a;
            }
            if at.sync_grads {
                self.grads.add(lw.last_params * gb);
            }
        }
        for l in (lw.starts[c as usize]..lw.starts[c as usize + 1]).rev() {
            let (unit_first, la) = self.backward_layer(b, at, l);
            if first == NONE {
                first = unit_first;
            }
            last = la;
            if at.sync_grads {
                // Routed experts under expert parallelism are reduced over their own group.
                let expert = lw.lp_expert[l as usize];
                let la = self.reduce_copies(b, at, (lw.lp[l as usize] - expert) * gb, l).unwrap_or(la);
                last = la;
                self.grads.add_layer(b, plan, (lw.lp[l as usize] - expert) * gb, expert * gb, la);
            }
        }
        if c == 0 && !lw.frozen && ub.edges {
            let (_, la) = self.unit(b, at, &ub.embed, -1, Phase::Backward, (0.0, ub.embed.saved), lw.first_params);
            last = la;
            if let Some(a) = self.accumulate(b, at, lw.first_params, -1) {
                last = a;
            }
            if at.sync_grads {
                self.grads.add(lw.first_params * gb);
            }
        }
        if at.sync_grads {
            self.grads.flush(b, plan, last);
        }
        self.link(b, links, at, Pass::Backward, gathered, (first, last));
        // The trainer's metrics over this micro-batch's logits, once its backward is done
        // (Composer's `_eval_train_metrics`): on the compute stream, after the gradient is on
        // its way to the previous stage.
        if c == lw.chunks - 1 && ub.edges && !ub.metrics.ops.is_empty() {
            emit_block(b, &st.ctx, &ub.metrics, HEAD, Phase::Forward, c, mb, 0.0, 0.0);
        }
    }

    /// Layer `l`'s backward: its gather (which also serves the recomputation), the fetch of
    /// its offloaded activations, the recomputation the plan asks for, the backward ops and
    /// the gradient accumulation. Returns the first and last task ids as [`emit_block`] does.
    fn backward_layer(&mut self, b: &mut Builder, at: &At, l: u32) -> (u32, u32) {
        let (lw, st) = (self.lw, self.st);
        let (plan, ctx, c, mb) = (lw.plan, &st.ctx, at.c, at.mb);
        let layer = at.ub.layer(l);
        let mut free = layer.saved;
        let g = if lw.per_unit {
            self.gathers.before(b, plan, st.r, st.stage, lw.lp[l as usize], l as i32)
        } else {
            Vec::new()
        };
        let fetched = self.act.fetch(b, ctx, layer.saved, (c, mb, l));
        let mut unit_first = self.copy_out(b, at, lw.lp[l as usize], l as i32, Phase::Backward).map_or(NONE, |c| c.0);
        match layer.recompute {
            Recompute::Full => {
                let rerun = if plan.framework.recompute_early_stop { Rerun::EarlyStop } else { Rerun::Full };
                let (f, _) = emit_recompute(b, ctx, layer, l as i32, c, mb, rerun, layer.saved_full);
                if unit_first == NONE {
                    unit_first = f;
                }
                // What the rerun allocated (nothing where early stopping reruns no op of the
                // layer: a layer that is one GEMM).
                if f != NONE {
                    free += layer.saved_full;
                }
            }
            Recompute::Selective => {
                let (f, _) = emit_recompute(b, ctx, layer, l as i32, c, mb, Rerun::Selective, 0.0);
                if unit_first == NONE {
                    unit_first = f;
                }
            }
            Recompute::None => {}
        }
        let (f, mut la) = emit_block(b, ctx, layer, l as i32, Phase::Backward, c, mb, 0.0, free);
        if let Some(a) = self.accumulate(b, at, lw.lp[l as usize], l as i32) {
            la = a;
        }
        if unit_first == NONE {
            unit_first = f;
        }
        if lw.per_unit {
            self.gathers.after(b, ctx, &g, unit_first, la);
        }
        self.act.fetched_before(b, &fetched, unit_first);
        (unit_first, la)
    }

    /// Tasks of a step are laid out device-major per op; recover each device's first and last
    /// task by offset within the group. Records each device's first task of the step (or the
    /// receivers' all-gather) for the send into it, and sends the step's output to the next
    /// chunk (forward) or its input gradient to the previous one (backward).
    fn link(&self, b: &mut Builder, links: &mut Links, at: &At, pass: Pass, gathered: u32, (first, last): (u32, u32)) {
        let (lw, st) = (self.lw, self.st);
        let (plan, t, c, mb) = (lw.plan, lw.ranks, at.c, at.mb);
        for x in 0..t {
            let k = links.key(st.r, c, mb, x);
            let head = if gathered != NONE { gathered } else { first + x };
            let src = st.group()[x as usize];
            match pass {
                Pass::Forward => {
                    links.fwd_first[k] = head;
                    if c + 1 < lw.chunks {
                        let dst = plan.device(st.r, (c + 1) % plan.pp, x);
                        let bytes = p2p::send_share(lw, at.bnd_out);
                        links.fwd_send[k] = p2p::send(b, src, dst, bytes, last + x - (t - 1), c, mb, Phase::Forward);
                    }
                }
                Pass::Backward => {
                    links.bwd_first[k] = head;
                    if c > 0 {
                        let dst = plan.device(st.r, (c - 1) % plan.pp, x);
                        let bytes = p2p::send_share(lw, at.bnd_in);
                        links.bwd_send[k] = p2p::send(b, src, dst, bytes, last + x - (t - 1), c, mb, Phase::Backward);
                    }
                }
            }
        }
    }
}
