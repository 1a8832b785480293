//! Memory objects meeting other libraries' memory: the sources `copy_from_device` accepts, and
//! the DLPack and CUDA-array-interface exports of memory objects and device buffers.
//!
//! **Sources.** `copy_from_device(obj)` takes lazybuf's own memory objects and device buffers
//! (any kind, any device), an object with `__cuda_array_interface__` (versions 0 to 3;
//! C-contiguous, no mask; its pointer must be memory of one of lazybuf's CUDA devices, found
//! with the driver; a v3 `stream` is waited for on the device), or a DLPack producer (CPU
//! tensors are the host device's memory, CUDA and CUDA-managed tensors that device's;
//! C-contiguous). Foreign memory is wrapped without copying or owning
//! ([`lazybuf::DeviceAllocation::borrowed`]) and kept alive (the producer object, or the
//! imported DLPack tensor) until the copy is done. Copies between devices go peer to peer
//! where the runtime can, else through the host.
//!
//! **Exports.** [`export_dlpack`] describes memory as a 1-d `uint8` tensor (with
//! [`crate::dlpack::Exporter`], the one exporter of the package) whose manager context holds
//! the memory's owner, so a tensor outlives the Python object it came from; `copy=True`
//! exports a copy in host memory, flagged as copied. Memory DLPack has no device for (OpenCL
//! and wgpu device memory) is a `BufferError` naming its backend, except with `copy=True`.
//!
//! What does not live here: the copies themselves (the core's `DeviceAllocation`).

use std::any::Any;
use std::ffi::c_void;
use std::sync::Arc;

use dlpark::ffi::{DLDataType, DLDataTypeCode, DLDevice, DLDeviceType};
use dlpark::python::{ExportRequest, ImportedDlpack, export_dlpack as dlpark_export, from_dlpack};
use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyInt};

use lazybuf::backend::{RawMemory, RawStream};
use lazybuf::{BackendKind, Device, Memory, MemoryKind};

use crate::args::repr;
use crate::device_buffer::{BufferCell, PyDeviceBuffer};
use crate::dlpack::Exporter;
use crate::errors::OrPyErr;
use crate::lock::Detached;
use crate::memory::{MemoryCell, PyMemory};

/// A resolved source of `copy_from_device`.
pub enum Source {
    /// A lazybuf memory object.
    Memory(Arc<MemoryCell>),
    /// A lazybuf device buffer (its first `size` bytes).
    Buffer(Arc<BufferCell>),
    /// Foreign memory, wrapped without owning it.
    Borrowed(Memory),
}

/// What keeps foreign memory alive while it is copied: the producer, or its DLPack tensor.
pub enum KeepAlive {
    /// Nothing to keep (lazybuf's own objects keep themselves).
    Nothing,
    /// The object whose interface handed out the pointer.
    Object(Py<PyAny>),
    /// An imported DLPack tensor (its deleter runs when this is dropped, with the GIL held).
    Tensor(ImportedDlpack),
}

