//! The network being trained ("workload"), as layers of ops with FLOPs, bytes moved,
//! parameters and the activations each op keeps for its backward pass.
//!
//! Start at [`Workload`] and [`transformer::TransformerConfig`]; presets are in [`catalog`],
//! the Hugging Face `config.json` reader in [`hf`]. Everything is a function of the
//! micro-batch `b`, the sequence length `s` and the tensor-parallel degree `t`.

pub mod catalog;
pub mod context_ring;
pub mod grid;
pub mod hf;
pub mod loss;
pub mod moe;
pub mod net;
mod ops;
pub mod recompute;
pub mod ring;
pub mod transformer;
mod transformer_ends;

pub use ops::gemm_op;
pub use transformer::TransformerConfig;

/// The network being trained.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Workload {
    pub name: String,
    /// The transformer; for a `net` workload a stand-in whose `layers` is the net's.
    pub transformer: TransformerConfig,
    /// A network of distinct layers (CNNs, RNNs) instead of identical transformer layers.
    pub net: Option<net::Net>,
}

impl Workload {
    pub fn transformer(name: &str, transformer: TransformerConfig) -> Workload {
        Workload { name: name.to_string(), transformer, net: None }
    }

    /// A network of distinct layers; the transformer stand-in only carries the layer count.
    pub fn net(name: &str, net: net::Net) -> Workload {
        let mut t = TransformerConfig::gpt(net.layers.len() as u32, 0, 1, 0, 0);
        t.causal = false;
        Workload { name: name.to_string(), transformer: t, net: Some(net) }
    }

    pub fn layers(&self) -> u32 {
        self.transformer.layers
    }

    pub fn parameters(&self) -> f64 {
        match &self.net {
            Some(n) => n.parameters(),
            None => self.transformer.parameters(),
        }
    }

    /// Parameters in matrix products, the `parameters` of the MFU numerator: a net's all, a
    /// transformer's [`TransformerConfig::flop_parameters`].
    pub fn flop_parameters(&self) -> f64 {
        match &self.net {
            Some(n) => n.parameters(),
            None => self.transformer.flop_parameters(),
        }
    }

    /// Model FLOPs of one sample as the report's contract defines them (the MFU numerator):
    /// 6 x parameters x tokens plus attention's 12 x layers x h x s per token, where the
    /// parameters are those in matrix products ([`TransformerConfig::flop_parameters`]; a
    /// net's tokens are its own, see [`Workload::fixed_seq_len`]). For a CNN this
    /// undercounts (convolutions reuse each weight at every pixel): see
    /// [`Workload::network_flops_per_sample`].
    pub fn model_flops_per_sample(&self, seq_len: u32) -> f64 {
        match &self.net {
            Some(_) => 6.0 * self.flop_parameters() * seq_len as f64,
            None => self.transformer.model_flops_per_sample(seq_len),
        }
    }

    /// [`Workload::model_flops_per_sample`] when the first `frozen.layers` layers are frozen
    /// (PipeTransformer): a frozen layer runs forward only (a third of its FLOPs), a cached
    /// one not at all. The MFU of a partly frozen model counts only the work it must do.
    pub fn trained_flops_per_sample(&self, seq_len: u32, frozen: &crate::plan::Frozen) -> f64 {
        let all = self.model_flops_per_sample(seq_len);
        if frozen.layers == 0 || self.net.is_some() {
            return all;
        }
        let t = &self.transformer;
        let s = seq_len as f64;
        let per_layer = 6.0 * t.active_layer_parameters() * s + 6.0 * (t.q_width() + t.v_width()) * s * s;
        let cached = frozen.cached_layers.min(frozen.layers) as f64;
        let forward_only = frozen.layers as f64 - cached;
        all - per_layer * (forward_only * 2.0 / 3.0 + cached)
    }

