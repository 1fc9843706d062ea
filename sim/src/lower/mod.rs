//! Lowering: (workload, plan, cluster) to a [`Program`] of per-device task streams.
//!
//! For every pipeline stage the schedule gives the order of (micro-batch, chunk, pass)
//! steps; each step expands into the layers' ops, with the tensor-parallel all-reduces as
//! collectives shared by the group's compute streams, the pipeline sends on a send stream,
//! the data-parallel gradient all-reduces in buckets on a third stream as soon as the last
//! micro-batch's backward has produced them, and the optimizer step at the end.
//!
//! Under symmetry (every node holds devices of one data-parallel replica only) only replica
//! 0 is lowered; its data-parallel collectives name the other replicas as members, and the
//! engine maps their links onto replica 0's mirror links.

pub mod program;
pub mod size;

mod gemini;
pub use program::*;

use crate::cost::memory::{bytes_per_parameter, optimizer_traffic_bytes};
use crate::plan::{Plan, Recompute, Tier, Unit};
use crate::report::timeline::{Label, MemoryBreakdown, Phase, StreamKind};
use crate::scenario::Scenario;
use crate::schedule::{self, Pass, ScheduleShape, Step};
use crate::workload::{Axis, LayerOp, LayerShape, OpClass, OpSpec, Saved};
use std::collections::HashMap;

/// Whether one replica can stand for all: each node's devices belong to one replica.
pub fn symmetry_is_exact(plan: &Plan, devices_per_node: u32) -> bool {
    if plan.dp <= 1 {
        return false;
    }
    let n = plan.devices();
    (0..n).all(|d| {
        let node_first = d / devices_per_node * devices_per_node;
        plan.coords(d).0 == plan.coords(node_first).0
    })
}

/// The ops of one kind of block (a transformer layer, the embedding, the head), with their
/// op-instance ids for forward and backward.
struct Block {
    ops: Vec<LayerOp>,
    fwd: Vec<u32>,
    bwd: Vec<u32>,
    saved: f64,
    saved_full: f64,
}

/// The blocks of one unit shape, and what crosses a stage boundary for it.
struct UnitBlocks {
    /// Distinct layer blocks (one for a transformer, one per layer for a net).
    layers: Vec<Block>,
    /// Block of each layer.
    kind_of: Vec<usize>,
    embed: Block,
    head: Block,
    /// Whether the embedding and head exist as blocks (a net folds them into its layers).
    edges: bool,
    /// Bytes each layer's output puts on a stage boundary.
    boundary: Vec<f64>,
}

impl UnitBlocks {
    fn layer(&self, l: u32) -> &Block {
        &self.layers[self.kind_of[l as usize]]
    }
}

fn unit_blocks_for(b: &mut Builder, s: &Scenario, u: Unit) -> UnitBlocks {
    let plan = &s.plan;
    let w = &s.workload.transformer;
    let e = plan.precision.activation_bytes();
    if let Some(net) = &s.workload.net {
        let boundary: Vec<f64> = net.layers.iter().map(|l| e * u.batch as f64 * l.output_elems).collect();
        let layers = net
            .layers
            .iter()
            .enumerate()
            .map(|(i, l)| {
                // Full recomputation keeps the layer's input.
                let input = if i == 0 { 0.0 } else { boundary[i - 1] };
                b.block(l.layer_ops(u.batch, e), plan.recompute, input)
            })
            .collect();
        let empty = b.block(Vec::new(), Recompute::None, 0.0);
        let empty2 = b.block(Vec::new(), Recompute::None, 0.0);
        return UnitBlocks {
            layers,
            kind_of: (0..net.layers.len()).collect(),
            embed: empty,
            head: empty2,
            edges: false,
            boundary,
        };
    }
    let shape = LayerShape {
        micro_batch: u.batch,
        seq_len: u.tokens,
        tp: plan.tp,
        tp_mode: plan.tp_mode,
        context: u.context,
        sequence_parallel: plan.sequence_parallel,
        attention: plan.attention,
        fusion: plan.fusion,
        activation_bytes: e,
    };
    let boundary_bytes = e * u.batch as f64 * u.tokens as f64 * w.hidden as f64
        / if plan.sequence_parallel || plan.ring() { plan.tp as f64 } else { 1.0 };
    let layer = b.block(w.layer_ops(shape), plan.recompute, boundary_bytes);
    // Under ring sequence parallelism the embedding and head are whole on each device, on
    // its share of the tokens.
    let edge_shape = if plan.ring() {
        LayerShape { seq_len: u.tokens / plan.tp, tp: 1, tp_mode: crate::workload::TpMode::OneD, ..shape }
    } else {
        shape
    };
    // Embedding and head are not recomputed.
    let embed = b.block(w.embedding_ops(edge_shape), Recompute::None, 0.0);
    let head = b.block(w.head_ops(edge_shape), Recompute::None, 0.0);
    UnitBlocks {
        layers: vec![layer],
        kind_of: vec![0; w.layers as usize],
        embed,
        head,
        edges: true,
        boundary: vec![boundary_bytes; w.layers as usize],
    }
}

struct Builder {
    p: Program,

    labels: HashMap<Label, u32>,
    /// Per-layer label ids: [layer][op][phase], built on first use.
    layer_labels: Vec<Vec<[u32; 3]>>,
    dev_index: Vec<u32>,
    /// Device class of the ops being created.
    class: u16,
    /// Data-parallel collective tasks per (stage, tp rank, stream), in creation order.
    dp_tasks: HashMap<(u32, u32, u32), Vec<u32>>,
    /// How many data-parallel collectives each (replica, stage, tp rank, stream) has lowered.
    dp_seq: HashMap<(u32, u32, u32, u32), u32>,
    collective_ids: HashMap<(u8, Vec<u32>, u64), u32>,
    /// Gemini's warm-up log: every unit access, in program order per device.
    unit_log: Vec<gemini::UnitAccess>,
    /// Blocking point-to-point (`plan.p2p`): the sends each compute stream's next task waits for.
    held_sends: Option<Vec<Vec<u32>>>,
    /// Gradient-accumulation ops by (device class, bytes).
    accumulate_ops: HashMap<(u16, u64), u32>,
}

const PH: [Phase; 3] = [Phase::Forward, Phase::Backward, Phase::Recompute];

impl Builder {
    fn label(&mut self, l: Label) -> u32 {
        let next = self.p.labels.len() as u32;
        *self.labels.entry(l.clone()).or_insert_with(|| {
            self.p.labels.push(l);
            next
        })
    }

    fn op(&mut self, spec: &OpSpec, backward: bool) -> u32 {
        self.p.ops.push(OpInstance {
            spec: spec.clone(),
            backward,
            on_host: false,
            nvme_bytes: 0.0,
            class: self.class,
        });
        (self.p.ops.len() - 1) as u32
    }

    fn block(&mut self, ops: Vec<LayerOp>, recompute: Recompute, full_input_bytes: f64) -> Block {
        let mut fwd = Vec::new();
        let mut bwd = Vec::new();
        let mut saved = 0.0;
        let mut saved_none = 0.0;
        for op in &ops {
            match op {
                LayerOp::Compute(spec) => {
                    fwd.push(self.op(spec, false));
                    bwd.push(self.op(spec, true));
                    saved += spec.saved.bytes(recompute);
                    saved_none += spec.saved.bytes(Recompute::None);
                }
                LayerOp::Comm { .. } => {
                    fwd.push(NONE);
                    bwd.push(NONE);
                }
            }
        }
        if recompute == Recompute::Full {
            saved = full_input_bytes;
        }
        Block { ops, fwd, bwd, saved, saved_full: saved_none }
    }

