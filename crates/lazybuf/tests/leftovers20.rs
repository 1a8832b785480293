//! The twentieth pass: the nineteenth pass's leftovers. Each test failed before the fix it
//! names (docs/RELIABILITY.md, "The twentieth pass").
//!
//! The recorder, the guard's levels, the memory limits and the eviction policy are
//! process-wide: the tests take one lock.

#[path = "common/mod.rs"]
mod common;

use std::sync::{Mutex, MutexGuard, PoisonError};

use common::{devices, pattern, recorded_allocations};
use lazybuf::observe::Direction;
use lazybuf::observe::guard::{self, GuardLevel, GuardLevels};
use lazybuf::observe::trace::{self, Event, EventKind, TraceOptions};
use lazybuf::spill::{self, SharedBuffer};
use lazybuf::testing::FaultyDevice;
use lazybuf::{BufferOptions, BufferState, Device, UnifiedBuffer};

const LEN: usize = 16 * 1024;
const NBYTES: u64 = (LEN * 4) as u64;

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The buffer an event is about, if any.
fn buffer_of(event: &Event) -> Option<u64> {
    match &event.kind {
        EventKind::Transfer { info, .. } => Some(info.buffer),
        EventKind::Allocate { buffer, .. }
        | EventKind::State { buffer, .. }
        | EventKind::Rollback { buffer, .. }
        | EventKind::CheckerRead { buffer, .. } => Some(*buffer),
        EventKind::Free { buffer, .. } => *buffer,
        _ => None,
    }
}

/// A call that reads a host copy spilled to disk back and then fails: `allocate_copies`
/// (Python's `allocate()`), whose host step read it back and whose upload failed, kept the
/// block it read back (counted and recorded, the disk tier's `bytes_from_disk` moved), where
/// a failed call leaves the buffer as it was; so did `sync_to_device` and an asynchronous sync
/// whose copy failed to start. The file holds the host copy again now, the block given back,
/// the counters as before.
#[test]
fn a_failed_call_after_a_read_back_leaves_the_host_copy_on_disk() {
    let _serial = serial();
    for device in devices() {
        if device.is_zero_copy(LEN * 4) {
            continue; // no upload to fail
        }
        for call in ["allocate", "sync_to_device", "sync_to_device_async"] {
            let (faulty, faults) = FaultyDevice::wrap(&device);
            let mut buf = UnifiedBuffer::<u32>::on(&[LEN], &faulty).unwrap();
            buf.copy_from(&pattern(3, LEN)).unwrap();
            assert_eq!(buf.raw_mut().spill_host_to_disk().unwrap(), Some(LEN * 4), "{device}");
            let id = buf.raw().id();
            let (stats, from_disk) = (buf.transfer_stats(), spill::spill_stats(&faulty).bytes_from_disk);
            trace::start(TraceOptions::default()).unwrap();
            faults.fail_copy_in(1);
            let failed = match call {
                "allocate" => buf.raw_mut().allocate_copies(true, Some(&faulty)),
                "sync_to_device" => buf.sync_to_device(),
                // The copy fails when it is enqueued (not deferred): before it is under way.
                _ => buf.sync_to_device_async().map(drop),
            };
            faults.disarm();
            let recorded = trace::stop().unwrap();
            assert!(failed.is_err(), "{device} {call}: the upload was to fail");
            assert!(buf.raw().is_on_disk(), "{device} {call}: the block read back was kept");
            assert_eq!(buf.state(), BufferState::HostOnly, "{device}");
            assert_eq!(buf.transfer_stats(), stats, "{device} {call}");
            assert_eq!(spill::spill_stats(&faulty).bytes_from_disk, from_disk, "{device} {call}");
            assert_eq!(recorded_allocations(&recorded, id), 0, "{device} {call}: {recorded:?}");
            // It works, reading the file back.
            buf.raw_mut().allocate_copies(true, Some(&faulty)).unwrap();
            assert_eq!(buf.state(), BufferState::Synchronized, "{device}");
            assert_eq!(spill::spill_stats(&faulty).bytes_from_disk, from_disk + NBYTES, "{device}");
            assert_eq!(buf.host().unwrap(), pattern(3, LEN), "{device}");
        }
    }
}

