//! Memory as backends see it: device allocations ([`DeviceMemory`] over a backend's
//! [`MemoryHandle`]), blocks of any kind ([`Block`]) and the host side of a transfer
//! ([`HostSpan`]).
//!
//! What does not live here: host blocks themselves ([`crate::host_memory`]).

use std::any::{Any, TypeId};
use std::fmt;
use std::ptr::NonNull;

use super::raw::RawMemory;
use crate::error::{Error, Result};
use crate::host_memory::{HostMemory, Pinning};

/// A runtime's own handle to a device allocation (downcast by the backend that made it).
///
/// # Safety
/// lazybuf reads and writes through [`MemoryHandle::host_address`] from safe code (the host
/// slices of memory objects and device views): where it answers, the address must be valid for
/// reads and writes of the allocation's whole length (the bytes the runtime allocated, borrowed
/// or aliased it with, the `len` it is wrapped with in [`DeviceMemory`]), aligned as the runtime's
/// [`super::Runtime::alignment`] promises, for as long as the handle lives.
pub unsafe trait MemoryHandle: Any + Send + Sync + fmt::Debug {
    /// The runtime handle, for kernels launched by the user.
    fn raw(&self) -> RawMemory;

    /// The address of the first byte when the host can read and write this memory directly
    /// (the host device's memory); `None` for memory only the device reaches.
    fn host_address(&self) -> Option<NonNull<u8>> {
        None
    }
}

/// Checks that an operation on `len` bytes fits an allocation of `capacity` bytes.
pub(crate) fn check_fits(operation: &'static str, capacity: usize, len: usize) -> Result<()> {
    if len > capacity {
        return Err(Error::LengthMismatch { operation, expected: capacity, actual: len, unit: "bytes" });
    }
    Ok(())
}

/// What kind of memory an allocation is (SPEC section 3; dpctl's USM kinds, RMM's resources).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemoryKind {
    /// Memory of the device, which the host does not address.
    Device,
    /// Host memory: page-locked when `pinned` (the runtime's pinned memory), else pageable.
    Host {
        /// Page-locked.
        pinned: bool,
    },
    /// Memory the host and the device both address: CUDA managed memory, OpenCL fine-grained
    /// shared virtual memory, host memory on the host device.
    Shared,
}

impl MemoryKind {
    /// The dpctl-style name: `"device"`, `"host"` or `"shared"`.
    pub fn name(self) -> &'static str {
        match self {
            MemoryKind::Device => "device",
            MemoryKind::Host { .. } => "host",
            MemoryKind::Shared => "shared",
        }
    }

    /// Whether the host can read and write memory of this kind directly.
    pub fn host_accessible(self) -> bool {
        !matches!(self, MemoryKind::Device)
    }
}

/// Device memory of a known size, owned: dropping it frees it.
#[derive(Debug)]
pub struct DeviceMemory {
    len: usize,
    host_alias: bool,
    shared: bool,
    handle: Box<dyn MemoryHandle>,
    /// The handle's type, read once here so that every downcast is a compare rather than a
    /// call through the vtable (the checked layer downcasts on every operation).
    handle_type: TypeId,
}

impl DeviceMemory {
    /// Wraps a backend's handle to `len` bytes; `host_alias` when it is a zero-copy alias of
    /// a host block.
    ///
    /// # Safety
    /// Where `handle` answers [`MemoryHandle::host_address`], that address is valid for reads
    /// and writes of `len` bytes while the handle lives: safe code (a device view's host slice)
    /// reads and writes `len` bytes there.
    ///
    /// ```compile_fail,E0133
    /// // Safe code cannot claim a length its handle does not have.
    /// # fn f(handle: Box<dyn lazybuf::backend::MemoryHandle>) {
    /// let _ = lazybuf::backend::DeviceMemory::new(1 << 40, false, handle);
    /// # }
    /// ```
    pub unsafe fn new(len: usize, host_alias: bool, handle: Box<dyn MemoryHandle>) -> Self {
        let handle_type = (*handle).type_id();
        DeviceMemory { len, host_alias, shared: false, handle, handle_type }
    }

    /// Wraps a backend's handle to `len` bytes of shared memory ([`MemoryKind::Shared`]),
    /// which the host addresses too ([`MemoryHandle::host_address`] must answer).
    ///
    /// # Safety
    /// As for [`DeviceMemory::new`]: `handle`'s host address is valid for `len` bytes.
    pub unsafe fn shared(len: usize, handle: Box<dyn MemoryHandle>) -> Self {
        let handle_type = (*handle).type_id();
        DeviceMemory { len, host_alias: false, shared: true, handle, handle_type }
    }

    /// [`MemoryKind::Shared`] or [`MemoryKind::Device`].
    pub fn kind(&self) -> MemoryKind {
        if self.shared { MemoryKind::Shared } else { MemoryKind::Device }
    }

    /// The size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the allocation is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether this memory is the host block itself (zero-copy).
    pub fn is_host_alias(&self) -> bool {
        self.host_alias
    }

