//! The wgpu backend on a real adapter (Mesa's lavapipe Vulkan driver in CI, where
//! `LAZYBUF_REQUIRE=wgpu` makes its absence a failure):
//! - end to end: a WGSL compute shader run by the user on lazybuf's queue writes the device
//!   copy through the view's raw `wgpu::Buffer`, and the host reads the result;
//! - what the device reports, and the `wgpu`, `vulkan` and `metal` selectors;
//! - transfers, fills and copies whose length is not a multiple of 4 bytes (wgpu moves whole
//!   words) change exactly their bytes and no others; fills longer than one storage binding;
//! - pinned host memory is a clear error, not silently pageable memory;
//! - an error wgpu raises (here: a buffer the caller destroyed) is returned, never a panic, and
//!   changes nothing; a lost device (a child process destroys it) makes every call an error;
//! - free memory follows allocations; the stream's marker covers downloads in flight.
//!
//! The generic suites (contract, model, faults, bad input, streams) run on wgpu devices too.

#![cfg(feature = "wgpu")]

use crate::common;

use lazybuf::backend::wgpu::wgpu;
use lazybuf::backend::{RawDevice, RawMemory, RawStream};
use lazybuf::{BackendKind, BufferOptions, BufferState, Device, DirectResource, Error, UnifiedBuffer};

const SHADER: &str = r#"
@group(0) @binding(0) var<storage, read_write> x: array<f32>;

@compute @workgroup_size(64)
fn scale_add(@builtin(global_invocation_id) id: vec3<u32>) {
    if (id.x < arrayLength(&x)) {
        x[id.x] = x[id.x] * 2.0 + 1.0;
    }
}
"#;

fn wgpu_devices() -> Vec<Device> {
    let devices = common::devices_of(BackendKind::WGPU);
    if devices.is_empty() {
        eprintln!("SKIPPED: no wgpu device: {:?}", lazybuf::backend_status());
    }
    devices
}

/// The device's `wgpu::Device` and `wgpu::Queue`.
fn handles(device: &Device) -> (&wgpu::Device, &wgpu::Queue) {
    // SAFETY: (test) the handles are borrowed from `device`, which outlives their use here.
    let RawDevice::Wgpu { device: raw_device, queue } = (unsafe { device.raw() }) else {
        panic!("{device} is not a wgpu device");
    };
    // SAFETY: (test) the pointers come from the live device, which outlives the references.
    unsafe { (&*raw_device, &*queue) }
}

/// Runs `scale_add` (x = 2x + 1) over `buffer` on the device's queue, as a user would.
fn run_scale_add(device: &Device, buffer: &wgpu::Buffer, n: u32) {
    let (gpu, queue) = handles(device);
    let module = gpu.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some("test"),
        source: wgpu::ShaderSource::Wgsl(SHADER.into()),
    });
    let pipeline = gpu.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: None,
        layout: None,
        module: &module,
        entry_point: Some("scale_add"),
        compilation_options: Default::default(),
        cache: None,
    });
    let group = gpu.create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout: &pipeline.get_bind_group_layout(0),
        entries: &[wgpu::BindGroupEntry { binding: 0, resource: buffer.as_entire_binding() }],
    });
    let mut encoder = gpu.create_command_encoder(&Default::default());
    {
        let mut pass = encoder.begin_compute_pass(&Default::default());
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &group, &[]);
        pass.dispatch_workgroups(n.div_ceil(64), 1, 1);
    }
    // Submitted on lazybuf's queue: lazybuf's later copies run after the shader.
    queue.submit([encoder.finish()]);
}

