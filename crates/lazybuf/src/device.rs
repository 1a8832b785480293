//! The public device and stream handles.
//!
//! A [`Device`] is a cheap, clonable handle to one opened device: an identity ([`DeviceId`],
//! never reused) plus the backend that drives it. A [`Stream`] is one in-order queue of work on
//! a device; every device has a default stream, the one lazybuf uses unless a buffer is given
//! another. Discovery and the default device live in [`crate::discovery`]; runtime calls live
//! in [`crate::backend`].

use std::fmt;
use std::num::NonZeroU64;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::backend::deferred::DeferredErrors;
use crate::backend::fork::ForkAwareOnce;
use crate::backend::{
    Backend, Checked, DeviceInfo, DeviceMemory, HostSpan, MemoryInfo, RawDevice, RawMemory, RawStream,
    Runtime, StreamHandle, Ticket, check_fits,
};
use crate::coherence::DeviceId;
use crate::error::{BackendKind, Result};

/// A handle to one opened device (one reference count: clones are cheap).
///
/// ```
/// use lazybuf::{Device, UnifiedBuffer};
///
/// let host = Device::host(); // always there; GPUs come from lazybuf::devices()
/// assert_eq!(host.backend_kind().name(), "host");
/// assert!(host.info().shares_host_memory && host.is_zero_copy(1 << 20));
/// let memory = host.memory_info()?; // the system's figures on the host
/// assert!(memory.free <= memory.total);
///
/// let buf = UnifiedBuffer::<u32>::on(&[8], &host)?; // a buffer whose device is `host`
/// assert_eq!(buf.device_handle().id(), host.id());
/// host.synchronize()?; // waits for the work queued on the device
/// # Ok::<(), lazybuf::Error>(())
/// ```
#[derive(Clone)]
pub struct Device {
    inner: Arc<Opened>,
}

struct Opened {
    id: DeviceId,
    backend: Arc<dyn Backend>,
    stream: Arc<dyn StreamHandle>,
    /// Bytes of this device's memory that lazybuf's caches hold (kept by the pools).
    cached: AtomicU64,
    /// Failures of drop, rollback and free paths of work on this device, not yet taken.
    deferred: DeferredErrors,
    /// The stream eviction's write-backs run on ([`Device::side_stream`]), made at first use.
    side: ForkAwareOnce<Option<Arc<dyn StreamHandle>>>,
}

static OPENED: AtomicU64 = AtomicU64::new(0);

impl Device {
    /// Gives an opened backend an identity. Each call makes a new, distinct device. A runtime
    /// gets its backend from [`crate::backend::checked::open`] (or [`Device::open`]).
    pub fn from_backend(backend: Arc<dyn Backend>) -> Device {
        let stream = backend.default_stream();
        let id = DeviceId(NonZeroU64::MIN.saturating_add(OPENED.fetch_add(1, Ordering::Relaxed)));
        let deferred = DeferredErrors::default();
        let side = ForkAwareOnce::new();
        Device { inner: Arc::new(Opened { id, backend, stream, cached: AtomicU64::new(0), deferred, side }) }
    }

    /// Opens `runtime` as a device: behind the checked layer ([`crate::backend::checked`]),
    /// with a new identity.
    pub fn open<R: Runtime>(runtime: R) -> Device {
        Device::from_backend(crate::backend::checked::open(runtime))
    }

    /// The host device: memory is host memory, views alias it and syncs copy nothing. Always
    /// the same device (made without waiting for another thread making it: a child forked
    /// while another thread made it makes its own, [`crate::backend::fork`]).
    pub fn host() -> Device {
        static HOST: ForkAwareOnce<Device> = ForkAwareOnce::new();
        HOST.get_or_init(|| Device::from_backend(crate::backend::host::backend())).clone()
    }

    /// This device's identity.
    pub fn id(&self) -> DeviceId {
        self.inner.id
    }

    /// What the device is.
    pub fn info(&self) -> &DeviceInfo {
        self.inner.backend.info()
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.info().name
    }

    /// The runtime that drives it.
    pub fn backend_kind(&self) -> BackendKind {
        self.info().backend
    }

