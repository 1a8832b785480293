//! Reads into memory outside the buffer: the current bytes copied once into a block the
//! caller owns ([`RawBuffer::read_into`]), straight from the device copy when the host copy
//! is stale.
//!
//! Updating a stale host copy and then copying it out moves the data twice; reading the
//! current device copy straight into the caller's block moves it once, and leaves the buffer
//! as it was: the host copy stays stale, the state does not change and nothing is allocated.
//! That is cheaper unless the host copy is wanted afterwards anyway, which the buffer learns
//! the first time it happens: a host access that has to download after a direct read (a
//! read-modify-write loop on one buffer) makes later reads update the host copy first and
//! copy from it, as a host read followed by a host copy always did. When an upload to the
//! device copy is still in flight in its stream's order, such a read goes the other way
//! round: downloaded into the caller's block behind the upload, then copied into the host
//! copy once one wait has shown the upload succeeded ([`RawBuffer::read_staged`]: one wait,
//! not two). A caller's block that is the buffer's own lent host memory always takes the
//! host read.
//!
//! What does not live here: choosing the plan ([`crate::coherence`]), the plan's own copies
//! ([`super::execute`]).

use super::RawBuffer;
use crate::backend::HostSpan;
use crate::buffer::stats::Direction;
use crate::coherence::{Access, Location, Plan, Residency, Step};
use crate::error::{Error, Result};
use crate::host_memory::{HostMemory, copy_bytes_raw};

impl RawBuffer {
    /// Copies the buffer's current bytes into the first `nbytes` of `out`, once:
    ///
    /// - the host copy is current (or nothing is: the buffer reads as zeros), or this buffer
    ///   has had its host copy downloaded after an earlier direct read: a host read
    ///   ([`Self::host_access`] with [`Access::Read`], which updates the host copy), then one
    ///   host copy into `out`;
    /// - else the current device copy is downloaded straight into `out`
    ///   ([`Self::download_into`]): the state stays as it was.
    ///
    /// `out` must not be the buffer's own host block (it is the caller's memory, which may
    /// overlap it only when it was lent to the buffer: then the copy runs as `memmove`).
    /// A failure changes neither the state nor any copy of the buffer; `out`'s bytes are then
    /// unspecified.
    pub fn read_into(&mut self, out: &mut HostMemory) -> Result<()> {
        let n = self.nbytes;
        if out.len() < n {
            return Err(Error::invalid(
                "read_into",
                format!("expected a block of at least {n} bytes, got {}", out.len()),
            ));
        }
        // `out` may be memory lent to the buffer as its host copy too: a download into it
        // behind an upload that then fails would overwrite the bytes that upload was to take
        // and its undoing makes current again (a hostile pass, 2026-11-28). The host read
        // learns the upload's outcome first.
        let out_is_host = self.host.as_ref().is_some_and(|host| overlaps(host, out));
        if let Some(index) = self.direct_source().filter(|_| !out_is_host) {
            let plan = self.plan(Location::Host, None, Access::Read);
            self.download_behind_uploads(index, &plan, out, super::observed::READ_INTO)?;
            self.direct_read = true;
            return Ok(());
        }
        if let Some((index, plan)) = self.staged_source().filter(|_| !out_is_host) {
            return self.read_staged(index, &plan, out);
        }
        self.settle_for(Location::Host, None, Access::Read)?;
        let source = self.host_access(Access::Read)?.as_ptr();
        if n > 0 {
            out.mark_written();
            // SAFETY: the host copy holds n readable bytes, and nothing writes it while
            // `self` is borrowed mutably here; `out` holds at least n writable bytes (checked
            // above). They may share bytes only when `out` is memory lent to both, and
            // copy_bytes_raw copies as memmove does.
            unsafe { copy_bytes_raw(out.as_mut_ptr(), source, n) };
        }
        Ok(())
    }

    /// The index of the device copy a read into outside memory should take the bytes from
    /// directly, when there is one: the host copy is stale or unallocated, a device copy is
    /// current, and the host copy has not been wanted after such a read.
    fn direct_source(&self) -> Option<usize> {
        if self.host_sync_pays || self.nbytes == 0 {
            return None;
        }
        if self.coherence.residency(Location::Host) == Residency::Valid || !self.coherence.any_valid() {
            return None;
        }
        let plan = self.plan(Location::Host, None, Access::Read);
        plan.steps().iter().find_map(|step| match *step {
            Step::Copy { from: Location::Device(id), to: Location::Host } => self.copy_index(id),
            _ => None,
        })
    }

    /// The device copy to read through `out` into the stale host copy
    /// ([`Self::read_staged`]), with the plan of the host read it stands for: when the host
    /// copy is wanted after reads (a read-modify-write loop on one buffer), its plan is one
    /// download from a device copy of its own memory, and an upload to that copy, ordered on
    /// its stream, is still in flight.
    fn staged_source(&self) -> Option<(usize, Plan)> {
        if !self.host_sync_pays || self.nbytes == 0 || self.host.is_none() || self.on_disk.is_some() {
            return None;
        }
        let plan = self.plan(Location::Host, None, Access::Read);
        let [Step::Copy { from: Location::Device(id), to: Location::Host }] = *plan.steps() else {
            return None;
        };
        let index = self.copy_index(id)?;
        let pays = !self.copies[index].memory.is_host_alias()
            && self.inflight.iter().any(|op| op.is_ordered_upload_to(id));
        pays.then_some((index, plan))
    }

