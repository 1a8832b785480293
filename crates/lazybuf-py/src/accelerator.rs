//! Devices as Python sees them: `lazybuf.Device`, `get_accelerator()`, memory information and
//! the process-wide choice of device for new buffers.
//!
//! The current device starts as the core's default (`LAZYBUF_DEVICE`, else the first CUDA GPU,
//! else another GPU, else the host) and can be changed with `Accelerator.select_device`.
//!
//! PyDotCompute 0.2.0's names are here too (docs/MIGRATING.md): `get_accelerator()` and
//! `Accelerator()` return the one accelerator object; a `Device` has PyDotCompute's
//! `DeviceProperties` fields (`device_id`, `device_type`, `compute_capability`,
//! `total_memory_gb`...); `get_device(i)`, `set_device(i)`, `cuda_available`,
//! `metal_available`.
//!
//! What does not live here: discovery and memory queries themselves ([`lazybuf::discovery`],
//! [`lazybuf::Device::memory_info`]).

use std::sync::Mutex;

use crate::gil_cell::GilOnceCell;
use pyo3::exceptions::{PyIndexError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt, PyString};

use lazybuf::{Device, MemorySource};

use crate::args::repr;
use crate::errors::OrPyErr;

/// The device chosen with `select_device`; `None` until then (the core's default applies).
static SELECTED: Mutex<Option<Device>> = Mutex::new(None);

/// The device new buffers go to when no `device=` is given.
pub(crate) fn current_device() -> PyResult<Device> {
    let selected = SELECTED.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
    match selected {
        Some(device) => Ok(device),
        None => lazybuf::default_device().or_py(),
    }
}

/// The selector string (`"opencl:1"`) that names `device` in [`lazybuf::select_device`].
pub(crate) fn selector(device: &Device) -> String {
    let kind = device.backend_kind();
    let index =
        lazybuf::devices().iter().filter(|d| d.backend_kind() == kind).position(|d| d == device).unwrap_or(0);
    format!("{kind}:{index}")
}

/// Resolves a `device=` argument: `None` (the current device, see `get_accelerator()`), a
/// selector string (`"host"`, `"opencl:0"`, `"cuda"`), or a `Device`.
pub(crate) fn device_arg(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Device> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return current_device();
    };
    if let Ok(device) = obj.cast::<PyDevice>() {
        return Ok(device.get().device().clone());
    }
    if let Ok(selector) = obj.cast::<PyString>() {
        return lazybuf::select_device(selector.to_str()?).or_py();
    }
    Err(PyTypeError::new_err(format!(
        "device must be None, a selector string such as \"host\" or \"opencl:0\", or a \
         lazybuf.Device; got {}",
        repr(obj)
    )))
}

/// The device recorded in a pickle: `selector` if this process has it, else the current device,
/// with a `RuntimeWarning` that says so (the data is kept either way).
pub(crate) fn pickled_device(py: Python<'_>, recorded: &str) -> PyResult<Device> {
    match lazybuf::select_device(recorded) {
        Ok(device) => Ok(device),
        Err(err) => {
            let current = current_device()?;
            let message = format!(
                "the pickled memory was on {recorded:?}, which this process does not have ({err}); \
                 it is unpickled on the current device, {}",
                selector(&current)
            );
            let warning = py.get_type::<pyo3::exceptions::PyRuntimeWarning>();
            PyErr::warn(py, &warning, &std::ffi::CString::new(message).unwrap_or_default(), 1)?;
            Ok(current)
        }
    }
}

fn source_name(source: MemorySource) -> &'static str {
    match source {
        MemorySource::Runtime => "runtime",
        MemorySource::System => "system",
        MemorySource::TotalMinusProcessHeld => "total_minus_process_held",
    }
}

/// Whether `device` is a wgpu device on Metal: Metal is a graphics API under the wgpu backend
/// (selector `metal`), not a backend of its own.
fn runs_on_metal(device: &Device) -> bool {
    device.answers_to("metal")
}

