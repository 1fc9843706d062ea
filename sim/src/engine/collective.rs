//! Collectives as steps of point-to-point flows over the real topology.
//!
//! A ring over p members moves n/p bytes per member per step: all-reduce takes 2(p-1)
//! steps (reduce-scatter then all-gather), reduce-scatter and all-gather p-1 each. When
//! the members span several nodes with k > 1 members on each, the collective is
//! hierarchical, as NCCL and Horovod do:
//!
//! ```text
//! all-reduce(n) = reduce-scatter(n) inside each node      k-1 steps of n/k over NVLink
//!               + all-reduce(n/k) across nodes, k rings    2(N-1) steps of n/(kN) over NICs
//!               + all-gather(n) inside each node           k-1 steps of n/k
//! ```
//! Every step ends when its slowest flow ends (the members synchronise each step).
//!
//! On NVIDIA GPUs collectives run as NCCL runs them instead ([`nccl_steps`]): NCCL's
//! algorithm and protocol for the message size ([`crate::hardware::nccl`]), its latency, and
//! flat rings that cross nodes through every NIC (one ring per NIC, NCCL's channels), with a
//! ceiling on each flow for the protocol's and the channels' bandwidth.
//!
//! Other GPUs (AMD's: RCCL, whose algorithms and tuning differ from NCCL's), CPUs and FPGAs
//! take the rings above. In a node whose devices form a mesh (AMD Infinity Fabric) a flow
//! between two of the node's devices is capped by the links it can use ([`cap_mesh_flows`]).
//!
//! An all-to-all sends a distinct `n/p` block to every other member, all at once: one step of
//! direct flows off NVIDIA GPUs, NCCL's grouped send/recv on them ([`nccl_all_to_all`]).

use std::collections::{BTreeMap, HashMap};

use crate::hardware::nccl::{self, Algo, Coll, Plan, Shape};
use crate::hardware::nccl_p2p::{AllToAll, PairPlan};
use crate::hardware::{LinkId, Topology};
use crate::lower::{Collective, CollectiveKind, Program};

/// One flow of a step, in cluster device numbering.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepFlow {
    pub source: u32,
    pub target: u32,
    pub bytes: f64,
    /// The flow's own ceiling (bytes/s), infinite when only the links limit it.
    pub cap_bytes_per_s: f64,
}

/// One step: flows that all start together; the step ends with the last. A chain's hops
/// (broadcast, reduce) forward data as it arrives, so their latencies add up.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Step {
    pub flows: Vec<StepFlow>,
    pub chain: bool,
    /// Fixed time before the step's flows start; `None`: the routes' latencies.
    pub latency_s: Option<f64>,
}

pub type Steps = Vec<Step>;

fn ring_steps(out: &mut Steps, rings: &[Vec<u32>], steps: u32, chunk_bytes: f64) {
    for _ in 0..steps {
        let mut step = Vec::new();
        for ring in rings {
            let p = ring.len();
            for i in 0..p {
                step.push(StepFlow {
                    source: ring[i],
                    target: ring[(i + 1) % p],
                    bytes: chunk_bytes,
                    cap_bytes_per_s: f64::INFINITY,
                });
            }
        }
        out.push(Step { flows: step, chain: false, latency_s: None });
    }
}

/// Expand a collective into its steps.
pub fn expand(c: &Collective, topo: &Topology) -> Steps {
    let mut out = expand_steps(c, topo);
    cap_mesh_flows(&mut out, &c.members, topo);
    cap_pod_flows(&mut out, c, topo);
    out
}

