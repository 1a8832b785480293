//! Transfers in flight: what each one reads and writes, and how to undo it if it fails.
//!
//! An asynchronous sync commits its new state when it is enqueued and records an [`InFlight`]
//! entry. Any later access that touches a location the transfer writes, or writes a location
//! it reads, first settles it: waits for its ticket, and on failure undoes it. Because of that
//! rule a transfer's targets are touched by nothing else until it is settled, so undoing it
//! only has to put its targets back as they were (and free what it allocated). Conflicts are
//! between memories, not names: the host block is shared by the host location and by
//! zero-copy aliases of it, so touching an alias touches the host location too (and nothing
//! can alias, read or write a block a transfer in flight uses, or that a failed one frees).
//!
//! One exception, for the stream-ordered device access ([`super::RawBuffer::device_access_ordered`]):
//! an upload to a device whose ticket is in the order of that device copy's stream
//! ([`InFlight::upload_to`]) is not waited for by work that is ordered after it on that stream
//! anyway: a kernel the caller declares with a bookkeeping write (`mark_device_dirty`), and a
//! download of the copy into memory outside the buffer (`read_into`), which settles the upload
//! once its own download is done. The write then makes the host stale while the upload is
//! still in flight; if the upload fails, undoing it also makes current again what the write
//! made stale ([`InFlight::revalidate`]): the kernel read a copy that never arrived, so its
//! output is not data to keep, and the buffer holds what it held before the upload. So that
//! what it makes current again is current for certain, that write first settles every other
//! transfer, and every later write waits for such an upload ([`InFlight::conflicts`]). A
//! forked child's refusal to ask the runtime is no failure: nothing is undone there.
//!
//! What does not live here: executing plans and freeing memory ([`super::raw`]).

use super::stats::TransferStats;
use crate::backend::Ticket;
use crate::coherence::{Access, Coherence, DeviceId, Location, Plan, Residency, Step};
use crate::error::Error;

/// A handful of locations (a plan touches at most three, and the host block's).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Locations {
    items: [Option<Location>; 4],
}

impl Locations {
    pub(super) fn insert(&mut self, at: Location) {
        if self.contains(at) {
            return;
        }
        if let Some(free) = self.items.iter_mut().find(|item| item.is_none()) {
            *free = Some(at);
        }
    }

    pub(super) fn contains(&self, at: Location) -> bool {
        self.items.contains(&Some(at))
    }

    pub(super) fn is_empty(&self) -> bool {
        self.items.iter().all(Option::is_none)
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = Location> + '_ {
        self.items.iter().flatten().copied()
    }

    fn meets(&self, other: &Locations) -> bool {
        self.iter().any(|at| other.contains(at))
    }
}

/// The locations an access at `at` with `plan` reads and writes: copy sources are read, copy
/// targets written; the accessed location itself is read or written as the access says.
pub(super) fn touched(plan: &Plan, at: Location, access: Access) -> (Locations, Locations) {
    let (mut reads, mut writes) = (Locations::default(), Locations::default());
    for step in plan.steps() {
        match *step {
            Step::Allocate(loc) => writes.insert(loc),
            Step::Copy { from, to } => {
                reads.insert(from);
                writes.insert(to);
            }
        }
    }
    match access {
        Access::Read => reads.insert(at),
        Access::Write | Access::Overwrite => writes.insert(at),
    }
    (reads, writes)
}

/// What one execution allocated, to free again if it fails.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Undo {
    /// The host block was allocated by it.
    pub(super) host_block: bool,
    /// The device copy on this device was allocated by it.
    pub(super) device: Option<DeviceId>,
    /// It counted an upload of these bytes to this device as the reload of an evicted copy
    /// ([`crate::spill::SpillStats::bytes_read_back`]): uncounted if it fails.
    pub(super) reload: Option<(DeviceId, usize)>,
}

/// One asynchronous transfer not yet settled.
#[derive(Debug)]
pub(super) struct InFlight {
    pub(super) ticket: Ticket,
    pub(super) reads: Locations,
    pub(super) writes: Locations,
    /// The residency of each written location before the transfer.
    pub(super) before: Vec<(Location, Residency)>,
    pub(super) undo: Undo,
    /// What the transfer added to the buffer's counters.
    pub(super) stats: TransferStats,
    /// Its plan's number in the recorder's events (0: none of its copies was recorded), for
    /// the rollback event when it fails.
    pub(super) op: u64,
    /// The device it uploads to when it is only host-to-device copies into that device's copy,
    /// each in the order of the copy's stream: work later on that stream runs after it.
    pub(super) upload_to: Option<DeviceId>,
    /// Locations that were current when a write ordered after this upload made them stale:
    /// made current again if the upload fails (module docs).
    pub(super) revalidate: Locations,
    /// Its failure was returned once without settling it
    /// ([`super::RawBuffer::unreported_failure_for_host`]).
    pub(super) reported: bool,
    /// The spill file of the host copy read back for it ([`super::RawBuffer::sync_async`] of a
    /// buffer spilled to disk), kept until it settles: removed when it succeeds; when it
    /// fails, the file holds the host copy again and the block read back is given back, as a
    /// blocking call that fails leaves it.
    pub(super) read_back: Option<crate::spill::disk::SpillFile>,
}

impl InFlight {
    /// Whether an access that reads `reads` and writes `writes` must wait for this transfer.
    /// An upload with locations to make current again if it fails ([`Self::revalidate`])
    /// conflicts with every write: undoing it after a later write elsewhere would make an old
    /// copy current beside the newer one (found by the model test, 2026-11-27).
    pub(super) fn conflicts(&self, reads: &Locations, writes: &Locations) -> bool {
        self.writes.meets(reads)
            || self.writes.meets(writes)
            || self.reads.meets(writes)
            || (!self.revalidate.is_empty() && !writes.is_empty())
    }

    /// Puts the transfer's targets back to their residency before it. A transfer never copies
    /// into a valid location, so a location valid before it (the host, counted written only
    /// because an alias of its block was made) is left as later accesses made it.
    pub(super) fn undo_state(&self, coherence: &mut Coherence) {
        for &(at, residency) in &self.before {
            if residency != Residency::Valid {
                coherence.restore(at, residency);
            }
        }
        for at in self.revalidate.iter() {
            coherence.restore(at, Residency::Valid);
        }
    }

    /// Whether it is an upload to `device` in the order of that copy's stream
    /// ([`Self::upload_to`]).
    pub(super) fn is_ordered_upload_to(&self, device: DeviceId) -> bool {
        self.upload_to == Some(device)
    }

    /// Whether the transfer has failed, as far as is known now (no waiting). A forked child's
    /// refusal to ask the runtime ([`Error::ForkedChild`]) is no failure of the transfer: in
    /// the child nothing is known of it, and its state stays as the parent committed it.
    pub(super) fn has_failed(&self) -> bool {
        self.failure().is_some()
    }

    /// The transfer's failure, as far as is known now (no waiting); see [`Self::has_failed`].
    pub(super) fn failure(&self) -> Option<Error> {
        match self.ticket.poll() {
            Err(Error::ForkedChild { .. }) | Ok(_) => None,
            Err(err) => Some(err),
        }
    }
}
