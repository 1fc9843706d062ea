//! `simulation`: how the engine models the interconnect and which devices it simulates, and
//! the framework allowances (memory, host time per op) per device kind.

use super::keys;
use super::reader::{Obj, Result, invalid};
use crate::hardware::DeviceKind;
use serde::Serialize;

/// How the engine models the interconnect and which devices it simulates.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct SimOptions {
    pub network: crate::network::NetworkKind,
    /// Simulate one data-parallel replica (and one tensor rank per group) and mirror it,
    /// where that is exact.
    pub symmetry: bool,
    /// Device memory the framework holds besides tensors (CUDA context, library
    /// workspaces); `None`: the device kind's default (see [`SimOptions::framework_bytes`]).
    pub framework_overhead_bytes: Option<u64>,
    /// Host (framework) time to issue one op; `None`: the device kind's default (see
    /// [`SimOptions::host_op_s`]).
    pub host_op_s: Option<f64>,
    /// Fraction of each device's memory kept free for the allocator's fragmentation and
    /// reserve; `None`: the device kind's default (see [`SimOptions::headroom_bytes`]).
    pub memory_headroom: Option<f64>,
    /// Relative standard deviation of a device's speed among devices of one model; `None`:
    /// the device kind's default (see [`SimOptions::device_variability`]).
    pub device_variability: Option<f64>,
    /// Relative standard deviation of a device's compute-bound kernel speed (0: none); each
    /// collective then waits for its slowest member (`engine::jitter`). `None`: the
    /// cluster's default (see [`SimOptions::kernel_jitter`]).
    pub kernel_jitter: Option<f64>,
    /// How long a device's kernel speed stays correlated (s): [`DEFAULT_KERNEL_JITTER_CORRELATION_S`]
    /// unless set; 0: kernels vary independently (`engine::jitter`).
    pub kernel_jitter_correlation_s: f64,
    /// Draw each collective's wait from `seed` (true), or take the expected wait (false, the
    /// default: deterministic, the same for a folded and a full simulation).
    pub kernel_jitter_draws: bool,
    /// Seed of the kernel-time draws: the same seed gives the same run.
    pub seed: u64,
    /// Simulate one replica even where that is not exact (several replicas share a node, so
    /// their traffic through its NICs is left out): for searches that probe only the memory
    /// peak and confirm their answer on the scenario itself. Not a scenario key.
    #[serde(skip)]
    pub approximate_symmetry: bool,
    /// Whether `symmetry` may also fold devices whose mirrors share their node beyond the
    /// node-aligned replicas: the ranks of a tensor-parallel group, and replicas that share a
    /// node (off for the executor's replay, which runs their collectives on real devices).
    /// Not a scenario key.
    #[serde(skip)]
    pub fold_node_peers: bool,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            network: crate::network::NetworkKind::MaxMinFair,
            symmetry: true,
            framework_overhead_bytes: None,
            host_op_s: None,
            memory_headroom: None,
            device_variability: None,
            kernel_jitter: None,
            kernel_jitter_correlation_s: DEFAULT_KERNEL_JITTER_CORRELATION_S,
            kernel_jitter_draws: false,
            seed: 0,
            approximate_symmetry: false,
            fold_node_peers: true,
        }
    }
}

/// Default fraction of a GPU's memory a plan must leave free: PyTorch's caching allocator
/// holds memory it cannot hand out (split blocks, rounding). GMLake (Guo et al., ASPLOS 2024)
/// measured on average 9.2 GB of such fragmentation over eight LLM training setups on
/// A100-80GB (11.5%, with recompute/offload/ZeRO, which fragment more); 10% is kept here.
pub const DEFAULT_GPU_MEMORY_HEADROOM: f64 = 0.10;

/// Default host time to issue one modelled op on a GPU from an eager framework (see
/// [`SimOptions::host_op_s`]). Measured on the H200 machine's Xeon host with PyTorch 2.11
/// (`traces/2026-11-26-cuda-h200/microbench.json`): a `F.linear` call from Python on a GEMM too
/// small to keep the GPU busy took 15 us (21 us in an earlier run), a `torch._scaled_mm` call
/// 29 us; the backward's kernels are issued by autograd's C++ engine without Python, for less
/// (not measured). 10 us is kept between the two: an assumption, not a fit.
pub const DEFAULT_GPU_HOST_OP_S: f64 = 10e-6;

/// Default device memory a GPU framework holds outside its tensors (see
/// [`SimOptions::framework_bytes`]): measured on an H200 with driver 580, CUDA 13.0 and PyTorch
/// 2.11 (`traces/2026-11-27-cuda-h200/overhead.json`, session 38) as the device's used memory
/// less the caching allocator's reserve: 0.51 GiB once the context exists, 0.67 GiB after the
/// first cuBLAS call, 0.684 GiB after cuDNN's attention. Other GPUs and versions are assumed
/// alike; NCCL's communicator buffers, which one GPU could not show, are not included.
pub const DEFAULT_GPU_FRAMEWORK_BYTES: f64 = 734_855_168.0;

