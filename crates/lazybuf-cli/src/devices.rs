//! `lazybuf devices`: every device lazybuf opened, what it reports, and why a backend found
//! nothing; as a table or as JSON (schema `lazybuf.devices/1`, documented in docs/CLI.md).
//!
//! Also the device selection every other subcommand shares ([`select`], [`selector_of`]).

use lazybuf::{Device, MemorySource};
use serde::Serialize;

use crate::Result;
use crate::cli::DevicesArgs;
use crate::error::CliError;
use crate::output::{Terminal, format_bytes, table};

/// The JSON schema name of `lazybuf devices --json`.
pub const SCHEMA: &str = "lazybuf.devices/1";

/// The whole report.
#[derive(Debug, Serialize)]
pub struct DevicesReport {
    /// [`SCHEMA`].
    pub schema: &'static str,
    /// Every device, in discovery order (the host last).
    pub devices: Vec<DeviceEntry>,
    /// What each compiled-in backend found.
    pub backends: Vec<BackendEntry>,
}

/// One device.
#[derive(Debug, Serialize)]
pub struct DeviceEntry {
    /// The selector that picks it (`opencl:0`, `host`): `--device`, `LAZYBUF_DEVICE`.
    pub selector: String,
    /// The backend's selector name (`host`, `opencl`, `cuda`).
    pub backend: &'static str,
    /// The runtime's name for the device.
    pub name: String,
    /// The vendor, as the runtime reports it.
    pub vendor: String,
    /// Whether it is a GPU (the default device prefers GPUs).
    pub is_gpu: bool,
    /// Whether it reads and writes host memory directly.
    pub shares_host_memory: bool,
    /// Total memory in bytes.
    pub total_bytes: u64,
    /// Free memory in bytes, as `free_source` counts it; null when the query failed.
    pub free_bytes: Option<u64>,
    /// Where `free_bytes` comes from: `runtime`, `system` or `total_minus_process_held`.
    pub free_source: Option<&'static str>,
    /// Bytes of the device's memory lazybuf's caches hold in this process.
    pub cached_bytes: Option<u64>,
    /// The smallest buffer whose syncs alias host memory (move no bytes); null: never.
    pub zero_copy_min_bytes: Option<u64>,
    /// A CUDA device's compute capability `[major, minor]`; null elsewhere.
    pub compute_capability: Option<[u32; 2]>,
    /// Why the memory query failed; null when it did not.
    pub memory_error: Option<String>,
}

/// One backend.
#[derive(Debug, Serialize)]
pub struct BackendEntry {
    /// The backend's selector name.
    pub backend: &'static str,
    /// Whether it opened at least one device.
    pub available: bool,
    /// How many devices it opened.
    pub devices: usize,
    /// Why it has no device; null when it has some.
    pub reason: Option<String>,
}

/// Runs `lazybuf devices`.
pub fn run(args: &DevicesArgs) -> Result<i32> {
    let report = report();
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        outln!("{}", render(&report, Terminal::detect()));
    }
    Ok(0)
}

/// What every device and backend reports now.
pub fn report() -> DevicesReport {
    let devices = lazybuf::devices();
    let entries = devices.iter().map(|d| entry(d, &selector_of(d, &devices))).collect();
    let backends = lazybuf::backend_status()
        .into_iter()
        .map(|status| match status.devices {
            Ok(0) => BackendEntry {
                backend: status.backend.name(),
                available: false,
                devices: 0,
                reason: Some("the runtime reported no device".into()),
            },
            Ok(n) => {
                BackendEntry { backend: status.backend.name(), available: true, devices: n, reason: None }
            }
            Err(why) => BackendEntry {
                backend: status.backend.name(),
                available: false,
                devices: 0,
                reason: Some(why),
            },
        })
        .collect();
    DevicesReport { schema: SCHEMA, devices: entries, backends }
}

fn entry(device: &Device, selector: &str) -> DeviceEntry {
    let info = device.info();
    let memory = device.memory_info();
    let (free_bytes, free_source, cached_bytes, memory_error) = match &memory {
        Ok(m) => (Some(m.free), Some(source_name(m.source)), Some(m.cached), None),
        Err(err) => (None, None, None, Some(err.to_string())),
    };
    DeviceEntry {
        selector: selector.to_string(),
        backend: info.backend.name(),
        name: info.name.clone(),
        vendor: info.vendor.clone(),
        is_gpu: info.is_gpu,
        shares_host_memory: info.shares_host_memory,
        total_bytes: info.total_memory,
        free_bytes,
        free_source,
        cached_bytes,
        zero_copy_min_bytes: zero_copy_threshold(device),
        compute_capability: info.compute_capability.map(|(major, minor)| [major, minor]),
        memory_error,
    }
}

/// The JSON name of a free-memory source.
pub fn source_name(source: MemorySource) -> &'static str {
    match source {
        MemorySource::Runtime => "runtime",
        MemorySource::System => "system",
        MemorySource::TotalMinusProcessHeld => "total_minus_process_held",
    }
}

/// How a free-memory source reads in a table.
pub fn source_label(source: &str) -> &'static str {
    match source {
        "runtime" => "runtime",
        "system" => "system (MemAvailable)",
        "total_minus_process_held" => "total - held by this process",
        _ => "unknown",
    }
}

