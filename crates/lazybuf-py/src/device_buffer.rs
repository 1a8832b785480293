//! `lazybuf.DeviceBuffer`: RMM's resizable buffer of device bytes over the core's
//! [`lazybuf::DeviceBuffer`], on every device (CUDA, OpenCL, the host device).
//!
//! As in RMM: `size`/`nbytes`/`len()`, `capacity()`, `reserve(n)`, `resize(n)` (keeps the
//! contents; within the capacity nothing moves), `to_device(host_bytes)` with strict checks of
//! its input ([`crate::hostbuf`]), `copy_to_host(ary=None)`, `copy_from_host(ary)` (a shorter
//! source fills a prefix), `copy_from_device(obj)` ([`crate::foreign`]), `tobytes()`,
//! `copy()` on the device, `ptr`, `__cuda_array_interface__` (CUDA devices), DLPack, and
//! pickling through a host copy, `mr=` (a `lazybuf.mr` resource, kept alive with the buffer; default:
//! the device's current resource); plus `shrink_to_fit()` and `device`. Differences: every call is synchronous (there is no `stream`
//! argument), a negative size is a `ValueError`, sizes are ints ([`crate::args::size`]; a bool is a `TypeError`), and
//! `__sizeof__` counts the object as well as the bytes it holds (its capacity).
//!
//! **Addresses and reallocation.** As in RMM, a reallocation (`resize`/`reserve` beyond the
//! capacity, `shrink_to_fit`) gives the old allocation back at once: a `ptr` int or a
//! `__cuda_array_interface__` read before it is dangling after it (an int is no reference, and
//! nothing can tell how long its reader keeps it). A DLPack tensor is a reference: it holds its
//! allocation itself ([`lazybuf::AllocationHold`]), so the memory it shows stays valid until
//! the consumer lets go of it, across reallocations and after the buffer is gone; memory no
//! tensor holds any more is given back.
//!
//! Results sized by the buffer (`tobytes()`, `copy_to_host()`, pickling, DLPack copies) are
//! allocated through Python: `MemoryError` when the host has no memory for them.
//!
//! **Seen copies.** Each copy between memories (device memory to or from the host, or between
//! device memories) is seen by the transfer guard and the recorder ([`lazybuf::observe`]),
//! named by the Python call: explicit for `to_device`, `copy_to_host`, `copy_from_host`,
//! `copy_from_device`, `tobytes`, `copy()` (and `__dlpack__(copy=True)`); implicit for
//! pickling, unpickling, DLPack's host copy with `copy=None` and a reallocation's move
//! (`resize`, `reserve`, `shrink_to_fit`).
//!
//! Threads: the buffer is locked for each call, always with the GIL released (so a memory
//! resource's Python callback can run meanwhile); two buffers are locked in a fixed order.
//!
//! What does not live here: host-buffer checks ([`crate::hostbuf`]), foreign sources and
//! exports ([`crate::foreign`]).

use std::sync::Arc;

use pyo3::exceptions::{PyAttributeError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyTuple};

use lazybuf::observe::Cause;
use lazybuf::{AllocationOptions, Device, DeviceBuffer, MemoryKind};

use crate::accelerator::{PyDevice, selector};
use crate::args;
use crate::errors::OrPyErr;
use crate::foreign::Source;
use crate::hostbuf::{self, HostBuffer};
use crate::interop::{self, DlpackArgs, ExportedBytes};
use crate::lock::{self, Detached, GilFreeGuard, GilFreeMutex};
use crate::observe::observed;

/// A device buffer shared by its Python object and the DLPack tensors made from it.
pub(crate) struct BufferCell {
    /// Waited for only with the GIL released, never by the thread holding it ([`crate::lock`]):
    /// a resize may call a failure callback of its resource while it holds the buffer.
    buffer: GilFreeMutex<DeviceBuffer>,
}

impl BufferCell {
    /// The buffer, from a detached thread ([`lock::detach`]); `ReentrancyError` on the thread
    /// that holds it already (a failure callback reading the buffer it is resizing).
    pub(crate) fn lock(&self, detached: &Detached) -> PyResult<GilFreeGuard<'_, DeviceBuffer>> {
        self.buffer.lock_detached(detached)
    }
}

/// A resizable buffer of bytes in device memory.
#[pyclass(name = "DeviceBuffer", module = "lazybuf", frozen, weakref)]
pub(crate) struct PyDeviceBuffer {
    cell: Arc<BufferCell>,
    device: Device,
    /// The Python resource the memory comes from, kept alive with the buffer.
    resource: Option<Py<PyAny>>,
}

