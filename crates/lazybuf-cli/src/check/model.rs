//! The reference model `check` compares a real buffer with: the coherence contract of SPEC
//! section 1 for one buffer on one device, written plainly and independently of lazybuf's
//! planner. It tracks each location's residency, the data as far as it is known, and the
//! counters the buffer must report (bytes moved each way, zero-copy syncs, allocations).
//!
//! It is the single-device core of the model in `crates/lazybuf/tests/model.rs`:
//! - read at L: nothing if L is valid; else allocate L, fill it from the valid copy (a read
//!   of data nobody holds sees zeros), and L is valid;
//! - write at L: as read (without zeroing), then the other copy is stale; an overwrite skips
//!   the fill;
//! - on a zero-copy device the device copy is the host block: one allocation for both, and
//!   syncs count as zero-copy syncs instead of bytes.

use lazybuf::BufferState;

/// A location of the buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loc {
    /// Host memory.
    Host,
    /// The device's memory.
    Device,
}

/// A location's residency.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Res {
    /// No memory there.
    Unallocated,
    /// Memory with out-of-date bytes.
    Stale,
    /// Memory with the current bytes.
    Valid,
}

/// How a location is used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Read.
    Read,
    /// Read, then write.
    Write,
    /// Write every element without reading.
    Overwrite,
}

/// The counters a buffer reports ([`lazybuf::TransferStats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Bytes copied host to device.
    pub to_device: u64,
    /// Bytes copied device to host.
    pub to_host: u64,
    /// Syncs that moved no bytes (zero-copy).
    pub zero_copy_syncs: u64,
    /// Allocations made.
    pub allocations: u64,
}

impl Counters {
    /// The counters of a real buffer.
    pub fn of(stats: &lazybuf::TransferStats) -> Counters {
        Counters {
            to_device: stats.host_to_device.bytes,
            to_host: stats.device_to_host.bytes,
            zero_copy_syncs: stats.zero_copy_syncs,
            allocations: stats.allocations,
        }
    }
}

/// One buffer of `len` `u32` elements on one device, as the contract says it must behave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Model {
    /// Elements.
    pub len: usize,
    /// Whether the device's copy aliases the host block.
    pub zero_copy: bool,
    /// The host copy's residency.
    pub host: Res,
    /// The device copy's residency.
    pub device: Res,
    /// Whether the host block exists (the host copy's, or a zero-copy device's).
    pub host_block: bool,
    /// Each element's value where known.
    pub data: Vec<Option<u32>>,
    /// What the buffer must report.
    pub counters: Counters,
}

impl Model {
    /// A new buffer: nothing allocated, nothing known.
    pub fn new(len: usize, zero_copy: bool) -> Model {
        Model {
            len,
            zero_copy,
            host: Res::Unallocated,
            device: Res::Unallocated,
            host_block: false,
            data: vec![None; len],
            counters: Counters::default(),
        }
    }

    /// A location's residency.
    pub fn res(&self, at: Loc) -> Res {
        match at {
            Loc::Host => self.host,
            Loc::Device => self.device,
        }
    }

    fn set(&mut self, at: Loc, res: Res) {
        match at {
            Loc::Host => self.host = res,
            Loc::Device => self.device = res,
        }
    }

    fn other(at: Loc) -> Loc {
        match at {
            Loc::Host => Loc::Device,
            Loc::Device => Loc::Host,
        }
    }

    fn allocate(&mut self, at: Loc) {
        if self.res(at) != Res::Unallocated {
            return;
        }
        if at == Loc::Device && !self.zero_copy {
            self.counters.allocations += 1;
        } else if !self.host_block {
            // The host copy and a zero-copy device's copy share the one host block.
            self.host_block = true;
            self.counters.allocations += 1;
        }
        self.set(at, Res::Stale);
    }

    fn copy_to(&mut self, to: Loc) {
        let bytes = (self.len * 4) as u64;
        if self.zero_copy {
            self.counters.zero_copy_syncs += 1;
        } else if to == Loc::Device {
            self.counters.to_device += bytes;
        } else {
            self.counters.to_host += bytes;
        }
        self.set(to, Res::Valid);
    }

    fn make_valid(&mut self, at: Loc, zero: bool) {
        if self.res(at) == Res::Valid {
            return;
        }
        self.allocate(at);
        if self.res(Self::other(at)) == Res::Valid {
            self.copy_to(at);
        } else if zero {
            self.data = vec![Some(0); self.len];
        }
        self.set(at, Res::Valid);
    }

