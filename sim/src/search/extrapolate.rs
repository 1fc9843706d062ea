//! A plan of many micro-batches evaluated from three short runs of the same plan.
//!
//! A step of `M` micro-batches per replica is a warm-up, a steady part in which the pipeline
//! repeats one period, and a drain with the gradient reduction and the optimizer step. The
//! simulator is deterministic and every device keeps its (static) speed, so once the steady
//! part is reached each added period adds exactly the same time, and the memory peak, set in
//! the warm-up or the drain, stops moving: `T(M) = T(M1) + (M - M1) x slope`, peak(M) =
//! peak(M1). Where the replicas' time cannot be folded into one (they share a node's NICs,
//! `simulation.symmetry` off) a search over thousands of micro-batches otherwise simulates
//! every one of them on every device.
//!
//! The slope is measured, not assumed: the plan runs with `M1`, `M1 + 2p` and `M1 + 4p`
//! micro-batches (`p` the pipeline depth, the period of every schedule, `M1` past the
//! warm-up and congruent to `M` modulo `p`), and the extrapolation stands only where the
//! three lie on one line (their second difference at most [`TOLERANCE_NS`]) and agree on the
//! peak, on host and NVMe memory and on whether the plan fits. Anything else (GPipe's peak
//! grows with `M`; under kernel jitter the wait of a stretch that spans the micro-batches,
//! such as a gradient reduction after the whole backward, grows as about its square root) is
//! simulated in full (the search first prunes such a plan by its jitter-free runs where it
//! can: `search::evaluate`), as is a plan whose
//! full program the simulator would refuse as too large, so the search reports what
//! `simulate` reports. On every plan of the tests' spaces the extrapolated time equals the
//! full simulation's to the nanosecond (`search::tests`).

use crate::report::Report;
use crate::scenario::Scenario;

/// The largest second difference (nanoseconds) of the three short runs' times accepted as a
/// line: a few nanoseconds of rounding.
pub const TOLERANCE_NS: i128 = 4;

/// Below this many times the longest short run's micro-batches, a plan is simulated in full
/// (the three short runs would save little).
const WORTH: u32 = 4;

/// What the search keeps of a report.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Estimate {
    pub iteration_s: f64,
    pub peak_memory_bytes: f64,
    pub fits: bool,
    pub mfu: f64,
}

impl Estimate {
    pub fn of(r: &Report) -> Estimate {
        Estimate { iteration_s: r.iteration_s, peak_memory_bytes: r.peak_memory_bytes, fits: r.fits, mfu: r.mfu }
    }
}

/// The three micro-batch counts a plan with `m` micro-batches per replica is measured at, or
/// `None` where `m` is too few for them to save anything.
pub fn short_counts(pp: u32, virtual_stages: u32, m: u32) -> Option<[u32; 3]> {
    let period = pp.max(1);
    // Past the warm-up: every chunk of every stage has run a micro-batch forward and back.
    let base = 2 * pp.max(1) * virtual_stages.max(1) + 2;
    // The smallest count >= base congruent to m modulo the period.
    let m1 = base + (m % period + period - base % period) % period;
    let counts = [m1, m1 + 2 * period, m1 + 4 * period];
    (m >= WORTH.saturating_mul(counts[2])).then_some(counts)
}

/// The plan's time, peak, fit and MFU from three short runs, or `None` where they do not
/// settle on a line (then the caller simulates it in full).
pub fn extrapolated(s: &Scenario) -> Option<Estimate> {
    let plan = &s.plan;
    // Drawn waits differ run to run (their three runs would not lie on a line anyway).
    let drawn = s.options.kernel_jitter_draws && s.options.kernel_jitter(&s.cluster) > 0.0;
    if drawn || plan.token_slices.is_some() || plan.partition_policy.is_some() {
        return None;
    }
    let m = plan.micro_batches;
    let counts = short_counts(plan.pp, plan.virtual_stages, m)?;
    // A program `simulate` would refuse is refused here too.
    if crate::lower::size::estimate(s, None).too_large() {
        return None;
    }
    let mut runs = Vec::with_capacity(3);
    for c in counts {
        let mut short = s.clone();
        short.set_micro_batches(c);
        runs.push(crate::try_simulate(&short, false).ok()?.report);
    }
    let same = |f: fn(&Report) -> f64| runs.iter().all(|r| f(r) == f(&runs[0]));
    if !same(|r| r.peak_memory_bytes)
        || !same(|r| r.host_memory_bytes)
        || !same(|r| r.nvme_bytes)
        || runs.iter().any(|r| r.fits != runs[0].fits)
    {
        return None;
    }
    // In whole nanoseconds, as the engine keeps time, so that an exact extrapolation gives
    // the full simulation's `iteration_s` to the bit.
    let t: Vec<i128> = runs.iter().map(|r| (r.iteration_s * 1e9).round() as i128).collect();
    if (t[2] - 2 * t[1] + t[0]).abs() > TOLERANCE_NS {
        return None;
    }
    // (m - counts[0]) is a whole number of periods p; counts[2] - counts[0] is four.
    let period = (counts[1] - counts[0]) / 2;
    let periods = i128::from((m - counts[0]) / period);
    let ns = t[0] + (periods * (t[2] - t[0]) + 2) / 4;
    // Past the engine's clock the full simulation is refused; so is the line.
    if ns <= 0 || ns >= i128::from(crate::engine::MAX_TIME_NS) {
        return None;
    }
    let iteration_s = ns as f64 * 1e-9;
    // Model FLOPs grow with the global batch, which grows with the micro-batches.
    let mfu = runs[0].mfu * f64::from(m) / f64::from(counts[0]) * runs[0].iteration_s / iteration_s;
    Some(Estimate { iteration_s, peak_memory_bytes: runs[0].peak_memory_bytes, fits: runs[0].fits, mfu })
}
