//! Spilling from Python: `lazybuf.set_memory_limit`, `get_memory_limit`, `memory_held`,
//! `spill_stats`, `reset_spill_stats`, and what makes a Python buffer evictable.
//!
//! Every buffer's memory ([`Storage`]) registers with the core's eviction registry when it is
//! made (`Storage::new`); a buffer that opted out (`spillable=False`) is skipped. Eviction only tries a
//! storage's lock, never waits for it (see [`lazybuf::spill::registry`]), so it cannot
//! deadlock against a Python thread, with or without the GIL.
//!
//! **Exposure.** While a device handle of a buffer is out of its lock (`.device`,
//! `.device_writable`, `.metal`, DLPack and CUDA Array Interface exports, device frames), an
//! object lazybuf does not track may use that memory, so the buffer's device copies are not
//! evicted. Exposure is scoped: each handle goes out with an
//! [`Exposure`](crate::views::Exposure) token, held by the object that uses it (a
//! view's `MemoryOwner`, a DLPack capsule's manager context, the buffer object for
//! `__cuda_array_interface__`), and the buffer is evictable again once every such object is
//! gone. The count goes up while the lock is held, before the handle is returned, and
//! eviction checks it again under the lock, so no eviction can slip between the two.
//!
//! The same goes for host addresses and the disk tier: while a host address is out (`.host`,
//! `.host_readonly`, the buffer protocol, `__array_interface__`, host DLPack), the buffer's
//! host copy is not written to disk. Caches of views are weak references, so they never keep
//! a buffer in use by themselves ([`crate::spill_state`], docs/SPILLING.md).
//!
//! What does not live here: the budget and eviction ([`lazybuf::spill`]).

use lazybuf::spill::{self, Evictable, Evicted};
use lazybuf::{Device, Result};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};

use crate::errors::OrPyErr;
use crate::views::Storage;

impl Evictable for Storage {
    fn last_use(&self) -> u64 {
        self.spill().last_use()
    }

    fn try_evict(&self, device: &Device) -> Option<Result<Option<Evicted>>> {
        let state = self.spill();
        if !state.spillable() || state.exposed() {
            return None;
        }
        let mut raw = self.try_lock_raw()?;
        // Exposure is recorded under the lock: checked again now that it is held.
        if state.exposed() {
            return None;
        }
        Some(raw.evict_device_copy(device))
    }

    fn try_spill_host(&self) -> Option<Result<Option<usize>>> {
        let state = self.spill();
        if !state.spillable() || state.host_exposed() {
            return None;
        }
        let mut raw = self.try_lock_raw()?;
        // Exposure is recorded under the lock: checked again now that it is held.
        if state.host_exposed() {
            return None;
        }
        if state.exposed() {
            // A device handle lives: the host block may still be freed when stale (a device
            // copy that is the host block itself, the host device's handle, never is), but
            // not written to disk (that needs no device copy at all).
            return Some(raw.free_stale_host());
        }
        Some(raw.give_host_back())
    }
}

/// A byte count from Python: a non-negative int, or a size string such as "512MiB".
fn byte_count(nbytes: &Bound<'_, PyAny>) -> PyResult<u64> {
    if let Ok(text) = nbytes.cast::<PyString>() {
        return spill::parse_size(text.to_str()?).map_err(|err| PyValueError::new_err(err.to_string()));
    }
    if nbytes.is_instance_of::<pyo3::types::PyBool>() {
        return Err(PyTypeError::new_err(
            "nbytes must be an int, a size string such as \"512MiB\", or None; got a bool",
        ));
    }
    if !nbytes.is_instance_of::<pyo3::types::PyInt>() && nbytes.extract::<i128>().is_err() {
        return Err(PyTypeError::new_err(format!(
            "nbytes must be an int, a size string such as \"512MiB\", or None; got {}",
            nbytes.get_type().name().map_or_else(|_| "an object".into(), |n| n.to_string())
        )));
    }
    // An int of any size (2**200 is an int too: it was refused as not one, the twenty-second
    // hostile pass); 2**64 - 1 itself is the core's "no limit", refused rather than read back
    // as None.
    let bytes = nbytes.extract::<u64>().ok().filter(|&bytes| bytes != u64::MAX);
    bytes.ok_or_else(|| {
        PyValueError::new_err(format!(
            "nbytes must be a non-negative number of bytes below 2**64 - 1 (None for no limit), got {}",
            crate::args::repr(nbytes)
        ))
    })
}

/// Sets the memory limit of `device` (a `lazybuf.Device` or a selector such as "cuda:0") to
/// `nbytes` (an int, or a size string such as "512MiB"); `None` removes it. Above the limit,
/// lazybuf evicts the least recently used device copies of buffers not in use before it
/// allocates. A buffer is in use while an object lazybuf cannot see uses its device memory (a
/// live `.device` array, DLPack capsule or tensor, device view; the buffer object itself after
/// `__cuda_array_interface__`), and evictable again once that object is gone.
#[pyfunction]
#[pyo3(signature = (device, nbytes))]
pub(crate) fn set_memory_limit(device: &Bound<'_, PyAny>, nbytes: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
    let device = crate::accelerator::device_arg(Some(device))?;
    let limit = nbytes.filter(|n| !n.is_none()).map(byte_count).transpose()?;
    spill::set_memory_limit(&device, limit);
    Ok(())
}

/// The memory limit of `device` in bytes, or `None`. Raises `ValueError` when
/// `LAZYBUF_MEMORY_LIMIT` is malformed.
#[pyfunction]
pub(crate) fn get_memory_limit(device: &Bound<'_, PyAny>) -> PyResult<Option<u64>> {
    let device = crate::accelerator::device_arg(Some(device))?;
    spill::memory_limit(&device).or_py()
}

