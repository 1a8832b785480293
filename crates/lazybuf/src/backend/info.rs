//! What a device reports about itself, and the raw runtime handles it hands to users.
//!
//! What does not live here: the public [`crate::Device`] handle and discovery.

use std::ffi::c_void;

use crate::error::BackendKind;

/// What a device is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The runtime's name for the device.
    pub name: String,
    /// The runtime that drives it.
    pub backend: BackendKind,
    /// The vendor, as the runtime reports it.
    pub vendor: String,
    /// Whether the device reads and writes host memory directly (a CPU device, an integrated
    /// GPU): syncs with the host can then avoid copying.
    pub shares_host_memory: bool,
    /// Whether the device is a GPU (the default device prefers GPUs).
    pub is_gpu: bool,
    /// Total memory in bytes.
    pub total_memory: u64,
    /// The compute capability (major, minor) of a CUDA device; `None` elsewhere.
    pub compute_capability: Option<(u32, u32)>,
}

/// Where a [`MemoryInfo`]'s free figure comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemorySource {
    /// Asked of the runtime (CUDA's `cuMemGetInfo`): includes other processes.
    Runtime,
    /// The operating system's available memory (`MemAvailable` in /proc/meminfo).
    System,
    /// The runtime has no free-memory query: total minus what this process holds on the device.
    TotalMinusProcessHeld,
}

/// Free and total memory of a device, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryInfo {
    /// Free bytes, as [`MemoryInfo::source`] says. Memory lazybuf keeps cached for reuse is
    /// not free by this figure (the runtime sees it allocated); see [`MemoryInfo::cached`].
    pub free: u64,
    /// Total bytes.
    pub total: u64,
    /// How `free` was obtained.
    pub source: MemorySource,
    /// Bytes of this device's memory that lazybuf's caches hold for reuse: allocated as far
    /// as the runtime knows, but given back by a trim (and reused by new buffers first).
    pub cached: u64,
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
    /// wgpu: the device and its queue (every lazybuf stream of the device is this queue).
    #[cfg(feature = "wgpu")]
    Wgpu {
        /// The `wgpu::Device`.
        device: *const wgpu::Device,
        /// The `wgpu::Queue`.
        queue: *const wgpu::Queue,
    },
}

/// A runtime's raw handle to one stream (in-order queue) of a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RawStream {
    /// The host device's immediate stream: work is done when the call returns.
    Host,
    /// An OpenCL `cl_command_queue` (in order).
    OpenCl(*mut c_void),
    /// A CUDA `CUstream`.
    Cuda(*mut c_void),
    /// A `wgpu::Queue` (a wgpu device's one queue).
    #[cfg(feature = "wgpu")]
    Wgpu(*const wgpu::Queue),
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
    /// A `wgpu::Buffer` (a storage buffer, at least as long as the allocation rounded up to 4
    /// bytes); null when the allocation is empty.
    #[cfg(feature = "wgpu")]
    Wgpu(*const wgpu::Buffer),
}

impl RawMemory {
    /// The handle as a number that tells live allocations of one device apart (the address,
    /// `cl_mem`, `CUdeviceptr`, or the address of the `wgpu::Buffer`), for bookkeeping keyed
    /// by allocation; 0 when empty. Never a way to reach the memory.
    pub fn identity(&self) -> usize {
        match *self {
            RawMemory::Host(p) => p as usize,
            RawMemory::OpenCl(mem) => mem as usize,
            RawMemory::Cuda(ptr) => ptr as usize,
            #[cfg(feature = "wgpu")]
            RawMemory::Wgpu(buffer) => buffer as usize,
        }
    }
}
