//! The CUDA backend. Placeholder until the cudarc implementation lands.

use crate::{Backend, Device, ExecError, Result};

pub struct CudaBackend;

impl CudaBackend {
    pub fn new() -> CudaBackend {
        CudaBackend
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
        0
    }
    fn open(&self, _index: usize) -> Result<Box<dyn Device>> {
        Err(ExecError("the cuda backend is not built into this binary (build with --features cuda)".into()))
    }
}
