//! The pool's memory resource: free lists of blocks keyed by device, memory kind (host,
//! pinned host, device) and size class, over an upstream resource that serves every miss.
//!
//! - **Take**: a request is rounded up to its size class ([`super::size_class`]); a cached
//!   block of that class on that device and kind is a hit, handed out as it is (or zeroed
//!   first with `zero_reused`). A miss asks the upstream for a block of the class size.
//! - **Give back**: a block goes onto its free list unless that would push the cached bytes
//!   over the cap; then it goes back upstream.
//! - **Out of memory** (or a refused page lock, which cached pinned blocks may be causing):
//!   trim every cached block, retry once, and if the upstream still refuses, return its error
//!   as it is (it names the device, the size and the runtime's code).
//! - **Accounting**: every block is counted by its real length, under the key its own length
//!   and kind give, so a block larger than asked for still balances. A block this resource did
//!   not hand out (no block of its key is outstanding) goes straight upstream, uncounted.
//!   Empty requests bypass the cache: an empty block costs nothing.
//!
//! One mutex guards the free lists and the counters; it is never held across an upstream
//! call, a fill or a free, only across a hash lookup and a push or pop.
//!
//! What does not live here: the public handle ([`super::MemoryPool`]).

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::size_class::class_size;
use super::{PoolConfig, PoolStats};
use crate::backend::DeviceMemory;
use crate::coherence::DeviceId;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::host_memory::HostMemory;
use crate::resource::MemoryResource;

/// What kind of memory a free list holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Host,
    PinnedHost,
    Device,
}

/// One free list's identity: the device, the kind, and the block length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Key {
    device: DeviceId,
    kind: Kind,
    bytes: usize,
}

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.device.0);
        state.write_u8(self.kind as u8);
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

/// The cached blocks of one key, the device they belong to, and how many are handed out.
struct Slot<B> {
    device: Device,
    free: Vec<B>,
    outstanding: usize,
}

type Slots<B> = HashMap<Key, Slot<B>, BuildHasherDefault<KeyHasher>>;

#[derive(Default)]
struct State {
    host: Slots<HostMemory>,
    device: Slots<DeviceMemory>,
    stats: PoolStats,
}

/// What the pool needs to know about a kind of block.
trait Block: Sized {
    fn len(&self) -> usize;
    fn kind(&self) -> Kind;
    /// This kind's free lists and the counters, borrowed apart.
    fn split(state: &mut State) -> (&mut Slots<Self>, &mut PoolStats);
    fn give_upstream(self, upstream: &dyn MemoryResource, device: &Device);
    /// Zeroes the first `bytes` (a reused block's old contents must not show).
    fn zero(&mut self, device: &Device, bytes: usize) -> Result<()>;
}

impl Block for HostMemory {
    fn len(&self) -> usize {
        HostMemory::len(self)
    }

    fn kind(&self) -> Kind {
        if self.is_pinned() { Kind::PinnedHost } else { Kind::Host }
    }

    fn split(state: &mut State) -> (&mut Slots<Self>, &mut PoolStats) {
        (&mut state.host, &mut state.stats)
    }

    fn give_upstream(self, upstream: &dyn MemoryResource, device: &Device) {
        upstream.deallocate_host(device, self);
    }

    fn zero(&mut self, _device: &Device, bytes: usize) -> Result<()> {
        let n = bytes.min(self.len());
        self.as_mut_slice()[..n].fill(0);
        Ok(())
    }
}

impl Block for DeviceMemory {
    fn len(&self) -> usize {
        DeviceMemory::len(self)
    }

    fn kind(&self) -> Kind {
        Kind::Device
    }

    fn split(state: &mut State) -> (&mut Slots<Self>, &mut PoolStats) {
        (&mut state.device, &mut state.stats)
    }

    fn give_upstream(self, upstream: &dyn MemoryResource, device: &Device) {
        upstream.deallocate_device(device, self);
    }

    fn zero(&mut self, device: &Device, bytes: usize) -> Result<()> {
        let n = bytes.min(self.len());
        device.backend().fill(self, &[0], n)
    }
}

/// Whether freeing cached memory can make a failed allocation succeed.
fn exhausted(err: &Error) -> bool {
    err.is_out_of_memory() || matches!(err, Error::PinningFailed { .. })
}

/// A caching [`MemoryResource`] over an upstream one.
pub(crate) struct PoolResource {
    upstream: Arc<dyn MemoryResource>,
    config: PoolConfig,
    /// For messages: the pool's own device.
    name: String,
    state: Mutex<State>,
}

impl PoolResource {
    pub(crate) fn new(upstream: Arc<dyn MemoryResource>, config: PoolConfig, name: String) -> Self {
        PoolResource { upstream, config, name, state: Mutex::new(State::default()) }
    }

    pub(crate) fn upstream(&self) -> &Arc<dyn MemoryResource> {
        &self.upstream
    }

    pub(crate) fn config(&self) -> PoolConfig {
        self.config
    }

    pub(crate) fn stats(&self) -> PoolStats {
        self.lock().stats
    }

    /// Frees every cached block upstream; returns their bytes.
    pub(crate) fn trim(&self) -> u64 {
        let (host, device) = {
            let mut state = self.lock();
            state.stats.bytes_cached = 0;
            (drain(&mut state.host), drain(&mut state.device))
        };
        let mut freed = 0;
        for (device, block) in host {
            freed += block.len() as u64;
            block.give_upstream(&*self.upstream, &device);
        }
        for (device, block) in device {
            freed += block.len() as u64;
            block.give_upstream(&*self.upstream, &device);
        }
        freed
    }

