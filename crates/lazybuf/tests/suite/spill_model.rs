//! Model-based property test of spilling: random sequences of accesses to
//! several shared buffers on one device whose memory limit holds only two of their device
//! copies, so sequences evict and reload constantly.
//!
//! Each buffer is modelled by the coherence contract (SPEC section 1: residency of the host
//! and the device, the data, the bytes each direction must move). The model does not choose
//! evictions; it observes them: after each step, a buffer whose device copy the model expects
//! but the buffer no longer has was evicted, and the model applies the eviction the issue
//! prescribes (a copy holding the only current data is written back, costing its bytes; any
//! other costs nothing; both leave the host valid and the device unallocated). The test then
//! checks, for every buffer: the state, the data, the bytes moved in each direction (the
//! contract's minimum plus exactly the write-backs eviction required), that the buffer the
//! step used was not evicted during it, that a buffer held with a live device view while
//! another allocates is not evicted, that a buffer with an asynchronous transfer in flight is
//! not evicted (once the transfer has completed, it may be: eviction settles it), and that the
//! device never holds more than its limit.
//! Copy faults are part of the sequences (through `lazybuf::testing::FaultyDevice`): a step
//! that fails, whether its own copy or an eviction's write-back failed, changes nothing for
//! its buffer, and an eviction whose write-back failed left its buffer as it was. Write-backs
//! run on the device's side stream where it has one, so those faults hit side-stream
//! downloads; a failed write-back's error names another buffer, one that kept its copy.
//! A private pool (`MemoryPool::new`) takes part: a step borrows a block from it and gives it
//! back (the pool caches it, and the cached block counts against the limit), and no step
//! evicts anything while the pool still caches a block (it is trimmed first).
//!
//! Each sequence runs on a fault-injecting wrapper of one of the devices found, its own (its
//! budget and held bytes are the wrapper's alone) and cleaned at the sequence's start: nothing
//! armed or held, no cached block, spill counters at zero. A wrapper is made once per device
//! and test thread, not per sequence: like every device, it lives as long as its default pool,
//! the process, with its streams (on CUDA a side stream each), so thousands of them piled up
//! and slowed the run quadratically. Each sequence ends by checking that, its buffers and pool
//! dropped, the wrapper holds no device memory (a leak in the budget's accounting fails it).
//! `PROPTEST_CASES` sets the number of sequences (default 300).

use crate::common;

use common::pattern;
use lazybuf::spill::{self, SharedBuffer};
use lazybuf::testing::{FaultPlan, FaultyDevice};
use lazybuf::{
    BufferOptions, BufferState, Device, Location, MemoryKind, MemoryPool, PoolConfig, Residency, Ticket,
    UnifiedBuffer,
};
use proptest::prelude::*;
use proptest::sample::Index;
use std::cell::RefCell;
use std::sync::Arc;

const BUFFERS: usize = 4;
/// 4 KiB per buffer: one size class of the pool, below any zero-copy threshold but the host's.
const LEN: usize = 1024;
const NBYTES: u64 = (LEN * 4) as u64;

