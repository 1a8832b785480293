//! Streams between lazybuf and the caller's libraries: `UnifiedBuffer.stream` hands out the
//! queue or stream lazybuf enqueues the buffer's copies on, and `UnifiedBuffer.order_after(s)`
//! orders lazybuf's next work on the buffer's device copy after what the caller enqueued on
//! `s` so far (a marker of `s`, given to the core's `RawBuffer::used_until`).
//!
//! Accepted streams: a PyOpenCL `CommandQueue` (`int_ptr`), a CuPy `Stream` (`ptr`), any
//! object with the CUDA Python `__cuda_stream__` protocol, or a raw `cl_command_queue` /
//! `CUstream` as an int. A raw handle must be a live queue or stream of the buffer's device
//! (as with CuPy's `ExternalStream`); an OpenCL queue of another context is refused.
//!
//! CuPy without a call: once a CuPy array over a buffer's device copy was handed out, every
//! call on the buffer first orders lazybuf after the work enqueued so far on CuPy's *current*
//! stream for that device ([`order_after_cupy`]) when the call may enqueue work on the device
//! copy (a call that finds every copy it needs current does not); kernels on CuPy's default (legacy) stream
//! need nothing, as lazybuf's default CUDA stream is a blocking one. Work enqueued on a CuPy
//! stream that is no longer current when lazybuf is next called still needs `order_after`.
//!
//! What does not live here: the ordering itself (the core's copies wait for the marker) and
//! transfers in flight ([`crate::transfer`]).

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt, PyTuple};

use lazybuf::{Device, MemoryKind, Ticket};

use crate::errors::OrPyErr;
use crate::lock;
use crate::views::{Storage, device_handles};

/// The raw handle of the stream lazybuf uses for this buffer, as an int: its
/// `cl_command_queue` on OpenCL, its `CUstream` on CUDA, 0 on the host (whose work is done
/// when each call returns) and on wgpu (whose one queue has no handle to give).
pub(crate) fn raw_stream(py: Python<'_>, storage: &Storage) -> PyResult<usize> {
    let raw = storage.lock(py)?;
    // SAFETY: the handle is only turned into an int for the caller, who may use it while the
    // buffer's device is open (lazybuf keeps its own streams alive as long as the device).
    Ok(unsafe { raw.stream().raw() }.as_int())
}

/// Which runtime's stream an object passed to `order_after` is, by the protocol it speaks.
#[derive(Clone, Copy, PartialEq)]
enum Speaks {
    /// `__cuda_stream__`, or a CuPy `Stream` (`ptr`): a `CUstream`.
    Cuda,
    /// A PyOpenCL `CommandQueue` (`int_ptr`): a `cl_command_queue`.
    OpenCl,
    /// A raw handle (an int): trusted to be one of the device's own (module docs).
    Raw,
}

/// The raw handle of a stream object the caller passed (see the module docs), and the protocol
/// it came through.
fn handle_of(stream: &Bound<'_, PyAny>) -> PyResult<(usize, Speaks)> {
    let expected = "expected a stream: a PyOpenCL CommandQueue, a CuPy Stream, an object with \
                    __cuda_stream__, or a raw cl_command_queue / CUstream handle as an int";
    if stream.is_instance_of::<PyBool>() {
        return Err(PyTypeError::new_err(format!("order_after: {expected}; got a bool")));
    }
    let (value, speaks) = if stream.is_instance_of::<PyInt>() {
        (stream.clone(), Speaks::Raw)
    } else if stream.hasattr("__cuda_stream__")? {
        let pair = stream.call_method0("__cuda_stream__")?;
        let pair = pair.cast::<PyTuple>().map_err(|_| {
            PyTypeError::new_err("order_after: __cuda_stream__() must return (version, handle)")
        })?;
        (pair.get_item(1)?, Speaks::Cuda)
    } else if stream.hasattr("int_ptr")? {
        (stream.getattr("int_ptr")?, Speaks::OpenCl)
    } else if stream.hasattr("ptr")? {
        (stream.getattr("ptr")?, Speaks::Cuda)
    } else if let Ok(index) = stream.call_method0("__index__") {
        // A NumPy integer: a raw handle, as an int is.
        (index, Speaks::Raw)
    } else {
        return Err(PyTypeError::new_err(format!(
            "order_after: {expected}; got {}",
            stream.get_type().name()?
        )));
    };
    let handle = value.extract::<usize>().map_err(|_| {
        PyValueError::new_err(format!("order_after: a stream handle is a non-negative int; got {value}"))
    })?;
    Ok((handle, speaks))
}

