//! Interpreting a Program: streams, dependencies, flows and memory, event by event.

use super::attribution::Attribution;
use super::contention::{Comm, Contention, Kernel};
use super::expanded::Expanded;
use super::queue::{Event, EventQueue};
use super::sparse::Sparse;
use crate::hardware::Topology;
use crate::lower::{NONE, Program, STREAMS, TaskKind};
use crate::network::{FlowId, Network, NetworkKind, Reschedule};
use crate::report::timeline::{FlowSpan, Span, StreamKind, Timeline};

mod hbm;
mod memory;

#[derive(Clone, Copy, Debug)]
pub struct RunOptions {
    pub network: NetworkKind,
    /// Keep every span, flow and memory change (for traces and plots).
    pub record: bool,
    /// Fixed cost of starting a collective or transfer (its kernel launch).
    pub collective_launch_ns: u64,
    /// Relative standard deviation of a device's compute-bound kernel speed
    /// (`simulation.kernel_jitter`; 0: none; see `engine::jitter`).
    pub kernel_jitter: f64,
    /// How long a device's kernel speed stays correlated (s; `simulation.kernel_jitter_correlation_s`;
    /// 0: kernels vary independently).
    pub kernel_jitter_correlation_s: f64,
    /// Draw each wait from `seed` (`simulation.kernel_jitter_draws`); false: every wait is the
    /// expected one.
    pub kernel_jitter_draws: bool,
    pub seed: u64,
}

/// The latest time the engine's clock counts: 2^62 ns, about 146 years. A run that would go
/// past it stops with [`RunError::TimeOverflow`] instead of wrapping.
pub const MAX_TIME_NS: u64 = 1 << 62;

/// Why a run stopped without a result.
#[derive(Clone, Debug, PartialEq)]
pub enum RunError {
    /// A task, flow or latency would end after [`MAX_TIME_NS`].
    TimeOverflow,
    /// More events pending at once than the queue can tell apart.
    TooManyEvents,
    /// `NCCL_ALGO`/`NCCL_PROTO` leave a collective of the plan no algorithm: NCCL fails it.
    NcclRefuses(String),
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunError::TimeOverflow => write!(
                f,
                "the simulated iteration would last longer than {:.0} years, beyond the simulator's clock; an op, link or latency is far too slow for this workload (check the device's peak_flops and bandwidths, and seq_len)",
                MAX_TIME_NS as f64 * 1e-9 / (365.25 * 86400.0)
            ),
            RunError::TooManyEvents => {
                write!(
                    f,
                    "more than 2^24 events pending at once; the plan is too large to simulate (use fewer devices or micro-batches)"
                )
            }
            RunError::NcclRefuses(why) => write!(f, "{why}"),
        }
    }
}

impl std::error::Error for RunError {}

/// The host issue model's costs (both empty: no host model).
#[derive(Clone, Debug, Default)]
pub struct HostCosts {
    /// Time the device's host thread spends issuing `Program::ops[i]` (framework dispatch
    /// and kernel launch).
    pub per_op: Vec<u64>,
    /// Time each simulated device's host spends issuing a collective that sits on its compute
    /// stream (the framework's call), by index in `Program::devices`.
    pub per_collective: Vec<u64>,
}

impl HostCosts {
    pub fn is_empty(&self) -> bool {
        self.per_op.is_empty()
    }
}

/// What a run measured, per simulated device (indices as in `Program::devices`).
#[derive(Clone, Debug, Default)]
pub struct RunResult {
    pub iteration_ns: u64,
    pub events: u64,
    pub flows: u64,
    /// Time the compute stream was busy (kernels and blocking collectives).
    pub compute_busy_ns: Vec<u64>,
    /// End of the compute stream's pipeline part (its first `compute_marks` tasks).
    pub pipeline_end_ns: Vec<u64>,
    /// Busy time of the compute stream within its pipeline part.
    pub pipeline_busy_ns: Vec<u64>,
    /// Peak dynamic memory (activations, buffers) of each device, and when.
    pub peak_activations: Vec<f64>,
    pub peak_buffers: Vec<f64>,
    pub peak_time_ns: Vec<u64>,
    /// At each device's peak: the live activation bytes by (memory tag, micro-batch).
    pub peak_live: Vec<Vec<(u32, u32, f64)>>,
    /// Each device's iteration by part (see [`crate::report::breakdown`]); each row adds up
    /// to `iteration_ns`.
    pub time_parts_ns: Vec<[u64; crate::report::breakdown::PARTS]>,
    /// FLOPs of the forward ops the simulated devices ran again (activation recomputation).
    pub recompute_flops: f64,
    /// GPU memory of the NCCL communicators the program's collectives and sends open, per
    /// simulated device (`engine::communicators`).
    pub nccl_buffer_bytes: Vec<f64>,
    pub timeline: Timeline,
}

