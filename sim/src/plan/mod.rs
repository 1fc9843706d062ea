//! The parallel plan: how one training iteration is spread over the devices.
//!
//! A [`Plan`] is already validated against its workload and cluster (see `scenario`): its
//! degrees multiply to the device count, its partition covers every layer once, and its
//! micro-batch count suits its schedule. Everything downstream may rely on that.

use crate::schedule::ScheduleKind;
use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Recompute {
    None,
    Selective,
    Full,
}

impl Recompute {
    pub const NAMES: [&'static str; 3] = ["none", "selective", "full"];
    pub fn parse(s: &str) -> Option<Recompute> {
        Some(match s {
            "none" => Recompute::None,
            "selective" => Recompute::Selective,
            "full" => Recompute::Full,
            _ => return None,
        })
    }
}

/// What selective recomputation reruns: Megatron-Core's `recompute_modules`
/// (`megatron/core/transformer/transformer_config.py`, core 0.12 and later), a set of
/// [`RecomputeModules::NAMES`]; `core_attn` by default. `core_attn`, `mlp`, `moe` and
/// `shared_experts` are checkpointed whole (their input kept, everything inside rerun);
/// `layernorm`, `mla_up_proj` and `moe_act` discard their output once its consumer has run and
/// recompute it before the consumer's backward ("output-discarding checkpointing").
///
/// `op_sac` stands alone: PyTorch's per-op selective activation checkpointing as torchtitan's
/// `selective_ac_option = "op"` applies it to every layer (see `workload::recompute`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecomputeModules(u8);

impl RecomputeModules {
    pub const NAMES: [&'static str; 8] =
        ["core_attn", "layernorm", "mla_up_proj", "moe_act", "mlp", "moe", "shared_experts", "op_sac"];
    /// Megatron-Core's default.
    pub const CORE_ATTN: RecomputeModules = RecomputeModules(1);

    /// The set of `names` (each one of [`Self::NAMES`]); `Err` names the first unknown one.
    pub fn from_names<S: AsRef<str>>(names: &[S]) -> Result<RecomputeModules, String> {
        let mut bits = 0u8;
        for n in names {
            let i = Self::NAMES.iter().position(|m| *m == n.as_ref()).ok_or_else(|| n.as_ref().to_string())?;
            bits |= 1 << i;
        }
        Ok(RecomputeModules(bits))
    }

    pub fn contains(self, name: &str) -> bool {
        Self::NAMES.iter().position(|m| *m == name).is_some_and(|i| self.0 & (1 << i) != 0)
    }

    pub fn names(self) -> Vec<&'static str> {
        Self::NAMES.iter().enumerate().filter(|(i, _)| self.0 & (1 << i) != 0).map(|(_, n)| *n).collect()
    }
}

impl Default for RecomputeModules {
    fn default() -> RecomputeModules {
        RecomputeModules::CORE_ATTN
    }
}

impl Serialize for RecomputeModules {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.names().serialize(s)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Optimizer {
    Adam,
    Sgd,
}

impl Optimizer {
    pub const NAMES: [&'static str; 2] = ["adam", "sgd"];
    pub fn parse(s: &str) -> Option<Optimizer> {
        Some(match s {
            "adam" | "adamw" => Optimizer::Adam,
            "sgd" => Optimizer::Sgd,
            _ => return None,
        })
    }
}

pub fn schedule_name(kind: ScheduleKind) -> &'static str {
    match kind {
        ScheduleKind::GPipe => "gpipe",
        ScheduleKind::OneFOneB => "1f1b",
        ScheduleKind::Interleaved => "interleaved",
        ScheduleKind::TwoBW => "2bw",
        ScheduleKind::Flush => "flush",
    }
}

pub fn parse_schedule(s: &str) -> Option<ScheduleKind> {
    Some(match s {
        "gpipe" => ScheduleKind::GPipe,
        "1f1b" => ScheduleKind::OneFOneB,
        "interleaved" => ScheduleKind::Interleaved,
        "2bw" => ScheduleKind::TwoBW,
        "flush" => ScheduleKind::Flush,
        _ => return None,
    })
}

/// Where a kind of model state lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// Device memory (HBM).
    Device,
    /// Host DRAM, over PCIe.
    Cpu,
    /// The node's NVMe drives, through host DRAM.
    Nvme,
}

impl Tier {
    pub const NAMES: [&'static str; 5] = ["none", "gpu", "device", "cpu", "nvme"];
    pub fn parse(s: &str) -> Option<Tier> {
        Some(match s {
            "none" | "gpu" | "device" => Tier::Device,
            "cpu" => Tier::Cpu,
            "nvme" => Tier::Nvme,
            _ => return None,
        })
    }
}

/// Static offload of model states (ZeRO-Offload, ZeRO-Infinity), or Gemini's dynamic placement.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Offload {
    /// Optimizer states and fp32 master weights; off the device, the optimizer step runs on
    /// the host CPU.
    pub optimizer: Tier,
    /// Low-precision parameters (needs ZeRO stage 3): fetched before each use.
    pub params: Tier,
    /// Activations kept for backward: copied out after each layer's forward and fetched
    /// back (one layer ahead) before its backward.
    pub activations: Tier,
    /// Gemini: model-state chunks move between device and host on demand.
    pub dynamic: Option<Dynamic>,
}

impl Offload {
    pub const NONE: Offload =
        Offload { optimizer: Tier::Device, params: Tier::Device, activations: Tier::Device, dynamic: None };
}

/// Gemini's chunk placement (Colossal-AI): one chunk per layer's sharded states; before a
/// layer runs its chunk must be on the device; when room is short the chunk evicted is chosen
/// by `eviction`; the optimizer updates each chunk where it lives.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Dynamic {
    pub eviction: crate::policy::gemini::Eviction,
    /// A fixed device budget for chunks (Gemini's `const` policy), instead of what the
    /// device has left.
    pub budget_bytes: Option<f64>,
}

