//! The transfer guard and the event recorder see memory objects' copies (`lazybuf::memory`),
//! on every device: each copy method of `DeviceAllocation` and `DeviceBuffer` (uploads,
//! downloads, copies between objects, `to`, `from_host`, `try_clone`, a reallocation's move) is
//! refused under `disallow_explicit` (implicit under `disallow`) with the object's id, the
//! direction, the bytes and the call, and then nothing has changed (data, sizes, capacities);
//! under `log_explicit` it runs, is logged once and recorded once. A copy that moves no bytes
//! between memories (host memory to host memory: the host kinds, every kind on the host
//! device; an empty copy) is neither refused, logged nor recorded.
//!
//! The recorder and the guard's log hook are process-wide: this module's tests hold `LOCK`,
//! no other module of the suite uses them, and what they see is filtered to this thread's
//! copies (log lines) or to this module's objects (events). The guard levels are this
//! thread's own (`guard::scope`).

use crate::common;

use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::ThreadId;

use lazybuf::observe::guard::{self, GuardLevel, GuardLevels};
use lazybuf::observe::trace::{self, EventKind, TraceOptions};
use lazybuf::observe::{self, Cause, Direction, TransferInfo};
use lazybuf::{BackendKind, Device, DeviceAllocation, DeviceBuffer, Error, Memory, MemoryKind};

static LOCK: Mutex<()> = Mutex::new(());

fn lock() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

const N: usize = 4000;

fn bytes(seed: u8, n: usize) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// Whether `kind` memory on `device` is memory only the device's copies reach (a copy between
/// it and the host moves bytes between memories).
fn on_device(device: &Device, kind: MemoryKind) -> bool {
    kind != (MemoryKind::Host { pinned: false }) && device.backend_kind() != BackendKind::HOST
}

/// The direction of a copy between memories `from` and `to` (each on a device or not), `None`
/// when both are host memory.
fn direction(from: bool, to: bool) -> Option<Direction> {
    match (from, to) {
        (false, false) => None,
        (false, true) => Some(Direction::HostToDevice),
        (true, false) => Some(Direction::DeviceToHost),
        (true, true) => Some(Direction::DeviceToDevice),
    }
}

/// What a copy must look like to the guard: `buffer` `None` for an object the call makes.
#[derive(Clone, Copy, Debug)]
struct Expect {
    buffer: Option<u64>,
    direction: Direction,
    bytes: usize,
    call: &'static str,
    explicit: bool,
}

/// The objects of one device, and the state a refused copy must not change.
struct Objects {
    /// Memory of the kind under test.
    m: Memory,
    /// Device memory on the same device (a source and destination of copies between objects).
    other: Memory,
    db: DeviceBuffer,
    db2: DeviceBuffer,
}

type Snapshot = (Vec<u8>, Vec<u8>, Vec<u8>, Vec<u8>, usize, usize, usize, usize);

impl Objects {
    fn snapshot(&self) -> Snapshot {
        let _allow = guard::scope(GuardLevels::all(GuardLevel::Allow));
        (
            self.m.to_vec().unwrap(),
            self.other.to_vec().unwrap(),
            self.db.to_vec().unwrap(),
            self.db2.to_vec().unwrap(),
            self.db.size(),
            self.db.capacity(),
            self.db2.size(),
            self.db2.capacity(),
        )
    }

    fn ids(&self) -> Vec<u64> {
        vec![self.m.id(), self.other.id(), self.db.id(), self.db2.id()]
    }
}

/// The guard's log lines of this thread, while a case runs.
fn log_hook() -> Arc<Mutex<Vec<(ThreadId, TransferInfo)>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&seen);
    guard::set_log_hook(Some(Arc::new(move |info: &TransferInfo, _level| {
        sink.lock().unwrap().push((std::thread::current().id(), info.clone()));
    })));
    seen
}

