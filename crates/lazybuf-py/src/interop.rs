//! Every export of lazybuf's memory to other libraries, one implementation each: the buffer
//! protocol (`Py_buffer`), DLPack (`__dlpack__`, `__dlpack_device__`) and the CUDA array
//! interface (`__cuda_array_interface__`), for buffers, memory objects, device buffers, device
//! views and Dask device frames. Which device memory is where (the CUDA ordinal, the DLPack
//! device of each memory kind) is the core's answer ([`lazybuf::DeviceInfo`]), never matched
//! on a backend here.
//!
//! **DLPack.** Zero-copy export of a buffer's host copy (kDLCPU) or, on a CUDA device, of its
//! device copy (kDLCUDA); of memory objects and device buffers as 1-d uint8 tensors on their
//! memory's DLPack device (memory DLPack has no device for, OpenCL and wgpu device memory, is
//! a `BufferError` naming its backend, except with `copy=True`; a consumer asking for the CPU
//! with `copy=None`, as `numpy.from_dlpack(obj, device="cpu")` does, gets a host copy of memory
//! that is not the CPU's). The consumer's `stream` is checked as DLPack defines it
//! ([`DlpackArgs`]). The versioned ABI when the
//! consumer passes `max_version >= (1, 0)` (NumPy 2 does), the legacy one otherwise. dlpark
//! does the protocol work (argument parsing, ABI choice, capsule names and single use,
//! zero-copy validation); this module describes the memory, with the one [`Exporter`]. Each
//! capsule's manager context holds an owner of the memory (for a buffer, the export's
//! [`Exposure`], which holds its storage), so an exported tensor keeps the memory alive, and
//! in use for spilling, until its deleter runs (the consumer's tensor is gone, or the capsule
//! was dropped unconsumed). An export is a write access at the exported location (the consumer may write, and
//! lazybuf cannot see it). `copy=True` exports a copy in new host memory (a fresh NumPy array
//! that only the tensor references) to the CPU, with `DLPACK_FLAG_BITMASK_IS_COPIED` set in the
//! versioned ABI (the legacy ABI has no flags), as the array API standard requires; asking for
//! a copy on another device is a `BufferError`.
//!
//! **Buffer protocol.** [`export_buffer`] fills a `Py_buffer` over C-contiguous host memory;
//! the caller says what keeps it alive and whether a writable request is a write.
//!
//! What does not live here: the memory access ([`crate::views::Storage`]); imports of foreign
//! memory ([`crate::foreign`]).

use std::any::Any;
use std::ffi::{CStr, c_int, c_void};
use std::mem::ManuallyDrop;
use std::ptr;
use std::sync::Arc;

