//! The CUDA [`Runtime`]: one retained primary context and one default stream
//! per device (a blocking stream, so it is ordered with the legacy default stream that CuPy,
//! PyTorch and Numba launch on by default; more, non-blocking, streams can be made),
//! asynchronous copies whose tickets are events recorded after them.
//!
//! **Host memory paths.** Pinned blocks come from `cuMemHostAlloc` with
//! `CU_MEMHOSTALLOC_PORTABLE` only, never write-combined, because the CPU reads a buffer's host
//! copy (write-combined memory is uncached, and CPU reads of it are very slow). A transfer
//! knows how its host side is pinned from the host block itself ([`Pinning`]; lazybuf never
//! probes the driver with a pointer it may not know): memory the driver has page-locked is
//! copied directly by DMA; large pageable memory is pipelined through pinned staging
//! (`staging.rs`); small pageable memory takes the driver's own path.
//!
//! **Registering pageable blocks.** lazybuf owns its host blocks, and its caches hand the
//! same blocks to buffer after buffer. A pageable block of at least [`REGISTER_MIN_BYTES`]
//! that takes part in a second transfer is registered with the driver (`cuMemHostRegister`,
//! portable), so that transfer and every later one run at pinned speed, with no staging; the
//! first transfer pays nothing extra. Registration costs about as much as touching the pages
//! once, so a block moved twice has already paid for it; at most a quarter of the machine's
//! memory is registered at once, and a refused registration leaves the block pageable (the
//! staging path still runs). The block is unregistered when it is freed. This policy is an
//! estimate from the H100 measurements in docs/benchmarks/gpu.md (raw pageable copies reach
//! 0.14-0.23 of pinned bandwidth there, staged ones 0.4-0.57); the thresholds are to be tuned
//! there.

use std::any::Any;
use std::sync::{Arc, PoisonError};

use cudarc::driver::{result, sys};

use super::memory::{CudaEvent, CudaMemory, CudaStream, Shared};
use super::pinned::{PageRegistration, PinnedBlock};
use super::staging::{PIPELINE_MIN, Staging};
use super::{Context, cuda_error};
use crate::backend::{
    Allocated, DeviceInfo, HostSpan, MemoryInfo, MemoryKind, MemorySource, RawDevice, RawMemory, RawStream,
    Runtime, Ticket,
};
use crate::error::{BackendKind, Error, Result};
use crate::host_memory::{HostMemory, Pinning};

/// Pageable host blocks at least this large are registered with the driver on their second
/// transfer (see the module docs).
pub const REGISTER_MIN_BYTES: usize = 1 << 20;

/// One CUDA device.
#[derive(Debug)]
pub struct CudaBackend {
    info: DeviceInfo,
    context: Arc<Context>,
    stream: Arc<CudaStream>,
    /// Contexts (this one included) whose memory this device copies directly.
    peers: Vec<Arc<Context>>,
    /// Live allocations and the pinned staging for large pageable transfers.
    shared: Arc<Shared>,
    /// Whether the device has managed memory (`CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY`).
    managed_memory: bool,
    /// Whether the host and the device may use managed memory at once, which prefetching
    /// needs (`CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS`).
    concurrent_managed: bool,
}

/// Device memory and managed memory are aligned to 256 bytes (the CUDA programming guide:
/// "at least 256-byte aligned").
const DEVICE_ALIGN: usize = 256;

/// `cuMemPrefetchAsync`'s destination for host memory (`CU_DEVICE_CPU`).
const CU_DEVICE_CPU: sys::CUdevice = -1;

fn attribute(device: sys::CUdevice, attribute: sys::CUdevice_attribute) -> Result<i32> {
    // SAFETY: device comes from cuDeviceGet.
    unsafe { result::device::get_attribute(device, attribute) }
        .map_err(|err| cuda_error("cuDeviceGetAttribute", err))
}

