//! The checked layer: one generic [`Backend`] over every [`Runtime`].
//!
//! [`Checked`] is the only implementation of [`Backend`] a runtime gets (as wgpu's dynamic
//! layer wraps wgpu-hal's typed one, and RMM's resources validate in one place). Each
//! operation here, for every runtime:
//! - downcasts the stream and memory handles to the runtime's own types, once, and refuses
//!   handles of another runtime or of another device or context ([`Runtime::owns`]) with an
//!   error naming the operation and what was expected;
//! - refuses everything that would call a runtime which does not survive `fork` in a forked
//!   child ([`Error::ForkedChild`], see [`super::fork`]), and answers what calls no runtime
//!   (ownership, the default stream, empty operations) there too;
//! - wraps what the runtime allocates in [`DeviceMemory`] with its length and kind.
//!
//! Lengths, empty operations and fill patterns are checked just above, by [`crate::Stream`],
//! the only caller of the operations: so a runtime sees validated input only.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use super::fork;
use super::runtime::{Allocated, Runtime};
use super::{
    Backend, Block, DeviceInfo, DeviceMemory, HostSpan, MemoryInfo, MemoryKind, RawDevice, RawMemory,
    RawStream, StreamHandle, Ticket,
};
use crate::error::{Error, Result};
use crate::host_memory::HostMemory;

/// A runtime behind the generic checks ([`Backend`] for every [`Runtime`]).
pub struct Checked<R: Runtime> {
    runtime: R,
    /// The fork count when the device was opened ([`fork::forks`]).
    forks: u64,
}

/// `runtime` as the rest of lazybuf drives it: behind the checked layer. Give it an identity
/// with [`crate::Device::from_backend`].
pub fn open<R: Runtime>(runtime: R) -> Arc<dyn Backend> {
    Arc::new(Checked::new(runtime))
}

impl<R: Runtime> Checked<R> {
    /// Puts `runtime` behind the checks.
    pub fn new(runtime: R) -> Self {
        if !R::SURVIVES_FORK {
            fork::watch_forks();
        }
        Checked { runtime, forks: fork::forks() }
    }

    /// The runtime, for its own methods.
    pub fn runtime(&self) -> &R {
        &self.runtime
    }

    /// `Ok` where the runtime may be called: anywhere if it survives `fork`, else only in the
    /// process that opened it.
    #[inline]
    fn alive(&self) -> Result<()> {
        if R::SURVIVES_FORK || fork::forks() == self.forks { Ok(()) } else { Err(self.forked()) }
    }

    #[cold]
    fn forked(&self) -> Error {
        let info = self.runtime.info();
        Error::ForkedChild { device: info.name.clone(), backend: info.backend }
    }

    fn in_child(&self) -> bool {
        self.alive().is_err()
    }

    /// `memory` as this runtime's, if it is this device's.
    #[inline]
    fn memory<'m>(&self, operation: &'static str, memory: &'m DeviceMemory) -> Result<&'m R::Memory> {
        match memory.handle::<R::Memory>() {
            Some(handle) if self.runtime.owns(handle) => Ok(handle),
            _ => Err(self.foreign(operation, "memory", memory)),
        }
    }

    /// `stream` as this runtime's, if it is this device's.
    #[inline]
    fn stream<'s>(&self, operation: &'static str, stream: &'s dyn StreamHandle) -> Result<&'s R::Stream> {
        match (stream as &dyn Any).downcast_ref::<R::Stream>() {
            Some(handle) if self.runtime.owns_stream(handle) => Ok(handle),
            _ => Err(self.foreign(operation, "a stream", stream)),
        }
    }

    /// The stream of an operation, which its caller promises is this device's (a
    /// [`crate::Stream`] always carries its own device's handle): checked in debug builds only,
    /// so the hot path makes no call through the vtable for it.
    ///
    /// # Safety
    /// `stream` was made by this backend (its default stream, `create_stream` or
    /// `wrap_stream`).
    #[inline]
    unsafe fn own_stream<'s>(&self, stream: &'s dyn StreamHandle) -> &'s R::Stream {
        debug_assert!(self.stream("operation", stream).is_ok(), "{stream:?} is not a stream of {self:?}");
        // SAFETY: the caller's promise: this backend made the stream, so it is an `R::Stream`.
        unsafe { &*(stream as *const dyn StreamHandle).cast::<R::Stream>() }
    }

    #[cold]
    fn foreign(&self, operation: &'static str, what: &str, got: &dyn fmt::Debug) -> Error {
        Error::invalid(operation, format!("expected {what} of {}, got {got:?}", self.runtime.info().name))
    }

    /// The other backend as this runtime, when it is one (through any wrappers that say so).
    fn peer<'b>(&self, other: &'b dyn Backend) -> Option<&'b R> {
        let mut other = other;
        while let Some(inner) = other.wrapped() {
            other = inner;
        }
        (other as &dyn Any).downcast_ref::<Checked<R>>().map(|checked| &checked.runtime)
    }
}

