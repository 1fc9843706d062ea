//! Workload models against published numbers: preset sizes, GPT layer FLOPs, the activation
//! memory formulas of Korthikanti et al. 2022, the model-FLOPs count, and the Hugging Face
//! `config.json` reader (fixtures in `tests/data`).

use crate::util::{self, TempDir, assert_close, close, num, run, stderr};
use rand::{RngExt, SeedableRng};
use rand_pcg::Pcg64Mcg;
use serde_json::json;
use sim::plan::Recompute;
use sim::workload::transformer::TransformerConfig;
use sim::workload::{LayerOp, LayerShape, OpClass, TpMode};
use std::path::Path;

/// Presets whose `published_parameters` is the paper's rounded size label rather than a count.
const ROUNDED_LABELS: [&str; 4] = ["gpt3-1.3b", "gpt3-2.7b", "gpt3-1b", "bert-large"];

/// Presets (those in `names`, or all but them) more than 1% off their published size.
fn presets_off_published(names: &[&str], listed: bool) -> Vec<String> {
    let presets = sim::workload::catalog::presets();
    assert!(presets.len() >= 10, "only {} workload presets", presets.len());
    presets
        .iter()
        .filter(|p| names.contains(&p.name) == listed)
        .filter(|p| !close(p.config.parameters(), p.published_parameters, 0.01))
        .map(|p| format!("{}: {:.4e} vs published {:.4e}", p.name, p.config.parameters(), p.published_parameters))
        .collect()
}

#[test]
fn presets_match_published_parameter_counts() {
    let off = presets_off_published(&ROUNDED_LABELS, false);
    assert!(off.is_empty(), "presets more than 1% off their published size:\n{}", off.join("\n"));
}

/// The GPT-3 paper states these sizes to two significant digits ("1.3B", "2.7B"): the
/// architectures it gives count 1.316e9 and 2.652e9, inside the stated precision (half a unit
/// of the last digit) though more than 1% from the label; BERT-large's "340M" likewise.
/// Mixture-of-experts presets: total and active (per-token) parameters within 1% of the
/// published figures (Mixtral 8x7B 46.7B / 12.9B, DeepSeek-V3 671B / 37B, ...), and the MFU
/// numerator counts the active ones.
#[test]
fn moe_presets_match_published_total_and_active_parameters() {
    let moe: Vec<_> = sim::workload::catalog::presets().into_iter().filter(|p| p.config.moe.is_some()).collect();
    let names: Vec<_> = moe.iter().map(|p| p.name).collect();
    for must in ["mixtral-8x7b", "mixtral-8x22b", "deepseek-v3", "qwen3-30b-a3b", "qwen3-235b-a22b"] {
        assert!(names.contains(&must), "{must} missing from {names:?}");
    }
    for p in &moe {
        let (total, active) = (p.config.parameters(), p.config.active_parameters());
        let published = p.published_active_parameters.expect("an MoE preset states its active parameters");
        assert!(
            close(total, p.published_parameters, 0.01),
            "{}: {total:.4e} vs {:.4e}",
            p.name,
            p.published_parameters
        );
        // Two active counts are labels cut to two digits: DeepSeek-V3's "37B activated" (its
        // layers give 37.55B counted as its 671B total is, embedding and output head included,
        // as Mixtral's 12.9B is) and Qwen3-30B-A3B's "3.3B" (3.353B).
        let tolerance = if ["deepseek-v3", "qwen3-30b-a3b"].contains(&p.name) { 0.02 } else { 0.01 };
        assert!(close(active, published, tolerance), "{}: active {active:.4e} vs {published:.4e}", p.name);
        assert!(active < total / 2.0, "{}: active {active:.3e} of {total:.3e}", p.name);
        // 6 x active parameters per token (plus attention): far below 6 x total.
        let per_token = p.config.model_flops_per_sample(1);
        assert!(
            per_token < 6.0 * total / 2.0
                && per_token >= 6.0 * (active - p.config.vocab as f64 * p.config.hidden as f64) * 0.99
        );
    }
}

/// A mixture-of-experts layer's expert GEMMs do `top_k` dense MLPs' worth of work per token
/// (Mixtral: two SwiGLU experts of three matrices), split over tensor parallelism; a capacity
/// factor pads every expert to its share of it.
#[test]
fn expert_gemms_do_top_k_mlps_of_work_per_token() {
    let cfg = sim::workload::catalog::workload("mixtral-8x7b").unwrap().transformer;
    let (h, f) = (cfg.hidden as f64, 14336.0);
    for (t, cf) in [(1, 0.0), (4, 0.0), (2, 1.25)] {
        let mut c = cfg.clone();
        c.moe.as_mut().unwrap().capacity_factor = cf;
        let sh = shape(2, 1024, t, t > 1);
        let flops: f64 = c
            .layer_ops(sh)
            .iter()
            .filter_map(LayerOp::compute)
            .filter(|op| op.name.starts_with("expert_") && matches!(op.class, OpClass::Gemm { .. }))
            .map(|op| op.forward_flops)
            .sum();
        let want = 2.0 * 2048.0 * 2.0 * 3.0 * h * f / t as f64 * if cf > 0.0 { cf } else { 1.0 };
        assert!((flops - want).abs() <= 1e-9 * want, "tp {t} cf {cf}: {flops:e} vs {want:e}");
    }
}

