//! Simulating one tensor rank per group (and one data-parallel replica) and mirroring it gives
//! the full simulation's report, key for key, across the plan features that touch every rank
//! of a group: overlapped and blocking tensor-parallel collectives, pipeline scatter-gather,
//! ZeRO 1-3, offload, recomputation, interleaving, 2BW, token slicing, expert parallelism,
//! tensor parallelism across nodes; and it is not used where a rank shares a link it does not
//! mirror.

use crate::util::*;
use serde_json::{Value, json};

/// The report as JSON without what only says how it was simulated.
fn comparable(r: &sim::report::Report) -> Value {
    let mut v = serde_json::to_value(r).expect("report serialises");
    for k in ["events", "flows", "tasks", "simulated_devices", "symmetric"] {
        v.as_object_mut().expect("object").remove(k);
    }
    v
}

fn base(plan: Value, nodes: u32) -> Value {
    let training = json!({"global_batch": 16, "micro_batch": 2, "seq_len": 512});
    serde_json::from_str(&scenario(small_transformer(8, 1024, 16), nodes, training, plan)).expect("json")
}

/// Folded and full reports agree on `v`; returns the folded one's simulated devices.
fn agree(v: &Value, what: &str) -> u32 {
    let folded = simulate(&v.to_string());
    let mut full = v.clone();
    full["simulation"] = json!({"symmetry": false});
    let full = simulate(&full.to_string());
    assert!(!full.symmetric, "{what}: symmetry used although switched off");
    assert_eq!(full.simulated_devices, full.devices, "{what}: full simulation");
    let (a, b) = (comparable(&folded), comparable(&full));
    let differ: Vec<String> = b
        .as_object()
        .expect("object")
        .iter()
        .filter(|(k, v)| a.get(k.as_str()) != Some(v))
        .map(|(k, v)| format!("{k}: {} folded vs {v} full", a.get(k.as_str()).unwrap_or(&Value::Null)))
        .collect();
    assert!(differ.is_empty() && a == b, "{what}: folded and full reports differ:\n{}", differ.join("\n"));
    folded.simulated_devices
}

#[test]
fn one_tensor_rank_stands_for_its_group() {
    let mut cases: Vec<(&str, Value)> = vec![
        ("tp 8", base(json!({"dp": 1, "tp": 8}), 1)),
        ("tp 4 pp 2 scatter-gather", base(json!({"dp": 1, "tp": 4, "pp": 2, "schedule": "1f1b"}), 1)),
        (
            "tp 2 pp 2 interleaved, sequence parallel, selective",
            base(
                json!({"dp": 2, "tp": 2, "pp": 2, "schedule": "interleaved", "sequence_parallel": true,
                       "recompute": "selective"}),
                1,
            ),
        ),
        ("tp 4 pp 2 2bw", base(json!({"dp": 1, "tp": 4, "pp": 2, "schedule": "2bw"}), 1)),
        ("tp 4 zero 1 dp 4 across nodes", base(json!({"dp": 4, "tp": 4, "zero_stage": 1}), 2)),
        ("tp 2 zero 2 dp 4", base(json!({"dp": 4, "tp": 2, "zero_stage": 2}), 1)),
        ("tp 2 zero 3 dp 4, full recompute", base(json!({"dp": 4, "tp": 2, "zero_stage": 3, "recompute": "full"}), 1)),
        ("tp 16 across nodes", base(json!({"dp": 1, "tp": 16}), 2)),
        ("tp 4 zero-offload", base(json!({"dp": 2, "tp": 4, "zero_stage": 2, "offload": "zero-offload"}), 1)),
        (
            "tp 4 activations to host, overlapped sends",
            base(json!({"dp": 1, "tp": 4, "pp": 2, "offload": {"activations": "cpu"}, "p2p": "overlapped"}), 1),
        ),
        (
            "tp 4 gpipe token slices",
            base(json!({"dp": 1, "tp": 4, "pp": 2, "schedule": "gpipe", "token_slices": [256, 256]}), 1),
        ),
    ];
    // Megatron-Core: tensor-parallel collectives overlapped with the GEMMs on their own stream.
    let mut core = base(json!({"dp": 2, "tp": 4, "sequence_parallel": true, "zero_stage": 1}), 1);
    core["training"]["framework"] = json!("megatron-core");
    cases.push(("megatron-core tp overlap", core));
    // Mixture of experts with expert parallelism over replicas.
    let mut moe = base(json!({"dp": 4, "tp": 2, "ep": 2, "sequence_parallel": true, "zero_stage": 1}), 1);
    moe["workload"]["transformer"]["moe"] = json!({"experts": 4, "top_k": 2, "expert_ffn": 2048});
    cases.push(("moe ep 2 tp 2", moe));
    // Context parallelism: the ring among replicas beside attention, with pipelining and
    // across nodes, and with expert parallelism over the context-parallel ranks.
    let mut cp = base(json!({"dp": 1, "cp": 4, "tp": 2, "sequence_parallel": true, "zero_stage": 1}), 1);
    cp["training"]["framework"] = json!("megatron-core");
    cases.push(("cp 4 tp 2 megatron-core", cp));
    let mut cp_pp = base(
        json!({"dp": 2, "cp": 2, "tp": 2, "pp": 2, "schedule": "interleaved", "sequence_parallel": true,
               "recompute": "full"}),
        2,
    );
    cp_pp["training"]["attention"] = json!("flash");
    cases.push(("cp 2 tp 2 pp 2 interleaved across nodes, full recompute", cp_pp));
    let mut cp_moe = base(json!({"dp": 2, "cp": 2, "tp": 2, "ep": 4, "sequence_parallel": true}), 1);
    cp_moe["workload"]["transformer"]["moe"] = json!({"experts": 4, "top_k": 2, "expert_ffn": 2048});
    cp_moe["training"]["attention"] = json!("flash");
    cases.push(("moe ep 4 over dp 2 x cp 2", cp_moe));
    // A fabric of pods: every node its own pod at 1:4, the data-parallel rings and the
    // expert all-to-alls crossing them.
    let mut pods = base(json!({"dp": 4, "tp": 4, "zero_stage": 1}), 2);
    pods["cluster"]["fabric"] = json!({"pod_nodes": 1, "oversubscription": 4, "extra_latency_s": 1e-6});
    cases.push(("tp 4 dp 4 across two pods at 1:4", pods));
    let mut pods_moe = base(json!({"dp": 2, "tp": 8, "ep": 2, "sequence_parallel": true}), 2);
    pods_moe["workload"]["transformer"]["moe"] = json!({"experts": 4, "top_k": 2, "expert_ffn": 2048});
    pods_moe["cluster"]["fabric"] = json!({"preset": "dgx-superpod", "pod_nodes": 1, "oversubscription": 2});
    cases.push(("moe ep 2 across two rail-optimised pods at 1:2", pods_moe));
    for (what, v) in &cases {
        let simulated = agree(v, what);
        let plan = &v["plan"];
        let groups =
            plan["dp"].as_u64().unwrap_or(1) * plan["cp"].as_u64().unwrap_or(1) * plan["pp"].as_u64().unwrap_or(1);
        assert!(
            u64::from(simulated) <= groups,
            "{what}: {simulated} devices simulated for {groups} tensor-parallel groups"
        );
    }
}

