//! The raw baselines `bandwidth` compares lazybuf's syncs with: the runtime's own blocking
//! copy of the same bytes, on the queue or stream lazybuf uses for the device, into device
//! memory allocated directly from the runtime (no lazybuf code on the measured path).
//!
//! - OpenCL: `clCreateBuffer` on lazybuf's context, blocking `clEnqueueWriteBuffer` /
//!   `clEnqueueReadBuffer` on lazybuf's in-order queue (through cl3);
//! - CUDA: `cuMemAlloc` in lazybuf's context, `cuMemcpyHtoDAsync` / `cuMemcpyDtoHAsync` on
//!   lazybuf's stream followed by `cuStreamSynchronize` (through cudarc's result layer);
//! - wgpu: a storage buffer on lazybuf's device, `Queue::write_buffer` and a wait for the
//!   submitted work; a copy to a reused read-back buffer, `map_async` and a copy out of the
//!   mapping (as wgpu's own examples read results back); waits poll without blocking;
//! - the host device: `memcpy` into a second host block (it has no device memory of its own);
//! - any other backend (one this tool does not call directly, such as the test-only loopback
//!   devices): lazybuf's own backend edge, blocking [`lazybuf::Stream`] uploads and downloads
//!   of device memory straight from the backend (no buffer, no cache, no coherence), so a new
//!   backend is measured without a line here.
//!
//! This is the only module of the crate with `unsafe` code: the runtime calls cannot be made
//! without it. Each handle comes from a live [`Device`] that outlives the [`RawCopy`].

use lazybuf::Device;
use lazybuf::backend::RawDevice;

use crate::Result;
use crate::error::CliError;

/// Device memory of one size and the runtime handles to copy into and out of it.
pub struct RawCopy {
    target: Target,
    len: usize,
    /// Keeps the device (and so the handles borrowed from it) alive.
    _device: Device,
}

enum Target {
    /// The host device: a host block standing in for device memory.
    Host(lazybuf::host_memory::HostMemory),
    #[cfg(feature = "opencl")]
    OpenCl { queue: cl3::types::cl_command_queue, mem: cl3::types::cl_mem },
    #[cfg(feature = "cuda")]
    Cuda {
        context: cudarc::driver::sys::CUcontext,
        stream: cudarc::driver::sys::CUstream,
        ptr: cudarc::driver::sys::CUdeviceptr,
    },
    #[cfg(feature = "wgpu")]
    Wgpu(WgpuTarget),
    /// Any other backend: its device memory through lazybuf's backend edge.
    Edge { memory: lazybuf::backend::DeviceMemory, stream: lazybuf::Stream },
}

impl RawCopy {
    /// Allocates `len` bytes (at least 1) of device memory on `device` directly from its
    /// runtime.
    pub fn new(device: &Device, len: usize) -> Result<RawCopy> {
        let len = len.max(1);
        // SAFETY: the handles are only borrowed, and `device` (kept in the RawCopy) keeps
        // them alive.
        let raw = unsafe { device.raw() };
        let target = match raw {
            // The library's allocation: a size the machine cannot hold is an error, not an abort.
            RawDevice::Host => Target::Host(lazybuf::host_memory::HostMemory::allocate(len)?),
            #[cfg(feature = "opencl")]
            RawDevice::OpenCl { context, queue, .. } => {
                // SAFETY: a plain read-write buffer of `len` > 0 bytes on a live context, no
                // host pointer; released in Drop.
                let mem = unsafe {
                    cl3::memory::create_buffer(
                        context,
                        cl3::memory::CL_MEM_READ_WRITE,
                        len,
                        std::ptr::null_mut(),
                    )
                }
                .map_err(|status| opencl_error("clCreateBuffer", status))?;
                Target::OpenCl { queue, mem }
            }
            #[cfg(feature = "cuda")]
            RawDevice::Cuda { context, stream } => {
                let context: cudarc::driver::sys::CUcontext = context.cast();
                // SAFETY: binding lazybuf's live primary context on this thread, as lazybuf's
                // own calls do; then a plain allocation of `len` > 0 bytes, freed in Drop.
                let ptr = unsafe {
                    cudarc::driver::result::ctx::set_current(context)
                        .and_then(|()| cudarc::driver::result::malloc_sync(len))
                }
                .map_err(|err| cuda_error("cuMemAlloc", err))?;
                Target::Cuda { context, stream: stream.cast(), ptr }
            }
            #[cfg(feature = "wgpu")]
            RawDevice::Wgpu { device: wgpu_device, queue } => {
                // SAFETY: both point at lazybuf's live device and queue (kept alive by the
                // `Device` this RawCopy holds); cloning takes wgpu's own reference counts.
                let (wgpu_device, queue) = unsafe { ((*wgpu_device).clone(), (*queue).clone()) };
                Target::Wgpu(WgpuTarget::new(wgpu_device, queue, len)?)
            }
            #[allow(unreachable_patterns)]
            _ => {
                let stream = device.stream();
                let kind = lazybuf::MemoryKind::Device;
                match lazybuf::MemoryResource::allocate(&lazybuf::DirectResource, device, kind, len, &stream)?
                {
                    lazybuf::Block::Device(memory) => Target::Edge { memory, stream },
                    lazybuf::Block::Host(_) => {
                        return Err(CliError::new(format!("{device} gave host memory for device memory")));
                    }
                }
            }
        };
        Ok(RawCopy { target, len, _device: device.clone() })
    }

