//! The CUDA backend when the binary is built without the `cuda` feature: the same API, no
//! devices, and an error that says how to get them.

use crate::{Backend, Device, ExecError, Result};

/// The CUDA backend, not built in: no devices.
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
