//! Memory chart of one device over a recorded iteration (PNG or SVG), drawn with plotters and
//! the embedded DejaVu font (no system font needed).
//!
//! The device's HBM usage as a stacked area by kind (weights, gradients, optimizer,
//! activations, buffers; a step function, each value holding until the next change), time in
//! milliseconds on x, GiB on y, and a dashed line at the HBM capacity. Curves with more changes
//! than pixel columns are reduced to one step per column keeping the column's highest state,
//! so peaks stay visible.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use sim::report::memory::{HBM, HOST, MemoryPoint, device_curve};
use sim::report::timeline::{MemoryBreakdown, Timeline};

const WIDTH: u32 = 1400;
const HEIGHT: u32 = 720;
const HEADER_PX: u32 = 78;
const MARGIN_PX: u32 = 12;
const X_LABEL_PX: u32 = 48;
const Y_LABEL_PX: u32 = 84;
/// Most steps drawn (about one per pixel column of the plot area).
const MAX_STEPS: usize = 1300;
const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// The memory kinds, bottom to top of the stack.
const KINDS: [Kind; 5] = [Kind::Weights, Kind::Gradients, Kind::Optimizer, Kind::Activations, Kind::Buffers];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Weights,
    Gradients,
    Optimizer,
    Activations,
    Buffers,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Weights => "weights",
            Kind::Gradients => "gradients",
            Kind::Optimizer => "optimizer",
            Kind::Activations => "activations",
            Kind::Buffers => "buffers",
        }
    }

    fn color(self) -> RGBColor {
        match self {
            Kind::Weights => RGBColor(31, 119, 180),
            Kind::Gradients => RGBColor(255, 127, 14),
            Kind::Optimizer => RGBColor(44, 160, 44),
            Kind::Activations => RGBColor(148, 103, 189),
            Kind::Buffers => RGBColor(140, 140, 140),
        }
    }

    fn of(self, b: &MemoryBreakdown) -> f64 {
        match self {
            Kind::Weights => b.weights,
            Kind::Gradients => b.gradients,
            Kind::Optimizer => b.optimizer,
            Kind::Activations => b.activations,
            Kind::Buffers => b.buffers,
        }
    }
}

const CAPACITY_COLOR: RGBColor = RGBColor(214, 39, 40);

use crate::figure::{Figure, header, image_format, render};

/// Draws the HBM memory of `device` (a cluster device id) over the iteration recorded in `t`
/// to `path`: PNG if it ends in `.png`, SVG if `.svg`. An empty `title` gives a default one.
pub fn draw(t: &Timeline, device: u32, path: &Path, title: &str) -> Result<(), String> {
    let format = image_format(path, "memory plot")?;
    let curve = device_curve(t, device);
    if curve.is_empty() {
        let mut known: Vec<String> = t.devices.iter().take(8).map(|d| d.to_string()).collect();
        if t.devices.len() > 8 {
            known.push("...".to_string());
        }
        return Err(if t.devices.is_empty() {
            format!("memory plot: device {device} was not simulated (no device was)")
        } else {
            format!("memory plot: device {device} was not simulated (simulated: {})", known.join(", "))
        });
    }
    let hbm: Vec<MemoryPoint> = curve.iter().filter(|p| p.tier == HBM).copied().collect();
    let host = curve.iter().find(|p| p.tier == HOST).map(|p| p.breakdown.total());
    let peak = hbm.iter().map(|p| p.breakdown.total()).fold(0.0, f64::max);
    let capacity = t.hbm_capacity_bytes;

    let mut subtitle = if capacity > 0.0 {
        format!("device {device}, peak {} GiB of {} GiB", gib(peak), gib(capacity))
    } else {
        format!("device {device}, peak {} GiB", gib(peak))
    };
    if capacity > 0.0 && peak > capacity {
        subtitle.push_str(" (over capacity)");
    }
    if let Some(h) = host {
        subtitle.push_str(&format!("; {} GiB on host", gib(h)));
    }
    let title = if title.is_empty() { "memory over the iteration" } else { title };
    let chart = Chart { title, subtitle: &subtitle, steps: &steps(&hbm, MAX_STEPS), capacity, peak };
    render(&chart, path, format, (WIDTH, HEIGHT), "memory plot")
}

