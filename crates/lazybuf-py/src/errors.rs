//! The one place where lazybuf's errors become Python exceptions.
//!
//! The mapping follows what NumPy users expect: bad shapes, lengths and arguments raise
//! `ValueError`, bad element types `TypeError`, memory exhaustion `MemoryError`, and runtime
//! failures `RuntimeError` (with `BackendUnavailableError`, a `RuntimeError` subclass, for a
//! runtime that is not installed or has no device, `CUDARuntimeError` for a failed CUDA driver
//! call). The message is always lazybuf's own, which
//! names what was expected. A coherence-check failure ([`lazybuf::Error::Coherence`]) raises
//! `CoherenceError`, a `RuntimeError` subclass whose message names `mark_device_dirty()` and
//! `.device_writable`; [`set_checking`] and [`checking`] are the checker's switch in Python.
//! A device used in a forked child that its runtime does not survive
//! ([`lazybuf::Error::ForkedChild`]) raises `ForkedChildError` (a `RuntimeError`) naming the
//! device and the `spawn`
//! start method, as PyTorch and CuPy do for CUDA. A copy the transfer guard refused
//! ([`lazybuf::Error::TransferGuard`]) raises `TransferGuardError` (a `RuntimeError`) with the
//! buffer's id, the direction, the bytes and the call.
//!
//! lazybuf's exception classes are defined in Python (`python/lazybuf/exceptions.py`), where
//! they also derive from PyDotCompute's classes (`BackendUnavailableError` is a
//! `BackendNotAvailableError`, `CUDARuntimeError` a `CUDAError`, ...); this module raises them
//! by importing them from there, lazily: an error made without the GIL (inside a copy) looks
//! its class up only when Python sees it.
//!
//! What does not live here: validation itself (the core validates; [`crate::args`] and
//! [`crate::dtype`] validate Python arguments before they reach it).

