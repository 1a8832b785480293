//! Forked children, and the runtimes that do not survive `fork`.
//!
//! `fork` copies only the calling thread. A runtime that runs worker threads (PoCL's OpenCL
//! device, the CUDA driver) is left in the child with its locks held and its workers gone, so
//! the child's first call into it hangs forever or crashes (PyOpenCL and CuPy hang the same
//! way). Each backend states whether its runtime survives ([`Backend::survives_fork`]: the
//! host does; OpenCL, CUDA and wgpu do not).
//!
//! **Detection.** When the first device of a backend that does not survive is opened, lazybuf
//! registers a `pthread_atfork` child handler that counts forks (a relaxed atomic: the handler
//! runs in the child's only thread, before `fork` returns there). [`Device::from_backend`]
//! wraps such a backend in a [`ForkGuard`], which records the count when the device is opened;
//! every backend operation passes through the guard, which compares the count with one
//! relaxed load and, in a child, returns [`Error::ForkedChild`] naming the device instead of
//! calling the runtime. The host device, and any backend that survives, is not wrapped and
//! keeps working in the child. What calls no runtime is not refused: [`Backend::owns`], and
//! empty operations, which [`crate::Stream`] completes without reaching the backend.
//!
//! **Releasing in a child.** Dropping a runtime object (memory, a queue, an event, a pinned
//! host block) in a child would call into the dead runtime too, so the backends' `Drop`s check
//! [`in_forked_child`] and leak their handles there instead: the child's address space, and so
//! the copy of the memory, goes away with the child.
//!
//! [`Device::from_backend`]: crate::Device::from_backend

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{
    Backend, DeviceInfo, DeviceMemory, HostSpan, MemoryInfo, MemoryKind, RawDevice, RawMemory, RawStream,
    StreamHandle, Ticket,
};
use crate::error::{Error, Result};
use crate::host_memory::HostMemory;

/// How many times this process's line of ancestors forked since a runtime that does not
/// survive `fork` was first opened in it (0 in the process that opened it).
static FORKS: AtomicU64 = AtomicU64::new(0);

/// The `pthread_atfork` child handler: counts the fork. Async-signal-safe (one atomic add).
#[cfg(unix)]
extern "C" fn count_fork() {
    FORKS.fetch_add(1, Ordering::Relaxed);
}

/// Registers the fork counter, once per process.
fn watch_forks() {
    #[cfg(unix)]
    {
        static REGISTERED: std::sync::Once = std::sync::Once::new();
        REGISTERED.call_once(|| {
            // SAFETY: registers a child handler that only does an atomic add (allowed between
            // fork and exec); the handler is a plain function that lives for the whole process.
            // A failure (ENOMEM) leaves forks undetected, as before this module existed.
            unsafe { libc::pthread_atfork(None, None, Some(count_fork)) };
        });
    }
}

/// Whether this process is a forked child of a process that had opened a runtime that does not
/// survive `fork`: such a runtime's objects must be leaked here, never released.
#[inline]
pub fn in_forked_child() -> bool {
    FORKS.load(Ordering::Relaxed) != 0
}

/// `backend` as [`crate::Device::from_backend`] keeps it: as it is when it survives `fork`,
/// else behind a [`ForkGuard`].
pub(crate) fn guard(backend: Arc<dyn Backend>) -> Arc<dyn Backend> {
    if backend.survives_fork() {
        return backend;
    }
    watch_forks();
    Arc::new(ForkGuard { forks: FORKS.load(Ordering::Relaxed), inner: backend })
}

/// The backend behind a [`ForkGuard`] (or `backend` itself), for backends that recognise
/// their own kind by downcasting (CUDA's peer copies).
pub fn unguarded(backend: &dyn Backend) -> &dyn Backend {
    match (backend as &dyn std::any::Any).downcast_ref::<ForkGuard>() {
        Some(guard) => &*guard.inner,
        None => backend,
    }
}

/// A backend whose runtime does not survive `fork`, refusing every operation in a forked
/// child (see the module docs).
#[derive(Debug)]
pub struct ForkGuard {
    /// [`FORKS`] when the device was opened.
    forks: u64,
    inner: Arc<dyn Backend>,
}

impl ForkGuard {
    /// `Ok` in the process that opened the device; [`Error::ForkedChild`] in a forked child.
    #[inline]
    fn check(&self) -> Result<()> {
        if FORKS.load(Ordering::Relaxed) == self.forks { Ok(()) } else { Err(self.forked()) }
    }

    #[cold]
    fn forked(&self) -> Error {
        let info = self.inner.info();
        Error::ForkedChild { device: info.name.clone(), backend: info.backend }
    }

    fn in_child(&self) -> bool {
        FORKS.load(Ordering::Relaxed) != self.forks
    }
}

impl Backend for ForkGuard {
    fn info(&self) -> &DeviceInfo {
        self.inner.info()
    }

    fn survives_fork(&self) -> bool {
        false
    }

    fn memory_info(&self) -> Result<MemoryInfo> {
        self.check()?;
        self.inner.memory_info()
    }

    fn default_stream(&self) -> Arc<dyn StreamHandle> {
        // The stream made when the device was opened: no runtime call.
        self.inner.default_stream()
    }