impl CudaBackend {
    /// Opens the device of `context` with a new stream; `peers` are the contexts it copies
    /// from directly.
    pub(super) fn open(context: Arc<Context>, peers: Vec<Arc<Context>>) -> Result<CudaBackend> {
        use sys::CUdevice_attribute::*;
        let device = context.device();
        let name = result::device::get_name(device).map_err(|err| cuda_error("cuDeviceGetName", err))?;
        // SAFETY: device comes from cuDeviceGet.
        let total = unsafe { result::device::total_mem(device) }
            .map_err(|err| cuda_error("cuDeviceTotalMem", err))?;
        let major = attribute(device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = attribute(device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let integrated = attribute(device, CU_DEVICE_ATTRIBUTE_INTEGRATED)? != 0;
        // Devices that cannot answer have no managed memory, as far as lazybuf is concerned.
        let managed_memory = attribute(device, CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY).unwrap_or(0) != 0;
        let concurrent_managed = managed_memory
            && attribute(device, CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS).unwrap_or(0) != 0;
        let stream = {
            let _bound = context.bind()?;
            // Blocking: ordered with the legacy default stream (see CudaStream::create).
            Arc::new(CudaStream::create(&context, true)?)
        };
        Ok(CudaBackend {
            info: DeviceInfo {
                name,
                backend: BackendKind::CUDA,
                vendor: "NVIDIA".into(),
                shares_host_memory: integrated,
                is_gpu: true,
                total_memory: total as u64,
                compute_capability: Some((major.max(0) as u32, minor.max(0) as u32)),
                // cuDeviceGet hands out the ordinal as the device.
                ordinal: Some(device.max(0) as u32),
                shared_memory: managed_memory,
                dlpack: crate::backend::DlpackDevices {
                    device: Some(crate::backend::DlpackDevice::cuda(device.max(0) as u32)),
                    shared: Some(crate::backend::DlpackDevice::cuda_managed(device.max(0) as u32)),
                },
            },
            context,
            stream,
            peers,
            shared: Arc::new(Shared::default()),
            managed_memory,
            concurrent_managed,
        })
    }

    /// `bytes` of managed memory ([`MemoryKind::Shared`]), or why the device has none.
    fn allocate_managed(&self, bytes: usize) -> Result<CudaMemory> {
        if !self.managed_memory {
            return Err(Error::invalid(
                "allocate_shared",
                format!(
                    "{} has no managed memory (CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY is 0); expected a device that supports cuMemAllocManaged",
                    self.info.name
                ),
            ));
        }
        let _bound = self.context.bind()?;
        CudaMemory::allocate_managed(&self.context, &self.shared, bytes, &self.info.name)
    }

    /// The staging pipeline, made on first use; `None` when no staging can be had (pinning
    /// refused): the caller then takes the driver's path, which moves the same bytes, slower.
    fn staging(&self) -> Option<Arc<Staging>> {
        let mut staging = self.shared.staging.lock().unwrap_or_else(PoisonError::into_inner);
        if staging.is_none() {
            *staging = Staging::new(&self.context, &self.info.name).ok().map(Arc::new);
        }
        staging.clone()
    }

    /// Whether a transfer of `host` should go through staging.
    fn needs_staging(host: &HostSpan) -> bool {
        host.len() >= PIPELINE_MIN && !host.pinning().is_dma_ready_for(BackendKind::CUDA)
    }

    /// A ticket for what was just enqueued on `stream` (the context is current), recorded
    /// while `_order` ([`CudaStream::enqueue`]) is still held.
    fn ticket(stream: &CudaStream, _order: &std::sync::MutexGuard<'_, ()>) -> Result<Ticket> {
        Ok(Ticket::new(stream.record()?))
    }
}

impl Runtime for CudaBackend {
    /// A copy enqueued on a CUDA stream completes before later work on that stream starts.
    const ORDERED_UPLOADS: bool = true;

    type Memory = CudaMemory;
    type Stream = CudaStream;

    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn memory_info(&self) -> Result<MemoryInfo> {
        let _bound = self.context.bind()?;
        let (free, total) = result::mem_get_info().map_err(|err| cuda_error("cuMemGetInfo", err))?;
        Ok(MemoryInfo { free: free as u64, total: total as u64, source: MemorySource::Runtime, cached: 0 })
    }

    fn default_stream(&self) -> Arc<CudaStream> {
        self.stream.clone()
    }

    fn create_stream(&self) -> Result<Arc<CudaStream>> {
        let _bound = self.context.bind()?;
        Ok(Arc::new(CudaStream::create(&self.context, false)?))
    }

    unsafe fn wrap_stream(&self, raw: RawStream) -> Result<Arc<CudaStream>> {
        match raw {
            // The driver cannot tell a stream's context without another entry point; that it
            // belongs to this device's is the caller's promise.
            RawStream::Cuda(stream) => Ok(Arc::new(CudaStream::borrowed(&self.context, stream.cast()))),
            other => Err(Error::invalid("wrap_stream", format!("expected a CUDA stream, got {other:?}"))),
        }
    }

    /// Pinned host blocks are `cuMemHostAlloc`'s (portable); shared memory is managed memory.
    fn allocate(&self, kind: MemoryKind, bytes: usize) -> Result<Allocated<CudaMemory>> {
        Ok(match kind {
            MemoryKind::Host { pinned: false } => Allocated::Host(HostMemory::allocate(bytes)?),
            MemoryKind::Host { pinned: true } if bytes == 0 => {
                Allocated::Host(HostMemory::allocate_locked(0)?)
            }
            MemoryKind::Host { pinned: true } => {
                let _bound = self.context.bind()?;
                let name = format!("page-locked host memory for {}", self.info.name);
                Allocated::Host(PinnedBlock::allocate(
                    &self.context,
                    bytes,
                    sys::CU_MEMHOSTALLOC_PORTABLE,
                    &name,
                )?)
            }
            MemoryKind::Device => {
                let _bound = self.context.bind()?;
                Allocated::Memory(CudaMemory::allocate(&self.context, &self.shared, bytes, &self.info.name)?)
            }
            MemoryKind::Shared => Allocated::Memory(self.allocate_managed(bytes)?),
        })
    }

    unsafe fn borrow(&self, raw: RawMemory, len: usize) -> Result<CudaMemory> {
        let RawMemory::Cuda(ptr) = raw else {
            return Err(Error::invalid("borrow", format!("expected a CUDA device pointer, got {raw:?}")));
        };
        if len > 0 {
            let mut ordinal: std::ffi::c_int = -1;
            let attribute = sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL;
            let _bound = self.context.bind()?;
            // SAFETY: `ordinal` is a valid out-pointer of the attribute's type (int).
            let status = unsafe { sys::cuPointerGetAttribute((&raw mut ordinal).cast(), attribute, ptr) };
            if status.result().is_err() || ordinal != self.context.device() {
                return Err(Error::invalid(
                    "borrow",
                    format!(
                        "{ptr:#x} is not memory of {} (CUDA device {})",
                        self.info.name,
                        self.context.device()
                    ),
                ));
            }
        }
        Ok(CudaMemory::borrowed(&self.context, &self.shared, ptr))
    }

    fn alignment(&self, kind: MemoryKind) -> usize {
        match kind {
            MemoryKind::Device | MemoryKind::Shared => DEVICE_ALIGN,
            // cuMemHostAlloc and the locked fallback hand out whole pages.
            MemoryKind::Host { pinned: true } => 4096,
            MemoryKind::Host { pinned: false } => crate::host_memory::HEAP_ALIGN,
        }
    }

    unsafe fn prefetch(
        &self,
        stream: &CudaStream,
        memory: &CudaMemory,
        len: usize,
        to_device: bool,
    ) -> Result<Ticket> {
        // Prefetching is a hint: memory that is not managed, or a device where the host and
        // the device cannot use managed memory at once (which the driver refuses to prefetch
        // on), needs nothing.
        if !memory.managed || memory.ptr == 0 || !self.concurrent_managed {
            return Ok(Ticket::done());
        }
        let target = if to_device { self.context.device() } else { CU_DEVICE_CPU };
        let _bound = self.context.bind()?;
        let _order = stream.enqueue();
        // SAFETY: [ptr, ptr + len) is the managed allocation `memory` owns; the stream is live.
        unsafe { sys::cuMemPrefetchAsync(memory.ptr, len, target, stream.stream) }
            .result()
            .map_err(|err| cuda_error("cuMemPrefetchAsync", err))?;
        Self::ticket(stream, &_order)
    }

    fn owns(&self, memory: &CudaMemory) -> bool {
        Arc::ptr_eq(&memory.context, &self.context)
    }

    fn owns_stream(&self, stream: &CudaStream) -> bool {
        Arc::ptr_eq(&stream.context, &self.context)
    }

    unsafe fn upload(&self, stream: &CudaStream, src: HostSpan, dst: &CudaMemory) -> Result<Ticket> {
        let dst = dst.ptr;
        let _bound = self.context.bind()?;
        let _order = stream.enqueue();
        if Self::needs_staging(&src)
            && let Some(staging) = self.staging()
        {
            return Ok(staging.upload(stream.stream, src, dst));
        }
        // SAFETY: dst holds at least src.len() bytes; src stays valid and unwritten until the
        // event recorded after the copy completes (the caller's promise).
        unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src.ptr().cast(), src.len(), stream.stream) }
            .result()
            .map_err(|err| cuda_error("cuMemcpyHtoDAsync", err))?;
        Self::ticket(stream, &_order)
    }

