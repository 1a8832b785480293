//! The CUDA [`Backend`] implementation: one retained primary context and one non-blocking
//! stream per device. Every operation makes the context current on the calling thread (and
//! restores the thread's previous context afterwards), enqueues on the stream and waits for
//! it, so user kernels launched on that stream (see [`crate::Device::raw`]) are ordered with
//! lazybuf's copies.
//!
//! Host memory: pinned blocks come from `cuMemHostAlloc` with `CU_MEMHOSTALLOC_PORTABLE`
//! only, never write-combined, because the CPU reads a buffer's host copy (write-combined
//! memory is uncached, and CPU reads of it are very slow). Transfers ask the driver whether
//! the host side is such memory (`cuMemHostGetFlags`, which succeeds only for page-locked
//! memory the driver knows): pinned memory is copied directly by DMA; large pageable memory
//! is pipelined through pinned staging (`staging.rs`); small pageable memory takes the
//! driver's own path.

use std::sync::{Arc, Mutex};

use cudarc::driver::{result, sys};

use super::memory::{CudaMemory, PinnedBlock};
use super::staging::{PIPELINE_MIN, Staging, Stream};
use super::{Context, cuda_error};
use crate::backend::{Backend, DeviceMemory, RawDevice, check_fits};
use crate::device::{Device, DeviceInfo, MemoryInfo, MemorySource};
use crate::error::{BackendKind, Error, Result};
use crate::host_memory::HostMemory;

/// Patterns that no memset covers are filled by uploading this much of the repeated
/// pattern, then doubling it with device-to-device copies.
const FILL_SEED: usize = 64 << 10;

/// One CUDA device.
#[derive(Debug)]
pub struct CudaBackend {
    info: DeviceInfo,
    capability: (u32, u32),
    context: Arc<Context>,
    stream: sys::CUstream,
    /// Contexts (this one included) whose memory this device copies directly.
    peers: Vec<Arc<Context>>,
    /// Pinned staging for large pageable transfers, made on first use.
    staging: Mutex<Option<Staging>>,
}

// SAFETY: the driver API is thread-safe; the stream is only used through driver calls, and
// the staging memory is behind a Mutex.
unsafe impl Send for CudaBackend {}
// SAFETY: see Send.
unsafe impl Sync for CudaBackend {}

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
        let stream = {
            let _bound = context.bind()?;
            result::stream::create(result::stream::StreamKind::NonBlocking)
                .map_err(|err| cuda_error("cuStreamCreate", err))?
        };
        Ok(CudaBackend {
            info: DeviceInfo {
                name,
                backend: BackendKind::Cuda,
                vendor: "NVIDIA".into(),
                shares_host_memory: integrated,
                is_gpu: true,
                total_memory: total as u64,
            },
            capability: (major.max(0) as u32, minor.max(0) as u32),
            context,
            stream,
            peers,
            staging: Mutex::new(None),
        })
    }

    /// The compute capability (major, minor).
    pub fn compute_capability(&self) -> (u32, u32) {
        self.capability
    }

    fn memory<'m>(&self, memory: &'m DeviceMemory) -> Result<&'m CudaMemory> {
        match memory.handle::<CudaMemory>() {
            Some(m) if Arc::ptr_eq(&m.context, &self.context) => Ok(m),
            _ => Err(Error::invalid(
                "CUDA device",
                format!("expected memory of {}, got {memory:?}", self.info.name),
            )),
        }
    }

    /// Waits for everything enqueued on the stream.
    fn complete(&self) -> Result<()> {
        // SAFETY: the stream is live for as long as self.
        unsafe { result::stream::synchronize(self.stream) }
            .map_err(|err| cuda_error("cuStreamSynchronize", err))
    }

    /// Whether `ptr` is page-locked memory the driver knows (so DMA can use it directly).
    fn is_pinned(&self, ptr: *const u8) -> bool {
        let mut flags = 0;
        // SAFETY: flags is a valid out-pointer; the driver only looks the address up.
        let status = unsafe { sys::cuMemHostGetFlags(&mut flags, ptr.cast_mut().cast()) };
        status == sys::CUresult::CUDA_SUCCESS
    }

    /// Runs `transfer` on the staging memory, made on first use. Returns `None` when no
    /// staging can be had (pinning refused): the caller then takes the driver's path, which
    /// moves the same bytes, only slower.
    fn staged(&self, transfer: impl FnOnce(&mut Staging, Stream) -> Result<()>) -> Option<Result<()>> {
        let mut staging = self.staging.lock().unwrap_or_else(|e| e.into_inner());
        if staging.is_none() {
            *staging = Staging::new(&self.context, &self.info.name).ok();
        }
        Some(transfer(staging.as_mut()?, Stream(self.stream)))
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        // SAFETY: the stream was created by `open` and is destroyed once, after its work is
        // done. Statuses are ignored: drop must not panic, and a failed release only leaks.
        unsafe {
            let _bound = self.context.bind();
            let _ = result::stream::synchronize(self.stream);
            let _ = result::stream::destroy(self.stream);
        }
    }
}

