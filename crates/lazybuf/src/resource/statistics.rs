//! [`StatisticsResource`]: a resource adaptor that counts what passes through it, as RMM's
//! `statistics_resource_adaptor` does.
//!
//! It wraps an upstream resource it owns and adds one concern: counters of bytes and of
//! allocations, each with its current value, its peak and its running total. Bytes are the
//! bytes *asked for* (a block the upstream rounds up counts as the request), remembered per
//! block until it comes back. The counters form a stack: [`StatisticsResource::push_counters`]
//! starts a fresh level (for one phase of a program), [`StatisticsResource::pop_counters`]
//! ends it and folds it into the level below (`peak = max(peak, value + inner peak)`, value and
//! total added), so the bottom level always covers everything. An inner level's current
//! values go negative when it frees memory allocated before it began.
//!
//! What does not live here: per-allocation records for leak hunting ([`super::TrackingResource`]).

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, MutexGuard};

use super::tracking::block_key;
use super::{Block, MemoryResource};
use crate::backend::fork::ForkAwareMutex;
use crate::backend::{MemoryKind, Ticket};
use crate::coherence::DeviceId;
use crate::device::{Device, Stream};
use crate::error::Result;

/// One level's counters: bytes and allocations, each current, peak and total.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Statistics {
    /// Bytes allocated and not yet given back (negative in a level that freed older memory).
    pub current_bytes: i64,
    /// Allocations not yet given back.
    pub current_count: i64,
    /// The most bytes outstanding at once.
    pub peak_bytes: i64,
    /// The most allocations outstanding at once.
    pub peak_count: i64,
    /// Bytes allocated in all.
    pub total_bytes: i64,
    /// Allocations in all.
    pub total_count: i64,
}

impl Statistics {
    fn add(&mut self, bytes: i64, count: i64) {
        self.current_bytes += bytes;
        self.current_count += count;
        if bytes > 0 || count > 0 {
            self.total_bytes += bytes.max(0);
            self.total_count += count.max(0);
        }
        self.peak_bytes = self.peak_bytes.max(self.current_bytes);
        self.peak_count = self.peak_count.max(self.current_count);
    }

    /// Folds an inner level into this one.
    fn absorb(&mut self, inner: &Statistics) {
        self.peak_bytes = self.peak_bytes.max(self.current_bytes + inner.peak_bytes);
        self.peak_count = self.peak_count.max(self.current_count + inner.peak_count);
        self.current_bytes += inner.current_bytes;
        self.current_count += inner.current_count;
        self.total_bytes += inner.total_bytes;
        self.total_count += inner.total_count;
    }
}

#[derive(Default)]
struct State {
    /// Never empty: the bottom level covers everything.
    stack: Vec<Statistics>,
    /// The bytes asked for, per outstanding non-empty block.
    requested: HashMap<(DeviceId, usize), usize>,
}

/// Counts bytes and allocations passing to an upstream resource it owns.
///
/// ```
/// use std::sync::Arc;
/// use lazybuf::{AllocationOptions, Device, DeviceAllocation, DirectResource, MemoryKind, StatisticsResource};
///
/// let stats = Arc::new(StatisticsResource::new(DirectResource::shared()));
/// let options = AllocationOptions { resource: Some(stats.clone()), ..Default::default() };
/// let a = DeviceAllocation::<u8>::with_options(&Device::host(), MemoryKind::Device, 1000, options)?;
/// assert_eq!(stats.statistics().current_bytes, 1000);
/// drop(a);
/// let s = stats.statistics();
/// assert_eq!((s.current_bytes, s.peak_bytes, s.total_count), (0, 1000, 1));
/// # Ok::<(), lazybuf::Error>(())
/// ```
pub struct StatisticsResource {
    upstream: Arc<dyn MemoryResource>,
    /// A forked child whose parent's thread held it at the fork counts nothing
    /// ([`ForkAwareMutex`]): allocations pass through, the counters read zero.
    state: ForkAwareMutex<State>,
}

