//! The host device: "device" memory is host memory. A buffer's device copy on it aliases the
//! host copy, so syncs move no bytes, while the buffer's states still follow the table.
//!
//! Also home to the system memory figures (`/proc/meminfo`), which the host device reports.

mod device;
mod memory;

pub use device::HostBackend;
pub use memory::HostDeviceMemory;