impl PyDeviceBuffer {
    /// The shared buffer.
    pub(crate) fn cell(&self) -> &Arc<BufferCell> {
        &self.cell
    }

    fn new_buffer(buffer: DeviceBuffer, resource: Option<Py<PyAny>>) -> Self {
        let device = buffer.device().clone();
        PyDeviceBuffer {
            cell: Arc::new(BufferCell { buffer: GilFreeMutex::new(buffer, "DeviceBuffer") }),
            device,
            resource,
        }
    }

    /// Runs `f` on the buffer with the GIL released.
    fn with<R: Send>(&self, py: Python<'_>, f: impl FnOnce(&mut DeviceBuffer) -> R + Send) -> PyResult<R> {
        lock::detach(py, |d| Ok(f(&mut *self.cell.lock(d)?)))
    }

    /// A new uint8 NumPy array holding the contents (`copy_to_host()`, pickling): made with the
    /// GIL, filled without it, so a resize by another thread in between is seen (the size no
    /// longer matches) and the copy retried, as `tobytes` does; never bytes that were not
    /// copied (a shrink in between returned the array's uninitialised tail).
    fn snapshot<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        for _ in 0..8 {
            let size = self.with(py, |b| b.size())?;
            let ary = hostbuf::new_array(py, size)?;
            let mut host = HostBuffer::get(&ary, true, "copy_to_host")?;
            let copied = self.with(py, |b| {
                if b.size() != size {
                    return Ok(false);
                }
                b.copy_to_host(host.bytes_mut()).or_py().map(|()| true)
            })??;
            drop(host);
            if copied {
                return Ok(ary);
            }
        }
        Err(PyRuntimeError::new_err(
            "copy_to_host: the buffer was resized by another thread during each of 8 tries",
        ))
    }

    fn options(mr: Option<&Bound<'_, PyAny>>) -> PyResult<(AllocationOptions, Option<Py<PyAny>>)> {
        let resource = crate::mr::resource_arg(mr)?;
        let keep = mr.filter(|m| !m.is_none()).map(|m| m.clone().unbind());
        Ok((AllocationOptions { resource, alignment: 0 }, keep))
    }

    /// A device buffer on `device` holding a copy of `data`'s bytes (checked as `to_device`).
    pub(crate) fn from_host(
        py: Python<'_>,
        data: &Bound<'_, PyAny>,
        device: Device,
        mr: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let host = HostBuffer::get(data, false, "to_device: b")?;
        let (options, keep) = Self::options(mr)?;
        let buffer = py
            .detach(|| DeviceBuffer::from_host_with(&device, MemoryKind::Device, host.bytes(), options))
            .or_py()?;
        Ok(Self::new_buffer(buffer, keep))
    }

    /// `copy_to_host`'s work: into `ary`, else into a new array.
    fn copy_to_host_into<'py>(
        &self,
        py: Python<'py>,
        ary: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let Some(ary) = ary.filter(|a| !a.is_none()).cloned() else {
            return self.snapshot(py);
        };
        let mut host = HostBuffer::get(&ary, true, "copy_to_host: ary")?;
        self.with(py, |b| {
            if host.len() < b.size() {
                return Err(PyValueError::new_err(format!(
                    "copy_to_host: ary is too small: {} bytes; need space for {} bytes",
                    host.len(),
                    b.size()
                )));
            }
            if host.overlaps(b.memory()) {
                // `ary` is a view of this buffer (a DLPack export): copy through the host.
                let staged = b.to_vec().or_py()?;
                host.bytes_mut()[..staged.len()].copy_from_slice(&staged);
                return Ok(());
            }
            b.copy_to_host(host.bytes_mut()).or_py()
        })??;
        drop(host);
        Ok(ary)
    }

    /// `copy_from_host`'s work.
    fn copy_from_host_impl(&self, py: Python<'_>, ary: &Bound<'_, PyAny>) -> PyResult<()> {
        let host = HostBuffer::get(ary, false, "copy_from_host: ary")?;
        self.with(py, |b| {
            if host.len() > b.size() {
                return Err(PyValueError::new_err(format!(
                    "copy_from_host: ary is too large: {} bytes; the buffer holds {}",
                    host.len(),
                    b.size()
                )));
            }
            if host.overlaps(b.memory()) {
                let staged = hostbuf::staged(host.bytes()).or_py()?;
                return b.copy_from_host(&staged).or_py();
            }
            b.copy_from_host(host.bytes()).or_py()
        })?
    }

    /// `copy_from_device`'s work.
    fn copy_from_device_impl(&self, py: Python<'_>, cuda_ary: &Bound<'_, PyAny>) -> PyResult<()> {
        let (source, keep) = Source::resolve(cuda_ary, "copy_from_device")?;
        let result = if source.is_buffer(&self.cell) {
            Ok(()) // a buffer onto itself: every byte stays
        } else {
            let too_large = |n: usize, size: usize| {
                PyValueError::new_err(format!(
                    "copy_from_device: the source is too large: {n} bytes; the buffer holds {size}"
                ))
            };
            let check = |dst: &mut DeviceBuffer, n: usize| {
                if n > dst.size() {
                    return Err(too_large(n, dst.size()));
                }
                dst.memory().check_copy_from(None, n, Cause::sync("copy_from_device")).or_py()
            };
            let copy = |dst: &mut DeviceBuffer, src: &lazybuf::Memory, n: usize| {
                if n > dst.size() {
                    return Err(too_large(n, dst.size()));
                }
                if crate::hostbuf::ranges_overlap(dst.memory().host_range(), src.host_range()) {
                    // Foreign memory that is a view of this buffer: copy through the host.
                    let staged = src.to_vec().or_py()?;
                    return dst.copy_from_host(&staged[..n]).or_py();
                }
                dst.copy_from_memory(src, n).or_py()
            };
            let mine = Arc::as_ptr(&self.cell) as usize;
            lock::detach(py, |d| source.with_locked_in_order(d, mine, || self.cell.lock(d), check, copy))
        };
        drop(keep);
        result
    }

    /// `tobytes`'s work.
    fn tobytes_impl<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        // The bytes object is made with the GIL and the copy runs without it: a resize by
        // another thread in between is seen (the size no longer matches) and the copy retried.
        for _ in 0..8 {
            let size = self.with(py, |b| b.size())?;
            let mut resized = false;
            let bytes = PyBytes::new_with(py, size, |data| {
                self.with(py, |b| {
                    if b.size() != data.len() {
                        resized = true;
                        return Ok(());
                    }
                    b.copy_to_host(data).or_py()
                })?
            })?;
            if !resized {
                return Ok(bytes);
            }
        }
        Err(PyRuntimeError::new_err(
            "tobytes: the buffer was resized by another thread during each of 8 tries",
        ))
    }

    /// The raw handle as an int, valid until the next reallocation (see the module docs).
    fn raw_address(&self, py: Python<'_>) -> PyResult<usize> {
        // SAFETY: the memory is live (held here) and its device's; the address is only handed
        // to Python as an int.
        self.with(py, |buffer| unsafe { buffer.device().native_handle(buffer.raw()) })
    }
}

