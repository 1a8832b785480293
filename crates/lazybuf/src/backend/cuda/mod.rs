//! CUDA devices through `cudarc`'s driver API: its raw `sys` layer and its thin `result`
//! layer, never its `safe` layer (whose slices track events and allocate from stream-ordered
//! pools behind the caller's back). libcuda is loaded at run time, so a binary built with this
//! backend starts on any machine: no driver, a driver without a GPU, or a GPU.
//!
//! Here: opening (the guarded probe, one retained primary context per device, peer access),
//! the `Context` every handle keeps alive and binds to the calling thread only for the
//! length of one operation (`Bound`), the driver's status codes and their mapping to
//! [`crate::Error`], and the registration. The [`crate::backend::Runtime`] impl is in
//! `device.rs`; memory, streams, events and host-page registrations in `memory.rs`; the
//! asynchronous pinned staging pipeline for pageable transfers in `staging.rs`.
//!
//! cudarc panics instead of returning an error when libcuda is missing or lacks a symbol.
//! [`open_all`] therefore asks `is_culib_present()` first, then looks up every entry point
//! the backend will ever call ([`REQUIRED_SYMBOLS`]) before calling any, and runs the whole
//! probe under `catch_unwind` as a last line of defence. After a successful open no call can
//! hit a missing symbol, because each one was found.

mod device;
mod memory;
mod pinned;
mod staging;
#[cfg(test)]
mod tests;

pub use device::{CudaBackend, REGISTER_MIN_BYTES};
pub use memory::{CudaEvent, CudaMemory, CudaStream};
pub use staging::{CHUNK as STAGING_CHUNK, PIPELINE_MIN as STAGING_MIN_BYTES};

use crate::backend::deferred::DeferredErrors;
use std::marker::PhantomData;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::result::{self, DriverError};
use cudarc::driver::sys;

use crate::backend::{Backend, Registration};
use crate::error::{BackendKind, Error, Result, RuntimeCode};

impl BackendKind {
    /// CUDA devices (`cudarc`'s driver API, libcuda loaded at run time).
    pub const CUDA: BackendKind = BackendKind::new("cuda", "CUDA");
}

/// How discovery finds CUDA devices.
pub const REGISTRATION: Registration = Registration { kind: BackendKind::CUDA, open_all };

/// Every driver entry point the backend calls (all exist in drivers for CUDA 11.0 and later;
/// `cuMemPrefetchAsync` is the original entry point, which drivers keep for older binaries).
pub const REQUIRED_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceTotalMem_v2",
    "cuDeviceGetAttribute",
    "cuDeviceCanAccessPeer",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxGetCurrent",
    "cuCtxSetCurrent",
    "cuCtxEnablePeerAccess",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamWaitEvent",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventSynchronize",
    "cuEventDestroy_v2",
    "cuMemAlloc_v2",
    "cuMemAllocManaged",
    "cuMemPrefetchAsync",
    "cuMemFree_v2",
    "cuMemGetInfo_v2",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemHostRegister_v2",
    "cuMemHostUnregister",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyDtoDAsync_v2",
    "cuMemcpyPeerAsync",
    "cuMemsetD8Async",
    "cuMemsetD16Async",
    "cuMemsetD32Async",
    "cuMemsetD2D32Async",
    "cuPointerGetAttribute",
];

/// Opens every CUDA device, or says why CUDA is unavailable. Never panics.
pub fn open_all() -> Result<Vec<Arc<dyn Backend>>> {
    // SAFETY: is_culib_present only tries to dlopen the libcuda candidates and closes them
    // again; it calls no driver function.
    if !unsafe { sys::is_culib_present() } {
        return Err(unavailable("libcuda could not be loaded (no NVIDIA driver is installed)"));
    }
    // cudarc panics on a missing symbol; open_devices checks the symbols first, and this
    // catch_unwind is the last line of defence should cudarc panic anyway. Unwind safety: on
    // a panic nothing the closure touched is used again (half-opened contexts are leaked).
    match std::panic::catch_unwind(AssertUnwindSafe(open_devices)) {
        Ok(opened) => opened,
        Err(payload) => {
            let message = payload
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| payload.downcast_ref::<&str>().copied())
                .unwrap_or("no message");
            Err(unavailable(format!("the CUDA driver could not be used (cudarc panicked: {message})")))
        }
    }
}

