//! `validate --plot`: predicted against measured time per op kind and for the iteration, as
//! grouped bars (log scale), PNG or SVG.

use crate::figure::{Figure, image_format, render};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;

const PREDICTED: RGBColor = RGBColor(31, 119, 180);
const MEASURED: RGBColor = RGBColor(255, 127, 14);

/// `rows`: (label, predicted seconds, measured seconds) per op kind; `iteration`: the same
/// for the whole iteration.
pub fn draw(rows: &[(String, f64, f64)], iteration: (f64, f64), title: &str, path: &Path) -> Result<(), String> {
    let format = image_format(path, "--plot")?;
    let mut all: Vec<(String, f64, f64)> = rows.to_vec();
    all.push(("ITERATION".into(), iteration.0, iteration.1));
    let size = (1400u32, 160 + 26 * all.len() as u32);
    render(&Comparison { rows: &all, title }, path, format, size, "--plot")
}

/// Predicted and measured seconds per row, side by side on a log axis.
struct Comparison<'a> {
    rows: &'a [(String, f64, f64)],
    title: &'a str,
}

impl Figure for Comparison<'_> {
    fn draw_on<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Result<(), String>
    where
        DB::ErrorType: 'static,
    {
        let (rows, title) = (self.rows, self.title);
        let err = |e: DrawingAreaErrorKind<DB::ErrorType>| format!("--plot: {e}");
        area.fill(&WHITE).map_err(err)?;
        let lo = rows.iter().flat_map(|r| [r.1, r.2]).filter(|v| *v > 0.0).fold(f64::INFINITY, f64::min).max(1e-9);
        let hi = rows.iter().flat_map(|r| [r.1, r.2]).fold(0.0, f64::max).max(lo * 10.0);
        let n = rows.len();
        let mut chart = ChartBuilder::on(area)
            .caption(format!("{title}: predicted vs measured"), ("sans-serif", 22))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(230)
            .build_cartesian_2d((lo / 2.0..hi * 2.0).log_scale(), (0..n).into_segmented())
            .map_err(err)?;
        let labels: Vec<String> = rows.iter().map(|r| r.0.clone()).collect();
        chart
            .configure_mesh()
            .x_desc("seconds per task (log)")
            .y_labels(n)
            .y_label_formatter(&|y| match y {
                SegmentValue::CenterOf(i) => labels.get(*i).cloned().unwrap_or_default(),
                _ => String::new(),
            })
            .draw()
            .map_err(err)?;
        // Each row: predicted on top, measured below, both from the left edge.
        for (i, (_, p, m)) in rows.iter().enumerate() {
            let row = |v: f64, top: bool| {
                let (a, b) = if top {
                    (SegmentValue::Exact(i + 1), SegmentValue::CenterOf(i))
                } else {
                    (SegmentValue::CenterOf(i), SegmentValue::Exact(i))
                };
                [(lo / 2.0, a), (v.max(lo / 2.0), b)]
            };
            chart.draw_series([Rectangle::new(row(*p, true), PREDICTED.filled())]).map_err(err)?;
            chart.draw_series([Rectangle::new(row(*m, false), MEASURED.filled())]).map_err(err)?;
        }
        let nowhere = [(lo / 2.0, SegmentValue::Exact(0)), (lo / 2.0, SegmentValue::Exact(0))];
        chart
            .draw_series([Rectangle::new(nowhere.clone(), PREDICTED.filled())])
            .map_err(err)?
            .label("predicted")
            .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], PREDICTED.filled()));
        chart
            .draw_series([Rectangle::new(nowhere, MEASURED.filled())])
            .map_err(err)?
            .label("measured")
            .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], MEASURED.filled()));
        chart.configure_series_labels().background_style(WHITE).border_style(BLACK).draw().map_err(err)?;
        Ok(())
    }
}