const TASK_END: u8 = 0;
const FLOW_END: u8 = 1;
const STEP_START: u8 = 2;
/// A compute-stream task whose host issue ends after it became ready starts now.
const ISSUED: u8 = 3;
/// The network's deferred flow changes of this instant are re-rated (once per instant with
/// changes, after the events already due then; see `Network::settle`).
const SETTLE: u8 = 4;
/// An overlapped collective that waited for a persistent compute kernel's SMs launches now.
const SMS_FREE: u8 = 5;
const VERSION_MASK: u32 = 0xff_ffff;

/// An in-flight transfer or collective.
struct Active {
    task: u32,
    /// Collective id, or NONE for a transfer (then `transfer` holds its only flow).
    collective: u32,
    step: u32,
    pending: u32,
}

fn ns(s: f64) -> u64 {
    (s * 1e9).round() as u64
}

struct Engine<'a> {
    p: &'a Program,
    topo: &'a Topology,
    op_ns: &'a [u64],
    host: &'a HostCosts,
    opts: RunOptions,
    q: EventQueue,
    net: Network,
    remaining: Vec<u32>,
    /// Each task's explicit successors.
    succ: Sparse,
    pos: Vec<u32>,
    stream_start: Vec<u64>,
    stream_busy: Vec<u64>,
    marks: Vec<u32>,
    expanded: Vec<Option<Expanded>>,
    active: Vec<Active>,
    free_active: Vec<u32>,
    flow_owner: Vec<u32>,
    flow_start: Vec<u64>,
    flow_meta: Vec<([u32; 2], u32, u32, f64)>,
    changes: Vec<Reschedule>,
    /// Tasks ready to start, each with the task whose end made it ready (or NONE).
    ready: Vec<(u32, u32)>,
    attr: Attribution,
    cur_act: Vec<f64>,
    cur_buf: Vec<f64>,
    /// Live activation bytes per device by (tag, micro-batch).
    live: Vec<std::collections::BTreeMap<(u32, u32), f64>>,
    /// A device's peak was reached and `live` has not changed since: its `peak_live` is copied
    /// from `live` only before the next change that sets no new peak, or at the end (copying
    /// at every new peak is quadratic in the micro-batches under GPipe).
    peak_pending: Vec<bool>,
    /// `live` as of each device's latest settled peak, kept up to date from `dirty` (the keys
    /// changed since), so that settling a peak costs the changes, not the whole map.
    peak_snap: Vec<std::collections::BTreeMap<(u32, u32), f64>>,
    /// Keys of `live` changed since `peak_snap` was last brought up to date; `None` once they
    /// outnumber `live` (the next settle copies `live` whole).
    dirty: Vec<Option<Vec<(u32, u32)>>>,
    res: RunResult,
    flows: u64,
    /// Host issue model: when each simulated device's host thread is next free; the end
    /// time of each task a host waits for (by its index in `gate_source`); and what each
    /// compute-stream task's host waits for (indices into `done_at`).
    host_free: Vec<u64>,
    gate_source: Sparse,
    done_at: Vec<u64>,
    gate: Sparse,
    /// A time went past [`MAX_TIME_NS`].
    overflow: bool,
    /// A SETTLE event is queued for the current instant.
    settle_queued: bool,
    /// SMs that overlapping collectives take from compute kernels.
    sm: Contention,
    /// Each op's kind of kernel on its device class (worked out at its first start).
    op_kernel: Vec<Option<Kernel>>,
    /// Per-kernel variability: each collective waits for its slowest member.
    jitter: Option<super::jitter::Jitter>,
    /// What the overlapped collectives on each device keep of their speed beside the kernel
    /// running there (`hbm`), their live flows by id, and those flows by device.
    mem_share: Vec<f64>,
    shared: Vec<Option<hbm::SharedFlow>>,
    shared_on: Vec<Vec<FlowId>>,
    /// Devices whose share may have changed this instant (applied once, at its settle).
    mem_dirty: Vec<u32>,
}

