//! The event recorder (`lazybuf::observe::trace`) on every device: the copies it records are
//! the ones the transfer counters count, its allocations the counted allocations; its Chrome
//! trace-event JSON parses, follows the format and its copies' bytes sum to the counters; the
//! ring is bounded; recording off leaves no hook behind; bad calls are clear errors.
//!
//! The recorder is process-wide: each test holds `LOCK` and looks at its own buffers' events.

mod common;

use std::sync::{Mutex, MutexGuard};

use common::pattern;
use lazybuf::observe::trace::{self, EventKind, TraceOptions};
use lazybuf::observe::{self, Direction};
use lazybuf::{BufferState, Device, UnifiedBuffer};
use serde_json::Value;

static LOCK: Mutex<()> = Mutex::new(());

fn lock() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn workload(device: &Device, len: usize) -> UnifiedBuffer<u32> {
    let mut buf = UnifiedBuffer::<u32>::on(&[len], device).unwrap();
    buf.host_mut().unwrap().copy_from_slice(&pattern(1, len));
    buf.sync_to_device().unwrap();
    buf.mark_device_dirty().unwrap();
    buf.to_vec().unwrap();
    buf.host_mut().unwrap()[0] = 5;
    buf.device().unwrap();
    buf.mark_device_dirty().unwrap();
    buf.sync_to_host_async().unwrap().wait().unwrap();
    buf.finish().unwrap();
    buf.host().unwrap();
    buf
}

/// Checks one event against the trace-event format (JSON object form).
fn check_event(e: &Value) {
    let ph = e["ph"].as_str().unwrap_or_else(|| panic!("no ph: {e}"));
    assert!(e["name"].is_string(), "{e}");
    assert!(e["pid"].is_u64(), "{e}");
    match ph {
        "M" => assert!(e["args"]["name"].is_string(), "{e}"),
        "X" => {
            assert!(
                e["ts"].as_f64().is_some_and(|t| t >= 0.0) && e["dur"].as_f64().is_some_and(|d| d >= 0.0),
                "{e}"
            );
            assert!(e["tid"].is_u64(), "{e}");
        }
        "i" => assert!(matches!(e["s"].as_str(), Some("t" | "p" | "g")) && e["ts"].is_f64(), "{e}"),
        "C" => assert!(e["args"].as_object().unwrap().values().all(Value::is_number), "{e}"),
        other => panic!("unexpected phase {other}: {e}"),
    }
}

#[test]
fn the_recorder_sees_exactly_the_counted_copies_on_every_device() {
    let _l = lock();
    for device in common::devices() {
        let len = 1000;
        trace::start(TraceOptions::default()).unwrap();
        let buf = workload(&device, len);
        let recorded = trace::stop().unwrap();
        let id = buf.raw().id();
        let stats = buf.transfer_stats();

        let summary = recorded.summary();
        let tally =
            |d| summary.rows.iter().filter(move |((b, dir, _), _)| *b == id && *dir == d).map(|(_, t)| *t);
        let h2d: (u64, u64) =
            tally(Direction::HostToDevice).fold((0, 0), |a, t| (a.0 + t.copies, a.1 + t.bytes));
        let d2h: (u64, u64) =
            tally(Direction::DeviceToHost).fold((0, 0), |a, t| (a.0 + t.copies, a.1 + t.bytes));
        assert_eq!(h2d, (stats.host_to_device.copies, stats.host_to_device.bytes), "{device}");
        assert_eq!(d2h, (stats.device_to_host.copies, stats.device_to_host.bytes), "{device}");
        if !device.is_zero_copy(len * 4) {
            assert!(stats.bytes_moved() > 0);
            // Explicit calls are "sync", accesses "access"; blocking copies have a duration.
            let reasons: Vec<_> = recorded
                .events
                .iter()
                .filter_map(|e| match &e.kind {
                    EventKind::Transfer { info, duration, .. } if info.buffer == id => {
                        Some((info.cause.call, info.cause.reason.name(), duration.is_some()))
                    }
                    _ => None,
                })
                .collect();
            assert_eq!(
                reasons,
                [
                    ("sync_to_device", "sync", true),
                    ("copy_to", "sync", true),
                    ("device", "access", true),
                    ("sync_to_host_async", "sync", false)
                ],
                "{device}"
            );
        }
        let allocations = recorded
            .events
            .iter()
            .filter(|e| matches!(&e.kind, EventKind::Allocate { buffer, .. } if *buffer == id))
            .count();
        assert_eq!(allocations as u64, stats.allocations, "{device}");
        let first_state = recorded.events.iter().find_map(|e| match &e.kind {
            EventKind::State { buffer, to, .. } if *buffer == id => Some(*to),
            _ => None,
        });
        assert_eq!(first_state, Some(BufferState::HostOnly));

        let doc: Value = serde_json::from_str(&recorded.to_chrome_json()).unwrap();
        let events = doc["traceEvents"].as_array().unwrap();
        events.iter().for_each(check_event);
        let json_bytes: u64 = events
            .iter()
            .filter(|e| e["cat"] == "transfer" && e["args"]["buffer"] == id)
            .map(|e| e["args"]["bytes"].as_u64().unwrap())
            .sum();
        assert_eq!(json_bytes, stats.bytes_moved(), "{device}");
        assert!(summary.to_string().contains("total") || stats.bytes_moved() == 0);
        drop(buf);
    }
}