    unsafe fn download(&self, stream: &CudaStream, src: &CudaMemory, dst: HostSpan) -> Result<Ticket> {
        let src = src.ptr;
        let _bound = self.context.bind()?;
        let _order = stream.enqueue();
        if Self::needs_staging(&dst)
            && let Some(staging) = self.staging()
        {
            return Ok(staging.download(stream.stream, src, dst));
        }
        // SAFETY: src holds at least dst.len() bytes; dst stays valid and untouched until the
        // event recorded after the copy completes (the caller's promise).
        unsafe { sys::cuMemcpyDtoHAsync_v2(dst.ptr().cast(), src, dst.len(), stream.stream) }
            .result()
            .map_err(|err| cuda_error("cuMemcpyDtoHAsync", err))?;
        Self::ticket(stream, &_order)
    }

    unsafe fn fill(
        &self,
        stream: &CudaStream,
        dst: &CudaMemory,
        pattern: &[u8],
        bytes: usize,
    ) -> Result<Ticket> {
        let dst = dst.ptr;
        // The pattern is 1, 2, 4, 8 or 16 bytes and divides `bytes` (checked by Stream); its
        // period (the shortest repeating unit) divides it, so it is 1, 2, 4, 8 or 16 too.
        let period = period(pattern);
        let _bound = self.context.bind()?;
        let _order = stream.enqueue();
        // dst holds at least `bytes` bytes and is 256-byte aligned (cuMemAlloc), so memsets of
        // 2- and 4-byte units are aligned and stay inside the allocation.
        let (s, count) = (stream.stream, bytes / period);
        let word =
            |at: usize| u32::from_ne_bytes([pattern[at], pattern[at + 1], pattern[at + 2], pattern[at + 3]]);
        let status = match period {
            // SAFETY: see above; `count` bytes from dst lie in the allocation.
            1 => unsafe { sys::cuMemsetD8Async(dst, pattern[0], count, s) },
            // SAFETY: see above; `count` 2-byte units from dst lie in the allocation.
            2 => unsafe {
                sys::cuMemsetD16Async(dst, u16::from_ne_bytes([pattern[0], pattern[1]]), count, s)
            },
            // SAFETY: see above; `count` 4-byte units from dst lie in the allocation.
            4 => unsafe { sys::cuMemsetD32Async(dst, word(0), count, s) },
            // Longer elements (8 and 16 bytes): one strided 4-byte memset per word of the
            // element, each row one element long.
            _ => (0..period / 4)
                .map(|w| {
                    // SAFETY: rows of `period` bytes, `count` of them, one 4-byte word each at
                    // offset 4w: all inside the allocation and 4-byte aligned.
                    unsafe { sys::cuMemsetD2D32Async(dst + 4 * w as u64, period, word(4 * w), 1, count, s) }
                })
                .find(|status| *status != sys::CUresult::CUDA_SUCCESS)
                .unwrap_or(sys::CUresult::CUDA_SUCCESS),
        };
        status.result().map_err(|err| cuda_error("cuMemset", err))?;
        Self::ticket(stream, &_order)
    }

