//! dpctl's USM memory objects as `lazybuf.MemoryDevice`, `lazybuf.MemoryHost` and
//! `lazybuf.MemoryShared` (base class `lazybuf.Memory`): untyped allocations of one kind over
//! the core's [`lazybuf::Memory`].
//!
//! - `MemoryDevice`: device memory, not host accessible (no buffer protocol);
//! - `MemoryHost`: page-locked host memory (the device's pinned memory), with the buffer
//!   protocol;
//! - `MemoryShared`: memory the host and the device both address (CUDA managed memory, with
//!   `prefetch`; OpenCL fine-grained SVM; host memory on the host device; a `ValueError` on a
//!   device without it), with the buffer protocol.
//!
//! `Kind(nbytes, *, alignment=0, device=None, copy=False)` allocates (`nbytes`: an int, see
//! [`crate::args::size`]; an array is a source, never a size); `Kind(other)` with another
//! memory object shares its memory (zero-copy) when the kind matches, else raises `ValueError`
//! unless `copy=True`, which copies (as it does for a `DeviceBuffer`, a `UnifiedBuffer`, a
//! `__cuda_array_interface__` or a DLPack source). Anything else is a `TypeError` saying what
//! was expected (a bool too: it is not a size). A zero-copy object keeps the object that
//! allocated the memory alive as `reference_obj` (the root owner, as NumPy collapses `.base`):
//! `Kind(Kind(m))` references `m`, so chains of zero-copy objects never nest.
//! `nbytes`/`size`/`len()`, `get_usm_type()` (`"device"`, `"host"`, `"shared"`), `alignment`,
//! `device`, `ptr`, `copy_to_host(dest=None)`, `copy_from_host(obj)` (a shorter source fills a
//! prefix), `copy_from_device(obj)` ([`crate::foreign`]), `memset(value=0)`, `tobytes()`,
//! `__sizeof__` (the data counted by its owner only), CUDA array interface and DLPack exports (`copy=True`: a
//! copy in host memory for the CPU, for every kind and device), and pickling that
//! records the kind and the device (unpickling checks the kind; a device this process lacks
//! falls back to the current device with a `RuntimeWarning`).
//!
//! Differences from dpctl: `device=` in place of `queue=`; size 0 is allowed; zero-copy
//! wrapping of foreign memory is not offered (construct with `copy=True`); `reference_obj` is
//! the memory object that allocated the memory (dpctl: `None` for its own objects); the value of
//! `memset` must be a byte (0..255).
//!
//! Results sized by the memory (`tobytes()`, `copy_to_host()`, pickling) are allocated through
//! Python: `MemoryError` when the host has no memory for them ([`crate::hostbuf`]).
//!
//! **Seen copies.** Each copy between memories (device or shared memory to or from host
//! memory, or between device memories; on the host device no kind is device memory) is seen
//! by the transfer guard and the recorder ([`lazybuf::observe`]), named by the Python call:
//! explicit for `copy_to_host`, `copy_from_host`, `copy_from_device`, `tobytes`, a
//! constructor with `copy=True` (named by the class) and `__dlpack__(copy=True)`; implicit for
//! pickling, unpickling and DLPack's host copy with `copy=None`.
//!
//! Threads: as [`crate::device_buffer`]: each call locks the memory with the GIL released.

use std::ffi::c_int;
use std::sync::Arc;

use pyo3::exceptions::{PyAttributeError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyTuple};

use lazybuf::observe::Cause;
use lazybuf::{AllocationOptions, Device, Memory, MemoryKind};

use crate::accelerator::pickled_device;
use crate::accelerator::{PyDevice, selector};
use crate::args;
use crate::errors::OrPyErr;
use crate::foreign::Source;
use crate::hostbuf::{self, HostBuffer};
use crate::interop::{self, DlpackArgs, ExportedBytes, ExportedHost};
use crate::lock::{self, Detached, GilFreeGuard, GilFreeMutex};
use crate::observe::observed;

