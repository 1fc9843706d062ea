//! Memory over an iteration: each simulated device's usage by kind as a step function of time,
//! built from a recorded [`Timeline`], and its CSV form. Pure: no I/O.
//!
//! A device's HBM curve starts at time 0 with its static part (`static_hbm`), then has one
//! point per memory sample of the device (the static part plus the sample's dynamic
//! activations and buffers), and ends with a point at the end of the iteration. Several
//! samples at one time become one point holding the last of them (a sample at time 0 replaces
//! the starting point), so point times strictly increase; each point's value holds until the
//! next point. A device with host memory (`static_host`, total above zero) also gets a constant
//! host curve: one point at 0 and one at the end of the iteration.

use std::collections::HashMap;

use serde::Serialize;

use super::timeline::{MemoryBreakdown, MemorySample, Timeline};

/// Tier name of device memory.
pub const HBM: &str = "hbm";
/// Tier name of host memory (offloaded state).
pub const HOST: &str = "host";

/// Header of [`curves_csv`].
pub const CSV_HEADER: &str = "device,tier,time_ns,time_s,weights_bytes,gradients_bytes,optimizer_bytes,\
activations_bytes,buffers_bytes,total_bytes,capacity_bytes";

/// A device's memory in one tier from `time_ns` until the next point of the same tier.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct MemoryPoint {
    pub time_ns: u64,
    /// [`HBM`] or [`HOST`].
    pub tier: &'static str,
    pub breakdown: MemoryBreakdown,
}

/// The HBM curve of `device` (a cluster device id), then its host curve if it has host memory.
/// Empty if `device` was not simulated.
pub fn device_curve(t: &Timeline, device: u32) -> Vec<MemoryPoint> {
    let Some(i) = t.devices.iter().position(|&d| d == device) else {
        return Vec::new();
    };
    let mut samples: Vec<&MemorySample> = t.memory.iter().filter(|m| m.device == device).collect();
    if !samples.is_sorted_by_key(|m| m.time_ns) {
        samples.sort_by_key(|m| m.time_ns);
    }
    let mut out = Vec::with_capacity(samples.len() + 4);
    push_curve(t, i, samples.into_iter(), true, &mut out);
    out
}

/// The simulated device whose HBM curve reaches the highest total (ties: the lowest device id);
/// `None` if no device was simulated.
pub fn peak_device(t: &Timeline) -> Option<u32> {
    let groups = Groups::new(t);
    let mut curve = Vec::new();
    let mut best: Option<(f64, u32)> = None;
    for (i, &device) in t.devices.iter().enumerate() {
        if !groups.first(i) {
            continue;
        }
        curve.clear();
        push_curve(t, i, groups.samples(t, i), false, &mut curve);
        let peak = curve.iter().map(|p| p.breakdown.total()).max_by(f64::total_cmp).unwrap_or(0.0);
        let better = match best {
            None => true,
            Some((b, d)) => match peak.total_cmp(&b) {
                std::cmp::Ordering::Greater => true,
                std::cmp::Ordering::Equal => device < d,
                std::cmp::Ordering::Less => false,
            },
        };
        if better {
            best = Some((peak, device));
        }
    }
    best.map(|(_, d)| d)
}

/// Every simulated device's curves as CSV ([`CSV_HEADER`], then one row per point: devices in
/// `t.devices` order, each HBM then host). Bytes are rounded to the nearest byte (total_bytes
/// is the rounded exact total, so it may differ by a byte or two from the sum of the rounded
/// parts); time_s has 9 decimals; capacity_bytes is the tier's capacity.
pub fn curves_csv(t: &Timeline) -> String {
    let groups = Groups::new(t);
    let mut out: Vec<u8> = Vec::with_capacity(CSV_HEADER.len() + 1 + (t.memory.len() + 4 * t.devices.len()) * 112);
    out.extend_from_slice(CSV_HEADER.as_bytes());
    out.push(b'\n');
    let mut curve = Vec::new();
    for (i, &device) in t.devices.iter().enumerate() {
        if !groups.first(i) {
            continue;
        }
        curve.clear();
        push_curve(t, i, groups.samples(t, i), true, &mut curve);
        for p in &curve {
            let capacity = if p.tier == HOST { t.host_capacity_bytes } else { t.hbm_capacity_bytes };
            push_row(&mut out, device, p, capacity);
        }
    }
    String::from_utf8(out).expect("the CSV is ASCII")
}

