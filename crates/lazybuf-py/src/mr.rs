//! `lazybuf.mr`: memory resources in Python, as RMM's `rmm.mr` has them, over the core's
//! resources ([`lazybuf::resource`]).
//!
//! - sources: `DirectMemoryResource()` (the runtimes themselves) and
//!   `PoolMemoryResource(upstream_mr=None, *, maximum_pool_size=None, max_cached_bytes=None)`
//!   (lazybuf's caching pool; `maximum_pool_size` caps what it holds, in use and cached, by a
//!   limit below it);
//! - adaptors, each one concern over an upstream it keeps alive: `LimitingResourceAdaptor`,
//!   `StatisticsResourceAdaptor` (a stack of counters, `Statistics`), `TrackingResourceAdaptor`
//!   (outstanding allocations, for leak hunting), `FailureCallbackResourceAdaptor` (a Python
//!   callback decides whether to retry an allocation that ran out of memory; an exception it
//!   raises propagates to the caller that allocated);
//! - `get_current_device_resource(device=None)` / `set_current_device_resource(mr,
//!   device=None)`: the resource buffers, memory objects and device buffers on a device take
//!   their memory from when given none (`UnifiedBuffer` included).
//!
//! Every resource also has RMM's raw `allocate(nbytes)` (device memory; returns its handle as
//! an int) and `deallocate(ptr, nbytes)`. Resources are device-independent: one resource can
//! serve several devices. A raw allocation is a memory object of device memory inside: the
//! event recorder (`lazybuf.trace`) records `allocate` and `deallocate` as its allocation and
//! free, with an id of their own.
//!
//! **Raw allocations live until `deallocate`.** They are kept in one process-wide registry,
//! by resource and handle, that also keeps the core resource they came from alive: an
//! allocation is never freed under its user, not even when the Python resource object it came
//! from is collected (then nothing can give it back, and it lives until the process ends, as
//! an RMM allocation that is never deallocated does). `deallocate` must be called on the
//! resource that allocated (the same object, or another object over the same core resource,
//! such as what `get_current_device_resource()` returns on each call).
//!
//! **One default resource object per device.** With no resource set,
//! `get_current_device_resource(device)` returns the same Python object on every call (a
//! `PoolMemoryResource` over the device's default pool, or `DirectMemoryResource` while
//! caching is off), as RMM does.
//!
//! **Nesting is limited** to [`MAX_DEPTH`] resources (an adaptor over an adaptor over ...):
//! each level is one stack frame in every allocation, so an adaptor deeper than that is
//! refused with `ValueError` when it is made, before a deep chain could exhaust the stack.
//!
//! A failure callback runs with the GIL taken back, from inside the allocation; it must not
//! use the object whose allocation failed.
//!
//! What does not live here: the policies themselves (the core's resources).

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use pyo3::exceptions::{PyIndexError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple};

use lazybuf::resource::{FailureCallback, default_pool, default_resource};
use lazybuf::{
    AllocationOptions, CachingResource, CallbackPayload, DeviceId, DirectResource, FailureCallbackResource,
    LimitingResource, Memory, MemoryKind, MemoryResource, PoolConfig, Statistics, StatisticsResource,
    TrackingResource,
};

use crate::args;
use crate::errors::OrPyErr;

/// The most resources a chain may have (a source counts as 1, each adaptor or pool over it
/// adds 1); see the module docs.
pub(crate) const MAX_DEPTH: usize = 256;

/// A memory resource (the base class of every resource in `lazybuf.mr`).
#[pyclass(name = "MemoryResource", module = "lazybuf.mr", subclass, frozen)]
pub(crate) struct PyResource {
    resource: Arc<dyn MemoryResource>,
    upstream: Option<Py<PyAny>>,
    /// The number of resources in the chain down to the source (1 for a source).
    depth: usize,
}

impl PyResource {
    fn new(resource: Arc<dyn MemoryResource>, upstream: Option<Upstream>) -> Self {
        match upstream {
            Some(up) => PyResource { resource, upstream: Some(up.object), depth: up.depth + 1 },
            None => PyResource { resource, upstream: None, depth: 1 },
        }
    }
}

