//! The recorder's hot path: events as small `Copy` records ([`Raw`]) staged per thread and
//! gathered into one ring.
//!
//! An event names its devices by number (a [`crate::coherence::DeviceId`]'s, 0 for the host)
//! and its call by an interned number; the names are registered once per device or call (a
//! per-thread cache remembers which are) and looked up only when a trace is exported
//! ([`names`]). Each recording thread writes its events into a chunk of its own,
//! [`CHUNK_WORDS`] relaxed atomic words in which events are staged back to back, each taking
//! only the words its kind uses (3 for a state transition, at most [`WORDS`] for a copy), and
//! publishes each with one release store of the chunk's length: no lock, no allocation, no
//! read-modify-write per event. The hooks inline the staging ([`Local::push`]), so an event's
//! fields go straight into its words. A full chunk is copied, still encoded, into the
//! session's ring under the global lock ([`Local::flush`]); so are a thread's events when it
//! exits. [`collect`] (snapshot and stop) reads the ring and every registered thread's
//! unflushed events under that lock, and merges them by timestamp (a thread's events keep
//! their order: the sort is stable and a thread's clock never goes back).
//!
//! Each session has a generation number: a thread whose chunk belongs to an older session
//! takes a new chunk at its next event (the old one is dropped). [`end`] (the recorder's stop)
//! drops the chunk of the thread that stops it; another thread that recorded keeps its last
//! chunk (`CHUNK_WORDS * 8` bytes) until its next recorded event or its exit:
//! nothing else of the recorder exists while it is off.
//!
//! Events that carry a stack (a binding's, or the Rust backtrace) take a slow path: the
//! thread's chunk is flushed and the event goes to the ring directly.
//!
//! **Merged records.** Two pairs of events that come together are staged as one record, and
//! collected as the two ([`Raw::expand`]: same time, in order): an access's host allocation
//! and its state transition ([`Raw::Allocated`]; the buffer keeps the allocation unrecorded
//! until then, `buffer/raw/observed.rs`), a release's host free and its transition
//! ([`Raw::Released`]). A block's and the ring's event counts count the events, not records.
//!
//! **Time.** Events store raw readings of one clock ([`now`]: the invariant time-stamp
//! counter through `quanta`, a few nanoseconds a read, else the monotonic clock), converted
//! to nanoseconds when collected. Inside a call ([`super::call`]) its events share the call's
//! first reading, except copies and checker reads, which read the clock at their start and
//! end, and frees, which read it anew (memory another thread allocated after the call's first
//! reading may be freed inside the call); the call's later events take the latest such reading
//! ([`Local::event_time`]). A thread's times never go back, so its events keep their order
//! when merged.
//!
//! **Cost per event** (what the hooks pay while recording): one thread-local (this thread's
//! [`Local`], which also holds the call's cause: in a shared library each thread-local access
//! is a call), a clock read at most, the words the event's kind uses (3 to 9) and a release
//! store.
//!
//! What does not live here: the public types and export ([`super::trace`], [`super::event`],
//! [`super::json`]).

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::event::{MemoryKind, Source};
use super::{Direction, Reason};
use crate::backend::fork::{ForkAwareMutex, ForkAwareOnce};
use crate::coherence::BufferState;
use crate::device::Device;

/// Words of the largest staged event (a copy's; most kinds take 3 to 5).
pub(super) const WORDS: usize = 9;
/// Words per thread chunk (64 of the largest events).
pub(super) const CHUNK_WORDS: usize = 64 * WORDS;

/// A device in a record: a `DeviceId`'s number, [`HOST`], or a device known only by name
/// (`NAMED | n`, copies reported through [`super::transfer`]).
pub(super) type Dev = u64;
/// The host memory of a copy.
pub(super) const HOST: Dev = 0;
const NAMED: Dev = 1 << 63;

/// An interned call name ([`Local::call`]).
pub(super) type Call = u32;

/// One event as recorded: plain numbers, names resolved on export.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Raw {
    Transfer {
        buffer: u64,
        /// The plan execution that made it (0: none), for [`Raw::Rollback`].
        op: u64,
        direction: Direction,
        bytes: u64,
        from: Dev,
        to: Dev,
        call: Call,
        reason: Reason,
        stream: u64,
        /// When it started: the recorder's ticks while staged, nanoseconds since the epoch
        /// once collected.
        start: u64,
        /// Whether the call waited for it (it ended when recorded).
        waited: bool,
    },
    Allocate {
        buffer: u64,
        device: Dev,
        kind: MemoryKind,
        bytes: u64,
        source: Source,
    },
    Free {
        /// 0: no buffer owned it.
        buffer: u64,
        device: Dev,
        kind: MemoryKind,
        bytes: u64,
    },
    Pool {
        hit: bool,
        device: Dev,
        bytes: u64,
    },
    State {
        buffer: u64,
        from: BufferState,
        to: BufferState,
        call: Call,
    },
    Rollback {
        buffer: u64,
        op: u64,
        /// At most 255 (a plan takes at most two blocks).
        allocations: u64,
        call: Call,
    },
    /// A buffer's release of its memory recorded as one record: the free of its host block
    /// (on `device`) and the state transition that followed it (`from` != `to`). Staged as one
    /// (one look at the thread's state, one staging), collected as the two events
    /// ([`Raw::expand`]): a [`Raw::Free`] and a [`Raw::State`], at the same time.
    Released {
        buffer: u64,
        device: Dev,
        kind: MemoryKind,
        bytes: u64,
        from: BufferState,
        to: BufferState,
        call: Call,
    },
    /// A host block's allocation and the state transition of the access it served
    /// (`from` != `to`) as one record: collected as a [`Raw::Allocate`] (of a host block), then
    /// a [`Raw::State`], at the same time ([`Raw::expand`]).
    Allocated {
        buffer: u64,
        device: Dev,
        /// Host or pinned.
        kind: MemoryKind,
        bytes: u64,
        source: Source,
        from: BufferState,
        to: BufferState,
        call: Call,
    },
    CheckerRead {
        buffer: u64,
        device: Dev,
        bytes: u64,
        start: u64,
    },
}

const REASONS: [Reason; 3] = [Reason::Access, Reason::Sync, Reason::Eviction];
const KINDS: [MemoryKind; 4] = [MemoryKind::Host, MemoryKind::Device, MemoryKind::Pinned, MemoryKind::Shared];

