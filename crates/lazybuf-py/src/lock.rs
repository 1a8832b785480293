//! [`GilFreeMutex`]: the one lock the binding puts around a core object that Python shares
//! (a buffer's storage, a memory object, a device buffer).
//!
//! Two rules make such a lock safe with an interpreter lock (the GIL) beside it, and this
//! type enforces both, so no method can break them by accident:
//!
//! - **Never wait for it with the GIL held.** The core may call Python while it holds the lock
//!   (a failure callback of a Python memory resource runs inside an allocation), and that
//!   call takes the GIL. A thread that held the GIL while waiting for the lock would wait for
//!   ever. [`GilFreeMutex::lock`] takes a `Python` token and releases the GIL before it waits;
//!   inside a detached closure [`GilFreeMutex::lock_detached`] takes a [`Detached`] token,
//!   which only [`detach`] makes, so no code can wait for the lock while attached.
//! - **Never wait for it on the thread that holds it.** Code run by the core's call into
//!   Python (the callback itself, or a finalizer that the callback's `gc.collect()` runs) may
//!   use the very object whose allocation is in progress. Waiting there would wait for
//!   itself; instead both return `lazybuf.ReentrancyError`, a clear error that names the
//!   object, and the callback or finalizer goes on.
//!
//! - **Never wait for it in a forked child for a thread of the parent.** `fork` copies only the
//!   forking thread: a lock another thread held at that moment is never released in the child.
//!   The lock records the fork generation it was taken in
//!   ([`lazybuf::backend::fork::generation`]); a child that finds it held since before the
//!   fork gets `lazybuf.ForkedChildError` naming the object instead of waiting forever.
//!
//! The guard records which thread holds the lock and the fork generation, so the rules cost
//! two relaxed stores and a load per lock, and more only on the contended path.
//!
//! What does not live here: which objects are locked, and what a method does under the lock.

use std::fmt;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError, TryLockError};
use std::time::Duration;

use pyo3::prelude::*;

use lazybuf::backend::fork::generation;

use crate::errors::{ForkedChildError, ReentrancyError};

/// Proof that the calling thread is detached from the interpreter (it does not hold the GIL):
/// only [`detach`] makes one, for the closure it runs. Neither `Send` nor `Sync`, so it cannot
/// leave that closure's thread, nor be returned out of it.
pub(crate) struct Detached(PhantomData<*const ()>);

/// Runs `f` with the GIL released (as [`Python::detach`]), giving it the proof of that.
pub(crate) fn detach<T: Send>(py: Python<'_>, f: impl Send + FnOnce(&Detached) -> T) -> T {
    py.detach(|| f(&Detached(PhantomData)))
}

/// A number for the calling thread, unique in the process and never 0.
fn thread_number() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static NUMBER: u64 = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    NUMBER.with(|n| *n)
}

/// How long a forked child waits for a lock taken before the fork to show a live holder
/// ([`GilFreeMutex::wait`]), in milliseconds.
const FORK_GRACE_MS: u32 = 100;

/// A mutex that is never waited for with the GIL held, nor by the thread that holds it (see
/// the module docs).
pub(crate) struct GilFreeMutex<T> {
    value: Mutex<T>,
    /// [`thread_number`] of the thread holding the lock; 0 when none does.
    holder: AtomicU64,
    /// The fork generation ([`lazybuf::backend::fork::generation`]) the lock was last taken in.
    taken_in: AtomicU64,
    /// What the object is, for [`ReentrancyError`]'s message ("UnifiedBuffer", "MemoryDevice").
    what: &'static str,
}

/// The lock of a [`GilFreeMutex`], held.
pub(crate) struct GilFreeGuard<'a, T> {
    guard: MutexGuard<'a, T>,
    holder: &'a AtomicU64,
}

impl<T: Send> GilFreeMutex<T> {
    /// `value` behind the lock; `what` names it in errors.
    pub(crate) fn new(value: T, what: &'static str) -> Self {
        let taken_in = AtomicU64::new(generation());
        GilFreeMutex { value: Mutex::new(value), holder: AtomicU64::new(0), taken_in, what }
    }

