//! The nineteenth hostile pass: the transfer guard, the event recorder and the `tracing`
//! events as a hostile user drives them. Each test failed before the fix it names
//! (docs/RELIABILITY.md, "The nineteenth pass").
//!
//! The recorder, the `tracing` switch and the guard's levels are process-wide: the tests take
//! one lock.

#[path = "common/mod.rs"]
mod common;

use std::sync::{Mutex, MutexGuard, PoisonError, mpsc};

use common::{pattern, recorded_allocations};
use lazybuf::coherence::{Location, Residency};
use lazybuf::observe::Direction;
use lazybuf::observe::guard::{self, GuardLevel, GuardLevels};
use lazybuf::observe::trace::{self, EventKind, TraceOptions};
use lazybuf::testing::FaultyDevice;
use lazybuf::{BufferState, UnifiedBuffer};

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(PoisonError::into_inner)
}

const LEN: usize = 1000;

/// A plan whose later step failed (the upload after the device block was taken) recorded the
/// block's allocation and free, and the counters took the allocation back: the trace had one
/// allocation more than `transfer_stats()`, with nothing to tell it apart (the eighteenth
/// pass's leftover). The rollback event now counts the blocks the undone work took, so the
/// trace's allocations less its rollbacks' are the counters', blocking or asynchronous; the
/// allocation and free stay (the memory was held).
#[test]
fn a_failed_plans_blocks_are_rolled_back_in_the_trace_as_in_the_counters() {
    let _serial = serial();
    for device in common::devices() {
        if device.is_zero_copy(LEN * 4) {
            continue; // no device block to take
        }
        for asynchronous in [false, true] {
            let (faulty, faults) = FaultyDevice::wrap(&device);
            let mut buf = UnifiedBuffer::<u32>::on(&[LEN], &faulty).unwrap();
            buf.copy_from(&pattern(1, LEN)).unwrap();
            let id = buf.raw().id();
            let before = buf.transfer_stats();
            trace::start(TraceOptions::default()).unwrap();
            faults.defer_copy_faults(asynchronous);
            faults.fail_copy_in(1);
            let failed = if asynchronous {
                // The failure comes when the transfer is settled (its wait), after its commit.
                buf.sync_to_device_async().and_then(|t| t.wait()).and_then(|()| buf.finish())
            } else {
                buf.sync_to_device()
            };
            faults.disarm();
            let _ = buf.finish();
            // The buffer is where it was, and works.
            assert!(failed.is_err(), "{device}: the upload was to fail");
            assert_eq!(buf.state(), BufferState::HostOnly, "{device}");
            buf.sync_to_device().unwrap();
            let recorded = trace::stop().unwrap();
            let counted = buf.transfer_stats().allocations - before.allocations;
            let blocks = recorded
                .events
                .iter()
                .filter(|e| matches!(&e.kind, EventKind::Allocate { buffer, .. } if *buffer == id))
                .count();
            assert_eq!(
                blocks, 2,
                "{device} (async {asynchronous}): the failed plan's block and the next one's"
            );
            assert_eq!(
                recorded_allocations(&recorded, id),
                counted as i64,
                "{device} (async {asynchronous}): {:#?}",
                recorded.events
            );
        }
    }
}

