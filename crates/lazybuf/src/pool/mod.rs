//! Memory pools: acquire a buffer by shape, element type and pinnedness, release it back, and
//! reuse its memory without a new allocation.
//!
//! A [`MemoryPool`] is a handle to a [`CachingResource`] (RMM style: a caching policy over an
//! upstream resource it owns, by default the device's backend directly). Buffers it hands out
//! take their host block and device memory from it and give them back when dropped or
//! released, so reuse works for any buffer that names the pool's resource in its
//! [`BufferOptions`], on any device and any backend. The pool of [`MemoryPool::for_device`]
//! is also where buffers made without a resource take their memory while caching by default
//! is on ([`crate::resource`]).
//!
//! - **Keys and size classes.** Blocks are cached by device, kind (host, pinned host, device)
//!   and size class. A request is rounded up to its class: under 64 bytes extra up to
//!   256 bytes, under a quarter of the request above ([`crate::resource::size_class`] proves
//!   the bound).
//! - **Lazy.** A buffer allocates on first use (SPEC: nothing is allocated before it is
//!   needed), so a hit or a miss happens at the buffer's first host or device access, not at
//!   [`MemoryPool::acquire`]; an acquired buffer that is never touched takes nothing.
//! - **Uninitialized.** An acquired buffer is UNINITIALIZED; a reused block keeps its old
//!   bytes (a buffer's *read* of an uninitialized buffer sees zeros) unless
//!   [`PoolConfig::zero_reused`] clears every reused block.
//! - **Cap, trim, out of memory.** Cached bytes never exceed [`PoolConfig::max_cached_bytes`]
//!   (a release beyond it frees the block); [`MemoryPool::trim`] frees every cached block; an
//!   allocation the upstream refuses for lack of memory (or of lockable memory) trims and
//!   retries once, then returns the upstream's error.
//! - **Streams.** Device blocks are reused at once on the stream that last used them, and by
//!   other streams once that use is complete.
//! - **Threads.** A pool is `Send + Sync`; one short critical section per acquire or release.
//! - **Spilling.** Every pool registers itself (weakly: a pool lives while a handle or a
//!   buffer of it does) in a list of live pools per device; when a memory limit or an
//!   out-of-memory report needs room ([`crate::spill`]), every live pool of the device is
//!   trimmed before any buffer's copy is evicted, private pools included
//!   (`trim_live_pools`).
//!
//! What does not live here: the caching itself ([`crate::resource`]), and the buffer's
//! coherence ([`crate::buffer`]).

use crate::backend::fork::ForkAwareMutex;
use std::fmt;
use std::sync::{Arc, Weak};

use crate::backend::MemoryKind;
use crate::backend::fork::ForkAwareOnce;
use crate::buffer::{BufferOptions, RawBuffer, UnifiedBuffer};
use crate::coherence::DeviceId;
use crate::device::Device;
use crate::element::Element;
use crate::error::{Error, Result};
use crate::resource::{
    CachingResource, DirectResource, LimitingResource, MemoryResource, PoolConfig, PoolStats, PoolUsage,
};

/// A memory pool whose buffers live on one device.
///
/// ```
/// use lazybuf::{BufferState, Device, MemoryPool, PoolConfig};
/// let pool = MemoryPool::new(&Device::host(), PoolConfig::default());
/// let mut buf = pool.acquire::<f32>(&[1000], false)?;
/// buf.host_overwrite()?.fill(1.0);
/// let first = buf.host()?.as_ptr();
/// pool.release(buf)?;
///
/// let mut again = pool.acquire::<f32>(&[1000], false)?; // same buffer!
/// assert_eq!(again.state(), BufferState::Uninitialized);
/// assert_eq!(again.host_overwrite()?.as_ptr(), first);
/// assert_eq!((pool.stats().allocations, pool.stats().hits), (1, 1));
/// # Ok::<(), lazybuf::Error>(())
/// ```
#[derive(Clone)]
pub struct MemoryPool {
    device: Device,
    resource: Arc<CachingResource>,
    /// Between the cache and the upstream: the pool's limit ([`MemoryPool::set_limit`]).
    limiter: Arc<LimitingResource>,
}

