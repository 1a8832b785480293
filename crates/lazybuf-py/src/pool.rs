//! `lazybuf.MemoryPool` and `get_memory_pool()`: the core's [`lazybuf::MemoryPool`] for Python.
//!
//! A pooled buffer is an ordinary `UnifiedBuffer` whose memory comes from the pool's resource;
//! its memory goes back to the pool when the buffer is released (`pool.release(buf)`,
//! `buf.release()`, or leaving `with pool.acquire(...) as buf:`) and no view of it remains
//! (see [`crate::views`]). Memory is taken at the buffer's first use, as for any buffer, so
//! the pool's hits and misses are counted then. A release that would lose data or misuse a
//! buffer is refused with `ValueError`: a buffer already released, or one from another pool
//! (which is left untouched).
//!
//! PyDotCompute 0.2.0's pool API is here too (docs/MIGRATING.md): `get_memory_pool()` returns
//! the same object on every call for a device (and `MemoryPool()` with no arguments is that
//! object, as PyDotCompute's singleton was); `get_stats()`/`get_pinned_stats()` return
//! `PoolStatistics`; `enable()`/`disable()`/`enabled` are caching by default
//! (`lazybuf.set_caching`), which routes the memory of buffers made without a pool through
//! their device's process-wide pool; `set_limit` caps what a pool holds.
//!
//! What does not live here: caching, size classes, caps and trimming (the core's pool).

use std::sync::{Mutex, PoisonError};

use crate::gil_cell::GilOnceCell;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyTuple};

use lazybuf::{Device, MemoryKind, MemoryPool, PoolConfig, PoolStats, PoolUsage};

use crate::accelerator::{PyDevice, selector};
use crate::buffer::UnifiedBuffer;
use crate::{args, dtype};

/// A pool of buffer memory on one device. Frozen, with no mutable state of its own (the
/// core's pool is internally synchronized): safe to use from any thread.
#[pyclass(name = "MemoryPool", module = "lazybuf", frozen)]
pub(crate) struct PyMemoryPool {
    pool: MemoryPool,
    /// Whether this is a device's process-wide pool (`get_memory_pool()`), where buffers made
    /// without a pool take their memory while caching by default is on.
    shared: bool,
}

/// The one Python object of each device's process-wide pool.
static SHARED: Mutex<Vec<(Device, Py<PyMemoryPool>)>> = Mutex::new(Vec::new());

/// The Python object of `device`'s process-wide pool: the same object on every call. The
/// lock is never held while Python code may run (making or dropping an object).
fn shared_pool(py: Python<'_>, device: Device) -> PyResult<Py<PyMemoryPool>> {
    let find = |all: &[(Device, Py<PyMemoryPool>)]| {
        all.iter().find(|(d, _)| *d == device).map(|(_, pool)| pool.clone_ref(py))
    };
    if let Some(pool) = find(&SHARED.lock().unwrap_or_else(PoisonError::into_inner)) {
        return Ok(pool);
    }
    let made = Py::new(py, PyMemoryPool { pool: MemoryPool::for_device(&device), shared: true })?;
    let (kept, spare) = {
        let mut all = SHARED.lock().unwrap_or_else(PoisonError::into_inner);
        match find(&all) {
            // Another thread made it meanwhile: keep theirs.
            Some(pool) => (pool, Some(made)),
            None => {
                all.push((device, made.clone_ref(py)));
                (made, None)
            }
        }
    };
    drop(spare);
    Ok(kept)
}

/// `PoolStatistics` (python/lazybuf/_pydotcompute.py) of `usage`.
fn pool_statistics<'py>(py: Python<'py>, usage: PoolUsage) -> PyResult<Bound<'py, PyAny>> {
    static CLASS: GilOnceCell<Py<PyAny>> = GilOnceCell::new();
    let class = CLASS.get_or_try_init(py, || {
        py.import("lazybuf._pydotcompute")?.getattr("PoolStatistics").map(Bound::unbind)
    })?;
    let kwargs = PyDict::new(py);
    kwargs.set_item("used_bytes", usage.bytes_in_use)?;
    kwargs.set_item("total_bytes", usage.bytes_in_use + usage.bytes_cached)?;
    kwargs.set_item("n_free_blocks", usage.cached_blocks)?;
    kwargs.set_item("hits", usage.hits)?;
    kwargs.set_item("misses", usage.misses)?;
    class.bind(py).call((), Some(&kwargs))
}

