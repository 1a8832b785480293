//! The coherence contract as pure code: which copy of a buffer is valid, and what must move
//! before a copy can be used. No runtime call, no memory, no I/O lives here: [`Coherence`]
//! answers with a [`Plan`] of steps, the buffer executes them, and only when every step has
//! succeeded does it [`Coherence::commit`] the new state. A failed step therefore leaves the
//! state exactly as it was.
//!
//! The rules (SPEC section 1):
//! - Read at L: nothing if L is valid; else allocate L if needed, fill it from a valid
//!   location, and L becomes valid.
//! - Write at L: as Read, then every other location becomes stale. Overwrite skips the fill.
//! - When nothing is valid anywhere, no copy is made and L's contents are unspecified.

use std::fmt;
use std::num::NonZeroU64;

/// The identity of an opened device; never reused within a process. Never zero, so a
/// [`Location`] is one word and comparing two is one instruction (every access compares
/// locations several times).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceId(pub(crate) NonZeroU64);

impl fmt::Debug for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "dev#{}", self.0)
    }
}

/// A place a copy of the buffer can live.
#[derive(Clone, Copy, Debug, Eq, PartialOrd, Ord)]
pub enum Location {
    /// Host memory.
    Host,
    /// The memory of one device.
    Device(DeviceId),
}

impl Location {
    /// The one word a location is (the host 0, a device its id): the derived comparison took
    /// the variant apart first, about six instructions where this takes one.
    #[inline(always)]
    const fn word(self) -> u64 {
        match self {
            Location::Host => 0,
            Location::Device(id) => id.0.get(),
        }
    }
}

/// By the location's one word (the host 0, a device its id), which orders as the derived
/// `Ord` does (the host first, then devices by id), so the two agree.
impl PartialEq for Location {
    #[inline(always)]
    fn eq(&self, other: &Location) -> bool {
        self.word() == other.word()
    }
}

/// By the location's one word, as [`PartialEq`].
impl std::hash::Hash for Location {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.word().hash(state);
    }
}

// One word (the niche of `DeviceId`): see `DeviceId`.
const _: () = assert!(size_of::<Location>() == size_of::<u64>());

/// The state of one location.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Residency {
    /// No memory is allocated there.
    Unallocated,
    /// Memory is allocated but holds out-of-date bytes.
    Stale,
    /// Memory holds the current bytes.
    Valid,
}

/// How a location is about to be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Read: the location must hold the current bytes.
    Read,
    /// Read and write: as `Read`, then every other copy is stale.
    Write,
    /// Write every byte without reading: no fill, then every other copy is stale.
    Overwrite,
}

/// One step of a plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Allocate memory at the location.
    Allocate(Location),
    /// Copy the whole buffer between two locations.
    Copy {
        /// A location that holds the current bytes.
        from: Location,
        /// The location to fill.
        to: Location,
    },
}

/// The most steps a plan can have: allocate the target, allocate the host for staging, copy
/// to the host, copy to the target.
const MAX_STEPS: usize = 4;

/// What must happen before an access can proceed, in order. Held inline: planning an access
/// allocates nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    steps: [Step; MAX_STEPS],
    len: usize,
}

impl Default for Plan {
    fn default() -> Self {
        Plan { steps: [Step::Allocate(Location::Host); MAX_STEPS], len: 0 }
    }
}

impl Plan {
    /// The steps, in execution order.
    pub fn steps(&self) -> &[Step] {
        &self.steps[..self.len]
    }

    /// Whether the access needs no allocation and no copy.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn push(&mut self, step: Step) {
        self.steps[self.len] = step;
        self.len += 1;
    }
}

/// [`Coherence::state`] by the host's [`Residency`] and the device's (`None`: neither is valid).
const STATES: [[Option<BufferState>; 3]; 3] = {
    use BufferState::*;
    [
        // Host unallocated: the device's unallocated, stale, valid.
        [None, None, Some(DeviceOnly)],
        // Host stale.
        [None, None, Some(DeviceDirty)],
        // Host valid.
        [Some(HostOnly), Some(HostDirty), Some(Synchronized)],
    ]
};