    /// Sets hits, misses, allocations and OOM retries to zero and the peak to the bytes in use.
    pub(crate) fn reset_counters(&self) {
        let mut state = self.lock();
        let stats = &mut state.stats;
        *stats = PoolStats {
            bytes_in_use: stats.bytes_in_use,
            bytes_cached: stats.bytes_cached,
            peak_bytes_in_use: stats.bytes_in_use,
            ..PoolStats::default()
        };
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // No code panics while holding the lock, so a poisoned state is still consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A block of at least `bytes` of `kind` on `device`: cached if one fits, else fresh.
    fn take<B: Block>(
        &self,
        device: &Device,
        kind: Kind,
        bytes: usize,
        fresh: impl Fn(usize) -> Result<B>,
    ) -> Result<B> {
        let class = match class_size(bytes) {
            Some(class) if class > 0 => class,
            // Empty blocks cost nothing; sizes without a class cannot be allocated anyway.
            _ => return fresh(bytes),
        };
        if let Some(mut block) = self.reuse::<B>(Key { device: device.id(), kind, bytes: class }) {
            if self.config.zero_reused
                && let Err(err) = block.zero(device, bytes)
            {
                self.give(device, block);
                return Err(err);
            }
            return Ok(block);
        }
        let block = match fresh(class) {
            Err(err) if exhausted(&err) => {
                self.lock().stats.oom_retries += 1;
                self.trim();
                fresh(class)?
            }
            other => other?,
        };
        let mut state = self.lock();
        let (slots, stats) = B::split(&mut state);
        let slot = slots
            .entry(Key { device: device.id(), kind: block.kind(), bytes: block.len() })
            .or_insert_with(|| Slot { device: device.clone(), free: Vec::new(), outstanding: 0 });
        slot.outstanding += 1;
        stats.allocations += 1;
        stats.bytes_in_use += block.len() as u64;
        stats.peak_bytes_in_use = stats.peak_bytes_in_use.max(stats.bytes_in_use);
        Ok(block)
    }

    /// Pops a cached block of `key`, counting a hit, or counts a miss.
    fn reuse<B: Block>(&self, key: Key) -> Option<B> {
        let mut state = self.lock();
        let (slots, stats) = B::split(&mut state);
        let block = slots.get_mut(&key).and_then(|slot| {
            let block = slot.free.pop()?;
            slot.outstanding += 1;
            Some(block)
        });
        match &block {
            Some(block) => {
                let n = block.len() as u64;
                stats.hits += 1;
                stats.bytes_cached -= n;
                stats.bytes_in_use += n;
                stats.peak_bytes_in_use = stats.peak_bytes_in_use.max(stats.bytes_in_use);
            }
            None => stats.misses += 1,
        }
        block
    }

    /// Takes a block back: cached if it is ours and fits under the cap, else freed upstream.
    fn give<B: Block>(&self, device: &Device, block: B) {
        let spare = if block.len() == 0 {
            Some(block)
        } else {
            let key = Key { device: device.id(), kind: block.kind(), bytes: block.len() };
            let n = block.len() as u64;
            let cap = self.config.max_cached_bytes;
            let mut state = self.lock();
            let (slots, stats) = B::split(&mut state);
            match slots.get_mut(&key) {
                Some(slot) if slot.outstanding > 0 => {
                    slot.outstanding -= 1;
                    stats.bytes_in_use -= n;
                    if stats.bytes_cached.saturating_add(n) <= cap {
                        stats.bytes_cached += n;
                        slot.free.push(block);
                        None
                    } else {
                        Some(block)
                    }
                }
                _ => Some(block),
            }
        };
        if let Some(block) = spare {
            block.give_upstream(&*self.upstream, device);
        }
    }
}

/// Takes every cached block out of `slots`, dropping entries with nothing outstanding.
fn drain<B>(slots: &mut Slots<B>) -> Vec<(Device, B)> {
    let mut out = Vec::new();
    slots.retain(|_, slot| {
        out.extend(slot.free.drain(..).map(|block| (slot.device.clone(), block)));
        slot.outstanding > 0
    });
    out
}

impl MemoryResource for PoolResource {
    fn allocate_host(&self, device: &Device, bytes: usize, pinned: bool) -> Result<HostMemory> {
        let kind = if pinned { Kind::PinnedHost } else { Kind::Host };
        self.take(device, kind, bytes, |n| self.upstream.allocate_host(device, n, pinned))
    }

    fn allocate_device(&self, device: &Device, bytes: usize) -> Result<DeviceMemory> {
        self.take(device, Kind::Device, bytes, |n| self.upstream.allocate_device(device, n))
    }

    fn deallocate_host(&self, device: &Device, block: HostMemory) {
        self.give(device, block);
    }

    fn deallocate_device(&self, device: &Device, memory: DeviceMemory) {
        self.give(device, memory);
    }
}

impl Drop for PoolResource {
    /// Gives every cached block back upstream (no buffer can still hold one: each holds the
    /// pool alive).
    fn drop(&mut self) {
        self.trim();
    }
}

impl fmt::Debug for PoolResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolResource")
            .field("pool_of", &self.name)
            .field("config", &self.config)
            .field("upstream", &self.upstream)
            .finish()
    }
}
