//! What a buffer counts: the copies it made and the bytes they moved.

/// Bytes moved by a buffer since it was made (or since the counters were reset).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TransferStats {
    /// Copies from the host to a device, and their bytes.
    pub host_to_device: Traffic,
    /// Copies from a device to the host, and their bytes.
    pub device_to_host: Traffic,
    /// Direct copies between devices, and their bytes.
    pub device_to_device: Traffic,
    /// Syncs between the host and a device that aliases host memory: no bytes moved.
    pub zero_copy_syncs: u64,
    /// Blocks taken from the memory resource (host blocks and device allocations; a pool may
    /// serve them from its cache).
    pub allocations: u64,
}

/// Which way a host-device copy goes.
#[derive(Clone, Copy, Debug)]
pub(super) enum Direction {
    HostToDevice,
    DeviceToHost,
}

impl TransferStats {
    pub(super) fn record(&mut self, direction: Direction, zero_copy: bool, bytes: usize) {
        if zero_copy {
            self.zero_copy_syncs += 1;
            return;
        }
        match direction {
            Direction::HostToDevice => self.host_to_device.add(bytes),
            Direction::DeviceToHost => self.device_to_host.add(bytes),
        }
    }

    /// All bytes that crossed between memories.
    pub fn bytes_moved(&self) -> u64 {
        self.host_to_device.bytes + self.device_to_host.bytes + self.device_to_device.bytes
    }

    /// These counters with `other`'s added.
    pub(super) fn plus(self, other: TransferStats) -> TransferStats {
        self.combine(other, u64::wrapping_add)
    }

    /// These counters with `other`'s taken away (`other` was counted in them).
    pub(super) fn minus(self, other: TransferStats) -> TransferStats {
        self.combine(other, u64::wrapping_sub)
    }

    fn combine(self, other: TransferStats, op: fn(u64, u64) -> u64) -> TransferStats {
        let traffic =
            |a: Traffic, b: Traffic| Traffic { copies: op(a.copies, b.copies), bytes: op(a.bytes, b.bytes) };
        TransferStats {
            host_to_device: traffic(self.host_to_device, other.host_to_device),
            device_to_host: traffic(self.device_to_host, other.device_to_host),
            device_to_device: traffic(self.device_to_device, other.device_to_device),
            zero_copy_syncs: op(self.zero_copy_syncs, other.zero_copy_syncs),
            allocations: op(self.allocations, other.allocations),
        }
    }
}

/// A count of copies and the bytes they moved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Number of copies.
    pub copies: u64,
    /// Bytes copied.
    pub bytes: u64,
}

impl Traffic {
    pub(super) fn add(&mut self, bytes: usize) {
        self.copies += 1;
        self.bytes += bytes as u64;
    }
}