/// The state of the buffer as users know it: the host against one device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BufferState {
    /// Nothing is valid anywhere.
    Uninitialized,
    /// Host valid, device not allocated.
    HostOnly,
    /// Device valid, host not allocated.
    DeviceOnly,
    /// Host and device both valid.
    Synchronized,
    /// Host valid, device allocated but stale.
    HostDirty,
    /// Device valid, host allocated but stale.
    DeviceDirty,
    /// Neither the host nor this device is valid, but another device is (only possible when
    /// a buffer is used on several devices).
    Elsewhere,
}

impl BufferState {
    /// Every state, in declaration order (`state as usize` indexes it).
    pub const ALL: [BufferState; 7] = [
        BufferState::Uninitialized,
        BufferState::HostOnly,
        BufferState::DeviceOnly,
        BufferState::Synchronized,
        BufferState::HostDirty,
        BufferState::DeviceDirty,
        BufferState::Elsewhere,
    ];

    /// The seeds' string value (`"host_dirty"`).
    pub fn name(self) -> &'static str {
        match self {
            BufferState::Uninitialized => "uninitialized",
            BufferState::HostOnly => "host_only",
            BufferState::DeviceOnly => "device_only",
            BufferState::Synchronized => "synchronized",
            BufferState::HostDirty => "host_dirty",
            BufferState::DeviceDirty => "device_dirty",
            BufferState::Elsewhere => "elsewhere",
        }
    }
}

impl fmt::Display for BufferState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name().to_uppercase())
    }
}

/// Per-location residency of one buffer. Locations not listed are unallocated.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Coherence {
    entries: Entries,
}

/// How many locations [`Entries`] holds without a heap allocation: the host and one device,
/// every buffer's usual case.
const INLINE_ENTRIES: usize = 2;

/// The listed locations, in the order they were first set: inline up to [`INLINE_ENTRIES`],
/// all on the heap beyond (a buffer made per batch then allocates nothing for its state).
#[derive(Clone, Debug)]
struct Entries {
    inline: [(Location, Residency); INLINE_ENTRIES],
    /// Entries in use in `inline`; unused once `heap` is.
    len: usize,
    /// Every entry, once there are more than fit inline.
    heap: Vec<(Location, Residency)>,
}

impl Default for Entries {
    fn default() -> Self {
        Entries {
            inline: [(Location::Host, Residency::Unallocated); INLINE_ENTRIES],
            len: 0,
            heap: Vec::new(),
        }
    }
}

impl Entries {
    fn as_slice(&self) -> &[(Location, Residency)] {
        if self.heap.is_empty() { &self.inline[..self.len] } else { &self.heap }
    }

    fn as_mut_slice(&mut self) -> &mut [(Location, Residency)] {
        if self.heap.is_empty() { &mut self.inline[..self.len] } else { &mut self.heap }
    }

    fn iter(&self) -> std::slice::Iter<'_, (Location, Residency)> {
        self.as_slice().iter()
    }

    fn iter_mut(&mut self) -> std::slice::IterMut<'_, (Location, Residency)> {
        self.as_mut_slice().iter_mut()
    }

    fn push(&mut self, entry: (Location, Residency)) {
        if !self.heap.is_empty() {
            self.heap.push(entry);
        } else if self.len < INLINE_ENTRIES {
            self.inline[self.len] = entry;
            self.len += 1;
        } else {
            self.heap = self.inline.iter().copied().chain([entry]).collect();
            self.len = 0;
        }
    }

    fn retain(&mut self, keep: impl FnMut(&(Location, Residency)) -> bool) {
        let mut kept: Vec<_> = self.as_slice().iter().copied().filter(keep).collect();
        self.clear();
        if kept.len() > INLINE_ENTRIES {
            self.heap = std::mem::take(&mut kept);
        } else {
            kept.into_iter().for_each(|entry| self.push(entry));
        }
    }

    fn clear(&mut self) {
        self.heap = Vec::new();
        self.len = 0;
    }
}

