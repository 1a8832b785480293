//! The OpenCL [`Runtime`]: one context per device, in-order queues as streams,
//! non-blocking enqueues whose events are the tickets.

use std::any::Any;
use std::ffi::c_void;
use std::ptr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use cl3::command_queue as cq;
use cl3::device as dev;
use cl3::info_type::InfoType;
use cl3::memory as clmem;
use cl3::types::{CL_BLOCKING, CL_NON_BLOCKING, cl_context, cl_device_id, cl_event, cl_mem};

use super::memory::{MappedHostMemory, OpenClEvent, OpenClMemory, OpenClStream, SvmAllocation, free_svm};
use super::{cl_error, code, is_out_of_memory};
use crate::backend::{
    Allocated, DeviceInfo, HostSpan, MemoryInfo, MemoryKind, MemorySource, RawDevice, RawMemory, RawStream,
    Runtime, Ticket,
};
use crate::error::{BackendKind, Error, Result};
use crate::host_memory::{HostMemory, Pinning};

/// Host-sharing devices alias host blocks of at least this many bytes; smaller ones copy,
/// because a map/unmap pair costs more than copying them (docs/BENCHMARKS.md).
pub const ALIAS_MIN_BYTES: usize = 4 << 20;

/// How an OpenCL device is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenClOptions {
    /// On a host-sharing device, buffers of at least this many bytes alias host memory and
    /// sync by map/unmap; smaller ones copy. `usize::MAX` always copies.
    pub zero_copy_min_bytes: usize,
}

impl Default for OpenClOptions {
    fn default() -> Self {
        OpenClOptions { zero_copy_min_bytes: ALIAS_MIN_BYTES }
    }
}

/// One OpenCL device with its own context and a default in-order queue.
#[derive(Debug)]
pub struct OpenClBackend {
    info: DeviceInfo,
    options: OpenClOptions,
    device: cl_device_id,
    context: cl_context,
    stream: Arc<OpenClStream>,
    max_alloc: u64,
    held: Arc<AtomicU64>,
    /// `CL_DEVICE_SVM_CAPABILITIES` (0 before OpenCL 2.0).
    svm_capabilities: u64,
    /// `CL_DEVICE_MEM_BASE_ADDR_ALIGN`, in bytes.
    base_align: usize,
}

// SAFETY: OpenCL handles may be used from any thread (OpenCL 3.0 appendix A.2: every API call
// except clSetKernelArg/clCloneKernel is thread-safe); this value owns its context.
unsafe impl Send for OpenClBackend {}
// SAFETY: see Send.
unsafe impl Sync for OpenClBackend {}

fn info_u64(device: cl_device_id, param: u32) -> Option<u64> {
    match dev::get_device_info(device, param).ok()? {
        InfoType::Ulong(v) => Some(v),
        InfoType::Uint(v) => Some(v.into()),
        InfoType::Size(v) => Some(v as u64),
        _ => None,
    }
}

fn info_string(device: cl_device_id, param: u32) -> Option<String> {
    match dev::get_device_info(device, param).ok()? {
        InfoType::VecUchar(bytes) => {
            Some(String::from_utf8_lossy(&bytes).trim_end_matches('\0').trim().to_string())
        }
        _ => None,
    }
}

/// Releases an event nobody waits for (its command is ordered by the queue).
fn release(event: cl_event) {
    // SAFETY: event was returned by an enqueue call and is released exactly once here; the
    // status is ignored because a failed release only leaks.
    let _ = unsafe { cl3::event::release_event(event) };
}

/// Creates an in-order queue on `context` for `device`.
fn new_queue(context: cl_context, device: cl_device_id) -> Result<OpenClStream> {
    // SAFETY: context and device are live; properties 0 asks for an in-order queue.
    #[allow(deprecated)]
    let queue = unsafe { cq::create_command_queue(context, device, 0) }
        .map_err(|status| cl_error("clCreateCommandQueue", status))?;
    Ok(OpenClStream::owning(queue, context))
}