    /// Free and total memory now, and how much of it lazybuf's caches hold
    /// ([`MemoryInfo::cached`]).
    pub fn memory_info(&self) -> Result<MemoryInfo> {
        let info = self.inner.backend.memory_info()?;
        Ok(MemoryInfo { cached: self.inner.cached.load(Ordering::Relaxed), ..info })
    }

    /// Whether syncs of a buffer of `bytes` between the host and this device move no bytes
    /// (the device's copy aliases host memory: the host device always; a host-sharing OpenCL
    /// device from 4 MiB up).
    pub fn is_zero_copy(&self, bytes: usize) -> bool {
        self.inner.backend.zero_copy(bytes)
    }

    /// Whether the device's buffers can have pinned (page-locked) host copies
    /// (`BufferOptions::pinned`); where not (wgpu devices), asking for one is an error.
    pub fn can_pin_host_memory(&self) -> bool {
        self.inner.backend.pins_host_memory()
    }

    /// Whether a buffer's copy on `source` can fill this device's copy directly (CUDA peer
    /// access), without staging through the host.
    pub fn can_copy_from(&self, source: &Device) -> bool {
        self != source && self.inner.backend.can_copy_from_peer(&*source.inner.backend)
    }

    /// The stream lazybuf uses on this device unless a buffer is given another: enqueue your
    /// kernels on it (its raw handle, [`Stream::raw`]) and they are ordered with lazybuf's
    /// copies.
    pub fn stream(&self) -> Stream {
        Stream { device: self.clone(), handle: self.inner.stream.clone() }
    }

    /// A new stream on this device, independent of the default one.
    pub fn create_stream(&self) -> Result<Stream> {
        Ok(Stream { device: self.clone(), handle: self.inner.backend.create_stream()? })
    }

    /// The stream spilling writes evicted copies back on (`spill`), made at its first use and
    /// kept for the device's life: `None` when the backend has one stream only (the host, whose
    /// every stream is the same) or could not make one, and write-backs then run on the
    /// copy's own stream.
    pub(crate) fn side_stream(&self) -> Option<Stream> {
        let handle = self.inner.side.get_or_init(|| {
            let made = self.inner.backend.create_stream().ok()?;
            (!Arc::ptr_eq(&made, &self.inner.stream)).then_some(made)
        });
        handle.as_ref().map(|handle| Stream { device: self.clone(), handle: handle.clone() })
    }

    /// A handle to a stream the caller made on this device (a `CUstream` of its context, a
    /// `cl_command_queue` of its context), to order lazybuf's work with the caller's: hand
    /// lazybuf's streams its [`Stream::marker`], or make it wait for a transfer's ticket.
    ///
    /// # Safety
    /// `raw` is a live stream of this device's context (see [`Device::raw`]) and stays alive
    /// while the returned `Stream` (or any clone) is used. lazybuf never destroys it.
    pub unsafe fn wrap_stream(&self, raw: RawStream) -> Result<Stream> {
        // SAFETY: forwarded contract.
        let handle = unsafe { self.inner.backend.wrap_stream(raw) }?;
        Ok(Stream { device: self.clone(), handle })
    }

    /// Records a failure of work on this device that no caller can be told of at once (a
    /// drop, a rollback after another error, a free); see [`Device::take_deferred_errors`].
    pub fn record_deferred_error(&self, err: crate::Error) {
        self.inner.deferred.record(err);
    }

    /// Runs `f`, on a path that must not unwind (a drop) and that calls code outside lazybuf
    /// (a memory resource's `deallocate`, a caller's [`crate::backend::Completion`]): a panic
    /// there is recorded on this device as an [`crate::Error::Callback`] naming `operation`
    /// ([`Device::take_deferred_errors`]) instead of unwinding out of a drop, which aborts the
    /// process when the drop runs during another panic's unwinding.
    pub(crate) fn contain_panics(&self, operation: &'static str, f: impl FnOnce()) {
        if let Some(err) = panic_as_error(operation, f) {
            self.record_deferred_error(err);
        }
    }

    /// Records the error of `result`, if any ([`Device::record_deferred_error`]).
    pub fn record_deferred<T>(&self, result: Result<T>) {
        self.inner.deferred.record_err(result);
    }

