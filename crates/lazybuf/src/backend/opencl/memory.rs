//! The OpenCL memory handle: one `cl_mem`, released on drop without panicking.

use std::any::Any;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use cl3::types::cl_mem;

use crate::backend::{MemoryHandle, RawMemory};

/// A `cl_mem` of `len` bytes (null for an empty buffer, which OpenCL cannot create).
#[derive(Debug)]
pub struct OpenClMemory {
    pub(super) mem: cl_mem,
    pub(super) len: usize,
    /// For a zero-copy alias (`CL_MEM_USE_HOST_PTR`), the host block it aliases; else null.
    pub(super) host_ptr: *const u8,
    /// Bytes this process holds on the device, shared with the device (for memory_info).
    pub(super) held: Arc<AtomicU64>,
}

// SAFETY: OpenCL API calls on a cl_mem are thread-safe (OpenCL 3.0 spec, appendix A.2:
// all API functions except clSetKernelArg/clCloneKernel are thread-safe), and the handle is
// owned by this value alone.
unsafe impl Send for OpenClMemory {}
// SAFETY: see Send; &OpenClMemory only hands the handle to thread-safe API calls.
unsafe impl Sync for OpenClMemory {}

impl MemoryHandle for OpenClMemory {
    fn raw(&self) -> RawMemory {
        RawMemory::OpenCl(self.mem)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for OpenClMemory {
    fn drop(&mut self) {
        if self.mem.is_null() {
            return;
        }
        self.held.fetch_sub(self.len as u64, Ordering::Relaxed);
        // SAFETY: mem is a buffer this value created and still owns; it is released once.
        // The status is ignored: drop must not panic, and a failed release only leaks.
        let _ = unsafe { cl3::memory::release_mem_object(self.mem) };
    }
}
