//! Model-based property test of the coherence contract.
//!
//! Random sequences of every buffer operation run against a real buffer (on every device, and
//! on two devices at once) and against a plain reference model written from SPEC section 1.
//! After every step the test checks: the data (every element the model knows), the state
//! against both devices, the bytes moved in each direction, zero-copy syncs, and the number of
//! allocations. The model counts exactly the copies the contract requires, so a transfer the
//! contract does not require fails the test.
//!
//! Faults are part of the sequences: an `Arm*` step makes the next operation's n-th
//! allocation or copy fail (through `lazybuf::testing::FaultyDevice`); the operation must
//! return that error and leave state, counters and every valid byte as they were.
//!
//! `PROPTEST_CASES` sets the number of sequences (default 2000).

mod common;

use common::pattern;
use lazybuf::testing::{FaultPlan, FaultyDevice};
use lazybuf::{BufferState, Device, Error, UnifiedBuffer};
use proptest::prelude::*;
use std::sync::Arc;

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
        1 => Just(Op::MarkHostDirty),
        1 => Just(Op::MarkDeviceDirty),
        1 => dev.clone().prop_map(Op::MarkDirtyOn),
        2 => any::<u32>().prop_map(Op::Fill),
        2 => any::<u32>().prop_map(Op::CopyFrom),
        1 => Just(Op::ToVec),
        1 => Just(Op::Invalidate),
        1 => Just(Op::Release),
        2 => (dev.clone(), 1..4u64).prop_map(|(d, n)| Op::ArmAllocationFault(d, n)),
        2 => (dev, 1..4u64).prop_map(|(d, n)| Op::ArmCopyFault(d, n)),
    ]
}

/// The reference model: residency per location, the data as far as it is known, and the
/// counters the buffer must report.
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
}

