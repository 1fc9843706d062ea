//! Lower bounds on a plan's simulated iteration time and peak memory, from the plan alone (no
//! lowering, no engine): what the search prunes with.
//!
//! Time. Every device runs its compute ops one after another on its one compute stream, each
//! for at least the cost model's time for it (times the cluster's straggler factor, as
//! `op_durations_ns` applies it); communication, host issue and contention only add. So the
//! iteration is at least each stage's compute work `W_k` (its chunks' forward, recomputation
//! and backward for every micro-batch, and the tensor-parallel collectives that hold the same
//! stream: each at least `(n-1)/n` of its buffer over the device's total egress bandwidth). With a flush, the pipeline adds its fill and drain
//! (the bubble formula, generalised to uneven chunks): the last stage's first op is a forward
//! of its first chunk `p-1`, after the forwards of chunks `0..p-1` of that micro-batch on the
//! other stages; its last op is a backward of chunk `p-1`, before the backwards of chunks
//! `p-2..0`. Hence `T >= W_{p-1} + sum_{c<p-1} (F_c + B_c)`, which is
//! `(m·v + p - 1) / (m·v)` times the work with uniform chunks.
//!
//! Memory. Each stage's devices hold their model states after ZeRO sharding and offload (as
//! the lowering's static memory computes them) and the framework's allowance, plus, at the
//! schedule's most crowded point, the saved activations of every (micro-batch, chunk) pair in
//! flight (`schedule::in_flight_bound`), each at least the stage's smallest chunk's.
//!
//! Plans whose structure these formulas do not describe (distinct-layer nets, frozen layers,
//! token slices, Gemini's dynamic placement, the explore policy) get the trivial bounds 0.

use crate::cost::ComputeModel;
use crate::cost::memory::state_bytes_per_parameter;
use crate::lower::{PIPELINE_SPLITS, TE_CHUNK_STREAMS, TORCH_CHUNK_STREAMS, chunk_kernels, tp_sm_share};
use crate::plan::{PartitionPolicy, Recompute, RecomputeModules, Tier};
use crate::scenario::{Scenario, expected_max_std_normal};
use crate::schedule::{self, ScheduleKind, ScheduleShape};
use crate::workload::{Axis, Comm, LayerOp, LayerShape, OpClass, TpMode};

/// Lower bounds on a plan's simulated report.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Bounds {
    /// At most the simulated `iteration_s`.
    pub iteration_s: f64,
    /// At most the simulated `peak_memory_bytes` (the fullest device's peak).
    pub peak_memory_bytes: f64,
    /// False when some stage's memory bound exceeds its device's usable memory: the plan
    /// cannot fit.
    pub may_fit: bool,
}

impl Bounds {
    const TRIVIAL: Bounds = Bounds { iteration_s: 0.0, peak_memory_bytes: 0.0, may_fit: true };
}

/// At most the time op `spec` takes on the compute stream. Under tensor-parallel overlap
/// (`tp`: the group's size) a GEMM may run as the chunks of rows the lowering cuts it into
/// (`TpOverlap`: one per rank, or Transformer Engine's four splits, the others two or three at
/// once), which can fill the SMs' last wave better than the whole GEMM does: the cheaper of
/// the whole GEMM and every such chunking.
fn op_floor_s(model: &ComputeModel, spec: &crate::workload::OpSpec, backward: bool, tp: Option<u32>) -> f64 {
    let whole = model.op_s(spec, backward);
    let Some(tp) = tp.filter(|&t| t > 1) else { return whole };
    if !matches!(spec.class, OpClass::Gemm { .. }) {
        return whole;
    }
    let mut best = whole;
    for parts in [tp as f64, PIPELINE_SPLITS] {
        for streams in [1.0, TORCH_CHUNK_STREAMS, TE_CHUNK_STREAMS] {
            let (rows, kernels) = chunk_kernels(1.0 / parts, parts - 1.0, streams);
            let chunked =
                model.op_rows_s(spec, backward, rows) * kernels + model.op_rows_s(spec, backward, 1.0 / parts);
            best = best.min(chunked);
        }
    }
    best
}