#[test]
fn frees_pool_hits_and_stacks_are_recorded() {
    let _l = lock();
    let device = common::devices().pop().unwrap();
    // Warm the pool: a released buffer's block is cached for the next one.
    drop(workload(&device, 64));
    trace::start(TraceOptions { capacity: 10_000, rust_backtrace: true }).unwrap();
    let buf = workload(&device, 64);
    drop(buf);
    let recorded = trace::stop().unwrap();
    assert!(recorded.events.iter().any(|e| matches!(e.kind, EventKind::Free { .. })));
    if lazybuf::caching() {
        assert!(recorded.events.iter().any(|e| matches!(e.kind, EventKind::Pool { hit: true, .. })));
        assert!(
            recorded
                .events
                .iter()
                .any(|e| matches!(e.kind, EventKind::Allocate { source: trace::Source::Cache, .. }))
        );
    }
    assert!(
        recorded
            .events
            .iter()
            .all(|e| e.stack.as_deref().is_some_and(|s| s.contains("workload") || s.contains("trace")))
    );
    let doc: Value = serde_json::from_str(&recorded.to_chrome_json()).unwrap();
    doc["traceEvents"].as_array().unwrap().iter().for_each(check_event);
    assert!(doc["traceEvents"].as_array().unwrap().iter().any(|e| e["args"]["stack"].is_string()));
}

#[test]
fn the_ring_is_bounded() {
    let _l = lock();
    let device = common::devices().pop().unwrap();
    trace::start(TraceOptions { capacity: 5, rust_backtrace: false }).unwrap();
    let mut buf = UnifiedBuffer::<u32>::on(&[16], &device).unwrap();
    for _ in 0..50 {
        buf.mark_host_dirty().unwrap();
        buf.mark_device_dirty().unwrap();
    }
    let recorded = trace::stop().unwrap();
    assert_eq!(recorded.events.len(), 5);
    assert!(recorded.dropped >= 95, "{}", recorded.dropped);
    let seqs: Vec<u64> = recorded.events.iter().map(|e| e.seq).collect();
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");
    assert_eq!(seqs[0], recorded.dropped);
}

#[test]
fn recording_off_leaves_no_hook_and_bad_calls_are_errors() {
    let _l = lock();
    assert!(!trace::is_recording());
    assert!(trace::stop().is_err() && trace::snapshot().is_err());
    assert!(trace::start(TraceOptions { capacity: 0, rust_backtrace: false }).is_err());
    trace::start(TraceOptions::default()).unwrap();
    assert!(observe::recording() && observe::active());
    assert!(trace::start(TraceOptions::default()).unwrap_err().to_string().contains("already recording"));
    trace::stop().unwrap();
    assert!(!observe::recording());
    let device = common::devices().pop().unwrap();
    drop(workload(&device, 32));
    trace::start(TraceOptions::default()).unwrap();
    assert!(trace::snapshot().unwrap().events.is_empty());
    assert!(trace::stop().unwrap().events.is_empty());
}

#[test]
fn copies_reported_through_the_hook_are_recorded_with_their_reason() {
    let _l = lock();
    let info = || observe::TransferInfo {
        buffer: 777_777,
        direction: Direction::DeviceToHost,
        bytes: 64,
        from: "a device".into(),
        to: "host".into(),
        cause: observe::Cause { call: "evict", reason: observe::Reason::Eviction },
    };
    trace::start(TraceOptions::default()).unwrap();
    observe::transfer(info).unwrap().expect("recording: a start to report").finished(0);
    observe::transfer(info).unwrap().expect("recording: a start to report").enqueued(0);
    let recorded = trace::stop().unwrap();
    let row = recorded.summary().rows[&(777_777, Direction::DeviceToHost, observe::Reason::Eviction)];
    assert_eq!((row.copies, row.bytes), (2, 128));
    let durations: Vec<bool> = recorded
        .events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Transfer { info, duration, .. } if info.buffer == 777_777 => Some(duration.is_some()),
            _ => None,
        })
        .collect();
    assert_eq!(durations, [true, false]);
}

/// A call that unwinds gives its thread back the enclosing call's cause: the copies after it
/// are the enclosing call's, and outside every call the engine's own names come back.
#[test]
fn a_call_that_unwinds_restores_the_enclosing_cause() {
    let _l = lock();
    for device in common::devices() {
        let mut buf = UnifiedBuffer::<u32>::on(&[256], &device).unwrap();
        buf.host_mut().unwrap().fill(3);
        let id = buf.raw().id();
        trace::start(TraceOptions::default()).unwrap();
        observe::call(observe::Cause::sync("outer"), || {
            let inner = std::panic::catch_unwind(|| {
                observe::call(observe::Cause::sync("inner"), || panic!("the inner call unwinds"))
            });
            assert!(inner.is_err());
            buf.sync_to_device().unwrap();
        });
        buf.mark_host_dirty().unwrap();
        buf.sync_to_device().unwrap();
        let recorded = trace::stop().unwrap();
        let calls: Vec<&str> = transfers_of(&recorded, id).iter().map(|&(_, _, call)| call).collect();
        if device.is_zero_copy(256 * 4) {
            // A device copy that aliases the host block moves no bytes: no copy to name.
            assert!(calls.is_empty(), "{device}: {calls:?}");
        } else {
            assert_eq!(calls, ["outer", "sync_to_device"], "{device}");
        }
        let states: Vec<&str> = recorded
            .events
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::State { buffer, call, .. } if *buffer == id => Some(*call),
                _ => None,
            })
            .collect();
        assert_eq!(states, ["outer", "host", "sync_to_device"], "{device}");
    }
}

