//! Megatron-Core's distributed optimizer on the timeline: where the all-gather of the updated
//! parameters runs (`framework.param_gather_overlap`) and which chunks have gradient buckets
//! (`framework.bucket_first_chunk_only`).

use crate::report::timeline::{Phase, StreamKind};
use crate::scenario;

/// GPT (8 layers, h = 1024) on 16 A100s under Megatron-Core with ZeRO-1, `plan` and the
/// framework's overrides `knobs` (JSON members, may be empty).
fn megatron(plan: &str, knobs: &str) -> crate::Simulation {
    let comma = if knobs.is_empty() { "" } else { "," };
    let text = format!(
        r#"{{"workload": {{"transformer": {{"layers": 8, "hidden": 1024, "heads": 16, "vocab": 32000}}}},
            "cluster": {{"node": "dgx-a100-80gb", "nodes": 2}},
            "training": {{"global_batch": 64, "micro_batch": 2, "seq_len": 512,
                          "framework": {{"name": "megatron-core"{comma} {knobs}}}}},
            "plan": {plan}}}"#
    );
    let s = scenario::parse(&text, &|_| Err("no files".into())).unwrap_or_else(|e| panic!("{e}"));
    crate::simulate(&s, true)
}

/// Spans of the timeline labelled `op`, as (device, start, end) in ns.
fn spans(sim: &crate::Simulation, op: &str) -> Vec<(u32, u64, u64)> {
    let t = &sim.timeline;
    t.spans.iter().filter(|s| t.labels[s.label as usize].op == op).map(|s| (s.device, s.start_ns, s.end_ns)).collect()
}

/// When the first compute-stream task of `phase` starts on `device` (any device: `None`), ns.
fn first_start(sim: &crate::Simulation, device: Option<u32>, phase: Phase) -> u64 {
    let t = &sim.timeline;
    t.spans
        .iter()
        .filter(|s| device.is_none_or(|d| s.device == d) && s.stream == StreamKind::Compute)
        .filter(|s| t.labels[s.label as usize].phase == phase)
        .map(|s| s.start_ns)
        .min()
        .expect("a compute task of the phase")
}

