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
            matches!(err, Error::LengthMismatch { operation: "copy_from_memory", expected: 16, actual: 64, .. }),
            "{device}: {err:?}"
        );
        assert!(err.to_string().contains("copy_from_memory"), "{device}: {err}");
        let err = small.copy_from(&large).unwrap_err();
        assert!(
            matches!(err, Error::LengthMismatch { operation: "copy_from", expected: 16, actual: 64, .. }),
            "{device}: {err:?}"
        );
        let err = small.copy_from_host(&[0; 17]).unwrap_err();
        assert!(matches!(err, Error::LengthMismatch { operation: "copy_from_host", .. }), "{device}: {err:?}");
        assert_eq!(small.to_vec().unwrap(), vec![7; 16], "{device}");
    }
}
