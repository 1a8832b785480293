//! Host-to-device and device-to-host bandwidth of `UnifiedBuffer<u8>` syncs on the first CUDA
//! device, pageable and pinned, from 1 KiB to 1 GiB, against raw cudarc copies of the same
//! bytes on the same stream in the same run; prints the ratios at the end.
//!
//! Each lazybuf iteration marks the other side stale (no copy) and syncs: exactly one copy.
//! Each raw iteration is `cuMemcpy{HtoD,DtoH}Async` + `cuStreamSynchronize` through cudarc's
//! result layer, from pinned memory (`cuMemHostAlloc`, portable) or a pre-touched `Vec`.
//! `lazybuf_pageable` syncs one buffer again and again: from its second transfer its host
//! block is registered with the driver (see `backend/cuda/device.rs`); `lazybuf_pageable_first`
//! times only the first sync of a fresh host block (staged through pinned chunks), each
//! iteration with a new buffer.
//! Goals on a GPU, for 64 MiB and more: pinned syncs >= 0.95 of the raw pinned copy;
//! repeated pageable syncs >= 0.8 of the raw pinned copy; the first pageable sync no slower
//! than before (it is the staged path it always was; compare `page1/raw-page` across runs).
//!
//! `cargo bench -p lazybuf --bench cuda_bandwidth` (`LAZYBUF_BENCH_MAX_BYTES` lowers the top
//! size). Without a CUDA device it says so and exits. Through the test double
//! (LD_LIBRARY_PATH=target/cuda-double) it runs, but measures host memcpy, not a GPU.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use cudarc::driver::{result, sys};
use lazybuf::backend::RawDevice;
use lazybuf::{BackendKind, BufferOptions, Device, DirectResource, UnifiedBuffer};

/// (direction, variant, bytes) -> (total time, iterations), over every measured call.
type Totals = RefCell<BTreeMap<(&'static str, &'static str, usize), (Duration, u64)>>;

const VARIANTS: [&str; 5] =
    ["lazybuf_pinned", "raw_pinned", "lazybuf_pageable", "raw_pageable", "lazybuf_pageable_first"];

struct Raw {
    stream: sys::CUstream,
    device: sys::CUdeviceptr,
    pinned: *mut u8,
    pageable: Vec<u8>,
    len: usize,
}

impl Raw {
    fn new(device: &Device, len: usize) -> Raw {
        // SAFETY: the device lives for the whole run; its handles are only borrowed.
        let RawDevice::Cuda { context, stream } = (unsafe { device.raw() }) else { unreachable!() };
        // SAFETY: binding lazybuf's live context on this thread, as lazybuf itself does.
        unsafe { result::ctx::set_current(context.cast()) }.unwrap();
        // SAFETY: sizes are non-zero; both blocks are freed in Drop.
        let (device, pinned) = unsafe {
            (
                result::malloc_sync(len).unwrap(),
                result::malloc_host(len, sys::CU_MEMHOSTALLOC_PORTABLE).unwrap().cast::<u8>(),
            )
        };
        // SAFETY: pinned holds len bytes; touching them now keeps page faults out of timings.
        unsafe { std::ptr::write_bytes(pinned, 1, len) };
        Raw { stream: stream.cast(), device, pinned, pageable: vec![1; len], len }
    }

    fn copy(&mut self, direction: &str, pinned: bool) {
        // SAFETY: both sides hold len bytes and stay alive until the stream is synchronized.
        unsafe {
            let host = if pinned { self.pinned } else { self.pageable.as_mut_ptr() };
            let host = std::slice::from_raw_parts_mut(host, self.len);
            if direction == "h2d" {
                result::memcpy_htod_async(self.device, &*host, self.stream).unwrap();
            } else {
                result::memcpy_dtoh_async(host, self.device, self.stream).unwrap();
            }
            result::stream::synchronize(self.stream).unwrap();
        }
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        // SAFETY: allocated in `new`, freed once, no copy in flight.
        unsafe {
            result::free_sync(self.device).unwrap();
            result::free_host(self.pinned.cast()).unwrap();
        }
    }
}

fn buffer(device: &Device, len: usize, pinned: bool) -> UnifiedBuffer<u8> {
    let options = BufferOptions { device: Some(device.clone()), pinned, ..Default::default() };
    let mut buf = UnifiedBuffer::with_options(&[len], options).unwrap();
    buf.host_overwrite().unwrap().fill(1); // touches every host page
    buf.sync_to_device().unwrap(); // allocates the device copy
    buf
}

/// A buffer with a fresh host block that has never been transferred, whose other side is
/// stale: the next sync in `direction` is that block's first transfer.
fn fresh(device: &Device, len: usize, direction: &str) -> UnifiedBuffer<u8> {
    let options = BufferOptions {
        device: Some(device.clone()),
        resource: Some(DirectResource::shared()),
        ..Default::default()
    };
    let mut buf = UnifiedBuffer::with_options(&[len], options).unwrap();
    if direction == "h2d" {
        buf.device_overwrite().map(drop).unwrap();
        buf.host_overwrite().unwrap().fill(1);
    } else {
        buf.host_overwrite().unwrap().fill(1);
        buf.device_overwrite().map(drop).unwrap();
    }
    buf
}

