//! Memory objects (`lazybuf::memory`) on every device: allocations of every kind with their
//! uploads, downloads, fills, copies between kinds and devices, host access and raw handles;
//! the resizable `DeviceBuffer` (RMM's semantics, a long random sequence against a model, and
//! holds that keep an allocation alive across reallocations);
//! bad input, each a clear error that changes nothing; and faults injected into every
//! allocation and copy (`lazybuf::testing::FaultyDevice`): a failed allocation or
//! reallocation changes nothing, a failed copy leaves every byte outside its range.

use crate::common;

use std::sync::Arc;

use common::{devices, pattern};
use lazybuf::backend::RawMemory;
use lazybuf::testing::FaultyDevice;
use lazybuf::{
    AllocationOptions, BackendKind, Device, DeviceAllocation, DeviceBuffer, DirectResource, Error,
    LimitingResource, Memory, MemoryKind, MemoryResource,
};

const KINDS: [MemoryKind; 4] = [
    MemoryKind::Device,
    MemoryKind::Host { pinned: false },
    MemoryKind::Host { pinned: true },
    MemoryKind::Shared,
];

/// Lengths in u32 elements: empty, tiny, odd, and past the host's mmap threshold (pinned host
/// memory stays under `RLIMIT_MEMLOCK`'s usual 8 MiB).
const LENGTHS: [usize; 5] = [0, 1, 7, 1000, 70_000];

/// `kind` memory on `device`, or `None` where the device has no memory of that kind: shared
/// memory, or pinned host memory on a device without it (wgpu); the error must say so.
fn allocate(device: &Device, kind: MemoryKind, len: usize) -> Option<DeviceAllocation<u32>> {
    match DeviceAllocation::new(device, kind, len) {
        Ok(memory) => Some(memory),
        Err(err) if lacks(device, kind, &err) => None,
        Err(err) => panic!("{device}: {kind:?} x {len}: {err}"),
    }
}

/// Whether `err` is `device`'s clear refusal of a kind of memory it does not have: shared
/// memory on a device that says it has none (`DeviceInfo::shared_memory`), pinned host memory
/// where it cannot be had.
fn lacks(device: &Device, kind: MemoryKind, err: &Error) -> bool {
    match (kind, err) {
        (MemoryKind::Shared, Error::InvalidArgument { reason, .. }) if !device.info().shared_memory => {
            assert!(reason.contains("shared") || reason.contains("managed"), "{device}: {reason}");
            true
        }
        (MemoryKind::Host { pinned: true }, Error::PinningFailed { .. }) => !device.can_pin_host_memory(),
        _ => false,
    }
}

/// A device that says it has shared memory allocates it, one that says not refuses it with an
/// error saying so. Where CI runs, every device but wgpu's has it (the host's is host memory,
/// PoCL has fine-grained SVM, the CUDA test double managed memory); NVIDIA's OpenCL has only
/// coarse-grained SVM and says so (seen on an H200, 2026-11-27).
#[test]
fn devices_that_say_they_have_shared_memory_allocate_it_and_the_others_refuse_it_clearly() {
    for device in devices() {
        let memory = DeviceAllocation::<u8>::new(&device, MemoryKind::Shared, 64);
        if device.info().shared_memory {
            assert!(memory.is_ok(), "{device}: {:?}", memory.err());
        } else {
            let err = memory.expect_err("a device without shared memory refuses it");
            assert!(lacks(&device, MemoryKind::Shared, &err), "{device}: {err}");
        }
        match device.backend_kind() {
            BackendKind::WGPU => assert!(!device.info().shared_memory, "{device}"),
            BackendKind::HOST => assert!(device.info().shared_memory, "{device}"),
            _ => {}
        }
    }
}

