//! Spilling under per-device budgets, on every device: clean copies are evicted
//! moving no byte, copies holding the only current data are written back first, buffers in
//! use and opted-out buffers are never evicted, memory objects count but stay, a failed
//! write-back changes nothing and names its buffer, private pools give their cached blocks
//! back before anything is evicted, write-backs run on a side stream, plain buffers are
//! named in the error when nothing can be evicted, and threads race accesses against
//! eviction.
//!
//! Budgets and the eviction registry are process-wide, so the tests of this binary take one
//! lock and run one at a time. Limits are set relative to what the device already holds.
//! Buffers are 64 KiB, below the size at which a host-sharing OpenCL device aliases host
//! memory; on a zero-copy device (the host device) device copies hold no device memory, so
//! nothing is evicted there and the tests check that instead.

mod common;

use std::sync::{Mutex, MutexGuard, PoisonError};

use common::{devices, pattern};
use lazybuf::spill::{self, SharedBuffer};
use lazybuf::testing::FaultyDevice;
use lazybuf::{
    AllocationOptions, BufferOptions, BufferState, Device, DeviceAllocation, DirectResource, MemoryKind,
    MemoryPool, PoolConfig, UnifiedBuffer,
};

const LEN: usize = 16 * 1024;
const NBYTES: u64 = (LEN * 4) as u64;

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A spillable shared buffer on `device` holding `pattern(seed)` on the host (HOST_ONLY).
fn shared(device: &Device, seed: u32, spillable: bool) -> SharedBuffer<u32> {
    let options = BufferOptions { device: Some(device.clone()), ..BufferOptions::default() };
    let mut buf = UnifiedBuffer::<u32>::with_options(&[LEN], options).unwrap();
    buf.copy_from(&pattern(seed, LEN)).unwrap();
    SharedBuffer::with_spillable(buf, spillable)
}

/// Room for `copies` more device copies than `device` holds now.
fn limit_for(device: &Device, copies: u64) {
    lazybuf::trim();
    spill::set_memory_limit(device, Some(spill::memory_held(device) + copies * NBYTES));
    spill::reset_spill_stats(device);
}

fn evicts(device: &Device) -> bool {
    !device.is_zero_copy(LEN * 4)
}

#[test]
fn a_synchronized_copy_is_evicted_moving_no_byte() {
    let _serial = serial();
    for device in devices() {
        limit_for(&device, 2);
        let bufs: Vec<_> = (0..3).map(|i| shared(&device, i, true)).collect();
        for buf in &bufs {
            let mut b = buf.lock();
            b.reset_transfer_stats();
            b.sync_to_device().unwrap();
        }
        let held = spill::memory_held(&device);
        let stats = spill::spill_stats(&device);
        if evicts(&device) {
            // The third upload needed room: the least recently used copy (the first) went.
            assert_eq!(bufs[0].lock().state(), BufferState::HostOnly, "{device}");
            assert_eq!(bufs[0].lock().transfer_stats().device_to_host.bytes, 0, "{device}");
            assert_eq!(
                (stats.evictions, stats.clean_evictions, stats.bytes_written_back),
                (1, 1, 0),
                "{device}"
            );
            assert!(held <= spill::memory_limit(&device).unwrap().unwrap(), "{device}");
        } else {
            assert_eq!(stats.evictions, 0, "{device}");
        }
        for buf in &bufs[1..] {
            assert_eq!(buf.lock().state(), BufferState::Synchronized, "{device}");
        }
        // The evicted buffer uploads again at its next device access, and its data is intact.
        let mut first = bufs[0].lock();
        first.sync_to_device().unwrap();
        assert_eq!(first.state(), BufferState::Synchronized, "{device}");
        assert_eq!(first.host().unwrap(), pattern(0, LEN), "{device}");
        drop(first);
        if evicts(&device) {
            let stats = spill::spill_stats(&device);
            assert_eq!(stats.evictions, 2, "{device}");
            assert_eq!(stats.bytes_read_back, NBYTES, "{device}");
        }
        spill::set_memory_limit(&device, None);
    }
}

