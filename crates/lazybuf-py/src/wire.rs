//! What crosses a process boundary: pickling with out-of-band buffers (protocol 5) and the
//! frames of lazybuf's Dask serializers (`python/lazybuf/_dask.py`).
//!
//! - **Pickle protocol 5** (`UnifiedBuffer.__reduce_ex__`, [`reduce_out_of_band`]): the data
//!   travels as one `pickle.PickleBuffer` over a read-only 1-d `uint8` view of the buffer's
//!   own host copy, so `pickle.dumps(buf, protocol=5, buffer_callback=...)` hands the
//!   transport the host memory itself, not a copy (without a callback pickle copies it
//!   in-band, as for any `PickleBuffer`). Taking the view is a host *read*: when only the
//!   device copy is current it is synced to the host first (counted in `transfer_stats()`),
//!   and the buffer is SYNCHRONIZED afterwards. Protocols 0 to 4 keep `__reduce__` (the data
//!   as a NumPy array copy, in-band).
//! - **Unpickling** ([`_rebuild_buffer_from_bytes`]) makes a new buffer on the device the
//!   buffer was pickled on (recorded as its selector and name) when the unpickling process has
//!   that device, else on its current device (as `UnifiedBuffer(shape, dtype)` there would),
//!   and copies the bytes once, straight into its host block (HOST_ONLY). A pinned buffer stays
//!   pinned where its new device can pin host memory; on one that cannot (wgpu devices) it
//!   becomes pageable (`pinned` then reads False) rather than fail to unpickle. Any C-contiguous bytes-like
//!   object is accepted as the data; one of the wrong size (a truncated or tampered payload)
//!   raises `ValueError` and no buffer is made. The `dask` family's receiver asks it to adopt
//!   a large, writable received frame as the host copy instead of copying it, when the frame
//!   is at least half of the memory actually allocated for it (followed through NumPy `.base`
//!   and `memoryview.obj` chains; a frame whose allocation cannot be told is copied).
//! - **Dask frames**: [`_host_frame`] is the same host view for the `dask` serializer family;
//!   [`_device_frame`] is a [`DeviceFrame`] over a CUDA buffer's device copy (a device read)
//!   for the `cuda` family, and [`_fill_from_device_pointer`] copies a received device frame
//!   into a new buffer's device copy with one device-to-device copy, never through the host.
//!
//! What does not live here: the Dask registration and headers (`python/lazybuf/_dask.py`),
//! raw host memory sharing ([`crate::views`]).

use crate::gil_cell::GilOnceCell;
use numpy::PyUntypedArray;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyDict, PyMemoryView, PyTuple};

use lazybuf::coherence::Access;
use lazybuf::{BufferState, DType, Device};

use crate::accelerator::selector;
use crate::args::shape_repr;
use crate::buffer::UnifiedBuffer;
use crate::errors::OrPyErr;
use crate::interop::cuda_array_interface;
use crate::lock;
use crate::views::{MemoryOwner, device_handles};
use crate::{args, dtype};

/// `pickle.PickleBuffer`, looked up once.
fn pickle_buffer_type(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    static TYPE: GilOnceCell<Py<PyAny>> = GilOnceCell::new();
    TYPE.get_or_try_init(py, || Ok::<_, PyErr>(py.import("pickle")?.getattr("PickleBuffer")?.unbind()))
        .map(|t| t.bind(py))
}

/// A read-only 1-d `uint8` NumPy view of the buffer's host copy (zero-copy; its base keeps
/// the memory alive), or `None` when the buffer holds no data. A host read: syncs from the
/// device first when only the device copy is current.
fn host_bytes<'py>(buf: &Bound<'py, UnifiedBuffer>) -> PyResult<Option<Bound<'py, PyAny>>> {
    let py = buf.py();
    let this = buf.get();
    let storage = this.storage()?;
    if storage.lock(py)?.state() == BufferState::Uninitialized {
        return Ok(None);
    }
    let bytes = numpy::dtype::<u8>(py);
    storage.host_array(py, Access::Read, &[this.byte_len()], &bytes, None).map(Some)
}

/// `__reduce_ex__(protocol)` for protocol 5 and later (see the module docs): the rebuild
/// function and `(shape, dtype name, pinned, PickleBuffer or None)`.
pub(crate) fn reduce_out_of_band<'py>(
    buf: &Bound<'py, UnifiedBuffer>,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
    let py = buf.py();
    let this = buf.get();
    let data = match host_bytes(buf)? {
        Some(view) => Some(pickle_buffer_type(py)?.call1((view,))?),
        None => None,
    };
    let rebuild = py.import("lazybuf._lazybuf")?.getattr("_rebuild_buffer_from_bytes")?;
    let dtype_name = this.descr_of(py).getattr("name")?;
    let args = (
        PyTuple::new(py, this.dims())?,
        dtype_name,
        this.pinned_requested(),
        data,
        py.None(),
        false,
        origin_of(this.home_device()),
    );
    Ok((rebuild, args.into_pyobject(py)?))
}

