//! The loopback backend: a test-only runtime with discrete memory, on the host.
//!
//! Two devices, `loopback:0` and `loopback:1`, whose device memory is host memory of their own
//! that no buffer's host copy aliases: every sync moves its bytes, as on a discrete GPU, so a
//! test that would pass on the host device only because the device copy *is* the host copy
//! fails here. Each device has a fixed capacity ([`CAPACITY`]): allocations beyond it are out
//! of memory, as on a GPU. Shared memory is host memory both address. The two devices copy
//! between each other directly (a peer copy), so the peer paths run without CUDA. Operations
//! are memcpys done before the call returns.
//!
//! It exists to prove the backend edge: it is registered exactly as a real backend is (this
//! folder, one line in [`crate::backend::REGISTERED`], its raw-handle variants and the cargo
//! feature `loopback`, which `testing` turns on), and the generic suites and the Python
//! package run on it with no line of theirs naming it.

mod device;
mod memory;

pub use device::{CAPACITY, LoopbackBackend};
pub use memory::{LoopbackMemory, LoopbackStream};

use std::sync::Arc;

use crate::backend::{Backend, Registration};
use crate::error::{BackendKind, Result};

impl BackendKind {
    /// The test-only loopback devices (discrete memory on the host; feature `loopback`).
    pub const LOOPBACK: BackendKind = BackendKind::new("loopback", "loopback");
}

/// How discovery finds the loopback devices.
pub const REGISTRATION: Registration = Registration { kind: BackendKind::LOOPBACK, open_all };

/// How many loopback devices there are.
pub const DEVICES: u32 = 2;

/// Opens the loopback devices (never fails: they need no runtime).
pub fn open_all() -> Result<Vec<Arc<dyn Backend>>> {
    Ok((0..DEVICES).map(|index| crate::backend::checked::open(LoopbackBackend::new(index))).collect())
}
