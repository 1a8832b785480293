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

use crate::cli::{TraceArgs, TraceCommand};
use crate::error::CliError;
use crate::output::{format_bytes, printable};
use crate::{Context, Result};
use lazybuf::observe::Direction;

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

/// The text of a trace file: UTF-8 (what `lazybuf.trace.dump()` writes), after a byte-order
/// mark if one leads (an editor's or a Windows tool's, not part of the JSON), or UTF-16 with
/// its byte-order mark (a file a Windows tool saved again: PowerShell's `>` writes UTF-16); an
/// error naming the encoding expected and where the text stops being it.
fn text_of(bytes: &[u8]) -> std::result::Result<String, String> {
    const EXPECTED: &str = "expected the UTF-8 JSON that lazybuf.trace.dump() writes";
    let utf16 = |rest: &[u8], unit: fn([u8; 2]) -> u16, order: &str| {
        if !rest.len().is_multiple_of(2) {
            return Err(format!("UTF-16 ({order}) text of an odd number of bytes ({EXPECTED})"));
        }
        let units: Vec<u16> = rest.chunks_exact(2).map(|pair| unit([pair[0], pair[1]])).collect();
        String::from_utf16(&units)
            .map_err(|_| format!("not UTF-16 ({order}) text: a lone surrogate ({EXPECTED})"))
    };
    // UTF-32's marks first: the little-endian one begins with UTF-16's.
    for (mark, order) in [([0xff, 0xfe, 0, 0], "little-endian"), ([0, 0, 0xfe, 0xff], "big-endian")] {
        if bytes.starts_with(&mark) {
            return Err(format!("UTF-32 ({order}) text, by its byte-order mark ({EXPECTED}, or UTF-16)"));
        }
    }
    if let Some(rest) = bytes.strip_prefix(&[0xff, 0xfe]) {
        return utf16(rest, u16::from_le_bytes, "little-endian");
    }
    if let Some(rest) = bytes.strip_prefix(&[0xfe, 0xff]) {
        return utf16(rest, u16::from_be_bytes, "big-endian");
    }
    let rest = bytes.strip_prefix(&[0xef, 0xbb, 0xbf]).unwrap_or(bytes);
    // JSON holds no NUL character (a string escapes it): one in a file is UTF-16 or UTF-32
    // text without a byte-order mark, which is UTF-8 as far as its bytes go (it was "not
    // JSON: key must be a string", "expected value").
    if let Some(at) = rest.iter().position(|&b| b == 0) {
        let offset = bytes.len() - rest.len() + at;
        return Err(format!(
            "a NUL byte at offset {offset}: UTF-16 or UTF-32 text without a byte-order mark? ({EXPECTED}, or UTF-16 with its byte-order mark)"
        ));
    }
    String::from_utf8(rest.to_vec()).map_err(|e| {
        let offset = bytes.len() - rest.len() + e.utf8_error().valid_up_to();
        format!("not UTF-8 text: the bytes at offset {offset} are not UTF-8 ({EXPECTED})")
    })
}

