//! The wgpu objects lazybuf owns: the device and its queue with their error handling
//! ([`Context`]), a storage buffer ([`WgpuMemory`]), a stream over the queue ([`WgpuStream`]),
//! and a completion finished by a wgpu callback ([`WgpuCompletion`]). Dropping any of them
//! never panics.

use std::panic::AssertUnwindSafe;
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::{Status, panic_message, wgpu_error};
use crate::backend::{Completion, MemoryHandle, RawMemory, RawStream, StreamHandle, Ticket};
use crate::error::{BackendKind, Error, Result};

/// A device and its queue, shared by everything that uses them.
pub(crate) struct Context {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    /// The device's name, for errors.
    pub(crate) name: String,
    /// Why the device was lost, once it has been.
    lost: Mutex<Option<String>>,
    /// The last error wgpu reported outside lazybuf's error scopes (a user's own work).
    uncaptured: Mutex<Option<String>>,
    /// Held while lazybuf polls the device (see [`Context::poll`]).
    polling: Mutex<()>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "wgpu::Context({})", self.name)
    }
}

/// Locks a mutex whether or not a panicking thread poisoned it.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Context {
    /// Takes over an opened device and queue, and installs handlers so that wgpu never
    /// panics on an error: uncaptured errors are recorded, a lost device is remembered.
    pub(crate) fn new(device: wgpu::Device, queue: wgpu::Queue, name: String) -> Arc<Context> {
        let context = Arc::new(Context {
            device,
            queue,
            name,
            lost: Mutex::new(None),
            uncaptured: Mutex::new(None),
            polling: Mutex::new(()),
        });
        let weak = Arc::downgrade(&context);
        context.device.on_uncaptured_error(Arc::new(move |error: wgpu::Error| {
            if let Some(context) = weak.upgrade() {
                *lock(&context.uncaptured) = Some(error.to_string());
            }
        }));
        let weak = Arc::downgrade(&context);
        context.device.set_device_lost_callback(move |reason, message| {
            if let Some(context) = weak.upgrade() {
                lock(&context.lost).get_or_insert_with(|| format!("{reason:?}: {message}"));
            }
        });
        context
    }

    /// An error if the device has been lost.
    pub(crate) fn check_alive(&self) -> Result<()> {
        match &*lock(&self.lost) {
            None => Ok(()),
            Some(why) => Err(self.lost_error(why)),
        }
    }

    fn lost_error(&self, why: &str) -> Error {
        Error::BackendUnavailable {
            backend: BackendKind::WGPU,
            reason: format!("{} was lost ({why})", self.name),
        }
    }

    fn mark_lost(&self, why: String) -> Error {
        let mut lost = lock(&self.lost);
        let why = lost.get_or_insert(why).clone();
        self.lost_error(&why)
    }

    /// The last error wgpu reported outside lazybuf's calls (taken: each is reported once).
    pub(super) fn take_uncaptured(&self) -> Option<String> {
        lock(&self.uncaptured).take()
    }

    /// Runs `f` (wgpu calls) inside error scopes, so that the errors they raise are returned
    /// instead of reaching wgpu's panicking default handler; a panic is caught too. `bytes` is
    /// the size an out-of-memory error reports.
    ///
    /// Nothing in `f` may poll the device: callbacks run by a poll would report their errors
    /// into these scopes.
    pub(crate) fn scoped<T>(&self, call: &'static str, bytes: usize, f: impl FnOnce() -> T) -> Result<T> {
        // A destroyed device is reported lost only by a poll (wgpu then runs the device-lost
        // callback), and calls on it raise no error at all: poll first, so they are refused.
        self.poll()?;
        let memory = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let internal = self.device.push_error_scope(wgpu::ErrorFilter::Internal);
        // Unwind safety: after a panic the result is discarded and the error returned; wgpu's
        // own state is guarded by its locks, which do not poison.
        let outcome = std::panic::catch_unwind(AssertUnwindSafe(f));
        // Popped in reverse order, as wgpu requires; wgpu-core's futures are ready at once.
        let errors = [
            pollster::block_on(internal.pop()),
            pollster::block_on(validation.pop()),
            pollster::block_on(memory.pop()),
        ];
        // A panic's message is not kept: Error::Runtime carries a status, not text (the panic
        // hook has printed it).
        let value = outcome.map_err(|_| wgpu_error(call, Status::Panicked))?;
        // A device lost during the call (wgpu calls the device-lost callback at once then)
        // explains whatever else went wrong.
        self.check_alive()?;
        match errors.into_iter().flatten().next() {
            None => Ok(value),
            Some(error) => Err(self.error(call, bytes, error)),
        }
    }

    /// Maps a wgpu error of `call` to lazybuf's.
    fn error(&self, call: &'static str, bytes: usize, error: wgpu::Error) -> Error {
        match error {
            wgpu::Error::OutOfMemory { .. } => Error::OutOfMemory {
                device: self.name.clone(),
                requested: bytes,
                code: Some(super::code(Status::OutOfMemory)),
            },
            wgpu::Error::Validation { description, .. } => Error::InvalidArgument {
                operation: call,
                reason: format!("wgpu validation error: {description}"),
            },
            wgpu::Error::Internal { .. } => wgpu_error(call, Status::Internal),
        }
    }

    /// Polls the device without waiting: runs the callbacks of finished work. A lost device,
    /// or a poll that panics (wgpu does on some device errors), is an error and marks the
    /// device lost.
    ///
    /// lazybuf never asks wgpu to wait (`PollType::Wait`): a waiting poll that overlaps another
    /// thread's poll or submit can trip an assertion in wgpu-core 30 (a stale fence value
    /// against a queue the other thread emptied; fixed upstream after 30.0.1, gfx-rs/wgpu#9958),
    /// which would surface here as a lost device. Waiting is done by [`WgpuCompletion::wait`],
    /// polling with a growing pause. A poll that finds another of lazybuf's running does
    /// nothing: that one runs the callbacks.
    pub(crate) fn poll(&self) -> Result<()> {
        if crate::backend::fork::in_forked_child() {
            // Every wait polls: in a forked child that would hang in the dead runtime.
            return Err(Error::ForkedChild { device: "a wgpu device".into(), backend: BackendKind::WGPU });
        }
        self.check_alive()?;
        let _turn = match self.polling.try_lock() {
            Ok(turn) => turn,
            Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return Ok(()),
        };
        // Unwind safety: after a panic the device is marked lost and not polled again.
        match std::panic::catch_unwind(AssertUnwindSafe(|| self.device.poll(wgpu::PollType::Poll))) {
            Ok(Ok(_)) => self.check_alive(),
            Ok(Err(_)) => Err(wgpu_error("Device::poll", Status::PollFailed)),
            Err(payload) => {
                Err(self.mark_lost(format!("Device::poll panicked: {}", panic_message(&*payload))))
            }
        }
    }
}

