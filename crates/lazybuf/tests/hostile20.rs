//! The twentieth hostile pass: memory objects' copies and allocations as a hostile user drives
//! them. Each test failed before the fix it names (docs/RELIABILITY.md, "The twentieth pass").
//!
//! The recorder and the guard's levels are process-wide: the tests take one lock.

#[path = "common/mod.rs"]
mod common;

use std::sync::{Mutex, MutexGuard, PoisonError};

use lazybuf::observe::guard::{self, GuardLevel, GuardLevels};
use lazybuf::observe::trace::{self, EventKind, TraceOptions};
use lazybuf::observe::{Cause, Direction};
use lazybuf::{AllocationOptions, Error, Memory, MemoryKind};

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(PoisonError::into_inner)
}

const LEN: usize = 4096;

/// A binding's constructor that copies into new memory (Python's `MemoryDevice(other,
/// copy=True)`, unpickling) allocated, then asked the guard about the copy: a refused call
/// took a block (which may spill other buffers for room) and recorded its allocation and
/// free. `DeviceAllocation::for_copy_from` asks first, and allocates only a copy it lets
/// through; the refusal names the id the memory would have had, which the copy then takes.
#[test]
fn memory_made_for_a_copy_is_allocated_only_once_the_guard_lets_the_copy_through() {
    let _serial = serial();
    let host = lazybuf::Device::host();
    for device in common::devices() {
        if device.is_zero_copy(LEN) {
            continue; // its memory is host memory: no copy to refuse
        }
        // (the source's memory, the new memory's kind, the direction of the copy)
        let cases = [
            (None, MemoryKind::Device, Direction::HostToDevice),
            (Some((&device, MemoryKind::Device)), MemoryKind::Device, Direction::DeviceToDevice),
            (
                Some((&device, MemoryKind::Device)),
                MemoryKind::Host { pinned: false },
                Direction::DeviceToHost,
            ),
            (Some((&host, MemoryKind::Device)), MemoryKind::Device, Direction::HostToDevice),
        ];
        for (from, kind, direction) in cases {
            let cause = Cause::sync("MemoryDevice");
            trace::start(TraceOptions::default()).unwrap();
            let refused = {
                let _scope =
                    guard::scope(GuardLevels::default().with(direction, Some(GuardLevel::DisallowExplicit)));
                Memory::for_copy_from(&device, kind, LEN, AllocationOptions::default(), from, cause)
            };
            let recorded = trace::stop().unwrap();
            let Err(Error::TransferGuard { direction: said, bytes, call, .. }) = refused else {
                panic!("{device} {direction:?}: expected a refusal, got {refused:?}");
            };
            assert_eq!((said, bytes, call), (direction, LEN, "MemoryDevice"), "{device}");
            let memory_events: Vec<_> = recorded
                .events
                .iter()
                .filter(|e| matches!(e.kind, EventKind::Allocate { .. } | EventKind::Free { .. }))
                .collect();
            assert!(memory_events.is_empty(), "{device} {direction:?}: {memory_events:?}");
            // Let through, it is allocated (and another direction's refusal does not refuse it).
            let other = if direction == Direction::DeviceToDevice {
                Direction::HostToDevice
            } else {
                Direction::DeviceToDevice
            };
            let _scope = guard::scope(GuardLevels::default().with(other, Some(GuardLevel::DisallowExplicit)));
            let memory =
                Memory::for_copy_from(&device, kind, LEN, AllocationOptions::default(), from, cause).unwrap();
            assert_eq!((memory.len(), memory.kind()), (LEN, kind));
        }
    }
}

/// A call made inside another on one thread (`observe::call_anew`: a binding's conversion
/// running the user's code, which uses another buffer) put the enclosing call's first time
/// back when it returned, so the enclosing call's later events were stamped before the
/// nested call's: a buffer the nested call allocated and the enclosing call then dropped was
/// freed, in the trace, before it was allocated. The enclosing call goes on from the nested
/// call's latest time.
#[test]
fn a_call_made_inside_another_keeps_the_threads_time_going_forward() {
    let _serial = serial();
    let device = lazybuf::Device::host();
    trace::start(TraceOptions::default()).unwrap();
    let mut outer = lazybuf::UnifiedBuffer::<f32>::on(&[8], &device).unwrap();
    let mut inner_id = 0;
    lazybuf::observe::call(Cause::sync("outer"), || {
        outer.host_mut().unwrap().fill(1.0); // the enclosing call reads its time
        let inner = lazybuf::observe::call_anew(Cause::sync("inner"), || {
            let mut inner = lazybuf::UnifiedBuffer::<f32>::on(&[8], &device).unwrap();
            inner.host_mut().unwrap().fill(2.0); // allocated in the nested call
            inner
        });
        inner_id = inner.raw().id();
        drop(inner); // freed in the enclosing one
    });
    let recorded = trace::stop().unwrap();
    let times: Vec<(&str, std::time::Duration)> = recorded
        .events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Allocate { buffer, .. } if *buffer == inner_id => Some(("allocate", e.time)),
            EventKind::Free { buffer: Some(buffer), .. } if *buffer == inner_id => Some(("free", e.time)),
            _ => None,
        })
        .collect();
    assert_eq!(times.iter().map(|t| t.0).collect::<Vec<_>>(), ["allocate", "free"], "{times:?}");
    assert!(times[0].1 <= times[1].1, "{times:?}");
}