/// Bytes in GiB: two decimals, or three significant digits below 1 GiB.
fn gib(bytes: f64) -> String {
    let g = bytes / GIB;
    if g.abs() >= 1.0 || g == 0.0 || !g.is_finite() {
        format!("{g:.2}")
    } else {
        let decimals = (2 - g.abs().log10().floor() as i32).clamp(2, 12) as usize;
        format!("{g:.decimals$}")
    }
}

/// The steps to draw, `(start ns, state)` in time order, the last one closing the curve. With
/// more than `columns` steps, the time range is cut into `columns` equal columns and each
/// column drawn at the highest state (by total) it holds, including the state entering it.
fn steps(points: &[MemoryPoint], columns: usize) -> Vec<(u64, MemoryBreakdown)> {
    let all = || points.iter().map(|p| (p.time_ns, p.breakdown)).collect();
    if points.len() <= columns.max(1) + 1 {
        return all();
    }
    let columns = columns.max(1) as u128;
    let end = points[points.len() - 1].time_ns;
    let column = |t: u64| (t as u128 * columns / end.max(1) as u128) as usize;
    let column_start = |c: usize| (c as u128 * end as u128 / columns) as u64;
    let mut out: Vec<(u64, MemoryBreakdown)> = Vec::with_capacity(2 * columns as usize + 2);
    let mut push = |at: u64, b: MemoryBreakdown| {
        if out.last().is_none_or(|l| l.1 != b) {
            out.push((at, b));
        }
    };
    let mut current = 0usize;
    let mut best = points[0].breakdown;
    let mut prev = points[0].breakdown;
    for p in &points[1..points.len() - 1] {
        let c = column(p.time_ns);
        if c != current {
            push(column_start(current), best);
            if c > current + 1 {
                // Columns with no change hold the state that entered them.
                push(column_start(current + 1), prev);
            }
            current = c;
            best = prev;
        }
        if p.breakdown.total() > best.total() {
            best = p.breakdown;
        }
        prev = p.breakdown;
    }
    push(column_start(current), best);
    out.push((end, prev));
    out
}

struct Chart<'a> {
    title: &'a str,
    subtitle: &'a str,
    steps: &'a [(u64, MemoryBreakdown)],
    capacity: f64,
    peak: f64,
}