impl Backend for CudaBackend {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn memory_info(&self) -> Result<MemoryInfo> {
        let _bound = self.context.bind()?;
        let (free, total) = result::mem_get_info().map_err(|err| cuda_error("cuMemGetInfo", err))?;
        Ok(MemoryInfo { free: free as u64, total: total as u64, source: MemorySource::Runtime })
    }

    fn allocate_host(&self, bytes: usize, pinned: bool) -> Result<HostMemory> {
        if !pinned {
            return HostMemory::allocate(bytes);
        }
        if bytes == 0 {
            return HostMemory::allocate_locked(0);
        }
        let _bound = self.context.bind()?;
        let name = format!("page-locked host memory for {}", self.info.name);
        PinnedBlock::allocate(&self.context, bytes, sys::CU_MEMHOSTALLOC_PORTABLE, &name)
    }

    fn allocate(&self, bytes: usize) -> Result<DeviceMemory> {
        let _bound = self.context.bind()?;
        let memory = CudaMemory::allocate(&self.context, bytes, &self.info.name)?;
        Ok(DeviceMemory::new(bytes, false, Box::new(memory)))
    }

    fn upload(&self, src: &[u8], dst: &mut DeviceMemory) -> Result<()> {
        check_fits("upload", dst.len(), src.len())?;
        let dst = self.memory(dst)?.ptr;
        if src.is_empty() {
            return Ok(());
        }
        let _bound = self.context.bind()?;
        if src.len() >= PIPELINE_MIN
            && !self.is_pinned(src.as_ptr())
            && let Some(done) = self.staged(|staging, stream| staging.upload(stream, src, dst))
        {
            return done;
        }
        // SAFETY: dst holds at least src.len() bytes; src stays borrowed until the stream
        // has completed the copy.
        unsafe { result::memcpy_htod_async(dst, src, self.stream) }
            .map_err(|err| cuda_error("cuMemcpyHtoDAsync", err))?;
        self.complete()
    }

    fn download(&self, src: &DeviceMemory, dst: &mut [u8]) -> Result<()> {
        check_fits("download", src.len(), dst.len())?;
        let src = self.memory(src)?.ptr;
        if dst.is_empty() {
            return Ok(());
        }
        let _bound = self.context.bind()?;
        if dst.len() >= PIPELINE_MIN
            && !self.is_pinned(dst.as_ptr())
            && let Some(done) = self.staged(|staging, stream| staging.download(stream, src, dst))
        {
            return done;
        }
        // SAFETY: src holds at least dst.len() bytes; dst stays exclusively borrowed until
        // the stream has completed the copy.
        unsafe { result::memcpy_dtoh_async(dst, src, self.stream) }
            .map_err(|err| cuda_error("cuMemcpyDtoHAsync", err))?;
        self.complete()
    }

    fn fill(&self, dst: &mut DeviceMemory, pattern: &[u8], bytes: usize) -> Result<()> {
        check_fits("fill", dst.len(), bytes)?;
        let dst = self.memory(dst)?.ptr;
        if pattern.is_empty() || !bytes.is_multiple_of(pattern.len()) {
            return Err(Error::invalid(
                "fill",
                format!(
                    "expected a non-empty pattern whose length divides {bytes}; got {} bytes",
                    pattern.len()
                ),
            ));
        }
        if bytes == 0 {
            return Ok(());
        }
        let _bound = self.context.bind()?;
        // dst holds at least `bytes` bytes and is 256-byte aligned (cuMemAlloc), so a memset
        // of 2- or 4-byte elements is aligned and stays inside the allocation.
        let (stream, count) = (self.stream, bytes / period(pattern));
        let queued = match *pattern {
            // SAFETY: see above; `count` bytes from dst lie in the allocation.
            _ if period(pattern) == 1 => unsafe { sys::cuMemsetD8Async(dst, pattern[0], count, stream) }
                .result()
                .map_err(|err| cuda_error("cuMemsetD8Async", err)),
            // SAFETY: see above; `count` 2-byte elements from dst lie in the allocation.
            [a, b, ..] if period(pattern) == 2 => {
                unsafe { sys::cuMemsetD16Async(dst, u16::from_ne_bytes([a, b]), count, stream) }
                    .result()
                    .map_err(|err| cuda_error("cuMemsetD16Async", err))
            }
            // SAFETY: see above; `count` 4-byte elements from dst lie in the allocation.
            [a, b, c, d, ..] if period(pattern) == 4 => {
                unsafe { sys::cuMemsetD32Async(dst, u32::from_ne_bytes([a, b, c, d]), count, stream) }
                    .result()
                    .map_err(|err| cuda_error("cuMemsetD32Async", err))
            }
            _ => self.fill_by_doubling(dst, pattern, bytes),
        };
        let completed = self.complete();
        queued.and(completed)
    }