    /// A read into `out` that also updates the host copy, with one wait where the host read
    /// and the copy out wait twice. The host read would download into the host copy, which the
    /// upload in flight reads and which must still hold the bytes if that upload fails, so it
    /// must learn the upload's outcome first (a wait) before its own download (another). Here
    /// the download goes into `out`, on the copy's stream behind the upload; one wait sees
    /// both; once the upload is known to have succeeded, the host copy is filled from `out`
    /// and becomes current, as the host read would have left it. The same copies (one
    /// download, one host copy) and counters; a failure leaves the host copy and the state as
    /// they were (`out`'s bytes are then unspecified).
    fn read_staged(&mut self, index: usize, plan: &Plan, out: &mut HostMemory) -> Result<()> {
        let n = self.nbytes;
        // Named as the host read it stands for (the guard's verdict on the call must not depend
        // on whether an upload is still in flight: a hostile pass, 2026-11-28).
        self.download_behind_uploads(index, plan, out, super::observed::HOST)?;
        self.observe_state_as(super::observed::HOST, |buffer| {
            let host = buffer.host.as_mut().expect("staged_source checked the host copy is allocated");
            // SAFETY: `out` holds at least n bytes, just written by the download (read_into
            // checked its length); the host block holds n writable bytes and is borrowed
            // mutably here with the buffer. They may share bytes only when `out` is memory lent
            // to both (read_into's contract), and copy_bytes_raw copies as memmove does.
            unsafe { copy_bytes_raw(host.as_mut_ptr(), out.as_mut_ptr(), n) };
            buffer.coherence.commit(Location::Host, Access::Read, plan);
        });
        Ok(())
    }

    /// Downloads device copy `index` (current) into `out` for the host read `plan` stands
    /// for, and counts it: the transfers that read conflicts with are settled first, except
    /// the uploads to that copy in its stream's order, which run before the download (it is
    /// enqueued on that stream) and are settled after it without a wait of their own
    /// (inflight.rs). An upload's failure comes first: the download then read what it never
    /// wrote, and is neither counted nor recorded.
    fn download_behind_uploads(
        &mut self,
        index: usize,
        plan: &Plan,
        out: &mut HostMemory,
        cause: crate::observe::Cause,
    ) -> Result<()> {
        let id = self.copies[index].device.id();
        let (reads, writes) = self.touched(plan, Location::Host, None, Access::Read);
        self.settle(|op| op.conflicts(&reads, &writes) && !op.is_ordered_upload_to(id))?;
        let downloaded = self.download_into(index, out, cause);
        let settled = self.settle_after(downloaded.is_ok(), |op| op.is_ordered_upload_to(id));
        let started = settled.and(downloaded)?;
        let copy = &self.copies[index];
        if let Some(started) = started {
            started.finished(crate::observe::stream_id(&copy.stream));
        }
        self.stats.record(Direction::DeviceToHost, copy.memory.is_host_alias(), self.nbytes);
        Ok(())
    }

    /// The direct-download path: copies device copy `index` (current) into the first
    /// `nbytes` of `out`, on the copy's stream after the caller's work on it, and waits. The
    /// transfer counters count it as the download it is (a zero-copy sync when the copy
    /// aliases host memory), so whatever watches them sees every read-back; the state and
    /// the buffer's copies are unchanged. The guard and the recorder see it as `cause`'s.
    fn download_into(
        &mut self,
        index: usize,
        out: &mut HostMemory,
        cause: crate::observe::Cause,
    ) -> Result<Option<crate::observe::Started>> {
        let n = self.nbytes;
        let from = Location::Device(self.copies[index].device.id());
        // After the buffer's allocation, if unrecorded yet (events in order).
        self.record_allocation();
        // Seen by the transfer guard (which may refuse it: nothing has changed yet) and the
        // recorder, as the plans' copies are.
        let started = self.observe_outside_copy(from, Location::Host, cause)?;
        let copy = &mut self.copies[index];
        copy.before_transfer(out, None)?;
        out.mark_written();
        // SAFETY: `out` is the caller's block of at least n bytes (checked by read_into),
        // borrowed mutably for this call, and the download is waited for before it returns;
        // the device copy stays allocated and unwritten meanwhile (`self` is borrowed).
        let ticket = unsafe { copy.stream.download(&copy.memory, HostSpan::of(out, n))? };
        ticket.wait()?;
        Ok(started)
    }

    /// Called by every host access that has to copy: once the host copy is wanted after a
    /// direct read, later reads into outside memory update it first.
    pub(super) fn note_host_download(&mut self, plan: &Plan) {
        if self.direct_read && plan.steps().iter().any(|s| matches!(s, Step::Copy { to: Location::Host, .. }))
        {
            self.host_sync_pays = true;
        }
    }
}

/// Whether two host blocks share a byte.
fn overlaps(a: &HostMemory, b: &HostMemory) -> bool {
    let (a_start, b_start) = (a.as_ptr() as usize, b.as_ptr() as usize);
    a_start < b_start + b.len() && b_start < a_start + a.len()
}
