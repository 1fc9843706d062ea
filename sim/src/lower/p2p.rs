//! Pipeline point-to-point: the sends of boundary activations and gradients between stages,
//! Megatron's scatter-gather of them over the tensor-parallel group, and the dependencies
//! from each send to the step that receives it.

use super::builder::{Builder, StepCtx};
use super::context::Lowering;
use super::program::*;
use super::tensor_parallel::collective_on_compute;
use crate::report::timeline::{Label, Phase, StreamKind};
use crate::workload::{Axis, TpMode};

/// Each (replica, chunk, unit, lowered tp rank)'s first task per pass (what a send to it feeds) and its
/// send per pass, until [`Links::connect`] joins them.
pub(super) struct Links {
    chunks: u32,
    m: u32,
    t: u32,
    pub(super) fwd_first: Vec<u32>,
    pub(super) bwd_first: Vec<u32>,
    pub(super) fwd_send: Vec<u32>,
    pub(super) bwd_send: Vec<u32>,
}

impl Links {
    pub(super) fn new(lw: &Lowering) -> Links {
        let (chunks, m, t) = (lw.chunks, lw.m, lw.ranks);
        let slots = (lw.replicas.len() as u32 * chunks * m * t) as usize;
        Links {
            chunks,
            m,
            t,
            fwd_first: vec![NONE; slots],
            bwd_first: vec![NONE; slots],
            fwd_send: vec![NONE; slots],
            bwd_send: vec![NONE; slots],
        }
    }

    /// The slot of (replica, chunk, unit, tp rank).
    pub(super) fn key(&self, r: u32, c: u32, mb: u32, x: u32) -> usize {
        (((r * self.chunks + c) * self.m + mb) * self.t + x) as usize
    }

    /// Connect sends to their receivers: a forward send of chunk c to chunk c+1's forward of
    /// the same unit, a backward send to chunk c-1's backward.
    pub(super) fn connect(&self, b: &mut Builder, replicas: &[u32]) {
        let chunks = self.chunks;
        for &r in replicas {
            for c in 0..chunks {
                for mb in 0..self.m {
                    for x in 0..self.t {
                        let k = self.key(r, c, mb, x);
                        if c + 1 < chunks && self.fwd_send[k] != NONE {
                            b.p.deps.push((self.fwd_send[k], self.fwd_first[self.key(r, c + 1, mb, x)]));
                        }
                        if c > 0 && self.bwd_send[k] != NONE {
                            b.p.deps.push((self.bwd_send[k], self.bwd_first[self.key(r, c - 1, mb, x)]));
                        }
                    }
                }
            }
        }
    }
}

/// Megatron's scatter-gather: with 1D tensor parallelism (no sequence parallelism) every rank
/// holds the whole boundary activation, so each sends a 1/t share and the receivers all-gather
/// it over their fast links.
pub(super) fn scatter_gather(lw: &Lowering) -> bool {
    let plan = lw.plan;
    lw.t > 1 && plan.tp_mode == TpMode::OneD && !plan.sequence_parallel
}

/// Bytes one rank sends of a boundary of `bytes`: all of it with 1D tensor parallelism and no
/// scatter-gather, else its share (scatter-gather, or the sharded modes' own shard).
pub(super) fn send_share(lw: &Lowering, bytes: f64) -> f64 {
    if lw.plan.tp_mode == TpMode::OneD && !scatter_gather(lw) { bytes } else { bytes / lw.t as f64 }
}

/// Under scatter-gather, the receivers' all-gather of a boundary of `boundary_bytes` on their
/// compute streams (its task is what the send feeds); else nothing ([`NONE`]).
pub(super) fn receive(
    b: &mut Builder,
    lw: &Lowering,
    ctx: &StepCtx,
    phase: Phase,
    boundary_bytes: f64,
    chunk: u32,
    mb: u32,
) -> u32 {
    if !scatter_gather(lw) {
        return NONE;
    }
    let label = b.label(Label { op: "recv_allgather", layer: -1, phase, chunk });
    collective_on_compute(b, ctx, CollectiveKind::AllGather, (Axis::Tensor, 0), boundary_bytes, label, mb);
    (b.p.tasks.len() - 1) as u32
}

/// A send of `bytes` from `src` to `dst` on the source's pipeline-send stream, after task
/// `after`; under blocking point-to-point the source's next compute task waits for it.
/// Returns the send (or `after` when source and target are one device).
pub(super) fn send(
    b: &mut Builder,
    src: u32,
    dst: u32,
    bytes: f64,
    after: u32,
    chunk: u32,
    mb: u32,
    phase: Phase,
) -> u32 {
    let si = b.dev_index[src as usize];
    if src == dst {
        // Same device (interleaved chunks with one stage): no transfer, a plain dependency.
        return after;
    }
    let label = b.label(Label { op: "send", layer: -1, phase, chunk });
    b.p.transfers.push(Transfer { source: src, target: dst, bytes });
    let id = (b.p.transfers.len() - 1) as u32;
    let s = Program::stream_index(si, StreamKind::PipelineSend);
    let task = b.task(TaskKind::Transfer, id, label, mb, &[s]);
    b.p.deps.push((after, task));
    if let Some(held) = b.held_sends.as_mut() {
        held[Program::stream_index(si, StreamKind::Compute) as usize].push(task);
    }
    task
}