use dlpark::allocation::dynamic::Allocation;
use dlpark::ffi::{
    DLDataType, DLDataTypeCode, DLDevice, DLDeviceType, DLManagedTensor, DLManagedTensorVersioned,
};
use dlpark::python::{DlpackExporter, ExportAbi, ExportRequest, export_dlpack as dlpark_export};
use dlpark::{DlpackFlags, Managed, ManagedTensorBase};
use numpy::{PyArrayDescr, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::{PyAttributeError, PyBufferError, PyMemoryError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use lazybuf::coherence::Access;
use lazybuf::{DType, Device, DlpackDevice, MemoryKind};

use crate::dtype::typestr;
use crate::gil_cell::interned;
use crate::views::Exposure;
use crate::views::Storage;

/// dlpark's spelling of a DLPack device the core names.
pub(crate) fn dl_device(device: DlpackDevice) -> DLDevice {
    DLDevice { device_type: DLDeviceType(device.device_type), device_id: device.device_id }
}

/// Whether `device`'s device memory is addressed by CUDA device pointers (a CUDA device): what
/// the CUDA array interface and CuPy describe.
pub(crate) fn addresses_cuda(device: &Device) -> bool {
    device.info().dlpack_device(MemoryKind::Device).is_some_and(|d| d.is_cuda())
}

/// The DLPack device a buffer exports to by default: its device where DLPack has one for
/// device memory other than the CPU (CUDA), else the host.
pub(crate) fn buffer_dlpack_device(home: &Device) -> DLDevice {
    home.info().dlpack_device(MemoryKind::Device).map_or(DLDevice::CPU, dl_device)
}

fn data_type(dtype: DType) -> DLDataType {
    let (code, bits) = match dtype {
        DType::U8 => (DLDataTypeCode::UINT, 8),
        DType::U16 => (DLDataTypeCode::UINT, 16),
        DType::U32 => (DLDataTypeCode::UINT, 32),
        DType::U64 => (DLDataTypeCode::UINT, 64),
        DType::I8 => (DLDataTypeCode::INT, 8),
        DType::I16 => (DLDataTypeCode::INT, 16),
        DType::I32 => (DLDataTypeCode::INT, 32),
        DType::I64 => (DLDataTypeCode::INT, 64),
        DType::F16 => (DLDataTypeCode::FLOAT, 16),
        DType::BF16 => (DLDataTypeCode::BFLOAT, 16),
        DType::F32 => (DLDataTypeCode::FLOAT, 32),
        DType::F64 => (DLDataTypeCode::FLOAT, 64),
        DType::C64 => (DLDataTypeCode::COMPLEX, 64),
        DType::C128 => (DLDataTypeCode::COMPLEX, 128),
    };
    DLDataType::scalar(code, bits)
}

/// The arguments of one `__dlpack__` call.
pub(crate) struct DlpackArgs<'py> {
    /// The consumer's stream (`None` on the CPU), checked ([`stream_value`]); `None` when the
    /// consumer passed none or `None`.
    pub(crate) stream: Option<Bound<'py, PyAny>>,
    /// Its value as DLPack defines it (see [`stream_value`]).
    stream_value: Option<i128>,
    /// The newest DLPack version the consumer understands.
    pub(crate) max_version: Option<(u32, u32)>,
    /// Where the consumer wants the tensor.
    pub(crate) dl_device: Option<(u32, i32)>,
    /// `True`: always copy; `False`: never copy; `None`: producer's choice.
    pub(crate) copy: Option<bool>,
}

impl<'py> DlpackArgs<'py> {
    /// The arguments as `__dlpack__` received them: `stream`, `max_version` and `dl_device`
    /// are checked here, before anything is accessed, so a value of the wrong type is a
    /// `TypeError` and one out of range a `ValueError`, each naming the argument (extracted as
    /// `(u32, u32)` by PyO3, `(-1, -1)` raised an `OverflowError` that named nothing; any
    /// `stream` was taken). What a stream means depends on where the tensor goes:
    /// [`DlpackArgs::check_stream_for`].
    pub(crate) fn new(
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<Bound<'py, PyAny>>,
        dl_device: Option<Bound<'py, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Self> {
        let stream = stream.filter(|s| !s.is_none());
        let stream_value = stream.as_ref().map(stream_value).transpose()?;
        let max_version =
            int_pair(max_version, "max_version", "(major, minor), two ints from 0 to 2**32 - 1")?;
        let dl_device = int_pair(
            dl_device,
            "dl_device",
            "(device_type, device_id), an int from 0 to 2**32 - 1 and one from -2**31 to 2**31 - 1",
        )?;
        Ok(DlpackArgs { stream, stream_value, max_version, dl_device, copy })
    }

    /// Checks the consumer's stream against the DLPack device `wanted` the tensor goes to: the
    /// CPU has no streams (it must be `None`, NumPy's rule); for CUDA memory DLPack forbids 0
    /// (ambiguous: it could mean `None`, 1 or 2). lazybuf's copies are complete when they
    /// return, so any other stream needs no synchronization.
    pub(crate) fn check_stream_for(&self, wanted: DLDevice) -> PyResult<()> {
        let (Some(stream), Some(value)) = (&self.stream, self.stream_value) else {
            return Ok(());
        };
        if wanted.device_type == DLDeviceType::CPU {
            return Err(PyValueError::new_err(format!(
                "__dlpack__: stream must be None for an export to the CPU (it has no streams), got {}",
                crate::args::repr(stream)
            )));
        }
        let cuda = [DLDeviceType::CUDA, DLDeviceType::CUDAMANAGED].contains(&wanted.device_type);
        if cuda && value == 0 {
            return Err(PyValueError::new_err(format!(
                "__dlpack__: stream 0 is not allowed for CUDA memory (DLPack forbids it: it could mean \
                 None, 1 or 2); expected {STREAM_VALUES}"
            )));
        }
        Ok(())
    }
}

/// What a `stream` argument may be, for messages.
const STREAM_VALUES: &str = "None, -1 (no synchronization), 1 (the legacy default stream), 2 (the \
     per-thread default stream) or a stream handle (an int above 2, or an object with __cuda_stream__)";

/// The value of a consumer's `stream` (not `None`) as DLPack defines it: an int (a NumPy
/// integer too) or an object with `__cuda_stream__` (an int, or a method returning one, as
/// `torch.cuda.Stream` has), from -1 up to the largest handle (`usize::MAX`). Of another type
/// (a bool included): `TypeError`; out of that range: `ValueError`.
fn stream_value(stream: &Bound<'_, PyAny>) -> PyResult<i128> {
    let wrong_type = || {
        pyo3::exceptions::PyTypeError::new_err(format!(
            "__dlpack__: stream must be {STREAM_VALUES}; got {}",
            crate::args::repr(stream)
        ))
    };
    let as_int = |x: &Bound<'_, PyAny>| -> PyResult<Option<i128>> {
        if x.is_instance_of::<pyo3::types::PyBool>() {
            return Err(wrong_type());
        }
        match x.extract::<i128>() {
            Ok(value) => Ok(Some(value)),
            Err(err) if err.is_instance_of::<pyo3::exceptions::PyOverflowError>(x.py()) => {
                Err(PyValueError::new_err(format!(
                    "__dlpack__: stream {} is out of range; expected {STREAM_VALUES}",
                    crate::args::repr(stream)
                )))
            }
            Err(_) => Ok(None),
        }
    };
    let value = match as_int(stream)? {
        Some(value) => value,
        None => {
            let py = stream.py();
            let Ok(handle) = stream.getattr(interned!(py, "__cuda_stream__")) else {
                return Err(wrong_type());
            };
            let handle = if handle.is_callable() { handle.call0()? } else { handle };
            as_int(&handle)?.ok_or_else(wrong_type)?
        }
    };
    if value < -1 || value > usize::MAX as i128 {
        return Err(PyValueError::new_err(format!(
            "__dlpack__: stream {value} is out of range; expected {STREAM_VALUES}"
        )));
    }
    Ok(value)
}

