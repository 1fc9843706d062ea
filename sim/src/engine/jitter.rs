//! Per-kernel time variability (`simulation.kernel_jitter`; on GPU clusters 0.0147 unless
//! given, `scenario::DEFAULT_GPU_KERNEL_JITTER`): each synchronisation waits for the slowest
//! of its members.
//!
//! A device's compute-bound kernels run slower or faster than their nominal times by a relative
//! standard deviation `cv`, independently across devices (memory-bound kernels, which the clock
//! does not move, only pass time). Between two collectives of the same kind a device runs
//! kernels of nominal times `t_i`, `W = Σ t_i` in all (`C` of it compute-bound), and arrives
//! late by a normal variable whose standard deviation depends on how the speeds move together:
//! - correlated over a time `τ` (`simulation.kernel_jitter_correlation_s`, the default): the
//!   speed is a stationary process whose correlation decays as `exp(-|Δt|/τ)`, so the stretch's
//!   mean speed varies by `cv · g(W/τ)` with `g(x)² = 2/x · (1 - (1 - e^-x)/x)` and it is late
//!   by `cv · C · g(W/τ)`: `cv · C` for a stretch much shorter than `τ`, about
//!   `cv · C · sqrt(2τ/W)` for a much longer one. Measured on
//!   an H200 at its settled power limit (`traces/2026-11-27-cuda-h200/jitter-steady.json`):
//!   GEMMs 1.47% launch to launch with a lag-1 autocorrelation of 0.94, 1.32% over 10 launches,
//!   0.74% over 100 and about 0.5% over half a second, which `τ` = 30 ms reproduces;
//! - independent (`τ` = 0): `cv · sqrt(Σ t_i²)` over the compute-bound kernels.
//!
//! A kernel counts once it has ended. A collective over `k` members starts when the latest of
//! them arrives, the largest of `k` such lateness. The engine runs every kernel at its nominal
//! time and delays each collective by that largest lateness (when positive): by default its
//! expectation, `E[max(0, M_k)]` standard deviations (deterministic); with
//! `simulation.kernel_jitter_draws` a draw, made in one go as `Φ⁻¹(U^(1/k))` (the maximum of
//! `k` standard normals has distribution function `Φᵏ`) from a seeded generator
//! (`simulation.seed`): the same seed gives the same run. The `k` members count every member
//! of the collective, simulated or mirrored, so a folded simulation waits exactly as the full
//! one with expected waits, and as long in distribution with draws.

use rand::{RngExt, SeedableRng};
use rand_pcg::Pcg64Mcg;
use statrs::distribution::{ContinuousCDF, Normal};

use crate::lower::{Program, STREAMS};

pub(super) struct Jitter {
    cv: f64,
    /// The speed's correlation time (ns); 0: kernels vary independently.
    tau_ns: f64,
    /// Seeded draws (`simulation.kernel_jitter_draws`); `None`: every wait is the expected
    /// largest lateness, so the run is the mean of the draws' runs to first order.
    rng: Option<Pcg64Mcg>,
    normal: Normal,
    /// `E[max(0, largest of k standard normals)]` by `k`, computed once each.
    expected: std::collections::HashMap<usize, f64>,
    /// Per simulated device, the running sums of its kernels' nominal times (ns), of the
    /// compute-bound ones' (ns) and of their squares (ns²).
    sums: Vec<Sums>,
    /// Per stream, `sums` of its device when the stream's latest collective started.
    at_last_sync: Vec<Sums>,
}

#[derive(Clone, Copy, Default)]
struct Sums {
    all: f64,
    compute: f64,
    squares: f64,
}

/// `g(x)`: the standard deviation of a stationary process's mean over a window `x`
/// correlation times long, over the process's own (`exp(-|Δt|/τ)` correlation).
fn window_factor(x: f64) -> f64 {
    if x < 1e-3 {
        return (1.0 - x / 3.0).sqrt();
    }
    (2.0 / x * (1.0 - (1.0 - (-x).exp()) / x)).sqrt()
}

