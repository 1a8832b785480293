//! The recorder's events as `tracing` events (crate feature `tracing`), for the caller's own
//! subscribers: target `lazybuf::observe`, level TRACE, message the event's kind
//! (`transfer`, `allocate`, `free`, `pool`, `state`, `rollback`, `checker_read`), and its
//! fields as `tracing` fields (`buffer`, `direction`, `bytes`, `from`, `to`, `call`, `reason`,
//! `stream`, `duration_ns`, `op`; `device`, `kind`, `source`; `hit`; `from_state`, `to_state`).
//!
//! What does not live here: when events are made ([`super::trace`]), the switch
//! ([`super::set_tracing_events`]).

use super::event::{EventKind, Source};

/// Sends `kind` to the current `tracing` subscriber. The subscriber is the caller's code, run
/// in the middle of lazybuf's work (a device block taken and not yet in the buffer, a plan
/// half committed): a panic there is contained, never unwound through lazybuf (which leaked
/// the block's budget charge for good and left the buffer's plan behind: the nineteenth
/// hostile pass). The panic hook has reported it; the event is lost, lazybuf goes on.
pub(super) fn emit(kind: &EventKind) {
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| dispatch(kind)));
}

fn dispatch(kind: &EventKind) {
    const TARGET: &str = "lazybuf::observe";
    match kind {
        EventKind::Transfer { info, stream, duration, op } => tracing::trace!(
            target: TARGET,
            buffer = info.buffer,
            direction = info.direction.name(),
            bytes = info.bytes as u64,
            from = info.from.as_str(),
            to = info.to.as_str(),
            call = info.cause.call,
            reason = info.cause.reason.name(),
            stream = *stream as u64,
            duration_ns = duration.map(|d| d.as_nanos() as u64),
            op = *op,
            "transfer"
        ),
        EventKind::Allocate { buffer, device, kind, bytes, source } => tracing::trace!(
            target: TARGET,
            buffer = *buffer,
            device = device.as_str(),
            kind = kind.name(),
            bytes = *bytes as u64,
            source = if *source == Source::Cache { "cache" } else { "upstream" },
            "allocate"
        ),
        EventKind::Free { buffer, device, kind, bytes } => tracing::trace!(
            target: TARGET,
            buffer = *buffer,
            device = device.as_str(),
            kind = kind.name(),
            bytes = *bytes as u64,
            "free"
        ),
        EventKind::Pool { hit, device, bytes } => tracing::trace!(
            target: TARGET,
            hit = *hit,
            device = device.as_str(),
            bytes = *bytes as u64,
            "pool"
        ),
        EventKind::State { buffer, from, to, call } => tracing::trace!(
            target: TARGET,
            buffer = *buffer,
            from_state = %from,
            to_state = %to,
            call = *call,
            "state"
        ),
        EventKind::Rollback { buffer, op, allocations, call } => tracing::trace!(
            target: TARGET,
            buffer = *buffer,
            op = *op,
            allocations = *allocations,
            call = *call,
            "rollback"
        ),
        EventKind::CheckerRead { buffer, device, bytes, duration } => tracing::trace!(
            target: TARGET,
            buffer = *buffer,
            device = device.as_str(),
            bytes = *bytes as u64,
            duration_ns = duration.as_nanos() as u64,
            "checker_read"
        ),
    }
}
