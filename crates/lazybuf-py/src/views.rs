//! The binding's raw-memory edge: where a buffer's Rust-owned memory is shared with Python.
//!
//! A buffer's [`RawBuffer`] lives in a [`Storage`] behind an `Arc`. Everything Python can hold
//! that points into the memory (NumPy views, buffer-protocol exports, DLPack capsules,
//! PyOpenCL and CuPy arrays) holds a clone of that `Arc`, through a [`MemoryOwner`] object
//! (a NumPy view's `.base`) or directly. So the memory is freed, or returned to its pool, only
//! when the buffer *and* every such view are gone: a view that outlives its buffer, or a
//! buffer released to a pool while views of it exist, never reads freed memory.
//!
//! That clone is an [`Exposure`]: each handle or address handed out comes with one, counted
//! in the storage's [`crate::spill_state::SpillState`] while it lives, so eviction and the
//! disk tier skip the memory exactly while an object lazybuf cannot see may use it.
//!
//! Every pointer this module hands to Python comes from the storage it is tied to; the
//! exports built on them (buffer protocol, DLPack, CAI) live in [`crate::interop`], and each
//! `unsafe` block elsewhere in the binding says why it holds. The host block of a `RawBuffer` never moves once
//! allocated: it is freed only when the `RawBuffer` is dropped
//! (the binding never calls `release_memory`), and an access that fails frees only blocks it
//! allocated itself, which no view can have seen.
//!
//! A host block may also be a frame Dask received, adopted as the host copy
//! ([`Storage::adopt_frame`]): the buffer then holds that frame's memoryview until it is
//! dropped, and no two buffers ever adopt overlapping bytes.
//!
//! What does not live here: coherence (each function makes one access on the core buffer and
//! lets it decide what moves) and the choice of access (the `UnifiedBuffer` methods).

use std::collections::BTreeMap;
use std::ffi::{c_int, c_void};
use std::ops::Range;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, MutexGuard};

use numpy::npyffi::{self, NPY_ARRAY_C_CONTIGUOUS, NPY_ARRAY_WRITEABLE, PY_ARRAY_API, npy_intp};
use numpy::{PyArrayDescr, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use lazybuf::backend::RawMemory;
use lazybuf::backend::fork::ForkAwareMutex;
use lazybuf::coherence::{Access, Location, Residency};
use lazybuf::host_memory::{ForeignHostMemory, HostMemory, copy_bytes, fill_pattern};
use lazybuf::observe::Cause;
use lazybuf::resource::{MemoryResource, default_resource};
use lazybuf::{Device, RawBuffer, Ticket};

use crate::errors::OrPyErr;
use crate::hostbuf::HostBuffer;
use crate::lock::{self, Detached, GilFreeGuard, GilFreeMutex};
use crate::spill_state::Exposed;

/// A buffer's memory, shared by the buffer and every view of it.
pub(crate) struct Storage {
    /// Waited for only with the GIL released, never by the thread holding it ([`crate::lock`]).
    raw: GilFreeMutex<RawBuffer>,
    /// Whether a CuPy array over the device copy was handed out: from then on each call on
    /// the buffer orders lazybuf after CuPy's current stream ([`crate::streams::order_after_cupy`]).
    /// It stays set once the arrays are gone (unlike their exposure): kernels CuPy enqueued
    /// through them may still be pending on that stream.
    cupy_held: AtomicBool,
    /// Its standing with eviction ([`crate::spill`]).
    spill: crate::spill_state::SpillState,
}

/// Keeps a buffer's memory alive: the `.base` of every NumPy view lazybuf makes, and the
/// owner attached to PyOpenCL and CuPy arrays, device views and device frames. It holds the
/// [`Exposure`] of the handle or address the object uses, so the buffer's memory is not
/// evicted (or written to disk) while the object lives, and is again once it is gone.
#[pyclass(name = "MemoryOwner", module = "lazybuf", frozen)]
pub(crate) struct MemoryOwner {
    /// `None` only inside its drop.
    exposure: Option<Exposure>,
}

#[pymethods]
impl MemoryOwner {
    fn __repr__(&self, py: Python<'_>) -> String {
        let Some(exposure) = &self.exposure else { return "<lazybuf.MemoryOwner>".to_string() };
        let kind = match exposure.kind() {
            Exposed::Device => "device",
            Exposed::Host => "host",
        };
        match exposure.storage().lock(py) {
            Ok(raw) => format!("<lazybuf.MemoryOwner of {} bytes ({kind} memory in use)>", raw.nbytes()),
            Err(_) => format!("<lazybuf.MemoryOwner of a buffer in use ({kind} memory in use)>"),
        }
    }
}

impl MemoryOwner {
    /// An owner that keeps the exposed storage alive and its memory in use.
    pub(crate) fn new(exposure: Exposure) -> Self {
        MemoryOwner { exposure: Some(exposure) }
    }
}

impl Drop for MemoryOwner {
    /// The owner of a CuPy array's memory orders lazybuf's next work on the copy after CuPy's
    /// current stream at once, where that waits for nothing (the storage's lock is free), so
    /// the copy is evictable as soon as the array is gone; else its exposure marks the storage
    /// until the next call on the buffer does it (`SpillState::cupy_unordered`). Without it a
    /// buffer whose CuPy array was gone stayed unevictable until that call (an H200,
    /// 2026-11-27). The exposure then ends, and when it held the buffer's last reference, the
    /// memory goes with the GIL released if transfers are in flight ([`Storage::drop_last`]).
    fn drop(&mut self) {
        let Some(mut exposure) = self.exposure.take() else { return };
        // SAFETY: a MemoryOwner lives only inside its Python object, whose deallocation runs
        // with the interpreter attached to this thread; `py` is used within this call.
        let py = unsafe { Python::assume_attached() };
        // An array freed while an exception propagates (a temporary `.device` in a call that
        // raised) is dropped with that exception set: calling into CuPy then would fetch and
        // lose it (the interpreter crashed, a hostile pass of 2026-11-27). The copy is then
        // kept until the next call orders it, as before.
        // SAFETY: PyErr_Occurred only reads this thread's exception state (attached, above).
        let raising = || !unsafe { pyo3::ffi::PyErr_Occurred() }.is_null();
        if exposure.cupy && !raising() && exposure.storage.order_after_cupy_now(py).unwrap_or(false) {
            exposure.cupy = false;
        }
        Storage::drop_last(py, exposure.into_storage());
    }
}

/// One live exposure of a storage's memory: counted from [`Exposure::new`] (under the storage
/// lock) until it is dropped. Keeps the storage alive, so whatever holds it keeps the memory.
pub(crate) struct Exposure {
    storage: Arc<Storage>,
    kind: Exposed,
    /// Held by a CuPy array: its drop marks the storage until lazybuf is ordered after CuPy.
    cupy: bool,
}

impl Exposure {
    /// Counts one exposure of `kind`. Call with the storage's lock held, before the handle or
    /// address leaves it.
    pub(crate) fn new(storage: &Arc<Storage>, kind: Exposed) -> Self {
        storage.spill().begin_exposure(kind);
        Exposure { storage: Arc::clone(storage), kind, cupy: false }
    }

    /// The storage whose memory is exposed.
    pub(crate) fn storage(&self) -> &Arc<Storage> {
        &self.storage
    }

    /// Ends the exposure; the storage, still referenced.
    pub(crate) fn into_storage(self) -> Arc<Storage> {
        let storage = Arc::clone(&self.storage);
        drop(self);
        storage
    }

    /// What is exposed.
    pub(crate) fn kind(&self) -> Exposed {
        self.kind
    }

    /// Marks this exposure as a CuPy array's (see `SpillState::cupy_unordered`).
    pub(crate) fn held_by_cupy(&mut self) {
        self.cupy = true;
    }
}

impl std::fmt::Debug for Exposure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exposure").field("kind", &self.kind).field("cupy", &self.cupy).finish()
    }
}