/// Run a program. `op_ns[i]` is the duration of `Program::ops[i]` on its device.
///
/// `host` (empty: no host model) is the time the device's host thread spends issuing each op
/// and each collective (framework dispatch and kernel launch). A host issues its compute
/// stream's tasks in order and runs ahead of the device, except that it blocks until a pipeline receive
/// (a transfer) or a data-parallel collective the task depends on has completed, as
/// frameworks synchronise there. A task starts when it is ready and its host has issued it,
/// so a stream of short kernels runs at the host's pace.
pub fn run(
    p: &Program,
    topo: &Topology,
    op_ns: &[u64],
    host: &HostCosts,
    opts: RunOptions,
) -> Result<RunResult, RunError> {
    super::collective::nccl_refusal(p, topo).map_or(Ok(()), |why| Err(RunError::NcclRefuses(why)))?;
    let nt = p.tasks.len();
    let mut remaining: Vec<u32> = p.tasks.iter().map(|t| t.streams).collect();
    for &(_, b) in &p.deps {
        remaining[b as usize] += 1;
    }
    let succ = Sparse::new(nt, p.deps.iter().copied());
    let nd = p.devices.len();
    // What a compute-stream task's host waits for: transfers and data-parallel collectives.
    let gating = |&(a, b): &(u32, u32)| {
        let (ta, tb) = (p.tasks[a as usize], p.tasks[b as usize]);
        let blocks = ta.kind == TaskKind::Transfer
            || (ta.kind == TaskKind::Collective && Program::stream_kind(ta.stream) == StreamKind::DataParallel);
        Program::stream_kind(tb.stream) == StreamKind::Compute && blocks
    };
    let host_waits: Vec<(u32, u32)> =
        p.deps.iter().copied().filter(|d| !host.is_empty() && gating(d)).map(|(a, b)| (b, a)).collect();
    // The tasks hosts wait for, numbered in task order.
    let mut sources: Vec<u32> = host_waits.iter().map(|&(_, a)| a).collect();
    sources.sort_unstable();
    sources.dedup();
    let gate_source = Sparse::new(nt, sources.iter().enumerate().map(|(i, &a)| (a, i as u32)));
    let gate = Sparse::new(nt, host_waits.iter().map(|&(b, a)| (b, gate_source.get(a)[0])));
    let mut marks = vec![u32::MAX; p.streams.len()];
    for (d, &m) in p.compute_marks.iter().enumerate() {
        marks[d * STREAMS] = m;
    }
    let mut e = Engine {
        p,
        topo,
        op_ns,
        host,
        opts,
        q: EventQueue::new(),
        net: Network::new(opts.network, topo.capacities()),
        remaining,
        succ,
        pos: vec![0; p.streams.len()],
        stream_start: vec![0; p.streams.len()],
        stream_busy: vec![0; p.streams.len()],
        marks,
        expanded: (0..p.collectives.len()).map(|_| None).collect(),
        active: Vec::new(),
        free_active: Vec::new(),
        flow_owner: Vec::new(),
        flow_start: Vec::new(),
        flow_meta: Vec::new(),
        changes: Vec::new(),
        ready: Vec::new(),
        attr: Attribution::new(p),
        cur_act: vec![0.0; nd],
        cur_buf: vec![0.0; nd],
        live: vec![std::collections::BTreeMap::new(); nd],
        peak_pending: vec![false; nd],
        peak_snap: vec![std::collections::BTreeMap::new(); nd],
        dirty: vec![Some(Vec::new()); nd],
        res: RunResult {
            compute_busy_ns: vec![0; nd],
            pipeline_end_ns: vec![0; nd],
            pipeline_busy_ns: vec![0; nd],
            peak_activations: vec![0.0; nd],
            peak_buffers: vec![0.0; nd],
            peak_time_ns: vec![0; nd],
            peak_live: vec![Vec::new(); nd],
            nccl_buffer_bytes: super::communicators::nccl_buffer_bytes(p, topo),
            ..RunResult::default()
        },
        flows: 0,
        host_free: vec![0; nd],
        done_at: vec![0; sources.len()],
        gate_source,
        gate,
        overflow: false,
        op_kernel: vec![None; p.ops.len()],
        sm: Contention::new(
            p.devices.iter().map(|&d| topo.sms(d)).collect(),
            p.devices.iter().map(|&d| topo.hbm_bytes_per_s(d)).collect(),
        ),
        settle_queued: false,
        jitter: super::jitter::Jitter::new(
            opts.kernel_jitter,
            opts.kernel_jitter_correlation_s,
            opts.kernel_jitter_draws.then_some(opts.seed),
            nd,
        ),
        mem_share: vec![1.0; nd],
        shared: Vec::new(),
        shared_on: vec![Vec::new(); nd],
        mem_dirty: Vec::new(),
    };
    e.res.timeline.devices = p.devices.clone();
    e.res.timeline.stages = p.stages.clone();
    e.res.timeline.labels = p.labels.clone();
    for s in 0..p.streams.len() {
        if let Some(&t) = p.streams[s].first() {
            e.dec(t, NONE);
        }
    }
    e.drain_ready(0);
    while let Some((now, ev)) = e.q.pop() {
        match ev.kind {
            TASK_END => {
                let d = Program::stream_device(p.tasks[ev.id as usize].stream) as usize;
                if e.sm.end(d, ev.version, VERSION_MASK) {
                    // A kernel counts towards its device's stretch once it has ended
                    // (`engine::jitter`): a collective that starts beside it did not wait for it.
                    let task = p.tasks[ev.id as usize];
                    if task.kind == TaskKind::Compute && e.jitter.is_some() {
                        let memory_bound = e.kernel(d, task.payload as usize).memory_bound;
                        let ns = e.op_ns[task.payload as usize];
                        e.jitter.as_mut().expect("checked").kernel_done(d, ns, memory_bound);
                    }
                    e.refresh_memory_share(d, now);
                    e.complete(ev.id, now)
                }
            }
            FLOW_END => e.flow_end(ev.id, ev.version, now),
            STEP_START => e.step_start(ev.id, now),
            ISSUED => e.begin(ev.id, now),
            SMS_FREE => e.launch(ev.id, now),
            SETTLE => {
                e.settle_queued = false;
                e.apply_memory_shares(now);
                e.net.settle(now);
                e.push_changes();
            }
            _ => unreachable!("unknown event kind"),
        }
        e.drain_ready(now);
        if e.overflow {
            return Err(RunError::TimeOverflow);
        }
        if e.q.overflowed() {
            return Err(RunError::TooManyEvents);
        }
    }
    if e.overflow {
        return Err(RunError::TimeOverflow);
    }
    for d in 0..nd {
        e.settle_peak(d);
        e.res.peak_live[d] = e.peak_snap[d].iter().map(|(&(tag, mb), &b)| (tag, mb, b)).collect();
    }
    let unfinished = e.pos.iter().zip(&p.streams).filter(|(pos, s)| (**pos as usize) < s.len()).count();
    assert_eq!(unfinished, 0, "deadlock: {unfinished} streams did not finish (a lowering bug)");
    e.res.events = e.q.processed();
    e.res.flows = e.flows;
    for d in 0..nd {
        e.res.compute_busy_ns[d] = e.stream_busy[d * STREAMS];
    }
    e.res.timeline.iteration_ns = e.res.iteration_ns;
    e.res.timeline.stream_busy_ns = e.stream_busy.clone();
    (e.res.time_parts_ns, e.res.recompute_flops) = e.attr.finish(p, e.res.iteration_ns);
    Ok(e.res)
}