    fn copy(&self, src: &DeviceMemory, dst: &mut DeviceMemory, bytes: usize) -> Result<()> {
        check_fits("copy", src.len().min(dst.len()), bytes)?;
        let (src, dst) = (self.memory(src)?.ptr, self.memory(dst)?.ptr);
        if bytes == 0 {
            return Ok(());
        }
        let _bound = self.context.bind()?;
        // SAFETY: both allocations hold at least `bytes` and are distinct (`dst` is borrowed
        // mutably while `src` is borrowed shared).
        unsafe { result::memcpy_dtod_async(dst, src, bytes, self.stream) }
            .map_err(|err| cuda_error("cuMemcpyDtoDAsync", err))?;
        self.complete()
    }

    fn can_copy_from_peer(&self, src: &Device) -> bool {
        match src.backend().raw() {
            RawDevice::Cuda { context, .. } => self.peers.iter().any(|peer| peer.raw().cast() == context),
            _ => false,
        }
    }

    fn copy_from_peer(
        &self,
        src_device: &Device,
        src: &DeviceMemory,
        dst: &mut DeviceMemory,
        bytes: usize,
    ) -> Option<Result<()>> {
        let source = src.handle::<CudaMemory>()?;
        let peer = self.peers.iter().find(|peer| Arc::ptr_eq(peer, &source.context))?;
        let copy = || {
            check_fits("copy_from_peer", src.len().min(dst.len()), bytes)?;
            let dst = self.memory(dst)?.ptr;
            if bytes == 0 {
                return Ok(());
            }
            // Work the user queued on the source device must be done before its memory is read.
            src_device.synchronize()?;
            let _bound = self.context.bind()?;
            // SAFETY: source.ptr holds at least `bytes` in `peer`, dst holds at least `bytes`
            // here; both stay borrowed until the stream has completed the copy.
            unsafe {
                result::memcpy_peer_async(self.context.raw(), dst, peer.raw(), source.ptr, bytes, self.stream)
            }
            .map_err(|err| cuda_error("cuMemcpyPeerAsync", err))?;
            self.complete()
        };
        Some(copy())
    }

    fn synchronize(&self) -> Result<()> {
        let _bound = self.context.bind()?;
        self.complete()
    }

    fn raw(&self) -> RawDevice {
        RawDevice::Cuda { context: self.context.raw().cast(), stream: self.stream.cast() }
    }
}

impl CudaBackend {
    /// Fills by uploading [`FILL_SEED`] bytes of the repeated pattern, then doubling the
    /// filled prefix with device-to-device copies (which keep the phase: every copied length
    /// is a multiple of the pattern). Waits for the stream before the seed is freed.
    fn fill_by_doubling(&self, dst: sys::CUdeviceptr, pattern: &[u8], bytes: usize) -> Result<()> {
        let seed_len = bytes.min(FILL_SEED / pattern.len() * pattern.len()).max(pattern.len());
        let seed: Vec<u8> = pattern.iter().copied().cycle().take(seed_len).collect();
        // SAFETY: dst holds `bytes` >= seed_len bytes; `seed` lives until the stream is done.
        unsafe { result::memcpy_htod_async(dst, &seed[..], self.stream) }
            .map_err(|err| cuda_error("cuMemcpyHtoDAsync", err))?;
        let mut filled = seed_len;
        while filled < bytes {
            let n = filled.min(bytes - filled);
            // SAFETY: [0, n) and [filled, filled + n) lie in the allocation and do not
            // overlap (n <= filled).
            unsafe { result::memcpy_dtod_async(dst + filled as u64, dst, n, self.stream) }
                .map_err(|err| cuda_error("cuMemcpyDtoDAsync", err))?;
            filled += n;
        }
        let completed = self.complete();
        drop(seed);
        completed
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
