//! Lowering: (workload, plan, cluster) to a [`Program`] of per-device task streams.
//!
//! [`lower`] is a short driver over passes, one file each; every pass of a stage reads the
//! shared [`context::Lowering`] (sizes derived once from the plan) and [`context::Stage`] (the
//! stage's tensor-parallel group, schedule order and parameters), and writes through the
//! [`builder::Builder`] (labels, ops, tasks on streams, collectives, memory events):
//!
//! 1. `blocks`: each block's ops (a transformer layer, the embedding, the head), once per unit
//!    shape and device class.
//! 2. Per stage of each replica:
//!    - `memory`: static memory of the stage's devices (model states after ZeRO sharding and
//!      offload, buffers) and Gemini's chunk placement;
//!    - `walk`: the schedule walk, each (unit, chunk, pass) step expanded into compute tasks
//!      (`compute`, with the tensor-parallel collectives of `tensor_parallel`, recomputation and
//!      gradient accumulation); at its hook points it calls `gather` (ZeRO-3 parameter gathers
//!      and Gemini's moves around each unit), `offload` (activation copies, frozen-cache reads),
//!      `data_parallel` (gradient buckets reduced as soon as backward has produced them, on a
//!      stream of their own) and `p2p` (pipeline sends);
//!    - `optimizer`: the optimizer step after the gradient reduction, on the device or the
//!      host;
//!    - `data_parallel`: ZeRO-1/2's all-gather of the updated parameter shards.
//! 3. `p2p`: every send connected to the step that receives it.
//!
//! Under symmetry (every node holds devices of one data-parallel replica only) only replica
//! 0 is lowered; its data-parallel collectives name the other replicas as members, and the
//! engine maps their links onto replica 0's mirror links. Likewise, where the tensor ranks of
//! a group are interchangeable ([`simulates_one_tensor_rank`]), only rank 0 of each group is
//! lowered: its tensor-parallel collectives still name every rank, and each peer's traffic
//! into it stands for its own traffic into the peer.

pub mod program;
pub mod size;

mod blocks;
mod builder;
mod compute;
mod context;
mod context_parallel;
mod data_parallel;
mod expert_parallel;
mod gather;
mod gemini;
mod memory;
mod offload;
mod optimizer;
mod p2p;
mod tensor_parallel;
mod walk;
pub(crate) use context::tp_sm_share;
pub use program::*;
pub(crate) use tensor_parallel::{PIPELINE_SPLITS, TE_CHUNK_STREAMS, TORCH_CHUNK_STREAMS, chunk_kernels};

use crate::plan::{Plan, Tier};
use crate::scenario::Scenario;
use crate::workload::TpMode;
use builder::Builder;
use context::{Lowering, Stage};
use p2p::Links;

/// Whether one replica can stand for all: each node's devices belong to one replica.
pub fn symmetry_is_exact(plan: &Plan, devices_per_node: u32) -> bool {
    if plan.replicas() <= 1 {
        return false;
    }
    let n = plan.devices();
    (0..n).all(|d| {
        let node_first = d / devices_per_node * devices_per_node;
        plan.coords(d).0 == plan.coords(node_first).0
    })
}

/// Whether the lowering simulates replica 0 only: `simulation.symmetry` where that is exact,
/// or wherever a memory probe asked for it ([`SimOptions::approximate_symmetry`]). It is
/// exact where each node's devices belong to one replica, or where the replicas sharing a
/// node share nothing a mirror would not load ([`peers_share_nothing_unmirrored`]).
///
/// [`SimOptions::approximate_symmetry`]: crate::scenario::SimOptions::approximate_symmetry
pub fn simulates_one_replica(s: &Scenario) -> bool {
    folds(s).replica
}

/// Whether the lowering simulates tensor rank 0 of each group only, its peers mirroring it
/// (`simulation.symmetry`, where that is exact). The ranks of a 1D tensor-parallel group run
/// the same kernels on the same shapes and meet at every collective; folding them is exact
/// where [`peers_share_nothing_unmirrored`].
pub fn simulates_one_tensor_rank(s: &Scenario) -> bool {
    folds(s).rank
}

