//! The untyped buffer engine: memory for each location, and the execution of coherence plans.
//!
//! [`RawBuffer`] owns the host block and one device allocation per device the buffer has been
//! used on. For each access it asks [`Coherence`] for a plan, runs the plan's allocations and
//! enqueues its copies on the streams of the copies involved, and commits the new state:
//!
//! - **Blocking accesses** (every method except the `*_async` ones) wait for each copy they
//!   enqueue and commit only when all succeeded; on any failure they free what they allocated
//!   in this call and return the error, so state and valid bytes are as they were.
//! - **Asynchronous syncs** ([`RawBuffer::sync_async`]) commit when their copies are enqueued
//!   and return a [`Transfer`]; the state they report is the state the buffer will be in once
//!   the transfer completes. If it fails, the buffer goes back to the state it had before the
//!   transfer, and the error is reported by the transfer's handle and by the first call of
//!   this buffer that has to wait for it ([`crate::buffer::inflight`] says when that is).
//!
//! Every access first waits for the transfers in flight it depends on (and no others), and
//! for the caller's own work on a device copy where it must: a device copy handed out through
//! a view is *used*; later work on another stream, any host access (read or write) of memory
//! such a copy aliases (a zero-copy device), and freeing it are ordered after a marker of the
//! copy's stream (which covers the caller's kernels enqueued there) and after any ticket the
//! caller gave ([`crate::DeviceViewMut::used_until`]). So on a zero-copy device a host read
//! after a kernel that wrote the device copy without `mark_device_dirty()` sees the kernel's
//! whole result, never a torn one.
//!
//! Memory comes from, and goes back to, the buffer's [`MemoryResource`]; blocks may be larger
//! than the buffer, which uses their first `nbytes`. A *read* of a buffer nothing holds the
//! data of (UNINITIALIZED) sees zeros: reused memory never shows a previous user's bytes to a
//! read. Element types are the typed wrapper's business ([`super::UnifiedBuffer`]) and the
//! Python binding's: here everything is bytes.
//!
//! The engine is split by job: this file holds the API, the state and the accesses (plan,
//! settle, commit); [`copy`] a device copy and its use by the caller; [`execute`] a plan's
//! allocations, copies and rollback; [`checker`] the coherence checker's comparison;
//! [`observed`] what the transfer guard and the recorder ([`crate::observe`]) see of it;
//! [`read`] reads into memory outside the buffer (one copy, straight from a device copy when
//! the host copy is stale).

mod checker;
mod copy;
mod execute;
mod observed;
mod read;
mod spill;

use std::sync::Arc;

pub(super) use copy::DeviceCopy;
use execute::{give_back, give_back_host, give_back_host_unrecorded, last_use_or_synchronized};

use super::Transfer;
use super::inflight::{InFlight, Locations, Undo, touched};
use super::stats::TransferStats;
use crate::backend::{DeviceMemory, Ticket};
use crate::coherence::{Access, BufferState, Coherence, DeviceId, Location, Plan, Residency, Step};
use crate::device::{Device, Stream, panic_as_error};
use crate::error::{Error, Result};
use crate::host_memory::{HostMemory, fill_pattern};
use crate::observe::{self, Cause};
use crate::resource::MemoryResource;

/// An untyped buffer of `nbytes` bytes, coherent across the host and any number of devices.
pub struct RawBuffer {
    /// The buffer's name in guard errors and recorded events.
    id: u64,
    nbytes: usize,
    home: Device,
    /// The stream of the copy on `home`.
    stream: Stream,
    pinned: bool,
    /// The host block. It may exist while the host location is unallocated in the coherence
    /// state: a device that aliases host memory (the host device) lives in it.
    host: Option<HostMemory>,
    copies: Vec<DeviceCopy>,
    coherence: Coherence,
    stats: TransferStats,
    resource: Arc<dyn MemoryResource>,
    inflight: Vec<InFlight>,
    /// The last read into outside memory took the bytes straight from a device copy, and
    /// nothing was written since ([`Self::read_into`]).
    direct_read: bool,
    /// A host access had to download after such a read: reads into outside memory update the
    /// host copy first from now on (until the buffer's memory is released or invalidated).
    host_sync_pays: bool,
    /// Devices whose copy was evicted ([`spill`]) and not uploaded again yet.
    evicted_from: Vec<crate::coherence::DeviceId>,
    /// The host copy, written to disk under the host memory limit ([`spill`]): the host
    /// location is valid while `host` is `None`; every access reads it back first.
    on_disk: Option<crate::spill::disk::SpillFile>,
    /// The plan being executed while something observes ([`observed`]).
    planned: Option<observed::Planned>,
    /// The state events recorded for this buffer ([`observed`]).
    state_events: observed::StateEvents,
    /// Writes through the host copy made outside the buffer's lock that are open
    /// ([`Self::begin_outside_host_write`]): the coherence checker does not compare meanwhile.
    outside_host_writes: u32,
    /// The call running on this buffer ([`Self::as_call`]): names its copies and transitions
    /// where no [`observe::call`] on the thread names them.
    call: Option<Cause>,
}

/// A buffer running as a call ([`RawBuffer::as_call`]): derefs to the buffer; the call it
/// ran as before is put back when this is dropped (also when a panic unwinds it).
pub struct AsCall<'a> {
    buffer: &'a mut RawBuffer,
    previous: Option<Cause>,
}

impl std::ops::Deref for AsCall<'_> {
    type Target = RawBuffer;
    fn deref(&self) -> &RawBuffer {
        self.buffer
    }
}

impl std::ops::DerefMut for AsCall<'_> {
    fn deref_mut(&mut self) -> &mut RawBuffer {
        self.buffer
    }
}

impl Drop for AsCall<'_> {
    fn drop(&mut self) {
        self.buffer.call = self.previous;
    }
}

impl RawBuffer {
    /// A buffer of `nbytes` whose own device is `home`, with memory from the default resource
    /// of `home` (its pool while caching by default is on). Allocates nothing.
    pub fn new(nbytes: usize, home: Device, pinned: bool) -> RawBuffer {
        let resource = crate::resource::default_resource(&home);
        Self::with_resource(nbytes, home, pinned, resource)
    }

    /// A buffer of `nbytes` whose memory comes from `resource`. Allocates nothing.
    pub fn with_resource(
        nbytes: usize,
        home: Device,
        pinned: bool,
        resource: Arc<dyn MemoryResource>,
    ) -> RawBuffer {
        let stream = home.stream();
        RawBuffer {
            id: observe::next_buffer_id(),
            nbytes,
            home,
            stream,
            pinned,
            host: None,
            copies: Vec::new(),
            coherence: Coherence::new(),
            stats: TransferStats::default(),
            resource,
            inflight: Vec::new(),
            direct_read: false,
            host_sync_pays: false,
            evicted_from: Vec::new(),
            on_disk: None,
            planned: None,
            state_events: observed::StateEvents::default(),
            outside_host_writes: 0,
            call: None,
        }
    }

