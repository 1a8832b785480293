"""The transfer guard and the recorder see the copies of memory objects and DeviceBuffer, on
every device: each copy method (to_device, copy_to_host, copy_from_host, copy_from_device,
tobytes, copy(), a constructor with copy=True, DLPack's host copy, pickling and unpickling, a
reallocation's move) is refused under disallow_explicit (implicit ones under disallow too)
with the object's buffer_id, the direction, the bytes and the call, changing nothing; under
log_explicit it runs, logged once and recorded once. Copies between host memories (MemoryHost,
every kind on the host device) and empty ones move no bytes between memories: never refused,
logged or recorded."""

import copy
import pickle

import numpy as np
import pytest

import lazybuf
from conftest import one_selector_per_backend

N = 4000


def _devices() -> list[str]:
    return one_selector_per_backend()


def _on_device(device: str, obj) -> bool:
    """Whether obj's memory is memory only the device's copies reach."""
    return device != "host" and not isinstance(obj, lazybuf.MemoryHost)


def _direction(src: bool, dst: bool) -> str | None:
    return {(False, True): "h2d", (True, False): "d2h", (True, True): "d2d"}.get((src, dst))


def _state(objs):
    return [(o.tobytes(), len(o), o.capacity() if isinstance(o, lazybuf.DeviceBuffer) else None) for o in objs]


def _check(caplog, label, fn, objs, expect):
    """Runs fn under disallow_explicit (refused as expect = (buffer_id or None, direction,
    nbytes, call, explicit) says, nothing changed; or, expect None, run), under disallow
    (implicit copies refused, explicit ones run) and under log_explicit with the recorder
    (logged and recorded once, or not at all)."""
    if expect is not None and (expect[2] == 0 or expect[1] is None):
        expect = None
    before = _state(objs)
    levels = ["disallow_explicit", "disallow"]
    for level in levels:
        refused = expect is not None and (level == "disallow_explicit" or not expect[4])
        with lazybuf.transfer_guard(level):
            if refused:
                with pytest.raises(lazybuf.TransferGuardError) as info:
                    fn()
                e = info.value
                if expect[0] is not None:
                    assert e.buffer_id == expect[0], label
                assert (e.direction, e.nbytes, e.call) == expect[1:4], (label, level, str(e))
            else:
                fn()
        if refused:
            assert _state(objs) == before, f"{label}: a refused copy changed something"
    caplog.clear()
    caplog.set_level("WARNING", logger="lazybuf.transfer_guard")
    with lazybuf.trace.record() as rec:
        with lazybuf.transfer_guard("log_explicit"):
            fn()
    copies = [e for e in rec.trace.events() if e["kind"] == "transfer"]
    lines = [r.getMessage() for r in caplog.records if r.name == "lazybuf.transfer_guard"]
    caplog.clear()
    if expect is None:
        assert copies == [] and lines == [], (label, copies, lines)
        return
    assert len(copies) == 1 and len(lines) == 1, (label, copies, lines)
    (c,) = copies
    if expect[0] is not None:
        assert c["buffer"] == expect[0], label
        assert f"of buffer {expect[0]}," in lines[0], (label, lines)
    assert (c["direction"], c["bytes"], c["call"]) == expect[1:4], (label, c)
    assert c["reason"] == ("sync" if expect[4] else "access"), (label, c)
    assert c["duration_us"] is not None
    assert f"of {expect[2]} bytes" in lines[0] and expect[3] in lines[0], (label, lines)


def _memories(device: str, n: int):
    made = []
    for cls in (lazybuf.MemoryDevice, lazybuf.MemoryHost, lazybuf.MemoryShared):
        try:
            m = cls(n, device=device)
        except (ValueError, RuntimeError, MemoryError):
            continue  # shared memory, pinned memory: not on every device
        m.copy_from_host(np.arange(n, dtype=np.uint8) * 3)
        made.append(m)
    return made