impl OpenClBackend {
    /// Opens `device` with a new context and an in-order queue.
    ///
    /// # Safety
    /// `device` is a valid `cl_device_id` of a loaded OpenCL platform (from
    /// `clGetDeviceIDs`, or [`crate::Device::raw`] of a live OpenCL device).
    pub unsafe fn open(device: cl_device_id) -> Result<Self> {
        // SAFETY: forwarded contract.
        unsafe { Self::open_with(device, OpenClOptions::default()) }
    }

    /// Opens `device` with explicit options.
    ///
    /// # Safety
    /// As for [`OpenClBackend::open`].
    pub unsafe fn open_with(device: cl_device_id, options: OpenClOptions) -> Result<Self> {
        let kind = info_u64(device, dev::CL_DEVICE_TYPE).unwrap_or(0);
        let svm_capabilities = info_u64(device, dev::CL_DEVICE_SVM_CAPABILITIES).unwrap_or(0);
        let info = DeviceInfo {
            name: info_string(device, dev::CL_DEVICE_NAME).unwrap_or_else(|| "OpenCL device".into()),
            backend: BackendKind::OPENCL,
            vendor: info_string(device, dev::CL_DEVICE_VENDOR).unwrap_or_default(),
            shares_host_memory: info_u64(device, dev::CL_DEVICE_HOST_UNIFIED_MEMORY).unwrap_or(0) != 0
                || kind & dev::CL_DEVICE_TYPE_CPU != 0,
            is_gpu: kind & dev::CL_DEVICE_TYPE_GPU != 0,
            total_memory: info_u64(device, dev::CL_DEVICE_GLOBAL_MEM_SIZE).unwrap_or(0),
            compute_capability: None,
            ordinal: None,
            // Shared memory is fine-grained buffer SVM (allocate_shared says why not).
            shared_memory: svm_capabilities & dev::CL_DEVICE_SVM_FINE_GRAIN_BUFFER != 0,
            dlpack: crate::backend::DlpackDevices::HOST_SHARED,
        };
        let max_alloc = info_u64(device, dev::CL_DEVICE_MAX_MEM_ALLOC_SIZE).unwrap_or(info.total_memory);
        // Reported in bits; at least a byte, a power of two.
        let base_align = (info_u64(device, dev::CL_DEVICE_MEM_BASE_ADDR_ALIGN).unwrap_or(8) / 8)
            .max(1)
            .next_power_of_two() as usize;
        let context = cl3::context::create_context(&[device], ptr::null(), None, ptr::null_mut())
            .map_err(|status| cl_error("clCreateContext", status))?;
        let stream = match new_queue(context, device) {
            Ok(stream) => Arc::new(stream),
            Err(err) => {
                // SAFETY: releasing the context created above, which nothing else holds.
                let _ = unsafe { cl3::context::release_context(context) };
                return Err(err);
            }
        };
        Ok(OpenClBackend {
            info,
            options,
            device,
            context,
            stream,
            max_alloc,
            held: Arc::new(AtomicU64::new(0)),
            svm_capabilities,
            base_align,
        })
    }

    /// `bytes` of fine-grained SVM ([`MemoryKind::Shared`]), or why the device has none.
    fn allocate_shared(&self, bytes: usize) -> Result<OpenClMemory> {
        if self.svm_capabilities & dev::CL_DEVICE_SVM_FINE_GRAIN_BUFFER == 0 {
            let has = if self.svm_capabilities & dev::CL_DEVICE_SVM_COARSE_GRAIN_BUFFER != 0 {
                "only coarse-grained SVM, which the host cannot use without maps"
            } else {
                "no shared virtual memory"
            };
            return Err(Error::invalid(
                "allocate_shared",
                format!(
                    "{} has no shared memory ({has}); expected a device with fine-grained buffer SVM (CL_DEVICE_SVM_FINE_GRAIN_BUFFER)",
                    self.info.name
                ),
            ));
        }
        if bytes == 0 { self.create(0, 0, ptr::null_mut()) } else { self.create_svm(bytes) }
    }