#[test]
fn rounded_label_presets_are_within_the_stated_precision() {
    for p in sim::workload::catalog::presets().iter().filter(|p| ROUNDED_LABELS.contains(&p.name)) {
        let stated = p.published_parameters;
        let unit = 10f64.powf(stated.log10().floor() - 1.0);
        let n = p.config.parameters();
        assert!((n - stated).abs() <= unit / 2.0, "{}: {n:.4e} outside {stated:.2e} +- {:.1e}", p.name, unit / 2.0);
    }
}

#[test]
fn preset_names_are_unique_and_resolve() {
    let names = sim::workload::catalog::names();
    let mut sorted = names.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), names.len(), "duplicate preset names in {names:?}");
    for n in names {
        let w = sim::workload::catalog::workload(n).unwrap_or_else(|| panic!("{n} listed but not found"));
        assert!(w.parameters() > 0.0);
    }
}

fn shape(b: u32, s: u32, t: u32, sp: bool) -> LayerShape {
    LayerShape {
        micro_batch: b,
        seq_len: s,
        tp: t,
        tp_mode: TpMode::OneD,
        ep: 1,
        cp: 1,
        context: 0,
        attention: sim::hardware::kernels::Attention::Naive,
        fusion: Default::default(),
        sequence_parallel: sp,
        activation_bytes: 2.0,
    }
}

fn gemm_forward_flops(cfg: &TransformerConfig, sh: LayerShape) -> f64 {
    cfg.layer_ops(sh)
        .iter()
        .filter_map(LayerOp::compute)
        .filter(|op| matches!(op.class, OpClass::Gemm { .. }))
        .map(|op| op.forward_flops)
        .sum()
}

/// Forward GEMM FLOPs of a GPT layer: 24bsh^2 + 4bs^2h (Narayanan et al. 2021), split over t.
#[test]
fn gpt_layer_gemm_flops() {
    let mut cases = vec![(1, 2048, 12288, 96), (4, 1024, 2048, 16), (8, 512, 768, 12), (2, 4096, 5120, 40)];
    let mut rng = Pcg64Mcg::seed_from_u64(0x5eed);
    for _ in 0..20 {
        let heads = 8 * rng.random_range(1..=8u32);
        let head_dim = 16 * rng.random_range(1..=8u32);
        cases.push((rng.random_range(1..=16u32), 64 * rng.random_range(1..=32u32), heads * head_dim, heads));
    }
    for (b, s, h, a) in cases {
        let cfg = TransformerConfig::gpt(4, h, a, 50257, 2048);
        let (bf, sf, hf) = (b as f64, s as f64, h as f64);
        let want = 24.0 * bf * sf * hf * hf + 4.0 * bf * sf * sf * hf;
        let got = gemm_forward_flops(&cfg, shape(b, s, 1, false));
        assert_close(got, want, 1e-12, &format!("GEMM FLOPs of a layer, b={b} s={s} h={h}"));
        for t in [2, 4, 8] {
            let got = gemm_forward_flops(&cfg, shape(b, s, t, false));
            assert_close(got, want / t as f64, 1e-12, &format!("GEMM FLOPs per rank, b={b} s={s} h={h} t={t}"));
        }
        // Backward is twice forward for every GEMM (input and weight gradients).
        for op in cfg.layer_ops(shape(b, s, 1, false)).iter().filter_map(LayerOp::compute) {
            if let OpClass::Gemm { batch, m, n, k } = op.class {
                assert_close(op.forward_flops, 2.0 * batch * m * n * k, 1e-12, op.name);
                assert_close(op.backward_flops, 2.0 * op.forward_flops, 1e-12, op.name);
            }
        }
    }
}

/// Per-layer activation bytes against Korthikanti et al. 2022 (16-bit activations, 1-byte
/// dropout masks), `docs/reference/activation_memory_korthikanti2022.json`.
#[test]
fn layer_activation_memory_matches_korthikanti() {
    // 22B, 175B, 530B and 1T of Table 3, and two small ones.
    let configs = [(64, 6144), (96, 12288), (128, 20480), (160, 25600), (16, 1024), (12, 768)];
    for (a, h) in configs {
        let cfg = TransformerConfig::gpt(2, h, a, 51200, 2048);
        assert!(cfg.dropout, "the GPT config is expected to train with dropout");
        for (b, s) in [(1u32, 2048u32), (4, 512), (2, 1024)] {
            let (af, hf, sf) = (a as f64, h as f64, s as f64);
            let sbh = sf * b as f64 * hf;
            let at = |t: u32, sp: bool, r: Recompute| cfg.layer_activation_bytes(shape(b, s, t, sp), r);
            let what = |f: &str, t: u32| format!("{f}, a={a} h={h} b={b} s={s} t={t}");
            assert_close(
                at(1, false, Recompute::None),
                sbh * (34.0 + 5.0 * af * sf / hf),
                0.01,
                &what("no parallelism", 1),
            );
            for t in [1u32, 2, 4, 8] {
                let tf = t as f64;
                let tp = sbh * (10.0 + 24.0 / tf + 5.0 * af * sf / (hf * tf));
                assert_close(at(t, false, Recompute::None), tp, 0.01, &what("tensor parallel", t));
                let sel = sbh * (10.0 + 24.0 / tf);
                assert_close(at(t, false, Recompute::Selective), sel, 0.01, &what("selective", t));
                assert_close(at(t, false, Recompute::Full), 2.0 * sbh, 0.01, &what("full", t));
                let tsp = sbh * (34.0 / tf + 5.0 * af * sf / (hf * tf));
                assert_close(at(t, true, Recompute::None), tsp, 0.01, &what("tensor + sequence parallel", t));
                assert_close(
                    at(t, true, Recompute::Selective),
                    sbh * 34.0 / tf,
                    0.01,
                    &what("selective + sequence", t),
                );
            }
        }
    }
}

