//! `lazybuf.UnifiedBuffer`: the seeds' buffer API over the core's untyped [`RawBuffer`].
//!
//! Each method is one access on the core buffer, which decides what to allocate and copy:
//!
//! | Python | core access |
//! |---|---|
//! | `.host`, `mark_host_dirty()`, writable buffer/DLPack exports, `buf[k] = v` | host write |
//! | `copy_from()`, `buf[:] = v` / `buf[...] = v` of an array or a number | host overwrite (no sync first) |
//! | `.host_readonly`, `sync_to_host()`, `__array__`, read-only exports | host read |
//! | `to_numpy()`, `copy_to()` | a read into the caller's array ([`RawBuffer::read_into`]) |
//! | `.device_writable`, `mark_device_dirty()`, `__cuda_array_interface__` | device write |
//! | `.device`, `sync_to_device()` | device read |
//!
//! Python cannot see writes through an array it was given, so a writable host view counts as
//! a write when it is handed out: correct data beats a saved copy. `.device` is the one
//! exception, because the seeds define it: it leaves the buffer SYNCHRONIZED and kernels that
//! write it are followed by `mark_device_dirty()` (or use `.device_writable`).
//!
//! Releasing a buffer (`release()`, leaving its `with` block, or `MemoryPool.release`) drops
//! the buffer's hold on its memory; views made earlier keep it alive until they are gone
//! (see [`crate::views`]). Any later use of the buffer raises `ValueError`.
//!
//! Threads: the class is frozen; its mutable fields sit behind one std mutex that is never
//! held while Python code may run, so every method is safe from any thread and from a
//! finalizer running inside another call, and nothing can panic on a borrow. The core buffer
//! sits behind a [`crate::lock::GilFreeMutex`]: accesses that may move bytes release the GIL,
//! and the core may call Python while it holds that lock (a memory resource's failure
//! callback), so the lock is never waited for with the GIL held, and code that the callback
//! runs on the allocating thread gets `ReentrancyError` instead of waiting for itself.
//!
//! Stale host views: when the host copy goes stale (a device write) or the buffer is released,
//! the writable `.host` arrays handed out (tracked by weak reference) are made read-only, so a
//! late write raises `ValueError` instead of being lost. Arrays derived from them, memoryviews
//! and DLPack tensors are not tracked.
//!
//! What does not live here: coherence (the core), raw memory sharing ([`crate::views`]),
//! per-backend device objects ([`crate::device_view`]), the exports ([`crate::interop`]).

use std::ffi::c_int;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError, Weak};