fn open_devices() -> Result<Vec<Arc<dyn Backend>>> {
    let missing = missing_symbols();
    if !missing.is_empty() {
        return Err(unavailable(format!(
            "the CUDA driver lacks {} (update the NVIDIA driver)",
            missing.join(", ")
        )));
    }
    result::init().map_err(|err| match err.0 {
        sys::CUresult::CUDA_ERROR_NO_DEVICE => {
            unavailable("a CUDA driver is installed but reports no device (CUDA_ERROR_NO_DEVICE)")
        }
        code => unavailable(format!("cuInit failed: {code:?}")),
    })?;
    let count = result::device::get_count().map_err(|err| cuda_error("cuDeviceGetCount", err))?;
    if count <= 0 {
        return Err(unavailable("the CUDA driver reports no device"));
    }
    let contexts = (0..count).map(Context::retain).collect::<Result<Vec<_>>>()?;
    let mut devices: Vec<Arc<dyn Backend>> = Vec::with_capacity(contexts.len());
    for context in &contexts {
        let peers = contexts.iter().filter(|peer| context.enable_peer_access(peer)).cloned().collect();
        devices.push(crate::backend::checked::open(CudaBackend::open(context.clone(), peers)?));
    }
    Ok(devices)
}

/// The entry points of [`REQUIRED_SYMBOLS`] that the loaded driver lacks.
fn missing_symbols() -> Vec<&'static str> {
    // SAFETY: culib() loads libcuda, which is_culib_present() just found (if it panics after
    // all, open_all catches it); it calls no driver function.
    let lib = unsafe { sys::culib() };
    REQUIRED_SYMBOLS
        .iter()
        .copied()
        // SAFETY: get only looks the name up (dlsym); the symbol is never called through it.
        .filter(|name| unsafe { lib.get::<unsafe extern "C" fn()>(name.as_bytes()) }.is_err())
        .collect()
}

/// A device's retained primary context. Every handle that needs the device (the backend, its
/// memory, pinned host blocks) holds an `Arc`, so the context outlives all of them; the last
/// one releases it.
#[derive(Debug)]
pub(crate) struct Context {
    device: sys::CUdevice,
    ctx: sys::CUcontext,
    /// Whether this is device 0's primary context: the one the CUDA runtime makes current on a
    /// thread that has none, so [`Context::bind`] may leave it current there ([`Context::bind`]).
    runtime_default: bool,
    /// Failures of this context's drop and free paths (a failed `cuMemFree`), not yet taken.
    pub(crate) deferred: DeferredErrors,
    /// Events of tickets that are gone, kept for the next tickets (at most [`SPARE_EVENTS`]):
    /// a copy then records a kept event instead of creating one and destroying it later.
    spare_events: Mutex<Vec<sys::CUevent>>,
}

/// The most events a context keeps for reuse (the rest are destroyed when their ticket goes).
const SPARE_EVENTS: usize = 64;

// SAFETY: the driver API is thread-safe and a context may be made current on any thread
// (CUDA programming guide, "Context"); this value only holds the handle and the device ordinal.
unsafe impl Send for Context {}
// SAFETY: see Send; shared use only makes the context current or passes it to the driver.
unsafe impl Sync for Context {}

impl Context {
    fn retain(ordinal: i32) -> Result<Arc<Context>> {
        let device = result::device::get(ordinal).map_err(|err| cuda_error("cuDeviceGet", err))?;
        // SAFETY: device was returned by cuDeviceGet; the context is released in Drop.
        let ctx = unsafe { result::primary_ctx::retain(device) }
            .map_err(|err| cuda_error("cuDevicePrimaryCtxRetain", err))?;
        Ok(Arc::new(Context {
            device,
            ctx,
            runtime_default: ordinal == 0,
            deferred: DeferredErrors::default(),
            spare_events: Mutex::new(Vec::new()),
        }))
    }

