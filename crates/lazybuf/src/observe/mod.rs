//! Seeing every copy: the transfer guard ([`guard`]) and the event recorder ([`trace`]).
//!
//! Every copy lazybuf makes between memories is planned by [`crate::coherence`] and executed
//! by the buffer engine, which counts it in [`crate::TransferStats`]. This module sees exactly
//! those copies (a zero-copy sync of a device that aliases host memory moves no bytes: it is
//! not a copy, here as in the counters):
//!
//! - the **guard** decides, when a plan is made and before anything is allocated or enqueued,
//!   whether each copy of the plan may run: allowed, logged, or refused with
//!   [`crate::Error::TransferGuard`] (the access then changes nothing);
//! - the **recorder**, when started, records each copy once it is enqueued (and, for blocking
//!   calls, waited for), with allocations, frees, pool hits and misses and state transitions.
//!
//! **Cost when off.** Both are off unless a guard level other than `allow` is set somewhere
//! (process-wide, on any thread, or by `LAZYBUF_TRANSFER_GUARD`) or the recorder runs: then
//! each hook is one relaxed load of one atomic ([`active`], [`recording`]), and no event memory
//! exists.
//!
//! **Other copy sites.** Code that moves a buffer's bytes between memories outside the
//! coherence plans (spilling's evictions and reloads, a direct download into a caller's
//! array) must call [`transfer`] before it starts the copy (an error means: do not copy,
//! change nothing) and [`Started::enqueued`] / [`Started::finished`] after, so the guard and
//! the recorder miss none.
//!
//! What does not live here: the counters ([`crate::buffer`]), the hooks' call sites
//! (`buffer/raw/observed.rs` and one line per copy site).

mod event;
pub mod guard;
mod json;
pub(crate) mod kinds;
mod record;

pub use kinds::Direction;
pub mod trace;
#[cfg(feature = "tracing")]
mod tracing_events;

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::Result;

/// Bits of [`ACTIVE`].
const GUARD_BIT: u64 = 1;
const TRACE_BIT: u64 = 2;
/// `LAZYBUF_TRANSFER_GUARD` not read yet: the first hook reads it.
const ENV_BIT: u64 = 4;
/// Events go to the `tracing` crate ([`set_tracing_events`]).
const TRACING_BIT: u64 = 8;
/// The bits above; the rest of [`ACTIVE`] counts the times events were turned on or off
/// ([`EmitEpoch`]).
const FLAGS: u64 = 0xff;
const EMIT_BITS: u64 = TRACE_BIT | TRACING_BIT;
const EPOCH_UNIT: u64 = 1 << 8;

/// Whether any hook has work to do (bits above), and the emit epoch. Written under
/// `guard::STATE`'s lock or the recorder's.
static ACTIVE: AtomicU64 = AtomicU64::new(ENV_BIT);

/// Whether the guard or the recorder may have something to do: the copy path's one check.
#[inline(always)]
pub fn active() -> bool {
    ACTIVE.load(Ordering::Relaxed) & FLAGS != 0
}

/// Whether the recorder runs.
#[inline(always)]
pub fn recording() -> bool {
    ACTIVE.load(Ordering::Relaxed) & TRACE_BIT != 0
}

/// Whether the guard may refuse or log (a level other than `allow` is set somewhere, or
/// `LAZYBUF_TRANSFER_GUARD` is not read yet or malformed). While it may not, a call that uses
/// only one buffer can be named by that buffer ([`crate::RawBuffer::as_call`]) instead of
/// [`call`]: nothing else asks for the running call.
#[inline(always)]
pub fn guarding() -> bool {
    ACTIVE.load(Ordering::Relaxed) & (GUARD_BIT | ENV_BIT) != 0
}

/// Whether events are wanted: the recorder runs, or they go to `tracing`.
#[inline(always)]
pub(crate) fn emitting() -> bool {
    ACTIVE.load(Ordering::Relaxed) & EMIT_BITS != 0
}

/// The stretch of time events have been wanted in without a break, while they are: a new one
/// each time the recorder or the `tracing` events start or stop (`None` while no event is
/// wanted). Read from the same atomic as [`emitting`], so a thread that saw events off (and
/// let a change go unrecorded) never sees an earlier epoch again: a buffer whose last state
/// event was recorded in the epoch that runs now has had every change since recorded, and
/// its state is where that event ended (`buffer/raw/observed.rs`, `StateEvents`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct EmitEpoch(u64);

impl EmitEpoch {
    /// No epoch: [`emit_epoch`] never returns it (an epoch is the atomic's word shifted right).
    pub(crate) const NONE: EmitEpoch = EmitEpoch(u64::MAX);
}

/// The current [`EmitEpoch`], `None` while events are not wanted.
#[inline(always)]
pub(crate) fn emit_epoch() -> Option<EmitEpoch> {
    let word = ACTIVE.load(Ordering::Relaxed);
    (word & EMIT_BITS != 0).then_some(EmitEpoch(word >> 8))
}

