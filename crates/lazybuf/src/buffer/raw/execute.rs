//! Plan execution: the allocations and copies a coherence plan asks for, and their undoing.
//!
//! [`RawBuffer::execute`] runs a plan's steps in order: host and device allocations from the
//! buffer's resource (a device that aliases host memory gets the host block itself), and
//! whole-buffer copies on the stream of the device copy involved, each ordered after the
//! caller's declared use of that copy and after the plan's previous copy. What one execution
//! allocated is recorded in an [`Undo`] and freed by [`RawBuffer::rollback`] when a later step
//! fails, so a failed access changes nothing.
//!
//! What does not live here: choosing the plan ([`crate::coherence`]), waiting for transfers in
//! flight and committing the state (the accesses in [`super`]).

use super::{DeviceCopy, RawBuffer};
use crate::backend::{Block, HostSpan, MemoryKind as Kind, Ticket};
use crate::buffer::inflight::Undo;
use crate::buffer::stats::{Direction, TransferStats};
use crate::coherence::{Location, Plan, Step};
use crate::device::{Device, Stream};
use crate::error::{Error, Result};
use crate::host_memory::HostMemory;
use crate::observe::trace::{self, MemoryKind};
use crate::resource::{MemoryResource, check_block};

impl RawBuffer {
    /// Zero-fills location `at` (allocated, nothing valid anywhere).
    pub(super) fn zero(&mut self, at: Location) -> Result<()> {
        match at {
            Location::Host => {
                let host = self.host.as_mut().expect("the host is allocated before it is zeroed");
                if !host.is_known_zero() {
                    let n = self.nbytes;
                    host.as_mut_slice()[..n].fill(0);
                }
                Ok(())
            }
            Location::Device(id) => {
                let i = self.copy_index(id).expect("a device copy is allocated before it is zeroed");
                let copy = &mut self.copies[i];
                copy.order_stream()?;
                copy.stream.fill(&mut copy.memory, &[0], self.nbytes)?.wait()
            }
        }
    }

    /// Runs a plan's allocations and copies. With `pending`, copies are only enqueued and
    /// their tickets collected; without it each is waited for.
    pub(super) fn execute(
        &mut self,
        plan: &Plan,
        device: Option<&Device>,
        undo: &mut Undo,
        stats: &mut TransferStats,
        mut pending: Option<&mut Vec<Ticket>>,
    ) -> Result<()> {
        for step in plan.steps() {
            match *step {
                Step::Allocate(Location::Host) => self.allocate_host(undo, stats)?,
                Step::Allocate(Location::Device(id)) => {
                    let device =
                        device.filter(|d| d.id() == id).expect("plans allocate only the accessed device");
                    self.allocate_on(device, undo, stats)?;
                }
                // While observed, the same copy, timed and recorded (observed.rs).
                Step::Copy { from, to } if crate::observe::emitting() => {
                    self.copy_observed(from, to, stats, pending.as_deref_mut())?;
                    self.count_reload_of(from, to, undo);
                }
                Step::Copy { from, to } => {
                    let after = pending.as_deref().and_then(|tickets| tickets.last().cloned());
                    let ticket = self.copy(from, to, stats, after)?;
                    match pending.as_deref_mut() {
                        Some(tickets) => tickets.push(ticket),
                        None => ticket.wait()?,
                    }
                    self.count_reload_of(from, to, undo);
                }
            }
        }
        Ok(())
    }

    /// Counts a copy from the host to a device whose copy was evicted as its reload, once it
    /// ran (or, asynchronous, was enqueued), and notes it in `undo`: a plan that fails after
    /// it, or an asynchronous transfer that fails when settled, uncounts it (a failed upload
    /// was counted: the twenty-second hostile pass).
    #[inline(always)]
    fn count_reload_of(&mut self, from: Location, to: Location, undo: &mut Undo) {
        if let (Location::Host, Location::Device(id)) = (from, to)
            && self.count_reload(id, self.nbytes)
        {
            undo.reload = Some((id, self.nbytes));
        }
    }

    fn allocate_host(&mut self, undo: &mut Undo, stats: &mut TransferStats) -> Result<()> {
        if self.host.is_none() {
            let block = self.resource.allocate_host(&self.home, self.nbytes, self.pinned)?;
            let block = self.checked_host_block(block)?;
            // Recorded with the transition of the observed plan it serves, if one runs.
            let in_plan = self.in_recorded_plan();
            self.observe_host_allocation(&block, in_plan);
            self.host = Some(block);
            undo.host_block = true;
            stats.allocations += 1;
        }
        Ok(())
    }

