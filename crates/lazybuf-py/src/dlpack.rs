//! `__dlpack__` and `__dlpack_device__`: zero-copy export of the host copy (kDLCPU) or, for a
//! buffer on a CUDA device, of its device copy (kDLCUDA), in the versioned ABI when the
//! consumer passes `max_version >= (1, 0)` (NumPy 2 does) and the legacy one otherwise.
//!
//! dlpark does the protocol work (argument parsing, ABI choice, capsule names and single
//! use, zero-copy validation); this module describes the memory, with the one [`Exporter`]
//! every lazybuf object uses (`UnifiedBuffer` here, memory objects and `DeviceBuffer` through
//! [`crate::foreign::export_dlpack`]). Each capsule's manager context holds an owner of the
//! memory (for a buffer, a clone of its storage `Arc`), so an exported tensor keeps the memory
//! alive until the consumer calls its deleter. An export is a write access at the exported
//! location (the consumer may write, and lazybuf cannot see it).
//!
//! `copy=True` exports a copy in new host memory (a fresh NumPy array that only the tensor
//! references) to the CPU, with `DLPACK_FLAG_BITMASK_IS_COPIED` set in the versioned ABI (the
//! legacy ABI has no flags), as the array API standard requires; asking for a copy on another
//! device is a `BufferError`.
//!
//! What does not live here: the memory access ([`crate::views::Storage`]).

use std::any::Any;
use std::ffi::c_void;
use std::mem::ManuallyDrop;
use std::sync::Arc;

use dlpark::allocation::dynamic::Allocation;
use dlpark::ffi::{
    DLDataType, DLDataTypeCode, DLDevice, DLDeviceType, DLManagedTensor, DLManagedTensorVersioned,
};
use dlpark::python::{DlpackExporter, ExportAbi, ExportRequest, export_dlpack};
use dlpark::{DlpackFlags, Managed, ManagedTensorBase};
use numpy::{PyArrayDescr, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::{PyBufferError, PyMemoryError, PyValueError};
use pyo3::prelude::*;

use lazybuf::backend::RawMemory;
use lazybuf::coherence::Access;
use lazybuf::{BackendKind, DType, Device};

use crate::device_view::cuda_ordinal;
use crate::views::Storage;

/// The DLPack device a buffer exports to by default: its CUDA device, else the host.
pub fn dlpack_device(home: &Device) -> DLDevice {
    match home.backend_kind() {
        BackendKind::CUDA => DLDevice::cuda(cuda_ordinal(home)),
        _ => DLDevice::CPU,
    }
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
pub struct DlpackArgs<'py> {
    /// The consumer's stream (`None` on the CPU).
    pub stream: Option<Bound<'py, PyAny>>,
    /// The newest DLPack version the consumer understands.
    pub max_version: Option<(u32, u32)>,
    /// Where the consumer wants the tensor.
    pub dl_device: Option<(u32, i32)>,
    /// `True`: always copy; `False`: never copy; `None`: producer's choice.
    pub copy: Option<bool>,
}

/// The buffer being exported.
pub struct Source<'a, 'py> {
    /// The buffer's memory.
    pub storage: &'a Arc<Storage>,
    /// The buffer's own device.
    pub home: &'a Device,
    /// The dimensions.
    pub shape: &'a [usize],
    /// The element type.
    pub dtype: DType,
    /// The NumPy dtype (for the `copy=True` path).
    pub descr: &'a Bound<'py, PyArrayDescr>,
}

/// Serves `__dlpack__`.
pub fn export<'py>(py: Python<'py>, source: Source<'_, 'py>, args: DlpackArgs<'py>) -> PyResult<Py<PyAny>> {
    let request = ExportRequest::parse(args.stream.as_ref(), args.max_version, args.dl_device, args.copy)?;
    let home_device = dlpack_device(source.home);
    let wanted = request.device().unwrap_or(home_device);
    if wanted.device_type == DLDeviceType::CPU {
        // NumPy's rule for CPU exports: the CPU has no streams, so the consumer passes None.
        if let Some(stream) = &args.stream {
            return Err(PyValueError::new_err(format!(
                "__dlpack__: stream must be None for an export to the CPU (it has no streams), \
                 got {}",
                stream.repr().map(|r| r.to_string()).unwrap_or_else(|_| "<unprintable>".into())
            )));
        }
        if args.copy == Some(true) {
            let copy = source.storage.to_array(py, source.shape, source.descr)?;
            return export_copy(py, copy, data_type(source.dtype), &request);
        }
        let address = source.storage.host_address_nogil(py, Access::Write)?;
        let exporter = Exporter::of_buffer(address.cast(), DLDevice::CPU, &source);
        return export_dlpack(&exporter, py, request);
    }
    if wanted != home_device || source.home.backend_kind() != BackendKind::CUDA {
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
        return Err(copy_elsewhere(wanted));
    }
    match source.storage.device_handle_nogil(py, source.home, Access::Write)? {
        RawMemory::Cuda(ptr) => {
            let exporter = Exporter::of_buffer(ptr as usize as *mut c_void, home_device, &source);
            export_dlpack(&exporter, py, request)
        }
        other => Err(PyBufferError::new_err(format!("unexpected device memory {other:?} for a CUDA buffer"))),
    }
}

/// The error for `copy=True` towards a device other than the CPU.
pub fn copy_elsewhere(wanted: DLDevice) -> PyErr {
    PyBufferError::new_err(format!(
        "copy=True is supported only for export to the CPU (DLPack device (1, 0)): it copies into host \
         memory; device ({}, {}) was asked for",
        wanted.device_type.0, wanted.device_id
    ))
}

/// Exports `array` (a new C-contiguous NumPy array that nothing else references: the copy)
/// as a CPU tensor of `dtype` elements, flagged as copied (versioned ABI); `request` is the
/// consumer's (its device, if any, must be the CPU).
pub fn export_copy(
    py: Python<'_>,
    array: Bound<'_, PyAny>,
    dtype: DLDataType,
    request: &ExportRequest<'_>,
) -> PyResult<Py<PyAny>> {
    if let Some(wanted) = request.device()
        && wanted != DLDevice::CPU
    {
        return Err(copy_elsewhere(wanted));
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
pub struct Exporter {
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
    pub fn bytes(
        address: *mut c_void,
        nbytes: usize,
        device: DLDevice,
        owner: Arc<dyn Any + Send + Sync>,
    ) -> Self {
        let dtype = DLDataType::scalar(DLDataTypeCode::UINT, 8);
        Exporter { address, device, dtype, shape: vec![nbytes as i64], owner, copied: false }
    }

    fn of_buffer(address: *mut c_void, device: DLDevice, source: &Source<'_, '_>) -> Self {
        Exporter {
            address,
            device,
            dtype: data_type(source.dtype),
            shape: source.shape.iter().map(|&d| d as i64).collect(),
            owner: Arc::clone(source.storage) as Arc<dyn Any + Send + Sync>,
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
