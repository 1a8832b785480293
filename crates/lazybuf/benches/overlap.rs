//! The seeds' double-buffering loop, measured: while buffer A's transfer is in flight
//! (`sync_to_device_async`), the host fills buffer B; then they swap. With real overlap the
//! loop takes about the larger of the total transfer time and the total host work; without
//! it, their sum. Printed per device and size: the three totals and
//! `loop / max(transfers, host work)` (goal on a GPU: <= 1.1) next to
//! `(transfers + host work) / max` (what no overlap at all would give).
//!
//! Run: `cargo bench -p lazybuf --bench overlap` (all devices found: the host, PoCL, CUDA
//! when a driver or the test double is loaded; `LAZYBUF_BENCH_SIZES_MIB=1,16,64` and
//! `LAZYBUF_BENCH_ROUNDS=20` to change the sizes and rounds). Timings are medians of 5 repeats.

use std::hint::black_box;
use std::time::{Duration, Instant};

use lazybuf::{BufferOptions, Device, UnifiedBuffer};

fn sizes() -> Vec<usize> {
    std::env::var("LAZYBUF_BENCH_SIZES_MIB")
        .ok()
        .map(|v| v.split(',').filter_map(|s| s.trim().parse::<usize>().ok()).collect())
        .unwrap_or_else(|| vec![1, 16, 64])
        .into_iter()
        .map(|mib| mib << 20)
        .collect()
}

fn rounds() -> usize {
    std::env::var("LAZYBUF_BENCH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(20)
}

/// The host work of one round: writing every element of the next batch.
fn fill(buf: &mut UnifiedBuffer<f32>, round: usize) {
    let host = buf.host_overwrite().unwrap();
    let base = round as f32;
    for (i, x) in host.iter_mut().enumerate() {
        *x = base + (i & 1023) as f32 * 0.5;
    }
    black_box(host.as_ptr());
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn repeat(f: impl FnMut() -> Duration) -> Duration {
    let mut f = f;
    median((0..5).map(|_| f()).collect())
}

fn buffers(device: &Device, bytes: usize) -> (UnifiedBuffer<f32>, UnifiedBuffer<f32>) {
    let make = || {
        let options =
            BufferOptions { device: Some(device.clone()), pinned: true, ..BufferOptions::default() };
        let mut buf = UnifiedBuffer::<f32>::with_options(&[bytes / 4], options)
            .or_else(|_| UnifiedBuffer::<f32>::on(&[bytes / 4], device))
            .unwrap();
        fill(&mut buf, 0);
        buf.sync_to_device().unwrap();
        buf
    };
    (make(), make())
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let n = rounds();
    println!("| device | size | transfers | host work | loop | loop / max | sum / max |");
    println!("|---|---|---|---|---|---|---|");
    for device in lazybuf::devices() {
        for bytes in sizes() {
            let (mut a, mut b) = buffers(&device, bytes);
            let transfers = repeat(|| {
                let start = Instant::now();
                for _ in 0..n {
                    a.mark_host_dirty().unwrap();
                    a.sync_to_device().unwrap();
                }
                start.elapsed()
            });
            let host_work = repeat(|| {
                let start = Instant::now();
                for round in 0..n {
                    fill(&mut b, round);
                }
                start.elapsed()
            });
            let looped = repeat(|| {
                let start = Instant::now();
                for round in 0..n {
                    // A is full: send it; fill B meanwhile; wait for A; swap.
                    let transfer = a.sync_to_device_async().unwrap();
                    fill(&mut b, round);
                    transfer.wait().unwrap();
                    a.finish().unwrap();
                    std::mem::swap(&mut a, &mut b);
                }
                start.elapsed()
            });
            let longest = transfers.max(host_work).as_secs_f64();
            println!(
                "| {} | {} MiB | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} | {:.2} |",
                device.name(),
                bytes >> 20,
                transfers.as_secs_f64() * 1e3,
                host_work.as_secs_f64() * 1e3,
                looped.as_secs_f64() * 1e3,
                looped.as_secs_f64() / longest,
                (transfers + host_work).as_secs_f64() / longest,
            );
        }
    }
}