    /// FLOPs one sample's forward and backward actually run (three times the forward's
    /// matrix products), without recomputation; for a net, the convolutions at every pixel.
    pub fn network_flops_per_sample(&self, seq_len: u32) -> f64 {
        match &self.net {
            Some(n) => 3.0 * n.layers.iter().map(net::NetLayer::forward_flops_per_sample).sum::<f64>(),
            None => self.transformer.model_flops_per_sample(seq_len),
        }
    }

    /// Sequence length the workload imposes (ViT: patches + class token; a net: its tokens
    /// per sample, one per image), if any.
    pub fn fixed_seq_len(&self) -> Option<u32> {
        match &self.net {
            Some(n) => Some(n.tokens_per_sample()),
            None => self.transformer.fixed_seq_len(),
        }
    }
}

/// How an op is costed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum OpClass {
    /// `batch` independent (m x k) . (k x n) products.
    Gemm { batch: f64, m: f64, n: f64, k: f64 },
    /// Bandwidth-bound: norms, softmax, element-wise, embedding lookups, optimizer.
    Memory,
    /// `kernels` small copies, each its own launch (PyTorch's list all-gather copying its
    /// result out rank by rank; `framework.gather_per_tensor`): bandwidth-bound, and every
    /// kernel pays its launch and its host's issue.
    Copies { kernels: f64 },
    /// One fused attention kernel over `heads` (batch x heads on the device) independent
    /// heads: `q` queries attend to `context` earlier keys plus (all of, or under a causal
    /// mask the earlier of) their own `q` keys, at head dimension `head_dim`.
    Attention {
        heads: f64,
        q: f64,
        context: f64,
        head_dim: f64,
        causal: bool,
        kernel: crate::hardware::kernels::FlashKernel,
        /// Context parallelism's ring steps (`plan.cp`), one kernel each: `q` queries
        /// against the local keys, then against each other rank's (see
        /// `cost::attention::ring_efficiency`); 1 for one kernel over all keys.
        ring: u32,
        /// Which of the ring's kernels the op stands for (PyTorch's all-gather ring runs the
        /// local step apart from the others: `context_ring`).
        part: context_ring::RingPart,
    },
}

impl OpClass {
    /// The matrix product an op amounts to, (batch, m, n, k): a fused attention as its
    /// score product with the keys a query reads on average (what an executor runs in its
    /// place).
    pub fn gemm_shape(&self) -> Option<(f64, f64, f64, f64)> {
        match *self {
            OpClass::Gemm { batch, m, n, k } => Some((batch, m, n, k)),
            OpClass::Attention { part: context_ring::RingPart::Remote, heads, q, context, head_dim, .. } => {
                Some((heads, q, context, head_dim))
            }
            OpClass::Attention { heads, q, context, head_dim, causal, .. } => {
                Some((heads, q, context + if causal { q / 2.0 } else { q }, head_dim))
            }
            OpClass::Memory | OpClass::Copies { .. } => None,
        }
    }
}

