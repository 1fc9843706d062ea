//! Capacity studies: the largest model of a family that fits a cluster under each memory
//! policy, found by binary search on the simulated memory peak, with its throughput.
//!
//! The family is the scenario's transformer varied along one knob: `layers`, `hidden` (in
//! steps of 128 with 128-wide heads, FFN 4x), or `params` (hidden and layers together at the
//! scenario's depth-to-width ratio). "Fits" is the report's `fits`: every device's HBM, each
//! node's host DRAM and NVMe. Every policy runs under the scenario's resolved framework (named,
//! or picked by its own plan): the policies differ in where the states live, not in the
//! framework's other behaviours.

use crate::plan::{Offload, Tier};
use crate::scenario::Scenario;
use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Vary {
    Layers,
    Hidden,
    Params,
}

impl Vary {
    pub fn parse(s: &str) -> Option<Vary> {
        Some(match s {
            "layers" => Vary::Layers,
            "hidden" => Vary::Hidden,
            "params" => Vary::Params,
            _ => return None,
        })
    }
}

/// A memory policy: where model states live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// Everything on the devices, with the scenario's ZeRO stage.
    Device,
    /// ZeRO-3: states sharded over the data-parallel devices.
    Zero3,
    /// ZeRO-Offload: optimizer states and step on the CPU (ZeRO-2).
    ZeroOffload,
    /// ZeRO-3 with parameters and optimizer in host memory (DeepSpeed's offload_param + offload_optimizer).
    Zero3Cpu,
    /// ZeRO-Infinity: parameters and optimizer on NVMe.
    ZeroInfinity,
    /// Colossal-AI's Gemini: chunks placed dynamically (Belady eviction), hybrid Adam.
    Gemini,
    /// Gemini's `const` policy: a fixed 512 MiB device budget for chunks.
    Const,
}