    /// The backend's handle, if it is of type `H`.
    #[inline]
    pub fn handle<H: MemoryHandle>(&self) -> Option<&H> {
        if self.handle_type != TypeId::of::<H>() {
            return None;
        }
        // SAFETY: the box holds an `H` (its type id, read when it was boxed, is `H`'s), so the
        // data pointer of the trait object points at an `H`, borrowed as long as `self`.
        Some(unsafe { &*(&*self.handle as *const dyn MemoryHandle).cast::<H>() })
    }

    /// The address of the first byte if the host can use this memory directly.
    pub fn host_address(&self) -> Option<NonNull<u8>> {
        self.handle.host_address()
    }

    /// The runtime handle of the allocation.
    ///
    /// # Safety
    /// The handle is valid only while this memory lives, and using it to write or read bypasses
    /// lazybuf's coherence tracking: use the buffer's device views, which mark the access.
    pub unsafe fn raw(&self) -> RawMemory {
        self.handle.raw()
    }
}

/// The host side of a transfer: an address, a length, and how the memory is pinned (so a
/// backend can pick its path without asking the driver about the pointer).
#[derive(Clone, Copy, Debug)]
pub struct HostSpan {
    ptr: NonNull<u8>,
    len: usize,
    pinning: Pinning,
}

// SAFETY: a HostSpan is an address and a length; whoever makes one promises (see `from_raw`)
// how long the bytes stay valid, and backends may hand that promise to a worker thread.
unsafe impl Send for HostSpan {}
// SAFETY: see Send; a shared HostSpan only gives out the address.
unsafe impl Sync for HostSpan {}

impl HostSpan {
    /// The first `len` bytes of `block` (all of it if `len` is larger). Writing through it
    /// (a download into the block) is allowed: the block's memory is owned, not borrowed.
    pub fn of(block: &HostMemory, len: usize) -> HostSpan {
        HostSpan {
            ptr: NonNull::new(block.as_ptr().cast_mut()).unwrap_or(NonNull::dangling()),
            len: len.min(block.len()),
            pinning: block.pinning(),
        }
    }

    /// The bytes of a slice to read from, as pageable memory (for uploads).
    pub fn of_slice(bytes: &[u8]) -> HostSpan {
        HostSpan {
            ptr: NonNull::new(bytes.as_ptr().cast_mut()).unwrap_or(NonNull::dangling()),
            len: bytes.len(),
            pinning: Pinning::Pageable,
        }
    }

    /// The bytes of a slice to write to, as pageable memory (for downloads).
    pub fn of_mut_slice(bytes: &mut [u8]) -> HostSpan {
        HostSpan {
            ptr: NonNull::new(bytes.as_mut_ptr()).unwrap_or(NonNull::dangling()),
            len: bytes.len(),
            pinning: Pinning::Pageable,
        }
    }

    /// A span of `len` bytes at `ptr`.
    ///
    /// # Safety
    /// `ptr` must be valid for `len` bytes for as long as the span is used, as the function
    /// the span is handed to requires.
    pub unsafe fn from_raw(ptr: *mut u8, len: usize, pinning: Pinning) -> HostSpan {
        HostSpan { ptr: NonNull::new(ptr).unwrap_or(NonNull::dangling()), len, pinning }
    }

    /// The address of the first byte.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the span is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// How the memory is pinned.
    pub fn pinning(&self) -> Pinning {
        self.pinning
    }

    /// The bytes.
    ///
    /// # Safety
    /// The span's memory must be valid for reads of `len` bytes for `'a`, with no writes.
    pub unsafe fn bytes<'a>(&self) -> &'a [u8] {
        // SAFETY: the caller's promise.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, for writing.
    ///
    /// # Safety
    /// The span's memory must be valid for writes of `len` bytes for `'a`, with no other
    /// access during `'a`.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn bytes_mut<'a>(&self) -> &'a mut [u8] {
        // SAFETY: the caller's promise.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

/// A block of memory of any kind, as [`super::Backend::allocate`] and the memory resources
/// hand it out: host memory, or memory a device addresses (device or shared memory).
#[derive(Debug)]
pub enum Block {
    /// Host memory ([`MemoryKind::Host`]).
    Host(HostMemory),
    /// Device or shared memory ([`MemoryKind::Device`], [`MemoryKind::Shared`]).
    Device(DeviceMemory),
}

impl Block {
    /// The size in bytes (at least what was asked for).
    pub fn len(&self) -> usize {
        match self {
            Block::Host(block) => block.len(),
            Block::Device(memory) => memory.len(),
        }
    }

    /// Whether the block is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The kind of memory the block is.
    pub fn kind(&self) -> MemoryKind {
        match self {
            // A registered block is pageable memory the driver page-locked for speed.
            Block::Host(block) => MemoryKind::Host {
                pinned: block.is_pinned() && !matches!(block.pinning(), Pinning::Registered(_)),
            },
            Block::Device(memory) => memory.kind(),
        }
    }
}
