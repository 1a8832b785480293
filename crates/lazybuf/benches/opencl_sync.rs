//! sync_to_device / sync_to_host against the raw OpenCL write and read of the same bytes, in
//! one run, on every OpenCL device (PoCL's CPU device here), 1 KiB to 256 MiB.
//!
//! Three variants per size and direction:
//! - `raw`: `clEnqueueWriteBuffer` / `clEnqueueReadBuffer` (blocking) on lazybuf's own queue,
//!   between a pre-touched host vector and a pre-touched device buffer;
//! - `copy`: lazybuf's sync on a device opened with zero-copy disabled (the copy path, which a
//!   device that does not share host memory always takes);
//! - `default`: lazybuf's sync as it runs by default (zero-copy map/unmap from 1 MiB on a
//!   host-sharing device).
//!
//! Every buffer is allocated and touched before measuring; each lazybuf iteration first marks
//! the other side dirty (no copy, a state change) so the sync really moves the data. After the
//! measurements the bench prints, for each size, raw time / lazybuf time: 1.0 means the same
//! speed, above 1 faster than raw.
//!
//! Run: `cargo bench -p lazybuf --bench opencl_sync` (`LAZYBUF_BENCH_MAX_MIB=16` to stop early).

use std::path::{Path, PathBuf};
use std::ptr;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput};
use lazybuf::backend::RawDevice;
use lazybuf::backend::opencl::{OpenClBackend, OpenClOptions};
use lazybuf::{BackendKind, Device, UnifiedBuffer};

const KIB: usize = 1024;

fn sizes() -> Vec<usize> {
    let max_mib = std::env::var("LAZYBUF_BENCH_MAX_MIB").ok().and_then(|v| v.parse().ok()).unwrap_or(256);
    [KIB, 16 * KIB, 256 * KIB, 1 << 20, 2 << 20, 4 << 20, 8 << 20, 16 << 20, 64 << 20, 256 << 20]
        .into_iter()
        .filter(|&s| s <= max_mib << 20)
        .collect()
}

fn label(bytes: usize) -> String {
    if bytes >= 1 << 20 { format!("{}MiB", bytes >> 20) } else { format!("{}KiB", bytes >> 10) }
}

/// Raw blocking write/read through cl3 on the device's own queue.
struct Raw {
    queue: *mut std::ffi::c_void,
    mem: *mut std::ffi::c_void,
}

impl Raw {
    fn new(device: &Device, bytes: usize) -> Raw {
        // SAFETY: (bench) lazybuf's handles stay valid while `device` lives.
        let RawDevice::OpenCl { context, queue, .. } = (unsafe { device.raw() }) else { unreachable!() };
        // SAFETY: (bench) a plain read-write buffer on a live context.
        let mem = unsafe {
            cl3::memory::create_buffer(context, cl3::memory::CL_MEM_READ_WRITE, bytes, ptr::null_mut())
        }
        .expect("raw buffer");
        Raw { queue, mem }
    }

    fn write(&self, src: &[u8]) {
        // SAFETY: (bench) blocking write of src.len() bytes into a buffer at least that large.
        unsafe {
            let e = cl3::command_queue::enqueue_write_buffer(
                self.queue,
                self.mem,
                1,
                0,
                src.len(),
                src.as_ptr().cast(),
                0,
                ptr::null(),
            )
            .unwrap();
            cl3::event::release_event(e).unwrap();
        }
    }

    fn read(&self, dst: &mut [u8]) {
        // SAFETY: (bench) blocking read of dst.len() bytes from a buffer at least that large.
        unsafe {
            let e = cl3::command_queue::enqueue_read_buffer(
                self.queue,
                self.mem,
                1,
                0,
                dst.len(),
                dst.as_mut_ptr().cast(),
                0,
                ptr::null(),
            )
            .unwrap();
            cl3::event::release_event(e).unwrap();
        }
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        // SAFETY: (bench) releasing the buffer created in `new`, once.
        let _ = unsafe { cl3::memory::release_mem_object(self.mem) };
    }
}

fn warm_buffer(device: &Device, bytes: usize) -> UnifiedBuffer<u8> {
    let mut buf = UnifiedBuffer::<u8>::on(&[bytes], device).unwrap();
    buf.host_mut().unwrap().fill(1);
    buf.sync_to_device().unwrap();
    buf.mark_device_dirty().unwrap();
    buf.sync_to_host().unwrap();
    buf
}