    /// Runs the copy on the buffer's own device on `stream` (a stream of that device) instead
    /// of the device's default stream. Allowed only while that copy does not exist yet.
    pub fn set_stream(&mut self, stream: Stream) -> Result<()> {
        if *stream.device() != self.home {
            return Err(Error::invalid(
                "set_stream",
                format!(
                    "expected a stream of the buffer's device {}, got one of {}",
                    self.home,
                    stream.device()
                ),
            ));
        }
        if self.copy_index(self.home.id()).is_some() {
            return Err(Error::invalid(
                "set_stream",
                "the buffer already has memory on its device; choose the stream before its first device use",
            ));
        }
        self.stream = stream;
        Ok(())
    }

    /// The stream the copy on the buffer's own device uses.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// Where the buffer's memory comes from.
    pub fn resource(&self) -> &Arc<dyn MemoryResource> {
        &self.resource
    }

    /// The buffer's id: unique in the process, the name transfer-guard errors and recorded
    /// events give it.
    pub fn id(&self) -> u64 {
        self.id
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
    #[inline]
    pub fn state(&self) -> BufferState {
        self.state_on(&self.home)
    }

    /// The state of the host against `device`. Transfers in flight count as done unless they
    /// are known to have failed (see the module docs).
    #[inline]
    pub fn state_on(&self, device: &Device) -> BufferState {
        let at = Location::Device(device.id());
        if self.inflight.is_empty() {
            return self.coherence.state(at);
        }
        self.settled_view().0.state(at)
    }

    /// The residency of one location (as [`RawBuffer::state_on`] counts transfers in flight).
    pub fn residency(&self, at: Location) -> Residency {
        if self.inflight.is_empty() {
            return self.coherence.residency(at);
        }
        self.settled_view().0.residency(at)
    }

    /// The residency of one location as the accesses so far committed it: every transfer in
    /// flight counted as succeeding, so no runtime call asks whether one failed (for a caller
    /// that acts only on what a later failure cannot make worse).
    pub fn residency_as_committed(&self, at: Location) -> Residency {
        self.coherence.residency(at)
    }

    /// The bytes moved so far (transfers in flight count unless known to have failed).
    pub fn transfer_stats(&self) -> TransferStats {
        if self.inflight.is_empty() {
            return self.stats;
        }
        self.settled_view().1
    }

    /// The state and counters as they will be once the transfers known to have failed are
    /// undone.
    fn settled_view(&self) -> (Coherence, TransferStats) {
        let (mut coherence, mut stats) = (self.coherence.clone(), self.stats);
        for op in self.inflight.iter().filter(|op| op.has_failed()) {
            op.undo_state(&mut coherence);
            stats = stats.minus(op.stats);
        }
        (coherence, stats)
    }

    /// Sets the transfer counters to zero.
    pub fn reset_transfer_stats(&mut self) {
        self.stats = TransferStats::default();
        for op in &mut self.inflight {
            op.stats = TransferStats::default();
        }
    }

    /// The failure of a transfer in flight that a host access for `access` would settle (and
    /// return), when one failed (waited for, as the access would wait) and this method has not
    /// returned it before; returned without settling it. For a caller whose error may be
    /// dropped unseen (the buffer protocol, whose failures NumPy ignores before it tries
    /// another interface, which then settles it): the next such call goes on to the access,
    /// which settles it, so no failure is returned forever, and a failure the host access does
    /// not depend on (an upload that failed, the host copy still current) is not returned.
    pub fn unreported_failure_for_host(&mut self, access: Access) -> Option<Error> {
        if self.inflight.is_empty() {
            return None;
        }
        let plan = self.plan(Location::Host, None, access);
        let (reads, writes) = self.touched(&plan, Location::Host, None, access);
        let (op, err) =
            self.inflight.iter_mut().filter(|op| !op.reported && op.conflicts(&reads, &writes)).find_map(
                |op| match op.ticket.wait() {
                    Err(Error::ForkedChild { .. }) | Ok(()) => None,
                    Err(err) => Some((op, err)),
                },
            )?;
        op.reported = true;
        Some(err)
    }

    /// Opens a write through the host copy that the caller makes outside this buffer's lock,
    /// after a host write access, and closes with [`Self::end_outside_host_write`] (calls nest):
    /// the Python binding's `buf[key] = value`, where NumPy writes the host copy after
    /// converting the value, which may run the user's code, while other threads may sync. A
    /// sync meanwhile can copy the host copy before the write lands, so the copies may differ
    /// until the caller's end makes the host copy the only current one again (an
    /// [`Access::Overwrite`]): until then the coherence checker does not compare them (it
    /// blamed a kernel for the difference: the fifteenth hostile pass).
    pub fn begin_outside_host_write(&mut self) {
        self.outside_host_writes = self.outside_host_writes.saturating_add(1);
    }

    /// Closes a write opened by [`Self::begin_outside_host_write`].
    pub fn end_outside_host_write(&mut self) {
        self.outside_host_writes = self.outside_host_writes.saturating_sub(1);
    }

    /// Whether transfers of this buffer are in flight (not yet settled).
    pub fn is_busy(&self) -> bool {
        !self.inflight.is_empty()
    }

    /// Settles the transfers that have finished, without waiting for the others: undoes the
    /// ones that failed and returns the first failure.
    pub fn poll(&mut self) -> Result<()> {
        self.settle(|op| !matches!(op.ticket.poll(), Ok(false)))
    }

    /// Settles the transfers in flight that have finished and succeeded, without waiting; a
    /// failed one stays in flight, for a call of the caller's to report (spilling settles so:
    /// a transfer the caller waited for through its ticket no longer keeps the buffer busy).
    pub(crate) fn settle_succeeded(&mut self) {
        if !self.inflight.is_empty() {
            // Only transfers whose tickets completed without error: settling them waits for
            // nothing and cannot fail.
            let _ = self.settle(|op| matches!(op.ticket.poll(), Ok(true)));
        }
    }

    /// Waits for every transfer in flight; undoes the ones that failed and returns the first
    /// failure.
    pub fn finish(&mut self) -> Result<()> {
        self.settle(|_| true)
    }

    /// Makes the host the current copy for `access`, and returns its bytes.
    pub fn host_access(&mut self, access: Access) -> Result<&mut [u8]> {
        self.host_access_as(access, &observed::HOST)
    }

    /// As [`Self::host_access`], its copies caused by `cause` (for the transfer guard).
    #[inline(always)]
    fn host_access_as(&mut self, access: Access, cause: &'static Cause) -> Result<&mut [u8]> {
        self.reload_from_disk()?;
        if access != Access::Overwrite && crate::checking::checking() {
            // A read, or a write that keeps the bytes it does not change (`.host`): only an
            // access that copies nothing can find the host behind a device (a copy from a
            // device makes them equal), and the check changes nothing when it fails. An
            // overwrite reads no old byte, so there is nothing to find.
            self.settle_for(Location::Host, None, access)?;
            if self.coherence.residency(Location::Host) == Residency::Valid {
                self.check_coherence()?;
            }
        }
        self.access(Location::Host, None, access, cause, false)?;
        let n = self.nbytes;
        let host = self.host.as_mut().expect("the host is allocated after a host access");
        // A read leaves the block knowing whether it is all zeros.
        Ok(if access == Access::Read { &mut host.bytes_mut()[..n] } else { &mut host.as_mut_slice()[..n] })
    }

    /// Whether an access for `access` on `device` (the host when `None`: [`Self::host_access`],
    /// else [`Self::device_access`]) would be bookkeeping only: that copy is current, no
    /// transfer is in flight, and, for the host, no device copy that aliases the host block is
    /// in use (a host access waits for that use) and, for a read or write, the coherence checker
    /// is off (its check of such a host access copies). Such an access allocates nothing, moves no bytes and waits for
    /// nothing, so a caller that must not block (a binding holding its interpreter's lock) can
    /// make it in place.
    pub fn access_is_immediate(&self, device: Option<&Device>, access: Access) -> bool {
        let at = device.map_or(Location::Host, |d| Location::Device(d.id()));
        if !self.inflight.is_empty()
            || self.coherence.residency(at) != Residency::Valid
            || self.on_disk.is_some()
        {
            return false;
        }
        match (at, access) {
            (Location::Device(_), _) => true,
            (Location::Host, access) => {
                !self.copies.iter().any(DeviceCopy::aliased_in_use)
                    && (access == Access::Overwrite || !crate::checking::checking())
            }
        }
    }

    /// Whether [`Self::mark_written`] on `device` would be bookkeeping only: that copy is
    /// current, nothing is on disk, and every transfer in flight is an upload to that copy in
    /// its stream's order, which the mark leaves in flight ([`Self::device_access_ordered`]).
    /// Such a mark waits for nothing, so a caller that must not block can make it in place.
    pub fn mark_is_immediate(&self, device: &Device) -> bool {
        self.on_disk.is_none()
            && self.coherence.residency(Location::Device(device.id())) == Residency::Valid
            && self.inflight.iter().all(|op| op.is_ordered_upload_to(device.id()))
    }

    /// The host bytes for an overwrite of all of them ([`Access::Overwrite`], as
    /// [`Self::host_access`] makes it) when that access waits for nothing: nothing is on
    /// disk, no transfer is in flight, no device copy that aliases the host block is in use,
    /// and the host block exists or the resource has one ready
    /// ([`crate::MemoryResource::allocate_host_now`]).
    /// `None`, with nothing changed, otherwise: a caller that must not block (a binding holding
    /// its interpreter's lock) then makes the access the usual way. While something observes,
    /// the guard and the recorder see it as they see [`Self::host_access`]: the same events
    /// (a pool hit, the allocation, the state transition) and no copy to refuse (an overwrite
    /// copies nothing); their locks are held for bookkeeping only, never while waiting.
    pub fn host_overwrite_now(&mut self) -> Option<Result<&mut [u8]>> {
        if self.on_disk.is_some()
            || !self.inflight.is_empty()
            || self.copies.iter().any(DeviceCopy::aliased_in_use)
        {
            return None;
        }
        if self.host.is_none() {
            let block = self.resource.allocate_host_now(&self.home, self.nbytes, self.pinned)?;
            // A block the buffer may not use goes back: the usual path then reports why.
            let block = self.checked_host_block(block).ok()?;
            // Recorded with the transition of the overwrite that follows (one record).
            self.observe_host_allocation(&block, true);
            self.host = Some(block);
            self.stats.allocations += 1;
        }
        // Bookkeeping only now: the plan allocates nothing more (the block is there) and
        // copies nothing (an overwrite).
        Some(self.host_access(Access::Overwrite))
    }

    /// The host bytes if the host copy is valid, no transfer into it is in flight and no
    /// device copy that aliases it is in use (the caller's kernel may still write it), without
    /// any sync or wait.
    pub fn host_if_valid(&self) -> Option<&[u8]> {
        let incoming = self.inflight.iter().any(|op| op.writes.contains(Location::Host))
            || self.copies.iter().any(DeviceCopy::aliased_in_use);
        (self.coherence.residency(Location::Host) == Residency::Valid && !incoming)
            .then(|| self.host.as_ref().map(|h| &h.as_slice()[..self.nbytes]))
            .flatten()
    }

    /// The addresses of the host block, whatever it holds (current or stale), without any
    /// sync: for a caller that must know whether outside memory overlaps it (an assignment
    /// whose source may be a view of this very block). `None` when there is none.
    pub fn host_addresses(&self) -> Option<std::ops::Range<usize>> {
        let start = self.host.as_ref()?.as_ptr() as usize;
        Some(start..start + self.nbytes)
    }

    /// Makes `device`'s copy current for `access` and hands out its memory (to a view, or to
    /// the caller's kernels): the copy counts as used from now on.
    pub fn device_access(&mut self, device: &Device, access: Access) -> Result<&DeviceMemory> {
        Ok(&self.hand_out(device, access)?.memory)
    }

    /// As [`Self::device_access`], lending the memory mutably (for write views).
    pub fn device_access_mut(&mut self, device: &Device, access: Access) -> Result<&mut DeviceMemory> {
        Ok(&mut self.hand_out(device, access)?.memory)
    }

    /// Tells the buffer that work the caller enqueued outside the copy's stream (on a stream
    /// of another library, say) uses `device`'s copy until `ticket` completes: later
    /// transfers, writes and the release of that copy wait for it. Nothing happens when the
    /// buffer has no copy on `device`.
    pub fn used_until(&mut self, device: &Device, ticket: Ticket) {
        if let Some(index) = self.copy_index(device.id()) {
            self.copies[index].used_until(ticket);
        }
    }

    pub(super) fn hand_out(&mut self, device: &Device, access: Access) -> Result<&mut DeviceCopy> {
        self.hand_out_as(device, access, false)
    }

    /// [`Self::hand_out`]; `stream_ordered`: an access that needs no copy does not wait for
    /// the uploads to this copy in flight in its stream's order ([`Self::device_access_ordered`]).
    fn hand_out_as(
        &mut self,
        device: &Device,
        access: Access,
        stream_ordered: bool,
    ) -> Result<&mut DeviceCopy> {
        self.access(Location::Device(device.id()), Some(device), access, &observed::DEVICE, stream_ordered)?;
        let index = self.copy_index(device.id()).expect("the device is allocated after a device access");
        let copy = &mut self.copies[index];
        copy.hand_out();
        Ok(copy)
    }

    /// Makes `device`'s copy current (the host's when `None`), copying only if it is stale,
    /// without handing it out.
    pub fn sync(&mut self, device: Option<&Device>) -> Result<()> {
        match device {
            Some(device) => self.access(
                Location::Device(device.id()),
                Some(device),
                Access::Read,
                &observed::SYNC_TO_DEVICE,
                false,
            ),
            None => self.host_access_as(Access::Read, &observed::SYNC_TO_HOST).map(drop),
        }
    }

    /// Declares that the copy on `device` (the host's when `None`) was written: it is made
    /// current first (allocated, and filled from a current copy if it is stale), then every
    /// other copy is stale; a device copy counts as handed out for writing (to the caller's
    /// kernels). The typed wrapper's `mark_host_dirty`/`mark_dirty_on`.
    ///
    /// When the buffer holds no data (UNINITIALIZED: nothing valid anywhere), nobody can have
    /// written that copy through lazybuf, so it is made current as a read makes it: zero-filled
    /// (the contract: a buffer that holds no data reads as zeros, never as the bytes an
    /// earlier user of a reused block left). The zero-fill is no transfer (the counters count
    /// only the allocation). A failed allocation or zero-fill changes nothing: the buffer is
    /// UNINITIALIZED as before, holding what it held.
    pub fn mark_written(&mut self, device: Option<&Device>) -> Result<()> {
        let held_nothing = !self.coherence.any_valid();
        match device {
            Some(device) => {
                if held_nothing {
                    // A read of data nobody holds zero-fills (access_planned), without handing
                    // the copy out.
                    self.access(
                        Location::Device(device.id()),
                        Some(device),
                        Access::Read,
                        &observed::DEVICE,
                        false,
                    )?;
                }
                // The caller's kernel wrote the copy after an upload to it in flight in its
                // stream's order: the mark does not wait for the upload (inflight.rs).
                self.hand_out_as(device, Access::Write, true).map(drop)
            }
            None => {
                if held_nothing {
                    self.host_access(Access::Read)?;
                }
                self.host_access(Access::Write).map(drop)
            }
        }
    }

    /// Makes the host copy (`host`: a host read) and the copy on `device` (a sync there) hold
    /// the buffer's data, as one operation: PyDotCompute's `allocate` (and its `synchronize`,
    /// asked for the stale copies). A buffer that held no data holds zeros after it. A failed
    /// or refused call changes nothing: when the device step fails after the host step
    /// zero-filled the host copy of a buffer that held no data, that is undone (the host copy
    /// forgotten, the block the step took given back, the counters as they were), a host copy
    /// the host step read back from disk is in its file again, and the transfer guard sees
    /// the device step's upload before the host step runs.
    pub fn allocate_copies(&mut self, host: bool, device: Option<&Device>) -> Result<()> {
        // The host step zero-fills the host copy (taking a block if there is none) when nothing
        // holds data; the device step then uploads it.
        let fills_host = host
            && self.inflight.is_empty()
            && self.on_disk.is_none()
            && self.state() == BufferState::Uninitialized;
        let (stats, had_block) = (self.stats, self.host.is_some());
        if let Some(device) = device
            && host
            && observe::guarding()
        {
            // The guard sees the device step's copies before the host step changes anything (a
            // refused `allocate()` took a host block first, and recorded it; a refused
            // `allocate()` or `synchronize()` of a buffer that held memory but no data left it
            // HOST_DIRTY; one of a host copy spilled to disk read the file back into a new
            // block, counted: the nineteenth hostile pass).
            let at = Location::Device(device.id());
            if fills_host {
                // The upload of the zero-filled host copy.
                self.guard_refusal(&[(Location::Host, at)], device)?;
            } else if self.on_disk.is_some() {
                // The host step reads the file back, which changes no plan: the device step's
                // is the one made now.
                let copies: Vec<(Location, Location)> = (self.plan(at, Some(device), Access::Read).steps())
                    .iter()
                    .filter_map(|step| match *step {
                        Step::Copy { from, to } => Some((from, to)),
                        Step::Allocate(_) => None,
                    })
                    .collect();
                self.guard_refusal(&copies, device)?;
            }
        }
        // A host copy on disk is read back for both steps; when the device step fails, the
        // file holds it again (the block read back was kept, counted, before the twentieth
        // pass). Dropped at the end, the file removed, when the call succeeds.
        let read_back = match device {
            Some(_) if host && self.on_disk.is_some() => self.read_back_keeping_file()?,
            _ => None,
        };
        if host && let Err(err) = self.sync(None) {
            if let Some(file) = read_back {
                self.return_to_disk(file, "allocate");
            }
            return Err(err);
        }
        let Some(device) = device else {
            return Ok(());
        };
        let done = self.sync(Some(device));
        if done.is_err() {
            if fills_host {
                self.forget_zero_filled_host(!had_block, stats);
            }
            if let Some(file) = read_back {
                self.return_to_disk(file, "allocate");
            }
        }
        done
    }

    /// Undoes [`Self::allocate_copies`]' host step of a buffer that held no data, whose
    /// device step failed: the zero-filled host copy is forgotten (the buffer UNINITIALIZED
    /// again), the host block given back when the step took it (`took_block`), the counters
    /// set back to `stats`.
    fn forget_zero_filled_host(&mut self, took_block: bool, stats: TransferStats) {
        let undone = self.stats.allocations.wrapping_sub(stats.allocations);
        self.observe_state("allocate", |buffer| {
            buffer.coherence.invalidate();
            if took_block && let Some(block) = buffer.host.take() {
                buffer.coherence.forget(Location::Host);
                buffer.record_allocation(); // its allocation before its free
                execute::give_back_host(&*buffer.resource, &buffer.home, block, Ticket::done(), buffer.id);
            }
        });
        self.stats = stats;
        self.observe_allocations_undone(undone, "allocate");
    }

    /// As [`Self::sync`], asynchronously: enqueues the copies and returns at once. See the
    /// module docs for the state while the transfer is in flight and after it fails.
    pub fn sync_async(&mut self, device: Option<&Device>) -> Result<Transfer> {
        let cause =
            if device.is_some() { &observed::SYNC_TO_DEVICE_ASYNC } else { &observed::SYNC_TO_HOST_ASYNC };
        self.sync_async_as(device, cause, false)
    }

    /// [`Self::sync_async`], its copies caused by `cause` (for the transfer guard); `ordered`:
    /// for [`Self::device_access_ordered`], whose upload keeps its stream's order.
    fn sync_async_as(
        &mut self,
        device: Option<&Device>,
        cause: &'static Cause,
        ordered: bool,
    ) -> Result<Transfer> {
        let at = device.map_or(Location::Host, |d| Location::Device(d.id()));
        let observed = observe::active();
        // While something observes, the guard sees the copies before a host copy spilled to
        // disk is read back, as for every access: a refused call changes nothing (the read-back
        // would allocate, perhaps spilling another buffer). The plan observed is made before
        // the read-back, as `access_observed` does.
        let seen_before_reload = observed && self.on_disk.is_some();
        // The spill file is kept until the transfer is under way: a call that fails before
        // leaves the host copy in it (the block read back was kept before the twentieth pass).
        let read_back = if seen_before_reload {
            let plan = self.plan(at, device, Access::Read);
            self.observe_plan(&plan, device, cause)?;
            self.read_back_keeping_file().inspect_err(|_| self.observe_abort())?
        } else if self.on_disk.is_some() {
            self.read_back_keeping_file()?
        } else {
            None
        };
        let plan = self.plan(at, device, Access::Read);
        if observed && !seen_before_reload {
            self.observe_plan(&plan, device, cause)?;
        }
        let (reads, writes) = self.touched(&plan, at, device, Access::Read);
        // An early return leaves no plan behind for a later access's copies to be named after
        // (`observe_abort` does nothing when no plan was made).
        self.settle(|op| op.conflicts(&reads, &writes)).inspect_err(|_| self.observe_abort())?;
        if !self.coherence.any_valid() || plan.steps().iter().all(|s| matches!(s, Step::Allocate(_))) {
            // Nothing to copy (or nothing valid, which a blocking read zero-fills): the
            // blocking sync plans and records it anew.
            if observed {
                self.observe_abort();
            }
            if let Err(err) = self.sync(device) {
                if let Some(file) = read_back {
                    self.return_to_disk(file, "rollback");
                }
                return Err(err);
            }
            return Ok(Transfer::new(Ticket::done(), None));
        }
        if at == Location::Host {
            self.await_aliased_use().inspect_err(|_| self.observe_abort())?;
        }
        let before = writes.iter().map(|loc| (loc, self.coherence.residency(loc))).collect();
        let (mut undo, mut delta, mut tickets) = (Undo::default(), TransferStats::default(), Vec::new());
        if let Err(err) = self.execute(&plan, device, &mut undo, &mut delta, Some(&mut tickets)) {
            // Copies already enqueued may still be writing what is about to be freed.
            // (Their failure, if any, is this one's consequence: recorded, not returned.)
            self.home.record_deferred(Ticket::all(tickets).wait());
            self.rollback(undo, Ticket::done());
            if let Some(file) = read_back {
                self.return_to_disk(file, "rollback");
            }
            if observed {
                self.observe_allocations_undone(delta.allocations, "rollback");
                self.observe_abort();
            }
            return Err(err);
        }
        let ticket = Ticket::all(tickets);
        // The device a forked child's wait names: the one written, else the one read.
        let named = plan.steps().iter().find_map(|step| match *step {
            Step::Copy { from, to } => [to, from].into_iter().find_map(|at| match at {
                Location::Device(id) => self.copy_index(id).map(|i| self.copies[i].device.clone()),
                Location::Host => None,
            }),
            Step::Allocate(_) => None,
        });
        self.stats = self.stats.plus(delta);
        self.coherence.commit(at, Access::Read, &plan);
        let op = if observed { self.observe_commit() } else { 0 };
        // Only the stream-ordered access's uploads keep the stream's order; an explicit
        // asynchronous sync is waited for by every later access that conflicts with it.
        let upload_to = match at {
            // (A ticket done already is no upload in flight: a zero-copy sync, an empty buffer.)
            Location::Device(id)
                if ordered
                    && !ticket.is_trivially_done()
                    && ticket.is_stream_ordered()
                    && only_uploads_to(&plan, at) =>
            {
                Some(id)
            }
            _ => None,
        };
        self.inflight.push(InFlight {
            ticket: ticket.clone(),
            reads,
            writes,
            before,
            undo,
            stats: delta,
            op,
            upload_to,
            revalidate: Locations::default(),
            reported: false,
            read_back,
        });
        Ok(Transfer::new(ticket, named))
    }

    /// Makes `device`'s copy current for reading and hands out its memory *in the order of the
    /// copy's stream* ([`Self::stream`] for the buffer's own device): where that takes an
    /// upload in the stream's order (a CUDA copy, not a staged one), it is enqueued and not
    /// waited for, and the ticket returned completes when it has. The memory is ready for work
    /// enqueued on that stream after this call, and for work on another stream once that
    /// stream waits for the ticket ([`Stream::wait_for`]); anything else (a host read of the
    /// device memory, work on another stream) must wait for the ticket first.
    ///
    /// Meanwhile the upload is a transfer in flight, as [`Self::sync_async`] makes one, with
    /// two exceptions that keep the stream's order instead of waiting: a bookkeeping write of
    /// this copy ([`Self::mark_written`], the caller's kernel having written it) and a read of
    /// it into outside memory ([`Self::read_into`]). When the upload fails, the buffer is as
    /// it was before it (host current; a write declared meanwhile is undone: the kernel read a
    /// copy that never arrived), and the next call that waits for it returns the failure.
    /// Where no such upload is needed or possible (a current copy with no upload in flight, a
    /// zero-copy device, a staged or device-to-device copy, a copy spilled to disk) this is
    /// [`Self::device_access`] and the ticket is done.
    pub fn device_access_ordered(&mut self, device: &Device) -> Result<(&DeviceMemory, Ticket)> {
        device.backend().check_usable()?;
        let at = Location::Device(device.id());
        if self.on_disk.is_none() && self.coherence.any_valid() {
            let plan = self.plan(at, Some(device), Access::Read);
            let uploads = plan.steps().iter().any(|s| matches!(s, Step::Copy { .. }));
            if !uploads && !self.inflight.is_empty() {
                // Uploads of earlier calls that are done are settled (a query each; the wait
                // that follows returns the outcome the query found), so the ticket returned
                // names only what still runs.
                let done = |op: &InFlight| {
                    op.is_ordered_upload_to(device.id()) && matches!(op.ticket.poll(), Ok(true))
                };
                self.settle(done)?;
            }
            // Where the runtime's uploads cannot complete in the stream's order (OpenCL, wgpu),
            // the blocking access below: an asynchronous upload would be waited for at once, and
            // its bookkeeping cost PoCL's 4 KiB batch about 2,900 instructions (docs/BENCHMARKS.md).
            if uploads && only_uploads_to(&plan, at) && device.backend().ordered_uploads() {
                // Committed and in flight; its ticket is among the uploads collected below.
                drop(self.sync_async_as(Some(device), &observed::DEVICE, true)?);
                if !self.inflight.last().is_some_and(|op| op.is_ordered_upload_to(device.id())) {
                    // Staged (a worker thread's copy): not in the stream's order, so waited for.
                    self.settle_for(at, Some(device), Access::Read)?;
                }
            }
        }
        let ticket = self.ordered_uploads_to(device.id());
        let copy = self.hand_out_as(device, Access::Read, true)?;
        Ok((&copy.memory, ticket))
    }

    /// The uploads to `device` in flight in the order of its copy's stream, as one ticket.
    fn ordered_uploads_to(&self, device: DeviceId) -> Ticket {
        Ticket::all(
            self.inflight.iter().filter(|op| op.is_ordered_upload_to(device)).map(|op| op.ticket.clone()),
        )
    }

    /// Fills every element with `pattern` (one element's bytes: 1, 2, 4, 8 or 16 of them,
    /// dividing the buffer's size, else an error wherever the data is) at one current location,
    /// with no transfer: the buffer's own device if it is current, else the host if it is,
    /// else another current device; an uninitialized buffer is filled on the host. The fill
    /// is a write there, so every other copy becomes stale. A fill that fails before it
    /// starts changes nothing; one the runtime abandons half-way leaves that copy's bytes
    /// unknown, so it is marked stale when another copy is current (and, when it was the only
    /// current copy, its bytes are the runtime's partial result: the error says so).
    pub fn fill(&mut self, pattern: &[u8]) -> Result<()> {
        // One rule wherever the data is current (a host fill once took any pattern, a device
        // fill refused it): checked before anything moves.
        crate::device::check_fill_pattern("fill", pattern, self.nbytes)?;
        self.reload_from_disk()?;
        let home = Location::Device(self.home.id());
        let valid = |c: &Coherence, loc: &Location| c.residency(*loc) == Residency::Valid;
        self.finish()?;
        let device_target = if valid(&self.coherence, &home) {
            Some(home)
        } else if valid(&self.coherence, &Location::Host) {
            None
        } else {
            self.coherence
                .locations()
                .map(|(loc, _)| loc)
                .find(|loc| valid(&self.coherence, loc) && *loc != Location::Host)
        };
        let Some(Location::Device(id)) = device_target else {
            // A host access: the guard and the recorder see it as the fill's.
            fill_pattern(self.host_access_as(Access::Overwrite, &observed::FILL)?, pattern);
            return Ok(());
        };
        self.observe_state("fill", |buffer| buffer.fill_device(id, pattern))
    }

    /// Fills the current copy on device `id` (see [`Self::fill`]).
    fn fill_device(&mut self, id: DeviceId, pattern: &[u8]) -> Result<()> {
        let i = self.copy_index(id).expect("a valid device copy is allocated");
        let copy = &mut self.copies[i];
        // Refused before it started (ordering, or the enqueue itself): nothing was written, so
        // nothing changes.
        copy.order_stream()?;
        let ticket = copy.stream.fill(&mut copy.memory, pattern, self.nbytes)?;
        if let Err(err) = ticket.wait() {
            // A runtime may fail half-way through a fill, leaving this copy's bytes unknown:
            // if another copy is current, this one is stale from now on.
            let at = Location::Device(id);
            let others_valid = self.coherence.locations().any(|(loc, r)| loc != at && r == Residency::Valid);
            if others_valid {
                self.coherence.mark_stale(at);
            }
            return Err(err);
        }
        copy.written();
        self.coherence.commit(Location::Device(id), Access::Overwrite, &Plan::default());
        Ok(())
    }

    /// Frees every copy: the buffer is uninitialized again and holds no memory. Transfers in
    /// flight are waited for first (their failures no longer matter: the data is gone).
    pub fn release_memory(&mut self) {
        match observe::emit_epoch() {
            None => {
                self.release_all(false);
            }
            Some(epoch) => self.release_observed(epoch),
        }
    }

    /// Frees every copy (see [`Self::release_memory`]). `defer_host_free`: the host block's
    /// free is not recorded here but returned (its bytes), for the release's state transition
    /// to record with it (`release_observed`); else `None`.
    fn release_all(&mut self, defer_host_free: bool) -> Option<usize> {
        self.on_disk = None;
        // A transfer that failed unobserved: recorded on the buffer's device, not lost.
        if let Some(err) = panic_as_error("release_memory", || {
            let finished = self.finish();
            self.home.record_deferred(finished);
        }) {
            self.home.record_deferred_error(err);
        }
        // Each block goes back on its own: a resource (or a caller's completion) that panics
        // for one is recorded on the device, and the others still go back.
        let mut host_ready = Vec::new();
        for mut copy in std::mem::take(&mut self.copies) {
            let device = copy.device.clone();
            device.contain_panics("release_memory", || {
                if copy.memory.is_host_alias() {
                    host_ready.push(last_use_or_synchronized(&mut copy));
                }
                give_back(&*self.resource, copy, self.id);
            });
        }
        let mut freed = None;
        if let Some(block) = self.host.take() {
            let (resource, home, id) = (&*self.resource, &self.home, self.id);
            home.contain_panics("release_memory", || {
                if defer_host_free {
                    // Known before the give-back, which may panic (contained): the free is
                    // recorded either way, as `give_back_host` records it before it.
                    freed = (!block.is_adopted()).then(|| block.len());
                    give_back_host_unrecorded(resource, home, block, Ticket::all(host_ready));
                } else {
                    give_back_host(resource, home, block, Ticket::all(host_ready), id);
                }
            });
        }
        self.coherence.clear();
        (self.direct_read, self.host_sync_pays) = (false, false);
        freed
    }

    /// Makes `block`, whose first `nbytes` bytes are the buffer's data, the buffer's host
    /// copy without copying them: the buffer becomes HOST_ONLY and allocates no host block of
    /// its own. For a buffer that holds no memory yet (new, or after
    /// [`Self::release_memory`]) and a block of at least `nbytes` bytes, typically adopted
    /// memory ([`HostMemory::adopt`]); anything else is refused with an error, the buffer left
    /// as it was and `block` dropped (adopted bytes go back to their lender untouched). An
    /// adopted block is never handed to the buffer's resource: when the buffer frees its
    /// memory the block goes back to its lender, after the work that used it. Adopted blocks
    /// may be unaligned: the typed accessors of [`super::UnifiedBuffer`] refuse a host copy
    /// misaligned for their element type.
    pub fn adopt_host(&mut self, block: HostMemory) -> Result<()> {
        let refuse = |why: String| Err(Error::invalid("adopt_host", why));
        if self.host.is_some()
            || !self.copies.is_empty()
            || !self.inflight.is_empty()
            || self.on_disk.is_some()
        {
            return refuse("expected a buffer that holds no memory yet".into());
        }
        if self.pinned && !block.is_pinned() {
            return refuse("expected page-locked memory for a pinned buffer, got pageable memory".into());
        }
        if block.len() < self.nbytes {
            return refuse(format!(
                "expected a block of at least {} bytes, got {}",
                self.nbytes,
                block.len()
            ));
        }
        self.host = Some(block);
        let adopted = self.access(Location::Host, None, Access::Overwrite, &observed::ADOPT_HOST, false);
        if adopted.is_err() {
            self.host = None;
            self.coherence.clear();
        }
        adopted
    }

    /// Forgets the contents (state UNINITIALIZED) but keeps every allocation for reuse.
    pub fn invalidate(&mut self) {
        self.observe_state("invalidate", Self::forget_contents);
    }

    /// Forgets the contents (as [`Self::invalidate`]) and the counters, and takes a new id:
    /// a new buffer over the memory this one keeps (a binding's `free()` that reuses memory it
    /// handed out). What was recorded under the old id stays that id's, so each id's recorded
    /// copies and allocations are what its counters counted (the counters were reset under
    /// the old id before the twentieth pass: its recorded totals exceeded them).
    pub fn invalidate_as_new(&mut self) {
        self.invalidate();
        self.record_allocation(); // a block not recorded yet is the old id's
        self.reset_transfer_stats();
        self.id = observe::next_buffer_id();
    }

    fn forget_contents(&mut self) {
        // A transfer that failed unobserved: recorded on the buffer's device, not lost.
        let finished = self.finish();
        self.home.record_deferred(finished);
        if self.on_disk.take().is_some() {
            // The spilled bytes no longer matter, and their block is gone: no host memory.
            self.coherence.forget(Location::Host);
        }
        self.coherence.invalidate();
        (self.direct_read, self.host_sync_pays) = (false, false);
    }

    fn copy_index(&self, id: DeviceId) -> Option<usize> {
        self.copies.iter().position(|c| c.device.id() == id)
    }

    fn plan(&self, at: Location, device: Option<&Device>, access: Access) -> Plan {
        let copies = &self.copies;
        self.coherence.plan(at, access, |from, to| {
            let source = copies.iter().find(|c| c.device.id() == from);
            let target = device.filter(|d| d.id() == to);
            matches!((source, target), (Some(s), Some(t)) if t.can_copy_from(&s.device))
        })
    }

    /// Waits for the transfers in flight that `which` picks; undoes those that failed and
    /// returns the first failure.
    fn settle(&mut self, which: impl FnMut(&InFlight) -> bool) -> Result<()> {
        self.settle_after(false, which)
    }

    /// [`Self::settle`]; `finished`: the transfers `which` picks are known to be complete (work
    /// later on their stream has finished), so each is polled, not waited for (no wait call of
    /// the runtime's), unless the poll finds it still running.
    fn settle_after(&mut self, finished: bool, mut which: impl FnMut(&InFlight) -> bool) -> Result<()> {
        let mut first = None;
        let mut i = 0;
        while i < self.inflight.len() {
            if !which(&self.inflight[i]) {
                i += 1;
                continue;
            }
            let op = self.inflight.remove(i);
            let outcome = match finished.then(|| op.ticket.poll()) {
                Some(Ok(true)) => Ok(()),
                Some(Err(err)) => Err(err),
                Some(Ok(false)) | None => op.ticket.wait(),
            };
            if let Err(err @ Error::ForkedChild { .. }) = outcome {
                // A forked child cannot learn the transfer's outcome: it stays in flight, its
                // state as committed (never undone as if it had failed), and the call fails.
                self.inflight.insert(i, op);
                first.get_or_insert(err);
                i += 1;
                continue;
            }
            if let Err(err) = outcome {
                // Its state put back, and (while observed) the undoing recorded.
                self.observe_undo(op.op, op.stats.allocations, |buffer| op.undo_state(&mut buffer.coherence));
                self.stats = self.stats.minus(op.stats);
                // The ticket was just waited for (and its error is returned): nothing uses
                // what the transfer allocated any more.
                self.rollback(op.undo, Ticket::done());
                if let Some(file) = op.read_back {
                    self.return_to_disk(file, "rollback");
                }
                first.get_or_insert(err);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Waits for the caller's use of device copies that alias the host block: a host write
    /// must not change bytes a kernel may still be reading.
    #[inline(always)]
    fn await_aliased_use(&mut self) -> Result<()> {
        for copy in self.copies.iter_mut() {
            if copy.aliased_in_use() {
                copy.wait_for_use()?;
            }
        }
        Ok(())
    }

    /// The locations an access reads and writes ([`touched`]), by memory: a device copy that
    /// aliases the host block (or is about to) is the host block, so reading or writing it
    /// reads or writes the host location too.
    fn touched(
        &self,
        plan: &Plan,
        at: Location,
        device: Option<&Device>,
        access: Access,
    ) -> (Locations, Locations) {
        let (mut reads, mut writes) = touched(plan, at, access);
        let aliased = |loc: Location| match loc {
            Location::Host => false,
            Location::Device(id) => match self.copy_index(id) {
                Some(i) => self.copies[i].memory.is_host_alias(),
                None => device.is_some_and(|d| d.id() == id && d.is_zero_copy(self.nbytes)),
            },
        };
        if reads.iter().any(aliased) {
            reads.insert(Location::Host);
        }
        if writes.iter().any(aliased) {
            writes.insert(Location::Host);
        }
        (reads, writes)
    }

    /// Waits for the transfers in flight an access at `at` depends on.
    fn settle_for(&mut self, at: Location, device: Option<&Device>, access: Access) -> Result<()> {
        if self.inflight.is_empty() {
            return Ok(());
        }
        let plan = self.plan(at, device, access);
        let (reads, writes) = self.touched(&plan, at, device, access);
        self.settle(|op| op.conflicts(&reads, &writes))
    }

    /// This buffer, its copies and state transitions caused by `cause` until the returned
    /// guard drops: as [`observe::call`] names them, for a call that uses only this buffer,
    /// without the thread's recorder state (in a shared library, such as the Python
    /// extension, each access to a thread-local is a call: the binding's accesses name
    /// themselves this way while only the recorder runs). A call named on the thread by
    /// [`observe::call`] still names what it makes; spilling's copies keep their own cause.
    ///
    /// `None` changes nothing (the scope runs as whatever call names the buffer already): for
    /// a caller whose own call is optional.
    pub fn as_call(&mut self, cause: impl Into<Option<Cause>>) -> AsCall<'_> {
        let previous = self.call;
        if let Some(cause) = cause.into() {
            self.call = Some(cause);
        }
        AsCall { buffer: self, previous }
    }

    /// Makes `at` current for `access`; `cause`: what the transfer guard and the recorder
    /// call its copies; `stream_ordered`: a device access that needs no copy does not wait for
    /// the uploads to that copy in flight in its stream's order
    /// ([`Self::device_access_ordered`]).
    #[inline(always)]
    fn access(
        &mut self,
        at: Location,
        device: Option<&Device>,
        access: Access,
        cause: &'static Cause,
        stream_ordered: bool,
    ) -> Result<()> {
        // A device whose runtime does not survive fork, used in a forked child: refused before
        // anything changes, also where the access needs no runtime call (a current copy
        // handed out again would give the child the parent's handle, which hangs when used).
        if let Some(device) = device {
            device.backend().check_usable()?;
        }
        // While something observes, the guard sees the plan's copies before anything runs
        // (observed.rs); otherwise this costs one atomic load.
        if observe::active() {
            return self.access_observed(at, device, access, cause, stream_ordered);
        }
        self.access_unobserved(at, device, access, stream_ordered)
    }

    #[inline(always)]
    fn access_unobserved(
        &mut self,
        at: Location,
        device: Option<&Device>,
        access: Access,
        stream_ordered: bool,
    ) -> Result<()> {
        if self.on_disk.is_some() {
            return self.access_read_back(at, device, access, stream_ordered);
        }
        let plan = self.plan(at, device, access);
        self.access_planned(at, device, access, &plan, stream_ordered)
    }

    /// [`Self::access_unobserved`] of a buffer whose host copy is on disk: read back first;
    /// when the access then fails, the file holds the host copy again and the block read back
    /// is given back, so the failed call leaves the buffer as it was (the twentieth pass).
    #[cold]
    #[inline(never)]
    fn access_read_back(
        &mut self,
        at: Location,
        device: Option<&Device>,
        access: Access,
        stream_ordered: bool,
    ) -> Result<()> {
        let read_back = self.read_back_keeping_file()?;
        let plan = self.plan(at, device, access);
        let done = self.access_planned(at, device, access, &plan, stream_ordered);
        if done.is_err()
            && let Some(file) = read_back
        {
            self.return_to_disk(file, "rollback");
        }
        done
    }

    /// [`Self::access_unobserved`] once nothing is on disk and `plan` is the access's plan.
    #[inline(always)]
    fn access_planned(
        &mut self,
        at: Location,
        device: Option<&Device>,
        access: Access,
        plan: &Plan,
        stream_ordered: bool,
    ) -> Result<()> {
        // The blocking calls' fast path: no transfer in flight, nothing to settle. Settling
        // the transfers the access depends on changes no state when they succeed (a transfer
        // commits when it is enqueued), so the plan stays; when one failed, the error returns.
        if !self.inflight.is_empty() {
            let (reads, writes) = self.touched(plan, at, device, access);
            // A stream-ordered access that copies nothing leaves the uploads to its copy in
            // flight (they run before whatever the caller enqueues next on the copy's stream).
            let ordered = match at {
                Location::Device(id) if stream_ordered && plan.is_empty() => Some(id),
                _ => None,
            };
            let keep = |op: &InFlight| ordered.is_some_and(|id| op.is_ordered_upload_to(id));
            match ordered {
                Some(id) if access != Access::Read => {
                    // A write the kept uploads may have to undo: every other transfer is
                    // settled first, so what it records as current is current for certain,
                    // not because a transfer that may still fail says so (a hostile pass,
                    // 2026-11-27: a failed upload to another device was made current again).
                    self.settle(|op| !keep(op))?;
                    self.revalidate_on_failure(id);
                }
                _ => self.settle(|op| op.conflicts(&reads, &writes) && !keep(op))?,
            }
        }
        if at == Location::Host {
            // Reads too: on a zero-copy device the caller's kernel may still be writing the
            // host block through the device copy it was handed (a forgotten
            // mark_device_dirty()), and a read then must see its result, never a torn one.
            self.await_aliased_use()?;
        }
        // A read of data nobody holds sees zeros, never a previous user's bytes.
        let zero = access == Access::Read && !self.coherence.any_valid();
        if plan.is_empty() && !zero {
            self.coherence.commit(at, access, plan);
            if access != Access::Read {
                self.forget_hand_outs();
            }
            return Ok(());
        }
        if at == Location::Host {
            self.note_host_download(plan);
        }
        let mut undo = Undo::default();
        let mut stats = self.stats;
        let executed = self
            .execute(plan, device, &mut undo, &mut stats, None)
            .and_then(|()| if zero { self.zero(at) } else { Ok(()) });
        match executed {
            Ok(()) => {
                self.stats = stats;
                self.coherence.commit(at, access, plan);
                if access != Access::Read {
                    self.forget_hand_outs();
                }
                Ok(())
            }
            Err(err) => {
                self.rollback(undo, Ticket::done());
                // The blocks it took, taken back with `stats` (the plan's abort records it).
                self.observe_allocations_undone(
                    stats.allocations.wrapping_sub(self.stats.allocations),
                    "rollback",
                );
                Err(err)
            }
        }
    }

    /// Before a write to device `id`'s copy that leaves the uploads to it in flight: whatever
    /// is current now besides that copy becomes current again if one of them fails.
    fn revalidate_on_failure(&mut self, id: DeviceId) {
        let at = Location::Device(id);
        let mut current = Locations::default();
        for loc in
            std::iter::once(Location::Host).chain(self.copies.iter().map(|c| Location::Device(c.device.id())))
        {
            if loc != at && self.coherence.residency(loc) == Residency::Valid {
                current.insert(loc);
            }
        }
        for op in self.inflight.iter_mut().filter(|op| op.is_ordered_upload_to(id)) {
            for loc in current.iter() {
                op.revalidate.insert(loc);
            }
        }
    }

    /// After a write, every other copy is stale (their hand-outs no longer matter to the
    /// checker) and the written copy's own write is declared.
    fn forget_hand_outs(&mut self) {
        self.direct_read = false;
        for copy in &mut self.copies {
            copy.written();
        }
    }
}

impl Drop for RawBuffer {
    fn drop(&mut self) {
        // Each block's give-back runs contained (release_all); anything else that panics is
        // recorded too: a drop never unwinds.
        if let Some(err) = panic_as_error("drop", || self.release_memory()) {
            self.home.record_deferred_error(err);
        }
    }
}

impl std::fmt::Debug for RawBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawBuffer")
            .field("nbytes", &self.nbytes)
            .field("home", &self.home)
            .field("state", &self.state())
            .field("in_flight", &self.inflight.len())
            .finish()
    }
}

/// Whether every copy of `plan` is an upload from the host to `at` (a device location); a plan
/// that only allocates qualifies too.
fn only_uploads_to(plan: &Plan, at: Location) -> bool {
    plan.steps().iter().all(|step| match *step {
        Step::Allocate(loc) => loc == at,
        Step::Copy { from, to } => from == Location::Host && to == at,
    })
}