/// Which elementwise kernels a framework fuses (a framework profile switches them; the
/// defaults are the fused counts the op list always had). Unfused, eager PyTorch runs:
/// scaling, masking and softmax of the scores as three kernels (`scores / sqrt(d)`,
/// `masked_fill`, `softmax`; Hugging Face GPT-2's `_attn`), and dropout then the residual add
/// as two (`nn.Dropout`, `x + y`), where Megatron-LM fuses each into one
/// (`FusedScaleMaskSoftmax`, `bias_dropout_add_fused_train`).
///
/// The Llama family's pieces likewise: eager PyTorch runs RMSNorm as six passes (fp32 cast,
/// square, mean, rsqrt multiply, cast back, weight multiply), SwiGLU's SiLU and product as
/// two, and rotary embeddings as fp32 casts around a complex multiply, where Megatron-Core's
/// fused kernels read and write each tensor once.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Fusion {
    pub scale_mask_softmax: bool,
    pub bias_dropout_add: bool,
    pub rms_norm: bool,
    pub swiglu: bool,
    pub rope: bool,
    /// The loss as one kernel over the low-precision logits (see [`crate::framework::Fused`]).
    pub cross_entropy: bool,
    /// Each fp8 GEMM keeps its input for backward as the fp8 transpose its weight-gradient GEMM
    /// reads (1 byte an element), not the 16-bit tensor: Transformer Engine's `Linear` under
    /// fp8 saves `inputmat_t` (`transformer_engine/pytorch/module/linear.py`). torchao's
    /// `Float8Linear` keeps the 16-bit input; trainsim's 16-bit GEMMs keep theirs.
    pub fp8_gemm_inputs: bool,
    /// One GEMM for the query, key and value projections and one for a gated MLP's gate and
    /// up projections; off, a GEMM each (see [`crate::framework::Fused::projections`]).
    pub projections: bool,
    /// Grouped key-value heads read in place by the attention kernel; off, repeated to the
    /// query heads first (see [`crate::framework::Fused::gqa`]).
    pub gqa: bool,
    /// How the loss runs when it is not fused ([`loss::UnfusedLoss`]).
    pub unfused_loss: loss::UnfusedLoss,
    /// How context parallelism's ring runs around a fused attention kernel
    /// ([`context_ring::CpRing`]).
    pub cp_ring: context_ring::CpRing,
    /// Under sequence parallelism the attention's and the MLP's input projections keep the
    /// all-gathered input for their weight gradients (DTensor's tensor parallelism, as
    /// torchtitan runs it: the module's input is redistributed to replicated and autograd saves
    /// it); off, they keep their sequence shard and gather it again in backward (Megatron's and
    /// Transformer Engine's column-parallel layers: `framework.tp_async_backward`,
    /// `tp_comm_overlap`).
    pub gathered_linear_inputs: bool,
    /// Under sequence parallelism each separate input projection (q, k, v; gate, up) gathers
    /// the norm's output itself and reduce-scatters its own input gradient
    /// (`framework.tp_gather_per_projection`); with `gathered_linear_inputs` each keeps its own
    /// gathered copy.
    pub gather_per_projection: bool,
    /// DTensor's gathers and reduce-scatters along a dimension other than the first copy
    /// their buffer on the compute stream (`framework.tp_layout_copies`): a `tp_layout_copy`
    /// op beside each sequence-parallel collective and the replicated logits' gather.
    pub layout_copies: bool,
    /// Under sequence parallelism with torchao's float8 linears (`training.precision` fp8,
    /// `framework.fp8_casts` torchao) each column-parallel module's input is cast to fp8 on
    /// its sequence shard and all-gathered in fp8 (torchao's `PrepareFloat8ModuleInput` and
    /// `Float8ColwiseParallel`, which torchtitan applies with tensor-wise scaling); its
    /// gradient's reduce-scatter stays 16-bit.
    pub fp8_tp_gather: bool,
    /// Under tensor parallelism the logits are all-gathered to every rank and the loss runs on
    /// the whole vocabulary on each (`framework.tp_replicate_logits`).
    pub replicated_logits: bool,
    /// Under tensor parallelism the token embedding is whole on every rank
    /// (`framework.tp_replicate_embedding`): no forward collective, under sequence
    /// parallelism the output's gradient all-gathered in backward.
    pub replicated_embedding: bool,
}

impl Default for Fusion {
    fn default() -> Fusion {
        Fusion {
            scale_mask_softmax: true,
            bias_dropout_add: true,
            rms_norm: true,
            swiglu: true,
            rope: true,
            cross_entropy: false,
            fp8_gemm_inputs: false,
            projections: true,
            gqa: true,
            unfused_loss: loss::UnfusedLoss::Fp32,
            cp_ring: context_ring::CpRing::TeP2p,
            gathered_linear_inputs: false,
            gather_per_projection: false,
            layout_copies: false,
            fp8_tp_gather: false,
            replicated_logits: false,
            replicated_embedding: false,
        }
    }
}

