//! The coherence contract (SPEC section 1), operation by operation, on every device: each
//! operation's effect on state, data, allocations and bytes moved. The random-sequence
//! counterpart is `model.rs`; failures are `faults.rs`.

use crate::common;

use common::{LENGTHS, pattern};
use lazybuf::{
    BufferState, Complex32, Complex64, DType, Device, Location, Residency, TransferStats, UnifiedBuffer,
    bf16, f16,
};

/// The transfer expected for one host<->device sync of `bytes` on `device`.
fn one_sync(device: &Device, bytes: usize) -> (u64, u64) {
    if device.is_zero_copy(bytes) { (0, 1) } else { (bytes as u64, 0) }
}

fn assert_moved_to_device(stats: TransferStats, device: &Device, bytes: usize) {
    let (moved, zero) = one_sync(device, bytes);
    assert_eq!(stats.host_to_device.bytes, moved, "host->device bytes on {device}: {stats:?}");
    assert_eq!(stats.device_to_host.bytes, 0, "{stats:?}");
    assert_eq!(stats.zero_copy_syncs, zero, "{stats:?}");
}

fn assert_moved_to_host(stats: TransferStats, device: &Device, bytes: usize) {
    let (moved, zero) = one_sync(device, bytes);
    assert_eq!(stats.device_to_host.bytes, moved, "device->host bytes on {device}: {stats:?}");
    assert_eq!(stats.host_to_device.bytes, 0, "{stats:?}");
    assert_eq!(stats.zero_copy_syncs, zero, "{stats:?}");
}

fn assert_nothing_moved(stats: TransferStats) {
    assert_eq!(stats.bytes_moved(), 0, "{stats:?}");
    assert_eq!(stats.zero_copy_syncs, 0, "{stats:?}");
}

#[test]
fn a_new_buffer_allocates_nothing() {
    for device in common::devices() {
        let held = device.memory_info().unwrap().source == lazybuf::MemorySource::TotalMinusProcessHeld;
        // Where free memory is the process's own count, a new buffer leaves it as it was. Other
        // tests of this binary allocate on the same devices meanwhile: a count that moved is
        // read again around a new buffer (the earlier ones kept, so that none can take memory
        // another gave back); a buffer that allocated would move it every time.
        let mut kept = Vec::new();
        let mut moved = Vec::new();
        for _ in 0..20 {
            let before = device.memory_info().unwrap().free;
            let buf = UnifiedBuffer::<f32>::on(&[1 << 20], &device).unwrap();
            let after = device.memory_info().unwrap().free;
            assert_eq!(buf.state(), BufferState::Uninitialized);
            assert_eq!(buf.transfer_stats(), TransferStats::default());
            assert_eq!(buf.residency(Location::Host), Residency::Unallocated);
            assert_eq!(buf.residency(Location::Device(device.id())), Residency::Unallocated);
            kept.push(buf);
            if !held || after == before {
                break;
            }
            moved.push(before.abs_diff(after));
        }
        assert!(moved.len() < 20, "{device}: free memory moved around every new buffer: {moved:?}");
    }
}

