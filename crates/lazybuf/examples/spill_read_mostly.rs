//! The spilling benchmark: a read-mostly loop whose working set is twice the
//! device's memory budget, run on every device found whose copies hold device memory (the host
//! device's alias host memory and never spill), under four policies:
//!
//! - **in memory**: no budget, every copy stays on the device;
//! - **lazybuf**: the budget, with coherence-aware eviction (clean copies dropped for free);
//! - **write back always**: the budget, with every eviction downloading its copy, as a spiller
//!   that does not know which copy is current must ([`lazybuf::spill::EvictionPolicy`]);
//! - **floor**: the bytes that must move under the budget (a simulation of the same accesses
//!   with least-recently-used replacement: each access to a copy not resident uploads it, each
//!   eviction of a copy written on the device writes it back), and that many bytes over the
//!   bandwidth measured on the device.
//!
//! Each visit reads the buffer on the device (a kernel's read: `device()`), and one visit in
//! five writes it there (`device_mut()`, as a kernel that writes it). Managed memory (CUDA) is
//! not measured here: no GPU ran this. docs/SPILLING.md has the results.
//!
//! Run: `cargo run --release --example spill_read_mostly [--features wgpu]`.

use std::time::Instant;

use lazybuf::spill::{self, EvictionPolicy, SharedBuffer};
use lazybuf::{BufferOptions, Device, Result, UnifiedBuffer};

/// Buffers, and the copies the budget holds: the working set is twice the budget.
const BUFFERS: usize = 16;
const RESIDENT: usize = BUFFERS / 2;
/// 256 KiB per buffer (below the size a host-sharing OpenCL device aliases).
const LEN: usize = 64 * 1024;
const NBYTES: u64 = (LEN * 4) as u64;
const VISITS: usize = 2000;

/// The deterministic visit order and which visits write: a linear congruential sequence.
fn visits() -> Vec<(usize, bool)> {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    (0..VISITS)
        .map(|_| {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (((x >> 33) % BUFFERS as u64) as usize, (x >> 17).is_multiple_of(5))
        })
        .collect()
}

/// The floor in bytes: least-recently-used replacement of `RESIDENT` copies, uploads on misses
/// (the first touch of each buffer included) and write-backs of evicted device-written copies.
fn floor_bytes(order: &[(usize, bool)]) -> u64 {
    let (mut lru, mut dirty, mut bytes) = (Vec::<usize>::new(), [false; BUFFERS], 0);
    for &(b, write) in order {
        if let Some(i) = lru.iter().position(|&x| x == b) {
            lru.remove(i);
        } else {
            bytes += NBYTES;
            if lru.len() == RESIDENT {
                let victim = lru.remove(0);
                if std::mem::take(&mut dirty[victim]) {
                    bytes += NBYTES;
                }
            }
        }
        lru.push(b);
        dirty[b] |= write;
    }
    bytes
}

/// Runs the loop on `device` with `budget` (copies) and `policy`; returns bytes moved and seconds.
fn run(
    device: &Device,
    budget: Option<usize>,
    policy: EvictionPolicy,
    order: &[(usize, bool)],
) -> Result<(u64, f64)> {
    lazybuf::trim();
    spill::set_eviction_policy(policy);
    let held = spill::memory_held(device);
    spill::set_memory_limit(device, budget.map(|copies| held + copies as u64 * NBYTES + NBYTES / 2));
    let options = BufferOptions { device: Some(device.clone()), ..BufferOptions::default() };
    let bufs = (0..BUFFERS)
        .map(|i| {
            let mut buf = UnifiedBuffer::<f32>::with_options(&[LEN], options.clone())?;
            buf.host_overwrite()?.fill(i as f32);
            buf.reset_transfer_stats();
            Ok(SharedBuffer::new(buf))
        })
        .collect::<Result<Vec<_>>>()?;
    let start = Instant::now();
    for &(b, write) in order {
        let mut buf = bufs[b].lock();
        if write {
            buf.device_mut()?;
        } else {
            buf.device()?;
        }
    }
    device.synchronize()?;
    let seconds = start.elapsed().as_secs_f64();
    let bytes = bufs.iter().map(|b| b.lock().transfer_stats().bytes_moved()).sum();
    spill::set_memory_limit(device, None);
    spill::set_eviction_policy(EvictionPolicy::CoherenceAware);
    Ok((bytes, seconds))
}

/// Host-device bandwidth on `device` in bytes per second: uploads and downloads of one buffer.
fn bandwidth(device: &Device) -> Result<f64> {
    let mut buf = UnifiedBuffer::<f32>::on(&[LEN], device)?;
    buf.host_overwrite()?.fill(1.0);
    let start = Instant::now();
    for _ in 0..50 {
        buf.mark_host_dirty()?;
        buf.sync_to_device()?;
        buf.mark_device_dirty()?;
        buf.sync_to_host()?;
    }
    Ok(100.0 * NBYTES as f64 / start.elapsed().as_secs_f64())
}

fn main() -> Result<()> {
    let order = visits();
    let floor = floor_bytes(&order);
    println!(
        "{BUFFERS} buffers of {} KiB, budget {RESIDENT} copies, {VISITS} visits, 1 in 5 writes\n",
        NBYTES >> 10
    );
    println!("| device | policy | bytes moved | x floor | seconds |");
    println!("|---|---|---:|---:|---:|");
    for device in lazybuf::devices() {
        if device.is_zero_copy(LEN * 4) {
            println!("| {device} | (zero-copy: device copies hold no device memory, nothing spills) | | | |");
            continue;
        }
        let per_second = bandwidth(&device)?;
        let rows = [
            ("in memory", None, EvictionPolicy::CoherenceAware),
            ("lazybuf", Some(RESIDENT), EvictionPolicy::CoherenceAware),
            ("write back always", Some(RESIDENT), EvictionPolicy::WriteBackAlways),
        ];
        for (name, budget, policy) in rows {
            let (bytes, seconds) = run(&device, budget, policy, &order)?;
            let ratio = bytes as f64 / floor as f64;
            println!("| {device} | {name} | {bytes} | {ratio:.3} | {seconds:.3} |");
        }
        println!("| {device} | floor | {floor} | 1.000 | {:.3} |", floor as f64 / per_second);
    }
    Ok(())
}