fn matches(info: &TransferInfo, expect: &Expect, made: Option<u64>) -> bool {
    let buffer = expect.buffer.or(made);
    buffer.is_none_or(|b| info.buffer == b)
        && info.direction == expect.direction
        && info.bytes == expect.bytes
        && info.cause.call == expect.call
        && info.cause.reason.is_explicit() == expect.explicit
}

/// Runs `op` (which returns the id of an object it made, if any) under `disallow_explicit`:
/// refused as `expect` says with nothing changed, or (`expect` `None`) run; then under
/// `log_explicit` with the recorder on: logged and recorded once as `expect` says, or not at all.
fn case(
    what: &str,
    objects: &mut Objects,
    expect: Option<Expect>,
    mut op: impl FnMut(&mut Objects) -> lazybuf::Result<Option<u64>>,
) {
    let before = objects.snapshot();
    {
        let _scope = guard::scope(GuardLevels::all(GuardLevel::DisallowExplicit));
        let result = op(objects);
        match (&expect, result) {
            (Some(e), Err(Error::TransferGuard { buffer, direction, bytes, call, explicit, level, .. })) => {
                assert!(e.buffer.is_none_or(|b| b == buffer), "{what}: buffer {buffer}, expected {e:?}");
                assert_eq!(
                    (direction, bytes, call, explicit),
                    (e.direction, e.bytes, e.call, e.explicit),
                    "{what}"
                );
                assert_eq!(level, GuardLevel::DisallowExplicit, "{what}");
            }
            (Some(e), other) => panic!("{what}: expected a refusal as {e:?}, got {other:?}"),
            (None, result) => {
                result.unwrap_or_else(|err| panic!("{what}: moves no bytes, must run: {err}"));
            }
        }
    }
    if expect.is_some() {
        assert!(objects.snapshot() == before, "{what}: a refused copy changed something");
    }
    let logged = log_hook();
    trace::start(TraceOptions::default()).unwrap();
    let made = {
        let _scope = guard::scope(GuardLevels::all(GuardLevel::LogExplicit));
        op(objects)
    };
    let recorded = trace::stop().unwrap();
    guard::set_log_hook(None);
    let made = made.unwrap_or_else(|err| panic!("{what}: {err}"));
    let me = std::thread::current().id();
    let logged: Vec<TransferInfo> =
        logged.lock().unwrap().iter().filter(|(t, _)| *t == me).map(|(_, i)| i.clone()).collect();
    let mut ids = objects.ids();
    ids.extend(made);
    ids.extend(expect.and_then(|e| e.buffer));
    let recorded: Vec<TransferInfo> = recorded
        .events
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::Transfer { info, duration, .. } if ids.contains(&info.buffer) => {
                assert!(duration.is_some(), "{what}: the copy was waited for");
                Some(info)
            }
            _ => None,
        })
        .collect();
    match expect {
        Some(e) => {
            assert!(
                logged.len() == 1 && matches(&logged[0], &e, made),
                "{what}: logged {logged:?}, expected {e:?}"
            );
            assert!(
                recorded.len() == 1 && matches(&recorded[0], &e, made),
                "{what}: recorded {recorded:?}, expected {e:?}"
            );
            assert_eq!(logged[0], recorded[0], "{what}");
        }
        None => {
            assert!(logged.is_empty(), "{what}: moves no bytes, logged {logged:?}");
            assert!(recorded.is_empty(), "{what}: moves no bytes, recorded {recorded:?}");
        }
    }
}

fn expect(
    buffer: Option<u64>,
    direction: Option<Direction>,
    bytes: usize,
    call: &'static str,
    explicit: bool,
) -> Option<Expect> {
    direction.filter(|_| bytes > 0).map(|direction| Expect { buffer, direction, bytes, call, explicit })
}

