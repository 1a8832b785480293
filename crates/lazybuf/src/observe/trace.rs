//! The event recorder: a bounded ring of what lazybuf did to memory, while started.
//!
//! [`start`] begins recording into a ring of `capacity` events (the oldest are dropped when it
//! is full, and counted); [`stop`] ends it and returns the [`Trace`]; [`snapshot`] copies the
//! ring without stopping. Recorded: every copy between memories the transfer counters count
//! (direction, bytes, the call and [`Reason`] that caused it, the stream, and its duration
//! when the call waited for it: enqueue to completion, as the blocking call saw it; an
//! asynchronous sync's copies are recorded when enqueued, without a duration), the memory
//! buffers and memory objects take and give back (device, [`MemoryKind`], bytes, served from
//! a pool's cache or from upstream, and for frees the buffer that owned the block), pool hits and
//! misses, each buffer's state transitions (those of a failed asynchronous transfer's undoing
//! included), the rollback of a plan's copies when a later step of the plan fails or its
//! asynchronous transfer fails ([`EventKind::Rollback`]: the counters take those copies back,
//! and so does the [`Summary`]), and the coherence checker's comparison reads
//! ([`EventKind::CheckerRead`], no transfer). On request each event carries the Rust
//! backtrace, and the stack its binding gave ([`call_with_stack`]: Python's).
//!
//! Each thread stages its events in a chunk of its own (`record.rs`): an event is a few
//! plain numbers (devices and calls by number, names resolved when a trace is exported), at
//! most one read of the time-stamp counter (the events of one [`super::call`] share its
//! time; copies are timed on their own) and no lock or allocation. [`snapshot`] and [`stop`] gather every
//! thread's events, ordered by time (a thread's own events in the order it recorded them).
//!
//! A [`Trace`] exports as Chrome trace-event JSON ([`Trace::to_chrome_json`], for
//! ui.perfetto.dev and chrome://tracing) and as a plain [`Summary`]: copies and bytes per
//! buffer, direction and reason.
//!
//! Recording off: the hooks cost one atomic load and no ring exists (another thread than the
//! one that stopped the recorder keeps its small staging chunk until it records again or
//! exits). With the crate
//! feature `tracing`, [`super::set_tracing_events`] sends the same events to the `tracing`
//! crate, recorder or not.
//!
//! ```
//! use lazybuf::observe::trace;
//! use lazybuf::{Device, UnifiedBuffer};
//!
//! trace::start(trace::TraceOptions::default())?;
//! let mut buf = UnifiedBuffer::<u32>::on(&[1024], &lazybuf::default_device()?)?;
//! buf.host_mut()?.fill(7);
//! buf.sync_to_device()?;
//! let recorded = trace::stop()?;
//! println!("{}", recorded.summary()); // copies and bytes per buffer, direction and reason
//! let json = recorded.to_chrome_json(); // open in ui.perfetto.dev or chrome://tracing
//! assert!(json.contains("traceEvents"));
//! # Ok::<(), lazybuf::Error>(())
//! ```

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

pub use super::event::{Event, EventKind, MemoryKind, Source};
use super::record::{self, Dev, Entry, HOST, Local, Names, Raw};
use super::{Cause, Direction, Reason, TRACE_BIT, TransferInfo};
use crate::coherence::BufferState;
use crate::device::Device;
use crate::error::{Error, Result};

/// How to record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceOptions {
    /// The most events kept; older ones are dropped (and counted) when more come.
    pub capacity: usize,
    /// Attach the Rust backtrace to each event (slow: for finding a copy's origin).
    pub rust_backtrace: bool,
}

impl Default for TraceOptions {
    fn default() -> TraceOptions {
        TraceOptions { capacity: 1 << 20, rust_backtrace: false }
    }
}

/// What [`stop`] or [`snapshot`] returns.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Trace {
    /// The events kept, oldest first.
    pub events: Vec<Event>,
    /// Events dropped because the ring was full.
    pub dropped: u64,
}

/// Starts recording; an error if recording already or `capacity` is 0.
pub fn start(options: TraceOptions) -> Result<()> {
    begin(options).map(drop)
}

