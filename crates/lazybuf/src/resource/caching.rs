//! [`CachingResource`]: free lists of blocks keyed by device, memory kind (device, shared,
//! pageable or pinned host) and size class, over an upstream resource that serves every miss. It is the memory
//! of every [`crate::MemoryPool`], and of every buffer made without a resource while caching
//! by default is on.
//!
//! - **Take**: a request is rounded up to its size class ([`super::size_class`]). A cached
//!   block of that class, device and kind is a hit: a device or shared block last used on the asking
//!   stream is handed out at once (the stream runs the new work after the old), any other
//!   once its work is done (its ticket complete); it is zeroed first with `zero_reused`. A
//!   miss asks the upstream for a block of the class size.
//! - **Give back**: a block goes onto its free list, with the stream and the ticket of its
//!   last use, unless that would push the cached bytes over the cap; then it goes back
//!   upstream.
//! - **Over a memory limit** (a device's or the host's, lowered below what is held): no cached
//!   block is handed out, checked under the lock a block's return takes; the request trims
//!   the cache and goes upstream, whose budget evicts or refuses; a block given back goes
//!   upstream too, so that the memory held comes down.
//! - **Out of memory** (or a refused page lock, which cached pinned blocks may be causing):
//!   trim every cached block, retry once, and if the upstream still refuses, return its error
//!   as it is (it names the device, the size and the runtime's code).
//! - **Accounting**: every block is counted by its real length, under the key its own length
//!   and kind give, so a block larger than asked for still balances. A block this resource did
//!   not hand out (no block of its key is outstanding) goes straight upstream, uncounted.
//!   Empty requests bypass the cache: an empty block costs nothing. Cached device blocks are
//!   added to their device's [`crate::MemoryInfo::cached`], cached host blocks to the host
//!   device's.
//!
//! One mutex guards the free lists and the counters; it is never held across an upstream
//! call, a fill, a wait, a free or the recorder, only across a hash lookup, a poll, a push or
//! pop and the device's budget lookup (`spill::budget::over_limit`, whose own lock is never
//! held while taking a pool's).
//!
//! What does not live here: the pool handle that hands out buffers ([`crate::pool`]).

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};

use super::size_class::class_size;
use super::{Block, MemoryResource};
use crate::backend::fork::ForkAwareMutex;
use crate::backend::{MemoryKind, Ticket};
use crate::coherence::DeviceId;
use crate::device::{Device, Stream};
use crate::error::{Error, Result};
use crate::host_memory::HostMemory;

/// How a caching resource (a pool) behaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolConfig {
    /// The most bytes the pool keeps cached; a release beyond it frees the block.
    /// 0 caches nothing.
    pub max_cached_bytes: u64,
    /// Zero a reused block before handing it out, for callers that must not see old contents.
    pub zero_reused: bool,
}

/// The default cap: 1 GiB.
pub const DEFAULT_MAX_CACHED_BYTES: u64 = 1 << 30;

impl Default for PoolConfig {
    /// Caches up to [`DEFAULT_MAX_CACHED_BYTES`] (1 GiB); reused blocks are not zeroed.
    fn default() -> Self {
        PoolConfig { max_cached_bytes: DEFAULT_MAX_CACHED_BYTES, zero_reused: false }
    }
}

impl PoolConfig {
    /// The default for `device`: caches up to 1 GiB or a quarter of the device's memory,
    /// whichever is less (devices that report no total get 1 GiB).
    pub fn for_device(device: &Device) -> PoolConfig {
        let total = device.info().total_memory;
        let cap = if total == 0 { DEFAULT_MAX_CACHED_BYTES } else { DEFAULT_MAX_CACHED_BYTES.min(total / 4) };
        PoolConfig { max_cached_bytes: cap, ..PoolConfig::default() }
    }
}

/// A pool's counters. Bytes are those of whole blocks (size classes), not of requests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Requests served from the cache.
    pub hits: u64,
    /// Requests the cache could not serve (each went upstream).
    pub misses: u64,
    /// Blocks the upstream allocated for this pool.
    pub allocations: u64,
    /// Bytes held by live buffers.
    pub bytes_in_use: u64,
    /// Bytes cached for reuse.
    pub bytes_cached: u64,
    /// The most bytes held by live buffers at once (since creation or the last reset).
    pub peak_bytes_in_use: u64,
    /// Allocations the upstream refused for lack of memory, after which the pool trimmed and
    /// retried once.
    pub oom_retries: u64,
}

