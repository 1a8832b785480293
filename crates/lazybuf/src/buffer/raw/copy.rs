//! [`DeviceCopy`]: a buffer's copy on one device, and what the caller may still be doing with
//! it.
//!
//! A copy handed out through a view is *used*: the caller may have kernels on the copy's
//! stream that read or write it. Later work is ordered after that use through a marker of the
//! stream taken when it matters ([`DeviceCopy::last_use`]), plus any ticket the caller gave
//! ([`DeviceCopy::used_until`]). For the coherence checker the copy also remembers whether it
//! was handed out (for reading or writing) since lazybuf last filled or wrote it.
//!
//! What does not live here: when a use must be waited for (the accesses in [`super`]), and
//! the transfers themselves ([`super::execute`]).

use crate::backend::{DeviceMemory, Ticket};
use crate::device::{Device, Stream};
use crate::error::Result;
use crate::host_memory::HostMemory;

/// A buffer's copy on one device.
pub(in crate::buffer) struct DeviceCopy {
    pub(in crate::buffer) device: Device,
    /// The stream its transfers (and the caller's kernels, ideally) run on.
    pub(in crate::buffer) stream: Stream,
    pub(in crate::buffer) memory: DeviceMemory,
    /// Handed out through a view since a marker was last taken: the caller may have work on
    /// `stream` that uses it.
    used: bool,
    /// Work the caller said uses the memory, and markers of `stream` taken for it.
    external: Ticket,
    /// For the checker: handed out since lazybuf last filled or wrote it (the caller may keep
    /// the handle and write through it later, whatever it was handed out for).
    handed_out: bool,
}

impl DeviceCopy {
    /// A copy in `memory` on `device`, whose transfers run on `stream`; not yet handed out.
    pub(super) fn new(device: Device, stream: Stream, memory: DeviceMemory) -> DeviceCopy {
        DeviceCopy { device, stream, memory, used: false, external: Ticket::done(), handed_out: false }
    }

    /// Records that the copy is handed out to the caller (a view, or a handle for kernels).
    /// Handed out for writing too, it stays in the checker's eye: a `mark_device_dirty()` does
    /// not end what a handle kept from `.device` can do later (a hostile pass, 2026-11-27:
    /// the mark hid the next unmarked kernel write from the checker).
    pub(super) fn hand_out(&mut self) {
        self.used = true;
        self.handed_out = true;
    }

    /// Records that lazybuf itself filled or wrote the copy: an earlier hand-out no longer
    /// matters to the checker.
    pub(super) fn written(&mut self) {
        self.handed_out = false;
    }

    /// Whether the copy was handed out since lazybuf last filled or wrote it (the checker
    /// compares such copies).
    pub(super) fn handed_out_since_written(&self) -> bool {
        self.handed_out
    }

    /// Whether the copy is the host block itself and the caller may still be using it (it was
    /// handed out, or work outside its stream was declared on it): a host access waits first.
    #[inline(always)]
    pub(super) fn aliased_in_use(&self) -> bool {
        self.memory.is_host_alias() && (self.used || !self.external.is_trivially_done())
    }

    /// A ticket that completes when the caller's use of the memory so far has.
    pub(super) fn last_use(&mut self) -> Result<Ticket> {
        if self.used {
            let marker = self.stream.marker()?;
            self.used = false;
            // A marker just taken is not polled (it has almost never completed yet, and a poll
            // is a runtime call); nor joined with nothing (a joint ticket is an allocation).
            self.join_external(marker);
            return Ok(self.external.clone());
        }
        if matches!(self.external.poll(), Ok(true)) {
            self.external = Ticket::done();
        }
        Ok(self.external.clone())
    }

    /// Orders later work on the copy's own stream after the caller's explicit tickets (its
    /// kernels on the stream itself are ordered already).
    #[inline]
    pub(super) fn order_stream(&mut self) -> Result<()> {
        if !self.external.is_trivially_done() {
            self.stream.wait_for(&self.external)?;
        }
        Ok(())
    }

