//! The CUDA backend built in: NVIDIA GPUs through the driver, cuBLAS and NVRTC, all loaded at
//! run time (cudarc's dynamic loading), so the binary builds and starts without CUDA.
//!
//! cudarc panics when a library is missing, so each library is checked before its first use
//! and its absence becomes an error; anything that panics anyway is caught at the boundary of
//! the backend and reported as an error too.
//!
//! A device is one CUDA context and one stream. GEMMs go through cuBLAS (`cublasGemmEx`, or
//! `cublasGemmStridedBatchedEx` for a batch): bf16 operands with f32 accumulation for 2-byte
//! precisions, f32 (no TF32, as PyTorch's default) for 4-byte ones. Memory ops run the kernels
//! of `kernels.cu`, compiled by NVRTC for the device when it is opened. Each op's first run at a
//! shape is an untimed warm-up; the timed run is bracketed by CUDA events on the stream.
//! Buffers are carved from one arena of plain device memory (never managed memory) that grows
//! to the largest op seen, filled with non-zero values once.

#![allow(unsafe_code)]

use super::host::HostAdam;
use super::plan::{self, Elementwise, Plan, Precision, Rows, Work};
use crate::{Backend, Device, ExecError, OpContext, Result};
use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType_t};
use cudarc::cublas::{self, CudaBlas};
use cudarc::driver::{
    self, CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PinnedHostSlice,
    PushKernelArg,
};
use cudarc::nvrtc;
use sim::lower::OpInstance;
use std::collections::{HashMap, HashSet};
use std::ffi::c_void;
use std::fmt::Display;
use std::panic::{self, AssertUnwindSafe};
use std::sync::Arc;

/// CUDA C source of the memory-op kernels.
pub(super) const KERNELS: &str = include_str!("kernels.cu");

/// The kernels a device loads from [`KERNELS`].
pub(super) const ENTRY_POINTS: [&str; 14] = [
    "fill_u16",
    "adam",
    "copy_f32",
    "copy_bf16",
    "gelu_f32",
    "gelu_bf16",
    "dropout_f32",
    "dropout_bf16",
    "dropout_add_f32",
    "dropout_add_bf16",
    "layernorm_f32",
    "layernorm_bf16",
    "softmax_f32",
    "softmax_bf16",
];

pub(super) const NO_DRIVER: &str =
    "no NVIDIA driver found (libcuda could not be loaded): the cuda backend needs an NVIDIA GPU and driver";

/// Host buffers of an offloaded Adam step are capped lower than device ones (the host has many
/// devices' worth to hold).
const HOST_CAP_BYTES: usize = 256 << 20;
/// The smallest per-buffer cap, whatever the free memory.
const MIN_CAP_BYTES: usize = 64 << 20;
/// The arena and the pinned host buffer grow in steps of this many bytes.
const GROW_STEP_BYTES: usize = 64 << 20;
/// Threads of an element-wise block, and the most threads of a row block.
const THREADS: u32 = 256;
/// Bytes each thread of an element-wise or row kernel loads at once (`Pack` in kernels.cu).
const PACK_BYTES: usize = 16;
/// Most blocks of an element-wise launch (its grid-stride loop covers the rest).
const MAX_BLOCKS: usize = 1 << 16;
/// Drop probability of the timed dropouts.
const DROPOUT_P: f32 = 0.1;
/// Learning rate of the timed Adam steps.
const ADAM_LR: f32 = 1e-4;

/// NVIDIA GPUs, as many as the driver reports.
pub struct CudaBackend {
    /// Devices the driver reports, or why there are none.
    probe: Result<usize>,
}

impl CudaBackend {
    /// Looks for the driver and counts the devices; never panics.
    pub fn new() -> CudaBackend {
        CudaBackend { probe: guard("looking for CUDA devices", probe) }
    }
}

