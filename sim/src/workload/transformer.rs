//! Transformer layers as ops.
//!
//! A layer (pre-norm, Megatron 1D tensor parallel over `t` ranks) runs, forward:
//!
//! ```text
//! x ─ ln1 ─ qkv ─ scores(QK^T) ─ softmax ─ attn_dropout ─ attn_v ─ out_proj ─[all-reduce]─ dropout+residual
//!   ─ ln2 ─ fc1 ─ gelu ─ fc2 ─[all-reduce]─ dropout+residual ─> y
//! ```
//!
//! Each op declares what it keeps for backward, following Korthikanti et al. 2022 (the
//! breakdown in `docs/reference/activation_memory_korthikanti2022.json`): summed over a GPT
//! layer this gives `s*b*h*(10 + 24/t + 5*a*s/(h*t))` bytes.

use super::context_ring::{self, RingPart, RingShare};
pub use super::loss::{loss_bytes, metric_bytes};
pub(super) use super::ops::{act_bytes, gemm_op, mem_op};
use super::transformer_ends::layout_copy;
use super::{Axis, Comm, LayerOp, LayerShape, OpClass, OpSpec, Saved};

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mlp {
    /// Two matrices h -> f -> h with GeLU.
    Gelu,
    /// Three matrices (gate, up, down) with SiLU, as in Llama.
    SwiGlu,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Norm {
    LayerNorm,
    RmsNorm,
}

/// What feeds the first layer.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Input {
    /// Token ids through an embedding table; learned positions if `positions > 0`.
    Tokens { positions: u32, token_types: u32 },
    /// ViT: square images cut into square patches, plus a class token.
    Patches { image: u32, patch: u32, channels: u32, classes: u32 },
}

#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct TransformerConfig {
    pub layers: u32,
    pub hidden: u32,
    pub heads: u32,
    pub kv_heads: u32,
    pub ffn_hidden: u32,
    pub vocab: u32,
    pub causal: bool,
    pub mlp: Mlp,
    pub norm: Norm,
    pub bias: bool,
    pub dropout: bool,
    pub tied_embeddings: bool,
    pub input: Input,
    /// BERT's pooler (h x h dense) on the class token.
    pub pooler: bool,
    /// Rotary position embeddings applied to queries and keys in every layer (Llama's kin).
    pub rotary: bool,
    /// Head width when it is not `hidden / heads` (Qwen3's 128 at any width).
    #[serde(rename = "head_dim", skip_serializing_if = "Option::is_none")]
    pub explicit_head_dim: Option<u32>,
    /// Routed experts in place of the MLP (see [`super::moe`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub moe: Option<super::moe::Moe>,
    /// Multi-head latent attention in place of the Q, K and V projections.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mla: Option<super::moe::Mla>,
}

impl TransformerConfig {
    /// A GPT-style decoder: GeLU MLP of 4h, LayerNorm, biases, dropout, tied embeddings.
    pub fn gpt(layers: u32, hidden: u32, heads: u32, vocab: u32, positions: u32) -> TransformerConfig {
        TransformerConfig {
            layers,
            hidden,
            heads,
            kv_heads: heads,
            ffn_hidden: 4 * hidden,
            vocab,
            causal: true,
            mlp: Mlp::Gelu,
            norm: Norm::LayerNorm,
            bias: true,
            dropout: true,
            tied_embeddings: true,
            input: Input::Tokens { positions, token_types: 0 },
            pooler: false,
            rotary: false,
            explicit_head_dim: None,
            moe: None,
            mla: None,
        }
    }

    /// A Llama-style decoder: SwiGLU, RMSNorm, rotary positions, no biases or dropout.
    pub fn llama(layers: u32, hidden: u32, heads: u32, kv_heads: u32, ffn: u32, vocab: u32) -> TransformerConfig {
        TransformerConfig {
            layers,
            hidden,
            heads,
            kv_heads,
            ffn_hidden: ffn,
            vocab,
            causal: true,
            mlp: Mlp::SwiGlu,
            norm: Norm::RmsNorm,
            bias: false,
            dropout: false,
            tied_embeddings: false,
            input: Input::Tokens { positions: 0, token_types: 0 },
            pooler: false,
            rotary: true,
            explicit_head_dim: None,
            moe: None,
            mla: None,
        }
    }

