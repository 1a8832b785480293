//! The recorder's events through the `tracing` crate (feature `tracing`), on every device: a
//! subscriber of the test's own sees one `transfer` event per counted copy, with its bytes
//! and direction, and the allocations and state transitions; nothing while the events are off.
//!
//! A process of its own: the events are switched on process-wide, and `tracing` caches each
//! callsite's interest process-wide, so another test's thread reaching a callsite first while
//! this test's thread-local subscriber is set can leave it cached as uninterested (seen once,
//! when this test shared the suite binary: no copy reached the subscriber).

mod common;

use std::sync::{Arc, Mutex};

use common::pattern;
use lazybuf::UnifiedBuffer;
use tracing::field::{Field, Visit};
use tracing::{Event, Metadata, Subscriber, span};

/// One event: its message and its fields, in words.
#[derive(Debug, Default)]
struct Seen {
    message: String,
    fields: Vec<(String, String)>,
}

impl Seen {
    fn get(&self, name: &str) -> Option<&str> {
        self.fields.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

impl Visit for Seen {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        } else {
            self.fields.push((field.name().to_string(), format!("{value:?}")));
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.fields.push((field.name().to_string(), value.to_string()));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.fields.push((field.name().to_string(), value.to_string()));
    }
}

#[derive(Clone, Default)]
struct Collector(Arc<Mutex<Vec<Seen>>>);

impl Subscriber for Collector {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.target().starts_with("lazybuf")
    }
    fn new_span(&self, _: &span::Attributes<'_>) -> span::Id {
        span::Id::from_u64(1)
    }
    fn record(&self, _: &span::Id, _: &span::Record<'_>) {}
    fn record_follows_from(&self, _: &span::Id, _: &span::Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut seen = Seen::default();
        event.record(&mut seen);
        self.0.lock().unwrap().push(seen);
    }
    fn enter(&self, _: &span::Id) {}
    fn exit(&self, _: &span::Id) {}
}

#[test]
fn a_subscriber_sees_each_counted_copy() {
    for device in common::devices() {
        let len = 500;
        let collector = Collector::default();
        let mut buf = UnifiedBuffer::<u32>::on(&[len], &device).unwrap();
        let id = buf.raw().id().to_string();
        // Off: nothing reaches the subscriber.
        tracing::subscriber::with_default(collector.clone(), || {
            buf.host_mut().unwrap().copy_from_slice(&pattern(1, len));
            buf.sync_to_device().unwrap();
        });
        assert!(collector.0.lock().unwrap().is_empty());
        lazybuf::observe::set_tracing_events(true);
        buf.reset_transfer_stats();
        tracing::subscriber::with_default(collector.clone(), || {
            buf.mark_host_dirty().unwrap();
            buf.device().unwrap();
            buf.mark_device_dirty().unwrap();
            buf.host().unwrap();
        });
        lazybuf::observe::set_tracing_events(false);
        let stats = buf.transfer_stats();
        let seen = collector.0.lock().unwrap();
        let copies: Vec<&Seen> =
            seen.iter().filter(|s| s.message == "transfer" && s.get("buffer") == Some(&id)).collect();
        let sum = |d: &str| -> u64 {
            copies
                .iter()
                .filter(|s| s.get("direction") == Some(d))
                .map(|s| s.get("bytes").unwrap().parse::<u64>().unwrap())
                .sum()
        };
        assert_eq!(sum("h2d"), stats.host_to_device.bytes, "{device}");
        assert_eq!(sum("d2h"), stats.device_to_host.bytes, "{device}");
        assert_eq!(
            copies.len() as u64,
            stats.host_to_device.copies + stats.device_to_host.copies,
            "{device}"
        );
        assert!(
            seen.iter().any(|s| s.message == "state" && s.get("to_state") == Some("DEVICE_DIRTY")),
            "{device}: {seen:?}"
        );
    }
}
