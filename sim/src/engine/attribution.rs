//! Where each device's compute stream spends the iteration: busy time by the task's part,
//! and every idle stretch charged to what ended it (see [`crate::report::breakdown`]).
//!
//! The engine tells it when a compute-stream task becomes ready (and which task's completion
//! made it so), when the task begins (after its host issued it), when it ends, and when a
//! transfer's producer finishes. Per device, the parts add up to the iteration exactly.

use crate::lower::{NONE, Program, STREAMS, Task, TaskKind};
use crate::report::breakdown::{PARTS, Part, blocking_comm_part, kernel_part};
use crate::report::timeline::StreamKind;

pub(super) struct Attribution {
    /// Per label: the part of a kernel with it (`None`: GEMM or bandwidth-bound by cost
    /// class), and of a collective on the compute stream.
    kernel: Vec<Option<Part>>,
    comm: Vec<Part>,
    /// Per op instance: GEMM or bandwidth-bound, by cost class.
    op_class: Vec<Part>,
    /// Per simulated device: the compute stream's time is accounted for up to here.
    idle_from: Vec<u64>,
    /// Per transfer: when its producers finished (the data was ready to send).
    transfer_ready: Vec<u64>,
    /// One bit per task: it is a transfer off the compute streams (a bitset stays in cache
    /// where the tasks do not).
    is_transfer: Vec<u64>,
    /// Per stream: its last busy stretch (tasks back to back), start and end.
    run_start: Vec<u64>,
    stream_end: Vec<u64>,
    pub parts: Vec<[u64; PARTS]>,
    /// Per op instance: how many times it ran as recomputation.
    recomputed: Vec<u32>,
    /// Per data-parallel collective (off the compute stream) that waited for a dependency:
    /// when it became ready and the task whose end made it so.
    dp_ready: std::collections::HashMap<u32, (u64, u32)>,
}

impl Attribution {
    pub fn new(p: &Program) -> Self {
        let nd = p.devices.len();
        Attribution {
            kernel: p.labels.iter().map(kernel_part).collect(),
            comm: p.labels.iter().map(blocking_comm_part).collect(),
            op_class: p
                .ops
                .iter()
                .map(|o| match o.spec.class {
                    crate::workload::OpClass::Gemm { .. } => Part::Gemm,
                    crate::workload::OpClass::Attention { .. } => Part::Attention,
                    crate::workload::OpClass::Memory | crate::workload::OpClass::Copies { .. } => Part::MemoryBound,
                })
                .collect(),
            idle_from: vec![0; nd],
            transfer_ready: vec![0; p.transfers.len()],
            is_transfer: {
                // Transfers sit on the streams that overlap with compute, far fewer tasks
                // than the compute streams hold.
                let mut bits = vec![0u64; p.tasks.len().div_ceil(64)];
                let others = p.streams.iter().enumerate().filter(|(s, _)| s % STREAMS != StreamKind::Compute.index());
                for &i in others.flat_map(|(_, tasks)| tasks) {
                    if p.tasks[i as usize].kind == TaskKind::Transfer {
                        bits[i as usize / 64] |= 1 << (i % 64);
                    }
                }
                bits
            },
            run_start: vec![0; p.streams.len()],
            stream_end: vec![0; p.streams.len()],
            parts: vec![[0; PARTS]; nd],
            recomputed: vec![0; p.ops.len()],
            dp_ready: std::collections::HashMap::new(),
        }
    }

    /// Data-parallel collective `t` (off the compute stream) became ready at `now` when `by`
    /// ended.
    #[inline]
    pub fn collective_ready(&mut self, t: u32, by: u32, now: u64) {
        if by != NONE && now > 0 {
            self.dp_ready.insert(t, (now, by));
        }
    }

    /// What a compute-stream task counts as while it runs.
    #[inline]
    pub fn busy_part(&self, task: &Task) -> Part {
        match task.kind {
            TaskKind::Compute => self.kernel[task.label as usize].unwrap_or(self.op_class[task.payload as usize]),
            TaskKind::Collective => self.comm[task.label as usize],
            TaskKind::Transfer => Part::PpComm,
            TaskKind::HostCopy => Part::Offload,
        }
    }

    /// Task `t` on device `d`'s compute stream became ready at `now` when `cause` ended: the
    /// stretch since the stream's last accounted time goes to what `cause` is.
    #[inline]
    pub fn ready(&mut self, p: &Program, t: u32, cause: u32, d: usize, now: u64) {
        let from = self.idle_from[d];
        if now > from {
            self.idle_from[d] = now;
            self.charge_wait(p, t, cause, d, from, now);
        }
    }