impl Default for CudaBackend {
    fn default() -> Self {
        CudaBackend::new()
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn device_count(&self) -> usize {
        *self.probe.as_ref().unwrap_or(&0)
    }

    fn open(&self, index: usize) -> Result<Box<dyn Device>> {
        let count = self.probe.clone()?;
        if index >= count {
            return Err(ExecError(format!(
                "CUDA device {index} not found: this machine has {count} CUDA GPU{}",
                if count == 1 { "" } else { "s" }
            )));
        }
        let device = guard(&format!("opening CUDA device {index}"), || CudaDevice::open(index))?;
        Ok(Box::new(device))
    }
}

/// Whether the driver library loads (without it cudarc panics at the first call).
pub(super) fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the library under its usual names and closes it again.
    unsafe { driver::sys::is_culib_present() }
}

fn probe() -> Result<usize> {
    if !driver_present() {
        return Err(ExecError(NO_DRIVER.into()));
    }
    let count = CudaContext::device_count().map_err(|e| {
        ExecError(format!(
            "the NVIDIA driver failed to start ({e}): the cuda backend needs a working NVIDIA GPU and driver"
        ))
    })?;
    Ok(count.max(0) as usize)
}

/// Runs `f`, turning a panic inside the CUDA libraries into an error that says what was being
/// done.
fn guard<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    panic::catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|payload| {
        let why = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        Err(ExecError(format!("{what}: the CUDA libraries failed: {why}")))
    })
}

/// An error converter: "CUDA device 0: `what`: `error`".
fn fail<E: Display>(index: usize, what: &str) -> impl FnOnce(E) -> ExecError + '_ {
    move |e| ExecError(format!("CUDA device {index}: {what}: {e}"))
}

/// One GPU: a context, a stream, a cuBLAS handle, the compiled kernels and the buffers.
struct CudaDevice {
    index: usize,
    label: String,
    /// Largest device buffer, bytes.
    cap_bytes: usize,
    /// Device memory all buffers are carved from (declared first: freed before the stream).
    arena: Option<CudaSlice<u8>>,
    arena_base: u64,
    arena_bytes: usize,
    /// Page-locked host memory for timed copies.
    pinned: Option<PinnedHostSlice<u8>>,
    host_adam: HostAdam,
    /// Work already run once (its first run is an untimed warm-up).
    warmed: HashSet<Work>,
    seed: u32,
    adam_step: u32,
    blas: CudaBlas,
    kernels: HashMap<&'static str, CudaFunction>,
    start: CudaEvent,
    end: CudaEvent,
    stream: Arc<CudaStream>,
    ctx: Arc<CudaContext>,
}

/// A column-major cuBLAS operand: device pointer, leading dimension, stride between batch
/// members (all in elements).
#[derive(Clone, Copy)]
struct Mat {
    ptr: u64,
    ld: usize,
    stride: usize,
}

const N: cublasOperation_t = cublasOperation_t::CUBLAS_OP_N;
const T: cublasOperation_t = cublasOperation_t::CUBLAS_OP_T;

