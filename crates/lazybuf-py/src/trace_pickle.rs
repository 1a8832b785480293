//! A recorded `Trace` as plain values and back: what pickling one sends (`Trace.__reduce__`)
//! and what [`crate::observe::_rebuild_trace`] makes of it, so that a worker process returns the trace it
//! recorded as it is.
//!
//! Each event is a tuple `(seq, time_ns, thread, stack, kind, fields)`, `fields` a tuple in the
//! order of the kind's fields ([`encode`]); names stand for enums (`"h2d"`, `"sync"`, `"host"`,
//! `"host_only"`, `"cache"`) and an absent value is `None`. A stream from elsewhere is checked
//! field by field: a bad one raises `ValueError` or `TypeError` naming the event, the field and
//! what was expected, and nothing is made.
//!
//! Call names are `&'static str` in the core's events (the recorder never copies them); names
//! read back are interned here, each distinct text leaked once, at most [`MAX_NAMES`] of them,
//! each at most [`MAX_NAME_BYTES`] long (a trace names a few dozen calls; more is refused, so a
//! hostile stream cannot grow the process without end). They are interned only once the whole
//! stream is accepted: a refused stream adds none (one did, and a process that refused enough
//! of them could no longer read back a trace lazybuf itself had pickled: the twenty-second
//! hostile pass).
//!
//! What does not live here: recording and the other views of a trace (`observe.rs`).

use std::collections::HashSet;
use std::time::Duration;

use lazybuf::BufferState;
use lazybuf::backend::fork::ForkAwareMutex;
use lazybuf::observe::trace::{Event, EventKind, MemoryKind, Source, Trace};
use lazybuf::observe::{Cause, Direction, Reason, TransferInfo};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyTuple, PyTupleMethods};

/// The format's version, the first value of the pickled state.
const VERSION: u32 = 1;

/// The most distinct call names read back in a process ([`intern_calls`]).
const MAX_NAMES: usize = 4096;
/// The longest call name read back, in bytes (lazybuf's own are at most a few dozen).
const MAX_NAME_BYTES: usize = 1024;

const KINDS: [MemoryKind; 4] = [MemoryKind::Host, MemoryKind::Device, MemoryKind::Pinned, MemoryKind::Shared];
const REASONS: [Reason; 3] = [Reason::Access, Reason::Sync, Reason::Eviction];

type Fields<'py> = Bound<'py, PyTuple>;

/// `trace`'s pickled state: `(VERSION, events, dropped)`.
pub(crate) fn encode<'py>(py: Python<'py>, trace: &Trace) -> PyResult<Bound<'py, PyTuple>> {
    let mut events = Vec::with_capacity(trace.events.len());
    for event in &trace.events {
        let (kind, fields): (&str, Fields<'py>) = match &event.kind {
            EventKind::Transfer { info, stream, duration, op } => (
                "transfer",
                (
                    info.buffer,
                    info.direction.name(),
                    info.bytes,
                    &info.from,
                    &info.to,
                    info.cause.call,
                    info.cause.reason.name(),
                    stream,
                    duration.map(|d| d.as_nanos()),
                    op,
                )
                    .into_pyobject(py)?,
            ),
            EventKind::Allocate { buffer, device, kind, bytes, source } => {
                let source = if *source == Source::Cache { "cache" } else { "upstream" };
                ("allocate", (buffer, device, kind.name(), bytes, source).into_pyobject(py)?)
            }
            EventKind::Free { buffer, device, kind, bytes } => {
                ("free", (buffer, device, kind.name(), bytes).into_pyobject(py)?)
            }
            EventKind::Pool { hit, device, bytes } => ("pool", (hit, device, bytes).into_pyobject(py)?),
            EventKind::State { buffer, from, to, call } => {
                ("state", (buffer, from.name(), to.name(), call).into_pyobject(py)?)
            }
            EventKind::Rollback { buffer, op, allocations, call } => {
                ("rollback", (buffer, op, allocations, call).into_pyobject(py)?)
            }
            EventKind::CheckerRead { buffer, device, bytes, duration } => {
                ("checker_read", (buffer, device, bytes, duration.as_nanos()).into_pyobject(py)?)
            }
            other => {
                return Err(PyTypeError::new_err(format!(
                    "cannot pickle a trace event of this kind: {other:?}"
                )));
            }
        };
        let stack = event.stack.as_deref();
        events.push((event.seq, event.time.as_nanos(), event.thread, stack, kind, fields).into_pyobject(py)?);
    }
    (VERSION, PyTuple::new(py, events)?, trace.dropped).into_pyobject(py)
}

