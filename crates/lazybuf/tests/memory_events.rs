//! The recorder's events of memory objects' memory (`lazybuf::memory`), on every device: each
//! allocation of a `DeviceAllocation` (every kind the device offers) and of a `DeviceBuffer`
//! (its reallocations included) is one `allocate` event and its drop one `free` event, under
//! the object's id, with its device, kind (`device`, `host`, `pinned`, `shared`), bytes (the
//! block's) and source (`cache` for a pool's cached block, `upstream` for a new one), in that
//! order; a failed allocation, a block the object refuses, and borrowed memory record none; the
//! Chrome JSON's memory counters and the trace agree with the memory the pool has handed out;
//! recording off records nothing; threads record their own objects.
//!
//! The recorder is process-wide: each test holds `LOCK`, and looks at its own objects' events
//! (or at events of kinds only its own calls make while it holds the lock).

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use lazybuf::observe::trace::{self, EventKind, MemoryKind as Shown, Source, Trace, TraceOptions};
use lazybuf::{
    AllocationOptions, Block, CachingResource, Device, DeviceBuffer, DirectResource, Error, Memory,
    MemoryKind, MemoryResource, PoolConfig, StatisticsResource, Stream, Ticket,
};
use serde_json::Value;

static LOCK: Mutex<()> = Mutex::new(());

/// The recorder, this test's alone; a failed test's recording is stopped, so that the next
/// test fails on its own.
struct Held(#[allow(dead_code)] MutexGuard<'static, ()>);

impl Drop for Held {
    fn drop(&mut self) {
        let _ = trace::stop();
    }
}

fn lock() -> Held {
    Held(LOCK.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
}

/// Every kind of memory object, and how its events show it.
const KINDS: [(MemoryKind, Shown); 4] = [
    (MemoryKind::Device, Shown::Device),
    (MemoryKind::Host { pinned: false }, Shown::Host),
    (MemoryKind::Host { pinned: true }, Shown::Pinned),
    (MemoryKind::Shared, Shown::Shared),
];

/// A memory event, without its time and thread.
#[derive(Clone, Debug, PartialEq)]
enum Mem {
    Alloc(String, Shown, usize, Source),
    Free(String, Shown, usize),
}

/// The allocations and frees recorded of object `id`, in order.
fn of(trace: &Trace, id: u64) -> Vec<Mem> {
    trace
        .events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Allocate { buffer, device, kind, bytes, source } if *buffer == id => {
                Some(Mem::Alloc(device.clone(), *kind, *bytes, *source))
            }
            EventKind::Free { buffer: Some(buffer), device, kind, bytes } if *buffer == id => {
                Some(Mem::Free(device.clone(), *kind, *bytes))
            }
            _ => None,
        })
        .collect()
}

/// Every allocation and free of the trace (any object's).
fn memory_events(trace: &Trace) -> Vec<&EventKind> {
    trace
        .events
        .iter()
        .map(|e| &e.kind)
        .filter(|k| matches!(k, EventKind::Allocate { .. } | EventKind::Free { .. }))
        .collect()
}

fn from(resource: &Arc<dyn MemoryResource>) -> AllocationOptions {
    AllocationOptions { resource: Some(resource.clone()), alignment: 0 }
}

/// A pool of its own over counted direct memory (`stats.current_bytes`: bytes the runtime
/// holds for it).
fn pool(device: &Device) -> (Arc<CachingResource>, Arc<StatisticsResource>) {
    let stats = Arc::new(StatisticsResource::new(DirectResource::shared()));
    let cache = Arc::new(CachingResource::new(stats.clone(), PoolConfig::default(), device.to_string()));
    (cache, stats)
}

/// Sizes that are a pool's size classes (a pooled block is exactly as large).
const N: usize = 4096;