/// How layers are cut into pipeline stages when the scenario names a policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PartitionPolicy {
    /// Exact min-max of stage time including the boundary transfer, under each stage's
    /// memory (BaPipe's balanced partition; `policy::partition`).
    Balanced,
    /// PipeTransformer's parameter-size greedy, over whole layers.
    Parameters,
    /// BaPipe: the best schedule, micro-batch size and balanced partition (by simulation).
    Explore,
}

/// A frozen prefix of the network.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Frozen {
    pub layers: u32,
    /// AutoCache: the output of the first `cached_layers` frozen layers is read back from
    /// host memory (written when they froze); only the layers frozen since run forward.
    pub cached_layers: u32,
    /// Share of the cache that did not fit in host DRAM and is read from the node's disks.
    pub cache_on_disk: f64,
}

/// A sub-batch of sequences and the token slices each of its sequences is cut into.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SlicedBatch {
    pub sequences: u32,
    pub slices: Vec<u32>,
}

/// Token slicing as given in the scenario.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenSlices {
    /// Optimise (TeraPipe's dynamic program) with slices in multiples of `granularity` tokens.
    Auto { granularity: u32 },
    /// Every replica's batch as these sub-batches, in order.
    Explicit(Vec<SlicedBatch>),
}

/// One unit of pipeline work: `batch` sequences, `tokens` of each, after `context` earlier
/// tokens of the same sequences.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Unit {
    pub batch: u32,
    pub tokens: u32,
    pub context: u32,
}

/// Order of the parallel dimensions when numbering devices (and so placing them on nodes),
/// innermost first. Megatron-LM's default (`tp-dp-pp`) keeps a tensor-parallel group inside a
/// node, then the data-parallel replicas of a stage, then the pipeline stages; `tp-pp-dp`
/// makes each replica's whole pipeline a block of consecutive devices (data-parallel groups
/// strided by tp x pp, as Megatron-LM 2019's model-parallel-inner numbering extends to
/// pipelines), so consecutive stages share nodes and gradient all-reduces cross them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum RankOrder {
    #[serde(rename = "tp-dp-pp")]
    TpDpPp,
    #[serde(rename = "tp-pp-dp")]
    TpPpDp,
}