#[test]
fn allocations_of_every_kind_round_trip() {
    for device in devices() {
        for kind in KINDS {
            for len in LENGTHS {
                let Some(mut memory) = allocate(&device, kind, len) else { continue };
                let what = format!("{device} {kind:?} x {len}");
                assert_eq!((memory.len(), memory.nbytes(), memory.kind()), (len, 4 * len, kind), "{what}");
                assert!(memory.alignment().is_power_of_two() && memory.alignment() >= 64, "{what}");
                assert_eq!(memory.is_host_accessible(), kind != MemoryKind::Device);

                let data = pattern(len as u32, len);
                memory.copy_from_host(&data).unwrap();
                assert_eq!(memory.to_vec().unwrap(), data, "{what}");

                // A shorter source fills a prefix; a shorter destination takes one.
                let head = pattern(99, len / 2);
                memory.copy_from_host(&head).unwrap();
                let mut expected = data.clone();
                expected[..head.len()].copy_from_slice(&head);
                assert_eq!(memory.to_vec().unwrap(), expected, "{what}");
                let mut prefix = vec![0; len / 3];
                memory.copy_to_host(&mut prefix).unwrap();
                assert_eq!(prefix, expected[..len / 3], "{what}");

                memory.fill_prefix(len / 4, 0xDEAD_BEEF).unwrap();
                expected[..len / 4].fill(0xDEAD_BEEF);
                assert_eq!(memory.to_vec().unwrap(), expected, "{what}");
                memory.fill(7).unwrap();
                assert_eq!(memory.to_vec().unwrap(), vec![7; len], "{what}");

                if kind.host_accessible() {
                    assert_eq!(memory.host_slice().unwrap(), vec![7; len], "{what}");
                    memory.host_slice_mut().unwrap().copy_from_slice(&data);
                    assert_eq!(memory.to_vec().unwrap(), data, "{what}: a host write is the memory");
                } else {
                    let err = memory.host_slice().unwrap_err();
                    assert!(err.to_string().contains("not host accessible"), "{what}: {err}");
                }
                memory.prefetch(true).unwrap();
                memory.prefetch(false).unwrap();
                assert_eq!(memory.to_vec().unwrap().len(), len, "{what}: prefetch keeps the data");
            }
        }
    }
}

#[test]
fn raw_handles_are_the_runtime_handles() {
    for device in devices() {
        for kind in KINDS {
            for len in [0, 100] {
                let Some(memory) = allocate(&device, kind, len) else { continue };
                // SAFETY: the handle is only inspected.
                let raw = unsafe { memory.raw() };
                let empty = match raw {
                    RawMemory::Host(p) => {
                        assert!(
                            matches!(kind, MemoryKind::Host { .. })
                                || device.backend_kind() == BackendKind::HOST
                        );
                        p.is_null()
                    }
                    RawMemory::OpenCl(mem) => {
                        assert_eq!(device.backend_kind(), BackendKind::OPENCL);
                        mem.is_null()
                    }
                    RawMemory::Cuda(ptr) => {
                        assert_eq!(device.backend_kind(), BackendKind::CUDA);
                        ptr == 0
                    }
                    RawMemory::Wgpu(buffer) => {
                        assert_eq!(device.backend_kind(), BackendKind::WGPU);
                        buffer.is_null()
                    }
                    #[cfg(feature = "loopback")]
                    RawMemory::Loopback(address) => {
                        assert_eq!(device.backend_kind(), BackendKind::LOOPBACK);
                        address == 0
                    }
                    other => panic!("{device}: unexpected {other:?}"),
                };
                assert_eq!(empty, len == 0, "{device} {kind:?} x {len}: {raw:?}");
            }
        }
    }
}

/// Every pair of (device, kind), both directions: same device on the device, devices that
/// can peer to peer, others through the host.
#[test]
fn copies_between_every_kind_and_device() {
    let places: Vec<(Device, MemoryKind)> =
        devices().into_iter().flat_map(|d| KINDS.map(|k| (d.clone(), k))).collect();
    let len = 3000;
    for (i, (from_device, from_kind)) in places.iter().enumerate() {
        let Some(mut src) = allocate(from_device, *from_kind, len) else { continue };
        let data = pattern(i as u32, len);
        src.copy_from_host(&data).unwrap();
        for (to_device, to_kind) in &places {
            let Some(mut dst) = allocate(to_device, *to_kind, len + 5) else { continue };
            dst.fill(1).unwrap();
            dst.copy_from(&src).unwrap();
            let mut expected = data.clone();
            expected.extend([1; 5]);
            assert_eq!(
                dst.to_vec().unwrap(),
                expected,
                "{from_device} {from_kind:?} -> {to_device} {to_kind:?}"
            );

            let copy = src.to(to_device, *to_kind).unwrap();
            assert_eq!((copy.kind(), copy.device()), (*to_kind, to_device));
            assert_eq!(copy.to_vec().unwrap(), data);
        }
    }
}

