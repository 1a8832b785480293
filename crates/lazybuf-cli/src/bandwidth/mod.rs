//! `lazybuf bandwidth`: host-to-device and device-to-host rates of lazybuf's syncs next to
//! the runtime's raw copy of the same bytes ([`raw`]), for buffer sizes doubling from `--min`
//! to `--max`, with pageable and/or pinned host memory.
//!
//! Every point is the median time of one copy over repeated copies (at least 3, more while the
//! per-point time budget lasts), after one untimed warm-up copy that also touches every page.
//! A lazybuf iteration marks the other side stale (a state change, no copy) and syncs, so it
//! moves exactly one copy; the tool checks that with the buffer's transfer counters and marks
//! syncs that moved no bytes (zero-copy devices) instead of passing them off as copies.
//!
//! Results go to a table on stdout, and optionally to JSON (schema `lazybuf.bandwidth/1`,
//! docs/CLI.md) and a plot ([`plot`]).

pub mod plot;
pub mod raw;

use std::path::Path;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use lazybuf::{BufferOptions, Device, UnifiedBuffer};
use serde::{Deserialize, Serialize};

use crate::cli::BandwidthArgs;
use crate::devices::selector_of;
use crate::error::CliError;
use crate::output::{Terminal, format_bytes, format_rate, table};
use crate::{Context, Result, devices};
use raw::RawCopy;

/// The JSON schema name of `lazybuf bandwidth --json`.
pub const SCHEMA: &str = "lazybuf.bandwidth/1";

/// Fewest timed copies per point.
const MIN_ITERATIONS: usize = 3;
/// Most timed copies per point.
const MAX_ITERATIONS: usize = 10_000;

/// A copy's direction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Direction {
    /// Host to device.
    #[serde(rename = "h2d")]
    HostToDevice,
    /// Device to host.
    #[serde(rename = "d2h")]
    DeviceToHost,
}

impl Direction {
    /// Both, host to device first.
    pub const ALL: [Direction; 2] = [Direction::HostToDevice, Direction::DeviceToHost];

    /// `h2d` or `d2h`.
    pub fn name(self) -> &'static str {
        match self {
            Direction::HostToDevice => "h2d",
            Direction::DeviceToHost => "d2h",
        }
    }

    /// How a title says it.
    pub fn title(self) -> &'static str {
        match self {
            Direction::HostToDevice => "host to device",
            Direction::DeviceToHost => "device to host",
        }
    }
}

/// Who copies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    /// A lazybuf sync.
    Lazybuf,
    /// The runtime's own copy.
    Raw,
}

impl Method {
    /// `lazybuf` or `raw`.
    pub fn name(self) -> &'static str {
        match self {
            Method::Lazybuf => "lazybuf",
            Method::Raw => "raw",
        }
    }
}

/// One measured point.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Measurement {
    /// The copy's direction.
    pub direction: Direction,
    /// Who copied.
    pub method: Method,
    /// Whether the host side was page-locked.
    pub pinned: bool,
    /// Bytes per copy.
    pub bytes: u64,
    /// The median time of one copy, in seconds.
    pub seconds: f64,
    /// How many copies were timed.
    pub iterations: u64,
    /// `bytes / seconds / 1e9`.
    pub gb_per_s: f64,
    /// The sync moved no bytes (its device copy aliases host memory): the rate is the cost of
    /// the call, not of a copy. Always false for raw copies.
    pub zero_copy: bool,
}

/// lazybuf's rate over the raw copy's, for one point.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Ratio {
    /// The copies' direction.
    pub direction: Direction,
    /// Whether the host side was page-locked.
    pub pinned: bool,
    /// Bytes per copy.
    pub bytes: u64,
    /// lazybuf GB/s / raw GB/s (1.0: raw speed; above: faster).
    pub ratio: f64,
}

/// The device measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceRef {
    /// Its selector (`opencl:0`).
    pub selector: String,
    /// Its backend's name.
    pub backend: String,
    /// The runtime's name for it.
    pub name: String,
}

/// A whole run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BandwidthReport {
    /// [`SCHEMA`].
    pub schema: String,
    /// The device.
    pub device: DeviceRef,
    /// The sizes measured, ascending.
    pub sizes: Vec<u64>,
    /// Every point: for each size, each direction, each memory kind, lazybuf then raw.
    pub measurements: Vec<Measurement>,
    /// lazybuf over raw for each size, direction and memory kind.
    pub ratios: Vec<Ratio>,
}