impl StatisticsResource {
    /// Counts what `upstream` hands out through this resource.
    pub fn new(upstream: Arc<dyn MemoryResource>) -> StatisticsResource {
        let state = State { stack: vec![Statistics::default()], requested: HashMap::new() };
        StatisticsResource { upstream, state: ForkAwareMutex::new(state) }
    }

    /// Where allocations go.
    pub fn upstream(&self) -> &Arc<dyn MemoryResource> {
        &self.upstream
    }

    /// The state; `None` in a forked child whose parent's thread held it at the fork.
    /// (Nothing panics while holding the lock.)
    fn lock(&self) -> Option<MutexGuard<'_, State>> {
        self.state.lock()
    }

    /// The counters of the current (top) level.
    pub fn statistics(&self) -> Statistics {
        self.lock().and_then(|state| state.stack.last().copied()).unwrap_or_default()
    }

    /// Starts a new level of zeroed counters; returns the level below as it was.
    pub fn push_counters(&self) -> Statistics {
        let Some(mut state) = self.lock() else { return Statistics::default() };
        let top = state.stack.last().copied().unwrap_or_default();
        state.stack.push(Statistics::default());
        top
    }

    /// Ends the top level, folds it into the one below and returns it; `None` (and nothing
    /// changes) when only the bottom level is left.
    pub fn pop_counters(&self) -> Option<Statistics> {
        let mut state = self.lock()?;
        if state.stack.len() < 2 {
            return None;
        }
        let top = state.stack.pop()?;
        if let Some(below) = state.stack.last_mut() {
            below.absorb(&top);
        }
        Some(top)
    }

    /// The number of levels (1 without pushes).
    pub fn depth(&self) -> usize {
        self.lock().map_or(1, |state| state.stack.len())
    }
}

impl MemoryResource for StatisticsResource {
    fn allocate(&self, device: &Device, kind: MemoryKind, bytes: usize, stream: &Stream) -> Result<Block> {
        let block = self.upstream.allocate(device, kind, bytes, stream)?;
        let Some(mut state) = self.lock() else { return Ok(block) };
        if let Some(key) = block_key(device, &block) {
            state.requested.insert(key, bytes);
        }
        if let Some(top) = state.stack.last_mut() {
            top.add(bytes as i64, 1);
        }
        Ok(block)
    }

    fn deallocate(&self, device: &Device, block: Block, stream: &Stream, ready: Ticket) {
        if let Some(mut state) = self.lock() {
            let bytes = match block_key(device, &block) {
                Some(key) => state.requested.remove(&key).unwrap_or(block.len()),
                None => 0,
            };
            if let Some(top) = state.stack.last_mut() {
                top.add(-(bytes as i64), -1);
            }
        }
        self.upstream.deallocate(device, block, stream, ready);
    }
}

impl fmt::Debug for StatisticsResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StatisticsResource")
            .field("statistics", &self.statistics())
            .field("upstream", &self.upstream)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::Statistics;

    fn level(current: i64, peak: i64, total: i64) -> Statistics {
        Statistics {
            current_bytes: current * 10,
            current_count: current,
            peak_bytes: peak * 10,
            peak_count: peak,
            total_bytes: total * 10,
            total_count: total,
        }
    }

    /// RMM's `test_counter_stack` arithmetic: ten 10-byte allocations, then nested levels
    /// that allocate and free (an inner level goes negative), folded back in.
    #[test]
    fn counter_stack_folds_as_rmm() {
        let mut bottom = Statistics::default();
        (0..10).for_each(|_| bottom.add(10, 1));
        assert_eq!(bottom, level(10, 10, 10));
        let mut inner = Statistics::default();
        inner.add(10, 1); // b1
        let mut innermost = Statistics::default();
        innermost.add(-10, -1); // del b1, allocated before this level
        assert_eq!(innermost, level(-1, 0, 0));
        inner.absorb(&innermost);
        assert_eq!(inner, level(0, 1, 1));
        inner.add(10, 1);
        inner.add(10, 1);
        inner.add(-10, -1);
        bottom.absorb(&inner);
        assert_eq!(bottom, level(11, 12, 13));
    }
}