#[pymethods]
impl PyDeviceBuffer {
    /// `size` uninitialized bytes of device memory on `device` (default: the current device),
    /// from `mr` (default: the device's current resource).
    #[new]
    #[pyo3(signature = (*, size=None, device=None, mr=None))]
    fn py_new(
        py: Python<'_>,
        size: Option<&Bound<'_, PyAny>>,
        device: Option<&Bound<'_, PyAny>>,
        mr: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let size = match size {
            Some(size) => args::size(size, "size")?,
            None => 0,
        };
        let device = crate::accelerator::device_arg(device)?;
        let (options, keep) = Self::options(mr)?;
        let buffer =
            py.detach(|| DeviceBuffer::with_options(&device, MemoryKind::Device, size, options)).or_py()?;
        Ok(Self::new_buffer(buffer, keep))
    }

    /// A new device buffer holding a copy of `b`, a 1-d contiguous buffer of bytes (`TypeError`
    /// for objects without the buffer protocol, `ValueError` for other formats, more dimensions
    /// or gaps), on `device` (default: the current device).
    #[staticmethod]
    #[pyo3(signature = (b, *, device=None, mr=None))]
    fn to_device(
        py: Python<'_>,
        b: &Bound<'_, PyAny>,
        device: Option<&Bound<'_, PyAny>>,
        mr: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let device = crate::accelerator::device_arg(device)?;
        observed(py, Cause::sync("to_device"), || Self::from_host(py, b, device, mr))
    }

    /// The id the transfer guard's errors (`TransferGuardError.buffer_id`) and the recorder's
    /// events give the buffer.
    #[getter]
    fn buffer_id(&self, py: Python<'_>) -> PyResult<u64> {
        self.with(py, |b| b.id())
    }

