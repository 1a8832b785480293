//! Spill counters per device: what eviction did, and what it cost.
//!
//! What does not live here: the eviction itself (`spill::eviction`).

use std::collections::HashMap;
use std::time::Duration;

use crate::backend::fork::{ForkAwareMutex, ForkAwareOnce};
use crate::coherence::DeviceId;
use crate::device::Device;

/// What spilling did on one device since the process started (or the last
/// [`reset_spill_stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SpillStats {
    /// Device copies evicted.
    pub evictions: u64,
    /// Evictions that moved no byte: the copy was stale, or equal to a current copy elsewhere.
    pub clean_evictions: u64,
    /// Bytes downloaded because an evicted copy held the only current data.
    pub bytes_written_back: u64,
    /// Bytes uploaded again to this device for buffers evicted from it (counted when the
    /// upload is enqueued; one that fails is taken back when its failure is settled).
    pub bytes_read_back: u64,
    /// Bytes of this device's buffers' host copies written to spill files (the disk tier).
    pub bytes_to_disk: u64,
    /// Of [`Self::bytes_to_disk`], those written with direct I/O (`O_DIRECT`, bypassing the
    /// page cache); the rest were written with buffered I/O, where the file system refuses
    /// direct I/O or it is turned off ([`super::disk`]).
    pub bytes_to_disk_direct: u64,
    /// Bytes of this device's buffers read back from spill files.
    pub bytes_from_disk: u64,
    /// Stale host copies of this device's buffers freed for the host memory limit, writing
    /// nothing (a device copy was newer).
    pub stale_host_frees: u64,
    /// Times a budget or an out-of-memory report made lazybuf look for memory to free.
    pub spill_requests: u64,
    /// Times it could not free enough (the allocation then failed).
    pub spill_failures: u64,
    /// Wall time spent making room (trimming, write-backs, frees), in seconds.
    pub seconds: f64,
}

/// The counters per device. A fork-aware lock: a forked child whose parent's thread held it at
/// the fork counts nothing and reads zeros, instead of waiting forever (`backend::fork`).
fn table() -> &'static ForkAwareMutex<HashMap<DeviceId, SpillStats>> {
    static TABLE: ForkAwareOnce<ForkAwareMutex<HashMap<DeviceId, SpillStats>>> = ForkAwareOnce::new();
    TABLE.get_or_init(ForkAwareMutex::default)
}

/// Applies `change` to `device`'s counters.
pub(crate) fn update(device: &Device, change: impl FnOnce(&mut SpillStats)) {
    if let Some(mut table) = table().lock() {
        change(table.entry(device.id()).or_default());
    }
}

/// Counts `elapsed` time spent making room on `device`.
pub(crate) fn add_time(device: &Device, elapsed: Duration) {
    update(device, |s| s.seconds += elapsed.as_secs_f64());
}

/// The spill counters of `device`.
pub fn spill_stats(device: &Device) -> SpillStats {
    table().lock().and_then(|table| table.get(&device.id()).copied()).unwrap_or_default()
}

/// Sets `device`'s spill counters to zero.
pub fn reset_spill_stats(device: &Device) {
    if let Some(mut table) = table().lock() {
        table.remove(&device.id());
    }
}
