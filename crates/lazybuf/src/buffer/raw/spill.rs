//! Eviction of one device copy, for spilling under a memory budget ([`crate::spill`]).
//!
//! A copy that is stale, or equal to a current copy elsewhere, is freed moving no byte; a
//! copy that holds the only current data is first downloaded to the host (the same blocking
//! host read any access makes, through the backend's pinned staging where it has one), and
//! freed only once that succeeded. States follow the contract: SYNCHRONIZED and HOST_DIRTY
//! become HOST_ONLY at once, DEVICE_ONLY and DEVICE_DIRTY become HOST_ONLY after the
//! write-back; the next device access allocates and uploads again.
//!
//! The host tier: a stale host copy (a device copy is newer) is freed writing nothing
//! ([`RawBuffer::free_stale_host`]; DEVICE_DIRTY becomes DEVICE_ONLY). The disk tier: a host
//! copy that is the only current data (no device copy at all) can be written to a spill file
//! and its block freed ([`RawBuffer::spill_host_to_disk`]); the state stays HOST_ONLY, and
//! every access first reads the file back into a new host block
//! ([`RawBuffer::reload_from_disk`]), failing with nothing changed when it cannot.

use super::RawBuffer;
use super::execute::{give_back, give_back_host};
use crate::backend::Ticket;
use crate::coherence::DeviceId;
use crate::coherence::{Access, Location, Residency};
use crate::device::Device;
use crate::error::Result;
use crate::spill::disk::SpillFile;
use crate::spill::{Evicted, EvictionPolicy};

impl RawBuffer {
    /// Frees this buffer's copy on `device`, writing it back to the host first when it holds
    /// the only current data. `Ok(None)` when there is nothing to free: no copy there, a copy
    /// that aliases the host block (it holds no device memory), or a transfer in flight (the
    /// buffer is in use; the upload of a stream-ordered access is waited for instead). A failed write-back returns [`crate::Error::WriteBack`] (naming this
    /// buffer, with the write-back's own error inside) and changes nothing: the copy, the
    /// state and every valid byte stay as they were. The write-back runs on the device's side
    /// stream where it has one (see `write_back`).
    pub fn evict_device_copy(&mut self, device: &Device) -> Result<Option<Evicted>> {
        let Some(index) = self.copy_index(device.id()) else {
            return Ok(None);
        };
        // The uploads of stream-ordered accesses (`.device`) are lazybuf's own, not a transfer
        // the caller holds: waited for, so that a buffer handed out that way is evictable
        // once nothing uses it. One that failed stays in flight, for the caller's next wait
        // to report (the buffer is then skipped, as for any transfer in flight).
        for op in self.inflight.iter().filter(|op| op.upload_to.is_some()) {
            let _ = op.ticket.wait();
        }
        self.settle_succeeded();
        if self.copies[index].memory.is_host_alias() || !self.inflight.is_empty() {
            return Ok(None);
        }
        let at = Location::Device(device.id());
        let only_current = self.coherence.residency(at) == Residency::Valid
            && !self.coherence.locations().any(|(loc, r)| loc != at && r == Residency::Valid);
        let mut written_back = 0;
        if only_current {
            // A blocking host read: on failure it frees what it allocated and commits nothing.
            self.write_back(device).map_err(|err| self.write_back_failed(device, err))?;
            written_back = self.nbytes;
        } else if self.coherence.residency(at) == Residency::Valid
            && self.coherence.residency(Location::Host) == Residency::Valid
            && crate::spill::eviction_policy() == EvictionPolicy::WriteBackAlways
        {
            // The benchmarks' blind spiller: the same download, although the host is current.
            let evict = super::observed::EVICT;
            if crate::observe::guarding() {
                // A refused write-back changes nothing and records nothing: checked before the
                // host copy is marked stale (it recorded that transition and its undoing
                // before the twentieth pass).
                let cause = crate::observe::cause_or(evict);
                if let Some(copy) = self.transfer_info(at, Location::Host, Some(device), cause, false) {
                    crate::observe::guard::check_refusal(&copy)
                        .map_err(|err| self.write_back_failed(device, err))?;
                }
            }
            self.observe_state_as(evict, |buffer| buffer.coherence.mark_stale(Location::Host));
            if let Err(err) = self.write_back(device) {
                self.observe_state_as(evict, |buffer| {
                    buffer.coherence.restore(Location::Host, Residency::Valid)
                });
                return Err(self.write_back_failed(device, err));
            }
            written_back = self.nbytes;
        }
        let index = self.copy_index(device.id()).expect("a write-back keeps the device copy");
        // Recorded (its state changes: SYNCHRONIZED becomes HOST_ONLY), so a buffer's state
        // events chain across evictions too.
        let copy = self.observe_state_as(super::observed::EVICT, |buffer| {
            buffer.coherence.forget(at);
            buffer.copies.remove(index)
        });
        let freed = copy.memory.len();
        give_back(&*self.resource, copy, self.id);
        if !self.evicted_from.contains(&device.id()) {
            self.evicted_from.push(device.id());
        }
        Ok(Some(Evicted { freed, written_back }))
    }