/// A memory object's allocation, shared by the objects made zero-copy from it and by the
/// exports (buffer protocol, DLPack) of it.
pub(crate) struct MemoryCell {
    /// Waited for only with the GIL released, never by the thread holding it ([`crate::lock`]).
    memory: GilFreeMutex<Memory>,
}

impl MemoryCell {
    /// The memory, from a detached thread ([`lock::detach`]); `ReentrancyError` on the thread
    /// that holds it already.
    pub(crate) fn lock(&self, detached: &Detached) -> PyResult<GilFreeGuard<'_, Memory>> {
        self.memory.lock_detached(detached)
    }
}

/// An untyped allocation of one memory kind (the base class of `MemoryDevice`, `MemoryHost`
/// and `MemoryShared`).
#[pyclass(name = "Memory", module = "lazybuf", frozen, subclass, weakref)]
pub(crate) struct PyMemory {
    cell: Arc<MemoryCell>,
    device: Device,
    kind: MemoryKind,
    nbytes: usize,
    alignment: usize,
    /// The memory object this one shares its memory with (zero-copy construction).
    reference: Option<Py<PyAny>>,
}

/// The kind a `kind` name means (`"device"`, `"host"` or `"shared"`); host memory is pinned.
fn kind_named(name: &str) -> Option<MemoryKind> {
    match name {
        "device" => Some(MemoryKind::Device),
        "host" => Some(MemoryKind::Host { pinned: true }),
        "shared" => Some(MemoryKind::Shared),
        _ => None,
    }
}

fn class_name(kind: MemoryKind) -> &'static str {
    match kind {
        MemoryKind::Device => "MemoryDevice",
        MemoryKind::Host { .. } => "MemoryHost",
        MemoryKind::Shared => "MemoryShared",
    }
}

impl PyMemory {
    /// The shared allocation.
    pub(crate) fn cell(&self) -> &Arc<MemoryCell> {
        &self.cell
    }

    /// Runs `f` on the memory with the GIL released.
    fn with<R: Send>(&self, py: Python<'_>, f: impl FnOnce(&mut Memory) -> R + Send) -> PyResult<R> {
        lock::detach(py, |d| Ok(f(&mut *self.cell.lock(d)?)))
    }

    fn from_memory(memory: Memory, reference: Option<Py<PyAny>>) -> PyMemory {
        PyMemory {
            device: memory.device().clone(),
            kind: memory.kind(),
            nbytes: memory.len(),
            alignment: memory.alignment(),
            cell: Arc::new(MemoryCell { memory: GilFreeMutex::new(memory, "memory object") }),
            reference,
        }
    }

    fn allocate(
        py: Python<'_>,
        kind: MemoryKind,
        nbytes: usize,
        alignment: usize,
        device: Device,
    ) -> PyResult<Self> {
        let options = AllocationOptions { resource: None, alignment };
        let memory = py.detach(|| Memory::with_options(&device, kind, nbytes, options)).or_py()?;
        Ok(Self::from_memory(memory, None))
    }

