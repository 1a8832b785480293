//! The transfer guard and the event recorder ([`lazybuf::observe`]) for Python: the functions
//! behind `lazybuf.transfer_guard` (`python/lazybuf/_transfer_guard.py`) and `lazybuf.trace`
//! (`python/lazybuf/trace.py`), the `Trace` class, and [`observed`], which `UnifiedBuffer`'s
//! methods run in so that their copies are attributed to them (explicit or implicit, as the
//! guard's levels say) and, when asked for, carry the Python stack.
//!
//! Copies the guard logs go to Python's `logging` (logger `lazybuf.transfer_guard`, level
//! WARNING). The guard decides while lazybuf's locks are held, often with the GIL released,
//! where `logging` cannot run (a handler may take the GIL, or call lazybuf): the lines wait in a
//! bounded queue ([`LOGGED`]) and are handed to `logging` when the call that made them returns
//! to Python ([`observed`]), when a guard level changes, and at exit.
//!
//! What does not live here: the guard's and recorder's rules (the core), the context managers
//! (Python).

use lazybuf::backend::fork::ForkAwareMutex;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::gil_cell::GilOnceCell;
use lazybuf::observe::guard::{self, GuardLevel, GuardLevels};
use lazybuf::observe::trace::{self, EventKind, TraceOptions};
use lazybuf::observe::{self as core, Cause, Direction};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyModule, PyTuple};

use crate::errors::OrPyErr;

/// Whether events carry the Python stack (`lazybuf.trace.start(python_stack=True)`).
static PYTHON_STACK: AtomicBool = AtomicBool::new(false);

/// Runs `f`, a `UnifiedBuffer` method's body, as `cause`: one atomic load when nothing
/// observes. Copies the guard logged meanwhile go to `logging` when `f` has returned.
///
/// Each observed call is the one the user made: the binding never makes one inside another
/// (a method that does another's work calls its body, as `__array__(copy=True)` calls
/// `to_numpy`'s, so its copies are named `__array__`). So an observed call made while another
/// runs on this thread was made by the user's code, which the running call ran in the middle
/// of its work (NumPy's conversion of a value calling its `__float__`, a DLPack producer's
/// `__dlpack__`, a finalizer): it is a call of its own, and its copies are judged by its own
/// cause ([`core::call_anew`]). (A check that panicked on an observed call made from the
/// Python frame of the running one's caller, the binding's own nesting, ran the whole Python
/// suite without a panic once the four such calls were gone: 2026-11-28.)
pub fn observed<R>(py: Python<'_>, cause: Cause, f: impl FnOnce() -> R) -> R {
    if !core::active() {
        return f();
    }
    let done = if !(core::recording() && PYTHON_STACK.load(Ordering::Relaxed)) {
        // No stack to attach: the thread's events stay as they are (a stack is only ever
        // attached here, for the length of one call).
        core::call_anew(cause, f)
    } else {
        let stack = python_stack(py);
        trace::call_with_stack(stack, || core::call_anew(cause, f))
    };
    hand_logged_to_python(py);
    done
}

/// Runs `f`, the body of a method that makes no copy between memories (nothing for the guard
/// to judge; its events carry its buffer's own call, `copy_from`, or the engine's names) but
/// allocates, frees or changes state (`copy_from`, `fill`, `release`), with the Python stack
/// attached to its events when the recorder was asked for stacks (`python_stack=True`); two
/// loads otherwise.
/// (Without it, such a method's events had no stack: the fifteenth session.)
#[inline]
pub fn with_python_stack<R>(py: Python<'_>, f: impl FnOnce() -> R) -> R {
    if !(core::recording() && PYTHON_STACK.load(Ordering::Relaxed)) {
        return f();
    }
    trace::call_with_stack(python_stack(py), f)
}

