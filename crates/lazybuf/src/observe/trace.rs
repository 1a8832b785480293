//! The event recorder: a bounded ring of what lazybuf did to memory, while started.
//!
//! [`start`] begins recording into a ring of `capacity` events (the oldest are dropped when it
//! is full, and counted); [`stop`] ends it and returns the [`Trace`]; [`snapshot`] copies the
//! ring without stopping. Recorded: every copy between memories the transfer counters count
//! (direction, bytes, the call and [`Reason`] that caused it, the stream, and its duration
//! when the call waited for it: enqueue to completion, as the blocking call saw it; an
//! asynchronous sync's copies are recorded when enqueued, without a duration), the memory
//! buffers take and give back (device, host or device kind, bytes, served from a pool's
//! cache or from upstream), pool hits and misses, and each buffer's state transitions. On
//! request each event carries the Rust backtrace, and the stack its binding gave
//! ([`call_with_stack`]: Python's).
//!
//! A [`Trace`] exports as Chrome trace-event JSON ([`Trace::to_chrome_json`], for
//! ui.perfetto.dev and chrome://tracing) and as a plain [`Summary`]: copies and bytes per
//! buffer, direction and reason.
//!
//! Recording off: the hooks cost one atomic load and no event memory exists. With the crate
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

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

pub use super::event::{Event, EventKind, MemoryKind, Source};
use super::{Direction, Reason, TRACE_BIT, TransferInfo};
use crate::coherence::BufferState;
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

struct Recorder {
    options: TraceOptions,
    origin: Instant,
    events: VecDeque<Event>,
    seq: u64,
    dropped: u64,
}

static RECORDER: Mutex<Option<Recorder>> = Mutex::new(None);

fn recorder() -> std::sync::MutexGuard<'static, Option<Recorder>> {
    // Nothing panics while holding the lock: a poisoned ring is still consistent.
    RECORDER.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Starts recording; an error if recording already or `capacity` is 0.
pub fn start(options: TraceOptions) -> Result<()> {
    if options.capacity == 0 {
        return Err(Error::invalid("trace.start", "expected a capacity of at least 1 event, got 0"));
    }
    let mut slot = recorder();
    if slot.is_some() {
        return Err(Error::invalid("trace.start", "the recorder is already recording; stop() it first"));
    }
    *slot = Some(Recorder { options, origin: Instant::now(), events: VecDeque::new(), seq: 0, dropped: 0 });
    super::set_bit(TRACE_BIT, true);
    Ok(())
}

/// Stops recording and returns what was recorded; an error if not recording.
pub fn stop() -> Result<Trace> {
    let mut slot = recorder();
    let Some(rec) = slot.take() else {
        return Err(Error::invalid("trace.stop", "the recorder is not recording; start() it first"));
    };
    super::set_bit(TRACE_BIT, false);
    Ok(Trace { events: rec.events.into(), dropped: rec.dropped })
}

/// What was recorded so far, recording on; an error if not recording.
pub fn snapshot() -> Result<Trace> {
    let slot = recorder();
    let Some(rec) = slot.as_ref() else {
        return Err(Error::invalid("trace.snapshot", "the recorder is not recording; start() it first"));
    };
    Ok(Trace { events: rec.events.iter().cloned().collect(), dropped: rec.dropped })
}

/// Whether the recorder runs.
pub fn is_recording() -> bool {
    super::recording()
}

static NEXT_THREAD: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static THREAD_ID: u64 = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
    static STACK: RefCell<Option<Arc<str>>> = const { RefCell::new(None) };
    /// The outcome of this thread's last pool lookup: whether it hit.
    static POOL_HIT: Cell<Option<bool>> = const { Cell::new(None) };
}

