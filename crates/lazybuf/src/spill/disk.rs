//! The disk tier: spill files holding host copies that were the only current data of their
//! buffer, written when the host's memory limit needs room ([`super::set_host_memory_limit`]) and read
//! back at the buffer's next access.
//!
//! Files live in the spill directory ([`spill_dir`]): `LAZYBUF_SPILL_DIR`, else lazybuf's own
//! directory under the system's temporary directory, both read once and made absolute (a
//! relative setting is resolved against the working directory of the first spill, so a later
//! `chdir` does not move it). lazybuf's own directory is `lazybuf-spill-<pid>`, made exclusively
//! with mode 0700 at the first spill and removed with its last file; where that name is taken
//! by anything but a private directory of this user (a link, someone else's or an open
//! directory) it makes `lazybuf-spill-<pid>-<random>` instead: it never writes into a directory
//! it did not make. Whether the directory is lazybuf's is recorded when it is made: a directory
//! the user named is never removed, whatever the environment says later. A file is
//! `<pid>-<n>.bin`, created exclusively with mode 0600, and removed only by the process that
//! wrote it: processes sharing a directory, and a forked
//! child with its parent's buffers, never remove or overwrite each other's files. Each file is
//! written and read in large chunks ([`CHUNK`]), and removed when its data is read back or its
//! buffer goes (a file of a process killed before that stays behind in the directory). A write
//! that fails (a full or unwritable disk) removes the partial file and returns a clear error:
//! the buffer keeps its host copy. A read that fails is an [`Error::Io`] and changes nothing;
//! a file is opened without following a link or waiting (`O_NOFOLLOW`, `O_NONBLOCK`) and
//! refused unless it is a regular file, so a FIFO or a device put in its place cannot block
//! the reading thread.
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
use std::sync::MutexGuard;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::backend::fork::ForkAwareMutex;
use crate::backend::fork::ForkAwareOnce;
use crate::error::{Error, Result, RuntimeCode};
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

/// The spill directory (see the module docs), an absolute path: the directory this process's
/// spill files are in, or go to next. `LAZYBUF_SPILL_DIR` (resolved against the working
/// directory of its first use) and the temporary directory are read once, at the first spill
/// (or the first call of this function); lazybuf's own directory is made at a spill, so until
/// then this is the name it tries first.
pub fn spill_dir() -> PathBuf {
    let unresolved = || match std::env::var_os(SPILL_DIR_ENV) {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => std::env::temp_dir().join(default_name()),
    };
    // A forked child without the disk tier's state: what the setting says, unresolved.
    let Some(mut disk) = disk() else { return unresolved() };
    if let Some(dir) = disk.own_dir() {
        return dir.to_path_buf();
    }
    match disk.place() {
        Ok(Place::Named(dir)) => dir,
        Ok(Place::Default(tmp)) => tmp.join(default_name()),
        // The working directory is gone: what the setting says, unresolved.
        Err(_) => unresolved(),
    }
}

/// Where spill files go, read once from the environment and made absolute.
#[derive(Clone, Debug, PartialEq)]
enum Place {
    /// `LAZYBUF_SPILL_DIR`: the user's directory, made if missing, never removed.
    Named(PathBuf),
    /// The system's temporary directory, in which lazybuf makes its own directory.
    Default(PathBuf),
}

/// The first name lazybuf tries for its own directory.
fn default_name() -> String {
    format!("lazybuf-spill-{}", std::process::id())
}

/// The disk tier's process-wide state, under one lock: taken to make a file and its directory,
/// and to forget a file and remove the directory once empty, so a directory being filled is
/// never removed.
#[derive(Debug, Default)]
struct Disk {
    /// The spill files this process knows, with the process that made each: a forked child
    /// inherits its parent's, which stay the parent's (the child reads them, never removes
    /// them).
    live: HashMap<PathBuf, u32>,
    /// Where files go, set at the first use.
    place: Option<Place>,
    /// The directory lazybuf made (absolute), and the process that made it: the only directory
    /// lazybuf ever removes, when its last file goes (it is made again at the next spill).
    /// Decided when it is made, never from the environment at removal.
    own: Option<(PathBuf, u32)>,
}