impl BandwidthReport {
    /// The point of one series at one size.
    pub fn find(
        &self,
        direction: Direction,
        method: Method,
        pinned: bool,
        bytes: u64,
    ) -> Option<&Measurement> {
        self.measurements.iter().find(|m| {
            m.direction == direction && m.method == method && m.pinned == pinned && m.bytes == bytes
        })
    }

    /// The memory kinds measured: false for pageable, true for pinned.
    pub fn memory_kinds(&self) -> Vec<bool> {
        [false, true].into_iter().filter(|&p| self.measurements.iter().any(|m| m.pinned == p)).collect()
    }
}

/// Runs `lazybuf bandwidth`.
pub fn run(args: &BandwidthArgs, context: &Context) -> Result<i32> {
    let device = devices::select_measurable(args.device.as_deref())?;
    let sizes = sizes(args.min, args.max)?;
    for path in [&args.json, &args.plot].into_iter().flatten() {
        if path.as_os_str() != "-" && path.parent().is_some_and(|p| !p.as_os_str().is_empty() && !p.is_dir())
        {
            return Err(CliError::new(format!("cannot write {}: its folder does not exist", path.display())));
        }
        // A directory in its place is refused before the measurement too, not after it.
        if path.is_dir() {
            return Err(CliError::new(format!("cannot write {}: it is a directory", path.display())));
        }
    }
    if let Some(path) = &args.plot {
        plot::format_of(path, "--plot")?;
    }
    check_host_memory(&device, args.max)?;
    let (pageable, mut pinned) = args.memory();
    if pinned && !device.can_pin_host_memory() {
        // wgpu devices have no pinned host memory: `--both` measures pageable memory only.
        if !pageable {
            return Err(CliError::new(format!("{device} has no pinned host memory; use --pageable")));
        }
        pinned = false;
    }
    let kinds: Vec<bool> =
        [(pageable, false), (pinned, true)].into_iter().filter(|k| k.0).map(|k| k.1).collect();
    let terminal = Terminal::detect();
    let steps = (sizes.len() * kinds.len() * 4) as u64;
    let bar = if terminal.stderr {
        let bar = ProgressBar::with_draw_target(Some(steps), ProgressDrawTarget::stderr());
        if let Ok(style) = ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}") {
            bar.set_style(style);
        }
        bar
    } else {
        ProgressBar::hidden()
    };
    let report = measure(&device, &sizes, &kinds, args.time_per_point, context, &bar);
    bar.finish_and_clear();
    let report = report?;

    let text = render(&report, terminal);
    let json_to_stdout = args.json.as_ref().is_some_and(|p| p.as_os_str() == "-");
    if json_to_stdout {
        errln!("{text}");
        outln!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        outln!("{text}");
    }
    if let Some(path) = args.json.as_ref().filter(|_| !json_to_stdout)
        && write_json(&report, path)?.may_say_so()
    {
        outln!("wrote {}", path.display());
    }
    if let Some(path) = &args.plot
        && plot::write(&report, path, args.plot_size)?.may_say_so()
    {
        if json_to_stdout {
            errln!("wrote {}", path.display());
        } else {
            outln!("wrote {}", path.display());
        }
    }
    Ok(0)
}

/// Host blocks of the largest size held at once: the buffer's host copy and the raw copy's
/// host side, and on the host device the raw copy's stand-in for device memory too.
fn host_blocks(device: &Device) -> u64 {
    if device.backend_kind() == lazybuf::BackendKind::HOST { 3 } else { 2 }
}

/// Refuses, before anything is allocated, a `--max` whose run needs more host memory than the
/// machine has (physical memory and swap): it could only fail later, or be killed touching it.
pub fn check_host_memory(device: &Device, max: u64) -> Result<()> {
    let blocks = host_blocks(device);
    let machine = lazybuf::host_memory::machine_memory() as u64;
    match max.checked_mul(blocks) {
        Some(needed) if needed <= machine => Ok(()),
        needed => Err(CliError::new(format!(
            "--max {} needs {} of host memory ({blocks} blocks of that size at once), more than \
             this machine's {} of memory and swap: expected a smaller --max",
            format_bytes(max),
            needed.map_or_else(|| "more than 16 EiB".to_string(), format_bytes),
            format_bytes(machine)
        ))),
    }
}

fn write_json(report: &BandwidthReport, path: &Path) -> Result<crate::output::Written> {
    let text = serde_json::to_string_pretty(report)?;
    crate::output::write_file(path, (text + "\n").as_bytes())
}