    /// The size in bytes.
    #[getter]
    fn size(&self, py: Python<'_>) -> PyResult<usize> {
        self.with(py, |b| b.size())
    }

    /// The size in bytes.
    #[getter]
    fn nbytes(&self, py: Python<'_>) -> PyResult<usize> {
        self.with(py, |b| b.size())
    }

    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        self.with(py, |b| b.size())
    }

    /// The object's size in bytes, the bytes it holds (its capacity) included.
    fn __sizeof__(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(std::mem::size_of::<Self>()
            + std::mem::size_of::<BufferCell>()
            + self.with(py, |b| b.capacity())?)
    }

    /// The bytes the allocation holds (at least `size`).
    fn capacity(&self, py: Python<'_>) -> PyResult<usize> {
        self.with(py, |b| b.capacity())
    }

    /// Grows the capacity to exactly `new_capacity` bytes if it is larger (keeping the size and
    /// the contents); never shrinks.
    fn reserve(&self, py: Python<'_>, new_capacity: &Bound<'_, PyAny>) -> PyResult<()> {
        let n = args::size(new_capacity, "new_capacity")?;
        observed(py, Cause::access("reserve"), || self.with(py, |b| b.reserve(n))?.or_py())
    }

    /// Sets the size to `new_size` bytes, keeping the contents up to the smaller size; within
    /// the capacity nothing is allocated or moved, beyond it the buffer moves to an allocation
    /// of exactly `new_size` bytes. New bytes are uninitialized.
    fn resize(&self, py: Python<'_>, new_size: &Bound<'_, PyAny>) -> PyResult<()> {
        let n = args::size(new_size, "new_size")?;
        observed(py, Cause::access("resize"), || self.with(py, |b| b.resize(n))?.or_py())
    }

    /// Moves the contents to an allocation of exactly `size` bytes if the capacity is larger.
    fn shrink_to_fit(&self, py: Python<'_>) -> PyResult<()> {
        observed(py, Cause::access("shrink_to_fit"), || self.with(py, |b| b.shrink_to_fit())?.or_py())
    }

    /// The device.
    #[getter]
    fn device(&self) -> PyDevice {
        PyDevice::new(self.device.clone())
    }

    /// The memory's raw handle as an int: the `CUdeviceptr` on CUDA, the `cl_mem` on OpenCL,
    /// the address on the host device; 0 when the buffer has no capacity. Valid until the
    /// next reallocation, as in RMM (see the module docs).
    #[getter]
    fn ptr(&self, py: Python<'_>) -> PyResult<usize> {
        self.raw_address(py)
    }

    /// Copies the buffer into `ary` (a writable 1-d buffer of at least `size` bytes) and
    /// returns it; with no argument, into a new uint8 NumPy array.
    #[pyo3(signature = (ary=None))]
    fn copy_to_host<'py>(
        &self,
        py: Python<'py>,
        ary: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        observed(py, Cause::sync("copy_to_host"), || self.copy_to_host_into(py, ary))
    }

    /// Copies `ary` (a 1-d buffer of bytes, read-only is fine) into the first `len(ary)` bytes.
    fn copy_from_host(&self, py: Python<'_>, ary: &Bound<'_, PyAny>) -> PyResult<()> {
        observed(py, Cause::sync("copy_from_host"), || self.copy_from_host_impl(py, ary))
    }

    /// Copies device memory (a lazybuf memory object or DeviceBuffer, an object with
    /// `__cuda_array_interface__`, or a DLPack producer; C-contiguous) into the first bytes.
    fn copy_from_device(&self, py: Python<'_>, cuda_ary: &Bound<'_, PyAny>) -> PyResult<()> {
        observed(py, Cause::sync("copy_from_device"), || self.copy_from_device_impl(py, cuda_ary))
    }

    /// The contents as `bytes`.
    fn tobytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        observed(py, Cause::sync("tobytes"), || self.tobytes_impl(py))
    }

    fn __bytes__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        self.tobytes(py)
    }

    /// A new buffer with the same contents (copied on the device), of capacity `size`.
    fn copy(&self, py: Python<'_>) -> PyResult<Self> {
        let copy = observed(py, Cause::sync("copy"), || self.with(py, |b| b.try_clone()))?.or_py()?;
        Ok(Self::new_buffer(copy, self.resource.as_ref().map(|r| r.clone_ref(py))))
    }

    fn __copy__(&self, py: Python<'_>) -> PyResult<Self> {
        self.copy(py)
    }

    fn __deepcopy__(&self, py: Python<'_>, _memo: &Bound<'_, PyAny>) -> PyResult<Self> {
        self.copy(py)
    }

    /// The CUDA Array Interface (version 3) of the bytes, on a CUDA device
    /// (`AttributeError` elsewhere). The address is valid until the next reallocation, as in
    /// RMM (see the module docs).
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        if !crate::interop::addresses_cuda(&self.device) {
            return Err(PyAttributeError::new_err(format!(
                "__cuda_array_interface__ exists only for memory on a CUDA device; this DeviceBuffer is on {}",
                selector(&self.device)
            )));
        }
        let (address, size) = self.with(py, |b| {
            // SAFETY: the memory is live (held here) and its device's; the address is only
            // handed to Python as an int.
            (unsafe { b.device().native_handle(b.raw()) }, b.size())
        })?;
        interop::cuda_array_interface(py, address, &[size], lazybuf::DType::U8, false)
    }

    /// DLPack export of the bytes as a 1-d uint8 tensor (CUDA devices: kDLCUDA; the host
    /// device: the CPU; OpenCL and wgpu: `BufferError`). The tensor holds its allocation (valid
    /// across reallocations until the consumer lets go of it). `copy=True` exports a copy in
    /// host memory to the CPU, on every device (CUDA: with `dl_device=(1, 0)`).
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
            self.with(py, |b| {
                // SAFETY: the address is handed to the tensor with a hold on its allocation,
                // which keeps it valid until the tensor's deleter runs.
                let address = unsafe { b.device().native_handle(b.raw()) };
                let owner: Arc<dyn std::any::Any + Send + Sync> = Arc::new(b.hold());
                ExportedBytes { address, nbytes: b.size(), owner }
            })
        };
        // As a UnifiedBuffer's: a host copy asked for is explicit, one made for the export not.
        let cause = if copy == Some(true) { Cause::sync("__dlpack__") } else { Cause::access("__dlpack__") };
        observed(py, cause, || {
            interop::dlpack_of_bytes(py, &self.device, MemoryKind::Device, call, view, |py| {
                self.copy_to_host_into(py, None)
            })
        })
    }

    /// `(device_type, device_id)` of the DLPack export.
    fn __dlpack_device__(&self) -> PyResult<(u32, i32)> {
        interop::dlpack_device_tuple(&self.device, MemoryKind::Device)
    }

    /// Pickles the contents (one NumPy array, so protocol 5 takes it out of band) and the
    /// device; unpickling puts them on that device, or on the current device with a
    /// `RuntimeWarning` when this process does not have it.
    fn __reduce__<'py>(&self, py: Python<'py>) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        let data = observed(py, Cause::access("__reduce__"), || self.snapshot(py))?;
        let rebuild = py.import("lazybuf._lazybuf")?.getattr("_rebuild_device_buffer")?;
        let args = (data, selector(&self.device)).into_pyobject(py)?;
        Ok((rebuild, args))
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        match self.with(py, |b| (b.size(), b.capacity())) {
            Ok((size, capacity)) => {
                format!(
                    "<lazybuf.DeviceBuffer size={size} capacity={capacity} on {}>",
                    selector(&self.device)
                )
            }
            // In use by an operation on this thread (a failure callback printing it).
            Err(_) => format!("<lazybuf.DeviceBuffer in use on {}>", selector(&self.device)),
        }
    }
}

/// `to_device(b, device=None)`: see `DeviceBuffer.to_device`.
#[pyfunction]
#[pyo3(signature = (b, *, device=None, mr=None))]
pub(crate) fn to_device(
    py: Python<'_>,
    b: &Bound<'_, PyAny>,
    device: Option<&Bound<'_, PyAny>>,
    mr: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyDeviceBuffer> {
    let device = crate::accelerator::device_arg(device)?;
    observed(py, Cause::sync("to_device"), || PyDeviceBuffer::from_host(py, b, device, mr))
}

/// Unpickles a DeviceBuffer (see `__reduce__`).
#[pyfunction]
pub(crate) fn _rebuild_device_buffer(
    py: Python<'_>,
    data: &Bound<'_, PyAny>,
    device: &str,
) -> PyResult<PyDeviceBuffer> {
    let device = crate::accelerator::pickled_device(py, device)?;
    // Unpickling (pickle.loads, copy.deepcopy through pickling) uploads: an implicit copy.
    observed(py, Cause::access("unpickle"), || PyDeviceBuffer::from_host(py, data, device, None))
}
