//! NumPy dtypes to lazybuf's run-time element types, and back to buffer-protocol formats.
//!
//! Anything `numpy.dtype(...)` accepts is accepted (`np.float32`, `"f4"`, `float`, a dtype
//! object); bfloat16 comes from the optional `ml_dtypes` package. Unsupported types raise
//! `TypeError` naming the supported ones.
//!
//! [`fill_scalar`] converts a `fill()` value exactly as `ndarray.fill` does.
//!
//! What does not live here: element sizes and names (the core's [`lazybuf::DType`]).

use crate::gil_cell::GilOnceCell;
use numpy::{PyArrayDescr, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::{PyImportError, PyValueError};
use pyo3::prelude::*;
use std::sync::{Mutex, PoisonError};

use pyo3::ffi;
use pyo3::types::{PyList, PyString, PyTuple, PyType};

use lazybuf::DType;

use crate::args::repr;
use crate::errors::bad_dtype;

/// A buffer's element type: the core's tag and the NumPy descriptor its views carry.
pub(crate) struct ElementType {
    /// The core's element type.
    pub(crate) dtype: DType,
    /// The NumPy dtype of every view (for bfloat16, `ml_dtypes`'s).
    pub(crate) descr: Py<PyArrayDescr>,
}

/// Resolves a `dtype=` argument; `None` means the default, float32.
pub(crate) fn resolve(py: Python<'_>, obj: Option<&Bound<'_, PyAny>>) -> PyResult<ElementType> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(float32(py));
    };
    if let Ok(name) = obj.cast::<PyString>()
        && name.to_str()? == "bfloat16"
    {
        return bfloat16(py);
    }
    if let Some(found) = LAST.found(py, obj) {
        return Ok(found);
    }
    let descr = PyArrayDescr::new(py, obj)
        .map_err(|err| bad_dtype(format!("{} is not a NumPy dtype ({err})", repr(obj))))?;
    let elem = classify(descr)?;
    LAST.remember(py, obj, &elem);
    Ok(elem)
}

/// The last `dtype=` argument resolved and what it resolved to, when the argument always
/// resolves the same way (see [`LastDtype::remember`]): a loop that makes buffers of one dtype
/// skips NumPy's dtype conversion (about 250 instructions of a 5,000 instruction constructor;
/// docs/BENCHMARKS.md).
static LAST: LastDtype = LastDtype(Mutex::new(None));

struct LastDtype(Mutex<Option<Remembered>>);

/// An argument, its element type and its descriptor.
type Remembered = (Py<PyAny>, DType, Py<PyArrayDescr>);

impl LastDtype {
    /// What `obj` resolved to, if it is the argument remembered.
    fn found(&self, py: Python<'_>, obj: &Bound<'_, PyAny>) -> Option<ElementType> {
        let last = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let (_, dtype, descr) = last.as_ref().filter(|(arg, ..)| arg.bind(py).is(obj))?;
        Some(ElementType { dtype: *dtype, descr: descr.clone_ref(py) })
    }

    /// Remembers `obj`'s resolution if nothing can change it: a dtype object (immutable) or a
    /// static type (`np.float32`, `float`: their attributes cannot be reassigned, unlike a
    /// class whose `dtype` attribute NumPy would read).
    fn remember(&self, py: Python<'_>, obj: &Bound<'_, PyAny>, elem: &ElementType) {
        let fixed = obj.is_instance_of::<PyArrayDescr>()
            || obj.cast::<PyType>().is_ok_and(|t| {
                // SAFETY: t is a live type object.
                unsafe { ffi::PyType_GetFlags(t.as_type_ptr()) & ffi::Py_TPFLAGS_HEAPTYPE == 0 }
            });
        if !fixed {
            return;
        }
        let entry = (obj.clone().unbind(), elem.dtype, elem.descr.clone_ref(py));
        let previous = self.0.lock().unwrap_or_else(PoisonError::into_inner).replace(entry);
        // Dropped after the lock: releasing the last reference to an object may run Python code.
        drop(previous);
    }
}

