//! Mixture-of-experts layers and multi-head latent attention (MLA), the two departures of
//! today's frontier models from the dense decoder of [`super::transformer`].
//!
//! A mixture-of-experts layer replaces the MLP: a router (an `h x E` matrix) scores each token
//! against `E` routed experts and sends it to its `k` best; every expert is a gated MLP of its
//! own (`expert_ffn` wide); shared experts, if any, see every token. Forward, one layer runs:
//!
//! ```text
//! x ─ ln2 ─ router ─ top-k ─ permute ─ expert fc1 ─ act ─ expert fc2 ─ unpermute+combine ─ + ─> y
//!                 └──────────── shared fc1 ─ act ─ shared fc2 (when shared experts exist) ─┘
//! ```
//!
//! Without expert parallelism all experts live on every device of a tensor-parallel group,
//! split like the dense MLP (Megatron-Core's layout with expert tensor parallelism equal to
//! tensor parallelism and expert parallelism 1; `moe_token_dispatcher_type` "allgather": the
//! sequence-parallel all-gather and reduce-scatter around the MLP are the dense layer's; with
//! `plan.ep` > 1 see [`ep_mlp_ops`]). Every expert's rows
//! run as one grouped GEMM (`batch` = experts): dropless routing computes `tokens x k` rows,
//! a capacity factor `c` pads every expert to `c x tokens x k / E` rows (GShard, Switch).
//!
//! Sources: Mixtral (Jiang et al. 2024, arXiv 2401.04088, Table 1), DeepSeek-V3 (DeepSeek-AI
//! 2024, arXiv 2412.19437, sections 2.1 and 4.2), Qwen3 (Qwen team 2025, arXiv 2505.09388,
//! Table 2) and their Hugging Face `config.json` files; Megatron-Core `core_r0.9.0`
//! `megatron/core/transformer/moe/` (router, token dispatchers, grouped GEMM experts).

use super::{LayerOp, Saved};
use serde::Serialize;

/// Routed and shared experts of a mixture-of-experts model.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Moe {
    /// Routed experts per MoE layer (E).
    pub experts: u32,
    /// Experts each token is sent to (k).
    pub top_k: u32,
    /// Hidden width of one routed expert's MLP.
    pub expert_ffn: u32,
    /// Hidden width of the shared experts together (0: none). DeepSeek-V3's one shared
    /// expert is `expert_ffn` wide; Qwen1.5/2-MoE's is `shared_expert_intermediate_size`.
    pub shared_ffn: u32,
    /// The first layers keep a dense MLP of the model's `ffn_hidden` (DeepSeek-V3's
    /// `first_k_dense_replace` = 3); the rest are MoE layers.
    pub dense_layers: u32,
    /// Rows an expert computes, as a multiple of the mean `tokens x k / E`, padded to it when
    /// positive (GShard/Switch capacity); 0: dropless (every routed token computed once).
    pub capacity_factor: f64,
    /// Under expert parallelism, the busiest expert-parallel rank's routed rows over the
    /// mean (>= 1; 1: balanced routing, the auxiliary loss's goal). The simulated rank is the
    /// busiest: the synchronising all-to-alls wait for it.
    pub imbalance: f64,
}

impl Moe {
    /// Parameters of one MoE layer's MLP part: routed and shared experts (gated MLPs of
    /// `matrices` matrices) and the router.
    pub fn mlp_parameters(&self, h: f64, matrices: f64) -> f64 {
        let routed = self.experts as f64 * matrices * h * self.expert_ffn as f64;
        let shared = matrices * h * self.shared_ffn as f64;
        routed + shared + self.router_parameters(h)
    }

    /// The part one token uses: its `k` routed experts, the shared ones and the router.
    pub fn active_mlp_parameters(&self, h: f64, matrices: f64) -> f64 {
        let routed = self.top_k as f64 * matrices * h * self.expert_ffn as f64;
        routed + matrices * h * self.shared_ffn as f64 + self.router_parameters(h)
    }

    fn router_parameters(&self, h: f64) -> f64 {
        h * self.experts as f64
    }