/// Without a pipeline the updated shards are gathered in the next forward, bucket by bucket
/// one ahead of it: the same bytes as the all-gather that otherwise ends the step, the
/// iteration now ending with the optimizer step and shorter by what the forward hid.
#[test]
fn the_update_is_gathered_in_the_next_forward() {
    let plan = r#"{"dp": 16, "zero_stage": 1, "bucket_bytes": 20000000}"#;
    let (on, off) = (megatron(plan, ""), megatron(plan, r#""param_gather_overlap": false"#));
    let bytes = |sim: &crate::Simulation| collective_bytes(sim, "param_allgather");
    assert!(
        bytes(&on) > 0.0 && (bytes(&on) - bytes(&off)).abs() < 1e-6 * bytes(&off),
        "{} vs {}",
        bytes(&on),
        bytes(&off)
    );
    let (gathers_on, gathers_off) = (spans(&on, "param_allgather"), spans(&off, "param_allgather"));
    assert!(gathers_on.len() > 1, "one gather per bucket: {}", gathers_on.len());
    let end = |sim: &crate::Simulation| sim.timeline.iteration_ns;
    // Off: the gathers end the step; on: they end before the first backward starts.
    assert!(gathers_off.iter().any(|g| g.2 == end(&off)));
    let first_backward = first_start(&on, None, Phase::Backward);
    assert!(gathers_on.iter().all(|g| g.2 <= first_backward), "{gathers_on:?} vs {first_backward}");
    assert!(on.report.iteration_s < off.report.iteration_s, "{} vs {}", on.report.iteration_s, off.report.iteration_s);
}

/// Megatron-Core buckets only the first stage's first chunk: a later stage reduces its
/// gradients in one reduce-scatter after its last backward and gathers its update in one
/// all-gather, which (1F1B: no aligned dispatch) its first forward waits for once its input
/// has arrived.
#[test]
fn only_the_first_stage_is_bucketed_and_later_stages_wait_for_their_gather() {
    let plan = r#"{"dp": 4, "pp": 4, "schedule": "1f1b", "zero_stage": 1, "bucket_bytes": 10000000}"#;
    let count = |sim: &crate::Simulation, op: &str, stage: u32| {
        let t = &sim.timeline;
        let devices: Vec<u32> =
            t.devices.iter().zip(&t.stages).filter(|(_, s)| **s == stage).map(|(&d, _)| d).collect();
        spans(sim, op).iter().filter(|g| g.0 == devices[0]).count()
    };
    let on = megatron(plan, "");
    assert!(count(&on, "grad_sync", 0) > 1, "{}", count(&on, "grad_sync", 0));
    assert!(count(&on, "param_allgather", 0) > 1);
    for stage in 1..4 {
        assert_eq!(count(&on, "grad_sync", stage), 1, "stage {stage}");
        assert_eq!(count(&on, "param_allgather", stage), 1, "stage {stage}");
    }
    let bucketed = megatron(plan, r#""bucket_first_chunk_only": false"#);
    assert!(count(&bucketed, "grad_sync", 3) > 1 && count(&bucketed, "param_allgather", 3) > 1);
    // The last stage's first forward starts after its gather ends.
    let t = &on.timeline;
    let last = t.devices.iter().zip(&t.stages).find(|(_, s)| **s == 3).map(|(&d, _)| d).expect("stage 3");
    let gather = spans(&on, "param_allgather").into_iter().find(|g| g.0 == last).expect("its gather");
    let first_forward = first_start(&on, Some(last), Phase::Forward);
    assert!(first_forward >= gather.2, "{first_forward} vs {gather:?}");
    // Until its input arrived the stage waited for the pipeline: the report charges the
    // data-parallel part only the gather and the reduction themselves.
    let class = on.report.time_breakdown.iter().find(|c| c.role == "device_class" && c.stage == 3).expect("stage 3");
    let own: u64 = spans(&on, "param_allgather")
        .iter()
        .chain(&spans(&on, "grad_sync"))
        .filter(|g| g.0 == last)
        .map(|g| g.2 - g.1)
        .sum();
    assert!(class.exposed_dp_comm_s <= own as f64 * 1e-9 + 1e-9, "{} s vs {} ns", class.exposed_dp_comm_s, own);
    assert!(class.bubble_s > class.exposed_dp_comm_s, "{class:?}");
}

/// With an interleaved schedule (Megatron's `align_param_gather`) every chunk's gather is
/// dispatched as the iteration starts: a stage's gathers run back to back from the start on
/// its data-parallel stream, whatever its inputs, one per chunk off the first stage's first
/// chunk, all done before the stage's first backward.
#[test]
fn an_interleaved_schedule_dispatches_every_gather_up_front() {
    let plan = r#"{"dp": 8, "pp": 2, "schedule": "interleaved", "virtual_stages": 2, "zero_stage": 1,
                   "bucket_bytes": 10000000}"#;
    let sim = megatron(plan, "");
    let t = &sim.timeline;
    let last = t.devices.iter().zip(&t.stages).find(|(_, s)| **s == 1).map(|(&d, _)| d).expect("stage 1");
    let mut gathers: Vec<(u64, u64)> =
        spans(&sim, "param_allgather").into_iter().filter(|g| g.0 == last).map(|g| (g.1, g.2)).collect();
    gathers.sort();
    assert_eq!(gathers.len(), 2, "one per chunk: {gathers:?}");
    assert_eq!(gathers[0].0, 0, "{gathers:?}");
    assert_eq!(gathers[1].0, gathers[0].1, "back to back: {gathers:?}");
    let first_backward = first_start(&sim, Some(last), Phase::Backward);
    assert!(gathers[1].1 <= first_backward, "{gathers:?} vs {first_backward}");
}

/// Bytes of the collectives labelled `op`, over every call.
fn collective_bytes(sim: &crate::Simulation, op: &str) -> f64 {
    let p = &sim.program;
    p.tasks
        .iter()
        .filter(|t| t.kind == super::TaskKind::Collective && p.labels[t.label as usize].op == op)
        .map(|t| p.collectives[t.payload as usize].bytes * p.collectives[t.payload as usize].calls as f64)
        .sum()
}

/// A small mixture-of-experts model (4 layers of 16 experts, top 2) on two DGX A100 nodes
/// under Megatron-Core, with `framework` (more keys of the framework object, each after a
/// comma), `plan` and `simulation` (JSON objects) as given.
pub(super) fn moe_on_two_nodes(framework: &str, plan: &str, simulation: &str) -> scenario::Scenario {
    let text = format!(
        r#"{{"workload": {{"transformer": {{"layers": 4, "hidden": 1024, "heads": 16, "vocab": 32000,
               "moe": {{"experts": 16, "top_k": 2, "expert_ffn": 2048}}}}}},
            "cluster": {{"node": "dgx-a100-80gb", "nodes": 2}},
            "training": {{"global_batch": 64, "micro_batch": 2, "seq_len": 512,
                          "framework": {{"name": "megatron-core"{framework}}}}},
            "plan": {plan}, "simulation": {simulation}}}"#
    );
    scenario::parse(&text, &|_| Err("no files".into())).unwrap_or_else(|e| panic!("{e}"))
}

