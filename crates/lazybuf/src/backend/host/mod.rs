//! The host device: "device" memory is host memory. A buffer's device copy on it aliases the
//! host copy, so syncs move no bytes, while the buffer's states still follow the table. Its one
//! stream is immediate: every operation is done when the call returns, and its tickets are
//! complete from the start.
//!
//! Also home to the system memory figures (`/proc/meminfo`), which the host device reports.

mod device;
mod memory;

pub use device::HostBackend;
pub use memory::{HostDeviceMemory, HostStream};

use std::sync::Arc;

use crate::backend::fork::ForkAwareOnce;

use crate::backend::Backend;
use crate::error::BackendKind;

impl BackendKind {
    /// The host itself, as a device (always present).
    pub const HOST: BackendKind = BackendKind::new("host", "host");
}

/// The host device's backend: one per process.
pub fn backend() -> Arc<dyn Backend> {
    static HOST: ForkAwareOnce<Arc<dyn Backend>> = ForkAwareOnce::new();
    HOST.get_or_init(|| crate::backend::checked::open(HostBackend::new())).clone()
}