/// Across a fabric of pods (`cluster.fabric`, `hardware::fabric`) a flow that leaves its pod
/// shares the pod's uplinks with the step's other flows leaving it, and with those of the
/// collectives that run the same pattern at the same moment on the node's other devices (a
/// symmetric plan's other tensor ranks or replicas: devices per node over the collective's
/// members per node); likewise the target pod's downlinks. It runs no faster than its share.
/// A ring runs at its slowest flow's pace (NCCL pipelines chunks around it), so every flow of
/// a ring step takes the step's smallest share, which keeps the answer the same when only
/// some members are simulated; an all-to-all's and a chain's flows keep their own. NCCL's
/// rings and relayed all-to-all blocks stay on their rails. Each network hop the algorithm
/// takes in sequence across the level above also pays the fabric's latency (for NCCL's
/// fixed latency; other steps' routes carry it).
fn cap_pod_flows(steps: &mut Steps, c: &Collective, topo: &Topology) {
    if !topo.has_pods() {
        return;
    }
    let per_node = by_node(&c.members, topo).iter().map(|(_, v)| v.len()).max().unwrap_or(1);
    let siblings = (topo.devices_per_node as usize / per_node).max(1) as f64;
    let own_caps = c.kind == CollectiveKind::AllToAll;
    let matched = c.kind != CollectiveKind::AllToAll;
    let hops = pod_hops(c, topo) as f64;
    for step in steps.iter_mut() {
        let per_flow = own_caps || step.chain;
        let mut out: BTreeMap<(u32, u32), (f64, f64)> = BTreeMap::new();
        let mut inn: BTreeMap<(u32, u32), (f64, f64)> = BTreeMap::new();
        for f in &step.flows {
            if topo.crosses_pods(f.source, f.target, matched) {
                for (map, d) in [(&mut out, f.source), (&mut inn, f.target)] {
                    let (key, rate) = topo.uplink(d).expect("a fabric");
                    map.entry(key).or_insert((0.0, rate)).0 += 1.0;
                }
            }
        }
        if out.is_empty() {
            continue;
        }
        let share = |d: u32, map: &BTreeMap<(u32, u32), (f64, f64)>| {
            let (key, _) = topo.uplink(d).expect("a fabric");
            map.get(&key).map_or(f64::INFINITY, |&(n, rate)| rate / (n * siblings))
        };
        let mut slowest = f64::INFINITY;
        for f in step.flows.iter_mut() {
            if !topo.crosses_pods(f.source, f.target, matched) {
                continue;
            }
            let s = share(f.source, &out).min(share(f.target, &inn));
            slowest = slowest.min(s);
            if per_flow {
                f.cap_bytes_per_s = f.cap_bytes_per_s.min(s);
            }
        }
        if !per_flow {
            for f in step.flows.iter_mut() {
                f.cap_bytes_per_s = f.cap_bytes_per_s.min(slowest);
            }
        }
        if let Some(lat) = step.latency_s.as_mut() {
            *lat += hops * topo.pod_latency_s();
        }
    }
}

/// Network hops a collective takes one after another (NCCL's algorithm): a ring's steps, a
/// tree's way up and down, an all-to-all's one exchange.
fn pod_hops(c: &Collective, topo: &Topology) -> u32 {
    let p = c.members.len() as u32;
    let nodes = by_node(&c.members, topo).len() as u32;
    match nccl_plan(c, topo).map(|plan| plan.algo) {
        Some(Algo::P2p) => 1,
        Some(Algo::Tree | Algo::Nvls) => 2 * nodes.next_power_of_two().trailing_zeros().max(1),
        _ if c.kind == CollectiveKind::AllReduce => 2 * (p - 1),
        _ => p.saturating_sub(1).max(1),
    }
}

/// In a mesh node ([`Topology::is_mesh`]) a flow between two of the node's devices runs no
/// faster than the direct links it can use: a chain's hop (broadcast, reduce) one link; a
/// ring step among k of the node's members k - 1 links, each member spreading its share over
/// its links to the others at once (RCCL runs channels over all the mesh's links; AMD
/// measures 310-330 GB/s of all-reduce bus bandwidth on 8 x MI300X, 7 links' worth, and
/// notes that 2 or 4 GPUs reach only a fraction of it).
fn cap_mesh_flows(steps: &mut Steps, members: &[u32], topo: &Topology) {
    if !topo.is_mesh() {
        return;
    }
    let nodes = by_node(members, topo);
    for step in steps.iter_mut() {
        for f in &mut step.flows {
            if !topo.same_switch(f.source, f.target) {
                continue;
            }
            let k = if step.chain {
                2
            } else {
                let node = topo.node_of(f.source);
                nodes.iter().find(|(n, _)| *n == node).map_or(2, |(_, v)| v.len())
            };
            f.cap_bytes_per_s = f.cap_bytes_per_s.min(topo.group_cap(k));
        }
    }
}