use crate::gil_cell::GilOnceCell;
use numpy::{PyArrayDescr, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::PyTraverseError;
use pyo3::exceptions::{PyAttributeError, PyBufferError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::gc::PyVisit;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyModule, PyTuple, PyWeakrefReference};

use lazybuf::coherence::{Access, Location, Residency};
use lazybuf::observe::Cause;
use lazybuf::shape::Shape;
use lazybuf::{Device, DlpackDevice, MemoryKind, MemoryResource, RawBuffer, Ticket};

use crate::accelerator::{PyDevice, selector};
use crate::args::shape_repr;
use crate::device_view::device_object;
use crate::dtype::{self, ElementType, buffer_format, typestr};
use crate::errors::{MetalUnavailableError, OrPyErr, released};
use crate::interop::{
    self, DlpackArgs, ExportedHost, Source, buffer_dlpack_device, cuda_array_interface, export_buffer,
    release_buffer,
};
use crate::lock;
use crate::observe::{observed, observed_own, with_python_stack};
use crate::streams;
use crate::transfer::{self, PyTransfer};
use crate::views::Exposure;
use crate::views::Storage;
use crate::{args, state, wire};

mod assign;

/// An array with a host copy and a device copy, kept coherent lazily: a copy is made only
/// when a stale copy is about to be used. `.host` (a writable NumPy view: counts as a host
/// write), `.host_readonly`, `.device` (a device read: after a kernel writes it, call
/// `mark_device_dirty()`), `.device_writable`, `to_numpy()`, `sync_to_device()`,
/// `sync_to_host()`, `state` and `transfer_stats()` are the everyday calls.
///
/// Safe to use from any thread and from finalizers; calls that may copy release the GIL.
/// Used from inside its own allocation (a memory resource's failure callback) it raises
/// `lazybuf.ReentrancyError` instead of waiting.
#[pyclass(name = "UnifiedBuffer", module = "lazybuf", frozen, weakref)]
pub(crate) struct UnifiedBuffer {
    shape: Vec<usize>,
    elem: ElementType,
    home: Device,
    pinned: bool,
    /// The Python `MemoryPool` this buffer came from, if any.
    pool: Option<Py<PyAny>>,
    /// Everything that changes; see the type docs for the locking rule.
    state: Mutex<Inner>,
}

/// The mutable part of a [`UnifiedBuffer`].
#[derive(Default)]
struct Inner {
    /// The memory; `None` once released.
    storage: Option<Arc<Storage>>,
    /// The exposures of addresses handed to consumers that keep the buffer object rather than
    /// a view (`__array_interface__`, `__cuda_array_interface__`), one per memory and kind:
    /// that memory stays in use (never evicted or written to disk) and alive, also after a
    /// release or `free()`, for as long as the buffer object lives. Such a consumer holds a
    /// raw address and the buffer object, never a reference to the memory, so nothing can
    /// tell when it is done with the address: the memory is never given back before the
    /// object is gone. To keep that bounded, `free()` reuses it ([`UnifiedBuffer::reuse_exported`]):
    /// a buffer freed in a loop holds one memory, not one per iteration.
    exports: Vec<Exposure>,
    /// The last views handed out, to hand out again while still valid (see [`Views`]);
    /// made at the first view, and listed in [`KEPT`] then.
    views: Option<Arc<Mutex<Views>>>,
    /// Weak references to the writable host arrays handed out (`.host`), keyed by address:
    /// made read-only when the host copy goes stale or the buffer is released.
    writable_views: Vec<(usize, Py<PyWeakrefReference>)>,
}

/// The last views a buffer handed out (`.host`, `.host_readonly`, `.device` with its
/// handle), held strongly, to hand out again while still valid: a caller who drops the view
/// each call gets the same object back (rebuilding one costs more than the access). A view
/// that only this holds uses nothing but keeps its memory exposed: when spilling needs room,
/// [`reclaim_kept_views`] drops every view nothing else references (found through [`KEPT`]),
/// which ends its exposure; a view someone else holds stays, and is handed out again.
///
/// Behind its own lock (taken after the buffer's, never before it; only with the GIL held),
/// so that [`KEPT`] can reach it without the buffer object: a Rust weak reference per buffer
/// there, where a Python weak reference to the buffer object cost a garbage-collected object
/// per buffer (about 1,500 instructions of a new buffer's first `.device`, docs/BENCHMARKS.md).
#[derive(Default)]
struct Views {
    host: Option<Py<PyAny>>,
    host_readonly: Option<Py<PyAny>>,
    device: Option<(usize, Py<PyAny>)>,
}

impl Views {
    fn slot(&mut self, slot: Slot) -> &mut Option<Py<PyAny>> {
        match slot {
            Slot::Host => &mut self.host,
            Slot::HostReadonly => &mut self.host_readonly,
        }
    }

    fn into_vec(self) -> Vec<Py<PyAny>> {
        [self.host, self.host_readonly, self.device.map(|(_, v)| v)].into_iter().flatten().collect()
    }

    /// Takes the views nothing but this cache references (see [`only_reference`]).
    fn take_unreferenced(&mut self, py: Python<'_>) -> Vec<Py<PyAny>> {
        let device = self.device.take_if(|(_, view)| only_reference(py, view)).map(|(_, v)| v);
        [
            self.host.take_if(|v| only_reference(py, v)),
            self.host_readonly.take_if(|v| only_reference(py, v)),
            device,
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

/// Which cached host view (the device view has its handle too: [`Views::device`]).
#[derive(Clone, Copy)]
enum Slot {
    Host,
    HostReadonly,
}

/// What a release takes out of a buffer; [`Released::finish`] it once the buffer's lock is
/// released (dropping views may run Python code).
pub(crate) struct Released {
    _storage: Arc<Storage>,
    views: Vec<Py<PyAny>>,
    writable: Vec<(usize, Py<PyWeakrefReference>)>,
}

impl Drop for UnifiedBuffer {
    /// The buffer object's deallocation: its memory, when this was its last reference, is
    /// dropped with the GIL released if transfers are in flight ([`Storage::drop_last`]; the
    /// memories of `exports`, after `release()` or `free()`, through `Storage`'s drop).
    fn drop(&mut self) {
        let inner = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        let Some(storage) = inner.storage.take() else { return };
        // Exposures only count atomically: dropped here, they leave `storage` the last
        // reference unless a view elsewhere holds the memory.
        drop(std::mem::take(&mut inner.exports));
        // SAFETY: a `UnifiedBuffer` lives only inside its Python object, whose deallocation
        // (where its fields are dropped) runs with the interpreter attached to this thread;
        // `py` is used within this call.
        let py = unsafe { Python::assume_attached() };
        Storage::drop_last(py, storage);
    }
}

impl Inner {
    /// Takes the views handed out (they are of the memory going away) with `storage`, the
    /// memory given up, for [`Released::finish`].
    fn take_views(&mut self, storage: Arc<Storage>) -> Released {
        Released {
            _storage: storage,
            views: self.take_cached(),
            writable: std::mem::take(&mut self.writable_views),
        }
    }

    /// Takes every cached view (see [`Views`]), to drop after the lock.
    fn take_cached(&mut self) -> Vec<Py<PyAny>> {
        self.views
            .as_ref()
            .map(|views| std::mem::take(&mut *lock_views(views)).into_vec())
            .unwrap_or_default()
    }
}

impl Released {
    /// Gives up nothing but a reference to `storage`.
    fn nothing(storage: Arc<Storage>) -> Released {
        Released { _storage: storage, views: Vec::new(), writable: Vec::new() }
    }

    /// Makes the writable host views handed out read-only (a write through them now would
    /// be lost), then drops the buffer's holds.
    pub(crate) fn finish(self, py: Python<'_>) -> PyResult<()> {
        let result = freeze(py, &self.writable);
        drop(self.views);
        drop(self.writable);
        Storage::drop_last(py, self._storage);
        result
    }
}

/// Makes the arrays behind `views` that are still alive read-only. Call without the lock.
fn freeze(py: Python<'_>, views: &[(usize, Py<PyWeakrefReference>)]) -> PyResult<()> {
    let mut result = Ok(());
    for (_, weak) in views {
        if let Some(array) = weak.bind(py).upgrade() {
            let done = array.getattr("flags").and_then(|flags| flags.setattr("writeable", false));
            if result.is_ok() {
                result = done;
            }
        }
    }
    result
}

impl UnifiedBuffer {
    /// A buffer of `shape` and `elem` on `home`, with memory from `resource` (the backends
    /// when `None`). Allocates nothing.
    pub(crate) fn create(
        shape: Vec<usize>,
        elem: ElementType,
        home: Device,
        pinned: bool,
        resource: Option<Arc<dyn MemoryResource>>,
        pool: Option<Py<PyAny>>,
    ) -> PyResult<Self> {
        let checked = Shape::new(&shape, elem.dtype.size()).or_py()?;
        let nbytes = checked.len() * elem.dtype.size();
        let raw = match resource {
            Some(resource) => RawBuffer::with_resource(nbytes, home.clone(), pinned, resource),
            None => RawBuffer::new(nbytes, home.clone(), pinned),
        };
        let inner = Inner { storage: Some(Storage::new(raw)), ..Inner::default() };
        Ok(UnifiedBuffer { shape, elem, home, pinned, pool, state: Mutex::new(inner) })
    }

    /// The mutable fields. Never held while Python code may run, nor while taking a
    /// storage's lock.
    fn inner(&self) -> MutexGuard<'_, Inner> {
        // Poisoning means a panic while it was held; every update is a single assignment, so
        // the fields are still consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The memory, or the "released" error. Once CuPy holds an array over the device copy,
    /// lazybuf's next work on that copy is first ordered after CuPy's current stream
    /// ([`streams::order_after_cupy`]), so every call that may use the copy waits for the
    /// kernels CuPy enqueued there. Calls that cannot enqueue work on the device copy take
    /// [`Self::storage_unordered`] or [`Self::storage_if`] instead, to stay cheap.
    pub(crate) fn storage(&self) -> PyResult<Arc<Storage>> {
        self.storage_if(|_| true)
    }

    /// The memory, ordered after CuPy's current stream (as [`Self::storage`]) only if
    /// `uses_device` says, from the buffer's residency, that the call will enqueue work on the
    /// device copy.
    fn storage_if(&self, uses_device: impl FnOnce(&RawBuffer) -> bool) -> PyResult<Arc<Storage>> {
        let storage = self.storage_unordered()?;
        if storage.cupy_held() {
            Python::attach(|py| {
                // A CuPy array dropped since the last call may have left kernels on CuPy's
                // stream: ordering after them now lets eviction free the copy again
                // (`SpillState::cupy_unordered`). Taken first, so a drop meanwhile sets it again.
                let unordered = storage.spill().take_cupy_unordered();
                let ordered = storage.lock(py).and_then(|raw| {
                    let uses = unordered || uses_device(&raw);
                    drop(raw);
                    if uses { streams::order_after_cupy(py, &storage, &self.home) } else { Ok(()) }
                });
                if ordered.is_err() && unordered {
                    storage.spill().set_cupy_unordered();
                }
                ordered
            })?;
        }
        Ok(storage)
    }

    /// The memory, for calls that enqueue no work on the device copy.
    pub(crate) fn storage_unordered(&self) -> PyResult<Arc<Storage>> {
        self.held_storage().ok_or_else(released)
    }

    /// The memory, `None` once released. The fields' lock is released when this returns, so
    /// the storage's lock can be taken next: taking it while the fields' lock is held would
    /// make every thread that wants the fields (with the GIL held) wait for an allocation that
    /// may be waiting for the GIL (a failure callback).
    fn held_storage(&self) -> Option<Arc<Storage>> {
        self.inner().storage.clone()
    }

    /// Whether `at` needs a copy before it can be used: a read or write of it enqueues work.
    fn stale(at: Location) -> impl FnOnce(&RawBuffer) -> bool {
        move |raw| raw.residency(at) != Residency::Valid
    }

    /// Whether this buffer came from a pool.
    pub(crate) fn has_pool(&self) -> bool {
        self.pool.is_some()
    }

    /// Gives up the buffer's hold on its memory. The caller [`Released::finish`]es the
    /// result (the lock is released by then).
    pub(crate) fn take(&self) -> PyResult<Released> {
        let mut inner = self.inner();
        // The memory of `exports` stays with them (they hold it) while the object lives.
        let storage = inner.storage.take().ok_or_else(released)?;
        Ok(inner.take_views(storage))
    }

    /// Installs `fresh` in place of the buffer's memory (`free()`) and gives up the old one:
    /// the caller [`Released::finish`]es the result (the lock is released by then). The old
    /// memory goes back to where it came from once no view of it remains.
    fn replace_storage(&self, fresh: Arc<Storage>) -> PyResult<Released> {
        let mut inner = self.inner();
        // The old memory's `exports` keep it (alive, and in use) while the object lives.
        let old = inner.storage.replace(fresh).ok_or_else(released)?;
        Ok(inner.take_views(old))
    }

    /// `free()` of a buffer whose memory (the current, or an earlier one) an interface
    /// exported (see `Inner::exports`): that memory can never be given back while the object
    /// lives, so the buffer reuses it instead of taking more. The first memory in `exports`
    /// that nothing but the buffer holds (no view, capsule, memory owner or call in progress:
    /// its reference count is the buffer's own references and the exports') becomes the
    /// buffer's memory, its contents forgotten (UNINITIALIZED, as `invalidate`; a read sees
    /// zeros), under a new `buffer_id` with its counters at zero (as new memory would be): the
    /// current memory first (kept in place), else an
    /// earlier one (installed in place of the current, which goes as `free()` lets memory go).
    /// `None` when there is none: `free()` then takes new memory as usual. Memory held this
    /// way is at most what live objects hold, plus one.
    ///
    /// An interface consumer still using an address after `free()` then sees the buffer's
    /// later bytes there, never freed memory. The caller [`Released::finish`]es the result.
    fn reuse_exported(&self, py: Python<'_>, current: &Arc<Storage>) -> PyResult<Option<Released>> {
        let candidates: Vec<Arc<Storage>> = {
            let inner = self.inner();
            let mut candidates: Vec<Arc<Storage>> = Vec::new();
            for storage in inner.exports.iter().map(Exposure::storage) {
                if !candidates.iter().any(|c| Arc::ptr_eq(c, storage)) {
                    candidates.push(Arc::clone(storage));
                }
            }
            // The current memory first: reusing it in place changes the least.
            candidates.sort_by_key(|c| !Arc::ptr_eq(c, current));
            candidates
        };
        if candidates.is_empty() {
            return Ok(None);
        }
        // The views the buffer keeps hold their memory: let go of them first (dropping a view
        // may run Python code, so not under a lock). `free()` drops them anyway.
        let kept = self.inner().take_cached();
        drop(kept);
        for candidate in &candidates {
            let reused = lock::detach(py, |d| -> PyResult<Option<Released>> {
                // Held until the memory is installed and forgotten: nobody can use it meanwhile.
                let mut raw = candidate.lock_detached(d)?;
                let given_up = {
                    let mut inner = self.inner();
                    let Some(installed) = inner.storage.as_ref() else {
                        return Err(released());
                    };
                    if !Arc::ptr_eq(installed, current) {
                        // Another thread freed the buffer meanwhile: that was this free.
                        return Ok(Some(Released::nothing(Arc::clone(current))));
                    }
                    let in_place = Arc::ptr_eq(candidate, current);
                    let exported =
                        inner.exports.iter().filter(|e| Arc::ptr_eq(e.storage(), candidate)).count();
                    // The exports, `candidates`, and for the current memory `inner.storage` and
                    // the caller's `current`: any other reference may use the memory. (No new
                    // one can appear: the memory is reached through `inner`, locked here, or
                    // through a reference counted now.)
                    let ours = exported + 1 + if in_place { 2 } else { 0 };
                    if Arc::strong_count(candidate) != ours {
                        return Ok(None);
                    }
                    let old = if in_place {
                        Arc::clone(current)
                    } else {
                        candidate.spill().set_spillable(current.spill().spillable());
                        inner.storage.replace(Arc::clone(candidate)).ok_or_else(released)?
                    };
                    inner.take_views(old)
                };
                // A new buffer over the old memory: a new id with its counters at zero, as a
                // `free()` that takes new memory gives (the same id before the twentieth pass,
                // whose recorded copies then exceeded its counters).
                raw.invalidate_as_new();
                Ok(Some(given_up))
            })?;
            if reused.is_some() {
                return Ok(reused);
            }
        }
        Ok(None)
    }

    /// Declares a write of the copy on `device` (the host's when `None`), as
    /// [`RawBuffer::mark_written`] does: made current first (zeros when the buffer held no
    /// data), then every other copy is stale. In place when that copy is current and the
    /// storage's lock is free (bookkeeping only, as the `_nogil` accesses do), else with the
    /// GIL released.
    fn mark_written(&self, py: Python<'_>, device: Option<&Device>, call: Cause) -> PyResult<()> {
        let storage = self.storage()?;
        // In place, with the interpreter held, when the mark waits for nothing: also right
        // after `.device` on CUDA, whose upload the mark leaves in flight.
        if let Some(mut raw) = storage.try_lock_raw()
            && (raw.access_is_immediate(device, Access::Write)
                || device.is_some_and(|d| raw.mark_is_immediate(d)))
        {
            storage.spill().touch();
            return raw.as_call(call).mark_written(device).or_py();
        }
        lock::detach(py, |d| storage.lock_detached(d)?.as_call(call).mark_written(device).or_py())
    }

    /// [`Self::copy_from`]'s work, its events named `call` (the buffer's own call), or by the
    /// call running on the thread when `None` (unpickling writes the bytes this way).
    fn copy_from_as(slf: &Bound<'_, Self>, data: &Bound<'_, PyAny>, call: Option<Cause>) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        // Borrowed from the frozen object: no copy of the shape per call.
        let (storage, descr, shape) = (this.storage()?, this.descr(py), this.shape.as_slice());
        let np = numpy_module(py)?;
        // Arrays keep their dtype (and must cast under same_kind); other data (lists, scalars)
        // are values, converted to the buffer's dtype as `array[...] = data` would.
        // Whether converting `data` ran code of the user's (`__array__`, `__float__`, an array
        // subclass's `__array_finalize__`), which may have freed or released the buffer.
        let mut converted = false;
        let array = match data.cast::<PyUntypedArray>() {
            Ok(array) => array.clone(),
            Err(_) => {
                converted = true;
                args::copy_source(data, descr, shape)?
            }
        };
        if array.shape() != shape {
            let hint = if array.ndim() == 0 { " (use fill() to set every element to a scalar)" } else { "" };
            return Err(PyValueError::new_err(format!(
                "copy_from: expected data of shape {}, got shape {}{hint}",
                shape_repr(shape),
                shape_repr(array.shape())
            )));
        }
        let from = array.dtype();
        if !from.is_equiv_to(descr) {
            let kwargs = PyDict::new(py);
            kwargs.set_item("casting", "same_kind")?;
            if !np.call_method("can_cast", (&from, descr), Some(&kwargs))?.is_truthy()? {
                return Err(PyTypeError::new_err(format!(
                    "copy_from: cannot cast {} to {} under the same_kind rule; expected data of \
                     dtype {} or one that casts to it safely",
                    from.str()?,
                    descr.str()?,
                    descr.str()?
                )));
            }
        }
        let array = if from.is_equiv_to(descr) && array.is_c_contiguous() {
            array
        } else {
            converted = true;
            let kwargs = PyDict::new(py);
            kwargs.set_item("dtype", descr)?;
            np.call_method("ascontiguousarray", (array,), Some(&kwargs))?.cast_into::<PyUntypedArray>()?
        };
        // After such code, the memory the buffer has now gets the data (it went to the memory
        // `free()` gave up: the twenty-second hostile pass), and a released buffer says so.
        let storage = if converted { this.storage()? } else { storage };
        with_python_stack(py, || storage.copy_from_array(&array, call))
    }

    /// Makes the host current for `access` (the GIL released meanwhile).
    fn access_host(&self, py: Python<'_>, access: Access) -> PyResult<()> {
        self.storage()?.sync_host_nogil(py, access)
    }

    /// Makes the device current for `access` (the GIL released meanwhile); a write makes the
    /// writable host views read-only.
    fn access_device(&self, py: Python<'_>, access: Access) -> PyResult<()> {
        self.storage()?.sync_device_nogil(py, &self.home, access)?;
        if access != Access::Read {
            self.freeze_if_host_stale(py)?;
        }
        Ok(())
    }

    fn descr<'py>(&self, py: Python<'py>) -> &Bound<'py, PyArrayDescr> {
        self.elem.descr.bind(py)
    }

    /// Remembers `array`, a writable host view just handed out, so that it can be made
    /// read-only when the host copy goes stale; if it already is stale (another thread
    /// wrote on the device meanwhile), does that at once.
    fn track_writable(&self, py: Python<'_>, array: &Bound<'_, PyAny>) -> PyResult<()> {
        let key = array.as_ptr() as usize;
        // The cached view handed out again is tracked already (a live weak reference with its
        // address can only be to this very object): nothing to record.
        let tracked =
            self.inner().writable_views.iter().any(|(k, w)| *k == key && w.bind(py).upgrade().is_some());
        if tracked {
            return self.freeze_if_host_stale(py);
        }
        let weak = PyWeakrefReference::new(array)?;
        let dropped = {
            let mut inner = self.inner();
            // Upgrading a live weak reference and dropping the strong one runs no Python code
            // (the object keeps its other references); dead entries are dropped after unlock.
            let (mut live, mut dead): (Vec<_>, Vec<_>) = std::mem::take(&mut inner.writable_views)
                .into_iter()
                .partition(|(_, w)| w.bind(py).upgrade().is_some());
            if live.iter().any(|(k, _)| *k == key) {
                dead.push((key, weak.unbind()));
            } else {
                live.push((key, weak.unbind()));
            }
            inner.writable_views = live;
            dead
        };
        drop(dropped);
        self.freeze_if_host_stale(py)
    }

    /// Makes every writable host view handed out read-only when the host copy is not
    /// current (or the buffer was released): a write through one would be lost.
    fn freeze_if_host_stale(&self, py: Python<'_>) -> PyResult<()> {
        // Nothing handed out to freeze (the usual case): no need to look at the state. A view
        // handed out after this check is checked by its own `track_writable`.
        if self.inner().writable_views.is_empty() {
            return Ok(());
        }
        // As committed: an upload in flight that fails later makes the host current again,
        // and a view frozen meanwhile is only read-only (no poll of the runtime here).
        let stale = match self.held_storage() {
            Some(storage) => storage.lock(py)?.residency_as_committed(Location::Host) != Residency::Valid,
            None => true,
        };
        if !stale {
            return Ok(());
        }
        let views = std::mem::take(&mut self.inner().writable_views);
        let result = freeze(py, &views);
        drop(views);
        result
    }

    /// `out` as the NumPy array a read-back can fill: an array of the buffer's shape, and
    /// writable; else a clear error naming what was expected (`method` says whose).
    fn check_out<'py>(&self, method: &str, out: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyUntypedArray>> {
        let shape = shape_repr(&self.shape);
        let Ok(target) = out.cast::<PyUntypedArray>() else {
            let kind = out.get_type().name().map(|n| n.to_string()).unwrap_or_default();
            return Err(PyTypeError::new_err(format!(
                "{method}: expected a NumPy array of shape {shape} to copy into, got {kind}"
            )));
        };
        if target.shape() != self.shape.as_slice() {
            return Err(PyValueError::new_err(format!(
                "{method}: expected an array of shape {shape}, got shape {}",
                shape_repr(target.shape())
            )));
        }
        if !target.getattr("flags")?.getattr("writeable")?.is_truthy()? {
            return Err(PyValueError::new_err(format!(
                "{method}: expected a writable array, got a read-only one"
            )));
        }
        Ok(target.clone())
    }

    /// Copies the data into `target`, a writable C-contiguous array of the buffer's shape and
    /// dtype (checked by the caller): one copy ([`Storage::read_into_address`]).
    fn read_into_array(&self, target: &Bound<'_, PyUntypedArray>, call: Cause) -> PyResult<()> {
        let n = target.len() * target.dtype().itemsize();
        // SAFETY: target is a live NumPy array (the caller holds it); its fields are valid.
        let data =
            unsafe { (*numpy::npyffi::_PyArray_GET_ITEM_DATA(target.as_array_ptr())).data }.cast::<u8>();
        // SAFETY: a writable C-contiguous array of n bytes, held by the caller until this
        // returns: its data cannot move or be freed while it is referenced.
        unsafe { self.storage()?.read_into_address(target.py(), data, n, call) }
    }

    /// The host view cached in `slot` (see [`Views`]).
    fn cached<'py>(&self, py: Python<'py>, slot: Slot) -> Option<Bound<'py, PyAny>> {
        let inner = self.inner();
        let view = lock_views(inner.views.as_ref()?).slot(slot).as_ref().map(|v| v.clone_ref(py));
        view.map(|v| v.into_bound(py))
    }

    /// The device view cached for the device handle `key` (see [`Views`]).
    fn cached_device<'py>(&self, py: Python<'py>, key: usize) -> Option<Bound<'py, PyAny>> {
        let inner = self.inner();
        let views = lock_views(inner.views.as_ref()?);
        views.device.as_ref().filter(|(k, _)| *k == key).map(|(_, v)| v.clone_ref(py).into_bound(py))
    }

    /// Caches a view: `put` stores it in the buffer's [`Views`] and returns what it replaces,
    /// which is dropped after the locks (dropping a view may run Python code). The buffer's
    /// first view lists it in [`KEPT`].
    fn cache(&self, _py: Python<'_>, put: impl FnOnce(&mut Views) -> Option<Py<PyAny>>) {
        let (previous, listed) = {
            let mut inner = self.inner();
            let listed = inner.views.is_none();
            let shared = inner.views.get_or_insert_with(Arc::default);
            let previous = put(&mut lock_views(shared));
            (previous, listed.then(|| Arc::downgrade(shared)))
        };
        drop(previous);
        if let Some(views) = listed {
            KEPT.list(views);
        }
    }

    /// Caches `view` as the host view in `slot` (see [`Self::cache`]).
    fn cache_host(&self, view: &Bound<'_, PyAny>, slot: Slot) {
        self.cache(view.py(), |views| views.slot(slot).replace(view.clone().unbind()));
    }

    /// Keeps `exposure` (of an address given to a consumer that holds this buffer object)
    /// while the object lives; one per memory and kind is enough.
    fn keep_export(&self, exposure: Exposure) {
        let duplicate = {
            let mut inner = self.inner();
            let held = inner
                .exports
                .iter()
                .any(|e| Arc::ptr_eq(e.storage(), exposure.storage()) && e.kind() == exposure.kind());
            if held {
                Some(exposure)
            } else {
                inner.exports.push(exposure);
                None
            }
        };
        // Dropped after the lock: it may free memory (and a resource may run Python code).
        drop(duplicate);
    }
}

