//! sync_to_device / sync_to_host against raw wgpu transfers of the same bytes, in one run, on
//! every wgpu device (Mesa's lavapipe here), 1 KiB to 256 MiB.
//!
//! Variants per size and direction:
//! - `raw`: to the device, `Queue::write_buffer` of a pre-touched host vector into a storage
//!   buffer, submitted and waited for; to the host, a copy into a `MAP_READ` staging buffer
//!   (made once, reused), `map_async`, a wait, and a copy out of the mapping into the host
//!   vector; on lazybuf's own device and queue;
//! - `lazybuf`: lazybuf's sync as it runs by default, of a buffer whose host and device memory
//!   are allocated and touched before measuring (each iteration first marks the other side
//!   dirty, a state change, so the sync really moves the bytes); on a host-sharing adapter with
//!   `MAPPABLE_PRIMARY_BUFFERS` (lavapipe) that maps the storage buffer itself;
//! - `staging`: the same on the adapter opened with `WgpuOptions { mapped_transfers: false }`,
//!   the staging-buffer path every other adapter takes;
//! - `mapped`: the raw counterpart of lazybuf's default path where the adapter allows it: on a
//!   device opened with `MAPPABLE_PRIMARY_BUFFERS`, the storage buffer itself is mapped
//!   (`map_async`, a wait, a copy, `unmap`).
//!
//! After the measurements the bench prints, for each size, raw time / variant time: 1.0 means
//! the same speed, above 1 faster than raw.
//!
//! Run: `cargo bench -p lazybuf --features wgpu --bench wgpu_sync` (`LAZYBUF_BENCH_MAX_MIB=16`
//! to stop early).

use std::path::{Path, PathBuf};
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput};
use lazybuf::backend::RawDevice;
use lazybuf::backend::wgpu::{WgpuBackend, WgpuOptions, wgpu};
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

/// Runs a future to completion on this thread (wgpu's are ready at once, or after a poll).
fn block_on<F: std::future::Future>(future: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(std::sync::Arc::new(Unpark(std::thread::current())));
    let mut context = std::task::Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        if let std::task::Poll::Ready(output) = future.as_mut().poll(&mut context) {
            return output;
        }
        std::thread::park();
    }
}

fn wait(device: &wgpu::Device) {
    device.poll(wgpu::PollType::wait_indefinitely()).expect("poll");
}

/// Raw wgpu transfers on a device and queue: a storage buffer and a reused read-back buffer.
struct Raw<'a> {
    device: &'a wgpu::Device,
    queue: &'a wgpu::Queue,
    storage: wgpu::Buffer,
    readback: wgpu::Buffer,
}

impl<'a> Raw<'a> {
    fn new(device: &'a wgpu::Device, queue: &'a wgpu::Queue, bytes: usize) -> Raw<'a> {
        let storage = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("raw storage"),
            size: bytes as u64,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let readback = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("raw readback"),
            size: bytes as u64,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        Raw { device, queue, storage, readback }
    }

    fn write(&self, src: &[u8]) {
        self.queue.write_buffer(&self.storage, 0, src);
        self.queue.submit([]);
        wait(self.device);
    }

    fn read(&self, dst: &mut [u8]) {
        let mut encoder = self.device.create_command_encoder(&Default::default());
        encoder.copy_buffer_to_buffer(&self.storage, 0, &self.readback, 0, dst.len() as u64);
        self.queue.submit([encoder.finish()]);
        self.readback.map_async(wgpu::MapMode::Read, .., |r| r.expect("map"));
        wait(self.device);
        dst.copy_from_slice(&self.readback.get_mapped_range(..).expect("mapped"));
        self.readback.unmap();
    }
}

/// A device of the same adapter with `MAPPABLE_PRIMARY_BUFFERS`, where storage buffers can be
/// mapped themselves.
fn mappable_device(name: &str) -> Option<(wgpu::Device, wgpu::Queue)> {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle());
    let adapters = block_on(instance.enumerate_adapters(wgpu::Backends::all()));
    let adapter = adapters.into_iter().find(|a| a.get_info().name == name)?;
    if !adapter.features().contains(wgpu::Features::MAPPABLE_PRIMARY_BUFFERS) {
        return None;
    }
    let descriptor = wgpu::DeviceDescriptor {
        required_features: wgpu::Features::MAPPABLE_PRIMARY_BUFFERS,
        required_limits: adapter.limits(),
        ..Default::default()
    };
    block_on(adapter.request_device(&descriptor)).ok()
}

/// The storage buffer mapped directly: a copy between it and the host vector, no staging.
struct Mapped<'a> {
    device: &'a wgpu::Device,
    storage: wgpu::Buffer,
}