impl SimOptions {
    /// The framework allowance on `device`: [`DEFAULT_GPU_FRAMEWORK_BYTES`] on a GPU unless
    /// set (allocator fragmentation is the headroom's, not this), nothing on FPGAs and CPUs.
    pub fn framework_bytes(&self, device: &crate::hardware::DeviceSpec) -> f64 {
        match self.framework_overhead_bytes {
            Some(b) => b as f64,
            None if device.kind == DeviceKind::Gpu => DEFAULT_GPU_FRAMEWORK_BYTES,
            None => 0.0,
        }
    }

    /// The memory fraction kept free on `device`: [`DEFAULT_GPU_MEMORY_HEADROOM`] on GPUs,
    /// none on FPGAs (statically allocated buffers) and CPU devices, unless set.
    pub fn headroom_fraction(&self, device: &crate::hardware::DeviceSpec) -> f64 {
        match self.memory_headroom {
            Some(h) => h,
            None if device.kind == DeviceKind::Gpu => DEFAULT_GPU_MEMORY_HEADROOM,
            None => 0.0,
        }
    }

    /// The memory a plan may fill on `device`: its capacity less the allocator headroom.
    pub fn usable_bytes(&self, device: &crate::hardware::DeviceSpec) -> f64 {
        device.hbm_bytes * (1.0 - self.headroom_fraction(device))
    }

    /// Host time to issue one op on `device` (a GEMM's backward is two). An eager framework's
    /// host thread runs Python, the dispatcher and autograd bookkeeping, then launches the
    /// kernel; it runs ahead of the GPU except where it waits for a pipeline receive or a
    /// gradient reduction, so this bounds only streams of short kernels. GPU default:
    /// [`DEFAULT_GPU_HOST_OP_S`]; FPGAs and CPU devices (whose own time includes it): 0.
    pub fn host_op_s(&self, device: &crate::hardware::DeviceSpec) -> f64 {
        match self.host_op_s {
            Some(s) => s,
            None if device.kind == DeviceKind::Gpu => DEFAULT_GPU_HOST_OP_S,
            None => 0.0,
        }
    }
}

/// Default correlation time of a device's kernel speed (`simulation.kernel_jitter_correlation_s`):
/// on an H200 at its settled 700 W limit (`traces/2026-11-27-cuda-h200/jitter-steady.json`,
/// `jitter.py --steady`, session 38), 8192-cubed GEMMs varied by 1.47% launch to launch with a
/// lag-1 autocorrelation of 0.94, by 1.32% over 10 launches (16 ms) and 0.74% over 100 (0.16 s),
/// and half-second windows by 0.51% (`sustained.json`): a speed whose correlation decays as
/// `exp(-|Δt|/30 ms)` gives 1.35%, 0.80% and 0.49%. The clock under the power limit moves the
/// compute kernels together; memory-bound kernels varied 0.4-0.5% and independently.
pub const DEFAULT_KERNEL_JITTER_CORRELATION_S: f64 = 0.03;

/// Default spread of a GPU's compute-bound kernel speed (`simulation.kernel_jitter`): on an
/// H200 at its settled 700 W limit (`traces/2026-11-27-cuda-h200/jitter-steady.json`,
/// `experiments/executor/gpu/jitter.py --steady`, session 38), back-to-back 8192-cubed bf16
/// GEMMs varied by 1.47% launch to launch (robust relative standard deviation), cuDNN's fused
/// attention by 0.99%; a training step's compute-bound time is mostly GEMMs, so the GEMMs'
/// figure is kept. One GPU's measurement, assumed for every GPU; the correlation time is
/// [`DEFAULT_KERNEL_JITTER_CORRELATION_S`].
pub const DEFAULT_GPU_KERNEL_JITTER: f64 = 0.0147;

/// Default spread of GPU speed within one model: Sinha et al., "Not All GPUs Are Created Equal"
/// (SC22, arXiv 2208.11035) measured 8% average performance variation (22% at most) between
/// GPUs of one SKU over five clusters of thousands of GPUs, outliers excluded. As the range
/// of N normal draws (N = 1,000-27,000: about 7-8 standard deviations), that is a standard
/// deviation of about 1%.
pub const DEFAULT_GPU_DEVICE_VARIABILITY: f64 = 0.01;