    /// The value, through exclusive access (no lock needed: its owner is being dropped).
    pub(crate) fn get_mut(&mut self) -> &mut T {
        self.value.get_mut().unwrap_or_else(PoisonError::into_inner)
    }

    /// The lock at once if it is free; `None` if another thread (or this one) holds it.
    pub(crate) fn try_lock(&self) -> Option<GilFreeGuard<'_, T>> {
        match self.value.try_lock() {
            Ok(guard) => Some(self.held(guard)),
            // A poisoned lock means a panic happened while it was held; every core object
            // commits its state only after successful steps, so it is still consistent.
            Err(TryLockError::Poisoned(poisoned)) => Some(self.held(poisoned.into_inner())),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// The lock, from a thread attached to the interpreter: taken at once when free;
    /// [`ReentrancyError`] when this thread holds it already; otherwise waited for with the
    /// GIL released.
    pub(crate) fn lock(&self, py: Python<'_>) -> PyResult<GilFreeGuard<'_, T>> {
        if let Some(guard) = self.try_lock() {
            return Ok(guard);
        }
        self.not_held_here()?;
        /// A guard carried out of the detached closure.
        struct Carried<'a, T>(GilFreeGuard<'a, T>);
        // SAFETY: `detach` runs the closure on the calling thread and returns on that thread;
        // the guard is only moved out of the closure, never used or dropped on another thread.
        unsafe impl<T> Send for Carried<'_, T> {}
        py.detach(|| self.wait().map(Carried)).map(|carried| carried.0)
    }

    /// The lock, from a thread detached from the interpreter: waited for unless this thread
    /// holds it already ([`ReentrancyError`]).
    pub(crate) fn lock_detached(&self, _detached: &Detached) -> PyResult<GilFreeGuard<'_, T>> {
        if let Some(guard) = self.try_lock() {
            return Ok(guard);
        }
        self.not_held_here()?;
        self.wait()
    }

    /// [`ReentrancyError`] if the calling thread holds the lock.
    fn not_held_here(&self) -> PyResult<()> {
        if self.holder.load(Ordering::Relaxed) != thread_number() {
            return Ok(());
        }
        Err(ReentrancyError::new_err(format!(
            "this {} is in use by an operation in progress on this thread (a memory resource's \
             failure callback, or a finalizer run inside it, used the object whose allocation \
             it serves); use it after that operation returns",
            self.what
        )))
    }

    /// The lock, waited for; [`ForkedChildError`] instead if a thread of a parent process held
    /// it when this process was forked (`fork` did not copy that thread: it would never be
    /// released).
    fn wait(&self) -> PyResult<GilFreeGuard<'_, T>> {
        if self.taken_in.load(Ordering::Relaxed) != generation() {
            // Only in a forked child: taken before the fork, or just taken by a thread here
            // that has not recorded its generation yet (it does so right after taking it).
            for _ in 0..FORK_GRACE_MS {
                if let Some(guard) = self.try_lock() {
                    return Ok(guard);
                }
                if self.taken_in.load(Ordering::Relaxed) == generation() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            if self.taken_in.load(Ordering::Relaxed) != generation() {
                return Err(ForkedChildError::new_err(format!(
                    "this {} was in use by another thread when this process was forked, and \
                     fork() does not copy that thread: the child cannot use it. Fork before \
                     starting threads that use lazybuf, or use the 'spawn' start method \
                     (multiprocessing.get_context('spawn'))",
                    self.what
                )));
            }
        }
        let guard = self.value.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(self.held(guard))
    }

    fn held<'a>(&'a self, guard: MutexGuard<'a, T>) -> GilFreeGuard<'a, T> {
        self.holder.store(thread_number(), Ordering::Relaxed);
        self.taken_in.store(generation(), Ordering::Relaxed);
        GilFreeGuard { guard, holder: &self.holder }
    }
}

impl<T> Drop for GilFreeGuard<'_, T> {
    fn drop(&mut self) {
        // Cleared while the mutex is still held (the guard field drops after this body).
        self.holder.store(0, Ordering::Relaxed);
    }
}

impl<T> Deref for GilFreeGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T> DerefMut for GilFreeGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

impl<T> fmt::Debug for GilFreeMutex<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GilFreeMutex").field("what", &self.what).finish_non_exhaustive()
    }
}