    /// The head dimension the attention kernel runs at: the head's width, or under multi-head
    /// latent attention the mean of a query/key head's and a value head's (their FLOPs follow
    /// it).
    pub fn attention_head_dim(&self) -> f64 {
        if self.mla.is_some() { (self.q_width() + self.v_width()) / (2.0 * self.heads as f64) } else { self.head_dim() }
    }

    /// Width of one attention head: the query/key head under multi-head latent attention.
    pub fn head_dim(&self) -> f64 {
        if let Some(m) = &self.mla {
            return m.qk_head_dim();
        }
        match self.explicit_head_dim {
            Some(d) => d as f64,
            None => self.hidden as f64 / self.heads as f64,
        }
    }

    /// Width of the queries of all heads (`hidden` unless the head width is set apart).
    pub fn q_width(&self) -> f64 {
        if self.mla.is_none() && self.explicit_head_dim.is_none() {
            return self.hidden as f64;
        }
        self.heads as f64 * self.head_dim()
    }

    /// Width of the attention output of all heads, the output projection's input.
    pub fn v_width(&self) -> f64 {
        match &self.mla {
            Some(m) => self.heads as f64 * m.v_head_dim as f64,
            None => self.q_width(),
        }
    }

    /// Whether layer `l` (from 0) routes its tokens to experts.
    pub fn is_moe_layer(&self, l: u32) -> bool {
        self.moe.is_some_and(|m| l >= m.dense_layers)
    }

    /// Whether the layers are not all alike (a mixture-of-experts model with dense layers first).
    pub fn mixed_layers(&self) -> bool {
        self.moe.is_some_and(|m| m.dense_layers > 0 && m.dense_layers < self.layers)
    }

    /// Width of the K and V projections (smaller than h under grouped-query attention).
    pub fn kv_width(&self) -> f64 {
        self.head_dim() * self.kv_heads as f64
    }

    pub fn fixed_seq_len(&self) -> Option<u32> {
        match self.input {
            Input::Patches { image, patch, .. } => Some((image / patch) * (image / patch) + 1),
            Input::Tokens { .. } => None,
        }
    }

    pub fn mlp_matrices(&self) -> f64 {
        match self.mlp {
            Mlp::Gelu => 2.0,
            Mlp::SwiGlu => 3.0,
        }
    }

    /// Parameters of one layer, the mean over the layers (they differ only in a
    /// mixture-of-experts model with dense layers first).
    pub fn layer_parameters(&self) -> f64 {
        self.mean_over_layers(|l| self.layer_parameters_at(l))
    }

    /// The mean of `per_layer` over the layers, in closed form: the first `dense_layers`
    /// layers are alike, and so are the rest (a model of a million layers is one call each).
    fn mean_over_layers(&self, per_layer: impl Fn(u32) -> f64) -> f64 {
        let last = self.layers.saturating_sub(1);
        match self.moe {
            Some(m) if self.mixed_layers() => {
                let dense = m.dense_layers as f64;
                (dense * per_layer(0) + (self.layers as f64 - dense) * per_layer(last)) / self.layers as f64
            }
            _ => per_layer(last),
        }
    }

    /// [`TransformerConfig::active_layer_parameters_at`], the mean over the layers.
    pub fn active_layer_parameters(&self) -> f64 {
        self.mean_over_layers(|l| self.active_layer_parameters_at(l))
    }

    /// Parameters of layer `l`.
    pub fn layer_parameters_at(&self, l: u32) -> f64 {
        self.layer_parameters_with(l, false)
    }

    /// Parameters of layer `l`'s routed experts (0 in a dense layer): what expert parallelism
    /// splits.
    pub fn routed_expert_parameters_at(&self, l: u32) -> f64 {
        match self.moe {
            Some(m) if self.is_moe_layer(l) => {
                m.experts as f64 * self.mlp_matrices() * self.hidden as f64 * m.expert_ffn as f64
            }
            _ => 0.0,
        }
    }

    /// Parameters of layer `l` one token's computation uses (all but the experts it is not
    /// routed to).
    pub fn active_layer_parameters_at(&self, l: u32) -> f64 {
        self.layer_parameters_with(l, true)
    }

