//! The sixteenth hostile pass: the Rust public API as a hostile Rust user would use it.
//! Each test failed before the fix it names (docs/RELIABILITY.md, "The sixteenth pass").
#![cfg(feature = "testing")]

#[path = "common/mod.rs"]
mod common;

use lazybuf::{
    AllocationOptions, Block, BufferOptions, BufferState, Device, DeviceAllocation, DeviceBuffer,
    DirectResource, MemoryKind, MemoryResource, Stream, Ticket, UnifiedBuffer,
};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// One test at a time: a test sets a device's memory limit from what is held there.
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Hands out pageable host memory whatever is asked for (a resource that ignores `pinned`).
#[derive(Debug)]
struct Pageable;

impl MemoryResource for Pageable {
    fn allocate(
        &self,
        device: &Device,
        kind: MemoryKind,
        bytes: usize,
        stream: &Stream,
    ) -> lazybuf::Result<Block> {
        let kind = match kind {
            MemoryKind::Host { .. } => MemoryKind::Host { pinned: false },
            other => other,
        };
        DirectResource.allocate(device, kind, bytes, stream)
    }

    fn deallocate(&self, device: &Device, block: Block, stream: &Stream, ready: Ticket) {
        DirectResource.deallocate(device, block, stream, ready);
    }
}

/// Hands out memory of another device than the one asked for.
#[derive(Debug)]
struct Elsewhere(Device);

impl MemoryResource for Elsewhere {
    fn allocate(&self, _: &Device, kind: MemoryKind, bytes: usize, _: &Stream) -> lazybuf::Result<Block> {
        DirectResource.allocate(&self.0, kind, bytes, &self.0.stream())
    }

    fn deallocate(&self, _: &Device, block: Block, _: &Stream, ready: Ticket) {
        DirectResource.deallocate(&self.0, block, &self.0.stream(), ready);
    }
}

fn with_resource(device: &Device, pinned: bool, resource: Arc<dyn MemoryResource>) -> UnifiedBuffer<u32> {
    let options =
        BufferOptions { device: Some(device.clone()), pinned, resource: Some(resource), stream: None };
    UnifiedBuffer::with_options(&[64], options).unwrap()
}

/// SPEC section 3: "failing to pin is an error or an explicit policy, never silent". A
/// resource that hands a pinned buffer pageable memory made it use that memory silently
/// (`is_pinned()` false, every transfer through pageable memory).
#[test]
fn a_pinned_buffer_refuses_a_pageable_block_from_its_resource() {
    let _serial = serial();
    let mut tried = 0;
    for device in common::devices().iter().filter(|d| d.can_pin_host_memory()) {
        let mut buf = with_resource(device, true, Arc::new(Pageable));
        let err = buf.host_mut().map(drop).unwrap_err();
        assert!(err.to_string().contains("pinned"), "{device}: {err}");
        assert_eq!(buf.state(), BufferState::Uninitialized, "{device}");
        assert_eq!(buf.transfer_stats().allocations, 0, "{device}");
        let err = buf.copy_from(&[7; 64]).unwrap_err();
        assert!(err.to_string().contains("pinned"), "{device}: {err}");
        assert_eq!(buf.state(), BufferState::Uninitialized, "{device}");
        // The same resource is fine for a pageable buffer.
        let mut pageable = with_resource(device, false, Arc::new(Pageable));
        pageable.copy_from(&[7; 64]).unwrap();
        assert_eq!(pageable.to_vec().unwrap(), vec![7; 64], "{device}");
        tried += 1;
    }
    assert!(tried > 0);
}

