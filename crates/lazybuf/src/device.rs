//! The public device handle and what a device reports about itself.
//!
//! A [`Device`] is a cheap, clonable handle to one opened device: an identity
//! ([`DeviceId`], never reused) plus the backend that drives it. Discovery and the default
//! device live in [`crate::discovery`]; runtime calls live in [`crate::backend`].

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use crate::backend::{Backend, RawDevice};
use crate::coherence::DeviceId;
use crate::error::{BackendKind, Result};

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
    /// Free bytes.
    pub free: u64,
    /// Total bytes.
    pub total: u64,
    /// How `free` was obtained.
    pub source: MemorySource,
}

/// A handle to one opened device.
#[derive(Clone)]
pub struct Device {
    id: DeviceId,
    backend: Arc<dyn Backend>,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl Device {
    /// Gives an opened backend an identity. Each call makes a new, distinct device.
    pub fn from_backend(backend: Arc<dyn Backend>) -> Device {
        Device { id: DeviceId(NEXT_ID.fetch_add(1, Ordering::Relaxed)), backend }
    }

    /// The host device: memory is host memory, views alias it and syncs copy nothing. Always
    /// the same device.
    pub fn host() -> Device {
        static HOST: OnceLock<Device> = OnceLock::new();
        HOST.get_or_init(|| Device::from_backend(Arc::new(crate::backend::host::HostBackend::new()))).clone()
    }

    /// This device's identity.
    pub fn id(&self) -> DeviceId {
        self.id
    }

    /// What the device is.
    pub fn info(&self) -> &DeviceInfo {
        self.backend.info()
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.info().name
    }

    /// The runtime that drives it.
    pub fn backend_kind(&self) -> BackendKind {
        self.info().backend
    }

    /// Free and total memory now.
    pub fn memory_info(&self) -> Result<MemoryInfo> {
        self.backend.memory_info()
    }

    /// Whether syncs of a buffer of `bytes` between the host and this device move no bytes
    /// (the device's copy aliases host memory: the host device always; a host-sharing OpenCL
    /// device from 4 MiB up).
    pub fn is_zero_copy(&self, bytes: usize) -> bool {
        self.backend.zero_copy(bytes)
    }

    /// Whether a buffer's copy on `source` can fill this device's copy directly (CUDA peer
    /// access), without staging through the host.
    pub fn can_copy_from(&self, source: &Device) -> bool {
        self != source && self.backend.can_copy_from_peer(source)
    }

    /// Waits for all work queued on the device.
    pub fn synchronize(&self) -> Result<()> {
        self.backend.synchronize()
    }

    /// The runtime's handles (context, queue), for launching kernels on lazybuf's queue.
    ///
    /// # Safety
    /// The handles are borrowed: they are valid while any clone of this `Device` lives, and
    /// must not be released by the caller.
    pub unsafe fn raw(&self) -> RawDevice {
        self.backend.raw()
    }

    pub(crate) fn backend(&self) -> &dyn Backend {
        &*self.backend
    }
}

impl PartialEq for Device {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Eq for Device {}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Device({:?} {}: {})", self.id, self.info().backend, self.info().name)
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.info().name, self.info().backend)
    }
}
