//! The engine's side of [`crate::observe`]: a plan's copies shown to the transfer guard before
//! anything runs, and executed copies, allocations, frees and state transitions shown to the
//! recorder.
//!
//! Each hook in [`super`] and [`super::execute`] is one relaxed atomic load
//! ([`observe::active`] when a plan is made, `observe::emitting` per copy) and a branch to
//! the out-of-line code here, which runs only when something observes. The copies seen are
//! exactly those the transfer counters count: a sync between the host and a device that
//! aliases host memory moves no bytes and is not a copy. Each plan whose copies are recorded
//! gets a number (`op`, given with its first recorded copy): when the plan fails after one of its copies ran, or its
//! asynchronous transfer fails when settled, the counters take its copies back and a rollback
//! event of that number says so; the undoing of a failed asynchronous transfer records its
//! state transition too (`observe_undo`).

use super::RawBuffer;
use crate::backend::Ticket;
use crate::buffer::stats::TransferStats;
use crate::coherence::{Access, BufferState, Location, Plan, Step};
use crate::device::Device;
use crate::error::Result;
use crate::host_memory::HostMemory;
use crate::observe::trace::{self, MemoryKind};
use crate::observe::{self, Cause, Direction, EmitEpoch, TransferInfo};

/// The engine's own causes (calls that name another run in [`observe::call`]).
pub(super) const HOST: Cause = Cause::access("host");
pub(super) const DEVICE: Cause = Cause::access("device");
pub(super) const ADOPT_HOST: Cause = Cause::access("adopt_host");
pub(super) const SYNC_TO_DEVICE: Cause = Cause::sync("sync_to_device");
pub(super) const SYNC_TO_HOST: Cause = Cause::sync("sync_to_host");
pub(super) const SYNC_TO_DEVICE_ASYNC: Cause = Cause::sync("sync_to_device_async");
pub(super) const SYNC_TO_HOST_ASYNC: Cause = Cause::sync("sync_to_host_async");
pub(super) const READ_INTO: Cause = Cause::sync("read_into");
pub(super) const FILL: Cause = Cause::access("fill");
/// A spill's write-back of an evicted device copy: a copy the library decided on.
pub(super) const EVICT: Cause = Cause { call: "evict", reason: observe::Reason::Eviction };

/// The plan a buffer is executing, as the recorder sees it: kept in the buffer
/// ([`RawBuffer`]'s `planned`) from [`RawBuffer::observe_plan`] to its commit or abort (not in
/// a thread-local: an access that makes room by evicting another buffer runs that buffer's
/// copies inside this one's, and a thread-local costs a call in a shared library).
#[derive(Clone, Copy, Debug)]
pub(super) struct Planned {
    /// What names its copies and transition: the buffer's own call ([`RawBuffer::as_call`]),
    /// else the engine's cause for when no [`observe::call`] names another, resolved when an
    /// event is recorded, in the one look at the thread's recorder state that recording takes
    /// (the running call cannot change between a plan and its commit).
    call: trace::Call,
    /// The buffer's state before it.
    before: BufferState,
    /// Whether events were wanted when it was planned.
    emitting: bool,
    /// Its number in copy and rollback events, given with its first recorded copy (0: no copy
    /// of it was recorded).
    op: u64,
    /// The buffer's state events when it was planned.
    events: u64,
    /// Blocks it took that its failure gave back, uncounted: its rollback event says so.
    undone: u64,
}

/// The state events recorded for a buffer: how many, where the last one ended, and the
/// [`EmitEpoch`] it was recorded in. A change that records its transition takes its state
/// before it; when events were recorded in the middle of it (a failed transfer settled and
/// undone inside an access or an invalidation), its transition starts where the last of those
/// ended instead, so a buffer's state events always chain.
///
/// The state before a change is where the buffer's last state event ended when that event
/// was recorded in the epoch that runs now (every change since was recorded: the epoch
/// changes whenever events stop being wanted); only a buffer's first change in an epoch
/// looks its state up ([`RawBuffer::state_before`]).
///
/// It also holds the host block an access allocated while events were wanted, not recorded
/// yet (`allocated`, its bytes): recorded with the access's transition as one record
/// (`trace::record_allocated`), or on its own before anything else of the buffer is recorded
/// or freed ([`RawBuffer::record_allocation`]), so the events keep their order.
#[derive(Clone, Copy, Debug)]
pub(super) struct StateEvents {
    count: u64,
    last: BufferState,
    /// The epoch `last` is known in (`None`: none).
    epoch: Option<EmitEpoch>,
    /// The bytes of the host block allocated and not recorded yet (0: none; an empty block is
    /// recorded at once).
    allocated: usize,
    /// Whether that block is page-locked (its events' kind: `pinned`, else `host`).
    allocated_pinned: bool,
    /// The epoch `allocated` was held in: recorded only in that one (events stopped between
    /// the allocation and its access's commit: no later trace gets the allocation, which
    /// happened before it started).
    allocated_in: EmitEpoch,
}