/// The bytes of device memory lazybuf holds on `device` (what the limit is checked against).
#[pyfunction]
pub(crate) fn memory_held(device: &Bound<'_, PyAny>) -> PyResult<u64> {
    Ok(spill::memory_held(&crate::accelerator::device_arg(Some(device))?))
}

/// What spilling did on `device`, as a dict: evictions, clean_evictions (those that moved no
/// byte), bytes_written_back, bytes_read_back, bytes_to_disk and bytes_from_disk (host copies
/// of its buffers written to and read back from spill files), stale_host_frees (stale host
/// copies of its buffers freed for the host limit), spill_requests, spill_failures, seconds.
#[pyfunction]
pub(crate) fn spill_stats<'py>(py: Python<'py>, device: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyDict>> {
    let stats = spill::spill_stats(&crate::accelerator::device_arg(Some(device))?);
    let dict = PyDict::new(py);
    dict.set_item("evictions", stats.evictions)?;
    dict.set_item("clean_evictions", stats.clean_evictions)?;
    dict.set_item("bytes_written_back", stats.bytes_written_back)?;
    dict.set_item("bytes_read_back", stats.bytes_read_back)?;
    dict.set_item("bytes_to_disk", stats.bytes_to_disk)?;
    dict.set_item("bytes_from_disk", stats.bytes_from_disk)?;
    dict.set_item("stale_host_frees", stats.stale_host_frees)?;
    dict.set_item("spill_requests", stats.spill_requests)?;
    dict.set_item("spill_failures", stats.spill_failures)?;
    dict.set_item("seconds", stats.seconds)?;
    Ok(dict)
}

/// Sets the spill counters of `device` to zero.
#[pyfunction]
pub(crate) fn reset_spill_stats(device: &Bound<'_, PyAny>) -> PyResult<()> {
    spill::reset_spill_stats(&crate::accelerator::device_arg(Some(device))?);
    Ok(())
}

/// Sets the host memory limit to `nbytes` (an int, or a size string such as "8GiB"); `None`
/// removes it. Above it, lazybuf writes host copies that are a buffer's only data to spill
/// files (`LAZYBUF_SPILL_DIR`) before it allocates more host memory; not while a host view,
/// buffer-protocol export or DLPack tensor of the buffer lives.
#[pyfunction]
#[pyo3(signature = (nbytes))]
pub(crate) fn set_host_memory_limit(nbytes: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
    let limit = nbytes.filter(|n| !n.is_none()).map(byte_count).transpose()?;
    spill::set_host_memory_limit(limit);
    Ok(())
}

/// The host memory limit in bytes, or `None`.
#[pyfunction]
pub(crate) fn get_host_memory_limit() -> Option<u64> {
    spill::host_memory_limit()
}

/// The bytes of host memory lazybuf holds (what the host limit is checked against).
#[pyfunction]
pub(crate) fn host_memory_held() -> u64 {
    spill::host_memory_held()
}

/// Removes the spill files this process still has (at the end of a `multiprocessing` child;
/// at interpreter exit through [`_remove_spill_files_at_finalization`]).
#[pyfunction]
pub(crate) fn _remove_spill_files() -> usize {
    spill::disk::remove_spill_files()
}

/// The `Py_AtExit` callback: runs once the interpreter has finished, calls no Python.
extern "C" fn remove_spill_files_at_exit() {
    // Nothing may unwind out of a C callback; a failure leaves the files, as a killed process.
    let _ = std::panic::catch_unwind(spill::disk::remove_spill_files);
}

/// Has the spill files removed when the interpreter has finished (`Py_AtExit`): after every
/// `atexit` handler (those registered before `import lazybuf` run after its own) and every
/// finalizer of the modules' teardown, which may all still read buffers spilled to disk (an
/// `atexit` handler of lazybuf's own removed the files before them: the twenty-first hostile
/// pass). Once per process; false where CPython has no room for another such function (the
/// caller then uses `atexit`).
#[pyfunction]
pub(crate) fn _remove_spill_files_at_finalization() -> bool {
    static REGISTERED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if REGISTERED.load(std::sync::atomic::Ordering::Acquire) {
        return true;
    }
    // SAFETY: called with the GIL held (a pyfunction); Py_AtExit takes a plain C function,
    // which calls no Python API and cannot unwind (catch_unwind above).
    let registered = unsafe { pyo3::ffi::Py_AtExit(Some(remove_spill_files_at_exit)) } == 0;
    REGISTERED.store(registered, std::sync::atomic::Ordering::Release);
    registered
}

/// Adds the functions to the module.
pub(crate) fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(set_memory_limit, m)?)?;
    m.add_function(wrap_pyfunction!(get_memory_limit, m)?)?;
    m.add_function(wrap_pyfunction!(memory_held, m)?)?;
    m.add_function(wrap_pyfunction!(spill_stats, m)?)?;
    m.add_function(wrap_pyfunction!(reset_spill_stats, m)?)?;
    m.add_function(wrap_pyfunction!(set_host_memory_limit, m)?)?;
    m.add_function(wrap_pyfunction!(get_host_memory_limit, m)?)?;
    m.add_function(wrap_pyfunction!(host_memory_held, m)?)?;
    m.add_function(wrap_pyfunction!(_remove_spill_files, m)?)?;
    m.add_function(wrap_pyfunction!(_remove_spill_files_at_finalization, m)?)?;
    Ok(())
}
