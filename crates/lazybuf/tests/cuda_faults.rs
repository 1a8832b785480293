//! Fault injection through the CUDA driver-API test double's hooks: a failed allocation or
//! copy (direct, staged, peer; failing at the call or, as a GPU reports it, at the event after
//! the copy) returns an error and changes nothing — state, valid bytes and the double's live
//! allocations stay as they were. Also the double's counters show which transfer path ran,
//! that cuMemGetInfo's free memory follows allocations, that pinned staging goes with a
//! device's last allocation or a trim, and that often-moved pageable blocks are registered.
//!
//! Buffers here take memory straight from the device (a pool would serve, and on failure trim
//! and retry, behind the test's back) unless a test is about caching.
//!
//! The hooks are process-wide, so every test here holds [`LOCK`]; this file must run with the
//! double (`scripts/test-cuda-double.sh`), and on a real GPU each test prints a skip.

#![cfg(feature = "cuda")]

mod cuda_common;

use std::sync::{Mutex, MutexGuard};

use cuda_common::{
    copies, double_devices, fail_allocation, fail_copy, fail_copy_now, fail_free, live_allocations,
    pinned_copies, ramp, registrations,
};
use lazybuf::backend::cuda::{REGISTER_MIN_BYTES, STAGING_CHUNK, STAGING_MIN_BYTES};
use lazybuf::{BufferOptions, BufferState, Device, DirectResource, UnifiedBuffer};

static LOCK: Mutex<()> = Mutex::new(());

/// The double's devices and the lock that keeps other tests off its hooks.
fn setup(test: &str) -> Option<(Vec<Device>, MutexGuard<'static, ()>)> {
    let devices = double_devices(test)?;
    let guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    fail_allocation(0);
    fail_copy(0);
    fail_free(0);
    lazybuf::trim();
    for device in &devices {
        let _ = device.take_deferred_errors();
    }
    Some((devices, guard))
}

/// A buffer whose memory comes straight from the device.
fn buffer(device: &Device, n: usize, pinned: bool) -> UnifiedBuffer<u8> {
    let options = BufferOptions {
        device: Some(device.clone()),
        pinned,
        resource: Some(DirectResource::shared()),
        ..Default::default()
    };
    UnifiedBuffer::with_options(&[n], options).unwrap()
}

/// A buffer holding `data`, with memory straight from the device.
fn holding(device: &Device, data: &[u8]) -> UnifiedBuffer<u8> {
    let mut buf = buffer(device, data.len(), false);
    buf.copy_from(data).unwrap();
    buf
}

/// Makes sure the device's staging memory exists (so it does not show up as a new
/// allocation) and keeps it: staging lives as long as the device has an allocation.
#[must_use = "the staging goes when the returned buffer does"]
fn warm_staging(device: &Device) -> UnifiedBuffer<u8> {
    let mut buf = holding(device, &ramp(STAGING_MIN_BYTES));
    buf.sync_to_device().unwrap();
    buf
}

/// Arms the double's `fail`-th write to fail at the call (`now`) or at its event.
fn arm_copy(fail: i64, now: bool) {
    if now { fail_copy_now(fail) } else { fail_copy(fail) }
}

#[test]
fn a_failed_device_allocation_changes_nothing() {
    let Some((devices, _lock)) = setup("a_failed_device_allocation_changes_nothing") else { return };
    let device = &devices[0];
    let data = ramp(10_000);
    let mut buf = holding(device, &data);
    let (live, free) = (live_allocations(), device.memory_info().unwrap().free);
    fail_allocation(1);
    let err = buf.sync_to_device().unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    assert_eq!(buf.state(), BufferState::HostOnly);
    assert_eq!(buf.host_if_valid().unwrap(), &data[..]);
    assert_eq!((live_allocations(), device.memory_info().unwrap().free), (live, free));
    buf.sync_to_device().unwrap();
    assert_eq!(buf.state(), BufferState::Synchronized);
}

