//! The typed layer: what a backend folder implements.
//!
//! A [`Runtime`] is one device of one runtime, with its own memory and stream types. It sees
//! only validated input: [`super::checked::Checked`], the one generic layer above every
//! runtime, has already checked lengths and fill patterns ([`crate::Stream`] does, for every
//! operation), downcast each handle to the runtime's own type, refused handles of another
//! device or context ([`Runtime::owns`], [`Runtime::owns_stream`]), completed empty operations
//! without a call, and refused every operation in a forked child when the runtime does not
//! survive `fork` ([`Runtime::SURVIVES_FORK`]). So a runtime's operations are runtime calls
//! and nothing else, as wgpu-hal's typed `Device` sits under wgpu-core's validation.
//!
//! The dynamic layer the rest of lazybuf uses is [`super::Backend`]; every runtime reaches it
//! through [`super::checked::open`].

use std::fmt;
use std::sync::Arc;

use super::StreamHandle;
use super::info::{DeviceInfo, MemoryInfo};
use super::memory::{HostSpan, MemoryHandle, MemoryKind};
use super::raw::{RawDevice, RawMemory, RawStream};
use super::ticket::Ticket;
use crate::error::{Error, Result};
use crate::host_memory::HostMemory;

/// What [`Runtime::allocate`] hands out: a host block, or memory of the runtime's own type
/// (device or shared memory, as asked).
#[derive(Debug)]
pub enum Allocated<M> {
    /// Host memory ([`MemoryKind::Host`]).
    Host(HostMemory),
    /// Device or shared memory ([`MemoryKind::Device`], [`MemoryKind::Shared`]).
    Memory(M),
}