#[test]
fn a_copy_holding_the_only_current_data_is_written_back_first() {
    let _serial = serial();
    for device in devices() {
        limit_for(&device, 1);
        let a = shared(&device, 1, true);
        {
            let mut a = a.lock();
            a.reset_transfer_stats();
            a.device_overwrite().unwrap().write_from(&pattern(77, LEN)).unwrap();
            assert_eq!(a.state(), BufferState::DeviceDirty);
        }
        let b = shared(&device, 2, true);
        b.lock().sync_to_device().unwrap();
        let mut a = a.lock();
        if evicts(&device) {
            assert_eq!(a.state(), BufferState::HostOnly, "{device}");
            assert_eq!(a.transfer_stats().device_to_host.bytes, NBYTES, "{device}");
            let stats = spill::spill_stats(&device);
            assert_eq!((stats.evictions, stats.clean_evictions, stats.bytes_written_back), (1, 0, NBYTES));
        } else {
            assert_eq!(a.state(), BufferState::DeviceDirty, "{device}");
        }
        assert_eq!(a.host().unwrap(), pattern(77, LEN), "{device}");
        spill::set_memory_limit(&device, None);
    }
}

#[test]
fn buffers_in_use_or_opted_out_are_never_evicted() {
    let _serial = serial();
    for device in devices() {
        limit_for(&device, 2);
        let in_use = shared(&device, 1, true);
        let opted_out = shared(&device, 2, false);
        let newcomer = shared(&device, 3, true);
        opted_out.lock().sync_to_device().unwrap();
        let mut held = in_use.lock();
        let view = held.device().unwrap();
        // Both older copies are untouchable: the third one does not fit.
        let err = newcomer.lock().sync_to_device();
        assert_eq!(view.len(), LEN);
        if evicts(&device) {
            let err = err.unwrap_err();
            assert!(err.is_out_of_memory() && err.to_string().contains("memory limit"), "{device}: {err}");
            assert_eq!(newcomer.lock().state(), BufferState::HostOnly, "{device}");
        } else {
            err.unwrap();
        }
        assert_eq!(held.state(), BufferState::Synchronized, "{device}");
        assert_eq!(opted_out.lock().state(), BufferState::Synchronized, "{device}");
        assert!(!opted_out.is_spillable());
        drop(held);
        // Once the view and the lock are gone, the copy in use before is the one evicted.
        newcomer.lock().sync_to_device().unwrap();
        let expected = if evicts(&device) { BufferState::HostOnly } else { BufferState::Synchronized };
        assert_eq!(in_use.lock().state(), expected, "{device}");
        assert_eq!(in_use.lock().host().unwrap(), pattern(1, LEN), "{device}");
        spill::set_memory_limit(&device, None);
    }
}

#[test]
fn memory_objects_count_against_the_budget_but_are_never_evicted() {
    let _serial = serial();
    for device in devices() {
        limit_for(&device, 2);
        let before = spill::memory_held(&device);
        let options = AllocationOptions { resource: Some(DirectResource::shared()), ..Default::default() };
        let object = DeviceAllocation::<u8>::with_options(
            &device,
            MemoryKind::Device,
            NBYTES as usize,
            options.clone(),
        )
        .unwrap();
        assert!(spill::memory_held(&device) >= before + NBYTES, "{device}");
        let a = shared(&device, 1, true);
        a.lock().sync_to_device().unwrap();
        // The object and the buffer fill the budget: a second object of the same size needs
        // the buffer's copy evicted (where it holds device memory), never the first object.
        let second =
            DeviceAllocation::<u8>::with_options(&device, MemoryKind::Device, NBYTES as usize, options);
        let second = second.unwrap();
        if evicts(&device) {
            assert_eq!(a.lock().state(), BufferState::HostOnly, "{device}");
            let third =
                DeviceAllocation::<u8>::with_options(&device, MemoryKind::Device, 1, Default::default());
            assert!(third.unwrap_err().is_out_of_memory(), "{device}");
        }
        assert_eq!(object.nbytes(), NBYTES as usize);
        drop((object, second));
        // Both objects gave their memory back; the buffer's copy was evicted (or never held any).
        assert_eq!(spill::memory_held(&device), before, "{device}");
        spill::set_memory_limit(&device, None);
    }
}

