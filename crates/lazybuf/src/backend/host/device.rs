//! The host device's [`Runtime`]: every operation is a memcpy or memset done
//! before the call returns, so every ticket is complete.

use std::ptr::NonNull;
use std::sync::Arc;

use super::memory::{HostDeviceMemory, HostStream};
use crate::backend::{
    Allocated, DeviceInfo, HostSpan, MemoryInfo, MemoryKind, MemorySource, RawDevice, RawMemory, RawStream,
    Runtime, Ticket, host_block,
};
use crate::error::{BackendKind, Error, Result};
use crate::host_memory::{HostMemory, copy_bytes_raw, fill_pattern};

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
                backend: BackendKind::HOST,
                vendor: cpu_vendor().unwrap_or_else(|| "unknown".into()),
                shares_host_memory: true,
                is_gpu: false,
                total_memory: total,
                compute_capability: None,
                ordinal: None,
                shared_memory: true,
                dlpack: crate::backend::DlpackDevices::CPU,
            },
        }
    }
}

impl Default for HostBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl Runtime for HostBackend {
    type Memory = HostDeviceMemory;
    type Stream = HostStream;

    /// The host device runs no threads of its own: it works in a forked child as anywhere.
    const SURVIVES_FORK: bool = true;

    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn memory_info(&self) -> Result<MemoryInfo> {
        system_memory()
    }

    fn default_stream(&self) -> Arc<HostStream> {
        HostStream::shared()
    }

    fn create_stream(&self) -> Result<Arc<HostStream>> {
        // Work on the host is done when its call returns: every stream is the same stream.
        Ok(HostStream::shared())
    }

    unsafe fn wrap_stream(&self, raw: RawStream) -> Result<Arc<HostStream>> {
        match raw {
            RawStream::Host => Ok(HostStream::shared()),
            other => Err(Error::invalid("wrap_stream", format!("expected the host's stream, got {other:?}"))),
        }
    }

    /// The host's device and shared memory are host memory: the host device and the host are
    /// one.
    fn allocate(&self, kind: MemoryKind, bytes: usize) -> Result<Allocated<HostDeviceMemory>> {
        Ok(match kind {
            MemoryKind::Host { pinned } => Allocated::Host(host_block(bytes, pinned)?),
            MemoryKind::Device | MemoryKind::Shared => {
                Allocated::Memory(HostDeviceMemory::owned(HostMemory::allocate(bytes)?))
            }
        })
    }

    unsafe fn borrow(&self, raw: RawMemory, len: usize) -> Result<HostDeviceMemory> {
        let RawMemory::Host(ptr) = raw else {
            return Err(Error::invalid("borrow", format!("expected host memory, got {raw:?}")));
        };
        let ptr = match NonNull::new(ptr) {
            Some(ptr) => ptr,
            None if len == 0 => NonNull::dangling(),
            None => return Err(Error::invalid("borrow", format!("a null address for {len} bytes"))),
        };
        // SAFETY: the caller's promise: ptr is valid for len bytes while the memory lives.
        Ok(unsafe { HostDeviceMemory::borrowed(ptr, len) })
    }

    fn zero_copy(&self, _bytes: usize) -> bool {
        true
    }

    fn alias_host(&self, host: &mut HostMemory, bytes: usize) -> Option<Result<HostDeviceMemory>> {
        Some(Ok(HostDeviceMemory::alias(host, bytes)))
    }

    unsafe fn upload(&self, _: &HostStream, src: HostSpan, dst: &HostDeviceMemory) -> Result<Ticket> {
        // SAFETY: src is readable for its length (the caller's promise, and the copy is done
        // before returning); dst holds at least src.len() bytes and no one else accesses it
        // (the caller's promise, see `Runtime::upload`). The two may overlap (memory borrowed
        // from the caller can lie anywhere): copy_bytes_raw copies as memmove does.
        unsafe { copy_bytes_raw(dst.ptr(), src.ptr().cast_const(), src.len()) };
        Ok(Ticket::done())
    }