/// Under Transformer Engine's fp8 the four linear layers keep their inputs as fp8 transposes: the
/// 2sbh, 2sbh, 2sbh and 8sbh of Korthikanti's 34sbh at 1 byte, 27sbh in all; the attention
/// products keep theirs at 16 bits (5as/h unchanged).
#[test]
fn te_fp8_keeps_the_linear_layers_inputs_at_one_byte() {
    for (a, h) in [(16, 1024), (96, 12288)] {
        let cfg = TransformerConfig::gpt(2, h, a, 51200, 2048);
        let (b, s) = (2u32, 1024u32);
        let sbh = s as f64 * b as f64 * h as f64;
        let mut fp8 = shape(b, s, 1, false);
        fp8.fusion.fp8_gemm_inputs = true;
        let core = 5.0 * a as f64 * s as f64 / h as f64;
        assert_close(cfg.layer_activation_bytes(fp8, Recompute::None), sbh * (27.0 + core), 0.01, "TE fp8");
        // Full recomputation keeps the layer's input only, at 16 bits either way.
        assert_close(cfg.layer_activation_bytes(fp8, Recompute::Full), 2.0 * sbh, 0.01, "TE fp8, full");
    }
}

/// Korthikanti's GPT-3 example: selective recomputation saves 70% of the activations (5as/h = 80).
#[test]
fn selective_recompute_saves_70_percent_on_gpt3() {
    let w = sim::workload::catalog::workload("gpt3-175b").expect("preset");
    let sh = shape(1, 2048, 8, true);
    let none = w.transformer.layer_activation_bytes(sh, Recompute::None);
    let sel = w.transformer.layer_activation_bytes(sh, Recompute::Selective);
    let saved = 1.0 - sel / none;
    assert!((saved - 0.70).abs() < 0.01, "selective saves {:.3} of the activations, Korthikanti 0.70", saved);
}

#[test]
fn model_flops_per_sample() {
    for name in ["gpt3-175b", "gpt3-13b", "gpt2", "llama2-7b", "bert-large"] {
        let tf = sim::workload::catalog::workload(name).expect("preset").transformer;
        for s in [512u32, 2048, 4096] {
            let sf = s as f64;
            let (l, h) = (tf.layers as f64, tf.hidden as f64);
            let want = 6.0 * tf.flop_parameters() * sf + 12.0 * l * h * sf * sf;
            assert_close(tf.model_flops_per_sample(s), want, 1e-12, &format!("{name} s={s}"));
        }
        // Lookup tables are not matrix products: a longer position table, or an input
        // embedding untied from the head, leaves the model FLOPs as they were.
        use sim::workload::transformer::Input;
        let mut long = tf.clone();
        if let Input::Tokens { token_types, .. } = tf.input {
            long.input = Input::Tokens { positions: 1_000_000, token_types };
        }
        let mut untied = tf.clone();
        untied.tied_embeddings = !tf.tied_embeddings;
        for (what, other) in [("a million positions", long), ("the embedding (un)tied", untied)] {
            assert_close(
                other.model_flops_per_sample(2048),
                tf.model_flops_per_sample(2048),
                1e-12,
                &format!("{name} with {what}"),
            );
            assert!(other.parameters() != tf.parameters(), "{name} with {what}: the parameters did change");
        }
    }
    // Korthikanti et al. eq. 7 (per sample): 72Lsh^2 (1 + s/(6h) + v/(12hL)), which ignores
    // biases, norms and position embeddings: within 1% for GPT-3.
    for name in ["gpt3-175b", "gpt3-13b", "gpt3-6.7b"] {
        let tf = sim::workload::catalog::workload(name).expect("preset").transformer;
        let (l, h, v, s) = (tf.layers as f64, tf.hidden as f64, tf.vocab as f64, 2048.0);
        let eq7 = 72.0 * l * s * h * h * (1.0 + s / (6.0 * h) + v / (12.0 * h * l));
        assert_close(tf.model_flops_per_sample(2048), eq7, 0.01, &format!("{name} vs Korthikanti eq. 7"));
    }
}

// ---- the Hugging Face config.json reader ----

fn fixture(name: &str) -> String {
    std::fs::read_to_string(util::repo("tests/data").join(name)).expect("read fixture")
}