#[test]
fn a_failed_pinned_allocation_is_an_error_not_a_pageable_fallback() {
    let Some((devices, _lock)) = setup("a_failed_pinned_allocation_is_an_error_not_a_pageable_fallback")
    else {
        return;
    };
    let mut buf = buffer(&devices[0], 4096, true);
    let live = live_allocations();
    fail_allocation(1);
    let err = buf.copy_from(&ramp(4096)).unwrap_err();
    assert!(err.is_out_of_memory() && err.to_string().contains("page-locked"), "{err}");
    assert_eq!(buf.state(), BufferState::Uninitialized);
    assert!(!buf.is_pinned());
    assert_eq!(live_allocations(), live);
    buf.copy_from(&ramp(4096)).unwrap();
    assert!(buf.is_pinned());
}

/// Uploads `n` bytes where the `fail`-th device write fails (at the call when `now`, else at
/// its event): state and host bytes survive, and the next sync delivers the data. The failing
/// sync is the host block's first transfer, so large pageable blocks take the staged path (a
/// block moved before may be registered and go straight by DMA).
fn failed_upload(device: &Device, n: usize, pinned: bool, fail: i64, now: bool) {
    let old = vec![1u8; n];
    let data = ramp(n);
    let mut buf = buffer(device, n, pinned);
    buf.device_overwrite().unwrap().write_from(&old).unwrap();
    buf.copy_from(&data).unwrap();
    assert_eq!(buf.state(), BufferState::HostDirty);
    let live = live_allocations();
    arm_copy(fail, now);
    assert!(buf.sync_to_device().is_err(), "n={n} pinned={pinned} fail={fail} now={now}");
    assert_eq!(buf.state(), BufferState::HostDirty);
    assert!(buf.host_if_valid().unwrap() == &data[..]);
    assert_eq!(live_allocations(), live);
    buf.sync_to_device().unwrap();
    buf.mark_device_dirty().unwrap();
    assert!(buf.host().unwrap() == &data[..]);

    // From HOST_ONLY the failed sync also frees the device memory it allocated.
    let mut fresh = buffer(device, n, pinned);
    fresh.copy_from(&data).unwrap();
    let live = live_allocations();
    arm_copy(fail, now);
    assert!(fresh.sync_to_device().is_err());
    assert_eq!(fresh.state(), BufferState::HostOnly);
    assert_eq!(live_allocations(), live);
}

#[test]
fn a_failed_upload_changes_nothing() {
    let Some((devices, _lock)) = setup("a_failed_upload_changes_nothing") else { return };
    let _staging = warm_staging(&devices[0]);
    for now in [false, true] {
        failed_upload(&devices[0], 1000, false, 1, now);
        failed_upload(&devices[0], 1000, true, 1, now);
        // Staged through pinned chunks: the first and a middle piece fail.
        let staged = 5 * STAGING_CHUNK + 17;
        failed_upload(&devices[0], staged, false, 1, now);
        failed_upload(&devices[0], staged, false, 4, now);
        failed_upload(&devices[0], staged, true, 1, now);
    }
}

/// Downloads `n` bytes where the `fail`-th device write fails (at the call when `now`, else
/// at its event): the device copy stays the valid one and its bytes arrive on the next try.
/// The failing sync is the host block's first transfer (see `failed_upload`).
fn failed_download(device: &Device, n: usize, pinned: bool, fail: i64, now: bool) {
    let mut buf = buffer(device, n, pinned);
    buf.copy_from(&ramp(n)).unwrap();
    buf.device_overwrite().unwrap().write_from(&ramp(n)).unwrap();
    buf.fill(0x3C).unwrap(); // on the device: the host is stale
    assert_eq!(buf.state(), BufferState::DeviceDirty);
    let live = live_allocations();
    arm_copy(fail, now);
    assert!(buf.sync_to_host().is_err(), "n={n} pinned={pinned} fail={fail} now={now}");
    assert_eq!(buf.state(), BufferState::DeviceDirty);
    assert_eq!(live_allocations(), live);
    assert!(buf.host().unwrap().iter().all(|&b| b == 0x3C));

    // With no host block yet, the failed sync frees the one it allocated.
    let mut device_only = buffer(device, n, pinned);
    device_only.device_overwrite().map(drop).unwrap();
    device_only.fill(0x5D).unwrap();
    let live = live_allocations();
    arm_copy(fail, now);
    assert!(device_only.sync_to_host().is_err());
    assert_eq!(device_only.state(), BufferState::DeviceOnly);
    assert_eq!(live_allocations(), live);
    assert!(device_only.host().unwrap().iter().all(|&b| b == 0x5D));
}