#[test]
fn a_failed_write_back_changes_nothing() {
    let _serial = serial();
    for inner in devices().into_iter().filter(evicts) {
        let (device, faults) = FaultyDevice::wrap(&inner);
        limit_for(&device, 1);
        let a = shared(&device, 1, true);
        a.lock().device_overwrite().unwrap().write_from(&pattern(9, LEN)).unwrap();
        let b = shared(&device, 2, true);
        faults.fail_copy_in(1);
        let err = b.lock().sync_to_device().unwrap_err();
        // The error names the allocation that needed room and the evicted buffer, with the
        // write-back's own error inside (and is as retryable as it).
        let id = a.lock().raw().id();
        let expected = format!(
            "making room on {device} for {NBYTES} bytes: writing back buffer #{id} ({NBYTES} bytes) failed: injected fault"
        );
        assert!(err.to_string().starts_with(&expected), "{device}: {err}");
        match &err {
            lazybuf::Error::WriteBack { requested, buffer, bytes, .. } => {
                assert_eq!((*requested, *buffer, *bytes as u64), (Some(NBYTES as usize), id, NBYTES));
            }
            other => panic!("{device}: expected a write-back error, got {other:?}"),
        }
        assert!(matches!(err.root_cause(), lazybuf::Error::InjectedFault { .. }), "{device}: {err}");
        assert!(err.is_retryable() && !err.is_out_of_memory(), "{device}: {err}");
        faults.disarm();
        assert_eq!(b.lock().state(), BufferState::HostOnly, "{device}");
        let mut a_locked = a.lock();
        assert_eq!(a_locked.state(), BufferState::DeviceDirty, "{device}");
        assert_eq!(spill::spill_stats(&device).evictions, 0, "{device}");
        assert_eq!(a_locked.device().unwrap().len(), LEN);
        assert_eq!(a_locked.host().unwrap(), pattern(9, LEN), "{device}");
        drop(a_locked);
        // Disarmed, the same upload evicts the (now synchronized) copy for free.
        b.lock().sync_to_device().unwrap();
        assert_eq!(a.lock().state(), BufferState::HostOnly, "{device}");
        assert_eq!(b.lock().host().unwrap(), pattern(2, LEN), "{device}");
        spill::set_memory_limit(&device, None);
    }
}

#[test]
fn threads_race_accesses_against_eviction() {
    let _serial = serial();
    for device in devices() {
        // Four threads each hold one buffer's lock while it allocates: room for five copies
        // always leaves one to evict, and eight buffers make eviction constant.
        limit_for(&device, 5);
        let bufs: Vec<_> = (0..8).map(|i| shared(&device, i, true)).collect();
        std::thread::scope(|scope| {
            for t in 0..4u32 {
                let bufs = &bufs;
                let device = &device;
                scope.spawn(move || {
                    for round in 0..40u32 {
                        // Each thread writes its own two buffers; everyone's uploads evict everyone's.
                        let i = (t * 2 + round % 2) as usize;
                        let mut b = bufs[i].lock();
                        let seed = 1000 + t * 100 + round;
                        match round % 3 {
                            0 => b.host_mut().unwrap().copy_from_slice(&pattern(seed, LEN)),
                            1 => b.device_overwrite().unwrap().write_from(&pattern(seed, LEN)).unwrap(),
                            _ => {
                                let before = b.host().unwrap().to_vec();
                                b.sync_to_device().unwrap();
                                let mut out = vec![0u32; LEN];
                                b.device().unwrap().read_into(&mut out).unwrap();
                                assert_eq!(out, before, "{device}");
                                continue;
                            }
                        }
                        // Whatever eviction does between these locks, the write is kept.
                        drop(b);
                        assert_eq!(bufs[i].lock().host().unwrap(), pattern(seed, LEN), "{device}");
                        assert!(spill::memory_held(device) <= spill::memory_limit(device).unwrap().unwrap());
                    }
                });
            }
        });
        if evicts(&device) {
            assert!(spill::spill_stats(&device).evictions > 0, "{device}");
        }
        spill::set_memory_limit(&device, None);
    }
}

#[test]
fn the_benchmarks_write_back_always_policy_downloads_clean_copies_too() {
    let _serial = serial();
    for device in devices().into_iter().filter(evicts) {
        limit_for(&device, 1);
        spill::set_eviction_policy(spill::EvictionPolicy::WriteBackAlways);
        let a = shared(&device, 1, true);
        a.lock().sync_to_device().unwrap();
        shared(&device, 2, true).lock().sync_to_device().unwrap();
        spill::set_eviction_policy(spill::EvictionPolicy::CoherenceAware);
        let mut a = a.lock();
        assert_eq!(a.state(), BufferState::HostOnly, "{device}");
        assert_eq!(a.transfer_stats().device_to_host.bytes, NBYTES, "{device}");
        assert_eq!(spill::spill_stats(&device).bytes_written_back, NBYTES, "{device}");
        assert_eq!(a.host().unwrap(), pattern(1, LEN), "{device}");
        spill::set_memory_limit(&device, None);
    }
}

