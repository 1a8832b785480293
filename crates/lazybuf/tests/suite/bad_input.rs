//! Bad input (SPEC section 6, the parts that apply to the Rust core): each gets a clear error
//! naming what was expected, and nothing already stored is lost.

use crate::common;

use common::pattern;
use lazybuf::backend::HostSpan;
use lazybuf::{BackendKind, BufferState, Device, Error, UnifiedBuffer};

#[test]
fn shapes_whose_count_or_size_overflows() {
    let host = Device::host();
    let err = UnifiedBuffer::<u8>::on(&[isize::MAX as usize, 3], &host).unwrap_err();
    assert!(matches!(err, Error::InvalidShape { .. }), "{err}");
    assert!(err.to_string().contains("exceed the largest possible allocation"), "{err}");
    let err = UnifiedBuffer::<f64>::on(&[1 << 61], &host).unwrap_err();
    assert!(err.to_string().contains("exceed the largest possible allocation"), "{err}");
    assert!(!err.is_retryable());
}

#[test]
fn copies_of_the_wrong_length() {
    for device in common::devices() {
        let mut buf = UnifiedBuffer::from_slice(&pattern(1, 10), &device).unwrap();
        let err = buf.copy_from(&[1, 2, 3]).unwrap_err();
        assert_eq!(err.to_string(), "length mismatch in copy_from: expected 10 elements, got 3");
        let err = buf.copy_to(&mut [0; 11]).unwrap_err();
        assert_eq!(err.to_string(), "length mismatch in copy_to: expected 10 elements, got 11");
        let err = buf.device().unwrap().read_into(&mut [0; 9]).unwrap_err();
        assert!(matches!(err, Error::LengthMismatch { expected: 10, actual: 9, .. }), "{err}");
        let err = buf.device_mut().unwrap().write_from(&[0; 12]).unwrap_err();
        assert!(matches!(err, Error::LengthMismatch { expected: 10, actual: 12, .. }), "{err}");
        assert_eq!(buf.to_vec().unwrap(), pattern(1, 10), "nothing stored was lost on {device}");
    }
    let err = UnifiedBuffer::from_vec(vec![1u32, 2, 3], &[2, 2], &Device::host()).unwrap_err();
    assert!(matches!(err, Error::LengthMismatch { expected: 4, actual: 3, .. }), "{err}");
}

#[test]
fn wrapping_an_untyped_buffer_of_another_size() {
    let raw = lazybuf::RawBuffer::new(12, Device::host(), false);
    let err = UnifiedBuffer::<f64>::from_raw(&[2], raw).unwrap_err();
    assert!(matches!(err, Error::LengthMismatch { expected: 12, actual: 16, .. }), "{err}");
}

/// A hostile pass: every length mismatch said "elements", also for byte counts ("expected 7
/// elements, got 8" for a 7-byte raw buffer), and from_vec named copy_from, a call the user never
/// made. Each message names its own call and what its lengths count.
#[test]
fn length_mismatches_name_their_call_and_unit() {
    let raw = lazybuf::RawBuffer::new(7, Device::host(), false);
    let err = UnifiedBuffer::<f32>::from_raw(&[2], raw).unwrap_err();
    assert_eq!(err.to_string(), "length mismatch in from_raw: expected 7 bytes, got 8");
    assert!(matches!(err, Error::LengthMismatch { expected: 7, actual: 8, unit: "bytes", .. }), "{err}");

    let err = UnifiedBuffer::from_vec(vec![1u32, 2, 3], &[2, 2], &Device::host()).unwrap_err();
    assert_eq!(err.to_string(), "length mismatch in from_vec: expected 4 elements, got 3");
    let err = UnifiedBuffer::from_vec(vec![0.5f64; 5], &[2], &Device::host()).unwrap_err();
    assert_eq!(err.to_string(), "length mismatch in from_vec: expected 2 elements, got 5");
    assert_eq!(
        UnifiedBuffer::from_vec(vec![1u16, 2], &[2], &Device::host()).unwrap().to_vec().unwrap(),
        [1, 2]
    );

    for device in common::devices() {
        // Memory and streams count bytes; typed allocations and views count elements.
        let stream = device.stream();
        let (mut a, b) = (common::device_memory(&device, 16), common::device_memory(&device, 8));
        let err = stream.fill(&mut a, &[0], 17).unwrap_err();
        assert_eq!(err.to_string(), "length mismatch in fill: expected 16 bytes, got 17", "{device}");
        let err = stream.copy(&b, &mut a, 12).unwrap_err();
        assert_eq!(err.to_string(), "length mismatch in copy: expected 8 bytes, got 12", "{device}");
        let mut bytes = lazybuf::DeviceBuffer::from_host(&device, b"abc").unwrap();
        let err = bytes.copy_from_host(b"abcd").unwrap_err();
        assert_eq!(err.to_string(), "length mismatch in copy_from_host: expected 3 bytes, got 4", "{device}");
        let mut typed =
            lazybuf::DeviceAllocation::<u32>::new(&device, lazybuf::MemoryKind::Device, 10).unwrap();
        let err = typed.copy_from_host(&[0; 11]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "length mismatch in copy_from_host: expected 10 elements, got 11",
            "{device}"
        );
        let mut buf = UnifiedBuffer::from_slice(&pattern(1, 10), &device).unwrap();
        let err = buf.device().unwrap().read_into(&mut [0; 9]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "length mismatch in DeviceView::read_into: expected 10 elements, got 9",
            "{device}"
        );
    }
}

