//! Tests of every CUDA [`crate::backend::Runtime`] operation (through the checked layer), on whatever CUDA devices the process finds: the
//! driver-API test double under `scripts/test-cuda-double.sh`, or a GPU. Without a CUDA device
//! each test prints a visible skip. Buffer-level, fault-injection and real-GPU tests are in
//! `tests/cuda*.rs`.

use cudarc::driver::sys;

use super::REGISTER_MIN_BYTES;
use super::staging::{CHUNK, PIPELINE_MIN};
use crate::Result;
use crate::backend::{
    Backend, Block, DeviceMemory, HostSpan, MemoryKind, MemorySource, RawDevice, RawMemory, Ticket,
};
use crate::device::Device;
use crate::error::{BackendKind, Error};
use crate::host_memory::{HostMemory, Pinning, fill_pattern};

fn cuda_devices(test: &str) -> Vec<Device> {
    let found: Vec<Device> =
        crate::devices().into_iter().filter(|d| d.backend_kind() == BackendKind::CUDA).collect();
    if found.is_empty() {
        assert!(
            std::env::var_os("LAZYBUF_REQUIRE_CUDA").is_none(),
            "{test}: LAZYBUF_REQUIRE_CUDA is set but there is no CUDA device"
        );
        eprintln!(
            "SKIPPED {test}: no CUDA device (run with LD_LIBRARY_PATH=target/cuda-double, \
             scripts/test-cuda-double.sh, or on a GPU)"
        );
    }
    found
}

/// One allocation of each kind, as the tests ask for them.
trait AllocateKind {
    fn allocate_device(&self, bytes: usize) -> Result<DeviceMemory>;
    fn allocate_host_block(&self, bytes: usize, pinned: bool) -> Result<HostMemory>;
}

impl AllocateKind for dyn Backend {
    fn allocate_device(&self, bytes: usize) -> Result<DeviceMemory> {
        match self.allocate(MemoryKind::Device, bytes)? {
            Block::Device(memory) => Ok(memory),
            Block::Host(_) => panic!("asked for device memory, got a host block"),
        }
    }

    fn allocate_host_block(&self, bytes: usize, pinned: bool) -> Result<HostMemory> {
        match self.allocate(MemoryKind::Host { pinned }, bytes)? {
            Block::Host(block) => Ok(block),
            Block::Device(_) => panic!("asked for a host block, got device memory"),
        }
    }
}

fn ramp(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8).collect()
}

/// Blocking operations on the device's default stream, as the buffer engine makes them.
struct Ops<'a>(&'a Device);

impl Ops<'_> {
    fn upload(&self, src: &[u8], dst: &mut DeviceMemory) -> Result<()> {
        self.upload_async(HostSpan::of_slice(src), dst)?.wait()
    }

    fn upload_async(&self, src: HostSpan, dst: &mut DeviceMemory) -> Result<Ticket> {
        // SAFETY: every caller keeps `src` alive and unwritten until it waits for the ticket.
        unsafe { self.0.stream().upload(src, dst) }
    }

    fn download_into(&self, src: &DeviceMemory, dst: &mut [u8]) -> Result<()> {
        // SAFETY: dst is borrowed until the ticket is waited for, here.
        unsafe { self.0.stream().download(src, HostSpan::of_mut_slice(dst)) }?.wait()
    }

    fn fill(&self, dst: &mut DeviceMemory, pattern: &[u8], bytes: usize) -> Result<()> {
        self.0.stream().fill(dst, pattern, bytes)?.wait()
    }

    fn copy(&self, src: &DeviceMemory, dst: &mut DeviceMemory, bytes: usize) -> Result<()> {
        self.0.stream().copy(src, dst, bytes)?.wait()
    }
}

fn download(device: &Device, memory: &DeviceMemory, n: usize) -> Vec<u8> {
    let mut out = vec![0x11; n];
    Ops(device).download_into(memory, &mut out).unwrap();
    out
}

