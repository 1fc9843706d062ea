//! `plan`: the parallel degrees and rank order (expert and context parallelism in
//! `parallel.rs`), tensor-parallel mode and sequence parallelism,
//! the pipeline schedule and partition, ZeRO and offload, token slicing, recomputation and
//! gradient buckets. Checked against the workload, cluster and training sections.

use super::keys;
use super::parallel::{check_cp_attention, parse_cp, parse_dp_shard, parse_ep};
use super::reader::{self, Obj, Result, invalid, show};
use super::recompute::{parse_recompute_layers, parse_recompute_modules};
use super::suggest::did_you_mean;
use super::training::Training;
use crate::hardware::ClusterSpec;
use crate::plan::{Offload, PartitionPolicy, Plan, RankOrder, Recompute, Tier, TokenSlices, parse_schedule};
use crate::schedule::{self, ScheduleKind, ScheduleShape};
use crate::workload::{TpMode, Workload};
use serde_json::Value;

pub(super) fn parse_plan(
    o: &Obj,
    w: &Workload,
    c: &ClusterSpec,
    t: &Training,
    defaults: &mut Vec<String>,
) -> Result<Plan> {
    o.only(keys::PLAN)?;
    let mut dflt = |k: &str, v: &str| defaults.push(format!("plan.{k} = {v}"));
    let dp = o.uint("dp")?.unwrap_or_else(|| {
        dflt("dp", "1");
        1
    });
    let tp = o.uint("tp")?.unwrap_or_else(|| {
        dflt("tp", "1");
        1
    });
    let pp = o.uint("pp")?.unwrap_or_else(|| {
        dflt("pp", "1");
        1
    });
    let devices = c.device_count();
    // Checked in full by `parse_cp` below; here only its share of the devices.
    let cp_given = o.uint("cp")?.unwrap_or(1).max(1);
    let product = dp as u64 * cp_given as u64 * tp as u64 * pp as u64;
    if product != devices as u64 {
        let degrees = if cp_given > 1 {
            format!("dp x cp x tp x pp = {dp} x {cp_given} x {tp} x {pp}")
        } else {
            format!("dp x tp x pp = {dp} x {tp} x {pp}")
        };
        return Err(invalid(
            &o.path,
            format!(
                "{degrees} = {product} but the cluster has {devices} devices; allowed: degrees whose product is {devices}"
            ),
        ));
    }
    let rank_order = match o.choice("rank_order", &crate::plan::RankOrder::NAMES, crate::plan::RankOrder::parse)? {
        Some(r) => r,
        None => {
            if dp > 1 && pp > 1 {
                dflt("rank_order", "tp-dp-pp (Megatron-LM)");
            }
            crate::plan::RankOrder::TpDpPp
        }
    };
    // Its default depends on the framework, resolved below.
    let p2p_given = o.choice("p2p", &crate::plan::P2p::NAMES, crate::plan::P2p::parse)?;
    let (tp_mode, sequence_parallel) = parse_sequence_parallel(o, t, tp, parse_tp_mode(o, tp, &mut dflt)?, &mut dflt)?;
    let tf = &w.transformer;
    if w.net.is_some() && (tp > 1 || sequence_parallel || tp_mode != TpMode::OneD) {
        return Err(invalid(
            &o.key("tp"),
            format!(
                "{tp}: tensor and sequence parallelism are modelled for transformers; \"{}\" is a network of distinct layers (use dp and pp)",
                w.name
            ),
        ));
    }
    let departures = [
        (tf.moe.is_some(), "experts"),
        (tf.mla.is_some(), "latent attention"),
        (tf.explicit_head_dim.is_some(), "a head width apart from hidden / heads"),
    ];
    if let Some((_, what)) = departures.iter().find(|(on, _)| *on).filter(|_| tp > 1 && tp_mode != TpMode::OneD) {
        return Err(reader::unsupported(
            &o.key("tp_mode"),
            format!(
                "\"{}\" has {what}, modelled with Megatron's 1D tensor parallelism only; use \"tp_mode\": \"1d\"",
                w.name
            ),
        ));
    }
    if !tf.heads.is_multiple_of(tp) && tp_mode != TpMode::Ring {
        return Err(invalid(&o.key("tp"), format!("{tp} does not divide the workload's {} attention heads", tf.heads)));
    }
    // Megatron-Core shards the key-value heads (query groups) over the tensor-parallel ranks
    // and requires tp to divide them (`attention.py`: `divide(num_query_groups, world_size)`);
    // torchtitan's column-parallel wk and wv need whole heads per rank too.
    if tf.mla.is_none() && tf.kv_heads < tf.heads && !tf.kv_heads.is_multiple_of(tp) && tp_mode != TpMode::Ring {
        return Err(invalid(
            &o.key("tp"),
            format!(
                "{tp} does not divide the workload's {} key-value heads: tensor parallelism shards whole key-value \
                 heads (Megatron-Core's query groups must be a multiple of tp); allowed: a divisor of {}",
                tf.kv_heads, tf.kv_heads
            ),
        ));
    }
    let schedule = match o.choice("schedule", keys::SCHEDULES, parse_schedule)? {
        Some(s) => s,
        None => {
            dflt("schedule", "1f1b");
            ScheduleKind::OneFOneB
        }
    };
    let virtual_stages = match (schedule, o.uint("virtual_stages")?) {
        (ScheduleKind::Interleaved, Some(v)) => v,
        (ScheduleKind::Interleaved, None) => {
            dflt("virtual_stages", "2");
            2
        }
        (_, Some(v)) if v != 1 => {
            return Err(invalid(
                &o.key("virtual_stages"),
                format!(
                    "{v} needs \"schedule\": \"interleaved\"; allowed with {}: 1",
                    crate::plan::schedule_name(schedule)
                ),
            ));
        }
        _ => 1,
    };
    let zero_stage = match o.get("zero_stage") {
        None => {
            dflt("zero_stage", "0");
            0
        }
        Some(v) => match v.as_u64() {
            Some(z @ 0..=3) => z as u8,
            _ => return Err(invalid(&o.key("zero_stage"), format!("{} is not one of: 0, 1, 2, 3", show(v)))),
        },
    };
    let offload = parse_offload(o, zero_stage, &mut dflt)?;
    let token_slices = parse_token_slices(o, w, t, dp)?;
    if token_slices.is_some() {
        check_token_slicing(o)?;
    }
    let cp = parse_cp(o, w, t, (tp, tp_mode, sequence_parallel), token_slices.is_some(), &mut dflt)?;
    let ep =
        parse_ep(o, w, dp * cp, cp, tp, sequence_parallel, zero_stage, &offload, token_slices.is_some(), &mut dflt)?;
    let recompute = o.choice("recompute", &Recompute::NAMES, Recompute::parse)?.unwrap_or_else(|| {
        dflt("recompute", "none");
        Recompute::None
    });
    let recompute_modules = parse_recompute_modules(o, recompute)?;
    let per_replica = t.global_batch / dp;
    if !t.global_batch.is_multiple_of(dp) || !per_replica.is_multiple_of(t.micro_batch) {
        return Err(invalid(
            "training.global_batch",
            format!(
                "{} samples do not split into dp={dp} replicas of whole micro-batches of {}; allowed: a multiple of dp x micro_batch = {}",
                t.global_batch,
                t.micro_batch,
                dp * t.micro_batch
            ),
        ));
    }
    let micro_batches = per_replica / t.micro_batch;
    let chunks = pp * virtual_stages;
    if chunks > tf.layers {
        return Err(invalid(
            &o.key("pp"),
            format!(
                "{pp} stages x {virtual_stages} virtual stages = {chunks} chunks, but the workload has only {} layers; allowed: at most one chunk per layer ({})",
                tf.layers,
                if tf.layers >= pp {
                    format!("virtual_stages <= {}", tf.layers / pp)
                } else {
                    format!("pp <= {}", tf.layers)
                }
            ),
        ));
    }
    let (partition, partition_policy) = parse_partition(o, tf.layers, chunks, virtual_stages, &mut dflt)?;
    let recompute_layers = parse_recompute_layers(o, recompute, tf.layers, token_slices.is_some(), partition_policy)?;
    let dp_shard = parse_dp_shard(o, dp * cp, cp, zero_stage, ep, tp_mode == TpMode::Ring && tp > 1, &offload)?;
    check_stage_kinds(c, rank_order, [dp * cp, pp, tp])?;
    if schedule == ScheduleKind::TwoBW && micro_batches < pp {
        return Err(invalid(
            &o.key("schedule"),
            format!(
                "\"2bw\" accumulates gradients over at least as many micro-batches as stages: {micro_batches} < pp = {pp}"
            ),
        ));
    }
    let shape = ScheduleShape { stages: pp, micro_batches, virtual_stages };
    // Validation only: the table itself holds 2 x micro-batches steps per stage.
    if let Err(e) = schedule::validate(schedule, shape) {
        return Err(invalid(
            &o.key("schedule"),
            format!("{e} (micro-batches per replica = global_batch / (dp x micro_batch) = {micro_batches})"),
        ));
    }
    let traits = crate::plan::framework_traits((tp, pp, cp), zero_stage, &offload, t.precision);
    let framework = super::framework::resolve(t.framework.as_ref(), traits, defaults);
    if framework.tp_replicate_embedding && tf.tied_embeddings && tp > 1 {
        return Err(invalid(
            "training.framework.tp_replicate_embedding",
            "a token embedding whole on every tensor-parallel rank is modelled for untied embeddings; this workload ties its output layer to the embedding; allowed: false, or \"tied_embeddings\": false",
        ));
    }
    if pp > 1 && zero_stage > framework.pipeline_max_zero_stage {
        return Err(invalid(
            &o.key("zero_stage"),
            format!(
                "{zero_stage} with pp = {pp}: {} runs pipeline parallelism with ZeRO up to stage {} only (its pipeline engine refuses ZeRO-2 and 3); allowed: zero_stage 0 to {}, pp = 1, or another framework",
                framework.name, framework.pipeline_max_zero_stage, framework.pipeline_max_zero_stage
            ),
        ));
    }
    let p2p = p2p_given.unwrap_or_else(|| {
        let p2p = default_p2p(schedule, &framework);
        if pp > 1 {
            defaults.push(match p2p {
                crate::plan::P2p::Overlapped => {
                    format!("{P2P_DEFAULT} = overlapped ({}'s interleaved schedule)", framework.name)
                }
                crate::plan::P2p::Blocking => format!("{P2P_DEFAULT} = blocking (Megatron-LM, DeepSpeed)"),
            });
        }
        p2p
    });
    let grad_bytes = framework.grad_reduce_bytes(t.precision.activation_bytes());
    let attention = resolve_attention(o, c, t.attention, &framework, cp, defaults)?;
    check_cp_attention(o, cp, attention, t.attention.is_none().then_some(framework.name.as_str()))?;
    let bucket_bytes = match o.positive("bucket_bytes")? {
        Some(b) => b,
        None => {
            let b = framework.bucket_bytes(dp, grad_bytes);
            defaults.push(format!("plan.bucket_bytes = {:.0} MiB ({})", b / 1048576.0, framework.name));
            b
        }
    };
    Ok(Plan {
        dp,
        tp,
        pp,
        ep,
        cp,
        rank_order,
        p2p,
        schedule,
        virtual_stages,
        recompute,
        recompute_modules,
        recompute_layers,
        dp_shard,
        zero_stage,
        sequence_parallel,
        tp_mode,
        attention,
        fusion: crate::workload::Fusion {
            scale_mask_softmax: framework.fused.softmax,
            bias_dropout_add: framework.fused.bias_dropout_add,
            rms_norm: framework.fused.rms_norm,
            swiglu: framework.fused.swiglu,
            rope: framework.fused.rope,
            cross_entropy: framework.fused.cross_entropy,
            projections: framework.fused.projections,
            gqa: framework.fused.gqa,
            unfused_loss: framework.unfused_loss,
            cp_ring: framework.cp_ring,
            gathered_linear_inputs: framework.tp_keeps_gathered_input
                && (!framework.tp_comm_overlap || framework.tp_micro_pipeline),
            gather_per_projection: framework.tp_gather_per_projection && !framework.tp_comm_overlap,
            layout_copies: framework.tp_layout_copies && !framework.tp_comm_overlap && !framework.tp_async_backward,
            fp8_tp_gather: t.precision == crate::hardware::Precision::Fp8
                && framework.fp8_casts == crate::framework::Fp8Casts::Torchao,
            replicated_logits: framework.tp_replicate_logits,
            replicated_embedding: framework.tp_replicate_embedding,
            fp8_gemm_inputs: t.precision == crate::hardware::Precision::Fp8
                && framework.fp8_casts == crate::framework::Fp8Casts::Te,
        },
        partition,
        micro_batches,
        micro_batch: t.micro_batch,
        seq_len: t.seq_len,
        precision: t.precision,
        optimizer: t.optimizer,
        master_weights: t.master_weights,
        bucket_bytes,
        offload,
        token_slices,
        frozen: crate::plan::Frozen::default(),
        partition_policy,
        framework,
    })
}