/// Allocating and dropping a memory object of each kind the device offers records one
/// allocation and one free, with the device, the kind, the block's bytes and where it came
/// from: new from the runtime (no pool, or a pool's miss) or a pool's cached block (its hit),
/// each after the pool lookup that decided it. A kind the device lacks records neither.
#[test]
fn each_kind_records_one_allocation_and_one_free_on_every_device() {
    let _l = lock();
    for device in common::devices() {
        let name = device.to_string();
        let mut offered = Vec::new();
        for (kind, shown) in KINDS {
            for n in [N, 0] {
                let what = format!("{device}: {} bytes of {}", n, shown.name());
                // Without a pool: the runtime's block, as large as the runtime made it.
                let stats = Arc::new(StatisticsResource::new(DirectResource::shared()));
                let direct: Arc<dyn MemoryResource> = stats.clone();
                trace::start(TraceOptions::default()).unwrap();
                let made = Memory::with_options(&device, kind, n, from(&direct));
                let held = stats.statistics().current_bytes as usize;
                let Ok(m) = made else {
                    let recorded = trace::stop().unwrap();
                    assert!(memory_events(&recorded).is_empty(), "{what}: failed, recorded {recorded:?}");
                    assert!(
                        !matches!(kind, MemoryKind::Device | MemoryKind::Host { pinned: false }),
                        "{what}: every device offers device and host memory"
                    );
                    continue;
                };
                offered.push(shown);
                let id = m.id();
                drop(m);
                let recorded = trace::stop().unwrap();
                assert!(held >= n, "{what}: {held}");
                assert_eq!(
                    of(&recorded, id),
                    [
                        Mem::Alloc(name.clone(), shown, held, Source::Upstream),
                        Mem::Free(name.clone(), shown, held)
                    ],
                    "{what}, without a pool"
                );

                // Through a pool: a miss (new), then, the block cached, a hit.
                let (cache, _) = pool(&device);
                let pooled: Arc<dyn MemoryResource> = cache.clone();
                trace::start(TraceOptions::default()).unwrap();
                let first = Memory::with_options(&device, kind, n, from(&pooled)).unwrap();
                let in_use = cache.usage(|k| k == kind).bytes_in_use as usize;
                let first_id = first.id();
                drop(first);
                // A cached host block is reused once its last use is done.
                device.stream().synchronize().unwrap();
                let second = Memory::with_options(&device, kind, n, from(&pooled)).unwrap();
                let second_id = second.id();
                drop(second);
                let recorded = trace::stop().unwrap();
                assert_eq!(in_use, n, "{what}: {n} is a size class");
                // An empty request bypasses the cache (an empty block costs nothing).
                let second_source = if n == 0 { Source::Upstream } else { Source::Cache };
                assert_eq!(
                    of(&recorded, first_id),
                    [Mem::Alloc(name.clone(), shown, n, Source::Upstream), Mem::Free(name.clone(), shown, n)],
                    "{what}, a pool's miss"
                );
                assert_eq!(
                    of(&recorded, second_id),
                    [Mem::Alloc(name.clone(), shown, n, second_source), Mem::Free(name.clone(), shown, n)],
                    "{what}, a pool's hit"
                );
                // In order: each allocation after the lookup that served it.
                let sequence: Vec<String> = recorded
                    .events
                    .iter()
                    .filter_map(|e| match &e.kind {
                        EventKind::Pool { hit, device, .. } if *device == name => {
                            Some(if *hit { "hit" } else { "miss" }.to_string())
                        }
                        EventKind::Allocate { buffer, source, .. }
                            if [first_id, second_id].contains(buffer) =>
                        {
                            Some(format!(
                                "allocate {}",
                                if *source == Source::Cache { "cache" } else { "upstream" }
                            ))
                        }
                        EventKind::Free { buffer: Some(b), .. } if [first_id, second_id].contains(b) => {
                            Some("free".to_string())
                        }
                        _ => None,
                    })
                    .collect();
                let expected: &[&str] = if n == 0 {
                    &["allocate upstream", "free", "allocate upstream", "free"]
                } else {
                    &["miss", "allocate upstream", "free", "hit", "allocate cache", "free"]
                };
                assert_eq!(sequence, expected, "{what}");
            }
        }
        assert!(offered.contains(&Shown::Device) && offered.contains(&Shown::Host), "{device}: {offered:?}");
    }
}

