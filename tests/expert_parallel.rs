//! Expert parallelism (`plan.ep`): Megatron-Core's all-to-all layout, its parameters, FLOPs,
//! communication and refusals.

use crate::util::{no_files, parse, scenario, simulate};
use serde_json::{Value, json};
use sim::workload::{Axis, LayerOp, LayerShape, TpMode};

const LAYERS: u32 = 4;
const HIDDEN: f64 = 1024.0;
const EXPERTS: u32 = 8;
const EXPERT_FFN: f64 = 2048.0;

fn moe_workload(imbalance: f64) -> Value {
    json!({"transformer": {"layers": LAYERS, "hidden": HIDDEN as u32, "heads": 16, "vocab": 32000,
        "moe": {"experts": EXPERTS, "top_k": 2, "expert_ffn": EXPERT_FFN as u32, "imbalance": imbalance}}})
}

fn training() -> Value {
    json!({"global_batch": 16, "micro_batch": 1, "seq_len": 2048, "precision": "bf16", "framework": "megatron-core"})
}

/// `dp` x tp 8 over `dp` DGX A100 nodes (one replica per node), sequence parallel, ZeRO-1.
fn moe_scenario(dp: u32, ep: Option<u32>, imbalance: f64) -> String {
    let mut plan = json!({"dp": dp, "tp": 8, "pp": 1, "sequence_parallel": true, "zero_stage": 1});
    if let Some(ep) = ep {
        plan["ep"] = json!(ep);
    }
    scenario(moe_workload(imbalance), dp, training(), plan)
}

fn report_json(text: &str) -> Value {
    serde_json::to_value(simulate(text)).unwrap()
}

/// `plan.ep` 1 is the layout without expert parallelism: the same report as leaving it out
/// (for a MoE workload the defaults list it), and a dense workload's report is untouched.
#[test]
fn ep_one_changes_nothing() {
    let mut a = report_json(&moe_scenario(2, None, 1.0));
    let mut b = report_json(&moe_scenario(2, Some(1), 1.0));
    let defaults = a["defaults_applied"].as_array().unwrap().clone();
    assert!(defaults.iter().any(|d| d.as_str().unwrap().starts_with("plan.ep = 1")), "{defaults:?}");
    a["defaults_applied"] = Value::Null;
    b["defaults_applied"] = Value::Null;
    assert_eq!(a, b);
    let dense = |ep: Option<u32>| {
        let mut plan = json!({"dp": 2, "tp": 8, "pp": 1, "sequence_parallel": true});
        if let Some(ep) = ep {
            plan["ep"] = json!(ep);
        }
        report_json(&scenario(crate::util::small_transformer(4, 1024, 16), 2, training(), plan))
    };
    let d = dense(None);
    assert!(!d["defaults_applied"].as_array().unwrap().iter().any(|x| x.as_str().unwrap().starts_with("plan.ep")));
    assert_eq!(d, dense(Some(1)));
}

/// With ep = dp each device keeps 1/ep of the routed experts' weights (the rest unchanged).
#[test]
fn expert_weights_per_device_fall_by_ep() {
    let a = simulate(&moe_scenario(2, Some(1), 1.0));
    let b = simulate(&moe_scenario(2, Some(2), 1.0));
    let (wb, _, _) =
        sim::cost::memory::bytes_per_parameter(sim::hardware::Precision::Bf16, sim::plan::Optimizer::Adam, true);
    // Default MLP: GeLU, two matrices per expert; split over tp 8.
    let routed = LAYERS as f64 * EXPERTS as f64 * 2.0 * HIDDEN * EXPERT_FFN / 8.0;
    let fall = a.memory_breakdown.weights - b.memory_breakdown.weights;
    let want = routed * wb * (1.0 - 1.0 / 2.0);
    assert!((fall - want).abs() <= 1e-9 * want, "weights fell by {fall}, want {want}");
}

