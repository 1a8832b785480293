//! The wgpu [`Runtime`]: storage buffers as device memory, one command buffer
//! and one submission per operation, staging buffers for the host's side of transfers, and
//! tickets finished by wgpu's callbacks.
//!
//! **Transfers.** On an adapter whose memory the host shares (a CPU adapter such as lavapipe,
//! an integrated GPU, Apple silicon) and that can map storage buffers themselves
//! (`MAPPABLE_PRIMARY_BUFFERS`), a transfer maps the buffer and copies straight between it and
//! the host memory: one copy, done before the call returns (the mapping waits for the work
//! already submitted that uses the buffer, so stream order holds). Elsewhere, and with
//! [`WgpuOptions::mapped_transfers`] off, bytes go through staging buffers (`staging.rs`) and a
//! GPU copy, asynchronously. docs/BENCHMARKS.md has the measurements (on lavapipe the mapped
//! path is 2-60 times faster than staging).
//!
//! **No zero-copy aliasing.** A wgpu buffer is either usable by the GPU or mapped for the host,
//! never both, and a mapping is granted only after every submission that uses the buffer; so a
//! device copy that *is* the host copy (OpenCL's `CL_MEM_USE_HOST_PTR`) cannot be built, and
//! [`Runtime::zero_copy`] is false: every sync moves its bytes once.

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use super::kernels::{self, Kernels};
use super::memory::{Context, WgpuCompletion, WgpuMemory, WgpuStream};
use super::staging::{Direction, Staging};
use super::{API_SELECTORS, Status, native, vendor_name, wgpu_error};
use crate::backend::{
    Allocated, DeviceInfo, HostSpan, MemoryInfo, MemoryKind, MemorySource, RawDevice, RawMemory, RawStream,
    Runtime, Ticket,
};
use crate::error::{BackendKind, Error, Result};
use crate::host_memory::HostMemory;

/// How a wgpu adapter is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WgpuOptions {
    /// On an adapter whose memory the host shares and that can map storage buffers, transfer by
    /// mapping the buffer itself rather than through a staging buffer (see the module docs).
    pub mapped_transfers: bool,
}

impl Default for WgpuOptions {
    fn default() -> Self {
        WgpuOptions { mapped_transfers: true }
    }
}

/// One wgpu adapter, opened: its device, queue and default stream.
pub struct WgpuBackend {
    info: DeviceInfo,
    api: wgpu::Backend,
    adapter: wgpu::Adapter,
    context: Arc<Context>,
    stream: Arc<WgpuStream>,
    staging: Arc<Staging>,
    kernels: Mutex<Option<Arc<Kernels>>>,
    held: Arc<AtomicU64>,
    max_buffer: u64,
    /// Transfers map the storage buffer itself (see the module docs).
    mapped: bool,
}

impl std::fmt::Debug for WgpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WgpuBackend({} on {:?})", self.info.name, self.api)
    }
}

/// `bytes` rounded up to whole 4-byte words, as wgpu's copies need.
fn padded(bytes: usize) -> u64 {
    (bytes as u64).next_multiple_of(4)
}

impl WgpuBackend {
    /// Opens `adapter` with the default options.
    pub fn open(adapter: wgpu::Adapter) -> Result<WgpuBackend> {
        Self::open_with(adapter, WgpuOptions::default())
    }

