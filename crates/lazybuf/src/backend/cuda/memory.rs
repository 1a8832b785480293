//! The CUDA handles lazybuf owns on the device: allocations ([`CudaMemory`]), streams
//! ([`CudaStream`]) and events as completions ([`CudaEvent`]). Each releases itself on drop
//! without panicking, with its context made current first. Allocation policy (flags, zeroing,
//! error mapping) is in `device.rs`; page-locked host memory in `pinned.rs`.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use cudarc::driver::{result, sys};

use super::staging::Staging;
use super::{Context, allocation_error, cuda_error};
use crate::backend::{Completion, MemoryHandle, RawMemory, RawStream, StreamHandle};
use crate::error::{BackendKind, Error, Result};

/// What a device's allocations share with the device: how many are alive, and the pinned
/// staging memory that is freed when the last of them is.
#[derive(Debug, Default)]
pub(super) struct Shared {
    live: AtomicUsize,
    pub(super) staging: Mutex<Option<Arc<Staging>>>,
}

impl Shared {
    /// Frees the staging memory (transfers in flight keep it until they are done).
    pub(super) fn drop_staging(&self) {
        let staging = self.staging.lock().unwrap_or_else(PoisonError::into_inner).take();
        drop(staging);
    }
}

/// A device allocation, or managed memory the host addresses too (`ptr` 0 when empty: CUDA
/// has no empty allocations).
#[derive(Debug)]
pub struct CudaMemory {
    pub(super) ptr: sys::CUdeviceptr,
    pub(super) context: Arc<Context>,
    /// Managed memory (`cuMemAllocManaged`), whose address the host uses as it is.
    pub(super) managed: bool,
    /// Memory the caller owns (`borrow`): never freed here, not counted as an allocation.
    borrowed: bool,
    shared: Arc<Shared>,
}

impl CudaMemory {
    /// Allocates `len` bytes on `context`'s device (which must be current).
    pub(super) fn allocate(
        context: &Arc<Context>,
        shared: &Arc<Shared>,
        len: usize,
        device_name: &str,
    ) -> Result<CudaMemory> {
        let ptr = if len == 0 {
            0
        } else {
            // SAFETY: the caller made `context` current; the memory is freed once, in Drop.
            unsafe { result::malloc_sync(len) }
                .map_err(|err| allocation_error("cuMemAlloc", err, device_name, len))?
        };
        shared.live.fetch_add(1, Ordering::SeqCst);
        Ok(CudaMemory {
            ptr,
            context: context.clone(),
            managed: false,
            borrowed: false,
            shared: shared.clone(),
        })
    }

    /// Memory at `ptr` that the caller owns, on `context`'s device (checked by the caller).
    pub(super) fn borrowed(
        context: &Arc<Context>,
        shared: &Arc<Shared>,
        ptr: sys::CUdeviceptr,
    ) -> CudaMemory {
        CudaMemory { ptr, context: context.clone(), managed: false, borrowed: true, shared: shared.clone() }
    }

    /// Allocates `len` bytes of managed memory, attached globally (any stream and the host
    /// may use it), on `context`'s device (which must be current).
    pub(super) fn allocate_managed(
        context: &Arc<Context>,
        shared: &Arc<Shared>,
        len: usize,
        device_name: &str,
    ) -> Result<CudaMemory> {
        let ptr = if len == 0 {
            0
        } else {
            let mut ptr = 0;
            let flags = sys::CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL as u32;
            // SAFETY: the caller made `context` current; `ptr` is a valid out-pointer; the
            // memory is freed once, in Drop (cuMemFree frees managed memory too).
            unsafe { sys::cuMemAllocManaged(&mut ptr, len, flags) }
                .result()
                .map_err(|err| allocation_error("cuMemAllocManaged", err, device_name, len))?;
            ptr
        };
        shared.live.fetch_add(1, Ordering::SeqCst);
        Ok(CudaMemory {
            ptr,
            context: context.clone(),
            managed: true,
            borrowed: false,
            shared: shared.clone(),
        })
    }
}