impl RankOrder {
    pub const NAMES: [&'static str; 2] = ["tp-dp-pp", "tp-pp-dp"];

    /// Device index of (replica, stage, tensor rank) for degrees `[dp, pp, tp]`.
    pub fn device(self, [dp, pp, tp]: [u32; 3], replica: u32, stage: u32, rank: u32) -> u32 {
        match self {
            RankOrder::TpDpPp => (stage * dp + replica) * tp + rank,
            RankOrder::TpPpDp => (replica * pp + stage) * tp + rank,
        }
    }

    /// (replica, stage, tensor rank) of a device: the inverse of [`RankOrder::device`].
    pub fn coords(self, [dp, pp, tp]: [u32; 3], device: u32) -> (u32, u32, u32) {
        let (rest, rank) = (device / tp, device % tp);
        match self {
            RankOrder::TpDpPp => (rest % dp, rest / dp, rank),
            RankOrder::TpPpDp => (rest / pp, rest % pp, rank),
        }
    }

    pub fn parse(s: &str) -> Option<RankOrder> {
        match s {
            "tp-dp-pp" => Some(RankOrder::TpDpPp),
            "tp-pp-dp" => Some(RankOrder::TpPpDp),
            _ => None,
        }
    }
}

/// How a pipeline stage's send relates to its next op. Megatron-LM waits for its batched
/// point-to-point requests (and synchronizes) before the next forward or backward, DeepSpeed's
/// pipeline engine sends synchronously, and TeraPipe's latency model charges each slice a
/// receive and a send on top of its compute: `Blocking`, the default. `Overlapped` lets the
/// next op start while the send is in flight (a separate copy stream, as torchgpipe does or
/// Megatron-LM's `overlap_p2p_comm`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum P2p {
    Blocking,
    Overlapped,
}

impl P2p {
    pub const NAMES: [&'static str; 2] = ["blocking", "overlapped"];

    pub fn parse(s: &str) -> Option<P2p> {
        match s {
            "blocking" => Some(P2p::Blocking),
            "overlapped" => Some(P2p::Overlapped),
            _ => None,
        }
    }
}

/// A validated parallel plan.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Plan {
    pub dp: u32,
    pub tp: u32,
    pub pp: u32,
    /// Expert parallelism: each MoE layer's routed experts are split over `ep` consecutive
    /// data-parallel replicas (same stage and tensor rank), tokens exchanged by all-to-all
    /// (Megatron-Core's layout); 1 for dense workloads.
    pub ep: u32,
    /// Context parallelism (Megatron-Core's): each sequence is split over `cp` devices (the
    /// `cp` consecutive replicas of one data-parallel replica, same stage and tensor rank),
    /// keys and values passed around them in a ring; 1 for none.
    pub cp: u32,
    #[serde(serialize_with = "ser_schedule")]
    pub schedule: ScheduleKind,
    pub virtual_stages: u32,
    pub recompute: Recompute,
    /// What selective recomputation reruns (Megatron-Core's `recompute_modules`).
    pub recompute_modules: RecomputeModules,
    /// Under full recomputation, how many layers of each model chunk recompute: the chunk's
    /// first ones (Megatron-LM's `--recompute-method block --recompute-num-layers`); the others
    /// keep every activation. `None`: every layer.
    pub recompute_layers: Option<u32>,
    /// Data-parallel ranks one ZeRO shard spans (hybrid sharding: PyTorch FSDP's
    /// `HYBRID_SHARD`, torchtitan's `data_parallel_shard_degree`, Megatron-Core's
    /// `num_distributed_optimizer_instances`): consecutive replicas hold one copy of the
    /// sharded state, and the `sync_degree / dp_shard` copies all-reduce their shards.
    /// `None`: the whole data-parallel group ([`Plan::shard_degree`]).
    pub dp_shard: Option<u32>,
    pub zero_stage: u8,
    pub sequence_parallel: bool,
    pub tp_mode: crate::workload::TpMode,
    /// How devices are numbered, and so which share a node.
    pub rank_order: RankOrder,
    /// Whether a stage's next op waits for its pipeline send.
    pub p2p: P2p,
    /// Fused attention kernels (`training.attention`: "flash", or a named generation) or
    /// materialised scores.
    pub attention: crate::hardware::kernels::Attention,
    /// Which elementwise kernels are fused (a framework profile's choice).
    pub fusion: crate::workload::Fusion,
    /// Layers of each pipeline chunk (pp x virtual_stages entries, in model order).
    pub partition: Vec<u32>,
    pub micro_batches: u32,
    pub micro_batch: u32,
    pub seq_len: u32,
    pub precision: crate::hardware::Precision,
    pub optimizer: Optimizer,
    /// fp32 master weights and optimizer states under 16-bit training (`training.master_weights`).
    pub master_weights: bool,
    /// Data-parallel gradient bucket (bytes of gradients per all-reduce).
    pub bucket_bytes: f64,
    pub offload: Offload,
    /// TeraPipe token slicing: how each replica's sequences are cut into sub-batches and
    /// token slices (resolved; `auto` is decided by `policy::token_slicing` before lowering).
    pub token_slices: Option<TokenSlices>,
    /// PipeTransformer: the first layers (and the embedding) frozen; they run forward only on
    /// the first stage, outside the pipeline's partition, and take no gradients.
    pub frozen: Frozen,
    /// A partition policy the simulator resolves before lowering (`partition` then holds
    /// its result).
    pub partition_policy: Option<PartitionPolicy>,
    /// What the training framework does that the plan does not say (overlap, gathers, fused
    /// kernels, gradient dtype).
    pub framework: crate::framework::Framework,
}