    /// Makes this context current on the calling thread until the guard is dropped: driver
    /// calls act on the current context, and lazybuf's callers may run on any thread. The
    /// guard restores the thread's previous context, so lazybuf never changes which device the
    /// caller's own CUDA code (or the CUDA runtime's current device) refers to.
    ///
    /// One exception saves two driver calls per operation on a thread with no context current
    /// (a plain Rust or NumPy caller): device 0's primary context is left current there, since
    /// it is the very context the CUDA runtime makes current on such a thread at its first
    /// call; the thread's device stays device 0 either way. Every later operation then finds
    /// its context current (one `cuCtxGetCurrent`).
    pub(crate) fn bind(&self) -> Result<Bound<'_>> {
        let previous = result::ctx::get_current().map_err(|err| cuda_error("cuCtxGetCurrent", err))?;
        if previous == Some(self.ctx) {
            return Ok(Bound { restore: None, _context: PhantomData });
        }
        if previous.is_none() && self.runtime_default {
            // SAFETY: ctx is a retained primary context, alive as long as self.
            unsafe { result::ctx::set_current(self.ctx) }
                .map_err(|err| cuda_error("cuCtxSetCurrent", err))?;
            return Ok(Bound { restore: None, _context: PhantomData });
        }
        // SAFETY: ctx is a retained primary context, alive as long as self.
        unsafe { result::ctx::set_current(self.ctx) }.map_err(|err| cuda_error("cuCtxSetCurrent", err))?;
        Ok(Bound { restore: Some(previous.unwrap_or(std::ptr::null_mut())), _context: PhantomData })
    }

    pub(crate) fn raw(&self) -> sys::CUcontext {
        self.ctx
    }

    /// An event of this context for a ticket (timing disabled): a kept one, else a new one.
    /// The context must be current.
    pub(crate) fn take_event(&self) -> Result<sys::CUevent> {
        if let Some(event) = self.spare_events.lock().unwrap_or_else(PoisonError::into_inner).pop() {
            return Ok(event);
        }
        result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
            .map_err(|err| cuda_error("cuEventCreate", err))
    }

    /// Keeps `event`, whose ticket is gone, for a later ticket; `false` when enough are kept
    /// (the caller destroys it). Recording a kept event again is what the driver allows for any
    /// event: the next `cuEventRecord` replaces what it captured, and nothing waits on it any
    /// more (waits already made captured the work they wait for).
    pub(crate) fn keep_event(&self, event: sys::CUevent) -> bool {
        let mut spare = self.spare_events.lock().unwrap_or_else(PoisonError::into_inner);
        if spare.len() >= SPARE_EVENTS {
            return false;
        }
        spare.push(event);
        true
    }

    pub(crate) fn device(&self) -> sys::CUdevice {
        self.device
    }

    /// Whether this context can copy straight from `peer`'s memory: true for itself, and for
    /// another device whose memory the driver lets this one access (peer access is then
    /// enabled here). Any failure means "no": copies then go through the host.
    fn enable_peer_access(&self, peer: &Context) -> bool {
        if peer.device == self.device {
            return true;
        }
        let mut can = 0;
        // SAFETY: both devices come from cuDeviceGet; `can` is a valid out-pointer.
        let asked = unsafe { sys::cuDeviceCanAccessPeer(&mut can, self.device, peer.device) };
        if asked != sys::CUresult::CUDA_SUCCESS || can == 0 {
            return false;
        }
        let Ok(_bound) = self.bind() else { return false };
        // SAFETY: self is current (bound above) and peer.ctx is a retained context.
        let enabled = unsafe { sys::cuCtxEnablePeerAccess(peer.ctx, 0) };
        matches!(enabled, sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)
    }
}

/// A context made current by [`Context::bind`]; dropping it restores the previous one. Not
/// `Send`: the binding belongs to the thread that made it.
#[must_use = "the context is current only while the guard lives"]
pub(crate) struct Bound<'a> {
    restore: Option<sys::CUcontext>,
    _context: PhantomData<(&'a Context, *const ())>,
}