/// [`start`], returning the session begun (its generation, read under the same lock).
fn begin(options: TraceOptions) -> Result<Session> {
    if options.capacity == 0 {
        return Err(Error::invalid("trace.start", "expected a capacity of at least 1 event, got 0"));
    }
    let mut global = record::global_of_this_process("trace.start")?;
    if global.session.is_some() {
        return Err(Error::invalid("trace.start", "the recorder is already recording; stop() it first"));
    }
    record::begin(&mut global, options.capacity, options.rust_backtrace);
    super::set_bit(TRACE_BIT, true);
    Ok(Session(global.session.as_ref().map_or(0, |s| s.generation)))
}

/// One recording, as [`start_session`] began it (for [`stop_session`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Session(u64);

/// [`start`], returning the recording begun: for a caller that must stop its own recording and
/// no other (a scope, such as Python's `trace.record()` block, while other threads may stop
/// and start the recorder).
pub fn start_session(options: TraceOptions) -> Result<Session> {
    begin(options)
}

/// [`stop`] when the recording that runs is `session`; an error, with the recorder left as it
/// is, when `session` was stopped already (another recording, started since, runs on).
pub fn stop_session(session: Session) -> Result<Trace> {
    stop_where(|generation| generation == session.0)
}

/// Stops recording and returns what was recorded (every thread's events, in order); an error
/// if not recording.
pub fn stop() -> Result<Trace> {
    stop_where(|_| true)
}

fn stop_where(ours: impl FnOnce(u64) -> bool) -> Result<Trace> {
    let mut global = record::global_of_this_process("trace.stop")?;
    let Some(generation) = global.session.as_ref().map(|s| s.generation) else {
        return Err(Error::invalid("trace.stop", "the recorder is not recording; start() it first"));
    };
    if !ours(generation) {
        return Err(Error::invalid(
            "trace.stop",
            "the recording this scope started was stopped already; another one runs now (left running)",
        ));
    }
    let (entries, dropped) = record::collect(&global);
    let origin = global.session.as_ref().map_or(0, |s| s.origin);
    super::set_bit(TRACE_BIT, false);
    drop(record::end(&mut global));
    drop(global);
    Ok(export(entries, dropped, origin))
}

/// What was recorded so far, recording on; an error if not recording.
pub fn snapshot() -> Result<Trace> {
    let global = record::global_of_this_process("trace.snapshot")?;
    let Some(session) = global.session.as_ref() else {
        return Err(Error::invalid("trace.snapshot", "the recorder is not recording; start() it first"));
    };
    let origin = session.origin;
    let (entries, dropped) = record::collect(&global);
    drop(global);
    Ok(export(entries, dropped, origin))
}

/// Whether the recorder runs.
pub fn is_recording() -> bool {
    // A forked child of the recording process records nothing of its session (it said "true"
    // there: the thirteenth hostile pass, 2026-11-28).
    super::recording() && !record::in_forked_child()
}

/// The public events of `entries`, names resolved.
fn export(entries: Vec<Entry>, dropped: u64, origin: u64) -> Trace {
    record::with_names(|names| export_named(entries, dropped, origin, names))
}

fn export_named(entries: Vec<Entry>, dropped: u64, origin: u64, names: &Names) -> Trace {
    let events = entries
        .into_iter()
        .enumerate()
        .map(|(seq, entry)| {
            let (kind, at) = resolve(entry.raw, entry.time, names);
            Event {
                seq: dropped + seq as u64,
                time: Duration::from_nanos(at.saturating_sub(origin)),
                thread: entry.thread,
                kind,
                stack: entry.stack,
            }
        })
        .collect();
    Trace { events, dropped }
}

