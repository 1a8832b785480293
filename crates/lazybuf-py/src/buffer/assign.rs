//! `buf[key] = value` for [`UnifiedBuffer`]: NumPy's assignment into the host copy, with
//! what NumPy cannot know about a buffer whose copies live in several memories.
//!
//! - An assignment to every element reads none of the old bytes: when the host copy is stale
//!   it is overwritten, not synced from the device first ([`whole_assignment`]).
//! - The key and the value are checked first, NumPy's errors raised before the buffer is
//!   touched, so a failed assignment changes nothing ([`checked_assignment`]; the fast paths
//!   [`assigns_without_error`] and [`basic_assigns_without_error`] skip the check where
//!   nothing can fail).
//! - The user's code that a conversion runs (`__index__`, `__float__`, `__array__`) may use
//!   the buffer, `free()` included: the key is indexed once ([`indexed_once`]) and a write
//!   that landed in memory the buffer gave up is an error ([`kept_memory`]).
//!
//! What does not live here: the class itself and its other methods ([`super`]).

use std::sync::Arc;

use lazybuf::observe::Cause;
use numpy::{PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyDict, PyInt, PySlice, PyTuple};

use crate::gil_cell::interned;
use crate::views::Storage;

use super::{UnifiedBuffer, host_view_of, numpy_module};

/// The call `buf[key] = value` is, in the guard's and the recorder's words.
pub(super) const SETITEM: Cause = Cause::access("__setitem__");

/// What a [`whole_assignment`] writes over the host copy.
enum Whole<'py> {
    /// Every byte, as a C-contiguous array of the buffer's shape and dtype.
    Array(Bound<'py, PyUntypedArray>),
    /// One element's bytes, repeated.
    Element(Vec<u8>),
}

/// `buf[key] = value` ([`UnifiedBuffer::__setitem__`]'s work, run as its observed call):
/// assigns into the host copy as NumPy does, a host write.
pub(super) fn set_item(
    slf: &Bound<'_, UnifiedBuffer>,
    key: &Bound<'_, PyAny>,
    value: &Bound<'_, PyAny>,
) -> PyResult<()> {
    // The user's `__index__`, once (`indexed_once` says why).
    let key = &indexed_once(slf.py(), key)?;
    // The memory is taken once the values are converted (`whole_assignment` says why).
    match whole_assignment(slf.get(), slf.py(), key, value)? {
        Some(Whole::Array(array)) => return slf.get().storage()?.copy_from_array(&array, None),
        Some(Whole::Element(element)) => {
            return slf.get().storage()?.overwrite_with(slf.py(), &element);
        }
        None => {}
    }
    // The key and the value are checked (the value converted, unless it is an array)
    // first, NumPy's errors raised before the buffer is touched: a failed assignment
    // changes nothing (`.host`'s access would have synced the host copy and left the
    // device copy stale).
    let value = if assigns_without_error(slf.get(), key, value)
        || basic_assigns_without_error(slf.get(), key, value)
    {
        value.clone()
    } else {
        checked_assignment(slf.get(), slf.py(), key, value)?
    };
    let value = &value;
    let (host, storage) = host_view_of(slf)?;
    storage.begin_host_write(slf.py())?;
    // NumPy converts `key` and `value` after `.host`'s access, and a conversion may run
    // the user's code (`__index__`, `__float__`, `__array__`, a finalizer, a weakref
    // callback), which may use this buffer (as may another thread meanwhile): the write
    // must not land silently in a host copy stale by then, in memory the buffer gave up
    // (`free()`, `release()`), nor beside a device copy synced before it. Also when
    // NumPy raises: it may have written some elements first (a conversion that fails
    // part way), which a sync meanwhile left beside a device copy without them
    // (SYNCHRONIZED copies that differed: the fifteenth hostile pass).
    let written = host.set_item(key, value);
    let kept = kept_memory(slf.get(), &storage).map(drop);
    // The buffer's lock was let go since `.host`'s access: another thread may have changed
    // the buffer and recorded it meanwhile. The settle's events read the clock anew (as a
    // call of its own, named as this one), not this call's first reading, or the merged
    // trace put them before the other thread's and a buffer's state events did not chain
    // (the twenty-second hostile pass).
    let settled = lazybuf::observe::call_anew(SETITEM, || {
        storage.settle_host_write(slf.py(), kept.is_ok(), written.is_ok())
    });
    // What happened to the buffer meanwhile explains a failed write first: a view made
    // read-only by another copy made current (or by `free()`) refused it with NumPy's
    // "assignment destination is read-only", which named no cause (the twentieth hostile
    // pass).
    kept?;
    settled?;
    match written {
        Err(err) if !is_writeable(&host)? => {
            let stale = crate::views::host_went_stale();
            stale.set_cause(slf.py(), Some(err));
            Err(stale)
        }
        written => written,
    }
}

