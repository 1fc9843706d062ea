//! The CPU backend: each host thread is one device, running the real kernels of [`kernels`]
//! at the op's shapes, single-threaded.
//!
//! The CPU computes in f32 whatever the training precision: a memory op's element count is
//! read from the Program's bytes at the training precision (`bytes / (2 * element_bytes)`,
//! read plus write) and then used 1:1 as the f32 element count, so the bytes the CPU moves
//! differ from the Program's by a factor `4 / element_bytes`, which calibration absorbs.
//!
//! No single buffer grows past [`MAX_BUFFER_ELEMS`] (256 MiB of f32): an op bigger than that
//! runs at a reduced size and its measured time is scaled up linearly (by the ratio of
//! elements, or of FLOPs for a GEMM), so a small machine never runs out of memory.

pub mod kernels;

use crate::shapes::{GemmFit, count, fit_gemm};
use crate::{Backend, Device, ExecError, OpContext, Result};
use sim::lower::OpInstance;
use sim::workload::OpClass;
use std::time::Instant;

/// The most f32 elements one device buffer holds: 256 MiB worth.
pub const MAX_BUFFER_ELEMS: usize = (256 << 20) / 4;

/// Bytes the optimizer step moves per parameter with mixed-precision Adam (gradient 2, states
/// read and written 2 x 12, low-precision weights 2: `sim::cost::memory::optimizer_traffic_bytes`).
pub(crate) const ADAM_BYTES_PER_PARAM: f64 = 28.0;

/// Learning rate of the timed Adam steps (keeps the parameters near where they started).
const ADAM_LR: f32 = 1e-4;

/// Drop probability of the timed dropouts.
const DROPOUT_P: f32 = 0.1;

/// Host threads as devices.
pub struct CpuBackend {
    threads: usize,
}

impl CpuBackend {
    /// As many devices as the machine has hardware threads.
    pub fn new() -> CpuBackend {
        CpuBackend { threads: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) }
    }
}

impl Default for CpuBackend {
    fn default() -> Self {
        CpuBackend::new()
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn device_count(&self) -> usize {
        self.threads
    }

    fn open(&self, index: usize) -> Result<Box<dyn Device>> {
        if index >= self.threads {
            return Err(ExecError(format!(
                "cpu device {index} does not exist: this machine has {} hardware threads (devices 0 to {})",
                self.threads,
                self.threads - 1
            )));
        }
        Ok(Box::new(CpuDevice::new(index)))
    }
}

/// One CPU "device": the calling thread, with its own buffers (allocated on first need, then
/// grown and reused, never freed while the device lives).
pub struct CpuDevice {
    index: usize,
    /// Largest buffer, in f32 elements.
    cap: usize,
    bufs: [Vec<f32>; 5],
    mask: Vec<u8>,
    gamma: Vec<f32>,
    beta: Vec<f32>,
    /// Adam steps taken so far.
    step: u32,
    /// Seed of the next dropout.
    seed: u64,
}

impl CpuDevice {
    /// Device `index` (only its name depends on it).
    pub fn new(index: usize) -> CpuDevice {
        CpuDevice::with_cap(index, MAX_BUFFER_ELEMS)
    }

    fn with_cap(index: usize, cap: usize) -> CpuDevice {
        CpuDevice {
            index,
            cap: cap.max(1),
            bufs: Default::default(),
            mask: Vec::new(),
            gamma: Vec::new(),
            beta: Vec::new(),
            step: 0,
            seed: 0x5eed ^ index as u64,
        }
    }

    fn run_gemm(&mut self, batch: usize, m: usize, n: usize, k: usize, backward: bool) -> f64 {
        if batch == 0 || m == 0 || n == 0 || k == 0 {
            return 0.0;
        }
        let fit = fit_gemm(batch, m, n, k, self.cap);
        let GemmFit { batch: b, m, n, k, scale } = fit;
        let [x, w, y, dx, dw] = &mut self.bufs;
        grow(x, b * m * k, 1);
        grow(w, b * k * n, 2);
        grow(y, b * m * n, 3);
        let (x, w, y) = (&x[..b * m * k], &w[..b * k * n], &mut y[..b * m * n]);
        let seconds = if backward {
            grow(dx, b * m * k, 4);
            grow(dw, b * k * n, 5);
            let (dx, dw) = (&mut dx[..b * m * k], &mut dw[..b * k * n]);
            let dy = &*y;
            let start = Instant::now();
            // dX = dY . W^T (m x n . n x k) and dW = X^T . dY (k x m . m x n).
            kernels::gemm_ex(b, m, k, n, dy, false, w, true, dx);
            kernels::gemm_ex(b, k, n, m, x, true, dy, false, dw);
            start.elapsed().as_secs_f64()
        } else {
            let start = Instant::now();
            kernels::gemm(b, m, n, k, x, w, y);
            start.elapsed().as_secs_f64()
        };
        seconds * scale
    }

