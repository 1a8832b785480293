//! The disk tier: under a host memory limit, host copies that are the only
//! current data of shared buffers go to spill files and come back at the next access; pinned
//! copies never go; files go with their data; a spill directory that cannot be written is a
//! clear error and nothing is lost (in a child process, which gets its own directory); files
//! are written with direct I/O where the file system takes it, in a tmpfs and a disk
//! directory (child processes again).
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

/// Bytes of the disk tests' large buffers: more than one chunk, and not a multiple of the
/// direct I/O alignment (the tail goes through the staging block, padded).
const BIG: usize = spill::disk::CHUNK + spill::disk::ALIGN + 12;

/// Run by [`spill_files_use_direct_io_where_the_file_system_takes_it`] in a child process
/// whose `LAZYBUF_SPILL_DIR` is the directory under test; `LAZYBUF_TEST_EXPECT_DIRECT` says
/// whether its files must be written with direct I/O.
#[test]
#[ignore = "run by its parent test in a child process"]
fn child_spilling_through_its_directory() {
    let expect_direct = match std::env::var("LAZYBUF_TEST_EXPECT_DIRECT").as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        other => panic!("run by the parent test (LAZYBUF_TEST_EXPECT_DIRECT is {other:?})"),
    };
    for device in devices() {
        // A large buffer (page-aligned block, a partial last chunk) and a small one (a heap
        // block: staged), each pushed to disk by a newcomer of its size.
        for len in [BIG / 4, 250] {
            let bytes = (len * 4) as u64;
            spill::reset_spill_stats(&device);
            lazybuf::trim();
            spill::set_host_memory_limit(Some(spill::host_memory_held() + bytes + bytes / 2));
            let first =
                SharedBuffer::new(UnifiedBuffer::<u32>::from_slice(&pattern(1, len), &device).unwrap());
            let second = UnifiedBuffer::<u32>::from_slice(&pattern(2, len), &device).unwrap();
            assert!(first.lock().raw().is_on_disk(), "{device} {len}");
            let stats = spill::spill_stats(&device);
            assert_eq!(stats.bytes_to_disk, bytes, "{device} {len}");
            assert_eq!(stats.bytes_to_disk_direct, if expect_direct { bytes } else { 0 }, "{device} {len}");
            let file = std::fs::read_dir(spill::disk::spill_dir()).unwrap().next().unwrap().unwrap();
            let on_disk = file.metadata().unwrap().len();
            let padded = bytes.next_multiple_of(spill::disk::ALIGN as u64);
            assert_eq!(on_disk, if expect_direct { padded } else { bytes }, "{device} {len}");
            drop(second);
            spill::set_host_memory_limit(None);
            assert_eq!(first.lock().host().unwrap(), pattern(1, len), "{device} {len}");
            assert_eq!(spill::spill_stats(&device).bytes_from_disk, bytes, "{device} {len}");
            assert_eq!(spill_files(), 0, "{device} {len}: the file goes when its data is read back");
        }
    }
}

/// Whether `dir`'s file system takes an aligned `O_DIRECT` write (what the disk tier tries).
fn takes_direct_io(dir: &std::path::Path) -> bool {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let probe = dir.join("probe");
    let opened = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(&probe);
    let page = vec![7u8; 3 * 4096];
    let start = (4096 - page.as_ptr().addr() % 4096) % 4096;
    let written = opened.and_then(|mut file| file.write_all(&page[start..start + 4096]));
    let _ = std::fs::remove_file(&probe);
    match written {
        Ok(()) => true,
        Err(err) if err.raw_os_error() == Some(libc::EINVAL) => false,
        Err(err) => panic!("probing {}: {err}", dir.display()),
    }
}

/// Spill files in a tmpfs directory (`/dev/shm`) and in one on the disk's file system
/// (`/var/tmp`): written with direct I/O where the file system takes `O_DIRECT` (tmpfs does
/// since Linux 6.6, older kernels refuse it), else buffered; with direct I/O turned off
/// (`LAZYBUF_SPILL_DIRECT_IO=0`), buffered everywhere. Each runs in a child process with its
/// own spill directory, which is empty again at the end.
#[test]
#[cfg(target_os = "linux")]
fn spill_files_use_direct_io_where_the_file_system_takes_it() {
    let mut runs = 0;
    for (base, direct_io) in [("/dev/shm", "1"), ("/var/tmp", "1"), ("/var/tmp", "0")] {
        let base = std::path::Path::new(base);
        if !base.is_dir() {
            continue;
        }
        let dir = base.join(format!("lazybuf-spill-test-{}-{direct_io}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let expect_direct = direct_io == "1" && takes_direct_io(&dir);
        let output = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "child_spilling_through_its_directory", "--ignored", "--nocapture"])
            .env("LAZYBUF_SPILL_DIR", &dir)
            .env("LAZYBUF_SPILL_DIRECT_IO", direct_io)
            .env("LAZYBUF_TEST_EXPECT_DIRECT", if expect_direct { "1" } else { "0" })
            .output()
            .unwrap();
        let left = std::fs::read_dir(&dir).map_or(0, |d| d.count());
        let _ = std::fs::remove_dir_all(&dir);
        let text = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success() && text.contains("1 passed"),
            "{} (direct I/O expected: {expect_direct}): {text}\n{}",
            dir.display(),
            String::from_utf8_lossy(&output.stderr)
        );
        assert_eq!(left, 0, "{}: files left behind", dir.display());
        runs += 1;
    }
    assert!(runs >= 2, "neither /dev/shm nor /var/tmp could be tried");
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