    fn task(&mut self, kind: TaskKind, payload: u32, label: u32, mb: u32, streams: &[u32]) -> u32 {
        let id = self.p.tasks.len() as u32;
        self.p.tasks.push(Task {
            kind,
            streams: u32::try_from(streams.len()).expect("streams bounded by the device limit"),
            payload,
            label,
            micro_batch: mb,
            memory: NONE,
            stream: streams[0],
        });
        for &s in streams {
            self.p.streams[s as usize].push(id);
            if let Some(held) = self.held_sends.as_mut()
                && Program::stream_kind(s) == StreamKind::Compute
            {
                for send in held[s as usize].drain(..) {
                    self.p.deps.push((send, id));
                }
            }
        }
        id
    }

    /// The id of a collective, shared by every task with the same kind, members and size.
    fn collective_id(&mut self, kind: CollectiveKind, members: &[u32], bytes: f64) -> u32 {
        let key = (kind as u8, members.to_vec(), bytes.to_bits());
        let next = self.p.collectives.len() as u32;
        if let Some(&id) = self.collective_ids.get(&key) {
            return id;
        }
        self.p.collectives.push(Collective { kind, members: members.to_vec(), bytes });
        self.collective_ids.insert(key, next);
        next
    }

    fn memory(&mut self, task: u32, device: u32, at_end: bool, activation_bytes: f64, layer: i32) {
        let tag = memory_tag(layer);
        self.memory_event(task, MemoryEvent { device, at_end, activation_bytes, buffer_bytes: 0.0, next: NONE, tag });
    }

    /// Attach a memory event to a task (a task may carry several).
    fn memory_event(&mut self, task: u32, ev: MemoryEvent) {
        let id = self.p.memory_events.len() as u32;
        self.p.memory_events.push(ev);
        let t = &mut self.p.tasks[task as usize];
        if t.memory == NONE {
            t.memory = id;
            return;
        }
        let mut m = t.memory;
        while self.p.memory_events[m as usize].next != NONE {
            m = self.p.memory_events[m as usize].next;
        }
        self.p.memory_events[m as usize].next = id;
    }

    /// A copy between a device and its host (or the host's NVMe) on the device's host-copy
    /// stream.
    fn host_copy(&mut self, device: u32, to_device: bool, bytes: f64, nvme: bool, label: u32) -> u32 {
        self.p.host_copies.push(HostCopy { device, to_device, bytes, nvme });
        let id = (self.p.host_copies.len() - 1) as u32;
        let s = Program::stream_index(self.dev_index[device as usize], StreamKind::HostCopy);
        self.task(TaskKind::HostCopy, id, label, NONE, &[s])
    }

    fn compute_streams(&self, group: &[u32]) -> Vec<u32> {
        group.iter().map(|&d| Program::stream_index(self.dev_index[d as usize], StreamKind::Compute)).collect()
    }
}

/// Everything per TP group that one step's lowering needs.
struct StepCtx<'b> {
    group: &'b [u32],
    streams: Vec<u32>,
    /// The tensor-parallel grid's dimensions (see `TpMode::dims`).
    dims: Vec<u32>,
}

/// Lower a validated scenario.
pub fn lower(s: &Scenario) -> Program {
    if s.plan.offload.dynamic.is_none() {
        return lower_with(s, None);
    }
    // Gemini shards its chunks over the data-parallel group, as ZeRO-3 does.
    let mut s = s.clone();
    if s.plan.sync_degree() > 1 {
        s.plan.zero_stage = 3;
    }
    // Warm-up: every chunk on the device; the log gives the chunks' compute order and the
    // program's memory timeline the non-model memory at each unit boundary.
    let (warm, log) = lower_into(Builder::new(&s), &s, None);
    let non_model = gemini::warmup_non_model(&warm, &log);
    let stats: Vec<(gemini::UnitAccess, f64)> = log.into_iter().zip(non_model).collect();
    lower_with(&s, Some(&stats))
}

fn lower_with(s: &Scenario, stats: Option<&[(gemini::UnitAccess, f64)]>) -> Program {
    lower_into(Builder::new(s), s, stats).0
}

impl Builder {
    fn new(s: &Scenario) -> Builder {
        let plan = &s.plan;
        let devices = plan.devices();
        let symmetric = s.options.symmetry && symmetry_is_exact(plan, s.cluster.node.devices);
        let simulated: Vec<u32> = (0..devices).filter(|&d| !symmetric || plan.coords(d).0 == 0).collect();
        let mut dev_index = vec![NONE; devices as usize];
        for (i, &d) in simulated.iter().enumerate() {
            dev_index[d as usize] = i as u32;
        }
        let mirror: Vec<u32> = (0..devices)
            .map(|d| {
                let (_, st, t) = plan.coords(d);
                if symmetric { dev_index[plan.device(0, st, t) as usize] } else { dev_index[d as usize] }
            })
            .collect();
        Builder {
            p: Program {
                devices: simulated.clone(),
                stages: simulated.iter().map(|&d| plan.coords(d).1).collect(),
                mirror,
                streams: vec![Vec::new(); simulated.len() * STREAMS],
                symmetric,
                ..Program::default()
            },

            labels: HashMap::new(),
            layer_labels: Vec::new(),
            dev_index,
            dp_tasks: HashMap::new(),
            class: 0,
            dp_seq: HashMap::new(),
            collective_ids: HashMap::new(),
            unit_log: Vec::new(),
            accumulate_ops: HashMap::new(),
            held_sends: (plan.p2p == crate::plan::P2p::Blocking).then(|| vec![Vec::new(); simulated.len() * STREAMS]),
        }
    }
}

