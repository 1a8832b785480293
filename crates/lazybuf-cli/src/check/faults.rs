//! [`FailingResource`]: the memory resource `check` gives its buffers, which forwards to
//! lazybuf's [`DirectResource`] (every block straight from the backend, so allocations are
//! counted exactly) and can be told to fail its n-th allocation from now with the
//! out-of-memory error a full device gives.
//!
//! This is fault injection through lazybuf's public resource interface, with no test-only
//! code in the library: the contract says a failed allocation returns an error and changes
//! nothing, and `check` verifies that on every device.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use lazybuf::backend::MemoryKind;
use lazybuf::{Block, Device, DirectResource, Error, MemoryResource, Stream, Ticket};

/// Words every injected failure's message contains.
pub const MARK: &str = "injected by lazybuf check";

/// A resource that fails the allocation it is told to.
#[derive(Default)]
pub struct FailingResource {
    attempts: AtomicU64,
    /// The attempt number that fails (0: none).
    fail_at: AtomicU64,
    fired: AtomicU64,
}

impl FailingResource {
    /// A new resource with no failure armed.
    pub fn new() -> Arc<FailingResource> {
        Arc::new(FailingResource::default())
    }

    /// Makes the `n`-th allocation from now fail (`n` from 1); 0 disarms.
    pub fn fail_in(&self, n: u64) {
        let done = self.attempts.load(Ordering::SeqCst);
        self.fail_at.store(if n == 0 { 0 } else { done + n }, Ordering::SeqCst);
    }

    /// Disarms.
    pub fn disarm(&self) {
        self.fail_at.store(0, Ordering::SeqCst);
    }

    /// Allocations attempted so far.
    pub fn attempts(&self) -> u64 {
        self.attempts.load(Ordering::SeqCst)
    }

    /// Failures injected so far.
    pub fn fired(&self) -> u64 {
        self.fired.load(Ordering::SeqCst)
    }

    /// Whether `err` is a failure this resource injected.
    pub fn is_injected(err: &Error) -> bool {
        matches!(err, Error::OutOfMemory { device, .. } if device.contains(MARK))
    }
}

impl MemoryResource for FailingResource {
    fn allocate(
        &self,
        device: &Device,
        kind: MemoryKind,
        bytes: usize,
        stream: &Stream,
    ) -> lazybuf::Result<Block> {
        let n = self.attempts.fetch_add(1, Ordering::SeqCst) + 1;
        if self.fail_at.compare_exchange(n, 0, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
            self.fired.fetch_add(1, Ordering::SeqCst);
            return Err(Error::OutOfMemory {
                device: format!("{device} ({} memory, allocation #{n} {MARK})", kind.name()),
                requested: bytes,
                code: None,
            });
        }
        DirectResource.allocate(device, kind, bytes, stream)
    }

    fn deallocate(&self, device: &Device, block: Block, stream: &Stream, ready: Ticket) {
        DirectResource.deallocate(device, block, stream, ready);
    }
}

impl fmt::Debug for FailingResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FailingResource")
            .field("attempts", &self.attempts())
            .field("fail_at", &self.fail_at.load(Ordering::SeqCst))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_armed_allocation_fails_once_and_says_it_was_injected() {
        let resource = FailingResource::new();
        let device = Device::host();
        let stream = device.stream();
        let kind = MemoryKind::Host { pinned: false };
        resource.fail_in(2);
        let first = resource.allocate(&device, kind, 64, &stream).unwrap();
        let err = resource.allocate(&device, kind, 64, &stream).unwrap_err();
        assert!(FailingResource::is_injected(&err), "{err}");
        assert!(err.to_string().contains("allocation #2"), "{err}");
        let third = resource.allocate(&device, kind, 64, &stream).unwrap();
        assert_eq!((resource.attempts(), resource.fired()), (3, 1));
        for block in [first, third] {
            resource.deallocate(&device, block, &stream, Ticket::done());
        }
    }
}
