//! What the recorder records: one [`Event`] per thing lazybuf did to memory, of an
//! [`EventKind`]. The recorder ([`super::trace`]), the JSON export ([`super::json`]) and the
//! `tracing` events read these types; they depend on nothing of those. (While recording,
//! events are staged as plain numbers, `record.rs`, and become these when exported.)

use std::sync::Arc;
use std::time::Duration;

use super::TransferInfo;
use crate::coherence::BufferState;

/// Host or device memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MemoryKind {
    /// A host block (pageable or pinned).
    Host,
    /// A device allocation.
    Device,
}

impl MemoryKind {
    /// `host` or `device`.
    pub fn name(self) -> &'static str {
        match self {
            MemoryKind::Host => "host",
            MemoryKind::Device => "device",
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
    /// A buffer took a block.
    Allocate {
        /// The buffer.
        buffer: u64,
        /// The device the memory belongs to (for host blocks, the buffer's device).
        device: String,
        /// Host or device memory.
        kind: MemoryKind,
        /// The block's size.
        bytes: usize,
        /// Cached or new.
        source: Source,
    },
    /// A buffer gave a block back.
    Free {
        /// The buffer that owned it (`None`: memory no buffer owned).
        buffer: Option<u64>,
        /// The device.
        device: String,
        /// Host or device memory.
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
