//! Hybrid sharding (`plan.dp_shard`) and recomputation of part of the layers
//! (`plan.recompute_layers`) on the lowered program and the timeline.

use crate::scenario;

/// GPT (8 layers, h = 1024) on two 8-GPU A100 nodes under PyTorch FSDP, with `plan` and the
/// simulation options `sim` (JSON members, may be empty).
fn fsdp(plan: &str, sim: &str) -> crate::Simulation {
    let text = format!(
        r#"{{"workload": {{"transformer": {{"layers": 8, "hidden": 1024, "heads": 16, "vocab": 32000}}}},
            "cluster": {{"node": "dgx-a100-80gb", "nodes": 2}},
            "training": {{"global_batch": 32, "micro_batch": 2, "seq_len": 1024,
                          "framework": {{"name": "pytorch-fsdp"}}}},
            "plan": {plan}, "simulation": {{{sim}}}}}"#
    );
    let s = scenario::parse(&text, &|_| Err("no files".into())).unwrap_or_else(|e| panic!("{e}"));
    crate::simulate(&s, true)
}

/// Every collective labelled `op`: (members, bytes per call x calls).
fn collectives(sim: &crate::Simulation, op: &str) -> Vec<(Vec<u32>, f64)> {
    let p = &sim.program;
    p.tasks
        .iter()
        .filter(|t| t.kind == super::TaskKind::Collective && p.labels[t.label as usize].op == op)
        .map(|t| {
            let c = &p.collectives[t.payload as usize];
            (c.members.clone(), c.bytes * c.calls as f64)
        })
        .collect()
}

