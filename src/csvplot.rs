//! `trainsim plot`: paper-style charts from a CSV file (the experiments write CSVs): grouped
//! bars over the first column's categories, or lines over a numeric first column.

use crate::figure::{Figure, image_format, render};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// A CSV table: header and rows of cells.
struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

fn read(path: &Path) -> Result<Table, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header: Vec<String> =
        lines.next().ok_or("the CSV is empty")?.split(',').map(|s| s.trim().to_string()).collect();
    let rows = lines.map(|l| l.split(',').map(|s| s.trim().to_string()).collect()).collect();
    Ok(Table { header, rows })
}

/// Draw columns `ys` against the first column of `csv`. `lines`: a line chart with numeric x;
/// otherwise grouped bars per row.
pub fn draw(csv: &Path, ys: &[String], lines: bool, title: &str, y_label: &str, out: &Path) -> Result<(), String> {
    let t = read(csv)?;
    let cols: Vec<usize> = ys
        .iter()
        .map(|y| {
            t.header
                .iter()
                .position(|h| h == y)
                .ok_or_else(|| format!("column \"{y}\" not in {}: {:?}", csv.display(), t.header))
        })
        .collect::<Result<_, _>>()?;
    let num = |s: &str| s.parse::<f64>().ok();
    let series: Vec<Vec<Option<f64>>> =
        cols.iter().map(|&c| t.rows.iter().map(|r| r.get(c).and_then(|v| num(v))).collect()).collect();
    let labels: Vec<String> = t.rows.iter().map(|r| r.first().cloned().unwrap_or_default()).collect();
    let ymax = series.iter().flatten().flatten().fold(0.0f64, |a, &b| a.max(b)) * 1.15;
    let bars = Bars {
        labels: &labels,
        series: &series,
        names: ys,
        lines,
        title,
        y_label,
        x_label: &t.header[0],
        ymax: ymax.max(1e-12),
    };
    render(&bars, out, image_format(out, "plot")?, (1200, 700), "plot")
}

/// Grouped bars (or lines) of `series` over the categories `labels`.
struct Bars<'a> {
    labels: &'a [String],
    series: &'a [Vec<Option<f64>>],
    names: &'a [String],
    lines: bool,
    title: &'a str,
    y_label: &'a str,
    x_label: &'a str,
    ymax: f64,
}

impl Figure for Bars<'_> {
    fn draw_on<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Result<(), String>
    where
        DB::ErrorType: 'static,
    {
        let Bars { labels, series, names, lines, title, y_label, x_label, ymax } = *self;
        let err = |e: DrawingAreaErrorKind<DB::ErrorType>| format!("plot: {e}");
        area.fill(&WHITE).map_err(err)?;
        let n = labels.len();
        let mut c = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 24))
            .margin(16)
            .x_label_area_size(50)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..n as f64, 0.0..ymax)
            .map_err(err)?;
        c.configure_mesh()
            .x_desc(x_label)
            .y_desc(y_label)
            // Ticks at every half unit, so the row centres (i + 0.5) get one.
            .x_labels(2 * n + 1)
            .x_label_formatter(&|x| {
                let i = (x - 0.5).round();
                if (x - 0.5 - i).abs() < 1e-6 && i >= 0.0 {
                    labels.get(i as usize).cloned().unwrap_or_default()
                } else {
                    String::new()
                }
            })
            .disable_x_mesh()
            .draw()
            .map_err(err)?;
        let k = series.len().max(1) as f64;
        for (si, s) in series.iter().enumerate() {
            let color = COLORS[si % COLORS.len()];
            if lines {
                let pts: Vec<(f64, f64)> =
                    s.iter().enumerate().filter_map(|(i, v)| v.map(|v| (i as f64 + 0.5, v))).collect();
                c.draw_series(LineSeries::new(pts.clone(), color.stroke_width(3)))
                    .map_err(err)?
                    .label(names[si].clone())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(3)));
                c.draw_series(pts.iter().map(|&p| Circle::new(p, 5, color.filled()))).map_err(err)?;
            } else {
                let w = 0.8 / k;
                let bars: Vec<Rectangle<(f64, f64)>> = s
                    .iter()
                    .enumerate()
                    .filter_map(|(i, v)| {
                        v.map(|v| {
                            let x0 = i as f64 + 0.1 + si as f64 * w;
                            Rectangle::new([(x0, 0.0), (x0 + w * 0.95, v)], color.filled())
                        })
                    })
                    .collect();
                c.draw_series(bars)
                    .map_err(err)?
                    .label(names[si].clone())
                    .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], color.filled()));
            }
        }
        c.configure_series_labels()
            .background_style(WHITE)
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperRight)
            .draw()
            .map_err(err)?;
        Ok(())
    }
}