/// One device: what it is and how much memory it has.
#[pyclass(name = "Device", module = "lazybuf", frozen, eq, hash, subclass)]
pub(crate) struct PyDevice {
    device: Device,
}

impl PartialEq for PyDevice {
    fn eq(&self, other: &Self) -> bool {
        self.device == other.device
    }
}

impl std::hash::Hash for PyDevice {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.device.id().hash(state);
    }
}

impl PyDevice {
    /// Wraps a core device.
    pub(crate) fn new(device: Device) -> Self {
        PyDevice { device }
    }

    /// The core device.
    pub(crate) fn device(&self) -> &Device {
        &self.device
    }
}

#[pymethods]
impl PyDevice {
    /// The runtime's name for the device.
    #[getter]
    fn name(&self) -> &str {
        self.device.name()
    }

    /// `"host"`, `"opencl"`, `"cuda"` or `"wgpu"`.
    #[getter]
    fn backend(&self) -> &'static str {
        self.device.backend_kind().name()
    }

    /// The vendor as the runtime reports it.
    #[getter]
    fn vendor(&self) -> &str {
        &self.device.info().vendor
    }

    /// Whether the device reads and writes host memory directly (syncs can skip copies).
    #[getter]
    fn shares_host_memory(&self) -> bool {
        self.device.info().shares_host_memory
    }

    /// Whether the device allocates shared memory (``MemoryShared``, ``kind="shared"``): CUDA
    /// managed memory, OpenCL fine-grained SVM, host memory on the host device; ``False`` on
    /// wgpu and where the runtime lacks it (NVIDIA's OpenCL has only coarse-grained SVM).
    #[getter]
    fn shared_memory(&self) -> bool {
        self.device.info().shared_memory
    }

    /// Whether the device is a GPU.
    #[getter]
    fn is_gpu(&self) -> bool {
        self.device.info().is_gpu
    }

    /// Whether the device keeps working in a child made by ``os.fork()`` (the host device);
    /// elsewhere a forked child gets ``ForkedChildError`` (use the ``'spawn'`` start method).
    #[getter]
    fn survives_fork(&self) -> bool {
        self.device.survives_fork()
    }

    /// Total memory in bytes.
    #[getter]
    fn total_memory(&self) -> u64 {
        self.device.info().total_memory
    }

    /// The selector that names this device (`"opencl:0"`), for `device=` and `LAZYBUF_DEVICE`.
    #[getter]
    fn selector(&self) -> String {
        selector(&self.device)
    }

    /// `(free, total)` bytes now.
    fn get_memory_info(&self) -> PyResult<(u64, u64)> {
        let info = self.device.memory_info().or_py()?;
        Ok((info.free, info.total))
    }

    /// Bytes of this device's memory that lazybuf's caches hold for reuse: allocated as far
    /// as the runtime knows (so not in `get_memory_info()`'s free figure), handed to new
    /// buffers first, and given back by `lazybuf.trim()`.
    #[getter]
    fn cached_memory(&self) -> PyResult<u64> {
        Ok(self.device.memory_info().or_py()?.cached)
    }

    /// Where the free figure comes from: `"runtime"` (the driver's own query), `"system"`
    /// (the OS's available memory) or `"total_minus_process_held"` (no runtime query exists).
    #[getter]
    fn memory_source(&self) -> PyResult<&'static str> {
        Ok(source_name(self.device.memory_info().or_py()?.source))
    }

    /// Waits for all work queued on the device.
    fn synchronize(&self) -> PyResult<()> {
        self.device.synchronize().or_py()
    }

    /// The failures recorded on this device where no caller could be told at once (a buffer
    /// dropped with a failed transfer nobody waited for, a failed free of device memory), as
    /// the exceptions they would have raised, oldest first; each is returned once. At most 64
    /// are kept between two calls: beyond that a last `RuntimeError` says how many were dropped.
    fn take_deferred_errors(&self, py: Python<'_>) -> Vec<Py<PyAny>> {
        let (errors, dropped) = self.device.take_deferred_errors();
        let mut taken: Vec<Py<PyAny>> =
            errors.into_iter().map(|err| crate::errors::to_py(err).into_value(py).into_any()).collect();
        if dropped > 0 {
            let more = pyo3::exceptions::PyRuntimeError::new_err(format!(
                "{dropped} more deferred errors were recorded on this device and dropped (at most 64 \
                 are kept between two calls of take_deferred_errors)"
            ));
            taken.push(more.into_value(py).into_any());
        }
        taken
    }

    // --- PyDotCompute 0.2.0's DeviceProperties fields (docs/MIGRATING.md) -------------------

    /// The device's index in `get_accelerator().devices` (`get_device(device_id)` is it);
    /// None for a device that is not listed there (`lazybuf.testing.FaultyDevice`).
    #[getter]
    fn device_id(&self) -> Option<usize> {
        lazybuf::devices().iter().position(|d| *d == self.device)
    }

    /// The kind of device, a `DeviceType`: its backend (`CPU` for the host, `CUDA`, `OPENCL`,
    /// `WGPU`), except `METAL` for a wgpu device on Metal (the device `.metal` uses).
    #[getter]
    fn device_type(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        static CLASS: GilOnceCell<Py<PyAny>> = GilOnceCell::new();
        let class = CLASS.get_or_try_init(py, || {
            py.import("lazybuf._pydotcompute")?.getattr("DeviceType").map(Bound::unbind)
        })?;
        let kind = if runs_on_metal(&self.device) { "metal" } else { self.device.backend_kind().name() };
        class.bind(py).call1((kind,)).map(Bound::unbind)
    }

    /// `(major, minor)` of a CUDA device; None for other devices (they have none).
    #[getter]
    fn compute_capability(&self) -> Option<(u32, u32)> {
        self.device.info().compute_capability
    }

    /// The compute capability as `"8.9"`, or `"N/A"` where there is none.
    #[getter]
    fn compute_capability_str(&self) -> String {
        match self.device.info().compute_capability {
            Some((major, minor)) => format!("{major}.{minor}"),
            None => "N/A".into(),
        }
    }

    /// `total_memory` in GiB.
    #[getter]
    fn total_memory_gb(&self) -> f64 {
        self.device.info().total_memory as f64 / (1u64 << 30) as f64
    }

    /// Whether the device can be used: true for every device lazybuf lists (a device whose
    /// runtime is missing is not listed; see `Accelerator.backend_status`).
    #[getter]
    fn is_available(&self) -> bool {
        true
    }

    fn __repr__(&self) -> String {
        format!("<lazybuf.Device {} {:?}>", selector(&self.device), self.device.name())
    }

    /// Pickles as the device's selector (a `multiprocessing` or `concurrent.futures` worker's
    /// argument): unpickled, it is the device of that selector in the unpickling process, or
    /// the `ValueError` of `device=` naming it where that process has none. A device not in
    /// `get_accelerator().devices` (`lazybuf.testing.FaultyDevice`) has no selector and does
    /// not pickle (`TypeError`).
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, (String,))> {
        let device = slf.get().device();
        if !slf.is_exact_instance_of::<Self>() || !lazybuf::devices().contains(device) {
            return Err(PyTypeError::new_err(format!(
                "cannot pickle {}: it is not one of get_accelerator().devices, so no selector names it",
                repr(slf.as_any())
            )));
        }
        let rebuild = slf.py().import("lazybuf._lazybuf")?.getattr("_rebuild_device")?;
        Ok((rebuild, (selector(device),)))
    }

    /// The device itself: a `Device` names a device and holds no state of its own to copy.
    fn __copy__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    /// The device itself (see `__copy__`).
    fn __deepcopy__<'py>(slf: Bound<'py, Self>, _memo: &Bound<'py, PyAny>) -> Bound<'py, Self> {
        slf
    }
}