/// `value` (`None`: not given) as a pair of ints that fit `A` and `B`; an error naming `name`
/// and `expected` otherwise.
fn int_pair<A: TryFrom<i128>, B: TryFrom<i128>>(
    value: Option<Bound<'_, PyAny>>,
    name: &str,
    expected: &str,
) -> PyResult<Option<(A, B)>> {
    let Some(value) = value.filter(|v| !v.is_none()) else {
        return Ok(None);
    };
    let wrong = || format!("__dlpack__: {name} must be {expected}; got {}", crate::args::repr(&value));
    let (a, b): (Bound<'_, PyAny>, Bound<'_, PyAny>) =
        value.extract().map_err(|_| pyo3::exceptions::PyTypeError::new_err(wrong()))?;
    // An int, or any integer with `__index__` (a NumPy integer), as PyO3's extraction took;
    // not a bool.
    let int = |x: &Bound<'_, PyAny>| -> PyResult<i128> {
        if x.is_instance_of::<pyo3::types::PyBool>() {
            return Err(pyo3::exceptions::PyTypeError::new_err(wrong()));
        }
        x.extract::<i128>().map_err(|err| {
            if err.is_instance_of::<pyo3::exceptions::PyOverflowError>(x.py()) {
                PyValueError::new_err(wrong())
            } else {
                pyo3::exceptions::PyTypeError::new_err(wrong())
            }
        })
    };
    let first = A::try_from(int(&a)?).map_err(|_| PyValueError::new_err(wrong()))?;
    let second = B::try_from(int(&b)?).map_err(|_| PyValueError::new_err(wrong()))?;
    Ok(Some((first, second)))
}