#[test]
fn a_failed_download_changes_nothing() {
    let Some((devices, _lock)) = setup("a_failed_download_changes_nothing") else { return };
    let _staging = warm_staging(&devices[0]);
    for now in [false, true] {
        failed_download(&devices[0], 1000, false, 1, now);
        failed_download(&devices[0], 1000, true, 1, now);
        let staged = 4 * STAGING_CHUNK + 5;
        failed_download(&devices[0], staged, false, 1, now);
        failed_download(&devices[0], staged, false, 3, now);
        failed_download(&devices[0], staged, true, 1, now);
    }
}

#[test]
fn a_failed_device_to_device_copy_changes_nothing() {
    let Some((devices, _lock)) = setup("a_failed_device_to_device_copy_changes_nothing") else { return };
    let [first, second, ..] = &devices[..] else {
        eprintln!("SKIPPED a_failed_device_to_device_copy_changes_nothing: needs two devices");
        return;
    };
    let data = ramp(50_000);
    for now in [false, true] {
        let mut buf = holding(first, &data);
        buf.device_mut().map(drop).unwrap(); // only `first` is valid
        let live = live_allocations();
        arm_copy(1, now);
        assert!(buf.sync_to(second).is_err());
        assert_eq!(buf.state_on(first), BufferState::DeviceDirty);
        assert_eq!(buf.state_on(second), BufferState::Elsewhere);
        assert_eq!(live_allocations(), live);
        buf.sync_to(second).unwrap();
        buf.mark_dirty_on(second).unwrap();
        assert_eq!(buf.to_vec().unwrap(), data);
    }
}

#[test]
fn a_failed_fill_is_reported() {
    let Some((devices, _lock)) = setup("a_failed_fill_is_reported") else { return };
    for value in [7u64, 0x0102_0304_0506_0708] {
        for now in [false, true] {
            let mut buf = UnifiedBuffer::<u64>::on(&[100_000], &devices[0]).unwrap();
            buf.device_overwrite().map(drop).unwrap();
            arm_copy(1, now);
            assert!(buf.fill(value).is_err());
            fail_copy(0);
        }
    }
}

#[test]
fn transfers_take_the_path_their_host_memory_calls_for() {
    let Some((devices, _lock)) = setup("transfers_take_the_path_their_host_memory_calls_for") else { return };
    let device = &devices[0];
    let _staging = warm_staging(device);
    let sync = |n: usize, pinned: bool| {
        let mut buf = buffer(device, n, pinned);
        buf.copy_from(&ramp(n)).unwrap();
        let (all, pinned_before) = (copies(), pinned_copies());
        buf.sync_to_device().unwrap();
        (copies() - all, pinned_copies() - pinned_before)
    };
    // Small pageable: one driver copy. Pinned: one direct DMA. Large pageable: one DMA per
    // staged piece, each from pinned staging memory.
    assert_eq!(sync(1 << 20, false), (1, 0));
    assert_eq!(sync(5 * STAGING_CHUNK, true), (1, 1));
    assert_eq!(sync(5 * STAGING_CHUNK + 1, false), (6, 6));
}