/// A write-back is a copy like any other: the transfer guard sees it as an implicit
/// device-to-host copy made by `evict`, so under `d2h=disallow` it is refused, the allocation
/// that needed the room fails, and nothing changes; explicitly allowed, the same upload evicts.
#[test]
fn the_transfer_guard_sees_write_backs() {
    use lazybuf::observe::guard::{self, GuardLevel, GuardLevels};
    use lazybuf::observe::{Direction, Reason};
    let _serial = serial();
    for device in devices().into_iter().filter(evicts) {
        limit_for(&device, 1);
        let a = shared(&device, 1, true);
        a.lock().device_overwrite().unwrap().write_from(&pattern(31, LEN)).unwrap();
        let b = shared(&device, 2, true);
        {
            let levels = GuardLevels::default().with(Direction::DeviceToHost, Some(GuardLevel::Disallow));
            let _scope = guard::scope(levels);
            let err = b.lock().sync_to_device().unwrap_err();
            assert!(err.to_string().contains(&format!("writing back buffer #{}", a.lock().raw().id())));
            match err.root_cause() {
                lazybuf::Error::TransferGuard { direction, call, bytes, .. } => {
                    assert_eq!(
                        (*direction, *call, *bytes as u64),
                        (Direction::DeviceToHost, "evict", NBYTES)
                    );
                }
                other => panic!("{device}: expected the guard to refuse the write-back, got {other}"),
            }
            assert_eq!(b.lock().state(), BufferState::HostOnly, "{device}");
            assert_eq!(a.lock().state(), BufferState::DeviceDirty, "{device}");
            assert_eq!(spill::spill_stats(&device).evictions, 0, "{device}");
        }
        // Recorded with its reason once allowed.
        lazybuf::observe::trace::start(Default::default()).unwrap();
        b.lock().sync_to_device().unwrap();
        let trace = lazybuf::observe::trace::stop().unwrap();
        let id = a.lock().raw().id();
        let write_backs = trace
            .events
            .iter()
            .filter(|e| match &e.kind {
                lazybuf::observe::trace::EventKind::Transfer { info, .. } => {
                    info.buffer == id && info.cause.reason == Reason::Eviction
                }
                _ => false,
            })
            .count();
        assert_eq!(write_backs, 1, "{device}");
        assert_eq!(a.lock().state(), BufferState::HostOnly, "{device}");
        assert_eq!(a.lock().host().unwrap(), pattern(31, LEN), "{device}");
        spill::set_memory_limit(&device, None);
    }
}

/// A pool made with `MemoryPool::new` is trimmed like the device's default pool before any
/// copy is evicted: its cached block goes back to the backend and makes the room.
#[test]
fn private_pools_give_their_cached_blocks_back_before_anything_is_evicted() {
    let _serial = serial();
    let evicting: Vec<Device> = devices().into_iter().filter(evicts).collect();
    assert!(!evicting.is_empty(), "no device holds device memory here: the test would check nothing");
    for device in evicting {
        let a = shared(&device, 1, true);
        a.lock().sync_to_device().unwrap();
        let pool = MemoryPool::new(&device, PoolConfig::default());
        {
            let mut pooled = pool.acquire::<u32>(&[LEN], false).unwrap();
            pooled.copy_from(&pattern(2, LEN)).unwrap();
            pooled.sync_to_device().unwrap();
            pool.release(pooled).unwrap();
        }
        let device_cached = |pool: &MemoryPool| pool.usage(|k| k == MemoryKind::Device).bytes_cached;
        assert!(device_cached(&pool) >= NBYTES, "{device}: the pool keeps the block");
        // No room left but what the private pool caches.
        spill::set_memory_limit(&device, Some(spill::memory_held(&device)));
        spill::reset_spill_stats(&device);
        let b = shared(&device, 3, true);
        b.lock().sync_to_device().unwrap();
        assert_eq!(device_cached(&pool), 0, "{device}: the private pool was trimmed");
        assert_eq!(spill::spill_stats(&device).evictions, 0, "{device}");
        assert_eq!(a.lock().state(), BufferState::Synchronized, "{device}: not evicted");
        assert_eq!(b.lock().state(), BufferState::Synchronized, "{device}");
        assert!(spill::memory_held(&device) <= spill::memory_limit(&device).unwrap().unwrap());
        spill::set_memory_limit(&device, None);
    }
}

