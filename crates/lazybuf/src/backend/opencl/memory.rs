//! The OpenCL handles lazybuf owns: a `cl_mem` of device memory ([`OpenClMemory`]), the owner
//! of a pinned host block (a mapped `CL_MEM_ALLOC_HOST_PTR` buffer), an in-order command queue
//! as a stream ([`OpenClStream`]), and a `cl_event` as a completion ([`OpenClEvent`]). Each is
//! released on drop without panicking.

use std::ffi::c_void;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use cl3::types::{cl_command_queue, cl_context, cl_event, cl_mem};

use super::cl_error;
use crate::backend::{Completion, MemoryHandle, RawMemory, RawStream, StreamHandle};
use crate::error::{BackendKind, Error, Result};
use crate::host_memory::ForeignHostMemory;

/// A `cl_mem` of `len` bytes (null for an empty buffer, which OpenCL cannot create).
#[derive(Debug)]
pub struct OpenClMemory {
    pub(super) mem: cl_mem,
    /// The context of the device whose memory this is (only that device's queues use it).
    pub(super) context: cl_context,
    pub(super) len: usize,
    /// For a zero-copy alias (`CL_MEM_USE_HOST_PTR`), the host block it aliases; else null.
    pub(super) host_ptr: *const u8,
    /// For shared memory, the fine-grained SVM allocation the buffer uses as its storage
    /// (freed by the buffer's destructor callback, [`free_svm`]); else null.
    pub(super) svm: *mut c_void,
    /// Bytes this process holds on the device, shared with the device (for memory_info).
    pub(super) held: Arc<AtomicU64>,
}

// SAFETY: OpenCL API calls on a cl_mem are thread-safe (OpenCL 3.0 spec, appendix A.2:
// all API functions except clSetKernelArg/clCloneKernel are thread-safe), and the handle is
// owned by this value alone.
unsafe impl Send for OpenClMemory {}
// SAFETY: see Send; &OpenClMemory only hands the handle to thread-safe API calls.
unsafe impl Sync for OpenClMemory {}

// SAFETY: a host address is given only for shared virtual memory, whose `len` bytes the host
// addresses while the allocation (freed on drop) lives.
unsafe impl MemoryHandle for OpenClMemory {
    fn raw(&self) -> RawMemory {
        RawMemory::OpenCl(self.mem)
    }

    /// The SVM address of shared memory (what `clSetKernelArgSVMPointer` takes, and where the
    /// host reads and writes it).
    fn host_address(&self) -> Option<NonNull<u8>> {
        NonNull::new(self.svm.cast())
    }
}

/// What [`free_svm`] needs: the SVM allocation and its context (retained for it).
pub(super) struct SvmAllocation {
    pub(super) context: cl_context,
    pub(super) ptr: *mut c_void,
}

/// The destructor callback of a buffer over an SVM allocation: the runtime calls it once the
/// buffer is released and no command uses it any more, so the SVM memory is freed only after
/// the last command that touched it. `user_data` is a `Box<SvmAllocation>` from
/// `Box::into_raw`.
pub(super) extern "C" fn free_svm(_mem: cl_mem, user_data: *mut c_void) {
    // SAFETY: user_data is the Box<SvmAllocation> leaked when the callback was set, and the
    // runtime calls a destructor callback once.
    let allocation = unsafe { Box::from_raw(user_data.cast::<SvmAllocation>()) };
    // SAFETY: ptr came from clSVMAlloc on this context, which the allocation retained; it is
    // freed once, here, after the last buffer using it is gone. Statuses are ignored: a
    // callback must not panic, and a failed free only leaks.
    unsafe {
        let _ = cl3::memory::svm_free(allocation.context, allocation.ptr);
        let _ = cl3::context::release_context(allocation.context);
    }
}

