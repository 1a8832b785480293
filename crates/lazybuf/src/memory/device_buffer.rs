//! [`DeviceBuffer`]: RMM's resizable device buffer, an allocation with a size and a capacity.
//!
//! Semantics (RMM's `device_buffer`): `resize(n)` within the capacity only changes the size
//! (nothing is allocated, copied or freed); beyond it, a new allocation of exactly `n` bytes
//! takes the first `size` bytes and the old one is given back. `reserve(n)` grows the capacity
//! to exactly `n` (never shrinks it) and keeps the size; `shrink_to_fit()` moves the contents
//! into an allocation of exactly `size` bytes. Bytes past the old size after a growth are
//! unspecified. A reallocation that fails (allocation or copy) changes nothing.
//!
//! **Raw handles and reallocation.** As in RMM, a reallocation gives the old allocation back
//! at once: a raw handle read before it ([`DeviceBuffer::raw`]) is dangling after it. Someone
//! who must keep using the memory at a handle (a DLPack tensor) takes an [`AllocationHold`]
//! with the handle ([`DeviceBuffer::hold`]): an allocation replaced, or left by a dropped
//! buffer, while holds on it live is handed to them and given back when the last one is
//! dropped. Only held allocations outlive a reallocation.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use super::allocation::{AllocationOptions, Memory};
use super::observed::{self, Seen};
use crate::backend::{MemoryKind, RawMemory};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::observe::Cause;

/// A resizable buffer of bytes in one allocation of device memory (or of another kind).
///
/// ```
/// use lazybuf::{Device, DeviceBuffer};
///
/// let mut buf = DeviceBuffer::from_host(&Device::host(), b"lazy")?;
/// buf.resize(8)?; // keeps the first 4 bytes; the new ones are unspecified
/// assert_eq!((buf.size(), &buf.to_vec()?[..4]), (8, &b"lazy"[..]));
/// buf.reserve(1024)?;
/// assert!(buf.capacity() >= 1024 && buf.size() == 8);
/// buf.shrink_to_fit()?;
/// # Ok::<(), lazybuf::Error>(())
/// ```
pub struct DeviceBuffer {
    memory: Memory,
    size: usize,
    alignment: usize,
    /// The holds on the current allocation ([`DeviceBuffer::hold`]), if any were taken.
    hold: Option<Arc<HoldSlot>>,
}

/// Where a held allocation goes when its buffer lets go of it.
#[derive(Default)]
struct HoldSlot {
    memory: Mutex<Option<Memory>>,
}

/// Keeps one allocation of a [`DeviceBuffer`] alive while it lives: when the buffer
/// reallocates or is dropped, the allocation it had when the hold was taken is handed to the
/// holds instead of being given back, and is given back when the last hold is dropped.
#[derive(Clone)]
pub struct AllocationHold {
    _slot: Arc<HoldSlot>,
}

impl fmt::Debug for AllocationHold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AllocationHold")
    }
}

impl DeviceBuffer {
    /// `size` bytes of device memory on `device` (unspecified contents), from the device's
    /// current resource.
    pub fn new(device: &Device, size: usize) -> Result<DeviceBuffer> {
        Self::with_options(device, MemoryKind::Device, size, AllocationOptions::default())
    }

    /// `size` bytes of `kind` memory on `device`, made as `options` say; reallocations use
    /// the same resource and alignment.
    pub fn with_options(
        device: &Device,
        kind: MemoryKind,
        size: usize,
        options: AllocationOptions,
    ) -> Result<DeviceBuffer> {
        let alignment = options.alignment;
        let memory = Memory::with_options(device, kind, size, options)?;
        Ok(DeviceBuffer { memory, size, alignment, hold: None })
    }

    /// A buffer of device memory on `device` holding a copy of `bytes` (RMM's `to_device`).
    pub fn from_host(device: &Device, bytes: &[u8]) -> Result<DeviceBuffer> {
        Self::from_host_with(device, MemoryKind::Device, bytes, AllocationOptions::default())
    }

