//! Validation of Python arguments that are not dtypes: shapes, byte sizes and device choices.
//!
//! Shapes follow NumPy: an int or a sequence of ints, each non-negative, at most 64 of them.
//! A non-integer raises `TypeError`, a negative or oversized dimension `ValueError`, and each
//! message says what was expected. The core then checks that the byte size fits.
//!
//! Byte sizes ([`size`]: `nbytes`, `size=`, `resize(n)`, `allocate(nbytes)`) are ints: a Python
//! int, a NumPy integer scalar, or any object with `__index__` that is not an array. Arrays
//! (anything with the buffer protocol, DLPack or the CUDA array interface) are data, never
//! sizes, even 0-d integer arrays ([`is_size`] decides which a constructor argument is). An
//! exception raised by a size's `__index__` propagates unchanged, as `bytearray(x)` lets it.
//!
//! What does not live here: the size arithmetic ([`lazybuf::shape::Shape`]).

use crate::gil_cell::GilOnceCell;
use numpy::{PyArrayDescr, PyArrayDescrMethods, PyUntypedArray};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{
    PyBool, PyByteArray, PyBytes, PyDict, PyFrozenSet, PyInt, PyList, PyMapping, PyMemoryView, PySet,
    PyString, PyTuple,
};

/// NumPy's limit on the number of dimensions (`NPY_MAXDIMS` in NumPy 2).
pub(crate) const MAX_DIMS: usize = 64;

/// Parses a shape: an int `n` is `(n,)`; otherwise a sized sequence of ints (a tuple, a list,
/// a NumPy array, a range...). As in NumPy, iterators and generators, strings, bytes, mappings
/// and sets are not shapes (`TypeError`), and no more than [`MAX_DIMS`] + 1 items are ever
/// read, so an endless sequence fails at once.
pub(crate) fn shape(obj: &Bound<'_, PyAny>) -> PyResult<Vec<usize>> {
    let items: Vec<Bound<'_, PyAny>> = if let Ok(tuple) = obj.cast::<PyTuple>() {
        tuple.iter().collect()
    } else if let Ok(list) = obj.cast::<PyList>() {
        list.iter().collect()
    } else if let Some(dim) = index(obj)? {
        return Ok(vec![dimension(obj, 0, dim)?]);
    } else if obj.is_instance_of::<PyString>()
        || obj.is_instance_of::<PyBytes>()
        || obj.is_instance_of::<PyDict>()
        || obj.is_instance_of::<PySet>()
        || obj.is_instance_of::<PyFrozenSet>()
        || obj.cast::<PyMapping>().is_ok()
        || obj.len().is_err()
    {
        // No len(): an iterator, a generator (`itertools.count()` never ends), or no sequence.
        return Err(expected_shape(obj));
    } else {
        match obj.try_iter() {
            Ok(iter) => iter.take(MAX_DIMS + 1).collect::<PyResult<_>>()?,
            Err(_) => return Err(expected_shape(obj)),
        }
    };
    if items.len() > MAX_DIMS {
        // Only MAX_DIMS + 1 items were read; len() says how many there are.
        let count = obj.len().unwrap_or(items.len()).max(items.len());
        return Err(PyValueError::new_err(format!(
            "shape has {count} dimensions; expected at most {MAX_DIMS} (NumPy's limit)"
        )));
    }
    items
        .iter()
        .enumerate()
        .map(|(position, item)| match index(item)? {
            Some(dim) => dimension(obj, position, dim),
            None => Err(PyTypeError::new_err(format!(
                "shape {} has a non-integer dimension {}; expected a sequence of ints",
                repr(obj),
                repr(item)
            ))),
        })
        .collect()
}

/// The integer value of an object that supports `__index__` (not bool), else `None`.
fn index(obj: &Bound<'_, PyAny>) -> PyResult<Option<i128>> {
    if obj.is_instance_of::<PyBool>() {
        return Ok(None);
    }
    let value = if obj.is_instance_of::<PyInt>() {
        obj.clone()
    } else {
        match obj.call_method0("__index__") {
            Ok(value) => value,
            Err(_) => return Ok(None),
        }
    };
    // Most dimensions fit an i64 (a single C call); beyond i128 only the sign matters:
    // either way the dimension is rejected.
    if let Ok(small) = value.extract::<i64>() {
        return Ok(Some(small.into()));
    }
    Ok(Some(
        value
            .extract::<i128>()
            .unwrap_or_else(|_| if value.lt(0).unwrap_or(false) { i128::MIN } else { i128::MAX }),
    ))
}