fn ser_schedule<S: serde::Serializer>(k: &ScheduleKind, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(schedule_name(*k))
}

/// The features of a plan that pick its framework when the scenario names none
/// ([`crate::framework::default_for`]), from the plan's parts.
pub fn framework_traits(
    (tp, pp, cp): (u32, u32, u32),
    zero_stage: u8,
    offload: &Offload,
    precision: crate::hardware::Precision,
) -> crate::framework::PlanTraits {
    crate::framework::PlanTraits {
        tp,
        pp,
        cp,
        zero_stage,
        offloaded: offload.optimizer != Tier::Device || offload.params != Tier::Device,
        gemini: offload.dynamic.is_some(),
        fp16: precision == crate::hardware::Precision::Fp16,
    }
}

impl Plan {
    /// [`framework_traits`] of this plan.
    pub fn framework_traits(&self) -> crate::framework::PlanTraits {
        framework_traits((self.tp, self.pp, self.cp), self.zero_stage, &self.offload, self.precision)
    }

    /// The shape of one transformer layer under this plan (micro-batch, sequence, tensor
    /// parallelism, kernels), its activations at the training precision.
    pub fn layer_shape(&self) -> crate::workload::LayerShape {
        crate::workload::LayerShape {
            micro_batch: self.micro_batch,
            seq_len: self.seq_len / self.cp,
            tp: self.tp,
            tp_mode: self.tp_mode,
            ep: self.ep,
            cp: self.cp,
            context: 0,
            sequence_parallel: self.sequence_parallel,
            attention: self.attention,
            fusion: self.fusion,
            activation_bytes: self.precision.activation_bytes(),
        }
    }

    pub fn devices(&self) -> u32 {
        self.replicas() * self.tp * self.pp
    }

    /// Devices that run one stage's tensor rank on different data: the data-parallel replicas
    /// times the context-parallel ranks of each (`dp x cp`, context innermost, as
    /// Megatron-Core's tp-cp-ep-dp-pp order). The lowering's "replica" is one of them: they
    /// hold the same weights and sum their gradients.
    pub fn replicas(&self) -> u32 {
        self.dp * self.cp
    }

    /// Whether expert parallelism's all-to-alls overlap another micro-batch's compute
    /// (`framework.ep_comm_overlap` with `ep` > 1).
    pub fn ep_overlap(&self) -> bool {
        self.ep > 1 && self.framework.ep_comm_overlap
    }