/// `allocate_copies(host, device)` of a buffer holding nothing runs a host step (a zero-filled
/// host block) and a device step (its upload). The guard saw the upload only when the device
/// step was planned: a refused call had taken a host block first (which may spill another
/// buffer to make room), and recorded its allocation, free and two state transitions. The
/// upload is checked before the host step now: a refused call takes and records nothing.
#[test]
fn a_refused_allocation_of_both_copies_takes_and_records_nothing() {
    let _serial = serial();
    for device in common::devices() {
        if device.is_zero_copy(LEN * 4) {
            continue; // its "upload" moves no byte: nothing to refuse
        }
        let mut buf = UnifiedBuffer::<u32>::on(&[LEN], &device).unwrap();
        let id = buf.raw().id();
        trace::start(TraceOptions::default()).unwrap();
        let refused = {
            let _scope = guard::scope(GuardLevels::all(GuardLevel::DisallowExplicit));
            buf.raw_mut().allocate_copies(true, Some(&device))
        };
        let recorded = trace::stop().unwrap();
        assert!(
            matches!(refused, Err(lazybuf::Error::TransferGuard { direction: Direction::HostToDevice, .. })),
            "{device}: {refused:?}"
        );
        assert_eq!(buf.state(), BufferState::Uninitialized, "{device}");
        assert_eq!(
            buf.raw().residency(Location::Host),
            Residency::Unallocated,
            "{device}: a refused call took memory"
        );
        let of_buffer: Vec<_> = recorded
            .events
            .iter()
            .filter(|e| match &e.kind {
                EventKind::Allocate { buffer, .. } | EventKind::State { buffer, .. } => *buffer == id,
                EventKind::Free { buffer, .. } => *buffer == Some(id),
                _ => false,
            })
            .collect();
        assert!(of_buffer.is_empty(), "{device}: a refused call recorded {of_buffer:#?}");
        // Allowed, it runs as before: one upload, explicit.
        buf.raw_mut().allocate_copies(true, Some(&device)).unwrap();
        assert_eq!(buf.state(), BufferState::Synchronized, "{device}");
    }
}

/// The same two steps on a buffer that holds memory but no data (UNINITIALIZED after an
/// `invalidate()`, or Python's `free()` of exported memory), also as Python's `synchronize()`
/// makes them: the host step zero-filled the host copy and committed, the device step was
/// refused or failed, and the buffer was left HOST_DIRTY (a block taken for it kept) by a call
/// that failed. The host step is undone now, and the guard sees the upload before it runs.
#[test]
fn a_failed_or_refused_upload_after_a_zero_fill_leaves_the_buffer_as_it_was() {
    let _serial = serial();
    for device in common::devices() {
        if device.is_zero_copy(LEN * 4) {
            continue;
        }
        // Memory on both sides, memory on the device only, none.
        for held in ["both", "device", "none"] {
            for refused in [true, false] {
                let (faulty, faults) = FaultyDevice::wrap(&device);
                let mut buf = UnifiedBuffer::<u32>::on(&[LEN], &faulty).unwrap();
                let raw = buf.raw_mut();
                match held {
                    "both" => raw.allocate_copies(true, Some(&faulty)).unwrap(),
                    "device" => raw.allocate_copies(false, Some(&faulty)).unwrap(),
                    _ => {}
                }
                raw.invalidate();
                let id = raw.id();
                let residencies = |raw: &lazybuf::RawBuffer| {
                    [raw.residency(Location::Host), raw.residency(Location::Device(faulty.id()))]
                };
                let before = (raw.state(), residencies(raw), raw.transfer_stats());
                assert_eq!(before.0, BufferState::Uninitialized);
                trace::start(TraceOptions::default()).unwrap();
                let outcome = if refused {
                    let _scope = guard::scope(GuardLevels::all(GuardLevel::DisallowExplicit));
                    raw.allocate_copies(true, Some(&faulty))
                } else {
                    faults.fail_copy_in(1);
                    let failed = raw.allocate_copies(true, Some(&faulty));
                    faults.disarm();
                    failed
                };
                let recorded = trace::stop().unwrap();
                let what = format!("{device}, {held} held, refused {refused}");
                assert!(outcome.is_err(), "{what}: the call was to fail");
                assert_eq!((raw.state(), residencies(raw), raw.transfer_stats()), before, "{what}");
                assert_eq!(recorded_allocations(&recorded, id), 0, "{what}: {:#?}", recorded.events);
                if refused {
                    let touched = recorded.events.iter().any(|e| match &e.kind {
                        EventKind::Allocate { buffer, .. } | EventKind::State { buffer, .. } => *buffer == id,
                        EventKind::Free { buffer, .. } => *buffer == Some(id),
                        _ => false,
                    });
                    assert!(!touched, "{what}: a refused call recorded {:#?}", recorded.events);
                }
                raw.allocate_copies(true, Some(&faulty)).unwrap();
                assert_eq!(raw.state(), BufferState::Synchronized, "{what}");
            }
        }
    }
}