#[test]
fn every_operation_acts_on_a_prefix() {
    for device in cuda_devices("every_operation_acts_on_a_prefix") {
        let (backend, ops) = (device.backend(), Ops(&device));
        let mut a = backend.allocate_device(1000).unwrap();
        let mut b = backend.allocate_device(1000).unwrap();
        ops.fill(&mut a, &[0xEE], 1000).unwrap();
        ops.fill(&mut b, &[0xDD], 1000).unwrap();
        ops.upload(&ramp(600), &mut a).unwrap();
        let all = download(&device, &a, 1000);
        assert_eq!(&all[..600], &ramp(600)[..]);
        assert!(all[600..].iter().all(|&x| x == 0xEE), "upload wrote past its length");
        assert_eq!(download(&device, &a, 100), &ramp(100)[..]);

        ops.copy(&a, &mut b, 300).unwrap();
        let copied = download(&device, &b, 1000);
        assert_eq!(&copied[..300], &ramp(300)[..]);
        assert!(copied[300..].iter().all(|&x| x == 0xDD), "copy wrote past its length");

        ops.fill(&mut b, &[1, 2], 10).unwrap();
        assert_eq!(&download(&device, &b, 12)[..], &[1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 10, 11]);
        backend.synchronize().unwrap();
    }
}

#[test]
fn lengths_beyond_an_allocation_and_bad_patterns_are_errors() {
    for device in cuda_devices("lengths_beyond_an_allocation_and_bad_patterns_are_errors") {
        let (backend, ops) = (device.backend(), Ops(&device));
        let mut a = backend.allocate_device(64).unwrap();
        let mut b = backend.allocate_device(32).unwrap();
        let mismatch = |r: crate::Result<()>| matches!(r, Err(Error::LengthMismatch { .. }));
        assert!(mismatch(ops.upload(&[0; 65], &mut a)));
        assert!(mismatch(ops.download_into(&a, &mut [0; 65])));
        assert!(mismatch(ops.copy(&a, &mut b, 33)));
        assert!(mismatch(ops.fill(&mut a, &[0], 65)));
        let err = ops.fill(&mut a, &[1, 2, 3], 63).unwrap_err().to_string();
        assert!(err.contains("pattern of 1, 2, 4, 8 or 16 bytes"), "{err}");
        let err = ops.fill(&mut a, &[1, 2, 3], 64).unwrap_err().to_string();
        assert!(err.contains("whose length divides 64"), "{err}");
        let err = ops.fill(&mut a, &[], 64).unwrap_err().to_string();
        assert!(err.contains("pattern of 1, 2, 4, 8 or 16 bytes"), "{err}");
        // Empty operations touch nothing.
        ops.upload(&[], &mut a).unwrap();
        ops.download_into(&a, &mut []).unwrap();
        ops.copy(&a, &mut b, 0).unwrap();
        ops.fill(&mut a, &[9], 0).unwrap();
    }
}

#[test]
fn memory_of_another_device_is_refused() {
    let devices = cuda_devices("memory_of_another_device_is_refused");
    let host = Device::host();
    for device in &devices {
        let mut foreign = host.backend().allocate_device(16).unwrap();
        let err = Ops(device).upload(&[1; 16], &mut foreign).unwrap_err().to_string();
        assert!(err.contains("expected memory of"), "{err}");
        // Another device's stream: refused by the safe operations. (The enqueuing ones take
        // the stream of a `Stream`, which is always its own device's: a precondition there,
        // asserted in debug builds.)
        let err = device.backend().marker(host.stream().handle()).unwrap_err().to_string();
        assert!(err.contains("expected a stream of"), "{err}");
        let err = device.backend().wait_on(host.stream().handle(), &Ticket::done()).unwrap_err().to_string();
        assert!(err.contains("expected a stream of"), "{err}");
    }
    if let [first, second, ..] = &devices[..] {
        let theirs = second.backend().allocate_device(16).unwrap();
        let mut mine = first.backend().allocate_device(16).unwrap();
        assert!(Ops(first).copy(&theirs, &mut mine, 16).is_err());
    }
}