impl<'a> Engine<'a> {
    /// `now + d`, or (past [`MAX_TIME_NS`]) the clock's end with the run marked overflowed.
    fn after(&mut self, now: u64, d: u64) -> u64 {
        match now.checked_add(d) {
            Some(t) if t <= MAX_TIME_NS => t,
            _ => {
                self.overflow = true;
                MAX_TIME_NS
            }
        }
    }

    /// One of `t`'s dependencies (`by`, or NONE at the start) is done.
    fn dec(&mut self, t: u32, by: u32) {
        let r = &mut self.remaining[t as usize];
        *r -= 1;
        if *r == 0 {
            self.ready.push((t, by));
        }
    }

    fn drain_ready(&mut self, now: u64) {
        while let Some((t, by)) = self.ready.pop() {
            let task = &self.p.tasks[t as usize];
            if Program::stream_kind(task.stream) == StreamKind::Compute {
                if task.streams == 1 {
                    self.attr.ready(self.p, t, by, Program::stream_device(task.stream) as usize, now);
                } else {
                    self.for_streams(t, |e, s| e.attr.ready(e.p, t, by, Program::stream_device(s) as usize, now));
                }
            } else if task.kind == TaskKind::Collective
                && matches!(Program::stream_kind(task.stream), StreamKind::DataParallel | StreamKind::Gather)
            {
                self.attr.collective_ready(t, by, now);
            }
            self.start(t, now);
        }
    }