impl CudaDevice {
    fn open(index: usize) -> Result<CudaDevice> {
        // SAFETY (both): only try to dlopen the library and close it again.
        if !unsafe { cublas::sys::is_culib_present() } {
            return Err(missing_library(index, "cuBLAS", "libcublas"));
        }
        if !unsafe { nvrtc::sys::is_culib_present() } {
            return Err(missing_library(index, "NVRTC", "libnvrtc"));
        }
        let ctx = CudaContext::new(index).map_err(fail(index, "creating a context"))?;
        // One stream does all the work, so its order is all the synchronisation needed: no
        // per-buffer events (SAFETY: no buffer is ever used on another stream).
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(fail(index, "creating a stream"))?;
        let blas = CudaBlas::new(stream.clone()).map_err(fail(index, "creating a cuBLAS handle"))?;
        let (major, minor) = ctx.compute_capability().map_err(fail(index, "reading the compute capability"))?;
        let kernels = compile(&ctx, index, major, minor)?;
        let timing = Some(driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = ctx.new_event(timing).map_err(fail(index, "creating an event"))?;
        let end = ctx.new_event(timing).map_err(fail(index, "creating an event"))?;
        let (free, total) = ctx.mem_get_info().map_err(fail(index, "reading free memory"))?;
        let name = ctx.name().map_err(fail(index, "reading the device name"))?;
        let label = format!("cuda:{index} ({name}, sm_{major}{minor}, {:.0} GiB)", total as f64 / (1u64 << 30) as f64);
        Ok(CudaDevice {
            index,
            label,
            // Up to five buffers are live at once: leave most of the memory free.
            cap_bytes: (free / 8).clamp(MIN_CAP_BYTES, plan::BUFFER_CAP_BYTES),
            arena: None,
            arena_base: 0,
            arena_bytes: 0,
            pinned: None,
            host_adam: HostAdam::new(),
            warmed: HashSet::new(),
            seed: 0x5eed ^ index as u32,
            adam_step: 0,
            blas,
            kernels,
            start,
            end,
            stream,
            ctx,
        })
    }

    fn bind(&self) -> Result<()> {
        self.ctx.bind_to_thread().map_err(fail(self.index, "binding the context to this thread"))
    }

    fn run(&mut self, op: &OpInstance, ctx: &OpContext) -> Result<f64> {
        let Plan { work, scale } = plan::plan(op, ctx, self.cap_bytes, HOST_CAP_BYTES)?;
        match work {
            Work::Nothing => return Ok(0.0),
            Work::HostAdam { params } => return Ok(self.host_adam.run(params) * scale),
            _ => {}
        }
        self.bind()?;
        let buffers = self.buffers(&work.buffer_bytes())?;
        if self.warmed.insert(work) {
            // Module loading, cuBLAS heuristics and caches: none of it in the timed run.
            self.enqueue(&work, &buffers)?;
        }
        Ok(self.timed(|dev| dev.enqueue(&work, &buffers))? * scale)
    }

    /// Device seconds of the work `f` enqueues, measured by events around it on the stream.
    fn timed(&mut self, f: impl FnOnce(&mut Self) -> Result<()>) -> Result<f64> {
        let index = self.index;
        self.start.record(&self.stream).map_err(fail(index, "recording an event"))?;
        f(self)?;
        self.end.record(&self.stream).map_err(fail(index, "recording an event"))?;
        // Waits for the end event.
        let ms = self.start.elapsed_ms(&self.end).map_err(fail(index, "running the work"))?;
        Ok(ms as f64 * 1e-3)
    }

    /// Device pointers of buffers of `sizes` bytes, disjoint and aligned, growing the arena if
    /// needed.
    fn buffers(&mut self, sizes: &[usize]) -> Result<Vec<u64>> {
        let (offsets, total) = plan::layout(sizes);
        if total > self.arena_bytes {
            self.grow_arena(total)?;
        }
        Ok(offsets.iter().map(|&o| self.arena_base + o as u64).collect())
    }

    fn grow_arena(&mut self, bytes: usize) -> Result<()> {
        let bytes = bytes.div_ceil(GROW_STEP_BYTES) * GROW_STEP_BYTES;
        // Free the old arena first, so old and new need not fit together.
        self.arena = None;
        self.arena_bytes = 0;
        let what = format!("allocating {:.2} GiB of device memory", bytes as f64 / (1u64 << 30) as f64);
        let arena = self.stream.alloc_zeros::<u8>(bytes).map_err(fail(self.index, &what))?;
        let base = arena.device_ptr(&self.stream).0;
        // Non-zero data, so no kernel takes a data-dependent shortcut (and the GPU draws the
        // power real data makes it draw).
        let words = (bytes / 2) as i64;
        self.seed = self.seed.wrapping_add(1);
        let seed = self.seed;
        let fill = self.function("fill_u16")?;
        let mut launch = self.stream.launch_builder(&fill);
        launch.arg(&base).arg(&words).arg(&seed);
        // SAFETY: `fill_u16(bf16*, i64, unsigned)` writes `words` 2-byte words from `base`,
        // all inside the arena just allocated.
        unsafe { launch.launch(elementwise_grid(bytes / 2)) }.map_err(fail(self.index, "filling device memory"))?;
        self.stream.synchronize().map_err(fail(self.index, &what))?;
        self.arena = Some(arena);
        self.arena_base = base;
        self.arena_bytes = bytes;
        Ok(())
    }

    fn function(&self, name: &str) -> Result<CudaFunction> {
        self.kernels
            .get(name)
            .cloned()
            .ok_or_else(|| ExecError(format!("CUDA device {}: no kernel {name}", self.index)))
    }

    /// Enqueues `work` on the stream, its buffers at `b` (in [`Work::buffer_bytes`] order).
    fn enqueue(&mut self, work: &Work, b: &[u64]) -> Result<()> {
        match *work {
            Work::Nothing | Work::HostAdam { .. } => Ok(()),
            Work::Gemm { batch, m, n, k, backward, precision } => {
                // Row-major X (m x k), W (k x n) and Y (m x n) are column-major X^T, W^T and Y^T,
                // so each product is issued transposed, as PyTorch's linear layers do.
                let x = Mat { ptr: b[0], ld: k, stride: m * k };
                let w = Mat { ptr: b[1], ld: n, stride: k * n };
                // Y forward, dY backward.
                let y = Mat { ptr: b[2], ld: n, stride: m * n };
                if backward {
                    // dX = dY . W^T, i.e. dX^T (k x m) = W (k x n) . dY^T (n x m).
                    let dx = Mat { ptr: b[3], ..x };
                    self.gemm((T, N), (k, m, n), w, y, dx, batch, precision)?;
                    // dW = X^T . dY, i.e. dW^T (n x k) = dY^T (n x m) . X (m x k).
                    let dw = Mat { ptr: b[4], ..w };
                    self.gemm((N, T), (n, k, m), y, x, dw, batch, precision)
                } else {
                    // Y = X . W, i.e. Y^T (n x m) = W^T (n x k) . X^T (k x m).
                    self.gemm((N, N), (n, m, k), w, x, y, batch, precision)
                }
            }
            Work::Elementwise { kernel, elems, precision } => {
                let n = elems as i64;
                self.seed = self.seed.wrapping_add(1);
                let (p, seed) = (DROPOUT_P, self.seed);
                let name = match kernel {
                    Elementwise::Copy => "copy",
                    Elementwise::Gelu => "gelu",
                    Elementwise::Dropout => "dropout",
                    Elementwise::DropoutResidual => "dropout_add",
                };
                let f = self.function(&format!("{name}_{}", precision.suffix()))?;
                let mut launch = self.stream.launch_builder(&f);
                match kernel {
                    Elementwise::Copy | Elementwise::Gelu => launch.arg(&b[0]).arg(&b[1]).arg(&n),
                    Elementwise::Dropout => launch.arg(&b[0]).arg(&b[1]).arg(&b[2]).arg(&n).arg(&p).arg(&seed),
                    Elementwise::DropoutResidual => {
                        launch.arg(&b[0]).arg(&b[1]).arg(&b[2]).arg(&b[3]).arg(&n).arg(&p).arg(&seed)
                    }
                };
                // One thread a 16-byte pack (kernels.cu).
                let packs = elems.div_ceil(PACK_BYTES / precision.bytes());
                // SAFETY: the arguments match the kernel's signature in kernels.cu, and each
                // buffer holds `elems` elements of the precision (the mask `elems` bytes); the
                // arena's buffers are 256-byte aligned, so the 16-byte pack accesses are too.
                unsafe { launch.launch(elementwise_grid(packs)) }.map_err(fail(self.index, name))?;
                Ok(())
            }
            Work::Rows { kernel, rows, width, precision } => {
                let w = width as i64;
                let name = match kernel {
                    Rows::LayerNorm => "layernorm",
                    Rows::Softmax => "softmax",
                };
                let f = self.function(&format!("{name}_{}", precision.suffix()))?;
                let mut launch = self.stream.launch_builder(&f);
                match kernel {
                    Rows::LayerNorm => launch.arg(&b[0]).arg(&b[1]).arg(&b[2]).arg(&b[3]).arg(&w),
                    Rows::Softmax => launch.arg(&b[0]).arg(&b[1]).arg(&w),
                };
                // A thread a pack when the width is a multiple of one (kernels.cu).
                let pack = PACK_BYTES / precision.bytes();
                let per_row = if width % pack == 0 { width / pack } else { width };
                let threads = (per_row.next_power_of_two() as u32).clamp(32, THREADS);
                let grid =
                    LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 };
                // SAFETY: the arguments match the kernel's signature; block i reads and writes
                // row i of `width` elements, i < rows, and gamma and beta hold `width` floats.
                unsafe { launch.launch(grid) }.map_err(fail(self.index, name))?;
                Ok(())
            }
            Work::Adam { params } => {
                self.adam_step = self.adam_step.saturating_add(1);
                let t = self.adam_step as i32;
                let (c1, c2) = (1.0 / (1.0 - 0.9f32.powi(t)), 1.0 / (1.0 - 0.999f32.powi(t)));
                let (n, lr) = (params as i64, ADAM_LR);
                let f = self.function("adam")?;
                let mut launch = self.stream.launch_builder(&f);
                launch.arg(&b[0]).arg(&b[1]).arg(&b[2]).arg(&b[3]).arg(&n).arg(&lr).arg(&c1).arg(&c2);
                // SAFETY: the arguments match `adam` in kernels.cu; each buffer holds `params`
                // floats.
                unsafe { launch.launch(elementwise_grid(params.div_ceil(PACK_BYTES / 4))) }
                    .map_err(fail(self.index, "adam"))?;
                Ok(())
            }
        }
    }

