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

use std::sync::atomic::AtomicBool;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

/// How many times this process's line of ancestors forked since a runtime that does not
/// survive `fork` was first opened in it (0 in the process that opened it).
static FORKS: AtomicU64 = AtomicU64::new(0);

/// The `pthread_atfork` child handler: counts the fork. Async-signal-safe (one atomic add).
extern "C" fn count_fork() {
    FORKS.fetch_add(1, Ordering::Relaxed);
}

/// Registers the fork counter, once per process.
pub(crate) fn watch_forks() {
    static REGISTERED: AtomicBool = AtomicBool::new(false);
    register_child_handler(&REGISTERED, count_fork);
}

/// Registers `handler` as a `pthread_atfork` child handler, once (`registered`): the first
/// caller registers it, the others go on at once (not `Once`, whose other callers wait for the
/// first: a child forked while a parent's thread registered would wait for ever at its own
/// first call; a thirteenth hostile pass, 2026-11-28). A fork racing with the registration may
/// go uncounted, as may one after a failure (ENOMEM), as before this module existed; nothing
/// is registered where there is no `fork`.
fn register_child_handler(registered: &'static AtomicBool, handler: extern "C" fn()) {
    if registered.swap(true, Ordering::AcqRel) {
        return;
    }
    #[cfg(unix)]
    // SAFETY: every handler here only does an atomic add (allowed between fork and exec), and
    // is a plain function that lives for the whole process.
    unsafe {
        libc::pthread_atfork(None, None, Some(handler))
    };
    #[cfg(not(unix))]
    let _ = handler;
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
    static REGISTERED: AtomicBool = AtomicBool::new(false);
    register_child_handler(&REGISTERED, count_generation);
}

/// How many forks separate this process from the one that called [`watch_every_fork`] first:
/// a value recorded before a fork differs from the one read in the child. One relaxed load.
#[inline]
pub fn generation() -> u64 {
    GENERATION.load(Ordering::Relaxed)
}

/// A value made once per process by one thread at a time, as `OnceLock::get_or_init` makes
/// it (the device registry's discovery opens every runtime: never twice). Unlike
/// `get_or_init`, a forked child whose parent's thread was making the value at the fork (a
/// thread the child does not have) makes its own instead of waiting forever: the maker holds a
/// [`ForkAwareMutex`], which tells that case apart. (Left: a fork in the nanoseconds in which
/// the maker publishes the made value.)
pub(crate) struct ForkAwareOnce<T> {
    value: std::sync::OnceLock<T>,
    /// Held by the thread making the value.
    making: ForkAwareMutex<()>,
}

impl<T> ForkAwareOnce<T> {
    pub(crate) const fn new() -> Self {
        ForkAwareOnce { value: std::sync::OnceLock::new(), making: ForkAwareMutex::unwatched(()) }
    }

    /// The value if one was made.
    #[inline]
    pub(crate) fn get(&self) -> Option<&T> {
        self.value.get()
    }

    /// The value, made by `init` when there is none yet; a thread finding another thread of
    /// this process making it waits for that one.
    #[inline]
    pub(crate) fn get_or_init(&self, init: impl FnOnce() -> T) -> &T {
        match self.value.get() {
            Some(value) => value,
            None => self.make(init),
        }
    }

    #[cold]
    fn make(&self, init: impl FnOnce() -> T) -> &T {
        watch_every_fork();
        // `None`: a parent's thread was making it at the fork; this child makes its own.
        let _making = self.making.lock();
        if let Some(value) = self.value.get() {
            return value; // made while this thread waited
        }
        // Only a maker holding `making` (or a child whose maker is gone) publishes: never waits.
        let _ = self.value.set(init());
        self.value.get().expect("published just above")
    }
}

/// How long a forked child waits, at its first use of a lock found held, for a thread of its
/// own that may have just taken it (it records its generation right after).
const GRACE: std::time::Duration = std::time::Duration::from_millis(20);

/// A mutex over process-wide state (a pool's cache, the table of default pools) that a forked
/// child can find held forever: `fork` copies only the forking thread, so a lock another
/// thread of the parent held at that moment is never released in the child. [`Self::lock`]
/// tells that case apart (the lock records the [`generation`] it was taken in) and returns
/// `None` instead of waiting: the caller goes on without the state (a pool's allocation goes
/// upstream). In the process that took it, and in a child that finds it free, it is a plain
/// mutex: one relaxed load more per lock, and one store per generation.
///
/// Counting generations starts when the first such lock is made ([`watch_every_fork`]).
///
/// Public for bindings, whose process-wide state has the same hazard (the Python binding's
/// queue of logged lines, its table of adopted frames).
pub struct ForkAwareMutex<T> {
    value: std::sync::Mutex<T>,
    /// The generation the lock was last taken in (or made in).
    taken_in: AtomicU64,
    /// The generation in which a thread found the lock held by a parent's thread (`u64::MAX`:
    /// none): later calls there give up at once.
    orphaned_in: AtomicU64,
}

