//! CUDA memory handles: device allocations ([`CudaMemory`]) and page-locked host blocks
//! ([`PinnedBlock`], the owner inside a pinned [`HostMemory`]). Both free themselves on drop
//! without panicking, with their context made current first. Allocation policy (flags,
//! zeroing, error mapping) is in `device.rs`.

use std::any::Any;
use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::Arc;

use cudarc::driver::{result, sys};

use super::{Context, allocation_error};
use crate::backend::{MemoryHandle, RawMemory};
use crate::error::Result;
use crate::host_memory::{ForeignHostMemory, HostMemory};

/// A device allocation (`ptr` 0 when empty: CUDA has no empty allocations).
#[derive(Debug)]
pub struct CudaMemory {
    pub(super) ptr: sys::CUdeviceptr,
    pub(super) context: Arc<Context>,
}

impl CudaMemory {
    /// Allocates `len` bytes on `context`'s device (which must be current).
    pub(super) fn allocate(context: &Arc<Context>, len: usize, device_name: &str) -> Result<CudaMemory> {
        if len == 0 {
            return Ok(CudaMemory { ptr: 0, context: context.clone() });
        }
        // SAFETY: the caller made `context` current; the memory is freed once, in Drop.
        let ptr = unsafe { result::malloc_sync(len) }
            .map_err(|err| allocation_error("cuMemAlloc", err, device_name, len))?;
        Ok(CudaMemory { ptr, context: context.clone() })
    }
}

impl MemoryHandle for CudaMemory {
    fn raw(&self) -> RawMemory {
        RawMemory::Cuda(self.ptr)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for CudaMemory {
    fn drop(&mut self) {
        if self.ptr == 0 {
            return;
        }
        // SAFETY: ptr was allocated by cuMemAlloc in this context and is freed once; every
        // lazybuf operation on it completed before returning. Statuses are ignored: drop must
        // not panic, and a failed free only leaks.
        unsafe {
            let _bound = self.context.bind();
            let _ = result::free_sync(self.ptr);
        }
    }
}

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
        // SAFETY: (1) ptr is valid and initialized for len bytes until `block` frees it;
        // (2) the HostMemory returned is the only handle to the bytes; (3) the memory is
        // page-locked (cuMemHostAlloc).
        Ok(unsafe { HostMemory::from_foreign(ptr.cast(), len, true, Box::new(block)) })
    }
}

impl Drop for PinnedBlock {
    fn drop(&mut self) {
        // SAFETY: ptr came from cuMemHostAlloc and is freed once; no transfer uses it any
        // more (every transfer completes before returning). Statuses are ignored: drop must
        // not panic, and a failed free only leaks.
        unsafe {
            let _bound = self.context.bind();
            let _ = result::free_host(self.ptr.as_ptr());
        }
    }
}