/// Sizes doubling from `min` up to `max` (and `max` itself when the doubling skips it).
pub fn sizes(min: u64, max: u64) -> Result<Vec<u64>> {
    if min == 0 {
        return Err(CliError::new("--min must be at least 1 byte"));
    }
    if min > max {
        return Err(CliError::new(format!(
            "--min ({}) is larger than --max ({})",
            format_bytes(min),
            format_bytes(max)
        )));
    }
    if usize::try_from(max).is_err() {
        return Err(CliError::new(format!(
            "--max {} does not fit this machine's addresses",
            format_bytes(max)
        )));
    }
    let mut sizes = Vec::new();
    let mut size = min;
    while size <= max {
        sizes.push(size);
        match size.checked_mul(2) {
            Some(next) => size = next,
            None => break,
        }
    }
    if sizes.last() != Some(&max) {
        sizes.push(max);
    }
    Ok(sizes)
}

/// Measures every point, in order: for each size, for each direction, for each memory kind,
/// lazybuf then raw.
pub fn measure(
    device: &Device,
    sizes: &[u64],
    kinds: &[bool],
    budget: Duration,
    context: &Context,
    bar: &ProgressBar,
) -> Result<BandwidthReport> {
    let mut measurements = Vec::new();
    let mut ratios = Vec::new();
    for &bytes in sizes {
        let len = usize::try_from(bytes).map_err(|_| CliError::new("size does not fit in memory"))?;
        let mut raw = RawCopy::new(device, len)?;
        for &pinned in kinds {
            let mut buf = warm_buffer(device, len, pinned)?;
            // The raw copy's host side: the same kind of host memory lazybuf's buffer has.
            let mut host = HostSide::new(device, len, pinned)?;
            for direction in Direction::ALL {
                if context.interrupted() {
                    return Err(CliError::interrupted());
                }
                let label = |method: &str| {
                    let memory = if pinned { "pinned" } else { "pageable" };
                    format!("{} {method} {memory} {}", direction.name(), format_bytes(bytes))
                };
                bar.set_message(label("lazybuf"));
                let lazy = measure_lazybuf(&mut buf, direction, budget)?;
                bar.inc(1);
                bar.set_message(label("raw"));
                let (seconds, iterations) = time(budget, || match direction {
                    Direction::HostToDevice => raw.upload(host.bytes()),
                    Direction::DeviceToHost => raw.download(host.bytes_mut()),
                })?;
                bar.inc(1);
                let rate = |seconds: f64| bytes as f64 / seconds / 1e9;
                let raw = Measurement {
                    direction,
                    method: Method::Raw,
                    pinned,
                    bytes,
                    seconds,
                    iterations,
                    gb_per_s: rate(seconds),
                    zero_copy: false,
                };
                let lazy = Measurement {
                    direction,
                    method: Method::Lazybuf,
                    pinned,
                    bytes,
                    seconds: lazy.0,
                    iterations: lazy.1,
                    gb_per_s: rate(lazy.0),
                    zero_copy: lazy.2,
                };
                ratios.push(Ratio { direction, pinned, bytes, ratio: lazy.gb_per_s / raw.gb_per_s });
                measurements.push(lazy);
                measurements.push(raw);
            }
        }
        drop(raw);
        // Give the memory of this size back before the next, larger one.
        lazybuf::trim();
    }
    let all = lazybuf::devices();
    Ok(BandwidthReport {
        schema: SCHEMA.into(),
        device: DeviceRef {
            selector: selector_of(device, &all),
            backend: device.backend_kind().name().into(),
            name: device.name().into(),
        },
        sizes: sizes.to_vec(),
        measurements,
        ratios,
    })
}

/// A buffer of `len` bytes on `device` whose host and device copies are both allocated,
/// touched and synchronized.
fn warm_buffer(device: &Device, len: usize, pinned: bool) -> Result<UnifiedBuffer<u8>> {
    let options = BufferOptions { device: Some(device.clone()), pinned, ..BufferOptions::default() };
    let mut buf = UnifiedBuffer::<u8>::with_options(&[len], options)?;
    buf.host_overwrite()?.fill(1);
    buf.sync_to_device()?;
    if pinned && !buf.is_pinned() {
        return Err(CliError::new(format!("{device} gave a pinned buffer pageable host memory")));
    }
    Ok(buf)
}

/// The host side of the raw copies.
enum HostSide {
    Pageable(lazybuf::host_memory::HostMemory),
    /// A page-locked block (possibly longer than asked) and the length used.
    Pinned(lazybuf::host_memory::HostMemory, usize),
}