    /// An eviction's write-back of `device`'s copy: the blocking host read any access makes,
    /// with its download on the device's side stream ([`Device::side_stream`]) where the
    /// backend has more than one. The side stream first waits for everything the caller did
    /// with the copy (a marker of the copy's own stream if the copy was handed out since its
    /// last transfer, and every ticket given with `used_until`), so work enqueued on the own
    /// stream after that point is not queued behind the download, and the download does not
    /// wait for work on the own stream that never touched the copy. The read waits for the
    /// download's ticket; the copy's own stream is back in place whatever happened.
    fn write_back(&mut self, device: &Device) -> Result<()> {
        let cause = &super::observed::EVICT;
        let index = self.copy_index(device.id());
        let side = index.and_then(|i| device.side_stream().filter(|side| *side != self.copies[i].stream));
        let (Some(index), Some(side)) = (index, side) else {
            return self.access(Location::Host, None, Access::Read, cause, false);
        };
        // The caller's use so far, as tickets the side stream can wait for: kept in the copy
        // (its `order_stream` makes the side stream wait for them); nothing changes when this
        // fails, the copy is still marked used.
        let _kept_in_the_copy = self.copies[index].last_use()?;
        let own = std::mem::replace(&mut self.copies[index].stream, side);
        let result = self.access(Location::Host, None, Access::Read, cause, false);
        // A host read never frees the device copy it reads from.
        if let Some(index) = self.copy_index(device.id()) {
            self.copies[index].stream = own;
        }
        result
    }

    /// A failed write-back's error, naming this buffer (the allocation that needed the room
    /// adds its bytes: `spill::eviction`).
    #[cold]
    fn write_back_failed(&self, device: &Device, err: crate::Error) -> crate::Error {
        crate::Error::WriteBack {
            device: device.to_string(),
            requested: None,
            buffer: self.id,
            bytes: self.nbytes,
            source: std::sync::Arc::new(err),
        }
    }

    /// Counts an upload of `bytes` to device `id` as a reload when that device's copy was
    /// evicted before ([`crate::spill::SpillStats::bytes_read_back`]); returns whether it did.
    #[inline(always)]
    pub(super) fn count_reload(&mut self, id: DeviceId, bytes: usize) -> bool {
        !self.evicted_from.is_empty() && self.count_reload_of_evicted(id, bytes)
    }

    #[cold]
    #[inline(never)]
    fn count_reload_of_evicted(&mut self, id: DeviceId, bytes: usize) -> bool {
        let Some(i) = self.evicted_from.iter().position(|&d| d == id) else {
            return false;
        };
        self.evicted_from.swap_remove(i);
        let device = self.copies.iter().find(|c| c.device.id() == id).map(|c| c.device.clone());
        if let Some(device) = device {
            crate::spill::stats::update(&device, |s| s.bytes_read_back += bytes as u64);
        }
        true
    }