/// What a pickle records of the device a buffer lives on: its selector (`"opencl:0"`) and
/// its name, so the unpickling process can tell whether it has the same device.
pub(crate) fn origin_of(device: &Device) -> (String, String) {
    (selector(device), device.name().to_string())
}

/// The device a pickled buffer goes to: the device `origin` recorded when this process has it
/// (the selector picks a device of that name), else the current device.
fn unpickling_device(origin: Option<(String, String)>) -> PyResult<Device> {
    if let Some((selector, name)) = origin
        && let Ok(device) = lazybuf::select_device(&selector)
        && device.name() == name
    {
        return Ok(device);
    }
    crate::accelerator::device_arg(None)
}

/// `data`, a C-contiguous bytes-like object of exactly the buffer's `nbytes`, as a new 1-d
/// memoryview of its bytes (only the caller holds it); a clear error for anything else.
fn checked_bytes<'py>(
    buf: &Bound<'py, UnifiedBuffer>,
    data: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = buf.py();
    let this = buf.get();
    let expected = this.byte_len();
    let what = || {
        format!(
            "shape {}, dtype {}",
            shape_repr(this.dims()),
            this.descr_of(py).str().map(|s| s.to_string()).unwrap_or_default()
        )
    };
    let view = PyMemoryView::from(data).map_err(|err| {
        PyTypeError::new_err(format!(
            "expected the buffer's data as a bytes-like object ({expected} bytes for {}), got {} ({err})",
            what(),
            args::repr(data)
        ))
    })?;
    if !view.getattr("c_contiguous")?.is_truthy()? {
        return Err(PyValueError::new_err(format!(
            "expected the buffer's data as C-contiguous bytes ({expected} bytes for {}), got a \
             non-contiguous buffer",
            what()
        )));
    }
    let flat = view.call_method1("cast", ("B",))?;
    let got = flat.len()?;
    if got != expected {
        return Err(PyValueError::new_err(format!(
            "the data of a pickled or serialized UnifiedBuffer has the wrong size: expected {expected} \
             bytes ({}), got {got}; the payload is truncated or was altered",
            what()
        )));
    }
    Ok(flat)
}

/// Copies `flat` (from [`checked_bytes`]) into the host copy of `buf` (one copy; the host
/// becomes the only valid copy).
fn copy_raw_bytes(buf: &Bound<'_, UnifiedBuffer>, flat: &Bound<'_, PyAny>) -> PyResult<()> {
    let py = buf.py();
    let kwargs = PyDict::new(py);
    kwargs.set_item("dtype", numpy::dtype::<u8>(py))?;
    let array = py.import("numpy")?.call_method("frombuffer", (flat,), Some(&kwargs))?;
    buf.get().storage()?.copy_from_array(array.cast::<PyUntypedArray>()?, None)
}

/// Received frames of this many bytes and more are adopted as the host copy (see
/// [`_rebuild_buffer_from_bytes`]); smaller ones are copied, which costs less than keeping
/// their message alive.
pub(crate) const ADOPT_MIN_BYTES: usize = 64 << 10;

/// Makes `flat` (from [`checked_bytes`]) the host copy of `buf` without a copy, when that is
/// safe and worth it: a pageable buffer, a writable frame of [`ADOPT_MIN_BYTES`] or more that
/// is at least half of the memory it lies in (so the buffer never keeps a much larger
/// message alive), bytes no other buffer adopted. `Ok(false)`: copy instead.
fn adopt_raw_bytes(buf: &Bound<'_, UnifiedBuffer>, flat: &Bound<'_, PyAny>, pinned: bool) -> PyResult<bool> {
    let view = flat.cast::<PyMemoryView>()?;
    let nbytes = buf.get().byte_len();
    if pinned || nbytes < ADOPT_MIN_BYTES || view.getattr("readonly")?.is_truthy()? {
        return Ok(false);
    }
    let Some(whole) = allocation_size(view)? else { return Ok(false) };
    if whole > nbytes.saturating_mul(2) {
        return Ok(false);
    }
    buf.get().storage()?.adopt_frame(flat)
}

