//! The trace timeline (plotters; PNG or SVG by the file's extension), as PyTorch's memory_viz
//! shows memory: on top, memory in use over time, one step line per device and kind; below,
//! each copy as a bar from its start over its duration at the height of its bytes, coloured by
//! direction ([`direction_colour`]). Text as the bandwidth plot draws it (its font lookup).

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use super::TraceFile;
use crate::Result;
use crate::bandwidth::plot::{format_of, render, text_or_note};
use crate::error::CliError;

/// The colour of a copy of `direction` (`h2d`, `d2h`, `d2d`).
pub fn direction_colour(direction: &str) -> RGBColor {
    match direction {
        "h2d" => RGBColor(31, 119, 180), // blue
        "d2h" => RGBColor(255, 127, 14), // orange
        _ => RGBColor(44, 160, 44),      // green
    }
}

/// The colour of the `index`-th memory series (in the order of their names): seven, none a
/// direction's, so that one device's four kinds (device, host, pinned, shared) and the next
/// device's first ones differ.
pub fn memory_colour(index: usize) -> RGBColor {
    const PALETTE: [RGBColor; 7] = [
        RGBColor(148, 103, 189), // purple
        RGBColor(140, 86, 75),   // brown
        RGBColor(227, 119, 194), // pink
        RGBColor(23, 190, 207),  // cyan
        RGBColor(214, 39, 40),   // red
        RGBColor(127, 127, 127), // grey
        RGBColor(188, 189, 34),  // olive
    ];
    PALETTE[index % PALETTE.len()]
}

/// Draws `file` into `path`, `size` pixels; the file is drawn in memory and written whole or
/// not at all ([`crate::output::write_file`]).
pub fn write(
    file: &TraceFile,
    path: &Path,
    size: (u32, u32),
    stop_if_interrupted: &dyn Fn() -> Result<()>,
) -> Result<crate::output::Written> {
    let format = format_of(path, "-o")?;
    let text = text_or_note();
    let bytes = render(format, size, |root| draw(root, file, text), |root| draw(root, file, text))
        .map_err(|e| CliError::new(e).context(format!("drawing {}", path.display())))?;
    // Drawn: Ctrl-C meanwhile leaves the file as it was.
    stop_if_interrupted()?;
    crate::output::write_file(path, &bytes)
}

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    file: &TraceFile,
    text: bool,
) -> std::result::Result<(), String>
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(e)?;
    let body = if text {
        root.titled("lazybuf trace: memory in use and copies", ("sans-serif", 20)).map_err(e)?
    } else {
        root.clone()
    };
    let (top, bottom) = body.split_vertically(body.dim_in_pixel().1 * 3 / 5);
    let times = file
        .copies
        .iter()
        .flat_map(|c| [c.start_ms, c.start_ms + c.duration_ms])
        .chain(file.memory.values().flatten().map(|p| p.0));
    let end = times.fold(0.0f64, f64::max).max(1e-3) * 1.02;
    let peak = file.memory.values().flatten().map(|p| p.1).max().unwrap_or(0).max(1) as f64 * 1.1;
    let biggest = file.copies.iter().map(|c| c.bytes).max().unwrap_or(0).max(1) as f64 * 1.1;

    let mut memory = ChartBuilder::on(&top);
    memory.margin(10);
    if text {
        memory
            .caption("memory in use (bytes) per device and kind", ("sans-serif", 16))
            .x_label_area_size(30)
            .y_label_area_size(70);
    }
    let mut memory = memory.build_cartesian_2d(0.0..end, 0.0..peak).map_err(e)?;
    if text {
        memory.configure_mesh().x_desc("ms").draw().map_err(e)?;
    }
    for (index, (series, points)) in file.memory.iter().enumerate() {
        let colour = memory_colour(index);
        // A step line: in use stays as it was until the next change.
        let mut steps = Vec::with_capacity(points.len() * 2 + 1);
        let mut last = 0.0;
        for &(t, bytes) in points {
            steps.push((t, last));
            steps.push((t, bytes as f64));
            last = bytes as f64;
        }
        steps.push((end, last));
        let drawn = memory.draw_series(LineSeries::new(steps, colour.stroke_width(2))).map_err(e)?;
        if text {
            drawn
                .label(crate::output::printable(series))
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], colour));
        }
    }
    if text && !file.memory.is_empty() {
        memory
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(e)?;
    }

    let mut copies = ChartBuilder::on(&bottom);
    copies.margin(10);
    if text {
        copies
            .caption("copies (bytes): h2d blue, d2h orange, d2d green", ("sans-serif", 16))
            .x_label_area_size(30)
            .y_label_area_size(70);
    }
    let mut copies = copies.build_cartesian_2d(0.0..end, 0.0..biggest).map_err(e)?;
    if text {
        copies.configure_mesh().x_desc("ms").draw().map_err(e)?;
    }
    // Each copy at least a few pixels wide, so a short one stays visible.
    let min_width = end / 300.0;
    copies
        .draw_series(file.copies.iter().map(|c| {
            let right = c.start_ms + c.duration_ms.max(min_width);
            Rectangle::new(
                [(c.start_ms, 0.0), (right, c.bytes as f64)],
                direction_colour(&c.direction).filled(),
            )
        }))
        .map_err(e)?;
    Ok(())
}