/// Runs `f` with `stack` (a binding's call stack, in words) attached to the events it records
/// on this thread.
pub fn call_with_stack<R>(stack: Option<Arc<str>>, f: impl FnOnce() -> R) -> R {
    let previous = STACK.with(|s| s.replace(stack));
    struct Put(Option<Arc<str>>);
    impl Drop for Put {
        fn drop(&mut self) {
            let previous = self.0.take();
            let _ = STACK.try_with(|s| *s.borrow_mut() = previous);
        }
    }
    let _put = Put(previous);
    f()
}

fn push(kind: EventKind) {
    push_at(kind, None);
}

/// Records `kind`, as of `at` (else now).
fn push_at(kind: EventKind, at: Option<Instant>) {
    #[cfg(feature = "tracing")]
    super::emit_to_tracing(&kind);
    if !super::recording() {
        return;
    }
    let thread = THREAD_ID.try_with(|id| *id).unwrap_or(0);
    let given = STACK.try_with(|s| s.borrow().clone()).ok().flatten();
    let mut slot = recorder();
    let Some(rec) = slot.as_mut() else { return };
    let stack = if rec.options.rust_backtrace {
        let rust = std::backtrace::Backtrace::force_capture().to_string();
        Some(match given {
            Some(given) => format!("{given}\n{rust}").into(),
            None => rust.into(),
        })
    } else {
        given
    };
    if rec.events.len() >= rec.options.capacity {
        rec.events.pop_front();
        rec.dropped += 1;
    }
    let time = at.map_or_else(|| rec.origin.elapsed(), |at| at.saturating_duration_since(rec.origin));
    let event = Event { seq: rec.seq, time, thread, kind, stack };
    rec.seq += 1;
    rec.events.push_back(event);
}

pub(crate) fn record_transfer(info: TransferInfo, stream: usize, start: Instant, duration: Option<Duration>) {
    push_at(EventKind::Transfer { info, stream, duration }, Some(start));
}

/// Records a buffer's new block (only while recording).
pub(crate) fn record_allocate(buffer: u64, device: impl FnOnce() -> String, kind: MemoryKind, bytes: usize) {
    if !super::emitting() {
        return;
    }
    let hit = POOL_HIT.try_with(Cell::take).ok().flatten();
    let source = if hit == Some(true) { Source::Cache } else { Source::Upstream };
    push(EventKind::Allocate { buffer, device: device(), kind, bytes, source });
}

/// Records a block given back (only while recording).
pub(crate) fn record_free(device: impl FnOnce() -> String, kind: MemoryKind, bytes: usize) {
    if super::emitting() {
        push(EventKind::Free { device: device(), kind, bytes });
    }
}

/// A pool's lookup for a cached block (the hook of the caching resource).
#[inline]
pub(crate) fn record_pool(hit: bool, device: impl FnOnce() -> String, bytes: usize) {
    if super::emitting() {
        let _ = POOL_HIT.try_with(|h| h.set(Some(hit)));
        push(EventKind::Pool { hit, device: device(), bytes });
    }
}

pub(crate) fn record_state(buffer: u64, from: BufferState, to: BufferState, call: &'static str) {
    if from != to {
        push(EventKind::State { buffer, from, to, call });
    }
}

/// Copies and bytes of one buffer, direction and reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Copies.
    pub copies: u64,
    /// Bytes.
    pub bytes: u64,
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
            t.copies += tally.copies;
            t.bytes += tally.bytes;
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
        if self.dropped > 0 {
            writeln!(f, "({} events dropped by the full ring are not counted)", self.dropped)?;
        }
        Ok(())
    }
}

impl Trace {
    /// Copies and bytes per buffer, direction and reason.
    pub fn summary(&self) -> Summary {
        let mut summary = Summary { dropped: self.dropped, ..Summary::default() };
        for event in &self.events {
            if let EventKind::Transfer { info, .. } = &event.kind {
                let t = summary.rows.entry((info.buffer, info.direction, info.cause.reason)).or_default();
                t.copies += 1;
                t.bytes += info.bytes as u64;
            }
        }
        summary
    }
}
