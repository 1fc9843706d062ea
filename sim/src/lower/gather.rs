//! ZeRO-3 (FSDP) parameter gathers before each use of a unit (a layer, the embedding, the
//! head), with the fetch from the host tier when parameters are offloaded, and Gemini's chunk
//! moves before each access.
//!
//! How far gathers run ahead of compute is decided in one place, [`Gathers::gate`].

use super::builder::{Builder, StepCtx};
use super::context::Lowering;
use super::data_parallel::{PARAM_GATHER_STREAM, dp_collective};
use super::gemini;
use super::program::*;
use crate::plan::{Plan, Tier};
use crate::report::timeline::{Label, Phase};

/// ZeRO-3 parameter gathers around each unit (a layer, the embedding, the head), and
/// Gemini's chunk moves before each.
pub(super) struct Gathers {
    /// Device-0 ids of the latest units' first compute tasks, newest last, at most
    /// `prefetch` of them (see [`Gathers::gate`]).
    firsts: std::collections::VecDeque<u32>,
    /// Units whose gathers may run ahead of the unit computing (the framework's prefetch;
    /// 0: a gather waits for the previous unit to finish).
    prefetch: u32,
    /// Where parameters live between uses (`plan.offload.params`): off the device, each
    /// gather first fetches this device's shard.
    host: Tier,
    /// Label of the parameter fetches, made on first use.
    unit_label: u32,
    /// Gemini: chunks move in the operator's hook, after the previous unit has run (no
    /// prefetch), and every access is logged for the warm-up statistics.
    dynamic: bool,
    /// Gemini's steady-state moves per access, as (to device, bytes); `None` in the warm-up.
    moves: Option<Vec<Vec<(bool, f64)>>>,
    /// Accesses so far.
    count: usize,
    /// Device-0 id of the previous unit's last compute task (see [`Gathers::gate`]).
    prev_last: u32,
    /// The unit being gathered and its parameters (logged by `after`).
    pending: (i32, f64),
    /// Bytes per parameter of the gathered weights.
    wb: f64,
    /// Labels of chunk fetches and evictions.
    labels: (u32, u32),
    /// Each transformer layer's gather as its modules' shares of the layer's parameters, one
    /// all-gather each (DeepSpeed ZeRO-3 fetches module by module); `[1.0]`: one per layer.
    modules: Vec<f64>,
    /// Per entry of `modules`, its parameter tensors that are gathered (those under DeepSpeed's
    /// persistence threshold stay gathered after the first step: an entry with none, a norm,
    /// is never gathered); under `framework.gather_per_tensor` one all-gather each.
    gathered: Vec<f64>,
    /// Under `framework.gather_per_tensor`, the tensors a layer's list collectives handle
    /// beyond `gathered`; `None` otherwise.
    tensors: Option<PerTensor>,
}

/// The parameter tensors a list reduce-scatter handles one by one
/// (`framework.gather_per_tensor`): a layer's (all of them), and an edge unit's (the
/// embedding's or the head's, gathered and reduced alike).
struct PerTensor {
    reduced: f64,
    edge: f64,
}

/// A transformer layer's parameter tensors per module of [`module_shares`], as elements on one
/// of `tp` tensor-parallel ranks: a weight, and a bias where the model has them (a LayerNorm
/// has both, an RMSNorm a weight). A linear layer's weight is its share of the layer's
/// parameters; its bias is as wide as its output (the MLP's last matrix: the hidden size).
fn module_tensor_sizes(t: &crate::workload::TransformerConfig, tp: f64) -> Vec<Vec<f64>> {
    let h = t.hidden as f64;
    let norm = match t.norm {
        crate::workload::transformer::Norm::LayerNorm => vec![h, h],
        crate::workload::transformer::Norm::RmsNorm => vec![h],
    };
    let shares = module_shares(t);
    let total = t.layer_parameters() / tp.max(1.0);
    let linear = |m: usize, out: f64| {
        let weight = shares.get(m).copied().unwrap_or(0.0) * total;
        if t.bias { vec![weight, out] } else { vec![weight] }
    };
    let matrices = t.mlp_matrices() as usize;
    let mut parts = vec![norm.clone(), linear(1, (t.q_width() + 2.0 * t.kv_width()) / tp), linear(2, h), norm];
    for k in 0..matrices {
        let out = if k + 1 == matrices { h } else { t.ffn_hidden as f64 / tp };
        parts.push(linear(4 + k, out));
    }
    parts
}