/// The Metal device `.metal` and `mark_metal_dirty()` use: the buffer's own device when it is
/// a wgpu device on Metal, else the first Metal device lazybuf found; a clear
/// `MetalUnavailableError` (a `BackendUnavailableError`, and PyDotCompute's `MetalError`)
/// where there is none.
fn metal_device(home: &Device) -> PyResult<Device> {
    if home.answers_to("metal") {
        return Ok(home.clone());
    }
    if !lazybuf::backend::SELECTOR_ALIASES.iter().any(|(name, _)| *name == "metal") {
        return Err(metal_unavailable(
            "this lazybuf build has no Metal backend (it comes with the wgpu feature, on macOS)",
        ));
    }
    lazybuf::select_device("metal").map_err(|err| {
        let why = match err {
            lazybuf::Error::DeviceNotFound { reason, .. } => reason,
            other => other.to_string(),
        };
        metal_unavailable(&format!("{why} (Metal needs macOS)"))
    })
}

fn metal_unavailable(reason: &str) -> PyErr {
    MetalUnavailableError::new_err((
        format!("Metal is not available: {reason}; use .device for the buffer's own device"),
        "metal",
        reason.to_string(),
    ))
}

fn numpy_module(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    static NUMPY: GilOnceCell<Py<PyModule>> = GilOnceCell::new();
    NUMPY.get_or_try_init(py, || py.import("numpy").map(Bound::unbind)).map(|m| m.bind(py))
}