/// The size in bytes of the memory actually allocated under `view`: its exporter's chain is
/// followed (`memoryview.obj`, NumPy's `.base`) down to the object that owns the bytes, a
/// `bytearray`, `bytes` or a NumPy array that owns its data. `None` when the chain ends
/// anywhere else (the size of the allocation cannot be told), or runs longer than any real
/// one: the frame is then copied, never adopted.
fn allocation_size(view: &Bound<'_, PyMemoryView>) -> PyResult<Option<usize>> {
    let py = view.py();
    let ndarray = py.import("numpy")?.getattr("ndarray")?;
    let mut obj = view.getattr("obj")?;
    for _ in 0..64 {
        if obj.is_instance_of::<PyMemoryView>() {
            obj = obj.getattr("obj")?;
        } else if obj.is_instance_of::<PyByteArray>() || obj.is_instance_of::<PyBytes>() {
            return Ok(Some(obj.len()?));
        } else if obj.is_instance(&ndarray)? {
            let base = obj.getattr("base")?;
            if !base.is_none() {
                obj = base;
            } else if obj.getattr("flags")?.getattr("owndata")?.is_truthy()? {
                return Ok(Some(obj.getattr("nbytes")?.extract()?));
            } else {
                return Ok(None);
            }
        } else {
            return Ok(None);
        }
    }
    Ok(None)
}

/// A new buffer of `shape` and `dtype` (nothing allocated yet) on `device` if given, else on
/// the device `origin` records when this process has it, else on the current device; pinned
/// when `pinned` and that device can pin host memory (see the module docs).
pub(crate) fn new_buffer<'py>(
    py: Python<'py>,
    shape: &Bound<'py, PyAny>,
    dtype: &Bound<'py, PyAny>,
    pinned: bool,
    device: Option<&Bound<'py, PyAny>>,
    origin: Option<(String, String)>,
) -> PyResult<Bound<'py, UnifiedBuffer>> {
    let dims = args::shape(shape)?;
    let elem = dtype::resolve(py, Some(dtype))?;
    let home = match device.filter(|d| !d.is_none()) {
        Some(device) => crate::accelerator::device_arg(Some(device))?,
        None => unpickling_device(origin)?,
    };
    let pinned = pinned && home.can_pin_host_memory();
    Bound::new(py, UnifiedBuffer::create(dims, elem, home, pinned, None, None)?)
}

/// Unpickles a buffer pickled with protocol 5 (see `UnifiedBuffer.__reduce_ex__`): a new
/// buffer holding a copy of `data` (any C-contiguous bytes-like object: a `PickleBuffer`, a
/// `memoryview`, `bytes`) as its host copy, or UNINITIALIZED when `data` is `None`.
/// `ValueError` when `data` does not hold exactly the buffer's `nbytes`. The buffer goes to
/// `device` when given; else to the device `origin` (`(selector, name)`, recorded by the
/// pickle) names when this process has it; else to the current device. `pinned` is kept
/// where that device can pin host memory, dropped where it cannot (wgpu devices).
///
/// `adopt=True` (the `dask` family's receiver): a writable frame of 64 KiB or more that is at
/// least half of the memory it lies in becomes the host copy itself, with no copy, as
/// distributed's NumPy deserializer makes an array over such a frame; the buffer keeps the
/// frame alive, at whatever alignment it arrived. The caller vouches that nothing else writes
/// the frame from then on. Any other frame is copied.
///
/// `family`: the Dask serializer family whose deserializer calls (`"dask"`, `"cuda"`), for the
/// call the recorder and the guard name (`dask deserialize`, `cuda deserialize`); `None`
/// (pickle): `unpickle`, as the memory objects' unpickling is named.
#[pyfunction]
#[pyo3(signature = (shape, dtype, pinned, data, device=None, adopt=false, origin=None, family=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn _rebuild_buffer_from_bytes<'py>(
    py: Python<'py>,
    shape: &Bound<'py, PyAny>,
    dtype: &Bound<'py, PyAny>,
    pinned: bool,
    data: Option<&Bound<'py, PyAny>>,
    device: Option<&Bound<'py, PyAny>>,
    adopt: bool,
    origin: Option<(String, String)>,
    family: Option<&str>,
) -> PyResult<Bound<'py, UnifiedBuffer>> {
    // Named after what the user's code did, as the sending side is (`dask serialize`), not the
    // engine's `host` or `adopt_host` (the twentieth pass).
    let call = match family {
        None => "unpickle",
        Some("dask") => DASK_DESERIALIZE,
        Some("cuda") => CUDA_DESERIALIZE,
        Some(other) => {
            return Err(PyValueError::new_err(format!(
                "_rebuild_buffer_from_bytes: expected family None, 'dask' or 'cuda', got {other:?}"
            )));
        }
    };
    let buffer = new_buffer(py, shape, dtype, pinned, device, origin)?;
    let pinned = buffer.get().pinned_requested();
    if let Some(data) = data {
        let flat = checked_bytes(&buffer, data)?;
        crate::observe::observed(py, lazybuf::observe::Cause::access(call), || {
            if !(adopt && adopt_raw_bytes(&buffer, &flat, pinned)?) {
                copy_raw_bytes(&buffer, &flat)?;
            }
            Ok::<_, PyErr>(())
        })?;
    }
    Ok(buffer)
}