/// A transformer layer's parameter tensors (see [`module_tensor_sizes`]).
pub(super) fn layer_tensors(t: &crate::workload::TransformerConfig) -> f64 {
    module_tensor_sizes(t, 1.0).iter().map(|m| m.len() as f64).sum()
}

/// The tensors per module (`per_module`; else the layer's total as one entry) that a list
/// collective handles: those of at least `threshold` elements (0: all).
fn module_tensors(sizes: &[Vec<f64>], per_module: bool, threshold: f64) -> Vec<f64> {
    let parts: Vec<f64> = sizes.iter().map(|m| m.iter().filter(|&&n| n >= threshold).count() as f64).collect();
    if per_module { parts } else { vec![parts.iter().sum()] }
}

/// A transformer layer's modules as shares of its parameters, in the order a forward pass
/// meets them: norm, attention's input projection, its output projection, norm, and each MLP
/// matrix (an MoE layer's experts count as its MLP).
fn module_shares(t: &crate::workload::TransformerConfig) -> Vec<f64> {
    let h = t.hidden as f64;
    let norm = match t.norm {
        crate::workload::transformer::Norm::LayerNorm => 2.0 * h,
        crate::workload::transformer::Norm::RmsNorm => h,
    };
    let (q, kv) = (t.q_width(), t.kv_width());
    let (attn_in, attn_out) = (h * (q + 2.0 * kv), q * h);
    let total = t.layer_parameters();
    let matrices = t.mlp_matrices();
    let mlp = ((total - attn_in - attn_out - 2.0 * norm) / matrices).max(0.0);
    let mut parts = vec![norm, attn_in, attn_out, norm];
    parts.extend(std::iter::repeat_n(mlp, matrices as usize));
    let sum: f64 = parts.iter().sum();
    if sum.is_nan() || sum <= 0.0 {
        return vec![1.0];
    }
    parts.iter().map(|p| p / sum).collect()
}

/// DeepSpeed's persistence threshold under per-module gathering (elements); 0 otherwise.
fn persistence_threshold(lw: &Lowering) -> f64 {
    match lw.plan.framework.gather {
        crate::framework::Gather::PerModule { persistence_threshold, .. } => persistence_threshold,
        crate::framework::Gather::PerLayer { .. } => 0.0,
    }
}

impl Gathers {
    /// The gathers of one stage; `moves` are Gemini's steady-state moves per access (`None`
    /// outside Gemini and in its warm-up).
    pub(super) fn new(lw: &Lowering, moves: Option<Vec<Vec<(bool, f64)>>>) -> Gathers {
        let t = &lw.s.workload.transformer;
        let per_module = matches!(lw.plan.framework.gather, crate::framework::Gather::PerModule { .. })
            && lw.s.workload.net.is_none();
        let modules = if per_module { module_shares(t) } else { vec![1.0] };
        let gathered = if per_module || lw.per_tensor {
            let sizes = module_tensor_sizes(t, lw.t as f64);
            module_tensors(&sizes, modules.len() > 1, persistence_threshold(lw))
        } else {
            vec![1.0]
        };
        Gathers {
            firsts: std::collections::VecDeque::new(),
            prefetch: match lw.plan.framework.gather {
                crate::framework::Gather::PerLayer { prefetch } => prefetch,
                // DeepSpeed prefetches up to a bucket of parameters: the layers it holds,
                // at least the next one.
                crate::framework::Gather::PerModule { prefetch_bucket_params, .. } => {
                    let layer = lw.lp.iter().copied().fold(0.0, f64::max).max(1.0);
                    ((prefetch_bucket_params / layer).floor() as u32).clamp(1, 64)
                }
            },
            host: lw.plan.offload.params,
            unit_label: NONE,
            dynamic: lw.dynamic.is_some(),
            moves,
            count: 0,
            prev_last: NONE,
            pending: (0, 0.0),
            wb: lw.wb,
            labels: (NONE, NONE),
            gathered,
            modules,
            tensors: lw.per_tensor.then(|| PerTensor {
                reduced: layer_tensors(t),
                // The embedding or the head: its weight (and a learned position table where
                // positions are not rotary).
                edge: if t.rotary { 1.0 } else { 2.0 },
            }),
        }
    }

