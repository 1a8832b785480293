//! The engine's side of [`crate::observe`]: a plan's copies shown to the transfer guard before
//! anything runs, and executed copies, allocations, frees and state transitions shown to the
//! recorder.
//!
//! Each hook in [`super`] and [`super::execute`] is one call guarded by one relaxed atomic
//! load ([`observe::active`], `observe::emitting`); everything here runs only when that
//! load says something observes. The copies seen are exactly those the transfer counters
//! count: a sync between the host and a device that aliases host memory moves no bytes and
//! is not a copy.

use std::cell::Cell;
use std::time::Instant;

use super::RawBuffer;
use crate::coherence::{BufferState, Location, Plan, Step};
use crate::device::{Device, Stream};
use crate::error::Result;
use crate::observe::{self, Cause, Direction, TransferInfo};
// `emitting`: the recorder runs or events go to `tracing`.

/// What an observed access remembers between its plan and its commit.
pub(super) struct Observed {
    before: BufferState,
    cause: Cause,
}

thread_local! {
    /// The cause of the plan this thread is executing (for the recorder's copy events).
    static PLANNED: Cell<Option<Cause>> = const { Cell::new(None) };
}

/// The stream's identity in events.
fn stream_id(stream: &Stream) -> usize {
    std::ptr::from_ref(stream.handle()).cast::<()>() as usize
}

impl RawBuffer {
    /// Shows the copies of `plan` (an access at the device `device`, or the host) to the
    /// guard, before any of them runs: its refusal is returned and nothing has changed. Only
    /// called while [`observe::active`].
    #[cold]
    pub(super) fn observe_plan(
        &self,
        plan: &Plan,
        device: Option<&Device>,
        default: Cause,
    ) -> Result<Observed> {
        let cause = observe::cause_or(default);
        let copies: Vec<TransferInfo> = plan
            .steps()
            .iter()
            .filter_map(|step| match *step {
                Step::Copy { from, to } => self.transfer_info(from, to, device, cause, true),
                Step::Allocate(_) => None,
            })
            .collect();
        observe::guard::check(&copies)?;
        let _ = PLANNED.try_with(|p| p.set(Some(cause)));
        Ok(Observed { before: self.state(), cause })
    }

    /// Records the state transition of an access that committed.
    pub(super) fn observe_commit(&self, observed: Observed) {
        if observe::emitting() {
            observe::trace::record_state(self.id, observed.before, self.state(), observed.cause.call);
        }
    }

    /// Records one executed copy (`waited`: its call waited for it, which ended just now).
    #[cold]
    pub(super) fn observe_copy(&self, from: Location, to: Location, start: Instant, waited: bool) {
        let cause = PLANNED.try_with(Cell::get).ok().flatten().unwrap_or(Cause::access("access"));
        let Some(info) = self.transfer_info(from, to, None, cause, false) else { return };
        let on = match (from, to) {
            (Location::Device(id), Location::Host) | (_, Location::Device(id)) => self.copy_index(id),
            (Location::Host, Location::Host) => None,
        };
        let stream = on.map_or(0, |i| stream_id(&self.copies[i].stream));
        let started = observe::started_at(info, start);
        if waited { started.finished(stream) } else { started.enqueued(stream) }
    }

    /// The copy `from` -> `to` as the guard and recorder see it; `None` when it moves no bytes
    /// (a device copy that aliases the host block). `planned`: the target may not exist yet
    /// (it is `device`, to be allocated by the plan).
    fn transfer_info(
        &self,
        from: Location,
        to: Location,
        device: Option<&Device>,
        cause: Cause,
        planned: bool,
    ) -> Option<TransferInfo> {
        let name = |at: Location| -> String {
            match at {
                Location::Host => "host".to_string(),
                Location::Device(id) => match self.copy_index(id) {
                    Some(i) => self.copies[i].device.to_string(),
                    None => device
                        .filter(|d| d.id() == id)
                        .map_or_else(|| format!("device {id:?}"), Device::to_string),
                },
            }
        };
        let aliased = |id| match self.copy_index(id) {
            Some(i) => self.copies[i].memory.is_host_alias(),
            None => planned && device.is_some_and(|d| d.id() == id && d.is_zero_copy(self.nbytes)),
        };
        let direction = match (from, to) {
            (Location::Host, Location::Device(id)) | (Location::Device(id), Location::Host)
                if aliased(id) =>
            {
                return None;
            }
            (Location::Host, Location::Device(_)) => Direction::HostToDevice,
            (Location::Device(_), Location::Host) => Direction::DeviceToHost,
            (Location::Device(_), Location::Device(_)) => Direction::DeviceToDevice,
            (Location::Host, Location::Host) => return None,
        };
        Some(TransferInfo {
            buffer: self.id,
            direction,
            bytes: self.nbytes,
            from: name(from),
            to: name(to),
            cause,
        })
    }
}
