//! How concurrent transfers share links.
//!
//! One interface, [`Network`], with two fidelity levels chosen by [`NetworkKind`]:
//! - `ideal`: every flow runs at its route's bottleneck capacity, as if alone;
//! - `fair`: max-min fair sharing (progressive filling) among the flows that cross a link.
//!
//! The fast fair-sharing code recomputes rates only in the connected component of flows
//! touched by a change ([`fair_fast`]); [`fair_slow`] recomputes everything from scratch and
//! is the reference the tests compare against on random inputs.
//!
//! Time is integer nanoseconds; a flow's finish time is rounded up to the next nanosecond.
//!
//! Changes can be batched: [`Network::add_deferred`] and [`Network::remove_deferred`] only
//! record what they touched, and [`Network::settle`] then re-rates each touched component
//! once. Rates over a span of zero time do not move any bytes, so changes made at one instant
//! and settled before time advances give the rates of applying them one by one, at a fraction
//! of the work when many flows start or end together (an all-to-all's n(n-1) flows, a ring
//! step's flows ending at once).

pub mod fair_fast;
pub mod fair_slow;

use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NetworkKind {
    /// Max-min fair sharing of every link.
    MaxMinFair,
    /// No contention: each flow gets its bottleneck link to itself.
    Ideal,
}

impl NetworkKind {
    pub const NAMES: [&'static str; 2] = ["fair", "ideal"];
    pub fn parse(s: &str) -> Option<NetworkKind> {
        match s {
            "fair" => Some(NetworkKind::MaxMinFair),
            "ideal" => Some(NetworkKind::Ideal),
            _ => None,
        }
    }
}

pub type FlowId = u32;

/// A flow whose finish time changed: the engine schedules (finish_ns, id, version) and
/// ignores events whose version is stale.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reschedule {
    pub id: FlowId,
    pub version: u32,
    pub finish_ns: u64,
}

#[derive(Clone, Debug)]
struct Flow {
    links: [u32; 2],
    len: u8,
    remaining_bytes: f64,
    /// The most this flow can take, whatever the links leave (e.g. a collective using few
    /// channels); infinite when only the links limit it.
    cap: f64,
    rate: f64,
    updated_ns: u64,
    /// When it finishes at its rate, and when the finish event of its version that is queued
    /// fires (no later): a rate that falls moves `finish_ns` without queuing another event, and
    /// the queued one, when due, queues the finish again ([`Network::due`]).
    finish_ns: u64,
    queued_ns: u64,
    version: u32,
    live: bool,
    /// Scratch mark for component searches.
    mark: u32,
}

/// The set of active flows over a fixed set of links.
pub struct Network {
    kind: NetworkKind,
    capacity: Vec<f64>,
    flows: Vec<Flow>,
    free: Vec<FlowId>,
    /// Active flows on each link.
    on_link: Vec<Vec<FlowId>>,
    changes: Vec<Reschedule>,
    scratch: fair_fast::Scratch,
    epoch: u32,
    /// Deferred changes to settle: flows added, and links a removed flow left.
    added: Vec<FlowId>,
    left: Vec<u32>,
}

impl Flow {
    /// Count the bytes moved at the current rate up to `now`.
    fn advance(&mut self, now: u64) {
        let dt = (now - self.updated_ns) as f64 * 1e-9;
        self.remaining_bytes = (self.remaining_bytes - self.rate * dt).max(0.0);
        self.updated_ns = now;
    }
}

fn finish_ns(now: u64, remaining: f64, rate: f64) -> u64 {
    if remaining <= 0.0 {
        return now;
    }
    let dt = (remaining / rate * 1e9).ceil();
    // A float beyond u64 (or a zero rate) saturates: the engine refuses times past its clock.
    now.saturating_add(dt as u64)
}

impl Network {
    pub fn new(kind: NetworkKind, capacity_bytes_per_s: &[f64]) -> Network {
        Network {
            kind,
            capacity: capacity_bytes_per_s.to_vec(),
            flows: Vec::new(),
            free: Vec::new(),
            on_link: vec![Vec::new(); capacity_bytes_per_s.len()],
            changes: Vec::new(),
            scratch: fair_fast::Scratch::default(),
            epoch: 0,
            added: Vec::new(),
            left: Vec::new(),
        }
    }