    unsafe fn download(&self, _: &HostStream, src: &HostDeviceMemory, dst: HostSpan) -> Result<Ticket> {
        // SAFETY: dst is writable for its length and untouched meanwhile (the caller's
        // promise); src holds at least dst.len() bytes (see `Runtime::download`), only read
        // here. They may overlap: copy_bytes_raw copies as memmove does.
        unsafe { copy_bytes_raw(dst.ptr(), src.ptr().cast_const(), dst.len()) };
        Ok(Ticket::done())
    }

    unsafe fn fill(
        &self,
        _: &HostStream,
        dst: &HostDeviceMemory,
        pattern: &[u8],
        bytes: usize,
    ) -> Result<Ticket> {
        // SAFETY: no one else accesses dst meanwhile (the caller's promise); an alias's host
        // block is not borrowed while its buffer fills (the buffer holds &mut self).
        fill_pattern(&mut unsafe { dst.bytes_mut() }[..bytes], pattern);
        Ok(Ticket::done())
    }

    unsafe fn copy(
        &self,
        _: &HostStream,
        src: &HostDeviceMemory,
        dst: &HostDeviceMemory,
        bytes: usize,
    ) -> Result<Ticket> {
        // SAFETY: both hold at least `bytes` and no one else accesses dst (the caller's
        // promise, see `Runtime::copy`). Borrowed memory may overlap: copy_bytes_raw copies as
        // memmove does.
        unsafe { copy_bytes_raw(dst.ptr(), src.ptr().cast_const(), bytes) };
        Ok(Ticket::done())
    }

    fn marker(&self, _: &HostStream) -> Result<Ticket> {
        Ok(Ticket::done())
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    fn raw(&self) -> RawDevice {
        RawDevice::Host
    }
}

/// Available and total system memory from `/proc/meminfo` (Linux), else the operating
/// system's own figures ([`crate::host_memory::system_memory`]: `sysconf`, macOS's
/// `host_statistics64`, Windows' `GlobalMemoryStatusEx`).
pub(crate) fn system_memory() -> Result<MemoryInfo> {
    if let Ok(text) = std::fs::read_to_string("/proc/meminfo") {
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.trim().strip_suffix("kB")?.trim().parse::<u64>().ok())
                .map(|kib| kib * 1024)
        };
        if let (Some(free), Some(total)) = (field("MemAvailable:"), field("MemTotal:")) {
            return Ok(MemoryInfo { free, total, source: MemorySource::System, cached: 0 });
        }
    }
    match crate::host_memory::system_memory() {
        Some((free, total)) => Ok(MemoryInfo { free, total, source: MemorySource::System, cached: 0 }),
        None => Err(Error::BackendUnavailable {
            backend: BackendKind::HOST,
            reason: "neither /proc/meminfo nor the operating system reports system memory".into(),
        }),
    }
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

#[cfg(test)]
mod tests {
    use crate::backend::RawMemory;

    /// Memory the host device borrows can lie anywhere, two borrows over one array included:
    /// a copy between overlapping ones gives what a copy through a temporary would (memmove),
    /// at a size the copy splits over threads.
    #[test]
    fn copies_between_overlapping_borrowed_memory_are_memmove() {
        let backend = crate::backend::host::backend();
        let stream = backend.default_stream();
        let (n, shift) = (8 << 20, (1 << 20) + 5);
        for forward in [true, false] {
            let mut bytes: Vec<u8> = (0..n + shift).map(|i: usize| (i % 251) as u8).collect();
            let (d, s) = if forward { (shift, 0) } else { (0, shift) };
            let mut expected = bytes.clone();
            expected.copy_within(s..s + n, d);
            let base = bytes.as_mut_ptr();
            // SAFETY: both ranges lie inside `bytes`, which outlives the borrows (dropped
            // before it is read) and nothing else touches meanwhile.
            let (src, mut dst) = unsafe {
                (
                    backend.borrow(RawMemory::Host(base.add(s)), n).unwrap(),
                    backend.borrow(RawMemory::Host(base.add(d)), n).unwrap(),
                )
            };
            // SAFETY: n is not 0 and fits both, both are the host device's memory.
            unsafe { backend.copy(&*stream, &src, &mut dst, n) }.unwrap().wait().unwrap();
            drop((src, dst));
            assert!(bytes == expected, "forward {forward}");
        }
    }
}