impl Drop for OpenClMemory {
    fn drop(&mut self) {
        if crate::backend::fork::in_forked_child() {
            return; // leaked: the runtime is gone in a forked child (backend::fork)
        }
        if self.mem.is_null() {
            return;
        }
        self.held.fetch_sub(self.len as u64, Ordering::Relaxed);
        // SAFETY: mem is a buffer this value created and still owns; it is released once.
        // OpenCL frees it only after the commands using it are done. The status is ignored:
        // drop must not panic, and a failed release only leaks.
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
        if crate::backend::fork::in_forked_child() {
            return; // leaked: the runtime is gone in a forked child (backend::fork)
        }
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

/// An in-order command queue of one context, holding its own reference to it.
#[derive(Debug)]
pub struct OpenClStream {
    pub(super) queue: cl_command_queue,
    pub(super) context: cl_context,
}

// SAFETY: OpenCL calls on a queue are thread-safe (OpenCL 3.0, appendix A.2); the value owns
// one reference to the queue.
unsafe impl Send for OpenClStream {}
// SAFETY: see Send.
unsafe impl Sync for OpenClStream {}

impl OpenClStream {
    /// Takes over one reference to `queue`, a queue of `context`.
    pub(super) fn owning(queue: cl_command_queue, context: cl_context) -> OpenClStream {
        OpenClStream { queue, context }
    }

    /// Starts what is enqueued (OpenCL may hold commands until a flush).
    pub(super) fn flush(&self) -> Result<()> {
        cl3::command_queue::flush(self.queue).map_err(|status| cl_error("clFlush", status))
    }
}

impl StreamHandle for OpenClStream {
    fn raw(&self) -> RawStream {
        RawStream::OpenCl(self.queue)
    }
}

impl Drop for OpenClStream {
    fn drop(&mut self) {
        if crate::backend::fork::in_forked_child() {
            return; // leaked: the runtime is gone in a forked child (backend::fork)
        }
        // SAFETY: the value owns one reference to the queue, released once; the runtime
        // finishes its commands first. The status is ignored: drop must not panic.
        let _ = unsafe { cl3::command_queue::release_command_queue(self.queue) };
    }
}

/// A `cl_event` as a completion: done when the command is `CL_COMPLETE`, failed when its
/// status is negative.
#[derive(Debug)]
pub struct OpenClEvent {
    event: NonNull<c_void>,
    pub(super) context: cl_context,
    /// Seen complete and successful: later polls and waits ask the runtime nothing (a flag, not
    /// `failure`'s once-cell, whose first write costs about 350 instructions of a 4 KiB batch's
    /// every wait; docs/BENCHMARKS.md).
    succeeded: AtomicBool,
    /// Seen failed: the command's error, for every later poll and wait.
    failure: OnceLock<Error>,
}

// SAFETY: event calls are thread-safe (OpenCL 3.0, appendix A.2); the value owns one
// reference to the event.
unsafe impl Send for OpenClEvent {}
// SAFETY: see Send.
unsafe impl Sync for OpenClEvent {}

impl OpenClEvent {
    /// Takes over one reference to `event`, of a command on a queue of `context`; `None`
    /// for a null event.
    pub(super) fn owning(event: cl_event, context: cl_context) -> Option<Arc<OpenClEvent>> {
        let event = NonNull::new(event)?;
        Some(Arc::new(OpenClEvent {
            event,
            context,
            succeeded: AtomicBool::new(false),
            failure: OnceLock::new(),
        }))
    }

    pub(super) fn raw(&self) -> cl_event {
        self.event.as_ptr()
    }

    fn status(&self) -> Result<i32> {
        match cl3::event::get_event_info(self.raw(), cl3::event::CL_EVENT_COMMAND_EXECUTION_STATUS) {
            Ok(cl3::info_type::InfoType::Int(status)) => Ok(status),
            Ok(_) => Err(cl_error("clGetEventInfo", cl3::error_codes::CL_INVALID_VALUE)),
            Err(status) => Err(cl_error("clGetEventInfo", status)),
        }
    }

    fn failed(status: i32) -> Error {
        cl_error("an enqueued command", status)
    }

    /// The outcome seen already, if any.
    fn known(&self) -> Option<Result<()>> {
        if self.succeeded.load(Ordering::Acquire) {
            return Some(Ok(()));
        }
        self.failure.get().map(|err| Err(err.clone()))
    }

    /// Records `outcome` (a failure recorded first stays) and returns what is recorded.
    fn record(&self, outcome: Result<()>) -> Result<()> {
        match outcome {
            Ok(()) => {
                self.succeeded.store(true, Ordering::Release);
                Ok(())
            }
            Err(err) => Err(self.failure.get_or_init(|| err).clone()),
        }
    }
}

impl Completion for OpenClEvent {
    fn poll(&self) -> Result<bool> {
        if crate::backend::fork::in_forked_child() {
            return Err(forked_event());
        }
        if let Some(outcome) = self.known() {
            return outcome.map(|()| true);
        }
        match self.status()? {
            status if status < 0 => self.record(Err(Self::failed(status))).map(|()| true),
            0 => self.record(Ok(())).map(|()| true),
            _ => Ok(false),
        }
    }

    fn wait(&self) -> Result<()> {
        if crate::backend::fork::in_forked_child() {
            return Err(forked_event());
        }
        if let Some(outcome) = self.known() {
            return outcome;
        }
        let outcome = match cl3::event::wait_for_events(&[self.raw()]) {
            Ok(()) => Ok(()),
            // The event itself failed: its status is the command's error.
            Err(_) => match self.status() {
                Ok(status) if status < 0 => Err(Self::failed(status)),
                Ok(_) => Ok(()),
                Err(err) => Err(err),
            },
        };
        self.record(outcome)
    }
}

/// The error for waiting on an event of the parent's runtime in a forked child.
#[cold]
fn forked_event() -> Error {
    Error::ForkedChild { device: "an OpenCL device".into(), backend: BackendKind::OPENCL }
}

impl Drop for OpenClEvent {
    fn drop(&mut self) {
        if crate::backend::fork::in_forked_child() {
            return; // leaked: the runtime is gone in a forked child (backend::fork)
        }
        // SAFETY: the value owns one reference to the event, released once. The status is
        // ignored: drop must not panic, and a failed release only leaks.
        let _ = unsafe { cl3::event::release_event(self.raw()) };
    }
}