/// [`observed`] for a method whose copies and changes are all of its own buffer and that runs
/// no user code while it makes them (`.device`, `mark_device_dirty()`, `to_numpy()`): its body
/// names the buffer's call itself ([`lazybuf::RawBuffer::as_call`], under the buffer's lock),
/// so while no guard level is set and no stack is asked for (the recorder alone, or nothing)
/// it sets nothing on the thread: two loads, no thread-local (in this shared library each
/// thread-local access is a call; the recorder's cost on the seeds' batch, docs/BENCHMARKS.md).
#[inline]
pub fn observed_own<R>(py: Python<'_>, cause: Cause, f: impl FnOnce() -> R) -> R {
    let on_thread = core::guarding() || (core::recording() && PYTHON_STACK.load(Ordering::Relaxed));
    if !on_thread {
        return f();
    }
    observed(py, cause, f)
}

/// Logged lines waiting for the GIL (at most [`LOGGED_MAX`]; [`LOGGED_DROPPED`] counts the
/// rest), and whether there are any (the one load a call pays when there are none).
/// Fork-aware: lines are queued by whichever thread copies, also without the GIL, so a fork
/// can leave the lock held by a parent's thread; such a child drops its lines (counted)
/// instead of waiting forever.
static LOGGED: ForkAwareMutex<VecDeque<String>> = ForkAwareMutex::unwatched(VecDeque::new());
static LOGGED_WAITING: AtomicBool = AtomicBool::new(false);
static LOGGED_DROPPED: AtomicUsize = AtomicUsize::new(0);
const LOGGED_MAX: usize = 10_000;

/// The guard's log hook in this process: queues the line (see the module docs).
fn queue_logged(copy: &core::TransferInfo, level: GuardLevel) {
    let line = guard::log_line(copy, level);
    match LOGGED.lock() {
        Some(mut logged) if logged.len() < LOGGED_MAX => logged.push_back(line),
        _ => {
            LOGGED_DROPPED.fetch_add(1, Ordering::Relaxed);
        }
    }
    LOGGED_WAITING.store(true, Ordering::Release);
}

/// Hands the waiting lines to `logging.getLogger("lazybuf.transfer_guard").warning`, in the
/// order they were logged. Called with the GIL and none of lazybuf's locks held. A handler's
/// exception is reported as unraisable (`sys.unraisablehook`), never raised from the lazybuf
/// call whose copy it logs.
#[inline]
pub fn hand_logged_to_python(py: Python<'_>) {
    // A load first, inline in each observed call: the common case (nothing logged) writes
    // nothing shared and calls nothing.
    if LOGGED_WAITING.load(Ordering::Acquire) {
        hand_waiting_lines(py);
    }
}

