//! The `lazybuf` executable, run as a user runs it, on every device lazybuf finds: the host,
//! PoCL's OpenCL device, and CUDA devices (the driver test double in CI, through
//! `scripts/test-cuda-double.sh`). `LAZYBUF_REQUIRE=opencl,cuda` makes a missing backend a
//! failure instead of a smaller run.
//!
//! Checked: `devices --json` against the documented schema (docs/CLI.md) and the table;
//! `bandwidth` on each device with `--json` (schema, one point per size, direction, memory
//! kind and method, ratios that are lazybuf over raw) and `--plot` (a PNG of the asked size
//! whose every curve colour is drawn across its panel; an SVG with each curve's polyline);
//! `watch` for a number of refreshes and until Ctrl-C; `check` passing on each device and, on
//! a deliberately broken one, failing with status 1 and naming the divergence; errors as one
//! line and a non-zero status; `--help` with examples on every subcommand; no escape codes
//! when the output is not a terminal; sizes beyond the machine and allocations refused by
//! `ulimit -v` as one error line (never an abort), a closed stdout ending quietly with status 0
//! for every subcommand, and a `watch` interval beyond the clock (or beyond what a `Duration`
//! holds) taken without a panic: waiting for Ctrl-C, or ending at once after `--count 1`.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use lazybuf_cli::bandwidth::Method;
use lazybuf_cli::bandwidth::plot::{NO_FONT_NOTE, colour_of, font_available, ratio_colour};
use serde_json::Value;

fn lazybuf(args: &[&str]) -> Output {
    lazybuf_env(args, &[])
}

fn lazybuf_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_lazybuf"));
    command.args(args).env_remove("LAZYBUF_DEVICE").env("NO_COLOR", "");
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().expect("the lazybuf executable runs")
}

fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).expect("UTF-8 output")
}

fn stderr(output: &Output) -> String {
    String::from_utf8(output.stderr.clone()).expect("UTF-8 output")
}

/// `stderr` without the note of a plot drawn without text: a machine with no system font
/// (the GPU machine of 2026-11-28) adds it to every plot.
fn stderr_but_the_font_note(output: &Output) -> String {
    stderr(output).lines().filter(|line| *line != NO_FONT_NOTE).collect::<Vec<_>>().join("\n")
}

/// Asserts success and plain output; returns stdout.
fn ok(args: &[&str]) -> String {
    let output = lazybuf(args);
    assert!(
        output.status.success(),
        "lazybuf {args:?}: {:?}\n{}\n{}",
        output.status,
        stdout(&output),
        stderr(&output)
    );
    let text = stdout(&output);
    assert!(!text.contains('\x1b'), "escape codes in plain output of {args:?}: {text:?}");
    text
}

fn devices_json() -> Value {
    serde_json::from_str(&ok(&["devices", "--json"])).expect("devices --json is JSON")
}

/// The selectors of every device, after checking `LAZYBUF_REQUIRE`.
fn selectors() -> Vec<String> {
    let report = devices_json();
    let devices = report["devices"].as_array().unwrap();
    if let Ok(required) = std::env::var("LAZYBUF_REQUIRE") {
        for name in required.split(',').map(str::trim).filter(|n| !n.is_empty() && *n != "cuda-double") {
            assert!(
                devices.iter().any(|d| d["backend"] == name),
                "LAZYBUF_REQUIRE names {name}, but `lazybuf devices` lists none: {report:#}"
            );
        }
    }
    devices.iter().map(|d| d["selector"].as_str().unwrap().to_string()).collect()
}

fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-tests");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn devices_json_follows_the_documented_schema() {
    let report = devices_json();
    assert_eq!(report["schema"], "lazybuf.devices/1");
    let devices = report["devices"].as_array().unwrap();
    let in_process = lazybuf::devices();
    assert_eq!(devices.len(), in_process.len());
    for (d, device) in devices.iter().zip(&in_process) {
        let object = d.as_object().unwrap();
        let keys: Vec<&str> = object.keys().map(String::as_str).collect();
        for key in [
            "selector",
            "backend",
            "name",
            "vendor",
            "is_gpu",
            "shares_host_memory",
            "total_bytes",
            "free_bytes",
            "free_source",
            "cached_bytes",
            "zero_copy_min_bytes",
            "compute_capability",
            "memory_error",
        ] {
            assert!(keys.contains(&key), "{key} missing from {d}");
        }
        assert_eq!(keys.len(), 13, "undocumented keys in {d}");
        assert_eq!(d["name"], device.name());
        assert_eq!(d["backend"], device.backend_kind().name());
        assert!(d["is_gpu"].is_boolean() && d["shares_host_memory"].is_boolean());
        assert!(d["total_bytes"].as_u64().unwrap() > 0);
        // The memory query works on every device we test on.
        assert!(d["memory_error"].is_null(), "{d}");
        assert!(d["free_bytes"].as_u64().unwrap() <= d["total_bytes"].as_u64().unwrap(), "{d}");
        let source = d["free_source"].as_str().unwrap();
        assert!(["runtime", "system", "total_minus_process_held"].contains(&source), "{d}");
        assert!(d["zero_copy_min_bytes"].is_null() || d["zero_copy_min_bytes"].is_u64());
        let cc = &d["compute_capability"];
        assert!(cc.is_null() || cc.as_array().is_some_and(|a| a.len() == 2 && a.iter().all(Value::is_u64)));
        // The selector picks this very device.
        assert_eq!(lazybuf::select_device(d["selector"].as_str().unwrap()).unwrap(), *device);
    }
    let host = devices.last().unwrap();
    assert_eq!(
        (&host["selector"], &host["free_source"], &host["zero_copy_min_bytes"]),
        (&"host:0".into(), &"system".into(), &0.into())
    );
    for d in devices.iter().filter(|d| d["backend"] == "opencl" && d["shares_host_memory"] == true) {
        assert_eq!(d["free_source"], "total_minus_process_held");
        assert_eq!(d["zero_copy_min_bytes"], 4 << 20, "PoCL aliases from 4 MiB: {d}");
    }
    for d in devices.iter().filter(|d| d["backend"] == "cuda") {
        assert_eq!(d["free_source"], "runtime");
        assert!(d["compute_capability"].is_array());
    }
    let backends = report["backends"].as_array().unwrap();
    let status = lazybuf::backend_status();
    assert_eq!(backends.len(), status.len());
    for (b, s) in backends.iter().zip(&status) {
        assert_eq!(b["backend"], s.backend.name());
        assert_eq!(b.as_object().unwrap().len(), 4, "{b}");
        let count = devices.iter().filter(|d| d["backend"] == b["backend"]).count() as u64;
        assert_eq!(b["devices"].as_u64(), Some(count));
        assert_eq!(b["available"].as_bool(), Some(count > 0));
        // Why a backend found nothing is said; a backend with devices has no reason.
        assert_eq!(b["reason"].is_string(), count == 0, "{b}");
    }
}

#[test]
fn devices_table_lists_every_device_and_backend_in_plain_text() {
    let text = ok(&["devices"]);
    assert!(text.starts_with("DEVICE  "), "{text}");
    for header in ["NAME", "VENDOR", "SHARES HOST MEM", "TOTAL", "FREE", "FREE FROM", "ZERO-COPY FROM"] {
        assert!(text.lines().next().unwrap().contains(header), "{header}: {text}");
    }
    for selector in selectors() {
        assert!(text.lines().any(|l| l.starts_with(&format!("{selector} "))), "{selector}: {text}");
    }
    assert!(text.contains("\nBackends\n  "), "{text}");
    for status in lazybuf::backend_status() {
        assert!(text.contains(&format!("  {:<7} ", status.backend.name())), "{text}");
    }
}

/// The pixels of `colour` in `png`, as (x, y).
fn pixels(image: &(u32, u32, Vec<u8>), colour: (u8, u8, u8)) -> Vec<(u32, u32)> {
    let (width, _, data) = image;
    data.chunks_exact(3)
        .enumerate()
        .filter(|(_, p)| (p[0], p[1], p[2]) == colour)
        .map(|(i, _)| (i as u32 % width, i as u32 / width))
        .collect()
}

fn decode_png(path: &Path) -> (u32, u32, Vec<u8>) {
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(path).unwrap()));
    let mut reader = decoder.read_info().expect("a valid PNG");
    let mut data = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut data).expect("a valid PNG frame");
    assert_eq!((info.color_type, info.bit_depth), (png::ColorType::Rgb, png::BitDepth::Eight));
    data.truncate(info.buffer_size());
    (info.width, info.height, data)
}