impl Default for StateEvents {
    fn default() -> Self {
        StateEvents {
            count: 0,
            last: BufferState::Uninitialized,
            epoch: None,
            allocated: 0,
            allocated_pinned: false,
            allocated_in: EmitEpoch::NONE,
        }
    }
}

impl RawBuffer {
    /// What names a copy or change whose engine's cause is `default`: the buffer's own call
    /// ([`Self::as_call`]), whatever call runs on the thread; else `default`, which a running
    /// [`observe::call`] replaces. Spilling's causes (see [`Cause::yields_to_call`]) are
    /// never replaced.
    #[inline]
    fn call_for(&self, default: &Cause) -> trace::Call {
        match self.call {
            Some(own) if default.yields_to_call() => trace::Call::Own(own),
            _ => trace::Call::Of(*default),
        }
    }

    /// The cause the guard judges a copy of this buffer by ([`Self::call_for`]): the
    /// buffer's own call, else the thread's ([`observe::cause_or`]), else `default`.
    fn guard_cause(&self, default: &Cause) -> Cause {
        match self.call {
            Some(own) if default.yields_to_call() => own,
            _ => observe::cause_or(*default),
        }
    }

    /// An access while something observes: its plan's copies shown to the guard first (a
    /// refusal returns before anything changes), then the access, then its state transition.
    #[inline(never)]
    pub(super) fn access_observed(
        &mut self,
        at: Location,
        device: Option<&Device>,
        access: Access,
        cause: &'static Cause,
        stream_ordered: bool,
    ) -> Result<()> {
        // The same plan the access makes next (planning is pure): reused when nothing is on
        // disk (a reload changes what the access plans).
        let plan = self.plan(at, device, access);
        self.observe_plan(&plan, device, cause)?;
        let done = if self.on_disk.is_none() {
            self.access_planned(at, device, access, &plan, stream_ordered)
        } else {
            self.access_unobserved(at, device, access, stream_ordered)
        };
        if let Err(err) = done {
            self.observe_abort();
            return Err(err);
        }
        self.observe_commit();
        Ok(())
    }

    /// Shows the copies of `plan` (an access at the device `device`, or the host) to the
    /// guard, before any of them runs: its refusal is returned and nothing has changed. Only
    /// called while [`observe::active`].
    #[inline(always)]
    pub(super) fn observe_plan(
        &mut self,
        plan: &Plan,
        device: Option<&Device>,
        default: &Cause,
    ) -> Result<()> {
        // Every plan is committed or aborted before the buffer's next one.
        debug_assert!(self.planned.is_none(), "buffer {}: a plan was left behind", self.id);
        if observe::guarding() {
            self.guard_plan(plan, device, *default)?;
        }
        let epoch = observe::emit_epoch();
        let before = match epoch {
            Some(epoch) => self.state_before(epoch),
            None => BufferState::Uninitialized,
        };
        self.planned = Some(Planned {
            call: self.call_for(default),
            before,
            emitting: epoch.is_some(),
            op: 0,
            events: self.state_events.count,
            undone: 0,
        });
        Ok(())
    }

    /// Whether an observed plan that records its transition is being executed (its host
    /// allocation is recorded with that transition: [`Self::observe_host_allocation`]).
    #[inline]
    pub(super) fn in_recorded_plan(&self) -> bool {
        self.planned.is_some_and(|p| p.emitting)
    }