    /// Rows the experts compute for `tokens` routed tokens, all experts together.
    pub fn expert_rows(&self, tokens: f64) -> f64 {
        let routed = tokens * self.top_k as f64;
        if self.capacity_factor > 0.0 { routed * self.capacity_factor } else { routed }
    }
}

/// Multi-head latent attention (DeepSeek-V2/V3): queries and keys/values pass through
/// low-rank latents; each head's query and key have a position-free part and a rotary part.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Mla {
    /// Rank of the query latent (0: queries are projected directly).
    pub q_lora_rank: u32,
    pub kv_lora_rank: u32,
    pub qk_nope_head_dim: u32,
    pub qk_rope_head_dim: u32,
    pub v_head_dim: u32,
}

impl Mla {
    pub fn qk_head_dim(&self) -> f64 {
        (self.qk_nope_head_dim + self.qk_rope_head_dim) as f64
    }

    /// Parameters of the attention part (projections and the latents' RMSNorms) for `heads`
    /// heads at model width `h`.
    pub fn parameters(&self, h: f64, heads: f64) -> f64 {
        let qk = self.qk_head_dim();
        let q = if self.q_lora_rank > 0 {
            let r = self.q_lora_rank as f64;
            h * r + r + r * heads * qk
        } else {
            h * heads * qk
        };
        let c = self.kv_lora_rank as f64;
        let kv =
            h * (c + self.qk_rope_head_dim as f64) + c + c * heads * (self.qk_nope_head_dim + self.v_head_dim) as f64;
        let out = heads * self.v_head_dim as f64 * h;
        q + kv + out
    }

    /// The projections before attention, on `tokens` tokens, split over `t` ranks: the
    /// down-projections (into the latents) are small and kept whole on every rank (Megatron-
    /// Core's MLA duplicates them), the up-projections are column-parallel. `input_saved`
    /// is what the first projection keeps (the layer-norm output).
    pub fn projections(&self, tokens: f64, h: f64, heads: f64, t: f64, e: f64, input_saved: Saved) -> Vec<LayerOp> {
        let qk = self.qk_head_dim();
        let c = self.kv_lora_rank as f64;
        let rope = self.qk_rope_head_dim as f64;
        let mut ops = Vec::with_capacity(6);
        let whole = |elems: f64| Saved { replicated_bytes: e * elems, ..Saved::default() };
        if self.q_lora_rank > 0 {
            let r = self.q_lora_rank as f64;
            ops.push(gemm("q_down", tokens, r, h, e, input_saved));
            ops.push(norm("q_norm", tokens * r, e));
            ops.push(gemm("q_up", tokens, heads * qk / t, r, e, whole(tokens * r)));
        } else {
            ops.push(gemm("q_proj", tokens, heads * qk / t, h, e, input_saved));
        }
        ops.push(gemm("kv_down", tokens, c + rope, h, e, Saved::default()));
        ops.push(norm("kv_norm", tokens * c, e));
        let up = (self.qk_nope_head_dim + self.v_head_dim) as f64;
        ops.push(gemm("kv_up", tokens, heads * up / t, c, e, whole(tokens * c)));
        ops
    }
}

fn gemm(name: &'static str, m: f64, n: f64, k: f64, e: f64, saved: Saved) -> LayerOp {
    LayerOp::Compute(super::transformer::gemm_op(name, 1.0, m, n, k, e, saved))
}

fn norm(name: &'static str, elems: f64, e: f64) -> LayerOp {
    LayerOp::Compute(super::transformer::mem_op(
        name,
        2.0 * elems * e,
        Saved { replicated_bytes: e * elems, ..Saved::default() },
    ))
}

