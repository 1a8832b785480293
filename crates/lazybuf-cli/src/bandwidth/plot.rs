//! The bandwidth plot (plotters; PNG through its bitmap backend, or SVG): four log-log panels,
//! rates host to device and device to host on top with one curve per variant (lazybuf or raw,
//! pageable or pinned), and below them lazybuf's ratio to raw for each memory kind, with a
//! grey line at 1.
//!
//! Each series has a fixed colour ([`colour_of`], [`ratio_colour`]) so a test (or a reader)
//! can find its curve. Text needs a TrueType font, read at run time (no system font library
//! is linked): `LAZYBUF_PLOT_FONT=/path/to/font.ttf`, else the first of a few usual system
//! fonts (DejaVu Sans, Liberation Sans, Arial); without one the plot is drawn without text,
//! and the tool says so. `LAZYBUF_PLOT_FONT=none` asks for no text.

use std::path::Path;
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;

use super::{BandwidthReport, Direction, Method};
use crate::Result;
use crate::error::CliError;
use crate::output::format_bytes;

/// The environment variable naming the plot's font file (`none`: no text).
pub const FONT_ENV: &str = "LAZYBUF_PLOT_FONT";

/// Font files tried, in order, when `LAZYBUF_PLOT_FONT` is not set.
const FONT_CANDIDATES: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
    "/Library/Fonts/Arial.ttf",
    "C:\\Windows\\Fonts\\arial.ttf",
];

/// The colour of a rate curve.
pub fn colour_of(method: Method, pinned: bool) -> RGBColor {
    match (method, pinned) {
        (Method::Lazybuf, false) => RGBColor(31, 119, 180), // blue
        (Method::Raw, false) => RGBColor(255, 127, 14),     // orange
        (Method::Lazybuf, true) => RGBColor(44, 160, 44),   // green
        (Method::Raw, true) => RGBColor(214, 39, 40),       // red
    }
}

/// The colour of a ratio curve (lazybuf / raw).
pub fn ratio_colour(pinned: bool) -> RGBColor {
    if pinned { RGBColor(148, 103, 189) } else { RGBColor(140, 86, 75) } // purple, brown
}

/// The grey of the "ratio 1" line.
pub const PARITY_GREY: RGBColor = RGBColor(160, 160, 160);

/// The plot formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// A PNG bitmap.
    Png,
    /// An SVG drawing.
    Svg,
}

/// The format a path's extension asks for; the error names `option`, the option that gave it.
pub fn format_of(path: &Path, option: &str) -> Result<Format> {
    match path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).as_deref() {
        Some("png") => Ok(Format::Png),
        Some("svg") => Ok(Format::Svg),
        _ => Err(CliError::new(format!(
            "{option} {}: expected a file name ending in .png or .svg",
            path.display()
        ))),
    }
}

/// Draws `report` into `path` (PNG or SVG by its extension), `size` pixels. The file is
/// drawn in memory and written whole or not at all ([`crate::output::write_file`]).
pub fn write(report: &BandwidthReport, path: &Path, size: (u32, u32)) -> Result<crate::output::Written> {
    let format = format_of(path, "--plot")?;
    let text = text_or_note();
    let bytes = render(format, size, |root| draw(root, report, text), |root| draw(root, report, text))
        .map_err(|e| CliError::new(e).context(format!("drawing {}", path.display())))?;
    crate::output::write_file(path, &bytes)
}

