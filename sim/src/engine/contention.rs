//! SMs and memory bandwidth that communication kernels take from compute.
//!
//! An NCCL collective runs as one CUDA block per channel, each block resident on its own SM
//! for the whole collective (NCCL's `ncclConfig_t.minCTAs`/`maxCTAs` bound exactly this
//! count; "Demystifying NCCL", arXiv 2507.04786, section on channels). While a data-parallel
//! reduction, a ZeRO gather or a column-parallel layer's asynchronous backward collective
//! (`StreamKind::TensorAsync`) overlaps a kernel on the compute stream, that kernel runs on the
//! SMs left: its remaining work is redone at `(units - held) / units` of its speed (a GEMM:
//! its waves of output tiles over the SMs left, `ceil(tiles / units) / ceil(tiles / (units -
//! held))`), and its end moves each time a collective starts or ends on its device. At most half the SMs are
//! taken (the block scheduler time-shares beyond that). Transformer Engine's userbuffers
//! overlap keeps its own static SM margin (`num_sm`), so its stream is not counted here.
//!
//! The same kernels copy every byte they move through the GPU's memory (see
//! `Expanded::hbm_bytes_per_s`). Beside a memory-bound kernel (norms, element-wise ops,
//! copies, the optimizer step) the two share the memory by the bytes each keeps in flight
//! (`hardware::kernels::memory_share_beside_kernel`: the collective's resident threads against
//! the kernel's, each of those weighted by its family's rate over a copy's): the collective
//! slows to that share, not the kernel, which loses only the bytes the collective still moves.
//! The collective's flows move at [`Contention::collective_rate`] of their speed while such a
//! kernel runs on a member (`engine::run::hbm`). Compute-bound kernels (GEMMs, attention) are
//! held back by the SMs only.
//!
//! The other way round, a persistent compute kernel (Hopper's cuBLAS GEMMs and cuDNN
//! attention: one block per SM until the kernel ends, `hardware::kernels::Persistent`) leaves
//! no SM to a communication kernel issued while it runs: that collective starts when it ends
//! (`busy_until`).

/// What kind of compute kernel runs: how collectives beside it slow it, and whether it holds
/// their SMs.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct Kernel {
    /// A bandwidth-bound kernel: slowed by the collectives' memory traffic, not their SMs.
    pub memory_bound: bool,
    /// Holds every SM until it ends: a collective issued meanwhile waits for it.
    pub persistent: bool,
    /// A GEMM's output tiles (`cost::gemm_tiles`): held SMs cost it whole waves; 0 for other
    /// kernels, which run at the SMs' share.
    pub tiles: f64,
    /// A memory-bound kernel's rate over a copy's (`hardware::kernels::memory_kernel_efficiency`):
    /// the bytes each of its threads keeps in flight, against a streaming thread's.
    pub memory_efficiency: f64,
}

/// A communication kernel as its device sees it: the SMs it holds, the threads it keeps
/// resident, the memory bandwidth it asks alone (bytes/s) and the part of that the NIC's DMA
/// moves rather than its threads.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct Comm {
    pub sms: u32,
    pub threads: f64,
    pub hbm: f64,
    pub dma: f64,
}

/// The compute kernel a device is running, as work left at full speed.
#[derive(Clone, Copy)]
struct Running {
    task: u32,
    kernel: Kernel,
    /// When it started.
    started: u64,
    /// When `left_ns` was last brought up to date.
    since: u64,
    /// Nanoseconds of work left at the device's full speed.
    left_ns: f64,
}

impl Running {
    /// Work left at `now`, having run at `rate` since it was last brought up to date.
    fn left_at(&self, now: u64, rate: f64) -> f64 {
        (self.left_ns - (now - self.since) as f64 * rate).max(0.0)
    }
}

pub(super) struct Contention {
    /// SMs of each simulated device (0: no SM model, e.g. CPUs and FPGAs).
    units: Vec<u32>,
    /// SMs that communication kernels hold on each device now.
    held: Vec<u32>,
    /// Memory bandwidth a streaming kernel reaches on each device (0: no memory model).
    hbm: Vec<f64>,
    /// Memory bandwidth (bytes/s) the communication kernels running on each device ask for
    /// (their rate alone).
    hbm_used: Vec<f64>,
    /// The NIC's DMA part of `hbm_used`.
    dma_used: Vec<f64>,
    /// Threads the communication kernels keep resident on each device now.
    threads: Vec<f64>,
    running: Vec<Option<Running>>,
    /// Bumped at every rescheduling: an end event of an older version is stale.
    version: Vec<u32>,
}

