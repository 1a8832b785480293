//! [`DeviceAllocation<T>`]: one allocation of a memory kind on a device, typed, with blocking
//! upload, download, fill and copy.
//!
//! Each operation picks its path from the two blocks involved: host blocks ([`Block::Host`],
//! the host and pinned kinds) are read and written by the host, memory a device addresses
//! ([`Block::Device`], the device and shared kinds) through its device's backend; a copy
//! between two devices goes peer to peer where the runtime can, else through host memory.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use crate::backend::{DeviceMemory, HostSpan, MemoryKind, RawMemory, Ticket};
use crate::device::{Device, Stream};
use crate::element::Element;
use crate::error::{Error, Result};
use crate::host_memory::{HostMemory, copy_bytes, fill_pattern};
use crate::observe::Cause;
use crate::resource::{Block, MemoryResource, default_resource};

use super::observed::{self, Seen};

/// How an allocation is made.
#[derive(Clone, Debug, Default)]
pub struct AllocationOptions {
    /// Where the memory comes from; `None`: the device's current resource
    /// ([`crate::resource::default_resource`]).
    pub resource: Option<Arc<dyn MemoryResource>>,
    /// The alignment in bytes the allocation must have: 0 for the kind's own, else a power of
    /// two no larger than what the device guarantees for the kind
    /// ([`crate::backend::Backend::alignment`]).
    pub alignment: usize,
}

/// The untyped memory object: an allocation of bytes, of any kind.
///
/// ```
/// use lazybuf::{Device, Memory, MemoryKind};
///
/// let mut m = Memory::new(&Device::host(), MemoryKind::Shared, 8)?;
/// m.fill(7)?;
/// assert_eq!((m.nbytes(), m.kind().name()), (8, "shared"));
/// assert_eq!(m.to_vec()?, [7; 8]);
/// # Ok::<(), lazybuf::Error>(())
/// ```
pub type Memory = DeviceAllocation<u8>;

/// `len` elements of `T` in one allocation of a [`MemoryKind`] on a device.
///
/// The contents of a new allocation are unspecified (memory reused from a cache keeps what it
/// held). Dropping it gives the memory back to its resource once the work enqueued on the
/// device's stream so far is done.
///
/// ```
/// use lazybuf::{Device, DeviceAllocation, MemoryKind};
///
/// let device = Device::host(); // any device: lazybuf::default_device()?
/// let mut a = DeviceAllocation::<f32>::new(&device, MemoryKind::Device, 4)?;
/// a.copy_from_host(&[1.0, 2.0, 3.0, 4.0])?; // an upload
/// let mut b = a.to(&device, MemoryKind::Host { pinned: false })?; // a copy of another kind
/// b.fill(0.5)?;
/// assert_eq!(a.to_vec()?, [1.0, 2.0, 3.0, 4.0]); // a download
/// assert_eq!(b.host_slice()?, [0.5; 4]); // host memory: addressed directly
/// # Ok::<(), lazybuf::Error>(())
/// ```
pub struct DeviceAllocation<T: Element> {
    /// The name errors and events give it ([`Self::id`]).
    id: u64,
    device: Device,
    kind: MemoryKind,
    len: usize,
    alignment: usize,
    block: Block,
    /// Where the memory goes back; `None` for memory the caller owns ([`Self::borrowed`]).
    resource: Option<Arc<dyn MemoryResource>>,
    _element: PhantomData<T>,
}

fn overflow(len: usize, size: usize) -> Error {
    Error::invalid(
        "allocate",
        format!("{len} elements of {size} bytes overflow the address space; expected a smaller length"),
    )
}

impl<T: Element> DeviceAllocation<T> {
    /// `len` elements of `kind` memory on `device`, from the device's current resource.
    pub fn new(device: &Device, kind: MemoryKind, len: usize) -> Result<Self> {
        Self::with_options(device, kind, len, AllocationOptions::default())
    }

    /// `len` elements of `kind` memory on `device`, made as `options` say. Shared memory on a
    /// device that has none, and an alignment that is not a power of two or exceeds the
    /// device's guarantee for the kind, are [`Error::InvalidArgument`]s naming what was
    /// expected.
    pub fn with_options(
        device: &Device,
        kind: MemoryKind,
        len: usize,
        options: AllocationOptions,
    ) -> Result<Self> {
        Self::allocate_as(device, kind, len, options, None)
    }