impl<R: Runtime> fmt::Debug for Checked<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.runtime.fmt(f)
    }
}

impl<R: Runtime> Backend for Checked<R> {
    fn info(&self) -> &DeviceInfo {
        self.runtime.info()
    }

    fn survives_fork(&self) -> bool {
        R::SURVIVES_FORK
    }

    fn ordered_uploads(&self) -> bool {
        R::ORDERED_UPLOADS
    }

    #[inline]
    fn check_usable(&self) -> Result<()> {
        self.alive()
    }

    fn memory_info(&self) -> Result<MemoryInfo> {
        self.alive()?;
        self.runtime.memory_info()
    }

    fn default_stream(&self) -> Arc<dyn StreamHandle> {
        // Made when the device was opened: no runtime call.
        self.runtime.default_stream()
    }

    fn create_stream(&self) -> Result<Arc<dyn StreamHandle>> {
        self.alive()?;
        Ok(self.runtime.create_stream()?)
    }

    unsafe fn wrap_stream(&self, raw: RawStream) -> Result<Arc<dyn StreamHandle>> {
        self.alive()?;
        // SAFETY: forwarded contract.
        Ok(unsafe { self.runtime.wrap_stream(raw) }?)
    }

    fn pins_host_memory(&self) -> bool {
        self.runtime.pins_host_memory()
    }

    fn allocate(&self, kind: MemoryKind, bytes: usize) -> Result<Block> {
        self.alive()?;
        Ok(match (self.runtime.allocate(kind, bytes)?, kind) {
            (Allocated::Host(block), MemoryKind::Host { .. }) => Block::Host(block),
            (Allocated::Memory(memory), MemoryKind::Device) => {
                // SAFETY: the runtime allocated `bytes` for this handle; its `MemoryHandle` impl
                // promises its host address (if any) covers them.
                Block::Device(unsafe { DeviceMemory::new(bytes, false, Box::new(memory)) })
            }
            (Allocated::Memory(memory), MemoryKind::Shared) => {
                // SAFETY: as above.
                Block::Device(unsafe { DeviceMemory::shared(bytes, Box::new(memory)) })
            }
            (other, kind) => {
                // A runtime's bug, refused rather than handed out as the wrong kind.
                drop(other);
                return Err(Error::invalid(
                    "allocate",
                    format!(
                        "{} returned another kind of memory than the {} asked for",
                        self.info().name,
                        kind.name()
                    ),
                ));
            }
        })
    }

    unsafe fn borrow(&self, raw: RawMemory, len: usize) -> Result<DeviceMemory> {
        self.alive()?;
        // SAFETY: forwarded contract.
        let memory = unsafe { self.runtime.borrow(raw, len) }?;
        // SAFETY: the caller promised `raw` valid for `len` bytes while the memory lives, and
        // the runtime's handle addresses (if at all) what it borrowed.
        Ok(unsafe { DeviceMemory::new(len, false, Box::new(memory)) })
    }

    fn alignment(&self, kind: MemoryKind) -> usize {
        self.runtime.alignment(kind)
    }

    fn zero_copy(&self, bytes: usize) -> bool {
        self.runtime.zero_copy(bytes)
    }

    fn alias_host(&self, host: &mut HostMemory, bytes: usize) -> Option<Result<DeviceMemory>> {
        let len = bytes.min(host.len());
        if !self.runtime.zero_copy(len) {
            return None;
        }
        if let Err(err) = self.alive() {
            return Some(Err(err));
        }
        let memory = self.runtime.alias_host(host, len)?;
        // SAFETY: the runtime aliased the first `len` bytes of `host` (at most its length);
        // its handle addresses (if at all) those bytes.
        Some(memory.map(|memory| unsafe { DeviceMemory::new(len, true, Box::new(memory)) }))
    }

    /// No runtime call: answered in a forked child too.
    fn owns(&self, memory: &DeviceMemory) -> bool {
        memory.handle::<R::Memory>().is_some_and(|handle| self.runtime.owns(handle))
    }

    #[inline]
    unsafe fn upload(
        &self,
        stream: &dyn StreamHandle,
        src: HostSpan,
        dst: &mut DeviceMemory,
    ) -> Result<Ticket> {
        let dst = self.memory("upload", dst)?;
        self.alive()?;
        // SAFETY: forwarded contract (Stream checked the lengths, and the stream is this
        // device's); the memory is this device's, and `dst` was borrowed mutably.
        let stream = unsafe { self.own_stream(stream) };
        // SAFETY: as above.
        unsafe { self.runtime.upload(stream, src, dst) }
    }

