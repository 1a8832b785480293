//! [`FailureCallbackResource`]: a resource adaptor that asks a callback what to do when an
//! allocation runs out of memory (RMM's `failure_callback_resource_adaptor`).
//!
//! It wraps an upstream resource it owns and adds one concern: when the upstream refuses an
//! allocation for lack of memory ([`Error::is_out_of_memory`]), the callback is called with
//! the size asked for and the error; `Ok(true)` retries the allocation (after the callback
//! freed memory, say), `Ok(false)` returns the upstream's error, and the callback's own error
//! is returned as it is (a binding carries its exception in [`Error::Callback`]). Other
//! failures are returned at once. A callback that always says retry retries for ever.
//!
//! What does not live here: trimming caches on out-of-memory (the pool does that itself).

use std::fmt;
use std::sync::Arc;

use super::{Block, MemoryResource};
use crate::backend::{MemoryKind, Ticket};
use crate::device::{Device, Stream};
use crate::error::{Error, Result};

/// A failure callback: the bytes asked for and the upstream's error in, whether to retry out.
pub type FailureCallback = dyn Fn(usize, &Error) -> Result<bool> + Send + Sync;

/// Asks a callback whether to retry allocations its upstream refused for lack of memory.
///
/// ```
/// use std::sync::Arc;
/// use lazybuf::{AllocationOptions, Device, DeviceAllocation, DirectResource, FailureCallbackResource};
/// use lazybuf::{LimitingResource, MemoryKind};
///
/// // A 1 KiB limit stands in for a full device; the callback frees nothing and gives up.
/// let full = Arc::new(LimitingResource::new(DirectResource::shared(), 1024));
/// let resource = Arc::new(FailureCallbackResource::new(
///     full,
///     Arc::new(|bytes: usize, _: &lazybuf::Error| {
///         eprintln!("{bytes} bytes refused: free some memory, then return Ok(true) to retry");
///         Ok(false)
///     }),
/// ));
/// let options = AllocationOptions { resource: Some(resource), ..Default::default() };
/// let refused = DeviceAllocation::<u8>::with_options(&Device::host(), MemoryKind::Device, 4096, options);
/// assert!(refused.unwrap_err().is_out_of_memory());
/// ```
pub struct FailureCallbackResource {
    upstream: Arc<dyn MemoryResource>,
    callback: Arc<FailureCallback>,
}

impl FailureCallbackResource {
    /// Forwards to `upstream`, calling `callback` on out-of-memory.
    pub fn new(upstream: Arc<dyn MemoryResource>, callback: Arc<FailureCallback>) -> FailureCallbackResource {
        FailureCallbackResource { upstream, callback }
    }

    /// Where allocations go.
    pub fn upstream(&self) -> &Arc<dyn MemoryResource> {
        &self.upstream
    }
}

impl MemoryResource for FailureCallbackResource {
    fn allocate(&self, device: &Device, kind: MemoryKind, bytes: usize, stream: &Stream) -> Result<Block> {
        loop {
            match self.upstream.allocate(device, kind, bytes, stream) {
                Err(err) if err.is_out_of_memory() => {
                    if !(self.callback)(bytes, &err)? {
                        return Err(err);
                    }
                }
                other => return other,
            }
        }
    }

    fn deallocate(&self, device: &Device, block: Block, stream: &Stream, ready: Ticket) {
        self.upstream.deallocate(device, block, stream, ready);
    }
}

impl fmt::Debug for FailureCallbackResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FailureCallbackResource").field("upstream", &self.upstream).finish()
    }
}