    /// The context-parallel group of replica `r`'s tensor rank `x` of `stage`: the `cp`
    /// consecutive replicas that share its sequences, in ring order.
    pub fn cp_members(&self, r: u32, stage: u32, x: u32) -> Vec<u32> {
        self.consecutive_replicas(r, self.cp, stage, x)
    }

    /// Tensor rank `x` of `stage` in the `k` consecutive replicas whose group holds `r`.
    fn consecutive_replicas(&self, r: u32, k: u32, stage: u32, x: u32) -> Vec<u32> {
        let g = r / k * k;
        (g..g + k).map(|q| self.device(q, stage, x)).collect()
    }

    /// Device index of (replica, pipeline stage, tensor rank) in the plan's rank order, a
    /// replica being one of [`Plan::replicas`].
    pub fn device(&self, dp: u32, stage: u32, tp: u32) -> u32 {
        self.rank_order.device([self.replicas(), self.pp, self.tp], dp, stage, tp)
    }

    /// (dp, stage, tp) of a device.
    pub fn coords(&self, device: u32) -> (u32, u32, u32) {
        self.rank_order.coords([self.replicas(), self.pp, self.tp], device)
    }

    /// Whether the tensor-parallel group does sequence parallelism with ring attention.
    pub fn ring(&self) -> bool {
        self.tp_mode == crate::workload::TpMode::Ring && self.tp > 1
    }

    /// Ranks the token embedding's table is split over: the tensor-parallel degree, or 1 where
    /// every rank holds it whole (ring self-attention's whole layers;
    /// `framework.tp_replicate_embedding`, untied embeddings only).
    pub fn embedding_shards(&self) -> f64 {
        if self.ring() || self.fusion.replicated_embedding { 1.0 } else { self.tp as f64 }
    }

    /// Whether the tensor-parallel all-gathers and reduce-scatters overlap their neighbouring
    /// GEMMs: the framework does it (`tp_comm_overlap`, Megatron-Core with Transformer
    /// Engine's userbuffers), and only under Megatron sequence parallelism in one dimension,
    /// which it requires.
    pub fn tp_overlap(&self) -> bool {
        self.framework.tp_comm_overlap
            && self.sequence_parallel
            && self.tp > 1
            && self.tp_mode == crate::workload::TpMode::OneD
    }

    /// Whether a column-parallel layer's backward runs its tensor-parallel collectives on an
    /// NCCL stream beside its GEMMs (`framework.tp_async_backward`, one-dimensional tensor
    /// parallelism; under [`Plan::tp_overlap`] Transformer Engine's bulk overlaps do it).
    pub fn tp_async(&self) -> bool {
        self.framework.tp_async_backward
            && !self.tp_overlap()
            && self.tp > 1
            && self.tp_mode == crate::workload::TpMode::OneD
    }

    /// The ZeRO stage from which each device keeps only its shard of the gradients: 2, or
    /// never (4) when the framework reduces after the last micro-batch's backward (`grad_reduce:
    /// after_backward`), which holds the whole stage's gradients, in the reduction's dtype,
    /// until that one reduction: PyTorch's pipelining of FSDP2, and FSDP2's
    /// `set_requires_gradient_sync(False)` over the micro-batches of a gradient-accumulation
    /// step, both turn gradient sync off until the last backward, and FSDP2 then accumulates
    /// the unsharded gradients in its `reduce_dtype` (`FSDPParam.to_accumulated_grad_if_needed`).
    /// Under ZeRO-3 that last backward still reduce-scatters layer by layer.
    pub fn gradient_shard_stage(&self) -> u8 {
        if self.framework.grad_reduce == crate::framework::GradReduce::AfterBackward { 4 } else { 2 }
    }

    /// Devices that hold the same weights and sum their gradients: the data-parallel
    /// replicas, times the ring under ring sequence parallelism.
    pub fn sync_degree(&self) -> u32 {
        self.replicas() * if self.ring() { self.tp } else { 1 }
    }

    /// Ranks the ZeRO state (optimizer, gradient and parameter shards) is split over: the
    /// data-parallel group, or its shard groups under hybrid sharding (`plan.dp_shard`).
    pub fn shard_degree(&self) -> u32 {
        self.dp_shard.unwrap_or_else(|| self.sync_degree())
    }

