//! Memory resources: where a buffer's memory comes from and where it goes back.
//!
//! A [`MemoryResource`] is the policy layer over storage. [`DirectResource`] asks the device's
//! backend for every block and frees it on return; policies (a pool, a limit, statistics) wrap
//! an upstream resource they own and add one concern each. A buffer holds an
//! `Arc<dyn MemoryResource>` and hands every block back to it when the block is no longer
//! needed.
//!
//! **Streams.** Device memory is taken for a stream and given back with a ticket that
//! completes when the last work using it has: a resource may hand such a block at once to a
//! request on the same stream (whose work runs after that work anyway), but to anyone else
//! only once the ticket is complete. Host blocks come back with the same kind of ticket and
//! are reused only once it is complete.
//!
//! Blocks may be larger than asked for (a pool rounds up to size classes); buffers use the
//! first `nbytes` of them. Zero-copy aliases of host blocks are not resource allocations (they
//! own no memory) and never pass through here.
//!
//! The resources:
//! - [`DirectResource`]: the backends themselves (a source);
//! - [`CachingResource`] (`caching.rs`): keeps freed blocks by device, kind and size class
//!   and hands them out again (the memory of a [`crate::MemoryPool`]);
//! - [`LimitingResource`] (`limiting.rs`): refuses allocations beyond a byte limit;
//! - [`StatisticsResource`] (`statistics.rs`): counts bytes and allocations (current, peak,
//!   total) on a stack of counters, as RMM's statistics adaptor;
//! - [`TrackingResource`] (`tracking.rs`): records every outstanding allocation, for leak
//!   hunting;
//! - [`FailureCallbackResource`] (`failure_callback.rs`): asks a callback whether to retry an
//!   allocation that ran out of memory.
//!
//! **Caching by default.** Buffers and memory objects made without a resource take theirs
//! from [`default_resource`]: the device's current resource when one was set
//! ([`set_current_resource`], RMM's "current device resource"), else the process-wide caching
//! resource of their device (the one [`crate::MemoryPool::for_device`] shows) while caching is
//! on (the default), else [`DirectResource`]. Turn caching off with `LAZYBUF_CACHE=0` or [`set_caching`]; give cached
//! memory back with [`trim`]. Cached device memory is reported by
//! [`crate::Device::memory_info`] as `cached`.
//!
//! What does not live here: runtime calls ([`crate::backend`]) and the pool handle that hands
//! out buffers ([`crate::pool`]).

mod caching;
mod failure_callback;
mod limiting;
pub mod size_class;
mod statistics;
mod tracking;

pub use caching::{CachingResource, DEFAULT_MAX_CACHED_BYTES, PoolConfig, PoolStats, PoolUsage};
pub use failure_callback::{FailureCallback, FailureCallbackResource};
pub use limiting::LimitingResource;
pub use statistics::{Statistics, StatisticsResource};
pub use tracking::{Outstanding, TrackingResource};

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

pub use crate::backend::Block;
use crate::backend::fork::ForkAwareOnce;
use crate::backend::fork::{ForkAwareMutex, ForkAwareTable};
use crate::backend::{DeviceMemory, MemoryKind, Ticket};
use crate::coherence::DeviceId;
use crate::device::{Device, Stream};
use crate::error::Result;
use crate::host_memory::HostMemory;

/// A source of memory of every kind, for buffers and memory objects.
///
/// Implementors provide [`MemoryResource::allocate`] and [`MemoryResource::deallocate`]; the
/// per-kind methods below are conveniences over them.
///
/// ```
/// use std::sync::Arc;
/// use lazybuf::{Device, DirectResource, MemoryKind, MemoryResource};
///
/// let device = Device::host();
/// let resource: Arc<dyn MemoryResource> = DirectResource::shared();
/// let block = resource.allocate(&device, MemoryKind::Host { pinned: false }, 4096, &device.stream())?;
/// assert_eq!(block.kind(), MemoryKind::Host { pinned: false });
/// resource.deallocate(&device, block, &device.stream(), lazybuf::Ticket::done());
/// # Ok::<(), lazybuf::Error>(())
/// ```
pub trait MemoryResource: Send + Sync + fmt::Debug {
    /// A block of at least `bytes` of `kind` for `device` (host blocks: for a buffer whose own
    /// device it is), with unspecified contents, for work on `stream`. Pinned host memory that
    /// cannot be pinned is an error, never a silent pageable block.
    fn allocate(&self, device: &Device, kind: MemoryKind, bytes: usize, stream: &Stream) -> Result<Block>;

    /// Takes back a block this resource handed out for `device`, last used by work on
    /// `stream`; `ready` completes when that work has.
    fn deallocate(&self, device: &Device, block: Block, stream: &Stream, ready: Ticket);