    /// Under `framework.gather_per_tensor`, the copies out of a unit's list all-gathers
    /// (`gather`) or into its list reduce-scatters: one per rank of the data-parallel group and
    /// per parameter tensor of `unit` (a layer; -1: the embedding or the head) that is gathered,
    /// or reduced. `None` otherwise.
    pub(super) fn list_copies(&self, plan: &Plan, unit: i32, gather: bool) -> Option<f64> {
        let t = self.tensors.as_ref()?;
        let layer = if gather { self.gathered.iter().sum() } else { t.reduced };
        let tensors = if unit < 0 { t.edge } else { layer };
        Some(plan.shard_degree() as f64 * tensors)
    }

    /// The prefetch decision: the task (device 0 of the group; device x waits for the one x
    /// ids later) that the next unit's first fetch or gather waits for. ZeRO-3 with a prefetch
    /// of k units waits for the first compute task of the unit k back (k = 1: FSDP's
    /// implicit forward prefetch and BACKWARD_PRE, two all-gathers in flight); with none, for
    /// the previous unit's last task. Gemini waits for the previous unit's last, no prefetch
    /// (its chunks move in the operator's hook). [`NONE`] before the stage's first unit.
    fn gate(&self) -> u32 {
        if self.dynamic || self.prefetch == 0 {
            return self.prev_last;
        }
        if (self.firsts.len() as u32) < self.prefetch {
            return NONE;
        }
        self.firsts.front().copied().unwrap_or(NONE)
    }

    /// Fetch (from the host tier if offloaded, or Gemini's moves) and all-gather a unit of
    /// `params` parameters (unsharded) for every lowered device of the group; returns the task each
    /// device's compute waits for ([`NONE`] if nothing).
    pub(super) fn before(
        &mut self,
        b: &mut Builder,
        plan: &Plan,
        r: u32,
        stage: u32,
        params: f64,
        unit: i32,
    ) -> Vec<u32> {
        let bytes = params * self.wb;
        if self.dynamic {
            return self.before_dynamic(b, plan, r, stage, params, unit);
        }
        if self.unit_label == NONE {
            self.unit_label = b.label(Label { op: "param_fetch", layer: -1, phase: Phase::Sync, chunk: stage });
        }
        let parts = self.shares(bytes, unit);
        (0..b.ranks)
            .map(|x| {
                let mut copy = NONE;
                if self.host != Tier::Device {
                    let d = plan.device(r, stage, x);
                    copy = b.host_copy(
                        d,
                        true,
                        bytes / plan.shard_degree() as f64,
                        self.host == Tier::Nvme,
                        self.unit_label,
                    );
                }
                gather_after_copies(b, plan, (r, stage, x), &parts, (copy, copy), self.gate(), self.stream())
            })
            .collect()
    }

    /// The stream the gathers run on: their own, so they overlap compute and the gradient
    /// reductions; under `framework.gather_per_tensor`, the reductions' (one NCCL stream for
    /// the group's collectives, whose completion the host waits for before the module runs:
    /// DeepSpeed 2021's `torch.cuda.synchronize()`).
    fn stream(&self) -> crate::report::timeline::StreamKind {
        if self.tensors.is_some() { super::data_parallel::GRAD_SYNC_STREAM } else { PARAM_GATHER_STREAM }
    }

    /// Bytes of a unit of `params` parameters once gathered, on each device.
    pub(super) fn unit_bytes(&self, params: f64) -> f64 {
        params * self.wb
    }

    /// The all-gathers of a unit of `bytes`, as (bytes per call, calls): one per module of a
    /// transformer layer under per-module gathering, else one; under
    /// `framework.gather_per_tensor` one call per parameter tensor (the bytes split evenly
    /// over them, the latency paid per call).
    fn shares(&self, bytes: f64, unit: i32) -> Vec<(f64, u64)> {
        let edge_or_layer = unit < 0 || self.modules.len() == 1;
        let parts: Vec<f64> =
            if edge_or_layer { vec![bytes] } else { self.modules.iter().map(|m| m * bytes).collect() };
        let Some(t) = &self.tensors else {
            // Coalesced: a module whose tensors all persist is not gathered.
            return parts
                .into_iter()
                .zip(&self.gathered)
                .filter(|&(_, &n)| edge_or_layer || n >= 1.0)
                .map(|(p, _)| (p, 1))
                .collect();
        };
        let counts: Vec<f64> = if unit < 0 { vec![t.edge] } else { self.gathered.clone() };
        // Each gathered tensor its own call (a module with none is not gathered); the bytes
        // split evenly over them.
        parts.into_iter().zip(counts).filter(|&(_, n)| n >= 1.0).map(|(p, n)| (p / n, n as u64)).collect()
    }