/// A raw allocation handed out by `allocate`, until `deallocate` (see the module docs).
struct RawAllocation {
    /// The memory (a memory object of device memory, which holds the resource it came from
    /// alive and gives its block back when dropped: the recorder sees both as a memory
    /// object's allocation and free).
    memory: Memory,
    /// The size `allocate` was asked for (the block may be larger: a pool rounds up);
    /// `deallocate` must be given this size, as RMM's resources must.
    nbytes: usize,
}

/// The outstanding raw allocations, by the identity of their core resource and their handle.
type Registry = HashMap<(usize, usize), RawAllocation>;

fn registry() -> MutexGuard<'static, Registry> {
    static RAW: OnceLock<Mutex<Registry>> = OnceLock::new();
    RAW.get_or_init(Mutex::default).lock().unwrap_or_else(PoisonError::into_inner)
}

/// The identity of a core resource (its address, stable while it lives; a registered
/// allocation keeps its resource alive).
fn identity(resource: &Arc<dyn MemoryResource>) -> usize {
    Arc::as_ptr(resource).cast::<()>() as usize
}

/// The handle of `memory` as an int (its address, device pointer or `cl_mem`).
fn handle(memory: &Memory) -> usize {
    // SAFETY: the memory is live (borrowed here) and its device's; the handle is only turned
    // into an int.
    unsafe { memory.device().native_handle(memory.raw()) }
}

#[pymethods]
impl PyResource {
    /// The resource this one forwards to (`None` for sources).
    fn get_upstream(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.upstream.as_ref().map(|u| u.clone_ref(py))
    }

    /// `nbytes` of device memory on `device` (default: the current device), outside any
    /// buffer; returns its handle as an int (the `CUdeviceptr`, the `cl_mem`, the `VkBuffer`,
    /// the address on the host device). It lives until `deallocate` gives it back (see the
    /// module docs). `TypeError` on a device whose memory has no handle (wgpu on Metal or
    /// DirectX 12), allocating nothing.
    #[pyo3(signature = (nbytes, *, device=None))]
    fn allocate(
        &self,
        py: Python<'_>,
        nbytes: &Bound<'_, PyAny>,
        device: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<usize> {
        let nbytes = args::size(nbytes, "nbytes")?;
        if nbytes == 0 {
            return Err(PyValueError::new_err(
                "allocate: nbytes must be positive (an empty block has no handle)",
            ));
        }
        let device = crate::accelerator::device_arg(device)?;
        let options = AllocationOptions { resource: Some(self.resource.clone()), alignment: 0 };
        let memory =
            py.detach(|| Memory::with_options(&device, MemoryKind::Device, nbytes, options)).or_py()?;
        let key = handle(&memory);
        let on = crate::accelerator::selector(&device);
        let refusal = if key == 0 {
            // Every allocation would return 0, and `deallocate(0, n)` could not tell them
            // apart: a second `allocate` freed the first, whose handle its caller still used
            // (the registry replaced it).
            format!(
                "allocate: the memory of {on} has no handle to return (wgpu exposes none on Metal \
                 and DirectX 12); expected a device whose memory has one (CUDA, OpenCL, Vulkan, \
                 the host), or use lazybuf.MemoryDevice, which needs none"
            )
        } else {
            let mut registry = registry();
            match registry.entry((identity(&self.resource), key)) {
                Entry::Vacant(slot) => {
                    slot.insert(RawAllocation { memory, nbytes });
                    return Ok(key);
                }
                Entry::Occupied(_) => format!(
                    "allocate: the memory of {on} returned handle {key:#x}, which a live \
                     allocation of this resource has already; expected a handle of its own"
                ),
            }
        };
        // Given back, unused: the caller gets no handle for it.
        py.detach(|| drop(memory));
        Err(PyTypeError::new_err(refusal))
    }

    /// Gives back what `allocate` returned (`ValueError` for a handle this resource did not
    /// return, or returned and got back, and for an `nbytes` other than the size allocated:
    /// the block is kept then).
    fn deallocate(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = ptr_arg)] ptr: usize,
        #[pyo3(from_py_with = nbytes_arg)] nbytes: usize,
    ) -> PyResult<()> {
        let key = (identity(&self.resource), ptr);
        let raw = {
            let mut registry = registry();
            let Some(raw) = registry.get(&key) else {
                return Err(PyValueError::new_err(format!(
                    "deallocate: {ptr:#x} was not allocated by this resource (or was given back)"
                )));
            };
            if nbytes != raw.nbytes {
                return Err(PyValueError::new_err(format!(
                    "deallocate: {ptr:#x} was allocated with nbytes={}, not {nbytes} (pass the size \
                     given to allocate)",
                    raw.nbytes
                )));
            }
            registry.remove(&key)
        };
        if let Some(RawAllocation { memory, .. }) = raw {
            // Given back to its resource after the work enqueued on the device's stream so far.
            py.detach(|| drop(memory));
        }
        Ok(())
    }

    fn __repr__(&self) -> String {
        format!("<lazybuf.mr resource {:?}>", self.resource)
    }
}