/// Every row of the seeds' transition table, with the bytes each step moves.
#[test]
fn seed_transition_table_on_every_device() {
    for device in common::devices() {
        for len in LENGTHS {
            let bytes = len * 4;
            let data = pattern(1, len);
            let mut buf = UnifiedBuffer::<u32>::on(&[len], &device).unwrap();

            buf.host_mut().unwrap().copy_from_slice(&data);
            assert_eq!(buf.state(), BufferState::HostOnly, "{device} len {len}");
            assert_nothing_moved(buf.transfer_stats());

            buf.sync_to_device().unwrap();
            assert_eq!(buf.state(), BufferState::Synchronized);
            assert_moved_to_device(buf.transfer_stats(), &device, bytes);
            buf.reset_transfer_stats();

            buf.sync_to_device().unwrap();
            buf.sync_to_host().unwrap();
            assert_nothing_moved(buf.transfer_stats());

            buf.host_mut().unwrap()[..len.min(1)].fill(99);
            assert_eq!(buf.state(), BufferState::HostDirty);
            let expected = buf.host().unwrap().to_vec();
            buf.reset_transfer_stats();

            let mut on_device = vec![0; len];
            buf.device().unwrap().read_into(&mut on_device).unwrap();
            assert_eq!(on_device, expected, "device copy after a lazy sync");
            assert_eq!(buf.state(), BufferState::Synchronized);
            assert_moved_to_device(buf.transfer_stats(), &device, bytes);
            buf.reset_transfer_stats();

            let kernel_result = pattern(2, len);
            buf.device_mut().unwrap().write_from(&kernel_result).unwrap();
            assert_eq!(buf.state(), BufferState::DeviceDirty);
            assert_nothing_moved(buf.transfer_stats());

            assert_eq!(buf.host().unwrap(), &kernel_result[..]);
            assert_eq!(buf.state(), BufferState::Synchronized);
            assert_moved_to_host(buf.transfer_stats(), &device, bytes);
        }
    }
}

#[test]
fn device_only_then_host_read() {
    for device in common::devices() {
        for len in LENGTHS {
            let data = pattern(3, len);
            let mut buf = UnifiedBuffer::<u32>::on(&[len], &device).unwrap();
            buf.device_overwrite().unwrap().write_from(&data).unwrap();
            assert_eq!(buf.state(), BufferState::DeviceOnly, "{device} len {len}");
            assert_eq!(buf.residency(Location::Host), Residency::Unallocated);
            assert_nothing_moved(buf.transfer_stats());
            assert_eq!(buf.to_vec().unwrap(), data);
            assert_eq!(buf.state(), BufferState::Synchronized);
            assert_moved_to_host(buf.transfer_stats(), &device, len * 4);
        }
    }
}

#[test]
fn mark_dirty_makes_the_location_current_first() {
    for device in common::devices() {
        let data = pattern(4, 1000);
        // mark_device_dirty on HOST_ONLY uploads first: host data is never lost.
        let mut buf = UnifiedBuffer::from_slice(&data, &device).unwrap();
        buf.mark_device_dirty().unwrap();
        assert_eq!(buf.state(), BufferState::DeviceDirty);
        assert_moved_to_device(buf.transfer_stats(), &device, 4000);
        assert_eq!(buf.to_vec().unwrap(), data);

        // mark_host_dirty on DEVICE_DIRTY downloads first.
        buf.device_mut().unwrap().write_from(&pattern(5, 1000)).unwrap();
        buf.reset_transfer_stats();
        buf.mark_host_dirty().unwrap();
        assert_eq!(buf.state(), BufferState::HostDirty);
        assert_moved_to_host(buf.transfer_stats(), &device, 4000);
        assert_eq!(buf.host().unwrap(), &pattern(5, 1000)[..]);

        // mark_*_dirty on an uninitialized buffer: that location becomes the only one.
        let mut fresh = UnifiedBuffer::<u32>::on(&[3], &device).unwrap();
        fresh.mark_device_dirty().unwrap();
        assert_eq!(fresh.state(), BufferState::DeviceOnly);
        let mut fresh = UnifiedBuffer::<u32>::on(&[3], &device).unwrap();
        fresh.mark_host_dirty().unwrap();
        assert_eq!(fresh.state(), BufferState::HostOnly);
    }
}

#[test]
fn overwrite_skips_the_sync() {
    for device in common::devices() {
        let mut buf = UnifiedBuffer::from_slice(&pattern(6, 1000), &device).unwrap();
        buf.device_mut().unwrap().write_from(&pattern(7, 1000)).unwrap();
        buf.reset_transfer_stats();
        buf.host_overwrite().unwrap().copy_from_slice(&pattern(8, 1000));
        assert_nothing_moved(buf.transfer_stats());
        assert_eq!(buf.state(), BufferState::HostDirty);

        buf.device_overwrite().unwrap().write_from(&pattern(9, 1000)).unwrap();
        assert_nothing_moved(buf.transfer_stats());
        assert_eq!(buf.state(), BufferState::DeviceDirty);
        assert_eq!(buf.to_vec().unwrap(), pattern(9, 1000));
    }
}

