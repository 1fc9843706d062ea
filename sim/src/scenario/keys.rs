//! The keys a scenario file may hold, per section: the one list the parser checks against
//! (`Obj::only`), the user's reference (`docs/scenario.md`) and the JSON Schema
//! (`docs/scenario.schema.json`) are tested against.
//!
//! A section is named as in the docs: a key path, with `[]` for a list item. A device, a link
//! and a node may each appear at several places; they are documented once under `device`,
//! `link` and `node`.

/// The top level of a scenario file.
pub const ROOT: &[&str] = &["name", "description", "workload", "cluster", "training", "plan", "simulation", "run"];

/// `run`: a whole training run (`trainsim train-run`).
pub const RUN: &[&str] = &[
    "dataset_samples",
    "epochs",
    "tokens",
    "iterations",
    "failures",
    "checkpoint",
    "restart_s",
    "variability",
    "seed",
];

/// `run.failures` as an object: a preset and per-component rates.
pub const RUN_FAILURES: &[&str] = &["preset", "gpu", "hbm", "nic", "switch", "host", "software", "maintenance"];

/// `run.checkpoint`.
pub const RUN_CHECKPOINT: &[&str] = &["interval_s", "storage_bytes_per_s_per_node", "async"];

/// `run.variability`.
pub const RUN_VARIABILITY: &[&str] =
    &["iteration_jitter", "kernel_jitter", "slow_node_probability", "slow_node_slowdown"];

/// `simulation`: how the engine models the run.
pub const SIMULATION: &[&str] = &[
    "network",
    "symmetry",
    "framework_overhead_bytes",
    "host_op_s",
    "memory_headroom",
    "device_variability",
    "kernel_jitter",
    "kernel_jitter_correlation_s",
    "kernel_jitter_draws",
    "seed",
];

/// `workload`: exactly one of `preset`, `transformer`, `hf_config`.
pub const WORKLOAD: &[&str] = &["preset", "transformer", "hf_config", "name"];

/// `workload.transformer`: a custom decoder or encoder stack.
pub const TRANSFORMER: &[&str] = &[
    "layers",
    "hidden",
    "heads",
    "vocab",
    "ffn_hidden",
    "kv_heads",
    "causal",
    "max_positions",
    "mlp",
    "norm",
    "bias",
    "dropout",
    "tied_embeddings",
    "rotary",
    "head_dim",
    "moe",
    "mla",
];

/// `workload.transformer.moe`: routed experts in place of the MLP.
pub const MOE: &[&str] =
    &["experts", "top_k", "expert_ffn", "shared_ffn", "dense_layers", "capacity_factor", "imbalance"];

/// `workload.transformer.mla`: multi-head latent attention (DeepSeek-V2/V3).
pub const MLA: &[&str] = &["q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"];

/// A link given as an object (`intra_node`, `nic`, `pcie`, `cluster.inter_node`).
pub const LINK: &[&str] = &["name", "preset", "bandwidth_bytes_per_s", "latency_s", "efficiency"];

/// A device given as an object (`cluster.node.device`, `cluster.device_overrides[].device`).
pub const DEVICE: &[&str] = &[
    "name",
    "preset",
    "kind",
    "vendor",
    "peak_flops",
    "hbm_bytes",
    "mem_bandwidth_bytes_per_s",
    "compute_units",
    "gemm_efficiency",
    "fp8_gemm_efficiency",
    "mem_efficiency",
    "kernel_launch_s",
    "rated_power_w",
    "power_limit_w",
    "dsp_count",
    "clock_hz",
    "ops_per_dsp_per_cycle",
    "sram_bytes",
    "op_efficiency",
];

/// A device's `peak_flops` given per precision.
pub const PEAK_FLOPS: &[&str] = &["fp32", "fp16", "bf16", "fp8"];

/// A node given as an object (`cluster.node`).
pub const NODE: &[&str] =
    &["name", "preset", "devices", "device", "intra_node", "intra_topology", "nics", "nic", "host_dram_bytes", "pcie"];

/// `cluster`.
pub const CLUSTER: &[&str] = &["node", "nodes", "inter_node", "fabric", "device_overrides", "nccl"];

/// `cluster.nccl`: the algorithms and protocols NCCL may use (`NCCL_ALGO`, `NCCL_PROTO`), its
/// release and `NCCL_RUNTIME_CONNECT`.
pub const NCCL: &[&str] = &["algo", "proto", "version", "runtime_connect"];

/// `cluster.fabric` (an object): pods of nodes and the level above them.
pub const FABRIC: &[&str] = &["preset", "pod_nodes", "oversubscription", "rail_optimized", "extra_latency_s"];