    /// The state now, for the transition of a change about to begin while events are wanted
    /// (in `epoch`): where the buffer's last state event ended when it was recorded in this
    /// epoch, else looked up ([`StateEvents`]).
    #[inline]
    fn state_before(&self, epoch: EmitEpoch) -> BufferState {
        if self.state_events.epoch == Some(epoch) {
            debug_assert_eq!(
                self.state_events.last,
                self.committed_state(),
                "buffer {}: its state changed without a state event",
                self.id
            );
            return self.state_events.last;
        }
        self.committed_state()
    }

    /// The state as the accesses so far committed it, for state events: transfers in flight
    /// count as done even when one is known to have failed (unlike [`Self::state`]), until
    /// its failure is settled and undone, which records its own transition (`rollback`). So
    /// every change of it is an event, and a buffer's state events chain, each starting where
    /// the one before ended (a failure learnt between two accesses changed the public state
    /// with no event, and the next event started elsewhere; `tests/observe_model.rs`).
    #[inline]
    fn committed_state(&self) -> BufferState {
        self.coherence.state(Location::Device(self.home.id()))
    }

    /// Records the transition of a change that began in state `before`, when `events` state
    /// events had been recorded (see [`StateEvents`]), to the state now (none when unchanged),
    /// events being wanted in `epoch`; with it, in one record, the host block the change's
    /// access allocated, if that is not recorded yet ([`StateEvents`]).
    fn record_transition(&mut self, before: BufferState, events: u64, call: trace::Call, epoch: EmitEpoch) {
        if self.state_events.allocated != 0 {
            return self.record_allocated_transition(before, events, call, epoch);
        }
        self.record_transition_with(before, events, epoch, |buffer, from, to| {
            trace::record_state(buffer.id, from, to, call);
        });
    }

    /// [`Self::record_transition`] of an access that allocated the host block: the allocation
    /// and the transition as one record. (Each kind of record its own function and closure:
    /// a shared one, its kind matched at run time, kept the staging out of line.)
    #[inline(never)]
    fn record_allocated_transition(
        &mut self,
        before: BufferState,
        events: u64,
        call: trace::Call,
        epoch: EmitEpoch,
    ) {
        let bytes = std::mem::take(&mut self.state_events.allocated);
        if self.state_events.allocated_in != epoch {
            // Held in an earlier epoch: not this trace's (see `StateEvents`); `allocated` is 0
            // now, so this records the transition alone.
            return self.record_transition(before, events, call, epoch);
        }
        let kind = MemoryKind::host(self.state_events.allocated_pinned);
        self.record_transition_with(before, events, epoch, |buffer, from, to| {
            trace::record_allocated(buffer.id, &buffer.home, kind, bytes, from, to, call);
        });
    }

    /// Records the transition of a change that began in state `before`, when `events` state
    /// events had been recorded (see [`StateEvents`]), to the state now, through `record` (the
    /// buffer, the state before and after; it records nothing of the transition when they
    /// are equal), events being wanted in `epoch`.
    #[inline(always)]
    fn record_transition_with(
        &mut self,
        before: BufferState,
        events: u64,
        epoch: EmitEpoch,
        record: impl FnOnce(&Self, BufferState, BufferState),
    ) {
        let before = if self.state_events.count == events { before } else { self.state_events.last };
        let after = self.committed_state();
        let mut count = self.state_events.count;
        if before != after {
            count = count.wrapping_add(1);
        }
        record(self, before, after);
        // The held allocation is recorded by now (each caller took it, or recorded it first):
        // the rest of `StateEvents` stays as it is.
        debug_assert_eq!(self.state_events.allocated, 0, "buffer {}: an allocation left held", self.id);
        self.state_events.count = count;
        self.state_events.last = after;
        self.state_events.epoch = Some(epoch);
    }

    /// A host block of `bytes` this buffer just allocated while events are wanted. Within an
    /// access that commits next (`with_transition`: an observed plan, or the in-place
    /// overwrite's allocation that its access follows), it is recorded with the access's state
    /// transition, as one record; otherwise now.
    #[inline]
    pub(super) fn observe_host_allocation(&mut self, block: &HostMemory, with_transition: bool) {
        let Some(epoch) = observe::emit_epoch() else {
            return;
        };
        self.record_allocation();
        let (bytes, pinned) = (block.len(), block.is_pinned());
        if with_transition && bytes > 0 {
            self.state_events.allocated = bytes;
            self.state_events.allocated_pinned = pinned;
            self.state_events.allocated_in = epoch;
        } else {
            trace::record_allocate(self.id, &self.home, MemoryKind::host(pinned), bytes);
        }
    }