/// The disk tier's state; `None` in a forked child whose parent's thread held it at the fork
/// ([`ForkAwareMutex`]): that child writes no spill file (the write-back fails, the buffer keeps
/// its host copy) and forgets none.
fn disk() -> Option<MutexGuard<'static, Disk>> {
    static DISK: ForkAwareOnce<ForkAwareMutex<Disk>> = ForkAwareOnce::new();
    DISK.get_or_init(ForkAwareMutex::default).lock()
}

#[cfg(feature = "testing")]
/// Runs `f` while this thread holds the disk tier's state
/// ([`crate::testing::with_spill_locks_held`]).
pub(crate) fn with_locked<R>(f: impl FnOnce() -> R) -> R {
    let _held = disk();
    f()
}

impl Disk {
    /// Where files go: read from the environment and made absolute once (an error, not kept,
    /// when the working directory a relative setting needs is gone).
    fn place(&mut self) -> std::io::Result<Place> {
        if let Some(place) = &self.place {
            return Ok(place.clone());
        }
        let place = match std::env::var_os(SPILL_DIR_ENV) {
            Some(dir) if !dir.is_empty() => Place::Named(std::path::absolute(dir)?),
            _ => Place::Default(std::path::absolute(std::env::temp_dir())?),
        };
        self.place = Some(place.clone());
        Ok(place)
    }

    /// The directory this process made, while it exists (a forked child's is not its
    /// parent's).
    fn own_dir(&self) -> Option<&Path> {
        self.own.as_ref().filter(|(_, pid)| *pid == std::process::id()).map(|(dir, _)| dir.as_path())
    }

    /// The directory for a new file, made if needed, and whether it is lazybuf's own.
    fn directory(&mut self) -> std::io::Result<(PathBuf, bool)> {
        match self.place()? {
            Place::Named(dir) => {
                make_dir(&dir, true)?;
                Ok((dir, false))
            }
            Place::Default(tmp) => {
                if let Some(dir) = self.own_dir() {
                    return Ok((dir.to_path_buf(), true));
                }
                let dir = make_own_dir(&tmp)?;
                self.own = Some((dir.clone(), std::process::id()));
                Ok((dir, true))
            }
        }
    }

    /// Makes a new file in the spill directory (made first if needed), `<pid>-<n>.bin`, with
    /// `O_EXCL` (a file of another process, or one a killed process of the same pid left
    /// behind, is never taken over: the next number is tried) and mode 0600, and registers it
    /// as live. Returns its path.
    fn register(&mut self) -> std::io::Result<PathBuf> {
        let pid = std::process::id();
        let mut made_again = false;
        loop {
            let (dir, own) = self.directory()?;
            match new_file(&dir, pid) {
                Ok(path) => {
                    self.live.insert(path.clone(), pid);
                    SPILLED_IN.store(pid, Ordering::Relaxed);
                    return Ok(path);
                }
                // lazybuf's own directory was removed behind its back: made again, once.
                Err(err) if own && !made_again && err.kind() == std::io::ErrorKind::NotFound => {
                    self.own = None;
                    made_again = true;
                }
                Err(err) => return Err(err),
            }
        }
    }

    /// Unregisters `path` (its file is gone); removes the directory this process made when no
    /// live file is left in it. Never panics.
    fn forget(&mut self, path: &Path) {
        self.live.remove(path);
        let Some(dir) = self.own_dir() else { return };
        if path.parent() != Some(dir) || self.live.keys().any(|p| p.parent() == Some(dir)) {
            return;
        }
        match std::fs::remove_dir(dir) {
            Ok(()) => self.own = None,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => self.own = None,
            // Something else is in it: it stays, lazybuf's own.
            Err(_) => {}
        }
    }
}

/// Makes `dir` (mode 0700 on Unix), with its missing parents when `parents`.
fn make_dir(dir: &Path, parents: bool) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(parents);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)
}