    /// Flushes what `enqueue` put on `stream` and hands out its event as a ticket.
    fn enqueued(
        &self,
        stream: &OpenClStream,
        call: &'static str,
        enqueue: impl FnOnce() -> std::result::Result<cl_event, i32>,
    ) -> Result<Ticket> {
        let event = enqueue().map_err(|status| cl_error(call, status))?;
        let completion = OpenClEvent::owning(event, self.context)
            .ok_or_else(|| cl_error(call, cl3::error_codes::CL_INVALID_EVENT))?;
        stream.flush()?;
        Ok(Ticket::new(completion))
    }

    fn create(&self, bytes: usize, flags: u64, host_ptr: *mut c_void) -> Result<OpenClMemory> {
        let held = self.held.clone();
        if bytes == 0 {
            return Ok(OpenClMemory {
                mem: ptr::null_mut(),
                context: self.context,
                len: 0,
                host_ptr: ptr::null(),
                svm: ptr::null_mut(),
                held,
            });
        }
        self.check_size(bytes)?;
        // SAFETY: context is live; host_ptr is null or (USE_HOST_PTR) valid for `bytes` bytes
        // for the lifetime of the buffer, which alias_host's caller guarantees.
        let mem = unsafe { clmem::create_buffer(self.context, flags, bytes, host_ptr) }
            .map_err(|status| self.allocation_error("clCreateBuffer", bytes, status))?;
        held.fetch_add(bytes as u64, Ordering::Relaxed);
        Ok(OpenClMemory {
            mem,
            context: self.context,
            len: bytes,
            host_ptr: host_ptr.cast_const().cast(),
            svm: ptr::null_mut(),
            held,
        })
    }

    /// `bytes` of fine-grained SVM, with a buffer over it (`CL_MEM_USE_HOST_PTR` on an SVM
    /// pointer makes the SVM allocation the buffer's storage, OpenCL 3.0 section 5.2.1), so
    /// every buffer operation works on it; the buffer's destructor callback frees the SVM.
    fn create_svm(&self, bytes: usize) -> Result<OpenClMemory> {
        let flags = clmem::CL_MEM_READ_WRITE | clmem::CL_MEM_SVM_FINE_GRAIN_BUFFER;
        // Aligned to the base address alignment: PoCL refuses alignments beyond its largest
        // data type, which that alignment covers.
        // SAFETY: context is live; the flags are valid SVM flags.
        let svm = unsafe { clmem::svm_alloc(self.context, flags, bytes, self.base_align as u32) }
            // clSVMAlloc reports every failure as a null pointer.
            .map_err(|_| Error::OutOfMemory {
                device: self.info.name.clone(),
                requested: bytes,
                code: None,
            })?;
        // SAFETY: svm was just allocated on this context and nothing else holds it.
        let free_now = || unsafe {
            let _ = clmem::svm_free(self.context, svm);
        };
        let mut memory = match self.create(bytes, clmem::CL_MEM_READ_WRITE | clmem::CL_MEM_USE_HOST_PTR, svm)
        {
            Ok(memory) => memory,
            Err(err) => {
                free_now();
                return Err(err);
            }
        };
        // The callback's own reference to the context, which clSVMFree needs.
        // SAFETY: the context is live (self holds it).
        if let Err(status) = unsafe { cl3::context::retain_context(self.context) } {
            drop(memory);
            free_now();
            return Err(cl_error("clRetainContext", status));
        }
        let owner = Box::into_raw(Box::new(SvmAllocation { context: self.context, ptr: svm }));
        // SAFETY: memory.mem is the live buffer just created; `owner` stays valid until the
        // callback takes it back.
        let callback =
            unsafe { clmem::set_mem_object_destructor_callback(memory.mem, free_svm, owner.cast()) };
        if let Err(status) = callback {
            drop(memory);
            // SAFETY: the callback was not set, so `owner` is still ours; the buffer is gone
            // (no command used it), so the SVM can be freed now, with the reference taken.
            unsafe {
                drop(Box::from_raw(owner));
                let _ = clmem::svm_free(self.context, svm);
                let _ = cl3::context::release_context(self.context);
            }
            return Err(cl_error("clSetMemObjectDestructorCallback", status));
        }
        memory.host_ptr = ptr::null();
        memory.svm = svm;
        Ok(memory)
    }

