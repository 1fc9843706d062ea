//! The optimizer step of an offloaded optimizer (ZeRO-Offload): Adam on the host CPU that
//! drives the GPU, on all its cores as DeepSpeed's CPU Adam does, timed with the host clock.

use std::time::Instant;

/// Learning rate of the timed steps (keeps the parameters near where they started).
const LR: f32 = 1e-4;
const BETA1: f32 = 0.9;
const BETA2: f32 = 0.999;
const EPS: f32 = 1e-8;
const WEIGHT_DECAY: f32 = 0.01;
/// Fewest parameters worth a thread of their own.
const MIN_CHUNK: usize = 1 << 16;

/// f32 parameters, gradients and moments, grown on first need and reused.
pub(super) struct HostAdam {
    p: Vec<f32>,
    g: Vec<f32>,
    m: Vec<f32>,
    v: Vec<f32>,
    step: u32,
    threads: usize,
}

impl HostAdam {
    pub(super) fn new() -> HostAdam {
        let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        HostAdam { p: Vec::new(), g: Vec::new(), m: Vec::new(), v: Vec::new(), step: 0, threads }
    }

    /// Seconds one AdamW step over `params` parameters takes.
    pub(super) fn run(&mut self, params: usize) -> f64 {
        if params == 0 {
            return 0.0;
        }
        // Filled outside the timed region, so the step touches no fresh pages.
        for (i, buf) in [&mut self.p, &mut self.g, &mut self.m, &mut self.v].into_iter().enumerate() {
            grow(buf, params, i as u64 + 1);
        }
        self.step = self.step.saturating_add(1);
        let step = self.step;
        let chunk = params.div_ceil(self.threads).max(MIN_CHUNK);
        let (p, g) = (&mut self.p[..params], &self.g[..params]);
        let (m, v) = (&mut self.m[..params], &mut self.v[..params]);
        let start = Instant::now();
        std::thread::scope(|s| {
            let parts = p.chunks_mut(chunk).zip(g.chunks(chunk)).zip(m.chunks_mut(chunk)).zip(v.chunks_mut(chunk));
            for (((p, g), m), v) in parts {
                s.spawn(move || adam(p, g, m, v, step));
            }
        });
        start.elapsed().as_secs_f64()
    }
}

/// One AdamW step in place.
fn adam(p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], step: u32) {
    let c1 = 1.0 / (1.0 - BETA1.powi(step as i32));
    let c2 = 1.0 / (1.0 - BETA2.powi(step as i32));
    for (((p, &g), m), v) in p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
        *m = BETA1 * *m + (1.0 - BETA1) * g;
        *v = BETA2 * *v + (1.0 - BETA2) * g * g;
        let update = (*m * c1) / ((*v * c2).sqrt() + EPS);
        *p -= LR * (update + WEIGHT_DECAY * *p);
    }
}

/// Grows `buf` to `len` values in [0, 1) (non-negative, so second moments stay valid).
fn grow(buf: &mut Vec<f32>, len: usize, salt: u64) {
    let mut s = 0x9e37_79b9_7f4a_7c15u64.wrapping_mul(salt.wrapping_add(buf.len() as u64 + 1)) | 1;
    while buf.len() < len {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        buf.push((s >> 40) as f32 / (1u64 << 24) as f32);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_is_timed_and_moves_the_parameters() {
        let mut adam = HostAdam::new();
        assert_eq!(adam.run(0), 0.0);
        let t = adam.run(3 * MIN_CHUNK + 5);
        assert!(t > 0.0 && t.is_finite(), "{t}");
        let before = adam.p.clone();
        adam.run(3 * MIN_CHUNK + 5);
        assert!(adam.p.iter().all(|a| a.is_finite()));
        // (A parameter that is exactly 0 with a zero moment stays put.)
        let moved = adam.p.iter().zip(&before).filter(|(a, b)| a != b).count();
        assert!(moved + 16 >= before.len(), "{moved} of {}", before.len());
        assert_eq!(adam.step, 2);
    }
}