    fn layer_parameters_with(&self, l: u32, active: bool) -> f64 {
        let h = self.hidden as f64;
        let f = self.ffn_hidden as f64;
        let kv = self.kv_width();
        let q = self.q_width();
        let attn = match &self.mla {
            Some(m) => m.parameters(h, self.heads as f64),
            None => h * (q + 2.0 * kv) + q * h,
        };
        let mlp = match self.moe {
            Some(m) if self.is_moe_layer(l) => {
                if active {
                    m.active_mlp_parameters(h, self.mlp_matrices())
                } else {
                    m.mlp_parameters(h, self.mlp_matrices())
                }
            }
            _ => self.mlp_matrices() * h * f,
        };
        let norms = match self.norm {
            Norm::LayerNorm => 4.0 * h,
            Norm::RmsNorm => 2.0 * h,
        };
        let biases = if self.bias {
            (q + 2.0 * kv)
                + h
                + match self.mlp {
                    Mlp::Gelu => f + h,
                    Mlp::SwiGlu => 2.0 * f + h,
                }
        } else {
            0.0
        };
        attn + mlp + norms + biases
    }

    /// Parameters outside the layers: embeddings, final norm, output head, pooler.
    pub fn embedding_parameters(&self) -> f64 {
        let h = self.hidden as f64;
        let final_norm = match self.norm {
            Norm::LayerNorm => 2.0 * h,
            Norm::RmsNorm => h,
        };
        match self.input {
            Input::Tokens { positions, token_types } => {
                let table = self.vocab as f64 * h;
                let head = if self.tied_embeddings { 0.0 } else { table };
                let pooler = if self.pooler { h * h + h } else { 0.0 };
                table + head + (positions + token_types) as f64 * h + final_norm + pooler
            }
            Input::Patches { image, patch, channels, classes } => {
                let tokens = ((image / patch) * (image / patch) + 1) as f64;
                let patch_embed = (channels * patch * patch) as f64 * h + h;
                patch_embed + h /* class token */ + tokens * h + final_norm + h * classes as f64 + classes as f64
            }
        }
    }

    /// [`TransformerConfig::embedding_parameters`] less an untied output layer's matrix: what
    /// the first stage holds besides its layers (the final norm and a pooler counted with it).
    pub fn embedding_parameters_without_head(&self) -> f64 {
        self.embedding_parameters() - if self.tied_embeddings { 0.0 } else { self.head_classes() * self.hidden as f64 }
    }

    pub fn parameters(&self) -> f64 {
        self.layers as f64 * self.layer_parameters() + self.embedding_parameters()
    }

    /// Parameters one token's computation uses: [`TransformerConfig::parameters`] less the
    /// experts it is not routed to (all of them in a dense model).
    pub fn active_parameters(&self) -> f64 {
        if self.moe.is_none() {
            return self.parameters();
        }
        self.layers as f64 * self.active_layer_parameters() + self.embedding_parameters()
    }

    /// Output classes of the head: the vocabulary for language models.
    pub fn head_classes(&self) -> f64 {
        match self.input {
            Input::Tokens { .. } => self.vocab as f64,
            Input::Patches { classes, .. } => classes as f64,
        }
    }

    /// Parameters that take part in every token's matrix products: all but the lookup
    /// tables (position and token-type embeddings, ViT's position embeddings and class token,
    /// and an untied input embedding, whose output head is counted instead). A lookup reads one
    /// row per token; counting a table of a million positions as 6 FLOPs per entry per token
    /// would put MFU above 1.
    pub fn flop_parameters(&self) -> f64 {
        let h = self.hidden as f64;
        let lookups = match self.input {
            Input::Tokens { positions, token_types } => {
                let untied_input = if self.tied_embeddings { 0.0 } else { self.vocab as f64 * h };
                (positions + token_types) as f64 * h + untied_input
            }
            Input::Patches { image, patch, .. } => ((image / patch) * (image / patch) + 1) as f64 * h + h,
        };
        self.active_parameters() - lookups
    }

    /// Model FLOPs of one sample of `s` tokens, forward + backward, no recomputation:
    /// 6 x parameters x tokens plus attention's 12 x layers x h x s per token (the MFU
    /// numerator of Chowdhery et al. and MosaicML), the parameters being those in matrix
    /// products ([`TransformerConfig::flop_parameters`]).
    pub fn model_flops_per_sample(&self, s: u32) -> f64 {
        let s = s as f64;
        // Scores and their product with V: 2 x 3 FLOPs per query, key and width, 12 x h
        // when both widths are h.
        let widths = self.q_width() + self.v_width();
        6.0 * self.flop_parameters() * s + 6.0 * self.layers as f64 * widths * s * s
    }

