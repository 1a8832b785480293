//! # lazybuf: one array, one identity, many memories
//!
//! A [`UnifiedBuffer`] keeps an array's copies in host memory and in device memories
//! coherent: it knows which copies are current and copies only when a stale copy is about to
//! be used. See the crate README for the state table.
//!
//! Layout of the crate (each layer uses only the ones above it):
//! - [`error`], [`shape`], [`element`], [`coherence`]: the error type, shapes, element types,
//!   and the contract as pure code (which copy is valid, what must move);
//! - [`host_memory`]: host blocks (pageable, page-locked, runtime-owned, registered);
//! - [`backend`]: the device interface: the typed `Runtime` trait each runtime implements, the
//!   one checked layer over all of them, streams, tickets and memory; one folder per runtime
//!   (host, OpenCL, CUDA, wgpu, and the test-only loopback devices), listed in one table;
//! - [`device`] and [`discovery`]: device and stream handles, the default device;
//! - [`resource`]: where buffers get memory (the backends directly, caching, limits), and
//!   caching by default;
//! - [`buffer`]: the buffer that executes coherence plans over real memory;
//! - [`memory`]: memory objects of every kind without coherence tracking (typed
//!   allocations, untyped memory, a resizable device buffer);
//! - [`pool`]: memory pools (acquire/release with reuse);
//! - [`checking`](mod@checking): the coherence checker's switch;
//! - [`observe`]: the transfer guard and the event recorder (every copy between memories);
//! - [`testing`] (feature `testing`): a fault-injecting device wrapper (the feature also
//!   registers the loopback devices, [`backend::loopback`]).
//!
//! ## Platforms
//!
//! Linux is where lazybuf is tested. It also compiles for macOS (Metal through wgpu) and
//! Windows (DirectX 12 and Vulkan through wgpu), where host memory uses each system's own
//! calls (see [`host_memory`]); those builds are checked in CI but have not run.
//!
//! ## Feature flags
#![doc = document_features::document_features!()]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]

pub mod backend;
// buffer/mod.rs's module docs link its private `raw` module (the engine the docs describe);
// rendered as plain text in the public docs. (The fix, dropping those two links, belongs to
// buffer/mod.rs.)
#[allow(rustdoc::private_intra_doc_links)]
pub mod buffer;
pub mod checking;
pub mod coherence;
pub mod device;
pub mod discovery;
pub mod element;
mod env;
pub mod error;
pub mod host_memory;
pub mod memory;
pub mod observe;
pub mod pool;
pub mod resource;
pub mod shape;
pub mod spill;
#[cfg(feature = "testing")]
pub mod testing;

pub use backend::{DeviceInfo, DlpackDevice, MemoryInfo, MemoryKind, MemorySource, Ticket};
pub use buffer::{
    AsCall, BufferOptions, DeviceView, DeviceViewMut, RawBuffer, Transfer, TransferStats, UnifiedBuffer,
};
pub use checking::{checking, set_checking};
pub use coherence::{BufferState, DeviceId, Location, Residency};
pub use device::{Device, Stream};
pub use discovery::{backend_status, default_device, devices, select_device};
pub use element::{DType, Element};
pub use error::{BackendKind, CallbackPayload, Error, Result, RuntimeCode};
pub use half::{bf16, f16};
pub use memory::{AllocationHold, AllocationOptions, DeviceAllocation, DeviceBuffer, Memory};
pub use num_complex::{Complex, Complex32, Complex64};
pub use pool::MemoryPool;
pub use resource::{
    Block, CachingResource, DirectResource, FailureCallbackResource, LimitingResource, MemoryResource,
    PoolConfig, PoolStats, PoolUsage, Statistics, StatisticsResource, TrackingResource, caching,
    current_resource, set_caching, set_current_resource, trim,
};

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;

/// The Rust guide's examples (docs/RUST.md), compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/RUST.md")]
struct RustGuideDoctests;

/// The memory guide's examples (docs/MEMORY.md), compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/MEMORY.md")]
struct MemoryGuideDoctests;

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
        assert_send_sync::<crate::Stream>();
        assert_send_sync::<crate::Ticket>();
        assert_send_sync::<crate::Transfer>();
        assert_send_sync::<crate::CachingResource>();
        assert_send_sync::<crate::Error>();
        assert_send_sync::<crate::MemoryPool>();
        assert_send_sync::<crate::LimitingResource>();
        assert_send_sync::<crate::DeviceAllocation<f32>>();
        assert_send_sync::<crate::DeviceBuffer>();
        assert_send_sync::<crate::StatisticsResource>();
        assert_send_sync::<crate::TrackingResource>();
        assert_send_sync::<crate::FailureCallbackResource>();
    }
}
