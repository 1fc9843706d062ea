//! The event engine: runs a [`Program`](crate::lower::Program) on a cluster and records
//! what happened.
//!
//! [`queue`] is the kernel (events ordered by integer time and sequence number). [`run`]
//! interprets tasks: compute tasks take their cost-model duration; transfers and
//! collectives become steps of flows on the [`network`](crate::network); memory events
//! move each device's usage. Nothing here knows what a layer is.

mod attribution;
pub mod collective;
pub mod communicators;
mod contention;
mod expanded;
mod jitter;
pub mod lone;
pub mod queue;
pub mod run;
mod sparse;

pub use run::{HostCosts, MAX_TIME_NS, RunError, RunOptions, RunResult, run};

/// Stores `value` in a free slot of `items` (or a new one) and returns its index.
fn claim_slot<T>(items: &mut Vec<T>, free: &mut Vec<u32>, value: T) -> u32 {
    match free.pop() {
        Some(i) => {
            items[i as usize] = value;
            i
        }
        None => {
            items.push(value);
            (items.len() - 1) as u32
        }
    }
}

#[cfg(test)]
mod fabric_tests;
#[cfg(test)]
mod tests;