fn moe_ops(ep: u32, imbalance: f64) -> Vec<LayerOp> {
    let w = parse(&moe_scenario(2, Some(1), imbalance)).workload.transformer;
    let shape = LayerShape {
        micro_batch: 2,
        seq_len: 2048,
        tp: 4,
        tp_mode: TpMode::OneD,
        ep,
        cp: 1,
        context: 0,
        sequence_parallel: true,
        attention: sim::hardware::kernels::Attention::Naive,
        fusion: Default::default(),
        activation_bytes: 2.0,
    };
    w.layer_ops(shape)
}

fn expert_flops(ops: &[LayerOp]) -> f64 {
    ops.iter().filter_map(LayerOp::compute).filter(|o| o.name.starts_with("expert_fc")).map(|o| o.forward_flops).sum()
}

fn a2a_bytes(ops: &[LayerOp]) -> Vec<f64> {
    ops.iter()
        .filter_map(|o| match o {
            LayerOp::Comm { axis: Axis::Expert, bytes, .. } => Some(*bytes),
            _ => None,
        })
        .collect()
}

/// Each expert-parallel rank computes as many expert rows as without expert parallelism (it
/// receives ep replicas' rows for E/ep experts), and the busiest rank `imbalance` times that;
/// its all-to-alls carry its local rows (k copies of b s / t tokens), scaled likewise.
#[test]
fn expert_gemm_flops_are_unchanged_by_ep_and_scale_by_imbalance() {
    let base = expert_flops(&moe_ops(1, 1.0));
    assert!(base > 0.0);
    for ep in [2, 4, 8] {
        let f = expert_flops(&moe_ops(ep, 1.0));
        assert!((f - base).abs() <= 1e-9 * base, "ep {ep}: {f} vs {base}");
        let g = expert_flops(&moe_ops(ep, 1.5));
        assert!((g - 1.5 * base).abs() <= 1e-9 * base, "ep {ep}, imbalance 1.5: {g} vs {}", 1.5 * base);
    }
    assert!(a2a_bytes(&moe_ops(1, 1.0)).is_empty());
    // Dispatch and combine: 2 bytes x (2 x 2048 / 4 tokens) x k = 2 x h.
    let local = 2.0 * (2.0 * 2048.0 / 4.0) * 2.0 * HIDDEN;
    assert_eq!(a2a_bytes(&moe_ops(4, 1.0)), vec![local, local]);
    assert_eq!(a2a_bytes(&moe_ops(4, 1.5)), vec![1.5 * local, 1.5 * local]);
    // The dense MLP's sequence-parallel all-gather and reduce-scatter are not used.
    let names: Vec<&str> = moe_ops(4, 1.0)
        .iter()
        .filter_map(|o| if let LayerOp::Comm { name, .. } = o { Some(*name) } else { None })
        .collect();
    assert!(!names.contains(&"mlp_in") && !names.contains(&"mlp_out"), "{names:?}");
    assert!(names.contains(&"ep_allgather") && names.contains(&"ep_reducescatter"), "{names:?}");
}

/// Across nodes, the dispatch and combine all-to-alls add exposed communication on the
/// compute stream; routing imbalance makes the iteration slower.
#[test]
fn all_to_all_adds_exposed_communication_across_nodes() {
    let a = simulate(&moe_scenario(2, Some(1), 1.0));
    let b = simulate(&moe_scenario(2, Some(2), 1.0));
    let c = simulate(&moe_scenario(2, Some(2), 2.0));
    let tp = |r: &sim::report::Report| r.time_breakdown[0].exposed_tp_comm_s;
    assert!(tp(&b) > tp(&a), "exposed tp/ep communication: ep 2 {} vs ep 1 {}", tp(&b), tp(&a));
    assert!(c.iteration_s > b.iteration_s, "imbalance 2: {} vs balanced {}", c.iteration_s, b.iteration_s);
}

