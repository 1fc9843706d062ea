//! Compute kernels against published microbenchmarks (experiments/validation/kernels/):
//! fused attention per kernel generation, sequence length, head dimension and mask; and
//! GEMM shape effects.

use serde_json::Value;
use sim::cost::attention::efficiency;
use sim::hardware::kernels::{Attention, FlashKernel, GpuArch, measured_peak_tflops};

/// Predicted TFLOP/s of one published point (forward + backward combines the two passes
/// as the benchmark times them: 3.5 F / (F / fwd + 2.5 F / bwd)).
pub fn predicted_tflops(arch: GpuArch, kernel: FlashKernel, pass: &str, s: f64, d: f64, causal: bool) -> f64 {
    let peak = measured_peak_tflops(arch);
    let fwd = efficiency(Some(arch), kernel, s, 0.0, d, causal, false) * peak;
    let bwd = efficiency(Some(arch), kernel, s, 0.0, d, causal, true) * peak;
    match pass {
        "fwd" => fwd,
        "bwd" => bwd,
        _ => 3.5 / (1.0 / fwd + 2.5 / bwd),
    }
}

fn published() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/experiments/validation/kernels/published.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("published.json")).expect("json")
}

/// Every published point within 25% and the mean error under 5%: the model reproduces the
/// anchors (16k) exactly by construction, so the check is the 512-8k points and the causal
/// ramp. The worst points (+20%) are FlashAttention-3's causal hdim-64 forward at 512 and
/// 1k tokens: one per-query-block overhead per kernel, read at hdim 128, is too small for
/// FA3's hdim-64 causal schedule.
#[test]
fn fused_attention_matches_the_published_benchmarks() {
    let v = published();
    let seqs: Vec<f64> = v["seq"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
    let (mut sum, mut n, mut worst) = (0.0, 0.0, (0.0, String::new()));
    for p in v["points"].as_array().unwrap() {
        let arch = if p["gpu"] == "h100" { GpuArch::Hopper } else { GpuArch::Ampere };
        let Some(Attention::Fused(kernel)) = Attention::parse(p["kernel"].as_str().unwrap()) else { panic!() };
        let d = p["head_dim"].as_f64().unwrap();
        let causal = p["causal"].as_bool().unwrap();
        for (s, m) in seqs.iter().zip(p["tflops"].as_array().unwrap()) {
            let m = m.as_f64().unwrap();
            if m == 0.0 {
                continue;
            }
            let pred = predicted_tflops(arch, kernel, p["pass"].as_str().unwrap(), *s, d, causal);
            let err = (pred - m).abs() / m;
            println!(
                "| {} | {} | {} | {d} | {causal} | {s} | {m} | {pred:.0} | {:+.1}% |",
                p["gpu"].as_str().unwrap(),
                p["kernel"].as_str().unwrap(),
                p["pass"].as_str().unwrap(),
                100.0 * (pred - m) / m
            );
            sum += err;
            n += 1.0;
            if err > worst.0 {
                worst = (err, format!("{p} at {s}: predicted {pred:.0}, published {m}"));
            }
        }
    }
    let mean = sum / n;
    assert!(worst.0 < 0.25, "worst {:.1}%: {}", 100.0 * worst.0, worst.1);
    println!("mean {:.2}% over {n} points; worst {:.1}%: {}", 100.0 * mean, 100.0 * worst.0, worst.1);
    assert!(mean < 0.05, "mean {:.1}% over {n} points", 100.0 * mean);
}

/// The cliffs: a head dimension no kernel takes (over 256, or not a multiple of 8) falls
/// back to materialised attention; flash-attn 1.x and Triton stop at 128; fp32 never fuses.
#[test]
fn unsupported_head_dimensions_and_fp32_fall_back_to_materialised_attention() {
    let flash = Attention::parse("flash").unwrap();
    assert_eq!(flash.fused_kernel(128.0, true), Some(FlashKernel::Auto));
    assert_eq!(flash.fused_kernel(288.0, true), None);
    assert_eq!(flash.fused_kernel(100.0, true), None);
    assert_eq!(flash.fused_kernel(128.0, false), None);
    assert_eq!(Attention::parse("triton").unwrap().fused_kernel(192.0, true), None);
    assert_eq!(Attention::parse("flash2").unwrap().fused_kernel(192.0, true), Some(FlashKernel::V2));
}

/// "flash" means the device's generation: FlashAttention-3 on Hopper, -2 on Ampere.
#[test]
fn flash_resolves_to_the_generation_of_the_device() {
    assert_eq!(FlashKernel::Auto.resolve(Some(GpuArch::Hopper)), FlashKernel::V3);
    assert_eq!(FlashKernel::Auto.resolve(Some(GpuArch::Ampere)), FlashKernel::V2);
    let a = efficiency(Some(GpuArch::Hopper), FlashKernel::Auto, 4096.0, 0.0, 128.0, true, false);
    let b = efficiency(Some(GpuArch::Hopper), FlashKernel::V3, 4096.0, 0.0, 128.0, true, false);
    assert_eq!(a, b);
}