/// `buf[key] = value` that assigns every element, so reads none of the old bytes, while the
/// host copy is stale (or the coherence checker is on: `.host` would check old bytes this
/// never reads): the buffer's memory and `value` as one C-contiguous array of its shape
/// and dtype, converted as NumPy's assignment converts it (a conversion error is raised here,
/// before the buffer changes), for an overwrite that syncs nothing first (SYCL's `no_init`,
/// OpenCL's `CL_MAP_WRITE_INVALIDATE_REGION`). Every element: `key` is `...`, or `:` on a
/// buffer of at least one dimension. `value`: a NumPy array (not of objects, not a view of the
/// buffer's own host block, which must see the sync's bytes) or a number. `None`: assign
/// through `.host`, as NumPy does.
///
/// The conversion may run the user's code (an array of a structured dtype whose fields hold
/// objects: their `__float__`), which may use the buffer, `free()` included. It writes
/// nothing: the caller takes the buffer's memory once it is done, and an overwrite of every
/// element with the converted values is right whatever the conversion did (after a `free()`,
/// the new memory holds them). The memory taken before the conversion was written and then
/// dropped by such a `free()`, the values lost with no error (the fifteenth hostile pass).
fn whole_assignment<'py>(
    this: &UnifiedBuffer,
    py: Python<'py>,
    key: &Bound<'py, PyAny>,
    value: &Bound<'py, PyAny>,
) -> PyResult<Option<Whole<'py>>> {
    let every_element = key.is(py.Ellipsis())
        || (!this.shape.is_empty()
            && key.cast::<pyo3::types::PySlice>().is_ok_and(|slice| {
                ["start", "stop", "step"].iter().all(|part| slice.getattr(*part).is_ok_and(|v| v.is_none()))
            }));
    if !every_element {
        return Ok(None);
    }
    let np = numpy_module(py)?;
    let array = match value.cast::<PyUntypedArray>() {
        Ok(array) if array.dtype().kind() != b'O' => Some(array),
        Ok(_) => return Ok(None),
        Err(_) => {
            if !is_number(np, value)? {
                return Ok(None);
            }
            None
        }
    };
    if !this.storage()?.assignment_overwrites(py, array)? {
        return Ok(None);
    }
    let descr = this.descr(py);
    let kwargs = PyDict::new(py);
    kwargs.set_item("dtype", descr)?;
    let Some(array) = array else {
        // A number: converted into one element of the buffer's dtype, as NumPy's assignment
        // converts it (its error raised here), then repeated over the host copy (no array of
        // the buffer's size is made: peak host memory stays the buffer's own).
        let element = np.call_method("empty", ((),), Some(&kwargs))?;
        element.set_item(py.Ellipsis(), value)?;
        let bytes: Vec<u8> = element.call_method0("tobytes")?.extract()?;
        return Ok(Some(Whole::Element(bytes)));
    };
    if array.dtype().is_equiv_to(descr) && array.is_c_contiguous() && array.shape() == this.shape.as_slice() {
        return Ok(Some(Whole::Array(array.clone())));
    }
    let whole = np.call_method("empty", (PyTuple::new(py, this.shape.iter())?,), Some(&kwargs))?;
    whole.set_item(py.Ellipsis(), value)?;
    Ok(Some(Whole::Array(whole.cast_into::<PyUntypedArray>()?)))
}