/// `E[max(0, M_k)]` for `M_k` the largest of `k` standard normal draws: `∫_0^∞ 1 - Φ(x)^k dx`
/// (0.68 for 2, 1.42 for 8, 3.24 for 1,000), by the trapezoid rule to 12 standard
/// deviations.
fn expected_positive_max(k: usize, normal: &Normal) -> f64 {
    const STEP: f64 = 1e-3;
    let tail = |x: f64| 1.0 - (k as f64 * normal.cdf(x).ln()).exp();
    let n = (12.0 / STEP) as usize;
    (0..n).map(|i| 0.5 * (tail(i as f64 * STEP) + tail((i + 1) as f64 * STEP)) * STEP).sum()
}

impl Jitter {
    /// `None` when kernels do not vary (`cv` 0); `tau_s` the speed's correlation time (0:
    /// independent kernels); `seed` the draws' (`None`: expected waits).
    pub(super) fn new(cv: f64, tau_s: f64, seed: Option<u64>, devices: usize) -> Option<Jitter> {
        (cv > 0.0).then(|| Jitter {
            cv,
            tau_ns: tau_s * 1e9,
            rng: seed.map(Pcg64Mcg::seed_from_u64),
            normal: Normal::standard(),
            expected: std::collections::HashMap::new(),
            sums: vec![Sums::default(); devices],
            at_last_sync: vec![Sums::default(); devices * STREAMS],
        })
    }

    /// A kernel of nominal `ns` ended on simulated device `d`; a memory-bound one runs at the
    /// memory's speed, which the clock does not move (measured: 0.4-0.5% launch to launch,
    /// independently), so only its time passes.
    pub(super) fn kernel_done(&mut self, d: usize, ns: u64, memory_bound: bool) {
        let t = ns as f64;
        let s = &mut self.sums[d];
        s.all += t;
        if !memory_bound {
            s.compute += t;
            s.squares += t * t;
        }
    }

