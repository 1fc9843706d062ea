//! The memory a collective shares with a memory-bound kernel beside it: while such a kernel
//! runs on a member, the flows of the overlapped collectives there move at the share of their
//! speed that their share of the memory leaves them ([`Contention::collective_rate`]); a ring
//! step waits for its slowest flow, so one member's kernel slows the whole step.
//!
//! [`Contention::collective_rate`]: super::super::contention::Contention::collective_rate

use super::Engine;
use crate::lower::NONE;
use crate::network::FlowId;

/// A live flow of an overlapped collective: what it may move alone and the members whose
/// memory it reads or writes.
#[derive(Clone, Copy)]
pub(super) struct SharedFlow {
    /// Its own ceiling (bytes/s; infinite when only the links limit it).
    cap: f64,
    /// Its rate alone: the ceiling or its route's narrowest link.
    alone: f64,
    /// The simulated devices at its ends (NONE: not simulated).
    devices: [u32; 2],
}

impl Engine<'_> {
    /// The ceiling `f` runs under now: its own, or its share of its rate alone while a
    /// memory-bound kernel runs at one of its ends.
    fn shared_cap(&self, f: &SharedFlow) -> f64 {
        let rate = |d: u32| if d == NONE { 1.0 } else { self.mem_share[d as usize] };
        let g = rate(f.devices[0]).min(rate(f.devices[1]));
        if g >= 1.0 { f.cap } else { (f.alone * g).min(f.cap) }
    }

    /// Flow `id` of an overlapped collective starts between cluster devices `source` and
    /// `target` over `links` under ceiling `cap`: it is tracked, and its ceiling set for the
    /// memory-bound kernels running at its ends now.
    pub(super) fn share_flow(&mut self, id: FlowId, links: &[u32], cap: f64, source: u32, target: u32, now: u64) {
        let alone = links.iter().map(|&k| self.net.capacities()[k as usize]).fold(cap, f64::min);
        let sim = |d: u32| self.p.mirror.get(d as usize).copied().unwrap_or(NONE);
        let devices = [sim(source), sim(target)];
        let f = SharedFlow { cap, alone, devices };
        if self.shared.len() <= id as usize {
            self.shared.resize(id as usize + 1, None);
        }
        self.shared[id as usize] = Some(f);
        for (i, &d) in devices.iter().enumerate() {
            if d != NONE && (i == 0 || d != devices[0]) {
                let d = d as usize;
                if self.shared_on[d].is_empty() {
                    // Not kept up to date while no flow touches the device.
                    self.mem_share[d] = self.sm.collective_rate(d);
                }
                self.shared_on[d].push(id);
            }
        }
        let c = self.shared_cap(&f);
        if c != cap {
            self.net.set_cap_deferred(now, id, c);
        }
    }

    /// Flow `id` ended: no longer tracked.
    pub(super) fn unshare_flow(&mut self, id: FlowId) {
        let Some(f) = self.shared.get_mut(id as usize).and_then(Option::take) else { return };
        for d in f.devices {
            if d == NONE {
                continue;
            }
            let v = &mut self.shared_on[d as usize];
            if let Some(p) = v.iter().position(|&x| x == id) {
                v.swap_remove(p);
            }
        }
    }

    /// What the collectives on device `d` keep of their speed may have changed (a kernel
    /// started or ended there, a collective started or ended): the flows touching it get their
    /// new ceilings once every event of this instant is done (a kernel ending and the next
    /// starting in the same instant change nothing in between).
    pub(super) fn refresh_memory_share(&mut self, d: usize, now: u64) {
        if self.shared_on[d].is_empty() {
            return;
        }
        let g = self.sm.collective_rate(d);
        if g != self.mem_share[d] && !self.mem_dirty.contains(&(d as u32)) {
            self.mem_dirty.push(d as u32);
            self.queue_settle(now);
        }
    }

    /// The new ceilings of the flows touching the devices whose share may have changed.
    pub(super) fn apply_memory_shares(&mut self, now: u64) {
        while let Some(d) = self.mem_dirty.pop() {
            let d = d as usize;
            let g = self.sm.collective_rate(d);
            if g == self.mem_share[d] {
                continue;
            }
            self.mem_share[d] = g;
            for i in 0..self.shared_on[d].len() {
                let id = self.shared_on[d][i];
                let f = self.shared[id as usize].expect("tracked flow");
                let cap = self.shared_cap(&f);
                self.net.set_cap_deferred(now, id, cap);
            }
        }
        self.push_changes();
    }
}
