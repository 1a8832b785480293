//! The crate's one error type.
//!
//! Every fallible call in lazybuf returns [`Result<T>`]. Runtime failures keep the runtime's
//! own code ([`RuntimeCode`]) so nothing is lost on the way up, and [`Error::is_retryable`]
//! says whether trying again (after freeing memory, say) can help.
//!
//! What does not live here: conversions to Python exceptions (the `lazybuf-py` crate).

use std::fmt;

/// Which runtime a device belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BackendKind {
    /// Host memory, no runtime at all.
    Host,
    /// An OpenCL device (cl3, libOpenCL loaded at run time).
    OpenCl,
    /// A CUDA device (cudarc driver API, libcuda loaded at run time).
    Cuda,
}

impl BackendKind {
    /// The lower-case name used in device selectors (`LAZYBUF_DEVICE=opencl:0`).
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Host => "host",
            BackendKind::OpenCl => "opencl",
            BackendKind::Cuda => "cuda",
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The runtime's own status code, kept as the runtime reported it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuntimeCode {
    /// An OpenCL `cl_int` status (negative on error).
    OpenCl(i32),
    /// A CUDA driver `CUresult`.
    Cuda(u32),
    /// An operating-system `errno`.
    Os(i32),
}

impl fmt::Display for RuntimeCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RuntimeCode::OpenCl(code) => {
                write!(f, "OpenCL status {code} ({})", opencl_code_name(*code))
            }
            RuntimeCode::Cuda(code) => write!(f, "CUDA status {code} ({})", cuda_code_name(*code)),
            RuntimeCode::Os(code) => write!(f, "{}", std::io::Error::from_raw_os_error(*code)),
        }
    }
}

fn opencl_code_name(code: i32) -> &'static str {
    match code {
        -1 => "CL_DEVICE_NOT_FOUND",
        -2 => "CL_DEVICE_NOT_AVAILABLE",
        -4 => "CL_MEM_OBJECT_ALLOCATION_FAILURE",
        -5 => "CL_OUT_OF_RESOURCES",
        -6 => "CL_OUT_OF_HOST_MEMORY",
        -30 => "CL_INVALID_VALUE",
        -34 => "CL_INVALID_CONTEXT",
        -36 => "CL_INVALID_COMMAND_QUEUE",
        -38 => "CL_INVALID_MEM_OBJECT",
        -61 => "CL_INVALID_BUFFER_SIZE",
        -1001 => "CL_PLATFORM_NOT_FOUND_KHR",
        _ => "see the OpenCL headers",
    }
}

fn cuda_code_name(code: u32) -> &'static str {
    match code {
        1 => "CUDA_ERROR_INVALID_VALUE",
        2 => "CUDA_ERROR_OUT_OF_MEMORY",
        3 => "CUDA_ERROR_NOT_INITIALIZED",
        4 => "CUDA_ERROR_DEINITIALIZED",
        100 => "CUDA_ERROR_NO_DEVICE",
        101 => "CUDA_ERROR_INVALID_DEVICE",
        201 => "CUDA_ERROR_INVALID_CONTEXT",
        217 => "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
        400 => "CUDA_ERROR_INVALID_HANDLE",
        700 => "CUDA_ERROR_ILLEGAL_ADDRESS",
        719 => "CUDA_ERROR_LAUNCH_FAILED",
        801 => "CUDA_ERROR_NOT_SUPPORTED",
        999 => "CUDA_ERROR_UNKNOWN",
        _ => "see cuda.h",
    }
}

/// Everything that can go wrong in lazybuf.
#[derive(Debug, thiserror::Error)]
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
    /// A copy whose source and destination lengths differ.
    #[error("length mismatch in {operation}: expected {expected} elements, got {actual}")]
    LengthMismatch {
        /// The operation that was called.
        operation: &'static str,
        /// The buffer's length.
        expected: usize,
        /// The length that was passed.
        actual: usize,
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
    #[error("out of memory on {device}: could not allocate {requested} bytes{}", code_suffix(.code))]
    OutOfMemory {
        /// The device's name.
        device: String,
        /// The size of the request in bytes.
        requested: usize,
        /// The runtime's code, where the runtime gave one.
        code: Option<RuntimeCode>,
    },
    /// A runtime call failed for a reason other than memory.
    #[error("{backend} call {call} failed: {code}")]
    Runtime {
        /// The backend that failed.
        backend: BackendKind,
        /// The runtime function (or lazybuf operation) that failed.
        call: &'static str,
        /// The runtime's status.
        code: RuntimeCode,
    },
    /// The backend's runtime is not installed or has no usable device.
    #[error("{backend} is not available: {reason}")]
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
    /// A fault injected by [`crate::testing::FaultyDevice`].
    #[error("injected fault: {operation} number {count} was told to fail")]
    InjectedFault {
        /// The kind of operation that failed.
        operation: &'static str,
        /// Its number, counted from 1.
        count: u64,
    },
}

fn code_suffix(code: &Option<RuntimeCode>) -> String {
    match code {
        Some(code) => format!(" ({code})"),
        None => String::new(),
    }
}

impl Error {
    /// Whether repeating the call can succeed: true for out-of-memory (after memory is
    /// freed) and injected faults; false for bad input and missing runtimes.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::OutOfMemory { .. } | Error::InjectedFault { .. } => true,
            Error::Runtime { code, .. } => {
                matches!(code, RuntimeCode::OpenCl(-5) | RuntimeCode::OpenCl(-6) | RuntimeCode::Cuda(2))
            }
            _ => false,
        }
    }

    /// Whether the error is an out-of-memory condition (the pool trims and retries on it).
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, Error::OutOfMemory { .. })
    }

    pub(crate) fn invalid(operation: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidArgument { operation, reason: reason.into() }
    }
}

/// lazybuf's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
