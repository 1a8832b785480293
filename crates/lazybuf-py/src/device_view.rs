//! What `UnifiedBuffer.device` returns on each backend: the host ndarray on the host device,
//! a PyOpenCL array sharing the buffer's `cl_mem` on OpenCL when PyOpenCL is installed, a
//! CuPy array over the buffer's device pointer on CUDA when CuPy is installed, and otherwise a
//! [`DeviceMemoryView`] exposing the runtime handle (with `__cuda_array_interface__` on CUDA).
//!
//! Every object returned keeps the buffer's memory alive (a [`MemoryOwner`] is attached).
//! Optional packages are probed once per process, never per call.
//!
//! What does not live here: the device access itself ([`Storage::device_handle`]).

use std::sync::{Arc, Mutex, PoisonError};

use crate::gil_cell::GilOnceCell;
use crate::gil_cell::interned;
use numpy::{PyArrayDescr, PyArrayDescrMethods};
use pyo3::exceptions::PyAttributeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyModule, PyTuple};

use lazybuf::backend::{RawDevice, RawMemory};
use lazybuf::{DType, Device, Ticket};

use crate::accelerator::PyDevice;
use crate::errors::OrPyErr;
use crate::views::Exposure;
use crate::views::{MemoryOwner, PerDim, Storage, device_handles};

/// The device object for a non-host device, given the handle of its (current) copy and the
/// exposure that came with it: the object's owner holds it, so the copy is not evicted while
/// the object lives.
#[allow(clippy::too_many_arguments)]
pub(crate) fn device_object<'py>(
    py: Python<'py>,
    storage: &Arc<Storage>,
    home: &Device,
    handle: RawMemory,
    mut exposure: Exposure,
    ready: Ticket,
    shape: &[usize],
    dtype: DType,
    descr: &Bound<'py, PyArrayDescr>,
) -> PyResult<Bound<'py, PyAny>> {
    let nbytes = shape.iter().product::<usize>() * dtype.size();
    let raw_device = device_handles(home);
    // PyOpenCL wraps OpenCL handles only.
    if let (RawMemory::OpenCl(_), RawDevice::OpenCl { .. }) = (handle, raw_device)
        && let Some(cl) = optional(py, &PYOPENCL, "pyopencl.array")
    {
        // (OpenCL uploads are waited for by the access: `ready` is done.)
        wait_ready(py, &ready)?;
        let owner = Bound::new(py, MemoryOwner::new(exposure))?;
        return pyopencl_array(py, &cl, raw_device.queue_int(), handle.as_int(), shape, descr, owner);
    }
    if let Some(ordinal) = home.info().ordinal
        && crate::interop::addresses_cuda(home)
        && let Some(cupy) = optional(py, &CUPY, "cupy")
    {
        // Once the array is gone, kernels CuPy enqueued through it may still be pending: its
        // owner's drop orders lazybuf after CuPy's current stream (`MemoryOwner`), or the copy
        // is kept until the next call does (`SpillState::cupy_unordered`). The other way,
        // CuPy's kernels run on its current stream: made to wait for the upload there (no
        // host wait; the legacy default stream, handle 0, included).
        if !ready.is_trivially_done() {
            crate::streams::order_cupy_after_ticket(py, home, &ready)?;
        }
        exposure.held_by_cupy();
        let owner = Bound::new(py, MemoryOwner::new(exposure))?;
        let ordinal = i32::try_from(ordinal).unwrap_or(i32::MAX);
        let array = cupy_array(&cupy, handle.as_int() as u64, ordinal, nbytes, shape, descr, owner)?;
        storage.mark_cupy_held();
        return Ok(array);
    }
    let owner = Bound::new(py, MemoryOwner::new(exposure))?;
    let view = DeviceMemoryView {
        device: home.clone(),
        // SAFETY: `handle` is a live allocation of `home`'s: the caller holds the storage.
        handle: unsafe { home.native_handle(handle) },
        nbytes,
        shape: shape.to_vec(),
        dtype,
        descr: descr.clone().unbind(),
        owner: owner.unbind(),
        ready: Mutex::new(ready),
    };
    Ok(Bound::new(py, view)?.into_any())
}