/// Sends every event the recorder would record (copies, allocations, frees, pool lookups,
/// state transitions) to the `tracing` crate as well, whether or not the recorder runs: target
/// `lazybuf::observe`, level TRACE, the event's fields as `tracing` fields, for the caller's
/// own subscribers. Off by default: while off, no event is built for `tracing`. (Copies the
/// guard logs go to `tracing` at WARN, target `lazybuf::transfer_guard`, whenever the feature
/// is on.)
#[cfg(feature = "tracing")]
pub fn set_tracing_events(on: bool) {
    if on {
        // The events' clock is calibrated here, not at the first event.
        record::calibrate();
        record::record_in_this_process();
    }
    set_bit(TRACING_BIT, on);
}

/// Whether events go to `tracing` ([`set_tracing_events`]).
#[cfg(feature = "tracing")]
#[inline(always)]
pub(crate) fn tracing_events() -> bool {
    ACTIVE.load(Ordering::Relaxed) & TRACING_BIT != 0
}

/// Runs `f` while holding the recorder's process-wide lock (for tests of a fork made while
/// another thread holds it).
#[cfg(feature = "testing")]
pub(crate) fn with_recorder_locked<R>(f: impl FnOnce() -> R) -> R {
    let _held = record::global();
    f()
}

/// Runs `f` while holding the lock of the recorder's table of device and call names (for
/// tests of a fork made while another thread holds it).
#[cfg(feature = "testing")]
pub(crate) fn with_recorder_names_locked<R>(f: impl FnOnce() -> R) -> R {
    let _held = record::names();
    f()
}

/// Sets or clears `bit` of [`ACTIVE`]; a change of whether events are wanted (or by whom)
/// starts a new [`EmitEpoch`].
fn set_bit(bit: u64, on: bool) {
    let update = |word: u64| {
        let flags = if on { word | bit } else { word & !bit };
        let changed = (flags ^ word) & EMIT_BITS != 0;
        Some(if changed { flags.wrapping_add(EPOCH_UNIT) } else { flags })
    };
    // The closure never refuses: `fetch_update` returns Ok.
    let _ = ACTIVE.fetch_update(Ordering::AcqRel, Ordering::Relaxed, update);
}

static NEXT_BUFFER: AtomicU64 = AtomicU64::new(1);

/// A new buffer's id (1, 2, ...: unique in the process), the name errors and events give it.
pub(crate) fn next_buffer_id() -> u64 {
    NEXT_BUFFER.fetch_add(1, Ordering::Relaxed)
}

/// Forgets this thread's last pool lookup, which [`trace`]'s allocation events take their
/// source from (a hit: `cache`), while events are wanted (one relaxed load when not): before an
/// allocation whose source must come from its own lookup only (none: `upstream`), and after
/// one that failed or whose block was refused, so that no later allocation takes a lookup that
/// served no allocation (memory objects, `memory/observed.rs`; a buffer's refused blocks,
/// `buffer/raw/execute.rs`).
pub(crate) fn forget_pool_lookup() {
    if emitting() {
        let _ = record::with_local(|local| local.pool_hit.set(None));
    }
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Direction::HostToDevice => "host-to-device",
            Direction::DeviceToHost => "device-to-host",
            Direction::DeviceToDevice => "device-to-device",
        })
    }
}

/// Why a copy happens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    /// An access that needed a current copy (a host or device view, a `mark_*_dirty`): an
    /// implicit transfer.
    Access,
    /// A call whose job is the copy (`sync_to_*`, `copy_to`, `to_numpy`): an explicit one.
    Sync,
    /// Spilling: a write-back or reload the library decided on (implicit).
    Eviction,
}

impl Reason {
    /// `access`, `sync`, `eviction`.
    pub fn name(self) -> &'static str {
        match self {
            Reason::Access => "access",
            Reason::Sync => "sync",
            Reason::Eviction => "eviction",
        }
    }

    /// Whether the caller asked for the copy itself (JAX's "explicit" transfers).
    pub fn is_explicit(self) -> bool {
        self == Reason::Sync
    }
}

/// The call that caused a copy, and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cause {
    /// The API call, as its caller knows it (`"sync_to_device"`, `"host"`, `"to_numpy"`).
    pub call: &'static str,
    /// Why it copies.
    pub reason: Reason,
}

impl Cause {
    /// An implicit copy, made for an access by `call`.
    pub const fn access(call: &'static str) -> Cause {
        Cause { call, reason: Reason::Access }
    }

    /// An explicit copy, asked for by `call`.
    pub const fn sync(call: &'static str) -> Cause {
        Cause { call, reason: Reason::Sync }
    }