    /// [`Self::with_options`], for memory that a copy from `from` (the device and kind of the
    /// memory the copy will read; `None`: host memory) is about to fill, all `len` elements:
    /// the transfer guard decides on that copy first, named by `cause` (or the running call's),
    /// and a refusal allocates nothing (an allocation may spill other buffers for room, and
    /// the recorder would record it and its free). The copy itself is the caller's, with a
    /// copy method that the guard and the recorder see as usual. The error of a refused copy
    /// names the id the allocation would have had.
    ///
    /// For bindings whose constructors copy into new memory (Python's `MemoryDevice(other,
    /// copy=True)`, unpickling), where [`Self::to`] does not fit (a source that is no
    /// allocation, another alignment or resource).
    pub fn for_copy_from(
        device: &Device,
        kind: MemoryKind,
        len: usize,
        options: AllocationOptions,
        from: Option<(&Device, MemoryKind)>,
        cause: Cause,
    ) -> Result<Self> {
        let nothing = || Ok::<(), std::convert::Infallible>(());
        match Self::for_copy_from_after(device, kind, len, options, from, cause, nothing)? {
            Ok((memory, ())) => Ok(memory),
            Err(never) => match never {},
        }
    }

    /// [`Self::for_copy_from`], running `first` between the guard's verdict and the allocation
    /// (nothing is allocated when it fails: its error is the inner one): for a source that must
    /// be read, a copy of its own, before the copy into the new memory (a wgpu buffer staged
    /// through the host), so that a refusal of either copy changes nothing.
    pub fn for_copy_from_after<R, X>(
        device: &Device,
        kind: MemoryKind,
        len: usize,
        options: AllocationOptions,
        from: Option<(&Device, MemoryKind)>,
        cause: Cause,
        first: impl FnOnce() -> std::result::Result<R, X>,
    ) -> Result<std::result::Result<(Self, R), X>> {
        let size = std::mem::size_of::<T>();
        let bytes = len.checked_mul(size).ok_or_else(|| overflow(len, size))?;
        let id = crate::observe::next_buffer_id();
        let from = from.and_then(|(device, kind)| observed::device_side(device, kind));
        observed::check_refusal(Seen::new(id, cause), from, observed::device_side(device, kind), bytes)?;
        let read = match first() {
            Ok(read) => read,
            Err(err) => return Ok(Err(err)),
        };
        Ok(Ok((Self::allocate_as(device, kind, len, options, Some(id))?, read)))
    }

    /// The transfer guard's refusal of a copy of `bytes` from `from` (the device and kind of
    /// the memory the copy will read; `None`: host memory) into this memory, asked before the
    /// caller changes anything for it, logging and recording nothing (the copy's own method
    /// does both). For bindings whose source must be read, a copy of its own, before the copy
    /// into this memory can run (a wgpu buffer staged through the host).
    pub fn check_copy_from(
        &self,
        from: Option<(&Device, MemoryKind)>,
        bytes: usize,
        cause: Cause,
    ) -> Result<()> {
        let from = from.and_then(|(device, kind)| observed::device_side(device, kind));
        observed::check_refusal(Seen::new(self.id, cause), from, self.observed_at(), bytes)
    }

