//! [`TrackingResource`]: a resource adaptor that records every allocation outstanding through
//! it, for leak hunting (RMM's `tracking_resource_adaptor`).
//!
//! It wraps an upstream resource it owns and adds one concern: a record per outstanding
//! block (its address, the bytes asked for, its kind and device, and optionally the call stack
//! that allocated it), taken when the upstream hands the block out and dropped when it comes
//! back. [`TrackingResource::outstanding`] lists them; [`TrackingResource::report`] prints
//! them one per line. Empty blocks have no address and are not tracked. A block given back
//! that was never tracked (allocated before the adaptor, through another resource) goes
//! upstream uncounted.
//!
//! What does not live here: counters ([`super::StatisticsResource`]).

use std::backtrace::Backtrace;
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, MutexGuard};

use super::{Block, MemoryResource};
use crate::backend::fork::ForkAwareMutex;
use crate::backend::{MemoryKind, Ticket};
use crate::coherence::DeviceId;
use crate::device::{Device, Stream};
use crate::error::Result;

/// The identity of a non-empty block: its device and its address (a host address, a device
/// pointer, or a `cl_mem` handle); `None` for empty blocks.
pub(super) fn block_key(device: &Device, block: &Block) -> Option<(DeviceId, usize)> {
    if block.is_empty() {
        return None;
    }
    let address = match block {
        Block::Host(host) => host.as_ptr() as usize,
        // SAFETY: the handle is only read as a number, never used to reach the memory.
        Block::Device(memory) => unsafe { memory.raw() }.identity(),
    };
    Some((device.id(), address))
}

/// One outstanding allocation.
#[derive(Clone, Debug)]
pub struct Outstanding {
    /// Its address (host address, device pointer or `cl_mem` handle).
    pub address: usize,
    /// The bytes asked for.
    pub bytes: usize,
    /// Its kind.
    pub kind: MemoryKind,
    /// The device it was allocated for, by name.
    pub device: String,
    /// The call stack that allocated it, when the resource captures stacks.
    pub stack: Option<String>,
}

/// Records the allocations outstanding through it, over an upstream resource it owns.
///
/// ```
/// use std::sync::Arc;
/// use lazybuf::{AllocationOptions, Device, DeviceAllocation, DirectResource, MemoryKind, TrackingResource};
///
/// let tracker = Arc::new(TrackingResource::new(DirectResource::shared(), false));
/// let options = AllocationOptions { resource: Some(tracker.clone()), ..Default::default() };
/// let leak = DeviceAllocation::<u8>::with_options(&Device::host(), MemoryKind::Device, 4096, options)?;
/// assert_eq!(tracker.outstanding().len(), 1); // one allocation not given back yet
/// println!("{}", tracker.report());
/// drop(leak);
/// assert!(tracker.outstanding().is_empty());
/// # Ok::<(), lazybuf::Error>(())
/// ```
pub struct TrackingResource {
    upstream: Arc<dyn MemoryResource>,
    capture_stacks: bool,
    /// A forked child whose parent's thread held it at the fork tracks nothing
    /// ([`ForkAwareMutex`]).
    records: ForkAwareMutex<HashMap<(DeviceId, usize), Outstanding>>,
    allocated: AtomicU64,
}

impl TrackingResource {
    /// Tracks what `upstream` hands out through this resource; with `capture_stacks`, each
    /// record keeps the call stack that allocated it (costly: for debugging).
    pub fn new(upstream: Arc<dyn MemoryResource>, capture_stacks: bool) -> TrackingResource {
        TrackingResource {
            upstream,
            capture_stacks,
            records: ForkAwareMutex::default(),
            allocated: AtomicU64::new(0),
        }
    }

    /// Where allocations go.
    pub fn upstream(&self) -> &Arc<dyn MemoryResource> {
        &self.upstream
    }

    /// The records; `None` in a forked child whose parent's thread held them at the fork.
    /// (Nothing panics while holding the lock.)
    fn lock(&self) -> Option<MutexGuard<'_, HashMap<(DeviceId, usize), Outstanding>>> {
        self.records.lock()
    }

    /// The bytes outstanding (as asked for).
    pub fn allocated_bytes(&self) -> u64 {
        self.allocated.load(Ordering::SeqCst)
    }

    /// The allocations outstanding, by address.
    pub fn outstanding(&self) -> Vec<Outstanding> {
        let mut all: Vec<Outstanding> =
            self.lock().map(|r| r.values().cloned().collect()).unwrap_or_default();
        all.sort_by_key(|o| o.address);
        all
    }

    /// One line per outstanding allocation (`0x7f..: 256 B (device on <device>)`), each
    /// followed by its call stack when stacks are captured; empty when nothing is outstanding.
    pub fn report(&self) -> String {
        let mut out = String::new();
        for o in self.outstanding() {
            out += &format!("{:#x}: {} B ({} on {})\n", o.address, o.bytes, o.kind.name(), o.device);
            if let Some(stack) = &o.stack {
                out += &format!(" : callstack:\n{stack}\n");
            }
        }
        out
    }
}

impl MemoryResource for TrackingResource {
    fn allocate(&self, device: &Device, kind: MemoryKind, bytes: usize, stream: &Stream) -> Result<Block> {
        let block = self.upstream.allocate(device, kind, bytes, stream)?;
        if let Some(key) = block_key(device, &block) {
            let stack = self.capture_stacks.then(|| Backtrace::force_capture().to_string());
            let record = Outstanding { address: key.1, bytes, kind, device: device.to_string(), stack };
            // A live block's address is unique, so no record is replaced.
            let Some(mut records) = self.lock() else { return Ok(block) };
            if let Some(stale) = records.insert(key, record) {
                self.allocated.fetch_sub(stale.bytes as u64, Ordering::SeqCst);
            }
            self.allocated.fetch_add(bytes as u64, Ordering::SeqCst);
        }
        Ok(block)
    }

    fn deallocate(&self, device: &Device, block: Block, stream: &Stream, ready: Ticket) {
        if let Some(key) = block_key(device, &block)
            && let Some(record) = self.lock().and_then(|mut records| records.remove(&key))
        {
            self.allocated.fetch_sub(record.bytes as u64, Ordering::SeqCst);
        }
        self.upstream.deallocate(device, block, stream, ready);
    }
}

impl fmt::Debug for TrackingResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TrackingResource")
            .field("outstanding", &self.lock().map_or(0, |records| records.len()))
            .field("allocated_bytes", &self.allocated_bytes())
            .field("upstream", &self.upstream)
            .finish()
    }
}