impl Drop for Exposure {
    fn drop(&mut self) {
        let state = self.storage.spill();
        if self.cupy {
            // Set before the count drops, so no eviction sees neither.
            state.set_cupy_unordered();
        }
        // Atomic, without the lock or the interpreter: any thread may drop it.
        state.end_exposure(self.kind);
    }
}

/// `to_numpy()` arrays of this many bytes and more own a block from lazybuf's caching
/// resource instead of NumPy's allocator: from here on glibc maps fresh pages for each array
/// (its dynamic mmap threshold tops out at 32 MiB), and each page faults at the copy.
pub(crate) const OWNED_BLOCK_MIN: usize = 1 << 20;

/// Host memory from a memory resource that a NumPy array owns: the `.base` of the arrays
/// `to_numpy()` returns from 1 MiB (`OWNED_BLOCK_MIN`) up. The memory goes back to the
/// resource (lazybuf's cache, by default) when the array is gone.
#[pyclass(name = "HostBlock", module = "lazybuf", frozen)]
pub(crate) struct HostBlock {
    device: Device,
    resource: Arc<dyn MemoryResource>,
    block: Option<HostMemory>,
}

#[pymethods]
impl HostBlock {
    fn __repr__(&self) -> String {
        format!("<lazybuf.HostBlock of {} bytes>", self.block.as_ref().map_or(0, HostMemory::len))
    }
}

impl Drop for HostBlock {
    fn drop(&mut self) {
        if let Some(block) = self.block.take() {
            self.resource.deallocate_host(&self.device, block, Ticket::done());
        }
    }
}

impl Drop for Storage {
    /// The last reference to a buffer's memory: the core buffer's drop waits for its transfers
    /// in flight. On a thread holding the GIL that wait runs with the GIL released, so other
    /// threads run meanwhile, one whose work a transfer waits for (a PyOpenCL user event, a
    /// stream ordered after it) included: a drop that waited with the GIL held hung there.
    /// Wherever the last reference goes: a buffer object's deallocation, `release()`, a view's
    /// owner, an export released after the buffer let its memory go, the reference a method
    /// holds for its call when another thread released the buffer meanwhile (the fifteenth
    /// hostile pass: each hung), a DLPack deleter the consumer runs with the GIL held.
    fn drop(&mut self) {
        let raw = self.raw.get_mut();
        if raw.is_busy() && holds_gil() {
            // SAFETY: this thread holds the GIL (`holds_gil`); `py` is used within this call.
            let py = unsafe { Python::assume_attached() };
            // Waits for the transfers and lets the memory go; the core buffer's own drop then
            // has nothing left to do.
            py.detach(|| raw.release_memory());
        }
    }
}

/// Whether the calling thread holds the GIL: CPython's `PyGILState_Check`, which the limited
/// API leaves out but every CPython since 3.4 exports with this signature (resolved when the
/// extension is loaded, from the interpreter's own symbols), and whose answer is exact unless
/// sub-interpreters were made (PyO3 modules refuse to load in them).
#[cfg(not(windows))]
fn holds_gil() -> bool {
    unsafe extern "C" {
        fn PyGILState_Check() -> c_int;
    }
    // SAFETY: both may be called from any thread at any time (CPython's documentation); the
    // check runs only while the interpreter is initialized.
    unsafe { pyo3::ffi::Py_IsInitialized() != 0 && PyGILState_Check() == 1 }
}

/// On Windows an abi3 extension links against `python3.dll`, which exports the limited API
/// only: `PyGILState_Check` would not link. Not known there, so [`Storage`]'s drop waits as the
/// core's drop does ([`Storage::drop_last`] still releases the GIL where the caller holds it).
#[cfg(windows)]
fn holds_gil() -> bool {
    false
}

/// The address ranges of the frames buffers have adopted (start -> end), so that no two
/// buffers ever adopt the same bytes. Fork-aware (a frame is given back by a buffer's drop,
/// also without the GIL): `None` in a forked child whose parent's thread held it at the fork,
/// where nothing is adopted any more (the frame is copied instead).
fn adopted_frames() -> Option<MutexGuard<'static, BTreeMap<usize, usize>>> {
    static FRAMES: ForkAwareMutex<BTreeMap<usize, usize>> = ForkAwareMutex::unwatched(BTreeMap::new());
    FRAMES.lock()
}

