//! Model-based property test of the coherence contract.
//!
//! Random sequences of every buffer operation run against a real buffer (on every device, and
//! on two devices at once) and against a plain reference model written from SPEC section 1
//! and the completion rules of docs/CONTRACT.md. After every step the test checks: the data (every
//! element the model knows), the state against both devices, the bytes moved in each
//! direction, zero-copy syncs, and the number of allocations. The model counts exactly the
//! copies the contract requires, so a transfer the contract does not require fails the test.
//!
//! Each sequence also draws a configuration:
//! - where memory comes from: the backends directly, the device's default pool (caching by
//!   default), a private pool that zeroes reused blocks, or a limiting adaptor over a pool;
//!   host copies pinned or not (where the device has pinned host memory);
//! - whether copy faults fail at the call or, as a runtime reports failures during execution,
//!   only when their transfer is waited on;
//! - whether copies complete at once or only when the sequence says so (`Complete`), in any
//!   order, or when someone waits for them.
//!
//! Faults are part of the sequences: an `Arm*` step makes the next operation's n-th
//! allocation or copy fail (through `lazybuf::testing::FaultyDevice`); the operation (or, for
//! a fault at wait, the first call that waits for its transfer) must return that error and
//! leave state, counters and every valid byte as they were before that transfer.
//! Asynchronous syncs (`SyncAsync`) are settled by `Poll`, `Finish`, or the first access that
//! depends on them, as the completion rules (docs/CONTRACT.md) say.
//!
//! The stream-ordered device access (`RawBuffer::device_access_ordered`, Python's `.device`) is
//! part of the sequences too (`DeviceOrdered`), with the two calls that keep its stream's order
//! instead of waiting: a declared write of that copy (`MarkDirtyOn`) and a read into memory
//! outside the buffer (`ReadInto`, straight from a device copy while the host is stale). Where
//! the access needs an upload in the order of the copy's stream, the upload is left in flight
//! (`Pending::upload_to`); which uploads are is the model's [`Uploads`] of each device (an
//! upload done when the call returns is not). A mark made while such an upload is in flight is
//! undone with it if it fails (`Pending::revalidate`), so every later write waits for it first
//! (`conflicts`).
//! An upload in the stream's order fails only where its stream runs it: the CUDA driver test
//! double's own fault (`ArmStreamFault`, its next device write failing at the stream's next
//! event), since a `FaultyDevice` fault's ticket has failed already and is in no stream's order.
//! A third test runs such sequences, denser in these steps, on the double.
//!
//! The coherence checker is on for the whole binary: a sequence that declares every write
//! must never trip it. A host read it checks first settles every transfer in flight into a
//! device copy (`expect_host_read`): a failed one is the read's error. `PROPTEST_CASES` sets the number of sequences (default 2000).

mod common;
#[cfg(feature = "cuda")]
mod cuda_common;

use std::sync::{Arc, Mutex, PoisonError};