/// What a pool holds of some kinds of memory now ([`CachingResource::usage`]), with the hits
/// and misses of requests for them since creation or the last reset. Bytes are those of
/// whole blocks, as in [`PoolStats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolUsage {
    /// Requests served from the cache.
    pub hits: u64,
    /// Requests the cache could not serve.
    pub misses: u64,
    /// Bytes of blocks handed out (held by live buffers).
    pub bytes_in_use: u64,
    /// Bytes of blocks cached for reuse.
    pub bytes_cached: u64,
    /// The number of blocks cached for reuse.
    pub cached_blocks: u64,
}

/// A slot in per-kind tables.
fn kind_index(kind: MemoryKind) -> usize {
    match kind {
        MemoryKind::Device => 0,
        MemoryKind::Host { pinned: false } => 1,
        MemoryKind::Host { pinned: true } => 2,
        MemoryKind::Shared => 3,
    }
}

/// The kinds, in [`kind_index`] order.
const KINDS: [MemoryKind; 4] = [
    MemoryKind::Device,
    MemoryKind::Host { pinned: false },
    MemoryKind::Host { pinned: true },
    MemoryKind::Shared,
];

/// One free list's identity: the device, the kind, and the block length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Key {
    device: DeviceId,
    kind: MemoryKind,
    bytes: usize,
}

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.device.0.get());
        state.write_u8(match self.kind {
            MemoryKind::Device => 0,
            MemoryKind::Host { pinned: false } => 1,
            MemoryKind::Host { pinned: true } => 2,
            MemoryKind::Shared => 3,
        });
        state.write_usize(self.bytes);
    }
}

/// A multiply-rotate hash for [`Key`]s: a few nanoseconds where SipHash takes tens, and keys
/// are not attacker-chosen.
#[derive(Default)]
struct KeyHasher(u64);

impl KeyHasher {
    fn mix(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        bytes.iter().for_each(|&b| self.mix(b.into()));
    }

    fn write_u8(&mut self, n: u8) {
        self.mix(n.into());
    }

    fn write_u64(&mut self, n: u64) {
        self.mix(n);
    }

    fn write_usize(&mut self, n: usize) {
        self.mix(n as u64);
    }

    fn finish(&self) -> u64 {
        // Classes are multiples of 64: move the product's well-mixed high bits down to where
        // the table takes its bucket index.
        self.0.rotate_left(26)
    }
}

/// A cached block, the stream it was last used on (memory a device addresses), and when that
/// use ends.
struct Cached {
    block: Block,
    stream: Option<Stream>,
    ready: Ticket,
}

impl Cached {
    /// Whether the block can go to a request on `stream` now.
    fn usable_on(&self, stream: &Stream) -> bool {
        let same_stream = self.stream.as_ref() == Some(stream);
        // A failed last use leaves nothing running: the block is free to use (its bytes are
        // unspecified, as for every reused block).
        same_stream || !matches!(self.ready.poll(), Ok(false))
    }
}

/// The cached blocks of one key, the device they belong to, and how many are handed out.
struct Slot {
    device: Device,
    free: Vec<Cached>,
    outstanding: usize,
}

type Slots = HashMap<Key, Slot, BuildHasherDefault<KeyHasher>>;

#[derive(Default)]
struct State {
    slots: Slots,
    stats: PoolStats,
    /// Hits and misses per kind ([`kind_index`]).
    kind_counts: [(u64, u64); 4],
}

/// Zeroes the first `bytes` of a reused block (its old contents must not show).
fn zero(block: &mut Block, stream: &Stream, bytes: usize) -> Result<()> {
    let n = bytes.min(block.len());
    match block {
        Block::Host(host) => {
            host.as_mut_slice()[..n].fill(0);
            Ok(())
        }
        Block::Device(memory) => stream.fill(memory, &[0], n)?.wait(),
    }
}

/// The device whose memory a block of `kind` for `device` is: the host device for host
/// blocks, whose cached bytes it reports.
fn memory_of(device: &Device, kind: MemoryKind) -> Device {
    match kind {
        MemoryKind::Host { .. } => Device::host(),
        MemoryKind::Device | MemoryKind::Shared => device.clone(),
    }
}

/// Gives a block upstream with the stream of its last use (the device's own stream for host
/// blocks, which carry none).
fn give_upstream(
    upstream: &dyn MemoryResource,
    device: &Device,
    block: Block,
    stream: Option<Stream>,
    ready: Ticket,
) {
    let stream = stream.unwrap_or_else(|| device.stream());
    upstream.deallocate(device, block, &stream, ready);
}

/// Whether freeing cached memory can make a failed allocation succeed.
fn exhausted(err: &Error) -> bool {
    err.is_out_of_memory() || matches!(err, Error::PinningFailed { .. })
}

