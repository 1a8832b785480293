//! The untyped buffer engine: memory for each location, and the execution of coherence plans.
//!
//! [`RawBuffer`] owns the host block and one device allocation per device the buffer has been
//! used on. For each access it asks [`Coherence`] for a plan, runs the plan's allocations and
//! copies, and commits the new state only when all of them succeeded; on any failure it frees
//! what it allocated in this call and returns the error, so state and valid bytes are as they
//! were. Memory comes from, and goes back to, the buffer's [`MemoryResource`]; blocks may be
//! larger than the buffer, which uses their first `nbytes`. Element types are the typed
//! wrapper's business ([`super::UnifiedBuffer`]) and the Python binding's: here everything is
//! bytes.

use std::sync::Arc;

use crate::backend::DeviceMemory;
use crate::coherence::{Access, BufferState, Coherence, DeviceId, Location, Plan, Residency, Step};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::host_memory::{HostMemory, fill_pattern};
use crate::resource::{DirectResource, MemoryResource};

/// Bytes moved by a buffer since it was made (or since the counters were reset).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TransferStats {
    /// Copies from the host to a device, and their bytes.
    pub host_to_device: Traffic,
    /// Copies from a device to the host, and their bytes.
    pub device_to_host: Traffic,
    /// Direct copies between devices, and their bytes.
    pub device_to_device: Traffic,
    /// Syncs between the host and a device that aliases host memory: no bytes moved.
    pub zero_copy_syncs: u64,
    /// Blocks taken from the memory resource (host blocks and device allocations; a pool may
    /// serve them from its cache).
    pub allocations: u64,
}

enum Direction {
    HostToDevice,
    DeviceToHost,
}

impl TransferStats {
    fn record(&mut self, direction: Direction, zero_copy: bool, bytes: usize) {
        if zero_copy {
            self.zero_copy_syncs += 1;
            return;
        }
        match direction {
            Direction::HostToDevice => self.host_to_device.add(bytes),
            Direction::DeviceToHost => self.device_to_host.add(bytes),
        }
    }

    /// All bytes that crossed between memories.
    pub fn bytes_moved(&self) -> u64 {
        self.host_to_device.bytes + self.device_to_host.bytes + self.device_to_device.bytes
    }
}

/// A count of copies and the bytes they moved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Number of copies.
    pub copies: u64,
    /// Bytes copied.
    pub bytes: u64,
}

impl Traffic {
    fn add(&mut self, bytes: usize) {
        self.copies += 1;
        self.bytes += bytes as u64;
    }
}

struct DeviceCopy {
    device: Device,
    memory: DeviceMemory,
}

/// An untyped buffer of `nbytes` bytes, coherent across the host and any number of devices.
pub struct RawBuffer {
    nbytes: usize,
    home: Device,
    pinned: bool,
    /// The host block. It may exist while the host location is unallocated in the coherence
    /// state: a device that aliases host memory (the host device) lives in it.
    host: Option<HostMemory>,
    copies: Vec<DeviceCopy>,
    coherence: Coherence,
    stats: TransferStats,
    resource: Arc<dyn MemoryResource>,
}

impl RawBuffer {
    /// A buffer of `nbytes` whose own device is `home`, with memory straight from the
    /// backends. Allocates nothing.
    pub fn new(nbytes: usize, home: Device, pinned: bool) -> RawBuffer {
        Self::with_resource(nbytes, home, pinned, DirectResource::shared())
    }

    /// A buffer of `nbytes` whose memory comes from `resource`. Allocates nothing.
    pub fn with_resource(
        nbytes: usize,
        home: Device,
        pinned: bool,
        resource: Arc<dyn MemoryResource>,
    ) -> RawBuffer {
        RawBuffer {
            nbytes,
            home,
            pinned,
            host: None,
            copies: Vec::new(),
            coherence: Coherence::new(),
            stats: TransferStats::default(),
            resource,
        }
    }

    /// Where the buffer's memory comes from.
    pub fn resource(&self) -> &Arc<dyn MemoryResource> {
        &self.resource
    }

    /// The size in bytes.
    pub fn nbytes(&self) -> usize {
        self.nbytes
    }

    /// The buffer's own device.
    pub fn home(&self) -> &Device {
        &self.home
    }

    /// Whether the host copy is (to be) page-locked.
    pub fn pinned(&self) -> bool {
        self.pinned
    }

    /// Whether the host block exists and is page-locked.
    pub fn is_pinned(&self) -> bool {
        self.host.as_ref().is_some_and(HostMemory::is_pinned)
    }

    /// The state of the host against the buffer's own device.
    pub fn state(&self) -> BufferState {
        self.coherence.state(Location::Device(self.home.id()))
    }

    /// The state of the host against `device`.
    pub fn state_on(&self, device: &Device) -> BufferState {
        self.coherence.state(Location::Device(device.id()))
    }

    /// The residency of one location.
    pub fn residency(&self, at: Location) -> Residency {
        self.coherence.residency(at)
    }

