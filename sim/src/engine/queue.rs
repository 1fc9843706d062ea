//! The discrete-event kernel: a priority queue of events ordered by (time, sequence
//! number). Time is integer nanoseconds; the sequence number breaks ties in insertion
//! order, so a run is deterministic. It knows nothing of what events mean.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// An event's payload: a kind and two small integers, packed for speed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Event {
    pub kind: u8,
    pub id: u32,
    pub version: u32,
}

#[derive(Default)]
pub struct EventQueue {
    heap: BinaryHeap<Reverse<(u64, u64, u64)>>,
    seq: u64,
    now: u64,
    processed: u64,
}

impl EventQueue {
    pub fn new() -> EventQueue {
        EventQueue::default()
    }

    /// Schedule `e` at `time` (never in the past).
    pub fn push(&mut self, time: u64, e: Event) {
        debug_assert!(time >= self.now, "event in the past");
        let packed = ((e.kind as u64) << 56) | ((e.id as u64) << 24) | (e.version as u64 & 0xff_ffff);
        self.heap.push(Reverse((time, self.seq, packed)));
        self.seq += 1;
    }

    /// The next event, advancing the clock to its time.
    pub fn pop(&mut self) -> Option<(u64, Event)> {
        let Reverse((time, _, packed)) = self.heap.pop()?;
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

    pub fn now(&self) -> u64 {
        self.now
    }

    /// Events processed so far.
    pub fn processed(&self) -> u64 {
        self.processed
    }

    pub fn len(&self) -> usize {
        self.heap.len()
    }

    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}