    fn run_memory(&mut self, op: &OpInstance, ctx: &OpContext) -> Result<f64> {
        let spec = &op.spec;
        let bytes = if op.backward { spec.backward_bytes } else { spec.forward_bytes };
        if !(ctx.element_bytes.is_finite() && ctx.element_bytes > 0.0) {
            return Err(ExecError(format!(
                "op {}: element size {} bytes is not positive",
                spec.name, ctx.element_bytes
            )));
        }
        if sim::cost::is_optimizer_step(spec.name) {
            let params = count(spec.name, "parameters", bytes / ADAM_BYTES_PER_PARAM)?;
            return Ok(self.run_adam(params));
        }
        // Read plus write at the training precision; computed as that many f32 elements.
        let elems = count(spec.name, "elements", bytes / (2.0 * ctx.element_bytes))?;
        if elems == 0 {
            return Ok(0.0);
        }
        // The kernel of the op's family, as the cost model groups them (`sim::cost::memory_kernel`).
        let seconds = match sim::cost::memory_kernel(spec.name) {
            "ln1" => self.run_rows(spec.name, elems, ctx.hidden, "hidden", Rows::LayerNorm)?,
            "softmax" => self.run_rows(spec.name, elems, ctx.seq_len, "seq_len", Rows::Softmax)?,
            "act" => self.run_elementwise(elems, Elementwise::Gelu),
            "attn_dropout" => self.run_elementwise(elems, Elementwise::Dropout),
            "dropout_residual" => self.run_elementwise(elems, Elementwise::DropoutResidual),
            // Embedding lookups, the loss and anything else: a copy of the op's bytes.
            _ => self.run_elementwise(elems, Elementwise::Copy),
        };
        Ok(seconds)
    }

    /// A row-wise kernel over `elems / width` rows of `width`.
    fn run_rows(&mut self, name: &str, elems: usize, width: usize, what: &str, kind: Rows) -> Result<f64> {
        if width == 0 {
            return Err(ExecError(format!("op {name}: context {what} is 0")));
        }
        let rows = (elems / width).max(1);
        let run = rows.min((self.cap / width).max(1));
        let len = run * width;
        let [x, y, ..] = &mut self.bufs;
        grow(x, len, 1);
        let start;
        match kind {
            Rows::LayerNorm => {
                grow(y, len, 2);
                if self.gamma.len() < width {
                    self.gamma.resize(width, 1.0);
                    self.beta.resize(width, 0.0);
                }
                let (x, y) = (&x[..len], &mut y[..len]);
                start = Instant::now();
                kernels::layernorm(x, width, &self.gamma[..width], &self.beta[..width], y);
            }
            Rows::Softmax => {
                let x = &mut x[..len];
                start = Instant::now();
                kernels::softmax_rows(x, width);
            }
        }
        Ok(start.elapsed().as_secs_f64() * (rows as f64 / run as f64))
    }