    /// The failures recorded on drop, rollback and free paths of this device's work since the
    /// last call (lazybuf's own, and the backend's: a failed free of device memory), oldest
    /// first; each is returned once. At most 64 of each are kept between two calls; the second
    /// value counts those dropped beyond ([`crate::backend::deferred`]).
    ///
    /// ```
    /// let device = lazybuf::Device::host();
    /// let (errors, dropped) = device.take_deferred_errors();
    /// assert!(errors.is_empty() && dropped == 0, "nothing failed");
    /// ```
    pub fn take_deferred_errors(&self) -> (Vec<crate::Error>, u64) {
        let (mut errors, mut dropped) = self.inner.deferred.take();
        let (backend, backend_dropped) = self.inner.backend.take_deferred_errors();
        errors.extend(backend);
        dropped += backend_dropped;
        (errors, dropped)
    }

    /// Waits for all work queued on the device's default stream.
    pub fn synchronize(&self) -> Result<()> {
        self.inner.backend.synchronize()
    }

    /// Gives back memory the backend keeps for its own transfers (pinned staging); lazybuf
    /// makes it again when needed. [`crate::trim`] also empties the caches.
    pub fn trim(&self) {
        self.inner.backend.trim();
    }

    /// The runtime's handles (context, default queue), for launching kernels on lazybuf's
    /// queue.
    ///
    /// # Safety
    /// The handles are borrowed: they are valid while any clone of this `Device` lives, and
    /// must not be released by the caller.
    pub unsafe fn raw(&self) -> RawDevice {
        self.inner.backend.raw()
    }

    /// The handle foreign code uses for `memory`, memory of this device, as an integer: the
    /// raw handle's [`RawMemory::as_int`], except on wgpu, where it is the graphics API's own
    /// buffer handle (a `VkBuffer` on Vulkan; 0 on other graphics APIs and when empty).
    ///
    /// # Safety
    /// `memory` is live memory of this device (a wgpu buffer is read).
    pub unsafe fn native_handle(&self, memory: RawMemory) -> usize {
        // SAFETY: forwarded contract.
        unsafe { self.inner.backend.native_handle(memory) }
    }

    /// Whether a selector name other than the backend's own picks this device (wgpu's
    /// `vulkan`, `metal`, `dx12`: the graphics API under it).
    pub fn answers_to(&self, selector: &str) -> bool {
        self.inner.backend.answers_to(selector)
    }

    /// Whether the device keeps working in a child made by `fork` (only the host device
    /// does; others are refused there, see [`crate::backend::fork`]).
    pub fn survives_fork(&self) -> bool {
        self.inner.backend.survives_fork()
    }

    /// The runtime that drives the device, as its own type `R` (a
    /// [`crate::backend::wgpu::WgpuBackend`], say), for its runtime-specific methods; `None`
    /// when another runtime drives it.
    pub fn backend_as<R: Runtime>(&self) -> Option<&R> {
        (&*self.inner.backend as &dyn std::any::Any).downcast_ref::<Checked<R>>().map(Checked::runtime)
    }

    /// The backend that drives the device (the checked layer over its runtime). Its
    /// operations take lengths unchecked: enqueue work through [`Stream`]'s operations, which
    /// check them.
    pub(crate) fn backend(&self) -> &dyn Backend {
        &*self.inner.backend
    }

    /// The counter of this device's bytes held by lazybuf's caches (the pools keep it).
    pub(crate) fn cached_bytes(&self) -> &AtomicU64 {
        &self.inner.cached
    }
}

impl PartialEq for Device {
    fn eq(&self, other: &Self) -> bool {
        self.inner.id == other.inner.id
    }
}

impl Eq for Device {}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Device({:?} {}: {})", self.inner.id, self.info().backend, self.info().name)
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.info().name, self.info().backend)
    }
}

/// One in-order queue of work on a device: a CUDA stream, an OpenCL command queue, or the
/// host's immediate stream. Work on one stream runs in order; streams are ordered with each
/// other only through tickets ([`Stream::wait_for`]).
#[derive(Clone)]
pub struct Stream {
    device: Device,
    handle: Arc<dyn StreamHandle>,
}

impl Stream {
    /// The device the stream belongs to.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// A ticket that completes when everything enqueued on the stream so far has, lazybuf's
    /// work and the caller's kernels alike: hand it to another stream, or wait on it.
    pub fn marker(&self) -> Result<Ticket> {
        self.device.backend().marker(&*self.handle)
    }

