//! A whole run's wall-clock time under failures, checkpoints and slow nodes: a Monte Carlo
//! over seeded runs (rand_pcg's `Pcg64Mcg`, reproducible across platforms; statrs's inverse
//! distribution functions), on top of the run's useful compute time from the simulator.
//!
//! One run: the useful work is cut into checkpoint intervals (compute seconds). Each interval
//! runs at the job's speed (slower while a slow node is in it; its iterations' jitter), then
//! saves a checkpoint, stalling training `save_s` (the last interval saves nothing). The time
//! to the next interruption is exponential at the cluster's rate (memoryless, so it is drawn
//! afresh for each interval), and its component is drawn in proportion to the component
//! rates. An unexpected interruption loses everything since the last checkpoint; planned
//! maintenance saves first and loses nothing. Either costs the restart and the checkpoint's
//! restore, and the job's nodes are drawn again (a slow node may come or go).

use super::failures::{COMPONENTS, FailureRates, MAINTENANCE};
use rand::{RngExt, SeedableRng};
use rand_pcg::Pcg64Mcg;
use serde::Serialize;
use statrs::distribution::{ContinuousCDF, Normal};

/// Everything one Monte Carlo run needs, in seconds of wall-clock time unless named otherwise.
#[derive(Clone, Debug)]
pub struct RunModel {
    /// The run's useful compute time at full speed (iterations x iteration time, plus any
    /// freezing transitions).
    pub useful_s: f64,
    /// The time of one iteration (the jitter's unit).
    pub iteration_s: f64,
    pub devices: u32,
    pub nodes: u32,
    pub rates: FailureRates,
    /// Compute seconds between checkpoints.
    pub interval_s: f64,
    /// How long a checkpoint save stalls training.
    pub save_s: f64,
    /// Reading a checkpoint back after a restart.
    pub restore_s: f64,
    /// Rescheduling and re-initialising the job after an interruption.
    pub restart_s: f64,
    /// Relative standard deviation of one iteration's time.
    pub iteration_jitter: f64,
    /// Probability that a node of the job is slow, drawn at each (re)start.
    pub slow_node_probability: f64,
    /// How much slower the job runs with a slow node (0.1: 10% slower).
    pub slow_node_slowdown: f64,
}

/// Wall-clock seconds lost, by cause (mean over the runs).
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct LostSeconds {
    /// Work done since the last checkpoint when an unexpected interruption struck.
    pub rework_s: f64,
    pub restart_s: f64,
    pub restore_s: f64,
    /// Training stalled by checkpoint saves.
    pub checkpoint_s: f64,
    /// Slower iterations while a slow node was in the job. (The iterations' jitter, zero on
    /// average, is in none of these: wall time = useful time + these + the jitter.)
    pub slow_s: f64,
}

impl LostSeconds {
    pub fn total_s(&self) -> f64 {
        self.rework_s + self.restart_s + self.restore_s + self.checkpoint_s + self.slow_s
    }

    fn add(&mut self, o: &LostSeconds, w: f64) {
        self.rework_s += w * o.rework_s;
        self.restart_s += w * o.restart_s;
        self.restore_s += w * o.restore_s;
        self.checkpoint_s += w * o.checkpoint_s;
        self.slow_s += w * o.slow_s;
    }
}

/// One simulated run.
#[derive(Clone, Debug, Serialize)]
pub struct RunSample {
    pub wall_s: f64,
    pub interruptions: u64,
    /// Per component (see [`COMPONENTS`]).
    pub by_component: [u64; 7],
    pub lost: LostSeconds,
    /// (wall-clock seconds, fraction of the useful work checkpointed) after each interval or
    /// interruption, for the progress plot.
    #[serde(skip)]
    pub progress: Vec<(f64, f64)>,
}

/// The most checkpoint intervals and interruptions one run may take (a bound on the work).
pub const MAX_STEPS: f64 = 2e7;