#[test]
fn fill_happens_where_the_data_is_current_without_transfer() {
    for device in common::devices() {
        for len in LENGTHS {
            // Uninitialized: filled on the host.
            let mut buf = UnifiedBuffer::<u32>::on(&[len], &device).unwrap();
            buf.fill(5).unwrap();
            assert_eq!(buf.state(), BufferState::HostOnly);
            assert_eq!(buf.host().unwrap(), &vec![5; len][..]);

            // Device current: filled on the device, the host goes stale, nothing moves.
            buf.device_mut().unwrap();
            buf.reset_transfer_stats();
            buf.fill(6).unwrap();
            assert_nothing_moved(buf.transfer_stats());
            assert_eq!(buf.state(), BufferState::DeviceDirty, "{device} len {len}");
            let mut on_device = vec![0; len];
            buf.device().unwrap().read_into(&mut on_device).unwrap();
            assert_eq!(on_device, vec![6; len]);
            assert_eq!(buf.to_vec().unwrap(), vec![6; len]);

            // Only the host current: filled on the host.
            buf.host_mut().unwrap();
            buf.reset_transfer_stats();
            buf.fill(7).unwrap();
            assert_nothing_moved(buf.transfer_stats());
            assert_eq!(buf.state(), BufferState::HostDirty);
            assert_eq!(buf.to_vec().unwrap(), vec![7; len]);
        }
    }
}

fn round_trip<T: lazybuf::Element>(device: &Device, values: [T; 3]) {
    let data: Vec<T> = (0..257).map(|i| values[i % 3]).collect();
    let mut buf = UnifiedBuffer::<T>::on(&[257], device).unwrap();
    assert_eq!(buf.dtype(), T::DTYPE);
    assert_eq!(buf.nbytes(), 257 * T::DTYPE.size());
    buf.copy_from(&data).unwrap();
    buf.sync_to_device().unwrap();
    let shifted: Vec<T> = (0..257).map(|i| values[(i + 1) % 3]).collect();
    buf.device_mut().unwrap().write_from(&shifted).unwrap();
    assert_eq!(buf.to_vec().unwrap(), shifted, "{} on {device}", T::DTYPE);
    buf.fill(values[2]).unwrap();
    assert_eq!(buf.to_vec().unwrap(), vec![values[2]; 257], "fill {} on {device}", T::DTYPE);
}

#[test]
fn every_element_type_round_trips_and_fills() {
    for device in common::devices() {
        round_trip::<u8>(&device, [1, 200, 255]);
        round_trip::<u16>(&device, [1, 60_000, 7]);
        round_trip::<u32>(&device, [1, 4_000_000_000, 7]);
        round_trip::<u64>(&device, [1, u64::MAX - 3, 0x0102_0304_0506_0708]);
        round_trip::<i8>(&device, [-1, 100, -128]);
        round_trip::<i16>(&device, [-1, 30_000, -32_768]);
        round_trip::<i32>(&device, [-1, 2_000_000_000, i32::MIN]);
        round_trip::<i64>(&device, [-1, i64::MAX, 0x0102_0304_0506_0708]);
        round_trip::<f16>(&device, [f16::from_f32(1.5), f16::from_f32(-2.25), f16::MAX]);
        round_trip::<bf16>(&device, [bf16::from_f32(1.5), bf16::from_f32(-2.25), bf16::MIN]);
        round_trip::<f32>(&device, [1.5, -2.25, f32::MAX]);
        round_trip::<f64>(&device, [1.5, -2.25, f64::MIN_POSITIVE]);
        round_trip::<Complex32>(
            &device,
            [Complex32::new(1.5, -2.25), Complex32::new(-0.0, f32::MAX), Complex32::new(3.0, 0.5)],
        );
        round_trip::<Complex64>(
            &device,
            [Complex64::new(1.5, -2.25), Complex64::new(f64::MIN_POSITIVE, -1e300), Complex64::new(0.0, 7.0)],
        );
    }
    assert_eq!(DType::ALL.len(), 14, "every dtype above");
}