/// `key` with each index that NumPy would convert through the user's `__index__` already
/// converted: an object with `__index__` that is not an int (nor a bool, an array or a NumPy
/// scalar, whose conversion runs no user code), alone, in a tuple, or as a slice's start,
/// stop or step. `buf[key] = value` uses the key up to three times (NumPy's verdict on a
/// stand-in, the selection's shape, the assignment itself), and the user's `__index__` ran
/// each time (before the nineteenth hostile pass), where NumPy's own assignment runs it once:
/// code with effects ran again, and one that used lazybuf made its copies again. Converted
/// here once, as NumPy converts it: a slice's bound whose `__index__` raises raises (NumPy
/// raises it too); an index whose `__index__` raises is left as it is (NumPy sets the error
/// aside and tries the object as an array index: its verdict, which may run the method again,
/// stands). The key returned runs no user code in NumPy's indexing.
fn indexed_once<'py>(py: Python<'py>, key: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    // The common keys first, with no lookup: ints, slices of ints, tuples of those.
    fn plain(item: &Bound<'_, PyAny>) -> bool {
        item.is_exact_instance_of::<pyo3::types::PyInt>() || item.is_none() || item.is(item.py().Ellipsis())
    }
    let converted = |item: &Bound<'py, PyAny>| -> PyResult<Option<Bound<'py, PyAny>>> {
        if plain(item) {
            return Ok(None);
        }
        if let Ok(slice) = item.cast::<pyo3::types::PySlice>() {
            let parts = [
                slice.getattr(interned!(py, "start"))?,
                slice.getattr(interned!(py, "stop"))?,
                slice.getattr(interned!(py, "step"))?,
            ];
            if parts.iter().all(plain) {
                return Ok(None);
            }
            let mut bounds = Vec::with_capacity(3);
            for part in parts {
                bounds.push(if plain(&part) || !has_user_index(py, &part)? {
                    part
                } else {
                    index_of(py, &part)?
                });
            }
            return Ok(Some(
                py.get_type::<pyo3::types::PySlice>().call1((&bounds[0], &bounds[1], &bounds[2]))?,
            ));
        }
        if !has_user_index(py, item)? {
            return Ok(None);
        }
        // (NumPy sets the error of a raising `__index__` aside: the object stays.)
        Ok(index_of(py, item).ok())
    };
    // (A tuple's subclass, a named tuple, is a tuple of indices to NumPy too.)
    if let Ok(tuple) = key.cast::<PyTuple>() {
        let mut items: Option<Vec<Bound<'py, PyAny>>> = None;
        for (i, item) in tuple.iter().enumerate() {
            if let Some(new) = converted(&item)? {
                items.get_or_insert_with(|| tuple.iter().collect())[i] = new;
            }
        }
        return Ok(match items {
            Some(items) => PyTuple::new(py, items)?.into_any(),
            None => key.clone(),
        });
    }
    Ok(converted(key)?.unwrap_or_else(|| key.clone()))
}

/// Whether NumPy would run `item`'s own `__index__` to use it as an index: it has one and is
/// no int (an int subclass is taken as it is), bool, array or NumPy scalar.
fn has_user_index(py: Python<'_>, item: &Bound<'_, PyAny>) -> PyResult<bool> {
    if item.is_instance_of::<pyo3::types::PyInt>() || !item.get_type().hasattr("__index__")? {
        return Ok(false);
    }
    let np = numpy_module(py)?;
    Ok(!(item.is_instance(&np.getattr("ndarray")?)? || item.is_instance(&np.getattr("generic")?)?))
}

/// `operator.index(item)`: the int its `__index__` gives (checked, as NumPy's conversion
/// checks it).
fn index_of<'py>(py: Python<'py>, item: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: `item` is a live object and the interpreter is attached (`py`); the result is a
    // new reference or null with an exception set, which `from_owned_ptr_or_err` takes.
    unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyNumber_Index(item.as_ptr())) }
}

/// Whether `value` is a number NumPy assigns as one (a Python `float`, `int`, `bool` or
/// `complex`, or a NumPy scalar number or bool). `np` is the `numpy` module.
fn is_number(np: &Bound<'_, PyModule>, value: &Bound<'_, PyAny>) -> PyResult<bool> {
    Ok(value.is_exact_instance_of::<pyo3::types::PyFloat>()
        || value.is_exact_instance_of::<pyo3::types::PyInt>()
        || value.is_exact_instance_of::<pyo3::types::PyBool>()
        || value.is_exact_instance_of::<pyo3::types::PyComplex>()
        || value.is_instance(&np.getattr("number")?)?
        || value.is_instance(&np.getattr("bool_")?)?)
}

