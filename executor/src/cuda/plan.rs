//! What a CUDA device runs for one op: the kernel, its shapes and buffers, shrunk to the buffer
//! cap, and the factor its measured time is scaled by. Pure arithmetic on the Program's shapes,
//! so it is tested on machines without a GPU.
//!
//! The conventions are the CPU backend's, so the two backends run the same work for an op: a
//! memory op's element count is `bytes / (2 * element_bytes)` (read plus write at the training
//! precision), the optimizer runs Adam on `bytes / 28` parameters, and the op's name picks the
//! kernel. Unlike the CPU, the GPU stores elements at the training precision (bf16 for 2-byte
//! precisions, f32 for 4), so a copy moves exactly the op's bytes.

use crate::shapes::{count, fit_gemm};
use crate::{ExecError, OpContext, Result};
use sim::lower::OpInstance;
#[cfg(test)]
use sim::workload::OpClass;

/// The most bytes one device buffer holds; a bigger op runs shrunk and its time is scaled up
/// linearly (by elements, or by FLOPs for a GEMM).
pub(super) const BUFFER_CAP_BYTES: usize = 2 << 30;

/// Bytes the optimizer step moves per parameter with mixed-precision Adam (as the CPU backend:
/// `sim::cost::memory::optimizer_traffic_bytes`).
pub(super) const ADAM_BYTES_PER_PARAM: f64 = 28.0;

/// Byte alignment of each buffer carved out of a device's arena.
pub(super) const ALIGN_BYTES: usize = 256;

pub(super) use crate::Precision;

impl Precision {
    /// Suffix of the kernels compiled for this storage type (`layernorm_bf16`).
    pub(super) fn suffix(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
        }
    }
}

/// An element-wise kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Elementwise {
    Copy,
    Gelu,
    Dropout,
    /// Dropout then residual add, fused (as Megatron's bias-dropout-add).
    DropoutResidual,
}

/// A kernel over rows of a fixed width, one thread block a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Rows {
    LayerNorm,
    Softmax,
}

/// The work one op puts on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Work {
    /// Nothing to do (an empty op).
    Nothing,
    /// `batch` row-major products Y = X . W with X m x k, W k x n; backward computes
    /// dX = dY . W^T and dW = X^T . dY instead.
    Gemm {
        batch: usize,
        m: usize,
        n: usize,
        k: usize,
        backward: bool,
        precision: Precision,
    },
    Elementwise {
        kernel: Elementwise,
        elems: usize,
        precision: Precision,
    },
    Rows {
        kernel: Rows,
        rows: usize,
        width: usize,
        precision: Precision,
    },
    /// Adam on f32 parameters, gradients and moments in device memory.
    Adam {
        params: usize,
    },
    /// Adam on the host CPU (an offloaded optimizer step).
    HostAdam {
        params: usize,
    },
}

/// Work to run and the factor that turns its measured time into the op's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Plan {
    pub work: Work,
    pub scale: f64,
}

impl Work {
    /// Bytes of each device buffer the work uses, in the order the device passes them:
    /// forward GEMM [X, W, Y]; backward GEMM [X, W, dY, dX, dW]; copy and GeLU [x, y]; dropout
    /// [x, y, mask]; dropout-residual [x, residual, out, mask]; layernorm [x, y, gamma, beta];
    /// softmax [x, y]; Adam [params, grads, m, v].
    pub(super) fn buffer_bytes(&self) -> Vec<usize> {
        match *self {
            Work::Nothing | Work::HostAdam { .. } => Vec::new(),
            Work::Gemm { batch, m, n, k, backward, precision } => {
                let e = precision.bytes();
                let (x, w, y) = (batch * m * k * e, batch * k * n * e, batch * m * n * e);
                if backward { vec![x, w, y, x, w] } else { vec![x, w, y] }
            }
            Work::Elementwise { kernel, elems, precision } => {
                let a = elems * precision.bytes();
                match kernel {
                    Elementwise::Copy | Elementwise::Gelu => vec![a, a],
                    Elementwise::Dropout => vec![a, a, elems],
                    Elementwise::DropoutResidual => vec![a, a, a, elems],
                }
            }
            Work::Rows { kernel, rows, width, precision } => {
                let a = rows * width * precision.bytes();
                match kernel {
                    Rows::LayerNorm => vec![a, a, width * 4, width * 4],
                    Rows::Softmax => vec![a, a],
                }
            }
            Work::Adam { params } => vec![params * 4; 4],
        }
    }
}

