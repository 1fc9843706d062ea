//! Properties of simulated reports on small scenarios (one or two DGX A100 80GB nodes, small
//! custom transformers), through `sim::scenario::parse` and `sim::simulate`.

use crate::util::{
    self, TempDir, num, run, scenario, simulate, small_transformer, stderr, stdout, with_intra_node_bandwidth,
};
use serde_json::{Value, json};

fn training(global_batch: u32, micro_batch: u32, seq_len: u32) -> Value {
    json!({"global_batch": global_batch, "micro_batch": micro_batch, "seq_len": seq_len,
           "precision": "bf16", "optimizer": "adam"})
}

/// (a) Iteration time never grows with the intra-node bandwidth, and does shrink overall.
#[test]
fn iteration_time_is_monotone_in_intra_node_bandwidth() {
    let bandwidths = [5e9, 10e9, 25e9, 50e9, 100e9, 150e9, 300e9, 600e9, 1200e9];
    let plans =
        [json!({"dp": 1, "tp": 8, "pp": 1}), json!({"dp": 2, "tp": 4, "pp": 1}), json!({"dp": 8, "tp": 1, "pp": 1})];
    for plan in plans {
        let base = scenario(small_transformer(4, 2048, 16), 1, training(16, 2, 1024), plan.clone());
        let times: Vec<f64> =
            bandwidths.iter().map(|&bw| simulate(&with_intra_node_bandwidth(&base, bw)).iteration_s).collect();
        for (i, w) in times.windows(2).enumerate() {
            assert!(
                w[1] <= w[0],
                "plan {plan}: iteration grew from {} s at {:e} B/s to {} s at {:e} B/s (all: {times:?})",
                w[0],
                bandwidths[i],
                w[1],
                bandwidths[i + 1]
            );
        }
        assert!(
            times[0] > 1.05 * times[times.len() - 1],
            "plan {plan}: a 240x faster link changed the iteration by less than 5%: {times:?}"
        );
    }
}

/// A pipeline of 4 stages with 4 layers each and a small vocabulary, so that the embedding
/// and the head barely unbalance the stages, on `m` micro-batches of 1.
fn balanced_pipeline(m: u32) -> sim::report::Report {
    let w = json!({"transformer": {"layers": 16, "hidden": 2048, "heads": 16, "vocab": 1024}});
    let r = simulate(&scenario(w, 1, training(m, 1, 1024), json!({"dp": 1, "tp": 2, "pp": 4})));
    assert_eq!(r.plan.micro_batches, m);
    r
}

/// (b) At fixed micro-batch size, more micro-batches shrink the pipeline bubble.
#[test]
fn more_micro_batches_shrink_the_bubble() {
    let bubbles: Vec<(u32, f64)> = [4u32, 8, 16, 32, 64].map(|m| (m, balanced_pipeline(m).bubble_fraction)).to_vec();
    for w in bubbles.windows(2) {
        assert!(w[1].1 < w[0].1, "bubble did not shrink with more micro-batches: {bubbles:?}");
    }
    assert!(bubbles.iter().all(|&(_, b)| b > 0.0 && b < 1.0), "{bubbles:?}");
    // With an unbalanced last stage (a 32k vocabulary head) too.
    let mut last = f64::INFINITY;
    for m in [4u32, 8, 16, 32] {
        let w = small_transformer(8, 1024, 16);
        let b = simulate(&scenario(w, 1, training(m, 1, 1024), json!({"dp": 1, "tp": 2, "pp": 4}))).bubble_fraction;
        assert!(b < last, "m={m}: bubble {b} is not below {last}");
        last = b;
    }
}

