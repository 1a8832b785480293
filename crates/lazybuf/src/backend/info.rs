//! What a device reports about itself: its [`DeviceInfo`], its memory figures, the DLPack
//! devices of its memory kinds.
//!
//! What does not live here: the public [`crate::Device`] handle and discovery.

use crate::backend::memory::MemoryKind;
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
    /// The runtime's index of the device: the CUDA ordinal (what `cudaSetDevice`, CuPy and
    /// DLPack's `device_id` call it); `None` elsewhere.
    pub ordinal: Option<u32>,
    /// Whether the device allocates shared memory ([`MemoryKind::Shared`], memory the host
    /// and the device both address): CUDA managed memory, OpenCL fine-grained buffer SVM, host
    /// memory on the host device; not on wgpu, nor where the runtime lacks it (an allocation
    /// is then refused with an error saying why).
    pub shared_memory: bool,
    /// Where DLPack says this device's memory kinds live.
    pub dlpack: DlpackDevices,
}

impl DeviceInfo {
    /// The DLPack device of memory of `kind` on this device: the CPU for host memory (and for
    /// what the host addresses as its own), CUDA or CUDA-managed memory on a CUDA device;
    /// `None` where DLPack has no device for it (OpenCL and wgpu device memory).
    pub fn dlpack_device(&self, kind: MemoryKind) -> Option<DlpackDevice> {
        match kind {
            MemoryKind::Host { .. } => Some(DlpackDevice::CPU),
            MemoryKind::Device => self.dlpack.device,
            MemoryKind::Shared => self.dlpack.shared,
        }
    }
}

/// A device in DLPack's terms (its `DLDevice`): a `DLDeviceType` and the index among devices
/// of that type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DlpackDevice {
    /// DLPack's `DLDeviceType`: [`DlpackDevice::CPU_TYPE`], [`DlpackDevice::CUDA_TYPE`] or
    /// [`DlpackDevice::CUDA_MANAGED_TYPE`] for lazybuf's memory.
    pub device_type: u32,
    /// The index among devices of the type (the CUDA ordinal; 0 for the CPU).
    pub device_id: i32,
}

impl DlpackDevice {
    /// `kDLCPU`.
    pub const CPU_TYPE: u32 = 1;
    /// `kDLCUDA`.
    pub const CUDA_TYPE: u32 = 2;
    /// `kDLCUDAManaged`.
    pub const CUDA_MANAGED_TYPE: u32 = 13;
    /// The host: `(kDLCPU, 0)`.
    pub const CPU: DlpackDevice = DlpackDevice { device_type: Self::CPU_TYPE, device_id: 0 };

    /// CUDA device memory of the device with this ordinal.
    pub fn cuda(ordinal: u32) -> Self {
        DlpackDevice { device_type: Self::CUDA_TYPE, device_id: i32::try_from(ordinal).unwrap_or(i32::MAX) }
    }

    /// CUDA managed memory of the device with this ordinal.
    pub fn cuda_managed(ordinal: u32) -> Self {
        DlpackDevice { device_type: Self::CUDA_MANAGED_TYPE, ..Self::cuda(ordinal) }
    }

    /// Whether memory there is addressed by a CUDA device pointer (CUDA and CUDA-managed
    /// memory): what the CUDA array interface describes.
    pub fn is_cuda(&self) -> bool {
        matches!(self.device_type, Self::CUDA_TYPE | Self::CUDA_MANAGED_TYPE)
    }
}

/// The DLPack devices of a device's memory kinds (host memory is always the CPU's); see
/// [`DeviceInfo::dlpack_device`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DlpackDevices {
    /// Of [`MemoryKind::Device`] memory.
    pub device: Option<DlpackDevice>,
    /// Of [`MemoryKind::Shared`] memory.
    pub shared: Option<DlpackDevice>,
}

impl DlpackDevices {
    /// A device whose memory DLPack knows only through the host: device memory has no DLPack
    /// device, shared memory (which the host addresses) is the CPU's.
    pub const HOST_SHARED: DlpackDevices = DlpackDevices { device: None, shared: Some(DlpackDevice::CPU) };
    /// The host device: all its memory is the CPU's.
    pub const CPU: DlpackDevices =
        DlpackDevices { device: Some(DlpackDevice::CPU), shared: Some(DlpackDevice::CPU) };
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dlpack_devices_of_each_kind() {
        let host = crate::Device::host();
        let info = host.info();
        assert_eq!(info.ordinal, None);
        for kind in [MemoryKind::Device, MemoryKind::Host { pinned: false }, MemoryKind::Shared] {
            assert_eq!(info.dlpack_device(kind), Some(DlpackDevice::CPU));
        }
        let gpu = DeviceInfo { dlpack: DlpackDevices::HOST_SHARED, ..info.clone() };
        assert_eq!(gpu.dlpack_device(MemoryKind::Device), None);
        assert_eq!(gpu.dlpack_device(MemoryKind::Shared), Some(DlpackDevice::CPU));
        assert_eq!(gpu.dlpack_device(MemoryKind::Host { pinned: true }), Some(DlpackDevice::CPU));
        assert_eq!(DlpackDevice::cuda(3), DlpackDevice { device_type: 2, device_id: 3 });
        assert_eq!(DlpackDevice::cuda_managed(1), DlpackDevice { device_type: 13, device_id: 1 });
        assert!(DlpackDevice::cuda(0).is_cuda() && DlpackDevice::cuda_managed(0).is_cuda());
        assert!(!DlpackDevice::CPU.is_cuda());
    }
}