/// A frame lent to a buffer as its host copy: the buffer's own memoryview over it (which holds
/// the frame's export, so the bytes stay where they are) and the addresses it covers.
struct LentFrame {
    /// Dropped without the GIL too: pyo3 then defers the reference's release.
    _view: Py<PyAny>,
    range: Range<usize>,
}

impl ForeignHostMemory for LentFrame {}

impl Drop for LentFrame {
    fn drop(&mut self) {
        if let Some(mut frames) = adopted_frames() {
            frames.remove(&self.range.start);
        }
    }
}

/// Makes `raw`'s host current for `access` and returns the address of its bytes.
fn host_address_in(raw: &mut RawBuffer, access: Access) -> PyResult<*mut u8> {
    let bytes = raw.host_access(access).or_py()?;
    Ok(if bytes.is_empty() { empty_address() } else { bytes.as_mut_ptr() })
}

/// Makes `raw`'s copy on `device` current for `access` and returns the runtime's handle to it.
fn device_handle_in(
    raw: &mut RawBuffer,
    device: &Device,
    access: Access,
    call: Cause,
) -> PyResult<RawMemory> {
    let mut raw = raw.as_call(call);
    let memory = raw.device_access(device, access).or_py()?;
    // SAFETY: the handle is only passed to Python together with an owner of this storage (a
    // MemoryOwner or a clone of the Arc), so it stays valid as long as it is reachable; writes
    // through it bypass tracking, which is why the binding counts device views as device
    // writes.
    Ok(unsafe { memory.raw() })
}

/// An address for empty views: NumPy wants a non-null, aligned pointer even for no bytes.
fn empty_address() -> *mut u8 {
    #[repr(align(64))]
    struct Line;
    NonNull::<Line>::dangling().as_ptr().cast()
}

impl Storage {
    /// Wraps a core buffer.
    pub(crate) fn new(raw: RawBuffer) -> Arc<Storage> {
        let raw = GilFreeMutex::new(raw, "UnifiedBuffer");
        let storage = Arc::new(Storage { raw, cupy_held: AtomicBool::new(false), spill: Default::default() });
        // A candidate for eviction for as long as it lives (crate::spill says how).
        let weak: std::sync::Weak<Storage> = Arc::downgrade(&storage);
        lazybuf::spill::registry::register(weak);
        storage
    }

    /// Its standing with eviction.
    pub(crate) fn spill(&self) -> &crate::spill_state::SpillState {
        &self.spill
    }