fn reason_index(reason: Reason) -> u64 {
    match reason {
        Reason::Access => 0,
        Reason::Sync => 1,
        Reason::Eviction => 2,
    }
}

fn kind_index(kind: MemoryKind) -> u64 {
    match kind {
        MemoryKind::Host => 0,
        MemoryKind::Device => 1,
        MemoryKind::Pinned => 2,
        MemoryKind::Shared => 3,
    }
}

/// Tags (low byte of word 1).
const T_TRANSFER: u64 = 1;
const T_ALLOCATE: u64 = 2;
const T_FREE: u64 = 3;
const T_POOL: u64 = 4;
const T_STATE: u64 = 5;
const T_ROLLBACK: u64 = 6;
const T_CHECKER: u64 = 7;
const T_RELEASED: u64 = 8;
const T_ALLOCATED: u64 = 9;

impl Raw {
    /// `self` with its start (a copy's, a checker read's) from ticks to nanoseconds.
    pub(super) fn to_nanos(mut self) -> Raw {
        if let Raw::Transfer { start, .. } | Raw::CheckerRead { start, .. } = &mut self {
            *start = nanos(*start);
        }
        self
    }

    /// Word 0 is the time; word 1 the tag (bits 0..8), small fields (8..32) and the call
    /// (32..64); the rest per kind. Returns the words and how many the kind uses.
    #[inline(always)]
    fn encode(self, time: u64) -> ([u64; WORDS], usize) {
        let mut w = [0u64; WORDS];
        let used = self.write(time, |i, value| w[i] = value);
        (w, used)
    }

    /// How many words this kind stages ([`Self::write`]).
    #[inline(always)]
    fn words(&self) -> usize {
        match self {
            Raw::Transfer { .. } => words_of(T_TRANSFER),
            Raw::Allocate { .. } => words_of(T_ALLOCATE),
            Raw::Free { .. } => words_of(T_FREE),
            Raw::Pool { .. } => words_of(T_POOL),
            Raw::State { .. } => words_of(T_STATE),
            Raw::Rollback { .. } => words_of(T_ROLLBACK),
            Raw::CheckerRead { .. } => words_of(T_CHECKER),
            Raw::Released { .. } => words_of(T_RELEASED),
            Raw::Allocated { .. } => words_of(T_ALLOCATED),
        }
    }

    /// The public events this record stands for, in order: one, or two for a merged record
    /// ([`Raw::Released`]: its free, then its state transition; [`Raw::Allocated`]: its
    /// allocation, then its state transition).
    pub(super) fn expand(self) -> (Raw, Option<Raw>) {
        match self {
            Raw::Released { buffer, device, kind, bytes, from, to, call } => {
                (Raw::Free { buffer, device, kind, bytes }, Some(Raw::State { buffer, from, to, call }))
            }
            Raw::Allocated { buffer, device, kind, bytes, source, from, to, call } => (
                Raw::Allocate { buffer, device, kind, bytes, source },
                Some(Raw::State { buffer, from, to, call }),
            ),
            raw => (raw, None),
        }
    }

    /// How many public events this record stands for ([`Self::expand`]).
    #[inline(always)]
    fn events(&self) -> usize {
        match self {
            Raw::Released { .. } | Raw::Allocated { .. } => 2,
            _ => 1,
        }
    }

    /// Gives each word the kind uses to `put` (index, value), [`Self::encode`]'s layout: the
    /// words `0..n`, `n` being [`Self::words`] (returned). Events are staged back to back, each
    /// taking only its kind's words.
    #[inline(always)]
    fn write(self, time: u64, mut put: impl FnMut(usize, u64)) -> usize {
        put(0, time);
        match self {
            Raw::Transfer { buffer, op, direction, bytes, from, to, call, reason, stream, start, waited } => {
                put(
                    1,
                    T_TRANSFER
                        | (direction.index() as u64) << 8
                        | reason_index(reason) << 12
                        | u64::from(waited) << 16
                        | u64::from(call) << 32,
                );
                put(2, buffer);
                put(3, bytes);
                put(4, from);
                put(5, to);
                put(6, stream);
                put(7, op);
                put(8, start);
            }
            Raw::Allocate { buffer, device, kind, bytes, source } => {
                put(1, T_ALLOCATE | kind_index(kind) << 8 | u64::from(source == Source::Cache) << 12);
                put(2, buffer);
                put(3, bytes);
                put(4, device);
            }
            Raw::Free { buffer, device, kind, bytes } => {
                put(1, T_FREE | kind_index(kind) << 8);
                put(2, buffer);
                put(3, bytes);
                put(4, device);
            }
            Raw::Pool { hit, device, bytes } => {
                put(1, T_POOL | u64::from(hit) << 8);
                put(2, bytes);
                put(3, device);
            }
            Raw::State { buffer, from, to, call } => {
                put(1, T_STATE | (from as u64) << 8 | (to as u64) << 16 | u64::from(call) << 32);
                put(2, buffer);
            }
            Raw::Rollback { buffer, op, allocations, call } => {
                put(1, T_ROLLBACK | allocations.min(255) << 8 | u64::from(call) << 32);
                put(2, buffer);
                put(3, op);
            }
            Raw::Released { buffer, device, kind, bytes, from, to, call } => {
                put(
                    1,
                    T_RELEASED
                        | kind_index(kind) << 8
                        | (from as u64) << 16
                        | (to as u64) << 24
                        | u64::from(call) << 32,
                );
                put(2, buffer);
                put(3, bytes);
                put(4, device);
            }
            Raw::Allocated { buffer, device, kind, bytes, source, from, to, call } => {
                put(
                    1,
                    T_ALLOCATED
                        | u64::from(source == Source::Cache) << 8
                        | kind_index(kind) << 12
                        | (from as u64) << 16
                        | (to as u64) << 24
                        | u64::from(call) << 32,
                );
                put(2, buffer);
                put(3, bytes);
                put(4, device);
            }
            Raw::CheckerRead { buffer, device, bytes, start } => {
                put(1, T_CHECKER);
                put(2, buffer);
                put(3, bytes);
                put(4, device);
                put(5, start);
            }
        }
        self.words()
    }