    /// Whether ZeRO's state is sharded over part of the data-parallel group and replicated
    /// across the parts (hybrid sharding).
    pub fn hybrid_shard(&self) -> bool {
        self.shard_degree() < self.sync_degree()
    }

    /// Under hybrid sharding, the devices of replica `r`'s shard group (tensor rank `x` of
    /// `stage`): the `dp_shard` consecutive replicas around `r`; the whole group otherwise.
    pub fn shard_members(&self, r: u32, stage: u32, x: u32) -> Vec<u32> {
        if !self.hybrid_shard() {
            return self.sync_members(stage, x);
        }
        self.consecutive_replicas(r, self.shard_degree(), stage, x)
    }

    /// Under hybrid sharding, the devices that hold the same shard as replica `r`'s (tensor
    /// rank `x` of `stage`): one per shard group, at `r`'s place in it.
    pub fn replicate_members(&self, r: u32, stage: u32, x: u32) -> Vec<u32> {
        let s = self.shard_degree();
        (r % s..self.replicas()).step_by(s as usize).map(|q| self.device(q, stage, x)).collect()
    }

    /// The recomputation layer `l` (a model layer) runs: the plan's, or none past the first
    /// `recompute_layers` of its chunk.
    pub fn layer_recompute(&self, l: u32) -> Recompute {
        match self.recompute_layers {
            Some(n) if self.recompute == Recompute::Full => {
                let starts = self.chunk_starts();
                if l < starts[0] {
                    return self.recompute;
                }
                let c = starts.partition_point(|&s| s <= l) - 1;
                if l - starts[c] < n { Recompute::Full } else { Recompute::None }
            }
            _ => self.recompute,
        }
    }

    /// The devices that sum gradients with tensor rank `x` of `stage`, in ring order.
    pub fn sync_members(&self, stage: u32, x: u32) -> Vec<u32> {
        if self.ring() {
            (0..self.replicas())
                .flat_map(|r| (0..self.tp).map(move |xx| (r, xx)))
                .map(|(r, xx)| self.device(r, stage, xx))
                .collect()
        } else {
            (0..self.replicas()).map(|r| self.device(r, stage, x)).collect()
        }
    }

    /// The expert-parallel group of tensor rank `x` of `stage` in replica `r`: the `ep`
    /// consecutive replicas of its group, in replica order.
    pub fn ep_members(&self, r: u32, stage: u32, x: u32) -> Vec<u32> {
        self.consecutive_replicas(r, self.ep, stage, x)
    }

    /// The devices that sum expert gradients with replica `r`'s tensor rank `x` of `stage`:
    /// the replicas that hold the same experts (`r` modulo `ep`), `dp x cp / ep` of them.
    pub fn expert_sync_members(&self, r: u32, stage: u32, x: u32) -> Vec<u32> {
        (r % self.ep..self.replicas()).step_by(self.ep as usize).map(|q| self.device(q, stage, x)).collect()
    }

    /// The devices that split ZeRO's state of the routed experts replica `r`'s tensor rank `x`
    /// of `stage` holds: those holding the same experts in its shard group under hybrid
    /// sharding (`dp_shard / ep` of them; `ep` divides `dp_shard`), all of them otherwise.
    pub fn expert_shard_members(&self, r: u32, stage: u32, x: u32) -> Vec<u32> {
        if !self.hybrid_shard() {
            return self.expert_sync_members(r, stage, x);
        }
        let s = self.shard_degree();
        let base = r / s * s;
        (base + r % self.ep..base + s).step_by(self.ep as usize).map(|q| self.device(q, stage, x)).collect()
    }

    /// Replicas the routed experts' ZeRO state is split over ([`Plan::expert_shard_members`]).
    pub fn expert_shard_degree(&self) -> u32 {
        self.shard_degree() / self.ep.max(1)
    }