impl<'a> Mapped<'a> {
    fn new(device: &'a wgpu::Device, bytes: usize) -> Mapped<'a> {
        let storage = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("mappable storage"),
            size: bytes as u64,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::MAP_WRITE,
            mapped_at_creation: false,
        });
        Mapped { device, storage }
    }

    fn write(&self, src: &[u8]) {
        self.storage.map_async(wgpu::MapMode::Write, .., |r| r.expect("map"));
        wait(self.device);
        self.storage.get_mapped_range_mut(..).expect("mapped").copy_from_slice(src);
        self.storage.unmap();
    }

    fn read(&self, dst: &mut [u8]) {
        self.storage.map_async(wgpu::MapMode::Read, .., |r| r.expect("map"));
        wait(self.device);
        dst.copy_from_slice(&self.storage.get_mapped_range(..).expect("mapped"));
        self.storage.unmap();
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

/// The same adapter opened with staging transfers (`None` where that is already the default).
fn staging_twin(device: &Device) -> Option<Device> {
    let backend = device.backend_as::<WgpuBackend>()?;
    if !backend.maps_for_transfers() {
        return None;
    }
    let twin =
        WgpuBackend::open_with(backend.adapter().clone(), WgpuOptions { mapped_transfers: false }).ok()?;
    Some(Device::open(twin))
}

fn bench_device(c: &mut Criterion, name: &str, device: &Device) -> Vec<String> {
    // SAFETY: (bench) lazybuf's device and queue stay valid while `device` lives.
    let RawDevice::Wgpu { device: gpu, queue } = (unsafe { device.raw() }) else { unreachable!() };
    // SAFETY: (bench) the pointers come from the live device, as above.
    let (gpu, queue) = unsafe { (&*gpu, &*queue) };
    let mappable = mappable_device(device.name());
    let staging = staging_twin(device);
    let mut groups = Vec::new();
    for (direction, to_device) in [("to_device", true), ("to_host", false)] {
        let group_name = format!("wgpu_sync_{direction}/{name}");
        let mut group = c.benchmark_group(&group_name);
        group
            .sample_size(20)
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(3));
        for bytes in sizes() {
            group.throughput(Throughput::Bytes(bytes as u64));
            let mut host = vec![7u8; bytes];
            {
                let raw = Raw::new(gpu, queue, bytes);
                raw.write(&host);
                raw.read(&mut host);
                group.bench_function(BenchmarkId::new("raw", label(bytes)), |b| {
                    if to_device { b.iter(|| raw.write(&host)) } else { b.iter(|| raw.read(&mut host)) }
                });
            }
            for (variant, device) in [("lazybuf", Some(device)), ("staging", staging.as_ref())] {
                let Some(device) = device else { continue };
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
            if let Some((mgpu, _)) = &mappable {
                let mapped = Mapped::new(mgpu, bytes);
                mapped.write(&host);
                mapped.read(&mut host);
                group.bench_function(BenchmarkId::new("mapped", label(bytes)), |b| {
                    if to_device { b.iter(|| mapped.write(&host)) } else { b.iter(|| mapped.read(&mut host)) }
                });
            }
        }
        group.finish();
        groups.push(group_name);
    }
    groups
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
    let devices: Vec<Device> =
        lazybuf::devices().into_iter().filter(|d| d.backend_kind() == BackendKind::WGPU).collect();
    if devices.is_empty() {
        println!("wgpu_sync: no wgpu device ({:?}); nothing to measure", lazybuf::backend_status());
        return;
    }
    let mut report = Vec::new();
    for (i, device) in devices.iter().enumerate() {
        report.push((device.name().to_string(), bench_device(&mut c, &format!("dev{i}"), device)));
    }
    c.final_summary();

    println!("\nRatio raw time / variant time (1.00 = raw speed; higher is faster than raw):");
    let fmt = |ns: f64| if ns > 1e6 { format!("{:.2} ms", ns / 1e6) } else { format!("{:.1} µs", ns / 1e3) };
    for (device, groups) in report {
        for group in groups {
            println!(
                "\n{device}: {group}\n\n| size | raw | lazybuf | ratio | staging path | ratio | raw mapped | ratio |\n|---|---|---|---|---|---|---|---|"
            );
            for bytes in sizes() {
                let l = label(bytes);
                let get = |f: &str| median_ns(&out, &group, f, &l);
                let (Some(raw), Some(lazy)) = (get("raw"), get("lazybuf")) else { continue };
                let other = |f: &str| {
                    get(f).map_or_else(|| "n/a | n/a".to_string(), |t| format!("{} | {:.3}", fmt(t), raw / t))
                };
                let (staging, mapped) = (other("staging"), other("mapped"));
                println!("| {l} | {} | {} | {:.3} | {staging} | {mapped} |", fmt(raw), fmt(lazy), raw / lazy);
            }
        }
    }
}