/// Makes lazybuf's own directory in `tmp`: `lazybuf-spill-<pid>`, made exclusively, mode 0700.
/// A name that is taken is used only if it is a directory (not a link) of this user with mode
/// 0700 (one a killed process of the same pid left); otherwise `lazybuf-spill-<pid>-<random>`
/// is made instead, so lazybuf never writes into a directory someone else made or can enter.
fn make_own_dir(tmp: &Path) -> std::io::Result<PathBuf> {
    const TRIES: usize = 16;
    let mut taken = Vec::new();
    for attempt in 0..TRIES {
        let name = match attempt {
            0 => default_name(),
            _ => format!("{}-{:016x}", default_name(), random()),
        };
        let dir = tmp.join(name);
        match make_dir(&dir, false) {
            Ok(()) => return Ok(dir),
            Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {
                if is_private_dir(&dir) {
                    return Ok(dir);
                }
                taken.push(dir);
            }
            Err(err) => return Err(err),
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AlreadyExists,
        format!(
            "{TRIES} names for lazybuf's own directory were taken by something not this user's \
             private directory ({}, ...)",
            taken[0].display()
        ),
    ))
}

/// Whether `dir` is a directory (not a link to one) of this process's user, mode 0700.
#[cfg(unix)]
fn is_private_dir(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: `geteuid` takes no argument, touches no memory and cannot fail.
    let uid = unsafe { libc::geteuid() };
    std::fs::symlink_metadata(dir)
        .is_ok_and(|meta| meta.file_type().is_dir() && meta.uid() == uid && meta.mode() & 0o7777 == 0o700)
}

/// Elsewhere a name that is taken is never used.
#[cfg(not(unix))]
fn is_private_dir(_: &Path) -> bool {
    false
}

/// A number another process cannot guess (the standard library's random hash keys).
fn random() -> u64 {
    use std::hash::BuildHasher;
    static CALLS: AtomicU64 = AtomicU64::new(0);
    std::collections::hash_map::RandomState::new().hash_one(CALLS.fetch_add(1, Ordering::Relaxed))
}

/// Makes a new file `<pid>-<n>.bin` in `dir`, exclusively, mode 0600 on Unix (see
/// [`Disk::register`]).
fn new_file(dir: &Path, pid: u32) -> std::io::Result<PathBuf> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let mut attempts = 0;
    loop {
        let path = dir.join(format!("{pid}-{}.bin", NEXT.fetch_add(1, Ordering::Relaxed)));
        let mut options = OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        match options.open(&path) {
            Ok(_) => return Ok(path),
            Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists && attempts < 1000 => attempts += 1,
            Err(err) => return Err(err),
        }
    }
}

/// Whether spill files try direct I/O ([`SPILL_DIRECT_IO_ENV`]; Linux only).
fn direct_io_wanted() -> bool {
    let off = crate::env::switch(SPILL_DIRECT_IO_ENV)
        .is_some_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "0" | "off" | "false"));
    cfg!(target_os = "linux") && !off
}

/// The last process that made a spill file (0: none yet). A forked child inherits its
/// parent's pid here until it spills itself.
static SPILLED_IN: AtomicU32 = AtomicU32::new(0);