    /// A host block of at least `bytes` for a buffer whose own device is `device`,
    /// page-locked when `pinned`.
    fn allocate_host(&self, device: &Device, bytes: usize, pinned: bool) -> Result<HostMemory> {
        let stream = device.stream();
        match self.allocate(device, MemoryKind::Host { pinned }, bytes, &stream)? {
            Block::Host(block) => Ok(block),
            other => {
                self.deallocate(device, other, &stream, Ticket::done());
                Err(wrong_kind(self, "host block"))
            }
        }
    }

    /// A host block as [`Self::allocate_host`] gives, only if one is ready at once: no wait,
    /// no call into a runtime that may block and no code outside lazybuf (a cache hit).
    /// `None` otherwise, with nothing counted, so the caller can then ask
    /// [`Self::allocate_host`] (a binding holding its interpreter's lock makes the access in
    /// place only when this succeeds). The default has none ready.
    fn allocate_host_now(&self, _device: &Device, _bytes: usize, _pinned: bool) -> Option<HostMemory> {
        None
    }

    /// Device memory of at least `bytes` on `device`, for work on `stream`.
    fn allocate_device(&self, device: &Device, bytes: usize, stream: &Stream) -> Result<DeviceMemory> {
        match self.allocate(device, MemoryKind::Device, bytes, stream)? {
            Block::Device(memory) if memory.kind() == MemoryKind::Device => Ok(memory),
            other => {
                self.deallocate(device, other, stream, Ticket::done());
                Err(wrong_kind(self, "device allocation"))
            }
        }
    }

    /// Takes back a host block handed out for `device`.
    fn deallocate_host(&self, device: &Device, block: HostMemory, ready: Ticket) {
        self.deallocate(device, Block::Host(block), &device.stream(), ready);
    }

    /// Takes back device memory handed out on `device`, last used on `stream`.
    fn deallocate_device(&self, device: &Device, memory: DeviceMemory, stream: &Stream, ready: Ticket) {
        self.deallocate(device, Block::Device(memory), stream, ready);
    }
}

fn wrong_kind<R: MemoryResource + ?Sized>(resource: &R, wanted: &str) -> crate::Error {
    crate::Error::invalid(
        "allocate",
        format!("the memory resource {resource:?} returned another kind of memory; expected a {wanted}"),
    )
}

/// Runs its closure when dropped, unless disarmed: undoes a charge or a reservation made
/// before calling code outside lazybuf (an upstream resource, a runtime, an evictable buffer)
/// when that code panics, so no budget or limit keeps bytes nobody holds.
pub(crate) struct OnUnwind<F: FnOnce()>(Option<F>);

impl<F: FnOnce()> OnUnwind<F> {
    /// Armed: `undo` runs at the drop.
    pub(crate) fn new(undo: F) -> Self {
        OnUnwind(Some(undo))
    }

    /// The code returned: its caller settles what was charged.
    pub(crate) fn disarm(mut self) {
        self.0 = None;
    }
}

impl<F: FnOnce()> Drop for OnUnwind<F> {
    fn drop(&mut self) {
        if let Some(undo) = self.0.take() {
            undo();
        }
    }
}

/// Checks a block `resource` handed out for a request of `bytes` of `kind` on `device`, before
/// anything uses it: at least the bytes asked for, host memory for a host request (page-locked
/// for a pinned one: SPEC section 3, never a silent pageable block), and device or shared
/// memory of `device` itself for those requests (not another device's, nor a handle no backend
/// of `device` made: such memory would reach the caller's kernels as this device's). Every
/// user of a resource's blocks (buffers, memory objects) asks before it keeps one: a
/// resource's mistake is an error naming what was expected; the caller gives the block back.
pub(crate) fn check_block(
    resource: &dyn MemoryResource,
    device: &Device,
    kind: MemoryKind,
    bytes: usize,
    block: &Block,
) -> Result<()> {
    let what = match block {
        Block::Host(_) => "host block",
        Block::Device(memory) if memory.kind() == MemoryKind::Shared => "shared allocation",
        Block::Device(_) => "device allocation",
    };
    if block.len() < bytes {
        return Err(crate::Error::invalid(
            "allocate",
            format!(
                "the memory resource {resource:?} returned a {what} of {} bytes for a request of {bytes}; \
                 expected at least the bytes asked for",
                block.len()
            ),
        ));
    }
    match (kind, block) {
        (MemoryKind::Host { pinned }, Block::Host(host)) => {
            if pinned && !host.is_pinned() {
                return Err(crate::Error::PinningFailed {
                    requested: bytes,
                    reason: format!(
                        "the memory resource {resource:?} returned a pageable host block for a pinned \
                         request; expected page-locked memory"
                    ),
                });
            }
            Ok(())
        }
        (MemoryKind::Device | MemoryKind::Shared, Block::Device(memory)) if memory.kind() == kind => {
            if !device.backend().owns(memory) {
                return Err(crate::Error::invalid(
                    "allocate",
                    format!(
                        "the memory resource {resource:?} returned a {what} of another device (or one no \
                         backend of {device} made); expected {} memory of {device}",
                        kind.name()
                    ),
                ));
            }
            Ok(())
        }
        _ => Err(crate::Error::invalid(
            "allocate",
            format!(
                "the memory resource {resource:?} returned a {what} for a request of {} memory; expected \
                 {} memory",
                kind.name(),
                kind.name()
            ),
        )),
    }
}