// SAFETY: a host address is given only for managed (shared) memory, whose `len` bytes the
// host addresses while the allocation lives.
unsafe impl MemoryHandle for CudaMemory {
    fn raw(&self) -> RawMemory {
        RawMemory::Cuda(self.ptr)
    }

    fn host_address(&self) -> Option<NonNull<u8>> {
        if !self.managed {
            return None;
        }
        // Managed memory has one address for the device and the host (unified addressing).
        NonNull::new(self.ptr as usize as *mut u8).or(Some(NonNull::dangling()))
    }
}

impl Drop for CudaMemory {
    fn drop(&mut self) {
        if crate::backend::fork::in_forked_child() {
            return; // leaked: the runtime is gone in a forked child (backend::fork)
        }
        if self.borrowed {
            return;
        }
        if self.ptr != 0 {
            // SAFETY: ptr was allocated by cuMemAlloc in this context and is freed once;
            // cuMemFree waits for work still using it. A failure (the context's earlier fault,
            // say) cannot be returned from a drop: it is recorded on the context, for
            // Device::take_deferred_errors, and the memory is leaked.
            let freed = unsafe {
                self.context.bind().and_then(|_bound| {
                    result::free_sync(self.ptr).map_err(|err| super::cuda_error("cuMemFree", err))
                })
            };
            self.context.deferred.record_err(freed);
        }
        // The last allocation of the device gone: its staging memory goes too.
        if self.shared.live.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.shared.drop_staging();
        }
    }
}

/// A CUDA stream of one context: lazybuf's own (the device's default stream is blocking, the
/// others non-blocking; see `CudaStream::create`), or the caller's, which lazybuf never
/// destroys.
#[derive(Debug)]
pub struct CudaStream {
    pub(super) stream: sys::CUstream,
    pub(super) context: Arc<Context>,
    owned: bool,
}

// SAFETY: the driver API is thread-safe and streams may be used from any thread; the value
// owns the stream.
unsafe impl Send for CudaStream {}
// SAFETY: see Send.
unsafe impl Sync for CudaStream {}

impl CudaStream {
    /// A new stream; `context` must be current. A *blocking* stream synchronizes with the
    /// legacy default stream (work there waits for it, and it waits for work there): the
    /// device's default stream is one, so kernels that CuPy, PyTorch or Numba launch on their
    /// default stream, writing memory lazybuf handed out, are ordered with lazybuf's copies
    /// without any call. Streams made for overlap (`create_stream`) are non-blocking.
    pub(super) fn create(context: &Arc<Context>, blocking: bool) -> Result<CudaStream> {
        let kind = if blocking {
            result::stream::StreamKind::Default
        } else {
            result::stream::StreamKind::NonBlocking
        };
        let stream = result::stream::create(kind).map_err(|err| cuda_error("cuStreamCreate", err))?;
        Ok(CudaStream { stream, context: context.clone(), owned: true })
    }

    /// The caller's stream `stream` of `context`, not destroyed on drop.
    pub(super) fn borrowed(context: &Arc<Context>, stream: sys::CUstream) -> CudaStream {
        CudaStream { stream, context: context.clone(), owned: false }
    }