/// Maps a NumPy descriptor to the core's element type.
pub(crate) fn classify(descr: Bound<'_, PyArrayDescr>) -> PyResult<ElementType> {
    if descr.has_fields() || descr.has_subarray() {
        return Err(bad_dtype(format!("structured dtype {} has fields or subarrays", repr(&descr))));
    }
    if descr.is_native_byteorder() == Some(false) {
        return Err(bad_dtype(format!("{} is not in native byte order", repr(&descr))));
    }
    let dtype = match (descr.kind(), descr.itemsize()) {
        (b'f', 2) => DType::F16,
        (b'f', 4) => DType::F32,
        (b'f', 8) => DType::F64,
        (b'i', 1) => DType::I8,
        (b'i', 2) => DType::I16,
        (b'i', 4) => DType::I32,
        (b'i', 8) => DType::I64,
        (b'u', 1) => DType::U8,
        (b'u', 2) => DType::U16,
        (b'u', 4) => DType::U32,
        (b'u', 8) => DType::U64,
        (b'c', 8) => DType::C64,
        (b'c', 16) => DType::C128,
        (_, 2) if descr.getattr("name")?.extract::<String>()? == "bfloat16" => DType::BF16,
        _ => {
            let name = descr.getattr("name").map(|n| n.to_string()).unwrap_or_default();
            return Err(bad_dtype(format!("{name} ({})", repr(&descr))));
        }
    };
    Ok(ElementType { dtype, descr: descr.unbind() })
}

/// Makes what rust-numpy keeps in once-cells on the paths of every buffer (the NumPy C API
/// table, NumPy's API version) and float32's descriptor now; the module's import calls it.
/// Made at first use instead, a thread's first buffer could be making them when another
/// thread forks (PyO3 releases the GIL before it starts making a once-cell's value), and the
/// child would wait forever for a maker that `fork` did not copy (a hostile script hung so in
/// 5 runs of 6; docs/RELIABILITY.md).
///
/// NumPy is imported first, so its own failure is what the import of lazybuf raises, as
/// NumPy raised it (`ModuleNotFoundError` where it is missing, `KeyboardInterrupt` for a
/// Ctrl-C while it loads); rust-numpy panics where it cannot have NumPy's C API, and such a
/// panic becomes an `ImportError` here, never a `PanicException`.
pub(crate) fn make_ready(py: Python<'_>) -> PyResult<()> {
    let numpy = py.import("numpy")?;
    // `fill`'s scalar maker, kept from here: no import per call, and `fill` works in a
    // finalizer late in the interpreter's shutdown, when imports no longer do.
    let empty = numpy.getattr("empty")?.unbind();
    NUMPY_EMPTY.get_or_init(py, || empty);
    // rust-numpy panics where it cannot have the C API, and the panic's message is printed
    // before the `catch_unwind` below can turn it into an ImportError: look first, as
    // rust-numpy looks, so that a module that is not NumPy's (or a build without its C API)
    // is an ImportError alone. Only its version checks are left to the panic's path.
    find_c_api(py, &numpy).map_err(|why| c_api_missing(&why))?;
    let made = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let float32 = float32(py);
        // The dtype checks of `classify` read NumPy's API version.
        let _ = classify(float32.descr.into_bound(py));
    }));
    made.map_err(|panic| {
        let why = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("no reason given");
        c_api_missing(why)
    })
}

/// NumPy's C API capsule where rust-numpy looks for it: `_ARRAY_API` of `numpy._core.multiarray`
/// (NumPy 2) or `numpy.core.multiarray` (1.x), the major version read as rust-numpy reads it.
fn find_c_api(py: Python<'_>, numpy: &Bound<'_, PyModule>) -> Result<(), String> {
    let looked = || -> PyResult<Result<(), String>> {
        let version = numpy.getattr("__version__")?;
        let major: u8 = py
            .import("numpy.lib")?
            .getattr("NumpyVersion")?
            .call1((version,))?
            .getattr("major")?
            .extract()?;
        let module = if major >= 2 { "numpy._core.multiarray" } else { "numpy.core.multiarray" };
        let api = py.import(module)?.getattr("_ARRAY_API")?;
        Ok(match api.cast::<pyo3::types::PyCapsule>() {
            Ok(_) => Ok(()),
            Err(_) => Err(format!("{module}._ARRAY_API is a {}, not a capsule", api.get_type().name()?)),
        })
    };
    looked().map_err(|err| err.to_string()).and_then(|found| found)
}

