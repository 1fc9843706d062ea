//! Cost models: how long an op takes on a device, and the static memory of a plan.
//!
//! Compute follows a roofline: `max(flops / (peak x efficiency(shape)), bytes / (bandwidth x
//! mem_efficiency)) + launch`. The GEMM efficiency starts from the device's large-GEMM
//! efficiency and loses what tile quantization (partial 128x128 output tiles), wave
//! quantization (the last wave of tiles leaves SMs idle) and a short K loop (prologue and
//! epilogue of the main loop, two 32-deep steps) cost. A [`Calibration`] from measurements
//! replaces the device defaults.
//! Communication time is not here: the engine moves bytes over links (see `network`).

pub mod memory;
pub mod slice;

use crate::hardware::{DeviceKind, DeviceSpec, Precision};
use crate::workload::{OpClass, OpSpec};

/// The kernel family a memory-bound op belongs to (ops of a family cost the same per byte;
/// calibration measures one rate per family).
pub fn memory_kernel(name: &str) -> &'static str {
    match name {
        "ln1" | "ln2" | "final_norm" => "ln1",
        "softmax" => "softmax",
        "act" => "act",
        "attn_dropout" => "attn_dropout",
        "dropout_residual" => "dropout_residual",
        "optimizer" | "cpu_optimizer" => "optimizer",
        _ => "embedding",
    }
}

/// Measured corrections of a device's defaults (from the executor's calibration).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Calibration {
    pub gemm_efficiency: f64,
    pub mem_efficiency: f64,
    pub kernel_launch_s: f64,
}

/// Times ops on one device at one precision.
#[derive(Clone, Debug)]
pub struct ComputeModel {
    peak_flops: f64,
    gemm_efficiency: f64,
    mem_bytes_per_s: f64,
    launch_s: f64,
    units: f64,
    quantize: bool,
    /// Measured bytes per second per memory-kernel family (overrides the roofline).
    op_rates: Vec<(&'static str, f64)>,
    /// Efficiency factor per op name (the device's `op_efficiency`).
    op_factors: Vec<(String, f64)>,
    /// GEMM weights sit in on-chip memory (an FPGA whose stage fits its SRAM): they are not
    /// read from device memory.
    weights_on_chip: bool,
}

const TILE: f64 = 128.0;
const K_STEP: f64 = 32.0;

impl ComputeModel {
    pub fn new(device: &DeviceSpec, precision: Precision, calibration: Option<Calibration>) -> ComputeModel {
        let (ge, me, launch) = match calibration {
            Some(c) => (c.gemm_efficiency, c.mem_efficiency, c.kernel_launch_s),
            None => (device.gemm_efficiency, device.mem_efficiency, device.kernel_launch_s),
        };
        ComputeModel {
            peak_flops: device.peak_flops.at(precision),
            gemm_efficiency: ge,
            mem_bytes_per_s: device.mem_bandwidth_bytes_per_s * me,
            launch_s: launch,
            units: device.compute_units.max(1) as f64,
            quantize: device.kind == DeviceKind::Gpu,
            op_rates: Vec::new(),
            op_factors: device.op_efficiency.clone(),
            weights_on_chip: false,
        }
    }

    /// Keep GEMM weights on chip (not read from device memory).
    pub fn with_weights_on_chip(mut self, on_chip: bool) -> ComputeModel {
        self.weights_on_chip = on_chip;
        self
    }

    /// Use measured streaming rates per memory-kernel family (name, bytes/s).
    pub fn with_op_rates(mut self, rates: &[(String, f64)]) -> ComputeModel {
        self.op_rates = rates.iter().map(|(n, r)| (memory_kernel(n), *r)).collect();
        self
    }

    /// Fraction of peak a GEMM of this shape reaches.
    pub fn gemm_efficiency(&self, batch: f64, m: f64, n: f64, k: f64) -> f64 {
        let k_eff = (k / K_STEP) / (k / K_STEP + 2.0);
        if !self.quantize {
            return self.gemm_efficiency * k_eff;
        }
        let tm = (m / TILE).ceil().max(1.0);
        let tn = (n / TILE).ceil().max(1.0);
        let tile_util = (m * n) / (tm * tn * TILE * TILE);
        let tiles = batch * tm * tn;
        let waves = (tiles / self.units).ceil().max(1.0);
        let wave_util = tiles / (waves * self.units);
        self.gemm_efficiency * tile_util * wave_util * k_eff
    }