/// `sequence_parallel` on top of the tensor-parallel mode: true or "megatron" (Megatron's
/// sequence parallelism inside 1D tensor parallelism), or "ring" (the tp group splits the
/// sequence instead and passes keys and values around: the mode becomes `TpMode::Ring`).
fn parse_sequence_parallel(
    o: &Obj,
    t: &Training,
    tp: u32,
    mut tp_mode: TpMode,
    dflt: &mut dyn FnMut(&str, &str),
) -> Result<(TpMode, bool)> {
    let sp_key = o.key("sequence_parallel");
    let sequence_parallel = match o.get("sequence_parallel") {
        None => {
            dflt("sequence_parallel", "false");
            false
        }
        Some(Value::Bool(b)) => *b,
        Some(Value::String(s)) if s == "megatron" => true,
        Some(Value::String(s)) if s == "ring" => {
            if tp_mode != TpMode::OneD {
                return Err(invalid(
                    &sp_key,
                    "ring self-attention uses the tp group as a sequence-parallel ring; leave tp_mode at \"1d\"",
                ));
            }
            if !t.seq_len.is_multiple_of(tp) {
                return Err(invalid(
                    &sp_key,
                    format!("seq_len {} does not split into tp = {tp} equal chunks", t.seq_len),
                ));
            }
            tp_mode = TpMode::Ring;
            false
        }
        Some(v) => {
            let hint = v.as_str().map(|x| did_you_mean(x, keys::SEQUENCE_PARALLEL.iter().copied())).unwrap_or_default();
            return Err(invalid(
                &sp_key,
                format!("{} is not one of: true, false, \"megatron\", \"ring\"{hint}", show(v)),
            ));
        }
    };
    if sequence_parallel && tp_mode != TpMode::OneD {
        return Err(invalid(&sp_key, "Megatron sequence parallelism goes with tp_mode \"1d\""));
    }
    Ok((tp_mode, sequence_parallel))
}

