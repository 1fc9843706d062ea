//! The network being trained ("workload"), as layers of ops with FLOPs, bytes moved,
//! parameters and the activations each op keeps for its backward pass.
//!
//! Start at [`Workload`] and [`transformer::TransformerConfig`]; presets are in [`catalog`],
//! the Hugging Face `config.json` reader in [`hf`]. Everything is a function of the
//! micro-batch `b`, the sequence length `s` and the tensor-parallel degree `t`.

pub mod catalog;
pub mod hf;
pub mod transformer;

pub use transformer::TransformerConfig;

/// The network being trained.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Workload {
    pub name: String,
    pub transformer: TransformerConfig,
}

impl Workload {
    pub fn layers(&self) -> u32 {
        self.transformer.layers
    }

    pub fn parameters(&self) -> f64 {
        self.transformer.parameters()
    }

    /// Sequence length the workload imposes (ViT: patches + class token), if any.
    pub fn fixed_seq_len(&self) -> Option<u32> {
        self.transformer.fixed_seq_len()
    }
}

/// How an op is costed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum OpClass {
    /// `batch` independent (m x k) . (k x n) products.
    Gemm { batch: f64, m: f64, n: f64, k: f64 },
    /// Bandwidth-bound: norms, softmax, element-wise, embedding lookups, optimizer.
    Memory,
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
}

/// Which devices of a tensor-parallel group take part in a collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Axis {
    /// The whole group.
    Tensor,
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
    },
}

impl LayerOp {
    pub fn compute(&self) -> Option<&OpSpec> {
        match self {
            LayerOp::Compute(op) => Some(op),
            LayerOp::Comm { .. } => None,
        }
    }
}

/// The shape a layer is instantiated at.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerShape {
    pub micro_batch: u32,
    pub seq_len: u32,
    pub tp: u32,
    pub sequence_parallel: bool,
    /// Bytes of an activation element (2 for fp16/bf16).
    pub activation_bytes: f64,
}
