//! What the recorder records: one [`Event`] per thing lazybuf did to memory, of an
//! [`EventKind`]. The recorder ([`super::trace`]), the JSON export ([`super::json`]) and the
//! `tracing` events read these types; they depend on nothing of those. (While recording,
//! events are staged as plain numbers, `record.rs`, and become these when exported.)

use std::sync::Arc;
use std::time::Duration;

use super::TransferInfo;
use crate::coherence::BufferState;

/// The kind of memory an allocation or a free is of, as the timeline shows it (one series per
/// device and kind).
///
/// A [`crate::UnifiedBuffer`]'s blocks are its host copy (`Pinned` when the block is
/// page-locked, else `Host`) and `Device`; a memory object's ([`crate::DeviceAllocation`],
/// [`crate::DeviceBuffer`]) are its own kind ([`crate::MemoryKind`]): `Device`, `Host`
/// (pageable), `Pinned` or `Shared`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum MemoryKind {
    /// Pageable host memory: a buffer's host copy, a memory object's host memory.
    Host,
    /// Device memory.
    Device,
    /// Pinned (page-locked) host memory: a pinned buffer's host copy, a memory object's
    /// pinned memory.
    Pinned,
    /// A memory object's shared (unified, managed) memory.
    Shared,
}

impl MemoryKind {
    /// A host block's kind: [`MemoryKind::Pinned`] when it is page-locked, else
    /// [`MemoryKind::Host`].
    pub(crate) fn host(pinned: bool) -> MemoryKind {
        if pinned { MemoryKind::Pinned } else { MemoryKind::Host }
    }

    /// `host`, `device`, `pinned` or `shared`.
    pub fn name(self) -> &'static str {
        match self {
            MemoryKind::Host => "host",
            MemoryKind::Device => "device",
            MemoryKind::Pinned => "pinned",
            MemoryKind::Shared => "shared",
        }
    }
}

impl From<crate::backend::MemoryKind> for MemoryKind {
    /// A memory object's kind as its events show it.
    fn from(kind: crate::backend::MemoryKind) -> MemoryKind {
        match kind {
            crate::backend::MemoryKind::Device => MemoryKind::Device,
            crate::backend::MemoryKind::Host { pinned: false } => MemoryKind::Host,
            crate::backend::MemoryKind::Host { pinned: true } => MemoryKind::Pinned,
            crate::backend::MemoryKind::Shared => MemoryKind::Shared,
        }
    }
}

/// Where an allocation came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// A block a pool had cached.
    Cache,
    /// A new block from the runtime (through a pool's miss, or without a pool).
    Upstream,
}

/// What happened.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum EventKind {
    /// A copy between memories.
    Transfer {
        /// The copy.
        info: TransferInfo,
        /// The stream it ran on (an identity, not a runtime handle).
        stream: usize,
        /// Enqueue to completion, when the call waited for it.
        duration: Option<Duration>,
        /// The plan execution (one access or sync) that made it, unique in the process; 0 for
        /// a copy outside the plans. A later [`EventKind::Rollback`] of the same `op` undoes
        /// it in the counters, and in [`super::trace::Trace::summary`].
        op: u64,
    },
    /// A buffer or a memory object took a block.
    Allocate {
        /// The buffer (or the memory object's id).
        buffer: u64,
        /// The device the memory belongs to (for host blocks, the buffer's or object's device).
        device: String,
        /// Its kind.
        kind: MemoryKind,
        /// The block's size.
        bytes: usize,
        /// Cached or new.
        source: Source,
    },
    /// A buffer or a memory object gave a block back.
    Free {
        /// The buffer (or memory object) that owned it (`None`: memory no buffer owned).
        buffer: Option<u64>,
        /// The device.
        device: String,
        /// Its kind.
        kind: MemoryKind,
        /// The block's size.
        bytes: usize,
    },
    /// A pool looked for a cached block.
    Pool {
        /// Whether it had one.
        hit: bool,
        /// The device.
        device: String,
        /// The size asked for.
        bytes: usize,
    },
    /// A buffer's state against its device changed.
    State {
        /// The buffer.
        buffer: u64,
        /// Before.
        from: BufferState,
        /// After.
        to: BufferState,
        /// The call.
        call: &'static str,
    },
    /// The copies of plan execution `op` were undone: a later step of the same plan failed,
    /// or an asynchronous transfer failed when it was settled. The transfer counters take
    /// them back, and so does [`super::trace::Trace::summary`]; the copies stay in the
    /// timeline (their bytes did move). So do the blocks the undone work took (their
    /// allocation and free events stay: the memory was held), which the counters do not count:
    /// a buffer's allocations as `transfer_stats()` counts them are its allocation events less
    /// the `allocations` of its rollbacks.
    Rollback {
        /// The buffer.
        buffer: u64,
        /// The plan execution whose copies are undone ([`EventKind::Transfer`]'s `op`; 0 when
        /// no copy of it was recorded: only blocks it took are undone).
        op: u64,
        /// How many blocks the undone work took (recorded as allocations) that the counters
        /// take back or never counted. (Before the nineteenth hostile pass a failed plan's
        /// allocations were in the trace and not in the counters, with nothing to tell them
        /// apart.)
        allocations: u64,
        /// The call that made them.
        call: &'static str,
    },
    /// The coherence checker ([`mod@crate::checking`]) read a device copy back to compare it with
    /// the host: a download into the checker's own scratch memory, not a lazybuf transfer (the
    /// counters do not count it, the summary does not either, and the transfer guard does not
    /// refuse it: the checker is a debugging tool the user turned on).
    CheckerRead {
        /// The buffer.
        buffer: u64,
        /// The device read from.
        device: String,
        /// Bytes read.
        bytes: usize,
        /// Enqueue to completion (the checker waits for it).
        duration: Duration,
    },
}

/// One recorded event.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    /// Order of recording, from 0.
    pub seq: u64,
    /// When, since the recorder started ([`super::trace::start`]).
    pub time: Duration,
    /// The recording thread (small numbers, in order of first use).
    pub thread: u64,
    /// What happened.
    pub kind: EventKind,
    /// The stack that led here, when asked for (Python's and/or Rust's).
    pub stack: Option<Arc<str>>,
}