    /// dpctl's constructor (see the module docs).
    fn construct(
        py: Python<'_>,
        kind: MemoryKind,
        other: &Bound<'_, PyAny>,
        alignment: usize,
        device: Option<&Bound<'_, PyAny>>,
        copy: bool,
    ) -> PyResult<Self> {
        let expected = || {
            format!(
                "{}(other): expected a number of bytes (an int) or a memory object (or, with copy=True, \
                 device memory to copy: a DeviceBuffer, a UnifiedBuffer, an object with \
                 __cuda_array_interface__ or a DLPack producer)",
                class_name(kind)
            )
        };
        if other.is_instance_of::<PyBool>() {
            // An int to Python, but never meant as a size (DeviceBuffer(size=) refuses it too).
            return Err(PyTypeError::new_err(format!(
                "{}, got the bool {}: a bool is not a size",
                expected(),
                args::repr(other)
            )));
        }
        if args::is_size(other)? {
            let nbytes = args::size(other, "nbytes")?;
            return Self::allocate(py, kind, nbytes, alignment, crate::accelerator::device_arg(device)?);
        }
        let device = match device.filter(|d| !d.is_none()) {
            Some(device) => Some(crate::accelerator::device_arg(Some(device))?),
            None => None,
        };
        if let Ok(source) = other.cast::<PyMemory>() {
            let src = source.get();
            let same_device = device.as_ref().is_none_or(|d| d == &src.device);
            if src.kind == kind && same_device && src.alignment >= alignment {
                // The root owner: a zero-copy source's own reference (chains never nest).
                let root = match &src.reference {
                    Some(root) => root.clone_ref(py),
                    None => other.clone().unbind(),
                };
                return Ok(PyMemory {
                    cell: src.cell.clone(),
                    device: src.device.clone(),
                    kind,
                    nbytes: src.nbytes,
                    alignment: src.alignment,
                    reference: Some(root),
                });
            }
            if !copy {
                let why = if src.kind != kind {
                    format!(
                        "it is {} memory, not {} memory; use copy=True, or {}",
                        src.kind.name(),
                        kind.name(),
                        class_name(src.kind)
                    )
                } else if !same_device {
                    format!("it is on {}, not on the device asked for; use copy=True", selector(&src.device))
                } else {
                    format!("it is aligned to {} bytes, not {alignment}; use copy=True", src.alignment)
                };
                return Err(PyValueError::new_err(format!(
                    "{}: zero-copy construction from {} is not possible: {why}",
                    class_name(kind),
                    args::repr(other)
                )));
            }
            let (source, keep) = Source::resolve(other, "copy_from_device")?;
            let memory = Self::copy_of(py, kind, alignment, device, &source)?;
            drop(keep);
            return Ok(memory);
        }
        let what = format!("{}(other)", class_name(kind));
        let wrong_type = || {
            let type_name = other.get_type().name().map(|n| n.to_string()).unwrap_or_default();
            PyTypeError::new_err(format!("{}, got {type_name} {}", expected(), args::repr(other)))
        };
        if !copy {
            // Refused before the source is imported or read: nothing is accessed.
            if !Source::is_source(other)? {
                return Err(wrong_type());
            }
            return Err(PyValueError::new_err(format!(
                "{what}: lazybuf does not wrap foreign memory without copying; pass copy=True to copy {}",
                args::repr(other)
            )));
        }
        // A source's own errors (a bad interface, a refused DLPack export) name `what` already.
        let (source, keep) = Source::resolve_any(other, &what)?.ok_or_else(wrong_type)?;
        let memory = Self::copy_of(py, kind, alignment, device, &source)?;
        drop(keep);
        Ok(memory)
    }

    /// A new memory object of `kind` on `device` (default: the source's own device, a
    /// `UnifiedBuffer`'s home whichever of its copies is current) holding a copy of `source`,
    /// an explicit copy named by the class. Allocated only once the guard lets the copy
    /// through: a refused constructor took nor recorded any memory (it did before the
    /// twentieth hostile pass), and the source's size is learnt without reading it (a
    /// `UnifiedBuffer` current on another device was read back for it, a wgpu one staged).
    fn copy_of(
        py: Python<'_>,
        kind: MemoryKind,
        alignment: usize,
        device: Option<Device>,
        source: &Source,
    ) -> PyResult<Self> {
        observed(py, Cause::sync(class_name(kind)), || {
            let extent = lock::detach(py, |d| source.extent(d))?;
            let device = device.unwrap_or(extent.home);
            if extent.staged {
                // The guard's verdict on the upload, then the source's own download (a refusal
                // of either allocates and reads nothing), then the memory and the upload.
                let options = AllocationOptions { resource: None, alignment };
                let cause = Cause::sync(class_name(kind));
                // (With the GIL held: the read releases it itself, and this is wgpu's path only.)
                let read = || lock::detach(py, |d| source.with(d, |m, _| m.to_vec().or_py()))?;
                let (memory, bytes) =
                    Memory::for_copy_from_after(&device, kind, extent.nbytes, options, None, cause, read)
                        .or_py()??;
                if bytes.len() != extent.nbytes {
                    return Err(resized_meanwhile(kind, extent.nbytes, bytes.len()));
                }
                let memory = Self::from_memory(memory, None);
                memory.with(py, |m| m.copy_from_host(&bytes))?.or_py()?;
                return Ok(memory);
            }
            let from = extent.reads.as_ref().map(|(device, kind)| (device, *kind));
            let memory = Self::allocate_for_copy(py, kind, extent.nbytes, alignment, device, from)?;
            memory.copy_from(py, source, Some(extent.nbytes))?;
            Ok(memory)
        })
    }