#[test]
fn hf_llama2_7b_config() {
    let w = sim::workload::hf::parse("llama2-7b", &fixture("llama2-7b-config.json")).expect("parses");
    let t = &w.transformer;
    assert_eq!((t.layers, t.hidden, t.heads, t.kv_heads, t.ffn_hidden, t.vocab), (32, 4096, 32, 32, 11008, 32000));
    assert_close(w.parameters(), 6.74e9, 0.01, "Llama-2-7B parameters");
    // The same architecture as the built-in preset.
    let preset = sim::workload::catalog::workload("llama2-7b").expect("preset");
    assert_close(w.parameters(), preset.parameters(), 1e-9, "HF config vs preset");
}

/// Mixture-of-experts configs (the keys of DeepSeek-V3's and Qwen3-30B-A3B's `config.json`)
/// read to the same models as the presets: experts, shared experts, dense first layers, latent
/// attention and a head width apart from hidden / heads.
#[test]
fn hf_moe_configs_match_their_presets() {
    for (file, preset) in [("deepseek-v3-config.json", "deepseek-v3"), ("qwen3-30b-a3b-config.json", "qwen3-30b-a3b")] {
        let w = sim::workload::hf::parse(preset, &fixture(file)).expect("parses");
        let p = sim::workload::catalog::workload(preset).expect("preset").transformer;
        let t = &w.transformer;
        assert_eq!(t.moe, p.moe, "{file}");
        assert_eq!((t.mla, t.explicit_head_dim, t.rotary), (p.mla, p.explicit_head_dim, p.rotary), "{file}");
        assert_close(t.parameters(), p.parameters(), 1e-9, file);
        assert_close(t.active_parameters(), p.active_parameters(), 1e-9, file);
    }
    // Layers alternating dense and sparse are refused, not simulated as all sparse.
    let mut v: serde_json::Value = serde_json::from_str(&fixture("qwen3-30b-a3b-config.json")).unwrap();
    v["decoder_sparse_step"] = json!(2);
    let err = sim::workload::hf::parse("q", &v.to_string()).expect_err("alternating layers");
    assert!(err.contains("decoder_sparse_step"), "{err}");
}

#[test]
fn hf_gpt2_config() {
    let w = sim::workload::hf::parse("gpt2", &fixture("gpt2-config.json")).expect("parses");
    let t = &w.transformer;
    assert_eq!((t.layers, t.hidden, t.heads, t.ffn_hidden, t.vocab), (12, 768, 12, 3072, 50257));
    assert_close(w.parameters(), 124.4e6, 0.01, "GPT-2 parameters");
    let preset = sim::workload::catalog::workload("gpt2").expect("preset");
    assert_close(w.parameters(), preset.parameters(), 1e-9, "HF config vs preset");
}

#[test]
fn hf_reader_names_missing_keys() {
    let err = sim::workload::hf::parse("x", r#"{"hidden_size": 4096, "num_attention_heads": 32, "vocab_size": 32000}"#)
        .expect_err("no layer count");
    assert!(err.contains("num_hidden_layers"), "{err}");
    assert!(sim::workload::hf::parse("x", "not json").is_err());
}

/// A scenario naming `hf_config` next to it runs through the CLI, from any working folder.
#[test]
fn hf_config_scenario_runs_through_cli() {
    let path = util::repo("tests/data/llama2-7b-hf.json");
    let tmp = TempDir::new("hf-cwd");
    let o =
        util::bin().current_dir(tmp.path()).args([Path::new("simulate"), &path, Path::new("--json")]).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).expect("report is JSON");
    assert_close(num(&r, "/parameters"), 6.74e9, 0.01, "reported parameters");
    assert_eq!(r["devices"], json!(8));
    let mfu = num(&r, "/mfu");
    assert!(mfu > 0.0 && mfu < 1.0, "mfu = {mfu}");
}