    /// A buffer of `kind` memory on `device`, made as `options` say, holding a copy of
    /// `bytes`.
    pub fn from_host_with(
        device: &Device,
        kind: MemoryKind,
        bytes: &[u8],
        options: AllocationOptions,
    ) -> Result<DeviceBuffer> {
        // The guard decides before anything is allocated: a refusal changes nothing.
        let id = crate::observe::next_buffer_id();
        let seen = Seen::new(id, Cause::sync("from_host"));
        let pending = observed::start(seen, None, observed::device_side(device, kind), bytes.len())?;
        let alignment = options.alignment;
        let memory = Memory::allocate_as(device, kind, bytes.len(), options, Some(id))?;
        let mut buffer = DeviceBuffer { memory, size: bytes.len(), alignment, hold: None };
        if !bytes.is_empty() {
            buffer.memory.upload_bytes(bytes)?;
        }
        observed::finish(pending);
        Ok(buffer)
    }

    /// The buffer's id (unique in the process, shared with buffers' ids; kept across
    /// reallocations): the name the transfer guard's errors and the recorder's events give it.
    pub fn id(&self) -> u64 {
        self.memory.id()
    }

    /// The size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The size in bytes (as [`Self::size`]).
    pub fn len(&self) -> usize {
        self.size
    }

    /// Whether the size is 0.
    pub fn is_empty(&self) -> bool {
        self.size == 0
    }

    /// The bytes the allocation holds: at least the size.
    pub fn capacity(&self) -> usize {
        self.memory.len()
    }

    /// The kind of memory.
    pub fn kind(&self) -> MemoryKind {
        self.memory.kind()
    }

    /// The device.
    pub fn device(&self) -> &Device {
        self.memory.device()
    }

    /// The allocation (all of its capacity; the first [`Self::size`] bytes are the buffer's).
    pub fn memory(&self) -> &Memory {
        &self.memory
    }

    /// Makes the capacity at least `capacity` bytes, keeping the size and the contents: a
    /// new allocation of exactly `capacity` bytes when it grows, nothing otherwise.
    pub fn reserve(&mut self, capacity: usize) -> Result<()> {
        if capacity > self.capacity() {
            self.reallocate(capacity, "reserve")?;
        }
        Ok(())
    }

    /// Sets the size to `size` bytes, keeping the first `min(size, old size)` bytes: within
    /// the capacity nothing moves; beyond it the buffer moves to an allocation of exactly
    /// `size` bytes. New bytes are unspecified.
    pub fn resize(&mut self, size: usize) -> Result<()> {
        if size > self.capacity() {
            self.reallocate(size, "resize")?;
        }
        self.size = size;
        Ok(())
    }

    /// Moves the contents to an allocation of exactly the size, if the capacity is larger.
    pub fn shrink_to_fit(&mut self) -> Result<()> {
        if self.capacity() > self.size {
            self.reallocate(self.size, "shrink_to_fit")?;
        }
        Ok(())
    }

    /// Moves the first `size` bytes to a new allocation of `capacity` bytes; on failure the
    /// new allocation is given back and nothing changes. The old allocation is given back, or
    /// handed to its holds. The move is a copy between memories the guard sees (implicit,
    /// made for `call`; refused, it changes nothing).
    fn reallocate(&mut self, capacity: usize, call: &'static str) -> Result<()> {
        let options =
            AllocationOptions { resource: self.memory.resource().cloned(), alignment: self.alignment };
        let n = self.size.min(capacity);
        let at = self.memory.observed_at();
        let pending = observed::start(Seen::new(self.id(), Cause::access(call)), at, at, n)?;
        let (device, kind, id) = (self.memory.device(), self.memory.kind(), self.memory.id());
        let mut memory = Memory::allocate_as(device, kind, capacity, options, Some(id))?;
        if n > 0 {
            memory.copy_bytes_from(&self.memory, n)?;
        }
        observed::finish(pending);
        let old = std::mem::replace(&mut self.memory, memory);
        self.let_go(old);
        Ok(())
    }

    /// Gives `old` (the allocation just replaced) to its holds if any live, else drops it.
    fn let_go(&mut self, old: Memory) {
        if let Some(slot) = self.hold.take()
            && Arc::strong_count(&slot) > 1
        {
            // A hold dropped meanwhile is fine: the last Arc, ours included, frees the memory.
            *slot.memory.lock().unwrap_or_else(PoisonError::into_inner) = Some(old);
        }
    }

    /// A hold on the current allocation: while it (or a clone) lives, the allocation stays
    /// valid, also after a reallocation or after the buffer is dropped (see the module docs).
    /// For bindings that hand its raw handle to an owner with a lifetime (a DLPack tensor).
    pub fn hold(&mut self) -> AllocationHold {
        AllocationHold { _slot: self.hold.get_or_insert_with(Arc::default).clone() }
    }