    /// [`Self::with_options`], for the memory object `id` (`None`: a new one, numbered once
    /// it is made): a [`super::DeviceBuffer`]'s new memory keeps the buffer's id. The
    /// recorder sees the allocation (`observed::allocated`) under that id.
    pub(super) fn allocate_as(
        device: &Device,
        kind: MemoryKind,
        len: usize,
        options: AllocationOptions,
        id: Option<u64>,
    ) -> Result<Self> {
        let size = std::mem::size_of::<T>();
        let bytes =
            len.checked_mul(size).filter(|&b| b <= isize::MAX as usize).ok_or_else(|| overflow(len, size))?;
        let guaranteed = device.backend().alignment(kind);
        let alignment = match options.alignment {
            0 => guaranteed,
            a if !a.is_power_of_two() => {
                return Err(Error::invalid(
                    "allocate",
                    format!(
                        "alignment {a} is not a power of two; expected 0 (the kind's own) or a power of two"
                    ),
                ));
            }
            a if a > guaranteed => {
                return Err(Error::invalid(
                    "allocate",
                    format!(
                        "alignment {a} exceeds what {device} guarantees for {} memory; expected a power of two up to {guaranteed}",
                        kind.name()
                    ),
                ));
            }
            _ => guaranteed,
        };
        let resource = options.resource.unwrap_or_else(|| default_resource(device));
        let stream = device.stream();
        // Recorded only once the block is kept: a failed allocation, or a block given back
        // below, records nothing but the pool lookups made for it.
        let recorded = observed::allocating();
        let block = resource
            .allocate(device, kind, bytes, &stream)
            .inspect_err(|_| observed::not_allocated(recorded))?;
        if block.kind() != kind || block.len() < bytes {
            let got = format!("{} bytes of {:?}", block.len(), block.kind());
            resource.deallocate(device, block, &stream, Ticket::done());
            observed::not_allocated(recorded);
            return Err(Error::invalid(
                "allocate",
                format!(
                    "the memory resource {resource:?} returned {got}; expected {bytes} bytes of {kind:?}"
                ),
            ));
        }
        // Device and shared memory must be this device's own, too.
        if let Err(err) = crate::resource::check_block(&*resource, device, kind, bytes, &block) {
            resource.deallocate(device, block, &stream, Ticket::done());
            observed::not_allocated(recorded);
            return Err(err);
        }
        let id = id.unwrap_or_else(crate::observe::next_buffer_id);
        observed::allocated(recorded, id, device, kind, block.len());
        Ok(DeviceAllocation {
            id,
            device: device.clone(),
            kind,
            len,
            alignment,
            block,
            resource: Some(resource),
            _element: PhantomData,
        })
    }

    /// `len` elements of device memory at `raw` that the caller owns and lazybuf did not
    /// allocate (a CUDA pointer into `device`'s memory, a `cl_mem` of its context, host memory
    /// for the host device), for copies from and to it: its kind is [`MemoryKind::Device`],
    /// and dropping it frees nothing. An error when `raw` is not `device`'s memory. Neither
    /// its making nor its drop is an event of the recorder (lazybuf allocated nothing).
    ///
    /// # Safety
    /// `raw` stays valid for `len` elements, and is not freed, while the allocation lives;
    /// the caller orders its own work on the memory with the allocation's operations.
    pub unsafe fn borrowed(device: &Device, raw: RawMemory, len: usize) -> Result<Self> {
        let size = std::mem::size_of::<T>();
        let bytes =
            len.checked_mul(size).filter(|&b| b <= isize::MAX as usize).ok_or_else(|| overflow(len, size))?;
        // SAFETY: forwarded contract.
        let memory = unsafe { device.backend().borrow(raw, bytes) }?;
        Ok(DeviceAllocation {
            id: crate::observe::next_buffer_id(),
            device: device.clone(),
            kind: MemoryKind::Device,
            len,
            alignment: 1,
            block: Block::Device(memory),
            resource: None,
            _element: PhantomData,
        })
    }

