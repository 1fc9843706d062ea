//! Per-kernel time variability (`simulation.kernel_jitter`): each synchronisation waits for
//! the slowest of its members.
//!
//! A kernel's time varies from launch to launch by a relative standard deviation `cv`,
//! independently across kernels and devices. Between two collectives of the same kind a
//! device runs kernels of nominal times `t_i`: its stretch is late by a normal draw of
//! standard deviation `cv · sqrt(Σ t_i²)`, and a collective over `k` members starts when the
//! latest of them arrives, the largest of `k` such draws. The engine runs every kernel at its
//! nominal time and delays each collective by that largest draw (when positive), drawn in one
//! go as `Φ⁻¹(U^(1/k))` (the maximum of `k` standard normals has distribution function `Φᵏ`)
//! from a seeded generator (`simulation.seed`): the same seed gives the same run. The `k`
//! members count every member of the collective, simulated or mirrored, so a folded
//! simulation waits as long, in distribution, as the full one (their draws differ).

use rand::{RngExt, SeedableRng};
use rand_pcg::Pcg64Mcg;
use statrs::distribution::{ContinuousCDF, Normal};

use crate::lower::{Program, STREAMS};

pub(super) struct Jitter {
    cv: f64,
    rng: Pcg64Mcg,
    normal: Normal,
    /// Per simulated device, the running sum of its kernels' squared nominal times (ns²).
    squares: Vec<f64>,
    /// Per stream, `squares` of its device when the stream's latest collective started.
    at_last_sync: Vec<f64>,
}

impl Jitter {
    /// `None` when kernels do not vary (`cv` 0).
    pub(super) fn new(cv: f64, seed: u64, devices: usize) -> Option<Jitter> {
        (cv > 0.0).then(|| Jitter {
            cv,
            rng: Pcg64Mcg::seed_from_u64(seed),
            normal: Normal::standard(),
            squares: vec![0.0; devices],
            at_last_sync: vec![0.0; devices * STREAMS],
        })
    }

    /// A kernel of nominal `ns` ended on simulated device `d`.
    pub(super) fn kernel_done(&mut self, d: usize, ns: u64) {
        let t = ns as f64;
        self.squares[d] += t * t;
    }

    /// How long a collective over `members` devices that starts on `streams` waits for its
    /// slowest member beyond the simulated ones' arrival (ns); the streams' stretches end.
    pub(super) fn wait_ns(&mut self, streams: impl Iterator<Item = u32>, members: usize) -> u64 {
        let mut squares: f64 = 0.0;
        for s in streams {
            let d = Program::stream_device(s) as usize;
            squares = squares.max(self.squares[d] - self.at_last_sync[s as usize]);
            self.at_last_sync[s as usize] = self.squares[d];
        }
        if members < 2 || squares <= 0.0 {
            return 0;
        }
        let u = self.rng.random::<f64>().clamp(1e-12, 1.0 - 1e-12);
        let z = self.normal.inverse_cdf(u.powf(1.0 / members as f64));
        (z.max(0.0) * self.cv * squares.sqrt()).round() as u64
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
            let mut j = Jitter::new(0.1, 7, 1).expect("varies");
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
            let mut j = Jitter::new(0.05, seed, 2).expect("varies");
            (0..50)
                .map(|i| {
                    j.kernel_done(i % 2, 500_000);
                    j.wait_ns([0u32, STREAMS as u32].into_iter(), 16)
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(run(3), run(3));
        assert_ne!(run(3), run(4));
        let mut j = Jitter::new(0.05, 1, 1).expect("varies");
        j.kernel_done(0, 500_000);
        let _ = j.wait_ns(std::iter::once(0), 16);
        assert_eq!(j.wait_ns(std::iter::once(0), 16), 0, "nothing ran since the last collective");
        assert!(Jitter::new(0.0, 1, 1).is_none());
    }
}