/// Reads a trace file; an error naming the file and what is wrong with it: for an event, its
/// index in `traceEvents`, the field and what was expected there.
///
/// Checked is what the summary and the plot rely on: every event is an object; a copy (`ph`
/// `X`, `cat` `transfer`) has a time (`ts`, and `dur` if given: microseconds, 0 or more), an
/// `args` object with `buffer` and `bytes` (integers from 0 to 2^64-1), a `direction` of `h2d`,
/// `d2h` or `d2d`, a `reason` (a string) and, if given, `rolled_back` (true or false); a memory
/// counter (`ph` `C`, `cat` `memory`) has a time, a `name` (a string, if given) and
/// `args.bytes` (an integer from 0 to 2^64-1). Other events are not read.
pub fn load(path: &Path) -> Result<TraceFile> {
    let context = |e: String| CliError::new(e).context(format!("reading trace {}", path.display()));
    // A device or a pipe (`/dev/zero`) would be read without end: only regular files.
    let metadata = std::fs::metadata(path).map_err(|e| context(e.to_string()))?;
    if !metadata.is_file() {
        return Err(context("not a regular file (expected a trace written by lazybuf.trace.dump())".into()));
    }
    let bytes = std::fs::read(path).map_err(|e| context(e.to_string()))?;
    let json = text_of(&bytes).map_err(context)?;
    let doc: Value = serde_json::from_str(&json).map_err(|e| context(format!("not JSON: {e}")))?;
    let events = doc["traceEvents"].as_array().ok_or_else(|| {
        context("expected Chrome trace-event JSON with a \"traceEvents\" array (lazybuf.trace.dump())".into())
    })?;
    let dropped = match doc.get("otherData").and_then(|o| o.get("dropped")) {
        None => 0,
        Some(v) => v
            .as_u64()
            .ok_or_else(|| context(format!("otherData.dropped: expected {COUNT}, got {}", shown(Some(v)))))?,
    };
    let mut file = TraceFile { dropped, ..TraceFile::default() };
    for (index, e) in events.iter().enumerate() {
        let event = Event { value: e };
        let bad = |field: &str, expected: &str, got: Option<&Value>| {
            context(format!(
                "event {index}{}: {field}: expected {expected}, got {}",
                event.kind(),
                shown(got)
            ))
        };
        if !e.is_object() {
            return Err(context(format!("event {index}: expected an object, got {}", shown(Some(e)))));
        }
        match (e["ph"].as_str(), e["cat"].as_str()) {
            (Some("X"), Some("transfer")) => {
                let start_ms = event.time("ts", true).map_err(|(f, x, g)| bad(f, x, g))?;
                let duration_ms = event.time("dur", false).map_err(|(f, x, g)| bad(f, x, g))?;
                let args = e.get("args");
                if !args.is_some_and(Value::is_object) {
                    return Err(bad("args", "an object", args));
                }
                let arg = |name: &str| args.and_then(|a| a.get(name));
                let number = |name: &'static str, expected: &str| {
                    arg(name)
                        .and_then(Value::as_u64)
                        .ok_or_else(|| bad(&format!("args.{name}"), expected, arg(name)))
                };
                let buffer = number("buffer", &format!("a buffer id ({INTEGER})"))?;
                let bytes = number("bytes", BYTES)?;
                let direction = arg("direction")
                    .and_then(Value::as_str)
                    .filter(|d| Direction::ALL.iter().any(|known| known.name() == *d))
                    .ok_or_else(|| bad("args.direction", "\"h2d\", \"d2h\" or \"d2d\"", arg("direction")))?;
                let reason = arg("reason").and_then(Value::as_str).ok_or_else(|| {
                    bad("args.reason", "a string (\"access\", \"sync\", \"eviction\")", arg("reason"))
                })?;
                let rolled_back = match arg("rolled_back") {
                    None => false,
                    Some(v) => {
                        v.as_bool().ok_or_else(|| bad("args.rolled_back", "true or false", Some(v)))?
                    }
                };
                file.copies.push(Copy {
                    start_ms,
                    duration_ms,
                    buffer,
                    direction: direction.to_string(),
                    bytes,
                    reason: reason.to_string(),
                    rolled_back,
                });
            }
            (Some("C"), Some("memory")) => {
                let ms = event.time("ts", true).map_err(|(f, x, g)| bad(f, x, g))?;
                let name = match e.get("name") {
                    None => "memory",
                    Some(v) => {
                        v.as_str().ok_or_else(|| bad("name", "a string (\"memory DEVICE KIND\")", Some(v)))?
                    }
                };
                let series = name.strip_prefix("memory ").unwrap_or(name).to_string();
                let counter = e.get("args").and_then(|a| a.get("bytes"));
                let bytes =
                    counter.and_then(Value::as_u64).ok_or_else(|| bad("args.bytes", BYTES, counter))?;
                file.memory.entry(series).or_default().push((ms, bytes));
            }
            _ => {}
        }
    }
    Ok(file)
}

const INTEGER: &str = "an integer from 0 to 18446744073709551615";
const COUNT: &str = "a count (an integer from 0 to 18446744073709551615)";
const BYTES: &str = "a byte count (an integer from 0 to 18446744073709551615)";