/// A call made inside another (a binding's `__array__` calling its `to_numpy`) is part of what
/// the user called: the outermost call names the copies (a hostile pass, 2026-11-27: indexing
/// was named `.host_readonly`, `__array__(copy=True)` an explicit `to_numpy`).
#[test]
fn the_outermost_call_names_the_copies() {
    let _l = lock();
    for device in common::devices().into_iter().filter(|d| !d.is_zero_copy(256 * 4)) {
        let mut buf = UnifiedBuffer::<u32>::on(&[256], &device).unwrap();
        buf.host_mut().unwrap().fill(3);
        let id = buf.raw().id();
        trace::start(TraceOptions::default()).unwrap();
        observe::call(observe::Cause::access("outer"), || {
            observe::call(observe::Cause::sync("inner"), || buf.sync_to_device().unwrap());
        });
        let recorded = trace::stop().unwrap();
        let calls: Vec<&str> = transfers_of(&recorded, id).iter().map(|&(_, _, call)| call).collect();
        assert_eq!(calls, ["outer"], "{device}");
        // And its reason: the outer call is implicit, so the guard refuses the copy as such.
        buf.mark_host_dirty().unwrap();
        let refused = {
            let _scope =
                observe::guard::scope(observe::guard::GuardLevels::all(observe::guard::GuardLevel::Disallow));
            observe::call(observe::Cause::access("outer"), || {
                observe::call(observe::Cause::sync("inner"), || buf.sync_to_device())
            })
        };
        assert!(
            matches!(refused, Err(lazybuf::Error::TransferGuard { call: "outer", .. })),
            "{device}: {refused:?}"
        );
    }
}

/// State changes made outside the plans are recorded too, named after their call: a fill on
/// the device, an invalidation, a release of the memory.
#[test]
fn fills_invalidations_and_releases_record_their_state_transitions() {
    let _l = lock();
    for device in common::devices() {
        let mut buf = UnifiedBuffer::<u32>::on(&[64], &device).unwrap();
        buf.host_mut().unwrap().copy_from_slice(&pattern(2, 64));
        buf.sync_to_device().unwrap(); // SYNCHRONIZED: the fill runs on the device
        let id = buf.raw().id();
        trace::start(TraceOptions::default()).unwrap();
        buf.fill(7).unwrap();
        buf.raw_mut().invalidate();
        buf.host_mut().unwrap()[0] = 1;
        buf.raw_mut().release_memory();
        let recorded = trace::stop().unwrap();
        let states: Vec<(&str, BufferState, BufferState)> = recorded
            .events
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::State { buffer, from, to, call } if *buffer == id => Some((*call, *from, *to)),
                _ => None,
            })
            .collect();
        // The fill writes the device copy (on the host device too, whose copy aliases the host
        // block: the states follow the table there as everywhere).
        assert_eq!(
            states[0],
            ("fill", BufferState::Synchronized, BufferState::DeviceDirty),
            "{device}: {states:?}"
        );
        assert_eq!(
            states[1],
            ("invalidate", BufferState::DeviceDirty, BufferState::Uninitialized),
            "{device}"
        );
        assert_eq!(states.last().unwrap().0, "release_memory", "{device}: {states:?}");
        assert_eq!(states.last().unwrap().2, BufferState::Uninitialized, "{device}");
    }
}

/// The recorded copies of `id` per direction, as the summary counts them.
fn summed(recorded: &trace::Trace, id: u64) -> [(u64, u64); 3] {
    let summary = recorded.summary();
    Direction::ALL.map(|direction| {
        summary
            .rows
            .iter()
            .filter(|((b, d, _), _)| *b == id && *d == direction)
            .fold((0, 0), |(c, n), (_, t)| (c + t.copies, n + t.bytes))
    })
}

/// What the counters of `after` add to `before`, per direction.
fn counted(before: lazybuf::TransferStats, after: lazybuf::TransferStats) -> [(u64, u64); 3] {
    let pairs = |s: lazybuf::TransferStats| {
        [s.host_to_device, s.device_to_host, s.device_to_device].map(|c| (c.copies, c.bytes))
    };
    let (b, a) = (pairs(before), pairs(after));
    [0, 1, 2].map(|i| (a[i].0 - b[i].0, a[i].1 - b[i].1))
}

fn transfers_of(recorded: &trace::Trace, id: u64) -> Vec<(u64, Direction, &'static str)> {
    recorded
        .events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Transfer { info, op, .. } if info.buffer == id => {
                Some((*op, info.direction, info.cause.call))
            }
            _ => None,
        })
        .collect()
}

fn rollbacks_of(recorded: &trace::Trace, id: u64) -> Vec<u64> {
    recorded
        .events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Rollback { buffer, op, .. } if *buffer == id => Some(*op),
            _ => None,
        })
        .collect()
}

/// A buffer of `len` elements (`pattern(seed, len)`) on `device`, copied there once, whose host
/// copy is then the newer one: its next sync uploads.
fn newer_on_the_host(device: &Device, seed: u32, len: usize) -> UnifiedBuffer<u32> {
    let mut buf = common::direct(device, len);
    buf.host_mut().unwrap().copy_from_slice(&pattern(seed, len));
    buf.sync_to_device().unwrap();
    buf.mark_host_dirty().unwrap();
    buf
}