    /// Opens `adapter`: a device with the adapter's own limits (wgpu's defaults would cap
    /// buffers at 256 MiB) and its queue.
    pub fn open_with(adapter: wgpu::Adapter, options: WgpuOptions) -> Result<WgpuBackend> {
        let adapter_info = adapter.get_info();
        let limits = adapter.limits();
        let shares_host_memory =
            matches!(adapter_info.device_type, wgpu::DeviceType::IntegratedGpu | wgpu::DeviceType::Cpu);
        let can_map = adapter.features().contains(wgpu::Features::MAPPABLE_PRIMARY_BUFFERS);
        let mapped = options.mapped_transfers && shares_host_memory && can_map;
        let features =
            if mapped { wgpu::Features::MAPPABLE_PRIMARY_BUFFERS } else { wgpu::Features::empty() };
        let descriptor = wgpu::DeviceDescriptor {
            label: Some("lazybuf"),
            required_features: features,
            required_limits: limits.clone(),
            ..Default::default()
        };
        let (device, queue) = pollster::block_on(adapter.request_device(&descriptor)).map_err(|err| {
            Error::BackendUnavailable {
                backend: BackendKind::WGPU,
                reason: format!("{} could not be opened: {err}", adapter_info.name),
            }
        })?;
        let total_memory = match native::total_memory(&adapter) {
            Some(total) => total,
            // Unified memory without an API figure: the system's memory is the device's.
            None if shares_host_memory => crate::backend::host::backend().info().total_memory,
            None => 0,
        };
        // A device opened without the path the adapter allows says so in its name.
        let name = if shares_host_memory && can_map && !mapped {
            format!("{} (staging transfers)", adapter_info.name)
        } else {
            adapter_info.name.clone()
        };
        let info = DeviceInfo {
            name: name.clone(),
            backend: BackendKind::WGPU,
            vendor: vendor_name(&adapter_info),
            shares_host_memory,
            is_gpu: matches!(
                adapter_info.device_type,
                wgpu::DeviceType::DiscreteGpu
                    | wgpu::DeviceType::IntegratedGpu
                    | wgpu::DeviceType::VirtualGpu
            ),
            total_memory,
            compute_capability: None,
            ordinal: None,
            // No memory both sides address (MemoryKind::Shared is refused).
            shared_memory: false,
            dlpack: crate::backend::DlpackDevices::HOST_SHARED,
        };
        let context = Context::new(device, queue, name);
        Ok(WgpuBackend {
            info,
            api: adapter_info.backend,
            adapter,
            stream: Arc::new(WgpuStream::new(context.clone())),
            context,
            staging: Arc::new(Staging::default()),
            kernels: Mutex::new(None),
            held: Arc::new(AtomicU64::new(0)),
            max_buffer: limits.max_buffer_size,
            mapped,
        })
    }

    /// The adapter the device was opened on (to open it again with other options).
    pub fn adapter(&self) -> &wgpu::Adapter {
        &self.adapter
    }

    /// Whether transfers map the storage buffer itself (else they go through staging buffers).
    pub fn maps_for_transfers(&self) -> bool {
        self.mapped
    }

    /// The graphics API wgpu drives this device through.
    pub fn api(&self) -> wgpu::Backend {
        self.api
    }

    /// The last error wgpu reported for this device outside lazybuf's own calls (in the
    /// caller's work on the raw device, outside an error scope of the caller's), taken: each
    /// is returned once. wgpu's default for such errors is a panic; lazybuf records them.
    pub fn take_uncaptured_error(&self) -> Option<String> {
        self.context.take_uncaptured()
    }

