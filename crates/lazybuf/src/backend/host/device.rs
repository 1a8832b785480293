//! The host device's [`Backend`] implementation.

use crate::backend::{Backend, DeviceMemory, RawDevice, check_fits};
use crate::device::{DeviceInfo, MemoryInfo, MemorySource};
use crate::error::{BackendKind, Error, Result};
use crate::host_memory::{HostMemory, fill_pattern};

use super::memory::HostDeviceMemory;

/// The host as a device.
#[derive(Debug)]
pub struct HostBackend {
    info: DeviceInfo,
}

impl HostBackend {
    /// The host device's backend.
    pub fn new() -> Self {
        let total = system_memory().map(|m| m.total).unwrap_or(0);
        HostBackend {
            info: DeviceInfo {
                name: cpu_name().unwrap_or_else(|| "host".into()),
                backend: BackendKind::Host,
                vendor: cpu_vendor().unwrap_or_else(|| "unknown".into()),
                shares_host_memory: true,
                is_gpu: false,
                total_memory: total,
            },
        }
    }
}

impl Default for HostBackend {
    fn default() -> Self {
        Self::new()
    }
}

fn handle(mem: &DeviceMemory) -> Result<&HostDeviceMemory> {
    mem.handle::<HostDeviceMemory>().ok_or_else(|| {
        Error::invalid("host device", format!("expected memory of the host device, got {mem:?}"))
    })
}

impl Backend for HostBackend {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn memory_info(&self) -> Result<MemoryInfo> {
        system_memory()
    }

    fn allocate(&self, bytes: usize) -> Result<DeviceMemory> {
        let block = HostMemory::allocate(bytes)?;
        Ok(DeviceMemory::new(bytes, false, Box::new(HostDeviceMemory::owned(block))))
    }

    fn zero_copy(&self, _bytes: usize) -> bool {
        true
    }

    fn alias_host(&self, host: &mut HostMemory) -> Option<Result<DeviceMemory>> {
        Some(Ok(DeviceMemory::new(host.len(), true, Box::new(HostDeviceMemory::alias(host)))))
    }

    fn upload(&self, src: &[u8], dst: &mut DeviceMemory) -> Result<()> {
        check_fits("upload", dst.len(), src.len())?;
        let dst = handle(dst)?;
        if dst.ptr().cast_const() != src.as_ptr() {
            // SAFETY: dst is not the block src borrows (pointers differ, and blocks never
            // overlap partially), and &mut DeviceMemory makes this the only access to it.
            (unsafe { dst.bytes_mut() })[..src.len()].copy_from_slice(src);
        }
        Ok(())
    }

    fn download(&self, src: &DeviceMemory, dst: &mut [u8]) -> Result<()> {
        check_fits("download", src.len(), dst.len())?;
        let src = handle(src)?;
        if src.ptr().cast_const() != dst.as_ptr() {
            // SAFETY: src is a different block from dst, which is exclusively borrowed.
            let n = dst.len();
            dst.copy_from_slice(&unsafe { src.bytes() }[..n]);
        }
        Ok(())
    }

    fn fill(&self, dst: &mut DeviceMemory, pattern: &[u8], bytes: usize) -> Result<()> {
        check_fits("fill", dst.len(), bytes)?;
        let dst = handle(dst)?;
        // SAFETY: &mut DeviceMemory is the only access to these bytes; an alias's host block
        // is not borrowed while its buffer fills (the buffer holds &mut self).
        fill_pattern(&mut unsafe { dst.bytes_mut() }[..bytes], pattern);
        Ok(())
    }

    fn copy(&self, src: &DeviceMemory, dst: &mut DeviceMemory, bytes: usize) -> Result<()> {
        check_fits("copy", src.len().min(dst.len()), bytes)?;
        let (src, dst) = (handle(src)?, handle(dst)?);
        if src.ptr() != dst.ptr() {
            // SAFETY: two distinct blocks; dst is exclusively borrowed.
            unsafe { dst.bytes_mut()[..bytes].copy_from_slice(&src.bytes()[..bytes]) };
        }
        Ok(())
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    fn raw(&self) -> RawDevice {
        RawDevice::Host
    }
}

/// Available and total system memory from `/proc/meminfo`, else `sysconf`.
pub(crate) fn system_memory() -> Result<MemoryInfo> {
    if let Ok(text) = std::fs::read_to_string("/proc/meminfo") {
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.trim().strip_suffix("kB")?.trim().parse::<u64>().ok())
                .map(|kib| kib * 1024)
        };
        if let (Some(free), Some(total)) = (field("MemAvailable:"), field("MemTotal:")) {
            return Ok(MemoryInfo { free, total, source: MemorySource::System });
        }
    }
    // SAFETY: sysconf has no preconditions.
    let (page, phys) = unsafe { (libc::sysconf(libc::_SC_PAGESIZE), libc::sysconf(libc::_SC_PHYS_PAGES)) };
    if page <= 0 || phys <= 0 {
        return Err(Error::BackendUnavailable {
            backend: BackendKind::Host,
            reason: "neither /proc/meminfo nor sysconf reports system memory".into(),
        });
    }
    let total = page as u64 * phys as u64;
    Ok(MemoryInfo { free: total, total, source: MemorySource::System })
}

fn cpuinfo_field(name: &str) -> Option<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    text.lines().find_map(|l| {
        let (key, value) = l.split_once(':')?;
        (key.trim() == name).then(|| value.trim().to_string())
    })
}

fn cpu_name() -> Option<String> {
    cpuinfo_field("model name").map(|m| format!("host ({m})"))
}

fn cpu_vendor() -> Option<String> {
    cpuinfo_field("vendor_id")
}