#[test]
fn bad_input_is_a_clear_error_that_changes_nothing() {
    for device in devices() {
        let options = |alignment| AllocationOptions { alignment, ..AllocationOptions::default() };
        let err = Memory::with_options(&device, MemoryKind::Device, 8, options(3)).unwrap_err();
        assert!(err.to_string().contains("not a power of two"), "{err}");
        let err = Memory::with_options(&device, MemoryKind::Device, 8, options(1 << 30)).unwrap_err();
        assert!(err.to_string().contains("exceeds"), "{err}");
        let aligned = Memory::with_options(&device, MemoryKind::Device, 8, options(64)).unwrap();
        assert!(aligned.alignment() >= 64);
        let err = DeviceAllocation::<u64>::new(&device, MemoryKind::Device, usize::MAX / 4).unwrap_err();
        assert!(err.to_string().contains("overflow"), "{err}");

        let mut memory = DeviceAllocation::<u32>::new(&device, MemoryKind::Device, 10).unwrap();
        let data = pattern(5, 10);
        memory.copy_from_host(&data).unwrap();
        let too_long = pattern(6, 11);
        assert!(matches!(
            memory.copy_from_host(&too_long),
            Err(Error::LengthMismatch { expected: 10, actual: 11, .. })
        ));
        assert!(matches!(memory.copy_to_host(&mut [0; 11]), Err(Error::LengthMismatch { .. })));
        assert!(matches!(memory.fill_prefix(11, 0), Err(Error::LengthMismatch { .. })));
        let small = DeviceAllocation::<u32>::new(&device, MemoryKind::Device, 3).unwrap();
        assert!(matches!(memory.copy_prefix_from(&small, 4), Err(Error::LengthMismatch { .. })));
        let mut small = small;
        assert!(matches!(small.copy_from(&memory), Err(Error::LengthMismatch { .. })));
        assert_eq!(memory.to_vec().unwrap(), data, "{device}: rejected calls changed the memory");

        let mut buffer = DeviceBuffer::from_host(&device, b"abc").unwrap();
        assert!(matches!(buffer.copy_from_host(b"abcd"), Err(Error::LengthMismatch { .. })));
        assert!(buffer.copy_to_host(&mut [0; 2]).is_err());
        assert_eq!(buffer.to_vec().unwrap(), b"abc");
    }
}

#[test]
fn memory_comes_from_the_resource_and_goes_back() {
    for device in devices() {
        let limit = Arc::new(LimitingResource::new(DirectResource::shared(), 1 << 20));
        let options = || AllocationOptions { resource: Some(limit.clone()), alignment: 0 };
        let a = Memory::with_options(&device, MemoryKind::Device, 1000, options()).unwrap();
        let b = DeviceBuffer::with_options(&device, MemoryKind::Device, 500, options()).unwrap();
        assert_eq!(limit.held(), 1500);
        let err = Memory::with_options(&device, MemoryKind::Device, 1 << 20, options()).unwrap_err();
        assert!(err.is_out_of_memory(), "{err}");
        assert_eq!(limit.held(), 1500, "a failed allocation holds nothing");
        drop((a, b));
        assert_eq!(limit.held(), 0, "{device}: dropped memory goes back");
    }
}