/// Each curve of the plot is drawn across its panel: its colour spans most of the panel's
/// width (a legend swatch is 18 pixels wide), in the panel where it belongs.
fn assert_curves(image: &(u32, u32, Vec<u8>), kinds: &[bool]) {
    let (width, height, _) = *image;
    let (half_w, half_h) = (width / 2, height / 2);
    let check = |colour: plotters::style::RGBColor, row: u32, what: &str| {
        for column in 0..2 {
            let inside: Vec<(u32, u32)> = pixels(image, (colour.0, colour.1, colour.2))
                .into_iter()
                .filter(|&(x, y)| x / half_w == column && (y / half_h).min(1) == row)
                .collect();
            let span =
                inside.iter().map(|p| p.0).max().unwrap_or(0) - inside.iter().map(|p| p.0).min().unwrap_or(0);
            assert!(
                span > half_w / 2,
                "{what} ({colour:?}) spans {span} pixels of panel ({column}, {row}) ({} pixels of it)",
                inside.len()
            );
        }
    };
    for &pinned in kinds {
        check(colour_of(Method::Lazybuf, pinned), 0, &format!("lazybuf pinned={pinned}"));
        check(colour_of(Method::Raw, pinned), 0, &format!("raw pinned={pinned}"));
        check(ratio_colour(pinned), 1, &format!("ratio pinned={pinned}"));
    }
    // Memory kinds not measured have no curve.
    for pinned in [false, true].into_iter().filter(|p| !kinds.contains(p)) {
        assert!(
            pixels(image, {
                let c = colour_of(Method::Raw, pinned);
                (c.0, c.1, c.2)
            })
            .is_empty()
        );
    }
}

const SIZES: [u64; 7] = [1 << 10, 2 << 10, 4 << 10, 8 << 10, 16 << 10, 32 << 10, 64 << 10];

fn assert_bandwidth_json(report: &Value, selector: &str, kinds: &[bool]) {
    assert_eq!(report["schema"], "lazybuf.bandwidth/1");
    assert_eq!(report["device"]["selector"], selector);
    let device = lazybuf::select_device(selector).unwrap();
    assert_eq!(report["device"]["name"], device.name());
    assert_eq!(report["device"]["backend"], device.backend_kind().name());
    let sizes: Vec<u64> = report["sizes"].as_array().unwrap().iter().map(|s| s.as_u64().unwrap()).collect();
    assert_eq!(sizes, SIZES);
    let measurements = report["measurements"].as_array().unwrap();
    assert_eq!(measurements.len(), SIZES.len() * 2 * kinds.len() * 2);
    let find = |direction: &str, method: &str, pinned: bool, bytes: u64| {
        let found: Vec<&Value> = measurements
            .iter()
            .filter(|m| {
                m["direction"] == direction
                    && m["method"] == method
                    && m["pinned"] == pinned
                    && m["bytes"] == bytes
            })
            .collect();
        assert_eq!(found.len(), 1, "{direction} {method} {pinned} {bytes}");
        found[0]
    };
    let ratios = report["ratios"].as_array().unwrap();
    assert_eq!(ratios.len(), SIZES.len() * 2 * kinds.len());
    for bytes in SIZES {
        for direction in ["h2d", "d2h"] {
            for &pinned in kinds {
                for method in ["lazybuf", "raw"] {
                    let m = find(direction, method, pinned, bytes);
                    assert_eq!(m.as_object().unwrap().len(), 8, "{m}");
                    let seconds = m["seconds"].as_f64().unwrap();
                    assert!(seconds > 0.0 && m["iterations"].as_u64().unwrap() >= 3, "{m}");
                    let rate = m["gb_per_s"].as_f64().unwrap();
                    assert!((rate - bytes as f64 / seconds / 1e9).abs() <= rate * 1e-9, "{m}");
                    // Raw copies always copy; lazybuf's syncs alias exactly where the device does.
                    let zero_copy = method == "lazybuf" && device.is_zero_copy(bytes as usize);
                    assert_eq!(m["zero_copy"], zero_copy, "{m}");
                }
                let ratio: Vec<&Value> = ratios
                    .iter()
                    .filter(|r| r["direction"] == direction && r["pinned"] == pinned && r["bytes"] == bytes)
                    .collect();
                assert_eq!(ratio.len(), 1);
                let expected = find(direction, "lazybuf", pinned, bytes)["gb_per_s"].as_f64().unwrap()
                    / find(direction, "raw", pinned, bytes)["gb_per_s"].as_f64().unwrap();
                assert!(
                    (ratio[0]["ratio"].as_f64().unwrap() - expected).abs() <= expected * 1e-9,
                    "{}",
                    ratio[0]
                );
            }
        }
    }
}