use common::pattern;
use lazybuf::host_memory::HostMemory;
use lazybuf::testing::{FaultPlan, FaultyDevice};
use lazybuf::{
    BackendKind, BufferOptions, BufferState, Device, DirectResource, Error, LimitingResource, MemoryPool,
    MemoryResource, PoolConfig, UnifiedBuffer,
};
use proptest::prelude::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Loc {
    Host,
    Dev(usize),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Res {
    Unallocated,
    Stale,
    Valid,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Access {
    Read,
    Write,
    Overwrite,
}

#[derive(Clone, Debug)]
enum Op {
    HostRead,
    HostWrite(u32),
    HostOverwrite(u32),
    DeviceRead(usize),
    DeviceWrite(usize, u32),
    DeviceOverwrite(usize, u32),
    SyncToDevice,
    SyncToHost,
    SyncTo(usize),
    SyncAsync(Option<usize>),
    Complete(prop::sample::Index),
    Poll,
    Finish,
    MarkHostDirty,
    MarkDeviceDirty,
    MarkDirtyOn(usize),
    Fill(u32),
    CopyFrom(u32),
    ToVec,
    Invalidate,
    Release,
    ArmAllocationFault(usize, u64),
    ArmCopyFault(usize, u64),
    /// The CUDA test double's n-th device write of the next operation fails (nothing where no
    /// device is the double).
    ArmStreamFault(u64),
    /// `device_access_ordered` on a device; `true`: then waits for the ticket it returns.
    DeviceOrdered(usize, bool),
    /// `read_into` memory outside the buffer.
    ReadInto,
}

fn op_strategy(devices: usize) -> impl Strategy<Value = Op> {
    let dev = 0..devices;
    prop_oneof![
        3 => Just(Op::HostRead),
        3 => any::<u32>().prop_map(Op::HostWrite),
        2 => any::<u32>().prop_map(Op::HostOverwrite),
        3 => dev.clone().prop_map(Op::DeviceRead),
        3 => (dev.clone(), any::<u32>()).prop_map(|(d, s)| Op::DeviceWrite(d, s)),
        2 => (dev.clone(), any::<u32>()).prop_map(|(d, s)| Op::DeviceOverwrite(d, s)),
        2 => Just(Op::SyncToDevice),
        2 => Just(Op::SyncToHost),
        1 => dev.clone().prop_map(Op::SyncTo),
        4 => prop::option::of(dev.clone()).prop_map(Op::SyncAsync),
        3 => any::<prop::sample::Index>().prop_map(Op::Complete),
        1 => Just(Op::Poll),
        1 => Just(Op::Finish),
        1 => Just(Op::MarkHostDirty),
        1 => Just(Op::MarkDeviceDirty),
        1 => dev.clone().prop_map(Op::MarkDirtyOn),
        2 => any::<u32>().prop_map(Op::Fill),
        2 => any::<u32>().prop_map(Op::CopyFrom),
        1 => Just(Op::ToVec),
        1 => Just(Op::Invalidate),
        1 => Just(Op::Release),
        2 => (dev.clone(), 1..4u64).prop_map(|(d, n)| Op::ArmAllocationFault(d, n)),
        2 => (dev.clone(), 1..4u64).prop_map(|(d, n)| Op::ArmCopyFault(d, n)),
        2 => (1..4u64).prop_map(Op::ArmStreamFault),
        4 => (dev, any::<bool>()).prop_map(|(d, wait)| Op::DeviceOrdered(d, wait)),
        3 => Just(Op::ReadInto),
    ]
}

/// Steps around the stream-ordered access, more often than [`op_strategy`] draws them: the
/// access after a host write (so that it uploads), or failing on the double (its first write:
/// the upload), either followed by the mark of a kernel's write (the batch loop's pattern);
/// the marks and reads that keep the stream's order; writes elsewhere meanwhile.
fn ordered_steps_strategy(devices: usize) -> impl Strategy<Value = Vec<Op>> {
    let dev = 0..devices;
    let then_mark = |mut steps: Vec<Op>, d: usize, mark: bool| {
        if mark {
            steps.push(Op::MarkDirtyOn(d));
        }
        steps
    };
    prop_oneof![
        6 => op_strategy(devices).prop_map(|op| vec![op]),
        3 => (any::<u32>(), dev.clone(), any::<bool>(), any::<bool>()).prop_map(move |(s, d, wait, mark)| {
            then_mark(vec![Op::CopyFrom(s), Op::DeviceOrdered(d, wait)], d, mark)
        }),
        3 => (dev.clone(), any::<bool>(), any::<bool>()).prop_map(move |(d, wait, mark)| {
            then_mark(vec![Op::ArmStreamFault(1), Op::DeviceOrdered(d, wait)], d, mark)
        }),
        2 => dev.clone().prop_map(|d| vec![Op::MarkDirtyOn(d)]),
        2 => Just(vec![Op::ReadInto]),
        2 => (dev, any::<u32>()).prop_map(|(d, s)| vec![Op::DeviceOverwrite(d, s)]),
    ]
}

/// `ops` with every device index 0 (for a run on one device).
fn on_device_0(ops: &[Op]) -> Vec<Op> {
    ops.iter()
        .map(|op| match *op {
            Op::DeviceRead(_) => Op::DeviceRead(0),
            Op::DeviceWrite(_, s) => Op::DeviceWrite(0, s),
            Op::DeviceOverwrite(_, s) => Op::DeviceOverwrite(0, s),
            Op::SyncTo(_) => Op::SyncTo(0),
            Op::SyncAsync(Some(_)) => Op::SyncAsync(Some(0)),
            Op::MarkDirtyOn(_) => Op::MarkDirtyOn(0),
            Op::ArmAllocationFault(_, n) => Op::ArmAllocationFault(0, n),
            Op::ArmCopyFault(_, n) => Op::ArmCopyFault(0, n),
            Op::DeviceOrdered(_, wait) => Op::DeviceOrdered(0, wait),
            ref other => other.clone(),
        })
        .collect()
}

/// Where a sequence's buffer takes its memory.
#[derive(Clone, Copy, Debug)]
enum Memory {
    Direct,
    DefaultPool,
    ZeroingPool,
    LimitOverPool,
}

#[derive(Clone, Copy, Debug)]
struct Config {
    memory: Memory,
    pinned: bool,
    /// Copy faults fail at wait rather than at the call.
    deferred: bool,
    /// Copies complete only when released or waited for.
    holding: bool,
}

fn config_strategy() -> impl Strategy<Value = Config> {
    let memory = prop_oneof![
        Just(Memory::Direct),
        Just(Memory::DefaultPool),
        Just(Memory::ZeroingPool),
        Just(Memory::LimitOverPool)
    ];
    (memory, any::<bool>(), any::<bool>(), any::<bool>())
        .prop_map(|(memory, pinned, deferred, holding)| Config { memory, pinned, deferred, holding })
}

/// A transfer the model knows to be in flight.
#[derive(Clone, Debug, PartialEq)]
struct Pending {
    reads: Vec<Loc>,
    writes: Vec<Loc>,
    /// The residency of each written location, and whether the host block existed, before
    /// the transfer (what a failure puts back).
    before: Vec<(Loc, Res)>,
    host_block: bool,
    /// What the transfer added to the counters.
    delta: Counters,
    /// Whether it will fail when waited on.
    fails: bool,
    /// The held completions it waits for (empty: complete, or not held).
    gates: Vec<(usize, u64)>,
    /// The device it uploads to in the order of that copy's stream (`device_access_ordered`):
    /// a mark of that copy and a read of it into outside memory do not wait for it.
    upload_to: Option<usize>,
    /// Locations a mark made after it made stale: current again if it fails.
    revalidate: Vec<Loc>,
}

/// What a read at a location that may be left in flight starts from ([`Model::begin_read`]):
/// with the counters after it, a [`Pending`] transfer.
struct ReadStart {
    reads: Vec<Loc>,
    writes: Vec<Loc>,
    before: Vec<(Loc, Res)>,
    counters: Counters,
    host_block: bool,
}

impl ReadStart {
    /// The transfer in flight this read left, `model` being after it.
    fn into_pending(
        self,
        model: &Model,
        gates: Vec<(usize, u64)>,
        fails: bool,
        upload_to: Option<usize>,
    ) -> Pending {
        Pending {
            reads: self.reads,
            writes: self.writes,
            before: self.before,
            host_block: self.host_block,
            delta: Counters::of(model).minus(self.counters),
            fails,
            gates,
            upload_to,
            revalidate: Vec::new(),
        }
    }
}

/// How an upload to a device completes, which decides whether `device_access_ordered` leaves
/// it in flight (`Model::upload_left_in_flight`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Uploads {
    /// A CUDA copy, whose event is in the order of the copy's stream: later work on that
    /// stream runs after it. Not so for a pageable host block of
    /// `lazybuf::backend::cuda::STAGING_MIN_BYTES` or more, which a worker thread stages
    /// (`Model::staged`).
    StreamOrdered,
    /// Done when the call returns (a done ticket): the host device, loopback devices, wgpu
    /// mapping its buffers.
    AtOnce,
    /// Done on the runtime's own time, in no stream's order lazybuf can use: an OpenCL event, a
    /// wgpu submission.
    Elsewhere,
}

impl Uploads {
    fn of(device: &Device) -> Uploads {
        let kind = device.backend_kind();
        if is_cuda(kind) {
            Uploads::StreamOrdered
        } else if kind == BackendKind::HOST || kind == BackendKind::LOOPBACK || maps_for_transfers(device) {
            Uploads::AtOnce
        } else {
            Uploads::Elsewhere
        }
    }
}

#[cfg(feature = "wgpu")]
fn maps_for_transfers(device: &Device) -> bool {
    device.backend_as::<lazybuf::backend::wgpu::WgpuBackend>().is_some_and(|b| b.maps_for_transfers())
}

#[cfg(not(feature = "wgpu"))]
fn maps_for_transfers(_: &Device) -> bool {
    false
}

/// The counters a transfer adds to.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Counters {
    to_device: u64,
    to_host: u64,
    peer: u64,
    zero_copy: u64,
    allocations: u64,
}

impl Counters {
    fn of(m: &Model) -> Counters {
        Counters {
            to_device: m.to_device_bytes,
            to_host: m.to_host_bytes,
            peer: m.peer_bytes,
            zero_copy: m.zero_copy_syncs,
            allocations: m.allocations,
        }
    }

    fn minus(self, o: Counters) -> Counters {
        Counters {
            to_device: self.to_device - o.to_device,
            to_host: self.to_host - o.to_host,
            peer: self.peer - o.peer,
            zero_copy: self.zero_copy - o.zero_copy,
            allocations: self.allocations - o.allocations,
        }
    }
}

/// The reference model: residency per location, the data as far as it is known, the counters
/// the buffer must report, and the transfers in flight.
#[derive(Clone, Debug, PartialEq)]
struct Model {
    len: usize,
    zero_copy: Vec<bool>,
    /// direct[to][from]: device `to` can be filled from device `from` without the host.
    direct: Vec<Vec<bool>>,
    peer_bytes: u64,
    host: Res,
    devs: Vec<Res>,
    host_block: bool,
    data: Vec<Option<u32>>,
    to_device_bytes: u64,
    to_host_bytes: u64,
    zero_copy_syncs: u64,
    allocations: u64,
    /// The copies and allocations of the last access planned (for the conflict rules).
    trace: Vec<(Option<Loc>, Loc)>,
    pending: Vec<Pending>,
    /// Devices in the order their copies were allocated: a device-to-host copy takes the first
    /// valid one in this order, as the planner does.
    order: Vec<usize>,
    /// How an upload to each device completes.
    uploads: Vec<Uploads>,
    /// The host block is page-locked for CUDA (a pinned buffer on a CUDA device): its CUDA
    /// transfers are never staged.
    pinned_for_cuda: bool,
    /// The last read into outside memory took the bytes straight from a device copy, and
    /// nothing was written since; and: a host access had to download after such a read, so
    /// reads into outside memory go through the host copy from now on (read.rs).
    direct_read: bool,
    host_sync_pays: bool,
}

impl Model {
    fn new(len: usize, zero_copy: Vec<bool>, direct: Vec<Vec<bool>>, uploads: Vec<Uploads>) -> Self {
        let devs = vec![Res::Unallocated; zero_copy.len()];
        Model {
            len,
            zero_copy,
            direct,
            peer_bytes: 0,
            host: Res::Unallocated,
            devs,
            host_block: false,
            data: vec![None; len],
            to_device_bytes: 0,
            to_host_bytes: 0,
            zero_copy_syncs: 0,
            allocations: 0,
            trace: Vec::new(),
            pending: Vec::new(),
            order: Vec::new(),
            uploads,
            pinned_for_cuda: false,
            direct_read: false,
            host_sync_pays: false,
        }
    }