/// `cluster.device_overrides[]`: devices of another kind.
pub const DEVICE_OVERRIDE: &[&str] = &["devices", "device"];

/// `training`.
pub const TRAINING: &[&str] =
    &["global_batch", "micro_batch", "seq_len", "precision", "optimizer", "master_weights", "attention", "framework"];

/// `training.framework` as an object: a profile named, with knobs overridden.
pub const FRAMEWORK: &[&str] = &[
    "name",
    "grad_reduce",
    "gather_prefetch",
    "param_gather_overlap",
    "bucket_first_chunk_only",
    "tp_comm_overlap",
    "tp_async_backward",
    "tp_keeps_gathered_input",
    "tp_gather_per_projection",
    "tp_layout_copies",
    "tp_micro_pipeline",
    "tp_replicate_logits",
    "tp_replicate_embedding",
    "ep_comm_overlap",
    "gather_copy_out",
    "gather_per_tensor",
    "grad_reduce_dtype",
    "fused",
    "train_metrics",
    "recompute_early_stop",
    "unfused_loss",
    "cp_ring",
    "foreach_optimizer",
    "fp8_casts",
];

/// `training.framework.fused`: kernels fused or not.
pub const FUSED: &[&str] = &[
    "softmax",
    "bias_gelu",
    "bias_dropout_add",
    "adam",
    "rms_norm",
    "swiglu",
    "rope",
    "cross_entropy",
    "projections",
    "gqa",
];

/// `plan`.
pub const PLAN: &[&str] = &[
    "dp",
    "tp",
    "pp",
    "ep",
    "cp",
    "schedule",
    "virtual_stages",
    "tp_mode",
    "tp_depth",
    "sequence_parallel",
    "zero_stage",
    "dp_shard",
    "recompute",
    "recompute_modules",
    "recompute_layers",
    "offload",
    "partition",
    "token_slices",
    "token_granularity",
    "freeze",
    "bucket_bytes",
    "rank_order",
    "p2p",
];

/// `plan.offload` given as an object.
pub const OFFLOAD: &[&str] = &["optimizer", "params", "activations", "policy", "budget_bytes"];

/// `plan.freeze`: a freezing policy over a training run.
pub const FREEZE: &[&str] = &["policy", "alpha", "trace", "frozen_layers", "auto_pipe", "auto_dp", "auto_cache"];

/// Every section with its keys, named as in `docs/scenario.md`.
pub const SECTIONS: &[(&str, &[&str])] = &[
    ("(top level)", ROOT),
    ("workload", WORKLOAD),
    ("workload.transformer", TRANSFORMER),
    ("workload.transformer.moe", MOE),
    ("workload.transformer.mla", MLA),
    ("cluster", CLUSTER),
    ("cluster.fabric", FABRIC),
    ("cluster.nccl", NCCL),
    ("node", NODE),
    ("device", DEVICE),
    ("device.peak_flops", PEAK_FLOPS),
    ("link", LINK),
    ("cluster.device_overrides[]", DEVICE_OVERRIDE),
    ("training", TRAINING),
    ("training.framework", FRAMEWORK),
    ("training.framework.fused", FUSED),
    ("plan", PLAN),
    ("plan.offload", OFFLOAD),
    ("plan.freeze", FREEZE),
    ("run", RUN),
    ("run.failures", RUN_FAILURES),
    ("run.checkpoint", RUN_CHECKPOINT),
    ("run.variability", RUN_VARIABILITY),
    ("simulation", SIMULATION),
];

/// Values of string-valued keys that are a closed set, where the parser spells them out
/// itself rather than through a type's `NAMES` (kept here so the docs test sees them).
pub const SCHEDULES: &[&str] = &["gpipe", "1f1b", "interleaved", "2bw", "flush"];
pub const TP_MODES: &[&str] = &["1d", "2d", "2.5d", "3d"];
pub const ATTENTION: &[&str] = &crate::hardware::kernels::Attention::NAMES;
pub const MLP: &[&str] = &["gelu", "swiglu"];
pub const NORM: &[&str] = &["layernorm", "rmsnorm"];
pub const DEVICE_KINDS: &[&str] = &["gpu", "fpga", "cpu"];
pub const PARTITION_POLICIES: &[&str] = &["uniform", "balanced", "parameters", "explore"];
pub const OFFLOAD_POLICIES: &[&str] = &["none", "gemini", "gemini-lru", "const", "zero-offload", "zero-infinity"];
pub const FREEZE_POLICIES: &[&str] = &["autofreeze", "gradient", "schedule"];
pub const SEQUENCE_PARALLEL: &[&str] = &["megatron", "ring"];
