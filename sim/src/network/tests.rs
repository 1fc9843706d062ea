use super::fair_slow::{max_min_rates, max_min_rates_capped};
use super::*;
use rand::RngExt;
use rand::SeedableRng;
use rand_pcg::Pcg64Mcg;

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

/// After any sequence of adds and removes, the incremental rates equal a from-scratch
/// progressive filling over all live flows.
#[test]
fn fast_fair_sharing_matches_slow_reference_on_random_inputs() {
    let mut rng = Pcg64Mcg::seed_from_u64(7);
    for case in 0..300 {
        let links = rng.random_range(1..12usize);
        let caps: Vec<f64> = (0..links).map(|_| rng.random_range(1.0..100.0f64).round() * 1e9).collect();
        let mut net = Network::new(NetworkKind::MaxMinFair, &caps);
        let mut live: Vec<FlowId> = Vec::new();
        let mut now = 0u64;
        for _ in 0..rng.random_range(1..40usize) {
            now += rng.random_range(0..1000u64);
            if !live.is_empty() && rng.random_range(0..3u32) == 0 {
                let i = rng.random_range(0..live.len());
                net.remove(now, live.swap_remove(i));
            } else {
                let a = rng.random_range(0..links) as u32;
                let route: Vec<u32> = if rng.random_bool(0.7) && links > 1 {
                    let mut b = rng.random_range(0..links) as u32;
                    if b == a {
                        b = (a + 1) % links as u32;
                    }
                    vec![a, b]
                } else {
                    vec![a]
                };
                // Some flows have a ceiling of their own (a collective on few channels).
                let ceiling = if rng.random_bool(0.3) { rng.random_range(0.5..60.0f64) * 1e9 } else { f64::INFINITY };
                live.push(net.add_capped(now, &route, rng.random_range(1.0..1e9f64), ceiling));
            }
            let expect = max_min_rates_capped(&caps, &net.live_routes(), &net.live_caps());
            let got: Vec<f64> = net.live_rates().into_iter().map(|(_, r)| r).collect();
            assert_eq!(expect.len(), got.len());
            for (e, g) in expect.iter().zip(&got) {
                assert!(close(*e, *g), "case {case}: fast {g} vs slow {e}");
            }
        }
    }
}

#[test]
fn fair_shares_never_exceed_capacity_and_saturate_a_bottleneck() {
    let caps = [10.0, 4.0, 6.0];
    let flows = vec![vec![0, 1], vec![0, 2], vec![1], vec![2, 0]];
    let r = max_min_rates(&caps, &flows);
    for (k, cap) in caps.iter().enumerate() {
        let used: f64 = flows.iter().zip(&r).filter(|(f, _)| f.contains(&(k as u32))).map(|(_, x)| x).sum();
        assert!(used <= cap + 1e-9, "link {k} over capacity: {used} > {cap}");
    }
    // Link 1 (4) is shared by flows 0 and 2: 2 each. Link 2 (6) then gives 3 each to 1, 3.
    assert_eq!(r, vec![2.0, 3.0, 2.0, 3.0]);
    // A ceiling of 1 on flow 0 leaves link 1's other 3 to flow 2; link 0 (10) then has 9 for
    // flows 1 and 3, but link 2 (6) limits them to 3 each.
    let r = max_min_rates_capped(&caps, &flows, &[1.0, f64::INFINITY, f64::INFINITY, f64::INFINITY]);
    assert_eq!(r, vec![1.0, 3.0, 3.0, 3.0]);
}

#[test]
fn ideal_network_ignores_other_flows() {
    let mut net = Network::new(NetworkKind::Ideal, &[8.0e9, 2.0e9]);
    let a = net.add(0, &[0, 1], 1e9);
    let b = net.add(0, &[0, 1], 1e9);
    assert_eq!(net.rate(a), 2.0e9);
    assert_eq!(net.rate(b), 2.0e9);
}

#[test]
fn a_finished_neighbour_speeds_up_the_survivor_and_reschedules_it() {
    let mut net = Network::new(NetworkKind::MaxMinFair, &[1e9]);
    let mut ch = Vec::new();
    let a = net.add(0, &[0], 1e9);
    let b = net.add(0, &[0], 0.5e9);
    net.drain_changes(&mut ch);
    // Both at 0.5 GB/s: b finishes at 1 s, a would at 2 s. a's event stays where it was queued
    // alone (1 s): a rate that falls queues nothing; due then, it says a finishes at 2 s.
    let fin = |ch: &[Reschedule], id| ch.iter().rev().find(|c| c.id == id).map(|c| c.finish_ns);
    assert_eq!(fin(&ch, b), Some(1_000_000_000));
    assert_eq!(fin(&ch, a), Some(1_000_000_000));
    assert_eq!(net.due(a, 1_000_000_000), Some(2_000_000_000));
    assert_eq!(net.due(b, 1_000_000_000), None, "b is done");
    ch.clear();
    net.remove(1_000_000_000, b);
    net.drain_changes(&mut ch);
    // a has 0.5 GB left at the full 1 GB/s: done at 1.5 s.
    assert_eq!(fin(&ch, a), Some(1_500_000_000));
    assert_eq!(ch.last().map(|c| c.version), Some(net.version(a)));
}

