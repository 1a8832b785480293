//! The seventeenth hostile pass: the transfer guard, the event recorder and the leftovers the
//! sixteenth noted. Each test failed before the fix it names (docs/RELIABILITY.md, "The
//! seventeenth pass").
#![cfg(feature = "testing")]

#[path = "common/mod.rs"]
mod common;

use lazybuf::{DeviceBuffer, Error};

/// `DeviceBuffer::copy_from_memory` and `copy_from` with more bytes than the buffer holds
/// failed with a length error naming `copy_from_device` (the Python method's name, which
/// neither is): each names itself now, and the buffer is as before.
#[test]
fn each_copy_into_a_device_buffer_names_itself_in_its_length_error() {
    for device in common::devices() {
        let mut small = DeviceBuffer::new(&device, 16).unwrap();
        small.copy_from_host(&[7; 16]).unwrap();
        let mut large = DeviceBuffer::new(&device, 64).unwrap();
        large.copy_from_host(&[1; 64]).unwrap();

        let err = small.copy_from_memory(large.memory(), 64).unwrap_err();
        assert!(
            matches!(
                err,
                Error::LengthMismatch { operation: "copy_from_memory", expected: 16, actual: 64, .. }
            ),
            "{device}: {err:?}"
        );
        assert!(err.to_string().contains("copy_from_memory"), "{device}: {err}");
        let err = small.copy_from(&large).unwrap_err();
        assert!(
            matches!(err, Error::LengthMismatch { operation: "copy_from", expected: 16, actual: 64, .. }),
            "{device}: {err:?}"
        );
        let err = small.copy_from_host(&[0; 17]).unwrap_err();
        assert!(
            matches!(err, Error::LengthMismatch { operation: "copy_from_host", .. }),
            "{device}: {err:?}"
        );
        assert_eq!(small.to_vec().unwrap(), vec![7; 16], "{device}");
    }
}

/// Guard scopes dropped out of the order they were made (fields of a struct drop first to
/// last; `drop(outer)` before the inner one): each restored the levels it found, so the inner
/// one, dropped last, put back the outer one's levels, in force on the thread for good. A scope
/// dropped out of order takes its own levels away now and leaves the others'.
#[test]
fn guard_scopes_dropped_out_of_order_leave_no_level_behind() {
    use lazybuf::observe::Direction;
    use lazybuf::observe::guard::{self, GuardLevel, GuardLevels};

    std::thread::spawn(|| {
        let h2d = |level| GuardLevels::default().with(Direction::HostToDevice, Some(level));
        let d2h = |level| GuardLevels::default().with(Direction::DeviceToHost, Some(level));
        assert_eq!(guard::thread(), GuardLevels::default());

        struct Scopes {
            _outer: guard::GuardScope,
            _inner: guard::GuardScope,
        }
        let scopes = Scopes {
            _outer: guard::scope(h2d(GuardLevel::Disallow)),
            _inner: guard::scope(h2d(GuardLevel::Log)),
        };
        assert_eq!(guard::thread().get(Direction::HostToDevice), Some(GuardLevel::Log));
        drop(scopes);
        assert_eq!(guard::thread(), GuardLevels::default());

        // Three scopes, the middle one dropped first: the others' levels stay, over what the
        // thread had.
        let base = guard::scope(d2h(GuardLevel::LogExplicit));
        let a = guard::scope(h2d(GuardLevel::Disallow));
        let b = guard::scope(GuardLevels::all(GuardLevel::Log).with(Direction::DeviceToDevice, None));
        let c = guard::scope(h2d(GuardLevel::DisallowExplicit));
        drop(b);
        assert_eq!(guard::thread().get(Direction::HostToDevice), Some(GuardLevel::DisallowExplicit));
        assert_eq!(guard::thread().get(Direction::DeviceToHost), Some(GuardLevel::LogExplicit));
        drop(c);
        assert_eq!(guard::thread().get(Direction::HostToDevice), Some(GuardLevel::Disallow));
        drop(a);
        assert_eq!(guard::thread(), d2h(GuardLevel::LogExplicit));
        drop(base);
        assert_eq!(guard::thread(), GuardLevels::default());

        // A token left twice, or one of another thread, changes nothing.
        let token = guard::enter(h2d(GuardLevel::Log));
        assert!(guard::leave(token));
        assert!(!guard::leave(token));
        let disallow = h2d(GuardLevel::Disallow);
        let elsewhere = std::thread::spawn(move || guard::enter(disallow)).join().unwrap();
        assert!(!guard::leave(elsewhere));
        assert_eq!(guard::thread(), GuardLevels::default());
    })
    .join()
    .unwrap();
}