    fn res(&self, at: Loc) -> Res {
        match at {
            Loc::Host => self.host,
            Loc::Dev(i) => self.devs[i],
        }
    }

    fn set(&mut self, at: Loc, r: Res) {
        match at {
            Loc::Host => self.host = r,
            Loc::Dev(i) => {
                if self.devs[i] == Res::Unallocated && r != Res::Unallocated {
                    self.order.push(i);
                } else if r == Res::Unallocated {
                    self.order.retain(|&d| d != i);
                }
                self.devs[i] = r;
            }
        }
    }

    fn any_valid(&self) -> bool {
        self.host == Res::Valid || self.devs.contains(&Res::Valid)
    }

    fn allocate(&mut self, at: Loc) {
        if self.res(at) != Res::Unallocated {
            return;
        }
        self.trace.push((None, at));
        match at {
            Loc::Dev(i) if !self.zero_copy[i] => self.allocations += 1,
            _ => {
                // The host location and zero-copy devices share the one host block.
                if !self.host_block {
                    self.host_block = true;
                    self.allocations += 1;
                }
            }
        }
        self.set(at, Res::Stale);
    }

    fn copy(&mut self, from: Loc, to: Loc) {
        self.trace.push((Some(from), to));
        let bytes = (self.len * 4) as u64;
        match (from, to) {
            (Loc::Host, Loc::Dev(i)) if self.zero_copy[i] => self.zero_copy_syncs += 1,
            (Loc::Dev(i), Loc::Host) if self.zero_copy[i] => self.zero_copy_syncs += 1,
            (Loc::Host, Loc::Dev(_)) => self.to_device_bytes += bytes,
            (Loc::Dev(_), Loc::Host) => self.to_host_bytes += bytes,
            (Loc::Dev(_), Loc::Dev(_)) => self.peer_bytes += bytes,
            _ => panic!("the model never copies {from:?} -> {to:?}"),
        }
        self.set(to, Res::Valid);
    }

    /// SPEC 1, read at L: nothing if valid; else allocate, fill from a valid copy (the host
    /// when it is valid, else a device: directly where the pair allows, else staged through
    /// the host). A read of data nobody holds sees zeros.
    fn read(&mut self, at: Loc) {
        self.make_valid(at, true);
    }

    /// Makes `at` valid as a read does; `zero`: a read of data nobody holds sees zeros (a
    /// write leaves them unspecified).
    fn make_valid(&mut self, at: Loc, zero: bool) {
        if self.res(at) == Res::Valid {
            return;
        }
        self.allocate(at);
        if self.any_valid() {
            if self.host == Res::Valid {
                self.copy(Loc::Host, at);
            } else {
                let valid: Vec<usize> =
                    self.order.iter().copied().filter(|&i| self.devs[i] == Res::Valid).collect();
                let src = Loc::Dev(valid[0]);
                let peer = match at {
                    Loc::Dev(to) => valid.iter().copied().find(|&from| self.direct[to][from]),
                    Loc::Host => None,
                };
                if let Some(from) = peer {
                    self.copy(Loc::Dev(from), at);
                } else if at == Loc::Host {
                    self.copy(src, Loc::Host);
                } else {
                    self.allocate(Loc::Host);
                    self.copy(src, Loc::Host);
                    self.copy(Loc::Host, at);
                }
            }
        } else if zero {
            self.data = vec![Some(0); self.len];
        }
        self.set(at, Res::Valid);
    }

    fn stale_others(&mut self, at: Loc) {
        if at != Loc::Host && self.host == Res::Valid {
            self.host = Res::Stale;
        }
        for i in 0..self.devs.len() {
            if Loc::Dev(i) != at && self.devs[i] == Res::Valid {
                self.devs[i] = Res::Stale;
            }
        }
    }

    fn access(&mut self, at: Loc, access: Access) {
        match access {
            Access::Read => self.read(at),
            Access::Write => {
                self.make_valid(at, false);
                self.stale_others(at);
            }
            Access::Overwrite => {
                self.allocate(at);
                self.set(at, Res::Valid);
                self.stale_others(at);
            }
        }
        if access != Access::Read {
            // A write: the last direct read is no longer what the buffer holds.
            self.direct_read = false;
        }
    }

    /// The allocations (`(None, at)`) and copies an access plans, from a copy of the model.
    fn plan(&self, at: Loc, access: Access) -> Vec<(Option<Loc>, Loc)> {
        let mut probe = Model { pending: Vec::new(), trace: Vec::new(), ..self.clone() };
        probe.access(at, access);
        probe.trace
    }

    /// The locations an access reads and writes (copy sources; copy targets, allocations, and
    /// the accessed location as the access says), from its plan on a copy of the model.
    fn touched(&self, at: Loc, access: Access) -> (Vec<Loc>, Vec<Loc>) {
        let (mut reads, mut writes) = (Vec::new(), Vec::new());
        for (from, to) in self.plan(at, access) {
            reads.extend(from);
            writes.push(to);
        }
        if access == Access::Read {
            reads.push(at)
        } else {
            writes.push(at)
        }
        // By memory: a zero-copy device's copy is the host block.
        let aliased = |l: &Loc| matches!(*l, Loc::Dev(i) if self.zero_copy[i]);
        if reads.iter().any(aliased) {
            reads.push(Loc::Host);
        }
        if writes.iter().any(aliased) {
            writes.push(Loc::Host);
        }
        (reads, writes)
    }

    /// Waits (in the model) for the transfers `which` picks: undoes those that fail; returns
    /// whether one did (the call that waited then reports it and does nothing else).
    fn settle(&mut self, which: impl Fn(&Pending) -> bool) -> bool {
        let mut failed = false;
        let mut i = 0;
        while i < self.pending.len() {
            if !which(&self.pending[i]) {
                i += 1;
                continue;
            }
            let op = self.pending.remove(i);
            if op.fails {
                self.undo(&op);
                failed = true;
            }
        }
        failed
    }

    /// Puts a failed transfer's targets back as they were before it, and its counters. A
    /// location valid before it was never its target (only touched through the host block),
    /// and keeps what later accesses made of it.
    fn undo(&mut self, op: &Pending) {
        for &(at, residency) in &op.before {
            if residency != Res::Valid {
                self.set(at, residency);
            }
        }
        // A mark ordered after a failed upload is undone: the kernel read a copy that never
        // arrived, and what was current before the mark holds the data.
        for &at in &op.revalidate {
            self.set(at, Res::Valid);
        }
        if op.writes.contains(&Loc::Host) {
            self.host_block = op.host_block;
        }
        let d = op.delta;
        self.to_device_bytes -= d.to_device;
        self.to_host_bytes -= d.to_host;
        self.peer_bytes -= d.peer;
        self.zero_copy_syncs -= d.zero_copy;
        self.allocations -= d.allocations;
    }

    /// Settles the transfers an access at `at` depends on; true if one of them failed.
    fn settle_for(&mut self, at: Loc, access: Access) -> bool {
        let (reads, writes) = self.touched(at, access);
        self.settle(|op| conflicts(op, &reads, &writes))
    }

    /// What a read at `at` starts from, for a transfer it may leave in flight.
    fn begin_read(&self, at: Loc) -> ReadStart {
        let (reads, writes) = self.touched(at, Access::Read);
        let before = writes.iter().map(|&w| (w, self.res(w))).collect();
        ReadStart { reads, writes, before, counters: Counters::of(self), host_block: self.host_block }
    }