/// Under `dp_shard` 8 on two nodes, ZeRO-3's gathers and reduce-scatters stay in each node's
/// eight replicas, every reduce-scatter is followed by an all-reduce of its eighth across the
/// two nodes, and each device keeps an eighth of the optimizer states where plain ZeRO-3 keeps
/// a sixteenth. Lowered with and without data-parallel symmetry, the step is the same.
#[test]
fn hybrid_sharding_reduces_in_the_node_then_all_reduces_the_shard_across_nodes() {
    let hybrid = r#"{"dp": 16, "zero_stage": 3, "dp_shard": 8}"#;
    let h = fsdp(hybrid, r#""symmetry": false"#);
    let full = fsdp(r#"{"dp": 16, "zero_stage": 3}"#, r#""symmetry": false"#);
    let (scatters, gathers) = (collectives(&h, "grad_sync"), collectives(&h, "param_gather"));
    let all_reduces = collectives(&h, "grad_allreduce_shard");
    assert!(!scatters.is_empty() && !gathers.is_empty());
    let node_of = |m: &[u32]| m.iter().map(|d| d / 8).collect::<std::collections::BTreeSet<_>>();
    for (m, _) in scatters.iter().chain(&gathers) {
        assert_eq!((m.len(), node_of(m).len()), (8, 1), "a shard group is one node's eight GPUs: {m:?}");
    }
    // Both nodes' groups reduce: 16 devices' reduce-scatters, two groups of 8 members each.
    assert_eq!(scatters.len() % 2, 0);
    assert_eq!(all_reduces.len(), 8 * scatters.len() / 2, "one all-reduce per shard position and reduce-scatter");
    for (m, bytes) in &all_reduces {
        assert_eq!((m.len(), node_of(m).len()), (2, 2), "one GPU of each node: {m:?}");
        assert!(*bytes > 0.0);
    }
    let scattered: f64 = scatters.iter().map(|c| c.1).sum::<f64>() / 2.0;
    let reduced: f64 = all_reduces.iter().map(|c| c.1).sum::<f64>() / 8.0;
    assert!(
        (scattered / 8.0 - reduced).abs() < 1e-9 * scattered,
        "each all-reduce moves an eighth: {scattered} {reduced}"
    );
    // Without hybrid sharding nothing is all-reduced and the groups span both nodes.
    assert!(collectives(&full, "grad_allreduce_shard").is_empty());
    assert!(collectives(&full, "grad_sync").iter().all(|(m, _)| m.len() == 16));
    let (ho, fo) = (h.report.memory_breakdown.optimizer, full.report.memory_breakdown.optimizer);
    assert!((ho - 2.0 * fo).abs() < 1e-6 * ho, "optimizer states over 8, not 16: {ho} vs {fo}");
    let folded = fsdp(hybrid, "");
    assert!(folded.report.symmetric, "the replicas fold");
    assert_eq!(folded.report.iteration_s, h.report.iteration_s, "symmetry is exact under hybrid sharding");
}

/// Under ZeRO-1 (Megatron-Core's partial distributed optimizer) the updated parameters are
/// gathered in the shard group only.
#[test]
fn hybrid_zero_1_gathers_the_update_in_the_group() {
    let h = fsdp(r#"{"dp": 16, "zero_stage": 1, "dp_shard": 8}"#, r#""symmetry": false"#);
    let gathers = collectives(&h, "param_allgather");
    assert!(!gathers.is_empty());
    assert!(gathers.iter().all(|(m, _)| m.len() == 8));
    assert!(!collectives(&h, "grad_allreduce_shard").is_empty());
}

/// Hybrid sharding with ZeRO-Offload (PyTorch FSDP's `HYBRID_SHARD` with `CPUOffload`):
/// each device copies its reduced shard to the host only after the shard's all-reduce across
/// the shard groups, an eighth of the gradients where plain ZeRO-3 over 16 copies a
/// sixteenth, and each node's host holds twice the optimizer states.
#[test]
fn hybrid_sharding_offloads_the_all_reduced_shard() {
    let offload = |plan: &str| fsdp(plan, r#""symmetry": false"#);
    let h = offload(r#"{"dp": 16, "zero_stage": 3, "dp_shard": 8, "offload": "zero-offload"}"#);
    let flat = offload(r#"{"dp": 16, "zero_stage": 3, "offload": "zero-offload"}"#);
    let p = &h.program;
    let label = |t: u32| p.labels[p.tasks[t as usize].label as usize].op;
    let copies: Vec<u32> = (0..p.tasks.len() as u32)
        .filter(|&t| p.tasks[t as usize].kind == super::TaskKind::HostCopy && label(t) == "grad_to_host")
        .collect();
    assert!(!copies.is_empty(), "no gradient copy to the host");
    for &c in &copies {
        assert!(
            p.deps.iter().any(|&(a, b)| b == c && label(a) == "grad_allreduce_shard"),
            "copy {c} does not wait for its shard's all-reduce"
        );
    }
    let down = |sim: &crate::Simulation| {
        let p = &sim.program;
        p.tasks
            .iter()
            .filter(|t| t.kind == super::TaskKind::HostCopy && p.labels[t.label as usize].op == "grad_to_host")
            .map(|t| p.host_copies[t.payload as usize].bytes)
            .sum::<f64>()
    };
    assert!((down(&h) / down(&flat) - 2.0).abs() < 1e-9, "{} vs {}", down(&h), down(&flat));
    let ratio = h.report.host_memory_bytes / flat.report.host_memory_bytes;
    assert!((ratio - 2.0).abs() < 0.01, "host memory x{ratio}");
}

/// With `recompute_layers` 1 on two stages of 4 layers, each stage reruns one layer per
/// micro-batch: the rerun FLOPs a quarter of full recomputation's, the peak between none's and
/// full's; the first layer of each stage is the one that reruns.
#[test]
fn recompute_layers_reruns_the_first_layers_of_each_chunk() {
    let plan = |r: &str| format!(r#"{{"dp": 8, "pp": 2, "schedule": "1f1b", {r}}}"#);
    let none = fsdp(&plan(r#""recompute": "none""#), "");
    let full = fsdp(&plan(r#""recompute": "full""#), "");
    let part = fsdp(&plan(r#""recompute": "full", "recompute_layers": 1"#), "");
    let rerun = |s: &crate::Simulation| s.report.hardware_flops_per_iteration - s.report.model_flops_per_iteration;
    assert_eq!(rerun(&none), 0.0);
    let ratio = rerun(&part) / rerun(&full);
    assert!((ratio - 0.25).abs() < 1e-9, "one layer of four reruns: {ratio}");
    let peak = |s: &crate::Simulation| s.report.peak_memory_bytes;
    assert!(peak(&full) < peak(&part) && peak(&part) < peak(&none), "{} {} {}", peak(&full), peak(&part), peak(&none));
    assert!(full.report.iteration_s > part.report.iteration_s && part.report.iteration_s > none.report.iteration_s);
    let t = &part.timeline;
    let layers: std::collections::BTreeSet<i32> = t
        .spans
        .iter()
        .map(|s| &t.labels[s.label as usize])
        .filter(|l| l.phase == crate::report::timeline::Phase::Recompute)
        .map(|l| l.layer)
        .collect();
    assert_eq!(layers.into_iter().collect::<Vec<_>>(), vec![0, 4], "the first layer of each stage");
}

/// Hybrid sharding with expert parallelism (ep 4 inside shard groups of 8, on two nodes):
/// the routed experts' gradients are reduce-scattered over the two replicas of the shard group
/// that hold the same experts, each reduced shard then all-reduced with its twin in the other
/// group, and ZeRO-1 gathers the updated experts over the same two; plain ZeRO-1 over 16
/// reduces and gathers them over four. With dp_shard = ep no replica of the group shares an
/// expert: nothing is reduce-scattered, only the all-reduce across the groups remains.
#[test]
fn hybrid_sharding_splits_the_experts_over_their_replicas_in_the_group() {
    let run = |plan: &str, symmetry: bool| {
        let s = super::tests_data_parallel::moe_on_two_nodes("", plan, &format!(r#"{{"symmetry": {symmetry}}}"#));
        let (_, expert) = crate::cost::memory::state_bytes_per_parameter(&s.plan);
        (crate::simulate(&s, true), expert)
    };
    let moe = |plan: &str| run(plan, false);
    let sizes = |sim: &crate::Simulation, op: &str| {
        let mut v: Vec<usize> = collectives(sim, op).iter().map(|(m, _)| m.len()).collect();
        v.dedup();
        v
    };
    let (hybrid, expert) = moe(r#"{"dp": 16, "ep": 4, "zero_stage": 1, "dp_shard": 8}"#);
    let (flat, flat_expert) = moe(r#"{"dp": 16, "ep": 4, "zero_stage": 1}"#);
    assert_eq!(sizes(&hybrid, "expert_grad_sync"), [2]);
    assert_eq!(sizes(&hybrid, "expert_grad_allreduce_shard"), [2]);
    assert_eq!(sizes(&hybrid, "expert_param_allgather"), [2]);
    assert_eq!(sizes(&flat, "expert_grad_sync"), [4]);
    assert!(collectives(&flat, "expert_grad_allreduce_shard").is_empty());
    // Each reduced shard is half the bucket (two replicas), and the all-reduce moves it.
    let total = |sim: &crate::Simulation, op: &str| collectives(sim, op).iter().map(|(_, b)| b).sum::<f64>();
    let (rs, ar) = (total(&hybrid, "expert_grad_sync"), total(&hybrid, "expert_grad_allreduce_shard"));
    assert!(rs > 0.0 && (ar / rs - 0.5).abs() < 1e-9, "{ar} vs {rs}");
    // ZeRO-1 splits the experts' optimizer states over two replicas, not four.
    assert!(expert > flat_expert, "{expert} vs {flat_expert}");
    let (whole, _) = moe(r#"{"dp": 16, "ep": 8, "zero_stage": 1, "dp_shard": 8}"#);
    assert!(collectives(&whole, "expert_grad_sync").is_empty());
    assert_eq!(sizes(&whole, "expert_grad_allreduce_shard"), [2]);
    assert!(hybrid.report.iteration_s > 0.0 && whole.report.iteration_s > 0.0);
    // One replica lowered for all gives the same step.
    let (folded, _) = run(r#"{"dp": 16, "ep": 4, "zero_stage": 1, "dp_shard": 8}"#, true);
    assert_eq!(folded.report.iteration_s, hybrid.report.iteration_s);
}