/// The core resource of a Python resource object.
fn resource_of(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Arc<dyn MemoryResource>> {
    obj.cast::<PyResource>().map(|r| r.get().resource.clone()).map_err(|_| {
        PyTypeError::new_err(format!("{what} must be a lazybuf.mr memory resource, got {}", args::repr(obj)))
    })
}

/// An optional `mr=` argument: `None` for the default.
pub(crate) fn resource_arg(mr: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Arc<dyn MemoryResource>>> {
    mr.filter(|m| !m.is_none()).map(|m| resource_of(m, "mr")).transpose()
}

/// The Python upstream of an adaptor: kept alive with it, and counted in its depth.
struct Upstream {
    object: Py<PyAny>,
    depth: usize,
}

fn upstream(upstream_mr: &Bound<'_, PyAny>) -> PyResult<(Arc<dyn MemoryResource>, Upstream)> {
    if upstream_mr.is_none() {
        return Err(PyTypeError::new_err("upstream_mr must be a lazybuf.mr memory resource, not None"));
    }
    let resource = upstream_mr.cast::<PyResource>().map(|r| r.get()).map_err(|_| {
        PyTypeError::new_err(format!(
            "upstream_mr must be a lazybuf.mr memory resource, got {}",
            args::repr(upstream_mr)
        ))
    })?;
    if resource.depth >= MAX_DEPTH {
        return Err(PyValueError::new_err(format!(
            "upstream_mr is a chain of {} resources already; expected at most {} in a chain with the new \
             adaptor (lazybuf limits nesting so that an allocation cannot exhaust the stack)",
            resource.depth, MAX_DEPTH
        )));
    }
    let keep = Upstream { object: upstream_mr.clone().unbind(), depth: resource.depth };
    Ok((resource.resource.clone(), keep))
}

/// The runtimes themselves: every allocation is the runtime's, every free frees.
#[pyclass(name = "DirectMemoryResource", module = "lazybuf.mr", extends = PyResource, frozen)]
pub(crate) struct PyDirect;

#[pymethods]
impl PyDirect {
    #[new]
    fn py_new() -> PyClassInitializer<Self> {
        PyClassInitializer::from(PyResource::new(DirectResource::shared(), None)).add_subclass(PyDirect)
    }
}

/// lazybuf's caching pool (size classes, reuse by kind and device, trim and retry on
/// out-of-memory) over `upstream_mr` (default: the runtimes).
#[pyclass(name = "PoolMemoryResource", module = "lazybuf.mr", extends = PyResource, frozen)]
pub(crate) struct PyPool {
    pool: Arc<CachingResource>,
    limit: Option<Arc<LimitingResource>>,
}

#[pymethods]
impl PyPool {
    /// `maximum_pool_size` caps the bytes the pool holds (in use and cached) with a limit
    /// below it (`MemoryError` beyond); `max_cached_bytes` caps what it keeps for reuse
    /// (default 1 GiB).
    #[new]
    #[pyo3(signature = (upstream_mr=None, *, maximum_pool_size=None, max_cached_bytes=None))]
    fn py_new(
        upstream_mr: Option<&Bound<'_, PyAny>>,
        #[pyo3(from_py_with = maximum_pool_size_arg)] maximum_pool_size: Option<u64>,
        #[pyo3(from_py_with = args::max_cached_bytes)] max_cached_bytes: Option<u64>,
    ) -> PyResult<PyClassInitializer<Self>> {
        let (mut below, keep) = match upstream_mr.filter(|u| !u.is_none()) {
            Some(u) => {
                let (r, keep) = upstream(u)?;
                (r, Some(keep))
            }
            None => (DirectResource::shared(), None),
        };
        let limit = maximum_pool_size.map(|max| Arc::new(LimitingResource::new(below.clone(), max)));
        if let Some(limit) = &limit {
            below = limit.clone();
        }
        let config = PoolConfig {
            max_cached_bytes: max_cached_bytes.unwrap_or(lazybuf::resource::DEFAULT_MAX_CACHED_BYTES),
            zero_reused: false,
        };
        let pool = Arc::new(CachingResource::new(below, config, "lazybuf.mr.PoolMemoryResource".into()));
        // Its cached blocks count against device budgets: spilling trims it (whole: it serves
        // any device) before it evicts a copy, as it trims every MemoryPool.
        lazybuf::pool::register_cache(&pool, None);
        Ok(PyClassInitializer::from(PyResource::new(pool.clone(), keep)).add_subclass(PyPool { pool, limit }))
    }

    /// The bytes the pool holds: in use and cached.
    fn pool_size(&self) -> u64 {
        let stats = self.pool.stats();
        stats.bytes_in_use + stats.bytes_cached
    }

    /// The bytes cached for reuse.
    fn cached_bytes(&self) -> u64 {
        self.pool.stats().bytes_cached
    }

    /// The cap given as `maximum_pool_size`, or `None`.
    fn maximum_pool_size(&self) -> Option<u64> {
        self.limit.as_ref().map(|l| l.limit())
    }

    /// Frees every cached block; returns the bytes freed.
    fn trim(&self, py: Python<'_>) -> u64 {
        py.detach(|| self.pool.trim())
    }
}

/// Refuses allocations beyond `allocation_limit` bytes outstanding (`MemoryError`).
#[pyclass(name = "LimitingResourceAdaptor", module = "lazybuf.mr", extends = PyResource, frozen)]
pub(crate) struct PyLimiting {
    limit: Arc<LimitingResource>,
}

#[pymethods]
impl PyLimiting {
    #[new]
    fn py_new(
        upstream_mr: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = allocation_limit_arg)] allocation_limit: u64,
    ) -> PyResult<PyClassInitializer<Self>> {
        let (upstream, keep) = upstream(upstream_mr)?;
        let limit = Arc::new(LimitingResource::new(upstream, allocation_limit));
        Ok(PyClassInitializer::from(PyResource::new(limit.clone(), Some(keep)))
            .add_subclass(PyLimiting { limit }))
    }

    /// The bytes outstanding through this adaptor (whole blocks).
    fn get_allocated_bytes(&self) -> u64 {
        self.limit.held()
    }

    /// The limit.
    fn get_allocation_limit(&self) -> u64 {
        self.limit.limit()
    }
}