/// Forward and backward (with recomputation) seconds of a block's ops on one device's compute
/// stream, and how many ops they are. A tensor-parallel collective on the stream takes at
/// least the time each member needs to send `(n-1)/n` of the buffer (whatever the algorithm,
/// switch reductions included) at `egress` bytes/s. Where the framework overlaps them with
/// GEMMs (`overlap`: the GEMM's share of the SMs, as the lowering's `TpOverlap` does it, and
/// whether the overlap is PyTorch's micro-pipelined TP), an all-gather before a GEMM counts
/// nothing, a reduce-scatter after one its last split, and that GEMM runs on its share of
/// the SMs (under PyTorch's fused ops, nothing and all of them); the others stay on the stream.
fn block_s(
    model: &ComputeModel,
    ops: &[LayerOp],
    (recompute, modules): (Recompute, RecomputeModules),
    dims: &[u32],
    egress: f64,
    overlap: Option<(f64, bool)>,
) -> Block {
    let (mut f, mut b, mut n, mut fc, mut bc) = (0.0, 0.0, 0.0, 0.0, 0.0);
    // The group a GEMM's chunks are cut for, where the framework overlaps its collectives.
    let tp: Option<u32> = overlap.map(|_| dims.iter().product());
    let selective =
        (recompute == Recompute::Selective).then(|| crate::workload::recompute::selective(ops, modules, 0.0));
    let gemm = |i: Option<usize>| {
        i.and_then(|i| ops.get(i)).and_then(LayerOp::compute).filter(|s| matches!(s.class, OpClass::Gemm { .. }))
    };
    for (i, op) in ops.iter().enumerate() {
        let spec = match op {
            LayerOp::Compute(spec) => spec,
            // Expert-parallel all-to-alls are bounded by 0 (their members and links vary), as
            // is context parallelism's ring (it runs beside the attention kernel; PyTorch's
            // last wait for it too, a lower bound all the same).
            LayerOp::Comm { axis: Axis::Expert | Axis::Context | Axis::ContextExposed, .. } => continue,
            LayerOp::Comm { bytes, axis, forward, backward, forward_bytes, .. } => {
                let members = axis.dim().map_or(dims.iter().product(), |d| dims.get(d).copied().unwrap_or(1));
                if members > 1 && egress > 0.0 {
                    let m = members as f64;
                    // The smaller of the two passes' buffers: a bound for either.
                    let t = (m - 1.0) / m * forward_bytes.unwrap_or(*bytes).min(*bytes) / egress;
                    // (emission-order neighbours: the backward walks the block in reverse)
                    let part = |kind: Option<Comm>, before: Option<usize>, after: Option<usize>, stretch: &mut f64| {
                        let tensor = *axis == Axis::Tensor;
                        match (kind, overlap) {
                            (None, _) => 0.0,
                            (Some(Comm::AllGather), Some(_)) if tensor && gemm(after).is_some() => 0.0,
                            // PyTorch's fused matmul-reduce-scatter: copy-engine pulls beside the
                            // GEMM's chunks, all SMs left to them (bounded by 0).
                            (Some(Comm::ReduceScatter), Some((_, true))) if tensor && gemm(before).is_some() => 0.0,
                            (Some(Comm::ReduceScatter), Some((share, false))) if tensor && gemm(before).is_some() => {
                                let g = gemm(before).expect("checked");
                                *stretch += op_floor_s(model, g, before > Some(i), tp) * (1.0 / share - 1.0);
                                t / PIPELINE_SPLITS
                            }
                            _ => t,
                        }
                    };
                    let (prev, next) = (i.checked_sub(1), Some(i + 1));
                    let (mut sf, mut sb) = (0.0, 0.0);
                    fc += part(*forward, prev, next, &mut sf);
                    bc += part(*backward, next, prev, &mut sb);
                    f += sf;
                    b += sb;
                    n += 2.0;
                }
                continue;
            }
        };
        let fwd = op_floor_s(model, spec, false, tp);
        f += fwd;
        b += op_floor_s(model, spec, true, tp);
        n += 2.0;
        let again = match recompute {
            Recompute::Full => true,
            Recompute::Selective => selective.as_ref().is_some_and(|s| s[i].rerun),
            Recompute::None => false,
        };
        if again {
            b += fwd;
            n += 1.0;
        }
    }
    Block { f, b, fc, bc, n }
}