/// The two steps on a buffer whose host copy was spilled to disk: the host step read the file
/// back into a new block (counted and recorded), then the guard refused the upload, so a refused
/// call had changed the counters and the memory held. The device step's copies are checked
/// before the host step now.
#[test]
fn a_refused_allocation_of_a_host_copy_on_disk_reads_nothing_back() {
    let _serial = serial();
    const N: usize = 16 * 1024;
    for device in common::devices() {
        if device.is_zero_copy(N * 4) {
            continue;
        }
        lazybuf::trim();
        lazybuf::spill::set_host_memory_limit(Some(lazybuf::spill::host_memory_held() + 3 * (N as u64) * 4));
        let bufs: Vec<lazybuf::spill::SharedBuffer<u32>> = (0..5)
            .map(|i| {
                let mut buf = UnifiedBuffer::<u32>::on(&[N], &device).unwrap();
                buf.copy_from(&pattern(i, N)).unwrap();
                lazybuf::spill::SharedBuffer::new(buf)
            })
            .collect();
        let mut first = bufs[0].lock();
        assert!(first.raw().is_on_disk(), "{device}: the least recently used went to disk");
        let (stats, held) = (first.transfer_stats(), lazybuf::spill::host_memory_held());
        trace::start(TraceOptions::default()).unwrap();
        let refused = {
            let _scope = guard::scope(GuardLevels::all(GuardLevel::DisallowExplicit));
            first.raw_mut().allocate_copies(true, Some(&device))
        };
        let recorded = trace::stop().unwrap();
        assert!(refused.is_err(), "{device}");
        assert!(first.raw().is_on_disk(), "{device}: a refused call read the file back");
        assert_eq!((first.transfer_stats(), lazybuf::spill::host_memory_held()), (stats, held), "{device}");
        assert!(recorded.events.is_empty(), "{device}: {:#?}", recorded.events);
        first.raw_mut().allocate_copies(true, Some(&device)).unwrap();
        assert_eq!(first.to_vec().unwrap(), pattern(0, N), "{device}");
        drop(first);
        drop(bufs);
        lazybuf::spill::set_host_memory_limit(None);
    }
}

/// A scope entered on one thread and left from another (a Python generator holding a
/// `transfer_guard` block, finalised on another thread) changed nothing, and its levels stayed
/// on the thread that entered it for good. `leave` closes the scope on its own thread now.
#[test]
fn a_scope_left_from_another_thread_restores_the_thread_that_entered_it() {
    let _serial = serial();
    let (token_tx, token_rx) = mpsc::channel();
    let (left_tx, left_rx) = mpsc::channel::<()>();
    let entering = std::thread::spawn(move || {
        let base = guard::enter(GuardLevels::default().with(Direction::DeviceToHost, Some(GuardLevel::Log)));
        let inner = guard::enter(GuardLevels::all(GuardLevel::Disallow));
        token_tx.send(inner).unwrap();
        left_rx.recv().unwrap();
        let after = guard::thread();
        assert!(guard::leave(base));
        (after, guard::thread())
    });
    let inner = token_rx.recv().unwrap();
    // This thread has no such scope: it leaves the other thread's, and only once.
    assert!(guard::leave(inner));
    assert!(!guard::leave(inner));
    assert_eq!(guard::thread(), GuardLevels::default(), "this thread's levels are its own");
    left_tx.send(()).unwrap();
    let (after, end) = entering.join().unwrap();
    assert_eq!(after, GuardLevels::default().with(Direction::DeviceToHost, Some(GuardLevel::Log)));
    assert_eq!(end, GuardLevels::default());
    // No thread keeps a level: an implicit copy here runs unguarded.
    let device = common::devices().into_iter().next().unwrap();
    let mut buf = UnifiedBuffer::<u32>::on(&[LEN], &device).unwrap();
    buf.copy_from(&pattern(2, LEN)).unwrap();
    buf.device().unwrap();
}

