//! The event engine: runs a [`Program`](crate::lower::Program) on a cluster and records
//! what happened.
//!
//! [`queue`] is the kernel (events ordered by integer time and sequence number). [`run`]
//! interprets tasks: compute tasks take their cost-model duration; transfers and
//! collectives become steps of flows on the [`network`](crate::network); memory events
//! move each device's usage. Nothing here knows what a layer is.

pub mod collective;
pub mod queue;
pub mod run;

pub use run::{HostCosts, RunOptions, RunResult, run};

#[cfg(test)]
mod tests;