/// The bubble of a balanced 1F1B pipeline is (p - 1) / (m + p - 1) of the iteration (Narayanan
/// et al. 2021): every stage idles (p - 1) x (forward + backward), the last ones partly after
/// their final backward while the gradients flow back to the first stage.
#[test]
fn balanced_pipeline_bubble_matches_narayanan() {
    let p = 4.0;
    // Few micro-batches: the small imbalance of the embedding and head stages adds idle time
    // that grows with m and would dominate the shrinking bubble beyond these.
    for m in [4u32, 8, 16] {
        let r = balanced_pipeline(m);
        let ideal = (p - 1.0) / (m as f64 + p - 1.0);
        let b = r.bubble_fraction;
        assert!((b - ideal).abs() <= 0.15 * ideal, "m={m}: bubble {b} vs (p-1)/(m+p-1) = {ideal}");
        // Equal stages idle equally.
        let idle: Vec<f64> = r.stages.iter().map(|s| s.bubble_s).collect();
        let (lo, hi) = idle.iter().fold((f64::INFINITY, 0f64), |(lo, hi), &x| (lo.min(x), hi.max(x)));
        assert!(lo >= 0.75 * hi, "m={m}: per-stage bubbles {idle:?} differ by more than 25%");
    }
}

/// (c) Full recomputation keeps less than selective, selective less than none; full is slower.
#[test]
fn recomputation_trades_memory_for_time() {
    let run_mode = |mode: &str, plan: Value| {
        let mut plan = plan;
        plan["recompute"] = json!(mode);
        // Materialised scores: what selective recomputation drops.
        let mut t = training(16, 2, 2048);
        t["attention"] = json!("naive");
        simulate(&scenario(small_transformer(8, 1024, 16), 1, t, plan))
    };
    // One stage: every device alike.
    let plan = json!({"dp": 1, "tp": 8, "pp": 1});
    let [none, sel, full] = ["none", "selective", "full"].map(|m| run_mode(m, plan.clone()));
    let act = |r: &sim::report::Report| r.memory_breakdown.activations;
    assert!(act(&full) < act(&sel), "activations: full {} >= selective {}", act(&full), act(&sel));
    assert!(act(&sel) < act(&none), "activations: selective {} >= none {}", act(&sel), act(&none));
    assert!(full.peak_memory_bytes < sel.peak_memory_bytes && sel.peak_memory_bytes < none.peak_memory_bytes);
    assert!(
        full.iteration_s > none.iteration_s,
        "full {} s is not slower than none {} s",
        full.iteration_s,
        none.iteration_s
    );
    assert!(
        full.iteration_s > sel.iteration_s,
        "full {} s is not slower than selective {} s",
        full.iteration_s,
        sel.iteration_s
    );
    assert!(
        sel.iteration_s >= none.iteration_s,
        "selective {} s is faster than none {} s",
        sel.iteration_s,
        none.iteration_s
    );
    // Static memory does not depend on recomputation.
    assert_eq!(full.memory_breakdown.weights, none.memory_breakdown.weights);
    assert_eq!(full.memory_breakdown.optimizer, none.memory_breakdown.optimizer);

    // Two stages: the same order on each stage's peak.
    let plan = json!({"dp": 1, "tp": 4, "pp": 2});
    let [none, sel, full] = ["none", "selective", "full"].map(|m| run_mode(m, plan.clone()));
    for st in 0..2 {
        let peak = |r: &sim::report::Report| r.stages[st].peak_memory_bytes;
        assert!(
            peak(&full) < peak(&sel) && peak(&sel) < peak(&none),
            "stage {st} peaks not ordered full < selective < none"
        );
    }
    assert!(full.iteration_s > none.iteration_s);
}

/// (d) ZeRO stage 1 shards the optimizer state over the data-parallel group.
#[test]
fn zero_stage_1_divides_optimizer_state_by_dp() {
    let report = |zero: u32| {
        let plan = json!({"dp": 8, "tp": 1, "pp": 1, "zero_stage": zero});
        simulate(&scenario(small_transformer(4, 1024, 16), 1, training(16, 2, 512), plan))
    };
    let (z0, z1) = (report(0), report(1));
    let (m0, m1) = (z0.memory_breakdown, z1.memory_breakdown);
    assert!(m0.optimizer > 0.0);
    util::assert_close(m1.optimizer * 8.0, m0.optimizer, 1e-12, "ZeRO-1 optimizer bytes x dp vs ZeRO-0");
    assert_eq!(m1.weights, m0.weights, "ZeRO-1 changed the weights");
    assert_eq!(m1.gradients, m0.gradients, "ZeRO-1 changed the gradients");
}

