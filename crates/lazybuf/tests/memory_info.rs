//! Memory monitoring: `memory_info()` on every device says where its figure comes from, and
//! free memory drops by about the size of an allocation where the figure is real.
//!
//! - OpenCL has no free-memory query; its figure is total minus what this process holds on the
//!   device, so it moves by exactly an allocation's size (this file is the only OpenCL user in
//!   its process, so nothing else moves it).
//! - The host reports the system's available memory (`MemAvailable`), which is real but
//!   moved by other processes, and which does not count pages waiting on the kernel's per-CPU
//!   free lists: memory this process freed a moment ago is handed out again from those lists
//!   without `MemAvailable` moving at all (measured here on Linux 6.18: a 256 MiB allocation
//!   right after freeing 256 MiB moved it by 0). So the test keeps every buffer it touches
//!   alive, making each new 256 MiB come from the free pool proper, and accepts the first
//!   drop within a quarter of 256 MiB, over up to ten tries. Other processes' allocations in
//!   the moment between the two readings move it too (a build beside the tests made six tries
//!   in a row drop by 370 to 430 MiB, 2026-11-28): the tests of this file take turns
//!   ([`serial`]) so none of them moves it, and the retries absorb the rest.
//! - CUDA asks the driver (`cuMemGetInfo`); its test lives with the CUDA backend.
//! - wgpu: Vulkan's memory budget where the driver has `VK_EXT_memory_budget`, else total
//!   minus what this process holds (lavapipe); its test lives in `wgpu.rs`.

use std::sync::{Mutex, MutexGuard};

use lazybuf::{Device, MemorySource, UnifiedBuffer};

/// The tests of this file one at a time: each reads figures the others' allocations move.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[test]
fn every_device_reports_free_and_total_memory() {
    let _serial = serial();
    for device in lazybuf::devices() {
        let info = device.memory_info().unwrap();
        assert!(info.total > 0, "{device}: {info:?}");
        assert!(info.free <= info.total, "{device}: {info:?}");
        assert_eq!(info.total, device.info().total_memory, "{device}: {info:?}");
        let expected: &[MemorySource] = match device.backend_kind() {
            lazybuf::BackendKind::HOST => &[MemorySource::System],
            lazybuf::BackendKind::OPENCL => &[MemorySource::TotalMinusProcessHeld],
            lazybuf::BackendKind::CUDA => &[MemorySource::Runtime],
            // Vulkan's memory budget where the driver has it, else total minus held; the
            // system's figures for unified memory without a Vulkan figure.
            #[cfg(feature = "wgpu")]
            lazybuf::BackendKind::WGPU => {
                &[MemorySource::Runtime, MemorySource::TotalMinusProcessHeld, MemorySource::System]
            }
            // Its capacity minus what it holds.
            #[cfg(feature = "loopback")]
            lazybuf::BackendKind::LOOPBACK => &[MemorySource::TotalMinusProcessHeld],
            other => panic!("a backend this test does not know: {other}"),
        };
        assert!(expected.contains(&info.source), "{device}: {info:?}");
    }
}

#[test]
fn host_free_memory_drops_by_a_touched_allocation() {
    let _serial = serial();
    const N: usize = 256 << 20;
    let host = Device::host();
    let (mut drops, mut kept) = (Vec::new(), Vec::new());
    for _ in 0..10 {
        let before = host.memory_info().unwrap().free as i64;
        let mut buf = UnifiedBuffer::<u8>::on(&[N], &host).unwrap();
        buf.host_overwrite().unwrap().fill(1); // the kernel hands out pages at first touch
        let drop_ = before - host.memory_info().unwrap().free as i64;
        kept.push(buf);
        if (drop_ - N as i64).abs() <= N as i64 / 4 {
            return;
        }
        drops.push(drop_);
    }
    panic!("free memory never dropped by about {N} bytes; drops seen: {drops:?}");
}

#[cfg(feature = "opencl")]
mod opencl {
    use super::*;
    use lazybuf::{MemoryPool, PoolConfig};

    fn device() -> Device {
        lazybuf::devices()
            .into_iter()
            .find(|d| d.backend_kind() == lazybuf::BackendKind::OPENCL)
            .expect("this test needs an OpenCL device (CI installs Debian's pocl-opencl-icd)")
    }

    fn free(device: &Device) -> u64 {
        device.memory_info().unwrap().free
    }

    /// One test, so no other allocation in this process moves the OpenCL figure meanwhile.
    #[test]
    fn opencl_free_memory_drops_by_each_allocation_and_the_pool_holds_it() {
        let _serial = serial();
        let device = device();
        let before = free(&device);
        // Device memory proper (4 KiB), and a 64 MiB buffer the CPU device aliases, straight
        // from the device: freed when the buffer goes.
        for n in [4096, 64 << 20] {
            let options = lazybuf::BufferOptions {
                device: Some(device.clone()),
                resource: Some(lazybuf::DirectResource::shared()),
                ..Default::default()
            };
            let mut buf = UnifiedBuffer::<u8>::with_options(&[n], options).unwrap();
            buf.device_overwrite().unwrap();
            assert_eq!(before - free(&device), n as u64, "{n} bytes on {device}");
            drop(buf);
            assert_eq!(free(&device), before);
        }

        // Caching by default: a buffer's device memory stays with the device's pool when the
        // buffer goes, and memory_info says so, until lazybuf::trim gives it back.
        let mut buf = UnifiedBuffer::<u8>::on(&[4096], &device).unwrap();
        buf.device_overwrite().unwrap();
        drop(buf);
        let info = device.memory_info().unwrap();
        assert_eq!((before - info.free, info.cached), (4096, 4096), "{info:?}");
        assert!(lazybuf::trim() >= 4096);
        let info = device.memory_info().unwrap();
        assert_eq!((info.free, info.cached), (before, 0), "{info:?}");

        // A pool keeps released device memory, so the device figure stays down by what the
        // pool caches on it until trim gives it back.
        let pool = MemoryPool::new(&device, PoolConfig::default());
        let mut buf = pool.acquire::<u8>(&[4000], false).unwrap();
        buf.device_overwrite().unwrap();
        assert_eq!(before - free(&device), 4096, "a block of the size class");
        assert_eq!(pool.stats().bytes_in_use, 4096);
        pool.release(buf).unwrap();
        assert_eq!(before - free(&device), 4096);
        assert!(pool.stats().bytes_cached >= 4096);
        pool.trim();
        assert_eq!(free(&device), before);
    }
}