    /// As [`Self::settle_for`], for an access of device `d` in the order of its copy's stream
    /// (`device_access_ordered`'s hand-out, a mark of that copy): when it copies nothing, the
    /// uploads to that copy in the stream's order stay in flight (work the caller enqueues
    /// next on that stream runs after them).
    /// A write that keeps them (a mark) settles every other transfer first, so what it records
    /// to make current again is current for certain.
    fn settle_for_ordered(&mut self, d: usize, access: Access) -> bool {
        let at = Loc::Dev(d);
        let (reads, writes) = self.touched(at, access);
        let keep = self.plan(at, access).is_empty();
        let kept = |op: &Pending| keep && op.upload_to == Some(d);
        if keep && access != Access::Read {
            return self.settle(|op| !kept(op));
        }
        self.settle(|op| conflicts(op, &reads, &writes) && !kept(op))
    }

    /// Before a mark of device `d`'s copy that leaves the uploads to it in flight: what is
    /// current now besides that copy is current again if one of them fails.
    fn revalidate_on_failure(&mut self, d: usize) {
        let current: Vec<Loc> = std::iter::once(Loc::Host)
            .chain((0..self.devs.len()).map(Loc::Dev))
            .filter(|&at| at != Loc::Dev(d) && self.res(at) == Res::Valid)
            .collect();
        for op in self.pending.iter_mut().filter(|op| op.upload_to == Some(d)) {
            for &at in &current {
                if !op.revalidate.contains(&at) {
                    op.revalidate.push(at);
                }
            }
        }
    }

    /// Whether an upload to `d` from the host block is staged by a worker thread (CUDA, a
    /// pageable block of `STAGING_MIN_BYTES` or more). The lengths drawn stay under that
    /// (`len_strategy`): a pageable block that large is registered with the driver on its
    /// second transfer and then no longer staged, a history (carried by pooled blocks from
    /// buffer to buffer) this model does not follow; cuda_async.rs tests the staged upload.
    fn staged(&self, d: usize) -> bool {
        self.uploads[d] == Uploads::StreamOrdered
            && !self.pinned_for_cuda
            && self.len * 4 >= staging_min_bytes()
    }

    /// Whether `device_access_ordered`, having enqueued an upload to `d` (host current, that
    /// copy not), leaves it in flight rather than waiting for it: an upload in the order of the
    /// copy's stream (a CUDA copy, not staged), whose ticket is no held completion (`holding`:
    /// the `FaultyDevice`'s gate completes in no stream's order) and no injected fault's
    /// (`faulty`: its ticket failed already). An upload done when the call returns (a done
    /// ticket: [`Uploads::AtOnce`], an empty buffer everywhere) is not left in flight: the
    /// access is then `device_access` (the doc comment of `device_access_ordered`).
    fn upload_left_in_flight(&self, d: usize, holding: bool, faulty: bool) -> bool {
        let ordered = match self.uploads[d] {
            // An empty upload reaches no backend: a done ticket.
            Uploads::StreamOrdered => !self.staged(d) && self.len > 0,
            Uploads::AtOnce | Uploads::Elsewhere => false,
        };
        ordered && !holding && !faulty
    }

    /// The device copy a read into outside memory takes the bytes from directly (read.rs:
    /// `direct_source`): the host is not current, a device is (the first in allocation order,
    /// as a host read would download from), and no host access had to download after such a
    /// read.
    fn direct_source(&self) -> Option<usize> {
        if self.host_sync_pays || self.len == 0 || self.host == Res::Valid {
            return None;
        }
        self.order.iter().copied().find(|&i| self.devs[i] == Res::Valid)
    }

    /// A direct read's download from device `d`: counted as the download it is (a zero-copy
    /// sync where the copy aliases the host block); the state does not change.
    fn count_download(&mut self, d: usize) {
        if self.zero_copy[d] {
            self.zero_copy_syncs += 1;
        } else {
            self.to_host_bytes += (self.len * 4) as u64;
        }
    }

    /// Before a host access (once the transfers it depends on are settled): one that copies
    /// into the host after a direct read makes later reads into outside memory go through
    /// the host, even if its copy then fails (read.rs: `note_host_download`).
    fn note_host_download(&mut self, access: Access) {
        if self.direct_read
            && self.plan(Loc::Host, access).iter().any(|&(from, to)| from.is_some() && to == Loc::Host)
        {
            self.host_sync_pays = true;
        }
    }

    /// Fill: at the home device if current, else the host if current, else another current
    /// device, else the host; a write there without transfer.
    fn fill_target(&self) -> Loc {
        if self.devs[0] == Res::Valid {
            Loc::Dev(0)
        } else if self.host == Res::Valid {
            Loc::Host
        } else {
            self.order.iter().copied().find(|&i| self.devs[i] == Res::Valid).map_or(Loc::Host, Loc::Dev)
        }
    }

    /// The model as the buffer reports it now: transfers known to have failed count as undone.
    fn reported(&self, deferred_known: impl Fn(&Pending) -> bool) -> Model {
        let mut view = self.clone();
        for op in self.pending.iter().filter(|op| op.fails && deferred_known(op)) {
            view.undo(op);
        }
        view
    }

    fn state(&self, dev: usize) -> BufferState {
        use Res::*;
        match (self.host, self.devs[dev]) {
            (Valid, Valid) => BufferState::Synchronized,
            (Valid, Stale) => BufferState::HostDirty,
            (Valid, Unallocated) => BufferState::HostOnly,
            (Stale, Valid) => BufferState::DeviceDirty,
            (Unallocated, Valid) => BufferState::DeviceOnly,
            _ if self.any_valid() => BufferState::Elsewhere,
            _ => BufferState::Uninitialized,
        }
    }

    fn known(&self, actual: &[u32]) -> Result<(), TestCaseError> {
        prop_assert_eq!(actual.len(), self.len);
        for (i, (a, m)) in actual.iter().zip(&self.data).enumerate() {
            if let Some(m) = m {
                prop_assert_eq!(a, m, "element {} differs from the model", i);
            }
        }
        Ok(())
    }

    fn set_data(&mut self, values: &[u32]) {
        self.data = values.iter().copied().map(Some).collect();
    }
}

/// Whether an access that reads `reads` and writes `writes` waits for `op` first: they share a
/// location one of them writes, or `op` is an upload a mark was ordered after (its `revalidate`
/// set) and the access writes anything. Undoing that upload after a later write elsewhere would
/// make the copies the mark made stale current beside the newer one.
fn conflicts(op: &Pending, reads: &[Loc], writes: &[Loc]) -> bool {
    let meets = |a: &[Loc], b: &[Loc]| a.iter().any(|l| b.contains(l));
    meets(&op.writes, reads)
        || meets(&op.writes, writes)
        || meets(&op.reads, writes)
        || (!op.revalidate.is_empty() && !writes.is_empty())
}

/// A fault armed for the next operation.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// That device's n-th allocation (`FaultyDevice`).
    Allocation(usize, u64),
    /// That device's n-th copy (`FaultyDevice`): at the call, or at wait when deferred.
    Copy(usize, u64),
    /// The CUDA double's n-th device write (any memcpy or memset): at the call, or, when
    /// deferred, where its stream runs it (the stream's next event reports it).
    Stream(u64),
}

/// A counter an armed fault fires at, and the count it fires at.
#[derive(Clone, Copy, Debug)]
enum Trigger {
    Allocations(usize, u64),
    Copies(usize, u64),
    DoubleWrites(u64),
}