#[test]
fn bandwidth_on_every_device_writes_json_and_a_png_with_every_curve() {
    for selector in selectors() {
        let (json, plot) = (scratch(&format!("bw-{selector}.json")), scratch(&format!("bw-{selector}.png")));
        let _ = std::fs::remove_file(&plot);
        let text = ok(&[
            "bandwidth",
            "--device",
            &selector,
            "--min",
            "1KiB",
            "--max",
            "64KiB",
            "--both",
            "--time-per-point",
            "2ms",
            "--json",
            json.to_str().unwrap(),
            "--plot",
            plot.to_str().unwrap(),
        ]);
        // The table: one row per size and memory kind, after the title.
        assert!(text.contains(&format!("lazybuf bandwidth on {selector} (")), "{text}");
        let header = "SIZE HOST MEMORY H2D LAZYBUF H2D RAW RATIO D2H LAZYBUF D2H RAW RATIO";
        assert!(text.lines().any(|l| l.split_whitespace().collect::<Vec<_>>().join(" ") == header), "{text}");
        // Zero-copy syncs (the host device; PoCL from 4 MiB) show a time per call, never a rate
        // or a ratio against a copy.
        for line in text.lines().filter(|l| l.contains(" *")) {
            assert!(line.contains("us/call *") || line.contains("ms/call *"), "{line}");
            assert!(line.contains("n/a"), "{line}");
        }
        // Pageable and pinned host memory, where the device has pinned memory (not wgpu's).
        let kinds: &[bool] = if selector.starts_with("wgpu") { &[false] } else { &[false, true] };
        for size in ["1 KiB ", "64 KiB"] {
            assert_eq!(text.lines().filter(|l| l.starts_with(size)).count(), kinds.len(), "{size}: {text}");
        }
        assert!(text.contains(&format!("wrote {}", plot.display())), "{text}");
        let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        assert_bandwidth_json(&report, &selector, kinds);
        // Round trip through the library's own types.
        let typed: lazybuf_cli::bandwidth::BandwidthReport = serde_json::from_value(report).unwrap();
        assert_eq!(typed.memory_kinds(), kinds.to_vec());

        let image = decode_png(&plot);
        assert_eq!((image.0, image.1), (1200, 800));
        assert_curves(&image, kinds);
    }
}

#[test]
fn pinned_bandwidth_on_a_device_without_pinned_memory_is_a_clear_error() {
    for selector in selectors().into_iter().filter(|s| s.starts_with("wgpu")) {
        let output = lazybuf(&["bandwidth", "--device", &selector, "--pinned", "--max", "4KiB"]);
        assert_eq!(output.status.code(), Some(1));
        assert!(stderr(&output).contains("has no pinned host memory; use --pageable"), "{}", stderr(&output));
    }
}

#[test]
fn bandwidth_plots_one_memory_kind_at_the_asked_size_with_or_without_text() {
    let plot = scratch("bw-pinned-small.png");
    let _ = std::fs::remove_file(&plot);
    for (font, args) in [("", &["--pinned"][..]), ("none", &["--pageable"][..])] {
        let mut all = vec!["bandwidth", "--device", "host", "--max", "64KiB", "--time-per-point", "1ms"];
        all.extend(args);
        all.extend(["--plot", plot.to_str().unwrap(), "--plot-size", "900x600"]);
        let env: Vec<(&str, &str)> = if font.is_empty() { vec![] } else { vec![("LAZYBUF_PLOT_FONT", font)] };
        let output = lazybuf_env(&all, &env);
        assert!(output.status.success(), "{}", stderr(&output));
        // Text unless asked for none or the machine has no font (LAZYBUF_PLOT_FONT is inherited).
        let no_text = font == "none" || !font_available();
        assert_eq!(stderr(&output).contains(NO_FONT_NOTE), no_text, "{}", stderr(&output));
        let image = decode_png(&plot);
        assert_eq!((image.0, image.1), (900, 600));
        assert_curves(&image, &[args[0] == "--pinned"]);
    }
}

