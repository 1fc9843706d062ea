//! The executor: runs the ops of a lowered [`sim::lower::Program`] on real devices and
//! measures them, so the simulator's cost model can be calibrated and checked.
//!
//! [`Backend`] is the one interface; [`cpu`] runs real kernels on host threads (each thread a
//! device), [`cuda`] on NVIDIA GPUs through the driver loaded at run time (behind the `cuda`
//! feature; without it a stub with the same API says it was not built in). Measurement code
//! never consults the simulator's cost model: it reads only the Program's shapes.

pub mod calibrate;
pub mod cpu;
pub mod cuda;
pub mod replay;
mod shapes;
#[cfg(test)]
mod test_ops;
#[cfg(feature = "torch")]
pub mod torch;

use sim::lower::OpInstance;
use std::fmt;

/// An executor error: what failed, said plainly.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecError(pub String);

impl fmt::Display for ExecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ExecError {}

pub type Result<T> = std::result::Result<T, ExecError>;

/// How a GPU executor stores an element of the training precision: f32 for a 4-byte
/// precision, bf16 for every precision of 2 bytes or less (fp16 and fp8 run as bf16). The one
/// place an element size picks a storage type: the CUDA kernels and cuBLAS data types, the
/// torch backend's tensor kind and the precision a calibration profile records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Precision {
    F32,
    Bf16,
}

impl Precision {
    /// The storage type for `element_bytes` per element: f32 for 4 bytes, bf16 below.
    pub fn for_element_bytes(element_bytes: f64) -> Precision {
        if element_bytes > 3.0 { Precision::F32 } else { Precision::Bf16 }
    }

    /// Bytes of one stored element.
    pub fn bytes(self) -> usize {
        match self {
            Precision::F32 => 4,
            Precision::Bf16 => 2,
        }
    }

    /// The name a profile records ("fp32", "bf16"), as `training.precision` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "fp32",
            Precision::Bf16 => "bf16",
        }
    }
}

/// Shapes an op needs besides its spec (widths of norms and softmax rows).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OpContext {
    pub hidden: usize,
    pub seq_len: usize,
    /// Bytes of one element at the training precision: element counts of memory-bound ops
    /// are their bytes / (2 x this). The CPU computes in f32 on those element counts, so it
    /// moves 4 / element_bytes times the bytes; calibration measures it the same way.
    pub element_bytes: f64,
}

/// One device of a backend: runs ops and copies, timed on the device.
pub trait Device: Send {
    fn name(&self) -> String;
    /// Run one op at its real shapes; returns the device-measured seconds.
    fn run_op(&mut self, op: &OpInstance, ctx: &OpContext) -> Result<f64>;
    /// Copy `bytes` between host and device memory (or, on the CPU, between buffers);
    /// returns the measured seconds.
    fn copy(&mut self, bytes: usize, to_device: bool) -> Result<f64>;
    /// Wait for everything issued so far.
    fn synchronize(&mut self) -> Result<()>;
}

/// A kind of hardware: how many devices it has and how to open one.
pub trait Backend {
    fn name(&self) -> &'static str;
    /// Devices available now (0 with no hardware or driver: `open` then explains).
    fn device_count(&self) -> usize;
    fn open(&self, index: usize) -> Result<Box<dyn Device>>;
}

/// The backend called `name` (`cpu` or `cuda`), or an error listing them.
pub fn backend(name: &str) -> Result<Box<dyn Backend>> {
    match name {
        "cpu" => Ok(Box::new(cpu::CpuBackend::new())),
        "cuda" => Ok(Box::new(cuda::CudaBackend::new())),
        #[cfg(feature = "torch")]
        "torch" => Ok(Box::new(torch::TorchBackend::new())),
        #[cfg(not(feature = "torch"))]
        "torch" => Err(ExecError(
            "backend \"torch\" is not built into this binary (build with --features torch and a PyTorch 2.11 libtorch)"
                .into(),
        )),
        other => Err(ExecError(format!("unknown backend \"{other}\"; available: cpu, cuda"))),
    }
}