/// Whether an upstream refused an allocation because of its size: exhausted, or an invalid
/// argument (the only argument is the size: beyond the device's largest allocation, say).
fn refused_for_size(err: &Error) -> bool {
    exhausted(err) || matches!(err, Error::InvalidArgument { .. })
}

/// A caching [`MemoryResource`] over an upstream one.
///
/// ```
/// use std::sync::Arc;
/// use lazybuf::{AllocationOptions, CachingResource, Device, DeviceAllocation, DirectResource, MemoryKind, PoolConfig};
///
/// let device = Device::host();
/// let cache = Arc::new(CachingResource::new(DirectResource::shared(), PoolConfig::for_device(&device), "host".into()));
/// let options = AllocationOptions { resource: Some(cache.clone()), ..Default::default() };
/// drop(DeviceAllocation::<u8>::with_options(&device, MemoryKind::Device, 1 << 20, options.clone())?);
/// let _again = DeviceAllocation::<u8>::with_options(&device, MemoryKind::Device, 1 << 20, options)?;
/// assert_eq!(cache.stats().hits, 1); // the second allocation reused the first one's block
/// # Ok::<(), lazybuf::Error>(())
/// ```
pub struct CachingResource {
    upstream: Arc<dyn MemoryResource>,
    config: PoolConfig,
    /// For messages: the pool's own device.
    name: String,
    /// A forked child whose parent's thread held it at the fork goes on without it: misses
    /// go upstream, returns too, and the counters read zero ([`ForkAwareMutex`]).
    state: ForkAwareMutex<State>,
}

impl CachingResource {
    /// A cache with `config` over `upstream`; `name` (the pool's device) shows in messages.
    pub fn new(upstream: Arc<dyn MemoryResource>, config: PoolConfig, name: String) -> Self {
        CachingResource { upstream, config, name, state: ForkAwareMutex::new(State::default()) }
    }

    /// Where misses go.
    pub fn upstream(&self) -> &Arc<dyn MemoryResource> {
        &self.upstream
    }

    /// The configuration.
    pub fn config(&self) -> PoolConfig {
        self.config
    }

    /// The counters now.
    pub fn stats(&self) -> PoolStats {
        self.lock().map(|state| state.stats).unwrap_or_default()
    }

    /// What the pool holds of the kinds `kinds` accepts, and the hits and misses of requests
    /// for them.
    pub fn usage(&self, kinds: impl Fn(MemoryKind) -> bool) -> PoolUsage {
        let mut usage = PoolUsage::default();
        let Some(state) = self.lock() else { return usage };
        for (kind, (hits, misses)) in KINDS.iter().zip(state.kind_counts) {
            if kinds(*kind) {
                usage.hits += hits;
                usage.misses += misses;
            }
        }
        for (key, slot) in state.slots.iter().filter(|(key, _)| kinds(key.kind)) {
            let bytes = key.bytes as u64;
            usage.bytes_in_use += slot.outstanding as u64 * bytes;
            usage.bytes_cached += slot.free.len() as u64 * bytes;
            usage.cached_blocks += slot.free.len() as u64;
        }
        usage
    }

    /// Frees every cached block upstream; returns their bytes.
    pub fn trim(&self) -> u64 {
        let blocks = {
            let Some(mut state) = self.lock() else { return 0 };
            state.stats.bytes_cached = 0;
            drain(&mut state.slots)
        };
        give_all(&*self.upstream, blocks)
    }

    /// Sets hits, misses, allocations and OOM retries to zero and the peak to the bytes in use.
    pub fn reset_counters(&self) {
        let Some(mut state) = self.lock() else { return };
        let stats = &mut state.stats;
        *stats = PoolStats {
            bytes_in_use: stats.bytes_in_use,
            bytes_cached: stats.bytes_cached,
            peak_bytes_in_use: stats.bytes_in_use,
            ..PoolStats::default()
        };
        state.kind_counts = Default::default();
    }

    #[cfg(feature = "testing")]
    /// Runs `f` while this thread holds the state's lock (for a test that forks meanwhile).
    pub(crate) fn with_state_locked<R>(&self, f: impl FnOnce() -> R) -> R {
        let _held = self.lock();
        f()
    }