impl Fusion {
    /// Bytes a normalisation moves per element (forward) and keeps per element for backward,
    /// at `e` bytes per activation element. Fused (or a LayerNorm, one native kernel in
    /// PyTorch too): read and write once, keep the output. Eager RMSNorm: `x.float()` (e + 4),
    /// `pow(2)` (4 + 4), `mean` (4), `x * rsqrt` (4 + 4), `type_as` (4 + e), `* weight`
    /// (e + e): 4e + 28 bytes; autograd keeps the fp32 input and the normalised output.
    pub fn norm_bytes(&self, rms: bool, e: f64) -> (f64, f64) {
        if rms && !self.rms_norm { (4.0 * e + 28.0, 4.0 + e) } else { (2.0 * e, e) }
    }
}

/// Activation bytes an op keeps for backward, per micro-batch.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Saved {
    /// Kept whole on every tensor-parallel rank (divided only by sequence parallelism).
    pub replicated_bytes: f64,
    /// Already divided by the tensor-parallel degree.
    pub sharded_bytes: f64,
    /// Core-attention activations (divided by t) that selective recomputation drops.
    pub selective_bytes: f64,
    /// Bytes the op holds beside these only while its forward runs, and while its backward
    /// runs (temporaries: the unfused loss's fp32 copies of the logits, see
    /// [`loss::loss_transient_bytes`]).
    pub transient_bytes: [f64; 2],
}

impl Saved {
    /// Bytes kept under a recomputation mode (full recomputation is handled per layer).
    pub fn bytes(&self, recompute: crate::plan::Recompute) -> f64 {
        let core = if recompute == crate::plan::Recompute::None { self.selective_bytes } else { 0.0 };
        self.replicated_bytes + self.sharded_bytes + core
    }
}

/// A collective operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Comm {
    AllReduce,
    ReduceScatter,
    AllGather,
    /// From the root (the first member) to all: a pipelined chain.
    Broadcast,
    /// From all to the root: a pipelined chain the other way.
    Reduce,
    /// Every member sends a distinct `bytes / p` block of its `bytes` buffer to every other
    /// member (expert parallelism's dispatch and combine). NCCL runs it as grouped
    /// send/recv, all peers at once.
    AllToAll,
}

/// Which devices of a tensor-parallel group take part in a collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Axis {
    /// The whole group.
    Tensor,
    /// The devices that differ only in grid coordinate 0, 1 or 2 (see [`TpMode::dims`]).
    Dim0,
    Dim1,
    Dim2,
    /// The expert-parallel group: the same tensor rank of `ep` data-parallel replicas.
    Expert,
    /// The context-parallel ring: the same tensor rank of the `cp` replicas that share the
    /// sequences. Its collectives run beside the attention kernel (the lowering's
    /// `context_parallel` pass).
    Context,
    /// The context-parallel ring's group, on the compute stream: a transfer the framework
    /// waits for before it goes on (PyTorch's last key/value gradients: `context_ring`).
    ContextExposed,
}

impl Axis {
    pub fn dim(self) -> Option<usize> {
        match self {
            Axis::Tensor | Axis::Expert | Axis::Context | Axis::ContextExposed => None,
            Axis::Dim0 => Some(0),
            Axis::Dim1 => Some(1),
            Axis::Dim2 => Some(2),
        }
    }
}

/// How a tensor-parallel group splits each matrix (Colossal-AI's modes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TpMode {
    /// Megatron: column- then row-parallel pairs over all t devices.
    OneD,
    /// SUMMA on a q x q grid (Optimus).
    TwoD { q: u32 },
    /// d stacked q x q grids sharing weights (Tesseract).
    TwoPointFiveD { q: u32, d: u32 },
    /// A q x q x q cube.
    ThreeD { q: u32 },
    /// Sequence parallelism with ring self-attention (Li et al. 2021): the group splits the
    /// sequence, keeps whole weights, and passes key and value chunks around the ring.
    Ring,
}

