//! `lazybuf watch`: memory in use, held by lazybuf's pool (in use and cached), and free, for
//! one device or all, every interval until Ctrl-C (or `--count` refreshes); with the device's
//! memory limit and what spilling did under it ([`lazybuf::spill`]): evictions (of which
//! clean, moving no byte) and the bytes written back.
//!
//! On a terminal the rows are redrawn in place (the cursor moves back up over them); otherwise
//! every refresh appends one row per device, with the time since the start, so the output can
//! be logged and parsed.

use std::io::Write;
use std::time::{Duration, Instant};

use lazybuf::{Device, MemoryPool};

use crate::cli::WatchArgs;
use crate::devices::{selector_of, source_label, source_name};
use crate::output::{Terminal, format_bytes};
use crate::{Context, Result, devices};

/// The columns; `FREE FROM` stays last (it has no fixed width).
const HEADER: [&str; COLUMNS] = [
    "TIME",
    "DEVICE",
    "IN USE",
    "POOL IN USE",
    "POOL CACHED",
    "FREE",
    "TOTAL",
    "LIMIT",
    "EVICTED/CLEAN",
    "WRITTEN BACK",
    "FREE FROM",
];
const COLUMNS: usize = 11;

/// Runs `lazybuf watch`. Ctrl-C ends it cleanly (status 0).
pub fn run(args: &WatchArgs, context: &Context) -> Result<i32> {
    let watched = devices::select_or_all(args.device.as_deref())?;
    let all = lazybuf::devices();
    let names: Vec<String> = watched.iter().map(|d| selector_of(d, &all)).collect();
    let terminal = Terminal::detect();
    let start = Instant::now();
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", terminal.bold(&row(&HEADER.map(String::from))))?;
    let mut refreshes = 0u64;
    loop {
        if refreshes > 0 && terminal.stdout {
            // Back up over the rows drawn last time and draw them again.
            write!(out, "\x1b[{}A", watched.len())?;
        }
        for (device, name) in watched.iter().zip(&names) {
            let line = row(&sample(device, name, start.elapsed()));
            if terminal.stdout {
                // A row that wrapped would break moving back up over the rows: cut it to fit.
                let width =
                    console::Term::stdout().size_checked().map_or(usize::MAX, |(_, w)| usize::from(w));
                let line: String = line.chars().take(width.saturating_sub(1).max(20)).collect();
                writeln!(out, "\x1b[2K{line}")?;
            } else {
                writeln!(out, "{line}")?;
            }
        }
        out.flush()?;
        refreshes += 1;
        if args.count.is_some_and(|n| refreshes >= n) || !sleep(args.interval, context) {
            return Ok(0);
        }
    }
}

/// Sleeps for `interval` in short slices; false if interrupted meanwhile.
fn sleep(interval: Duration, context: &Context) -> bool {
    // An interval beyond what the clock can count (`--interval 9999999999999999999`) never
    // ends: sleep until interrupted (`Instant + Duration` would panic on the overflow).
    let until = Instant::now().checked_add(interval);
    loop {
        if context.interrupted() {
            return false;
        }
        let now = Instant::now();
        if until.is_some_and(|until| now >= until) {
            return true;
        }
        let left = until.map_or(Duration::MAX, |until| until - now);
        std::thread::sleep(left.min(Duration::from_millis(20)));
    }
}

/// One row's cells for `device` now.
pub fn sample(device: &Device, name: &str, elapsed: Duration) -> [String; COLUMNS] {
    let time = format!("{:.1}s", elapsed.as_secs_f64());
    let pool = MemoryPool::for_device(device).stats();
    let spilled = lazybuf::spill::spill_stats(device);
    let limit = match lazybuf::spill::memory_limit(device) {
        Ok(Some(limit)) => format_bytes(limit),
        Ok(None) => "none".into(),
        Err(_) => "bad env".into(),
    };
    let evicted = format!("{}/{}", spilled.evictions, spilled.clean_evictions);
    let written_back = format_bytes(spilled.bytes_written_back);
    let (in_use, free, total, from) = match device.memory_info() {
        Ok(m) => (
            format_bytes(m.total.saturating_sub(m.free)),
            format_bytes(m.free),
            format_bytes(m.total),
            source_label(source_name(m.source)).to_string(),
        ),
        Err(err) => {
            ("?".into(), "?".into(), format_bytes(device.info().total_memory), format!("error: {err}"))
        }
    };
    [
        time,
        name.to_string(),
        in_use,
        format_bytes(pool.bytes_in_use),
        format_bytes(pool.bytes_cached),
        free,
        total,
        limit,
        evicted,
        written_back,
        from,
    ]
}

/// Cells in fixed-width columns, so rows line up from one refresh to the next.
fn row(cells: &[String; COLUMNS]) -> String {
    const WIDTHS: [usize; COLUMNS - 1] = [8, 10, 11, 12, 12, 11, 11, 10, 13, 12];
    let mut line = String::new();
    for (i, cell) in cells.iter().enumerate() {
        match WIDTHS.get(i) {
            Some(&w) if i < 2 => line.push_str(&format!("{cell:<w$}  ")),
            Some(&w) => line.push_str(&format!("{cell:>w$}  ")),
            None => line.push_str(cell),
        }
    }
    line.trim_end().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_sample_reports_system_memory() {
        let cells = sample(&Device::host(), "host", Duration::from_millis(1500));
        assert_eq!(cells[0], "1.5s");
        assert_eq!(cells[1], "host");
        assert!(cells[5].ends_with("iB"), "free: {cells:?}");
        assert_eq!(cells[10], "system (MemAvailable)");
        let line = row(&cells);
        assert!(line.starts_with("1.5s      host"), "{line}");
    }

    /// On a device of its own (a fault-free wrapper of the host), so no other test's limit
    /// shows.
    #[cfg(feature = "testing")]
    #[test]
    fn a_sample_shows_the_limit_and_the_spill_counters() {
        let device = lazybuf::testing::FaultyDevice::wrap(&Device::host()).0;
        let cells = sample(&device, "faulty", Duration::ZERO);
        assert_eq!(&cells[7..10], ["none", "0/0", "0 B"], "{cells:?}");
        lazybuf::spill::set_memory_limit(&device, Some(3 << 20));
        let cells = sample(&device, "faulty", Duration::ZERO);
        assert_eq!(cells[7], "3 MiB", "{cells:?}");
    }

    #[test]
    fn sleeping_stops_when_interrupted() {
        let start = Instant::now();
        assert!(!sleep(Duration::from_secs(10), &Context::new(|| true)));
        assert!(start.elapsed() < Duration::from_secs(1));
        assert!(sleep(Duration::from_millis(30), &Context::uninterruptible()));
    }
}
