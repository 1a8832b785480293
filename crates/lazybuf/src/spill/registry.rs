//! The buffers eviction may reach: every [`Evictable`] registered, weakly held, with the
//! time of its last use on a process-wide logical clock (for least-recently-used order).
//!
//! A buffer owned by value (a plain [`crate::UnifiedBuffer`]) cannot be reached by another
//! thread, so only buffers behind a lock register: [`super::SharedBuffer`] in Rust, every
//! buffer of the Python binding. Eviction takes a candidate's lock with `try_lock` only: a
//! buffer whose lock is held is in use, and skipped, so eviction never waits for a thread that
//! holds a buffer's lock while it allocates.
//!
//! What does not live here: choosing and evicting (`spill::eviction`), the eviction of one
//! buffer's copy ([`crate::RawBuffer::evict_device_copy`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use crate::backend::fork::ForkAwareMutex;
use crate::backend::fork::ForkAwareOnce;
use crate::device::Device;
use crate::error::Result;

/// What evicting one buffer's device copy did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Evicted {
    /// Bytes of device memory given back (to the buffer's resource).
    pub freed: usize,
    /// Bytes downloaded first because the copy held the only current data (0: a clean
    /// eviction).
    pub written_back: usize,
}

/// A buffer (behind its own lock) whose device copies eviction may free.
pub trait Evictable: Send + Sync {
    /// The logical time of the buffer's last use ([`tick`]): smaller is older.
    fn last_use(&self) -> u64;

    /// Evicts the buffer's copy on `device` if the buffer is not in use: `None` when it is in
    /// use (its lock is held, a device view or export lives, a transfer is in flight) or
    /// opted out, `Some(Ok(None))` when it has no copy there that holds device memory, and
    /// `Some(Err(_))` when the write-back failed (the buffer then keeps its copy, data and
    /// state). Must never wait for a lock.
    fn try_evict(&self, device: &Device) -> Option<Result<Option<Evicted>>>;

    /// Gives the buffer's host block back for the host memory limit, if the buffer is not in
    /// use: frees it when it is stale, else writes it to a spill file when it is the only
    /// current data (see [`crate::RawBuffer::give_host_back`]): the bytes freed,
    /// `Some(Ok(None))` when there was nothing to give back, `None` when in use. The default
    /// gives nothing back: a buffer whose host memory may be exposed to code lazybuf cannot
    /// see must not lose it.
    fn try_spill_host(&self) -> Option<Result<Option<usize>>> {
        None
    }
}

/// Drops the objects that only a binding's own caches hold and that keep buffers in use
/// (see [`set_reclaim_hook`]); returns how many it dropped.
pub type ReclaimHook = fn() -> usize;

static RECLAIM: OnceLock<ReclaimHook> = OnceLock::new();

/// Registers the binding's reclaim hook (once per process; later calls are ignored). A binding
/// that caches the views it hands out (the Python one does: a caller who drops a view each call
/// gets the same one back) keeps buffers in use through objects nobody else references; when
/// an eviction pass finds too little to evict, it calls the hook, which drops those objects
/// (ending their buffers' use), and tries once more. The hook may wait for the interpreter's
/// lock, so it must never be called with a lock that interpreter threads wait for held.
pub fn set_reclaim_hook(hook: ReclaimHook) {
    let _ = RECLAIM.set(hook);
}

/// Runs the reclaim hook, if one is registered: how many objects it dropped.
pub(crate) fn reclaim() -> usize {
    RECLAIM.get().map_or(0, |hook| hook())
}

/// The next tick of the logical clock uses are stamped with.
pub fn tick() -> u64 {
    static CLOCK: AtomicU64 = AtomicU64::new(1);
    CLOCK.fetch_add(1, Ordering::Relaxed)
}

/// The candidates. A forked child whose parent's thread held the list at the fork goes on
/// without it ([`ForkAwareMutex`]): nothing registers there, and nothing is evicted.
fn entries() -> &'static ForkAwareMutex<Vec<Weak<dyn Evictable>>> {
    static ENTRIES: ForkAwareOnce<ForkAwareMutex<Vec<Weak<dyn Evictable>>>> = ForkAwareOnce::new();
    ENTRIES.get_or_init(ForkAwareMutex::default)
}

#[cfg(feature = "testing")]
/// Runs `f` while this thread holds the list ([`crate::testing::with_spill_locks_held`]).
pub(crate) fn with_locked<R>(f: impl FnOnce() -> R) -> R {
    let _held = entries().lock();
    f()
}

/// Makes `buffer` a candidate for eviction for as long as it lives.
pub fn register(buffer: Weak<dyn Evictable>) {
    let Some(mut entries) = entries().lock() else { return };
    // Dropped buffers go when the list would grow past twice the live ones.
    if entries.len() >= 64 && entries.len() == entries.capacity() {
        entries.retain(|e| e.strong_count() > 0);
    }
    entries.push(buffer);
}

/// The live candidates, least recently used first. The registry's lock is not held while the
/// caller evicts.
pub(crate) fn candidates() -> Vec<Arc<dyn Evictable>> {
    let mut live: Vec<Arc<dyn Evictable>> = {
        let Some(mut entries) = entries().lock() else { return Vec::new() };
        entries.retain(|e| e.strong_count() > 0);
        entries.iter().filter_map(Weak::upgrade).collect()
    };
    let mut stamped: Vec<(u64, Arc<dyn Evictable>)> = live.drain(..).map(|b| (b.last_use(), b)).collect();
    stamped.sort_by_key(|(stamp, _)| *stamp);
    stamped.into_iter().map(|(_, b)| b).collect()
}