/// The bytes of a drawing in `format`, `size` pixels: `png` draws it on a bitmap, `svg` on an
/// SVG document (the same drawing, for each backend's type). Nothing is written anywhere.
pub fn render(
    format: Format,
    size: (u32, u32),
    png: impl FnOnce(&DrawingArea<BitMapBackend<'_>, Shift>) -> DrawResult,
    svg: impl FnOnce(&DrawingArea<SVGBackend<'_>, Shift>) -> DrawResult,
) -> std::result::Result<Vec<u8>, String> {
    match format {
        Format::Png => {
            let (width, height) = size;
            let length = (width as usize).checked_mul(height as usize).and_then(|n| n.checked_mul(3));
            let mut pixels = vec![0u8; length.ok_or("the plot is too large")?];
            {
                let root = BitMapBackend::with_buffer(&mut pixels, size).into_drawing_area();
                png(&root)?;
                root.present().map_err(|e| e.to_string())?;
            }
            encode_png(&pixels, size).map_err(|e| format!("encoding the PNG: {e}"))
        }
        Format::Svg => {
            let mut document = String::new();
            {
                let root = SVGBackend::with_string(&mut document, size).into_drawing_area();
                svg(&root)?;
                root.present().map_err(|e| e.to_string())?;
            }
            Ok(document.into_bytes())
        }
    }
}

/// RGB pixels, `size` of them, as a PNG file.
fn encode_png(
    pixels: &[u8],
    (width, height): (u32, u32),
) -> std::result::Result<Vec<u8>, png::EncodingError> {
    let mut out = Vec::new();
    let mut encoder = png::Encoder::new(&mut out, width, height);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    // As plotters' own PNG output (the image crate's defaults): fast, adaptive filters.
    encoder.set_compression(png::Compression::Fast);
    encoder.set_filter(png::FilterType::Sub);
    encoder.set_adaptive_filter(png::AdaptiveFilterType::Adaptive);
    let mut writer = encoder.write_header()?;
    writer.write_image_data(pixels)?;
    writer.finish()?;
    Ok(out)
}

/// The note a plot drawn without text prints (no font found, or `LAZYBUF_PLOT_FONT=none`).
pub const NO_FONT_NOTE: &str = "lazybuf: note: no font found for the plot's text (set LAZYBUF_PLOT_FONT to a .ttf file); drawing it without text";

/// Whether the plot has text ([`font_available`]); prints [`NO_FONT_NOTE`] when it has none.
pub fn text_or_note() -> bool {
    let text = font_available();
    if !text {
        errln!("{NO_FONT_NOTE}");
    }
    text
}

/// Whether a font was found and registered for the plots' text (looked up once).
pub fn font_available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        let path = match std::env::var_os(FONT_ENV) {
            Some(p) if p.is_empty() || p == "none" => return false,
            Some(p) => Some(std::path::PathBuf::from(p)),
            None => FONT_CANDIDATES.iter().map(std::path::PathBuf::from).find(|p| p.is_file()),
        };
        let Some(bytes) = path.and_then(|p| std::fs::read(p).ok()) else { return false };
        // plotters keeps fonts for the rest of the process; this happens once.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok()
    })
}

/// What drawing a plot ends with: an error as text.
pub type DrawResult = std::result::Result<(), String>;

fn draw<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, report: &BandwidthReport, text: bool) -> DrawResult
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(e)?;
    let body = if text {
        let title = format!(
            "lazybuf bandwidth on {} ({}, {})",
            report.device.selector, report.device.name, report.device.backend
        );
        root.titled(&title, ("sans-serif", 22)).map_err(e)?
    } else {
        root.clone()
    };
    let panels = body.split_evenly((2, 2));
    let sizes = || report.sizes.iter().map(|&s| s as f64);
    let (mut x_min, mut x_max) = (sizes().fold(f64::INFINITY, f64::min), sizes().fold(0.0, f64::max));
    if x_min >= x_max {
        (x_min, x_max) = (x_min / 2.0, x_max * 2.0);
    }
    let rates = report.measurements.iter().map(|m| m.gb_per_s);
    let rate_range = padded(rates);
    let ratio_range = padded(report.ratios.iter().map(|r| r.ratio).chain([1.0]));
    for (column, direction) in Direction::ALL.into_iter().enumerate() {
        // Rates.
        let mut rates = chart(&panels[column], text, &format!("{}: GB/s", direction.title()))
            .build_cartesian_2d((x_min..x_max).log_scale().base(2.0), rate_range.clone().log_scale())
            .map_err(e)?;
        mesh(&mut rates, text, "GB/s").map_err(e)?;
        // Bottom to top, each narrower than the one below, so that every curve stays visible
        // where curves coincide (as raw and lazybuf do when both are one memcpy).
        let layers =
            [(Method::Raw, false), (Method::Lazybuf, false), (Method::Raw, true), (Method::Lazybuf, true)];
        for (layer, (method, pinned)) in layers.into_iter().enumerate() {
            if !report.memory_kinds().contains(&pinned) {
                continue;
            }
            let colour = colour_of(method, pinned);
            let points: Vec<(f64, f64)> = report
                .measurements
                .iter()
                .filter(|m| m.direction == direction && m.method == method && m.pinned == pinned)
                .map(|m| (m.bytes as f64, m.gb_per_s))
                .collect();
            let zero_copy_from = report
                .measurements
                .iter()
                .filter(|m| {
                    m.direction == direction && m.method == method && m.pinned == pinned && m.zero_copy
                })
                .map(|m| m.bytes)
                .min();
            let memory = if pinned { "pinned" } else { "pageable" };
            let note = zero_copy_from
                .map(|b| format!(" (zero-copy from {}: no bytes moved)", format_bytes(b)))
                .unwrap_or_default();
            let label = format!("{} {memory}{note}", method.name());
            series(&mut rates, points, colour, layer, text.then_some(label)).map_err(e)?;
        }
        legend(&mut rates, text).map_err(e)?;

        // Ratios.
        let mut ratios = chart(&panels[column + 2], text, &format!("{}: lazybuf / raw", direction.title()))
            .build_cartesian_2d((x_min..x_max).log_scale().base(2.0), ratio_range.clone().log_scale())
            .map_err(e)?;
        mesh(&mut ratios, text, "lazybuf / raw").map_err(e)?;
        ratios
            .draw_series(LineSeries::new([(x_min, 1.0), (x_max, 1.0)], PARITY_GREY.stroke_width(1)))
            .map_err(e)?;
        for pinned in report.memory_kinds() {
            let points: Vec<(f64, f64)> = report
                .ratios
                .iter()
                .filter(|r| r.direction == direction && r.pinned == pinned)
                .map(|r| (r.bytes as f64, r.ratio))
                .collect();
            let label = format!("{} lazybuf / raw", if pinned { "pinned" } else { "pageable" });
            series(
                &mut ratios,
                points,
                ratio_colour(pinned),
                if pinned { 3 } else { 1 },
                text.then_some(label),
            )
            .map_err(e)?;
        }
        legend(&mut ratios, text).map_err(e)?;
    }
    Ok(())
}

