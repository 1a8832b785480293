//! `lazybuf trace summary|plot` on a trace recorded here with lazybuf's recorder (on a device
//! that copies where there is one, else the host): the summary's bytes are the buffer's
//! counters; the PNG timeline has each direction's colour where copies were made and the
//! memory series' colours; the SVG has one rectangle per copy; a file that is not a trace is
//! one error line with status 1.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use lazybuf::observe::trace::{self, TraceOptions};
use lazybuf::{Device, UnifiedBuffer};
use lazybuf_cli::trace::plot::{direction_colour, memory_colour};

fn lazybuf(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lazybuf")).args(args).output().expect("the lazybuf executable runs")
}

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lazybuf-cli-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// Records a workload; returns the trace file and the buffer's bytes moved each way.
fn record() -> (PathBuf, Device, u64, u64) {
    let device =
        lazybuf::devices().into_iter().find(|d| !d.is_zero_copy(1 << 16)).unwrap_or_else(Device::host);
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
