//! Making room: what happens before lazybuf takes memory from a backend.
//!
//! [`allocate_within_budget`] wraps every device allocation of [`crate::DirectResource`]:
//!
//! 1. **Under a limit** ([`super::set_memory_limit`]): when the request does not fit, the
//!    cached blocks of every live pool of the device (its default pool and private ones made
//!    with [`crate::MemoryPool::new`]) and backend staging are trimmed first; then device copies of
//!    registered buffers are evicted, least recently used first, trimming again after each
//!    (an evicted copy's memory goes back to its buffer's resource, often the pool), until the
//!    request fits. If nothing more can be evicted, the allocation fails with
//!    [`Error::OutOfMemory`] naming the limit (and that plain `UnifiedBuffer`s, owned by
//!    value, are never evicted), and nothing was lost. A write-back that failed on the way is
//!    returned as [`Error::WriteBack`], naming the evicted buffer.
//! 2. **Without a limit**, when the backend reports out-of-memory: the same trimming and
//!    eviction until the request's bytes were freed, then the allocation is tried once more.
//! 3. **Without either**, nothing here runs but the counting of held bytes.
//!
//! [`allocate_host_within_budget`] wraps its host allocations: under a host limit
//! ([`super::set_host_memory_limit`]) it trims the caches, then writes the host copies of least
//! recently used shared buffers to spill files ([`super::disk`]) until the request fits.
//!
//! Eviction never waits for a buffer's lock ([`super::registry`]), so a thread that allocates
//! while it holds its own buffer's lock (every buffer access does) cannot deadlock against
//! another one doing the same.
//!
//! What does not live here: the eviction of one copy ([`crate::RawBuffer::evict_device_copy`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use super::budget::{self, Ledger};
use super::registry;
use super::stats;
use crate::backend::fork::ForkAwareOnce;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::resource::{Block, OnUnwind};

/// How an evicted copy that is *not* the only current one is treated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EvictionPolicy {
    /// Freed moving no byte (the default; what lazybuf's knowledge of copies buys).
    #[default]
    CoherenceAware,
    /// Downloaded to the host before it is freed, as a spiller that does not know which copy
    /// is current must do. For benchmarks that measure what coherence-aware eviction saves;
    /// never useful otherwise.
    WriteBackAlways,
}

static WRITE_BACK_ALWAYS: AtomicBool = AtomicBool::new(false);

/// The environment variable that sets the eviction policy of a whole process, for benchmarks
/// that run each policy in a child process: `coherence-aware` (the default) or
/// `write-back-always` ([`EvictionPolicy`]). Read at the first allocation under a budget; any
/// other value makes that allocation fail with a clear error.
pub const EVICTION_POLICY_ENV: &str = "LAZYBUF_EVICTION_POLICY";

/// Applies [`EVICTION_POLICY_ENV`], once per process.
fn env_policy() -> Result<()> {
    static READ: ForkAwareOnce<Result<()>> = ForkAwareOnce::new();
    READ.get_or_init(|| {
        let Some(text) = crate::env::text(EVICTION_POLICY_ENV)? else {
            return Ok(());
        };
        match text.trim() {
            "" | "coherence-aware" => Ok(()),
            "write-back-always" => {
                set_eviction_policy(EvictionPolicy::WriteBackAlways);
                Ok(())
            }
            other => Err(Error::invalid(
                EVICTION_POLICY_ENV,
                format!("expected \"coherence-aware\" or \"write-back-always\", got {other:?}"),
            )),
        }
    })
    .clone()
}

/// Sets the process-wide eviction policy (see [`EvictionPolicy`]: for benchmarks only).
pub fn set_eviction_policy(policy: EvictionPolicy) {
    WRITE_BACK_ALWAYS.store(policy == EvictionPolicy::WriteBackAlways, Ordering::Relaxed);
}

/// The process-wide eviction policy.
pub fn eviction_policy() -> EvictionPolicy {
    if WRITE_BACK_ALWAYS.load(Ordering::Relaxed) {
        EvictionPolicy::WriteBackAlways
    } else {
        EvictionPolicy::CoherenceAware
    }
}