    /// Streams a task sits on.
    fn for_streams(&mut self, t: u32, mut f: impl FnMut(&mut Self, u32)) {
        let task = self.p.tasks[t as usize];
        if task.streams == 1 {
            f(self, task.stream);
            return;
        }
        let kind = task.stream % STREAMS as u32;
        self.ensure_expanded(task.payload);
        let n = self.expanded[task.payload as usize].as_ref().map_or(0, |x| x.members.len());
        for i in 0..n {
            let d = self.expanded[task.payload as usize].as_ref().expect("expanded").members[i];
            f(self, d * STREAMS as u32 + kind);
        }
    }

    /// A task is ready: start it once the hosts of its compute streams have issued it.
    fn start(&mut self, t: u32, now: u64) {
        if !self.host.is_empty() {
            let issued = self.issue(t);
            if issued > now {
                self.q.push(issued, Event { kind: ISSUED, id: t, version: 0 });
                return;
            }
        }
        self.begin(t, now);
    }

    /// When the hosts of the task's compute streams finish issuing it (0 if none issues it).
    fn issue(&mut self, t: u32) -> u64 {
        let task = self.p.tasks[t as usize];
        if Program::stream_kind(task.stream) != StreamKind::Compute {
            return 0;
        }
        let op_cost = match task.kind {
            TaskKind::Compute => Some(self.host.per_op[task.payload as usize]),
            _ => None,
        };
        let mut gate = 0;
        for &i in self.gate.get(t) {
            gate = gate.max(self.done_at[i as usize]);
        }
        let mut issued = 0;
        self.for_streams(t, |e, s| {
            let d = Program::stream_device(s) as usize;
            let cost = op_cost.unwrap_or_else(|| e.host.per_collective.get(d).copied().unwrap_or(0));
            let end = e.after(e.host_free[d].max(gate), cost);
            e.host_free[d] = end;
            issued = issued.max(end);
        });
        issued
    }

    fn begin(&mut self, t: u32, now: u64) {
        self.for_streams(t, |e, s| {
            e.stream_start[s as usize] = now;
            if Program::stream_kind(s) == StreamKind::Compute {
                e.attr.begin(Program::stream_device(s) as usize, now);
            }
        });
        self.memory(t, false, now);
        let task = self.p.tasks[t as usize];
        match task.kind {
            TaskKind::Compute => {
                let d = Program::stream_device(task.stream) as usize;
                let kernel = self.kernel(d, task.payload as usize);
                let (ns, version) = self.sm.start(d, t, now, self.op_ns[task.payload as usize], kernel);
                let end = self.after(now, ns);
                self.q.push(end, Event { kind: TASK_END, id: t, version: version & VERSION_MASK });
                self.refresh_memory_share(d, now);
            }
            TaskKind::Transfer | TaskKind::Collective | TaskKind::HostCopy => {
                let free = self.sms_free_at(t, now);
                if free > now {
                    self.q.push(free, Event { kind: SMS_FREE, id: t, version: 0 });
                } else {
                    self.launch(t, now);
                }
            }
        }
    }

