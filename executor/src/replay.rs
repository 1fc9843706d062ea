//! Replay: run a Program's tasks on real devices, stream by stream, and time them.
//!
//! Every stream of every simulated device gets a thread, so streams overlap as CUDA streams
//! do: a task starts when it heads its stream and the tasks it depends on are done. Compute
//! tasks run the op's kernel on the device at its real shapes; transfers and collectives move
//! their bytes for real (on the CPU, memory copies between the devices' threads, each member
//! of a collective copying what a ring would send it); host copies go through the device.
//! The whole program runs `warmup + repeats` times; the result keeps every repeat's time and
//! per-op durations, and the spans of the last repeat in the simulator's timeline schema.

use crate::{Backend, Device, ExecError, OpContext, Result};
use sim::lower::{CollectiveKind, Program, STREAMS, TaskKind};
use sim::report::timeline::{Span, Timeline};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug)]
pub struct ReplayOptions {
    pub warmup: u32,
    pub repeats: u32,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions { warmup: 1, repeats: 3 }
    }
}

/// Measured durations of one op instance (index into `Program::ops`).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct OpTimes {
    pub op: u32,
    pub samples_s: Vec<f64>,
}

/// What a replay measured.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Measured {
    /// Wall time of each measured repeat of the whole program.
    pub iterations_s: Vec<f64>,
    /// Per op instance, the device-measured times of all its tasks in measured repeats.
    pub ops: Vec<OpTimes>,
    /// The last repeat's spans (simulator schema).
    pub timeline: Timeline,
    /// Devices that ran at once: "concurrent", or each device "alone" one after another.
    pub mode: String,
}

impl Measured {
    pub fn iteration_s(&self) -> f64 {
        median(&self.iterations_s)
    }
}

pub fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 { s[n / 2] } else { 0.5 * (s[n / 2 - 1] + s[n / 2]) }
}

/// Shared state of one run.
struct Shared {
    done: Vec<AtomicU32>,
    lock: Mutex<HashMap<u32, (u32, u32)>>,
    cv: Condvar,
    preds: Vec<Vec<u32>>,
    failed: Mutex<Option<String>>,
}

impl Shared {
    fn is_done(&self, t: u32, round: u32) -> bool {
        self.done[t as usize].load(Ordering::Acquire) == round
    }

    /// Block until `ready` holds (checked under the lock), or another thread failed.
    fn wait_until(&self, mut ready: impl FnMut(&mut HashMap<u32, (u32, u32)>) -> bool) -> Result<()> {
        let poisoned = || ExecError("replay lock poisoned".into());
        let mut guard = self.lock.lock().map_err(|_| poisoned())?;
        loop {
            if ready(&mut guard) {
                return Ok(());
            }
            if let Some(e) = self.failed.lock().ok().and_then(|f| f.clone()) {
                return Err(ExecError(e));
            }
            guard = self.cv.wait_timeout(guard, Duration::from_millis(50)).map_err(|_| poisoned())?.0;
        }
    }

    fn wait_preds(&self, t: u32, round: u32) -> Result<()> {
        self.wait_until(|_| self.preds[t as usize].iter().all(|&p| self.is_done(p, round)))
    }

    /// Wait until task `t` itself is done.
    fn wait_preds_done(&self, t: u32, round: u32) -> Result<()> {
        self.wait_until(|_| self.is_done(t, round))
    }

    fn finish(&self, t: u32, round: u32) {
        let _g = self.lock.lock();
        self.done[t as usize].store(round, Ordering::Release);
        self.cv.notify_all();
    }

    /// Meet the other `members` at task `t`; returns when all have arrived. `phase` 0 is the
    /// start barrier, 1 the end of the work, 2 the end times taken.
    fn rendezvous(&self, t: u32, round: u32, members: u32, phase: u32) -> Result<()> {
        let key = t * 3 + phase;
        let mut arrived = false;
        self.wait_until(|arrivals| {
            if !arrived {
                arrived = true;
                let entry = arrivals.entry(key).or_insert((round, 0));
                if entry.0 != round {
                    *entry = (round, 0);
                }
                entry.1 += 1;
                self.cv.notify_all();
            }
            let e = arrivals.get(&key).copied().unwrap_or((round, 0));
            e.0 != round || e.1 >= members
        })
    }