    fn run_elementwise(&mut self, elems: usize, kind: Elementwise) -> f64 {
        let run = elems.min(self.cap);
        let [x, y, z, r, _] = &mut self.bufs;
        grow(x, run, 1);
        grow(y, run, 2);
        let (x, y) = (&x[..run], &mut y[..run]);
        let start;
        match kind {
            Elementwise::Copy => {
                start = Instant::now();
                kernels::copy(x, y);
            }
            Elementwise::Gelu => {
                start = Instant::now();
                kernels::gelu(x, y);
            }
            Elementwise::Dropout | Elementwise::DropoutResidual => {
                if self.mask.len() < run {
                    self.mask.resize(run, 0);
                }
                let mask = &mut self.mask[..run];
                self.seed = self.seed.wrapping_add(1);
                if let Elementwise::DropoutResidual = kind {
                    grow(z, run, 3);
                    grow(r, run, 4);
                    let (z, r) = (&mut z[..run], &r[..run]);
                    start = Instant::now();
                    kernels::dropout(x, DROPOUT_P, self.seed, y, mask);
                    kernels::add(y, r, z);
                } else {
                    start = Instant::now();
                    kernels::dropout(x, DROPOUT_P, self.seed, y, mask);
                }
            }
        }
        start.elapsed().as_secs_f64() * (elems as f64 / run as f64)
    }

    fn run_adam(&mut self, params: usize) -> f64 {
        if params == 0 {
            return 0.0;
        }
        let run = params.min(self.cap);
        let [p, g, m, v, _] = &mut self.bufs;
        grow(p, run, 1);
        grow(g, run, 2);
        grow(m, run, 3);
        // Second moments must be non-negative (grown buffers hold values in [-1, 1)); other
        // ops may have left anything in this buffer, so clamp it (outside the timed region).
        grow(v, run, 4);
        for vv in v[..run].iter_mut() {
            *vv = vv.abs();
        }
        self.step = self.step.saturating_add(1);
        let (p, g, m, v) = (&mut p[..run], &g[..run], &mut m[..run], &mut v[..run]);
        let start = Instant::now();
        kernels::adam(p, g, m, v, self.step, ADAM_LR);
        start.elapsed().as_secs_f64() * (params as f64 / run as f64)
    }
}

impl Device for CpuDevice {
    fn name(&self) -> String {
        format!("cpu thread {}", self.index)
    }

    fn run_op(&mut self, op: &OpInstance, ctx: &OpContext) -> Result<f64> {
        match op.spec.class {
            OpClass::Gemm { .. } | OpClass::Attention { .. } => {
                let (batch, m, n, k, backward) = op.gemm().expect("a product");
                let name = op.spec.name;
                let (batch, m) = (count(name, "batch", batch)?, count(name, "m", m)?);
                let (n, k) = (count(name, "n", n)?, count(name, "k", k)?);
                Ok(self.run_gemm(batch, m, n, k, backward))
            }
            OpClass::Memory | OpClass::Copies { .. } => self.run_memory(op, ctx),
        }
    }

    fn copy(&mut self, bytes: usize, to_device: bool) -> Result<f64> {
        let elems = bytes.div_ceil(4);
        if elems == 0 {
            return Ok(0.0);
        }
        let run = elems.min(self.cap);
        let [host, dev, ..] = &mut self.bufs;
        grow(host, run, 1);
        grow(dev, run, 2);
        let (src, dst) = if to_device { (&host[..run], &mut dev[..run]) } else { (&dev[..run], &mut host[..run]) };
        let start = Instant::now();
        kernels::copy(src, dst);
        Ok(start.elapsed().as_secs_f64() * (elems as f64 / run as f64))
    }

