//! Forked children, and the runtimes that do not survive `fork`.
//!
//! `fork` copies only the calling thread. A runtime that runs worker threads (PoCL's OpenCL
//! device, the CUDA driver) is left in the child with its locks held and its workers gone, so
//! the child's first call into it hangs forever or crashes (PyOpenCL and CuPy hang the same
//! way). Each runtime states whether it survives ([`super::Runtime::SURVIVES_FORK`]: the host
//! does; OpenCL, CUDA and wgpu do not).
//!
//! **Detection.** When the first device of a runtime that does not survive is opened, lazybuf
//! registers a `pthread_atfork` child handler that counts forks (a relaxed atomic: the handler
//! runs in the child's only thread, before `fork` returns there). The checked layer
//! ([`super::checked::Checked`]) records the count when a device is opened; every operation
//! that calls the runtime compares it with one relaxed load and, in a child, returns
//! [`crate::Error::ForkedChild`] naming the device instead of calling the runtime. The host
//! device, and any runtime that survives ([`super::Runtime::SURVIVES_FORK`]), keeps working in
//! the child. What calls no runtime is not refused: [`super::Backend::owns`], and empty
//! operations, which [`crate::Stream`] completes without reaching the backend.
//!
//! **Objects in use at the fork.** [`generation`] counts every fork since
//! [`watch_every_fork`] was called (the Python binding calls it at import): a lock that records
//! the generation it was taken in can tell, in a child, that its holder was a thread of the
//! parent, which `fork` did not copy and which will never release it, and refuse instead of
//! waiting forever (the binding's per-object lock does).
//!
//! **Releasing in a child.** Dropping a runtime object (memory, a queue, an event, a pinned
//! host block) in a child would call into the dead runtime too, so the backends' `Drop`s check
//! [`in_forked_child`] and leak their handles there instead: the child's address space, and so
//! the copy of the memory, goes away with the child.

use std::sync::Once;
use std::sync::atomic::{AtomicU64, Ordering};

/// How many times this process's line of ancestors forked since a runtime that does not
/// survive `fork` was first opened in it (0 in the process that opened it).
static FORKS: AtomicU64 = AtomicU64::new(0);

/// The `pthread_atfork` child handler: counts the fork. Async-signal-safe (one atomic add).
extern "C" fn count_fork() {
    FORKS.fetch_add(1, Ordering::Relaxed);
}

/// Registers the fork counter, once per process.
pub(crate) fn watch_forks() {
    static REGISTERED: Once = Once::new();
    register_child_handler(&REGISTERED, count_fork);
}

/// Registers `handler` as a `pthread_atfork` child handler, once (`registered`). A failure
/// (ENOMEM) leaves its forks uncounted, as before this module existed; nothing is registered
/// where there is no `fork`.
fn register_child_handler(registered: &'static Once, handler: extern "C" fn()) {
    #[cfg(unix)]
    registered.call_once(|| {
        // SAFETY: every handler here only does an atomic add (allowed between fork and exec),
        // and is a plain function that lives for the whole process.
        unsafe { libc::pthread_atfork(None, None, Some(handler)) };
    });
    #[cfg(not(unix))]
    let _ = (registered, handler);
}

/// Whether this process is a forked child of a process that had opened a runtime that does not
/// survive `fork`: such a runtime's objects must be leaked here, never released.
#[inline]
pub fn in_forked_child() -> bool {
    FORKS.load(Ordering::Relaxed) != 0
}

/// The fork count now: 0 in the process that first opened a runtime that does not survive
/// `fork`, more in its forked descendants. The checked layer compares it with the count when a
/// device was opened ([`super::checked::Checked`]).
#[inline]
pub(crate) fn forks() -> u64 {
    FORKS.load(Ordering::Relaxed)
}

/// Forks of this process's line since [`watch_every_fork`] was first called (0 in that process).
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// The `pthread_atfork` child handler of [`GENERATION`]. Async-signal-safe (one atomic add).
extern "C" fn count_generation() {
    GENERATION.fetch_add(1, Ordering::Relaxed);
}

/// Starts counting every fork ([`generation`]), once per process; later calls do nothing.
/// Unlike the count behind [`in_forked_child`], it does not depend on any runtime being open.
pub fn watch_every_fork() {
    static REGISTERED: Once = Once::new();
    register_child_handler(&REGISTERED, count_generation);
}

/// How many forks separate this process from the one that called [`watch_every_fork`] first:
/// a value recorded before a fork differs from the one read in the child. One relaxed load.
#[inline]
pub fn generation() -> u64 {
    GENERATION.load(Ordering::Relaxed)
}