/// A tick label: at most three significant digits, no trailing zeros.
fn tick(value: f64) -> String {
    let decimals =
        if value >= 100.0 { 0 } else { (2.0 - value.abs().log10().floor()).clamp(0.0, 6.0) as usize };
    let text = format!("{value:.decimals$}");
    if text.contains('.') { text.trim_end_matches('0').trim_end_matches('.').to_string() } else { text }
}

/// A range around every value, a factor of 1.5 wider on each side (log axes).
fn padded(values: impl Iterator<Item = f64>) -> std::ops::Range<f64> {
    let (lo, hi) = values
        .filter(|v| v.is_finite() && *v > 0.0)
        .fold((f64::INFINITY, 0.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if !lo.is_finite() { 0.1..10.0 } else { lo / 1.5..hi * 1.5 }
}

fn chart<'a, 'b, DB: DrawingBackend>(
    area: &'a DrawingArea<DB, Shift>,
    text: bool,
    caption: &str,
) -> ChartBuilder<'a, 'b, DB> {
    let mut builder = ChartBuilder::on(area);
    builder.margin(12).margin_right(34);
    if text {
        builder.caption(caption, ("sans-serif", 17)).x_label_area_size(34).y_label_area_size(58);
    }
    builder
}

type LogLog =
    Cartesian2d<plotters::coord::combinators::LogCoord<f64>, plotters::coord::combinators::LogCoord<f64>>;

fn mesh<'a, DB: DrawingBackend + 'a>(
    chart: &mut ChartContext<'a, DB, LogLog>,
    text: bool,
    y_desc: &str,
) -> std::result::Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let mut mesh = chart.configure_mesh();
    mesh.light_line_style(RGBColor(240, 240, 240))
        .bold_line_style(RGBColor(215, 215, 215))
        .max_light_lines(1);
    if text {
        mesh.x_desc("buffer size")
            .y_desc(y_desc)
            .x_label_formatter(&|x| format_bytes(x.round() as u64))
            .y_label_formatter(&|y| tick(*y))
            .label_style(("sans-serif", 13));
    } else {
        mesh.x_labels(0).y_labels(0);
    }
    mesh.draw()
}

fn series<'a, DB: DrawingBackend + 'a>(
    chart: &mut ChartContext<'a, DB, LogLog>,
    points: Vec<(f64, f64)>,
    colour: RGBColor,
    layer: usize,
    label: Option<String>,
) -> std::result::Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    if points.is_empty() {
        return Ok(());
    }
    // Line width and marker size by layer (0: bottom): each 2 pixels narrower than the one
    // below it, so a curve drawn over another leaves a pixel of it visible on each side.
    // Pageable curves (layers 0, 1) have round markers, pinned ones square markers.
    let (width, marker) = [(7, 6), (5, 4), (3, 3), (1, 2)][layer.min(3)];
    let wide = layer < 2;
    let drawn = chart.draw_series(LineSeries::new(points.clone(), colour.stroke_width(width)))?;
    if let Some(label) = label {
        drawn
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], colour.stroke_width(width)));
    }
    if wide {
        chart.draw_series(points.into_iter().map(|p| Circle::new(p, marker, colour.filled())))?;
    } else {
        let square = |(x, y)| {
            EmptyElement::at((x, y)) + Rectangle::new([(-marker, -marker), (marker, marker)], colour.filled())
        };
        chart.draw_series(points.into_iter().map(square))?;
    }
    Ok(())
}

