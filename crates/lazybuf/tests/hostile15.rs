//! What the fifteenth hostile pass (2026-11-28) changed in the core: a write through the host
//! copy made outside the buffer's lock (`RawBuffer::begin_outside_host_write`, the Python
//! binding's `buf[key] = value`) is not compared by the coherence checker while it lands.
//!
//! The write is the caller's own store through the address of the host copy a host write
//! access handed out, after another access synced the device copy from it (as another thread's
//! `.device` did while NumPy converted the value): the copies then differ until the write ends
//! with an overwrite access, with no kernel involved.

mod common;

use lazybuf::RawBuffer;
use lazybuf::coherence::Access;

const N: usize = 64;

/// A SYNCHRONIZED buffer of `N` zero bytes on `device` whose device copy was handed out for
/// reading after the host copy was handed out for a write (whose address is returned).
fn synced_behind_a_host_write(device: &lazybuf::Device) -> (RawBuffer, *mut u8) {
    let mut raw = RawBuffer::new(N, device.clone(), false);
    raw.host_access(Access::Overwrite).unwrap().fill(0);
    let host = raw.host_access(Access::Write).unwrap().as_mut_ptr();
    raw.device_access(device, Access::Read).unwrap();
    (raw, host)
}

#[test]
fn the_checker_does_not_compare_while_an_outside_host_write_lands() {
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    lazybuf::set_checking(true);
    for device in common::devices() {
        let aliased = {
            let mut probe = RawBuffer::new(N, device.clone(), false);
            probe.device_access(&device, Access::Overwrite).unwrap().is_host_alias()
        };
        // Without the declaration, the same store is a coherence error where the copies are
        // two memories (the control: the checker has its teeth here).
        let (mut raw, host) = synced_behind_a_host_write(&device);
        // SAFETY: (test) `host` is the buffer's host block, N bytes, which stays allocated
        // while `raw` lives; nothing else reads or writes it meanwhile.
        unsafe { host.write(7) };
        let undeclared = raw.host_access(Access::Read).map(|_| ());
        assert_eq!(undeclared.is_err(), !aliased, "{device}: {undeclared:?}");

        let (mut raw, host) = synced_behind_a_host_write(&device);
        raw.begin_outside_host_write();
        // SAFETY: as above.
        unsafe { host.write(7) };
        raw.host_access(Access::Read).unwrap_or_else(|e| panic!("{device}: compared while open: {e}"));
        raw.end_outside_host_write();
        // The end makes the host copy (which holds the store) the only current one.
        raw.host_access(Access::Overwrite).unwrap();
        assert_eq!(raw.host_access(Access::Read).unwrap()[0], 7, "{device}");
        raw.device_access(&device, Access::Read).unwrap();
        raw.mark_written(Some(&device)).unwrap();
        assert_eq!(raw.host_access(Access::Read).unwrap()[0], 7, "{device}: the device copy lacks the store");
    }
    lazybuf::set_checking(false);
}

static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
