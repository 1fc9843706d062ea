use crate::scenario;

fn scenario(plan: &str, node: &str, nodes: u32, model: &str) -> scenario::Scenario {
    let text = format!(
        r#"{{"workload": {model}, "cluster": {{"node": {node}, "nodes": {nodes}}},
            "training": {{"global_batch": 64, "micro_batch": 1, "seq_len": 512, "precision": "bf16", "optimizer": "adam"}},
            "plan": {plan}}}"#
    );
    scenario::parse(&text, &|_| Err("no files".into())).unwrap_or_else(|e| panic!("{e}"))
}

const GPT: &str = r#"{"transformer": {"layers": 4, "hidden": 1024, "heads": 16, "vocab": 32000}}"#;

/// Model states per device follow the ZeRO paper: 16 psi, 4 psi + 12 psi/N, 2 psi + 14 psi/N,
/// 16 psi / N (mixed-precision Adam, K = 12).
#[test]
fn zero_stages_shard_model_states_as_published() {
    for n in [2u32, 4, 8] {
        for z in 0..=3u8 {
            let node = format!(r#"{{"preset": "dgx-a100-80gb", "devices": {n}}}"#);
            let s = scenario(&format!(r#"{{"dp": {n}, "zero_stage": {z}}}"#), &node, 1, GPT);
            let psi = s.workload.parameters();
            let p = super::lower(&s);
            let m = p.static_memory[0];
            let states = m.weights + m.gradients + m.optimizer;
            let nf = n as f64;
            let expect = match z {
                0 => 16.0 * psi,
                1 => 4.0 * psi + 12.0 * psi / nf,
                2 => 2.0 * psi + 14.0 * psi / nf,
                _ => 16.0 * psi / nf,
            };
            assert!((states - expect).abs() <= 1e-6 * expect, "N={n} z={z}: {states} vs {expect}");
        }
    }
}

#[test]
fn offloaded_states_leave_the_device_for_the_host() {
    let on = scenario(r#"{"dp": 8, "zero_stage": 3}"#, r#""dgx-a100-40gb""#, 1, GPT);
    let off = scenario(
        r#"{"dp": 8, "zero_stage": 3, "offload": {"optimizer": "cpu", "params": "cpu"}}"#,
        r#""dgx-a100-40gb""#,
        1,
        GPT,
    );
    let (a, b) = (super::lower(&on), super::lower(&off));
    let psi = on.workload.parameters();
    assert_eq!(b.static_memory[0].optimizer, 0.0);
    assert_eq!(b.static_memory[0].weights, 0.0);
    assert!((b.host_memory[0].optimizer - a.static_memory[0].optimizer).abs() < 1e-6 * psi);
    assert!((b.host_memory[0].weights - a.static_memory[0].weights).abs() < 1e-6 * psi);
    assert!(!b.host_copies.is_empty(), "offload moves bytes over PCIe");
    assert!(a.host_copies.is_empty());
}

#[test]
fn symmetric_and_full_simulations_agree_under_zero3() {
    let plan = r#"{"dp": 2, "tp": 8, "zero_stage": 3, "recompute": "full"}"#;
    let mut s = scenario(plan, r#""dgx-a100-80gb""#, 2, r#"{"preset": "gpt3-1.3b"}"#);
    let sym = crate::simulate(&s, false);
    assert!(sym.report.symmetric);
    s.options.symmetry = false;
    let full = crate::simulate(&s, false);
    assert!(!full.report.symmetric);
    assert_eq!(sym.report.iteration_s, full.report.iteration_s);
    assert_eq!(sym.report.peak_memory_bytes, full.report.peak_memory_bytes);
}

#[test]
fn moving_states_to_the_host_costs_time_on_the_timeline() {
    let on = scenario(r#"{"dp": 8, "zero_stage": 2}"#, r#""dgx-a100-40gb""#, 1, GPT);
    let off = scenario(r#"{"dp": 8, "zero_stage": 2, "offload": "zero-offload"}"#, r#""dgx-a100-40gb""#, 1, GPT);
    let (a, b) = (crate::simulate(&on, false), crate::simulate(&off, false));
    assert!(b.report.iteration_s > a.report.iteration_s, "{} vs {}", b.report.iteration_s, a.report.iteration_s);
    assert!(b.report.memory_breakdown.optimizer < a.report.memory_breakdown.optimizer);
}

#[test]
fn activation_offload_trades_pcie_time_for_device_memory() {
    let plan = |acts: &str| {
        format!(
            r#"{{"dp": 8, "zero_stage": 2, "recompute": "selective", "offload": {{"optimizer": "cpu", "activations": "{acts}"}}}}"#
        )
    };
    let big = r#"{"transformer": {"layers": 8, "hidden": 2048, "heads": 16, "vocab": 32000}}"#;
    let on = crate::simulate(&scenario(&plan("gpu"), r#""dgx-a100-40gb""#, 1, big), false);
    let off = crate::simulate(&scenario(&plan("cpu"), r#""dgx-a100-40gb""#, 1, big), false);
    assert!(off.report.memory_breakdown.activations < on.report.memory_breakdown.activations);
    assert!(off.report.iteration_s > on.report.iteration_s);
    assert!(off.program.host_copies.len() > on.program.host_copies.len());
}

#[test]
fn two_bw_keeps_two_weight_versions_and_drops_the_flush() {
    let plan = |s: &str| format!(r#"{{"dp": 2, "tp": 1, "pp": 4, "schedule": "{s}"}}"#);
    let node = r#"{"preset": "dgx-a100-80gb"}"#;
    let flush = crate::simulate(&scenario(&plan("1f1b"), node, 1, GPT), false);
    let two = crate::simulate(&scenario(&plan("2bw"), node, 1, GPT), false);
    assert!(two.report.iteration_s < flush.report.iteration_s);
    let w = flush.report.memory_breakdown.weights;
    assert!((two.report.memory_breakdown.weights - 2.0 * w).abs() < 1e-6 * w);
    assert!(two.report.bubble_fraction < flush.report.bubble_fraction);
}
