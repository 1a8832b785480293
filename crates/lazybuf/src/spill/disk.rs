//! The disk tier: spill files holding host copies that were the only current data of their
//! buffer, written when the host's memory limit needs room ([`super::set_host_memory_limit`]) and read
//! back at the buffer's next access.
//!
//! Files live in the spill directory: `LAZYBUF_SPILL_DIR`, else `lazybuf-spill-<pid>` under the
//! system's temporary directory, made at the first spill and removed with its last file (a
//! directory the user named stays). A file is `<pid>-<n>.bin`, created exclusively, and
//! removed only by the process that wrote it: processes sharing a directory, and a forked
//! child with its parent's buffers, never remove or overwrite each other's files. Each file is
//! written and read in large chunks ([`CHUNK`]), and removed when its data is read back or its
//! buffer goes (a file of a process killed before that stays behind in the directory). A write
//! that fails (a full or unwritable disk) removes the partial file and returns a clear error:
//! the buffer keeps its host copy.
//!
//! **Direct I/O.** On Linux files are opened with `O_DIRECT`, bypassing the page cache (a
//! spilled copy is read once, later: caching its bytes would take back the host memory the
//! spill gave): every write and read is [`ALIGN`]-aligned in address, offset and length.
//! Chunks of a page-aligned host block (every block of 64 KiB and more) go straight from and
//! to the block; the others (a small block's bytes, the last chunk's tail) through an aligned
//! staging block, the tail padded with zeros (the file is then up to `ALIGN - 1` bytes longer
//! than its data). Where the file system refuses `O_DIRECT` (`EINVAL`, at the open or at a
//! write or read: some FUSE, overlay and older tmpfs file systems) the file is written and
//! read with plain buffered I/O instead, from the start; [`SPILL_DIRECT_IO_ENV`] turns direct
//! I/O off, and systems other than Linux always use buffered I/O. Which mode a file used is
//! [`SpillFile::is_direct`]; [`super::SpillStats::bytes_to_disk_direct`] counts the bytes
//! written with direct I/O.
//!
//! What does not live here: choosing what to spill (`spill::eviction`), the buffer's side
//! ([`crate::RawBuffer::spill_host_to_disk`]).

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

use crate::error::{Error, Result};
use crate::host_memory::HostMemory;

/// The environment variable that names the spill directory.
pub const SPILL_DIR_ENV: &str = "LAZYBUF_SPILL_DIR";

/// The environment variable that turns direct I/O off: `0`, `off` or `false` (read at each
/// spill). Anything else, or unset: direct I/O where the file system supports it.
pub const SPILL_DIRECT_IO_ENV: &str = "LAZYBUF_SPILL_DIRECT_IO";

/// The size of each write and read: large, and a multiple of every page and sector size.
pub const CHUNK: usize = 8 << 20;

/// The alignment of direct I/O's addresses, offsets and lengths: a page, and a multiple of
/// every logical block size in use (512 and 4096 bytes).
pub const ALIGN: usize = 4096;

/// Host blocks this large or larger are whole pages ([`crate::host_memory`]): the smallest
/// staging block that is page-aligned.
const PAGED: usize = 64 * 1024;

/// The spill directory (see the module docs).
pub fn spill_dir() -> PathBuf {
    spill_dir_and_owner().0
}

/// The spill directory, and whether it is this process's own (`lazybuf-spill-<pid>`, removed
/// when its last file goes), not one the user named.
fn spill_dir_and_owner() -> (PathBuf, bool) {
    match std::env::var_os(SPILL_DIR_ENV) {
        Some(dir) if !dir.is_empty() => (PathBuf::from(dir), false),
        _ => (std::env::temp_dir().join(format!("lazybuf-spill-{}", std::process::id())), true),
    }
}