    /// The core buffer if its lock is free (eviction never waits for it).
    pub(crate) fn try_lock_raw(&self) -> Option<GilFreeGuard<'_, RawBuffer>> {
        self.raw.try_lock()
    }

    /// Orders lazybuf's next work on the device copy after CuPy's current stream without
    /// waiting for anything: the lock taken only if it is free (`Ok(false)` otherwise, nothing
    /// done), CuPy asked for its stream before; nothing to do for the legacy default stream,
    /// which lazybuf's blocking stream is ordered with already. For the drop of a CuPy array's
    /// owner, which holds the interpreter (`MemoryOwner`'s drop).
    pub(crate) fn order_after_cupy_now(&self, py: Python<'_>) -> PyResult<bool> {
        let Some(home) = self.try_lock_raw().map(|raw| raw.home().clone()) else {
            return Ok(false);
        };
        let Some((handle, stream)) = cupy_current_stream(py, &home)? else {
            return Ok(true);
        };
        if handle == 0 {
            return Ok(true);
        }
        let Some(mut buffer) = self.try_lock_raw() else {
            return Ok(false);
        };
        let ticket = stream.marker().or_py()?;
        buffer.used_until(&home, ticket);
        Ok(true)
    }

    /// Drops `storage`, a reference to a buffer's memory, on a thread holding the GIL: when it
    /// is the last and transfers are in flight (the core buffer's drop waits for them), with
    /// the GIL released, so other threads run meanwhile. ([`Storage`]'s drop does the same for
    /// a last reference dropped anywhere else with the GIL held; this one saves the check.)
    pub(crate) fn drop_last(py: Python<'_>, storage: Arc<Storage>) {
        let busy =
            Arc::strong_count(&storage) == 1 && storage.try_lock_raw().is_some_and(|raw| raw.is_busy());
        if busy {
            py.detach(move || drop(storage));
        }
    }

    /// Records that CuPy holds an array over the device copy.
    pub(crate) fn mark_cupy_held(&self) {
        self.cupy_held.store(true, Ordering::Relaxed);
    }

    /// Whether CuPy was handed an array over the device copy.
    pub(crate) fn cupy_held(&self) -> bool {
        self.cupy_held.load(Ordering::Relaxed)
    }

    /// The core buffer, from a thread attached to the interpreter: waited for with the GIL
    /// released; `ReentrancyError` on the thread that holds it already ([`crate::lock`]).
    pub(crate) fn lock(&self, py: Python<'_>) -> PyResult<GilFreeGuard<'_, RawBuffer>> {
        let raw = self.raw.lock(py)?;
        self.spill.touch();
        Ok(raw)
    }

    /// The core buffer, from a detached thread (inside [`lock::detach`]).
    pub(crate) fn lock_detached(&self, detached: &Detached) -> PyResult<GilFreeGuard<'_, RawBuffer>> {
        let raw = self.raw.lock_detached(detached)?;
        self.spill.touch();
        Ok(raw)
    }

    /// Makes the host current for `access` and returns the address of its bytes, with the
    /// exposure the caller hands to whatever uses the address (see [`crate::spill_state`]).
    pub(crate) fn host_address(
        self: &Arc<Self>,
        detached: &Detached,
        access: Access,
    ) -> PyResult<(*mut u8, Exposure)> {
        let mut raw = self.lock_detached(detached)?;
        // The address leaves the lock: counted before it does, while the lock is held.
        let exposure = Exposure::new(self, Exposed::Host);
        Ok((host_address_in(&mut raw, access)?, exposure))
    }

    /// [`Self::host_address`] with the GIL released (it may copy), so other Python threads
    /// run meanwhile (the core may call Python while it holds the storage lock, through a
    /// memory resource's failure callback; [`crate::lock`] says why that cannot deadlock).
    ///
    /// When the access is bookkeeping only and the storage lock is free, it is made in place,
    /// with the GIL held ([`Self::immediate`]).
    pub(crate) fn host_address_nogil(
        self: &Arc<Self>,
        py: Python<'_>,
        access: Access,
    ) -> PyResult<(*mut u8, Exposure)> {
        if let Some(mut raw) = self.immediate(None, access) {
            let exposure = Exposure::new(self, Exposed::Host);
            return Ok((host_address_in(&mut raw, access)?, exposure));
        }
        let (address, exposure) =
            lock::detach(py, |d| self.host_address(d, access).map(|(a, e)| (a as usize, e)))?;
        Ok((address as *mut u8, exposure))
    }

    /// The core buffer, locked, when an access for `access` on `device` (the host when `None`)
    /// is bookkeeping only ([`RawBuffer::access_is_immediate`]) and the lock is free: the
    /// `_nogil` methods then make the access in place, with the GIL held, since releasing and
    /// retaking the GIL cost more than the access (about 40% of a `.host`; callgrind,
    /// docs/BENCHMARKS.md). No deadlock: this never waits for the storage lock while the GIL is
    /// held (`try_lock`), and an immediate access waits for nothing.
    fn immediate(&self, device: Option<&Device>, access: Access) -> Option<GilFreeGuard<'_, RawBuffer>> {
        let raw = self.raw.try_lock()?;
        let immediate = raw.access_is_immediate(device, access).then_some(raw);
        if immediate.is_some() {
            self.spill.touch();
        }
        immediate
    }

    /// [`Self::device_handle`] with the GIL released (it may copy); in place when the access
    /// is bookkeeping only ([`Self::immediate`]).
    pub(crate) fn device_handle_nogil(
        self: &Arc<Self>,
        py: Python<'_>,
        device: &Device,
        access: Access,
        call: Cause,
    ) -> PyResult<(RawMemory, Exposure)> {
        if let Some(mut raw) = self.immediate(Some(device), access) {
            // The handle leaves the lock: counted before it does, while the lock is held.
            let exposure = Exposure::new(self, Exposed::Device);
            return Ok((device_handle_in(&mut raw, device, access, call)?, exposure));
        }
        /// A handle crossing the detached closure's boundary.
        struct Handle(RawMemory);
        // SAFETY: the handle is an opaque value (a pointer or a runtime handle) that is only
        // moved out of the closure, on the same thread; nothing dereferences it on the way.
        unsafe impl Send for Handle {}
        let (handle, exposure) =
            lock::detach(py, |d| self.device_handle(d, device, access, call).map(|(h, e)| (Handle(h), e)))?;
        Ok((handle.0, exposure))
    }

    /// Makes the host copy current for `access` (a sync, or a declared write), with the GIL
    /// released unless the access is bookkeeping only; no address leaves the lock, so the host
    /// copy stays spillable ([`crate::spill`]).
    pub(crate) fn sync_host_nogil(&self, py: Python<'_>, access: Access) -> PyResult<()> {
        if let Some(mut raw) = self.immediate(None, access) {
            return raw.host_access(access).map(drop).or_py();
        }
        lock::detach(py, |d| self.lock_detached(d)?.host_access(access).map(drop).or_py())
    }

    /// Makes `device`'s copy current for `access` (a sync, or a declared write), with the GIL
    /// released unless the access is bookkeeping only; no handle leaves the lock, so the copy
    /// stays evictable ([`crate::spill`]).
    pub(crate) fn sync_device_nogil(&self, py: Python<'_>, device: &Device, access: Access) -> PyResult<()> {
        if let Some(mut raw) = self.immediate(Some(device), access) {
            return raw.device_access(device, access).map(drop).or_py();
        }
        lock::detach(py, |d| self.lock_detached(d)?.device_access(device, access).map(drop).or_py())
    }

    /// [`Self::device_handle_nogil`] for a read, in the order of the copy's stream
    /// ([`RawBuffer::device_access_ordered`]): an upload it needs is enqueued and not waited
    /// for, and the ticket returned (done when there is none) completes when it has. The
    /// caller orders the handle's consumer after that ticket.
    pub(crate) fn device_handle_ordered_nogil(
        self: &Arc<Self>,
        py: Python<'_>,
        device: &Device,
        call: Cause,
    ) -> PyResult<(RawMemory, Exposure, Ticket)> {
        if let Some(mut raw) = self.immediate(Some(device), Access::Read) {
            let exposure = Exposure::new(self, Exposed::Device);
            return Ok((device_handle_in(&mut raw, device, Access::Read, call)?, exposure, Ticket::done()));
        }
        /// A handle and a ticket crossing the detached closure's boundary.
        struct Handle(RawMemory, Ticket);
        // SAFETY: the handle is an opaque value (a pointer or a runtime handle) that is only
        // moved out of the closure, on the same thread; nothing dereferences it on the way.
        // The ticket is Send itself.
        unsafe impl Send for Handle {}
        let (handle, exposure) = lock::detach(py, |d| {
            let mut raw = self.lock_detached(d)?;
            let mut raw = raw.as_call(call);
            let exposure = Exposure::new(self, Exposed::Device);
            let (memory, ticket) = raw.device_access_ordered(device).or_py()?;
            // SAFETY: as in device_handle_in: the handle reaches Python only with an owner of
            // this storage.
            Ok::<_, PyErr>((Handle(unsafe { memory.raw() }, ticket), exposure))
        })?;
        Ok((handle.0, exposure, handle.1))
    }

    /// Makes `device`'s copy current for `access` and returns the runtime's handle to it,
    /// with the exposure the caller hands to whatever uses the handle.
    pub(crate) fn device_handle(
        self: &Arc<Self>,
        detached: &Detached,
        device: &Device,
        access: Access,
        call: Cause,
    ) -> PyResult<(RawMemory, Exposure)> {
        let mut raw = self.lock_detached(detached)?;
        // The handle leaves the lock: counted before it does, while the lock is held.
        let exposure = Exposure::new(self, Exposed::Device);
        Ok((device_handle_in(&mut raw, device, access, call)?, exposure))
    }

    /// A NumPy view of the host copy, made current for `access`. `cached` is returned when it
    /// is still exactly that view (same memory, shape, dtype and writeability).
    pub(crate) fn host_array<'py>(
        self: &Arc<Self>,
        py: Python<'py>,
        access: Access,
        shape: &[usize],
        descr: &Bound<'py, PyArrayDescr>,
        cached: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (address, exposure) = self.host_address_nogil(py, access)?;
        // SAFETY: the address is this storage's host block; the caller's shape and dtype are
        // the buffer's own.
        unsafe { self.array_at(py, address, exposure, shape, descr, access != Access::Read, cached) }
    }

    /// On the host device, makes the buffer's device copy (an alias of the host block)
    /// current for `access`, with the GIL released, and returns its address for
    /// [`Self::array_at`] (always writable there: this memory is every copy at once, so
    /// writes cannot make copies disagree; the seeds: `.device` is "the same NumPy array as
    /// host"), with its (device) exposure.
    pub(crate) fn host_device_address(
        self: &Arc<Self>,
        py: Python<'_>,
        device: &Device,
        access: Access,
        call: Cause,
    ) -> PyResult<(*mut u8, Exposure)> {
        let (handle, exposure) = self.device_handle_nogil(py, device, access, call)?;
        match handle.host_ptr() {
            Some(address) if !address.is_null() => Ok((address, exposure)),
            Some(_) => Ok((empty_address(), exposure)),
            None => {
                Err(PyValueError::new_err(format!("expected host memory on the host device, got {handle:?}")))
            }
        }
    }

    /// The NumPy view of this storage's host memory at `address`, or `cached` if it is it. A
    /// new view's base holds `exposure` (the one that came with the address); with `cached`,
    /// it is dropped (the cached view holds its own).
    ///
    /// # Safety
    /// `address` must come from [`Self::host_address`], [`Self::host_address_nogil`] or
    /// [`Self::host_device_address`] of this same storage (valid for its nbytes while the
    /// storage lives), and `shape` and `descr` must describe exactly the buffer's nbytes.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn array_at<'py>(
        self: &Arc<Self>,
        py: Python<'py>,
        address: *mut u8,
        exposure: Exposure,
        shape: &[usize],
        descr: &Bound<'py, PyArrayDescr>,
        writeable: bool,
        cached: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if let Some(cached) = cached
            && is_view(cached, address, shape, descr, writeable)
        {
            return Ok(cached.clone());
        }
        let owner = Bound::new(py, MemoryOwner::new(exposure))?.into_any();
        // SAFETY: the caller's contract: address is this storage's host block (or the host
        // device's alias of it, or the empty address for zero bytes), valid for the buffer's
        // nbytes = prod(shape) * itemsize bytes for as long as the storage lives; `owner`
        // keeps the storage alive and becomes the array's base.
        unsafe { ndarray(py, address, shape, descr, writeable, owner) }
    }

    /// Makes the bytes of `frame`, a writable, contiguous 1-d memoryview of bytes of the
    /// buffer's exact size that only this call holds (the caller made it), the buffer's host
    /// copy without copying them (HOST_ONLY): the buffer keeps `frame` until it is dropped.
    /// `Ok(false)`, with nothing changed, when the bytes cannot be adopted: the buffer holds
    /// memory already, the frame is read-only or of another size, or another buffer adopted
    /// some of these bytes already. The caller vouches that nothing else writes the frame's
    /// bytes from now on (a frame distributed received is deserialized once).
    pub(crate) fn adopt_frame(&self, frame: &Bound<'_, PyAny>) -> PyResult<bool> {
        let range = match HostBuffer::get(frame, true, "a received frame") {
            Ok(export) => export.range(),
            Err(_) => return Ok(false),
        };
        let Some(start) = NonNull::new(range.start as *mut u8) else { return Ok(false) };
        let mut raw = self.lock(frame.py())?;
        if range.len() != raw.nbytes() || range.is_empty() {
            return Ok(false);
        }
        let Some(mut frames) = adopted_frames() else { return Ok(false) };
        if frames.range(..range.end).next_back().is_some_and(|(_, &end)| end > range.start) {
            return Ok(false);
        }
        frames.insert(range.start, range.end);
        drop(frames);
        let lent = LentFrame { _view: frame.clone().unbind(), range: range.clone() };
        // SAFETY: the frame's memoryview keeps its export, and so the bytes at
        // [start, start + len), valid and initialized, until `lent` drops it; it is this
        // call's own memoryview, which nobody can release; the registry above keeps every
        // other buffer off these bytes, and the caller vouches that nothing else writes them.
        let block = unsafe { HostMemory::adopt(start, range.len(), Box::new(lent)) };
        // A refused block is dropped: its bytes go back to the frame and leave the registry.
        Ok(raw.adopt_host(block).is_ok())
    }

    /// Whether an assignment of every element from `source` (an array, or `None` for a
    /// number) should overwrite the host copy rather than write through `.host`: the host copy
    /// is not current (as the accesses so far committed it: `.host` would sync it first) or the
    /// coherence checker is on (`.host` would check old bytes the assignment never reads), and
    /// `source` does not overlap the host block (a view of it must see the sync's bytes).
    pub(crate) fn assignment_overwrites(
        &self,
        py: Python<'_>,
        source: Option<&Bound<'_, PyUntypedArray>>,
    ) -> PyResult<bool> {
        let raw = self.lock(py)?;
        if raw.residency_as_committed(lazybuf::coherence::Location::Host)
            == lazybuf::coherence::Residency::Valid
            && !lazybuf::checking::checking()
        {
            return Ok(false);
        }
        let (Some(source), Some(host)) = (source, raw.host_addresses()) else {
            return Ok(true);
        };
        Ok(byte_extent(source).is_none_or(|bytes| bytes.end <= host.start || host.end <= bytes.start))
    }

    /// Overwrites the host copy with the bytes of `src`, a C-contiguous array of the buffer's
    /// dtype and size (checked here; nothing changes when the check fails).
    ///
    /// Up to [`IN_PLACE_COPY_MAX`] bytes, the copy is made with the GIL held when the write
    /// waits for nothing ([`RawBuffer::host_overwrite_now`]: no transfer in flight, no device
    /// use, nothing on disk, and the host block there or ready in the resource's cache) and
    /// the storage lock is free: releasing and retaking the GIL costs more than such a copy.
    /// No deadlock: the storage lock is only tried, never waited for, and the access then takes
    /// no other lock than the cache's, which is held only for bookkeeping and never while
    /// waiting or running Python code; it waits for no device work, so no other thread (a
    /// Python one that would need the GIL to let the device go on, say) has to run first.
    ///
    /// `call` names its events when it is the buffer's own call (`copy_from()`); `None` leaves
    /// them to the call running on the thread (a deserialization that writes the bytes).
    pub(crate) fn copy_from_array(
        &self,
        src: &Bound<'_, PyUntypedArray>,
        call: Option<Cause>,
    ) -> PyResult<()> {
        let itemsize = src.dtype().itemsize();
        let nbytes = src.len() * itemsize;
        let contiguous = src.is_c_contiguous();
        // SAFETY: src is a live NumPy array (borrowed for this call); its fields are valid.
        let source = unsafe { (*npyffi::_PyArray_GET_ITEM_DATA(src.as_array_ptr())).data } as usize;
        if nbytes <= IN_PLACE_COPY_MAX
            && contiguous
            && let Some(mut raw) = self.raw.try_lock()
            && nbytes == raw.nbytes()
        {
            let mut raw = raw.as_call(call);
            if let Some(host) = raw.host_overwrite_now() {
                self.spill.touch();
                // SAFETY: `src` is held by the caller for this call: its n bytes stay where
                // they are.
                return unsafe { overwrite_host(host.or_py()?, source as *const u8) };
            }
        }
        // The copy runs without the GIL; `src` stays alive (the caller holds it) and cannot be
        // resized while referenced, so its bytes stay where they are.
        lock::detach(src.py(), |d| {
            let mut raw = self.lock_detached(d)?;
            if !contiguous || nbytes != raw.nbytes() {
                return Err(PyValueError::new_err(format!(
                    "copy_from: expected a C-contiguous array of {} bytes, got {nbytes} bytes",
                    raw.nbytes()
                )));
            }
            let mut raw = raw.as_call(call);
            let destination = raw.host_access(Access::Overwrite).or_py()?;
            // SAFETY: as above, `src` is held by the caller until this returns.
            unsafe { overwrite_host(destination, source as *const u8) }
        })
    }

    /// Opens a write through the host copy that a host write access handed out, which the
    /// caller makes outside the lock (NumPy's assignment), for [`Self::settle_host_write`] to
    /// close: until then the coherence checker does not compare the copies
    /// ([`RawBuffer::begin_outside_host_write`]).
    pub(crate) fn begin_host_write(&self, py: Python<'_>) -> PyResult<()> {
        self.lock(py)?.begin_outside_host_write();
        Ok(())
    }

    /// Closes the write [`Self::begin_host_write`] opened, which something may have changed
    /// meanwhile (code NumPy ran converting the assigned value, a finalizer, another thread).
    /// When `current` (this is still the buffer's memory): if the host copy went stale, the
    /// write went to a copy that is no longer the current one, and a `RuntimeError` says so
    /// (unless the write `succeeded` not: the caller raises its error); else the host copy,
    /// which holds what was written, is made the only current one again (an overwrite access:
    /// nothing is copied or checked; it changes nothing unless another copy was made current
    /// from the host copy before the write, a sync).
    pub(crate) fn settle_host_write(&self, py: Python<'_>, current: bool, succeeded: bool) -> PyResult<()> {
        let mut raw = self.lock(py)?;
        raw.end_outside_host_write();
        if !current {
            return Ok(());
        }
        if raw.residency(Location::Host) != Residency::Valid {
            if !succeeded {
                return Ok(());
            }
            return Err(host_went_stale());
        }
        raw.host_access(Access::Overwrite).or_py()?;
        Ok(())
    }

    /// Overwrites every element with `element` (one element's bytes), syncing nothing first:
    /// the host copy becomes the current one. Without the GIL.
    pub(crate) fn overwrite_with(&self, py: Python<'_>, element: &[u8]) -> PyResult<()> {
        lock::detach(py, |d| {
            let mut raw = self.lock_detached(d)?;
            let n = raw.nbytes();
            let host = raw.host_access(Access::Overwrite).or_py()?;
            if let Some(host) = host.get_mut(..n) {
                fill_pattern(host, element);
            }
            Ok(())
        })
    }

    /// A new NumPy array holding a copy of the buffer's data ([`RawBuffer::read_into`]): one
    /// copy, straight from the device copy when the host
    /// copy is stale (which then stays stale; see [`RawBuffer::read_into`]).
    ///
    /// Arrays of [`OWNED_BLOCK_MIN`] bytes and more get their memory from the caching resource
    /// of the buffer's device (a [`HostBlock`] is their `.base`, and gives the memory back
    /// when the array is gone), so a loop that calls `to_numpy()` batch after batch reuses
    /// pages already faulted in (and on CUDA registered with the driver once reused) instead
    /// of mapping fresh ones; smaller arrays come from NumPy's allocator. A host copy runs on
    /// several threads when it is large ([`lazybuf::host_memory::copy_bytes`]).
    pub(crate) fn to_array<'py>(
        &self,
        py: Python<'py>,
        shape: &[usize],
        descr: &Bound<'py, PyArrayDescr>,
        call: Cause,
    ) -> PyResult<Bound<'py, PyAny>> {
        // The buffer's own shape and dtype: its size, without taking the lock for it (the
        // read below checks it against the buffer's).
        let n = shape.iter().product::<usize>() * descr.itemsize();
        if n >= OWNED_BLOCK_MIN {
            let device = self.lock(py)?.home().clone();
            let resource = default_resource(&device);
            let mut block = py.detach(|| resource.allocate_host(&device, n, false)).or_py()?;
            // The block is not shared yet: read into it (the GIL released), then wrap it. On a
            // failure it goes back to the resource it came from (its accounting included).
            let read =
                lock::detach(py, |d| self.lock_detached(d)?.as_call(call).read_into(&mut block).or_py());
            if let Err(err) = read {
                resource.deallocate_host(&device, block, Ticket::done());
                return Err(err);
            }
            let data = block.as_mut_ptr();
            let owner = Bound::new(py, HostBlock { device, resource, block: Some(block) })?.into_any();
            // SAFETY: the block holds at least n writable bytes, owned by `owner` (the array's
            // base) until the array is gone; nothing else references them.
            return unsafe { ndarray(py, data, shape, descr, true, owner) };
        }
        // SAFETY: a null data pointer makes NumPy allocate the array's own memory.
        let array = unsafe { ndarray_raw(py, ptr::null_mut(), shape, descr, true) }?;
        // SAFETY: array is the new NumPy array made above; its fields are valid.
        let data = unsafe { (*npyffi::_PyArray_GET_ITEM_DATA(array.as_ptr().cast())).data }.cast::<u8>();
        // SAFETY: the new array's data holds prod(shape) * itemsize = n bytes, and nothing
        // else references them until it is returned.
        unsafe { self.read_into_address(py, data, n, call) }?;
        Ok(array)
    }

    /// Copies the buffer's data into the `len` bytes at `address` ([`RawBuffer::read_into`],
    /// the GIL released): exactly the buffer's size, or a clear error that changes nothing.
    ///
    /// # Safety
    /// `address` is valid for writes of `len` bytes until this returns, and no other thread
    /// reads or writes them meanwhile (the caller holds the array they belong to, whose data
    /// cannot move or be freed while it is referenced).
    pub unsafe fn read_into_address(
        &self,
        py: Python<'_>,
        address: *mut u8,
        len: usize,
        call: Cause,
    ) -> PyResult<()> {
        /// The lender of a block [`HostMemory::adopt`] wraps for one read: owns nothing.
        struct Lent;
        impl ForeignHostMemory for Lent {}
        let address = address as usize;
        lock::detach(py, |d| {
            let mut raw = self.lock_detached(d)?;
            if len != raw.nbytes() {
                return Err(PyValueError::new_err(format!(
                    "expected {} bytes to copy into, got {len}",
                    raw.nbytes()
                )));
            }
            let Some(start) = NonNull::new(address as *mut u8).filter(|_| len > 0) else {
                return Ok(());
            };
            // SAFETY: the caller's contract: the bytes are writable for len bytes and no one
            // else uses them until this returns, which drops the block first. They are only
            // written through it (read_into downloads or copies into them).
            let mut block = unsafe { HostMemory::adopt(start, len, Box::new(Lent)) };
            raw.as_call(call).read_into(&mut block).or_py()
        })
    }

    /// Fills every element with the bytes of the 0-d array `value` (where the data is current).
    pub(crate) fn fill_from_scalar(&self, value: &Bound<'_, PyUntypedArray>) -> PyResult<()> {
        let n = value.dtype().itemsize();
        if value.len() != 1 || !value.is_c_contiguous() {
            return Err(PyValueError::new_err("fill: expected a single scalar value"));
        }
        // SAFETY: value is a live array holding exactly one element of n bytes.
        let pattern = unsafe {
            let data = (*npyffi::_PyArray_GET_ITEM_DATA(value.as_array_ptr())).data;
            std::slice::from_raw_parts(data.cast::<u8>(), n).to_vec()
        };
        lock::detach(value.py(), |d| self.lock_detached(d)?.fill(&pattern).or_py())
    }
}