    /// `block`, just taken from the buffer's resource for its host copy, if it is one the
    /// buffer may use ([`check_block`]: long enough, page-locked for a pinned buffer); else it
    /// goes back and the error names what was expected.
    pub(super) fn checked_host_block(&self, block: HostMemory) -> Result<HostMemory> {
        let block = Block::Host(block);
        let kind = Kind::Host { pinned: self.pinned };
        if let Err(err) = check_block(&*self.resource, &self.home, kind, self.nbytes, &block) {
            self.resource.deallocate(&self.home, block, &self.home.stream(), Ticket::done());
            // Its pool lookup, if any, served no allocation.
            crate::observe::forget_pool_lookup();
            return Err(err);
        }
        let Block::Host(block) = block else { unreachable!("a host block was just made") };
        Ok(block)
    }

    fn allocate_on(&mut self, device: &Device, undo: &mut Undo, stats: &mut TransferStats) -> Result<()> {
        let backend = device.backend();
        let stream = if *device == self.home { self.stream.clone() } else { device.stream() };
        let memory = if backend.zero_copy(self.nbytes) {
            // The device's copy is the host block itself: make sure the block exists (its
            // residency stays as it is), then alias it.
            self.allocate_host(undo, stats)?;
            let host = self.host.as_mut().expect("the host block was just ensured");
            backend.alias_host(host, self.nbytes).unwrap_or_else(|| {
                Err(Error::invalid(
                    "alias_host",
                    format!(
                        "{device} reports zero-copy for {} bytes but did not alias the host block",
                        self.nbytes
                    ),
                ))
            })?
        } else {
            // The plan's host allocation, if unrecorded, before this one's pool lookup.
            self.record_allocation();
            let memory = self.resource.allocate_device(device, self.nbytes, &stream)?;
            let block = Block::Device(memory);
            if let Err(err) = check_block(&*self.resource, device, Kind::Device, self.nbytes, &block) {
                self.resource.deallocate(device, block, &stream, Ticket::done());
                // Its pool lookup, if any, served no allocation.
                crate::observe::forget_pool_lookup();
                return Err(err);
            }
            let Block::Device(memory) = block else { unreachable!("a device block was just made") };
            stats.allocations += 1;
            trace::record_allocate(self.id, device, MemoryKind::Device, memory.len());
            memory
        };
        self.copies.push(DeviceCopy::new(device.clone(), stream, memory));
        undo.device = Some(device.id());
        Ok(())
    }

    /// Enqueues one copy of the whole buffer, ordered after `after` (the plan's previous copy,
    /// when it was not waited for).
    #[inline(always)]
    pub(super) fn copy(
        &mut self,
        from: Location,
        to: Location,
        stats: &mut TransferStats,
        after: Option<Ticket>,
    ) -> Result<Ticket> {
        let n = self.nbytes;
        match (from, to) {
            (Location::Host, Location::Device(id)) => {
                let i = self.copy_index(id).expect("a copy target is allocated");
                let host = self.host.as_mut().expect("a valid host is allocated");
                let copy = &mut self.copies[i];
                copy.before_transfer(host, after.as_ref())?;
                // SAFETY: the host block stays allocated and unwritten until the ticket
                // completes: every later write of the host location, and every free of the
                // block, first settles this transfer (see inflight.rs), and blocking calls
                // wait for it before returning.
                let ticket = unsafe { copy.stream.upload(HostSpan::of(host, n), &mut copy.memory)? };
                copy.written();
                stats.record(Direction::HostToDevice, copy.memory.is_host_alias(), n);
                Ok(ticket)
            }
            (Location::Device(id), Location::Host) => {
                let i = self.copy_index(id).expect("a copy source is allocated");
                let host = self.host.as_mut().expect("a copy target is allocated");
                let copy = &mut self.copies[i];
                copy.before_transfer(host, after.as_ref())?;
                host.mark_written();
                // SAFETY: the host block stays allocated and untouched until the ticket
                // completes: every later access of the host location, and every free of the
                // block, first settles this transfer, and blocking calls wait for it.
                let ticket = unsafe { copy.stream.download(&copy.memory, HostSpan::of(host, n))? };
                stats.record(Direction::DeviceToHost, copy.memory.is_host_alias(), n);
                Ok(ticket)
            }
            (Location::Device(a), Location::Device(b)) => {
                let (i, j) = (self.copy_index(a).expect("source"), self.copy_index(b).expect("target"));
                let (src, dst) = pair_mut(&mut self.copies, i, j);
                // The peer copy runs on the target's stream: order it after the source's use.
                let source_use = src.last_use()?;
                dst.stream.wait_for(&source_use)?;
                dst.order_stream()?;
                if let Some(after) = after {
                    dst.stream.wait_for(&after)?;
                }
                let direct = dst.stream.copy_from_peer(&src.device, &src.memory, &mut dst.memory, n);
                let ticket = direct.unwrap_or_else(|| {
                    Err(Error::invalid(
                        "copy",
                        format!("{} cannot copy directly from {}", dst.device, src.device),
                    ))
                })?;
                dst.written();
                stats.device_to_device.add(n);
                Ok(ticket)
            }
            (Location::Host, Location::Host) => Ok(Ticket::done()),
        }
    }