impl MemoryPool {
    /// A new, empty pool for `device` whose misses go to the device's backend.
    pub fn new(device: &Device, config: PoolConfig) -> MemoryPool {
        Self::with_upstream(device, config, DirectResource::shared())
    }

    /// A new, empty pool whose misses go to `upstream` (a limit, statistics, another pool).
    pub fn with_upstream(
        device: &Device,
        config: PoolConfig,
        upstream: Arc<dyn MemoryResource>,
    ) -> MemoryPool {
        let limiter = Arc::new(LimitingResource::unlimited(upstream));
        let resource = Arc::new(CachingResource::new(limiter.clone(), config, device.to_string()));
        register(device, &resource);
        MemoryPool { device: device.clone(), resource, limiter }
    }

    /// The process-wide default pool of `device`: the same pool on every call, configured by
    /// [`PoolConfig::for_device`], whose memory is also what buffers made without a resource
    /// use while caching by default is on. It lives for the rest of the process and keeps the
    /// device open.
    pub fn for_device(device: &Device) -> MemoryPool {
        crate::resource::default_memory_pool(device)
    }

    /// The device whose buffers this pool hands out.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The pool's configuration.
    pub fn config(&self) -> PoolConfig {
        self.resource.config()
    }

    /// The pool's caching resource.
    pub(crate) fn cache(&self) -> &Arc<CachingResource> {
        &self.resource
    }

    /// The pool as a memory resource, for [`BufferOptions::resource`].
    pub fn resource(&self) -> Arc<dyn MemoryResource> {
        self.resource.clone()
    }

    /// Where the pool's misses go (the upstream it was made with; the pool's limit sits
    /// between the two).
    pub fn upstream(&self) -> &Arc<dyn MemoryResource> {
        self.limiter.upstream()
    }

    /// An UNINITIALIZED buffer of `shape` on the pool's device whose memory comes from this
    /// pool (taken at its first use; see the module docs). Dropping or
    /// [releasing](MemoryPool::release) it returns its memory to the pool. A shape whose size overflows
    /// is an [`Error::InvalidShape`]; a pinned block that cannot be pinned is an error at first
    /// use, never a silent pageable one.
    pub fn acquire<T: Element>(&self, shape: &[usize], pinned: bool) -> Result<UnifiedBuffer<T>> {
        let options = BufferOptions {
            device: Some(self.device.clone()),
            pinned,
            resource: Some(self.resource()),
            ..BufferOptions::default()
        };
        UnifiedBuffer::with_options(shape, options)
    }

    /// Whether `buffer`'s memory comes from this pool.
    pub fn owns(&self, buffer: &RawBuffer) -> bool {
        std::ptr::addr_eq(Arc::as_ptr(buffer.resource()), Arc::as_ptr(&self.resource))
    }

    /// Returns `buffer`'s memory to the pool. A buffer from another pool, or from none, is an
    /// [`Error::InvalidArgument`] saying so; it is dropped all the same, its memory going back
    /// where it came from.
    pub fn release<T: Element>(&self, buffer: UnifiedBuffer<T>) -> Result<()> {
        if self.owns(buffer.raw()) {
            drop(buffer);
            return Ok(());
        }
        let reason = format!(
            "expected a buffer acquired from this pool (of {}), got one whose memory comes from {:?}; \
             it was dropped and its memory went back there",
            self.device,
            buffer.raw().resource()
        );
        drop(buffer);
        Err(Error::invalid("MemoryPool::release", reason))
    }

    /// The pool's counters now.
    pub fn stats(&self) -> PoolStats {
        self.resource.stats()
    }

    /// What the pool holds of the kinds of memory `kinds` accepts (bytes in use, bytes and
    /// blocks cached), and the hits and misses of requests for them:
    /// `pool.usage(|k| k == MemoryKind::Host { pinned: true })` for pinned host memory.
    pub fn usage(&self, kinds: impl Fn(MemoryKind) -> bool) -> PoolUsage {
        self.resource.usage(kinds)
    }