    /// The allocation's id (unique in the process, shared with buffers' ids: 1, 2, ...): the
    /// name the transfer guard's errors and the recorder's events give it
    /// ([`crate::observe::TransferInfo::buffer`]).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the allocation holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The size in bytes.
    pub fn nbytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }

    /// The kind of memory.
    pub fn kind(&self) -> MemoryKind {
        self.kind
    }

    /// The device the memory belongs to (for host memory: the device it was made for).
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The device (or shared) memory, for [`Stream`]'s operations (a copy into a buffer's
    /// device copy, say); `None` for host memory.
    pub fn device_memory(&self) -> Option<&DeviceMemory> {
        match &self.block {
            Block::Device(memory) => Some(memory),
            Block::Host(_) => None,
        }
    }

    /// The alignment in bytes the allocation's address is guaranteed to have (for OpenCL
    /// device memory: its device address).
    pub fn alignment(&self) -> usize {
        self.alignment
    }

    /// The resource the memory goes back to (`None` for memory the caller owns).
    pub fn resource(&self) -> Option<&Arc<dyn MemoryResource>> {
        self.resource.as_ref()
    }

    /// The stream every operation runs on: the device's default stream.
    pub fn stream(&self) -> Stream {
        self.device.stream()
    }

    /// Whether the host can read and write the memory ([`MemoryKind::host_accessible`]).
    pub fn is_host_accessible(&self) -> bool {
        self.kind.host_accessible()
    }

    /// The device whose copies alone reach the memory, for the guard and the recorder
    /// ([`observed::device_side`]); `None` for memory the host addresses as its own (the host
    /// kinds, every kind on the host device).
    pub(super) fn observed_at(&self) -> Option<&Device> {
        observed::device_side(&self.device, self.kind)
    }

    /// Copies `src` into the first `src.len()` elements (a shorter source fills a prefix).
    ///
    /// Between host memory and memory a device addresses, the transfer guard sees the copy
    /// (an explicit host-to-device copy, call `copy_from_host`; a refused one copies nothing)
    /// and the recorder records it; so for every copy method ([`crate::observe`]).
    pub fn copy_from_host(&mut self, src: &[T]) -> Result<()> {
        self.copy_from_host_as(src, Seen::new(self.id, Cause::sync("copy_from_host")))
    }

    /// [`Self::copy_from_host`], seen as `seen` says.
    pub(super) fn copy_from_host_as(&mut self, src: &[T], seen: Seen) -> Result<()> {
        self.check("copy_from_host", src.len())?;
        let src: &[u8] = bytemuck::cast_slice(src);
        if src.is_empty() {
            return Ok(());
        }
        let pending = observed::start(seen, None, self.observed_at(), src.len())?;
        self.upload_bytes(src)?;
        observed::finish(pending);
        Ok(())
    }

    /// The copy of [`Self::copy_from_host_as`], unobserved: `src` fits and is not empty.
    pub(super) fn upload_bytes(&mut self, src: &[u8]) -> Result<()> {
        match &mut self.block {
            Block::Host(host) => copy_bytes(&mut host.as_mut_slice()[..src.len()], src),
            Block::Device(memory) => {
                // SAFETY: src is borrowed until the copy has completed (waited for here).
                unsafe { self.device.stream().upload(HostSpan::of_slice(src), memory) }?.wait()?
            }
        }
        Ok(())
    }

    /// Copies the first `dst.len()` elements into `dst` (a shorter destination takes a
    /// prefix). An explicit device-to-host copy for the guard (call `copy_to_host`).
    pub fn copy_to_host(&self, dst: &mut [T]) -> Result<()> {
        self.copy_to_host_as(dst, Seen::new(self.id, Cause::sync("copy_to_host")))
    }

    /// [`Self::copy_to_host`], seen as `seen` says.
    pub(super) fn copy_to_host_as(&self, dst: &mut [T], seen: Seen) -> Result<()> {
        self.check("copy_to_host", dst.len())?;
        let dst: &mut [u8] = bytemuck::cast_slice_mut(dst);
        if dst.is_empty() {
            return Ok(());
        }
        let pending = observed::start(seen, self.observed_at(), None, dst.len())?;
        match &self.block {
            Block::Host(host) => copy_bytes(dst, &host.as_slice()[..dst.len()]),
            Block::Device(memory) => {
                let span = HostSpan::of_mut_slice(dst);
                // SAFETY: dst is borrowed mutably until the copy has completed (waited for).
                unsafe { self.device.stream().download(memory, span) }?.wait()?
            }
        }
        observed::finish(pending);
        Ok(())
    }

    /// The elements, copied to a new vector ([`Error::OutOfMemory`] when the host cannot
    /// allocate it). An explicit device-to-host copy for the guard (call `to_vec`).
    pub fn to_vec(&self) -> Result<Vec<T>> {
        self.to_vec_as(Seen::new(self.id, Cause::sync("to_vec")))
    }

    /// [`Self::to_vec`], seen as `seen` says.
    pub(super) fn to_vec_as(&self, seen: Seen) -> Result<Vec<T>> {
        let mut out = zeroed_vec(self.len)?;
        self.copy_to_host_as(&mut out, seen)?;
        Ok(out)
    }

    /// Sets every element to `value`.
    pub fn fill(&mut self, value: T) -> Result<()> {
        self.fill_prefix(self.len, value)
    }

    /// Sets the first `count` elements to `value`.
    pub fn fill_prefix(&mut self, count: usize, value: T) -> Result<()> {
        self.check("fill", count)?;
        let n = count * std::mem::size_of::<T>();
        if n == 0 {
            return Ok(());
        }
        let pattern = bytemuck::bytes_of(&value);
        match &mut self.block {
            Block::Host(host) => fill_pattern(&mut host.as_mut_slice()[..n], pattern),
            Block::Device(memory) => self.device.stream().fill(memory, pattern, n)?.wait()?,
        }
        Ok(())
    }

    /// Copies all of `src` into the first `src.len()` elements, from any kind on any device.
    pub fn copy_from(&mut self, src: &DeviceAllocation<T>) -> Result<()> {
        self.copy_prefix_from(src, src.len())
    }

    /// Copies the first `count` elements of `src` into the first `count` elements of this
    /// allocation: on the device where both are memory of one device, peer to peer between
    /// devices that can, else through host memory. The copy is ordered after the work enqueued
    /// on `src`'s device stream so far. The guard sees one explicit copy (call `copy_from`),
    /// host-to-device, device-to-host or device-to-device (also when staged through the host)
    /// as the two memories are; none between two host memories.
    pub fn copy_prefix_from(&mut self, src: &DeviceAllocation<T>, count: usize) -> Result<()> {
        self.copy_prefix_from_as(src, count, Seen::new(self.id, Cause::sync("copy_from")))
    }

    /// [`Self::copy_prefix_from`], seen as `seen` says.
    pub(super) fn copy_prefix_from_as(
        &mut self,
        src: &DeviceAllocation<T>,
        count: usize,
        seen: Seen,
    ) -> Result<()> {
        self.check("copy_from", count)?;
        src.check("copy_from (source)", count)?;
        let n = count * std::mem::size_of::<T>();
        if n == 0 {
            return Ok(());
        }
        let pending = observed::start(seen, src.observed_at(), self.observed_at(), n)?;
        self.copy_bytes_from(src, n)?;
        observed::finish(pending);
        Ok(())
    }

    /// The copy of [`Self::copy_prefix_from_as`], unobserved: `n` bytes, checked, not empty.
    pub(super) fn copy_bytes_from(&mut self, src: &DeviceAllocation<T>, n: usize) -> Result<()> {
        let stream = self.device.stream();
        if src.device != self.device
            && let (Block::Device(_), Block::Device(_)) = (&src.block, &self.block)
        {
            stream.wait_for(&src.device.stream().marker()?)?;
        }
        match (&src.block, &mut self.block) {
            (Block::Host(from), Block::Host(to)) => {
                copy_bytes(&mut to.as_mut_slice()[..n], &from.as_slice()[..n])
            }
            (Block::Host(from), Block::Device(to)) => {
                // SAFETY: `src` is borrowed until the copy has completed (waited for here).
                unsafe { stream.upload(HostSpan::of(from, n), to) }?.wait()?
            }
            (Block::Device(from), Block::Host(to)) => {
                let span = HostSpan::of(to, n);
                // SAFETY: `self` is borrowed mutably until the copy has completed (waited for).
                unsafe { src.device.stream().download(from, span) }?.wait()?
            }
            (Block::Device(from), Block::Device(to)) if src.device == self.device => {
                stream.copy(from, to, n)?.wait()?
            }
            (Block::Device(from), Block::Device(to)) => {
                match stream.copy_from_peer(&src.device, from, to, n) {
                    Some(ticket) => ticket?.wait()?,
                    None => stage(&src.device, from, &self.device, to, n)?,
                }
            }
        }
        Ok(())
    }

    /// A new allocation of `kind` on `device` (same resource when it is the same device,
    /// else that device's current resource) holding a copy of these elements.
    pub fn to(&self, device: &Device, kind: MemoryKind) -> Result<DeviceAllocation<T>> {
        let resource = if device == &self.device { self.resource.clone() } else { None };
        // The guard decides before anything is allocated: a refusal changes nothing.
        let seen = Seen::new(self.id, Cause::sync("to"));
        let to = observed::device_side(device, kind);
        let pending = observed::start(seen, self.observed_at(), to, self.nbytes())?;
        let mut copy = DeviceAllocation::with_options(
            device,
            kind,
            self.len,
            AllocationOptions { resource, alignment: 0 },
        )?;
        if self.nbytes() > 0 {
            copy.copy_bytes_from(self, self.nbytes())?;
        }
        observed::finish(pending);
        Ok(copy)
    }

    /// The elements, for the host to read, for kinds the host addresses (host and shared
    /// memory; device memory is an [`Error::InvalidArgument`]). For shared memory it first
    /// waits for the work enqueued on the device's stream (the caller's kernels included).
    pub fn host_slice(&self) -> Result<&[T]> {
        let bytes = self.host_bytes("host_slice")?;
        // SAFETY: host_bytes returns an address valid for the allocation's nbytes while it
        // lives; `&self` keeps it alive and excludes writes through `&mut self`.
        let bytes = unsafe { std::slice::from_raw_parts(bytes, self.nbytes()) };
        bytemuck::try_cast_slice(bytes).map_err(|err| misaligned("host_slice", err))
    }

    /// The elements, for the host to write (see [`Self::host_slice`]).
    pub fn host_slice_mut(&mut self) -> Result<&mut [T]> {
        let bytes = self.host_bytes("host_slice_mut")?;
        // SAFETY: as in host_slice; `&mut self` makes this the only access to the bytes.
        let bytes = unsafe { std::slice::from_raw_parts_mut(bytes, self.nbytes()) };
        bytemuck::try_cast_slice_mut(bytes).map_err(|err| misaligned("host_slice_mut", err))
    }

    /// The address of the first byte for the host, after the device's stream is idle for
    /// shared memory; an error for device memory.
    fn host_bytes(&self, operation: &'static str) -> Result<*mut u8> {
        let n = self.nbytes();
        match &self.block {
            Block::Host(host) => Ok(if n == 0 { dangling::<T>() } else { host.as_ptr().cast_mut() }),
            Block::Device(memory) if self.kind == MemoryKind::Shared => {
                if n == 0 {
                    return Ok(dangling::<T>());
                }
                self.device.stream().synchronize()?;
                memory.host_address().map(|p| p.as_ptr()).ok_or_else(|| {
                    Error::invalid(
                        operation,
                        format!("{} gave shared memory without a host address", self.device),
                    )
                })
            }
            Block::Device(_) => Err(Error::invalid(
                operation,
                format!(
                    "device memory on {} is not host accessible; expected host or shared memory (copy it with copy_to_host)",
                    self.device
                ),
            )),
        }
    }

    /// The host addresses of the memory where the host addresses it (host and shared memory,
    /// and every kind on the host device); `None` for memory only a device reaches, or when
    /// empty. For bindings that must not copy between overlapping memory.
    pub fn host_range(&self) -> Option<std::ops::Range<usize>> {
        let start = match &self.block {
            Block::Host(host) => host.as_ptr() as usize,
            Block::Device(memory) => memory.host_address()?.as_ptr() as usize,
        };
        (self.nbytes() > 0).then(|| start..start + self.nbytes())
    }

    /// Moves shared memory's pages to the device (`to_device`) or to the host ahead of use,
    /// and waits for the move; other kinds need nothing.
    pub fn prefetch(&self, to_device: bool) -> Result<()> {
        match &self.block {
            Block::Device(memory) if self.kind == MemoryKind::Shared && !memory.is_empty() => {
                self.device.stream().prefetch(memory, to_device)?.wait()
            }
            _ => Ok(()),
        }
    }

    /// The runtime's handle: the address for host memory (and host-device memory), the
    /// `CUdeviceptr` on CUDA, the `cl_mem` on OpenCL (for shared memory there, the buffer over
    /// the SVM allocation; [`Self::host_slice`] gives the SVM address). Null/0 when empty.
    ///
    /// # Safety
    /// The handle is valid while this allocation lives; work the caller enqueues with it must
    /// be ordered with the allocation's operations (on [`Self::stream`], or waited for).
    pub unsafe fn raw(&self) -> RawMemory {
        match &self.block {
            Block::Host(host) => {
                RawMemory::Host(if host.is_empty() { std::ptr::null_mut() } else { host.as_ptr().cast_mut() })
            }
            // SAFETY: forwarded contract.
            Block::Device(memory) => unsafe { memory.raw() },
        }
    }

    fn check(&self, operation: &'static str, count: usize) -> Result<()> {
        if count > self.len {
            return Err(Error::LengthMismatch {
                operation,
                expected: self.len,
                actual: count,
                unit: "elements",
            });
        }
        Ok(())
    }

    /// Moves the memory out into a new allocation, leaving this one empty (it frees nothing
    /// when dropped); `None` when the empty placeholder cannot be made. For owners that must
    /// hand their memory on from `Drop`.
    pub(super) fn take(&mut self) -> Option<Self> {
        let empty = HostMemory::allocate(0).ok()?;
        let block = std::mem::replace(&mut self.block, Block::Host(empty));
        let len = std::mem::take(&mut self.len);
        Some(DeviceAllocation {
            id: self.id,
            device: self.device.clone(),
            kind: self.kind,
            len,
            alignment: self.alignment,
            block,
            resource: self.resource.take(),
            _element: PhantomData,
        })
    }
}