impl Contention {
    pub(super) fn new(units: Vec<u32>, hbm: Vec<f64>) -> Contention {
        let n = units.len();
        Contention {
            units,
            held: vec![0; n],
            hbm,
            hbm_used: vec![0.0; n],
            dma_used: vec![0.0; n],
            threads: vec![0.0; n],
            running: vec![None; n],
            version: vec![0; n],
        }
    }

    /// The share of their speed the communication kernels on `d` keep beside memory-bound
    /// kernel `k`: what their threads' share of the bytes in flight of the streaming bandwidth
    /// gives them (`hardware::kernels::memory_share_beside_kernel`) over what their threads ask
    /// (the NIC's DMA is not among them).
    fn beside_memory_kernel(&self, d: usize, k: Kernel) -> f64 {
        let threads_ask = self.hbm_used[d] - self.dma_used[d];
        if threads_ask <= 0.0 || self.units[d] == 0 || self.hbm[d] <= 0.0 {
            return 1.0;
        }
        let moved = crate::hardware::kernels::memory_share_beside_kernel(
            self.threads[d],
            self.units[d] as f64,
            self.hbm[d],
            threads_ask,
            k.memory_efficiency,
        );
        moved / threads_ask
    }

    /// The share of their speed the communication kernels on `d` keep now: all of it unless a
    /// memory-bound kernel runs there, when they move only their share of the memory.
    pub(super) fn collective_rate(&self, d: usize) -> f64 {
        match self.running[d].as_ref() {
            Some(r) if r.kernel.memory_bound => self.beside_memory_kernel(d, r.kernel),
            _ => 1.0,
        }
    }

    /// The share of device `d`'s speed a compute kernel gets now: a memory-bound kernel the
    /// memory bandwidth the collectives' share leaves, a GEMM its waves of tiles over the SMs
    /// they leave, any other the SMs' share.
    fn rate(&self, d: usize, k: Kernel) -> f64 {
        if k.memory_bound {
            if self.hbm_used[d] <= 0.0 || self.units[d] == 0 || self.hbm[d] <= 0.0 {
                return 1.0;
            }
            // It loses what the collectives, slowed to their share, still move.
            return 1.0 - self.beside_memory_kernel(d, k) * self.hbm_used[d] / self.hbm[d];
        }
        let u = self.units[d];
        if u == 0 {
            return 1.0;
        }
        let taken = self.held[d].min(u / 2);
        if k.tiles > 0.0 {
            let waves = |sms: u32| (k.tiles / sms as f64).ceil().max(1.0);
            return waves(u) / waves(u - taken);
        }
        (u - taken) as f64 / u as f64
    }

    /// A compute kernel of `work_ns` at full speed starts on `d`: its duration now, and the
    /// version its end event carries.
    pub(super) fn start(&mut self, d: usize, task: u32, now: u64, work_ns: u64, kernel: Kernel) -> (u64, u32) {
        let rate = self.rate(d, kernel);
        self.running[d] = Some(Running { task, kernel, started: now, since: now, left_ns: work_ns as f64 });
        (if rate == 1.0 { work_ns } else { (work_ns as f64 / rate).ceil() as u64 }, self.version[d])
    }

    /// When device `d`'s running kernel frees its SMs to a communication kernel issued at `now`:
    /// its end if it is persistent and started before `now`, else `now`.
    pub(super) fn busy_until(&self, d: usize, now: u64) -> u64 {
        match &self.running[d] {
            Some(r) if r.kernel.persistent && r.started < now => {
                let rate = self.rate(d, r.kernel);
                now + (r.left_at(now, rate) / rate).ceil() as u64
            }
            _ => now,
        }
    }

    /// Whether an end event of `version` for device `d`'s kernel is current; a current one
    /// clears the running kernel.
    pub(super) fn end(&mut self, d: usize, version: u32, mask: u32) -> bool {
        if self.version[d] & mask != version {
            return false;
        }
        self.running[d] = None;
        true
    }