    pub fn kind(&self) -> NetworkKind {
        self.kind
    }

    /// Start a flow of `bytes` over `links` (one or two links) at `now`.
    pub fn add(&mut self, now: u64, links: &[u32], bytes: f64) -> FlowId {
        self.add_capped(now, links, bytes, f64::INFINITY)
    }

    /// Start a flow that never runs faster than `cap_bytes_per_s` (max-min fair sharing with
    /// a per-flow ceiling: the ceiling acts as a private link of that capacity).
    pub fn add_capped(&mut self, now: u64, links: &[u32], bytes: f64, cap_bytes_per_s: f64) -> FlowId {
        let id = self.insert(now, links, bytes, cap_bytes_per_s);
        self.rerate(now, id);
        id
    }

    /// [`Network::add_capped`] without re-rating: the flow's rate is set by the next
    /// [`Network::settle`], which must come before time advances. (The ideal network rates
    /// it at once: it has nothing to share.)
    pub fn add_deferred(&mut self, now: u64, links: &[u32], bytes: f64, cap_bytes_per_s: f64) -> FlowId {
        let id = self.insert(now, links, bytes, cap_bytes_per_s);
        match self.kind {
            NetworkKind::Ideal => self.rerate(now, id),
            NetworkKind::MaxMinFair => self.added.push(id),
        }
        id
    }

    /// [`Network::remove`] without re-rating the flows left: the next [`Network::settle`]
    /// does, before time advances.
    pub fn remove_deferred(&mut self, id: FlowId) {
        let (links, len) = self.unlink(id);
        if self.kind == NetworkKind::MaxMinFair {
            self.left.extend_from_slice(&links[..len]);
        }
    }

    /// Give a live flow a new ceiling from `now` on (the bytes it moved until now at its old
    /// rate are kept). Under fair sharing its component is re-rated by the next
    /// [`Network::settle`], which must come before time advances.
    pub fn set_cap_deferred(&mut self, now: u64, id: FlowId, cap_bytes_per_s: f64) {
        debug_assert!(cap_bytes_per_s > 0.0);
        let f = &mut self.flows[id as usize];
        debug_assert!(f.live);
        if f.cap == cap_bytes_per_s {
            return;
        }
        // A flow held below its old ceiling by a link keeps its rate under any ceiling it does
        // not exceed, and so does every other flow (the max-min allocation is unchanged).
        let slack = f.rate > 0.0 && f.rate < f.cap * (1.0 - 1e-9) && f.rate <= cap_bytes_per_s;
        f.cap = cap_bytes_per_s;
        if slack {
            return;
        }
        match self.kind {
            NetworkKind::MaxMinFair => self.added.push(id),
            NetworkKind::Ideal => {
                f.advance(now);
                f.version = f.version.wrapping_add(1);
                self.rerate(now, id);
            }
        }
    }

    /// Whether deferred changes wait for [`Network::settle`].
    pub fn unsettled(&self) -> bool {
        !self.added.is_empty() || !self.left.is_empty()
    }

    /// Re-rate, once each, the components the deferred changes touched.
    pub fn settle(&mut self, now: u64) {
        if !self.unsettled() {
            return;
        }
        self.epoch = self.epoch.wrapping_add(1);
        let epoch = self.epoch;
        let mut seeds = std::mem::take(&mut self.added);
        for &k in &self.left {
            seeds.extend(self.on_link[k as usize].first().copied());
        }
        self.left.clear();
        for &seed in &seeds {
            let f = &self.flows[seed as usize];
            // Gone since, or re-rated with an earlier seed's component.
            if !f.live || f.mark == epoch {
                continue;
            }
            fair_fast::rerate_component(self, now, seed);
        }
        seeds.clear();
        self.added = seeds;
    }