impl PartialEq for Entries {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for Entries {}

impl Coherence {
    /// A new buffer: nothing allocated anywhere.
    pub fn new() -> Self {
        Self::default()
    }

    /// The residency of one location.
    #[inline]
    pub fn residency(&self, at: Location) -> Residency {
        self.entries.iter().find(|(loc, _)| *loc == at).map_or(Residency::Unallocated, |&(_, r)| r)
    }

    /// Every location that holds memory, with its residency.
    pub fn locations(&self) -> impl Iterator<Item = (Location, Residency)> + '_ {
        self.entries.iter().copied()
    }

    /// Whether any location holds the current bytes.
    #[inline]
    pub fn any_valid(&self) -> bool {
        self.entries.iter().any(|&(_, r)| r == Residency::Valid)
    }

    /// The steps needed before `access` at `at`. `direct(from, to)` tells whether two devices
    /// can copy between each other without the host; host-device copies are always direct.
    #[inline]
    pub fn plan(&self, at: Location, access: Access, direct: impl Fn(DeviceId, DeviceId) -> bool) -> Plan {
        let mut steps = Plan::default();
        let here = self.residency(at);
        if here == Residency::Valid {
            return steps;
        }
        if here == Residency::Unallocated {
            steps.push(Step::Allocate(at));
        }
        if access == Access::Overwrite || !self.any_valid() {
            return steps;
        }
        if self.residency(Location::Host) == Residency::Valid {
            steps.push(Step::Copy { from: Location::Host, to: at });
            return steps;
        }
        let valid_devices = || {
            self.entries.iter().filter_map(|&(loc, r)| match (loc, r) {
                (Location::Device(id), Residency::Valid) => Some(id),
                _ => None,
            })
        };
        let first = valid_devices().next().expect("any_valid() and the host is not valid");
        match at {
            Location::Host => steps.push(Step::Copy { from: Location::Device(first), to: at }),
            Location::Device(target) => match valid_devices().find(|&src| direct(src, target)) {
                Some(src) => steps.push(Step::Copy { from: Location::Device(src), to: at }),
                None => {
                    // Stage through the host, which ends up valid too.
                    if self.residency(Location::Host) == Residency::Unallocated {
                        steps.push(Step::Allocate(Location::Host));
                    }
                    steps.push(Step::Copy { from: Location::Device(first), to: Location::Host });
                    steps.push(Step::Copy { from: Location::Host, to: at });
                }
            },
        }
        steps
    }

    /// Records that `plan` was executed in full for `access` at `at`.
    #[inline]
    pub fn commit(&mut self, at: Location, access: Access, plan: &Plan) {
        for step in plan.steps() {
            match *step {
                Step::Allocate(loc) => self.set(loc, Residency::Stale),
                Step::Copy { to, .. } => self.set(to, Residency::Valid),
            }
        }
        self.set(at, Residency::Valid);
        if access != Access::Read {
            for (loc, r) in self.entries.iter_mut() {
                if *loc != at && *r == Residency::Valid {
                    *r = Residency::Stale;
                }
            }
        }
    }

    /// Forgets every location: the buffer is uninitialized and holds no memory.
    pub fn clear(&mut self) {
        self.entries.clear();
    }

    /// Forgets the contents but keeps the memory: every allocated location becomes stale.
    pub fn invalidate(&mut self) {
        for (_, r) in self.entries.iter_mut() {
            *r = Residency::Stale;
        }
    }