/// One event of a trace, being read.
struct Event<'a> {
    value: &'a Value,
}

/// A field that is not what was expected: its name, what was expected, what was there.
type Mismatch<'a> = (&'static str, &'static str, Option<&'a Value>);

impl<'a> Event<'a> {
    /// ` (a copy)` or ` (a memory counter)`, for the error.
    fn kind(&self) -> &'static str {
        match self.value["ph"].as_str() {
            Some("X") => " (a copy)",
            Some("C") => " (a memory counter)",
            _ => "",
        }
    }

    /// A time field in milliseconds (the file holds microseconds); 0 when an optional one is
    /// absent.
    fn time(&self, field: &'static str, required: bool) -> std::result::Result<f64, Mismatch<'a>> {
        match self.value.get(field) {
            None if !required => Ok(0.0),
            v => v
                .and_then(Value::as_f64)
                .filter(|t| t.is_finite() && *t >= 0.0)
                .map(|t| t / 1000.0)
                .ok_or((field, "a time in microseconds (a number, 0 or more)", v)),
        }
    }
}

/// A value from the file as an error shows it: JSON, cut at 120 characters, control
/// characters escaped.
fn shown(value: Option<&Value>) -> String {
    match value {
        None => "nothing (no such field)".into(),
        Some(v) => printable(&short(v)),
    }
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
        let reason = printable(reason);
        let _ = writeln!(out, "{buffer:>8}  {direction:<9}  {reason:<8}  {copies:>8}  {bytes:>14}");
    }
    for (direction, (copies, bytes)) in &totals {
        let _ = writeln!(out, "{:>8}  {direction:<9}  {:<8}  {copies:>8}  {bytes:>14}", "total", "");
    }
    // No row (also when every copy was rolled back: a header alone reads as a cut-off table,
    // the nineteenth hostile pass), as `Trace::summary()` says it.
    if rows.is_empty() {
        let _ = writeln!(out, "(no copies recorded)");
    }
    for (series, points) in &file.memory {
        let peak = points.iter().map(|p| p.1).max().unwrap_or(0);
        let _ = writeln!(out, "peak memory in use, {}: {}", printable(series), format_bytes(peak));
    }
    if file.dropped > 0 {
        let _ =
            writeln!(out, "({} events were dropped by the recorder's full ring: not counted)", file.dropped);
    }
    out
}

/// Runs `lazybuf trace ...`. Ctrl-C stops it between its stages (read, summed or drawn,
/// written): status 130 and nothing written (a large trace's run went on to the end, the
/// plot written: the twenty-second hostile pass).
pub fn run(args: &TraceArgs, context: &Context) -> Result<i32> {
    let stop_if_interrupted = || if context.interrupted() { Err(CliError::interrupted()) } else { Ok(()) };
    match &args.command {
        TraceCommand::Summary { file } => {
            let file = load(file)?;
            stop_if_interrupted()?;
            let text = summary(&file);
            stop_if_interrupted()?;
            outln!("{}", text.trim_end());
        }
        TraceCommand::Plot { file, output, size } => {
            if same_file(file, output) {
                // The plot, written whole over it, would replace the trace it was drawn from
                // (a trace named `run.svg`, a link to it, a hard link: the twentieth pass).
                return Err(CliError::new(format!(
                    "-o {}: it is the trace being read ({}); expected another file for the plot",
                    output.display(),
                    file.display()
                )));
            }
            let file = load(file)?;
            stop_if_interrupted()?;
            plot::write(&file, output, *size, &stop_if_interrupted)?;
        }
    }
    Ok(0)
}

/// Whether two paths name one existing file (through links, hard links included on Unix).
fn same_file(a: &Path, b: &Path) -> bool {
    let (Ok(ma), Ok(mb)) = (std::fs::metadata(a), std::fs::metadata(b)) else { return false };
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt as _;
        if (ma.dev(), ma.ino()) == (mb.dev(), mb.ino()) {
            return true;
        }
    }
    let _ = (ma, mb);
    matches!((std::fs::canonicalize(a), std::fs::canonicalize(b)), (Ok(x), Ok(y)) if x == y)
}