    /// C = A . B (with the given transposes) for each of `batch` column-major products of
    /// shape (m, n, k), scaled by 1/k so values stay in range however often buffers are reused.
    fn gemm(
        &self,
        (op_a, op_b): (cublasOperation_t, cublasOperation_t),
        (m, n, k): (usize, usize, usize),
        a: Mat,
        b: Mat,
        c: Mat,
        batch: usize,
        precision: Precision,
    ) -> Result<()> {
        let dtype = match precision {
            Precision::F32 => cudaDataType_t::CUDA_R_32F,
            Precision::Bf16 => cudaDataType_t::CUDA_R_16BF,
        };
        // The plan's cap keeps every count far below 2^31; a failure here is a bug, not a panic.
        let int = |x: usize| {
            i32::try_from(x).map_err(|_| ExecError(format!("CUDA device {}: GEMM dimension {x} too large", self.index)))
        };
        let (mi, ni, ki, batch_i) = (int(m)?, int(n)?, int(k)?, int(batch)?);
        let (lda, ldb, ldc) = (int(a.ld)?, int(b.ld)?, int(c.ld)?);
        let alpha = 1.0f32 / k as f32;
        let beta = 0.0f32;
        let (alpha, beta) = (&alpha as *const f32 as *const c_void, &beta as *const f32 as *const c_void);
        let (pa, pb, pc) = (a.ptr as *const c_void, b.ptr as *const c_void, c.ptr as *mut c_void);
        let compute = cublasComputeType_t::CUBLAS_COMPUTE_32F;
        let algo = cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT;
        let handle = *self.blas.handle();
        // SAFETY: the operands lie in the arena, sized by `Work::buffer_bytes` for these shapes
        // (each batch member `stride` elements on), and alpha and beta outlive the call (host
        // pointer mode reads them before it returns).
        let result = unsafe {
            if batch == 1 {
                cublas::result::gemm_ex(
                    handle, op_a, op_b, mi, ni, ki, alpha, pa, dtype, lda, pb, dtype, ldb, beta, pc, dtype, ldc,
                    compute, algo,
                )
            } else {
                cublas::result::gemm_strided_batched_ex(
                    handle,
                    op_a,
                    op_b,
                    mi,
                    ni,
                    ki,
                    alpha,
                    pa,
                    dtype,
                    lda,
                    a.stride as i64,
                    pb,
                    dtype,
                    ldb,
                    b.stride as i64,
                    beta,
                    pc,
                    dtype,
                    ldc,
                    c.stride as i64,
                    batch_i,
                    compute,
                    algo,
                )
            }
        };
        result.map_err(fail(self.index, "cuBLAS GEMM"))
    }