/// An asynchronous sync that returns early, because settling an earlier failed transfer
/// fails, leaves no plan behind: the buffer's next plans are its own (a plan left behind trips
/// a debug assertion at the next one), and their copies are named after their own calls.
#[test]
fn an_async_sync_that_fails_to_settle_leaves_no_plan_behind() {
    let _l = lock();
    for base in common::devices() {
        let (device, faults) = lazybuf::testing::FaultyDevice::wrap(&base);
        let len = 1000;
        if device.is_zero_copy(len * 4) {
            continue;
        }
        let mut buf = newer_on_the_host(&device, 5, len);
        let id = buf.raw().id();
        trace::start(TraceOptions::default()).unwrap();
        faults.defer_copy_faults(true);
        faults.fail_copy_in(1);
        let asked = faults.copies();
        let _transfer = buf.sync_to_device_async().unwrap();
        // Settles the failed upload first: that failure is what it returns.
        let again = buf.sync_to_device_async();
        faults.disarm();
        if faults.copies() == asked {
            trace::stop().unwrap();
            continue;
        }
        assert!(again.is_err(), "{device}: the earlier transfer's failure surfaces");
        buf.sync_to_device().unwrap();
        let recorded = trace::stop().unwrap();
        let calls: Vec<&str> = recorded
            .events
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::Transfer { info, .. } if info.buffer == id => Some(info.cause.call),
                _ => None,
            })
            .collect();
        assert_eq!(calls, ["sync_to_device_async", "sync_to_device"], "{device}");
        assert_eq!(buf.host().unwrap(), &pattern(5, len)[..], "{device}");
    }
}

/// An asynchronous sync whose copy fails when it is settled is undone: its copy is rolled back
/// (in the counters and in the trace's summary alike) and the state transition of the undoing
/// is recorded.
#[test]
fn a_failed_async_transfer_records_its_rollback_and_state_transition() {
    let _l = lock();
    for base in common::devices() {
        let (device, faults) = lazybuf::testing::FaultyDevice::wrap(&base);
        let len = 1000;
        let mut buf = newer_on_the_host(&device, 3, len);
        let id = buf.raw().id();
        let before = buf.transfer_stats();
        trace::start(TraceOptions::default()).unwrap();
        faults.defer_copy_faults(true);
        faults.fail_copy_in(1);
        let copies = !device.is_zero_copy(len * 4);
        let asked = faults.copies();
        let _transfer = buf.sync_to_device_async().unwrap();
        let settled = buf.finish();
        let recorded = trace::stop().unwrap();
        faults.disarm();
        assert_eq!(summed(&recorded, id), counted(before, buf.transfer_stats()), "{device}");
        let transfers = transfers_of(&recorded, id);
        let rollbacks = rollbacks_of(&recorded, id);
        let states: Vec<(&str, BufferState, BufferState)> = recorded
            .events
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::State { buffer, from, to, call } if *buffer == id => Some((*call, *from, *to)),
                _ => None,
            })
            .collect();
        if faults.copies() == asked {
            // A device whose copy aliases the host block may not call the runtime at all:
            // nothing failed, nothing to undo.
            assert!(!copies, "{device}");
            settled.unwrap();
            assert!(transfers.is_empty() && rollbacks.is_empty(), "{device}");
            assert_eq!(states.len(), 1, "{device}: {states:?}");
            continue;
        }
        // The sync's upload fails (on a device that aliases the host block too, where the
        // runtime is still called), and its undoing puts the state back.
        assert!(settled.is_err(), "{device}: the injected fault surfaces");
        assert_eq!(buf.state(), BufferState::HostDirty, "{device}");
        assert_eq!(
            states,
            [
                ("sync_to_device_async", BufferState::HostDirty, BufferState::Synchronized),
                ("rollback", BufferState::Synchronized, BufferState::HostDirty),
            ],
            "{device}"
        );
        if copies {
            assert_eq!(transfers.len(), 1, "{device}: {transfers:?}");
            assert_eq!(transfers[0].1, Direction::HostToDevice, "{device}");
            assert_eq!(rollbacks, [transfers[0].0], "{device}");
            let doc: Value = serde_json::from_str(&recorded.to_chrome_json()).unwrap();
            let events = doc["traceEvents"].as_array().unwrap();
            events.iter().for_each(check_event);
            assert!(events.iter().any(|e| e["cat"] == "rollback" && e["args"]["buffer"] == id));
            assert!(
                events
                    .iter()
                    .filter(|e| e["cat"] == "transfer" && e["args"]["buffer"] == id)
                    .all(|e| e["args"]["rolled_back"] == true)
            );
        } else {
            // A sync with a copy that aliases the host block moves nothing: no copy to undo.
            assert!(transfers.is_empty() && rollbacks.is_empty(), "{device}");
        }
    }
}

