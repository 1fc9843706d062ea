//! `training.framework`: a framework's name, or an object naming one with knobs overridden.
//!
//! ```json
//! "framework": "megatron-core"
//! "framework": {"name": "pytorch-fsdp", "gather_prefetch": 2, "grad_reduce_dtype": "fp32"}
//! ```
//! With no framework named, the plan picks one ([`crate::framework::default_for`]) and the
//! choice is listed in `defaults_applied`.

use super::keys;
use super::reader::{Obj, Result, invalid};
use crate::framework::{self, Fp8Casts, Framework, Gather, GradReduce, PlanTraits, ReduceDtype, TrainMetric};
use serde_json::Value;

/// A framework as written: its name and the knobs the scenario sets.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FrameworkSpec {
    name: String,
    grad_reduce: Option<GradReduce>,
    gather_prefetch: Option<u32>,
    param_gather_overlap: Option<bool>,
    bucket_first_chunk_only: Option<bool>,
    tp_comm_overlap: Option<bool>,
    tp_async_backward: Option<bool>,
    tp_keeps_gathered_input: Option<bool>,
    tp_gather_per_projection: Option<bool>,
    tp_layout_copies: Option<bool>,
    tp_micro_pipeline: Option<bool>,
    tp_replicate_logits: Option<bool>,
    tp_replicate_embedding: Option<bool>,
    ep_comm_overlap: Option<bool>,
    gather_copy_out: Option<bool>,
    gather_per_tensor: Option<bool>,
    grad_reduce_dtype: Option<ReduceDtype>,
    fused: Vec<(String, bool)>,
    train_metrics: Option<Vec<TrainMetric>>,
    recompute_early_stop: Option<bool>,
    fp8_casts: Option<Fp8Casts>,
    unfused_loss: Option<crate::framework::UnfusedLoss>,
    cp_ring: Option<crate::framework::CpRing>,
    foreach_optimizer: Option<bool>,
}

fn name_of(v: &Value, path: &str) -> Result<String> {
    let name = v.as_str().ok_or_else(|| invalid(path, "expected a framework name (a string)"))?;
    if framework::profile(name).is_none() {
        let hint = super::suggest::did_you_mean(name, framework::NAMES);
        return Err(invalid(
            path,
            format!("unknown framework \"{name}\"{hint}; allowed: {}", framework::NAMES.join(", ")),
        ));
    }
    Ok(name.to_string())
}

impl FrameworkSpec {
    /// A profile by name, none of its knobs overridden (the search's framework dimension).
    pub fn named(name: &str) -> FrameworkSpec {
        FrameworkSpec { name: name.to_string(), ..FrameworkSpec::default() }
    }
}