    /// Copies all of `src` (at most the allocation's length) to the device, and waits.
    pub fn upload(&mut self, src: &[u8]) -> Result<()> {
        let len = self.checked(src.len())?;
        match &mut self.target {
            Target::Host(dst) => dst.as_mut_slice()[..len].copy_from_slice(src),
            #[cfg(feature = "opencl")]
            Target::OpenCl { queue, mem } => {
                // SAFETY: a blocking write of `len` bytes from `src` (valid for reads for the
                // whole call) into a live buffer of at least `len` bytes, on a live queue; the
                // event is released once.
                unsafe {
                    let event = cl3::command_queue::enqueue_write_buffer(
                        *queue,
                        *mem,
                        cl3::types::CL_BLOCKING,
                        0,
                        len,
                        src.as_ptr().cast(),
                        0,
                        std::ptr::null(),
                    )
                    .map_err(|status| opencl_error("clEnqueueWriteBuffer", status))?;
                    cl3::event::release_event(event)
                        .map_err(|status| opencl_error("clReleaseEvent", status))?;
                }
            }
            #[cfg(feature = "cuda")]
            Target::Cuda { context, stream, ptr } => {
                // SAFETY: `src` stays borrowed until the stream is synchronized below; the
                // allocation holds at least `len` bytes; context and stream are lazybuf's, live.
                unsafe {
                    cudarc::driver::result::ctx::set_current(*context)
                        .and_then(|()| cudarc::driver::result::memcpy_htod_async(*ptr, src, *stream))
                        .and_then(|()| cudarc::driver::result::stream::synchronize(*stream))
                }
                .map_err(|err| cuda_error("cuMemcpyHtoDAsync", err))?;
            }
            #[cfg(feature = "wgpu")]
            Target::Wgpu(target) => target.upload(src)?,
            Target::Edge { memory, stream } => {
                // SAFETY: `src` stays borrowed until the ticket is waited for, here.
                unsafe { stream.upload(lazybuf::backend::HostSpan::of_slice(&src[..len]), memory) }?
                    .wait()?;
            }
        }
        Ok(())
    }

