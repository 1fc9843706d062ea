//! The space of plans a search enumerates, in a fixed order. A plan key the scenario gives is
//! a constraint: its one value replaces the dimension's list. Otherwise:
//!
//! - `tp`: powers of two up to the node's device count that divide the attention heads
//!   (1 for a net of distinct layers); `tp_mode` "1d", and "2d" / "3d" where `tp` is a square /
//!   cube of at least 4; `sequence_parallel` false, and true with 1D `tp > 1`.
//! - `pp`: every divisor of `devices / tp` up to the layer count (uneven partitions allowed);
//!   `dp` the rest, a divisor of the global batch.
//! - `training.micro_batch`: the powers of two that divide a replica's batch, up to 64, and the
//!   replica's whole batch when it is at most 64.
//! - `schedule`: "1f1b" without a pipeline; with one, "gpipe", "1f1b" and "interleaved" with
//!   2 to 4 virtual stages (at most one chunk per layer, micro-batches a multiple of `pp`).
//!   "2bw" changes the optimisation (stale weights) and is searched only when given.
//! - `recompute`: none, selective, full (a given `recompute_modules`, such as torchtitan's
//!   `["op_sac"]`, applies to the selective candidates; a given `recompute_layers` to the full
//!   ones).
//! - `zero_stage`: 0 without data parallelism; 0 and 1 with a pipeline (as Megatron-LM and
//!   DeepSpeed's pipeline engine allow); 0 to 3 otherwise. `offload` without a pipeline:
//!   "zero-offload" from stage 1, "zero-infinity" at stage 3, besides none.
//! - `dp_shard`: ZeRO's state over every replica, and, from stage 1 without offload or expert
//!   parallelism, in the tp-dp-pp rank order, over each node's replicas where a node holds at
//!   least two and the cluster more than one node's (hybrid sharding, FSDP's `HYBRID_SHARD`).
//! - `partition`: "uniform" and "balanced" with a pipeline and one chunk per stage (the
//!   reader's uniform or ends-short partition otherwise).
//! - `rank_order`: "tp-dp-pp" and "tp-pp-dp" with both data and pipeline parallelism.
//! - `cp`: powers of two that leave each rank at least 4,096 tokens of a sequence
//!   ([`MIN_TOKENS_PER_CP_RANK`]), split into `2 x cp` chunks and over `tp`; 1 for short
//!   sequences, nets and materialised attention. `dp` is then `devices / (tp x pp x cp)`.
//! - `training.framework`: the profiles of `SearchInput::frameworks` (`--frameworks`),
//!   outermost, when given; otherwise the scenario's, or the one the reader picks per plan.
//! - `ep` (mixture-of-experts workloads only): every divisor of `dp x cp` that divides the routed
//!   experts, where the reader models it (ZeRO 0-2, no offload, sequence parallelism with
//!   `tp` > 1); 1 otherwise.

use crate::scenario::SearchInput;
use crate::schedule::{self, ScheduleKind, ScheduleShape};
use serde_json::{Map, Value, json};

/// One plan of the space: a scenario's `training.micro_batch` and `plan` object.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    pub micro_batch: u32,
    pub plan: Value,
    /// The framework profile searched (`SearchInput::frameworks`), if any.
    pub framework: Option<&'static str>,
}

/// The largest micro-batch size enumerated (unless given).
pub const MAX_MICRO_BATCH: u32 = 64;
/// The most virtual stages enumerated for the interleaved schedule (unless given).
pub const MAX_VIRTUAL_STAGES: u32 = 4;

fn divisors(n: u32) -> Vec<u32> {
    (1..=n).filter(|d| n.is_multiple_of(*d)).collect()
}

fn exact_root(n: u32, k: u32) -> Option<u32> {
    (1..=n).find(|q| q.pow(k) >= n).filter(|q| q.pow(k) == n)
}