fn misaligned(operation: &'static str, err: bytemuck::PodCastError) -> Error {
    Error::invalid(operation, format!("the memory cannot be viewed as elements ({err:?})"))
}

/// `len` zeroed elements in a new vector, allocated fallibly: [`Error::OutOfMemory`] (not an
/// abort) when the host cannot allocate them.
pub(crate) fn zeroed_vec<T: Element>(len: usize) -> Result<Vec<T>> {
    let mut out = Vec::new();
    out.try_reserve_exact(len).map_err(|_| Error::OutOfMemory {
        device: "host".into(),
        requested: len.saturating_mul(std::mem::size_of::<T>()),
        code: None,
    })?;
    out.resize(len, <T as bytemuck::Zeroable>::zeroed());
    Ok(out)
}

/// A well-aligned address for empty slices.
fn dangling<T>() -> *mut u8 {
    std::ptr::NonNull::<T>::dangling().as_ptr().cast()
}

/// Copies `n` bytes from memory of `from_device` to memory of `to_device` through a host
/// block: download, then upload.
fn stage(
    from_device: &Device,
    from: &DeviceMemory,
    to_device: &Device,
    to: &mut DeviceMemory,
    n: usize,
) -> Result<()> {
    let staging = HostMemory::allocate(n)?;
    // SAFETY: the staging block lives, unread, until each copy has completed (waited for).
    unsafe {
        from_device.stream().download(from, HostSpan::of(&staging, n))?.wait()?;
        to_device.stream().upload(HostSpan::of(&staging, n), to)?.wait()
    }
}

impl<T: Element> Drop for DeviceAllocation<T> {
    fn drop(&mut self) {
        let Some(resource) = &self.resource else { return };
        let Ok(empty) = HostMemory::allocate(0) else { return };
        let block = std::mem::replace(&mut self.block, Block::Host(empty));
        observed::freed(self.id, &self.device, self.kind, block.len());
        let stream = self.device.stream();
        // The caller's work on the stream may still use the memory: the block is reused or
        // freed after it (a failed marker leaves nothing to wait for).
        let ready = stream.marker().unwrap_or_else(|_| Ticket::done());
        // A resource's code that panics is recorded on the device: a drop never unwinds.
        self.device.contain_panics("drop", || resource.deallocate(&self.device, block, &stream, ready));
    }
}

impl<T: Element> fmt::Debug for DeviceAllocation<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceAllocation")
            .field("element", &T::DTYPE)
            .field("len", &self.len)
            .field("kind", &self.kind)
            .field("device", &self.device)
            .finish()
    }
}