/// Why the run cannot be drawn.
pub fn check(m: &RunModel) -> Result<(), String> {
    let intervals = if m.interval_s > 0.0 { m.useful_s / m.interval_s } else { f64::INFINITY };
    if intervals > MAX_STEPS && m.interval_s.is_finite() {
        return Err(format!(
            "a checkpoint every {:.3} s of compute over {:.3e} s is {intervals:.3e} intervals; at most {MAX_STEPS:.0e}: raise run.checkpoint.interval_s",
            m.interval_s, m.useful_s
        ));
    }
    let failures = m.rates.per_s(m.devices) * m.useful_s;
    if failures > MAX_STEPS {
        return Err(format!(
            "{failures:.3e} interruptions expected over the run (at most {MAX_STEPS:.0e}): the failure rates are too high for the run to finish"
        ));
    }
    // A run in which almost every interval is interrupted never ends: each interval takes
    // 1 / survive attempts on average.
    let span = m.interval_s.min(m.useful_s) * (1.0 + m.slow_node_slowdown) + m.save_s;
    let survive = (-m.rates.per_s(m.devices) * span).exp();
    let attempts = intervals.clamp(1.0, 1e300) / survive;
    if survive < 1e-6 || attempts > MAX_STEPS {
        return Err(format!(
            "an interval of {span:.1} s (compute and checkpoint save) survives interruptions with probability {survive:.1e}, so the run would take about {attempts:.1e} attempts (at most {MAX_STEPS:.0e}): it would not finish; shorten run.checkpoint.interval_s, speed up checkpoint storage or lower the failure rates"
        ));
    }
    Ok(())
}

/// Progress points kept for the plot of one run.
const PROGRESS_POINTS: usize = 4096;

/// One run with seed `seed`; `record`: keep its progress (thinned to about
/// [`PROGRESS_POINTS`] points). Past [`MAX_STEPS`] intervals and interruptions the run stops
/// where it is ([`check`] refuses models that would get there on average).
pub fn sample(m: &RunModel, seed: u64, record: bool) -> RunSample {
    let mut rng = Pcg64Mcg::seed_from_u64(seed);
    let rate = m.rates.per_s(m.devices);
    let total_rate: f64 = m.rates.per_device_hour.iter().sum();
    let any_slow = 1.0 - (1.0 - m.slow_node_probability).powf(f64::from(m.nodes));
    let standard = Normal::new(0.0, 1.0).expect("standard normal");
    let mut slow = rng.random::<f64>() < any_slow;
    let (mut done, mut wall) = (0.0f64, 0.0f64);
    let mut out = RunSample {
        wall_s: 0.0,
        interruptions: 0,
        by_component: [0; 7],
        lost: LostSeconds::default(),
        progress: if record { vec![(0.0, 0.0)] } else { Vec::new() },
    };
    let interval = if m.interval_s > 0.0 { m.interval_s } else { m.iteration_s.max(f64::MIN_POSITIVE) };
    let mut steps = 0.0;
    let mut last_recorded = 0.0;
    let mut note = |out: &mut RunSample, wall: f64, frac: f64, force: bool| {
        if record && (force || frac - last_recorded >= 1.0 / PROGRESS_POINTS as f64) {
            out.progress.push((wall, frac));
            last_recorded = frac;
        }
    };
    while done < m.useful_s && steps < MAX_STEPS {
        steps += 1.0;
        let seg = interval.min(m.useful_s - done);
        let last = done + seg >= m.useful_s;
        let speed = if slow { 1.0 + m.slow_node_slowdown } else { 1.0 };
        let jitter = if m.iteration_jitter > 0.0 && m.iteration_s > 0.0 {
            // The mean of the interval's iterations: its spread shrinks as 1/sqrt(n).
            let n = (seg / m.iteration_s).max(1.0);
            let u = rng.random::<f64>().clamp(1e-12, 1.0 - 1e-12);
            (1.0 + m.iteration_jitter / n.sqrt() * standard.inverse_cdf(u)).max(0.0)
        } else {
            1.0
        };
        let work = seg * speed * jitter;
        let save = if last { 0.0 } else { m.save_s };
        let next = if rate > 0.0 { -(1.0 - rng.random::<f64>()).ln() / rate } else { f64::INFINITY };
        if next >= work + save {
            wall += work + save;
            done += seg;
            out.lost.checkpoint_s += save;
            // A slow node's share (the jitter's, zero on average, is in neither).
            out.lost.slow_s += seg * (speed - 1.0) * jitter;
            note(&mut out, wall, done / m.useful_s, done >= m.useful_s);
            continue;
        }
        // Interrupted: which component.
        let mut pick = rng.random::<f64>() * total_rate;
        let mut c = 0;
        while c + 1 < COMPONENTS.len() && pick >= m.rates.per_device_hour[c] {
            pick -= m.rates.per_device_hour[c];
            c += 1;
        }
        out.by_component[c] += 1;
        out.interruptions += 1;
        wall += next;
        if c == MAINTENANCE {
            // Planned: the job checkpoints what it has done, then stops.
            let kept = (next.min(work) / (speed * jitter)).min(seg);
            done += kept;
            out.lost.slow_s += kept * (speed - 1.0) * jitter;
            out.lost.checkpoint_s += m.save_s + (next - next.min(work));
            wall += m.save_s;
        } else {
            out.lost.rework_s += next;
        }
        wall += m.restart_s + m.restore_s;
        out.lost.restart_s += m.restart_s;
        out.lost.restore_s += m.restore_s;
        note(&mut out, wall, done / m.useful_s, false);
        slow = rng.random::<f64>() < any_slow;
    }
    out.wall_s = wall;
    out
}