#[test]
fn pageable_blocks_moved_more_than_once_are_registered_and_then_copied_directly() {
    let Some((devices, _lock)) = setup("pageable_blocks_moved_more_than_once_are_registered") else { return };
    let device = &devices[0];
    let _staging = warm_staging(device);
    let n = 3 * STAGING_CHUNK;
    assert!(n >= REGISTER_MIN_BYTES);
    let registered = registrations();
    let mut buf = holding(device, &ramp(n));
    let moves = |buf: &mut UnifiedBuffer<u8>, to_device: bool| {
        let (all, pinned) = (copies(), pinned_copies());
        if to_device {
            buf.mark_host_dirty().unwrap();
            buf.sync_to_device().unwrap();
        } else {
            buf.mark_device_dirty().unwrap();
            buf.sync_to_host().unwrap();
        }
        (copies() - all, pinned_copies() - pinned)
    };
    // The first transfer is staged (3 pieces through pinned staging); the second registers
    // the block and goes straight by DMA, as does every later one.
    assert_eq!(moves(&mut buf, true), (3, 3));
    assert_eq!(registrations(), registered);
    assert_eq!(moves(&mut buf, false), (1, 1));
    assert_eq!(registrations(), registered + 1);
    assert!(buf.is_pinned(), "a registered host copy is page-locked");
    assert_eq!(moves(&mut buf, true), (1, 1));
    assert!(buf.host().unwrap() == &ramp(n)[..]);
    drop(buf);
    assert_eq!(registrations(), registered, "freeing the block unregisters it");
}

#[test]
fn staging_goes_with_the_last_allocation_of_a_device_and_on_trim() {
    let Some((devices, _lock)) = setup("staging_goes_with_the_last_allocation_of_a_device_and_on_trim")
    else {
        return;
    };
    let device = &devices[0];
    let live = live_allocations();
    let staged = warm_staging(device);
    assert_eq!(live_allocations(), live + 2, "a device allocation and the pinned staging");
    drop(staged);
    assert_eq!(live_allocations(), live, "the device's last allocation took its staging with it");

    // A cached buffer's memory stays in the device's pool, so the staging stays too, until a
    // trim gives both back.
    let mut cached = UnifiedBuffer::<u8>::on(&[STAGING_MIN_BYTES], device).unwrap();
    cached.copy_from(&ramp(STAGING_MIN_BYTES)).unwrap();
    cached.sync_to_device().unwrap();
    drop(cached);
    assert_eq!(live_allocations(), live + 2, "cached device block and staging");
    assert!(device.memory_info().unwrap().cached >= STAGING_MIN_BYTES as u64);
    lazybuf::trim();
    assert_eq!(live_allocations(), live);
    assert_eq!(device.memory_info().unwrap().cached, 0);
}

#[test]
fn free_memory_follows_allocations_and_nothing_leaks() {
    let Some((devices, _lock)) = setup("free_memory_follows_allocations_and_nothing_leaks") else { return };
    let device = &devices[0];
    let _staging = warm_staging(device);
    let (live, free) = (live_allocations(), device.memory_info().unwrap().free);
    let mut buf = buffer(device, 64 << 20, true);
    buf.copy_from(&vec![3; 64 << 20]).unwrap();
    buf.sync_to_device().unwrap();
    assert_eq!(device.memory_info().unwrap().free, free - (64 << 20));
    assert_eq!(live_allocations(), live + 2, "one device allocation and one pinned host block");
    drop(buf);
    assert_eq!((live_allocations(), device.memory_info().unwrap().free), (live, free));
}