    /// Sets the most bytes the pool may hold, handed out and cached together, over every
    /// kind of memory (`None`: no limit, the default). A request beyond it, once the pool has
    /// trimmed its cache, fails with [`Error::OutOfMemory`]. For the pool of
    /// [`MemoryPool::for_device`] this limits every buffer made without a resource on that
    /// device while caching by default is on.
    pub fn set_limit(&self, limit: Option<u64>) {
        self.limiter.set_limit(limit.unwrap_or(u64::MAX));
    }

    /// The limit set by [`Self::set_limit`], if any.
    pub fn limit(&self) -> Option<u64> {
        Some(self.limiter.limit()).filter(|&limit| limit != u64::MAX)
    }

    /// Frees every cached block back upstream; returns the bytes freed. Live buffers keep
    /// their memory.
    pub fn trim(&self) -> u64 {
        self.resource.trim()
    }

    /// [`Self::trim`], then sets the counters of events (hits, misses, allocations, OOM
    /// retries) to zero and the peak to the bytes in use now. Live buffers keep their memory
    /// and are still counted in `bytes_in_use`.
    pub fn clear(&self) {
        self.resource.trim();
        self.resource.reset_counters();
    }
}

impl fmt::Debug for MemoryPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryPool")
            .field("device", &self.device)
            .field("config", &self.config())
            .field("stats", &self.stats())
            .finish()
    }
}

impl MemoryPool {
    #[cfg(feature = "testing")]
    /// Runs `f` while this thread holds the cache's lock ([`crate::testing::with_pool_locked`]).
    pub(crate) fn with_cache_locked<R>(&self, f: impl FnOnce() -> R) -> R {
        self.resource.with_state_locked(f)
    }
}

/// The caches of pools made, with their device (`None`: a cache that serves every device),
/// weakly held.
type LivePools = ForkAwareMutex<Vec<(Option<DeviceId>, Weak<CachingResource>)>>;

/// The caches of every pool made, by device, weakly held.
fn live_pools() -> &'static LivePools {
    static LIVE: ForkAwareOnce<LivePools> = ForkAwareOnce::new();
    LIVE.get_or_init(ForkAwareMutex::default)
}

/// Adds a new pool's cache to the live pools of `device`.
fn register(device: &Device, cache: &Arc<CachingResource>) {
    register_cache(cache, Some(device));
}

/// Makes `cache`, a [`CachingResource`] made outside [`MemoryPool`] (a binding's own pool
/// resource), one of the live pools that spilling trims before it evicts anything (of
/// `device`, or of every device with `None`: a cache serving any device is trimmed whole
/// whenever one of them needs room). Held weakly: dropping the cache unregisters it.
pub fn register_cache(cache: &Arc<CachingResource>, device: Option<&Device>) {
    // Not listed in a forked child whose parent's thread held the list at the fork: spilling
    // does not trim it there.
    let Some(mut live) = live_pools().lock() else { return };
    // Pools gone are dropped from the list when it would grow past twice the live ones.
    if live.len() >= 16 && live.len() == live.capacity() {
        live.retain(|(_, pool)| pool.strong_count() > 0);
    }
    live.push((device.map(Device::id), Arc::downgrade(cache)));
}

/// Frees the cached blocks of every live pool of `device` (of every device with `None`)
/// back upstream, default and private pools alike; returns the bytes freed. Spilling calls it
/// before it evicts anything. The list's lock is not held while the pools trim.
pub(crate) fn trim_live_pools(device: Option<&Device>) -> u64 {
    let pools: Vec<Arc<CachingResource>> = {
        let Some(mut live) = live_pools().lock() else { return 0 };
        live.retain(|(_, pool)| pool.strong_count() > 0);
        live.iter()
            .filter(|(id, _)| device.is_none_or(|d| id.is_none_or(|id| d.id() == id)))
            .filter_map(|(_, pool)| pool.upgrade())
            .collect()
    };
    // A pool may be another's upstream: trimming one can hand blocks to another already
    // trimmed, so a second pass empties those too.
    let mut freed: u64 = pools.iter().map(|pool| pool.trim()).sum();
    if pools.len() > 1 {
        freed += pools.iter().map(|pool| pool.trim()).sum::<u64>();
    }
    freed
}
