//! Bad input (SPEC section 6, the parts that apply to the Rust core): each gets a clear error
//! naming what was expected, and nothing already stored is lost.

mod common;

use common::pattern;
use lazybuf::{BackendKind, BufferState, Device, Error, UnifiedBuffer};

#[test]
fn shapes_whose_count_or_size_overflows() {
    let host = Device::host();
    let err = UnifiedBuffer::<u8>::on(&[isize::MAX as usize, 3], &host).unwrap_err();
    assert!(matches!(err, Error::InvalidShape { .. }), "{err}");
    assert!(err.to_string().contains("element count overflows"), "{err}");
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
        devices.push(Device::from_backend(std::sync::Arc::new(twin)));
    }
    devices
}

/// A backend handed memory or a stream of another device (another backend, or another
/// context of its own backend) refuses it with an error naming what it expected, before any
/// runtime call (streams: every backend but the host's, which has none to misorder).
#[test]
fn a_backend_refuses_memory_and_streams_of_another_device() {
    let devices = devices_and_opencl_twins();
    for ours in &devices {
        let backend = ours.backend();
        let stream = ours.stream();
        let (mine, mut other) = (backend.allocate(64).unwrap(), backend.allocate(64).unwrap());
        for theirs in devices.iter().filter(|d| d.id() != ours.id()) {
            let foreign = theirs.backend().allocate(64).unwrap();
            let err = backend.copy(stream.handle(), &foreign, &mut other, 64).unwrap_err();
            assert!(matches!(err, Error::InvalidArgument { .. }), "{ours} given memory of {theirs}: {err}");
            assert!(err.to_string().contains("expected memory of"), "{ours} given memory of {theirs}: {err}");
            // The host device runs every call at once, on no stream, so any stream will do
            // there (nothing can be misordered); that check stays off its hot path.
            if ours.backend_kind() == BackendKind::HOST {
                continue;
            }
            let their_stream = theirs.stream();
            let err = backend.copy(their_stream.handle(), &mine, &mut other, 64).unwrap_err();
            assert!(matches!(err, Error::InvalidArgument { .. }), "{ours} given a stream of {theirs}: {err}");
            assert!(
                err.to_string().contains("expected a stream of"),
                "{ours} given a stream of {theirs}: {err}"
            );
        }
    }
}