/// The lowering's folds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Folds {
    /// Replica 0 stands for every replica.
    pub(crate) replica: bool,
    /// Tensor rank 0 stands for its group.
    pub(crate) rank: bool,
    /// How many of its node's devices each simulated device stands for on the node's NVMe
    /// drives (1 without an NVMe tier; see [`nvme_mirrors`]).
    pub(crate) nvme_share: u32,
}

/// The lowering's folds. A node's NVMe drives are shared by its devices: with an NVMe tier,
/// the folds stand only where each simulated device stands for the same number of its own
/// node's devices ([`nvme_mirrors`]), whose identical flows the engine charges by dividing
/// the drives' bandwidth by that number; elsewhere only node-aligned replicas fold.
pub(crate) fn folds(s: &Scenario) -> Folds {
    let plan = &s.plan;
    let none = Folds { replica: false, rank: false, nvme_share: 1 };
    if !s.options.symmetry {
        return none;
    }
    let aligned =
        plan.replicas() > 1 && (s.options.approximate_symmetry || symmetry_is_exact(plan, s.cluster.node.devices));
    let peers = s.options.fold_node_peers && peers_share_nothing_unmirrored(s);
    let replica = aligned || (plan.replicas() > 1 && peers);
    let rank = plan.tp > 1 && plan.tp_mode == TpMode::OneD && peers;
    if !uses_nvme(plan) {
        return Folds { replica, rank, nvme_share: 1 };
    }
    match nvme_mirrors(s, replica, rank) {
        Some(m) => Folds { replica, rank, nvme_share: m },
        None => Folds { replica: aligned, rank: false, nvme_share: nvme_mirrors(s, aligned, false).unwrap_or(1) },
    }
}

/// Whether the plan reads or writes the node's NVMe drives.
fn uses_nvme(plan: &Plan) -> bool {
    let off = &plan.offload;
    [off.params, off.optimizer, off.activations].contains(&Tier::Nvme)
        || (plan.frozen.layers > 0 && plan.frozen.cached_layers > 0 && plan.frozen.cache_on_disk > 0.0)
}

/// Under the folds (`replica`, `rank`): how many of its node's devices each simulated device
/// stands for, where that number is the same everywhere and every node's devices stand for
/// the simulated devices of one node, each the same number of times (1 without folds or
/// where a node holds simulated devices only). Mirrors run identical timelines, so their
/// flows on the node's drives are identical, and max-min fair sharing gives each the drives'
/// bandwidth over their count: the simulated devices alone on drives of that bandwidth over
/// this number get the same rates. `None` where the devices of a node stand for others
/// unevenly (their drives would carry traffic the simulated node's do not).
pub fn nvme_mirrors(s: &Scenario, replica: bool, rank: bool) -> Option<u32> {
    let plan = &s.plan;
    let per = s.cluster.node.devices.max(1);
    let n = plan.devices();
    let stands_for = |d: u32| {
        let (r, st, x) = plan.coords(d);
        plan.device(if replica { 0 } else { r }, st, if rank { 0 } else { x })
    };
    let simulated_in = |node: u32| (node * per..((node + 1) * per).min(n)).filter(move |&d| stands_for(d) == d);
    let mut m = None;
    for node in 0..n.div_ceil(per) {
        let mut counts: std::collections::BTreeMap<u32, u32> = std::collections::BTreeMap::new();
        for d in node * per..((node + 1) * per).min(n) {
            *counts.entry(stands_for(d)).or_default() += 1;
        }
        let first = *counts.keys().next()?;
        let home: Vec<u32> = simulated_in(first / per).collect();
        if !counts.keys().copied().eq(home.iter().copied()) {
            return None;
        }
        for &c in counts.values() {
            if *m.get_or_insert(c) != c {
                return None;
            }
        }
    }
    m
}

