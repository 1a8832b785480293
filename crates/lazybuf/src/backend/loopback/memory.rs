//! The loopback device's memory (a host block of its own, which the host side of a transfer
//! never aliases; shared memory, which the host addresses too) and its stream.

use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::backend::{MemoryHandle, RawMemory, RawStream, StreamHandle};
use crate::host_memory::HostMemory;

/// Loopback device memory: `len` bytes of a block it owns, counted against its device's
/// capacity and listed among its live allocations while it lives; or `len` bytes of such an
/// allocation, borrowed.
#[derive(Debug)]
pub struct LoopbackMemory {
    ptr: NonNull<u8>,
    len: usize,
    /// The device that allocated it ([`super::LoopbackBackend`]'s identity).
    pub(super) device: u64,
    /// Shared memory: the host addresses it too.
    shared: bool,
    /// What an owned allocation gives back when it goes; `None` when borrowed.
    owned: Option<Owned>,
}

/// What an owned allocation holds: its block, and the device's books it is entered in.
#[derive(Debug)]
struct Owned {
    _block: HostMemory,
    held: Arc<AtomicU64>,
    live: Arc<Mutex<BTreeMap<u64, usize>>>,
}

// SAFETY: the pointer is into the owned block, which moves with it, or into a live allocation
// whose owner promised (`borrowed`) it outlives this value; every write through it comes from
// an operation whose caller promised exclusive access (see `Runtime`'s `# Safety` sections).
unsafe impl Send for LoopbackMemory {}
// SAFETY: see Send; shared references only read, or write under the callers' exclusivity.
unsafe impl Sync for LoopbackMemory {}

impl LoopbackMemory {
    /// Wraps `block` (whose `len` bytes the device's count `held` already includes) and enters
    /// it among the device's `live` allocations.
    pub(super) fn new(
        mut block: HostMemory,
        len: usize,
        device: u64,
        shared: bool,
        held: Arc<AtomicU64>,
        live: Arc<Mutex<BTreeMap<u64, usize>>>,
    ) -> Self {
        let ptr = NonNull::new(block.as_mut_ptr()).unwrap_or(NonNull::dangling());
        if len > 0 {
            live.lock().unwrap_or_else(PoisonError::into_inner).insert(ptr.as_ptr() as u64, len);
        }
        LoopbackMemory { ptr, len, device, shared, owned: Some(Owned { _block: block, held, live }) }
    }

    /// `len` bytes at `ptr`, inside a live allocation of `device`.
    ///
    /// # Safety
    /// The allocation stays alive, and is not freed, while the value lives.
    pub(super) unsafe fn borrowed(ptr: NonNull<u8>, len: usize, device: u64) -> Self {
        LoopbackMemory { ptr, len, device, shared: false, owned: None }
    }

    /// The address of the first byte (for the device's own copies: the host never gets it).
    pub(super) fn ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The bytes, for writing.
    ///
    /// # Safety
    /// No other reference to the same bytes may be live.
    #[allow(clippy::mut_from_ref)]
    pub(super) unsafe fn bytes_mut(&self) -> &mut [u8] {
        // SAFETY: ptr is valid for len initialized bytes of the owned block; exclusivity is
        // the caller's promise.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for LoopbackMemory {
    fn drop(&mut self) {
        if let Some(owned) = &self.owned {
            owned.held.fetch_sub(self.len as u64, Ordering::Relaxed);
            owned.live.lock().unwrap_or_else(PoisonError::into_inner).remove(&(self.ptr.as_ptr() as u64));
        }
    }
}

// SAFETY: the host address is the start of the allocation of `len` bytes this handle owns
// (allocated, or borrowed under `borrow`'s contract), valid while it lives.
unsafe impl MemoryHandle for LoopbackMemory {
    /// The address as an integer, as a device pointer is.
    fn raw(&self) -> RawMemory {
        RawMemory::Loopback(if self.len == 0 { 0 } else { self.ptr.as_ptr() as u64 })
    }

    /// Shared memory only: the host does not address device memory.
    fn host_address(&self) -> Option<NonNull<u8>> {
        self.shared.then_some(self.ptr)
    }
}

/// A loopback device's stream: immediate (work is done when the call returns).
#[derive(Debug)]
pub struct LoopbackStream {
    /// The device it belongs to.
    pub(super) device: u64,
}

impl StreamHandle for LoopbackStream {
    fn raw(&self) -> RawStream {
        RawStream::Loopback(self.device)
    }
}