/// `runs` runs, run `i` seeded with `seed + i`; the first keeps its progress.
pub fn samples(m: &RunModel, seed: u64, runs: u32) -> Vec<RunSample> {
    (0..runs).map(|i| sample(m, seed.wrapping_add(u64::from(i)), i == 0)).collect()
}

/// The mean lost time by cause over `samples`.
pub fn mean_lost(samples: &[RunSample]) -> LostSeconds {
    let mut out = LostSeconds::default();
    let w = 1.0 / samples.len().max(1) as f64;
    for s in samples {
        out.add(&s.lost, w);
    }
    out
}

/// The `q` quantile (0..=1) of `values`, by linear interpolation between order statistics.
pub fn quantile(values: &[f64], q: f64) -> f64 {
    let mut v: Vec<f64> = values.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    let x = q.clamp(0.0, 1.0) * (v.len() - 1) as f64;
    let (i, f) = (x.floor() as usize, x.fract());
    if i + 1 < v.len() { v[i] * (1.0 - f) + v[i + 1] * f } else { v[i] }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(interval_s: f64) -> RunModel {
        // A 1,024-device job for 20 days of compute at Llama 3's rates (MTBF about 48 h), with
        // a 60 s save stall.
        RunModel {
            useful_s: 20.0 * 86400.0,
            iteration_s: 5.0,
            devices: 1024,
            nodes: 128,
            rates: FailureRates::preset("llama3-2024").expect("preset"),
            interval_s,
            save_s: 60.0,
            restore_s: 60.0,
            restart_s: 600.0,
            iteration_jitter: 0.0,
            slow_node_probability: 0.0,
            slow_node_slowdown: 0.0,
        }
    }

    /// Daly's interval gives the least simulated lost time among intervals scanned around it
    /// (the same seeds for every interval).
    #[test]
    fn daly_interval_minimises_the_simulated_lost_time() {
        let m = model(0.0);
        let mtbf = 1.0 / m.rates.unexpected_per_s(m.devices);
        let best = crate::run::failures::daly_interval_s(m.save_s, mtbf);
        let lost = |interval: f64| {
            let runs = samples(&model(interval), 11, 400);
            runs.iter().map(|r| r.wall_s - m.useful_s).sum::<f64>() / runs.len() as f64
        };
        let at_best = lost(best);
        for f in [0.25, 0.5, 0.7, 1.5, 2.0, 4.0] {
            let other = lost(best * f);
            assert!(
                at_best < other,
                "interval {:.0} s loses {at_best:.0} s, {:.0} s loses {other:.0} s",
                best,
                best * f
            );
        }
    }

    #[test]
    fn no_failures_and_no_variability_is_the_useful_time_exactly() {
        let mut m = model(f64::INFINITY);
        m.rates = FailureRates::none();
        let r = sample(&m, 3, true);
        assert_eq!(r.wall_s, m.useful_s);
        assert_eq!(r.interruptions, 0);
        assert_eq!(r.lost.total_s(), 0.0);
    }

    /// Interruptions arrive at the preset's rate over the time the job holds its devices, and
    /// the lost time by cause adds up to the wall time beyond the useful time.
    #[test]
    fn interruptions_follow_the_rates_and_lost_time_adds_up() {
        let m = model(3600.0);
        let runs = samples(&m, 5, 200);
        let mut held = 0.0;
        let mut count = 0.0;
        for r in &runs {
            held += r.wall_s - r.lost.restart_s - r.lost.restore_s;
            count += r.interruptions as f64;
            let sum = m.useful_s + r.lost.total_s();
            assert!((sum - r.wall_s).abs() < 1e-6 * r.wall_s, "{sum} vs {}", r.wall_s);
        }
        let expected = m.rates.per_s(m.devices) * held;
        // Poisson: within 4 standard deviations.
        assert!((count - expected).abs() < 4.0 * expected.sqrt(), "{count} vs {expected}");
    }

    #[test]
    fn same_seed_same_run() {
        let mut m = model(1800.0);
        m.iteration_jitter = 0.05;
        m.slow_node_probability = 0.01;
        m.slow_node_slowdown = 0.3;
        let (a, b) = (sample(&m, 9, false), sample(&m, 9, false));
        assert_eq!(a.wall_s, b.wall_s);
        assert_eq!(a.by_component, b.by_component);
        assert!(a.lost.slow_s > 0.0, "slow nodes cost time: {:?}", a.lost);
    }
}
