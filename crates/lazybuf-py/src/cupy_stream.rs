//! CuPy's current stream, the one stream of CuPy's that lazybuf orders itself with (both
//! ways: after the kernels CuPy enqueued there, and that stream after lazybuf's uploads).
//!
//! What does not live here: the orderings themselves ([`crate::streams`], and the drop of a
//! CuPy array's owner in [`crate::views`]).

use crate::gil_cell::GilOnceCell;
use pyo3::prelude::*;

use lazybuf::Device;

/// CuPy's current stream for `home` (`cupy.cuda.get_current_stream(device_id).ptr`; 0 for the
/// legacy default stream); `None` for a device that is not a CUDA device with an ordinal.
pub(crate) fn current_stream(py: Python<'_>, home: &Device) -> PyResult<Option<usize>> {
    /// `cupy.cuda.get_current_stream` (Python-visible in every CuPy since 9; it takes the
    /// device since 11), looked up once.
    static CURRENT_STREAM: GilOnceCell<Py<PyAny>> = GilOnceCell::new();
    // CuPy's streams belong to CUDA devices (the ones with an ordinal).
    let Some(ordinal) = home.info().ordinal else {
        return Ok(None);
    };
    let current_stream = CURRENT_STREAM
        .get_or_try_init(py, || py.import("cupy.cuda")?.getattr("get_current_stream").map(Bound::unbind))?;
    Ok(Some(current_stream.bind(py).call1((ordinal,))?.getattr("ptr")?.extract()?))
}