    /// [`Self::allocate`] of memory a copy from `from` (`None`: host memory) is about to fill:
    /// nothing is allocated when the guard refuses that copy
    /// ([`lazybuf::DeviceAllocation::for_copy_from`]; call it under the call's `observed`).
    fn allocate_for_copy(
        py: Python<'_>,
        kind: MemoryKind,
        nbytes: usize,
        alignment: usize,
        device: Device,
        from: Option<(&Device, MemoryKind)>,
    ) -> PyResult<Self> {
        let options = AllocationOptions { resource: None, alignment };
        let cause = Cause::sync(class_name(kind));
        let memory =
            py.detach(|| Memory::for_copy_from(&device, kind, nbytes, options, from, cause)).or_py()?;
        Ok(Self::from_memory(memory, None))
    }

    /// Copies a resolved source into the first bytes, locking the two in address order.
    fn copy_from(&self, py: Python<'_>, source: &Source, exact: Option<usize>) -> PyResult<()> {
        if source.is_memory(&self.cell) {
            return Ok(()); // the memory onto itself: every byte stays
        }
        // A copying constructor's source must still have the size its copy was allocated for
        // (`exact`): another thread (or a failure callback of the allocation) may have resized
        // it since, and the copy held the first bytes and uninitialized memory after them (the
        // twenty-second hostile pass).
        let sized = |dst: &Memory, n: usize| match exact {
            Some(want) if n != want => Err(resized_meanwhile(self.kind, want, n)),
            _ if n > dst.len() => Err(too_large(n, dst.len())),
            _ => Ok(()),
        };
        let copy = |dst: &mut Memory, src: &Memory, n: usize| {
            sized(dst, n)?;
            crate::hostbuf::copy_between(dst, src, n).or_py()
        };
        let check = |dst: &mut Memory, n: usize| {
            sized(dst, n)?;
            dst.check_copy_from(None, n, Cause::sync("copy_from_device")).or_py()
        };
        let mine = Arc::as_ptr(&self.cell) as usize;
        lock::detach(py, |d| source.with_locked_in_order(d, mine, || self.cell.lock(d), check, copy))
    }