/// Two devices behind each NIC: a rank's gradient all-reduce shares its NIC with a peer's,
/// which a mirrored peer would not load, so every rank of the (one simulated) replica is
/// simulated, and the result agrees with the full simulation.
#[test]
fn ranks_sharing_a_nic_are_all_simulated() {
    let mut v = base(json!({"dp": 2, "tp": 4}), 2);
    v["cluster"]["node"] = json!({"preset": "dgx-a100-80gb", "devices": 4, "nics": 2});
    let simulated = agree(&v, "2 NICs for 4 devices");
    assert_eq!(simulated, 4, "one replica's 4 ranks, not 1");
}

/// Replicas that share a node fold into one where each device has its own port and NIC: the
/// full simulation's report, key for key, with one replica simulated, NVMe offload included
/// where each simulated device stands for the same number of its node's devices. Where two
/// devices sit behind one NIC and the gradient all-reduce leaves the node, or a node's drives
/// serve devices unevenly, every replica is simulated.
#[test]
fn replicas_sharing_a_node_stand_for_each_other() {
    let mut cases: Vec<(&str, Value, u32)> = vec![
        ("dp 8 on one node", base(json!({"dp": 8}), 1), 1),
        ("dp 4 pp 2 1f1b on one node", base(json!({"dp": 4, "pp": 2, "schedule": "1f1b"}), 1), 2),
        ("dp 2 pp 4 zero 1 on one node", base(json!({"dp": 2, "pp": 4, "schedule": "1f1b", "zero_stage": 1}), 1), 4),
        ("dp 8 zero 3 on one node", base(json!({"dp": 8, "zero_stage": 3}), 1), 1),
        ("dp 4 pp 2 2bw on one node", base(json!({"dp": 4, "pp": 2, "schedule": "2bw"}), 1), 2),
        ("dp 8 zero-offload on one node", base(json!({"dp": 8, "zero_stage": 2, "offload": "zero-offload"}), 1), 1),
        ("dp 4 pp 4 across two nodes", base(json!({"dp": 4, "pp": 4, "schedule": "1f1b"}), 2), 4),
    ];
    // 16 replicas over two nodes of 8 devices with a NIC each (DGX A100).
    let mut wide = base(json!({"dp": 16}), 2);
    wide["training"]["global_batch"] = json!(32);
    cases.push(("dp 16 across two nodes", wide, 1));
    // ZeRO-Infinity: a node's devices share its NVMe drives with identical flows, so one
    // device stands for the node on drives of an eighth of the bandwidth.
    cases.push((
        "dp 8 zero-infinity on one node",
        base(json!({"dp": 8, "zero_stage": 3, "offload": "zero-infinity"}), 1),
        1,
    ));
    cases.push((
        "dp 8 tp 2 zero-infinity across two nodes",
        base(json!({"dp": 8, "tp": 2, "zero_stage": 3, "offload": "zero-infinity"}), 2),
        1,
    ));
    cases.push((
        "dp 4 pp 2 optimizer on NVMe",
        base(json!({"dp": 4, "pp": 2, "schedule": "1f1b", "offload": {"optimizer": "nvme"}}), 1),
        2,
    ));
    // Three devices per node, replica-major: node 0 holds stage 0 of replicas 0 and 1 and
    // stage 1 of replica 0, so its drives carry traffic no single simulated node's do.
    let mut uneven = base(
        json!({"dp": 3, "pp": 2, "schedule": "1f1b", "rank_order": "tp-pp-dp", "offload": {"optimizer": "nvme"}}),
        2,
    );
    uneven["cluster"]["node"] = json!({"preset": "dgx-a100-80gb", "devices": 3, "nics": 3});
    uneven["training"]["global_batch"] = json!(12);
    cases.push(("uneven NVMe sharing", uneven, 6));
    let mut shared = base(json!({"dp": 8}), 2);
    shared["cluster"]["node"] = json!({"preset": "dgx-a100-80gb", "devices": 4, "nics": 1});
    cases.push(("dp 8 over two nodes with one NIC each", shared, 8));
    for (what, v, expected) in &cases {
        assert_eq!(agree(v, what), *expected, "{what}: devices simulated");
    }
}