/// Token slicing runs TeraPipe's GPipe-like schedule, with 1D tensor parallelism, no sequence
/// parallelism and no virtual stages.
fn check_token_slicing(o: &Obj) -> Result<()> {
    let key = o.key("token_slices");
    if !matches!(o.get("schedule").and_then(Value::as_str), None | Some("gpipe")) {
        return Err(invalid(
            &key,
            "token slicing runs TeraPipe's GPipe-like schedule; set \"schedule\": \"gpipe\" or leave it out",
        ));
    }
    if o.uint("virtual_stages")?.is_some_and(|v| v > 1)
        || o.get("tp_mode").and_then(Value::as_str).is_some_and(|m| m != "1d")
        || o.has("sequence_parallel") && o.get("sequence_parallel") != Some(&Value::Bool(false))
    {
        return Err(invalid(
            &key,
            "token slicing goes with 1D tensor parallelism, no sequence parallelism and no virtual stages",
        ));
    }
    Ok(())
}

/// `partition`: "uniform", "balanced", "parameters", "explore" or layers per chunk; by default
/// uniform, or where the chunks do not divide the layers, one fewer layer on the end chunks.
/// Returns the layers per chunk and the policy that replaces them before lowering, if any.
fn parse_partition(
    o: &Obj,
    model_layers: u32,
    chunks: u32,
    virtual_stages: u32,
    dflt: &mut dyn FnMut(&str, &str),
) -> Result<(Vec<u32>, Option<PartitionPolicy>)> {
    let mut partition_policy = None;
    let partition = match o.get("partition") {
        // The first chunk also carries the embedding and the last the head and the loss: the
        // shorter chunks go to the ends, as Meta split Llama 3 405B (`Plan::ends_short_partition`).
        None if !model_layers.is_multiple_of(chunks) => {
            let p = Plan::default_partition(model_layers, chunks);
            let size = model_layers.div_ceil(chunks);
            let short: Vec<usize> = (0..p.len()).filter(|&c| p[c] < size).collect();
            dflt(
                "partition",
                &format!(
                    "uneven: {} layers over {chunks} chunks of {size}, one fewer on chunks {short:?} (the ends first)",
                    model_layers
                ),
            );
            p
        }
        None => {
            dflt("partition", "uniform");
            Plan::uniform_partition(model_layers, chunks)
        }
        Some(Value::String(s)) if s == "uniform" => Plan::uniform_partition(model_layers, chunks),
        Some(Value::String(s)) if s == "balanced" || s == "parameters" => {
            if virtual_stages > 1 {
                return Err(invalid(
                    &o.key("partition"),
                    format!("\"{s}\" cuts one chunk per stage; use it without virtual stages"),
                ));
            }
            partition_policy =
                Some(if s == "balanced" { PartitionPolicy::Balanced } else { PartitionPolicy::Parameters });
            // A placeholder the policy replaces before lowering.
            Plan::uniform_partition(model_layers, chunks)
        }
        Some(Value::String(s)) if s == "explore" => {
            if virtual_stages > 1 {
                return Err(invalid(
                    &o.key("partition"),
                    "\"explore\" chooses the schedule itself; leave out virtual stages",
                ));
            }
            partition_policy = Some(PartitionPolicy::Explore);
            Plan::uniform_partition(model_layers, chunks)
        }
        Some(Value::Array(a)) => {
            let layers: Option<Vec<u32>> =
                a.iter().map(|x| x.as_u64().filter(|n| *n >= 1).and_then(|n| u32::try_from(n).ok())).collect();
            match layers {
                Some(l)
                    if l.len() == chunks as usize
                        && l.iter().map(|&n| n as u64).sum::<u64>() == model_layers as u64 =>
                {
                    l
                }
                _ => {
                    return Err(invalid(
                        &o.key("partition"),
                        format!(
                            "expected {chunks} positive layer counts summing to {}, got {}",
                            model_layers,
                            show(o.get("partition").unwrap_or(&Value::Null))
                        ),
                    ));
                }
            }
        }
        Some(v) => {
            return Err(invalid(
                &o.key("partition"),
                format!(
                    "{} is not \"uniform\", \"balanced\", \"parameters\", \"explore\" or a list of layers per stage{}",
                    show(v),
                    v.as_str().map(|x| did_you_mean(x, keys::PARTITION_POLICIES.iter().copied())).unwrap_or_default()
                ),
            ));
        }
    };
    Ok((partition, partition_policy))
}