    fn check_size(&self, bytes: usize) -> Result<()> {
        if bytes as u64 > self.max_alloc {
            return Err(Error::invalid(
                "allocate",
                format!(
                    "{bytes} bytes exceed the largest allocation {} allows ({} bytes)",
                    self.info.name, self.max_alloc
                ),
            ));
        }
        Ok(())
    }

    /// An allocation's failure: out of memory for the runtime's memory codes.
    fn allocation_error(&self, call: &'static str, bytes: usize, status: i32) -> Error {
        if is_out_of_memory(status) {
            Error::OutOfMemory { device: self.info.name.clone(), requested: bytes, code: Some(code(status)) }
        } else {
            cl_error(call, status)
        }
    }

    /// Pinned host memory the OpenCL way: a `CL_MEM_ALLOC_HOST_PTR` buffer (the runtime's
    /// page-locked staging memory on GPU drivers), mapped for the host as long as the block
    /// lives, and zeroed as every new host block is.
    fn allocate_mapped(&self, bytes: usize) -> Result<HostMemory> {
        self.check_size(bytes)?;
        let flags = clmem::CL_MEM_READ_WRITE | clmem::CL_MEM_ALLOC_HOST_PTR;
        // SAFETY: context is live; no host pointer is passed.
        let mem = unsafe { clmem::create_buffer(self.context, flags, bytes, ptr::null_mut()) }
            .map_err(|status| self.allocation_error("clCreateBuffer", bytes, status))?;
        let queue = self.stream.queue;
        // SAFETY: the queue is live (self holds it); the owner below releases this reference.
        if let Err(status) = unsafe { cq::retain_command_queue(queue) } {
            // SAFETY: releasing the buffer created above, which nothing else holds.
            let _ = unsafe { clmem::release_mem_object(mem) };
            return Err(cl_error("clRetainCommandQueue", status));
        }
        // From here on, dropping `owner` releases the buffer and the queue (and unmaps).
        let mut owner = MappedHostMemory { queue, mem, ptr: ptr::null_mut() };
        let mut mapped: cl_mem = ptr::null_mut();
        let map_flags = clmem::CL_MAP_READ | clmem::CL_MAP_WRITE;
        // SAFETY: mem is a live buffer of `bytes` on this queue's context; blocking map.
        let event = unsafe {
            cq::enqueue_map_buffer(queue, mem, CL_BLOCKING, map_flags, 0, bytes, &mut mapped, 0, ptr::null())
        }
        .map_err(|status| self.allocation_error("clEnqueueMapBuffer", bytes, status))?;
        owner.ptr = mapped;
        release(event);
        let Some(start) = ptr::NonNull::new(mapped.cast::<u8>()) else {
            return Err(cl_error("clEnqueueMapBuffer", cl3::error_codes::CL_INVALID_VALUE));
        };
        // SAFETY: the map succeeded, so [start, start + bytes) is writable host memory until
        // the unmap in owner's drop; zeroing initializes every byte.
        unsafe { ptr::write_bytes(start.as_ptr(), 0, bytes) };
        let pinning = Pinning::Runtime(BackendKind::OPENCL);
        // SAFETY: (1) the mapping is valid and initialized until `owner` is dropped; (2) only
        // the returned block reaches these bytes (the buffer's handle stays inside `owner`);
        // (3) it is the runtime's pinned host memory, SPEC section 3's meaning of pinned for
        // OpenCL; (4) it was just zeroed.
        Ok(unsafe { HostMemory::from_foreign(start, bytes, pinning, true, Box::new(owner)) })
    }