    /// Takes back a reload [`Self::count_reload`] counted, whose upload failed: the copy on
    /// `id` counts as evicted again, so the upload that succeeds is the one counted.
    #[cold]
    #[inline(never)]
    pub(super) fn uncount_reload(&mut self, id: DeviceId, bytes: usize) {
        let device = self.copies.iter().find(|c| c.device.id() == id).map(|c| c.device.clone());
        if let Some(device) = device {
            crate::spill::stats::update(&device, |s| {
                s.bytes_read_back = s.bytes_read_back.saturating_sub(bytes as u64)
            });
        }
        if !self.evicted_from.contains(&id) {
            self.evicted_from.push(id);
        }
    }

    /// Writes the host copy to a spill file and frees its block, when the host copy is the
    /// buffer's only data: valid, with no device copy (of any kind) and no transfer in flight,
    /// not pinned (pinned memory is never written to disk behind the user's back) and not
    /// adopted from another owner. Returns the bytes written, `Ok(None)` when the buffer does
    /// not qualify (or holds no byte). A failed write changes nothing.
    pub fn spill_host_to_disk(&mut self) -> Result<Option<usize>> {
        self.settle_succeeded();
        let qualifies = self.nbytes > 0
            && self.on_disk.is_none()
            && self.copies.is_empty()
            && self.inflight.is_empty()
            && self.coherence.residency(Location::Host) == Residency::Valid
            && self.host.as_ref().is_some_and(|h| !h.is_pinned() && !h.is_adopted());
        if !qualifies {
            return Ok(None);
        }
        let host = self.host.as_ref().expect("a valid host copy has a block");
        let file = SpillFile::write(&host.as_slice()[..self.nbytes])?;
        let block = self.host.take().expect("checked above");
        self.record_allocation(); // its allocation, if unrecorded yet, before its free
        give_back_host(&*self.resource, &self.home, block, Ticket::done(), self.id);
        let direct = if file.is_direct() { self.nbytes as u64 } else { 0 };
        self.on_disk = Some(file);
        crate::spill::stats::update(&self.home, |s| {
            s.bytes_to_disk += self.nbytes as u64;
            s.bytes_to_disk_direct += direct;
        });
        Ok(Some(self.nbytes))
    }

    /// Frees the host block when it holds no current data: the host copy is stale (a device
    /// copy is newer), no transfer is in flight, no device copy is the host block itself, the
    /// buffer was not asked for pinned memory, and the block is lazybuf's own (not adopted; a
    /// block lazybuf registered with a runtime goes back as any other). Nothing is written: the
    /// host memory limit takes a stale block back as eviction takes a stale device copy, moving
    /// no byte. DEVICE_DIRTY becomes DEVICE_ONLY; the next host access allocates and downloads.
    /// Returns the bytes freed, `Ok(None)` when the buffer does not qualify.
    pub fn free_stale_host(&mut self) -> Result<Option<usize>> {
        self.settle_succeeded();
        let qualifies = self.nbytes > 0
            && self.on_disk.is_none()
            && self.inflight.is_empty()
            && self.coherence.residency(Location::Host) == Residency::Stale
            && self.coherence.any_valid()
            && self.copies.iter().all(|copy| !copy.memory.is_host_alias())
            && !self.pinned
            && self.host.as_ref().is_some_and(|h| !h.is_adopted());
        if !qualifies {
            return Ok(None);
        }
        self.record_allocation(); // its allocation, if unrecorded yet, before anything after it
        let block = self.observe_state_as(super::observed::EVICT, |buffer| {
            buffer.coherence.forget(Location::Host);
            buffer.host.take().expect("a stale host copy has a block")
        });
        let freed = block.len();
        give_back_host(&*self.resource, &self.home, block, Ticket::done(), self.id);
        crate::spill::stats::update(&self.home, |s| s.stale_host_frees += 1);
        Ok(Some(freed))
    }

