//! The loopback device's [`Runtime`]: every operation is a memcpy or memset between separate
//! blocks, done before the call returns.

use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use super::memory::{LoopbackMemory, LoopbackStream};
use crate::backend::{
    Allocated, DeviceInfo, DlpackDevices, HostSpan, MemoryInfo, MemoryKind, MemorySource, RawDevice,
    RawMemory, Runtime, Ticket, host_block,
};
use crate::error::{BackendKind, Error, Result};
use crate::host_memory::{HostMemory, copy_bytes_raw, fill_pattern};

/// Each loopback device's memory: 1 GiB.
pub const CAPACITY: u64 = 1 << 30;

/// Identities of opened loopback devices (a device recognises its own memory by it).
static OPENED: AtomicU64 = AtomicU64::new(1);

/// One loopback device.
#[derive(Debug)]
pub struct LoopbackBackend {
    info: DeviceInfo,
    /// This opening's identity.
    id: u64,
    /// Bytes of device memory allocated and not freed.
    held: Arc<AtomicU64>,
    /// Live allocations (address, length): what `borrow` accepts.
    live: Arc<Mutex<BTreeMap<u64, usize>>>,
    stream: Arc<LoopbackStream>,
}

impl LoopbackBackend {
    /// Opens loopback device `index` (each call a new device, with memory of its own).
    pub fn new(index: u32) -> Self {
        let id = OPENED.fetch_add(1, Ordering::Relaxed);
        LoopbackBackend {
            info: DeviceInfo {
                name: format!("loopback device {index} (test-only: discrete memory on the host)"),
                backend: BackendKind::LOOPBACK,
                vendor: "lazybuf".into(),
                shares_host_memory: false,
                is_gpu: false,
                total_memory: CAPACITY,
                compute_capability: None,
                ordinal: None,
                // The host does not address its device memory; its shared memory is host memory.
                shared_memory: true,
                dlpack: DlpackDevices::HOST_SHARED,
            },
            id,
            held: Arc::new(AtomicU64::new(0)),
            live: Arc::default(),
            stream: Arc::new(LoopbackStream { device: id }),
        }
    }

    /// Device (or `shared`) memory of `bytes`, out of memory beyond the capacity.
    fn allocate_device(&self, bytes: usize, shared: bool) -> Result<LoopbackMemory> {
        let out_of_memory =
            || Error::OutOfMemory { device: self.info.name.clone(), requested: bytes, code: None };
        let reserved = self.held.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
            held.checked_add(bytes as u64).filter(|&total| total <= CAPACITY)
        });
        if reserved.is_err() {
            return Err(out_of_memory());
        }
        match HostMemory::allocate(bytes) {
            Ok(block) => {
                Ok(LoopbackMemory::new(block, bytes, self.id, shared, self.held.clone(), self.live.clone()))
            }
            Err(err) => {
                self.held.fetch_sub(bytes as u64, Ordering::Relaxed);
                Err(err)
            }
        }
    }
}

impl Runtime for LoopbackBackend {
    type Memory = LoopbackMemory;
    type Stream = LoopbackStream;

    /// No threads of its own: it works in a forked child as anywhere.
    const SURVIVES_FORK: bool = true;

    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn memory_info(&self) -> Result<MemoryInfo> {
        let held = self.held.load(Ordering::Relaxed);
        Ok(MemoryInfo {
            free: CAPACITY.saturating_sub(held),
            total: CAPACITY,
            source: MemorySource::TotalMinusProcessHeld,
            cached: 0,
        })
    }

    fn default_stream(&self) -> Arc<LoopbackStream> {
        self.stream.clone()
    }

    fn create_stream(&self) -> Result<Arc<LoopbackStream>> {
        Ok(Arc::new(LoopbackStream { device: self.id }))
    }

    fn allocate(&self, kind: MemoryKind, bytes: usize) -> Result<Allocated<LoopbackMemory>> {
        match kind {
            MemoryKind::Host { pinned } => Ok(Allocated::Host(host_block(bytes, pinned)?)),
            MemoryKind::Device => Ok(Allocated::Memory(self.allocate_device(bytes, false)?)),
            MemoryKind::Shared => Ok(Allocated::Memory(self.allocate_device(bytes, true)?)),
        }
    }