impl Figure for Chart<'_> {
    fn draw_on<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String>
    where
        DB::ErrorType: 'static,
    {
        let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
        root.fill(&WHITE).map_err(err)?;

        let present: Vec<Kind> =
            KINDS.iter().copied().filter(|k| self.steps.iter().any(|(_, b)| k.of(b) != 0.0)).collect();
        let legend: Vec<(&str, RGBColor)> = present.iter().map(|k| (k.name(), k.color())).collect();
        header(root, self.title, self.subtitle, &legend)?;

        // The chart: x in ms, y in GiB.
        let (_, body) = root.split_vertically(HEADER_PX);
        let end_ns = self.steps.last().map_or(0, |s| s.0);
        let x_max = (end_ns as f64 / 1e6).max(1e-6);
        let y_max = (self.capacity.max(self.peak) / GIB * 1.1).max(1e-6);
        let mut chart = ChartBuilder::on(&body)
            .margin(MARGIN_PX)
            .margin_right(30)
            .margin_top(28)
            .x_label_area_size(X_LABEL_PX)
            .y_label_area_size(Y_LABEL_PX)
            .build_cartesian_2d(0.0..x_max, 0.0..y_max)
            .map_err(err)?;
        let label_style = TextStyle::from(("sans-serif", 14).into_font()).color(&BLACK);
        let x_decimals = decimals(x_max);
        let y_decimals = decimals(y_max);
        let x_fmt = |v: &f64| format!("{v:.x_decimals$}");
        let y_fmt = |v: &f64| format!("{v:.y_decimals$}");
        chart
            .configure_mesh()
            .x_labels(14)
            .y_labels(10)
            .x_label_formatter(&x_fmt)
            .y_label_formatter(&y_fmt)
            .x_desc("time (ms)")
            .axis_desc_style(label_style.clone())
            .label_style(label_style.clone())
            .light_line_style(RGBColor(240, 240, 240))
            .bold_line_style(RGBColor(220, 220, 220))
            .draw()
            .map_err(err)?;
        // The y-axis name, horizontal above the axis (ab_glyph does not rotate text in PNG).
        let (ax, ay) = chart.backend_coord(&(0.0, y_max));
        root.draw(&Text::new("memory (GiB)", (ax - Y_LABEL_PX as i32 + 4, ay - 24), label_style.clone()))
            .map_err(err)?;

        // The stack: one polygon per kind between the cumulative sums below and with it.
        let ms = |ns: u64| ns as f64 / 1e6;
        let step_line = |value: &dyn Fn(&MemoryBreakdown) -> f64| -> Vec<(f64, f64)> {
            let mut v = Vec::with_capacity(2 * self.steps.len());
            for w in self.steps.windows(2) {
                let y = value(&w[0].1) / GIB;
                v.push((ms(w[0].0), y));
                v.push((ms(w[1].0), y));
            }
            v
        };
        for (i, k) in KINDS.iter().enumerate() {
            if !present.contains(k) {
                continue;
            }
            let below = |b: &MemoryBreakdown| KINDS[..i].iter().map(|k| k.of(b)).sum::<f64>();
            let upto = |b: &MemoryBreakdown| KINDS[..=i].iter().map(|k| k.of(b)).sum::<f64>();
            let mut outline = step_line(&upto);
            let mut lower = step_line(&below);
            lower.reverse();
            outline.extend(lower);
            chart.draw_series(std::iter::once(Polygon::new(outline, k.color().filled()))).map_err(err)?;
        }
        // The total, as a thin line on top.
        let top = step_line(&|b: &MemoryBreakdown| b.total());
        chart.draw_series(std::iter::once(PathElement::new(top, RGBColor(40, 40, 40).stroke_width(1)))).map_err(err)?;

        // Capacity.
        if self.capacity > 0.0 {
            let c = self.capacity / GIB;
            chart
                .draw_series(DashedLineSeries::new(vec![(0.0, c), (x_max, c)], 10, 6, CAPACITY_COLOR.stroke_width(2)))
                .map_err(err)?;
            let (px, py) = chart.backend_coord(&(x_max, c));
            let style = TextStyle::from(("sans-serif", 15).into_font())
                .color(&CAPACITY_COLOR)
                .pos(Pos::new(HPos::Right, VPos::Bottom));
            root.draw(&Text::new("HBM capacity", (px - 4, py - 4), style)).map_err(err)?;
        }
        Ok(())
    }
}