/// The public kind of `raw`, recorded at `time`, and the time it is shown at (a copy's or a
/// checker read's start).
fn resolve(raw: Raw, time: u64, names: &Names) -> (EventKind, u64) {
    let name = |device: Dev| names.device(device).to_string();
    match raw {
        Raw::Transfer { buffer, op, direction, bytes, from, to, call, reason, stream, start, waited } => (
            EventKind::Transfer {
                info: TransferInfo {
                    buffer,
                    direction,
                    bytes: bytes as usize,
                    from: name(from),
                    to: name(to),
                    cause: Cause { call: names.call(call), reason },
                },
                stream: stream as usize,
                duration: waited.then(|| Duration::from_nanos(time.saturating_sub(start))),
                op,
            },
            start,
        ),
        Raw::Allocate { buffer, device, kind, bytes, source } => {
            (EventKind::Allocate { buffer, device: name(device), kind, bytes: bytes as usize, source }, time)
        }
        Raw::Free { buffer, device, kind, bytes } => (
            EventKind::Free {
                buffer: (buffer != 0).then_some(buffer),
                device: name(device),
                kind,
                bytes: bytes as usize,
            },
            time,
        ),
        Raw::Pool { hit, device, bytes } => {
            (EventKind::Pool { hit, device: name(device), bytes: bytes as usize }, time)
        }
        Raw::State { buffer, from, to, call } => {
            (EventKind::State { buffer, from, to, call: names.call(call) }, time)
        }
        Raw::Rollback { buffer, op, allocations, call } => {
            (EventKind::Rollback { buffer, op, allocations, call: names.call(call) }, time)
        }
        // Collected as two events (`Raw::expand`: the allocation or free, then the state
        // transition); as one kind, the first.
        raw @ (Raw::Released { .. } | Raw::Allocated { .. }) => resolve(raw.expand().0, time, names),
        Raw::CheckerRead { buffer, device, bytes, start } => (
            EventKind::CheckerRead {
                buffer,
                device: name(device),
                bytes: bytes as usize,
                duration: Duration::from_nanos(time.saturating_sub(start)),
            },
            start,
        ),
    }
}

/// Runs `f` with `stack` (a binding's call stack, in words) attached to the events it records
/// on this thread.
pub fn call_with_stack<R>(stack: Option<Arc<str>>, f: impl FnOnce() -> R) -> R {
    let previous = record::with_local(|l| l.set_stack(stack)).flatten();
    struct Put(Option<Arc<str>>);
    impl Drop for Put {
        fn drop(&mut self) {
            let previous = self.0.take();
            let _ = record::with_local(|l| l.set_stack(previous));
        }
    }
    let _put = Put(previous);
    f()
}

/// Records the event `build` makes (while events are wanted: the caller checked
/// [`super::emitting`]), stamped with its call's time (`Local::event_time`).
#[inline]
fn emit(build: impl FnOnce(&Local) -> Raw) {
    emit_at(Local::event_time, build);
}

/// Records the end of a copy or read, or a free: stamped with a new reading of the clock. (A
/// free inside a call may be of memory another thread allocated after the call's first
/// reading and handed over since, as a failure callback or a finalizer running inside the call
/// drops it: stamped with that reading, it came before its allocation in the merged trace.)
#[inline]
fn emit_ended(build: impl FnOnce(&Local) -> Raw) {
    emit_at(Local::fresh_time, build);
}

#[inline]
fn emit_at(time: fn(&Local) -> u64, build: impl FnOnce(&Local) -> Raw) {
    // A forked child of the recording process records nothing and takes no lock of the
    // recorder (a parent's thread may have held one at the fork): checked where a lock would
    // be taken, on the slow path ([`Local::push`]) and before the names' lock here. (A thread
    // that forked keeps its chunk of the parent's session in the child: it may stage events
    // there, which nobody reads.)
    record::with_local(|local| {
        // The time first: the event is built next to its staging, each field a constant or a
        // register (a call between them left the event in memory, its kind looked up again).
        let at = time(local);
        let raw = build(local);
        #[cfg(feature = "tracing")]
        if super::tracing_events() && !record::in_forked_child() {
            let (first, second) = raw.expand();
            for raw in std::iter::once(first).chain(second) {
                // Resolved first: the names' lock is not held while the subscriber runs (one
                // that used lazybuf waited for it for ever: the nineteenth hostile pass).
                let event = record::with_names(|names| resolve(raw.to_nanos(), record::nanos(at), names).0);
                super::tracing_events::emit(&event);
            }
        }
        local.push(at, raw);
    });
}

