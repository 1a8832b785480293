//! The OpenCL [`Backend`] implementation: one context and one in-order queue per device.

use std::ffi::c_void;
use std::ptr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use cl3::command_queue as cq;
use cl3::device as dev;
use cl3::info_type::InfoType;
use cl3::memory as clmem;
use cl3::types::{CL_BLOCKING, cl_command_queue, cl_context, cl_device_id, cl_event, cl_mem};

use super::cl_error;
use super::memory::{MappedHostMemory, OpenClMemory};
use crate::backend::{Backend, DeviceMemory, RawDevice, check_fits};
use crate::device::{DeviceInfo, MemoryInfo, MemorySource};
use crate::error::{BackendKind, Error, Result, RuntimeCode};
use crate::host_memory::HostMemory;

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

/// One OpenCL device with its own context and in-order command queue.
#[derive(Debug)]
pub struct OpenClBackend {
    info: DeviceInfo,
    options: OpenClOptions,
    device: cl_device_id,
    context: cl_context,
    queue: cl_command_queue,
    max_alloc: u64,
    held: Arc<AtomicU64>,
}

// SAFETY: OpenCL handles may be used from any thread (OpenCL 3.0 appendix A.2: every API call
// except clSetKernelArg/clCloneKernel is thread-safe); this value owns its context and queue.
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

/// Releases the event of a blocking command, which is complete when the call returns.
fn release(event: cl_event) {
    // SAFETY: event was returned by an enqueue call and is released exactly once here; the
    // status is ignored because a failed release only leaks.
    let _ = unsafe { cl3::event::release_event(event) };
}