    /// Collective `c` starts (`add`) or ends on `d` at `now`: the running kernel's new (task,
    /// remaining duration, version), when it changes.
    pub(super) fn change(&mut self, d: usize, c: Comm, add: bool, now: u64) -> Option<(u32, u64, u32)> {
        if self.units[d] == 0 || c.sms == 0 {
            return None;
        }
        let kernel = self.running[d].as_ref().map_or_else(Kernel::default, |r| r.kernel);
        let before = self.rate(d, kernel);
        let step = |v: f64, by: f64| if add { v + by } else { (v - by).max(0.0) };
        self.held[d] = if add { self.held[d] + c.sms } else { self.held[d].saturating_sub(c.sms) };
        self.hbm_used[d] = step(self.hbm_used[d], c.hbm);
        self.dma_used[d] = step(self.dma_used[d], c.dma).min(self.hbm_used[d]);
        self.threads[d] = step(self.threads[d], c.threads);
        if self.held[d] == 0 {
            // Nothing runs: no rounding left over.
            self.hbm_used[d] = 0.0;
            self.dma_used[d] = 0.0;
            self.threads[d] = 0.0;
        }
        let after = self.rate(d, kernel);
        let r = self.running[d].as_mut()?;
        if before == after {
            return None;
        }
        r.left_ns = r.left_at(now, before);
        r.since = now;
        self.version[d] = self.version[d].wrapping_add(1);
        Some((r.task, (r.left_ns / after).ceil() as u64, self.version[d]))
    }
}

#[cfg(test)]
mod tests {
    use super::{Comm, Contention, Kernel};

    const OTHER: Kernel = Kernel { memory_bound: false, persistent: false, tiles: 0.0, memory_efficiency: 1.0 };
    const MEMORY: Kernel = Kernel { memory_bound: true, persistent: false, tiles: 0.0, memory_efficiency: 1.0 };

    /// Half the kernel at full speed, the rest on 3/4 of the SMs, and back: the end moves
    /// by exactly the work redone slower, and stale versions are refused.
    #[test]
    fn a_kernel_slows_while_a_collective_holds_sms() {
        let mut c = Contention::new(vec![100], vec![0.0]);
        let (d, v0) = c.start(0, 7, 0, 1000, OTHER);
        assert_eq!(d, 1000);
        // 500 ns of work done; 25 SMs taken: 500 left at 0.75 speed.
        let (task, left, v1) =
            c.change(0, Comm { sms: 25, threads: 0.0, hbm: 0.0, dma: 0.0 }, true, 500).expect("rescheduled");
        assert_eq!((task, left), (7, 667));
        assert_ne!(v0, v1);
        // 300 ns later 225 ns of work are done; the collective ends: 275 left at full speed.
        let (_, left, v2) =
            c.change(0, Comm { sms: 25, threads: 0.0, hbm: 0.0, dma: 0.0 }, false, 800).expect("rescheduled");
        assert_eq!(left, 275);
        assert!(!c.end(0, v1, u32::MAX), "a stale end is ignored");
        assert!(c.end(0, v2, u32::MAX));
        // No kernel running: nothing to reschedule, but the SMs are counted.
        assert!(c.change(0, Comm { sms: 200, threads: 0.0, hbm: 0.0, dma: 0.0 }, true, 900).is_none());
        let (d, _) = c.start(0, 8, 900, 1000, OTHER);
        assert_eq!(d, 2000, "at most half the SMs are taken");
    }

    /// Devices without an SM model are never slowed.
    #[test]
    fn devices_without_sms_keep_their_speed() {
        let mut c = Contention::new(vec![0], vec![0.0]);
        c.start(0, 1, 0, 1000, MEMORY);
        assert!(c.change(0, Comm { sms: 16, threads: 8192.0, hbm: 1e12, dma: 0.0 }, true, 10).is_none());
        assert_eq!(c.start(0, 2, 10, 1000, MEMORY).0, 1000);
    }

