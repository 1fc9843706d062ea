//! The `torch` backend: the Program's ops as real PyTorch (libtorch) operators through `tch`,
//! on a CUDA GPU when libtorch sees one, otherwise on the CPU. Behind the `torch` feature: it
//! links against libtorch (tch 0.24 needs PyTorch 2.11; see DEPENDENCIES.md and the README).
//!
//! GEMMs run as `matmul` in the training precision (on a GPU bf16 for 2-byte precisions and
//! fp32, without TF32, for 4-byte ones; fp32 on the CPU, where half-precision GEMMs are
//! emulated), shrunk to a buffer cap as the other backends do; LayerNorm, softmax, GELU,
//! dropout and the Adam update run as the matching ATen operators; anything else is a copy of its
//! bytes. [`gpt_block_step`] times a whole GPT block, forward and backward through autograd, at a
//! preset's sizes. Timing synchronizes the device before and after each measured call.

use crate::shapes::{GemmFit, count, fit_gemm};
use crate::{Backend, Device, ExecError, OpContext, Result};
use sim::lower::OpInstance;
#[cfg(test)]
use sim::workload::OpClass;
use std::time::Instant;
use tch::{Cuda, Kind, Tensor};

/// Bytes of optimizer traffic per parameter the simulator charges (fp32 master, m, v read and
/// written, plus the gradient and the low-precision weight), used to turn an optimizer op's bytes
/// into a parameter count, as the CPU backend does.
const ADAM_BYTES_PER_PARAM: f64 = crate::cpu::ADAM_BYTES_PER_PARAM;

/// Largest operand, in elements, a device allocates for one op (2^28 on a GPU: 512 MiB in fp16).
const GPU_CAP: usize = 1 << 28;
const CPU_CAP: usize = 1 << 22;

pub struct TorchBackend;

impl TorchBackend {
    /// On the CPU every core is a device running single-threaded ATen ops (as the `cpu`
    /// backend's worker threads), so devices replaying at once do not share cores.
    pub fn new() -> TorchBackend {
        if !Cuda::is_available() {
            tch::set_num_threads(1);
        }
        TorchBackend
    }
}

impl Default for TorchBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl Backend for TorchBackend {
    fn name(&self) -> &'static str {
        "torch"
    }

    /// The GPUs libtorch sees, or else the host's cores.
    fn device_count(&self) -> usize {
        if Cuda::is_available() {
            Cuda::device_count().max(0) as usize
        } else {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        }
    }

    fn open(&self, index: usize) -> Result<Box<dyn Device>> {
        let n = self.device_count();
        if index >= n {
            return Err(ExecError(format!(
                "torch: device {index} requested, libtorch sees {n} ({})",
                if Cuda::is_available() { "CUDA GPUs" } else { "no GPU or driver: the CPU only" }
            )));
        }
        let device = if Cuda::is_available() { tch::Device::Cuda(index) } else { tch::Device::Cpu };
        Ok(Box::new(TorchDevice::new(device, index)))
    }
}

pub struct TorchDevice {
    device: tch::Device,
    index: usize,
    cap: usize,
    /// Random operands by shape and slot, made once: replay times the op, not its inputs.
    inputs: std::collections::HashMap<(Vec<i64>, u8), Tensor>,
}

impl TorchDevice {
    fn new(device: tch::Device, index: usize) -> TorchDevice {
        let gpu = device.is_cuda();
        let cap = if gpu { GPU_CAP } else { CPU_CAP };
        TorchDevice { device, index, cap, inputs: std::collections::HashMap::new() }
    }

    /// Element type of a training precision of `element_bytes` on this device: on a GPU bf16
    /// for 2-byte precisions (as the cuda backend) and fp32 for 4-byte ones; fp32 on the CPU.
    fn kind(&self, element_bytes: f64) -> Kind {
        match crate::Precision::for_element_bytes(element_bytes) {
            crate::Precision::Bf16 if self.device.is_cuda() => Kind::BFloat16,
            _ => Kind::Float,
        }
    }

    fn sync(&self) {
        if let tch::Device::Cuda(i) = self.device {
            Cuda::synchronize(i as i64);
        }
    }