/// One level of a statistics adaptor's counters (RMM's `rmm.statistics.Statistics`). Compared
/// by value, and pickled as its values (a worker process returns its counters as they are).
#[pyclass(name = "Statistics", module = "lazybuf.mr", frozen, eq)]
#[derive(PartialEq)]
pub(crate) struct PyStatistics {
    stats: Statistics,
}

#[pymethods]
impl PyStatistics {
    /// Counters with these values, each an int from -2**63 to 2**63 - 1 (0 when not given; a
    /// level's current counts are negative when it freed older memory), as RMM's dataclass
    /// takes them.
    #[new]
    #[pyo3(signature = (current_bytes=None, current_count=None, peak_bytes=None, peak_count=None, total_bytes=None, total_count=None))]
    fn new(
        current_bytes: Option<&Bound<'_, PyAny>>,
        current_count: Option<&Bound<'_, PyAny>>,
        peak_bytes: Option<&Bound<'_, PyAny>>,
        peak_count: Option<&Bound<'_, PyAny>>,
        total_bytes: Option<&Bound<'_, PyAny>>,
        total_count: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let count = |name: &str, value: Option<&Bound<'_, PyAny>>| {
            value.map_or(Ok(0), |v| crate::args::int64(v, &format!("Statistics: {name}")))
        };
        Ok(PyStatistics {
            stats: Statistics {
                current_bytes: count("current_bytes", current_bytes)?,
                current_count: count("current_count", current_count)?,
                peak_bytes: count("peak_bytes", peak_bytes)?,
                peak_count: count("peak_count", peak_count)?,
                total_bytes: count("total_bytes", total_bytes)?,
                total_count: count("total_count", total_count)?,
            },
        })
    }

    /// Pickles as the class and its values, in the constructor's order.
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        crate::args::reduce_to_class(slf.as_any(), slf.get().fields().map(|(_, value)| value))
    }

    /// Bytes outstanding (negative in a level that freed older memory).
    #[getter]
    fn current_bytes(&self) -> i64 {
        self.stats.current_bytes
    }
    /// Allocations outstanding.
    #[getter]
    fn current_count(&self) -> i64 {
        self.stats.current_count
    }
    /// The most bytes outstanding at once.
    #[getter]
    fn peak_bytes(&self) -> i64 {
        self.stats.peak_bytes
    }
    /// The most allocations outstanding at once.
    #[getter]
    fn peak_count(&self) -> i64 {
        self.stats.peak_count
    }
    /// Bytes allocated in all.
    #[getter]
    fn total_bytes(&self) -> i64 {
        self.stats.total_bytes
    }
    /// Allocations in all.
    #[getter]
    fn total_count(&self) -> i64 {
        self.stats.total_count
    }

    fn __repr__(&self) -> String {
        crate::args::fields_repr("Statistics", &self.fields())
    }
}

