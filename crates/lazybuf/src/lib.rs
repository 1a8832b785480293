//! # lazybuf: one array, one identity, many memories
//!
//! A [`UnifiedBuffer`] keeps an array's copies in host memory and in device memories
//! coherent: it knows which copies are current and copies only when a stale copy is about to
//! be used. See the crate README for the state table.
//!
//! Layout of the crate:
//! - [`coherence`]: the contract as pure code (which copy is valid, what must move);
//! - [`buffer`]: the buffer that executes coherence plans over real memory;
//! - [`backend`]: the device interface and one folder per runtime (host, OpenCL, CUDA);
//! - [`device`] and [`discovery`]: device handles, what they report, the default device;
//! - [`host_memory`]: host blocks (pageable, page-locked, runtime-owned);
//! - [`resource`]: where buffers get memory (direct from backends; policies wrap it);
//! - [`pool`]: memory pools (acquire/release with reuse) and the limiting adaptor;
//! - [`testing`]: a fault-injecting device wrapper;
//! - [`error`]: the one error type.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod backend;
pub mod buffer;
pub mod coherence;
pub mod device;
pub mod discovery;
pub mod element;
pub mod error;
pub mod host_memory;
pub mod pool;
pub mod resource;
pub mod shape;
pub mod testing;

pub use buffer::{BufferOptions, DeviceView, DeviceViewMut, RawBuffer, TransferStats, UnifiedBuffer};
pub use coherence::{BufferState, DeviceId, Location, Residency};
pub use device::{Device, DeviceInfo, MemoryInfo, MemorySource};
pub use discovery::{backend_status, default_device, devices, select_device};
pub use element::{DType, Element};
pub use error::{BackendKind, Error, Result, RuntimeCode};
pub use half::{bf16, f16};
pub use pool::{LimitingResource, MemoryPool, PoolConfig, PoolStats};
pub use resource::{DirectResource, MemoryResource};

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;

#[cfg(test)]
mod send_sync {
    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn promised_send_and_sync() {
        assert_send_sync::<crate::UnifiedBuffer<f32>>();
        assert_send_sync::<crate::RawBuffer>();
        assert_send_sync::<crate::Device>();
        assert_send_sync::<crate::host_memory::HostMemory>();
        assert_send_sync::<crate::backend::DeviceMemory>();
        assert_send_sync::<crate::Error>();
        assert_send_sync::<crate::MemoryPool>();
        assert_send_sync::<crate::LimitingResource>();
    }
}