    /// The record at the start of `w` ([`Self::encode`]) and the words it takes; `None` for
    /// words no event wrote, or too few.
    fn decode(w: &[u64]) -> Option<(Raw, usize)> {
        let head = *w.get(1)?;
        let n = words_of(head & 0xff);
        let w = w.get(..n).filter(|_| n > 0)?;
        let small = |shift: u32, bits: u32| ((head >> shift) & ((1 << bits) - 1)) as usize;
        let call = (head >> 32) as Call;
        let raw = match head & 0xff {
            T_TRANSFER => Raw::Transfer {
                buffer: w[2],
                op: w[7],
                direction: *Direction::ALL.get(small(8, 4))?,
                bytes: w[3],
                from: w[4],
                to: w[5],
                call,
                reason: *REASONS.get(small(12, 4))?,
                stream: w[6],
                start: w[8],
                waited: small(16, 1) == 1,
            },
            T_ALLOCATE => Raw::Allocate {
                buffer: w[2],
                device: w[4],
                kind: *KINDS.get(small(8, 4))?,
                bytes: w[3],
                source: if small(12, 1) == 1 { Source::Cache } else { Source::Upstream },
            },
            T_FREE => Raw::Free { buffer: w[2], device: w[4], kind: *KINDS.get(small(8, 4))?, bytes: w[3] },
            T_POOL => Raw::Pool { hit: small(8, 1) == 1, device: w[3], bytes: w[2] },
            T_STATE => Raw::State {
                buffer: w[2],
                from: *BufferState::ALL.get(small(8, 8))?,
                to: *BufferState::ALL.get(small(16, 8))?,
                call,
            },
            T_ROLLBACK => Raw::Rollback { buffer: w[2], op: w[3], allocations: small(8, 8) as u64, call },
            T_CHECKER => Raw::CheckerRead { buffer: w[2], device: w[4], bytes: w[3], start: w[5] },
            T_RELEASED => Raw::Released {
                buffer: w[2],
                device: w[4],
                kind: *KINDS.get(small(8, 4))?,
                bytes: w[3],
                from: *BufferState::ALL.get(small(16, 8))?,
                to: *BufferState::ALL.get(small(24, 8))?,
                call,
            },
            T_ALLOCATED => Raw::Allocated {
                buffer: w[2],
                device: w[4],
                kind: *KINDS.get(small(12, 4))?,
                bytes: w[3],
                source: if small(8, 1) == 1 { Source::Cache } else { Source::Upstream },
                from: *BufferState::ALL.get(small(16, 8))?,
                to: *BufferState::ALL.get(small(24, 8))?,
                call,
            },
            _ => return None,
        };
        Some((raw, n))
    }
}

/// The words of a kind's record, by its tag (0: no such kind).
#[inline(always)]
const fn words_of(tag: u64) -> usize {
    match tag {
        T_TRANSFER => 9,
        T_ALLOCATE | T_FREE | T_RELEASED | T_ALLOCATED => 5,
        T_POOL | T_ROLLBACK => 4,
        T_STATE => 3,
        T_CHECKER => 6,
        _ => 0,
    }
}

/// Decodes the records staged back to back in `words` (a chunk's published words) into `out`,
/// each as the public events it stands for ([`Raw::expand`]).
fn decode_all(words: &[u64], thread: u64, stack: Option<&Arc<str>>, out: &mut Vec<Entry>) {
    let mut at = 0;
    while let Some((raw, n)) = words.get(at..).and_then(Raw::decode) {
        let time = words[at];
        let (first, second) = raw.expand();
        out.push(Entry { time, thread, raw: first, stack: stack.cloned() });
        if let Some(raw) = second {
            out.push(Entry { time, thread, raw, stack: stack.cloned() });
        }
        at += n;
    }
}

/// Events in the ring, still encoded (decoded by [`collect`]), in the order they reached it.
enum Block {
    /// A thread's chunk, as it was full (or as the thread exited), or one event taken on the
    /// slow path without a stack: `events` records back to back. (Copied: moving the chunk
    /// itself here and giving the thread a new one costs as much in the new chunk's zeroing.)
    Chunk { thread: u64, words: Box<[u64]>, events: usize },
    /// One record with a stack (`events`: the public events it stands for).
    Stacked { thread: u64, words: [u64; WORDS], stack: Arc<str>, events: usize },
}

impl Block {
    fn len(&self) -> usize {
        match self {
            Block::Chunk { events, .. } => *events,
            Block::Stacked { events, .. } => *events,
        }
    }

    fn decode_into(&self, out: &mut Vec<Entry>) {
        match self {
            Block::Chunk { thread, words, .. } => decode_all(words, *thread, None, out),
            Block::Stacked { thread, words, stack, .. } => decode_all(words, *thread, Some(stack), out),
        }
    }
}

/// One event gathered by [`collect`].
#[derive(Clone, Debug)]
pub(super) struct Entry {
    /// Nanoseconds since the epoch (the clock's ticks until [`collect`] converts them).
    pub(super) time: u64,
    pub(super) thread: u64,
    pub(super) raw: Raw,
    pub(super) stack: Option<Arc<str>>,
}

impl Entry {
    /// Its times (the event's, and a copy's or checker read's start) from ticks to nanoseconds.
    fn convert_to_nanos(&mut self) {
        self.time = nanos(self.time);
        self.raw = self.raw.to_nanos();
    }
}

/// A thread's chunk, readable by [`collect`] on any thread.
struct Chunk {
    thread: u64,
    /// Words published (the producer's release store).
    len: AtomicUsize,
    words: Box<[AtomicU64]>,
}