/// Unpickles a `Trace` (`Trace.__reduce__`): the trace `events` describe ([`encode`]).
pub(crate) fn decode(version: &Bound<'_, PyAny>, events: &Bound<'_, PyAny>, dropped: u64) -> PyResult<Trace> {
    // (A bool is not a version, as it is no count in the stream.)
    if version.is_instance_of::<pyo3::types::PyBool>() || version.extract::<u32>().ok() != Some(VERSION) {
        return Err(PyValueError::new_err(format!(
            "Trace: cannot unpickle format {}; expected {VERSION} (pickled by another lazybuf version?)",
            crate::args::repr(version)
        )));
    }
    let events = events.cast::<PyTuple>().map_err(|_| {
        PyTypeError::new_err(format!("Trace: events must be a tuple, got {}", crate::args::repr(events)))
    })?;
    let mut out = Vec::with_capacity(events.len());
    let mut calls = Vec::new();
    for (i, event) in events.iter().enumerate() {
        let (event, call) = decode_event(&event).map_err(|e| in_event(events.py(), e, i))?;
        if let Some(call) = call {
            calls.push((i, call));
        }
        out.push(event);
    }
    // The whole stream is accepted: now its call names (the events hold a placeholder).
    let interned = intern_calls(calls.iter().map(|(_, call)| call.as_str()))?;
    for ((i, _), call) in calls.iter().zip(interned) {
        set_call(&mut out[*i], call);
    }
    Ok(Trace { events: out, dropped })
}

/// `err` with the event's position in front of its message.
fn in_event(py: Python<'_>, err: PyErr, index: usize) -> PyErr {
    let message = format!("Trace: event {index}: {}", err.value(py));
    let placed = if err.is_instance_of::<PyTypeError>(py) {
        PyTypeError::new_err(message)
    } else {
        PyValueError::new_err(message)
    };
    // Its cause stays (a value's own error, an `__index__` that raised).
    placed.set_cause(py, err.cause(py));
    placed
}

/// A tuple of exactly `len` values, described as `what`.
fn tuple_of<'py>(value: &Bound<'py, PyAny>, len: usize, what: &str) -> PyResult<Bound<'py, PyTuple>> {
    match value.cast::<PyTuple>() {
        Ok(t) if t.len() == len => Ok(t.clone()),
        _ => Err(PyTypeError::new_err(format!(
            "{what} must be a tuple of {len} values, got {}",
            crate::args::repr(value)
        ))),
    }
}

/// Field `index` of `fields`, named `name`, as a `T`.
fn field<'py, T: FromPyObjectOwned<'py>>(
    fields: &Bound<'py, PyTuple>,
    index: usize,
    name: &str,
) -> PyResult<T> {
    let value = fields.get_item(index)?;
    let refused = || {
        PyTypeError::new_err(format!("{name} must be {}, got {}", expected::<T>(), crate::args::repr(&value)))
    };
    // A bool is an int to Python, not a count (refused as elsewhere: `PoolStats`, a
    // recording's capacity).
    if value.is_instance_of::<pyo3::types::PyBool>() && expected::<T>() != expected::<bool>() {
        return Err(refused());
    }
    value.extract::<T>().map_err(|err| {
        // The value's own failure (an `__index__` that raised) stays the cause.
        let refused = refused();
        refused.set_cause(fields.py(), Some(err.into()));
        refused
    })
}