#[test]
fn host_allocations_larger_than_memory_fail_cleanly() {
    // 64 TiB: no machine here has it, so the allocation must fail, not abort.
    let mut buf = UnifiedBuffer::<u8>::on(&[1 << 46], &Device::host()).unwrap();
    let err = buf.host_mut().unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    assert!(err.to_string().contains("could not allocate 70368744177664 bytes"), "{err}");
    assert_eq!(buf.state(), BufferState::Uninitialized);
}

#[test]
fn device_allocations_larger_than_the_device_fail_cleanly() {
    for device in common::devices_of(BackendKind::OPENCL) {
        let too_big = device.info().total_memory as usize * 2;
        let mut buf = UnifiedBuffer::<u8>::on(&[too_big], &device).unwrap();
        let err = buf.device_overwrite().unwrap_err();
        // A zero-copy device asks for the host block first, which the host refuses up front
        // (beyond its memory and swap); other devices refuse the device allocation.
        let text = err.to_string();
        assert!(
            text.contains("exceed the largest allocation") || text.contains("out of memory on host"),
            "{device}: {err}"
        );
        assert!(text.contains(&too_big.to_string()), "the error names the size: {err}");
        assert_eq!(buf.state(), BufferState::Uninitialized);
    }
}

#[test]
fn device_selectors_that_name_nothing() {
    let err = lazybuf::select_device("cuda:7").unwrap_err();
    assert!(matches!(err, Error::DeviceNotFound { .. }), "{err}");
    let err = lazybuf::select_device("tpu").unwrap_err();
    let text = err.to_string();
    assert!(text.contains("expected one of gpu,") && text.contains("host[:N]"), "{err}");
    #[cfg(feature = "cuda")]
    assert!(text.contains("cuda[:N]"), "{err}");
    #[cfg(feature = "opencl")]
    assert!(text.contains("opencl[:N]"), "{err}");
    let err = lazybuf::select_device("opencl:-1").unwrap_err();
    assert!(err.to_string().contains("non-negative integer index"), "{err}");
}

/// A memory resource that breaks its contract: blocks shorter than asked for.
#[derive(Debug)]
struct Stingy;

impl lazybuf::MemoryResource for Stingy {
    fn allocate(
        &self,
        device: &Device,
        kind: lazybuf::MemoryKind,
        bytes: usize,
        stream: &lazybuf::Stream,
    ) -> lazybuf::Result<lazybuf::Block> {
        lazybuf::DirectResource.allocate(device, kind, bytes / 2, stream)
    }

    fn deallocate(
        &self,
        device: &Device,
        block: lazybuf::Block,
        stream: &lazybuf::Stream,
        ready: lazybuf::Ticket,
    ) {
        lazybuf::DirectResource.deallocate(device, block, stream, ready);
    }
}