#[test]
fn bandwidth_svg_has_a_polyline_per_curve() {
    let plot = scratch("bw.svg");
    ok(&[
        "bandwidth",
        "--device",
        "host",
        "--max",
        "8KiB",
        "--time-per-point",
        "1ms",
        "--plot",
        plot.to_str().unwrap(),
    ]);
    let svg = std::fs::read_to_string(&plot).unwrap();
    assert!(svg.starts_with("<svg width=\"1200\" height=\"800\""), "{}", &svg[..100.min(svg.len())]);
    let colours = [false, true]
        .into_iter()
        .flat_map(|p| [colour_of(Method::Lazybuf, p), colour_of(Method::Raw, p), ratio_colour(p)]);
    for colour in colours {
        let stroke = format!("stroke=\"#{:02X}{:02X}{:02X}\"", colour.0, colour.1, colour.2);
        // A curve per direction: a polyline through the 4 sizes (1, 2, 4, 8 KiB).
        let curves = svg
            .lines()
            .filter(|l| l.starts_with("<polyline") && l.contains(&stroke))
            .filter(|l| {
                l.split("points=\"")
                    .nth(1)
                    .is_some_and(|p| p.split(' ').filter(|s| s.contains(',')).count() == 4)
            })
            .count();
        assert_eq!(curves, 2, "{stroke}");
    }
}

#[test]
fn bandwidth_json_can_go_to_stdout_with_the_table_on_stderr() {
    let output = lazybuf(&[
        "bandwidth",
        "--device",
        "host",
        "--min",
        "1KiB",
        "--max",
        "64KiB",
        "--time-per-point",
        "1ms",
        "--json",
        "-",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let report: Value = serde_json::from_str(&stdout(&output)).expect("stdout is JSON only");
    assert_bandwidth_json(&report, "host:0", &[false, true]);
    assert!(stderr(&output).contains("lazybuf bandwidth on host:0 ("), "{}", stderr(&output));
}

/// `--json /dev/stdout` (and the `/proc/self/fd/1` it links to) writes after the table, to
/// wherever stdout goes: a pipe or a redirected file, never replacing either.
#[test]
fn bandwidth_json_to_dev_stdout_reaches_the_pipe_or_file_after_the_table() {
    let args = "bandwidth --device host --min 1KiB --max 64KiB --time-per-point 1ms";
    for json in ["/dev/stdout", "/proc/self/fd/1"] {
        // A pipe: the table, then the JSON.
        let (status, out, err) = lazybuf_sh("", &format!("{args} --json {json}"), "| cat");
        assert_eq!(status, Some(0), "{err}");
        let start = out.find("\n{").unwrap_or_else(|| panic!("no JSON after the table on stdout: {out}"));
        let report: Value = serde_json::from_str(&out[start..]).expect("the JSON after the table");
        assert_bandwidth_json(&report, "host:0", &[false, true]);
        assert!(out[..start].contains("GB/s"), "the table first: {out}");
        // A file stdout was redirected to: it keeps the table and gets the JSON after it.
        let file = scratch(&format!("stdout-{}.txt", json.replace('/', "_")));
        let (status, _, err) =
            lazybuf_sh("", &format!("{args} --json {json}"), &format!("> '{}'", file.display()));
        assert_eq!(status, Some(0), "{err}");
        let text = std::fs::read_to_string(&file).unwrap();
        let start = text.find("\n{").unwrap_or_else(|| panic!("no JSON after the table in the file: {text}"));
        assert!(text[..start].contains("GB/s"), "the table kept: {text}");
        let _: Value = serde_json::from_str(&text[start..]).expect("the JSON after the table");
    }
}

#[test]
fn watch_prints_one_row_per_device_per_refresh() {
    let all = selectors();
    let text = ok(&["watch", "--count", "3", "--interval", "10ms"]);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("TIME      DEVICE"), "{text}");
    assert_eq!(lines.len(), 1 + 3 * all.len(), "{text}");
    for (i, line) in lines[1..].iter().enumerate() {
        let selector = &all[i % all.len()];
        let cells: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(cells[1], selector, "{line}");
        assert!(cells[0].ends_with('s'), "{line}");
        assert!(line.contains("B "), "{line}");
    }
    for selector in &all {
        let text = ok(&["watch", "--device", selector, "--count", "2", "--interval", "10ms"]);
        assert_eq!(text.lines().count(), 3, "{text}");
        assert!(text.lines().skip(1).all(|l| l.split_whitespace().nth(1) == Some(selector)), "{text}");
    }
}

#[test]
fn watch_stops_cleanly_on_ctrl_c() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_lazybuf"))
        .args(["watch", "--device", "host", "--interval", "50ms"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert!(lines.next().unwrap().unwrap().starts_with("TIME"));
    assert!(lines.next().unwrap().unwrap().contains("host"));
    let killed = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(killed.success());
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "watch did not stop on SIGINT");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(status.code(), Some(0), "{status:?}");
}

#[test]
fn check_passes_on_every_device() {
    for selector in selectors() {
        let text = ok(&["check", "--device", &selector, "--steps", "60", "--seed", "11"]);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with(&format!("check {selector} (")), "{text}");
        for (line, part) in lines[1..4].iter().zip(["transitions", "random", "faults"]) {
            assert!(line.starts_with(&format!("  {part:<12} ok  ")), "{text}");
        }
        assert!(lines[1].contains("6 states x 17 operations"), "{text}");
        assert!(lines[2].contains("x 60 operations (seed 11)"), "{text}");
        assert_eq!(lines.last().unwrap(), &"PASS: the coherence contract holds on 1 device(s)");
    }
}