/// What a field of type `T` holds, in Python's words.
fn expected<T>() -> &'static str {
    match std::any::type_name::<T>() {
        "u32" | "u64" | "u128" | "usize" => "an int >= 0 in range",
        "bool" => "a bool",
        "alloc::string::String" => "a str of text UTF-8 can encode",
        "core::option::Option<alloc::string::String>" => "a str of text UTF-8 can encode, or None",
        "core::option::Option<u64>" => "an int >= 0 or None",
        _ => "a value of another type",
    }
}

/// The value of `options` whose name is field `index` (`name`).
fn named<T: Copy>(
    fields: &Bound<'_, PyTuple>,
    index: usize,
    name: &str,
    options: &[T],
    name_of: impl Fn(T) -> &'static str,
) -> PyResult<T> {
    let text: String = field(fields, index, name)?;
    options.iter().copied().find(|o| name_of(*o) == text).ok_or_else(|| {
        let known: Vec<&str> = options.iter().map(|o| name_of(*o)).collect();
        PyValueError::new_err(format!("{name} must be one of {known:?}, got {}", crate::args::quoted(&text)))
    })
}

fn nanos(fields: &Bound<'_, PyTuple>, index: usize, name: &str) -> PyResult<Duration> {
    let ns: u128 = field(fields, index, name)?;
    let secs = u64::try_from(ns / 1_000_000_000)
        .map_err(|_| PyValueError::new_err(format!("{name} is too large: {ns} ns")))?;
    Ok(Duration::new(secs, (ns % 1_000_000_000) as u32))
}