#[derive(Clone, Debug)]
enum Op {
    HostRead(usize),
    HostWrite(usize, u32),
    DeviceRead(usize),
    DeviceOverwrite(usize, u32),
    SyncToDevice(usize),
    SyncToHost(usize),
    /// An asynchronous upload: the buffer has a transfer in flight until it completes, and must
    /// not be evicted meanwhile.
    SyncAsync(usize),
    MarkHostDirty(usize),
    MarkDeviceDirty(usize),
    /// Holds the first buffer's device view while the second one uploads.
    HoldWhileUploading(usize, usize),
    /// Makes the next step's n-th copy fail (its own, or an eviction's write-back).
    ArmCopyFault(u64),
    /// A buffer of the private pool uploads (making room like any other) and goes back to
    /// the pool, which caches its device block.
    PoolChurn,
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let buf = 0..BUFFERS;
    prop_oneof![
        2 => buf.clone().prop_map(Op::HostRead),
        2 => (buf.clone(), any::<u32>()).prop_map(|(b, s)| Op::HostWrite(b, s)),
        4 => buf.clone().prop_map(Op::DeviceRead),
        2 => (buf.clone(), any::<u32>()).prop_map(|(b, s)| Op::DeviceOverwrite(b, s)),
        3 => buf.clone().prop_map(Op::SyncToDevice),
        1 => buf.clone().prop_map(Op::SyncToHost),
        2 => buf.clone().prop_map(Op::SyncAsync),
        1 => buf.clone().prop_map(Op::MarkHostDirty),
        2 => buf.clone().prop_map(Op::MarkDeviceDirty),
        2 => (buf.clone(), buf).prop_map(|(a, b)| Op::HoldWhileUploading(a, b)),
        1 => (1..4u64).prop_map(Op::ArmCopyFault),
        1 => Just(Op::PoolChurn),
    ]
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Res {
    Unallocated,
    Stale,
    Valid,
}

/// One buffer as the contract sees it.
#[derive(Clone, Debug)]
struct Model {
    host: Res,
    device: Res,
    data: Vec<u32>,
    to_device: u64,
    to_host: u64,
    /// Evicted, and not uploaded again since.
    evicted: bool,
    /// What eviction did to this buffer, and the bytes its reloads uploaded.
    evictions: u64,
    clean_evictions: u64,
    written_back: u64,
    read_back: u64,
}

impl Model {
    fn new(seed: u32) -> Model {
        Model {
            host: Res::Valid,
            device: Res::Unallocated,
            data: pattern(seed, LEN),
            to_device: 0,
            to_host: 0,
            evicted: false,
            evictions: 0,
            clean_evictions: 0,
            written_back: 0,
            read_back: 0,
        }
    }

    /// A read at the device (`true`) or the host: copies only when that copy is not valid.
    fn read(&mut self, device: bool) {
        let (here, there) = if device { (self.device, self.host) } else { (self.host, self.device) };
        if here != Res::Valid {
            assert_eq!(there, Res::Valid, "the model keeps every buffer initialized");
            if device {
                self.to_device += NBYTES;
                self.device = Res::Valid;
                if std::mem::take(&mut self.evicted) {
                    self.read_back += NBYTES;
                }
            } else {
                self.to_host += NBYTES;
                self.host = Res::Valid;
            }
        }
    }

    /// A write at the device or the host: that copy made valid first (unless `overwrite`),
    /// the other stale.
    fn write(&mut self, device: bool, overwrite: bool) {
        if overwrite {
            if device { self.device = Res::Valid } else { self.host = Res::Valid }
        } else {
            self.read(device);
        }
        let other = if device { &mut self.host } else { &mut self.device };
        if *other != Res::Unallocated {
            *other = Res::Stale;
        }
    }

    /// An eviction of the device copy: written back if it holds the only current data.
    fn evict(&mut self) {
        self.evictions += 1;
        self.evicted = true;
        if self.device == Res::Valid && self.host != Res::Valid {
            self.to_host += NBYTES;
            self.written_back += NBYTES;
        } else {
            self.clean_evictions += 1;
        }
        self.host = Res::Valid;
        self.device = Res::Unallocated;
    }

    fn state(&self) -> BufferState {
        match (self.host, self.device) {
            (Res::Valid, Res::Valid) => BufferState::Synchronized,
            (Res::Valid, Res::Stale) => BufferState::HostDirty,
            (Res::Valid, Res::Unallocated) => BufferState::HostOnly,
            (Res::Stale, Res::Valid) => BufferState::DeviceDirty,
            (Res::Unallocated, Res::Valid) => BufferState::DeviceOnly,
            other => panic!("the model reached {other:?}"),
        }
    }
}

struct Run {
    device: Device,
    zero_copy: bool,
    bufs: Vec<SharedBuffer<u32>>,
    models: Vec<Model>,
    /// Which buffers had a transfer in flight when the step began.
    busy: Vec<bool>,
    /// Each buffer's latest asynchronous upload (earlier ones on its stream completed first).
    uploads: Vec<Option<Ticket>>,
    /// A pool of the user's own, made with `MemoryPool::new`.
    pool: MemoryPool,
}

impl Run {
    fn device_residency(&self, i: usize) -> Residency {
        self.bufs[i].lock().residency(Location::Device(self.device.id()))
    }