/// Now, as events count time (the recorder's clock ticks, turned into nanoseconds when the
/// events are collected): a copy's start.
#[inline]
pub(crate) fn now() -> u64 {
    record::with_local(Local::fresh_time).unwrap_or_else(record::now)
}

/// The call an event names.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Call {
    /// The running [`super::call`]'s, else this cause's: looked up when the event is recorded,
    /// in the look at the thread's recorder state that recording takes anyway.
    Of(Cause),
    /// This one.
    Named(&'static str),
    /// This cause, whatever call runs on the thread: a buffer's own call
    /// ([`crate::RawBuffer::as_call`]), or a copy's reporter's ([`super::transfer`]).
    Own(Cause),
}

impl Call {
    #[inline]
    fn resolve(self, local: &Local) -> Cause {
        match self {
            Call::Of(default) if default.yields_to_call() => local.cause.get().unwrap_or(default),
            Call::Of(default) => default,
            Call::Named(call) => Cause::access(call),
            Call::Own(cause) => cause,
        }
    }
}

/// A copy's plan execution, as its event names it ([`record_copy`]).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Op {
    /// Not part of a plan.
    None,
    /// Of a plan: its number, or 0 when this is its first recorded copy (a new number).
    Plan(u64),
}

/// One copy the engine executed (its devices: `None` is the host).
pub(crate) struct CopyEvent<'a> {
    pub(crate) buffer: u64,
    pub(crate) op: Op,
    pub(crate) direction: Direction,
    pub(crate) bytes: usize,
    pub(crate) from: Option<&'a Device>,
    pub(crate) to: Option<&'a Device>,
    pub(crate) cause: Call,
    pub(crate) stream: usize,
    /// When it started ([`now`]).
    pub(crate) start: u64,
    /// Whether the call waited for it (it ended just now).
    pub(crate) waited: bool,
}

/// Records a copy the engine executed, attributed to the running call, else to `copy.cause`;
/// returns its plan's number (0: none).
pub(crate) fn record_copy(copy: CopyEvent<'_>) -> u64 {
    let mut number = 0;
    emit_ended(|local| {
        let dev = |d: Option<&Device>| d.map_or(HOST, |d| local.dev(d));
        let cause = copy.cause.resolve(local);
        number = match copy.op {
            Op::None => 0,
            Op::Plan(0) => local.next_op(),
            Op::Plan(op) => op,
        };
        Raw::Transfer {
            buffer: copy.buffer,
            op: number,
            direction: copy.direction,
            bytes: copy.bytes as u64,
            from: dev(copy.from),
            to: dev(copy.to),
            call: local.call(cause.call),
            reason: cause.reason,
            stream: copy.stream as u64,
            start: copy.start,
            waited: copy.waited,
        }
    });
    number
}

/// A copy outside the plans, as [`start_outside_copy`] or [`start_described_copy`] began
/// recording it: its devices by number.
#[derive(Debug)]
pub(crate) struct OutsideCopy {
    buffer: u64,
    direction: Direction,
    bytes: u64,
    from: Dev,
    to: Dev,
    /// The engine's (`Call::Of`: a running [`super::call`] replaces it when the copy is
    /// recorded), the buffer's own call's or its reporter's ([`super::transfer`]).
    cause: Call,
}

/// Begins recording a copy of `buffer` outside its plans, from `from` to `to` (`None`: the
/// host), while events are wanted: its devices' numbers and its start, in one look at the
/// thread's recorder state, no name formatted (its end: [`super::Started::finished`]). `None`
/// when this thread records nothing (it is exiting, or the process is a forked child of the
/// recording one).
pub(crate) fn start_outside_copy(
    buffer: u64,
    direction: Direction,
    bytes: usize,
    from: Option<&Device>,
    to: Option<&Device>,
    cause: Call,
) -> Option<super::Started> {
    if record::in_forked_child() {
        return None;
    }
    record::with_local(|local| {
        let dev = |d: Option<&Device>| d.map_or(HOST, |d| local.dev(d));
        let (from, to) = (dev(from), dev(to));
        let copy = OutsideCopy { buffer, direction, bytes: bytes as u64, from, to, cause };
        super::Started { copy, start: local.fresh_time() }
    })
}