/// `kind` memory of `n` bytes on `device`, `None` where the device has none (shared memory,
/// pinned memory on wgpu).
fn memory(device: &Device, kind: MemoryKind, n: usize) -> Option<Memory> {
    let mut m = Memory::new(device, kind, n).ok()?;
    let _allow = guard::scope(GuardLevels::all(GuardLevel::Allow));
    m.copy_from_host(&bytes(kind.name().len() as u8, n)).unwrap();
    Some(m)
}

fn objects(device: &Device, kind: MemoryKind, n: usize) -> Option<Objects> {
    let _allow = guard::scope(GuardLevels::all(GuardLevel::Allow));
    let m = memory(device, kind, n)?;
    let other = memory(device, MemoryKind::Device, n).unwrap();
    let db = DeviceBuffer::from_host(device, &bytes(3, n)).unwrap();
    let db2 = DeviceBuffer::from_host(device, &bytes(4, n)).unwrap();
    Some(Objects { m, other, db, db2 })
}

#[test]
fn every_memory_copy_is_refused_logged_and_recorded() {
    let _l = lock();
    for device in common::devices() {
        for kind in [MemoryKind::Device, MemoryKind::Host { pinned: false }, MemoryKind::Shared] {
            for n in [N, 0] {
                let Some(mut o) = objects(&device, kind, n) else { continue };
                let what = |op: &str| format!("{device} {} memory of {n} bytes: {op}", kind.name());
                let (mine, dev) = (on_device(&device, kind), on_device(&device, MemoryKind::Device));
                let id = o.m.id();
                let src = bytes(9, n);

                let e = expect(Some(id), direction(false, mine), n, "copy_from_host", true);
                case(&what("copy_from_host"), &mut o, e, |o| o.m.copy_from_host(&src).map(|()| None));
                let e = expect(Some(id), direction(mine, false), n, "copy_to_host", true);
                case(&what("copy_to_host"), &mut o, e, |o| o.m.copy_to_host(&mut vec![0; n]).map(|()| None));
                let e = expect(Some(id), direction(mine, false), n, "to_vec", true);
                case(&what("to_vec"), &mut o, e, |o| o.m.to_vec().map(|_| None));
                let e = expect(Some(id), direction(dev, mine), n, "copy_from", true);
                case(&what("copy_from"), &mut o, e, |o| o.m.copy_from(&o.other).map(|()| None));
                let e = expect(Some(o.other.id()), direction(mine, dev), n / 2, "copy_from", true);
                case(&what("copy_prefix_from"), &mut o, e, |o| {
                    o.other.copy_prefix_from(&o.m, n / 2).map(|()| None)
                });
                let e = expect(Some(id), direction(mine, dev), n, "to", true);
                case(&what("to"), &mut o, e, |o| o.m.to(&device, MemoryKind::Device).map(|_| None));
                let host = MemoryKind::Host { pinned: false };
                let e = expect(Some(id), direction(mine, false), n, "to", true);
                case(&what("to host"), &mut o, e, |o| o.m.to(&device, host).map(|_| None));
                // The running call's cause names the copy (a binding's method).
                let e = expect(Some(id), direction(mine, false), n, "mine", false);
                case(&what("observe::call"), &mut o, e, |o| {
                    observe::call(Cause::access("mine"), || o.m.copy_to_host(&mut vec![0; n])).map(|()| None)
                });

                // DeviceBuffer (device memory).
                let (db, db2) = (o.db.id(), o.db2.id());
                let e = expect(None, direction(false, dev), n, "from_host", true);
                case(&what("DeviceBuffer::from_host"), &mut o, e, |_| {
                    DeviceBuffer::from_host(&device, &src).map(|b| Some(b.id()))
                });
                let e = expect(Some(db), direction(false, dev), n, "copy_from_host", true);
                case(&what("DeviceBuffer::copy_from_host"), &mut o, e, |o| {
                    o.db.copy_from_host(&src).map(|()| None)
                });
                let e = expect(Some(db), direction(dev, false), n, "copy_to_host", true);
                case(&what("DeviceBuffer::copy_to_host"), &mut o, e, |o| {
                    o.db.copy_to_host(&mut vec![0; n + 1]).map(|()| None)
                });
                let e = expect(Some(db), direction(dev, false), n, "to_vec", true);
                case(&what("DeviceBuffer::to_vec"), &mut o, e, |o| o.db.to_vec().map(|_| None));
                let e = expect(Some(db), direction(mine, dev), n, "copy_from_memory", true);
                case(&what("DeviceBuffer::copy_from_memory"), &mut o, e, |o| {
                    o.db.copy_from_memory(&o.m, n).map(|()| None)
                });
                let e = expect(Some(db), direction(dev, dev), n, "copy_from", true);
                case(&what("DeviceBuffer::copy_from"), &mut o, e, |o| o.db.copy_from(&o.db2).map(|()| None));
                let e = expect(Some(db), direction(dev, dev), n, "try_clone", true);
                case(&what("DeviceBuffer::try_clone"), &mut o, e, |o| o.db.try_clone().map(|_| None));
                // A reallocation moves the contents: implicit, named by the call that grows.
                let e = expect(Some(db), direction(dev, dev), n, "reserve", false);
                case(&what("DeviceBuffer::reserve"), &mut o, e, |o| {
                    let capacity = o.db.capacity();
                    o.db.reserve(capacity + 16).map(|()| None)
                });
                if n > 0 {
                    // (An empty buffer's later reallocations would move the bytes the first
                    // added.)
                    let e = expect(Some(db2), direction(dev, dev), n, "resize", false);
                    case(&what("DeviceBuffer::resize"), &mut o, e, |o| {
                        let capacity = o.db2.capacity();
                        o.db2.resize(capacity + 8).map(|()| None)
                    });
                    o.db2.resize(n).unwrap(); // within the capacity: nothing moves
                    assert!(o.db2.capacity() > n);
                    let e = expect(Some(db2), direction(dev, dev), n, "shrink_to_fit", false);
                    case(&what("DeviceBuffer::shrink_to_fit"), &mut o, e, |o| {
                        o.db2.shrink_to_fit().map(|()| None)
                    });
                }
                // The id stays across reallocations.
                assert_eq!((o.db.id(), o.db2.id()), (db, db2), "{device}");
            }
        }
    }
}