#[test]
fn hf_config_missing_file_names_the_key() {
    let tmp = TempDir::new("hf-missing");
    let text = json!({
        "workload": {"hf_config": "no-such-config.json"},
        "cluster": {"node": "dgx-a100-80gb", "nodes": 1},
        "training": {"global_batch": 8, "micro_batch": 1, "seq_len": 1024},
        "plan": {"dp": 1, "tp": 8, "pp": 1}
    });
    let path = tmp.write("input.json", &text.to_string());
    let o = run(&[&"simulate", &path, &"--json"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("workload.hf_config"), "the error does not name workload.hf_config: {err}");
    assert!(err.contains("no-such-config.json"), "the error does not name the file: {err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// The CNN presets count the published parameters (VGG-16 138.36M, ResNet-50 25.56M) within
/// 1%; every layer passes something on.
#[test]
fn network_presets_match_published_parameter_counts() {
    let mut checked = 0;
    for (name, published, net) in sim::workload::catalog::nets() {
        let n = net.parameters();
        if let Some(p) = published {
            assert!(close(n, p, 0.01), "{name}: {n:.4e} vs published {p:.4e}");
            checked += 1;
        }
        assert!(net.layers.iter().all(|l| l.output_elems > 0.0), "{name}: a layer passes nothing on");
    }
    assert_eq!(checked, 2);
}

/// The loss moves, per logit, what its kernels read and write: PyTorch's unfused
/// `F.cross_entropy` at bf16 after `.float()` (an fp32 copy, `log_softmax`'s three reads and a
/// write, and back) 22 bytes forward and 26 backward, keeping 4; on the bf16 logits the same
/// passes at 2 bytes (8 and 10, keeping 2); a fused kernel 4 and 4, keeping the logits.
#[test]
fn the_loss_moves_what_its_kernels_read_and_write() {
    use sim::workload::loss::UnfusedLoss::{Fp32, Native};
    use sim::workload::transformer::loss_bytes;
    assert_eq!(loss_bytes(false, Fp32, 2.0), (22.0, 26.0, 4.0));
    assert_eq!(loss_bytes(false, Native, 2.0), (8.0, 10.0, 2.0));
    assert_eq!(loss_bytes(true, Fp32, 2.0), (4.0, 4.0, 2.0));
    // fp32 training makes no copy, and the native loss is the same then.
    assert_eq!(loss_bytes(false, Fp32, 4.0), (16.0, 20.0, 4.0));
    assert_eq!(loss_bytes(false, Native, 4.0), (16.0, 20.0, 4.0));
}

/// A small model with a large vocabulary spends a visible part of its step in the loss: fusing
/// it shortens the step and frees the fp32 log-probabilities (`training.framework.fused`).
#[test]
fn a_fused_loss_is_faster_and_keeps_less_memory() {
    let run = |fused: bool| {
        util::simulate(&util::scenario(
            json!({"transformer": {"layers": 4, "hidden": 768, "heads": 12, "vocab": 128256}}),
            1,
            json!({"global_batch": 16, "micro_batch": 2, "seq_len": 2048, "precision": "bf16", "optimizer": "adam",
                   "framework": {"name": "pytorch-fsdp", "fused": {"cross_entropy": fused}}}),
            json!({"dp": 8}),
        ))
    };
    let (eager, fused) = (run(false), run(true));
    assert!(fused.iteration_s < 0.95 * eager.iteration_s, "{} vs {}", fused.iteration_s, eager.iteration_s);
    // Two sequences of 2048 tokens over 128,256 classes: 4 bytes per logit kept unfused, 2 fused.
    let logits = 2.0 * 2048.0 * 128256.0;
    let freed = eager.peak_memory_bytes - fused.peak_memory_bytes;
    assert!(freed >= 0.9 * 2.0 * logits, "freed {freed} bytes");
}

/// The loss's temporaries count in the peak while it runs: PyTorch's `F.cross_entropy` after
/// `.float()` holds two dense fp32 gradients (8 bytes a logit) beside the fp32 log-probabilities
/// it keeps (4) in backward, Megatron's in-place loss only the 16-bit gradient (2) beside its
/// fp32 copy (4), the fused loss the 16-bit gradient (2) beside the 16-bit logits it keeps
/// (2), and the native loss two 16-bit gradients (4) beside its 16-bit output (2). With a
/// 128k vocabulary the logits set the peak: it differs by 6, 8 and 6 bytes a logit. Under
/// PyTorch's `loss_parallel` backward holds three fp32 tensors beside the kept output (12), 4
/// more than `fp32`.
#[test]
fn the_loss_holds_its_temporaries_while_it_runs() {
    let run = |fused: bool, unfused: &str| {
        util::simulate(&util::scenario(
            json!({"transformer": {"layers": 2, "hidden": 512, "heads": 8, "vocab": 128256}}),
            1,
            json!({"global_batch": 16, "micro_batch": 2, "seq_len": 4096, "precision": "bf16", "optimizer": "adam",
                   "framework": {"name": "pytorch-fsdp", "unfused_loss": unfused, "fused": {"cross_entropy": fused}}}),
            json!({"dp": 8}),
        ))
        .peak_memory_bytes
    };
    let logits = 2.0 * 4096.0 * 128256.0;
    let fp32 = run(false, "fp32");
    let bytes = |other: f64| (fp32 - other) / logits;
    assert_close(bytes(run(false, "in_place")), 6.0, 0.02, "against Megatron's in-place loss, bytes a logit");
    assert_close(bytes(run(true, "fp32")), 8.0, 0.02, "against the fused loss, bytes a logit");
    assert_close(bytes(run(false, "native")), 6.0, 0.02, "against the native loss, bytes a logit");
    // PyTorch's loss_parallel (decomposed log_softmax): 4 more bytes a logit in backward (the
    // zero fill, exp and sum, or sum and product, beside the kept output).
    assert_close(-bytes(run(false, "loss_parallel")), 4.0, 0.02, "loss_parallel over fp32, bytes a logit");
}

/// PyTorch's foreach Adam holds a new fp32 tensor per parameter (the update's denominator)
/// while it steps: with few activations the step sets the peak, up to 4 bytes a parameter
/// above fused Adam's (less what the backward's own peak, fused Adam's, held above the step's
/// states: DDP's buckets and the last activations). A loop over the parameters and SGD hold
/// none.
#[test]
fn foreach_adam_holds_its_denominators_while_it_steps() {
    let run = |fused: bool, foreach: bool, optimizer: &str| {
        let r = util::simulate(&util::scenario(
            json!({"preset": "gpt3-1.3b"}),
            1,
            json!({"global_batch": 8, "micro_batch": 1, "seq_len": 128, "precision": "bf16", "optimizer": optimizer,
                   "framework": {"name": "pytorch-ddp", "foreach_optimizer": foreach, "fused": {"adam": fused}}}),
            json!({"dp": 8}),
        ));
        (r.peak_memory_bytes, r.parameters)
    };
    let ((foreach, params), (fused, _)) = (run(false, true, "adam"), run(true, true, "adam"));
    let extra = (foreach - fused) / params;
    assert!((3.5..=4.0 + 1e-9).contains(&extra), "foreach Adam's temporaries: {extra} bytes a parameter");
    // A loop over the parameters (Composer's DecoupledAdamW) holds one parameter's at a time.
    assert_close(run(false, false, "adam").0, fused, 1e-12, "a per-parameter loop");
    assert_close(run(false, true, "sgd").0, run(true, true, "sgd").0, 1e-12, "SGD holds no temporaries");
}

/// DeepSeek-V3 on Megatron-Core with selective recomputation of Megatron-Core's modules: each
/// module drops what its checkpoint frees (`layernorm` the down projection's and the router's
/// inputs; `mla_up_proj` the queries, keys and values the fused attention keeps, its output
/// stays; `moe_act` the expert down projection's input; `moe` all of the MoE block but the
/// router's input) and reruns its ops, so the peak falls and the step grows. Dense Llama
/// layers keep their norms inside Transformer Engine's fused linears: `layernorm` changes
/// nothing there, `mlp` drops the activation's and the down projection's inputs.
#[test]
fn recompute_modules_free_what_their_checkpoints_free() {
    let scenario = |preset: &str, nodes: u32, plan: serde_json::Value| {
        let v = json!({"workload": {"preset": preset}, "cluster": {"node": "dgx-h100", "nodes": nodes},
            "training": {"global_batch": 1024, "micro_batch": 1, "seq_len": 4096, "precision": "bf16",
                         "framework": "megatron-core"},
            "plan": plan});
        util::parse(&v.to_string())
    };
    let saved = |s: &sim::scenario::Scenario, layer: u32| {
        let w = &s.workload.transformer;
        let ops = w.layer_ops_at(layer, s.plan.layer_shape());
        let kept = sim::workload::recompute::kept_bytes(&ops, s.plan.recompute, s.plan.recompute_modules, 0.0);
        let by = move |n: &str| -> f64 {
            ops.iter()
                .filter_map(LayerOp::compute)
                .filter(|o| o.name == n)
                .map(|o| o.saved.bytes(Recompute::None))
                .sum()
        };
        (kept, by)
    };
    let ds = |modules: serde_json::Value| {
        scenario(
            "deepseek-v3",
            128,
            json!({"dp": 64, "pp": 16, "ep": 64, "zero_stage": 1, "recompute": "selective",
            "recompute_modules": modules}),
        )
    };
    let base = ds(json!(["core_attn"]));
    let (kept, by) = saved(&base, 60);
    let o = by("out_proj");
    let (lnmla, _) = saved(&ds(json!(["core_attn", "layernorm", "mla_up_proj"])), 60);
    assert_close(kept - lnmla, by("q_down") + by("router") + by("flash_attn") - o, 1e-9, "layernorm + mla_up_proj");
    let (act, _) = saved(&ds(json!(["core_attn", "moe_act"])), 60);
    assert_close(kept - act, by("expert_fc2"), 1e-9, "moe_act");
    let (moe, _) = saved(&ds(json!(["core_attn", "moe"])), 60);
    let moe_ops = ["route", "expert_fc1", "expert_act", "expert_fc2", "unpermute", "shared_act", "shared_fc2"];
    assert_close(kept - moe, moe_ops.iter().map(|n| by(n)).sum::<f64>(), 1e-9, "moe");
    let (a, b) = (simulate_report(&base), simulate_report(&ds(json!(["core_attn", "layernorm", "mla_up_proj"]))));
    assert!(
        b.peak_memory_bytes < a.peak_memory_bytes - 16.0 * 2f64.powi(30),
        "{} vs {}",
        b.peak_memory_bytes,
        a.peak_memory_bytes
    );
    assert!(b.iteration_s > a.iteration_s, "the reruns take time: {} vs {}", b.iteration_s, a.iteration_s);
    // Dense Llama: the norms live in the fused linears; the MLP checkpoint frees its insides.
    let llama = |modules: serde_json::Value| {
        scenario("llama3-8b", 1, json!({"dp": 8, "recompute": "selective", "recompute_modules": modules}))
    };
    let (dense, by) = saved(&llama(json!(["core_attn"])), 0);
    assert_eq!(saved(&llama(json!(["core_attn", "layernorm"])), 0).0, dense);
    assert_close(dense - saved(&llama(json!(["core_attn", "mlp"])), 0).0, by("act") + by("fc2"), 1e-9, "mlp");
}

/// torchtitan's per-op selective checkpointing (`op_sac`) on Llama 3 8B with a GEMM per
/// projection, as torchtitan's code runs them: the layer keeps its input and the outputs of
/// the first, third, fifth and seventh matrix products (wq, wv, w1, w2) and of the attention
/// kernel, and reruns the rest up to the last tensor the backward needs (the norms, wk, rotary,
/// the key-value heads' repeat, wo, the first residual add, w3, SwiGLU), not the second
/// residual add. So it keeps more than
/// full recomputation and less than none, and takes between their times. Splitting the
/// projections leaves the FLOPs as they were.
#[test]
fn op_sac_keeps_every_second_matmul_and_the_attention() {
    let scenario = |recompute: &str, modules: serde_json::Value, projections: bool| {
        let v = json!({"workload": {"preset": "llama3-8b"}, "cluster": {"node": "dgx-h100", "nodes": 1},
            "training": {"global_batch": 16, "micro_batch": 2, "seq_len": 8192, "precision": "bf16",
                         "attention": "flash2",
                         "framework": {"name": "pytorch-fsdp", "fused": {"projections": projections}}},
            "plan": {"dp": 8, "zero_stage": 3, "recompute": recompute, "recompute_modules": modules}});
        let mut v = v;
        if recompute != "selective" {
            v["plan"].as_object_mut().expect("plan").remove("recompute_modules");
        }
        util::parse(&v.to_string())
    };
    let sac = scenario("selective", json!(["op_sac"]), false);
    let ops = sac.workload.transformer.layer_ops(sac.plan.layer_shape());
    let names: Vec<&str> = ops.iter().filter_map(LayerOp::compute).map(|o| o.name).collect();
    let tokens = 2.0 * 8192.0;
    let input = 2.0 * tokens * 4096.0;
    let sel = sim::workload::recompute::selective(&ops, sac.plan.recompute_modules, input);
    let rerun: Vec<&str> =
        ops.iter().zip(&sel).filter(|(_, s)| s.rerun).filter_map(|(o, _)| o.compute()).map(|o| o.name).collect();
    assert_eq!(
        rerun,
        ["ln1", "k_proj", "rope", "repeat_kv", "out_proj", "dropout_residual", "ln2", "up_proj", "act"],
        "ops {names:?}"
    );
    assert_eq!(names.iter().filter(|n| **n == "dropout_residual").count(), 2, "{names:?}");
    // Kept: the input, wq's (4096 wide) and wv's (1024) outputs, the attention's (4096), w1's
    // (14,336) and w2's (4096), 2 bytes an element.
    let kept: f64 = sel.iter().map(|s| s.kept).sum();
    let expect = input + 2.0 * tokens * (4096.0 + 1024.0 + 4096.0 + 14336.0 + 4096.0);
    assert_close(kept, expect, 1e-9, "kept bytes");
    let fused = scenario("selective", json!(["op_sac"]), true);
    let fused_ops = fused.workload.transformer.layer_ops(fused.plan.layer_shape());
    let flops = |ops: &[LayerOp]| ops.iter().filter_map(LayerOp::compute).map(|o| o.forward_flops).sum::<f64>();
    assert_close(flops(&ops), flops(&fused_ops), 1e-12, "the same FLOPs in more GEMMs");
    let gemms = |ops: &[LayerOp]| {
        ops.iter()
            .filter_map(LayerOp::compute)
            .filter(|o| matches!(o.class, sim::workload::OpClass::Gemm { .. }))
            .count()
    };
    assert_eq!((gemms(&ops), gemms(&fused_ops)), (7, 4));
    let (none, full, op) = (
        simulate_report(&scenario("none", json!([]), false)),
        simulate_report(&scenario("full", json!([]), false)),
        simulate_report(&sac),
    );
    assert!(
        full.iteration_s > op.iteration_s && op.iteration_s > none.iteration_s,
        "{} {} {}",
        none.iteration_s,
        op.iteration_s,
        full.iteration_s
    );
    assert!(
        full.peak_memory_bytes < op.peak_memory_bytes && op.peak_memory_bytes < none.peak_memory_bytes,
        "{} {} {}",
        none.peak_memory_bytes,
        op.peak_memory_bytes,
        full.peak_memory_bytes
    );
}

fn simulate_report(s: &sim::scenario::Scenario) -> sim::report::Report {
    sim::simulate(s, false).report
}

/// `training.framework.fused.gqa` false (the eager profiles: torchtitan's and Hugging Face's
/// `repeat_kv`): the key and value heads are copied to the query heads' width before the
/// attention kernel, which then keeps them at that width and, under context parallelism,
/// passes them around the ring at that width. Llama 3 8B (8 key-value heads of 32) at 8,192
/// tokens and micro-batch 2: the repeat keeps 2 x 2 bytes x (4,096 - 1,024) more per token,
/// the ring carries four times the bytes, and a model without grouped heads is untouched.
#[test]
fn repeated_key_value_heads_cost_a_copy_and_full_width_attention_inputs() {
    let layer = |model: serde_json::Value, gqa: bool, cp: u32| {
        let s = util::parse(
            &json!({"workload": model, "cluster": {"node": {"preset": "dgx-h100", "devices": 4}, "nodes": 1},
                "training": {"global_batch": 8, "micro_batch": 2, "seq_len": 8192, "precision": "bf16",
                             "attention": "flash2",
                             "framework": {"name": "pytorch-fsdp", "fused": {"gqa": gqa}}},
                "plan": {"dp": 4 / cp, "cp": cp, "zero_stage": 3}})
            .to_string(),
        );
        s.workload.transformer.layer_ops(s.plan.layer_shape())
    };
    let saved =
        |ops: &[LayerOp]| ops.iter().filter_map(LayerOp::compute).map(|o| o.saved.bytes(Recompute::None)).sum::<f64>();
    let names = |ops: &[LayerOp]| ops.iter().filter_map(LayerOp::compute).map(|o| o.name).collect::<Vec<_>>();
    let llama = json!({"preset": "llama3-8b"});
    let (repeated, grouped) = (layer(llama.clone(), false, 1), layer(llama.clone(), true, 1));
    assert!(names(&repeated).contains(&"repeat_kv") && !names(&grouped).contains(&"repeat_kv"));
    let tokens = 2.0 * 8192.0;
    assert_close(saved(&repeated) - saved(&grouped), 2.0 * 2.0 * tokens * (4096.0 - 1024.0), 1e-12, "kept K and V");
    let copy = repeated.iter().filter_map(LayerOp::compute).find(|o| o.name == "repeat_kv").expect("repeat_kv");
    assert_close(copy.forward_bytes, 2.0 * tokens * 2.0 * (1024.0 + 4096.0), 1e-12, "read K, V; write them 4x");
    let ring = |ops: &[LayerOp]| {
        ops.iter()
            .find_map(|o| match o {
                LayerOp::Comm { name: "cp_kv", bytes, .. } => Some(*bytes),
                _ => None,
            })
            .expect("cp_kv")
    };
    assert_close(ring(&layer(llama.clone(), false, 2)), 4.0 * ring(&layer(llama, true, 2)), 1e-12, "ring bytes");
    let mha = json!({"transformer": {"layers": 2, "hidden": 4096, "heads": 32, "vocab": 32000}});
    assert_eq!(layer(mha.clone(), false, 1), layer(mha, true, 1), "no grouped heads, nothing to repeat");
}

/// A head dimension between a fused kernel's compiled ones is named in the report's notes with
/// the one it runs as (cuDNN, Megatron-Core's kernel on Hopper: 80 runs as 96); 128 is not.
#[test]
fn a_padded_head_dimension_is_noted() {
    let report = |hidden: u32, heads: u32| {
        util::simulate(
            &json!({"workload": {"transformer": {"layers": 2, "hidden": hidden, "heads": heads, "vocab": 32000}},
                "cluster": {"node": "dgx-h100", "nodes": 1},
                "training": {"global_batch": 8, "micro_batch": 1, "seq_len": 2048, "precision": "bf16",
                             "framework": "megatron-core"},
                "plan": {"dp": 8}})
            .to_string(),
        )
    };
    let padded = report(2560, 32);
    let note = padded.notes.iter().find(|n| n.contains("head dimension 80")).expect("a note on head dimension 80");
    assert!(note.contains("`cudnn`") && note.contains("runs as 96") && note.contains("20%"), "{note}");
    assert!(!report(4096, 32).notes.iter().any(|n| n.contains("head dimension")), "128 is compiled");
}

/// Tensor parallelism shards whole key-value heads (Megatron-Core divides its query groups by
/// tp; torchtitan's wk and wv are column-parallel): a tp that does not divide them is the
/// reader's error, naming the allowed values, where trainsim used to split heads into
/// fractions; the plan search proposes only tensor-parallel degrees that divide them.
#[test]
fn tensor_parallelism_must_divide_the_key_value_heads() {
    let text = |tp: u32| {
        util::scenario(
            json!({"transformer": {"layers": 2, "hidden": 4096, "heads": 32, "kv_heads": 4, "vocab": 32000}}),
            1,
            json!({"global_batch": 8, "micro_batch": 1, "seq_len": 2048, "precision": "bf16"}),
            json!({"dp": 8 / tp, "tp": tp}),
        )
    };
    let err = sim::scenario::parse(&text(8), &util::no_files).expect_err("tp 8 over 4 key-value heads").to_string();
    assert!(err.contains("plan.tp") && err.contains("4 key-value heads") && err.contains("a divisor of 4"), "{err}");
    util::parse(&text(4));
    // The search's tensor-parallel degrees on 8 GPUs a node stop at 4.
    let tmp = TempDir::new("kv-heads-search");
    let mut v: serde_json::Value = serde_json::from_str(&text(4)).unwrap();
    v["plan"] = json!({});
    let path = tmp.write("s.json", &v.to_string());
    let o = run(&[&"search", &path, &"--top", &"50", &"--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r: serde_json::Value = serde_json::from_str(&util::stdout(&o)).unwrap();
    let tps: Vec<u64> = r["top"].as_array().unwrap().iter().map(|e| e["plan"]["tp"].as_u64().unwrap()).collect();
    assert!(tps.contains(&4) && tps.iter().all(|&t| t <= 4), "{tps:?}");
}