/// Orders `object`, a device object [`device_object`] made earlier for the same memory, after
/// `ready`, the uploads it now depends on (done when none): a `DeviceMemoryView` takes it as
/// what it waits for, a CuPy array's users on CuPy's current stream are made to wait for it.
pub(crate) fn order_after_upload(
    py: Python<'_>,
    home: &Device,
    object: &Bound<'_, PyAny>,
    ready: Ticket,
) -> PyResult<()> {
    match object.cast::<DeviceMemoryView>() {
        Ok(view) => {
            // Replaced also by a done ticket: an earlier failed upload's is not the view's now.
            *view.get().ready.lock().unwrap_or_else(PoisonError::into_inner) = ready;
            Ok(())
        }
        Err(_) if ready.is_trivially_done() => Ok(()),
        Err(_) => crate::streams::order_cupy_after_ticket(py, home, &ready),
    }
}

/// Waits, with the GIL released, for `ready` (an upload the object about to be returned
/// depends on) unless it is done.
fn wait_ready(py: Python<'_>, ready: &Ticket) -> PyResult<()> {
    if ready.is_trivially_done() {
        return Ok(());
    }
    crate::lock::detach(py, |_| ready.wait().or_py())
}

static PYOPENCL: GilOnceCell<Option<Py<PyModule>>> = GilOnceCell::new();
static CUPY: GilOnceCell<Option<Py<PyModule>>> = GilOnceCell::new();

/// Refuses, before the access that makes the device copy current, a dtype the object `.device`
/// would wrap it in cannot hold: a CuPy array of a dtype CuPy refuses (`bfloat16` where CuPy has
/// no kernels for it, say) raised only after the upload, so the failed call had changed the
/// state (the tenth hostile pass). NumPy's own numeric dtypes in native byte order, which CuPy
/// takes, are passed without asking; any other dtype is tried on a zero-size CuPy array, and its
/// error raised here.
pub(crate) fn refuse_unwrappable(
    py: Python<'_>,
    home: &Device,
    descr: &Bound<'_, PyArrayDescr>,
) -> PyResult<()> {
    /// NumPy's type numbers of bool, the integers, float32/64, complex64/128 and float16.
    const CUPY_TAKES: [std::ffi::c_int; 16] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 14, 15, 23];
    if CUPY_TAKES.contains(&descr.num()) && descr.is_native_byteorder() != Some(false) {
        return Ok(());
    }
    if home.info().ordinal.is_none() || !crate::interop::addresses_cuda(home) {
        return Ok(());
    }
    let Some(cupy) = optional(py, &CUPY, "cupy") else { return Ok(()) };
    cupy.getattr("ndarray")?.call1(((0,), descr)).map(drop)
}

/// An optional package, imported at most once per process (a failed import is remembered:
/// retrying it on every call is what made the reference implementation slow).
fn optional<'py>(
    py: Python<'py>,
    cell: &GilOnceCell<Option<Py<PyModule>>>,
    name: &str,
) -> Option<Bound<'py, PyModule>> {
    cell.get_or_init(py, || py.import(name).ok().map(Bound::unbind)).as_ref().map(|m| m.bind(py).clone())
}

/// PyOpenCL command-queue wrappers and their contexts, one per lazybuf queue (made once: a
/// queue's `context` property asks the runtime and wraps a new object each time), so user
/// kernels enqueued on the array's queue are ordered with lazybuf's copies. Found by a scan of
/// a short list (one entry per device used), not a dict lookup that makes an int per call.
fn pyopencl_queue<'py>(
    py: Python<'py>,
    cl: &Bound<'py, PyAny>,
    queue: usize,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    type Queues = Vec<(usize, Py<PyAny>, Py<PyAny>)>;
    static QUEUES: Mutex<Queues> = Mutex::new(Vec::new());
    let found = {
        let queues = QUEUES.lock().unwrap_or_else(PoisonError::into_inner);
        queues.iter().find(|(q, ..)| *q == queue).map(|(_, w, c)| (w.bind(py).clone(), c.bind(py).clone()))
    };
    if let Some(pair) = found {
        return Ok(pair);
    }
    // Made without the list's lock (it runs Python code); a racing thread's pair is kept.
    let wrapped = cl.getattr("CommandQueue")?.call_method1("from_int_ptr", (queue, true))?;
    let context = wrapped.getattr("context")?;
    let mut queues = QUEUES.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((_, w, c)) = queues.iter().find(|(q, ..)| *q == queue) {
        return Ok((w.bind(py).clone(), c.bind(py).clone()));
    }
    queues.push((queue, wrapped.clone().unbind(), context.clone().unbind()));
    Ok((wrapped, context))
}

