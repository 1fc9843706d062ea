//! Plan search (`trainsim search`): the fastest plan that fits, the top K, and the Pareto
//! front of iteration time against peak memory, over the space of [`space::enumerate`].
//!
//! Prune, simulate, rank. Every candidate is read as `simulate` would read it (a plan the
//! reader refuses is counted as invalid), then bounded ([`bounds::bounds`]): a plan whose
//! memory bound exceeds a device's usable memory cannot fit and is pruned. The others are
//! simulated most promising first (by time bound), in rounds of [`ROUND`] plans on all cores;
//! before each plan joins a round it is pruned if it can change neither the answer's top K
//! (its time bound is above the K-th best simulated time) nor its front (a simulated plan that
//! fits is strictly better than its bounds in one of time and memory and no worse in the
//! other). Since the bounds are never above the simulated values, the pruned search returns
//! exactly what the exhaustive one ([`Options::prune`] false) returns. A plan whose replicas
//! run many micro-batches is measured from three short runs of itself where they lie on a line
//! ([`extrapolate`]; the tests find it equal to the full simulation to the nanosecond), and the
//! best plan is simulated in full at the end.
//!
//! Determinism: rounds are a fixed size, each round's results are merged in candidate order,
//! and every ranking breaks ties by the enumeration index, so the output does not depend on
//! the thread count.

pub mod bounds;
pub mod extrapolate;
pub mod space;

use crate::scenario::{Scenario, ScenarioError, SearchInput};
use bounds::Bounds;
use rayon::prelude::*;
use serde::Serialize;
use serde_json::Value;

/// Plans simulated per round (a constant, so that pruning does not depend on the threads).
pub const ROUND: usize = 8;

#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// How many of the fastest fitting plans to return.
    pub top: usize,
    /// Prune by the bounds (false: simulate every valid plan, for tests).
    pub prune: bool,
    /// Evaluate a plan of many micro-batches from three short runs where they settle on a
    /// line ([`extrapolate`]; false: simulate every plan in full).
    pub extrapolate: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options { top: 5, prune: true, extrapolate: true }
    }
}

/// One simulated plan.
#[derive(Clone, Debug, Serialize)]
pub struct Evaluated {
    /// Position in the enumeration (the tie-breaker of every ranking).
    pub index: usize,
    /// The scenario's `plan` object.
    pub plan: Value,
    /// The scenario's `training.micro_batch`.
    pub micro_batch: u32,
    /// The framework profile searched (`--frameworks`), if any: the scenario's
    /// `training.framework`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub framework: Option<&'static str>,
    pub iteration_s: f64,
    pub peak_memory_bytes: f64,
    pub fits: bool,
    pub mfu: f64,
    /// Usable device memory (capacity less the headroom) left at the peak.
    pub memory_headroom_bytes: f64,
    pub bounds: Bounds,
    /// Its time and memory come from three short runs ([`extrapolate`]), not a full simulation.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub extrapolated: bool,
}

/// Counts so far, for a progress bar.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Progress {
    /// Plans in the space.
    pub enumerated: usize,
    /// Plans the reader refused (a constraint of the scenario or of the reader).
    pub invalid: usize,
    /// Pruned by the memory bound, or under kernel jitter by the jitter-free runs' peak (see
    /// `evaluate`).
    pub pruned_memory: usize,
    /// Pruned by the time bound (unable to enter the top K or the front), or under kernel
    /// jitter by the plan's jitter-free time and peak (see `evaluate`).
    pub pruned_time: usize,
    /// Evaluated: simulated, or a twin of a simulated plan (see `simulated`).
    pub evaluated: usize,
    /// Simulations run: a plan whose simulation is the same as an evaluated one's (a rank
    /// order that only relabels nodes, selective recomputation with nothing to recompute)
    /// takes that result. A plan pruned by its jitter-free runs is not counted.
    pub simulated: usize,
    /// Of the simulations, those of many micro-batches measured from three short runs of the
    /// same plan ([`extrapolate`]).
    pub extrapolated: usize,
    /// The simulator refused them (too large to lower, past its clock).
    pub failed: usize,
}

impl Progress {
    pub fn pruned(&self) -> usize {
        self.pruned_memory + self.pruned_time
    }
}

/// What a search found.
#[derive(Clone, Debug, Serialize)]
pub struct Outcome {
    /// The fastest plan that fits (`top[0]`).
    pub best: Option<Evaluated>,
    /// The fastest fitting plans, fastest first.
    pub top: Vec<Evaluated>,
    /// Iteration time against peak memory among the plans that fit: each faster than every
    /// plan that needs less memory, fastest first.
    pub pareto: Vec<Evaluated>,
    pub progress: Progress,
    /// Every simulated plan, in simulation order (for tests and reports).
    #[serde(skip)]
    pub simulated: Vec<Evaluated>,
}