#[cfg(feature = "testing")]
#[test]
fn check_fails_on_a_deliberately_broken_device_and_names_the_divergence() {
    for selector in selectors() {
        for (fault, words) in [
            ("copy:3", "injected fault: copy number 3"),
            ("allocation:2", "injected fault: allocation number 2"),
        ] {
            let output = lazybuf(&["check", "--device", &selector, "--seed", "1", "--inject-fault", fault]);
            let text = stdout(&output);
            assert_eq!(output.status.code(), Some(1), "{fault} on {selector}: {text}");
            assert!(text.contains("broken on purpose"), "{text}");
            assert!(text.contains("  transitions  FAIL\n"), "{text}");
            let last = text.lines().last().unwrap();
            assert!(last.starts_with(&format!("FAIL: {selector}: ")) && last.contains(words), "{text}");
            assert!(
                last.contains(" from ") && last.contains(": expected "),
                "the operation and the expected state: {text}"
            );
        }
    }
}

#[test]
fn errors_are_one_line_on_stderr_with_a_non_zero_status() {
    let missing = scratch("no-such-folder/bw.json");
    let folder = scratch("a-folder.json");
    std::fs::create_dir_all(&folder).unwrap();
    let cases: [(&[&str], i32, &str); 9] = [
        (&["bandwidth", "--device", "tpu"], 1, "lazybuf: error: no device matches \"tpu\""),
        (
            &["bandwidth", "--device", "host", "--min", "2KiB", "--max", "1KiB"],
            1,
            "lazybuf: error: --min (2 KiB) is larger than --max (1 KiB)",
        ),
        (
            &["bandwidth", "--device", "host", "--plot", "bw.jpg"],
            1,
            "lazybuf: error: --plot bw.jpg: expected a file name ending in .png or .svg",
        ),
        (
            &["bandwidth", "--device", "host", "--json", missing.to_str().unwrap()],
            1,
            "its folder does not exist",
        ),
        // Refused before the measurement (stdout stays empty), not after it.
        (&["bandwidth", "--device", "host", "--json", folder.to_str().unwrap()], 1, "it is a directory"),
        // A size in the unit the messages print reads back.
        (
            &["bandwidth", "--device", "host", "--min", "1PiB", "--max", "1KiB"],
            1,
            "lazybuf: error: --min (1 PiB) is larger than --max (1 KiB)",
        ),
        (&["watch", "--device", "opencl:99"], 1, "lazybuf: error: no device matches \"opencl:99\""),
        (&["check", "--device", "host:x"], 1, "non-negative integer"),
        (&["watch", "--interval", "0s"], 2, "expected a duration such as 250ms"),
    ];
    for (args, code, words) in cases {
        let output = lazybuf(args);
        let err = stderr(&output);
        assert_eq!(output.status.code(), Some(code), "{args:?}: {err}");
        assert!(err.contains(words), "{args:?}: {err}");
        assert!(stdout(&output).is_empty(), "{args:?} printed to stdout");
        if code == 1 {
            assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        }
    }
    let output = lazybuf_env(&["devices"], &[("LAZYBUF_DEVICE", "tpu")]);
    assert!(output.status.success(), "devices does not need a default device");
    let output = lazybuf_env(&["bandwidth"], &[("LAZYBUF_DEVICE", "tpu")]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).starts_with("lazybuf: error: LAZYBUF_DEVICE: no device matches"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn every_subcommand_has_help_with_examples() {
    let top = ok(&["--help"]);
    for sub in ["devices", "bandwidth", "watch", "check"] {
        assert!(top.contains(&format!("  {sub} ")), "{top}");
        let help = ok(&[sub, "--help"]);
        assert!(help.contains(&format!("Usage: lazybuf {sub} [OPTIONS]")), "{help}");
        let examples = help.split("Examples:").nth(1).unwrap_or_else(|| panic!("{sub}: no examples: {help}"));
        assert!(
            examples.lines().filter(|l| l.trim_start().starts_with(&format!("lazybuf {sub}"))).count() >= 2,
            "{help}"
        );
        assert!(!help.contains("inject-fault"), "the test-only option stays hidden: {help}");
    }
}

#[test]
fn a_closed_pipe_is_not_an_error() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_lazybuf"))
        .args(["watch", "--device", "host", "--interval", "10ms", "--count", "1000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert!(lines.next().unwrap().unwrap().starts_with("TIME"));
    drop(lines);
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(0));
    assert!(stderr(&output).is_empty(), "{}", stderr(&output));
}

/// Runs the executable through `sh -c` with `setup` first (a `ulimit`, a redirection), so the
/// limits and descriptors are the shell's; returns (status, stderr less the Vulkan loader's
/// and Mesa's own notices).
fn lazybuf_sh(setup: &str, args: &str, redirect: &str) -> (Option<i32>, String, String) {
    let exe = env!("CARGO_BIN_EXE_lazybuf");
    let script = format!("{setup}\nexec '{exe}' {args} {redirect}");
    let output = Command::new("sh")
        .args(["-c", &script])
        .env_remove("LAZYBUF_DEVICE")
        .env("NO_COLOR", "")
        .output()
        .expect("sh runs");
    let err: String = stderr(&output)
        .lines()
        .filter(|l| !l.contains("XDG_RUNTIME_DIR") && !l.contains("MESA") && !l.contains("WARNING: lavapipe"))
        .map(|l| format!("{l}\n"))
        .collect();
    (output.status.code(), stdout(&output), err)
}

#[test]
fn bandwidth_sizes_beyond_the_machine_are_one_error_line_not_an_abort() {
    for args in [
        "bandwidth --device host --min 100GiB --max 100GiB",
        "bandwidth --device host --min 18446744073709551615 --max 18446744073709551615",
        "bandwidth --device host --max 18446744073709551615",
    ] {
        let (code, out, err) = lazybuf_sh("", args, "");
        assert_eq!(code, Some(1), "{args}: {err}");
        assert!(err.starts_with("lazybuf: error: --max "), "{args}: {err}");
        assert!(err.contains("of host memory") && err.contains("memory and swap"), "{args}: {err}");
        assert_eq!(err.lines().count(), 1, "{args}: {err}");
        assert!(out.is_empty(), "{args}: {out}");
    }
}

#[test]
fn an_allocation_refused_by_the_address_space_limit_is_one_error_line() {
    // 2 GiB blocks fit this machine's memory, but not a 2 GiB address space (`ulimit -v`)
    // that also holds the program: the first allocation fails, and that must be an error line
    // (`vec!` aborted, status 134).
    let (code, out, err) =
        lazybuf_sh("ulimit -v 2097152", "bandwidth --device host --pageable --min 2GiB --max 2GiB", "");
    assert_eq!(code, Some(1), "{err}");
    assert!(err.starts_with("lazybuf: error: "), "{err}");
    assert!(err.contains("out of memory") && err.contains("2147483648"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(out.is_empty(), "{out}");
}

/// The executable never sees a closed stdout: Rust's runtime opens `/dev/null` on a closed
/// standard descriptor before `main`, so nothing else can take descriptor 1 and the output
/// goes nowhere, quietly. (`python -m lazybuf`, where the interpreter leaves descriptor 1
/// closed, reports it: tests/python/test_hardening_edges.py.)
#[test]
fn a_closed_stdout_is_never_a_panic_or_another_files_output_for_every_command() {
    for args in [
        "devices",
        "devices --json",
        "bandwidth --device host --min 1KiB --max 1KiB --time-per-point 1ms",
        "watch --device host --count 1",
        "check --device host --steps 1",
    ] {
        let (code, _, err) = lazybuf_sh("", args, ">&-");
        assert_eq!(code, Some(0), "{args}: {err}");
        assert_eq!(err, "", "{args}");
    }
}

/// `--help` and `--version` whose output a full stdout refuses (`/dev/full`) exited 0 with
/// nothing written, where every subcommand's refused output is an error line and status 1 (the
/// twenty-second hostile pass).
#[cfg(target_os = "linux")]
#[test]
fn help_and_version_to_a_full_stdout_are_an_error() {
    for args in ["--help", "--version", "bandwidth --help", "help devices"] {
        let (code, _, err) = lazybuf_sh("", args, "> /dev/full");
        assert_eq!(code, Some(1), "{args}: {err}");
        assert!(err.starts_with("lazybuf: error: cannot write to stdout: "), "{args}: {err}");
        assert_eq!(err.lines().count(), 1, "{args}: {err}");
    }
}

#[test]
fn a_watch_interval_beyond_the_clock_waits_until_ctrl_c_without_a_panic() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_lazybuf"))
        .args(["watch", "--device", "host", "--interval", "9999999999999999999", "--count", "2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert!(lines.next().unwrap().unwrap().starts_with("TIME"));
    assert!(lines.next().unwrap().unwrap().contains("host"), "the first refresh");
    std::thread::sleep(Duration::from_millis(300));
    let killed = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(killed.success());
    drop(lines);
    let output = child.wait_with_output().unwrap();
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(0), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// An interval beyond what a `Duration` holds (`u64::MAX` seconds, which rounds up past it as
/// a float) is taken as the longest wait, not refused: with `--count 1` the one refresh is
/// printed and the run ends at once, without waiting.
#[test]
fn a_watch_interval_beyond_what_a_duration_holds_is_taken_and_count_1_ends_at_once() {
    for interval in ["18446744073709551615s", "18446744073709551615", "18446744073709551615m"] {
        let start = Instant::now();
        let text = ok(&["watch", "--device", "host", "--interval", interval, "--count", "1"]);
        assert!(start.elapsed() < Duration::from_secs(60), "{interval}: watch waited");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{interval}: the header and one sample: {text}");
        assert!(lines[0].starts_with("TIME"), "{text}");
        assert!(lines[1].contains("host:0"), "{text}");
    }
}

/// With no `--device` and no `LAZYBUF_DEVICE`, `bandwidth` measures a device that is not the
/// host whenever there is one (on the host every sync is zero-copy: nothing to measure).
#[test]
fn bandwidth_defaults_to_a_device_that_is_not_the_host() {
    let non_host: Vec<String> = selectors().into_iter().filter(|s| !s.starts_with("host")).collect();
    let text = ok(&["bandwidth", "--min", "1KiB", "--max", "1KiB", "--time-per-point", "1ms"]);
    let title = text.lines().next().unwrap_or_default().to_string();
    if non_host.is_empty() {
        assert!(title.contains("on host:0"), "{text}");
    } else {
        assert!(non_host.iter().any(|s| title.contains(&format!("on {s} "))), "{text}");
    }
}

/// `bandwidth --json` and `--plot` whose write fails part way (a full disk; here a file size
/// limit, `ulimit -f`, with SIGXFSZ ignored so the write fails with EFBIG) keep the earlier
/// file as it was and leave no temporary file; the error is one line naming the file.
#[cfg(unix)]
#[test]
fn bandwidth_files_that_cannot_be_written_leave_the_earlier_ones_as_they_were() {
    let dir = scratch("bandwidth-failed-writes");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let base = ["bandwidth", "--device", "host", "--pageable", "--max", "4KiB", "--time-per-point", "1ms"];
    for (option, name) in [("--json", "bw.json"), ("--plot", "bw.png"), ("--plot", "bw.svg")] {
        let path = dir.join(name);
        let file = path.to_str().unwrap();
        let mut args = base.to_vec();
        args.extend([option, file]);
        ok(&args);
        let earlier = std::fs::read(&path).unwrap();
        assert!(earlier.len() > 2048, "{name}: larger than the limit: {}", earlier.len());
        let output = Command::new("sh")
            .arg("-c")
            .arg("trap '' XFSZ; ulimit -f 1 && exec \"$0\" \"$@\"")
            .arg(env!("CARGO_BIN_EXE_lazybuf"))
            .args(&args)
            .env_remove("LAZYBUF_DEVICE")
            .env("NO_COLOR", "")
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(1), "{name}: {}", stderr(&output));
        assert_eq!(
            stderr_but_the_font_note(&output).trim_end(),
            format!("lazybuf: error: writing {file}: File too large (os error 27)"),
            "{name}"
        );
        assert!(std::fs::read(&path).unwrap() == earlier, "{name}: the earlier file is not kept");
        let names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(names.iter().all(|n| ["bw.json", "bw.png", "bw.svg"].contains(&n.as_str())), "{names:?}");
    }
}