    /// Whether the running [`call`]'s cause replaces this one, the engine's own name for a
    /// copy: yes, except for spilling's copies (reason [`Reason::Eviction`]), which lazybuf
    /// decides on whatever call they happen in (an explicit `sync_to_device` that needs room
    /// does not make the write-back it causes explicit).
    pub(crate) const fn yields_to_call(self) -> bool {
        !matches!(self.reason, Reason::Eviction)
    }
}

/// Runs `f` as `cause`: the copies it makes on this thread are attributed to `cause` instead
/// of the engine's own name for them (a binding's `to_numpy` reads the host like any host
/// access, but it is an explicit transfer). Inside another `call` on this thread the enclosing
/// one's cause stays: the outermost call is the one the user made (`__array__` calling
/// `to_numpy`). Costs one atomic load when nothing observes, one look at the thread's recorder
/// state when something does.
#[inline]
pub fn call<R>(cause: Cause, f: impl FnOnce() -> R) -> R {
    in_thread_state(f, |local, f| local.run_as(cause, f))
}

/// Runs `f` as `cause`, also inside another [`call`] on this thread (whose cause is restored
/// after): for a call the user's own code makes while lazybuf runs it in the middle of another
/// call (a binding's conversion running the user's `__float__`, which reads another buffer).
/// Such a call is the user's, not part of the one running, and its copies are judged as its
/// own (an explicit `to_numpy()` there is allowed under `disallow`, an implicit `.host`
/// refused).
pub fn call_anew<R>(cause: Cause, f: impl FnOnce() -> R) -> R {
    in_thread_state(f, |local, f| local.run_anew(cause, f))
}

/// `f`, run by `run` inside the one look at the thread's recorder state that sets and restores
/// the running call's cause (also when `f` unwinds); just `f` when nothing observes, or when
/// the thread's state is gone (the thread is exiting: `f` runs unattributed).
#[inline]
fn in_thread_state<R, F: FnOnce() -> R>(f: F, run: impl FnOnce(&record::Local, F) -> R) -> R {
    if !active() {
        return f();
    }
    // `f` stays here until the thread's state is known to be there (one `Option` around the
    // result, not two: the result is moved once less).
    let mut f = Some(f);
    match record::with_local(|l| match f.take() {
        Some(f) => run(l, f),
        None => unreachable!("with_local runs its closure once"),
    }) {
        Some(done) => done,
        None => match f {
            Some(f) => f(),
            None => unreachable!("with_local did not run its closure, which takes f"),
        },
    }
}

/// The cause set by [`call`] on this thread, else `default`; an eviction's `default` always
/// (see [`Cause::yields_to_call`]).
pub(crate) fn cause_or(default: Cause) -> Cause {
    if !default.yields_to_call() {
        return default;
    }
    record::with_local(|l| l.cause.get()).flatten().unwrap_or(default)
}

/// One copy between memories, as the guard and the recorder see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransferInfo {
    /// The buffer's id ([`crate::RawBuffer::id`]).
    pub buffer: u64,
    /// Which way it goes.
    pub direction: Direction,
    /// Bytes it moves.
    pub bytes: usize,
    /// Where from: `host`, or the device's name.
    pub from: String,
    /// Where to.
    pub to: String,
    /// What caused it.
    pub cause: Cause,
}

/// A copy [`transfer`] let through while recording: report its end.
#[derive(Debug)]
#[must_use = "report the copy with enqueued() or finished()"]
pub struct Started {
    /// Its devices by number (`trace::OutsideCopy`): no name formatted or looked up at its end.
    copy: trace::OutsideCopy,
    /// The recorder's ticks at the start.
    start: u64,
}

impl Started {
    /// The copy is enqueued and will complete later (its end is not recorded).
    pub fn enqueued(self, stream: usize) {
        trace::record_outside_copy(self.copy, stream, self.start, false);
    }

    /// The copy has completed (it was waited for).
    pub fn finished(self, stream: usize) {
        trace::record_outside_copy(self.copy, stream, self.start, true);
    }
}

/// A stream's identity in events ([`Started::enqueued`], [`Started::finished`]): the same for
/// every clone of the stream, not a runtime handle.
pub fn stream_id(stream: &crate::device::Stream) -> usize {
    std::ptr::from_ref(stream.handle()).cast::<()>() as usize
}

/// The hook for copy sites outside the coherence plans (spilling's write-backs and reloads, a
/// direct download): call it before the copy starts, with what the copy will be. An error (the
/// guard refuses) means the caller must not copy and must change nothing. `Ok(Some(_))` while
/// recording: report the copy's end through it. `info` is built only when [`active`].
///
/// The copies the engine plans do not go through here: they are checked when planned and
/// recorded when executed (`buffer/raw/observed.rs`).
#[inline]
pub fn transfer(info: impl FnOnce() -> TransferInfo) -> Result<Option<Started>> {
    if !active() {
        return Ok(None);
    }
    let info = info();
    if guarding() {
        guard::check(std::slice::from_ref(&info))?;
    }
    Ok(if emitting() { trace::start_described_copy(&info) } else { None })
}