    /// The buffer of a non-empty allocation.
    fn buffer<'m>(&self, memory: &'m WgpuMemory) -> Result<&'m wgpu::Buffer> {
        memory
            .buffer
            .as_ref()
            .ok_or_else(|| Error::invalid("wgpu device", "an empty allocation has no buffer"))
    }

    /// A storage buffer of `bytes` (none for 0 bytes).
    fn allocate_device(&self, bytes: usize) -> Result<WgpuMemory> {
        self.context.check_alive()?;
        let held = self.held.clone();
        let context = self.context.clone();
        if bytes == 0 {
            return Ok(WgpuMemory { buffer: None, held, context });
        }
        self.check_size(bytes)?;
        let size = padded(bytes);
        let buffer = self.context.scoped("Device::create_buffer", bytes, || {
            self.context.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("lazybuf"),
                size,
                usage: self.storage_usage(),
                mapped_at_creation: false,
            })
        })?;
        held.fetch_add(size, Ordering::Relaxed);
        Ok(WgpuMemory { buffer: Some(buffer), held, context })
    }

    /// Why pinned host memory cannot be had here.
    fn no_pinned_memory(&self, bytes: usize) -> Error {
        Error::PinningFailed {
            requested: bytes,
            reason: format!(
                "{} is a wgpu device, which has no pinned host memory (wgpu transfers through its \
                 own mapped staging buffers); ask for pageable host memory instead (a buffer with \
                 `pinned: false`, Python `pinned=False`; dpctl's `MemoryHost` is pinned memory \
                 only: use `MemoryDevice` or a buffer there)",
                self.info.name
            ),
        }
    }

    /// The fill and merge pipelines, compiled at first use.
    fn kernels(&self) -> Result<Arc<Kernels>> {
        let mut slot = self.kernels.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(kernels) = &*slot {
            return Ok(kernels.clone());
        }
        let kernels = Arc::new(
            self.context.scoped("create_compute_pipeline", 0, || Kernels::new(&self.context.device))?,
        );
        *slot = Some(kernels.clone());
        Ok(kernels)
    }

    fn encoder(&self) -> wgpu::CommandEncoder {
        self.context.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("lazybuf") })
    }

    /// A ticket that completes when the work submitted so far is done (call it right after
    /// the submission it stands for).
    fn submitted(&self) -> Ticket {
        let completion = WgpuCompletion::new(self.context.clone());
        let done = completion.clone();
        self.context.queue.on_submitted_work_done(move || done.finish(Ok(())));
        Ticket::new(completion)
    }

    /// Records `record`'s commands, submits them, and returns the ticket of the submission.
    /// On an error nothing was submitted.
    fn run(
        &self,
        call: &'static str,
        bytes: usize,
        record: impl FnOnce(&mut wgpu::CommandEncoder),
    ) -> Result<Ticket> {
        self.context.scoped(call, bytes, || {
            let mut encoder = self.encoder();
            record(&mut encoder);
            self.context.queue.submit([encoder.finish()]);
        })?;
        Ok(self.submitted())
    }

    fn check_size(&self, bytes: usize) -> Result<()> {
        if padded(bytes) > self.max_buffer {
            return Err(Error::invalid(
                "allocate",
                format!(
                    "{bytes} bytes exceed the largest buffer {} allows ({} bytes)",
                    self.info.name, self.max_buffer
                ),
            ));
        }
        Ok(())
    }
}

/// Does not survive `fork` (the default): Mesa's lavapipe (and GPU drivers) run threads of
/// their own, and a forked child's first wait on the parent's device hangs (tests/fork.rs
/// showed it, before the guard).
impl Runtime for WgpuBackend {
    type Memory = WgpuMemory;
    type Stream = WgpuStream;

    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// Vulkan with `VK_EXT_memory_budget`: the driver's budget minus usage of the device-local
    /// heaps (every process's usage counted). Vulkan without it: the heaps' size minus what
    /// this process holds. Unified memory without a Vulkan figure (Metal on Apple silicon):
    /// the system's available memory. Elsewhere wgpu reports nothing, which is an error.
    fn memory_info(&self) -> Result<MemoryInfo> {
        let total = self.info.total_memory;
        if let Some(free) = native::free_memory(&self.adapter) {
            return Ok(MemoryInfo { free: free.min(total), total, source: MemorySource::Runtime, cached: 0 });
        }
        if native::total_memory(&self.adapter).is_some() {
            let held = self.held.load(Ordering::Relaxed);
            return Ok(MemoryInfo {
                free: total.saturating_sub(held),
                total,
                source: MemorySource::TotalMinusProcessHeld,
                cached: 0,
            });
        }
        if self.info.shares_host_memory {
            return crate::backend::host::backend().memory_info();
        }
        Err(Error::invalid(
            "memory_info",
            format!("{} ({:?}) reports no memory size through wgpu", self.info.name, self.api),
        ))
    }

    fn default_stream(&self) -> Arc<WgpuStream> {
        self.stream.clone()
    }

    /// Another handle to the device's one queue (wgpu has one queue per device).
    fn create_stream(&self) -> Result<Arc<WgpuStream>> {
        self.context.check_alive()?;
        Ok(Arc::new(WgpuStream::new(self.context.clone())))
    }

    unsafe fn wrap_stream(&self, raw: RawStream) -> Result<Arc<WgpuStream>> {
        match raw {
            RawStream::Wgpu(queue) if std::ptr::eq(queue, &self.context.queue) => self.create_stream(),
            other => Err(Error::invalid(
                "wrap_stream",
                format!(
                    "expected the queue of {} (wgpu has one queue per device), got {other:?}",
                    self.info.name
                ),
            )),
        }
    }