/// A resource that hands a buffer or a memory object device memory of another device (or of
/// its own invention): refused when it is handed out, naming the device, never handed to the
/// caller's kernels as this device's memory; the buffer keeps its state and data.
#[test]
fn device_memory_of_another_device_from_a_resource_is_refused() {
    let _serial = serial();
    let devices = common::devices();
    let mut tried = 0;
    for device in devices.iter().filter(|d| !d.is_zero_copy(256)) {
        let other = devices.iter().find(|o| o.id() != device.id() && !o.is_zero_copy(256)).cloned();
        for other in [Some(Device::host()), other].into_iter().flatten() {
            let resource: Arc<dyn MemoryResource> = Arc::new(Elsewhere(other.clone()));
            // Nothing to copy: the memory would go straight to the caller's kernels.
            let mut buf = with_resource(device, false, resource.clone());
            let err = buf.device_overwrite().map(drop).unwrap_err();
            assert!(err.to_string().contains("another device"), "{device} given {other}'s memory: {err}");
            assert_eq!(buf.state(), BufferState::Uninitialized, "{device}");
            // With data: the host copy stays current and intact.
            let mut buf = with_resource(device, false, resource.clone());
            buf.copy_from(&[5; 64]).unwrap();
            let err = buf.sync_to_device().unwrap_err();
            assert!(err.to_string().contains("another device"), "{device} given {other}'s memory: {err}");
            assert_eq!(buf.state(), BufferState::HostOnly, "{device}");
            assert_eq!(buf.to_vec().unwrap(), vec![5; 64], "{device}");
            // Memory objects and device buffers.
            let options = AllocationOptions { resource: Some(resource.clone()), alignment: 0 };
            let err =
                DeviceAllocation::<u32>::with_options(device, MemoryKind::Device, 64, options).unwrap_err();
            assert!(err.to_string().contains("another device"), "{device} given {other}'s memory: {err}");
            let options = AllocationOptions { resource: Some(resource.clone()), alignment: 0 };
            let err = DeviceBuffer::with_options(device, MemoryKind::Device, 64, options).unwrap_err();
            assert!(err.to_string().contains("another device"), "{device} given {other}'s memory: {err}");
            tried += 1;
        }
    }
    assert!(tried > 0, "no device with device memory of its own");
}