impl PyStatistics {
    /// The counters with their names, in the constructor's order.
    fn fields(&self) -> [(&'static str, i64); 6] {
        let s = &self.stats;
        [
            ("current_bytes", s.current_bytes),
            ("current_count", s.current_count),
            ("peak_bytes", s.peak_bytes),
            ("peak_count", s.peak_count),
            ("total_bytes", s.total_bytes),
            ("total_count", s.total_count),
        ]
    }
}

/// Counts the bytes asked for and the allocations made through it (current, peak, total) on
/// a stack of counter levels.
#[pyclass(name = "StatisticsResourceAdaptor", module = "lazybuf.mr", extends = PyResource, frozen)]
pub(crate) struct PyStatisticsAdaptor {
    stats: Arc<StatisticsResource>,
}

#[pymethods]
impl PyStatisticsAdaptor {
    #[new]
    fn py_new(upstream_mr: &Bound<'_, PyAny>) -> PyResult<PyClassInitializer<Self>> {
        let (upstream, keep) = upstream(upstream_mr)?;
        let stats = Arc::new(StatisticsResource::new(upstream));
        Ok(PyClassInitializer::from(PyResource::new(stats.clone(), Some(keep)))
            .add_subclass(PyStatisticsAdaptor { stats }))
    }

    /// The counters of the current level.
    #[getter]
    fn allocation_counts(&self) -> PyStatistics {
        PyStatistics { stats: self.stats.statistics() }
    }

    /// Starts a new level of zeroed counters; returns the level below as it was.
    fn push_counters(&self) -> PyStatistics {
        PyStatistics { stats: self.stats.push_counters() }
    }

    /// Ends the current level, folds it into the one below and returns it (`IndexError` for
    /// the last level).
    fn pop_counters(&self) -> PyResult<PyStatistics> {
        self.stats
            .pop_counters()
            .map(|stats| PyStatistics { stats })
            .ok_or_else(|| PyIndexError::new_err("cannot pop the last counter pair"))
    }
}

/// Records every allocation outstanding through it (address, size, kind, device, and the
/// call stack with `capture_stacks`), for leak hunting.
#[pyclass(name = "TrackingResourceAdaptor", module = "lazybuf.mr", extends = PyResource, frozen)]
pub(crate) struct PyTrackingAdaptor {
    tracking: Arc<TrackingResource>,
}

#[pymethods]
impl PyTrackingAdaptor {
    #[new]
    #[pyo3(signature = (upstream_mr, capture_stacks=false))]
    fn py_new(upstream_mr: &Bound<'_, PyAny>, capture_stacks: bool) -> PyResult<PyClassInitializer<Self>> {
        let (upstream, keep) = upstream(upstream_mr)?;
        let tracking = Arc::new(TrackingResource::new(upstream, capture_stacks));
        Ok(PyClassInitializer::from(PyResource::new(tracking.clone(), Some(keep)))
            .add_subclass(PyTrackingAdaptor { tracking }))
    }

