//! SMs that communication kernels take from compute.
//!
//! An NCCL collective runs as one CUDA block per channel, each block resident on its own SM
//! for the whole collective (NCCL's `ncclConfig_t.minCTAs`/`maxCTAs` bound exactly this
//! count; "Demystifying NCCL", arXiv 2507.04786, section on channels). While a data-parallel
//! reduction, a ZeRO gather or a column-parallel layer's asynchronous backward collective
//! (`StreamKind::TensorAsync`) overlaps a kernel on the compute stream, that kernel runs on the
//! SMs left: its remaining work is redone at `(units - held) / units` of its speed, and its
//! end moves each time a collective starts or ends on its device. At most half the SMs are
//! taken (the block scheduler time-shares beyond that). Transformer Engine's userbuffers
//! overlap keeps its own static SM margin (`num_sm`), so its stream is not counted here.

/// The compute kernel a device is running, as work left at full speed.
#[derive(Clone, Copy)]
struct Running {
    task: u32,
    /// When `left_ns` was last brought up to date.
    since: u64,
    /// Nanoseconds of work left at the device's full speed.
    left_ns: f64,
}

pub(super) struct Contention {
    /// SMs of each simulated device (0: no SM model, e.g. CPUs and FPGAs).
    units: Vec<u32>,
    /// SMs that communication kernels hold on each device now.
    held: Vec<u32>,
    running: Vec<Option<Running>>,
    /// Bumped at every rescheduling: an end event of an older version is stale.
    version: Vec<u32>,
}

impl Contention {
    pub(super) fn new(units: Vec<u32>) -> Contention {
        let n = units.len();
        Contention { units, held: vec![0; n], running: vec![None; n], version: vec![0; n] }
    }

    /// The share of device `d`'s speed its compute kernels get now.
    fn rate(&self, d: usize) -> f64 {
        let u = self.units[d];
        if u == 0 {
            return 1.0;
        }
        let taken = self.held[d].min(u / 2);
        (u - taken) as f64 / u as f64
    }

    /// A compute kernel of `work_ns` at full speed starts on `d`: its duration now, and the
    /// version its end event carries.
    pub(super) fn start(&mut self, d: usize, task: u32, now: u64, work_ns: u64) -> (u64, u32) {
        let rate = self.rate(d);
        self.running[d] = Some(Running { task, since: now, left_ns: work_ns as f64 });
        (if rate == 1.0 { work_ns } else { (work_ns as f64 / rate).ceil() as u64 }, self.version[d])
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

    /// A collective holding `sms` SMs starts (`add`) or ends on `d` at `now`: the running
    /// kernel's new (task, remaining duration, version), when it changes.
    pub(super) fn change(&mut self, d: usize, sms: u32, add: bool, now: u64) -> Option<(u32, u64, u32)> {
        if self.units[d] == 0 || sms == 0 {
            return None;
        }
        let before = self.rate(d);
        self.held[d] = if add { self.held[d] + sms } else { self.held[d].saturating_sub(sms) };
        let after = self.rate(d);
        let r = self.running[d].as_mut()?;
        if before == after {
            return None;
        }
        r.left_ns = (r.left_ns - (now - r.since) as f64 * before).max(0.0);
        r.since = now;
        self.version[d] = self.version[d].wrapping_add(1);
        Some((r.task, (r.left_ns / after).ceil() as u64, self.version[d]))
    }
}

#[cfg(test)]
mod tests {
    use super::Contention;

    /// Half the kernel at full speed, the rest on 3/4 of the SMs, and back: the end moves
    /// by exactly the work redone slower, and stale versions are refused.
    #[test]
    fn a_kernel_slows_while_a_collective_holds_sms() {
        let mut c = Contention::new(vec![100]);
        let (d, v0) = c.start(0, 7, 0, 1000);
        assert_eq!(d, 1000);
        // 500 ns of work done; 25 SMs taken: 500 left at 0.75 speed.
        let (task, left, v1) = c.change(0, 25, true, 500).expect("rescheduled");
        assert_eq!((task, left), (7, 667));
        assert_ne!(v0, v1);
        // 300 ns later 225 ns of work are done; the collective ends: 275 left at full speed.
        let (_, left, v2) = c.change(0, 25, false, 800).expect("rescheduled");
        assert_eq!(left, 275);
        assert!(!c.end(0, v1, u32::MAX), "a stale end is ignored");
        assert!(c.end(0, v2, u32::MAX));
        // No kernel running: nothing to reschedule, but the SMs are counted.
        assert!(c.change(0, 200, true, 900).is_none());
        let (d, _) = c.start(0, 8, 900, 1000);
        assert_eq!(d, 2000, "at most half the SMs are taken");
    }

    /// Devices without an SM model are never slowed.
    #[test]
    fn devices_without_sms_keep_their_speed() {
        let mut c = Contention::new(vec![0]);
        c.start(0, 1, 0, 1000);
        assert!(c.change(0, 16, true, 10).is_none());
        assert_eq!(c.start(0, 2, 10, 1000).0, 1000);
    }
}