impl Source {
    /// Resolves `obj` (see the module docs); `what` names the call in messages.
    pub fn resolve(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<(Source, KeepAlive)> {
        if let Ok(memory) = obj.cast::<PyMemory>() {
            return Ok((Source::Memory(memory.get().cell().clone()), KeepAlive::Nothing));
        }
        if let Ok(buffer) = obj.cast::<PyDeviceBuffer>() {
            return Ok((Source::Buffer(buffer.get().cell().clone()), KeepAlive::Nothing));
        }
        if obj.hasattr("__cuda_array_interface__")? {
            let memory = from_cuda_array_interface(obj, what)?;
            return Ok((Source::Borrowed(memory), KeepAlive::Object(obj.clone().unbind())));
        }
        if obj.hasattr("__dlpack__")? {
            return dlpack(obj, what);
        }
        Err(PyValueError::new_err(format!(
            "{what}: expected device memory (a lazybuf memory object or DeviceBuffer, an object \
             with __cuda_array_interface__, or a DLPack producer), got {}",
            repr(obj)
        )))
    }

    /// Runs `f` with the source's memory and the number of its bytes to copy. Locks the
    /// source's own lock: never call it with that lock held.
    pub fn with<R>(&self, detached: &Detached, f: impl FnOnce(&Memory, usize) -> R) -> PyResult<R> {
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
            Source::Borrowed(memory) => f(memory, memory.len()),
        })
    }

    /// The address that orders the locks of two objects (the source's lock is taken first
    /// when it is lower); 0 for foreign memory, which has no lock.
    pub fn lock_order(&self) -> usize {
        match self {
            Source::Memory(cell) => Arc::as_ptr(cell) as usize,
            Source::Buffer(cell) => Arc::as_ptr(cell) as usize,
            Source::Borrowed(_) => 0,
        }
    }

    /// Whether the source is the memory behind `cell`'s lock (a copy onto itself).
    pub fn is_memory(&self, cell: &Arc<MemoryCell>) -> bool {
        matches!(self, Source::Memory(c) if Arc::ptr_eq(c, cell))
    }

    /// Whether the source is the device buffer behind `cell`'s lock.
    pub fn is_buffer(&self, cell: &Arc<BufferCell>) -> bool {
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
    let devices: Vec<Device> =
        lazybuf::devices().into_iter().filter(|d| d.backend_kind() == BackendKind::CUDA).collect();
    let memory = devices.iter().find_map(|device| {
        // SAFETY: the producer (kept alive by the caller's KeepAlive) owns the memory for as
        // long as the object lives, as the interface requires; the device check refuses
        // pointers that are not this device's memory.
        unsafe { Memory::borrowed(device, RawMemory::Cuda(ptr as u64), nbytes) }.ok()
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
            // SAFETY: the producer promises the stream is live while its interface is used.
            let theirs =
                unsafe { device.wrap_stream(RawStream::Cuda(handle as *mut c_void as _)) }.or_py()?;
            device.stream().wait_for(&theirs.marker().or_py()?).or_py()
        }
    }
}