/// Unpickles a `Device` ([`PyDevice::__reduce__`]): the device `selector` names here.
#[pyfunction]
pub(crate) fn _rebuild_device(selector: &str) -> PyResult<PyDevice> {
    lazybuf::select_device(selector).or_py().map(PyDevice::new)
}

/// The process's devices and the current device: `lazybuf.get_accelerator()`.
#[pyclass(name = "Accelerator", module = "lazybuf", frozen)]
pub(crate) struct Accelerator;

/// The index `device_id` names in `devices`, for `get_device`/`set_device`: any integer,
/// Python's or one with `__index__` (`numpy.int64`, as PyDotCompute's list indexing took);
/// a `ValueError` out of range (as PyDotCompute raised), a `TypeError` for a non-integer or a
/// bool (PyDotCompute took `True` as 1, which is always a mistake in a device id).
fn device_at(operation: &str, device_id: &Bound<'_, PyAny>) -> PyResult<Device> {
    let all = lazybuf::devices();
    let expected = format!("{operation}: expected a device_id, an index 0 <= device_id < {}", all.len());
    if device_id.is_instance_of::<PyBool>() {
        return Err(PyTypeError::new_err(format!("{expected}; got the bool {device_id}")));
    }
    let py = device_id.py();
    // operator.index: ints as they are, other integers through `__index__`.
    let index = match py.import("operator")?.getattr("index")?.call1((device_id,)) {
        Ok(index) => index,
        Err(_) => {
            let kind = device_id.get_type().name().map(|n| n.to_string()).unwrap_or_default();
            return Err(PyTypeError::new_err(format!("{expected}; got {kind} {}", device_id.repr()?)));
        }
    };
    let index: i128 = index.cast::<PyInt>()?.extract()?;
    usize::try_from(index)
        .ok()
        .and_then(|i| all.get(i).cloned())
        .ok_or_else(|| PyValueError::new_err(format!("{expected}; got {index}")))
}