/// A `DeviceBuffer`'s memory: its allocation, each reallocation (the new block, then the old
/// one's free, both under the buffer's id), nothing for a resize within the capacity, the old
/// block's free only when the last hold on it goes, and `from_host`'s and `try_clone`'s new
/// buffers under their own ids, each allocation before the copy into it.
#[test]
fn device_buffers_record_allocations_reallocations_and_frees() {
    let _l = lock();
    for device in common::devices() {
        let name = device.to_string();
        let (cache, _) = pool(&device);
        let pooled: Arc<dyn MemoryResource> = cache.clone();
        let alloc = |n, source| Mem::Alloc(name.clone(), Shown::Device, n, source);
        let free = |n| Mem::Free(name.clone(), Shown::Device, n);
        trace::start(TraceOptions::default()).unwrap();
        let mut db = DeviceBuffer::with_options(&device, MemoryKind::Device, N, from(&pooled)).unwrap();
        let id = db.id();
        db.resize(N / 2).unwrap(); // within the capacity: nothing
        db.reserve(2 * N).unwrap(); // a new block of 2N, the old one freed (cached)
        db.shrink_to_fit().unwrap(); // N/2, new
        let hold = db.hold();
        db.resize(N).unwrap(); // the cached block of N; the held N/2 is not freed
        let after_resize = of(&trace::snapshot().unwrap(), id);
        drop(db); // N freed
        let held_until_now = of(&trace::snapshot().unwrap(), id);
        drop(hold); // now N/2 is
        let copied =
            DeviceBuffer::from_host_with(&device, MemoryKind::Device, &[7; N], from(&pooled)).unwrap();
        let clone = copied.try_clone().unwrap();
        let (copied_id, clone_id) = (copied.id(), clone.id());
        drop((copied, clone));
        let recorded = trace::stop().unwrap();

        let expected = [
            alloc(N, Source::Upstream),
            alloc(2 * N, Source::Upstream),
            free(N),
            alloc(N / 2, Source::Upstream),
            free(2 * N),
            alloc(N, Source::Cache),
        ];
        assert_eq!(after_resize, expected, "{device}");
        assert_eq!(held_until_now[expected.len()..], [free(N)], "{device}: the held block stays");
        assert_eq!(of(&recorded, id)[expected.len()..], [free(N), free(N / 2)], "{device}");
        // from_host takes the block db gave back; try_clone a new one.
        assert_eq!(of(&recorded, copied_id), [alloc(N, Source::Cache), free(N)], "{device}");
        assert_eq!(of(&recorded, clone_id), [alloc(N, Source::Upstream), free(N)], "{device}");
        // Each copy into a new block comes after its allocation (none on the host device,
        // where device memory is host memory).
        for buffer in [id, copied_id, clone_id] {
            let mut allocated = false;
            for event in &recorded.events {
                match &event.kind {
                    EventKind::Allocate { buffer: b, .. } if *b == buffer => allocated = true,
                    EventKind::Transfer { info, .. } if info.buffer == buffer => {
                        assert!(allocated, "{device}: a copy of {buffer} before its allocation")
                    }
                    _ => {}
                }
            }
        }
        assert_eq!(cache.stats().bytes_in_use, 0, "{device}");
    }
}

/// A resource that hands out a block other than the one asked for (too short, or of another
/// kind) from its own pool: the memory object gives it back and fails.
#[derive(Debug)]
struct Wrong {
    inner: Arc<dyn MemoryResource>,
    short: bool,
}

impl MemoryResource for Wrong {
    fn allocate(
        &self,
        device: &Device,
        kind: MemoryKind,
        bytes: usize,
        stream: &Stream,
    ) -> lazybuf::Result<Block> {
        if self.short {
            self.inner.allocate(device, kind, bytes / 2, stream)
        } else {
            self.inner.allocate(device, MemoryKind::Host { pinned: false }, bytes, stream)
        }
    }

    fn deallocate(&self, device: &Device, block: Block, stream: &Stream, ready: Ticket) {
        self.inner.deallocate(device, block, stream, ready);
    }
}

/// A resource that always runs out of memory.
#[derive(Debug)]
struct Exhausted;

impl MemoryResource for Exhausted {
    fn allocate(&self, device: &Device, _: MemoryKind, bytes: usize, _: &Stream) -> lazybuf::Result<Block> {
        Err(Error::OutOfMemory { device: device.to_string(), requested: bytes, code: None })
    }

