//! The coherence checker's switch.
//!
//! A device copy handed out as a *read* (a device view, Python's `.device`) must not be
//! written: a kernel that writes it must say so (`mark_device_dirty()`, or take the copy for
//! writing), or the host keeps its older bytes and the next host read returns them, silently,
//! on every device that does not alias the host. With checking on, a host read (or a host
//! write that keeps the bytes it does not change: Python's `.host`, Rust's `host_mut`) of a buffer
//! whose host and device copies are both current, and whose device copy was handed out (for
//! reading or writing) since lazybuf last filled or wrote it, on a device that does not alias
//! host memory, copies the
//! device bytes back and compares them with the host's: a difference is an
//! [`crate::Error::Coherence`] naming the missing mark, and nothing else changes.
//!
//! An overwrite of every byte (`host_overwrite`, `copy_from`, `buf[:] = x`) is not checked: it
//! reads no old byte.
//!
//! **Cost**: nothing while off. While on, each such host access costs one device-to-host copy of
//! the buffer into scratch memory and a memcmp (and checks only what the host is about to
//! read). Reads of buffers whose device copy was not handed out cost nothing extra.
//!
//! On with `LAZYBUF_CHECK=1` in the environment (read once, at the first check), or
//! [`set_checking`] at any time.

use std::sync::atomic::{AtomicU8, Ordering};

/// The environment variable that turns the checker on (`1`).
pub const CHECK_ENV: &str = "LAZYBUF_CHECK";

/// 0: not decided yet (read the environment), 1: off, 2: on.
static CHECKING: AtomicU8 = AtomicU8::new(0);

/// Whether the coherence checker is on.
pub fn checking() -> bool {
    match CHECKING.load(Ordering::Relaxed) {
        0 => {
            let on = matches!(
                crate::env::switch(CHECK_ENV).as_deref().map(str::trim),
                Some("1" | "true" | "on" | "yes")
            );
            // A racing set_checking wins over the environment.
            let _ =
                CHECKING.compare_exchange(0, if on { 2 } else { 1 }, Ordering::Relaxed, Ordering::Relaxed);
            CHECKING.load(Ordering::Relaxed) == 2
        }
        state => state == 2,
    }
}

/// Turns the coherence checker on or off for the whole process.
pub fn set_checking(on: bool) {
    CHECKING.store(if on { 2 } else { 1 }, Ordering::Relaxed);
}
