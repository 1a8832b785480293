//! The disk tier: under a host memory limit, host copies that are the only
//! current data of shared buffers go to spill files and come back at the next access; pinned
//! copies never go; files go with their data; a spill directory that cannot be written is a
//! clear error and nothing is lost (in a child process, which gets its own directory); files
//! are written with direct I/O where the file system takes it, in a tmpfs and a disk
//! directory (child processes again).
//!
//! The host limit is process-wide, so the tests of this binary take one lock and run one at a
//! time. Buffers are only used on the host here, so every device's buffers take part, except
//! in the last test: a stale host copy (a device copy is newer) is freed for the limit,
//! writing nothing.

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

/// The host's side of a hostile pass (2026-11-27): a host limit lowered below the host
/// blocks a pool caches holds for cache hits too. Plain buffers cannot spill: once the limit
/// is reached the next host copy is refused, and memory held never passes the limit.
#[test]
fn a_host_limit_lowered_below_the_cached_blocks_holds_for_cache_hits() {
    let _serial = serial();
    for device in devices() {
        lazybuf::trim();
        spill::set_host_memory_limit(None);
        let base = spill::host_memory_held();
        let made: Vec<_> =
            (0..8).map(|i| UnifiedBuffer::<u32>::from_slice(&pattern(i, LEN), &device).unwrap()).collect();
        drop(made);
        let limit = base + 5 * NBYTES + NBYTES / 2;
        spill::set_host_memory_limit(Some(limit));
        let mut live = Vec::new();
        for i in 0..6u32 {
            match UnifiedBuffer::<u32>::from_slice(&pattern(10 + i, LEN), &device) {
                Ok(buf) => live.push(buf),
                Err(err) => assert!(err.is_out_of_memory() && i == 5, "{device}: buffer {i}: {err}"),
            }
            assert!(spill::host_memory_held() <= limit, "{device}: {} held", spill::host_memory_held());
        }
        assert_eq!(live.len(), 5, "{device}");
        spill::set_host_memory_limit(None);
        for (i, buf) in live.iter_mut().enumerate() {
            assert_eq!(buf.host().unwrap(), pattern(10 + i as u32, LEN), "{device}");
        }
    }
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
    assert!(
        matches!(err, lazybuf::Error::Io { code: Some(_), .. }),
        "an I/O error with the system's code: {err:?}"
    );
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

/// Runs this binary's ignored test `name` in a child process with `env` set (a value of
/// `None` removes the variable) and `cwd` as its working directory, and checks that it passed.
fn run_child(name: &str, env: &[(&str, Option<&std::path::Path>)], cwd: Option<&std::path::Path>) {
    let mut command = std::process::Command::new(std::env::current_exe().unwrap());
    command.args(["--exact", name, "--ignored", "--nocapture"]);
    for (key, value) in env {
        match value {
            Some(value) => command.env(key, value),
            None => command.env_remove(key),
        };
    }
    if let Some(cwd) = cwd {
        command.current_dir(cwd);
    }
    let output = command.output().unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && text.contains("1 passed"),
        "{name}: {text}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A fresh, empty directory for one test, under the system's temporary directory, removed
/// with everything in it when dropped (also when the test fails).
struct Scratch(std::path::PathBuf);

impl std::ops::Deref for Scratch {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn scratch(what: &str) -> Scratch {
    let dir = std::env::temp_dir().join(format!("lazybuf-spill-{what}-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    Scratch(dir)
}

fn entries(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    names.sort();
    names
}

/// The permission bits of `path` (not following a symbolic link).
#[cfg(unix)]
fn mode(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::symlink_metadata(path).unwrap().permissions().mode() & 0o7777
}

/// Run by [`a_relative_spill_directory_is_resolved_once_where_the_process_started`] in a child
/// process started in `A` with `LAZYBUF_SPILL_DIR=rel`; `../B/rel` exists too.
#[test]
#[ignore = "run by its parent test in a child process"]
fn child_with_a_relative_spill_directory() {
    assert_eq!(std::env::var("LAZYBUF_SPILL_DIR").as_deref(), Ok("rel"), "run by the parent test");
    let start = std::env::current_dir().unwrap();
    host_limit_for(1);
    let first = shared(&Device::host(), 1, false);
    let _second = shared(&Device::host(), 2, false);
    assert!(first.lock().raw().is_on_disk());
    let dir = spill::disk::spill_dir();
    assert_eq!(dir, start.join("rel"), "resolved against the directory of the first use");
    let [name] = entries(&dir).try_into().unwrap();
    // Somewhere else, a file of the same name in a directory of the same relative name.
    std::env::set_current_dir(start.join("../B")).unwrap();
    std::fs::write(std::path::Path::new("rel").join(&name), [7u8; LEN * 4]).unwrap();
    assert_eq!(spill::disk::spill_dir(), dir, "the directory does not move with the process");
    spill::set_host_memory_limit(None);
    assert_eq!(first.lock().host().unwrap(), pattern(1, LEN), "read back from its own file");
    assert!(entries(&dir).is_empty(), "its file went when it was read back");
    assert_eq!(std::fs::read(std::path::Path::new("rel").join(&name)).unwrap(), [7u8; LEN * 4]);
}

/// Found by a hostile script: a relative `LAZYBUF_SPILL_DIR` stayed relative, so after a
/// change of the working directory a spilled buffer was read back from (and at exit the file
/// removed from) another directory: wrong data, and the real file left behind.
#[test]
fn a_relative_spill_directory_is_resolved_once_where_the_process_started() {
    let base = scratch("relative");
    for dir in ["A/rel", "B/rel"] {
        std::fs::create_dir_all(base.join(dir)).unwrap();
    }
    let rel = std::path::Path::new("rel");
    run_child(
        "child_with_a_relative_spill_directory",
        &[("LAZYBUF_SPILL_DIR", Some(rel))],
        Some(&base.join("A")),
    );
    assert!(entries(&base.join("A/rel")).is_empty(), "files left behind");
    assert_eq!(entries(&base.join("B/rel")).len(), 1, "the other file is not lazybuf's to remove");
}

/// Spills the host copy of a new buffer and returns it with its file (the buffer that pushed it
/// out is dropped).
#[cfg(unix)]
fn spill_one(seed: u32) -> (SharedBuffer<u32>, std::path::PathBuf) {
    host_limit_for(1);
    let buf = shared(&Device::host(), seed, false);
    drop(shared(&Device::host(), seed + 100, false));
    assert!(buf.lock().raw().is_on_disk());
    spill::set_host_memory_limit(None);
    let dir = spill::disk::spill_dir();
    let [name] = entries(&dir).try_into().unwrap();
    (buf, dir.join(name))
}

/// Run by [`the_default_spill_directory_is_private_and_made_by_lazybuf`] in a child process
/// with no `LAZYBUF_SPILL_DIR` and `TMPDIR` a directory of the test; `LAZYBUF_TEST_FOREIGN`
/// is "another user's" directory (world-writable).
#[test]
#[ignore = "run by its parent test in a child process"]
#[cfg(unix)]
fn child_with_the_default_spill_directory() {
    let foreign =
        std::path::PathBuf::from(std::env::var_os("LAZYBUF_TEST_FOREIGN").expect("run by the parent test"));
    let tmp = std::env::temp_dir();
    let predicted = tmp.join(format!("lazybuf-spill-{}", std::process::id()));
    // The predictable name, taken first by a symbolic link to someone else's directory...
    std::os::unix::fs::symlink(&foreign, &predicted).unwrap();
    let (first, file) = spill_one(1);
    assert!(entries(&foreign).is_empty(), "wrote into a directory through someone's link");
    let dir = file.parent().unwrap().to_path_buf();
    assert!(dir != predicted && dir.parent() == Some(tmp.as_path()), "{}", dir.display());
    assert!(std::fs::symlink_metadata(&dir).unwrap().is_dir());
    assert_eq!((mode(&dir), mode(&file)), (0o700, 0o600), "{}", file.display());
    assert_eq!(first.lock().host().unwrap(), pattern(1, LEN));
    drop(first); // so the next spill takes the next buffer
    assert!(!dir.exists(), "lazybuf's own directory goes with its last file");
    // ... then by a directory anyone can read.
    std::fs::remove_file(&predicted).unwrap();
    std::fs::create_dir(&predicted).unwrap();
    std::fs::set_permissions(&predicted, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let (second, file) = spill_one(2);
    let dir = file.parent().unwrap().to_path_buf();
    assert!(dir != predicted && entries(&predicted).is_empty(), "{}", dir.display());
    assert_eq!((mode(&dir), mode(&file)), (0o700, 0o600), "{}", file.display());
    assert_eq!(second.lock().host().unwrap(), pattern(2, LEN));
    drop(second);
    assert!(!dir.exists() && predicted.exists(), "a directory lazybuf did not make stays");
    // Free again: lazybuf makes it, private.
    std::fs::remove_dir(&predicted).unwrap();
    let (third, file) = spill_one(3);
    assert_eq!(file.parent(), Some(predicted.as_path()));
    assert_eq!((mode(&predicted), mode(&file)), (0o700, 0o600), "{}", file.display());
    drop(third);
    assert!(!predicted.exists(), "lazybuf's own directory goes with its last file");
}

/// Found by a hostile script: the default spill directory, `lazybuf-spill-<pid>` in the shared
/// temporary directory, was used when it already existed, also as a symbolic link to another
/// user's directory, and files were created 0644 in a directory made 0755: another local user
/// could read (and rewrite) spilled data. lazybuf now writes only into a directory it made,
/// mode 0700, and its files are 0600.
#[test]
#[cfg(unix)]
fn the_default_spill_directory_is_private_and_made_by_lazybuf() {
    let base = scratch("default");
    let (tmp, foreign) = (base.join("tmp"), base.join("foreign"));
    std::fs::create_dir(&tmp).unwrap();
    std::fs::create_dir(&foreign).unwrap();
    std::fs::set_permissions(&foreign, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    run_child(
        "child_with_the_default_spill_directory",
        &[("LAZYBUF_SPILL_DIR", None), ("TMPDIR", Some(&tmp)), ("LAZYBUF_TEST_FOREIGN", Some(&foreign))],
        None,
    );
    assert!(entries(&foreign).is_empty());
    assert!(entries(&tmp).is_empty(), "{:?}", entries(&tmp));
}

/// Run by [`whether_lazybuf_made_the_spill_directory_is_decided_when_it_is_made`] in a child
/// process: with `LAZYBUF_SPILL_DIR` a directory of the test, which is then unset
/// (`LAZYBUF_TEST_NAMED=1`), or without it and with `TMPDIR` a directory of the test, and
/// `LAZYBUF_SPILL_DIR` then set (`0`).
#[test]
#[ignore = "run by its parent test in a child process"]
fn child_changing_the_spill_directory_variable() {
    let named = match std::env::var("LAZYBUF_TEST_NAMED").as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        other => panic!("run by the parent test (LAZYBUF_TEST_NAMED is {other:?})"),
    };
    host_limit_for(1);
    let bufs: Vec<_> = (0..3).map(|i| shared(&Device::host(), i, false)).collect();
    let dir = spill::disk::spill_dir();
    let files = entries(&dir);
    assert_eq!(files.len(), 2, "{}", dir.display());
    #[cfg(unix)]
    let modes: Vec<u32> = files.iter().map(|file| mode(&dir.join(file))).collect();
    // SAFETY: the only test running in this process; no other thread reads the environment now.
    unsafe {
        if named {
            std::env::remove_var("LAZYBUF_SPILL_DIR");
        } else {
            std::env::set_var("LAZYBUF_SPILL_DIR", std::env::temp_dir());
        }
    }
    // As the Python package does at exit.
    assert_eq!(spill::disk::remove_spill_files(), 2);
    assert!(entries(&dir).is_empty());
    assert_eq!(dir.exists(), named, "{}: a named directory stays, lazybuf's own goes", dir.display());
    #[cfg(unix)]
    assert_eq!(modes, [0o600, 0o600], "{files:?}: readable by their owner only");
    drop(bufs);
}

/// Found by a hostile script: whether the spill directory was lazybuf's own (removed with its
/// last file) was decided at exit from the environment, so unsetting `LAZYBUF_SPILL_DIR` at run
/// time made lazybuf remove the directory the user had named (and setting it left lazybuf's
/// own behind).
#[test]
fn whether_lazybuf_made_the_spill_directory_is_decided_when_it_is_made() {
    let base = scratch("variable");
    let (named, tmp) = (base.join("named"), base.join("tmp"));
    std::fs::create_dir(&named).unwrap();
    std::fs::create_dir(&tmp).unwrap();
    let one = std::path::Path::new("1");
    run_child(
        "child_changing_the_spill_directory_variable",
        &[("LAZYBUF_SPILL_DIR", Some(&named)), ("LAZYBUF_TEST_NAMED", Some(one))],
        None,
    );
    assert!(named.is_dir() && entries(&named).is_empty(), "a directory the user named is never removed");
    let zero = std::path::Path::new("0");
    run_child(
        "child_changing_the_spill_directory_variable",
        &[("LAZYBUF_SPILL_DIR", None), ("TMPDIR", Some(&tmp)), ("LAZYBUF_TEST_NAMED", Some(zero))],
        None,
    );
    assert!(entries(&tmp).is_empty(), "{:?}", entries(&tmp));
}

/// Spills one host buffer (`pattern(seed)`) to disk in this process's spill directory and
/// returns it with its spill file's path.
fn spilled_with_its_file(seed: u32) -> (SharedBuffer<u32>, std::path::PathBuf, SharedBuffer<u32>) {
    let device = Device::host();
    let before = entries(&spill::disk::spill_dir());
    host_limit_for(1);
    let first = shared(&device, seed, false);
    let second = shared(&device, seed + 1, false);
    spill::set_host_memory_limit(None);
    assert!(first.lock().raw().is_on_disk());
    let dir = spill::disk::spill_dir();
    let new: Vec<String> = entries(&dir).into_iter().filter(|name| !before.contains(name)).collect();
    assert_eq!(new.len(), 1, "one new spill file: {new:?}");
    (first, dir.join(&new[0]), second)
}

/// A hostile pass (2026-11-27): a spill file replaced by a FIFO of the same name made the
/// buffer's next access wait in `open` forever. Anything but a regular file in its place (a
/// FIFO, a directory, a symbolic link to the data itself) is refused at once, as an I/O error
/// (not an invalid argument) that names what was found, and the buffer is unchanged: with the
/// file put back, the next access reads it.
#[test]
#[cfg(unix)]
fn a_spill_file_replaced_by_something_else_is_refused_not_waited_on() {
    let _serial = serial();
    type Replace = fn(&std::path::Path, &std::path::Path);
    let cases: [(&str, Replace); 3] = [
        ("a FIFO", |path, _| {
            let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: `c_path` is a NUL-terminated path that lives for the call.
            let made = unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) };
            assert_eq!(made, 0, "{}", std::io::Error::last_os_error());
        }),
        ("a directory", |path, _| std::fs::create_dir(path).unwrap()),
        ("a symbolic link", |path, aside| std::os::unix::fs::symlink(aside, path).unwrap()),
    ];
    for (seed, (what, replace)) in (10..).step_by(2).zip(cases) {
        let (first, path, _second) = spilled_with_its_file(seed);
        let aside = path.with_extension("aside");
        std::fs::rename(&path, &aside).unwrap();
        replace(&path, &aside);
        // The access runs on another thread: were it to wait on the FIFO, the test fails
        // (after opening the FIFO's other end, which lets it go) instead of hanging.
        let reader = first.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let result = reader.lock().host().map(|h| h.to_vec());
            tx.send(result).unwrap();
        });
        let result = match rx.recv_timeout(std::time::Duration::from_secs(20)) {
            Ok(result) => result,
            Err(_) => {
                let _ = std::fs::OpenOptions::new().write(true).open(&path);
                panic!("{what}: the access waited on the file for 20 s");
            }
        };
        thread.join().unwrap();
        let err = result.unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, lazybuf::Error::Io { .. }), "{what}: {err:?}");
        assert!(!err.is_retryable(), "{what}: {text}");
        assert!(
            text.contains("read back from disk") && text.contains(what) && text.contains("regular file"),
            "{what}: {text}"
        );
        assert!(text.contains(&path.display().to_string()), "{what}: {text}");
        {
            let mut buf = first.lock();
            assert!(buf.raw().is_on_disk() && buf.state() == BufferState::HostOnly, "{what}");
            // Put back: read back as written.
            match std::fs::symlink_metadata(&path).unwrap().is_dir() {
                true => std::fs::remove_dir(&path).unwrap(),
                false => std::fs::remove_file(&path).unwrap(),
            }
            std::fs::rename(&aside, &path).unwrap();
            assert_eq!(buf.host().unwrap(), pattern(seed, LEN), "{what}");
            assert!(!buf.raw().is_on_disk() && !path.exists(), "{what}");
        }
    }
}