    fn deallocate(&self, _: &Device, _: Block, _: &Stream, _: Ticket) {}
}

/// Asserts that `buffer` recorded allocations, every one of them new (`upstream`): a buffer of
/// no pool, whose allocations must not take a pool hit an earlier failure left behind.
fn assert_all_upstream(recorded: &Trace, buffer: u64, device: &Device) {
    let sources: Vec<Source> = recorded
        .events
        .iter()
        .filter_map(|e| match e.kind {
            EventKind::Allocate { buffer: b, source, .. } if b == buffer => Some(source),
            _ => None,
        })
        .collect();
    assert!(!sources.is_empty() && sources.iter().all(|s| *s == Source::Upstream), "{device}: {sources:?}");
}

/// A failed allocation records no allocation and no free: refused before the resource is asked
/// (a bad alignment), refused by the resource, or a block the object refused and gave back.
/// The refused block's pool hit served no allocation: the next allocation of the thread (a
/// buffer's, without a pool) is new, not cached.
#[test]
fn failed_allocations_and_refused_blocks_record_nothing() {
    let _l = lock();
    for device in common::devices() {
        let exhausted: Arc<dyn MemoryResource> = Arc::new(Exhausted);
        let (cache, _) = pool(&device);
        let pooled: Arc<dyn MemoryResource> = cache.clone();
        // Warm the pool: a cached block of N/2 (for the short one) and of host memory.
        drop(Memory::with_options(&device, MemoryKind::Device, N / 2, from(&pooled)).unwrap());
        drop(Memory::with_options(&device, MemoryKind::Host { pinned: false }, N, from(&pooled)).unwrap());
        device.stream().synchronize().unwrap();
        for short in [true, false] {
            let wrong: Arc<dyn MemoryResource> = Arc::new(Wrong { inner: pooled.clone(), short });
            trace::start(TraceOptions::default()).unwrap();
            let bad_alignment = AllocationOptions { resource: Some(pooled.clone()), alignment: 3 };
            assert!(Memory::with_options(&device, MemoryKind::Device, N, bad_alignment).is_err());
            assert!(Memory::with_options(&device, MemoryKind::Device, N, from(&exhausted)).is_err());
            assert!(DeviceBuffer::with_options(&device, MemoryKind::Device, N, from(&exhausted)).is_err());
            let refused = Memory::with_options(&device, MemoryKind::Device, N, from(&wrong));
            assert!(matches!(refused, Err(Error::InvalidArgument { .. })), "{device}: {refused:?}");
            // The next allocation on this thread: a buffer's device copy, from no pool.
            let mut buf = common::direct(&device, N / 4);
            buf.host_mut().unwrap().fill(1);
            buf.sync_to_device().unwrap();
            let buffer = buf.raw().id();
            drop(buf);
            let recorded = trace::stop().unwrap();
            let hits = recorded
                .events
                .iter()
                .filter(|e| matches!(e.kind, EventKind::Pool { hit: true, .. }))
                .count();
            assert_eq!(hits, 1, "{device}: the refused block was a pool hit (short: {short})");
            let mine: Vec<_> = memory_events(&recorded)
                .into_iter()
                .filter(|k| !matches!(k, EventKind::Allocate { buffer: b, .. } | EventKind::Free { buffer: Some(b), .. } if *b == buffer))
                .collect();
            assert!(mine.is_empty(), "{device}: failed allocations recorded {mine:?}");
            assert_all_upstream(&recorded, buffer, &device);
        }
        assert_eq!(cache.stats().bytes_in_use, 0, "{device}: the refused blocks went back");
    }
}