/// Appends the curve of the device at index `i` of `t.devices`, given its samples in time order.
fn push_curve<'a>(
    t: &Timeline,
    i: usize,
    samples: impl Iterator<Item = &'a MemorySample>,
    with_host: bool,
    out: &mut Vec<MemoryPoint>,
) {
    let base = t.static_hbm.get(i).copied().unwrap_or_default();
    let first = out.len();
    out.push(MemoryPoint { time_ns: 0, tier: HBM, breakdown: base });
    for s in samples {
        // The dynamic "buffers" channel carries model chunks moving in and out (Gemini).
        let breakdown = MemoryBreakdown {
            activations: base.activations + s.activations,
            weights: base.weights + s.moved_weights,
            ..base
        };
        let last = out.last_mut().expect("the curve has its starting point");
        if last.time_ns == s.time_ns {
            last.breakdown = breakdown;
        } else {
            out.push(MemoryPoint { time_ns: s.time_ns, tier: HBM, breakdown });
        }
    }
    let last = out[out.len() - 1];
    let end_ns = t.iteration_ns.max(last.time_ns);
    if end_ns > last.time_ns {
        out.push(MemoryPoint { time_ns: end_ns, ..last });
    }
    debug_assert!(out[first..].windows(2).all(|w| w[0].time_ns < w[1].time_ns));
    if !with_host {
        return;
    }
    let host = t.static_host.get(i).copied().unwrap_or_default();
    if host.total() > 0.0 {
        out.push(MemoryPoint { time_ns: 0, tier: HOST, breakdown: host });
        if end_ns > 0 {
            out.push(MemoryPoint { time_ns: end_ns, tier: HOST, breakdown: host });
        }
    }
}

/// The memory samples grouped by simulated device in one pass (a counting sort that keeps
/// their order), each group sorted by time.
struct Groups {
    /// `t.devices` index -> index of the first entry for the same device id.
    owner: Vec<usize>,
    /// Group of index `i`: `order[offsets[i]..offsets[i + 1]]` (indices into `t.memory`).
    offsets: Vec<usize>,
    order: Vec<usize>,
}

impl Groups {
    fn new(t: &Timeline) -> Groups {
        let n = t.devices.len();
        // Device id -> index of its first entry in `t.devices`: a table when the ids are
        // small (the usual case), a map otherwise.
        let max_id = t.devices.iter().copied().max().unwrap_or(0) as usize;
        let dense = max_id < (1 << 22);
        let mut table: Vec<usize> = if dense { vec![usize::MAX; max_id + 1] } else { Vec::new() };
        let mut map: HashMap<u32, usize> = HashMap::new();
        let mut owner = Vec::with_capacity(n);
        for (i, &d) in t.devices.iter().enumerate() {
            let slot = if dense { &mut table[d as usize] } else { map.entry(d).or_insert(usize::MAX) };
            if *slot == usize::MAX {
                *slot = i;
            }
            owner.push(*slot);
        }
        let index_of = |d: u32| -> Option<usize> {
            if dense { table.get(d as usize).copied().filter(|&i| i != usize::MAX) } else { map.get(&d).copied() }
        };
        let groups: Vec<Option<usize>> = t.memory.iter().map(|m| index_of(m.device)).collect();
        let mut offsets = vec![0usize; n + 1];
        for g in groups.iter().flatten() {
            offsets[g + 1] += 1;
        }
        for i in 0..n {
            offsets[i + 1] += offsets[i];
        }
        let mut next = offsets.clone();
        let mut order = vec![0usize; offsets[n]];
        for (k, g) in groups.iter().enumerate() {
            if let Some(g) = *g {
                order[next[g]] = k;
                next[g] += 1;
            }
        }
        for i in 0..n {
            let group = &mut order[offsets[i]..offsets[i + 1]];
            if !group.is_sorted_by_key(|&k| t.memory[k].time_ns) {
                group.sort_by_key(|&k| t.memory[k].time_ns);
            }
        }
        Groups { owner, offsets, order }
    }

    /// Whether index `i` of `t.devices` is the first entry of its device id.
    fn first(&self, i: usize) -> bool {
        self.owner[i] == i
    }

    fn samples<'a>(&'a self, t: &'a Timeline, i: usize) -> impl Iterator<Item = &'a MemorySample> + 'a {
        self.order[self.offsets[i]..self.offsets[i + 1]].iter().map(move |&k| &t.memory[k])
    }
}