    /// Seconds of `f` on the device, between synchronizations (replay and calibration warm up
    /// by repeating).
    fn time(&self, mut f: impl FnMut()) -> f64 {
        self.sync();
        let start = Instant::now();
        f();
        self.sync();
        start.elapsed().as_secs_f64()
    }

    /// A random operand of `shape` of `kind` (the `slot`-th of an op).
    fn tensor(&mut self, shape: &[i64], slot: u8, kind: Kind) -> Tensor {
        let device = self.device;
        // Operands of the two element types are cached apart.
        let key = slot | if kind == Kind::Float { 0 } else { 0x80 };
        self.cached(shape, key, || Tensor::randn(shape, (kind, device)))
    }

    fn cached(&mut self, shape: &[i64], slot: u8, make: impl FnOnce() -> Tensor) -> Tensor {
        self.inputs.entry((shape.to_vec(), slot)).or_insert_with(make).shallow_clone()
    }

    fn gemm(&mut self, batch: usize, m: usize, n: usize, k: usize, backward: bool, kind: Kind) -> f64 {
        if batch == 0 || m == 0 || n == 0 || k == 0 {
            return 0.0;
        }
        let GemmFit { batch: b, m, n, k, scale } = fit_gemm(batch, m, n, k, self.cap);
        let (b, m, n, k) = (b as i64, m as i64, n as i64, k as i64);
        let x = self.tensor(&[b, m, k], 0, kind);
        let w = self.tensor(&[b, k, n], 1, kind);
        let seconds = if backward {
            let dy = self.tensor(&[b, m, n], 2, kind);
            // dX = dY . W^T and dW = X^T . dY.
            self.time(|| {
                let _dx = dy.matmul(&w.transpose(1, 2));
                let _dw = x.transpose(1, 2).matmul(&dy);
            })
        } else {
            self.time(|| {
                let _y = x.matmul(&w);
            })
        };
        seconds * scale
    }

    /// A row-wise operator over `elems / width` rows of `width`, shrunk to the cap.
    fn rows(
        &mut self,
        name: &str,
        elems: usize,
        width: usize,
        what: &str,
        kind: Kind,
        f: impl Fn(&Tensor) -> Tensor,
    ) -> Result<f64> {
        if width == 0 {
            return Err(ExecError(format!("op {name}: context {what} is 0")));
        }
        let rows = (elems / width).max(1);
        let run = rows.min((self.cap / width).max(1));
        let x = self.tensor(&[run as i64, width as i64], 0, kind);
        Ok(self.time(|| {
            let _ = f(&x);
        }) * (rows as f64 / run as f64))
    }

    fn elementwise(&mut self, elems: usize, kind: Kind, f: impl Fn(&Tensor) -> Tensor) -> f64 {
        let run = elems.min(self.cap).max(1);
        let x = self.tensor(&[run as i64], 0, kind);
        self.time(|| {
            let _ = f(&x);
        }) * (elems as f64 / run as f64)
    }

    /// One Adam step over `params` fp32 parameters with fp32 states, as fused element-wise ops.
    fn adam(&mut self, params: usize) -> f64 {
        if params == 0 {
            return 0.0;
        }
        let run = params.min(self.cap);
        let opts = (Kind::Float, self.device);
        let shape = [run as i64];
        let mut p = self.cached(&shape, 10, || Tensor::randn(shape, opts));
        let g = self.cached(&shape, 11, || Tensor::randn(shape, opts));
        let mut m = self.cached(&shape, 12, || Tensor::zeros(shape, opts));
        let mut v = self.cached(&shape, 13, || Tensor::zeros(shape, opts));
        let (lr, b1, b2, eps) = (1e-4, 0.9, 0.999, 1e-8);
        let seconds = self.time(|| {
            let _ = m.g_mul_scalar_(b1).g_add_(&(&g * (1.0 - b1)));
            let _ = v.g_mul_scalar_(b2).g_add_(&(&g * &g * (1.0 - b2)));
            let _ = p.g_sub_(&(&m / (v.sqrt() + eps) * lr));
        });
        seconds * (params as f64 / run as f64)
    }
}

