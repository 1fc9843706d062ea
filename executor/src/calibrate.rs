//! Calibration: microbenchmarks on one device of a backend, and the fit of the cost model's
//! parameters with confidence intervals.
//!
//! - GEMMs over a grid of shapes: the large-GEMM rate R and a fixed overhead b from
//!   `t = flops / (R * k_eff(k)) + b` (least squares; k_eff is the simulator's K-loop term,
//!   so the fit and the model agree on what R means);
//! - a streaming op over sizes: memory bandwidth and per-op overhead (`t = bytes / B + b`);
//! - the smallest op: launch overhead (median);
//! - copies between two threads (the CPU's device-to-device link) over sizes: bandwidth and
//!   latency (`t = bytes / beta + alpha`); on a GPU, copies between host and device memory
//!   instead (the host link; peer-to-peer links between GPUs are not measured).
//!
//! A CPU runs small shapes in f32 (it computes in f32 whatever the training precision); a GPU
//! runs shapes that fill it (GEMMs up to 8192, memory ops up to 1 GiB) in bf16 with f32
//! accumulation, the precision GPUs train in, and the profile records which ([`Scale`]).
//!
//! Each fit reports the 95% interval of its slope from the Student t distribution (statrs).

use crate::replay::median;
use crate::{Device, OpContext, Result};
use serde::Serialize;
use sim::lower::OpInstance;
use sim::workload::{OpClass, OpSpec, Saved};
use statrs::distribution::{ContinuousCDF, StudentsT};
use std::time::Instant;

pub const SCHEMA: &str = "trainsim-profile/1";

/// A straight-line fit y = slope * x + intercept with the slope's 95% interval.
#[derive(Clone, Debug, Serialize)]
pub struct Fit {
    pub slope: f64,
    pub intercept: f64,
    pub slope_ci95: [f64; 2],
    pub r2: f64,
}