    fn fail(&self, e: &ExecError) {
        if let Ok(mut f) = self.failed.lock() {
            f.get_or_insert_with(|| e.0.clone());
        }
        self.cv.notify_all();
    }
}

/// Bytes one member of a collective sends (and so copies) for a buffer of `bytes`.
fn ring_bytes(kind: CollectiveKind, bytes: f64, members: usize) -> f64 {
    let p = members as f64;
    match kind {
        CollectiveKind::AllReduce => 2.0 * (p - 1.0) / p * bytes,
        // All-to-all: the blocks for the p - 1 others; the rest: a ring's p - 1 steps of n/p.
        CollectiveKind::AllToAll
        | CollectiveKind::AllGather
        | CollectiveKind::ReduceScatter
        | CollectiveKind::Broadcast
        | CollectiveKind::Reduce => (p - 1.0) / p * bytes,
    }
}

/// A memory copy of `bytes` through `buf` (grown as needed, capped at 256 MiB: bigger copies
/// repeat the capped one).
fn memcpy(buf: &mut Vec<u8>, bytes: f64) {
    const CAP: usize = 256 << 20;
    let mut left = bytes.max(0.0) as usize;
    while left > 0 {
        let n = left.min(CAP);
        if buf.len() < 2 * n {
            buf.resize(2 * n, 1);
        }
        let (a, b) = buf.split_at_mut(n);
        b[..n].copy_from_slice(a);
        left -= n;
    }
}

/// Simulated members of a collective task, as device indices of the program.
fn members(p: &Program, collective: u32) -> Vec<u32> {
    p.collectives[collective as usize]
        .members
        .iter()
        .filter_map(|&d| {
            let m = p.mirror[d as usize];
            (m != sim::lower::NONE && p.devices[m as usize] == d).then_some(m)
        })
        .collect()
}

/// Replay `p` on `backend`. `ctx` gives the shapes ops need besides their specs.
pub fn replay(p: &Program, backend: &dyn Backend, ctx: OpContext, opts: ReplayOptions) -> Result<Measured> {
    let nd = p.devices.len();
    if backend.device_count() >= nd {
        let devices: Vec<Box<dyn Device>> = (0..nd).map(|i| backend.open(i)).collect::<Result<_>>()?;
        run(p, devices, None, ctx, opts, "concurrent")
    } else {
        // Not enough devices: each device's work alone on device 0, one after another.
        if backend.device_count() == 0 {
            backend.open(0)?;
        }
        let mut merged = Measured { mode: "alone".into(), ..Measured::default() };
        let mut per_device: Vec<Vec<f64>> = Vec::new();
        for d in 0..nd {
            let dev = backend.open(0)?;
            let m = run(p, vec![dev], Some(d), ctx, opts, "alone")?;
            per_device.push(m.iterations_s.clone());
            merge_ops(&mut merged.ops, &m.ops);
            merged.timeline.spans.extend(m.timeline.spans);
        }
        // No end-to-end time exists without the devices running together; report the
        // busiest device's time, and say so through `mode`.
        let reps = per_device.first().map_or(0, Vec::len);
        merged.iterations_s = (0..reps).map(|i| per_device.iter().map(|v| v[i]).fold(0.0, f64::max)).collect();
        merged.timeline.devices = p.devices.clone();
        merged.timeline.stages = p.stages.clone();
        merged.timeline.labels = p.labels.clone();
        Ok(merged)
    }
}