/// Lower into a fresh builder; with `stats` (Gemini's warm-up log and non-model bytes), chunks
/// move as the steady-state placement decides.
fn lower_into(
    mut b: Builder,
    s: &Scenario,
    stats: Option<&[(gemini::UnitAccess, f64)]>,
) -> (Program, Vec<gemini::UnitAccess>) {
    let plan = &s.plan;
    let w = &s.workload.transformer;
    let symmetric = b.p.symmetric;

    // The pipeline's units: micro-batches, or token slices of sub-batches (TeraPipe). Units of
    // one shape share their blocks.
    let units = plan.units();
    let mut shapes: Vec<Unit> = Vec::new();
    // Blocks per unit shape and device class (a heterogeneous cluster times each class's ops
    // on its own device).
    let classes = s.cluster.overrides.len() as u16 + 1;
    let mut unit_blocks: Vec<Vec<UnitBlocks>> = Vec::new();
    let mut block_of = Vec::with_capacity(units.len());
    for u in &units {
        let i = match shapes.iter().position(|x| x == u) {
            Some(i) => i,
            None => {
                shapes.push(*u);
                let per_class = (0..classes)
                    .map(|cl| {
                        b.class = cl;
                        unit_blocks_for(&mut b, s, *u)
                    })
                    .collect();
                b.class = 0;
                unit_blocks.push(per_class);
                shapes.len() - 1
            }
        };
        block_of.push(i);
    }
    b.layer_labels = vec![Vec::new(); w.layers as usize];

    let chunks = plan.chunks();
    let starts = plan.chunk_starts();
    let m = units.len() as u32;
    let max_boundary = unit_blocks.iter().flatten().flat_map(|u| u.boundary.iter().copied()).fold(0.0, f64::max);
    let frozen = plan.frozen.layers > 0;
    // A zero-cost marker op that stands for "the cached prefix output is here".
    let cache_op = b.op(
        &OpSpec {
            name: "frozen_cache_ready",
            class: OpClass::Memory,
            forward_flops: 0.0,
            forward_bytes: 0.0,
            backward_flops: 0.0,
            backward_bytes: 0.0,
            saved: Saved::default(),
        },
        false,
    );
    let sched_shape = ScheduleShape { stages: plan.pp, micro_batches: m, virtual_stages: plan.virtual_stages };
    let t = plan.tp;
    // Producer/consumer tasks of each (chunk, micro-batch, tp rank) and pass, for p2p.
    let replicas: Vec<u32> = if symmetric { vec![0] } else { (0..plan.dp).collect() };
    let key = |r: u32, c: u32, mb: u32, x: u32| (((r * chunks + c) * m + mb) * t + x) as usize;
    let slots = (replicas.len() as u32 * chunks * m * t) as usize;
    let mut fwd_first = vec![NONE; slots];
    let mut bwd_first = vec![NONE; slots];
    let mut fwd_send = vec![NONE; slots];
    let mut bwd_send = vec![NONE; slots];

    let (wb, gb, ob) = bytes_per_parameter(plan.precision, plan.optimizer);
    let tf = if plan.ring() { 1.0 } else { t as f64 };
    // Parameters of each layer on one device.
    let lp: Vec<f64> = match &s.workload.net {
        Some(net) => net.layers.iter().map(|l| l.parameters()).collect(),
        None => vec![w.layer_parameters() / plan.tp_mode.weight_shards(t) as f64; w.layers as usize],
    };
    let edges = s.workload.net.is_none();
    let vocab_params = w.head_classes() * w.hidden as f64 / tf;
    let first_params = if edges {
        (w.embedding_parameters() - if w.tied_embeddings { 0.0 } else { w.head_classes() * w.hidden as f64 }) / tf
    } else {
        0.0
    };
    // The output layer: its own matrix, or (tied) a copy of the embedding on the last stage;
    // with one chunk, the tied head is the embedding itself.
    let last_params = if !edges || (w.tied_embeddings && chunks == 1) { 0.0 } else { vocab_params };
    let sync = plan.sync_degree();
    let dp = sync as f64;
    let off = plan.offload;
    let host_opt = off.optimizer != Tier::Device;
    let host_params = off.params != Tier::Device;
    // Without data parallelism ZeRO shards nothing, except that offloaded parameters are
    // still fetched layer by layer (ZeRO-Infinity on one GPU).
    let z = if sync > 1 || host_params { plan.zero_stage } else { 0 };
    let shard = |stage_at_least: u8| if z >= stage_at_least { dp } else { 1.0 };
    // ZeRO-3: parameters are all-gathered before every use (FSDP, one unit per layer).
    let z3 = z >= 3;
    // Gemini: chunks are fetched (and gathered) before every use of a unit.
    let dynamic = off.dynamic;
    let per_unit = z3 || dynamic.is_some();

    for &r in &replicas {
        for stage in 0..plan.pp {
            let group: Vec<u32> = (0..t).map(|x| plan.device(r, stage, x)).collect();
            let stage_class = s.cluster.class_of(group[0]);
            b.class = stage_class;
            let ctx = StepCtx { streams: b.compute_streams(&group), group: &group, dims: plan.tp_mode.dims(t) };
            let order = if plan.token_slices.is_some() {
                // TeraPipe: every slice forward in order, then backward in exact reverse (a
                // slice's backward feeds gradients into the earlier slices it attended to).
                let mut o: Vec<Step> =
                    (0..m).map(|u| Step { micro_batch: u, chunk: stage, pass: Pass::Forward }).collect();
                o.extend((0..m).rev().map(|u| Step { micro_batch: u, chunk: stage, pass: Pass::Backward }));
                o
            } else {
                schedule::stage_order(plan.schedule, sched_shape, stage).expect("schedule validated at parse")
            };
            // Parameters held per chunk on this stage, and the last backward step per chunk.
            let my_chunks: Vec<u32> = (0..chunks).filter(|c| c % plan.pp == stage).collect();
            let chunk_params = |c: u32| {
                let mut p: f64 = (starts[c as usize]..starts[c as usize + 1]).map(|l| lp[l as usize]).sum();
                if c == 0 && !frozen {
                    p += first_params;
                }
                if c == chunks - 1 {
                    p += last_params;
                }
                p
            };
            let params: f64 = my_chunks.iter().map(|&c| chunk_params(c)).sum();
            // Largest unit gathered at once under ZeRO-3 (two in flight with prefetch).
            let largest_unit = my_chunks
                .iter()
                .map(|&c| {
                    let mut u =
                        (starts[c as usize]..starts[c as usize + 1]).map(|l| lp[l as usize]).fold(0.0, f64::max);
                    if c == 0 {
                        u = u.max(first_params);
                    }
                    if c == chunks - 1 {
                        u = u.max(last_params);
                    }
                    u
                })
                .fold(0.0, f64::max);
            let buffers = s.options.framework_bytes(s.cluster.class(stage_class))
                + if sync > 1 { 2.0 * plan.bucket_bytes.min(params * gb) } else { 0.0 }
                + if plan.pp > 1 { 2.0 * max_boundary } else { 0.0 }
                + if z3 { 2.0 * largest_unit * wb } else { 0.0 };
            // A frozen prefix keeps only its weights, on the first stage.
            let frozen_weights = if frozen && my_chunks.contains(&0) {
                (first_params + lp[..plan.frozen.layers as usize].iter().sum::<f64>()) * wb
            } else {
                0.0
            };
            let mut dev_weights = frozen_weights + if host_params { 0.0 } else { params * wb / shard(3) };
            // With the optimizer on the host, gradients go there bucket by bucket.
            let mut dev_grads = if host_opt && z >= 2 { 0.0 } else { params * gb / shard(2) };
            let mut dev_opt = if host_opt { 0.0 } else { params * ob / shard(1) };
            let mut host = MemoryBreakdown {
                weights: if host_params { params * wb / shard(3) } else { 0.0 },
                // ZeRO-Offload keeps fp32 gradients next to the states it updates.
                gradients: if host_opt { params * 4.0 / shard(1) } else { 0.0 },
                optimizer: if off.optimizer == Tier::Cpu { params * ob / shard(1) } else { 0.0 },
                activations: 0.0,
                buffers: 0.0,
            };
            // Gemini's steady state: chunks resident at the start are static, moves are
            // dynamic (on their copies); gradients reuse the chunks' memory.
            let mut placement = match (dynamic, stats) {
                (Some(dy), Some(stats)) => {
                    let d0 = b.dev_index[group[0] as usize];
                    let accesses: Vec<(gemini::UnitAccess, f64)> =
                        stats.iter().filter(|(a, _)| a.device == d0).copied().collect();
                    let input = gemini::StageInput {
                        eviction: dy.eviction,
                        budget_bytes: dy.budget_bytes,
                        hbm_bytes: s.options.usable_bytes(s.cluster.class(stage_class)),
                        weight_bytes: wb,
                        state_bytes: ob,
                        shards: sync,
                        interval: s.workload.net.as_ref().map_or(w.hidden as u64, |_| 1024),
                        split_layers: edges,
                        static_non_model: buffers + frozen_weights,
                    };
                    let pl = gemini::place_stage(&accesses, &input);
                    dev_weights = frozen_weights + pl.resident_bytes;
                    dev_grads = 0.0;
                    dev_opt = pl.device_state_bytes;
                    host.weights = pl.total_bytes - pl.min_resident_bytes;
                    host.optimizer = (1.0 - pl.split.device) * params * ob / shard(1);
                    if r == replicas[0] {
                        let moves = pl.moves.iter().flatten();
                        b.p.chunk_placement.push(ChunkPlacement {
                            stage,
                            chunk_params: pl.chunk_elems,
                            chunks: pl.chunks,
                            fetches: moves.clone().filter(|m| m.0).count(),
                            evictions: moves.clone().filter(|m| !m.0).count(),
                            moved_bytes: moves.map(|m| m.1).sum::<f64>() + 0.0,
                            optimizer_on_device: pl.split.device,
                            feasible: pl.feasible,
                        });
                    }
                    Some(pl)
                }
                (Some(_), None) => {
                    dev_grads = 0.0;
                    None
                }
                _ => None,
            };
            let nvme = if off.optimizer == Tier::Nvme { params * ob / shard(1) } else { 0.0 }
                + if off.params == Tier::Nvme { params * wb / shard(3) } else { 0.0 };
            for &d in &group {
                let di = b.dev_index[d as usize] as usize;
                let n = b.p.devices.len();
                for v in [&mut b.p.static_memory, &mut b.p.host_memory] {
                    if v.len() < n {
                        v.resize(n, MemoryBreakdown::default());
                    }
                }
                if b.p.nvme_bytes.len() < n {
                    b.p.nvme_bytes.resize(n, 0.0);
                }
                b.p.static_memory[di] = MemoryBreakdown {
                    weights: dev_weights,
                    gradients: dev_grads,
                    optimizer: dev_opt,
                    activations: 0.0,
                    buffers,
                };
                b.p.host_memory[di] = host;
                b.p.nvme_bytes[di] = nvme;
            }
            let last_bwd: HashMap<u32, u32> =
                order.iter().filter(|st| st.pass == Pass::Backward).map(|st| (st.chunk, st.micro_batch)).collect();
            // Every backward after a chunk's first adds its weight gradients into the ones kept
            // (ZeRO-2 and 3: into this device's shard; with the optimizer on the host and
            // gradients streamed there, nothing accumulates on the device).
            let mut first_bwd: HashMap<u32, u32> = HashMap::new();
            for st in order.iter().filter(|st| st.pass == Pass::Backward) {
                first_bwd.entry(st.chunk).or_insert(st.micro_batch);
            }
            let accumulate_gb = crate::cost::memory::accumulated_grad_bytes(plan);
            let mut bucket_pending = 0.0;
            // ZeRO-3 reduce-scatters each layer's gradients as soon as they exist.
            let bucket_bytes = if z3 { 0.0 } else { plan.bucket_bytes };
            let mut last_sync: Vec<u32> = Vec::new();
            // Activation offload: copies out per (chunk, micro-batch, layer), and the first
            // task of the last backward layer (fetches run one layer ahead).
            let act_off = off.activations != Tier::Device;
            let mut stashed: HashMap<(u32, u32, u32), Vec<u32>> = HashMap::new();
            let mut prev_bwd_first = NONE;
            let mut gathers = Gathers {
                prev_first: NONE,
                host: off.params,
                unit_label: NONE,
                dynamic: dynamic.is_some(),
                moves: placement.as_mut().map(|p| std::mem::take(&mut p.moves)),
                count: 0,
                prev_last: NONE,
                pending: (0, 0.0),
                wb,
                labels: (NONE, NONE),
            };
            for st in &order {
                let c = st.chunk;
                let mb = st.micro_batch;
                let layers = starts[c as usize]..starts[c as usize + 1];
                // ZeRO-2 and 3 reduce every micro-batch's gradients; below, only the last.
                // With the optimizer on the host, gradients stream there even without peers.
                let sync_grads = (sync > 1 || (host_opt && z >= 2)) && (z >= 2 || last_bwd.get(&c) == Some(&mb));
                let accumulate = accumulate_gb > 0.0 && first_bwd.get(&c) != Some(&mb);
                let ub = &unit_blocks[block_of[mb as usize]][stage_class as usize];
                let (embed, head) = (&ub.embed, &ub.head);
                // Bytes entering and leaving this chunk per micro-batch.
                let bnd_in = if starts[c as usize] > 0 { ub.boundary[starts[c as usize] as usize - 1] } else { 0.0 };
                let bnd_out = ub.boundary[starts[c as usize + 1] as usize - 1];
                // Megatron's scatter-gather: with 1D tensor parallelism every rank holds the
                // whole boundary activation, so each sends a 1/t share and the receivers
                // all-gather it over their fast links. Sharded modes send their own shard.
                let scatter_gather = t > 1 && plan.tp_mode == crate::workload::TpMode::OneD && !plan.sequence_parallel;
                let send_share = |bytes: f64| {
                    if plan.tp_mode == crate::workload::TpMode::OneD && !scatter_gather {
                        bytes
                    } else {
                        bytes / t as f64
                    }
                };
                let receive = |b: &mut Builder, phase: Phase, boundary_bytes: f64| -> u32 {
                    if !scatter_gather {
                        return NONE;
                    }
                    collective_on_compute(
                        b,
                        &ctx,
                        CollectiveKind::AllGather,
                        (crate::workload::Axis::Tensor, 0),
                        "recv_allgather",
                        boundary_bytes,
                        -1,
                        phase,
                        c,
                        mb,
                    );
                    (b.p.tasks.len() - 1) as u32
                };
                let unit = |b: &mut Builder,
                            gathers: &mut Gathers,
                            blk: &Block,
                            layer: i32,
                            phase: Phase,
                            alloc: f64,
                            free: f64,
                            unit_params: f64| {
                    let g = if per_unit { gathers.before(b, plan, r, stage, unit_params, layer) } else { Vec::new() };
                    let (f, l) = emit_block(b, &ctx, blk, layer, phase, c, mb, alloc, free);
                    if per_unit {
                        gathers.after(b, &ctx, &g, f, l);
                    }
                    (f, l)
                };
                match st.pass {
                    Pass::Forward => {
                        let gathered = if c > 0 { receive(&mut b, Phase::Forward, bnd_in) } else { NONE };
                        let mut first = NONE;
                        let mut last = NONE;
                        if c == 0 && plan.frozen.cached_layers > 0 {
                            // AutoCache: the cached prefix's output comes back over PCIe; the
                            // layers frozen since it was written run forward on top.
                            let label =
                                b.label(Label { op: "frozen_cache_read", layer: -1, phase: Phase::Forward, chunk: 0 });
                            // What does not fit in host DRAM comes from the node's disks.
                            let disk = plan.frozen.cache_on_disk.clamp(0.0, 1.0);
                            let mut reads: Vec<u32> = Vec::new();
                            for &d in &group {
                                let mut last_read = NONE;
                                for (share, nvme) in [(1.0 - disk, false), (disk, true)] {
                                    if share > 0.0 {
                                        let r = b.host_copy(
                                            d,
                                            true,
                                            share * ub.boundary[plan.frozen.cached_layers as usize - 1],
                                            nvme,
                                            label,
                                        );
                                        last_read = r;
                                    }
                                }
                                reads.push(last_read);
                            }
                            let marker = emit_group_compute(&mut b, &ctx, cache_op, label, mb);
                            for (x, &rd) in reads.iter().enumerate() {
                                b.p.deps.push((rd, marker + x as u32));
                            }
                            first = marker;
                            last = marker + t - 1;
                            for fl in plan.frozen.cached_layers..plan.frozen.layers {
                                let (_, la) =
                                    emit_block(&mut b, &ctx, ub.layer(fl), fl as i32, Phase::Forward, c, mb, 0.0, 0.0);
                                last = la;
                            }
                        } else if c == 0 && ub.edges {
                            let alloc = if frozen { 0.0 } else { embed.saved };
                            let (f, l) =
                                unit(&mut b, &mut gathers, embed, -1, Phase::Forward, alloc, 0.0, first_params);
                            first = f;
                            last = l;
                            // The frozen layers: forward only, nothing kept for backward.
                            for fl in 0..plan.frozen.layers {
                                let (_, la) =
                                    emit_block(&mut b, &ctx, ub.layer(fl), fl as i32, Phase::Forward, c, mb, 0.0, 0.0);
                                last = la;
                            }
                        }
                        for l in layers.clone() {
                            let layer = ub.layer(l);
                            let (f, la) = unit(
                                &mut b,
                                &mut gathers,
                                layer,
                                l as i32,
                                Phase::Forward,
                                layer.saved,
                                0.0,
                                lp[l as usize],
                            );
                            if act_off {
                                let outs = act_copies(&mut b, &ctx, false, layer.saved, l as i32, c, mb);
                                for (x, &o) in outs.iter().enumerate() {
                                    b.p.deps.push((la - (t - 1) + x as u32, o));
                                }
                                stashed.insert((c, mb, l), outs);
                            }
                            if first == NONE {
                                first = f;
                            }
                            last = la;
                        }
                        if c == chunks - 1 && ub.edges {
                            let (_, la) =
                                unit(&mut b, &mut gathers, head, -1, Phase::Forward, head.saved, 0.0, last_params);
                            last = la;
                        }
                        // Tasks of a step are laid out device-major per op; recover each
                        // device's first/last task by offset within the group.
                        for x in 0..t {
                            let k = key(r, c, mb, x);
                            fwd_first[k] = if gathered != NONE { gathered } else { first + x };
                            if c + 1 < chunks {
                                let src = group[x as usize];
                                let dst = plan.device(r, (c + 1) % plan.pp, x);
                                fwd_send[k] = send(
                                    &mut b,
                                    src,
                                    dst,
                                    send_share(bnd_out),
                                    last + x - (t - 1),
                                    c,
                                    mb,
                                    Phase::Forward,
                                );
                            }
                        }
                    }
                    Pass::Backward => {
                        let gathered = if c + 1 < chunks { receive(&mut b, Phase::Backward, bnd_out) } else { NONE };
                        let mut first = NONE;
                        let mut last = NONE;
                        if c == chunks - 1 && ub.edges {
                            let (f, l) =
                                unit(&mut b, &mut gathers, head, -1, Phase::Backward, 0.0, head.saved, last_params);
                            first = f;
                            last = l;
                            if accumulate
                                && let Some(a) =
                                    emit_grad_accumulate(&mut b, &ctx, last_params, accumulate_gb, -1, c, mb)
                            {
                                last = a;
                            }
                            if sync_grads {
                                bucket_pending += last_params * gb;
                            }
                        }
                        for l in layers.clone().rev() {
                            let layer = ub.layer(l);
                            let mut free = layer.saved;
                            // The gather for a layer's backward also serves its recomputation.
                            let g = if per_unit {
                                gathers.before(&mut b, plan, r, stage, lp[l as usize], l as i32)
                            } else {
                                Vec::new()
                            };
                            let mut fetched = Vec::new();
                            if act_off {
                                fetched = act_copies(&mut b, &ctx, true, layer.saved, l as i32, c, mb);
                                let outs = stashed.remove(&(c, mb, l)).expect("forward stashed this layer");
                                for x in 0..t as usize {
                                    b.p.deps.push((outs[x], fetched[x]));
                                    if prev_bwd_first != NONE {
                                        b.p.deps.push((prev_bwd_first + x as u32, fetched[x]));
                                    }
                                }
                            }
                            let mut unit_first = NONE;
                            match plan.recompute {
                                Recompute::Full => {
                                    let (f, _) =
                                        emit_recompute(&mut b, &ctx, layer, l as i32, c, mb, false, layer.saved_full);
                                    unit_first = f;
                                    free += layer.saved_full;
                                }
                                Recompute::Selective => {
                                    let (f, _) = emit_recompute(&mut b, &ctx, layer, l as i32, c, mb, true, 0.0);
                                    unit_first = f;
                                }
                                Recompute::None => {}
                            }
                            let (f, mut la) =
                                emit_block(&mut b, &ctx, layer, l as i32, Phase::Backward, c, mb, 0.0, free);
                            if accumulate
                                && let Some(a) =
                                    emit_grad_accumulate(&mut b, &ctx, lp[l as usize], accumulate_gb, l as i32, c, mb)
                            {
                                la = a;
                            }
                            if unit_first == NONE {
                                unit_first = f;
                            }
                            if per_unit {
                                gathers.after(&mut b, &ctx, &g, unit_first, la);
                            }
                            for (x, &fch) in fetched.iter().enumerate() {
                                b.p.deps.push((fch, unit_first + x as u32));
                            }
                            prev_bwd_first = unit_first;
                            if first == NONE {
                                first = unit_first;
                            }
                            last = la;
                            if sync_grads {
                                bucket_pending += lp[l as usize] * gb;
                                if bucket_pending >= bucket_bytes {
                                    last_sync = grad_sync(&mut b, plan, r, stage, bucket_pending, la, host_opt);
                                    bucket_pending = 0.0;
                                }
                            }
                        }
                        if c == 0 && !frozen && ub.edges {
                            let (_, la) =
                                unit(&mut b, &mut gathers, embed, -1, Phase::Backward, 0.0, embed.saved, first_params);
                            last = la;
                            if accumulate
                                && let Some(a) =
                                    emit_grad_accumulate(&mut b, &ctx, first_params, accumulate_gb, -1, c, mb)
                            {
                                last = a;
                            }
                            if sync_grads {
                                bucket_pending += first_params * gb;
                            }
                        }
                        if sync_grads && bucket_pending > 0.0 {
                            last_sync = grad_sync(&mut b, plan, r, stage, bucket_pending, last, host_opt);
                            bucket_pending = 0.0;
                        }
                        for x in 0..t {
                            let k = key(r, c, mb, x);
                            bwd_first[k] = if gathered != NONE { gathered } else { first + x };
                            if c > 0 {
                                let src = group[x as usize];
                                let dst = plan.device(r, (c - 1) % plan.pp, x);
                                bwd_send[k] = send(
                                    &mut b,
                                    src,
                                    dst,
                                    send_share(bnd_in),
                                    last + x - (t - 1),
                                    c,
                                    mb,
                                    Phase::Backward,
                                );
                            }
                        }
                    }
                }
            }
            for &sidx in &ctx.streams {
                let d = Program::stream_device(sidx) as usize;
                if b.p.compute_marks.len() <= d {
                    b.p.compute_marks.resize(b.p.devices.len(), 0);
                }
                b.p.compute_marks[d] = b.p.streams[sidx as usize].len() as u32;
            }
            let opt_tasks = match &placement {
                Some(pl) => optimizer_split(&mut b, plan, &ctx, &my_chunks, &last_sync, params / shard(1), pl.split),
                None => optimizer_step(&mut b, plan, &ctx, &my_chunks, &last_sync, params, dp, z),
            };
            if (1..3).contains(&z) {
                // Gather the updated parameter shards, in buckets like the gradients.
                let total = params * wb;
                let n = (total / plan.bucket_bytes).ceil().max(1.0) as u32;
                for i in 0..n {
                    let bytes = if i + 1 == n { total - plan.bucket_bytes * (n - 1) as f64 } else { plan.bucket_bytes };
                    for (x, &o) in opt_tasks.iter().enumerate() {
                        let g = dp_collective(
                            &mut b,
                            plan,
                            r,
                            stage,
                            x as u32,
                            CollectiveKind::AllGather,
                            bytes,
                            "param_allgather",
                            StreamKind::DataParallel,
                        );
                        if i == 0 {
                            b.p.deps.push((o, g));
                        }
                    }
                }
            }
        }
    }
    // Connect sends to their receivers.
    for &r in &replicas {
        for c in 0..chunks {
            for mb in 0..m {
                for x in 0..t {
                    let k = key(r, c, mb, x);
                    if c + 1 < chunks && fwd_send[k] != NONE {
                        b.p.deps.push((fwd_send[k], fwd_first[key(r, c + 1, mb, x)]));
                    }
                    if c > 0 && bwd_send[k] != NONE {
                        b.p.deps.push((bwd_send[k], bwd_first[key(r, c - 1, mb, x)]));
                    }
                }
            }
        }
    }
    (b.p, b.unit_log)
}

