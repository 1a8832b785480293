"""lazybuf.trace records the memory of memory objects, on every device: making a MemoryDevice,
MemoryHost (pinned memory) or MemoryShared, a DeviceBuffer (its reallocations, copies and
unpickled copies included) or an ``mr.allocate`` block is one ``allocate`` event, its release
one ``free`` event, under the object's buffer_id, with its device, kind (``device``,
``pinned``, ``shared``), bytes and source (``cache``: a pool's cached block; ``upstream``: a new
one), in that order. Foreign memory (DLPack, the buffer protocol) is not lazybuf's: no event.
Recording off records nothing; threads record their own objects; the trace's memory, its JSON
counters and ``lazybuf trace summary`` agree with the memory the resource has handed out."""

import copy
import gc
import json
import pickle
import threading

import numpy as np
import pytest

import lazybuf
import lazybuf.mr as lmr
from conftest import one_selector_per_backend

N = 4096  # a pool's size class: a pooled block is exactly this large
KINDS = [(lazybuf.MemoryDevice, "device"), (lazybuf.MemoryHost, "pinned"), (lazybuf.MemoryShared, "shared")]


def _devices() -> list[str]:
    return one_selector_per_backend()


@pytest.fixture(autouse=True)
def _not_recording():
    assert not lazybuf.trace.is_recording()
    yield
    if lazybuf.trace.is_recording():
        lazybuf.trace.stop()


def _with_resource(device, mr):
    lmr.set_current_device_resource(mr, device)


def _name(obj) -> str:
    """The device as events name it."""
    d = obj.device
    return f"{d.name} ({d.backend})"


def _memory(events, ident) -> list[tuple]:
    """The allocations and frees of object ``ident``, in order, without times and threads."""
    return [
        (e["kind"], e["device"], e["memory"], e["bytes"], e.get("source"))
        for e in events
        if e["kind"] in ("allocate", "free") and e["buffer"] == ident
    ]


def _all_memory(events) -> list[dict]:
    return [e for e in events if e["kind"] in ("allocate", "free")]


def _make(cls, n, device):
    """An object of ``cls``, or None where the device has no such memory (an error, which must
    record nothing)."""
    try:
        return cls(n, device=device)
    except (ValueError, RuntimeError, MemoryError):
        assert cls is not lazybuf.MemoryDevice, "every device has device memory"
        return None


@pytest.mark.parametrize("device", _devices())
def test_each_kind_records_one_allocation_and_one_free(device):
    pool = lmr.PoolMemoryResource(lmr.DirectMemoryResource())
    _with_resource(device, pool)
    try:
        made = []
        for cls, kind in KINDS:
            for n in (N, 0):
                gc.collect()
                with lazybuf.trace.record() as rec:
                    first = _make(cls, n, device)
                    if first is None:
                        continue
                    name, ident, on = _name(first), first.buffer_id, first.device
                    del first
                    on.synchronize()  # a cached host block is reused once its last use is done
                    second = cls(n, device=device)
                    second_id = second.buffer_id
                    del second
                made.append(kind)
                events = rec.trace.events()
                source = "upstream" if n == 0 else "cache"  # an empty request bypasses the cache
                assert _memory(events, ident) == [
                    ("allocate", name, kind, n, "upstream"),
                    ("free", name, kind, n, None),
                ], (cls, n)
                assert _memory(events, second_id) == [
                    ("allocate", name, kind, n, source),
                    ("free", name, kind, n, None),
                ], (cls, n)
                # In order, each allocation after the pool lookup that served it.
                lookups = [
                    e["hit"] if e["kind"] == "pool" else e["kind"]
                    for e in events
                    if (e["kind"] == "pool" and e["device"] == name)
                    or (e["kind"] in ("allocate", "free") and e["buffer"] in (ident, second_id))
                ]
                expected = ["allocate", "free"] * 2 if n == 0 else [False, "allocate", "free", True, "allocate", "free"]
                assert lookups == expected, (cls, n, lookups)
        assert "device" in made, made
    finally:
        _with_resource(device, None)