    /// The state; `None` in a forked child whose parent's thread held it at the fork. (No code
    /// panics while holding the lock, so a poisoned state is still consistent.)
    fn lock(&self) -> Option<MutexGuard<'_, State>> {
        self.state.lock()
    }

    /// Pops a cached block of `key` that may be used on `stream`, counting a hit, or counts a
    /// miss.
    fn reuse(&self, key: Key, stream: &Stream) -> Option<Block> {
        self.reuse_counting(key, stream, true)
    }

    /// [`Self::reuse`]; a miss is counted (and recorded) only with `count_miss`. Waits for
    /// nothing: the lock is only ever held for bookkeeping and ticket polls.
    fn reuse_counting(&self, key: Key, stream: &Stream, count_miss: bool) -> Option<Block> {
        let mut state = self.lock()?;
        // Checked under the lock that a block's return takes too: a block cached by a racing
        // free after the caller's trim is not handed out while memory held is over its limit.
        let over_limit = crate::spill::budget::over_limit(stream.device(), key.kind);
        let State { slots, stats, kind_counts, .. } = &mut *state;
        let counts = &mut kind_counts[kind_index(key.kind)];
        let found = slots.get_mut(&key).filter(|_| !over_limit).and_then(|slot| {
            // The most recently cached usable block: the warmest in the caches.
            let index = slot.free.iter().rposition(|cached| cached.usable_on(stream))?;
            let cached = slot.free.swap_remove(index);
            slot.outstanding += 1;
            Some((cached.block, slot.device.clone()))
        });
        let record = found.is_some() || count_miss;
        let hit = found.is_some();
        let block = match found {
            Some((block, device)) => {
                let n = block.len() as u64;
                stats.hits += 1;
                counts.0 += 1;
                stats.bytes_cached -= n;
                stats.bytes_in_use += n;
                stats.peak_bytes_in_use = stats.peak_bytes_in_use.max(stats.bytes_in_use);
                memory_of(&device, key.kind).cached_bytes().fetch_sub(n, Ordering::Relaxed);
                Some(block)
            }
            None => {
                if count_miss {
                    stats.misses += 1;
                    counts.1 += 1;
                }
                None
            }
        };
        // Recorded after the pool's lock is released: the recorder may take its own lock (a
        // full chunk), which must never extend the pool's.
        drop(state);
        if record {
            crate::observe::trace::record_pool(hit, stream.device(), key.bytes);
        }
        block
    }

    /// Counts a fresh block from upstream as handed out.
    fn count_fresh(&self, device: &Device, block: &Block) {
        // Not counted in a child without the state: its return then goes upstream.
        let Some(mut state) = self.lock() else { return };
        let State { slots, stats, .. } = &mut *state;
        let slot = slots
            .entry(Key { device: device.id(), kind: block.kind(), bytes: block.len() })
            .or_insert_with(|| Slot { device: device.clone(), free: Vec::new(), outstanding: 0 });
        slot.outstanding += 1;
        stats.allocations += 1;
        stats.bytes_in_use += block.len() as u64;
        stats.peak_bytes_in_use = stats.peak_bytes_in_use.max(stats.bytes_in_use);
    }
}

/// Takes every cached block out of `slots`, dropping entries with nothing outstanding.
fn drain(slots: &mut Slots) -> Vec<(Device, Cached)> {
    let mut out = Vec::new();
    slots.retain(|_, slot| {
        out.extend(slot.free.drain(..).map(|cached| (slot.device.clone(), cached)));
        slot.outstanding > 0
    });
    out
}

/// Gives drained blocks upstream; returns their bytes. Each goes back on its own: an upstream
/// whose `deallocate` panics (code outside lazybuf) has the panic recorded on the device and
/// the other blocks still go back, whoever trims (a drop, an eviction pass for another
/// buffer's allocation).
fn give_all(upstream: &dyn MemoryResource, blocks: Vec<(Device, Cached)>) -> u64 {
    let mut freed = 0;
    for (device, cached) in blocks {
        let n = cached.block.len() as u64;
        freed += n;
        memory_of(&device, cached.block.kind()).cached_bytes().fetch_sub(n, Ordering::Relaxed);
        device.contain_panics("trim", || {
            give_upstream(upstream, &device, cached.block, cached.stream, cached.ready);
        });
    }
    freed
}