impl Model {
    fn new(len: usize, zero_copy: Vec<bool>, direct: Vec<Vec<bool>>) -> Self {
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
            Loc::Dev(i) => self.devs[i] = r,
        }
    }

    fn any_valid(&self) -> bool {
        self.host == Res::Valid || self.devs.contains(&Res::Valid)
    }

    fn allocate(&mut self, at: Loc) {
        if self.res(at) != Res::Unallocated {
            return;
        }
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
    /// the host).
    fn read(&mut self, at: Loc) {
        if self.res(at) == Res::Valid {
            return;
        }
        self.allocate(at);
        if self.any_valid() {
            if self.host == Res::Valid {
                self.copy(Loc::Host, at);
            } else {
                let valid: Vec<usize> =
                    (0..self.devs.len()).filter(|&i| self.devs[i] == Res::Valid).collect();
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

    fn write(&mut self, at: Loc) {
        self.read(at);
        self.stale_others(at);
    }

    fn overwrite(&mut self, at: Loc) {
        self.allocate(at);
        self.set(at, Res::Valid);
        self.stale_others(at);
    }

    /// Fill: at the home device if current, else the host if current, else another current
    /// device, else the host; a write there without transfer.
    fn fill_target(&self) -> Loc {
        if self.devs[0] == Res::Valid {
            Loc::Dev(0)
        } else if self.host == Res::Valid {
            Loc::Host
        } else {
            (0..self.devs.len()).find(|&i| self.devs[i] == Res::Valid).map_or(Loc::Host, Loc::Dev)
        }
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

struct Harness {
    devices: Vec<Device>,
    plans: Vec<Arc<FaultPlan>>,
    armed: Option<(usize, bool, u64)>,
}

impl Harness {
    fn arm(&mut self) {
        if let Some((dev, allocation, n)) = self.armed.take() {
            if allocation {
                self.plans[dev].fail_allocation_in(n);
            } else {
                self.plans[dev].fail_copy_in(n);
            }
        }
    }

    fn disarm(&self) {
        self.plans.iter().for_each(|p| p.disarm());
    }
}

/// Runs one coherence operation with any armed fault; on failure checks that it was the
/// injected fault and that the buffer is exactly as the (unchanged) model says.
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
        Err(Error::InjectedFault { .. }) => {
            check_state(h, buf, model)?;
            Ok(None)
        }
        Err(other) => Err(TestCaseError::fail(format!("unexpected error: {other}"))),
    }
}

fn check_state(h: &Harness, buf: &UnifiedBuffer<u32>, model: &Model) -> Result<(), TestCaseError> {
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
    Ok(())
}

fn run(base: &[Device], len: usize, ops: &[Op]) -> Result<(), TestCaseError> {
    let (devices, plans): (Vec<_>, Vec<_>) = base.iter().map(FaultyDevice::wrap).unzip();
    let zero_copy = devices.iter().map(|d| d.is_zero_copy(len * 4)).collect();
    let direct =
        devices.iter().map(|to| devices.iter().map(|from| to.can_copy_from(from)).collect()).collect();
    let mut h = Harness { devices, plans, armed: None };
    let mut buf = UnifiedBuffer::<u32>::on(&[len], &h.devices[0]).unwrap();
    let mut model = Model::new(len, zero_copy, direct);
    let mut scratch = vec![0u32; len];

    for op in ops {
        let before = model.clone();
        match *op {
            Op::ArmAllocationFault(d, n) => h.armed = Some((d, true, n)),
            Op::ArmCopyFault(d, n) => h.armed = Some((d, false, n)),
            Op::HostRead | Op::ToVec | Op::SyncToHost => {
                let got = guarded(&mut h, &mut buf, &model, |b| match op {
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
                if let Some(host) =
                    guarded(&mut h, &mut buf, &model, |b| b.host_mut().map(|s| s as *mut [u32]))?
                {
                    model.write(Loc::Host);
                    // SAFETY (test): the slice was just returned by host_mut and the buffer
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
                let done = guarded(&mut h, &mut buf, &model, |b| match op {
                    Op::CopyFrom(_) => b.copy_from(&values),
                    _ => b.host_overwrite().map(|s| s.copy_from_slice(&values)),
                })?;
                if done.is_some() {
                    model.overwrite(Loc::Host);
                    model.set_data(&values);
                }
            }
            Op::DeviceRead(d) | Op::SyncTo(d) => {
                let device = h.devices[d].clone();
                let done = guarded(&mut h, &mut buf, &model, |b| b.device_on(&device).map(drop))?;
                if done.is_some() {
                    model.read(Loc::Dev(d));
                    buf.device_on(&device).unwrap().read_into(&mut scratch).unwrap();
                    model.known(&scratch)?;
                }
            }
            Op::DeviceWrite(d, seed) => {
                let device = h.devices[d].clone();
                let done = guarded(&mut h, &mut buf, &model, |b| b.device_mut_on(&device).map(drop))?;
                if done.is_some() {
                    model.write(Loc::Dev(d));
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
                let done = guarded(&mut h, &mut buf, &model, |b| b.device_overwrite_on(&device).map(drop))?;
                if done.is_some() {
                    model.overwrite(Loc::Dev(d));
                    buf.device_mut_on(&device).unwrap().write_from(&values).unwrap();
                    model.set_data(&values);
                }
            }
            Op::SyncToDevice => {
                if guarded(&mut h, &mut buf, &model, |b| b.sync_to_device())?.is_some() {
                    model.read(Loc::Dev(0));
                }
            }
            Op::MarkHostDirty => {
                if guarded(&mut h, &mut buf, &model, |b| b.mark_host_dirty())?.is_some() {
                    model.write(Loc::Host);
                }
            }
            Op::MarkDeviceDirty => {
                if guarded(&mut h, &mut buf, &model, |b| b.mark_device_dirty())?.is_some() {
                    model.write(Loc::Dev(0));
                }
            }
            Op::MarkDirtyOn(d) => {
                let device = h.devices[d].clone();
                if guarded(&mut h, &mut buf, &model, |b| b.mark_dirty_on(&device))?.is_some() {
                    model.write(Loc::Dev(d));
                }
            }
            Op::Fill(value) => {
                let target = model.fill_target();
                h.arm();
                let result = buf.fill(value);
                h.disarm();
                match result {
                    Ok(()) => {
                        model.overwrite(target);
                        model.data = vec![Some(value); len];
                    }
                    Err(Error::InjectedFault { .. }) => {
                        // A failed device fill makes that copy stale when another is current.
                        let others = model.host == Res::Valid
                            || (0..model.devs.len())
                                .any(|i| Loc::Dev(i) != target && model.devs[i] == Res::Valid);
                        if let (Loc::Dev(i), true) = (target, others) {
                            model.devs[i] = Res::Stale;
                        }
                    }
                    Err(other) => return Err(TestCaseError::fail(format!("unexpected error: {other}"))),
                }
            }
            Op::Invalidate => {
                buf.invalidate();
                for r in std::iter::once(&mut model.host).chain(model.devs.iter_mut()) {
                    if *r == Res::Valid {
                        *r = Res::Stale;
                    }
                }
                model.data = vec![None; len];
            }
            Op::Release => {
                buf.release_memory();
                model.host = Res::Unallocated;
                model.devs.iter_mut().for_each(|r| *r = Res::Unallocated);
                model.host_block = false;
                model.data = vec![None; len];
            }
        }
        check_state(&h, &buf, &model).map_err(|e| {
            TestCaseError::fail(format!("after {op:?} (model before: {before:?}, after: {model:?}): {e}"))
        })?;
    }
    // Whatever happened, every known byte can still be read back.
    h.disarm();
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
        ops in prop::collection::vec(op_strategy(1), 1..40),
    ) {
        let all = common::devices();
        let device = which.get(&all).clone();
        let len = shrink_unless_it_matters(len, std::slice::from_ref(&device));
        run(&[device], len, &ops)?;
    }

    /// A buffer on one device also used on another (staging through the host).
    #[test]
    fn two_device_sequences_match_the_model(
        pair in any::<(prop::sample::Index, prop::sample::Index)>(),
        len in len_strategy(),
        ops in prop::collection::vec(op_strategy(2), 1..40),
    ) {
        let all = common::devices();
        let home = pair.0.get(&all).clone();
        let others: Vec<Device> = all.iter().filter(|d| **d != home).cloned().collect();
        // A second wrapper of the same device is a distinct device to lazybuf; with one real
        // device that still exercises two locations.
        let other = if others.is_empty() { home.clone() } else { pair.1.get(&others).clone() };
        let len = shrink_unless_it_matters(len, &[home.clone(), other.clone()]);
        run(&[home, other], len, &ops)?;
    }
}
