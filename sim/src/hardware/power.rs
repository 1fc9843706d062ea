//! A GPU's board power limit and what it does to compute-bound kernels.
//!
//! A GPU running GEMMs sits at its power limit: on an H200 and an H100 SXM (700 W) the SMs
//! clocked at 1,324-1,404 MHz of 1,980 beside back-to-back cuBLAS GEMMs, at 1,634-1,647 beside
//! cuDNN attention and at the top clock beside memory-bound kernels (trainsim's
//! `experiments/executor/gpu/interference.py --delays`, `traces/2026-11-27-cuda-h200/` and
//! `-h100/`). Held there for 10 s, bf16 GEMMs ran at 660 TFLOP/s at 1.42-1.47 GHz, 84% of the
//! tensor peak at that clock (`sustained.json`): bound by the clock, so their speed follows it.
//! A lower limit takes clock from exactly those kernels. How much: dynamic power
//! grows as clock x voltage squared and, in the range where the voltage follows the clock, as
//! the clock cubed (the textbook DVFS relation, P ~ C V^2 f), so a compute-bound kernel's clock
//! goes as the cube root of the power it is given above the idle draw (leakage, memory, the
//! board: what no clock change buys back).
//!
//! The catalog's compute efficiencies (GEMM efficiency, the fused-attention tables) were
//! measured on cards at their rated power. A card capped lower (`power_limit_w`) runs its
//! compute-bound kernels at ((limit - idle) / (rated - idle))^(1/3) of that rate; memory-bound
//! kernels keep theirs (they ran at the top clock). The exponent is an assumption, not a
//! measurement: trainsim cannot change a lent GPU's limit, and no published GEMM-versus-cap curve
//! is in the catalog. It is the mildest law: below a voltage floor the clock falls as the power
//! itself, and a throughput that follows the clock (GEMMs at these clocks) falls with it, so a
//! capped card may be slower than charged. A limit above the rated power buys nothing here
//! (the clock's own ceiling is not modelled).

use serde::Serialize;

/// A GPU's power: what its catalog rates assume, and what it is limited to.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Power {
    /// Board power the preset's compute efficiencies were measured at (its default limit).
    pub rated_w: f64,
    /// Draw with nothing running: the part no clock change buys back.
    pub idle_w: f64,
    /// The board power limit the device runs at.
    pub limit_w: f64,
}

/// Idle draw as a share of rated power where the catalog has no measurement of a part:
/// the H100 SXM's measured 72 W of 700 (`traces/2026-11-27-cuda-h100/machine.txt`).
pub const IDLE_SHARE: f64 = 72.0 / 700.0;

impl Power {
    /// A part at its rated power, idle drawing `idle_w` (measured) or [`IDLE_SHARE`] of it.
    pub fn rated(rated_w: f64, idle_w: Option<f64>) -> Power {
        Power { rated_w, idle_w: idle_w.unwrap_or(IDLE_SHARE * rated_w), limit_w: rated_w }
    }

    /// The speed of compute-bound kernels at the limit, as a share of their speed at the
    /// rated power (1 at or above it).
    pub fn compute_speed(&self) -> f64 {
        if self.limit_w >= self.rated_w {
            return 1.0;
        }
        ((self.limit_w - self.idle_w) / (self.rated_w - self.idle_w)).max(0.0).cbrt()
    }
}

#[cfg(test)]
mod tests {
    use super::Power;

    #[test]
    fn a_lower_limit_slows_compute_by_the_cube_root_of_the_dynamic_power() {
        let mut p = Power::rated(700.0, Some(72.0));
        assert_eq!(p.compute_speed(), 1.0);
        p.limit_w = 500.0;
        let want = (428.0f64 / 628.0).cbrt();
        assert!((p.compute_speed() - want).abs() < 1e-12 && want > 0.87 && want < 0.89);
        p.limit_w = 900.0;
        assert_eq!(p.compute_speed(), 1.0, "no gain above the rated power");
        assert!((Power::rated(400.0, None).idle_w - 400.0 * 72.0 / 700.0).abs() < 1e-9);
    }
}