    /// What collectives beside op `op` on device `d` do to it (`Contention`): memory-bound or
    /// not, persistent or not, and a GEMM's tiles (worked out once per op: an op belongs to
    /// one device class).
    fn kernel(&mut self, d: usize, op: usize) -> Kernel {
        if let Some(k) = self.op_kernel[op] {
            return k;
        }
        use crate::workload::OpClass;
        let dev = self.p.devices[d];
        let kinds = self.topo.persistent(dev);
        let k = match self.p.ops[op].spec.class {
            OpClass::Memory | OpClass::Copies { .. } => {
                let family = crate::cost::memory_kernel(self.p.ops[op].spec.name);
                let memory_efficiency = crate::hardware::kernels::memory_kernel_efficiency(self.topo.arch(dev), family);
                Kernel { memory_bound: true, memory_efficiency, ..Kernel::default() }
            }
            OpClass::Gemm { batch, m, n, .. } => {
                let units = f64::from(self.topo.sms(dev));
                let tiles =
                    if units > 0.0 { crate::cost::gemm_tiles(self.topo.arch(dev), units, batch, m, n) } else { 0.0 };
                Kernel { persistent: kinds.gemm, tiles, ..Kernel::default() }
            }
            OpClass::Attention { kernel, .. } => Kernel { persistent: kinds.attention(kernel), ..Kernel::default() },
        };
        self.op_kernel[op] = Some(k);
        k
    }

    /// When every member of an overlapped collective (one that holds SMs beside compute, see
    /// `hold_sms`) has an SM for its kernel: the end of the latest persistent compute kernel
    /// running on a member's device, else `now`. A kernel that starts in the same instant
    /// does not block it (the collective, ready as early, is taken as dispatched first).
    fn sms_free_at(&mut self, t: u32, now: u64) -> u64 {
        let task = self.p.tasks[t as usize];
        if task.kind != TaskKind::Collective || !Self::overlapped(task.stream) {
            return now;
        }
        let mut free = now;
        self.for_streams(t, |e, s| free = free.max(e.sm.busy_until(Program::stream_device(s) as usize, now)));
        free
    }

    /// Whether a collective on `stream` overlaps the compute stream beside it, holding SMs
    /// there (data-parallel reductions, ZeRO gathers, tensor-parallel asynchronous backward).
    fn overlapped(stream: u32) -> bool {
        matches!(Program::stream_kind(stream), StreamKind::DataParallel | StreamKind::Gather | StreamKind::TensorAsync)
    }

    /// A transfer, host copy or collective whose kernels have their SMs starts moving data.
    fn launch(&mut self, t: u32, now: u64) {
        let task = self.p.tasks[t as usize];
        debug_assert!(task.kind != TaskKind::Compute, "compute tasks start in begin");
        let collective = if task.kind == TaskKind::Collective { task.payload } else { NONE };
        if collective != NONE {
            self.ensure_expanded(collective);
            self.hold_sms(t, true, now);
            if self.expanded[collective as usize].as_ref().expect("expanded").steps.is_empty() {
                self.complete(t, now);
                return;
            }
        }
        let a = Active { task: t, collective, step: 0, pending: 0 };
        let slot = super::claim_slot(&mut self.active, &mut self.free_active, a);
        let mut lat = self.step_latency(slot);
        if collective != NONE && self.jitter.is_some() {
            let members = self.p.collectives[collective as usize].members.len();
            let mut streams = Vec::new();
            self.for_streams(t, |_, s| streams.push(s));
            let j = self.jitter.as_mut().expect("checked");
            lat = lat.saturating_add(j.wait_ns(streams.into_iter(), members));
        }
        // Each of a task's back-to-back calls (`Collective::calls`) launches its kernel.
        let calls = if collective != NONE { self.p.collectives[collective as usize].calls.max(1) } else { 1 };
        let launch = self.opts.collective_launch_ns.saturating_mul(calls);
        let at = self.after(now, launch.saturating_add(lat));
        self.q.push(at, Event { kind: STEP_START, id: slot, version: 0 });
    }