/// What `buf[key] = value` assigns once the buffer is touched, with every error NumPy's
/// assignment can raise (the key's and the value's) raised here first, before anything
/// changes. Assigning the result then cannot fail on the value (a key whose `__index__` gives
/// another answer the second time is the user's). Before, NumPy's errors came after `.host`'s
/// access: a failed assignment had synced the host copy and left the device copy stale (the
/// seventeenth hostile pass).
///
/// The check is NumPy's own assignment, with the same key, to a stand-in of the buffer's
/// shape and dtype whose strides are 0 (one element of memory): each kind of key keeps its
/// own rules (one element packs the value and refuses an array with dimensions; a boolean
/// mask takes a value of at most one dimension; a view limits a sequence's depth to its
/// own). Checked against an array of the selection's shape instead, `buf[i] = np.array([x])`
/// and `buf[mask] = np.array([[x]])` passed the check and failed after `.host`'s access (the
/// eighteenth hostile pass).
///
/// A number, or an array of a dtype that holds no objects (converting either runs no Python
/// code), is assigned itself afterwards: an array that views the buffer's own host copy is
/// read after `.host` synced it. Anything else (a sequence, objects whose conversion runs
/// their `__float__`) is converted once, here: into the stand-in's element when one element is
/// selected, else into an array of its own shape (`np.asarray`; into an array of the
/// selection's shape, `buf[:] = [0]` copied the whole buffer and a key of broadcast index
/// arrays asked for more memory than the key selects elements, where NumPy's assignment needs
/// none: the eighteenth pass).
fn checked_assignment<'py>(
    this: &UnifiedBuffer,
    py: Python<'py>,
    key: &Bound<'py, PyAny>,
    value: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let np = numpy_module(py)?;
    let descr = this.descr(py);
    let ndarray = np.getattr("ndarray")?;
    // An array of the buffer's dtype, `shape` and strides 0 over `element` (one element's
    // bytes, writable).
    let zero_strided =
        |shape: Bound<'py, PyAny>, element: Bound<'py, PyAny>| -> PyResult<Bound<'py, PyAny>> {
            let strides = PyTuple::new(py, std::iter::repeat_n(0usize, shape.len()?))?;
            ndarray.call((shape, descr, element, 0usize, strides), None)
        };
    let element_memory = || PyByteArray::new(py, &vec![0u8; descr.itemsize()]).into_any();
    let stand_in = |element: Bound<'py, PyAny>| -> PyResult<Bound<'py, PyAny>> {
        zero_strided(PyTuple::new(py, this.shape.iter())?.into_any(), element)
    };
    let number = is_number(np, value)?;
    // (`hasobject`: also a structured dtype with an object field.)
    let plain_array = match value.cast::<PyUntypedArray>() {
        Ok(array) => !array.dtype().getattr("hasobject")?.is_truthy()?,
        Err(_) => false,
    };
    if plain_array || number {
        // Converting it runs no Python code: NumPy's verdict on the stand-in, and the value
        // itself assigned afterwards (an array read after the sync: it may view this buffer's
        // host copy).
        stand_in(element_memory())?.set_item(key, value)?;
        return Ok(value.clone());
    }
    // The selection's dimensions (`None`: one element, which comes as a scalar).
    let ndim = match integer_selection(&this.shape, key) {
        Some([]) => None,
        Some(rest) => Some(rest.len()),
        None => {
            // Indexed on a stand-in whose elements have no bytes (NumPy's `V0`): a fancy
            // index's result holds no memory however many elements it selects. A key it
            // refuses is indexed on the plain stand-in, for NumPy's own error.
            let shape = PyTuple::new(py, this.shape.iter())?;
            let strides = PyTuple::new(py, std::iter::repeat_n(0usize, this.shape.len()))?;
            let void = np.getattr("dtype")?.call1(("V0",))?;
            let empty = ndarray.call((shape, void, PyByteArray::new(py, &[0]), 0usize, strides), None)?;
            let selected = match empty.get_item(key) {
                Ok(selected) => selected,
                Err(_) => stand_in(element_memory())?.get_item(key)?,
            };
            match selected.is_instance(&ndarray)? {
                true => Some(selected.getattr("ndim")?.extract::<usize>()?),
                false => None,
            }
        }
    };
    let Some(ndim) = ndim else {
        // One element: NumPy packs the value into it; the stand-in's element is then the
        // converted value.
        let element = element_memory();
        stand_in(element.clone())?.set_item(key, value)?;
        return zero_strided(PyTuple::empty(py).into_any(), element);
    };
    let kwargs = PyDict::new(py);
    kwargs.set_item("dtype", descr)?;
    let converted = np.call_method("asarray", (value,), Some(&kwargs))?;
    if converted.getattr("ndim")?.extract::<usize>()? > ndim && !value.is_instance(&ndarray)? {
        // A sequence deeper than the selection: NumPy converts one for a view to at most the
        // view's dimensions (deeper, it raises while it finds the value's shape, converting no
        // element), for a fancy index or a mask without that limit, as `asarray` did (an
        // array's leading dimensions of 1 are dropped in both). Its own verdict, on the value
        // itself: for a list or a tuple, on the same nesting of the converted elements, which
        // NumPy judges alike and whose conversion runs no user code (the value itself was
        // converted a second time, its elements' `__float__` run twice where NumPy runs them
        // once, before the twentieth pass). Any other sequence or array-like is judged itself
        // (an array-like's leading dimensions of 1 are dropped as an array's are).
        let nested =
            value.is_exact_instance_of::<pyo3::types::PyList>() || value.is_exact_instance_of::<PyTuple>();
        let same = if nested { converted.call_method0("tolist")? } else { value.clone() };
        stand_in(element_memory())?.set_item(key, &same)?;
    }
    stand_in(element_memory())?.set_item(key, &converted)?;
    Ok(converted)
}