/// A heterogeneous cluster: every device of a pipeline stage must be of one kind.
fn check_stage_kinds(c: &ClusterSpec, rank_order: RankOrder, [dp, pp, tp]: [u32; 3]) -> Result<()> {
    for stage in 0..pp {
        let members: Vec<u32> =
            (0..dp).flat_map(|r| (0..tp).map(move |x| rank_order.device([dp, pp, tp], r, stage, x))).collect();
        let first = c.class_of(members[0]);
        if let Some(&other) = members.iter().find(|&&d| c.class_of(d) != first) {
            return Err(invalid(
                "cluster.device_overrides",
                format!(
                    "pipeline stage {stage} mixes device kinds (devices {} and {other}); give each stage one kind",
                    members[0]
                ),
            ));
        }
    }
    Ok(())
}

/// `tp_mode` and, for 2.5D, `tp_depth`: the grid must use exactly `tp` devices.
fn parse_tp_mode(o: &Obj, tp: u32, dflt: &mut dyn FnMut(&str, &str)) -> Result<TpMode> {
    let root = |n: u32, k: u32| (1..=n).find(|q| q.pow(k) >= n).filter(|q| q.pow(k) == n);
    let mode = match o.string("tp_mode")? {
        None => {
            dflt("tp_mode", "1d");
            TpMode::OneD
        }
        Some("1d") => TpMode::OneD,
        Some("2d") => match root(tp, 2) {
            Some(q) => TpMode::TwoD { q },
            None => return Err(invalid(&o.key("tp"), format!("{tp} is not a square; \"2d\" needs tp = q x q"))),
        },
        Some("2.5d") => {
            let d = o
                .uint("tp_depth")?
                .ok_or_else(|| invalid(&o.key("tp_depth"), "required with \"2.5d\": the depth d of tp = d x q x q"))?;
            match root(tp / d, 2).filter(|_| tp.is_multiple_of(d)) {
                Some(q) => TpMode::TwoPointFiveD { q, d },
                None => return Err(invalid(&o.key("tp"), format!("{tp} is not d x q x q with d = tp_depth = {d}"))),
            }
        }
        Some("3d") => match root(tp, 3) {
            Some(q) => TpMode::ThreeD { q },
            None => return Err(invalid(&o.key("tp"), format!("{tp} is not a cube; \"3d\" needs tp = q x q x q"))),
        },
        Some(m) => {
            let hint = did_you_mean(m, keys::TP_MODES.iter().copied());
            return Err(invalid(&o.key("tp_mode"), format!("\"{m}\" is not one of: 1d, 2d, 2.5d, 3d{hint}")));
        }
    };
    if o.has("tp_depth") && !matches!(mode, TpMode::TwoPointFiveD { .. }) {
        return Err(invalid(&o.key("tp_depth"), "only with \"tp_mode\": \"2.5d\""));
    }
    Ok(mode)
}