#[test]
fn device_buffers_resize_reserve_and_shrink_as_rmm_says() {
    for device in devices() {
        for kind in KINDS {
            let options = AllocationOptions::default();
            let mut buffer = match DeviceBuffer::with_options(&device, kind, 0, options) {
                Ok(buffer) => buffer,
                Err(err) if lacks(&device, kind, &err) => continue,
                Err(err) => panic!("{err}"),
            };
            let what = format!("{device} {kind:?}");
            assert_eq!((buffer.size(), buffer.capacity()), (0, 0), "{what}");
            assert_eq!(buffer.to_vec().unwrap(), b"", "{what}");

            buffer.resize(10).unwrap();
            assert_eq!((buffer.size(), buffer.capacity()), (10, 10));
            buffer.copy_from_host(b"0123456789").unwrap();
            // SAFETY: handles are only compared.
            let before = unsafe { buffer.raw() };
            buffer.resize(4).unwrap();
            assert_eq!((buffer.size(), buffer.capacity()), (4, 10), "{what}: shrinking keeps the capacity");
            assert_eq!(
                // SAFETY: (test) the handle is only formatted.
                format!("{:?}", unsafe { buffer.raw() }),
                format!("{before:?}"),
                "{what}: nothing moved"
            );
            assert_eq!(buffer.to_vec().unwrap(), b"0123");
            buffer.resize(8).unwrap();
            assert_eq!((buffer.size(), buffer.capacity()), (8, 10));
            assert_eq!(&buffer.to_vec().unwrap()[..4], b"0123");

            buffer.reserve(5).unwrap();
            assert_eq!(buffer.capacity(), 10, "{what}: reserve never shrinks");
            buffer.reserve(64).unwrap();
            assert_eq!((buffer.size(), buffer.capacity()), (8, 64));
            assert_eq!(&buffer.to_vec().unwrap()[..4], b"0123", "{what}: reserve keeps the contents");

            buffer.resize(100).unwrap();
            assert_eq!((buffer.size(), buffer.capacity()), (100, 100), "{what}: growth is exact");
            assert_eq!(&buffer.to_vec().unwrap()[..4], b"0123");
            buffer.resize(3).unwrap();
            buffer.shrink_to_fit().unwrap();
            assert_eq!((buffer.size(), buffer.capacity()), (3, 3));
            assert_eq!(buffer.to_vec().unwrap(), b"012");

            let copy = buffer.try_clone().unwrap();
            assert_eq!((copy.size(), copy.kind(), copy.device()), (3, kind, &device));
            // SAFETY: handles are only compared.
            assert_ne!(format!("{:?}", unsafe { copy.raw() }), format!("{:?}", unsafe { buffer.raw() }));
            buffer.fill(b'x').unwrap();
            assert_eq!(copy.to_vec().unwrap(), b"012", "{what}: the copy is its own memory");
            assert_eq!(buffer.to_vec().unwrap(), b"xxx");

            let mut out = vec![9; 5];
            buffer.copy_to_host(&mut out).unwrap();
            assert_eq!(out, b"xxx\x09\x09", "{what}: a longer destination gets the size's bytes");
            let mut other = DeviceBuffer::new(&device, 5).unwrap();
            other.fill(b'-').unwrap();
            other.copy_from(&copy).unwrap();
            assert_eq!(other.to_vec().unwrap(), b"012--", "{what}: a shorter source fills a prefix");
        }
    }
}

/// A deterministic generator (the suite must mean the same on every run).
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 33) % n as u64) as usize
    }
}