impl HostSide {
    fn new(device: &Device, len: usize, pinned: bool) -> Result<HostSide> {
        if !pinned {
            // The library's allocation: a size the machine cannot hold is an error, not an
            // abort (as `vec!` would).
            let mut block = lazybuf::host_memory::HostMemory::allocate(len)?;
            block.as_mut_slice().fill(1);
            return Ok(HostSide::Pageable(block));
        }
        // The page-locked memory the device's backend gives a pinned buffer (cuMemHostAlloc,
        // mapped CL_MEM_ALLOC_HOST_PTR memory, mlock'ed pages on the host device).
        let kind = lazybuf::MemoryKind::Host { pinned: true };
        let lazybuf::Block::Host(mut block) =
            lazybuf::MemoryResource::allocate(&lazybuf::DirectResource, device, kind, len, &device.stream())?
        else {
            return Err(CliError::new(format!("{device} gave device memory for pinned host memory")));
        };
        if !block.is_pinned() {
            return Err(CliError::new(format!("{device} could not pin {len} bytes of host memory")));
        }
        let have = block.len();
        let bytes = block
            .as_mut_slice()
            .get_mut(..len)
            .ok_or_else(|| CliError::new(format!("{device} gave a host block of {have} bytes for {len}")))?;
        bytes.fill(1);
        Ok(HostSide::Pinned(block, len))
    }

    fn bytes(&self) -> &[u8] {
        match self {
            HostSide::Pageable(block) => block.as_slice(),
            HostSide::Pinned(block, len) => &block.as_slice()[..*len],
        }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            HostSide::Pageable(block) => block.as_mut_slice(),
            HostSide::Pinned(block, len) => &mut block.as_mut_slice()[..*len],
        }
    }
}

/// Times lazybuf's syncs of `buf` in `direction`: (median seconds, iterations, zero-copy).
/// Fails if the syncs moved other than exactly one copy each.
fn measure_lazybuf(
    buf: &mut UnifiedBuffer<u8>,
    direction: Direction,
    budget: Duration,
) -> Result<(f64, u64, bool)> {
    buf.reset_transfer_stats();
    let (seconds, iterations) = time(budget, || {
        match direction {
            Direction::HostToDevice => {
                buf.mark_host_dirty()?;
                buf.sync_to_device()?;
            }
            Direction::DeviceToHost => {
                buf.mark_device_dirty()?;
                buf.sync_to_host()?;
            }
        }
        Ok(())
    })?;
    let stats = buf.transfer_stats();
    let traffic = match direction {
        Direction::HostToDevice => stats.host_to_device,
        Direction::DeviceToHost => stats.device_to_host,
    };
    let syncs = iterations + 1; // the warm-up
    let expected = syncs * buf.nbytes() as u64;
    let zero_copy = stats.zero_copy_syncs == syncs && traffic.bytes == 0;
    if !zero_copy && (traffic.copies != syncs || traffic.bytes != expected) {
        return Err(CliError::new(format!(
            "{} syncs of {} bytes moved {} copies, {} bytes ({} zero-copy): expected one copy each",
            syncs,
            buf.nbytes(),
            traffic.copies,
            traffic.bytes,
            stats.zero_copy_syncs
        )));
    }
    Ok((seconds, iterations, zero_copy))
}