/// The buffer being exported.
pub(crate) struct Source<'a, 'py> {
    /// The buffer's memory.
    pub(crate) storage: &'a Arc<Storage>,
    /// The buffer's own device.
    pub(crate) home: &'a Device,
    /// The dimensions.
    pub(crate) shape: &'a [usize],
    /// The element type.
    pub(crate) dtype: DType,
    /// The NumPy dtype (for the `copy=True` path).
    pub(crate) descr: &'a Bound<'py, PyArrayDescr>,
    /// The call exporting it (`__dlpack__`, explicit or implicit): names its copies.
    pub(crate) call: lazybuf::observe::Cause,
}

/// Serves `UnifiedBuffer.__dlpack__`.
pub(crate) fn dlpack_of_buffer<'py>(
    py: Python<'py>,
    source: Source<'_, 'py>,
    args: DlpackArgs<'py>,
) -> PyResult<Py<PyAny>> {
    let request = ExportRequest::parse(args.stream.as_ref(), args.max_version, args.dl_device, args.copy)?;
    let home_device = buffer_dlpack_device(source.home);
    let wanted = request.device().unwrap_or(home_device);
    args.check_stream_for(wanted)?;
    if wanted.device_type == DLDeviceType::CPU {
        if args.copy == Some(true) {
            let copy = source.storage.to_array(py, source.shape, source.descr, source.call)?;
            return export_copy(py, copy, data_type(source.dtype), &request);
        }
        let (address, exposure) = source.storage.host_address_nogil(py, Access::Write)?;
        let exporter = Exporter::of_buffer(address.cast(), DLDevice::CPU, &source, exposure);
        return dlpark_export(&exporter, py, request);
    }
    if wanted != home_device {
        return Err(PyBufferError::new_err(format!(
            "cannot export to DLPack device ({}, {}): this buffer can export to the CPU (1, 0){}",
            wanted.device_type.0,
            wanted.device_id,
            if home_device == DLDevice::CPU {
                String::new()
            } else {
                format!(" and to its device ({}, {})", home_device.device_type.0, home_device.device_id)
            }
        )));
    }
    if args.copy == Some(true) {
        return Err(copy_elsewhere(wanted, request.device().is_some()));
    }
    // The home device's DLPack device is not the CPU here: its memory is a device pointer.
    let (handle, exposure) =
        source.storage.device_handle_nogil(py, source.home, Access::Write, source.call)?;
    let exporter = Exporter::of_buffer(handle.as_int() as *mut c_void, home_device, &source, exposure);
    dlpark_export(&exporter, py, request)
}

/// The error for `copy=True` towards a device other than the CPU: one the consumer named
/// (`asked`), or the object's own, which DLPack's `copy=True` without `dl_device` means.
pub(crate) fn copy_elsewhere(wanted: DLDevice, asked: bool) -> PyErr {
    let (x, y) = (wanted.device_type.0, wanted.device_id);
    PyBufferError::new_err(if asked {
        format!(
            "copy=True is supported only for export to the CPU (DLPack device (1, 0)): it copies into host \
             memory; device ({x}, {y}) was asked for"
        )
    } else {
        format!(
            "copy=True without dl_device asks for a copy on the object's own device, DLPack device ({x}, {y}), \
             which lazybuf does not make; pass dl_device=(1, 0) for a fresh copy in host memory \
             (NumPy: numpy.from_dlpack(obj, device=\"cpu\", copy=True))"
        )
    })
}