/// The same for an asynchronous sync whose copy fails once under way (through its ticket,
/// when settled): the read-back stood (the file was removed when the transfer started), so the
/// failed sync left the host copy in memory, counted and recorded as an allocation. The file
/// is kept until the transfer settles now (twenty-second pass).
#[test]
fn an_async_sync_that_fails_under_way_leaves_the_host_copy_on_disk() {
    let _serial = serial();
    for device in devices() {
        if device.is_zero_copy(LEN * 4) {
            continue; // no upload to fail
        }
        let (faulty, faults) = FaultyDevice::wrap(&device);
        let mut buf = UnifiedBuffer::<u32>::on(&[LEN], &faulty).unwrap();
        buf.copy_from(&pattern(4, LEN)).unwrap();
        assert_eq!(buf.raw_mut().spill_host_to_disk().unwrap(), Some(LEN * 4), "{device}");
        let id = buf.raw().id();
        let (stats, from_disk) = (buf.transfer_stats(), spill::spill_stats(&faulty).bytes_from_disk);
        trace::start(TraceOptions::default()).unwrap();
        faults.defer_copy_faults(true);
        faults.fail_copy_in(1);
        let started = buf.sync_to_device_async().map(drop);
        // Under way: the host copy is in memory, the file still there.
        assert!(started.is_ok(), "{device}: {started:?}");
        assert!(!buf.raw().is_on_disk(), "{device}");
        let failed = buf.raw_mut().finish();
        faults.disarm();
        faults.defer_copy_faults(false);
        let recorded = trace::stop().unwrap();
        assert!(failed.is_err(), "{device}: the upload was to fail");
        assert!(buf.raw().is_on_disk(), "{device}: the block read back was kept");
        assert_eq!(buf.state(), BufferState::HostOnly, "{device}");
        assert_eq!(buf.transfer_stats(), stats, "{device}");
        assert_eq!(spill::spill_stats(&faulty).bytes_from_disk, from_disk, "{device}");
        assert_eq!(recorded_allocations(&recorded, id), 0, "{device}: {recorded:?}");
        // It works, reading the file back; and a sync that succeeds removes the file.
        buf.sync_to_device_async().unwrap().wait().unwrap();
        buf.raw_mut().finish().unwrap();
        assert!(!buf.raw().is_on_disk(), "{device}");
        assert_eq!(buf.state(), BufferState::Synchronized, "{device}");
        assert_eq!(spill::spill_stats(&faulty).bytes_from_disk, from_disk + NBYTES, "{device}");
        assert_eq!(buf.host().unwrap(), pattern(4, LEN), "{device}");
    }
}

fn shared(device: &Device, seed: u32) -> SharedBuffer<u32> {
    let options = BufferOptions { device: Some(device.clone()), ..BufferOptions::default() };
    let mut buf = UnifiedBuffer::<u32>::with_options(&[LEN], options).unwrap();
    buf.copy_from(&pattern(seed, LEN)).unwrap();
    SharedBuffer::with_spillable(buf, true)
}

/// Under the benchmarks' blind spiller (`write-back-always`), the write-back of a clean copy
/// marked the host copy stale (a state event), then the guard refused the download and the
/// mark was undone (a second one): a refused copy recorded two transitions that cancel out.
/// The guard sees the write-back first now: nothing changes, nothing is recorded.
#[test]
fn a_refused_blind_write_back_changes_and_records_nothing() {
    let _serial = serial();
    for device in devices().into_iter().filter(|d| !d.is_zero_copy(LEN * 4)) {
        lazybuf::trim();
        spill::set_memory_limit(&device, Some(spill::memory_held(&device) + NBYTES));
        spill::set_eviction_policy(spill::EvictionPolicy::WriteBackAlways);
        let a = shared(&device, 1);
        a.lock().sync_to_device().unwrap();
        assert_eq!(a.lock().state(), BufferState::Synchronized, "{device}");
        let id = a.lock().raw().id();
        let stats = a.lock().transfer_stats();
        let b = shared(&device, 2);
        trace::start(TraceOptions::default()).unwrap();
        let refused = {
            let levels = GuardLevels::default().with(Direction::DeviceToHost, Some(GuardLevel::Disallow));
            let _scope = guard::scope(levels);
            b.lock().sync_to_device()
        };
        let recorded = trace::stop().unwrap();
        spill::set_eviction_policy(spill::EvictionPolicy::CoherenceAware);
        let err = refused.expect_err("the write-back was to be refused");
        assert!(
            matches!(err.root_cause(), lazybuf::Error::TransferGuard { call: "evict", .. }),
            "{device}: {err}"
        );
        let mine: Vec<&Event> = recorded.events.iter().filter(|e| buffer_of(e) == Some(id)).collect();
        assert!(mine.is_empty(), "{device}: {mine:?}");
        assert_eq!(a.lock().state(), BufferState::Synchronized, "{device}");
        assert_eq!(a.lock().transfer_stats(), stats, "{device}");
        assert_eq!(a.lock().host().unwrap(), pattern(1, LEN), "{device}");
        spill::set_memory_limit(&device, None);
    }
}