    /// Pinned host memory has no meaning for wgpu, which copies through its own mapped
    /// staging buffers whatever the host memory is: asking for it is an error. So is shared
    /// memory, which wgpu does not have.
    fn allocate(&self, kind: MemoryKind, bytes: usize) -> Result<Allocated<WgpuMemory>> {
        match kind {
            MemoryKind::Host { pinned: false } => Ok(Allocated::Host(HostMemory::allocate(bytes)?)),
            MemoryKind::Host { pinned: true } => Err(self.no_pinned_memory(bytes)),
            MemoryKind::Device => Ok(Allocated::Memory(self.allocate_device(bytes)?)),
            MemoryKind::Shared => Err(Error::invalid(
                "allocate",
                format!(
                    "{} has no shared memory (expected a CUDA device with managed memory, an OpenCL device with fine-grained SVM, or the host)",
                    self.info.name
                ),
            )),
        }
    }

    fn pins_host_memory(&self) -> bool {
        false
    }

    fn alignment(&self, kind: MemoryKind) -> usize {
        match kind {
            MemoryKind::Device => kernels::CHUNK_ALIGN as usize,
            _ => crate::host_memory::HEAP_ALIGN,
        }
    }

    fn owns(&self, memory: &WgpuMemory) -> bool {
        Arc::ptr_eq(&memory.context, &self.context)
    }

    fn owns_stream(&self, stream: &WgpuStream) -> bool {
        Arc::ptr_eq(&stream.context, &self.context)
    }

    unsafe fn upload(&self, _: &WgpuStream, src: HostSpan, dst: &WgpuMemory) -> Result<Ticket> {
        let dst = self.buffer(dst)?;
        if self.mapped {
            // SAFETY: the caller keeps src valid and unwritten until the ticket completes; it
            // is read only here, before this call returns.
            self.write_mapped(dst, unsafe { src.bytes() })?;
            return Ok(Ticket::done());
        }
        let kernels = if !src.len().is_multiple_of(4) { Some(self.kernels()?) } else { None };
        // SAFETY: the caller keeps src valid and unwritten until the ticket completes; it is
        // read only here, before this call returns.
        let bytes = unsafe { src.bytes() };
        let n = bytes.len();
        let whole = n - n % 4;
        let context = &*self.context;
        context.scoped("upload", n, || -> Result<()> {
            let staging = match self.staging.take(Direction::Upload, whole as u64) {
                Some(staging) => staging,
                None if whole > 0 => Staging::create(context, Direction::Upload, whole as u64),
                None => return self.upload_tail(kernels.as_deref(), dst, bytes, None),
            };
            {
                let mut view = staging
                    .slice(..whole as u64)
                    .get_mapped_range_mut()
                    .map_err(|_| wgpu_error("BufferSlice::get_mapped_range_mut", Status::MapFailed))?;
                view.copy_from_slice(&bytes[..whole]);
            }
            staging.unmap();
            self.upload_tail(kernels.as_deref(), dst, bytes, Some(&staging))?;
            self.staging.recycle_upload(staging);
            Ok(())
        })??;
        Ok(self.submitted())
    }