fn pyopencl_array<'py>(
    py: Python<'py>,
    cla: &Bound<'py, PyModule>,
    queue: usize,
    mem: usize,
    shape: &[usize],
    descr: &Bound<'py, PyArrayDescr>,
    owner: Bound<'py, MemoryOwner>,
) -> PyResult<Bound<'py, PyAny>> {
    /// The `pyopencl` module and its `Buffer.from_int_ptr`, looked up once (an import per
    /// call costs more than the rest).
    static CL: GilOnceCell<(Py<PyModule>, Py<PyAny>)> = GilOnceCell::new();
    let (cl, buffer_from_int_ptr) = CL.get_or_try_init(py, || {
        let cl = py.import("pyopencl")?;
        let from_int_ptr = cl.getattr("Buffer")?.getattr("from_int_ptr")?.unbind();
        Ok::<_, PyErr>((cl.unbind(), from_int_ptr))
    })?;
    let (queue, context) = pyopencl_queue(py, cl.bind(py).as_any(), queue)?;
    let size: usize = shape.iter().product();
    let (shape, strides) = LAST_LAYOUT.tuples(py, shape, descr.itemsize())?;
    if mem == 0 {
        // An empty buffer has no cl_mem; an empty PyOpenCL array allocates nothing either.
        return cla.getattr(interned!(py, "empty"))?.call1((queue, shape, descr));
    }
    let buffer = buffer_from_int_ptr.bind(py).call1((mem, true))?;
    buffer.setattr(interned!(py, "_lazybuf_owner"), owner)?;
    // Looked up per call: a replaced class (a test's subclass) is used as it is.
    let array = cla.getattr(interned!(py, "Array"))?;
    // PyOpenCL's fast constructor (the one its own views use): the shape, strides, size and
    // context given, it skips the checks that cost about 10 µs a call, most of a small batch's
    // `.device` (docs/BENCHMARKS.md). Passed by position where the class's `__init__` takes
    // PyOpenCL's parameters in PyOpenCL's order ([`takes_fast_positionally`]): a keyword dict
    // costs about 2,500 instructions (made, then unpacked again by the call). Else by keyword
    // (interned strings, which Python matches to parameters by identity); a PyOpenCL without
    // the fast constructor gets the checked one.
    if takes_fast_positionally(py, &array) {
        let none = py.None().into_bound(py);
        let arguments = [
            none.clone(),
            shape.clone().into_any(),
            descr.clone().into_any(),
            interned!(py, "C").clone().into_any(),
            none.clone(),
            buffer.clone(),
            0usize.into_pyobject(py)?.into_any(),
            strides.into_any(),
            none.clone(),
            none,
            pyo3::types::PyBool::new(py, true).to_owned().into_any(),
            size.into_pyobject(py)?.into_any(),
            context,
            queue,
        ];
        return array.call1(PyTuple::new(py, arguments)?);
    }
    let fast = PyDict::new(py);
    fast.set_item(interned!(py, "data"), &buffer)?;
    fast.set_item(interned!(py, "strides"), strides)?;
    fast.set_item(interned!(py, "_fast"), true)?;
    fast.set_item(interned!(py, "_size"), size)?;
    fast.set_item(interned!(py, "_context"), &context)?;
    fast.set_item(interned!(py, "_queue"), &queue)?;
    match array.call((py.None(), &shape, descr), Some(&fast)) {
        Ok(made) => Ok(made),
        Err(err) if err.is_instance_of::<pyo3::exceptions::PyTypeError>(py) => {
            let kwargs = PyDict::new(py);
            kwargs.set_item(interned!(py, "data"), buffer)?;
            array.call((queue, shape, descr), Some(&kwargs))
        }
        Err(err) => Err(err),
    }
}

/// The shape and stride tuples of the last PyOpenCL array made, for the next one of the same
/// shape and item size (tuples cannot change, so arrays can share them): a loop that makes
/// buffers of one shape builds them once (about 300 instructions of a small batch's `.device`
/// on PoCL; docs/BENCHMARKS.md). Taken only with the GIL held.
static LAST_LAYOUT: LastLayout = LastLayout(Mutex::new(None));

struct LastLayout(Mutex<Option<Layout>>);

/// A shape and item size, and their tuples: the shape, and the C-contiguous strides in bytes.
type Layout = (Vec<usize>, usize, Py<PyTuple>, Py<PyTuple>);

