//! The host device's memory handle: either its own host block or an alias of a buffer's host
//! block.

use std::any::Any;

use crate::backend::{MemoryHandle, RawMemory};
use crate::host_memory::HostMemory;

/// Host-device memory: a pointer to `len` bytes, owned or aliased.
#[derive(Debug)]
pub struct HostDeviceMemory {
    ptr: *mut u8,
    len: usize,
    /// The block, when this memory owns one; `None` for an alias of a buffer's host block.
    _owned: Option<HostMemory>,
}

// SAFETY: the pointer is either into `owned` (moved with it) or into the host block of the
// buffer that holds both this alias and that block; the buffer serializes all access through
// &mut self, so no unsynchronized access can happen across threads.
unsafe impl Send for HostDeviceMemory {}
// SAFETY: see Send; shared references only read.
unsafe impl Sync for HostDeviceMemory {}

impl HostDeviceMemory {
    pub(super) fn owned(mut block: HostMemory) -> Self {
        HostDeviceMemory { ptr: block.as_mut_ptr(), len: block.len(), _owned: Some(block) }
    }

    pub(super) fn alias(block: &mut HostMemory) -> Self {
        HostDeviceMemory { ptr: block.as_mut_ptr(), len: block.len(), _owned: None }
    }

    pub(super) fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// The bytes.
    ///
    /// # Safety
    /// No `&mut` to the same bytes (the aliased host block) may be live.
    pub(crate) unsafe fn bytes(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialized bytes (owned block or the buffer's host
        // block, which outlives this alias); exclusivity is the caller's promise.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The bytes, for writing.
    ///
    /// # Safety
    /// No other reference to the same bytes may be live.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn bytes_mut(&self) -> &mut [u8] {
        // SAFETY: as in `bytes`, with exclusivity promised by the caller.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl MemoryHandle for HostDeviceMemory {
    fn raw(&self) -> RawMemory {
        RawMemory::Host(if self.len == 0 { std::ptr::null_mut() } else { self.ptr })
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