/// The view caches of the buffers that cached a view ([`Views`]), weakly, for
/// [`reclaim_kept_views`].
static KEPT: KeptList = KeptList(Mutex::new(Vec::new()));

/// `to_numpy()`'s cause: an explicit transfer (JAX's `device_get`), with or without `out=`.
const TO_NUMPY: Cause = Cause::sync("to_numpy");

struct KeptList(Mutex<Vec<Weak<Mutex<Views>>>>);

impl KeptList {
    fn list(&self, views: Weak<Mutex<Views>>) {
        let mut list = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        // Entries of dropped buffers go when the list would grow past twice the live ones.
        if list.len() >= 64 && list.len() == list.capacity() {
            list.retain(|w| w.strong_count() > 0);
        }
        list.push(views);
    }
}

/// The lock of a buffer's [`Views`]: taken after the buffer's own, never before it, and held
/// only briefly, with the GIL held.
fn lock_views(views: &Mutex<Views>) -> MutexGuard<'_, Views> {
    // Poisoning means a panic while it was held; every update is a single assignment.
    views.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Drops the views in `views` nothing else references; how many.
fn drop_unreferenced(py: Python<'_>, views: &Mutex<Views>) -> usize {
    let dropped = lock_views(views).take_unreferenced(py);
    let n = dropped.len();
    // Dropped after the lock: dropping a view may run Python code.
    drop(dropped);
    n
}

/// Whether `object` has no reference but `held`.
fn only_reference(_py: Python<'_>, held: &Py<PyAny>) -> bool {
    // SAFETY: `held` is a live object (the reference it is keeps it so), and the interpreter is
    // attached (`_py`), so its reference count is not changing under us.
    unsafe { ffi::Py_REFCNT(held.as_ptr()) == 1 }
}

/// Spilling's reclaim hook (`lazybuf::spill::registry::set_reclaim_hook`, registered with the
/// module): drops every view a buffer keeps that nothing else references, which ends that
/// view's exposure, so the buffers behind them can be evicted or written to disk; returns how
/// many it dropped. Nothing happens when the interpreter cannot be entered (it is finalizing).
/// Waiting for the interpreter here cannot deadlock: the spilling thread holds only storage
/// locks, and no thread waits for a storage lock while it holds the interpreter
/// ([`crate::lock`]); the views' locks taken below are only ever held briefly, by threads that
/// hold the interpreter.
pub(crate) fn reclaim_kept_views() -> usize {
    Python::try_attach(|py| {
        let caches: Vec<Arc<Mutex<Views>>> = {
            let list = KEPT.0.lock().unwrap_or_else(PoisonError::into_inner);
            list.iter().filter_map(Weak::upgrade).collect()
        };
        caches.iter().map(|views| drop_unreferenced(py, views)).sum()
    })
    .unwrap_or(0)
}

/// `.host`'s body.
fn host_view<'py>(slf: &Bound<'py, UnifiedBuffer>) -> PyResult<Bound<'py, PyAny>> {
    host_view_of(slf).map(|(array, _)| array)
}

/// `.host`'s body, with the memory the array is of.
fn host_view_of<'py>(slf: &Bound<'py, UnifiedBuffer>) -> PyResult<(Bound<'py, PyAny>, Arc<Storage>)> {
    let py = slf.py();
    let this = slf.get();
    let storage = this.storage_if(UnifiedBuffer::stale(Location::Host))?;
    let cached = this.cached(py, Slot::Host);
    let array = storage.host_array(py, Access::Write, &this.shape, this.descr(py), cached.as_ref())?;
    this.cache_host(&array, Slot::Host);
    this.track_writable(py, &array)?;
    Ok((array, storage))
}

/// `.host_readonly`'s body.
fn host_readonly_view<'py>(slf: &Bound<'py, UnifiedBuffer>) -> PyResult<Bound<'py, PyAny>> {
    let py = slf.py();
    let this = slf.get();
    let storage = this.storage_if(UnifiedBuffer::stale(Location::Host))?;
    let cached = this.cached(py, Slot::HostReadonly);
    let array = storage.host_array(py, Access::Read, &this.shape, this.descr(py), cached.as_ref())?;
    this.cache_host(&array, Slot::HostReadonly);
    Ok(array)
}

/// Shared by `.device` and `.device_writable`.
fn device_access<'py>(
    slf: &Bound<'py, UnifiedBuffer>,
    access: Access,
    call: Cause,
) -> PyResult<Bound<'py, PyAny>> {
    let py = slf.py();
    let this = slf.get();
    let storage = this.storage_if(UnifiedBuffer::stale(Location::Device(this.home.id())))?;
    if this.home.info().dlpack_device(MemoryKind::Device) == Some(DlpackDevice::CPU) {
        // The host device's copy is the host memory itself: writes through this array change
        // every copy at once, so it is writable whatever the access (the seeds: `.device`
        // "returns the same NumPy array as host").
        let (address, exposure) = storage.host_device_address(py, &this.home, access, call)?;
        if access != Access::Read {
            this.freeze_if_host_stale(py)?;
        }
        let cached = this.cached(py, Slot::Host);
        // SAFETY: the address is this storage's host-device alias, from host_device_address;
        // shape and dtype are the buffer's own.
        let array = unsafe {
            storage.array_at(py, address, exposure, &this.shape, this.descr(py), true, cached.as_ref())
        }?;
        this.cache_host(&array, Slot::Host);
        return Ok(array);
    }
    // Before anything changes: a dtype the device object cannot hold.
    crate::device_view::refuse_unwrappable(py, &this.home, this.descr(py))?;
    // A read is in the order of the copy's stream: an upload is enqueued, not waited for, and
    // the object returned is ordered after it (`ready`; device_view.rs).
    let (handle, exposure, ready) = if access == Access::Read {
        storage.device_handle_ordered_nogil(py, &this.home, call)?
    } else {
        let (handle, exposure) = storage.device_handle_nogil(py, &this.home, access, call)?;
        (handle, exposure, Ticket::done())
    };
    if access != Access::Read {
        this.freeze_if_host_stale(py)?;
    }
    let key = handle.as_int();
    // A live cached view over this very handle holds its own exposure: this one is dropped.
    // With an upload in flight, it is ordered after that upload first.
    let cached = this.cached_device(py, key);
    if let Some(view) = cached {
        crate::device_view::order_after_upload(py, &this.home, &view, ready)?;
        return Ok(view);
    }
    let object = device_object(
        py,
        &storage,
        &this.home,
        handle,
        exposure,
        ready,
        &this.shape,
        this.elem.dtype,
        this.descr(py),
    )?;
    this.cache(py, |views| views.device.replace((key, object.clone().unbind())).map(|(_, v)| v));
    Ok(object)
}