#[pymethods]
impl PyMemoryPool {
    /// A new, private pool on `device` (default: the current device). `max_cached_bytes`
    /// caps what it keeps for reuse (default: the device's default pool cap); `zero_reused`
    /// clears reused memory before handing it out. With no arguments (no device, no option),
    /// the current device's process-wide pool: the object `get_memory_pool()` returns, as
    /// PyDotCompute's `MemoryPool()` returned its one pool.
    #[new]
    #[pyo3(signature = (device=None, *, max_cached_bytes=None, zero_reused=false))]
    fn py_new(
        py: Python<'_>,
        device: Option<&Bound<'_, PyAny>>,
        #[pyo3(from_py_with = crate::args::max_cached_bytes)] max_cached_bytes: Option<u64>,
        zero_reused: bool,
    ) -> PyResult<Py<Self>> {
        let no_arguments = device.is_none_or(|d| d.is_none()) && max_cached_bytes.is_none() && !zero_reused;
        let device = crate::accelerator::device_arg(device)?;
        if no_arguments {
            return shared_pool(py, device);
        }
        let defaults = PoolConfig::for_device(&device);
        let config = PoolConfig {
            max_cached_bytes: max_cached_bytes.unwrap_or(defaults.max_cached_bytes),
            zero_reused,
        };
        Py::new(py, PyMemoryPool { pool: MemoryPool::new(&device, config), shared: false })
    }