    /// Fills all of `dst` (at most the allocation's length) from the device, and waits.
    pub fn download(&mut self, dst: &mut [u8]) -> Result<()> {
        let len = self.checked(dst.len())?;
        match &mut self.target {
            Target::Host(src) => dst.copy_from_slice(&src.as_slice()[..len]),
            #[cfg(feature = "opencl")]
            Target::OpenCl { queue, mem } => {
                // SAFETY: a blocking read of `len` bytes into `dst` (valid for writes and
                // exclusively borrowed for the whole call) from a live buffer of at least `len`
                // bytes, on a live queue; the event is released once.
                unsafe {
                    let event = cl3::command_queue::enqueue_read_buffer(
                        *queue,
                        *mem,
                        cl3::types::CL_BLOCKING,
                        0,
                        len,
                        dst.as_mut_ptr().cast(),
                        0,
                        std::ptr::null(),
                    )
                    .map_err(|status| opencl_error("clEnqueueReadBuffer", status))?;
                    cl3::event::release_event(event)
                        .map_err(|status| opencl_error("clReleaseEvent", status))?;
                }
            }
            #[cfg(feature = "cuda")]
            Target::Cuda { context, stream, ptr } => {
                // SAFETY: `dst` stays exclusively borrowed until the stream is synchronized
                // below; the allocation holds at least `len` bytes; context and stream are live.
                unsafe {
                    cudarc::driver::result::ctx::set_current(*context)
                        .and_then(|()| cudarc::driver::result::memcpy_dtoh_async(dst, *ptr, *stream))
                        .and_then(|()| cudarc::driver::result::stream::synchronize(*stream))
                }
                .map_err(|err| cuda_error("cuMemcpyDtoHAsync", err))?;
            }
            #[cfg(feature = "wgpu")]
            Target::Wgpu(target) => target.download(dst)?,
            Target::Edge { memory, stream } => {
                let span = lazybuf::backend::HostSpan::of_mut_slice(&mut dst[..len]);
                // SAFETY: `dst` stays exclusively borrowed until the ticket is waited for, here.
                unsafe { stream.download(memory, span) }?.wait()?;
            }
        }
        Ok(())
    }

    fn checked(&self, len: usize) -> Result<usize> {
        if len > self.len {
            return Err(CliError::new(format!("raw copy of {len} bytes into an allocation of {}", self.len)));
        }
        Ok(len)
    }
}

impl Drop for RawCopy {
    fn drop(&mut self) {
        match &self.target {
            Target::Host(_) => {}
            #[cfg(feature = "opencl")]
            Target::OpenCl { mem, .. } => {
                // SAFETY: the buffer created in `new`, released once; blocking copies left
                // nothing in flight. A failure here leaks it (Drop must not fail).
                let _ = unsafe { cl3::memory::release_mem_object(*mem) };
            }
            #[cfg(feature = "cuda")]
            Target::Cuda { context, ptr, .. } => {
                // SAFETY: the allocation made in `new`, freed once in its own context;
                // every copy was synchronized. A failure here leaks it (Drop must not fail).
                let _ = unsafe {
                    cudarc::driver::result::ctx::set_current(*context)
                        .and_then(|()| cudarc::driver::result::free_sync(*ptr))
                };
            }
            // wgpu frees its buffers when the last reference is dropped.
            #[cfg(feature = "wgpu")]
            Target::Wgpu(_) => {}
            // Freed by its drop; every copy was waited for.
            Target::Edge { .. } => {}
        }
    }
}

#[cfg(feature = "wgpu")]
use lazybuf::backend::wgpu::wgpu;

/// The wgpu baseline: a storage buffer and a reused read-back buffer on lazybuf's device.
#[cfg(feature = "wgpu")]
struct WgpuTarget {
    device: wgpu::Device,
    queue: wgpu::Queue,
    storage: wgpu::Buffer,
    readback: wgpu::Buffer,
}

#[cfg(feature = "wgpu")]
impl WgpuTarget {
    fn new(device: wgpu::Device, queue: wgpu::Queue, len: usize) -> Result<WgpuTarget> {
        // Buffer sizes and copies are whole 4-byte words in wgpu.
        let size = len.next_multiple_of(4) as u64;
        // wgpu panics on a buffer beyond the device's limit: refuse it first.
        let limit = device.limits().max_buffer_size;
        if size > limit {
            return Err(CliError::new(format!(
                "raw baseline: {len} bytes is more than this wgpu device's largest buffer ({limit} bytes)"
            )));
        }
        let storage = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("lazybuf-cli raw storage"),
            size,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let readback = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("lazybuf-cli raw read-back"),
            size,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        Ok(WgpuTarget { device, queue, storage, readback })
    }