/// Ordinary least squares.
pub fn fit_line(x: &[f64], y: &[f64]) -> Fit {
    let n = x.len() as f64;
    let mx = x.iter().sum::<f64>() / n;
    let my = y.iter().sum::<f64>() / n;
    let sxx: f64 = x.iter().map(|a| (a - mx).powi(2)).sum();
    let sxy: f64 = x.iter().zip(y).map(|(a, b)| (a - mx) * (b - my)).sum();
    let slope = sxy / sxx;
    let intercept = my - slope * mx;
    let ss_res: f64 = x.iter().zip(y).map(|(a, b)| (b - (slope * a + intercept)).powi(2)).sum();
    let ss_tot: f64 = y.iter().map(|b| (b - my).powi(2)).sum();
    let dof = (n - 2.0).max(1.0);
    let se = (ss_res / dof / sxx).sqrt();
    let t = StudentsT::new(0.0, 1.0, dof).map(|d| d.inverse_cdf(0.975)).unwrap_or(2.0);
    Fit {
        slope,
        intercept,
        slope_ci95: [slope - t * se, slope + t * se],
        r2: if ss_tot > 0.0 { 1.0 - ss_res / ss_tot } else { 1.0 },
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct GemmPoint {
    pub batch: f64,
    pub m: f64,
    pub n: f64,
    pub k: f64,
    pub seconds: f64,
    pub flops_per_s: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct SizePoint {
    pub bytes: f64,
    pub seconds: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct GemmFit {
    /// Large-GEMM rate (FLOP/s) and its 95% interval.
    pub flops_per_s: f64,
    pub flops_per_s_ci95: [f64; 2],
    pub overhead_s: f64,
    pub points: Vec<GemmPoint>,
}

#[derive(Clone, Debug, Serialize)]
pub struct OpRate {
    pub name: String,
    pub bytes_per_s: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct BandwidthFit {
    pub bytes_per_s: f64,
    pub bytes_per_s_ci95: [f64; 2],
    pub latency_s: f64,
    pub points: Vec<SizePoint>,
}

/// A calibration profile (versioned JSON).
#[derive(Clone, Debug, Serialize)]
pub struct Profile {
    pub schema: &'static str,
    pub backend: String,
    pub device: String,
    /// Precision of the GEMMs and memory ops measured ("fp32" or "bf16") and its bytes per
    /// element: the GEMM rate describes training at that precision only.
    pub precision: &'static str,
    pub element_bytes: f64,
    /// How many devices ran the microbenchmarks at once.
    pub devices_measured_together: usize,
    pub created: String,
    pub gemm: GemmFit,
    pub memory: BandwidthFit,
    /// Streaming rate of each kind of memory-bound op (bytes it moves per second).
    pub memory_ops: Vec<OpRate>,
    pub launch_s: f64,
    /// The link between two devices: on the CPU, copies between two threads. Not measured on
    /// a GPU (null).
    pub link: Option<BandwidthFit>,
    /// On a GPU, copies from pinned host memory to the device (the offload path); null on
    /// the CPU.
    pub host_link: Option<BandwidthFit>,
    /// Launch-to-launch spread of one kernel's time: the robust relative standard deviation
    /// (1.4826 x the median absolute deviation over the median) of [`SPREAD_RUNS`] runs of a
    /// mid-size GEMM after the largest ran back to back for `kernel_jitter_settled_s`, the median over
    /// the devices measured. What the simulator's `simulation.kernel_jitter` is (a calibrated
    /// scenario takes it on a GPU only when it was measured settled, [`GPU_SPREAD_SETTLE_S`]).
    pub kernel_jitter: f64,
    /// Seconds GEMMs ran back to back before the spread was timed (0 in profiles from before
    /// session 40, timed after one warm-up run, and on CPUs).
    pub kernel_jitter_settled_s: f64,
}

/// How long a GPU runs its largest calibration GEMM back to back before the spread's runs are
/// timed. Right after a
/// warm-up a GPU's clock still swings toward its power limit, 3-6% for seconds; 15 s of
/// 8192-cubed GEMMs settled an H200 at a 1.5% spread (`experiments/executor/gpu/jitter.py`,
/// `traces/2026-11-27-cuda-h200/`). A 2048-cubed GEMM draws less power; the same 15 s is kept.
pub const GPU_SPREAD_SETTLE_S: f64 = 15.0;

/// Timed runs of one GEMM for [`Profile::kernel_jitter`].
pub const SPREAD_RUNS: usize = 31;

/// Robust relative spread of `v`: 1.4826 x the median absolute deviation over the median (the
/// standard deviation over the mean for normal draws, unmoved by a few outliers).
pub fn robust_spread(v: &[f64]) -> f64 {
    let m = median(v);
    if m <= 0.0 {
        return 0.0;
    }
    let dev: Vec<f64> = v.iter().map(|x| (x - m).abs()).collect();
    1.4826 * median(&dev) / m
}

/// The sizes and precision calibration measures at, per kind of device.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scale {
    /// Whether the device is a GPU.
    pub gpu: bool,
    /// Sides of the square GEMMs (also the tall-skinny and batched shapes).
    pub gemm_sizes: &'static [f64],
    /// Streaming op sizes, MiB.
    pub memory_mib: &'static [f64],
    /// Size of each named memory op, MiB.
    pub op_mib: f64,
    /// Side of the GEMM timed for the launch-to-launch spread.
    pub spread_side: f64,
    /// Seconds the largest GEMM runs back to back before that GEMM's runs are timed.
    pub spread_settle_s: f64,
    /// Bytes per element of operands and activations.
    pub element_bytes: f64,
}

impl Scale {
    /// A CPU's scale (small shapes, f32), or with `quick` fewer of them.
    pub fn cpu(quick: bool) -> Scale {
        Scale {
            gpu: false,
            gemm_sizes: if quick { &[64.0, 128.0, 256.0, 384.0] } else { &[64.0, 128.0, 256.0, 384.0, 512.0, 768.0] },
            memory_mib: &[1.0, 4.0, 16.0, 64.0],
            op_mib: 16.0,
            spread_side: 256.0,
            spread_settle_s: 0.0,
            element_bytes: 4.0,
        }
    }

    /// A GPU's scale: shapes that fill an H100 (a 768-wide GEMM is launch-bound on it), bf16.
    pub fn gpu(quick: bool) -> Scale {
        Scale {
            gpu: true,
            gemm_sizes: if quick {
                &[1024.0, 2048.0, 4096.0, 8192.0]
            } else {
                &[512.0, 1024.0, 2048.0, 3072.0, 4096.0, 6144.0, 8192.0]
            },
            memory_mib: &[16.0, 64.0, 256.0, 1024.0],
            op_mib: 256.0,
            spread_side: 2048.0,
            spread_settle_s: GPU_SPREAD_SETTLE_S,
            element_bytes: 2.0,
        }
    }

    /// The scale for `backend` with a first device called `device` ("cuda:0 (NVIDIA ...)",
    /// "torch cuda:0", "cpu thread 0").
    pub fn for_device(backend: &str, device: &str, quick: bool) -> Scale {
        if backend == "cuda" || device.contains("cuda") { Scale::gpu(quick) } else { Scale::cpu(quick) }
    }

    pub fn precision(&self) -> &'static str {
        crate::Precision::for_element_bytes(self.element_bytes).name()
    }
}

/// The simulator's K-loop efficiency term (see sim::cost): prologue and epilogue of two
/// 32-deep steps.
fn k_eff(k: f64) -> f64 {
    (k / 32.0) / (k / 32.0 + 2.0)
}

fn gemm_op(batch: f64, m: f64, n: f64, k: f64) -> OpInstance {
    let flops = 2.0 * batch * m * n * k;
    OpInstance {
        spec: OpSpec {
            name: "calibration_gemm",
            class: OpClass::Gemm { batch, m, n, k },
            forward_flops: flops,
            forward_bytes: batch * 4.0 * (m * k + k * n + m * n),
            backward_flops: 2.0 * flops,
            backward_bytes: 0.0,
            saved: Saved::default(),
        },
        backward: false,
        on_host: false,
        nvme_bytes: 0.0,
        class: 0,
        sm_share: 1.0,
        part: sim::lower::OpPart::Whole,
        rows: 1.0,
        chunks: 1.0,
    }
}

fn stream_op(bytes: f64) -> OpInstance {
    OpInstance {
        spec: OpSpec {
            name: "calibration_copy",
            class: OpClass::Memory,
            forward_flops: 0.0,
            forward_bytes: bytes,
            backward_flops: 0.0,
            backward_bytes: bytes,
            saved: Saved::default(),
        },
        backward: false,
        on_host: false,
        nvme_bytes: 0.0,
        class: 0,
        sm_share: 1.0,
        part: sim::lower::OpPart::Whole,
        rows: 1.0,
        chunks: 1.0,
    }
}

/// Median of `reps` timed runs after one warm-up.
fn time(dev: &mut dyn Device, op: &OpInstance, ctx: &OpContext, reps: usize) -> Result<f64> {
    dev.run_op(op, ctx)?;
    let v: Vec<f64> = (0..reps).map(|_| dev.run_op(op, ctx)).collect::<Result<_>>()?;
    Ok(median(&v))
}

/// FLOP/s of one reference GEMM (384 x 384 x 384, median of 15 after a warm-up): a probe of
/// how fast the machine runs right now, to tell a drifting shared machine from a model error.
pub fn reference_gemm_flops_per_s(dev: &mut dyn Device) -> Result<f64> {
    let ctx = OpContext { hidden: 1024, seq_len: 1024, element_bytes: 4.0 };
    let op = gemm_op(1.0, 384.0, 384.0, 384.0);
    let t = time(dev, &op, &ctx, 15)?;
    Ok(op.spec.forward_flops / t)
}

/// Raw measurements of one device.
struct Raw {
    gemm: Vec<GemmPoint>,
    memory: Vec<SizePoint>,
    ops: Vec<(String, f64)>,
    launch_s: f64,
    spread: f64,
}

/// The op names whose kernels differ on a backend, each measured as a streaming op of its
/// own (norms, softmax, activation, dropout, residual, optimizer step, plain copies).
pub const MEMORY_OPS: [&str; 7] =
    ["ln1", "softmax", "act", "attn_dropout", "dropout_residual", "optimizer", "embedding"];

fn named_op(name: &'static str, bytes: f64) -> OpInstance {
    let mut op = stream_op(bytes);
    op.spec.name = name;
    op
}

fn measure(dev: &mut dyn Device, scale: Scale, quick: bool, progress: &(dyn Fn(&str) + Sync)) -> Result<Raw> {
    let ctx = OpContext { hidden: 1024, seq_len: 1024, element_bytes: scale.element_bytes };
    let reps = if quick { 3 } else { 7 };
    // GEMMs: squares and the shapes transformers use (tall-skinny, batched attention).
    let mut shapes: Vec<(f64, f64, f64, f64)> = Vec::new();
    for &s in scale.gemm_sizes {
        shapes.push((1.0, s, s, s));
        shapes.push((1.0, 4.0 * s, s, s));
        shapes.push((8.0, s, s, 64.0));
    }
    let mut gemm = Vec::new();
    for (i, &(b, m, n, k)) in shapes.iter().enumerate() {
        progress(&format!("gemm {}/{}: {b}x{m}x{n}x{k}", i + 1, shapes.len()));
        let t = time(dev, &gemm_op(b, m, n, k), &ctx, reps)?;
        gemm.push(GemmPoint { batch: b, m, n, k, seconds: t, flops_per_s: 2.0 * b * m * n * k / t });
    }
    let mut memory = Vec::new();
    let sizes = scale.memory_mib.len();
    for (i, mib) in scale.memory_mib.iter().enumerate() {
        progress(&format!("memory {}/{sizes}: {mib} MiB", i + 1));
        let bytes = mib * 1024.0 * 1024.0;
        memory.push(SizePoint { bytes, seconds: time(dev, &stream_op(bytes), &ctx, reps)? });
    }
    let mut ops = Vec::new();
    for name in MEMORY_OPS {
        progress(&format!("op kind {name}"));
        let bytes = scale.op_mib * 1024.0 * 1024.0;
        ops.push((name.to_string(), bytes / time(dev, &named_op(name, bytes), &ctx, reps)?));
    }
    progress("launch overhead");
    let launch_s = time(dev, &stream_op(64.0), &ctx, 31)?;
    progress("kernel time spread");
    let side = scale.spread_side;
    let probe = gemm_op(1.0, side, side, side);
    // Settle first: the largest GEMM back to back (a device busy as in training, not idling
    // between short probes), then the probe's runs.
    let largest = scale.gemm_sizes.iter().copied().fold(side, f64::max);
    let load = gemm_op(1.0, largest, largest, largest);
    let mut settled = 0.0;
    while settled < scale.spread_settle_s {
        settled += dev.run_op(&load, &ctx)?;
    }
    dev.run_op(&probe, &ctx)?;
    let runs: Vec<f64> = (0..SPREAD_RUNS).map(|_| dev.run_op(&probe, &ctx)).collect::<Result<_>>()?;
    Ok(Raw { gemm, memory, ops, launch_s, spread: robust_spread(&runs) })
}

/// Run the microbenchmarks on every device in `devs` at once (devices of a training step
/// all work together, sharing memory bandwidth and power) and fit the profile from the
/// per-point medians across devices. `progress` reports on device 0's progress.
pub fn calibrate(
    backend: &str,
    mut devs: Vec<Box<dyn Device>>,
    created: &str,
    quick: bool,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<Profile> {
    let device = devs.first().map(|d| d.name()).unwrap_or_default();
    let scale = Scale::for_device(backend, &device, quick);
    let silent = |_: &str| {};
    let raws: Vec<Result<Raw>> = std::thread::scope(|s| {
        let handles: Vec<_> = devs
            .iter_mut()
            .enumerate()
            .map(|(i, d)| {
                let p: &(dyn Fn(&str) + Sync) = if i == 0 { progress } else { &silent };
                s.spawn(move || measure(d.as_mut(), scale, quick, p))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(crate::ExecError("a calibration thread panicked".into()))))
            .collect()
    });
    let raws: Vec<Raw> = raws.into_iter().collect::<Result<_>>()?;
    let med = |f: &dyn Fn(&Raw) -> f64| median(&raws.iter().map(f).collect::<Vec<_>>());
    let first = &raws[0];
    let points: Vec<GemmPoint> = (0..first.gemm.len())
        .map(|i| {
            let t = med(&|r| r.gemm[i].seconds);
            let p = &first.gemm[i];
            GemmPoint { seconds: t, flops_per_s: 2.0 * p.batch * p.m * p.n * p.k / t, ..p.clone() }
        })
        .collect();
    // t = (flops / k_eff) * (1/R) + overhead.
    let x: Vec<f64> = points.iter().map(|p| 2.0 * p.batch * p.m * p.n * p.k / k_eff(p.k)).collect();
    let y: Vec<f64> = points.iter().map(|p| p.seconds).collect();
    let f = fit_line(&x, &y);
    let gemm = GemmFit {
        flops_per_s: 1.0 / f.slope,
        flops_per_s_ci95: [1.0 / f.slope_ci95[1], 1.0 / f.slope_ci95[0].max(f64::MIN_POSITIVE)],
        overhead_s: f.intercept.max(0.0),
        points,
    };
    let memory = bandwidth(
        (0..first.memory.len())
            .map(|i| SizePoint { bytes: first.memory[i].bytes, seconds: med(&|r| r.memory[i].seconds) })
            .collect(),
    );
    let memory_ops = (0..first.ops.len())
        .map(|i| OpRate { name: first.ops[i].0.clone(), bytes_per_s: med(&|r| r.ops[i].1) })
        .collect();
    let launch_s = med(&|r| r.launch_s);
    let kernel_jitter = med(&|r| r.spread).min(1.0);
    let reps = if quick { 3 } else { 7 };
    let (link, host_link) = if scale.gpu {
        // Host to device: pinned copies on device 0.
        let mut points = Vec::new();
        for (i, mib) in [1.0, 4.0, 16.0, 64.0, 256.0].iter().enumerate() {
            progress(&format!("host link {}/5: {mib} MiB", i + 1));
            let bytes = (mib * 1024.0 * 1024.0) as usize;
            devs[0].copy(bytes, true)?;
            let v: Vec<f64> = (0..reps).map(|_| devs[0].copy(bytes, true)).collect::<Result<_>>()?;
            points.push(SizePoint { bytes: bytes as f64, seconds: median(&v) });
        }
        (None, Some(bandwidth(points)))
    } else {
        // Copies between two threads: the CPU devices' link.
        let mut points = Vec::new();
        for (i, mib) in [0.25, 1.0, 4.0, 16.0, 64.0].iter().enumerate() {
            progress(&format!("link {}/5: {mib} MiB", i + 1));
            let bytes = mib * 1024.0 * 1024.0;
            points.push(SizePoint { bytes, seconds: thread_copy_s(bytes as usize, reps) });
        }
        let mut link = bandwidth(points);
        // The copy itself has no fixed cost worth fitting; the latency is the peer's wake-up.
        link.latency_s = thread_wakeup_s(201);
        (Some(link), None)
    };
    Ok(Profile {
        schema: SCHEMA,
        backend: backend.into(),
        device,
        precision: scale.precision(),
        element_bytes: scale.element_bytes,
        devices_measured_together: raws.len(),
        created: created.into(),
        gemm,
        memory,
        memory_ops,
        launch_s,
        kernel_jitter,
        kernel_jitter_settled_s: scale.spread_settle_s,
        link,
        host_link,
    })
}

fn bandwidth(points: Vec<SizePoint>) -> BandwidthFit {
    let x: Vec<f64> = points.iter().map(|p| p.bytes).collect();
    let y: Vec<f64> = points.iter().map(|p| p.seconds).collect();
    let f = fit_line(&x, &y);
    BandwidthFit {
        bytes_per_s: 1.0 / f.slope,
        bytes_per_s_ci95: [1.0 / f.slope_ci95[1], 1.0 / f.slope_ci95[0].max(f64::MIN_POSITIVE)],
        latency_s: f.intercept.max(0.0),
        points,
    }
}

/// Median time for one copy of `bytes` into a buffer that already exists, as a transfer
/// between two CPU "devices" costs in a replay.
fn thread_copy_s(bytes: usize, reps: usize) -> f64 {
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    let v: Vec<f64> = (0..reps + 1)
        .map(|_| {
            let t0 = Instant::now();
            dst.copy_from_slice(&src);
            std::hint::black_box(&dst);
            t0.elapsed().as_secs_f64()
        })
        .collect();
    median(&v[1..])
}

/// Half the median round trip of a message between two threads: how long a device waits to
/// learn that another finished.
fn thread_wakeup_s(trips: usize) -> f64 {
    let (to, from_main) = std::sync::mpsc::channel::<()>();
    let (back, from_peer) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|s| {
        s.spawn(move || {
            while from_main.recv().is_ok() {
                if back.send(()).is_err() {
                    break;
                }
            }
        });
        let v: Vec<f64> = (0..trips)
            .map(|_| {
                let t0 = Instant::now();
                to.send(()).expect("peer alive");
                from_peer.recv().expect("peer answers");
                t0.elapsed().as_secs_f64() / 2.0
            })
            .collect();
        drop(to);
        median(&v)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GPUs (the cuda backend, or torch on a CUDA device) are timed at shapes that fill them,
    /// in bf16; CPUs at small f32 shapes.
    #[test]
    fn the_scale_follows_the_kind_of_device() {
        for (backend, device) in [("cuda", "cuda:0 (NVIDIA H200, sm_90, 140 GiB)"), ("torch", "torch cuda:0")] {
            let s = Scale::for_device(backend, device, false);
            assert!(s.gpu && s.precision() == "bf16" && s.element_bytes == 2.0, "{backend}: {s:?}");
            assert!(s.gemm_sizes.iter().cloned().fold(0.0, f64::max) >= 8192.0, "{backend}: {s:?}");
        }
        for (backend, device) in [("cpu", "cpu thread 0"), ("torch", "torch cpu:0")] {
            let s = Scale::for_device(backend, device, true);
            assert!(!s.gpu && s.precision() == "fp32" && s.element_bytes == 4.0, "{backend}: {s:?}");
            assert!(s.gemm_sizes.iter().all(|&n| n <= 768.0), "{backend}: {s:?}");
        }
        assert!(Scale::gpu(true).gemm_sizes.len() < Scale::gpu(false).gemm_sizes.len());
    }

    /// A CPU profile measures the thread link and no host link; its fits are positive.
    #[test]
    fn a_quick_cpu_profile_has_a_thread_link_and_no_host_link() {
        let b = crate::backend("cpu").expect("cpu backend");
        let devs = vec![b.open(0).expect("device 0")];
        let p = calibrate("cpu", devs, "today", true, &|_| {}).expect("calibrates");
        assert_eq!((p.precision, p.element_bytes), ("fp32", 4.0));
        assert!(p.link.as_ref().is_some_and(|l| l.bytes_per_s > 0.0 && l.latency_s > 0.0), "{:?}", p.link);
        assert!(p.host_link.is_none());
        assert!(p.gemm.flops_per_s > 0.0 && p.memory.bytes_per_s > 0.0);
    }
}
