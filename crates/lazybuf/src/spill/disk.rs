//! The disk tier: spill files holding host copies that were the only current data of their
//! buffer, written when the host's memory limit needs room ([`super::set_host_memory_limit`]) and read
//! back at the buffer's next access.
//!
//! Files live in the spill directory: `LAZYBUF_SPILL_DIR`, else `lazybuf-spill-<pid>` under the
//! system's temporary directory, made at the first spill. Each file is written and read in
//! large chunks ([`CHUNK`]), and removed when its data is read back or its buffer goes (a file
//! of a process killed before that stays behind in the directory). A write that fails (a full
//! or unwritable disk) removes the partial file and returns a clear error: the buffer keeps its
//! host copy.
//!
//! What does not live here: choosing what to spill (`spill::eviction`), the buffer's side
//! ([`crate::RawBuffer::spill_host_to_disk`]).

use std::collections::HashSet;
use std::fs::File;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

use crate::error::{Error, Result};

/// The environment variable that names the spill directory.
pub const SPILL_DIR_ENV: &str = "LAZYBUF_SPILL_DIR";

/// The size of each write and read: large, and a multiple of every page and sector size.
pub const CHUNK: usize = 8 << 20;

/// The spill directory (see the module docs).
pub fn spill_dir() -> PathBuf {
    match std::env::var_os(SPILL_DIR_ENV) {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => std::env::temp_dir().join(format!("lazybuf-spill-{}", std::process::id())),
    }
}

/// The spill files this process has now.
fn live_files() -> &'static Mutex<HashSet<PathBuf>> {
    static LIVE: OnceLock<Mutex<HashSet<PathBuf>>> = OnceLock::new();
    LIVE.get_or_init(Mutex::default)
}

/// Removes every spill file this process still has (for an exit that drops no buffer: the
/// Python package calls it at interpreter exit). Buffers whose file is removed lose their
/// data, so call it only when none will be used again. Returns the files removed.
pub fn remove_spill_files() -> usize {
    let files: Vec<PathBuf> = live_files().lock().unwrap_or_else(PoisonError::into_inner).drain().collect();
    files.iter().filter(|path| std::fs::remove_file(path).is_ok()).count()
}

/// One buffer's bytes in a spill file, removed when dropped.
#[derive(Debug)]
pub struct SpillFile {
    path: PathBuf,
    len: usize,
}

impl SpillFile {
    /// Writes `bytes` to a new file in the spill directory.
    pub fn write(bytes: &[u8]) -> Result<SpillFile> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dir = spill_dir();
        let path = dir.join(format!("{}.bin", NEXT.fetch_add(1, Ordering::Relaxed)));
        let failed = |what: &str, err: std::io::Error| {
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
        std::fs::create_dir_all(&dir).map_err(|err| failed("create the directory of", err))?;
        live_files().lock().unwrap_or_else(PoisonError::into_inner).insert(path.clone());
        let file = SpillFile { path: path.clone(), len: bytes.len() };
        // From here the file is removed on failure (by dropping `file`).
        let mut out = File::create(&path).map_err(|err| failed("create", err))?;
        for chunk in bytes.chunks(CHUNK) {
            out.write_all(chunk).map_err(|err| failed("write", err))?;
        }
        out.sync_data().map_err(|err| failed("flush", err))?;
        Ok(file)
    }

    /// Reads the file's bytes into `out` (exactly as many as were written).
    pub fn read_into(&self, out: &mut [u8]) -> Result<()> {
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
        let mut file = File::open(&self.path).map_err(failed)?;
        for chunk in out.chunks_mut(CHUNK) {
            file.read_exact(chunk).map_err(failed)?;
        }
        Ok(())
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
        // Never panics: a file already gone (or a directory removed by hand) is fine.
        let _ = std::fs::remove_file(&self.path);
        live_files().lock().unwrap_or_else(PoisonError::into_inner).remove(&self.path);
    }
}