struct Harness {
    devices: Vec<Device>,
    plans: Vec<Arc<FaultPlan>>,
    armed: Option<Fault>,
    config: Config,
    /// A device is the CUDA driver test double (whose fault hooks `Fault::Stream` uses).
    double: bool,
    /// Where the fault armed for the current operation fires (`None`: none armed).
    trigger: Option<Trigger>,
}

impl Harness {
    fn arm(&mut self) {
        self.trigger = match self.armed.take() {
            None => None,
            Some(Fault::Allocation(dev, n)) => {
                self.plans[dev].fail_allocation_in(n);
                Some(Trigger::Allocations(dev, self.plans[dev].allocations() + n))
            }
            Some(Fault::Copy(dev, n)) => {
                self.plans[dev].fail_copy_in(n);
                Some(Trigger::Copies(dev, self.plans[dev].copies() + n))
            }
            Some(Fault::Stream(n)) => {
                let at = double::writes() + n;
                double::fail_write(n, self.config.deferred);
                Some(Trigger::DoubleWrites(at))
            }
        };
    }

    fn disarm(&self) {
        self.plans.iter().for_each(|p| p.disarm());
        if self.double {
            double::fail_write(0, false);
        }
    }

    /// Whether the fault armed for this operation fired: its counter reached it.
    fn fired(&self) -> bool {
        match self.trigger {
            None => false,
            Some(Trigger::Allocations(dev, at)) => self.plans[dev].allocations() >= at,
            Some(Trigger::Copies(dev, at)) => self.plans[dev].copies() >= at,
            Some(Trigger::DoubleWrites(at)) => double::writes() >= at,
        }
    }

    /// Whether a copy fault that fails at wait (`deferred`) fired in this operation: the
    /// transfer it enqueued fails when waited on.
    fn deferred_copy_fault_fired(&self) -> bool {
        self.config.deferred && !matches!(self.trigger, Some(Trigger::Allocations(..)) | None) && self.fired()
    }

    /// Whether [`Self::deferred_copy_fault_fired`] is the `FaultyDevice`'s: its ticket has
    /// failed already and is in no stream's order (the double's fails at its stream's event).
    fn faulty_ticket(&self) -> bool {
        self.deferred_copy_fault_fired() && matches!(self.trigger, Some(Trigger::Copies(..)))
    }

    fn held(&self) -> Vec<(usize, u64)> {
        self.plans.iter().enumerate().flat_map(|(d, p)| p.held().into_iter().map(move |id| (d, id))).collect()
    }

    /// Whether the buffer can know a pending transfer has failed without waiting: its fault
    /// is in a ticket that is complete (not held, or released; the double's once its stream
    /// got there, see `check_state`).
    fn known_failed(&self, op: &Pending) -> bool {
        let held = self.held();
        op.gates.iter().all(|gate| !held.contains(gate))
    }

    /// Lets the devices finish the work nobody holds (a poll then finds it complete, and a
    /// failure on the CUDA double known).
    fn synchronize(&self) {
        for device in &self.devices {
            device.synchronize().unwrap();
        }
    }
}

/// The CUDA driver test double's hooks (`cuda_common`): they are process-wide, so a sequence
/// on the double holds [`DOUBLE`] while it runs.
#[cfg(feature = "cuda")]
mod double {
    pub use super::cuda_common::is_double;

    /// Device writes (memcpy and memset) the double has done.
    pub fn writes() -> u64 {
        super::cuda_common::copies() as u64
    }

    /// Makes the n-th device write from now fail, at its stream's next event when
    /// `deferred`, else at the call (0 disarms).
    pub fn fail_write(n: u64, deferred: bool) {
        if deferred {
            super::cuda_common::fail_copy(n as i64)
        } else {
            super::cuda_common::fail_copy_now(n as i64)
        }
    }
}

#[cfg(not(feature = "cuda"))]
mod double {
    pub fn is_double(_: &lazybuf::Device) -> bool {
        false
    }

    pub fn writes() -> u64 {
        0
    }

    pub fn fail_write(_: u64, _: bool) {}
}

/// Held by a sequence on the CUDA double: its fault hooks and write counter are the process's.
static DOUBLE: Mutex<()> = Mutex::new(());

#[cfg(feature = "cuda")]
fn is_cuda(kind: BackendKind) -> bool {
    kind == BackendKind::CUDA
}

#[cfg(not(feature = "cuda"))]
fn is_cuda(_: BackendKind) -> bool {
    false
}

#[cfg(feature = "cuda")]
fn staging_min_bytes() -> usize {
    lazybuf::backend::cuda::STAGING_MIN_BYTES
}

#[cfg(not(feature = "cuda"))]
fn staging_min_bytes() -> usize {
    usize::MAX
}

/// An injected failure: the `FaultyDevice`'s, or the CUDA double's failed write (at its
/// stream's event: LAUNCH_FAILED; at the call: UNKNOWN).
fn is_injected(err: &Error) -> bool {
    match err {
        Error::InjectedFault { .. } => true,
        Error::Runtime { backend, code, .. } if is_cuda(*backend) => {
            let code = code.to_string();
            code.contains("CUDA_ERROR_LAUNCH_FAILED") || code.contains("CUDA_ERROR_UNKNOWN")
        }
        _ => false,
    }
}

/// Runs one coherence operation with any armed fault; on an injected error checks that the
/// buffer is exactly as the (unchanged) model says.
fn guarded<R>(
    h: &mut Harness,
    buf: &mut UnifiedBuffer<u32>,
    model: &Model,
    op: impl FnOnce(&mut UnifiedBuffer<u32>) -> lazybuf::Result<R>,
) -> Result<Option<R>, TestCaseError> {
    h.arm();
    let result = op(buf);
    h.disarm();
    match result {
        Ok(r) => Ok(Some(r)),
        Err(err) if is_injected(&err) => {
            check_state(h, buf, model)?;
            Ok(None)
        }
        Err(other) => Err(TestCaseError::fail(format!("unexpected error: {other}"))),
    }
}

fn check_state(h: &Harness, buf: &UnifiedBuffer<u32>, model: &Model) -> Result<(), TestCaseError> {
    if model.pending.iter().any(|op| op.fails) {
        // A failure on the CUDA double shows when its stream gets there: let it get there.
        h.synchronize();
    }
    let model = model.reported(|op| h.known_failed(op));
    for (i, d) in h.devices.iter().enumerate() {
        prop_assert_eq!(buf.state_on(d), model.state(i), "state against device {}", i);
    }
    prop_assert_eq!(buf.state(), model.state(0));
    let stats = buf.transfer_stats();
    prop_assert_eq!(stats.host_to_device.bytes, model.to_device_bytes, "host->device bytes");
    prop_assert_eq!(stats.device_to_host.bytes, model.to_host_bytes, "device->host bytes");
    prop_assert_eq!(stats.device_to_device.bytes, model.peer_bytes, "peer bytes");
    prop_assert_eq!(stats.zero_copy_syncs, model.zero_copy_syncs, "zero-copy syncs");
    prop_assert_eq!(stats.allocations, model.allocations, "allocations");
    prop_assert_eq!(buf.is_busy(), !model.pending.is_empty(), "transfers in flight");
    Ok(())
}

/// The resource a sequence's buffer uses (`None`: the device's default, a pool).
fn resource(config: Config, device: &Device) -> Option<Arc<dyn MemoryResource>> {
    let pool = |config| MemoryPool::new(device, config).resource();
    match config.memory {
        Memory::Direct => Some(DirectResource::shared()),
        Memory::DefaultPool => None,
        Memory::ZeroingPool => Some(pool(PoolConfig { zero_reused: true, ..PoolConfig::default() })),
        Memory::LimitOverPool => Some(Arc::new(LimitingResource::new(pool(PoolConfig::default()), 1 << 30))),
    }
}