/// Emit one block (a layer, the embedding or the head) for a pass on every device of the
/// group. Compute ops get consecutive ids per op (device x of the group at `id + x`), so the
/// returned first and last ids are those of the group's device 0 and device t-1.
fn emit_block(
    b: &mut Builder,
    ctx: &StepCtx,
    blk: &Block,
    layer: i32,
    phase: Phase,
    chunk: u32,
    mb: u32,
    alloc: f64,
    free: f64,
) -> (u32, u32) {
    let backward = phase == Phase::Backward;
    let n = blk.ops.len();
    let t = ctx.group.len() as u32;
    let mut first = NONE;
    let mut last = NONE;
    let compute_ops = blk.ops.iter().filter(|o| o.compute().is_some()).count();
    let mut seen = 0;
    for i in 0..n {
        let j = if backward { n - 1 - i } else { i };
        match &blk.ops[j] {
            LayerOp::Compute(spec) => {
                seen += 1;
                let op = if backward { blk.bwd[j] } else { blk.fwd[j] };
                let label = layer_label(b, layer, j, spec.name, phase, chunk);
                let f = emit_group_compute(b, ctx, op, label, mb);
                if first == NONE {
                    first = f;
                    if alloc > 0.0 {
                        for x in 0..t {
                            let di = Program::stream_device(ctx.streams[x as usize]);
                            b.memory(f + x, di, false, alloc, layer);
                        }
                    }
                }
                last = f + t - 1;
                if seen == compute_ops && free > 0.0 {
                    for x in 0..t {
                        let di = Program::stream_device(ctx.streams[x as usize]);
                        b.memory(f + x, di, true, -free, layer);
                    }
                }
            }
            LayerOp::Comm { name, bytes, axis, forward, backward: bwd, root } => {
                let kind = if backward { *bwd } else { *forward };
                if let Some(kind) = kind {
                    collective_on_compute(b, ctx, kind, (*axis, *root), name, *bytes, layer, phase, chunk, mb);
                }
            }
        }
    }
    (first, last)
}