/// Appends one CSV row.
fn push_row(out: &mut Vec<u8>, device: u32, p: &MemoryPoint, capacity: f64) {
    let b = &p.breakdown;
    push_u64(out, device as u64);
    out.push(b',');
    out.extend_from_slice(p.tier.as_bytes());
    out.push(b',');
    push_u64(out, p.time_ns);
    out.push(b',');
    push_u64(out, p.time_ns / 1_000_000_000);
    out.push(b'.');
    let mut frac = p.time_ns % 1_000_000_000;
    let mut digits = [b'0'; 9];
    for d in digits.iter_mut().rev() {
        *d = b'0' + (frac % 10) as u8;
        frac /= 10;
    }
    out.extend_from_slice(&digits);
    for v in [b.weights, b.gradients, b.optimizer, b.activations, b.buffers, b.total(), capacity] {
        out.push(b',');
        push_i64(out, bytes(v));
    }
    out.push(b'\n');
}

/// Rounded to the nearest byte, halves away from zero (NaN: 0; beyond i64: saturated).
fn bytes(v: f64) -> i64 {
    v.round() as i64
}

fn push_u64(out: &mut Vec<u8>, mut v: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[i..]);
}

fn push_i64(out: &mut Vec<u8>, v: i64) {
    if v < 0 {
        out.push(b'-');
    }
    push_u64(out, v.unsigned_abs());
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

    fn mb(weights: f64, gradients: f64, optimizer: f64, activations: f64, buffers: f64) -> MemoryBreakdown {
        MemoryBreakdown { weights, gradients, optimizer, activations, buffers }
    }

    fn sample(device: u32, time_ns: u64, activations: f64, moved_weights: f64) -> MemorySample {
        MemorySample { device, time_ns, activations, moved_weights }
    }

    /// Two simulated devices (cluster ids 4 and 6), no host memory.
    fn two_devices() -> Timeline {
        Timeline {
            devices: vec![4, 6],
            stages: vec![0, 1],
            static_hbm: vec![mb(100.0, 50.0, 200.0, 0.0, 10.0), mb(80.0, 40.0, 160.0, 5.0, 0.0)],
            hbm_capacity_bytes: 80.0 * GIB,
            host_capacity_bytes: 256.0 * GIB,
            memory: vec![
                sample(4, 10, 30.0, 1.0),
                sample(6, 15, 20.0, 0.0),
                sample(4, 20, 60.0, 2.0),
                sample(4, 20, 45.0, 2.0), // same time: replaces the one before
                sample(6, 40, 0.0, 0.0),
                sample(4, 50, 0.0, 0.0),
                sample(9, 5, 1e12, 0.0), // not a simulated device: ignored
            ],
            iteration_ns: 100,
            ..Timeline::default()
        }
    }

    fn totals(c: &[MemoryPoint]) -> Vec<(u64, &'static str, f64)> {
        c.iter().map(|p| (p.time_ns, p.tier, p.breakdown.total())).collect()
    }

    #[test]
    fn step_values_with_coalescing_and_final_point() {
        let t = two_devices();
        let c = device_curve(&t, 4);
        assert_eq!(
            c.iter().map(|p| p.time_ns).collect::<Vec<_>>(),
            vec![0, 10, 20, 50, 100],
            "one point per distinct time, then the end"
        );
        assert!(c.iter().all(|p| p.tier == HBM));
        assert_eq!(c[0].breakdown, mb(100.0, 50.0, 200.0, 0.0, 10.0));
        assert_eq!(c[1].breakdown, mb(101.0, 50.0, 200.0, 30.0, 10.0));
        assert_eq!(c[2].breakdown, mb(102.0, 50.0, 200.0, 45.0, 10.0));
        assert_eq!(c[3].breakdown, c[0].breakdown);
        assert_eq!(c[4].breakdown, c[3].breakdown);
        // Static activations are kept under the dynamic ones.
        let c6 = device_curve(&t, 6);
        assert_eq!(totals(&c6), vec![(0, HBM, 285.0), (15, HBM, 305.0), (40, HBM, 285.0), (100, HBM, 285.0)]);
        assert_eq!(c6[1].breakdown.activations, 25.0);
        // Not simulated.
        assert!(device_curve(&t, 9).is_empty());
    }

    #[test]
    fn sample_at_zero_and_at_end() {
        let mut t = two_devices();
        t.memory = vec![sample(4, 0, 7.0, 0.0), sample(4, 0, 8.0, 0.0), sample(4, 100, 0.0, 0.0)];
        let c = device_curve(&t, 4);
        assert_eq!(totals(&c), vec![(0, HBM, 368.0), (100, HBM, 360.0)]);
        // A sample past the nominal end extends the curve to it.
        t.memory.push(sample(4, 120, 1.0, 0.0));
        let c = device_curve(&t, 4);
        assert_eq!(c.last().unwrap().time_ns, 120);
        assert_eq!(c.len(), 3);
        // No samples: the static part from 0 to the end.
        let c6 = device_curve(&t, 6);
        assert_eq!(totals(&c6), vec![(0, HBM, 285.0), (100, HBM, 285.0)]);
        // An empty iteration: one point.
        t.iteration_ns = 0;
        t.memory.clear();
        assert_eq!(device_curve(&t, 6).len(), 1);
    }

    #[test]
    fn unsorted_samples_are_put_in_time_order() {
        let mut t = two_devices();
        let mut shuffled = t.memory.clone();
        shuffled.swap(0, 5);
        // Keep the two samples at time 20 in their order.
        let (a, b) =
            (shuffled.iter().position(|m| m.activations == 60.0), shuffled.iter().position(|m| m.activations == 45.0));
        assert!(a < b);
        let sorted_curve = device_curve(&t, 4);
        let sorted_csv = curves_csv(&t);
        t.memory = shuffled;
        assert_eq!(device_curve(&t, 4), sorted_curve);
        assert_eq!(curves_csv(&t), sorted_csv);
    }

    #[test]
    fn peak_device_and_ties() {
        let mut t = two_devices();
        // Device 4 peaks at 360 + 47 = 407, device 6 at 305.
        assert_eq!(peak_device(&t), Some(4));
        t.memory.push(sample(6, 60, 112.0, 0.0)); // 285 + 112 = 397
        assert_eq!(peak_device(&t), Some(4));
        t.memory.push(sample(6, 70, 122.0, 0.0)); // 407: a tie, the lowest id wins
        assert_eq!(peak_device(&t), Some(4));
        t.devices = vec![6, 4];
        t.static_hbm.swap(0, 1);
        assert_eq!(peak_device(&t), Some(4));
        t.memory.push(sample(6, 80, 123.0, 0.0));
        assert_eq!(peak_device(&t), Some(6));
        // A transient sample replaced at the same time does not count.
        t.memory.push(sample(4, 90, 1000.0, 0.0));
        t.memory.push(sample(4, 90, 0.0, 0.0));
        assert_eq!(peak_device(&t), Some(6));
        assert_eq!(peak_device(&Timeline::default()), None);
    }

    #[test]
    fn csv_header_rows_and_determinism() {
        let t = two_devices();
        let csv = curves_csv(&t);
        assert_eq!(csv, curves_csv(&t));
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines[0], CSV_HEADER);
        assert_eq!(
            CSV_HEADER,
            "device,tier,time_ns,time_s,weights_bytes,gradients_bytes,optimizer_bytes,activations_bytes,\
buffers_bytes,total_bytes,capacity_bytes"
        );
        assert_eq!(lines.len(), 1 + 5 + 4);
        assert!(csv.ends_with('\n'));
        let cap = (80.0 * GIB) as i64;
        assert_eq!(lines[1], format!("4,hbm,0,0.000000000,100,50,200,0,10,360,{cap}"));
        assert_eq!(lines[3], format!("4,hbm,20,0.000000020,102,50,200,45,10,407,{cap}"));
        assert_eq!(lines[6], format!("6,hbm,0,0.000000000,80,40,160,5,0,285,{cap}"));
        for l in &lines {
            assert_eq!(l.split(',').count(), 11, "{l}");
        }
    }

    #[test]
    fn csv_numbers() {
        let t = Timeline {
            devices: vec![0],
            static_hbm: vec![mb(2.5, -0.4, 1e15 + 0.5, 0.0, 0.49)],
            memory: vec![sample(0, 1_234_567_890_123, 1.5, 0.0)],
            iteration_ns: 12_000_000_000,
            hbm_capacity_bytes: 1000.4,
            ..Timeline::default()
        };
        let csv = curves_csv(&t);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 3, "{csv}");
        // Halves away from zero, -0.4 prints 0, big values exact.
        assert_eq!(lines[1], "0,hbm,0,0.000000000,3,0,1000000000000001,0,0,1000000000000003,1000");
        assert_eq!(lines[2], "0,hbm,1234567890123,1234.567890123,3,0,1000000000000001,2,0,1000000000000005,1000");
        // The end was before the sample: no extra point.
        assert!(!csv.contains("12.000000000"));
    }

    #[test]
    fn host_tier() {
        let mut t = two_devices();
        t.static_host = vec![mb(0.0, 0.0, 3.0 * GIB, 0.0, 0.0), MemoryBreakdown::default()];
        let c = device_curve(&t, 4);
        let host: Vec<&MemoryPoint> = c.iter().filter(|p| p.tier == HOST).collect();
        assert_eq!(host.len(), 2);
        assert_eq!((host[0].time_ns, host[1].time_ns), (0, 100));
        assert_eq!(host[0].breakdown.optimizer, 3.0 * GIB);
        // HBM first, then host.
        assert_eq!(c.iter().position(|p| p.tier == HOST), Some(c.len() - 2));
        // A zero host breakdown gives no host points.
        assert!(device_curve(&t, 6).iter().all(|p| p.tier == HBM));
        // The host tier does not count for the HBM peak.
        t.static_host[1].optimizer = 1e15;
        assert_eq!(peak_device(&t), Some(4));
        let csv = curves_csv(&t);
        let host_rows: Vec<&str> = csv.lines().filter(|l| l.contains(",host,")).collect();
        assert_eq!(host_rows.len(), 4);
        let cap = (256.0 * GIB) as i64;
        assert_eq!(
            host_rows[0],
            format!("4,host,0,0.000000000,0,0,{},0,0,{},{cap}", (3.0 * GIB) as i64, (3.0 * GIB) as i64)
        );
        assert!(host_rows[3].starts_with("6,host,100,0.000000100,"));
        // Rows: device 4 hbm, device 4 host, device 6 hbm, device 6 host.
        let tiers: Vec<(&str, &str)> = csv
            .lines()
            .skip(1)
            .map(|l| {
                let mut f = l.split(',');
                (f.next().unwrap(), f.next().unwrap())
            })
            .collect();
        let mut runs = tiers.clone();
        runs.dedup();
        assert_eq!(runs, vec![("4", "hbm"), ("4", "host"), ("6", "hbm"), ("6", "host")]);
    }

    /// The one-pass grouping of `curves_csv` agrees with `device_curve`, on many samples of
    /// many devices with sparse ids.
    #[test]
    fn grouped_matches_per_device() {
        for base in [0u32, 10_000_000] {
            let devices: Vec<u32> = (0..16).map(|d| base + d * 3).collect();
            let mut t = Timeline {
                static_hbm: (0..16).map(|d| mb(d as f64, 1.0, 2.0, 0.0, 0.5)).collect(),
                static_host: (0..16).map(|d| mb(0.0, 0.0, (d % 2) as f64, 0.0, 0.0)).collect(),
                devices,
                iteration_ns: 1_000_000,
                hbm_capacity_bytes: 1e9,
                host_capacity_bytes: 1e10,
                ..Timeline::default()
            };
            let mut x = 12345u64;
            for k in 0..200_000u64 {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let d = base + ((x >> 33) % 17) as u32 * 3; // one id in 17 is not simulated
                t.memory.push(sample(d, k / 3, ((x >> 20) % 1000) as f64, ((x >> 40) % 7) as f64));
            }
            let csv = curves_csv(&t);
            let mut expected = String::from(CSV_HEADER);
            expected.push('\n');
            let mut rows = 0;
            for &d in &t.devices {
                let c = device_curve(&t, d);
                rows += c.len();
                for p in &c {
                    let cap = if p.tier == HOST { t.host_capacity_bytes } else { t.hbm_capacity_bytes };
                    let mut v = Vec::new();
                    push_row(&mut v, d, p, cap);
                    expected.push_str(std::str::from_utf8(&v).unwrap());
                }
            }
            assert!(rows > 150_000);
            assert_eq!(csv, expected);
            let best = t
                .devices
                .iter()
                .map(|&d| {
                    let peak = device_curve(&t, d)
                        .iter()
                        .filter(|p| p.tier == HBM)
                        .map(|p| p.breakdown.total())
                        .fold(f64::MIN, f64::max);
                    (peak, std::cmp::Reverse(d))
                })
                .max_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
                .unwrap();
            assert_eq!(peak_device(&t), Some(best.1.0));
        }
    }

    #[test]
    fn duplicate_device_entries_are_listed_once() {
        let mut t = two_devices();
        t.devices = vec![4, 6, 4];
        t.static_hbm.push(MemoryBreakdown::default());
        let csv = curves_csv(&t);
        assert_eq!(csv.lines().count(), 1 + 5 + 4);
    }
}
