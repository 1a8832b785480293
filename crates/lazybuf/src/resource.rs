//! Memory resources: where a buffer's memory comes from and where it goes back.
//!
//! A [`MemoryResource`] is the policy layer over storage. [`DirectResource`] asks the
//! device's backend for every block and frees it on return; policies (a pool, a limit,
//! statistics) wrap an upstream resource they own and add one concern each. A buffer holds
//! an `Arc<dyn MemoryResource>` and hands every block back to it when the block is no longer
//! needed.
//!
//! Blocks may be larger than asked for (a pool rounds up to size classes); buffers use the
//! first `nbytes` of them. Zero-copy aliases of host blocks are not resource allocations
//! (they own no memory) and never pass through here.
//!
//! What does not live here: runtime calls ([`crate::backend`]) and pools themselves.

use std::fmt;
use std::sync::{Arc, OnceLock};

use crate::backend::DeviceMemory;
use crate::device::Device;
use crate::error::Result;
use crate::host_memory::HostMemory;

/// A source of host blocks and device memory for buffers.
pub trait MemoryResource: Send + Sync + fmt::Debug {
    /// A host block of at least `bytes` for a buffer whose own device is `device`,
    /// page-locked when `pinned` (an error if it cannot be, never a silent fallback).
    fn allocate_host(&self, device: &Device, bytes: usize, pinned: bool) -> Result<HostMemory>;

    /// Device memory of at least `bytes` on `device`, with unspecified contents.
    fn allocate_device(&self, device: &Device, bytes: usize) -> Result<DeviceMemory>;

    /// Takes back a host block this resource handed out for `device`.
    fn deallocate_host(&self, device: &Device, block: HostMemory);

    /// Takes back device memory this resource handed out on `device`.
    fn deallocate_device(&self, device: &Device, memory: DeviceMemory);
}

/// Allocates from the device's backend every time and frees on return.
#[derive(Debug, Default)]
pub struct DirectResource;

impl DirectResource {
    /// The shared direct resource.
    pub fn shared() -> Arc<dyn MemoryResource> {
        static DIRECT: OnceLock<Arc<dyn MemoryResource>> = OnceLock::new();
        DIRECT.get_or_init(|| Arc::new(DirectResource)).clone()
    }
}

impl MemoryResource for DirectResource {
    fn allocate_host(&self, device: &Device, bytes: usize, pinned: bool) -> Result<HostMemory> {
        device.backend().allocate_host(bytes, pinned)
    }

    fn allocate_device(&self, device: &Device, bytes: usize) -> Result<DeviceMemory> {
        device.backend().allocate(bytes)
    }

    fn deallocate_host(&self, _device: &Device, block: HostMemory) {
        drop(block);
    }

    fn deallocate_device(&self, _device: &Device, memory: DeviceMemory) {
        drop(memory);
    }
}