/// Makes `dir` if missing and a new file in it, `<pid>-<n>.bin`, made with `O_EXCL` (a file
/// of another process, or one a killed process of the same pid left behind, is never taken
/// over: the next number is tried), and registers it as live, under the lock that [`forget`]
/// takes to remove the process's own directory once empty: a directory being filled is never
/// removed. Returns the new file's path.
fn register(dir: &Path) -> std::io::Result<PathBuf> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let mut live = live_files().lock().unwrap_or_else(PoisonError::into_inner);
    std::fs::create_dir_all(dir)?;
    let pid = std::process::id();
    let mut attempts = 0;
    let path = loop {
        let path = dir.join(format!("{pid}-{}.bin", NEXT.fetch_add(1, Ordering::Relaxed)));
        match OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(_) => break path,
            Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists && attempts < 1000 => attempts += 1,
            Err(err) => return Err(err),
        }
    };
    live.insert(path.clone(), pid);
    Ok(path)
}

/// Unregisters `path` (its file is gone); removes the process's own spill directory
/// (`own_dir`) when no live file is left in it. Never panics.
fn forget(path: &Path, own_dir: bool) {
    let mut live = live_files().lock().unwrap_or_else(PoisonError::into_inner);
    live.remove(path);
    if let Some(dir) = path.parent().filter(|dir| own_dir && !live.keys().any(|p| p.parent() == Some(*dir))) {
        // Fails, harmlessly, when something else is in it.
        let _ = std::fs::remove_dir(dir);
    }
}

/// Whether spill files try direct I/O ([`SPILL_DIRECT_IO_ENV`]; Linux only).
fn direct_io_wanted() -> bool {
    let off = std::env::var(SPILL_DIRECT_IO_ENV)
        .is_ok_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "0" | "off" | "false"));
    cfg!(target_os = "linux") && !off
}

/// The spill files this process knows, with the process that made each: a forked child
/// inherits its parent's, which stay the parent's (the child reads them, never removes them).
fn live_files() -> &'static Mutex<HashMap<PathBuf, u32>> {
    static LIVE: OnceLock<Mutex<HashMap<PathBuf, u32>>> = OnceLock::new();
    LIVE.get_or_init(Mutex::default)
}

/// Removes every spill file this process made and still has (for an exit that drops no
/// buffer: the Python package calls it at interpreter exit). Buffers whose file is removed
/// lose their data, so call it only when none will be used again. A forked child's call
/// leaves its parent's files alone. Returns the files removed.
pub fn remove_spill_files() -> usize {
    let pid = std::process::id();
    let files: Vec<PathBuf> = live_files()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .filter(|&(_, &owner)| owner == pid)
        .map(|(path, _)| path.clone())
        .collect();
    let own_dir = spill_dir_and_owner().1;
    files
        .iter()
        .filter(|path| {
            let removed = std::fs::remove_file(path).is_ok();
            forget(path, own_dir);
            removed
        })
        .count()
}

/// Opens a spill file for direct I/O: a new one to write (`true`) or one to read (`false`).
type Opener = dyn Fn(&Path, bool) -> std::io::Result<File>;

/// One buffer's bytes in a spill file, removed when dropped.
#[derive(Debug)]
pub struct SpillFile {
    path: PathBuf,
    len: usize,
    direct: bool,
    /// Its directory is the process's own: removed with its last file.
    own_dir: bool,
    /// The process that wrote it, the only one that removes it: a forked child that drops a
    /// buffer it inherited leaves the parent's file in place.
    owner: u32,
}

impl SpillFile {
    /// Writes `bytes` to a new file in the spill directory, with direct I/O where the file
    /// system supports it (see the module docs).
    pub fn write(bytes: &[u8]) -> Result<SpillFile> {
        let open: &Opener = &open_direct;
        Self::write_with(bytes, direct_io_wanted().then_some(open))
    }