/// One stage holds the whole model: bf16 weights and gradients (2 bytes each) and Adam's fp32
/// master weights, momentum and variance (12 bytes) per parameter.
fn assert_single_stage_holds_every_parameter_once(tied: bool) {
    let w = json!({"transformer": {"layers": 4, "hidden": 1024, "heads": 16, "vocab": 32000,
                                   "tied_embeddings": tied}});
    let r = simulate(&scenario(w, 1, training(16, 2, 512), json!({"dp": 8, "tp": 1, "pp": 1})));
    let m = r.memory_breakdown;
    let n = r.parameters;
    util::assert_close(m.weights, 2.0 * n, 1e-9, "bf16 weights of the whole model");
    util::assert_close(m.gradients, 2.0 * n, 1e-9, "bf16 gradients of the whole model");
    util::assert_close(m.optimizer, 12.0 * n, 1e-9, "Adam state of the whole model");
}

#[test]
fn single_stage_holds_every_parameter_once() {
    assert_single_stage_holds_every_parameter_once(false);
}

#[test]
fn single_stage_holds_tied_embeddings_once() {
    assert_single_stage_holds_every_parameter_once(true);
}

/// (e) A plan that does not fit is a result: fits=false, the peak above capacity, exit 0.
#[test]
fn plan_that_does_not_fit_is_a_result() {
    let mut t = training(64, 64, 2048);
    t["attention"] = json!("naive");
    let text = scenario(small_transformer(8, 4096, 32), 1, t, json!({"dp": 1, "tp": 8, "pp": 1}));
    let r = simulate(&text);
    assert!(!r.fits, "a 64 x 2048-token micro-batch of h=4096 fits in 80 GB?");
    assert!(r.peak_memory_bytes > r.memory_capacity_bytes);

    let tmp = TempDir::new("nofit");
    let path = tmp.write("input.json", &text);
    let o = run(&[&"simulate", &path, &"--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).expect("report is JSON");
    assert_eq!(v["fits"], json!(false));
    assert!(num(&v, "/peak_memory_bytes") > 80.0 * 1024f64.powi(3), "peak {} bytes", v["peak_memory_bytes"]);
    assert!(num(&v, "/memory_breakdown/activations") > 0.0);
}

/// (f) Simulating one data-parallel replica and one tensor rank per group and mirroring them
/// gives the full simulation's results where it applies, replicas that share nodes included
/// (dp 2 x pp 2 x tp 4 on two nodes of 8: each node holds both replicas' stage, and each
/// device has its own NIC): one replica's two stages, one tensor rank each. (Every key of the report: `symmetry::one_tensor_rank_stands_for_its_group`.)
#[test]
fn symmetric_and_full_simulation_agree() {
    for (plan, simulated) in [(json!({"dp": 2, "tp": 8, "pp": 1}), 1), (json!({"dp": 2, "tp": 4, "pp": 2}), 2)] {
        let text = scenario(small_transformer(8, 2048, 16), 2, training(16, 2, 1024), plan.clone());
        let mut full: Value = serde_json::from_str(&text).unwrap();
        full["simulation"] = json!({"symmetry": false});
        let (a, b) = (simulate(&text), simulate(&full.to_string()));
        assert!(a.symmetric, "plan {plan}: symmetric");
        assert!(!b.symmetric, "plan {plan}: symmetry used although switched off");
        assert_eq!(b.simulated_devices, 16, "plan {plan}: full simulation");
        assert_eq!(a.simulated_devices, simulated, "plan {plan}: simulated devices");
        assert_eq!(a.iteration_s, b.iteration_s, "plan {plan}: iteration_s");
        assert_eq!(a.bubble_fraction, b.bubble_fraction, "plan {plan}: bubble_fraction");
        assert_eq!(a.peak_memory_bytes, b.peak_memory_bytes, "plan {plan}: peak_memory_bytes");
        assert_eq!(a.mfu, b.mfu, "plan {plan}: mfu");
    }
}

/// The activations listed at the peak add up to the breakdown's activations, and a 1F1B stage s
/// holds exactly min(p - s, m) micro-batches then (the schedule's in-flight bound).
#[test]
fn peak_activations_are_itemised_by_layer_and_micro_batch() {
    for (pp, m) in [(4u32, 8u32), (4, 2), (2, 6), (4, 96)] {
        let w = json!({"transformer": {"layers": 8, "hidden": 1024, "heads": 16, "vocab": 1024}});
        let plan = json!({"dp": 8 / pp, "tp": 1, "pp": pp, "schedule": "1f1b"});
        let r = simulate(&scenario(w, 1, training(m * (8 / pp), 1, 1024), plan));
        let listed: f64 = r.peak_activations.iter().map(|a| a.bytes).sum();
        let act = r.memory_breakdown.activations;
        assert!((listed - act).abs() <= 1e-6 * act, "pp={pp} m={m}: {listed} vs {act}");
        // Stage s (devices s x dp..) holds min(p - s, m) micro-batches at its peak. (The first
        // stage holds the most, but a middle stage keeps NCCL buffers for two pipeline peers
        // and may peak higher.)
        let stage = r.peak_memory_device / (8 / pp);
        let mbs: std::collections::BTreeSet<u32> = r.peak_activations.iter().filter_map(|a| a.micro_batch).collect();
        assert_eq!(mbs.len() as u32, (pp - stage).min(m), "pp={pp} m={m} stage {stage}: {mbs:?}");
    }
}

/// Replica-major numbering (`tp-pp-dp`) puts each replica's pipeline on its own node: one
/// replica then stands for all (and agrees with the full simulation), pipeline sends stay on
/// the node's links and only the gradient all-reduce crosses the NIC. With one slow NIC per
/// node, large activations and a small model, that beats Megatron's numbering, under which
/// each node holds one stage of every replica and every stage boundary crosses the NIC.
#[test]
fn rank_order_places_replicas_and_moves_traffic_off_the_nic() {
    let plan = |order: &str| json!({"dp": 4, "tp": 1, "pp": 4, "schedule": "1f1b", "rank_order": order});
    let on_slow_nics = |order: &str| {
        let mut v: Value =
            serde_json::from_str(&scenario(small_transformer(8, 1024, 16), 4, training(128, 4, 2048), plan(order)))
                .unwrap();
        v["cluster"] = json!({
            "node": {"preset": "dgx-a100-80gb", "devices": 4, "nics": 1,
                     "nic": {"bandwidth_bytes_per_s": 1e9, "latency_s": 1e-5}},
            "nodes": 4
        });
        v
    };
    let replica_major = on_slow_nics("tp-pp-dp");
    let a = simulate(&replica_major.to_string());
    assert!(a.symmetric, "each node holds one replica");
    let mut full = replica_major.clone();
    full["simulation"] = json!({"symmetry": false});
    let b = simulate(&full.to_string());
    assert_eq!(a.iteration_s, b.iteration_s);
    assert_eq!(a.peak_memory_bytes, b.peak_memory_bytes);
    let m = simulate(&on_slow_nics("tp-dp-pp").to_string());
    assert!(!m.symmetric);
    assert!(a.iteration_s < m.iteration_s, "tp-pp-dp {} s vs tp-dp-pp {} s", a.iteration_s, m.iteration_s);
    assert!(m.defaults_applied.iter().all(|d| !d.starts_with("plan.rank_order")));
}

/// The host's time to issue ops bounds a stream of short kernels and hides behind long ones.
#[test]
fn host_issue_time_bounds_small_kernels_only() {
    let run = |hidden: u32, micro_batch: u32, seq: u32, host: f64| {
        let mut v: Value = serde_json::from_str(&scenario(
            small_transformer(4, hidden, hidden / 64),
            1,
            training(8 * micro_batch, micro_batch, seq),
            json!({"dp": 8, "tp": 1, "pp": 1}),
        ))
        .unwrap();
        v["simulation"] = json!({"host_op_s": host});
        simulate(&v.to_string()).iteration_s
    };
    // Tiny kernels: 100 us per op makes the step several times slower.
    let (free, slow) = (run(256, 1, 64, 0.0), run(256, 1, 64, 100e-6));
    assert!(slow > 3.0 * free, "{slow} vs {free}");
    // Large kernels: the host runs ahead; under 2% slower.
    let (free, slow) = (run(8192, 8, 2048, 0.0), run(8192, 8, 2048, 100e-6));
    assert!(slow < 1.02 * free && slow >= free, "{slow} vs {free}");
}

/// Two stages on one node whose device link is slow (1 GB/s), `m` micro-batches of one
/// 1024-token sequence (2 MiB per pipeline send, ~2 ms), sends `p2p`.
fn slow_link_pipeline(m: u32, p2p: &str) -> sim::Simulation {
    let text = with_intra_node_bandwidth(
        &scenario(
            small_transformer(4, 1024, 16),
            1,
            training(4 * m, 1, 1024),
            json!({"dp": 4, "tp": 1, "pp": 2, "schedule": "gpipe", "p2p": p2p, "rank_order": "tp-pp-dp"}),
        ),
        1e9,
    );
    sim::simulate(&util::parse(&text), false)
}

/// A blocking send holds its device's next op: that op depends on it (and nothing else does);
/// the pipeline's fill costs the same as with overlapped sends (one micro-batch: nothing
/// waits), and each later micro-batch adds at most its sends.
#[test]
fn blocking_sends_hold_the_sender_and_cost_at_most_their_time() {
    use sim::lower::{Program, TaskKind};
    use sim::report::timeline::StreamKind;
    let held = |p: &Program| {
        let mut next = std::collections::HashMap::new();
        for &(a, b) in &p.deps {
            let (ta, tb) = (&p.tasks[a as usize], &p.tasks[b as usize]);
            if ta.kind == TaskKind::Transfer
                && Program::stream_kind(tb.stream) == StreamKind::Compute
                && p.transfers[ta.payload as usize].source == p.devices[Program::stream_device(tb.stream) as usize]
            {
                next.insert(a, b);
            }
        }
        next
    };
    let out = slow_link_pipeline(4, "blocking");
    let p = &out.program;
    let sends: Vec<u32> =
        (0..p.tasks.len() as u32).filter(|&t| p.tasks[t as usize].kind == TaskKind::Transfer).collect();
    let next = held(p);
    assert!(!sends.is_empty());
    for &s in &sends {
        // The sender's compute stream: its first task created after the send.
        let src = p.transfers[p.tasks[s as usize].payload as usize].source;
        let di = p.devices.iter().position(|&d| d == src).unwrap() as u32;
        let stream = &p.streams[Program::stream_index(di, StreamKind::Compute) as usize];
        match stream.iter().find(|&&t| t > s) {
            Some(&t) => assert_eq!(next.get(&s), Some(&t), "send {s} does not hold device {src}'s next task"),
            None => assert!(!next.contains_key(&s)),
        }
    }
    assert!(held(&slow_link_pipeline(4, "overlapped").program).is_empty());
    assert!(out.report.defaults_applied.iter().all(|d| !d.starts_with("plan.p2p")));

    let send_s = 1024.0 * 1024.0 * 2.0 / 1e9;
    let (b1, o1) = (slow_link_pipeline(1, "blocking").report, slow_link_pipeline(1, "overlapped").report);
    assert_eq!(b1.iteration_s, o1.iteration_s);
    let (b8, o8) = (slow_link_pipeline(8, "blocking").report, slow_link_pipeline(8, "overlapped").report);
    assert!(b8.iteration_s > o8.iteration_s + send_s, "{} vs {}", b8.iteration_s, o8.iteration_s);
    assert!(b8.iteration_s <= o8.iteration_s + 2.0 * 8.0 * send_s, "{} vs {}", b8.iteration_s, o8.iteration_s);
}

/// Every backward after a chunk's first adds the chunk's weight gradients into the kept ones:
/// 3 x parameters x gradient bytes per unit (layers, embedding, head); ZeRO-2 accumulates
/// into the device's shard; with the optimizer and gradients on the host, nothing does.
#[test]
fn weight_gradients_accumulate_after_each_chunk_s_first_backward() {
    let (layers, hidden) = (4u32, 1024u32);
    // `m` micro-batches per replica.
    let program = |m: u32, plan: Value| {
        let dp = plan["dp"].as_u64().unwrap() as u32;
        let text = scenario(small_transformer(layers, hidden, 16), 1, training(m * dp, 1, 512), plan);
        sim::simulate(&util::parse(&text), false).program
    };
    let accumulations = |p: &sim::lower::Program| -> Vec<(u32, f64)> {
        p.tasks
            .iter()
            .filter(|t| p.labels[t.label as usize].op == "grad_accumulate")
            .map(|t| (t.micro_batch, p.ops[t.payload as usize].spec.backward_bytes))
            .collect()
    };
    // dp 4 x pp 2: per device, 2 layers + the embedding (stage 0) or the head (stage 1).
    let p = program(4, json!({"dp": 4, "pp": 2, "tp": 1, "schedule": "1f1b"}));
    let acc = accumulations(&p);
    // Replica 0 is simulated (its 2 devices stand for the 4 replicas' 8).
    assert_eq!(p.devices.len(), 2, "one replica of two stages simulated");
    assert_eq!(acc.len(), 2 * 3 * 3, "3 later micro-batches x 3 units on each simulated device");
    assert!(acc.iter().all(|&(mb, _)| mb != 0), "the first backward (micro-batch 0) accumulates nothing");
    let text = scenario(small_transformer(layers, hidden, 16), 1, training(8, 1, 512), json!({"dp": 8}));
    let layer_bytes = 3.0 * util::parse(&text).workload.transformer.layer_parameters() * 2.0;
    assert_eq!(acc.iter().filter(|&&(_, b)| b == layer_bytes).count(), 2 * 3 * 2);
    // One micro-batch: nothing to add to.
    assert!(accumulations(&program(1, json!({"dp": 8, "pp": 1, "tp": 1}))).is_empty());
    // ZeRO-2 over 8 replicas: into the shard.
    let z2 = accumulations(&program(2, json!({"dp": 8, "pp": 1, "tp": 1, "zero_stage": 2})));
    assert!(!z2.is_empty());
    assert!(z2.iter().any(|&(_, b)| (b - layer_bytes / 8.0).abs() < 1e-6 * layer_bytes), "{z2:?}");
    // ZeRO-3 (FSDP-style per-layer gathers) too.
    let z3 = accumulations(&program(2, json!({"dp": 8, "pp": 1, "tp": 1, "zero_stage": 3})));
    assert!(z3.iter().any(|&(_, b)| (b - layer_bytes / 8.0).abs() < 1e-6 * layer_bytes), "{z3:?}");
    // ZeRO-Offload: gradients stream to the host.
    let off = json!({"dp": 8, "pp": 1, "tp": 1, "zero_stage": 2, "offload": "zero-offload"});
    assert!(accumulations(&program(2, off)).is_empty());
}