    /// `copy_to_host`'s work: into `dest`, else into a new array.
    fn copy_to_host_into<'py>(
        &self,
        py: Python<'py>,
        dest: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let dest = match dest.filter(|d| !d.is_none()) {
            Some(dest) => dest.clone(),
            None => hostbuf::new_array(py, self.nbytes)?,
        };
        let mut host = HostBuffer::get(&dest, true, "copy_to_host: dest")?;
        if host.len() < self.nbytes {
            return Err(PyValueError::new_err(format!(
                "copy_to_host: destination object is too small to accommodate {} bytes (it has {})",
                self.nbytes,
                host.len()
            )));
        }
        let n = self.nbytes;
        self.with(py, |m| crate::hostbuf::copy_out(m, &mut host, n))?.or_py()?;
        drop(host);
        Ok(dest)
    }

    /// The address of the bytes for the host, for the buffer protocol (host and shared).
    fn host_address(&self, py: Python<'_>) -> PyResult<*mut u8> {
        let address = self.with(py, |m| m.host_slice_mut().map(|s| s.as_mut_ptr() as usize))?.or_py()?;
        Ok(address as *mut u8)
    }

    fn raw_address(&self, py: Python<'_>) -> PyResult<usize> {
        // SAFETY: the memory is live (held here) and its device's; the address is only handed
        // to Python as an int, and the memory never moves.
        self.with(py, |m| unsafe { m.device().native_handle(m.raw()) })
    }

    /// Buffer protocol over all the bytes: 1-d unsigned bytes, always writable (as dpctl's;
    /// a memory object tracks no reads or writes, so a read-only request needs nothing else).
    ///
    /// # Safety
    /// `view` must be the `Py_buffer` CPython passed to `bf_getbuffer`.
    unsafe fn export(slf: Bound<'_, PyAny>, view: *mut ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        let memory = slf.cast::<PyMemory>()?.get();
        let nbytes = memory.nbytes;
        let host = |_writable: bool| {
            let address = memory.host_address(slf.py())?;
            Ok(ExportedHost { address, writable: true, owner: Box::new(memory.cell.clone()) })
        };
        // SAFETY: view is CPython's (the caller's promise); the address is valid for nbytes
        // while the export's clone of the cell lives (the memory never moves).
        unsafe { interop::export_buffer(view, flags, slf.clone(), &[nbytes], 1, Ok(c"B"), host) }
    }
}