#[test]
fn shapes_of_any_rank_and_length() {
    for device in common::devices() {
        for dims in [&[][..], &[0], &[3, 0, 2], &[2, 3, 4], &[1, 1, 1, 1, 5]] {
            let n: usize = dims.iter().product();
            let data = pattern(10, n);
            let mut buf = UnifiedBuffer::<u32>::on(dims, &device).unwrap();
            assert_eq!(buf.shape(), dims);
            assert_eq!(buf.len(), n);
            assert_eq!(buf.is_empty(), n == 0);
            assert_eq!(buf.nbytes(), n * 4);
            buf.copy_from(&data).unwrap();
            buf.mark_device_dirty().unwrap();
            assert_eq!(buf.to_vec().unwrap(), data, "{dims:?} on {device}");
            assert_eq!(buf.device().unwrap().len(), n);
        }
        let buf = UnifiedBuffer::from_vec(pattern(11, 6), &[2, 3], &device).unwrap();
        assert_eq!(buf.shape(), &[2, 3]);
        assert_eq!(buf.state(), BufferState::HostOnly);
    }
}

#[test]
fn copy_helpers_and_views() {
    for device in common::devices() {
        let data = pattern(12, 100);
        let mut buf = UnifiedBuffer::from_slice(&data, &device).unwrap();
        assert_eq!(buf.host_if_valid(), Some(&data[..]));
        let mut out = vec![0; 100];
        buf.copy_to(&mut out).unwrap();
        assert_eq!(out, data);
        buf.mark_device_dirty().unwrap();
        assert_eq!(buf.host_if_valid(), None, "a stale host is not handed out");
        let view = buf.device().unwrap();
        assert_eq!(view.device(), &device);
        assert_eq!(view.len(), 100);
        // SAFETY: (test) the handle is only compared, never dereferenced.
        let raw = unsafe { view.raw() };
        assert_ne!(format!("{raw:?}"), "");
    }
}

#[test]
fn release_and_invalidate() {
    for device in common::devices() {
        let mut buf = UnifiedBuffer::from_slice(&pattern(13, 50), &device).unwrap();
        buf.sync_to_device().unwrap();
        buf.invalidate();
        assert_eq!(buf.state(), BufferState::Uninitialized);
        assert_eq!(buf.residency(Location::Host), Residency::Stale, "memory kept for reuse");
        buf.reset_transfer_stats();
        buf.host_overwrite().unwrap().copy_from_slice(&pattern(14, 50));
        assert_eq!(buf.transfer_stats().allocations, 0, "an invalidated buffer reuses its memory");
        assert_eq!(buf.state(), BufferState::HostDirty);

        buf.release_memory();
        assert_eq!(buf.state(), BufferState::Uninitialized);
        assert_eq!(buf.residency(Location::Host), Residency::Unallocated);
        assert_eq!(buf.residency(Location::Device(device.id())), Residency::Unallocated);
        buf.copy_from(&pattern(15, 50)).unwrap();
        assert_eq!(buf.to_vec().unwrap(), pattern(15, 50));
    }
}