/// `buf[key] = value`'s error when the host copy went stale during the assignment
/// ([`Storage::settle_host_write`]).
pub(crate) fn host_went_stale() -> PyErr {
    PyRuntimeError::new_err(
        "buf[key] = value: the buffer's host copy went stale while NumPy converted the key \
         or the value (code the conversion ran, or another thread, made another copy current: \
         mark_device_dirty(), .device_writable), so the assigned values are not in the current \
         copy; convert them before assigning",
    )
}

/// The most bytes [`Storage::copy_from_array`] copies with the GIL held.
const IN_PLACE_COPY_MAX: usize = 64 << 10;

/// Copies `destination.len()` bytes from `source` into `destination` (the host copy), as
/// NumPy's `a[...] = b` does when the two share bytes (an array over a frame the buffer
/// adopted, say).
///
/// # Safety
/// `source` is valid for reads of `destination.len()` bytes until this returns.
unsafe fn overwrite_host(destination: &mut [u8], source: *const u8) -> PyResult<()> {
    let n = destination.len();
    if n == 0 {
        return Ok(());
    }
    let destination = destination.as_mut_ptr();
    let overlap = (source as usize) < destination as usize + n && destination as usize <= source as usize + n;
    if overlap {
        // SAFETY: source is valid for n bytes (the caller's contract) and destination is the
        // host copy's n bytes; `ptr::copy` allows the two to overlap.
        unsafe { ptr::copy(source, destination, n) };
    } else {
        // SAFETY: as above; the two ranges do not overlap (checked above), so the slices
        // alias nothing.
        let (source, destination) = unsafe {
            (std::slice::from_raw_parts(source, n), std::slice::from_raw_parts_mut(destination, n))
        };
        copy_bytes(destination, source);
    }
    Ok(())
}

