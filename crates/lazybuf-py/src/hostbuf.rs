//! Host buffers handed to memory objects (`copy_from_host`, `copy_to_host`, `to_device`):
//! RMM's and dpctl's rules, checked before any byte moves.
//!
//! A source or destination is any object with the buffer protocol whose memory is one
//! contiguous run of bytes: 1-d, format `B` (unsigned bytes, as `bytes`, `bytearray`,
//! `memoryview` of bytes and `numpy.uint8` arrays are), stride 1. Anything without the buffer
//! protocol raises `TypeError`; a buffer of another format (`uint16`), of more dimensions, or
//! with gaps raises `ValueError`, as does a read-only destination. Each message says what was
//! expected.
//!
//! Host memory sized by the user (a temporary copy, a new array or `bytes` object for the
//! result) is allocated fallibly: [`staged`] and [`new_array`] (and `bytes` results, made with
//! `PyBytes::new_with` by their callers) raise `MemoryError` where the host has no memory left,
//! never abort the process.
//!
//! What does not live here: device sources (`crate::foreign`).

use std::ffi::CStr;
use std::ptr::NonNull;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;

use crate::args::repr;

/// An acquired buffer-protocol export; released (with the GIL) when dropped.
pub(crate) struct HostBuffer {
    view: NonNull<ffi::Py_buffer>,
}

// SAFETY: the export's memory is plain bytes that stay valid until the release, which
// re-attaches to the interpreter; reads and writes of them need no thread affinity.
unsafe impl Send for HostBuffer {}
// SAFETY: see Send; a shared HostBuffer only hands out the address and length.
unsafe impl Sync for HostBuffer {}

impl HostBuffer {
    /// Acquires `obj`'s bytes for reading (`writable` false) or writing, and checks them.
    /// `what` names the argument in messages (`"copy_from_host: obj"`).
    pub(crate) fn get(obj: &Bound<'_, PyAny>, writable: bool, what: &str) -> PyResult<HostBuffer> {
        let py = obj.py();
        let mut flags = ffi::PyBUF_STRIDES | ffi::PyBUF_FORMAT;
        if writable {
            flags |= ffi::PyBUF_WRITABLE;
        }
        let view: Box<std::mem::MaybeUninit<ffi::Py_buffer>> = Box::new_uninit();
        let raw = Box::into_raw(view).cast::<ffi::Py_buffer>();
        // SAFETY: raw points to writable, uninitialized storage for one Py_buffer; on failure
        // the export is not filled and must not be released.
        let status = unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), raw, flags) };
        if status < 0 {
            // SAFETY: raw came from Box::into_raw above and was not filled.
            drop(unsafe { Box::from_raw(raw.cast::<std::mem::MaybeUninit<ffi::Py_buffer>>()) });
            let err = PyErr::fetch(py);
            // SAFETY: obj is a live object; the check only reads its type.
            let supports = unsafe { ffi::PyObject_CheckBuffer(obj.as_ptr()) } != 0;
            if writable && supports {
                return Err(PyValueError::new_err(format!(
                    "{what} must be a writable buffer of bytes, got the read-only {} ({err})",
                    type_name(obj)
                )));
            }
            if supports {
                return Err(PyValueError::new_err(format!("{what}: {err}")));
            }
            return Err(PyTypeError::new_err(format!(
                "{what} must support the buffer protocol (bytes, bytearray, memoryview, a uint8 \
                 numpy array), got {}",
                repr(obj)
            )));
        }
        // SAFETY: filled by a successful PyObject_GetBuffer; released in Drop.
        let buffer = HostBuffer { view: unsafe { NonNull::new_unchecked(raw) } };
        buffer.check(obj, what)?;
        Ok(buffer)
    }

    fn view(&self) -> &ffi::Py_buffer {
        // SAFETY: the view was filled by PyObject_GetBuffer and lives until Drop.
        unsafe { self.view.as_ref() }
    }

    fn check(&self, obj: &Bound<'_, PyAny>, what: &str) -> PyResult<()> {
        let view = self.view();
        let format = if view.format.is_null() {
            "B".to_string()
        } else {
            // SAFETY: a non-null format is a NUL-terminated string owned by the export.
            unsafe { CStr::from_ptr(view.format) }.to_string_lossy().into_owned()
        };
        let bytes = matches!(format.trim_start_matches(['@', '=', '<', '>', '!']), "B") && view.itemsize == 1;
        if !bytes {
            return Err(PyValueError::new_err(format!(
                "{what} must be a buffer of unsigned bytes (format 'B', e.g. a uint8 array), got \
                 format {format:?} with itemsize {} ({})",
                view.itemsize,
                type_name(obj)
            )));
        }
        if view.ndim != 1 {
            return Err(PyValueError::new_err(format!(
                "{what} must be a 1-d buffer of bytes, got {} dimensions ({})",
                view.ndim,
                type_name(obj)
            )));
        }
        // SAFETY: with PyBUF_STRIDES a 1-d export fills shape[0] and strides[0] (or leaves
        // strides null for contiguous memory); suboffsets are null unless requested.
        let (len, stride) = unsafe { (*view.shape, if view.strides.is_null() { 1 } else { *view.strides }) };
        if len > 1 && stride != 1 {
            return Err(PyValueError::new_err(format!(
                "{what} must be contiguous, got a buffer with stride {stride} ({})",
                type_name(obj)
            )));
        }
        Ok(())
    }

    /// The length in bytes.
    pub(crate) fn len(&self) -> usize {
        usize::try_from(self.view().len).unwrap_or(0)
    }

    /// The addresses the bytes occupy.
    pub(crate) fn range(&self) -> std::ops::Range<usize> {
        let start = self.view().buf as usize;
        start..start + self.len()
    }

    /// Whether the bytes share any address with `memory`'s host addresses (a view of the
    /// memory object itself): such copies go through a temporary copy, never between
    /// overlapping slices.
    pub(crate) fn overlaps(&self, memory: &lazybuf::Memory) -> bool {
        ranges_overlap(memory.host_range(), Some(self.range()))
    }

    /// The bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        let (ptr, len) = (self.view().buf.cast::<u8>(), self.len());
        if ptr.is_null() || len == 0 {
            return &[];
        }
        // SAFETY: the export covers `len` contiguous bytes (checked in `check`) that stay
        // valid until the release; writers other than Python code holding the GIL cannot
        // exist, and the binding only reads them while it holds the export.
        unsafe { std::slice::from_raw_parts(ptr, len) }
    }

    /// The bytes, for writing (an export acquired `writable`).
    #[allow(clippy::mut_from_ref)]
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        let (ptr, len) = (self.view().buf.cast::<u8>(), self.len());
        if ptr.is_null() || len == 0 {
            return &mut [];
        }
        // SAFETY: as in `bytes`; the export was acquired writable (PyObject_GetBuffer refuses
        // read-only objects then), and `&mut self` makes this the binding's only access.
        unsafe { std::slice::from_raw_parts_mut(ptr, len) }
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        let view = self.view.as_ptr();
        // Released with the interpreter attached (a HostBuffer may be dropped in a detached
        // section); after the interpreter has finalized, the memory is gone anyway.
        let _ = Python::try_attach(|_| {
            // SAFETY: the view was filled by PyObject_GetBuffer and is released once.
            unsafe { ffi::PyBuffer_Release(view) };
        });
        // SAFETY: the box came from Box::into_raw in `get`; nothing points into it any more.
        drop(unsafe { Box::from_raw(view) });
    }
}