/// A plan of two copies (device to host, host to another device) whose second copy fails:
/// the first copy ran and stays in the timeline, but the counters take it back and so does
/// the summary, through the rollback event of its plan.
#[test]
fn a_copy_before_a_failed_later_copy_of_its_plan_is_rolled_back() {
    let _l = lock();
    for home in common::devices() {
        let (other, faults) = lazybuf::testing::FaultyDevice::wrap(&home);
        let len = 1000;
        let mut buf = common::direct(&home, len);
        buf.host_mut().unwrap().copy_from_slice(&pattern(4, len));
        buf.sync_to_device().unwrap();
        buf.mark_device_dirty().unwrap();
        let id = buf.raw().id();
        let before = buf.transfer_stats();
        trace::start(TraceOptions::default()).unwrap();
        faults.fail_copy_in(1);
        let result = buf.device_on(&other).map(drop);
        let recorded = trace::stop().unwrap();
        faults.disarm();
        assert_eq!(summed(&recorded, id), counted(before, buf.transfer_stats()), "{home}");
        assert_eq!(buf.transfer_stats(), before, "{home}: a failed access counts nothing");
        let transfers = transfers_of(&recorded, id);
        let rollbacks = rollbacks_of(&recorded, id);
        // Every recorded copy belongs to a rolled-back plan; a copy into the faulty device
        // fails before it is recorded.
        assert!(
            transfers.iter().all(|(op, ..)| rollbacks.contains(op)),
            "{home}: {transfers:?} {rollbacks:?}"
        );
        assert!(result.is_err(), "{home}: the injected fault surfaces");
        if !home.is_zero_copy(len * 4) && !other.can_copy_from(&home) {
            // The download ran first: it is in the trace, and rolled back.
            assert_eq!(transfers.len(), 1, "{home}: {transfers:?}");
            assert_eq!(transfers[0].1, Direction::DeviceToHost, "{home}");
            assert_eq!(rollbacks, [transfers[0].0], "{home}");
        }
        assert_eq!(buf.to_vec().unwrap(), pattern(4, len), "{home}");
    }
}

/// Every free names the buffer that owned the block, on every path: a release, a drop, and
/// the undoing of a failed access that had allocated.
#[test]
fn frees_name_the_buffer_that_owned_the_memory() {
    let _l = lock();
    for base in common::devices() {
        let (device, faults) = lazybuf::testing::FaultyDevice::wrap(&base);
        let len = 1000;
        trace::start(TraceOptions::default()).unwrap();
        let mut buf = common::direct(&device, len);
        let id = buf.raw().id();
        buf.host_mut().unwrap().copy_from_slice(&pattern(5, len));
        // The upload fails after the device memory was allocated: the allocation is undone.
        faults.fail_copy_in(1);
        let failed = buf.sync_to_device();
        faults.disarm();
        buf.sync_to_device().unwrap();
        drop(buf);
        let recorded = trace::stop().unwrap();
        assert!(failed.is_err(), "{device}: the injected fault surfaces");
        let (mut allocated, mut freed) = (0, 0);
        for event in &recorded.events {
            match &event.kind {
                EventKind::Allocate { buffer, bytes, .. } if *buffer == id => allocated += bytes,
                EventKind::Free { buffer, bytes, .. } => {
                    assert!(buffer.is_some(), "{device}: a buffer's free names no buffer");
                    if *buffer == Some(id) {
                        freed += bytes;
                    }
                }
                _ => {}
            }
        }
        assert!(allocated > 0, "{device}");
        assert_eq!(freed, allocated, "{device}: every block the buffer took is freed under its id");
        let doc: Value = serde_json::from_str(&recorded.to_chrome_json()).unwrap();
        let events = doc["traceEvents"].as_array().unwrap();
        assert!(
            events
                .iter()
                .any(|e| e["name"].as_str().is_some_and(|n| n.starts_with("free"))
                    && e["args"]["buffer"] == id)
        );
    }
}

/// The coherence checker's read of a device copy is recorded as what it is: a checker read,
/// no copy (not in the summary, not in the counters), and the transfer guard does not refuse
/// it (the user turned the checker on).
#[test]
fn the_checkers_comparison_read_is_its_own_event_and_no_copy() {
    let _l = lock();
    for device in common::devices() {
        let len = 1000;
        let mut buf = UnifiedBuffer::<u32>::on(&[len], &device).unwrap();
        buf.host_mut().unwrap().copy_from_slice(&pattern(6, len));
        buf.device().unwrap(); // handed out for reading: the checker compares it
        let id = buf.raw().id();
        let before = buf.transfer_stats();
        lazybuf::set_checking(true);
        trace::start(TraceOptions::default()).unwrap();
        let read = {
            let _refuse = observe::guard::scope(observe::guard::GuardLevels::all(
                observe::guard::GuardLevel::DisallowExplicit,
            ));
            buf.host().map(<[u32]>::to_vec)
        };
        let recorded = trace::stop().unwrap();
        lazybuf::set_checking(false);
        assert_eq!(read.unwrap(), pattern(6, len), "{device}: the guard does not refuse the checker");
        assert_eq!(buf.transfer_stats(), before, "{device}: the checker's read is not counted");
        assert!(transfers_of(&recorded, id).is_empty(), "{device}");
        assert_eq!(summed(&recorded, id), [(0, 0); 3], "{device}");
        let reads: Vec<usize> = recorded
            .events
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::CheckerRead { buffer, bytes, .. } if *buffer == id => Some(*bytes),
                _ => None,
            })
            .collect();
        // A copy that aliases the host block is the host block: nothing to compare.
        let expected: &[usize] = if device.is_zero_copy(len * 4) { &[] } else { &[len * 4] };
        assert_eq!(reads, expected, "{device}");
        let doc: Value = serde_json::from_str(&recorded.to_chrome_json()).unwrap();
        let events = doc["traceEvents"].as_array().unwrap();
        events.iter().for_each(check_event);
        assert_eq!(events.iter().filter(|e| e["cat"] == "checker").count(), expected.len(), "{device}");
    }
}