@pytest.mark.parametrize("n", [N, 0])
@pytest.mark.parametrize("device", _devices())
def test_device_buffer_copies_are_seen(device, n, caplog):
    dev = _on_device(device, None)
    host = np.arange(n, dtype=np.uint8)
    db = lazybuf.to_device(host, device=device)
    db2 = lazybuf.DeviceBuffer.to_device(host[::-1].copy(), device=device)
    objs = [db, db2]
    i = db.buffer_id
    h2d, d2h, d2d = _direction(False, dev), _direction(dev, False), _direction(dev, dev)

    _check(caplog, "to_device", lambda: lazybuf.to_device(host, device=device), objs, (None, h2d, n, "to_device", True))
    _check(
        caplog,
        "DeviceBuffer.to_device",
        lambda: lazybuf.DeviceBuffer.to_device(host, device=device),
        objs,
        (None, h2d, n, "to_device", True),
    )
    _check(caplog, "copy_from_host", lambda: db.copy_from_host(host[::2].copy()), objs, (i, h2d, n // 2, "copy_from_host", True))
    _check(caplog, "copy_to_host", lambda: db.copy_to_host(), objs, (i, d2h, n, "copy_to_host", True))
    out = np.zeros(n, np.uint8)
    _check(caplog, "copy_to_host(ary)", lambda: db.copy_to_host(out), objs, (i, d2h, n, "copy_to_host", True))
    _check(caplog, "tobytes", lambda: db.tobytes(), objs, (i, d2h, n, "tobytes", True))
    _check(caplog, "bytes()", lambda: bytes(db), objs, (i, d2h, n, "tobytes", True))
    _check(caplog, "copy", lambda: db.copy(), objs, (i, d2d, n, "copy", True))
    _check(caplog, "copy.copy", lambda: copy.copy(db), objs, (i, d2d, n, "copy", True))
    _check(caplog, "copy_from_device", lambda: db.copy_from_device(db2), objs, (i, d2d, n, "copy_from_device", True))
    _check(caplog, "pickle.dumps", lambda: pickle.dumps(db), objs, (i, d2h, n, "__reduce__", False))
    data = pickle.dumps(db)
    _check(caplog, "pickle.loads", lambda: pickle.loads(data), objs, (None, h2d, n, "unpickle", False))
    _check(
        caplog, "__dlpack__(copy=True, dl_device=(1, 0))", lambda: db.__dlpack__(copy=True, dl_device=(1, 0)), objs, (i, d2h, n, "__dlpack__", True)
    )
    _check(caplog, "reserve", lambda: db.reserve(db.capacity() + 16), objs, (i, d2d, n, "reserve", False))
    if n:
        j = db2.buffer_id
        _check(caplog, "resize", lambda: db2.resize(db2.capacity() + 8), objs, (j, d2d, n, "resize", False))
        db2.resize(n)  # within the capacity: nothing moves
        _check(caplog, "shrink_to_fit", lambda: db2.shrink_to_fit(), objs, (j, d2d, n, "shrink_to_fit", False))
        assert db2.buffer_id == j
    assert db.buffer_id == i
    assert pickle.loads(pickle.dumps(db)).tobytes() == db.tobytes()


@pytest.mark.parametrize("n", [N, 0])
@pytest.mark.parametrize("device", _devices())
def test_memory_object_copies_are_seen(device, n, caplog):
    host = (np.arange(n, dtype=np.uint8) * 7).astype(np.uint8)
    dst = lazybuf.MemoryDevice(n, device=device)
    for m in _memories(device, n):
        objs = [m, dst]
        name = type(m).__name__
        i, mine, dev = m.buffer_id, _on_device(device, m), _on_device(device, dst)
        to_host, from_host = _direction(mine, False), _direction(False, mine)

        def label(what):
            return f"{name} on {device}: {what}"

        _check(caplog, label("copy_from_host"), lambda: m.copy_from_host(host), objs, (i, from_host, n, "copy_from_host", True))
        _check(caplog, label("copy_to_host"), lambda: m.copy_to_host(), objs, (i, to_host, n, "copy_to_host", True))
        out = np.empty(n, np.uint8)
        _check(caplog, label("copy_to_host(dest)"), lambda: m.copy_to_host(out), objs, (i, to_host, n, "copy_to_host", True))
        _check(caplog, label("tobytes"), lambda: m.tobytes(), objs, (i, to_host, n, "tobytes", True))
        j = dst.buffer_id
        _check(
            caplog,
            label("copy_from_device"),
            lambda: dst.copy_from_device(m),
            objs,
            (j, _direction(mine, dev), n, "copy_from_device", True),
        )
        _check(
            caplog,
            label("MemoryDevice(m, copy=True)"),
            lambda: lazybuf.MemoryDevice(m, copy=True) if name != "MemoryDevice" else lazybuf.MemoryDevice(n, device=device),
            objs,
            (None, _direction(mine, dev), n, "MemoryDevice", True) if name != "MemoryDevice" else None,
        )
        _check(caplog, label("pickle.dumps"), lambda: pickle.dumps(m), objs, (i, to_host, n, "__reduce__", False))
        data = pickle.dumps(m)
        _check(caplog, label("pickle.loads"), lambda: pickle.loads(data), objs, (None, from_host, n, "unpickle", False))
        _check(caplog, label("__dlpack__(copy=True, dl_device=(1, 0))"), lambda: m.__dlpack__(copy=True, dl_device=(1, 0)), objs, (i, to_host, n, "__dlpack__", True))
        # Zero-copy objects share the memory, and its id.
        assert type(m)(m).buffer_id == i
        assert pickle.loads(pickle.dumps(m)).tobytes() == m.tobytes()
        if not isinstance(m, lazybuf.MemoryDevice):
            # The buffer protocol addresses host and shared memory: no copy.
            _check(caplog, label("memoryview"), lambda: bytes(memoryview(m)), objs, None)


def test_the_auditors_script_is_refused_and_recorded(caplog):
    """docs: the auditor's D5 script, on the first device that copies."""
    device = next((d for d in _devices() if d != "host"), None)
    if device is None:
        pytest.skip("no device that copies")
    host = np.arange(N, dtype=np.uint8)
    with lazybuf.transfer_guard("disallow_explicit"):
        with pytest.raises(lazybuf.TransferGuardError) as info:
            lazybuf.to_device(host, device=device)
    assert (info.value.direction, info.value.nbytes, info.value.call) == ("h2d", N, "to_device")
    with lazybuf.trace.record() as rec:
        db = lazybuf.to_device(host, device=device)
        db.copy_from_host(host)
        back = db.copy_to_host()
        m = lazybuf.MemoryDevice(N, device=device)
        m.copy_from_host(host)
        m.copy_to_host()
        m.copy_from_device(db)
        pickle.loads(pickle.dumps(db))
        db.copy()
    np.testing.assert_array_equal(back, host)
    copies = [(e["direction"], e["call"]) for e in rec.trace.events() if e["kind"] == "transfer"]
    assert copies == [
        ("h2d", "to_device"),
        ("h2d", "copy_from_host"),
        ("d2h", "copy_to_host"),
        ("h2d", "copy_from_host"),
        ("d2h", "copy_to_host"),
        ("d2d", "copy_from_device"),
        ("d2h", "__reduce__"),
        ("h2d", "unpickle"),
        ("d2d", "copy"),
    ]