    unsafe fn download(&self, stream: &WgpuStream, src: &WgpuMemory, dst: HostSpan) -> Result<Ticket> {
        let src = self.buffer(src)?;
        if self.mapped {
            // SAFETY: the caller keeps dst valid, and untouched by anyone else, until the
            // ticket completes; it is written only here, before this call returns.
            self.read_mapped(src, unsafe { dst.bytes_mut() })?;
            return Ok(Ticket::done());
        }
        let (n, size) = (dst.len(), padded(dst.len()));
        let context = &*self.context;
        let completion = context.scoped("download", n, || {
            let staging = self
                .staging
                .take(Direction::Download, size)
                .unwrap_or_else(|| Staging::create(context, Direction::Download, size));
            let mut encoder = self.encoder();
            encoder.copy_buffer_to_buffer(src, 0, &staging, 0, size);
            context.queue.submit([encoder.finish()]);
            let completion = WgpuCompletion::new(self.context.clone());
            let (done, pool, mapped_buffer) =
                (completion.clone(), Arc::downgrade(&self.staging), staging.clone());
            staging.map_async(wgpu::MapMode::Read, ..size, move |mapped| {
                let outcome =
                    mapped.map_err(|_| wgpu_error("Buffer::map_async", Status::MapFailed)).and_then(|()| {
                        let copied = mapped_buffer.slice(..size).get_mapped_range().map(|view| {
                            // SAFETY: the caller keeps dst valid, and untouched by anyone else,
                            // until the ticket completes, which is after this callback.
                            crate::host_memory::copy_bytes(unsafe { dst.bytes_mut() }, &view[..n]);
                        });
                        mapped_buffer.unmap();
                        copied.map_err(|_| wgpu_error("BufferSlice::get_mapped_range", Status::MapFailed))
                    });
                if outcome.is_ok()
                    && let Some(pool) = pool.upgrade()
                {
                    pool.give_back(Direction::Download, mapped_buffer);
                }
                done.finish(outcome);
            });
            completion
        })?;
        let ticket = Ticket::new(completion);
        stream.track(&ticket);
        Ok(ticket)
    }

    unsafe fn fill(&self, _: &WgpuStream, dst: &WgpuMemory, pattern: &[u8], bytes: usize) -> Result<Ticket> {
        let dst = self.buffer(dst)?;
        let whole = bytes - bytes % 4;
        let zero = pattern.iter().all(|&b| b == 0);
        let kernels = if zero && whole == bytes { None } else { Some(self.kernels()?) };
        let sixteen: Vec<u8> = pattern.iter().copied().cycle().take(16).collect();
        let words = [0, 1, 2, 3].map(|i| kernels::word(&sixteen[4 * i..4 * i + 4]));
        let device = &self.context.device;
        self.run("fill", bytes, |encoder| match (&kernels, zero) {
            (None, _) => encoder.clear_buffer(dst, 0, Some(whole as u64)),
            (Some(kernels), true) => {
                if whole > 0 {
                    encoder.clear_buffer(dst, 0, Some(whole as u64));
                }
                kernels.patch(device, encoder, dst, whole as u64, 0, kernels::mask(bytes % 4));
            }
            (Some(kernels), false) => {
                kernels.fill(
                    device,
                    encoder,
                    dst,
                    padded(bytes) / 4,
                    words,
                    kernels::mask(4 - (padded(bytes) as usize - bytes)),
                );
            }
        })
    }

    unsafe fn copy(
        &self,
        _: &WgpuStream,
        src: &WgpuMemory,
        dst: &WgpuMemory,
        bytes: usize,
    ) -> Result<Ticket> {
        let (src, dst) = (self.buffer(src)?, self.buffer(dst)?);
        let whole = bytes - bytes % 4;
        let kernels = if whole < bytes { Some(self.kernels()?) } else { None };
        let device = &self.context.device;
        self.run("copy", bytes, |encoder| {
            if whole > 0 {
                encoder.copy_buffer_to_buffer(src, 0, dst, 0, whole as u64);
            }
            if let Some(kernels) = &kernels {
                kernels.merge(device, encoder, src, dst, whole as u64, kernels::mask(bytes - whole));
            }
        })
    }

    /// Work of this device needs no ordering (it shares one queue); other completions are
    /// waited for here.
    fn wait_on(&self, _: &WgpuStream, ticket: &Ticket) -> Result<()> {
        for part in ticket.parts() {
            let ours = (&*part as &dyn Any)
                .downcast_ref::<WgpuCompletion>()
                .is_some_and(|c| Arc::ptr_eq(c.context(), &self.context));
            if !ours {
                part.wait()?;
            }
        }
        Ok(())
    }

    fn marker(&self, stream: &WgpuStream) -> Result<Ticket> {
        self.context.scoped("Queue::submit", 0, || {
            self.context.queue.submit([]);
        })?;
        let mut parts = stream.pending();
        parts.push(self.submitted());
        Ok(Ticket::all(parts))
    }

    fn synchronize(&self) -> Result<()> {
        self.marker(&*self.stream)?.wait()
    }

