//! The real-GPU suite: checks that only mean something on NVIDIA hardware (what the driver
//! reports, cuMemGetInfo against real allocations, transfers of hundreds of MiB, peer copies
//! between GPUs). With no GPU, or with the driver-API test double, each test prints a visible
//! skip. The rest of the CUDA tests (`tests/suite/cuda.rs`, the backend's unit tests) run on a GPU
//! as they are; bandwidth is measured by `benches/cuda_bandwidth.rs`, not here.

#![cfg(feature = "cuda")]

mod cuda_common;

use std::sync::{Mutex, MutexGuard};

use cuda_common::{cuda_devices, is_double, ramp};
use lazybuf::{BufferOptions, Device, MemorySource, UnifiedBuffer};

/// The tests measure the GPU's free memory, so they run one at a time.
static LOCK: Mutex<()> = Mutex::new(());

fn one_at_a_time() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn gpus(test: &str) -> Vec<Device> {
    let Some(devices) = cuda_devices(test) else { return Vec::new() };
    if devices.iter().any(is_double) {
        eprintln!("SKIPPED {test}: the CUDA devices are the lazybuf test double, not a GPU");
        return Vec::new();
    }
    devices
}

#[test]
fn gpus_report_what_the_hardware_is() {
    let _one = one_at_a_time();
    for gpu in gpus("gpus_report_what_the_hardware_is") {
        let info = gpu.info();
        assert!(info.is_gpu && info.total_memory >= 1 << 30, "{info:?}");
        let (major, minor) = gpu.info().compute_capability.unwrap();
        assert!((major, minor) >= (3, 5), "compute capability {major}.{minor}");
        let memory = gpu.memory_info().unwrap();
        assert_eq!(memory.source, MemorySource::Runtime);
        assert!(memory.free < memory.total && memory.total == info.total_memory);
        eprintln!("GPU {}: compute capability {major}.{minor}, {:?}", info.name, memory);
    }
}

#[test]
fn free_memory_drops_by_what_a_buffer_allocates() {
    const N: usize = 256 << 20;
    const SLACK: u64 = 64 << 20;
    let _one = one_at_a_time();
    for gpu in gpus("free_memory_drops_by_what_a_buffer_allocates") {
        lazybuf::trim();
        let before = gpu.memory_info().unwrap().free;
        let mut buf = UnifiedBuffer::<u8>::on(&[N], &gpu).unwrap();
        buf.device_overwrite().map(drop).unwrap();
        let during = gpu.memory_info().unwrap().free;
        // The driver rounds to its page size; other processes may allocate meanwhile.
        let dropped = before.saturating_sub(during);
        assert!(dropped >= N as u64 && dropped <= N as u64 + SLACK, "free dropped by {dropped}");
        drop(buf);
        // Caching by default: the block is kept for the next buffer, allocated as far as the
        // driver knows and reported as cached; a trim gives it back. With caching off
        // (LAZYBUF_CACHE=0, as under compute-sanitizer) it is freed at once.
        let after = gpu.memory_info().unwrap();
        let expected_cached = if lazybuf::resource::caching() { N as u64 } else { 0 };
        assert!(after.cached >= expected_cached, "{after:?}");
        assert!(after.free + after.cached >= during + N as u64 - SLACK, "{after:?}");
        lazybuf::trim();
        let trimmed = gpu.memory_info().unwrap();
        assert!(trimmed.free >= during + N as u64 - SLACK && trimmed.cached == 0, "{trimmed:?}");
    }
}

#[test]
fn hundreds_of_mib_round_trip_pageable_and_pinned() {
    const N: usize = (384 << 20) + 11;
    let _one = one_at_a_time();
    let gpus = gpus("hundreds_of_mib_round_trip_pageable_and_pinned");
    let data = if gpus.is_empty() { Vec::new() } else { ramp(N) };
    for gpu in gpus {
        for pinned in [false, true] {
            let options = BufferOptions { device: Some(gpu.clone()), pinned, ..Default::default() };
            let mut buf = UnifiedBuffer::<u8>::with_options(&[N], options).unwrap();
            buf.copy_from(&data).unwrap();
            buf.sync_to_device().unwrap();
            buf.fill(0).unwrap(); // on the GPU
            assert!(buf.host().unwrap().iter().all(|&b| b == 0));
            buf.copy_from(&data).unwrap();
            buf.sync_to_device().unwrap();
            buf.mark_device_dirty().unwrap();
            assert!(buf.host().unwrap() == &data[..], "pinned: {pinned}");
            // Pinned from the start, or pageable and registered with the driver at its second
            // transfer (REGISTER_MIN_BYTES and up).
            assert!(buf.is_pinned(), "pinned: {pinned}");
        }
    }
}

#[test]
fn buffers_move_between_gpus() {
    let gpus = gpus("buffers_move_between_gpus");
    let [first, second, ..] = &gpus[..] else {
        if !gpus.is_empty() {
            eprintln!("SKIPPED buffers_move_between_gpus: needs two GPUs");
        }
        return;
    };
    let data = ramp(64 << 20);
    let mut buf = UnifiedBuffer::from_slice(&data, first).unwrap();
    buf.device_mut().map(drop).unwrap();
    buf.sync_to(second).unwrap();
    eprintln!("GPU to GPU: {:?}", buf.transfer_stats());
    buf.mark_dirty_on(second).unwrap();
    assert!(buf.to_vec().unwrap() == data);
}