/// Exports `array` (a new C-contiguous NumPy array that nothing else references: the copy)
/// as a CPU tensor of `dtype` elements, flagged as copied (versioned ABI); `request` is the
/// consumer's (its device, if any, must be the CPU).
pub(crate) fn export_copy(
    py: Python<'_>,
    array: Bound<'_, PyAny>,
    dtype: DLDataType,
    request: &ExportRequest<'_>,
) -> PyResult<Py<PyAny>> {
    if let Some(wanted) = request.device()
        && wanted != DLDevice::CPU
    {
        return Err(copy_elsewhere(wanted, true));
    }
    let array = array.cast_into::<PyUntypedArray>()?;
    if !array.is_c_contiguous() {
        return Err(PyBufferError::new_err("internal: a DLPack copy must be C-contiguous"));
    }
    let shape = array.shape().iter().map(|&d| d as i64).collect();
    // SAFETY: array is a live NumPy array; its data field is read, not dereferenced.
    let address = unsafe { (*array.as_array_ptr()).fields.data }.cast::<c_void>();
    let owner: Arc<dyn Any + Send + Sync> = Arc::new(PyOwner(ManuallyDrop::new(array.into_any().unbind())));
    let exporter = Exporter { address, device: DLDevice::CPU, dtype, shape, owner, copied: true };
    let capsule = match request.abi() {
        ExportAbi::Versioned => exporter.managed::<DLManagedTensorVersioned>()?.into_pyobject(py)?.into_any(),
        ExportAbi::Legacy => exporter.managed::<DLManagedTensor>()?.into_pyobject(py)?.into_any(),
    };
    Ok(capsule.unbind())
}

/// A Python object owned by a tensor's manager context; released with the interpreter
/// attached, whichever thread runs the consumer's deleter (leaked if the interpreter is gone).
struct PyOwner(ManuallyDrop<Py<PyAny>>);

impl Drop for PyOwner {
    fn drop(&mut self) {
        // SAFETY: taken once, here; the field is not used again.
        let object = unsafe { ManuallyDrop::take(&mut self.0) };
        let object = ManuallyDrop::new(object);
        let _ = Python::try_attach(|_| drop(ManuallyDrop::into_inner(object)));
    }
}

/// One export's description of the memory, for every lazybuf object: where the bytes are,
/// their device, element type and (C-order) shape, and the owner that keeps them alive.
pub(crate) struct Exporter {
    address: *mut c_void,
    device: DLDevice,
    dtype: DLDataType,
    shape: Vec<i64>,
    owner: Arc<dyn Any + Send + Sync>,
    /// Whether the memory is a copy made for this export, owned by it alone.
    copied: bool,
}

impl Exporter {
    /// `nbytes` at `address` on `device` as a 1-d uint8 tensor, kept alive by `owner`.
    pub(crate) fn bytes(
        address: *mut c_void,
        nbytes: usize,
        device: DLDevice,
        owner: Arc<dyn Any + Send + Sync>,
    ) -> Self {
        let dtype = DLDataType::scalar(DLDataTypeCode::UINT, 8);
        Exporter { address, device, dtype, shape: vec![nbytes as i64], owner, copied: false }
    }

    /// A buffer's memory at `address` on `device`; the owner is `exposure` (which keeps the
    /// storage alive), so the memory stays in use until the capsule's deleter runs: when the
    /// consumer's tensor is gone, or the capsule is dropped unconsumed.
    fn of_buffer(
        address: *mut c_void,
        device: DLDevice,
        source: &Source<'_, '_>,
        exposure: Exposure,
    ) -> Self {
        Exporter {
            address,
            device,
            dtype: data_type(source.dtype),
            shape: source.shape.iter().map(|&d| d as i64).collect(),
            owner: Arc::new(exposure) as Arc<dyn Any + Send + Sync>,
            copied: false,
        }
    }

    fn managed<M: ManagedTensorBase>(&self) -> PyResult<Managed<M>> {
        let ndim = self.shape.len();
        let mut allocation =
            Allocation::<M>::allocate(2 * ndim).map_err(|e| PyMemoryError::new_err(e.to_string()))?;
        let extra = allocation.extra_mut();
        extra[..ndim].copy_from_slice(&self.shape);
        let mut stride = 1i64;
        for i in (0..ndim).rev() {
            extra[ndim + i] = stride;
            stride *= self.shape[i];
        }
        let mut tensor = allocation
            .initialize(Box::new(Arc::clone(&self.owner)), ndim)
            .map_err(|e| PyMemoryError::new_err(e.to_string()))?;
        let extra = tensor.extra_mut();
        let (shape, strides) = extra.split_at_mut(ndim);
        let (shape, strides) = (shape.as_mut_ptr(), strides.as_mut_ptr());
        tensor.tensor_mut().shape = shape;
        tensor.tensor_mut().strides = strides;
        tensor.set_data(self.address).set_device(self.device).set_dtype(self.dtype);
        if self.copied {
            // SAFETY: a copied export's memory is a new array made for it, referenced only by
            // the owner in this tensor's manager context (see export_copy).
            unsafe { tensor.set_flags_unchecked(DlpackFlags::IS_COPIED) };
        }
        // SAFETY: data points to prod(shape) elements of dtype on `device`, kept alive by the
        // owner in the manager context until the deleter runs; shape and strides point into
        // the tensor's own allocation; the strides describe C order; the memory is writable
        // (no READ_ONLY flag), and IS_COPIED is set only for a copy.
        Ok(unsafe { tensor.finish() })
    }
}

