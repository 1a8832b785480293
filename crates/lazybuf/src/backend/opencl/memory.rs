//! The OpenCL memory handles: one `cl_mem` of device memory, and the owner of a pinned host
//! block (a mapped `CL_MEM_ALLOC_HOST_PTR` buffer); both are released on drop without
//! panicking.

use std::any::Any;
use std::ffi::c_void;
use std::ptr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use cl3::types::{cl_command_queue, cl_mem};

use crate::backend::{MemoryHandle, RawMemory};
use crate::host_memory::ForeignHostMemory;

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

/// A `CL_MEM_ALLOC_HOST_PTR` buffer mapped for the host at `ptr` (null until the map has
/// succeeded), with a retained reference to the queue that maps it: the owner of a pinned
/// host block. Dropping it unmaps, then releases the buffer and the queue.
pub(super) struct MappedHostMemory {
    pub(super) queue: cl_command_queue,
    pub(super) mem: cl_mem,
    pub(super) ptr: *mut c_void,
}

// SAFETY: the handles are only passed to OpenCL calls, which are thread-safe (OpenCL 3.0,
// appendix A.2); the mapped bytes are accessed only through the HostMemory that owns this.
unsafe impl Send for MappedHostMemory {}
// SAFETY: see Send; &MappedHostMemory allows nothing.
unsafe impl Sync for MappedHostMemory {}

impl ForeignHostMemory for MappedHostMemory {}

impl Drop for MappedHostMemory {
    fn drop(&mut self) {
        // Statuses are ignored: drop must not panic, and a failed call only leaks.
        if !self.ptr.is_null() {
            // SAFETY: ptr is the live mapping of mem on this queue, unmapped once; the
            // HostMemory that exposed its bytes is being dropped, so nothing uses them now.
            let unmapped = unsafe {
                cl3::command_queue::enqueue_unmap_mem_object(self.queue, self.mem, self.ptr, 0, ptr::null())
            };
            if let Ok(event) = unmapped {
                let _ = cl3::event::wait_for_events(&[event]);
                // SAFETY: the event returned by the unmap, released once.
                let _ = unsafe { cl3::event::release_event(event) };
            }
        }
        // SAFETY: mem and the retained queue belong to this value and are released once.
        unsafe {
            let _ = cl3::memory::release_mem_object(self.mem);
            let _ = cl3::command_queue::release_command_queue(self.queue);
        }
    }
}
