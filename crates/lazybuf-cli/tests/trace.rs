//! `lazybuf trace summary|plot` on a trace recorded here with lazybuf's recorder (on a device
//! that copies where there is one, else the host): the summary's bytes are the buffer's
//! counters; the PNG timeline has each direction's colour where copies were made and the
//! memory series' colours; the SVG has one rectangle per copy; a file that is not a trace is
//! one error line with status 1.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, PoisonError};

use lazybuf::observe::trace::{self, TraceOptions};
use lazybuf::{Device, UnifiedBuffer};
use lazybuf_cli::bandwidth::plot::NO_FONT_NOTE;
use lazybuf_cli::trace::plot::{direction_colour, memory_colour};

fn lazybuf(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lazybuf")).args(args).output().expect("the lazybuf executable runs")
}

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lazybuf-cli-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// The recorder is process-wide: one test records at a time.
static RECORDER: Mutex<()> = Mutex::new(());

/// Records a workload; returns the trace file and the buffer's bytes moved each way.
fn record() -> (PathBuf, Device, u64, u64) {
    let device =
        lazybuf::devices().into_iter().find(|d| !d.is_zero_copy(1 << 16)).unwrap_or_else(Device::host);
    let _recorder = RECORDER.lock().unwrap_or_else(PoisonError::into_inner);
    trace::start(TraceOptions::default()).unwrap();
    let mut buf = UnifiedBuffer::<f32>::on(&[1 << 14], &device).unwrap();
    for round in 0..3 {
        buf.host_mut().unwrap().fill(round as f32);
        buf.sync_to_device().unwrap();
        buf.mark_device_dirty().unwrap();
        buf.host().unwrap();
    }
    let stats = buf.transfer_stats();
    drop(buf);
    let recorded = trace::stop().unwrap();
    let path = temp("trace.json");
    std::fs::write(&path, recorded.to_chrome_json()).unwrap();
    (path, device, stats.host_to_device.bytes, stats.device_to_host.bytes)
}

fn decode_png(path: &Path) -> (u32, u32, Vec<u8>) {
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(path).unwrap()));
    let mut reader = decoder.read_info().expect("a valid PNG");
    let mut data = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut data).expect("a valid PNG frame");
    data.truncate(info.buffer_size());
    (info.width, info.height, data)
}

fn has_colour(image: &(u32, u32, Vec<u8>), colour: plotters::style::RGBColor) -> bool {
    image.2.chunks(3).any(|p| p == [colour.0, colour.1, colour.2])
}