/// [`hand_logged_to_python`] when lines may be waiting.
#[cold]
#[inline(never)]
fn hand_waiting_lines(py: Python<'_>) {
    thread_local! {
        /// This thread is handing lines to `logging`: a handler that calls lazybuf does not
        /// hand its own copies' lines from inside (they wait for the next return, so a handler
        /// whose calls always copy cannot log without end).
        static HANDING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    // (A thread whose thread-locals are gone hands nothing: its lines wait for another.)
    if HANDING.try_with(std::cell::Cell::get).unwrap_or(true) || !LOGGED_WAITING.swap(false, Ordering::AcqRel)
    {
        return;
    }
    struct Handing;
    impl Handing {
        fn start() -> Handing {
            let _ = HANDING.try_with(|h| h.set(true));
            Handing
        }
    }
    impl Drop for Handing {
        fn drop(&mut self) {
            let _ = HANDING.try_with(|h| h.set(false));
        }
    }
    let _handing = Handing::start();
    let lines = LOGGED.lock().map(|mut logged| std::mem::take(&mut *logged)).unwrap_or_default();
    let dropped = LOGGED_DROPPED.swap(0, Ordering::Relaxed);
    static LOGGER: GilOnceCell<Py<PyAny>> = GilOnceCell::new();
    let logger = match LOGGER.get_or_try_init(py, || {
        Ok::<_, PyErr>(py.import("logging")?.call_method1("getLogger", ("lazybuf.transfer_guard",))?.unbind())
    }) {
        Ok(logger) => logger.bind(py),
        Err(err) => return err.write_unraisable(py, None),
    };
    let warn = |line: String| {
        if let Err(err) = logger.call_method1("warning", ("%s", line)) {
            err.write_unraisable(py, Some(logger));
        }
    };
    lines.into_iter().for_each(warn);
    if dropped > 0 {
        warn(format!(
            "lazybuf transfer guard: {dropped} more logged copies were dropped (more than {LOGGED_MAX} waited \
             for Python)"
        ));
    }
}

/// Hands the copies logged so far to `logging` (at exit: `lazybuf._transfer_guard`).
#[pyfunction]
pub fn _transfer_guard_flush_log(py: Python<'_>) {
    hand_logged_to_python(py);
}

fn python_stack(py: Python<'_>) -> Option<Arc<str>> {
    formatted_stack(py).or_else(|| stack_without_source(py))
}

/// `traceback.format_stack()`'s text (with each frame's source line).
fn formatted_stack(py: Python<'_>) -> Option<Arc<str>> {
    let frames = py.import("traceback").ok()?.call_method0("format_stack").ok()?;
    // Lossily: a frame of a file whose name is not UTF-8 (a lone surrogate in the str) lost
    // the event its whole stack (the twentieth hostile pass).
    let mut stack = String::new();
    for frame in frames.try_iter().ok()? {
        stack.push_str(&frame.ok()?.cast::<pyo3::types::PyString>().ok()?.to_string_lossy());
    }
    Some(stack.into())
}

/// The stack as `traceback.format_stack()` writes it, without the source lines, from the
/// frames themselves: where that function raises (looking up the source of a file whose name
/// the file system's encoding cannot take, a lone `\ud800`), the event kept no stack at all
/// (the twenty-second hostile pass). Names are converted lossily.
fn stack_without_source(py: Python<'_>) -> Option<Arc<str>> {
    let lossy = |value: Bound<'_, PyAny>| -> Option<String> {
        Some(value.cast::<pyo3::types::PyString>().ok()?.to_string_lossy().into_owned())
    };
    let mut frames = Vec::new();
    let mut frame = py.import("sys").ok()?.call_method1("_getframe", (0,)).ok();
    while let Some(f) = frame.filter(|f| !f.is_none()) {
        let code = f.getattr("f_code").ok()?;
        let file = lossy(code.getattr("co_filename").ok()?)?;
        let name = lossy(code.getattr("co_name").ok()?)?;
        let line = f.getattr("f_lineno").ok()?;
        frames.push(format!("  File \"{file}\", line {line}, in {name}\n"));
        frame = f.getattr("f_back").ok();
    }
    frames.reverse();
    Some(frames.concat().into())
}

fn level(name: Option<&str>, what: &'static str) -> PyResult<Option<GuardLevel>> {
    name.map(|n| GuardLevel::parse(n, what)).transpose().or_py()
}

fn levels(h2d: Option<&str>, d2h: Option<&str>, d2d: Option<&str>) -> PyResult<GuardLevels> {
    Ok(GuardLevels([
        level(h2d, "transfer_guard: h2d")?,
        level(d2h, "transfer_guard: d2h")?,
        level(d2d, "transfer_guard: d2d")?,
    ]))
}

