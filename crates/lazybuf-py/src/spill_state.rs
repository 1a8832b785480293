//! [`SpillState`]: a Python buffer's memory's standing with eviction (its last use, whether
//! it opted out, how many objects lazybuf cannot see use its device or host memory now). Kept
//! apart from [`crate::spill`] (which uses the storage) so that the storage can hold it.
//!
//! **Scoped exposure.** A device handle or host address that leaves the storage lock goes
//! with an exposure token ([`crate::views::Exposure`]); whatever can reach the memory through it holds the token (a
//! [`crate::views::MemoryOwner`], a DLPack manager context, a buffer-protocol export, the
//! buffer object for `__array_interface__` / `__cuda_array_interface__`). The count goes
//! up under the storage lock (eviction checks it again under the same lock, so no eviction
//! slips between the count and the handle leaving) and down when the token is dropped, on
//! any thread, without the lock (eviction only try-locks it) and without the interpreter
//! (a DLPack deleter or a finalizer may drop it anywhere). A count that is seen late only
//! makes an eviction skip the buffer once more.
//!
//! What does not live here: the eviction of a storage ([`crate::spill`]); the token itself,
//! which holds the storage ([`crate::views`]).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use lazybuf::spill;

/// A storage's standing with eviction.
#[derive(Debug)]
pub(crate) struct SpillState {
    last_use: AtomicU64,
    spillable: AtomicBool,
    /// Live exposures of a device handle ([`Exposed::Device`]).
    device_exposures: AtomicUsize,
    /// Live exposures of a host address ([`Exposed::Host`]).
    host_exposures: AtomicUsize,
    /// A CuPy array over the device copy was dropped and lazybuf is not yet ordered after
    /// CuPy's current stream: kernels CuPy enqueued on it may still use the copy, so it is
    /// not evicted until the next call on the buffer orders lazybuf after them
    /// ([`crate::streams::order_after_cupy`]).
    cupy_unordered: AtomicBool,
}

impl Default for SpillState {
    fn default() -> Self {
        SpillState {
            last_use: AtomicU64::new(spill::registry::tick()),
            spillable: AtomicBool::new(true),
            device_exposures: AtomicUsize::new(0),
            host_exposures: AtomicUsize::new(0),
            cupy_unordered: AtomicBool::new(false),
        }
    }
}

/// What an exposure token hands out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Exposed {
    /// A device handle: the device copies are not evicted while it is out. On the host
    /// device that copy is the host block too, so it is not written to disk either.
    Device,
    /// A host address: the host copy is not written to disk while it is out.
    Host,
}

impl SpillState {
    /// Stamps the storage as used now (each lock of it).
    pub(crate) fn touch(&self) {
        self.last_use.store(spill::registry::tick(), Ordering::Relaxed);
    }

    fn count(&self, kind: Exposed) -> &AtomicUsize {
        match kind {
            Exposed::Device => &self.device_exposures,
            Exposed::Host => &self.host_exposures,
        }
    }

    /// Counts one more live exposure of `kind`. Call with the storage's lock held, before the
    /// handle or address leaves it.
    pub(crate) fn begin_exposure(&self, kind: Exposed) {
        self.count(kind).fetch_add(1, Ordering::AcqRel);
    }

    /// Counts one exposure of `kind` as over: from any thread, without the lock. Each call
    /// matches one [`Self::begin_exposure`], so the count never goes below zero.
    pub(crate) fn end_exposure(&self, kind: Exposed) {
        self.count(kind).fetch_sub(1, Ordering::AcqRel);
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

    /// Whether a device handle is out now (or CuPy work may still use the device copy).
    pub(crate) fn exposed(&self) -> bool {
        self.device_exposures.load(Ordering::Acquire) > 0 || self.cupy_unordered.load(Ordering::Acquire)
    }

    /// Whether a host address is out now.
    pub(crate) fn host_exposed(&self) -> bool {
        self.host_exposures.load(Ordering::Acquire) > 0
    }

    /// The live exposures, (device, host) (`lazybuf.testing.exposures`).
    #[cfg(feature = "testing")]
    pub(crate) fn exposures(&self) -> (usize, usize) {
        (self.device_exposures.load(Ordering::Acquire), self.host_exposures.load(Ordering::Acquire))
    }

    /// Takes the "CuPy work not ordered" mark, before the caller orders lazybuf after CuPy's
    /// current stream (a CuPy array dropped meanwhile sets it again); `true` if it was set.
    pub(crate) fn take_cupy_unordered(&self) -> bool {
        self.cupy_unordered.swap(false, Ordering::AcqRel)
    }

    /// Sets the mark again when ordering failed.
    pub(crate) fn set_cupy_unordered(&self) {
        self.cupy_unordered.store(true, Ordering::Release);
    }
}
