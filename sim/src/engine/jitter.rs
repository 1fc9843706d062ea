//! Per-kernel time variability (`simulation.kernel_jitter`): each synchronisation waits for
//! the slowest of its members.
//!
//! A device's kernels run slower or faster than their nominal times by a relative standard
//! deviation `cv`, independently across devices. Between two collectives of the same kind a
//! device runs kernels of nominal times `t_i`, `W = Σ t_i` in all, and arrives late by a normal
//! draw whose standard deviation depends on how the kernels' speeds move together:
//! - correlated over a time `τ` (`simulation.kernel_jitter_correlation_s`, the default): the
//!   speed is a stationary process whose correlation decays as `exp(-|Δt|/τ)`, so the stretch's
//!   mean speed varies by `cv · g(W/τ)` with `g(x)² = 2/x · (1 - (1 - e^-x)/x)`: `cv · W` for
//!   a stretch much shorter than `τ`, `cv · W · sqrt(2τ/W)` for a much longer one. Measured on
//!   an H200 at its settled power limit (`traces/2026-11-27-cuda-h200/jitter-steady.json`):
//!   GEMMs 1.47% launch to launch with a lag-1 autocorrelation of 0.94, 1.32% over 10 launches,
//!   0.74% over 100 and about 0.5% over half a second, which `τ` = 30 ms reproduces;
//! - independent (`τ` = 0): `cv · sqrt(Σ t_i²)`.
//!
//! A collective over `k` members starts when the latest of them arrives, the largest of `k`
//! such draws. The engine runs every kernel at its nominal time and delays each collective by
//! that largest draw (when positive), drawn in one go as `Φ⁻¹(U^(1/k))` (the maximum of `k`
//! standard normals has distribution function `Φᵏ`) from a seeded generator
//! (`simulation.seed`): the same seed gives the same run. The `k` members count every member
//! of the collective, simulated or mirrored, so a folded simulation waits as long, in
//! distribution, as the full one (their draws differ).

use rand::{RngExt, SeedableRng};
use rand_pcg::Pcg64Mcg;
use statrs::distribution::{ContinuousCDF, Normal};

use crate::lower::{Program, STREAMS};

pub(super) struct Jitter {
    cv: f64,
    /// The speed's correlation time (ns); 0: kernels vary independently.
    tau_ns: f64,
    rng: Pcg64Mcg,
    normal: Normal,
    /// Per simulated device, the running sums of its kernels' nominal times (ns) and of their
    /// squares (ns²).
    sums: Vec<f64>,
    squares: Vec<f64>,
    /// Per stream, `sums` and `squares` of its device when the stream's latest collective
    /// started.
    at_last_sync: Vec<(f64, f64)>,
}

/// `g(x)`: the standard deviation of a stationary process's mean over a window `x`
/// correlation times long, over the process's own (`exp(-|Δt|/τ)` correlation).
fn window_factor(x: f64) -> f64 {
    if x < 1e-3 {
        return (1.0 - x / 3.0).sqrt();
    }
    (2.0 / x * (1.0 - (1.0 - (-x).exp()) / x)).sqrt()
}

impl Jitter {
    /// `None` when kernels do not vary (`cv` 0); `tau_s` the speed's correlation time (0:
    /// independent kernels).
    pub(super) fn new(cv: f64, tau_s: f64, seed: u64, devices: usize) -> Option<Jitter> {
        (cv > 0.0).then(|| Jitter {
            cv,
            tau_ns: tau_s * 1e9,
            rng: Pcg64Mcg::seed_from_u64(seed),
            normal: Normal::standard(),
            sums: vec![0.0; devices],
            squares: vec![0.0; devices],
            at_last_sync: vec![(0.0, 0.0); devices * STREAMS],
        })
    }

    /// A kernel of nominal `ns` ended on simulated device `d`.
    pub(super) fn kernel_done(&mut self, d: usize, ns: u64) {
        let t = ns as f64;
        self.sums[d] += t;
        self.squares[d] += t * t;
    }

    /// How long a collective over `members` devices that starts on `streams` waits for its
    /// slowest member beyond the simulated ones' arrival (ns); the streams' stretches end.
    pub(super) fn wait_ns(&mut self, streams: impl Iterator<Item = u32>, members: usize) -> u64 {
        // The longest stretch among the collective's streams on simulated devices.
        let (mut sum, mut squares): (f64, f64) = (0.0, 0.0);
        for s in streams {
            let d = Program::stream_device(s) as usize;
            let (at_sum, at_squares) = self.at_last_sync[s as usize];
            sum = sum.max(self.sums[d] - at_sum);
            squares = squares.max(self.squares[d] - at_squares);
            self.at_last_sync[s as usize] = (self.sums[d], self.squares[d]);
        }
        if members < 2 || sum <= 0.0 {
            return 0;
        }
        let sd = if self.tau_ns > 0.0 { sum * window_factor(sum / self.tau_ns) } else { squares.sqrt() };
        let u = self.rng.random::<f64>().clamp(1e-12, 1.0 - 1e-12);
        let z = self.normal.inverse_cdf(u.powf(1.0 / members as f64));
        (z.max(0.0) * self.cv * sd).round() as u64
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
            let mut j = Jitter::new(0.1, 0.0, 7, 1).expect("varies");
            let n = 20_000;
            let mut sum = 0.0;
            for _ in 0..n {
                j.kernel_done(0, 1_000_000);
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
            let mut j = Jitter::new(0.05, 0.03, seed, 2).expect("varies");
            (0..50)
                .map(|i| {
                    j.kernel_done(i % 2, 500_000);
                    j.wait_ns([0u32, STREAMS as u32].into_iter(), 16)
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(run(3), run(3));
        assert_ne!(run(3), run(4));
        let mut j = Jitter::new(0.05, 0.03, 1, 1).expect("varies");
        j.kernel_done(0, 500_000);
        let _ = j.wait_ns(std::iter::once(0), 16);
        assert_eq!(j.wait_ns(std::iter::once(0), 16), 0, "nothing ran since the last collective");
        assert!(Jitter::new(0.0, 0.03, 1, 1).is_none());
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
            let mut j = Jitter::new(0.02, tau, 5, 1).expect("varies");
            (0..4000)
                .map(|_| {
                    (0..100).for_each(|_| j.kernel_done(0, 10_000));
                    j.wait_ns(std::iter::once(0), 8) as f64
                })
                .sum::<f64>()
        };
        let ratio = waits(0.03) / waits(0.0);
        assert!((ratio - 10.0).abs() < 0.6, "{ratio}");
    }
}