/// A free that fails (the driver reports a fault at `cuMemFree`, which a drop cannot return) is
/// recorded on its device, taken once by `Device::take_deferred_errors`, never dropped
/// silently and never a panic: for a buffer's device copy and for a memory object.
#[test]
fn a_failed_free_is_recorded_on_its_device() {
    let Some((devices, _lock)) = setup("a_failed_free_is_recorded_on_its_device") else { return };
    let device = &devices[0];
    let buf = holding(device, &[7; 4096]);
    let mut buf = buf;
    buf.sync_to_device().unwrap();
    fail_free(1);
    drop(buf);
    let (errors, dropped) = device.take_deferred_errors();
    assert_eq!((errors.len(), dropped), (1, 0), "{errors:?}");
    let message = errors[0].to_string();
    assert!(message.contains("cuMemFree"), "{message}");
    assert!(device.take_deferred_errors().0.is_empty(), "taken once");

    let options = lazybuf::AllocationOptions { resource: Some(DirectResource::shared()), alignment: 0 };
    let memory = lazybuf::Memory::with_options(device, lazybuf::MemoryKind::Device, 1024, options).unwrap();
    fail_free(1);
    drop(memory);
    let (errors, _) = device.take_deferred_errors();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        devices[1..].iter().all(|other| other.take_deferred_errors().0.is_empty()),
        "on its own device only"
    );
}

/// The stream-ordered device access (`RawBuffer::device_access_ordered`, Python's `.device`)
/// whose upload fails where its stream runs it: the declared kernel write after it
/// (`mark_written`) does not wait and succeeds, the read-back that waits reports the failure,
/// and the buffer is as it was before the upload: host current with its bytes, the counters
/// as they were. Small pageable and pinned (the driver's path), whose uploads are in the
/// stream's order.
#[test]
fn a_failed_stream_ordered_upload_undoes_the_write_declared_after_it() {
    let Some((devices, _lock)) = setup("a_failed_stream_ordered_upload") else { return };
    let device = &devices[0];
    let n = 4096;
    let data = ramp(n);
    for pinned in [false, true] {
        let mut buf = buffer(device, n, pinned);
        buf.copy_from(&data).unwrap();
        let stats = buf.transfer_stats();
        let raw = buf.raw_mut();
        arm_copy(1, false);
        let (_, ticket) = raw.device_access_ordered(device).unwrap();
        assert!(!ticket.is_trivially_done(), "pinned={pinned}: the upload is left in flight");
        raw.mark_written(Some(device)).unwrap();
        let mut out = lazybuf::host_memory::HostMemory::allocate(n).unwrap();
        assert!(raw.read_into(&mut out).is_err(), "pinned={pinned}: the read-back reports the failed upload");
        assert!(ticket.wait().is_err());
        assert!(!raw.is_busy());
        assert_eq!(buf.state(), BufferState::HostOnly, "pinned={pinned}");
        assert_eq!(buf.transfer_stats(), stats);
        assert!(buf.host_if_valid().unwrap() == &data[..]);
        // And it works on the next try, ending where the first would have.
        let raw = buf.raw_mut();
        let (_, ticket) = raw.device_access_ordered(device).unwrap();
        raw.mark_written(Some(device)).unwrap();
        raw.read_into(&mut out).unwrap();
        ticket.wait().unwrap();
        assert!(out.as_slice()[..n] == data[..]);
        assert_eq!(buf.state(), BufferState::DeviceDirty);
    }
}