#[test]
fn fills_every_element_size_with_memsets() {
    let patterns: [&[u8]; 9] = [
        &[7],
        &[3, 3],
        &[1, 2],
        &[5, 5, 5, 5],
        &[1, 2, 1, 2],
        &[0, 0, 128, 63],
        &[0, 0, 128, 63, 0, 0, 128, 63],
        &[0, 0, 0, 0, 0, 0, 248, 63],
        &[9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 1, 2, 3, 4, 5, 6],
    ];
    for device in cuda_devices("fills_every_element_size_with_memsets") {
        let (backend, ops) = (device.backend(), Ops(&device));
        for pattern in patterns {
            // Tiny, odd and large counts, never a power of two.
            for elements in [1, 1000, 65536 / pattern.len() + 1, 300_007] {
                let bytes = elements * pattern.len();
                let mut memory = backend.allocate_device(bytes + 8).unwrap();
                ops.fill(&mut memory, &[0xAB], bytes + 8).unwrap();
                ops.fill(&mut memory, pattern, bytes).unwrap();
                let got = download(&device, &memory, bytes + 8);
                let mut want = vec![0; bytes];
                fill_pattern(&mut want, pattern);
                assert!(got[..bytes] == want[..], "fill {pattern:?} x {elements}");
                assert_eq!(&got[bytes..], &[0xAB; 8], "fill {pattern:?} wrote past its length");
            }
        }
    }
}

#[test]
fn pinned_host_memory_is_page_locked_portable_and_not_write_combined() {
    for device in cuda_devices("pinned_host_memory_is_page_locked_portable_and_not_write_combined") {
        let backend = device.backend();
        let mut block = backend.allocate_host_block(1 << 20, true).unwrap();
        assert!(block.is_pinned());
        assert!(block.as_slice().iter().all(|&b| b == 0), "fresh pinned memory reads as zeros");
        block.as_mut_slice().copy_from_slice(&ramp(1 << 20));
        assert_eq!(block.as_slice(), &ramp(1 << 20)[..]);
        let mut flags = 0;
        if let RawDevice::Cuda { context, .. } = backend.raw() {
            // SAFETY: a test asking the driver about memory it allocated; context is live.
            let status = unsafe {
                sys::cuCtxSetCurrent(context.cast());
                sys::cuMemHostGetFlags(&mut flags, block.as_mut_ptr().cast())
            };
            assert_eq!(status, sys::CUresult::CUDA_SUCCESS);
        }
        assert_ne!(flags & sys::CU_MEMHOSTALLOC_PORTABLE, 0);
        assert_eq!(flags & sys::CU_MEMHOSTALLOC_WRITECOMBINED, 0);

        assert!(!backend.allocate_host_block(1 << 20, false).unwrap().is_pinned());
        let empty = backend.allocate_host_block(0, true).unwrap();
        assert!(empty.is_pinned() && empty.is_empty());
    }
}

#[test]
fn large_transfers_round_trip_pinned_and_pageable() {
    // Not a multiple of the staging piece, so the last piece of each lane is partial.
    let n = 3 * CHUNK + 12_345;
    assert!(n >= PIPELINE_MIN);
    let data = ramp(n);
    for device in cuda_devices("large_transfers_round_trip_pinned_and_pageable") {
        let (backend, ops) = (device.backend(), Ops(&device));
        for pinned in [false, true] {
            let mut host = backend.allocate_host_block(n, pinned).unwrap();
            host.as_mut_slice().copy_from_slice(&data);
            let mut memory = backend.allocate_device(n + 100).unwrap();
            ops.fill(&mut memory, &[0x77], n + 100).unwrap();
            ops.upload_async(HostSpan::of(&host, n), &mut memory).unwrap().wait().unwrap();
            let mut back = backend.allocate_host_block(n, pinned).unwrap();
            // SAFETY: `back` is untouched until the ticket is waited for, here.
            unsafe { device.stream().download(&memory, HostSpan::of(&back, n)) }.unwrap().wait().unwrap();
            back.mark_written();
            assert!(back.as_slice() == &data[..], "pinned: {pinned}");
            assert_eq!(download(&device, &memory, n + 100)[n..], [0x77; 100]);
        }
    }
}