/// `token_slices`: "auto", a list of slice lengths (each micro-batch's sequences cut the same
/// way), or a list of [sequences, [slice lengths]] sub-batches covering a replica's batch.
fn parse_token_slices(o: &Obj, w: &Workload, t: &Training, dp: u32) -> Result<Option<TokenSlices>> {
    use crate::plan::SlicedBatch;
    let key = o.key("token_slices");
    let Some(v) = o.get("token_slices") else {
        if o.has("token_granularity") {
            return Err(invalid(&o.key("token_granularity"), "only with \"token_slices\": \"auto\""));
        }
        return Ok(None);
    };
    crate::policy::token_slicing::applies(w).map_err(|e| invalid(&key, e))?;
    let per_replica = t.global_batch / dp;
    let tokens_ok = |slices: &[u32], path: &str| -> Result<()> {
        let sum: u64 = slices.iter().map(|&x| x as u64).sum();
        if slices.is_empty() || slices.contains(&0) || sum != t.seq_len as u64 {
            return Err(invalid(
                path,
                format!("slice lengths must be positive and sum to seq_len {}; they sum to {sum}", t.seq_len),
            ));
        }
        Ok(())
    };
    let ts = match v {
        Value::String(s) if s == "auto" => {
            let g = o.uint("token_granularity")?.unwrap_or(8);
            if g > t.seq_len {
                return Err(invalid(&o.key("token_granularity"), format!("{g} is longer than seq_len {}", t.seq_len)));
            }
            TokenSlices::Auto { granularity: g }
        }
        Value::Array(items) if items.iter().all(Value::is_u64) => {
            let slices: Vec<u32> =
                items.iter().filter_map(Value::as_u64).map(|x| u32::try_from(x).unwrap_or(u32::MAX)).collect();
            tokens_ok(&slices, &key)?;
            let n = per_replica / t.micro_batch;
            if n as u64 * slices.len() as u64 > crate::lower::size::MAX_TASKS {
                return Err(invalid(
                    &key,
                    format!(
                        "{n} micro-batches x {} slices = {} units; allowed: at most {} (raise training.micro_batch or use longer slices)",
                        slices.len(),
                        n as u64 * slices.len() as u64,
                        crate::lower::size::MAX_TASKS
                    ),
                ));
            }
            TokenSlices::Explicit(vec![SlicedBatch { sequences: t.micro_batch, slices }; n as usize])
        }
        Value::Array(items) => {
            let mut subs = Vec::new();
            for (i, it) in items.iter().enumerate() {
                let path = format!("{key}[{i}]");
                let pair = it.as_array().filter(|a| a.len() == 2);
                let (Some(b), Some(sl)) = (
                    pair.and_then(|a| a[0].as_u64()).filter(|b| (1..=u32::MAX as u64).contains(b)),
                    pair.and_then(|a| a[1].as_array()),
                ) else {
                    return Err(invalid(&path, format!("expected [sequences, [slice lengths]], got {}", show(it))));
                };
                let slices: Option<Vec<u32>> =
                    sl.iter().map(|x| x.as_u64().and_then(|y| u32::try_from(y).ok())).collect();
                let slices = slices.ok_or_else(|| invalid(&path, "slice lengths must be positive integers"))?;
                tokens_ok(&slices, &path)?;
                subs.push(SlicedBatch { sequences: b as u32, slices });
            }
            let total: u64 = subs.iter().map(|s| s.sequences as u64).sum();
            if total != per_replica as u64 {
                return Err(invalid(
                    &key,
                    format!(
                        "the sub-batches hold {total} sequences; each replica has global_batch / dp = {per_replica}"
                    ),
                ));
            }
            TokenSlices::Explicit(subs)
        }
        other => {
            return Err(invalid(
                &key,
                format!(
                    "{} is not \"auto\", a list of slice lengths, or a list of [sequences, [slice lengths]]",
                    show(other)
                ),
            ));
        }
    };
    Ok(Some(ts))
}

