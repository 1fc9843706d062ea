//! Collectives across a fabric of pods (`cluster.fabric`): what crosses the level above
//! shares the pods' uplinks, and what stays inside a pod or on a non-blocking fabric is
//! untouched.

use super::lone::lone_collective;
use crate::hardware::fabric::Fabric;
use crate::hardware::{ClusterSpec, Topology, catalog};
use crate::lower::CollectiveKind;
use crate::network::NetworkKind;

/// `nodes` DGX A100 nodes (8 GPUs, 8 NICs each) under `fabric`.
fn dgx(nodes: u32, fabric: Option<(u32, f64, bool, f64)>) -> ClusterSpec {
    let mut c = ClusterSpec::new(catalog::node_preset("dgx-a100-80gb").expect("preset"), nodes);
    c.fabric = fabric.map(|(pod_nodes, oversubscription, rail_optimized, extra_latency_s)| Fabric {
        name: "test".into(),
        pod_nodes,
        oversubscription,
        rail_optimized,
        extra_latency_s,
    });
    c
}

fn time(c: &ClusterSpec, kind: CollectiveKind, per_node: u32, bytes: f64) -> f64 {
    lone_collective(c, kind, per_node, bytes, NetworkKind::MaxMinFair).expect("runs").time_s
}

/// One GPU per node in a ring over 4 nodes (a data-parallel group of a plan whose tensor
/// ranks fill the nodes): each of the node's 8 GPUs runs such a ring at once, so a pod of one
/// node at 1:4 gives each crossing flow 8 NICs / 4 / 8 = a quarter of a NIC, and the ring
/// runs at that pace: the bandwidth-bound all-reduce takes about 4 times as long. A pod of
/// two nodes has twice the uplinks for the same one crossing flow per ring: about twice as
/// long. Non-blocking pods, or all nodes in one pod, change nothing.
#[test]
fn a_ring_across_oversubscribed_pods_runs_at_its_share_of_the_uplinks() {
    let (kind, bytes) = (CollectiveKind::AllReduce, 4e9);
    let flat = time(&dgx(4, None), kind, 1, bytes);
    let one = time(&dgx(4, Some((1, 4.0, false, 0.0))), kind, 1, bytes);
    let two = time(&dgx(4, Some((2, 4.0, false, 0.0))), kind, 1, bytes);
    assert!((3.6..=4.05).contains(&(one / flat)), "pods of one node at 1:4: {one} s vs {flat} s");
    assert!((1.8..=2.05).contains(&(two / flat)), "pods of two nodes at 1:4: {two} s vs {flat} s");
    assert_eq!(time(&dgx(4, Some((1, 1.0, false, 0.0))), kind, 1, bytes), flat, "non-blocking pods");
    assert_eq!(time(&dgx(4, Some((4, 8.0, false, 0.0))), kind, 1, bytes), flat, "one pod");
}

/// All 8 GPUs of each node in the ring: NCCL's 8 rings each cross a pod boundary once per
/// pod, and no other collective shares the node, so a pod of 2 nodes at 1:2 still has 8
/// NICs' worth of uplink for its 8 crossing flows: unchanged. At 1:16 each gets half a NIC.
#[test]
fn rings_that_fill_the_node_cross_pods_at_few_points() {
    let (kind, bytes) = (CollectiveKind::AllReduce, 4e9);
    let flat = time(&dgx(4, None), kind, 8, bytes);
    assert_eq!(time(&dgx(4, Some((2, 2.0, false, 0.0))), kind, 8, bytes), flat);
    assert!(time(&dgx(4, Some((2, 16.0, false, 0.0))), kind, 8, bytes) > 1.5 * flat);
}

/// An all-to-all's blocks between pods share the uplinks; each keeps its own ceiling.
#[test]
fn an_all_to_all_between_pods_shares_the_uplinks() {
    let (kind, bytes) = (CollectiveKind::AllToAll, 1e9);
    let flat = time(&dgx(4, None), kind, 1, bytes);
    assert_eq!(time(&dgx(4, Some((4, 4.0, false, 0.0))), kind, 1, bytes), flat, "one pod");
    assert!(time(&dgx(4, Some((2, 4.0, false, 0.0))), kind, 1, bytes) > 1.5 * flat);
}

/// The level above adds its latency once per hop the algorithm takes in sequence: a small
/// all-reduce across pods is slower by at least one and at most 2(p - 1) hops' worth; one
/// inside a pod is not. Rail-optimised pods: a transfer between two rails goes up, one on its
/// rail does not.
#[test]
fn crossing_pods_adds_the_fabric_latency() {
    let (kind, bytes, extra) = (CollectiveKind::AllReduce, 8.0, 5e-6);
    let flat = time(&dgx(4, None), kind, 1, bytes);
    let slow = time(&dgx(4, Some((1, 1.0, false, extra))), kind, 1, bytes);
    assert!(slow - flat >= extra * 0.999 && slow - flat <= 6.0 * extra * 1.001, "{slow} s vs {flat} s");
    assert_eq!(time(&dgx(4, Some((4, 1.0, false, extra))), kind, 1, bytes), flat);
    let topo = Topology::new(&dgx(2, Some((2, 1.0, true, extra))));
    let same_rail = topo.route(0, 8).latency_s;
    let other_rail = topo.route(0, 9).latency_s;
    assert!((other_rail - same_rail - extra).abs() < 1e-12, "{other_rail} vs {same_rail}");
    assert_eq!(same_rail, Topology::new(&dgx(2, None)).route(0, 8).latency_s);
}