    fn before_dynamic(&mut self, b: &mut Builder, plan: &Plan, r: u32, stage: u32, params: f64, unit: i32) -> Vec<u32> {
        if self.labels.0 == NONE {
            self.labels = (
                b.label(Label { op: "chunk_fetch", layer: -1, phase: Phase::Sync, chunk: stage }),
                b.label(Label { op: "chunk_evict", layer: -1, phase: Phase::Sync, chunk: stage }),
            );
        }
        let k = self.count;
        self.count += 1;
        self.pending = (unit, params);
        // Each access's moves are emitted once.
        let moves = self.moves.as_mut().map(|m| std::mem::take(&mut m[k])).unwrap_or_default();
        (0..b.ranks)
            .map(|x| {
                let d = plan.device(r, stage, x);
                let di = b.dev_index[d as usize];
                let (mut head, mut tail) = (NONE, NONE);
                for &(to_device, bytes) in &moves {
                    let label = if to_device { self.labels.0 } else { self.labels.1 };
                    let copy = b.host_copy(d, to_device, bytes, false, label);
                    // A fetched chunk takes room when its copy starts; an evicted one frees
                    // it when its copy ends.
                    b.memory_event(
                        copy,
                        MemoryEvent {
                            device: di,
                            at_end: !to_device,
                            activation_bytes: 0.0,
                            buffer_bytes: if to_device { bytes } else { -bytes },
                            next: NONE,
                            tag: memory_tag(unit),
                        },
                    );
                    if head == NONE {
                        head = copy;
                    }
                    tail = copy;
                }
                gather_after_copies(
                    b,
                    plan,
                    (r, stage, x),
                    &[(params * self.wb, 1)],
                    (head, tail),
                    self.gate(),
                    PARAM_GATHER_STREAM,
                )
            })
            .collect()
    }

    /// The unit's compute (first task `first`, last task of the group's last device `last`)
    /// waits for its gather.
    pub(super) fn after(&mut self, b: &mut Builder, ctx: &StepCtx, gathers: &[u32], first: u32, last: u32) {
        for (x, &g) in gathers.iter().enumerate() {
            if g != NONE {
                b.p.deps.push((g, first + x as u32));
            }
        }
        let t = ctx.streams.len() as u32;
        self.prev_last = last + 1 - t;
        if self.dynamic {
            b.unit_log.push(gemini::UnitAccess {
                device: b.dev_index[ctx.group[0] as usize],
                unit: self.pending.0,
                params: self.pending.1,
                first_task: first,
            });
        }
        self.firsts.push_back(first);
        while self.firsts.len() as u32 > self.prefetch.max(1) {
            self.firsts.pop_front();
        }
    }
}

/// The all-gathers of a unit (one per entry of `bytes`, as (bytes per call, calls), in order on
/// `stream`) for
/// tensor-parallel rank `x` (none without data-parallel peers) after its host copies
/// `first..=last` (on the host-copy stream, in order; [`NONE`] if none); the first of them, or
/// the first gather, waits for task `wait + x` of the previous unit. Returns what the unit's
/// compute waits for ([`NONE`] if nothing).
fn gather_after_copies(
    b: &mut Builder,
    plan: &Plan,
    (r, stage, x): (u32, u32, u32),
    bytes: &[(f64, u64)],
    (first, last): (u32, u32),
    wait: u32,
    stream: crate::report::timeline::StreamKind,
) -> u32 {
    let (mut first_gather, mut g) = (NONE, last);
    if plan.shard_degree() > 1 {
        for &part in bytes {
            g = dp_collective(b, plan, r, stage, x, CollectiveKind::AllGather, part, "param_gather", stream);
            if first_gather == NONE {
                first_gather = g;
            }
        }
    }
    if last != NONE && first_gather != NONE {
        b.p.deps.push((last, first_gather));
    }
    let head = if first != NONE {
        first
    } else if first_gather != NONE {
        first_gather
    } else {
        g
    };
    if wait != NONE && head != NONE {
        b.p.deps.push((wait + x, head));
    }
    g
}
