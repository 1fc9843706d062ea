//! The network above the nodes when one switch does not reach them all (`cluster.fabric`):
//! pods of nodes at full bisection (a leaf switch, or a group of leaves under their own
//! spines) joined by a level above that may be oversubscribed, and rail-optimised pods, where
//! each NIC index (a rail) of the pod's nodes has a leaf switch of its own.
//!
//! Without a fabric the network between nodes is one non-blocking switch, as before. With
//! one, a flow between pods (or, rail-optimised, between two rails) goes through the level
//! above: it pays `extra_latency_s`, and it shares its pod's uplinks, of
//! `pod nodes x NICs x NIC bandwidth / oversubscription` (per rail when rail-optimised), with
//! the other flows leaving the pod at that moment (`engine::collective`).

use serde::Serialize;

/// A fabric of pods ([`Fabric::preset`] or a scenario's `cluster.fabric`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Fabric {
    pub name: String,
    /// Nodes in one pod, at full bisection among themselves.
    pub pod_nodes: u32,
    /// A pod's injection bandwidth (its NICs) over its bandwidth to the level above: 1 is a
    /// non-blocking fat tree.
    pub oversubscription: f64,
    /// Each NIC index of the pod's nodes has its own leaf switch (NVIDIA's rail-optimised
    /// design): a flow between two rails goes through the level above even inside a pod.
    /// NCCL keeps its rings and (with PXN) its all-to-all blocks on their rails.
    pub rail_optimized: bool,
    /// Latency the switch hops above a pod's leaves add to a flow that crosses them.
    pub extra_latency_s: f64,
}

/// Fabric preset names, for `cluster.fabric` and `trainsim presets`.
pub const PRESETS: &[&str] = &["dgx-superpod", "llama3-2024"];

impl Fabric {
    /// Every published fabric, a preset each:
    ///
    /// - `dgx-superpod`: NVIDIA DGX SuperPOD (DGX H100 reference architecture): scalable units
    ///   of 32 nodes whose compute fabric is rail-optimised, joined by spine switches into a
    ///   full fat tree (no oversubscription).
    /// - `llama3-2024`: Meta's RoCE cluster for Llama 3 (Dubey et al. 2024, "The Llama 3 Herd
    ///   of Models", section 3.3.1): pods of 3,072 GPUs (384 nodes of 8) at full bisection,
    ///   joined by an aggregation layer at 1:7 oversubscription.
    ///
    /// Neither source gives the switches' latency; `extra_latency_s` is 0 unless given.
    pub fn presets() -> Vec<Fabric> {
        PRESETS.iter().filter_map(|n| Fabric::preset(n)).collect()
    }

    /// The preset named `name` (one of [`PRESETS`]), if any.
    pub fn preset(name: &str) -> Option<Fabric> {
        let (pod_nodes, oversubscription, rail_optimized) = match name {
            "dgx-superpod" => (32, 1.0, true),
            "llama3-2024" => (384, 7.0, false),
            _ => return None,
        };
        Some(Fabric { name: name.into(), pod_nodes, oversubscription, rail_optimized, extra_latency_s: 0.0 })
    }
}