#[pymethods]
impl UnifiedBuffer {
    #[new]
    #[pyo3(signature = (shape, dtype=None, *, pinned=false, device=None, spillable=true))]
    fn py_new(
        py: Python<'_>,
        shape: &Bound<'_, PyAny>,
        dtype: Option<&Bound<'_, PyAny>>,
        pinned: bool,
        device: Option<&Bound<'_, PyAny>>,
        spillable: bool,
    ) -> PyResult<Self> {
        let dims = args::shape(shape)?;
        let elem = dtype::resolve(py, dtype)?;
        let home = crate::accelerator::device_arg(device)?;
        let buffer = UnifiedBuffer::create(dims, elem, home, pinned, None, None)?;
        if !spillable {
            // New buffers are spillable: only an opt-out changes anything.
            buffer.storage()?.spill().set_spillable(false);
        }
        Ok(buffer)
    }

    /// Whether lazybuf may evict the device copy under a memory limit (`spillable=False` at
    /// creation opts out; see `lazybuf.set_memory_limit`).
    #[getter]
    fn spillable(&self) -> PyResult<bool> {
        Ok(self.storage()?.spill().spillable())
    }

    /// A writable NumPy view of the host copy (zero-copy; its `.base` keeps the memory
    /// alive). Syncs from the device first if the device is newer, and counts as a host
    /// write: the next device access copies the host data again.
    #[getter]
    fn host<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        observed(slf.py(), Cause::access(".host"), || host_view(slf))
    }

    /// A read-only NumPy view of the host copy: syncs from the device if needed, and does not
    /// count as a write.
    #[getter]
    fn host_readonly<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        observed(slf.py(), Cause::access(".host_readonly"), || host_readonly_view(slf))
    }
    /// The buffer on its device, synced from the host if the host is newer: the host ndarray
    /// itself on the host device, a PyOpenCL array on OpenCL (with PyOpenCL installed), a
    /// CuPy array on CUDA (with CuPy installed), else a `DeviceMemoryView`. A device *read*,
    /// as in PyDotCompute's documentation (`.device` leaves the buffer SYNCHRONIZED): after a
    /// kernel writes the array, call `mark_device_dirty()`, or take `device_writable` instead.
    #[getter]
    fn device<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        const CALL: Cause = Cause::access(".device");
        observed_own(slf.py(), CALL, || device_access(slf, Access::Read, CALL))
    }

    /// As `.device`, counted as a device write: the host copy becomes stale, so the next host
    /// access copies the kernel's results back without `mark_device_dirty()`.
    #[getter]
    fn device_writable<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        const CALL: Cause = Cause::access(".device_writable");
        observed_own(slf.py(), CALL, || device_access(slf, Access::Write, CALL))
    }

    /// The buffer on a Metal device (a wgpu device on Metal: this buffer's own device, else
    /// the first Metal device), synced there: the same object `.device` gives on that device,
    /// and a device read like `.device` (after a kernel writes it, call `mark_metal_dirty()`).
    /// Raises `MetalUnavailableError` (a `BackendUnavailableError`) where there is no Metal device.
    #[getter]
    fn metal<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let this = slf.get();
        let storage = this.storage()?;
        let metal = metal_device(&this.home)?;
        if metal == this.home {
            return device_access(slf, Access::Read, Cause::access(".metal"));
        }
        let (handle, exposure) =
            storage.device_handle_nogil(py, &metal, Access::Read, Cause::access(".metal"))?;
        device_object(
            py,
            &storage,
            &metal,
            handle,
            exposure,
            Ticket::done(),
            &this.shape,
            this.elem.dtype,
            this.descr(py),
        )
    }

    /// The dimensions.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.shape)
    }

    /// The NumPy dtype.
    #[getter]
    fn dtype(&self, py: Python<'_>) -> Py<PyArrayDescr> {
        self.elem.descr.clone_ref(py)
    }

    /// The size in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.shape.iter().product::<usize>() * self.elem.dtype.size()
    }

    /// The number of elements.
    #[getter]
    fn size(&self) -> usize {
        self.shape.iter().product()
    }

    /// The number of dimensions.
    #[getter]
    fn ndim(&self) -> usize {
        self.shape.len()
    }

    /// The host copy against the device copy, as a `BufferState`.
    #[getter]
    fn state(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let state = self.storage_unordered()?.lock(py)?.state();
        state::to_python(py, state)
    }

    /// Whether page-locked host memory was requested.
    #[getter]
    fn pinned(&self) -> bool {
        self.pinned
    }

    /// Whether the host copy exists and is page-locked.
    #[getter]
    fn is_pinned(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(self.storage_unordered()?.lock(py)?.is_pinned())
    }

    /// The buffer's own device.
    #[getter]
    fn device_handle(&self) -> PyDevice {
        PyDevice::new(self.home.clone())
    }

    /// Whether the buffer was released.
    #[getter]
    fn released(&self) -> bool {
        self.inner().storage.is_none()
    }

    /// Copies the host data to the device if the device copy is stale.
    fn sync_to_device(&self, py: Python<'_>) -> PyResult<()> {
        observed(py, Cause::sync("sync_to_device"), || self.access_device(py, Access::Read))
    }

    /// Copies the device data to the host if the host copy is stale.
    fn sync_to_host(&self, py: Python<'_>) -> PyResult<()> {
        observed(py, Cause::sync("sync_to_host"), || self.access_host(py, Access::Read))
    }

    /// As `sync_to_device()`, asynchronously: enqueues the copies and returns a `Transfer` at
    /// once (`await` it, `wait()` or poll `is_complete()`). Meanwhile `state` reports the
    /// state the buffer will have, and any call that needs the memory in flight waits for it.
    fn sync_to_device_async(&self, py: Python<'_>) -> PyResult<PyTransfer> {
        observed(py, Cause::sync("sync_to_device_async"), || self.start_sync(py, true))
    }

    /// As `sync_to_host()`, asynchronously (see `sync_to_device_async`).
    fn sync_to_host_async(&self, py: Python<'_>) -> PyResult<PyTransfer> {
        observed(py, Cause::sync("sync_to_host_async"), || self.start_sync(py, false))
    }

    /// The queue or stream lazybuf enqueues this buffer's copies on, as a raw handle (an int):
    /// a `cl_command_queue` on OpenCL, a `CUstream` on CUDA (`cupy.cuda.ExternalStream(buf.stream)`
    /// runs CuPy work there), 0 on the host device and on wgpu (neither has a queue handle to give).
    #[getter]
    fn stream(&self, py: Python<'_>) -> PyResult<usize> {
        streams::raw_stream(py, &*self.storage_unordered()?)
    }

    /// Orders lazybuf's next work on the device copy (copies into or out of it, fills, its
    /// release) after the work enqueued on `stream` so far: a PyOpenCL `CommandQueue`, a CuPy
    /// `Stream`, an object with `__cuda_stream__`, or a raw handle of the buffer's device. A
    /// raw handle is trusted: it must be a live queue or stream of the buffer's device (lazybuf
    /// cannot check one; a wrong one is undefined behaviour, as with CuPy's `ExternalStream`).
    fn order_after(&self, py: Python<'_>, stream: &Bound<'_, PyAny>) -> PyResult<()> {
        streams::order_after(py, &*self.storage()?, &self.home, stream)
    }

    /// Declares a host write: the host is made current, then the device copy is stale.
    fn mark_host_dirty(&self, py: Python<'_>) -> PyResult<()> {
        const CALL: Cause = Cause::access("mark_host_dirty");
        observed_own(py, CALL, || self.mark_written(py, None, CALL))
    }

    /// Declares a device write (by a kernel): the device is made current, then the host copy
    /// is stale (and the writable host views handed out become read-only).
    fn mark_device_dirty(&self, py: Python<'_>) -> PyResult<()> {
        const CALL: Cause = Cause::access("mark_device_dirty");
        observed_own(py, CALL, || {
            self.mark_written(py, Some(&self.home), CALL)?;
            self.freeze_if_host_stale(py)
        })
    }

    /// Declares a write on the Metal device `.metal` uses (by a Metal kernel): that copy is
    /// made current, then every other copy is stale. Raises `MetalUnavailableError` where
    /// there is no Metal device.
    fn mark_metal_dirty(&self, py: Python<'_>) -> PyResult<()> {
        // A released buffer says so first, wherever Metal is.
        self.storage_unordered()?;
        let metal = metal_device(&self.home)?;
        self.mark_written(py, Some(&metal), Cause::access("mark_metal_dirty"))?;
        self.freeze_if_host_stale(py)
    }

    /// Sets every element to `value` where the data is current, with no transfer; returns the
    /// buffer.
    fn fill<'py>(slf: &Bound<'py, Self>, value: &Bound<'py, PyAny>) -> PyResult<Bound<'py, Self>> {
        let py = slf.py();
        let (storage, descr) = {
            let this = slf.get();
            (this.storage()?, this.descr(py).clone())
        };
        let scalar = dtype::fill_scalar(value, &descr)?;
        // The conversion may have run the user's code (`__float__`), which may have freed or
        // released the buffer: the memory it has now gets the values (the write went to the
        // memory given up: the twenty-second hostile pass), and a released buffer says so.
        drop(storage);
        let storage = slf.get().storage()?;
        with_python_stack(py, || storage.fill_from_scalar(&scalar))?;
        Ok(slf.clone())
    }

    /// Copies `data` into the host copy; the device copy becomes stale. `data` has the
    /// buffer's shape: a NumPy array whose dtype casts to the buffer's under NumPy's
    /// `same_kind` rule, or values (a list, a buffer-protocol object) converted as
    /// `array[...] = data` converts them.
    fn copy_from(slf: &Bound<'_, Self>, data: &Bound<'_, PyAny>) -> PyResult<()> {
        Self::copy_from_as(slf, data, Some(Cause::access("copy_from")))
    }

    /// A copy of the data as a new NumPy array, or in `out` (a writable C-contiguous NumPy
    /// array of the buffer's shape and dtype, returned), as CuPy's `get(out=)`. One copy: when
    /// the host copy is current, from it; when the device copy is newer, straight from the
    /// device, and the host copy stays stale (the state does not change). Not a write.
    #[pyo3(signature = (*, out=None))]
    fn to_numpy<'py>(&self, py: Python<'py>, out: Option<&Bound<'py, PyAny>>) -> PyResult<Bound<'py, PyAny>> {
        let Some(out) = out else {
            return observed_own(py, TO_NUMPY, || {
                self.storage()?.to_array(py, &self.shape, self.descr(py), TO_NUMPY)
            });
        };
        let target = self.check_out("to_numpy", out)?;
        if !target.dtype().is_equiv_to(self.descr(py)) {
            return Err(PyTypeError::new_err(format!(
                "to_numpy: expected out of dtype {}, got {} (to_numpy(out=) copies the bytes; \
                 copy_to() casts)",
                self.elem.dtype,
                target.dtype().str()?
            )));
        }
        if !target.is_c_contiguous() {
            return Err(PyValueError::new_err(format!(
                "to_numpy: expected a C-contiguous out array, got one with strides {:?}",
                target.strides()
            )));
        }
        observed_own(py, TO_NUMPY, || self.read_into_array(&target, TO_NUMPY))?;
        Ok(out.clone())
    }

    /// The buffer's id: unique in the process, the name `TransferGuardError` and recorded
    /// events (`lazybuf.trace`) give it. A new id after `free()`.
    #[getter]
    fn buffer_id(&self, py: Python<'_>) -> PyResult<u64> {
        Ok(self.storage_unordered()?.lock(py)?.id())
    }

    /// Copies and bytes moved since the buffer was made, and allocations made.
    fn transfer_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let stats = self.storage_unordered()?.lock(py)?.transfer_stats();
        let dict = PyDict::new(py);
        dict.set_item("host_to_device_copies", stats.host_to_device.copies)?;
        dict.set_item("host_to_device_bytes", stats.host_to_device.bytes)?;
        dict.set_item("device_to_host_copies", stats.device_to_host.copies)?;
        dict.set_item("device_to_host_bytes", stats.device_to_host.bytes)?;
        dict.set_item("zero_copy_syncs", stats.zero_copy_syncs)?;
        dict.set_item("allocations", stats.allocations)?;
        Ok(dict)
    }

    /// Releases the buffer: to its memory pool if it came from one, else its memory is freed.
    /// Views made earlier keep the memory alive until they are gone; the buffer itself can no
    /// longer be used.
    fn release(slf: &Bound<'_, Self>) -> PyResult<()> {
        match &slf.get().pool {
            Some(pool) => pool.bind(slf.py()).call_method1("release", (slf,)).map(drop),
            None => with_python_stack(slf.py(), || slf.get().take()?.finish(slf.py())),
        }
    }

    fn __enter__(slf: Bound<'_, Self>) -> PyResult<Bound<'_, Self>> {
        slf.get().storage()?;
        Ok(slf)
    }

    /// Releases the buffer unless it already was (inside the block).
    #[pyo3(signature = (*_exc))]
    fn __exit__(slf: &Bound<'_, Self>, _exc: &Bound<'_, PyTuple>) -> PyResult<bool> {
        if !slf.get().released() {
            UnifiedBuffer::release(slf)?;
        }
        Ok(false)
    }

    fn __len__(&self) -> PyResult<usize> {
        self.shape.first().copied().ok_or_else(|| PyTypeError::new_err("len() of a 0-d buffer"))
    }

    /// The object's size in bytes, the memory it holds included: `nbytes` for each allocated
    /// copy (host, and the device copy unless it is the host memory itself). Once released, the memory part is 0: only the object itself is counted.
    fn __sizeof__(&self, py: Python<'_>) -> usize {
        let nbytes = self.nbytes();
        let held = self.held_storage().map_or(0, |storage| {
            // In use by an operation on this thread: counted as holding nothing more.
            let Ok(raw) = storage.lock(py) else { return 0 };
            let host = raw.residency(Location::Host) != Residency::Unallocated;
            let device = raw.residency(Location::Device(self.home.id())) != Residency::Unallocated
                && !(host && self.home.is_zero_copy(nbytes));
            nbytes * (usize::from(host) + usize::from(device))
        });
        std::mem::size_of::<Self>() + std::mem::size_of::<Inner>() + held
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let state = match self.held_storage() {
            // In use by an operation on this thread (a failure callback printing the buffer).
            Some(storage) => storage.lock(py).map_or_else(|_| "IN_USE".into(), |raw| raw.state().to_string()),
            None => "RELEASED".into(),
        };
        Ok(format!(
            "UnifiedBuffer(shape={}, dtype={}, device={}, state={state})",
            shape_repr(&self.shape),
            self.elem.dtype,
            selector(&self.home)
        ))
    }

    // --- PyDotCompute 0.2.0 names (docs/MIGRATING.md) --------------------------------------

    /// Makes the named copies exist now, holding the buffer's data, and returns the buffer:
    /// `host=True` is a host read (`sync_to_host()`), `device=True` a device read
    /// (`sync_to_device()`). Memory is otherwise taken at first use; a buffer that holds no
    /// data yet holds zeros after this (HOST_ONLY, DEVICE_ONLY or SYNCHRONIZED). Data already
    /// there is kept. `ValueError` when neither is asked for.
    #[pyo3(signature = (*, host=true, device=true))]
    fn allocate<'py>(slf: &Bound<'py, Self>, host: bool, device: bool) -> PyResult<Bound<'py, Self>> {
        if !host && !device {
            return Err(PyValueError::new_err(
                "allocate: expected host=True, device=True or both; got neither, so there is \
                 nothing to allocate",
            ));
        }
        let (py, this) = (slf.py(), slf.get());
        let (storage, home) = (this.storage()?, this.home.clone());
        // One core operation: a failed device step undoes the host step it followed.
        observed(py, Cause::sync("allocate"), || {
            lock::detach(py, |d| {
                storage.lock_detached(d)?.allocate_copies(host, device.then_some(&home)).or_py()
            })
        })?;
        Ok(slf.clone())
    }

    /// Gives the buffer's memory back (to the pool it came from, or the device's cache) and
    /// makes the buffer UNINITIALIZED; it stays usable and takes memory again at its next use.
    /// The data is gone. Views made earlier keep the old memory alive until they are gone;
    /// the writable `.host` arrays handed out become read-only (a write through them would be
    /// lost). Memory whose address `__array_interface__` or `__cuda_array_interface__` handed
    /// out stays with the buffer until the object is gone (a consumer holds the object and the
    /// address): `free()` reuses it, its contents forgotten, instead of taking more (see
    /// `reuse_exported`).
    fn free(slf: &Bound<'_, Self>) -> PyResult<()> {
        let this = slf.get();
        let storage = this.storage()?;
        if let Some(released) = this.reuse_exported(slf.py(), &storage)? {
            drop(storage); // so that `finish` drops the last reference (with the GIL released)
            return released.finish(slf.py());
        }
        let fresh = {
            let raw = storage.lock(slf.py())?;
            let resource = Arc::clone(raw.resource());
            let fresh = Storage::new(RawBuffer::with_resource(
                raw.nbytes(),
                this.home.clone(),
                this.pinned,
                resource,
            ));
            fresh.spill().set_spillable(storage.spill().spillable());
            fresh
        };
        // Dropped before `finish`, which drops the last reference to the old memory with the
        // GIL released when transfers are in flight (`Storage::drop_last`; a `free()` with an
        // upload in flight hung otherwise: the fourteenth hostile pass, 2026-11-28).
        drop(storage);
        this.replace_storage(fresh)?.finish(slf.py())
    }

    /// Whether the buffer holds memory (host or device) now, or its host copy is spilled to
    /// disk: false for a new buffer and after `free()`, true from its first use or
    /// `allocate()`.
    #[getter]
    fn is_allocated(&self, py: Python<'_>) -> PyResult<bool> {
        let storage = self.storage()?;
        let raw = storage.lock(py)?;
        let held = |at| raw.residency(at) != Residency::Unallocated;
        Ok(held(Location::Host) || held(Location::Device(self.home.id())))
    }

    /// `fill(0)`: sets every element to zero where the data is current; returns the buffer.
    fn zeros<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, Self>> {
        let zero = 0i32.into_pyobject(slf.py())?.into_any();
        UnifiedBuffer::fill(slf, &zero)
    }

    /// Copies the data into `out`, a writable NumPy array of the buffer's shape whose dtype
    /// the buffer's casts to under NumPy's `same_kind` rule. Into a C-contiguous array of the
    /// buffer's dtype it is `to_numpy(out=out)` (one copy, the state unchanged); otherwise a
    /// host read (syncing from the device first if it is newer) and `np.copyto`.
    fn copy_to(slf: &Bound<'_, Self>, out: &Bound<'_, PyAny>) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        let target = this.check_out("copy_to", out)?;
        let to = target.dtype();
        if to.is_equiv_to(this.descr(py)) && target.is_c_contiguous() {
            // The bytes as they are: one copy, straight from the device when it is newer.
            const CALL: Cause = Cause::sync("copy_to");
            return observed(py, CALL, || this.read_into_array(&target, CALL));
        }
        let np = numpy_module(py)?;
        let kwargs = PyDict::new(py);
        kwargs.set_item("casting", "same_kind")?;
        if !np.call_method("can_cast", (this.descr(py), &to), Some(&kwargs))?.is_truthy()? {
            return Err(PyTypeError::new_err(format!(
                "copy_to: cannot cast {} to {} under the same_kind rule; expected an array of \
                 dtype {} or one it casts to safely",
                this.elem.dtype,
                to.str()?,
                this.elem.dtype
            )));
        }
        // The view itself, not the `.host_readonly` method: that is an access of its own, whose
        // cause would replace copy_to's (the guard refused an explicit copy as implicit).
        let source = observed(py, Cause::sync("copy_to"), || host_readonly_view(slf))?;
        np.call_method("copyto", (target, source), Some(&kwargs)).map(drop)
    }

    /// Makes every copy the buffer holds current: a stale host copy is updated from the device
    /// and a stale device copy from the host (after any asynchronous sync in flight). Copies
    /// that do not exist are not made (that is `allocate()`).
    fn synchronize(&self, py: Python<'_>) -> PyResult<()> {
        let (storage, home) = (self.storage()?, self.home.clone());
        observed(py, Cause::sync("synchronize"), || {
            lock::detach(py, |d| {
                let mut raw = storage.lock_detached(d)?;
                raw.finish().or_py()?;
                // The stale copies made current as one operation: when the device step fails
                // (or the guard refuses it) after the host step zero-filled the host copy of a
                // buffer holding no data, that is undone (it was left HOST_DIRTY before the
                // nineteenth hostile pass).
                let host = raw.residency(Location::Host) == Residency::Stale;
                let device = raw.residency(Location::Device(home.id())) == Residency::Stale;
                raw.allocate_copies(host, device.then_some(&home)).or_py()
            })
        })
    }

    /// A coroutine that makes the device copy current (`await buf.ensure_on_device()`): the
    /// asynchronous `sync_to_device_async()`, started when the coroutine runs; the event loop
    /// keeps running while the copy is in flight.
    fn ensure_on_device<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        ensure(slf, "_ensure_on_device")
    }

    /// A coroutine that makes the host copy current (`await buf.ensure_on_host()`): the
    /// asynchronous `sync_to_host_async()` (a host read), started when the coroutine runs.
    fn ensure_on_host<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        ensure(slf, "_ensure_on_host")
    }

    /// `ensure_on_device()`'s start: `sync_to_device_async()`, named after the call the user
    /// made (the guard and the recorder say `ensure_on_device`).
    fn _ensure_on_device(&self, py: Python<'_>) -> PyResult<PyTransfer> {
        observed(py, Cause::sync("ensure_on_device"), || self.start_sync(py, true))
    }

    /// `ensure_on_host()`'s start (see `_ensure_on_device`).
    fn _ensure_on_host(&self, py: Python<'_>) -> PyResult<PyTransfer> {
        observed(py, Cause::sync("ensure_on_host"), || self.start_sync(py, false))
    }

    /// `UnifiedBuffer[np.float32]` in annotations (PyDotCompute's class was `Generic[T]`): a
    /// `types.GenericAlias`; the element type is still the `dtype=` argument.
    #[classmethod]
    fn __class_getitem__<'py>(
        cls: &Bound<'py, pyo3::types::PyType>,
        item: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        cls.py().import("types")?.getattr("GenericAlias")?.call1((cls, item))
    }

    /// `buf[key]`: indexes the host copy, a host read (syncs from the device first if it is
    /// newer). Slices are read-only views (take `.host` to write).
    fn __getitem__<'py>(slf: &Bound<'py, Self>, key: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        observed(slf.py(), Cause::access("__getitem__"), || host_readonly_view(slf)?.get_item(key))
    }

    /// `buf[key] = value`: assigns into the host copy as NumPy does, a host write (the device
    /// copy is stale afterwards). An assignment to every element (`buf[:] = x`,
    /// `buf[...] = x`, of an array or a number) reads none of the old bytes: when the host copy
    /// is stale it is overwritten, not synced from the device first ([`assign`]).
    fn __setitem__(slf: &Bound<'_, Self>, key: &Bound<'_, PyAny>, value: &Bound<'_, PyAny>) -> PyResult<()> {
        observed(slf.py(), assign::SETITEM, || assign::set_item(slf, key, value))
    }

    // --- garbage collector ------------------------------------------------------------

    /// Visits the Python objects the buffer holds. Must not block: when another thread holds
    /// the lock (it never does across Python code), the cached views are not reported, which
    /// only keeps them alive longer.
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.pool)?;
        visit.call(&self.elem.descr)?;
        let inner = match self.state.try_lock() {
            Ok(inner) => inner,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return Ok(()),
        };
        for (_, weak) in &inner.writable_views {
            visit.call(weak)?;
        }
        // The same rule for the views' lock, which is only held briefly too.
        if let Some(views) = &inner.views {
            let views = match views.try_lock() {
                Ok(views) => views,
                Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
                Err(TryLockError::WouldBlock) => return Ok(()),
            };
            visit.call(&views.host)?;
            visit.call(&views.host_readonly)?;
            visit.call(views.device.as_ref().map(|(_, v)| v))?;
        }
        Ok(())
    }

    /// Drops the cached views (which may lead back to this buffer); the memory stays.
    fn __clear__(&self) {
        let dropped = {
            let mut inner = self.inner();
            (inner.take_cached(), std::mem::take(&mut inner.writable_views))
        };
        drop(dropped);
    }

    // --- interop ---------------------------------------------------------------------

    /// Buffer protocol: writable exports are host writes, read-only ones host reads. A
    /// request without `PyBUF_ND` (hashlib, `readinto`) gets the bytes as a 1-d view.
    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        let this = slf.get();
        let storage = this.storage()?;
        let (shape, dtype) = (this.shape.clone(), this.elem.dtype);
        let format = buffer_format(dtype).ok_or_else(|| {
            PyBufferError::new_err(format!(
                "{dtype} has no buffer-protocol format; use .host or __dlpack__ instead"
            ))
        });
        let py = slf.py();
        // A failed transfer in flight that the export's host access depends on is raised here
        // once without being settled: NumPy drops an error of this slot and tries
        // `__array_interface__`, which then settles it and raises it where NumPy does not drop
        // it (np.asarray returned the old data with no error, a hostile pass of 2026-11-27).
        // Once only, and only such a failure: `bytes(buf)` raised an upload's failure forever,
        // although the host copy was current (the tenth hostile pass).
        let writable = flags & ffi::PyBUF_WRITABLE != 0;
        let access = if writable { Access::Write } else { Access::Read };
        if storage.lock(py)?.is_busy() {
            // Waited for without the GIL, as the access would wait.
            let failure = lock::detach(py, |d| {
                PyResult::Ok(storage.lock_detached(d)?.unreported_failure_for_host(access))
            })?;
            if let Some(err) = failure {
                return Err(err).or_py();
            }
        }
        let memory = |writable: bool| {
            // A writable export is a host write, a read-only one a host read.
            let access = if writable { Access::Write } else { Access::Read };
            // The export holds the exposure: the host copy stays in use until it is released.
            let (address, exposure) =
                observed(py, Cause::access("buffer protocol"), || storage.host_address_nogil(py, access))?;
            Ok(ExportedHost { address, writable, owner: Box::new(exposure) })
        };
        // SAFETY: view is the Py_buffer CPython passed to this slot; the address is the
        // storage's host block, valid while the export's clone of the storage lives.
        unsafe { export_buffer(view, flags, slf.into_any(), &shape, dtype.size(), format, memory) }
    }

    /// Never fails: the class is frozen, so nothing can be borrowed here, and the export's
    /// memory always goes back (to its pool, if it came from one).
    unsafe fn __releasebuffer__(&self, view: *mut ffi::Py_buffer) {
        // SAFETY: view was filled by __getbuffer__ and CPython releases it once.
        unsafe { release_buffer(view) }
    }

    /// NumPy's `__array__`: a read-only view (a host read), or a copy with `copy=True`.
    #[pyo3(signature = (dtype=None, copy=None))]
    fn __array__<'py>(
        slf: &Bound<'py, Self>,
        dtype: Option<&Bound<'py, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        // An implicit transfer whatever the copy (OBSERVING.md): named `__array__`, not the
        // explicit `to_numpy` it calls.
        let base = observed(py, Cause::access("__array__"), || {
            let this = slf.get();
            if copy == Some(true) {
                this.storage()?.to_array(py, &this.shape, this.descr(py), Cause::access("__array__"))
            } else {
                host_readonly_view(slf)
            }
        })?;
        match dtype.filter(|d| !d.is_none()) {
            None => Ok(base),
            Some(dtype) => {
                let wanted = PyArrayDescr::new(py, dtype)?;
                if wanted.is_equiv_to(slf.get().descr(py)) {
                    return Ok(base);
                }
                if copy == Some(false) {
                    return Err(PyValueError::new_err(
                        "__array__: a different dtype needs a copy, but copy=False was given",
                    ));
                }
                base.call_method1("astype", (wanted,))
            }
        }
    }

    /// NumPy's array interface (version 3) over the host copy, read-only (a host read).
    /// Consumers hold the buffer itself, so a released buffer keeps this memory until the
    /// buffer object is gone.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        if typestr(self.elem.dtype).is_none() {
            // Refused before the host read, which would change the state.
            return Err(PyAttributeError::new_err(format!(
                "{} has no array-interface type string; use .host or __dlpack__",
                self.elem.dtype
            )));
        }
        let storage = self.storage()?;
        let (address, exposure) = observed(py, Cause::access("__array_interface__"), || {
            storage.host_address_nogil(py, Access::Read)
        })?;
        self.keep_export(exposure);
        crate::interop::array_interface(py, address as usize, &self.shape, self.elem.dtype)
    }

    /// CUDA Array Interface (version 3) over the device copy, for buffers on a CUDA device
    /// (a device write). Absent (`AttributeError`) on other devices.
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        if !crate::interop::addresses_cuda(&self.home) {
            return Err(PyAttributeError::new_err(format!(
                "__cuda_array_interface__ exists only for buffers on a CUDA device; this one is on {}",
                selector(&self.home)
            )));
        }
        if typestr(self.elem.dtype).is_none() {
            // Refused before the device write, which would change the state (a failed
            // `hasattr` made the buffer DEVICE_DIRTY and its host views read-only).
            return Err(PyAttributeError::new_err(format!(
                "{} has no __cuda_array_interface__ type string; use __dlpack__ instead",
                self.elem.dtype
            )));
        }
        let storage = self.storage()?;
        const CALL: Cause = Cause::access("__cuda_array_interface__");
        let (handle, exposure) =
            observed(py, CALL, || storage.device_handle_nogil(py, &self.home, Access::Write, CALL))?;
        let address = handle.as_int();
        self.keep_export(exposure);
        self.freeze_if_host_stale(py)?;
        cuda_array_interface(py, address, &self.shape, self.elem.dtype, false)
    }

    /// DLPack export (zero-copy; a write access at the exported location).
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<Bound<'py, PyAny>>,
        dl_device: Option<Bound<'py, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        let storage = self.storage()?;
        // A copy the consumer asked for (`copy=True`) is explicit; an export's sync is implicit.
        let cause = if copy == Some(true) { Cause::sync("__dlpack__") } else { Cause::access("__dlpack__") };
        let source = Source {
            storage: &storage,
            home: &self.home,
            shape: &self.shape,
            dtype: self.elem.dtype,
            descr: self.descr(py),
            call: cause,
        };
        let stream = stream.filter(|s| !s.is_none());
        let call = DlpackArgs::new(stream, max_version, dl_device, copy)?;
        let capsule = observed(py, cause, || interop::dlpack_of_buffer(py, source, call))?;
        // A device export is a device write: the host copy may be stale now.
        self.freeze_if_host_stale(py)?;
        Ok(capsule)
    }

    /// `(device_type, device_id)`: `(2, ordinal)` for a CUDA buffer, else `(1, 0)` (the host).
    fn __dlpack_device__(&self) -> (u32, i32) {
        let device = buffer_dlpack_device(&self.home);
        (device.device_type.0, device.device_id)
    }

    /// Pickling with protocol 5 and later (what Dask and other transports with out-of-band
    /// buffers use): the host copy goes out as a `pickle.PickleBuffer`, zero-copy (synced from
    /// the device first if only the device copy is current), and the buffer's device is
    /// recorded. Older protocols pickle as `__reduce__` does.
    ///
    /// Every protocol's download is an implicit transfer named after this call (the transfer
    /// guard's `disallow` refuses it, as it refuses `.host`).
    fn __reduce_ex__<'py>(
        slf: &Bound<'py, Self>,
        protocol: i64,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        const CALL: Cause = Cause::access("__reduce_ex__");
        observed(slf.py(), CALL, || {
            if protocol >= 5 {
                wire::reduce_out_of_band(slf)
            } else {
                slf.get().reduce_in_band(slf.py(), CALL)
            }
        })
    }

    /// Pickling (protocols 0-4) copies the data through the host and records the device:
    /// the copy is made on that device when the unpickling process has it, else on its current
    /// device (pinned dropped where that device cannot pin). An implicit transfer, as
    /// `__reduce_ex__`'s.
    fn __reduce__<'py>(&self, py: Python<'py>) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        const CALL: Cause = Cause::access("__reduce__");
        observed(py, CALL, || self.reduce_in_band(py, CALL))
    }
}

