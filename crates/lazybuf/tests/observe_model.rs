//! The model test's extension for `lazybuf::observe`: over random sequences of buffer
//! operations on every device (and a second device, for device-to-device copies where a pair
//! allows them), the transfer guard (at `log_explicit`) logs, and the recorder
//! records, exactly the copies the transfer counters count: none missed, none invented, per
//! direction, in copies and bytes. Steps drawn with a refused direction run under
//! `disallow_explicit` for it: such a step either raises the guard's error naming that
//! direction and changes nothing (state, residencies, counters, transfers in flight, and the
//! host bytes when they were readable), or moves no byte that way.
//!
//! Both devices are wrapped in `lazybuf::testing::FaultyDevice`s, and steps may arm a fault
//! in the next copy of either (failing when enqueued, or through its ticket when settled):
//! the recorder still agrees with the counters, which take back the copies of a failed plan
//! (a copy that ran before a later copy of its plan failed, a failed asynchronous transfer)
//! through its rollback events. (The guard sees copies when they are planned: with faults,
//! it has logged at least the counted copies.)
//!
//! The guard's log hook and the recorder are process-wide: the tests here hold `LOCK` and
//! count only their own buffer's copies. `PROPTEST_CASES` sets the number of sequences
//! (default 300).

mod common;

use std::sync::{Arc, Mutex};

use common::pattern;
use lazybuf::observe::guard::{self, GuardLevel, GuardLevels};
use lazybuf::observe::{Direction, TransferInfo, trace};
use lazybuf::testing::{FaultPlan, FaultyDevice};
use lazybuf::{Device, Error, Location, TransferStats, UnifiedBuffer};
use proptest::prelude::*;

static LOCK: Mutex<()> = Mutex::new(());

#[derive(Clone, Debug)]
enum Op {
    HostRead,
    HostWrite(u32),
    HostOverwrite(u32),
    DeviceRead,
    DeviceWrite,
    DeviceOverwrite,
    SyncToDevice,
    SyncToHost,
    SyncAsync(bool),
    Finish,
    MarkHostDirty,
    MarkDeviceDirty,
    Fill(u32),
    CopyFrom(u32),
    CopyTo,
    Invalidate,
    Release,
    /// Accesses and syncs on a second device (device-to-device copies where the pair allows).
    OtherRead,
    OtherWrite,
    SyncToOther,
    /// Arms a fault in the next copy of the home (false) or the second (true) device,
    /// deferred to its ticket or not.
    FailNextCopy(bool, bool),
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => Just(Op::HostRead),
        3 => any::<u32>().prop_map(Op::HostWrite),
        1 => any::<u32>().prop_map(Op::HostOverwrite),
        3 => Just(Op::DeviceRead),
        3 => Just(Op::DeviceWrite),
        1 => Just(Op::DeviceOverwrite),
        2 => Just(Op::SyncToDevice),
        2 => Just(Op::SyncToHost),
        3 => any::<bool>().prop_map(Op::SyncAsync),
        1 => Just(Op::Finish),
        2 => Just(Op::MarkHostDirty),
        2 => Just(Op::MarkDeviceDirty),
        1 => any::<u32>().prop_map(Op::Fill),
        1 => any::<u32>().prop_map(Op::CopyFrom),
        2 => Just(Op::CopyTo),
        1 => Just(Op::Invalidate),
        1 => Just(Op::Release),
        2 => Just(Op::OtherRead),
        2 => Just(Op::OtherWrite),
        1 => Just(Op::SyncToOther),
        2 => any::<(bool, bool)>().prop_map(|(second, deferred)| Op::FailNextCopy(second, deferred)),
    ]
}

fn run(
    buf: &mut UnifiedBuffer<u32>,
    other: &Device,
    faults: &[Arc<FaultPlan>; 2],
    op: &Op,
) -> lazybuf::Result<()> {
    let len = buf.len();
    match *op {
        Op::FailNextCopy(second, deferred) => {
            let plan = &faults[usize::from(second)];
            plan.defer_copy_faults(deferred);
            plan.fail_copy_in(1);
            Ok(())
        }
        Op::HostRead => buf.host().map(drop),
        Op::HostWrite(s) => buf.host_mut().map(|h| h.copy_from_slice(&pattern(s, len))),
        Op::HostOverwrite(s) => buf.host_overwrite().map(|h| h.copy_from_slice(&pattern(s, len))),
        Op::DeviceRead => buf.device().map(drop),
        Op::DeviceWrite => buf.device_mut().map(drop),
        Op::DeviceOverwrite => buf.device_overwrite().map(drop),
        Op::SyncToDevice => buf.sync_to_device(),
        Op::SyncToHost => buf.sync_to_host(),
        Op::SyncAsync(to_device) => {
            if to_device { buf.sync_to_device_async() } else { buf.sync_to_host_async() }.map(drop)
        }
        Op::Finish => buf.finish(),
        Op::MarkHostDirty => buf.mark_host_dirty(),
        Op::MarkDeviceDirty => buf.mark_device_dirty(),
        Op::Fill(v) => buf.fill(v),
        Op::CopyFrom(s) => buf.copy_from(&pattern(s, len)),
        Op::CopyTo => buf.copy_to(&mut vec![0; len]),
        Op::Invalidate => {
            buf.invalidate();
            Ok(())
        }
        Op::Release => {
            buf.release_memory();
            Ok(())
        }
        Op::OtherRead => buf.device_on(other).map(drop),
        Op::OtherWrite => buf.device_mut_on(other).map(drop),
        Op::SyncToOther => buf.sync_to(other),
    }
}

