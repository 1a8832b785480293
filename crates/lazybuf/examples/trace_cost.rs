//! What the event recorder costs (docs/BENCHMARKS.md, "Transfer guard and recorder"):
//!
//! ```text
//! cargo run --release --example trace_cost -- [ROUNDS]
//! ```
//! times ROUNDS rounds of `mark_host_dirty()` + `sync_to_device()` + `mark_device_dirty()` +
//! `host()` on the host device and on the first OpenCL device (if any) with the recorder off,
//! then on (no stacks), interleaved five times (the medians are printed); then records 100 000
//! events and times `trace::stop()` (gathering the threads' events and naming them),
//! `Trace::to_chrome_json()` (the dump) and `Trace::summary()`.
//!
//! For instruction counts under `valgrind --tool=callgrind` (no timing, nothing printed):
//!
//! ```text
//! trace_cost batch N host|opencl off|on    # N batch rounds: new 4 KiB buffer, host write,
//!                                          # device(), mark_device_dirty(), to_vec(), drop
//! trace_cost events N off|on               # N rounds of mark_host_dirty() + mark_device_dirty()
//!                                          # on the host device: two state events each
//! ```
//! (instructions at N minus instructions at 0, over N, is one round's cost; with `on` the
//! recorder runs to the end, unexported: what is counted is the recording, staging and ring
//! included, not `stop()`'s export). Count with `--toggle-collect='*counted_rounds*'`: the
//! recorder's start calibrates its clock, which takes a different number of instructions in
//! every run.

use std::time::{Duration, Instant};

use lazybuf::observe::trace::{self, TraceOptions};
use lazybuf::{Device, UnifiedBuffer};

fn round_trips(device: &Device, rounds: usize) -> lazybuf::Result<Duration> {
    let mut buf = UnifiedBuffer::<f32>::on(&[1024], device)?;
    buf.host_mut()?.fill(1.0);
    let start = Instant::now();
    for _ in 0..rounds {
        buf.mark_host_dirty()?;
        buf.sync_to_device()?;
        buf.mark_device_dirty()?;
        std::hint::black_box(buf.host()?);
    }
    Ok(start.elapsed())
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// One round of the seeds' batch workflow on `device` (what `bench_trace.py` times in Python).
fn batch(device: &Device) -> lazybuf::Result<()> {
    let mut buf = UnifiedBuffer::<f32>::on(&[1024], device)?;
    buf.host_mut()?.fill(2.0);
    std::hint::black_box(buf.device()?);
    buf.mark_device_dirty()?;
    std::hint::black_box(buf.to_vec()?);
    Ok(())
}

fn opencl() -> Option<Device> {
    lazybuf::devices().into_iter().find(|d| d.backend_kind().name() == "opencl")
}

/// The callgrind modes (module docs).
fn counted(args: &[String]) -> lazybuf::Result<()> {
    let n: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(0);
    let on = args.last().map(String::as_str) == Some("on");
    let device = if args.get(3).map(String::as_str) == Some("opencl") {
        let Some(device) = opencl() else {
            eprintln!("trace_cost: no OpenCL device");
            std::process::exit(2);
        };
        device
    } else {
        Device::host()
    };
    // Warm up outside the counted rounds' difference: the first round opens the runtime.
    batch(&device)?;
    if on {
        trace::start(TraceOptions { capacity: 1 << 22, rust_backtrace: false })?;
    }
    counted_rounds(&args[1], n, &device)
}

/// The rounds the callgrind modes count (`--toggle-collect=*counted_rounds` counts them alone:
/// not the recorder's start, whose clock calibration varies from run to run).
#[inline(never)]
fn counted_rounds(mode: &str, n: usize, device: &Device) -> lazybuf::Result<()> {
    if mode == "batch" {
        for _ in 0..n {
            batch(device)?;
        }
    } else {
        let mut buf = UnifiedBuffer::<f32>::on(&[1024], device)?;
        buf.host_mut()?.fill(1.0);
        for _ in 0..n {
            buf.mark_host_dirty()?;
            buf.mark_device_dirty()?;
        }
    }
    // Recording stays on to the end: the export (`stop`) is not part of a round's cost.
    Ok(())
}

fn main() -> lazybuf::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if matches!(args.get(1).map(String::as_str), Some("batch" | "events")) {
        return counted(&args);
    }
    let rounds: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(20_000);
    let mut devices = vec![Device::host()];
    devices.extend(opencl());
    for device in &devices {
        let (mut off, mut on) = (Vec::new(), Vec::new());
        for _ in 0..5 {
            off.push(round_trips(device, rounds)?);
            trace::start(TraceOptions { capacity: 1 << 22, rust_backtrace: false })?;
            on.push(round_trips(device, rounds)?);
            trace::stop()?;
        }
        let (off, on) = (median(off), median(on));
        let per = |d: Duration| d.as_nanos() as f64 / rounds as f64;
        trace::start(TraceOptions { capacity: 1 << 22, rust_backtrace: false })?;
        round_trips(device, rounds)?;
        let events = trace::stop()?.events.len() as f64 / rounds as f64;
        println!(
            "{device}: recorder off {:.0} ns/round, on {:.0} ns/round ({:+.1}%), {events:.1} events/round, {:.1} ns/event",
            per(off),
            per(on),
            (per(on) / per(off) - 1.0) * 100.0,
            (per(on) - per(off)) / events,
        );
    }
    trace::start(TraceOptions { capacity: 100_000, rust_backtrace: false })?;
    round_trips(&Device::host(), 60_000)?;
    let start = Instant::now();
    let recorded = trace::stop()?;
    let stopped = start.elapsed();
    let start = Instant::now();
    let json = recorded.to_chrome_json();
    let dump = start.elapsed();
    let start = Instant::now();
    let summary = recorded.summary();
    let summarized = start.elapsed();
    println!(
        "stop (gathering and naming {} events): {:.1} ms; dump: {:.1} ms ({} bytes of JSON); summary: {:.1} ms ({} rows)",
        recorded.events.len(),
        stopped.as_secs_f64() * 1e3,
        dump.as_secs_f64() * 1e3,
        json.len(),
        summarized.as_secs_f64() * 1e3,
        summary.rows.len()
    );
    Ok(())
}