fn expand_steps(c: &Collective, topo: &Topology) -> Steps {
    let p = c.members.len() as u32;
    let mut out = Vec::new();
    if p <= 1 || c.bytes <= 0.0 {
        return out;
    }
    if let Some(steps) = nccl_steps(c, topo) {
        return steps;
    }
    // All-to-all: every member sends n/p to every other member at once, over its routes.
    if c.kind == CollectiveKind::AllToAll {
        let block = c.bytes / p as f64;
        let m = &c.members;
        let flows = m.iter().flat_map(|&a| {
            m.iter().filter(move |&&b| b != a).map(move |&b| StepFlow {
                source: a,
                target: b,
                bytes: block,
                cap_bytes_per_s: f64::INFINITY,
            })
        });
        out.push(Step { flows: flows.collect(), chain: false, latency_s: None });
        return out;
    }
    // Broadcast and reduce: a pipelined chain from (to) the first member; all hops move the
    // whole message at once, so the chain costs its latency plus n / bandwidth.
    if matches!(c.kind, CollectiveKind::Broadcast | CollectiveKind::Reduce) {
        let m = &c.members;
        let hops = (0..m.len() - 1).map(|i| {
            let (a, b) = if c.kind == CollectiveKind::Broadcast { (m[i], m[i + 1]) } else { (m[i + 1], m[i]) };
            StepFlow { source: a, target: b, bytes: c.bytes, cap_bytes_per_s: f64::INFINITY }
        });
        out.push(Step { flows: hops.collect(), chain: true, latency_s: None });
        return out;
    }
    let nodes = by_node(&c.members, topo);
    let k = nodes[0].1.len();
    let hierarchical = nodes.len() > 1
        && k > 1
        && nodes.iter().all(|(_, v)| v.len() == k)
        && topo.same_switch(nodes[0].1[0], nodes[0].1[1]);
    let n = c.bytes;
    if !hierarchical {
        let ring = vec![c.members.clone()];
        let steps = match c.kind {
            CollectiveKind::AllReduce => 2 * (p - 1),
            _ => p - 1,
        };
        ring_steps(&mut out, &ring, steps, n / p as f64);
        return out;
    }
    let intra: Vec<Vec<u32>> = nodes.iter().map(|(_, v)| v.clone()).collect();
    let inter: Vec<Vec<u32>> = (0..k).map(|i| nodes.iter().map(|(_, v)| v[i]).collect()).collect();
    let (k32, nn) = (k as u32, nodes.len() as u32);
    let kf = k as f64;
    let shard = n / kf / nn as f64;
    match c.kind {
        CollectiveKind::AllReduce => {
            ring_steps(&mut out, &intra, k32 - 1, n / kf);
            ring_steps(&mut out, &inter, 2 * (nn - 1), shard);
            ring_steps(&mut out, &intra, k32 - 1, n / kf);
        }
        CollectiveKind::ReduceScatter => {
            ring_steps(&mut out, &intra, k32 - 1, n / kf);
            ring_steps(&mut out, &inter, nn - 1, shard);
        }
        CollectiveKind::AllGather => {
            ring_steps(&mut out, &inter, nn - 1, shard);
            ring_steps(&mut out, &intra, k32 - 1, n / kf);
        }
        CollectiveKind::Broadcast | CollectiveKind::Reduce | CollectiveKind::AllToAll => {
            unreachable!("handled above")
        }
    }
    out
}

