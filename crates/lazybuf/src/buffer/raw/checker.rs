//! The coherence checker's comparison (see [`crate::checking`](mod@crate::checking)): before a host read or a host
//! write that keeps the bytes it does not change (not an overwrite), a valid
//! host copy must equal every valid device copy handed out since lazybuf last wrote it, on a
//! device that does not alias it; a difference means a kernel wrote the copy without
//! `mark_device_dirty()`.
//!
//! Its read of a device copy is no transfer: the transfer counters do not count it and the
//! transfer guard does not refuse it (the user turned the checker on to debug); the recorder
//! shows it as a `CheckerRead` event.
//!
//! What does not live here: the switch ([`crate::checking`](mod@crate::checking)) and when the check runs
//! ([`RawBuffer::host_access`]).

use super::RawBuffer;
use crate::backend::HostSpan;
use crate::buffer::inflight::InFlight;
use crate::coherence::{Location, Residency};
use crate::error::{Error, Result};

impl RawBuffer {
    /// The checker (see [`crate::checking`](mod@crate::checking)): a valid host copy must equal every valid device
    /// copy handed out since lazybuf last wrote it, on a device that does not alias it.
    pub(super) fn check_coherence(&mut self) -> Result<()> {
        // Its reads after the allocation they compare (recorded in that order).
        self.record_allocation();
        // A copy a transfer in flight writes is compared once it has landed: a failed one is
        // undone (the copy is no longer current) and its error returned, never mistaken for a
        // kernel's unmarked write (the model test, 2026-11-27: a failed stream-ordered upload).
        let into_device = |op: &InFlight| op.writes.iter().any(|at| matches!(at, Location::Device(_)));
        if self.inflight.iter().any(into_device) {
            self.settle(into_device)?;
        }
        if self.outside_host_writes > 0 {
            // A write through the host copy is landing outside the lock, and a sync meanwhile
            // may have copied the host copy before it: the copies may differ until it ends
            // (`begin_outside_host_write`), which no kernel caused.
            return Ok(());
        }
        let n = self.nbytes;
        let Some(host) = self.host.as_ref() else { return Ok(()) };
        let mut scratch = Vec::new();
        for copy in &mut self.copies {
            let at = Location::Device(copy.device.id());
            if !copy.handed_out_since_written()
                || copy.memory.is_host_alias()
                || self.coherence.residency(at) != Residency::Valid
            {
                continue;
            }
            copy.wait_for_use()?;
            if scratch.is_empty() {
                // Sized by the user's buffer: a failed allocation is an error, never an abort.
                scratch.try_reserve_exact(n).map_err(|_| Error::OutOfMemory {
                    device: "the host (the coherence checker's copy of the device data)".into(),
                    requested: n,
                    code: None,
                })?;
                scratch.resize(n, 0);
            }
            // Recorded as what it is: a read for the comparison, not a transfer (no counter
            // counts it and the transfer guard does not refuse it: the checker was turned on).
            let start = crate::observe::emitting().then(crate::observe::trace::now);
            // SAFETY: scratch lives and is untouched until the ticket is waited for, here.
            unsafe { copy.stream.download(&copy.memory, HostSpan::of_mut_slice(&mut scratch))? }.wait()?;
            if let Some(start) = start {
                crate::observe::trace::record_checker_read(self.id, &copy.device, n, start);
            }
            if let Some(first_difference) =
                scratch.iter().zip(&host.as_slice()[..n]).position(|(d, h)| d != h)
            {
                return Err(Error::Coherence {
                    device: copy.device.to_string(),
                    first_difference,
                    nbytes: n,
                });
            }
        }
        Ok(())
    }
}
