//! What the event recorder costs (docs/BENCHMARKS.md, "Transfer guard and recorder"):
//!
//! ```text
//! cargo run --release --example trace_cost -- [ROUNDS]
//! ```
//! times ROUNDS rounds of `mark_host_dirty()` + `sync_to_device()` + `mark_device_dirty()` +
//! `host()` on the host device and on the first OpenCL device (if any) with the recorder off,
//! then on (no stacks), interleaved five times (the medians are printed); then records 100 000
//! events and times `Trace::to_chrome_json()` (the dump) and `Trace::summary()`.

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

fn main() -> lazybuf::Result<()> {
    let rounds: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(20_000);
    let mut devices = vec![Device::host()];
    devices.extend(lazybuf::devices().into_iter().find(|d| d.backend_kind().name() == "opencl"));
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
        println!(
            "{device}: recorder off {:.0} ns/round, on {:.0} ns/round ({:+.1}%)",
            per(off),
            per(on),
            (per(on) / per(off) - 1.0) * 100.0
        );
    }
    trace::start(TraceOptions { capacity: 100_000, rust_backtrace: false })?;
    round_trips(&Device::host(), 60_000)?;
    let recorded = trace::stop()?;
    let start = Instant::now();
    let json = recorded.to_chrome_json();
    let dump = start.elapsed();
    let start = Instant::now();
    let summary = recorded.summary();
    let summarized = start.elapsed();
    println!(
        "dump of {} events: {:.1} ms ({} bytes of JSON); summary: {:.1} ms ({} rows)",
        recorded.events.len(),
        dump.as_secs_f64() * 1e3,
        json.len(),
        summarized.as_secs_f64() * 1e3,
        summary.rows.len()
    );
    Ok(())
}