/// Whether `buf[key] = value` is one element given a plain Python number that its conversion
/// to the buffer's dtype takes without an error or a warning (an integer in the dtype's range,
/// a float that neither overflows nor underflows it, a bool), or a NumPy scalar of the
/// buffer's dtype itself: then the assignment cannot fail
/// and [`checked_assignment`] (about three times the cost of such an assignment) is skipped.
/// `key` is an int or a tuple of ints, each in range, one for every dimension
/// ([`integer_selection`]; exact types, so no user code runs).
fn assigns_without_error(this: &UnifiedBuffer, key: &Bound<'_, PyAny>, value: &Bound<'_, PyAny>) -> bool {
    use lazybuf::DType::*;
    if !integer_selection(&this.shape, key).is_some_and(<[usize]>::is_empty) {
        return false;
    }
    let dtype = this.elem.dtype;
    if value.is_exact_instance_of::<pyo3::types::PyBool>() {
        return dtype != BF16;
    }
    if value.is_exact_instance_of::<pyo3::types::PyInt>() {
        let Ok(i) = value.extract::<i64>() else { return false };
        return match dtype {
            U8 => u8::try_from(i).is_ok(),
            U16 => u16::try_from(i).is_ok(),
            U32 => u32::try_from(i).is_ok(),
            U64 => u64::try_from(i).is_ok(),
            I8 => i8::try_from(i).is_ok(),
            I16 => i16::try_from(i).is_ok(),
            I32 => i32::try_from(i).is_ok(),
            I64 | F32 | F64 | C64 | C128 => true,
            F16 => i.unsigned_abs() <= 65504,
            BF16 => false,
        };
    }
    if value.is_exact_instance_of::<pyo3::types::PyFloat>() {
        let Ok(x) = value.extract::<f64>() else { return false };
        // No overflow nor underflow (NumPy warns of both, and raises under `np.seterr`).
        let fits = |smallest_normal: f64, largest: f64| {
            x == 0.0 || !x.is_finite() || (smallest_normal..=largest).contains(&x.abs())
        };
        return match dtype {
            F64 | C128 => true,
            F32 | C64 => fits(f64::from(f32::MIN_POSITIVE), f64::from(f32::MAX)),
            F16 => fits(6.103_515_625e-5, 65504.0),
            _ => false,
        };
    }
    // A NumPy scalar of the buffer's own dtype (`buf[i] = other[j]`): nothing to convert.
    value.get_type().is(this.descr(value.py()).typeobj())
}

