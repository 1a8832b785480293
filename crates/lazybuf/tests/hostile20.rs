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