/// When nothing can be evicted, the error says that plain `UnifiedBuffer`s never are.
#[test]
fn the_out_of_memory_error_says_plain_buffers_are_not_evictable() {
    let _serial = serial();
    for device in devices().into_iter().filter(evicts) {
        limit_for(&device, 1);
        let mut plain = UnifiedBuffer::<u32>::from_slice(&pattern(1, LEN), &device).unwrap();
        plain.sync_to_device().unwrap();
        let err = shared(&device, 2, true).lock().sync_to_device().unwrap_err();
        let message = err.to_string();
        assert!(err.is_out_of_memory(), "{device}: {err}");
        assert!(
            message
                .contains("plain UnifiedBuffers are not evictable in Rust: wrap them in spill::SharedBuffer"),
            "{device}: {message}"
        );
        assert_eq!(plain.state(), BufferState::Synchronized, "{device}");
        spill::set_memory_limit(&device, None);
    }
}

/// A hostile pass (2026-11-27): a limit lowered below what the device's pool cached was not
/// enforced on cache hits, so unevictable buffers took cached blocks far past it (900 KB
/// held under 512 KiB) and nothing failed. The limit holds after every allocation now: the
/// cache goes back and the request takes the budgeted path, which refuses.
#[test]
fn a_limit_lowered_below_the_cached_blocks_holds_for_cache_hits() {
    let _serial = serial();
    for device in devices().into_iter().filter(evicts) {
        lazybuf::trim();
        spill::set_memory_limit(&device, None);
        let base = spill::memory_held(&device);
        // Eight device copies made and dropped: their blocks stay cached, still held.
        let made: Vec<_> = (0..8)
            .map(|i| {
                let mut buf = UnifiedBuffer::<u32>::from_slice(&pattern(i, LEN), &device).unwrap();
                buf.sync_to_device().unwrap();
                buf
            })
            .collect();
        drop(made);
        assert!(spill::memory_held(&device) >= base + 8 * NBYTES, "{device}: the blocks are cached");
        let limit = base + 5 * NBYTES + NBYTES / 2;
        spill::set_memory_limit(&device, Some(limit));
        // Plain buffers cannot be evicted: five fit, the sixth is refused.
        let mut live = Vec::new();
        for i in 0..6u32 {
            let mut buf = UnifiedBuffer::<u32>::from_slice(&pattern(10 + i, LEN), &device).unwrap();
            match buf.sync_to_device() {
                Ok(()) => live.push(buf),
                Err(err) => {
                    assert!(err.is_out_of_memory() && i == 5, "{device}: buffer {i}: {err}");
                    assert_eq!(buf.state(), BufferState::HostOnly, "{device}");
                }
            }
            assert!(spill::memory_held(&device) <= limit, "{device}: {} held", spill::memory_held(&device));
        }
        assert_eq!(live.len(), 5, "{device}");
        for (i, buf) in live.iter_mut().enumerate() {
            let mut out = vec![0u32; LEN];
            buf.device().unwrap().read_into(&mut out).unwrap();
            assert_eq!(out, pattern(10 + i as u32, LEN), "{device}");
        }
        spill::set_memory_limit(&device, None);
    }
}

/// A hostile pass (2026-11-27): a request larger than the whole limit first evicted every
/// evictable copy, writing the dirty ones back, and then failed. It fails at once now,
/// nothing evicted or moved.
#[test]
fn a_request_larger_than_the_whole_limit_fails_evicting_nothing() {
    let _serial = serial();
    for device in devices().into_iter().filter(evicts) {
        limit_for(&device, 2);
        let dirty: Vec<_> = (0..2).map(|i| shared(&device, i, true)).collect();
        for (i, buf) in dirty.iter().enumerate() {
            buf.lock().device_overwrite().unwrap().write_from(&pattern(50 + i as u32, LEN)).unwrap();
        }
        let limit = spill::memory_limit(&device).unwrap().unwrap();
        let options = BufferOptions { device: Some(device.clone()), ..BufferOptions::default() };
        let mut big = UnifiedBuffer::<u8>::with_options(&[limit as usize + 1], options).unwrap();
        let err = big.sync_to_device().unwrap_err();
        assert!(err.is_out_of_memory(), "{device}: {err}");
        assert!(err.to_string().contains("the request alone exceeds its memory limit"), "{device}: {err}");
        let stats = spill::spill_stats(&device);
        assert_eq!((stats.evictions, stats.bytes_written_back), (0, 0), "{device}");
        for (i, buf) in dirty.iter().enumerate() {
            let mut buf = buf.lock();
            assert_eq!(buf.state(), BufferState::DeviceDirty, "{device}");
            let mut out = vec![0u32; LEN];
            buf.device().unwrap().read_into(&mut out).unwrap();
            assert_eq!(out, pattern(50 + i as u32, LEN), "{device}");
        }
        spill::set_memory_limit(&device, None);
    }
}