#[test]
fn a_resource_that_returns_short_blocks_is_an_error_not_a_panic() {
    for device in common::devices() {
        let options = lazybuf::BufferOptions {
            device: Some(device.clone()),
            resource: Some(std::sync::Arc::new(Stingy)),
            ..Default::default()
        };
        let mut buf = UnifiedBuffer::<u32>::with_options(&[1000], options).unwrap();
        let err = buf.host_mut().unwrap_err();
        assert!(
            err.to_string().contains("returned a host block of 2000 bytes for a request of 4000"),
            "{err}"
        );
        assert_eq!(buf.state(), BufferState::Uninitialized);
        if !device.is_zero_copy(4000) {
            let err = buf.device_overwrite().unwrap_err();
            assert!(err.to_string().contains("device allocation of 2000 bytes"), "{device}: {err}");
        }
    }
}

/// A memory resource that breaks its contract: host memory whatever was asked for.
#[derive(Debug)]
struct HostOnly;

impl lazybuf::MemoryResource for HostOnly {
    fn allocate(
        &self,
        device: &Device,
        _: lazybuf::MemoryKind,
        bytes: usize,
        stream: &lazybuf::Stream,
    ) -> lazybuf::Result<lazybuf::Block> {
        lazybuf::DirectResource.allocate(device, lazybuf::MemoryKind::Host { pinned: false }, bytes, stream)
    }

    fn deallocate(
        &self,
        device: &Device,
        block: lazybuf::Block,
        stream: &lazybuf::Stream,
        ready: lazybuf::Ticket,
    ) {
        lazybuf::DirectResource.deallocate(device, block, stream, ready);
    }
}

#[test]
fn a_resource_that_returns_the_wrong_kind_is_an_error_not_a_panic() {
    use lazybuf::MemoryResource;
    for device in common::devices() {
        let err = HostOnly.allocate_device(&device, 64, &device.stream()).unwrap_err();
        assert!(err.to_string().contains("expected a device allocation"), "{device}: {err}");
        let options = lazybuf::BufferOptions {
            device: Some(device.clone()),
            resource: Some(std::sync::Arc::new(HostOnly)),
            ..Default::default()
        };
        let mut buf = UnifiedBuffer::<u32>::with_options(&[1000], options).unwrap();
        buf.host_mut().unwrap().fill(7);
        if !device.is_zero_copy(4000) {
            let err = buf.device().unwrap_err();
            assert!(err.to_string().contains("expected a device allocation"), "{device}: {err}");
        }
        // Nothing was lost: the host copy is still the data.
        assert!(buf.host().unwrap().iter().all(|&x| x == 7));
    }
}

#[test]
fn a_dimension_beyond_isize_is_refused_even_next_to_a_zero() {
    let err = UnifiedBuffer::<f32>::on(&[0, 1 << 63], &Device::host()).unwrap_err();
    assert!(matches!(err, Error::InvalidShape { .. }) && err.to_string().contains("fit isize"), "{err}");
}

/// Every device, plus a second opening of each OpenCL device (the same hardware in a context
/// of its own), so that two devices of one backend are always among the pairs.
fn devices_and_opencl_twins() -> Vec<Device> {
    use lazybuf::backend::RawDevice;
    use lazybuf::backend::opencl::{OpenClBackend, OpenClOptions};
    let mut devices = common::devices();
    for device in common::devices_of(BackendKind::OPENCL) {
        // SAFETY: (test) reading the device id of a live device.
        let RawDevice::OpenCl { device: id, .. } = (unsafe { device.raw() }) else { continue };
        // SAFETY: (test) `id` is the device id of a live OpenCL device.
        let twin = unsafe { OpenClBackend::open_with(id, OpenClOptions::default()) }.unwrap();
        devices.push(Device::open(twin));
    }
    devices
}

