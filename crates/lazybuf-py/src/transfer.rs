//! `lazybuf.Transfer`: an asynchronous sync in flight, awaitable from asyncio.
//!
//! `UnifiedBuffer.sync_to_device_async()` and `sync_to_host_async()` enqueue the copies on the
//! buffer's stream and return at once with a `Transfer` (the core's [`lazybuf::Transfer`]).
//! It can be polled (`is_complete()`), waited on (`wait()`, which lets other Python threads
//! run meanwhile) or awaited: `await buf.sync_to_device_async()` waits on a worker thread of
//! the running event loop's default executor, so the loop keeps serving other tasks.
//!
//! While a transfer is in flight the buffer reports the state it will have when it completes;
//! a later call that needs the memory the transfer uses waits for it first, and a failed
//! transfer puts the buffer back as it was (see docs/CONTRACT.md, "Completion").
//!
//! What does not live here: starting the transfer (the core's `RawBuffer::sync_async`, called
//! by [`start`]) and the buffer's methods ([`crate::buffer`]).

use pyo3::prelude::*;

use lazybuf::Device;

use crate::errors::OrPyErr;
use crate::lock;
use crate::views::Storage;

/// An asynchronous sync in flight (see the module docs).
#[pyclass(name = "Transfer", module = "lazybuf", frozen)]
pub(crate) struct PyTransfer {
    transfer: lazybuf::Transfer,
}

/// Enqueues the copies that make `device`'s copy (the host's when `None`) current and returns
/// at once; nothing is copied when that copy is current already.
pub(crate) fn start(py: Python<'_>, storage: &Storage, device: Option<&Device>) -> PyResult<PyTransfer> {
    let transfer = lock::detach(py, |d| storage.lock_detached(d)?.sync_async(device).or_py())?;
    Ok(PyTransfer { transfer })
}

#[pymethods]
impl PyTransfer {
    /// Blocks until the copies are done (other Python threads run meanwhile); raises the
    /// transfer's error if it failed, after which the buffer's state is as it was before (the
    /// memory the transfer took once the buffer's next call settles the failure: the class
    /// doc).
    fn wait(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.transfer.wait()).or_py()
    }

    /// Whether the copies are done; raises the transfer's error if it failed.
    fn is_complete(&self) -> PyResult<bool> {
        self.transfer.is_complete().or_py()
    }

    /// `await transfer`: waits on a thread of the running loop's default executor, so the
    /// event loop is never blocked. A transfer already complete resolves at once.
    fn __await__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let event_loop = py.import("asyncio")?.call_method0("get_running_loop")?;
        let future = if slf.get().transfer.is_complete().or_py()? {
            let future = event_loop.call_method0("create_future")?;
            future.call_method1("set_result", (py.None(),))?;
            future
        } else {
            event_loop.call_method1("run_in_executor", (py.None(), slf.getattr("wait")?))?
        };
        future.call_method0("__await__")
    }

    fn __repr__(&self) -> String {
        let state = match self.transfer.is_complete() {
            Ok(true) => "complete",
            Ok(false) => "in flight",
            Err(_) => "failed",
        };
        format!("<lazybuf.Transfer {state}>")
    }
}