/// 400 random resizes, reserves, shrinks, writes and fills, compared after each step with a
/// vector and RMM's capacity rules.
#[test]
fn device_buffers_follow_a_model_under_random_resizing() {
    for device in devices() {
        let mut rng = Lcg(device.name().len() as u64);
        let mut buffer = DeviceBuffer::new(&device, 0).unwrap();
        let (mut model, mut capacity) = (Vec::<u8>::new(), 0usize);
        for step in 0..400 {
            let n = rng.below(5000);
            match rng.below(5) {
                0 => {
                    buffer.resize(n).unwrap();
                    if n > capacity {
                        capacity = n;
                    }
                    // New bytes are unspecified: the model learns them from the buffer.
                    let now = buffer.to_vec().unwrap();
                    assert_eq!(
                        now[..model.len().min(n)],
                        model[..model.len().min(n)],
                        "{device} step {step}"
                    );
                    model = now;
                }
                1 => {
                    buffer.reserve(n).unwrap();
                    capacity = capacity.max(n);
                }
                2 => {
                    buffer.shrink_to_fit().unwrap();
                    capacity = model.len();
                }
                3 => {
                    let data: Vec<u8> = (0..n.min(model.len())).map(|i| (i * 7 + step) as u8).collect();
                    buffer.copy_from_host(&data).unwrap();
                    model[..data.len()].copy_from_slice(&data);
                }
                _ => {
                    buffer.fill(step as u8).unwrap();
                    model.fill(step as u8);
                }
            }
            assert_eq!((buffer.size(), buffer.capacity()), (model.len(), capacity), "{device} step {step}");
            assert_eq!(buffer.to_vec().unwrap(), model, "{device} step {step}");
        }
    }
}

/// Direct memory on a faulty wrapper of `device`.
fn faulty(device: &Device) -> (Device, Arc<lazybuf::testing::FaultPlan>, AllocationOptions) {
    let (faulty, plan) = FaultyDevice::wrap(device);
    let options = AllocationOptions { resource: Some(DirectResource::shared()), alignment: 0 };
    (faulty, plan, options)
}

#[test]
fn failed_allocations_change_nothing() {
    for device in devices() {
        let (device, plan, options) = faulty(&device);
        for kind in KINDS {
            plan.fail_allocation_in(1);
            let err = Memory::with_options(&device, kind, 100, options.clone()).unwrap_err();
            assert!(matches!(err, Error::InjectedFault { .. }), "{device} {kind:?}: {err}");
        }
        let mut buffer =
            DeviceBuffer::from_host_with(&device, MemoryKind::Device, b"keep me", options.clone()).unwrap();
        type Grow = fn(&mut DeviceBuffer) -> lazybuf::Result<()>;
        let grows: [(&str, Grow); 3] = [
            ("resize", |b| b.resize(1000)),
            ("reserve", |b| b.reserve(1000)),
            ("shrink_to_fit", |b| {
                b.resize(3)?;
                b.shrink_to_fit()
            }),
        ];
        for (name, grow) in grows {
            buffer.resize(7).unwrap();
            buffer.reserve(7).unwrap();
            let (size, capacity) = (buffer.size(), buffer.capacity());
            plan.fail_allocation_in(1);
            let err = grow(&mut buffer).unwrap_err();
            assert!(matches!(err, Error::InjectedFault { .. }), "{device} {name}: {err}");
            assert_eq!(&buffer.to_vec().unwrap()[..3], b"kee", "{device} {name}");
            if name != "shrink_to_fit" {
                assert_eq!((buffer.size(), buffer.capacity()), (size, capacity), "{device} {name}");
                assert_eq!(buffer.to_vec().unwrap(), b"keep me");
            }
            plan.fail_allocation_in(1);
            assert!(buffer.try_clone().is_err());
            plan.disarm();
        }
    }
}