/// The MLP part of one MoE layer on `tokens` tokens (after the layer norm and, under tensor
/// parallelism, the all-gather that feeds the MLP), split over `t` ranks; `act` is what the
/// activation moves and keeps per element (see `transformer::act_bytes`); `rep` is the share
/// of a replicated activation each rank keeps (1/t under sequence parallelism).
#[allow(clippy::too_many_arguments)]
pub fn mlp_ops(
    moe: &Moe,
    tokens: f64,
    h: f64,
    matrices: f64,
    act: (f64, f64),
    t: f64,
    e: f64,
    rep: f64,
) -> Vec<LayerOp> {
    let experts = moe.experts as f64;
    let k = moe.top_k as f64;
    let f = moe.expert_ffn as f64;
    let up = matrices - 1.0;
    let rows = moe.expert_rows(tokens);
    let mut ops = Vec::with_capacity(10);
    // Router: logits for every expert, then softmax and top-k in fp32 (it keeps the scores
    // for the gate's backward).
    ops.extend(routing_ops(tokens, rows, experts, k, h, e, e * tokens * h * rep));
    // One grouped GEMM over the experts: `rows / E` rows each on average.
    ops.extend(expert_ops(experts, rows, (h, f, up), act, t, e));
    // Unpermute and the gate-weighted sum of each token's k expert outputs.
    ops.push(LayerOp::Compute(super::transformer::mem_op(
        "unpermute",
        e * (rows * h + tokens * h),
        Saved { replicated_bytes: e * rows * h / t, ..Saved::default() },
    )));
    if moe.shared_ffn > 0 {
        ops.extend(shared_ops(moe, tokens, h, up, act, t, e));
        ops.push(LayerOp::Compute(super::transformer::mem_op("shared_add", 3.0 * e * tokens * h, Saved::default())));
    }
    ops
}

/// Router (logits for every expert), its fp32 softmax and top-k (keeping the scores for the
/// gate's backward), and the permutation of each token's copies into expert order: on `tokens`
/// tokens routing `rows` rows; the router keeps `router_saved` bytes of its input.
fn routing_ops(tokens: f64, rows: f64, experts: f64, k: f64, h: f64, e: f64, router_saved: f64) -> [LayerOp; 3] {
    [
        gemm("router", tokens, experts, h, e, Saved { replicated_bytes: router_saved, ..Saved::default() }),
        LayerOp::Compute(super::transformer::mem_op(
            "route",
            3.0 * 4.0 * tokens * experts,
            Saved { replicated_bytes: 4.0 * tokens * (experts + k), ..Saved::default() },
        )),
        LayerOp::Compute(super::transformer::mem_op("permute", e * (tokens * h + rows * h), Saved::default())),
    ]
}

/// The experts' MLP as grouped GEMMs over `groups` experts computing `rows` rows together,
/// weights `(h, f)` with `up` input matrices, split over `t`.
fn expert_ops(groups: f64, rows: f64, (h, f, up): (f64, f64, f64), act: (f64, f64), t: f64, e: f64) -> [LayerOp; 3] {
    let grouped = |name, n: f64, kk: f64, saved| {
        LayerOp::Compute(super::transformer::gemm_op(name, groups, rows / groups, n, kk, e, saved))
    };
    [
        grouped("expert_fc1", up * f / t, h, Saved { replicated_bytes: e * rows * h, ..Saved::default() }),
        LayerOp::Compute(super::transformer::mem_op(
            "expert_act",
            act.0 * e * rows * f / t,
            Saved { sharded_bytes: act.1 * e * rows * f / t, ..Saved::default() },
        )),
        grouped("expert_fc2", h, f / t, Saved { sharded_bytes: e * rows * f / t, ..Saved::default() }),
    ]
}

/// A collective over the tensor group at this point of the layer.
fn tensor_comm(name: &'static str, bytes: f64, forward: super::Comm, backward: super::Comm) -> LayerOp {
    LayerOp::Comm {
        name,
        bytes,
        axis: super::Axis::Tensor,
        root: 0,
        forward: Some(forward),
        backward: Some(backward),
        forward_bytes: None,
    }
}

/// The shared experts on `tokens` tokens: a dense gated MLP `shared_ffn` wide, split over `t`.
fn shared_ops(moe: &Moe, tokens: f64, h: f64, up: f64, act: (f64, f64), t: f64, e: f64) -> Vec<LayerOp> {
    let s = moe.shared_ffn as f64;
    vec![
        gemm("shared_fc1", tokens, up * s / t, h, e, Saved::default()),
        LayerOp::Compute(super::transformer::mem_op(
            "shared_act",
            act.0 * e * tokens * s / t,
            Saved { sharded_bytes: act.1 * e * tokens * s / t, ..Saved::default() },
        )),
        gemm("shared_fc2", tokens, h, s / t, e, Saved { sharded_bytes: e * tokens * s / t, ..Saved::default() }),
    ]
}