type Names = (Option<&'static str>, Option<&'static str>, Option<&'static str>);

fn names(levels: GuardLevels) -> Names {
    let name = |d| levels.get(d).map(GuardLevel::name);
    (name(Direction::HostToDevice), name(Direction::DeviceToHost), name(Direction::DeviceToDevice))
}

/// Sets this thread's guard levels (`None`: the process-wide level applies) and returns the
/// previous ones; `ValueError` for a name that is not a level.
#[pyfunction]
#[pyo3(signature = (h2d, d2h, d2d))]
pub fn _transfer_guard_set_thread(
    py: Python<'_>,
    h2d: Option<&str>,
    d2h: Option<&str>,
    d2d: Option<&str>,
) -> PyResult<Names> {
    let new = levels(h2d, d2h, d2d)?;
    // The lines logged under the levels being left go out before they change.
    hand_logged_to_python(py);
    Ok(names(guard::set_thread(new)))
}

/// This thread's own guard levels.
#[pyfunction]
pub fn _transfer_guard_thread() -> Names {
    names(guard::thread())
}

/// Sets the process-wide level of the directions given (`None`: unchanged).
#[pyfunction]
#[pyo3(signature = (h2d, d2h, d2d))]
pub fn _transfer_guard_set_global(
    py: Python<'_>,
    h2d: Option<&str>,
    d2h: Option<&str>,
    d2d: Option<&str>,
) -> PyResult<()> {
    let new = levels(h2d, d2h, d2d)?;
    hand_logged_to_python(py);
    guard::set_global(new).or_py()
}

/// The process-wide levels; `ValueError` when `LAZYBUF_TRANSFER_GUARD` is malformed.
#[pyfunction]
pub fn _transfer_guard_global() -> PyResult<Names> {
    guard::global().map(names).or_py()
}

/// `lazybuf.transfer_guard(...)` and its per-direction spellings: a context manager whose
/// `__enter__` sets this thread's levels for the directions given (the others keep this
/// thread's own) and whose `__exit__` restores the levels it found. Native, so that the setting
/// and the restoring are each one call that no Python code interrupts: a generator-based
/// context manager (`contextlib`) ran bytecode between setting the levels and entering its
/// `try`, and between its `finally` and the restoring call, so a signal's exception
/// (`KeyboardInterrupt`) delivered there left the thread's levels set for good (the
/// seventeenth hostile pass). Reusable and re-entrant, also by several threads at once (one
/// object kept in a module and entered by each): each exit leaves, on its thread, that
/// thread's innermost entry ([`guard::scope`] says what leaving out of order does). An exit on
/// a thread that has no entry of its own (a generator holding the block, finalised or resumed
/// on another thread) leaves the latest entry, on the thread that entered it: before the
/// nineteenth hostile pass it left nothing, and the block's levels stayed on that thread for
/// good.
#[pyclass(name = "_GuardScope", module = "lazybuf", frozen, subclass)]
pub struct GuardScope {
    levels: GuardLevels,
    /// Each entry's scope, with its thread, innermost last.
    entries: std::sync::Mutex<Vec<(std::thread::ThreadId, guard::ScopeToken)>>,
}

#[pymethods]
impl GuardScope {
    #[new]
    #[pyo3(signature = (h2d, d2h, d2d))]
    fn new(h2d: Option<&str>, d2h: Option<&str>, d2d: Option<&str>) -> PyResult<GuardScope> {
        Ok(GuardScope { levels: levels(h2d, d2h, d2d)?, entries: std::sync::Mutex::default() })
    }

    fn __enter__(&self, py: Python<'_>) {
        // The lines logged under the levels being left go out before they change (a handler's
        // exception is unraisable: nothing here raises once the levels are set).
        hand_logged_to_python(py);
        let token = guard::enter(self.levels);
        let thread = std::thread::current().id();
        self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push((thread, token));
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        let thread = std::thread::current().id();
        let token = {
            let mut entries = self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let innermost = entries.iter().rposition(|(t, _)| *t == thread);
            innermost.or(entries.len().checked_sub(1)).map(|i| entries.remove(i).1)
        };
        if let Some(token) = token {
            hand_logged_to_python(py);
            guard::leave(token);
        }
        false
    }

    fn __repr__(&self) -> String {
        // As Python writes the call: `None`, or the level's name quoted (`Some("log")` was
        // Rust's spelling: the twenty-second hostile pass).
        let (h2d, d2h, d2d) = names(self.levels);
        let py = |level: Option<&str>| level.map_or_else(|| "None".to_owned(), |l| format!("'{l}'"));
        format!("lazybuf.transfer_guard(h2d={}, d2h={}, d2d={})", py(h2d), py(d2h), py(d2d))
    }
}

/// `lazybuf.trace.record()`'s context manager: `__enter__` starts the recorder and returns
/// the `Recording` it was given, `__exit__` stops it and stores the trace there. Native for
/// the reason [`GuardScope`] is (a signal's exception between the start and the `try` of a
/// generator left the recorder running). When the block raised and the recording was stopped
/// inside it already, the block's exception propagates, not `stop()`'s complaint (which hid
/// the user's error behind a `ValueError` of the context manager).
#[pyclass(name = "_TraceRecord", module = "lazybuf", frozen, subclass)]
pub struct TraceRecord {
    capacity: usize,
    python_stack: bool,
    rust_backtrace: bool,
    recording: Py<PyAny>,
    /// The recordings its entries started, with their threads, innermost last: an exit stops
    /// its thread's innermost one only (another thread's, started after the block's was
    /// stopped, runs on); an exit on a thread with no entry of its own (a generator holding
    /// the block, finalised on another thread) the latest one's (before the nineteenth
    /// hostile pass it stopped nothing, and the recorder ran on for good).
    sessions: std::sync::Mutex<Vec<(std::thread::ThreadId, trace::Session)>>,
}

#[pymethods]
impl TraceRecord {
    #[new]
    #[pyo3(signature = (capacity, python_stack, rust_backtrace, recording))]
    fn new(capacity: usize, python_stack: bool, rust_backtrace: bool, recording: Py<PyAny>) -> TraceRecord {
        TraceRecord { capacity, python_stack, rust_backtrace, recording, sessions: Default::default() }
    }

    fn __enter__(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let options = TraceOptions { capacity: self.capacity, rust_backtrace: self.rust_backtrace };
        let session = trace::start_session(options).or_py()?;
        PYTHON_STACK.store(self.python_stack, Ordering::Relaxed);
        let thread = std::thread::current().id();
        self.sessions.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push((thread, session));
        Ok(self.recording.clone_ref(py))
    }

    #[pyo3(signature = (exc_type, _exc_value, _traceback))]
    fn __exit__(
        &self,
        py: Python<'_>,
        exc_type: &Bound<'_, PyAny>,
        _exc_value: &Bound<'_, PyAny>,
        _traceback: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        let thread = std::thread::current().id();
        let session = {
            let mut sessions = self.sessions.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let innermost = sessions.iter().rposition(|(t, _)| *t == thread);
            innermost.or(sessions.len().checked_sub(1)).map(|i| sessions.remove(i).1)
        };
        // (No session: `__exit__` without its `__enter__`; stopping nothing, it says so.)
        let stopped = match session {
            Some(session) => trace::stop_session(session)
                .map(|trace| {
                    PYTHON_STACK.store(false, Ordering::Relaxed);
                    PyTrace { trace }
                })
                .or_py(),
            None => Err(pyo3::exceptions::PyValueError::new_err(
                "trace.record: this block was not entered (no recording of its own to stop)",
            )),
        };
        match stopped {
            Ok(trace) => {
                self.recording.bind(py).setattr("trace", Py::new(py, trace)?)?;
                Ok(false)
            }
            Err(_) if !exc_type.is_none() => Ok(false),
            Err(err) => Err(err),
        }
    }
}

/// Starts the recorder.
#[pyfunction]
#[pyo3(signature = (capacity, python_stack, rust_backtrace))]
pub fn _trace_start(capacity: usize, python_stack: bool, rust_backtrace: bool) -> PyResult<()> {
    trace::start(TraceOptions { capacity, rust_backtrace }).or_py()?;
    PYTHON_STACK.store(python_stack, Ordering::Relaxed);
    Ok(())
}

/// Stops the recorder and returns its events.
#[pyfunction]
pub fn _trace_stop() -> PyResult<PyTrace> {
    let trace = trace::stop().or_py()?;
    PYTHON_STACK.store(false, Ordering::Relaxed);
    Ok(PyTrace { trace })
}

/// The events so far, recording on.
#[pyfunction]
pub fn _trace_snapshot() -> PyResult<PyTrace> {
    trace::snapshot().map(|trace| PyTrace { trace }).or_py()
}

/// Whether the recorder runs.
#[pyfunction]
pub fn _trace_recording() -> bool {
    trace::is_recording()
}

/// Recorded events (`lazybuf.trace.stop()`, `snapshot()`).
#[pyclass(name = "Trace", module = "lazybuf.trace", frozen)]
pub struct PyTrace {
    trace: trace::Trace,
}

#[pymethods]
impl PyTrace {
    /// The number of events kept.
    fn __len__(&self) -> usize {
        self.trace.events.len()
    }

    /// Events dropped because the ring was full.
    #[getter]
    fn dropped(&self) -> u64 {
        self.trace.dropped
    }

    /// The events as Chrome trace-event JSON (ui.perfetto.dev, chrome://tracing).
    fn to_chrome_json(&self, py: Python<'_>) -> String {
        py.detach(|| self.trace.to_chrome_json())
    }

    /// The plain summary: copies and bytes per buffer, direction and reason, as text;
    /// `(no copies recorded)` under the header when the trace has none (as `lazybuf trace
    /// summary` says it).
    fn summary(&self) -> String {
        self.trace.summary().to_string()
    }

    /// The summary as rows `(buffer, direction, reason, copies, bytes)`.
    fn summary_rows(&self) -> Vec<(u64, &'static str, &'static str, u64, u64)> {
        let summary = self.trace.summary();
        summary.rows.iter().map(|((b, d, r), t)| (*b, d.name(), r.name(), t.copies, t.bytes)).collect()
    }

    /// The events as dicts: `kind` (`transfer`, `allocate`, `free`, `pool`, `state`,
    /// `rollback`, `checker_read`),
    /// `time_us`, `thread`, `stack` and the kind's own fields (an allocation's and a free's
    /// `memory`: `device`, `host`, `pinned` or `shared`; `buffer` the buffer's or the memory
    /// object's `buffer_id`).
    fn events<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let list = PyList::empty(py);
        for event in &self.trace.events {
            let d = PyDict::new(py);
            d.set_item("time_us", event.time.as_secs_f64() * 1e6)?;
            d.set_item("thread", event.thread)?;
            d.set_item("stack", event.stack.as_deref())?;
            match &event.kind {
                EventKind::Transfer { info, stream, duration, op } => {
                    d.set_item("kind", "transfer")?;
                    d.set_item("buffer", info.buffer)?;
                    d.set_item("direction", info.direction.name())?;
                    d.set_item("bytes", info.bytes)?;
                    d.set_item("from", &info.from)?;
                    d.set_item("to", &info.to)?;
                    d.set_item("call", info.cause.call)?;
                    d.set_item("reason", info.cause.reason.name())?;
                    d.set_item("stream", stream)?;
                    d.set_item("duration_us", duration.map(|d| d.as_secs_f64() * 1e6))?;
                    d.set_item("op", op)?;
                }
                EventKind::Allocate { buffer, device, kind, bytes, source } => {
                    d.set_item("kind", "allocate")?;
                    d.set_item("buffer", buffer)?;
                    d.set_item("device", device)?;
                    d.set_item("memory", kind.name())?;
                    d.set_item("bytes", bytes)?;
                    d.set_item("source", if *source == trace::Source::Cache { "cache" } else { "upstream" })?;
                }
                EventKind::Free { buffer, device, kind, bytes } => {
                    d.set_item("kind", "free")?;
                    d.set_item("buffer", buffer)?;
                    d.set_item("device", device)?;
                    d.set_item("memory", kind.name())?;
                    d.set_item("bytes", bytes)?;
                }
                EventKind::Pool { hit, device, bytes } => {
                    d.set_item("kind", "pool")?;
                    d.set_item("hit", hit)?;
                    d.set_item("device", device)?;
                    d.set_item("bytes", bytes)?;
                }
                EventKind::State { buffer, from, to, call } => {
                    d.set_item("kind", "state")?;
                    d.set_item("buffer", buffer)?;
                    d.set_item("from", from.to_string())?;
                    d.set_item("to", to.to_string())?;
                    d.set_item("call", call)?;
                }
                EventKind::Rollback { buffer, op, allocations, call } => {
                    d.set_item("kind", "rollback")?;
                    d.set_item("buffer", buffer)?;
                    d.set_item("op", op)?;
                    d.set_item("allocations", allocations)?;
                    d.set_item("call", call)?;
                }
                EventKind::CheckerRead { buffer, device, bytes, duration } => {
                    d.set_item("kind", "checker_read")?;
                    d.set_item("buffer", buffer)?;
                    d.set_item("device", device)?;
                    d.set_item("bytes", bytes)?;
                    d.set_item("duration_us", duration.as_secs_f64() * 1e6)?;
                }
                _ => d.set_item("kind", "other")?,
            }
            list.append(d)?;
        }
        Ok(list)
    }

    fn __repr__(&self) -> String {
        format!("Trace(events={}, dropped={})", self.trace.events.len(), self.trace.dropped)
    }

    /// Pickles as its events' values ([`crate::trace_pickle`]): a worker process returns the
    /// trace it recorded as it is.
    fn __reduce__<'py>(&self, py: Python<'py>) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        let rebuild = py.import("lazybuf._lazybuf")?.getattr("_rebuild_trace")?;
        Ok((rebuild, crate::trace_pickle::encode(py, &self.trace)?))
    }

    /// The trace itself: a `Trace` is never changed once made.
    fn __copy__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    /// The trace itself (see `__copy__`).
    fn __deepcopy__<'py>(slf: Bound<'py, Self>, _memo: &Bound<'py, PyAny>) -> Bound<'py, Self> {
        slf
    }
}