#[cfg(feature = "tracing")]
mod subscribers {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tracing::{Event, Metadata, Subscriber, span};

    /// The message (the event's kind) of a `tracing` event.
    fn message(event: &Event<'_>) -> String {
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 = format!("{value:?}");
                }
            }
        }
        let mut m = Message(String::new());
        event.record(&mut m);
        m.0
    }

    /// Panics at the first event of kind `.0`.
    pub struct Panics(pub &'static str);

    /// Uses lazybuf (a host buffer of its own) at its first event.
    pub struct UsesLazybuf(pub AtomicUsize);

    macro_rules! subscriber {
        ($ty:ty, |$this:ident, $event:ident| $body:block) => {
            impl Subscriber for $ty {
                fn enabled(&self, m: &Metadata<'_>) -> bool {
                    m.target().starts_with("lazybuf")
                }
                fn new_span(&self, _: &span::Attributes<'_>) -> span::Id {
                    span::Id::from_u64(1)
                }
                fn record(&self, _: &span::Id, _: &span::Record<'_>) {}
                fn record_follows_from(&self, _: &span::Id, _: &span::Id) {}
                fn event(&self, $event: &Event<'_>) {
                    let $this = self;
                    $body
                }
                fn enter(&self, _: &span::Id) {}
                fn exit(&self, _: &span::Id) {}
            }
        };
    }

    subscriber!(Panics, |this, event| {
        if message(event) == this.0 {
            panic!("the subscriber panics at {}", this.0);
        }
    });

    subscriber!(UsesLazybuf, |this, _event| {
        if this.0.fetch_add(1, Ordering::Relaxed) == 0 {
            let mut scratch = lazybuf::UnifiedBuffer::<u8>::on(&[4], &lazybuf::Device::host()).unwrap();
            scratch.host_mut().unwrap().fill(1);
        }
    });
}

/// A `tracing` subscriber is the caller's code, run in the middle of lazybuf's work. One that
/// panicked unwound through it: at a pool lookup, an allocation or a copy the buffer's plan
/// was left behind (its next observed access failed a debug assertion; a release build named
/// that access's copies after the abandoned plan), and at a device block's allocation the
/// block was lost with its budget charge (`memory_held` up by it for good, pools trimmed).
/// The subscriber's panic is contained now: the call completes, the buffer is consistent,
/// nothing stays charged.
#[cfg(feature = "tracing")]
#[test]
fn a_panicking_tracing_subscriber_never_unwinds_through_lazybuf() {
    let _serial = serial();
    for device in common::devices() {
        for kind in ["pool", "allocate", "transfer", "state"] {
            lazybuf::spill::set_memory_limit(&device, Some(1 << 30));
            lazybuf::trim();
            let held = lazybuf::spill::memory_held(&device);
            let mut buf = UnifiedBuffer::<u32>::on(&[LEN], &device).unwrap();
            buf.copy_from(&pattern(3, LEN)).unwrap();
            lazybuf::observe::set_tracing_events(true);
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                tracing::subscriber::with_default(subscribers::Panics(kind), || buf.device().map(drop))
            }));
            lazybuf::observe::set_tracing_events(false);
            assert!(matches!(outcome, Ok(Ok(()))), "{device} ({kind}): {outcome:?}");
            assert_eq!(buf.state(), BufferState::Synchronized, "{device} ({kind})");
            // Observed again (a plan left behind failed a debug assertion here).
            trace::start(TraceOptions::default()).unwrap();
            buf.mark_device_dirty().unwrap();
            assert_eq!(buf.to_vec().unwrap(), pattern(3, LEN), "{device} ({kind})");
            trace::stop().unwrap();
            drop(buf);
            lazybuf::trim(); // the pools' cached blocks are held too
            assert_eq!(lazybuf::spill::memory_held(&device), held, "{device} ({kind}): memory left charged");
            lazybuf::spill::set_memory_limit(&device, None);
        }
    }
}