    /// [`Self::write`], opening the file for direct I/O with `open_direct` (`None`: buffered
    /// I/O only).
    fn write_with(bytes: &[u8], open_direct: Option<&Opener>) -> Result<SpillFile> {
        let (dir, own_dir) = spill_dir_and_owner();
        let failed = |what: &str, path: &Path, err: std::io::Error| {
            Error::invalid(
                "spill to disk",
                format!(
                    "could not {what} {} ({} bytes): {err}; the buffer keeps its host copy \
                     (set {SPILL_DIR_ENV} to a writable directory with room, or raise the host memory limit)",
                    path.display(),
                    bytes.len()
                ),
            )
        };
        let path =
            register(&dir).map_err(|err| failed("create the directory or a new file in", &dir, err))?;
        let failed = |what: &str, err: std::io::Error| failed(what, &path, err);
        let owner = std::process::id();
        let mut file = SpillFile { path: path.clone(), len: bytes.len(), direct: false, own_dir, owner };
        // From here the file is removed on failure (by dropping `file`).
        if let Some(open_direct) = open_direct {
            let written = open_direct(&path, true).map_err(|err| ("create", err)).and_then(|mut out| {
                write_direct(&mut out, bytes).map_err(|err| ("write", err))?;
                out.sync_data().map_err(|err| ("flush", err))
            });
            match written {
                Ok(()) => {
                    file.direct = true;
                    return Ok(file);
                }
                // The file system does not do direct I/O: buffered below, from the start.
                Err((_, err)) if refuses_direct_io(&err) => {}
                Err((what, err)) => return Err(failed(what, err)),
            }
        }
        let mut out = File::create(&path).map_err(|err| failed("create", err))?;
        for chunk in bytes.chunks(CHUNK) {
            out.write_all(chunk).map_err(|err| failed("write", err))?;
        }
        out.sync_data().map_err(|err| failed("flush", err))?;
        Ok(file)
    }

    /// Reads the file's bytes into `out` (exactly as many as were written).
    pub fn read_into(&self, out: &mut [u8]) -> Result<()> {
        self.read_with(out, &open_direct)
    }

    /// [`Self::read_into`], opening a direct file with `open_direct`.
    fn read_with(&self, out: &mut [u8], open_direct: &Opener) -> Result<()> {
        let failed = |err: std::io::Error| {
            Error::invalid(
                "read back from disk",
                format!(
                    "could not read {} ({} bytes): {err}; the buffer keeps its spill file",
                    self.path.display(),
                    self.len
                ),
            )
        };
        if out.len() != self.len {
            return Err(Error::LengthMismatch {
                operation: "read back from disk",
                expected: self.len,
                actual: out.len(),
            });
        }
        if self.direct {
            match open_direct(&self.path, false).and_then(|mut file| read_direct(&mut file, out)) {
                Ok(()) => return Ok(()),
                // Refused after all (the directory is on another file system now?): buffered.
                Err(err) if refuses_direct_io(&err) => {}
                Err(err) => return Err(failed(err)),
            }
        }
        let mut file = File::open(&self.path).map_err(failed)?;
        for chunk in out.chunks_mut(CHUNK) {
            file.read_exact(chunk).map_err(failed)?;
        }
        Ok(())
    }

    /// Whether the file was written with direct I/O (it is read with it too).
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// Where the file is.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// The bytes it holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for SpillFile {
    fn drop(&mut self) {
        // Never panics: a file already gone (or a directory removed by hand) is fine. Only
        // its writer removes it (in a forked child it is still the parent's).
        let mine = self.owner == std::process::id();
        if mine {
            let _ = std::fs::remove_file(&self.path);
        }
        forget(&self.path, self.own_dir && mine);
    }
}

/// Opens `path` with `O_DIRECT`: a new file to write (`create`) or one to read. Elsewhere than
/// on Linux the open is refused as unsupported.
fn open_direct(path: &Path, create: bool) -> std::io::Result<File> {
    let mut options = OpenOptions::new();
    if create {
        options.write(true).create(true).truncate(true);
    } else {
        options.read(true);
    }
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_DIRECT);
        options.open(path)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (options, path);
        Err(std::io::Error::from_raw_os_error(EINVAL))
    }
}

#[cfg(unix)]
const EINVAL: i32 = libc::EINVAL;
/// `ERROR_INVALID_PARAMETER`.
#[cfg(not(unix))]
const EINVAL: i32 = 87;

/// Whether `err` is a file system's refusal of direct I/O (rather than a full disk, a missing
/// directory or a permission).
fn refuses_direct_io(err: &std::io::Error) -> bool {
    err.raw_os_error() == Some(EINVAL)
}