#[pymethods]
impl PyMemory {
    /// The size in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.nbytes
    }

    /// The size in bytes.
    #[getter]
    fn size(&self) -> usize {
        self.nbytes
    }

    fn __len__(&self) -> usize {
        self.nbytes
    }

    /// The object's size in bytes, its memory included when it owns it: an object made
    /// zero-copy from another (`reference_obj` set) shares memory its root owner counts, so
    /// summing `sys.getsizeof` over the objects counts each allocation once.
    fn __sizeof__(&self) -> usize {
        let owned = if self.reference.is_none() { self.nbytes } else { 0 };
        std::mem::size_of::<Self>() + 2 * std::mem::size_of::<usize>() + owned
    }

    /// `"device"`, `"host"` or `"shared"`.
    fn get_usm_type(&self) -> &'static str {
        self.kind.name()
    }

    /// `"device"`, `"host"` or `"shared"` (as `get_usm_type()`).
    #[getter]
    fn kind(&self) -> &'static str {
        self.kind.name()
    }

    /// The alignment in bytes the memory's address is guaranteed to have.
    #[getter]
    fn alignment(&self) -> usize {
        self.alignment
    }

    /// The device.
    #[getter]
    fn device(&self) -> PyDevice {
        PyDevice::new(self.device.clone())
    }

    /// The memory object this one shares its memory with, or `None` when it made its own.
    #[getter]
    fn reference_obj(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.reference.as_ref().map(|r| r.clone_ref(py))
    }

    /// The raw handle as an int: the address of host memory (and of every kind on the host
    /// device), the `CUdeviceptr` on CUDA, the `cl_mem` on OpenCL (for shared memory there,
    /// the buffer over the SVM allocation); 0 when empty.
    #[getter]
    fn ptr(&self, py: Python<'_>) -> PyResult<usize> {
        self.raw_address(py)
    }

    /// Copies the memory into `dest` (a writable 1-d buffer of at least `nbytes` bytes) and
    /// returns it; without one, into a new uint8 NumPy array.
    #[pyo3(signature = (dest=None))]
    fn copy_to_host<'py>(
        &self,
        py: Python<'py>,
        dest: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        observed(py, Cause::sync("copy_to_host"), || self.copy_to_host_into(py, dest))
    }

    /// The id the transfer guard's errors (`TransferGuardError.buffer_id`) and the recorder's
    /// events give the memory (shared by the objects made zero-copy from one another).
    #[getter]
    fn buffer_id(&self, py: Python<'_>) -> PyResult<u64> {
        self.with(py, |m| m.id())
    }

    /// Copies `obj` (any 1-d buffer of bytes, read-only is fine; at most `nbytes` long) into
    /// the first `len(obj)` bytes.
    fn copy_from_host(&self, py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<()> {
        let host = HostBuffer::get(obj, false, "copy_from_host: obj")?;
        if host.len() > self.nbytes {
            return Err(PyValueError::new_err(format!(
                "copy_from_host: source object is too large to be accommodated in {} bytes buffer ({} bytes)",
                self.nbytes,
                host.len()
            )));
        }
        observed(py, Cause::sync("copy_from_host"), || {
            self.with(py, |m| crate::hostbuf::copy_in(m, &host))?.or_py()
        })
    }

    /// Copies device memory (a memory object, a DeviceBuffer, an object with
    /// `__cuda_array_interface__`, or a DLPack producer; C-contiguous, at most `nbytes`) into
    /// the first bytes: on the device, peer to peer between devices, else through the host.
    fn copy_from_device(&self, py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<()> {
        let (source, keep) = Source::resolve(obj, "copy_from_device")?;
        let result = observed(py, Cause::sync("copy_from_device"), || self.copy_from(py, &source, None));
        drop(keep);
        result
    }

    /// Sets every byte to `value` (0 to 255).
    #[pyo3(signature = (value=0))]
    fn memset(&self, py: Python<'_>, value: i64) -> PyResult<()> {
        let byte = u8::try_from(value).map_err(|_| {
            PyValueError::new_err(format!("memset: value must be a byte, 0 to 255; got {value}"))
        })?;
        self.with(py, |m| m.fill(byte))?.or_py()
    }

    /// The memory's bytes, copied.
    fn tobytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        observed(py, Cause::sync("tobytes"), || {
            PyBytes::new_with(py, self.nbytes, |data| self.with(py, |m| m.copy_to_host(data))?.or_py())
        })
    }

    fn __bytes__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        self.tobytes(py)
    }

    /// The CUDA Array Interface (version 3) of device and shared memory on a CUDA device
    /// (`AttributeError` elsewhere).
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        if !self.device.info().dlpack_device(self.kind).is_some_and(|d| d.is_cuda()) {
            return Err(PyAttributeError::new_err(format!(
                "__cuda_array_interface__ exists only for device and shared memory on a CUDA device; this is {} \
                 memory on {}",
                self.kind.name(),
                selector(&self.device)
            )));
        }
        interop::cuda_array_interface(py, self.raw_address(py)?, &[self.nbytes], lazybuf::DType::U8, false)
    }

    /// DLPack export as a 1-d uint8 tensor: the CPU for host memory (and every kind on the host
    /// device, and OpenCL shared memory), kDLCUDA or kDLCUDAManaged on CUDA; other device
    /// memory (OpenCL, wgpu) raises `BufferError`. `copy=True` exports a copy in host memory
    /// to the CPU, for every kind and device (CUDA memory: with `dl_device=(1, 0)`).
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<Bound<'py, PyAny>>,
        dl_device: Option<Bound<'py, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        let call = DlpackArgs::new(stream, max_version, dl_device, copy)?;
        let view = |py: Python<'py>| {
            let address =
                if interop::dlpack_device(&self.device, self.kind) == Some(dlpark::ffi::DLDevice::CPU) {
                    self.host_address_any(py)?
                } else {
                    self.raw_address(py)?
                };
            let owner: Arc<dyn std::any::Any + Send + Sync> = self.cell.clone();
            Ok(ExportedBytes { address, nbytes: self.nbytes, owner })
        };
        // As a UnifiedBuffer's: a host copy asked for is explicit, one made for the export not.
        let cause = if copy == Some(true) { Cause::sync("__dlpack__") } else { Cause::access("__dlpack__") };
        observed(py, cause, || {
            interop::dlpack_of_bytes(py, &self.device, self.kind, call, view, |py| {
                self.copy_to_host_into(py, None)
            })
        })
    }

    /// `(device_type, device_id)` of the DLPack export.
    fn __dlpack_device__(&self) -> PyResult<(u32, i32)> {
        interop::dlpack_device_tuple(&self.device, self.kind)
    }

    /// Pickles the kind, the device and the bytes (one NumPy array: protocol 5 takes it out of
    /// band).
    fn __reduce__<'py>(&self, py: Python<'py>) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        let data = observed(py, Cause::access("__reduce__"), || self.copy_to_host_into(py, None))?;
        let rebuild = py.import("lazybuf._lazybuf")?.getattr("_rebuild_memory")?;
        // The kind last: it is the last string in the pickle (dpctl's corruption test edits it).
        let args = (selector(&self.device), self.kind.name(), data).into_pyobject(py)?;
        Ok((rebuild, args))
    }

    fn __repr__(&self) -> String {
        format!("<lazybuf.{} of {} bytes on {}>", class_name(self.kind), self.nbytes, selector(&self.device))
    }
}