/// The same for a buffer: a block its resource handed out from a pool (a hit) and the buffer
/// refused served no allocation, and the next allocation on the thread, from no pool, is
/// `upstream` (it was recorded as `cache`, the refused block's hit).
#[test]
fn a_block_a_buffer_refused_leaves_no_pool_hit_behind() {
    let _l = lock();
    for device in common::devices() {
        let (cache, _) = pool(&device);
        let pooled: Arc<dyn MemoryResource> = cache.clone();
        // Cached blocks of half the size, which the short resource hands out.
        for kind in [MemoryKind::Device, MemoryKind::Host { pinned: false }] {
            drop(Memory::with_options(&device, kind, N / 2, from(&pooled)).unwrap());
        }
        device.stream().synchronize().unwrap();
        let wrong: Arc<dyn MemoryResource> = Arc::new(Wrong { inner: pooled.clone(), short: true });
        trace::start(TraceOptions::default()).unwrap();
        let options = lazybuf::BufferOptions {
            device: Some(device.clone()),
            resource: Some(wrong),
            ..lazybuf::BufferOptions::default()
        };
        let mut refused = lazybuf::UnifiedBuffer::<u8>::with_options(&[N], options).unwrap();
        let failed = refused.sync_to_device();
        assert!(matches!(failed, Err(Error::InvalidArgument { .. })), "{device}: {failed:?}");
        let mut buf = common::direct(&device, N / 4);
        buf.host_mut().unwrap().fill(1);
        buf.sync_to_device().unwrap();
        let buffer = buf.raw().id();
        drop((buf, refused));
        let recorded = trace::stop().unwrap();
        let hits =
            recorded.events.iter().filter(|e| matches!(e.kind, EventKind::Pool { hit: true, .. })).count();
        assert!(hits >= 1, "{device}: the refused block was no pool hit");
        assert_all_upstream(&recorded, buffer, &device);
        assert_eq!(cache.stats().bytes_in_use, 0, "{device}: the refused block went back");
    }
}

/// Memory lazybuf did not allocate (borrowed from the caller) is no allocation, and its drop
/// frees nothing: neither is recorded.
#[test]
fn borrowed_memory_records_no_allocation_and_no_free() {
    let _l = lock();
    let mut borrowed_on = Vec::new();
    for device in common::devices() {
        let owned = common::device_memory(&device, N);
        trace::start(TraceOptions::default()).unwrap();
        // SAFETY: `owned` is device memory of `device`, of N bytes, alive and unused while
        // the borrowed object lives.
        let mut borrowed = unsafe { Memory::borrowed(&device, owned.raw(), N) };
        // (wgpu cannot use memory it did not allocate: refused, and nothing recorded.)
        let id = borrowed.as_mut().ok().map(|b| {
            b.copy_from_host(&[3; N]).unwrap();
            b.id()
        });
        let worked = borrowed.is_ok();
        drop(borrowed);
        let recorded = trace::stop().unwrap();
        drop(owned);
        assert!(memory_events(&recorded).is_empty(), "{device}: {recorded:?}");
        if let Some(id) = id {
            assert!(of(&recorded, id).is_empty(), "{device}: {recorded:?}");
        }
        if worked {
            borrowed_on.push(device.backend_kind());
        }
    }
    assert!(borrowed_on.contains(&lazybuf::BackendKind::HOST), "{borrowed_on:?}");
}

/// Nothing is recorded while the recorder is off: an object made before it started shows only
/// its free, one dropped after it stopped only its allocation, one made and dropped while off
/// (through a pool) nothing.
#[test]
fn recording_off_records_nothing() {
    let _l = lock();
    for device in common::devices() {
        let (cache, _) = pool(&device);
        let pooled: Arc<dyn MemoryResource> = cache.clone();
        let before = Memory::with_options(&device, MemoryKind::Device, N, from(&pooled)).unwrap();
        let unseen = Memory::with_options(&device, MemoryKind::Device, N, from(&pooled)).unwrap();
        let unseen_buffer =
            DeviceBuffer::with_options(&device, MemoryKind::Device, N, from(&pooled)).unwrap();
        let (unseen_id, unseen_buffer_id) = (unseen.id(), unseen_buffer.id());
        drop((unseen, unseen_buffer));
        trace::start(TraceOptions::default()).unwrap();
        let before_id = before.id();
        drop(before);
        let after = Memory::with_options(&device, MemoryKind::Device, N, from(&pooled)).unwrap();
        let recorded = trace::stop().unwrap();
        let after_id = after.id();
        drop(after);
        let later = Memory::with_options(&device, MemoryKind::Device, N, from(&pooled)).unwrap();
        let later_id = later.id();
        drop(later);
        let name = device.to_string();
        assert_eq!(of(&recorded, before_id), [Mem::Free(name.clone(), Shown::Device, N)], "{device}");
        assert_eq!(of(&recorded, after_id), [Mem::Alloc(name, Shown::Device, N, Source::Cache)], "{device}");
        assert!(of(&recorded, unseen_id).is_empty() && of(&recorded, unseen_buffer_id).is_empty());
        assert!(of(&recorded, later_id).is_empty());
        assert_eq!(memory_events(&recorded).len(), 2, "{device}: {recorded:?}");
        // Started again: nothing of what happened while it was off.
        trace::start(TraceOptions::default()).unwrap();
        assert!(trace::stop().unwrap().events.is_empty(), "{device}");
    }
}

