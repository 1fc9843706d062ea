//! The simulator's kernel model against trainsim's own measurements on real GPUs:
//! `experiments/executor/gpu/microbench.py` and `block.py` through PyTorch 2.11 on one H200
//! (session 18, `traces/2026-11-26-cuda-h200/`) and one H100 SXM (session 25,
//! `traces/2026-11-26-cuda-h100/`). The catalog's memory-kernel fractions and the Hopper
//! presets' large-GEMM efficiency came from the H200's files; the H100's were measured after
//! and held out. Bounds hold what the model reaches now, so that a change that loses it fails;
//! the printed tables are the validation. Whole blocks are `gpu_blocks`'.

use super::kernels::{gemm_s, predicted_tflops};
use crate::util::repo_json;
use serde_json::Value;
use sim::hardware::kernels::{FlashKernel, GpuArch, memory_kernel_efficiency};

/// A GPU trainsim measured, with the catalog preset and node preset that describe it.
pub(super) struct Gpu {
    pub(super) name: &'static str,
    pub(super) traces: &'static str,
    pub(super) device: &'static str,
    pub(super) node: &'static str,
}

pub(super) const H200: Gpu =
    Gpu { name: "h200", traces: "traces/2026-11-26-cuda-h200", device: "h200", node: "hgx-h200" };
pub(super) const H100: Gpu =
    Gpu { name: "h100", traces: "traces/2026-11-26-cuda-h100", device: "h100-sxm", node: "dgx-h100" };

impl Gpu {
    pub(super) fn microbench(&self) -> Value {
        repo_json(&format!("{}/microbench.json", self.traces))
    }
    pub(super) fn block(&self) -> Value {
        repo_json(&format!("{}/block.json", self.traces))
    }
}