/// Imports a DLPack producer and wraps its memory on the device it names.
fn dlpack(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<(Source, KeepAlive)> {
    let imported = from_dlpack(obj.as_borrowed(), None, None)?;
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
        let (device, raw) = match dl.device_type {
            DLDeviceType::CPU | DLDeviceType::CUDAHOST => {
                (Device::host(), RawMemory::Host(address as *mut u8))
            }
            DLDeviceType::CUDA | DLDeviceType::CUDAMANAGED => {
                let device = lazybuf::devices()
                    .into_iter()
                    .filter(|d| d.backend_kind() == BackendKind::CUDA)
                    .nth(usize::try_from(dl.device_id).unwrap_or(usize::MAX))
                    .ok_or_else(|| {
                        PyValueError::new_err(format!("{what}: lazybuf has no CUDA device {}", dl.device_id))
                    })?;
                (device, RawMemory::Cuda(address as u64))
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
        unsafe { Memory::borrowed(&device, raw, nbytes) }.or_py()?
    };
    Ok((Source::Borrowed(memory), KeepAlive::Tensor(imported)))
}

/// The DLPack device of memory of `kind` on `device`: the CPU for memory the host addresses
/// as its own (host memory, and every kind on the host device), CUDA or CUDA-managed memory on
/// a CUDA device; `None` where DLPack has no consumer for it (OpenCL device memory).
pub fn dlpack_device(device: &Device, kind: MemoryKind) -> Option<DLDevice> {
    let cuda = device.backend_kind() == BackendKind::CUDA;
    match kind {
        MemoryKind::Host { .. } => Some(DLDevice::CPU),
        _ if device.backend_kind() == BackendKind::HOST => Some(DLDevice::CPU),
        MemoryKind::Device if cuda => Some(DLDevice::cuda(crate::device_view::cuda_ordinal(device))),
        MemoryKind::Shared if cuda => Some(DLDevice {
            device_type: DLDeviceType::CUDAMANAGED,
            device_id: crate::device_view::cuda_ordinal(device),
        }),
        MemoryKind::Shared => Some(DLDevice::CPU),
        MemoryKind::Device => None,
    }
}

/// The consumer's `__dlpack__` arguments.
pub struct DlpackCall<'py> {
    /// The consumer's stream (`None` on the CPU).
    pub stream: Option<Bound<'py, PyAny>>,
    /// The newest DLPack version the consumer understands.
    pub max_version: Option<(u32, u32)>,
    /// Where the consumer wants the tensor.
    pub dl_device: Option<(u32, i32)>,
    /// `True`: always copy; `False`: never copy; `None`: the producer's choice (no copy).
    pub copy: Option<bool>,
}

/// What a zero-copy export of memory shows: its address for the tensor, its length, and the
/// owner that keeps it alive while the tensor lives.
pub struct ExportedBytes {
    /// The address (host address for a CPU tensor, the `CUdeviceptr` on CUDA).
    pub address: usize,
    /// The length in bytes.
    pub nbytes: usize,
    /// What keeps the memory alive.
    pub owner: Arc<dyn Any + Send + Sync>,
}

/// `__dlpack__` of memory of `kind` on `device` as a 1-d uint8 tensor: zero-copy (`view`
/// describes the memory), or, with `copy=True`, a copy in new host memory for the CPU
/// flagged as copied (`read` makes it: a new uint8 NumPy array of the bytes). The consumer's
/// `dl_device`, else the memory's own DLPack device, else the CPU is where the tensor goes;
/// a copy for a device other than the CPU is a `BufferError`.
pub fn export_dlpack<'py>(
    py: Python<'py>,
    device: &Device,
    kind: MemoryKind,
    call: DlpackCall<'py>,
    view: impl FnOnce(Python<'py>) -> PyResult<ExportedBytes>,
    read: impl FnOnce(Python<'py>) -> PyResult<Bound<'py, PyAny>>,
) -> PyResult<Py<PyAny>> {
    let stream = call.stream.filter(|s| !s.is_none());
    let request = ExportRequest::parse(stream.as_ref(), call.max_version, call.dl_device, call.copy)?;
    let home = dlpack_device(device, kind);
    // A copy goes to the CPU (where the consumer asked for no device, too, for memory with
    // no DLPack device of its own).
    let wanted = request.device().or(home).unwrap_or(DLDevice::CPU);
    if wanted == DLDevice::CPU && stream.is_some() {
        return Err(PyValueError::new_err("__dlpack__: stream must be None for an export to the CPU"));
    }
    if call.copy == Some(true) {
        if wanted != DLDevice::CPU {
            return Err(crate::dlpack::copy_elsewhere(wanted));
        }
        let copy = read(py)?;
        return crate::dlpack::export_copy(py, copy, DLDataType::scalar(DLDataTypeCode::UINT, 8), &request);
    }
    let home = home.ok_or_else(|| no_dlpack_device(device, kind))?;
    if wanted != home {
        return Err(PyBufferError::new_err(format!(
            "cannot export to DLPack device ({}, {}): this memory is on ({}, {}); pass copy=True for a copy in \
             host memory",
            wanted.device_type.0, wanted.device_id, home.device_type.0, home.device_id
        )));
    }
    let bytes = view(py)?;
    let exporter = Exporter::bytes(bytes.address as *mut c_void, bytes.nbytes, home, bytes.owner);
    dlpark_export(&exporter, py, request)
}

/// The error for memory DLPack has no device for, naming its backend.
fn no_dlpack_device(device: &Device, kind: MemoryKind) -> PyErr {
    PyBufferError::new_err(format!(
        "{} {} memory has no DLPack device; export a copy with copy=True (for the CPU), or copy it to the \
         host first",
        device.backend_kind().title(),
        kind.name()
    ))
}

/// `__dlpack_device__` of memory of `kind` on `device` (a `BufferError` where DLPack has no
/// device for it).
pub fn dlpack_device_tuple(device: &Device, kind: MemoryKind) -> PyResult<(u32, i32)> {
    let dl = dlpack_device(device, kind).ok_or_else(|| no_dlpack_device(device, kind))?;
    Ok((dl.device_type.0, dl.device_id))
}

/// A `__cuda_array_interface__` (version 3) over `nbytes` at `address`: 1-d, `|u1`.
pub fn cuda_array_interface<'py>(
    py: Python<'py>,
    address: usize,
    nbytes: usize,
) -> PyResult<Bound<'py, PyDict>> {
    crate::device_view::cuda_array_interface(py, address, &[nbytes], lazybuf::DType::U8, false)
}

/// An int from a raw handle, for `ptr` properties: the address of host (and host-device)
/// memory, the `CUdeviceptr`, the `cl_mem`, wgpu's native buffer handle; 0 when empty.
pub fn raw_address(raw: RawMemory) -> usize {
    crate::device_view::raw_address(raw)
}