#[test]
fn a_wgsl_shader_writes_the_device_copy_and_the_host_reads_it() {
    for device in wgpu_devices() {
        for n in [1000usize, 1 << 20] {
            let input: Vec<f32> = (0..n).map(|i| i as f32).collect();
            let mut buf = UnifiedBuffer::from_slice(&input, &device).unwrap();
            {
                let view = buf.device_mut().unwrap();
                // SAFETY: (test) the buffer lives as long as the view, which outlives its use.
                let RawMemory::Wgpu(raw) = (unsafe { view.raw() }) else { panic!("not a wgpu buffer") };
                // SAFETY: (test) see above.
                let buffer = unsafe { &*raw };
                assert!(buffer.size() >= (n * 4) as u64);
                run_scale_add(&device, buffer, n as u32);
            }
            assert_eq!(buf.state(), BufferState::DeviceDirty);
            let host = buf.host().unwrap();
            for (i, x) in host.iter().enumerate() {
                assert_eq!(*x, i as f32 * 2.0 + 1.0, "element {i} of {n} on {device}");
            }
            assert_eq!(buf.state(), BufferState::Synchronized);
            assert_eq!(buf.transfer_stats().device_to_host.bytes, (n * 4) as u64);
        }
    }
}

#[test]
fn devices_report_what_they_are_and_answer_to_their_selectors() {
    // The devices discovery opened (not the staging twins the other tests add).
    let devices: Vec<Device> =
        lazybuf::devices().into_iter().filter(|d| d.backend_kind() == BackendKind::WGPU).collect();
    for (index, device) in devices.iter().enumerate() {
        let info = device.info();
        assert!(!info.name.is_empty() && !info.vendor.is_empty(), "{info:?}");
        assert!(info.total_memory > 0, "{info:?}");
        assert!(!device.can_pin_host_memory());
        assert!(!device.is_zero_copy(64 << 20), "wgpu never aliases host memory");
        assert_eq!(&lazybuf::select_device(&format!("wgpu:{index}")).unwrap(), device);
        let api = lazybuf::backend::wgpu::API_SELECTORS
            .iter()
            .find(|(name, _)| device.answers_to(name))
            .map(|(name, _)| *name)
            .expect("every wgpu device runs on Vulkan, Metal or DX12");
        let same_api: Vec<Device> = devices.iter().filter(|d| d.answers_to(api)).cloned().collect();
        let position = same_api.iter().position(|d| d == device).unwrap();
        assert_eq!(&lazybuf::select_device(&format!("{api}:{position}")).unwrap(), device);
        println!(
            "{index}: {} ({}), {api}, {} bytes, {:?}",
            info.name,
            info.vendor,
            info.total_memory,
            device.memory_info()
        );
    }
    if let Some(first) = devices.first() {
        assert_eq!(&lazybuf::select_device("wgpu").unwrap(), first);
    }
    let vulkan: Vec<&Device> = devices.iter().filter(|d| d.answers_to("vulkan")).collect();
    match lazybuf::select_device("vulkan") {
        Ok(device) => assert_eq!(&device, vulkan[0]),
        Err(err) => assert!(vulkan.is_empty() && err.to_string().contains("vulkan has no device"), "{err}"),
    }
    // No Metal here (Linux): a clear error naming what exists.
    if !devices.iter().any(|d| d.answers_to("metal")) {
        let err = lazybuf::select_device("metal").unwrap_err();
        assert!(
            matches!(err, Error::DeviceNotFound { .. }) && err.to_string().contains("metal has no device"),
            "{err}"
        );
    }
    let err = lazybuf::select_device("vulkan:99").unwrap_err().to_string();
    assert!(err.contains("out of range") || err.contains("no device"), "{err}");
    let err = lazybuf::select_device("directx").unwrap_err().to_string();
    assert!(err.contains("wgpu[:N]") && err.contains("vulkan[:N]") && err.contains("metal[:N]"), "{err}");
}

/// A buffer of `n` bytes straight from the device (no pool), so each allocation is new.
fn bytes_on(device: &Device, n: usize) -> UnifiedBuffer<u8> {
    let options = BufferOptions {
        device: Some(device.clone()),
        resource: Some(DirectResource::shared()),
        ..Default::default()
    };
    UnifiedBuffer::with_options(&[n], options).unwrap()
}