/// Decimals for axis labels of a range from 0 to `max` (about 10 labels).
fn decimals(max: f64) -> usize {
    let step = max / 10.0;
    if step >= 1.0 || step.is_nan() || step <= 0.0 { 0 } else { ((-step.log10()).ceil() as usize).min(12) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sim::report::timeline::MemorySample;

    /// A 2-stage pipeline's memory: 4 micro-batches' activations building up then freed.
    fn timeline() -> Timeline {
        let mut t = Timeline {
            devices: vec![2, 3],
            stages: vec![0, 1],
            static_hbm: vec![
                MemoryBreakdown {
                    weights: 14.0 * GIB,
                    gradients: 14.0 * GIB,
                    optimizer: 28.0 * GIB,
                    activations: 0.0,
                    buffers: 1.0 * GIB,
                },
                MemoryBreakdown {
                    weights: 12.0 * GIB,
                    gradients: 12.0 * GIB,
                    optimizer: 24.0 * GIB,
                    activations: 0.0,
                    buffers: 1.0 * GIB,
                },
            ],
            static_host: vec![
                MemoryBreakdown::default(),
                MemoryBreakdown { optimizer: 8.0 * GIB, ..Default::default() },
            ],
            hbm_capacity_bytes: 80.0 * GIB,
            host_capacity_bytes: 256.0 * GIB,
            iteration_ns: 1_200_000_000,
            ..Timeline::default()
        };
        for (d, device) in [2u32, 3].into_iter().enumerate() {
            let mut act = 0.0;
            for k in 0..8u64 {
                act += if k < 4 { 4.5 * GIB } else { -4.5 * GIB };
                let time_ns = 50_000_000 + k * 130_000_000 + d as u64 * 20_000_000;
                t.memory.push(MemorySample { device, time_ns, activations: act, moved_weights: 0.5 * GIB });
                t.memory.push(MemorySample {
                    device,
                    time_ns: time_ns + 40_000_000,
                    activations: act,
                    moved_weights: 0.0,
                });
            }
        }
        t.memory.sort_by_key(|m| m.time_ns);
        t
    }

    fn temp_dir(test: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("trainsim-memory-plot-{}-{test}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn draws_png_and_svg() {
        let t = timeline();
        let dir = temp_dir("draws");
        let png = dir.join("m.png");
        draw(&t, 2, &png, "llama 7B, 2 stages").unwrap();
        assert!(std::fs::read(&png).unwrap().starts_with(b"\x89PNG\r\n\x1a\n"));
        let svg = dir.join("m.svg");
        draw(&t, 3, &svg, "").unwrap();
        // A title too long for the header is shortened.
        let long = "a very long title ".repeat(20);
        draw(&t, 3, &dir.join("long.svg"), &long).unwrap();
        let long_svg = std::fs::read_to_string(dir.join("long.svg")).unwrap();
        assert!(long_svg.contains("a very long title a very long title") && !long_svg.contains(long.trim_end()));
        let text = std::fs::read_to_string(&svg).unwrap();
        assert!(text.starts_with("<svg"), "{}", &text[..text.len().min(80)]);
        for s in ["memory over the iteration", "device 3, peak 67.50 GiB of 80.00 GiB; 8.00 GiB on host"] {
            assert!(text.contains(s), "{s}");
        }
        for s in ["HBM capacity", "time (ms)", "memory (GiB)", "weights", "activations", "buffers"] {
            assert!(text.contains(s), "{s}");
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn rejects_unknown_extension_and_device() {
        let t = timeline();
        let e = draw(&t, 2, Path::new("/nonexistent/x.jpg"), "").unwrap_err();
        assert!(e.contains(".png or .svg"), "{e}");
        let e = draw(&t, 7, Path::new("/nonexistent/x.png"), "").unwrap_err();
        assert!(e.contains("device 7 was not simulated") && e.contains("2, 3"), "{e}");
    }

    #[test]
    fn many_changes_keep_their_peaks() {
        let mut t = timeline();
        t.memory.clear();
        let n = 100_000u64;
        for k in 0..n {
            // A saw tooth, with one spike.
            let a = if k == 77_777 { 30.0 * GIB } else { (k % 100) as f64 * 0.01 * GIB };
            t.memory.push(MemorySample { device: 2, time_ns: k * 10_000, activations: a, moved_weights: 0.0 });
        }
        let curve = device_curve(&t, 2);
        let s = steps(&curve, MAX_STEPS);
        assert!(s.len() <= 2 * MAX_STEPS + 2, "{}", s.len());
        let max = |v: &mut dyn Iterator<Item = f64>| v.fold(0.0, f64::max);
        let peak = max(&mut curve.iter().map(|p| p.breakdown.total()));
        assert_eq!(max(&mut s.iter().map(|x| x.1.total())), peak);
        assert_eq!(s.first().unwrap().0, 0);
        assert_eq!(s.last().unwrap().0, curve.last().unwrap().time_ns);
        assert!(s.windows(2).all(|w| w[0].0 < w[1].0));
        let dir = temp_dir("many");
        draw(&t, 2, &dir.join("many.png"), "").unwrap();
        assert!(std::fs::read(dir.join("many.png")).unwrap().starts_with(b"\x89PNG"));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn number_formats() {
        assert_eq!(gib(80.0 * GIB), "80.00");
        assert_eq!(gib(0.25 * GIB), "0.250");
        assert_eq!(gib(1500.0), "0.00000140");
        assert_eq!(gib(0.0), "0.00");
        assert_eq!((decimals(88.0), decimals(9.0), decimals(1.2), decimals(0.0)), (0, 1, 1, 0));
    }

    #[test]
    fn few_changes_are_drawn_as_they_are() {
        let t = timeline();
        let curve = device_curve(&t, 2);
        let s = steps(&curve, MAX_STEPS);
        assert_eq!(s, curve.iter().map(|p| (p.time_ns, p.breakdown)).collect::<Vec<_>>());
    }
}