impl Policy {
    pub const ALL: [Policy; 7] = [
        Policy::Device,
        Policy::Zero3,
        Policy::ZeroOffload,
        Policy::Zero3Cpu,
        Policy::ZeroInfinity,
        Policy::Gemini,
        Policy::Const,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Policy::Device => "device",
            Policy::Zero3 => "zero3",
            Policy::ZeroOffload => "zero-offload",
            Policy::Zero3Cpu => "zero3-cpu",
            Policy::ZeroInfinity => "zero-infinity",
            Policy::Gemini => "gemini",
            Policy::Const => "const",
        }
    }

    /// The scenario under this policy.
    pub fn apply(self, s: &Scenario) -> Scenario {
        let mut s = s.clone();
        let p = &mut s.plan;
        let none = Offload::NONE;
        match self {
            Policy::Device => p.offload = none,
            Policy::Zero3 => {
                p.zero_stage = 3;
                p.offload = none;
            }
            Policy::ZeroOffload => {
                p.zero_stage = p.zero_stage.max(2);
                p.offload = Offload { optimizer: Tier::Cpu, ..none };
            }
            Policy::Zero3Cpu => {
                p.zero_stage = 3;
                p.offload = Offload { optimizer: Tier::Cpu, params: Tier::Cpu, ..none };
            }
            Policy::ZeroInfinity => {
                p.zero_stage = 3;
                p.offload = Offload { optimizer: Tier::Nvme, params: Tier::Nvme, ..none };
            }
            Policy::Gemini | Policy::Const => {
                p.zero_stage = 3;
                let budget_bytes = (self == Policy::Const).then_some(crate::policy::gemini::CONST_POLICY_BYTES);
                let eviction = crate::policy::gemini::Eviction::Belady;
                p.offload = Offload { dynamic: Some(crate::plan::Dynamic { eviction, budget_bytes }), ..none };
            }
        }
        s
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct PolicyCapacity {
    pub policy: &'static str,
    /// The knob's largest value that fits (layers or hidden), and the model's size.
    pub max_value: u32,
    pub max_params: f64,
    /// Throughput of that model (0 when nothing fits).
    pub samples_per_s: f64,
    /// Where the answer is not from a simulation of the whole cluster, what it is from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct CapacityReport {
    pub vary: Vary,
    pub devices: u32,
    pub policies: Vec<PolicyCapacity>,
}

/// The scenario's model with the knob at `v`.
fn sized(s: &Scenario, vary: Vary, v: u32) -> Scenario {
    let mut s = s.clone();
    let t = &mut s.workload.transformer;
    let ratio = t.hidden as f64 / t.layers as f64;
    let set_hidden = |t: &mut crate::workload::TransformerConfig, h: u32| {
        t.hidden = h;
        t.heads = (h / 128).max(1);
        t.kv_heads = t.heads;
        t.ffn_hidden = 4 * h;
    };
    match vary {
        Vary::Layers => t.layers = v,
        Vary::Hidden => set_hidden(t, 128 * v),
        Vary::Params => {
            set_hidden(t, 128 * v);
            t.layers = ((128.0 * v as f64) / ratio).round().max(1.0) as u32;
        }
    }
    // Never fewer layers than the pipeline has chunks.
    t.layers = t.layers.max(s.plan.chunks());
    let layers = t.layers;
    s.workload.name =
        format!("{} ({} layers, h={})", s.workload.name.split(" (").next().unwrap_or(""), layers, t.hidden);
    s.plan.partition = crate::plan::Plan::default_partition(layers, s.plan.chunks());
    s
}

fn knob(s: &Scenario, vary: Vary) -> u32 {
    let t = &s.workload.transformer;
    match vary {
        Vary::Layers => t.layers,
        Vary::Hidden | Vary::Params => (t.hidden / 128).max(1),
    }
}

/// The knob's step: the width knobs keep the head count (one head per 128 of hidden) a
/// multiple of the tensor-parallel degree, as the scenario reader requires.
fn step(s: &Scenario, vary: Vary) -> u32 {
    match vary {
        Vary::Layers => 1,
        Vary::Hidden | Vary::Params if s.plan.ring() => 1,
        Vary::Hidden | Vary::Params => s.plan.tp.max(1),
    }
}

/// The scenario made cheap to simulate where that leaves its memory peak alone, or `None`
/// when nothing changes: under 1F1B, PipeDream-Flush and 2BW a stage holds at most `pp`
/// micro-batches in flight, so more than `max(pp, 2)` only lengthen the run (two keep
/// gradient accumulation); GPipe, interleaving and token slicing keep theirs. Replicas are
/// alike in memory, so one stands for all even where their shared NICs make that inexact
/// for time. Used to find the boundary quickly; the boundary is then confirmed on the
/// scenario itself.
fn probe(s: &Scenario) -> Option<Scenario> {
    use crate::schedule::ScheduleKind;
    let mut p = s.clone();
    let plan = &mut p.plan;
    let short = matches!(plan.schedule, ScheduleKind::OneFOneB | ScheduleKind::Flush | ScheduleKind::TwoBW)
        && plan.virtual_stages == 1
        && plan.token_slices.is_none();
    let m = plan.pp.max(2);
    if short && plan.micro_batches > m {
        p.set_micro_batches(m);
    }
    p.options.symmetry = true;
    p.options.approximate_symmetry = true;
    let changed = p.plan.micro_batches != s.plan.micro_batches
        || crate::lower::simulates_one_replica(&p) != crate::lower::simulates_one_replica(s)
        || crate::lower::simulates_one_tensor_rank(&p) != crate::lower::simulates_one_tensor_rank(s);
    changed.then_some(p)
}

/// The largest knob value (>= the pipeline's chunk count for layers, a multiple of [`step`]
/// for the width knobs) whose model fits, that model's report, and a note where the report
/// is not the scenario's own. The search runs on the [`probe`] scenario and is confirmed on
/// the scenario itself (v fits, v + 1 does not); where the two disagree, it is redone on the
/// scenario itself. Where the scenario itself at v is past what the simulator lowers (a
/// family of small layers reaches millions of them), the answer stands on one simulated
/// replica, and the note says so: the limit is the simulator's, not the cluster's memory.
fn largest(
    s: &Scenario,
    vary: Vary,
    on_probe: &dyn Fn(&Probed),
) -> Option<(u32, crate::report::Report, Option<String>)> {
    let g = step(s, vary);
    let min = if vary == Vary::Layers { s.plan.chunks() } else { 1 }.div_ceil(g);
    let start = (knob(s, vary) / g).max(min);
    let run = |x: &Scenario, u: u32| {
        let m = sized(x, vary, u * g);
        let r = crate::try_simulate(&m, false).map(|x| x.report);
        let t = &m.workload.transformer;
        on_probe(&Probed { layers: t.layers, hidden: t.hidden, fits: r.as_ref().ok().map(|r| r.fits) });
        r
    };
    // A model the simulator refuses (too large to lower, past the clock) does not fit.
    let report = |x: &Scenario, u: u32| run(x, u).ok();
    let probe_at = |x: &Scenario, u: u32| match report(x, u) {
        Some(r) => Probe { fits: r.fits, pressure: r.memory_pressure },
        None => Probe { fits: false, pressure: f64::INFINITY },
    };
    let fits = |x: &Scenario, u: u32| report(x, u).is_some_and(|r| r.fits);
    let fast = probe(s);
    let found =
        fast.as_ref().and_then(|fast| search(|u| probe_at(fast, u), min, start, degree(vary), lowerable(fast, vary)));
    let confirmed = found.and_then(|u| match run(s, u) {
        Ok(r) if r.fits => (!fits(s, u + 1)).then_some((u, r, None)),
        Ok(_) => None,
        Err(e) => {
            // The probe's answer fits; the scenario itself is past the simulator. Keep every
            // micro-batch where one replica can be simulated with them, else the probe's.
            let mut one = s.clone();
            one.options.symmetry = true;
            one.options.approximate_symmetry = true;
            let (r, how) = match run(&one, u) {
                Ok(r) if r.fits => (r, "one simulated replica (its NIC shared with no other)".to_string()),
                _ => {
                    let fast = fast.as_ref()?;
                    let m = fast.plan.micro_batches;
                    (report(fast, u).filter(|r| r.fits)?, format!("one simulated replica running {m} micro-batches"))
                }
            };
            Some((u, r, Some(format!("memory and throughput from {how}: the full cluster at this size is {e}"))))
        }
    });
    let (u, r, note) = match confirmed {
        Some(c) => c,
        None => {
            let u = search(|u| probe_at(s, u), min, start, degree(vary), lowerable(s, vary))?;
            (u, report(s, u)?, None)
        }
    };
    Some((u * g, r, note))
}

/// One simulated size: whether it fits, and how full its fullest memory is (1 = full).
#[derive(Clone, Copy, Debug)]
struct Probe {
    fits: bool,
    pressure: f64,
}

/// Past this knob value no cluster fits the model (1M layers, or h = 128M).
const KNOB_LIMIT: u32 = 1 << 20;

/// The largest knob value, in units of [`step`], that `s` lowers to a program the simulator
/// builds (`lower::size`, no simulation): a search stops there rather than probing sizes the
/// simulator refuses, each step near the limit costing seconds (a fuzzed family of 113
/// two-wide layers otherwise probed tens of sizes of 10-40 M tasks).
fn lowerable(s: &Scenario, vary: Vary) -> u32 {
    let g = step(s, vary);
    let builds = |u: u32| !crate::lower::size::estimate(&sized(s, vary, u.saturating_mul(g)), None).too_large();
    let (mut lo, mut hi) = (1u32, KNOB_LIMIT);
    if builds(hi) {
        return hi;
    }
    if !builds(lo) {
        return lo;
    }
    // Tasks grow with the knob: bisect to the last size that builds.
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if builds(mid) { lo = mid } else { hi = mid }
    }
    lo
}