/// Events of several threads are all gathered, each thread's in its order: those still staged
/// in a running thread's chunk, and those of threads that have exited.
#[test]
fn every_threads_events_are_gathered_in_order() {
    let _l = lock();
    let device = common::devices().pop().unwrap();
    trace::start(TraceOptions::default()).unwrap();
    let (go, wait) = std::sync::mpsc::channel::<()>();
    let (done, finished) = std::sync::mpsc::channel::<u64>();
    // One thread records and stays alive (its events are staged), one records and exits.
    let staying = {
        let device = device.clone();
        std::thread::spawn(move || {
            let mut buf = UnifiedBuffer::<u32>::on(&[16], &device).unwrap();
            for _ in 0..10 {
                buf.mark_host_dirty().unwrap();
                buf.mark_device_dirty().unwrap();
            }
            done.send(buf.raw().id()).unwrap();
            wait.recv().unwrap();
        })
    };
    let exited = {
        let device = device.clone();
        std::thread::spawn(move || {
            let mut buf = UnifiedBuffer::<u32>::on(&[16], &device).unwrap();
            for _ in 0..100 {
                buf.mark_host_dirty().unwrap();
                buf.mark_device_dirty().unwrap();
            }
            buf.raw().id()
        })
        .join()
        .unwrap()
    };
    let staying_id = finished.recv().unwrap();
    let snapshot = trace::snapshot().unwrap();
    go.send(()).unwrap();
    staying.join().unwrap();
    let recorded = trace::stop().unwrap();
    for (trace, what) in [(&snapshot, "snapshot"), (&recorded, "stop")] {
        for (id, rounds) in [(staying_id, 10), (exited, 100)] {
            let states: Vec<BufferState> = trace
                .events
                .iter()
                .filter_map(|e| match &e.kind {
                    EventKind::State { buffer, to, .. } if *buffer == id => Some(*to),
                    _ => None,
                })
                .filter(|to| matches!(to, BufferState::HostDirty | BufferState::DeviceDirty))
                .collect();
            // Each round after the first: dirty host, then dirty device.
            assert!(states.len() > 2 * (rounds - 1), "{what}: {id}: {states:?}");
            let last = &states[states.len() - 2 * (rounds - 1)..];
            assert!(
                last.chunks(2).all(|w| w == [BufferState::HostDirty, BufferState::DeviceDirty]),
                "{what}: {states:?}"
            );
        }
        let seqs: Vec<u64> = trace.events.iter().map(|e| e.seq).collect();
        assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1));
        assert!(trace.events.windows(2).all(|w| w[0].thread != w[1].thread
            || w[0].time <= w[1].time
            || matches!(w[1].kind, EventKind::Transfer { .. })));
    }
}

/// Inside a call (`observe::call`, which every Python method runs in) events share the call's
/// reading of the clock, except copies, which are timed on their own; later events of the call
/// are never stamped before a copy's end, and a new call reads the clock anew.
#[test]
fn events_of_one_call_share_its_time_and_copies_keep_theirs() {
    let _l = lock();
    for device in common::devices() {
        let mut buf = UnifiedBuffer::<u32>::on(&[1 << 16], &device).unwrap();
        buf.host_mut().unwrap().copy_from_slice(&pattern(3, 1 << 16));
        trace::start(TraceOptions::default()).unwrap();
        observe::call(observe::Cause::sync("one_call"), || {
            let mut other = UnifiedBuffer::<u32>::on(&[16], &device).unwrap();
            other.host_mut().unwrap().fill(1);
            std::thread::sleep(std::time::Duration::from_millis(2));
            buf.sync_to_device().unwrap();
            buf.mark_device_dirty().unwrap();
            other.host_mut().unwrap().fill(2);
        });
        std::thread::sleep(std::time::Duration::from_millis(2));
        observe::call(observe::Cause::sync("next_call"), || buf.mark_host_dirty().unwrap());
        let recorded = trace::stop().unwrap();
        // This thread's events (the one that made the first of `buf`'s).
        let thread = recorded
            .events
            .iter()
            .find(|e| matches!(e.kind, EventKind::State { buffer, .. } if buffer == buf.raw().id()))
            .unwrap()
            .thread;
        let events: Vec<_> = recorded.events.iter().filter(|e| e.thread == thread).collect();
        let copy = events.iter().position(|e| matches!(e.kind, EventKind::Transfer { .. }));
        let last_of_call = events
            .iter()
            .rposition(|e| matches!(&e.kind, EventKind::State { call: "one_call", .. }))
            .unwrap_or_else(|| panic!("{device}: {events:#?}"));
        // Before the copy (or without one: a device that aliases the host), one time.
        let first = events[0].time;
        let before_copy = copy.unwrap_or(last_of_call + 1);
        assert!(events[..before_copy].iter().all(|e| e.time == first), "{device}: {events:#?}");
        if let Some(copy) = copy {
            let EventKind::Transfer { duration: Some(duration), .. } = events[copy].kind else {
                panic!("{device}: a blocking copy has a duration: {:?}", events[copy]);
            };
            // The copy is shown at its start, after the 2 ms sleep; the call's later events at
            // its end.
            assert!(events[copy].time >= first + std::time::Duration::from_millis(2), "{device}");
            let end = events[copy].time + duration;
            assert!(events[copy + 1..=last_of_call].iter().all(|e| e.time == end), "{device}: {events:#?}");
        }
        // The next call's event is stamped anew, after the sleep between the calls.
        let next =
            events.iter().find(|e| matches!(&e.kind, EventKind::State { call: "next_call", .. })).unwrap();
        assert!(next.time >= events[last_of_call].time + std::time::Duration::from_millis(2), "{device}");
    }
}