    /// Charge device `d`'s idle stretch `from..now` to what `cause` is. A data-parallel
    /// collective dispatched only once another task ended hands the stretch before its
    /// dispatch to that task, which may be such a collective in turn: the chain is followed in
    /// a loop (a schedule of a thousand micro-batches chains as many), each link taking the
    /// earlier part of the stretch, and at most once per task (a cycle ends in `DpComm`).
    fn charge_wait(&mut self, p: &Program, t: u32, cause: u32, d: usize, from: u64, now: u64) {
        let (mut cause, mut now) = (cause, now);
        for _ in 0..=p.tasks.len() {
            if cause == NONE {
                self.parts[d][Part::Other as usize] += now - from;
                return;
            }
            let c = &p.tasks[cause as usize];
            let part = match (c.kind, Program::stream_kind(c.stream)) {
                (TaskKind::Transfer, _) => {
                    // Until the sender's data was ready the stage waited for another stage's
                    // compute; from then on, for the transfer.
                    let sent = self.transfer_ready[c.payload as usize].clamp(from, now);
                    self.parts[d][Part::Bubble as usize] += sent - from;
                    self.parts[d][Part::PpComm as usize] += now - sent;
                    return;
                }
                (TaskKind::HostCopy, _) => Part::Offload,
                (
                    TaskKind::Collective,
                    StreamKind::Compute
                    | StreamKind::TensorParallel
                    | StreamKind::TensorAsync
                    | StreamKind::ExpertParallel,
                ) => self.comm[c.label as usize],
                (TaskKind::Collective, _) => {
                    // A data-parallel collective that was dispatched only once something else
                    // ended (Megatron-Core's gather of a stage's update, dispatched when the
                    // stage's input arrives): until then the device waited for that; from then
                    // on, for the collective.
                    let ready = self.dp_ready.get(&cause).copied();
                    if let Some((ready, by)) = ready.filter(|&(r, by)| r > from && by != cause) {
                        let ready = ready.min(now);
                        self.parts[d][Part::DpComm as usize] += now - ready;
                        (cause, now) = (by, ready);
                        continue;
                    }
                    Part::DpComm
                }
                // A collective waiting for its other members to arrive.
                (TaskKind::Compute, _) if p.tasks[t as usize].kind == TaskKind::Collective => {
                    self.comm[p.tasks[t as usize].label as usize]
                }
                (TaskKind::Compute, _) => Part::Other,
            };
            self.parts[d][part as usize] += now - from;
            return;
        }
        self.parts[d][Part::DpComm as usize] += now - from;
    }

    /// The task at the head of device `d`'s compute stream begins at `now`: any time since
    /// it became ready, its host was still issuing it.
    #[inline]
    pub fn begin(&mut self, d: usize, now: u64) {
        let from = self.idle_from[d];
        if now > from {
            self.parts[d][Part::Host as usize] += now - from;
        }
        self.idle_from[d] = now;
    }

    /// A compute-stream task of part `part` ran on device `d` from `begun` to `now`.
    /// Kernel `task` (on the compute stream, of part `part`) ended.
    #[inline]
    pub fn kernel_done(&mut self, task: &Task, part: Part) {
        if part == Part::Recompute && task.kind == TaskKind::Compute {
            self.recomputed[task.payload as usize] += 1;
        }
    }

    #[inline]
    pub fn busy(&mut self, d: usize, part: Part, begun: u64, now: u64) {
        self.parts[d][part as usize] += now - begun;
        self.idle_from[d] = now;
    }

    /// A task on stream `s` ran from `begun` to `now`.
    #[inline]
    pub fn ended(&mut self, s: usize, begun: u64, now: u64) {
        if begun > self.stream_end[s] {
            self.run_start[s] = begun;
        }
        self.stream_end[s] = now;
    }

    /// Task `succ`'s dependency ended at `now`: a transfer's data is ready once all did.
    #[inline]
    pub fn produced(&mut self, p: &Program, succ: u32, now: u64) {
        if self.is_transfer[succ as usize / 64] & (1 << (succ % 64)) != 0 {
            let r = &mut self.transfer_ready[p.tasks[succ as usize].payload as usize];
            *r = (*r).max(now);
        }
    }

    /// Close the iteration at `end`. After its compute stream's last task a device waits for
    /// its own other streams' last busy stretches (where several run, the one that ends last
    /// is charged), then for the other devices ([`Part::Tail`]).
    pub fn finish(mut self, p: &Program, end: u64) -> (Vec<[u64; PARTS]>, f64) {
        for d in 0..self.parts.len() {
            let from = self.idle_from[d].min(end);
            // (start, end, part) of each other stream's last stretch after `from`.
            let runs: Vec<(u64, u64, Part)> = (1..STREAMS)
                .map(|k| (self.run_start[d * STREAMS + k].max(from), self.stream_end[d * STREAMS + k].min(end), k))
                .filter(|&(a, b, _)| b > a)
                .map(|(a, b, k)| {
                    let part = match StreamKind::ALL[k] {
                        StreamKind::PipelineSend => Part::PpComm,
                        StreamKind::HostCopy => Part::Offload,
                        StreamKind::TensorParallel | StreamKind::TensorAsync => Part::TpComm,
                        StreamKind::ExpertParallel => Part::EpComm,
                        _ => Part::DpComm,
                    };
                    (a, b, part)
                })
                .collect();
            let mut cuts: Vec<u64> = runs.iter().flat_map(|&(a, b, _)| [a, b]).chain([from, end]).collect();
            cuts.sort_unstable();
            cuts.dedup();
            for w in cuts.windows(2) {
                let part = runs
                    .iter()
                    .filter(|&&(a, b, _)| a <= w[0] && b >= w[1])
                    .max_by_key(|&&(_, b, part)| (b, std::cmp::Reverse(part)))
                    .map_or(Part::Tail, |r| r.2);
                self.parts[d][part as usize] += w[1] - w[0];
            }
            debug_assert_eq!(self.parts[d].iter().sum::<u64>(), end, "device {d}'s parts add up to the iteration");
        }
        let recomputed = self.recomputed.iter().zip(&p.ops).map(|(&n, o)| n as f64 * o.spec.forward_flops).sum();
        (self.parts, recomputed)
    }
}