    /// Marks one valid location stale (its bytes can no longer be trusted).
    pub fn mark_stale(&mut self, at: Location) {
        if let Some((_, r)) = self.entries.iter_mut().find(|(loc, r)| *loc == at && *r == Residency::Valid) {
            *r = Residency::Stale;
        }
    }

    /// Drops one location (its memory was freed). The others keep their state.
    pub fn forget(&mut self, at: Location) {
        self.entries.retain(|(loc, _)| *loc != at);
    }

    /// Puts one location back to `residency` (`Unallocated` forgets it): the undo of a
    /// transfer that failed after its plan was committed.
    pub fn restore(&mut self, at: Location, residency: Residency) {
        match residency {
            Residency::Unallocated => self.forget(at),
            residency => self.set(at, residency),
        }
    }

    /// The state of the host against `device`.
    #[inline]
    pub fn state(&self, device: Location) -> BufferState {
        use Residency::*;
        // One pass over the entries (the recorder looks the state up on every change); the
        // inline ones without a loop (their count is not known at compile time, so the loop
        // stayed a loop: about 15 instructions more per look).
        let (mut host, mut here) = (Unallocated, Unallocated);
        let mut note = |&(loc, r): &(Location, Residency)| {
            if loc == Location::Host {
                host = r;
            }
            if loc == device {
                here = r;
            }
        };
        if self.entries.heap.is_empty() {
            let [first, second] = &self.entries.inline;
            if self.entries.len > 0 {
                note(first);
            }
            if self.entries.len > 1 {
                note(second);
            }
        } else {
            self.entries.heap.iter().for_each(note);
        }
        // A table, by the host's residency and then the device's (a match compiled to a chain
        // of comparisons); `None`: neither is valid.
        match STATES[host as usize][here as usize] {
            Some(state) => state,
            None if self.any_valid() => BufferState::Elsewhere,
            None => BufferState::Uninitialized,
        }
    }

