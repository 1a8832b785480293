//! Buffers on CUDA devices, through the public API: the state table with real transfers,
//! pinned host copies, fills of every element type on the device, large (staged) transfers,
//! and device-to-device syncs. Runs on the driver-API test double
//! (`scripts/test-cuda-double.sh`) or a GPU; elsewhere each test prints a visible skip.

#![cfg(feature = "cuda")]

use crate::cuda_common;

use cuda_common::{cuda_devices, ramp};
use lazybuf::backend::RawMemory;
use lazybuf::{BufferOptions, BufferState, Device, Element, UnifiedBuffer, bf16, f16};

#[test]
fn the_state_table_with_real_transfers() {
    for device in cuda_devices("the_state_table_with_real_transfers").unwrap_or_default() {
        let mut buf = UnifiedBuffer::<f32>::on(&[2, 512], &device).unwrap();
        assert_eq!(buf.state(), BufferState::Uninitialized);
        buf.host_mut().unwrap().iter_mut().enumerate().for_each(|(i, x)| *x = i as f32);
        assert_eq!(buf.state(), BufferState::HostOnly);
        buf.sync_to_device().unwrap();
        assert_eq!(buf.state(), BufferState::Synchronized);
        assert_eq!(buf.transfer_stats().host_to_device.bytes, 4096);
        buf.host_mut().unwrap()[0] = -1.0;
        assert_eq!(buf.state(), BufferState::HostDirty);
        buf.sync_to_device().unwrap();
        assert_eq!(buf.state(), BufferState::Synchronized);
        buf.mark_device_dirty().unwrap();
        assert_eq!(buf.state(), BufferState::DeviceDirty);
        buf.fill(2.5).unwrap(); // on the device, the only valid copy
        assert_eq!(buf.host().unwrap(), &[2.5; 1024][..]);
        assert_eq!(buf.state(), BufferState::Synchronized);
        let stats = buf.transfer_stats();
        assert_eq!(stats.zero_copy_syncs, 0, "CUDA device memory never aliases host memory");
        assert_eq!((stats.host_to_device.copies, stats.device_to_host.copies), (2, 1));
    }
}

#[test]
fn device_only_data_comes_back_to_the_host() {
    for device in cuda_devices("device_only_data_comes_back_to_the_host").unwrap_or_default() {
        let mut buf = UnifiedBuffer::<u8>::on(&[4000], &device).unwrap();
        buf.fill(9).unwrap(); // on the host: nothing is valid yet
        buf.sync_to_device().unwrap();
        buf.release_memory();
        buf.device_overwrite().map(drop).unwrap();
        assert_eq!(buf.state(), BufferState::DeviceOnly);
        buf.fill(5).unwrap(); // on the device: only the device is valid
        assert_eq!(buf.state(), BufferState::DeviceOnly);
        assert_eq!(buf.to_vec().unwrap(), vec![5; 4000]);
        assert_eq!(buf.state(), BufferState::Synchronized);
    }
}

fn fill_on_device<T: Element + PartialEq + std::fmt::Debug>(device: &Device, value: T, len: usize) {
    let mut buf = UnifiedBuffer::<T>::on(&[len], device).unwrap();
    buf.device_overwrite().map(drop).unwrap();
    buf.fill(value).unwrap();
    assert_eq!(buf.transfer_stats().bytes_moved(), 0, "a device fill moves no data");
    assert!(buf.to_vec().unwrap().iter().all(|x| *x == value), "fill {value:?}");
}

#[test]
fn fills_on_the_device_for_every_element_type() {
    for device in cuda_devices("fills_on_the_device_for_every_element_type").unwrap_or_default() {
        for len in [0, 1, 777, 100_003] {
            fill_on_device(&device, 0xABu8, len);
            fill_on_device(&device, -3i8, len);
            fill_on_device(&device, 0xBEEFu16, len);
            fill_on_device(&device, -2i16, len);
            fill_on_device(&device, f16::from_f32(1.5), len);
            fill_on_device(&device, bf16::from_f32(-2.25), len);
            fill_on_device(&device, 0xDEAD_BEEFu32, len);
            fill_on_device(&device, 7i32, len);
            fill_on_device(&device, 3.25f32, len);
            fill_on_device(&device, 0x0102_0304_0506_0708u64, len);
            fill_on_device(&device, 0x0101_0101_0101_0101u64, len);
            fill_on_device(&device, -1i64, len);
            fill_on_device(&device, 1.0e300f64, len);
        }
    }
}

#[test]
fn pinned_buffers_have_page_locked_host_copies() {
    for device in cuda_devices("pinned_buffers_have_page_locked_host_copies").unwrap_or_default() {
        let options = BufferOptions { device: Some(device.clone()), pinned: true, ..Default::default() };
        let mut buf = UnifiedBuffer::<u32>::with_options(&[1 << 16], options).unwrap();
        assert!(!buf.is_pinned(), "nothing is allocated yet");
        buf.copy_from(&(0..1 << 16).collect::<Vec<u32>>()).unwrap();
        assert!(buf.is_pinned());
        buf.sync_to_device().unwrap();
        buf.mark_device_dirty().unwrap();
        buf.fill(7).unwrap();
        assert!(buf.host().unwrap().iter().all(|&x| x == 7));
        let unpinned = UnifiedBuffer::<u32>::from_slice(&[1, 2, 3], &device).unwrap();
        assert!(!unpinned.is_pinned());
    }
}