/// A buffer another thread allocated during a call, then dropped inside that call (its last
/// reference handed over: a failure callback or a finalizer running inside the call, as the
/// twentieth hostile pass found), had its free stamped with the call's first reading, before
/// the other thread's allocation: the merged trace freed it before allocating it. A free reads
/// the clock anew, so it comes after whatever the thread that handed the buffer over recorded.
#[test]
fn a_buffer_freed_inside_a_call_after_another_thread_made_it_is_freed_after_its_allocation() {
    let _l = lock();
    for device in common::devices() {
        let mut mine = UnifiedBuffer::<u32>::on(&[16], &device).unwrap();
        trace::start(TraceOptions::default()).unwrap();
        let (made_tx, made_rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let maker = {
            let device = device.clone();
            std::thread::spawn(move || {
                go_rx.recv().unwrap();
                // After the call's first reading, whatever the clock's resolution.
                std::thread::sleep(std::time::Duration::from_millis(2));
                let mut theirs = UnifiedBuffer::<u32>::on(&[16], &device).unwrap();
                theirs.host_mut().unwrap().fill(7);
                made_tx.send(theirs).unwrap();
            })
        };
        let id = observe::call(observe::Cause::sync("one_call"), || {
            mine.host_mut().unwrap().fill(1); // the call's first reading
            go_tx.send(()).unwrap();
            let theirs = made_rx.recv().unwrap();
            let id = theirs.raw().id();
            drop(theirs);
            id
        });
        maker.join().unwrap();
        let recorded = trace::stop().unwrap();
        let of_theirs: Vec<_> = recorded
            .events
            .iter()
            .filter(|e| match e.kind {
                EventKind::Allocate { buffer, .. } => buffer == id,
                EventKind::Free { buffer, .. } => buffer == Some(id),
                _ => false,
            })
            .collect();
        let allocated = of_theirs.iter().position(|e| matches!(e.kind, EventKind::Allocate { .. }));
        let freed = of_theirs.iter().position(|e| matches!(e.kind, EventKind::Free { .. }));
        let (Some(allocated), Some(freed)) = (allocated, freed) else {
            panic!("{device}: an allocation and a free of buffer {id}: {of_theirs:#?}");
        };
        assert!(
            allocated < freed && of_theirs[allocated].time <= of_theirs[freed].time,
            "{device}: buffer {id} freed before it was allocated: {of_theirs:#?}"
        );
    }
}

/// A buffer's host allocation and the transition of the access it served, and its release's
/// free and transition, are staged as one record each (docs/OBSERVING.md, "Cost"); they are
/// collected as the separate events they always were, in order: the allocation (after its
/// pool lookup) before the transition, the free before the release's transition. The same
/// through the in-place overwrite (`host_overwrite_now`), the plan's allocation (`host_mut`),
/// and with the Rust backtrace attached (the slow path stages each record on its own), on
/// every device; the ring counts each of them as two events.
#[test]
fn an_allocation_and_a_release_are_recorded_before_their_transitions() {
    let _l = lock();
    for device in common::devices() {
        for (backtrace, in_place) in [(false, false), (false, true), (true, false), (true, true)] {
            trace::start(TraceOptions { capacity: 10_000, rust_backtrace: backtrace }).unwrap();
            let mut buf = UnifiedBuffer::<u32>::on(&[64], &device).unwrap();
            let id = buf.raw().id();
            if in_place {
                match buf.raw_mut().host_overwrite_now() {
                    Some(bytes) => bytes.unwrap().fill(3),
                    None => buf.host_mut().unwrap().fill(3),
                }
            } else {
                buf.host_mut().unwrap().fill(3);
            }
            drop(buf);
            let recorded = trace::stop().unwrap();
            let mine: Vec<&EventKind> = recorded
                .events
                .iter()
                .map(|e| &e.kind)
                .filter(|kind| match kind {
                    EventKind::Allocate { buffer, .. } | EventKind::State { buffer, .. } => *buffer == id,
                    EventKind::Free { buffer, .. } => *buffer == Some(id),
                    _ => false,
                })
                .collect();
            let what = format!("{device}, backtrace {backtrace}, in place {in_place}: {mine:?}");
            assert!(
                matches!(
                    mine[..],
                    [
                        EventKind::Allocate { kind: trace::MemoryKind::Host, bytes: 256.., .. },
                        EventKind::State { from: BufferState::Uninitialized, to: written, .. },
                        EventKind::Free { kind: trace::MemoryKind::Host, bytes: 256.., .. },
                        EventKind::State {
                            from: released,
                            to: BufferState::Uninitialized,
                            call: "release_memory",
                            ..
                        },
                    ] if written == released && *written != BufferState::Uninitialized
                ),
                "{what}"
            );
            // A pool lookup made for the allocation comes before it.
            let at = |pick: &dyn Fn(&EventKind) -> bool| recorded.events.iter().position(|e| pick(&e.kind));
            let allocation =
                at(&|k| matches!(k, EventKind::Allocate { buffer, .. } if *buffer == id)).unwrap();
            if let Some(lookup) = at(&|k| matches!(k, EventKind::Pool { .. })) {
                assert!(lookup < allocation, "{what}");
            }
            // Sequence numbers follow the events, times never go back.
            assert!(recorded.events.windows(2).all(|w| w[1].seq == w[0].seq + 1), "{what}");
            assert!(recorded.events.windows(2).all(|w| w[0].time <= w[1].time), "{what}");
        }
    }
}

/// A pinned buffer's host copy is recorded as `pinned` memory when its block is page-locked
/// (as a pinned memory object's is), `host` when pinning was not to be had: its allocation and
/// its free, through each way a host block comes and goes (an access's allocation with its
/// transition, a release, a drop), on every device.
#[test]
fn a_pinned_host_copy_is_recorded_as_pinned_memory() {
    use lazybuf::BufferOptions;
    use lazybuf::observe::trace::MemoryKind;
    let _l = lock();
    let mut pinned_somewhere = false;
    for device in common::devices() {
        for release in [false, true] {
            trace::start(TraceOptions::default()).unwrap();
            let options =
                BufferOptions { device: Some(device.clone()), pinned: true, ..BufferOptions::default() };
            let mut buf = UnifiedBuffer::<u32>::with_options(&[256], options).unwrap();
            match buf.host_mut() {
                // A device with no pinned host memory says so (wgpu): nothing to record.
                Err(lazybuf::Error::PinningFailed { .. }) => {
                    trace::stop().unwrap();
                    continue;
                }
                host => host.unwrap().copy_from_slice(&pattern(3, 256)),
            }
            buf.sync_to_device().unwrap();
            let (id, pinned) = (buf.raw().id(), buf.raw().is_pinned());
            pinned_somewhere |= pinned;
            if release {
                buf.release_memory();
            }
            drop(buf);
            let recorded = trace::stop().unwrap();
            let host_kinds: Vec<(bool, MemoryKind)> = recorded
                .events
                .iter()
                .filter_map(|e| match e.kind {
                    EventKind::Allocate { buffer, kind, .. }
                        if buffer == id && kind != MemoryKind::Device =>
                    {
                        Some((true, kind))
                    }
                    EventKind::Free { buffer: Some(buffer), kind, .. }
                        if buffer == id && kind != MemoryKind::Device =>
                    {
                        Some((false, kind))
                    }
                    _ => None,
                })
                .collect();
            let expected = if pinned { MemoryKind::Pinned } else { MemoryKind::Host };
            assert_eq!(host_kinds, [(true, expected), (false, expected)], "{device} (release: {release})");
        }
    }
    assert!(pinned_somewhere, "no device gave a pinned buffer page-locked memory");
}

/// The state transitions recorded of one buffer: (from, to, call).
fn transitions_of(recorded: &trace::Trace, id: u64) -> Vec<(BufferState, BufferState, &'static str)> {
    recorded
        .events
        .iter()
        .filter_map(|e| match e.kind {
            EventKind::State { buffer, from, to, call } if buffer == id => Some((from, to, call)),
            _ => None,
        })
        .collect()
}

/// A buffer running as a call (`RawBuffer::as_call`, how the Python binding names `.device`,
/// `mark_device_dirty()` and `to_numpy()` without the thread's recorder state) names its
/// copies and transitions, also inside another call on the thread (the call is the buffer's
/// own: user code that the outer call ran made it); the guard judges its copies by it
/// (explicit or implicit); the call it ran as before is back when the scope ends, also when
/// it ends by a panic; spilling's write-backs keep their own name.
#[test]
fn a_buffer_running_as_a_call_names_its_copies_and_transitions() {
    let _l = lock();
    for device in common::devices() {
        let copies = !device.is_zero_copy(256 * 4);
        let mut buf = UnifiedBuffer::<u32>::on(&[256], &device).unwrap();
        buf.host_mut().unwrap().fill(3);
        let id = buf.raw().id();
        trace::start(TraceOptions::default()).unwrap();
        observe::call(observe::Cause::access("outer"), || {
            let mut raw = buf.raw_mut().as_call(observe::Cause::sync("own"));
            raw.sync(Some(&device)).unwrap();
            // Nested scopes: the inner one names, then the outer one is back.
            raw.as_call(observe::Cause::access("inner")).mark_written(Some(&device)).unwrap();
            raw.sync(None).unwrap();
        });
        // Outside the scope: the engine's own names again.
        buf.raw_mut().mark_written(None).unwrap();
        let recorded = trace::stop().unwrap();
        let calls: Vec<&str> = transitions_of(&recorded, id).iter().map(|&(_, _, call)| call).collect();
        assert_eq!(calls, ["own", "inner", "own", "host"], "{device}");
        let transfers: Vec<&str> = transfers_of(&recorded, id).iter().map(|&(_, _, call)| call).collect();
        assert_eq!(transfers, if copies { vec!["own", "own"] } else { vec![] }, "{device}");
        // The guard: an explicit call's upload passes `disallow` for implicit copies, an
        // implicit one's is refused, naming the buffer's call.
        if copies {
            use observe::guard::{GuardLevel, GuardLevels};
            let _scope = observe::guard::scope(GuardLevels::all(GuardLevel::Disallow));
            buf.raw_mut().as_call(observe::Cause::sync("explicit")).sync(Some(&device)).unwrap();
            buf.mark_host_dirty().unwrap();
            let refused = buf.raw_mut().as_call(observe::Cause::access("implicit")).sync(Some(&device));
            assert!(
                matches!(refused, Err(lazybuf::Error::TransferGuard { call: "implicit", .. })),
                "{refused:?}"
            );
        }
        // A panic inside the scope puts the previous call back.
        let raw = buf.raw_mut();
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _named = raw.as_call(observe::Cause::access("panics"));
            panic!("inside the scope");
        }));
        assert!(unwound.is_err());
        trace::start(TraceOptions::default()).unwrap();
        buf.raw_mut().mark_written(Some(&device)).unwrap();
        let recorded = trace::stop().unwrap();
        let calls: Vec<&str> = transitions_of(&recorded, id).iter().map(|&(_, _, call)| call).collect();
        assert!(calls.iter().all(|&c| c != "panics"), "{device}: {calls:?}");
    }
}