/// Removes every spill file this process made and still has (for an exit that drops no
/// buffer: the Python package calls it at interpreter exit, and at the end of every
/// `multiprocessing` child), and the directory lazybuf made once it is empty (never one the
/// user named, whatever the environment says now). Buffers whose file is removed lose their
/// data, so call it only when none will be used again. A forked child's call leaves its
/// parent's files alone, and one that never spilled returns at once without taking the disk
/// tier's lock (which a thread of the parent may have held at the fork, never to release it
/// in the child). Returns the files removed.
pub fn remove_spill_files() -> usize {
    let pid = std::process::id();
    if SPILLED_IN.load(Ordering::Relaxed) != pid {
        return 0;
    }
    let Some(mut disk) = disk() else { return 0 };
    let files: Vec<PathBuf> =
        disk.live.iter().filter(|&(_, &owner)| owner == pid).map(|(path, _)| path.clone()).collect();
    files
        .iter()
        .filter(|path| {
            let removed = std::fs::remove_file(path).is_ok();
            disk.forget(path);
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
        // An I/O failure, as a read-back's is: the operating system's code inside (a full disk
        // is `ENOSPC`, Python's `OSError` with that `errno`).
        let failed = |what: &str, path: &Path, err: std::io::Error| Error::Io {
            operation: "spill to disk",
            reason: format!(
                "could not {what} {} ({} bytes): {err}; the buffer keeps its host copy \
                 (set {SPILL_DIR_ENV} to a writable directory with room, or raise the host memory limit)",
                path.display(),
                bytes.len()
            ),
            code: err.raw_os_error().map(RuntimeCode::Os),
        };
        let registered = match disk() {
            Some(mut disk) => disk.register(),
            None => Err(std::io::Error::other(
                "the disk tier was in use by another thread when this process was forked",
            )),
        };
        let path =
            registered.map_err(|err| failed("create the directory or a new file in", &spill_dir(), err))?;
        let failed = |what: &str, err: std::io::Error| failed(what, &path, err);
        let owner = std::process::id();
        let mut file = SpillFile { path: path.clone(), len: bytes.len(), direct: false, owner };
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
        let mut out = open_spill_file(OpenOptions::new().write(true).create(true).truncate(true), &path, 0)
            .map_err(|err| failed("create", err))?;
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
    ///
    /// A failure is [`Error::Io`] (an I/O failure: the file is missing, unreadable, short, or
    /// no longer a regular file) and changes nothing: the buffer keeps its state and still
    /// expects its data in the file, so the next access tries again. Something put in the
    /// file's place (a FIFO, a device, a directory, a symbolic link) is refused at once,
    /// never waited on or followed.
    fn read_with(&self, out: &mut [u8], open_direct: &Opener) -> Result<()> {
        let failed = |err: std::io::Error| Error::Io {
            operation: "read back from disk",
            reason: format!(
                "could not read spill file {} ({} bytes): {err}; the buffer is unchanged (its data \
                 is in that file only, and its next access reads the file again)",
                self.path.display(),
                self.len
            ),
            code: err.raw_os_error().map(RuntimeCode::Os),
        };
        if out.len() != self.len {
            return Err(Error::LengthMismatch {
                operation: "read back from disk",
                expected: self.len,
                actual: out.len(),
                unit: "bytes",
            });
        }
        if self.direct {
            let opened = open_direct(&self.path, false).and_then(|file| at_least(file, self.len));
            match opened.and_then(|mut file| read_direct(&mut file, out)) {
                Ok(()) => return Ok(()),
                // Refused after all (the directory is on another file system now?): buffered.
                Err(err) if refuses_direct_io(&err) => {}
                Err(err) => return Err(failed(err)),
            }
        }
        let mut file = open_spill_file(OpenOptions::new().read(true), &self.path, 0)
            .and_then(|file| at_least(file, self.len))
            .map_err(failed)?;
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
        if let Some(mut disk) = disk() {
            disk.forget(&self.path);
        }
    }
}

/// Opens `path` with `O_DIRECT`: a new file to write (`create`) or one to read, as
/// [`open_spill_file`] does. Elsewhere than on Linux the open is refused as unsupported.
fn open_direct(path: &Path, create: bool) -> std::io::Result<File> {
    let mut options = OpenOptions::new();
    if create {
        options.write(true).create(true).truncate(true);
    } else {
        options.read(true);
    }
    #[cfg(target_os = "linux")]
    {
        open_spill_file(&options, path, libc::O_DIRECT)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (options, path);
        Err(std::io::Error::from_raw_os_error(EINVAL))
    }
}

/// Opens a spill file with `options` (and the `open` flags `flags`), never following a
/// symbolic link put in its place and never waiting (a FIFO put there would block the open,
/// and every read, forever: `O_NONBLOCK`, cleared again once the file is known to be
/// regular), and refuses anything that is not a regular file: a spill file is only ever
/// one, so something else there was put in its place after lazybuf wrote it.
fn open_spill_file(options: &OpenOptions, path: &Path, flags: i32) -> std::io::Result<File> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        let mut options = options.clone();
        options.custom_flags(flags | libc::O_NOFOLLOW | libc::O_NONBLOCK);
        let file = options.open(path).map_err(|err| match err.raw_os_error() {
            // What O_NOFOLLOW answers for a link (Linux ELOOP; some BSDs EMLINK).
            Some(code) if code == libc::ELOOP || code == libc::EMLINK => not_regular("a symbolic link"),
            _ => err,
        })?;
        let kind = file.metadata()?.file_type();
        if !kind.is_file() {
            return Err(not_regular(file_kind(kind)));
        }
        blocking(&file)?;
        Ok(file)
    }
    #[cfg(not(unix))]
    {
        let _ = flags;
        let file = options.open(path)?;
        if !file.metadata()?.is_file() {
            return Err(not_regular("not a file"));
        }
        Ok(file)
    }
}