    pub fn memory_s(&self, bytes: f64) -> f64 {
        bytes / self.mem_bytes_per_s
    }

    /// Seconds for one op, forward or backward.
    pub fn op_s(&self, op: &OpSpec, backward: bool) -> f64 {
        let (flops, mut bytes) =
            if backward { (op.backward_flops, op.backward_bytes) } else { (op.forward_flops, op.forward_bytes) };
        let factor = self.op_factors.iter().find(|(n, _)| n == op.name).map_or(1.0, |(_, f)| *f);
        let compute = match op.class {
            OpClass::Gemm { batch, m, n, k } => {
                if self.weights_on_chip {
                    // The weight matrix (k x n) is read from SRAM, not device memory.
                    let passes = if backward { 2.0 } else { 1.0 };
                    bytes = (bytes - passes * batch * k * n * bytes_per_elem(op, batch, m, n, k, backward)).max(0.0);
                }
                flops / (self.peak_flops * self.gemm_efficiency(batch, m, n, k) * factor)
            }
            OpClass::Memory => {
                let family = memory_kernel(op.name);
                if let Some(&(_, rate)) = self.op_rates.iter().find(|(f, _)| *f == family) {
                    return bytes / rate + self.launch_s;
                }
                0.0
            }
        };
        compute.max(self.memory_s(bytes)) + launches(op, backward) * self.launch_s
    }

    pub fn launch_s(&self) -> f64 {
        self.launch_s
    }
}

/// Kernels an op launches: the backward of a GEMM is two GEMMs.
pub fn launches(op: &OpSpec, backward: bool) -> f64 {
    if backward && matches!(op.class, OpClass::Gemm { .. }) { 2.0 } else { 1.0 }
}

/// Bytes per element of a GEMM op, recovered from its byte count (batch x e x (mk + kn + mn)
/// per pass).
fn bytes_per_elem(op: &OpSpec, batch: f64, m: f64, n: f64, k: f64, backward: bool) -> f64 {
    let (bytes, passes) = if backward { (op.backward_bytes, 2.0) } else { (op.forward_bytes, 1.0) };
    let elems = passes * batch * (m * k + k * n + m * n);
    if elems > 0.0 { bytes / elems } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::catalog;
    use crate::workload::Saved;

    fn gemm(name: &'static str, m: f64, n: f64, k: f64) -> OpSpec {
        let flops = 2.0 * m * n * k;
        let bytes = 2.0 * (m * k + k * n + m * n);
        OpSpec {
            name,
            class: OpClass::Gemm { batch: 1.0, m, n, k },
            forward_flops: flops,
            forward_bytes: bytes,
            backward_flops: 2.0 * flops,
            backward_bytes: 2.0 * bytes,
            saved: Saved::default(),
        }
    }

    #[test]
    fn op_kind_efficiency_scales_compute_bound_gemms() {
        let mut dev = catalog::device("alveo-u280").expect("preset");
        dev.op_efficiency = vec![("slow".into(), 0.5)];
        dev.kernel_launch_s = 0.0;
        let m = ComputeModel::new(&dev, Precision::Fp16, None);
        let (a, b) = (
            m.op_s(&gemm("conv", 4096.0, 4096.0, 4096.0), false),
            m.op_s(&gemm("slow", 4096.0, 4096.0, 4096.0), false),
        );
        assert!((b / a - 2.0).abs() < 1e-9, "{b} vs {a}");
    }

    #[test]
    fn weights_on_chip_free_a_weight_bound_gemm_from_device_memory() {
        let mut dev = catalog::device("alveo-u280").expect("preset");
        dev.kernel_launch_s = 0.0;
        // A fully connected layer at batch 1: all weight traffic, memory bound.
        let fc = gemm("fc", 1.0, 4096.0, 4096.0);
        let off = ComputeModel::new(&dev, Precision::Fp16, None).op_s(&fc, false);
        let on = ComputeModel::new(&dev, Precision::Fp16, None).with_weights_on_chip(true).op_s(&fc, false);
        assert!(on < 0.5 * off, "on chip {on} vs off {off}");
    }
}