/// Whether two optional address ranges share an address.
pub(crate) fn ranges_overlap(a: Option<std::ops::Range<usize>>, b: Option<std::ops::Range<usize>>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => a.start < b.end && b.start < a.end,
        _ => false,
    }
}

/// A copy of `bytes` in a new vector, allocated fallibly ([`lazybuf::Error::OutOfMemory`]).
pub(crate) fn staged(bytes: &[u8]) -> lazybuf::Result<Vec<u8>> {
    let mut copy = Vec::new();
    copy.try_reserve_exact(bytes.len()).map_err(|_| out_of_memory(bytes.len()))?;
    copy.extend_from_slice(bytes);
    Ok(copy)
}

fn out_of_memory(requested: usize) -> lazybuf::Error {
    lazybuf::Error::OutOfMemory { device: "host".into(), requested, code: None }
}

/// A new uint8 NumPy array of `n` bytes with unspecified contents (`numpy.empty`: NumPy's
/// `MemoryError` when the host cannot allocate it).
pub(crate) fn new_array<'py>(py: Python<'py>, n: usize) -> PyResult<Bound<'py, PyAny>> {
    py.import("numpy")?.call_method1("empty", (n, "uint8"))
}

/// Copies host bytes into the first bytes of `memory`, through a temporary copy when they
/// are a view of that memory.
pub(crate) fn copy_in(memory: &mut lazybuf::Memory, host: &HostBuffer) -> lazybuf::Result<()> {
    if host.overlaps(memory) {
        let staged = staged(host.bytes())?;
        return memory.copy_from_host(&staged);
    }
    memory.copy_from_host(host.bytes())
}

/// Copies the first `n` bytes of `memory` into `host`, through a temporary copy when `host`
/// is a view of that memory.
pub(crate) fn copy_out(memory: &lazybuf::Memory, host: &mut HostBuffer, n: usize) -> lazybuf::Result<()> {
    if host.overlaps(memory) {
        let mut staged = Vec::new();
        staged.try_reserve_exact(n).map_err(|_| out_of_memory(n))?;
        staged.resize(n, 0);
        memory.copy_to_host(&mut staged)?;
        host.bytes_mut()[..n].copy_from_slice(&staged);
        return Ok(());
    }
    memory.copy_to_host(&mut host.bytes_mut()[..n])
}

/// Copies the first `n` bytes of `src` into `dst`, through a host copy when the two share host
/// addresses (foreign memory that is a view of `dst`).
pub(crate) fn copy_between(
    dst: &mut lazybuf::Memory,
    src: &lazybuf::Memory,
    n: usize,
) -> lazybuf::Result<()> {
    if ranges_overlap(dst.host_range(), src.host_range()) {
        let staged = src.to_vec()?;
        return dst.copy_from_host(&staged[..n]);
    }
    dst.copy_prefix_from(src, n)
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "object".into())
}