    /// Records the host block allocated but not recorded yet ([`StateEvents`]), if any: before
    /// anything else of this buffer is recorded, or its memory given back, outside the
    /// transition that would record it.
    #[inline(always)]
    pub(super) fn record_allocation(&mut self) {
        if self.state_events.allocated != 0 {
            self.record_allocation_now();
        }
    }

    #[cold]
    #[inline(never)]
    fn record_allocation_now(&mut self) {
        let bytes = std::mem::take(&mut self.state_events.allocated);
        // Only in the epoch it was held in (see `StateEvents`).
        if bytes != 0 && observe::emit_epoch() == Some(self.state_events.allocated_in) {
            let kind = MemoryKind::host(self.state_events.allocated_pinned);
            trace::record_allocate(self.id, &self.home, kind, bytes);
        }
    }

    /// [`Self::release_memory`] while events are wanted (in `epoch`): the host block's free
    /// and the state transition recorded as one record (one look at the thread's recorder
    /// state; collected as the free, then the transition, as separate events).
    #[inline(never)]
    pub(super) fn release_observed(&mut self, epoch: EmitEpoch) {
        self.record_allocation();
        let (before, events) = (self.state_before(epoch), self.state_events.count);
        let call = trace::Call::Named("release_memory");
        let kind = MemoryKind::host(self.is_pinned());
        match self.release_all(true) {
            // (Through `record_transition`: a second caller of the state event's staging
            // would keep it out of line there.)
            None => self.record_transition(before, events, call, epoch),
            Some(bytes) => self.record_transition_with(before, events, epoch, |buffer, from, to| {
                trace::record_released(buffer.id, &buffer.home, kind, bytes, from, to, call);
            }),
        }
    }

    /// The guard's look at `plan`'s copies (see [`Self::observe_plan`]), as the running call's
    /// (else as `default`). Out of line: the recorder's path keeps no frame for it.
    #[cold]
    #[inline(never)]
    fn guard_plan(&self, plan: &Plan, device: Option<&Device>, default: Cause) -> Result<()> {
        let cause = self.guard_cause(&default);
        let copies: Vec<TransferInfo> = plan
            .steps()
            .iter()
            .filter_map(|step| match *step {
                Step::Copy { from, to } => self.transfer_info(from, to, device, cause, true),
                Step::Allocate(_) => None,
            })
            .collect();
        observe::guard::check(&copies)
    }

    /// Whether the guard refuses one of `copies` (`from` -> `to`, at `device`), a step of this
    /// call still to be planned, as the running call's (else as an explicit `sync_to_device`):
    /// checked before an earlier step changes anything. Refusals only: the copies are logged
    /// when their own plan is checked.
    #[cold]
    #[inline(never)]
    pub(super) fn guard_refusal(&self, copies: &[(Location, Location)], device: &Device) -> Result<()> {
        let cause = self.guard_cause(&SYNC_TO_DEVICE);
        for &(from, to) in copies {
            if let Some(copy) = self.transfer_info(from, to, Some(device), cause, true) {
                observe::guard::check_refusal(&copy)?;
            }
        }
        Ok(())
    }

    /// Records the state transition of an access that committed (after [`Self::observe_plan`]);
    /// returns the plan's number when a copy of it was recorded (else 0), for the rollback of
    /// an asynchronous transfer that fails later.
    #[inline]
    pub(super) fn observe_commit(&mut self) -> u64 {
        let planned = self.planned.take();
        match (planned, observe::emit_epoch()) {
            (Some(p), Some(epoch)) if p.emitting => {
                self.record_transition(p.before, p.events, p.call, epoch);
                p.op
            }
            _ => {
                self.record_allocation();
                0
            }
        }
    }