/// The smallest buffer size whose syncs alias host memory, by bisection over
/// [`Device::is_zero_copy`] (which grows with size: a device aliases from a threshold up);
/// `None` when no size up to 1 PiB does.
pub fn zero_copy_threshold(device: &Device) -> Option<u64> {
    const LIMIT: usize = 1 << 50;
    if device.is_zero_copy(0) {
        return Some(0);
    }
    if !device.is_zero_copy(LIMIT) {
        return None;
    }
    let (mut no, mut yes) = (0usize, LIMIT);
    while yes - no > 1 {
        let mid = no + (yes - no) / 2;
        if device.is_zero_copy(mid) { yes = mid } else { no = mid }
    }
    Some(yes as u64)
}

/// The selector that names `device` among `devices`: `backend:index` (`host:0` for the
/// host), as the Python package's `Device.selector` says.
pub fn selector_of(device: &Device, devices: &[Device]) -> String {
    let kind = device.backend_kind();
    let index = devices.iter().filter(|d| d.backend_kind() == kind).position(|d| d == device).unwrap_or(0);
    format!("{}:{index}", kind.name())
}

/// The device a `--device` option names, or the default device.
pub fn select(selector: Option<&str>) -> Result<Device> {
    match selector {
        Some(selector) => Ok(lazybuf::select_device(selector)?),
        None => lazybuf::default_device().map_err(|err| CliError::from(err).context("LAZYBUF_DEVICE")),
    }
}

/// The device `bandwidth` measures: the one `--device` names; else `LAZYBUF_DEVICE`'s; else
/// the default device unless it is the host, where every sync is zero-copy and there is no
/// bandwidth to see; then the first device that is not the host (PoCL, lavapipe); the host
/// only when there is nothing else.
pub fn select_measurable(selector: Option<&str>) -> Result<Device> {
    if selector.is_some() || std::env::var_os(lazybuf::discovery::DEVICE_ENV).is_some() {
        return select(selector);
    }
    let default = select(None)?;
    if default.backend_kind() != lazybuf::BackendKind::HOST {
        return Ok(default);
    }
    Ok(lazybuf::devices()
        .into_iter()
        .find(|d| d.backend_kind() != lazybuf::BackendKind::HOST)
        .unwrap_or(default))
}

/// The devices a `--device` option names: that one, or every device.
pub fn select_or_all(selector: Option<&str>) -> Result<Vec<Device>> {
    match selector {
        Some(selector) => Ok(vec![lazybuf::select_device(selector)?]),
        None => Ok(lazybuf::devices()),
    }
}

/// The table `lazybuf devices` prints.
pub fn render(report: &DevicesReport, terminal: Terminal) -> String {
    let yes_no = |b: bool| if b { "yes" } else { "no" }.to_string();
    let rows: Vec<Vec<String>> = report
        .devices
        .iter()
        .map(|d| {
            vec![
                d.selector.clone(),
                d.name.clone(),
                d.vendor.clone(),
                yes_no(d.shares_host_memory),
                format_bytes(d.total_bytes),
                d.free_bytes.map_or_else(|| "?".into(), format_bytes),
                d.free_source.map_or_else(
                    || format!("error: {}", d.memory_error.as_deref().unwrap_or("unknown")),
                    |s| source_label(s).to_string(),
                ),
                d.zero_copy_min_bytes.map_or_else(|| "never".into(), format_bytes),
            ]
        })
        .collect();
    let headers =
        ["DEVICE", "NAME", "VENDOR", "SHARES HOST MEM", "TOTAL", "FREE", "FREE FROM", "ZERO-COPY FROM"];
    let mut out = table(&headers, &rows);
    out.push_str("\n\n");
    out.push_str(&terminal.bold("Backends"));
    for b in &report.backends {
        let line = match &b.reason {
            None => format!("\n  {:<7} {} device(s)", b.backend, b.devices),
            Some(why) => format!("\n  {:<7} none: {why}", b.backend),
        };
        out.push_str(&line);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_is_listed_with_its_selector_and_always_zero_copy() {
        let report = report();
        let host = report.devices.last().unwrap();
        assert_eq!((host.selector.as_str(), host.backend), ("host:0", "host"));
        assert_eq!(host.zero_copy_min_bytes, Some(0));
        assert!(host.shares_host_memory && host.total_bytes > 0);
        assert_eq!(host.free_source, Some("system"));
        assert!(report.backends.iter().any(|b| b.backend == "host" && b.available));
        for device in &report.devices {
            assert_eq!(lazybuf::select_device(&device.selector).unwrap().name(), device.name);
        }
    }

    #[test]
    fn the_table_names_every_device_and_backend() {
        let report = report();
        let text = render(&report, Terminal { stdout: false, stderr: false, colour: false });
        assert!(text.starts_with("DEVICE"), "{text}");
        for d in &report.devices {
            assert!(text.contains(&d.selector) && text.contains(&d.name), "{text}");
        }
        for b in &report.backends {
            assert!(text.contains(&format!("  {:<7} ", b.backend)), "{text}");
        }
        assert!(!text.contains('\x1b'));
    }
}