/// Gemini's dynamic placement: Belady eviction (`gemini`), least recently used
/// (`gemini-lru`), or a fixed 512 MiB device budget (`const`), unless `budget` says.
fn dynamic(policy: &str, budget: Option<f64>) -> Offload {
    use crate::policy::gemini::{CONST_POLICY_BYTES, Eviction};
    let eviction = if policy == "gemini-lru" { Eviction::Lru } else { Eviction::Belady };
    let budget_bytes = budget.or(if policy == "const" { Some(CONST_POLICY_BYTES) } else { None });
    Offload { dynamic: Some(crate::plan::Dynamic { eviction, budget_bytes }), ..Offload::NONE }
}

fn parse_offload(o: &Obj, zero_stage: u8, dflt: &mut dyn FnMut(&str, &str)) -> Result<Offload> {
    let key = o.key("offload");
    let offload = match o.get("offload") {
        None => {
            dflt("offload", "none");
            Offload::NONE
        }
        Some(Value::String(s)) => match s.as_str() {
            "none" => Offload::NONE,
            // ZeRO-Offload (Ren et al. 2021): optimizer states and step on the CPU.
            "zero-offload" => Offload { optimizer: Tier::Cpu, ..Offload::NONE },
            // ZeRO-Infinity (Rajbhandari et al. 2021): optimizer and parameters on NVMe.
            "zero-infinity" => Offload { optimizer: Tier::Nvme, params: Tier::Nvme, ..Offload::NONE },
            p @ ("gemini" | "gemini-lru" | "const") => dynamic(p, None),
            other => {
                return Err(invalid(
                    &key,
                    format!(
                        "\"{other}\" is not one of: none, gemini, gemini-lru, const, zero-offload, zero-infinity, or an object {{\"optimizer\": tier, \"params\": tier}}{}",
                        did_you_mean(other, keys::OFFLOAD_POLICIES.iter().copied())
                    ),
                ));
            }
        },
        Some(v) => {
            let oo = Obj::new(v, &key)?;
            oo.only(keys::OFFLOAD)?;
            if let Some(p) = oo.string("policy")? {
                let budget = oo.positive("budget_bytes")?;
                if oo.has("optimizer") || oo.has("params") {
                    return Err(invalid(
                        &oo.key("policy"),
                        "a policy places the optimizer and parameters itself; leave out \"optimizer\" and \"params\"",
                    ));
                }
                return match p {
                    "none" => Ok(Offload::NONE),
                    "zero-offload" => Ok(Offload { optimizer: Tier::Cpu, ..Offload::NONE }),
                    "zero-infinity" if zero_stage >= 3 => {
                        Ok(Offload { optimizer: Tier::Nvme, params: Tier::Nvme, ..Offload::NONE })
                    }
                    "gemini" | "gemini-lru" | "const" => Ok(dynamic(p, budget)),
                    _ => Err(invalid(
                        &oo.key("policy"),
                        format!(
                            "\"{p}\" is not one of: none, gemini, gemini-lru, const, zero-offload, zero-infinity (with zero_stage 3){}",
                            did_you_mean(p, keys::OFFLOAD_POLICIES.iter().copied())
                        ),
                    )),
                };
            }
            if oo.has("budget_bytes") {
                return Err(invalid(&oo.key("budget_bytes"), "only with a \"policy\""));
            }
            Offload {
                optimizer: oo.choice("optimizer", &Tier::NAMES, Tier::parse)?.unwrap_or(Tier::Device),
                params: oo.choice("params", &Tier::NAMES, Tier::parse)?.unwrap_or(Tier::Device),
                activations: match oo.choice("activations", &Tier::NAMES, Tier::parse)? {
                    Some(Tier::Nvme) => {
                        return Err(invalid(
                            &oo.key("activations"),
                            "activations offload to \"cpu\" only (NVMe is too slow to hide)",
                        ));
                    }
                    Some(t) => t,
                    None => Tier::Device,
                },
                dynamic: None,
            }
        }
    };
    if offload.params != Tier::Device && zero_stage < 3 {
        return Err(invalid(
            &format!("{key}.params"),
            format!(
                "parameter offload needs zero_stage 3 (parameters are fetched shard by shard before use); zero_stage is {zero_stage}"
            ),
        ));
    }
    Ok(offload)
}