    /// A memory-bound kernel and the collectives beside it share the memory by their resident
    /// threads: the collectives get their threads' share of the bandwidth (or what they ask,
    /// if less) and slow to it; the kernel streams at the rest. A compute-bound kernel beside
    /// them loses SMs only, and the collectives keep their speed.
    #[test]
    fn a_memory_bound_kernel_and_a_collective_share_the_memory_by_their_threads() {
        // 100 SMs: 204,800 thread slots; 1000 bytes/s of streaming bandwidth. A kernel of 1000
        // ns starts, then the collective: the kernel's new duration and the collective's rate.
        let beside = |kernel: Kernel, (sms, threads, hbm, dma): (u32, f64, f64, f64)| {
            let mut c = Contention::new(vec![100], vec![1000.0]);
            assert_eq!(c.collective_rate(0), 1.0, "nothing runs");
            c.start(0, 7, 0, 1000, kernel);
            let (_, left, _) = c.change(0, Comm { sms, threads, hbm, dma }, true, 0).expect("rescheduled");
            (left, c.collective_rate(0))
        };
        // A collective of 20,480 threads (10%) asking 400 bytes/s gets 100: the kernel keeps
        // 90% of its speed, the collective a quarter of its.
        let (left, rate) = beside(MEMORY, (25, 20_480.0, 400.0, 0.0));
        assert!(left == 1112 && (rate - 0.25).abs() < 1e-12, "{left} {rate}");
        // One asking less than its share gets all it asks: 50 of the 100 its threads give.
        assert_eq!(beside(MEMORY, (25, 20_480.0, 50.0, 0.0)), (1053, 1.0));
        // Across nodes the NIC's DMA moves part of what a collective asks, at any share: of
        // 400 asked, 200 by its threads, which get 100: half its speed, and the kernel loses
        // the 200 it still moves.
        let (left, rate) = beside(MEMORY, (25, 20_480.0, 400.0, 200.0));
        assert!(left == 1250 && (rate - 0.5).abs() < 1e-12, "{left} {rate}");
        // Beside a GEMM the collective keeps its speed and the GEMM loses its SMs only (90 of
        // 100).
        assert_eq!(beside(OTHER, (10, 20_480.0, 900.0, 0.0)), (1112, 1.0));
    }

    /// A persistent kernel keeps its SMs to its end, at whatever speed it runs; any other
    /// frees them at once.
    #[test]
    fn a_collective_waits_for_a_persistent_kernel_only() {
        let mut c = Contention::new(vec![100], vec![1000.0]);
        c.start(0, 1, 0, 1000, Kernel { persistent: true, ..OTHER });
        assert_eq!(c.busy_until(0, 0), 0, "one starting in the same instant does not block");
        assert_eq!(c.busy_until(0, 400), 1000);
        // Slowed to 3/4 from 400 on: 600 ns of work left take 800.
        c.change(0, Comm { sms: 25, threads: 0.0, hbm: 0.0, dma: 0.0 }, true, 400).expect("rescheduled");
        assert_eq!(c.busy_until(0, 400), 1200);
        assert_eq!(c.busy_until(0, 1000), 1200);
        let mut m = Contention::new(vec![100], vec![1000.0]);
        m.start(0, 2, 0, 1000, OTHER);
        assert_eq!(m.busy_until(0, 400), 400);
        m.start(0, 3, 0, 1000, MEMORY);
        assert_eq!(m.busy_until(0, 400), 400);
    }

    /// A GEMM loses whole waves of tiles: 256 tiles fill 132 SMs in two waves and the 116 left
    /// beside 16 held ones in three; 128 tiles one wave, and two beside 8 held; 10,000 tiles
    /// about the SMs' share.
    #[test]
    fn a_gemm_beside_held_sms_loses_whole_waves() {
        let gemm = |tiles: f64, held: u32| {
            let mut c = Contention::new(vec![132], vec![0.0]);
            c.start(0, 1, 0, 1000, Kernel { tiles, ..OTHER });
            c.change(0, Comm { sms: held, threads: 0.0, hbm: 0.0, dma: 0.0 }, true, 0).map_or(1000, |r| r.1)
        };
        assert_eq!(gemm(256.0, 16), 1500);
        assert_eq!(gemm(128.0, 8), 2000);
        assert_eq!(gemm(128.0, 4), 1000, "the 128 SMs left hold all 128 tiles");
        let share = 132.0 / 116.0 * 1000.0;
        assert!((gemm(10_000.0, 16) as f64 - share).abs() < 0.01 * share);
    }
}