/// Whether `buf[key] = value` cannot fail for a basic selection given an array that needs no
/// conversion, so that [`checked_assignment`] (about 1.2 µs, most of such an assignment) is
/// skipped: `key` is a slice, or a tuple of ints (each in range) and slices, all of exact
/// types whose fields are exact ints or `None` (no `__index__` to run), and `value` is an
/// exact `numpy.ndarray` of a dtype equivalent to the buffer's whose shape is the selection's.
/// NumPy then copies element for element: no conversion, cast or broadcast that could raise.
fn basic_assigns_without_error(
    this: &UnifiedBuffer,
    key: &Bound<'_, PyAny>,
    value: &Bound<'_, PyAny>,
) -> bool {
    let Ok(array) = value.cast_exact::<PyUntypedArray>() else { return false };
    let py = value.py();
    if !array.dtype().is_equiv_to(this.descr(py)) {
        return false;
    }
    let parts: Vec<Bound<'_, PyAny>> = match key.cast_exact::<PyTuple>() {
        Ok(tuple) => tuple.iter().collect(),
        Err(_) => vec![key.clone()],
    };
    if parts.len() > this.shape.len() {
        return false;
    }
    let mut selected = Vec::with_capacity(this.shape.len());
    for (part, &extent) in parts.iter().zip(&this.shape) {
        let Ok(extent) = isize::try_from(extent) else { return false };
        if part.is_exact_instance_of::<PyInt>() {
            match part.extract::<isize>() {
                Ok(i) if (-extent..extent).contains(&i) => continue,
                _ => return false,
            }
        }
        let Ok(slice) = part.cast_exact::<PySlice>() else { return false };
        let plain = |field: &Bound<'_, pyo3::types::PyString>| {
            slice.getattr(field).is_ok_and(|v| v.is_none() || v.is_exact_instance_of::<PyInt>())
        };
        if !(plain(interned!(py, "start")) && plain(interned!(py, "stop")) && plain(interned!(py, "step"))) {
            return false;
        }
        match slice.indices(extent) {
            Ok(indices) => selected.push(indices.slicelength),
            Err(_) => return false, // a step of 0: NumPy's error, from the checked path
        }
    }
    selected.extend(this.shape[parts.len()..].iter());
    array.shape() == selected.as_slice()
}

/// The shape `buf[key]` selects when `key` is an int or a tuple of ints (exactly: no
/// `__index__` to run), each in range of its dimension: the dimensions after them. `None` for
/// any other key (or one out of range: the stand-in raises NumPy's `IndexError` for it).
fn integer_selection<'a>(shape: &'a [usize], key: &Bound<'_, PyAny>) -> Option<&'a [usize]> {
    let in_range = |index: &Bound<'_, PyAny>, extent: usize| {
        index.is_exact_instance_of::<pyo3::types::PyInt>()
            && index.extract::<i64>().is_ok_and(|i| {
                let extent = i64::try_from(extent).unwrap_or(i64::MAX);
                (-extent..extent).contains(&i)
            })
    };
    if let Ok(tuple) = key.cast_exact::<PyTuple>() {
        let n = tuple.len();
        (n <= shape.len() && tuple.iter().zip(shape).all(|(index, &extent)| in_range(&index, extent)))
            .then(|| &shape[n..])
    } else {
        (!shape.is_empty() && in_range(key, shape[0])).then(|| &shape[1..])
    }
}

/// Whether a NumPy array is writable now (a host view is made read-only when its copy goes
/// stale or its memory is given up).
fn is_writeable(array: &Bound<'_, PyAny>) -> PyResult<bool> {
    let py = array.py();
    array.getattr(interned!(py, "flags"))?.getattr(interned!(py, "writeable"))?.is_truthy()
}

/// `storage`, the memory `buf[key] = value` wrote through `.host` while NumPy converted the
/// key or the value, if it is still the buffer's: else a `ValueError` (a `free()` meanwhile:
/// the values landed in memory the buffer gave up) or the released error.
fn kept_memory<'a>(this: &UnifiedBuffer, storage: &'a Arc<Storage>) -> PyResult<&'a Arc<Storage>> {
    let current = this.storage_unordered()?;
    if !Arc::ptr_eq(storage, &current) {
        return Err(PyValueError::new_err(
            "buf[key] = value: the buffer's memory was freed while NumPy converted the key or \
             the value (code the conversion ran, or another thread, called free()), so the \
             assigned values were not kept; convert them before assigning",
        ));
    }
    Ok(storage)
}