    /// The bytes moved so far.
    pub fn transfer_stats(&self) -> TransferStats {
        self.stats
    }

    /// Sets the transfer counters to zero.
    pub fn reset_transfer_stats(&mut self) {
        self.stats = TransferStats::default();
    }

    /// Makes the host the current copy for `access`, and returns its bytes.
    pub fn host_access(&mut self, access: Access) -> Result<&mut [u8]> {
        self.access(Location::Host, None, access)?;
        let n = self.nbytes;
        Ok(&mut self.host.as_mut().expect("the host is allocated after a host access").as_mut_slice()[..n])
    }

    /// The host bytes if the host copy is valid, without any sync.
    pub fn host_if_valid(&self) -> Option<&[u8]> {
        (self.coherence.residency(Location::Host) == Residency::Valid)
            .then(|| self.host.as_ref().map(|h| &h.as_slice()[..self.nbytes]))
            .flatten()
    }

    /// Makes `device`'s copy current for `access`, and returns its memory.
    pub fn device_access(&mut self, device: &Device, access: Access) -> Result<&DeviceMemory> {
        self.access(Location::Device(device.id()), Some(device), access)?;
        let index = self.copy_index(device.id()).expect("the device is allocated after a device access");
        Ok(&self.copies[index].memory)
    }

    /// As [`Self::device_access`], lending the memory mutably (for write views).
    pub fn device_access_mut(&mut self, device: &Device, access: Access) -> Result<&mut DeviceMemory> {
        self.access(Location::Device(device.id()), Some(device), access)?;
        let index = self.copy_index(device.id()).expect("the device is allocated after a device access");
        Ok(&mut self.copies[index].memory)
    }

    /// Fills every element with `pattern` (one element's bytes) at one current location,
    /// with no transfer: the buffer's own device if it is current, else the host if it is,
    /// else another current device; an uninitialized buffer is filled on the host. The fill
    /// is a write there, so every other copy becomes stale. A fill that fails before it
    /// starts changes nothing; one the runtime abandons half-way leaves that copy's bytes
    /// unknown, so it is marked stale when another copy is current (and, when it was the only
    /// current copy, its bytes are the runtime's partial result: the error says so).
    pub fn fill(&mut self, pattern: &[u8]) -> Result<()> {
        let home = Location::Device(self.home.id());
        let valid = |loc: &Location| self.coherence.residency(*loc) == Residency::Valid;
        let device_target = if valid(&home) {
            Some(home)
        } else if valid(&Location::Host) {
            None
        } else {
            self.coherence.locations().map(|(loc, _)| loc).find(|loc| valid(loc) && *loc != Location::Host)
        };
        match device_target {
            Some(Location::Device(id)) => {
                let i = self.copy_index(id).expect("a valid device copy is allocated");
                let copy = &mut self.copies[i];
                if let Err(err) = copy.device.backend().fill(&mut copy.memory, pattern, self.nbytes) {
                    // A runtime may fail half-way through a fill, leaving this copy's bytes
                    // unknown: if another copy is current, this one is stale from now on.
                    let at = Location::Device(id);
                    let others_valid =
                        self.coherence.locations().any(|(loc, r)| loc != at && r == Residency::Valid);
                    if others_valid {
                        self.coherence.mark_stale(at);
                    }
                    return Err(err);
                }
                self.coherence.commit(Location::Device(id), Access::Overwrite, &Plan::default());
            }
            _ => fill_pattern(self.host_access(Access::Overwrite)?, pattern),
        }
        Ok(())
    }

    /// Frees every copy: the buffer is uninitialized again and holds no memory.
    pub fn release_memory(&mut self) {
        for copy in self.copies.drain(..) {
            give_back(&*self.resource, copy);
        }
        if let Some(block) = self.host.take() {
            self.resource.deallocate_host(&self.home, block);
        }
        self.coherence.clear();
    }

    /// Forgets the contents (state UNINITIALIZED) but keeps every allocation for reuse.
    pub fn invalidate(&mut self) {
        self.coherence.invalidate();
    }

    fn copy_index(&self, id: DeviceId) -> Option<usize> {
        self.copies.iter().position(|c| c.device.id() == id)
    }

    fn access(&mut self, at: Location, device: Option<&Device>, access: Access) -> Result<()> {
        let copies = &self.copies;
        let plan = self.coherence.plan(at, access, |from, to| {
            let source = copies.iter().find(|c| c.device.id() == from);
            let target = device.filter(|d| d.id() == to);
            matches!((source, target), (Some(s), Some(t)) if t.can_copy_from(&s.device))
        });
        if plan.is_empty() {
            self.coherence.commit(at, access, &plan);
            return Ok(());
        }
        let mut undo = Undo::default();
        let mut stats = self.stats;
        match self.execute(&plan, device, &mut undo, &mut stats) {
            Ok(()) => {
                self.stats = stats;
                self.coherence.commit(at, access, &plan);
                Ok(())
            }
            Err(err) => {
                self.rollback(undo);
                Err(err)
            }
        }
    }