    /// An UNINITIALIZED buffer whose memory comes from this pool (reused when a released
    /// buffer's memory fits). Use it as a context manager to release it at the end of a
    /// `with` block.
    #[pyo3(signature = (shape, dtype=None, *, pinned=false))]
    fn acquire<'py>(
        slf: &Bound<'py, Self>,
        shape: &Bound<'py, PyAny>,
        dtype: Option<&Bound<'py, PyAny>>,
        pinned: bool,
    ) -> PyResult<Bound<'py, UnifiedBuffer>> {
        let py = slf.py();
        let dims = args::shape(shape)?;
        let elem = dtype::resolve(py, dtype)?;
        let pool = &slf.get().pool;
        let buffer = UnifiedBuffer::create(
            dims,
            elem,
            pool.device().clone(),
            pinned,
            Some(pool.resource()),
            Some(slf.clone().into_any().unbind()),
        )?;
        Bound::new(py, buffer)
    }

    /// Returns `buffer`'s memory to this pool. Views of it made earlier keep the memory until
    /// they are gone; the buffer can no longer be used. Releasing a buffer twice, or one from
    /// another pool or from none, raises `ValueError`.
    fn release(&self, buffer: &Bound<'_, UnifiedBuffer>) -> PyResult<()> {
        // The buffer is frozen with its own lock: nothing here borrows it, and nothing holds
        // its lock while Python code runs (Released::finish runs after it is released).
        let this = buffer.get();
        let owned = self.pool.owns(&*this.storage()?.lock(buffer.py())?);
        if !owned {
            return Err(PyValueError::new_err(format!(
                "release: expected a buffer acquired from this pool (on {}), got one {}; it was \
                 left as it was",
                selector(self.pool.device()),
                if this.has_pool() { "from another pool" } else { "that came from no pool" }
            )));
        }
        // A concurrent release may have won meanwhile: then this one raises "released".
        crate::observe::with_python_stack(buffer.py(), || this.take()?.finish(buffer.py()))
    }

    /// The pool's counters now.
    fn stats(&self) -> PyPoolStats {
        PyPoolStats { stats: self.pool.stats() }
    }

    /// Frees every cached block; returns the bytes freed. Live buffers keep their memory.
    fn trim(&self) -> u64 {
        self.pool.trim()
    }

    /// `trim()`, then resets the event counters (hits, misses, allocations, OOM retries) and
    /// the peak.
    fn clear(&self) {
        self.pool.clear();
    }

    /// The device whose buffers this pool hands out.
    #[getter]
    fn device(&self) -> PyDevice {
        PyDevice::new(self.pool.device().clone())
    }

    /// The most bytes the pool keeps cached for reuse.
    #[getter]
    fn max_cached_bytes(&self) -> u64 {
        self.pool.config().max_cached_bytes
    }

    /// Whether reused memory is cleared before it is handed out.
    #[getter]
    fn zero_reused(&self) -> bool {
        self.pool.config().zero_reused
    }

    // --- PyDotCompute 0.2.0 names (docs/MIGRATING.md) --------------------------------------

    /// The pool's figures as a `PoolStatistics`: bytes in use, bytes held (in use and cached),
    /// blocks cached, hits and misses, over every kind of memory it holds (device memory and
    /// the host copies of its device's buffers, pinned or not).
    fn get_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        pool_statistics(py, self.pool.usage(|_| true))
    }

    /// As `get_stats()`, for the pinned (page-locked) host memory the pool holds only.
    fn get_pinned_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        pool_statistics(py, self.pool.usage(|kind| kind == MemoryKind::Host { pinned: true }))
    }

    /// Whether buffers made without a pool take their memory from this pool: for a device's
    /// process-wide pool, whether caching by default is on (`lazybuf.caching()`); never for
    /// a private pool.
    #[getter]
    fn enabled(&self) -> bool {
        self.shared && lazybuf::caching()
    }

    /// Makes buffers made from now on without a pool take their memory from their device's
    /// process-wide pool: `lazybuf.set_caching(True)`, for every device. A private pool cannot
    /// take that role: `ValueError`.
    fn enable(&self) -> PyResult<()> {
        if !self.shared {
            return Err(PyValueError::new_err(format!(
                "enable: only a device's process-wide pool (get_memory_pool(), or MemoryPool() \
                 with no arguments) serves buffers made without a pool; this is a private pool on \
                 {}, which serves only its own acquire()",
                selector(self.pool.device())
            )));
        }
        lazybuf::set_caching(true);
        Ok(())
    }

    /// Makes buffers made from now on without a pool allocate directly from their device
    /// (`lazybuf.set_caching(False)`, for every device); buffers made earlier keep their
    /// memory source. Nothing to do for a private pool, which never serves them.
    fn disable(&self) {
        if self.shared {
            lazybuf::set_caching(false);
        }
    }

    /// Frees every cached block (`trim()`); returns the bytes freed. Live buffers keep their
    /// memory.
    fn free_all_blocks(&self, py: Python<'_>) -> u64 {
        py.detach(|| self.pool.trim())
    }

    /// The same as `free_all_blocks()` (PyDotCompute's name for freeing its device blocks;
    /// lazybuf's pool keeps every kind of memory in one cache).
    fn free_all_free(&self, py: Python<'_>) -> u64 {
        py.detach(|| self.pool.trim())
    }

    /// Sets the most MiB the pool may hold, in use and cached together, over every kind of
    /// memory (`None`: no limit). A buffer's first use that would pass it, once the pool has
    /// trimmed its cache, raises `MemoryError`; buffers already holding memory keep it. For a
    /// device's process-wide pool this limits every buffer made without a pool on the device.
    #[pyo3(signature = (size_mb))]
    fn set_limit(&self, size_mb: &Bound<'_, PyAny>) -> PyResult<()> {
        if size_mb.is_none() {
            self.pool.set_limit(None);
            return Ok(());
        }
        let expected = "set_limit: expected a whole number of MiB (0 or more) or None";
        if size_mb.is_instance_of::<PyBool>() {
            return Err(PyTypeError::new_err(format!("{expected}, got the bool {size_mb}")));
        }
        let mb: i128 = size_mb.extract().map_err(|_| {
            let kind = size_mb.get_type().name().map(|n| n.to_string()).unwrap_or_default();
            PyTypeError::new_err(format!(
                "{expected}, got {kind} {}",
                size_mb.repr().map(|r| r.to_string()).unwrap_or_default()
            ))
        })?;
        let bytes = u64::try_from(mb).ok().and_then(|mb| mb.checked_mul(1 << 20)).ok_or_else(|| {
            PyValueError::new_err(format!("{expected} that fits in 64 bits of bytes, got {mb}"))
        })?;
        self.pool.set_limit(Some(bytes));
        Ok(())
    }

    /// The limit `set_limit` set, in bytes, or None.
    #[getter]
    fn limit(&self) -> Option<u64> {
        self.pool.limit()
    }

    fn __repr__(&self) -> String {
        let stats = self.pool.stats();
        format!(
            "<lazybuf.MemoryPool {} enabled={} in_use={} cached={} hits={} misses={}>",
            selector(self.pool.device()),
            if self.enabled() { "True" } else { "False" },
            stats.bytes_in_use,
            stats.bytes_cached,
            stats.hits,
            stats.misses
        )
    }
}

/// A pool's counters (bytes are whole size-class blocks). Compared by value, and pickled as
/// its values (a worker process returns its pool's counters as they are).
#[pyclass(name = "PoolStats", module = "lazybuf", frozen, eq)]
#[derive(PartialEq)]
pub(crate) struct PyPoolStats {
    stats: PoolStats,
}