/// How memory grows with the knob: about linearly with layers, with the square of the width,
/// with the cube of both together (weights are `12 h^2` per layer).
fn degree(vary: Vary) -> i32 {
    match vary {
        Vary::Layers => 1,
        Vary::Hidden => 2,
        Vary::Params => 3,
    }
}

/// Where the pressure through two probes reaches 1, on a line in `u^degree` (exact for a
/// fixed part plus a power of the knob; the brackets keep the answer exact either way).
fn crossing(a: (u32, f64), b: (u32, f64), degree: i32) -> Option<f64> {
    let (xa, xb) = ((a.0 as f64).powi(degree), (b.0 as f64).powi(degree));
    let slope = (b.1 - a.1) / (xb - xa);
    let x = xa + (1.0 - a.1) / slope;
    (slope.is_finite() && slope > 0.0 && x > 0.0).then(|| x.powf(1.0 / degree as f64))
}

/// The largest `v >= min` that fits, assuming sizes fit up to some value and no further;
/// the search starts at `start`. Each simulation is seconds on a large cluster, so the next
/// size is where the measured memory pressure extrapolates to full (false position, with a
/// bisection step whenever that fails to halve the bracket), not a blind doubling and halving.
/// `limit`: the largest size to probe (what fits there is the answer when it fits).
fn search(at: impl Fn(u32) -> Probe, min: u32, start: u32, degree: i32, limit: u32) -> Option<u32> {
    let start = start.min(limit.max(min));
    let first = at(start);
    let (mut lo, mut hi) = if first.fits {
        // Grow until a size does not fit.
        let mut lo = (start, first.pressure);
        let mut prev: Option<(u32, f64)> = None;
        loop {
            let guess = match prev.and_then(|p| crossing(p, lo, degree)) {
                Some(x) => x * 1.02,
                // One point: the pressure's fixed part is unknown, so scaling by the
                // degree-th root of 1 / pressure undershoots, which keeps the step safe (an
                // overshoot would simulate a model far larger, and slower, than the answer).
                None if lo.1 > 0.0 => lo.0 as f64 * lo.1.recip().powf(1.0 / degree as f64),
                None => lo.0 as f64 * 2.0,
            };
            let next = (guess.ceil() as u64)
                .clamp(lo.0 as u64 + 1, (lo.0 as u64 * 8).max(lo.0 as u64 + 1))
                .min(limit as u64) as u32;
            if next <= lo.0 {
                return Some(lo.0);
            }
            let p = at(next);
            if !p.fits {
                break (lo, (next, p.pressure));
            }
            if next >= limit {
                return Some(next);
            }
            prev = Some(lo);
            lo = (next, p.pressure);
        }
    } else if start > min {
        let m = at(min);
        if !m.fits {
            return None;
        }
        ((min, m.pressure), (start, first.pressure))
    } else {
        return None;
    };
    while hi.0 - lo.0 > 1 {
        let half = lo.0 + (hi.0 - lo.0) / 2;
        let width = hi.0 - lo.0;
        let mid = crossing(lo, hi, degree)
            .map(|x| (x.floor() as u64).clamp(lo.0 as u64 + 1, hi.0 as u64 - 1) as u32)
            .unwrap_or(half);
        let p = at(mid);
        if p.fits {
            lo = (mid, p.pressure)
        } else {
            hi = (mid, p.pressure)
        }
        // False position can creep from one side; bisect when it did not halve the bracket.
        if hi.0 - lo.0 > width / 2 && hi.0 - lo.0 > 1 {
            let h = lo.0 + (hi.0 - lo.0) / 2;
            let p = at(h);
            if p.fits { lo = (h, p.pressure) } else { hi = (h, p.pressure) }
        }
    }
    Some(lo.0)
}