    fn execute(
        &mut self,
        plan: &Plan,
        device: Option<&Device>,
        undo: &mut Undo,
        stats: &mut TransferStats,
    ) -> Result<()> {
        for step in plan.steps() {
            match *step {
                Step::Allocate(Location::Host) => {
                    if self.host.is_none() {
                        let block = self.resource.allocate_host(&self.home, self.nbytes, self.pinned)?;
                        self.host = Some(block);
                        undo.host_block = true;
                        stats.allocations += 1;
                    }
                }
                Step::Allocate(Location::Device(id)) => {
                    let device =
                        device.filter(|d| d.id() == id).expect("plans allocate only the accessed device");
                    self.allocate_on(device, undo, stats)?;
                }
                Step::Copy { from, to } => self.copy(from, to, stats)?,
            }
        }
        Ok(())
    }

    fn allocate_on(&mut self, device: &Device, undo: &mut Undo, stats: &mut TransferStats) -> Result<()> {
        let backend = device.backend();
        let memory = if backend.zero_copy(self.nbytes) {
            // The device's copy is the host block itself: make sure the block exists (its
            // residency stays as it is), then alias it.
            if self.host.is_none() {
                self.host = Some(self.resource.allocate_host(&self.home, self.nbytes, self.pinned)?);
                undo.host_block = true;
                stats.allocations += 1;
            }
            let host = self.host.as_mut().expect("the host block was just ensured");
            backend.alias_host(host).unwrap_or_else(|| {
                Err(Error::invalid(
                    "alias_host",
                    format!(
                        "{device} reports zero-copy for {} bytes but did not alias the host block",
                        self.nbytes
                    ),
                ))
            })?
        } else {
            stats.allocations += 1;
            self.resource.allocate_device(device, self.nbytes)?
        };
        self.copies.push(DeviceCopy { device: device.clone(), memory });
        undo.device = Some(device.id());
        Ok(())
    }

    fn copy(&mut self, from: Location, to: Location, stats: &mut TransferStats) -> Result<()> {
        let n = self.nbytes;
        match (from, to) {
            (Location::Host, Location::Device(id)) => {
                let i = self.copy_index(id).expect("a copy target is allocated");
                let host = self.host.as_ref().expect("a valid host is allocated");
                let copy = &mut self.copies[i];
                copy.device.backend().upload(&host.as_slice()[..n], &mut copy.memory)?;
                stats.record(Direction::HostToDevice, copy.memory.is_host_alias(), n);
            }
            (Location::Device(id), Location::Host) => {
                let i = self.copy_index(id).expect("a copy source is allocated");
                let host = self.host.as_mut().expect("a copy target is allocated");
                let copy = &self.copies[i];
                copy.device.backend().download(&copy.memory, &mut host.as_mut_slice()[..n])?;
                stats.record(Direction::DeviceToHost, copy.memory.is_host_alias(), n);
            }
            (Location::Device(a), Location::Device(b)) => {
                let (i, j) = (self.copy_index(a).expect("source"), self.copy_index(b).expect("target"));
                let (src, dst) = pair_mut(&mut self.copies, i, j);
                let direct =
                    dst.device.backend().copy_from_peer(&src.device, &src.memory, &mut dst.memory, n);
                direct.unwrap_or_else(|| {
                    Err(Error::invalid(
                        "copy",
                        format!("{} cannot copy directly from {}", dst.device, src.device),
                    ))
                })?;
                stats.device_to_device.add(n);
            }
            (Location::Host, Location::Host) => {}
        }
        Ok(())
    }

    fn rollback(&mut self, undo: Undo) {
        if let Some(id) = undo.device
            && let Some(i) = self.copy_index(id)
        {
            give_back(&*self.resource, self.copies.remove(i));
        }
        if undo.host_block
            && let Some(block) = self.host.take()
        {
            self.resource.deallocate_host(&self.home, block);
        }
    }
}

impl Drop for RawBuffer {
    fn drop(&mut self) {
        self.release_memory();
    }
}

/// Returns a device copy's memory to the resource (aliases own no memory: just dropped).
fn give_back(resource: &dyn MemoryResource, copy: DeviceCopy) {
    if copy.memory.is_host_alias() {
        drop(copy.memory);
    } else {
        resource.deallocate_device(&copy.device, copy.memory);
    }
}

fn pair_mut<T>(items: &mut [T], i: usize, j: usize) -> (&T, &mut T) {
    assert_ne!(i, j, "a copy between one location and itself");
    if i < j {
        let (a, b) = items.split_at_mut(j);
        (&a[i], &mut b[0])
    } else {
        let (a, b) = items.split_at_mut(i);
        (&b[0], &mut a[j])
    }
}

/// What one access allocated, to free again if a later step fails.
#[derive(Default)]
struct Undo {
    host_block: bool,
    device: Option<DeviceId>,
}

impl std::fmt::Debug for RawBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawBuffer")
            .field("nbytes", &self.nbytes)
            .field("home", &self.home)
            .field("state", &self.state())
            .finish()
    }
}
