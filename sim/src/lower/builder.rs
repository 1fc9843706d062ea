//! The program under construction and the primitives every pass uses: labels, ops, tasks on
//! streams, shared collectives, memory events and host copies.

use super::gemini;
use super::program::*;
use crate::plan::P2p;
use crate::report::timeline::{Label, Phase, StreamKind};
use crate::scenario::Scenario;
use crate::workload::OpSpec;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A fast hasher for the lowering's small keys (labels, collective members), which
/// SipHash made a tenth of the lowering: each word is mixed in by a rotate, an xor and a
/// multiplication by an odd constant (the scheme of rustc's `FxHasher`). Keys come from the
/// program, not from an adversary.
#[derive(Default, Clone, Copy)]
pub(super) struct WordHasher(u64);

impl Hasher for WordHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.write_u64(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        for &b in chunks.remainder() {
            self.write_u64(b as u64);
        }
    }

    #[inline]
    fn write_u64(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x517c_c1b7_2722_0a95);
    }

    #[inline]
    fn write_u32(&mut self, word: u32) {
        self.write_u64(word as u64);
    }

    #[inline]
    fn write_u8(&mut self, word: u8) {
        self.write_u64(word as u64);
    }

    #[inline]
    fn write_usize(&mut self, word: usize) {
        self.write_u64(word as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

pub(super) type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<WordHasher>>;

pub(super) struct Builder {
    pub(super) p: Program,

    labels: FastMap<Label, u32>,
    /// Per-layer label ids: [layer][op][phase], built on first use.
    pub(super) layer_labels: Vec<Vec<[u32; 3]>>,
    pub(super) dev_index: Vec<u32>,
    /// Tensor ranks lowered per group: all, or rank 0 under tensor symmetry
    /// ([`super::simulates_one_tensor_rank`]); the group's first `ranks` devices.
    pub(super) ranks: u32,
    /// Whether only replica 0 is lowered ([`super::simulates_one_replica`]).
    pub(super) one_replica: bool,
    /// Device class of the ops being created.
    pub(super) class: u16,
    /// Collective tasks shared by the replicas of a group, in creation order per group, and
    /// how many of them each member has reached (see [`Builder::shared_next`]).
    shared_tasks: HashMap<(Shared, [u32; 3]), Vec<u32>>,
    shared_seq: HashMap<(Shared, [u32; 4]), u32>,
    /// Collectives by (kind, size's bits, hash of the members); a second collective with the
    /// same key (a hash collision) goes to `colliding_collectives`.
    collective_ids: FastMap<(u8, u64, u64), u32>,
    colliding_collectives: HashMap<(u8, Vec<u32>, u64, u64), u32>,
    /// Gemini's warm-up log: every unit access, in program order per device.
    pub(super) unit_log: Vec<gemini::UnitAccess>,
    /// Blocking point-to-point (`plan.p2p`): the sends each compute stream's next task waits for.
    pub(super) held_sends: Option<Vec<Vec<u32>>>,
    /// Per compute stream, overlapped expert all-to-alls its next schedule step waits for
    /// (`Plan::ep_overlap`; see `expert_parallel::ep_collective`).
    pub(super) held_step: Vec<Vec<u32>>,
    /// Overlapped tensor-parallel collectives each compute stream's next task waits for
    /// (empty unless `framework.tp_comm_overlap` or `tp_async_backward` applies, or context
    /// or expert parallelism overlaps).
    pub(super) held_tp: Vec<Vec<u32>>,
    /// Each op's copies that run on fewer compute units or one product of its backward
    /// (`TpOverlap`), by op and kind of change ([`Builder::narrowed`], [`Builder::part_of`]).
    derived_ops: HashMap<(u32, u8), u32>,
    /// Memory ops made outside a block (gradient accumulation, FSDP2's copy-out, list
    /// collectives' copies), one per (device class, name, forward and backward bytes, kernels,
    /// pass): units that move as much share it.
    shared_ops: HashMap<(u16, &'static str, u64, u64, u64, bool), u32>,
}

/// Collectives shared by a group's replicas ([`Builder::shared_next`]): data-parallel
/// (group: stage, tensor rank, stream), expert-parallel all-to-alls (expert-parallel group,
/// stage, tensor rank) and expert-data-parallel (replica modulo ep, stage, tensor rank).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Shared {
    Data,
    /// Under hybrid sharding, the all-reduce of a shard across the shard groups.
    Replicate,
    Expert,
    ExpertData,
    Context,
}

/// The phases a layer's ops are labelled with, in the order of `Builder::layer_labels`.
pub(super) const PH: [Phase; 3] = [Phase::Forward, Phase::Backward, Phase::Recompute];

impl Builder {
    /// An empty program over the devices to simulate: all of them, or under symmetry (see
    /// [`super::simulates_one_replica`]) replica 0's only.
    pub(super) fn new(s: &Scenario) -> Builder {
        let plan = &s.plan;
        let devices = plan.devices();
        let folds = super::folds(s);
        let (one_replica, one_rank) = (folds.replica, folds.rank);
        let symmetric = one_replica || one_rank;
        let stands_for = |d: u32| {
            let (r, st, x) = plan.coords(d);
            plan.device(if one_replica { 0 } else { r }, st, if one_rank { 0 } else { x })
        };
        let simulated: Vec<u32> = (0..devices).filter(|&d| stands_for(d) == d).collect();
        let mut dev_index = vec![NONE; devices as usize];
        for (i, &d) in simulated.iter().enumerate() {
            dev_index[d as usize] = i as u32;
        }
        let mirror: Vec<u32> = (0..devices).map(|d| dev_index[stands_for(d) as usize]).collect();
        Builder {
            p: Program {
                devices: simulated.clone(),
                stages: simulated.iter().map(|&d| plan.coords(d).1).collect(),
                mirror,
                streams: vec![Vec::new(); simulated.len() * STREAMS],
                symmetric,
                nvme_share: folds.nvme_share,
                ..Program::default()
            },
            ranks: if one_rank { 1 } else { plan.tp },
            one_replica,

            labels: FastMap::default(),
            layer_labels: Vec::new(),
            dev_index,
            class: 0,
            shared_tasks: HashMap::new(),
            shared_seq: HashMap::new(),
            collective_ids: FastMap::default(),
            colliding_collectives: HashMap::new(),
            unit_log: Vec::new(),
            shared_ops: HashMap::new(),
            derived_ops: HashMap::new(),
            held_sends: (plan.p2p == P2p::Blocking).then(|| vec![Vec::new(); simulated.len() * STREAMS]),
            held_step: if plan.ep_overlap() { vec![Vec::new(); simulated.len() * STREAMS] } else { Vec::new() },
            held_tp: if plan.tp_overlap() || plan.tp_async() || plan.cp > 1 || plan.ep_overlap() {
                vec![Vec::new(); simulated.len() * STREAMS]
            } else {
                Vec::new()
            },
        }
    }

    pub(super) fn label(&mut self, l: Label) -> u32 {
        let next = self.p.labels.len() as u32;
        *self.labels.entry(l.clone()).or_insert_with(|| {
            self.p.labels.push(l);
            next
        })
    }

    pub(super) fn op(&mut self, spec: &OpSpec, backward: bool) -> u32 {
        self.p.ops.push(OpInstance {
            spec: spec.clone(),
            backward,
            on_host: false,
            nvme_bytes: 0.0,
            class: self.class,
            sm_share: 1.0,
            part: OpPart::Whole,
            rows: 1.0,
            chunks: 1.0,
        });
        (self.p.ops.len() - 1) as u32
    }

    /// The op of `spec` for this device class and pass, made on first use and shared after.
    pub(super) fn shared_op(&mut self, spec: &OpSpec, backward: bool) -> u32 {
        // Kernels per op too: a run of copies (`OpClass::Copies`) with the same bytes may
        // launch more or fewer of them.
        let kernels = crate::cost::launches(spec, backward).to_bits();
        let key =
            (self.class, spec.name, spec.forward_bytes.to_bits(), spec.backward_bytes.to_bits(), kernels, backward);
        if let Some(&op) = self.shared_ops.get(&key) {
            return op;
        }
        let op = self.op(spec, backward);
        self.shared_ops.insert(key, op);
        op
    }

    /// A task on `streams` (several for a collective among them). Under blocking
    /// point-to-point, a compute stream's new task waits for the sends held for it.
    pub(super) fn task(&mut self, kind: TaskKind, payload: u32, label: u32, mb: u32, streams: &[u32]) -> u32 {
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
            self.place(id, s);
        }
        id
    }

    /// Puts task `id` at the end of stream `s`.
    fn place(&mut self, id: u32, s: u32) {
        self.p.streams[s as usize].push(id);
        if Program::stream_kind(s) != StreamKind::Compute {
            return;
        }
        if let Some(held) = self.held_sends.as_mut()
            && !held[s as usize].is_empty()
        {
            for send in held[s as usize].drain(..) {
                self.p.deps.push((send, id));
            }
        }
        if let Some(held) = self.held_tp.get_mut(s as usize)
            && !held.is_empty()
        {
            for c in held.drain(..) {
                self.p.deps.push((c, id));
            }
        }
    }

    /// Adds stream `s` to an existing task's streams (a collective created by another
    /// replica's lowering joins this replica's stream where this replica reaches it).
    pub(super) fn join(&mut self, id: u32, s: u32) {
        self.p.tasks[id as usize].streams += 1;
        self.place(id, s);
    }

    /// A copy of op `op` that runs `part` of its backward (one per op and part).
    pub(super) fn part_of(&mut self, op: u32, part: OpPart) -> u32 {
        self.derived(op, 1 + part as u8, |o| o.part = part)
    }

    /// A copy of op `op` that runs on `share` of the device's compute units (one per op).
    pub(super) fn narrowed(&mut self, op: u32, share: f64) -> u32 {
        self.derived(op, 0, |o| o.sm_share = share)
    }

    /// A copy of op `op` that runs `chunks` kernels of `rows` of its rows each, up to
    /// `streams` of them at once (`OpInstance::rows`, as [`super::chunk_kernels`] counts
    /// them): a GEMM's chunks under a fused tensor-parallel collective, one (a rank's own) or
    /// several (the others'; one copy per op and kind: an op's chunks all come from one
    /// group's size).
    pub(super) fn rows_of(&mut self, op: u32, rows: f64, chunks: f64, streams: f64) -> u32 {
        let (rows, kernels) = super::chunk_kernels(rows, chunks, streams);
        self.derived(op, if chunks > 1.0 { 4 } else { 5 }, |o| {
            o.rows = rows;
            o.chunks = kernels;
        })
    }

    /// A copy of op `op` changed by `edit`, made once per op and `kind` of change.
    fn derived(&mut self, op: u32, kind: u8, edit: impl FnOnce(&mut OpInstance)) -> u32 {
        if let Some(&n) = self.derived_ops.get(&(op, kind)) {
            return n;
        }
        let mut o = self.p.ops[op as usize].clone();
        edit(&mut o);
        self.p.ops.push(o);
        let n = (self.p.ops.len() - 1) as u32;
        self.derived_ops.insert((op, kind), n);
        n
    }

    /// The id of a collective, shared by every task with the same kind, members and size.
    pub(super) fn collective_id(&mut self, kind: CollectiveKind, members: &[u32], bytes: f64) -> u32 {
        self.collective_calls_id(kind, members, bytes, 1)
    }

    /// The id of `calls` identical back-to-back calls of a collective as one task
    /// ([`Collective::calls`]), shared like [`Builder::collective_id`]'s.
    pub(super) fn collective_calls_id(&mut self, kind: CollectiveKind, members: &[u32], bytes: f64, calls: u64) -> u32 {
        let mut h = WordHasher::default();
        for &m in members {
            h.write_u32(m);
        }
        h.write_usize(members.len());
        h.write_u64(calls);
        let key = (kind as u8, bytes.to_bits(), h.finish());
        let next = self.p.collectives.len() as u32;
        match self.collective_ids.get(&key) {
            Some(&id)
                if self.p.collectives[id as usize].members == members
                    && self.p.collectives[id as usize].calls == calls =>
            {
                return id;
            }
            Some(_) => {
                let long_key = (kind as u8, members.to_vec(), bytes.to_bits(), calls);
                if let Some(&id) = self.colliding_collectives.get(&long_key) {
                    return id;
                }
                self.colliding_collectives.insert(long_key, next);
            }
            None => {
                self.collective_ids.insert(key, next);
            }
        }
        self.p.collectives.push(Collective { kind, members: members.to_vec(), bytes, calls });
        next
    }

    /// Activation bytes allocated (or, negative, freed) at a task's start or end.
    pub(super) fn memory(&mut self, task: u32, device: u32, at_end: bool, activation_bytes: f64, layer: i32) {
        let tag = memory_tag(layer);
        self.memory_event(task, MemoryEvent { device, at_end, activation_bytes, buffer_bytes: 0.0, next: NONE, tag });
    }

    /// Bytes `task` holds on `device` only while it runs (an op's temporaries): allocated at
    /// its start, freed at its end.
    pub(super) fn memory_while(&mut self, task: u32, device: u32, bytes: f64, layer: i32) {
        self.memory(task, device, false, bytes, layer);
        self.memory(task, device, true, -bytes, layer);
    }

    /// Attach a memory event to a task (a task may carry several).
    pub(super) fn memory_event(&mut self, task: u32, ev: MemoryEvent) {
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
    pub(super) fn host_copy(&mut self, device: u32, to_device: bool, bytes: f64, nvme: bool, label: u32) -> u32 {
        self.p.host_copies.push(HostCopy { device, to_device, bytes, nvme });
        let id = (self.p.host_copies.len() - 1) as u32;
        let s = Program::stream_index(self.dev_index[device as usize], StreamKind::HostCopy);
        self.task(TaskKind::HostCopy, id, label, NONE, &[s])
    }

    /// The next collective of kind `kind` that `member` (replica, stage, tensor rank, stream)
    /// reaches in `group`: its n-th, where n counts its earlier calls. The group's replicas
    /// run the same schedule, so their n-th collectives match: the first to reach it creates
    /// it (`None` here; then [`Builder::share`]), the others find it.
    pub(super) fn shared_next(&mut self, kind: Shared, group: [u32; 3], member: [u32; 4]) -> Option<u32> {
        let n = *self.shared_seq.entry((kind, member)).and_modify(|v| *v += 1).or_insert(0) as usize;
        self.shared_tasks.get(&(kind, group)).and_then(|list| list.get(n)).copied()
    }

    /// The group's next shared collective for `member` on its stream `s`: joined there when
    /// another member of the group created it, else created on `s` (of `kind` among
    /// `members`, `bytes` each) and recorded for the others (see [`Builder::shared_next`]).
    pub(super) fn shared_collective(
        &mut self,
        shared: Shared,
        (group, member): ([u32; 3], [u32; 4]),
        (kind, members, bytes): (CollectiveKind, &[u32], f64),
        (label, mb): (u32, u32),
        s: u32,
    ) -> u32 {
        if let Some(task) = self.shared_next(shared, group, member) {
            self.join(task, s);
            return task;
        }
        let id = self.collective_id(kind, members, bytes);
        let task = self.task(TaskKind::Collective, id, label, mb, &[s]);
        self.share(shared, group, task);
        task
    }

    /// The group's next shared gradient reduction or parameter gather (data-parallel or
    /// expert-data-parallel) for `member`, whose own stream is `own`: when another member
    /// created it, found, and joined on `own` where members join one by one (`joined`: on the
    /// compute stream, or under hybrid sharding, each member's collectives queue in its own
    /// walk's order); else created among `members()` (`calls` back-to-back calls of `bytes`
    /// each, labelled `label`), on `own` alone where members join one by one, else on every
    /// lowered member's `stream` at once, and recorded for the others.
    pub(super) fn shared_sync(
        &mut self,
        shared: Shared,
        (group, member): ([u32; 3], [u32; 4]),
        (own, joined): (u32, bool),
        (kind, members, stream): (CollectiveKind, impl FnOnce() -> Vec<u32>, StreamKind),
        (bytes, calls): (f64, u64),
        label: Label,
    ) -> u32 {
        if let Some(task) = self.shared_next(shared, group, member) {
            if joined {
                self.join(task, own);
            }
            return task;
        }
        let label = self.label(label);
        let members = members();
        let streams: Vec<u32> = if joined {
            vec![own]
        } else {
            members
                .iter()
                .filter(|&&d| self.dev_index[d as usize] != NONE)
                .map(|&d| Program::stream_index(self.dev_index[d as usize], stream))
                .collect()
        };
        let id = self.collective_calls_id(kind, &members, bytes, calls);
        let task = self.task(TaskKind::Collective, id, label, NONE, &streams);
        self.share(shared, group, task);
        task
    }

    /// `task` starts no earlier than the end of stream `s`'s last task so far (a collective
    /// beside compute starts where the compute stream stands).
    pub(super) fn after_stream_tail(&mut self, s: u32, task: u32) {
        if let Some(&last) = self.p.streams[s as usize].last() {
            self.p.deps.push((last, task));
        }
    }

    /// Records `task` as the group's next shared collective (see [`Builder::shared_next`]).
    pub(super) fn share(&mut self, kind: Shared, group: [u32; 3], task: u32) {
        self.shared_tasks.entry((kind, group)).or_default().push(task);
    }

    pub(super) fn compute_streams(&self, group: &[u32]) -> Vec<u32> {
        group.iter().map(|&d| Program::stream_index(self.dev_index[d as usize], StreamKind::Compute)).collect()
    }
}

/// One tensor-parallel group (a pipeline stage of one replica): what every step's lowering
/// on it needs.
pub(super) struct StepCtx {
    /// The group's devices, in tensor-parallel rank order: every rank (the members of its
    /// collectives), lowered or mirrored.
    pub(super) group: Vec<u32>,
    /// The compute streams of the ranks lowered (`Builder::ranks`: the group's first ones).
    pub(super) streams: Vec<u32>,
    /// The tensor-parallel grid's dimensions (see `TpMode::dims`).
    pub(super) dims: Vec<u32>,
    /// The lowered ranks' tensor-parallel communication streams when its collectives overlap the
    /// GEMMs (`Plan::tp_overlap`), else empty.
    pub(super) tp_streams: Vec<u32>,
    /// The lowered ranks' NCCL streams for the collectives a column-parallel layer's
    /// backward runs beside its GEMMs (`Plan::tp_async`), else empty.
    pub(super) tp_async_streams: Vec<u32>,
    /// Fraction of the device's compute units a GEMM keeps while a pipelined reduce-scatter
    /// overlaps it (`TpOverlap`).
    pub(super) tp_sm_share: f64,
    /// The overlap is PyTorch's micro-pipelined TP (`framework.tp_micro_pipeline` under
    /// `Plan::tp_overlap`): the gathered input is kept (no re-gather in backward), and with
    /// separate projections (`summed_input_grads`) the attention's and the MLP's input
    /// gradients, sums of several GEMMs, are reduce-scattered unfused, on the compute stream.
    pub(super) micro_pipeline: bool,
    pub(super) summed_input_grads: bool,
    /// The replica and stage being lowered, the expert-parallel group's index (replica / ep)
    /// and, per lowered tensor rank, its expert-parallel group's devices (empty when ep = 1).
    pub(super) replica: u32,
    pub(super) stage: u32,
    pub(super) ep_group: u32,
    pub(super) ep_members: Vec<Vec<u32>>,
    /// The context-parallel group's index (replica / cp) and, per lowered tensor rank, its
    /// context-parallel group's devices and the rank's communication stream the ring runs
    /// on (both empty when cp = 1).
    pub(super) cp_group: u32,
    pub(super) cp_members: Vec<Vec<u32>>,
    pub(super) cp_streams: Vec<u32>,
    /// The lowered ranks' communication streams the expert all-to-alls run on when they
    /// overlap another micro-batch's compute (`Plan::ep_overlap`), else empty.
    pub(super) ep_streams: Vec<u32>,
}

impl StepCtx {
    /// The devices of the ranks lowered (the group's first ones), in rank order.
    pub(super) fn lowered(&self) -> &[u32] {
        &self.group[..self.streams.len()]
    }
}