/// Runs `op` once untimed, then times it at least [`MIN_ITERATIONS`] times and while `budget`
/// lasts (at most [`MAX_ITERATIONS`]); returns the median time in seconds and the count.
fn time(budget: Duration, mut op: impl FnMut() -> Result<()>) -> Result<(f64, u64)> {
    op()?;
    let mut times = Vec::new();
    let start = Instant::now();
    while times.len() < MIN_ITERATIONS || (start.elapsed() < budget && times.len() < MAX_ITERATIONS) {
        let t = Instant::now();
        op()?;
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    let n = times.len();
    let median = if n % 2 == 1 { times[n / 2] } else { (times[n / 2 - 1] + times[n / 2]) / 2.0 };
    // A clock too coarse for a call this short still gives a positive time.
    Ok((median.max(1e-9), n as u64))
}

/// The time one call of a sync of `bytes` took, from the rate it was recorded as.
fn per_call(bytes: u64, gb_per_s: f64) -> String {
    let seconds = bytes as f64 / (gb_per_s * 1e9);
    if !seconds.is_finite() {
        "-".into()
    } else if seconds < 1e-3 {
        format!("{:.1} us/call", seconds * 1e6)
    } else {
        format!("{:.2} ms/call", seconds * 1e3)
    }
}

/// The table `lazybuf bandwidth` prints.
pub fn render(report: &BandwidthReport, terminal: Terminal) -> String {
    let mut rows = Vec::new();
    let mut any_zero_copy = false;
    for &bytes in &report.sizes {
        for pinned in report.memory_kinds() {
            let mut row = vec![format_bytes(bytes), if pinned { "pinned" } else { "pageable" }.to_string()];
            for direction in Direction::ALL {
                let lazy = report.find(direction, Method::Lazybuf, pinned, bytes);
                let raw = report.find(direction, Method::Raw, pinned, bytes);
                let zero_copy = lazy.is_some_and(|m| m.zero_copy);
                any_zero_copy |= zero_copy;
                // A zero-copy sync moves no bytes: its cost is a time per call, not a rate, and
                // a ratio against a copy would compare nothing.
                row.push(lazy.map_or_else(
                    || "-".into(),
                    |m| if zero_copy { per_call(bytes, m.gb_per_s) + " *" } else { format_rate(m.gb_per_s) },
                ));
                row.push(raw.map_or_else(|| "-".into(), |m| format_rate(m.gb_per_s)));
                let ratio = report
                    .ratios
                    .iter()
                    .find(|r| r.direction == direction && r.pinned == pinned && r.bytes == bytes);
                row.push(match ratio {
                    Some(_) if zero_copy => "n/a".into(),
                    Some(r) => format!("{:.2}", r.ratio),
                    None => "-".into(),
                });
            }
            rows.push(row);
        }
    }
    let headers =
        ["SIZE", "HOST MEMORY", "H2D LAZYBUF", "H2D RAW", "RATIO", "D2H LAZYBUF", "D2H RAW", "RATIO"];
    let mut out = terminal.bold(&format!(
        "lazybuf bandwidth on {} ({}, {}): GB/s, median of each point's copies; RATIO = lazybuf / raw",
        report.device.selector, report.device.name, report.device.backend
    ));
    out.push_str("\n\n");
    out.push_str(&table(&headers, &rows));
    if any_zero_copy {
        out.push_str(
            "\n\n* zero-copy: the device copy aliases host memory, so the sync moved no bytes: shown is the \
             time per call (no rate, no ratio)",
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_double_and_end_at_max() {
        assert_eq!(sizes(1024, 4096).unwrap(), vec![1024, 2048, 4096]);
        assert_eq!(sizes(1000, 5000).unwrap(), vec![1000, 2000, 4000, 5000]);
        assert_eq!(sizes(7, 7).unwrap(), vec![7]);
        assert!(sizes(0, 10).unwrap_err().to_string().contains("at least 1 byte"));
        assert!(sizes(2048, 1024).unwrap_err().to_string().contains("larger than --max"));
    }

    #[test]
    fn timing_takes_the_median_of_at_least_three_runs() {
        let mut calls = 0;
        let (median, n) = time(Duration::ZERO, || {
            calls += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!((n, calls), (3, 4));
        assert!(median > 0.0);
        let err = time(Duration::ZERO, || Err(CliError::new("boom"))).unwrap_err();
        assert_eq!(err.to_string(), "boom");
    }

    #[test]
    fn host_device_syncs_are_zero_copy_and_raw_copies_are_not() {
        let bar = ProgressBar::hidden();
        let report =
            measure(&Device::host(), &[4096], &[false], Duration::ZERO, &Context::uninterruptible(), &bar)
                .unwrap();
        assert_eq!(report.measurements.len(), 4);
        for m in &report.measurements {
            assert_eq!(m.zero_copy, m.method == Method::Lazybuf, "{m:?}");
            assert!(m.gb_per_s > 0.0 && m.iterations >= 3);
        }
        assert_eq!(report.ratios.len(), 2);
        let text = render(&report, Terminal { stdout: false, stderr: false, colour: false });
        assert!(
            text.contains("4 KiB") && text.contains("pageable") && text.contains("* zero-copy"),
            "{text}"
        );
    }

    #[test]
    fn an_interrupted_run_stops_with_status_130() {
        let bar = ProgressBar::hidden();
        let err = measure(&Device::host(), &[64], &[false], Duration::ZERO, &Context::new(|| true), &bar)
            .unwrap_err();
        assert_eq!(err.exit_code(), 130);
    }
}