/// A mark after a stream-ordered upload settles every other transfer first (a hostile pass,
/// 2026-11-27): an upload to a second device that fails, still in flight at the mark, was
/// recorded as current-before-the-mark, and the failed ordered upload's undo then made that
/// copy current with no memory behind it (the next access of it panicked) or with the failed
/// copy's bytes (data lost). Now the mark returns that failure and does nothing else; the
/// ordered upload's failure then undoes only itself.
#[test]
fn a_mark_after_an_ordered_upload_settles_other_transfers_first() {
    let Some((devices, _lock)) = setup("a_mark_after_an_ordered_upload_settles_other_transfers_first") else {
        return;
    };
    let [d0, d1, ..] = &devices[..] else { return };
    let n = 4096;
    let data = ramp(n);
    let mut buf = buffer(d0, n, false);
    buf.copy_from(&data).unwrap();
    let raw = buf.raw_mut();
    arm_copy(1, false);
    let other = raw.sync_async(Some(d1)).unwrap(); // fails where its stream runs it
    arm_copy(1, false);
    let (_, ordered) = raw.device_access_ordered(d0).unwrap(); // fails too
    assert!(raw.mark_written(Some(d0)).is_err(), "the mark reports the other upload's failure");
    assert!(other.wait().is_err());
    assert!(raw.finish().is_err(), "the ordered upload's own failure");
    assert!(ordered.wait().is_err());
    assert_eq!(raw.state_on(d0), BufferState::HostOnly);
    assert_eq!(raw.state_on(d1), BufferState::HostOnly);
    // Both devices usable again, no copy current without memory: marks and reads work.
    raw.mark_written(Some(d1)).unwrap();
    let mut out = lazybuf::host_memory::HostMemory::allocate(n).unwrap();
    raw.read_into(&mut out).unwrap();
    assert!(out.as_slice()[..n] == data[..]);
}

/// The recorder sees the copies the counters count after a failed stream-ordered upload (a
/// hostile pass, 2026-11-27): the read-back that reports the failure downloaded what the
/// upload never wrote; the counters leave it out, and so does the recorder now (it recorded
/// it as a transfer that no rollback could take back).
#[test]
fn the_recorder_leaves_out_the_read_back_a_failed_ordered_upload_voids() {
    use lazybuf::observe::{Direction, trace};
    let Some((devices, _lock)) = setup("the_recorder_leaves_out_the_read_back") else { return };
    let device = &devices[0];
    let n = 4096;
    let mut buf = buffer(device, n, false);
    buf.copy_from(&ramp(n)).unwrap();
    buf.reset_transfer_stats();
    let id = buf.raw().id();
    trace::start(trace::TraceOptions::default()).unwrap();
    let raw = buf.raw_mut();
    arm_copy(1, false);
    raw.device_access_ordered(device).unwrap().1.poll().ok();
    raw.mark_written(Some(device)).unwrap();
    let mut out = lazybuf::host_memory::HostMemory::allocate(n).unwrap();
    let read = raw.read_into(&mut out);
    let recorded = trace::stop().unwrap();
    assert!(read.is_err(), "the read-back reports the failed upload");
    let stats = buf.transfer_stats();
    let summary = recorded.summary();
    let copies = |dir: Direction| {
        summary.rows.iter().filter(|((b, d, _), _)| *b == id && *d == dir).map(|(_, t)| t.copies).sum::<u64>()
    };
    assert_eq!(copies(Direction::HostToDevice), stats.host_to_device.copies);
    assert_eq!(copies(Direction::DeviceToHost), stats.device_to_host.copies);
}

