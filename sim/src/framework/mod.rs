//! Framework profiles: what a training framework does that a parallel plan does not say.
//!
//! Two runs of the same plan differ by framework: whether the gradient reduction overlaps the
//! backward pass, how parameters are gathered under ZeRO-3, which kernels are fused, in which
//! dtype gradients travel. A profile holds these behaviours as data; the lowering reads them.
//! Every value carries its source in [`Framework::sources`] (and `docs/reference/frameworks.md`,
//! which `tests/docs.rs` keeps in step with [`NAMES`]).

mod profiles;
pub use profiles::profile;

use crate::hardware::kernels::{Attention, FlashKernel};
pub use crate::workload::context_ring::{CP_RING_SOURCE, CpRing};
pub use crate::workload::loss::{UNFUSED_LOSS_SOURCE, UnfusedLoss};
use serde::Serialize;

/// The frameworks a scenario can name in `training.framework`.
pub const NAMES: [&str; 6] =
    ["megatron-lm-2021", "megatron-core", "deepspeed", "pytorch-fsdp", "colossal-ai", "pytorch-ddp"];

/// How gradients of a data-parallel group are reduced during an iteration.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GradReduce {
    /// Bucket by bucket as the backward pass produces them, on a communication stream.
    Overlapped,
    /// Once, after the last micro-batch's backward (one contiguous buffer).
    AfterBackward,
    /// Bucket by bucket as the backward pass produces them, on the compute stream: each
    /// reduction holds up the backward behind it (DeepSpeed ZeRO-1/2 with `overlap_comm` off,
    /// its default there).
    Blocking,
}

/// The unit in which ZeRO-3 parameters are gathered.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Gather {
    /// One all-gather per layer (an FSDP unit wrapping a transformer block); `prefetch`
    /// further layers' gathers may be in flight while a layer computes.
    PerLayer { prefetch: u32 },
    /// Module by module, prefetching up to `prefetch_bucket_params` parameters ahead, with at
    /// most `max_live_params` gathered at once (DeepSpeed ZeRO-3); a parameter tensor of fewer
    /// elements than `persistence_threshold` is gathered once and kept, never again
    /// (`stage3_param_persistence_threshold`).
    PerModule { prefetch_bucket_params: f64, max_live_params: f64, persistence_threshold: f64 },
}

/// The dtype gradients are reduced in.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReduceDtype {
    /// The training precision (2 bytes under bf16/fp16).
    Params,
    /// fp32 (4 bytes).
    Fp32,
}

/// The data-parallel gradient bucket size.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Bucket {
    /// A fixed size in bytes.
    Bytes { bytes: f64 },
    /// max(min_params, per_rank_params x dp) parameters (Megatron-Core).
    Params { min_params: f64, per_rank_params: f64 },
}

/// Kernels a framework fuses (each fused kernel reads its input and writes its output once).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Fused {
    /// Scale, causal mask and softmax in one kernel (materialised attention only).
    pub softmax: bool,
    /// Bias add and GeLU in one kernel.
    pub bias_gelu: bool,
    /// Bias add, dropout and residual add in one kernel.
    pub bias_dropout_add: bool,
    /// Adam over all parameters in a few multi-tensor kernels rather than a kernel per tensor
    /// and per elementwise step.
    pub adam: bool,
    /// RMSNorm as one kernel; eager PyTorch runs it as an fp32 cast, square, mean, rsqrt
    /// multiply, cast back and weight multiply (torchtitan's `RMSNorm`), each a pass.
    pub rms_norm: bool,
    /// SiLU and the gate-times-up product as one kernel (Megatron-Core's `bias_swiglu`);
    /// eager: two (`F.silu(w1(x)) * w3(x)`).
    pub swiglu: bool,
    /// Rotary embeddings of queries and keys as one kernel (Megatron-Core's
    /// `apply_rope_fusion`); eager: fp32 casts around a complex multiply (torchtitan's
    /// `apply_rotary_emb`).
    pub rope: bool,
    /// The loss as one kernel over the low-precision logits (flash-attn's `xentropy`,
    /// Megatron-Core's `cross_entropy_loss_fusion`): forward reads the logits twice, backward
    /// reads them and writes their gradient. Unfused: PyTorch's fp32 `log_softmax` and
    /// `nll_loss` after an fp32 copy of the logits, or as `unfused_loss` says (see `workload::loss::loss_bytes`).
    pub cross_entropy: bool,
    /// The query, key and value projections as one GEMM, and a gated MLP's gate and up
    /// projections as one (Megatron-Core's `linear_qkv` and `linear_fc1`, MPT's `Wqkv`); off, a
    /// GEMM each, as torchtitan's and Hugging Face's Llama code runs them (`wq`, `wk`, `wv`;
    /// `w1`, `w3`). A property of the model code more than of the framework: every profile
    /// fuses them.
    pub projections: bool,
    /// Grouped-query attention in the attention kernel: it reads each key-value head for its
    /// group of query heads in place (FlashAttention-2, cuDNN and Transformer Engine take
    /// fewer key-value heads; Megatron-Core). Off, the model code first repeats the key and
    /// value heads to the query heads (torchtitan's and Meta's `repeat_kv`, Hugging Face's
    /// eager and SDPA paths before `enable_gqa`): a copy of K and V at the queries' width,
    /// which the kernel reads, keeps for backward and, under context parallelism, passes
    /// around the ring. Only models with fewer key-value heads than heads notice.
    pub gqa: bool,
}