/// Threads that allocate and drop memory objects through one pool at once: each object's
/// allocation and free are recorded once, in order, on the thread that made and dropped it, and
/// each allocation's source is the last pool lookup of its own thread.
#[test]
fn threads_record_their_own_objects() {
    let _l = lock();
    const THREADS: usize = 4;
    const ROUNDS: usize = 40;
    for device in common::devices() {
        let (cache, _) = pool(&device);
        let pooled: Arc<dyn MemoryResource> = cache.clone();
        trace::start(TraceOptions::default()).unwrap();
        let ids: Vec<Vec<u64>> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..THREADS)
                .map(|t| {
                    let (device, pooled) = (&device, &pooled);
                    scope.spawn(move || {
                        let mut ids = Vec::new();
                        for round in 0..ROUNDS {
                            let kind = if (t + round) % 2 == 0 {
                                MemoryKind::Device
                            } else {
                                MemoryKind::Host { pinned: false }
                            };
                            let m = Memory::with_options(device, kind, N * (1 + round % 3), from(pooled))
                                .unwrap();
                            ids.push(m.id());
                            if round % 5 == 0 {
                                let mut db =
                                    DeviceBuffer::with_options(device, MemoryKind::Device, N, from(pooled))
                                        .unwrap();
                                db.reserve(2 * N).unwrap();
                                ids.push(db.id());
                            }
                        }
                        ids
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).collect()
        });
        let recorded = trace::stop().unwrap();
        for id in ids.iter().flatten() {
            let events: Vec<(bool, u64)> = recorded
                .events
                .iter()
                .filter_map(|e| match &e.kind {
                    EventKind::Allocate { buffer, .. } if buffer == id => Some((true, e.thread)),
                    EventKind::Free { buffer: Some(b), .. } if b == id => Some((false, e.thread)),
                    _ => None,
                })
                .collect();
            let thread = events[0].1;
            let expected: &[(bool, u64)] = if events.len() == 2 {
                &[(true, thread), (false, thread)]
            } else {
                // A DeviceBuffer that grew: two blocks, each allocated, then freed.
                &[(true, thread), (true, thread), (false, thread), (false, thread)]
            };
            assert_eq!(events, expected, "{device}: object {id}");
        }
        // Per thread, in order: a pool's hit is the next allocation's source.
        let mut last_lookup: BTreeMap<u64, bool> = BTreeMap::new();
        let mut allocations = 0;
        for event in &recorded.events {
            match &event.kind {
                EventKind::Pool { hit, .. } => {
                    last_lookup.insert(event.thread, *hit);
                }
                EventKind::Allocate { source, .. } => {
                    let hit = last_lookup.remove(&event.thread);
                    assert_eq!(*source == Source::Cache, hit == Some(true), "{device}: {event:?}");
                    allocations += 1;
                }
                _ => {}
            }
        }
        assert_eq!(allocations, THREADS * (ROUNDS + 2 * ROUNDS.div_ceil(5)), "{device}");
        assert_eq!(cache.stats().bytes_in_use, 0, "{device}");
    }
}

/// Memory in use per device and kind, as the trace has it: allocations less frees.
fn in_use(trace: &Trace) -> BTreeMap<(String, Shown), i128> {
    let mut out = BTreeMap::new();
    for event in &trace.events {
        let (device, kind, delta) = match &event.kind {
            EventKind::Allocate { device, kind, bytes, .. } => (device, kind, *bytes as i128),
            EventKind::Free { device, kind, bytes, .. } => (device, kind, -(*bytes as i128)),
            _ => continue,
        };
        *out.entry((device.clone(), *kind)).or_insert(0) += delta;
    }
    out
}

