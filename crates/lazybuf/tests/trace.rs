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