impl LastLayout {
    fn tuples<'py>(
        &self,
        py: Python<'py>,
        shape: &[usize],
        itemsize: usize,
    ) -> PyResult<(Bound<'py, PyTuple>, Bound<'py, PyTuple>)> {
        {
            let last = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some((_, _, dims, strides)) =
                last.as_ref().filter(|(s, i, ..)| s == shape && *i == itemsize)
            {
                return Ok((dims.bind(py).clone(), strides.bind(py).clone()));
            }
        }
        let mut strides = PerDim::<usize>::new(shape.len());
        let strides = strides.as_mut_slice();
        strides.fill(itemsize);
        for i in (0..shape.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * shape[i + 1].max(1);
        }
        let (dims, strides) = (PyTuple::new(py, shape)?, PyTuple::new(py, &*strides)?);
        let entry = (shape.to_vec(), itemsize, dims.clone().unbind(), strides.clone().unbind());
        let previous = self.0.lock().unwrap_or_else(PoisonError::into_inner).replace(entry);
        // Dropped after the lock: releasing the last reference to an object may run Python code.
        drop(previous);
        Ok((dims, strides))
    }
}

/// The parameters of PyOpenCL's `Array.__init__` (2022.1 to 2026.1 at least), in order.
const ARRAY_INIT_PARAMETERS: [&str; 15] = [
    "self",
    "cq",
    "shape",
    "dtype",
    "order",
    "allocator",
    "data",
    "offset",
    "strides",
    "events",
    "_flags",
    "_fast",
    "_size",
    "_context",
    "_queue",
];

/// Whether `class`'s `__init__` is a Python function whose first parameters are
/// [`ARRAY_INIT_PARAMETERS`] (none keyword-only), so that the fast constructor's arguments can
/// be passed by position and bind where their keywords would. Checked once per `__init__`
/// (the last one seen is remembered): a subclass or another version of PyOpenCL with other
/// parameters takes the keyword path, never a misbinding.
fn takes_fast_positionally(py: Python<'_>, class: &Bound<'_, PyAny>) -> bool {
    static CHECKED: Mutex<Option<(Py<PyAny>, bool)>> = Mutex::new(None);
    let Ok(init) = class.getattr(interned!(py, "__init__")) else { return false };
    let remembered = CHECKED.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((seen, fits)) = remembered.as_ref()
        && seen.bind(py).is(&init)
    {
        return *fits;
    }
    // Checked without the lock: reading attributes runs Python code.
    drop(remembered);
    let check = || -> PyResult<bool> {
        let code = init.getattr("__code__")?;
        let positional: usize = code.getattr("co_argcount")?.extract()?;
        let names: Vec<String> = code.getattr("co_varnames")?.extract()?;
        let expected = ARRAY_INIT_PARAMETERS.len();
        Ok(positional >= expected && names.len() >= expected && names[..expected] == ARRAY_INIT_PARAMETERS)
    };
    let fits = check().unwrap_or(false);
    let previous = CHECKED.lock().unwrap_or_else(PoisonError::into_inner).replace((init.unbind(), fits));
    // Dropped after the lock: releasing the last reference to an object may run Python code.
    drop(previous);
    fits
}

/// A CuPy array over device memory lazybuf owns (`owner` keeps it alive). The device is
/// named (`device_id`), so CuPy does not ask the runtime where the pointer lives
/// (`cudaPointerGetAttributes`, several microseconds a call).
fn cupy_array<'py>(
    cupy: &Bound<'py, PyModule>,
    ptr: u64,
    device_id: i32,
    nbytes: usize,
    shape: &[usize],
    descr: &Bound<'py, PyArrayDescr>,
    owner: Bound<'py, MemoryOwner>,
) -> PyResult<Bound<'py, PyAny>> {
    /// `cupy.ndarray`, `cupy.cuda.UnownedMemory` and `cupy.cuda.MemoryPointer`, looked up once.
    static CLASSES: GilOnceCell<(Py<PyAny>, Py<PyAny>, Py<PyAny>)> = GilOnceCell::new();
    let py = cupy.py();
    let (ndarray, unowned, pointer) = CLASSES.get_or_try_init(py, || {
        let cuda = cupy.getattr("cuda")?;
        Ok::<_, PyErr>((
            cupy.getattr("ndarray")?.unbind(),
            cuda.getattr("UnownedMemory")?.unbind(),
            cuda.getattr("MemoryPointer")?.unbind(),
        ))
    })?;
    let shape = pyo3::types::PyTuple::new(py, shape)?;
    if nbytes == 0 {
        return ndarray.bind(py).call1((shape, descr));
    }
    let memory = unowned.bind(py).call1((ptr, nbytes, owner, device_id))?;
    let memory_pointer = pointer.bind(py).call1((memory, 0))?;
    ndarray.bind(py).call1((shape, descr, memory_pointer))
}