#[test]
fn summary_plot_and_bad_files() {
    let (path, device, h2d, d2h) = record();
    let file = path.to_str().unwrap();

    let out = lazybuf(&["trace", "summary", file]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let total = |direction: &str| -> u64 {
        text.lines()
            .find(|l| l.trim_start().starts_with("total") && l.split_whitespace().nth(1) == Some(direction))
            .map_or(0, |l| l.split_whitespace().last().unwrap().parse().unwrap())
    };
    assert_eq!(total("h2d"), h2d, "{device}: {text}");
    assert_eq!(total("d2h"), d2h, "{device}: {text}");
    assert!(text.contains("peak memory in use"), "{text}");

    let png = temp("timeline.png");
    let out = lazybuf(&["trace", "plot", file, "-o", png.to_str().unwrap(), "--size", "900x600"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let image = decode_png(&png);
    assert_eq!((image.0, image.1), (900, 600));
    assert_eq!(has_colour(&image, direction_colour("h2d")), h2d > 0, "{device}");
    assert_eq!(has_colour(&image, direction_colour("d2h")), d2h > 0, "{device}");
    assert!(!has_colour(&image, direction_colour("d2d")));
    assert!(has_colour(&image, memory_colour(0)), "the first memory series is drawn");

    let svg = temp("timeline.svg");
    let out = lazybuf(&["trace", "plot", file, "-o", svg.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let drawing = std::fs::read_to_string(&svg).unwrap();
    let c = direction_colour("h2d");
    let blue = format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2);
    assert_eq!(drawing.matches(&format!("fill=\"{blue}\"")).count() > 0, h2d > 0, "{device}");

    let bad = temp("bad.json");
    std::fs::write(&bad, "{\"not\": \"a trace\"}").unwrap();
    let directory = temp("directory.json");
    std::fs::create_dir_all(&directory).unwrap();
    let gif = temp("x.gif");
    for (args, says) in [
        (vec!["trace", "summary", bad.to_str().unwrap()], "traceEvents"),
        (vec!["trace", "summary", "/nonexistent/trace.json"], "reading trace"),
        // Read without end before it was refused (found by a hostile script).
        (vec!["trace", "summary", "/dev/zero"], "not a regular file"),
        (vec!["trace", "plot", "/dev/zero", "-o", temp("zero.png").to_str().unwrap()], "not a regular file"),
        (vec!["trace", "summary", directory.to_str().unwrap()], "not a regular file"),
        // The option is named as the user gave it (it said --plot, bandwidth's option).
        (vec!["trace", "plot", file, "-o", gif.to_str().unwrap()], "-o "),
    ] {
        let out = lazybuf(&args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.starts_with("lazybuf: error: ") && err.contains(says), "{args:?}: {err}");
    }
}

/// Memory objects' memory is in the timeline, one series per device and kind: the summary
/// names each kind's peak (pinned and shared memory as such), and the plot draws each series
/// in its own colour (each at its own height).
#[test]
fn memory_objects_of_every_kind_are_series_of_their_own() {
    use lazybuf::{AllocationOptions, DirectResource, Memory, MemoryKind};
    let device = Device::host();
    let kinds = [
        MemoryKind::Device,
        MemoryKind::Host { pinned: false },
        MemoryKind::Host { pinned: true },
        MemoryKind::Shared,
    ];
    let recorded = {
        let _recorder = RECORDER.lock().unwrap_or_else(PoisonError::into_inner);
        trace::start(TraceOptions::default()).unwrap();
        let options = AllocationOptions { resource: Some(DirectResource::shared()), alignment: 0 };
        let objects: Vec<Memory> = (0..kinds.len())
            .map(|i| Memory::with_options(&device, kinds[i], (i + 1) << 16, options.clone()).unwrap())
            .collect();
        drop(objects);
        trace::stop().unwrap()
    };
    let path = temp("memory-objects.json");
    std::fs::write(&path, recorded.to_chrome_json()).unwrap();
    let file = path.to_str().unwrap();

    let out = lazybuf(&["trace", "summary", file]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    for (i, kind) in ["device", "host", "pinned", "shared"].iter().enumerate() {
        let line = format!("peak memory in use, {device} {kind}: {} KiB", (i + 1) * 64);
        assert!(text.contains(&line), "{line:?} in {text}");
    }

    let png = temp("memory-objects.png");
    let out = lazybuf(&["trace", "plot", file, "-o", png.to_str().unwrap(), "--size", "900x600"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let image = decode_png(&png);
    for i in 0..kinds.len() {
        assert!(has_colour(&image, memory_colour(i)), "series {i} is drawn in its own colour");
    }
    // Seven colours: one device's four kinds and the next device's first three all differ.
    assert!((0..7).all(|i| (0..7).all(|j| i == j || memory_colour(i) != memory_colour(j))));
}

/// Byte counts near 2^64 sum without overflow (a crafted file made the summary panic).
#[test]
fn the_summary_sums_the_largest_byte_counts() {
    let copy = format!(
        r#"{{"name":"h2d","cat":"transfer","ph":"X","ts":1.0,"dur":2.0,"pid":1,"tid":1000,"args":{{"buffer":1,"direction":"h2d","bytes":{},"from":"host","to":"a","call":"device","reason":"access","async":false,"op":1}}}}"#,
        u64::MAX
    );
    let path = temp("huge.json");
    std::fs::write(&path, format!(r#"{{"traceEvents":[{copy},{copy}]}}"#)).unwrap();
    let out = lazybuf(&["trace", "summary", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let total = text.lines().find(|l| l.trim_start().starts_with("total")).unwrap();
    let sum = (u128::from(u64::MAX) * 2).to_string();
    assert_eq!(total.split_whitespace().collect::<Vec<_>>(), ["total", "h2d", "2", sum.as_str()], "{text}");
}

/// A file that starts with a UTF-8 byte-order mark (an editor's or a Windows tool's) is read as
/// the JSON after it; the same file without the mark gives the same summary.
#[test]
fn a_byte_order_mark_before_the_json_is_not_part_of_it() {
    let plain = small_trace("plain.json");
    let marked = temp("marked.json");
    let mut bytes = b"\xef\xbb\xbf".to_vec();
    bytes.extend(std::fs::read(&plain).unwrap());
    std::fs::write(&marked, bytes).unwrap();
    let summary = |path: &Path| {
        let out = lazybuf(&["trace", "summary", path.to_str().unwrap()]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap().replace(path.to_str().unwrap(), "FILE")
    };
    let text = summary(&marked);
    assert!(text.contains("4096") || text.contains("4,096") || text.contains("4 KiB"), "{text}");
    assert_eq!(text, summary(&plain));
}

/// A trace saved again as UTF-16 with its byte-order mark (PowerShell's `>` writes UTF-16) is
/// read as the same JSON, either byte order; text that is neither UTF-8 nor marked UTF-16 is a
/// clear error naming the encoding expected (it said "stream did not contain valid UTF-8").
#[test]
fn a_utf16_trace_is_read_and_other_encodings_are_named() {
    let plain = small_trace("utf16-plain.json");
    let text = std::fs::read_to_string(&plain).unwrap();
    let summary = |path: &Path| {
        let out = lazybuf(&["trace", "summary", path.to_str().unwrap()]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap().replace(path.to_str().unwrap(), "FILE")
    };
    let expected = summary(&plain);
    for (name, mark, unit) in [
        ("utf16le.json", [0xff, 0xfe], u16::to_le_bytes as fn(u16) -> [u8; 2]),
        ("utf16be.json", [0xfe, 0xff], u16::to_be_bytes),
    ] {
        let path = temp(name);
        let mut bytes = mark.to_vec();
        bytes.extend(text.encode_utf16().flat_map(unit));
        std::fs::write(&path, bytes).unwrap();
        assert_eq!(summary(&path), expected, "{name}");
    }
    let mut latin1 = text.into_bytes();
    latin1.extend(b" \xe9");
    let bad = temp("latin1.json");
    std::fs::write(&bad, latin1).unwrap();
    let out = lazybuf(&["trace", "summary", bad.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("not UTF-8 text") && err.contains("UTF-8 JSON"), "{err}");
}

/// A copy the recorder marked rolled back (a later step of its plan failed, and the counters
/// took it back) is not counted by the summary, as `Trace::summary()` does not count it.
#[test]
fn the_summary_leaves_rolled_back_copies_out() {
    let copy = |bytes: u64, rolled_back: bool| {
        format!(
            r#"{{"name":"d2h","cat":"transfer","ph":"X","ts":1.0,"dur":2.0,"pid":1,"tid":1000,"args":{{"buffer":7,"direction":"d2h","bytes":{bytes},"from":"a","to":"host","call":"device","reason":"access","async":false,"op":3,"rolled_back":{rolled_back}}}}}"#
        )
    };
    let path = temp("rolled_back.json");
    let text = format!(r#"{{"traceEvents":[{},{}]}}"#, copy(100, true), copy(40, false));
    std::fs::write(&path, text).unwrap();
    let out = lazybuf(&["trace", "summary", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let total = text.lines().find(|l| l.trim_start().starts_with("total")).unwrap();
    assert_eq!(total.split_whitespace().collect::<Vec<_>>(), ["total", "d2h", "1", "40"], "{text}");
}

/// A trace whose every copy was rolled back has no row to show: the summary printed its header
/// alone (read as a table cut off), where `Trace::summary()` and a trace without copies say
/// `(no copies recorded)` (the nineteenth hostile pass).
#[test]
fn a_summary_whose_every_copy_was_rolled_back_says_no_copies() {
    let mut copy = copy_event(1.0, "h2d", 4096, "access");
    copy["args"]["rolled_back"] = true.into();
    let path = write_trace("all_rolled_back.json", vec![copy]);
    let out = lazybuf(&["trace", "summary", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text.lines().nth(1), Some("(no copies recorded)"), "{text}");
}

#[test]
fn trace_help_has_examples() {
    for args in [&["trace", "--help"][..], &["trace", "summary", "--help"], &["trace", "plot", "--help"]] {
        let out = lazybuf(args);
        assert!(out.status.success());
        let help = String::from_utf8(out.stdout).unwrap();
        let examples =
            help.split("Examples:").nth(1).unwrap_or_else(|| panic!("{args:?}: no examples: {help}"));
        let command = args[..args.len() - 1].join(" ");
        let lines =
            examples.lines().filter(|l| l.trim_start().starts_with(&format!("lazybuf {command}"))).count();
        assert!(lines >= 2, "{args:?}: {help}");
    }
}

/// A copy event as the recorder writes it, at `ts` microseconds.
fn copy_event(ts: f64, direction: &str, bytes: u64, reason: &str) -> serde_json::Value {
    serde_json::json!({
        "name": format!("{direction} {bytes} B"), "cat": "transfer", "ph": "X", "ts": ts, "dur": 2.0,
        "pid": 1, "tid": 1000,
        "args": {"buffer": 1, "direction": direction, "bytes": bytes, "from": "host", "to": "a",
                 "call": "device", "reason": reason, "async": false, "op": 1, "rolled_back": false}
    })
}

/// A memory counter event as the recorder writes it.
fn counter_event(ts: f64, name: &str, bytes: serde_json::Value) -> serde_json::Value {
    serde_json::json!({"name": name, "cat": "memory", "ph": "C", "ts": ts, "pid": 1, "args": {"bytes": bytes}})
}

fn write_trace(name: &str, events: Vec<serde_json::Value>) -> PathBuf {
    let path = temp(name);
    std::fs::write(&path, serde_json::json!({"traceEvents": events}).to_string()).unwrap();
    path
}

/// A small valid trace: two copies and a memory series.
fn small_trace(name: &str) -> PathBuf {
    write_trace(
        name,
        vec![
            counter_event(1.0, "memory gpu device", 4096.into()),
            copy_event(2.0, "h2d", 4096, "access"),
            copy_event(9.0, "d2h", 4096, "sync"),
            counter_event(12.0, "memory gpu device", 0.into()),
        ],
    )
}

/// Runs lazybuf with the files it writes limited to a few hundred bytes (`ulimit -f`, SIGXFSZ
/// ignored so that a write past the limit fails with EFBIG instead of killing it): a write
/// that fails part way, as on a full disk, without mounting anything.
#[cfg(unix)]
fn lazybuf_with_small_files(args: &[&str]) -> Output {
    Command::new("sh")
        .arg("-c")
        .arg("trap '' XFSZ; ulimit -f 1 && exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_lazybuf"))
        .args(args)
        .output()
        .expect("sh runs")
}

/// The names in `dir` that are not `keep`: temporary files left behind.
fn leftovers(dir: &Path, keep: &[&str]) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !keep.contains(&n.as_str()))
        .collect()
}

/// A plot whose write fails part way (a full disk; here a file size limit) leaves the earlier
/// file as it was and no temporary file, and says so in one clean line naming the file and the
/// system's reason (it left a cut PNG, an empty SVG, and printed plotters' debug text).
#[cfg(unix)]
#[test]
fn a_plot_that_cannot_be_written_leaves_the_earlier_file_as_it_was() {
    // Enough steps that a plot without text (a machine with no font) is larger than the limit.
    let steps = (0..32u32).flat_map(|i| {
        let t = f64::from(i) * 4.0;
        [
            counter_event(t, "memory gpu device", (4096 * u64::from(i % 5)).into()),
            copy_event(t + 1.0, "h2d", 4096, "access"),
        ]
    });
    let trace = write_trace("steps.json", steps.collect());
    let dir = temp("failed-writes");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for name in ["t.png", "t.svg"] {
        let out_path = dir.join(name);
        let out_file = out_path.to_str().unwrap();
        let out = lazybuf(&["trace", "plot", trace.to_str().unwrap(), "-o", out_file]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let earlier = std::fs::read(&out_path).unwrap();
        assert!(earlier.len() > 2048, "{name}: a plot larger than the limit: {}", earlier.len());

        let out = lazybuf_with_small_files(&["trace", "plot", trace.to_str().unwrap(), "-o", out_file]);
        assert_eq!(out.status.code(), Some(1), "{name}");
        assert_eq!(
            errors(&out),
            format!("lazybuf: error: writing {out_file}: File too large (os error 27)"),
            "{name}"
        );
        assert!(std::fs::read(&out_path).unwrap() == earlier, "{name}: the earlier file is not kept");
        assert_eq!(leftovers(&dir, &["t.png", "t.svg"]), Vec::<String>::new(), "{name}");
    }
    // Where the file cannot even be made (its folder is a file): one line too, nothing made.
    let inside_a_file = trace.join("t.png");
    let out = lazybuf(&["trace", "plot", trace.to_str().unwrap(), "-o", inside_a_file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        errors(&out),
        format!("lazybuf: error: writing {}: Not a directory (os error 20)", inside_a_file.display())
    );
}

/// A plot's standard error without the note a machine with no font adds (the plot has no text).
fn errors(out: &Output) -> String {
    let err = String::from_utf8(out.stderr.clone()).unwrap();
    err.lines().filter(|line| *line != NO_FONT_NOTE).collect::<Vec<_>>().join("\n").trim_end().to_string()
}

/// Runs `trace summary` and `trace plot` on `events`; asserts both refuse it with one line
/// holding `says` and no control character; returns the line.
fn refused(name: &str, events: Vec<serde_json::Value>, says: &str) -> String {
    let path = write_trace(name, events);
    let file = path.to_str().unwrap();
    let png = temp("refused.png");
    let _ = std::fs::remove_file(&png);
    let mut line = String::new();
    for args in [vec!["trace", "summary", file], vec!["trace", "plot", file, "-o", png.to_str().unwrap()]] {
        let out = lazybuf(&args);
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.starts_with(&format!("lazybuf: error: reading trace {file}: ")), "{err}");
        assert!(err.contains(says), "{args:?}: expected {says:?} in {err}");
        assert!(!err.trim_end().chars().any(char::is_control), "{err:?}");
        assert!(!png.exists(), "{args:?}");
        line = err;
    }
    line
}

/// Files that are not lazybuf traces are one error line and status 1, naming the event, the
/// field and what was expected (they were summarised with status 0, or misnamed).
#[test]
fn files_that_are_not_lazybuf_traces_are_refused_naming_the_event_and_field() {
    let good = || copy_event(2.0, "h2d", 10, "access");
    for (index, event) in
        [serde_json::json!(1), "two".into(), serde_json::Value::Null].into_iter().enumerate()
    {
        refused(
            "not-object.json",
            vec![good(), event],
            &format!("event 1: expected an object, got {}", ["1", "\"two\"", "null"][index]),
        );
    }
    refused(
        "sideways.json",
        vec![good(), copy_event(3.0, "sideways", 10, "access")],
        "event 1 (a copy): args.direction: expected \"h2d\", \"d2h\" or \"d2d\", got \"sideways\"",
    );
    // An unknown direction holding escape sequences: refused, the sequences escaped.
    let line = refused(
        "escape-direction.json",
        vec![copy_event(3.0, "\x1b[2J\u{9b}0m", 10, "access")],
        "args.direction",
    );
    assert!(line.contains("\\u001b[2J\\u{9b}0m"), "{line}");
    refused(
        "huge-counter.json",
        vec![good(), counter_event(4.0, "memory gpu device", serde_json::from_str("1e30").unwrap())],
        "event 1 (a memory counter): args.bytes: expected a byte count (an integer from 0 to 18446744073709551615), got 1e+30",
    );
    refused(
        "negative-counter.json",
        vec![counter_event(4.0, "memory gpu device", (-10).into())],
        "event 0 (a memory counter): args.bytes: expected a byte count",
    );
    for (field, value) in
        [("buffer", "-1"), ("buffer", "18446744073709551616"), ("bytes", "-5"), ("bytes", "1.5")]
    {
        let mut event = good();
        event["args"][field] = serde_json::from_str(value).unwrap();
        let line = refused(
            "out-of-range.json",
            vec![good(), event],
            &format!("event 1 (a copy): args.{field}: expected "),
        );
        assert!(line.contains("an integer from 0 to 18446744073709551615"), "{line}");
        assert!(!line.contains("without"), "{line}");
    }
    let mut no_args = good();
    no_args.as_object_mut().unwrap().remove("args");
    refused("no-args.json", vec![no_args], "event 0 (a copy): args: expected an object, got nothing");
    let mut no_reason = good();
    no_reason["args"].as_object_mut().unwrap().remove("reason");
    refused("no-reason.json", vec![no_reason], "event 0 (a copy): args.reason: expected a string");
    let mut bad_time = good();
    bad_time["ts"] = (-1.0).into();
    refused("negative-time.json", vec![bad_time], "event 0 (a copy): ts: expected a time in microseconds");
}

/// Strings from the file are printed with their control characters escaped (terminal escape
/// sequences were printed raw); other text, non-ASCII included, as it is.
#[test]
fn the_summary_escapes_control_characters_from_the_file() {
    let path = write_trace(
        "escapes.json",
        vec![
            copy_event(2.0, "h2d", 10, "\x1b]0;pwned\x07\x1b[2J"),
            copy_event(3.0, "d2h", 10, "caf\u{e9}\u{9b}"),
            counter_event(4.0, "memory gp\x1b[31mu device", 10.into()),
            counter_event(5.0, "memory Gerät 設備 device", 20.into()),
        ],
    );
    let out = lazybuf(&["trace", "summary", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(!text.chars().any(|c| c.is_control() && c != '\n'), "{text:?}");
    assert!(text.contains("\\u{1b}]0;pwned\\u{7}\\u{1b}[2J"), "{text}");
    assert!(text.contains("caf\u{e9}\\u{9b}"), "{text}");
    assert!(text.contains("peak memory in use, gp\\u{1b}[31mu device: 10 B"), "{text}");
    assert!(text.contains("peak memory in use, Gerät 設備 device: 20 B"), "{text}");
    let png = temp("escapes.png");
    let out = lazybuf(&["trace", "plot", path.to_str().unwrap(), "-o", png.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Ctrl-C during `trace summary` or `trace plot` went unheeded until the end (the plot was
/// written and the status was 0; the twenty-second hostile pass): it stops the run between its
/// stages now, status 130, one `interrupted` line and no plot written. The signal arrives while
/// the tool reads a large trace: the tool is stopped (SIGSTOP) once its handler is in place
/// (`/proc/PID/status`), signalled, then continued.
#[cfg(target_os = "linux")]
#[test]
fn ctrl_c_stops_a_trace_command_and_writes_nothing() {
    let events = (0..200_000).map(|i| copy_event(f64::from(i), "h2d", 4096, "access")).collect();
    let trace = write_trace("interrupted.json", events);
    for (command, output) in [("summary", None), ("plot", Some(temp("interrupted.svg")))] {
        if let Some(plot) = &output {
            let _ = std::fs::remove_file(plot);
        }
        let mut args = vec!["trace".to_string(), command.to_string(), trace.display().to_string()];
        if let Some(plot) = &output {
            args.extend(["-o".to_string(), plot.display().to_string()]);
        }
        let mut child = Command::new(env!("CARGO_BIN_EXE_lazybuf"))
            .args(&args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id().to_string();
        let status = format!("/proc/{pid}/status");
        loop {
            assert!(child.try_wait().unwrap().is_none(), "{command}: it ended before it could be signalled");
            let caught = std::fs::read_to_string(&status)
                .ok()
                .and_then(|s| s.lines().find_map(|l| l.strip_prefix("SigCgt:").map(|m| m.trim().to_string())))
                .and_then(|mask| u64::from_str_radix(&mask, 16).ok())
                .unwrap_or(0);
            if caught & (1 << 1) != 0 {
                break; // SIGINT (2) is caught: the handler is in place
            }
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
        for signal in ["-STOP", "-INT", "-CONT"] {
            assert!(Command::new("kill").args([signal, &pid]).status().unwrap().success());
        }
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(130), "{command}: {err}");
        assert_eq!(err.trim(), "lazybuf: error: interrupted", "{command}");
        assert!(out.stdout.is_empty(), "{command}: {}", String::from_utf8_lossy(&out.stdout));
        if let Some(plot) = &output {
            assert!(!plot.exists(), "{command}: the plot was written");
        }
    }
}