fn sync(buf: &mut UnifiedBuffer<u8>, direction: &str) {
    if direction == "h2d" {
        buf.mark_host_dirty().unwrap();
        buf.sync_to_device().unwrap();
    } else {
        buf.mark_device_dirty().unwrap();
        buf.sync_to_host().unwrap();
    }
}

fn bench_size(c: &mut Criterion, device: &Device, len: usize, totals: &Totals) {
    let mut raw = Raw::new(device, len);
    let mut pinned = buffer(device, len, true);
    let mut pageable = buffer(device, len, false);
    assert!(pinned.is_pinned() && !pageable.is_pinned());
    for direction in ["h2d", "d2h"] {
        let mut group = c.benchmark_group(format!("cuda_{direction}"));
        group.throughput(Throughput::Bytes(len as u64));
        if len >= 64 << 20 {
            group.sample_size(10).warm_up_time(Duration::from_millis(300));
        }
        for variant in VARIANTS {
            let mut run = |iters: u64| {
                let mut elapsed = Duration::ZERO;
                if variant == "lazybuf_pageable_first" {
                    for _ in 0..iters {
                        let mut buf = fresh(device, len, direction);
                        let start = Instant::now();
                        if direction == "h2d" { buf.sync_to_device() } else { buf.sync_to_host() }.unwrap();
                        elapsed += start.elapsed();
                    }
                } else {
                    let start = Instant::now();
                    for _ in 0..iters {
                        match variant {
                            "lazybuf_pinned" => sync(&mut pinned, direction),
                            "lazybuf_pageable" => sync(&mut pageable, direction),
                            "raw_pinned" => raw.copy(direction, true),
                            _ => raw.copy(direction, false),
                        }
                    }
                    elapsed = start.elapsed();
                }
                let mut totals = totals.borrow_mut();
                let entry = totals.entry((direction, variant, len)).or_default();
                *entry = (entry.0 + elapsed, entry.1 + iters);
                elapsed
            };
            group.bench_function(BenchmarkId::new(variant, len), |b| b.iter_custom(&mut run));
        }
        group.finish();
    }
}

fn report(totals: &Totals) {
    let totals = totals.borrow();
    let rate = |direction, variant, len: usize| {
        totals.get(&(direction, variant, len)).map(|(t, n)| len as f64 * *n as f64 / t.as_secs_f64() / 1e9)
    };
    let sizes: Vec<usize> =
        totals.keys().map(|k| k.2).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
    println!("\nGB/s (mean over every timed call) and ratios; goals apply from 64 MiB:");
    println!(
        "{:>4} {:>10} {:>8} {:>8} {:>8} {:>8} {:>8}   {:>13} {:>14} {:>15} {:>15}",
        "dir",
        "bytes",
        "lb-pin",
        "raw-pin",
        "lb-page",
        "raw-page",
        "lb-page1",
        "pin/raw-pin",
        "page/raw-pin",
        "page/raw-page",
        "page1/raw-page"
    );
    for direction in ["h2d", "d2h"] {
        for &len in &sizes {
            let r: Vec<f64> = VARIANTS.iter().map(|v| rate(direction, v, len).unwrap_or(f64::NAN)).collect();
            let (pin, page) = (r[0] / r[1], r[2] / r[1]);
            let verdict = |ratio: f64, goal: f64| {
                if len < 64 << 20 {
                    ""
                } else if ratio >= goal {
                    " ok"
                } else {
                    " MISSED"
                }
            };
            println!(
                "{direction:>4} {len:>10} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2}   {pin:>10.3}{:<3} {page:>11.3}{:<3} {:>15.3} {:>15.3}",
                r[0],
                r[1],
                r[2],
                r[3],
                r[4],
                verdict(pin, 0.95),
                verdict(page, 0.8),
                r[2] / r[3],
                r[4] / r[3]
            );
        }
    }
}

fn main() {
    let Some(device) = lazybuf::devices().into_iter().find(|d| d.backend_kind() == BackendKind::CUDA) else {
        let why = lazybuf::backend_status()
            .into_iter()
            .find(|s| s.backend == BackendKind::CUDA)
            .and_then(|s| s.devices.err())
            .unwrap_or_else(|| "no CUDA device".into());
        println!("cuda_bandwidth: nothing to measure, CUDA is unavailable: {why}");
        return;
    };
    if device.name().starts_with("lazybuf CUDA test double") {
        println!(
            "cuda_bandwidth: {} is the CUDA TEST DOUBLE: these numbers are host memcpy, not a GPU",
            device.name()
        );
    }
    let max: usize =
        std::env::var("LAZYBUF_BENCH_MAX_BYTES").ok().and_then(|v| v.parse().ok()).unwrap_or(1 << 30);
    let mut c = Criterion::default().measurement_time(Duration::from_secs(2)).configure_from_args();
    let totals = Totals::default();
    let mut len = 1 << 10;
    while len <= max {
        bench_size(&mut c, &device, len, &totals);
        len *= 4;
    }
    c.final_summary();
    println!("device: {}", device);
    report(&totals);
}