/// Members grouped by node, keeping ring order.
pub(super) fn by_node(members: &[u32], topo: &Topology) -> Vec<(u32, Vec<u32>)> {
    let mut nodes: Vec<(u32, Vec<u32>)> = Vec::new();
    // Each node's place in `nodes`, looked up directly once there are many.
    let mut index: HashMap<u32, usize> = HashMap::new();
    for &m in members {
        let n = topo.node_of(m);
        // Members mostly come node by node: the last node seen is the likely one.
        let at = match nodes.last() {
            Some((x, _)) if *x == n => Some(nodes.len() - 1),
            _ => index.get(&n).copied(),
        };
        match at {
            Some(i) => nodes[i].1.push(m),
            None => {
                index.insert(n, nodes.len());
                nodes.push((n, vec![m]));
            }
        }
    }
    nodes
}

/// NCCL's rings over a collective's members: inside a node in the members' order, then on to
/// the next node. Across nodes with k > 1 members on each there is one ring per NIC used
/// (at most k), each entering and leaving every node through a different GPU and so a
/// different NIC, as NCCL's channels do; each ring carries an equal part of the message.
fn nccl_rings(members: &[u32], topo: &Topology) -> Vec<Vec<u32>> {
    let nodes = by_node(members, topo);
    let k = nodes[0].1.len();
    let even = nodes.iter().all(|(_, v)| v.len() == k);
    if nodes.len() == 1 || k == 1 || !even || !topo.same_switch(nodes[0].1[0], nodes[0].1[1]) {
        return vec![members.to_vec()];
    }
    let rings = (topo.nics as usize).min(k).max(1);
    (0..rings)
        .map(|r| {
            let shift = r * k / rings;
            nodes.iter().flat_map(|(_, v)| (0..k).map(move |i| v[(i + shift) % k])).collect()
        })
        .collect()
}

/// The first collective of `p` to which the run's `NCCL_ALGO`/`NCCL_PROTO` leave no algorithm
/// and protocol, said as NCCL would fail it; `None` when every one can run (always, unless the
/// run restricts NCCL).
pub fn nccl_refusal(p: &Program, topo: &Topology) -> Option<String> {
    let env = &topo.nccl().filter(|s| s.env.restricted())?.env;
    let c = p.collectives.iter().find(|c| {
        c.kind != CollectiveKind::AllToAll && c.members.len() > 1 && c.bytes > 0.0 && nccl_plan(c, topo).is_none()
    })?;
    let kind = match c.kind {
        CollectiveKind::AllReduce => "all-reduce",
        CollectiveKind::ReduceScatter => "reduce-scatter",
        CollectiveKind::AllGather => "all-gather",
        CollectiveKind::Broadcast => "broadcast",
        CollectiveKind::Reduce => "reduce",
        CollectiveKind::AllToAll => "all-to-all",
    };
    Some(format!(
        "cluster.nccl: {} leaves none of the algorithms and protocols trainsim models for a {:.3} MB {kind} over {} \
         GPUs on {} node(s): NCCL fails such a call ('no algorithm/protocol available') unless it has one the model \
         leaves out (NVLS all-gather and reduce-scatter, NVLS-Tree, CollNet, PAT); allow ring with Simple, which runs \
         every collective",
        env.describe(),
        c.bytes / 1e6,
        c.members.len(),
        by_node(&c.members, topo).len()
    ))
}

/// What NCCL would do for this collective on this topology (`None` off NVIDIA GPUs, or when
/// the run's `NCCL_ALGO`/`NCCL_PROTO` allow nothing for it: see [`nccl_refusal`]).
pub fn nccl_plan(c: &Collective, topo: &Topology) -> Option<Plan> {
    let sys = topo.nccl()?;
    let p = c.members.len() as u32;
    if p < 2 || c.bytes <= 0.0 {
        return None;
    }
    if c.kind == CollectiveKind::AllToAll {
        return nccl_all_to_all(c, topo).map(|(plan, _)| plan);
    }
    let nodes = by_node(&c.members, topo).len() as u32;
    let rings = nccl_rings(&c.members, topo).len() as f64;
    let link = if nodes == 1 {
        sys.intra_bytes_per_s
    } else if rings > 1.0 {
        sys.intra_bytes_per_s.min(rings * topo.nic_bytes_per_s())
    } else {
        topo.nic_bytes_per_s()
    };
    let coll = match c.kind {
        CollectiveKind::AllReduce => Coll::AllReduce,
        CollectiveKind::ReduceScatter => Coll::ReduceScatter,
        CollectiveKind::AllGather => Coll::AllGather,
        CollectiveKind::Broadcast => Coll::Broadcast,
        CollectiveKind::Reduce => Coll::Reduce,
        CollectiveKind::AllToAll => unreachable!("handled above"),
    };
    let shape = Shape { coll, ranks: p, nodes, bytes: c.bytes, link_bus_bytes_per_s: link };
    if nodes > 1 {
        // Across nodes the communicator's channels are its inter-node graph's, one ring per
        // NIC used (a single one where each node holds one member).
        return nccl::choose(&sys.across_nodes(rings as u32), &shape);
    }
    nccl::choose(sys, &shape)
}

