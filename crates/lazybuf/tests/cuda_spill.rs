//! Spilling on out-of-memory without a budget, through the CUDA driver-API
//! test double, whose next allocation can be made to report `CUDA_ERROR_OUT_OF_MEMORY`: with
//! an evictable device copy lazybuf evicts it and retries once; with none the runtime's error
//! stands and nothing changed.
//!
//! The double's hooks are process-wide, so each test holds [`LOCK`]; this file must run with
//! the double (`scripts/test-cuda-double.sh --test cuda_spill`); on a real GPU it prints a skip.

#![cfg(feature = "cuda")]

mod cuda_common;

use std::sync::{Mutex, MutexGuard};

use cuda_common::{double_devices, fail_allocation, ramp};
use lazybuf::spill::{self, SharedBuffer};
use lazybuf::{BufferOptions, BufferState, Device, DirectResource, UnifiedBuffer};

static LOCK: Mutex<()> = Mutex::new(());

const N: usize = 1 << 16;

fn setup(test: &str) -> Option<(Vec<Device>, MutexGuard<'static, ()>)> {
    let devices = double_devices(test)?;
    let guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    fail_allocation(0);
    lazybuf::trim();
    Some((devices, guard))
}

/// A shared buffer holding `ramp(N)` on the host, memory straight from the device.
fn holding(device: &Device, spillable: bool) -> SharedBuffer<u8> {
    let options = BufferOptions {
        device: Some(device.clone()),
        resource: Some(DirectResource::shared()),
        ..Default::default()
    };
    let mut buf = UnifiedBuffer::with_options(&[N], options).unwrap();
    buf.copy_from(&ramp(N)).unwrap();
    SharedBuffer::with_spillable(buf, spillable)
}

#[test]
fn out_of_memory_evicts_and_retries_once() {
    let Some((devices, _lock)) = setup("out_of_memory_evicts_and_retries_once") else { return };
    for device in devices {
        assert_eq!(spill::memory_limit(&device).unwrap(), None);
        spill::reset_spill_stats(&device);
        let old = holding(&device, true);
        {
            let mut old = old.lock();
            old.device_overwrite()
                .unwrap()
                .write_from(&ramp(N).iter().map(|b| b ^ 0x5a).collect::<Vec<_>>())
                .unwrap();
        }
        let new = holding(&device, true);
        fail_allocation(1);
        new.lock().sync_to_device().unwrap();
        // The old copy held the only current data: written back, then freed.
        let mut old = old.lock();
        assert_eq!(old.state(), BufferState::HostOnly);
        assert_eq!(old.host().unwrap(), ramp(N).iter().map(|b| b ^ 0x5a).collect::<Vec<_>>());
        assert_eq!(new.lock().state(), BufferState::Synchronized);
        let stats = spill::spill_stats(&device);
        assert_eq!((stats.evictions, stats.bytes_written_back), (1, N as u64));
    }
}

#[test]
fn out_of_memory_with_nothing_to_evict_is_the_runtimes_error() {
    let Some((devices, _lock)) = setup("out_of_memory_with_nothing_to_evict_is_the_runtimes_error") else {
        return;
    };
    for device in devices {
        spill::reset_spill_stats(&device);
        let pinned_down = holding(&device, false);
        pinned_down.lock().sync_to_device().unwrap();
        let new = holding(&device, true);
        fail_allocation(1);
        let err = new.lock().sync_to_device().unwrap_err();
        assert!(err.is_out_of_memory(), "{err}");
        assert_eq!(new.lock().state(), BufferState::HostOnly);
        assert_eq!(pinned_down.lock().state(), BufferState::Synchronized);
        assert_eq!(spill::spill_stats(&device).evictions, 0);
        // The injected failure was one allocation: the next try succeeds as before.
        new.lock().sync_to_device().unwrap();
    }
}