    unsafe fn copy(
        &self,
        stream: &CudaStream,
        src: &CudaMemory,
        dst: &CudaMemory,
        bytes: usize,
    ) -> Result<Ticket> {
        let (src, dst) = (src.ptr, dst.ptr);
        let _bound = self.context.bind()?;
        let _order = stream.enqueue();
        // SAFETY: both allocations hold at least `bytes` and are distinct (`dst` is borrowed
        // mutably while `src` is borrowed shared).
        unsafe { result::memcpy_dtod_async(dst, src, bytes, stream.stream) }
            .map_err(|err| cuda_error("cuMemcpyDtoDAsync", err))?;
        Self::ticket(stream, &_order)
    }

    fn can_copy_from_peer(&self, src: &CudaBackend) -> bool {
        self.peers.iter().any(|peer| Arc::ptr_eq(peer, &src.context))
    }

    unsafe fn copy_from_peer(
        &self,
        stream: &CudaStream,
        _src_runtime: &CudaBackend,
        source: &CudaMemory,
        dst: &CudaMemory,
        bytes: usize,
    ) -> Option<Result<Ticket>> {
        let peer = self.peers.iter().find(|peer| Arc::ptr_eq(peer, &source.context))?;
        let dst = dst.ptr;
        let copy = || {
            let _bound = self.context.bind()?;
            let _order = stream.enqueue();
            // SAFETY: source.ptr holds at least `bytes` in `peer`, dst holds at least `bytes`
            // here; both stay allocated until the copy's event completes (the engine waits).
            unsafe {
                result::memcpy_peer_async(
                    self.context.raw(),
                    dst,
                    peer.raw(),
                    source.ptr,
                    bytes,
                    stream.stream,
                )
            }
            .map_err(|err| cuda_error("cuMemcpyPeerAsync", err))?;
            Self::ticket(stream, &_order)
        };
        Some(copy())
    }