impl Device for TorchDevice {
    fn name(&self) -> String {
        match self.device {
            tch::Device::Cuda(i) => format!("torch cuda:{i}"),
            _ => format!("torch cpu:{}", self.index),
        }
    }

    fn run_op(&mut self, op: &OpInstance, ctx: &OpContext) -> Result<f64> {
        let spec = &op.spec;
        let name = spec.name;
        if let Some((batch, m, n, k, backward)) = op.gemm() {
            let (batch, m) = (count(name, "batch", batch)?, count(name, "m", m)?);
            let (n, k) = (count(name, "n", n)?, count(name, "k", k)?);
            return Ok(self.gemm(batch, m, n, k, backward, self.kind(ctx.element_bytes)));
        }
        let bytes = if op.backward { spec.backward_bytes } else { spec.forward_bytes };
        if !(ctx.element_bytes.is_finite() && ctx.element_bytes > 0.0) {
            return Err(ExecError(format!("op {name}: element size {} bytes is not positive", ctx.element_bytes)));
        }
        if sim::cost::is_optimizer_step(name) {
            return Ok(self.adam(count(name, "parameters", bytes / ADAM_BYTES_PER_PARAM)?));
        }
        let elems = count(name, "elements", bytes / (2.0 * ctx.element_bytes))?;
        if elems == 0 {
            return Ok(0.0);
        }
        let h = ctx.hidden as i64;
        let kind = self.kind(ctx.element_bytes);
        // The kernel of the op's family, as the cost model groups them (`sim::cost::memory_kernel`).
        Ok(match sim::cost::memory_kernel(name) {
            "ln1" => self.rows(name, elems, ctx.hidden, "hidden", kind, |x| {
                x.layer_norm([h], None::<Tensor>, None::<Tensor>, 1e-5, false)
            })?,
            "softmax" => self.rows(name, elems, ctx.seq_len, "seq_len", kind, |x| x.softmax(-1, x.kind()))?,
            "act" => self.elementwise(elems, kind, |x| x.gelu("tanh")),
            "attn_dropout" => self.elementwise(elems, kind, |x| x.dropout(0.1, true)),
            "dropout_residual" => self.elementwise(elems, kind, |x| x.dropout(0.1, true) + x),
            _ => self.elementwise(elems, kind, |x| x.copy()),
        })
    }

    fn copy(&mut self, bytes: usize, to_device: bool) -> Result<f64> {
        let elems = bytes.div_ceil(4);
        if elems == 0 {
            return Ok(0.0);
        }
        let run = elems.min(self.cap);
        let (device, shape) = (self.device, [run as i64]);
        let host = self.cached(&shape, 20, || {
            let h = Tensor::zeros(shape, (Kind::Float, tch::Device::Cpu));
            if device.is_cuda() { h.pin_memory(device) } else { h }
        });
        let dev = self.cached(&shape, 21, || Tensor::zeros(shape, (Kind::Float, device)));
        let seconds = if to_device {
            self.time(|| {
                let _ = host.to_device(self.device);
            })
        } else if self.device.is_cuda() {
            self.time(|| {
                let _ = dev.to_device(tch::Device::Cpu);
            })
        } else {
            self.time(|| {
                let _ = dev.copy();
            })
        };
        Ok(seconds * (elems as f64 / run as f64))
    }

    fn synchronize(&mut self) -> Result<()> {
        self.sync();
        Ok(())
    }
}