/// One model size the search simulated (for progress output): its shape, and whether it fit
/// (`None`: the simulator refused it).
#[derive(Clone, Copy, Debug)]
pub struct Probed {
    pub layers: u32,
    pub hidden: u32,
    pub fits: Option<bool>,
}

pub fn capacity(s: &Scenario, vary: Vary, policies: &[Policy]) -> CapacityReport {
    capacity_observed(s, vary, policies, &|_, _| {})
}

/// [`capacity`], calling `on_probe` with the policy's name after every simulated size.
pub fn capacity_observed(
    s: &Scenario,
    vary: Vary,
    policies: &[Policy],
    on_probe: &dyn Fn(&str, &Probed),
) -> CapacityReport {
    // BaPipe's exploration simulates dozens of plans; per bisection step that takes minutes.
    // The capacity question is about memory: the scenario's own schedule with a balanced
    // partition answers it.
    let mut own = s.clone();
    if own.plan.partition_policy == Some(crate::plan::PartitionPolicy::Explore) {
        own.plan.partition_policy = Some(crate::plan::PartitionPolicy::Balanced);
    }
    let s = &own;
    let out = policies
        .iter()
        .map(|&pol| {
            let base = pol.apply(s);
            let other = other_framework(&base);
            let join = |note: Option<String>| match (note, other.clone()) {
                (Some(a), Some(b)) => Some(format!("{a}; {b}")),
                (a, b) => a.or(b),
            };
            match largest(&base, vary, &|p| on_probe(pol.name(), p)) {
                Some((v, r, note)) => {
                    let m = sized(&base, vary, v);
                    PolicyCapacity {
                        policy: pol.name(),
                        max_value: v,
                        max_params: m.workload.parameters(),
                        samples_per_s: r.samples_per_s,
                        note: join(note),
                    }
                }
                None => PolicyCapacity {
                    policy: pol.name(),
                    max_value: 0,
                    max_params: 0.0,
                    samples_per_s: 0.0,
                    note: join(None),
                },
            }
        })
        .collect();
    CapacityReport { vary, devices: s.plan.devices(), policies: out }
}

