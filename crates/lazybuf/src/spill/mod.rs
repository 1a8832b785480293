//! Spilling under per-device memory budgets: when a device's memory limit (or the runtime's
//! out-of-memory report) needs room, lazybuf evicts the least recently used device copies of
//! buffers not in use, and because it knows which copy is current, a copy equal to a current
//! copy elsewhere is dropped moving no byte; only a copy that holds the only current data is
//! written back first.
//!
//! - [`budget`]: the limit per device ([`set_memory_limit`], [`MEMORY_LIMIT_ENV`]) and the
//!   device memory lazybuf holds there ([`memory_held`]);
//! - [`registry`]: the buffers eviction may reach ([`Evictable`]) and their last use;
//! - `eviction`: making room before an allocation (trim caches, then evict);
//! - [`stats`]: what it did ([`spill_stats`]);
//! - [`disk`]: the disk tier, spill files for host copies under the host limit
//!   ([`set_host_memory_limit`]);
//! - `shared`: [`SharedBuffer`], the Rust buffer eviction can reach.
//!
//! **What counts, what is evicted.** Every block of device memory lazybuf takes from a
//! backend counts against the budget: device copies, cached pool blocks, memory objects
//! ([`crate::DeviceAllocation`]) and [`crate::DeviceBuffer`]s. Only device copies of
//! registered buffers are evicted (memory objects and device buffers have no second copy):
//! in Rust, [`SharedBuffer`]s. **A plain [`crate::UnifiedBuffer`] is owned by value and never
//! evicted**: wrap it in a [`SharedBuffer`] to make it evictable. Before anything is evicted,
//! every live pool of the device (its default pool and those made with
//! [`crate::MemoryPool::new`]) gives its cached blocks back. A
//! buffer is *in use*, and skipped, while its lock is held (which covers every live device
//! view in Rust), while a transfer of it is in flight, and in Python while an object that
//! exposes its memory lives. Zero-copy device copies (the host device's, and PoCL's for large
//! buffers) hold no device memory: they count nothing and are never evicted.
//!
//! See `docs/SPILLING.md` for the design, the guarantees and what is not built.
//!
//! ```
//! use lazybuf::spill::{self, SharedBuffer};
//! use lazybuf::{Device, UnifiedBuffer};
//!
//! let device = lazybuf::default_device()?; // a GPU's memory is what a budget is for
//! spill::set_memory_limit(&device, Some(256 << 20)); // at most 256 MiB of device memory
//! // A buffer eviction may reach: shared, behind a lock it can try.
//! let buf = SharedBuffer::new(UnifiedBuffer::<f32>::on(&[1024], &device)?);
//! buf.lock().host_mut()?.fill(1.0);
//! buf.lock().sync_to_device()?; // room is made first when the budget needs it
//! assert!(spill::memory_held(&device) <= spill::memory_limit(&device)?.unwrap());
//! let stats = spill::spill_stats(&device); // evictions, clean ones, bytes written back...
//! assert_eq!(stats.bytes_written_back, 0);
//! spill::set_memory_limit(&device, None);
//! # Ok::<(), lazybuf::Error>(())
//! ```

pub mod budget;
pub mod disk;
mod eviction;
pub mod registry;
mod shared;
pub mod stats;

pub use budget::{
    MEMORY_LIMIT_ENV, host_memory_held, host_memory_limit, memory_held, memory_limit, parse_memory_limits,
    parse_size, set_host_memory_limit, set_memory_limit,
};
pub use eviction::{EVICTION_POLICY_ENV, EvictionPolicy, eviction_policy, set_eviction_policy};
pub(crate) use eviction::{allocate_host_within_budget, allocate_within_budget};
pub use registry::{Evictable, Evicted};
pub use shared::{SharedBuffer, SharedGuard};
pub use stats::{SpillStats, reset_spill_stats, spill_stats};