/// Refuses a stream object of another runtime than `home`'s: its handle would be used as one
/// of `home`'s (a hostile pass, 2026-11-27: a CUDA stream given for an OpenCL buffer crashed
/// the interpreter). Raw ints stay trusted, as documented.
fn check_runtime(stream: &Bound<'_, PyAny>, speaks: Speaks, home: &Device) -> PyResult<()> {
    let cuda = home.info().dlpack_device(MemoryKind::Device).is_some_and(|d| d.is_cuda());
    let what = || stream.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "the object".into());
    match speaks {
        Speaks::Cuda if !cuda => Err(PyTypeError::new_err(format!(
            "order_after: {} is a CUDA stream, and this buffer's device {home} is not a CUDA device: \
             expected one of its own queues",
            what()
        ))),
        Speaks::OpenCl if cuda => Err(PyTypeError::new_err(format!(
            "order_after: {} is an OpenCL queue (PyOpenCL), and this buffer's device {home} is a CUDA \
             device: expected a CUDA stream",
            what()
        ))),
        _ => Ok(()),
    }
}

/// Orders lazybuf's next work on `home`'s copy of the buffer (transfers into or out of it,
/// fills, its release) after the work enqueued on `stream` so far. Nothing to do on the host
/// device, whose work is done when each call returns.
pub(crate) fn order_after(
    py: Python<'_>,
    storage: &Storage,
    home: &Device,
    stream: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let (handle, speaks) = handle_of(stream)?;
    let raw = device_handles(home)
        .stream_from_int(handle)
        .ok_or_else(|| PyValueError::new_err(format!("order_after: streams of {home} are not supported")))?;
    if raw.is_immediate() {
        return Ok(());
    }
    check_runtime(stream, speaks, home)?;
    order_after_handle(py, storage, home, handle)
}

/// Orders lazybuf's next work on `home`'s copy after the work enqueued so far on the raw
/// stream `handle` of `home`'s runtime.
fn order_after_handle(py: Python<'_>, storage: &Storage, home: &Device, handle: usize) -> PyResult<()> {
    lock::detach(py, |d| {
        let raw = device_handles(home)
            .stream_from_int(handle)
            .ok_or_else(|| PyValueError::new_err(format!("streams of {home} have no integer handle")))?;
        // SAFETY: the handle is a live queue or stream of this device's context, as the caller
        // promises (module docs); OpenCL checks the queue's context and refuses another one.
        let wrapped = unsafe { home.wrap_stream(raw) }.or_py()?;
        let ticket = wrapped.marker().or_py()?;
        storage.lock_detached(d)?.used_until(home, ticket);
        Ok(())
    })
}

/// For a buffer whose device copy CuPy holds: orders lazybuf after CuPy's current stream for
/// the buffer's device (`cupy.cuda.get_current_stream(device_id).ptr`), unless that is the
/// legacy default stream (handle 0), which lazybuf's blocking default stream is ordered with
/// already. Costs one call into CuPy; an event and a stream wait only for another stream.
pub(crate) fn order_after_cupy(py: Python<'_>, storage: &Storage, home: &Device) -> PyResult<()> {
    let Some(handle) = crate::cupy_stream::current_stream(py, home)? else {
        return Ok(());
    };
    if handle == 0 {
        return Ok(());
    }
    order_after_handle(py, storage, home, handle)
}

/// The other direction: makes CuPy's current stream for `home` wait for `ticket` (an upload
/// the array handed to CuPy depends on) on the device, without a host wait
/// (`cuStreamWaitEvent`; on the legacy default stream too, which a buffer's own stream may not
/// be ordered with). Where there is no CuPy stream to order, waits on the host.
pub(crate) fn order_cupy_after_ticket(py: Python<'_>, home: &Device, ticket: &Ticket) -> PyResult<()> {
    match crate::views::cupy_current_stream(py, home)? {
        Some((_, stream)) => stream.wait_for(ticket).or_py(),
        None => lock::detach(py, |_| ticket.wait().or_py()),
    }
}
