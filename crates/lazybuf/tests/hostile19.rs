//! The nineteenth hostile pass: the transfer guard, the event recorder and the `tracing`
//! events as a hostile user drives them. Each test failed before the fix it names
//! (docs/RELIABILITY.md, "The nineteenth pass").
//!
//! The recorder, the `tracing` switch and the guard's levels are process-wide: the tests take
//! one lock.

#[path = "common/mod.rs"]
mod common;

use std::sync::{Mutex, MutexGuard, PoisonError, mpsc};

use common::pattern;
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

