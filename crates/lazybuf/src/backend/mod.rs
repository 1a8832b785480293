//! The device backend interface: the storage layer every runtime implements.
//!
//! A backend allocates and frees memory, moves whole buffers between host and device, fills
//! and copies on the device, and reports what it is. It knows nothing of coherence: the
//! buffer decides *what* to move (see [`crate::coherence`]), a backend only knows *how*.
//!
//! Every backend folder has the same files: `mod.rs` (discovery and opening), `device.rs`
//! (the [`Backend`] impl) and `memory.rs` (its memory handle type). Runtime-specific raw
//! calls sit in those folders and nowhere else.
//!
//! What does not live here: pools, limits and statistics (policies over a backend), and the
//! public [`crate::Device`] handle.

use std::any::Any;
use std::ffi::c_void;
use std::fmt;

use crate::device::{Device, DeviceInfo, MemoryInfo};
use crate::error::Result;
use crate::host_memory::HostMemory;

#[cfg(feature = "cuda")]
pub mod cuda;
pub mod host;
#[cfg(feature = "opencl")]
pub mod opencl;

/// One device's runtime operations. Copies act on the first bytes of an allocation (a block
/// may be larger than the buffer using it) and are complete before the call returns (the
/// runtime's queue is in order, so work the user enqueued earlier on the same queue completes
/// first). Lengths beyond an allocation are an [`crate::Error::LengthMismatch`].
pub trait Backend: Send + Sync + fmt::Debug {
    /// What the device is.
    fn info(&self) -> &DeviceInfo;

    /// Free and total memory, with where the figure comes from.
    fn memory_info(&self) -> Result<MemoryInfo>;

    /// Host memory for a buffer that lives on this device: page-locked when `pinned` (an
    /// error if that is impossible, never a silent pageable fallback).
    fn allocate_host(&self, bytes: usize, pinned: bool) -> Result<HostMemory> {
        if pinned { HostMemory::allocate_locked(bytes) } else { HostMemory::allocate(bytes) }
    }

    /// Allocates `bytes` of device memory with unspecified contents.
    fn allocate(&self, bytes: usize) -> Result<DeviceMemory>;

    /// Whether a buffer of `bytes` on this device aliases its host block, so that its syncs
    /// move no bytes. [`Backend::alias_host`] must alias exactly when this is true.
    fn zero_copy(&self, bytes: usize) -> bool {
        let _ = bytes;
        false
    }

    /// Device memory that aliases `host` (zero-copy) when [`Backend::zero_copy`] says so for
    /// its size; `None` to use [`Backend::allocate`].
    /// Uploads and downloads between an alias and its own host block move no bytes; with any
    /// other host memory they copy as usual.
    fn alias_host(&self, host: &mut HostMemory) -> Option<Result<DeviceMemory>> {
        let _ = host;
        None
    }

    /// Copies all of `src` into the first `src.len()` bytes of `dst`.
    fn upload(&self, src: &[u8], dst: &mut DeviceMemory) -> Result<()>;

    /// Fills all of `dst` from the first `dst.len()` bytes of `src`.
    fn download(&self, src: &DeviceMemory, dst: &mut [u8]) -> Result<()>;

    /// Fills the first `bytes` of `dst` with repetitions of `pattern` (1, 2, 4 or 8 bytes;
    /// `bytes` is a multiple of it).
    fn fill(&self, dst: &mut DeviceMemory, pattern: &[u8], bytes: usize) -> Result<()>;

    /// Copies the first `bytes` of `src` into `dst`, both on this device.
    fn copy(&self, src: &DeviceMemory, dst: &mut DeviceMemory, bytes: usize) -> Result<()>;

    /// Whether [`Backend::copy_from_peer`] can copy memory of `src` (another device) into
    /// this device's memory without staging through the host.
    fn can_copy_from_peer(&self, src: &Device) -> bool {
        let _ = src;
        false
    }

    /// Copies the first `bytes` of `src`, memory of `src_device`, into `dst`, memory of this
    /// device, without the host; `None` when this pair cannot copy directly (the buffer then
    /// stages through the host). Work queued on `src_device` completes first.
    fn copy_from_peer(
        &self,
        src_device: &Device,
        src: &DeviceMemory,
        dst: &mut DeviceMemory,
        bytes: usize,
    ) -> Option<Result<()>> {
        let _ = (src_device, src, dst, bytes);
        None
    }

    /// Waits until all work queued on the device's queue is done.
    fn synchronize(&self) -> Result<()>;

    /// The runtime handles of the device, for users who launch their own kernels.
    fn raw(&self) -> RawDevice;
}

/// A runtime's own handle to a device allocation (downcast by the backend that made it).
pub trait MemoryHandle: Any + Send + Sync + fmt::Debug {
    /// The runtime handle, for kernels launched by the user.
    fn raw(&self) -> RawMemory;
    /// Upcast for downcasting to the backend's concrete type.
    fn as_any(&self) -> &dyn Any;
}

/// Checks that an operation on `len` bytes fits an allocation of `capacity` bytes.
pub(crate) fn check_fits(operation: &'static str, capacity: usize, len: usize) -> Result<()> {
    if len > capacity {
        return Err(crate::Error::LengthMismatch { operation, expected: capacity, actual: len });
    }
    Ok(())
}

/// Device memory of a known size, owned: dropping it frees it.
#[derive(Debug)]
pub struct DeviceMemory {
    len: usize,
    host_alias: bool,
    handle: Box<dyn MemoryHandle>,
}

impl DeviceMemory {
    /// Wraps a backend's handle to `len` bytes; `host_alias` when it is a zero-copy alias of
    /// a host block.
    pub fn new(len: usize, host_alias: bool, handle: Box<dyn MemoryHandle>) -> Self {
        DeviceMemory { len, host_alias, handle }
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
    pub fn handle<H: MemoryHandle>(&self) -> Option<&H> {
        self.handle.as_any().downcast_ref::<H>()
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

/// A runtime's raw handle to a device allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RawMemory {
    /// Host memory (the host device): the address of the first byte; null when empty.
    Host(*mut u8),
    /// An OpenCL `cl_mem`; null when the buffer is empty (OpenCL has no empty buffers).
    OpenCl(*mut c_void),
    /// A CUDA `CUdeviceptr`; 0 when empty.
    Cuda(u64),
}

/// A runtime's raw handles to a device, for launching kernels on the queue lazybuf uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RawDevice {
    /// The host device has no runtime.
    Host,
    /// OpenCL: the context, the in-order command queue lazybuf enqueues on, and the device.
    OpenCl {
        /// `cl_context`
        context: *mut c_void,
        /// `cl_command_queue`
        queue: *mut c_void,
        /// `cl_device_id`
        device: *mut c_void,
    },
    /// CUDA: the context and the stream lazybuf copies on.
    Cuda {
        /// `CUcontext`
        context: *mut c_void,
        /// `CUstream`
        stream: *mut c_void,
    },
}