/// The casts around an fp8 GEMM (`training.framework.fp8_casts`; see [`FP8_CASTS_SOURCE`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Fp8Casts {
    /// Transformer Engine: one fused cast-transpose per GEMM input (the input and the weight
    /// forward, the output gradient backward), the transposes kept for the backward GEMMs.
    Te,
    /// torchao's `Float8Linear` with dynamic tensor-wise scaling (torchtitan): each operand an
    /// abs-max pass then a scaled cast, the high-precision input and weight kept and cast again
    /// in backward, the output gradient cast twice (one per backward GEMM).
    Torchao,
}

impl Fp8Casts {
    pub const NAMES: [&'static str; 2] = ["te", "torchao"];

    pub fn parse(name: &str) -> Option<Fp8Casts> {
        match name {
            "te" => Some(Fp8Casts::Te),
            "torchao" => Some(Fp8Casts::Torchao),
            _ => None,
        }
    }
}

/// Where `fp8_casts` comes from.
pub const FP8_CASTS_SOURCE: &str = "te: NVIDIA/TransformerEngine transformer_engine/pytorch/module/linear.py (fp8_cast_transpose_fused of the input and the weight in forward, the fp8 transposes saved for backward; the output gradient's cast-transpose in backward); torchao: pytorch/ao torchao/float8/float8_linear.py matmul_with_hp_or_float8_args (forward saves input_hp and weight_hp_t and casts both with hp_tensor_to_float8_dynamic: tensor_to_scale's abs-max over the tensor, then the scaled cast; backward casts grad_output for grad_input and again for grad_weight, the weight again for grad_input and the input again for grad_weight), the only scaling torchtitan's Float8Handler supported in December 2024 (torchtitan/float8.py: 'only dynamic tensor scaling (the default) is supported')";

/// A training metric a trainer computes over each micro-batch's logits after its backward,
/// without gradients (`training.framework.train_metrics`; see [`TRAIN_METRICS_SOURCE`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TrainMetric {
    /// Composer's `LanguageCrossEntropy`: PyTorch's unfused cross-entropy over the logits.
    CrossEntropy,
    /// Composer's `LanguagePerplexity`: the same cross-entropy again (its subclass).
    Perplexity,
    /// llm-foundry's `TokenAccuracy`: an argmax over the logits.
    TokenAccuracy,
}