/// Takes `bytes` of device memory from `allocate` under `device`'s budget, making room first
/// where a limit needs it, and making room and retrying once where the backend reports
/// out-of-memory. The memory handed out is charged to the device until
/// [`super::budget::release`] gives it back.
pub(crate) fn allocate_within_budget(
    device: &Device,
    bytes: usize,
    allocate: impl Fn() -> Result<Block>,
) -> Result<Block> {
    // The environment's error, unless set_memory_limit overrode it for this device.
    let ledger = budget::ledger_checked(device)?;
    env_policy()?;
    reserve(device, &ledger, bytes)?;
    // Given back if the code below unwinds (a panic in a runtime's allocation, or in an
    // evictable buffer's code outside lazybuf): the budget keeps no bytes nobody holds.
    let charge = OnUnwind::new(|| budget::release(device, bytes));
    let result = allocate().or_else(|err| {
        if !err.is_out_of_memory() {
            return Err(err);
        }
        // Memory given back to the backend (by trims, and by evictions through them).
        let before = ledger.used();
        let freed = || before.saturating_sub(ledger.used());
        let (_, failure) = make_room(device, bytes, || freed() >= bytes as u64);
        if freed() == 0 {
            // Nothing could be freed: the runtime's error stands (a write-back that failed on
            // the way is recorded on the device).
            if let Some(failure) = failure {
                device.record_deferred_error(failure);
            }
            return Err(err);
        }
        allocate()
    });
    charge.disarm();
    match &result {
        Ok(memory) if memory.len() != bytes => {
            budget::release(device, bytes);
            budget::charge(device, memory.len());
        }
        Ok(_) => {}
        Err(_) => budget::release(device, bytes),
    }
    result
}

/// Charges `bytes` to `ledger`, evicting until they fit under its limit.
fn reserve(device: &Device, ledger: &Ledger, bytes: usize) -> Result<()> {
    if ledger.try_charge(bytes) {
        return Ok(());
    }
    if let Some(err) = beyond_the_limit(&device.to_string(), ledger, bytes) {
        return Err(err);
    }
    let (fits, failure) = make_room(device, bytes, || ledger.try_charge(bytes));
    if fits {
        return Ok(());
    }
    stats::update(device, |s| s.spill_failures += 1);
    if let Some(failure) = failure {
        // A write-back that failed: the buffer kept its copy, and its error explains the refusal.
        return Err(failure);
    }
    let limit = ledger.limit().unwrap_or(u64::MAX);
    Err(Error::OutOfMemory {
        device: format!(
            "{device} (its memory limit is {limit} bytes; {} are held and nothing more can be evicted: \
             the other device copies are in use, not spillable, or memory objects; plain UnifiedBuffers \
             are not evictable in Rust: wrap them in spill::SharedBuffer)",
            ledger.used()
        ),
        requested: bytes,
        code: None,
    })
}

/// The refusal of a request larger than the whole limit of `memory` (a device, or the host):
/// evicting everything could not make it fit, so nothing is evicted, written back or written
/// to disk for it.
fn beyond_the_limit(memory: &str, ledger: &Ledger, bytes: usize) -> Option<Error> {
    let limit = ledger.limit()?;
    (bytes as u64 > limit).then(|| Error::OutOfMemory {
        device: format!(
            "{memory} (the request alone exceeds its memory limit of {limit} bytes; nothing was evicted for it)"
        ),
        requested: bytes,
        code: None,
    })
}