#[test]
fn failed_copies_leave_sources_and_other_bytes() {
    for deferred in [false, true] {
        for device in devices() {
            let (device, plan, options) = faulty(&device);
            plan.defer_copy_faults(deferred);
            for kind in [MemoryKind::Device, MemoryKind::Shared] {
                let what = format!("{device} {kind:?} deferred={deferred}");
                let mut buffer =
                    match DeviceBuffer::from_host_with(&device, kind, &[5u8; 100], options.clone()) {
                        Ok(buffer) => buffer,
                        Err(err) if lacks(&device, kind, &err) => continue,
                        Err(err) => panic!("{what}: {err}"),
                    };
                buffer.reserve(200).unwrap();

                // Reallocations: the copy into the new memory fails, the old stays.
                for op in [0, 1, 2] {
                    plan.fail_copy_in(1);
                    let result = match op {
                        0 => buffer.resize(300),
                        1 => buffer.shrink_to_fit(),
                        _ => buffer.try_clone().map(drop),
                    };
                    assert!(matches!(result, Err(Error::InjectedFault { .. })), "{what} op {op}: {result:?}");
                    assert_eq!((buffer.size(), buffer.capacity()), (100, 200), "{what} op {op}");
                    assert_eq!(buffer.to_vec().unwrap(), vec![5; 100], "{what} op {op}");
                }

                // Writes: bytes outside the range written stay.
                plan.fail_copy_in(1);
                assert!(buffer.copy_from_host(&[1; 10]).is_err(), "{what}");
                assert_eq!(buffer.to_vec().unwrap()[10..], [5; 90], "{what}: copy_from_host");
                let mut memory = Memory::with_options(&device, kind, 100, options.clone()).unwrap();
                memory.fill(5).unwrap();
                plan.fail_copy_in(1);
                assert!(memory.fill_prefix(10, 1).is_err(), "{what}");
                assert_eq!(memory.to_vec().unwrap()[10..], [5; 90], "{what}: fill");
                let source = Memory::with_options(&device, kind, 10, options.clone()).unwrap();
                memory.fill(5).unwrap();
                plan.fail_copy_in(1);
                assert!(memory.copy_from(&source).is_err(), "{what}");
                assert_eq!(memory.to_vec().unwrap()[10..], [5; 90], "{what}: copy_from");

                // Reads: the memory read stays.
                plan.fail_copy_in(1);
                assert!(memory.to_vec().is_err(), "{what}");
                assert_eq!(memory.to_vec().unwrap()[10..], [5; 90], "{what}: a failed read");
                plan.disarm();
            }
        }
    }
}

use crate::cuda_common;

/// Prefetching shared memory moves its pages where it is asked to (the CUDA test double
/// records where managed memory was last prefetched to).
#[test]
fn shared_memory_prefetches_on_cuda() {
    let Some(devices) = cuda_common::double_devices("shared_memory_prefetches_on_cuda") else { return };
    for (ordinal, device) in devices.iter().enumerate() {
        // Fresh memory (a cached block may have been prefetched before).
        let direct = AllocationOptions { resource: Some(DirectResource::shared()), alignment: 0 };
        let memory = Memory::with_options(device, MemoryKind::Shared, 4096, direct).unwrap();
        // SAFETY: the handle is only read.
        let RawMemory::Cuda(ptr) = (unsafe { memory.raw() }) else { panic!("not CUDA memory") };
        assert_eq!(cuda_common::prefetch_location(ptr), -2, "never prefetched yet");
        memory.prefetch(true).unwrap();
        assert_eq!(cuda_common::prefetch_location(ptr), ordinal as i64);
        memory.prefetch(false).unwrap();
        assert_eq!(cuda_common::prefetch_location(ptr), -1, "the host");
        let device_memory = Memory::new(device, MemoryKind::Device, 64).unwrap();
        device_memory.prefetch(true).unwrap();
    }
}

/// The resources' default is reached when no resource is given: memory made with none goes
/// through the device's current resource.
#[test]
fn memory_without_a_resource_uses_the_devices_current_one() {
    let device = Device::host();
    let memory = Memory::new(&device, MemoryKind::Device, 10).unwrap();
    let resource: &Arc<dyn MemoryResource> = memory.resource().unwrap();
    assert!(Arc::ptr_eq(resource, &lazybuf::resource::default_resource(&device)));
}