    /// Applies an access at `at`.
    pub fn access(&mut self, at: Loc, access: Access) {
        match access {
            Access::Read => self.make_valid(at, true),
            Access::Write => self.make_valid(at, false),
            Access::Overwrite => {
                self.allocate(at);
                self.set(at, Res::Valid);
            }
        }
        if access != Access::Read && self.res(Self::other(at)) == Res::Valid {
            self.set(Self::other(at), Res::Stale);
        }
    }

    /// Where a fill writes: the device if its copy is current, else the host.
    pub fn fill_target(&self) -> Loc {
        if self.device == Res::Valid { Loc::Device } else { Loc::Host }
    }

    /// Every valid copy becomes stale; nothing is known.
    pub fn invalidate(&mut self) {
        for res in [&mut self.host, &mut self.device] {
            if *res == Res::Valid {
                *res = Res::Stale;
            }
        }
        self.data = vec![None; self.len];
    }

    /// Every copy's memory is given back.
    pub fn release(&mut self) {
        self.host = Res::Unallocated;
        self.device = Res::Unallocated;
        self.host_block = false;
        self.data = vec![None; self.len];
    }

    /// Every element is known to be `values`.
    pub fn set_data(&mut self, values: &[u32]) {
        self.data = values.iter().copied().map(Some).collect();
    }

    /// The state the buffer must report.
    pub fn state(&self) -> BufferState {
        use Res::*;
        match (self.host, self.device) {
            (Valid, Valid) => BufferState::Synchronized,
            (Valid, Stale) => BufferState::HostDirty,
            (Valid, Unallocated) => BufferState::HostOnly,
            (Stale, Valid) => BufferState::DeviceDirty,
            (Unallocated, Valid) => BufferState::DeviceOnly,
            _ => BufferState::Uninitialized,
        }
    }

    /// The first element of `actual` that differs from a known value: (index, expected, got),
    /// or a length mismatch as index `usize::MAX`.
    pub fn first_difference(&self, actual: &[u32]) -> Option<(usize, u32, u32)> {
        if actual.len() != self.len {
            return Some((usize::MAX, self.len as u32, actual.len() as u32));
        }
        actual.iter().zip(&self.data).enumerate().find_map(|(i, (&a, m))| match m {
            Some(m) if *m != a => Some((i, *m, a)),
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_table_of_the_spec() {
        let mut m = Model::new(4, false);
        assert_eq!(m.state(), BufferState::Uninitialized);
        m.access(Loc::Host, Access::Overwrite);
        assert_eq!(m.state(), BufferState::HostOnly);
        m.access(Loc::Device, Access::Read);
        assert_eq!(m.state(), BufferState::Synchronized);
        assert_eq!(m.counters, Counters { to_device: 16, to_host: 0, zero_copy_syncs: 0, allocations: 2 });
        m.access(Loc::Host, Access::Write);
        assert_eq!(m.state(), BufferState::HostDirty);
        m.access(Loc::Device, Access::Write);
        assert_eq!(m.state(), BufferState::DeviceDirty);
        assert_eq!(m.counters.to_device, 32);
        m.release();
        m.access(Loc::Device, Access::Overwrite);
        assert_eq!(m.state(), BufferState::DeviceOnly);
    }

    #[test]
    fn a_read_of_nothing_sees_zeros_and_a_write_does_not() {
        let mut m = Model::new(2, false);
        m.access(Loc::Host, Access::Write);
        assert_eq!(m.data, vec![None, None]);
        m.invalidate();
        m.access(Loc::Device, Access::Read);
        assert_eq!(m.data, vec![Some(0), Some(0)]);
        assert_eq!(m.counters.to_device, 0, "nothing valid: nothing to copy");
    }

    #[test]
    fn zero_copy_devices_share_the_host_block_and_move_no_bytes() {
        let mut m = Model::new(4, true);
        m.access(Loc::Host, Access::Overwrite);
        m.access(Loc::Device, Access::Read);
        m.access(Loc::Device, Access::Write);
        m.access(Loc::Host, Access::Read);
        assert_eq!(m.counters, Counters { to_device: 0, to_host: 0, zero_copy_syncs: 2, allocations: 1 });
    }

    #[test]
    fn differences_name_the_first_element() {
        let mut m = Model::new(3, false);
        m.set_data(&[1, 2, 3]);
        assert_eq!(m.first_difference(&[1, 2, 3]), None);
        assert_eq!(m.first_difference(&[1, 9, 8]), Some((1, 2, 9)));
        assert_eq!(m.first_difference(&[1]), Some((usize::MAX, 3, 1)));
    }
}