/// A buffer's copy on a device, for code that takes raw handles: `ptr` is the `CUdeviceptr`
/// (CUDA), `cl_mem` (OpenCL) or the graphics API's buffer handle (wgpu: a `VkBuffer` on
/// Vulkan) as an int. Keeps the buffer's memory alive, and its device copy in use (not
/// evicted), while it lives.
#[pyclass(name = "DeviceMemoryView", module = "lazybuf", frozen, weakref)]
pub(crate) struct DeviceMemoryView {
    device: Device,
    handle: usize,
    nbytes: usize,
    shape: Vec<usize>,
    dtype: DType,
    descr: Py<PyArrayDescr>,
    owner: Py<MemoryOwner>,
    /// The upload the memory's data depends on (done when there was none): work on `queue`
    /// (and, on CUDA, on the legacy default stream) is ordered after it; anything else waits
    /// for it (`synchronize`, `__cuda_array_interface__`). Replaced when the view is handed out
    /// again after another upload into the same memory.
    ready: Mutex<Ticket>,
}

impl DeviceMemoryView {
    /// The upload the memory depends on (a clone: not held while waiting).
    fn ready(&self) -> Ticket {
        self.ready.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

#[pymethods]
impl DeviceMemoryView {
    /// Waits until the memory holds the buffer's data: the upload `.device` enqueued (in the
    /// order of `queue`, so kernels there need no wait) is done. Call it before using `ptr`
    /// from another stream or queue, or from the host.
    fn synchronize(&self, py: Python<'_>) -> PyResult<()> {
        wait_ready(py, &self.ready())
    }

    /// `"opencl"`, `"cuda"` or `"wgpu"` (or `"host"`).
    #[getter]
    fn backend(&self) -> &'static str {
        self.device.backend_kind().name()
    }

    /// The runtime handle as an int: a `CUdeviceptr` (CUDA), a `cl_mem` (OpenCL), a `VkBuffer`
    /// (wgpu on Vulkan; 0 on other graphics APIs); 0 when the buffer is empty.
    #[getter]
    fn ptr(&self) -> usize {
        self.handle
    }

    /// The size in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.nbytes
    }

    /// The dimensions.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyTuple>> {
        pyo3::types::PyTuple::new(py, &self.shape)
    }

    /// The NumPy dtype of the elements.
    #[getter]
    fn dtype(&self, py: Python<'_>) -> Py<PyArrayDescr> {
        self.descr.clone_ref(py)
    }

    /// The device.
    #[getter]
    fn device(&self) -> PyDevice {
        PyDevice::new(self.device.clone())
    }

    /// The runtime's context handle as an int (`cl_context` or `CUcontext`; 0 on the host and
    /// on wgpu).
    #[getter]
    fn context(&self) -> usize {
        device_handles(&self.device).context_int()
    }

    /// The queue lazybuf copies on, as an int (`cl_command_queue` or `CUstream`; 0 on the
    /// host and on wgpu): enqueue kernels there to order them with lazybuf's copies.
    #[getter]
    fn queue(&self) -> usize {
        device_handles(&self.device).queue_int()
    }

    /// The object that keeps the memory alive.
    #[getter]
    fn owner(&self, py: Python<'_>) -> Py<MemoryOwner> {
        self.owner.clone_ref(py)
    }

    /// CUDA Array Interface version 3 (CUDA devices only).
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        if !crate::interop::addresses_cuda(&self.device) {
            return Err(PyAttributeError::new_err(
                "__cuda_array_interface__ exists only for memory on a CUDA device",
            ));
        }
        // Its consumers may use any stream: the upload is waited for here, so the interface
        // names no stream to synchronize with.
        wait_ready(py, &self.ready())?;
        crate::interop::cuda_array_interface(py, self.handle, &self.shape, self.dtype, false)
    }

    fn __repr__(&self) -> String {
        format!(
            "<lazybuf.DeviceMemoryView {} ptr=0x{:x} shape={} dtype={} nbytes={}>",
            self.device.backend_kind(),
            self.handle,
            crate::args::shape_repr(&self.shape),
            self.dtype,
            self.nbytes
        )
    }
}