    /// Applies the evictions that happened to the buffers not in `in_use` (which are locked,
    /// or were locked for the whole step, and were checked by the caller).
    fn observe_evictions(&mut self, in_use: &[usize]) -> Result<(), TestCaseError> {
        for i in (0..BUFFERS).filter(|i| !in_use.contains(i)) {
            let gone = self.device_residency(i) == Residency::Unallocated;
            if gone && self.models[i].device != Res::Unallocated {
                prop_assert!(!self.zero_copy, "a zero-copy device copy was evicted");
                // Evicted: its transfer had completed by then, so it has now.
                let completed = self.uploads[i].as_ref().is_none_or(|t| matches!(t.poll(), Ok(true)));
                prop_assert!(
                    !self.busy[i] || completed,
                    "buffer {} was evicted with a transfer in flight",
                    i
                );
                self.models[i].evict();
            }
        }
        Ok(())
    }

    fn check(&mut self) -> Result<(), TestCaseError> {
        for (i, model) in self.models.iter().enumerate() {
            let mut buf = self.bufs[i].lock();
            prop_assert_eq!(buf.state(), model.state(), "buffer {}", i);
            let stats = buf.transfer_stats();
            let (to_device, to_host) = if self.zero_copy { (0, 0) } else { (model.to_device, model.to_host) };
            prop_assert_eq!(stats.host_to_device.bytes, to_device, "buffer {} uploads", i);
            prop_assert_eq!(stats.device_to_host.bytes, to_host, "buffer {} downloads", i);
            // Peeking at the data must not change what the model counts: read where valid.
            if model.host == Res::Valid {
                prop_assert!(buf.host().unwrap() == model.data.as_slice(), "buffer {} host data", i);
            } else {
                let mut out = vec![0u32; LEN];
                buf.device().unwrap().read_into(&mut out).unwrap();
                prop_assert!(out == model.data, "buffer {} device data", i);
            }
        }
        let stats = spill::spill_stats(&self.device);
        let sum = |f: fn(&Model) -> u64| self.models.iter().map(f).sum::<u64>();
        prop_assert_eq!(stats.evictions, sum(|m| m.evictions));
        prop_assert_eq!(stats.clean_evictions, sum(|m| m.clean_evictions));
        prop_assert_eq!(stats.bytes_written_back, sum(|m| m.written_back));
        prop_assert_eq!(stats.bytes_read_back, sum(|m| m.read_back));
        let limit = spill::memory_limit(&self.device).unwrap().unwrap();
        prop_assert!(spill::memory_held(&self.device) <= limit, "held above the limit");
        Ok(())
    }