/// Begins recording a copy reported through [`super::transfer`], its devices known by name
/// (numbered now, once: not at its end).
pub(crate) fn start_described_copy(info: &TransferInfo) -> Option<super::Started> {
    if record::in_forked_child() {
        return None; // before the device names' lock, as `emit_at`
    }
    let (from, to) = (record::named_device(&info.from), record::named_device(&info.to));
    let (buffer, direction, bytes, cause) = (info.buffer, info.direction, info.bytes as u64, info.cause);
    let copy = OutsideCopy { buffer, direction, bytes, from, to, cause: Call::Own(cause) };
    Some(super::Started { copy, start: now() })
}

/// Records the end of a copy [`start_outside_copy`] or [`start_described_copy`] began.
pub(crate) fn record_outside_copy(copy: OutsideCopy, stream: usize, start: u64, waited: bool) {
    emit_ended(|local| {
        let cause = copy.cause.resolve(local);
        Raw::Transfer {
            buffer: copy.buffer,
            op: 0,
            direction: copy.direction,
            bytes: copy.bytes,
            from: copy.from,
            to: copy.to,
            call: local.call(cause.call),
            reason: cause.reason,
            stream: stream as u64,
            start,
            waited,
        }
    });
}

/// Records a buffer's new block (only while events are wanted).
#[inline]
pub(crate) fn record_allocate(buffer: u64, device: &Device, kind: MemoryKind, bytes: usize) {
    if !super::emitting() {
        return;
    }
    emit(|local| {
        let hit = local.pool_hit.take();
        let source = if hit == Some(true) { Source::Cache } else { Source::Upstream };
        Raw::Allocate { buffer, device: local.dev(device), kind, bytes: bytes as u64, source }
    });
}

/// Records a block `buffer` gave back (only while events are wanted), at a new reading of the
/// clock ([`emit_ended`]).
#[inline]
pub(crate) fn record_free(buffer: Option<u64>, device: &Device, kind: MemoryKind, bytes: usize) {
    if super::emitting() {
        emit_ended(|local| Raw::Free {
            buffer: buffer.unwrap_or(0),
            device: local.dev(device),
            kind,
            bytes: bytes as u64,
        });
    }
}

/// A pool's lookup for a cached block (the hook of the caching resource).
#[inline]
pub(crate) fn record_pool(hit: bool, device: &Device, bytes: usize) {
    if super::emitting() {
        emit(|local| {
            local.pool_hit.set(Some(hit));
            Raw::Pool { hit, device: local.dev(device), bytes: bytes as u64 }
        });
    }
}

/// A buffer's state transition (none when `from == to`).
#[inline]
pub(crate) fn record_state(buffer: u64, from: BufferState, to: BufferState, call: Call) {
    if from != to {
        emit(|local| Raw::State { buffer, from, to, call: local.call(call.resolve(local).call) });
    }
}

/// A buffer's state transition (none when `from == to`) after its access allocated a host
/// block of `bytes` on `device` (unrecorded so far), as one record when both happened:
/// collected as the allocation, then the transition (one look at the thread's recorder
/// state, one staging).
#[inline]
pub(crate) fn record_allocated(
    buffer: u64,
    device: &Device,
    kind: MemoryKind,
    bytes: usize,
    from: BufferState,
    to: BufferState,
    call: Call,
) {
    if from == to {
        return record_allocate(buffer, device, kind, bytes);
    }
    emit(|local| {
        let hit = local.pool_hit.take();
        Raw::Allocated {
            buffer,
            device: local.dev(device),
            kind,
            bytes: bytes as u64,
            source: if hit == Some(true) { Source::Cache } else { Source::Upstream },
            from,
            to,
            call: local.call(call.resolve(local).call),
        }
    });
}

/// A buffer's release: the free of its host block (`bytes` on `device`) and its state
/// transition (none when `from == to`), as one record when both happened (collected as the
/// free, then the transition), at a new reading of the clock, as any free ([`emit_ended`]).
#[inline]
pub(crate) fn record_released(
    buffer: u64,
    device: &Device,
    kind: MemoryKind,
    bytes: usize,
    from: BufferState,
    to: BufferState,
    call: Call,
) {
    if from == to {
        return record_free(Some(buffer), device, kind, bytes);
    }
    emit_ended(|local| Raw::Released {
        buffer,
        device: local.dev(device),
        kind,
        bytes: bytes as u64,
        from,
        to,
        call: local.call(call.resolve(local).call),
    });
}

