//! Failure rates of a training cluster, per component and device-hour, with the published
//! presets; the checkpoint interval that minimises the expected lost time (Young 1974, Daly
//! 2006).

use serde::Serialize;

/// The components an interruption is charged to, in report order.
pub const COMPONENTS: [&str; 7] = ["gpu", "hbm", "nic", "switch", "host", "software", "maintenance"];

/// Index of the planned-maintenance component: it interrupts the job, but the job checkpoints
/// before it stops, so no work is lost.
pub const MAINTENANCE: usize = 6;

/// Failure presets (`run.failures`).
pub const PRESETS: &[&str] = &["none", "llama3-2024"];

/// Interruptions per device-hour, per component (see [`COMPONENTS`]).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FailureRates {
    /// The preset the rates start from (`"custom"` when none).
    pub name: String,
    pub per_device_hour: [f64; 7],
}

/// Llama 3 405B's 54-day snapshot on 16,384 H100 GPUs (Llama Team, "The Llama 3 Herd of
/// Models", arXiv 2407.21783, section 3.3.4 and its table of root causes): 466 interruptions,
/// 47 planned and 419 unexpected. Unexpected ones by cause, grouped here by component:
/// - gpu 196: faulty GPU 148, GPU SRAM memory 19, GPU system processor 17, silent data
///   corruption 6, GPU thermal interface and sensor 6;
/// - hbm 72: GPU HBM3 memory;
/// - nic 7;
/// - switch 35: network switch and cable;
/// - host 46: host maintenance (unplanned) 32, SSD 3, power supply 3, server chassis 2, IO
///   expansion board 2, CPU 2, system memory 2;
/// - software 63: software bug 54, NCCL watchdog timeouts 7, dependency 2.
///
/// (The paper prints 30.1% beside the 148 faulty-GPU interruptions, which is 35.3% of 419; the
/// counts are used here.) Each count is divided by the snapshot's 16,384 x 54 x 24 GPU-hours.
const LLAMA3_2024_COUNTS: [f64; 7] = [196.0, 72.0, 7.0, 35.0, 46.0, 63.0, 47.0];
const LLAMA3_2024_GPU_HOURS: f64 = 16384.0 * 54.0 * 24.0;

impl FailureRates {
    pub fn none() -> Self {
        FailureRates { name: "none".into(), per_device_hour: [0.0; 7] }
    }

    /// A preset by name (see [`PRESETS`]).
    pub fn preset(name: &str) -> Option<Self> {
        match name {
            "none" => Some(Self::none()),
            "llama3-2024" => Some(FailureRates {
                name: name.into(),
                per_device_hour: LLAMA3_2024_COUNTS.map(|c| c / LLAMA3_2024_GPU_HOURS),
            }),
            _ => None,
        }
    }

    /// Interruptions per second of a job on `devices` devices, all components.
    pub fn per_s(&self, devices: u32) -> f64 {
        self.per_device_hour.iter().sum::<f64>() * f64::from(devices) / 3600.0
    }

    /// Unexpected interruptions (all but planned maintenance) per second on `devices` devices.
    pub fn unexpected_per_s(&self, devices: u32) -> f64 {
        self.per_device_hour.iter().take(MAINTENANCE).sum::<f64>() * f64::from(devices) / 3600.0
    }
}

/// The compute time between checkpoints that minimises the expected run time, for a save
/// that stalls training `save_s` and unexpected failures every `mtbf_s` on average: Daly's
/// higher-order estimate (J. T. Daly, "A higher order estimate of the optimum checkpoint
/// interval for restart dumps", FGCS 22(3), 2006, eq. 37), which refines Young's
/// `sqrt(2 δ M)`; `M` itself when `δ ≥ 2M`. Infinite with no failures.
pub fn daly_interval_s(save_s: f64, mtbf_s: f64) -> f64 {
    if !mtbf_s.is_finite() {
        return f64::INFINITY;
    }
    if save_s <= 0.0 {
        // A free checkpoint: as often as the engine counts them (one per iteration in practice).
        return 0.0;
    }
    if save_s >= 2.0 * mtbf_s {
        return mtbf_s;
    }
    let x = save_s / (2.0 * mtbf_s);
    (2.0 * save_s * mtbf_s).sqrt() * (1.0 + x.sqrt() / 3.0 + x / 9.0) - save_s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama3_preset_reproduces_the_snapshot_counts() {
        let r = FailureRates::preset("llama3-2024").expect("preset");
        let hours = 54.0 * 24.0;
        let expected = r.per_s(16384) * hours * 3600.0;
        assert!((expected - 466.0).abs() < 1e-6, "{expected}");
        let unexpected = r.unexpected_per_s(16384) * hours * 3600.0;
        assert!((unexpected - 419.0).abs() < 1e-6, "{unexpected}");
        // About one unexpected interruption every three hours, as the paper says.
        let mtbf_h = 1.0 / r.unexpected_per_s(16384) / 3600.0;
        assert!((3.0..3.2).contains(&mtbf_h), "{mtbf_h}");
    }

    #[test]
    fn daly_refines_young() {
        // Small save cost: Young's sqrt(2 δ M) to first order.
        let (d, m) = (10.0f64, 1e5f64);
        let young = (2.0 * d * m).sqrt();
        let daly = daly_interval_s(d, m);
        assert!((daly - young).abs() / young < 0.02, "{daly} vs {young}");
        assert_eq!(daly_interval_s(300.0, 100.0), 100.0);
        assert!(daly_interval_s(1.0, f64::INFINITY).is_infinite());
    }
}