impl SimOptions {
    /// The spread of device speed on `device`: [`DEFAULT_GPU_DEVICE_VARIABILITY`] on GPUs,
    /// none on FPGAs and CPU devices, unless set.
    pub fn device_variability(&self, device: &crate::hardware::DeviceSpec) -> f64 {
        match self.device_variability {
            Some(v) => v,
            None if device.kind == DeviceKind::Gpu => DEFAULT_GPU_DEVICE_VARIABILITY,
            None => 0.0,
        }
    }

    /// The spread of compute-bound kernel speed the engine applies on `cluster` (one value for
    /// the whole cluster): [`DEFAULT_GPU_KERNEL_JITTER`] where it has GPUs, none on clusters of
    /// FPGAs and CPU devices (whose measured kernel times are their own), unless set.
    pub fn kernel_jitter(&self, cluster: &crate::hardware::ClusterSpec) -> f64 {
        match self.kernel_jitter {
            Some(j) => j,
            None if cluster.has_kind(DeviceKind::Gpu) => DEFAULT_GPU_KERNEL_JITTER,
            None => 0.0,
        }
    }
}

/// The expected largest of `n` independent standard normal draws (0 for one): how many
/// standard deviations slower than the mean the slowest of `n` devices is.
/// Each value is computed once per process (a search asks it of every plan it weighs) and
/// kept; the same `n` always gives the same value.
pub fn expected_max_std_normal(n: u64) -> f64 {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static KNOWN: OnceLock<Mutex<HashMap<u64, f64>>> = OnceLock::new();
    if n <= 1 {
        return 0.0;
    }
    let known = KNOWN.get_or_init(Default::default);
    if let Some(&v) = known.lock().unwrap_or_else(|e| e.into_inner()).get(&n) {
        return v;
    }
    let v = integrate_max_std_normal(n);
    known.lock().unwrap_or_else(|e| e.into_inner()).insert(n, v);
    v
}

fn integrate_max_std_normal(n: u64) -> f64 {
    use statrs::distribution::{Continuous, ContinuousCDF, Normal};
    let z = Normal::standard();
    let n = n as f64;
    // E[max] = integral of x n phi(x) Phi(x)^(n-1); the density of the maximum lies in
    // [-6, 8] for any n up to 2^20 devices. Simpson's rule on 14,000 intervals.
    let (a, b, k) = (-6.0f64, 8.0f64, 14_000usize);
    let h = (b - a) / k as f64;
    let f = |x: f64| x * n * z.pdf(x) * z.cdf(x).powf(n - 1.0);
    let inner: f64 = (1..k).map(|i| f(a + i as f64 * h) * if i % 2 == 1 { 4.0 } else { 2.0 }).sum();
    (f(a) + inner + f(b)) * h / 3.0
}

pub(super) fn parse_options(o: Option<Obj>) -> Result<SimOptions> {
    let mut opts = SimOptions::default();
    if let Some(o) = o {
        o.only(keys::SIMULATION)?;
        if let Some(h) = o.non_negative("memory_headroom")? {
            if h >= 0.9 {
                return Err(invalid(
                    &o.key("memory_headroom"),
                    format!("{h} leaves almost no memory; expected a fraction of device memory in [0, 0.9)"),
                ));
            }
            opts.memory_headroom = Some(h);
        }
        if let Some(b) = o.non_negative("framework_overhead_bytes")? {
            opts.framework_overhead_bytes = Some(b.round() as u64);
        }
        if let Some(v) = o.non_negative("device_variability")? {
            if v >= 0.2 {
                return Err(invalid(
                    &o.key("device_variability"),
                    format!("{v}: expected a relative standard deviation of device speed in [0, 0.2)"),
                ));
            }
            opts.device_variability = Some(v);
        }
        if let Some(h) = o.non_negative("host_op_s")? {
            opts.host_op_s = Some(h);
        }
        if let Some(j) = o.non_negative("kernel_jitter")? {
            if j > 1.0 {
                return Err(invalid(
                    &o.key("kernel_jitter"),
                    format!("{j}: expected a relative standard deviation of a kernel's time in [0, 1]"),
                ));
            }
            opts.kernel_jitter = Some(j);
        }
        if let Some(t) = o.non_negative("kernel_jitter_correlation_s")? {
            opts.kernel_jitter_correlation_s = t;
        }
        if let Some(v) = o.get("seed") {
            opts.seed = v.as_u64().ok_or_else(|| {
                invalid(&o.key("seed"), format!("expected an integer >= 0, got {}", super::reader::show(v)))
            })?;
        }
        if let Some(n) = o.choice("network", &crate::network::NetworkKind::NAMES, crate::network::NetworkKind::parse)? {
            opts.network = n;
        }
        if let Some(s) = o.boolean("symmetry")? {
            opts.symmetry = s;
        }
        if let Some(d) = o.boolean("kernel_jitter_draws")? {
            opts.kernel_jitter_draws = d;
        }
    }
    Ok(opts)
}
