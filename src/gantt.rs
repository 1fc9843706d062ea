//! Gantt chart of a recorded iteration's pipeline schedule (PNG or SVG), drawn with plotters
//! and the embedded DejaVu font (no system font needed).
//!
//! One row per simulated device (at most `max_rows`), time in milliseconds on x, one filled
//! rectangle per (merged) compute-stream task coloured by phase, with the micro-batch number
//! written inside wide enough rectangles.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use sim::report::timeline::{Phase, StreamKind, Timeline};

use crate::figure::{Figure, header, image_format, render};

/// How to draw the chart.
#[derive(Clone, Debug)]
pub struct GanttOptions {
    /// Chart title (empty: "pipeline schedule").
    pub title: String,
    /// Most device rows drawn. Beyond it, one device per pipeline stage is kept (and, if there
    /// are still too many, the first `max_rows` of those).
    pub max_rows: usize,
}

impl Default for GanttOptions {
    fn default() -> Self {
        GanttOptions { title: String::new(), max_rows: 32 }
    }
}

const WIDTH: u32 = 1600;
const ROW_PX: u32 = 28;
const HEADER_PX: u32 = 70;
const X_LABEL_PX: u32 = 40;
const MARGIN_PX: u32 = 10;
const Y_LABEL_PX: u32 = 150;
/// Narrowest rectangle, in pixels, that gets its micro-batch number.
const MIN_TEXT_PX: i32 = 14;
/// Phases in legend order.
const PHASES: [Phase; 5] = [Phase::Forward, Phase::Recompute, Phase::Backward, Phase::Optimizer, Phase::Sync];

fn phase_color(p: Phase) -> RGBColor {
    match p {
        Phase::Forward => RGBColor(31, 119, 180),
        Phase::Backward => RGBColor(44, 160, 44),
        Phase::Recompute => RGBColor(158, 202, 225),
        Phase::Optimizer => RGBColor(127, 127, 127),
        Phase::Sync => RGBColor(148, 103, 189),
    }
}

fn phase_text_color(p: Phase) -> RGBColor {
    match p {
        Phase::Recompute => BLACK,
        _ => WHITE,
    }
}

fn phase_name(p: Phase) -> &'static str {
    match p {
        Phase::Forward => "forward",
        Phase::Backward => "backward",
        Phase::Recompute => "recompute",
        Phase::Optimizer => "optimizer",
        Phase::Sync => "sync",
    }
}

/// One row of the chart.
#[derive(Clone, Debug, PartialEq)]
struct Row {
    device: u32,
    stage: Option<u32>,
}

impl Row {
    fn name(&self) -> String {
        match self.stage {
            Some(s) => format!("dev {} (stage {s})", self.device),
            None => format!("dev {}", self.device),
        }
    }
}

/// A merged run of compute tasks on one row.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Bar {
    start_ns: u64,
    end_ns: u64,
    phase: Phase,
    micro_batch: u32,
    chunk: u32,
}

/// The rows to draw, top to bottom, and a note when some devices were left out.
fn select_rows(t: &Timeline, max_rows: usize) -> (Vec<Row>, Option<String>) {
    let max_rows = max_rows.max(1);
    let mut rows: Vec<Row> = if t.devices.is_empty() {
        let ds: BTreeSet<u32> = t.spans.iter().filter(|s| s.stream == StreamKind::Compute).map(|s| s.device).collect();
        ds.into_iter().map(|device| Row { device, stage: None }).collect()
    } else {
        let mut seen = BTreeSet::new();
        t.devices
            .iter()
            .enumerate()
            .filter(|(_, d)| seen.insert(**d))
            .map(|(i, &device)| Row { device, stage: t.stages.get(i).copied() })
            .collect()
    };
    let total = rows.len();
    let mut note = None;
    if total > max_rows {
        // The first device seen with each stage.
        let mut stages = BTreeSet::new();
        let mut kept: Vec<Row> = rows.iter().filter(|r| r.stage.is_some_and(|s| stages.insert(s))).cloned().collect();
        if kept.is_empty() {
            // No stage known: the first devices.
            rows.truncate(max_rows);
            note = Some(format!("{total} devices, showing the first {max_rows}"));
        } else {
            kept.sort_by_key(|r| (r.stage, r.device));
            let stage_count = kept.len();
            note = Some(if stage_count > max_rows {
                kept.truncate(max_rows);
                format!(
                    "{total} devices, showing the first device of each of the first {max_rows} of {stage_count} pipeline stages"
                )
            } else {
                format!("{total} devices, showing the first device of each of the {stage_count} pipeline stages")
            });
            rows = kept;
        }
    }
    rows.sort_by_key(|r| (r.stage.unwrap_or(u32::MAX), r.device));
    (rows, note)
}