/// A block's times on one device: compute forward and backward (with recomputation), which
/// the straggler factor stretches, and tensor-parallel communication forward and backward;
/// and its op count.
#[derive(Clone, Copy, Default)]
struct Block {
    f: f64,
    b: f64,
    fc: f64,
    bc: f64,
    n: f64,
}

impl Block {
    /// Forward and backward seconds with compute stretched by `straggle`.
    fn times(&self, straggle: f64) -> (f64, f64) {
        (self.f * straggle + self.fc, self.b * straggle + self.bc)
    }
}

/// The least share of the whole work `W` (every stage's, all `m` micro-batches) an iteration
/// with a flush takes, whatever the partition into `p` stages of one chunk. Stage `k` starts
/// after the first micro-batch's forwards on stages `0..k` and ends before the last one's
/// backwards there, so `T >= W_k + sum_{c<k} W_c / m`. Equalising these over `k` is the best a
/// partition can do: `W_k = V (1 - 1/m)^k` with `sum W_k = W`, so
/// `T >= W / (m (1 - (1 - 1/m)^p))`. (Uniform stages give the larger `(m + p - 1) / (p m)`.)
fn any_partition_fill(m: u32, p: u32) -> f64 {
    let m = m as f64;
    1.0 / (m * (1.0 - (1.0 - 1.0 / m).powi(p as i32)))
}