/// The call a `dask` frame's deserialization is recorded and judged as.
const DASK_DESERIALIZE: &str = "dask deserialize";
/// The call a `cuda` frame's deserialization is recorded and judged as (it recorded `device`,
/// the engine's access, before the twentieth pass).
const CUDA_DESERIALIZE: &str = "cuda deserialize";

/// The host frame of the `dask` serializer family: a read-only `memoryview` of the bytes of
/// the buffer's host copy (zero-copy; a host read, which syncs first when only the device
/// copy is current), or `None` when the buffer holds no data.
#[pyfunction]
pub(crate) fn _host_frame<'py>(
    buf: &Bound<'py, UnifiedBuffer>,
) -> PyResult<Option<Bound<'py, PyMemoryView>>> {
    // An implicit transfer, named after what the user called (the guard's refusal and the
    // recorder say `dask serialize`, not the engine's `host`).
    crate::observe::observed(buf.py(), lazybuf::observe::Cause::access("dask serialize"), || {
        host_bytes(buf)?.map(|view| PyMemoryView::from(&view)).transpose()
    })
}

/// A CUDA buffer's device copy as one frame of bytes, for Dask's `cuda` serializer family
/// (as distributed's CuPy serializer sends a CuPy array's memory): `__cuda_array_interface__`
/// (version 3, shape `(nbytes,)`, `|u1`, read-only) and `nbytes`. Keeps the buffer's memory
/// alive, and its device copy in use (not evicted), while it exists.
#[pyclass(name = "DeviceFrame", module = "lazybuf", frozen)]
pub(crate) struct DeviceFrame {
    device: Device,
    ptr: u64,
    nbytes: usize,
    owner: Py<MemoryOwner>,
}

#[pymethods]
impl DeviceFrame {
    /// The `CUdeviceptr` of the first byte, as an int (0 for an empty buffer).
    #[getter]
    fn ptr(&self) -> u64 {
        self.ptr
    }

    /// The size in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.nbytes
    }

    /// The CUDA device whose memory it is: a receiver in this process copies from it there
    /// (its pointer is that device's memory, which another device's borrow refuses).
    #[getter]
    fn device(&self) -> crate::accelerator::PyDevice {
        crate::accelerator::PyDevice::new(self.device.clone())
    }

    /// The object that keeps the memory alive.
    #[getter]
    fn owner(&self, py: Python<'_>) -> Py<MemoryOwner> {
        self.owner.clone_ref(py)
    }

    /// CUDA Array Interface version 3: the frame's bytes, read-only.
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        cuda_array_interface(py, self.ptr as usize, &[self.nbytes], DType::U8, true)
    }

    fn __len__(&self) -> usize {
        self.nbytes
    }

    fn __repr__(&self) -> String {
        format!(
            "<lazybuf.DeviceFrame {} ptr=0x{:x} nbytes={}>",
            selector(&self.device),
            self.ptr,
            self.nbytes
        )
    }
}

/// The error for a CUDA-only operation on a buffer of another device.
fn not_cuda(what: &str, device: &Device) -> PyErr {
    PyTypeError::new_err(format!(
        "{what} needs a buffer on a CUDA device; this one is on {}",
        selector(device)
    ))
}

/// The `cuda` family's frame of a CUDA buffer: a [`DeviceFrame`] over its device copy (a
/// device read: uploads first if only the host copy is current; the serializer avoids that by
/// sending such buffers' host frame instead), or `None` when the buffer holds no data.
#[pyfunction]
pub(crate) fn _device_frame(buf: &Bound<'_, UnifiedBuffer>) -> PyResult<Option<DeviceFrame>> {
    let py = buf.py();
    let this = buf.get();
    let home = this.home_device();
    if !crate::interop::addresses_cuda(home) {
        return Err(not_cuda("a device frame", home));
    }
    let storage = this.storage()?;
    if storage.lock(py)?.state() == BufferState::Uninitialized {
        return Ok(None);
    }
    // Named after what the user called, as the host frame's `dask serialize` is.
    let cause = lazybuf::observe::Cause::access("cuda serialize");
    let (handle, exposure) =
        crate::observe::observed(py, cause, || storage.device_handle_nogil(py, home, Access::Read, cause))?;
    let ptr = handle.as_int() as u64;
    // The frame holds the exposure: the copy is not evicted while the frame lives.
    let owner = Py::new(py, MemoryOwner::new(exposure))?;
    Ok(Some(DeviceFrame { device: home.clone(), ptr, nbytes: this.byte_len(), owner }))
}