/// Compute-stream tasks of each row, sorted by start, with consecutive tasks of the same
/// phase, micro-batch and chunk merged when the gap between them is under `merge_gap_ns`.
fn bars(t: &Timeline, rows: &[Row], merge_gap_ns: u64) -> Vec<Vec<Bar>> {
    let index: HashMap<u32, usize> = rows.iter().enumerate().map(|(i, r)| (r.device, i)).collect();
    let mut out: Vec<Vec<Bar>> = vec![Vec::new(); rows.len()];
    for s in &t.spans {
        if s.stream != StreamKind::Compute {
            continue;
        }
        let (Some(&row), Some(label)) = (index.get(&s.device), t.labels.get(s.label as usize)) else {
            continue;
        };
        out[row].push(Bar {
            start_ns: s.start_ns,
            end_ns: s.end_ns.max(s.start_ns),
            phase: label.phase,
            micro_batch: s.micro_batch,
            chunk: label.chunk,
        });
    }
    for row in &mut out {
        row.sort_by_key(|b| (b.start_ns, b.end_ns));
        let mut merged: Vec<Bar> = Vec::with_capacity(row.len() / 4 + 1);
        for b in row.drain(..) {
            match merged.last_mut() {
                Some(last)
                    if last.phase == b.phase
                        && last.micro_batch == b.micro_batch
                        && last.chunk == b.chunk
                        && b.start_ns.saturating_sub(last.end_ns) < merge_gap_ns =>
                {
                    last.end_ns = last.end_ns.max(b.end_ns);
                }
                _ => merged.push(b),
            }
        }
        *row = merged;
    }
    out
}

/// Draws the compute schedule of `t` to `path`: PNG if it ends in `.png`, SVG if `.svg`.
pub fn draw(t: &Timeline, path: &Path, opts: &GanttOptions) -> Result<(), String> {
    let format = image_format(path, "gantt")?;
    let (rows, note) = select_rows(t, opts.max_rows);
    let span_end = t.spans.iter().filter(|s| s.stream == StreamKind::Compute).map(|s| s.end_ns).max().unwrap_or(0);
    let iteration_ns = t.iteration_ns.max(span_end).max(1);
    let bars = bars(t, &rows, iteration_ns / 100);

    let subtitle = match &note {
        Some(n) => format!("iteration {:.3} ms, compute stream; {n}", iteration_ns as f64 / 1e6),
        None => format!(
            "iteration {:.3} ms, compute stream of {} device{}",
            iteration_ns as f64 / 1e6,
            rows.len(),
            if rows.len() == 1 { "" } else { "s" }
        ),
    };
    let title = if opts.title.is_empty() { "pipeline schedule" } else { opts.title.as_str() };
    let height = HEADER_PX + X_LABEL_PX + 2 * MARGIN_PX + ROW_PX * rows.len().max(1) as u32;
    let chart = Chart { title, subtitle: &subtitle, rows: &rows, bars: &bars, iteration_ns };
    render(&chart, path, format, (WIDTH, height), "gantt")
}

struct Chart<'a> {
    title: &'a str,
    subtitle: &'a str,
    rows: &'a [Row],
    bars: &'a [Vec<Bar>],
    iteration_ns: u64,
}