/// How `defaults_applied` names a defaulted `plan.p2p`.
pub(crate) const P2P_DEFAULT: &str = "plan.p2p";

/// Pipeline sends when the scenario does not say: overlapped under an interleaved schedule
/// with a framework that overlaps them there (Megatron-Core), else blocking.
pub(crate) fn default_p2p(schedule: ScheduleKind, framework: &crate::framework::Framework) -> crate::plan::P2p {
    if schedule == ScheduleKind::Interleaved && framework.interleaved_p2p_overlap {
        crate::plan::P2p::Overlapped
    } else {
        crate::plan::P2p::Blocking
    }
}

/// `training.attention`, or the framework's default (listed in `defaults_applied`). No fused
/// attention kernel runs on Volta (sm70): FlashAttention 1.x needs Turing or newer, 2.x
/// Ampere, 3.x Hopper (flash-attn README), and Transformer Engine's and cuDNN's fused attention
/// need Ampere. On a cluster with V100s attention runs materialised, as Megatron-LM does there,
/// and `defaults_applied` names the kernel that was defaulted or asked for; context
/// parallelism, whose ring runs inside the fused kernel, is refused there.
fn resolve_attention(
    o: &Obj,
    cluster: &ClusterSpec,
    asked: Option<crate::hardware::kernels::Attention>,
    framework: &crate::framework::Framework,
    cp: u32,
    defaults: &mut Vec<String>,
) -> Result<crate::hardware::kernels::Attention> {
    use crate::hardware::kernels::Attention;
    let requested = asked.unwrap_or(framework.attention);
    let volta = requested.is_fused() && has_volta(cluster);
    if volta && cp > 1 {
        return Err(invalid(
            &o.key("cp"),
            format!(
                "{cp} needs fused attention (its ring runs inside the fused kernel), and no fused attention kernel runs on V100s (FlashAttention needs Turing or newer); allowed: cp = 1"
            ),
        ));
    }
    let why = "has no kernel for V100s: FlashAttention needs Turing or newer";
    let name = requested.name();
    match (asked, volta) {
        (None, false) => defaults.push(format!("training.attention = {name} ({})", framework.name)),
        (None, true) => defaults.push(format!("training.attention = naive ({}'s \"{name}\" {why})", framework.name)),
        (Some(_), true) => defaults.push(format!("training.attention = naive (\"{name}\" was asked for, but {why})")),
        (Some(_), false) => {}
    }
    Ok(if volta { Attention::Naive } else { requested })
}

/// Whether any device of the cluster is a V100 (Volta, sm70).
fn has_volta(cluster: &ClusterSpec) -> bool {
    use crate::hardware::kernels::{GpuArch, arch_of};
    std::iter::once(&cluster.node.device)
        .chain(cluster.overrides.iter().map(|o| &o.device))
        .any(|d| arch_of(d) == Some(GpuArch::Volta))
}