/// The `tracing` events were sent while the recorder's table of names was locked: a subscriber
/// that used lazybuf (a buffer of its own, to stage what it logs) waited for that lock for
/// ever, and so did every thread that exported a trace meanwhile. The event is resolved first
/// now, the lock released before the subscriber runs.
#[cfg(feature = "tracing")]
#[test]
fn a_tracing_subscriber_that_uses_lazybuf_does_not_hang() {
    let _serial = serial();
    let device = common::devices().into_iter().next().unwrap();
    let mut buf = UnifiedBuffer::<u32>::on(&[LEN], &device).unwrap();
    buf.copy_from(&pattern(4, LEN)).unwrap();
    lazybuf::observe::set_tracing_events(true);
    let (done_tx, done_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let subscriber = subscribers::UsesLazybuf(Default::default());
        tracing::subscriber::with_default(subscriber, || buf.device().map(drop).unwrap());
        done_tx.send(()).unwrap();
    });
    // A deadline, not a wait for a race: the call completes at once unless it hangs.
    let done = done_rx.recv_timeout(std::time::Duration::from_secs(60));
    lazybuf::observe::set_tracing_events(false);
    assert!(done.is_ok(), "a subscriber that uses lazybuf hung the call");
}

/// `std::env::var` gives the same error for an unset variable and for one that is not
/// Unicode, and lazybuf's readers took both for unset: `LAZYBUF_TRANSFER_GUARD=$'\xff'disallow`
/// left the guard off (never silently off, OBSERVING.md says), `LAZYBUF_MEMORY_LIMIT`,
/// `LAZYBUF_DEVICE` and `LAZYBUF_EVICTION_POLICY` fell back to no limit, the default device
/// and the default policy (a malformed value of each is an error). Every reader goes through
/// `env::text` now, which says the variable is not UTF-8; this test fails on any other
/// `std::env::var` in the crate's sources (`var_os`, for paths, is not matched).
#[test]
fn process_wide_settings_read_the_environment_through_one_reader() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut stack = vec![src.clone()];
    let mut found = Vec::new();
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") && !path.ends_with("src/env.rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                for (n, line) in text.lines().enumerate() {
                    let code = line.split("//").next().unwrap_or("");
                    if code.contains("env::var(") || code.contains("env::vars(") {
                        found.push(format!("{}:{}: {}", path.display(), n + 1, line.trim()));
                    }
                }
            }
        }
    }
    assert!(found.is_empty(), "read through crate::env::text or switch instead:\n{}", found.join("\n"));
}

/// The same reader, in a child process with the variable set to bytes that are not UTF-8: the
/// guard's error names the variable (the test binary runs itself as the child).
#[cfg(unix)]
#[test]
fn a_transfer_guard_setting_that_is_not_utf8_is_malformed_not_unset() {
    use std::os::unix::ffi::OsStrExt;
    if std::env::var_os("LAZYBUF_H19_CHILD").is_some() {
        let err = guard::global().expect_err("a setting that is not UTF-8 was taken as unset");
        let text = err.to_string();
        assert!(text.contains("LAZYBUF_TRANSFER_GUARD") && text.contains("UTF-8"), "{text}");
        // Every guarded call reports it, as for any malformed setting.
        let mut buf = UnifiedBuffer::<u32>::on(&[LEN], &lazybuf::Device::host()).unwrap();
        let access = buf.copy_from(&pattern(5, LEN)).expect_err("an access ran with the setting unread");
        assert!(access.to_string().contains("LAZYBUF_TRANSFER_GUARD"), "{access}");
        return;
    }
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_transfer_guard_setting_that_is_not_utf8_is_malformed_not_unset",
            "--test-threads",
            "1",
        ])
        .env("LAZYBUF_H19_CHILD", "1")
        .env("LAZYBUF_TRANSFER_GUARD", std::ffi::OsStr::from_bytes(b"\xffdisallow"))
        .status()
        .unwrap();
    assert!(status.success(), "the child's checks failed: {status}");
}