/// Seconds of one GPT block's forward and backward (autograd) on `device` at the given sizes:
/// pre-norm attention with a causal softmax and a 4h GELU MLP, in the training precision of
/// `element_bytes` (on a GPU bf16 for 2 bytes, fp32 for 4; fp32 on the CPU), after `warmup`
/// untimed steps, averaged over `repeats`.
pub fn gpt_block_step(
    index: usize,
    element_bytes: f64,
    hidden: i64,
    heads: i64,
    seq: i64,
    micro_batch: i64,
    warmup: usize,
    repeats: usize,
) -> Result<f64> {
    if hidden <= 0 || heads <= 0 || hidden % heads != 0 || seq <= 0 || micro_batch <= 0 || repeats == 0 {
        return Err(ExecError(format!(
            "gpt block: hidden {hidden} must be a positive multiple of heads {heads}; seq {seq}, micro-batch {micro_batch} and repeats {repeats} positive"
        )));
    }
    let backend = TorchBackend::new();
    if index >= backend.device_count() {
        return Err(ExecError(format!("torch: no device {index}")));
    }
    let dev = TorchDevice::new(if Cuda::is_available() { tch::Device::Cuda(index) } else { tch::Device::Cpu }, index);
    let kind = dev.kind(element_bytes);
    let opts = (kind, dev.device);
    let w = |r: i64, c: i64| (Tensor::randn([r, c], opts) * 0.02).set_requires_grad(true);
    let (qkv, proj, fc1, fc2) =
        (w(hidden, 3 * hidden), w(hidden, hidden), w(hidden, 4 * hidden), w(4 * hidden, hidden));
    let d = hidden / heads;
    let mask = Tensor::ones([seq, seq], (Kind::Bool, dev.device)).triu(1);
    let step = || {
        let x = Tensor::randn([micro_batch, seq, hidden], opts).set_requires_grad(true);
        let a = x.layer_norm([hidden], None::<Tensor>, None::<Tensor>, 1e-5, true).matmul(&qkv);
        let parts = a.split(hidden, -1);
        let split = |t: &Tensor| t.view([micro_batch, seq, heads, d]).transpose(1, 2);
        let (q, k, v) = (split(&parts[0]), split(&parts[1]), split(&parts[2]));
        let scores = (q.matmul(&k.transpose(-2, -1)) / (d as f64).sqrt()).masked_fill(&mask, f64::NEG_INFINITY);
        let probs = scores.softmax(-1, kind).dropout(0.1, true);
        let ctx = probs.matmul(&v).transpose(1, 2).contiguous().view([micro_batch, seq, hidden]);
        let h = &x + ctx.matmul(&proj).dropout(0.1, true);
        let m =
            h.layer_norm([hidden], None::<Tensor>, None::<Tensor>, 1e-5, true).matmul(&fc1).gelu("tanh").matmul(&fc2);
        let out = &h + m.dropout(0.1, true);
        out.sum(Kind::Float).backward();
    };
    for _ in 0..warmup {
        step();
    }
    dev.sync();
    let start = Instant::now();
    for _ in 0..repeats {
        step();
    }
    dev.sync();
    Ok(start.elapsed().as_secs_f64() / repeats as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gemm_op(backward: bool) -> OpInstance {
        crate::test_ops::op("fc1", OpClass::Gemm { batch: 1.0, m: 256.0, n: 512.0, k: 128.0 }, 0.0, backward)
    }

    /// The registry hands out the torch backend, whose devices run ops and copies and time them.
    #[test]
    fn ops_and_copies_run_and_take_time() {
        let b = crate::backend("torch").expect("built with the torch feature");
        assert_eq!(b.name(), "torch");
        assert!(b.device_count() >= 1);
        let mut d = b.open(0).expect("device 0");
        let ctx = OpContext { hidden: 512, seq_len: 256, element_bytes: 4.0 };
        for backward in [false, true] {
            let s = d.run_op(&gemm_op(backward), &ctx).expect("gemm runs");
            assert!(s.is_finite() && s > 0.0, "{s}");
        }
        assert!(d.copy(1 << 20, true).expect("copy") > 0.0);
        assert!(b.open(b.device_count()).is_err());
    }

    /// A GPT block steps forward and backward; bad sizes are errors, not panics.
    #[test]
    fn gpt_block_steps_and_rejects_bad_sizes() {
        let s = gpt_block_step(0, 4.0, 64, 4, 32, 2, 1, 2).expect("a tiny block runs");
        assert!(s.is_finite() && s > 0.0);
        assert!(gpt_block_step(0, 4.0, 64, 5, 32, 2, 0, 1).is_err());
        assert!(gpt_block_step(0, 4.0, 64, 4, 0, 2, 0, 1).is_err());
    }
}