#[test]
fn concurrent_transfers_from_many_threads() {
    for device in cuda_devices("concurrent_transfers_from_many_threads") {
        std::thread::scope(|scope| {
            for t in 0..4u8 {
                let device = device.clone();
                scope.spawn(move || {
                    let n = PIPELINE_MIN + usize::from(t) * 4099;
                    let data: Vec<u8> = ramp(n).into_iter().map(|b| b ^ t).collect();
                    let mut memory = device.backend().allocate_device(n).unwrap();
                    let stream = device.create_stream().unwrap();
                    for _ in 0..3 {
                        // SAFETY: data outlives the wait below.
                        unsafe { stream.upload(HostSpan::of_slice(&data), &mut memory) }
                            .unwrap()
                            .wait()
                            .unwrap();
                        assert!(download(&device, &memory, n) == data);
                    }
                });
            }
        });
    }
}

#[test]
fn peer_copies_go_straight_between_devices() {
    let devices = cuda_devices("peer_copies_go_straight_between_devices");
    let [first, second, ..] = &devices[..] else {
        eprintln!("SKIPPED peer_copies_go_straight_between_devices: needs two CUDA devices");
        return;
    };
    let (a, b) = (first.backend(), second.backend());
    assert!(a.can_copy_from_peer(a), "a device copies from itself");
    assert!(!a.can_copy_from_peer(Device::host().backend()));
    if !b.can_copy_from_peer(a) {
        eprintln!("SKIPPED peer_copies_go_straight_between_devices: the driver allows no peer access");
        return;
    }
    let mut src = a.allocate_device(5000).unwrap();
    Ops(first).upload(&ramp(5000), &mut src).unwrap();
    let mut dst = b.allocate_device(6000).unwrap();
    Ops(second).fill(&mut dst, &[0x44], 6000).unwrap();
    let stream = second.stream();
    stream.copy_from_peer(first, &src, &mut dst, 4000).expect("peers copy directly").unwrap().wait().unwrap();
    let got = download(second, &dst, 6000);
    assert_eq!(&got[..4000], &ramp(4000)[..]);
    assert!(got[4000..].iter().all(|&x| x == 0x44));
    let err = stream.copy_from_peer(first, &src, &mut dst, 5001).unwrap().unwrap_err();
    assert!(matches!(err, Error::LengthMismatch { .. }), "{err}");
    // Host memory is not a peer: no direct copy.
    let host_memory = Device::host().backend().allocate_device(16).unwrap();
    assert!(stream.copy_from_peer(&Device::host(), &host_memory, &mut dst, 16).is_none());
}

#[test]
fn discovery_reports_what_the_driver_says() {
    for device in cuda_devices("discovery_reports_what_the_driver_says") {
        let info = device.info();
        assert!(info.is_gpu && info.total_memory > 0 && !info.name.is_empty());
        assert_eq!(info.vendor, "NVIDIA");
        let memory = device.memory_info().unwrap();
        assert_eq!(memory.source, MemorySource::Runtime);
        assert!(memory.free <= memory.total && memory.total == info.total_memory);
        let (major, _) = info.compute_capability.expect("CUDA devices have a compute capability");
        assert!(major >= 3);
        assert!(matches!(device.backend().raw(), RawDevice::Cuda { context, stream }
            if !context.is_null() && !stream.is_null()));
        let memory = device.backend().allocate_device(64).unwrap();
        // SAFETY: only reads the handle.
        assert!(matches!(unsafe { memory.raw() }, RawMemory::Cuda(ptr) if ptr != 0));
        let empty = device.backend().allocate_device(0).unwrap();
        // SAFETY: only reads the handle.
        assert_eq!(unsafe { empty.raw() }, RawMemory::Cuda(0));
    }
    assert_eq!(Device::host().info().compute_capability, None);
}