impl DlpackExporter for Exporter {
    fn device(&self) -> DLDevice {
        self.device
    }

    fn flags(&self) -> DlpackFlags {
        // dlpark's zero-copy path; copies go through export_copy.
        DlpackFlags::empty()
    }

    fn prepare_export(&self, _py: Python<'_>, _request: &ExportRequest<'_>) -> PyResult<()> {
        // lazybuf's copies are complete when they return: nothing is pending on any stream.
        Ok(())
    }

    fn export_legacy(&self, _py: Python<'_>) -> PyResult<Managed<DLManagedTensor>> {
        self.managed()
    }

    fn export_versioned(&self, _py: Python<'_>) -> PyResult<Managed<DLManagedTensorVersioned>> {
        self.managed()
    }
}

// --- memory objects and device buffers: DLPack over bytes ---------------------------------

/// The DLPack device of memory of `kind` on `device`: the CPU for memory the host addresses
/// as its own (host memory, and every kind on the host device), CUDA or CUDA-managed memory on
/// a CUDA device; `None` where DLPack has no consumer for it (OpenCL device memory).
pub(crate) fn dlpack_device(device: &Device, kind: MemoryKind) -> Option<DLDevice> {
    device.info().dlpack_device(kind).map(dl_device)
}

/// What a zero-copy export of memory shows: its address for the tensor, its length, and the
/// owner that keeps it alive while the tensor lives.
pub(crate) struct ExportedBytes {
    /// The address (host address for a CPU tensor, the `CUdeviceptr` on CUDA).
    pub(crate) address: usize,
    /// The length in bytes.
    pub(crate) nbytes: usize,
    /// What keeps the memory alive.
    pub(crate) owner: Arc<dyn Any + Send + Sync>,
}