#[pymethods]
impl Accelerator {
    /// The accelerator: the same object as `get_accelerator()` (as PyDotCompute's
    /// `Accelerator()` was a singleton).
    #[new]
    fn py_new(py: Python<'_>) -> PyResult<Py<Self>> {
        get_accelerator(py)
    }

    /// Every device of every available backend, the host last.
    #[getter]
    fn devices(&self) -> Vec<PyDevice> {
        lazybuf::devices().into_iter().map(PyDevice::new).collect()
    }

    /// The number of devices (the host included).
    #[getter]
    fn device_count(&self) -> usize {
        lazybuf::devices().len()
    }

    /// The device that buffers created without `device=` use.
    #[getter]
    fn current_device(&self) -> PyResult<PyDevice> {
        current_device().map(PyDevice::new)
    }

    /// Makes `device` (a `Device`, a selector string, or an index into `devices`) the current
    /// device; `None` goes back to the default. Returns the new current device.
    #[pyo3(signature = (device))]
    fn select_device(&self, device: &Bound<'_, PyAny>) -> PyResult<PyDevice> {
        let chosen = if device.is_none() {
            None
        } else if let Ok(d) = device.cast::<PyDevice>() {
            Some(d.get().device.clone())
        } else if let Ok(s) = device.cast::<PyString>() {
            Some(lazybuf::select_device(s.to_str()?).or_py()?)
        } else if device.is_instance_of::<PyBool>() {
            return Err(PyTypeError::new_err(format!(
                "select_device expects a lazybuf.Device, a selector string such as \"opencl:0\", \
                 an index into devices, or None; got the bool {}: a bool is not a device index",
                if device.is_truthy()? { "True" } else { "False" }
            )));
        } else if let Ok(i) = device.cast::<PyInt>() {
            let i: i64 = i.extract()?;
            let all = lazybuf::devices();
            let found = usize::try_from(i).ok().and_then(|i| all.get(i).cloned());
            Some(found.ok_or_else(|| {
                PyIndexError::new_err(format!(
                    "device index {i} is out of range; expected 0 <= index < {}",
                    all.len()
                ))
            })?)
        } else {
            return Err(PyTypeError::new_err(
                "select_device expects a lazybuf.Device, a selector string such as \"opencl:0\", \
                 an index into devices, or None",
            ));
        };
        *SELECTED.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = chosen;
        current_device().map(PyDevice::new)
    }