    fn wait_on(&self, stream: &CudaStream, ticket: &Ticket) -> Result<()> {
        let _bound = self.context.bind()?;
        for part in ticket.parts() {
            match (&*part as &dyn Any).downcast_ref::<CudaEvent>() {
                // SAFETY: live stream and event (the ticket holds the event); events of other
                // contexts may be waited on by any stream.
                Some(event) => unsafe { sys::cuStreamWaitEvent(stream.stream, event.event, 0) }
                    .result()
                    .map_err(|err| cuda_error("cuStreamWaitEvent", err))?,
                None => part.wait()?,
            }
        }
        Ok(())
    }

    fn marker(&self, stream: &CudaStream) -> Result<Ticket> {
        let _bound = self.context.bind()?;
        // An event, as a command's, never between another command and its event.
        let _order = stream.enqueue();
        Self::ticket(stream, &_order)
    }

    fn synchronize(&self) -> Result<()> {
        let _bound = self.context.bind()?;
        // A failure the stream reports here is no other command's: none is between its
        // enqueue and its event meanwhile.
        let _order = self.stream.enqueue();
        // SAFETY: the stream is live for as long as self.
        unsafe { result::stream::synchronize(self.stream.stream) }
            .map_err(|err| cuda_error("cuStreamSynchronize", err))
    }

    fn raw(&self) -> RawDevice {
        RawDevice::Cuda { context: self.context.raw().cast(), stream: self.stream.stream.cast() }
    }

    fn prepare_host(&self, host: &mut HostMemory) {
        // Adopted memory is lent: its pages may hold the lender's other data, not for lazybuf
        // to page-lock.
        if host.pinning() != Pinning::Pageable
            || host.is_adopted()
            || host.len() < REGISTER_MIN_BYTES
            || host.count_transfer() < 2
        {
            return;
        }
        // A refused registration (the budget, the driver) leaves the block pageable: the
        // staging path moves the same bytes.
        let _ = self.context.bind().and_then(|_bound| PageRegistration::register(&self.context, host));
    }

    fn trim(&self) {
        self.shared.drop_staging();
    }

    fn take_deferred_errors(&self) -> (Vec<Error>, u64) {
        self.context.deferred.take()
    }
}

/// The shortest of 1, 2 and 4 bytes that `pattern` repeats, else its own length.
fn period(pattern: &[u8]) -> usize {
    [1, 2, 4]
        .into_iter()
        .find(|&p| pattern.len().is_multiple_of(p) && pattern.chunks(p).all(|c| c == &pattern[..p]))
        .unwrap_or(pattern.len())
}

#[cfg(test)]
mod period_tests {
    #[test]
    fn periods() {
        assert_eq!(super::period(&[7]), 1);
        assert_eq!(super::period(&[7, 7, 7, 7, 7, 7, 7, 7]), 1);
        assert_eq!(super::period(&[1, 2, 1, 2]), 2);
        assert_eq!(super::period(&[0, 0, 128, 63, 0, 0, 128, 63]), 4);
        assert_eq!(super::period(&[0, 0, 0, 0, 0, 0, 248, 63]), 8);
        assert_eq!(super::period(&[1, 2, 3]), 3);
    }
}