impl Chunk {
    fn new(thread: u64) -> Chunk {
        Chunk {
            thread,
            len: AtomicUsize::new(0),
            words: (0..CHUNK_WORDS).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Words published (the producer writes none below it again).
    fn published(&self) -> usize {
        self.len.load(Ordering::Acquire).min(self.words.len())
    }

    /// The published words.
    fn load(&self) -> Vec<u64> {
        self.words[..self.published()].iter().map(|w| w.load(Ordering::Relaxed)).collect()
    }

    /// A copy of the published events (`events` of them).
    fn read(&self, events: usize) -> Block {
        Block::Chunk { thread: self.thread, words: self.load().into(), events }
    }

    /// Decodes the published events.
    fn decode_into(&self, out: &mut Vec<Entry>) {
        decode_all(&self.load(), self.thread, None, out);
    }
}

/// One recording session.
pub(super) struct Session {
    pub(super) generation: u64,
    pub(super) capacity: usize,
    /// Its start, in nanoseconds since the epoch.
    pub(super) origin: u64,
    ring: VecDeque<Block>,
    /// Events in `ring`.
    held: usize,
    pub(super) dropped: u64,
}

impl Session {
    /// Adds `block`; drops the oldest blocks while the rest hold `capacity` events.
    fn push(&mut self, block: Block) {
        self.held += block.len();
        self.ring.push_back(block);
        while let Some(front) = self.ring.front() {
            let n = front.len();
            if self.held - n < self.capacity {
                break;
            }
            self.held -= n;
            self.dropped += n as u64;
            self.ring.pop_front();
        }
    }
}

pub(super) struct Global {
    pub(super) session: Option<Session>,
    /// The chunks of the threads that record in the current session.
    threads: Vec<Arc<Chunk>>,
}

static GLOBAL: Mutex<Global> = Mutex::new(Global { session: None, threads: Vec::new() });
/// The current session's generation; 0 while not recording.
static GENERATION: AtomicU64 = AtomicU64::new(0);
static LAST_GENERATION: AtomicU64 = AtomicU64::new(0);
/// Attach the Rust backtrace to every event.
static BACKTRACE: AtomicBool = AtomicBool::new(false);
static NEXT_THREAD: AtomicU64 = AtomicU64::new(1);

/// The recorder's state for `start`, `stop` and `snapshot` (`operation`): in a forked child of
/// the recording process, the session inherited from the parent is dropped first (it is the
/// parent's: the child recorded nothing into it), so the child may record its own. A lock a
/// parent's thread held at the fork stays held in the child forever: an error says so, never
/// a wait.
pub(super) fn global_of_this_process(
    operation: &'static str,
) -> crate::error::Result<MutexGuard<'static, Global>> {
    if !in_forked_child() {
        return Ok(global());
    }
    let mut global = match GLOBAL.try_lock() {
        Ok(global) => global,
        Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
        Err(std::sync::TryLockError::WouldBlock) => {
            return Err(crate::error::Error::invalid(
                operation,
                "the recorder was in use by another thread of the parent process when this \
                 process was forked, so it cannot be used here; record in the parent, or start \
                 worker processes with 'spawn'",
            ));
        }
    };
    if global.session.take().is_some() {
        GENERATION.store(0, Ordering::Release);
        global.threads.clear();
        super::set_bit(super::TRACE_BIT, false);
    }
    Ok(global)
}

pub(super) fn global() -> MutexGuard<'static, Global> {
    // Nothing panics while holding the lock: a poisoned ring is still consistent.
    GLOBAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The recorder's clock: the CPU's time-stamp counter where it is invariant (one instruction
/// a read, a few nanoseconds; `Instant::now()` costs about 25 here, most of an event's
/// budget), else the monotonic clock, through `quanta`, calibrated once per process. Events
/// store its raw ticks; [`collect`] turns them into nanoseconds since its epoch.
struct Clock {
    clock: quanta::Clock,
    /// Its reading when made.
    epoch: u64,
}

static CLOCK: ForkAwareOnce<Clock> = ForkAwareOnce::new();

fn clock() -> &'static Clock {
    CLOCK.get_or_init(|| {
        let clock = quanta::Clock::new();
        let epoch = clock.raw();
        Clock { clock, epoch }
    })
}

/// Makes the clock now (once per process: its calibration takes up to 0.2 s), not at the
/// first event.
pub(super) fn calibrate() {
    clock();
}

/// Now, in the recorder's ticks (what events store; [`nanos`] converts them).
#[inline]
pub(super) fn now() -> u64 {
    clock().clock.raw()
}

/// Nanoseconds since the clock's epoch at `ticks` (a reading of [`now`]).
pub(super) fn nanos(ticks: u64) -> u64 {
    let clock = clock();
    clock.clock.delta_as_nanos(clock.epoch, ticks)
}

/// The fork generation ([`crate::backend::fork::generation`]) of the process that started
/// recording ([`begin`], or `tracing` events turned on).
static RECORDING_PROCESS: AtomicU64 = AtomicU64::new(0);

/// Marks this process as the one whose events are recorded: its forked children record none.
pub(super) fn record_in_this_process() {
    crate::backend::fork::watch_every_fork();
    RECORDING_PROCESS.store(crate::backend::fork::generation(), Ordering::Relaxed);
}

/// Whether this process is a forked child of the one that started recording. Such a child
/// records nothing: the session lives in its parent, and the recorder's locks may have been
/// held by a parent's thread at the fork (the child would wait for them forever).
#[inline]
pub(super) fn in_forked_child() -> bool {
    crate::backend::fork::generation() != RECORDING_PROCESS.load(Ordering::Relaxed)
}

/// Begins a session (the caller checked none runs); returns nothing, the hooks see it at once.
pub(super) fn begin(global: &mut Global, capacity: usize, backtrace: bool) {
    let generation = LAST_GENERATION.fetch_add(1, Ordering::Relaxed) + 1;
    record_in_this_process();
    calibrate();
    global.threads.clear();
    global.session = Some(Session {
        generation,
        capacity,
        origin: nanos(now()),
        ring: VecDeque::new(),
        held: 0,
        dropped: 0,
    });
    BACKTRACE.store(backtrace, Ordering::Relaxed);
    GENERATION.store(generation, Ordering::Release);
}

/// Ends the session: no thread records into it any more (a thread racing with the end may
/// still write into its chunk, which nobody reads again).
pub(super) fn end(global: &mut Global) -> Option<Session> {
    GENERATION.store(0, Ordering::Release);
    global.threads.clear();
    // The stopping thread's chunk goes now (other threads' at their next event or exit).
    with_local(Local::release_chunk);
    global.session.take()
}

/// Every event of the session so far, oldest first: the ring and each thread's unflushed
/// events, merged by time, at most `capacity` (the oldest beyond it are counted in `dropped`).
pub(super) fn collect(global: &Global) -> (Vec<Entry>, u64) {
    let Some(session) = global.session.as_ref() else { return (Vec::new(), 0) };
    let mut all = Vec::with_capacity(session.held + global.threads.len() * CHUNK_WORDS / 3);
    for block in &session.ring {
        block.decode_into(&mut all);
    }
    for chunk in &global.threads {
        chunk.decode_into(&mut all);
    }
    all.sort_by_key(|e| e.time);
    for entry in &mut all {
        entry.convert_to_nanos();
    }
    let mut dropped = session.dropped;
    if all.len() > session.capacity {
        let excess = all.len() - session.capacity;
        all.drain(..excess);
        dropped += excess as u64;
    }
    (all, dropped)
}

/// [`Local::fast`] while a thread's events take the slow path (or it joined no session).
const NO_FAST_PATH: u64 = u64::MAX;

/// Sets and ways of a thread's cache of call numbers ([`Local::call`]).
const CALL_SETS: usize = 16;
const CALL_WAYS: usize = 4;

/// A thread's numbers of the call names it used, by the name's address and length.
type CallNumbers = HashMap<(usize, usize), Call, BuildHasherDefault<NameHasher>>;

/// The hash of a call name's address and length: one multiply-and-rotate step per word (the
/// addresses of literals differ in their low bits, which the multiplication spreads over the
/// bits the table looks at).
#[derive(Default)]
struct NameHasher(u64);

impl Hasher for NameHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.write_usize(usize::from(byte));
        }
    }

    #[inline]
    fn write_usize(&mut self, word: usize) {
        self.0 = (self.0.rotate_left(5) ^ word as u64).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

/// This thread's recorder state, and the cause of the call it runs ([`super::call`]): one
/// thread-local, made without running code (a `const` one: in a shared library, such as the
/// Python extension, each access to a thread-local is a call, so the hooks use one, once).
pub(super) struct Local {
    /// Its number in events (0: none taken yet, [`Self::thread`]).
    thread: Cell<u64>,
    /// The cause set by [`super::call`].
    pub(super) cause: Cell<Option<super::Cause>>,
    /// The time of the running call's events ([`Self::event_time`]; 0: not read yet).
    pub(super) call_time: Cell<u64>,
    /// The session generation `chunk` belongs to (0: none).
    generation: Cell<u64>,
    /// `generation` while this thread's events take the fast path (not [`Self::slow`]), else
    /// [`NO_FAST_PATH`], which no session's generation (nor 0, recording off) equals: the
    /// hooks' one comparison ([`Self::push`]).
    fast: Cell<u64>,
    chunk: RefCell<Option<Arc<Chunk>>>,
    /// Words staged in `chunk` (the producer's own count).
    len: Cell<usize>,
    /// Events staged in `chunk`.
    events: Cell<usize>,
    /// A stack the binding attached ([`Local::set_stack`]).
    stack: RefCell<Option<Arc<str>>>,
    /// Whether events take the slow path: a stack is attached, or the session attaches the
    /// Rust backtrace.
    slow: Cell<bool>,
    /// The session attaches the Rust backtrace.
    backtrace: Cell<bool>,
    /// Recently seen devices and calls, known to be registered.
    devices: [Cell<u64>; 4],
    next_device: Cell<usize>,
    recent_calls: [Cell<(usize, usize, Call)>; CALL_SETS * CALL_WAYS],
    /// Every call name this thread met, with its number.
    calls: RefCell<CallNumbers>,
    /// The last pool lookup's outcome, for the allocation that follows.
    pub(super) pool_hit: Cell<Option<bool>>,
    next_op: Cell<u64>,
}

impl Local {
    const fn new() -> Local {
        Local {
            thread: Cell::new(0),
            cause: Cell::new(None),
            call_time: Cell::new(0),
            generation: Cell::new(0),
            fast: Cell::new(NO_FAST_PATH),
            chunk: RefCell::new(None),
            len: Cell::new(0),
            events: Cell::new(0),
            stack: RefCell::new(None),
            slow: Cell::new(false),
            backtrace: Cell::new(false),
            devices: [const { Cell::new(0) }; 4],
            next_device: Cell::new(0),
            recent_calls: [const { Cell::new((0, 0, 0)) }; CALL_SETS * CALL_WAYS],
            calls: RefCell::new(HashMap::with_hasher(BuildHasherDefault::new())),
            pool_hit: Cell::new(None),
            next_op: Cell::new(0),
        }
    }

    /// The time of an event now, in ticks: inside a call ([`super::call`]: every method of the
    /// Python binding runs in one), the call's first reading of the clock, or the end of its
    /// latest copy; outside calls, a new reading. A clock read costs 10-15 ns, more than the
    /// rest of an event, and a call makes several events (an allocation, a state change, a
    /// free): the memory timeline is drawn per call, copies are timed on their own.
    #[inline]
    pub(super) fn event_time(&self) -> u64 {
        match self.call_time.get() {
            0 => self.fresh_time(),
            at => at,
        }
    }

    /// A new reading of the clock (a copy's start or end), which the call's later events share.
    #[inline]
    pub(super) fn fresh_time(&self) -> u64 {
        let at = now();
        if self.cause.get().is_some() {
            self.call_time.set(at);
        }
        at
    }

    /// Runs `f` as `cause` ([`super::call`]): its events read the clock anew; afterwards (also
    /// when `f` unwinds) no call's cause is set. Inside an enclosing call `f` simply runs: the
    /// outermost call names the copies (`__array__` calling `to_numpy`, `synchronize` calling
    /// the syncs are what the user called), and its events go on from the latest time (a
    /// thread's times never go back: its events keep their order when merged by time).
    pub(super) fn run_as<R>(&self, cause: super::Cause, f: impl FnOnce() -> R) -> R {
        struct Restore<'a>(&'a Local);
        impl Drop for Restore<'_> {
            fn drop(&mut self) {
                self.0.cause.set(None);
                self.0.call_time.set(0);
            }
        }
        if self.cause.get().is_some() {
            return f();
        }
        self.call_time.set(0);
        self.cause.set(Some(cause));
        let _restore = Restore(self);
        f()
    }

    /// Runs `f` as `cause` whatever call runs on this thread, and puts that call's cause back
    /// after it (also when `f` unwinds): [`super::call_anew`]. That call's later events go on
    /// from `f`'s latest time, never from before it: its own first reading, put back, stamped
    /// them before `f`'s events (a buffer `f`'s caller dropped was freed before `f` allocated
    /// it: the twentieth hostile pass); a call that had read no time yet reads it anew.
    pub(super) fn run_anew<R>(&self, cause: super::Cause, f: impl FnOnce() -> R) -> R {
        struct Restore<'a>(&'a Local, Option<super::Cause>, u64);
        impl Drop for Restore<'_> {
            fn drop(&mut self) {
                self.0.cause.set(self.1);
                let latest = self.0.call_time.get();
                self.0.call_time.set(if self.2 == 0 { 0 } else { self.2.max(latest) });
            }
        }
        let _restore = Restore(self, self.cause.replace(Some(cause)), self.call_time.replace(0));
        f()
    }

    /// Drops this thread's chunk (its session ended: nobody reads it again).
    fn release_chunk(&self) {
        if let Ok(mut chunk) = self.chunk.try_borrow_mut() {
            *chunk = None;
            self.generation.set(0);
            self.fast.set(NO_FAST_PATH);
            self.len.set(0);
            self.events.set(0);
        }
    }

    /// This thread's number in events (small numbers, in order of first use).
    fn thread(&self) -> u64 {
        if self.thread.get() == 0 {
            self.thread.set(NEXT_THREAD.fetch_add(1, Ordering::Relaxed));
        }
        self.thread.get()
    }

    /// `device`'s number in events (its name registered on first sight).
    #[inline]
    pub(super) fn dev(&self, device: &Device) -> Dev {
        let id = device.id().0.get();
        if self.devices.iter().any(|d| d.get() == id) {
            return id;
        }
        self.dev_slow(id, device)
    }

    #[cold]
    fn dev_slow(&self, id: u64, device: &Device) -> Dev {
        // (Unnamed in a forked child whose parent's thread held the names at the fork: exported
        // as `device N`.)
        if let Some(mut names) = names() {
            names.devices.entry(id).or_insert_with(|| device.to_string().into());
        }
        let slot = self.next_device.get();
        self.devices[slot % self.devices.len()].set(id);
        self.next_device.set(slot + 1);
        id
    }

    /// `call`'s number in events. First a four-way cache: the set of [`CALL_WAYS`] slots the
    /// pointer hashes to, most recent first (the set from the high bits of a Fibonacci hash:
    /// the literals' addresses differ in their low bits only). Behind it this thread's map of
    /// every name it met: a workload whose names share a set costs a map lookup per miss, not
    /// more. (With two ways, three names of one batch that shared a pair missed on every
    /// event, as the binary's layout happened to place them: each miss a map lookup, once a
    /// global lock and a SipHash.) Names new to the thread are interned.
    #[inline]
    pub(super) fn call(&self, call: &'static str) -> Call {
        let (ptr, len) = (call.as_ptr() as usize, call.len());
        let hash = ((ptr ^ len) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let set = (hash >> 60) as usize % CALL_SETS * CALL_WAYS;
        let Some(ways) = self.recent_calls.get(set..set + CALL_WAYS) else { return self.call_slow(call) };
        for slot in ways {
            let (p, l, id) = slot.get();
            if p == ptr && l == len {
                return id;
            }
        }
        let id = self.call_slow(call);
        for i in (1..ways.len()).rev() {
            ways[i].set(ways[i - 1].get());
        }
        ways[0].set((ptr, len, id));
        id
    }

    /// [`Self::call`] past its cache: the thread's map, else the interned number.
    #[cold]
    fn call_slow(&self, call: &'static str) -> Call {
        let key = (call.as_ptr() as usize, call.len());
        if let Some(&id) = self.calls.try_borrow().ok().as_ref().and_then(|calls| calls.get(&key)) {
            return id;
        }
        let id = intern_call(call);
        if let Ok(mut calls) = self.calls.try_borrow_mut() {
            calls.insert(key, id);
        }
        id
    }

    /// A new plan execution's number (unique in the process).
    pub(super) fn next_op(&self) -> u64 {
        let n = self.next_op.get() + 1;
        self.next_op.set(n);
        self.thread() << 40 | n
    }

    /// Records `raw`, as of `at` (the recorder's ticks, [`now`]). Inlined into each kind's
    /// hook, so the event's words are stored straight from its fields; anything but an
    /// event staged in a chunk with room for it goes to [`Self::push_slow`].
    #[inline(always)]
    pub(super) fn push(&self, at: u64, raw: Raw) {
        // Relaxed: the thread's own chunk is used only for the generation it joined (under
        // the lock, in `push_slow`); an acquiring load here kept the event in memory.
        // One comparison: recording off (0), another session, or this thread's slow path
        // (`fast` is then `NO_FAST_PATH`) all differ from `fast`.
        let len = self.len.get();
        if GENERATION.load(Ordering::Relaxed) != self.fast.get() || len + raw.words() > CHUNK_WORDS {
            self.push_slow(at, raw);
            return;
        }
        self.stage(at, raw, len);
    }

    /// Writes `raw`'s words at word `len` of this thread's chunk, which has room for them, and
    /// publishes them.
    #[inline(always)]
    fn stage(&self, at: u64, raw: Raw, len: usize) {
        let n = raw.words();
        let chunk = self.chunk.borrow();
        let Some(chunk) = chunk.as_ref() else { return };
        let Some(slot) = chunk.words.get(len..len + n) else { return };
        raw.write(at, |i, value| {
            if let Some(word) = slot.get(i) {
                word.store(value, Ordering::Relaxed);
            }
        });
        chunk.len.store(len + n, Ordering::Release);
        self.len.set(len + n);
        self.events.set(self.events.get() + raw.events());
    }

    /// [`Self::push`] when this thread joins a new session, its events carry a stack, or its
    /// chunk is full.
    #[cold]
    #[inline(never)]
    fn push_slow(&self, at: u64, raw: Raw) {
        let generation = GENERATION.load(Ordering::Acquire);
        // A forked child of the recording process records nothing: the session is its
        // parent's, whose locks a parent's thread may have held at the fork.
        if generation == 0 || in_forked_child() {
            return;
        }
        if generation != self.generation.get() && !self.join(generation) {
            return;
        }
        if self.slow.get() {
            self.push_with_stack(at, raw);
            return;
        }
        if self.len.get() + raw.words() > CHUNK_WORDS {
            self.flush();
        }
        self.stage(at, raw, self.len.get());
    }

    /// Takes a chunk for session `generation`; false if that session has ended already.
    #[cold]
    fn join(&self, generation: u64) -> bool {
        let mut global = global();
        if global.session.as_ref().is_none_or(|s| s.generation != generation) {
            return false;
        }
        let chunk = Arc::new(Chunk::new(self.thread()));
        global.threads.push(Arc::clone(&chunk));
        *self.chunk.borrow_mut() = Some(chunk);
        self.len.set(0);
        self.events.set(0);
        self.generation.set(generation);
        self.backtrace.set(BACKTRACE.load(Ordering::Relaxed));
        self.set_slow(self.backtrace.get() || self.stack.borrow().is_some());
        true
    }

    /// Attaches `stack` to this thread's events (until replaced); returns the previous one.
    pub(super) fn set_stack(&self, stack: Option<Arc<str>>) -> Option<Arc<str>> {
        self.set_slow(self.backtrace.get() || stack.is_some());
        self.stack.replace(stack)
    }

    /// Whether this thread's events take the slow path; [`Self::fast`] follows.
    fn set_slow(&self, slow: bool) {
        self.slow.set(slow);
        let joined = self.chunk.try_borrow().is_ok_and(|c| c.is_some());
        self.fast.set(if slow || !joined { NO_FAST_PATH } else { self.generation.get() });
    }

    /// Copies this thread's events into the ring (when its session still runs) and empties
    /// its chunk.
    #[cold]
    fn flush(&self) {
        let mut global = global();
        self.flush_locked(&mut global);
    }

    fn flush_locked(&self, global: &mut Global) {
        let chunk = self.chunk.borrow();
        let Some(chunk) = chunk.as_ref() else { return };
        if let Some(session) = global.session.as_mut().filter(|s| s.generation == self.generation.get())
            && self.len.get() > 0
        {
            session.push(chunk.read(self.events.get()));
        }
        chunk.len.store(0, Ordering::Release);
        self.len.set(0);
        self.events.set(0);
    }

    /// An event with a stack: after this thread's staged events, straight into the ring.
    #[cold]
    fn push_with_stack(&self, at: u64, raw: Raw) {
        let given = self.stack.borrow().clone();
        let stack = if self.backtrace.get() {
            let rust = std::backtrace::Backtrace::force_capture().to_string();
            Some(match given {
                Some(given) => format!("{given}\n{rust}").into(),
                None => rust.into(),
            })
        } else {
            given
        };
        let mut global = global();
        self.flush_locked(&mut global);
        if let Some(session) = global.session.as_mut().filter(|s| s.generation == self.generation.get()) {
            match stack {
                Some(stack) => session.push(Block::Stacked {
                    thread: self.thread(),
                    words: raw.encode(at).0,
                    stack,
                    events: raw.events(),
                }),
                None => {
                    let (words, used) = raw.encode(at);
                    session.push(Block::Chunk {
                        thread: self.thread(),
                        words: words[..used].into(),
                        events: raw.events(),
                    });
                }
            }
        }
    }
}