    /// Polls the device without blocking until `done` is set (lazybuf's backend waits the same
    /// way: a waiting poll that overlaps a submit can trip a wgpu-core assertion).
    fn wait(&self, done: &std::sync::atomic::AtomicBool) -> Result<()> {
        use std::sync::atomic::Ordering;
        while !done.load(Ordering::Acquire) {
            self.device
                .poll(wgpu::PollType::Poll)
                .map_err(|err| CliError::new(format!("raw baseline: wgpu poll failed: {err}")))?;
            std::thread::yield_now();
        }
        Ok(())
    }

    fn upload(&mut self, src: &[u8]) -> Result<()> {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};
        let words = src.len() / 4 * 4;
        self.queue.write_buffer(&self.storage, 0, &src[..words]);
        if words < src.len() {
            // The last partial word, padded (the bytes past `src` are not compared).
            let mut tail = [0u8; 4];
            tail[..src.len() - words].copy_from_slice(&src[words..]);
            self.queue.write_buffer(&self.storage, words as u64, &tail);
        }
        self.queue.submit([]);
        let done = Arc::new(AtomicBool::new(false));
        let flag = done.clone();
        self.queue.on_submitted_work_done(move || flag.store(true, Ordering::Release));
        self.wait(&done)
    }

    fn download(&mut self, dst: &mut [u8]) -> Result<()> {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};
        let size = dst.len().next_multiple_of(4) as u64;
        let mut encoder = self.device.create_command_encoder(&Default::default());
        encoder.copy_buffer_to_buffer(&self.storage, 0, &self.readback, 0, size);
        self.queue.submit([encoder.finish()]);
        let done = Arc::new(AtomicBool::new(false));
        let mapped = Arc::new(std::sync::Mutex::new(None));
        let (flag, result) = (done.clone(), mapped.clone());
        self.readback.slice(..size).map_async(wgpu::MapMode::Read, move |outcome| {
            *result.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(outcome);
            flag.store(true, Ordering::Release);
        });
        self.wait(&done)?;
        let outcome = mapped.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        if let Some(Err(err)) = outcome {
            return Err(CliError::new(format!("raw baseline: wgpu map_async failed: {err}")));
        }
        let copied = match self.readback.slice(..size).get_mapped_range() {
            Ok(view) => {
                dst.copy_from_slice(&view[..dst.len()]);
                Ok(())
            }
            Err(err) => Err(CliError::new(format!("raw baseline: wgpu mapped range: {err}"))),
        };
        self.readback.unmap();
        copied
    }
}

#[cfg(feature = "opencl")]
fn opencl_error(call: &str, status: i32) -> CliError {
    CliError::new(format!("raw baseline: {call} failed: {}", lazybuf::backend::opencl::code(status)))
}

#[cfg(feature = "cuda")]
fn cuda_error(call: &str, err: cudarc::driver::result::DriverError) -> CliError {
    CliError::new(format!("raw baseline: {call} failed: {}", lazybuf::backend::cuda::code(err.0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_raw_copies_round_trip_and_refuse_oversized_copies() {
        let mut raw = RawCopy::new(&Device::host(), 4).unwrap();
        raw.upload(&[1, 2, 3, 4]).unwrap();
        let mut back = [0u8; 4];
        raw.download(&mut back).unwrap();
        assert_eq!(back, [1, 2, 3, 4]);
        assert!(raw.upload(&[0; 5]).unwrap_err().to_string().contains("allocation of 4"));
    }

    #[test]
    fn raw_copies_round_trip_on_every_device() {
        for device in lazybuf::devices() {
            let mut raw = RawCopy::new(&device, 1000).unwrap();
            let data: Vec<u8> = (0..1000).map(|i| (i % 251) as u8).collect();
            raw.upload(&data).unwrap();
            let mut back = vec![0u8; 1000];
            raw.download(&mut back).unwrap();
            assert_eq!(back, data, "{device}");
        }
    }
}