/// Field `index`, a call name (checked, not interned yet: [`decode`] interns the stream's names
/// once it is accepted).
fn call_name(fields: &Bound<'_, PyTuple>, index: usize, call: &mut Option<String>) -> PyResult<&'static str> {
    let name: String = field(fields, index, "call")?;
    if name.len() > MAX_NAME_BYTES {
        return Err(PyValueError::new_err(format!(
            "call must be a name of at most {MAX_NAME_BYTES} bytes, got one of {} bytes",
            name.len()
        )));
    }
    *call = Some(name);
    Ok("")
}

/// `event`'s call name: `call` ([`decode`]'s placeholder replaced).
fn set_call(event: &mut Event, call: &'static str) {
    match &mut event.kind {
        EventKind::Transfer { info, .. } => info.cause.call = call,
        EventKind::State { call: name, .. } | EventKind::Rollback { call: name, .. } => *name = call,
        _ => {}
    }
}

/// An event and its call name, if its kind has one (its `call` field a placeholder until
/// [`decode`] interns the name).
fn decode_event(event: &Bound<'_, PyAny>) -> PyResult<(Event, Option<String>)> {
    let event = tuple_of(event, 6, "an event")?;
    let seq: u64 = field(&event, 0, "seq")?;
    let time = nanos(&event, 1, "time_ns")?;
    let thread: u64 = field(&event, 2, "thread")?;
    let stack: Option<String> = field(&event, 3, "stack")?;
    let kind: String = field(&event, 4, "kind")?;
    let fields = event.get_item(5)?;
    let mut call = None;
    let kind = match kind.as_str() {
        "transfer" => {
            let f = tuple_of(&fields, 10, "a transfer's fields")?;
            let info = TransferInfo {
                buffer: field(&f, 0, "buffer")?,
                direction: named(&f, 1, "direction", &Direction::ALL, Direction::name)?,
                bytes: field(&f, 2, "bytes")?,
                from: field(&f, 3, "from")?,
                to: field(&f, 4, "to")?,
                cause: Cause {
                    call: call_name(&f, 5, &mut call)?,
                    reason: named(&f, 6, "reason", &REASONS, Reason::name)?,
                },
            };
            let duration = if f.get_item(8)?.is_none() { None } else { Some(nanos(&f, 8, "duration_ns")?) };
            EventKind::Transfer { info, stream: field(&f, 7, "stream")?, duration, op: field(&f, 9, "op")? }
        }
        "allocate" => {
            let f = tuple_of(&fields, 5, "an allocation's fields")?;
            EventKind::Allocate {
                buffer: field(&f, 0, "buffer")?,
                device: field(&f, 1, "device")?,
                kind: named(&f, 2, "memory", &KINDS, MemoryKind::name)?,
                bytes: field(&f, 3, "bytes")?,
                source: named(&f, 4, "source", &[Source::Cache, Source::Upstream], |s| {
                    if s == Source::Cache { "cache" } else { "upstream" }
                })?,
            }
        }
        "free" => {
            let f = tuple_of(&fields, 4, "a free's fields")?;
            EventKind::Free {
                buffer: field(&f, 0, "buffer")?,
                device: field(&f, 1, "device")?,
                kind: named(&f, 2, "memory", &KINDS, MemoryKind::name)?,
                bytes: field(&f, 3, "bytes")?,
            }
        }
        "pool" => {
            let f = tuple_of(&fields, 3, "a pool lookup's fields")?;
            EventKind::Pool {
                hit: field(&f, 0, "hit")?,
                device: field(&f, 1, "device")?,
                bytes: field(&f, 2, "bytes")?,
            }
        }
        "state" => {
            let f = tuple_of(&fields, 4, "a state transition's fields")?;
            EventKind::State {
                buffer: field(&f, 0, "buffer")?,
                from: named(&f, 1, "from", &BufferState::ALL, BufferState::name)?,
                to: named(&f, 2, "to", &BufferState::ALL, BufferState::name)?,
                call: call_name(&f, 3, &mut call)?,
            }
        }
        "rollback" => {
            let f = tuple_of(&fields, 4, "a rollback's fields")?;
            EventKind::Rollback {
                buffer: field(&f, 0, "buffer")?,
                op: field(&f, 1, "op")?,
                allocations: field(&f, 2, "allocations")?,
                call: call_name(&f, 3, &mut call)?,
            }
        }
        "checker_read" => {
            let f = tuple_of(&fields, 4, "a checker read's fields")?;
            EventKind::CheckerRead {
                buffer: field(&f, 0, "buffer")?,
                device: field(&f, 1, "device")?,
                bytes: field(&f, 2, "bytes")?,
                duration: nanos(&f, 3, "duration_ns")?,
            }
        }
        other => {
            return Err(PyValueError::new_err(format!(
                "kind must be one of transfer, allocate, free, pool, state, rollback, checker_read; got {}",
                crate::args::quoted(other)
            )));
        }
    };
    Ok((Event { seq, time, thread, kind, stack: stack.map(Into::into) }, call))
}

/// `names` as `&'static str`s, in order: each the one interned for the same text, else a new
/// one (leaked once). At most [`MAX_NAMES`] distinct names in a process: when `names` would
/// take more, `ValueError` and none is interned.
fn intern_calls<'a>(names: impl Iterator<Item = &'a str> + Clone) -> PyResult<Vec<&'static str>> {
    // Fork-aware: a thread of a parent process may have held it at the fork (reading a trace
    // back), and a child must not wait for it.
    static NAMES: ForkAwareMutex<Option<HashSet<&'static str>>> = ForkAwareMutex::unwatched(None);
    let Some(mut known) = NAMES.lock() else {
        return Err(PyRuntimeError::new_err(
            "Trace: cannot read call names back in this forked child (a thread of the parent was \
             reading a trace back when it forked)",
        ));
    };
    let known = known.get_or_insert_with(HashSet::new);
    let new: HashSet<&str> = names.clone().filter(|name| !known.contains(name)).collect();
    if known.len() + new.len() > MAX_NAMES {
        let first = new.iter().next().copied().unwrap_or_default();
        return Err(PyValueError::new_err(format!(
            "Trace: call {first:?}: more than {MAX_NAMES} distinct call names read back in this process"
        )));
    }
    Ok(names
        .map(|name| match known.get(name) {
            Some(&interned) => interned,
            None => {
                let leaked: &'static str = String::leak(name.to_owned());
                known.insert(leaked);
                leaked
            }
        })
        .collect())
}