/// An access the model settles dependencies for: `Err(())` when a transfer it waited for
/// failed (the buffer must then return that error and change nothing else).
fn expect_access(model: &mut Model, at: Loc, access: Access) -> Result<(), ()> {
    if model.settle_for(at, access) { Err(()) } else { Ok(()) }
}

/// A host read (`host`, `to_vec`, `sync_to_host`, `read_into` through the host, an asynchronous
/// sync to the host that copies nothing): the access's
/// own dependencies, then, with the coherence checker on (the whole binary) and the host
/// current, every transfer in flight into a device copy, which the checker compares with the
/// host once it has landed (raw/checker.rs); a failed one is undone and the read returns its
/// error.
fn expect_host_read(model: &mut Model) -> Result<(), ()> {
    expect_checked_host_access(model, Access::Read)
}

/// A host access the coherence checker checks: a read ([`expect_host_read`]), or a write that
/// keeps the bytes it does not change (`host_mut`, `mark_host_dirty`), checked as a read is.
fn expect_checked_host_access(model: &mut Model, access: Access) -> Result<(), ()> {
    expect_access(model, Loc::Host, access)?;
    let into_device = |p: &Pending| p.writes.iter().any(|l| matches!(l, Loc::Dev(_)));
    if model.host == Res::Valid && model.settle(into_device) { Err(()) } else { Ok(()) }
}

/// Checks that a call the model expects to fail on a settled transfer did, with an injected
/// fault, and that a call expected to succeed (or fail on its own armed fault) did so.
fn observe<R>(
    h: &mut Harness,
    buf: &mut UnifiedBuffer<u32>,
    model: &Model,
    expected: Result<(), ()>,
    op: impl FnOnce(&mut UnifiedBuffer<u32>) -> lazybuf::Result<R>,
) -> Result<Option<R>, TestCaseError> {
    match expected {
        Ok(()) => guarded(h, buf, model, op),
        Err(()) => {
            h.armed = None;
            let result = op(buf);
            h.disarm();
            match result {
                Err(err) if is_injected(&err) => {
                    check_state(h, buf, model)?;
                    Ok(None)
                }
                Err(other) => {
                    Err(TestCaseError::fail(format!("expected a transfer's injected fault, got {other}")))
                }
                Ok(_) => Err(TestCaseError::fail("a failed transfer in flight was not reported")),
            }
        }
    }
}

/// `DeviceOrdered(d, wait)`: `device_access_ordered` on device `d`. Where the access needs an
/// upload from the current host and nothing else, the upload is enqueued as an asynchronous
/// sync is, and left in flight where it is in the order of the copy's stream
/// ([`Model::upload_left_in_flight`]), else waited for (a failure then is the call's). Otherwise
/// it is `device_access` for a read, except that, copying nothing, it leaves the uploads to that
/// copy in flight, first settling those found complete. With `wait`, the ticket it returns (the
/// uploads to that copy in flight) is waited for: it fails exactly when one of them does.
fn device_ordered(
    h: &mut Harness,
    buf: &mut UnifiedBuffer<u32>,
    model: &mut Model,
    d: usize,
    wait: bool,
) -> Result<(), TestCaseError> {
    let device = h.devices[d].clone();
    let at = Loc::Dev(d);
    let plan = model.plan(at, Access::Read);
    let copies = plan.iter().any(|(from, _)| from.is_some());
    let only_uploads =
        copies && plan.iter().all(|&(from, to)| to == at && from.is_none_or(|f| f == Loc::Host));
    let access =
        |b: &mut UnifiedBuffer<u32>| b.raw_mut().device_access_ordered(&device).map(|(_, ticket)| ticket);
    let ticket = if model.any_valid() && only_uploads {
        let expected = expect_access(model, at, Access::Read);
        let held = h.held();
        let Some(ticket) = observe(h, buf, model, expected, access)? else { return Ok(()) };
        let in_flight = model.upload_left_in_flight(d, h.config.holding, h.faulty_ticket());
        let fails = h.deferred_copy_fault_fired();
        prop_assert!(
            in_flight || !fails,
            "the upload the call waited for failed, and the call did not say so"
        );
        let start = model.begin_read(at);
        model.read(at);
        if in_flight {
            let gates = h.held().into_iter().filter(|g| !held.contains(g)).collect();
            let pending = start.into_pending(model, gates, fails, Some(d));
            model.pending.push(pending);
        }
        ticket
    } else {
        if model.any_valid() && !copies && model.pending.iter().any(|p| p.upload_to == Some(d)) {
            // The uploads to that copy found complete (a query each) are settled: let the
            // runtime complete them, so the model knows which are (all but the failed).
            h.synchronize();
            model.settle(|p| p.upload_to == Some(d) && !p.fails);
        }
        let expected = if model.settle_for_ordered(d, Access::Read) { Err(()) } else { Ok(()) };
        let Some(ticket) = observe(h, buf, model, expected, access)? else { return Ok(()) };
        model.read(at);
        ticket
    };
    if wait {
        let fails = model.pending.iter().any(|p| p.upload_to == Some(d) && p.fails);
        let waited = ticket.wait();
        prop_assert_eq!(waited.is_err(), fails, "the ticket of the uploads in flight: {:?}", waited);
    }
    Ok(())
}

/// `ReadInto`: `read_into` memory outside the buffer (read.rs). With the host current (or
/// nothing, or once a host access had to download after a direct read) it is a host read and
/// one copy out of the host block. Else the current device copy is downloaded straight into
/// that memory and the state does not change; the uploads to that copy in its stream's order
/// are not waited for first (the download runs after them on that stream) but settled after
/// it. A failed upload comes first: the call returns its error and the download is not
/// counted.
fn read_into(h: &mut Harness, buf: &mut UnifiedBuffer<u32>, model: &mut Model) -> Result<(), TestCaseError> {
    let len = model.len;
    let mut out = HostMemory::allocate(len * 4).unwrap();
    let Some(src) = model.direct_source() else {
        let expected = expect_host_read(model);
        if expected.is_ok() {
            model.note_host_download(Access::Read);
        }
        if observe(h, buf, model, expected, |b| b.raw_mut().read_into(&mut out))?.is_some() {
            model.read(Loc::Host);
            model.known(&words(&out, len))?;
        }
        return Ok(());
    };
    let (reads, writes) = model.touched(Loc::Host, Access::Read);
    if model.settle(|p| conflicts(p, &reads, &writes) && p.upload_to != Some(src)) {
        return observe(h, buf, model, Err(()), |b| b.raw_mut().read_into(&mut out)).map(drop);
    }
    h.arm();
    let result = buf.raw_mut().read_into(&mut out);
    h.disarm();
    // The download is the call's only copy: a fault armed for the call that fired failed it.
    let download_failed = h.fired();
    let upload_failed = model.settle(|p| p.upload_to == Some(src));
    match result {
        Ok(()) if !download_failed && !upload_failed => {
            model.count_download(src);
            model.direct_read = true;
            model.known(&words(&out, len))
        }
        Err(err) if is_injected(&err) && (download_failed || upload_failed) => Ok(()),
        other => Err(TestCaseError::fail(format!(
            "read_into from device {src}: {other:?}; model: download failed {download_failed}, \
             an upload failed {upload_failed}"
        ))),
    }
}