/// One value per dimension of an array (its dimensions or strides for NumPy or PyOpenCL):
/// on the stack up to 8 dimensions, on the heap beyond (a heap allocation and free per call
/// otherwise, on every small batch's path).
pub(crate) struct PerDim<T> {
    inline: [T; 8],
    heap: Vec<T>,
    len: usize,
}

impl<T: Copy + Default> PerDim<T> {
    /// `len` values, each `T::default()`.
    pub(crate) fn new(len: usize) -> Self {
        let heap = if len > 8 { vec![T::default(); len] } else { Vec::new() };
        PerDim { inline: [T::default(); 8], heap, len }
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [T] {
        if self.len <= self.inline.len() { &mut self.inline[..self.len] } else { &mut self.heap }
    }
}

/// Whether `array` is the NumPy view [`ndarray`] makes for these arguments (its metadata can
/// be changed in place from Python, e.g. `a.shape = ...`, so a cached view is checked).
fn is_view(
    array: &Bound<'_, PyAny>,
    address: *mut u8,
    shape: &[usize],
    descr: &Bound<'_, PyArrayDescr>,
    writeable: bool,
) -> bool {
    let Ok(array) = array.cast::<PyUntypedArray>() else {
        return false;
    };
    // SAFETY: array is a live NumPy array; its fields are valid while it is borrowed.
    let fields = unsafe { &*npyffi::_PyArray_GET_ITEM_DATA(array.as_array_ptr()) };
    let flags_ok =
        fields.flags & NPY_ARRAY_C_CONTIGUOUS != 0 && (fields.flags & NPY_ARRAY_WRITEABLE != 0) == writeable;
    fields.data.cast::<u8>() == address
        && fields.descr == descr.as_dtype_ptr()
        && flags_ok
        && array.shape() == shape
}

/// The addresses an array's elements span (`None`: it has none), from its data pointer,
/// shape and strides (negative strides included).
fn byte_extent(array: &Bound<'_, PyUntypedArray>) -> Option<Range<usize>> {
    let (shape, strides) = (array.shape(), array.strides());
    if shape.contains(&0) {
        return None;
    }
    // SAFETY: array is a live NumPy array; its fields are valid while it is borrowed.
    let data = unsafe { (*npyffi::_PyArray_GET_ITEM_DATA(array.as_array_ptr())).data } as isize;
    let (mut low, mut high) = (data, data);
    for (&n, &stride) in shape.iter().zip(strides) {
        let span = stride.saturating_mul(n as isize - 1);
        if span < 0 { low = low.saturating_add(span) } else { high = high.saturating_add(span) }
    }
    Some(low as usize..(high as usize).saturating_add(array.dtype().itemsize()))
}

/// A NumPy array over `address` whose base is `owner`.
///
/// # Safety
/// `address` must be valid for `prod(shape) * descr.itemsize` bytes (reads, and writes when
/// `writeable`) for as long as `owner` lives.
unsafe fn ndarray<'py>(
    py: Python<'py>,
    address: *mut u8,
    shape: &[usize],
    descr: &Bound<'py, PyArrayDescr>,
    writeable: bool,
    owner: Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: forwarded contract; address is non-null, so NumPy allocates nothing.
    let array = unsafe { ndarray_raw(py, address, shape, descr, writeable) }?;
    // SAFETY: array is a new NumPy array; SetBaseObject steals the owner reference, also
    // on failure.
    let status = unsafe { PY_ARRAY_API.PyArray_SetBaseObject(py, array.as_ptr().cast(), owner.into_ptr()) };
    if status < 0 {
        return Err(PyErr::fetch(py));
    }
    Ok(array)
}