/// Waits for `event` and releases it.
fn complete(call: &'static str, event: cl_event) -> Result<()> {
    let waited = cl3::event::wait_for_events(&[event]);
    // SAFETY: event was returned by an enqueue call and is released exactly once here.
    let _ = unsafe { cl3::event::release_event(event) };
    waited.map_err(|code| cl_error(call, code))
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
        let info = DeviceInfo {
            name: info_string(device, dev::CL_DEVICE_NAME).unwrap_or_else(|| "OpenCL device".into()),
            backend: BackendKind::OpenCl,
            vendor: info_string(device, dev::CL_DEVICE_VENDOR).unwrap_or_default(),
            shares_host_memory: info_u64(device, dev::CL_DEVICE_HOST_UNIFIED_MEMORY).unwrap_or(0) != 0
                || kind & dev::CL_DEVICE_TYPE_CPU != 0,
            is_gpu: kind & dev::CL_DEVICE_TYPE_GPU != 0,
            total_memory: info_u64(device, dev::CL_DEVICE_GLOBAL_MEM_SIZE).unwrap_or(0),
        };
        let max_alloc = info_u64(device, dev::CL_DEVICE_MAX_MEM_ALLOC_SIZE).unwrap_or(info.total_memory);
        let context = cl3::context::create_context(&[device], ptr::null(), None, ptr::null_mut())
            .map_err(|code| cl_error("clCreateContext", code))?;
        // SAFETY: context was just created for `device`; properties 0 asks for an in-order queue.
        #[allow(deprecated)]
        let queue = match unsafe { cq::create_command_queue(context, device, 0) } {
            Ok(queue) => queue,
            Err(code) => {
                // SAFETY: releasing the context created above, which nothing else holds.
                let _ = unsafe { cl3::context::release_context(context) };
                return Err(cl_error("clCreateCommandQueue", code));
            }
        };
        Ok(OpenClBackend {
            info,
            options,
            device,
            context,
            queue,
            max_alloc,
            held: Arc::new(AtomicU64::new(0)),
        })
    }

    fn memory<'m>(&self, memory: &'m DeviceMemory) -> Result<&'m OpenClMemory> {
        memory.handle::<OpenClMemory>().ok_or_else(|| {
            Error::invalid("OpenCL device", format!("expected memory of an OpenCL device, got {memory:?}"))
        })
    }

    fn create(&self, bytes: usize, flags: u64, host_ptr: *mut c_void) -> Result<OpenClMemory> {
        let held = self.held.clone();
        if bytes == 0 {
            return Ok(OpenClMemory { mem: ptr::null_mut(), len: 0, host_ptr: ptr::null(), held });
        }
        self.check_size(bytes)?;
        // SAFETY: context is live; host_ptr is null or (USE_HOST_PTR) valid for `bytes` bytes
        // for the lifetime of the buffer, which alias_host's caller guarantees.
        let mem = unsafe { clmem::create_buffer(self.context, flags, bytes, host_ptr) }
            .map_err(|code| self.allocation_error("clCreateBuffer", bytes, code))?;
        held.fetch_add(bytes as u64, Ordering::Relaxed);
        Ok(OpenClMemory { mem, len: bytes, host_ptr: host_ptr.cast_const().cast(), held })
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
    fn allocation_error(&self, call: &'static str, bytes: usize, code: i32) -> Error {
        match code {
            -4 | -5 | -6 | -61 => Error::OutOfMemory {
                device: self.info.name.clone(),
                requested: bytes,
                code: Some(RuntimeCode::OpenCl(code)),
            },
            _ => cl_error(call, code),
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
            .map_err(|code| self.allocation_error("clCreateBuffer", bytes, code))?;
        // SAFETY: the queue is live (self holds it); the owner below releases this reference.
        if let Err(code) = unsafe { cq::retain_command_queue(self.queue) } {
            // SAFETY: releasing the buffer created above, which nothing else holds.
            let _ = unsafe { clmem::release_mem_object(mem) };
            return Err(cl_error("clRetainCommandQueue", code));
        }
        // From here on, dropping `owner` releases the buffer and the queue (and unmaps).
        let mut owner = MappedHostMemory { queue: self.queue, mem, ptr: ptr::null_mut() };
        let mut mapped: cl_mem = ptr::null_mut();
        let map_flags = clmem::CL_MAP_READ | clmem::CL_MAP_WRITE;
        // SAFETY: mem is a live buffer of `bytes` on this queue's context; blocking map.
        let event = unsafe {
            cq::enqueue_map_buffer(
                self.queue,
                mem,
                CL_BLOCKING,
                map_flags,
                0,
                bytes,
                &mut mapped,
                0,
                ptr::null(),
            )
        }
        .map_err(|code| self.allocation_error("clEnqueueMapBuffer", bytes, code))?;
        owner.ptr = mapped;
        release(event);
        let Some(start) = ptr::NonNull::new(mapped.cast::<u8>()) else {
            return Err(cl_error("clEnqueueMapBuffer", cl3::error_codes::CL_INVALID_VALUE));
        };
        // SAFETY: the map succeeded, so [start, start + bytes) is writable host memory until
        // the unmap in owner's drop; zeroing initializes every byte.
        unsafe { ptr::write_bytes(start.as_ptr(), 0, bytes) };
        // SAFETY: (1) the mapping is valid and initialized until `owner` is dropped; (2) only
        // the returned block reaches these bytes (the buffer's handle stays inside `owner`);
        // (3) it is the runtime's pinned host memory, SPEC section 3's meaning of pinned for
        // OpenCL.
        Ok(unsafe { HostMemory::from_foreign(start, bytes, true, Box::new(owner)) })
    }

    /// Maps the whole of an aliased buffer and unmaps it again: the runtime makes the host
    /// block current (`CL_MAP_READ`) or takes it as the new contents
    /// (`CL_MAP_WRITE_INVALIDATE_REGION`). On a host-sharing device no byte moves.
    fn map_unmap(&self, mem: cl_mem, len: usize, flags: u64) -> Result<()> {
        let mut mapped: cl_mem = ptr::null_mut();
        // SAFETY: mem is a live buffer of len bytes on this queue's context; blocking map.
        let event = unsafe {
            cq::enqueue_map_buffer(self.queue, mem, CL_BLOCKING, flags, 0, len, &mut mapped, 0, ptr::null())
        }
        .map_err(|code| cl_error("clEnqueueMapBuffer", code))?;
        release(event);
        // SAFETY: unmapping the pointer the map above returned, once.
        let event = unsafe { cq::enqueue_unmap_mem_object(self.queue, mem, mapped, 0, ptr::null()) }
            .map_err(|code| cl_error("clEnqueueUnmapMemObject", code))?;
        complete("clEnqueueUnmapMemObject", event)
    }
}

impl Drop for OpenClBackend {
    fn drop(&mut self) {
        // SAFETY: queue and context were created by `open` and are released once; statuses
        // are ignored because drop must not panic (a failed release only leaks).
        unsafe {
            let _ = cq::finish(self.queue);
            let _ = cq::release_command_queue(self.queue);
            let _ = cl3::context::release_context(self.context);
        }
    }
}

impl Backend for OpenClBackend {
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
        })
    }

    /// Pinned blocks are runtime-allocated, mapped host memory (see `allocate_mapped`); an
    /// empty pinned block has nothing to map.
    fn allocate_host(&self, bytes: usize, pinned: bool) -> Result<HostMemory> {
        match (pinned, bytes) {
            (false, _) => HostMemory::allocate(bytes),
            (true, 0) => HostMemory::allocate_locked(0),
            (true, _) => self.allocate_mapped(bytes),
        }
    }

    fn allocate(&self, bytes: usize) -> Result<DeviceMemory> {
        let memory = self.create(bytes, clmem::CL_MEM_READ_WRITE, ptr::null_mut())?;
        Ok(DeviceMemory::new(bytes, false, Box::new(memory)))
    }

    fn zero_copy(&self, bytes: usize) -> bool {
        self.info.shares_host_memory && bytes >= self.options.zero_copy_min_bytes
    }

    fn alias_host(&self, host: &mut HostMemory) -> Option<Result<DeviceMemory>> {
        if !self.zero_copy(host.len()) {
            return None;
        }
        let flags = clmem::CL_MEM_READ_WRITE | clmem::CL_MEM_USE_HOST_PTR;
        Some(
            self.create(host.len(), flags, host.as_mut_ptr().cast())
                .map(|m| DeviceMemory::new(m.len, true, Box::new(m))),
        )
    }

    fn upload(&self, src: &[u8], dst: &mut DeviceMemory) -> Result<()> {
        check_fits("upload", dst.len(), src.len())?;
        let dst = self.memory(dst)?;
        if src.is_empty() {
            return Ok(());
        }
        if dst.host_ptr == src.as_ptr() {
            return self.map_unmap(dst.mem, src.len(), clmem::CL_MAP_WRITE_INVALIDATE_REGION);
        }
        // SAFETY: dst.mem is a live buffer of src.len() bytes; src stays borrowed until the
        // blocking write completes.
        let event = unsafe {
            cq::enqueue_write_buffer(
                self.queue,
                dst.mem,
                CL_BLOCKING,
                0,
                src.len(),
                src.as_ptr().cast(),
                0,
                ptr::null(),
            )
        }
        .map_err(|code| cl_error("clEnqueueWriteBuffer", code))?;
        release(event);
        Ok(())
    }

    fn download(&self, src: &DeviceMemory, dst: &mut [u8]) -> Result<()> {
        check_fits("download", src.len(), dst.len())?;
        let src = self.memory(src)?;
        if dst.is_empty() {
            return Ok(());
        }
        if src.host_ptr == dst.as_ptr() {
            return self.map_unmap(src.mem, dst.len(), clmem::CL_MAP_READ);
        }
        // SAFETY: src.mem is a live buffer of dst.len() bytes; dst stays exclusively borrowed
        // until the blocking read completes.
        let event = unsafe {
            cq::enqueue_read_buffer(
                self.queue,
                src.mem,
                CL_BLOCKING,
                0,
                dst.len(),
                dst.as_mut_ptr().cast(),
                0,
                ptr::null(),
            )
        }
        .map_err(|code| cl_error("clEnqueueReadBuffer", code))?;
        release(event);
        Ok(())
    }

    fn fill(&self, dst: &mut DeviceMemory, pattern: &[u8], bytes: usize) -> Result<()> {
        check_fits("fill", dst.len(), bytes)?;
        let dst = self.memory(dst)?;
        if !matches!(pattern.len(), 1 | 2 | 4 | 8 | 16 | 32 | 64 | 128)
            || !bytes.is_multiple_of(pattern.len())
        {
            return Err(Error::invalid(
                "fill",
                format!(
                    "expected a pattern of 1, 2, 4, ... 128 bytes dividing {bytes}; got {} bytes",
                    pattern.len()
                ),
            ));
        }
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: dst.mem is live and holds at least `bytes`; the runtime copies the pattern
        // at enqueue time.
        let event = unsafe {
            cq::enqueue_fill_buffer(
                self.queue,
                dst.mem,
                pattern.as_ptr().cast(),
                pattern.len(),
                0,
                bytes,
                0,
                ptr::null(),
            )
        }
        .map_err(|code| cl_error("clEnqueueFillBuffer", code))?;
        complete("clEnqueueFillBuffer", event)
    }

    fn copy(&self, src: &DeviceMemory, dst: &mut DeviceMemory, bytes: usize) -> Result<()> {
        check_fits("copy", src.len().min(dst.len()), bytes)?;
        let (src, dst) = (self.memory(src)?, self.memory(dst)?);
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: both buffers are live, distinct and hold at least `bytes` on this context.
        let event =
            unsafe { cq::enqueue_copy_buffer(self.queue, src.mem, dst.mem, 0, 0, bytes, 0, ptr::null()) }
                .map_err(|code| cl_error("clEnqueueCopyBuffer", code))?;
        complete("clEnqueueCopyBuffer", event)
    }

    fn synchronize(&self) -> Result<()> {
        cq::finish(self.queue).map_err(|code| cl_error("clFinish", code))
    }

    fn raw(&self) -> RawDevice {
        RawDevice::OpenCl { context: self.context, queue: self.queue, device: self.device }
    }
}