impl TrainMetric {
    pub const NAMES: [&'static str; 3] = ["cross_entropy", "perplexity", "token_accuracy"];

    pub fn parse(name: &str) -> Option<TrainMetric> {
        match name {
            "cross_entropy" => Some(TrainMetric::CrossEntropy),
            "perplexity" => Some(TrainMetric::Perplexity),
            "token_accuracy" => Some(TrainMetric::TokenAccuracy),
            _ => None,
        }
    }
}

/// Where `train_metrics` comes from: Composer runs every training metric of the model after
/// each micro-batch's backward, and llm-foundry's models name theirs.
pub const TRAIN_METRICS_SOURCE: &str = "mosaicml/composer v0.13-v0.16 composer/trainer/trainer.py _train_microbatch: after microbatch_loss.backward(), _eval_train_metrics(device_batch) under torch.no_grad() and the autocast precision context, every metric's update over the micro-batch's outputs; composer/metrics/nlp.py LanguageCrossEntropy.update: torch.nn.CrossEntropyLoss(reduction='sum') over the logits (log_softmax autocasts to fp32), LanguagePerplexity subclasses it; mosaicml/llm-foundry llmfoundry/models/mpt/modeling_mpt.py ComposerMPTCausalLM: train metrics [LanguageCrossEntropy, LanguagePerplexity] (5f43bf160, May 2023; b2a43a147, October 2023; use_train_metrics defaults to true), llmfoundry/metrics/__init__.py DEFAULT_CAUSAL_LM_TRAIN_METRICS adds token_accuracy (an argmax) from 813d596bf (March 2024)";

/// Where `recompute_early_stop` comes from.
pub const RECOMPUTE_EARLY_STOP_SOURCE: &str = "pytorch/pytorch torch/utils/checkpoint.py (v2.1 and later): non-reentrant checkpoint (use_reentrant=False) stops recomputation as soon as every tensor the original forward saved for backward has been recomputed (_enable_checkpoint_early_stop = True by default, set_checkpoint_early_stop; pytorch#90105, #96866, March 2023); autograd saves a GEMM's inputs before running it, so a layer whose last saving op is the MLP's down projection skips that GEMM and the residual add after it. FSDP's checkpoint_wrapper defaults to CheckpointImpl.NO_REENTRANT (torch/distributed/algorithms/_checkpoint/checkpoint_wrapper.py); torch 1.13-2.0 and reentrant checkpoints (Megatron's and DeepSpeed's CheckpointFunction) rerun the whole layer";

/// Where `foreach_optimizer` comes from.
pub const FOREACH_SOURCE: &str = "pytorch/pytorch torch/optim/adam.py and adamw.py (v2.0 and later): foreach=None picks _multi_tensor_adam(w) for CUDA tensors, which builds exp_avg_sq_sqrt = torch._foreach_sqrt(device_exp_avg_sqs) (a new tensor per parameter) and divides and offsets it in place before _foreach_addcdiv_; mosaicml/composer composer/optim/decoupled_weight_decay.py DecoupledAdamW.adamw and llm-foundry's DecoupledLionW loop over the parameters one at a time";

/// A framework's behaviour, as data.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Framework {
    pub name: String,
    /// The version whose code the behaviours were read from.
    pub version: String,
    pub grad_reduce: GradReduce,
    /// ZeRO-3 / sharded data parallelism: how parameters are gathered.
    pub gather: Gather,
    /// Megatron-Core's distributed optimizer: the updated parameters' all-gather overlaps the
    /// next iteration's forward instead of ending the step.
    pub param_gather_overlap: bool,
    /// Gradient buckets only on the first pipeline stage's first model chunk; every other
    /// chunk is one bucket, reduced once its last backward ends and, under the distributed
    /// optimizer, its updated parameters gathered as one (Megatron-Core; see
    /// [`FIRST_CHUNK_BUCKETS_SOURCE`]).
    pub bucket_first_chunk_only: bool,
    /// With pipeline parallelism the gradients are reduced once the schedule's last backward
    /// has run, whatever `grad_reduce` says (DeepSpeed's PipelineEngine; see
    /// [`PIPELINE_REDUCE_SOURCE`]). Applied when the plan is resolved.
    pub pipeline_reduces_after_backward: bool,
    /// Under an interleaved schedule, pipeline sends and receives overlap compute: the plan's
    /// `p2p` defaults to `overlapped` (Megatron-Core; see [`INTERLEAVED_P2P_SOURCE`]).
    pub interleaved_p2p_overlap: bool,
    /// Below ZeRO-3 the gradient reductions run on the compute stream (`grad_reduce`
    /// `blocking`), whatever `grad_reduce` says (DeepSpeed's `overlap_comm` defaults on only
    /// under ZeRO-3; see [`OVERLAP_COMM_SOURCE`]). Applied when the plan is resolved.
    pub blocking_reduce_below_zero3: bool,
    /// `grad_reduce_dtype` `fp32` holds for bf16 (and fp8) training only: under fp16 the
    /// gradients are reduced in fp16 (Megatron forces fp32 accumulation and all-reduce for
    /// bf16 alone; see [`FP32_REDUCE_SOURCE`]). Applied when the plan is resolved.
    pub fp32_reduce_bf16_only: bool,
    /// The highest ZeRO stage the framework runs with pipeline parallelism (DeepSpeed's
    /// pipeline engine refuses ZeRO-2 and 3; see [`PIPELINE_REDUCE_SOURCE`]); a plan above it
    /// is refused.
    pub pipeline_max_zero_stage: u8,
    /// Tensor-parallel collectives overlap the neighbouring GEMMs (split into chunks).
    pub tp_comm_overlap: bool,
    /// A column-parallel layer's backward runs its communication beside its own GEMMs on an
    /// NCCL stream: the sequence-parallel input re-gathered for the weight gradient beside the
    /// data-gradient GEMM, and the input gradient's reduce-scatter (all-reduce without sequence
    /// parallelism) beside the weight-gradient GEMM (Megatron's
    /// `LinearWithGradAccumulationAndAsyncCommunication`, Transformer Engine's `Linear`; see
    /// [`TP_ASYNC_BACKWARD_SOURCE`]). Off, the input gradient is reduced on the compute stream
    /// after the layer's backward (Megatron-LM of 2021, DTensor's tensor parallelism) and the
    /// layer keeps its gathered input, so nothing is re-gathered.
    pub tp_async_backward: bool,
    /// Under sequence parallelism the column-parallel layers keep their all-gathered input for
    /// the weight gradient (DTensor's tensor parallelism: PyTorch's `parallelize_module` with
    /// `SequenceParallel` and `PrepareModuleInput`, as torchtitan runs it); off, they keep their
    /// sequence shard and gather it again in backward (Megatron's and Transformer Engine's
    /// layers, Colossal-AI's `Linear1D_Col`). See [`TP_GATHERED_INPUT_SOURCE`].
    pub tp_keeps_gathered_input: bool,
    /// Under sequence parallelism each column-parallel projection gathers its input itself: a
    /// model whose projections are separate modules (`fused.projections` off), each wrapped in
    /// DTensor's `ColwiseParallel(input_layouts=Shard(1))` with no `PrepareModuleInput` before
    /// them, all-gathers the sequence-sharded norm output once per projection (q, k and v; gate
    /// and up) and reduce-scatters each projection's input gradient in backward, where one
    /// gather and one reduce-scatter serve them all when the module's input is redistributed
    /// once (torchtitan, Megatron). Off in every profile. See [`TP_GATHERED_INPUT_SOURCE`].
    pub tp_gather_per_projection: bool,
    /// DTensor's collectives along a dimension other than the first copy their buffer once
    /// more on the compute stream: under sequence parallelism the all-gather of a
    /// `[batch, sequence, hidden]` activation along the sequence (`Shard(1)` to `Replicate`)
    /// gathers into rank-major order and then concatenates the ranks' chunks along the
    /// sequence, and the reduce-scatter the other way concatenates its input's chunks before
    /// the collective, each a read and a write of the whole tensor; so does the gather of
    /// replicated logits along the vocabulary. Megatron keeps activations sequence-first
    /// (`[sequence, batch, hidden]`), so its gathers need no copy. Not under `tp_comm_overlap`
    /// (torch.compile's micro-pipelined TP, whose fused all-gather-matmul and
    /// matmul-reduce-scatter work on the chunks) nor `tp_async_backward` (Megatron's layers). On in `pytorch-fsdp` and `pytorch-ddp`
    /// (PyTorch's tensor parallelism is DTensor's). See [`TP_LAYOUT_COPIES_SOURCE`].
    pub tp_layout_copies: bool,
    /// Under `tp_comm_overlap`, the overlap is PyTorch's micro-pipelined tensor parallelism
    /// (torch.compile's `_micro_pipeline_tp`, torchtitan's async TP) rather than Transformer
    /// Engine's userbuffers: a gather is fused with the GEMMs that consume it and a
    /// reduce-scatter with the one GEMM that produces it (`fused_all_gather_matmul`,
    /// `fused_matmul_reduce_scatter`), so the input gradient of separate projections (q, k and
    /// v; gate and up), a sum of their GEMMs' outputs, is reduce-scattered unfused after them,
    /// exposed; and the gathered input is kept for the weight gradients (no re-gather). On in
    /// `pytorch-fsdp` and `pytorch-ddp`. See [`TP_MICRO_PIPELINE_SOURCE`].
    pub tp_micro_pipeline: bool,
    /// Under tensor parallelism the output layer's vocabulary-sharded logits are all-gathered
    /// to every rank and the loss runs on the whole vocabulary on each (DTensor's
    /// `ColwiseParallel(output_layouts=Replicate())` on the head without `loss_parallel`);
    /// off, the loss runs on each rank's shard (Megatron's vocab-parallel cross-entropy,
    /// PyTorch's `loss_parallel`). Off in every profile.
    pub tp_replicate_logits: bool,
    /// Under tensor parallelism the token embedding is not split: every rank holds the whole
    /// table (ZeRO still shards it over the replicas) and looks up every token itself; under
    /// sequence parallelism the first norm keeps its sequence shard of the output (nothing to
    /// communicate forward) and the output's gradient is all-gathered back in backward
    /// (KempnerForge's DTensor plan, `kempnerforge/distributed/tensor_parallel.py`: the
    /// embedding left out of the plan, its output wrapped as `Replicate`). Off, the
    /// vocabulary is split over the ranks and their partial lookups summed (Megatron's
    /// `VocabParallelEmbedding`, DTensor's `RowwiseParallel` on the embedding). Off in every
    /// profile.
    pub tp_replicate_embedding: bool,
    /// Expert parallelism's all-to-alls overlap another micro-batch's compute (see
    /// [`EP_COMM_OVERLAP_SOURCE`]); off in every profile, a knob to turn on.
    pub ep_comm_overlap: bool,
    /// Each ZeRO-3 all-gather's output is copied into the unit's parameters on the compute
    /// stream before the unit runs (PyTorch FSDP2, see [`GATHER_COPY_OUT_SOURCE`]); off in
    /// every profile (FSDP1's flat parameters are views of the gathered buffer), a knob.
    pub gather_copy_out: bool,
    /// ZeRO-3 gathers every parameter tensor with its own list all-gather, as DeepSpeed did up
    /// to 0.5.4 (2021; see [`GATHER_PER_TENSOR_SOURCE`]): one all-gather per tensor, a copy
    /// kernel per rank out of each, and the host waiting for the gather before the module
    /// runs; and reduces each gradient tensor with its own list reduce-scatter, a copy kernel
    /// per rank into it. On in `deepspeed`, off in every other profile.
    pub gather_per_tensor: bool,
    pub bucket: Bucket,
    pub grad_reduce_dtype: ReduceDtype,
    /// The attention the framework runs (`training.attention` overrides): materialised scores,
    /// or a fused kernel (`te` under Megatron-Core: Transformer Engine's choice per GPU).
    pub attention: Attention,
    pub fused: Fused,
    /// Metrics computed over each micro-batch's logits after its backward (none in every
    /// profile: a trainer's, such as Composer's, not the parallel library's).
    pub train_metrics: Vec<TrainMetric>,
    /// Full recomputation stops once the tensors the layer's backward keeps are rebuilt,
    /// skipping the layer's last GEMM and what follows it (PyTorch 2.1's non-reentrant
    /// checkpoint; see [`RECOMPUTE_EARLY_STOP_SOURCE`]). On in `pytorch-fsdp`.
    pub recompute_early_stop: bool,
    /// The casts around fp8 GEMMs (Transformer Engine's in every profile; torchao's is a knob).
    pub fp8_casts: Fp8Casts,
    /// How the loss runs when it is not fused (`fused.cross_entropy` off): the bytes it moves,
    /// keeps and holds while it runs (see [`UNFUSED_LOSS_SOURCE`]).
    pub unfused_loss: UnfusedLoss,
    /// How context parallelism's ring runs around a fused attention kernel: Transformer
    /// Engine's point-to-point steps or PyTorch's `context_parallel` (see [`CP_RING_SOURCE`]).
    pub cp_ring: CpRing,
    /// Without `fused.adam`, Adam runs PyTorch's foreach implementation, which holds an fp32
    /// tensor per parameter (the update's denominator) while it steps; off, a loop over the
    /// parameters (Composer's `DecoupledAdamW`), one parameter's temporaries at a time (see
    /// [`FOREACH_SOURCE`]).
    pub foreach_optimizer: bool,
    /// (behaviour, source) pairs.
    pub sources: Vec<(&'static str, &'static str)>,
}