/// Read-modify-write on one buffer with a stream-ordered upload (the seeds' loop: host write,
/// `.device`, a kernel, `to_numpy()`): once the host copy is wanted after read-backs, the
/// read-back downloads into the caller's block behind the upload and fills the host copy from
/// it when the upload is known to have succeeded (one wait where downloading into the host
/// copy took two: `test_cuda_calls.py` counts them). The bytes, the state and the counters are
/// those of a host read followed by a copy out; and when the upload fails, the read-back
/// reports it and the host copy keeps the bytes that upload was to take (it must not be
/// overwritten by a download of what the upload never wrote).
#[test]
fn a_read_modify_write_loop_reads_back_behind_the_upload_and_a_failed_upload_keeps_the_host_copy() {
    let Some((devices, _lock)) = setup("a_read_modify_write_loop_reads_back_behind_the_upload") else {
        return;
    };
    let device = &devices[0];
    let n = 4096;
    let downloads = |b: &UnifiedBuffer<u8>| b.transfer_stats().device_to_host.copies;
    let uploads = |b: &UnifiedBuffer<u8>| b.transfer_stats().host_to_device.copies;
    for pinned in [false, true] {
        let mut buf = buffer(device, n, pinned);
        let mut out = lazybuf::host_memory::HostMemory::allocate(n).unwrap();
        for i in 0..6u8 {
            let fails = i == 4;
            let (up, down) = (uploads(&buf), downloads(&buf));
            let before = buf.host_mut().unwrap().to_vec();
            buf.host_mut().unwrap().fill(i);
            let raw = buf.raw_mut();
            if fails {
                arm_copy(1, false);
            }
            let (_, ticket) = raw.device_access_ordered(device).unwrap();
            raw.mark_written(Some(device)).unwrap();
            let read = raw.read_into(&mut out);
            let _ = ticket.wait();
            if fails {
                assert!(read.is_err(), "pinned={pinned}: the read-back reports the failed upload");
                assert_eq!(buf.state(), BufferState::HostDirty, "pinned={pinned}: as before the upload");
                assert!(buf.host_if_valid().unwrap().iter().all(|&b| b == i), "pinned={pinned}: host kept");
                assert_eq!((uploads(&buf), downloads(&buf)), (up, down), "pinned={pinned}: nothing counted");
                continue;
            }
            read.unwrap();
            assert!(out.as_slice()[..n].iter().all(|&b| b == i), "pinned={pinned} batch {i}");
            assert_eq!(uploads(&buf) - up, 1, "pinned={pinned} batch {i}");
            // Batch 1's host write downloads (the host copy is wanted after a direct read):
            // from then on the read-back updates the host copy.
            let expected_downloads = if i == 1 { 2 } else { 1 };
            assert_eq!(downloads(&buf) - down, expected_downloads, "pinned={pinned} batch {i}: {before:?}");
            if i >= 1 {
                assert_eq!(buf.state(), BufferState::Synchronized, "pinned={pinned} batch {i}");
                assert!(buf.host_if_valid().unwrap().iter().all(|&b| b == i), "pinned={pinned} batch {i}");
            }
        }
    }
}

/// Bytes lent to a buffer as its host copy (and, for one read, to `read_into` as `out`).
struct Lent;
impl lazybuf::host_memory::ForeignHostMemory for Lent {}

/// (The thirteenth hostile pass, 2026-11-28.) `read_into`'s contract allows `out` to be memory lent to the buffer (the copy then runs as
/// memmove) and promises that a failure changes no copy of the buffer. In the read-modify-write
/// mode (`host_sync_pays`) with an ordered upload in flight, `read_staged` downloads into `out`
/// behind the upload on the copy's stream: when the upload fails, the download still ran and
/// wrote what the device copy held (the double's scribble, the previous batch) into `out`,
/// which is the host copy, and the rollback then makes that host copy current again.
#[test]
fn a_failed_upload_behind_a_staged_read_back_into_lent_memory_keeps_the_host_copy() {
    let Some((devices, _lock)) = setup("a_failed_upload_behind_a_staged_read_back_into_lent_memory") else {
        return;
    };
    let device = &devices[0];
    let n = 4096;
    // Leaked: outlives every block lent below.
    let memory: &'static mut [u8] = Box::leak(vec![0u8; n].into_boxed_slice());
    let start = std::ptr::NonNull::new(memory.as_mut_ptr()).unwrap();
    let options = BufferOptions {
        device: Some(device.clone()),
        resource: Some(DirectResource::shared()),
        ..Default::default()
    };
    let mut buf = UnifiedBuffer::<u8>::with_options(&[n], options).unwrap();
    // SAFETY: `memory` is leaked (lives for ever); only the buffer and the reads below (read_into's contract: memory lent to both) use its bytes.
    let block = unsafe { lazybuf::host_memory::HostMemory::adopt(start, n, Box::new(Lent)) };
    buf.raw_mut().adopt_host(block).unwrap();
    // SAFETY: as above: the same lent bytes, as the caller's block of the read.
    let mut out = unsafe { lazybuf::host_memory::HostMemory::adopt(start, n, Box::new(Lent)) };
    for i in 0..4u8 {
        let fails = i == 3;
        buf.host_mut().unwrap().fill(10 + i);
        let raw = buf.raw_mut();
        if fails {
            arm_copy(1, false); // the upload below
        }
        let (_, ticket) = raw.device_access_ordered(device).unwrap();
        raw.mark_written(Some(device)).unwrap();
        let read = raw.read_into(&mut out);
        let _ = ticket.wait();
        if !fails {
            read.unwrap();
            continue;
        }
        arm_copy(0, false);
        assert!(read.is_err(), "the read-back reports the failed upload");
        assert_eq!(buf.state(), BufferState::HostDirty, "as before the upload");
        let host = buf.host_if_valid().expect("the host copy is current again").to_vec();
        assert!(
            host.iter().all(|&b| b == 10 + i),
            "the host copy must keep what the failed upload was to take ({}), got {:?}...",
            10 + i,
            &host[..8]
        );
    }
    drop(buf);
    drop(out);
}

