//! Validation of Python arguments that are not dtypes: shapes and device choices.
//!
//! Shapes follow NumPy: an int or a sequence of ints, each non-negative, at most 64 of them.
//! A non-integer raises `TypeError`, a negative or oversized dimension `ValueError`, and each
//! message says what was expected. The core then checks that the byte size fits.
//!
//! What does not live here: the size arithmetic ([`lazybuf::shape::Shape`]).

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyInt, PyList, PyString, PyTuple};

use lazybuf::Device;

use crate::accelerator::{PyDevice, current_device};
use crate::errors::OrPyErr;

/// NumPy's limit on the number of dimensions (`NPY_MAXDIMS` in NumPy 2).
pub const MAX_DIMS: usize = 64;

/// Parses a shape: an int `n` is `(n,)`; otherwise a sequence of ints.
pub fn shape(obj: &Bound<'_, PyAny>) -> PyResult<Vec<usize>> {
    let items: Vec<Bound<'_, PyAny>> = if let Ok(tuple) = obj.cast::<PyTuple>() {
        tuple.iter().collect()
    } else if let Ok(list) = obj.cast::<PyList>() {
        list.iter().collect()
    } else if let Some(dim) = index(obj)? {
        return Ok(vec![dimension(obj, dim)?]);
    } else if obj.is_instance_of::<PyString>() || obj.is_instance_of::<PyBytes>() {
        return Err(expected_shape(obj));
    } else {
        match obj.try_iter() {
            Ok(iter) => iter.collect::<PyResult<_>>()?,
            Err(_) => return Err(expected_shape(obj)),
        }
    };
    if items.len() > MAX_DIMS {
        return Err(PyValueError::new_err(format!(
            "shape has {} dimensions; expected at most {MAX_DIMS} (NumPy's limit)",
            items.len()
        )));
    }
    items
        .iter()
        .map(|item| match index(item)? {
            Some(dim) => dimension(obj, dim),
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
    // Beyond i128 only the sign matters: either way the dimension is rejected.
    Ok(Some(
        value
            .extract::<i128>()
            .unwrap_or_else(|_| if value.lt(0).unwrap_or(false) { i128::MIN } else { i128::MAX }),
    ))
}

fn dimension(shape: &Bound<'_, PyAny>, dim: i128) -> PyResult<usize> {
    if dim < 0 {
        return Err(PyValueError::new_err(format!(
            "negative dimensions are not allowed: got shape {}; expected non-negative ints",
            repr(shape)
        )));
    }
    usize::try_from(dim).map_err(|_| {
        PyValueError::new_err(format!(
            "dimension {dim} of shape {} is too large; expected at most {}",
            repr(shape),
            isize::MAX
        ))
    })
}

fn expected_shape(obj: &Bound<'_, PyAny>) -> PyErr {
    PyTypeError::new_err(format!(
        "shape must be an int or a sequence of ints, got {} of type {}",
        repr(obj),
        obj.get_type().name().map(|n| n.to_string()).unwrap_or_default()
    ))
}

/// Resolves a `device=` argument: `None` (the current device, see `get_accelerator()`), a
/// selector string (`"host"`, `"opencl:0"`, `"cuda"`), or a `Device`.
pub fn device(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Device> {
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

/// `repr(obj)`, or a placeholder when that fails.
pub fn repr(obj: &Bound<'_, PyAny>) -> String {
    obj.repr().map(|r| r.to_string()).unwrap_or_else(|_| "<unprintable>".into())
}
