//! The simulator's kernel model against trainsim's own measurements on a real GPU:
//! `experiments/executor/gpu/microbench.py` through PyTorch 2.11 on one H200 (session 18,
//! `traces/2026-11-26-cuda-h200/microbench.json`, `block.json`). Bounds hold what the model reaches now,
//! so that a change that loses it fails; the printed tables are the validation.

use super::kernels::{gemm_s, predicted_tflops};
use crate::util::repo_json;
use serde_json::Value;
use sim::hardware::kernels::{FlashKernel, GpuArch, memory_kernel_efficiency};

fn microbench() -> Value {
    repo_json("traces/2026-11-26-cuda-h200/microbench.json")
}

/// The catalog's memory-kernel fractions are the measured rates over the measured copy's,
/// as `memory_kernel_efficiency` documents them (each family the mean of its rows).
#[test]
fn memory_kernel_fractions_are_the_measured_ones() {
    let m = microbench();
    let rows = m["memory"].as_array().expect("memory rows");
    let rate = |op: &str| {
        let v: Vec<f64> = rows.iter().filter(|r| r["op"] == op).map(|r| r["gbps"].as_f64().unwrap()).collect();
        assert!(!v.is_empty(), "no {op} row");
        v.iter().sum::<f64>() / v.len() as f64
    };
    let copy = rate("copy");
    let gelu = (rate("gelu") + rate("gelu_tanh")) / 2.0;
    for (family, measured) in [
        ("ln1", rate("layernorm")),
        ("softmax", rate("softmax")),
        ("act", gelu),
        ("attn_dropout", rate("dropout")),
        ("dropout_residual", rate("dropout")),
        ("optimizer", rate("adamw_fused")),
        ("optimizer_foreach", rate("adamw_foreach")),
    ] {
        let catalog = memory_kernel_efficiency(Some(GpuArch::Hopper), family);
        println!("{family}: measured {:.3} of the copy's {copy:.0} GB/s, catalog {catalog:.2}", measured / copy);
        assert!((catalog - measured / copy).abs() < 0.015, "{family}: catalog {catalog}, measured {}", measured / copy);
    }
    // The copy itself is about what the presets' streaming efficiency says (0.85 of 4.8 TB/s;
    // 0.87 measured).
    assert!((copy / 4800.0 - 0.85).abs() < 0.03, "copy {copy} GB/s");
    assert_eq!(memory_kernel_efficiency(None, "ln1"), 1.0, "CPUs and FPGAs keep the roofline");
}

/// Each measured GEMM row of `rows` against the `h200` preset at `precision`: prints one row
/// per shape tagged `tag` and a summary; returns (points, mean absolute error, worst error).
fn compare_gemms(rows: &[&Value], precision: sim::hardware::Precision, tag: &str) -> (f64, f64, f64) {
    let dev = sim::hardware::catalog::device("h200").expect("preset");
    let (mut sum, mut signed, mut n, mut worst) = (0.0, 0.0, 0.0, 0.0f64);
    for r in rows {
        let (m, nn, k) = (r["m"].as_f64().unwrap(), r["n"].as_f64().unwrap(), r["k"].as_f64().unwrap());
        let measured = r["seconds"].as_f64().unwrap();
        let predicted = gemm_s(&dev, precision, [1.0, m, nn, k]);
        let err = (predicted - measured) / measured;
        println!(
            "| {tag} | {m} | {nn} | {k} | {:.1} | {:.1} | {:+.1}% |",
            measured * 1e6,
            predicted * 1e6,
            100.0 * err
        );
        sum += err.abs();
        signed += err;
        n += 1.0;
        if err.abs() > worst.abs() {
            worst = err;
        }
    }
    println!(
        "h200 {tag}: mean {:.1}% (signed {:+.1}%) over {n}; worst {:+.1}%",
        100.0 * sum / n,
        100.0 * signed / n,
        100.0 * worst
    );
    (n, sum / n, worst)
}

