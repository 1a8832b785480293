//! The crate's one error type.
//!
//! Every fallible call in lazybuf returns [`Result<T>`]. Runtime failures keep the runtime's
//! own code ([`RuntimeCode`]) so nothing is lost on the way up, and [`Error::is_retryable`]
//! says whether trying again (after freeing memory, say) can help.
//!
//! This module knows no runtime: each backend names its own codes (the name table and which
//! codes a retry can cure live in its folder) and hands them here ready-made.
//!
//! What does not live here: conversions to Python exceptions (the `lazybuf-py` crate).

use std::fmt;

/// Which runtime a device belongs to. Each backend folder defines its constant
/// (`BackendKind::HOST` in `backend/host`, `BackendKind::CUDA` in `backend/cuda`, ...).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BackendKind {
    name: &'static str,
    title: &'static str,
}

impl BackendKind {
    /// A kind with its selector name (`"opencl"`) and its display title (`"OpenCL"`).
    pub const fn new(name: &'static str, title: &'static str) -> BackendKind {
        BackendKind { name, title }
    }

    /// The lower-case name used in device selectors (`LAZYBUF_DEVICE=opencl:0`).
    pub const fn name(self) -> &'static str {
        self.name
    }

    /// The runtime's own spelling (`"OpenCL"`, `"CUDA"`).
    pub const fn title(self) -> &'static str {
        self.title
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}

impl fmt::Debug for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.title)
    }
}

/// The runtime's own status code, kept as the runtime reported it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RuntimeCode {
    /// A device runtime's status (a `cl_int`, a `CUresult`), with its symbolic name and
    /// whether the runtime documents it as recoverable by freeing resources and retrying.
    Device {
        /// The runtime that reported it.
        backend: BackendKind,
        /// The status as the runtime returned it.
        value: i64,
        /// Its name in the runtime's headers (`"CL_OUT_OF_RESOURCES"`).
        name: &'static str,
        /// Whether retrying (after freeing memory) can succeed.
        retryable: bool,
    },
    /// An operating-system `errno`.
    Os(i32),
}

impl RuntimeCode {
    /// The status value (`errno` for the operating system).
    pub fn value(&self) -> i64 {
        match *self {
            RuntimeCode::Device { value, .. } => value,
            RuntimeCode::Os(code) => code.into(),
        }
    }

    fn retryable(&self) -> bool {
        match *self {
            RuntimeCode::Device { retryable, .. } => retryable,
            RuntimeCode::Os(code) => code == libc::ENOMEM || code == libc::EAGAIN,
        }
    }
}

impl fmt::Display for RuntimeCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RuntimeCode::Device { backend, value, name, .. } => {
                write!(f, "{} status {value} ({name})", backend.title())
            }
            RuntimeCode::Os(code) => write!(f, "{}", std::io::Error::from_raw_os_error(*code)),
        }
    }
}

