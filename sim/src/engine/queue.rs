//! The discrete-event kernel: a priority queue of events ordered by time, then insertion
//! (ties in insertion order, so a run is deterministic). Time is integer nanoseconds. It knows
//! nothing of what events mean.

use std::collections::VecDeque;

/// An event's payload: a kind and two small integers, packed for speed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Event {
    pub kind: u8,
    pub id: u32,
    pub version: u32,
}

impl Event {
    fn pack(self) -> u64 {
        ((self.kind as u64) << 56) | ((self.id as u64) << 24) | (self.version as u64 & 0xff_ffff)
    }

    fn unpack(packed: u64) -> Event {
        Event {
            kind: (packed >> 56) as u8,
            id: ((packed >> 24) & 0xffff_ffff) as u32,
            version: (packed & 0xff_ffff) as u32,
        }
    }
}

/// Bits of a heap key below the sequence number: the slot of the event's payload.
const SLOT_BITS: u32 = 24;
/// Events pending at once, and events pushed into the heap in all (sequence numbers), that
/// the queue can tell apart.
const MAX_PENDING: usize = 1 << SLOT_BITS;
const MAX_SEQUENCE: u64 = 1 << (64 - SLOT_BITS);
/// Most events the sorted array holds; one more moves them all into the heap.
const SORTED_MAX: usize = 32;
/// A heap left with this many keys moves them back into the sorted array.
const SORTED_MIN: usize = 8;

/// The time of an entry or key: its upper 64 bits.
fn time_of(k: u128) -> u64 {
    (k >> 64) as u64
}

/// Pending events, in one of two forms.
///
/// While few are pending (a training step keeps about 15 when one replica stands for the
/// others), `sorted` holds entries `time << 64 | packed event`, by time with the next one
/// last, and events of one time in reverse insertion order: a pop takes the last off, a push
/// moves the entries of its time or earlier one place up and goes before them.
///
/// Past `SORTED_MAX` pending (every device simulated) they move, in order, into `heap`: a
/// binary min-heap of keys `time << 64 | sequence << 24 | slot`, where one 128-bit comparison
/// orders by time, then insertion (sequence numbers are unique, so the slot never decides),
/// and the payload sits in a reused slab. Popping leaves the popped key at the root until the
/// next push or pop: most events push one successor while they are handled, which then takes
/// the root's place with one sift down instead of a removal and an insertion. Down to
/// `SORTED_MIN`, the keys go back into the sorted array.
///
/// Events pushed for the current time (about a fifth in a training step: a task's successor
/// ready at once) skip both: they queue in `now_fifo` as entries, in insertion order. They
/// follow every pending event of the same time, all pushed before the clock reached it, and
/// precede every later time, so popping the sorted array's or heap's events of the current
/// time first, then the FIFO, keeps the (time, insertion) order.
#[derive(Default)]
pub struct EventQueue {
    sorted: Vec<u128>,
    heap: Vec<u128>,
    /// The events are in `heap` (else in `sorted`).
    in_heap: bool,
    /// The heap's root is the last popped event, still to be removed.
    stale_root: bool,
    now_fifo: VecDeque<u128>,
    /// Packed events of the heap's keys by slot, and the free slots.
    payload: Vec<u64>,
    free: Vec<u32>,
    seq: u64,
    now: u64,
    processed: u64,
    /// A push found no room (more than 2^24 events pending, or 2^40 pushed into the heap):
    /// the event was dropped and the run is invalid.
    overflowed: bool,
}

impl EventQueue {
    pub fn new() -> EventQueue {
        EventQueue::default()
    }

    /// Schedule `e` at `time` (never in the past).
    pub fn push(&mut self, time: u64, e: Event) {
        debug_assert!(time >= self.now, "event in the past");
        if self.len() >= MAX_PENDING {
            // No room for more: refuse (the engine stops with an error).
            self.overflowed = true;
            return;
        }
        let entry = ((time as u128) << 64) | e.pack() as u128;
        if time == self.now {
            self.now_fifo.push_back(entry);
        } else if self.in_heap {
            self.heap_push(entry);
        } else if self.sorted.len() < SORTED_MAX {
            self.sorted.push(entry);
            let s = self.sorted.as_mut_slice();
            let mut i = s.len() - 1;
            while i > 0 && time_of(s[i - 1]) <= time {
                s[i] = s[i - 1];
                i -= 1;
            }
            s[i] = entry;
        } else {
            self.in_heap = true;
            // In pop order: ascending keys are a valid min-heap.
            for i in (0..self.sorted.len()).rev() {
                self.heap_push(self.sorted[i]);
            }
            self.sorted.clear();
            self.heap_push(entry);
        }
    }

