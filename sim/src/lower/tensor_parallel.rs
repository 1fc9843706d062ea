//! Tensor-parallel collectives: the all-reduces, all-gathers and reduce-scatters inside a
//! block, as collective tasks shared by the group's compute streams (they block compute: no
//! overlap of tensor-parallel communication with GEMMs is modelled).

use super::builder::{Builder, StepCtx};
use super::program::*;
use crate::report::timeline::{Label, Phase};
use crate::workload::Axis;

/// A collective of `bytes` among the group's devices along `axis` (the whole group, or each
/// line of the tensor-parallel grid along one dimension, rooted at `root`), on their compute
/// streams.
pub(super) fn collective_on_compute(
    b: &mut Builder,
    ctx: &StepCtx,
    kind: CollectiveKind,
    (axis, root): (Axis, u32),
    name: &'static str,
    bytes: f64,
    layer: i32,
    phase: Phase,
    chunk: u32,
    mb: u32,
) {
    let label = b.label(Label { op: name, layer, phase, chunk });
    let Some(n) = axis.dim() else {
        // The whole group: one task on all its compute streams.
        let id = b.collective_id(kind, &ctx.group, bytes);
        b.task(TaskKind::Collective, id, label, mb, &ctx.streams);
        return;
    };
    // Along grid dimension n: one collective per line of the grid, all at once.
    let dims = &ctx.dims;
    let size = dims[n];
    if size <= 1 {
        return;
    }
    let stride: u32 = dims[n + 1..].iter().product();
    for x in 0..ctx.group.len() as u32 {
        if !(x / stride).is_multiple_of(size) {
            continue;
        }
        // Members in coordinate order, rotated so the root comes first.
        let idx: Vec<usize> = (0..size).map(|k| (x + ((k + root) % size) * stride) as usize).collect();
        let members: Vec<u32> = idx.iter().map(|&i| ctx.group[i]).collect();
        let streams: Vec<u32> = idx.iter().map(|&i| ctx.streams[i]).collect();
        let id = b.collective_id(kind, &members, bytes);
        b.task(TaskKind::Collective, id, label, mb, &streams);
    }
}