/// Re-run a layer's forward before its backward: all of it (full) or the core attention
/// (selective). Returns the first and last task ids as [`emit_block`] does.
fn emit_recompute(
    b: &mut Builder,
    ctx: &StepCtx,
    blk: &Block,
    layer: i32,
    chunk: u32,
    mb: u32,
    selective_only: bool,
    alloc: f64,
) -> (u32, u32) {
    let mut first = NONE;
    let mut last = NONE;
    for (j, op) in blk.ops.iter().enumerate() {
        match op {
            LayerOp::Compute(spec) => {
                if selective_only && spec.saved.selective_bytes == 0.0 && spec.name != "scores" {
                    continue;
                }
                let label = layer_label(b, layer, j, spec.name, Phase::Recompute, chunk);
                let f = emit_group_compute(b, ctx, blk.fwd[j], label, mb);
                if first == NONE {
                    first = f;
                    if alloc > 0.0 {
                        for x in 0..ctx.group.len() as u32 {
                            let di = Program::stream_device(ctx.streams[x as usize]);
                            b.memory(f + x, di, false, alloc, layer);
                        }
                    }
                }
                last = f + ctx.group.len() as u32 - 1;
            }
            LayerOp::Comm { name, bytes, axis, forward: Some(kind), root, .. } => {
                if !selective_only {
                    collective_on_compute(
                        b,
                        ctx,
                        *kind,
                        (*axis, *root),
                        name,
                        *bytes,
                        layer,
                        Phase::Recompute,
                        chunk,
                        mb,
                    );
                }
            }
            LayerOp::Comm { .. } => {}
        }
    }
    (first, last)
}

