//! Error messages of the scenario parser: misspelled keys, presets and values get a
//! "did you mean" suggestion; names far from every candidate get none. Also what a
//! calibration profile changes in a scenario.

use super::parse;
use serde_json::{Value, json};

fn base() -> Value {
    json!({
        "workload": {"preset": "gpt3-1.3b"},
        "cluster": {"node": "dgx-a100-80gb", "nodes": 1},
        "training": {"global_batch": 16, "micro_batch": 1, "seq_len": 1024},
        "plan": {"dp": 2, "tp": 2, "pp": 2}
    })
}

/// A change to the base scenario.
type Edit = fn(&mut Value);

/// The error for `base()` changed by `edit`.
fn error(edit: impl Fn(&mut Value)) -> String {
    let mut v = base();
    edit(&mut v);
    match parse(&v.to_string(), &|_| Err("no files".into())) {
        Ok(_) => panic!("accepted: {v}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn the_base_scenario_is_valid() {
    parse(&base().to_string(), &|_| Err("no files".into())).expect("valid");
}

#[test]
fn misspelled_keys_get_a_suggestion_in_every_section() {
    let cases: [(&str, Edit, &str); 6] = [
        ("shedule", |v| v["plan"]["shedule"] = json!("gpipe"), "plan.shedule"),
        ("micro_bach", |v| v["training"]["micro_bach"] = json!(1), "training.micro_bach"),
        ("nodess", |v| v["cluster"]["nodess"] = json!(1), "cluster.nodess"),
        ("tarining", |v| v["tarining"] = json!({}), "tarining"),
        (
            "hiden",
            |v| {
                v["workload"] =
                    json!({"transformer": {"layers": 2, "hidden": 64, "hiden": 64, "heads": 2, "vocab": 10}})
            },
            "workload.transformer.hiden",
        ),
        ("symetry", |v| v["simulation"] = json!({"symetry": false}), "simulation.symetry"),
    ];
    let wanted = ["schedule", "micro_batch", "nodes", "training", "hidden", "symmetry"];
    for ((word, edit, path), want) in cases.into_iter().zip(wanted) {
        let e = error(edit);
        assert!(e.contains(&format!("{path}: unknown key")), "{word}: {e}");
        assert!(e.contains(&format!("did you mean `{want}`?")), "{word}: {e}");
        assert!(e.contains("allowed here:"), "{word}: {e}");
    }
    // Far from every allowed key: no guess.
    let e = error(|v| v["plan"]["colour"] = json!("red"));
    assert!(e.contains("unknown key") && !e.contains("did you mean"), "{e}");
}

#[test]
fn misspelled_presets_get_a_suggestion() {
    let e = error(|v| v["workload"]["preset"] = json!("gpt3-1.3B"));
    assert!(e.contains("workload.preset") && e.contains("did you mean `gpt3-1.3b`?"), "{e}");
    let e = error(|v| v["cluster"]["node"] = json!("dgx-a100-80g"));
    assert!(e.contains("cluster.node") && e.contains("did you mean `dgx-a100-80gb`?"), "{e}");
    let e = error(|v| v["cluster"]["node"] = json!({"preset": "dgx-a100-80gb", "device": "h100-sxn"}));
    assert!(e.contains("cluster.node.device") && e.contains("did you mean `h100-sxm`?"), "{e}");
    let e = error(|v| v["cluster"]["inter_node"] = json!("ib-ndr2"));
    assert!(e.contains("cluster.inter_node") && e.contains("did you mean `ib-ndr`?"), "{e}");
    let e = error(|v| v["workload"]["preset"] = json!("my-own-model"));
    assert!(e.contains("is not a workload preset") && !e.contains("did you mean"), "{e}");
}

#[test]
fn misspelled_values_get_a_suggestion() {
    let cases: [(Edit, &str, &str); 7] = [
        (|v| v["plan"]["schedule"] = json!("1f1v"), "plan.schedule", "1f1b"),
        (|v| v["plan"]["recompute"] = json!("ful"), "plan.recompute", "full"),
        (|v| v["training"]["precision"] = json!("bf61"), "training.precision", "bf16"),
        (|v| v["plan"]["tp_mode"] = json!("2.5"), "plan.tp_mode", "2.5d"),
        (|v| v["plan"]["offload"] = json!("zero_offload"), "plan.offload", "zero-offload"),
        (|v| v["plan"]["partition"] = json!("balance"), "plan.partition", "balanced"),
        (|v| v["simulation"] = json!({"network": "fiar"}), "simulation.network", "fair"),
    ];
    for (edit, path, want) in cases {
        let e = error(edit);
        assert!(e.contains(path) && e.contains(&format!("did you mean `{want}`?")), "{path}: {e}");
    }
}

/// A framework is a name from the list or an object naming one; a near miss gets a suggestion,
/// and an unknown knob is refused with its path.
#[test]
fn frameworks_are_checked_where_they_are_read() {
    let e = error(|v| v["training"]["framework"] = json!("megatron-cor"));
    assert!(e.contains("training.framework") && e.contains("did you mean `megatron-core`"), "{e}");
    let e = error(|v| v["training"]["framework"] = json!({"name": "deepspeed", "prefetch": 2}));
    assert!(e.contains("training.framework.prefetch"), "{e}");
    let e = error(|v| v["training"]["framework"] = json!({"grad_reduce": "overlapped"}));
    assert!(e.contains("training.framework.name"), "{e}");
    let mut v = base();
    v["training"]["framework"] = json!({"name": "megatron-lm-2021", "grad_reduce_dtype": "params"});
    let s = parse(&v.to_string(), &|_| Err("no files".into())).expect("valid");
    assert_eq!(s.plan.framework.name, "megatron-lm-2021");
    assert_eq!(s.plan.framework.grad_reduce, crate::framework::GradReduce::AfterBackward);
    assert_eq!(s.plan.framework.grad_reduce_dtype, crate::framework::ReduceDtype::Params);
    // DeepSpeed's pipeline engine reduces after its schedule (base() has pp = 2), listed in
    // `defaults_applied`; a scenario that says otherwise, or a plan without a pipeline, keeps
    // the profile's overlap.
    let deepspeed = |framework: serde_json::Value, pp: u32| {
        let mut v = base();
        v["training"]["framework"] = framework;
        v["plan"] = json!({"dp": 8 / pp, "pp": pp});
        parse(&v.to_string(), &|_| Err("no files".into())).expect("valid")
    };
    use crate::framework::GradReduce;
    let s = deepspeed(json!("deepspeed"), 2);
    assert_eq!(s.plan.framework.grad_reduce, GradReduce::AfterBackward);
    assert!(s.defaults_applied.iter().any(|d| d.contains("grad_reduce = after_backward")), "{:?}", s.defaults_applied);
    let s = deepspeed(json!({"name": "deepspeed", "grad_reduce": "overlapped"}), 2);
    assert_eq!(s.plan.framework.grad_reduce, GradReduce::Overlapped);
    // Without a pipeline, below ZeRO-3, DeepSpeed reduces on the compute stream
    // (`overlap_comm` off by default); under ZeRO-3 it overlaps.
    let s = deepspeed(json!("deepspeed"), 1);
    assert_eq!(s.plan.framework.grad_reduce, GradReduce::Blocking);
    assert!(s.defaults_applied.iter().any(|d| d.contains("grad_reduce = blocking")), "{:?}", s.defaults_applied);
    let mut v = base();
    v["training"]["framework"] = json!("deepspeed");
    v["plan"] = json!({"dp": 8, "zero_stage": 3});
    let s = parse(&v.to_string(), &|_| Err("no files".into())).expect("valid");
    assert_eq!(s.plan.framework.grad_reduce, GradReduce::Overlapped);
    let s = deepspeed(json!({"name": "deepspeed", "grad_reduce": "overlapped"}), 1);
    assert_eq!(s.plan.framework.grad_reduce, GradReduce::Overlapped);
    assert_eq!(deepspeed(json!("megatron-core"), 2).plan.framework.grad_reduce, GradReduce::Overlapped);
    // DeepSpeed's pipeline engine refuses ZeRO-2 and 3; other frameworks take them.
    let e = error(|v| {
        v["training"]["framework"] = json!("deepspeed");
        v["plan"] = json!({"dp": 4, "pp": 2, "zero_stage": 2});
    });
    assert!(e.contains("plan.zero_stage") && e.contains("pipeline") && e.contains("zero_stage 0 to 1"), "{e}");
    let mut v = base();
    v["plan"] = json!({"dp": 4, "pp": 2, "zero_stage": 2});
    parse(&v.to_string(), &|_| Err("no files".into())).expect("megatron-core runs ZeRO-2 with a pipeline");
    // Megatron-Core's interleaved schedule overlaps its pipeline sends (its
    // --overlap-p2p-communication); 1F1B and Megatron-LM of 2021 block; a given p2p stays.
    use crate::plan::P2p;
    let p2p = |framework: &str, schedule: &str, given: Option<&str>| {
        let mut v = base();
        v["training"]["framework"] = json!(framework);
        v["training"]["global_batch"] = json!(32);
        v["plan"] = json!({"dp": 2, "tp": 2, "pp": 2, "schedule": schedule});
        if schedule == "interleaved" {
            v["plan"]["virtual_stages"] = json!(2);
        }
        if let Some(g) = given {
            v["plan"]["p2p"] = json!(g);
        }
        let s = parse(&v.to_string(), &|_| Err("no files".into())).expect("valid");
        let noted = s.defaults_applied.iter().any(|d| d.starts_with("plan.p2p = "));
        assert_eq!(noted, given.is_none(), "{:?}", s.defaults_applied);
        s.plan.p2p
    };
    assert_eq!(p2p("megatron-core", "interleaved", None), P2p::Overlapped);
    assert_eq!(p2p("megatron-core", "interleaved", Some("blocking")), P2p::Blocking);
    assert_eq!(p2p("megatron-core", "1f1b", None), P2p::Blocking);
    assert_eq!(p2p("megatron-lm-2021", "interleaved", None), P2p::Blocking);
    // Megatron reduces gradients in fp32 under bf16 only: fp16 training reduces in fp16
    // unless the scenario asks for fp32.
    use crate::framework::ReduceDtype;
    let dtype = |framework: serde_json::Value, precision: &str| {
        let mut v = base();
        v["training"]["framework"] = framework;
        v["training"]["precision"] = json!(precision);
        let s = parse(&v.to_string(), &|_| Err("no files".into())).expect("valid");
        let noted = s.defaults_applied.iter().any(|d| d.contains("grad_reduce_dtype = params"));
        (s.plan.framework.grad_reduce_dtype, noted)
    };
    assert_eq!(dtype(json!("megatron-lm-2021"), "fp16"), (ReduceDtype::Params, true));
    assert_eq!(dtype(json!("megatron-core"), "fp16"), (ReduceDtype::Params, true));
    assert_eq!(dtype(json!("megatron-core"), "bf16"), (ReduceDtype::Fp32, false));
    assert_eq!(
        dtype(json!({"name": "megatron-lm-2021", "grad_reduce_dtype": "fp32"}), "fp16"),
        (ReduceDtype::Fp32, false)
    );
    // Training metrics: a list of known names, each once.
    let metrics = |m: serde_json::Value| {
        move |v: &mut serde_json::Value| {
            v["training"]["framework"] = json!({"name": "pytorch-fsdp", "train_metrics": m})
        }
    };
    let e = error(metrics(json!("cross_entropy")));
    assert!(e.contains("training.framework.train_metrics") && e.contains("a list of metric names"), "{e}");
    let e = error(metrics(json!(["cross_entropy", "perplexty"])));
    assert!(e.contains("train_metrics[1]") && e.contains("did you mean `perplexity`"), "{e}");
    let e = error(metrics(json!(["perplexity", "perplexity"])));
    assert!(e.contains("train_metrics[1]") && e.contains("twice"), "{e}");
    let mut v = base();
    metrics(json!(["cross_entropy", "token_accuracy"]))(&mut v);
    let s = parse(&v.to_string(), &|_| Err("no files".into())).expect("valid");
    use crate::framework::TrainMetric;
    assert_eq!(s.plan.framework.train_metrics, vec![TrainMetric::CrossEntropy, TrainMetric::TokenAccuracy]);
    // Early-stopping recomputation: PyTorch FSDP's by default, a boolean knob elsewhere.
    assert!(s.plan.framework.recompute_early_stop, "pytorch-fsdp stops early");
    let e = error(|v| v["training"]["framework"] = json!({"name": "deepspeed", "recompute_early_stop": "yes"}));
    assert!(e.contains("training.framework.recompute_early_stop"), "{e}");
    let mut v = base();
    v["training"]["framework"] = json!({"name": "megatron-core"});
    let s = parse(&v.to_string(), &|_| Err("no files".into())).expect("valid");
    assert!(!s.plan.framework.recompute_early_stop, "Megatron's checkpoint reruns whole layers");
    v["training"]["framework"] = json!({"name": "megatron-core", "recompute_early_stop": true});
    let s = parse(&v.to_string(), &|_| Err("no files".into())).expect("valid");
    assert!(s.plan.framework.recompute_early_stop);
    assert_eq!(s.plan.framework.fp8_casts, crate::framework::Fp8Casts::Te, "Transformer Engine's casts by default");
    v["training"]["framework"] = json!({"name": "pytorch-fsdp", "fp8_casts": "torchao"});
    let s = parse(&v.to_string(), &|_| Err("no files".into())).expect("valid");
    assert_eq!(s.plan.framework.fp8_casts, crate::framework::Fp8Casts::Torchao);
    let e = error(|v| v["training"]["framework"] = json!({"name": "pytorch-fsdp", "fp8_casts": "torchaoo"}));
    assert!(e.contains("training.framework.fp8_casts") && e.contains("torchao"), "{e}");
}

/// FlashAttention-3 exists for Hopper only: named on an A100 it is refused, on an H100 run.
#[test]
fn flash3_needs_a_hopper_gpu() {
    let e = error(|v| v["training"]["attention"] = json!("flash3"));
    assert!(e.contains("training.attention") && e.contains("Hopper"), "{e}");
    let mut v = base();
    v["training"]["attention"] = json!("flash3");
    v["cluster"]["node"] = json!("dgx-h100");
    parse(&v.to_string(), &|_| Err("no files".into())).expect("flash3 on H100");
}

/// The expected maximum of N standard normal draws against tabulated order statistics
/// (Harter 1961): 0.5642 (2), 1.5388 (10), 2.5076 (100), 3.2414 (1000).
#[test]
fn expected_maximum_of_normal_draws() {
    let table = [(1u64, 0.0), (2, 0.5642), (10, 1.5388), (100, 2.5076), (1000, 3.2414)];
    // Twice, the second time in reverse order: the kept values answer for their own n.
    for (n, want) in table.into_iter().chain(table.into_iter().rev()) {
        let got = super::expected_max_std_normal(n);
        assert!((got - want).abs() < 1e-3, "n = {n}: {got} vs {want}");
    }
}

/// A calibration profile's measured kernel spread becomes the scenario's kernel jitter, with a
/// note, in place of the GPU default (no longer listed among the defaults); a spread the
/// scenario gives is kept; a profile without one changes nothing: the GPU default stands; a
/// GPU profile's spread timed right after a warm-up (before session 40) leaves the default.
#[test]
fn a_profile_s_kernel_spread_is_the_kernel_jitter_unless_given() {
    let rates = |kernel_jitter| super::MeasuredRates {
        gemm_flops_per_s: 1e12,
        mem_bytes_per_s: 1e11,
        launch_s: 1e-6,
        link_bytes_per_s: None,
        link_latency_s: None,
        memory_op_bytes_per_s: Vec::new(),
        kernel_jitter,
        kernel_jitter_settled_s: None,
        gemm_element_bytes: None,
        device: "cpu thread 0".into(),
        device_kind: crate::hardware::DeviceKind::Cpu,
    };
    let listed = |s: &super::Scenario| s.defaults_applied.iter().any(|d| d.starts_with("simulation.kernel_jitter = "));
    let mut s = parse(&base().to_string(), &|_| Err("no files".into())).expect("valid");
    assert!(listed(&s), "{:?}", s.defaults_applied);
    s.calibrate(&rates(Some(0.02)));
    assert_eq!(s.options.kernel_jitter, Some(0.02));
    assert_eq!(s.options.kernel_jitter(&s.cluster), 0.02);
    assert!(!listed(&s), "{:?}", s.defaults_applied);
    assert!(s.notes.iter().any(|n| n.contains("simulation.kernel_jitter = 0.0200")), "{:?}", s.notes);
    let mut given = base();
    given["simulation"] = json!({"kernel_jitter": 0.05});
    let mut s = parse(&given.to_string(), &|_| Err("no files".into())).expect("valid");
    s.calibrate(&rates(Some(0.02)));
    assert_eq!(s.options.kernel_jitter, Some(0.05));
    assert!(!listed(&s), "{:?}", s.defaults_applied);
    let mut s = parse(&base().to_string(), &|_| Err("no files".into())).expect("valid");
    s.calibrate(&rates(None));
    assert_eq!(s.options.kernel_jitter, None);
    assert_eq!(s.options.kernel_jitter(&s.cluster), super::options::DEFAULT_GPU_KERNEL_JITTER);
    assert!(listed(&s), "{:?}", s.defaults_applied);
    // A GPU's spread counts only when timed after the GPU settled at its power limit.
    let gpu = |settled: Option<f64>| super::MeasuredRates {
        device: "cuda:0".into(),
        device_kind: crate::hardware::DeviceKind::Gpu,
        kernel_jitter_settled_s: settled,
        ..rates(Some(0.035))
    };
    for cold in [None, Some(0.0)] {
        let mut s = parse(&base().to_string(), &|_| Err("no files".into())).expect("valid");
        s.calibrate(&gpu(cold));
        assert_eq!(s.options.kernel_jitter, None, "{cold:?}");
        assert!(listed(&s), "{:?}", s.defaults_applied);
        assert!(s.notes.iter().any(|n| n.contains("timed right after a warm-up")), "{:?}", s.notes);
    }
    let mut s = parse(&base().to_string(), &|_| Err("no files".into())).expect("valid");
    s.calibrate(&gpu(Some(15.0)));
    assert_eq!(s.options.kernel_jitter, Some(0.035));
    assert!(!listed(&s), "{:?}", s.defaults_applied);
}

/// A GPU profile's GEMM rate applies only to training at the precision it was measured in: a
/// bf16 profile calibrates a bf16 scenario's GEMM efficiency, leaves an fp32 or fp8 scenario's
/// at the preset's with a note, and a profile that does not say (before session 18) counts as
/// fp32. A CPU profile applies at any precision (a CPU computes in f32).
#[test]
fn a_profile_s_gemm_rate_applies_only_at_its_precision() {
    let rates = |bytes: Option<f64>| super::MeasuredRates {
        gemm_flops_per_s: 250e12,
        mem_bytes_per_s: 1.8e12,
        launch_s: 5e-6,
        link_bytes_per_s: None,
        link_latency_s: None,
        memory_op_bytes_per_s: Vec::new(),
        kernel_jitter: None,
        kernel_jitter_settled_s: None,
        gemm_element_bytes: bytes,
        device: "cuda:0 (NVIDIA A100-SXM4-80GB, sm_80, 79 GiB)".into(),
        device_kind: crate::hardware::DeviceKind::Gpu,
    };
    let scenario = |precision: &str| {
        let mut v = base();
        v["training"]["precision"] = json!(precision);
        parse(&v.to_string(), &|_| Err("no files".into())).expect("valid")
    };
    let preset = scenario("bf16").cluster.node.device.gemm_efficiency;
    let mut s = scenario("bf16");
    s.calibrate(&rates(Some(2.0)));
    let applied = s.cluster.node.device.gemm_efficiency;
    assert!((applied - 250e12 / 312e12).abs() < 1e-9, "bf16 profile on bf16: {applied}");
    for (precision, bytes) in [("fp32", Some(2.0)), ("bf16", None), ("bf16", Some(4.0))] {
        let mut s = scenario(precision);
        s.calibrate(&rates(bytes));
        assert_eq!(s.cluster.node.device.gemm_efficiency, preset, "{precision} with {bytes:?}");
        assert!(s.notes.iter().any(|n| n.contains("GEMM efficiency is kept")), "{precision}: {:?}", s.notes);
        // The memory rate applies whatever the precision.
        assert!((s.cluster.node.device.mem_efficiency - 1.8e12 / 2039e9).abs() < 1e-9);
    }
    // A CPU profile (f32 whatever the precision) applies to a bf16 scenario.
    let mut s = scenario("bf16");
    let mut cpu = rates(None);
    cpu.device_kind = crate::hardware::DeviceKind::Cpu;
    s.calibrate(&cpu);
    assert_eq!(s.cluster.node.device.gemm_efficiency, applied);
    // An fp8 profile on an fp8 scenario sets the fp8 GEMMs' efficiency and leaves the
    // 16-bit one (attention, the output layer) at the preset's.
    let mut v = base();
    v["cluster"]["node"] = json!("dgx-h100");
    v["training"]["precision"] = json!("fp8");
    let mut s = parse(&v.to_string(), &|_| Err("no files".into())).expect("valid");
    let sixteen = s.cluster.node.device.gemm_efficiency;
    let mut fp8 = rates(Some(1.0));
    fp8.gemm_flops_per_s = 1200e12;
    fp8.device = "cuda:0 (NVIDIA H100 80GB HBM3, sm_90, 79 GiB)".into();
    s.calibrate(&fp8);
    let d = &s.cluster.node.device;
    assert_eq!(d.gemm_efficiency, sixteen);
    assert!((d.fp8_gemm_efficiency.expect("set") - 1200e12 / 1978.9e12).abs() < 1e-9, "{d:?}");
}

/// FlashAttention has no V100 kernel: on a cluster of V100s the framework's default "flash"
/// and an explicit one both run materialised, and `defaults_applied` says why; A100s keep it.
#[test]
fn fused_attention_falls_back_to_materialised_on_v100s() {
    use crate::hardware::kernels::Attention;
    let run = |node: &str, attention: Option<&str>| {
        let mut v = base();
        v["cluster"]["node"] = json!(node);
        if let Some(a) = attention {
            v["training"]["attention"] = json!(a);
        }
        parse(&v.to_string(), &|_| Err("no files".into())).expect("valid")
    };
    let v100 = run("p3.16xlarge", None);
    assert_eq!(v100.plan.attention, Attention::Naive);
    let said: Vec<&String> = v100.defaults_applied.iter().filter(|d| d.starts_with("training.attention")).collect();
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(said[0].contains("megatron-core's \"te\" has no kernel for V100s"), "{}", said[0]);
    let asked = run("p3.16xlarge", Some("flash2"));
    assert_eq!(asked.plan.attention, Attention::Naive);
    assert!(
        asked.defaults_applied.iter().any(|d| d.contains("\"flash2\" was asked for")),
        "{:?}",
        asked.defaults_applied
    );
    assert!(run("dgx-a100-80gb", None).plan.attention.is_fused());
}

/// `plan.recompute_modules`: Megatron-Core's module names under selective recomputation only,
/// each once; `["core_attn"]` by default.
#[test]
fn recompute_modules_are_checked() {
    let with = |recompute: &'static str, modules: Value| {
        move |v: &mut Value| {
            v["plan"]["recompute"] = json!(recompute);
            v["plan"]["recompute_modules"] = modules.clone();
        }
    };
    let e = error(with("full", json!(["moe"])));
    assert!(e.contains("plan.recompute_modules") && e.contains("selective"), "{e}");
    let e = error(with("selective", json!(["core_attn", "layernorms"])));
    assert!(e.contains("plan.recompute_modules[1]") && e.contains("did you mean `layernorm`"), "{e}");
    let e = error(with("selective", json!(["mlp", "mlp"])));
    assert!(e.contains("plan.recompute_modules[1]") && e.contains("twice"), "{e}");
    let e = error(with("selective", json!("mlp")));
    assert!(e.contains("plan.recompute_modules") && e.contains("list"), "{e}");
    let s = parse(&base().to_string(), &|_| Err("no files".into())).expect("valid");
    assert_eq!(s.plan.recompute_modules.names(), ["core_attn"]);
    let mut v = base();
    with("selective", json!(["layernorm", "mla_up_proj"]))(&mut v);
    let s = parse(&v.to_string(), &|_| Err("no files".into())).expect("valid");
    assert_eq!(s.plan.recompute_modules.names(), ["layernorm", "mla_up_proj"]);
    let e = error(with("selective", json!(["op_sac", "mlp"])));
    assert!(e.contains("plan.recompute_modules") && e.contains("alone"), "{e}");
    let mut v = base();
    with("selective", json!(["op_sac"]))(&mut v);
    let s = parse(&v.to_string(), &|_| Err("no files".into())).expect("valid");
    assert_eq!(s.plan.recompute_modules.names(), ["op_sac"]);
}

/// `plan.recompute_layers` applies to full recomputation, at most the model's layers, and is
/// refused where a model assumes every layer recomputes alike (token slicing, a computed
/// partition).
#[test]
fn recompute_layers_are_checked() {
    let e = error(|v| v["plan"]["recompute_layers"] = json!(4));
    assert!(e.contains("plan.recompute_layers") && e.contains("full recomputation only"), "{e}");
    let full = |n: Value| {
        move |v: &mut Value| {
            v["plan"]["recompute"] = json!("full");
            v["plan"]["recompute_layers"] = n.clone();
        }
    };
    let e = error(full(json!(0)));
    assert!(e.contains("plan.recompute_layers") && e.contains("positive integer"), "{e}");
    let e = error(full(json!(25)));
    assert!(e.contains("more than the workload's 24 layers"), "{e}");
    let e = error(|v| {
        full(json!(2))(v);
        v["plan"]["partition"] = json!("balanced");
    });
    assert!(e.contains("computed partition"), "{e}");
    let mut v = base();
    full(json!(3))(&mut v);
    let s = parse(&v.to_string(), &|_| Err("no files".into())).expect("valid");
    assert_eq!(s.plan.recompute_layers, Some(3));
    // The first 3 layers of each of the two stages' 12.
    let recomputes: Vec<u32> = (0..24).filter(|&l| s.plan.layer_recompute(l) == crate::plan::Recompute::Full).collect();
    assert_eq!(recomputes, [0, 1, 2, 12, 13, 14]);
}

/// `plan.dp_shard` divides the data-parallel group, needs ZeRO, shards over at least two
/// replicas, takes ZeRO-Offload but not Gemini's dynamic placement, and equal to the group is
/// the same as absent.
#[test]
fn dp_shard_is_checked() {
    let with = |shard: u32, zero: u8| {
        move |v: &mut Value| {
            v["plan"] = json!({"dp": 8, "zero_stage": zero, "dp_shard": shard});
            v["training"]["global_batch"] = json!(16);
        }
    };
    let e = error(with(3, 3));
    assert!(e.contains("plan.dp_shard") && e.contains("does not divide dp = 8"), "{e}");
    let e = error(with(4, 0));
    assert!(e.contains("plan.dp_shard") && e.contains("zero_stage 1 to 3"), "{e}");
    let e = error(with(1, 2));
    assert!(e.contains("plan.dp_shard") && e.contains("shards nothing"), "{e}");
    let e = error(|v| {
        with(4, 2)(v);
        v["plan"]["offload"] = json!("gemini");
    });
    assert!(e.contains("plan.dp_shard") && e.contains("Gemini's dynamic placement"), "{e}");
    let mut v = base();
    with(4, 2)(&mut v);
    v["plan"]["offload"] = json!("zero-offload");
    parse(&v.to_string(), &|_| Err("no files".into())).expect("hybrid sharding with ZeRO-Offload");
    // Expert parallelism: whole expert-parallel groups in each shard group.
    let e = error(|v| {
        with(2, 1)(v);
        v["plan"]["ep"] = json!(4);
        v["workload"] = json!({"transformer": {"layers": 2, "hidden": 256, "heads": 4, "vocab": 1000,
            "moe": {"experts": 8, "top_k": 2, "expert_ffn": 512}}});
    });
    assert!(e.contains("plan.dp_shard") && e.contains("a multiple of 4"), "{e}");
    let mut v = base();
    with(4, 2)(&mut v);
    let s = parse(&v.to_string(), &|_| Err("no files".into())).expect("valid");
    assert_eq!((s.plan.shard_degree(), s.plan.hybrid_shard()), (4, true));
    assert_eq!(s.plan.shard_members(5, 0, 0), [4, 5, 6, 7]);
    assert_eq!(s.plan.replicate_members(5, 0, 0), [1, 5]);
    with(8, 2)(&mut v);
    let s = parse(&v.to_string(), &|_| Err("no files".into())).expect("valid");
    assert_eq!((s.plan.dp_shard, s.plan.hybrid_shard()), (None, false));
}

/// A preset GPU renamed without a model number keeps the preset's in brackets, so the kernel
/// model and NCCL still know it as the part it is; a name with one is taken as it stands.
#[test]
fn a_renamed_gpu_keeps_its_generation() {
    let device = |name: &str| {
        let mut v = base();
        v["cluster"]["node"] = json!({"preset": "dgx-h100", "device": {"preset": "h100-sxm", "name": name}});
        let s = parse(&v.to_string(), &|_| Err("no files".into())).expect("valid");
        s.cluster.node.device.name.clone()
    };
    assert_eq!(device("our training GPU"), "our training GPU (h100-sxm)");
    assert_eq!(device("NVIDIA H800"), "NVIDIA H800");
    let arch = |name: &str| {
        let d =
            crate::hardware::DeviceSpec { name: device(name), ..crate::hardware::catalog::device("h100-sxm").unwrap() };
        crate::hardware::kernels::arch_of(&d)
    };
    assert_eq!(arch("our training GPU"), Some(crate::hardware::kernels::GpuArch::Hopper));
    // A link likewise: NCCL's NVLink latencies, LL128 and NVLS follow the word NVLink.
    let mut v = base();
    v["cluster"]["node"] = json!({"preset": "dgx-h100", "intra_node": {"preset": "nvlink4", "name": "H800 fabric"}});
    let s = parse(&v.to_string(), &|_| Err("no files".into())).expect("valid");
    let link = s.cluster.node.intra_node.as_ref().expect("link");
    assert_eq!(link.name, "H800 fabric (nvlink4)");
    assert!(crate::hardware::nccl::NcclSystem::new(&s.cluster).expect("nvidia").nvls);
}

/// A power limit needs the rated power it scales from, and must leave some above the idle
/// draw; the presets carry their rating.
#[test]
fn power_limits_are_checked() {
    let e = error(|v| {
        v["cluster"]["node"] = json!({"preset": "dgx-a100-80gb",
            "device": {"peak_flops": 1e14, "hbm_bytes": 1e10, "mem_bandwidth_bytes_per_s": 1e12, "power_limit_w": 300}})
    });
    assert!(e.contains("power_limit_w") && e.contains("rated_power_w"), "{e}");
    let e = error(|v| {
        v["cluster"]["node"] = json!({"preset": "dgx-h100", "device": {"preset": "h100-sxm", "power_limit_w": 50}})
    });
    assert!(e.contains("idle draw (72 W)"), "{e}");
    let e = error(|v| {
        v["cluster"]["node"] = json!({"preset": "dgx-h100", "device": {"preset": "host-cpu", "rated_power_w": 300}})
    });
    assert!(e.contains("GPUs only"), "{e}");
    let mut v = base();
    v["cluster"]["node"] = json!({"preset": "dgx-h100", "device": {"preset": "h100-sxm", "power_limit_w": 500}});
    let s = parse(&v.to_string(), &|_| Err("no files".into())).expect("valid");
    let p = s.cluster.node.device.power.expect("power");
    assert_eq!((p.rated_w, p.limit_w), (700.0, 500.0));
    assert!(s.notes.iter().any(|n| n.contains("500 W limit")), "{:?}", s.notes);
}

/// `cluster.nccl.version` and `runtime_connect` are read with the key named in each refusal.
#[test]
fn nccl_release_and_runtime_connect_are_read_and_checked() {
    let with = |nccl: Value| {
        let mut v = base();
        v["cluster"]["nccl"] = nccl;
        parse(&v.to_string(), &|_| Err("no files".into()))
    };
    let s = with(json!({"version": "2.19.4"})).expect("valid");
    assert!(s.cluster.nccl.connects_at_creation());
    assert_eq!(s.cluster.nccl.version.as_deref(), Some("2.19.4"));
    assert!(!with(json!({"algo": "ring"})).expect("valid").cluster.nccl.connects_at_creation());
    assert!(with(json!({"runtime_connect": false})).expect("valid").cluster.nccl.connects_at_creation());
    for (nccl, key) in [
        (json!({"version": "two"}), "cluster.nccl.version"),
        (json!({"version": "2.19", "runtime_connect": true}), "cluster.nccl.runtime_connect"),
        (json!({"runtime_connect": "no"}), "cluster.nccl.runtime_connect"),
    ] {
        let e = with(nccl.clone()).expect_err("refused").to_string();
        assert!(e.contains(key), "{nccl}: {e}");
    }
}