/// The first `len` elements of `out`.
fn words(out: &HostMemory, len: usize) -> Vec<u32> {
    out.as_slice()[..len * 4].chunks_exact(4).map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn run(base: &[Device], len: usize, config: Config, ops: &[Op]) -> Result<(), TestCaseError> {
    let (devices, plans): (Vec<_>, Vec<_>) = base.iter().map(FaultyDevice::wrap).unzip();
    for plan in &plans {
        plan.defer_copy_faults(config.deferred);
        plan.hold_completions(config.holding);
    }
    let zero_copy = devices.iter().map(|d| d.is_zero_copy(len * 4)).collect();
    let direct =
        devices.iter().map(|to| devices.iter().map(|from| to.can_copy_from(from)).collect()).collect();
    // `Model::staged`: a length that a CUDA device stages would need the host block's history.
    assert!(len * 4 < staging_min_bytes(), "{len} elements are staged on CUDA devices: not modelled");
    let uploads = base.iter().map(Uploads::of).collect();
    let double = base.iter().any(double::is_double);
    // The double's hooks and counters are the process's: one sequence on it at a time.
    let _double = double.then(|| DOUBLE.lock().unwrap_or_else(PoisonError::into_inner));
    let mut h = Harness { devices, plans, armed: None, config, double, trigger: None };
    h.disarm();
    let pinned = config.pinned && h.devices[0].can_pin_host_memory();
    let options = BufferOptions {
        device: Some(h.devices[0].clone()),
        // Pinned host copies on devices that have them (wgpu refuses; `wgpu.rs` tests that).
        pinned,
        resource: resource(config, &h.devices[0]),
        ..BufferOptions::default()
    };
    let mut buf = UnifiedBuffer::<u32>::with_options(&[len], options).unwrap();
    let mut model = Model::new(len, zero_copy, direct, uploads);
    model.pinned_for_cuda = pinned && is_cuda(h.devices[0].backend_kind());
    let mut scratch = vec![0u32; len];

    for op in ops {
        let before = model.clone();
        h.trigger = None;
        match *op {
            Op::ArmAllocationFault(d, n) => h.armed = Some(Fault::Allocation(d, n)),
            Op::ArmCopyFault(d, n) => h.armed = Some(Fault::Copy(d, n)),
            // Only the double has these hooks; elsewhere the step arms nothing.
            Op::ArmStreamFault(n) => h.armed = h.double.then_some(Fault::Stream(n)),
            Op::HostRead | Op::ToVec | Op::SyncToHost => {
                let expected = expect_host_read(&mut model);
                if expected.is_ok() {
                    model.note_host_download(Access::Read);
                }
                let got = observe(&mut h, &mut buf, &model, expected, |b| match op {
                    Op::SyncToHost => b.sync_to_host().map(|()| None),
                    Op::ToVec => b.to_vec().map(Some),
                    _ => b.host().map(|s| Some(s.to_vec())),
                })?;
                if let Some(got) = got {
                    model.read(Loc::Host);
                    if let Some(values) = got {
                        model.known(&values)?;
                    }
                }
            }
            Op::HostWrite(seed) => {
                let expected = expect_checked_host_access(&mut model, Access::Write);
                if expected.is_ok() {
                    model.note_host_download(Access::Write);
                }
                if let Some(host) =
                    observe(&mut h, &mut buf, &model, expected, |b| b.host_mut().map(|s| s as *mut [u32]))?
                {
                    model.access(Loc::Host, Access::Write);
                    // SAFETY: (test) the slice was just returned by host_mut and the buffer
                    // is not touched until this block ends.
                    let host = unsafe { &mut *host };
                    model.known(host)?;
                    if let Some(first) = host.first_mut() {
                        *first = seed;
                        model.data[0] = Some(seed);
                    }
                }
            }
            Op::HostOverwrite(seed) | Op::CopyFrom(seed) => {
                let values = pattern(seed, len);
                let expected = expect_access(&mut model, Loc::Host, Access::Overwrite);
                let done = observe(&mut h, &mut buf, &model, expected, |b| match op {
                    Op::CopyFrom(_) => b.copy_from(&values),
                    _ => b.host_overwrite().map(|s| s.copy_from_slice(&values)),
                })?;
                if done.is_some() {
                    model.access(Loc::Host, Access::Overwrite);
                    model.set_data(&values);
                }
            }
            Op::DeviceRead(d) | Op::SyncTo(d) => {
                let device = h.devices[d].clone();
                let expected = expect_access(&mut model, Loc::Dev(d), Access::Read);
                let done = observe(&mut h, &mut buf, &model, expected, |b| match op {
                    Op::SyncTo(_) => b.sync_to(&device),
                    _ => b.device_on(&device).map(drop),
                })?;
                if done.is_some() {
                    model.read(Loc::Dev(d));
                    buf.device_on(&device).unwrap().read_into(&mut scratch).unwrap();
                    model.known(&scratch)?;
                }
            }
            Op::DeviceWrite(d, seed) => {
                let device = h.devices[d].clone();
                let expected = expect_access(&mut model, Loc::Dev(d), Access::Write);
                let done =
                    observe(&mut h, &mut buf, &model, expected, |b| b.device_mut_on(&device).map(drop))?;
                if done.is_some() {
                    model.access(Loc::Dev(d), Access::Write);
                    let mut view = buf.device_mut_on(&device).unwrap();
                    view.read_into(&mut scratch).unwrap();
                    model.known(&scratch)?;
                    if let Some(first) = scratch.first_mut() {
                        *first = seed;
                        view.write_from(&scratch).unwrap();
                        model.data[0] = Some(seed);
                    }
                }
            }
            Op::DeviceOverwrite(d, seed) => {
                let device = h.devices[d].clone();
                let values = pattern(seed, len);
                let expected = expect_access(&mut model, Loc::Dev(d), Access::Overwrite);
                let done = observe(&mut h, &mut buf, &model, expected, |b| {
                    b.device_overwrite_on(&device).map(drop)
                })?;
                if done.is_some() {
                    model.access(Loc::Dev(d), Access::Overwrite);
                    buf.device_mut_on(&device).unwrap().write_from(&values).unwrap();
                    model.set_data(&values);
                }
            }
            Op::SyncToDevice => {
                let expected = expect_access(&mut model, Loc::Dev(0), Access::Read);
                if observe(&mut h, &mut buf, &model, expected, |b| b.sync_to_device())?.is_some() {
                    model.read(Loc::Dev(0));
                }
            }
            Op::SyncAsync(target) => {
                let at = target.map_or(Loc::Host, Loc::Dev);
                let device = target.map(|d| h.devices[d].clone());
                // With the host current, an asynchronous sync to it copies nothing and is the
                // blocking sync, a host read (which the checker then follows).
                let expected = match target {
                    None => expect_host_read(&mut model),
                    Some(_) => expect_access(&mut model, at, Access::Read),
                };
                let held = h.held();
                let done = observe(&mut h, &mut buf, &model, expected, |b| match &device {
                    Some(device) => b.sync_to_async(device),
                    None => b.sync_to_host_async(),
                })?;
                if done.is_some() {
                    let (start, anything_valid) = (model.begin_read(at), model.any_valid());
                    model.trace.clear();
                    model.read(at);
                    let copied = model.trace.iter().any(|(from, _)| from.is_some());
                    if copied && anything_valid {
                        let gates = h.held().into_iter().filter(|g| !held.contains(g)).collect();
                        // An armed copy fault that fired while the transfer was enqueued (the
                        // copies made reached its position) and fails at wait.
                        let fails = h.deferred_copy_fault_fired();
                        let pending = start.into_pending(&model, gates, fails, None);
                        model.pending.push(pending);
                    }
                }
            }
            Op::Complete(which) => {
                let held = h.held();
                if !held.is_empty() {
                    let (d, id) = *which.get(&held);
                    h.plans[d].release(id);
                }
            }
            Op::Poll | Op::Finish => {
                let finishing = matches!(op, Op::Finish);
                // Work nobody holds completes on the runtime's own time: let it finish, so
                // the model knows what a poll finds complete.
                h.synchronize();
                let held = h.held();
                let failed = model.settle(|p| finishing || p.gates.iter().all(|g| !held.contains(g)));
                let result = if finishing { buf.finish() } else { buf.poll() };
                match (failed, result) {
                    (false, Ok(())) => {}
                    (true, Err(err)) if is_injected(&err) => {}
                    (_, other) => {
                        return Err(TestCaseError::fail(format!(
                            "{op:?}: model failed={failed}, buffer {other:?}"
                        )));
                    }
                }
            }
            Op::MarkHostDirty => {
                let expected = expect_checked_host_access(&mut model, Access::Write);
                if expected.is_ok() {
                    model.note_host_download(Access::Write);
                }
                if observe(&mut h, &mut buf, &model, expected, |b| b.mark_host_dirty())?.is_some() {
                    model.access(Loc::Host, Access::Write);
                }
            }
            Op::MarkDeviceDirty | Op::MarkDirtyOn(_) => {
                let d = if let Op::MarkDirtyOn(d) = *op { d } else { 0 };
                let device = h.devices[d].clone();
                // The caller's kernel wrote the copy after the uploads to it in its stream's
                // order: when the mark copies nothing it does not wait for them, and if one
                // fails the mark is undone with it.
                let keep = model.plan(Loc::Dev(d), Access::Write).is_empty();
                let expected = if model.settle_for_ordered(d, Access::Write) { Err(()) } else { Ok(()) };
                if observe(&mut h, &mut buf, &model, expected, |b| b.mark_dirty_on(&device))?.is_some() {
                    if keep {
                        model.revalidate_on_failure(d);
                    }
                    model.access(Loc::Dev(d), Access::Write);
                }
            }
            Op::Fill(value) => {
                // A fill first waits for every transfer in flight.
                if model.settle(|_| true) {
                    h.armed = None;
                    let result = buf.fill(value);
                    prop_assert!(result.as_ref().is_err_and(is_injected), "fill: {result:?}");
                } else {
                    let target = model.fill_target();
                    // A fill abandoned half-way is the CUDA double's (`cuda_faults.rs`): its
                    // faults are kept off fills here.
                    if matches!(h.armed, Some(Fault::Stream(_))) {
                        h.armed = None;
                    }
                    h.arm();
                    let result = buf.fill(value);
                    h.disarm();
                    match result {
                        Ok(()) => {
                            let direct_read = model.direct_read;
                            model.access(target, Access::Overwrite);
                            model.data = vec![Some(value); len];
                            if target != Loc::Host {
                                // A fill on a device is no access (raw/mod.rs: `fill_device`):
                                // it leaves the direct-read flag as it was.
                                model.direct_read = direct_read;
                            }
                        }
                        // The faulty device refuses a fill before it starts: nothing changes.
                        Err(Error::InjectedFault { .. }) => {}
                        Err(other) => return Err(TestCaseError::fail(format!("unexpected error: {other}"))),
                    }
                }
            }
            Op::Invalidate => {
                model.settle(|_| true);
                buf.invalidate();
                for r in std::iter::once(&mut model.host).chain(model.devs.iter_mut()) {
                    if *r == Res::Valid {
                        *r = Res::Stale;
                    }
                }
                model.data = vec![None; len];
                (model.direct_read, model.host_sync_pays) = (false, false);
            }
            Op::Release => {
                model.settle(|_| true);
                buf.release_memory();
                model.host = Res::Unallocated;
                model.devs.iter_mut().for_each(|r| *r = Res::Unallocated);
                model.order.clear();
                model.host_block = false;
                model.data = vec![None; len];
                (model.direct_read, model.host_sync_pays) = (false, false);
            }
            Op::DeviceOrdered(d, wait) => device_ordered(&mut h, &mut buf, &mut model, d, wait)?,
            Op::ReadInto => read_into(&mut h, &mut buf, &mut model)?,
        }
        check_state(&h, &buf, &model).map_err(|e| {
            TestCaseError::fail(format!("after {op:?} (model before: {before:?}, after: {model:?}): {e}"))
        })?;
    }
    // Whatever happened, every known byte can still be read back.
    h.disarm();
    let failed = model.settle(|_| true);
    let finished = buf.finish();
    prop_assert_eq!(failed, finished.is_err(), "finish: {:?}", finished);
    let values = buf.to_vec().unwrap();
    model.read(Loc::Host);
    model.known(&values)
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(2000)
}

/// Lengths in u32 elements; the last is 4.4 MB, which aliases host memory on devices that
/// share it (so both sync paths run).
fn len_strategy() -> impl Strategy<Value = usize> {
    prop_oneof![3 => 0..4usize, 4 => 4..300usize, 1 => Just(1_100_000usize)]
}

/// The 4.4 MB length only matters on a device whose sync path depends on size; elsewhere a
/// small buffer tests the same paths much faster.
fn shrink_unless_it_matters(len: usize, devices: &[Device]) -> usize {
    let size_dependent = devices.iter().any(|d| d.is_zero_copy(len * 4) != d.is_zero_copy(4));
    if len > 1000 && !size_dependent { 1000 } else { len }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), max_shrink_iters: 2000, ..ProptestConfig::default() })]

    /// One device at a time, each device lazybuf found.
    #[test]
    fn single_device_sequences_match_the_model(
        which in any::<prop::sample::Index>(),
        len in len_strategy(),
        config in config_strategy(),
        ops in prop::collection::vec(op_strategy(1), 1..40),
    ) {
        lazybuf::set_checking(true);
        let all = common::devices();
        let device = which.get(&all).clone();
        let len = shrink_unless_it_matters(len, std::slice::from_ref(&device));
        run(&[device], len, config, &ops)?;
    }

    /// A buffer on one device also used on another (staging through the host).
    #[test]
    fn two_device_sequences_match_the_model(
        pair in any::<(prop::sample::Index, prop::sample::Index)>(),
        len in len_strategy(),
        config in config_strategy(),
        ops in prop::collection::vec(op_strategy(2), 1..40),
    ) {
        lazybuf::set_checking(true);
        let all = common::devices();
        let home = pair.0.get(&all).clone();
        let others: Vec<Device> = all.iter().filter(|d| **d != home).cloned().collect();
        // A second wrapper of the same device is a distinct device to lazybuf; with one real
        // device that still exercises two locations.
        let other = if others.is_empty() { home.clone() } else { pair.1.get(&others).clone() };
        let len = shrink_unless_it_matters(len, &[home.clone(), other.clone()]);
        run(&[home, other], len, config, &ops)?;
    }

    /// The stream-ordered access where its uploads are left in flight: a buffer on the CUDA
    /// driver test double, alone or also used on another device, with sequences that take
    /// that path (and fail it) often. Nothing to run without the double.
    #[test]
    fn stream_ordered_sequences_on_the_cuda_double_match_the_model(
        pair in any::<(prop::sample::Index, prop::sample::Index)>(),
        alone in any::<bool>(),
        len in len_strategy(),
        config in config_strategy(),
        steps in prop::collection::vec(ordered_steps_strategy(2), 1..30),
    ) {
        let ops: Vec<Op> = steps.into_iter().flatten().collect();
        lazybuf::set_checking(true);
        let all = common::devices();
        let doubles: Vec<Device> = all.iter().filter(|d| double::is_double(d)).cloned().collect();
        if doubles.is_empty() {
            return Ok(());
        }
        let home = pair.0.get(&doubles).clone();
        let others: Vec<Device> = all.iter().filter(|d| **d != home).cloned().collect();
        let other = if others.is_empty() { home.clone() } else { pair.1.get(&others).clone() };
        if alone {
            let len = shrink_unless_it_matters(len, std::slice::from_ref(&home));
            run(&[home], len, config, &on_device_0(&ops))?;
        } else {
            let len = shrink_unless_it_matters(len, &[home.clone(), other.clone()]);
            run(&[home, other], len, config, &ops)?;
        }
    }
}