/// A storage buffer of `len` bytes (none for an empty allocation: wgpu cannot bind one). The
/// wgpu buffer is `len` rounded up to 4 bytes, as wgpu's copies require.
#[derive(Debug)]
pub struct WgpuMemory {
    pub(super) buffer: Option<wgpu::Buffer>,
    /// Bytes this process holds on the device, shared with the device (for memory_info).
    pub(super) held: Arc<AtomicU64>,
    pub(super) context: Arc<Context>,
}

// SAFETY: no host address: the host never reads or writes through this handle.
unsafe impl MemoryHandle for WgpuMemory {
    /// The `wgpu::Buffer` (null for an empty allocation).
    fn raw(&self) -> RawMemory {
        RawMemory::Wgpu(self.buffer.as_ref().map_or(ptr::null(), |b| b as *const wgpu::Buffer))
    }
}

impl Drop for WgpuMemory {
    fn drop(&mut self) {
        if crate::backend::fork::in_forked_child() {
            // Leaked: releasing would call into the runtime, gone in a forked child.
            std::mem::forget(self.buffer.take());
            return;
        }
        if let Some(buffer) = &self.buffer {
            self.held.fetch_sub(buffer.size(), Ordering::Relaxed);
        }
        // Dropping a wgpu::Buffer never frees memory work still uses: wgpu keeps it until the
        // submissions that use it are done.
    }
}

/// A stream: a handle to the device's one queue. Work on every stream of a device runs in
/// queue order; each stream remembers its downloads whose callbacks are pending, so its
/// marker also covers their copies to the host.
#[derive(Debug)]
pub struct WgpuStream {
    pub(super) context: Arc<Context>,
    pending: Mutex<Vec<Ticket>>,
}

impl WgpuStream {
    pub(super) fn new(context: Arc<Context>) -> WgpuStream {
        WgpuStream { context, pending: Mutex::new(Vec::new()) }
    }