    /// Gives the host block back for the host memory limit, the cheapest way the buffer
    /// allows: freed when stale ([`Self::free_stale_host`]), else written to a spill file when
    /// it is the only current data ([`Self::spill_host_to_disk`]). `Ok(None)`: neither.
    pub fn give_host_back(&mut self) -> Result<Option<usize>> {
        match self.free_stale_host()? {
            Some(freed) => Ok(Some(freed)),
            None => self.spill_host_to_disk(),
        }
    }

    /// Whether the host copy is in a spill file now.
    pub fn is_on_disk(&self) -> bool {
        self.on_disk.is_some()
    }

    /// Reads a host copy spilled to disk back into a new host block (the file is removed);
    /// nothing to do otherwise. On failure the buffer keeps its spill file and its state.
    /// Every access calls it: the common case (nothing on disk) is one inlined test.
    #[inline(always)]
    pub(super) fn reload_from_disk(&mut self) -> Result<()> {
        if self.on_disk.is_none() {
            return Ok(());
        }
        self.reload_spilled_host_copy()
    }

    #[cold]
    #[inline(never)]
    fn reload_spilled_host_copy(&mut self) -> Result<()> {
        // The file removed (dropped): the read-back stands.
        self.read_back_keeping_file().map(drop)
    }

    /// [`Self::reload_from_disk`], the spill file kept and returned (`None`: nothing was on
    /// disk), for a call whose later step may fail: it gives the file back to
    /// [`Self::return_to_disk`] then, and drops it (removing it) when it succeeds.
    #[cold]
    #[inline(never)]
    pub(super) fn read_back_keeping_file(&mut self) -> Result<Option<SpillFile>> {
        let Some(file) = self.on_disk.as_ref() else {
            return Ok(None);
        };
        let block = self.resource.allocate_host(&self.home, self.nbytes, self.pinned)?;
        let mut block = self.checked_host_block(block)?;
        if let Err(err) = file.read_into(&mut block.as_mut_slice()[..self.nbytes]) {
            self.resource.deallocate_host(&self.home, block, Ticket::done());
            return Err(err);
        }
        block.mark_written();
        // A block taken from the resource, as an access's: counted and recorded (the spill
        // recorded the old block's free; a read-back that recorded nothing gave a trace more
        // host frees than allocations: the eighteenth hostile pass).
        self.observe_host_allocation(&block, false);
        self.stats.allocations += 1;
        self.host = Some(block);
        let file = self.on_disk.take();
        crate::spill::stats::update(&self.home, |s| s.bytes_from_disk += self.nbytes as u64);
        Ok(file)
    }

    /// Undoes a read-back ([`Self::read_back_keeping_file`]) whose call failed afterwards: the
    /// block read back is given back and `file` holds the host copy again, the counters (the
    /// buffer's allocations, the disk tier's `bytes_from_disk`) as before the read-back, and
    /// the allocation's rollback recorded (`call`'s, or part of the plan being aborted). A
    /// failed call leaves the buffer as it was (an `allocate()` whose upload failed kept the
    /// block: the twentieth pass). Only while the host copy is still the buffer's only data,
    /// as the read-back left it (the failed step undone); otherwise the read-back stands.
    #[cold]
    #[inline(never)]
    pub(super) fn return_to_disk(&mut self, file: SpillFile, call: &'static str) {
        let as_read_back = self.on_disk.is_none()
            && self.copies.is_empty()
            && self.inflight.is_empty()
            && file.len() == self.nbytes
            && self.coherence.residency(Location::Host) == Residency::Valid
            && !self.coherence.locations().any(|(loc, r)| loc != Location::Host && r == Residency::Valid);
        if !as_read_back {
            return;
        }
        let Some(block) = self.host.take() else {
            return;
        };
        self.record_allocation(); // its allocation, if unrecorded yet, before its free
        give_back_host(&*self.resource, &self.home, block, Ticket::done(), self.id);
        self.on_disk = Some(file);
        self.stats.allocations = self.stats.allocations.wrapping_sub(1);
        self.observe_allocations_undone(1, call);
        let bytes = self.nbytes as u64;
        crate::spill::stats::update(&self.home, |s| {
            s.bytes_from_disk = s.bytes_from_disk.saturating_sub(bytes)
        });
    }
}