/// The MLP part of one MoE layer under expert parallelism (`ep` > 1), Megatron-Core's
/// alltoall token dispatcher with expert tensor parallelism = `t` (which needs sequence
/// parallelism when `t` > 1): on this rank's `tokens / t` tokens (its sequence-parallel
/// share of the layer norm's output), the router, top-k and permutation; an all-to-all over
/// the expert-parallel group sends every row to the rank holding its expert; with `t` > 1 an
/// all-gather over the tensor group collects the group's rows; the `E / ep` local experts
/// compute them (as many rows in all as without expert parallelism: each rank receives rows
/// from `ep` replicas), with weights split over `t`; a reduce-scatter over the tensor group
/// and the all-to-all back return them; the unpermutation combines each token's `k` outputs.
/// Backward runs the mirror (the all-to-alls again, the all-gather and reduce-scatter
/// swapped). The busiest rank computes and receives `moe.imbalance` times the mean rows.
/// Shared experts, if any, follow on the dense path with their own sequence-parallel
/// all-gather and reduce-scatter (`shared_in`, `shared_out`).
#[allow(clippy::too_many_arguments)]
pub fn ep_mlp_ops(
    moe: &Moe,
    tokens: f64,
    h: f64,
    matrices: f64,
    act: (f64, f64),
    t: f64,
    e: f64,
    ep: u32,
) -> Vec<LayerOp> {
    use super::{Axis, Comm};
    let experts = moe.experts as f64;
    let local_experts = experts / ep as f64;
    let k = moe.top_k as f64;
    let f = moe.expert_ffn as f64;
    let up = matrices - 1.0;
    let imbalance = moe.imbalance;
    // This rank's tokens (the sequence-parallel share) and the rows it routes.
    let local = tokens / t;
    let local_rows = moe.expert_rows(local);
    // Rows the experts of this (busiest) rank compute, the tensor group's together.
    let rows = moe.expert_rows(tokens) * imbalance;
    let mut ops = Vec::with_capacity(16);
    ops.extend(routing_ops(local, local_rows, experts, k, h, e, e * local * h));
    let a2a = |name| LayerOp::Comm {
        name,
        bytes: e * local_rows * h * imbalance,
        axis: Axis::Expert,
        root: 0,
        forward: Some(Comm::AllToAll),
        backward: Some(Comm::AllToAll),
        forward_bytes: None,
    };
    let tensor = |name, forward, backward| tensor_comm(name, e * rows * h, forward, backward);
    ops.push(a2a("ep_dispatch"));
    if t > 1.0 {
        ops.push(tensor("ep_allgather", Comm::AllGather, Comm::ReduceScatter));
    }
    ops.extend(expert_ops(local_experts, rows, (h, f, up), act, t, e));
    if t > 1.0 {
        ops.push(tensor("ep_reducescatter", Comm::ReduceScatter, Comm::AllGather));
    }
    ops.push(a2a("ep_combine"));
    ops.push(LayerOp::Compute(super::transformer::mem_op(
        "unpermute",
        e * (local_rows * h + local * h),
        Saved { replicated_bytes: e * local_rows * h, ..Saved::default() },
    )));
    if moe.shared_ffn > 0 {
        let sp = |name, forward, backward| tensor_comm(name, e * tokens * h, forward, backward);
        if t > 1.0 {
            ops.push(sp("shared_in", Comm::AllGather, Comm::ReduceScatter));
        }
        ops.extend(shared_ops(moe, tokens, h, up, act, t, e));
        if t > 1.0 {
            ops.push(sp("shared_out", Comm::ReduceScatter, Comm::AllGather));
        }
        ops.push(LayerOp::Compute(super::transformer::mem_op("shared_add", 3.0 * e * local * h, Saved::default())));
    }
    ops
}