/// A buffer used on two devices keeps validity per location.
#[test]
fn one_buffer_on_several_devices() {
    let devices = common::devices();
    for home in &devices {
        for other in devices.iter().filter(|d| *d != home) {
            let data = pattern(16, 1_100_000);
            let mut buf = UnifiedBuffer::from_slice(&data, home).unwrap();
            buf.sync_to_device().unwrap();
            buf.sync_to(other).unwrap();
            assert_eq!(buf.state(), BufferState::Synchronized);
            assert_eq!(buf.state_on(other), BufferState::Synchronized);

            let written = pattern(17, 1_100_000);
            buf.device_mut_on(other).unwrap().write_from(&written).unwrap();
            assert_eq!(buf.state_on(other), BufferState::DeviceDirty);
            assert_eq!(buf.state(), BufferState::Elsewhere, "{home} is stale, {other} holds the data");
            buf.reset_transfer_stats();

            // Reading on the home device copies peer to peer where the pair allows it, else
            // stages through the host, which then becomes current too.
            let direct = home.can_copy_from(other);
            let mut on_home = vec![0; written.len()];
            buf.device().unwrap().read_into(&mut on_home).unwrap();
            assert_eq!(on_home, written);
            let host_state = if direct { BufferState::DeviceDirty } else { BufferState::Synchronized };
            assert_eq!(buf.state(), host_state, "{home} <- {other}");
            assert_eq!(buf.state_on(other), host_state);
            let stats = buf.transfer_stats();
            let bytes = written.len() * 4;
            let expected_copies = if direct {
                1
            } else {
                [other, home].iter().filter(|d| !d.is_zero_copy(bytes)).count() as u64
            };
            assert_eq!(stats.bytes_moved(), expected_copies * bytes as u64, "{home} <- {other}: {stats:?}");
            assert_eq!(stats.device_to_device.copies, u64::from(direct));
            assert_eq!(buf.to_vec().unwrap(), written);
        }
    }
}

#[test]
fn the_host_device_aliases_host_memory() {
    let host = Device::host();
    let mut buf = UnifiedBuffer::from_slice(&[1u32, 2, 3], &host).unwrap();
    let host_ptr = buf.host().unwrap().as_ptr();
    let view = buf.device().unwrap();
    assert_eq!(view.as_host_slice().unwrap().as_ptr(), host_ptr, ".device is the host memory");
    assert_eq!(buf.state(), BufferState::Synchronized);
    assert_eq!(buf.transfer_stats().bytes_moved(), 0);
    buf.device_mut().unwrap().as_host_slice_mut().unwrap()[0] = 10;
    assert_eq!(buf.state(), BufferState::DeviceDirty);
    assert_eq!(buf.host().unwrap(), &[10, 2, 3]);
    assert_eq!(buf.transfer_stats().bytes_moved(), 0);
}

#[test]
fn host_sharing_opencl_devices_sync_large_buffers_without_copying() {
    for device in common::devices_of(lazybuf::BackendKind::OPENCL) {
        if !device.info().shares_host_memory {
            continue;
        }
        assert!(device.is_zero_copy(4 << 20), "{device} shares host memory: 4 MiB must be zero-copy");
        assert!(!device.is_zero_copy(2 << 20), "{device}: 2 MiB is cheaper to copy");
        let data = pattern(18, 1 << 20);
        let mut buf = UnifiedBuffer::from_slice(&data, &device).unwrap();
        buf.sync_to_device().unwrap();
        assert_eq!(buf.transfer_stats().zero_copy_syncs, 1);
        assert_eq!(buf.transfer_stats().bytes_moved(), 0);
    }
}

#[test]
fn device_info_is_reported() {
    for device in common::devices() {
        let info = device.info();
        assert!(!info.name.is_empty(), "{device:?}");
        assert!(info.total_memory > 0, "{device:?} total memory");
        let mem = device.memory_info().unwrap();
        assert!(mem.free <= mem.total, "{device:?}: {mem:?}");
        assert_eq!(mem.total, info.total_memory, "{device:?}");
    }
    let host = Device::host();
    assert!(host.info().shares_host_memory);
    assert_eq!(host.memory_info().unwrap().source, lazybuf::MemorySource::System);
}