#[test]
fn allocations_larger_than_the_device_are_out_of_memory() {
    for device in cuda_devices("allocations_larger_than_the_device_are_out_of_memory") {
        let too_big = device.info().total_memory as usize + (1 << 20);
        let err = device.backend().allocate_device(too_big).unwrap_err();
        assert!(err.is_out_of_memory(), "{err}");
        assert!(err.to_string().contains(device.name()), "{err}");
    }
}

#[test]
fn operations_leave_the_callers_current_context_as_it_was() {
    let devices = cuda_devices("operations_leave_the_callers_current_context_as_it_was");
    let current = || {
        let mut ctx = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the driver only reports this thread's binding.
        assert_eq!(unsafe { sys::cuCtxGetCurrent(&mut ctx) }, sys::CUresult::CUDA_SUCCESS);
        ctx
    };
    let contexts: Vec<sys::CUcontext> = devices
        .iter()
        .map(|d| match d.backend().raw() {
            RawDevice::Cuda { context, .. } => context.cast(),
            other => panic!("{other:?}"),
        })
        .collect();
    for before in std::iter::once(std::ptr::null_mut()).chain(contexts.iter().copied()) {
        for device in &devices {
            // SAFETY: null unbinds; the others are live primary contexts of opened devices.
            assert_eq!(unsafe { sys::cuCtxSetCurrent(before) }, sys::CUresult::CUDA_SUCCESS);
            let mut memory = device.backend().allocate_device(PIPELINE_MIN).unwrap();
            Ops(device).upload(&ramp(PIPELINE_MIN), &mut memory).unwrap();
            device.memory_info().unwrap();
            drop(memory);
            let after = current();
            // From no context, device 0's primary context may stay current: the CUDA runtime
            // would make that one current itself (Context::bind).
            let runtime_default =
                before.is_null() && after == contexts[0] && device.info().ordinal == Some(0);
            assert!(
                after == before || runtime_default,
                "an operation on {device:?} changed the current context"
            );
        }
    }
}

#[test]
fn from_no_context_only_device_0s_primary_context_stays_current() {
    let devices = cuda_devices("from_no_context_only_device_0s_primary_context_stays_current");
    for device in &devices {
        // A fresh thread has no current context.
        let left = std::thread::scope(|s| {
            s.spawn(|| {
                device.memory_info().unwrap();
                let mut ctx = std::ptr::null_mut();
                // SAFETY: a valid out-pointer; the driver only reports this thread's binding.
                assert_eq!(unsafe { sys::cuCtxGetCurrent(&mut ctx) }, sys::CUresult::CUDA_SUCCESS);
                ctx as usize
            })
            .join()
            .unwrap()
        });
        let RawDevice::Cuda { context, .. } = device.backend().raw() else { unreachable!() };
        let expected = if device.info().ordinal == Some(0) { context as usize } else { 0 };
        assert_eq!(left, expected, "{device:?}");
    }
}

#[test]
fn copies_return_at_once_and_their_tickets_complete() {
    for device in cuda_devices("copies_return_at_once_and_their_tickets_complete") {
        let backend = device.backend();
        for n in [1000, PIPELINE_MIN + 7] {
            let data = ramp(n);
            let mut memory = backend.allocate_device(n).unwrap();
            let ticket = Ops(&device).upload_async(HostSpan::of_slice(&data), &mut memory).unwrap();
            ticket.wait().unwrap();
            assert!(ticket.poll().unwrap(), "a waited ticket is complete");
            assert!(download(&device, &memory, n) == data);
        }
    }
}