    /// How long a collective over `members` devices that starts on `streams` waits for its
    /// slowest member beyond the simulated ones' arrival (ns); the streams' stretches end.
    pub(super) fn wait_ns(&mut self, streams: impl Iterator<Item = u32>, members: usize) -> u64 {
        // The longest stretch among the collective's streams on simulated devices.
        let mut stretch = Sums::default();
        for s in streams {
            let d = Program::stream_device(s) as usize;
            let (now, at) = (self.sums[d], self.at_last_sync[s as usize]);
            stretch.all = stretch.all.max(now.all - at.all);
            stretch.compute = stretch.compute.max(now.compute - at.compute);
            stretch.squares = stretch.squares.max(now.squares - at.squares);
            self.at_last_sync[s as usize] = now;
        }
        if members < 2 || stretch.compute <= 0.0 {
            return 0;
        }
        let sd = if self.tau_ns > 0.0 {
            stretch.compute * window_factor(stretch.all / self.tau_ns)
        } else {
            stretch.squares.sqrt()
        };
        let z = match self.rng.as_mut() {
            Some(rng) => {
                let u = rng.random::<f64>().clamp(1e-12, 1.0 - 1e-12);
                self.normal.inverse_cdf(u.powf(1.0 / members as f64)).max(0.0)
            }
            None => {
                let normal = &self.normal;
                *self.expected.entry(members).or_insert_with(|| expected_positive_max(members, normal))
            }
        };
        (z * self.cv * sd).round() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The waits average the expected largest of k normal draws times the stretch's standard
    /// deviation: about 1.42 standard deviations for 8 members, 3.24 for 1,000.
    #[test]
    fn waits_average_the_expected_slowest_member() {
        for (k, expected) in [(8usize, 1.4236), (1000, 3.2414)] {
            let mut j = Jitter::new(0.1, 0.0, Some(7), 1).expect("varies");
            let n = 20_000;
            let mut sum = 0.0;
            for _ in 0..n {
                j.kernel_done(0, 1_000_000, false);
                sum += j.wait_ns(std::iter::once(0), k) as f64;
            }
            // One kernel of 1 ms at 10%: a standard deviation of 100 us.
            let mean = sum / n as f64 / 100_000.0;
            assert!((mean - expected).abs() < 0.03, "k = {k}: {mean} standard deviations");
        }
    }

    /// The same seed draws the same waits; no kernels since the last collective, no wait.
    #[test]
    fn draws_are_seeded_and_stretches_restart_at_each_collective() {
        let run = |seed| {
            let mut j = Jitter::new(0.05, 0.03, Some(seed), 2).expect("varies");
            (0..50)
                .map(|i| {
                    j.kernel_done(i % 2, 500_000, false);
                    j.wait_ns([0u32, STREAMS as u32].into_iter(), 16)
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(run(3), run(3));
        assert_ne!(run(3), run(4));
        let mut j = Jitter::new(0.05, 0.03, Some(1), 1).expect("varies");
        j.kernel_done(0, 500_000, false);
        let _ = j.wait_ns(std::iter::once(0), 16);
        assert_eq!(j.wait_ns(std::iter::once(0), 16), 0, "nothing ran since the last collective");
        assert!(Jitter::new(0.0, 0.03, None, 1).is_none());
    }

    /// The correlated stretch reproduces the H200's measured spreads from one launch's 1.47%:
    /// 10 launches of 1.64 ms about 1.3%, 100 about 0.8%, half a second about 0.5%
    /// (`jitter-steady.json`: 1.32%, 0.74%, 0.51% in `sustained.json`); a stretch of many short
    /// kernels varies as one long one, where independent kernels would average out.
    #[test]
    fn correlated_stretches_vary_as_measured() {
        let spread = |w_s: f64| 1.47 * window_factor(w_s / 0.03);
        for (w, measured) in [(0.0164, 1.32), (0.164, 0.74), (0.5, 0.51)] {
            assert!((spread(w) - measured).abs() < 0.1, "{w} s: {:.2}% against {measured}%", spread(w));
        }
        assert!((window_factor(1e-6) - 1.0).abs() < 1e-6);
        assert!((window_factor(1e-3 * 0.999) - window_factor(1e-3 * 1.001)).abs() < 1e-6, "continuous at the switch");
        // 100 kernels of 10 us: correlated, the stretch's spread is cv x 1 ms; independent, a tenth.
        let waits = |tau: f64| {
            let mut j = Jitter::new(0.02, tau, Some(5), 1).expect("varies");
            (0..4000)
                .map(|_| {
                    (0..100).for_each(|_| j.kernel_done(0, 10_000, false));
                    j.wait_ns(std::iter::once(0), 8) as f64
                })
                .sum::<f64>()
        };
        let ratio = waits(0.03) / waits(0.0);
        assert!((ratio - 10.0).abs() < 0.6, "{ratio}");
    }

    /// Without draws every wait is the expected one: the mean of the drawn waits, the same for
    /// every call, and the means of the positive part of the largest of k normals; memory-bound kernels add
    /// their time to the window, not to the spread.
    #[test]
    fn expected_waits_are_the_draws_mean() {
        let normal = Normal::standard();
        for (k, e) in [(2usize, 0.6811), (8, 1.4242), (1000, 3.2415)] {
            assert!((expected_positive_max(k, &normal) - e).abs() < 2e-3, "k = {k}");
        }
        let mut drawn = Jitter::new(0.1, 0.03, Some(3), 1).expect("varies");
        let mut expected = Jitter::new(0.1, 0.03, None, 1).expect("varies");
        let (mut sum, mut first) = (0.0, None);
        for _ in 0..20_000 {
            drawn.kernel_done(0, 1_000_000, false);
            expected.kernel_done(0, 1_000_000, false);
            sum += drawn.wait_ns(std::iter::once(0), 8) as f64;
            let w = expected.wait_ns(std::iter::once(0), 8);
            assert_eq!(*first.get_or_insert(w), w, "the same stretch waits the same");
        }
        let mean = sum / 20_000.0;
        assert!((mean / first.unwrap() as f64 - 1.0).abs() < 0.03, "{mean} against {first:?}");
        let mut j = Jitter::new(0.1, 0.03, None, 1).expect("varies");
        j.kernel_done(0, 1_000_000, true);
        assert_eq!(j.wait_ns(std::iter::once(0), 8), 0, "memory-bound kernels do not drift");
    }
}