impl Drop for Local {
    /// At thread exit: the staged events go to the ring, the chunk leaves the registry.
    fn drop(&mut self) {
        let Some(chunk) = self.chunk.borrow().clone() else { return };
        let mut global = global();
        self.flush_locked(&mut global);
        global.threads.retain(|c| !Arc::ptr_eq(c, &chunk));
    }
}

thread_local! {
    static LOCAL: Local = const { Local::new() };
}

/// Runs `f` with this thread's recorder state (`None` while the thread exits).
#[inline]
pub(super) fn with_local<R>(f: impl FnOnce(&Local) -> R) -> Option<R> {
    LOCAL.try_with(f).ok()
}

/// The names events refer to by number.
pub(super) struct Names {
    pub(super) devices: HashMap<u64, Arc<str>>,
    /// Devices known only by name, `NAMED | index`.
    named: Vec<Arc<str>>,
    pub(super) calls: Vec<&'static str>,
    call_ids: HashMap<(usize, usize), Call>,
}

/// Fork-aware: a thread of a parent process may have held it at the fork (exporting, or
/// naming a device or call on first sight), and a child that records must not wait for it.
static NAMES: ForkAwareMutex<Option<Names>> = ForkAwareMutex::unwatched(None);

pub(super) struct NamesGuard(MutexGuard<'static, Option<Names>>);

impl std::ops::Deref for NamesGuard {
    type Target = Names;
    fn deref(&self) -> &Names {
        self.0.as_ref().expect("names are made when locked")
    }
}

impl std::ops::DerefMut for NamesGuard {
    fn deref_mut(&mut self) -> &mut Names {
        self.0.as_mut().expect("names are made when locked")
    }
}

/// The names, locked; `None` in a forked child whose parent's thread held them at the fork
/// (the child's events then name what it could not register `?`, or `device N`).
pub(super) fn names() -> Option<NamesGuard> {
    crate::backend::fork::watch_every_fork();
    let mut guard = NAMES.lock()?;
    guard.get_or_insert_with(Names::empty);
    Some(NamesGuard(guard))
}

/// `f` with the names ([`names`]), or with none known.
pub(super) fn with_names<R>(f: impl FnOnce(&Names) -> R) -> R {
    match names() {
        Some(names) => f(&names),
        None => f(&Names::empty()),
    }
}

/// A call's number when the names cannot be had ([`names`]): exported as `?`.
const UNNAMED_CALL: Call = Call::MAX;

#[cold]
fn intern_call(call: &'static str) -> Call {
    let Some(mut names) = names() else { return UNNAMED_CALL };
    let key = (call.as_ptr() as usize, call.len());
    if let Some(&id) = names.call_ids.get(&key) {
        return id;
    }
    let id = names.calls.len() as Call;
    names.calls.push(call);
    names.call_ids.insert(key, id);
    id
}

/// The number of a device known only by `name` (`host` is [`HOST`]).
pub(super) fn named_device(name: &str) -> Dev {
    if name == "host" {
        return HOST;
    }
    let Some(mut names) = names() else { return NAMED | (NAMED - 1) };
    if let Some(i) = names.named.iter().position(|n| &**n == name) {
        return NAMED | i as u64;
    }
    names.named.push(name.into());
    NAMED | (names.named.len() - 1) as u64
}

impl Names {
    fn empty() -> Names {
        Names { devices: HashMap::new(), named: Vec::new(), calls: Vec::new(), call_ids: HashMap::new() }
    }

    /// The name of `device`.
    pub(super) fn device(&self, device: Dev) -> Arc<str> {
        if device == HOST {
            return "host".into();
        }
        if device & NAMED != 0 {
            return self.named.get((device & !NAMED) as usize).cloned().unwrap_or_else(|| "?".into());
        }
        self.devices.get(&device).cloned().unwrap_or_else(|| format!("device {device}").into())
    }

    /// The name of `call`.
    pub(super) fn call(&self, call: Call) -> &'static str {
        self.calls.get(call as usize).copied().unwrap_or("?")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names that share a slot pair of the thread's cache (any number of them) keep their
    /// numbers, and each number names its call when exported.
    #[test]
    fn call_numbers_hold_however_many_names_share_a_cache_pair() {
        const NAMES: [&str; 40] = [
            "c00", "c01", "c02", "c03", "c04", "c05", "c06", "c07", "c08", "c09", "c10", "c11", "c12", "c13",
            "c14", "c15", "c16", "c17", "c18", "c19", "c20", "c21", "c22", "c23", "c24", "c25", "c26", "c27",
            "c28", "c29", "c30", "c31", "c32", "c33", "c34", "c35", "c36", "c37", "c38", "c39",
        ];
        with_local(|local| {
            let first: Vec<Call> = NAMES.iter().map(|name| local.call(name)).collect();
            for _ in 0..3 {
                let again: Vec<Call> = NAMES.iter().rev().map(|name| local.call(name)).collect();
                assert!(again.iter().rev().eq(first.iter()));
            }
            let names = names().unwrap();
            for (name, id) in NAMES.iter().zip(&first) {
                assert_eq!(names.calls[*id as usize], *name);
            }
        })
        .unwrap();
    }

    #[test]
    fn every_state_round_trips() {
        for (i, state) in BufferState::ALL.iter().enumerate() {
            assert_eq!(*state as usize, i);
        }
        for (from, to) in BufferState::ALL.iter().zip(BufferState::ALL.iter().rev()) {
            let raw = Raw::State { buffer: 7, from: *from, to: *to, call: 3 };
            let (words, used) = raw.encode(11);
            assert_eq!(Raw::decode(&words), Some((raw, used)));
        }
    }

    #[test]
    fn the_thread_that_stops_the_recorder_keeps_no_event_memory() {
        begin(&mut global(), 16, false);
        with_local(|l| l.push(now(), Raw::Pool { hit: true, device: HOST, bytes: 1 }));
        assert_eq!(with_local(|l| l.chunk.borrow().is_some()), Some(true));
        let ended = end(&mut global());
        assert_eq!(ended.map(|s| s.generation != 0), Some(true));
        assert_eq!(with_local(|l| l.chunk.borrow().is_none()), Some(true));
        // The next session takes a new chunk.
        begin(&mut global(), 16, false);
        with_local(|l| l.push(now(), Raw::Pool { hit: false, device: HOST, bytes: 2 }));
        let (events, _) = collect(&global());
        assert!(matches!(events[..], [Entry { raw: Raw::Pool { hit: false, bytes: 2, .. }, .. }]));
        end(&mut global());
    }

    #[test]
    fn every_kind_round_trips() {
        let raws = [
            Raw::Transfer {
                buffer: 1,
                op: 2,
                direction: Direction::DeviceToDevice,
                bytes: 3,
                from: 4,
                to: NAMED | 5,
                call: 6,
                reason: Reason::Eviction,
                stream: 7,
                start: 8,
                waited: true,
            },
            Raw::Allocate { buffer: 1, device: 2, kind: MemoryKind::Device, bytes: 3, source: Source::Cache },
            Raw::Free { buffer: 0, device: HOST, kind: MemoryKind::Host, bytes: 9 },
            Raw::Pool { hit: true, device: 4, bytes: 5 },
            Raw::Rollback { buffer: 1, op: 2, allocations: 255, call: u32::MAX },
            Raw::State { buffer: 1, from: BufferState::HostOnly, to: BufferState::Elsewhere, call: 2 },
            Raw::CheckerRead { buffer: 1, device: 2, bytes: 3, start: 4 },
            Raw::Released {
                buffer: 1,
                device: NAMED | 2,
                kind: MemoryKind::Host,
                bytes: 3,
                from: BufferState::Synchronized,
                to: BufferState::Uninitialized,
                call: 4,
            },
            Raw::Allocated {
                buffer: 1,
                device: 2,
                kind: MemoryKind::Pinned,
                bytes: 3,
                source: Source::Cache,
                from: BufferState::Uninitialized,
                to: BufferState::HostOnly,
                call: u32::MAX,
            },
        ];
        let mut staged = Vec::new();
        for raw in raws {
            let (words, used) = raw.encode(42);
            assert_eq!(used, raw.words());
            assert_eq!(Raw::decode(&words), Some((raw, used)));
            // Staged over an earlier event's words: exactly the words 0..used are written.
            let mut slot = [u64::MAX; WORDS];
            let mut written = Vec::new();
            raw.write(42, |i, value| {
                slot[i] = value;
                written.push(i);
            });
            written.sort_unstable();
            assert_eq!(written, (0..used).collect::<Vec<_>>(), "{raw:?}");
            assert_eq!(Raw::decode(&slot), Some((raw, used)), "{raw:?} over stale words");
            staged.extend_from_slice(&words[..used]);
        }
        // Back to back, as a chunk stages them.
        let mut out = Vec::new();
        decode_all(&staged, 3, None, &mut out);
        // Each record as the public events it stands for: a release as its free and its
        // transition, an access's allocation as the allocation and its transition.
        let expanded: Vec<Raw> = raws
            .iter()
            .flat_map(|raw| {
                let (first, second) = raw.expand();
                std::iter::once(first).chain(second)
            })
            .collect();
        assert_eq!(expanded.len(), raws.iter().map(Raw::events).sum::<usize>());
        assert!(out.iter().map(|e| e.raw).eq(expanded));
        assert!(matches!(
            Raw::Allocated {
                buffer: 1,
                device: 2,
                kind: MemoryKind::Host,
                bytes: 3,
                source: Source::Upstream,
                from: BufferState::Uninitialized,
                to: BufferState::HostOnly,
                call: 5
            }
            .expand(),
            (
                Raw::Allocate {
                    buffer: 1,
                    device: 2,
                    kind: MemoryKind::Host,
                    bytes: 3,
                    source: Source::Upstream
                },
                Some(Raw::State {
                    buffer: 1,
                    from: BufferState::Uninitialized,
                    to: BufferState::HostOnly,
                    call: 5
                })
            )
        ));
        assert!(out.iter().all(|e| e.time == 42 && e.thread == 3));
        assert_eq!(Raw::decode(&[0; WORDS]), None);
    }
}