fn bytes(stats: &TransferStats, direction: Direction) -> u64 {
    match direction {
        Direction::HostToDevice => stats.host_to_device.bytes,
        Direction::DeviceToHost => stats.device_to_host.bytes,
        Direction::DeviceToDevice => stats.device_to_device.bytes,
    }
}

fn copies(stats: &TransferStats, direction: Direction) -> u64 {
    match direction {
        Direction::HostToDevice => stats.host_to_device.copies,
        Direction::DeviceToHost => stats.device_to_host.copies,
        Direction::DeviceToDevice => stats.device_to_device.copies,
    }
}

type Snapshot = (lazybuf::BufferState, [lazybuf::Residency; 3], TransferStats, bool, Option<Vec<u32>>);

fn snapshot(buf: &UnifiedBuffer<u32>, devices: &[Device; 2]) -> Snapshot {
    (
        buf.state(),
        [
            buf.residency(Location::Host),
            buf.residency(Location::Device(devices[0].id())),
            buf.residency(Location::Device(devices[1].id())),
        ],
        buf.transfer_stats(),
        buf.is_busy(),
        buf.host_if_valid().map(<[u32]>::to_vec),
    )
}

fn sequence(
    devices: &[Device; 2],
    faults: &[Arc<FaultPlan>; 2],
    len: usize,
    steps: &[(Op, Option<Direction>)],
    logged: &Arc<Mutex<Vec<TransferInfo>>>,
    ids: &Arc<Mutex<Vec<u64>>>,
) -> Result<(), TestCaseError> {
    let mut buf = UnifiedBuffer::<u32>::on(&[len], &devices[0]).unwrap();
    let id = buf.raw().id();
    ids.lock().unwrap().push(id);
    trace::start(trace::TraceOptions::default()).unwrap();
    let mut faulted = false;
    let mut result = (|| {
        for (op, refuse) in steps {
            // An armed fault may fail a copy the guard saw (and the counters then take back)
            // without any call returning its error (a release waits for transfers and drops
            // their failures): from here on the guard has logged at least the counted copies.
            faulted |= matches!(op, Op::FailNextCopy(..));
            let mut levels = GuardLevels::all(GuardLevel::LogExplicit);
            if let Some(direction) = refuse {
                levels = levels.with(*direction, Some(GuardLevel::DisallowExplicit));
            }
            let before = snapshot(&buf, devices);
            let outcome = {
                let _scope = guard::scope(levels);
                run(&mut buf, &devices[1], faults, op)
            };
            match (outcome, refuse) {
                (Err(Error::InjectedFault { .. }), _) => {}
                (Ok(()), None) => {}
                (Ok(()), Some(direction)) => {
                    let moved = bytes(&buf.transfer_stats(), *direction) - bytes(&before.2, *direction);
                    prop_assert_eq!(
                        moved,
                        0,
                        "{:?} moved {} bytes {:?} under disallow_explicit",
                        op,
                        moved,
                        direction
                    );
                }
                (Err(Error::TransferGuard { buffer, direction, .. }), Some(refused)) => {
                    prop_assert_eq!(buffer, id);
                    prop_assert_eq!(direction, *refused);
                    prop_assert_eq!(
                        snapshot(&buf, devices),
                        before,
                        "{:?}: a refused call changed the buffer",
                        op
                    );
                }
                (Err(err), _) => return Err(TestCaseError::fail(format!("{op:?}: unexpected error {err}"))),
            }
        }
        Ok(())
    })();
    faults.iter().for_each(|f| f.disarm());
    match buf.finish() {
        Ok(()) => {}
        Err(Error::InjectedFault { .. }) => {}
        Err(err) => result = Err(TestCaseError::fail(err.to_string())),
    }
    let recorded = trace::stop().unwrap();
    result?;
    let stats = buf.transfer_stats();
    let logged: Vec<TransferInfo> =
        logged.lock().unwrap().iter().filter(|i| i.buffer == id).cloned().collect();
    let summary = recorded.summary();
    prop_assert_eq!(recorded.dropped, 0);
    for direction in Direction::ALL {
        let log_bytes: u64 = logged.iter().filter(|i| i.direction == direction).map(|i| i.bytes as u64).sum();
        let log_copies = logged.iter().filter(|i| i.direction == direction).count() as u64;
        if faulted {
            prop_assert!(log_bytes >= bytes(&stats, direction), "guard-logged bytes {:?}", direction);
            prop_assert!(log_copies >= copies(&stats, direction), "guard-logged copies {:?}", direction);
        } else {
            prop_assert_eq!(log_bytes, bytes(&stats, direction), "guard-logged bytes {:?}", direction);
            prop_assert_eq!(log_copies, copies(&stats, direction), "guard-logged copies {:?}", direction);
        }
        let (rec_copies, rec_bytes) = summary
            .rows
            .iter()
            .filter(|((b, d, _), _)| *b == id && *d == direction)
            .fold((0, 0), |(c, b), (_, t)| (c + t.copies, b + t.bytes));
        prop_assert_eq!(rec_bytes, bytes(&stats, direction), "recorded bytes {:?}", direction);
        prop_assert_eq!(rec_copies, copies(&stats, direction), "recorded copies {:?}", direction);
    }
    // Every state change is recorded, once: the buffer's state events chain from the state it
    // had when recording began (made just before, so UNINITIALIZED) to the one it ends in, each
    // starting where the one before ended.
    let mut state = lazybuf::BufferState::Uninitialized;
    for event in &recorded.events {
        if let trace::EventKind::State { buffer, from, to, .. } = &event.kind
            && *buffer == id
        {
            prop_assert_eq!(
                *from,
                state,
                "a state event that does not start where the last ended: {:?}\n{:#?}",
                event,
                recorded
                    .events
                    .iter()
                    .filter(|e| !matches!(e.kind, trace::EventKind::Pool { .. }))
                    .collect::<Vec<_>>()
            );
            prop_assert_ne!(from, to, "a state event that changes nothing: {:?}", event);
            state = *to;
        }
    }
    prop_assert_eq!(state, buf.state(), "the state events end where the buffer is");
    // A failed plan's blocks are undone (and freed), and the counters do not count them: its
    // rollback event says how many (before the nineteenth hostile pass the trace had them
    // with nothing to tell them apart, and this compared with `>=` under faults).
    let allocations: i64 = recorded
        .events
        .iter()
        .map(|e| match &e.kind {
            trace::EventKind::Allocate { buffer, .. } if *buffer == id => 1,
            trace::EventKind::Rollback { buffer, allocations, .. } if *buffer == id => -(*allocations as i64),
            _ => 0,
        })
        .sum();
    prop_assert_eq!(allocations, stats.allocations as i64, "recorded allocations (faults: {})", faulted);
    Ok(())
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(300)
}