/// The collective as NCCL runs it: one step holding all its bytes (a ring's steps move the
/// same bytes over the same pairs, so the engine would merge them anyway), NCCL's latency
/// before it, and each flow no faster than the plan's bus bandwidth allows.
pub fn nccl_steps(c: &Collective, topo: &Topology) -> Option<Steps> {
    if c.kind == CollectiveKind::AllToAll {
        return nccl_all_to_all(c, topo).map(|(_, steps)| steps);
    }
    let plan = nccl_plan(c, topo)?;
    let n = c.bytes;
    let p = c.members.len();
    let wire = plan.wire_factor;
    let flow = |source: u32, target: u32, bytes: f64, cap: f64| StepFlow {
        source,
        target,
        bytes: bytes * wire,
        cap_bytes_per_s: cap * wire,
    };
    let (flows, chain) = match (plan.algo, c.kind) {
        (_, CollectiveKind::AllToAll) | (Algo::P2p, _) => unreachable!("all-to-all is handled above"),
        (_, CollectiveKind::Broadcast | CollectiveKind::Reduce) => {
            let m = &c.members;
            let hops = (0..p - 1).map(|i| {
                let (a, b) = if c.kind == CollectiveKind::Broadcast { (m[i], m[i + 1]) } else { (m[i + 1], m[i]) };
                flow(a, b, n, plan.bus_bytes_per_s)
            });
            (hops.collect(), true)
        }
        (Algo::Nvls, _) => {
            // Each GPU's port carries (p+1)/p of the buffer each way (`nccl::candidates`).
            let m = &c.members;
            let bytes = n * plan.link_bytes_per_byte;
            ((0..p).map(|i| flow(m[i], m[(i + 1) % p], bytes, plan.bus_bytes_per_s)).collect(), false)
        }
        _ => {
            let rings = nccl_rings(&c.members, topo);
            let r = rings.len() as f64;
            // Each link of a ring carries link_bytes_per_byte x n / r over the whole collective,
            // except a two-node tree's hops between the nodes: they carry the message once
            // each way (`nccl::candidates`), half what the chain inside a node carries.
            let bytes = n * plan.link_bytes_per_byte / r;
            let two_node_tree = plan.algo == Algo::Tree && by_node(&c.members, topo).len() == 2;
            let mut flows = Vec::with_capacity(rings.len() * p);
            for ring in &rings {
                for i in 0..p {
                    let (a, b) = (ring[i], ring[(i + 1) % p]);
                    let hop = if two_node_tree && topo.node_of(a) != topo.node_of(b) { bytes / 2.0 } else { bytes };
                    flows.push(flow(a, b, hop, plan.bus_bytes_per_s / r));
                }
            }
            (flows, false)
        }
    };
    Some(vec![Step { flows, chain, latency_s: Some(plan.latency_s) }])
}

/// What a flow or a link carries: data bytes, wire bytes, ceiling in wire bytes/s.
type Load = (f64, f64, f64);