    /// Enqueues a map of the whole of an aliased buffer and its unmap: the runtime makes the
    /// host block current (`CL_MAP_READ`) or takes it as the new contents
    /// (`CL_MAP_WRITE_INVALIDATE_REGION`). On a host-sharing device no byte moves.
    fn map_unmap(&self, stream: &OpenClStream, mem: cl_mem, len: usize, flags: u64) -> Result<Ticket> {
        let mut mapped: cl_mem = ptr::null_mut();
        // SAFETY: mem is a live buffer of len bytes on this queue's context. The pointer is
        // used only by the unmap below, which the in-order queue runs after the map.
        let event = unsafe {
            cq::enqueue_map_buffer(
                stream.queue,
                mem,
                CL_NON_BLOCKING,
                flags,
                0,
                len,
                &mut mapped,
                0,
                ptr::null(),
            )
        }
        .map_err(|status| cl_error("clEnqueueMapBuffer", status))?;
        release(event);
        self.enqueued(stream, "clEnqueueUnmapMemObject", || {
            // SAFETY: unmapping the pointer the map above returned, once.
            unsafe { cq::enqueue_unmap_mem_object(stream.queue, mem, mapped, 0, ptr::null()) }
        })
    }
}

impl Drop for OpenClBackend {
    fn drop(&mut self) {
        if crate::backend::fork::in_forked_child() {
            return; // leaked: the runtime is gone in a forked child (backend::fork)
        }
        // SAFETY: the context was created by `open` and is released once, after the default
        // queue's work is done (queues hold their own context references). Statuses are
        // ignored because drop must not panic (a failed release only leaks).
        unsafe {
            let _ = cq::finish(self.stream.queue);
            let _ = cl3::context::release_context(self.context);
        }
    }
}

impl Runtime for OpenClBackend {
    type Memory = OpenClMemory;
    type Stream = OpenClStream;

    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn memory_info(&self) -> Result<MemoryInfo> {
        let total = self.info.total_memory;
        let held = self.held.load(Ordering::Relaxed);
        Ok(MemoryInfo {
            free: total.saturating_sub(held),
            total,
            source: MemorySource::TotalMinusProcessHeld,
            cached: 0,
        })
    }

    fn default_stream(&self) -> Arc<OpenClStream> {
        self.stream.clone()
    }

    fn create_stream(&self) -> Result<Arc<OpenClStream>> {
        Ok(Arc::new(new_queue(self.context, self.device)?))
    }

    unsafe fn wrap_stream(&self, raw: RawStream) -> Result<Arc<OpenClStream>> {
        let RawStream::OpenCl(queue) = raw else {
            return Err(Error::invalid("wrap_stream", format!("expected an OpenCL queue, got {raw:?}")));
        };
        let context = match cq::get_command_queue_info(queue, cq::CL_QUEUE_CONTEXT) {
            Ok(InfoType::Ptr(context)) => context as cl_context,
            Ok(_) => return Err(cl_error("clGetCommandQueueInfo", cl3::error_codes::CL_INVALID_VALUE)),
            Err(status) => return Err(cl_error("clGetCommandQueueInfo", status)),
        };
        if context != self.context {
            return Err(Error::invalid(
                "wrap_stream",
                format!(
                    "expected a queue of {}'s context (lazybuf's), got one of another context",
                    self.info.name
                ),
            ));
        }
        // SAFETY: the queue is live (the caller's promise); the handle owns this reference.
        unsafe { cq::retain_command_queue(queue) }
            .map_err(|status| cl_error("clRetainCommandQueue", status))?;
        Ok(Arc::new(OpenClStream::owning(queue, context)))
    }

