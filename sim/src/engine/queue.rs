//! The discrete-event kernel: a priority queue of events ordered by (time, sequence
//! number). Time is integer nanoseconds; the sequence number breaks ties in insertion
//! order, so a run is deterministic. It knows nothing of what events mean.

/// An event's payload: a kind and two small integers, packed for speed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Event {
    pub kind: u8,
    pub id: u32,
    pub version: u32,
}

/// Bits of a key below the sequence number: the slot of the event's payload.
const SLOT_BITS: u32 = 24;
/// Events pending at once (slots), and events pushed in all (sequence numbers), that a key
/// can tell apart.
const MAX_PENDING: usize = 1 << SLOT_BITS;
const MAX_SEQUENCE: u64 = 1 << (64 - SLOT_BITS);

/// A binary min-heap of keys `time << 64 | sequence << 24 | slot`: one 128-bit comparison
/// orders by time, then insertion (sequence numbers are unique, so the slot never decides).
///
/// Popping leaves the popped key at the root until the next push or pop: most events push
/// one successor while they are handled, which then takes the root's place with one sift
/// down instead of a removal and an insertion.
///
/// Events pushed for the current time (about a fifth in a training step: a task's successor
/// ready at once) skip the heap: they queue in `now_fifo`, in insertion order. They follow
/// every heap key of the same time, all pushed before the clock reached it, and precede every
/// later time, so popping the heap's keys of the current time first, then the FIFO, keeps the
/// (time, insertion) order.
#[derive(Default)]
pub struct EventQueue {
    heap: Vec<u128>,
    now_fifo: std::collections::VecDeque<u128>,
    /// The root is the last popped event, still to be removed.
    stale_root: bool,
    /// Packed events by slot, and the free slots.
    payload: Vec<u64>,
    free: Vec<u32>,
    seq: u64,
    now: u64,
    processed: u64,
    /// A push found no room (more than 2^24 events pending, or 2^40 pushed): the event was
    /// dropped and the run is invalid.
    overflowed: bool,
}

impl EventQueue {
    pub fn new() -> EventQueue {
        EventQueue::default()
    }

    /// Schedule `e` at `time` (never in the past).
    pub fn push(&mut self, time: u64, e: Event) {
        debug_assert!(time >= self.now, "event in the past");
        let packed = ((e.kind as u64) << 56) | ((e.id as u64) << 24) | (e.version as u64 & 0xff_ffff);
        if self.payload.len() - self.free.len() >= MAX_PENDING || self.seq >= MAX_SEQUENCE {
            // The key has no room for more: refuse (the engine stops with an error).
            self.overflowed = true;
            return;
        }
        let slot = super::claim_slot(&mut self.payload, &mut self.free, packed);
        let key = ((time as u128) << 64) | ((self.seq as u128) << SLOT_BITS) | slot as u128;
        self.seq += 1;
        if time == self.now {
            self.now_fifo.push_back(key);
        } else if self.stale_root {
            self.stale_root = false;
            self.heap[0] = key;
            self.sift_down(0);
        } else {
            self.heap.push(key);
            self.sift_up(self.heap.len() - 1);
        }
    }

    /// The next event, advancing the clock to its time.
    pub fn pop(&mut self) -> Option<(u64, Event)> {
        if self.stale_root {
            self.stale_root = false;
            self.remove_root();
        }
        let key = match self.heap.first() {
            Some(&k) if (k >> 64) as u64 == self.now || self.now_fifo.is_empty() => {
                self.stale_root = true;
                k
            }
            _ => self.now_fifo.pop_front()?,
        };
        let time = (key >> 64) as u64;
        let slot = (key as u32) & ((1 << SLOT_BITS) - 1);
        let packed = self.payload[slot as usize];
        self.free.push(slot);
        self.now = time;
        self.processed += 1;
        Some((
            time,
            Event {
                kind: (packed >> 56) as u8,
                id: ((packed >> 24) & 0xffff_ffff) as u32,
                version: (packed & 0xff_ffff) as u32,
            },
        ))
    }

    /// Remove the root: the last key moves to the root's place.
    fn remove_root(&mut self) {
        let last = self.heap.pop().expect("a root to remove");
        if !self.heap.is_empty() {
            self.heap[0] = last;
            self.sift_down(0);
        }
    }

    fn sift_up(&mut self, mut i: usize) {
        let h = &mut self.heap;
        let key = h[i];
        while i > 0 {
            let parent = (i - 1) / 2;
            if h[parent] <= key {
                break;
            }
            h[i] = h[parent];
            i = parent;
        }
        h[i] = key;
    }

    /// Put the key at `i` (the root) in its place: its hole goes down to a leaf along the
    /// smaller children, then the key rises from there. The path's length depends only on the
    /// heap's size, so the loop has no unpredictable branch, and a new key, usually later
    /// than most, rises little.
    fn sift_down(&mut self, i: usize) {
        let h = &mut self.heap;
        let n = h.len();
        let key = h[i];
        let mut pos = i;
        let mut child = 2 * i + 1;
        while child + 1 < n {
            child += (h[child + 1] < h[child]) as usize;
            h[pos] = h[child];
            pos = child;
            child = 2 * pos + 1;
        }
        if child + 1 == n {
            h[pos] = h[child];
            pos = child;
        }
        h[pos] = key;
        self.sift_up(pos);
    }

    /// Whether a push was refused (see `overflowed`).
    pub fn overflowed(&self) -> bool {
        self.overflowed
    }

    pub fn now(&self) -> u64 {
        self.now
    }

    /// Events processed so far.
    pub fn processed(&self) -> u64 {
        self.processed
    }

    /// Events pending.
    pub fn len(&self) -> usize {
        self.heap.len() - self.stale_root as usize + self.now_fifo.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{RngExt, SeedableRng};
    use rand_pcg::Pcg64Mcg;
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;

    /// Pops in (time, insertion) order, as a binary heap of (time, sequence) does, under
    /// interleaved pushes at random times never before the clock, with many ties; payloads
    /// come back intact while slots are reused.
    #[test]
    fn pops_in_time_then_insertion_order() {
        let mut rng = Pcg64Mcg::seed_from_u64(7);
        for round in 0..12 {
            let mut q = EventQueue::new();
            let mut reference: BinaryHeap<Reverse<(u64, u64, u32, u32)>> = BinaryHeap::new();
            let (mut seq, mut now) = (0u64, 0u64);
            let spread = [1u64, 10, 1_000, 1 << 40][round % 4];
            for _ in 0..3_000 {
                for _ in 0..rng.random_range(0..4) {
                    let t = now + rng.random_range(0..spread);
                    let (id, version) = (rng.random_range(0..u32::MAX), rng.random_range(0..1u32 << 24));
                    q.push(t, Event { kind: (seq % 4) as u8, id, version });
                    reference.push(Reverse((t, seq, id, version)));
                    seq += 1;
                }
                if rng.random_bool(0.6) {
                    match (q.pop(), reference.pop()) {
                        (None, None) => {}
                        (Some((t, e)), Some(Reverse((wt, ws, wid, wv)))) => {
                            assert_eq!((t, e.kind, e.id, e.version), (wt, (ws % 4) as u8, wid, wv));
                            now = t;
                        }
                        other => panic!("queue and reference disagree: {other:?}"),
                    }
                }
            }
            while let Some(Reverse((wt, _, wid, _))) = reference.pop() {
                let (t, e) = q.pop().expect("as many events as the reference");
                assert_eq!((t, e.id), (wt, wid));
            }
            assert!(q.pop().is_none() && q.is_empty());
            assert_eq!(q.processed(), seq);
        }
    }
}