fn merge_ops(into: &mut Vec<OpTimes>, from: &[OpTimes]) {
    if into.len() < from.len() {
        into.resize(from.len(), OpTimes::default());
    }
    for (i, o) in from.iter().enumerate() {
        into[i].op = o.op;
        into[i].samples_s.extend_from_slice(&o.samples_s);
    }
}

/// Run all of `p` (or, with `only`, one device's streams with others' work treated as done)
/// on `devices` (device i of the program on devices[i], or devices[0] for `only`).
fn run(
    p: &Program,
    devices: Vec<Box<dyn Device>>,
    only: Option<usize>,
    ctx: OpContext,
    opts: ReplayOptions,
    mode: &str,
) -> Result<Measured> {
    let nt = p.tasks.len();
    let mut preds = vec![Vec::new(); nt];
    for &(a, b) in &p.deps {
        preds[b as usize].push(a);
    }
    let shared = Arc::new(Shared {
        done: (0..nt).map(|_| AtomicU32::new(0)).collect(),
        lock: Mutex::new(HashMap::new()),
        cv: Condvar::new(),
        preds,
        failed: Mutex::new(None),
    });
    let op_samples: Arc<Mutex<Vec<Vec<f64>>>> = Arc::new(Mutex::new(vec![Vec::new(); p.ops.len()]));
    let spans: Arc<Mutex<Vec<Span>>> = Arc::new(Mutex::new(Vec::new()));
    let rounds = opts.warmup + opts.repeats;
    let mut iterations_s = Vec::new();
    let mut devices: Vec<Option<Box<dyn Device>>> = devices.into_iter().map(Some).collect();
    let device_indices: Vec<usize> = match only {
        Some(d) => vec![d],
        None => (0..p.devices.len()).collect(),
    };
    // Tasks of other devices count as done when replaying one device alone.
    let mine: Vec<bool> = (0..nt)
        .map(|t| {
            let s = p.tasks[t].stream as usize / STREAMS;
            only.is_none_or(|d| d == s)
        })
        .collect();
    for round in 1..=rounds {
        for (flag, _) in shared.done.iter().zip(&mine).filter(|(_, m)| !**m) {
            flag.store(round, Ordering::Release);
        }
        let measured = round > opts.warmup;
        if measured {
            // Keep the last measured repeat's spans only.
            spans.lock().map_err(|_| ExecError("replay lock poisoned".into()))?.clear();
        }
        let start = Instant::now();
        let handles = std::thread::scope(|scope| -> Result<Vec<Option<Box<dyn Device>>>> {
            let mut joins = Vec::new();
            for (slot, &d) in device_indices.iter().enumerate() {
                for kind in 0..STREAMS {
                    let stream = d * STREAMS + kind;
                    if p.streams[stream].is_empty() {
                        continue;
                    }
                    let dev = if kind == 0 { devices[slot].take() } else { None };
                    let shared = Arc::clone(&shared);
                    let op_samples = Arc::clone(&op_samples);
                    let spans = Arc::clone(&spans);
                    joins.push((
                        slot,
                        scope.spawn(move || {
                            let r = run_stream(
                                p,
                                stream,
                                dev,
                                &shared,
                                &op_samples,
                                &spans,
                                round,
                                measured,
                                start,
                                ctx,
                                only.is_some(),
                            );
                            if let Err(e) = &r {
                                shared.fail(e);
                            }
                            r
                        }),
                    ));
                }
            }
            let mut back: Vec<Option<Box<dyn Device>>> = (0..device_indices.len()).map(|_| None).collect();
            for (slot, j) in joins {
                match j.join() {
                    Ok(Ok(Some(dev))) => back[slot] = Some(dev),
                    Ok(Ok(None)) => {}
                    Ok(Err(e)) => return Err(e),
                    Err(_) => return Err(ExecError("a replay thread panicked".into())),
                }
            }
            Ok(back)
        })?;
        for (slot, h) in handles.into_iter().enumerate() {
            if h.is_some() {
                devices[slot] = h;
            }
        }
        if measured {
            iterations_s.push(start.elapsed().as_secs_f64());
        }
    }
    let ops = Arc::try_unwrap(op_samples)
        .map_err(|_| ExecError("replay threads still hold results".into()))?
        .into_inner()
        .map_err(|_| ExecError("replay lock poisoned".into()))?
        .into_iter()
        .enumerate()
        .map(|(i, samples_s)| OpTimes { op: i as u32, samples_s })
        .collect();
    let mut spans = spans.lock().map_err(|_| ExecError("replay lock poisoned".into()))?.clone();
    spans.sort_by_key(|s| (s.device, s.stream, s.start_ns));
    let iteration_ns = spans.iter().map(|s| s.end_ns).max().unwrap_or(0);
    Ok(Measured {
        iterations_s,
        ops,
        timeline: Timeline {
            labels: p.labels.clone(),
            spans,
            devices: p.devices.clone(),
            stages: p.stages.clone(),
            iteration_ns,
            ..Timeline::default()
        },
        mode: mode.into(),
    })
}

