//! The disk tier: under a host memory limit, host copies that are the only
//! current data of shared buffers go to spill files and come back at the next access; pinned
//! copies never go; files go with their data; a spill directory that cannot be written is a
//! clear error and nothing is lost (in a child process, which gets its own directory).
//!
//! The host limit is process-wide, so the tests of this binary take one lock and run one at a
//! time. Buffers are only used on the host here (a buffer with a device copy of any kind is
//! not the host tier's business), so every device's buffers take part.

mod common;

use std::sync::{Mutex, MutexGuard, PoisonError};

use common::{devices, pattern};
use lazybuf::spill::{self, SharedBuffer};
use lazybuf::{BufferOptions, BufferState, Device, UnifiedBuffer};

const LEN: usize = 16 * 1024;
const NBYTES: u64 = (LEN * 4) as u64;

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(PoisonError::into_inner)
}

fn shared(device: &Device, seed: u32, pinned: bool) -> SharedBuffer<u32> {
    let options = BufferOptions { device: Some(device.clone()), pinned, ..BufferOptions::default() };
    let mut buf = UnifiedBuffer::<u32>::with_options(&[LEN], options).unwrap();
    buf.copy_from(&pattern(seed, LEN)).unwrap();
    SharedBuffer::new(buf)
}

/// Room for `copies` more host copies than lazybuf holds now.
fn host_limit_for(copies: u64) {
    lazybuf::trim();
    spill::set_host_memory_limit(Some(spill::host_memory_held() + copies * NBYTES));
}

fn spill_files() -> usize {
    std::fs::read_dir(spill::disk::spill_dir()).map_or(0, |dir| dir.count())
}

#[test]
fn host_copies_go_to_disk_and_come_back() {
    let _serial = serial();
    for device in devices() {
        spill::reset_spill_stats(&device);
        let files_before = spill_files();
        host_limit_for(3);
        let bufs: Vec<_> = (0..5).map(|i| shared(&device, i, false)).collect();
        // The two least recently used host copies went to disk to make room for the last two.
        let on_disk: Vec<bool> = bufs.iter().map(|b| b.lock().raw().is_on_disk()).collect();
        assert_eq!(on_disk, [true, true, false, false, false], "{device}");
        assert_eq!(spill_files(), files_before + 2, "{device}");
        assert!(spill::host_memory_held() <= spill::host_memory_limit().unwrap(), "{device}");
        for buf in &bufs {
            assert_eq!(buf.lock().state(), BufferState::HostOnly, "{device}");
        }
        assert_eq!(spill::spill_stats(&device).bytes_to_disk, 2 * NBYTES, "{device}");
        // Reading the first one reads it back (and spills the next least recently used).
        assert_eq!(bufs[0].lock().host().unwrap(), pattern(0, LEN), "{device}");
        assert!(!bufs[0].lock().raw().is_on_disk());
        let stats = spill::spill_stats(&device);
        assert_eq!((stats.bytes_from_disk, stats.bytes_to_disk), (NBYTES, 3 * NBYTES), "{device}");
        // Every buffer's data is intact, wherever it was; the files go with their data.
        spill::set_host_memory_limit(None);
        for (i, buf) in bufs.iter().enumerate() {
            assert_eq!(buf.lock().host().unwrap(), pattern(i as u32, LEN), "{device}");
        }
        assert_eq!(spill_files(), files_before, "{device}");
    }
}

#[test]
fn a_dropped_buffer_takes_its_spill_file_with_it() {
    let _serial = serial();
    let device = Device::host();
    let files_before = spill_files();
    host_limit_for(1);
    let first = shared(&device, 1, false);
    let second = shared(&device, 2, false);
    assert!(first.lock().raw().is_on_disk());
    assert_eq!(spill_files(), files_before + 1);
    drop(first);
    assert_eq!(spill_files(), files_before);
    spill::set_host_memory_limit(None);
    assert_eq!(second.lock().host().unwrap(), pattern(2, LEN));
}

#[test]
fn pinned_host_copies_are_never_written_to_disk() {
    let _serial = serial();
    let pinnable: Vec<Device> = devices().into_iter().filter(Device::can_pin_host_memory).collect();
    assert!(!pinnable.is_empty(), "no device pins host memory here: the test would check nothing");
    for device in pinnable {
        host_limit_for(1);
        let pinned = shared(&device, 1, true);
        let newcomer = UnifiedBuffer::<u32>::from_slice(&pattern(2, LEN), &device);
        let err = newcomer.unwrap_err();
        assert!(err.is_out_of_memory() && err.to_string().contains("host"), "{device}: {err}");
        assert!(!pinned.lock().raw().is_on_disk(), "{device}");
        spill::set_host_memory_limit(None);
        assert_eq!(pinned.lock().host().unwrap(), pattern(1, LEN), "{device}");
    }
}

/// Run by [`an_unwritable_spill_directory_is_a_clear_error_and_nothing_is_lost`] in a child
/// process whose `LAZYBUF_SPILL_DIR` cannot be made.
#[test]
#[ignore = "run by its parent test in a child process"]
fn child_with_an_unwritable_spill_directory() {
    assert!(spill::disk::spill_dir().starts_with("/proc"), "run by the parent test");
    host_limit_for(1);
    let first = shared(&Device::host(), 1, false);
    let err = UnifiedBuffer::<u32>::from_slice(&pattern(2, LEN), &Device::host()).unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("could not create the directory") && message.contains("keeps its host copy"),
        "{message}"
    );
    assert!(!first.lock().raw().is_on_disk());
    spill::set_host_memory_limit(None);
    assert_eq!(first.lock().host().unwrap(), pattern(1, LEN));
    assert_eq!(first.lock().state(), BufferState::HostOnly);
}

#[test]
fn an_unwritable_spill_directory_is_a_clear_error_and_nothing_is_lost() {
    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_with_an_unwritable_spill_directory", "--ignored", "--nocapture"])
        .env("LAZYBUF_SPILL_DIR", "/proc/lazybuf-spill-cannot-be-made")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && text.contains("1 passed"),
        "{text}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn a_failed_read_back_changes_nothing() {
    let _serial = serial();
    for inner in devices() {
        let (device, faults) = lazybuf::testing::FaultyDevice::wrap(&inner);
        host_limit_for(1);
        let first = shared(&device, 1, false);
        let _second = shared(&device, 2, false);
        assert!(first.lock().raw().is_on_disk(), "{device}");
        spill::set_host_memory_limit(None);
        // The host block the read-back needs cannot be had: the access fails, the data stays on disk.
        faults.fail_allocation_in(1);
        let err = first.lock().host().map(|h| h.len()).unwrap_err();
        assert!(matches!(err, lazybuf::Error::InjectedFault { .. }), "{device}: {err}");
        let mut first = first.lock();
        assert!(first.raw().is_on_disk(), "{device}");
        assert_eq!(first.state(), BufferState::HostOnly, "{device}");
        assert_eq!(first.host().unwrap(), pattern(1, LEN), "{device}");
        assert!(!first.raw().is_on_disk(), "{device}");
    }
}