/// The write-back of an evicted copy runs on its device's side stream (where the backend has
/// more than one stream), not on the buffer's own, ordered after the buffer's last use.
#[test]
fn write_backs_run_on_a_side_stream() {
    use lazybuf::observe::trace::{self, EventKind};
    use lazybuf::observe::{Reason, stream_id};
    let _serial = serial();
    for device in devices().into_iter().filter(evicts) {
        limit_for(&device, 1);
        let a = shared(&device, 1, true);
        a.lock().device_overwrite().unwrap().write_from(&pattern(41, LEN)).unwrap();
        let (id, own) = {
            let a = a.lock();
            (a.raw().id(), stream_id(a.raw().stream()))
        };
        trace::start(Default::default()).unwrap();
        let b = shared(&device, 2, true);
        b.lock().sync_to_device().unwrap();
        let recorded = trace::stop().unwrap();
        let streams: Vec<usize> = recorded
            .events
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::Transfer { info, stream, .. }
                    if info.buffer == id && info.cause.reason == Reason::Eviction =>
                {
                    Some(*stream)
                }
                _ => None,
            })
            .collect();
        assert_eq!(streams.len(), 1, "{device}: one write-back");
        assert_ne!(streams[0], own, "{device}: the write-back ran on the buffer's own stream");
        let mut a = a.lock();
        assert_eq!(a.state(), BufferState::HostOnly, "{device}");
        assert_eq!(a.host().unwrap(), pattern(41, LEN), "{device}");
        assert_eq!(stream_id(a.raw().stream()), own, "{device}: the buffer keeps its stream");
        drop(a);
        spill::set_memory_limit(&device, None);
    }
}

/// Evictions are state changes the recorder records (SYNCHRONIZED or DEVICE_DIRTY becoming
/// HOST_ONLY, named `evict`), so each buffer's state events chain, each starting where the one
/// before ended (the thirteenth hostile pass, 2026-11-28: an eviction freed the copy with no
/// event, and the next event started elsewhere).
#[test]
fn the_state_events_of_evicted_buffers_chain() {
    use lazybuf::observe::trace;
    let _serial = serial();
    for device in devices() {
        if !evicts(&device) {
            continue;
        }
        limit_for(&device, 1);
        trace::start(trace::TraceOptions::default()).unwrap();
        let a = shared(&device, 1, true);
        a.lock().sync_to_device().unwrap(); // SYNCHRONIZED: a clean eviction next
        let b = shared(&device, 2, true);
        b.lock().device_overwrite().unwrap().write_from(&pattern(9, LEN)).unwrap(); // DEVICE_DIRTY
        let c = shared(&device, 3, true);
        c.lock().sync_to_device().unwrap(); // evicts b, written back first
        let recorded = trace::stop().unwrap();
        spill::set_memory_limit(&device, None);
        let ids = [a.lock().raw().id(), b.lock().raw().id(), c.lock().raw().id()];
        let ends = [a.lock().state(), b.lock().state(), c.lock().state()];
        assert_eq!(ends[..2], [BufferState::HostOnly, BufferState::HostOnly], "{device}: both evicted");
        for (id, end) in ids.into_iter().zip(ends) {
            let mut state = BufferState::Uninitialized;
            let mut evictions = 0;
            for event in &recorded.events {
                if let trace::EventKind::State { buffer, from, to, call } = &event.kind
                    && *buffer == id
                {
                    assert_eq!(*from, state, "{device}: buffer {id}: {event:?}");
                    state = *to;
                    evictions += usize::from(*call == "evict");
                }
            }
            assert_eq!(state, end, "{device}: buffer {id}'s events end where it is");
            // (A write-back's own transition is named `evict` too: the copy's download.)
            assert_eq!(evictions > 0, end == BufferState::HostOnly, "{device}: buffer {id}");
        }
    }
}