/// Everything that can go wrong in lazybuf.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A shape whose element count or byte size does not fit in memory addresses.
    #[error("invalid shape {dims:?}: {reason}")]
    InvalidShape {
        /// The dimensions as given.
        dims: Vec<usize>,
        /// What was wrong, and what was expected.
        reason: String,
    },
    /// A copy whose source and destination lengths differ, or a length beyond the memory.
    #[error("length mismatch in {operation}: expected {expected} {unit}, got {actual}")]
    LengthMismatch {
        /// The operation that was called.
        operation: &'static str,
        /// The buffer's (or the memory's) length.
        expected: usize,
        /// The length that was passed.
        actual: usize,
        /// What both lengths count: `"elements"` or `"bytes"`.
        unit: &'static str,
    },
    /// An argument outside what the call accepts.
    #[error("invalid argument for {operation}: {reason}")]
    InvalidArgument {
        /// The operation that was called.
        operation: &'static str,
        /// What was wrong, and what was expected.
        reason: String,
    },
    /// The device (or the host) could not provide the memory.
    #[error(
        "out of memory on {device}: could not allocate {requested} bytes{}{}",
        human_size(*.requested),
        code_suffix(.code)
    )]
    OutOfMemory {
        /// The device's name.
        device: String,
        /// The size of the request in bytes.
        requested: usize,
        /// The runtime's code, where the runtime gave one.
        code: Option<RuntimeCode>,
    },
    /// A runtime call failed for a reason other than memory.
    #[error("{} call {call} failed: {code}", .backend.title())]
    Runtime {
        /// The backend that failed.
        backend: BackendKind,
        /// The runtime function (or lazybuf operation) that failed.
        call: &'static str,
        /// The runtime's status.
        code: RuntimeCode,
    },
    /// The backend's runtime is not installed or has no usable device.
    #[error("{} is not available: {reason}", .backend.title())]
    BackendUnavailable {
        /// The backend that was asked for.
        backend: BackendKind,
        /// Why it cannot be used.
        reason: String,
    },
    /// A device selector that names no device, or is malformed.
    #[error("no device matches {selector:?}: {reason}")]
    DeviceNotFound {
        /// The selector as given.
        selector: String,
        /// What was expected, and which devices exist.
        reason: String,
    },
    /// Host memory that must be page-locked could not be.
    #[error("could not pin {requested} bytes of host memory: {reason}")]
    PinningFailed {
        /// The size of the request in bytes.
        requested: usize,
        /// Why (the runtime's words, or the mlock limit).
        reason: String,
    },
    /// The coherence checker ([`mod@crate::checking`]) found a device copy that differs from the
    /// host copy of a buffer both are supposed to hold: something wrote the device copy
    /// without saying so.
    #[error(
        "coherence check failed on {device}: the buffer is SYNCHRONIZED, but its device copy \
         differs from the host copy at byte {first_difference} of {nbytes}: the device copy was \
         written (by a kernel?) after it was handed out as a read. Call mark_device_dirty() after \
         such a write, or take the device copy for writing (device_mut() in Rust, \
         .device_writable in Python). (In Python, a write through a .host array taken before the \
         last sync has the same effect from the host side: take .host again after syncing.)"
    )]
    Coherence {
        /// The device whose copy differs.
        device: String,
        /// The first byte that differs.
        first_difference: usize,
        /// The buffer's size in bytes.
        nbytes: usize,
    },
    /// A callback of the caller's failed (the callback of a
    /// [`crate::resource::FailureCallbackResource`]); `payload` carries the callback's own
    /// error for bindings to raise again (a Python exception). Also what a panic of code
    /// outside lazybuf on a path that must not unwind (a resource's `deallocate` while a buffer
    /// is dropped) is recorded as, among the device's deferred errors; `payload` is then the
    /// panic's message (a `String`).
    #[error("{operation}: the callback failed: {message}")]
    Callback {
        /// The operation that called the callback.
        operation: &'static str,
        /// The callback's error, in words.
        message: String,
        /// The callback's error itself.
        payload: CallbackPayload,
    },
    /// A device whose runtime does not survive `fork` (OpenCL, CUDA, wgpu) was used in a
    /// child process made by `fork` after the parent had opened it: its runtime's threads do
    /// not exist in the child, so any call would hang. Not retryable: use the device in the
    /// parent, or start worker processes with `spawn` (or `forkserver`) instead of `fork`.
    #[error(
        "{device} ({}) was initialised in the parent process; a forked child cannot use it: use \
         the 'spawn' start method (multiprocessing.set_start_method('spawn')) or use the device \
         only in the parent",
        .backend.title()
    )]
    ForkedChild {
        /// The device's name.
        device: String,
        /// Its backend.
        backend: BackendKind,
    },
    /// The transfer guard ([`crate::observe::guard`]) refused a copy between memories; the
    /// call changed nothing. Not retryable: allow the transfer (or make it explicit) first.
    #[error(
        "transfer guard refused a {direction} copy of {bytes} bytes ({from} -> {to}) of buffer \
         {buffer}, caused by {} {call}; the {} guard is '{level}' ({})",
        if *.explicit { "explicit" } else { "implicit" },
        .direction.name(),
        .level.meaning()
    )]
    TransferGuard {
        /// The buffer's id ([`crate::RawBuffer::id`]).
        buffer: u64,
        /// Which way the copy would go.
        direction: crate::observe::kinds::Direction,
        /// The bytes it would move.
        bytes: usize,
        /// Where from: `host` or the device's name.
        from: String,
        /// Where to.
        to: String,
        /// The call that caused it (`"sync_to_device"`, `"host"`).
        call: &'static str,
        /// Whether the call asked for the copy itself (an explicit transfer).
        explicit: bool,
        /// The guard level that refused it.
        level: crate::observe::kinds::GuardLevel,
    },
    /// Making room on a device (for a memory limit, or after the runtime reported
    /// out-of-memory) needed a buffer's device copy written back to the host first, and that
    /// write-back failed. The evicted buffer kept its copy, its state and every byte; `source`
    /// is the write-back's own error (a runtime's status, an injected fault, the transfer
    /// guard's refusal), and [`Error::is_out_of_memory`] and [`Error::is_retryable`] answer as
    /// it does. [`Error::root_cause`] reaches it.
    #[error(
        "making room on {device}{}: writing back buffer #{buffer} ({bytes} bytes) failed: {source}",
        requested_suffix(.requested)
    )]
    WriteBack {
        /// The device whose memory was needed.
        device: String,
        /// The bytes the allocation that needed the room asked for (`None` for an eviction
        /// called directly, [`crate::RawBuffer::evict_device_copy`]).
        requested: Option<usize>,
        /// The evicted buffer's id ([`crate::RawBuffer::id`]).
        buffer: u64,
        /// The bytes the write-back had to move.
        bytes: usize,
        /// The write-back's own error.
        source: std::sync::Arc<Error>,
    },
    /// A file lazybuf keeps itself (a spill file, [`crate::spill::disk`]) could not be read:
    /// an I/O failure, not a bad argument. `reason` names the file, what failed and what
    /// became of the data; `code` is the operating system's error where it gave one, and
    /// [`Error::is_retryable`] answers as it does (out of memory, `EAGAIN`), never for a
    /// missing or replaced file.
    #[error("{operation} failed: {reason}")]
    Io {
        /// What lazybuf was doing (`"read back from disk"`).
        operation: &'static str,
        /// The file, what failed, and what became of the data.
        reason: String,
        /// The operating system's error, where there was one.
        code: Option<RuntimeCode>,
    },
    /// A fault injected by `lazybuf::testing::FaultyDevice` (feature `testing`).
    #[cfg(feature = "testing")]
    #[error("injected fault: {operation} number {count} was told to fail")]
    InjectedFault {
        /// The kind of operation that failed.
        operation: &'static str,
        /// Its number, counted from 1.
        count: u64,
    },
}