/// A stream handed memory of another device (another backend, or another context of its own
/// backend) refuses it with an error naming what it expected, before any runtime call. A
/// stream of another device cannot be handed at all: a [`lazybuf::Stream`] carries its device.
#[test]
fn a_stream_refuses_memory_of_another_device() {
    let devices = devices_and_opencl_twins();
    for ours in &devices {
        let stream = ours.stream();
        let (mine, mut other) = (common::device_memory(ours, 64), common::device_memory(ours, 64));
        for theirs in devices.iter().filter(|d| d.id() != ours.id()) {
            let mut foreign = common::device_memory(theirs, 64);
            for err in [
                stream.copy(&foreign, &mut other, 64).unwrap_err(),
                stream.copy(&mine, &mut foreign, 64).unwrap_err(),
                stream.fill(&mut foreign, &[0], 64).unwrap_err(),
                // SAFETY: (test) refused before anything is enqueued.
                unsafe { stream.upload(HostSpan::of_slice(&[0; 64]), &mut foreign) }.unwrap_err(),
                // Empty operations are checked too.
                stream.fill(&mut foreign, &[0], 0).unwrap_err(),
            ] {
                assert!(
                    matches!(err, Error::InvalidArgument { .. }),
                    "{ours} given memory of {theirs}: {err}"
                );
                assert!(
                    err.to_string().contains("expected memory of"),
                    "{ours} given memory of {theirs}: {err}"
                );
            }
        }
    }
}

/// One fill-pattern rule on every device: one element of 1, 2, 4, 8 or 16 bytes, the length a
/// multiple of it. Anything else is refused with the same clear error, before any runtime call.
#[test]
fn one_fill_pattern_rule_on_every_device() {
    for device in common::devices() {
        let stream = device.stream();
        let mut memory = common::device_memory(&device, 96);
        for len in [1usize, 2, 4, 8, 16] {
            let pattern: Vec<u8> = (1..=len as u8).collect();
            stream.fill(&mut memory, &pattern, 96).unwrap().wait().unwrap();
            let mut out = vec![0u8; 96];
            // SAFETY: (test) `out` lives until the ticket is waited for.
            unsafe { stream.download(&memory, HostSpan::of_mut_slice(&mut out)) }.unwrap().wait().unwrap();
            assert!(out.chunks(len).all(|c| c == pattern), "{len}-byte pattern on {device}: {out:?}");
        }
        for (pattern, bytes) in [(vec![1u8; 3], 96), (vec![1u8; 32], 96), (vec![], 96), (vec![1u8; 4], 94)] {
            let err = stream.fill(&mut memory, &pattern, bytes).unwrap_err();
            assert!(matches!(err, Error::InvalidArgument { .. }), "{device}: {err}");
            assert!(
                err.to_string().contains("expected a pattern of 1, 2, 4, 8 or 16 bytes whose length divides"),
                "{}-byte pattern over {bytes} bytes on {device}: {err}",
                pattern.len()
            );
        }
    }
}

/// Zero-length operations complete at once on every device, touching nothing (even on an
/// empty allocation, which has no runtime buffer on wgpu); lengths beyond the memory are a
/// length mismatch.
#[test]
fn zero_length_operations_complete_on_every_device() {
    for device in common::devices() {
        let stream = device.stream();
        for size in [0usize, 16] {
            let (mut a, mut b) = (common::device_memory(&device, size), common::device_memory(&device, size));
            let tickets = [
                // SAFETY: (test) the spans are empty.
                unsafe { stream.upload(HostSpan::of_slice(&[]), &mut a) }.unwrap(),
                // SAFETY: (test) the spans are empty.
                unsafe { stream.download(&a, HostSpan::of_mut_slice(&mut [])) }.unwrap(),
                stream.fill(&mut a, &[7], 0).unwrap(),
                stream.fill(&mut a, &[1, 2, 3, 4], 0).unwrap(),
                stream.copy(&a, &mut b, 0).unwrap(),
                stream.prefetch(&a, true).unwrap(),
            ];
            for ticket in tickets {
                assert!(ticket.poll().unwrap(), "an empty operation on {device} is complete at once");
            }
            let err = stream.copy(&a, &mut b, size + 1).unwrap_err();
            assert!(matches!(err, Error::LengthMismatch { .. }), "{device}: {err}");
            let err = stream.fill(&mut a, &[0], size + 1).unwrap_err();
            assert!(matches!(err, Error::LengthMismatch { .. }), "{device}: {err}");
        }
    }
}