/// An all-to-all as NCCL runs it: every ordered pair of members moves its `n/p` block at once
/// (grouped send/recv), each pair no faster than its channels ([`AllToAll`]). Inside a node a
/// block goes straight over NVLink (or PCIe). Across nodes of NVLink GPUs it goes, as PXN
/// sends it, over NVLink to the sender's node-mate with the receiver's local index and from
/// there out of that GPU's NIC into the receiver's, so each rail carries its own traffic;
/// without NVLink, or when that node-mate is no member, out of the sender's own NIC. The two
/// legs of a relayed block run together (NCCL pipelines them chunk by chunk). Blocks between
/// the same two devices are one flow, their ceilings summed. Also returns the plan summary:
/// NCCL's channels and latency, and the busiest link's bytes and rate.
pub fn nccl_all_to_all(c: &Collective, topo: &Topology) -> Option<(Plan, Steps)> {
    let sys = topo.nccl()?;
    let p = c.members.len();
    if p < 2 || c.bytes <= 0.0 {
        return None;
    }
    let nodes = by_node(&c.members, topo);
    let local_peers = nodes.iter().any(|(_, v)| v.len() > 1);
    let a2a = AllToAll::new(sys, p as u32, nodes.len() as u32, c.bytes, local_peers, nodes.len() > 1);
    let block = c.bytes / p as f64;
    let dpn = topo.devices_per_node;
    let mut is_member = vec![false; c.members.iter().max().map_or(0, |&d| d as usize + 1)];
    for &d in &c.members {
        is_member[d as usize] = true;
    }
    let member = |d: u32| is_member.get(d as usize).copied().unwrap_or(false);
    let mut pairs: HashMap<(u32, u32), Load> = HashMap::new();
    let mut add = |a: u32, b: u32, pair: &PairPlan| {
        let e = pairs.entry((a, b)).or_insert((0.0, 0.0, 0.0));
        e.0 += block;
        e.1 += block * pair.wire_factor;
        e.2 += pair.cap_bytes_per_s * pair.wire_factor;
    };
    let (intra, inter) = (a2a.intra, a2a.inter);
    for &a in &c.members {
        for &b in &c.members {
            if a == b {
                continue;
            }
            if topo.node_of(a) == topo.node_of(b) {
                add(a, b, intra.as_ref().expect("members share a node"));
                continue;
            }
            let net = inter.as_ref().expect("members on several nodes");
            let relay = topo.node_of(a) * dpn + b % dpn;
            if a2a.pxn && relay != a && member(relay) {
                add(a, relay, net);
                add(relay, b, net);
            } else {
                add(a, b, net);
            }
        }
    }
    // In a fixed order, so that runs are reproducible.
    let mut pairs: Vec<((u32, u32), Load)> = pairs.into_iter().collect();
    pairs.sort_unstable_by_key(|&(k, _)| k);
    // The busiest link relative to its rate (and its flows' ceilings): what bounds the exchange.
    let caps = topo.capacities();
    let mut load: BTreeMap<LinkId, Load> = BTreeMap::new();
    for &((a, b), (data, wire, cap)) in &pairs {
        for &l in topo.route(a, b).links() {
            let e = load.entry(l).or_insert((0.0, 0.0, 0.0));
            e.0 += data;
            e.1 += wire;
            e.2 += cap;
        }
    }
    let (data, wire, rate) = load
        .iter()
        .map(|(&l, &(data, wire, cap))| (data, wire, caps[l as usize].min(cap)))
        .max_by(|x, y| (x.1 / x.2).total_cmp(&(y.1 / y.2)))
        .unwrap_or((block, block, f64::INFINITY));
    let plan = Plan {
        algo: Algo::P2p,
        proto: a2a.proto(),
        channels: a2a.kernel_channels(p as u32),
        max_channels: a2a.channels.total,
        latency_s: a2a.latency_s(),
        bus_bytes_per_s: rate * data / wire,
        full_bus_bytes_per_s: rate * data / wire,
        wire_factor: wire / data,
        link_bytes_per_byte: data / c.bytes,
    };
    let flows = pairs
        .into_iter()
        .map(|((source, target), (_, wire, cap))| StepFlow { source, target, bytes: wire, cap_bytes_per_s: cap })
        .collect();
    Some((plan, vec![Step { flows, chain: false, latency_s: Some(plan.latency_s) }]))
}