/// Under expert parallelism the overlapped gather moves what the post-step one moves: the
/// dense parameters over the data-parallel group, the routed experts over the replicas that
/// hold the same experts, and nothing of them when no other replica does (dp = ep).
#[test]
fn the_overlapped_gather_leaves_unreplicated_experts_alone() {
    let moe = |plan: &str, overlap: bool| {
        let s = moe_on_two_nodes(&format!(r#", "param_gather_overlap": {overlap}"#), plan, "{}");
        crate::simulate(&s, false)
    };
    for plan in [r#"{"dp": 16, "ep": 16, "zero_stage": 1}"#, r#"{"dp": 16, "ep": 4, "zero_stage": 1}"#] {
        let (on, off) = (moe(plan, true), moe(plan, false));
        for op in ["param_allgather", "expert_param_allgather"] {
            let (a, b) = (collective_bytes(&on, op), collective_bytes(&off, op));
            assert!((a - b).abs() <= 1e-6 * b.max(1.0), "{plan} {op}: {a} vs {b}");
        }
        let experts = collective_bytes(&on, "expert_param_allgather");
        assert_eq!(experts > 0.0, plan.contains("\"ep\": 4"), "{plan}: {experts}");
    }
}

/// DeepSpeed below ZeRO-3 reduces on the compute stream (`overlap_comm` off by default): the
/// reductions sit on the compute streams and hold up the backward, so the step is longer
/// than with them overlapped, and the full simulation agrees with the symmetric one.
#[test]
fn blocking_reductions_hold_up_the_backward() {
    let run = |grad_reduce: &str, full: bool| {
        let text = format!(
            r#"{{"workload": {{"transformer": {{"layers": 8, "hidden": 1024, "heads": 16, "vocab": 32000}}}},
                "cluster": {{"node": "dgx-a100-80gb", "nodes": 2}},
                "training": {{"global_batch": 64, "micro_batch": 2, "seq_len": 512,
                              "framework": {{"name": "deepspeed", "grad_reduce": "{grad_reduce}"}}}},
                "plan": {{"dp": 16, "zero_stage": 1, "bucket_bytes": 20000000}}}}"#
        );
        let mut s = scenario::parse(&text, &|_| Err("no files".into())).unwrap_or_else(|e| panic!("{e}"));
        s.options.symmetry = !full;
        crate::simulate(&s, true)
    };
    let (blocking, overlapped) = (run("blocking", false), run("overlapped", false));
    let on = |sim: &crate::Simulation| {
        let t = &sim.timeline;
        t.spans.iter().filter(|s| t.labels[s.label as usize].op == "grad_sync").map(|s| s.stream).collect::<Vec<_>>()
    };
    assert!(!on(&blocking).is_empty() && on(&blocking).iter().all(|&k| k == StreamKind::Compute));
    assert!(on(&overlapped).iter().all(|&k| k == StreamKind::DataParallel));
    let it = |sim: &crate::Simulation| sim.report.iteration_s;
    assert!(it(&blocking) > it(&overlapped), "{} vs {}", it(&blocking), it(&overlapped));
    assert_eq!(it(&run("blocking", true)), it(&blocking));
}
