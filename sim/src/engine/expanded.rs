//! A collective's steps as the engine runs them: routes resolved, mirrored devices mapped
//! onto the simulated ones, and consecutive ring steps over the same pairs merged.

use super::collective::{Steps, expand, nccl_plan};
use crate::hardware::Topology;
use crate::lower::{Collective, NONE, Program};

/// A collective's expansion with routes resolved and symmetry applied.
pub(super) struct Expanded {
    pub(super) steps: Vec<ExpStep>,
    /// SMs its kernel holds on each member (NCCL's channels; 0 off GPUs).
    pub(super) sms: u32,
    /// Simulated members, as device indices.
    pub(super) members: Vec<u32>,
}

pub(super) struct ExpStep {
    /// (links, bytes, source, target, ceiling in bytes/s)
    pub(super) flows: Vec<([u32; 2], f64, u32, u32, f64)>,
    pub(super) latency_ns: u64,
}

fn ns(s: f64) -> u64 {
    (s * 1e9).round() as u64
}

impl Expanded {
    pub(super) fn new(col: &Collective, p: &Program, topo: &Topology) -> Expanded {
        let steps: Steps = expand(col, topo);
        let simulated = |d: u32| {
            let m = p.mirror[d as usize];
            m != NONE && p.devices[m as usize] == d
        };
        let map = |d: u32| p.devices[p.mirror[d as usize] as usize];
        // `calls` back-to-back calls: every step pays its latency and moves its bytes that
        // many times (as merged ring steps do, below).
        let calls = col.calls.max(1) as f64;
        let steps = steps
            .into_iter()
            .map(|st| {
                let mut latency = 0.0f64;
                let chain = st.chain;
                let fixed = st.latency_s;
                let flows = st
                    .flows
                    .iter()
                    .filter(|f| simulated(f.source))
                    .map(|f| {
                        let r = topo.route(f.source, f.target);
                        latency = if chain { latency + r.latency_s } else { latency.max(r.latency_s) };
                        let mut links = r.links;
                        if p.symmetric {
                            for l in links.iter_mut() {
                                *l = topo.map_link(*l, &map);
                            }
                        }
                        (links, f.bytes * calls, f.source, f.target, f.cap_bytes_per_s)
                    })
                    .collect();
                (ExpStep { flows, latency_ns: ns(fixed.unwrap_or(latency) * calls) }, chain)
            })
            .collect::<Vec<_>>();
        let members = col.members.iter().filter(|&&d| simulated(d)).map(|&d| p.mirror[d as usize]).collect();
        let sms = nccl_plan(col, topo).map_or(0, |plan| plan.channels);
        Expanded { steps: merge_ring_runs(steps), members, sms }
    }
}

/// Consecutive ring steps over the same pairs move the same bytes over the same links, one
/// after another: one step of their summed bytes and latencies costs the same without other
/// traffic, and the engine far fewer flows. Chained steps are kept apart.
fn merge_ring_runs(steps: Vec<(ExpStep, bool)>) -> Vec<ExpStep> {
    let mut merged: Vec<ExpStep> = Vec::with_capacity(steps.len());
    let mut last_chain = true;
    for (st, chain) in steps {
        let same = !chain
            && !last_chain
            && merged.last().is_some_and(|m: &ExpStep| {
                m.flows.len() == st.flows.len()
                    && m.flows.iter().zip(&st.flows).all(|(a, b)| a.0 == b.0 && a.2 == b.2 && a.3 == b.3 && a.4 == b.4)
            });
        if same {
            let m = merged.last_mut().expect("checked");
            for (a, b) in m.flows.iter_mut().zip(&st.flows) {
                a.1 += b.1;
            }
            m.latency_ns += st.latency_ns;
        } else {
            merged.push(st);
        }
        last_chain = chain;
    }
    merged
}