impl TpMode {
    /// Grid dimensions, outermost first: a device's tensor rank is its mixed-radix coordinates.
    /// 2D: (1, row i, column j); 2.5D: (depth k, row i, column j); 3D: (i, j, l).
    pub fn dims(self, tp: u32) -> Vec<u32> {
        match self {
            TpMode::OneD | TpMode::Ring => vec![tp],
            TpMode::TwoD { q } => vec![1, q, q],
            TpMode::TwoPointFiveD { q, d } => vec![d, q, q],
            TpMode::ThreeD { q } => vec![q, q, q],
        }
    }

    /// Into how many parts each weight matrix is split.
    pub fn weight_shards(self, tp: u32) -> u32 {
        match self {
            TpMode::OneD => tp,
            TpMode::Ring => 1,
            TpMode::TwoD { q } | TpMode::TwoPointFiveD { q, .. } => q * q,
            TpMode::ThreeD { q } => q * q * q,
        }
    }
}

/// One compute op of a layer, at fixed (b, s, t).
#[derive(Clone, Debug, PartialEq)]
pub struct OpSpec {
    pub name: &'static str,
    pub class: OpClass,
    pub forward_flops: f64,
    pub forward_bytes: f64,
    pub backward_flops: f64,
    pub backward_bytes: f64,
    pub saved: Saved,
}

/// A step of a layer: compute, or a tensor-parallel collective on the activations.
#[derive(Clone, Debug, PartialEq)]
pub enum LayerOp {
    Compute(OpSpec),
    /// A collective over the devices of a tensor-parallel `axis`, at this position: `forward`
    /// runs in the forward pass, `backward` when the backward pass comes back through this
    /// point. Megatron's `f` operator is (none, all-reduce), its `g` (all-reduce, none); with
    /// sequence parallelism they become (all-gather, reduce-scatter) and (reduce-scatter,
    /// all-gather). `bytes` is the full (unsharded) buffer.
    Comm {
        name: &'static str,
        bytes: f64,
        axis: Axis,
        forward: Option<Comm>,
        backward: Option<Comm>,
        /// Root of a broadcast or reduce: its index along the axis.
        root: u32,
        /// Bytes the forward collective (and its rerun) moves where that differs from `bytes`:
        /// torchao's float8 tensor parallelism all-gathers a module's input in fp8, one byte
        /// an element, where its gradient's reduce-scatter moves the 16-bit gradient.
        forward_bytes: Option<f64>,
    },
}

impl OpSpec {
    /// Adding a unit's new weight gradients (`params` on this device, `grad_bytes` each) into
    /// those accumulated over the earlier micro-batches: a backward-only elementwise kernel
    /// that reads both and writes the sum, as autograd's in-place accumulation does
    /// (Megatron-LM's fused variant reads and writes an fp32 buffer inside the weight-gradient
    /// GEMM instead: the same bytes).
    /// FSDP2's copy of `bytes` of all-gathered parameters out of the flat buffer (read and
    /// written once), before a unit's forward or backward.
    pub fn gather_copy_out(bytes: f64) -> OpSpec {
        OpSpec::streaming("gather_copy_out", 2.0 * bytes)
    }

    /// A memory-bound op `name` that moves `traffic` bytes in either pass and keeps nothing
    /// for backward (copies, sums, the optimizer step).
    pub fn streaming(name: &'static str, traffic: f64) -> OpSpec {
        OpSpec {
            name,
            class: OpClass::Memory,
            forward_flops: 0.0,
            forward_bytes: traffic,
            backward_flops: 0.0,
            backward_bytes: traffic,
            saved: Saved::default(),
        }
    }

    /// PyTorch's fused all-gather-matmul's copy of a rank's `shard` bytes into its symmetric
    /// memory buffer, where the other ranks' copy engines read it, before any transfer: one
    /// copy, read and written once (`_pipelined_all_gather_and_consume`, "copy_shard" into the
    /// local p2p buffer, then a barrier).
    pub fn tp_symm_copy(shard: f64) -> OpSpec {
        OpSpec { name: "tp_symm_copy", ..OpSpec::gather_copy_out(shard) }
    }