impl Drop for Bound<'_> {
    fn drop(&mut self) {
        if crate::backend::fork::in_forked_child() {
            return; // leaked: the runtime is gone in a forked child (backend::fork)
        }
        if let Some(previous) = self.restore {
            // SAFETY: `previous` was current on this thread when the guard was made (or null,
            // which unbinds). The status is ignored: drop must not panic.
            let _ = unsafe { result::ctx::set_current(previous) };
        }
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        if crate::backend::fork::in_forked_child() {
            return; // leaked: the runtime is gone in a forked child (backend::fork)
        }
        let spare = std::mem::take(self.spare_events.get_mut().unwrap_or_else(PoisonError::into_inner));
        if !spare.is_empty()
            && let Ok(_bound) = self.bind()
        {
            for event in spare {
                // SAFETY: each kept event was created on this context and is destroyed once;
                // no ticket holds it. The status is ignored: drop must not panic.
                let _ = unsafe { result::event::destroy(event) };
            }
        }
        // SAFETY: the context was retained once in `retain` and is released once here. The
        // status is ignored: drop must not panic, and a failed release only leaks.
        let _ = unsafe { result::primary_ctx::release(self.device) };
    }
}

/// A driver status as lazybuf reports it: its name, and whether freeing memory can help.
pub fn code(status: sys::CUresult) -> RuntimeCode {
    use sys::CUresult::*;
    let retryable = status == CUDA_ERROR_OUT_OF_MEMORY;
    let name = match status {
        CUDA_ERROR_INVALID_VALUE => "CUDA_ERROR_INVALID_VALUE",
        CUDA_ERROR_OUT_OF_MEMORY => "CUDA_ERROR_OUT_OF_MEMORY",
        CUDA_ERROR_NOT_INITIALIZED => "CUDA_ERROR_NOT_INITIALIZED",
        CUDA_ERROR_DEINITIALIZED => "CUDA_ERROR_DEINITIALIZED",
        CUDA_ERROR_NO_DEVICE => "CUDA_ERROR_NO_DEVICE",
        CUDA_ERROR_INVALID_DEVICE => "CUDA_ERROR_INVALID_DEVICE",
        CUDA_ERROR_INVALID_CONTEXT => "CUDA_ERROR_INVALID_CONTEXT",
        CUDA_ERROR_PEER_ACCESS_UNSUPPORTED => "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
        CUDA_ERROR_INVALID_HANDLE => "CUDA_ERROR_INVALID_HANDLE",
        CUDA_ERROR_NOT_READY => "CUDA_ERROR_NOT_READY",
        CUDA_ERROR_ILLEGAL_ADDRESS => "CUDA_ERROR_ILLEGAL_ADDRESS",
        CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED => "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
        CUDA_ERROR_LAUNCH_FAILED => "CUDA_ERROR_LAUNCH_FAILED",
        CUDA_ERROR_NOT_SUPPORTED => "CUDA_ERROR_NOT_SUPPORTED",
        CUDA_ERROR_UNKNOWN => "CUDA_ERROR_UNKNOWN",
        _ => "see cuda.h",
    };
    RuntimeCode::Device { backend: BackendKind::CUDA, value: status as i64, name, retryable }
}

/// Maps a failed driver call to lazybuf's error.
pub(crate) fn cuda_error(call: &'static str, err: DriverError) -> Error {
    Error::Runtime { backend: BackendKind::CUDA, call, code: code(err.0) }
}

/// Maps a failed allocation: out-of-memory stays recognisable (pools trim and retry on it).
pub(crate) fn allocation_error(call: &'static str, err: DriverError, device: &str, bytes: usize) -> Error {
    if err.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        Error::OutOfMemory { device: device.to_string(), requested: bytes, code: Some(code(err.0)) }
    } else {
        cuda_error(call, err)
    }
}

fn unavailable(reason: impl Into<String>) -> Error {
    Error::BackendUnavailable { backend: BackendKind::CUDA, reason: reason.into() }
}

/// The locks of [`enqueue_lock`]: one per stripe of stream handles.
static ENQUEUE: [std::sync::Mutex<()>; 64] = [const { std::sync::Mutex::new(()) }; 64];

/// The lock held from a command's enqueue on `stream` to the record of its event
/// ([`CudaStream::enqueue`]): one per raw stream, whatever wraps it (a caller's stream is
/// wrapped anew for each use, [`CudaStream::borrowed`]: a hostile pass found a lock per
/// wrapper let a marker through), shared by a stripe of handles (a wait only, never a
/// deadlock: nothing holds two).
fn enqueue_lock(stream: sys::CUstream) -> std::sync::MutexGuard<'static, ()> {
    let stripe = (stream as usize).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (usize::BITS - 6);
    ENQUEUE[stripe].lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
