//! What selective recomputation keeps and reruns of a layer, module by module: Megatron-Core's
//! `recompute_modules` (see [`crate::plan::RecomputeModules`]).
//!
//! Each op keeps what its own backward needs ([`super::Saved`], mostly its input). A module
//! checkpointed whole (`mlp`, `moe`, `shared_experts`) keeps its first op's input and reruns
//! every op (and collective) it spans. An output-discarding module (`layernorm`,
//! `mla_up_proj`, `moe_act`) reruns its ops, and the consumer of its output stops keeping that
//! output. `core_attn` reruns the core attention (materialised scores and softmax), as
//! Korthikanti et al.'s selective recomputation.

use super::LayerOp;
use crate::plan::{Recompute, RecomputeModules};

/// One op under selective recomputation: whether it runs again before the layer's backward,
/// and the activation bytes it keeps for backward.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Selective {
    pub rerun: bool,
    pub kept: f64,
}

fn name(op: &LayerOp) -> &'static str {
    match op {
        LayerOp::Compute(s) => s.name,
        LayerOp::Comm { name, .. } => name,
    }
}

/// Each of `ops` under selective recomputation of `modules`; `input_bytes` is the layer's
/// input, which per-op checkpointing (`op_sac`) keeps.
pub fn selective(ops: &[LayerOp], modules: RecomputeModules, input_bytes: f64) -> Vec<Selective> {
    if modules.contains("op_sac") {
        return op_sac(ops, input_bytes);
    }
    let mut out: Vec<Selective> = ops
        .iter()
        .map(|op| Selective { rerun: false, kept: op.compute().map_or(0.0, |s| s.saved.bytes(Recompute::None)) })
        .collect();
    let find = |n: &str| ops.iter().position(|op| name(op) == n);
    // The next compute op after `j` (collectives between are skipped).
    let consumer = |j: usize| (j + 1..ops.len()).find(|&k| ops[k].compute().is_some());
    if modules.contains("core_attn") {
        for (o, op) in out.iter_mut().zip(ops) {
            if let Some(s) = op.compute() {
                o.kept -= s.saved.selective_bytes;
                o.rerun |= s.saved.selective_bytes != 0.0 || s.name == "scores";
            }
        }
    }
    if modules.contains("layernorm") {
        // Megatron-Core's Transformer Engine layers fuse a norm into the linear it feeds
        // (`TELayerNormColumnParallelLinear`: qkv, fc1), leaving the module nothing to discard;
        // the norms before multi-head latent attention's down projections and before the MoE
        // router are modules of their own.
        for j in (0..ops.len()).filter(|&j| matches!(name(&ops[j]), "ln1" | "ln2")) {
            if let Some(k) = consumer(j).filter(|&k| matches!(name(&ops[k]), "q_down" | "router")) {
                out[j].rerun = true;
                out[k].kept = 0.0;
            }
        }
    }
    if modules.contains("mla_up_proj") {
        // The up projections' outputs (queries, keys and values after RoPE) are what the fused
        // attention keeps besides its output, the output projection's input.
        if let (Some(attn), Some(o)) = (find("flash_attn"), find("out_proj").and_then(|j| gemm_input_bytes(&ops[j]))) {
            let ups: Vec<usize> = ["q_up", "q_proj", "kv_up", "rope"].iter().filter_map(|n| find(n)).collect();
            if ups.iter().any(|&j| matches!(name(&ops[j]), "q_up" | "kv_up")) {
                for j in ups {
                    out[j].rerun = true;
                }
                out[attn].kept = out[attn].kept.min(o);
            }
        }
    }
    // Whole modules: the first op keeps the module's input, the others nothing; all rerun.
    if modules.contains("moe") && find("router").is_some() {
        let last = ["shared_add", "unpermute"].iter().find_map(|n| find(n));
        whole(&mut out, find("router"), last);
    } else {
        if modules.contains("moe_act")
            && let (Some(a), Some(f)) = (find("expert_act"), find("expert_fc2"))
        {
            out[a].rerun = true;
            out[f].kept = 0.0;
        }
        if modules.contains("shared_experts") {
            whole(&mut out, find("shared_fc1"), find("shared_fc2"));
        }
    }
    if modules.contains("mlp") {
        whole(&mut out, find("fc1"), find("fc2"));
    }
    out
}