@pytest.mark.parametrize("device", _devices())
def test_a_kind_the_device_lacks_records_nothing(device):
    gc.collect()
    made = []
    with lazybuf.trace.record() as rec:
        for cls, _ in KINDS:
            obj = _make(cls, N, device)
            if obj is not None:
                made.append(obj.buffer_id)
                del obj
    # Every allocation recorded is one of the objects made, and has its free: failed ones
    # left nothing.
    events = _all_memory(rec.trace.events())
    assert [(e["kind"], e["buffer"]) for e in events] == [(k, i) for i in made for k in ("allocate", "free")]


@pytest.mark.parametrize("device", _devices())
def test_device_buffers_record_allocations_reallocations_and_frees(device):
    pool = lmr.PoolMemoryResource(lmr.DirectMemoryResource())
    with lazybuf.trace.record() as rec:
        db = lazybuf.DeviceBuffer(size=N, device=device, mr=pool)
        name, ident = _name(db), db.buffer_id
        db.resize(N // 2)  # within the capacity: nothing
        db.reserve(2 * N)  # a new block, then the old one's free
        db.shrink_to_fit()
        copied = lazybuf.DeviceBuffer.to_device(bytes(N), device=device, mr=pool)
        cloned = copy.copy(copied)
        unpickled = pickle.loads(pickle.dumps(copied))
        others = [copied.buffer_id, cloned.buffer_id, unpickled.buffer_id]
        del db, copied, cloned, unpickled
    events = rec.trace.events()
    dev = lambda n, source: ("allocate", name, "device", n, source)  # noqa: E731
    free = lambda n: ("free", name, "device", n, None)  # noqa: E731
    assert _memory(events, ident) == [
        dev(N, "upstream"),
        dev(2 * N, "upstream"),
        free(N),
        dev(N // 2, "upstream"),
        free(2 * N),
        free(N // 2),
    ]
    assert len(set(others)) == 3 and ident not in others
    for other in others[:2]:  # from this pool: the first takes the cached block of N
        assert [m[0] for m in _memory(events, other)] == ["allocate", "free"], other
        assert _memory(events, other)[0][3] == N
    assert _memory(events, others[0])[0][4] == "cache"
    # Unpickled onto the device's current resource; one allocation and one free all the same.
    assert [m[0] for m in _memory(events, others[2])] == ["allocate", "free"]
    # Each copy into a new buffer comes after its allocation.
    for buffer in [ident, *others]:
        allocated = False
        for e in events:
            if e.get("buffer") == buffer and e["kind"] == "allocate":
                allocated = True
            if e.get("buffer") == buffer and e["kind"] == "transfer":
                assert allocated, (buffer, events)


@pytest.mark.parametrize("device", _devices())
def test_raw_allocations_of_a_resource_are_recorded(device):
    pool = lmr.PoolMemoryResource(lmr.DirectMemoryResource())
    with lazybuf.trace.record() as rec:
        ptr = pool.allocate(N, device=device)
        pool.deallocate(ptr, N)
        ptr = pool.allocate(N, device=device)
        pool.deallocate(ptr, N)
    mine = _all_memory(rec.trace.events())
    assert [(e["kind"], e["memory"], e["bytes"], e.get("source")) for e in mine] == [
        ("allocate", "device", N, "upstream"),
        ("free", "device", N, None),
        ("allocate", "device", N, "cache"),
        ("free", "device", N, None),
    ], mine
    assert mine[0]["buffer"] == mine[1]["buffer"] != mine[2]["buffer"] == mine[3]["buffer"]


@pytest.mark.parametrize("device", _devices())
def test_foreign_memory_is_no_allocation(device):
    m = lazybuf.MemoryDevice(N, device=device)
    source = np.arange(N, dtype=np.uint8)
    gc.collect()
    with lazybuf.trace.record() as rec:
        m.copy_from_device(source)  # a NumPy array's memory, through DLPack: borrowed
        m.copy_from_host(memoryview(source))
        out = m.copy_to_host()
    assert bytes(out) == source.tobytes()
    assert _all_memory(rec.trace.events()) == []


@pytest.mark.parametrize("device", _devices())
def test_recording_off_records_nothing(device):
    before = lazybuf.MemoryDevice(N, device=device)
    unseen = lazybuf.DeviceBuffer(size=N, device=device)
    del unseen
    gc.collect()
    with lazybuf.trace.record() as rec:
        before_id = before.buffer_id
        del before
        after = lazybuf.MemoryDevice(N, device=device)
    after_id = after.buffer_id
    del after
    events = rec.trace.events()
    assert [m[0] for m in _memory(events, before_id)] == ["free"]
    assert [m[0] for m in _memory(events, after_id)] == ["allocate"]
    assert len(_all_memory(events)) == 2, events
    with lazybuf.trace.record() as rec:
        pass
    assert rec.trace.events() == []


@pytest.mark.parametrize("device", _devices())
def test_threads_record_their_own_objects(device):
    ids: list[list[int]] = [[] for _ in range(4)]

    def work(mine):
        for i in range(30):
            if i % 2:
                obj = lazybuf.MemoryDevice(N * (1 + i % 3), device=device)
            else:
                obj = lazybuf.DeviceBuffer(size=N, device=device)
            mine.append(obj.buffer_id)
            del obj

    with lazybuf.trace.record() as rec:
        threads = [threading.Thread(target=work, args=(mine,)) for mine in ids]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    events = rec.trace.events()
    for ident in (i for mine in ids for i in mine):
        seen = [(e["kind"], e["thread"]) for e in _all_memory(events) if e["buffer"] == ident]
        assert [k for k, _ in seen] == ["allocate", "free"] and seen[0][1] == seen[1][1], seen
    assert sum(map(len, ids)) == 4 * 30


def _in_use(events) -> dict:
    out: dict = {}
    for e in _all_memory(events):
        key = (e["device"], e["memory"])
        out[key] = out.get(key, 0) + (e["bytes"] if e["kind"] == "allocate" else -e["bytes"])
    return out


@pytest.mark.parametrize("device", _devices())
def test_the_trace_agrees_with_the_memory_in_use(device, tmp_path, capfd):
    stats = lmr.StatisticsResourceAdaptor(lmr.DirectMemoryResource())
    _with_resource(device, stats)
    gc.collect()
    try:
        with lazybuf.trace.record() as rec:
            objects = []
            for round in range(4):
                for cls, _ in KINDS:
                    obj = _make(cls, N << round, device)
                    if obj is not None:
                        objects.append(obj)
                    del obj
                objects.append(lazybuf.DeviceBuffer(size=N, device=device))
                objects[-1].resize(3 * N)
                if round % 2:
                    del objects[: len(objects) // 2]
                in_use = _in_use(lazybuf.trace.snapshot().events())
                assert sum(in_use.values()) == stats.allocation_counts.current_bytes, (round, in_use)
            name = _name(objects[0])
            kinds = {kind for (_, kind), n in in_use.items() if n > 0}
            peak = lazybuf.trace.snapshot()
            del objects
        assert all(n == 0 for n in _in_use(rec.trace.events()).values())
        assert stats.allocation_counts.current_bytes == 0
    finally:
        _with_resource(device, None)
    # The JSON's counters: memory in use per device and kind, back to 0 at the end.
    doc = json.loads(rec.trace.to_chrome_json())
    counters = {}
    for e in doc["traceEvents"]:
        if e["ph"] == "C":
            counters[e["name"]] = e["args"]["bytes"]
    assert {f"memory {name} {kind}" for kind in kinds} <= set(counters), counters
    assert all(v == 0 for v in counters.values()), counters
    peaks = json.loads(peak.to_chrome_json())
    last = {e["name"]: e["args"]["bytes"] for e in peaks["traceEvents"] if e["ph"] == "C"}
    assert {k: v for k, v in last.items() if v} == {f"memory {d} {k}": n for (d, k), n in in_use.items() if n}
    # And `lazybuf trace summary` names each kind's peak.
    path = tmp_path / "trace.json"
    lazybuf.trace.dump(path, rec.trace)
    assert lazybuf.cli.main(["trace", "summary", str(path)]) == 0
    text = capfd.readouterr().out
    for kind in kinds:
        assert f"peak memory in use, {name} {kind}:" in text, text