    #[inline]
    unsafe fn download(
        &self,
        stream: &dyn StreamHandle,
        src: &DeviceMemory,
        dst: HostSpan,
    ) -> Result<Ticket> {
        let src = self.memory("download", src)?;
        self.alive()?;
        // SAFETY: forwarded contract (Stream checked the lengths, and the stream is this
        // device's); the memory is this device's.
        let stream = unsafe { self.own_stream(stream) };
        // SAFETY: as above.
        unsafe { self.runtime.download(stream, src, dst) }
    }

    unsafe fn fill(
        &self,
        stream: &dyn StreamHandle,
        dst: &mut DeviceMemory,
        pattern: &[u8],
        bytes: usize,
    ) -> Result<Ticket> {
        let dst = self.memory("fill", dst)?;
        self.alive()?;
        // SAFETY: forwarded contract (Stream checked the length and the pattern, and the
        // stream is this device's); the memory is this device's, and `dst` was borrowed
        // mutably.
        let stream = unsafe { self.own_stream(stream) };
        // SAFETY: as above.
        unsafe { self.runtime.fill(stream, dst, pattern, bytes) }
    }

    unsafe fn copy(
        &self,
        stream: &dyn StreamHandle,
        src: &DeviceMemory,
        dst: &mut DeviceMemory,
        bytes: usize,
    ) -> Result<Ticket> {
        let (src, dst) = (self.memory("copy", src)?, self.memory("copy", dst)?);
        self.alive()?;
        // SAFETY: forwarded contract (Stream checked the length, and the stream is this
        // device's); the memory is this device's, and `dst`, borrowed mutably, is not `src`.
        let stream = unsafe { self.own_stream(stream) };
        // SAFETY: as above.
        unsafe { self.runtime.copy(stream, src, dst, bytes) }
    }

    fn prefetch(&self, stream: &dyn StreamHandle, memory: &DeviceMemory, to_device: bool) -> Result<Ticket> {
        let (stream, handle) = (self.stream("prefetch", stream)?, self.memory("prefetch", memory)?);
        if memory.kind() != MemoryKind::Shared || memory.is_empty() {
            return Ok(Ticket::done());
        }
        self.alive()?;
        // SAFETY: the length is the memory's own, not 0; the handles are this device's.
        unsafe { self.runtime.prefetch(stream, handle, memory.len(), to_device) }
    }

    fn can_copy_from_peer(&self, src: &dyn Backend) -> bool {
        !self.in_child() && self.peer(src).is_some_and(|peer| self.runtime.can_copy_from_peer(peer))
    }

    unsafe fn copy_from_peer(
        &self,
        stream: &dyn StreamHandle,
        src_backend: &dyn Backend,
        src: &DeviceMemory,
        dst: &mut DeviceMemory,
        bytes: usize,
    ) -> Option<Result<Ticket>> {
        let peer = self.peer(src_backend)?;
        let handles = self.stream("copy_from_peer", stream).and_then(|stream| {
            let src = match src.handle::<R::Memory>() {
                Some(handle) if peer.owns(handle) => handle,
                _ => return Err(self.foreign("copy_from_peer", "memory", src)),
            };
            Ok((stream, src, self.memory("copy_from_peer", dst)?))
        });
        let (stream, src, dst) = match handles.and_then(|handles| self.alive().map(|()| handles)) {
            Ok(handles) => handles,
            Err(err) => return Some(Err(err)),
        };
        // SAFETY: forwarded contract (Stream checked the length); `src` is the peer's memory
        // and `dst` this device's.
        unsafe { self.runtime.copy_from_peer(stream, peer, src, dst, bytes) }
    }

    fn wait_on(&self, stream: &dyn StreamHandle, ticket: &Ticket) -> Result<()> {
        let stream = self.stream("wait_on", stream)?;
        self.alive()?;
        self.runtime.wait_on(stream, ticket)
    }

    fn marker(&self, stream: &dyn StreamHandle) -> Result<Ticket> {
        let stream = self.stream("marker", stream)?;
        self.alive()?;
        self.runtime.marker(stream)
    }

    fn synchronize(&self) -> Result<()> {
        self.alive()?;
        self.runtime.synchronize()
    }

    fn raw(&self) -> RawDevice {
        // The handles themselves: using them in a child is the caller's own runtime call.
        self.runtime.raw()
    }

    unsafe fn native_handle(&self, memory: RawMemory) -> usize {
        // SAFETY: forwarded contract.
        unsafe { self.runtime.native_handle(memory) }
    }

    fn answers_to(&self, selector: &str) -> bool {
        self.runtime.answers_to(selector)
    }

    fn prepare_host(&self, host: &mut HostMemory) {
        // Preparing is optional (a registration with the driver): skipped in a child.
        if !self.in_child() {
            self.runtime.prepare_host(host);
        }
    }

    fn trim(&self) {
        // Trimming frees runtime memory: in a child it is leaked instead (see `fork`).
        if !self.in_child() {
            self.runtime.trim();
        }
    }

    fn take_deferred_errors(&self) -> (Vec<Error>, u64) {
        self.runtime.take_deferred_errors()
    }
}