/// Memory that is real, host-addressed and sound (a `Vec` of its own), but of no backend:
/// what a resource of the user's own invention might hand out.
#[derive(Debug)]
struct Invented(#[allow(dead_code)] std::sync::Mutex<Vec<u8>>, usize);

// SAFETY: the host address is the start of the vector's `len` bytes, which live (never
// reallocated) as long as the handle.
unsafe impl lazybuf::backend::MemoryHandle for Invented {
    fn raw(&self) -> lazybuf::backend::RawMemory {
        lazybuf::backend::RawMemory::Host(self.1 as *mut u8)
    }

    fn host_address(&self) -> Option<std::ptr::NonNull<u8>> {
        std::ptr::NonNull::new(self.1 as *mut u8)
    }
}

#[derive(Debug)]
struct Inventing;

impl MemoryResource for Inventing {
    fn allocate(
        &self,
        device: &Device,
        kind: MemoryKind,
        bytes: usize,
        stream: &Stream,
    ) -> lazybuf::Result<Block> {
        if kind == MemoryKind::Device || kind == MemoryKind::Shared {
            let mut v = vec![0u8; bytes.max(1)];
            let address = v.as_mut_ptr() as usize;
            let handle = Box::new(Invented(std::sync::Mutex::new(v), address));
            // SAFETY: the handle addresses `bytes` bytes of its own vector while it lives.
            let memory = unsafe {
                match kind {
                    MemoryKind::Shared => lazybuf::backend::DeviceMemory::shared(bytes, handle),
                    _ => lazybuf::backend::DeviceMemory::new(bytes, false, handle),
                }
            };
            return Ok(Block::Device(memory));
        }
        DirectResource.allocate(device, kind, bytes, stream)
    }

    fn deallocate(&self, device: &Device, block: Block, stream: &Stream, ready: Ticket) {
        match block {
            Block::Device(memory) if memory.handle::<Invented>().is_some() => drop(memory),
            block => DirectResource.deallocate(device, block, stream, ready),
        }
    }
}

/// Device and shared memory no backend made, from a resource: refused for every device (a
/// host device's view and a shared memory object would have handed the caller its bytes as
/// the device's own).
#[test]
fn memory_no_backend_made_from_a_resource_is_refused() {
    let _serial = serial();
    for device in common::devices() {
        let resource: Arc<dyn MemoryResource> = Arc::new(Inventing);
        for kind in [MemoryKind::Device, MemoryKind::Shared] {
            let options = AllocationOptions { resource: Some(resource.clone()), alignment: 0 };
            let err = DeviceAllocation::<u32>::with_options(&device, kind, 64, options).unwrap_err();
            assert!(err.to_string().contains("another device"), "{device} {kind:?}: {err}");
        }
        if !device.is_zero_copy(256) {
            let mut buf = with_resource(&device, false, resource.clone());
            let err = buf.device_overwrite().map(drop).unwrap_err();
            assert!(err.to_string().contains("another device"), "{device}: {err}");
            assert_eq!(buf.state(), BufferState::Uninitialized, "{device}");
        }
    }
}

/// A panic while a `SharedBuffer`'s lock is held (the caller's code, or a resource's) poisons
/// the lock. `lock()` goes on using the buffer, but eviction skipped a poisoned buffer for good:
/// an idle buffer whose device copy equals its host copy (evictable moving no byte) was never
/// evicted again, and allocations under the budget failed with "nothing more can be evicted".
#[test]
fn a_shared_buffer_whose_lock_a_panic_poisoned_is_still_evicted() {
    let _serial = serial();
    use lazybuf::spill::{self, SharedBuffer};
    let mut tried = 0;
    for device in common::devices().into_iter().filter(|d| !d.is_zero_copy(4000)) {
        let direct = || BufferOptions {
            device: Some(device.clone()),
            resource: Some(DirectResource::shared()),
            ..BufferOptions::default()
        };
        let poisoned = SharedBuffer::new(UnifiedBuffer::<u32>::with_options(&[1000], direct()).unwrap());
        {
            let mut buf = poisoned.lock();
            buf.copy_from(&[9; 1000]).unwrap();
            buf.sync_to_device().unwrap();
        }
        let shared = poisoned.clone();
        let panicked = std::thread::spawn(move || {
            let _guard = shared.lock();
            panic!("the caller's code panics while it holds the lock");
        })
        .join();
        assert!(panicked.is_err());
        // No room for another copy without evicting the poisoned buffer's.
        spill::set_memory_limit(&device, Some(spill::memory_held(&device)));
        let other = SharedBuffer::new(UnifiedBuffer::<u32>::with_options(&[1000], direct()).unwrap());
        other.lock().copy_from(&[1; 1000]).unwrap();
        let synced = other.lock().sync_to_device();
        spill::set_memory_limit(&device, None);
        synced.unwrap_or_else(|err| panic!("{device}: {err}"));
        let mut buf = poisoned.lock();
        assert_eq!(buf.state(), BufferState::HostOnly, "{device}: the clean copy was evicted");
        assert_eq!(buf.to_vec().unwrap(), vec![9; 1000], "{device}");
        tried += 1;
    }
    assert!(tried > 0);
}

/// `RawBuffer::fill` took any pattern when the fill ran on the host (an empty one zero-filled,
/// a 3-byte one wrote a cut repetition) and refused the same pattern when the data was current
/// on a device: the same call meant different things by state and device. One rule now,
/// checked before anything moves.
#[test]
fn a_raw_fill_applies_one_pattern_rule_wherever_the_data_is() {
    let _serial = serial();
    for device in common::devices() {
        for synced in [false, true] {
            let mut raw =
                lazybuf::RawBuffer::with_resource(12, device.clone(), false, DirectResource::shared());
            raw.host_access(lazybuf::coherence::Access::Overwrite).unwrap().copy_from_slice(&[7; 12]);
            if synced {
                raw.sync(Some(&device)).unwrap();
            }
            let state = raw.state();
            for pattern in [&[][..], &[1, 2, 3], &[1; 32], &[1; 8]] {
                let err = raw.fill(pattern).unwrap_err();
                assert!(err.to_string().contains("pattern"), "{device} {pattern:?}: {err}");
                assert_eq!(raw.state(), state, "{device} {pattern:?}");
                raw.sync(None).unwrap();
                assert_eq!(raw.host_if_valid().unwrap(), &[7; 12], "{device} {pattern:?}");
            }
            raw.fill(&[1, 2, 3, 4]).unwrap();
            raw.sync(None).unwrap();
            assert_eq!(raw.host_if_valid().unwrap(), &[1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4], "{device}");
        }
    }
}

/// An evictable buffer of the caller's own whose code panics while lazybuf makes room.
struct Panicking(std::sync::atomic::AtomicBool);

impl lazybuf::spill::Evictable for Panicking {
    fn last_use(&self) -> u64 {
        0
    }

    fn try_evict(&self, _: &Device) -> Option<lazybuf::Result<Option<lazybuf::spill::Evicted>>> {
        if self.0.load(std::sync::atomic::Ordering::SeqCst) {
            panic!("the caller's evictable panics");
        }
        None
    }
}

/// A panic inside a budgeted allocation (here an evictable buffer's own code, called to make
/// room after the runtime reported out of memory; a runtime's allocation may panic the same
/// way) left the request's bytes charged to the device for good: `memory_held` grew by them
/// and every later allocation under a limit was refused or evicted for memory nobody held.
#[test]
fn a_panic_while_making_room_leaves_the_budget_as_it_was() {
    let _serial = serial();
    use std::panic::{AssertUnwindSafe, catch_unwind};
    let evictable = Arc::new(Panicking(std::sync::atomic::AtomicBool::new(true)));
    let weak: std::sync::Weak<dyn lazybuf::spill::Evictable> = Arc::downgrade(&evictable) as _;
    lazybuf::spill::registry::register(weak);
    let mut panicked = 0;
    for device in common::devices() {
        let held = lazybuf::spill::memory_held(&device);
        let options = AllocationOptions { resource: Some(DirectResource::shared()), alignment: 0 };
        // Larger than any device: the runtime refuses it (out of memory where it says so).
        let huge = 1usize << 50;
        let result = catch_unwind(AssertUnwindSafe(|| {
            DeviceAllocation::<u8>::with_options(&device, MemoryKind::Device, huge, options)
        }));
        match result {
            Err(_) => panicked += 1,
            Ok(result) => assert!(result.is_err(), "{device}: {huge} bytes allocated"),
        }
        assert_eq!(
            lazybuf::spill::memory_held(&device),
            held,
            "{device}: the request's bytes stayed charged"
        );
    }
    evictable.0.store(false, std::sync::atomic::Ordering::SeqCst);
    assert!(panicked > 0, "no device reported out of memory, so nothing made room");
}

/// A resource whose `deallocate` panics (a caller's assertion, say).
#[derive(Debug)]
struct PanicsOnReturn;

impl MemoryResource for PanicsOnReturn {
    fn allocate(
        &self,
        device: &Device,
        kind: MemoryKind,
        bytes: usize,
        stream: &Stream,
    ) -> lazybuf::Result<Block> {
        DirectResource.allocate(device, kind, bytes, stream)
    }

    fn deallocate(&self, device: &Device, block: Block, stream: &Stream, ready: Ticket) {
        DirectResource.deallocate(device, block, stream, ready);
        panic!("the caller's resource panics taking a block back");
    }
}

fn callback_errors(device: &Device) -> usize {
    let (errors, _) = device.take_deferred_errors();
    errors.iter().filter(|e| matches!(e, lazybuf::Error::Callback { .. })).count()
}

/// Dropping a buffer or a memory object calls its resource's `deallocate`: a panic there
/// unwound out of the drop (and aborted the process when the drop ran while another panic
/// unwound, as a buffer on the stack of a failing test or request does). A drop never
/// unwinds now: the panic is recorded on the device, and every other block still goes back.
#[test]
fn a_resource_that_panics_taking_memory_back_never_unwinds_out_of_a_drop() {
    let _serial = serial();
    use std::panic::{AssertUnwindSafe, catch_unwind};
    for device in common::devices() {
        let _ = device.take_deferred_errors();
        let resource: Arc<dyn MemoryResource> = Arc::new(PanicsOnReturn);
        let mut buf = with_resource(&device, false, resource.clone());
        buf.copy_from(&[3; 64]).unwrap();
        buf.sync_to_device().unwrap();
        let blocks = if device.is_zero_copy(256) { 1 } else { 2 };
        assert!(catch_unwind(AssertUnwindSafe(|| drop(buf))).is_ok(), "{device}: the drop unwound");
        assert_eq!(callback_errors(&device), blocks, "{device}: every block's panic recorded");
        let options = AllocationOptions { resource: Some(resource.clone()), alignment: 0 };
        let allocation =
            DeviceAllocation::<u32>::with_options(&device, MemoryKind::Device, 64, options).unwrap();
        assert!(catch_unwind(AssertUnwindSafe(|| drop(allocation))).is_ok(), "{device}: the drop unwound");
        assert_eq!(callback_errors(&device), 1, "{device}");
        // Dropped while another panic unwinds: before, a second panic, and the process aborted.
        let device2 = device.clone();
        let unwound = std::thread::spawn(move || {
            let mut buf = with_resource(&device2, false, Arc::new(PanicsOnReturn));
            buf.copy_from(&[3; 64]).unwrap();
            panic!("the caller's code panics with a buffer alive");
        })
        .join();
        assert!(unwound.is_err());
        assert_eq!(callback_errors(&device), 1, "{device}");
    }
}

/// A pool over that resource: trimming it (the pool's own drop, or an eviction pass making
/// room for another buffer) gives its cached blocks back upstream; a panic there unwound out
/// of the pool's drop, or into the unrelated allocation that trimmed, and the blocks after the
/// one that panicked were never given back.
#[test]
fn a_pool_whose_upstream_panics_taking_blocks_back_trims_and_drops_without_unwinding() {
    let _serial = serial();
    use std::panic::{AssertUnwindSafe, catch_unwind};
    for device in common::devices() {
        let _ = device.take_deferred_errors();
        let pool = lazybuf::MemoryPool::with_upstream(
            &device,
            lazybuf::PoolConfig::for_device(&device),
            Arc::new(PanicsOnReturn),
        );
        let buffers: Vec<_> = (0..3)
            .map(|n| {
                let mut buf = pool.acquire::<u32>(&[64 << n], false).unwrap();
                buf.copy_from(&vec![1; 64 << n]).unwrap();
                buf
            })
            .collect();
        for buf in buffers {
            pool.release(buf).unwrap();
        }
        let trimmed = catch_unwind(AssertUnwindSafe(|| pool.trim()));
        assert!(trimmed.is_ok_and(|bytes| bytes >= 256 + 512 + 1024), "{device}: every cached block trimmed");
        assert_eq!(callback_errors(&device), 3, "{device}: each block's panic recorded");
        let mut buf = pool.acquire::<u32>(&[64], false).unwrap();
        buf.copy_from(&[1; 64]).unwrap();
        pool.release(buf).unwrap();
        assert!(catch_unwind(AssertUnwindSafe(|| drop(pool))).is_ok(), "{device}: the pool's drop unwound");
        assert_eq!(callback_errors(&device), 1, "{device}");
    }
}

/// A resource whose `allocate` panics while armed.
#[derive(Debug, Default)]
struct PanicsOnAllocate(std::sync::atomic::AtomicBool);

impl MemoryResource for PanicsOnAllocate {
    fn allocate(
        &self,
        device: &Device,
        kind: MemoryKind,
        bytes: usize,
        stream: &Stream,
    ) -> lazybuf::Result<Block> {
        if self.0.load(std::sync::atomic::Ordering::SeqCst) {
            panic!("the caller's resource panics handing out a block");
        }
        DirectResource.allocate(device, kind, bytes, stream)
    }

    fn deallocate(&self, device: &Device, block: Block, stream: &Stream, ready: Ticket) {
        DirectResource.deallocate(device, block, stream, ready);
    }
}

/// A limit over an upstream that panics: the limiting adaptor reserved the request before it
/// asked upstream, and the panic unwound past the release, so the limit stayed used by bytes
/// nobody held (a 1,000-byte limit refused everything after one panic of a 1,000-byte request).
#[test]
fn a_limit_over_an_upstream_that_panics_keeps_no_reservation() {
    let _serial = serial();
    use std::panic::{AssertUnwindSafe, catch_unwind};
    for device in common::devices() {
        let upstream = Arc::new(PanicsOnAllocate(std::sync::atomic::AtomicBool::new(true)));
        let limit = Arc::new(lazybuf::LimitingResource::new(upstream.clone(), 1000));
        let options =
            || AllocationOptions { resource: Some(limit.clone() as Arc<dyn MemoryResource>), alignment: 0 };
        let result = catch_unwind(AssertUnwindSafe(|| {
            DeviceAllocation::<u8>::with_options(&device, MemoryKind::Device, 1000, options())
        }));
        assert!(result.is_err(), "{device}: the upstream did not panic");
        assert_eq!(limit.held(), 0, "{device}: the panicked request stayed reserved");
        upstream.0.store(false, std::sync::atomic::Ordering::SeqCst);
        let allocation = DeviceAllocation::<u8>::with_options(&device, MemoryKind::Device, 1000, options());
        assert!(allocation.is_ok(), "{device}: {:?}", allocation.err());
    }
}