/// Where `ep_comm_overlap` comes from: the schedules that hide the expert all-to-alls behind
/// another micro-batch's compute.
pub const EP_COMM_OVERLAP_SOURCE: &str = "Megatron-Core's overlap_moe_expert_parallel_comm (--overlap-moe-expert-parallel-comm, core 0.14 and later, off by default): the combined 1F1B schedule (megatron/core/pipeline_parallel/combined_1f1b.py) co-schedules one micro-batch's forward with another's backward so that each one's expert all-to-alls run beside the other's compute; DeepSeek-V3's DualPipe does the same with its forward and backward chunks (arXiv 2412.19437, section 3.2.1)";

/// Where `gather_copy_out` comes from: FSDP2's all-gather lands in one flat buffer, and
/// `foreach_all_gather_copy_out` copies it into each parameter's own tensor on the current
/// (compute) stream after waiting for the all-gather's event.
pub const GATHER_COPY_OUT_SOURCE: &str = "pytorch/pytorch torch/distributed/_composable/fsdp/_fsdp_collectives.py (FSDP2, PyTorch 2.4 and later): foreach_all_gather_copy_out waits for the all-gather event on the current stream, then copies the flat all-gather output into each parameter's unsharded tensor (torch.split_with_sizes_copy): the unit's gathered bytes read and written once more on the compute stream before its forward (and again before its backward, after reshard_after_forward)";