    /// Route of a transfer or host copy task.
    fn single_route(&self, task: u32) -> (crate::hardware::Route, u32, u32, f64) {
        let t = self.p.tasks[task as usize];
        if t.kind == TaskKind::HostCopy {
            let c = self.p.host_copies[t.payload as usize];
            let r = self.topo.host_route(c.device, c.to_device, c.nvme);
            (r, c.device, c.device, c.bytes)
        } else {
            let tr = self.p.transfers[t.payload as usize];
            (self.topo.route(tr.source, tr.target), tr.source, tr.target, tr.bytes)
        }
    }

    fn step_latency(&self, slot: u32) -> u64 {
        let a = &self.active[slot as usize];
        if a.collective == NONE {
            ns(self.single_route(a.task).0.latency_s)
        } else {
            self.expanded[a.collective as usize].as_ref().expect("expanded").steps[a.step as usize].latency_ns
        }
    }

    fn ensure_expanded(&mut self, c: u32) {
        if self.expanded[c as usize].is_none() {
            self.expanded[c as usize] = Some(Expanded::new(&self.p.collectives[c as usize], self.p, self.topo));
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn add_flow(
        &mut self,
        slot: u32,
        links: [u32; 2],
        len: u8,
        bytes: f64,
        cap: f64,
        source: u32,
        target: u32,
        now: u64,
    ) {
        let id = self.net.add_deferred(now, &links[..len as usize], bytes, cap) as usize;
        let c = self.active[slot as usize].collective;
        if c != NONE && Self::overlapped(self.p.tasks[self.active[slot as usize].task as usize].stream) {
            self.share_flow(id as FlowId, &links[..len as usize], cap, source, target, now);
        }
        self.queue_settle(now);
        if self.flow_owner.len() <= id {
            self.flow_owner.resize(id + 1, NONE);
            self.flow_start.resize(id + 1, 0);
            self.flow_meta.resize(id + 1, ([0, 0], 0, 0, 0.0));
        }
        self.flow_owner[id] = slot;
        self.flow_start[id] = now;
        self.flow_meta[id] = (links, source, target, bytes);
        self.flows += 1;
        self.active[slot as usize].pending += 1;
    }

    /// Settle the network's deferred changes at `now`, after the events already due then.
    fn queue_settle(&mut self, now: u64) {
        if !self.settle_queued && (self.net.unsettled() || !self.mem_dirty.is_empty()) {
            self.settle_queued = true;
            self.q.push(now, Event { kind: SETTLE, id: 0, version: 0 });
        }
    }

    fn push_changes(&mut self) {
        self.net.drain_changes(&mut self.changes);
        for i in 0..self.changes.len() {
            let c = self.changes[i];
            let at = self.after(c.finish_ns, 0);
            self.q.push(at, Event { kind: FLOW_END, id: c.id, version: c.version & VERSION_MASK });
        }
        self.changes.clear();
    }

    fn step_start(&mut self, slot: u32, now: u64) {
        let a = &self.active[slot as usize];
        if a.collective == NONE {
            let (r, source, target, bytes) = self.single_route(a.task);
            // Between two devices of a mesh node only their own link carries the transfer.
            let cap = self.topo.pair_cap(source, target);
            self.add_flow(slot, r.links, r.len, bytes, cap, source, target, now);
        } else {
            let (c, step) = (a.collective as usize, a.step as usize);
            let n = self.expanded[c].as_ref().expect("expanded").steps[step].flows.len();
            for i in 0..n {
                let (links, bytes, s, t, cap) = self.expanded[c].as_ref().expect("expanded").steps[step].flows[i];
                self.add_flow(slot, links, 2, bytes, cap, s, t, now);
            }
        }
        if self.active[slot as usize].pending == 0 {
            self.step_done(slot, now);
        }
        self.push_changes();
    }

    fn flow_end(&mut self, id: FlowId, version: u32, now: u64) {
        if !self.net.is_live(id) || self.net.version(id) & VERSION_MASK != version {
            return;
        }
        if let Some(at) = self.net.due(id, now) {
            let at = self.after(at, 0);
            self.q.push(at, Event { kind: FLOW_END, id, version });
            return;
        }
        if self.opts.record {
            let (links, source, target, bytes) = self.flow_meta[id as usize];
            self.res.timeline.flows.push(FlowSpan {
                links,
                source,
                target,
                start_ns: self.flow_start[id as usize],
                end_ns: now,
                bytes,
            });
        }
        self.net.remove_deferred(id);
        self.unshare_flow(id);
        self.queue_settle(now);
        let slot = self.flow_owner[id as usize];
        let a = &mut self.active[slot as usize];
        a.pending -= 1;
        if a.pending == 0 {
            self.step_done(slot, now);
        }
    }

    fn step_done(&mut self, slot: u32, now: u64) {
        let a = &mut self.active[slot as usize];
        a.step += 1;
        let more = a.collective != NONE
            && (a.step as usize) < self.expanded[a.collective as usize].as_ref().expect("expanded").steps.len();
        if more {
            let lat = self.step_latency(slot);
            let at = self.after(now, lat);
            self.q.push(at, Event { kind: STEP_START, id: slot, version: 0 });
        } else {
            let t = a.task;
            self.free_active.push(slot);
            self.complete(t, now);
        }
    }

    /// Collective `t`'s kernel takes its SMs on its members (`hold`) or gives them back;
    /// the compute kernels running there are rescheduled. Only collectives that overlap
    /// compute count: data-parallel reductions, ZeRO gathers and the tensor-parallel NCCL
    /// collectives beside a column-parallel layer's backward GEMMs.
    fn hold_sms(&mut self, t: u32, hold: bool, now: u64) {
        let task = self.p.tasks[t as usize];
        if !Self::overlapped(task.stream) {
            return;
        }
        let Some(comm) = self.expanded[task.payload as usize].as_ref().map(|x| Comm {
            sms: x.sms,
            threads: x.threads,
            hbm: x.hbm_bytes_per_s,
            dma: x.dma_bytes_per_s,
        }) else {
            return;
        };
        if comm.sms == 0 {
            return;
        }
        self.for_streams(t, |e, s| {
            let d = Program::stream_device(s) as usize;
            if let Some((kernel, left, version)) = e.sm.change(d, comm, hold, now) {
                let end = e.after(now, left);
                e.q.push(end, Event { kind: TASK_END, id: kernel, version: version & VERSION_MASK });
            }
            e.refresh_memory_share(d, now);
        });
    }

    fn complete(&mut self, t: u32, now: u64) {
        if let Some(&i) = self.gate_source.get(t).first() {
            self.done_at[i as usize] = now;
        }
        self.memory(t, true, now);
        let task = self.p.tasks[t as usize];
        if task.kind == TaskKind::Collective {
            self.hold_sms(t, false, now);
        }
        let record = self.opts.record;
        let on_compute = Program::stream_kind(task.stream) == StreamKind::Compute;
        let part = if on_compute { self.attr.busy_part(&task) } else { crate::report::breakdown::Part::Other };
        if on_compute {
            self.attr.kernel_done(&task, part);
        }
        self.for_streams(t, |e, s| {
            let su = s as usize;
            let begun = e.stream_start[su];
            e.stream_busy[su] += now - begun;
            if on_compute {
                e.attr.busy(Program::stream_device(s) as usize, part, begun, now);
            } else {
                e.attr.ended(su, begun, now);
            }
            if record {
                e.res.timeline.spans.push(Span {
                    device: e.p.devices[Program::stream_device(s) as usize],
                    stream: Program::stream_kind(s),
                    start_ns: begun,
                    end_ns: now,
                    label: task.label,
                    micro_batch: task.micro_batch,
                });
            }
            e.pos[su] += 1;
            let pos = e.pos[su];
            if pos == e.marks[su] {
                let d = Program::stream_device(s) as usize;
                e.res.pipeline_end_ns[d] = now;
                e.res.pipeline_busy_ns[d] = e.stream_busy[su];
            }
            if let Some(&next) = e.p.streams[su].get(pos as usize) {
                e.dec(next, t);
            }
        });
        for i in self.succ.range(t) {
            let s = self.succ.targets[i];
            self.attr.produced(self.p, s, now);
            self.dec(s, t);
        }
        self.res.iteration_ns = self.res.iteration_ns.max(now);
    }
}