impl Figure for Chart<'_> {
    fn draw_on<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String>
    where
        DB::ErrorType: 'static,
    {
        let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
        root.fill(&WHITE).map_err(err)?;

        let legend: Vec<(&str, RGBColor)> = PHASES
            .iter()
            .filter(|p| self.bars.iter().flatten().any(|b| b.phase == **p))
            .map(|p| (phase_name(*p), phase_color(*p)))
            .collect();
        header(root, self.title, self.subtitle, &legend)?;

        // The chart: y in rows (row 0 at the top), x in ms.
        let (_, body) = root.split_vertically(HEADER_PX);
        let n = self.rows.len().max(1) as f64;
        let x_max = self.iteration_ns as f64 / 1e6;
        let mut chart = ChartBuilder::on(&body)
            .margin(MARGIN_PX)
            .margin_right(30)
            .x_label_area_size(X_LABEL_PX)
            .y_label_area_size(Y_LABEL_PX)
            .build_cartesian_2d(0.0..x_max, 0.0..n)
            .map_err(err)?;
        let label_style = TextStyle::from(("sans-serif", 14).into_font()).color(&BLACK);
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(0)
            .y_label_formatter(&|_| String::new())
            .x_labels(16)
            .x_desc("time (ms)")
            .axis_desc_style(label_style.clone())
            .label_style(label_style.clone())
            .light_line_style(RGBColor(235, 235, 235))
            .bold_line_style(RGBColor(215, 215, 215))
            .draw()
            .map_err(err)?;

        let row_y = |i: usize| n - i as f64; // top edge of row i
        // Row labels and separators.
        for (i, r) in self.rows.iter().enumerate() {
            let (px, py) = chart.backend_coord(&(0.0, row_y(i) - 0.5));
            root.draw(&Text::new(r.name(), (px - 8, py), label_style.pos(Pos::new(HPos::Right, VPos::Center))))
                .map_err(err)?;
        }
        chart
            .draw_series(
                (1..self.rows.len())
                    .map(|i| PathElement::new(vec![(0.0, row_y(i)), (x_max, row_y(i))], RGBColor(225, 225, 225))),
            )
            .map_err(err)?;

        // Bars, then their micro-batch numbers.
        let to_ms = |ns: u64| ns as f64 / 1e6;
        let inset = 0.12;
        let mb_style = TextStyle::from(("sans-serif", 12).into_font()).pos(Pos::new(HPos::Center, VPos::Center));
        let white_text = mb_style.color(&WHITE);
        let black_text = mb_style.color(&BLACK);
        for (i, row) in self.bars.iter().enumerate() {
            let (top, bottom) = (row_y(i) - inset, row_y(i) - 1.0 + inset);
            chart
                .draw_series(row.iter().map(|b| {
                    Rectangle::new([(to_ms(b.start_ns), top), (to_ms(b.end_ns), bottom)], phase_color(b.phase).filled())
                }))
                .map_err(err)?;
            // A thin white edge where a bar is wide enough, so that back-to-back bars of the
            // same colour stay apart.
            let mut edges = Vec::new();
            let mut texts = Vec::new();
            for b in row {
                let (x0, _) = chart.backend_coord(&(to_ms(b.start_ns), top));
                let (x1, _) = chart.backend_coord(&(to_ms(b.end_ns), top));
                let w = x1 - x0;
                if w >= 4 {
                    edges.push(PathElement::new(vec![(to_ms(b.start_ns), top), (to_ms(b.start_ns), bottom)], WHITE));
                }
                if w >= MIN_TEXT_PX && b.micro_batch != u32::MAX {
                    let s = b.micro_batch.to_string();
                    // DejaVu digits at 12 px are ~7.6 px wide.
                    if (s.len() as i32) * 8 + 4 <= w {
                        let mid = (to_ms(b.start_ns) + to_ms(b.end_ns)) / 2.0;
                        let style = if phase_text_color(b.phase) == WHITE { &white_text } else { &black_text };
                        texts.push(Text::new(s, (mid, row_y(i) - 0.5), style.clone()));
                    }
                }
            }
            chart.draw_series(edges).map_err(err)?;
            chart.draw_series(texts).map_err(err)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sim::report::timeline::{Label, Span};

    /// A `p`-stage 1F1B schedule of `m` micro-batches, `ops` tasks per pass.
    fn one_f_one_b(p: u32, m: u32, ops: u32) -> Timeline {
        let mut t = Timeline::default();
        for (op, phase) in [("fc", Phase::Forward), ("fc", Phase::Backward), ("adam", Phase::Optimizer)] {
            t.labels.push(Label { op, layer: if phase == Phase::Optimizer { -1 } else { 0 }, phase, chunk: 0 });
        }
        let (tf, tb) = (1_000_000u64, 2_000_000u64);
        let mut free = vec![0u64; p as usize];
        let mut f_end = vec![vec![0u64; m as usize]; p as usize];
        let mut b_end = vec![vec![0u64; m as usize]; p as usize];
        // Order per stage: warm-up forwards, 1F1B, cool-down backwards.
        let order = |s: u32| {
            let warm = (p - s - 1).min(m);
            let mut v: Vec<(bool, u32)> = (0..warm).map(|i| (true, i)).collect();
            let (mut f, mut b) = (warm, 0);
            while b < m {
                if f < m {
                    v.push((true, f));
                    f += 1;
                }
                v.push((false, b));
                b += 1;
            }
            v
        };
        let orders: Vec<Vec<(bool, u32)>> = (0..p).map(order).collect();
        let mut next = vec![0usize; p as usize];
        let mut done = false;
        while !done {
            done = true;
            for s in 0..p as usize {
                while let Some(&(fwd, mb)) = orders[s].get(next[s]) {
                    let mbi = mb as usize;
                    let dep = if fwd {
                        if s == 0 { Some(0) } else { (f_end[s - 1][mbi] > 0).then(|| f_end[s - 1][mbi]) }
                    } else if s + 1 == p as usize {
                        (f_end[s][mbi] > 0).then_some(0)
                    } else {
                        (b_end[s + 1][mbi] > 0).then(|| b_end[s + 1][mbi])
                    };
                    let Some(dep) = dep else { break };
                    let start = free[s].max(dep);
                    let (dur, label) = if fwd { (tf, 0) } else { (tb, 1) };
                    for k in 0..ops as u64 {
                        let a = start + dur * k / ops as u64;
                        let e = start + dur * (k + 1) / ops as u64;
                        t.spans.push(Span {
                            device: s as u32,
                            stream: StreamKind::Compute,
                            start_ns: a,
                            end_ns: e,
                            label,
                            micro_batch: mb,
                        });
                    }
                    let end = start + dur;
                    if fwd {
                        f_end[s][mbi] = end
                    } else {
                        b_end[s][mbi] = end
                    }
                    free[s] = end;
                    next[s] += 1;
                    done = false;
                }
            }
        }
        let last = *free.iter().max().unwrap();
        for s in 0..p {
            t.spans.push(Span {
                device: s,
                stream: StreamKind::Compute,
                start_ns: last,
                end_ns: last + 500_000,
                label: 2,
                micro_batch: u32::MAX,
            });
            t.devices.push(s);
            t.stages.push(s);
        }
        t.iteration_ns = last + 500_000;
        t
    }

    /// A fresh directory per test (tests run in parallel).
    fn temp_dir(test: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("trainsim-gantt-{}-{test}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn draws_png_and_svg() {
        let t = one_f_one_b(4, 8, 12);
        let opts = GanttOptions { title: "4-stage 1F1B".to_string(), ..GanttOptions::default() };
        let dir = temp_dir("draws");
        let png = dir.join("g.png");
        draw(&t, &png, &opts).unwrap();
        let bytes = std::fs::read(&png).unwrap();
        assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"));
        let svg = dir.join("g.svg");
        draw(&t, &svg, &opts).unwrap();
        let text = std::fs::read_to_string(&svg).unwrap();
        assert!(text.starts_with("<svg"), "{}", &text[..text.len().min(80)]);
        assert!(text.contains("time (ms)") && text.contains("dev 3 (stage 3)") && text.contains("4-stage 1F1B"));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn rejects_unknown_extension() {
        let t = one_f_one_b(2, 2, 1);
        let e = draw(&t, Path::new("/nonexistent/x.jpg"), &GanttOptions::default()).unwrap_err();
        assert!(e.contains(".png or .svg"), "{e}");
    }

    #[test]
    fn merges_ops_of_one_pass() {
        let t = one_f_one_b(4, 8, 12);
        let (rows, note) = select_rows(&t, 32);
        assert!(note.is_none());
        let b = bars(&t, &rows, t.iteration_ns / 100);
        // Each stage: 8 forwards, 8 backwards, 1 optimizer step.
        for row in &b {
            assert_eq!(row.len(), 17, "{row:?}");
        }
        // Nothing merged across micro-batches or phases.
        let total: u64 = b[0].iter().map(|x| x.end_ns - x.start_ns).sum();
        assert_eq!(total, 8 * 1_000_000 + 8 * 2_000_000 + 500_000);
    }

    #[test]
    fn one_row_per_stage_when_too_many_devices() {
        let mut t = one_f_one_b(2, 2, 1);
        // 40 devices, data-parallel replicas of 2 stages listed stage-interleaved.
        t.devices = (0..40).collect();
        t.stages = (0..40).map(|d| d % 2).collect();
        let (rows, note) = select_rows(&t, 32);
        assert_eq!(rows, vec![Row { device: 0, stage: Some(0) }, Row { device: 1, stage: Some(1) }]);
        assert!(note.unwrap().contains("40 devices"));
        let dir = temp_dir("many");
        draw(&t, &dir.join("many.png"), &GanttOptions::default()).unwrap();
        assert!(std::fs::read(dir.join("many.png")).unwrap().starts_with(b"\x89PNG"));
        let _ = std::fs::remove_dir_all(dir);
    }
}