impl UnifiedBuffer {
    /// The body of `sync_to_device_async()` (`to_device`) and `sync_to_host_async()`.
    fn start_sync(&self, py: Python<'_>, to_device: bool) -> PyResult<PyTransfer> {
        transfer::start(py, &*self.storage()?, to_device.then_some(&self.home))
    }

    /// [`Self::__reduce__`]'s work (the data as an array read straight from its current copy).
    fn reduce_in_band<'py>(
        &self,
        py: Python<'py>,
        call: Cause,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        let storage = self.storage()?;
        let initialized = storage.lock(py)?.state() != lazybuf::BufferState::Uninitialized;
        let data =
            if initialized { Some(storage.to_array(py, &self.shape, self.descr(py), call)?) } else { None };
        let rebuild = py.import("lazybuf._lazybuf")?.getattr("_rebuild_buffer")?;
        let origin = wire::origin_of(&self.home);
        let args = (PyTuple::new(py, &self.shape)?, self.descr(py).clone(), self.pinned, data, origin);
        Ok((rebuild, args.into_pyobject(py)?))
    }
}

/// The coroutine `_pydotcompute._ensure(buf.<start>)` (python/lazybuf/_pydotcompute.py).
fn ensure<'py>(slf: &Bound<'py, UnifiedBuffer>, start: &str) -> PyResult<Bound<'py, PyAny>> {
    let py = slf.py();
    static ENSURE: GilOnceCell<Py<PyAny>> = GilOnceCell::new();
    let ensure = ENSURE
        .get_or_try_init(py, || py.import("lazybuf._pydotcompute")?.getattr("_ensure").map(Bound::unbind))?;
    ensure.bind(py).call1((slf.getattr(start)?,))
}

