//! OpenCL devices through `cl3`, the thin `Result`-returning layer over the OpenCL C API
//! (libOpenCL is loaded at run time, so a machine without it only reports OpenCL absent).
//! lazybuf owns every handle itself rather than through `opencl3`'s wrappers, whose `Drop`
//! impls panic on a failed release.
//!
//! Each device gets its own context and one in-order command queue; every operation waits for
//! its own completion, so user kernels enqueued on that queue (see [`crate::Device::raw`])
//! are ordered with lazybuf's copies.
//!
//! On a device that shares host memory (a CPU device such as PoCL, an integrated GPU), large
//! buffers alias the host block (`CL_MEM_USE_HOST_PTR`) and sync by map/unmap instead of
//! copying; small ones copy, which is cheaper than a map there (docs/BENCHMARKS.md).

mod device;
mod memory;

pub use device::{ALIAS_MIN_BYTES, OpenClBackend, OpenClOptions};
pub use memory::OpenClMemory;

use std::sync::Arc;

use crate::device::Device;
use crate::error::{BackendKind, Error, Result, RuntimeCode};

/// Opens every device of every OpenCL platform.
pub fn open_all() -> Result<Vec<Device>> {
    if !cl3::is_opencl_runtime_available() {
        return Err(Error::BackendUnavailable {
            backend: BackendKind::OpenCl,
            reason: "libOpenCL could not be loaded (install an ICD loader and a driver, e.g. \
                     Debian's ocl-icd-libopencl1 and pocl-opencl-icd)"
                .into(),
        });
    }
    let platforms = cl3::platform::get_platform_ids().map_err(|code| Error::BackendUnavailable {
        backend: BackendKind::OpenCl,
        reason: format!("no OpenCL platform ({})", RuntimeCode::OpenCl(code)),
    })?;
    let mut devices = Vec::new();
    for platform in platforms {
        // A platform without devices answers CL_DEVICE_NOT_FOUND: skip it.
        let Ok(ids) = cl3::device::get_device_ids(platform, cl3::device::CL_DEVICE_TYPE_ALL) else {
            continue;
        };
        for id in ids {
            // SAFETY: `id` was just returned by clGetDeviceIDs for a loaded platform.
            let backend = unsafe { OpenClBackend::open(id) }?;
            devices.push(Device::from_backend(Arc::new(backend)));
        }
    }
    Ok(devices)
}

/// Maps an OpenCL status from `call` to lazybuf's error.
pub(crate) fn cl_error(call: &'static str, code: i32) -> Error {
    Error::Runtime { backend: BackendKind::OpenCl, call, code: RuntimeCode::OpenCl(code) }
}