/// The total order of a ranking: time, then memory, then enumeration index.
fn rank_key(e: &Evaluated) -> (f64, f64, usize) {
    (e.iteration_s, e.peak_memory_bytes, e.index)
}

fn cmp(a: &Evaluated, b: &Evaluated) -> std::cmp::Ordering {
    let (x, y) = (rank_key(a), rank_key(b));
    x.0.total_cmp(&y.0).then(x.1.total_cmp(&y.1)).then(x.2.cmp(&y.2))
}

/// The Pareto front of `fitting` (sorted by [`rank_key`]): each plan that needs less memory
/// than every faster one.
fn front(sorted: &[Evaluated]) -> Vec<Evaluated> {
    let mut out: Vec<Evaluated> = Vec::new();
    for e in sorted {
        if out.last().is_none_or(|l| e.peak_memory_bytes < l.peak_memory_bytes) {
            out.push(e.clone());
        }
    }
    out
}

/// The scenario a candidate is bounded and simulated as. A balanced partition is resolved here
/// into its layer counts (as `simulate` first does), so the bounds see the real stages. The
/// search stops there: where those counts do not fit, `simulate` would also try the balanced
/// partition under the simulator's own memory, which a bound cannot foresee; the search counts
/// such a plan as not fitting (README, "Plan search").
fn scenario_of(input: &SearchInput, c: &space::Candidate) -> Result<Scenario, ScenarioError> {
    let mut s = input.with_choice(c.micro_batch, &c.plan, c.framework)?;
    if s.plan.partition_policy == Some(crate::plan::PartitionPolicy::Balanced) {
        if let Ok(parts) = crate::partition::resolve(&s) {
            s.plan.partition = parts;
        }
        s.plan.partition_policy = None;
    }
    Ok(s)
}

/// A key equal for two candidates whose simulations are the same: the resolved plan, with the
/// choices that change nothing the simulator sees set to one value.
/// - The rank order, where it only relabels whole nodes: a single pipeline stage or replica
///   (both orders give the same mapping), or tensor-parallel groups that fill whole nodes on a
///   cluster of identical nodes (each node then holds one (replica, stage) pair; the inter-node
///   network is flat).
/// - Selective recomputation, where no op of the layer has an attention core to recompute
///   (fused attention stores none): it lowers exactly as no recomputation.
fn twin_key(s: &Scenario) -> String {
    use crate::plan::{RankOrder, Recompute};
    let mut plan = s.plan.clone();
    let per_node = s.cluster.node.devices;
    let whole_nodes = per_node > 0 && plan.tp.is_multiple_of(per_node) && s.cluster.overrides.is_empty();
    if plan.replicas() == 1 || plan.pp == 1 || whole_nodes {
        plan.rank_order = RankOrder::TpDpPp;
    }
    if plan.recompute == Recompute::Selective && s.workload.net.is_none() {
        let ops = s.workload.transformer.layer_ops(plan.layer_shape());
        let nothing = !crate::workload::recompute::reruns_anything(&ops, plan.recompute_modules);
        if nothing {
            plan.recompute = Recompute::None;
        }
    }
    format!("{plan:?}")
}

/// How far below a plan's jitter-free time and peak its jittered ones may lie, as a share,
/// when the search bounds a plan by them (see [`evaluate`]): the largest speed-up the default
/// jitter gave any experiment or validation scenario was 0.56%.
pub const JITTER_FREE_SLACK: f64 = 0.01;

/// What evaluating one plan gave.
#[derive(Clone, Debug)]
enum Eval {
    Done(Evaluated),
    /// Under kernel jitter, its jitter-free runs already showed that it cannot fit (`memory`)
    /// or change the answer (see [`evaluate`]).
    Pruned {
        memory: bool,
    },
    /// The simulator refused it.
    Failed,
}

