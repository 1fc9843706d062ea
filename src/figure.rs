//! What every chart the CLI draws shares: the embedded font, the image format read from the
//! file name, drawing one figure on either backend (PNG or SVG), and the legend in a chart's
//! header.

use std::path::Path;
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::{FontStyle, register_font};

/// Registers the embedded DejaVu Sans as plotters' "sans-serif" (once per process), so that
/// no system font is needed.
pub(crate) fn ensure_font() -> Result<(), String> {
    static FONT: OnceLock<bool> = OnceLock::new();
    let ok = *FONT.get_or_init(|| register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular()).is_ok());
    if ok { Ok(()) } else { Err("the embedded DejaVu Sans font could not be loaded".to_string()) }
}

/// The image formats the charts are written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ImageFormat {
    Png,
    Svg,
}

/// The format `path` names by its extension; `what` (the chart's name) heads the error.
pub(crate) fn image_format(path: &Path, what: &str) -> Result<ImageFormat, String> {
    match path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).as_deref() {
        Some("png") => Ok(ImageFormat::Png),
        Some("svg") => Ok(ImageFormat::Svg),
        _ => Err(format!("{what}: cannot tell the image format of {}: use a .png or .svg file name", path.display())),
    }
}

/// A chart that draws itself on any plotters backend.
pub(crate) trait Figure {
    fn draw_on<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String>
    where
        DB::ErrorType: 'static;
}

/// Draws `figure` (`size` pixels) to `path` in `format`, with the embedded font.
pub(crate) fn render(
    figure: &impl Figure,
    path: &Path,
    format: ImageFormat,
    size: (u32, u32),
    what: &str,
) -> Result<(), String> {
    ensure_font()?;
    let result = match format {
        ImageFormat::Svg => {
            let root = SVGBackend::new(path, size).into_drawing_area();
            figure.draw_on(&root).and_then(|()| root.present().map_err(|e| e.to_string()))
        }
        ImageFormat::Png => {
            let root = BitMapBackend::new(path, size).into_drawing_area();
            figure.draw_on(&root).and_then(|()| root.present().map_err(|e| e.to_string()))
        }
    };
    result.map_err(|e| format!("{what}: drawing {}: {e}", path.display()))
}

/// Draws `entries` (a filled swatch, then the name) right-aligned in the header, centred on
/// height `y`; returns the x where the legend starts, so a title can stop short of it.
fn header_legend<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    entries: &[(&str, RGBColor)],
    y: i32,
) -> Result<i32, String> {
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let style = TextStyle::from(("sans-serif", 15).into_font()).color(&BLACK);
    let mut widths = Vec::with_capacity(entries.len());
    for (name, _) in entries {
        widths.push(root.estimate_text_size(name, &style).map_err(err)?.0 as i32);
    }
    let total: i32 = widths.iter().map(|w| 18 + w + 18).sum();
    let start = root.dim_in_pixel().0 as i32 - 20 - total;
    let mut x = start;
    for ((name, color), w) in entries.iter().zip(&widths) {
        root.draw(&Rectangle::new([(x, y - 7), (x + 14, y + 7)], color.filled())).map_err(err)?;
        root.draw(&Text::new(*name, (x + 18, y), style.pos(Pos::new(HPos::Left, VPos::Center)))).map_err(err)?;
        x += 18 + w + 18;
    }
    Ok(start)
}

/// Draws a chart's header: the legend right-aligned, the title (shortened with "..." if it
/// would run into the legend) and the subtitle below it.
pub(crate) fn header<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    subtitle: &str,
    legend: &[(&str, RGBColor)],
) -> Result<(), String> {
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let legend_x = header_legend(root, legend, 18)?;
    let title_style = TextStyle::from(("sans-serif", 24).into_font()).color(&BLACK);
    let mut shown = title.to_string();
    let mut chars: Vec<char> = title.chars().collect();
    while !chars.is_empty() && 20 + root.estimate_text_size(&shown, &title_style).map_err(err)?.0 as i32 > legend_x - 20
    {
        chars.pop();
        shown = chars.iter().collect::<String>().trim_end().to_string() + "...";
    }
    root.draw(&Text::new(shown, (20, 12), title_style)).map_err(err)?;
    let sub_style = TextStyle::from(("sans-serif", 15).into_font()).color(&RGBColor(80, 80, 80));
    root.draw(&Text::new(subtitle.to_string(), (20, 44), sub_style)).map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_extension_names_the_format() {
        assert_eq!(image_format(Path::new("a/b.PNG"), "x"), Ok(ImageFormat::Png));
        assert_eq!(image_format(Path::new("b.svg"), "x"), Ok(ImageFormat::Svg));
        for bad in ["b.jpg", "b", "b.png.txt"] {
            let e = image_format(Path::new(bad), "chart").unwrap_err();
            assert!(e.starts_with("chart: ") && e.contains(bad) && e.contains(".png or .svg"), "{e}");
        }
    }
}