fn bench_device(c: &mut Criterion, name: &str, default: &Device, copying: &Device) -> Vec<String> {
    let mut groups = Vec::new();
    for (direction, to_device) in [("to_device", true), ("to_host", false)] {
        let group_name = format!("opencl_sync_{direction}/{name}");
        let mut group = c.benchmark_group(&group_name);
        group
            .sample_size(20)
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(3));
        for bytes in sizes() {
            group.throughput(Throughput::Bytes(bytes as u64));
            let raw = Raw::new(default, bytes);
            let mut host = vec![7u8; bytes];
            raw.write(&host);
            raw.read(&mut host);
            group.bench_function(BenchmarkId::new("raw", label(bytes)), |b| {
                if to_device { b.iter(|| raw.write(&host)) } else { b.iter(|| raw.read(&mut host)) }
            });
            for (variant, device) in [("copy", copying), ("default", default)] {
                let mut buf = warm_buffer(device, bytes);
                group.bench_function(BenchmarkId::new(variant, label(bytes)), |b| {
                    if to_device {
                        b.iter(|| {
                            buf.mark_host_dirty().unwrap();
                            buf.sync_to_device().unwrap();
                        })
                    } else {
                        b.iter(|| {
                            buf.mark_device_dirty().unwrap();
                            buf.sync_to_host().unwrap();
                        })
                    }
                });
            }
        }
        group.finish();
        groups.push(group_name);
    }
    groups
}

/// lazybuf's own per-call cost, without a runtime: on the host device a sync is a state change
/// and a zero-copy no-op, so what remains is the bookkeeping every sync pays.
fn bench_overhead(c: &mut Criterion) {
    let mut group = c.benchmark_group("sync_overhead");
    group.sample_size(30).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(2));
    let mut buf = warm_buffer(&Device::host(), KIB);
    group.bench_function("host_device/mark_host_dirty+sync_to_device", |b| {
        b.iter(|| {
            buf.mark_host_dirty().unwrap();
            buf.sync_to_device().unwrap();
        })
    });
    group.bench_function("host_device/sync_to_device_when_current", |b| {
        b.iter(|| buf.sync_to_device().unwrap())
    });
    group.finish();
}

fn median_ns(dir: &Path, group: &str, function: &str, param: &str) -> Option<f64> {
    let path = dir.join(group.replace('/', "_")).join(function).join(param).join("new/estimates.json");
    let text = std::fs::read_to_string(&path).ok()?;
    let at = text.find("\"median\"")?;
    let rest = &text[at..];
    let start = rest.find("\"point_estimate\":")? + "\"point_estimate\":".len();
    let end = rest[start..].find([',', '}'])?;
    rest[start..start + end].trim().parse().ok()
}

fn main() {
    let out: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/criterion");
    let mut c = Criterion::default().output_directory(&out).configure_from_args();
    bench_overhead(&mut c);
    let devices: Vec<Device> =
        lazybuf::devices().into_iter().filter(|d| d.backend_kind() == BackendKind::OPENCL).collect();
    if devices.is_empty() {
        println!("opencl_sync: no OpenCL device ({:?}); nothing to measure", lazybuf::backend_status());
        return;
    }
    let mut report = Vec::new();
    for (i, device) in devices.iter().enumerate() {
        // SAFETY: (bench) reading the device id of a live device.
        let RawDevice::OpenCl { device: id, .. } = (unsafe { device.raw() }) else { unreachable!() };
        let no_zero_copy = OpenClOptions { zero_copy_min_bytes: usize::MAX };
        // SAFETY: (bench) `id` is the device id of a live OpenCL device.
        let backend = unsafe { OpenClBackend::open_with(id, no_zero_copy) }.unwrap();
        let copying = Device::open(backend);
        let name = format!("dev{i}");
        report.push((device.name().to_string(), bench_device(&mut c, &name, device, &copying)));
    }
    c.final_summary();

    println!("\nRatio raw time / lazybuf time (1.00 = raw speed; higher is faster than raw):");
    for (device, groups) in report {
        for group in groups {
            println!(
                "\n{device}: {group}\n\n| size | raw | copy path | ratio | default path | ratio |\n|---|---|---|---|---|---|"
            );
            for bytes in sizes() {
                let l = label(bytes);
                let get = |f: &str| median_ns(&out, &group, f, &l);
                if let (Some(raw), Some(copy), Some(def)) = (get("raw"), get("copy"), get("default")) {
                    let fmt = |ns: f64| {
                        if ns > 1e6 { format!("{:.2} ms", ns / 1e6) } else { format!("{:.1} µs", ns / 1e3) }
                    };
                    println!(
                        "| {l} | {} | {} | {:.3} | {} | {:.2} |",
                        fmt(raw),
                        fmt(copy),
                        raw / copy,
                        fmt(def),
                        raw / def
                    );
                }
            }
        }
    }
}
