//! Memory objects meeting other libraries' memory: the sources `copy_from_device` accepts.
//!
//! **Sources.** `copy_from_device(obj)` takes lazybuf's own memory objects and device buffers
//! (any kind, any device), a `UnifiedBuffer` (read through its host copy when the copy runs,
//! as `to_numpy()` reads: a read, never a write, and nothing read for a call refused first),
//! an object with `__cuda_array_interface__` (versions 0 to 3;
//! C-contiguous, no mask; its pointer must be memory of one of lazybuf's CUDA devices, found
//! with the driver; a v3 `stream` is waited for on the device), or a DLPack producer (CPU
//! tensors are the host device's memory, CUDA and CUDA-managed tensors that device's;
//! C-contiguous; producers from before DLPack 1.0 too, asked again without keywords as NumPy
//! does). Foreign memory is wrapped without copying or owning
//! ([`lazybuf::DeviceAllocation::borrowed`]) and kept alive (the producer object, or the
//! imported DLPack tensor) until the copy is done. Copies between devices go peer to peer
//! where the runtime can, else through the host.
//!
//! What does not live here: the copies themselves (the core's `DeviceAllocation`); exports
//! ([`crate::interop`]).

use std::ptr::NonNull;
use std::sync::Arc;

use dlpark::ffi::{DLDeviceType, DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION};
use dlpark::python::consumer::exchange::ExchangeApi;
use dlpark::python::{ImportedDlpack, from_dlpack};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict, PyInt};

use lazybuf::coherence::Access;
use lazybuf::host_memory::{ForeignHostMemory, HostMemory};
use lazybuf::{Device, DlpackDevice, Location, Memory, MemoryKind, Residency};

use crate::args::repr;
use crate::buffer::UnifiedBuffer;
use crate::device_buffer::{BufferCell, PyDeviceBuffer};
use crate::errors::OrPyErr;
use crate::gil_cell::interned;
use crate::interop::addresses_cuda;
use crate::lock::Detached;
use crate::memory::{MemoryCell, PyMemory};
use crate::views::{Storage, device_handles};

/// The device whose device memory DLPack calls `(device_type, device_id)`.
fn dlpack_owner(device_type: u32, device_id: i32) -> Option<Device> {
    let wanted = DlpackDevice { device_type, device_id };
    lazybuf::devices().into_iter().find(|d| d.info().dlpack_device(MemoryKind::Device) == Some(wanted))
}

/// Foreign memory at the integer `address` on `device`, wrapped without owning it.
///
/// # Safety
/// As for [`Memory::borrowed`]: the memory stays alive while the result is used.
unsafe fn borrowed(device: &Device, address: usize, nbytes: usize) -> PyResult<Memory> {
    let raw = device_handles(device)
        .memory_from_int(address)
        .ok_or_else(|| PyValueError::new_err(format!("{device} memory has no integer handle to borrow")))?;
    // SAFETY: the caller's promise.
    unsafe { Memory::borrowed(device, raw, nbytes) }.or_py()
}

/// Whether a copy from a `UnifiedBuffer` reads its home device's copy in place (only that copy
/// is current), not its host copy ([`Source::with`], [`Source::extent`]).
fn reads_home_copy(raw: &lazybuf::RawBuffer, home: &Device) -> bool {
    raw.residency(Location::Device(home.id())) == Residency::Valid
        && raw.residency(Location::Host) != Residency::Valid
}

/// Reads a `UnifiedBuffer`'s data into `staged` (its size) as the buffer's own download into
/// outside memory ([`lazybuf::RawBuffer::read_into`]), for a backend that cannot lend its
/// device memory ([`Source::with`]).
fn read_staged(raw: &mut lazybuf::RawBuffer, staged: &mut [u8]) -> PyResult<()> {
    /// The lender of the block [`HostMemory::adopt`] wraps for one read: owns nothing.
    struct Lent;
    impl ForeignHostMemory for Lent {}
    let Some(start) = NonNull::new(staged.as_mut_ptr()).filter(|_| !staged.is_empty()) else {
        return Ok(());
    };
    // SAFETY: `staged` is writable for its length and borrowed mutably until this returns,
    // which drops the block first; it is only written through it.
    let mut block = unsafe { HostMemory::adopt(start, staged.len(), Box::new(Lent)) };
    raw.read_into(&mut block).or_py()
}