    /// Remembers a download's ticket until it completes.
    pub(super) fn track(&self, ticket: &Ticket) {
        let mut pending = lock(&self.pending);
        pending.retain(|t| {
            t.completion()
                .and_then(|c| (&**c as &dyn std::any::Any).downcast_ref::<WgpuCompletion>())
                .is_none_or(|c| c.outcome().is_none())
        });
        pending.push(ticket.clone());
    }

    /// The tickets of downloads enqueued here that may not be complete.
    pub(super) fn pending(&self) -> Vec<Ticket> {
        lock(&self.pending).clone()
    }
}

impl StreamHandle for WgpuStream {
    /// The `wgpu::Queue`.
    fn raw(&self) -> RawStream {
        RawStream::Wgpu(&self.context.queue as *const wgpu::Queue)
    }
}

/// Work that completes when a wgpu callback says so (`on_submitted_work_done`, a mapping's
/// callback). Polling it polls the device, which is where wgpu runs callbacks; waiting polls
/// until the callback has run, here or on the thread whose poll picked it up: first back to
/// back, yielding the CPU between polls, for `SPIN`; then with a growing pause (10 to 250 µs).
///
/// Not `device.poll(Wait)`: a waiting poll blocks every other thread's `queue.submit` until it
/// returns (gfx-rs/wgpu#9470) and trips an assertion in wgpu-core 30.0.1 when a submit overlaps
/// it (gfx-rs/wgpu#9958).
pub struct WgpuCompletion {
    context: Arc<Context>,
    outcome: Mutex<Option<Result<()>>>,
    finished: Condvar,
}

impl std::fmt::Debug for WgpuCompletion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &*lock(&self.outcome) {
            None => "running",
            Some(Ok(())) => "done",
            Some(Err(_)) => "failed",
        };
        write!(f, "WgpuCompletion({state})")
    }
}

/// How long a wait polls back to back before it pauses between polls. A timed pause is never
/// short: Linux adds its timer slack (50 µs by default) to every timed sleep, so pausing from
/// the first poll made each short transfer's wait 30-40 µs longer than wgpu's own blocking
/// wait (docs/BENCHMARKS.md, wgpu). Yielding between polls leaves the CPU to the driver's
/// threads where they need it (lavapipe runs the GPU's work on the CPU).
const SPIN: Duration = Duration::from_micros(100);
/// The first and the longest pause between two polls of a wait, after [`SPIN`]. A callback
/// that another thread's poll runs ends the pause at once.
const FIRST_PAUSE: Duration = Duration::from_micros(10);
const LONGEST_PAUSE: Duration = Duration::from_micros(250);

impl WgpuCompletion {
    /// A completion that a callback of `context`'s device will finish.
    pub(super) fn new(context: Arc<Context>) -> Arc<WgpuCompletion> {
        Arc::new(WgpuCompletion { context, outcome: Mutex::new(None), finished: Condvar::new() })
    }

    /// Records the outcome (the first one counts) and wakes every waiter.
    pub(super) fn finish(&self, outcome: Result<()>) {
        let mut slot = lock(&self.outcome);
        if slot.is_none() {
            *slot = Some(outcome);
        }
        self.finished.notify_all();
    }

    /// The device and queue the work runs on.
    pub(super) fn context(&self) -> &Arc<Context> {
        &self.context
    }

    fn outcome(&self) -> Option<Result<()>> {
        lock(&self.outcome).clone()
    }
}

impl Completion for WgpuCompletion {
    fn poll(&self) -> Result<bool> {
        if let Some(outcome) = self.outcome() {
            return outcome.map(|()| true);
        }
        if let Err(err) = self.context.poll() {
            self.finish(Err(err));
        }
        self.outcome().map_or(Ok(false), |outcome| outcome.map(|()| true))
    }

    fn wait(&self) -> Result<()> {
        let start = Instant::now();
        let mut pause = FIRST_PAUSE;
        loop {
            if let Err(err) = self.context.poll() {
                self.finish(Err(err));
            }
            let slot = lock(&self.outcome);
            if let Some(outcome) = &*slot {
                return outcome.clone();
            }
            if start.elapsed() < SPIN {
                drop(slot);
                std::thread::yield_now();
                continue;
            }
            // Until the next poll, a callback run by another thread's poll wakes this one.
            drop(self.finished.wait_timeout(slot, pause).unwrap_or_else(PoisonError::into_inner));
            pause = (pause * 2).min(LONGEST_PAUSE);
        }
    }
}