/// Backend-level checks of partial words: every operation on the first `n` bytes of a
/// 24-byte allocation leaves the bytes after them as they were.
#[test]
fn partial_words_change_exactly_their_bytes() {
    for device in wgpu_devices() {
        let stream = device.stream();
        let read = |memory: &lazybuf::backend::DeviceMemory| {
            let mut out = vec![0u8; 24];
            // SAFETY: (test) `out` lives until the ticket is waited for.
            unsafe { stream.download(memory, lazybuf::backend::HostSpan::of_mut_slice(&mut out)) }
                .unwrap()
                .wait()
                .unwrap();
            out
        };
        let write = |memory: &mut lazybuf::backend::DeviceMemory, bytes: &[u8]| {
            // SAFETY: (test) `bytes` lives until the ticket is waited for.
            unsafe { stream.upload(lazybuf::backend::HostSpan::of_slice(bytes), memory) }
                .unwrap()
                .wait()
                .unwrap();
        };
        let base: Vec<u8> = (100..124).collect();
        for n in 1..=23usize {
            let mut a = common::device_memory(&device, 24);
            let mut b = common::device_memory(&device, 24);
            // Upload of n bytes.
            write(&mut a, &base);
            let data: Vec<u8> = (0..n as u8).map(|i| i + 1).collect();
            write(&mut a, &data);
            let mut expected = base.clone();
            expected[..n].copy_from_slice(&data);
            assert_eq!(read(&a), expected, "upload of {n} bytes on {device}");
            // Download of n bytes reads exactly them.
            let mut out = vec![0xEEu8; n];
            // SAFETY: (test) `out` lives until the ticket is waited for.
            unsafe { stream.download(&a, lazybuf::backend::HostSpan::of_mut_slice(&mut out)) }
                .unwrap()
                .wait()
                .unwrap();
            assert_eq!(out, data, "download of {n} bytes");
            // Fills of n bytes with a 1-byte pattern, zero and not.
            for value in [0u8, 0xAB] {
                write(&mut a, &base);
                stream.fill(&mut a, &[value], n).unwrap().wait().unwrap();
                let mut expected = base.clone();
                expected[..n].fill(value);
                assert_eq!(read(&a), expected, "fill of {n} bytes with {value:#x}");
            }
            // A 2-byte pattern over an even length.
            if n.is_multiple_of(2) {
                write(&mut a, &base);
                stream.fill(&mut a, &[0x12, 0x34], n).unwrap().wait().unwrap();
                let mut expected = base.clone();
                expected[..n].chunks_mut(2).for_each(|c| c.copy_from_slice(&[0x12, 0x34]));
                assert_eq!(read(&a), expected, "2-byte fill of {n} bytes");
            }
            // A device-to-device copy of n bytes.
            write(&mut a, &data.iter().chain(&base[n..]).copied().collect::<Vec<u8>>());
            write(&mut b, &[7u8; 24]);
            stream.copy(&a, &mut b, n).unwrap().wait().unwrap();
            let mut expected = vec![7u8; 24];
            expected[..n].copy_from_slice(&data);
            assert_eq!(read(&b), expected, "copy of {n} bytes");
        }
        // Patterns of 4, 8 and 16 bytes repeat in order.
        let mut a = common::device_memory(&device, 48);
        for len in [4usize, 8, 16] {
            let pattern: Vec<u8> = (1..=len as u8).collect();
            stream.fill(&mut a, &pattern, 48).unwrap().wait().unwrap();
            let mut out = vec![0u8; 48];
            // SAFETY: (test) `out` lives until the ticket is waited for.
            unsafe { stream.download(&a, lazybuf::backend::HostSpan::of_mut_slice(&mut out)) }
                .unwrap()
                .wait()
                .unwrap();
            assert!(out.chunks(len).all(|c| c == pattern), "{len}-byte pattern: {out:?}");
        }
    }
}