impl<T> ForkAwareMutex<T> {
    /// A lock over `value`; starts counting forks ([`watch_every_fork`]).
    pub fn new(value: T) -> Self {
        watch_every_fork();
        ForkAwareMutex {
            value: std::sync::Mutex::new(value),
            taken_in: AtomicU64::new(generation()),
            orphaned_in: AtomicU64::new(u64::MAX),
        }
    }

    /// A lock for a `static`: as [`Self::new`], but its user must call [`watch_every_fork`]
    /// before its first [`Self::lock`] (forks before that are not told apart).
    pub const fn unwatched(value: T) -> Self {
        ForkAwareMutex {
            value: std::sync::Mutex::new(value),
            taken_in: AtomicU64::new(0),
            orphaned_in: AtomicU64::new(u64::MAX),
        }
    }

    /// The lock, waited for; `None` in a forked child when a thread of a parent process held
    /// it at the fork. A poisoned lock is taken as it is (its users panic nowhere under it).
    pub fn lock(&self) -> Option<std::sync::MutexGuard<'_, T>> {
        let now = generation();
        if self.taken_in.load(Ordering::Relaxed) == now {
            return Some(self.value.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        }
        // The first use since a fork (or a use while the first is under way).
        if self.orphaned_in.load(Ordering::Relaxed) == now {
            return None;
        }
        let start = std::time::Instant::now();
        loop {
            match self.value.try_lock() {
                Ok(guard) => {
                    self.taken_in.store(now, Ordering::Relaxed);
                    return Some(guard);
                }
                Err(std::sync::TryLockError::Poisoned(poisoned)) => {
                    self.taken_in.store(now, Ordering::Relaxed);
                    return Some(poisoned.into_inner());
                }
                Err(std::sync::TryLockError::WouldBlock) => {}
            }
            if self.taken_in.load(Ordering::Relaxed) == now {
                // A thread of this process holds it: an ordinary wait.
                return Some(self.value.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
            }
            if start.elapsed() > GRACE {
                self.orphaned_in.store(now, Ordering::Relaxed);
                return None;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// The value, through exclusive access (no lock needed).
    pub fn get_mut(&mut self) -> &mut T {
        self.value.get_mut().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl<T: Default> Default for ForkAwareMutex<T> {
    fn default() -> Self {
        ForkAwareMutex::new(T::default())
    }
}

/// Process-wide state behind a lock that a forked child can always take and change: a child
/// that finds the lock held by a thread of a parent (see [`ForkAwareMutex`]) replaces the state
/// with a fresh `T::default()` of its own and goes on with that. The parent's, caught in the
/// middle of a change, is left behind (leaked: a few bytes, once per such child). For state a
/// child can start without but must be able to set (the current memory resources: a child
/// that finds their table held starts with none set); where the child should go on without the
/// state instead, use [`ForkAwareMutex`].
pub struct ForkAwareTable<T: 'static> {
    /// The lock in use, made at the first [`Self::lock`]: a pointer from `Box::into_raw`,
    /// never freed once stored (a replaced one stays reachable by threads that loaded it).
    current: AtomicPtr<ForkAwareMutex<T>>,
}

impl<T: Default + 'static> ForkAwareTable<T> {
    /// An empty table, for a `static`: its state is made at the first [`Self::lock`].
    pub const fn new() -> Self {
        ForkAwareTable { current: AtomicPtr::new(std::ptr::null_mut()) }
    }

    /// The state, waited for while a thread of this process holds it; a fresh one in a forked
    /// child whose parent's thread held it at the fork.
    pub fn lock(&self) -> std::sync::MutexGuard<'static, T> {
        loop {
            let (table, ptr) = self.table();
            if let Some(guard) = table.lock() {
                return guard;
            }
            // Orphaned here: replace it, unless a thread of this child already did.
            let fresh = Box::into_raw(Box::new(ForkAwareMutex::new(T::default())));
            if self.current.compare_exchange(ptr, fresh, Ordering::AcqRel, Ordering::Acquire).is_err() {
                // SAFETY: `fresh` came from `Box::into_raw` just above and was never stored:
                // nothing else can reach it.
                drop(unsafe { Box::from_raw(fresh) });
            }
        }
    }

    /// The lock in use and its pointer, made now if there is none yet.
    fn table(&self) -> (&'static ForkAwareMutex<T>, *mut ForkAwareMutex<T>) {
        let mut ptr = self.current.load(Ordering::Acquire);
        if ptr.is_null() {
            let fresh = Box::into_raw(Box::new(ForkAwareMutex::new(T::default())));
            ptr = match self.current.compare_exchange(ptr, fresh, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => fresh,
                Err(made) => {
                    // SAFETY: as in `lock`: `fresh` was never stored.
                    drop(unsafe { Box::from_raw(fresh) });
                    made
                }
            };
        }
        // SAFETY: every pointer stored in `current` comes from `Box::into_raw` and is never
        // freed (replaced ones are leaked), so it is valid for the rest of the process; the
        // Acquire load (or the exchange) saw the Release that published its contents.
        (unsafe { &*ptr }, ptr)
    }
}

impl<T: Default + 'static> Default for ForkAwareTable<T> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::ForkAwareMutex;
    use std::sync::{Arc, mpsc};

    /// Forks; the child exits with `child`'s status; returns it, or -1 when the child ran past
    /// 20 s (it is killed then: a hang fails the test, never hangs it).
    fn in_child(child: impl FnOnce() -> i32) -> i32 {
        // SAFETY: fork has no preconditions; the child only runs `child` and `_exit`s.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let status = std::panic::catch_unwind(std::panic::AssertUnwindSafe(child)).unwrap_or(99);
            // SAFETY: ends the child at once, without the parent's destructors.
            unsafe { libc::_exit(status) };
        }
        let start = std::time::Instant::now();
        let mut status = 0;
        // SAFETY: polls our own child without blocking; status is a valid out-pointer.
        while unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } != pid {
            if start.elapsed() > std::time::Duration::from_secs(20) {
                // SAFETY: kills and reaps our own child, not reaped yet.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                    libc::waitpid(pid, &mut status, 0);
                }
                return -1;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        libc::WEXITSTATUS(status)
    }

    #[test]
    fn a_child_makes_its_own_value_of_a_once_a_parents_thread_was_making() {
        static ONCE: super::ForkAwareOnce<u32> = super::ForkAwareOnce::new();
        let (making_tx, making_rx) = mpsc::channel();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let maker = std::thread::spawn(move || {
            *ONCE.get_or_init(|| {
                making_tx.send(()).unwrap();
                release_rx.recv().unwrap();
                1
            })
        });
        making_rx.recv().unwrap();
        // A second thread of this process waits for the maker: one value, made once.
        let waiter = std::thread::spawn(|| *ONCE.get_or_init(|| 4));
        // (Had the maker used `OnceLock::get_or_init`, the child's would wait forever for it.)
        let status = in_child(|| i32::from(*ONCE.get_or_init(|| 2) == 2));
        release_tx.send(()).unwrap();
        assert_eq!(maker.join().unwrap(), 1);
        assert_eq!(waiter.join().unwrap(), 1, "the waiting thread got the maker's value");
        assert_eq!(status, 1, "the child made its own value");
        assert_eq!(*ONCE.get_or_init(|| 3), 1, "the parent keeps its own");
    }

    #[test]
    fn a_child_replaces_a_table_a_parents_thread_held_and_keeps_one_that_was_free() {
        static HELD: super::ForkAwareTable<Vec<u32>> = super::ForkAwareTable::new();
        static FREE: super::ForkAwareTable<Vec<u32>> = super::ForkAwareTable::new();
        HELD.lock().push(1);
        FREE.lock().push(2);
        let (locked_tx, locked_rx) = mpsc::channel();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            let mut guard = HELD.lock();
            guard.push(7); // in the middle of a change at the fork
            locked_tx.send(()).unwrap();
            release_rx.recv().unwrap();
            guard.pop();
        });
        locked_rx.recv().unwrap();
        let status = in_child(|| {
            // A fresh table, which the child can change and find changed; the free one kept.
            let fresh = HELD.lock().is_empty();
            HELD.lock().push(5);
            let changed = *HELD.lock() == [5];
            let kept = *FREE.lock() == [2];
            i32::from(fresh) * 100 + i32::from(changed) * 10 + i32::from(kept)
        });
        release_tx.send(()).unwrap();
        holder.join().unwrap();
        assert_eq!(status, 111, "100: a fresh table, 10: changed in the child, 1: the free one kept");
        assert_eq!(*HELD.lock(), [1], "the parent keeps its own");
    }

    #[test]
    fn a_child_gives_up_a_lock_a_parents_thread_held_and_takes_one_that_was_free() {
        let held = Arc::new(ForkAwareMutex::new(1u32));
        let free = ForkAwareMutex::new(2u32);
        let (locked_tx, locked_rx) = mpsc::channel();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let holder = {
            let held = held.clone();
            std::thread::spawn(move || {
                let _guard = held.lock().unwrap();
                locked_tx.send(()).unwrap();
                release_rx.recv().unwrap();
            })
        };
        locked_rx.recv().unwrap();
        let status = in_child(|| {
            // Given up (twice: the second at once), while the free one works as a mutex.
            let gave_up = held.lock().is_none() && held.lock().is_none();
            let took = free.lock().map(|mut v| *v += 1).is_some() && free.lock().is_some_and(|v| *v == 3);
            i32::from(gave_up) * 10 + i32::from(took)
        });
        release_tx.send(()).unwrap();
        holder.join().unwrap();
        assert_eq!(status, 11, "10: the held lock given up, 1: the free one taken");
        assert_eq!(held.lock().map(|v| *v), Some(1), "the parent takes it as before");
    }
}