/// The error for something other than a regular file where a spill file should be.
fn not_regular(kind: &str) -> std::io::Error {
    std::io::Error::other(format!("expected the regular file lazybuf wrote, found {kind} in its place"))
}

/// What kind of file `kind` is, in words (for [`not_regular`]).
#[cfg(unix)]
fn file_kind(kind: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_dir() {
        "a directory"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_symlink() {
        "a symbolic link"
    } else {
        "something other than a regular file"
    }
}

/// Clears `O_NONBLOCK` on `file` (opened with it so that nothing could make the open wait).
#[cfg(unix)]
fn blocking(file: &File) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    // SAFETY: `fd` is the open descriptor `file` owns for this whole call; F_GETFL reads its
    // status flags and touches no memory.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: as above; F_SETFL only changes the descriptor's status flags.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// `file` if it holds at least `len` bytes (a direct file may hold up to [`ALIGN`] - 1 more),
/// else an error that says it was cut short.
fn at_least(file: File, len: usize) -> std::io::Result<File> {
    let size = file.metadata()?.len();
    if size < len as u64 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!(
                "expected at least {len} bytes in it, found {size}: it was cut short after lazybuf wrote it"
            ),
        ));
    }
    Ok(file)
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
    use std::sync::Mutex;

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 4096) as u8).collect()
    }

    fn refusing(_: &Path, _: bool) -> std::io::Result<File> {
        Err(std::io::Error::from_raw_os_error(EINVAL))
    }

    /// Whether the spill directory's file system takes an aligned `O_DIRECT` write.
    fn directory_does_direct_io() -> bool {
        let probe = disk().unwrap().register().unwrap();
        let block = HostMemory::allocate(PAGED).unwrap();
        let done = open_direct(&probe, true).and_then(|mut file| file.write_all(&block.as_slice()[..ALIGN]));
        let _ = std::fs::remove_file(&probe);
        disk().unwrap().forget(&probe);
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

    /// The process's own spill directory goes with its last file (and is made again, as
    /// when something removed it); one the user named stays.
    #[test]
    fn the_own_spill_directory_goes_with_its_last_file() {
        let base = std::env::temp_dir().join(format!("lazybuf-spill-dir-test-{}", std::process::id()));
        std::fs::create_dir_all(&base).unwrap();
        let named = base.join("named");
        for place in [Place::Default(base.clone()), Place::Named(named.clone())] {
            let own = matches!(place, Place::Default(_));
            let mut disk = Disk { place: Some(place), ..Disk::default() };
            let (first, second) = (disk.register().unwrap(), disk.register().unwrap());
            let dir = first.parent().unwrap().to_path_buf();
            assert_eq!(dir, if own { base.join(default_name()) } else { named.clone() });
            assert_eq!(second.parent(), Some(dir.as_path()));
            std::fs::remove_file(&first).unwrap();
            disk.forget(&first);
            assert!(dir.exists(), "a live file is still in it");
            std::fs::remove_file(&second).unwrap();
            disk.forget(&second);
            assert_eq!(dir.exists(), !own, "own: {own}");
            if own {
                // Made again at the next file; and again when removed behind lazybuf's back.
                let third = disk.register().unwrap();
                std::fs::remove_file(&third).unwrap();
                std::fs::remove_dir(&dir).unwrap();
                disk.forget(&third);
                let fourth = disk.register().unwrap();
                assert_eq!(fourth.parent(), Some(dir.as_path()));
                std::fs::remove_file(&fourth).unwrap();
                disk.forget(&fourth);
                assert!(!dir.exists());
            }
        }
        std::fs::remove_dir_all(&base).unwrap();
    }

    /// lazybuf's own directory is made 0700 and its files 0600; a default name that is taken
    /// is used only when it is a private directory of this user (not a link, not readable by
    /// others, not someone else's), else another name is made.
    #[test]
    #[cfg(unix)]
    fn a_taken_default_name_is_used_only_when_it_is_a_private_directory_of_this_user() {
        use std::os::unix::fs::{PermissionsExt, symlink};
        let mode = |path: &Path| std::fs::symlink_metadata(path).unwrap().permissions().mode() & 0o7777;
        let base = std::env::temp_dir().join(format!("lazybuf-spill-taken-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let foreign = base.join("foreign");
        std::fs::create_dir_all(&foreign).unwrap();
        let predicted = base.join(default_name());
        let link = |_: &Path| symlink(&foreign, &predicted);
        let open = |path: &Path| {
            std::fs::create_dir(path)?;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
        };
        let private = |path: &Path| {
            std::fs::create_dir(path)?;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))
        };
        // SAFETY: `geteuid` takes no argument, touches no memory and cannot fail.
        let root = unsafe { libc::geteuid() } == 0;
        let others = |path: &Path| {
            private(path)?;
            std::os::unix::fs::chown(path, Some(65534), Some(65534))
        };
        type Taker<'a> = &'a dyn Fn(&Path) -> std::io::Result<()>;
        let mut cases: Vec<(&str, Option<Taker>, bool)> =
            vec![("free", None, true), ("a link", Some(&link), false), ("0755", Some(&open), false)];
        cases.push(("private", Some(&private), true));
        if root {
            cases.push(("another user's", Some(&others), false));
        }
        for (what, take, reused) in cases {
            if let Some(take) = take {
                take(&predicted).unwrap();
            }
            let mut disk = Disk { place: Some(Place::Default(base.clone())), ..Disk::default() };
            let file = disk.register().unwrap();
            let dir = file.parent().unwrap().to_path_buf();
            assert_eq!(dir == predicted, reused, "{what}: {}", dir.display());
            assert!(
                dir.parent() == Some(base.as_path()) && std::fs::symlink_metadata(&dir).unwrap().is_dir()
            );
            assert_eq!((mode(&dir), mode(&file)), (0o700, 0o600), "{what}");
            assert!(std::fs::read_dir(&foreign).unwrap().next().is_none(), "{what}");
            std::fs::remove_file(&file).unwrap();
            disk.forget(&file);
            assert!(!dir.exists(), "{what}: lazybuf's own directory goes with its last file");
            // What took the name stays (a reused private one went as lazybuf's own).
            if take.is_some() && !reused {
                assert!(std::fs::symlink_metadata(&predicted).is_ok(), "{what}");
                match std::fs::symlink_metadata(&predicted).unwrap().is_dir() {
                    true => std::fs::remove_dir(&predicted).unwrap(),
                    false => std::fs::remove_file(&predicted).unwrap(),
                }
            }
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
        let err = SpillFile::write_with(&pattern(100), Some(&full)).unwrap_err();
        assert!(matches!(err, Error::Io { code: Some(RuntimeCode::Os(28)), .. }), "{err:?}");
        assert!(!err.is_retryable(), "a full disk stays full: {err}");
        let err = err.to_string();
        assert!(err.contains("could not create") && err.contains("keeps its host copy"), "{err}");
        let path = MADE.lock().unwrap().take().expect("the opener ran");
        assert!(!path.exists() && !disk().unwrap().live.contains_key(&path));
    }
}