/// Read `training.framework` (absent: `None`).
pub fn parse(o: &Obj) -> Result<Option<FrameworkSpec>> {
    let Some(v) = o.get("framework") else { return Ok(None) };
    let path = o.key("framework");
    if v.is_string() {
        let name = name_of(v, &path)?;
        return Ok(Some(FrameworkSpec { name, ..FrameworkSpec::default() }));
    }
    let f = Obj::new(v, &path)?;
    f.only(keys::FRAMEWORK)?;
    let name = name_of(
        f.get("name").ok_or_else(|| invalid(&f.key("name"), "missing: the framework this object adjusts"))?,
        &f.key("name"),
    )?;
    let grad_reduce = f.choice("grad_reduce", &["overlapped", "after_backward", "blocking"], |s| match s {
        "overlapped" => Some(GradReduce::Overlapped),
        "after_backward" => Some(GradReduce::AfterBackward),
        "blocking" => Some(GradReduce::Blocking),
        _ => None,
    })?;
    let grad_reduce_dtype = f.choice("grad_reduce_dtype", &["params", "fp32"], |s| match s {
        "params" => Some(ReduceDtype::Params),
        "fp32" => Some(ReduceDtype::Fp32),
        _ => None,
    })?;
    let fp8_casts = f.choice("fp8_casts", &Fp8Casts::NAMES, Fp8Casts::parse)?;
    let gather_prefetch = f.count("gather_prefetch")?;
    if let Some(p) = gather_prefetch
        && p > 64
    {
        return Err(invalid(&f.key("gather_prefetch"), format!("{p} layers ahead; allowed: 0 to 64")));
    }
    let mut fused = Vec::new();
    if let Some(k) = f.obj("fused")? {
        k.only(keys::FUSED)?;
        for name in keys::FUSED {
            if let Some(b) = k.boolean(name)? {
                fused.push((name.to_string(), b));
            }
        }
    }
    let train_metrics = match f.get("train_metrics") {
        None => None,
        Some(v) => Some(metrics(v, &f.key("train_metrics"))?),
    };
    Ok(Some(FrameworkSpec {
        name,
        train_metrics,
        recompute_early_stop: f.boolean("recompute_early_stop")?,
        fp8_casts,
        unfused_loss: f.choice(
            "unfused_loss",
            &crate::framework::UnfusedLoss::NAMES,
            crate::framework::UnfusedLoss::parse,
        )?,
        cp_ring: f.choice("cp_ring", &crate::framework::CpRing::NAMES, crate::framework::CpRing::parse)?,
        foreach_optimizer: f.boolean("foreach_optimizer")?,
        grad_reduce,
        gather_prefetch,
        param_gather_overlap: f.boolean("param_gather_overlap")?,
        bucket_first_chunk_only: f.boolean("bucket_first_chunk_only")?,
        tp_comm_overlap: f.boolean("tp_comm_overlap")?,
        tp_async_backward: f.boolean("tp_async_backward")?,
        tp_keeps_gathered_input: f.boolean("tp_keeps_gathered_input")?,
        tp_gather_per_projection: f.boolean("tp_gather_per_projection")?,
        tp_layout_copies: f.boolean("tp_layout_copies")?,
        tp_micro_pipeline: f.boolean("tp_micro_pipeline")?,
        tp_replicate_logits: f.boolean("tp_replicate_logits")?,
        tp_replicate_embedding: f.boolean("tp_replicate_embedding")?,
        ep_comm_overlap: f.boolean("ep_comm_overlap")?,
        gather_copy_out: f.boolean("gather_copy_out")?,
        gather_per_tensor: f.boolean("gather_per_tensor")?,
        grad_reduce_dtype,
        fused,
    }))
}

/// `train_metrics`: a list of metric names, each at most once.
fn metrics(v: &Value, path: &str) -> Result<Vec<TrainMetric>> {
    let names = super::reader::name_list(v, path, &TrainMetric::NAMES, "metric")?;
    Ok(names.iter().filter_map(|n| TrainMetric::parse(n)).collect())
}