fn c_api_missing(why: &str) -> PyErr {
    PyImportError::new_err(format!(
        "lazybuf could not load NumPy's C API ({why}); expected an importable NumPy 1.x or 2.x \
         (`python -c 'import numpy'` shows why it fails)"
    ))
}

/// `numpy.empty`, kept at import ([`make_ready`]).
static NUMPY_EMPTY: GilOnceCell<Py<PyAny>> = GilOnceCell::new();

fn float32(py: Python<'_>) -> ElementType {
    static F32: GilOnceCell<Py<PyArrayDescr>> = GilOnceCell::new();
    let descr = F32.get_or_init(py, || numpy::dtype::<f32>(py).unbind()).clone_ref(py);
    ElementType { dtype: DType::F32, descr }
}

fn bfloat16(py: Python<'_>) -> PyResult<ElementType> {
    let module = py.import("ml_dtypes").map_err(|_| {
        bad_dtype("bfloat16 needs the ml_dtypes package (`pip install ml_dtypes`), which is not installed")
    })?;
    let descr = PyArrayDescr::new(py, module.getattr("bfloat16")?)?;
    classify(descr)
}

/// The PEP 3118 format character of an element type (`None` for bfloat16, which has none).
pub(crate) fn buffer_format(dtype: DType) -> Option<&'static std::ffi::CStr> {
    Some(match dtype {
        DType::U8 => c"B",
        DType::U16 => c"H",
        DType::U32 => c"I",
        DType::U64 => c"Q",
        DType::I8 => c"b",
        DType::I16 => c"h",
        DType::I32 => c"i",
        DType::I64 => c"q",
        DType::F16 => c"e",
        DType::F32 => c"f",
        DType::F64 => c"d",
        DType::C64 => c"Zf",
        DType::C128 => c"Zd",
        DType::BF16 => return None,
    })
}

/// The array-interface type string (`"<f4"`) of an element type (`None` for bfloat16).
pub(crate) fn typestr(dtype: DType) -> Option<String> {
    let kind = match dtype {
        DType::F16 | DType::F32 | DType::F64 => 'f',
        DType::I8 | DType::I16 | DType::I32 | DType::I64 => 'i',
        DType::U8 | DType::U16 | DType::U32 | DType::U64 => 'u',
        DType::C64 | DType::C128 => 'c',
        _ => return None,
    };
    let order = if dtype.size() == 1 {
        '|'
    } else if cfg!(target_endian = "little") {
        '<'
    } else {
        '>'
    };
    Some(format!("{order}{kind}{}", dtype.size()))
}

/// `value` as a 0-d array of `descr`, converted exactly as `ndarray.fill` converts it (it is
/// `ndarray.fill` on a 0-d array): Python ints out of range raise `OverflowError`, floats into
/// ints truncate, NaN into ints raises `ValueError`, NumPy scalars follow NumPy's own rules
/// (`np.int64(2**40)` into int8 raises `OverflowError`, into uint8 wraps, as NumPy does). A
/// sequence or an array of one or more dimensions is not a scalar: `ValueError`.
pub(crate) fn fill_scalar<'py>(
    value: &Bound<'py, PyAny>,
    descr: &Bound<'py, PyArrayDescr>,
) -> PyResult<Bound<'py, PyUntypedArray>> {
    let py = value.py();
    let shape = if let Ok(array) = value.cast::<PyUntypedArray>() {
        (array.ndim() != 0).then(|| crate::args::shape_repr(array.shape()))
    } else if value.is_instance_of::<PyList>() || value.is_instance_of::<PyTuple>() {
        Some(format!("({},)", value.len()?))
    } else {
        None
    };
    if let Some(shape) = shape {
        return Err(PyValueError::new_err(format!(
            "fill: expected a scalar, got {} of shape {shape}",
            value.get_type().name().map(|n| n.to_string()).unwrap_or_default()
        )));
    }
    let empty =
        NUMPY_EMPTY.get_or_try_init(py, || py.import("numpy")?.getattr("empty").map(Bound::unbind))?;
    let scalar = empty.bind(py).call1((PyTuple::empty(py), descr))?;
    scalar.call_method1("fill", (value,))?;
    Ok(scalar.cast_into::<PyUntypedArray>()?)
}