#[test]
fn odd_sized_buffers_round_trip_through_the_buffer_api() {
    for device in wgpu_devices() {
        for n in [1usize, 2, 3, 5, 7, 13, 1001, (1 << 20) + 3] {
            let data: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
            let mut buf = bytes_on(&device, n);
            buf.copy_from(&data).unwrap();
            buf.mark_device_dirty().unwrap();
            assert_eq!(buf.to_vec().unwrap(), data, "{n} bytes on {device}");
            buf.host_mut().unwrap();
            buf.fill(9).unwrap();
            assert_eq!(buf.state(), BufferState::HostDirty, "fill runs where the data is current");
            assert!(buf.to_vec().unwrap().iter().all(|&b| b == 9), "{n}-byte host fill");
            buf.mark_device_dirty().unwrap();
            buf.fill(3).unwrap();
            assert_eq!(buf.state(), BufferState::DeviceDirty);
            assert!(buf.to_vec().unwrap().iter().all(|&b| b == 3), "{n}-byte device fill");
        }
    }
}

/// Longer than one storage binding (128 MiB on lavapipe): the fill runs in chunks.
#[test]
fn fills_longer_than_one_binding_cover_every_word() {
    for device in wgpu_devices() {
        let (gpu, _) = handles(&device);
        let binding = gpu.limits().max_storage_buffer_binding_size;
        let n = ((binding + (64 << 10)) / 4 + 3) as usize;
        if (n * 4) as u64 > gpu.limits().max_buffer_size {
            eprintln!("SKIPPED on {device}: a buffer cannot be longer than one binding");
            continue;
        }
        let mut buf = UnifiedBuffer::<u32>::on(&[n], &device).unwrap();
        buf.device_overwrite().unwrap();
        buf.fill(0xDEAD_BEEF).unwrap();
        assert_eq!(buf.state(), BufferState::DeviceOnly);
        let host = buf.host().unwrap();
        assert!(host.iter().all(|&x| x == 0xDEAD_BEEF), "{device}");
    }
}

#[test]
fn pinned_host_memory_is_an_error_not_pageable_memory() {
    for device in wgpu_devices() {
        let options = BufferOptions { device: Some(device.clone()), pinned: true, ..Default::default() };
        let mut buf = UnifiedBuffer::<f32>::with_options(&[64], options).unwrap();
        let err = buf.host_mut().unwrap_err();
        assert!(matches!(err, Error::PinningFailed { .. }), "{err}");
        assert!(
            err.to_string().contains("no pinned host memory") && err.to_string().contains("pinned: false"),
            "{err}"
        );
        assert_eq!(buf.state(), BufferState::Uninitialized);
        assert!(!buf.is_pinned());
        // The device copy needs no host memory; the host copy is refused the same way.
        buf.device_overwrite().unwrap().write_from(&[1.0; 64]).unwrap();
        assert!(matches!(buf.to_vec(), Err(Error::PinningFailed { .. })));
        assert_eq!(buf.state(), BufferState::DeviceOnly, "the failed read changed nothing");
        let mut out = [0.0f32; 64];
        buf.device().unwrap().read_into(&mut out).unwrap();
        assert_eq!(out, [1.0; 64]);
    }
}

#[test]
fn a_wgpu_error_is_returned_not_panicked_on_and_changes_nothing() {
    for device in wgpu_devices() {
        let mut buf = UnifiedBuffer::from_slice(&[5u32; 256], &device).unwrap();
        buf.sync_to_device().unwrap();
        {
            let view = buf.device_mut().unwrap();
            // SAFETY: (test) the buffer lives as long as the view.
            let RawMemory::Wgpu(raw) = (unsafe { view.raw() }) else { panic!("not a wgpu buffer") };
            // Misuse through the raw handle: wgpu's validation rejects every later use.
            // SAFETY: (test) see above.
            unsafe { &*raw }.destroy();
        }
        assert_eq!(buf.state(), BufferState::DeviceDirty);
        let err = buf.sync_to_host().unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
        assert!(err.to_string().contains("wgpu validation error"), "{err}");
        assert_eq!(buf.state(), BufferState::DeviceDirty, "the failed download changed nothing");
        // The host copy, stale but intact, is still there once the caller discards the device copy.
        buf.mark_host_dirty().unwrap_err();
        buf.host_overwrite().unwrap().fill(6);
        assert_eq!(buf.state(), BufferState::HostDirty);
        assert_eq!(buf.to_vec().unwrap(), vec![6; 256]);
    }
}

const LOST_CHILD_ENV: &str = "LAZYBUF_WGPU_LOST_CHILD";