/// Allocates from the device's backend every time and frees on return (after the last work
/// using the memory is done).
///
/// ```
/// use lazybuf::{AllocationOptions, Device, DeviceAllocation, DirectResource, MemoryKind};
///
/// // An allocation that bypasses the device's cache: freed as soon as it is dropped.
/// let options = AllocationOptions { resource: Some(DirectResource::shared()), ..Default::default() };
/// let a = DeviceAllocation::<u8>::with_options(&Device::host(), MemoryKind::Device, 1 << 16, options)?;
/// assert_eq!(a.nbytes(), 1 << 16);
/// # Ok::<(), lazybuf::Error>(())
/// ```
#[derive(Debug, Default)]
pub struct DirectResource;

impl DirectResource {
    /// The shared direct resource.
    pub fn shared() -> Arc<dyn MemoryResource> {
        static DIRECT: ForkAwareOnce<Arc<dyn MemoryResource>> = ForkAwareOnce::new();
        DIRECT.get_or_init(|| Arc::new(DirectResource)).clone()
    }
}

impl MemoryResource for DirectResource {
    fn allocate(&self, device: &Device, kind: MemoryKind, bytes: usize, _stream: &Stream) -> Result<Block> {
        let allocate = || device.backend().allocate(kind, bytes);
        match kind {
            // Host memory counts against the host limit, which may spill host copies to disk.
            MemoryKind::Host { .. } => crate::spill::allocate_host_within_budget(bytes, allocate),
            // Device memory counts against the device's budget, which may spill to make room.
            MemoryKind::Device | MemoryKind::Shared => {
                crate::spill::allocate_within_budget(device, bytes, allocate)
            }
        }
    }

    fn deallocate(&self, device: &Device, block: Block, _stream: &Stream, ready: Ticket) {
        // Work that failed leaves nothing to wait for (its failure is recorded on the device:
        // a free path cannot return it); either way the block is freed.
        device.record_deferred(ready.wait());
        let (bytes, on_device) = (block.len(), matches!(block, Block::Device(_)));
        drop(block);
        if on_device {
            crate::spill::budget::release(device, bytes);
        } else {
            crate::spill::budget::release_host(bytes);
        }
    }
}

/// The environment variable that turns caching by default off (`0`) or on (`1`).
pub const CACHE_ENV: &str = "LAZYBUF_CACHE";

/// 0: not decided yet (read the environment), 1: off, 2: on.
static CACHING: AtomicU8 = AtomicU8::new(0);

/// Whether buffers made without a resource take their memory from their device's pool.
pub fn caching() -> bool {
    match CACHING.load(Ordering::Relaxed) {
        0 => {
            let on = !matches!(
                crate::env::switch(CACHE_ENV).as_deref().map(str::trim),
                Some("0" | "false" | "off" | "no")
            );
            // A racing set_caching wins over the environment.
            let _ = CACHING.compare_exchange(0, if on { 2 } else { 1 }, Ordering::Relaxed, Ordering::Relaxed);
            CACHING.load(Ordering::Relaxed) == 2
        }
        state => state == 2,
    }
}

/// Turns caching by default on or off for buffers made from now on (buffers keep the
/// resource they were made with).
pub fn set_caching(on: bool) {
    CACHING.store(if on { 2 } else { 1 }, Ordering::Relaxed);
}