    /// Orders everything enqueued on this stream from now on after `ticket` (an event of the
    /// caller's own stream, a transfer's ticket): on the device where the runtime can, else by
    /// waiting for it here.
    pub fn wait_for(&self, ticket: &Ticket) -> Result<()> {
        self.device.backend().wait_on(&*self.handle, ticket)
    }

    /// Waits until everything enqueued on the stream so far is done.
    pub fn synchronize(&self) -> Result<()> {
        self.marker()?.wait()
    }

    /// The runtime's handle (a `CUstream`, a `cl_command_queue`).
    ///
    /// # Safety
    /// The handle is borrowed: valid while any clone of this `Stream` lives, and not to be
    /// released by the caller.
    pub unsafe fn raw(&self) -> RawStream {
        self.handle.raw()
    }

    /// The backend's handle.
    pub fn handle(&self) -> &dyn StreamHandle {
        &*self.handle
    }

    /// Refuses memory that is not this stream's device's (for empty operations, which do not
    /// reach the backend, where the check is made for the others).
    fn check_owned(&self, operation: &'static str, memory: &DeviceMemory) -> Result<()> {
        check_owned(&self.device, operation, memory)
    }

    /// Enqueues a copy of all of `src` into the first `src.len()` bytes of `dst`, memory of
    /// this stream's device. Lengths beyond `dst` are an [`crate::Error::LengthMismatch`]; an
    /// empty `src` is a completed ticket, with no runtime call.
    ///
    /// # Safety
    /// `src` must stay valid for reads, and unwritten, until the returned ticket is complete.
    #[inline]
    pub unsafe fn upload(&self, src: HostSpan, dst: &mut DeviceMemory) -> Result<Ticket> {
        check_fits("upload", dst.len(), src.len())?;
        if src.is_empty() {
            return self.check_owned("upload", dst).map(|()| Ticket::done());
        }
        // SAFETY: forwarded contract; checked above: `src` is not empty and fits `dst` (the
        // backend checks that `dst` is this device's).
        unsafe { self.device.backend().upload(&*self.handle, src, dst) }
    }

    /// Enqueues a copy of the first `dst.len()` bytes of `src`, memory of this stream's
    /// device, into all of `dst`. Lengths beyond `src` are an
    /// [`crate::Error::LengthMismatch`]; an empty `dst` is a completed ticket.
    ///
    /// # Safety
    /// `dst` must stay valid for writes, and otherwise untouched, until the returned ticket
    /// is complete.
    #[inline]
    pub unsafe fn download(&self, src: &DeviceMemory, dst: HostSpan) -> Result<Ticket> {
        check_fits("download", src.len(), dst.len())?;
        if dst.is_empty() {
            return self.check_owned("download", src).map(|()| Ticket::done());
        }
        // SAFETY: forwarded contract; checked above: `dst` is not empty and fits in `src` (the
        // backend checks that `src` is this device's).
        unsafe { self.device.backend().download(&*self.handle, src, dst) }
    }

    /// Enqueues a fill of the first `bytes` of `dst` with repetitions of `pattern`: one
    /// element of 1, 2, 4, 8 or 16 bytes, `bytes` a multiple of it (else an
    /// [`crate::Error::InvalidArgument`], on every device).
    pub fn fill(&self, dst: &mut DeviceMemory, pattern: &[u8], bytes: usize) -> Result<Ticket> {
        check_fits("fill", dst.len(), bytes)?;
        check_fill_pattern("fill", pattern, bytes)?;
        if bytes == 0 {
            return self.check_owned("fill", dst).map(|()| Ticket::done());
        }
        // SAFETY: checked above: `bytes` is not 0 and fits `dst`, the pattern is one element
        // of 1, 2, 4, 8 or 16 bytes dividing it (the backend checks that `dst` is this
        // device's).
        unsafe { self.device.backend().fill(&*self.handle, dst, pattern, bytes) }
    }