#[test]
fn streams_are_ordered_through_tickets() {
    for device in cuda_devices("streams_are_ordered_through_tickets") {
        let backend = device.backend();
        let (first, second) = (device.create_stream().unwrap(), device.create_stream().unwrap());
        let data = ramp(1 << 16);
        let mut a = backend.allocate_device(data.len()).unwrap();
        let mut b = backend.allocate_device(data.len()).unwrap();
        // SAFETY: data outlives every wait below.
        let uploaded = unsafe { first.upload(HostSpan::of_slice(&data), &mut a) }.unwrap();
        second.wait_for(&uploaded).unwrap();
        second.copy(&a, &mut b, data.len()).unwrap().wait().unwrap();
        assert!(download(&device, &b, data.len()) == data);
        second.synchronize().unwrap();
        assert!(first.marker().unwrap().poll().is_ok());
        // SAFETY: only reads the handle.
        let raw = unsafe { first.raw() };
        assert!(matches!(raw, crate::backend::RawStream::Cuda(s) if !s.is_null()));
    }
}

#[test]
fn pageable_blocks_moved_twice_are_registered_with_the_driver() {
    for device in cuda_devices("pageable_blocks_moved_twice_are_registered_with_the_driver") {
        let backend = device.backend();
        let mut small = HostMemory::allocate(REGISTER_MIN_BYTES - 1).unwrap();
        let mut large = HostMemory::allocate(REGISTER_MIN_BYTES).unwrap();
        for round in 1..=3 {
            backend.prepare_host(&mut small);
            backend.prepare_host(&mut large);
            let expected =
                if round >= 2 { Pinning::Registered(BackendKind::CUDA) } else { Pinning::Pageable };
            assert_eq!(large.pinning(), expected, "after transfer {round}");
            assert_eq!(small.pinning(), Pinning::Pageable, "small blocks are never registered");
        }
        // A registered block transfers like pinned memory and still round-trips.
        let mut memory = backend.allocate_device(large.len()).unwrap();
        let data = ramp(large.len());
        large.as_mut_slice().copy_from_slice(&data);
        Ops(&device).upload_async(HostSpan::of(&large, large.len()), &mut memory).unwrap().wait().unwrap();
        assert!(download(&device, &memory, large.len()) == data);
        drop(large); // unregisters before unmapping
        let pinned = backend.allocate_host_block(REGISTER_MIN_BYTES, true).unwrap();
        let mut pinned = pinned;
        backend.prepare_host(&mut pinned);
        backend.prepare_host(&mut pinned);
        assert_eq!(pinned.pinning(), Pinning::Runtime(BackendKind::CUDA), "pinned blocks stay what they are");
    }
}

/// cudarc panics when a driver lacks an entry point it is asked to call, so every entry point
/// the backend calls directly must be in [`super::REQUIRED_SYMBOLS`], which the probe checks
/// before any call (a missing one then reports CUDA absent instead of panicking later).
#[test]
fn every_driver_entry_point_called_directly_is_checked_by_the_probe() {
    let sources = [
        include_str!("mod.rs"),
        include_str!("device.rs"),
        include_str!("memory.rs"),
        include_str!("staging.rs"),
    ];
    let mut called: Vec<&str> = sources
        .iter()
        .flat_map(|source| source.split("sys::").skip(1))
        .filter_map(|rest| {
            let name =
                &rest[..rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(rest.len())];
            (name.starts_with("cu") && name.as_bytes().get(2).is_some_and(u8::is_ascii_uppercase))
                .then_some(name)
        })
        .collect();
    called.sort_unstable();
    called.dedup();
    assert!(called.len() >= 10, "the scan found too few calls to mean anything: {called:?}");
    let unchecked: Vec<&str> =
        called.into_iter().filter(|name| !super::REQUIRED_SYMBOLS.contains(name)).collect();
    assert!(unchecked.is_empty(), "called but not in REQUIRED_SYMBOLS: {unchecked:?}");
}