fn layer_label(b: &mut Builder, layer: i32, j: usize, name: &'static str, phase: Phase, chunk: u32) -> u32 {
    let ph = PH.iter().position(|p| *p == phase).expect("layer phase");
    if layer >= 0 {
        let l = layer as usize;
        if b.layer_labels[l].len() <= j {
            b.layer_labels[l].resize(j + 1, [NONE; 3]);
        }
        let cached = b.layer_labels[l][j][ph];
        if cached != NONE {
            return cached;
        }
        let id = b.label(Label { op: name, layer, phase, chunk });
        b.layer_labels[l][j][ph] = id;
        id
    } else {
        b.label(Label { op: name, layer, phase, chunk })
    }
}

/// One compute op on every device of the group; ids are consecutive.
fn emit_group_compute(b: &mut Builder, ctx: &StepCtx, op: u32, label: u32, mb: u32) -> u32 {
    let first = b.p.tasks.len() as u32;
    for &s in &ctx.streams {
        b.task(TaskKind::Compute, op, label, mb, &[s]);
    }
    first
}

/// Adds a unit's new weight gradients (`params` on each device of the group) into those kept
/// from the earlier micro-batches ([`OpSpec::grad_accumulate`]). Returns the last of the
/// group's tasks, or `None` when there is nothing to add.
fn emit_grad_accumulate(
    b: &mut Builder,
    ctx: &StepCtx,
    params: f64,
    grad_bytes: f64,
    layer: i32,
    chunk: u32,
    mb: u32,
) -> Option<u32> {
    let spec = OpSpec::grad_accumulate(params, grad_bytes);
    if spec.backward_bytes <= 0.0 {
        return None;
    }
    let key = (b.class, spec.backward_bytes.to_bits());
    let op = match b.accumulate_ops.get(&key) {
        Some(&op) => op,
        None => {
            let op = b.op(&spec, true);
            b.accumulate_ops.insert(key, op);
            op
        }
    };
    let label = b.label(Label { op: spec.name, layer, phase: Phase::Backward, chunk });
    Some(emit_group_compute(b, ctx, op, label, mb) + ctx.streams.len() as u32 - 1)
}