    /// Frees what one execution allocated; `ready` completes when the work that used it has.
    pub(super) fn rollback(&mut self, undo: Undo, ready: Ticket) {
        if let Some((id, bytes)) = undo.reload {
            self.uncount_reload(id, bytes);
        }
        // What it frees was allocated first.
        self.record_allocation();
        if let Some(id) = undo.device
            && let Some(i) = self.copy_index(id)
        {
            let copy = self.copies.remove(i);
            copy.device.record_deferred(ready.wait());
            give_back(&*self.resource, copy, self.id);
        }
        if undo.host_block
            && let Some(block) = self.host.take()
        {
            give_back_host(&*self.resource, &self.home, block, ready, self.id);
        }
    }
}

/// A stream's work waited for here, for when no marker can be had: a done ticket after. A
/// failure is recorded on the stream's device ([`Device::take_deferred_errors`]).
pub(super) fn synchronized(stream: &Stream) -> Ticket {
    stream.device().record_deferred(stream.synchronize());
    Ticket::done()
}

/// A ticket that completes when the caller's use of `copy` has; when no marker of its stream
/// can be had, the stream is waited for here and the failure recorded on its device.
pub(super) fn last_use_or_synchronized(copy: &mut DeviceCopy) -> Ticket {
    match copy.last_use() {
        Ok(ticket) => ticket,
        Err(err) => {
            copy.device.record_deferred_error(err);
            synchronized(&copy.stream)
        }
    }
}

/// Returns a device copy's memory, which buffer `buffer` owned, to the resource, after the
/// caller's use of it (aliases own no memory: just dropped).
pub(super) fn give_back(resource: &dyn MemoryResource, mut copy: DeviceCopy, buffer: u64) {
    if copy.memory.is_host_alias() {
        drop(copy.memory);
        return;
    }
    let ready = last_use_or_synchronized(&mut copy);
    trace::record_free(Some(buffer), &copy.device, MemoryKind::Device, copy.memory.len());
    resource.deallocate_device(&copy.device, copy.memory, &copy.stream, ready);
}

/// Gives a host block of buffer `buffer` back to the resource it came from once `ready`
/// completes; an adopted block, which no resource allocated, goes back to its lender instead,
/// after `ready`.
pub(super) fn give_back_host(
    resource: &dyn MemoryResource,
    home: &Device,
    block: HostMemory,
    ready: Ticket,
    buffer: u64,
) {
    // An adopted block's return is no free.
    if !block.is_adopted() {
        trace::record_free(Some(buffer), home, MemoryKind::host(block.is_pinned()), block.len());
    }
    give_back_host_unrecorded(resource, home, block, ready);
}

/// [`give_back_host`] recording nothing: for a release whose state transition records the
/// free with it ([`RawBuffer::release_memory`]).
pub(super) fn give_back_host_unrecorded(
    resource: &dyn MemoryResource,
    home: &Device,
    block: HostMemory,
    ready: Ticket,
) {
    if block.is_adopted() {
        // Its lender may reuse the bytes at once: nothing may still read or write them.
        home.record_deferred(ready.wait());
        drop(block);
        return;
    }
    resource.deallocate_host(home, block, ready);
}

fn pair_mut<T>(items: &mut [T], i: usize, j: usize) -> (&mut T, &mut T) {
    assert_ne!(i, j, "a copy between one location and itself");
    if i < j {
        let (a, b) = items.split_at_mut(j);
        (&mut a[i], &mut b[0])
    } else {
        let (a, b) = items.split_at_mut(i);
        (&mut b[0], &mut a[j])
    }
}