    /// Pinned host blocks are runtime-allocated, mapped host memory (see `allocate_mapped`;
    /// an empty pinned block has nothing to map); shared memory is fine-grained SVM.
    fn allocate(&self, kind: MemoryKind, bytes: usize) -> Result<Allocated<OpenClMemory>> {
        Ok(match kind {
            MemoryKind::Host { pinned: false } => Allocated::Host(HostMemory::allocate(bytes)?),
            MemoryKind::Host { pinned: true } if bytes == 0 => {
                Allocated::Host(HostMemory::allocate_locked(0)?)
            }
            MemoryKind::Host { pinned: true } => Allocated::Host(self.allocate_mapped(bytes)?),
            MemoryKind::Device => {
                Allocated::Memory(self.create(bytes, clmem::CL_MEM_READ_WRITE, ptr::null_mut())?)
            }
            MemoryKind::Shared => Allocated::Memory(self.allocate_shared(bytes)?),
        })
    }

    unsafe fn borrow(&self, raw: RawMemory, len: usize) -> Result<OpenClMemory> {
        let RawMemory::OpenCl(mem) = raw else {
            return Err(Error::invalid("borrow", format!("expected an OpenCL cl_mem, got {raw:?}")));
        };
        // A private count: memory the caller owns is not what this process holds here.
        let held = Arc::new(AtomicU64::new(len as u64));
        if mem.is_null() {
            if len > 0 {
                return Err(Error::invalid("borrow", format!("a null cl_mem for {len} bytes")));
            }
            let memory = OpenClMemory {
                mem,
                context: self.context,
                len: 0,
                host_ptr: ptr::null(),
                svm: ptr::null_mut(),
                held,
            };
            return Ok(memory);
        }
        let context = match clmem::get_mem_object_info(mem, clmem::CL_MEM_CONTEXT) {
            Ok(InfoType::Ptr(context)) => context as cl_context,
            _ => ptr::null_mut(),
        };
        let size = match clmem::get_mem_object_info(mem, clmem::CL_MEM_SIZE) {
            Ok(InfoType::Size(size)) => size,
            _ => 0,
        };
        if context != self.context || size < len {
            return Err(Error::invalid(
                "borrow",
                format!(
                    "expected a cl_mem of at least {len} bytes in {}'s context (lazybuf's), got {size} bytes of {}",
                    self.info.name,
                    if context == self.context { "it" } else { "another context" }
                ),
            ));
        }
        // SAFETY: mem is a live buffer (the caller's promise); the memory's drop releases this
        // reference.
        unsafe { clmem::retain_mem_object(mem) }.map_err(|status| cl_error("clRetainMemObject", status))?;
        let memory = OpenClMemory {
            mem,
            context: self.context,
            len,
            host_ptr: ptr::null(),
            svm: ptr::null_mut(),
            held,
        };
        Ok(memory)
    }

    fn alignment(&self, kind: MemoryKind) -> usize {
        match kind {
            MemoryKind::Device | MemoryKind::Shared => self.base_align,
            MemoryKind::Host { .. } => crate::host_memory::HEAP_ALIGN,
        }
    }

    fn zero_copy(&self, bytes: usize) -> bool {
        self.info.shares_host_memory && bytes >= self.options.zero_copy_min_bytes
    }

    fn alias_host(&self, host: &mut HostMemory, bytes: usize) -> Option<Result<OpenClMemory>> {
        let flags = clmem::CL_MEM_READ_WRITE | clmem::CL_MEM_USE_HOST_PTR;
        Some(self.create(bytes, flags, host.as_mut_ptr().cast()))
    }

    fn owns(&self, memory: &OpenClMemory) -> bool {
        memory.context == self.context
    }

    fn owns_stream(&self, stream: &OpenClStream) -> bool {
        stream.context == self.context
    }

