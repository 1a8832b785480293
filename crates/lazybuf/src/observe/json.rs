//! Chrome trace-event JSON for a [`Trace`] (the "JSON Object Format": `{"traceEvents": [...]}`),
//! which ui.perfetto.dev and chrome://tracing open.
//!
//! Layout: one process (`pid` 1, "lazybuf"); each recording thread is a track (`tid` = its
//! number) holding instant events (`ph: "i"`) for allocations, frees, pool lookups and state
//! transitions; each stream a track of its own (`tid` 1000 + n, named after the stream's
//! device) holding the copies as complete events (`ph: "X"`, `dur` 0 for an asynchronous
//! copy, whose end is not recorded); memory in use per device and kind as counter events
//! (`ph: "C"`, name `memory <device> <kind>`, args `{"bytes": n}`). Every copy's `args` hold
//! `buffer`, `direction` (`h2d`, `d2h`, `d2d`), `bytes`, `from`, `to`, `call`, `reason`,
//! `async`, `op` (its plan execution) and `rolled_back` (a later rollback event of the same
//! `op` undid it in the counters); a rollback is an instant event (`cat: "rollback"`) on its
//! thread's track, a coherence checker read a complete event (`cat: "checker"`) there too.
//! Frees name the `buffer` that owned the block (`null`: none). Times are microseconds since
//! the recorder started.

use std::collections::{HashMap, HashSet};
use std::fmt::Write;

use super::event::{EventKind, Source};
use super::trace::Trace;

/// Track numbers of streams start here.
const STREAM_TRACKS: u64 = 1000;

impl Trace {
    /// The events as Chrome trace-event JSON (the JSON object format, `traceEvents`), which
    /// ui.perfetto.dev and chrome://tracing open.
    pub fn to_chrome_json(&self) -> String {
        chrome(self)
    }
}