#[test]
fn large_pageable_and_pinned_buffers_round_trip() {
    // 24 MiB + 3 bytes: staged in several pieces, with a short last one.
    let n = (24 << 20) + 3;
    let data = ramp(n);
    for device in cuda_devices("large_pageable_and_pinned_buffers_round_trip").unwrap_or_default() {
        for pinned in [false, true] {
            let options = BufferOptions { device: Some(device.clone()), pinned, ..Default::default() };
            let mut buf = UnifiedBuffer::<u8>::with_options(&[n], options).unwrap();
            buf.copy_from(&data).unwrap();
            buf.sync_to_device().unwrap();
            buf.fill(0).unwrap(); // on the device
            assert!(buf.host().unwrap().iter().all(|&b| b == 0), "pinned: {pinned}");
            buf.copy_from(&data).unwrap();
            buf.sync_to_device().unwrap();
            buf.mark_device_dirty().unwrap();
            assert!(buf.host().unwrap() == &data[..], "pinned: {pinned}");
            let stats = buf.transfer_stats();
            assert_eq!((stats.host_to_device.copies, stats.device_to_host.copies), (2, 2));
        }
    }
}

#[test]
fn buffers_move_between_two_devices() {
    let devices = cuda_devices("buffers_move_between_two_devices").unwrap_or_default();
    let [first, second, ..] = &devices[..] else {
        eprintln!("SKIPPED buffers_move_between_two_devices: needs two CUDA devices");
        return;
    };
    let data = ramp(100_000);
    let mut buf = UnifiedBuffer::<u8>::from_slice(&data, first).unwrap();
    buf.device_mut().map(drop).unwrap(); // only `first` is valid now
    buf.reset_transfer_stats();
    buf.sync_to(second).unwrap();
    let stats = buf.transfer_stats();
    let direct = stats.device_to_device.bytes == 100_000;
    let staged = stats.device_to_host.bytes == 100_000 && stats.host_to_device.bytes == 100_000;
    assert!(direct != staged, "exactly one path was taken: {stats:?}");
    assert_eq!(
        buf.state_on(second),
        if direct { BufferState::DeviceDirty } else { BufferState::Synchronized }
    );
    // The copy on `second` is the data: make it the only valid copy and read it back.
    buf.mark_dirty_on(second).unwrap();
    assert_eq!(buf.state_on(first), BufferState::Elsewhere);
    assert_eq!(buf.to_vec().unwrap(), data);
}

#[test]
fn device_views_hand_out_cuda_pointers() {
    for device in cuda_devices("device_views_hand_out_cuda_pointers").unwrap_or_default() {
        let mut buf = UnifiedBuffer::<f32>::from_slice(&[1.0; 64], &device).unwrap();
        let view = buf.device().unwrap();
        assert_eq!(view.len(), 64);
        // SAFETY: only reads the handle.
        assert!(matches!(unsafe { view.raw() }, RawMemory::Cuda(ptr) if ptr != 0 && ptr % 256 == 0));
        assert!(view.as_host_slice().is_none(), "CUDA memory is not host memory");
        let mut empty = UnifiedBuffer::<f32>::on(&[0], &device).unwrap();
        // SAFETY: only reads the handle.
        assert_eq!(unsafe { empty.device().unwrap().raw() }, RawMemory::Cuda(0));
    }
}

#[test]
fn the_default_device_prefers_a_cuda_gpu() {
    let Some(devices) = cuda_devices("the_default_device_prefers_a_cuda_gpu") else { return };
    if std::env::var_os(lazybuf::discovery::DEVICE_ENV).is_some() {
        eprintln!("SKIPPED the_default_device_prefers_a_cuda_gpu: LAZYBUF_DEVICE is set");
        return;
    }
    assert_eq!(lazybuf::default_device().unwrap(), devices[0]);
    assert_eq!(lazybuf::select_device("cuda").unwrap(), devices[0]);
    assert_eq!(lazybuf::select_device("gpu").unwrap(), devices[0]);
    let last = format!("cuda:{}", devices.len() - 1);
    assert_eq!(&lazybuf::select_device(&last).unwrap(), devices.last().unwrap());
    let err = lazybuf::select_device(&format!("cuda:{}", devices.len())).unwrap_err().to_string();
    assert!(err.contains("out of range"), "{err}");
}

#[test]
fn cuda_devices_answer_the_interop_questions() {
    use lazybuf::{DlpackDevice, MemoryKind};
    let devices = cuda_devices("cuda_devices_answer_the_interop_questions").unwrap_or_default();
    for (index, device) in devices.iter().enumerate() {
        let info = device.info();
        // Discovery opens ordinals 0..count in order.
        assert_eq!(info.ordinal, Some(index as u32), "{device}");
        assert_eq!(info.dlpack_device(MemoryKind::Device), Some(DlpackDevice::cuda(index as u32)));
        assert_eq!(info.dlpack_device(MemoryKind::Shared), Some(DlpackDevice::cuda_managed(index as u32)));
        assert_eq!(info.dlpack_device(MemoryKind::Host { pinned: true }), Some(DlpackDevice::CPU));
        // SAFETY: the handles are only compared.
        let raw = unsafe { device.raw() };
        // SAFETY: as above.
        assert_eq!(raw.queue_int(), unsafe { device.stream().raw() }.as_int());
        assert_ne!(raw.context_int(), 0);
        let stream = raw.stream_from_int(raw.queue_int()).expect("CUDA streams have integer handles");
        assert!(!stream.is_immediate());
        let memory = lazybuf::Memory::new(device, MemoryKind::Device, 256).unwrap();
        // SAFETY: as above.
        let handle = unsafe { memory.raw() };
        assert_eq!(raw.memory_from_int(handle.as_int()), Some(handle));
        assert_eq!(handle.host_ptr(), None);
    }
    assert_eq!(Device::host().info().ordinal, None);
}