/// The bounds of a scenario's plan.
pub fn bounds(s: &Scenario) -> Bounds {
    let plan = &s.plan;
    if s.workload.net.is_some()
        || plan.frozen.layers > 0
        || plan.token_slices.is_some()
        || plan.offload.dynamic.is_some()
        || plan.partition_policy == Some(PartitionPolicy::Explore)
    {
        return Bounds::TRIVIAL;
    }
    let w = &s.workload.transformer;
    let (p, v, m) = (plan.pp, plan.virtual_stages, plan.micro_batches);
    let chunks = plan.chunks();
    let e = plan.precision.activation_bytes();
    let shape = plan.layer_shape();
    let edge_shape = if plan.ring() {
        LayerShape { seq_len: plan.seq_len / plan.tp, tp: 1, tp_mode: TpMode::OneD, ..shape }
    } else {
        shape
    };
    let layer_ops = w.layer_ops(shape);
    // A mixture-of-experts model's dense first layers.
    let dense_ops = w.mixed_layers().then(|| w.layer_ops_at(0, shape));
    let (embed_ops, head_ops) = (w.embedding_ops(edge_shape), w.head_ops(edge_shape));
    // A device sends at most over its port to the node's switch and all of the node's NICs.
    let node = &s.cluster.node;
    // (Ring sequence parallelism's exchanges overlap attention: counted 0.)
    let egress = if plan.ring() {
        0.0
    } else {
        node.intra_port_bytes_per_s().unwrap_or(0.0) + node.nics as f64 * node.nic.bandwidth_bytes_per_s
    };
    let dims = plan.tp_mode.dims(plan.tp);
    let edge_dims = if plan.ring() { vec![1] } else { dims.clone() };
    let slowest = expected_max_std_normal(s.cluster.device_count() as u64);
    // Per stage: (forward, backward) seconds of each of its chunks, per micro-batch.
    let known = plan.partition_policy.is_none();
    let starts = plan.chunk_starts();
    let layers_of = |c: u32| if known { (starts[c as usize + 1] - starts[c as usize]) as f64 } else { 1.0 };
    let mut chunk_fb = vec![(0.0, 0.0); chunks as usize];
    let mut work = vec![0.0; p as usize];
    let mut ops = vec![0.0; p as usize];
    let mut all_work = f64::INFINITY;
    let mut classes = Vec::with_capacity(p as usize);
    // With part of the layers recomputing (`plan.recompute_layers`) the bound takes none: the
    // fastest a layer can be.
    let time_recompute = if plan.recompute_layers.is_some() { Recompute::None } else { plan.recompute };
    for k in 0..p {
        let dev = s.cluster.device_of(plan.device(0, k, 0));
        classes.push(dev);
        let model = ComputeModel::new(dev, plan.precision, None)
            .with_fp8_plan(plan)
            .with_op_rates(&s.op_rates)
            .with_weights_on_chip(dev.fpga.is_some());
        let straggle = 1.0 + s.options.device_variability(dev) * slowest;
        let overlap = plan.tp_overlap().then(|| (tp_sm_share(dev.compute_units), plan.framework.tp_micro_pipeline));
        let mut layer = block_s(&model, &layer_ops, (time_recompute, plan.recompute_modules), &dims, egress, overlap);
        if let Some(dense) = &dense_ops {
            // Layers of two kinds: every layer at least as fast as the faster kind.
            let other = block_s(&model, dense, (time_recompute, plan.recompute_modules), &dims, egress, overlap);
            let (a, b) = (layer.times(straggle), other.times(straggle));
            if b.0 + b.1 < a.0 + a.1 {
                layer = other;
            }
        }
        let embed =
            block_s(&model, &embed_ops, (Recompute::None, RecomputeModules::default()), &edge_dims, egress, overlap);
        let head =
            block_s(&model, &head_ops, (Recompute::None, RecomputeModules::default()), &edge_dims, egress, overlap);
        let ((lf, lb), (ef, eb), (hf, hb)) = (layer.times(straggle), embed.times(straggle), head.times(straggle));
        for c in (k..chunks).step_by(p as usize) {
            let n = layers_of(c);
            let (mut f, mut b, mut count) = (n * lf, n * lb, n * layer.n);
            if c == 0 {
                (f, b, count) = (f + ef, b + eb, count + embed.n);
            }
            if c == chunks - 1 {
                (f, b, count) = (f + hf, b + hb, count + head.n);
            }
            chunk_fb[c as usize] = (f, b);
            work[k as usize] += m as f64 * (f + b);
            ops[k as usize] += m as f64 * count;
        }
        // Every layer runs on some stage, at best on the fastest stage's device.
        all_work = all_work.min(m as f64 * (w.layers as f64 * (lf + lb) + ef + eb + hf + hb) / p as f64);
    }
    // Each op's duration is rounded to the engine's nanosecond: at most half of one lower.
    let rounding = ops.iter().fold(0.0, |a: f64, &n| a.max(n)) * 0.5e-9;
    let mut time = if known { work.iter().fold(0.0, |a: f64, &x| a.max(x)) } else { all_work };
    let flush = plan.schedule != ScheduleKind::TwoBW;
    if flush && p > 1 && known {
        let fill: f64 = chunk_fb[..p as usize - 1].iter().map(|(f, b)| f + b).sum();
        time = time.max(work[p as usize - 1] + fill);
    } else if flush && p > 1 && chunks == p {
        time = time.max(all_work * p as f64 * any_partition_fill(m, p));
    }
    let time = (time - rounding).max(0.0);

    // Memory, per stage.
    let tf = if plan.ring() { 1.0 } else { plan.tp as f64 };
    // (The smaller kind's, when layers differ: a lower bound for every layer.)
    // Under expert parallelism each device holds 1/ep of the routed experts (their ZeRO
    // shards, over dp / ep replicas, are counted over dp below: smaller, still a bound).
    let ep_kept = 1.0 - 1.0 / plan.ep as f64;
    let layer_params = |l: u32| w.layer_parameters_at(l) - w.routed_expert_parameters_at(l) * ep_kept;
    let fewest = (0..w.layers).map(layer_params).fold(f64::INFINITY, f64::min);
    let whole = if plan.ep > 1 { fewest } else { w.layer_parameters() };
    let lp = if w.mixed_layers() { fewest } else { whole } / plan.tp_mode.weight_shards(plan.tp) as f64;
    let first_params = w.embedding_parameters_without_head() / plan.embedding_shards();
    let last_params = if w.tied_embeddings && chunks == 1 { 0.0 } else { w.head_classes() * w.hidden as f64 / tf };
    let per_param = state_bytes_per_parameter(plan).0;
    let layer_input = e * plan.micro_batch as f64 * (plan.seq_len / plan.cp) as f64 * w.hidden as f64
        / if plan.sequence_parallel || plan.ring() { plan.tp as f64 } else { 1.0 };
    let saved_layer = if plan.offload.activations != Tier::Device {
        0.0
    } else if plan.recompute == Recompute::Full {
        layer_input
    } else {
        let saved = |ops: &[LayerOp]| -> f64 {
            crate::workload::recompute::kept_bytes(ops, plan.recompute, plan.recompute_modules, layer_input)
        };
        dense_ops.as_deref().map_or(saved(&layer_ops), |d| saved(&layer_ops).min(saved(d)))
    };
    let sched = ScheduleShape { stages: p, micro_batches: m, virtual_stages: v };
    // What the output layer and loss keep for backward, per micro-batch, on the stage that runs
    // them: the logits of a large vocabulary can outweigh every layer. Without interleaving,
    // when that stage ends its last forward before a backward, each micro-batch it holds keeps
    // its layers' and its head's saved tensors at once; with it, only the layers are counted.
    let head_saved = if v == 1 && plan.offload.activations == Tier::Device {
        crate::workload::recompute::kept_bytes(&head_ops, Recompute::None, RecomputeModules::default(), 0.0)
    } else {
        0.0
    };
    let chunk_params = |c: u32| {
        layers_of(c) * lp + if c == 0 { first_params } else { 0.0 } + if c == chunks - 1 { last_params } else { 0.0 }
    };
    let stage_bytes: Vec<f64> = (0..p)
        .map(|k| {
            let mine: Vec<u32> = (k..chunks).step_by(p as usize).collect();
            let params: f64 = mine.iter().map(|&c| chunk_params(c)).sum();
            let smallest = mine.iter().map(|&c| layers_of(c)).fold(f64::INFINITY, f64::min);
            let in_flight = schedule::in_flight_bound(plan.schedule, sched, k) as f64;
            let head = if k == p - 1 { head_saved } else { 0.0 };
            params * per_param + in_flight * (smallest * saved_layer + head)
        })
        .collect();
    let framework = |k: usize| s.options.framework_bytes(classes[k]);
    let (peak, may_fit) = if known {
        let peak = (0..p as usize).map(|k| stage_bytes[k] + framework(k)).fold(0.0, f64::max);
        let fit = (0..p as usize).all(|k| stage_bytes[k] + framework(k) <= s.options.usable_bytes(classes[k]));
        (peak, fit)
    } else {
        // The partition is the policy's: the fullest stage holds at least the average of the
        // stages' model states (every layer somewhere) and activations (every stage at least
        // one layer, at the last stage's in-flight count).
        let states: f64 = (w.layers as f64 * lp + first_params + last_params) * per_param;
        let last_in_flight = schedule::in_flight_bound(plan.schedule, sched, p - 1) as f64;
        let acts = last_in_flight * (w.layers as f64 * saved_layer + head_saved);
        let framework_min = (0..p as usize).map(framework).fold(f64::INFINITY, f64::min);
        let usable_max = classes.iter().map(|d| s.options.usable_bytes(d)).fold(0.0, f64::max);
        let peak = (states + acts) / p as f64 + framework_min;
        (peak, peak <= usable_max)
    };
    Bounds { iteration_s: time, peak_memory_bytes: peak, may_fit }
}