/// `__dlpack__` of memory of `kind` on `device` (memory objects, device buffers) as a 1-d uint8
/// tensor: zero-copy (`view` describes the memory), or a copy in new host memory for the CPU
/// flagged as copied (`read` makes it: a new uint8 NumPy array of the bytes) with `copy=True`,
/// and with `copy=None` when the consumer asked for the CPU and the memory is not the CPU's.
/// The consumer's `dl_device`, else the memory's own DLPack device, else the CPU is where the
/// tensor goes; a copy for a device other than the CPU is a `BufferError`.
pub(crate) fn dlpack_of_bytes<'py>(
    py: Python<'py>,
    device: &Device,
    kind: MemoryKind,
    call: DlpackArgs<'py>,
    view: impl FnOnce(Python<'py>) -> PyResult<ExportedBytes>,
    read: impl FnOnce(Python<'py>) -> PyResult<Bound<'py, PyAny>>,
) -> PyResult<Py<PyAny>> {
    let request = ExportRequest::parse(call.stream.as_ref(), call.max_version, call.dl_device, call.copy)?;
    let home = dlpack_device(device, kind);
    // A copy goes to the CPU (where the consumer asked for no device, too, for memory with
    // no DLPack device of its own).
    let wanted = request.device().or(home).unwrap_or(DLDevice::CPU);
    call.check_stream_for(wanted)?;
    // `copy=None` leaves the choice to the producer (the array API standard: reuse the memory
    // if possible, copy otherwise): memory a consumer asked for on the CPU that is not CPU
    // memory is exported as a host copy, as with `copy=True` (NumPy's
    // `numpy.from_dlpack(obj, device="cpu")`). Without `dl_device` the tensor goes to the
    // memory's own device, which is no copy.
    let copy_to_cpu =
        call.copy.is_none() && request.device() == Some(DLDevice::CPU) && home != Some(DLDevice::CPU);
    if call.copy == Some(true) || copy_to_cpu {
        if wanted != DLDevice::CPU {
            return Err(copy_elsewhere(wanted, request.device().is_some()));
        }
        let copy = read(py)?;
        return export_copy(py, copy, DLDataType::scalar(DLDataTypeCode::UINT, 8), &request);
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
pub(crate) fn dlpack_device_tuple(device: &Device, kind: MemoryKind) -> PyResult<(u32, i32)> {
    let dl = dlpack_device(device, kind).ok_or_else(|| no_dlpack_device(device, kind))?;
    Ok((dl.device_type.0, dl.device_id))
}

// --- the CUDA array interface ----------------------------------------------------------

/// A CUDA Array Interface (version 3) dictionary for C-contiguous memory at `address`.
pub(crate) fn cuda_array_interface<'py>(
    py: Python<'py>,
    address: usize,
    shape: &[usize],
    dtype: DType,
    readonly: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let typestr = typestr(dtype).ok_or_else(|| {
        PyAttributeError::new_err(format!(
            "{dtype} has no __cuda_array_interface__ type string; use __dlpack__ instead"
        ))
    })?;
    let dict = PyDict::new(py);
    dict.set_item("shape", pyo3::types::PyTuple::new(py, shape)?)?;
    dict.set_item("typestr", typestr)?;
    dict.set_item("data", (address, readonly))?;
    dict.set_item("strides", py.None())?;
    dict.set_item("version", 3)?;
    // lazybuf's copies are complete when they return: no stream to synchronize with.
    dict.set_item("stream", py.None())?;
    Ok(dict)
}

// --- NumPy's array interface ------------------------------------------------------------

/// A NumPy array interface (version 3) dictionary for read-only, C-contiguous host memory at
/// `address`.
pub(crate) fn array_interface<'py>(
    py: Python<'py>,
    address: usize,
    shape: &[usize],
    dtype: DType,
) -> PyResult<Bound<'py, PyDict>> {
    let typestr = typestr(dtype).ok_or_else(|| {
        PyAttributeError::new_err(format!(
            "{dtype} has no array-interface type string; use .host or __dlpack__"
        ))
    })?;
    let dict = PyDict::new(py);
    dict.set_item("shape", pyo3::types::PyTuple::new(py, shape)?)?;
    dict.set_item("typestr", &typestr)?;
    dict.set_item("descr", vec![("", typestr)])?;
    dict.set_item("data", (address, true))?;
    dict.set_item("strides", py.None())?;
    dict.set_item("version", 3)?;
    Ok(dict)
}

// --- the buffer protocol ---------------------------------------------------------------

/// What a buffer-protocol export holds until it is released: the owner of the memory and the
/// metadata arrays the `Py_buffer` points into.
struct BufferExport {
    _owner: Box<dyn Any>,
    shape: Vec<isize>,
    strides: Vec<isize>,
}

/// The memory one buffer-protocol export shows, from [`export_buffer`]'s `memory` callback.
pub(crate) struct ExportedHost {
    /// The host address of the first byte.
    pub(crate) address: *mut u8,
    /// Whether the consumer may write.
    pub(crate) writable: bool,
    /// What keeps the memory alive until the export is released.
    pub(crate) owner: Box<dyn Any>,
}