/// Where `tp_async_backward` comes from.
pub const TP_ASYNC_BACKWARD_SOURCE: &str = "NVIDIA/Megatron-LM core_v0.6.0 megatron/core/tensor_parallel/layers.py LinearWithGradAccumulationAndAsyncCommunication.backward: with sequence parallelism the saved (sharded) input is all-gathered with async_op=True before the data-gradient matmul and waited for after it, then the input gradient's _reduce_scatter_base (all_reduce when async_grad_allreduce, without sequence parallelism) is launched with async_op=True before the weight-gradient GEMM and waited for after it (CUDA_DEVICE_MAX_CONNECTIONS=1 keeps the launch order); the same in the 2023 forks (FlagScale, Megatron-DeepSpeed's megatron/core/tensor_parallel/layers.py). NVIDIA/TransformerEngine v1.3 transformer_engine/pytorch/module/linear.py _Linear.backward ('Overlap input AG with dgrad', 'Overlap dgrad-RS/AR with wgrad'; LayerNormLinear likewise), which Megatron-Core's transformer_engine layers run. NVIDIA/Megatron-LM v2.5 (2021) megatron/mpu/layers.py ColumnParallelLinear: copy_to_tensor_model_parallel_region, whose backward all-reduces the input gradient after the layer's backward, on the compute stream";

/// Where `tp_keeps_gathered_input` comes from.
pub const TP_MICRO_PIPELINE_SOURCE: &str = "pytorch/pytorch torch/_inductor/fx_passes/micro_pipeline_tp.py: fuse_all_gather_matmul fuses an all-gather with the matmuls that take its result as their left operand; fuse_matmul_reduce_scatter fuses a reduce-scatter only when _find_producer_matmul finds an aten.mm or aten._scaled_mm (optionally between reshapes) producing its input, so a reduce-scatter of a sum of matmuls stays a plain functional collective; torch/distributed/_symmetric_memory/__init__.py _fused_all_gather_matmul_impl and _fused_matmul_reduce_scatter_impl, pipelined over the ranks' chunks with copy-engine transfers: _pipelined_all_gather_and_consume copies the rank's shard into its symmetric buffer on the compute stream before any transfer, then runs one chunk of rows of each consuming matmul per rank, each after its shard arrives (the rank's own first); _pipelined_produce_and_all2all computes the chunk for each peer before the peer pulls it and the rank's own last, and the stacked partial sums are added into the shard after all arrive (torch.sum over the stacked partials, reduce_partials in later versions); torchtitan parallelize_llama.py (9dec370, 820504e): separate wq, wk, wv and w1, w3 modules, async TP through torch._inductor.config._micro_pipeline_tp; the PyTorch team's account (dev-discuss.pytorch.org, '[Distributed w/ TorchTitan] Introducing Async Tensor Parallelism in PyTorch', 2024) reports up to 20-29% forward but about 8% end-to-end speedups";

pub const TP_LAYOUT_COPIES_SOURCE: &str = "pytorch/pytorch torch/distributed/_functional_collectives.py (PyTorch 2.3 and later; the same lines in every version read): all_gather_tensor, 'if gather_dim != 0: ... res = torch.cat(torch.chunk(res, group_size, dim=0), dim=gather_dim)' after all_gather_into_tensor, and reduce_scatter_tensor, 'if scatter_dim != 0: tensor_list = torch.chunk(self, group_size, dim=scatter_dim); self = torch.cat(tensor_list)' before reduce_scatter_tensor; DTensor's Shard(dim) redistributions call them with the shard dimension (torch/distributed/tensor/placement_types.py, Shard._to_replicate_tensor and Partial's reduce-scatter), and torchtitan's sequence parallelism shards dim 1 of [batch, sequence, hidden] (SequenceParallel, PrepareModuleInput(input_layouts=Shard(1)), parallelize_llama.py at 9dec370); Megatron-LM lays activations out [sequence, batch, hidden] and gathers along dim 0 (megatron/core/tensor_parallel/mappings.py _gather_along_first_dim)";

pub const TP_GATHERED_INPUT_SOURCE: &str = "pytorch/torchtitan torchtitan/parallelisms/parallelize_llama.py apply_tp (9dec370, December 2024): attention_norm and ffn_norm SequenceParallel, attention and feed_forward PrepareModuleInput(input_layouts Shard(1), desired_input_layouts Replicate()), wq/wk/wv and w1/w3 ColwiseParallel: the all-gather is a differentiable redistribute at the module's input, whose replicated output the linear layers save for their weight gradients (torch/distributed/tensor/parallel/style.py); Megatron-LM core_v0.6.0 LinearWithGradAccumulationAndAsyncCommunication saves the sharded input and all-gathers it again in backward (also Korthikanti et al. 2022, section 4.2.2), as Transformer Engine 1.3's Linear and LayerNormLinear do";