    /// The ops of one layer at `shape`: of the last layer (a mixture-of-experts layer in an
    /// MoE model; see [`TransformerConfig::layer_ops_at`] for the dense layers before).
    pub fn layer_ops(&self, shape: LayerShape) -> Vec<LayerOp> {
        self.layer_ops_at(self.layers.saturating_sub(1), shape)
    }

    /// The ops of layer `l` (from 0) at `shape`.
    pub fn layer_ops_at(&self, l: u32, shape: LayerShape) -> Vec<LayerOp> {
        let mut ops = self.layer_ops_16(l, shape);
        if shape.fusion.fp8_gemm_inputs {
            super::keep_fp8_gemm_inputs(&mut ops, shape.activation_bytes);
        }
        ops
    }

    /// The ops of layer `l` with every kept activation at the activation precision.
    fn layer_ops_16(&self, l: u32, shape: LayerShape) -> Vec<LayerOp> {
        if shape.tp > 1 && shape.tp_mode == super::TpMode::Ring {
            return super::ring::layer_ops(self, shape);
        }
        if shape.tp > 1 && shape.tp_mode != super::TpMode::OneD {
            return super::grid::layer_ops(self, shape);
        }
        let b = shape.micro_batch as f64;
        let s = shape.seq_len as f64;
        let h = self.hidden as f64;
        let t = shape.tp as f64;
        let a = self.heads as f64;
        let e = shape.activation_bytes;
        let f = self.ffn_hidden as f64;
        let kv = self.kv_width();
        // Under MLA a head's query/key and value widths differ; attention's FLOPs and kernel
        // follow their mean.
        let d = self.attention_head_dim();
        let sbh = s * b * h;
        // Replicated activations are split over t only under sequence parallelism.
        let rep = if shape.sequence_parallel { 1.0 / t } else { 1.0 };
        let tokens = b * s;
        let mut ops = Vec::with_capacity(16);
        let eager_rms = self.norm == Norm::RmsNorm && !shape.fusion.rms_norm;
        let norm = |name| {
            if eager_rms {
                let (moved, kept) = shape.fusion.norm_bytes(true, e);
                return LayerOp::Compute(mem_op(
                    name,
                    moved * sbh * rep + 2.0 * h * 4.0,
                    Saved { replicated_bytes: kept * sbh * rep, ..Saved::default() },
                ));
            }
            LayerOp::Compute(mem_op(
                name,
                2.0 * sbh * e * rep + 2.0 * h * 4.0,
                Saved { replicated_bytes: e * sbh * rep, ..Saved::default() },
            ))
        };
        let gemm = |name, m: f64, n: f64, k: f64, saved: Saved| LayerOp::Compute(gemm_op(name, 1.0, m, n, k, e, saved));
        // Megatron's f (into a column-parallel GEMM) and g (out of a row-parallel one).
        let sp = shape.sequence_parallel;
        // Under torchao's float8 tensor parallelism a column-parallel module's input is cast to
        // fp8 on its sequence shard and all-gathered in fp8 (`fusion.fp8_tp_gather`).
        let fp8_gather = sp && shape.fusion.fp8_tp_gather;
        let gathered = if fp8_gather { sbh } else { e * sbh };
        let f_op = |name| LayerOp::Comm {
            name,
            bytes: e * sbh,
            axis: Axis::Tensor,
            root: 0,
            forward: if sp { Some(Comm::AllGather) } else { None },
            backward: Some(if sp { Comm::ReduceScatter } else { Comm::AllReduce }),
            forward_bytes: fp8_gather.then_some(gathered),
        };
        let g_op = |name| LayerOp::Comm {
            name,
            bytes: e * sbh,
            axis: Axis::Tensor,
            root: 0,
            forward: Some(if sp { Comm::ReduceScatter } else { Comm::AllReduce }),
            backward: if sp { Some(Comm::AllGather) } else { None },
            forward_bytes: None,
        };
        let tp = shape.tp > 1;
        // DTensor copies each sequence-dimension gather's output and reduce-scatter's input
        // (`fusion.layout_copies`): after the gather, before the reduce-scatter.
        let copies = tp && sp && shape.fusion.layout_copies;
        let gather = |ops: &mut Vec<LayerOp>, name| {
            ops.push(f_op(name));
            if copies {
                ops.push(layout_copy(gathered, e * sbh));
            }
        };
        let scatter = |ops: &mut Vec<LayerOp>, name| {
            if copies {
                ops.push(layout_copy(e * sbh, e * sbh));
            }
            ops.push(g_op(name));
        };
        ops.push(norm("ln1"));
        if tp {
            gather(&mut ops, "attn_in");
        }
        let qw = self.q_width();
        let vw = self.v_width();
        // The input projections' input: the norm's output, kept as its sequence shard under
        // sequence parallelism unless the framework keeps it gathered.
        let kept_in = if shape.fusion.gathered_linear_inputs { 1.0 } else { rep };
        let ln_out = Saved { replicated_bytes: e * sbh * kept_in, ..Saved::default() };
        let per_projection = tp && sp && shape.fusion.gather_per_projection && !shape.fusion.projections;
        // What a projection after the first keeps of its own gather: the gathered copy where
        // gathered inputs are kept; the shard they all read otherwise (kept once, by the first).
        let own_in = if shape.fusion.gathered_linear_inputs { ln_out } else { Saved::default() };
        match &self.mla {
            Some(m) => ops.extend(m.projections(tokens, h, a, t, e, ln_out)),
            None if shape.fusion.projections => ops.push(gemm("qkv", tokens, (qw + 2.0 * kv) / t, h, ln_out)),
            // A GEMM per projection, all reading the norm's output (kept once), or each its own
            // gather of it (`fusion.gather_per_projection`: kept once each where gathered copies
            // are kept).
            None if per_projection => {
                ops.push(gemm("q_proj", tokens, qw / t, h, ln_out));
                gather(&mut ops, "k_in");
                ops.push(gemm("k_proj", tokens, kv / t, h, own_in));
                gather(&mut ops, "v_in");
                ops.push(gemm("v_proj", tokens, kv / t, h, own_in));
            }
            None => {
                ops.push(gemm("q_proj", tokens, qw / t, h, ln_out));
                ops.push(gemm("k_proj", tokens, kv / t, h, Saved::default()));
                ops.push(gemm("v_proj", tokens, kv / t, h, Saved::default()));
            }
        }
        let sbq = s * b * qw;
        if self.rotary {
            // Rotary embeddings on this rank's queries and keys (under MLA, their rotary parts).
            let width = match &self.mla {
                Some(m) => (a / t + 1.0) * m.qk_rope_head_dim as f64,
                None => (qw + kv) / t,
            };
            let elems = tokens * width;
            // Fused: read and write once. Eager (torchtitan's apply_rotary_emb): `float()`
            // (e + 4), the complex multiply (4 + 4), `type_as` (4 + e).
            let per = if shape.fusion.rope { 2.0 * e } else { 2.0 * e + 16.0 };
            ops.push(LayerOp::Compute(mem_op("rope", per * elems, Saved::default())));
        }
        // Key-value heads repeated to the query heads before attention (`fusion.gqa` off:
        // torchtitan's `repeat_kv`, an expand and a copy): the kernel then reads, keeps and
        // passes K and V at the queries' width. Backward sums each group's gradients back.
        let repeat = self.mla.is_none() && !shape.fusion.gqa && self.kv_heads < self.heads;
        let kv = if repeat {
            let bytes = e * tokens * 2.0 * (kv + qw) / t;
            ops.push(LayerOp::Compute(OpSpec {
                name: "repeat_kv",
                class: OpClass::Memory,
                forward_flops: 0.0,
                forward_bytes: bytes,
                backward_flops: 0.0,
                backward_bytes: bytes,
                saved: Saved::default(),
            }));
            qw
        } else {
            kv
        };
        // Scores keep Q and K (2 x 2sbh/t in Korthikanti's count, with full-width K).
        let heads = b * a / t;
        // Under token slicing the slice's queries also attend to `context` earlier tokens,
        // whose keys and values earlier slices computed and keep. Under context parallelism
        // this rank's queries read the other ranks' keys as they pass around the ring: with
        // the causal load balancing every rank reads half the sequence on average.
        let cp = shape.cp.max(1);
        let context = match cp {
            1 => shape.context as f64,
            _ if self.causal => s * (cp - 1) as f64 / 2.0,
            _ => s * (cp - 1) as f64,
        };
        let keys = s + context;
        let kernel = shape.attention.fused_kernel(d, e == 2.0);
        // Each rank's keys and values go around the ring (`context_ring`). Under MLA a key is
        // as wide as a query.
        let ring = RingShare {
            cp,
            e,
            queries: tokens * qw / t,
            output: tokens * vw / t,
            keys_values: tokens * if self.mla.is_some() { qw + vw } else { 2.0 * kv } / t,
        };
        if cp > 1 && kernel.is_none() {
            // Around materialised scores: Transformer Engine's ring traffic.
            ops.extend(context_ring::te_comms(ring));
        }
        if let Some(kernel) = kernel {
            // One fused kernel (FlashAttention): scores never reach memory; it keeps Q, K,
            // V (and the output, kept by out_proj) and recomputes the scores in backward,
            // whose matrix products are 2.5x the forward's. A causal mask skips the blocks
            // above the diagonal: a query reads its context and half the slice on average.
            // Its time per shape is `cost::attention`'s (published rates per kernel).
            let read = if self.causal { context + s / 2.0 } else { keys };
            let flops = 4.0 * heads * s * read * d;
            let part = RingPart::All;
            let attn = OpSpec {
                name: "flash_attn",
                class: OpClass::Attention {
                    heads,
                    q: s,
                    context,
                    head_dim: d,
                    causal: self.causal,
                    kernel,
                    ring: cp,
                    part,
                },
                forward_flops: flops,
                forward_bytes: e * (2.0 * sbq + 2.0 * s * b * kv) / t,
                backward_flops: 2.5 * flops,
                backward_bytes: 2.0 * e * (2.0 * sbq + 2.0 * s * b * kv) / t,
                saved: Saved { sharded_bytes: e * (sbq + 2.0 * s * b * kv) / t, ..Saved::default() },
            };
            if cp > 1 {
                ops.extend(context_ring::ops(shape.fusion.cp_ring, attn, ring));
            } else {
                ops.push(LayerOp::Compute(attn));
            }
        } else {
            ops.push(LayerOp::Compute(gemm_op(
                "scores",
                heads,
                s,
                keys,
                d,
                e,
                Saved { sharded_bytes: e * (sbq + s * b * kv) / t, ..Saved::default() },
            )));
            let scores_bytes = b * a * s * keys / t;
            if !shape.fusion.scale_mask_softmax {
                // Eager attention scales the scores and masks them before the softmax, each
                // a pass over the score matrix (read and write).
                ops.push(LayerOp::Compute(mem_op("attn_scale", 2.0 * scores_bytes * e, Saved::default())));
                if self.causal {
                    ops.push(LayerOp::Compute(mem_op("attn_mask", 2.0 * scores_bytes * e, Saved::default())));
                }
            }
            ops.push(LayerOp::Compute(mem_op(
                "softmax",
                2.0 * scores_bytes * e,
                Saved { selective_bytes: e * scores_bytes, ..Saved::default() },
            )));
            if self.dropout {
                ops.push(LayerOp::Compute(mem_op(
                    "attn_dropout",
                    (2.0 * e + 1.0) * scores_bytes,
                    Saved { selective_bytes: scores_bytes, ..Saved::default() },
                )));
            }
            // attn_v keeps V and the (dropped-out) probabilities; selective drops the latter.
            ops.push(LayerOp::Compute(gemm_op(
                "attn_v",
                heads,
                s,
                d,
                keys,
                e,
                Saved { sharded_bytes: e * s * b * kv / t, selective_bytes: e * scores_bytes, ..Saved::default() },
            )));
        }
        ops.push(gemm("out_proj", tokens, h, vw / t, Saved { sharded_bytes: e * s * b * vw / t, ..Saved::default() }));
        if tp {
            scatter(&mut ops, "attn_out");
        }
        ops.extend(residual(self.dropout, shape.fusion.bias_dropout_add, sbh * rep, e));
        ops.push(norm("ln2"));
        // Under expert parallelism the routed experts exchange their rows by all-to-all (and
        // gather and scatter them over the tensor group themselves); see `moe::ep_mlp_ops`.
        let ep_layer = shape.ep > 1 && self.is_moe_layer(l);
        if tp && !ep_layer {
            gather(&mut ops, "mlp_in");
        }
        let up = self.mlp_matrices() - 1.0;
        match self.moe {
            Some(moe) if ep_layer => {
                let act = act_bytes(self.mlp, shape.fusion.swiglu);
                ops.extend(super::moe::ep_mlp_ops(&moe, tokens, h, self.mlp_matrices(), act, t, e, shape.ep));
            }
            Some(moe) if self.is_moe_layer(l) => {
                let act = act_bytes(self.mlp, shape.fusion.swiglu);
                ops.extend(super::moe::mlp_ops(&moe, tokens, h, self.mlp_matrices(), act, t, e, rep));
            }
            _ => {
                let ln_out = Saved { replicated_bytes: e * sbh * kept_in, ..Saved::default() };
                if shape.fusion.projections || up < 2.0 {
                    ops.push(gemm("fc1", tokens, up * f / t, h, ln_out));
                } else {
                    // The gate's GEMM then the up projection's (torchtitan's `w1`, `w3`).
                    ops.push(gemm("gate_proj", tokens, f / t, h, ln_out));
                    if per_projection {
                        gather(&mut ops, "up_in");
                        ops.push(gemm("up_proj", tokens, f / t, h, own_in));
                    } else {
                        ops.push(gemm("up_proj", tokens, f / t, h, Saved::default()));
                    }
                }
                // GeLU keeps its input (4h wide in GPT: 8sbh at 2 bytes); SwiGLU keeps gate and up.
                let (moved, kept) = act_bytes(self.mlp, shape.fusion.swiglu);
                ops.push(LayerOp::Compute(mem_op(
                    "act",
                    moved * e * tokens * f / t,
                    Saved { sharded_bytes: kept * e * tokens * f / t, ..Saved::default() },
                )));
                ops.push(gemm(
                    "fc2",
                    tokens,
                    h,
                    f / t,
                    Saved { sharded_bytes: e * tokens * f / t, ..Saved::default() },
                ));
            }
        }
        if tp && !ep_layer {
            scatter(&mut ops, "mlp_out");
        }
        ops.extend(residual(self.dropout, shape.fusion.bias_dropout_add, sbh * rep, e));
        ops
    }