    /// Memory inside one of this device's live allocations (as a CUDA device accepts a
    /// pointer into its own memory); anything else is refused.
    unsafe fn borrow(&self, raw: RawMemory, len: usize) -> Result<LoopbackMemory> {
        let RawMemory::Loopback(address) = raw else {
            return Err(Error::invalid("borrow", format!("expected loopback device memory, got {raw:?}")));
        };
        let inside = {
            let live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
            live.range(..=address).next_back().is_some_and(|(&start, &size)| {
                address.checked_add(len as u64).is_some_and(|end| end <= start + size as u64)
            })
        };
        let ptr = match NonNull::new(address as *mut u8) {
            Some(ptr) if inside => ptr,
            None if len == 0 => NonNull::dangling(),
            _ => {
                return Err(Error::invalid(
                    "borrow",
                    format!("{address:#x} (+{len} bytes) is not memory of {}", self.info.name),
                ));
            }
        };
        // SAFETY: the caller's promise: the allocation outlives the borrowed memory.
        Ok(unsafe { LoopbackMemory::borrowed(ptr, len, self.id) })
    }

    fn owns(&self, memory: &LoopbackMemory) -> bool {
        memory.device == self.id
    }

    fn owns_stream(&self, stream: &LoopbackStream) -> bool {
        stream.device == self.id
    }

    unsafe fn upload(&self, _: &LoopbackStream, src: HostSpan, dst: &LoopbackMemory) -> Result<Ticket> {
        // SAFETY: src is readable for its length; dst holds at least src.len() bytes and no
        // one else accesses it (the caller's promises, see `Runtime::upload`). They cannot
        // overlap (dst is the device's own block), and copy_bytes_raw would copy as memmove
        // does if they did.
        unsafe { copy_bytes_raw(dst.ptr(), src.ptr().cast_const(), src.len()) };
        Ok(Ticket::done())
    }

    unsafe fn download(&self, _: &LoopbackStream, src: &LoopbackMemory, dst: HostSpan) -> Result<Ticket> {
        // SAFETY: dst is writable for its length and untouched meanwhile; src holds at least
        // dst.len() bytes (the caller's promises, see `Runtime::download`).
        unsafe { copy_bytes_raw(dst.ptr(), src.ptr().cast_const(), dst.len()) };
        Ok(Ticket::done())
    }

    unsafe fn fill(
        &self,
        _: &LoopbackStream,
        dst: &LoopbackMemory,
        pattern: &[u8],
        bytes: usize,
    ) -> Result<Ticket> {
        // SAFETY: no one else accesses dst meanwhile (the caller's promise).
        fill_pattern(&mut unsafe { dst.bytes_mut() }[..bytes], pattern);
        Ok(Ticket::done())
    }

    unsafe fn copy(
        &self,
        _: &LoopbackStream,
        src: &LoopbackMemory,
        dst: &LoopbackMemory,
        bytes: usize,
    ) -> Result<Ticket> {
        // SAFETY: both hold at least `bytes`, dst is not src and no one else accesses it (the
        // caller's promises, see `Runtime::copy`).
        unsafe { copy_bytes_raw(dst.ptr(), src.ptr().cast_const(), bytes) };
        Ok(Ticket::done())
    }

    /// Every other loopback device: their memory is all in this process.
    fn can_copy_from_peer(&self, src: &LoopbackBackend) -> bool {
        src.id != self.id
    }

    unsafe fn copy_from_peer(
        &self,
        _: &LoopbackStream,
        _src_runtime: &LoopbackBackend,
        src: &LoopbackMemory,
        dst: &LoopbackMemory,
        bytes: usize,
    ) -> Option<Result<Ticket>> {
        // SAFETY: both hold at least `bytes`; src is the peer's memory and dst this device's,
        // which no one else accesses (the caller's promises, see `Runtime::copy_from_peer`).
        unsafe { copy_bytes_raw(dst.ptr(), src.ptr().cast_const(), bytes) };
        Some(Ok(Ticket::done()))
    }

    fn marker(&self, _: &LoopbackStream) -> Result<Ticket> {
        Ok(Ticket::done())
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    fn raw(&self) -> RawDevice {
        RawDevice::Loopback { device: self.id }
    }
}