/// Simulate one plan (from three short runs where `extrapolate` and they settle on a line).
///
/// Under kernel jitter (`simulation.kernel_jitter`, on by default on GPUs) a collective that
/// ends a stretch spanning many micro-batches (a gradient reduction after the whole backward)
/// waits in proportion to about the square root of the stretch, so such plans' short runs do
/// not lie on a line and would be simulated in full. With `gate` (the fitting plans so far and
/// the K of the top K), the plan is first measured without jitter, from three short runs. A
/// wait only delays a collective, so that time is about a lower bound on the jittered one, and
/// the peak about the same, but not exactly: a delayed collective can overlap less contended
/// compute, and at the default spread a few scenarios ran up to 0.56% faster with jitter than
/// without (TeraPipe's token slices; one HSDP plan 0.25%; no peak moved on any of the ~100
/// experiment scenarios). Both are therefore taken [`JITTER_FREE_SLACK`] lower before they
/// bound the plan (`search::tests` checks the bound and the pruned search's answer on a
/// space). A plan that cannot fit by them, or whose time and peak cannot change the top K or
/// the front ([`cannot_matter`]), is pruned there; the others are measured with jitter.
fn evaluate(
    s: &Scenario,
    index: usize,
    c: &space::Candidate,
    b: Bounds,
    extrapolate: bool,
    gate: Option<(&[Evaluated], usize)>,
) -> Eval {
    if let Some((fitting, k)) = gate.filter(|_| extrapolate && s.options.kernel_jitter(&s.cluster) > 0.0) {
        let mut calm = s.clone();
        calm.options.kernel_jitter = Some(0.0);
        if let Some(e) = extrapolate::extrapolated(&calm) {
            let (t, peak) =
                (e.iteration_s * (1.0 - JITTER_FREE_SLACK), e.peak_memory_bytes * (1.0 - JITTER_FREE_SLACK));
            let tight = Bounds {
                iteration_s: t.max(b.iteration_s),
                peak_memory_bytes: peak.max(b.peak_memory_bytes),
                may_fit: e.fits || peak <= s.options.usable_bytes(&s.cluster.node.device),
            };
            if !tight.may_fit || cannot_matter(&tight, fitting, k) {
                return Eval::Pruned { memory: !tight.may_fit };
            }
        }
    }
    let (r, extrapolated) = match extrapolate.then(|| extrapolate::extrapolated(s)).flatten() {
        Some(e) => (e, true),
        None => match crate::try_simulate(s, false) {
            Ok(sim) => (extrapolate::Estimate::of(&sim.report), false),
            Err(_) => return Eval::Failed,
        },
    };
    let usable = s.options.usable_bytes(&s.cluster.node.device);
    Eval::Done(Evaluated {
        index,
        plan: c.plan.clone(),
        micro_batch: c.micro_batch,
        framework: c.framework,
        iteration_s: r.iteration_s,
        peak_memory_bytes: r.peak_memory_bytes,
        fits: r.fits,
        mfu: r.mfu,
        memory_headroom_bytes: usable - r.peak_memory_bytes,
        bounds: b,
        extrapolated,
    })
}

