//! Op instances for the backends' tests.

use sim::lower::OpInstance;
use sim::workload::{OpClass, OpSpec, Saved};

/// An op of `class` moving `bytes` forward and 1.5 times that backward (no FLOPs: the backends
/// read a GEMM's shape from its class); `cpu_optimizer` runs on the host.
pub(crate) fn op(name: &'static str, class: OpClass, bytes: f64, backward: bool) -> OpInstance {
    let spec = OpSpec {
        name,
        class,
        forward_flops: 0.0,
        forward_bytes: bytes,
        backward_flops: 0.0,
        backward_bytes: 1.5 * bytes,
        saved: Saved::default(),
    };
    OpInstance {
        spec,
        backward,
        on_host: name == "cpu_optimizer",
        nvme_bytes: 0.0,
        class: 0,
        sm_share: 1.0,
        part: sim::lower::OpPart::Whole,
        rows: 1.0,
        chunks: 1.0,
    }
}
