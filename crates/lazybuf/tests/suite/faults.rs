//! Every failure surfaces and changes nothing, exhaustively: for each device, each starting
//! state of the table, each operation, and each of its first allocations and copies made to
//! fail (through `lazybuf::testing::FaultyDevice`, which also scribbles over a copy's
//! destination before failing, as a runtime dying half-way would), the operation returns the
//! injected error and leaves the state, the transfer counters and every valid byte as they
//! were, fills included (they fail before they start here; a fill a runtime abandons half-way
//! marks the device copy stale when another copy is current, which `cuda_faults.rs` covers).
//! `model.rs` weaves the same faults into random sequences, also over pools.
//!
//! Buffers here take their memory straight from the backends ([`DirectResource`]), so every
//! allocation reaches the faulty device (a pool would serve most of them from its cache).

use crate::common;

use common::pattern;
use lazybuf::testing::{FaultPlan, FaultyDevice};
use lazybuf::{BufferOptions, BufferState, Device, DirectResource, Error, UnifiedBuffer};

/// A buffer on `device` whose every allocation goes to the device.
fn direct<T: lazybuf::Element>(shape: &[usize], device: &Device) -> UnifiedBuffer<T> {
    let options = BufferOptions {
        device: Some(device.clone()),
        resource: Some(DirectResource::shared()),
        ..BufferOptions::default()
    };
    UnifiedBuffer::with_options(shape, options).unwrap()
}

type Op = (&'static str, fn(&mut UnifiedBuffer<u32>, &Device) -> lazybuf::Result<()>);

const OPS: [Op; 12] = [
    ("host", |b, _| b.host().map(drop)),
    ("host_mut", |b, _| b.host_mut().map(drop)),
    ("host_overwrite", |b, _| b.host_overwrite().map(drop)),
    ("device", |b, _| b.device().map(drop)),
    ("device_mut", |b, _| b.device_mut().map(drop)),
    ("device_overwrite", |b, _| b.device_overwrite().map(drop)),
    ("sync_to_device", |b, _| b.sync_to_device()),
    ("sync_to_host", |b, _| b.sync_to_host()),
    ("mark_host_dirty", |b, _| b.mark_host_dirty()),
    ("mark_device_dirty", |b, _| b.mark_device_dirty()),
    ("fill", |b, _| b.fill(77)),
    ("sync_to other device", |b, other| b.sync_to(other)),
];

/// Brings a new buffer to `state` with known contents; returns those contents.
fn prepare(buf: &mut UnifiedBuffer<u32>, state: BufferState, seed: u32) -> Option<Vec<u32>> {
    let data = pattern(seed, buf.len());
    let older = pattern(seed + 1, buf.len());
    match state {
        BufferState::Uninitialized => return None,
        BufferState::HostOnly => buf.copy_from(&data).unwrap(),
        BufferState::DeviceOnly => buf.device_overwrite().unwrap().write_from(&data).unwrap(),
        BufferState::Synchronized => {
            buf.copy_from(&data).unwrap();
            buf.sync_to_device().unwrap();
        }
        BufferState::HostDirty => {
            buf.device_overwrite().unwrap().write_from(&older).unwrap();
            buf.copy_from(&data).unwrap();
        }
        BufferState::DeviceDirty => {
            buf.copy_from(&older).unwrap();
            buf.device_mut().unwrap().write_from(&data).unwrap();
        }
        BufferState::Elsewhere => unreachable!("single-device states only"),
    }
    assert_eq!(buf.state(), state);
    Some(data)
}

const STATES: [BufferState; 6] = [
    BufferState::Uninitialized,
    BufferState::HostOnly,
    BufferState::DeviceOnly,
    BufferState::Synchronized,
    BufferState::HostDirty,
    BufferState::DeviceDirty,
];

fn arm(plan: &FaultPlan, allocation: bool, n: u64) {
    if allocation { plan.fail_allocation_in(n) } else { plan.fail_copy_in(n) }
}

#[test]
fn every_failure_is_reported_and_changes_nothing() {
    let base = common::devices();
    let mut failures: Vec<(String, usize)> = Vec::new();
    for device in &base {
        // The large length matters only where it changes the sync path (zero-copy by size).
        let lengths: &[usize] =
            if device.is_zero_copy(20) == device.is_zero_copy(4_400_000) { &[5] } else { &[5, 1_100_000] };
        for &len in lengths {
            let mut hits = 0;
            let (faulty, plan) = FaultyDevice::wrap(device);
            let (other, other_plan) = FaultyDevice::wrap(&Device::host());
            for state in STATES {
                for (name, op) in OPS {
                    for allocation in [true, false] {
                        for n in 1..=3 {
                            for target in [&plan, &other_plan] {
                                let mut buf = direct::<u32>(&[len], &faulty);
                                let data = prepare(&mut buf, state, n as u32);
                                let stats = buf.transfer_stats();
                                arm(target, allocation, n);
                                let result = op(&mut buf, &other);
                                plan.disarm();
                                other_plan.disarm();
                                let what = format!(
                                    "{name} in {state} on {device} (len {len}), failing {} {n}",
                                    if allocation { "allocation" } else { "copy" }
                                );
                                match result {
                                    Ok(()) => continue,
                                    Err(Error::InjectedFault { .. }) => hits += 1,
                                    Err(other) => panic!("{what}: unexpected error {other}"),
                                }
                                // The faulty device's fills fail before they start: nothing
                                // changes (a fill abandoned half-way, which marks the copy
                                // stale, is the CUDA double's: `cuda_faults.rs`).
                                assert_eq!(buf.state(), state, "{what}: state changed");
                                assert_eq!(buf.transfer_stats(), stats, "{what}: counters changed");
                                if let Some(data) = data {
                                    assert_eq!(buf.to_vec().unwrap(), data, "{what}: data changed");
                                }
                            }
                        }
                    }
                }
            }
            failures.push((format!("{device} (len {len})"), hits));
        }
    }
    for (what, hits) in &failures {
        eprintln!("{what}: {hits} operations hit an injected fault");
        // Each combination runs 6 states x 12 operations x 12 failure points, and 54 or 55
        // of them hit a fault on every device measured (host, PoCL, CUDA double); far fewer
        // means the arming broke.
        assert!(*hits >= 40, "{what}: only {hits} operations hit an injected fault: the test lost its teeth");
    }
}

#[test]
fn a_failed_fill_leaves_the_old_values() {
    for device in common::devices() {
        let (faulty, plan) = FaultyDevice::wrap(&device);
        let mut buf = direct::<u32>(&[64], &faulty);
        buf.copy_from(&pattern(1, 64)).unwrap();
        buf.mark_device_dirty().unwrap();
        plan.fail_copy_in(1);
        assert!(matches!(buf.fill(9), Err(Error::InjectedFault { .. })));
        assert_eq!(buf.state(), BufferState::DeviceDirty);
        assert_eq!(buf.to_vec().unwrap(), pattern(1, 64));
    }
}

#[test]
fn injected_faults_are_retryable_errors_that_say_what_failed() {
    let (faulty, plan) = FaultyDevice::wrap(&Device::host());
    let mut buf = direct::<f32>(&[4], &faulty);
    plan.fail_allocation_in(1);
    let err = buf.host_mut().unwrap_err();
    assert!(err.is_retryable());
    assert_eq!(err.to_string(), "injected fault: allocation number 1 was told to fail");
    buf.host_mut().unwrap().fill(1.0);
    assert_eq!(buf.state(), BufferState::HostOnly);
}