/// Deferred adds and removes settled once per instant give the rates of applying them one by
/// one (the slow reference over the live flows), and every new flow is scheduled at its finish
/// under the settled rate (one whose rate fell keeps its queued event, which then queues it).
#[test]
fn deferred_changes_settled_per_instant_match_the_reference() {
    let mut rng = Pcg64Mcg::seed_from_u64(11);
    for case in 0..300 {
        let links = rng.random_range(1..10usize);
        let caps: Vec<f64> = (0..links).map(|_| rng.random_range(1.0..100.0f64).round() * 1e9).collect();
        let mut net = Network::new(NetworkKind::MaxMinFair, &caps);
        let mut live: Vec<FlowId> = Vec::new();
        let mut now = 0u64;
        let mut ch = Vec::new();
        for _ in 0..rng.random_range(1..15usize) {
            now += rng.random_range(1..1000u64);
            // Several changes at one instant, then one settle.
            let mut added = Vec::new();
            for _ in 0..rng.random_range(1..8usize) {
                if !live.is_empty() && rng.random_range(0..3u32) == 0 {
                    let i = rng.random_range(0..live.len());
                    let gone = live.swap_remove(i);
                    added.retain(|&f| f != gone);
                    net.remove_deferred(gone);
                } else {
                    let a = rng.random_range(0..links) as u32;
                    let route =
                        if links > 1 && rng.random_bool(0.7) { vec![a, (a + 1) % links as u32] } else { vec![a] };
                    let ceiling =
                        if rng.random_bool(0.3) { rng.random_range(0.5..60.0f64) * 1e9 } else { f64::INFINITY };
                    let id = net.add_deferred(now, &route, rng.random_range(1.0..1e9f64), ceiling);
                    live.push(id);
                    added.push(id);
                }
            }
            net.settle(now);
            assert!(!net.unsettled());
            let expect = max_min_rates_capped(&caps, &net.live_routes(), &net.live_caps());
            let got: Vec<f64> = net.live_rates().into_iter().map(|(_, r)| r).collect();
            for (e, g) in expect.iter().zip(&got) {
                assert!(close(*e, *g), "case {case}: deferred {g} vs slow {e}");
            }
            ch.clear();
            net.drain_changes(&mut ch);
            for id in added {
                assert!(
                    ch.iter().any(|c| c.id == id && c.version == net.version(id)),
                    "case {case}: new flow {id} not scheduled"
                );
            }
        }
    }
}

/// A ceiling changed mid-flow: the bytes moved so far stay moved, the rest go at the new rate,
/// in both network kinds; under fair sharing the allocation after every instant of adds,
/// removes and ceiling changes is the reference's over the live ceilings, and a ceiling above a
/// link-bound flow's rate leaves every rate as it was.
#[test]
fn a_changed_ceiling_applies_from_now_on() {
    for kind in [NetworkKind::MaxMinFair, NetworkKind::Ideal] {
        let mut net = Network::new(kind, &[10e9]);
        let id = net.add_deferred(0, &[0], 10e9, f64::INFINITY);
        net.settle(0);
        let mut ch = Vec::new();
        net.drain_changes(&mut ch);
        assert_eq!(ch.last().map(|c| c.finish_ns), Some(1_000_000_000));
        // Half moved at 0.5 s; the other 5 GB at 5 GB/s: done at 1.5 s (the event queued for
        // 1 s, or one queued anew, says so when due).
        net.set_cap_deferred(500_000_000, id, 5e9);
        net.settle(500_000_000);
        assert_eq!(net.due(id, 1_000_000_000), Some(1_500_000_000), "{kind:?}");
        assert_eq!(net.due(id, 1_500_000_000), None, "{kind:?}");
    }
    // Two flows share 10 GB/s: a ceiling of 8 over one changes nothing, one of 2 gives the other 8.
    let mut net = Network::new(NetworkKind::MaxMinFair, &[10e9]);
    let a = net.add_deferred(0, &[0], 1e9, f64::INFINITY);
    let b = net.add_deferred(0, &[0], 1e9, f64::INFINITY);
    net.settle(0);
    net.set_cap_deferred(10, a, 8e9);
    assert!(!net.unsettled(), "a ceiling above the flow's rate re-rates nothing");
    net.set_cap_deferred(20, a, 2e9);
    net.settle(20);
    assert!(close(net.rate(a), 2e9) && close(net.rate(b), 8e9));
    // Random instants of adds, removes and ceiling changes against the reference.
    let mut rng = Pcg64Mcg::seed_from_u64(13);
    for case in 0..200 {
        let links = rng.random_range(1..8usize);
        let caps: Vec<f64> = (0..links).map(|_| rng.random_range(1.0..100.0f64).round() * 1e9).collect();
        let mut net = Network::new(NetworkKind::MaxMinFair, &caps);
        let mut live: Vec<FlowId> = Vec::new();
        let mut now = 0u64;
        for _ in 0..rng.random_range(1..15usize) {
            now += rng.random_range(1..1000u64);
            for _ in 0..rng.random_range(1..6usize) {
                match rng.random_range(0..3u32) {
                    0 if !live.is_empty() => {
                        let i = rng.random_range(0..live.len());
                        net.remove_deferred(live.swap_remove(i));
                    }
                    1 if !live.is_empty() => {
                        let i = rng.random_range(0..live.len());
                        let ceiling =
                            if rng.random_bool(0.2) { f64::INFINITY } else { rng.random_range(0.5..60.0f64) * 1e9 };
                        net.set_cap_deferred(now, live[i], ceiling);
                    }
                    _ => {
                        let a = rng.random_range(0..links) as u32;
                        let route =
                            if links > 1 && rng.random_bool(0.7) { vec![a, (a + 1) % links as u32] } else { vec![a] };
                        live.push(net.add_deferred(now, &route, rng.random_range(1.0..1e9f64), f64::INFINITY));
                    }
                }
            }
            net.settle(now);
            let expect = max_min_rates_capped(&caps, &net.live_routes(), &net.live_caps());
            let got: Vec<f64> = net.live_rates().into_iter().map(|(_, r)| r).collect();
            for (e, g) in expect.iter().zip(&got) {
                assert!(close(*e, *g), "case {case}: with changed ceilings {g} vs slow {e}");
            }
        }
    }
}