/// Where `fp32_reduce_bf16_only` comes from.
pub const FP32_REDUCE_SOURCE: &str = "megatron/arguments.py (v2.5, 2021) and megatron/training/arguments.py (2026): only with --bf16 is accumulate_allreduce_grads_in_fp32 turned on ('bfloat16 requires gradient accumulation and all-reduce to be done in fp32'); --fp16 leaves it off unless --accumulate-allreduce-grads-in-fp32 is given, so fp16 gradients are reduced in fp16";

/// Where `blocking_reduce_below_zero3` comes from.
pub const OVERLAP_COMM_SOURCE: &str = "deepspeed/runtime/zero/config.py overlap_comm: None resolves to (stage == ZeRO-3) in overlap_comm_valid; with it off, stage_1_and_2.py reduces each bucket on the current (compute) stream (average_tensor, allreduce_and_copy: stream = get_accelerator().current_stream()), so the backward waits for every reduction; without ZeRO the engine all-reduces after backward (engine.py allreduce_gradients). Set grad_reduce to overlapped for a config with \"overlap_comm\": true";

/// Where `interleaved_p2p_overlap` comes from.
pub const INTERLEAVED_P2P_SOURCE: &str = "megatron/training/arguments.py: --no-overlap-p2p-communication (dest overlap_p2p_comm, on unless given, since Megatron-LM of October 2023) overlaps the interleaved schedule's pipeline sends and receives with compute (megatron/core/pipeline_parallel/schedules.py forward_backward_pipelining_with_interleaving posts them asynchronously and waits before the step that needs them); set off for the non-interleaved schedule";

/// Where `pipeline_reduces_after_backward` comes from.
pub const PIPELINE_REDUCE_SOURCE: &str = "deepspeed/runtime/pipe/engine.py (v0.3-0.16): PipelineEngine sets enable_backward_allreduce = False, so no gradient is reduced during backward; the training schedule ends with a ReduceGrads step (_exec_reduce_grads: allreduce_gradients, or the BF16 optimizer's buffered all-reduce, in buffers of MEMORY_OPT_ALLREDUCE_SIZE elements) after the last backward; and it asserts zero_optimization_stage() < ZeroStageEnum.gradients ('ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism')";

/// Where `bucket_first_chunk_only` comes from.
pub const FIRST_CHUNK_BUCKETS_SOURCE: &str = "megatron/core/distributed/distributed_data_parallel.py (0.9-0.12): bucket_size is None on pipeline ranks after the first ('data-parallel communication on these stages is not on the critical path'), and megatron/training/training.py passes disable_bucketing for model chunks after the first ('communication for these model chunks is overlapped with compute anyway'): one bucket per such chunk, reduced when its last backward ends and gathered in one all-gather; with overlap_param_gather that gather is dispatched by the chunk's first forward pre-hook (param_and_grad_buffer.py finish_param_sync) unless the interleaved schedule's align_param_gather dispatched it up front";

/// Where `gather_per_tensor` comes from. microsoft/DeepSpeed v0.3.13 to v0.5.0 (March to August
/// 2021), `deepspeed/runtime/zero/partition_parameters.py` `_allgather_param`: a
/// `torch.cuda.synchronize()`, then `torch.distributed.all_gather(partitions, ...)` into a
/// list of `world_size` views, per parameter; PyTorch's `ProcessGroupNCCL::allgather` runs
/// the list form as one all-gather into a flat buffer and then one `copy_` per rank
/// (`torch/lib/c10d/ProcessGroupNCCL.cpp`, "Copy the flattened output tensors to the
/// outputs"); `stage3.py` `fetch_sub_module` waits for the module's gathers
/// (`_synchronize_communication`: the handles, the communication stream and
/// `torch.cuda.synchronize()`) before the module runs, and prefetches the next modules only
/// when no prefetch is in flight. Gradients go the same way: `_reduce_scatter_gradient` runs a
/// list `torch.distributed.reduce_scatter` per parameter, whose `ProcessGroupNCCL` first
/// copies each rank's input into one flat buffer ("Copy the input tensors to the flattened
/// inputs"). v0.5.5 (November 2021) coalesced the gathers.
pub const GATHER_PER_TENSOR_SOURCE: &str = "microsoft/DeepSpeed v0.3.13-v0.5.0 (2021) deepspeed/runtime/zero/partition_parameters.py _allgather_param (torch.cuda.synchronize(), then torch.distributed.all_gather into world_size views, per parameter; _reduce_scatter_gradient: a list reduce_scatter per parameter) and stage3.py fetch_sub_module (_synchronize_communication: torch.cuda.synchronize() before the module runs); PyTorch ProcessGroupNCCL::allgather copies the flat result into each of the world_size outputs and ::reduce_scatter each input into a flat buffer (one copy_ per rank); coalesced from v0.5.5";