    /// The bytes outstanding (as asked for).
    fn get_allocated_bytes(&self) -> u64 {
        self.tracking.allocated_bytes()
    }

    /// One line per outstanding allocation (`0x...: N B (kind on device)`), with its call
    /// stack when captured; empty when nothing is outstanding.
    fn get_outstanding_allocations_str(&self) -> String {
        self.tracking.report()
    }

    /// Logs the outstanding allocations (logger `lazybuf.mr`, level DEBUG).
    fn log_outstanding_allocations(&self, py: Python<'_>) -> PyResult<()> {
        let logger = py.import("logging")?.call_method1("getLogger", ("lazybuf.mr",))?;
        logger.call_method1("debug", (self.tracking.report(),))?;
        Ok(())
    }
}

/// Calls `callback(nbytes)` when an allocation runs out of memory: a true result retries it,
/// a false one raises the `MemoryError`; an exception from the callback propagates.
#[pyclass(name = "FailureCallbackResourceAdaptor", module = "lazybuf.mr", extends = PyResource, frozen)]
pub(crate) struct PyFailureCallbackAdaptor;

#[pymethods]
impl PyFailureCallbackAdaptor {
    #[new]
    fn py_new(
        upstream_mr: &Bound<'_, PyAny>,
        callback: &Bound<'_, PyAny>,
    ) -> PyResult<PyClassInitializer<Self>> {
        let (upstream, keep) = upstream(upstream_mr)?;
        if !callback.is_callable() {
            return Err(PyTypeError::new_err(format!(
                "callback must be callable, got {}",
                args::repr(callback)
            )));
        }
        let function = callback.clone().unbind();
        let call: Arc<FailureCallback> = Arc::new(move |bytes, _err| {
            Python::attach(|py| {
                let outcome = function.call1(py, (bytes,)).and_then(|result| result.bind(py).is_truthy());
                outcome.map_err(|err| lazybuf::Error::Callback {
                    operation: "allocate",
                    message: err.to_string(),
                    payload: CallbackPayload(Arc::new(err)),
                })
            })
        });
        let resource = Arc::new(FailureCallbackResource::new(upstream, call));
        Ok(PyClassInitializer::from(PyResource::new(resource, Some(keep)))
            .add_subclass(PyFailureCallbackAdaptor))
    }
}

/// The Python objects set as current resources, by device (so `get` returns what `set` set).
static CURRENT: Mutex<Option<HashMap<DeviceId, Py<PyAny>>>> = Mutex::new(None);

fn current() -> MutexGuard<'static, Option<HashMap<DeviceId, Py<PyAny>>>> {
    CURRENT.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The Python objects over the devices' default resources, one per device (so every call
/// returns the same object), with the core resource each was made over.
static DEFAULTS: Mutex<Option<HashMap<DeviceId, Py<PyAny>>>> = Mutex::new(None);

/// The resource buffers on `device` (default: the current device) take their memory from:
/// the one set with `set_current_device_resource`, else the device's default pool (a
/// `PoolMemoryResource`), or `DirectMemoryResource` while caching is off; the same object on
/// every call while that stays so.
#[pyfunction]
#[pyo3(signature = (device=None))]
pub(crate) fn get_current_device_resource(
    py: Python<'_>,
    device: Option<&Bound<'_, PyAny>>,
) -> PyResult<Py<PyAny>> {
    let device = crate::accelerator::device_arg(device)?;
    if let Some(set) = current().as_ref().and_then(|m| m.get(&device.id())) {
        return Ok(set.clone_ref(py));
    }
    let resource = default_resource(&device);
    let made_over = |object: &Py<PyAny>| {
        object.bind(py).cast::<PyResource>().is_ok_and(|made| Arc::ptr_eq(&made.get().resource, &resource))
    };
    let defaults = || DEFAULTS.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(object) = defaults().as_ref().and_then(|m| m.get(&device.id())).filter(|o| made_over(o)) {
        return Ok(object.clone_ref(py));
    }
    // First call, or caching was turned on or off since: an object over today's default (made
    // without the lock held: making it may run Python code).
    let pool = default_pool(&device);
    let object = if Arc::ptr_eq(&resource, &(pool.clone() as Arc<dyn MemoryResource>)) {
        let init = PyClassInitializer::from(PyResource::new(resource.clone(), None))
            .add_subclass(PyPool { pool, limit: None });
        Py::new(py, init)?.into_any()
    } else {
        let init = PyClassInitializer::from(PyResource::new(resource.clone(), None)).add_subclass(PyDirect);
        Py::new(py, init)?.into_any()
    };
    let (object, replaced) = {
        let mut guard = defaults();
        let map = guard.get_or_insert_with(HashMap::new);
        match map.get(&device.id()).filter(|o| made_over(o)) {
            // Another thread made one meanwhile: every caller gets that one.
            Some(theirs) => (theirs.clone_ref(py), Some(object)),
            None => (object.clone_ref(py), map.insert(device.id(), object)),
        }
    };
    drop(replaced); // outside the lock: it may be the last reference
    Ok(object)
}

/// Makes `mr` the resource buffers, memory objects and device buffers on `device` (default:
/// the current device) made from now on take their memory from when given none; `None` goes
/// back to the default. Existing buffers keep theirs.
#[pyfunction]
#[pyo3(signature = (mr, device=None))]
pub(crate) fn set_current_device_resource(
    mr: &Bound<'_, PyAny>,
    device: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let device = crate::accelerator::device_arg(device)?;
    let resource = if mr.is_none() { None } else { Some(resource_of(mr, "mr")?) };
    let replaced = {
        let mut current = current();
        let map = current.get_or_insert_with(HashMap::new);
        let core = lazybuf::set_current_resource(&device, resource);
        let object = if mr.is_none() {
            map.remove(&device.id())
        } else {
            map.insert(device.id(), mr.clone().unbind())
        };
        (core, object)
    };
    // Outside the lock: the replaced resource may be the last reference to Python objects
    // (a failure callback), whose finalizers run here and may release the GIL; a thread
    // waiting for the lock with the GIL held would then wait forever.
    drop(replaced);
    Ok(())
}

/// Builds `lazybuf.mr` and registers it in `sys.modules` (`import lazybuf.mr` works).
pub(crate) fn register(parent: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = parent.py();
    // Its full name, which its functions take as their `__module__`: with "mr" they did not
    // pickle by reference (a `ProcessPoolExecutor` initializer), and `inspect.getmodule` found
    // no module for them.
    let module = PyModule::new(py, "lazybuf.mr")?;
    module.setattr("__doc__", PyString::new(py, "Memory resources, as RMM's rmm.mr has them."))?;
    module.add_class::<PyResource>()?;
    module.add_class::<PyDirect>()?;
    module.add_class::<PyPool>()?;
    module.add_class::<PyLimiting>()?;
    module.add_class::<PyStatistics>()?;
    module.add_class::<PyStatisticsAdaptor>()?;
    module.add_class::<PyTrackingAdaptor>()?;
    module.add_class::<PyFailureCallbackAdaptor>()?;
    module.add_function(wrap_pyfunction!(get_current_device_resource, &module)?)?;
    module.add_function(wrap_pyfunction!(set_current_device_resource, &module)?)?;
    py.import("sys")?.getattr("modules")?.set_item("lazybuf.mr", &module)?;
    Ok(())
}

// The integer arguments above, each checked under its own name (PyO3's own conversion raises a
// bare `OverflowError` naming none).

fn ptr_arg(obj: &Bound<'_, PyAny>) -> PyResult<usize> {
    let ptr = args::uint64(obj, "ptr")?;
    usize::try_from(ptr)
        .map_err(|_| PyValueError::new_err(format!("ptr {ptr} is not an address of this machine")))
}

fn nbytes_arg(obj: &Bound<'_, PyAny>) -> PyResult<usize> {
    args::size(obj, "nbytes")
}

fn maximum_pool_size_arg(obj: &Bound<'_, PyAny>) -> PyResult<Option<u64>> {
    args::optional_uint64(obj, "maximum_pool_size")
}

fn allocation_limit_arg(obj: &Bound<'_, PyAny>) -> PyResult<u64> {
    args::uint64(obj, "allocation_limit")
}