/// An aligned block for the chunks that cannot go to the file straight from their memory:
/// `len` rounded up to [`ALIGN`], at least [`PAGED`] bytes so the block is whole pages. Not
/// to be had, or not aligned: refused like the file system refuses (buffered I/O follows).
fn staging(len: usize) -> std::io::Result<HostMemory> {
    let refused = || std::io::Error::from_raw_os_error(EINVAL);
    let block = HostMemory::allocate(len.next_multiple_of(ALIGN).max(PAGED)).map_err(|_| refused())?;
    if block.as_ptr().addr().is_multiple_of(ALIGN) { Ok(block) } else { Err(refused()) }
}

/// Whether `bytes` can be read or written with direct I/O where they are.
fn is_aligned(bytes: &[u8]) -> bool {
    bytes.as_ptr().addr().is_multiple_of(ALIGN) && bytes.len().is_multiple_of(ALIGN)
}

/// Writes `bytes` in [`CHUNK`]s of aligned I/O: straight from `bytes` where a chunk is
/// aligned, else through a staging block, padded with zeros to a multiple of [`ALIGN`].
fn write_direct(out: &mut File, bytes: &[u8]) -> std::io::Result<()> {
    let mut stage: Option<HostMemory> = None;
    for chunk in bytes.chunks(CHUNK) {
        if is_aligned(chunk) {
            out.write_all(chunk)?;
            continue;
        }
        let block = match &mut stage {
            Some(block) => block,
            None => stage.insert(staging(chunk.len())?),
        };
        let padded = chunk.len().next_multiple_of(ALIGN);
        let staged = &mut block.as_mut_slice()[..padded];
        staged[..chunk.len()].copy_from_slice(chunk);
        staged[chunk.len()..].fill(0);
        out.write_all(staged)?;
    }
    Ok(())
}