    /// Runs one access on buffer `i`; on success applies `change` to its model. Returns
    /// whether the access succeeded.
    fn step(
        &mut self,
        i: usize,
        access: impl FnOnce(&mut UnifiedBuffer<u32>) -> lazybuf::Result<()>,
        change: impl FnOnce(&mut Model),
    ) -> Result<bool, TestCaseError> {
        let mut buf = self.bufs[i].lock();
        let result = access(&mut buf);
        let at = Location::Device(self.device.id());
        let still_there =
            self.models[i].device == Res::Unallocated || buf.residency(at) != Residency::Unallocated;
        let own_id = buf.raw().id();
        drop(buf);
        prop_assert!(still_there, "buffer {} was evicted during its own access", i);
        if let Err(lazybuf::Error::WriteBack { buffer, bytes, .. }) = &result {
            // The buffer named is another one, and it kept its copy (checked by the model:
            // it is not observed as evicted).
            prop_assert!(*buffer != own_id && *bytes as u64 == NBYTES, "write-back error {:?}", result);
            let named = self.bufs.iter().position(|b| b.lock().raw().id() == *buffer);
            let named = named.expect("the buffer named is one of the run's");
            prop_assert!(
                self.device_residency(named) != Residency::Unallocated,
                "buffer {} lost its copy",
                named
            );
        }
        if result.is_ok() {
            change(&mut self.models[i]);
        }
        self.observe_evictions(&[i])?;
        Ok(result.is_ok())
    }
}

thread_local! {
    /// This thread's fault-injecting wrappers: (the device found, its wrapper, the plan).
    static WRAPPERS: RefCell<Vec<(Device, Device, Arc<FaultPlan>)>> = const { RefCell::new(Vec::new()) };
}

/// This thread's wrapper of `inner`, made at the first call, cleaned for a new sequence.
fn wrapper(inner: &Device) -> (Device, Arc<FaultPlan>) {
    WRAPPERS.with(|wrappers| {
        let mut wrappers = wrappers.borrow_mut();
        if let Some((_, device, faults)) = wrappers.iter().find(|(found, ..)| found == inner) {
            // Sequences check at their end that they left nothing held; one that failed
            // before its end may have, and the next gets a new wrapper.
            if released(device, inner).is_ok() {
                faults.disarm();
                spill::reset_spill_stats(device);
                return (device.clone(), faults.clone());
            }
        }
        wrappers.retain(|(found, ..)| found != inner);
        let (device, faults) = FaultyDevice::wrap(inner);
        wrappers.push((inner.clone(), device.clone(), faults.clone()));
        (device, faults)
    })
}

/// Checks that the wrapper holds nothing once the buffers are gone: its default pool
/// trimmed (those blocks would count against the next sequence's limit), and the blocks freed
/// after queued work freed when that work has ended. Another thread's eviction pass may hold
/// this sequence's buffers a moment longer (it holds every live shared buffer while it looks
/// for one to evict) and then give their blocks to the pool: trimmed again while waiting.
fn released(device: &Device, inner: &Device) -> Result<(), TestCaseError> {
    let _ = inner.synchronize();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        lazybuf::resource::default_pool(device).trim();
        let held = spill::memory_held(device);
        if held == 0 {
            return Ok(());
        }
        prop_assert!(
            std::time::Instant::now() < deadline,
            "{} bytes still held on {} with no buffer left",
            held,
            device.info().name
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

fn run(inner: &Device, ops: &[Op]) -> Result<(), TestCaseError> {
    let (device, faults) = wrapper(inner);
    // Room for two copies (and a little): four buffers spill constantly.
    spill::set_memory_limit(&device, Some(2 * NBYTES + NBYTES / 2));
    let options = BufferOptions { device: Some(device.clone()), ..BufferOptions::default() };
    let bufs: Vec<SharedBuffer<u32>> = (0..BUFFERS as u32)
        .map(|seed| {
            let mut buf = UnifiedBuffer::with_options(&[LEN], options.clone()).unwrap();
            buf.copy_from(&pattern(seed, LEN)).unwrap();
            buf.reset_transfer_stats();
            SharedBuffer::new(buf)
        })
        .collect();
    let models = (0..BUFFERS as u32).map(Model::new).collect();
    let zero_copy = device.is_zero_copy(LEN * 4);
    let pool = MemoryPool::new(&device, PoolConfig::default());
    let uploads = vec![None; BUFFERS];
    let mut run = Run { device, zero_copy, bufs, models, busy: vec![false; BUFFERS], uploads, pool };
    let mut armed = None;
    for op in ops {
        run.busy = run.bufs.iter().map(|b| b.lock().is_busy()).collect();
        let evictions_before = spill::spill_stats(&run.device).evictions;
        if let Some(n) = armed.take() {
            faults.fail_copy_in(n);
        }
        match *op {
            Op::HostRead(i) => {
                let expected = run.models[i].data.clone();
                run.step(i, |b| b.host().map(|h| assert_eq!(h, expected.as_slice())), |m| m.read(false))?;
            }
            Op::HostWrite(i, seed) => {
                run.step(
                    i,
                    |b| b.host_mut().map(|h| h.copy_from_slice(&pattern(seed, LEN))),
                    |m| {
                        m.write(false, false);
                        m.data = pattern(seed, LEN);
                    },
                )?;
            }
            // The view is the access; the data is checked after the step (with no fault armed).
            Op::DeviceRead(i) => {
                run.step(i, |b| b.device().map(drop), |m| m.read(true))?;
            }
            Op::DeviceOverwrite(i, seed) => {
                let done = run.step(i, |b| b.device_overwrite().map(drop), |m| m.write(true, true))?;
                if done {
                    // The kernel's write, with no fault armed (it is I/O, not an access).
                    faults.disarm();
                    run.bufs[i].lock().device_overwrite().unwrap().write_from(&pattern(seed, LEN)).unwrap();
                    run.models[i].data = pattern(seed, LEN);
                }
            }
            Op::SyncToDevice(i) => {
                run.step(i, |b| b.sync_to_device(), |m| m.read(true))?;
            }
            Op::SyncToHost(i) => {
                run.step(i, |b| b.sync_to_host(), |m| m.read(false))?;
            }
            Op::SyncAsync(i) => {
                let mut upload = None;
                let store = |t: lazybuf::Transfer| upload = Some(t.ticket().clone());
                run.step(i, |b| b.sync_to_device_async().map(store), |m| m.read(true))?;
                if upload.is_some() {
                    run.uploads[i] = upload;
                }
            }
            Op::MarkHostDirty(i) => {
                run.step(i, |b| b.mark_host_dirty(), |m| m.write(false, false))?;
            }
            Op::MarkDeviceDirty(i) => {
                run.step(i, |b| b.mark_device_dirty(), |m| m.write(true, false))?;
            }
            Op::HoldWhileUploading(held, other) => {
                if held == other {
                    continue;
                }
                let held_handle = run.bufs[held].clone();
                let mut held_buf = held_handle.lock();
                let view = held_buf.device();
                if view.is_ok() {
                    run.models[held].read(true);
                }
                // Taking the view may have evicted others (`other` too: it is not in use yet).
                run.observe_evictions(&[held])?;
                let uploaded = run.bufs[other].lock().sync_to_device();
                if uploaded.is_ok() {
                    run.models[other].read(true);
                }
                let viewed = view.map(|view| view.len()).is_ok();
                let at = Location::Device(run.device.id());
                prop_assert!(
                    !viewed || held_buf.residency(at) == Residency::Valid,
                    "a viewed copy was evicted"
                );
                drop(held_buf);
                run.observe_evictions(&[other])?;
            }
            Op::ArmCopyFault(n) => armed = Some(n),
            Op::PoolChurn => {
                let mut pooled = run.pool.acquire::<u32>(&[LEN], false).unwrap();
                // It may fail (an armed fault; no room while the others are in flight).
                let uploaded = pooled.copy_from(&pattern(99, LEN)).and_then(|()| pooled.sync_to_device());
                if uploaded.is_ok() && !run.zero_copy {
                    prop_assert!(pooled.state() == BufferState::Synchronized);
                }
                // Room was made with the pool trimmed first (a failed upload gave its new
                // block back to the pool after the room was made).
                if uploaded.is_ok() && spill::spill_stats(&run.device).evictions > evictions_before {
                    prop_assert_eq!(
                        cached_device_bytes(&run.pool),
                        0,
                        "evicted while the pool cached a block"
                    );
                }
                run.pool.release(pooled).unwrap();
                run.observe_evictions(&[])?;
                faults.disarm();
                run.check()?;
                continue;
            }
        }
        // Nothing is evicted while a private pool still caches a block.
        if spill::spill_stats(&run.device).evictions > evictions_before {
            prop_assert_eq!(cached_device_bytes(&run.pool), 0, "evicted while the pool cached a block");
        }
        // A fault the step did not reach must not fail the check's reads.
        faults.disarm();
        run.check()?;
    }
    faults.disarm();
    let device = run.device.clone();
    drop(run);
    released(&device, inner)
}

fn cached_device_bytes(pool: &MemoryPool) -> u64 {
    pool.usage(|k| k == MemoryKind::Device).bytes_cached
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(300)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), max_shrink_iters: 2000, ..ProptestConfig::default() })]

    /// One device at a time, each device lazybuf found.
    #[test]
    fn spilling_sequences_match_the_model(which in any::<Index>(), ops in prop::collection::vec(op_strategy(), 1..60)) {
        let all = common::devices();
        run(which.get(&all), &ops)?;
    }
}