    fn synchronize(&mut self) -> Result<()> {
        Ok(())
    }
}

#[derive(Clone, Copy)]
enum Rows {
    LayerNorm,
    Softmax,
}

#[derive(Clone, Copy)]
enum Elementwise {
    Copy,
    Gelu,
    Dropout,
    DropoutResidual,
}

/// Grows `v` to at least `len` elements, filling new ones with values in [-1, 1) (outside any
/// timed region; non-zero data so no kernel takes a data-dependent shortcut).
fn grow(v: &mut Vec<f32>, len: usize, salt: u64) {
    if v.len() >= len {
        return;
    }
    let mut s = 0x9e37_79b9_7f4a_7c15u64.wrapping_mul(salt.wrapping_add(v.len() as u64 + 1)) | 1;
    v.reserve_exact(len - v.len());
    while v.len() < len {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        v.push(((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sim::workload::Saved;

    fn ctx() -> OpContext {
        OpContext { hidden: 256, seq_len: 128, element_bytes: 2.0 }
    }

    fn gemm_op(name: &'static str, batch: f64, m: f64, n: f64, k: f64, backward: bool) -> OpInstance {
        let spec = sim::workload::gemm_op(name, batch, m, n, k, 2.0, Saved::default());
        OpInstance { spec, ..crate::test_ops::op(name, OpClass::Memory, 0.0, backward) }
    }

    fn mem_op(name: &'static str, bytes: f64, backward: bool) -> OpInstance {
        crate::test_ops::op(name, OpClass::Memory, bytes, backward)
    }

    fn positive(t: f64, what: &str) {
        assert!(t.is_finite() && t > 0.0, "{what}: {t} s");
    }

    #[test]
    fn backend_names_and_counts_devices() {
        let backend = CpuBackend::new();
        assert_eq!(backend.name(), "cpu");
        assert!(backend.device_count() >= 1);
        let dev = backend.open(0).unwrap();
        assert_eq!(dev.name(), "cpu thread 0");
        let err = backend.open(backend.device_count()).err().expect("no such device");
        assert!(err.0.contains("does not exist"), "{err}");
    }

    #[test]
    fn gemm_ops_run_forward_and_backward() {
        let mut dev = CpuBackend::new().open(0).unwrap();
        for backward in [false, true] {
            let t = dev.run_op(&gemm_op("qkv", 1.0, 64.0, 96.0, 80.0, backward), &ctx()).unwrap();
            positive(t, "qkv");
            let t = dev.run_op(&gemm_op("scores", 4.0, 32.0, 32.0, 16.0, backward), &ctx()).unwrap();
            positive(t, "scores");
        }
        dev.synchronize().unwrap();
    }

    #[test]
    fn memory_ops_run() {
        let mut dev = CpuBackend::new().open(0).unwrap();
        let c = ctx();
        let sbh = 4.0 * 128.0 * 256.0; // b = 4, s = 128, h = 256
        let e = c.element_bytes;
        let ops = [
            mem_op("ln1", 2.0 * sbh * e + 8.0 * 256.0, false),
            mem_op("ln2", 2.0 * sbh * e, true),
            mem_op("final_norm", 2.0 * sbh * e, false),
            mem_op("softmax", 2.0 * 4.0 * 4.0 * 128.0 * 128.0 * e, false),
            mem_op("attn_dropout", (2.0 * e + 1.0) * 4.0 * 4.0 * 128.0 * 128.0, false),
            mem_op("act", 2.0 * e * 4.0 * sbh, false),
            mem_op("dropout_residual", 3.0 * sbh * e + sbh, true),
            mem_op("embedding", 2.0 * sbh * e, false),
            mem_op("loss", 12.0 * 512.0 * 1000.0, false),
            mem_op("optimizer", 28.0 * 100_000.0, false),
            mem_op("cpu_optimizer", 30.0 * 100_000.0, false),
            mem_op("something_new", 1e5, false),
        ];
        for op in &ops {
            // Twice: the second call reuses the buffers the first grew.
            for _ in 0..2 {
                positive(dev.run_op(op, &c).unwrap(), op.spec.name);
            }
        }
        positive(dev.copy(1 << 20, true).unwrap(), "copy to device");
        positive(dev.copy(1 << 20, false).unwrap(), "copy to host");
        assert_eq!(dev.copy(0, true).unwrap(), 0.0);
    }

    /// A backward split into its two products (`OpPart`, Megatron's asynchronous
    /// column-parallel backward) runs the one product it stands for: dX = dY . W^T is m x n by
    /// n x k, so the op's k is that product's n (the error names it so), and dW = X^T . dY is
    /// k x m by m x n, the op's m its k.
    #[test]
    fn a_backward_part_runs_its_one_product() {
        use sim::lower::OpPart;
        let mut dev = CpuDevice::new(0);
        let part = |part, m: f64, k: f64| OpInstance { part, ..gemm_op("qkv", 1.0, m, 64.0, k, true) };
        let whole = dev.run_op(&part(OpPart::Whole, 64.0, f64::NAN), &ctx()).unwrap_err();
        let dgrad = dev.run_op(&part(OpPart::DataGrad, 64.0, f64::NAN), &ctx()).unwrap_err();
        let wgrad = dev.run_op(&part(OpPart::WeightGrad, f64::NAN, 64.0), &ctx()).unwrap_err();
        assert!(whole.0.contains(" k = NaN") && dgrad.0.contains(" n = NaN"), "{whole} / {dgrad}");
        assert!(wgrad.0.contains(" k = NaN"), "{wgrad}");
        for p in [OpPart::DataGrad, OpPart::WeightGrad] {
            positive(dev.run_op(&part(p, 64.0, 32.0), &ctx()).unwrap(), "a backward product");
        }
    }

    #[test]
    fn bad_shapes_and_contexts_are_errors() {
        let mut dev = CpuDevice::new(0);
        let err = dev.run_op(&gemm_op("qkv", 1.0, f64::NAN, 4.0, 4.0, false), &ctx()).unwrap_err();
        assert!(err.0.contains("qkv"), "{err}");
        let zero_hidden = OpContext { hidden: 0, ..ctx() };
        assert!(dev.run_op(&mem_op("ln1", 1e4, false), &zero_hidden).is_err());
        let zero_e = OpContext { element_bytes: 0.0, ..ctx() };
        assert!(dev.run_op(&mem_op("act", 1e4, false), &zero_e).is_err());
    }

    fn median_time(dev: &mut dyn Device, op: &OpInstance) -> f64 {
        let mut t: Vec<f64> = (0..5).map(|_| dev.run_op(op, &ctx()).unwrap()).collect();
        t.sort_by(f64::total_cmp);
        t[2]
    }

    #[test]
    fn bigger_gemm_takes_longer() {
        let mut dev = CpuDevice::new(0);
        let small = gemm_op("fc1", 1.0, 256.0, 256.0, 256.0, false);
        let big = gemm_op("fc1", 1.0, 512.0, 512.0, 512.0, false);
        dev.run_op(&big, &ctx()).unwrap(); // warm up and grow the buffers
        let (ts, tb) = (median_time(&mut dev, &small), median_time(&mut dev, &big));
        positive(ts, "256 cube");
        assert!(tb > 2.0 * ts, "512 cube {tb} s vs 256 cube {ts} s");
    }

    #[test]
    fn fit_gemm_caps_operands_and_scales_by_flops() {
        // Fits: untouched.
        assert_eq!(fit_gemm(2, 10, 20, 30, 1200), GemmFit { batch: 2, m: 10, n: 20, k: 30, scale: 1.0 });
        // A big batch: fewer products.
        let f = fit_gemm(64, 8, 8, 8, 256);
        assert_eq!((f.batch, f.m, f.n, f.k, f.scale), (4, 8, 8, 8, 16.0));
        // A GPT-3 logits GEMM (8192 x 50257 x 12288) against the real cap.
        let (b, m, n, k) = (1, 8192, 50257, 12288);
        let f = fit_gemm(b, m, n, k, MAX_BUFFER_ELEMS);
        assert!(f.m * f.k <= MAX_BUFFER_ELEMS && f.k * f.n <= MAX_BUFFER_ELEMS && f.m * f.n <= MAX_BUFFER_ELEMS);
        let want = (m * n * k) as f64 / (f.batch * f.m * f.n * f.k) as f64;
        assert!((f.scale - want).abs() < 1e-9 * want && f.scale > 1.0);
    }

    #[test]
    fn ops_over_the_cap_run_smaller_and_scale() {
        // A tiny cap stands in for 256 MiB: the op runs capped, its time scaled up.
        let mut dev = CpuDevice::with_cap(0, 4096);
        let c = ctx();
        let t = dev.run_op(&mem_op("act", 2.0 * c.element_bytes * 1e6, false), &c).unwrap();
        positive(t, "capped act");
        assert!(dev.bufs.iter().all(|b| b.len() <= 4096));
        positive(dev.run_op(&gemm_op("fc2", 3.0, 200.0, 300.0, 100.0, true), &c).unwrap(), "capped gemm");
        positive(dev.run_op(&mem_op("softmax", 2.0 * c.element_bytes * 1e6, false), &c).unwrap(), "capped softmax");
        positive(dev.run_op(&mem_op("optimizer", 28.0 * 1e6, false), &c).unwrap(), "capped adam");
        positive(dev.copy(1 << 24, false).unwrap(), "capped copy");
        assert!(dev.bufs.iter().all(|b| b.len() <= 4096));
    }
}