/// Copies between devices: one copy (device to device, or with the host device's memory,
/// host to device and back), on every ordered pair of devices.
#[test]
fn copies_between_devices_are_seen_once() {
    let _l = lock();
    let devices = common::devices();
    for a in &devices {
        for b in &devices {
            if a == b {
                continue;
            }
            let what = format!("{a} -> {b}");
            let Some(mut o) = objects(b, MemoryKind::Device, N) else { continue };
            let src = memory(a, MemoryKind::Device, N).unwrap();
            let dir = direction(on_device(a, MemoryKind::Device), on_device(b, MemoryKind::Device));
            let e = expect(Some(o.m.id()), dir, N, "copy_from", true);
            case(&what, &mut o, e, |o| o.m.copy_from(&src).map(|()| None));
            let e = expect(Some(src.id()), dir, N, "to", true);
            case(&format!("{what}: to"), &mut o, e, |_| src.to(b, MemoryKind::Device).map(|_| None));
        }
    }
}

/// A typed allocation's copies count bytes, not elements.
#[test]
fn typed_copies_count_bytes() {
    let _l = lock();
    for device in common::devices() {
        let Some(mut o) = objects(&device, MemoryKind::Device, 8) else { continue };
        let mut typed = DeviceAllocation::<u32>::new(&device, MemoryKind::Device, 100).unwrap();
        let e = expect(
            Some(typed.id()),
            direction(false, on_device(&device, MemoryKind::Device)),
            400,
            "copy_from_host",
            true,
        );
        let values: Vec<u32> = (0..100).collect();
        case(&format!("{device}: u32"), &mut o, e, |_| typed.copy_from_host(&values).map(|()| None));
    }
}
