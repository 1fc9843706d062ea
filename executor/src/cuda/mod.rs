//! The CUDA backend: NVIDIA GPUs, through the driver, cuBLAS and NVRTC loaded at run time.
//!
//! With the `cuda` feature, `enabled.rs` is the backend; without it, `disabled.rs` is a stub
//! with the same API that has no devices and says how to build it in, so callers never see a
//! `cfg`. Either way the backend never panics on a machine without a GPU or driver: it reports
//! no devices, and `open` explains why. What a device runs for an op (kernel, shapes, buffer
//! sizes, the scale for ops over the buffer cap) is worked out in `plan.rs`, which needs no GPU
//! and is tested everywhere.

#[cfg(not(feature = "cuda"))]
mod disabled;
#[cfg(feature = "cuda")]
mod enabled;
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
mod host;
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
mod plan;

#[cfg(not(feature = "cuda"))]
pub use disabled::CudaBackend;
#[cfg(feature = "cuda")]
pub use enabled::CudaBackend;

#[cfg(test)]
mod tests {
    use super::CudaBackend;
    use crate::test_ops::op;
    use crate::{Backend, OpContext};
    use sim::workload::OpClass;

    #[cfg(feature = "cuda")]
    use super::enabled::driver_present as driver_loads;

    /// Whether this binary can reach a GPU driver at all.
    #[cfg(not(feature = "cuda"))]
    fn driver_loads() -> bool {
        false
    }

    #[test]
    fn never_panics_and_explains_missing_devices() {
        let backend = CudaBackend::new();
        assert_eq!(backend.name(), "cuda");
        let count = backend.device_count();
        if !driver_loads() {
            assert_eq!(count, 0);
        }
        // Past the last device (the first, on a machine with none) opening fails and says why.
        let err = backend.open(count).err().expect("no device past the last");
        let says_why = ["GPU", "driver", "--features cuda"].iter().any(|w| err.0.contains(w));
        assert!(says_why, "{err}");
        if count == 0 {
            let err = backend.open(0).err().expect("no device 0");
            assert!(["GPU", "driver", "--features cuda"].iter().any(|w| err.0.contains(w)), "{err}");
        }
    }

    #[test]
    fn the_registry_hands_it_out() {
        let backend = crate::backend("cuda").expect("cuda is a known backend");
        assert_eq!(backend.name(), "cuda");
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn the_stub_says_how_to_build_it_in() {
        let err = CudaBackend::new().open(0).err().expect("the stub opens nothing");
        assert!(err.0.contains("not built into this binary") && err.0.contains("--features cuda"), "{err}");
    }

    /// Runs every kind of op and copy on device 0 where there is one (skipped elsewhere): each
    /// takes a positive, finite time, and twice the work takes longer.
    #[test]
    fn runs_every_op_on_a_gpu_when_there_is_one() {
        let backend = CudaBackend::new();
        if backend.device_count() == 0 {
            eprintln!("no CUDA device: GPU run not checked");
            return;
        }
        let mut dev = backend.open(0).expect("device 0 opens");
        assert!(dev.name().starts_with("cuda:0"), "{}", dev.name());
        for element_bytes in [2.0, 4.0] {
            let ctx = OpContext { hidden: 1024, seq_len: 512, element_bytes };
            let act = 2.0 * element_bytes * 4096.0 * 1024.0;
            let gemm = OpClass::Gemm { batch: 1.0, m: 4096.0, n: 3072.0, k: 1024.0 };
            let scores = OpClass::Gemm { batch: 32.0, m: 512.0, n: 512.0, k: 64.0 };
            let ops = [
                op("qkv", gemm, 0.0, false),
                op("qkv", gemm, 0.0, true),
                op("scores", scores, 0.0, false),
                op("scores", scores, 0.0, true),
                op("ln1", OpClass::Memory, act, false),
                op("softmax", OpClass::Memory, act, true),
                op("act", OpClass::Memory, act, false),
                op("attn_dropout", OpClass::Memory, act, false),
                op("dropout_residual", OpClass::Memory, act, true),
                op("embedding", OpClass::Memory, act, false),
                op("optimizer", OpClass::Memory, 28e6, false),
                op("cpu_optimizer", OpClass::Memory, 28e6, false),
            ];
            for o in &ops {
                let t = dev.run_op(o, &ctx).unwrap_or_else(|e| panic!("{}: {e}", o.spec.name));
                assert!(t > 0.0 && t.is_finite(), "{} took {t} s", o.spec.name);
            }
            // Medians of 9 runs: one timed run alone can start on a GPU still at idle clocks
            // (on an H200 a 1x GEMM once took longer than the 4x one right after it).
            let mut median_s = |o: &sim::lower::OpInstance| {
                let mut v: Vec<f64> = (0..9).map(|_| dev.run_op(o, &ctx).unwrap()).collect();
                v.sort_by(f64::total_cmp);
                v[4]
            };
            let small = median_s(&op("qkv", gemm, 0.0, false));
            let big = OpClass::Gemm { batch: 1.0, m: 4.0 * 4096.0, n: 3072.0, k: 1024.0 };
            let big = median_s(&op("qkv", big, 0.0, false));
            assert!(big > small, "4x the FLOPs took {big} s, 1x {small} s");
        }
        for to_device in [true, false] {
            let t = dev.copy(64 << 20, to_device).unwrap();
            assert!(t > 0.0 && t.is_finite());
        }
        assert_eq!(dev.copy(0, true), Ok(0.0));
        dev.synchronize().unwrap();
    }
}