    fn copy_inner(&mut self, bytes: usize, to_device: bool) -> Result<f64> {
        if bytes == 0 {
            return Ok(0.0);
        }
        let run = bytes.min(self.cap_bytes);
        self.bind()?;
        let device = self.buffers(&[run])?[0];
        if self.pinned.as_ref().is_none_or(|p| p.len() < run) {
            self.pinned = None;
            let len = run.div_ceil(GROW_STEP_BYTES) * GROW_STEP_BYTES;
            // SAFETY: the memory is only ever a DMA source or target, never read from Rust.
            // Flags 0: plain page-locked memory, as `torch.Tensor.pin_memory()` allocates.
            let pinned = unsafe { self.ctx.alloc_pinned_with_flags::<u8>(len, 0) };
            self.pinned = Some(pinned.map_err(fail(self.index, "allocating pinned host memory"))?);
        }
        let pinned = self.pinned.as_mut().expect("allocated above");
        let host = pinned.as_mut_ptr().map_err(fail(self.index, "pinned host memory"))?;
        let stream = self.stream.cu_stream();
        let seconds = self.timed(|dev| {
            // SAFETY: `run` bytes fit both the pinned buffer and the device buffer, and both
            // outlive the copy (the timing waits for it).
            let result = unsafe {
                if to_device {
                    driver::sys::cuMemcpyHtoDAsync_v2(device, host as *const c_void, run, stream)
                } else {
                    driver::sys::cuMemcpyDtoHAsync_v2(host as *mut c_void, device, run, stream)
                }
            };
            result.result().map_err(fail(dev.index, "copying between host and device"))
        })?;
        Ok(seconds * (bytes as f64 / run as f64))
    }
}