/// What a copy of a [`Source`] into new memory needs to know first ([`Source::extent`]).
pub(crate) struct Extent {
    /// The bytes [`Source::with`] copies.
    pub(crate) nbytes: usize,
    /// The source's own device (a `UnifiedBuffer`'s home, whichever of its copies is current):
    /// the default place of a copy of it.
    pub(crate) home: Device,
    /// The device and kind of the memory [`Source::with`] will read (`None`: host memory).
    pub(crate) reads: Option<(Device, MemoryKind)>,
    /// [`Source::with`] will download the data into a staging copy first (a wgpu
    /// `UnifiedBuffer` whose device copy alone is current): a copy of its own, which the
    /// caller should make before it allocates anything, so that a refusal of it changes
    /// nothing.
    pub(crate) staged: bool,
}

/// A resolved source of `copy_from_device`.
pub(crate) enum Source {
    /// A lazybuf memory object.
    Memory(Arc<MemoryCell>),
    /// A lazybuf device buffer (its first `size` bytes).
    Buffer(Arc<BufferCell>),
    /// A lazybuf `UnifiedBuffer`, read through its host copy. (Its `__cuda_array_interface__`
    /// and `__dlpack__` hand out the memory for writing: a source probed through them was
    /// marked written, even by a call that then failed; a hostile pass, 2026-11-27.)
    Unified(Arc<Storage>),
    /// Foreign memory, wrapped without owning it.
    Borrowed(Memory),
}

/// What keeps foreign memory alive while it is copied: the producer, or its DLPack tensor.
/// Held, never read: dropping it is what releases the memory.
#[allow(dead_code)]
pub(crate) enum KeepAlive {
    /// Nothing to keep (lazybuf's own objects keep themselves).
    Nothing,
    /// The object whose interface handed out the pointer.
    Object(Py<PyAny>),
    /// An imported DLPack tensor (its deleter runs when this is dropped, with the GIL held).
    Tensor(ImportedDlpack),
}