impl PyMemory {
    /// The host address of the bytes for a CPU export: host and shared memory through their
    /// host view, every kind on the host device through its raw address (host memory).
    fn host_address_any(&self, py: Python<'_>) -> PyResult<usize> {
        if self.kind.host_accessible() {
            return Ok(self.host_address(py)? as usize);
        }
        self.raw_address(py)
    }
}

/// Device memory: not host accessible (`memoryview()` raises `TypeError`).
#[pyclass(name = "MemoryDevice", module = "lazybuf", extends = PyMemory, frozen)]
pub(crate) struct PyMemoryDevice;

#[pymethods]
impl PyMemoryDevice {
    /// `nbytes` bytes of device memory on `device`, or the memory of `other` (see the module
    /// docs).
    #[new]
    #[pyo3(signature = (other, *, alignment=0, device=None, copy=false))]
    fn py_new(
        py: Python<'_>,
        other: &Bound<'_, PyAny>,
        // Non-positive alignments ask for the kind's own, as in dpctl.
        #[pyo3(from_py_with = args::alignment)] alignment: usize,
        device: Option<&Bound<'_, PyAny>>,
        copy: bool,
    ) -> PyResult<PyClassInitializer<Self>> {
        let memory = PyMemory::construct(py, MemoryKind::Device, other, alignment, device, copy)?;
        Ok(PyClassInitializer::from(memory).add_subclass(PyMemoryDevice))
    }
}

/// Page-locked host memory, with the buffer protocol.
#[pyclass(name = "MemoryHost", module = "lazybuf", extends = PyMemory, frozen)]
pub(crate) struct PyMemoryHost;

#[pymethods]
impl PyMemoryHost {
    /// `nbytes` bytes of page-locked host memory for `device`, or the memory of `other` (see
    /// the module docs).
    #[new]
    #[pyo3(signature = (other, *, alignment=0, device=None, copy=false))]
    fn py_new(
        py: Python<'_>,
        other: &Bound<'_, PyAny>,
        // Non-positive alignments ask for the kind's own, as in dpctl.
        #[pyo3(from_py_with = args::alignment)] alignment: usize,
        device: Option<&Bound<'_, PyAny>>,
        copy: bool,
    ) -> PyResult<PyClassInitializer<Self>> {
        let kind = MemoryKind::Host { pinned: true };
        let memory = PyMemory::construct(py, kind, other, alignment, device, copy)?;
        Ok(PyClassInitializer::from(memory).add_subclass(PyMemoryHost))
    }

    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        // SAFETY: forwarded contract.
        unsafe { PyMemory::export(slf.into_any(), view, flags) }
    }

    unsafe fn __releasebuffer__(&self, view: *mut ffi::Py_buffer) {
        // SAFETY: forwarded contract.
        unsafe { interop::release_buffer(view) }
    }
}

/// Memory the host and the device both address, with the buffer protocol.
#[pyclass(name = "MemoryShared", module = "lazybuf", extends = PyMemory, frozen)]
pub(crate) struct PyMemoryShared;