fn collective_on_compute(
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
        let id = b.collective_id(kind, ctx.group, bytes);
        let streams = ctx.streams.clone();
        b.task(TaskKind::Collective, id, label, mb, &streams);
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

fn send(b: &mut Builder, src: u32, dst: u32, bytes: f64, after: u32, chunk: u32, mb: u32, phase: Phase) -> u32 {
    let si = b.dev_index[src as usize];
    if src == dst {
        // Same device (interleaved chunks with one stage): no transfer, a plain dependency.
        return after;
    }
    let label = b.label(Label { op: "send", layer: -1, phase, chunk });
    b.p.transfers.push(Transfer { source: src, target: dst, bytes });
    let id = (b.p.transfers.len() - 1) as u32;
    let s = Program::stream_index(si, StreamKind::PipelineSend);
    let task = b.task(TaskKind::Transfer, id, label, mb, &[s]);
    b.p.deps.push((after, task));
    if let Some(held) = b.held_sends.as_mut() {
        held[Program::stream_index(si, StreamKind::Compute) as usize].push(task);
    }
    task
}

/// Data-parallel collectives of (stage, tp rank) across replicas, one per member group,
/// created by the first replica that lowers it; later replicas find it by sequence number.
fn dp_collective(
    b: &mut Builder,
    plan: &Plan,
    r: u32,
    stage: u32,
    x: u32,
    kind: CollectiveKind,
    bytes: f64,
    name: &'static str,
    stream: StreamKind,
) -> u32 {
    let seq_key = (r, stage, x, stream.index() as u32);
    let n = *b.dp_seq.entry(seq_key).and_modify(|v| *v += 1).or_insert(0) as usize;
    // Under ring sequence parallelism one collective spans the whole stage.
    let x_key = if plan.ring() { 0 } else { x };
    let list = b.dp_tasks.entry((stage, x_key, stream.index() as u32)).or_default();
    if n < list.len() {
        return list[n];
    }
    let label = b.label(Label { op: name, layer: -1, phase: Phase::Sync, chunk: stage });
    let members = plan.sync_members(stage, x);
    let streams: Vec<u32> = members
        .iter()
        .filter(|&&d| b.dev_index[d as usize] != NONE)
        .map(|&d| Program::stream_index(b.dev_index[d as usize], stream))
        .collect();
    let id = b.collective_id(kind, &members, bytes);
    let task = b.task(TaskKind::Collective, id, label, NONE, &streams);
    b.dp_tasks.entry((stage, x_key, stream.index() as u32)).or_default().push(task);
    task
}

/// Gradient sync of one bucket for every device of the group, each after that device's
/// task `after + x - (t-1)`; with the optimizer on the host, each device then copies its
/// reduced shard to host memory. Returns the last task per device.
fn grad_sync(b: &mut Builder, plan: &Plan, r: u32, stage: u32, bytes: f64, after: u32, to_host: bool) -> Vec<u32> {
    let kind = if plan.zero_stage >= 1 { CollectiveKind::ReduceScatter } else { CollectiveKind::AllReduce };
    let t = plan.tp;
    let label = b.label(Label { op: "grad_to_host", layer: -1, phase: Phase::Sync, chunk: stage });
    let alone = plan.sync_degree() == 1;
    (0..t)
        .map(|x| {
            let done = after + x - (t - 1);
            // Without peers there is nothing to reduce, only the copy to the host.
            let task = if alone {
                done
            } else {
                let task = dp_collective(b, plan, r, stage, x, kind, bytes, "grad_sync", StreamKind::DataParallel);
                b.p.deps.push((done, task));
                task
            };
            if !to_host {
                return task;
            }
            let shard = if kind == CollectiveKind::ReduceScatter { bytes / plan.sync_degree() as f64 } else { bytes };
            let copy = b.host_copy(plan.device(r, stage, x), false, shard, false, label);
            b.p.deps.push((task, copy));
            copy
        })
        .collect()
}

/// Copy a layer's kept activations out to host memory (freed on the device when the copy
/// ends) or back (allocated when the copy starts), for every device of the group.
fn act_copies(
    b: &mut Builder,
    ctx: &StepCtx,
    to_device: bool,
    bytes: f64,
    layer: i32,
    chunk: u32,
    mb: u32,
) -> Vec<u32> {
    let name = if to_device { "act_fetch" } else { "act_offload" };
    let phase = if to_device { Phase::Backward } else { Phase::Forward };
    let label = b.label(Label { op: name, layer, phase, chunk });
    ctx.group
        .iter()
        .map(|&d| {
            let task = b.host_copy(d, to_device, bytes, false, label);
            b.p.tasks[task as usize].micro_batch = mb;
            let device = b.dev_index[d as usize];
            let ev = if to_device {
                MemoryEvent {
                    device,
                    at_end: false,
                    activation_bytes: bytes,
                    buffer_bytes: 0.0,
                    next: NONE,
                    tag: memory_tag(layer),
                }
            } else {
                MemoryEvent {
                    device,
                    at_end: true,
                    activation_bytes: -bytes,
                    buffer_bytes: 0.0,
                    next: NONE,
                    tag: memory_tag(layer),
                }
            };
            b.memory_event(task, ev);
            task
        })
        .collect()
}

/// ZeRO-3 parameter gathers around each unit (a layer, the embedding, the head), and
/// Gemini's chunk moves before each.
struct Gathers {
    /// Device-0 id of the previous unit's first compute task: the next gather waits for it
    /// (prefetch of one unit, as FSDP's limit on in-flight all-gathers).
    prev_first: u32,
    host: Tier,
    unit_label: u32,
    /// Gemini: chunks move in the operator's hook, after the previous unit has run (no
    /// prefetch), and every access is logged for the warm-up statistics.
    dynamic: bool,
    /// Gemini's steady-state moves per access, as (to device, bytes); `None` in the warm-up.
    moves: Option<Vec<Vec<(bool, f64)>>>,
    /// Accesses so far.
    count: usize,
    /// Device-0 id of the previous unit's last compute task.
    prev_last: u32,
    /// The unit being gathered and its parameters (logged by `after`).
    pending: (i32, f64),
    /// Bytes per parameter of the gathered weights.
    wb: f64,
    /// Labels of chunk fetches and evictions.
    labels: (u32, u32),
}

impl Gathers {
    /// Fetch (from the host tier if offloaded, or Gemini's moves) and all-gather a unit of
    /// `params` parameters (unsharded) for every device of the group; returns the task each
    /// device's compute waits for ([`NONE`] if nothing).
    fn before(&mut self, b: &mut Builder, plan: &Plan, r: u32, stage: u32, params: f64, unit: i32) -> Vec<u32> {
        let bytes = params * self.wb;
        if self.dynamic {
            return self.before_dynamic(b, plan, r, stage, params, unit);
        }
        if self.unit_label == NONE {
            self.unit_label = b.label(Label { op: "param_fetch", layer: -1, phase: Phase::Sync, chunk: stage });
        }
        (0..plan.tp)
            .map(|x| {
                let mut copy = NONE;
                if self.host != Tier::Device {
                    let d = plan.device(r, stage, x);
                    copy = b.host_copy(
                        d,
                        true,
                        bytes / plan.sync_degree() as f64,
                        self.host == Tier::Nvme,
                        self.unit_label,
                    );
                }
                gather_after_copies(b, plan, r, stage, x, bytes, (copy, copy), self.prev_first)
            })
            .collect()
    }

    fn before_dynamic(&mut self, b: &mut Builder, plan: &Plan, r: u32, stage: u32, params: f64, unit: i32) -> Vec<u32> {
        if self.labels.0 == NONE {
            self.labels = (
                b.label(Label { op: "chunk_fetch", layer: -1, phase: Phase::Sync, chunk: stage }),
                b.label(Label { op: "chunk_evict", layer: -1, phase: Phase::Sync, chunk: stage }),
            );
        }
        let k = self.count;
        self.count += 1;
        self.pending = (unit, params);
        // Each access's moves are emitted once.
        let moves = self.moves.as_mut().map(|m| std::mem::take(&mut m[k])).unwrap_or_default();
        (0..plan.tp)
            .map(|x| {
                let d = plan.device(r, stage, x);
                let di = b.dev_index[d as usize];
                let (mut head, mut tail) = (NONE, NONE);
                for &(to_device, bytes) in &moves {
                    let label = if to_device { self.labels.0 } else { self.labels.1 };
                    let copy = b.host_copy(d, to_device, bytes, false, label);
                    // A fetched chunk takes room when its copy starts; an evicted one frees
                    // it when its copy ends.
                    b.memory_event(
                        copy,
                        MemoryEvent {
                            device: di,
                            at_end: !to_device,
                            activation_bytes: 0.0,
                            buffer_bytes: if to_device { bytes } else { -bytes },
                            next: NONE,
                            tag: memory_tag(unit),
                        },
                    );
                    if head == NONE {
                        head = copy;
                    }
                    tail = copy;
                }
                gather_after_copies(b, plan, r, stage, x, params * self.wb, (head, tail), self.prev_last)
            })
            .collect()
    }

    /// The unit's compute (first task `first`, last task of the group's last device `last`)
    /// waits for its gather.
    fn after(&mut self, b: &mut Builder, ctx: &StepCtx, gathers: &[u32], first: u32, last: u32) {
        for (x, &g) in gathers.iter().enumerate() {
            if g != NONE {
                b.p.deps.push((g, first + x as u32));
            }
        }
        if self.dynamic {
            let t = ctx.group.len() as u32;
            self.prev_last = last + 1 - t;
            b.unit_log.push(gemini::UnitAccess {
                device: b.dev_index[ctx.group[0] as usize],
                unit: self.pending.0,
                params: self.pending.1,
                first_task: first,
            });
        }
        self.prev_first = first;
    }
}

/// The all-gather of a unit of `bytes` for tensor-parallel rank `x` (none without data-parallel
/// peers) after its host copies `first..=last` (on the host-copy stream, in order; [`NONE`] if
/// none); the first of them, or the gather, waits for task `wait + x` of the previous unit.
/// Returns what the unit's compute waits for ([`NONE`] if nothing).
fn gather_after_copies(
    b: &mut Builder,
    plan: &Plan,
    r: u32,
    stage: u32,
    x: u32,
    bytes: f64,
    (first, last): (u32, u32),
    wait: u32,
) -> u32 {
    let g = if plan.sync_degree() > 1 {
        dp_collective(b, plan, r, stage, x, CollectiveKind::AllGather, bytes, "param_gather", StreamKind::Gather)
    } else {
        last
    };
    if last != NONE && g != last {
        b.p.deps.push((last, g));
    }
    let head = if first == NONE { g } else { first };
    if wait != NONE && head != NONE {
        b.p.deps.push((wait + x, head));
    }
    g
}

/// Gemini's hybrid Adam on each device of a stage, after its gradient sync: the share of
/// `local` parameters (this device's shard) whose chunk and states are on the device steps
/// there; chunks on the device with states on the host send their gradients down, step on the
/// CPU and copy their weights back; chunks on the host step on the CPU in place. Returns, per
/// device, the task after which its parameters are updated.
fn optimizer_split(
    b: &mut Builder,
    plan: &Plan,
    ctx: &StepCtx,
    my_chunks: &[u32],
    last_sync: &[u32],
    local: f64,
    split: gemini::Split,
) -> Vec<u32> {
    let (wb, gb, _) = bytes_per_parameter(plan.precision, plan.optimizer);
    let device_op = (split.device > 0.0).then(|| optimizer_op(b, plan, false, split.device * local, 0.0, my_chunks[0]));
    let host_share = split.resident_host_states + split.host;
    let host_op = (host_share > 0.0).then(|| optimizer_op(b, plan, true, host_share * local, 0.0, my_chunks[0]));
    let down = b.label(Label { op: "grad_to_host", layer: -1, phase: Phase::Sync, chunk: my_chunks[0] });
    let up = b.label(Label { op: "param_to_device", layer: -1, phase: Phase::Optimizer, chunk: my_chunks[0] });
    let moved = split.resident_host_states * local;
    let mut ready = Vec::new();
    for (x, &stream) in ctx.streams.iter().enumerate() {
        let device = ctx.group[x];
        // Without a data-parallel sync, after the device's pipeline work.
        let wait =
            last_sync.get(x).copied().unwrap_or_else(|| *b.p.streams[stream as usize].last().expect("pipeline tasks"));
        let mut last = wait;
        if let Some((o, label)) = device_op {
            let task = b.task(TaskKind::Compute, o, label, NONE, &[stream]);
            if wait != NONE {
                b.p.deps.push((wait, task));
            }
            last = task;
        }
        if let Some((o, label)) = host_op {
            let mut before = wait;
            if moved > 0.0 {
                let copy = b.host_copy(device, false, moved * gb, false, down);
                if wait != NONE {
                    b.p.deps.push((wait, copy));
                }
                before = copy;
            }
            let task = b.task(TaskKind::Compute, o, label, NONE, &[stream]);
            if before != NONE {
                b.p.deps.push((before, task));
            }
            last = task;
            if moved > 0.0 {
                let copy = b.host_copy(device, true, moved * wb, false, up);
                b.p.deps.push((task, copy));
                last = copy;
            }
        }
        ready.push(last);
    }
    ready
}

/// An optimizer-step op over `params` parameters, on the device or (`host`) on the host CPU,
/// streaming `nvme_bytes` of states from NVMe; returns the op and its label.
fn optimizer_op(b: &mut Builder, plan: &Plan, host: bool, params: f64, nvme_bytes: f64, chunk: u32) -> (u32, u32) {
    let (wb, _, ob) = bytes_per_parameter(plan.precision, plan.optimizer);
    let traffic = if host {
        // fp32 gradient in, states read and written, the low-precision weights out.
        (4.0 + 2.0 * ob + wb) * params
    } else {
        optimizer_traffic_bytes(plan.precision, plan.optimizer) * params
    };
    let name = if host { "cpu_optimizer" } else { "optimizer" };
    let spec = OpSpec {
        name,
        class: OpClass::Memory,
        forward_flops: 0.0,
        forward_bytes: traffic,
        backward_flops: 0.0,
        backward_bytes: traffic,
        saved: Saved::default(),
    };
    b.p.ops.push(OpInstance { spec, backward: false, on_host: host, nvme_bytes, class: b.class });
    let label = b.label(Label { op: name, layer: -1, phase: Phase::Optimizer, chunk });
    ((b.p.ops.len() - 1) as u32, label)
}

/// The optimizer step of each device of a stage, after its gradient sync: on the device, or
/// (offloaded) on the host CPU followed by the copy of the updated weights back. Returns,
/// per device, the task after which its updated parameter shard is on the device.
fn optimizer_step(
    b: &mut Builder,
    plan: &Plan,
    ctx: &StepCtx,
    my_chunks: &[u32],
    last_sync: &[u32],
    params: f64,
    dp: f64,
    z: u8,
) -> Vec<u32> {
    let (wb, gb, ob) = bytes_per_parameter(plan.precision, plan.optimizer);
    let local = params / if z >= 1 { dp } else { 1.0 };
    let off = plan.offload;
    let host = off.optimizer != Tier::Device;
    let nvme = if off.optimizer == Tier::Nvme { 2.0 * ob * local } else { 0.0 };
    let (op, label) = optimizer_op(b, plan, host, local, nvme, my_chunks[0]);
    let copy_label = b.label(Label { op: "param_to_device", layer: -1, phase: Phase::Optimizer, chunk: my_chunks[0] });
    let grad_label = b.label(Label { op: "grad_to_host", layer: -1, phase: Phase::Sync, chunk: my_chunks[0] });
    let mut ready = Vec::new();
    for (x, &stream) in ctx.streams.iter().enumerate() {
        let device = ctx.group[x];
        let mut wait = last_sync.get(x).copied().unwrap_or(NONE);
        if host && wait == NONE {
            // No data-parallel sync: copy the whole gradient after the pipeline.
            let pipeline_last = *b.p.streams[stream as usize].last().expect("pipeline tasks");
            let copy = b.host_copy(device, false, params * gb, false, grad_label);
            b.p.deps.push((pipeline_last, copy));
            wait = copy;
        }
        let task = b.task(TaskKind::Compute, op, label, NONE, &[stream]);
        if wait != NONE {
            b.p.deps.push((wait, task));
        }
        if host && off.params == Tier::Device {
            let copy = b.host_copy(device, true, local * wb, false, copy_label);
            b.p.deps.push((task, copy));
            ready.push(copy);
        } else {
            ready.push(task);
        }
    }
    ready
}

#[cfg(test)]
mod tests;