impl Source {
    /// Resolves `obj` (see the module docs); `what` names the call in messages. An object that
    /// is none of the sources: `ValueError` saying what is expected.
    pub(crate) fn resolve(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<(Source, KeepAlive)> {
        Self::resolve_any(obj, what)?.ok_or_else(|| {
            PyValueError::new_err(format!(
                "{what}: expected device memory (a lazybuf memory object or DeviceBuffer, an object \
                 with __cuda_array_interface__, or a DLPack producer), got {}",
                repr(obj)
            ))
        })
    }

    /// As [`Self::resolve`], `None` for an object that is none of the sources (the caller says
    /// what it expected).
    pub(crate) fn resolve_any(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Option<(Source, KeepAlive)>> {
        if let Ok(memory) = obj.cast::<PyMemory>() {
            return Ok(Some((Source::Memory(memory.get().cell().clone()), KeepAlive::Nothing)));
        }
        if let Ok(buffer) = obj.cast::<PyDeviceBuffer>() {
            return Ok(Some((Source::Buffer(buffer.get().cell().clone()), KeepAlive::Nothing)));
        }
        if let Ok(buffer) = obj.cast::<UnifiedBuffer>() {
            return Ok(Some((Source::Unified(buffer.get().storage()?), KeepAlive::Nothing)));
        }
        if obj.hasattr("__cuda_array_interface__")? {
            let memory = from_cuda_array_interface(obj, what)?;
            return Ok(Some((Source::Borrowed(memory), KeepAlive::Object(obj.clone().unbind()))));
        }
        if obj.hasattr("__dlpack__")? {
            return dlpack(obj, what).map(Some);
        }
        Ok(None)
    }

    /// Whether `obj` is of a kind [`Self::resolve`] takes, without resolving it (nothing is
    /// imported or accessed; an object's `__cuda_array_interface__` property is read).
    pub(crate) fn is_source(obj: &Bound<'_, PyAny>) -> PyResult<bool> {
        Ok(obj.cast::<PyMemory>().is_ok()
            || obj.cast::<PyDeviceBuffer>().is_ok()
            || obj.cast::<UnifiedBuffer>().is_ok()
            || obj.hasattr("__cuda_array_interface__")?
            || obj.hasattr("__dlpack__")?)
    }

    /// What a copy of the source into new memory needs before it allocates ([`Extent`]),
    /// without reading anything. Locks the source's own lock, as [`Self::with`] does.
    pub(crate) fn extent(&self, detached: &Detached) -> PyResult<Extent> {
        let of = |m: &Memory, nbytes: usize| Extent {
            nbytes,
            home: m.device().clone(),
            reads: Some((m.device().clone(), m.kind())),
            staged: false,
        };
        Ok(match self {
            Source::Memory(cell) => {
                let memory = cell.lock(detached)?;
                of(&memory, memory.len())
            }
            Source::Buffer(cell) => {
                let buffer = cell.lock(detached)?;
                of(buffer.memory(), buffer.size())
            }
            Source::Unified(storage) => {
                let mut raw = storage.lock_detached(detached)?;
                let (nbytes, home) = (raw.nbytes(), raw.home().clone());
                // As `with` reads: the home device's copy in place when only it is current
                // (staged through the host on a backend that cannot borrow its memory), else
                // the host's.
                let (mut reads, mut staged) = (None, false);
                if reads_home_copy(&raw, &home) {
                    let device_copy = raw.device_access(&home, Access::Read).or_py()?;
                    // SAFETY: the handle is only borrowed, and dropped, while the buffer's lock
                    // is held: the copy stays allocated meanwhile.
                    match unsafe { Memory::borrowed(&home, device_copy.raw(), nbytes) } {
                        Ok(_) => reads = Some((home.clone(), MemoryKind::Device)),
                        Err(_) => staged = true,
                    }
                }
                Extent { nbytes, home, reads, staged }
            }
            Source::Borrowed(memory) => of(memory, memory.len()),
        })
    }

    /// Runs `f` with the source's memory and the number of its bytes to copy. Locks the
    /// source's own lock: never call it with that lock held.
    pub(crate) fn with<R>(&self, detached: &Detached, f: impl FnOnce(&Memory, usize) -> R) -> PyResult<R> {
        Ok(match self {
            Source::Memory(cell) => {
                let memory = cell.lock(detached)?;
                let n = memory.len();
                f(&memory, n)
            }
            Source::Buffer(cell) => {
                let buffer = cell.lock(detached)?;
                f(buffer.memory(), buffer.size())
            }
            Source::Unified(storage) => {
                let mut raw = storage.lock_detached(detached)?;
                let (n, home) = (raw.nbytes(), raw.home().clone());
                // The current copy is read in place: the host's, or the buffer's own device's
                // when only it is current, so nothing moves or changes state for it. Only a
                // buffer current elsewhere (another device) is read back to the host first.
                let mut staged = Vec::new();
                let memory = if reads_home_copy(&raw, &home) {
                    let device_copy = raw.device_access(&home, Access::Read).or_py()?;
                    // SAFETY: the handle is read while the buffer's lock is held (until `f`
                    // returns), so the copy stays allocated and current.
                    let handle = unsafe { device_copy.raw() };
                    // SAFETY: as above: the memory outlives the borrow, which `f` alone uses.
                    match unsafe { Memory::borrowed(&home, handle, n) } {
                        Ok(memory) => memory,
                        // A backend that cannot borrow its own memory (wgpu): the buffer's own
                        // download into a staging copy, as `to_numpy()`'s (seen by the guard,
                        // recorded and counted; it left the buffer as it is, but neither the
                        // guard nor the recorder saw it before the twentieth hostile pass).
                        Err(_) => {
                            staged = vec![0u8; n];
                            read_staged(&mut raw, &mut staged)?;
                            // SAFETY: `staged` lives, untouched, until `f` returns.
                            unsafe { borrowed(&Device::host(), staged.as_ptr() as usize, n) }?
                        }
                    }
                } else {
                    let address = raw.host_access(Access::Read).or_py()?.as_ptr() as usize;
                    // SAFETY: the host copy stays allocated and unwritten while the buffer's
                    // lock is held, which it is until `f` returns.
                    unsafe { borrowed(&Device::host(), address, n) }?
                };
                let result = f(&memory, n);
                drop((memory, staged));
                result
            }
            Source::Borrowed(memory) => f(memory, memory.len()),
        })
    }

    /// Runs `f` with the destination locked by `lock` (an object whose lock orders at `mine`)
    /// and the source's memory, taking the two locks in the process-wide order
    /// ([`Self::lock_order`]: the lower address first), so that two copies between the same
    /// objects in opposite directions cannot deadlock.
    ///
    /// A source staged through the host (a wgpu `UnifiedBuffer` whose device copy alone is
    /// current, [`Extent::staged`]) is read, a copy of its own, before `f` runs: `check` is
    /// given the destination and the bytes first, to refuse what `f` would refuse (too many
    /// bytes, the guard's verdict on the copy from host memory), so that a refused call reads
    /// nothing (it was counted and recorded before the twentieth hostile pass's own fix was).
    pub(crate) fn with_locked_in_order<G: std::ops::DerefMut, R>(
        &self,
        detached: &Detached,
        mine: usize,
        lock: impl Fn() -> PyResult<G>,
        check: impl FnOnce(&mut G::Target, usize) -> PyResult<()>,
        f: impl FnOnce(&mut G::Target, &Memory, usize) -> PyResult<R>,
    ) -> PyResult<R> {
        if matches!(self, Source::Unified(_)) {
            let extent = self.extent(detached)?;
            if extent.staged {
                check(&mut *lock()?, extent.nbytes)?;
            }
        }
        if self.lock_order() < mine {
            self.with(detached, |src, n| f(&mut *lock()?, src, n))?
        } else {
            let mut dst = lock()?;
            self.with(detached, |src, n| f(&mut dst, src, n))?
        }
    }

    /// The address that orders the locks of two objects (the source's lock is taken first
    /// when it is lower); 0 for foreign memory, which has no lock.
    pub(crate) fn lock_order(&self) -> usize {
        match self {
            Source::Memory(cell) => Arc::as_ptr(cell) as usize,
            Source::Buffer(cell) => Arc::as_ptr(cell) as usize,
            Source::Unified(storage) => Arc::as_ptr(storage) as usize,
            Source::Borrowed(_) => 0,
        }
    }

    /// Whether the source is the memory behind `cell`'s lock (a copy onto itself).
    pub(crate) fn is_memory(&self, cell: &Arc<MemoryCell>) -> bool {
        matches!(self, Source::Memory(c) if Arc::ptr_eq(c, cell))
    }

    /// Whether the source is the device buffer behind `cell`'s lock.
    pub(crate) fn is_buffer(&self, cell: &Arc<BufferCell>) -> bool {
        matches!(self, Source::Buffer(c) if Arc::ptr_eq(c, cell))
    }
}

/// A C-contiguous span's byte count from a shape, an item size and optional strides.
fn contiguous_bytes(
    shape: &[usize],
    itemsize: usize,
    strides: Option<&[isize]>,
    what: &str,
) -> PyResult<usize> {
    let overflow = || PyValueError::new_err(format!("{what}: the source's size overflows"));
    let n = shape.iter().try_fold(itemsize, |acc, &d| acc.checked_mul(d)).ok_or_else(overflow)?;
    if let Some(strides) = strides {
        let mut expected = itemsize as isize;
        for (dim, stride) in shape.iter().zip(strides).rev() {
            if *dim > 1 && *stride != expected {
                return Err(PyValueError::new_err(format!(
                    "{what}: expected a C-contiguous source, got shape {shape:?} with strides {strides:?}"
                )));
            }
            expected = expected.checked_mul(*dim as isize).ok_or_else(overflow)?;
        }
    }
    Ok(n)
}

/// Wraps the memory a `__cuda_array_interface__` describes, on the CUDA device it belongs to.
fn from_cuda_array_interface(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Memory> {
    let py = obj.py();
    let iface = obj.getattr("__cuda_array_interface__")?;
    let iface = iface
        .cast::<PyDict>()
        .map_err(|_| PyTypeError::new_err(format!("{what}: __cuda_array_interface__ must be a dict")))?;
    let item = |key: &str| -> PyResult<Bound<'_, PyAny>> {
        iface
            .get_item(key)?
            .ok_or_else(|| PyValueError::new_err(format!("{what}: __cuda_array_interface__ has no {key:?}")))
    };
    let version: i64 = item("version")?.extract().map_err(|_| {
        PyValueError::new_err(format!("{what}: __cuda_array_interface__['version'] must be an int"))
    })?;
    if !(0..=3).contains(&version) {
        return Err(PyValueError::new_err(format!(
            "{what}: __cuda_array_interface__ version {version}; expected 0 to 3"
        )));
    }
    let (ptr, _readonly): (usize, bool) = item("data")?.extract().map_err(|_| {
        PyValueError::new_err(format!("{what}: __cuda_array_interface__['data'] must be (pointer, readonly)"))
    })?;
    let shape: Vec<i64> = item("shape")?.extract().map_err(|_| {
        PyValueError::new_err(format!("{what}: __cuda_array_interface__['shape'] must be a tuple of ints"))
    })?;
    if shape.iter().any(|&d| d < 0) {
        return Err(PyValueError::new_err(format!("{what}: negative dimensions in shape {shape:?}")));
    }
    let shape: Vec<usize> = shape.into_iter().map(|d| d as usize).collect();
    let typestr = item("typestr")?;
    let bad_typestr = || {
        PyValueError::new_err(format!(
            "{what}: __cuda_array_interface__['typestr'] {} is not a numeric type string",
            repr(&typestr)
        ))
    };
    let dtype = py.import("numpy")?.call_method1("dtype", (&typestr,)).map_err(|_| bad_typestr())?;
    if dtype.getattr("hasobject")?.is_truthy()? {
        return Err(bad_typestr());
    }
    let itemsize: usize = dtype.getattr("itemsize")?.extract()?;
    let strides: Option<Vec<isize>> = match iface.get_item("strides")? {
        Some(s) if !s.is_none() => Some(s.extract().map_err(|_| {
            PyValueError::new_err(format!("{what}: __cuda_array_interface__['strides'] must be None or ints"))
        })?),
        _ => None,
    };
    if strides.as_ref().is_some_and(|s| s.len() != shape.len()) {
        return Err(PyValueError::new_err(format!(
            "{what}: __cuda_array_interface__['strides'] must have one entry per dimension"
        )));
    }
    if let Some(mask) = iface.get_item("mask")?
        && !mask.is_none()
    {
        return Err(PyValueError::new_err(format!("{what}: masked arrays are not supported")));
    }
    let nbytes = contiguous_bytes(&shape, itemsize, strides.as_deref(), what)?;
    let devices: Vec<Device> = lazybuf::devices().into_iter().filter(addresses_cuda).collect();
    let memory = devices.iter().find_map(|device| {
        // SAFETY: the producer (kept alive by the caller's KeepAlive) owns the memory for as
        // long as the object lives, as the interface requires; the device check refuses
        // pointers that are not this device's memory.
        unsafe { borrowed(device, ptr, nbytes) }.ok()
    });
    let memory = memory.ok_or_else(|| {
        PyValueError::new_err(format!(
            "{what}: the __cuda_array_interface__ pointer {ptr:#x} is not memory of any CUDA device lazybuf \
             found ({} devices)",
            devices.len()
        ))
    })?;
    if let Some(stream) = iface.get_item("stream")? {
        wait_for_stream(memory.device(), &stream, what)?;
    }
    Ok(memory)
}

/// Orders lazybuf's stream of `device` after the work enqueued so far on a CUDA array
/// interface's `stream` (None and 1, the legacy default stream, need nothing: lazybuf's
/// default stream is a blocking one).
fn wait_for_stream(device: &Device, stream: &Bound<'_, PyAny>, what: &str) -> PyResult<()> {
    if stream.is_none() {
        return Ok(());
    }
    let handle: usize = stream
        .cast::<PyInt>()
        .map_err(|_| PyTypeError::new_err(format!("{what}: the interface's stream must be None or an int")))?
        .extract()?;
    match handle {
        0 => {
            Err(PyValueError::new_err(format!("{what}: stream 0 is not allowed by the CUDA array interface")))
        }
        1 => Ok(()),
        _ => {
            let raw = device_handles(device).stream_from_int(handle).ok_or_else(|| {
                PyValueError::new_err(format!("{what}: streams of {device} have no integer handle"))
            })?;
            // SAFETY: the producer promises the stream is live while its interface is used.
            let theirs = unsafe { device.wrap_stream(raw) }.or_py()?;
            device.stream().wait_for(&theirs.marker().or_py()?).or_py()
        }
    }
}

/// The DLPack tensor of `obj`: a capsule handed over as it is, or what its `__dlpack__`
/// returns. A producer is asked for the versioned ABI (`max_version`); one written before
/// DLPack 1.0 takes no such keyword and raises `TypeError`, and is then asked again without
/// keywords, as NumPy's `from_dlpack` does (the array API standard asks consumers to).
/// Producers with the C exchange API go through dlpark's import. A `__dlpack__` that returns
/// something other than a capsule is a `TypeError` saying what it returned.
fn import_dlpack(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<ImportedDlpack> {
    let py = obj.py();
    if obj.is_instance_of::<PyCapsule>() || ExchangeApi::from_object(obj.as_borrowed())?.is_some() {
        return from_dlpack(obj.as_borrowed(), None, None);
    }
    let kwargs = PyDict::new(py);
    kwargs.set_item("max_version", (DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION))?;
    let capsule = match obj.call_method(interned!(py, "__dlpack__"), (), Some(&kwargs)) {
        Ok(capsule) => capsule,
        Err(versioned) if versioned.is_instance_of::<PyTypeError>(py) => {
            obj.call_method0(interned!(py, "__dlpack__")).inspect_err(|legacy| {
                // The first refusal says why the keywords were dropped.
                legacy.set_cause(py, Some(versioned));
            })?
        }
        Err(err) => return Err(err),
    };
    if !capsule.is_instance_of::<PyCapsule>() {
        return Err(PyTypeError::new_err(format!(
            "{what}: {}.__dlpack__() returned {} {}, not a DLPack capsule (a PyCapsule named \
             \"dltensor_versioned\" or \"dltensor\")",
            type_name(obj),
            type_name(&capsule),
            repr(&capsule)
        )));
    }
    from_dlpack(capsule.as_borrowed(), None, None)
}

/// The name of `obj`'s type, for messages.
fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "<object>".into())
}

/// Imports a DLPack producer and wraps its memory on the device it names.
fn dlpack(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<(Source, KeepAlive)> {
    let imported = import_dlpack(obj, what)?;
    let memory = {
        let tensor = imported
            .validate()
            .map_err(|err| PyValueError::new_err(format!("{what}: invalid DLPack tensor: {err}")))?;
        if !tensor.is_compact().unwrap_or(false) {
            return Err(PyValueError::new_err(format!(
                "{what}: expected a C-contiguous DLPack tensor, got shape {:?} with strides {:?}",
                tensor.shape(),
                tensor.strides()
            )));
        }
        let nbytes = tensor.num_bytes();
        // SAFETY: a validated tensor's adjusted pointer lies within its allocation.
        let address = unsafe { tensor.offset_bytes_ptr() }
            .map_err(|err| PyValueError::new_err(format!("{what}: invalid DLPack tensor: {err}")))?
            as usize;
        let dl = tensor.device();
        let device = match dl.device_type {
            DLDeviceType::CPU | DLDeviceType::CUDAHOST => Device::host(),
            DLDeviceType::CUDA | DLDeviceType::CUDAMANAGED => {
                // Managed memory is addressed like the device's own: look the device up by it.
                dlpack_owner(DlpackDevice::CUDA_TYPE, dl.device_id).ok_or_else(|| {
                    PyValueError::new_err(format!("{what}: lazybuf has no CUDA device {}", dl.device_id))
                })?
            }
            other => {
                return Err(PyValueError::new_err(format!(
                    "{what}: DLPack device type {} is not memory lazybuf can copy from; expected a CPU or \
                     CUDA tensor",
                    other.0
                )));
            }
        };
        // SAFETY: the imported tensor (returned alongside, dropped after the copy) keeps the
        // memory alive; the device check refuses memory of another device.
        unsafe { borrowed(&device, address, nbytes) }?
    };
    Ok((Source::Borrowed(memory), KeepAlive::Tensor(imported)))
}