/// One replica stands for all under data-parallel symmetry with expert parallelism too: the
/// all-to-all names the other replicas' devices, and full lowering (every replica joining the
/// shared all-to-all on its own stream) agrees; likewise with expert data parallelism (dp =
/// 2 ep: expert gradients reduced over the replicas holding the same experts), with and
/// without ZeRO-1 and with ZeRO-2.
#[test]
fn symmetric_and_full_simulation_agree_with_expert_parallelism() {
    for (dp, ep, zero) in [(2, 2, 1), (4, 2, 1), (4, 2, 0), (4, 2, 2)] {
        let mut v: Value = serde_json::from_str(&moe_scenario(dp, Some(ep), 1.0)).unwrap();
        v["plan"]["zero_stage"] = json!(zero);
        let text = v.to_string();
        v["simulation"] = json!({"symmetry": false});
        let (a, b) = (simulate(&text), simulate(&v.to_string()));
        let devices = dp * 8;
        assert!(a.symmetric && a.simulated_devices < devices, "dp {dp} ep {ep}");
        assert!(!b.symmetric && b.simulated_devices == devices, "dp {dp} ep {ep}");
        assert_eq!(a.iteration_s, b.iteration_s, "dp {dp} ep {ep} zero {zero}");
        assert_eq!(a.peak_memory_bytes, b.peak_memory_bytes, "dp {dp} ep {ep} zero {zero}");
        assert_eq!(a.mfu, b.mfu, "dp {dp} ep {ep} zero {zero}");
    }
}

/// `framework.ep_comm_overlap` (Megatron-Core's combined 1F1B, DeepSeek's DualPipe): the
/// all-to-alls run beside the compute and the compute stream waits for them at its next
/// schedule step. Across nodes the step is shorter and the exposed expert-parallel time
/// smaller, with the compute unchanged; on a link 100 times slower the all-to-alls outlast the
/// compute and are exposed again; folded and full simulations agree; with ep 1 the knob
/// changes nothing.
#[test]
fn overlapped_all_to_alls_hide_behind_the_next_compute() {
    let with = |text: &str, overlap: bool| -> Value {
        let mut v: Value = serde_json::from_str(text).unwrap();
        v["training"]["framework"] = json!({"name": "megatron-core", "ep_comm_overlap": overlap});
        v
    };
    let ep = |r: &sim::report::Report| r.time_breakdown[0].exposed_ep_comm_s;
    let gemm = |r: &sim::report::Report| r.time_breakdown[0].gemm_s;
    let base = moe_scenario(2, Some(2), 1.0);
    let (off, on) = (simulate(&with(&base, false).to_string()), simulate(&with(&base, true).to_string()));
    assert!(on.iteration_s < off.iteration_s, "{} s overlapped vs {} s", on.iteration_s, off.iteration_s);
    assert!(ep(&on) < ep(&off) && ep(&off) > 0.0, "exposed EP {} s vs {} s", ep(&on), ep(&off));
    assert!((gemm(&on) / gemm(&off) - 1.0).abs() < 1e-9);
    let mut slow = with(&base, true);
    slow["cluster"]["inter_node"] = json!({"bandwidth_bytes_per_s": 0.25e9, "latency_s": 5e-6});
    assert!(ep(&simulate(&slow.to_string())) > on.iteration_s, "a slow link exposes the all-to-alls again");
    let mut full = with(&base, true);
    full["simulation"] = json!({"symmetry": false});
    let f = simulate(&full.to_string());
    assert!(!f.symmetric && on.symmetric);
    assert_eq!(f.iteration_s, on.iteration_s);
    let dense = moe_scenario(2, Some(1), 1.0);
    assert_eq!(
        simulate(&with(&dense, true).to_string()).iteration_s,
        simulate(&with(&dense, false).to_string()).iteration_s
    );
}