    /// The pipeline units of one replica, in order: the micro-batches, or (token slicing)
    /// each sub-batch's slices. `auto` slicing must be resolved before this is called.
    pub fn units(&self) -> Vec<Unit> {
        match &self.token_slices {
            None => {
                vec![Unit { batch: self.micro_batch, tokens: self.seq_len, context: 0 }; self.micro_batches as usize]
            }
            Some(TokenSlices::Explicit(subs)) => subs
                .iter()
                .flat_map(|sb| {
                    let mut context = 0;
                    sb.slices.iter().map(move |&l| {
                        let u = Unit { batch: sb.sequences, tokens: l, context };
                        context += l;
                        u
                    })
                })
                .collect(),
            Some(TokenSlices::Auto { .. }) => panic!("token_slices \"auto\" must be resolved before lowering"),
        }
    }

    pub fn chunks(&self) -> u32 {
        self.pp * self.virtual_stages
    }

    /// First layer of each chunk, with the total at the end.
    pub fn chunk_starts(&self) -> Vec<u32> {
        let mut v = Vec::with_capacity(self.partition.len() + 1);
        let mut acc = self.frozen.layers;
        v.push(acc);
        for l in &self.partition {
            acc += l;
            v.push(acc);
        }
        v
    }

    /// Split `layers` as evenly as possible over `chunks`, extra layers to the later chunks
    /// (the first stage also carries the embedding, the last the head).
    pub fn uniform_partition(layers: u32, chunks: u32) -> Vec<u32> {
        let base = layers / chunks;
        let extra = layers % chunks;
        (0..chunks).map(|c| base + u32::from(c >= chunks - extra)).collect()
    }

    /// The partition a plan takes when it names none: uniform where the chunks divide the
    /// layers, else [`Self::ends_short_partition`].
    pub fn default_partition(layers: u32, chunks: u32) -> Vec<u32> {
        if layers.is_multiple_of(chunks.max(1)) {
            Self::uniform_partition(layers, chunks)
        } else {
            Self::ends_short_partition(layers, chunks)
        }
    }

    /// Split `layers` over `chunks` with at most one layer of difference, the shorter chunks
    /// at both ends of the model in turn (first, last, second, second-to-last, ...): the first
    /// chunk also carries the embedding and the last the head. Meta trained Llama 3 405B's 126
    /// layers this way, one layer fewer on the first and the last pipeline stage (The Llama 3
    /// Herd of Models, 2024, section 3.3.2).
    pub fn ends_short_partition(layers: u32, chunks: u32) -> Vec<u32> {
        let size = layers.div_ceil(chunks);
        let short = chunks * size - layers;
        let mut v = vec![size; chunks as usize];
        for i in 0..short {
            let c = if i % 2 == 0 { i / 2 } else { chunks - 1 - i / 2 };
            v[c as usize] -= 1;
        }
        v
    }
}

#[cfg(test)]
mod rank_order_tests {
    use super::RankOrder;

    /// Both orders number every (replica, stage, rank) once, and place a tensor group on
    /// consecutive devices; `tp-pp-dp` also a replica's whole pipeline.
    #[test]
    fn orders_are_bijections_with_their_blocks() {
        let (dp, pp, tp) = (3u32, 4u32, 2u32);
        for order in [RankOrder::TpDpPp, RankOrder::TpPpDp] {
            let mut seen = vec![false; (dp * pp * tp) as usize];
            for r in 0..dp {
                for s in 0..pp {
                    for x in 0..tp {
                        let d = order.device([dp, pp, tp], r, s, x);
                        assert!(!seen[d as usize], "{order:?}: device {d} twice");
                        seen[d as usize] = true;
                        assert_eq!(d - x, order.device([dp, pp, tp], r, s, 0));
                        assert_eq!(order.coords([dp, pp, tp], d), (r, s, x));
                    }
                }
            }
        }
        for r in 0..dp {
            let first = RankOrder::TpPpDp.device([dp, pp, tp], r, 0, 0);
            assert_eq!(first, r * pp * tp);
            assert_eq!(RankOrder::TpPpDp.device([dp, pp, tp], r, pp - 1, tp - 1), first + pp * tp - 1);
        }
        // Megatron's order: a stage's replicas are consecutive.
        assert_eq!(RankOrder::TpDpPp.device([dp, pp, tp], 1, 0, 0), tp);
    }
}
