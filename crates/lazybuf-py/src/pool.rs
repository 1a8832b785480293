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
//! What does not live here: caching, size classes, caps and trimming (the core's pool).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use lazybuf::{MemoryPool, PoolConfig, PoolStats};

use crate::accelerator::{PyDevice, selector};
use crate::buffer::UnifiedBuffer;
use crate::{args, dtype};

/// A pool of buffer memory on one device. Frozen, with no mutable state of its own (the
/// core's pool is internally synchronized): safe to use from any thread.
#[pyclass(name = "MemoryPool", module = "lazybuf", frozen)]
pub struct PyMemoryPool {
    pool: MemoryPool,
}

#[pymethods]
impl PyMemoryPool {
    /// A new, private pool on `device` (default: the current device). `max_cached_bytes`
    /// caps what it keeps for reuse (default: the device's default pool cap); `zero_reused`
    /// clears reused memory before handing it out.
    #[new]
    #[pyo3(signature = (device=None, *, max_cached_bytes=None, zero_reused=false))]
    fn py_new(
        device: Option<&Bound<'_, PyAny>>,
        max_cached_bytes: Option<u64>,
        zero_reused: bool,
    ) -> PyResult<Self> {
        let device = args::device(device)?;
        let defaults = PoolConfig::for_device(&device);
        let config = PoolConfig {
            max_cached_bytes: max_cached_bytes.unwrap_or(defaults.max_cached_bytes),
            zero_reused,
        };
        Ok(PyMemoryPool { pool: MemoryPool::new(&device, config) })
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
        let owned = self.pool.owns(&this.storage()?.lock());
        if !owned {
            return Err(PyValueError::new_err(format!(
                "release: expected a buffer acquired from this pool (on {}), got one {}; it was \
                 left as it was",
                selector(self.pool.device()),
                if this.has_pool() { "from another pool" } else { "that came from no pool" }
            )));
        }
        // A concurrent release may have won meanwhile: then this one raises "released".
        this.take()?.finish(buffer.py())
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

    fn __repr__(&self) -> String {
        let stats = self.pool.stats();
        format!(
            "<lazybuf.MemoryPool {} in_use={} cached={} hits={} misses={}>",
            selector(self.pool.device()),
            stats.bytes_in_use,
            stats.bytes_cached,
            stats.hits,
            stats.misses
        )
    }
}

/// A pool's counters (bytes are whole size-class blocks).
#[pyclass(name = "PoolStats", module = "lazybuf", frozen)]
pub struct PyPoolStats {
    stats: PoolStats,
}

#[pymethods]
impl PyPoolStats {
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
        let s = &self.stats;
        format!(
            "PoolStats(hits={}, misses={}, allocations={}, bytes_in_use={}, bytes_cached={}, \
             peak_bytes_in_use={}, oom_retries={})",
            s.hits,
            s.misses,
            s.allocations,
            s.bytes_in_use,
            s.bytes_cached,
            s.peak_bytes_in_use,
            s.oom_retries
        )
    }
}

/// The process-wide pool of `device` (default: the current device): the same pool on every
/// call.
#[pyfunction]
#[pyo3(signature = (device=None))]
pub fn get_memory_pool(device: Option<&Bound<'_, PyAny>>) -> PyResult<PyMemoryPool> {
    let device = args::device(device)?;
    Ok(PyMemoryPool { pool: MemoryPool::for_device(&device) })
}

/// Whether buffers made from now on take their memory from their device's caching pool (the
/// default; `LAZYBUF_CACHE=0` in the environment turns it off at start).
#[pyfunction]
pub fn caching() -> bool {
    lazybuf::caching()
}

/// Turns caching by default on or off for buffers made from now on; buffers keep the memory
/// source they were made with.
#[pyfunction]
pub fn set_caching(on: bool) {
    lazybuf::set_caching(on)
}

/// Gives every block the default caches hold back to the runtimes (and frees the backends'
/// staging memory); returns the cached bytes freed.
#[pyfunction]
pub fn trim(py: Python<'_>) -> u64 {
    py.detach(lazybuf::trim)
}