/// Profile names from a list (`trainsim search --frameworks`, the Python package's
/// `search(frameworks=...)`): each one of [`NAMES`], or `all` for every one; in the order given,
/// each once.
pub fn parse_names<S: AsRef<str>>(list: &[S]) -> Result<Vec<&'static str>, String> {
    let mut out: Vec<&'static str> = Vec::new();
    for item in list {
        let f = item.as_ref();
        if f == "all" {
            out.extend(NAMES);
            continue;
        }
        match NAMES.iter().find(|n| **n == f) {
            Some(n) => out.push(n),
            None => return Err(format!("\"{f}\" is not one of: all, {}", NAMES.join(", "))),
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    out.retain(|n| seen.insert(*n));
    Ok(out)
}

/// The plan's features that pick a framework when the scenario names none.
#[derive(Clone, Copy, Debug)]
pub struct PlanTraits {
    pub tp: u32,
    pub pp: u32,
    pub cp: u32,
    pub zero_stage: u8,
    pub offloaded: bool,
    pub gemini: bool,
    /// Training in fp16 (with loss scaling), not bf16 or fp8.
    pub fp16: bool,
}

/// The framework a plan most likely runs on, and why (listed in `defaults_applied`):
/// Megatron for tensor or pipeline parallelism, Colossal-AI for Gemini, DeepSpeed for
/// ZeRO-Offload and ZeRO-1/2, PyTorch FSDP for ZeRO-3 (with context parallelism too, as
/// torchtitan runs FSDP2 with PyTorch's `context_parallel`), Megatron for context parallelism
/// otherwise, PyTorch DDP for data parallelism alone.
pub fn default_for(t: PlanTraits) -> (&'static str, &'static str) {
    if t.gemini {
        ("colossal-ai", "Gemini is Colossal-AI's")
    } else if t.tp > 1 || t.pp > 1 {
        ("megatron-core", "tensor or pipeline parallelism")
    } else if t.offloaded {
        ("deepspeed", "ZeRO-Offload is DeepSpeed's")
    } else if t.zero_stage == 3 {
        ("pytorch-fsdp", "ZeRO-3 without offload")
    } else if t.cp > 1 {
        ("megatron-core", "context parallelism without ZeRO-3")
    } else if t.zero_stage > 0 {
        ("deepspeed", "ZeRO-1/2")
    } else {
        ("pytorch-ddp", "data parallelism only")
    }
}

impl Framework {
    /// The gradient bucket in bytes for a data-parallel group of `dp` ranks whose gradients
    /// travel at `grad_bytes` bytes per parameter.
    pub fn bucket_bytes(&self, dp: u32, grad_bytes: f64) -> f64 {
        match self.bucket {
            Bucket::Bytes { bytes } => bytes,
            Bucket::Params { min_params, per_rank_params } => min_params.max(per_rank_params * dp as f64) * grad_bytes,
        }
    }

    /// Bytes per parameter of a reduced gradient, training at `param_bytes` per parameter.
    pub fn grad_reduce_bytes(&self, param_bytes: f64) -> f64 {
        match self.grad_reduce_dtype {
            ReduceDtype::Params => param_bytes,
            ReduceDtype::Fp32 => 4.0,
        }
    }
}

/// `docs/reference/frameworks.md`, rendered from the profiles (a test keeps the file equal).
pub fn reference_markdown() -> String {
    let mut s = String::from(
        "# Framework profiles\n\n\
         What `training.framework` selects (see `docs/scenario.md`). Generated from\n\
         `sim/src/framework/profiles.rs` by `TRAINSIM_BLESS=1 cargo test --release --test tests frameworks`;\n\
         edit the profiles there, not this file.\n\n\
         `ep_comm_overlap` is off in every profile; where a run turns it on:\n",
    );
    s += &format!("{EP_COMM_OVERLAP_SOURCE}.\n");
    s += &format!(
        "\n`gather_copy_out` is off in every profile (FSDP1's flat parameters are views of the gathered buffer); PyTorch FSDP2 (torchtitan) turns it on:\n{GATHER_COPY_OUT_SOURCE}.\n"
    );
    s += &format!(
        "\n`fp8_casts` is `te` in every profile (Transformer Engine's fused cast-transposes); torchtitan's Float8 training runs torchao's dynamic casts, `torchao`:\n{FP8_CASTS_SOURCE}.\n"
    );
    s += &format!(
        "\n`train_metrics` is empty in every profile (a trainer's metrics, not the parallel library's); Composer with llm-foundry's models computes `[\"cross_entropy\", \"perplexity\"]` (and `token_accuracy` from March 2024):\n{TRAIN_METRICS_SOURCE}.\n"
    );
    let yes = |b: bool| if b { "yes" } else { "no" };
    for n in NAMES {
        let f = profile(n).expect("profile");
        let gather = match f.gather {
            Gather::PerLayer { prefetch } => format!("per layer, {prefetch} layer(s) prefetched"),
            Gather::PerModule { prefetch_bucket_params, max_live_params, persistence_threshold } => format!(
                "per module, prefetch bucket {:.0}M parameters, at most {:.0}M live, tensors under {:.0}k elements kept gathered",
                prefetch_bucket_params / 1e6,
                max_live_params / 1e6,
                persistence_threshold / 1e3
            ),
        };
        let bucket = match f.bucket {
            Bucket::Bytes { bytes } => format!("{:.0} MiB", bytes / 1048576.0),
            Bucket::Params { min_params, per_rank_params } if per_rank_params > 0.0 => {
                format!("max({:.0}M, {:.0}M x dp) parameters", min_params / 1e6, per_rank_params / 1e6)
            }
            Bucket::Params { min_params, .. } => format!("{:.0}M parameters", min_params / 1e6),
        };
        let reduce = match f.grad_reduce {
            GradReduce::Overlapped => "bucket by bucket, overlapping backward",
            GradReduce::AfterBackward => "once, after the last backward",
            GradReduce::Blocking => "bucket by bucket on the compute stream, holding up backward",
        };
        let dtype = match f.grad_reduce_dtype {
            ReduceDtype::Params => "the training precision",
            ReduceDtype::Fp32 => "fp32",
        };
        s += &format!("\n## `{n}`\n\nRead from {}.\n\n| behaviour | value |\n|---|---|\n", f.version);
        s += &format!("| gradient reduction | {reduce} |\n| gradient bucket | {bucket} |\n");
        s += &format!("| gradient dtype | {dtype} |\n| ZeRO-3 gathers | {gather} |\n");
        let flags = [
            (
                "ZeRO-3 gathers each parameter tensor alone, copying it out per rank, the host waiting",
                f.gather_per_tensor,
            ),
            ("parameter all-gather overlaps next forward", f.param_gather_overlap),
            (
                "buckets only on the first stage's first model chunk (others: one bucket each)",
                f.bucket_first_chunk_only,
            ),
            ("with pipeline parallelism, gradients reduced after the last backward", f.pipeline_reduces_after_backward),
            ("interleaved schedule's pipeline sends overlap compute (`plan.p2p` default)", f.interleaved_p2p_overlap),
            ("below ZeRO-3, gradient reductions on the compute stream (`blocking`)", f.blocking_reduce_below_zero3),
            ("fp32 gradient reduction under bf16 only (fp16 training reduces in fp16)", f.fp32_reduce_bf16_only),
            ("TP communication overlaps GEMMs (with sequence parallelism)", f.tp_comm_overlap),
            (
                "column-parallel backward: input re-gathered beside the data-gradient GEMM, its gradient reduced beside the weight-gradient GEMM",
                f.tp_async_backward,
            ),
            ("with sequence parallelism, column-parallel layers keep their gathered input", f.tp_keeps_gathered_input),
            ("with sequence parallelism, each separate projection gathers its own input", f.tp_gather_per_projection),
            (
                "sequence-dimension gathers and reduce-scatters copy their buffer (DTensor's concatenation of chunks)",
                f.tp_layout_copies,
            ),
            (
                "TP overlap is PyTorch's micro-pipelined TP (a reduce-scatter fused only with the one GEMM that produces it)",
                f.tp_micro_pipeline,
            ),
            (
                "the output layer's logits gathered to every tensor-parallel rank, the loss run on each",
                f.tp_replicate_logits,
            ),
            ("the token embedding whole on every tensor-parallel rank", f.tp_replicate_embedding),
            ("expert all-to-alls overlap another micro-batch's compute", f.ep_comm_overlap),
        ];
        for (behaviour, on) in flags {
            s += &format!("| {behaviour} | {} |\n", yes(on));
        }
        s += &format!("| highest ZeRO stage with pipeline parallelism | {} |\n", f.pipeline_max_zero_stage);
        let attention = match f.attention {
            Attention::Naive => "materialised scores".to_string(),
            a => format!("fused (`{}`)", a.name()),
        };
        s += &format!("| attention | {attention} |\n");
        s += &format!("| context-parallel ring | `{}`: {} |\n", f.cp_ring.name(), f.cp_ring.summary());
        s += &format!(
            "| fused kernels | softmax {}, bias-GeLU {}, bias-dropout-add {}, Adam {}, RMSNorm {}, SwiGLU {}, rotary {}, cross-entropy {}, grouped-query attention in the kernel {} |\n\nSources:\n\n",
            yes(f.fused.softmax),
            yes(f.fused.bias_gelu),
            yes(f.fused.bias_dropout_add),
            yes(f.fused.adam),
            yes(f.fused.rms_norm),
            yes(f.fused.swiglu),
            yes(f.fused.rope),
            yes(f.fused.cross_entropy),
            yes(f.fused.gqa)
        );
        for (what, src) in &f.sources {
            s += &format!("- {what}: {src}\n");
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_has_a_profile_with_sources() {
        for n in NAMES {
            let f = profile(n).expect(n);
            assert_eq!(f.name, n);
            assert!(!f.sources.is_empty(), "{n} has no sources");
        }
        assert!(profile("megatron").is_none());
    }

    #[test]
    fn megatron_core_buckets_grow_with_dp() {
        let f = profile("megatron-core").unwrap();
        assert_eq!(f.bucket_bytes(8, 4.0), 40e6 * 4.0);
        assert_eq!(f.bucket_bytes(128, 4.0), 128e6 * 4.0);
    }

    #[test]
    fn defaults_follow_the_plan() {
        let t = PlanTraits { tp: 1, pp: 1, cp: 1, zero_stage: 0, offloaded: false, gemini: false, fp16: false };
        assert_eq!(default_for(t).0, "pytorch-ddp");
        assert_eq!(default_for(PlanTraits { zero_stage: 3, ..t }).0, "pytorch-fsdp");
        assert_eq!(default_for(PlanTraits { zero_stage: 3, offloaded: true, ..t }).0, "deepspeed");
        assert_eq!(default_for(PlanTraits { pp: 4, zero_stage: 1, ..t }).0, "megatron-core");
        assert_eq!(default_for(PlanTraits { cp: 2, ..t }).0, "megatron-core");
        assert_eq!(default_for(PlanTraits { cp: 2, zero_stage: 1, ..t }).0, "megatron-core");
        assert_eq!(default_for(PlanTraits { cp: 2, zero_stage: 3, ..t }).0, "pytorch-fsdp");
        assert_eq!(default_for(PlanTraits { gemini: true, tp: 2, ..t }).0, "colossal-ai");
    }
}
