//! `lazybuf trace summary FILE` and `lazybuf trace plot FILE -o OUT`: a trace recorded by
//! lazybuf's event recorder (`lazybuf.trace.dump()`, `Trace::to_chrome_json()`: Chrome
//! trace-event JSON, see docs/OBSERVING.md) read back.
//!
//! The summary lists copies and bytes per buffer, direction and reason, their totals, and the
//! peak memory in use per device and kind (copies marked `rolled_back`, which the transfer
//! counters took back when a later step of their plan failed, are left out, as
//! `Trace::summary()` leaves them out); the plot ([`plot`]) draws memory in use over time
//! per device and kind, with the copies marked by direction.

pub mod plot;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;

use crate::Result;
use crate::cli::{TraceArgs, TraceCommand};
use crate::error::CliError;
use crate::output::format_bytes;

/// One copy between memories.
#[derive(Clone, Debug, PartialEq)]
pub struct Copy {
    /// Start, in milliseconds since the recorder started.
    pub start_ms: f64,
    /// Duration in milliseconds (0 for an asynchronous copy, whose end is not recorded).
    pub duration_ms: f64,
    /// The buffer's id.
    pub buffer: u64,
    /// `h2d`, `d2h` or `d2d`.
    pub direction: String,
    /// Bytes moved.
    pub bytes: u64,
    /// `access`, `sync` or `eviction`.
    pub reason: String,
    /// A later rollback of its plan undid it in the transfer counters (`args.rolled_back`):
    /// it ran (the plot draws it) but the summary does not count it.
    pub rolled_back: bool,
}

/// A trace file, read.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TraceFile {
    /// Every copy, in file order.
    pub copies: Vec<Copy>,
    /// Memory in use over time per series (`<device> <kind>`): (milliseconds, bytes).
    pub memory: BTreeMap<String, Vec<(f64, u64)>>,
    /// Events the recorder's ring dropped.
    pub dropped: u64,
}

/// Reads a trace file; an error naming the file and what is wrong with it.
pub fn load(path: &Path) -> Result<TraceFile> {
    let context = |e: String| CliError::new(e).context(format!("reading trace {}", path.display()));
    // A device or a pipe (`/dev/zero`) would be read without end: only regular files.
    let metadata = std::fs::metadata(path).map_err(|e| context(e.to_string()))?;
    if !metadata.is_file() {
        return Err(context("not a regular file (expected a trace written by lazybuf.trace.dump())".into()));
    }
    let text = std::fs::read_to_string(path).map_err(|e| context(e.to_string()))?;
    let doc: Value = serde_json::from_str(&text).map_err(|e| context(format!("not JSON: {e}")))?;
    let events = doc["traceEvents"].as_array().ok_or_else(|| {
        context("expected Chrome trace-event JSON with a \"traceEvents\" array (lazybuf.trace.dump())".into())
    })?;
    let mut file =
        TraceFile { dropped: doc["otherData"]["dropped"].as_u64().unwrap_or(0), ..TraceFile::default() };
    for e in events {
        let ms = e["ts"].as_f64().unwrap_or(0.0) / 1000.0;
        match (e["ph"].as_str(), e["cat"].as_str()) {
            (Some("X"), Some("transfer")) => {
                let args = &e["args"];
                let field = |name: &str| {
                    args[name]
                        .as_str()
                        .map(str::to_string)
                        .ok_or_else(|| context(format!("a transfer event without args.{name}: {}", short(e))))
                };
                let number = |name: &str| {
                    args[name]
                        .as_u64()
                        .ok_or_else(|| context(format!("a transfer event without args.{name}: {}", short(e))))
                };
                file.copies.push(Copy {
                    start_ms: ms,
                    duration_ms: e["dur"].as_f64().unwrap_or(0.0) / 1000.0,
                    buffer: number("buffer")?,
                    direction: field("direction")?,
                    bytes: number("bytes")?,
                    reason: field("reason")?,
                    rolled_back: args["rolled_back"].as_bool().unwrap_or(false),
                });
            }
            (Some("C"), Some("memory")) => {
                let name = e["name"].as_str().unwrap_or("memory");
                let series = name.strip_prefix("memory ").unwrap_or(name).to_string();
                let bytes = e["args"]["bytes"].as_u64().unwrap_or(0);
                file.memory.entry(series).or_default().push((ms, bytes));
            }
            _ => {}
        }
    }
    Ok(file)
}

fn short(e: &Value) -> String {
    let text = e.to_string();
    if text.chars().count() > 120 {
        format!("{}...", text.chars().take(120).collect::<String>())
    } else {
        text
    }
}

/// The plain summary.
pub fn summary(file: &TraceFile) -> String {
    // Sums of u64 byte counts in u128: no file can overflow them (a crafted one overflowed u64).
    let mut rows: BTreeMap<(u64, &str, &str), (u64, u128)> = BTreeMap::new();
    let mut totals: BTreeMap<&str, (u64, u128)> = BTreeMap::new();
    for c in file.copies.iter().filter(|c| !c.rolled_back) {
        for entry in [
            rows.entry((c.buffer, &c.direction, &c.reason)).or_default(),
            totals.entry(&c.direction).or_default(),
        ] {
            entry.0 += 1;
            entry.1 += u128::from(c.bytes);
        }
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:>8}  {:<9}  {:<8}  {:>8}  {:>14}",
        "BUFFER", "DIRECTION", "REASON", "COPIES", "BYTES"
    );
    for ((buffer, direction, reason), (copies, bytes)) in &rows {
        let _ = writeln!(out, "{buffer:>8}  {direction:<9}  {reason:<8}  {copies:>8}  {bytes:>14}");
    }
    for (direction, (copies, bytes)) in &totals {
        let _ = writeln!(out, "{:>8}  {direction:<9}  {:<8}  {copies:>8}  {bytes:>14}", "total", "");
    }
    if file.copies.is_empty() {
        let _ = writeln!(out, "(no copies recorded)");
    }
    for (series, points) in &file.memory {
        let peak = points.iter().map(|p| p.1).max().unwrap_or(0);
        let _ = writeln!(out, "peak memory in use, {series}: {}", format_bytes(peak));
    }
    if file.dropped > 0 {
        let _ =
            writeln!(out, "({} events were dropped by the recorder's full ring: not counted)", file.dropped);
    }
    out
}

/// Runs `lazybuf trace ...`.
pub fn run(args: &TraceArgs) -> Result<i32> {
    match &args.command {
        TraceCommand::Summary { file } => {
            let text = summary(&load(file)?);
            outln!("{}", text.trim_end());
        }
        TraceCommand::Plot { file, output, size } => {
            plot::write(&load(file)?, output, *size)?;
        }
    }
    Ok(0)
}
