//! The eighteenth hostile pass: what changed where the recorder, the guard's scopes and the
//! binding's checked assignment met. Each test failed before the fix it names
//! (docs/RELIABILITY.md, "The eighteenth pass").
//!
//! The host memory limit and the recorder are process-wide: the tests take one lock.

#[path = "common/mod.rs"]
mod common;

use common::pattern;
use lazybuf::observe::trace::{self, EventKind, MemoryKind, TraceOptions};
use lazybuf::spill::{self, SharedBuffer};
use lazybuf::{BufferState, UnifiedBuffer};
use std::sync::{Mutex, MutexGuard, PoisonError};

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(PoisonError::into_inner)
}

const LEN: usize = 16 * 1024;
const NBYTES: u64 = (LEN * 4) as u64;

/// A host copy spilled to disk and read back at its next access: the spill recorded the old
/// block's free, the read-back recorded nothing of the new block it took from the resource
/// (nor counted it in `allocations`), so a trace held more host frees than allocations for
/// the buffer (a memory timeline built from it went below zero) and its allocations did not
/// equal the buffer's counted ones. The read-back's block is recorded and counted now.
#[test]
fn a_host_copy_read_back_from_disk_records_and_counts_its_new_block() {
    let _serial = serial();
    for device in common::devices() {
        lazybuf::trim();
        spill::set_host_memory_limit(Some(spill::host_memory_held() + 3 * NBYTES));
        trace::start(TraceOptions::default()).unwrap();
        let bufs: Vec<SharedBuffer<u32>> = (0..5)
            .map(|i| {
                let mut buf = UnifiedBuffer::<u32>::on(&[LEN], &device).unwrap();
                buf.copy_from(&pattern(i, LEN)).unwrap();
                SharedBuffer::new(buf)
            })
            .collect();
        // The two least recently used went to disk; the first's read-back takes a new block.
        assert!(bufs[0].lock().raw().is_on_disk(), "{device}");
        let id = bufs[0].lock().raw().id();
        assert_eq!(bufs[0].lock().host().unwrap(), pattern(0, LEN), "{device}");
        assert!(!bufs[0].lock().raw().is_on_disk(), "{device}");
        assert_eq!(bufs[0].lock().state(), BufferState::HostOnly, "{device}");
        let allocations = bufs[0].lock().transfer_stats().allocations;
        drop(bufs);
        let recorded = trace::stop().unwrap();
        spill::set_host_memory_limit(None);

        let host_events: Vec<&EventKind> = recorded
            .events
            .iter()
            .map(|e| &e.kind)
            .filter(|kind| match kind {
                EventKind::Allocate { buffer, kind, .. } => *buffer == id && *kind == MemoryKind::Host,
                EventKind::Free { buffer, kind, .. } => *buffer == Some(id) && *kind == MemoryKind::Host,
                _ => false,
            })
            .collect();
        // Allocation, free (to disk), allocation (read back), free (the drop).
        let alternates = host_events
            .iter()
            .enumerate()
            .all(|(i, kind)| matches!(kind, EventKind::Allocate { .. }) == (i % 2 == 0));
        assert!(alternates && host_events.len() == 4, "{device}: {host_events:?}");
        assert_eq!(allocations, 2, "{device}: the first block and the read-back's");
    }
}

/// A scope that records (Python's `trace.record()` block) stopped whatever recording ran when
/// it ended: when its own had been stopped inside it and another thread had started one, it
/// stopped that one and took its events. `stop_session` stops the session `start_session`
/// began, and no other (an error, the other left running).
#[test]
fn a_recording_scope_stops_its_own_session_and_no_other() {
    let _serial = serial();
    let options = TraceOptions { capacity: 64, rust_backtrace: false };
    let own = trace::start_session(options).unwrap();
    trace::stop().unwrap(); // stopped inside the scope (by another thread, say)
    let other = trace::start_session(options).unwrap();
    assert_ne!(own, other);
    assert!(trace::stop_session(own).is_err());
    assert!(trace::is_recording(), "the other recording runs on");
    trace::stop_session(other).unwrap();
    assert!(!trace::is_recording());
    assert!(trace::stop_session(other).is_err());
}