/// Trims the device's caches, then evicts least recently used copies on `device`, asking
/// `enough` after the trim and after each eviction, until it says so. Returns whether it did,
/// and the first write-back failure met on the way ([`Error::WriteBack`], naming its buffer
/// and the `bytes` the allocation asked for).
fn make_room(device: &Device, bytes: usize, mut enough: impl FnMut() -> bool) -> (bool, Option<Error>) {
    let start = Instant::now();
    stats::update(device, |s| s.spill_requests += 1);
    trim(device);
    let mut done = enough();
    let mut failure = None;
    // A second pass only when the binding's reclaim hook released buffers held by nothing but
    // its caches (registry::set_reclaim_hook).
    for pass in 0..2 {
        if done || (pass == 1 && registry::reclaim() == 0) {
            break;
        }
        for candidate in registry::candidates() {
            match candidate.try_evict(device) {
                None | Some(Ok(None)) => continue,
                Some(Err(mut err)) => {
                    if let Error::WriteBack { requested, .. } = &mut err {
                        *requested = Some(bytes);
                    }
                    failure.get_or_insert(err);
                }
                Some(Ok(Some(evicted))) => {
                    stats::update(device, |s| {
                        s.evictions += 1;
                        s.clean_evictions += u64::from(evicted.written_back == 0);
                        s.bytes_written_back += evicted.written_back as u64;
                    });
                    trim(device);
                    if enough() {
                        done = true;
                        break;
                    }
                }
            }
        }
    }
    stats::add_time(device, start.elapsed());
    (done, failure)
}

/// Gives the device's cached memory back: the cached blocks of every live pool of the device
/// (its default pool and those made with [`crate::MemoryPool::new`]) and the backend's
/// staging memory.
fn trim(device: &Device) {
    crate::pool::trim_live_pools(Some(device));
    device.trim();
}

/// Gives host memory back before the disk tier writes anything: every live pool's cached
/// blocks (private pools included) and the backends' staging memory.
fn trim_host_caches() {
    crate::pool::trim_live_pools(None);
    crate::resource::trim();
}

/// Takes a host block of `bytes` from `allocate` under the host memory limit, first giving
/// back the host blocks of least recently used shared buffers where the limit needs room
/// (after trimming the caches): a stale one is freed, writing nothing; one that holds the only
/// current data is written to a spill file. The block is charged to the host until
/// [`super::budget::release_host`] gives it back.
pub(crate) fn allocate_host_within_budget(
    bytes: usize,
    allocate: impl Fn() -> Result<Block>,
) -> Result<Block> {
    let ledger = budget::host_ledger();
    if !ledger.try_charge(bytes) {
        if let Some(err) = beyond_the_limit("the host", ledger, bytes) {
            return Err(err);
        }
        let start = Instant::now();
        trim_host_caches();
        let mut fits = ledger.try_charge(bytes);
        let mut failure = None;
        // A second pass only when the reclaim hook released something (as in make_room).
        for pass in 0..2 {
            if fits || (pass == 1 && registry::reclaim() == 0) {
                break;
            }
            for candidate in registry::candidates() {
                match candidate.try_spill_host() {
                    None | Some(Ok(None)) => continue,
                    Some(Err(err)) => {
                        failure.get_or_insert(err);
                    }
                    Some(Ok(Some(_))) => {
                        trim_host_caches();
                        if ledger.try_charge(bytes) {
                            fits = true;
                            break;
                        }
                    }
                }
            }
        }
        stats::add_time(&Device::host(), start.elapsed());
        if !fits {
            if let Some(failure) = failure {
                return Err(failure);
            }
            let limit = ledger.limit().unwrap_or(u64::MAX);
            return Err(Error::OutOfMemory {
                device: format!(
                    "the host (its memory limit is {limit} bytes; {} are held and no more host copies can be \
                     freed or written to disk: the others are in use, pinned, current beside a device copy, \
                     or not shared)",
                    ledger.used()
                ),
                requested: bytes,
                code: None,
            });
        }
    }
    let charge = OnUnwind::new(|| budget::release_host(bytes));
    let result = allocate();
    charge.disarm();
    match &result {
        Ok(block) if block.len() != bytes => {
            budget::release_host(bytes);
            ledger.try_charge_unchecked(block.len());
        }
        Ok(_) => {}
        Err(_) => budget::release_host(bytes),
    }
    result
}