impl Device for CudaDevice {
    fn name(&self) -> String {
        self.label.clone()
    }

    fn run_op(&mut self, op: &OpInstance, ctx: &OpContext) -> Result<f64> {
        let what = format!("CUDA device {}: op {}", self.index, op.spec.name);
        guard(&what, || self.run(op, ctx))
    }

    fn copy(&mut self, bytes: usize, to_device: bool) -> Result<f64> {
        let what = format!("CUDA device {}: copying {bytes} bytes", self.index);
        guard(&what, || self.copy_inner(bytes, to_device))
    }

    fn synchronize(&mut self) -> Result<()> {
        guard("synchronizing a CUDA device", || {
            self.bind()?;
            self.stream.synchronize().map_err(fail(self.index, "synchronizing"))
        })
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        // Let queued work finish before its buffers are freed; an error here has nowhere to go.
        let _ = self.stream.synchronize();
    }
}

fn missing_library(index: usize, what: &str, file: &str) -> ExecError {
    ExecError(format!(
        "CUDA device {index}: {what} could not be loaded ({file}.so not found): the cuda backend needs the CUDA 13 \
         libraries on LD_LIBRARY_PATH (with PyTorch installed from pip: <site-packages>/nvidia/cu13/lib)"
    ))
}

/// Compiles [`KERNELS`] for the device's architecture and loads its entry points.
fn compile(
    ctx: &Arc<CudaContext>,
    index: usize,
    major: i32,
    minor: i32,
) -> Result<HashMap<&'static str, CudaFunction>> {
    let opts = |arch: Option<String>| nvrtc::CompileOptions {
        name: Some("trainsim_kernels.cu".into()),
        options: arch.into_iter().collect(),
        ..Default::default()
    };
    let ptx = nvrtc::compile_ptx_with_opts(KERNELS, opts(Some(format!("--gpu-architecture=compute_{major}{minor}"))))
        // An NVRTC older than the GPU does not know its architecture: its default PTX target
        // is older, and the driver compiles that for the GPU.
        .or_else(|_| nvrtc::compile_ptx_with_opts(KERNELS, opts(None)))
        .map_err(|e| ExecError(format!("CUDA device {index}: compiling the kernels: {}", compile_error(&e))))?;
    let module = ctx.load_module(ptx).map_err(fail(
        index,
        "loading the kernels (an NVRTC newer than the driver emits PTX the driver cannot load: use the NVRTC of \
         the driver's CUDA version)",
    ))?;
    let mut kernels = HashMap::new();
    for name in ENTRY_POINTS {
        let f = module.load_function(name).map_err(fail(index, &format!("loading kernel {name}")))?;
        kernels.insert(name, f);
    }
    Ok(kernels)
}