/// Checks dimension number `position` of `shape`: non-negative and at most `isize::MAX`, as
/// NumPy requires of every dimension (even when another one is 0 and the size is 0).
fn dimension(shape: &Bound<'_, PyAny>, position: usize, dim: i128) -> PyResult<usize> {
    if dim < 0 {
        return Err(PyValueError::new_err(format!(
            "negative dimensions are not allowed: dimension {position} of shape {} is {dim}; \
             expected non-negative ints",
            repr(shape)
        )));
    }
    isize::try_from(dim).ok().and_then(|dim| usize::try_from(dim).ok()).ok_or_else(|| {
        PyValueError::new_err(format!(
            "dimension {position} of shape {} is {dim}, which is too large; expected at most {} \
             (isize::MAX, NumPy's maximum allowed dimension)",
            repr(shape),
            isize::MAX
        ))
    })
}

fn expected_shape(obj: &Bound<'_, PyAny>) -> PyErr {
    PyTypeError::new_err(format!(
        "shape must be an int or a sequence of ints (a tuple, a list), got {} of type {}",
        repr(obj),
        obj.get_type().name().map(|n| n.to_string()).unwrap_or_default()
    ))
}

/// Whether `obj` is a NumPy integer scalar (`numpy.integer`).
fn is_numpy_integer(obj: &Bound<'_, PyAny>) -> PyResult<bool> {
    let py = obj.py();
    static INTEGER: GilOnceCell<Py<PyAny>> = GilOnceCell::new();
    let integer =
        INTEGER.get_or_try_init(py, || py.import("numpy")?.getattr("integer").map(Bound::unbind))?;
    obj.is_instance(integer.bind(py))
}

/// Whether `obj` is data (an array or other memory: the buffer protocol, DLPack, the CUDA
/// array interface) rather than a number.
fn is_data(obj: &Bound<'_, PyAny>) -> PyResult<bool> {
    if obj.is_instance_of::<PyUntypedArray>() {
        return Ok(true);
    }
    // SAFETY: obj is a live object; the check only reads its type's buffer slot.
    let buffer = unsafe { ffi::PyObject_CheckBuffer(obj.as_ptr()) } != 0;
    Ok(buffer || obj.hasattr("__dlpack__")? || obj.hasattr("__cuda_array_interface__")?)
}

/// Whether a constructor's first argument is a byte size (see the module docs) rather than a
/// source of data: a Python int or NumPy integer scalar (not bool), or an object with
/// `__index__` that is no array or other memory.
pub(crate) fn is_size(obj: &Bound<'_, PyAny>) -> PyResult<bool> {
    if obj.is_instance_of::<PyBool>() {
        return Ok(false);
    }
    if obj.is_instance_of::<PyInt>() || is_numpy_integer(obj)? {
        return Ok(true);
    }
    // SAFETY: obj is a live object; the check only reads its type's nb_index slot.
    let index = unsafe { ffi::PyIndex_Check(obj.as_ptr()) } != 0;
    Ok(index && !is_data(obj)?)
}

/// The int an argument named `what` stands for: a Python int as it is, another object through
/// its `__index__` (what that raises propagates). An array or anything without `__index__`:
/// `TypeError` naming `what`.
fn int_value<'py>(obj: &Bound<'py, PyAny>, what: &str) -> PyResult<Bound<'py, PyAny>> {
    let py = obj.py();
    if obj.is_instance_of::<PyInt>() {
        return Ok(obj.clone());
    }
    if obj.is_instance_of::<PyUntypedArray>() {
        return Err(PyTypeError::new_err(format!(
            "{what} must be an int (a Python int or a NumPy integer scalar), got the array {}; arrays are \
             data, not sizes",
            repr(obj)
        )));
    }
    // SAFETY: obj is a live object; the check only reads its type's nb_index slot.
    if unsafe { ffi::PyIndex_Check(obj.as_ptr()) } == 0 {
        return Err(PyTypeError::new_err(format!(
            "{what} must be an int (a Python int or a NumPy integer scalar), got {}",
            repr(obj)
        )));
    }
    // SAFETY: obj is a live object; PyNumber_Index returns a new reference or NULL with the
    // exception (the object's own) set, which from_owned_ptr_or_err takes.
    unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyNumber_Index(obj.as_ptr())) }
}