    /// Put an entry into the heap.
    fn heap_push(&mut self, entry: u128) {
        if self.seq >= MAX_SEQUENCE {
            self.overflowed = true;
            return;
        }
        let slot = super::claim_slot(&mut self.payload, &mut self.free, entry as u64);
        let key = ((time_of(entry) as u128) << 64) | ((self.seq as u128) << SLOT_BITS) | slot as u128;
        self.seq += 1;
        if self.stale_root {
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
        let entry = if self.in_heap {
            if self.stale_root {
                self.stale_root = false;
                self.remove_root();
                if self.heap.len() <= SORTED_MIN {
                    self.leave_heap();
                }
            }
            self.pop_heap()
        } else {
            None
        };
        let entry = match entry {
            Some(entry) => entry,
            None => match self.sorted.last() {
                Some(&k) if time_of(k) == self.now || self.now_fifo.is_empty() => {
                    self.sorted.pop();
                    k
                }
                _ => self.now_fifo.pop_front()?,
            },
        };
        let time = time_of(entry);
        self.now = time;
        self.processed += 1;
        Some((time, Event::unpack(entry as u64)))
    }

    /// The heap's next event as an entry, if it precedes the FIFO's (its root stays, stale).
    fn pop_heap(&mut self) -> Option<u128> {
        match self.heap.first() {
            Some(&k) if time_of(k) == self.now || self.now_fifo.is_empty() => {
                self.stale_root = true;
                let slot = (k as u32) & ((1 << SLOT_BITS) - 1);
                self.free.push(slot);
                Some(((time_of(k) as u128) << 64) | self.payload[slot as usize] as u128)
            }
            _ => None,
        }
    }

    /// Move the heap's keys into the sorted array, as entries.
    fn leave_heap(&mut self) {
        self.heap.sort_unstable_by(|a, b| b.cmp(a));
        for &k in &self.heap {
            let slot = (k as u32) & ((1 << SLOT_BITS) - 1);
            self.free.push(slot);
            self.sorted.push(((time_of(k) as u128) << 64) | self.payload[slot as usize] as u128);
        }
        self.heap.clear();
        self.in_heap = false;
    }

    /// Remove the heap's root: the last key moves to the root's place.
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
        self.sorted.len() + self.heap.len() - self.stale_root as usize + self.now_fifo.len()
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

    /// The same order while the pending events swing between a few and many, so they move
    /// from the sorted array into the heap and back, many times, with ties across the moves.
    #[test]
    fn keeps_the_order_across_the_sorted_array_and_the_heap() {
        let mut rng = Pcg64Mcg::seed_from_u64(11);
        for spread in [2u64, 5, 100, 1 << 30] {
            let mut q = EventQueue::new();
            let mut reference: BinaryHeap<Reverse<(u64, u64, u32)>> = BinaryHeap::new();
            let (mut seq, mut now, mut moves, mut was_heap) = (0u64, 0u64, 0, false);
            for phase in 0..200 {
                // Grow to between a few and a hundred pending, then drain to between none
                // and a dozen.
                let target = if phase % 2 == 0 { rng.random_range(0..100) } else { rng.random_range(0..12) };
                while q.len() != target {
                    if q.len() < target && rng.random_bool(0.8) {
                        let t = now + rng.random_range(0..spread);
                        let id = rng.random_range(0..u32::MAX);
                        q.push(t, Event { kind: (seq % 5) as u8, id, version: (seq & 0xff_ffff) as u32 });
                        reference.push(Reverse((t, seq, id)));
                        seq += 1;
                    } else if let Some(Reverse((wt, ws, wid))) = reference.pop() {
                        let (t, e) = q.pop().expect("as many events as the reference");
                        assert_eq!((t, e.kind, e.id, e.version), (wt, (ws % 5) as u8, wid, (ws & 0xff_ffff) as u32));
                        now = t;
                    }
                    assert_eq!(q.len(), reference.len());
                    moves += (q.in_heap != was_heap) as u32;
                    was_heap = q.in_heap;
                }
            }
            assert!(moves >= 20, "only {moves} moves between the sorted array and the heap");
        }
    }
}