/// A hostile pass (2026-11-27): a spill file gone or cut short was reported as "invalid
/// argument for read back from disk". It is an I/O error ([`lazybuf::Error::Io`]) with the
/// system's code, not retryable (the file will not come back by itself), and changes nothing.
#[test]
fn a_missing_or_short_spill_file_is_an_io_error_and_changes_nothing() {
    let _serial = serial();
    let (first, path, _second) = spilled_with_its_file(20);
    let aside = path.with_extension("aside");
    std::fs::rename(&path, &aside).unwrap();
    let err = first.lock().host().map(|h| h.len()).unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, lazybuf::Error::Io { code: Some(lazybuf::RuntimeCode::Os(libc::ENOENT)), .. }),
        "{err:?}"
    );
    assert!(!err.is_retryable() && !text.contains("invalid argument"), "{text}");
    assert!(text.starts_with("read back from disk failed: could not read spill file"), "{text}");
    assert!(text.contains(&path.display().to_string()) && text.contains("the buffer is unchanged"), "{text}");
    assert!(first.lock().raw().is_on_disk());
    // Cut short: said so, with both sizes.
    std::fs::copy(&aside, &path).unwrap();
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(1000).unwrap();
    drop(file);
    let text = first.lock().host().map(|h| h.len()).unwrap_err().to_string();
    assert!(text.contains(&format!("expected at least {NBYTES} bytes in it, found 1000")), "{text}");
    std::fs::rename(&aside, &path).unwrap();
    assert_eq!(first.lock().host().unwrap(), pattern(20, LEN));
}

