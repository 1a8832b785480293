//! Host memory the CUDA driver page-locks: blocks from `cuMemHostAlloc` ([`PinnedBlock`], the
//! owner inside a pinned [`HostMemory`]) and registrations of pageable host pages
//! ([`PageRegistration`]). Each releases itself on drop without panicking, with its context
//! made current first. Used by the device (pinned host copies, registration) and by the
//! staging pipeline (its pinned chunks).

use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use cudarc::driver::{result, sys};

use super::{Context, allocation_error, cuda_error};
use crate::error::{BackendKind, Result};
use crate::host_memory::{ForeignHostMemory, HostMemory, Pinning, machine_memory};

/// Page-locked host memory from `cuMemHostAlloc`, owned by the [`HostMemory`] that wraps it.
pub(super) struct PinnedBlock {
    ptr: NonNull<c_void>,
    context: Arc<Context>,
}

// SAFETY: the block is plain host memory owned by this value alone; freeing it is a
// thread-safe driver call.
unsafe impl Send for PinnedBlock {}
// SAFETY: PinnedBlock exposes nothing through &self.
unsafe impl Sync for PinnedBlock {}

impl ForeignHostMemory for PinnedBlock {}

impl PinnedBlock {
    /// Allocates `len` (> 0) zeroed, page-locked bytes with `flags`, as a [`HostMemory`].
    /// `context` must be current.
    pub(super) fn allocate(
        context: &Arc<Context>,
        len: usize,
        flags: u32,
        device_name: &str,
    ) -> Result<HostMemory> {
        // SAFETY: the caller made `context` current; the block is freed once, in Drop.
        let ptr = unsafe { result::malloc_host(len, flags) }
            .map_err(|err| allocation_error("cuMemHostAlloc", err, device_name, len))?;
        let Some(ptr) = NonNull::new(ptr) else {
            return Err(crate::Error::invalid("cuMemHostAlloc", "the driver returned a null pointer"));
        };
        let block = PinnedBlock { ptr, context: context.clone() };
        // SAFETY: ptr is valid for len bytes (cuMemHostAlloc succeeded); zeroing initializes
        // them, as HostMemory requires.
        unsafe { std::ptr::write_bytes(ptr.as_ptr().cast::<u8>(), 0, len) };
        let pinning = Pinning::Runtime(BackendKind::CUDA);
        // SAFETY: (1) ptr is valid and initialized for len bytes until `block` frees it;
        // (2) the HostMemory returned is the only handle to the bytes; (3) the memory is
        // page-locked by the driver (cuMemHostAlloc); (4) it was just zeroed.
        Ok(unsafe { HostMemory::from_foreign(ptr.cast(), len, pinning, true, Box::new(block)) })
    }
}

impl Drop for PinnedBlock {
    fn drop(&mut self) {
        if crate::backend::fork::in_forked_child() {
            return; // leaked: the runtime is gone in a forked child (backend::fork)
        }
        // SAFETY: ptr came from cuMemHostAlloc and is freed once; the buffer that owned it
        // waited for its transfers. Statuses are ignored: drop must not panic, and a failed
        // free only leaks.
        unsafe {
            let _bound = self.context.bind();
            let _ = result::free_host(self.ptr.as_ptr());
        }
    }
}

/// Bytes of pageable host memory registered with the driver by this process.
static REGISTERED_BYTES: AtomicUsize = AtomicUsize::new(0);

/// Pageable host pages registered (page-locked) with the driver by `cuMemHostRegister`;
/// dropping it unregisters them.
pub(super) struct PageRegistration {
    ptr: NonNull<c_void>,
    len: usize,
    context: Arc<Context>,
}

// SAFETY: the value only remembers an address to unregister; the driver call is thread-safe.
unsafe impl Send for PageRegistration {}
// SAFETY: PageRegistration exposes nothing through &self.
unsafe impl Sync for PageRegistration {}

impl ForeignHostMemory for PageRegistration {}

impl PageRegistration {
    /// Registers `block`'s pages as portable pinned memory; `context` must be current. On
    /// success the block reports [`Pinning::Registered`]. Refused (an error) when the
    /// registered bytes would pass a quarter of the machine's memory.
    pub(super) fn register(context: &Arc<Context>, block: &mut HostMemory) -> Result<()> {
        let Some(ptr) = NonNull::new(block.as_ptr().cast_mut().cast::<c_void>()) else {
            return Ok(());
        };
        let len = block.len();
        let budget = machine_memory() / 4;
        REGISTERED_BYTES
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |held| {
                held.checked_add(len).filter(|&t| t <= budget)
            })
            .map_err(|held| {
                crate::Error::invalid(
                    "cuMemHostRegister",
                    format!(
                        "{held} bytes are registered already; {len} more would pass the budget of {budget}"
                    ),
                )
            })?;
        // SAFETY: ptr is valid for len bytes while the block lives; the registration is
        // dropped (unregistered) before the block's memory is freed (HostMemory's drop).
        let registered =
            unsafe { sys::cuMemHostRegister_v2(ptr.as_ptr(), len, sys::CU_MEMHOSTREGISTER_PORTABLE) }
                .result()
                .map_err(|err| cuda_error("cuMemHostRegister", err));
        if let Err(err) = registered {
            REGISTERED_BYTES.fetch_sub(len, Ordering::SeqCst);
            return Err(err);
        }
        let registration = PageRegistration { ptr, len, context: context.clone() };
        // SAFETY: the pages were just registered with CUDA, until `registration` is dropped.
        unsafe { block.register(BackendKind::CUDA, Box::new(registration)) };
        Ok(())
    }
}

impl Drop for PageRegistration {
    fn drop(&mut self) {
        if crate::backend::fork::in_forked_child() {
            return; // leaked: the runtime is gone in a forked child (backend::fork)
        }
        // SAFETY: the pages were registered once by `register`; the block's transfers are
        // done (its buffer waited for them). Statuses are ignored: drop must not panic.
        unsafe {
            let _bound = self.context.bind();
            let _ = sys::cuMemHostUnregister(self.ptr.as_ptr());
        }
        REGISTERED_BYTES.fetch_sub(self.len, Ordering::SeqCst);
    }
}
