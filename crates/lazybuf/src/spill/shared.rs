//! [`SharedBuffer`]: a buffer behind a lock, shared between threads, that eviction can reach.
//!
//! A plain [`UnifiedBuffer`] is owned by one place and borrowed for every access, so nothing
//! else can free its device copy: it counts against its device's budget but is never evicted.
//! Wrapped in a `SharedBuffer` (optionally opted out with `spillable = false`) it registers
//! for eviction. Holding its lock ([`SharedBuffer::lock`]) is using it: device views live
//! inside the lock's guard, so a buffer with a live view is never evicted, and eviction only
//! ever tries the lock, never waits for it. Each lock stamps the buffer as used now (the
//! least recently used buffers are evicted first).
//!
//! Under the host memory limit ([`super::set_host_memory_limit`]) a shared buffer whose only
//! data is its (unpinned) host copy may have it written to a spill file ([`super::disk`]).
//!
//! What does not live here: the eviction of the copy ([`crate::RawBuffer::evict_device_copy`]).

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError, Weak};

use super::registry::{self, Evictable, Evicted};
use crate::buffer::UnifiedBuffer;
use crate::device::Device;
use crate::element::Element;
use crate::error::Result;

/// A [`UnifiedBuffer`] behind a mutex, whose device copies are evicted (least recently used
/// first) when its device's memory limit needs room, while its lock is not held. Cloning
/// shares the buffer.
///
/// ```
/// use lazybuf::{Device, UnifiedBuffer, spill::SharedBuffer};
/// let shared = SharedBuffer::new(UnifiedBuffer::<f32>::from_slice(&[1.0, 2.0], &Device::host())?);
/// shared.lock().sync_to_device()?;
/// assert_eq!(shared.lock().host()?, &[1.0, 2.0]);
/// # Ok::<(), lazybuf::Error>(())
/// ```
pub struct SharedBuffer<T: Element> {
    entry: Arc<Entry<T>>,
}

struct Entry<T: Element> {
    buffer: Mutex<UnifiedBuffer<T>>,
    home: Device,
    spillable: bool,
    last_use: AtomicU64,
}

impl<T: Element> SharedBuffer<T> {
    /// Shares `buffer`, spillable.
    pub fn new(buffer: UnifiedBuffer<T>) -> Self {
        Self::with_spillable(buffer, true)
    }

    /// Shares `buffer`; with `spillable == false` its device copies are never evicted (they
    /// still count against the budget).
    pub fn with_spillable(buffer: UnifiedBuffer<T>, spillable: bool) -> Self {
        let home = buffer.device_handle().clone();
        let entry = Arc::new(Entry {
            buffer: Mutex::new(buffer),
            home,
            spillable,
            last_use: AtomicU64::new(registry::tick()),
        });
        if spillable {
            let weak: Weak<Entry<T>> = Arc::downgrade(&entry);
            registry::register(weak);
        }
        SharedBuffer { entry }
    }

    /// Whether eviction may free the buffer's device copies.
    pub fn is_spillable(&self) -> bool {
        self.entry.spillable
    }

    /// Locks the buffer for use (waiting for other users, never for eviction itself, which
    /// only tries the lock). While the guard lives the buffer is in use and never evicted.
    pub fn lock(&self) -> SharedGuard<'_, T> {
        // A panic while the lock was held (the caller's code, a resource's) leaves the buffer
        // as its last operation left it, which every operation keeps consistent: it is used on
        // as if nothing happened, here and by eviction (`try_lock`, below).
        let buffer = self.entry.buffer.lock().unwrap_or_else(PoisonError::into_inner);
        self.entry.last_use.store(registry::tick(), Ordering::Relaxed);
        SharedGuard { buffer, entry: &self.entry }
    }
}

impl<T: Element> Clone for SharedBuffer<T> {
    fn clone(&self) -> Self {
        SharedBuffer { entry: Arc::clone(&self.entry) }
    }
}

impl<T: Element> std::fmt::Debug for SharedBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedBuffer")
            .field("home", &self.entry.home)
            .field("spillable", &self.entry.spillable)
            .finish()
    }
}

/// The lock of a [`SharedBuffer`]: the buffer, in use until the guard is dropped.
pub struct SharedGuard<'a, T: Element> {
    buffer: MutexGuard<'a, UnifiedBuffer<T>>,
    entry: &'a Entry<T>,
}

impl<T: Element> Deref for SharedGuard<'_, T> {
    type Target = UnifiedBuffer<T>;
    fn deref(&self) -> &UnifiedBuffer<T> {
        &self.buffer
    }
}

impl<T: Element> DerefMut for SharedGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut UnifiedBuffer<T> {
        &mut self.buffer
    }
}

impl<T: Element> Drop for SharedGuard<'_, T> {
    fn drop(&mut self) {
        // The use ends now: that is what least-recently-used order counts.
        self.entry.last_use.store(registry::tick(), Ordering::Relaxed);
    }
}

impl<T: Element> Evictable for Entry<T> {
    fn last_use(&self) -> u64 {
        self.last_use.load(Ordering::Relaxed)
    }

    fn try_evict(&self, device: &Device) -> Option<Result<Option<Evicted>>> {
        let mut buffer = try_lock(&self.buffer)?;
        Some(buffer.raw_mut().evict_device_copy(device))
    }

    fn try_spill_host(&self) -> Option<Result<Option<usize>>> {
        // Host slices of a shared buffer live inside its lock's guard: a free lock means no
        // one holds one.
        let mut buffer = try_lock(&self.buffer)?;
        Some(buffer.raw_mut().give_host_back())
    }
}

/// The buffer if its lock is free (`None` while held: in use). A lock poisoned by a panic while
/// it was held is free: [`SharedBuffer::lock`] goes on using such a buffer, so eviction does
/// too (it once skipped it for good, and a budget then ran out with the buffer idle).
fn try_lock<B>(lock: &Mutex<B>) -> Option<MutexGuard<'_, B>> {
    match lock.try_lock() {
        Ok(buffer) => Some(buffer),
        Err(TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    }
}