/// Memory the caller owns (a foreign allocation's raw handle) is copied from and to like any
/// other, is never freed by lazybuf, and is refused by devices it does not belong to.
#[test]
fn borrowed_memory_is_copied_and_never_freed() {
    let all = devices();
    for device in &all {
        let mut owner = Memory::new(device, MemoryKind::Device, 100).unwrap();
        owner.copy_from_host(&[3; 100]).unwrap();
        if device.backend_kind() == BackendKind::WGPU {
            // wgpu buffers are not borrowed (yet): refused, clearly, before any use.
            // SAFETY: `owner` outlives the call.
            let err = unsafe { Memory::borrowed(device, owner.raw(), 100) }.unwrap_err();
            assert!(err.to_string().contains("did not allocate"), "{device}: {err}");
            continue;
        }
        // SAFETY: `owner` outlives the borrowed memory and nothing else uses it meanwhile.
        let mut borrowed = unsafe { Memory::borrowed(device, owner.raw(), 100) }.unwrap();
        assert!(borrowed.resource().is_none());
        assert_eq!(borrowed.to_vec().unwrap(), vec![3; 100], "{device}");
        borrowed.copy_from_host(&[4; 10]).unwrap();
        let mut copy = Memory::new(device, MemoryKind::Host { pinned: false }, 100).unwrap();
        copy.copy_from(&borrowed).unwrap();
        drop(borrowed);
        assert_eq!(owner.to_vec().unwrap()[..11], [4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 3], "{device}: still there");
        assert_eq!(copy.to_vec().unwrap(), owner.to_vec().unwrap());
        for other in all.iter().filter(|d| *d != device) {
            // SAFETY: a foreign handle must be refused before any use.
            let refused = unsafe { Memory::borrowed(other, owner.raw(), 100) };
            assert!(refused.is_err(), "{other} took memory of {device}");
        }
    }
}

/// A reallocation gives the old allocation back at once (RMM), unless an `AllocationHold`
/// taken on it lives: then it is kept until the last hold is dropped, also after the buffer is
/// gone, with its bytes intact. Only held allocations outlive a reallocation.
#[test]
fn held_allocations_outlive_reallocation_and_nothing_else_does() {
    for device in devices() {
        let tracking = Arc::new(lazybuf::TrackingResource::new(DirectResource::shared(), false));
        let options = AllocationOptions { resource: Some(tracking.clone()), alignment: 0 };
        let mut buffer =
            DeviceBuffer::from_host_with(&device, MemoryKind::Device, &[7u8; 1000], options).unwrap();
        // Without holds, growing 10 times leaves only the last allocation.
        for n in 1..=10 {
            buffer.resize(1000 + n * 100).unwrap();
        }
        assert_eq!(tracking.allocated_bytes(), buffer.capacity() as u64, "{device}");

        // A hold keeps the allocation it was taken on (and only that one) through reallocations.
        let held_capacity = buffer.capacity() as u64;
        // SAFETY: the handle is only compared, never used to reach the memory.
        let held_raw = unsafe { buffer.raw() }.identity();
        let hold = buffer.hold();
        let second = hold.clone();
        for n in 1..=10 {
            buffer.resize(3000 + n * 100).unwrap();
        }
        assert_eq!(tracking.allocated_bytes(), held_capacity + buffer.capacity() as u64, "{device}");
        let outstanding: Vec<usize> = tracking.outstanding().iter().map(|o| o.address).collect();
        assert!(outstanding.contains(&held_raw), "{device}: the held allocation is still allocated");
        drop(hold);
        assert_eq!(tracking.allocated_bytes(), held_capacity + buffer.capacity() as u64, "{device}");
        drop(second);
        assert_eq!(tracking.allocated_bytes(), buffer.capacity() as u64, "{device}: the last hold freed it");

        // A hold outlives the buffer; the bytes stay as they were until it is dropped.
        let hold = buffer.hold();
        let capacity = buffer.capacity() as u64;
        drop(buffer);
        assert_eq!(tracking.allocated_bytes(), capacity, "{device}: kept for the hold");
        drop(hold);
        assert_eq!(tracking.allocated_bytes(), 0, "{device}");

        // A buffer dropped with no hold alive gives its memory back at once.
        let options = AllocationOptions { resource: Some(tracking.clone()), alignment: 0 };
        let mut buffer = DeviceBuffer::with_options(&device, MemoryKind::Device, 64, options).unwrap();
        drop(buffer.hold());
        buffer.resize(128).unwrap();
        assert_eq!(tracking.allocated_bytes(), 128, "{device}");
        drop(buffer);
        assert_eq!(tracking.allocated_bytes(), 0, "{device}");
    }
}
