//! OpenCL devices through `cl3`, the thin `Result`-returning layer over the OpenCL C API
//! (libOpenCL is loaded at run time, so a machine without it only reports OpenCL absent).
//! lazybuf owns every handle itself rather than through `opencl3`'s wrappers, whose `Drop`
//! impls panic on a failed release.
//!
//! Each device gets its own context and one in-order command queue, its default stream; more
//! streams are more in-order queues on the same context. Every operation is enqueued without
//! blocking and flushed (so it starts, and can overlap the host's work), and returns a ticket
//! over its `cl_event`. User kernels enqueued on a stream's queue (see [`crate::Device::raw`])
//! are ordered with lazybuf's copies on it.
//!
//! On a device that shares host memory (a CPU device such as PoCL, an integrated GPU), large
//! buffers alias the host block (`CL_MEM_USE_HOST_PTR`) and sync by map/unmap instead of
//! copying; small ones copy, which is cheaper than a map there (docs/BENCHMARKS.md).
//!
//! Here: probing and opening, the OpenCL status codes lazybuf names, and the registration.
//! The [`crate::backend::Runtime`] impl is in `device.rs`; buffers, queues and events
//! in `memory.rs`.

mod device;
mod memory;

pub use device::{ALIAS_MIN_BYTES, OpenClBackend, OpenClOptions};
pub use memory::{OpenClEvent, OpenClMemory, OpenClStream};

use std::sync::Arc;

use crate::backend::{Backend, Registration, Ticket};
use crate::error::{BackendKind, Error, Result, RuntimeCode};

impl BackendKind {
    /// OpenCL devices (`cl3`, libOpenCL loaded at run time).
    pub const OPENCL: BackendKind = BackendKind::new("opencl", "OpenCL");
}

/// How discovery finds OpenCL devices.
pub const REGISTRATION: Registration = Registration { kind: BackendKind::OPENCL, open_all };

/// Opens every device of every OpenCL platform.
pub fn open_all() -> Result<Vec<Arc<dyn Backend>>> {
    if !cl3::is_opencl_runtime_available() {
        return Err(Error::BackendUnavailable {
            backend: BackendKind::OPENCL,
            reason: "libOpenCL could not be loaded (install an ICD loader and a driver, e.g. \
                     Debian's ocl-icd-libopencl1 and pocl-opencl-icd)"
                .into(),
        });
    }
    let platforms = cl3::platform::get_platform_ids().map_err(|status| Error::BackendUnavailable {
        backend: BackendKind::OPENCL,
        reason: format!("no OpenCL platform ({})", code(status)),
    })?;
    let mut devices: Vec<Arc<dyn Backend>> = Vec::new();
    for platform in platforms {
        // A platform without devices answers CL_DEVICE_NOT_FOUND: skip it.
        let Ok(ids) = cl3::device::get_device_ids(platform, cl3::device::CL_DEVICE_TYPE_ALL) else {
            continue;
        };
        for id in ids {
            // SAFETY: `id` was just returned by clGetDeviceIDs for a loaded platform.
            let backend = unsafe { OpenClBackend::open(id) }?;
            devices.push(crate::backend::checked::open(backend));
        }
    }
    Ok(devices)
}

/// A ticket over an OpenCL event of `context` (a user event, an event of the caller's own
/// queue): lazybuf's streams can wait for it ([`crate::Stream::wait_for`]). `None` for a null
/// event.
///
/// # Safety
/// `event` is a live event of `context`; the ticket takes over one reference to it (retain
/// the event first to keep using it yourself).
pub unsafe fn ticket_from_event(
    event: cl3::types::cl_event,
    context: cl3::types::cl_context,
) -> Option<Ticket> {
    OpenClEvent::owning(event, context).map(|event| Ticket::new(event))
}

/// An OpenCL status as lazybuf reports it: its name, and whether freeing memory can help.
pub fn code(status: i32) -> RuntimeCode {
    let (name, retryable) = match status {
        -1 => ("CL_DEVICE_NOT_FOUND", false),
        -2 => ("CL_DEVICE_NOT_AVAILABLE", false),
        -4 => ("CL_MEM_OBJECT_ALLOCATION_FAILURE", true),
        -5 => ("CL_OUT_OF_RESOURCES", true),
        -6 => ("CL_OUT_OF_HOST_MEMORY", true),
        -14 => ("CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST", false),
        -30 => ("CL_INVALID_VALUE", false),
        -34 => ("CL_INVALID_CONTEXT", false),
        -36 => ("CL_INVALID_COMMAND_QUEUE", false),
        -38 => ("CL_INVALID_MEM_OBJECT", false),
        -58 => ("CL_INVALID_EVENT", false),
        -61 => ("CL_INVALID_BUFFER_SIZE", false),
        -1001 => ("CL_PLATFORM_NOT_FOUND_KHR", false),
        _ => ("see the OpenCL headers", false),
    };
    RuntimeCode::Device { backend: BackendKind::OPENCL, value: status.into(), name, retryable }
}

/// Whether an allocation that failed with `status` ran out of memory.
fn is_out_of_memory(status: i32) -> bool {
    matches!(status, -4 | -5 | -6 | -61)
}

/// Maps an OpenCL status from `call` to lazybuf's error.
pub(crate) fn cl_error(call: &'static str, status: i32) -> Error {
    Error::Runtime { backend: BackendKind::OPENCL, call, code: code(status) }
}