fn chrome(trace: &Trace) -> String {
    let mut out = String::with_capacity(64 + trace.events.len() * 260);
    out.push_str("{\"displayTimeUnit\":\"ms\",\"otherData\":{\"dropped\":");
    let _ = write!(out, "{}", trace.dropped);
    out.push_str("},\"traceEvents\":[");
    out.push_str(r#"{"name":"process_name","ph":"M","pid":1,"tid":0,"args":{"name":"lazybuf"}}"#);
    let mut streams: HashMap<usize, u64> = HashMap::new();
    let mut threads: Vec<u64> = Vec::new();
    let mut in_use: HashMap<(String, &'static str), i128> = HashMap::new();
    let undone: HashSet<(u64, u64)> = trace
        .events
        .iter()
        .filter_map(|event| match event.kind {
            EventKind::Rollback { buffer, op, .. } if op != 0 => Some((buffer, op)),
            _ => None,
        })
        .collect();
    for event in &trace.events {
        let ts = event.time.as_nanos() as f64 / 1000.0;
        if !matches!(event.kind, EventKind::Transfer { .. }) && !threads.contains(&event.thread) {
            threads.push(event.thread);
            let _ = write!(
                out,
                r#",{{"name":"thread_name","ph":"M","pid":1,"tid":{t},"args":{{"name":"thread {t}"}}}}"#,
                t = event.thread
            );
        }
        out.push(',');
        let mut memory = None;
        match &event.kind {
            EventKind::Transfer { info, stream, duration, op } => {
                let next = STREAM_TRACKS + streams.len() as u64;
                let tid = *streams.entry(*stream).or_insert_with(|| {
                    let device = if info.direction == super::Direction::DeviceToHost { &info.from } else { &info.to };
                    let _ = write!(
                        out,
                        r#"{{"name":"thread_name","ph":"M","pid":1,"tid":{next},"args":{{"name":"stream {} ({})"}}}},"#,
                        next - STREAM_TRACKS,
                        escape(device)
                    );
                    next
                });
                let dur = duration.map_or(0.0, |d| d.as_nanos() as f64 / 1000.0);
                let _ = write!(
                    out,
                    r#"{{"name":"{dir} {bytes} B","cat":"transfer","ph":"X","ts":{ts:.3},"dur":{dur:.3},"pid":1,"tid":{tid},"args":{{"buffer":{buffer},"direction":"{dir}","bytes":{bytes},"from":"{from}","to":"{to}","call":"{call}","reason":"{reason}","stream":{stream},"async":{is_async},"op":{op},"rolled_back":{rolled_back}}}}}"#,
                    dir = info.direction.name(),
                    bytes = info.bytes,
                    buffer = info.buffer,
                    from = escape(&info.from),
                    to = escape(&info.to),
                    call = escape(info.cause.call),
                    reason = info.cause.reason.name(),
                    is_async = duration.is_none(),
                    rolled_back = *op != 0 && undone.contains(&(info.buffer, *op)),
                );
            }
            EventKind::Allocate { buffer, device, kind, bytes, source } => {
                let source = match source {
                    Source::Cache => "cache",
                    Source::Upstream => "upstream",
                };
                let _ = write!(
                    out,
                    r#"{{"name":"allocate {kind} {bytes} B","cat":"memory","ph":"i","s":"t","ts":{ts:.3},"pid":1,"tid":{tid},"args":{{"buffer":{buffer},"device":"{device}","kind":"{kind}","bytes":{bytes},"source":"{source}"}}}}"#,
                    kind = kind.name(),
                    tid = event.thread,
                    device = escape(device),
                );
                memory = Some((device, kind.name(), *bytes as i128));
            }
            EventKind::Free { buffer, device, kind, bytes } => {
                let _ = write!(
                    out,
                    r#"{{"name":"free {kind} {bytes} B","cat":"memory","ph":"i","s":"t","ts":{ts:.3},"pid":1,"tid":{tid},"args":{{"buffer":{buffer},"device":"{device}","kind":"{kind}","bytes":{bytes}}}}}"#,
                    kind = kind.name(),
                    tid = event.thread,
                    device = escape(device),
                    buffer = buffer.map_or_else(|| "null".to_string(), |b| b.to_string()),
                );
                memory = Some((device, kind.name(), -(*bytes as i128)));
            }
            EventKind::Pool { hit, device, bytes } => {
                let _ = write!(
                    out,
                    r#"{{"name":"pool {what}","cat":"pool","ph":"i","s":"t","ts":{ts:.3},"pid":1,"tid":{tid},"args":{{"device":"{device}","bytes":{bytes},"hit":{hit}}}}}"#,
                    what = if *hit { "hit" } else { "miss" },
                    tid = event.thread,
                    device = escape(device),
                );
            }
            EventKind::State { buffer, from, to, call } => {
                let _ = write!(
                    out,
                    r#"{{"name":"buffer {buffer} {to}","cat":"state","ph":"i","s":"t","ts":{ts:.3},"pid":1,"tid":{tid},"args":{{"buffer":{buffer},"from":"{from}","to":"{to}","call":"{call}"}}}}"#,
                    tid = event.thread,
                    call = escape(call),
                );
            }
            EventKind::Rollback { buffer, op, allocations, call } => {
                let _ = write!(
                    out,
                    r#"{{"name":"buffer {buffer} rollback","cat":"rollback","ph":"i","s":"t","ts":{ts:.3},"pid":1,"tid":{tid},"args":{{"buffer":{buffer},"op":{op},"allocations":{allocations},"call":"{call}"}}}}"#,
                    tid = event.thread,
                    call = escape(call),
                );
            }
            EventKind::CheckerRead { buffer, device, bytes, duration } => {
                let _ = write!(
                    out,
                    r#"{{"name":"checker read {bytes} B","cat":"checker","ph":"X","ts":{ts:.3},"dur":{dur:.3},"pid":1,"tid":{tid},"args":{{"buffer":{buffer},"device":"{device}","bytes":{bytes}}}}}"#,
                    dur = duration.as_nanos() as f64 / 1000.0,
                    tid = event.thread,
                    device = escape(device),
                );
            }
        }
        if let Some(stack) = &event.stack {
            // Re-open the args object: every event above ends with "}}" (args, event).
            out.truncate(out.len() - 2);
            let _ = write!(out, r#","stack":"{}"}}}}"#, escape(stack));
        }
        if let Some((device, kind, delta)) = memory {
            counter(&mut out, &mut in_use, device, kind, delta, ts);
        }
    }
    out.push_str("]}");
    out
}

/// A counter event for memory in use on `device` of `kind`, after adding `delta`.
fn counter(
    out: &mut String,
    in_use: &mut HashMap<(String, &'static str), i128>,
    device: &str,
    kind: &'static str,
    delta: i128,
    ts: f64,
) {
    let total = in_use.entry((device.to_string(), kind)).or_insert(0);
    *total = (*total + delta).max(0);
    let _ = write!(
        out,
        r#",{{"name":"memory {device} {kind}","cat":"memory","ph":"C","ts":{ts:.3},"pid":1,"args":{{"bytes":{total}}}}}"#,
        device = escape(device),
    );
}

/// `text` as the inside of a JSON string.
pub(super) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}