/// Whether devices of one node that mirror each other (tensor ranks of a group, or replicas)
/// share no resource that carries traffic a mirror would not: each device has its own NIC (or
/// the cluster is one node with a switch or mesh), Gemini's placement is not used, and the
/// mirrored devices are of one class (every stage is one kind of device, checked when the
/// scenario is read; the check is kept here for scenarios built in code). A node's NVMe
/// drives are shared too: see [`folds`].
fn peers_share_nothing_unmirrored(s: &Scenario) -> bool {
    let plan = &s.plan;
    if plan.offload.dynamic.is_some() {
        return false;
    }
    let node = &s.cluster.node;
    let own_nic = node.nics >= node.devices || (s.cluster.nodes == 1 && node.intra_node.is_some());
    let one_class = s.cluster.overrides.is_empty()
        || (0..plan.devices()).all(|d| {
            let (_, stage, _) = plan.coords(d);
            s.cluster.class_of(d) == s.cluster.class_of(plan.device(0, stage, 0))
        });
    own_nic && one_class
}

/// Lower a validated scenario.
pub fn lower(s: &Scenario) -> Program {
    if s.plan.offload.dynamic.is_none() {
        return lower_with(s, None);
    }
    // Gemini shards its chunks over the data-parallel group, as ZeRO-3 does.
    let mut s = s.clone();
    if s.plan.sync_degree() > 1 {
        s.plan.zero_stage = 3;
    }
    // Warm-up: every chunk on the device; the log gives the chunks' compute order and the
    // program's memory timeline the non-model memory at each unit boundary.
    let (warm, log) = lower_into(Builder::new(&s), &s, None);
    let non_model = gemini::warmup_non_model(&warm, &log);
    let stats: Vec<(gemini::UnitAccess, f64)> = log.into_iter().zip(non_model).collect();
    lower_with(&s, Some(&stats))
}

fn lower_with(s: &Scenario, stats: Option<&[(gemini::UnitAccess, f64)]>) -> Program {
    lower_into(Builder::new(s), s, stats).0
}

/// Lower into a fresh builder; with `stats` (Gemini's warm-up log and non-model bytes), chunks
/// move as the steady-state placement decides.
fn lower_into(
    mut b: Builder,
    s: &Scenario,
    stats: Option<&[(gemini::UnitAccess, f64)]>,
) -> (Program, Vec<gemini::UnitAccess>) {
    let lw = Lowering::new(&mut b, s);
    let mut links = Links::new(&lw);
    for &r in &lw.replicas {
        for stage in 0..lw.plan.pp {
            lower_stage(&mut b, &lw, &mut links, stats, r, stage);
        }
    }
    links.connect(&mut b, &lw.replicas);
    (b.p, b.unit_log)
}

/// One pipeline stage of replica `r`, pass by pass.
fn lower_stage(
    b: &mut Builder,
    lw: &Lowering,
    links: &mut Links,
    stats: Option<&[(gemini::UnitAccess, f64)]>,
    r: u32,
    stage: u32,
) {
    let st = Stage::new(b, lw, r, stage);
    let mut placement = memory::stage_memory(b, lw, &st, stats);
    let moves = placement.as_mut().map(|p| std::mem::take(&mut p.moves));
    let (last_sync, last_expert_sync) = walk::walk_stage(b, lw, &st, links, moves);
    let opt_tasks = optimizer::step(b, lw, &st, &last_sync, placement.as_ref());
    // The step also waits for the expert gradients (expert data parallelism).
    for (&e, &o) in last_expert_sync.iter().zip(&opt_tasks) {
        b.p.deps.push((e, o));
    }
    data_parallel::gather_updated_params(b, lw, &st, &opt_tasks);
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_data_parallel;
#[cfg(test)]
mod tests_sharding;
#[cfg(test)]
mod tests_tensor_parallel;