/// The framework a scenario runs on: the one it names with its overrides, or the plan's
/// default (recorded in `defaults`).
pub fn resolve(spec: Option<&FrameworkSpec>, traits: PlanTraits, defaults: &mut Vec<String>) -> Framework {
    // The 2021 gathers a profile applies under ZeRO-3 are listed: they slow large runs down.
    let per_tensor_note = |f: &Framework, defaults: &mut Vec<String>| {
        if traits.zero_stage >= 3 && f.gather_per_tensor {
            defaults.push(format!(
                "training.framework.gather_per_tensor = true ({}: ZeRO-3 gathers as DeepSpeed 0.3-0.5.4 ran them, a list all-gather per parameter tensor: set false for DeepSpeed 0.5.5 and later)",
                f.name
            ));
        }
    };
    // Under context parallelism the ring the profile runs is listed: PyTorch's and Transformer
    // Engine's differ in what they overlap.
    let cp_ring_note = |f: &Framework, defaults: &mut Vec<String>| {
        if traits.cp > 1 {
            let (ring, how) = (f.cp_ring.name(), f.cp_ring.summary());
            defaults.push(format!("training.framework.cp_ring = {ring} ({}: {how})", f.name));
        }
    };
    // A pipeline engine that reduces after its schedule (DeepSpeed's) does so whatever the
    // profile's `grad_reduce` says, unless the scenario sets it.
    // Likewise one whose reductions block the compute stream below ZeRO-3 (DeepSpeed's
    // `overlap_comm` default).
    let pipeline_reduce = |f: &mut Framework, defaults: &mut Vec<String>| {
        if traits.pp > 1 && f.pipeline_reduces_after_backward && f.grad_reduce != GradReduce::AfterBackward {
            f.grad_reduce = GradReduce::AfterBackward;
            defaults.push(format!(
                "training.framework.grad_reduce = after_backward ({} with pipeline parallelism: its pipeline engine reduces the gradients after the schedule's last backward)",
                f.name
            ));
        } else if traits.zero_stage < 3 && f.blocking_reduce_below_zero3 && f.grad_reduce == GradReduce::Overlapped {
            f.grad_reduce = GradReduce::Blocking;
            defaults.push(format!(
                "training.framework.grad_reduce = blocking ({} below ZeRO-3: overlap_comm off, each reduction on the compute stream; set overlapped for a config that turns it on)",
                f.name
            ));
        }
    };
    // Megatron reduces in fp32 only under bf16: fp16 gradients travel in fp16.
    let fp16_reduce = |f: &mut Framework, defaults: &mut Vec<String>| {
        if traits.fp16 && f.fp32_reduce_bf16_only && f.grad_reduce_dtype == ReduceDtype::Fp32 {
            f.grad_reduce_dtype = ReduceDtype::Params;
            defaults.push(format!(
                "training.framework.grad_reduce_dtype = params ({} under fp16: gradients reduced in fp16; fp32 only under bf16)",
                f.name
            ));
        }
    };
    let Some(s) = spec else {
        let (name, why) = framework::default_for(traits);
        defaults.push(format!("training.framework = {name} ({why})"));
        let mut f = framework::profile(name).expect("default framework has a profile");
        per_tensor_note(&f, defaults);
        cp_ring_note(&f, defaults);
        pipeline_reduce(&mut f, defaults);
        fp16_reduce(&mut f, defaults);
        return f;
    };
    let mut f = framework::profile(&s.name).expect("name checked when read");
    match s.grad_reduce {
        Some(g) => f.grad_reduce = g,
        None => pipeline_reduce(&mut f, defaults),
    }
    if let Some(p) = s.gather_prefetch {
        f.gather = Gather::PerLayer { prefetch: p };
    }
    set(&mut f.param_gather_overlap, s.param_gather_overlap);
    set(&mut f.bucket_first_chunk_only, s.bucket_first_chunk_only);
    set(&mut f.tp_comm_overlap, s.tp_comm_overlap);
    set(&mut f.tp_async_backward, s.tp_async_backward);
    set(&mut f.tp_keeps_gathered_input, s.tp_keeps_gathered_input);
    set(&mut f.tp_gather_per_projection, s.tp_gather_per_projection);
    set(&mut f.tp_layout_copies, s.tp_layout_copies);
    set(&mut f.tp_micro_pipeline, s.tp_micro_pipeline);
    set(&mut f.tp_replicate_logits, s.tp_replicate_logits);
    set(&mut f.tp_replicate_embedding, s.tp_replicate_embedding);
    set(&mut f.ep_comm_overlap, s.ep_comm_overlap);
    set(&mut f.gather_copy_out, s.gather_copy_out);
    match s.gather_per_tensor {
        Some(b) => f.gather_per_tensor = b,
        None => per_tensor_note(&f, defaults),
    }
    match s.grad_reduce_dtype {
        Some(d) => f.grad_reduce_dtype = d,
        None => fp16_reduce(&mut f, defaults),
    }
    set(&mut f.recompute_early_stop, s.recompute_early_stop);
    set(&mut f.fp8_casts, s.fp8_casts);
    set(&mut f.unfused_loss, s.unfused_loss);
    match s.cp_ring {
        Some(r) => f.cp_ring = r,
        None => cp_ring_note(&f, defaults),
    }
    set(&mut f.foreach_optimizer, s.foreach_optimizer);
    if let Some(m) = &s.train_metrics {
        f.train_metrics = m.clone();
    }
    for (k, b) in &s.fused {
        match k.as_str() {
            "softmax" => f.fused.softmax = *b,
            "bias_gelu" => f.fused.bias_gelu = *b,
            "bias_dropout_add" => f.fused.bias_dropout_add = *b,
            "adam" => f.fused.adam = *b,
            "rms_norm" => f.fused.rms_norm = *b,
            "swiglu" => f.fused.swiglu = *b,
            "rope" => f.fused.rope = *b,
            "cross_entropy" => f.fused.cross_entropy = *b,
            "projections" => f.fused.projections = *b,
            "gqa" => f.fused.gqa = *b,
            _ => unreachable!("keys checked when read"),
        }
    }
    f
}

/// Overrides a profile's knob with the scenario's value where one is given.
fn set<T>(knob: &mut T, given: Option<T>) {
    if let Some(v) = given {
        *knob = v;
    }
}