    /// PyTorch's fused matmul-reduce-scatter's last step: the `ranks` partial products of this
    /// rank's shard, `bytes` in all (one `bytes / ranks` from each rank, pulled into one
    /// stacked buffer), summed into the shard: read once, the shard written once
    /// (`_fused_matmul_reduce_scatter_impl`: `torch.sum` over the stacked partials, or
    /// `reduce_partials` later).
    pub fn tp_reduce_partials(bytes: f64, ranks: f64) -> OpSpec {
        OpSpec::streaming("tp_reduce_partials", bytes + bytes / ranks.max(1.0))
    }

    /// `copies` copies of `bytes` in all (read and written once), one kernel each: out of
    /// ZeRO-3's list all-gathers (`gather_list_copies`) or into its list reduce-scatters
    /// (`reduce_list_copies`) under `framework.gather_per_tensor`.
    pub fn list_copies(name: &'static str, bytes: f64, copies: f64) -> OpSpec {
        OpSpec {
            name,
            class: OpClass::Copies { kernels: copies.max(1.0) },
            forward_flops: 0.0,
            forward_bytes: 2.0 * bytes,
            backward_flops: 0.0,
            backward_bytes: 2.0 * bytes,
            saved: Saved::default(),
        }
    }

    pub fn grad_accumulate(params: f64, grad_bytes: f64) -> OpSpec {
        OpSpec {
            name: "grad_accumulate",
            class: OpClass::Memory,
            forward_flops: 0.0,
            forward_bytes: 0.0,
            backward_flops: 0.0,
            backward_bytes: 3.0 * params * grad_bytes,
            saved: Saved::default(),
        }
    }
}

impl LayerOp {
    pub fn compute(&self) -> Option<&OpSpec> {
        match self {
            LayerOp::Compute(op) => Some(op),
            LayerOp::Comm { .. } => None,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            LayerOp::Compute(op) => op.name,
            LayerOp::Comm { name, .. } => name,
        }
    }
}

/// The shape a layer is instantiated at.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerShape {
    pub micro_batch: u32,
    pub seq_len: u32,
    pub tp: u32,
    pub tp_mode: TpMode,
    /// Expert-parallel degree (1: every device holds all experts).
    pub ep: u32,
    /// Context-parallel degree: `seq_len` is then one device's share of each sequence, and
    /// its attention reads the keys and values of the others' shares, passed around the ring
    /// (see `TransformerConfig::layer_ops`); 1 for none.
    pub cp: u32,
    /// Earlier tokens of the same sequences this slice's attention reads (token slicing; 0
    /// otherwise).
    pub context: u32,
    pub sequence_parallel: bool,
    /// Fused attention (a FlashAttention generation) or materialised scores.
    pub attention: crate::hardware::kernels::Attention,
    /// Which elementwise kernels are fused.
    pub fusion: Fusion,
    /// Bytes of an activation element (2 for fp16/bf16).
    pub activation_bytes: f64,
}

/// Each fp8 GEMM among `ops` keeps its input at 1 byte an element instead of `e` (Transformer
/// Engine's saved fp8 transposes, see [`Fusion::fp8_gemm_inputs`]); the GEMMs that stay 16-bit
/// keep theirs.
pub(crate) fn keep_fp8_gemm_inputs(ops: &mut [LayerOp], e: f64) {
    if e <= 1.0 {
        return;
    }
    for op in ops.iter_mut().filter_map(|op| match op {
        LayerOp::Compute(c) if matches!(c.class, OpClass::Gemm { .. }) && !crate::cost::sixteen_bit_gemm(c.name) => {
            Some(c)
        }
        _ => None,
    }) {
        op.saved.replicated_bytes /= e;
        op.saved.sharded_bytes /= e;
        op.saved.selective_bytes /= e;
    }
}