    unsafe fn upload(&self, stream: &OpenClStream, src: HostSpan, dst: &OpenClMemory) -> Result<Ticket> {
        if dst.host_ptr == src.ptr().cast_const() {
            return self.map_unmap(stream, dst.mem, src.len(), clmem::CL_MAP_WRITE_INVALIDATE_REGION);
        }
        self.enqueued(stream, "clEnqueueWriteBuffer", || {
            // SAFETY: dst.mem is a live buffer of at least src.len() bytes; src stays valid
            // and unwritten until the ticket completes (the caller's promise).
            unsafe {
                cq::enqueue_write_buffer(
                    stream.queue,
                    dst.mem,
                    CL_NON_BLOCKING,
                    0,
                    src.len(),
                    src.ptr().cast_const().cast(),
                    0,
                    ptr::null(),
                )
            }
        })
    }

    unsafe fn download(&self, stream: &OpenClStream, src: &OpenClMemory, dst: HostSpan) -> Result<Ticket> {
        if src.host_ptr == dst.ptr().cast_const() {
            return self.map_unmap(stream, src.mem, dst.len(), clmem::CL_MAP_READ);
        }
        self.enqueued(stream, "clEnqueueReadBuffer", || {
            // SAFETY: src.mem is a live buffer of at least dst.len() bytes; dst stays valid
            // and untouched until the ticket completes (the caller's promise).
            unsafe {
                cq::enqueue_read_buffer(
                    stream.queue,
                    src.mem,
                    CL_NON_BLOCKING,
                    0,
                    dst.len(),
                    dst.ptr().cast(),
                    0,
                    ptr::null(),
                )
            }
        })
    }

    unsafe fn fill(
        &self,
        stream: &OpenClStream,
        dst: &OpenClMemory,
        pattern: &[u8],
        bytes: usize,
    ) -> Result<Ticket> {
        self.enqueued(stream, "clEnqueueFillBuffer", || {
            // SAFETY: dst.mem is live and holds at least `bytes`; the runtime copies the
            // pattern at enqueue time.
            unsafe {
                cq::enqueue_fill_buffer(
                    stream.queue,
                    dst.mem,
                    pattern.as_ptr().cast(),
                    pattern.len(),
                    0,
                    bytes,
                    0,
                    ptr::null(),
                )
            }
        })
    }

    unsafe fn copy(
        &self,
        stream: &OpenClStream,
        src: &OpenClMemory,
        dst: &OpenClMemory,
        bytes: usize,
    ) -> Result<Ticket> {
        self.enqueued(stream, "clEnqueueCopyBuffer", || {
            // SAFETY: both buffers are live, distinct and hold at least `bytes` on this context.
            unsafe { cq::enqueue_copy_buffer(stream.queue, src.mem, dst.mem, 0, 0, bytes, 0, ptr::null()) }
        })
    }

    fn wait_on(&self, stream: &OpenClStream, ticket: &Ticket) -> Result<()> {
        let mut events = Vec::new();
        for part in ticket.parts() {
            match (&*part as &dyn Any).downcast_ref::<OpenClEvent>() {
                Some(event) if event.context == self.context => events.push(event.raw()),
                // Another context or runtime: wait here.
                _ => part.wait()?,
            }
        }
        if events.is_empty() {
            return Ok(());
        }
        // SAFETY: the events are live (the ticket holds them) and of this context.
        let barrier =
            unsafe { cq::enqueue_barrier_with_wait_list(stream.queue, events.len() as u32, events.as_ptr()) }
                .map_err(|status| cl_error("clEnqueueBarrierWithWaitList", status))?;
        release(barrier);
        Ok(())
    }

    fn marker(&self, stream: &OpenClStream) -> Result<Ticket> {
        self.enqueued(stream, "clEnqueueMarkerWithWaitList", || {
            // SAFETY: the queue is live; an empty wait list marks everything enqueued so far.
            unsafe { cq::enqueue_marker_with_wait_list(stream.queue, 0, ptr::null()) }
        })
    }

    fn synchronize(&self) -> Result<()> {
        cq::finish(self.stream.queue).map_err(|status| cl_error("clFinish", status))
    }

    fn raw(&self) -> RawDevice {
        RawDevice::OpenCl { context: self.context, queue: self.stream.queue, device: self.device }
    }
}
