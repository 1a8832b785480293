//! Memory objects: allocations of one kind on one device, with no coherence tracking.
//!
//! Where a [`crate::UnifiedBuffer`] keeps several copies of an array coherent, a memory object
//! is exactly one allocation, of the kind asked for, and every operation on it moves bytes
//! straight in or out (dpctl's USM memory, RMM's `DeviceBuffer`; seed 004):
//!
//! - [`DeviceAllocation<T>`]: a typed allocation of `len` elements of a [`MemoryKind`](crate::MemoryKind)
//!   (device, host pinned or pageable, shared) on a [`Device`](crate::Device), with upload, download, fill,
//!   copy (between kinds and devices, peer to peer where the devices can), host access for the
//!   kinds the host addresses, prefetch for shared memory and the runtime's raw handle;
//! - [`Memory`]: the untyped memory object, a `DeviceAllocation<u8>` (one type for every
//!   kind: the kind is data, [`DeviceAllocation::kind`]);
//! - [`DeviceBuffer`]: RMM's resizable device buffer over an allocation (size and capacity,
//!   `reserve`, `resize` keeping the contents, `shrink_to_fit`), with [`AllocationHold`]s for
//!   owners of its raw handle that must outlive a reallocation.
//!
//! **Memory comes from a resource.** Objects take their memory from a
//! [`crate::MemoryResource`] they hold ([`AllocationOptions::resource`]; by default the
//! device's current resource, [`crate::resource::default_resource`]) and give it back when
//! dropped, after the work enqueued on the device's stream so far.
//!
//! **Every operation is blocking**, as in dpctl: it runs on the device's default stream
//! ([`crate::Device::stream`]) and returns when its bytes have moved. Kernels of the caller's
//! on that stream are ordered with it; the caller orders work on other streams itself.
//!
//! **Failures.** A failed allocation changes nothing (a [`DeviceBuffer`] that fails to grow
//! keeps its memory, size and contents). A failed copy, fill or memset returns the error and
//! leaves the source, the object's size, capacity and kind, and every byte outside the range
//! it was writing as they were; the bytes of that range are unspecified (the runtime may have
//! written part of them), as they are in dpctl and RMM.
//!
//! What does not live here: runtime calls ([`crate::backend`]) and where memory comes from
//! ([`crate::resource`]).

mod allocation;
mod device_buffer;
mod observed;

pub use allocation::{AllocationOptions, DeviceAllocation, Memory};
pub use device_buffer::{AllocationHold, DeviceBuffer};