    fn create_stream(&self) -> Result<Arc<dyn StreamHandle>> {
        self.check()?;
        self.inner.create_stream()
    }

    unsafe fn wrap_stream(&self, raw: RawStream) -> Result<Arc<dyn StreamHandle>> {
        self.check()?;
        // SAFETY: forwarded contract.
        unsafe { self.inner.wrap_stream(raw) }
    }

    fn allocate_host(&self, bytes: usize, pinned: bool) -> Result<HostMemory> {
        self.check()?;
        self.inner.allocate_host(bytes, pinned)
    }

    fn pins_host_memory(&self) -> bool {
        self.inner.pins_host_memory()
    }

    fn allocate(&self, bytes: usize) -> Result<DeviceMemory> {
        self.check()?;
        self.inner.allocate(bytes)
    }

    fn allocate_shared(&self, bytes: usize) -> Result<DeviceMemory> {
        self.check()?;
        self.inner.allocate_shared(bytes)
    }

    unsafe fn borrow(&self, raw: RawMemory, len: usize) -> Result<DeviceMemory> {
        self.check()?;
        // SAFETY: forwarded contract.
        unsafe { self.inner.borrow(raw, len) }
    }

    fn alignment(&self, kind: MemoryKind) -> usize {
        self.inner.alignment(kind)
    }

    fn prefetch(&self, stream: &dyn StreamHandle, memory: &DeviceMemory, to_device: bool) -> Result<Ticket> {
        self.check()?;
        self.inner.prefetch(stream, memory, to_device)
    }

    fn zero_copy(&self, bytes: usize) -> bool {
        self.inner.zero_copy(bytes)
    }

    fn alias_host(&self, host: &mut HostMemory, bytes: usize) -> Option<Result<DeviceMemory>> {
        if let Err(err) = self.check() {
            return Some(Err(err));
        }
        self.inner.alias_host(host, bytes)
    }

    /// No runtime call: answered in a forked child too.
    fn owns(&self, memory: &DeviceMemory) -> bool {
        self.inner.owns(memory)
    }

    unsafe fn upload(
        &self,
        stream: &dyn StreamHandle,
        src: HostSpan,
        dst: &mut DeviceMemory,
    ) -> Result<Ticket> {
        self.check()?;
        // SAFETY: forwarded contract.
        unsafe { self.inner.upload(stream, src, dst) }
    }

    unsafe fn download(
        &self,
        stream: &dyn StreamHandle,
        src: &DeviceMemory,
        dst: HostSpan,
    ) -> Result<Ticket> {
        self.check()?;
        // SAFETY: forwarded contract.
        unsafe { self.inner.download(stream, src, dst) }
    }

    unsafe fn fill(
        &self,
        stream: &dyn StreamHandle,
        dst: &mut DeviceMemory,
        pattern: &[u8],
        bytes: usize,
    ) -> Result<Ticket> {
        self.check()?;
        // SAFETY: forwarded contract.
        unsafe { self.inner.fill(stream, dst, pattern, bytes) }
    }

    unsafe fn copy(
        &self,
        stream: &dyn StreamHandle,
        src: &DeviceMemory,
        dst: &mut DeviceMemory,
        bytes: usize,
    ) -> Result<Ticket> {
        self.check()?;
        // SAFETY: forwarded contract.
        unsafe { self.inner.copy(stream, src, dst, bytes) }
    }

    fn can_copy_from_peer(&self, src: &dyn Backend) -> bool {
        !self.in_child() && self.inner.can_copy_from_peer(unguarded(src))
    }

    unsafe fn copy_from_peer(
        &self,
        stream: &dyn StreamHandle,
        src_backend: &dyn Backend,
        src: &DeviceMemory,
        dst: &mut DeviceMemory,
        bytes: usize,
    ) -> Option<Result<Ticket>> {
        if let Err(err) = self.check() {
            return Some(Err(err));
        }
        // SAFETY: forwarded contract (the unguarded backend drives the same memory).
        unsafe { self.inner.copy_from_peer(stream, unguarded(src_backend), src, dst, bytes) }
    }

    fn wait_on(&self, stream: &dyn StreamHandle, ticket: &Ticket) -> Result<()> {
        self.check()?;
        self.inner.wait_on(stream, ticket)
    }

    fn marker(&self, stream: &dyn StreamHandle) -> Result<Ticket> {
        self.check()?;
        self.inner.marker(stream)
    }

    fn synchronize(&self) -> Result<()> {
        self.check()?;
        self.inner.synchronize()
    }

    fn raw(&self) -> RawDevice {
        // The handles themselves: using them in a child is the caller's own runtime call.
        self.inner.raw()
    }

    fn answers_to(&self, selector: &str) -> bool {
        self.inner.answers_to(selector)
    }

    fn prepare_host(&self, host: &mut HostMemory) {
        // Preparing is optional (a registration with the driver): skipped in a child.
        if !self.in_child() {
            self.inner.prepare_host(host);
        }
    }

    fn take_deferred_errors(&self) -> (Vec<Error>, u64) {
        self.inner.take_deferred_errors()
    }

    fn trim(&self) {
        // Trimming frees runtime memory: in a child it is leaked instead (see the module docs).
        if !self.in_child() {
            self.inner.trim();
        }
    }
}
