//! The transfer guard's and the event recorder's view of memory objects' copies
//! ([`crate::observe`], "Other copy sites"): every copy method of [`super::DeviceAllocation`]
//! and [`super::DeviceBuffer`] calls [`start`] before its copy (and before allocating what it
//! copies into: a refusal changes nothing) and [`finish`] once the copy has completed.
//!
//! And the recorder's view of their memory: each allocation a memory object makes (the
//! memory of a `DeviceBuffer` and of its reallocations included) looks at [`allocating`] before
//! it asks its resource and records itself with [`allocated`] once it holds a block it keeps
//! (a failed allocation, or a block the object refused and gave back, records nothing but the
//! pool lookups made for it); its drop records the block's free with [`freed`] as it gives the
//! block back. Memory the object borrows (`DeviceAllocation::borrowed`) was not allocated by
//! lazybuf: neither its making nor its drop is an event.
//!
//! Only copies between memories are seen: host memory to memory a device addresses, back, or
//! between two such memories (on one device or two). A copy from host memory to host memory
//! (host and pinned kinds, every kind on the host device, device memory that aliases host
//! memory) moves no bytes between memories, and an empty one moves none: neither is seen, as
//! the counters of a buffer do not count a zero-copy sync.

use crate::backend::MemoryKind;
use crate::device::Device;
use crate::error::{BackendKind, Result};
use crate::observe::{self, Cause, Direction, TransferInfo, trace};

/// Who a copy is made for: the memory object the errors and events name, and the call that
/// makes it (replaced by a running [`observe::call`]'s cause).
#[derive(Clone, Copy, Debug)]
pub(super) struct Seen {
    pub(super) buffer: u64,
    pub(super) cause: Cause,
}

impl Seen {
    pub(super) const fn new(buffer: u64, cause: Cause) -> Seen {
        Seen { buffer, cause }
    }
}

/// The memory a device addresses: `Some(device)` for `kind` memory on `device` that only the
/// device's copies reach (device and shared memory), `None` for memory the host addresses as its
/// own (the host kinds; every kind on the host device).
pub(super) fn device_side(device: &Device, kind: MemoryKind) -> Option<&Device> {
    let host = matches!(kind, MemoryKind::Host { .. }) || device.backend_kind() == BackendKind::HOST;
    (!host).then_some(device)
}

/// A copy the guard let through while recording: [`Pending::finished`] records it.
#[must_use = "record the copy with finished() once it has completed"]
pub(super) struct Pending {
    started: observe::Started,
    device: Device,
}

impl Pending {
    /// The copy has completed.
    pub(super) fn finished(self) {
        self.started.finished(observe::stream_id(&self.device.stream()));
    }
}

/// The guard's look at a copy of `bytes` from `from` to `to` (`None`: host memory;
/// `Some(device)`: memory only that device's copies reach, [`device_side`]), before anything
/// for it is allocated or copied: its refusal is returned (the caller must then change
/// nothing). `Ok(Some(_))` while recording: [`Pending::finished`] once the copy has completed.
/// One relaxed load when nothing observes; nothing is seen of a copy between host memories or
/// of an empty one.
#[inline]
pub(super) fn start(
    seen: Seen,
    from: Option<&Device>,
    to: Option<&Device>,
    bytes: usize,
) -> Result<Option<Pending>> {
    if !observe::active() || bytes == 0 {
        return Ok(None);
    }
    let Some((direction, device)) = direction(from, to) else { return Ok(None) };
    let started = observe::transfer(|| described(seen, direction, from, to, bytes))?;
    Ok(started.map(|started| Pending { started, device: device.clone() }))
}

/// The guard's refusal of the copy [`start`] will be asked about once its destination is
/// allocated ([`super::DeviceAllocation::for_copy_from`]), asked before anything is: logging
/// and recording nothing (the copy's own [`start`] does both).
pub(super) fn check_refusal(
    seen: Seen,
    from: Option<&Device>,
    to: Option<&Device>,
    bytes: usize,
) -> Result<()> {
    if !observe::active() || bytes == 0 {
        return Ok(());
    }
    let Some((direction, _)) = direction(from, to) else { return Ok(()) };
    observe::guard::check_refusal(&described(seen, direction, from, to, bytes))
}

/// A copy's direction and the device whose stream runs it; `None` between host memories.
fn direction<'a>(from: Option<&'a Device>, to: Option<&'a Device>) -> Option<(Direction, &'a Device)> {
    match (from, to) {
        (None, None) => None,
        (None, Some(to)) => Some((Direction::HostToDevice, to)),
        (Some(from), None) => Some((Direction::DeviceToHost, from)),
        (Some(_), Some(to)) => Some((Direction::DeviceToDevice, to)),
    }
}

fn described(
    seen: Seen,
    direction: Direction,
    from: Option<&Device>,
    to: Option<&Device>,
    bytes: usize,
) -> TransferInfo {
    let name = |at: Option<&Device>| at.map_or_else(|| "host".to_string(), Device::to_string);
    TransferInfo {
        buffer: seen.buffer,
        direction,
        bytes,
        from: name(from),
        to: name(to),
        cause: observe::cause_or(seen.cause),
    }
}

/// Records the copy [`start`] let through, once it has completed (nothing when not recording).
#[inline]
pub(super) fn finish(pending: Option<Pending>) {
    if let Some(pending) = pending {
        pending.finished();
    }
}

/// Whether an allocation about to be made is to be recorded: events are wanted (one relaxed
/// load; nothing else when they are not). While they are, this thread's last pool lookup is
/// forgotten, so that the allocation's source is that of a lookup made for it.
#[inline]
pub(super) fn allocating() -> bool {
    let wanted = observe::emitting();
    if wanted {
        observe::forget_pool_lookup();
    }
    wanted
}

/// Records the block of `bytes` of `kind` on `device` that memory object `id` now holds
/// (`wanted`: [`allocating`]'s answer before it was made), served from a pool's cache when
/// the last pool lookup made for it was a hit. Nothing when not `wanted`.
#[inline]
pub(super) fn allocated(wanted: bool, id: u64, device: &Device, kind: MemoryKind, bytes: usize) {
    if wanted {
        trace::record_allocate(id, device, kind.into(), bytes);
    }
}

/// An allocation that [`allocating`] let record failed, or its block was refused: its pool
/// lookup served no allocation, and no later allocation may take it.
#[inline]
pub(super) fn not_allocated(wanted: bool) {
    if wanted {
        observe::forget_pool_lookup();
    }
}

/// Records the free of the block of `bytes` of `kind` on `device` that memory object `id`
/// gives back (only while events are wanted: one relaxed load when not).
#[inline]
pub(super) fn freed(id: u64, device: &Device, kind: MemoryKind, bytes: usize) {
    if observe::emitting() {
        trace::record_free(Some(id), device, kind.into(), bytes);
    }
}