#[cfg(test)]
mod fill_tests {
    use super::any_partition_fill;

    /// `max_k (x_k + sum_{c<k} x_c / m)` for stage shares `x` summing to 1.
    fn makespan(x: &[f64], m: u32) -> f64 {
        let mut before = 0.0;
        let mut worst: f64 = 0.0;
        for &xk in x {
            worst = worst.max(xk + before / m as f64);
            before += xk;
        }
        worst
    }

    /// No partition beats the bound, the geometric one attains it, and uniform stages give the
    /// usual bubble, never less.
    #[test]
    fn no_partition_fills_a_pipeline_faster() {
        let mut seed = 12345u64;
        let mut draw = || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((seed >> 11) as f64 / (1u64 << 53) as f64) + 1e-3
        };
        for (m, p) in [(1, 2), (2, 2), (3, 4), (8, 4), (3, 64), (48, 16)] {
            let bound = any_partition_fill(m, p);
            for _ in 0..2000 {
                let mut x: Vec<f64> = (0..p).map(|_| draw()).collect();
                let sum: f64 = x.iter().sum();
                x.iter_mut().for_each(|v| *v /= sum);
                assert!(makespan(&x, m) >= bound - 1e-12, "m {m} p {p}");
            }
            let r = 1.0 - 1.0 / m as f64;
            let mut geo: Vec<f64> = (0..p).map(|k| r.powi(k as i32)).collect();
            let sum: f64 = geo.iter().sum();
            geo.iter_mut().for_each(|v| *v /= sum);
            if m > 1 {
                assert!((makespan(&geo, m) - bound).abs() < 1e-9, "m {m} p {p}");
            }
            let uniform = (m + p - 1) as f64 / (m * p) as f64;
            assert!(
                uniform >= bound - 1e-12 && (makespan(&vec![1.0 / p as f64; p as usize], m) - uniform).abs() < 1e-12
            );
        }
    }
}

