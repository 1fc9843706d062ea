//! Incremental max-min fair sharing: only the connected component of flows reachable from
//! the changed flow through shared links is re-rated (progressive filling on that
//! component). Components are small in training traffic (a ring step touches a few ports),
//! so a change costs little however many flows run elsewhere.

use super::{Network, Reschedule, finish_ns};

#[derive(Default)]
pub struct Scratch {
    flows: Vec<u32>,
    links: Vec<u32>,
    link_left: Vec<f64>,
    link_count: Vec<u32>,
    frozen: Vec<bool>,
    link_mark: Vec<u32>,
    /// The component's rates before re-rating (empty for a lone flow).
    old_rates: Vec<f64>,
}

pub(super) fn rerate_component(net: &mut Network, now: u64, seed: u32) {
    let epoch = net.epoch;
    let s = &mut net.scratch;
    if s.link_mark.len() < net.capacity.len() {
        s.link_mark.resize(net.capacity.len(), u32::MAX);
    }
    s.flows.clear();
    s.links.clear();
    // Breadth-first search over flow -> links -> flows.
    net.flows[seed as usize].mark = epoch;
    s.flows.push(seed);
    let mut head = 0;
    while head < s.flows.len() {
        let f = s.flows[head];
        head += 1;
        let fl = &net.flows[f as usize];
        let (links, len) = (fl.links, fl.len as usize);
        for &k in &links[..len] {
            if s.link_mark[k as usize] == epoch {
                continue;
            }
            s.link_mark[k as usize] = epoch;
            s.links.push(k);
            for &g in &net.on_link[k as usize] {
                let gf = &mut net.flows[g as usize];
                if gf.mark != epoch {
                    gf.mark = epoch;
                    s.flows.push(g);
                }
            }
        }
    }
    // Settle progress at the old rates, then progressive filling on the component.
    for &f in &s.flows {
        net.flows[f as usize].advance(now);
    }
    let nl = s.links.len();
    s.link_left.clear();
    s.link_count.clear();
    for &k in &s.links {
        s.link_left.push(net.capacity[k as usize]);
        s.link_count.push(net.on_link[k as usize].len() as u32);
    }
    s.frozen.clear();
    s.frozen.resize(s.flows.len(), false);
    // Position of each link in the component's arrays, via a sorted lookup (components are
    // tiny; a linear scan is fastest).
    let pos = |links: &[u32], k: u32| links.iter().position(|&x| x == k).expect("link in component");
    let mut unfrozen = s.flows.len();
    s.old_rates.clear();
    if s.flows.len() > 1 {
        s.old_rates.extend(s.flows.iter().map(|&f| net.flows[f as usize].rate));
    }
    while unfrozen > 0 {
        let mut best = f64::INFINITY;
        let mut best_link = usize::MAX;
        for i in 0..nl {
            if s.link_count[i] > 0 {
                let share = s.link_left[i] / s.link_count[i] as f64;
                if share < best {
                    best = share;
                    best_link = i;
                }
            }
        }
        debug_assert!(best_link != usize::MAX);
        // A flow whose ceiling is below the fair share freezes at its ceiling first.
        let mut capped = usize::MAX;
        for j in 0..s.flows.len() {
            let c = net.flows[s.flows[j] as usize].cap;
            if !s.frozen[j] && c < best && (capped == usize::MAX || c < net.flows[s.flows[capped] as usize].cap) {
                capped = j;
            }
        }
        if capped != usize::MAX {
            s.frozen[capped] = true;
            unfrozen -= 1;
            let fl = &mut net.flows[s.flows[capped] as usize];
            fl.rate = fl.cap;
            for &l in &fl.links[..fl.len as usize] {
                let p = pos(&s.links, l);
                s.link_left[p] -= fl.cap;
                s.link_count[p] -= 1;
            }
            continue;
        }
        let k = s.links[best_link];
        for j in 0..s.flows.len() {
            if s.frozen[j] {
                continue;
            }
            let f = s.flows[j];
            let fl = &mut net.flows[f as usize];
            if !fl.links[..fl.len as usize].contains(&k) {
                continue;
            }
            s.frozen[j] = true;
            unfrozen -= 1;
            fl.rate = best;
            for &l in &fl.links[..fl.len as usize] {
                let p = pos(&s.links, l);
                s.link_left[p] -= best;
                s.link_count[p] -= 1;
            }
        }
    }
    for (j, &f) in s.flows.iter().enumerate() {
        let fl = &mut net.flows[f as usize];
        // A flow whose rate did not change keeps its scheduled finish (a new flow's rate was
        // 0, so it is always scheduled; so is a lone flow, which has no old rates).
        if f != seed && !s.old_rates.is_empty() && s.old_rates[j] == fl.rate {
            continue;
        }
        let fin = finish_ns(now, fl.remaining_bytes, fl.rate);
        fl.finish_ns = fin;
        // Finishing no earlier than its queued event: that event, when due, queues this one
        // (a new flow has none queued).
        if fl.queued_ns != u64::MAX && fin >= fl.queued_ns {
            continue;
        }
        fl.queued_ns = fin;
        fl.version = fl.version.wrapping_add(1);
        net.changes.push(Reschedule { id: f, version: fl.version, finish_ns: fin });
    }
}