    fn set(&mut self, at: Location, residency: Residency) {
        match self.entries.iter_mut().find(|(loc, _)| *loc == at) {
            Some((_, r)) => *r = residency,
            None => self.entries.push((at, residency)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Access::*;
    use Location::Host;

    const D: Location = Location::Device(DeviceId(NonZeroU64::MIN));
    const E: Location = Location::Device(DeviceId(NonZeroU64::MIN.saturating_add(1)));

    fn never(_: DeviceId, _: DeviceId) -> bool {
        false
    }

    fn run(c: &mut Coherence, at: Location, access: Access) -> Vec<Step> {
        let plan = c.plan(at, access, never);
        c.commit(at, access, &plan);
        plan.steps().to_vec()
    }

    #[test]
    fn a_new_buffer_is_uninitialized_and_allocates_on_first_use() {
        let mut c = Coherence::new();
        assert_eq!(c.state(D), BufferState::Uninitialized);
        assert_eq!(run(&mut c, Host, Read), vec![Step::Allocate(Host)]);
        assert_eq!(c.state(D), BufferState::HostOnly);
    }

    #[test]
    fn more_locations_than_fit_inline_keep_their_states_and_order() {
        use Residency::{Stale, Valid};
        let mut c = Coherence::new();
        run(&mut c, Host, Write);
        run(&mut c, D, Read);
        run(&mut c, E, Read);
        assert_eq!(c.locations().collect::<Vec<_>>(), vec![(Host, Valid), (D, Valid), (E, Valid)]);
        assert_eq!(run(&mut c, E, Write), vec![]);
        assert_eq!(c.locations().collect::<Vec<_>>(), vec![(Host, Stale), (D, Stale), (E, Valid)]);
        c.forget(D);
        assert_eq!(c.locations().collect::<Vec<_>>(), vec![(Host, Stale), (E, Valid)]);
        assert_eq!(c.residency(D), Residency::Unallocated);
        // Equal to the same state built without ever leaving the inline entries.
        let mut inline = Coherence::new();
        inline.restore(Host, Stale);
        inline.restore(E, Valid);
        assert_eq!(c, inline);
        run(&mut c, D, Read);
        // Staged through the host (no direct copy here), which is current again.
        assert_eq!(c.locations().collect::<Vec<_>>(), vec![(Host, Valid), (E, Valid), (D, Valid)]);
        c.clear();
        assert_eq!(c, Coherence::new());
        assert_eq!(c.state(D), BufferState::Uninitialized);
    }

    #[test]
    fn seed_transition_table() {
        let mut c = Coherence::new();
        run(&mut c, Host, Write);
        assert_eq!(c.state(D), BufferState::HostOnly);
        assert_eq!(run(&mut c, D, Read), vec![Step::Allocate(D), Step::Copy { from: Host, to: D }]);
        assert_eq!(c.state(D), BufferState::Synchronized);
        assert_eq!(run(&mut c, Host, Write), vec![]);
        assert_eq!(c.state(D), BufferState::HostDirty);
        assert_eq!(run(&mut c, D, Read), vec![Step::Copy { from: Host, to: D }]);
        assert_eq!(c.state(D), BufferState::Synchronized);
        assert_eq!(run(&mut c, D, Write), vec![]);
        assert_eq!(c.state(D), BufferState::DeviceDirty);
        assert_eq!(run(&mut c, Host, Read), vec![Step::Copy { from: D, to: Host }]);
        assert_eq!(c.state(D), BufferState::Synchronized);
    }

    #[test]
    fn device_only_and_overwrite() {
        let mut c = Coherence::new();
        assert_eq!(run(&mut c, D, Overwrite), vec![Step::Allocate(D)]);
        assert_eq!(c.state(D), BufferState::DeviceOnly);
        assert_eq!(run(&mut c, Host, Overwrite), vec![Step::Allocate(Host)]);
        assert_eq!(c.state(D), BufferState::HostDirty);
    }

    #[test]
    fn marking_a_missing_copy_dirty_fills_it_first() {
        // The reference implementation lost host data here; we copy host -> device first.
        let mut c = Coherence::new();
        run(&mut c, Host, Write);
        assert_eq!(run(&mut c, D, Write), vec![Step::Allocate(D), Step::Copy { from: Host, to: D }]);
        assert_eq!(c.state(D), BufferState::DeviceDirty);
    }

    #[test]
    fn device_to_device_stages_through_the_host_unless_direct() {
        let mut c = Coherence::new();
        run(&mut c, D, Overwrite);
        let steps = run(&mut c, E, Read);
        assert_eq!(
            steps,
            vec![
                Step::Allocate(E),
                Step::Allocate(Host),
                Step::Copy { from: D, to: Host },
                Step::Copy { from: Host, to: E }
            ]
        );
        assert_eq!(c.state(E), BufferState::Synchronized);

        let mut c = Coherence::new();
        run(&mut c, D, Overwrite);
        let plan = c.plan(E, Read, |_, _| true);
        assert_eq!(plan.steps(), &[Step::Allocate(E), Step::Copy { from: D, to: E }]);
        c.commit(E, Read, &plan);
        assert_eq!(c.state(E), BufferState::DeviceOnly);
        assert_eq!(c.state(D), BufferState::DeviceOnly);
    }

    #[test]
    fn elsewhere_when_only_another_device_is_valid() {
        let mut c = Coherence::new();
        run(&mut c, Host, Write);
        run(&mut c, D, Read);
        run(&mut c, E, Write);
        assert_eq!(c.state(D), BufferState::Elsewhere);
        assert_eq!(c.state(E), BufferState::DeviceDirty);
    }

    #[test]
    fn a_plan_changes_nothing_until_committed() {
        let mut c = Coherence::new();
        run(&mut c, Host, Write);
        let before = c.clone();
        let plan = c.plan(D, Write, never);
        assert!(!plan.is_empty());
        assert_eq!(c, before);
    }
}
