use crate::report::timeline::StreamKind;
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

/// Megatron keeps its gradients in fp32 `main_grad` buffers under bf16: 2 + 4 + 12 = 18 bytes
/// of model states per parameter without sharding, 6 + 12/N with the distributed optimizer
/// (ZeRO-1) (Megatron-Core's distributed optimizer guide).
#[test]
fn megatron_keeps_fp32_gradients() {
    let n = 16u32;
    for (z, per_param) in [(0u8, 18.0), (1, 6.0 + 12.0 / n as f64)] {
        let s = with_framework(r#""megatron-core""#, &format!(r#"{{"dp": {n}, "zero_stage": {z}}}"#));
        let psi = s.workload.parameters();
        let m = super::lower(&s).static_memory[0];
        let states = m.weights + m.gradients + m.optimizer;
        assert!((states - per_param * psi).abs() <= 1e-6 * states, "z={z}: {} bytes per parameter", states / psi);
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

/// (25 MiB buckets: DeepSpeed's default 5e8-element bucket sends every gradient to the host
/// at the end of backward, when the activations' copies compete with it for PCIe.)
#[test]
fn activation_offload_trades_pcie_time_for_device_memory() {
    let plan = |acts: &str| {
        format!(
            r#"{{"dp": 8, "zero_stage": 2, "recompute": "selective", "bucket_bytes": 26214400, "offload": {{"optimizer": "cpu", "activations": "{acts}"}}}}"#
        )
    };
    let big = r#"{"transformer": {"layers": 8, "hidden": 2048, "heads": 16, "vocab": 32000}}"#;
    let on = crate::simulate(&scenario(&plan("gpu"), r#""dgx-a100-40gb""#, 1, big), false);
    let off = crate::simulate(&scenario(&plan("cpu"), r#""dgx-a100-40gb""#, 1, big), false);
    assert!(off.report.memory_breakdown.activations < on.report.memory_breakdown.activations);
    assert!(off.report.iteration_s > on.report.iteration_s);
    assert!(off.program.host_copies.len() > on.program.host_copies.len());
}

/// (A small vocabulary keeps the stages even: with GPT's 32k-entry head and its loss on the
/// last of four one-layer stages, that stage's imbalance, not the flush, sets the bubble.)
#[test]
fn two_bw_keeps_two_weight_versions_and_drops_the_flush() {
    let plan = |s: &str| format!(r#"{{"dp": 2, "tp": 1, "pp": 4, "schedule": "{s}"}}"#);
    let node = r#"{"preset": "dgx-a100-80gb"}"#;
    let even = r#"{"transformer": {"layers": 8, "hidden": 1024, "heads": 16, "vocab": 1024}}"#;
    let flush = crate::simulate(&scenario(&plan("1f1b"), node, 1, even), false);
    let two = crate::simulate(&scenario(&plan("2bw"), node, 1, even), false);
    assert!(two.report.iteration_s < flush.report.iteration_s);
    let w = flush.report.memory_breakdown.weights;
    assert!((two.report.memory_breakdown.weights - 2.0 * w).abs() < 1e-6 * w);
    assert!(two.report.bubble_fraction < flush.report.bubble_fraction);
}

/// Across nodes joined by a slow link the gradient all-reduce of one batch outlasts the next
/// batch's compute: 2BW's steady state is then no faster than that all-reduce (the doubled run's
/// difference holds no all-reduce at all), and the time past its compute is the data-parallel
/// wait.
#[test]
fn two_bw_turns_over_no_faster_than_its_gradient_all_reduce() {
    let text = |s: &str| {
        format!(
            r#"{{"workload": {GPT}, "cluster": {{"node": {{"preset": "dgx-a100-80gb", "devices": 1}}, "nodes": 4,
                "inter_node": {{"preset": "ib-ndr", "bandwidth_bytes_per_s": 1e8}}}},
                "training": {{"global_batch": 64, "micro_batch": 1, "seq_len": 512, "precision": "bf16", "optimizer": "adam"}},
                "plan": {{"dp": 2, "pp": 2, "schedule": "{s}"}}}}"#
        )
    };
    let parse = |s: &str| scenario::parse(&text(s), &|_| Err("no files".into())).unwrap_or_else(|e| panic!("{e}"));
    let flush = crate::simulate(&parse("1f1b"), false);
    let two = crate::simulate(&parse("2bw"), false);
    // One node per device: one stage's gradients cross the 100 MB/s link in a ring of two,
    // far longer than the batch's compute.
    let compute = flush.report.stages.iter().map(|st| st.compute_busy_s).fold(0.0, f64::max);
    let dp_busy = flush
        .timeline
        .stream_busy_ns
        .iter()
        .enumerate()
        .filter(|(i, _)| i % super::STREAMS == StreamKind::DataParallel.index())
        .map(|(_, &ns)| ns as f64 * 1e-9)
        .fold(0.0, f64::max);
    assert!(dp_busy > 3.0 * compute, "all-reduce {dp_busy} s, compute {compute} s");
    assert!(
        two.report.iteration_s >= dp_busy * (1.0 - 1e-9),
        "2bw {} s < all-reduce {dp_busy} s",
        two.report.iteration_s
    );
    assert!(two.report.iteration_s <= flush.report.iteration_s);
    let critical = &two.report.time_breakdown[0];
    assert!(critical.exposed_dp_comm_s > 0.5 * two.report.iteration_s, "{critical:?}");
}

/// One A100 (with `hbm` bytes of memory) training a 2.6B-parameter model: its mixed-precision
/// Adam states take 16 bytes per parameter (41 GB), its fp16 weights alone 5.2 GB. One
/// framework for every policy (by default the plan would pick Colossal-AI for Gemini only).
fn one_gpu(offload: &str, hbm: f64) -> scenario::Scenario {
    let device = format!(r#", "device": {{"preset": "a100-sxm-40gb", "hbm_bytes": {hbm}}}"#);
    let text = format!(
        r#"{{"workload": {{"transformer": {{"layers": 32, "hidden": 2560, "heads": 20, "vocab": 50257}}}},
            "cluster": {{"node": {{"preset": "dgx-a100-40gb", "devices": 1{device}}}, "nodes": 1}},
            "training": {{"global_batch": 8, "micro_batch": 4, "seq_len": 1024, "precision": "fp16", "optimizer": "adam", "framework": "colossal-ai"}},
            "plan": {{"dp": 1, "recompute": "full", "offload": {offload}}}}}"#
    );
    scenario::parse(&text, &|_| Err("no files".into())).unwrap_or_else(|e| panic!("{e}"))
}

/// With memory to spare, Gemini's policies keep every chunk and optimizer state on the device
/// and move nothing, so the iteration takes exactly as long as with everything on the device.
/// (The static policies, ZeRO-Offload and ZeRO-Infinity, offload whatever the room.)
#[test]
fn with_unlimited_hbm_dynamic_policies_time_like_the_device() {
    let time = |off: &str| crate::simulate(&one_gpu(off, 1e15), false);
    let device = time(r#""none""#);
    for off in [r#""gemini""#, r#""gemini-lru""#, r#"{"policy": "const", "budget_bytes": 1e15}"#] {
        let r = time(off);
        assert_eq!(r.report.iteration_s, device.report.iteration_s, "{off}");
        let c = &r.report.chunk_placement[0];
        assert_eq!((c.fetches, c.evictions, c.optimizer_on_device), (0, 0, 1.0), "{off}");
    }
}

/// Where not even the weights fit (a 6 GB device), Gemini moves chunks: the device never holds more than its
/// memory at any sampled moment of the timeline, the host holds the rest within its DRAM,
/// and every access finds room.
#[test]
fn gemini_never_places_more_than_a_tier_holds() {
    let none = crate::simulate(&one_gpu(r#""none""#, 6e9), false).report;
    assert!(
        !none.fits_hbm,
        "the test needs a model that does not fit: {} GiB",
        none.peak_memory_bytes / (1u64 << 30) as f64
    );
    for off in [r#""gemini""#, r#""gemini-lru""#, r#""const""#] {
        let s = one_gpu(off, 6e9);
        let sim = crate::simulate(&s, true);
        let r = &sim.report;
        let c = &r.chunk_placement[0];
        assert!(c.feasible && r.fits, "{off}: peak {} of {}", r.peak_memory_bytes, r.memory_capacity_bytes);
        assert!(c.fetches > 0 && c.evictions > 0, "{off} moved nothing");
        let hbm = s.cluster.node.device.hbm_bytes;
        let st = sim.timeline.static_hbm[0];
        let fixed = st.weights + st.gradients + st.optimizer + st.buffers;
        for m in &sim.timeline.memory {
            assert!(fixed + m.activations + m.moved_weights <= hbm, "{off} at {} ns", m.time_ns);
        }
        assert!(r.host_memory_bytes <= r.host_capacity_bytes, "{off}");
        // Every parameter's optimizer state is somewhere: on the device or on the host.
        let psi = s.workload.parameters();
        let states = st.optimizer + sim.timeline.static_host[0].optimizer;
        assert!((states - 12.0 * psi).abs() < 1e-6 * states, "{off}: {states} vs {}", 12.0 * psi);
    }
}

/// A chunk's copy over PCIe costs its bytes over the link's bandwidth (plus its latency and
/// the copy's launch) on the timeline: each device's copies run one at a time on its own link.
#[test]
fn a_chunk_move_costs_its_bytes_over_the_link() {
    let s = one_gpu(r#""gemini""#, 6e9);
    let sim = crate::simulate(&s, true);
    let p = &sim.program;
    let pcie = s.cluster.node.host.pcie;
    let launch = s.cluster.node.device.kernel_launch_s;
    let mut moves = 0;
    for (name, to_device) in [("chunk_fetch", true), ("chunk_evict", false)] {
        let label = p.labels.iter().position(|l| l.op == name).expect("moves labelled") as u32;
        // The program's copies in stream order, and the timeline's spans in start order.
        let stream = &p.streams[super::Program::stream_index(0, StreamKind::HostCopy) as usize];
        let bytes: Vec<f64> = stream
            .iter()
            .filter(|&&t| p.tasks[t as usize].label == label)
            .map(|&t| {
                let c = p.host_copies[p.tasks[t as usize].payload as usize];
                assert_eq!(c.to_device, to_device);
                c.bytes
            })
            .collect();
        let mut spans: Vec<_> = sim.timeline.spans.iter().filter(|sp| sp.label == label).collect();
        spans.sort_by_key(|sp| sp.start_ns);
        assert_eq!(bytes.len(), spans.len(), "{name}");
        for (b, sp) in bytes.iter().zip(spans) {
            let expect = b / pcie.effective_bytes_per_s() + pcie.latency_s + launch;
            let got = (sp.end_ns - sp.start_ns) as f64 * 1e-9;
            assert!((got - expect).abs() <= 2e-9 + 1e-6 * expect, "{name}: {got} s for {b} bytes, expected {expect} s");
            moves += 1;
        }
    }
    assert!(moves > 0);
}

/// A scenario of GPT (4 layers, h=1024) on two DGX A100 nodes with `framework` and `plan`.
fn with_framework(framework: &str, plan: &str) -> scenario::Scenario {
    let text = format!(
        r#"{{"workload": {GPT}, "cluster": {{"node": "dgx-a100-80gb", "nodes": 2}},
            "training": {{"global_batch": 64, "micro_batch": 2, "seq_len": 512, "framework": {framework}}},
            "plan": {plan}}}"#
    );
    scenario::parse(&text, &|_| Err("no files".into())).unwrap_or_else(|e| panic!("{e}"))
}

/// Framework behaviours reach the timeline: reducing gradients after backward (Megatron-LM
/// 2021) exposes what DDP's buckets hide, fp32 reduction moves twice the bytes of bf16, and
/// ZeRO-3 without prefetch waits for every gather.
#[test]
fn framework_profiles_change_when_communication_runs() {
    let dp = r#"{"dp": 16}"#;
    let it = |fw: &str, plan: &str| crate::simulate(&with_framework(fw, plan), false).report.iteration_s;
    let overlapped =
        it(r#"{"name": "megatron-lm-2021", "grad_reduce": "overlapped", "grad_reduce_dtype": "params"}"#, dp);
    let after = it(r#"{"name": "megatron-lm-2021", "grad_reduce_dtype": "params"}"#, dp);
    assert!(after > overlapped, "after backward {after} vs overlapped {overlapped}");
    let fp32 = it(r#""megatron-lm-2021""#, dp);
    assert!(fp32 > after, "fp32 reduction {fp32} vs bf16 {after}");
    let z3 = r#"{"dp": 16, "zero_stage": 3}"#;
    let none = it(r#"{"name": "pytorch-fsdp", "gather_prefetch": 0}"#, z3);
    let one = it(r#""pytorch-fsdp""#, z3);
    assert!(none > one, "no prefetch {none} vs one layer {one}");
}

const MOE: &str = r#"{"transformer": {"layers": 4, "hidden": 1024, "heads": 16, "vocab": 32000,
    "moe": {"experts": 8, "top_k": 2, "expert_ffn": 2048}}}"#;

/// Bytes of the collectives labelled `op` whose members include device 0, and their members.
fn collectives_of_device_0(p: &super::Program, op: &str) -> (f64, Vec<Vec<u32>>) {
    let mut bytes = 0.0;
    let mut groups = Vec::new();
    for t in p.tasks.iter().filter(|t| t.kind == super::TaskKind::Collective) {
        let c = &p.collectives[t.payload as usize];
        if p.labels[t.label as usize].op == op && c.members.contains(&0) {
            bytes += c.bytes;
            groups.push(c.members.clone());
        }
    }
    (bytes, groups)
}

/// Under expert parallelism the routed experts' gradients are reduced apart from the rest,
/// over the replicas holding the same experts (every ep-th replica), and not at all when
/// dp = ep; the all-to-alls are one task on the compute streams of the ep replicas of a group.
#[test]
fn expert_gradients_are_reduced_over_the_expert_data_parallel_group() {
    let node = r#"{"preset": "dgx-a100-80gb", "devices": 8}"#;
    for ep in [2u32, 4] {
        let plan = format!(r#"{{"dp": 4, "tp": 2, "ep": {ep}, "sequence_parallel": true}}"#);
        let mut s = scenario(&plan, node, 1, MOE);
        // Every replica lowered: the test reads each one's tasks.
        s.options.symmetry = false;
        let p = super::lower(&s);
        let w = &s.workload.transformer;
        let routed: f64 = (0..w.layers).map(|l| w.routed_expert_parameters_at(l)).sum::<f64>() / 2.0;
        let per_device_expert = routed / ep as f64;
        let (dense, dense_groups) = collectives_of_device_0(&p, "grad_sync");
        let (expert, expert_groups) = collectives_of_device_0(&p, "expert_grad_sync");
        // tp-dp-pp numbering: replica r's tensor rank 0 is device 2r.
        assert!(dense_groups.iter().all(|g| g == &vec![0, 2, 4, 6]), "{dense_groups:?}");
        if ep == 4 {
            assert!(expert_groups.is_empty(), "dp = ep: {expert_groups:?}");
        } else {
            assert!(expert_groups.iter().all(|g| g == &vec![0, 4]), "{expert_groups:?}");
        }
        // Both reductions carry their parameters' gradients at the same bytes per parameter.
        let total = p.static_memory[0].weights / 2.0;
        let expect = if ep == 4 { 0.0 } else { per_device_expert / total };
        let share = expert / (expert + dense);
        assert!((share - expect).abs() <= 1e-9, "ep {ep}: expert share {share}, want {expect}");
        // Each all-to-all task sits on the compute streams of the ep replicas of its group.
        let a2a: Vec<_> = p
            .tasks
            .iter()
            .filter(|t| t.kind == super::TaskKind::Collective && p.labels[t.label as usize].op == "ep_dispatch")
            .collect();
        assert!(!a2a.is_empty());
        for t in a2a {
            assert_eq!(t.streams, ep);
            assert_eq!(p.collectives[t.payload as usize].members.len() as u32, ep);
        }
    }
}

/// DeepSpeed's ZeRO-3 gathers module by module: each layer's gather is its modules' (the
/// attention's two projections, the two GeLU-MLP matrices; the norms, under its persistence
/// threshold, stay gathered), the same bytes but the norms' in four all-gathers where FSDP
/// makes one per layer; the embedding and the head stay one each.
#[test]
fn deepspeed_gathers_each_module_of_a_layer() {
    let z3 = r#"{"dp": 16, "zero_stage": 3}"#;
    let gathers = |fw: &str| {
        let sim = crate::simulate(&with_framework(fw, z3), false);
        collectives_of_device_0(&sim.program, "param_gather")
    };
    let (ds_bytes, ds) = gathers(r#"{"name": "deepspeed", "gather_per_tensor": false}"#);
    let (fsdp_bytes, fsdp) = gathers(r#""pytorch-fsdp""#);
    // The norms' share of a layer (two LayerNorms, 4h of about 12h^2 parameters) is not gathered.
    assert!(ds_bytes < fsdp_bytes && ds_bytes > fsdp_bytes * (1.0 - 1e-3), "{ds_bytes} vs {fsdp_bytes}");
    // FSDP: one gather per layer per pass plus the embedding's and the head's; DeepSpeed: four
    // per layer per pass plus the same two.
    let layer_gathers = (ds.len() - fsdp.len()) / 3;
    assert_eq!(ds.len() - fsdp.len(), 3 * layer_gathers, "{} vs {}", ds.len(), fsdp.len());
    assert!(layer_gathers > 0 && layer_gathers % 4 == 0 && layer_gathers < fsdp.len(), "{layer_gathers}");
}

/// DeepSpeed 2021's gathers (`gather_per_tensor`, on in `deepspeed`): a call per parameter
/// tensor gathered (of a GPT layer's 12 with biases and LayerNorms, the 4 weights: the others
/// are under the persistence threshold and stay gathered), one copy kernel per rank and tensor
/// out of them, issued by the host; the gradients of all 12 are reduced, a call and a copy
/// per rank each; so that a run slows down as the data-parallel group grows where coalesced
/// gathers (`false`) keep most of their speed.
#[test]
fn deepspeed_2021_gathers_cost_a_copy_per_rank_and_tensor() {
    let run = |dp: u32, per_tensor: bool| {
        let text = format!(
            r#"{{"workload": {GPT}, "cluster": {{"node": "dgx-a100-80gb", "nodes": {}}},
                "training": {{"global_batch": {}, "micro_batch": 2, "seq_len": 512,
                              "framework": {{"name": "deepspeed", "gather_per_tensor": {per_tensor}}}}},
                "plan": {{"dp": {dp}, "zero_stage": 3}}}}"#,
            dp / 8,
            2 * dp
        );
        crate::simulate(&scenario::parse(&text, &|_| Err("no files".into())).unwrap(), false)
    };
    let sim = run(16, true);
    let p = &sim.program;
    let layer_copies: Vec<f64> = p
        .tasks
        .iter()
        .filter(|t| t.kind == super::TaskKind::Compute)
        .filter(|t| p.labels[t.label as usize].op == "gather_list_copies" && p.labels[t.label as usize].layer >= 0)
        .map(|t| match p.ops[t.payload as usize].spec.class {
            crate::workload::OpClass::Copies { kernels } => kernels,
            _ => panic!("copies are OpClass::Copies"),
        })
        .collect();
    assert!(!layer_copies.is_empty() && layer_copies.iter().all(|&k| k == 16.0 * 4.0), "{layer_copies:?}");
    // The gradients too: a copy per rank and tensor into each layer's reduce-scatter, which
    // is a call per tensor, for all 12.
    let reduce_copies: Vec<f64> = p
        .tasks
        .iter()
        .filter(|t| t.kind == super::TaskKind::Compute && p.labels[t.label as usize].op == "reduce_list_copies")
        .map(|t| match p.ops[t.payload as usize].spec.class {
            crate::workload::OpClass::Copies { kernels } => kernels,
            _ => panic!("copies are OpClass::Copies"),
        })
        .collect();
    assert_eq!(reduce_copies.len(), layer_copies.len() / 2, "one per layer's backward (gathers: forward and backward)");
    assert!(reduce_copies.iter().all(|&k| k == 16.0 * 12.0), "{reduce_copies:?}");
    let calls_of = |op: &str| -> Vec<u64> {
        p.tasks
            .iter()
            .filter(|t| t.kind == super::TaskKind::Collective && p.labels[t.label as usize].op == op)
            .map(|t| p.collectives[t.payload as usize].calls)
            .collect()
    };
    let reduce_calls = calls_of("grad_sync");
    assert!(!reduce_calls.is_empty() && reduce_calls.iter().all(|&c| c == 12), "{reduce_calls:?}");
    // Each module's gather is one collective of as many calls as the module has tensors
    // gathered: a layer's modules their weight, the embedding and the head their weight and
    // the learned position table.
    // One micro-batch: 4 layers x 4 modules x 2 passes, and the embedding and the head in
    // both passes.
    let calls = calls_of("param_gather");
    let count = |n: u64| calls.iter().filter(|&&c| c == n).count();
    assert!(count(1) == 4 * 4 * 2 && count(2) == 4 && calls.len() == 36, "{calls:?}");
    let slowdown = |dp| run(dp, true).report.iteration_s / run(dp, false).report.iteration_s;
    let (small, large) = (slowdown(16), slowdown(64));
    assert!(small > 1.0 && large > 1.5 * small, "per-tensor over coalesced: {small} at dp 16, {large} at dp 64");
}

/// FSDP2's copy-out (`gather_copy_out`): with ZeRO-3 each gathered unit is copied out on the
/// compute stream before its forward and before its backward, one copy op per unit and pass,
/// moving twice the gathered bytes (read and written), after the gather and before the unit's
/// first op; off by default and without a gather (ZeRO-2), and the step takes longer.
#[test]
fn fsdp2_copies_each_gathered_unit_out_before_it_runs() {
    let z3 = r#"{"dp": 16, "zero_stage": 3}"#;
    let copies = |fw: &str, plan: &str| {
        let sim = crate::simulate(&with_framework(fw, plan), false);
        let p = &sim.program;
        let tasks: Vec<&super::Task> = p
            .tasks
            .iter()
            .filter(|t| t.kind == super::TaskKind::Compute && p.labels[t.label as usize].op == "gather_copy_out")
            .collect();
        let bytes: f64 = tasks.iter().map(|t| p.ops[t.payload as usize].spec.forward_bytes).sum();
        (tasks.len(), bytes, sim.report.iteration_s)
    };
    let on = r#"{"name": "pytorch-fsdp", "gather_copy_out": true}"#;
    let (n0, _, t0) = copies(r#""pytorch-fsdp""#, z3);
    let (n1, bytes, t1) = copies(on, z3);
    assert_eq!(n0, 0, "off by default");
    let sim = crate::simulate(&with_framework(on, z3), false);
    let (gather_bytes, _) = collectives_of_device_0(&sim.program, "param_gather");
    // One copy per gather that moves bytes (a tied head gathers nothing of its own), on each
    // lowered device.
    let p = &sim.program;
    let gathers = p
        .tasks
        .iter()
        .filter(|t| t.kind == super::TaskKind::Collective && p.labels[t.label as usize].op == "param_gather")
        .filter(|t| {
            let c = &p.collectives[t.payload as usize];
            c.members.contains(&0) && c.bytes > 0.0
        })
        .count();
    let devices = p.devices.len();
    assert_eq!(n1, gathers * devices, "{n1} copies for {gathers} gathers on {devices} devices");
    // Each copy waits for a parameter gather.
    let is_gather = |t: u32| {
        let t = &p.tasks[t as usize];
        t.kind == super::TaskKind::Collective && p.labels[t.label as usize].op == "param_gather"
    };
    for (id, t) in p.tasks.iter().enumerate() {
        if t.kind == super::TaskKind::Compute && p.labels[t.label as usize].op == "gather_copy_out" {
            assert!(p.deps.iter().any(|&(a, b)| b == id as u32 && is_gather(a)), "copy {id} waits for no gather");
        }
    }
    // All-gather bytes are the gathered unit's; each copy reads and writes them.
    assert!((bytes / devices as f64 - 2.0 * gather_bytes).abs() / bytes < 1e-9, "{bytes} vs {gather_bytes}");
    assert!(t1 > t0, "copies cost time: {t1} vs {t0}");
    let (n2, _, _) = copies(on, r#"{"dp": 16, "zero_stage": 2}"#);
    assert_eq!(n2, 0, "no gather, no copy");
}

/// Composer's training metrics (`train_metrics`): one op per micro-batch on the device that
/// holds the logits, right after that micro-batch's backward on its compute stream, moving
/// PyTorch's unfused cross-entropy forward (22 bytes per bf16 logit) for each of the two;
/// none by default; the step takes their time longer; under a pipeline only the last stage
/// runs them.
#[test]
fn trainer_metrics_run_after_each_micro_batch_backward() {
    let on = r#"{"name": "pytorch-fsdp", "train_metrics": ["cross_entropy", "perplexity"]}"#;
    let metrics = |sim: &crate::Simulation| -> Vec<u32> {
        let p = &sim.program;
        (0..p.tasks.len() as u32)
            .filter(|&t| {
                let t = &p.tasks[t as usize];
                t.kind == super::TaskKind::Compute && p.labels[t.label as usize].op == "train_metrics"
            })
            .collect()
    };
    let plain = crate::simulate(&with_framework(r#""pytorch-fsdp""#, r#"{"dp": 16}"#), false);
    assert!(metrics(&plain).is_empty(), "none by default");
    let s = with_framework(on, r#"{"dp": 16}"#);
    let sim = crate::simulate(&s, false);
    let p = &sim.program;
    let tasks = metrics(&sim);
    // Two micro-batches of 2 x 512 tokens per replica, on each lowered device.
    let micro_batches = 2;
    assert_eq!(tasks.len(), micro_batches * p.devices.len(), "{tasks:?}");
    let logits = 2.0 * 512.0 * s.workload.transformer.head_classes();
    for &t in &tasks {
        let task = &p.tasks[t as usize];
        assert_eq!(p.ops[task.payload as usize].spec.forward_bytes, 2.0 * 22.0 * logits);
        // It follows its micro-batch's backward on its stream: the task before it is one
        // of it, and none comes after.
        use crate::report::timeline::Phase;
        let stream = &p.streams[task.stream as usize];
        let at = stream.iter().position(|&x| x == t).expect("on its stream");
        let backward_of_mb = |x: &u32| {
            let x = &p.tasks[*x as usize];
            x.micro_batch == task.micro_batch && p.labels[x.label as usize].phase == Phase::Backward
        };
        assert!(backward_of_mb(&stream[at - 1]), "micro-batch {}: not after its backward", task.micro_batch);
        assert!(!stream[at..].iter().any(backward_of_mb), "micro-batch {}: backward after it", task.micro_batch);
    }
    assert!(sim.report.iteration_s > plain.report.iteration_s);
    // Four stages: the last one's devices run them, the others none.
    let piped = crate::simulate(&with_framework(on, r#"{"dp": 4, "pp": 4}"#), false);
    let p = &piped.program;
    let stages: std::collections::BTreeSet<u32> = metrics(&piped)
        .iter()
        .map(|&t| p.stages[super::Program::stream_device(p.tasks[t as usize].stream) as usize])
        .collect();
    assert_eq!(stages.into_iter().collect::<Vec<_>>(), vec![3]);
}

/// PyTorch 2.1's non-reentrant checkpoint stops recomputing once the layer's saved tensors are
/// rebuilt (`recompute_early_stop`, on in `pytorch-fsdp`): the recomputation skips the MLP's
/// down projection (a GEMM, whose saved input exists before it runs) and the residual add after
/// it, and nothing else; off, it reruns the whole layer. With dropout after it, its mask is
/// the last tensor kept, and the down projection reruns.
#[test]
fn early_stopping_recomputation_skips_the_last_gemm() {
    let plan = r#"{"dp": 16, "zero_stage": 3, "recompute": "full"}"#;
    let scenario = |fw: &str, dropout: bool| {
        let text = format!(
            r#"{{"workload": {{"transformer": {{"layers": 4, "hidden": 1024, "heads": 16, "vocab": 32000, "dropout": {dropout}}}}},
                "cluster": {{"node": "dgx-a100-80gb", "nodes": 2}},
                "training": {{"global_batch": 64, "micro_batch": 2, "seq_len": 512, "framework": {fw}}},
                "plan": {plan}}}"#
        );
        scenario::parse(&text, &|_| Err("no files".into())).unwrap_or_else(|e| panic!("{e}"))
    };
    // Layer 0's recomputed ops of micro-batch 0, in order, and the iteration.
    let recomputed = |fw: &str, dropout: bool| {
        let s = scenario(fw, dropout);
        let sim = crate::simulate(&s, false);
        let p = &sim.program;
        let ops: Vec<&str> = p
            .tasks
            .iter()
            .filter(|t| t.kind == super::TaskKind::Compute && t.micro_batch == 0)
            .map(|t| &p.labels[t.label as usize])
            .filter(|l| l.layer == 0 && l.phase == crate::report::timeline::Phase::Recompute)
            .map(|l| l.op)
            .collect();
        let names: Vec<&str> = s
            .workload
            .transformer
            .layer_ops(s.plan.layer_shape())
            .iter()
            .filter_map(|o| o.compute().map(|c| c.name))
            .collect();
        (ops, names, sim.report.iteration_s)
    };
    let off = r#"{"name": "pytorch-fsdp", "recompute_early_stop": false}"#;
    let (full, names, t_full) = recomputed(off, false);
    assert_eq!(full, names, "the whole layer without early stop");
    let (early, _, t_early) = recomputed(r#""pytorch-fsdp""#, false);
    let fc2 = names.iter().position(|n| *n == "fc2").expect("a down projection");
    assert_eq!(early, names[..fc2].to_vec(), "up to the down projection");
    assert!(t_early < t_full, "{t_early} vs {t_full}");
    let (with_dropout, names, _) = recomputed(r#""pytorch-fsdp""#, true);
    let fc2 = names.iter().position(|n| *n == "fc2").expect("a down projection");
    assert!(with_dropout.len() > fc2 && with_dropout.len() < names.len(), "{with_dropout:?} of {names:?}");
    assert_eq!(with_dropout, names[..with_dropout.len()].to_vec());
}

/// Device 0's data-parallel collectives of op `ops` (each label) and its static gradient bytes,
/// for the test GPT under framework `fw` and plan `plan`.
fn data_parallel_traffic(fw: &str, plan: &str, ops: &[&str]) -> (Vec<usize>, f64) {
    let sim = crate::simulate(&with_framework(fw, plan), false);
    let p = &sim.program;
    let count = |op: &str| {
        p.tasks
            .iter()
            .filter(|t| t.kind == super::TaskKind::Collective && p.labels[t.label as usize].op == op)
            .filter(|t| p.collectives[t.payload as usize].members.contains(&0))
            .count()
    };
    (ops.iter().map(|op| count(op)).collect(), p.static_memory[0].gradients)
}

const AFTER_BACKWARD: &str = r#"{"name": "pytorch-fsdp", "grad_reduce": "after_backward"}"#;

/// ZeRO-2 under a framework that reduces after the last micro-batch's backward (PyTorch's
/// pipelining of FSDP2): one gradient reduction per step instead of one per micro-batch, and
/// the whole stage's gradients held until it (not the shard).
#[test]
fn reducing_after_backward_holds_zero2_gradients_whole() {
    let z2 = r#"{"dp": 16, "zero_stage": 2}"#;
    let (per_micro_batch, shard) = data_parallel_traffic(r#""pytorch-fsdp""#, z2, &["grad_sync"]);
    let (once, whole) = data_parallel_traffic(AFTER_BACKWARD, z2, &["grad_sync"]);
    let (per_micro_batch, once) = (per_micro_batch[0], once[0]);
    // Each replica runs two micro-batches (64 sequences over 16 replicas, 2 at a time).
    assert!(per_micro_batch >= 2 * once && once >= 1, "{per_micro_batch} vs {once}");
    assert!((whole / shard - 16.0).abs() < 1e-9, "{whole} vs {shard}");
}

/// ZeRO-3 with gradient sync off until the last micro-batch (FSDP2's
/// `set_requires_gradient_sync(False)` over a gradient-accumulation step): the parameters are
/// still gathered for every micro-batch, the gradients are reduce-scattered only in the last
/// micro-batch's backward, and the whole unsharded gradients are held until then.
#[test]
fn zero3_without_gradient_sync_reduces_once_and_holds_the_gradients() {
    let z3 = r#"{"dp": 16, "zero_stage": 3}"#;
    let ops = ["grad_sync", "param_gather"];
    let (every, shard) = data_parallel_traffic(r#""pytorch-fsdp""#, z3, &ops);
    let (last, whole) = data_parallel_traffic(AFTER_BACKWARD, z3, &ops);
    // Two micro-batches per replica: half the reduce-scatters, as many gathers.
    assert_eq!(every[0], 2 * last[0], "{every:?} vs {last:?}");
    assert!(last[0] >= 1);
    assert!(every[1] > 0 && every[1] == last[1], "{every:?} vs {last:?}");
    assert!((whole / shard - 16.0).abs() < 1e-9, "{whole} vs {shard}");
}

/// Pure 16-bit training (`training.master_weights: false`): Adam keeps its two moments in bf16
/// and no fp32 master copy, 4 bytes a parameter where mixed precision keeps 12; the weights and
/// gradients are unchanged, and the optimizer step moves fewer bytes.
#[test]
fn without_master_weights_the_optimizer_keeps_bf16_moments() {
    let run = |master: bool| {
        let text = format!(
            r#"{{"workload": {GPT}, "cluster": {{"node": "dgx-a100-80gb", "nodes": 1}},
                "training": {{"global_batch": 16, "micro_batch": 2, "seq_len": 512, "precision": "bf16",
                              "optimizer": "adam", "master_weights": {master}}},
                "plan": {{"dp": 8, "zero_stage": 1}}}}"#
        );
        let s = scenario::parse(&text, &|_| Err("no files".into())).unwrap_or_else(|e| panic!("{e}"));
        let sim = crate::simulate(&s, false);
        (sim.program.static_memory[0], sim.report.iteration_s)
    };
    let ((mixed, t_mixed), (pure, t_pure)) = (run(true), run(false));
    assert!((pure.optimizer / mixed.optimizer - 4.0 / 12.0).abs() < 1e-9, "{} vs {}", pure.optimizer, mixed.optimizer);
    assert_eq!((pure.weights, pure.gradients), (mixed.weights, mixed.gradients));
    assert!(t_pure < t_mixed, "{t_pure} vs {t_mixed}");
}

/// Transformer Engine keeps each layer weight's fp8 cast and its transpose through the step
/// (`weight1_fp8`, `weight1_t_fp8`): 2 bytes more a parameter of the device's layers than
/// the 16-bit weights alone; torchao casts at every use and ZeRO-3 gathers transient weights,
/// so neither holds them.
#[test]
fn transformer_engine_holds_fp8_copies_of_the_layer_weights() {
    let weights = |precision: &str, casts: &str, plan: &str| {
        let text = format!(
            r#"{{"workload": {GPT}, "cluster": {{"node": "dgx-h100", "nodes": 1}},
                "training": {{"global_batch": 64, "micro_batch": 2, "seq_len": 512, "precision": "{precision}",
                              "framework": {{"name": "megatron-core", "fp8_casts": "{casts}"}}}},
                "plan": {plan}}}"#
        );
        let s = scenario::parse(&text, &|_| Err("no files".into())).unwrap_or_else(|e| panic!("{e}"));
        (super::lower(&s).static_memory[0].weights, s)
    };
    let plan = r#"{"dp": 4, "tp": 2, "zero_stage": 1}"#;
    let (bf16, s) = weights("bf16", "te", plan);
    let (te, _) = weights("fp8", "te", plan);
    // The layers' parameters on one device: all but the tied embedding (split over tp) and
    // the final norm.
    let w = &s.workload.transformer;
    let layers = (s.workload.parameters() - (w.vocab * w.hidden) as f64 - 2.0 * w.hidden as f64) / 2.0;
    assert!(((te - bf16) / (2.0 * layers) - 1.0).abs() < 0.01, "{} vs {}", te - bf16, 2.0 * layers);
    assert_eq!(weights("fp8", "torchao", plan).0, bf16);
    let z3 = r#"{"dp": 8, "zero_stage": 3}"#;
    assert_eq!(weights("fp8", "te", z3).0, weights("bf16", "te", z3).0);
}