/// A callback's own error, carried through [`Error::Callback`] unchanged.
#[derive(Clone)]
pub struct CallbackPayload(pub std::sync::Arc<dyn std::any::Any + Send + Sync>);

impl fmt::Debug for CallbackPayload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CallbackPayload(..)")
    }
}

/// ` (1.5 MiB)` for sizes of 1 KiB and more, so people need not count digits; the exact count
/// stays in front of it.
fn human_size(bytes: usize) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return String::new();
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    let digits = if value < 10.0 { 1 } else { 0 };
    format!(" ({value:.digits$} {})", UNITS[unit])
}

fn requested_suffix(requested: &Option<usize>) -> String {
    match requested {
        Some(bytes) => format!(" for {bytes} bytes"),
        None => String::new(),
    }
}

fn code_suffix(code: &Option<RuntimeCode>) -> String {
    match code {
        Some(code) => format!(" ({code})"),
        None => String::new(),
    }
}

impl Error {
    /// Whether repeating the call can succeed: true for out-of-memory (after memory is
    /// freed), runtime statuses their runtime calls recoverable, file errors the system calls
    /// temporary ([`Error::Io`] with `ENOMEM` or `EAGAIN`) and injected faults; false for bad
    /// input, missing runtimes, missing or replaced files, coherence violations and devices used in a forked
    /// child ([`Error::ForkedChild`]: it will not work in that process, however often tried).
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::WriteBack { source, .. } => source.is_retryable(),
            Error::OutOfMemory { .. } => true,
            Error::Runtime { code, .. } => code.retryable(),
            Error::Io { code, .. } => code.is_some_and(|code| code.retryable()),
            #[cfg(feature = "testing")]
            Error::InjectedFault { .. } => true,
            _ => false,
        }
    }

    /// Whether the error is an out-of-memory condition (the pool trims and retries on it).
    pub fn is_out_of_memory(&self) -> bool {
        match self {
            Error::WriteBack { source, .. } => source.is_out_of_memory(),
            other => matches!(other, Error::OutOfMemory { .. }),
        }
    }

    /// The error under any context lazybuf wrapped around it ([`Error::WriteBack`]'s
    /// `source`); the error itself when it wraps none.
    pub fn root_cause(&self) -> &Error {
        match self {
            Error::WriteBack { source, .. } => source.root_cause(),
            other => other,
        }
    }

    pub(crate) fn invalid(operation: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidArgument { operation, reason: reason.into() }
    }
}

/// lazybuf's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    const TEST: BackendKind = BackendKind::new("test", "Test");

    #[test]
    fn out_of_memory_gives_the_exact_count_and_a_size_people_read() {
        let oom = |requested| Error::OutOfMemory { device: "d".into(), requested, code: None }.to_string();
        assert_eq!(oom(1000), "out of memory on d: could not allocate 1000 bytes");
        assert_eq!(oom(1536), "out of memory on d: could not allocate 1536 bytes (1.5 KiB)");
        assert_eq!(oom(64 << 20), "out of memory on d: could not allocate 67108864 bytes (64 MiB)");
        assert_eq!(oom(1 << 46), "out of memory on d: could not allocate 70368744177664 bytes (64 TiB)");
        assert!(oom(usize::MAX).ends_with("(16 EiB)"), "{}", oom(usize::MAX));
    }

    #[test]
    fn runtime_codes_say_what_they_are_and_whether_a_retry_helps() {
        let code =
            RuntimeCode::Device { backend: TEST, value: -5, name: "OUT_OF_RESOURCES", retryable: true };
        let err = Error::Runtime { backend: TEST, call: "testEnqueue", code };
        assert_eq!(err.to_string(), "Test call testEnqueue failed: Test status -5 (OUT_OF_RESOURCES)");
        assert!(err.is_retryable());
        let hard =
            RuntimeCode::Device { backend: TEST, value: -38, name: "INVALID_MEM_OBJECT", retryable: false };
        assert!(!Error::Runtime { backend: TEST, call: "x", code: hard }.is_retryable());
        assert!(
            Error::Runtime { backend: TEST, call: "mmap", code: RuntimeCode::Os(libc::ENOMEM) }
                .is_retryable()
        );
    }
}
