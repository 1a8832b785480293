//! Eviction of one device copy, for spilling under a memory budget ([`crate::spill`]).
//!
//! A copy that is stale, or equal to a current copy elsewhere, is freed moving no byte; a
//! copy that holds the only current data is first downloaded to the host (the same blocking
//! host read any access makes, through the backend's pinned staging where it has one), and
//! freed only once that succeeded. States follow the contract: SYNCHRONIZED and HOST_DIRTY
//! become HOST_ONLY at once, DEVICE_ONLY and DEVICE_DIRTY become HOST_ONLY after the
//! write-back; the next device access allocates and uploads again.

use super::RawBuffer;
use super::execute::give_back;
use crate::coherence::DeviceId;
use crate::coherence::{Access, Location, Residency};
use crate::device::Device;
use crate::error::Result;
use crate::spill::{Evicted, EvictionPolicy};

impl RawBuffer {
    /// Frees this buffer's copy on `device`, writing it back to the host first when it holds
    /// the only current data. `Ok(None)` when there is nothing to free: no copy there, a copy
    /// that aliases the host block (it holds no device memory), or a transfer in flight (the
    /// buffer is in use). A failed write-back returns its error and changes nothing: the copy,
    /// the state and every valid byte stay as they were.
    pub fn evict_device_copy(&mut self, device: &Device) -> Result<Option<Evicted>> {
        let Some(index) = self.copy_index(device.id()) else {
            return Ok(None);
        };
        if self.copies[index].memory.is_host_alias() || !self.inflight.is_empty() {
            return Ok(None);
        }
        let at = Location::Device(device.id());
        let only_current = self.coherence.residency(at) == Residency::Valid
            && !self.coherence.locations().any(|(loc, r)| loc != at && r == Residency::Valid);
        let mut written_back = 0;
        if only_current {
            // A blocking host read: on failure it frees what it allocated and commits nothing.
            self.access(Location::Host, None, Access::Read)?;
            written_back = self.nbytes;
        } else if self.coherence.residency(at) == Residency::Valid
            && self.coherence.residency(Location::Host) == Residency::Valid
            && crate::spill::eviction_policy() == EvictionPolicy::WriteBackAlways
        {
            // The benchmarks' blind spiller: the same download, although the host is current.
            self.coherence.mark_stale(Location::Host);
            if let Err(err) = self.access(Location::Host, None, Access::Read) {
                self.coherence.restore(Location::Host, Residency::Valid);
                return Err(err);
            }
            written_back = self.nbytes;
        }
        let index = self.copy_index(device.id()).expect("a write-back keeps the device copy");
        let copy = self.copies.remove(index);
        let freed = copy.memory.len();
        self.coherence.forget(at);
        give_back(&*self.resource, copy);
        if !self.evicted_from.contains(&device.id()) {
            self.evicted_from.push(device.id());
        }
        Ok(Some(Evicted { freed, written_back }))
    }

    /// Counts an upload of `bytes` to device `id` as a reload when that device's copy was
    /// evicted before ([`crate::spill::SpillStats::bytes_read_back`]).
    pub(super) fn count_reload(&mut self, id: DeviceId, bytes: usize) {
        if let Some(i) = self.evicted_from.iter().position(|&d| d == id) {
            self.evicted_from.swap_remove(i);
            let device = self.copies.iter().find(|c| c.device.id() == id).map(|c| c.device.clone());
            if let Some(device) = device {
                crate::spill::stats::update(&device, |s| s.bytes_read_back += bytes as u64);
            }
        }
    }
}