    /// Held by the caller from a command's enqueue to the record of its event, so that the
    /// event recorded after a command is that command's, also when threads share the stream: a
    /// failure reported to the next event recorded on the stream (the test double's, a
    /// non-sticky error's) is reported to the command that failed, and undone there, not to
    /// another thread's (the tenth hostile pass: four threads on one stream with faults read
    /// the double's garbage without an error). Markers, stream synchronizes and the staging
    /// lanes' copies take it too; only a synchronize waits while holding it (for the device,
    /// never for another thread). One lock per raw stream, whichever wrapper holds it
    /// ([`super::enqueue_lock`]).
    pub(super) fn enqueue(&self) -> std::sync::MutexGuard<'static, ()> {
        super::enqueue_lock(self.stream)
    }

    /// Records a new event on the stream, as a completion; `context` must be current and the
    /// caller holds [`Self::enqueue`].
    pub(super) fn record(&self) -> Result<Arc<CudaEvent>> {
        let event = self.context.take_event()?;
        let event = Arc::new(CudaEvent { event, context: self.context.clone(), outcome: OnceLock::new() });
        // SAFETY: live event and stream of the current context.
        unsafe { result::event::record(event.event, self.stream) }
            .map_err(|err| cuda_error("cuEventRecord", err))?;
        Ok(event)
    }
}

impl StreamHandle for CudaStream {
    fn raw(&self) -> RawStream {
        RawStream::Cuda(self.stream.cast())
    }
}

impl Drop for CudaStream {
    fn drop(&mut self) {
        if crate::backend::fork::in_forked_child() {
            return; // leaked: the runtime is gone in a forked child (backend::fork)
        }
        if !self.owned {
            return;
        }
        // SAFETY: the stream was created by `create` and is destroyed once; the driver lets
        // its queued work finish first. Statuses are ignored: drop must not panic.
        unsafe {
            let _bound = self.context.bind();
            let _ = result::stream::destroy(self.stream);
        }
    }
}

/// A recorded CUDA event as a completion.
#[derive(Debug)]
pub struct CudaEvent {
    pub(super) event: sys::CUevent,
    pub(super) context: Arc<Context>,
    outcome: OnceLock<Result<()>>,
}

// SAFETY: event calls are thread-safe; the value owns the event.
unsafe impl Send for CudaEvent {}
// SAFETY: see Send.
unsafe impl Sync for CudaEvent {}

impl Completion for CudaEvent {
    fn poll(&self) -> Result<bool> {
        if crate::backend::fork::in_forked_child() {
            return Err(Error::ForkedChild { device: "a CUDA device".into(), backend: BackendKind::CUDA });
        }
        if let Some(outcome) = self.outcome.get() {
            return outcome.clone().map(|()| true);
        }
        let _bound = self.context.bind()?;
        // SAFETY: the event is live and was recorded.
        match unsafe { result::event::query(self.event) } {
            Ok(()) => self.outcome.get_or_init(|| Ok(())).clone().map(|()| true),
            Err(err) if err.0 == sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            Err(err) => {
                self.outcome.get_or_init(|| Err(cuda_error("cuEventQuery", err))).clone().map(|()| true)
            }
        }
    }

    /// An event recorded on a stream completes in that stream's order.
    fn stream_ordered(&self) -> bool {
        true
    }

    fn wait(&self) -> Result<()> {
        if crate::backend::fork::in_forked_child() {
            return Err(Error::ForkedChild { device: "a CUDA device".into(), backend: BackendKind::CUDA });
        }
        if let Some(outcome) = self.outcome.get() {
            return outcome.clone();
        }
        let _bound = self.context.bind()?;
        // SAFETY: the event is live and was recorded.
        let waited = unsafe { result::event::synchronize(self.event) }
            .map_err(|err| cuda_error("cuEventSynchronize", err));
        self.outcome.get_or_init(|| waited).clone()
    }
}

impl Drop for CudaEvent {
    fn drop(&mut self) {
        if crate::backend::fork::in_forked_child() {
            return; // leaked: the runtime is gone in a forked child (backend::fork)
        }
        // Kept for the next ticket of this context, no driver call; else destroyed.
        if self.context.keep_event(self.event) {
            return;
        }
        // SAFETY: the event was taken in `record` and is destroyed once; the driver keeps it
        // until its work is done. Statuses are ignored: drop must not panic.
        unsafe {
            let _bound = self.context.bind();
            let _ = result::event::destroy(self.event);
        }
    }
}