    /// Enqueues a copy of the first `bytes` of `src` into `dst`, both memory of this
    /// stream's device.
    pub fn copy(&self, src: &DeviceMemory, dst: &mut DeviceMemory, bytes: usize) -> Result<Ticket> {
        check_fits("copy", src.len().min(dst.len()), bytes)?;
        if bytes == 0 {
            return self
                .check_owned("copy", src)
                .and_then(|()| self.check_owned("copy", dst))
                .map(|()| Ticket::done());
        }
        // SAFETY: checked above: `bytes` is not 0 and fits both (the backend checks that both
        // are this device's).
        unsafe { self.device.backend().copy(&*self.handle, src, dst, bytes) }
    }

    /// Enqueues a copy of the first `bytes` of `src`, memory of `src_device`, into `dst`,
    /// memory of this stream's device, without the host; `None` when the two devices cannot
    /// copy directly ([`Device::can_copy_from`]). The caller orders this stream after the
    /// source's last writer.
    pub fn copy_from_peer(
        &self,
        src_device: &Device,
        src: &DeviceMemory,
        dst: &mut DeviceMemory,
        bytes: usize,
    ) -> Option<Result<Ticket>> {
        if !self.device.can_copy_from(src_device) {
            return None;
        }
        if let Err(err) = check_fits("copy_from_peer", src.len().min(dst.len()), bytes) {
            return Some(Err(err));
        }
        if bytes == 0 {
            let owned = self
                .check_owned("copy_from_peer", dst)
                .and_then(|()| check_owned(src_device, "copy_from_peer", src));
            return Some(owned.map(|()| Ticket::done()));
        }
        // SAFETY: checked above: `bytes` is not 0 and fits both (the backend checks that `dst`
        // is this device's memory and `src` is `src_device`'s).
        unsafe { self.device.backend().copy_from_peer(&*self.handle, src_device.backend(), src, dst, bytes) }
    }

    /// Enqueues a move of shared memory's pages (memory of this stream's device) to the
    /// device (`to_device`) or to the host, so the next accesses there do not fault; other
    /// memory, and empty memory, needs nothing.
    pub fn prefetch(&self, memory: &DeviceMemory, to_device: bool) -> Result<Ticket> {
        self.device.backend().prefetch(&*self.handle, memory, to_device)
    }

    /// A number that identifies the stream while it lives (for stream-ordered free lists).
    pub fn key(&self) -> usize {
        Arc::as_ptr(&self.handle).cast::<()>() as usize
    }
}

/// Refuses memory that is not `device`'s, with an error naming what was expected.
fn check_owned(device: &Device, operation: &'static str, memory: &DeviceMemory) -> Result<()> {
    if device.backend().owns(memory) {
        return Ok(());
    }
    Err(crate::Error::invalid(
        operation,
        format!("expected memory of {}, got {memory:?}", device.info().name),
    ))
}

impl PartialEq for Stream {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl Eq for Stream {}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Stream({:?} on {:?})", self.handle.raw(), self.device)
    }
}

/// The one fill-pattern rule, for every fill on every device and on the host: one element of
/// 1, 2, 4, 8 or 16 bytes whose length divides the `bytes` filled (else an
/// [`crate::Error::InvalidArgument`] naming `operation`).
pub(crate) fn check_fill_pattern(operation: &'static str, pattern: &[u8], bytes: usize) -> Result<()> {
    if !matches!(pattern.len(), 1 | 2 | 4 | 8 | 16) || !bytes.is_multiple_of(pattern.len()) {
        return Err(crate::Error::invalid(
            operation,
            format!(
                "expected a pattern of 1, 2, 4, 8 or 16 bytes whose length divides {bytes}; got {} bytes",
                pattern.len()
            ),
        ));
    }
    Ok(())
}

/// Runs `f`; a panic in it becomes the [`crate::Error::Callback`] naming `operation` that
/// [`Device::contain_panics`] records, returned for the caller to record where `f` borrows
/// what holds the device (a buffer's drop), so that no device handle is cloned per call.
pub(crate) fn panic_as_error(operation: &'static str, f: impl FnOnce()) -> Option<crate::Error> {
    let payload = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).err()?;
    let message = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string());
    Some(crate::Error::Callback {
        operation,
        message: format!("code outside lazybuf panicked: {message}"),
        payload: crate::error::CallbackPayload(std::sync::Arc::new(message)),
    })
}