/// Reads what [`write_direct`] wrote into `out`, in the same chunks.
fn read_direct(file: &mut File, out: &mut [u8]) -> std::io::Result<()> {
    let mut stage: Option<HostMemory> = None;
    for chunk in out.chunks_mut(CHUNK) {
        if is_aligned(chunk) {
            file.read_exact(chunk)?;
            continue;
        }
        let block = match &mut stage {
            Some(block) => block,
            None => stage.insert(staging(chunk.len())?),
        };
        let padded = chunk.len().next_multiple_of(ALIGN);
        let staged = &mut block.as_mut_slice()[..padded];
        file.read_exact(staged)?;
        chunk.copy_from_slice(&staged[..chunk.len()]);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 4096) as u8).collect()
    }

    fn refusing(_: &Path, _: bool) -> std::io::Result<File> {
        Err(std::io::Error::from_raw_os_error(EINVAL))
    }

    /// Whether the spill directory's file system takes an aligned `O_DIRECT` write.
    fn directory_does_direct_io() -> bool {
        let (dir, own_dir) = spill_dir_and_owner();
        let probe = register(&dir).unwrap();
        let block = HostMemory::allocate(PAGED).unwrap();
        let done = open_direct(&probe, true).and_then(|mut file| file.write_all(&block.as_slice()[..ALIGN]));
        let _ = std::fs::remove_file(&probe);
        forget(&probe, own_dir);
        match done {
            Ok(()) => true,
            Err(err) if refuses_direct_io(&err) => false,
            Err(err) => panic!("probing direct I/O in {}: {err}", spill_dir().display()),
        }
    }

    /// Sizes around the alignment and the chunk, from memory aligned or not.
    #[test]
    fn direct_and_buffered_files_read_back_what_was_written() {
        let direct = directory_does_direct_io();
        for len in [1, 100, ALIGN, ALIGN + 1, 3 * ALIGN - 5, CHUNK, CHUNK + ALIGN + 12] {
            let bytes = pattern(len + 1);
            let mut block = HostMemory::allocate(CHUNK + 3 * ALIGN).unwrap();
            assert_eq!(block.as_ptr().addr() % ALIGN, 0, "a paged block is page-aligned");
            block.as_mut_slice()[..len].copy_from_slice(&bytes[..len]);
            // From the aligned block, and from one byte in (never aligned).
            for src in [&block.as_slice()[..len], &bytes[1..]] {
                for open in [Some(&open_direct as &Opener), None] {
                    let file = SpillFile::write_with(src, open).unwrap();
                    assert_eq!(file.is_direct(), open.is_some() && direct, "{len}");
                    let on_disk = std::fs::metadata(file.path()).unwrap().len() as usize;
                    let padded = if file.is_direct() { len.next_multiple_of(ALIGN) } else { len };
                    assert_eq!(on_disk, padded, "{len}");
                    let mut out = HostMemory::allocate(len).unwrap();
                    file.read_into(&mut out.as_mut_slice()[..len]).unwrap();
                    assert_eq!(&out.as_slice()[..len], src, "{len}");
                    // Into memory that is never aligned, too.
                    let mut unaligned = vec![0u8; len + 1];
                    file.read_into(&mut unaligned[1..]).unwrap();
                    assert_eq!(&unaligned[1..], src, "{len}");
                    let path = file.path().to_path_buf();
                    drop(file);
                    assert!(!path.exists(), "{len}: the file goes with its data");
                }
            }
        }
    }

    /// A file system that refuses `O_DIRECT` (as older tmpfs did) gets buffered I/O, at the
    /// write and at the read.
    #[test]
    fn a_refused_direct_open_falls_back_to_buffered_io() {
        let bytes = pattern(ALIGN + 17);
        let file = SpillFile::write_with(&bytes, Some(&refusing)).unwrap();
        assert!(!file.is_direct());
        assert_eq!(std::fs::metadata(file.path()).unwrap().len() as usize, bytes.len());
        let mut out = vec![0u8; bytes.len()];
        file.read_into(&mut out).unwrap();
        assert_eq!(out, bytes);
        if directory_does_direct_io() {
            // Written directly, then refused at the read: read buffered.
            let file = SpillFile::write_with(&bytes, Some(&open_direct)).unwrap();
            assert!(file.is_direct());
            let mut out = vec![0u8; bytes.len()];
            file.read_with(&mut out, &refusing).unwrap();
            assert_eq!(out, bytes);
        }
    }

    /// The process's own spill directory goes with its last file; one the user named stays.
    #[test]
    fn the_own_spill_directory_goes_with_its_last_file() {
        let base = std::env::temp_dir().join(format!("lazybuf-spill-dir-test-{}", std::process::id()));
        for own_dir in [true, false] {
            let dir = base.join(if own_dir { "own" } else { "named" });
            let (first, second) = (register(&dir).unwrap(), register(&dir).unwrap());
            for path in [&first, &second] {
                std::fs::write(path, b"data").unwrap();
            }
            std::fs::remove_file(&first).unwrap();
            forget(&first, own_dir);
            assert!(dir.exists(), "a live file is still in it");
            std::fs::remove_file(&second).unwrap();
            forget(&second, own_dir);
            assert_eq!(dir.exists(), !own_dir, "own: {own_dir}");
        }
        std::fs::remove_dir_all(&base).unwrap();
    }

    /// Any other failure is the clear error it was, and leaves no file behind.
    #[test]
    fn other_failures_are_errors_and_leave_no_file() {
        static MADE: Mutex<Option<PathBuf>> = Mutex::new(None);
        let full = |path: &Path, _: bool| -> std::io::Result<File> {
            File::create(path)?; // the partial file, as a failed write leaves it
            *MADE.lock().unwrap() = Some(path.to_path_buf());
            Err(std::io::Error::from_raw_os_error(28)) // ENOSPC, not a refusal of direct I/O
        };
        let err = SpillFile::write_with(&pattern(100), Some(&full)).unwrap_err().to_string();
        assert!(err.contains("could not create") && err.contains("keeps its host copy"), "{err}");
        let path = MADE.lock().unwrap().take().expect("the opener ran");
        assert!(!path.exists() && !live_files().lock().unwrap().contains_key(&path));
    }
}