    /// Copies `src` into the first `src.len()` bytes (at most the size).
    /// An explicit host-to-device copy for the guard, as every copy method's (see
    /// [`crate::DeviceAllocation::copy_from_host`]).
    pub fn copy_from_host(&mut self, src: &[u8]) -> Result<()> {
        self.check("copy_from_host", src.len())?;
        self.memory.copy_from_host_as(src, Seen::new(self.id(), Cause::sync("copy_from_host")))
    }

    /// Copies the whole buffer into the first `size` bytes of `dst` (which may be longer).
    pub fn copy_to_host(&self, dst: &mut [u8]) -> Result<()> {
        if dst.len() < self.size {
            return Err(Error::invalid(
                "copy_to_host",
                format!("destination of {} bytes is too small; expected at least {}", dst.len(), self.size),
            ));
        }
        let seen = Seen::new(self.id(), Cause::sync("copy_to_host"));
        self.memory.copy_to_host_as(&mut dst[..self.size], seen)
    }

    /// The contents, copied to a new vector ([`Error::OutOfMemory`] when the host cannot
    /// allocate it).
    pub fn to_vec(&self) -> Result<Vec<u8>> {
        let mut out = super::allocation::zeroed_vec(self.size)?;
        self.memory.copy_to_host_as(&mut out, Seen::new(self.id(), Cause::sync("to_vec")))?;
        Ok(out)
    }

    /// Copies the first `count` bytes of `src` (memory of any kind on any device) into the
    /// first `count` bytes of this buffer; `count` is at most both sizes.
    pub fn copy_from_memory(&mut self, src: &Memory, count: usize) -> Result<()> {
        self.copy_from_memory_as(src, count, Cause::sync("copy_from_memory"))
    }

    fn copy_from_memory_as(&mut self, src: &Memory, count: usize, cause: Cause) -> Result<()> {
        self.check(cause.call, count)?;
        self.memory.copy_prefix_from_as(src, count, Seen::new(self.id(), cause))
    }

    /// Copies all of `src` into the first `src.size()` bytes of this buffer.
    pub fn copy_from(&mut self, src: &DeviceBuffer) -> Result<()> {
        self.copy_from_memory_as(&src.memory, src.size, Cause::sync("copy_from"))
    }

    /// Sets every byte of the buffer (up to its size) to `value`.
    pub fn fill(&mut self, value: u8) -> Result<()> {
        self.memory.fill_prefix(self.size, value)
    }

    /// A new buffer with the same contents, size (as capacity), kind, device and resource,
    /// copied on the device.
    pub fn try_clone(&self) -> Result<DeviceBuffer> {
        let options =
            AllocationOptions { resource: self.memory.resource().cloned(), alignment: self.alignment };
        // An explicit copy of this buffer for the guard, which decides before anything is
        // allocated.
        let at = self.memory.observed_at();
        let pending = observed::start(Seen::new(self.id(), Cause::sync("try_clone")), at, at, self.size)?;
        let mut memory = Memory::with_options(self.memory.device(), self.memory.kind(), self.size, options)?;
        if self.size > 0 {
            memory.copy_bytes_from(&self.memory, self.size)?;
        }
        observed::finish(pending);
        Ok(DeviceBuffer { memory, size: self.size, alignment: self.alignment, hold: None })
    }

    /// The runtime's handle to the allocation (see [`crate::DeviceAllocation::raw`]).
    ///
    /// # Safety
    /// Valid until the buffer is dropped or reallocates (unless an [`AllocationHold`] taken
    /// with [`Self::hold`] keeps it), and ordered as [`crate::DeviceAllocation::raw`] says.
    pub unsafe fn raw(&self) -> RawMemory {
        // SAFETY: forwarded contract.
        unsafe { self.memory.raw() }
    }

    fn check(&self, operation: &'static str, count: usize) -> Result<()> {
        if count > self.size {
            return Err(Error::LengthMismatch {
                operation,
                expected: self.size,
                actual: count,
                unit: "bytes",
            });
        }
        Ok(())
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.hold.as_ref().is_some_and(|slot| Arc::strong_count(slot) > 1)
            && let Some(memory) = self.memory.take()
        {
            self.let_go(memory);
        }
    }
}

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("size", &self.size)
            .field("capacity", &self.capacity())
            .field("kind", &self.kind())
            .field("device", self.device())
            .finish()
    }
}