/// The copies of plan execution `op` of `buffer` were undone (0: none recorded), and
/// `allocations` blocks it took, which the counters do not count.
pub(crate) fn record_rollback(buffer: u64, op: u64, allocations: u64, call: Call) {
    emit(|local| Raw::Rollback { buffer, op, allocations, call: local.call(call.resolve(local).call) });
}

/// The coherence checker read `bytes` of `device`'s copy back, from `start` ([`now`]) to now.
pub(crate) fn record_checker_read(buffer: u64, device: &Device, bytes: usize, start: u64) {
    emit_ended(|local| Raw::CheckerRead { buffer, device: local.dev(device), bytes: bytes as u64, start });
}

/// Copies and bytes of one buffer, direction and reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Copies.
    pub copies: u64,
    /// Bytes.
    pub bytes: u64,
}

impl Tally {
    /// Adds `other`'s counts, each held at `u64::MAX` (a trace read back from elsewhere may
    /// hold any byte counts: their sum is then "at least", never a panic or a wrapped total).
    fn add(&mut self, other: Tally) {
        self.copies = self.copies.saturating_add(other.copies);
        self.bytes = self.bytes.saturating_add(other.bytes);
    }
}

/// Copies and bytes per buffer, direction and reason.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Keyed by (buffer, direction, reason).
    pub rows: BTreeMap<(u64, Direction, Reason), Tally>,
    /// Events dropped by the ring (the summary misses their copies).
    pub dropped: u64,
}

impl Summary {
    /// The totals per direction.
    pub fn by_direction(&self) -> BTreeMap<Direction, Tally> {
        let mut out = BTreeMap::<Direction, Tally>::new();
        for ((_, direction, _), tally) in &self.rows {
            let t = out.entry(*direction).or_default();
            t.add(*tally);
        }
        out
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:>8}  {:<9}  {:<8}  {:>8}  {:>14}",
            "buffer", "direction", "reason", "copies", "bytes"
        )?;
        for ((buffer, direction, reason), t) in &self.rows {
            writeln!(
                f,
                "{buffer:>8}  {:<9}  {:<8}  {:>8}  {:>14}",
                direction.name(),
                reason.name(),
                t.copies,
                t.bytes
            )?;
        }
        for (direction, t) in self.by_direction() {
            writeln!(
                f,
                "{:>8}  {:<9}  {:<8}  {:>8}  {:>14}",
                "total",
                direction.name(),
                "",
                t.copies,
                t.bytes
            )?;
        }
        if self.rows.is_empty() {
            // As `lazybuf trace summary` says it: a header alone reads as a cut-off table.
            writeln!(f, "(no copies recorded)")?;
        }
        if self.dropped > 0 {
            writeln!(f, "({} events dropped by the full ring are not counted)", self.dropped)?;
        }
        Ok(())
    }
}

impl Trace {
    /// Copies and bytes per buffer, direction and reason: the copies the transfer counters
    /// count (copies a [`EventKind::Rollback`] undid are left out, checker reads are no copies).
    pub fn summary(&self) -> Summary {
        let mut summary = Summary { dropped: self.dropped, ..Summary::default() };
        let undone: HashSet<(u64, u64)> = self
            .events
            .iter()
            .filter_map(|event| match event.kind {
                EventKind::Rollback { buffer, op, .. } if op != 0 => Some((buffer, op)),
                _ => None,
            })
            .collect();
        for event in &self.events {
            if let EventKind::Transfer { info, op, .. } = &event.kind {
                if undone.contains(&(info.buffer, *op)) {
                    continue;
                }
                let t = summary.rows.entry((info.buffer, info.direction, info.cause.reason)).or_default();
                t.add(Tally { copies: 1, bytes: info.bytes as u64 });
            }
        }
        summary
    }
}