    fn insert(&mut self, now: u64, links: &[u32], bytes: f64, cap_bytes_per_s: f64) -> FlowId {
        debug_assert!(!links.is_empty() && links.len() <= 2);
        debug_assert!(cap_bytes_per_s > 0.0);
        let mut l = [links[0], links[0]];
        if links.len() > 1 {
            l[1] = links[1];
        }
        let flow = Flow {
            links: l,
            len: links.len() as u8,
            remaining_bytes: bytes,
            cap: cap_bytes_per_s,
            rate: 0.0,
            updated_ns: now,
            finish_ns: u64::MAX,
            queued_ns: u64::MAX,
            version: 0,
            live: true,
            // Not visited in the current epoch.
            mark: self.epoch.wrapping_sub(1),
        };
        let id = match self.free.pop() {
            Some(id) => {
                let v = self.flows[id as usize].version;
                self.flows[id as usize] = Flow { version: v.wrapping_add(1), ..flow };
                id
            }
            None => {
                self.flows.push(flow);
                (self.flows.len() - 1) as FlowId
            }
        };
        for &k in &l[..links.len()] {
            self.on_link[k as usize].push(id);
        }
        id
    }

    /// Remove a flow that finished (or is cancelled) at `now`.
    pub fn remove(&mut self, now: u64, id: FlowId) {
        let (links, len) = self.unlink(id);
        if self.kind == NetworkKind::MaxMinFair {
            // Neighbours on the freed links may speed up.
            for &k in &links[..len] {
                if let Some(&other) = self.on_link[k as usize].first() {
                    self.rerate(now, other);
                }
            }
        }
    }

    /// Take a flow off its links; returns them.
    fn unlink(&mut self, id: FlowId) -> ([u32; 2], usize) {
        let f = &mut self.flows[id as usize];
        debug_assert!(f.live);
        f.live = false;
        f.version = f.version.wrapping_add(1);
        let (links, len) = (f.links, f.len as usize);
        for &k in &links[..len] {
            let v = &mut self.on_link[k as usize];
            if let Some(p) = v.iter().position(|&x| x == id) {
                v.swap_remove(p);
            }
        }
        self.free.push(id);
        (links, len)
    }

    /// A finish event of flow `id`'s current version fired at `now`: `None` if the flow is
    /// done, else the later time it now finishes at (its rate fell since the event was
    /// queued), for which the caller queues the event again.
    pub fn due(&mut self, id: FlowId, now: u64) -> Option<u64> {
        let f = &mut self.flows[id as usize];
        if now >= f.finish_ns {
            return None;
        }
        f.queued_ns = f.finish_ns;
        Some(f.finish_ns)
    }

    pub fn version(&self, id: FlowId) -> u32 {
        self.flows[id as usize].version
    }

    pub fn is_live(&self, id: FlowId) -> bool {
        self.flows[id as usize].live
    }

    /// Current rate of a flow (bytes/s).
    pub fn rate(&self, id: FlowId) -> f64 {
        self.flows[id as usize].rate
    }

    /// Rates of every live flow, in id order (for tests).
    pub fn live_rates(&self) -> Vec<(FlowId, f64)> {
        (0..self.flows.len() as u32)
            .filter(|&i| self.flows[i as usize].live)
            .map(|i| (i, self.flows[i as usize].rate))
            .collect()
    }

    /// Ceilings of every live flow, in id order (for tests).
    pub fn live_caps(&self) -> Vec<f64> {
        self.flows.iter().filter(|f| f.live).map(|f| f.cap).collect()
    }

    /// Links of every live flow, in id order (for tests).
    pub fn live_routes(&self) -> Vec<Vec<u32>> {
        self.flows.iter().filter(|f| f.live).map(|f| f.links[..f.len as usize].to_vec()).collect()
    }

    pub fn capacities(&self) -> &[f64] {
        &self.capacity
    }

    /// Finish times that changed since the last call.
    pub fn drain_changes(&mut self, out: &mut Vec<Reschedule>) {
        out.append(&mut self.changes);
    }

    /// Recompute rates around `seed` and queue new finish times.
    fn rerate(&mut self, now: u64, seed: FlowId) {
        match self.kind {
            NetworkKind::Ideal => {
                let f = &mut self.flows[seed as usize];
                let cap = f.links[..f.len as usize].iter().map(|&k| self.capacity[k as usize]).fold(f.cap, f64::min);
                f.rate = cap;
                let fin = finish_ns(now, f.remaining_bytes, cap);
                (f.finish_ns, f.queued_ns) = (fin, fin);
                self.changes.push(Reschedule { id: seed, version: f.version, finish_ns: fin });
            }
            NetworkKind::MaxMinFair => {
                self.epoch = self.epoch.wrapping_add(1);
                fair_fast::rerate_component(self, now, seed);
            }
        }
    }
}

#[cfg(test)]
mod tests;