/// Search the input's space. `progress` is called after every round. With no valid plan at
/// all, the reader's error for the first candidate.
pub fn search(
    input: &SearchInput,
    opts: Options,
    progress: &(dyn Fn(&Progress) + Sync),
) -> Result<Outcome, ScenarioError> {
    let candidates = space::enumerate(input);
    let mut prog = Progress { enumerated: candidates.len(), ..Progress::default() };
    // Read and bound every candidate (in parallel, results in order).
    let read: Vec<Result<Bounds, ScenarioError>> =
        candidates.par_iter().map(|c| scenario_of(input, c).map(|s| bounds::bounds(&s))).collect();
    let mut first_error = None;
    let mut queue: Vec<(usize, Bounds)> = Vec::new();
    for (i, r) in read.into_iter().enumerate() {
        match r {
            Err(e) => {
                prog.invalid += 1;
                first_error.get_or_insert(e);
            }
            Ok(b) if opts.prune && !b.may_fit => prog.pruned_memory += 1,
            Ok(b) => queue.push((i, b)),
        }
    }
    if queue.is_empty()
        && prog.pruned_memory == 0
        && let Some(e) = first_error
    {
        return Err(e);
    }
    progress(&prog);
    // Most promising first.
    queue.sort_by(|a, b| a.1.iteration_s.total_cmp(&b.1.iteration_s).then(a.0.cmp(&b.0)));
    let mut simulated: Vec<Evaluated> = Vec::new();
    let mut fitting: Vec<Evaluated> = Vec::new();
    let mut memo: std::collections::HashMap<String, Eval> = std::collections::HashMap::new();
    let mut next = 0;
    while next < queue.len() {
        let mut round = Vec::with_capacity(ROUND);
        while round.len() < ROUND && next < queue.len() {
            let (i, b) = queue[next];
            next += 1;
            if opts.prune && cannot_matter(&b, &fitting, opts.top) {
                prog.pruned_time += 1;
            } else {
                round.push((i, b));
            }
        }
        // Each distinct simulation once: a twin (see `twin_key`) takes its result.
        let keyed: Vec<(usize, Bounds, Option<Scenario>, String)> = round
            .par_iter()
            .map(|&(i, b)| {
                let s = scenario_of(input, &candidates[i]).ok();
                let key = s.as_ref().map_or_else(|| format!("refused {i}"), twin_key);
                (i, b, s, key)
            })
            .collect();
        let fresh: Vec<&(usize, Bounds, Option<Scenario>, String)> = keyed
            .iter()
            .enumerate()
            .filter(|&(j, k)| !memo.contains_key(&k.3) && !keyed[..j].iter().any(|e| e.3 == k.3))
            .map(|(_, k)| k)
            .collect();
        // The fitting plans as the round starts (the same on any thread count).
        let gate = opts.prune.then_some((fitting.as_slice(), opts.top));
        let ran: Vec<Eval> = fresh
            .par_iter()
            .map(|(i, b, s, _)| match s {
                Some(s) => evaluate(s, *i, &candidates[*i], *b, opts.extrapolate, gate),
                None => Eval::Failed,
            })
            .collect();
        for (k, r) in fresh.iter().zip(ran) {
            if let Eval::Done(e) = &r {
                prog.extrapolated += usize::from(e.extrapolated);
            }
            prog.simulated += usize::from(!matches!(r, Eval::Pruned { .. }));
            memo.insert(k.3.clone(), r);
        }
        let results: Vec<Eval> = keyed
            .iter()
            .map(|(i, b, _, key)| match &memo[key] {
                Eval::Done(e) => Eval::Done(Evaluated {
                    index: *i,
                    plan: candidates[*i].plan.clone(),
                    micro_batch: candidates[*i].micro_batch,
                    framework: candidates[*i].framework,
                    bounds: *b,
                    ..e.clone()
                }),
                other => other.clone(),
            })
            .collect();
        for r in results {
            match r {
                Eval::Done(e) => {
                    prog.evaluated += 1;
                    if e.fits {
                        let at = fitting.partition_point(|x| cmp(x, &e).is_lt());
                        fitting.insert(at, e.clone());
                    }
                    simulated.push(e);
                }
                Eval::Pruned { memory: true } => prog.pruned_memory += 1,
                Eval::Pruned { memory: false } => prog.pruned_time += 1,
                Eval::Failed => {
                    prog.evaluated += 1;
                    prog.failed += 1;
                }
            }
        }
        progress(&prog);
    }
    confirm_best(input, &candidates, &mut fitting);
    let top: Vec<Evaluated> = fitting.iter().take(opts.top.max(1)).cloned().collect();
    Ok(Outcome { best: top.first().cloned(), top, pareto: front(&fitting), progress: prog, simulated })
}

/// The best plan simulated in full where its numbers were extrapolated, so that the answer is
/// the one `simulate` gives for it: the two agree to the nanosecond wherever the three short
/// runs lie on a line (`search::tests`); should they not, the full result replaces the
/// extrapolated one, the ranking is redone, and the new first plan is confirmed in turn.
fn confirm_best(input: &SearchInput, candidates: &[space::Candidate], fitting: &mut Vec<Evaluated>) {
    // Each pass clears the flag of the first plan or removes it, so this ends.
    while let Some(best) = fitting.first().filter(|e| e.extrapolated) {
        let c = &candidates[best.index];
        let full = scenario_of(input, c).ok().map(|s| evaluate(&s, best.index, c, best.bounds, false, None));
        match full {
            Some(Eval::Done(e)) if e.fits => fitting[0] = e,
            _ => {
                fitting.remove(0);
            }
        }
        fitting.sort_by(cmp);
    }
}

/// Whether a plan with bounds `b` can change neither the top `k` of `fitting` (sorted) nor its
/// front: its time bound is above the k-th best time, and some fitting plan is strictly
/// better than its bounds in time or memory and no worse in the other.
fn cannot_matter(b: &Bounds, fitting: &[Evaluated], k: usize) -> bool {
    let Some(kth) = fitting.get(k.max(1) - 1) else { return false };
    if b.iteration_s <= kth.iteration_s {
        return false;
    }
    fitting.iter().any(|q| {
        (q.iteration_s < b.iteration_s && q.peak_memory_bytes <= b.peak_memory_bytes)
            || (q.iteration_s <= b.iteration_s && q.peak_memory_bytes < b.peak_memory_bytes)
    })
}

#[cfg(test)]
mod tests;