/// `RawBuffer::read_into` in the read-modify-write mode (the host copy wanted after read-backs)
/// is judged by the transfer guard as the explicit `read_into` while the stream-ordered upload
/// it reads behind is still in flight (`read_staged` names its download `read_into`), but as
/// the implicit `host` access once that upload has been settled (the host read path): the same
/// call on the same buffer in the same state (DEVICE_DIRTY) is allowed or refused under
/// `d2h = disallow` depending on whether an upload nobody can see is still in flight. (Before
/// `read_staged`, both were refused as `host`; the recorder names the two `read_into` and
/// `host` too.)
#[test]
fn the_guards_verdict_on_read_into_does_not_depend_on_an_upload_in_flight() {
    use lazybuf::observe::Direction;
    use lazybuf::observe::guard::{self, GuardLevel, GuardLevels};

    let Some((devices, _lock)) =
        setup("the_guards_verdict_on_read_into_does_not_depend_on_an_upload_in_flight")
    else {
        return;
    };
    let device = &devices[0];
    let n = 4096;
    let options = BufferOptions {
        device: Some(device.clone()),
        resource: Some(DirectResource::shared()),
        ..Default::default()
    };
    let mut buf = UnifiedBuffer::<u8>::with_options(&[n], options).unwrap();
    let mut out = lazybuf::host_memory::HostMemory::allocate(n).unwrap();
    // Two batches: the second's host write downloads after a direct read, so the host copy is
    // wanted after read-backs from then on.
    for i in 0..2u8 {
        buf.host_mut().unwrap().fill(i);
        let raw = buf.raw_mut();
        let (_, ticket) = raw.device_access_ordered(device).unwrap();
        raw.mark_written(Some(device)).unwrap();
        raw.read_into(&mut out).unwrap();
        ticket.wait().unwrap();
    }
    let mut verdicts = Vec::new();
    for settle_first in [false, true] {
        buf.host_mut().unwrap().fill(7);
        let raw = buf.raw_mut();
        let (_, ticket) = raw.device_access_ordered(device).unwrap();
        raw.mark_written(Some(device)).unwrap();
        ticket.wait().unwrap();
        if settle_first {
            raw.finish().unwrap(); // the upload, done, settled: nothing in flight
        }
        assert_eq!(buf.state(), BufferState::DeviceDirty);
        let _scope =
            guard::scope(GuardLevels::default().with(Direction::DeviceToHost, Some(GuardLevel::Disallow)));
        let verdict = buf.raw_mut().read_into(&mut out).map_err(|e| e.to_string());
        drop(_scope);
        verdicts.push(verdict);
        let _ = buf.raw_mut().finish();
    }
    assert_eq!(
        verdicts[0].is_ok(),
        verdicts[1].is_ok(),
        "with the upload in flight: {:?}; with it settled: {:?}",
        verdicts[0],
        verdicts[1]
    );
}