/// One device of one runtime, typed: the trait a backend folder's `device.rs` implements.
///
/// Transfers act on the first bytes of an allocation (a block may be larger than the buffer
/// using it). An operation that fails to *enqueue* returns the error and has done nothing; one
/// that fails while it runs reports the error through its ticket, and its destination's bytes
/// are then unspecified.
///
/// **Validated input.** The operations are `unsafe`: their callers (the checked layer) promise
/// what `# Safety` says, so a runtime never repeats a check: lengths are not 0 and fit, a
/// fill's pattern is 1, 2, 4, 8 or 16 bytes and divides its length, memory and streams are this
/// device's (its type, and [`Runtime::owns`] said yes).
pub trait Runtime: Send + Sync + fmt::Debug + Sized + 'static {
    /// The runtime's handle to one allocation.
    type Memory: MemoryHandle;
    /// The runtime's handle to one stream (queue).
    type Stream: StreamHandle;

    /// Whether the runtime keeps working in a child made by `fork` of a process that opened
    /// the device. False where the runtime runs threads of its own that `fork` does not copy:
    /// the checked layer then refuses the device in a forked child ([`super::fork`]).
    const SURVIVES_FORK: bool = false;

    /// Whether an upload can complete in its stream's order: work enqueued on the stream after
    /// it starts after it, so the caller need not wait for it ([`super::ticket::Completion::stream_ordered`]
    /// tickets; CUDA's events). Where not, a stream-ordered access
    /// (`RawBuffer::device_access_ordered`) is a blocking one, without an asynchronous upload's
    /// bookkeeping that would be waited for at once anyway.
    const ORDERED_UPLOADS: bool = false;

    /// What the device is.
    fn info(&self) -> &DeviceInfo;

    /// Free and total memory, with where the figure comes from (`cached` is left at 0: the
    /// device handle adds what lazybuf's caches hold).
    fn memory_info(&self) -> Result<MemoryInfo>;

    /// The stream lazybuf uses on this device unless told otherwise (no runtime call).
    fn default_stream(&self) -> Arc<Self::Stream>;

    /// A new stream on this device, independent of the others.
    fn create_stream(&self) -> Result<Arc<Self::Stream>>;

    /// A handle to a stream the caller made on this device; see
    /// [`super::Backend::wrap_stream`].
    ///
    /// # Safety
    /// `raw` is a live stream of this device's context and stays alive while the returned
    /// handle is used.
    unsafe fn wrap_stream(&self, raw: RawStream) -> Result<Arc<Self::Stream>> {
        Err(Error::invalid("wrap_stream", format!("expected a stream of {}, got {raw:?}", self.info().name)))
    }

    /// Whether host memory of this device can be page-locked ([`MemoryKind::Host`] with
    /// `pinned`); false where pinned host memory has no meaning (wgpu), where asking for it is
    /// an error.
    fn pins_host_memory(&self) -> bool {
        true
    }

    /// `bytes` of `kind` with unspecified contents: host blocks for buffers of this device
    /// (page-locked when `pinned`, an error if that is impossible, never a silent pageable
    /// fallback), device memory, or shared memory (an error naming why where the device has
    /// none). Host blocks: [`host_block`] is what a runtime without its own pinned memory
    /// gives.
    fn allocate(&self, kind: MemoryKind, bytes: usize) -> Result<Allocated<Self::Memory>>;

    /// Memory over `len` bytes at `raw` that the caller owns; see [`super::Backend::borrow`].
    ///
    /// # Safety
    /// `raw` stays valid for `len` bytes, and is not freed, while the returned memory lives.
    unsafe fn borrow(&self, raw: RawMemory, len: usize) -> Result<Self::Memory> {
        let _ = len;
        Err(Error::invalid(
            "borrow",
            format!("{} cannot use memory it did not allocate; got {raw:?}", self.info().name),
        ))
    }

    /// The alignment every allocation of `kind` is guaranteed to have; see
    /// [`super::Backend::alignment`].
    fn alignment(&self, kind: MemoryKind) -> usize {
        let _ = kind;
        crate::host_memory::HEAP_ALIGN
    }

    /// Whether a buffer of `bytes` aliases its host block ([`super::Backend::zero_copy`]).
    fn zero_copy(&self, bytes: usize) -> bool {
        let _ = bytes;
        false
    }

    /// Memory that aliases the first `bytes` of `host` when [`Runtime::zero_copy`] says so
    /// for `bytes` (`bytes` is at most `host.len()`); `None` otherwise.
    fn alias_host(&self, host: &mut HostMemory, bytes: usize) -> Option<Result<Self::Memory>> {
        let _ = (host, bytes);
        None
    }

    /// Whether `memory`, of this runtime's type, is this device's (its context). No runtime
    /// call. Yes by default, for runtimes with one device.
    fn owns(&self, memory: &Self::Memory) -> bool {
        let _ = memory;
        true
    }

    /// Whether `stream`, of this runtime's type, is this device's. No runtime call.
    fn owns_stream(&self, stream: &Self::Stream) -> bool {
        let _ = stream;
        true
    }

    /// Enqueues a copy of all of `src` into the first `src.len()` bytes of `dst`.
    ///
    /// # Safety
    /// `src` stays valid for reads, and unwritten, until the ticket is complete; it is not
    /// empty and not longer than `dst`, which no one else accesses meanwhile.
    unsafe fn upload(&self, stream: &Self::Stream, src: HostSpan, dst: &Self::Memory) -> Result<Ticket>;

    /// Enqueues a copy of the first `dst.len()` bytes of `src` into all of `dst`.
    ///
    /// # Safety
    /// `dst` stays valid for writes, and otherwise untouched, until the ticket is complete;
    /// it is not empty and not longer than `src`.
    unsafe fn download(&self, stream: &Self::Stream, src: &Self::Memory, dst: HostSpan) -> Result<Ticket>;

    /// Enqueues a fill of the first `bytes` of `dst` with repetitions of `pattern`.
    ///
    /// # Safety
    /// `bytes` is not 0 and at most the memory's length; `pattern` is one element of 1, 2, 4,
    /// 8 or 16 bytes and divides `bytes`; no one else accesses `dst` meanwhile.
    unsafe fn fill(
        &self,
        stream: &Self::Stream,
        dst: &Self::Memory,
        pattern: &[u8],
        bytes: usize,
    ) -> Result<Ticket>;

    /// Enqueues a copy of the first `bytes` of `src` into `dst`.
    ///
    /// # Safety
    /// `bytes` is not 0 and at most the length of each; `dst` is not `src`, and no one else
    /// accesses it meanwhile.
    unsafe fn copy(
        &self,
        stream: &Self::Stream,
        src: &Self::Memory,
        dst: &Self::Memory,
        bytes: usize,
    ) -> Result<Ticket>;

    /// Enqueues a move of the first `bytes` of shared memory's pages to the device
    /// (`to_device`) or to the host. Called only for [`MemoryKind::Shared`] memory.
    ///
    /// # Safety
    /// `bytes` is not 0 and at most the memory's length.
    unsafe fn prefetch(
        &self,
        stream: &Self::Stream,
        memory: &Self::Memory,
        bytes: usize,
        to_device: bool,
    ) -> Result<Ticket> {
        let _ = (stream, memory, bytes, to_device);
        Ok(Ticket::done())
    }

    /// Whether [`Runtime::copy_from_peer`] can copy memory of `src`, another device of this
    /// runtime, into this device's memory without the host.
    fn can_copy_from_peer(&self, src: &Self) -> bool {
        let _ = src;
        false
    }

    /// Enqueues a copy of the first `bytes` of `src`, memory of `src_runtime`, into `dst`,
    /// without the host; `None` when this pair cannot copy directly.
    ///
    /// # Safety
    /// `bytes` is not 0 and at most the length of each; `dst` is this device's memory and
    /// `src` is `src_runtime`'s; the caller ordered `stream` after the source's last writer.
    unsafe fn copy_from_peer(
        &self,
        stream: &Self::Stream,
        src_runtime: &Self,
        src: &Self::Memory,
        dst: &Self::Memory,
        bytes: usize,
    ) -> Option<Result<Ticket>> {
        let _ = (stream, src_runtime, src, dst, bytes);
        None
    }

    /// Orders work enqueued on `stream` from now on after `ticket`: on the device where the
    /// runtime can (an event wait), else by waiting for it here.
    fn wait_on(&self, stream: &Self::Stream, ticket: &Ticket) -> Result<()> {
        let _ = stream;
        ticket.wait()
    }

    /// A ticket that completes when everything enqueued on `stream` so far has.
    fn marker(&self, stream: &Self::Stream) -> Result<Ticket>;

    /// Waits until all work queued on the device is done.
    fn synchronize(&self) -> Result<()>;

    /// The runtime handles of the device and its default stream.
    fn raw(&self) -> RawDevice;

    /// The handle foreign code uses for `memory` ([`super::Backend::native_handle`]).
    ///
    /// # Safety
    /// `memory` is live memory of this device.
    unsafe fn native_handle(&self, memory: RawMemory) -> usize {
        memory.as_int()
    }

    /// Whether a selector name other than the backend's own picks this device.
    fn answers_to(&self, selector: &str) -> bool {
        let _ = selector;
        false
    }

    /// Prepares a host block that is about to take part in a transfer (CUDA registers large,
    /// often-transferred pageable blocks).
    fn prepare_host(&self, host: &mut HostMemory) {
        let _ = host;
    }

    /// Gives back memory the runtime keeps for its own transfers (staging).
    fn trim(&self) {}

    /// The failures the runtime's own drop and free paths recorded, each returned once.
    fn take_deferred_errors(&self) -> (Vec<Error>, u64) {
        (Vec::new(), 0)
    }
}

/// A host block of `bytes` for a runtime whose pinned memory is lazybuf's own (page-locked
/// with `mlock`/`VirtualLock` when `pinned`).
pub fn host_block(bytes: usize, pinned: bool) -> Result<HostMemory> {
    if pinned { HostMemory::allocate_locked(bytes) } else { HostMemory::allocate(bytes) }
}