/// Every candidate of the input's space, in enumeration order. A given key whose value is
/// not what the dimension holds (a string for `tp`) yields the given plan alone, for the
/// reader to reject with its usual message.
pub fn enumerate(input: &SearchInput) -> Vec<Candidate> {
    let fixed = &input.fixed_plan;
    let uint = |k: &str| -> Result<Option<u32>, ()> {
        match fixed.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v.as_u64().and_then(|x| u32::try_from(x).ok()).filter(|&x| x >= 1).map(Some).ok_or(()),
        }
    };
    let as_given = || {
        vec![Candidate {
            micro_batch: input.fixed_micro_batch.unwrap_or(1),
            plan: Value::Object(fixed.clone()),
            framework: None,
        }]
    };
    let (Ok(f_dp), Ok(f_tp), Ok(f_pp), Ok(f_v)) = (uint("dp"), uint("tp"), uint("pp"), uint("virtual_stages")) else {
        return as_given();
    };
    let n = input.cluster.device_count();
    let per_node = input.cluster.node.devices;
    let w = &input.workload;
    let layers = w.layers();
    let heads = w.transformer.heads;
    // Grouped key-value heads are sharded over the tensor-parallel ranks too (see `parse_plan`).
    let kv_heads = if w.transformer.mla.is_some() { heads } else { w.transformer.kv_heads.max(1) };
    let gb = input.training.global_batch;
    let net = w.net.is_some();
    let experts = w.transformer.moe.filter(|_| !net).map(|m| m.experts);
    let (Ok(f_ep), Ok(f_cp)) = (uint("ep"), uint("cp")) else {
        return as_given();
    };
    let choose = |k: &str, default: Vec<Value>| -> Vec<Value> {
        match fixed.get(k) {
            Some(v) => vec![v.clone()],
            None => default,
        }
    };

    let tps: Vec<u32> = match f_tp {
        Some(t) => vec![t],
        None if net => vec![1],
        None => (0..)
            .map(|i| 1u32 << i)
            .take_while(|&t| t <= per_node.max(1))
            .filter(|&t| n.is_multiple_of(t) && heads.is_multiple_of(t) && kv_heads.is_multiple_of(t))
            .collect(),
    };
    let mut out = Vec::new();
    for &tp in &tps {
        if !n.is_multiple_of(tp) {
            continue;
        }
        let pps: Vec<u32> = match f_pp {
            Some(p) => vec![p],
            None => divisors(n / tp).into_iter().filter(|&p| p <= layers).collect(),
        };
        for &pp in &pps {
            if !n.is_multiple_of(tp * pp) {
                continue;
            }
            for cp in context_degrees(input, f_cp, n / (tp * pp), tp) {
                let dp = n / (tp * pp * cp);
                if f_dp.is_some_and(|d| d != dp) || !gb.is_multiple_of(dp) {
                    continue;
                }
                let per_replica = gb / dp;
                let mbs: Vec<u32> = match input.fixed_micro_batch {
                    Some(b) => vec![b],
                    None => divisors(per_replica)
                        .into_iter()
                        .filter(|&b| b <= MAX_MICRO_BATCH && (b.is_power_of_two() || b == per_replica))
                        .collect(),
                };
                let mut modes = vec![json!("1d")];
                if exact_root(tp, 2).is_some_and(|q| q >= 2) {
                    modes.push(json!("2d"));
                }
                if exact_root(tp, 3).is_some_and(|q| q >= 2) {
                    modes.push(json!("3d"));
                }
                let modes = choose("tp_mode", modes);
                let zeros: Vec<Value> = match (dp, pp) {
                    (1, _) => vec![json!(0)],
                    (_, 1) => (0..=3).map(|z| json!(z)).collect(),
                    _ => vec![json!(0), json!(1)],
                };
                let zeros = choose("zero_stage", zeros);
                let orders = choose(
                    "rank_order",
                    if dp > 1 && pp > 1 { vec![json!("tp-dp-pp"), json!("tp-pp-dp")] } else { vec![json!("tp-dp-pp")] },
                );
                for &mb in &mbs {
                    if mb == 0 || !per_replica.is_multiple_of(mb) {
                        if input.fixed_micro_batch.is_some() {
                            // Let the reader say why.
                            out.push(Candidate {
                                micro_batch: mb,
                                plan: Value::Object(fixed.clone()),
                                framework: None,
                            });
                        }
                        continue;
                    }
                    let m = per_replica / mb;
                    for sched in schedules(fixed, pp, f_v, layers, m) {
                        for mode in &modes {
                            let sps = choose(
                                "sequence_parallel",
                                if tp > 1 && mode == "1d" {
                                    vec![json!(false), json!(true)]
                                } else {
                                    vec![json!(false)]
                                },
                            );
                            for sp in &sps {
                                for rc in choose("recompute", vec![json!("none"), json!("selective"), json!("full")]) {
                                    for z in &zeros {
                                        let stage = z.as_u64().unwrap_or(0);
                                        let offloads = choose("offload", offloads(pp, stage));
                                        for off in &offloads {
                                            let parts = choose(
                                                "partition",
                                                if pp > 1 && sched.1 == 1 {
                                                    vec![json!("uniform"), json!("balanced")]
                                                } else {
                                                    vec![Value::Null]
                                                },
                                            );
                                            // Expert parallelism where the reader models it.
                                            let eps: Vec<u32> = match experts {
                                                None => vec![1],
                                                Some(e) => divisors(dp * cp)
                                                    .into_iter()
                                                    .filter(|&x| e.is_multiple_of(x) && f_ep.is_none_or(|f| f == x))
                                                    .filter(|&x| {
                                                        x == 1
                                                            || ((tp == 1 || sp.as_bool() == Some(true))
                                                                && stage < 3
                                                                && off.as_str() == Some("none"))
                                                    })
                                                    .collect(),
                                            };
                                            // Hybrid sharding where it applies (the shard group
                                            // depends on the rank order and expert parallelism).
                                            let shards = |o: &Value, e: u32| {
                                                choose(
                                                    "dp_shard",
                                                    shard_degrees((dp * cp, tp, per_node), (stage, off, e, o)),
                                                )
                                            };
                                            for (part, order, &ep, shard) in parts
                                                .iter()
                                                .flat_map(|pa| orders.iter().map(move |o| (pa, o)))
                                                .flat_map(|(pa, o)| eps.iter().map(move |e| (pa, o, e)))
                                                .flat_map(|(pa, o, e)| {
                                                    shards(o, *e).into_iter().map(move |d| (pa, o, e, d))
                                                })
                                            {
                                                let dims = [
                                                    ("dp", json!(dp)),
                                                    (
                                                        "cp",
                                                        if cp > 1 || f_cp.is_some() { json!(cp) } else { Value::Null },
                                                    ),
                                                    ("tp", json!(tp)),
                                                    ("pp", json!(pp)),
                                                    ("tp_mode", mode.clone()),
                                                    ("sequence_parallel", sp.clone()),
                                                    ("schedule", sched.0.clone()),
                                                    ("virtual_stages", json!(sched.1)),
                                                    ("recompute", rc.clone()),
                                                    ("zero_stage", z.clone()),
                                                    ("offload", off.clone()),
                                                    ("partition", part.clone()),
                                                    ("rank_order", order.clone()),
                                                    ("ep", if experts.is_some() { json!(ep) } else { Value::Null }),
                                                    ("dp_shard", shard),
                                                ];
                                                out.push(candidate(fixed, mb, dims));
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    if out.is_empty() {
        return as_given();
    }
    // The framework profiles searched, outermost: every plan under each.
    if input.frameworks.is_empty() {
        return out;
    }
    input
        .frameworks
        .iter()
        .flat_map(|&f| out.iter().map(move |c| Candidate { framework: Some(f), ..c.clone() }))
        .collect()
}

/// The shortest share of a sequence a context-parallel rank is searched with (unless `cp` is
/// given): context parallelism is for long sequences, and below a few thousand tokens per
/// rank its ring's per-step kernels and transfers only cost (Megatron-Core's long-context
/// recipes keep 4k-16k tokens per rank).
pub const MIN_TOKENS_PER_CP_RANK: u32 = 4096;

/// Context-parallel degrees for `devices` (devices / (tp x pp)) with tensor parallelism `tp`:
/// the given one, or the powers of two whose ranks keep at least
/// [`MIN_TOKENS_PER_CP_RANK`] tokens each, in whole `2 x cp` chunks split evenly over the
/// tensor-parallel ranks, on a transformer with token inputs and fused attention (or
/// attention left to the framework, for the reader to check).
fn context_degrees(input: &SearchInput, f_cp: Option<u32>, devices: u32, tp: u32) -> Vec<u32> {
    if let Some(c) = f_cp {
        return vec![c];
    }
    let w = &input.workload;
    let seq = input.training.seq_len;
    let naive = input.training.attention == Some(crate::hardware::kernels::Attention::Naive);
    if w.net.is_some() || w.fixed_seq_len().is_some() || naive {
        return vec![1];
    }
    (0..)
        .map(|i| 1u32 << i)
        .take_while(|&c| c <= devices && (c == 1 || seq / c >= MIN_TOKENS_PER_CP_RANK))
        .filter(|&c| devices.is_multiple_of(c))
        .filter(|&c| c == 1 || (seq.is_multiple_of(2 * c) && (seq / c).is_multiple_of(tp)))
        .collect()
}

/// The candidate with these dimensions' values (a null value: the key left out), then the
/// other keys the scenario gives (bucket_bytes, p2p, tp_depth...) as given.
fn candidate(fixed: &Map<String, Value>, micro_batch: u32, dims: [(&str, Value); 15]) -> Candidate {
    let mut p = Map::new();
    for (k, v) in dims {
        if !v.is_null() {
            p.insert(k.into(), v);
        }
    }
    for (k, v) in fixed {
        p.insert(k.clone(), v.clone());
    }
    // Given modules say what the selective candidates rerun; the others recompute all or none.
    if p.get("recompute") != Some(&json!("selective")) && !fixed.contains_key("recompute") {
        p.remove("recompute_modules");
    }
    // Likewise a given count of recomputed layers applies to the full-recomputation ones.
    if p.get("recompute") != Some(&json!("full")) && !fixed.contains_key("recompute") {
        p.remove("recompute_layers");
    }
    Candidate { micro_batch, plan: Value::Object(p), framework: None }
}

/// Hybrid sharding's candidates for `replicas` data- and context-parallel replicas of `tp`
/// ranks on nodes of `per_node` devices: ZeRO over every replica (null: the key left out), and,
/// where the state is sharded (ZeRO 1-3, no offload, no expert parallelism) and the rank order
/// puts consecutive replicas on one node, over each node's replicas (FSDP's `HYBRID_SHARD`).
fn shard_degrees(
    (replicas, tp, per_node): (u32, u32, u32),
    (stage, offload, ep, order): (u64, &Value, u32, &Value),
) -> Vec<Value> {
    let node = per_node / tp.max(1);
    let sharded = stage >= 1 && offload.as_str() == Some("none") && ep == 1 && order == "tp-dp-pp";
    if sharded && node >= 2 && replicas > node && replicas.is_multiple_of(node) && per_node.is_multiple_of(tp) {
        vec![Value::Null, json!(node)]
    } else {
        vec![Value::Null]
    }
}

/// (schedule, virtual stages) pairs for `pp` stages and `m` micro-batches.
fn schedules(fixed: &Map<String, Value>, pp: u32, f_v: Option<u32>, layers: u32, m: u32) -> Vec<(Value, u32)> {
    let kinds: Vec<Value> = match fixed.get("schedule") {
        Some(s) => vec![s.clone()],
        None if pp == 1 && f_v.is_none_or(|v| v == 1) => vec![json!("1f1b")],
        None if f_v.is_some_and(|v| v > 1) => vec![json!("interleaved")],
        None => vec![json!("gpipe"), json!("1f1b"), json!("interleaved")],
    };
    let mut out = Vec::new();
    for k in kinds {
        if k == "interleaved" {
            let vs: Vec<u32> = match f_v {
                Some(v) => vec![v],
                None => (2..=MAX_VIRTUAL_STAGES).collect(),
            };
            for v in vs {
                let shape = ScheduleShape { stages: pp, micro_batches: m, virtual_stages: v };
                let ok = pp * v <= layers && schedule::validate(ScheduleKind::Interleaved, shape).is_ok();
                // A given schedule stays, for the reader to explain.
                if ok || fixed.contains_key("schedule") && fixed.contains_key("virtual_stages") {
                    out.push((k.clone(), v));
                }
            }
        } else {
            out.push((k, f_v.unwrap_or(1)));
        }
    }
    out
}

fn offloads(pp: u32, zero_stage: u64) -> Vec<Value> {
    let mut o = vec![json!("none")];
    if pp == 1 && zero_stage >= 1 {
        o.push(json!("zero-offload"));
    }
    if pp == 1 && zero_stage >= 3 {
        o.push(json!("zero-infinity"));
    }
    o
}