#[cfg(test)]
mod floor_tests {
    use super::op_floor_s;
    use crate::cost::ComputeModel;
    use crate::hardware::{Precision, catalog};
    use crate::workload::{Saved, gemm_op};

    /// A 512 x 4,608 x 4,096 GEMM on an H100 runs faster as Transformer Engine's
    /// ring-exchange chunks over four ranks (three of 128 rows at once, then the rank's own)
    /// than whole: the whole GEMM's tiles leave more of its one wave empty. The bound takes the
    /// chunks' time there, and the whole GEMM's without tensor-parallel overlap.
    #[test]
    fn a_chunked_gemm_can_undercut_the_whole_and_the_bound_follows() {
        let dev = catalog::device("h100-sxm").expect("preset");
        let model = ComputeModel::new(&dev, Precision::Bf16, None);
        let op = gemm_op("fc1", 1.0, 512.0, 4608.0, 4096.0, 2.0, Saved::default());
        let whole = model.op_s(&op, false);
        let chunks = model.op_rows_s(&op, false, 0.75) + model.op_rows_s(&op, false, 0.25);
        assert!(chunks < 0.9 * whole, "{chunks} vs {whole}");
        let floor = op_floor_s(&model, &op, false, Some(4));
        assert!(floor <= chunks && floor > 0.0, "{floor} vs {chunks}");
        assert_eq!(op_floor_s(&model, &op, false, None), whole);
        assert_eq!(op_floor_s(&model, &op, false, Some(1)), whole);
    }
}