#[test]
fn default_device_prefers_gpus_then_host() {
    let devices = common::devices();
    let default = lazybuf::default_device().unwrap();
    if std::env::var(lazybuf::discovery::DEVICE_ENV).is_err() {
        match devices.iter().find(|d| d.info().is_gpu) {
            Some(_) => assert!(default.info().is_gpu),
            None => assert_eq!(default, Device::host()),
        }
    }
}

/// A view of a pooled buffer exposes the buffer's elements, not the whole (larger) block.
#[test]
fn host_device_views_expose_exactly_the_buffers_elements() {
    let pool = lazybuf::MemoryPool::new(&Device::host(), lazybuf::PoolConfig::default());
    let mut buf = pool.acquire::<u32>(&[1000], false).unwrap();
    buf.copy_from(&pattern(1, 1000)).unwrap();
    assert_eq!(buf.device().unwrap().as_host_slice().unwrap().len(), 1000, "class blocks are larger");
    assert_eq!(buf.device_mut().unwrap().as_host_slice_mut().unwrap().len(), 1000);
    assert_eq!(buf.device().unwrap().as_host_slice().unwrap(), &pattern(1, 1000)[..]);
}

/// `mark_device_dirty()`/`mark_host_dirty()` of a buffer that holds no data (UNINITIALIZED):
/// the copy declared written reads as zeros, never as an earlier buffer's bytes left in a block
/// reused through the default pool or kept by `invalidate()`; the state follows the table and
/// the zero-fill is no transfer.
#[test]
fn marking_a_buffer_that_holds_no_data_dirty_gives_zeros() {
    // An odd length, so that another test's buffers rarely take the block given back.
    const LEN: usize = 3331;
    let nonzero = vec![0x5A5A_5A5Au32; LEN];
    for device in common::devices() {
        let home = Location::Device(device.id());
        for on_device in [true, false] {
            let what = if on_device { "mark_device_dirty" } else { "mark_host_dirty" };
            let mark = |buf: &mut UnifiedBuffer<u32>| {
                if on_device { buf.mark_device_dirty() } else { buf.mark_host_dirty() }.unwrap()
            };
            // A block that held the pattern goes back to the default pool and is handed out again.
            for _ in 0..3 {
                let mut old = UnifiedBuffer::<u32>::on(&[LEN], &device).unwrap();
                old.copy_from(&nonzero).unwrap();
                old.sync_to_device().unwrap();
                drop(old);
                let mut buf = UnifiedBuffer::<u32>::on(&[LEN], &device).unwrap();
                mark(&mut buf);
                let expected = if on_device { BufferState::DeviceOnly } else { BufferState::HostOnly };
                assert_eq!(buf.state(), expected, "{what} on {device}");
                assert_nothing_moved(buf.transfer_stats());
                assert_eq!(buf.transfer_stats().allocations, 1, "{what} on {device}");
                assert!(buf.to_vec().unwrap().iter().all(|&x| x == 0), "{what} on {device}: not zeros");
            }
            // Memory kept by invalidate() holds the old bytes: marked dirty, it reads as zeros.
            let mut buf = UnifiedBuffer::<u32>::on(&[LEN], &device).unwrap();
            buf.copy_from(&nonzero).unwrap();
            buf.sync_to_device().unwrap();
            buf.invalidate();
            buf.reset_transfer_stats();
            mark(&mut buf);
            let (valid, stale) = if on_device { (home, Location::Host) } else { (Location::Host, home) };
            assert_eq!(buf.residency(valid), Residency::Valid, "{what} on {device}");
            assert_eq!(buf.residency(stale), Residency::Stale, "{what} on {device}");
            let expected = if on_device { BufferState::DeviceDirty } else { BufferState::HostDirty };
            assert_eq!(buf.state(), expected, "{what} on {device}");
            assert_eq!(buf.transfer_stats(), TransferStats::default(), "{what} on {device}");
            assert!(buf.to_vec().unwrap().iter().all(|&x| x == 0), "{what} on {device}: not zeros");
        }
    }
}