    /// The plan of [`Self::observe_plan`] failed and was undone: the copies recorded for it
    /// are rolled back, as the counters roll them back (its state did not change), and so are
    /// the blocks it took ([`Self::observe_allocations_undone`]).
    #[cold]
    pub(super) fn observe_abort(&mut self) {
        self.record_allocation();
        if let Some(p) = self.planned.take().filter(|p| (p.op != 0 || p.undone != 0) && observe::emitting()) {
            trace::record_rollback(self.id, p.op, p.undone, p.call);
        }
    }

    /// `allocations` blocks this buffer took (and recorded) were given back by the undoing of
    /// a failed call, which the counters do not count: part of the rollback event of the plan
    /// being executed (its abort records it), else a rollback event of their own, named
    /// `call`. (The trace and the counters then agree on allocations too: the nineteenth
    /// hostile pass.)
    #[cold]
    pub(super) fn observe_allocations_undone(&mut self, allocations: u64, call: &'static str) {
        if allocations == 0 || !observe::emitting() {
            return;
        }
        match &mut self.planned {
            Some(p) => p.undone += allocations,
            None => trace::record_rollback(self.id, 0, allocations, trace::Call::Named(call)),
        }
    }

    /// A failed asynchronous transfer was undone (its state put back by `undo`): records the
    /// rollback of its copies (`op`, from [`Self::observe_commit`]; 0 when none was recorded)
    /// and of the `allocations` blocks it took (which the counters take back with it), and
    /// the state transition.
    pub(super) fn observe_undo(&mut self, op: u64, allocations: u64, undo: impl FnOnce(&mut Self)) {
        let Some(epoch) = observe::emit_epoch() else {
            return undo(self);
        };
        self.record_allocation();
        let (before, events) = (self.state_before(epoch), self.state_events.count);
        undo(self);
        if op != 0 || allocations != 0 {
            trace::record_rollback(self.id, op, allocations, trace::Call::Named("rollback"));
        }
        self.record_transition(before, events, trace::Call::Named("rollback"), epoch);
    }

    /// One copy of a plan while events are wanted: as `execute` runs it (enqueued, and waited
    /// for unless `pending` collects its ticket), then recorded.
    pub(super) fn copy_observed(
        &mut self,
        from: Location,
        to: Location,
        stats: &mut TransferStats,
        pending: Option<&mut Vec<Ticket>>,
    ) -> Result<()> {
        // The plan's allocation before its copy, in that order.
        self.record_allocation();
        // A copy that aliases the host block moves no bytes: nothing to time or record.
        let start = self.moves_bytes(from, to).then(trace::now);
        let after = pending.as_deref().and_then(|tickets| tickets.last().cloned());
        let ticket = self.copy(from, to, stats, after)?;
        let waited = match pending {
            Some(tickets) => {
                tickets.push(ticket);
                false
            }
            None => {
                ticket.wait()?;
                true
            }
        };
        if let Some(start) = start {
            self.observe_copy(from, to, start, waited);
        }
        Ok(())
    }

    /// Whether the executed copy `from` -> `to` moves bytes (it is no sync with a copy that
    /// aliases the host block).
    fn moves_bytes(&self, from: Location, to: Location) -> bool {
        let aliased = |id| self.copy_index(id).is_some_and(|i| self.copies[i].memory.is_host_alias());
        match (from, to) {
            (Location::Host, Location::Device(id)) | (Location::Device(id), Location::Host) => !aliased(id),
            (Location::Device(_), Location::Device(_)) => true,
            (Location::Host, Location::Host) => false,
        }
    }

    /// Records one executed copy (`waited`: its call waited for it, which ended just now).
    fn observe_copy(&mut self, from: Location, to: Location, start: u64, waited: bool) {
        let device = |at: Location| match at {
            Location::Host => None,
            Location::Device(id) => self.copy_index(id),
        };
        let (source, target) = (device(from), device(to));
        let Some(direction) = direction_of(from, to) else { return };
        // A sync with a copy that aliases the host block moves no bytes: no copy.
        let aliased = |i: Option<usize>| i.is_some_and(|i| self.copies[i].memory.is_host_alias());
        if direction != Direction::DeviceToDevice && (aliased(source) || aliased(target)) {
            return;
        }
        // The plan's copies share its number, given with the first (outside a plan: none).
        let (cause, op) = match self.planned {
            Some(p) => (p.call, trace::Op::Plan(p.op)),
            None => (self.call_for(&Cause::access("access")), trace::Op::None),
        };
        let on = if direction == Direction::DeviceToHost { source } else { target };
        let op = trace::record_copy(trace::CopyEvent {
            buffer: self.id,
            op,
            direction,
            bytes: self.nbytes,
            from: source.map(|i| &self.copies[i].device),
            to: target.map(|i| &self.copies[i].device),
            cause,
            stream: on.map_or(0, |i| observe::stream_id(&self.copies[i].stream)),
            start,
            waited,
        });
        if let Some(planned) = &mut self.planned {
            planned.op = op;
        }
    }

