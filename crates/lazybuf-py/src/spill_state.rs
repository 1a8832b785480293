//! [`SpillState`]: a Python buffer's memory's standing with eviction (its last use, whether
//! it opted out, whether its device or host memory was handed out). Kept apart from
//! [`crate::spill`] (which uses the storage) so that the storage can hold it.
//!
//! What does not live here: the eviction of a storage ([`crate::spill`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use lazybuf::spill;

/// A storage's standing with eviction.
#[derive(Debug)]
pub(crate) struct SpillState {
    last_use: AtomicU64,
    spillable: AtomicBool,
    exposed: AtomicBool,
    host_exposed: AtomicBool,
}

impl Default for SpillState {
    fn default() -> Self {
        SpillState {
            last_use: AtomicU64::new(spill::registry::tick()),
            spillable: AtomicBool::new(true),
            exposed: AtomicBool::new(false),
            host_exposed: AtomicBool::new(false),
        }
    }
}

impl SpillState {
    /// Stamps the storage as used now (each lock of it).
    pub(crate) fn touch(&self) {
        self.last_use.store(spill::registry::tick(), Ordering::Relaxed);
    }

    /// Records that a device handle is about to leave the lock (call with the lock held).
    pub(crate) fn expose(&self) {
        self.exposed.store(true, Ordering::Relaxed);
    }

    /// Records that a host address is about to leave the lock (call with the lock held): the
    /// host block may be used by a NumPy array or an export, so it is never spilled to disk.
    pub(crate) fn expose_host(&self) {
        self.host_exposed.store(true, Ordering::Relaxed);
    }

    /// Opts the storage out of eviction (or back in).
    pub(crate) fn set_spillable(&self, spillable: bool) {
        self.spillable.store(spillable, Ordering::Relaxed);
    }

    /// Whether eviction may free the storage's device copies.
    pub(crate) fn spillable(&self) -> bool {
        self.spillable.load(Ordering::Relaxed)
    }

    /// The logical time of the last use.
    pub(crate) fn last_use(&self) -> u64 {
        self.last_use.load(Ordering::Relaxed)
    }

    /// Whether a device handle has left the lock.
    pub(crate) fn exposed(&self) -> bool {
        self.exposed.load(Ordering::Relaxed)
    }

    /// Whether a host address has left the lock.
    pub(crate) fn host_exposed(&self) -> bool {
        self.host_exposed.load(Ordering::Relaxed)
    }
}