impl MemoryResource for CachingResource {
    /// A block of at least `bytes` of `kind` on `device` for `stream`: cached if one of the
    /// class fits and may be used, else fresh from upstream.
    fn allocate(&self, device: &Device, kind: MemoryKind, bytes: usize, stream: &Stream) -> Result<Block> {
        let fresh = |n: usize| self.upstream.allocate(device, kind, n, stream);
        let class = match class_size(bytes) {
            Some(class) if class > 0 => class,
            // Empty blocks cost nothing; sizes without a class
            // cannot be allocated anyway.
            _ => return self.upstream.allocate(device, kind, bytes, stream),
        };
        if crate::spill::budget::over_limit(device, kind) {
            // Memory held beyond a limit lowered below it: a cached block must not be handed
            // out (the limit holds after every allocation). The cache goes back; the request
            // below misses and takes the upstream's budgeted path, which evicts or refuses.
            self.trim();
        }
        if let Some(mut block) = self.reuse(Key { device: device.id(), kind, bytes: class }, stream) {
            if self.config.zero_reused
                && let Err(err) = zero(&mut block, stream, bytes)
            {
                self.deallocate(device, block, stream, Ticket::done());
                return Err(err);
            }
            return Ok(block);
        }
        let block = match fresh(class) {
            Err(err) if exhausted(&err) => {
                if let Some(mut state) = self.lock() {
                    state.stats.oom_retries += 1;
                }
                self.trim();
                fresh(class)
            }
            other => other,
        };
        // A class block the upstream refuses for its size (no memory for it, or beyond the
        // device's largest allocation) may still fit exactly; the error then names the size
        // the caller asked for. Any other failure surfaces as it is, never retried.
        let block = match block {
            Err(err) if class > bytes && refused_for_size(&err) => fresh(bytes)?,
            other => other?,
        };
        self.count_fresh(device, &block);
        Ok(block)
    }

    /// A cached host block of the class of `bytes`, if one is ready (see
    /// [`MemoryResource::allocate_host_now`]); zeroed as [`Self::allocate`] zeroes a reused
    /// block (on the host: a fill of its bytes).
    fn allocate_host_now(&self, device: &Device, bytes: usize, pinned: bool) -> Option<HostMemory> {
        let class = class_size(bytes).filter(|&class| class > 0)?;
        let kind = MemoryKind::Host { pinned };
        if crate::spill::budget::over_limit(device, kind) {
            // Beyond the host limit: the budgeted path decides ([`Self::allocate`]).
            return None;
        }
        let stream = device.stream();
        let mut block =
            self.reuse_counting(Key { device: device.id(), kind, bytes: class }, &stream, false)?;
        if self.config.zero_reused && zero(&mut block, &stream, bytes).is_err() {
            self.deallocate(device, block, &stream, Ticket::done());
            return None;
        }
        match block {
            Block::Host(host) => Some(host),
            other => {
                self.deallocate(device, other, &stream, Ticket::done());
                None
            }
        }
    }

    /// Takes a block back: cached if it is ours and fits under the cap, else freed upstream.
    fn deallocate(&self, device: &Device, block: Block, stream: &Stream, ready: Ticket) {
        let kind = block.kind();
        // Host blocks are reused only once their last use is done, whatever the stream.
        let stream = (!matches!(kind, MemoryKind::Host { .. })).then(|| stream.clone());
        let spare = if block.is_empty() {
            Some((block, stream, ready))
        } else {
            let key = Key { device: device.id(), kind, bytes: block.len() };
            let n = block.len() as u64;
            let cap = self.config.max_cached_bytes;
            // Over a memory limit (lowered below what is held) the block goes back upstream,
            // so that memory held comes down instead of waiting in the cache.
            let over_limit = crate::spill::budget::over_limit(device, kind);
            let mut state = self.lock();
            let Some(State { slots, stats, .. }) = state.as_deref_mut() else {
                drop(state);
                give_upstream(&*self.upstream, device, block, stream, ready);
                return;
            };
            match slots.get_mut(&key) {
                Some(slot) if slot.outstanding > 0 => {
                    slot.outstanding -= 1;
                    stats.bytes_in_use -= n;
                    if stats.bytes_cached.saturating_add(n) <= cap && !over_limit {
                        stats.bytes_cached += n;
                        memory_of(device, kind).cached_bytes().fetch_add(n, Ordering::Relaxed);
                        slot.free.push(Cached { block, stream, ready });
                        None
                    } else {
                        Some((block, stream, ready))
                    }
                }
                _ => Some((block, stream, ready)),
            }
        };
        if let Some((block, stream, ready)) = spare {
            give_upstream(&*self.upstream, device, block, stream, ready);
        }
    }
}

impl Drop for CachingResource {
    /// Gives every cached block back upstream (no buffer can still hold one: each holds the
    /// resource alive).
    fn drop(&mut self) {
        // Through exclusive access: no lock, so also in a forked child whose parent's thread
        // held it at the fork.
        let blocks = drain(&mut self.state.get_mut().slots);
        give_all(&*self.upstream, blocks);
    }
}

impl fmt::Debug for CachingResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachingResource")
            .field("pool_of", &self.name)
            .field("config", &self.config)
            .field("upstream", &self.upstream)
            .finish()
    }
}