/// cuBLAS through `F.linear` at transformer shapes (2,048 and 8,192 tokens, widths 1,024 to
/// 8,192) against the `h200` preset: mean 11.4%, signed +8.4% (the model is slower at large
/// shapes: its 0.72, what the card sustains in a training step, sits under the 0.70-0.83 these
/// one-millisecond samples reached; 8.1% with the 0.75 assumed before session 18). The worst point (-32%) is the smallest, 2,048 x 1,024 x 1,024: 15 us measured,
/// which is eager PyTorch's dispatch from Python (about 20 us a call on this host; the GPU
/// waits for it), not the kernel; the model charges the kernel and a 3 us launch.
#[test]
fn torch_gemms_on_an_h200_against_the_model() {
    let m = microbench();
    let rows: Vec<&Value> = m["gemm"].as_array().unwrap().iter().collect();
    let (n, mean, worst) = compare_gemms(&rows, sim::hardware::Precision::Bf16, "torch gemm");
    assert_eq!(n, 32.0);
    assert!(mean < 0.13, "mean {:.1}%", 100.0 * mean);
    assert!(worst.abs() < 0.6, "worst {:.1}%", 100.0 * worst);
}

/// scaled_dot_product_attention on the H200: the FlashAttention-2 backend against the
/// model's FlashAttention-2 and the cuDNN backend (PyTorch 2.11's default on this GPU: its
/// times match the default's) against the model's cuDNN kernel, forward and backward, over
/// 512-16k tokens, head dims 64 and 128, causal or not. The model's rates are the published
/// H100 benchmarks' (FlashAttention-2 and -3 papers, cuDNN); H200 has the same SMs and clocks.
/// FlashAttention-2: mean 11.1%, the model 10.7% too fast (PyTorch's build of it on this card
/// is slower than the paper's own on H100); cuDNN: mean 8.9%, the model 5.0% too slow.
#[test]
fn sdpa_attention_on_an_h200_against_the_model() {
    let mut report = Vec::new();
    for (backend, kernel, mean_max) in [("flash", FlashKernel::V2, 0.13), ("cudnn", FlashKernel::Cudnn, 0.12)] {
        let (mut sum, mut signed, mut n) = (0.0, 0.0, 0.0);
        for r in microbench()["attention"].as_array().unwrap().iter().filter(|r| r["backend"] == backend) {
            let (s, d, causal) =
                (r["seq"].as_f64().unwrap(), r["hdim"].as_f64().unwrap(), r["causal"].as_bool().unwrap());
            for pass in ["fwd", "bwd"] {
                let measured = r[format!("{pass}_tflops")].as_f64().unwrap();
                let predicted = predicted_tflops(GpuArch::Hopper, kernel, pass, s, d, causal);
                let err = (predicted - measured) / measured;
                println!(
                    "| {backend} | {pass} | {s} | {d} | {causal} | {measured:.0} | {predicted:.0} | {:+.1}% |",
                    100.0 * err
                );
                sum += err.abs();
                signed += err;
                n += 1.0;
            }
        }
        report.push(format!("{backend}: mean {:.1}% (signed {:+.1}%) over {n}", 100.0 * sum / n, 100.0 * signed / n));
        assert_eq!(n, 48.0, "{backend}");
        assert!(sum / n < mean_max, "{backend}: mean {:.1}%", 100.0 * sum / n);
    }
    println!("h200 sdpa attention: {}", report.join("; "));
}