#[allow(clippy::too_many_arguments)]
fn run_stream(
    p: &Program,
    stream: usize,
    mut dev: Option<Box<dyn Device>>,
    shared: &Shared,
    op_samples: &Mutex<Vec<Vec<f64>>>,
    spans: &Mutex<Vec<Span>>,
    round: u32,
    measured: bool,
    start: Instant,
    ctx: OpContext,
    alone: bool,
) -> Result<Option<Box<dyn Device>>> {
    let mut buf: Vec<u8> = Vec::new();
    let mut local_spans = Vec::new();
    let device = stream / STREAMS;
    for &t in &p.streams[stream] {
        let task = p.tasks[t as usize];
        shared.wait_preds(t, round)?;
        let begin = start.elapsed();
        // Each branch takes its end time before marking the task done, so a task that
        // waits for it never appears to start first.
        let end = match task.kind {
            TaskKind::Compute => {
                let op = &p.ops[task.payload as usize];
                let d = dev.as_mut().ok_or_else(|| ExecError("compute task off the compute stream".into()))?;
                let secs = d.run_op(op, &ctx)?;
                if measured && let Ok(mut s) = op_samples.lock() {
                    s[task.payload as usize].push(secs);
                }
                let end = start.elapsed();
                shared.finish(t, round);
                end
            }
            TaskKind::Transfer => {
                memcpy(&mut buf, p.transfers[task.payload as usize].bytes);
                let end = start.elapsed();
                shared.finish(t, round);
                end
            }
            TaskKind::HostCopy => {
                let c = p.host_copies[task.payload as usize];
                match dev.as_mut() {
                    Some(d) => {
                        d.copy(c.bytes as usize, c.to_device)?;
                    }
                    None => memcpy(&mut buf, c.bytes),
                }
                let end = start.elapsed();
                shared.finish(t, round);
                end
            }
            TaskKind::Collective => {
                let c = &p.collectives[task.payload as usize];
                let m = if alone { vec![device as u32] } else { members(p, task.payload) };
                let n = m.len() as u32;
                shared.rendezvous(t, round, n, 0)?;
                memcpy(&mut buf, ring_bytes(c.kind, c.bytes, c.members.len()));
                shared.rendezvous(t, round, n, 1)?;
                let end = start.elapsed();
                // Everyone has its end time; then the first member listed marks it done.
                shared.rendezvous(t, round, n, 2)?;
                if m.first() == Some(&(device as u32)) {
                    shared.finish(t, round);
                } else {
                    shared.wait_preds_done(t, round)?;
                }
                end
            }
        };
        local_spans.push(Span {
            device: p.devices[device],
            stream: Program::stream_kind(stream as u32),
            start_ns: begin.as_nanos() as u64,
            end_ns: end.as_nanos() as u64,
            label: task.label,
            micro_batch: task.micro_batch,
        });
    }
    if measured && let Ok(mut s) = spans.lock() {
        s.extend(local_spans);
    }
    Ok(dev)
}