    /// Activation bytes one layer keeps for backward per micro-batch, summed over its ops,
    /// for a recomputation mode (selective: Megatron-Core's default, the core attention).
    pub fn layer_activation_bytes(&self, shape: LayerShape, recompute: crate::plan::Recompute) -> f64 {
        self.layer_activation_bytes_with(shape, recompute, crate::plan::RecomputeModules::default())
    }

    /// [`Self::layer_activation_bytes`] with selective recomputation of `modules`.
    pub fn layer_activation_bytes_with(
        &self,
        shape: LayerShape,
        recompute: crate::plan::Recompute,
        modules: crate::plan::RecomputeModules,
    ) -> f64 {
        use crate::plan::Recompute;
        // The layer input (2sbh, divided by t under sequence parallelism): all that full
        // recomputation keeps.
        let rep = if shape.sequence_parallel { 1.0 / shape.tp as f64 } else { 1.0 };
        let input = shape.activation_bytes * shape.seq_len as f64 * shape.micro_batch as f64 * self.hidden as f64 * rep;
        match recompute {
            Recompute::Full => input,
            Recompute::None | Recompute::Selective => {
                super::recompute::kept_bytes(&self.layer_ops(shape), recompute, modules, input)
            }
        }
    }
}

fn residual(dropout: bool, fused: bool, elems: f64, e: f64) -> Vec<LayerOp> {
    if dropout && !fused {
        // Dropout (read, write, and its mask) and then the residual add (two reads, a write).
        return vec![
            LayerOp::Compute(mem_op(
                "dropout",
                (2.0 * e + 1.0) * elems,
                Saved { replicated_bytes: elems, ..Saved::default() },
            )),
            LayerOp::Compute(mem_op("dropout_residual", 3.0 * elems * e, Saved::default())),
        ];
    }
    vec![LayerOp::Compute(mem_op(
        "dropout_residual",
        3.0 * elems * e + if dropout { elems } else { 0.0 },
        Saved { replicated_bytes: if dropout { elems } else { 0.0 }, ..Saved::default() },
    ))]
}