use pyo3::exceptions::{PyMemoryError, PyOSError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::{PyErr, PyResult};

/// Declares lazybuf's exception classes (`import_exception!`) and [`make_ready`], which makes
/// each class's cell when the extension is imported: `import_exception!`'s cell is PyO3's
/// kind, which a fork while another thread makes it leaves waiting forever in the child
/// ([`crate::gil_cell`]). A class declared here is made at import without another line.
macro_rules! imported_exceptions {
    ($($name:ident,)*) => {
        mod imported {
            $( pyo3::import_exception!(lazybuf.exceptions, $name); )*
        }
        pub(crate) use imported::{$($name),*};

        /// Makes every exception class's cell; the extension's first step at import.
        pub(crate) fn make_ready(py: Python<'_>) {
            $( let _ = py.get_type::<$name>(); )*
        }
    };
}

imported_exceptions! {
// A backend (Metal, CUDA, OpenCL) is not installed, not compiled in, or has no device:
// `BackendUnavailableError(message, backend_name, reason)`, a RuntimeError.
BackendUnavailableError,
// Metal is not available (no wgpu device on Metal): a BackendUnavailableError and a MetalError.
MetalUnavailableError,
// A failed CUDA driver call: a RuntimeError and a CUDAError.
CUDARuntimeError,
// The coherence checker found a device copy written without mark_device_dirty(): a
// RuntimeError.
CoherenceError,
// An object used from inside an operation on it, on the thread performing it (a failure
// callback, a finalizer it ran): a RuntimeError. Raised by [`crate::lock`].
ReentrancyError,
// A device of a runtime that does not survive fork, used in a forked child: a RuntimeError.
ForkedChildError,
// The transfer guard refused a copy: `TransferGuardError(message, buffer_id, direction, nbytes,
// call)`, a RuntimeError.
TransferGuardError,
}

/// Turns the coherence checker on or off for the whole process. While on, a host read of a
/// SYNCHRONIZED buffer whose device copy was handed out by `.device` since it was last filled
/// compares the device copy with the host's (one device-to-host copy and a compare) and raises
/// `CoherenceError` when they differ: a kernel wrote `.device` without `mark_device_dirty()`.
/// Off by default; `LAZYBUF_CHECK=1` in the environment turns it on at start.
#[pyfunction]
pub(crate) fn set_checking(on: bool) {
    lazybuf::set_checking(on);
}

/// Whether the coherence checker is on (see `set_checking`).
#[pyfunction]
pub(crate) fn checking() -> bool {
    lazybuf::checking()
}

/// Converts a lazybuf error into the Python exception users expect.
pub(crate) fn to_py(err: lazybuf::Error) -> PyErr {
    let message = err.to_string();
    to_py_with(err, message)
}

/// [`to_py`] with the message given: a failed eviction's write-back raises what its own error
/// raises, with the whole message (which names the evicted buffer).
fn to_py_with(err: lazybuf::Error, message: String) -> PyErr {
    use lazybuf::Error as E;
    match err {
        E::WriteBack { source, .. } => to_py_with(std::sync::Arc::unwrap_or_clone(source), message),
        E::InvalidShape { .. } | E::LengthMismatch { .. } | E::InvalidArgument { .. } => {
            PyValueError::new_err(message)
        }
        E::DeviceNotFound { .. } => PyValueError::new_err(message),
        E::OutOfMemory { .. } | E::PinningFailed { .. } => PyMemoryError::new_err(message),
        E::BackendUnavailable { backend, reason } => {
            BackendUnavailableError::new_err((message, backend.name(), reason))
        }
        E::Runtime { backend, .. } if backend.name() == "cuda" => CUDARuntimeError::new_err(message),
        E::Runtime { .. } => PyRuntimeError::new_err(message),
        E::Coherence { .. } => CoherenceError::new_err(message),
        // A spill file could not be written or read back: OSError, with the
        // system's errno where there was one (`FileNotFoundError` for a missing file).
        E::Io { code: Some(lazybuf::RuntimeCode::Os(errno)), .. } => PyOSError::new_err((errno, message)),
        E::Io { .. } => PyOSError::new_err(message),
        // A device of a runtime that does not survive fork, used in a forked child: the
        // message names the device and says to use the 'spawn' start method.
        E::ForkedChild { .. } => ForkedChildError::new_err(message),
        // The transfer guard refused a copy (nothing changed): buffer, direction, bytes, call.
        E::TransferGuard { buffer, direction, bytes, call, .. } => {
            TransferGuardError::new_err((message, buffer, direction.name(), bytes, call))
        }
        // A Python callback's own exception (a memory resource's failure callback), as raised.
        E::Callback { payload, .. } => match payload.0.downcast_ref::<PyErr>() {
            Some(err) => Python::attach(|py| err.clone_ref(py)),
            None => PyRuntimeError::new_err(message),
        },
        _ => PyRuntimeError::new_err(message),
    }
}

/// `?`-friendly conversion of core results.
pub(crate) trait OrPyErr<T> {
    /// Maps the error with [`to_py`].
    fn or_py(self) -> PyResult<T>;
}

impl<T> OrPyErr<T> for lazybuf::Result<T> {
    fn or_py(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}

/// The error for any use of a buffer after it was released.
pub(crate) fn released() -> PyErr {
    PyValueError::new_err(
        "this UnifiedBuffer was released (to its memory pool, or by leaving its `with` block); \
         expected a live buffer: acquire or create a new one",
    )
}

/// The error for an element type lazybuf cannot hold.
pub(crate) fn bad_dtype(detail: impl std::fmt::Display) -> PyErr {
    PyTypeError::new_err(format!(
        "unsupported dtype: {detail}; expected one of float16, float32, float64, int8, int16, \
         int32, int64, uint8, uint16, uint32, uint64, complex64, complex128 (native byte order), \
         or bfloat16 with the ml_dtypes package installed"
    ))
}