/// Offsets of `sizes` laid out one after another, each aligned, and the bytes they span.
pub(super) fn layout(sizes: &[usize]) -> (Vec<usize>, usize) {
    let mut offsets = Vec::with_capacity(sizes.len());
    let mut end = 0;
    for &size in sizes {
        offsets.push(end);
        end += size.div_ceil(ALIGN_BYTES) * ALIGN_BYTES;
    }
    (offsets, end)
}

/// What to run for `op`, with no buffer over `cap_bytes` (host buffers under `host_cap_bytes`).
pub(super) fn plan(op: &OpInstance, ctx: &OpContext, cap_bytes: usize, host_cap_bytes: usize) -> Result<Plan> {
    let spec = &op.spec;
    let name = spec.name;
    if !(ctx.element_bytes.is_finite() && ctx.element_bytes > 0.0) {
        return Err(ExecError(format!("op {name}: element size {} bytes is not positive", ctx.element_bytes)));
    }
    let precision = Precision::for_element_bytes(ctx.element_bytes);
    let nothing = Plan { work: Work::Nothing, scale: 1.0 };
    if let Some((batch, m, n, k, backward)) = op.gemm() {
        let (batch, m) = (count(name, "batch", batch)?, count(name, "m", m)?);
        let (n, k) = (count(name, "n", n)?, count(name, "k", k)?);
        if batch == 0 || m == 0 || n == 0 || k == 0 {
            return Ok(nothing);
        }
        let fit = fit_gemm(batch, m, n, k, (cap_bytes / precision.bytes()).max(1));
        let work = Work::Gemm { batch: fit.batch, m: fit.m, n: fit.n, k: fit.k, backward, precision };
        return Ok(Plan { work, scale: fit.scale });
    }
    let bytes = if op.backward { spec.backward_bytes } else { spec.forward_bytes };
    if sim::cost::is_optimizer_step(name) {
        let params = count(name, "parameters", bytes / ADAM_BYTES_PER_PARAM)?;
        if params == 0 {
            return Ok(nothing);
        }
        // f32 parameters, gradients and moments: four buffers of `run` floats.
        let cap = if op.on_host { host_cap_bytes } else { cap_bytes };
        let run = params.min((cap / 4).max(1));
        let work = if op.on_host { Work::HostAdam { params: run } } else { Work::Adam { params: run } };
        return Ok(Plan { work, scale: params as f64 / run as f64 });
    }
    // Read plus write at the training precision.
    let elems = count(name, "elements", bytes / (2.0 * ctx.element_bytes))?;
    if elems == 0 {
        return Ok(nothing);
    }
    let cap_elems = (cap_bytes / precision.bytes()).max(1);
    let rows = |kernel, width: usize, what: &str| {
        if width == 0 {
            return Err(ExecError(format!("op {name}: context {what} is 0")));
        }
        let rows = (elems / width).max(1);
        let run = rows.min((cap_elems / width).max(1));
        Ok(Plan { work: Work::Rows { kernel, rows: run, width, precision }, scale: rows as f64 / run as f64 })
    };
    let elementwise = |kernel| {
        let run = elems.min(cap_elems);
        Plan { work: Work::Elementwise { kernel, elems: run, precision }, scale: elems as f64 / run as f64 }
    };
    // The kernel of the op's family, as the cost model groups them (`sim::cost::memory_kernel`),
    // so a calibrated family rate describes the kernel that runs.
    Ok(match sim::cost::memory_kernel(name) {
        "ln1" => rows(Rows::LayerNorm, ctx.hidden, "hidden")?,
        "softmax" => rows(Rows::Softmax, ctx.seq_len, "seq_len")?,
        "act" => elementwise(Elementwise::Gelu),
        "attn_dropout" => elementwise(Elementwise::Dropout),
        "dropout_residual" => elementwise(Elementwise::DropoutResidual),
        // Embedding lookups, the loss and anything else: a copy of the op's bytes.
        _ => elementwise(Elementwise::Copy),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_ops::op;

    const CAP: usize = BUFFER_CAP_BYTES;

    fn ctx(element_bytes: f64) -> OpContext {
        OpContext { hidden: 1024, seq_len: 512, element_bytes }
    }

    fn gemm(batch: f64, m: f64, n: f64, k: f64, backward: bool) -> OpInstance {
        op("qkv", OpClass::Gemm { batch, m, n, k }, 0.0, backward)
    }

    #[test]
    fn gemm_shapes_come_from_the_op_class() {
        let p = plan(&gemm(2.0, 512.0, 3072.0, 1024.0, true), &ctx(2.0), CAP, CAP).unwrap();
        let work = Work::Gemm { batch: 2, m: 512, n: 3072, k: 1024, backward: true, precision: Precision::Bf16 };
        assert_eq!(p, Plan { work, scale: 1.0 });
        assert_eq!(
            work.buffer_bytes(),
            vec![2 * 512 * 1024 * 2, 2 * 1024 * 3072 * 2, 2 * 512 * 3072 * 2, 2 * 512 * 1024 * 2, 2 * 1024 * 3072 * 2]
        );
        let p = plan(&gemm(1.0, 8.0, 8.0, 8.0, false), &ctx(4.0), CAP, CAP).unwrap();
        assert_eq!(p.work, Work::Gemm { batch: 1, m: 8, n: 8, k: 8, backward: false, precision: Precision::F32 });
        assert_eq!(p.work.buffer_bytes().len(), 3);
    }

    #[test]
    fn oversized_gemms_shrink_and_scale_by_flops() {
        // A 256k-vocabulary output layer: the weight alone is over the cap.
        let (m, n, k) = (8192.0, 262144.0, 8192.0);
        let p = plan(&gemm(1.0, m, n, k, false), &ctx(2.0), CAP, CAP).unwrap();
        let Work::Gemm { batch, m: m2, n: n2, k: k2, .. } = p.work else { panic!("{p:?}") };
        for bytes in p.work.buffer_bytes() {
            assert!(bytes <= CAP, "{bytes} > {CAP}");
        }
        let ratio = (m * n * k) / (batch * m2 * n2 * k2) as f64;
        assert!((p.scale - ratio).abs() < 1e-9 * ratio && p.scale > 1.0, "{p:?}");
        // A big batch of small products runs fewer of them.
        let fit = fit_gemm(1 << 20, 64, 64, 64, 1 << 20);
        assert_eq!((fit.batch, fit.m, fit.n, fit.k), (256, 64, 64, 64));
        assert_eq!(fit.scale, 4096.0);
        // Dimensions always stay within cuBLAS's 32-bit arguments.
        let fit = fit_gemm(3, usize::MAX / 4, 5, 7, CAP / 2);
        assert!(fit.m * fit.k <= CAP / 2 && fit.m < i32::MAX as usize, "{fit:?}");
    }

    #[test]
    fn empty_and_invalid_ops() {
        assert_eq!(plan(&gemm(0.0, 8.0, 8.0, 8.0, false), &ctx(2.0), CAP, CAP).unwrap().work, Work::Nothing);
        let err = plan(&gemm(1.0, f64::NAN, 8.0, 8.0, false), &ctx(2.0), CAP, CAP).unwrap_err();
        assert!(err.0.contains("qkv") && err.0.contains("m = NaN"), "{err}");
        assert!(plan(&gemm(1.0, -1.0, 8.0, 8.0, false), &ctx(2.0), CAP, CAP).is_err());
        assert!(plan(&op("act", OpClass::Memory, 1e6, false), &ctx(0.0), CAP, CAP).is_err());
        assert_eq!(plan(&op("act", OpClass::Memory, 1.0, false), &ctx(2.0), CAP, CAP).unwrap().work, Work::Nothing);
        let no_hidden = OpContext { hidden: 0, ..ctx(2.0) };
        let err = plan(&op("ln1", OpClass::Memory, 1e6, false), &no_hidden, CAP, CAP).unwrap_err();
        assert!(err.0.contains("hidden"), "{err}");
    }

    #[test]
    fn memory_ops_follow_the_cpu_element_count_and_names() {
        let c = ctx(2.0);
        let bytes = 2.0 * 2.0 * 1024.0 * 64.0; // 64 rows of hidden, read and written
        let p = plan(&op("ln1", OpClass::Memory, bytes, false), &c, CAP, CAP).unwrap();
        assert_eq!(p.work, Work::Rows { kernel: Rows::LayerNorm, rows: 64, width: 1024, precision: Precision::Bf16 });
        let p = plan(&op("softmax", OpClass::Memory, bytes, false), &c, CAP, CAP).unwrap();
        assert_eq!(p.work, Work::Rows { kernel: Rows::Softmax, rows: 128, width: 512, precision: Precision::Bf16 });
        let elementwise = |name| plan(&op(name, OpClass::Memory, 4000.0, true), &c, CAP, CAP).unwrap().work;
        // Backward moves 1.5x the forward bytes: 6000 bytes, 1500 bf16 elements.
        let e = |kernel| Work::Elementwise { kernel, elems: 1500, precision: Precision::Bf16 };
        assert_eq!(elementwise("act"), e(Elementwise::Gelu));
        assert_eq!(elementwise("attn_dropout"), e(Elementwise::Dropout));
        assert_eq!(elementwise("dropout_residual"), e(Elementwise::DropoutResidual));
        assert_eq!(elementwise("embedding"), e(Elementwise::Copy));
        assert_eq!(elementwise("loss"), e(Elementwise::Copy));
        assert_eq!(e(Elementwise::DropoutResidual).buffer_bytes(), vec![3000, 3000, 3000, 1500]);
        // The optimizer: 28 bytes a parameter, on the device or on the host.
        let p = plan(&op("optimizer", OpClass::Memory, 28e3, false), &c, CAP, CAP).unwrap();
        assert_eq!(p.work, Work::Adam { params: 1000 });
        let p = plan(&op("cpu_optimizer", OpClass::Memory, 28e3, false), &c, CAP, CAP).unwrap();
        assert_eq!(p.work, Work::HostAdam { params: 1000 });
    }

    #[test]
    fn oversized_memory_ops_scale_by_elements() {
        let c = ctx(2.0);
        let cap = 1 << 20; // bytes: 512k bf16 elements a buffer
        let p = plan(&op("act", OpClass::Memory, 4.0 * 4e6, false), &c, cap, cap).unwrap();
        assert_eq!(p.work, Work::Elementwise { kernel: Elementwise::Gelu, elems: 1 << 19, precision: Precision::Bf16 });
        assert!((p.scale - 4e6 / (1 << 19) as f64).abs() < 1e-12);
        let p = plan(&op("softmax", OpClass::Memory, 4.0 * 4e6, false), &c, cap, cap).unwrap();
        let Work::Rows { rows, width, .. } = p.work else { panic!("{p:?}") };
        assert_eq!((rows, width), (1024, 512));
        assert!((p.scale - (4e6_f64 / 512.0).floor() / 1024.0).abs() < 1e-12);
        let p = plan(&op("optimizer", OpClass::Memory, 28e6, false), &c, cap, cap).unwrap();
        assert_eq!(p, Plan { work: Work::Adam { params: 1 << 18 }, scale: 1e6 / (1 << 18) as f64 });
        for w in [p.work, Work::Rows { kernel: Rows::LayerNorm, rows, width, precision: Precision::F32 }] {
            assert!(w.buffer_bytes().iter().all(|&b| b <= 2 * cap), "{w:?}");
        }
    }

    #[test]
    fn buffers_are_aligned_and_disjoint() {
        let (offsets, end) = layout(&[1, 300, 0, 256]);
        assert_eq!(offsets, vec![0, 256, 768, 768]);
        assert_eq!(end, 1024);
        assert_eq!(layout(&[]), (vec![], 0));
    }

    #[test]
    fn precision_follows_the_element_size() {
        assert_eq!(Precision::for_element_bytes(2.0), Precision::Bf16);
        assert_eq!(Precision::for_element_bytes(1.0), Precision::Bf16);
        assert_eq!(Precision::for_element_bytes(4.0), Precision::F32);
        assert_eq!((Precision::Bf16.bytes(), Precision::F32.suffix()), (2, "f32"));
    }
}