fn steps() -> impl Strategy<Value = Vec<(Op, Option<Direction>)>> {
    let refuse = prop_oneof![
        4 => Just(None),
        1 => Just(Some(Direction::HostToDevice)),
        1 => Just(Some(Direction::DeviceToHost)),
        1 => Just(Some(Direction::DeviceToDevice)),
    ];
    prop::collection::vec((op_strategy(), refuse), 1..40)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn guard_and_recorder_see_exactly_the_counted_copies(
        pair in any::<(prop::sample::Index, prop::sample::Index)>(),
        len in prop_oneof![Just(0usize), 1..300usize],
        steps in steps(),
    ) {
        let _l = LOCK.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let all = common::devices();
        let home = pair.0.get(&all).clone();
        let others: Vec<Device> = all.iter().filter(|d| **d != home).cloned().collect();
        // With one device, the second is a second wrapper of it (another identity: copies
        // between the two go through the host).
        let other = if others.is_empty() { home.clone() } else { pair.1.get(&others).clone() };
        let (home, home_faults) = FaultyDevice::wrap(&home);
        let (other, other_faults) = FaultyDevice::wrap(&other);
        let ids = Arc::new(Mutex::new(Vec::new()));
        let logged = Arc::new(Mutex::new(Vec::new()));
        let (hook_ids, sink) = (Arc::clone(&ids), Arc::clone(&logged));
        guard::set_log_hook(Some(Arc::new(move |info: &TransferInfo, _| {
            if hook_ids.lock().unwrap().contains(&info.buffer) {
                sink.lock().unwrap().push(info.clone());
            }
        })));
        let result = sequence(&[home, other], &[home_faults, other_faults], len, &steps, &logged, &ids);
        guard::set_log_hook(None);
        result?;
    }
}