/// Unpickles a `Trace` (`Trace.__reduce__`): checked field by field ([`crate::trace_pickle`]).
#[pyfunction]
pub fn _rebuild_trace(
    version: &Bound<'_, PyAny>,
    events: &Bound<'_, PyAny>,
    dropped: &Bound<'_, PyAny>,
) -> PyResult<PyTrace> {
    let dropped = crate::args::uint64(dropped, "Trace: dropped")?;
    Ok(PyTrace { trace: crate::trace_pickle::decode(version, events, dropped)? })
}

/// Adds this module's functions and classes to the extension module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyTrace>()?;
    m.add_function(wrap_pyfunction!(_rebuild_trace, m)?)?;
    m.add_class::<GuardScope>()?;
    m.add_class::<TraceRecord>()?;
    m.add_function(wrap_pyfunction!(_transfer_guard_set_thread, m)?)?;
    m.add_function(wrap_pyfunction!(_transfer_guard_thread, m)?)?;
    m.add_function(wrap_pyfunction!(_transfer_guard_set_global, m)?)?;
    m.add_function(wrap_pyfunction!(_transfer_guard_global, m)?)?;
    m.add_function(wrap_pyfunction!(_trace_start, m)?)?;
    m.add_function(wrap_pyfunction!(_trace_stop, m)?)?;
    m.add_function(wrap_pyfunction!(_trace_snapshot, m)?)?;
    m.add_function(wrap_pyfunction!(_trace_recording, m)?)?;
    m.add_function(wrap_pyfunction!(_transfer_guard_flush_log, m)?)?;
    // Logged copies go to Python's `logging` (module docs).
    guard::set_log_hook(Some(Arc::new(queue_logged)));
    Ok(())
}