/// The host tier frees a stale host copy before it writes anything to disk (the twenty-first
/// hostile pass: under a tight host limit, the stale host blocks of DEVICE_DIRTY buffers were
/// never given back, and the next host copy was refused while they held no current data).
/// Freed, the block goes back moving no byte, DEVICE_DIRTY becomes DEVICE_ONLY, and the next
/// host read downloads the device's data. Where the device copy is the host block itself (the
/// host device), nothing can be freed: the new host copy is refused and nothing changes.
#[test]
fn a_stale_host_copy_is_freed_for_the_host_limit_writing_nothing() {
    let _serial = serial();
    for device in devices() {
        spill::set_host_memory_limit(None);
        spill::reset_spill_stats(&device);
        let files_before = spill_files();
        let bufs: Vec<_> = (0..3).map(|i| shared(&device, i, false)).collect();
        for buf in &bufs {
            let mut buf = buf.lock();
            buf.sync_to_device().unwrap();
            buf.mark_device_dirty().unwrap(); // the device's copy is the newer one now
        }
        host_limit_for(0);
        let next = UnifiedBuffer::<u32>::from_slice(&pattern(9, LEN), &device);
        let stats = spill::spill_stats(&device);
        assert_eq!((stats.bytes_to_disk, spill_files()), (0, files_before), "{device}: nothing written");
        if device.is_zero_copy(NBYTES as usize) {
            let err = next.expect_err("no host block can be given back");
            assert!(err.is_out_of_memory(), "{device}: {err}");
            assert_eq!(stats.stale_host_frees, 0, "{device}");
            for buf in &bufs {
                assert_eq!(buf.lock().state(), BufferState::DeviceDirty, "{device}");
            }
        } else {
            let next = next.unwrap();
            assert_eq!(stats.stale_host_frees, 1, "{device}");
            let states: Vec<_> = bufs.iter().map(|b| b.lock().state()).collect();
            assert_eq!(
                states,
                [BufferState::DeviceOnly, BufferState::DeviceDirty, BufferState::DeviceDirty],
                "{device}"
            );
            assert!(spill::host_memory_held() <= spill::host_memory_limit().unwrap(), "{device}");
            drop(next);
        }
        // Every buffer's data is intact, read back from its device.
        spill::set_host_memory_limit(None);
        for (i, buf) in bufs.iter().enumerate() {
            assert_eq!(buf.lock().host().unwrap(), pattern(i as u32, LEN), "{device}");
        }
    }
}