#[pymethods]
impl PyMemoryShared {
    /// `nbytes` bytes of shared memory on `device` (`ValueError` on a device without it), or
    /// the memory of `other` (see the module docs).
    #[new]
    #[pyo3(signature = (other, *, alignment=0, device=None, copy=false))]
    fn py_new(
        py: Python<'_>,
        other: &Bound<'_, PyAny>,
        // Non-positive alignments ask for the kind's own, as in dpctl.
        #[pyo3(from_py_with = args::alignment)] alignment: usize,
        device: Option<&Bound<'_, PyAny>>,
        copy: bool,
    ) -> PyResult<PyClassInitializer<Self>> {
        let memory = PyMemory::construct(py, MemoryKind::Shared, other, alignment, device, copy)?;
        Ok(PyClassInitializer::from(memory).add_subclass(PyMemoryShared))
    }

    /// Moves the pages to the device (`to="device"`) or to the host (`to="host"`) ahead of
    /// use, and waits for the move (CUDA managed memory; nothing to do elsewhere).
    #[pyo3(signature = (to="device"))]
    fn prefetch(slf: &Bound<'_, Self>, to: &str) -> PyResult<()> {
        let to_device = match to {
            "device" => true,
            "host" => false,
            other => {
                return Err(PyValueError::new_err(format!(
                    "prefetch: to must be \"device\" or \"host\", got {other:?}"
                )));
            }
        };
        slf.as_super().get().with(slf.py(), |m| m.prefetch(to_device))?.or_py()
    }

    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        // SAFETY: forwarded contract.
        unsafe { PyMemory::export(slf.into_any(), view, flags) }
    }

    unsafe fn __releasebuffer__(&self, view: *mut ffi::Py_buffer) {
        // SAFETY: forwarded contract.
        unsafe { interop::release_buffer(view) }
    }
}

/// A copying constructor's error when its source was resized while it was being copied.
fn resized_meanwhile(kind: MemoryKind, want: usize, now: usize) -> PyErr {
    PyRuntimeError::new_err(format!(
        "{}: the source was resized while it was being copied ({want} bytes, then {now}); nothing \
         was made",
        class_name(kind)
    ))
}

/// `copy_from_device`'s error for a source larger than the memory.
fn too_large(n: usize, len: usize) -> PyErr {
    PyValueError::new_err(format!(
        "copy_from_device: the source is too large to be accommodated: {n} bytes into {len}"
    ))
}

/// Unpickles a memory object (see `__reduce__`): checks the kind (`ValueError` for one it does
/// not know), then allocates it on the recorded device (or the current one, with a
/// `RuntimeWarning`, when this process lacks it) and copies the bytes in.
#[pyfunction]
pub(crate) fn _rebuild_memory(
    py: Python<'_>,
    device: &str,
    kind: &str,
    data: &Bound<'_, PyAny>,
) -> PyResult<Py<PyAny>> {
    let mem_kind = kind_named(kind).ok_or_else(|| {
        PyValueError::new_err(format!(
            "Unrecognized memory kind {kind:?} stored in the pickle; expected \"device\", \"host\" or \"shared\""
        ))
    })?;
    let device = pickled_device(py, device)?;
    let host = HostBuffer::get(data, false, "unpickling: data")?;
    // Unpickling (pickle.loads) uploads: an implicit copy, refused before anything is allocated.
    let memory = observed(py, Cause::access("unpickle"), || {
        let memory = PyMemory::allocate_for_copy(py, mem_kind, host.len(), 0, device, None)?;
        memory.with(py, |m| m.copy_from_host(host.bytes()))?.or_py()?;
        PyResult::Ok(memory)
    })?;
    let init = PyClassInitializer::from(memory);
    Ok(match mem_kind {
        MemoryKind::Device => Py::new(py, init.add_subclass(PyMemoryDevice))?.into_any(),
        MemoryKind::Host { .. } => Py::new(py, init.add_subclass(PyMemoryHost))?.into_any(),
        MemoryKind::Shared => Py::new(py, init.add_subclass(PyMemoryShared))?.into_any(),
    })
}