#[pymethods]
impl PyPoolStats {
    /// Counters with these values, each an int >= 0 (0 when not given), as `pool.stats()`
    /// returns them.
    #[new]
    #[pyo3(signature = (hits=None, misses=None, allocations=None, bytes_in_use=None, bytes_cached=None, peak_bytes_in_use=None, oom_retries=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        hits: Option<&Bound<'_, PyAny>>,
        misses: Option<&Bound<'_, PyAny>>,
        allocations: Option<&Bound<'_, PyAny>>,
        bytes_in_use: Option<&Bound<'_, PyAny>>,
        bytes_cached: Option<&Bound<'_, PyAny>>,
        peak_bytes_in_use: Option<&Bound<'_, PyAny>>,
        oom_retries: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let count = |name: &str, value: Option<&Bound<'_, PyAny>>| {
            value.map_or(Ok(0), |v| crate::args::uint64(v, &format!("PoolStats: {name}")))
        };
        Ok(PyPoolStats {
            stats: PoolStats {
                hits: count("hits", hits)?,
                misses: count("misses", misses)?,
                allocations: count("allocations", allocations)?,
                bytes_in_use: count("bytes_in_use", bytes_in_use)?,
                bytes_cached: count("bytes_cached", bytes_cached)?,
                peak_bytes_in_use: count("peak_bytes_in_use", peak_bytes_in_use)?,
                oom_retries: count("oom_retries", oom_retries)?,
            },
        })
    }

    /// Pickles as the class and its values, in the constructor's order.
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        crate::args::reduce_to_class(slf.as_any(), slf.get().fields().map(|(_, value)| value))
    }

    /// Requests served from the cache.
    #[getter]
    fn hits(&self) -> u64 {
        self.stats.hits
    }

    /// Requests that went to the device's allocator.
    #[getter]
    fn misses(&self) -> u64 {
        self.stats.misses
    }

    /// Blocks allocated for the pool.
    #[getter]
    fn allocations(&self) -> u64 {
        self.stats.allocations
    }

    /// Bytes held by live buffers (and by views of released ones).
    #[getter]
    fn bytes_in_use(&self) -> u64 {
        self.stats.bytes_in_use
    }

    /// Bytes cached for reuse.
    #[getter]
    fn bytes_cached(&self) -> u64 {
        self.stats.bytes_cached
    }

    /// The most bytes in use at once.
    #[getter]
    fn peak_bytes_in_use(&self) -> u64 {
        self.stats.peak_bytes_in_use
    }

    /// Allocations refused for lack of memory, after which the pool trimmed and retried.
    #[getter]
    fn oom_retries(&self) -> u64 {
        self.stats.oom_retries
    }

    fn __repr__(&self) -> String {
        crate::args::fields_repr("PoolStats", &self.fields())
    }
}

impl PyPoolStats {
    /// The counters with their names, in the constructor's order.
    fn fields(&self) -> [(&'static str, u64); 7] {
        let s = &self.stats;
        [
            ("hits", s.hits),
            ("misses", s.misses),
            ("allocations", s.allocations),
            ("bytes_in_use", s.bytes_in_use),
            ("bytes_cached", s.bytes_cached),
            ("peak_bytes_in_use", s.peak_bytes_in_use),
            ("oom_retries", s.oom_retries),
        ]
    }
}

/// The process-wide pool of `device` (default: the current device): the same object on every
/// call for a device.
#[pyfunction]
#[pyo3(signature = (device=None))]
pub(crate) fn get_memory_pool(
    py: Python<'_>,
    device: Option<&Bound<'_, PyAny>>,
) -> PyResult<Py<PyMemoryPool>> {
    shared_pool(py, crate::accelerator::device_arg(device)?)
}

/// Whether buffers made from now on take their memory from their device's caching pool (the
/// default; `LAZYBUF_CACHE=0` in the environment turns it off at start).
#[pyfunction]
pub(crate) fn caching() -> bool {
    lazybuf::caching()
}

/// Turns caching by default on or off for buffers made from now on; buffers keep the memory
/// source they were made with.
#[pyfunction]
pub(crate) fn set_caching(on: bool) {
    lazybuf::set_caching(on)
}

/// Gives every block the default caches hold back to the runtimes (and frees the backends'
/// staging memory); returns the cached bytes freed.
#[pyfunction]
pub(crate) fn trim(py: Python<'_>) -> u64 {
    py.detach(lazybuf::trim)
}