/// Where the scenario names no framework and the policy's plan would pick another than the one
/// its own plan picked (Gemini is Colossal-AI's, ZeRO-Offload DeepSpeed's), a note saying which
/// one the policy was simulated under: the policies share the scenario's framework.
fn other_framework(base: &Scenario) -> Option<String> {
    if base.training.framework.is_some() {
        return None;
    }
    let p = &base.plan;
    let (name, why) = crate::framework::default_for(p.framework_traits());
    (name != p.framework.name).then(|| {
        format!(
            "simulated under {}, the framework the scenario's own plan picks; this policy's plan alone would pick {name} ({why}): name training.framework to compare the policies under one you choose",
            p.framework.name
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two A100-40GB with 96 GB of host DRAM: offload moves the limit until host memory fills.
    fn small() -> Scenario {
        let text = r#"{"workload": {"transformer": {"layers": 8, "hidden": 2048, "heads": 16, "vocab": 32000}},
            "cluster": {"node": {"preset": "dgx-a100-40gb", "devices": 2, "host_dram_bytes": 96e9}, "nodes": 1},
            "training": {"global_batch": 8, "micro_batch": 4, "seq_len": 512, "precision": "fp16", "optimizer": "adam"},
            "plan": {"dp": 2, "recompute": "full"}}"#;
        crate::scenario::parse(text, &|_| Err("no files".into())).unwrap_or_else(|e| panic!("{e}"))
    }

    /// The search returns the edge of what fits: its model fits and one more layer does not;
    /// offloading policies hold at least what the devices alone hold.
    #[test]
    fn the_largest_model_fits_and_one_more_layer_does_not() {
        let s = small();
        let policies = [Policy::Device, Policy::Zero3Cpu, Policy::Gemini, Policy::Const];
        let r = capacity(&s, Vary::Layers, &policies);
        for (pol, c) in policies.iter().zip(&r.policies) {
            assert_eq!(c.policy, pol.name());
            assert!(c.max_value >= 1 && c.samples_per_s > 0.0, "{c:?}");
            let base = pol.apply(&s);
            assert!(crate::simulate(&sized(&base, Vary::Layers, c.max_value), false).report.fits, "{c:?}");
            let over = crate::simulate(&sized(&base, Vary::Layers, c.max_value + 1), false).report;
            assert!(!over.fits, "{c:?}: one more layer still fits");
        }
        let device = r.policies[0].max_params;
        for c in &r.policies[1..] {
            assert!(c.max_params > device, "{} holds no more than the devices alone: {c:?}", c.policy);
        }
    }

    /// Without a named framework the policies run under the one the scenario's plan picks
    /// (`pytorch-ddp` here), and each policy whose plan alone would pick another says so; with
    /// one named, none does.
    #[test]
    fn policies_say_when_they_ran_under_another_framework_than_theirs() {
        let s = small();
        let policies = [Policy::Device, Policy::Zero3Cpu, Policy::Gemini];
        let notes: Vec<Option<String>> = policies.iter().map(|p| other_framework(&p.apply(&s))).collect();
        assert_eq!(notes[0], None);
        let says = |n: &Option<String>, name: &str| {
            n.as_deref().is_some_and(|n| n.contains("pytorch-ddp") && n.contains(name))
        };
        assert!(says(&notes[1], "deepspeed"), "{:?}", notes[1]);
        assert!(says(&notes[2], "colossal-ai"), "{:?}", notes[2]);
        let text = r#"{"workload": {"transformer": {"layers": 8, "hidden": 2048, "heads": 16, "vocab": 32000}},
            "cluster": {"node": {"preset": "dgx-a100-40gb", "devices": 2}, "nodes": 1},
            "training": {"global_batch": 8, "micro_batch": 4, "seq_len": 512, "precision": "fp16", "optimizer": "adam",
                         "framework": "pytorch-ddp"},
            "plan": {"dp": 2, "recompute": "full"}}"#;
        let named = crate::scenario::parse(text, &|_| Err("no files".into())).unwrap_or_else(|e| panic!("{e}"));
        assert!(policies.iter().all(|p| other_framework(&p.apply(&named)).is_none()));
    }

    /// The search finds the exact edge for fixed-plus-linear and quadratic pressures, from
    /// below and above the edge, and needs far fewer simulations than doubling and halving
    /// (about 2 log2(edge), 40 here).
    #[test]
    fn search_finds_the_exact_edge_in_few_probes() {
        use std::cell::Cell;
        type Pressure = fn(u32) -> f64;
        // Each pressure with its growth order in the knob (0: none of the three).
        let cases: [(&str, Pressure, i32); 5] = [
            ("linear", |u| 0.3 + 0.7 * u as f64 / 700_000.0, 1),
            ("quadratic", |u| 0.1 + (u as f64 / 90_000.0).powi(2), 2),
            ("steps", |u| 0.2 + 0.8 * (u / 8) as f64 / 613.0, 1),
            ("cubic", |u| 0.05 + (u as f64 / 5_000.0).powi(3), 3),
            ("quadratic plus linear", |u| 0.1 + u as f64 / 400_000.0 + (u as f64 / 120_000.0).powi(2), 0),
        ];
        for (name, f, order) in cases {
            let edge = (1..KNOB_LIMIT).take_while(|&u| f(u) <= 1.0).last().unwrap();
            for degree in 1..=3 {
                for start in [1, 50, edge + 5000] {
                    let (calls, largest) = (Cell::new(0), Cell::new(0));
                    let at = |u: u32| {
                        calls.set(calls.get() + 1);
                        largest.set(largest.get().max(u));
                        Probe { fits: f(u) <= 1.0, pressure: f(u) }
                    };
                    assert_eq!(
                        search(at, 1, start, degree, KNOB_LIMIT),
                        Some(edge),
                        "{name} from {start}, degree {degree}"
                    );
                    assert!(calls.get() <= 24, "{name} from {start}, degree {degree}: {} probes", calls.get());
                    // Growing with the right degree never probes far past the edge (the
                    // largest model is the slowest to simulate).
                    if degree == order && start < edge {
                        assert!(largest.get() <= edge + edge / 4 + 1, "{name} from {start}: probed {}", largest.get());
                    }
                }
            }
        }
    }
}