/// A memory object's `alignment` argument: an int; zero or negative asks for the kind's own
/// alignment (dpctl's rule), which is 0 here. Larger than the address space: `ValueError`
/// naming it (the allocation checks the rest: a power of two).
pub(crate) fn alignment(obj: &Bound<'_, PyAny>) -> PyResult<usize> {
    if obj.is_instance_of::<PyBool>() {
        return Err(PyTypeError::new_err(format!("alignment must be an int, got {}", repr(obj))));
    }
    let value = int_value(obj, "alignment")?;
    if value.le(0)? {
        return Ok(0);
    }
    value.extract::<usize>().map_err(|_| {
        PyValueError::new_err(format!(
            "alignment is too large: {}; expected 0 (the kind's own) or a power of two below 2**{}",
            repr(&value),
            usize::BITS
        ))
    })
}

/// An int argument named `what` from 0 to 2**64 - 1 (an address, a count of bytes held):
/// negative or larger, `ValueError` naming it; not an int, `TypeError` naming it.
pub(crate) fn uint64(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<u64> {
    if obj.is_instance_of::<PyBool>() {
        return Err(PyTypeError::new_err(format!("{what} must be an int, got {}", repr(obj))));
    }
    let value = int_value(obj, what)?;
    if value.lt(0)? {
        return Err(PyValueError::new_err(format!("{what} must not be negative, got {}", repr(&value))));
    }
    value.extract::<u64>().map_err(|_| {
        PyValueError::new_err(format!("{what} is too large: {}; expected at most 2**64 - 1", repr(&value)))
    })
}

/// An int argument named `what` from -2**63 to 2**63 - 1 (a signed counter): out of that
/// range, `ValueError` naming it; not an int, `TypeError` naming it.
pub(crate) fn int64(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<i64> {
    if obj.is_instance_of::<PyBool>() {
        return Err(PyTypeError::new_err(format!("{what} must be an int, got {}", repr(obj))));
    }
    let value = int_value(obj, what)?;
    value.extract::<i64>().map_err(|_| {
        PyValueError::new_err(format!(
            "{what} is out of range: {}; expected -2**63 to 2**63 - 1",
            repr(&value)
        ))
    })
}

/// A value class's repr as the constructor call that makes it: `Class(a=1, b=2)` (`PoolStats`,
/// `lazybuf.mr.Statistics`).
pub(crate) fn fields_repr<T: std::fmt::Display>(class: &str, fields: &[(&str, T)]) -> String {
    let fields: Vec<String> = fields.iter().map(|(name, value)| format!("{name}={value}")).collect();
    format!("{class}({})", fields.join(", "))
}

/// A value class's pickle (`__reduce__`): its class and `values`, in its constructor's order.
pub(crate) fn reduce_to_class<'py, T: IntoPyObject<'py>, const N: usize>(
    obj: &Bound<'py, PyAny>,
    values: [T; N],
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
    Ok((obj.get_type().into_any(), PyTuple::new(obj.py(), values)?))
}

/// As [`uint64`], or `None` for Python's `None`.
pub(crate) fn optional_uint64(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Option<u64>> {
    if obj.is_none() { Ok(None) } else { uint64(obj, what).map(Some) }
}

/// A pool's `max_cached_bytes` argument (`lazybuf.MemoryPool`, `lazybuf.mr.PoolMemoryResource`).
pub(crate) fn max_cached_bytes(obj: &Bound<'_, PyAny>) -> PyResult<Option<u64>> {
    optional_uint64(obj, "max_cached_bytes")
}

/// A byte size argument named `what` (see the module docs): not negative and at most
/// `isize::MAX`. Not an int: `TypeError`; an array: `TypeError` (arrays are data, not sizes);
/// negative or too large: `ValueError`; what the object's own `__index__` raises propagates.
pub(crate) fn size(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<usize> {
    // An int to Python, but never meant as a number of bytes: refused here, for every size
    // (`DeviceBuffer(size=True)` made a buffer of 1 byte, later `mr`'s `allocate(True)` one
    // of 1 byte, while the memory objects refused `True`: hostile passes).
    if obj.is_instance_of::<pyo3::types::PyBool>() {
        return Err(PyTypeError::new_err(format!(
            "{what} must be an int (a Python int or a NumPy integer scalar), got the bool {}: a bool is \
             not a size",
            repr(obj)
        )));
    }
    let value = int_value(obj, what)?;
    if value.lt(0)? {
        return Err(PyValueError::new_err(format!("{what} must not be negative, got {}", repr(&value))));
    }
    value.extract::<usize>().ok().filter(|&n| n <= isize::MAX as usize).ok_or_else(|| {
        PyValueError::new_err(format!(
            "{what} is too large: {} bytes; expected at most {}",
            repr(&value),
            isize::MAX
        ))
    })
}

/// The array `copy_from(data)` copies when `data` is not a NumPy array: a bytes-like object
/// (`bytes`, `bytearray`, or a buffer of single bytes such as a `memoryview` of them) is raw
/// bytes, read as `numpy.frombuffer(data, dtype)` and so must hold exactly the buffer's
/// `nbytes`; anything else (a list, a scalar, a buffer of typed elements) is values, converted
/// to `descr` as `numpy.asarray(data, dtype)` converts them.
pub(crate) fn copy_source<'py>(
    data: &Bound<'py, PyAny>,
    descr: &Bound<'py, PyArrayDescr>,
    shape: &[usize],
) -> PyResult<Bound<'py, PyUntypedArray>> {
    let py = data.py();
    let np = py.import("numpy")?;
    let kwargs = PyDict::new(py);
    kwargs.set_item("dtype", descr)?;
    let Some(len) = raw_bytes_len(data)? else {
        return Ok(np.call_method("asarray", (data,), Some(&kwargs))?.cast_into::<PyUntypedArray>()?);
    };
    // The shape was checked when the buffer was made: its byte size fits in a usize.
    let nbytes = shape.iter().product::<usize>() * descr.itemsize();
    if len != nbytes {
        return Err(PyValueError::new_err(format!(
            "copy_from: a bytes-like source is copied as raw bytes (as numpy.frombuffer reads \
             it); expected exactly {nbytes} bytes (shape {:?}, dtype {}), got {len}; to copy \
             values, pass a list or a NumPy array",
            shape,
            descr.str()?
        )));
    }
    let flat = np.call_method("frombuffer", (data,), Some(&kwargs))?;
    Ok(flat.call_method1("reshape", (PyTuple::new(py, shape)?,))?.cast_into::<PyUntypedArray>()?)
}

/// The length in bytes of a bytes-like object: `bytes`, `bytearray`, or a `memoryview` of
/// single bytes (format `B`, `b` or `c`); `None` for anything else.
fn raw_bytes_len(data: &Bound<'_, PyAny>) -> PyResult<Option<usize>> {
    if data.is_instance_of::<PyBytes>() || data.is_instance_of::<PyByteArray>() {
        return data.len().map(Some);
    }
    if data.is_instance_of::<PyMemoryView>() {
        let format: String = data.getattr("format")?.extract()?;
        if data.getattr("itemsize")?.extract::<usize>()? == 1 && matches!(format.as_str(), "B" | "b" | "c") {
            return data.getattr("nbytes")?.extract().map(Some);
        }
    }
    Ok(None)
}

/// A shape as Python prints a tuple: `(3,)`, `(2, 3)`, `()`.
pub(crate) fn shape_repr(shape: &[usize]) -> String {
    match shape {
        [one] => format!("({one},)"),
        _ => format!("({})", shape.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")),
    }
}

/// `repr(obj)`, or a placeholder when that fails (never `Display` of a `Bound` in an error
/// message: when `str()` fails, as for an int beyond Python's digit limit, pyo3 prints an
/// "Exception ignored" traceback: the twenty-second hostile pass).
pub(crate) fn repr(obj: &Bound<'_, PyAny>) -> String {
    let mut text = obj.repr().map(|r| r.to_string()).unwrap_or_else(|_| "<unprintable>".into());
    // At most REPR_CHARS characters: an error about a huge value (a tuple of millions) quoted
    // all of it (a message of 44 MB: the twenty-second hostile pass).
    if let Some((cut, _)) = text.char_indices().nth(REPR_CHARS) {
        text.truncate(cut);
        text.push_str("...");
    }
    text
}

/// The most characters of a value an error message quotes ([`repr`], [`quoted`]).
const REPR_CHARS: usize = 200;

/// `text` quoted for an error message (Rust's `{:?}`), at most [`REPR_CHARS`] characters of it.
pub(crate) fn quoted(text: &str) -> String {
    match text.char_indices().nth(REPR_CHARS) {
        Some((cut, _)) => format!("{:?}...", &text[..cut]),
        None => format!("{text:?}"),
    }
}