/// `PyArray_NewFromDescr` for a C-contiguous array at `address` (null: NumPy allocates).
///
/// # Safety
/// A non-null `address` must be valid for the array's bytes while the array is used.
unsafe fn ndarray_raw<'py>(
    py: Python<'py>,
    address: *mut u8,
    shape: &[usize],
    descr: &Bound<'py, PyArrayDescr>,
    writeable: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let mut dims = PerDim::<npy_intp>::new(shape.len());
    let dims = dims.as_mut_slice();
    for (dim, &d) in dims.iter_mut().zip(shape) {
        *dim = d as npy_intp;
    }
    // With data, the flags are the array's (C order is asked for explicitly); without, NumPy
    // allocates a writable array and reads any non-zero flags as "Fortran order".
    let flags = match (address.is_null(), writeable) {
        (true, _) => 0,
        (false, true) => NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_WRITEABLE,
        (false, false) => NPY_ARRAY_C_CONTIGUOUS,
    };
    // SAFETY: the descriptor reference is stolen (into_dtype_ptr adds one); dims has ndim
    // entries; null strides ask for C order; the data contract is the caller's.
    let array = unsafe {
        PY_ARRAY_API.PyArray_NewFromDescr(
            py,
            npyffi::get_type_object(py, npyffi::NpyTypes::PyArray_Type),
            descr.clone().into_dtype_ptr(),
            dims.len() as c_int,
            dims.as_mut_ptr(),
            ptr::null_mut(),
            address.cast::<c_void>(),
            flags,
            ptr::null_mut(),
        )
    };
    // SAFETY: a new reference or null with an exception set.
    unsafe { Bound::from_owned_ptr_or_err(py, array) }
}

/// CuPy's current stream for `home` ([`crate::cupy_stream::current_stream`]) with its handle,
/// wrapped as a stream of `home` that lazybuf does not own; `None` where CuPy has no stream
/// for the device.
pub(crate) fn cupy_current_stream(
    py: Python<'_>,
    home: &Device,
) -> PyResult<Option<(usize, lazybuf::Stream)>> {
    let Some(handle) = crate::cupy_stream::current_stream(py, home)? else {
        return Ok(None);
    };
    let Some(raw) = device_handles(home).stream_from_int(handle) else {
        return Ok(None);
    };
    // SAFETY: CuPy's current stream for this device is a live stream of the device's primary
    // context, which lazybuf's CUDA devices use.
    let stream = unsafe { home.wrap_stream(raw) }.or_py()?;
    Ok(Some((handle, stream)))
}

/// The runtime handles of `device` (context, queue or stream), as integers for Python
/// libraries that wrap them (PyOpenCL retains what it wraps).
pub(crate) fn device_handles(device: &Device) -> lazybuf::backend::RawDevice {
    // SAFETY: the handles are borrowed from a device opened by discovery, which lives for the
    // whole process; Python wrappers that keep them retain them (PyOpenCL's retain=True).
    unsafe { device.raw() }
}