    /// Readies a transfer between `host` and this copy on the copy's stream: the host block
    /// prepared for the runtime (registered where that pays) unless the copy aliases it, and
    /// the stream ordered after the caller's declared work and after `after` (the previous
    /// copy of a plan that was not waited for).
    #[inline]
    pub(super) fn before_transfer(&mut self, host: &mut HostMemory, after: Option<&Ticket>) -> Result<()> {
        if !self.memory.is_host_alias() {
            self.device.backend().prepare_host(host);
        }
        self.order_stream()?;
        if let Some(after) = after {
            self.stream.wait_for(after)?;
        }
        Ok(())
    }

    /// Waits for the caller's use of the memory so far ([`Self::last_use`]); once it is done,
    /// nothing declared so far needs waiting for again.
    pub(super) fn wait_for_use(&mut self) -> Result<()> {
        self.last_use()?.wait()?;
        self.external = Ticket::done();
        Ok(())
    }

    /// Records that the caller's work `ticket` uses the memory.
    pub(in crate::buffer) fn used_until(&mut self, ticket: Ticket) {
        self.join_external(ticket);
    }

    /// Adds `ticket` to the work the copy's later users wait for, keeping of the earlier work
    /// only the parts still running (or failed: their error is still to be reported). Without
    /// the pruning, a buffer used for a long time (`order_after` before every batch, a view
    /// of a zero-copy copy taken again and again) made every later transfer wait on, and keep,
    /// every ticket it was ever given. One poll per earlier part: a runtime call each, so the
    /// first join after a wait costs nothing ([`Self::wait_for_use`] leaves no parts).
    fn join_external(&mut self, ticket: Ticket) {
        self.external = joined(std::mem::take(&mut self.external), ticket);
    }
}

/// `earlier` and `ticket` as one ticket, without the parts of `earlier` that are done (`ticket`
/// itself is not polled: a marker just taken has almost never completed).
fn joined(earlier: Ticket, ticket: Ticket) -> Ticket {
    if earlier.is_trivially_done() {
        return ticket;
    }
    let running =
        earlier.parts().into_iter().map(Ticket::new).filter(|part| !matches!(part.poll(), Ok(true)));
    Ticket::all(running.chain([ticket]))
}

impl std::fmt::Debug for DeviceCopy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceCopy").field("device", &self.device).field("memory", &self.memory).finish()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;
    use crate::backend::Completion;
    use crate::error::Error;

    /// Work that is done once `done` is set.
    #[derive(Debug, Default)]
    struct Work(AtomicBool);

    impl Completion for Work {
        fn poll(&self) -> Result<bool> {
            Ok(self.0.load(Ordering::Acquire))
        }

        fn wait(&self) -> Result<()> {
            Ok(())
        }
    }

    fn work(done: bool) -> (Arc<Work>, Ticket) {
        let work = Arc::new(Work(AtomicBool::new(done)));
        (work.clone(), Ticket::new(work))
    }

    #[test]
    fn joining_keeps_only_the_work_still_running() {
        // A buffer given a finished ticket before each of 10 000 batches keeps one part, not
        // 10 000 nested ones.
        let mut external = Ticket::done();
        for _ in 0..10_000 {
            external = joined(external, work(true).1);
        }
        assert_eq!(external.parts().len(), 1);
        // Running work stays until it is done; the ticket just given is kept unpolled.
        let (first, running) = work(false);
        external = joined(joined(external, running), work(false).1);
        assert_eq!(external.parts().len(), 2, "{external:?}");
        first.0.store(true, Ordering::Release);
        external = joined(external, work(false).1);
        assert_eq!(external.parts().len(), 2, "{external:?}");
        // A failure is kept to be reported.
        let failed = Ticket::finished(Err(Error::invalid("test", "failed")));
        external = joined(joined(Ticket::done(), failed), work(true).1);
        external = joined(external, work(true).1);
        assert!(external.poll().is_err());
    }
}