/// Fills a `Py_buffer` for `exporter` over C-contiguous host memory of `shape` elements of
/// `itemsize` bytes (`format`: their PEP 3118 format, or why there is none). `memory` is
/// asked for the memory once the request is known to be served, with whether the consumer
/// asked for `PyBUF_WRITABLE`. Without `PyBUF_ND` it is a 1-d view of the bytes, as CPython's
/// rule for plain-bytes requests says.
///
/// # Safety
/// `view` must be the `Py_buffer` CPython passed to `bf_getbuffer`; the address `memory` gives
/// must be valid for the bytes while its owner lives.
pub(crate) unsafe fn export_buffer(
    view: *mut ffi::Py_buffer,
    flags: c_int,
    exporter: Bound<'_, PyAny>,
    shape: &[usize],
    itemsize: usize,
    format: PyResult<&'static CStr>,
    memory: impl FnOnce(bool) -> PyResult<ExportedHost>,
) -> PyResult<()> {
    if view.is_null() {
        return Err(PyBufferError::new_err("the buffer protocol passed a null Py_buffer"));
    }
    // SAFETY: view is valid (checked non-null; CPython's contract); obj must be NULL on error.
    unsafe { (*view).obj = ptr::null_mut() };
    // Without PyBUF_ND the consumer asked for plain bytes (PyBUF_SIMPLE, or PyBUF_WRITABLE
    // alone): CPython's rule (PyBuffer_FillInfo) is a 1-d view of unsigned bytes, with no
    // shape or strides, itemsize 1, and format "B" if the consumer asked for one. Such a view
    // needs no format of the elements: served for every dtype (a bfloat16 buffer's bytes to
    // `hashlib` or a file's `write` were refused until the fifteenth session).
    let nd = flags & ffi::PyBUF_ND == ffi::PyBUF_ND;
    let format = if nd { format? } else { c"B" };
    let fortran = flags & ffi::PyBUF_F_CONTIGUOUS == ffi::PyBUF_F_CONTIGUOUS;
    // C order is also Fortran order when at most one extent exceeds 1, or when there is no
    // element at all (CPython's rule, `PyBuffer_IsContiguous`: an empty (0, 3, 4) buffer was
    // refused, as NumPy's is not).
    let empty = shape.contains(&0);
    if fortran && !empty && shape.iter().filter(|&&d| d > 1).count() > 1 {
        return Err(PyBufferError::new_err("the buffer is C-contiguous, not Fortran-contiguous"));
    }
    let ExportedHost { address, writable, owner } =
        memory(flags & ffi::PyBUF_WRITABLE == ffi::PyBUF_WRITABLE)?;
    let itemsize = itemsize as isize;
    let mut strides = vec![itemsize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1] as isize;
    }
    let mut export =
        Box::new(BufferExport { _owner: owner, shape: shape.iter().map(|&d| d as isize).collect(), strides });
    let nbytes = shape.iter().product::<usize>() as isize * itemsize;
    let strided = flags & ffi::PyBUF_STRIDES == ffi::PyBUF_STRIDES;
    let with_format = flags & ffi::PyBUF_FORMAT == ffi::PyBUF_FORMAT;
    // SAFETY: view is valid; the shape and strides arrays live in the boxed export, which is
    // freed only in release_buffer; the formats are static strings; address is valid for
    // nbytes while the export's owner lives (the caller's promise); obj takes a new reference
    // to exporter.
    unsafe {
        (*view).buf = address.cast();
        (*view).len = nbytes;
        (*view).readonly = c_int::from(!writable);
        if nd {
            (*view).itemsize = itemsize;
            (*view).format = if with_format { format.as_ptr().cast_mut() } else { ptr::null_mut() };
            (*view).ndim = shape.len() as c_int;
            (*view).shape = export.shape.as_mut_ptr();
            (*view).strides = if strided { export.strides.as_mut_ptr() } else { ptr::null_mut() };
        } else {
            (*view).itemsize = 1;
            (*view).format = if with_format { format.as_ptr().cast_mut() } else { ptr::null_mut() };
            (*view).ndim = 1;
            (*view).shape = ptr::null_mut();
            (*view).strides = ptr::null_mut();
        }
        (*view).suboffsets = ptr::null_mut();
        (*view).internal = Box::into_raw(export).cast();
        (*view).obj = exporter.into_ptr();
    }
    Ok(())
}

/// Frees what [`export_buffer`] attached to `view` (the memory may go back to its pool now).
///
/// # Safety
/// `view` must be a `Py_buffer` filled by [`export_buffer`], released once.
pub(crate) unsafe fn release_buffer(view: *mut ffi::Py_buffer) {
    if view.is_null() {
        return;
    }
    // SAFETY: internal is the boxed export set by export_buffer (or null); taken once.
    unsafe {
        let internal = (*view).internal;
        if !internal.is_null() {
            (*view).internal = ptr::null_mut();
            drop(Box::from_raw(internal.cast::<BufferExport>()));
        }
    }
}