/// Runs only as the child of the test below: destroys the device under lazybuf.
#[test]
fn child_with_a_destroyed_device() {
    if std::env::var_os(LOST_CHILD_ENV).is_none() {
        return;
    }
    let device = wgpu_devices().into_iter().next().expect("the parent checked that a device exists");
    let mut buf = UnifiedBuffer::from_slice(&[1u32; 1000], &device).unwrap();
    buf.sync_to_device().unwrap();
    let (gpu, _) = handles(&device);
    gpu.destroy();
    let err = buf.mark_device_dirty().and_then(|()| buf.sync_to_host()).unwrap_err();
    println!("after destroy: {err}");
    let mut fresh = UnifiedBuffer::<u32>::on(&[10], &device).unwrap();
    assert!(fresh.device_overwrite().is_err());
    assert!(device.synchronize().is_err());
    drop((buf, fresh));
    println!("child ok");
}

#[test]
fn a_lost_device_makes_calls_fail_without_panicking() {
    if wgpu_devices().is_empty() {
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", &common::test_name(module_path!(), "child_with_a_destroyed_device")])
        .args(["--nocapture", "--test-threads=1"])
        .env(LOST_CHILD_ENV, "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed:\n{text}");
    assert!(!text.contains("panicked"), "a panic was printed:\n{text}");
    assert!(text.contains("child ok"), "{text}");
}

#[test]
fn free_memory_follows_allocations() {
    for device in wgpu_devices() {
        let info = device.memory_info().unwrap();
        assert!(info.free <= info.total && info.total == device.info().total_memory, "{info:?}");
        if info.source != lazybuf::MemorySource::TotalMinusProcessHeld {
            continue; // the driver's budget moves with every process
        }
        // Other tests of this binary allocate and free on the same device meanwhile: an attempt
        // whose count another test moved is tried again; a count that does not follow this
        // buffer's MiB fails every attempt.
        let mut seen = Vec::new();
        let followed = (0..20).any(|_| {
            let before = device.memory_info().unwrap().free;
            let mut buf = bytes_on(&device, 1 << 20);
            buf.device_overwrite().unwrap();
            let during = device.memory_info().unwrap().free;
            drop(buf);
            let after = device.memory_info().unwrap().free;
            seen.push((before, during, after));
            before == during + (1 << 20) && after == before
        });
        assert!(followed, "{device}: free memory did not follow a MiB allocation: {seen:?}");
    }
}

#[test]
fn markers_cover_downloads_and_tickets_complete_by_polling() {
    for device in wgpu_devices() {
        let mut buf = UnifiedBuffer::from_slice(&[3u32; 4096], &device).unwrap();
        buf.sync_to_device().unwrap();
        buf.mark_device_dirty().unwrap();
        let transfer = buf.sync_to_host_async().unwrap();
        device.stream().marker().unwrap().wait().unwrap();
        assert!(transfer.is_complete().unwrap(), "the marker waited for the download's copy to the host");
        assert_eq!(buf.host().unwrap(), &[3u32; 4096][..]);

        // Polling alone completes a transfer (wgpu runs callbacks only when polled).
        buf.mark_device_dirty().unwrap();
        let transfer = buf.sync_to_host_async().unwrap();
        let start = std::time::Instant::now();
        while !transfer.is_complete().unwrap() {
            assert!(start.elapsed().as_secs() < 60, "a polled transfer never completed");
            std::thread::yield_now();
        }
        // The raw queue is the stream; wrapping it gives a stream of the same device.
        // SAFETY: (test) the stream's handle is borrowed from the live device.
        let raw = unsafe { device.stream().raw() };
        assert!(matches!(raw, RawStream::Wgpu(_)));
        // SAFETY: (test) `raw` is the device's own live queue.
        let wrapped = unsafe { device.wrap_stream(raw) }.unwrap();
        wrapped.synchronize().unwrap();
        // SAFETY: (test) a host stream is not this device's queue; it is refused.
        assert!(unsafe { device.wrap_stream(RawStream::Host) }.is_err());
    }
}