/// fp8 GEMMs (`torch._scaled_mm`, e4m3 operands, tensor-wise scales, bf16 out) at the same
/// shapes against the `h200` preset at fp8 (the casts around them left out, as the measured
/// kernels take fp8 inputs), with fast accumulation (torchao's forward) and without (its
/// gradients): mean 17.0% and 14.7% (-1.1% and -4.2% signed). Since session 22 the preset's
/// fp8 GEMMs run at 0.66 of the fp8 peak (was the bf16 0.72; the catalog says why), a
/// sustained rate: the mid-size shapes, measured in short bursts at 0.70-0.73, come out
/// 13-23% slow, as the bf16 ones do against their bursts; before, the mean was 13.9% and
/// 13.4%, the model too fast (-9.0%, -11.9% signed). The small ones (under 10 GFLOP, up to
/// -77%) take about 29 us whatever their size: `_scaled_mm`'s dispatch from eager Python,
/// which the GPU waits for. The largest (8,192 x 8,192 x 8,192 and 8,192 x 32,768 x 8,192)
/// ran at 1.05-1.16 PFLOP/s where the shapes before them reached 1.3-1.4: the card at its
/// power limit after seconds of fp8 work (clocks were not read).
#[test]
fn torch_fp8_gemms_on_an_h200_against_the_model() {
    let m = microbench();
    for fast in [true, false] {
        let rows: Vec<&Value> = m["fp8_gemm"].as_array().unwrap().iter().filter(|r| r["fast_accum"] == fast).collect();
        let (n, mean, worst) =
            compare_gemms(&rows, sim::hardware::Precision::Fp8, &format!("torch fp8 gemm, fast={fast}"));
        assert_eq!(n, 32.0);
        assert!(mean < 0.18, "mean {:.1}%", 100.0 * mean);
        assert!(worst.abs() < 0.85, "worst {:.1}%", 100.0 * worst);
    }
}

/// Seconds trainsim charges one layer of `r`'s block (GEMMs, attention and memory-bound ops;
/// the difference of 8 and 4 layers, so the embedding, head and optimizer drop out) on one
/// `h200` under the eager `pytorch-ddp` profile with cuDNN attention (SDPA's default there).
fn block_layer_s(r: &Value) -> f64 {
    let dim = |k: &str| r[k].as_u64().unwrap();
    let compute = |layers: u64| {
        let text = serde_json::json!({
            "name": "block",
            "workload": {"transformer": {"layers": layers, "hidden": dim("hidden"), "heads": dim("heads"),
                "vocab": 50304, "max_positions": dim("seq"), "bias": false, "dropout": false}},
            "cluster": {"node": {"preset": "hgx-h200", "devices": 1}, "nodes": 1},
            "training": {"global_batch": dim("batch"), "micro_batch": dim("batch"), "seq_len": dim("seq"),
                "precision": "bf16", "optimizer": "adam", "attention": "cudnn", "framework": "pytorch-ddp"},
            "plan": {"dp": 1, "tp": 1, "pp": 1}
        })
        .to_string();
        let t = &super::util::simulate(&text).time_breakdown[0];
        t.gemm_s + t.attention_s + t.memory_bound_s
    };
    (compute(8) - compute(4)) / 4.0
}

/// A GPT block's training step through eager PyTorch on the H200 (`block.json`, written by
/// `experiments/executor/gpu/block.py`: pre-LayerNorm, fused QKV, causal SDPA, GeLU MLP, bf16,
/// widths 1,024-8,192, 1k-16k tokens), forward and backward per layer, against what trainsim
/// charges one such layer: every shape within -2.2% to +1.2% (with the 0.72 large-GEMM
/// efficiency this measurement, with the sustained GEMMs beside it, gave the Hopper presets;
/// -1.9% to -4.8% at the 0.75 assumed before).
#[test]
fn an_eager_gpt_block_on_an_h200_against_the_model() {
    let b = repo_json("traces/2026-11-26-cuda-h200/block.json");
    let rows = b["block"].as_array().expect("block rows");
    assert_eq!(rows.len(), 5);
    for r in rows {
        let measured = r["per_layer_s"].as_f64().expect("measured");
        let predicted = block_layer_s(r);
        let err = (predicted - measured) / measured;
        println!(
            "h{} s{} b{}: measured {:.3} ms, predicted {:.3} ms, {:+.1}%",
            r["hidden"],
            r["seq"],
            r["batch"],
            measured * 1e3,
            predicted * 1e3,
            100.0 * err
        );
        assert!(err.abs() < 0.05, "h{} s{}: {:+.1}%", r["hidden"], r["seq"], 100.0 * err);
    }
}