    /// The copy `from` -> `to` as the guard and recorder see it; `None` when it moves no bytes
    /// (a device copy that aliases the host block). `planned`: the target may not exist yet
    /// (it is `device`, to be allocated by the plan).
    pub(super) fn transfer_info(
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
            _ => direction_of(from, to)?,
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

    /// The guard's and the recorder's view of a copy this buffer makes outside its plans (a
    /// read into outside memory, a spill's write-back or reload), before it starts: a refusal
    /// is returned and the caller must change nothing; `Ok(Some(_))` while recording, to
    /// report the copy's end. The cause is the call's ([`observe::call`]), else `default`. A
    /// sync with a copy that aliases the host block is no copy: nothing to see.
    #[inline]
    pub(super) fn observe_outside_copy(
        &self,
        from: Location,
        to: Location,
        default: Cause,
    ) -> Result<Option<observe::Started>> {
        // A sync with a copy that aliases the host block is no copy: known before the call's
        // cause is looked up (a thread-local) and the copy described.
        if !observe::active() || !self.moves_bytes(from, to) {
            return Ok(None);
        }
        // Described by name for the guard (its errors and log lines); the recorder takes the
        // devices by number.
        if observe::guarding()
            && let Some(info) = self.transfer_info(from, to, None, self.guard_cause(&default), false)
        {
            observe::guard::check(std::slice::from_ref(&info))?;
        }
        if !observe::emitting() {
            return Ok(None);
        }
        let device = |at: Location| match at {
            Location::Host => Some(None),
            Location::Device(id) => self.copy_index(id).map(|i| Some(&self.copies[i].device)),
        };
        let (Some(direction), Some(source), Some(target)) =
            (direction_of(from, to), device(from), device(to))
        else {
            return Ok(None); // no copy between two memories this buffer holds
        };
        Ok(trace::start_outside_copy(
            self.id,
            direction,
            self.nbytes,
            source,
            target,
            self.call_for(&default),
        ))
    }

    /// [`Self::observe_state`] for a change an engine call makes (named by the running
    /// [`observe::call`], else `cause`).
    #[inline]
    pub(super) fn observe_state_as<R>(&mut self, cause: Cause, change: impl FnOnce(&mut Self) -> R) -> R {
        self.observe_change(self.call_for(&cause), change)
    }

    /// Runs `change`, a state change outside the plans (a release, an invalidation, a fill on a
    /// device), and records its transition, named `call`, while events are wanted.
    #[inline]
    pub(super) fn observe_state<R>(&mut self, call: &'static str, change: impl FnOnce(&mut Self) -> R) -> R {
        self.observe_change(trace::Call::Named(call), change)
    }

    /// Runs `change` and records its transition as `call`'s, while events are wanted.
    #[inline]
    fn observe_change<R>(&mut self, call: trace::Call, change: impl FnOnce(&mut Self) -> R) -> R {
        let Some(epoch) = observe::emit_epoch() else {
            return change(self);
        };
        self.record_allocation();
        let (before, events) = (self.state_before(epoch), self.state_events.count);
        let result = change(self);
        self.record_transition(before, events, call, epoch);
        result
    }
}

/// The direction of a copy from `from` to `to` (`None`: host to host, no copy).
fn direction_of(from: Location, to: Location) -> Option<Direction> {
    match (from, to) {
        (Location::Host, Location::Device(_)) => Some(Direction::HostToDevice),
        (Location::Device(_), Location::Host) => Some(Direction::DeviceToHost),
        (Location::Device(_), Location::Device(_)) => Some(Direction::DeviceToDevice),
        (Location::Host, Location::Host) => None,
    }
}