/// The catalog's memory-kernel fractions are the measured rates over the measured copy's,
/// as `memory_kernel_efficiency` documents them (each family the mean of its rows).
#[test]
fn memory_kernel_fractions_are_the_measured_ones() {
    let m = H200.microbench();
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

/// Each measured GEMM row of `rows` against `gpu`'s preset at `precision`: prints one row
/// per shape tagged `tag` and a summary; returns (points, mean absolute error, worst error).
fn compare_gemms(gpu: &Gpu, rows: &[&Value], precision: sim::hardware::Precision, tag: &str) -> (f64, f64, f64) {
    let dev = sim::hardware::catalog::device(gpu.device).expect("preset");
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
        "{} {tag}: mean {:.1}% (signed {:+.1}%) over {n}; worst {:+.1}%",
        gpu.name,
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
    let m = H200.microbench();
    let rows: Vec<&Value> = m["gemm"].as_array().unwrap().iter().collect();
    let (n, mean, worst) = compare_gemms(&H200, &rows, sim::hardware::Precision::Bf16, "torch gemm");
    assert_eq!(n, 32.0);
    assert!(mean < 0.13, "mean {:.1}%", 100.0 * mean);
    assert!(worst.abs() < 0.6, "worst {:.1}%", 100.0 * worst);
}

/// scaled_dot_product_attention on the H200: the FlashAttention-2 backend against the
/// model's FlashAttention-2 and the cuDNN backend (PyTorch 2.11's default on this GPU: its
/// times match the default's) against the model's cuDNN kernel, forward and backward, over
/// 512-16k tokens, head dims 64 and 128, causal or not. The model's rates are the published
/// H100 benchmarks' (FlashAttention-2 and -3 papers, cuDNN); H200 has the same SMs and clocks.
/// Each measured backward is compared with the kernel's time plus the harness's gradient
/// accumulation ([`harness_accumulation_s`]). FlashAttention-2: mean 7.3%, the model 6.7% too
/// fast (forward +8.1%, backward +5.2%: PyTorch's build of it on this card is a little slower
/// than the paper's own on H100); cuDNN: mean 9.9%, the model 9.8% too slow (forward -12.0%,
/// backward -7.6%: cuDNN 9.19 is faster than the version the FlashAttention-3 paper ran).
/// Before the accumulation was counted (session 27) the means were 11.1% and 8.9%, and the
/// backward at 512-2k tokens looked 20-50% slower than the paper's.
#[test]
fn sdpa_attention_on_an_h200_against_the_model() {
    compare_sdpa(&H200, "attention", [0.09, 0.11], 48.0);
}

/// The forward FLOPs of one SDPA row, as the FlashAttention benchmarks count them: 4 s^2 d
/// per head, halved under a causal mask.
fn sdpa_forward_flops(r: &Value) -> f64 {
    let f = |k: &str| r[k].as_f64().unwrap();
    let causal = if r["causal"].as_bool().unwrap() { 0.5 } else { 1.0 };
    4.0 * f("batch") * f("heads") * f("seq") * f("seq") * f("hdim") * causal
}

/// The gradient accumulation inside a backward row measured before the harness reset the
/// gradients (rows without `"grads_reset": true`: the 2026-11-26 traces). `microbench.py`
/// then made q, k and v leaf tensors and called backward on them again and again without
/// clearing `.grad`, so every timed backward also added the three new gradients into the old
/// ones: an elementwise add reading 2 + 2 bytes and writing 2 per element of each (batch x
/// heads x tokens x head dimension), at the same card's measured `add` rate (the `memory`
/// rows; a lower bound, since FlashAttention-2's gradients arrive transposed). The papers'
/// benchmarks set `.grad = None` before each backward (flash-attn `utils/benchmark.py`,
/// `benchmark_backward`), and a training step's q, k and v are not leaves: a step pays none
/// of it. About 0.2 ms at the 16k-token rows, a third of FlashAttention-2's backward at 512
/// tokens and a tenth at 4k.
fn harness_accumulation_s(bench: &Value, r: &Value) -> f64 {
    if r["grads_reset"].as_bool() == Some(true) {
        return 0.0;
    }
    let add = bench["memory"].as_array().unwrap().iter().find(|m| m["op"] == "add").expect("add row")["gbps"]
        .as_f64()
        .unwrap()
        * 1e9;
    let elems = ["batch", "heads", "seq", "hdim"].iter().map(|k| r[*k].as_f64().unwrap()).product::<f64>();
    3.0 * 6.0 * elems / add
}

/// `gpu`'s SDPA rows of `section` per backend (FlashAttention-2, cuDNN) against the model's
/// kernels: asserts each backend's count of points (`rows`: forward and backward) and mean
/// error under `mean_max`; returns each backend's worst error.
fn compare_sdpa(gpu: &Gpu, section: &str, mean_max: [f64; 2], rows: f64) -> [f64; 2] {
    let mut report = Vec::new();
    let mut worst = [0.0f64; 2];
    let kernels = [("flash", FlashKernel::V2), ("cudnn", FlashKernel::Cudnn)];
    let bench = gpu.microbench();
    for (((backend, kernel), mean_max), worst) in kernels.into_iter().zip(mean_max).zip(&mut worst) {
        let (mut sum, mut signed, mut n) = (0.0, 0.0, 0.0);
        for r in bench[section].as_array().unwrap().iter().filter(|r| r["backend"] == backend) {
            let (s, d, causal) =
                (r["seq"].as_f64().unwrap(), r["hdim"].as_f64().unwrap(), r["causal"].as_bool().unwrap());
            for pass in ["fwd", "bwd"] {
                let measured = r[format!("{pass}_tflops")].as_f64().unwrap();
                let mut predicted = predicted_tflops(GpuArch::Hopper, kernel, pass, s, d, causal);
                if pass == "bwd" {
                    // The kernel's time, plus what the harness added around it (none since
                    // the harness resets the gradients, as the papers' benchmarks do).
                    let flops = 2.5 * sdpa_forward_flops(r);
                    predicted = flops / (flops / (predicted * 1e12) + harness_accumulation_s(&bench, r)) / 1e12;
                }
                let err = (predicted - measured) / measured;
                println!(
                    "| {} {backend} | {pass} | {s} | {d} | {causal} | {measured:.0} | {predicted:.0} | {:+.1}% |",
                    gpu.name,
                    100.0 * err
                );
                sum += err.abs();
                signed += err;
                n += 1.0;
                if err.abs() > worst.abs() {
                    *worst = err;
                }
            }
        }
        report.push(format!(
            "{backend}: mean {:.1}% (signed {:+.1}%), worst {:+.1}% over {n}",
            100.0 * sum / n,
            100.0 * signed / n,
            100.0 * *worst
        ));
        assert_eq!(n, rows, "{backend}");
        assert!(sum / n < mean_max, "{backend}: mean {:.1}%", 100.0 * sum / n);
    }
    println!("{} sdpa {section}: {}", gpu.name, report.join("; "));
    worst
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
    let m = H200.microbench();
    for fast in [true, false] {
        let rows: Vec<&Value> = m["fp8_gemm"].as_array().unwrap().iter().filter(|r| r["fast_accum"] == fast).collect();
        let (n, mean, worst) =
            compare_gemms(&H200, &rows, sim::hardware::Precision::Fp8, &format!("torch fp8 gemm, fast={fast}"));
        assert_eq!(n, 32.0);
        assert!(mean < 0.18, "mean {:.1}%", 100.0 * mean);
        assert!(worst.abs() < 0.85, "worst {:.1}%", 100.0 * worst);
    }
}

/// cuBLAS through `F.linear` on the H100 (held out: the Hopper presets' 0.72 came from the
/// H200): mean 10.1%, signed +7.4% (the model slower than these one-millisecond bursts, as on
/// the H200); worst -25.0% at 2,048 x 1,024 x 1,024 (14 us, Python's dispatch).
#[test]
fn torch_gemms_on_an_h100_against_the_model() {
    let m = H100.microbench();
    let rows: Vec<&Value> = m["gemm"].as_array().unwrap().iter().collect();
    let (n, mean, worst) = compare_gemms(&H100, &rows, sim::hardware::Precision::Bf16, "torch gemm");
    assert_eq!(n, 32.0);
    assert!(mean < 0.12, "mean {:.1}%", 100.0 * mean);
    assert!(worst.abs() < 0.3, "worst {:.1}%", 100.0 * worst);
}

/// fp8 GEMMs on the H100: mean 11.3% with fast accumulation, 9.6% without (+4.5%, +0.4%
/// signed); the worst (-60%) is again the smallest shape, `_scaled_mm`'s 18 us dispatch.
#[test]
fn torch_fp8_gemms_on_an_h100_against_the_model() {
    let m = H100.microbench();
    for fast in [true, false] {
        let rows: Vec<&Value> = m["fp8_gemm"].as_array().unwrap().iter().filter(|r| r["fast_accum"] == fast).collect();
        let (n, mean, worst) =
            compare_gemms(&H100, &rows, sim::hardware::Precision::Fp8, &format!("torch fp8 gemm, fast={fast}"));
        assert_eq!(n, 32.0);
        assert!(mean < 0.13, "mean {:.1}%", 100.0 * mean);
        assert!(worst.abs() < 0.65, "worst {:.1}%", 100.0 * worst);
    }
}

/// SDPA on the H100 over 512-32k tokens, the backward with the harness's gradient
/// accumulation counted as on the H200: FlashAttention-2 mean 8.7% (the model 8.1% too fast:
/// forward +9.6%, backward +6.6%), cuDNN 7.6% (-6.8% signed: forward -11.0%, backward -2.6%);
/// at 32k tokens cuDNN within -9.1% to +5.4%, FlashAttention-2 within -3.4% to +11.6%: the
/// kernels' rate holds at long sequences, as modelled. (13.6% and 11.1% before session 27
/// counted the accumulation, which made PyTorch's FlashAttention-2 backward look 20-50% slower
/// than the paper's at 512-2k tokens.)
#[test]
fn sdpa_attention_on_an_h100_against_the_model() {
    compare_sdpa(&H100, "attention", [0.10, 0.09], 56.0);
}

/// The memory-bound kernels on the H100 reach larger shares of the copy's rate than on the
/// H200 whose shares the catalog holds (elementwise ones the copy's own: GeLU 0.96-1.01, add
/// 1.02; LayerNorm 0.54-0.79, softmax 0.44-0.79, dropout 0.84, fused AdamW 0.88, foreach
/// AdamW 0.32); the catalog's shares charge them 14% slow on average there. A per-kernel rate
/// cap shared by both cards (their SMs and clocks are the same) does no better across the two
/// (12-14%), so the shares stay; this test keeps the comparison and fails if the H100's copy
/// leaves the preset's streaming rate (0.85 of 3.35 TB/s; 0.89 measured).
#[test]
fn memory_kernels_on_an_h100_against_the_catalog() {
    let m = H100.microbench();
    let rows = m["memory"].as_array().expect("memory rows");
    let copy = rows.iter().find(|r| r["op"] == "copy").unwrap()["gbps"].as_f64().unwrap();
    let family = |op: &str| match op {
        "layernorm" => Some("ln1"),
        "softmax" => Some("softmax"),
        "gelu" | "gelu_tanh" => Some("act"),
        "dropout" => Some("attn_dropout"),
        "adamw_fused" => Some("optimizer"),
        "adamw_foreach" => Some("optimizer_foreach"),
        _ => None,
    };
    let (mut sum, mut n) = (0.0, 0.0);
    for r in rows {
        let Some(f) = family(r["op"].as_str().unwrap()) else { continue };
        let share = r["gbps"].as_f64().unwrap() / copy;
        let catalog = memory_kernel_efficiency(Some(GpuArch::Hopper), f);
        println!("h100 {} {}: {share:.3} of the copy, catalog {catalog:.2}", r["op"], r["width"]);
        sum += (catalog - share).abs() / share;
        n += 1.0;
    }
    println!("h100 memory kernels: the catalog's shares {:.1}% off on average over {n}", 100.0 * sum / n);
    assert_eq!(n, 10.0);
    assert!(sum / n < 0.2, "{:.1}%", 100.0 * sum / n);
    assert!((copy / 3350.0 - 0.85).abs() < 0.06, "copy {copy} GB/s");
}

/// Kernel-selection cliffs on the H100: each SDPA backend over head dimensions 64-256 (4,096
/// tokens, 16 heads, causal or not; `attention_hdim`, a third device call). cuDNN 9.19 runs 72
/// and 80 at hdim 96's rate for their FLOPs, 112 at 128's, 160 at 192's and 224 at 256's
/// (its forward at 72 is slower than at 64: 384 against 470 TFLOP/s), and its backward drops
/// by a third above 128 (486 at 128, 276-332 from 160 to 256): the catalog's cuDNN pads to
/// those head dimensions and takes that backward step since session 25 (before: mean 19.4%,
/// the odd head dimensions' backward up to +74% too fast). PyTorch's FlashAttention-2 pads as
/// the flash-attn templates say (160 and 224 run as 192 and 256), 7% slower than the model on
/// average (forward +3.5%, backward +11.3%, the harness's gradient accumulation counted; 11.3%
/// before), about as at every other shape on both GPUs.
#[test]
fn attention_head_dimension_cliffs_on_an_h100() {
    let worst = compare_sdpa(&H100, "attention_hdim", [0.10, 0.12], 40.0);
    assert!(worst.iter().all(|w| w.abs() < 0.3), "{worst:?}");
    // The cliff itself: cuDNN's forward does less useful work a second at 72 than at 64.
    let fwd = |d: f64| predicted_tflops(GpuArch::Hopper, FlashKernel::Cudnn, "fwd", 4096.0, d, true);
    assert!(
        fwd(72.0) < fwd(64.0) && fwd(112.0) < fwd(128.0),
        "{} {} {} {}",
        fwd(64.0),
        fwd(72.0),
        fwd(112.0),
        fwd(128.0)
    );
}

/// Attention held for 10 s on the H200 (`block.py --only-sustained`, session 32,
/// `traces/2026-11-27-cuda-h200/sustained.json`: causal, 2 x 32 heads x 8,192 tokens x 128,
/// forward and backward back to back, each half second's rate) against the model's kernels:
/// the last five windows' mean, after the GPU settled at its power limit. The catalog's rates
/// are short benchmarks' (the published FlashAttention ones and this harness's bursts); the
/// run's first window was within 2% of its last for both backends, and the model charges
/// cuDNN's 6.7% and FlashAttention-2's 2.2% more time than they took.
#[test]
fn sustained_attention_on_an_h200_against_the_model() {
    let v = repo_json("traces/2026-11-27-cuda-h200/sustained.json");
    let mut worst = 0.0f64;
    for (key, kernel) in [("sustained_sdpa_cudnn", FlashKernel::Cudnn), ("sustained_sdpa_flash", FlashKernel::V2)] {
        let w = v[key]["windows"].as_array().unwrap();
        let last: Vec<f64> = w[w.len() - 5..].iter().map(|x| x["tflops"].as_f64().unwrap()).collect();
        let measured = last.iter().sum::<f64>() / 5.0;
        let fwd = predicted_tflops(GpuArch::Hopper, kernel, "fwd", 8192.0, 128.0, true);
        let bwd = predicted_tflops(GpuArch::Hopper, kernel, "bwd", 8192.0, 128.0, true);
        // Forward 1 part of the FLOPs, backward 2.5: the combined rate.
        let predicted = 3.5 / (1.0 / fwd + 2.5 / bwd);
        let err = (predicted - measured) / measured;
        println!("h200 sustained {key}: measured {measured:.0} TFLOP/s, model {predicted:.0} ({:+.1}%)", 100.0 * err);
        worst = worst.max(err.abs());
    }
    assert!(worst < 0.08, "worst {:.1}%", 100.0 * worst);
}

/// `hardware::kernels::Persistent` against what `interference.py --delays` read on both Hopper
/// cards (session 32): every cuBLAS GEMM and cuDNN flash kernel launched one block per SM (a
/// grid of 132), the element-wise and norm kernels one per tile of data; and a copy issued
/// beside the persistent kernels waited (median wait at least a quarter of a call), beside the
/// others not beyond what sharing the memory costs it.
#[test]
fn hopper_gemm_and_cudnn_attention_kernels_are_persistent() {
    let hopper = sim::hardware::kernels::persistent_kernels(Some(GpuArch::Hopper));
    assert!(hopper.gemm && hopper.attention(FlashKernel::Cudnn) && !hopper.attention(FlashKernel::V2));
    let ampere = sim::hardware::kernels::persistent_kernels(Some(GpuArch::Ampere));
    assert!(!ampere.gemm && !ampere.attention(FlashKernel::Te));
    for gpu in ["h100", "h200"] {
        let v = repo_json(&format!("traces/2026-11-27-cuda-{gpu}/delays.json"));
        let sms = v["sms"].as_f64().unwrap();
        for t in v["targets"].as_array().unwrap() {
            let name = t["name"].as_str().unwrap();
            let mut waits: Vec<f64> = t["waits_s"].as_array().unwrap().iter().map(|w| w.as_f64().unwrap()).collect();
            waits.sort_by(f64::total_cmp);
            let median = waits[waits.len() / 2];
            let call = t["alone_s"].as_f64().unwrap();
            for k in t["kernels"].as_array().unwrap() {
                let kname = k["name"].as_str().unwrap();
                let blocks: f64 = k["grid"].as_array().unwrap().iter().map(|g| g.as_f64().unwrap()).product();
                if kname.starts_with("nvjet_sm90") || kname.contains("sdpa_sm90_flash") {
                    assert_eq!(blocks, sms, "{gpu} {name}: {kname}");
                } else {
                    assert!(blocks > sms, "{gpu} {name}: {kname} launched {blocks} blocks");
                }
            }
            if name.starts_with("gemm") && call > 1e-3 || name.starts_with("sdpa") {
                assert!(median > 0.25 * call, "{gpu} {name}: median wait {median} s of a {call} s call");
            }
        }
    }
}

/// GEMMs of 0.5 to 31 tiles per SM beside a kernel holding 8, 16 or 32 of an H100's 132 SMs
/// (`interference.py --waves`, session 32, `traces/2026-11-27-cuda-h100/waves.json`) against
/// the engine's charge (`engine::contention`: the waves of the GEMM's tiles, `cost::gemm_tiles`,
/// over the SMs left) and against the SMs' share it charged before: the waves follow the small
/// GEMMs' jumps (1.3-1.7x where the share says 1.06-1.3x) and over-charge the large ones a
/// little.
#[test]
fn gemms_beside_held_sms_lose_whole_waves_on_an_h100() {
    compare_waves("h100");
}

/// The same ten GEMMs on the H200 (session 32, `traces/2026-11-27-cuda-h200/waves.json`).
#[test]
fn gemms_beside_held_sms_lose_whole_waves_on_an_h200() {
    compare_waves("h200");
}

/// `gpu`'s `waves.json` against the waves and the SMs' share; asserts the waves' mean error
/// under 12% and under the share's.
fn compare_waves(gpu: &str) {
    let v = repo_json(&format!("traces/2026-11-27-cuda-{gpu}/waves.json"));
    let units = v["sms"].as_f64().unwrap();
    let (mut waves_err, mut share_err, mut n) = (0.0, 0.0, 0.0);
    for r in v["rows"].as_array().unwrap() {
        let (m, nn) = (r["m"].as_f64().unwrap(), r["n"].as_f64().unwrap());
        let tiles = sim::cost::gemm_tiles(Some(GpuArch::Hopper), units, 1.0, m, nn);
        for b in r["beside_spin"].as_array().unwrap() {
            if b["covered"].as_bool() != Some(true) {
                continue;
            }
            let held = b["held"].as_f64().unwrap();
            let measured = b["slowdown"].as_f64().unwrap();
            let waves = (tiles / (units - held)).ceil() / (tiles / units).ceil().max(1.0);
            let share = units / (units - held);
            println!(
                "{m}x{nn}: {tiles} tiles, {held} held: measured x{measured:.2}, waves x{waves:.2}, share x{share:.2}"
            );
            waves_err += (waves - measured).abs() / measured;
            share_err += (share - measured).abs() / measured;
            n += 1.0;
        }
    }
    let (waves_err, share_err) = (waves_err / n, share_err / n);
    println!(
        "{gpu} GEMMs beside held SMs: waves {:.1}% mean error, SM share {:.1}%",
        100.0 * waves_err,
        100.0 * share_err
    );
    assert!(n >= 25.0, "{n} points");
    assert!(waves_err < 0.12 && waves_err < share_err, "waves {waves_err}, share {share_err}");
}

/// LayerNorm and an add beside a copy or a reduction of 4-32 blocks of 512 threads streaming
/// through HBM (`interference.py`, session 32, both cards) against the engine's rule
/// (`hardware::kernels::memory_share_beside_kernel`: the side kernel moves its share of the
/// bytes in flight, of the preset's streaming bandwidth, or what it asks if less, and the
/// memory-bound kernel loses those bytes), and against the rule before it (the side kernel's
/// whole rate taken from the memory-bound kernel's, at least half left). The memory-bound
/// kernels' slowdowns: the share is within 6% on average on each card, and closer than the rule
/// before. The side kernel's own slowdown, issued as ~1 ms copies (`chunked`, as collectives
/// issued bucket by bucket): the share never says it slows less than measured, and on average
/// it says at most 1.5x the measured slowdown.
#[test]
fn memory_bound_kernels_beside_streaming_side_kernels() {
    use sim::hardware::kernels::memory_share_beside_kernel;
    for (gpu, device) in [("h100", "h100-sxm"), ("h200", "h200")] {
        let v = repo_json(&format!("traces/2026-11-27-cuda-{gpu}/interference.json"));
        let d = sim::hardware::catalog::device(device).unwrap();
        let sms = v["sms"].as_f64().unwrap();
        let threads = v["threads_per_side_block"].as_f64().unwrap();
        let stream = d.mem_bandwidth_bytes_per_s * d.mem_efficiency;
        let side_rate = |kind: &str, blocks: u64| {
            v["side_alone"].as_array().unwrap().iter().find(|r| r["kind"] == kind && r["blocks"] == blocks).unwrap()
                ["bytes_per_s"]
                .as_f64()
                .unwrap()
        };
        let (mut err, mut err_before, mut n) = (0.0, 0.0, 0.0);
        let (mut side_ratio, mut side_n) = (0.0, 0.0);
        for t in v["targets"].as_array().unwrap().iter().filter(|t| t["kind"] == "memory") {
            let name = t["name"].as_str().unwrap();
            // LayerNorm is the catalog's `ln1` family; the add streams at the copy's rate (an
            // element-wise kernel of no slower family).
            let family = if name.starts_with("layernorm") { "ln1" } else { "add" };
            let e = memory_kernel_efficiency(Some(GpuArch::Hopper), family);
            for b in t["beside"].as_array().unwrap() {
                let kind = b["side"].as_str().unwrap();
                if kind != "copy" && kind != "reduce" {
                    continue;
                }
                let blocks = b["blocks"].as_u64().unwrap();
                let used = side_rate(kind, blocks);
                let moved = memory_share_beside_kernel(blocks as f64 * threads, sms, stream, used, e);
                let charged = 1.0 / (1.0 - moved / stream);
                let before = 1.0 / (1.0 - used / stream).max(0.5);
                let measured = b["slowdown"].as_f64().unwrap();
                println!(
                    "{gpu} {name} beside {kind} {blocks}: measured x{measured:.3}, charged x{charged:.3} (before x{before:.3})"
                );
                err += (charged - measured).abs() / measured;
                err_before += (before - measured).abs() / measured;
                n += 1.0;
            }
            for c in t["chunked"].as_array().unwrap() {
                let blocks = c["blocks"].as_u64().unwrap();
                let used = side_rate("copy", blocks);
                let measured = used / c["side_bytes_per_s"].as_f64().unwrap();
                let charged = used / memory_share_beside_kernel(blocks as f64 * threads, sms, stream, used, e);
                println!(
                    "{gpu} copy {blocks} in ~1 ms kernels beside {name}: measured x{measured:.2}, charged x{charged:.2}"
                );
                assert!(
                    charged >= measured,
                    "{gpu} {name}: the copy charged x{charged} below the measured x{measured}"
                );
                side_ratio += charged / measured;
                side_n += 1.0;
            }
        }
        let (err, err_before, side_ratio) = (err / n, err_before / n, side_ratio / side_n);
        println!(
            "{gpu}: memory-bound kernels {:.1}% off on average over {n} (the rule before {:.1}%); the copy charged {side_ratio:.2}x its measured slowdown on average",
            100.0 * err,
            100.0 * err_before
        );
        assert!(n == 14.0 && side_n == 6.0, "{gpu}: {n} and {side_n} points");
        assert!(err < 0.06 && err < err_before, "{gpu}: {err:.3} against {err_before:.3}");
        assert!(side_ratio < 1.5, "{gpu}: {side_ratio:.2}");
    }
}
