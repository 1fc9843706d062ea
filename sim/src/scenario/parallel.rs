//! `plan.ep` and `plan.cp`: expert and context parallelism, Megatron-Core's layout (the
//! tp-cp-ep-dp-pp order: `cp` consecutive replicas split each sequence, `ep` consecutive
//! replicas split each MoE layer's routed experts); `plan.dp_shard`, hybrid sharding
//! (`dp_shard` consecutive replicas share one copy of ZeRO's state). What is not modelled with
//! them is refused here.

use super::reader::{self, Obj, Result, invalid};
use super::training::Training;
use crate::hardware::kernels::Attention;
use crate::plan::Offload;
use crate::workload::{TpMode, Workload};

/// `plan.ep`: expert parallelism (Megatron-Core's layout: `ep` consecutive data-parallel
/// replicas split each MoE layer's routed experts; expert tensor parallelism = `tp`). What is
/// not modelled with it is refused here.
#[allow(clippy::too_many_arguments)]
pub(super) fn parse_ep(
    o: &Obj,
    w: &Workload,
    replicas: u32,
    cp: u32,
    tp: u32,
    sequence_parallel: bool,
    zero_stage: u8,
    offload: &Offload,
    token_slices: bool,
    dflt: &mut dyn FnMut(&str, &str),
) -> Result<u32> {
    let Some(ep) = o.uint("ep")? else {
        if w.transformer.moe.is_some() && w.net.is_none() {
            dflt("ep", "1 (every device holds all experts)");
        }
        return Ok(1);
    };
    if ep == 1 {
        return Ok(1);
    }
    let key = o.key("ep");
    let Some(moe) = w.transformer.moe.filter(|_| w.net.is_none()) else {
        return Err(invalid(
            &key,
            format!(
                "{ep}: expert parallelism needs a mixture-of-experts workload; \"{}\" has no experts (allowed: 1)",
                w.name
            ),
        ));
    };
    let dp = if cp > 1 { format!("dp x cp = {replicas}") } else { format!("dp = {replicas}") };
    if ep == 0 || !replicas.is_multiple_of(ep) {
        return Err(invalid(
            &key,
            format!(
                "{ep} does not divide {dp}; allowed: a divisor of it (expert-parallel groups are consecutive data- and context-parallel replicas)"
            ),
        ));
    }
    if !moe.experts.is_multiple_of(ep) {
        return Err(invalid(
            &key,
            format!(
                "{ep} does not divide the workload's {} routed experts; allowed: a divisor of both {dp} and {}",
                moe.experts, moe.experts
            ),
        ));
    }
    if tp > 1 && !sequence_parallel {
        return Err(invalid(
            &key,
            format!(
                "{ep} with tp = {tp} needs \"sequence_parallel\": true (Megatron-Core asserts it for expert parallelism with tensor parallelism)"
            ),
        ));
    }
    let refuse = |why: &str| {
        Err(reader::unsupported(
            &key,
            format!("{ep}: {why} is not modelled with expert parallelism yet; allowed: ep = 1"),
        ))
    };
    if zero_stage >= 3 {
        return refuse(&format!("zero_stage {zero_stage}"));
    }
    if offload.dynamic.is_some() {
        return refuse("Gemini's dynamic placement");
    }
    if token_slices {
        return refuse("token slicing");
    }
    Ok(ep)
}

/// `plan.cp`: context parallelism. Megatron-Core splits each sequence into `2 cp` chunks and
/// gives rank i chunks i and 2cp - 1 - i, so that under a causal mask every rank does the same
/// attention work (`get_batch_on_this_cp_rank`, megatron/training/utils.py); the sequence
/// length must divide into those chunks, and each rank's share into the tensor-parallel
/// ranks under sequence parallelism. Its ring attention lives in Transformer Engine's fused
/// attention (`AttnFuncWithCPAndKVP2P`), checked against the attention kernel by
/// [`check_cp_attention`].
pub(super) fn parse_cp(
    o: &Obj,
    w: &Workload,
    t: &Training,
    (tp, tp_mode, sequence_parallel): (u32, TpMode, bool),
    token_slices: bool,
    dflt: &mut dyn FnMut(&str, &str),
) -> Result<u32> {
    let Some(cp) = o.uint("cp")? else {
        if w.net.is_none() && t.seq_len >= 32768 {
            dflt("cp", "1 (each device holds whole sequences)");
        }
        return Ok(1);
    };
    let key = o.key("cp");
    if cp == 0 {
        return Err(invalid(&key, "0; allowed: an integer >= 1".to_string()));
    }
    if cp == 1 {
        return Ok(1);
    }
    if w.net.is_some() {
        return Err(invalid(
            &key,
            format!(
                "{cp}: context parallelism splits a transformer's sequences; \"{}\" is a network of distinct layers (allowed: 1)",
                w.name
            ),
        ));
    }
    if let Some(fixed) = w.fixed_seq_len() {
        return Err(reader::unsupported(
            &key,
            format!("{cp}: \"{}\" has a fixed sequence of {fixed} tokens (patches); allowed: cp = 1", w.name),
        ));
    }
    let chunks = 2 * cp;
    if !t.seq_len.is_multiple_of(chunks) {
        return Err(invalid(
            &key,
            format!(
                "{cp} needs training.seq_len = {} to split into 2 x cp = {chunks} equal chunks (Megatron-Core's causal load balancing); allowed: a cp with seq_len divisible by 2 x cp",
                t.seq_len
            ),
        ));
    }
    let local = t.seq_len / cp;
    if sequence_parallel && tp > 1 && !local.is_multiple_of(tp) {
        return Err(invalid(
            &key,
            format!(
                "{cp}: each rank's {local} tokens (seq_len / cp) do not split over tp = {tp} sequence-parallel ranks; allowed: a cp with seq_len / cp divisible by tp"
            ),
        ));
    }
    let refuse = |why: &str| {
        Err(reader::unsupported(&key, format!("{cp}: {why} is not modelled with context parallelism; allowed: cp = 1")))
    };
    if tp > 1 && tp_mode != TpMode::OneD {
        return refuse("a tensor-parallel mode other than \"1d\"");
    }
    if token_slices {
        return refuse("token slicing");
    }
    Ok(cp)
}