    fn raw(&self) -> RawDevice {
        RawDevice::Wgpu { device: &self.context.device, queue: &self.context.queue }
    }

    /// The graphics API's own handle of the buffer: the `VkBuffer` on Vulkan; 0 on other APIs
    /// and for an empty allocation.
    unsafe fn native_handle(&self, memory: RawMemory) -> usize {
        // SAFETY: forwarded contract: a live allocation of this device.
        unsafe { super::native_buffer_handle(memory) }.unwrap_or(0) as usize
    }

    fn answers_to(&self, selector: &str) -> bool {
        API_SELECTORS.iter().any(|&(name, api)| name == selector && api == self.api)
    }

    fn trim(&self) {
        self.staging.trim();
    }
}

impl WgpuBackend {
    fn storage_usage(&self) -> wgpu::BufferUsages {
        let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
        if self.mapped { usage | wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::MAP_WRITE } else { usage }
    }

    /// Maps the first `size` bytes of `buffer` and waits for the mapping: wgpu grants it once
    /// the work submitted so far that uses the buffer is done.
    fn map(&self, buffer: &wgpu::Buffer, mode: wgpu::MapMode, size: u64) -> Result<()> {
        let completion = WgpuCompletion::new(self.context.clone());
        let done = completion.clone();
        self.context.scoped("Buffer::map_async", 0, || {
            buffer.map_async(mode, ..size, move |mapped| {
                done.finish(mapped.map_err(|_| wgpu_error("Buffer::map_async", Status::MapFailed)))
            })
        })?;
        crate::backend::Completion::wait(&*completion)
    }

    /// Copies `bytes` into the start of `buffer` through a mapping of the buffer itself; the
    /// bytes after them (to the next word) are left as they were.
    fn write_mapped(&self, buffer: &wgpu::Buffer, bytes: &[u8]) -> Result<()> {
        let size = padded(bytes.len());
        self.map(buffer, wgpu::MapMode::Write, size)?;
        self.context
            .scoped("BufferSlice::get_mapped_range_mut", bytes.len(), || {
                let copied = buffer.slice(..size).get_mapped_range_mut().map(|mut view| {
                    view.slice(..bytes.len()).copy_from_slice(bytes);
                });
                buffer.unmap();
                copied.map_err(|_| wgpu_error("BufferSlice::get_mapped_range_mut", Status::MapFailed))
            })
            .and_then(|copied| copied)
    }

    /// Copies the first `out.len()` bytes of `buffer` into `out` through a mapping of the
    /// buffer itself.
    fn read_mapped(&self, buffer: &wgpu::Buffer, out: &mut [u8]) -> Result<()> {
        let size = padded(out.len());
        self.map(buffer, wgpu::MapMode::Read, size)?;
        self.context
            .scoped("BufferSlice::get_mapped_range", out.len(), || {
                let copied = buffer.slice(..size).get_mapped_range().map(|view| {
                    crate::host_memory::copy_bytes(out, &view[..out.len()]);
                });
                buffer.unmap();
                copied.map_err(|_| wgpu_error("BufferSlice::get_mapped_range", Status::MapFailed))
            })
            .and_then(|copied| copied)
    }

    /// Inside the upload's error scope: records the copy of the whole words from `staging`
    /// and the merge of the last partial word of `bytes`, and submits them.
    fn upload_tail(
        &self,
        kernels: Option<&Kernels>,
        dst: &wgpu::Buffer,
        bytes: &[u8],
        staging: Option<&wgpu::Buffer>,
    ) -> Result<()> {
        let n = bytes.len();
        let whole = n - n % 4;
        let mut encoder = self.encoder();
        if let Some(staging) = staging {
            encoder.copy_buffer_to_buffer(staging, 0, dst, 0, whole as u64);
        }
        if whole < n {
            let kernels = kernels.ok_or_else(|| Error::invalid("upload", "the merge kernel is missing"))?;
            let value = kernels::word(&bytes[whole..]);
            kernels.patch(
                &self.context.device,
                &mut encoder,
                dst,
                whole as u64,
                value,
                kernels::mask(n - whole),
            );
        }
        self.context.queue.submit([encoder.finish()]);
        Ok(())
    }
}