/// Read-only access for the other binding modules (pickling and Dask frames, [`crate::wire`]).
impl UnifiedBuffer {
    /// The dimensions.
    pub(crate) fn dims(&self) -> &[usize] {
        &self.shape
    }

    /// The size in bytes.
    pub(crate) fn byte_len(&self) -> usize {
        self.nbytes()
    }

    /// The NumPy dtype of the elements.
    pub(crate) fn descr_of<'py>(&self, py: Python<'py>) -> &Bound<'py, PyArrayDescr> {
        self.descr(py)
    }

    /// Whether page-locked host memory was requested.
    pub(crate) fn pinned_requested(&self) -> bool {
        self.pinned
    }

    /// The buffer's own device.
    pub(crate) fn home_device(&self) -> &Device {
        &self.home
    }
}

/// Unpickles a buffer (see `__reduce__`).
#[pyfunction]
#[pyo3(signature = (shape, dtype, pinned, data, origin=None))]
pub(crate) fn _rebuild_buffer<'py>(
    py: Python<'py>,
    shape: &Bound<'py, PyAny>,
    dtype: &Bound<'py, PyAny>,
    pinned: bool,
    data: Option<&Bound<'py, PyAny>>,
    origin: Option<(String, String)>,
) -> PyResult<Bound<'py, UnifiedBuffer>> {
    let buffer = wire::new_buffer(py, shape, dtype, pinned, None, origin)?;
    if let Some(data) = data {
        // Named `unpickle`, as protocol 5's and the memory objects' unpickling are.
        observed(py, Cause::access("unpickle"), || UnifiedBuffer::copy_from_as(&buffer, data, None))?;
    }
    Ok(buffer)
}