/// Context parallelism runs inside the fused attention kernel (Transformer Engine's
/// `AttnFuncWithCPAndKVP2P`; torchtitan's ring attention over SDPA's flash kernel).
/// `defaulted_by`: the framework whose default the attention is, when the scenario gave none.
pub(super) fn check_cp_attention(o: &Obj, cp: u32, attention: Attention, defaulted_by: Option<&str>) -> Result<()> {
    if cp > 1 && attention == Attention::Naive {
        let whose = defaulted_by.map(|f| format!(" ({f}'s default)")).unwrap_or_default();
        return Err(invalid(
            &o.key("cp"),
            format!(
                "{cp} needs fused attention (its ring runs inside the fused kernel); training.attention is \"naive\"{whose}; allowed: cp = 1, or training.attention \"flash\" or a kernel generation"
            ),
        ));
    }
    Ok(())
}

/// `plan.dp_shard`: hybrid sharding. ZeRO's state is split over `dp_shard` consecutive
/// replicas (one node's, with one GPU per replica in the default rank order) and each shard
/// group holds a whole copy: gradients are reduce-scattered in the group and the shards then
/// all-reduced across the groups, parameters gathered in the group only (PyTorch FSDP's
/// `HYBRID_SHARD`, `_post_backward_hook`'s reduce-scatter then `_inter_node_pg` all-reduce;
/// FSDP2's 2-D mesh; Megatron-Core's `num_distributed_optimizer_instances`). `None`: the
/// whole group (`dp_shard` equal to it is the same).
#[allow(clippy::too_many_arguments)]
pub(super) fn parse_dp_shard(
    o: &Obj,
    replicas: u32,
    cp: u32,
    zero_stage: u8,
    ep: u32,
    ring: bool,
    offload: &Offload,
) -> Result<Option<u32>> {
    let Some(s) = o.uint("dp_shard")? else { return Ok(None) };
    let key = o.key("dp_shard");
    let group = if cp > 1 { format!("dp x cp = {replicas}") } else { format!("dp = {replicas}") };
    if !replicas.is_multiple_of(s) {
        return Err(invalid(
            &key,
            format!("{s} does not divide {group}; allowed: a divisor of it (a shard group is consecutive replicas)"),
        ));
    }
    if s == replicas {
        return Ok(None);
    }
    if zero_stage == 0 {
        return Err(invalid(
            &key,
            format!(
                "{s}: hybrid sharding splits ZeRO's state, which zero_stage 0 keeps whole; allowed: zero_stage 1 to 3, or dp_shard = {replicas}"
            ),
        ));
    }
    if s == 1 {
        return Err(invalid(
            &key,
            "1 shards nothing (every replica keeps the whole state and all-reduces it); allowed: 2 or more, or zero_stage 0",
        ));
    }
    let refuse = |why: &str| {
        Err(reader::unsupported(
            &key,
            format!("{s}: {why} is not modelled with hybrid sharding yet; allowed: dp_shard = {replicas}"),
        ))
    };
    if ep > 1 && !s.is_multiple_of(ep) {
        return Err(invalid(
            &key,
            format!(
                "{s}: each shard group must hold whole expert-parallel groups (ep = {ep} consecutive replicas); allowed: a multiple of {ep} dividing {group}"
            ),
        ));
    }
    if ring {
        return refuse("ring self-attention");
    }
    if offload.dynamic.is_some() {
        return refuse("Gemini's dynamic placement");
    }
    Ok(Some(s))
}