/// PyTorch's per-op selective activation checkpointing as torchtitan applies it to each layer
/// (`selective_ac_option = "op"`; torchtitan e7c0cae `models/llama3/parallelize_llama.py`
/// `_save_list` and `_custom_policy`, also 9dec370): the layer keeps its input and the output
/// of every op on the save list, the matrix products (`aten.mm`) but every second one in
/// forward order, the fused attention kernels and the tensor-parallel reduce-scatters, and
/// reruns every other op before its backward. The rerun is PyTorch's non-reentrant checkpoint,
/// which stops once the last tensor the backward needs is rebuilt
/// ([`crate::lower`]'s early stop): the ops after it (the residual add) do not run again.
/// Batched products (materialised attention's scores, grouped expert GEMMs) are other aten
/// ops, off the list: rerun. Collectives other than reduce-scatters are rerun too, and the
/// copies DTensor makes around them, but for a reduce-scatter's input copy.
fn op_sac(ops: &[LayerOp], input_bytes: f64) -> Vec<Selective> {
    let end = early_stop_end(ops);
    let mut mm = 0;
    let mut out: Vec<Selective> = ops
        .iter()
        .enumerate()
        .map(|(j, op)| {
            let kept = match op {
                LayerOp::Compute(s) => match s.class {
                    super::OpClass::Gemm { batch: 1.0, .. } => {
                        mm += 1;
                        (mm % 2 == 1).then(|| gemm_output_bytes(op).unwrap_or(0.0))
                    }
                    super::OpClass::Attention { .. } => Some(attention_output_bytes(s)),
                    // DTensor's copy into a reduce-scatter's input (`tp_layout_copy`) feeds
                    // only the saved reduce-scatter: nothing to rebuild.
                    _ if s.name == "tp_layout_copy"
                        && matches!(
                            ops.get(j + 1),
                            Some(LayerOp::Comm { forward: Some(super::Comm::ReduceScatter), .. })
                        ) =>
                    {
                        Some(0.0)
                    }
                    _ => None,
                },
                LayerOp::Comm { forward, .. } => (*forward == Some(super::Comm::ReduceScatter)).then_some(0.0),
            };
            match kept {
                Some(kept) => Selective { rerun: false, kept },
                None => Selective { rerun: j < end && !matches!(op, LayerOp::Comm { forward: None, .. }), kept: 0.0 },
            }
        })
        .collect();
    if let Some(first) = out.first_mut() {
        first.kept += input_bytes;
    }
    out
}

/// How many of a layer's ops a recomputation that stops early runs (PyTorch's non-reentrant
/// checkpoint stops once every tensor the backward saved is rebuilt): up to the last op that
/// keeps anything for backward, without it when it is a GEMM (which keeps only its input,
/// saved before its kernel runs).
pub fn early_stop_end(ops: &[LayerOp]) -> usize {
    let is_gemm = |op: &LayerOp| op.compute().is_some_and(|s| matches!(s.class, super::OpClass::Gemm { .. }));
    ops.iter()
        .rposition(|op| op.compute().is_some_and(|s| s.saved.bytes(Recompute::None) > 0.0))
        .map_or(0, |j| if is_gemm(&ops[j]) { j } else { j + 1 })
}

/// Bytes of a fused attention kernel's output: its forward reads the queries, keys and values
/// and writes an output the queries' size; it keeps its inputs (`workload::transformer`), so
/// the output is its traffic less what it keeps. (Its log-sum-exp, 4 bytes a head and token,
/// is left out: under 2% of the output at a head width of 64 or more in 16-bit.)
fn attention_output_bytes(s: &super::OpSpec) -> f64 {
    if matches!(s.class, super::OpClass::Attention { part: super::context_ring::RingPart::Remote, .. }) {
        // A ring's remote steps merge into the output the local step wrote.
        return 0.0;
    }
    (s.forward_bytes - s.saved.bytes(Recompute::None)).max(0.0)
}

/// Bytes of a GEMM's output (m x n per batch) at the bytes per element its traffic implies.
fn gemm_output_bytes(op: &LayerOp) -> Option<f64> {
    gemm_part_bytes(op, |m, n, _| m * n)
}

/// Bytes of a GEMM's input (m x k per batch) at the bytes per element its traffic implies.
fn gemm_input_bytes(op: &LayerOp) -> Option<f64> {
    gemm_part_bytes(op, |m, _, k| m * k)
}

fn gemm_part_bytes(op: &LayerOp, part: impl Fn(f64, f64, f64) -> f64) -> Option<f64> {
    let s = op.compute()?;
    let super::OpClass::Gemm { batch, m, n, k } = s.class else { return None };
    let elems = batch * (m * k + k * n + m * n);
    (elems > 0.0).then(|| s.forward_bytes / elems * batch * part(m, n, k))
}

/// A module checkpointed whole over ops `first..=last`: all rerun, the first keeps its input.
fn whole(out: &mut [Selective], first: Option<usize>, last: Option<usize>) {
    if let (Some(a), Some(b)) = (first, last) {
        for (j, o) in out.iter_mut().enumerate().take(b + 1).skip(a) {
            o.rerun = true;
            if j > a {
                o.kept = 0.0;
            }
        }
    }
}

/// Whether selective recomputation of `modules` reruns anything of `ops`.
pub fn reruns_anything(ops: &[LayerOp], modules: RecomputeModules) -> bool {
    selective(ops, modules, 0.0).iter().any(|o| o.rerun)
}

/// Activation bytes `ops` keep under `recompute` (selective: of `modules`, with the layer's
/// `input_bytes`; full recomputation is handled per layer by the caller).
pub fn kept_bytes(ops: &[LayerOp], recompute: Recompute, modules: RecomputeModules, input_bytes: f64) -> f64 {
    match recompute {
        Recompute::Selective => selective(ops, modules, input_bytes).iter().map(|o| o.kept).sum(),
        _ => ops.iter().filter_map(LayerOp::compute).map(|o| o.saved.bytes(recompute)).sum(),
    }
}