/// NVRTC's log when there is one (cudarc's Display is its Debug, with the log as a C string).
pub(super) fn compile_error(e: &nvrtc::CompileError) -> String {
    match e {
        nvrtc::CompileError::CompileError { nvrtc, log, .. } => format!("{nvrtc}: {}", log.to_string_lossy()),
        other => other.to_string(),
    }
}

/// A grid-stride launch over `elems` elements.
fn elementwise_grid(elems: usize) -> LaunchConfig {
    let blocks = elems.div_ceil(THREADS as usize).clamp(1, MAX_BLOCKS) as u32;
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_inside_becomes_an_error() {
        let err = guard::<()>("opening CUDA device 3", || panic!("libcublas.so not found")).unwrap_err();
        assert!(err.0.contains("opening CUDA device 3") && err.0.contains("libcublas.so not found"), "{err}");
        assert_eq!(guard("x", || Ok(7)), Ok(7));
    }

    #[test]
    fn without_a_driver_the_backend_says_so() {
        if driver_present() {
            return;
        }
        let backend = CudaBackend::new();
        assert_eq!(backend.device_count(), 0);
        assert_eq!(backend.open(0).err(), Some(ExecError(NO_DRIVER.into())));
    }

    /// NVRTC needs no GPU: where the library loads (LD_LIBRARY_PATH pointing at pip's
    /// nvidia/cu13/lib will do), check that every kernel compiles for the GPUs we run on.
    #[test]
    fn kernels_compile_where_nvrtc_loads() {
        // SAFETY: only tries to dlopen the library.
        if !unsafe { nvrtc::sys::is_culib_present() } {
            eprintln!("NVRTC not found: kernel compilation not checked");
            return;
        }
        for arch in ["compute_80", "compute_90"] {
            let opts =
                nvrtc::CompileOptions { options: vec![format!("--gpu-architecture={arch}")], ..Default::default() };
            let ptx = nvrtc::compile_ptx_with_opts(KERNELS, opts)
                .unwrap_or_else(|e| panic!("{arch}: {}", compile_error(&e)))
                .to_src();
            for name in ENTRY_POINTS {
                assert!(ptx.contains(&format!(".entry {name}(")), "{arch}: no entry point {name}");
            }
        }
    }

    #[test]
    fn launch_grids_cover_the_elements() {
        assert_eq!(elementwise_grid(0).grid_dim, (1, 1, 1));
        assert_eq!(elementwise_grid(257).grid_dim, (2, 1, 1));
        assert_eq!(elementwise_grid(usize::MAX / 2).grid_dim, (MAX_BLOCKS as u32, 1, 1));
    }
}