    /// `(free, total)` bytes of `device` (default: the current device). The free figure is
    /// the runtime's where it has one (CUDA), the system's available memory on the host, and
    /// total minus what this process holds elsewhere (see `Device.memory_source`).
    #[pyo3(signature = (device=None))]
    fn get_memory_info(&self, device: Option<&Bound<'_, PyAny>>) -> PyResult<(u64, u64)> {
        let device = device_arg(device)?;
        let info = device.memory_info().or_py()?;
        Ok((info.free, info.total))
    }

    /// What each compiled-in backend found: `(backend, device count or the reason it is
    /// unavailable)`.
    #[getter]
    fn backend_status(&self, py: Python<'_>) -> PyResult<Vec<(&'static str, Py<PyAny>)>> {
        lazybuf::backend_status()
            .into_iter()
            .map(|status| {
                let found = match status.devices {
                    Ok(n) => n.into_pyobject(py)?.into_any().unbind(),
                    Err(reason) => reason.into_pyobject(py)?.into_any().unbind(),
                };
                Ok((status.backend.name(), found))
            })
            .collect()
    }

    /// Whether a backend has at least one device: `"cuda"`, `"opencl"`, `"wgpu"`, `"host"`,
    /// or a graphics API under wgpu (`"vulkan"`, `"metal"`, `"dx12"`).
    fn is_available(&self, backend: &str) -> bool {
        let name = backend.trim().to_ascii_lowercase();
        let known = lazybuf::backend::kinds().any(|kind| kind.name() == name)
            || lazybuf::backend::SELECTOR_ALIASES.iter().any(|(alias, _)| *alias == name);
        known && lazybuf::select_device(&name).is_ok()
    }

    /// Waits for all work queued on the current device.
    fn synchronize(&self) -> PyResult<()> {
        current_device()?.synchronize().or_py()
    }

    /// `devices[device_id]`; `ValueError` when out of range.
    fn get_device(&self, device_id: &Bound<'_, PyAny>) -> PyResult<PyDevice> {
        device_at("get_device", device_id).map(PyDevice::new)
    }

    /// Makes `devices[device_id]` the current device (`select_device`); `ValueError` when out
    /// of range.
    fn set_device(&self, device_id: &Bound<'_, PyAny>) -> PyResult<()> {
        let device = device_at("set_device", device_id)?;
        *SELECTED.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(device);
        Ok(())
    }

    /// Whether lazybuf found a CUDA device.
    #[getter]
    fn cuda_available(&self) -> bool {
        lazybuf::devices().iter().any(|d| d.backend_kind().name() == "cuda")
    }

    /// Whether lazybuf found a Metal device: a wgpu device on Metal (macOS), the device
    /// `.metal` uses.
    #[getter]
    fn metal_available(&self) -> bool {
        lazybuf::devices().iter().any(runs_on_metal)
    }

    fn __repr__(&self) -> PyResult<String> {
        let current = current_device()?;
        Ok(format!(
            "<lazybuf.Accelerator current={} devices={}>",
            selector(&current),
            lazybuf::devices().len()
        ))
    }
}

/// The accelerator: `lazybuf.get_accelerator()`, the same object on every call.
#[pyfunction]
pub(crate) fn get_accelerator(py: Python<'_>) -> PyResult<Py<Accelerator>> {
    static ACCELERATOR: GilOnceCell<Py<Accelerator>> = GilOnceCell::new();
    ACCELERATOR.get_or_try_init(py, || Py::new(py, Accelerator)).map(|a| a.clone_ref(py))
}
