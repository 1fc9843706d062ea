//! A small seeded random source with the few draws the generators need.

use rand::{RngExt, SeedableRng};
use rand_pcg::Pcg64Mcg;

pub struct R(Pcg64Mcg);

impl R {
    /// Case `case` of run `seed`: independent of the order cases run in.
    pub fn for_case(seed: u64, case: u64) -> R {
        let mix = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ case.wrapping_mul(0xD1B5_4A32_D192_ED03);
        R(Pcg64Mcg::seed_from_u64(mix ^ (mix >> 29)))
    }

    /// Uniform integer in `lo..=hi`.
    pub fn int(&mut self, lo: u64, hi: u64) -> u64 {
        if lo >= hi { lo } else { self.0.random_range(lo..=hi) }
    }

    pub fn chance(&mut self, p: f64) -> bool {
        self.0.random_bool(p.clamp(0.0, 1.0))
    }

    pub fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.int(0, xs.len() as u64 - 1) as usize]
    }

    /// Log-uniform in `[lo, hi]` (both > 0).
    pub fn log(&mut self, lo: f64, hi: f64) -> f64 {
        let t: f64 = self.0.random();
        (lo.ln() + t * (hi.ln() - lo.ln())).exp()
    }

    /// Uniform in `[lo, hi)`.
    pub fn unit(&mut self, lo: f64, hi: f64) -> f64 {
        let t: f64 = self.0.random();
        lo + t * (hi - lo)
    }
}