/// The last value of each memory counter of the trace's Chrome JSON, by its name.
fn counters(trace: &Trace) -> BTreeMap<String, u64> {
    let doc: Value = serde_json::from_str(&trace.to_chrome_json()).unwrap();
    let mut out = BTreeMap::new();
    for e in doc["traceEvents"].as_array().unwrap() {
        if e["ph"] == "C" {
            assert_eq!(e["cat"], "memory", "{e}");
            out.insert(e["name"].as_str().unwrap().to_string(), e["args"]["bytes"].as_u64().unwrap());
        }
    }
    out
}

/// The trace's allocations agree with the memory in use: at every step of a mix of objects of
/// every kind the device offers (and device buffers that grow and shrink), the bytes allocated
/// less the bytes freed per kind are the bytes the pool has handed out of that kind, and are
/// the JSON's memory counter of that device and kind; at the end, none. The free events of the
/// JSON name their object.
#[test]
fn the_trace_agrees_with_the_memory_in_use() {
    let _l = lock();
    for device in common::devices() {
        let name = device.to_string();
        let (cache, stats) = pool(&device);
        let pooled: Arc<dyn MemoryResource> = cache.clone();
        let check = |what: &str| {
            let now = trace::snapshot().unwrap();
            let traced = in_use(&now);
            let json = counters(&now);
            for (kind, shown) in KINDS {
                let handed_out = i128::from(cache.usage(|k| k == kind).bytes_in_use);
                let ours = traced.get(&(name.clone(), shown)).copied().unwrap_or(0);
                assert_eq!(ours, handed_out, "{device} {}: {what}", shown.name());
                let counter = json.get(&format!("memory {name} {}", shown.name()));
                assert_eq!(
                    counter.map_or(0, |c| i128::from(*c)),
                    handed_out,
                    "{device} {}: {what}",
                    shown.name()
                );
            }
            // What the runtime holds is at least what is in use (the rest is cached).
            assert!(
                stats.statistics().current_bytes as i128 >= traced.values().sum::<i128>(),
                "{device}: {what}"
            );
        };
        trace::start(TraceOptions::default()).unwrap();
        let mut objects = Vec::new();
        let mut buffers = Vec::new();
        for round in 0..6 {
            for (kind, _) in KINDS {
                if let Ok(m) = Memory::with_options(&device, kind, N << (round % 3), from(&pooled)) {
                    objects.push(m);
                }
            }
            buffers.push(DeviceBuffer::with_options(&device, MemoryKind::Device, N, from(&pooled)).unwrap());
            check(&format!("round {round}: allocated"));
            if let Some(db) = buffers.first_mut() {
                db.reserve(db.capacity() + N).unwrap();
            }
            if round % 2 == 1 {
                objects.drain(..objects.len() / 2);
                let first = buffers.first_mut().unwrap();
                first.resize(N).unwrap();
                first.shrink_to_fit().unwrap();
            }
            check(&format!("round {round}: some dropped"));
        }
        objects.clear();
        buffers.clear();
        check("all dropped");
        let recorded = trace::stop().unwrap();
        assert!(in_use(&recorded).values().all(|b| *b == 0), "{device}");
        let doc: Value = serde_json::from_str(&recorded.to_chrome_json()).unwrap();
        let frees = doc["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["name"].as_str().is_some_and(|n| n.starts_with("free ")));
        assert!(frees.clone().count() > 0 && frees.clone().all(|e| e["args"]["buffer"].is_u64()), "{device}");
        // Every kind the timeline shows is named as the recorder names it.
        for e in
            doc["traceEvents"].as_array().unwrap().iter().filter(|e| e["cat"] == "memory" && e["ph"] == "i")
        {
            let kind = e["args"]["kind"].as_str().unwrap();
            assert!(["device", "host", "pinned", "shared"].contains(&kind), "{e}");
            assert!(e["name"].as_str().unwrap().contains(kind), "{e}");
        }
    }
}