fn legend<'a, DB: DrawingBackend + 'a>(
    chart: &mut ChartContext<'a, DB, LogLog>,
    text: bool,
) -> std::result::Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    if !text {
        return Ok(());
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(200, 200, 200))
        .label_font(("sans-serif", 12))
        .draw()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_extension_picks_the_format() {
        assert_eq!(format_of(Path::new("a/b.png"), "--plot").unwrap(), Format::Png);
        assert_eq!(format_of(Path::new("b.SVG"), "--plot").unwrap(), Format::Svg);
        let err = format_of(Path::new("b.jpg"), "-o").unwrap_err().to_string();
        assert!(err.contains(".png or .svg") && err.starts_with("-o b.jpg"), "{err}");
    }

    #[test]
    fn the_note_names_the_font_variable() {
        assert!(NO_FONT_NOTE.contains(FONT_ENV));
    }

    #[test]
    fn every_series_has_its_own_colour() {
        let mut colours: Vec<RGBColor> = [false, true]
            .into_iter()
            .flat_map(|p| [colour_of(Method::Lazybuf, p), colour_of(Method::Raw, p), ratio_colour(p)])
            .chain([PARITY_GREY])
            .collect();
        let n = colours.len();
        colours.sort_by_key(|c| (c.0, c.1, c.2));
        colours.dedup();
        assert_eq!(colours.len(), n);
    }

    /// A report whose four rate curves coincide, and so do its two ratio curves.
    fn coinciding() -> BandwidthReport {
        use super::super::{DeviceRef, Measurement, Ratio};
        let sizes = vec![1024, 4096, 16384, 65536];
        let mut measurements = Vec::new();
        let mut ratios = Vec::new();
        for &bytes in &sizes {
            for direction in Direction::ALL {
                for pinned in [false, true] {
                    for method in [Method::Lazybuf, Method::Raw] {
                        let seconds = bytes as f64 / 1e9;
                        measurements.push(Measurement {
                            direction,
                            method,
                            pinned,
                            bytes,
                            seconds,
                            iterations: 3,
                            gb_per_s: 1.0,
                            zero_copy: false,
                        });
                    }
                    ratios.push(Ratio { direction, pinned, bytes, ratio: 1.0 });
                }
            }
        }
        let device = DeviceRef { selector: "host:0".into(), backend: "host".into(), name: "test".into() };
        BandwidthReport { schema: super::super::SCHEMA.into(), device, sizes, measurements, ratios }
    }

    #[test]
    fn coinciding_curves_all_stay_visible_across_their_panels() {
        let (w, h) = (800u32, 600u32);
        let mut pixels = vec![0u8; (w * h * 3) as usize];
        {
            let root = BitMapBackend::with_buffer(&mut pixels, (w, h)).into_drawing_area();
            draw(&root, &coinciding(), false).unwrap();
            root.present().unwrap();
        }
        let span = |colour: RGBColor, column: u32, row: u32| {
            let xs: Vec<u32> = pixels
                .chunks_exact(3)
                .enumerate()
                .filter(|(_, p)| (p[0], p[1], p[2]) == (colour.0, colour.1, colour.2))
                .map(|(i, _)| (i as u32 % w, i as u32 / w))
                .filter(|&(x, y)| x / (w / 2) == column && y / (h / 2) == row)
                .map(|(x, _)| x)
                .collect();
            xs.iter().max().unwrap_or(&0) - xs.iter().min().unwrap_or(&0)
        };
        for column in 0..2 {
            for pinned in [false, true] {
                for method in [Method::Lazybuf, Method::Raw] {
                    let s = span(colour_of(method, pinned), column, 0);
                    assert!(s > w / 4, "{method:?} pinned={pinned}: {s}");
                }
                assert!(span(ratio_colour(pinned), column, 1) > w / 4, "ratio pinned={pinned}");
            }
        }
    }

    #[test]
    fn ticks_have_three_significant_digits_at_most() {
        assert_eq!(tick(0.7000000000000001), "0.7");
        assert_eq!(tick(0.25), "0.25");
        assert_eq!(tick(0.0123456), "0.0123");
        assert_eq!(tick(2.0), "2");
        assert_eq!(tick(12.5), "12.5");
        assert_eq!(tick(1000.0), "1000");
    }

    #[test]
    fn ranges_pad_positive_values() {
        let r = padded([2.0, 8.0, f64::INFINITY, 0.0].into_iter());
        assert!((r.start - 2.0 / 1.5).abs() < 1e-12 && (r.end - 12.0).abs() < 1e-12);
        assert_eq!(padded(std::iter::empty()), 0.1..10.0);
    }
}
