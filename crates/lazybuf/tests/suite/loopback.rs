//! The test-only loopback backend (feature `loopback`) is found and driven exactly as a real
//! backend is: discovery lists it from its registry line, the generic suites (contract, model,
//! streams, pool, bad input...) run on it through `common::devices()` with no line of theirs
//! naming it, and what makes it a discrete device holds: syncs move bytes, its two devices
//! copy directly between each other, and its capacity runs out like a GPU's.

#![cfg(feature = "loopback")]

use crate::common;

use lazybuf::backend::loopback::{CAPACITY, LoopbackBackend};
use lazybuf::{BackendKind, BufferOptions, BufferState, Device, DirectResource, Error, UnifiedBuffer};

fn loopbacks() -> Vec<Device> {
    common::devices_of(BackendKind::LOOPBACK)
}

#[test]
fn discovery_lists_both_loopback_devices_and_selectors_pick_them() {
    let found = loopbacks();
    assert_eq!(found.len(), 2, "{:?}", lazybuf::devices());
    for (index, device) in found.iter().enumerate() {
        let selected = lazybuf::select_device(&format!("loopback:{index}")).unwrap();
        assert_eq!(&selected, device);
        assert!(device.backend_as::<LoopbackBackend>().is_some());
        assert!(!device.info().shares_host_memory && !device.is_zero_copy(1 << 30));
    }
    // Not a GPU: the default device is not a loopback device.
    assert_ne!(lazybuf::default_device().unwrap().backend_kind(), BackendKind::LOOPBACK);
}

#[test]
fn syncs_move_their_bytes_both_ways() {
    for device in loopbacks() {
        let mut buf = UnifiedBuffer::<u32>::on(&[1000], &device).unwrap();
        buf.copy_from(&common::pattern(1, 1000)).unwrap();
        buf.sync_to_device().unwrap();
        assert_eq!(buf.state(), BufferState::Synchronized);
        // A host write, then a device read: uploaded again. A device write marked, then a host
        // read: downloaded.
        buf.host_mut().unwrap()[0] = 7;
        buf.device().unwrap();
        buf.device_mut().unwrap();
        assert_eq!(buf.host().unwrap()[0], 7);
        let stats = buf.transfer_stats();
        assert_eq!((stats.host_to_device.copies, stats.host_to_device.bytes), (2, 8000));
        assert_eq!((stats.device_to_host.copies, stats.device_to_host.bytes), (1, 4000));
        assert_eq!(stats.zero_copy_syncs, 0);
    }
}

#[test]
fn the_two_devices_copy_directly_between_each_other() {
    let [a, b] = <[Device; 2]>::try_from(loopbacks()).unwrap();
    assert!(b.can_copy_from(&a) && a.can_copy_from(&b));
    let mut buf = UnifiedBuffer::<u32>::on(&[257], &a).unwrap();
    buf.copy_from(&common::pattern(2, 257)).unwrap();
    buf.device_mut().unwrap(); // only the first device's copy is current
    buf.sync_to(&b).unwrap();
    let stats = buf.transfer_stats();
    assert_eq!((stats.device_to_device.copies, stats.device_to_device.bytes), (1, 257 * 4));
    assert_eq!(stats.host_to_device.copies, 1, "the second device was filled from the first, not the host");
}

#[test]
fn beyond_its_capacity_a_loopback_device_is_out_of_memory_and_nothing_changes() {
    let device = loopbacks().remove(0);
    let options = BufferOptions {
        device: Some(device.clone()),
        resource: Some(DirectResource::shared()),
        ..BufferOptions::default()
    };
    let mut big = UnifiedBuffer::<u8>::with_options(&[CAPACITY as usize / 2 + 1], options.clone()).unwrap();
    big.host_mut().unwrap().fill(3);
    big.sync_to_device().unwrap();
    let mut other = UnifiedBuffer::<u8>::with_options(&[CAPACITY as usize / 2 + 1], options).unwrap();
    other.host_mut().unwrap().fill(4);
    let err = other.sync_to_device().unwrap_err();
    assert!(matches!(err, Error::OutOfMemory { .. }), "{err}");
    assert!(err.to_string().contains("loopback device 0"), "{err}");
    assert_eq!(other.state(), BufferState::HostOnly);
    assert!(other.host().unwrap().iter().all(|&b| b == 4));
    drop(big);
    other.sync_to_device().unwrap();
    assert_eq!(device.memory_info().unwrap().total, CAPACITY);
}

#[test]
fn memory_of_one_loopback_device_is_refused_by_the_other() {
    let [a, b] = <[Device; 2]>::try_from(loopbacks()).unwrap();
    let mut memory = common::device_memory(&a, 64);
    let err = b.stream().fill(&mut memory, &[1], 64).unwrap_err();
    assert!(err.to_string().contains("expected memory of loopback device 1"), "{err}");
}