/// Fills `buf`, a CUDA buffer that holds no data (UNINITIALIZED, as made by the `cuda`
/// deserializer), with `nbytes` bytes of device memory at `ptr` (a `CUdeviceptr` from a
/// `__cuda_array_interface__`, of this device or one the driver can address from it): one
/// device-to-device copy on the buffer's stream, waited for, after which the buffer is
/// DEVICE_ONLY. `stream` is the interface's stream, if it names one: the copy runs after the
/// work enqueued there so far. `ValueError` when `nbytes` is not the buffer's size or the buffer
/// holds data; a failed copy raises and leaves the buffer UNINITIALIZED.
///
/// The caller vouches for `ptr` and `stream`, as every consumer of `__cuda_array_interface__`
/// must: `ptr` is valid device memory of at least `nbytes` bytes that nothing writes during
/// the call, and `stream` a live stream of the buffer's device.
#[pyfunction]
#[pyo3(signature = (buf, ptr, nbytes, stream=None))]
pub(crate) fn _fill_from_device_pointer(
    buf: &Bound<'_, UnifiedBuffer>,
    ptr: u64,
    nbytes: usize,
    stream: Option<usize>,
) -> PyResult<()> {
    let py = buf.py();
    let this = buf.get();
    let home = this.home_device().clone();
    if !crate::interop::addresses_cuda(&home) {
        return Err(not_cuda("a copy from device memory", &home));
    }
    let expected = this.byte_len();
    if nbytes != expected {
        return Err(PyValueError::new_err(format!(
            "the device frame of a serialized UnifiedBuffer has the wrong size: expected {expected} \
             bytes (shape {}), got {nbytes}; the payload is truncated or was altered",
            shape_repr(this.dims())
        )));
    }
    let storage = this.storage()?;
    // Named after what the user's code did (`cuda deserialize`), as the host frame's
    // deserialization is, not the engine's `device` (the twentieth pass).
    let cause = lazybuf::observe::Cause::access(CUDA_DESERIALIZE);
    crate::observe::observed(py, cause, || {
        lock::detach(py, |d| {
            let mut raw = storage.lock_detached(d)?;
            if raw.state() != BufferState::Uninitialized {
                return Err(PyValueError::new_err(
                    "_fill_from_device_pointer fills only a buffer that holds no data (UNINITIALIZED)",
                ));
            }
            if let Some(producer) = stream {
                let producer = device_handles(&home)
                    .stream_from_int(producer)
                    .ok_or_else(|| not_cuda("a copy from device memory", &home))?;
                // SAFETY: the caller vouches that `producer` is a live stream of this device's
                // context (the __cuda_array_interface__ contract); it only records a marker here,
                // which lazybuf's stream then waits for (no copy has touched the buffer yet).
                let wrapped = unsafe { home.wrap_stream(producer) }.or_py()?;
                let ticket = wrapped.marker().or_py()?;
                raw.stream().wait_for(&ticket).or_py()?;
            }
            if expected == 0 {
                return raw.device_access(&home, Access::Overwrite).map(drop).or_py();
            }
            // The received frame as memory of the buffer's device, borrowed for this call: the
            // backend checks that the pointer is its device's memory.
            let raw_src = device_handles(&home)
                .memory_from_int(ptr as usize)
                .ok_or_else(|| not_cuda("a copy from device memory", &home))?;
            // SAFETY: the caller vouches that `ptr` is valid device memory of `nbytes` bytes for the
            // length of this call (the __cuda_array_interface__ contract); the borrow ends here.
            let src = unsafe { lazybuf::Memory::borrowed(&home, raw_src, expected) }.or_py()?;
            let src = src.device_memory().ok_or_else(|| not_cuda("a copy from device memory", &home))?;
            let stream = raw.stream().clone();
            let copied = raw
                .device_access_mut(&home, Access::Overwrite)
                .and_then(|dst| stream.copy(src, dst, expected))
                .and_then(|ticket| ticket.wait())
                .or_py();
            if copied.is_err() {
                // Nothing was valid before: the buffer holds no data again.
                raw.invalidate();
            }
            copied
        })
    })
}