/// The process-wide caching resource of `device`: the same one on every call, configured by
/// [`PoolConfig::for_device`]. It lives for the rest of the process and keeps the device open.
pub fn default_pool(device: &Device) -> Arc<CachingResource> {
    thread_local! {
        /// The default pool this thread asked for last, by device: an entry never goes stale,
        /// as default pools are never replaced or dropped ([`default_memory_pool`]) and device
        /// ids are never reused. Saves the global lock and map lookup per buffer made.
        static LAST: RefCell<Option<(DeviceId, Arc<CachingResource>)>> = const { RefCell::new(None) };
    }
    let id = device.id();
    let hit =
        LAST.try_with(|last| last.borrow().as_ref().filter(|(seen, _)| *seen == id).map(|(_, p)| p.clone()));
    if let Ok(Some(pool)) = hit {
        return pool;
    }
    let pool = crate::MemoryPool::for_device(device).cache().clone();
    // A thread being torn down has no slot: it just asks the map next time.
    let _ = LAST.try_with(|last| *last.borrow_mut() = Some((id, pool.clone())));
    pool
}

/// The process-wide default pool of `device` (made at the first call). Entries are never
/// removed or replaced: [`default_pool`] caches them per thread.
pub(crate) fn default_memory_pool(device: &Device) -> crate::MemoryPool {
    let Some(mut pools) = default_pools().lock() else {
        // A forked child whose parent's thread held the table at the fork: a pool of the
        // caller's own (the thread caches it, [`default_pool`]).
        return crate::MemoryPool::new(device, PoolConfig::for_device(device));
    };
    pools
        .entry(device.id())
        .or_insert_with(|| crate::MemoryPool::new(device, PoolConfig::for_device(device)))
        .clone()
}

fn default_pools() -> &'static ForkAwareMutex<HashMap<DeviceId, crate::MemoryPool>> {
    static POOLS: ForkAwareOnce<ForkAwareMutex<HashMap<DeviceId, crate::MemoryPool>>> = ForkAwareOnce::new();
    POOLS.get_or_init(ForkAwareMutex::default)
}

/// The resource a buffer or memory object on `device` made without one uses: the device's
/// current resource if one was set ([`set_current_resource`]), else its default caching
/// resource while caching is on, else [`DirectResource`].
pub fn default_resource(device: &Device) -> Arc<dyn MemoryResource> {
    if let Some(current) = current_resource(device) {
        return current;
    }
    if caching() { default_pool(device) } else { DirectResource::shared() }
}

/// Whether any device has a current resource (so the common case skips the lock).
static ANY_CURRENT: AtomicBool = AtomicBool::new(false);

/// The current resources, per device. A forked child that finds the table held by a
/// parent's thread (in the middle of a change) starts with none set ([`ForkAwareTable`]).
static CURRENT: ForkAwareTable<HashMap<DeviceId, Arc<dyn MemoryResource>>> = ForkAwareTable::new();

/// The resource set for `device` with [`set_current_resource`], if any.
pub fn current_resource(device: &Device) -> Option<Arc<dyn MemoryResource>> {
    if !ANY_CURRENT.load(Ordering::Acquire) {
        return None;
    }
    CURRENT.lock().get(&device.id()).cloned()
}

/// Makes `resource` the one buffers and memory objects on `device` made from now on take
/// their memory from when given none (`None`: back to the default); returns the one set
/// before. Existing buffers keep the resource they were made with.
pub fn set_current_resource(
    device: &Device,
    resource: Option<Arc<dyn MemoryResource>>,
) -> Option<Arc<dyn MemoryResource>> {
    let mut current = CURRENT.lock();
    let previous = match resource {
        Some(resource) => current.insert(device.id(), resource),
        None => current.remove(&device.id()),
    };
    ANY_CURRENT.store(!current.is_empty(), Ordering::Release);
    previous
}

#[cfg(feature = "testing")]
/// Runs `f` while this thread holds the table of current resources
/// ([`crate::testing::with_current_resources_locked`]).
pub(crate) fn with_current_resources_locked<R>(f: impl FnOnce() -> R) -> R {
    let _held = CURRENT.lock();
    f()
}

#[cfg(feature = "testing")]
/// Runs `f` while this thread holds the table of default pools
/// ([`crate::testing::with_default_pools_locked`]).
pub(crate) fn with_default_pools_locked<R>(f: impl FnOnce() -> R) -> R {
    let _held = default_pools().lock();
    f()
}

/// Gives back everything lazybuf keeps for reuse: the cached blocks of every device's default
/// pool, and the backends' staging memory. Returns the bytes of cached blocks freed. Live
/// buffers keep their memory; pools made with [`crate::MemoryPool::new`] are trimmed by their
/// own `trim`.
pub fn trim() -> u64 {
    let pools: Vec<crate::MemoryPool> =
        default_pools().lock().map(|pools| pools.values().cloned().collect()).unwrap_or_default();
    let freed = pools.iter().map(|pool| pool.trim()).sum();
    // Only devices already found: trimming must not open every backend (slow, and it would
    // make the registry where another thread may fork meanwhile).
    for device in crate::discovery::devices_found() {
        device.trim();
    }
    freed
}