/// Expert data parallelism under ZeRO-1: the routed experts' optimizer states are sharded
/// over the dp / ep replicas holding the same experts, the rest over dp. (Which collectives
/// reduce the expert gradients: `lower::tests::expert_gradients_are_reduced_over_the_expert_data_parallel_group`.)
#[test]
fn zero1_shards_expert_optimizer_states_over_the_expert_data_parallel_group() {
    let (_, _, ob) =
        sim::cost::memory::bytes_per_parameter(sim::hardware::Precision::Bf16, sim::plan::Optimizer::Adam, true);
    let routed = LAYERS as f64 * EXPERTS as f64 * 2.0 * HIDDEN * EXPERT_FFN / 8.0;
    let zero1 = |dp: u32, ep: u32| simulate(&moe_scenario(dp, Some(ep), 1.0)).memory_breakdown.optimizer;
    // ep 2 -> 4 at dp 4 halves the experts per device, and their shards go from 2 to 1 ways:
    // the same optimizer bytes; dp 4 ep 2 against dp 2 ep 2 halves the expert shard.
    let (o22, o42) = (zero1(2, 2), zero1(4, 2));
    let expert_22 = routed / 2.0 * ob;
    let expert_42 = routed / 2.0 / 2.0 * ob;
    // The rest is sharded over dp: 1/2 vs 1/4.
    let rest_22 = o22 - expert_22;
    assert!(rest_22 > 0.0);
    let want = rest_22 / 2.0 + expert_42;
    assert!((o42 - want).abs() <= 1e-9 * want, "optimizer bytes dp 4 ep 2: {o42}, want {want}");
}

fn error(text: &str) -> String {
    match sim::scenario::parse(text, &no_files) {
        Ok(_) => panic!("accepted: {text}"),
        Err(e) => e.to_string(),
    }
}

/// What expert parallelism cannot be is refused at read time, naming `plan.ep`.
#[test]
fn invalid_or_unmodelled_ep_is_refused_naming_plan_ep() {
    let with = |plan: Value, workload: Value, nodes: u32| scenario(workload, nodes, training(), plan);
    let moe = moe_workload(1.0);
    let cases = [
        // Does not divide dp.
        with(json!({"dp": 2, "tp": 8, "sequence_parallel": true, "ep": 4}), moe.clone(), 2),
        // Does not divide the 8 experts.
        with(json!({"dp": 6, "tp": 4, "sequence_parallel": true, "ep": 6}), moe.clone(), 3),
        // A dense workload.
        with(
            json!({"dp": 2, "tp": 8, "sequence_parallel": true, "ep": 2}),
            crate::util::small_transformer(4, 1024, 16),
            2,
        ),
        // Tensor parallelism without sequence parallelism.
        with(json!({"dp": 2, "tp": 8, "ep": 2}), moe.clone(), 2),
        // ZeRO-3.
        with(json!({"dp": 2, "tp": 8, "sequence_parallel": true, "ep": 2, "zero_stage": 3}), moe.clone(), 2),
    ];
    for text in &cases {
        let e = error(text);
        assert!(e.contains("plan.ep"), "{e}");
    }
    let imbalanced = moe_workload(0.5);
    let e = error(&with(json!({"dp": 2, "tp": 8, "sequence_parallel": true}), imbalanced, 2));
    assert!(e.contains("imbalance"), "{e}");
}

/// ZeRO-2 under expert data parallelism: gradients of the routed experts are sharded over the
/// dp / ep replicas holding them, the rest over dp.
#[test]
fn zero2_shards_expert_gradients_over_the_expert_data_parallel_group() {
    // Gradients are kept in the dtype they are reduced in: fp32 under Megatron-Core.
    let gb = 4.0;
    let grads = |ep: u32, zero: u32| {
        let mut v: Value = serde_json::from_str(&moe_scenario(4, Some(ep), 1.0)).unwrap();
        v["plan"]["zero_stage"] = json!(zero);
        simulate(&v.to_string()).memory_breakdown.gradients
    };
    let routed = LAYERS as f64 * EXPERTS as f64 * 2.0 * HIDDEN * EXPERT_FFN / 8.0;
    // ZeRO-1 keeps whole gradients: the experts' share at ep 2 is routed / 2.
    let whole = grads(2, 1);
    let expert = routed / 2.0 * gb;
    let want = (whole - expert) / 4.0 + expert / 2.0;
    let got = grads(2, 2);
    assert!((got - want).abs() <= 1e-9 * want, "ZeRO-2 gradients {got}, want {want}");
}
