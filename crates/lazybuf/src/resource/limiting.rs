//! [`LimitingResource`]: a resource adaptor that refuses allocations beyond a byte limit.
//!
//! It wraps an upstream resource it owns and adds one concern: the bytes it has handed out
//! (blocks of every kind together, counted by their real length) never pass the
//! limit; a request that would pass it is an [`Error::OutOfMemory`], as a full device would
//! answer, so the policies above it (a pool's trim-and-retry) react as they would to the real
//! thing. Use it to cap a process's use of a device, or to test out-of-memory paths. The limit
//! can be changed at any time ([`LimitingResource::set_limit`]); lowering it below what is
//! held takes nothing back, later requests fail until enough is returned. Every
//! [`crate::MemoryPool`] keeps one between its cache and its upstream, unlimited until
//! [`crate::MemoryPool::set_limit`] sets it, so a pool's limit counts what it holds, handed out
//! and cached together.
//!
//! What does not live here: caching ([`super::CachingResource`]).

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{Block, MemoryResource};
use crate::backend::{MemoryKind, Ticket};
use crate::device::{Device, Stream};
use crate::error::{Error, Result};

/// Forwards to an upstream resource while the bytes held stay within a limit.
///
/// ```
/// use std::sync::Arc;
/// use lazybuf::{AllocationOptions, Device, DeviceAllocation, DirectResource, LimitingResource, MemoryKind};
///
/// let limiter = Arc::new(LimitingResource::new(DirectResource::shared(), 1 << 20));
/// let options = AllocationOptions { resource: Some(limiter.clone()), ..Default::default() };
/// let device = Device::host();
/// let first = DeviceAllocation::<u8>::with_options(&device, MemoryKind::Device, 768 << 10, options.clone())?;
/// assert_eq!(limiter.held(), 768 << 10);
/// let second = DeviceAllocation::<u8>::with_options(&device, MemoryKind::Device, 512 << 10, options);
/// assert!(second.unwrap_err().is_out_of_memory()); // over the limit
/// drop(first);
/// assert_eq!(limiter.held(), 0);
/// # Ok::<(), lazybuf::Error>(())
/// ```
pub struct LimitingResource {
    upstream: Arc<dyn MemoryResource>,
    limit: AtomicU64,
    held: AtomicU64,
}

impl LimitingResource {
    /// Lets `upstream` hand out at most `limit` bytes at a time through this resource.
    pub fn new(upstream: Arc<dyn MemoryResource>, limit: u64) -> LimitingResource {
        LimitingResource { upstream, limit: AtomicU64::new(limit), held: AtomicU64::new(0) }
    }

    /// A resource that forwards everything until a limit is set.
    pub fn unlimited(upstream: Arc<dyn MemoryResource>) -> LimitingResource {
        Self::new(upstream, u64::MAX)
    }

    /// Where allocations go.
    pub fn upstream(&self) -> &Arc<dyn MemoryResource> {
        &self.upstream
    }

    /// The limit in bytes (`u64::MAX`: none).
    pub fn limit(&self) -> u64 {
        self.limit.load(Ordering::SeqCst)
    }

    /// Changes the limit (`u64::MAX`: none). Blocks held beyond a lowered limit stay where
    /// they are; requests fail until the bytes held are below it again.
    pub fn set_limit(&self, limit: u64) {
        self.limit.store(limit, Ordering::SeqCst);
    }

    /// The bytes handed out and not yet returned.
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::SeqCst)
    }

    /// Reserves `bytes` under the limit, or says why not.
    fn reserve(&self, device: &Device, bytes: usize) -> Result<()> {
        let n = bytes as u64;
        let limit = self.limit();
        self.held
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |held| {
                held.checked_add(n).filter(|&total| total <= limit)
            })
            .map(drop)
            .map_err(|held| Error::OutOfMemory {
                device: format!("{device} (the limit is {limit} bytes; {held} are held)"),
                requested: bytes,
                code: None,
            })
    }

    fn unreserve(&self, bytes: usize) {
        let n = bytes as u64;
        // The closure always returns Some, so the update cannot fail.
        let _ =
            self.held.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |held| Some(held.saturating_sub(n)));
    }
}

impl MemoryResource for LimitingResource {
    fn allocate(&self, device: &Device, kind: MemoryKind, bytes: usize, stream: &Stream) -> Result<Block> {
        self.reserve(device, bytes)?;
        // Given back if the upstream panics (code outside lazybuf): the limit keeps no bytes
        // nobody holds.
        let reserved = super::OnUnwind::new(|| self.unreserve(bytes));
        let allocated = self.upstream.allocate(device, kind, bytes, stream);
        reserved.disarm();
        match allocated {
            Ok(block) => {
                // Count the block's real length, which may exceed the request (a pool's size
                // class): the excess is reserved under the limit too, or the block goes back.
                let actual = block.len();
                if actual > bytes {
                    if self.reserve(device, actual - bytes).is_err() {
                        self.upstream.deallocate(device, block, stream, Ticket::done());
                        self.unreserve(bytes);
                        return Err(Error::OutOfMemory {
                            device: format!(
                                "{device} (the limit is {} bytes; {} are held; the upstream's block \
                                 for {bytes} bytes is {actual} bytes long)",
                                self.limit(),
                                self.held()
                            ),
                            requested: bytes,
                            code: None,
                        });
                    }
                } else {
                    self.unreserve(bytes - actual);
                }
                Ok(block)
            }
            Err(err) => {
                self.unreserve(bytes);
                Err(err)
            }
        }
    }

    fn deallocate(&self, device: &Device, block: Block, stream: &Stream, ready: Ticket) {
        self.unreserve(block.len());
        self.upstream.deallocate(device, block, stream, ready);
    }
}

impl fmt::Debug for LimitingResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimitingResource")
            .field("limit", &self.limit())
            .field("held", &self.held())
            .field("upstream", &self.upstream)
            .finish()
    }
}
