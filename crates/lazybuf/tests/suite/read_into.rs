//! Reads into outside memory ([`RawBuffer::read_into`]), on every device: the
//! current bytes copied once, straight from a newer device copy (the state unchanged), or
//! from the host copy once the buffer has had to update it after such a read.

use crate::common;

use lazybuf::coherence::Access;
use lazybuf::host_memory::HostMemory;
use lazybuf::{BufferState, Device, RawBuffer, TransferStats};

/// Downloads counted on any device: bytes copied, or a zero-copy sync where the device copy
/// aliases the host block.
fn downloads(stats: TransferStats) -> u64 {
    stats.device_to_host.copies + stats.zero_copy_syncs
}

fn bytes_of(seed: u32, n: usize) -> Vec<u8> {
    common::pattern(seed, n / 4).iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// A buffer holding `data` whose device copy is current and host copy stale.
fn device_dirty(device: &Device, data: &[u8]) -> RawBuffer {
    let mut buf = RawBuffer::new(data.len(), device.clone(), false);
    buf.host_access(Access::Overwrite).unwrap().copy_from_slice(data);
    buf.sync(Some(device)).unwrap();
    buf.device_access(device, Access::Write).unwrap();
    assert_eq!(buf.state(), BufferState::DeviceDirty, "{device}");
    buf
}

#[test]
fn a_newer_device_copy_is_read_once_and_the_state_stays() {
    for device in common::devices() {
        for n in [4, 4096, 4 << 20] {
            let data = bytes_of(n as u32, n);
            let mut buf = device_dirty(&device, &data);
            let before = buf.transfer_stats();
            let mut out = HostMemory::allocate(n + 64).unwrap();
            buf.read_into(&mut out).unwrap();
            assert_eq!(&out.as_slice()[..n], &data[..], "{device} {n}");
            let after = buf.transfer_stats();
            assert_eq!(downloads(after), downloads(before) + 1, "{device} {n}");
            assert_eq!(after.host_to_device, before.host_to_device, "{device} {n}");
            assert_eq!(buf.state(), BufferState::DeviceDirty, "{device} {n}: the host copy stays stale");
            // The host copy, read now, is downloaded as usual and holds the same bytes.
            assert_eq!(buf.host_access(Access::Read).unwrap(), &data[..], "{device} {n}");
            assert_eq!(buf.state(), BufferState::Synchronized, "{device} {n}");
            // A current host copy is copied from: no download.
            let settled = buf.transfer_stats();
            let mut again = HostMemory::allocate(n).unwrap();
            buf.read_into(&mut again).unwrap();
            assert_eq!(again.as_slice(), &data[..], "{device} {n}");
            assert_eq!(buf.transfer_stats(), settled, "{device} {n}");
        }
    }
}

#[test]
fn a_device_only_buffer_is_read_without_a_host_block() {
    for device in common::devices() {
        let n = 4096;
        let mut buf = RawBuffer::new(n, device.clone(), false);
        buf.fill(&[7]).unwrap();
        buf.sync(Some(&device)).unwrap();
        buf.device_access(&device, Access::Write).unwrap();
        let mut source = RawBuffer::new(n, device.clone(), false);
        source.sync(Some(&device)).unwrap(); // a read of nothing: zeros on the device
        let mut out = HostMemory::allocate(n).unwrap();
        source.read_into(&mut out).unwrap();
        assert!(out.as_slice().iter().all(|&b| b == 0), "{device}");
        assert_eq!(source.state(), BufferState::DeviceOnly, "{device}: no host copy was made");
        buf.read_into(&mut out).unwrap();
        assert!(out.as_slice().iter().all(|&b| b == 7), "{device}");
    }
}

#[test]
fn read_modify_write_on_one_buffer_updates_the_host_copy_once_it_is_wanted() {
    for device in common::devices() {
        let n = 4096;
        let mut buf = RawBuffer::new(n, device.clone(), false);
        let mut out = HostMemory::allocate(n).unwrap();
        let mut per_batch = Vec::new();
        for i in 0..4u8 {
            let start = downloads(buf.transfer_stats());
            buf.host_access(Access::Write).unwrap().fill(i);
            let host = downloads(buf.transfer_stats()) - start;
            buf.sync(Some(&device)).unwrap();
            buf.device_access(&device, Access::Write).unwrap();
            let start = downloads(buf.transfer_stats());
            buf.read_into(&mut out).unwrap();
            assert!(out.as_slice().iter().all(|&b| b == i), "{device} batch {i}");
            per_batch.push(host + downloads(buf.transfer_stats()) - start);
            let expected = if i == 0 { BufferState::DeviceDirty } else { BufferState::Synchronized };
            assert_eq!(buf.state(), expected, "{device} batch {i}");
        }
        assert_eq!(per_batch, [1, 2, 1, 1], "{device}");
        // Invalidating the buffer forgets what it learnt: a direct read again.
        buf.invalidate();
        buf.host_access(Access::Overwrite).unwrap().fill(9);
        buf.sync(Some(&device)).unwrap();
        buf.device_access(&device, Access::Write).unwrap();
        buf.read_into(&mut out).unwrap();
        assert_eq!(buf.state(), BufferState::DeviceDirty, "{device}");
    }
}

#[test]
fn a_block_too_short_is_refused_and_nothing_changes() {
    for device in common::devices() {
        let data = bytes_of(3, 4096);
        let mut buf = device_dirty(&device, &data);
        let stats = buf.transfer_stats();
        let mut out = HostMemory::allocate(4095).unwrap();
        let err = buf.read_into(&mut out).unwrap_err().to_string();
        assert!(err.contains("expected a block of at least 4096 bytes, got 4095"), "{err}");
        assert_eq!(buf.state(), BufferState::DeviceDirty, "{device}");
        assert_eq!(buf.transfer_stats(), stats, "{device}");
    }
}
