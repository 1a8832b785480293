//! The host device's memory handle (its own host block, or an alias of a buffer's host block)
//! and its stream.

use std::ptr::NonNull;
use std::sync::Arc;

use crate::backend::fork::ForkAwareOnce;
use crate::backend::{MemoryHandle, RawMemory, RawStream, StreamHandle};
use crate::host_memory::HostMemory;

/// Host-device memory: a pointer to `len` bytes, owned, aliased or borrowed.
#[derive(Debug)]
pub struct HostDeviceMemory {
    ptr: NonNull<u8>,
    len: usize,
    /// The block, when this memory owns one; `None` for an alias of a buffer's host block or
    /// memory borrowed from the caller.
    _owned: Option<HostMemory>,
}

// SAFETY: the pointer is into `owned` (moved with it), into the host block of the buffer
// that holds both this alias and that block (the buffer serializes all access through
// &mut self, so no unsynchronized access can happen across threads), or into memory whose
// owner promised (`borrowed`) that it stays valid, ordering its own accesses.
unsafe impl Send for HostDeviceMemory {}
// SAFETY: see Send; shared references only read.
unsafe impl Sync for HostDeviceMemory {}

impl HostDeviceMemory {
    pub(super) fn owned(mut block: HostMemory) -> Self {
        let ptr = NonNull::new(block.as_mut_ptr()).unwrap_or(NonNull::dangling());
        HostDeviceMemory { ptr, len: block.len(), _owned: Some(block) }
    }

    /// The first `len` bytes of `block` (all of it if shorter), owned by the buffer.
    pub(super) fn alias(block: &mut HostMemory, len: usize) -> Self {
        let ptr = NonNull::new(block.as_mut_ptr()).unwrap_or(NonNull::dangling());
        HostDeviceMemory { ptr, len: len.min(block.len()), _owned: None }
    }

    /// `len` bytes at `ptr` that someone else owns.
    ///
    /// # Safety
    /// `ptr` is valid for reads and writes of `len` bytes while the value lives.
    pub(super) unsafe fn borrowed(ptr: NonNull<u8>, len: usize) -> Self {
        HostDeviceMemory { ptr, len, _owned: None }
    }

    pub(super) fn ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The bytes, for writing.
    ///
    /// # Safety
    /// No other reference to the same bytes may be live.
    #[allow(clippy::mut_from_ref)]
    pub(super) unsafe fn bytes_mut(&self) -> &mut [u8] {
        // SAFETY: ptr is valid for len initialized bytes (owned block or the buffer's host
        // block, which outlives this alias); exclusivity is the caller's promise.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

// SAFETY: the host address is the start of the `len` bytes this handle owns or aliases
// (a host block, or borrowed memory under `borrow`'s contract), valid while it lives.
unsafe impl MemoryHandle for HostDeviceMemory {
    fn raw(&self) -> RawMemory {
        RawMemory::Host(if self.len == 0 { std::ptr::null_mut() } else { self.ptr.as_ptr() })
    }

    fn host_address(&self) -> Option<NonNull<u8>> {
        Some(self.ptr)
    }
}

/// The host device's one stream: immediate (work is done when the call returns).
#[derive(Debug)]
pub struct HostStream;

impl HostStream {
    /// The shared immediate stream.
    pub fn shared() -> Arc<HostStream> {
        static STREAM: ForkAwareOnce<Arc<HostStream>> = ForkAwareOnce::new();
        STREAM.get_or_init(|| Arc::new(HostStream)).clone()
    }
}

impl StreamHandle for HostStream {
    fn raw(&self) -> RawStream {
        RawStream::Host
    }
}
