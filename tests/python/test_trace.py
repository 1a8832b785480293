"""lazybuf.trace on every device: the recorder sees exactly the copies transfer_stats()
counts, the Chrome trace-event JSON it dumps is well formed and its bytes add up, the ring is
bounded, stacks on request, threads, and recording off records nothing."""

import json
import subprocess
import sys
import threading

import numpy as np
import pytest

import lazybuf


def _devices() -> list[str]:
    found = ["host"]
    for d in lazybuf.get_accelerator().devices:
        if d.backend in ("opencl", "wgpu", "cuda") and d.backend not in found:
            found.append(d.backend)
    return found


@pytest.fixture(autouse=True)
def _not_recording():
    assert not lazybuf.trace.is_recording()
    yield
    if lazybuf.trace.is_recording():
        lazybuf.trace.stop()


def _workload(b: lazybuf.UnifiedBuffer) -> None:
    b.copy_from(np.arange(b.size, dtype=b.dtype))
    b.sync_to_device()
    b.mark_device_dirty()
    b.to_numpy()
    b.host[0] = 7
    b.device
    b.sync_to_host_async().wait()
    b.mark_device_dirty()
    b.sync_to_host_async().wait()
    b.host_readonly


def _check_chrome(doc: dict) -> None:
    """The trace-event format's JSON object form, as Perfetto and chrome://tracing read it."""
    assert isinstance(doc["traceEvents"], list)
    for e in doc["traceEvents"]:
        assert isinstance(e["name"], str) and e["ph"] in {"X", "i", "C", "M"}, e
        assert isinstance(e["pid"], int), e
        if e["ph"] != "M":
            assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0, e
        if e["ph"] == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0 and isinstance(e["tid"], int), e
        if e["ph"] == "i":
            assert e["s"] in {"t", "p", "g"}, e
        if e["ph"] == "C":
            assert all(isinstance(v, (int, float)) for v in e["args"].values()), e


@pytest.mark.parametrize("device", _devices())
def test_the_recorder_sees_exactly_the_counted_copies(device, tmp_path):
    b = lazybuf.UnifiedBuffer((1000,), np.float32, device=device)
    with lazybuf.trace.record() as rec:
        _workload(b)
    stats = b.transfer_stats()
    mine = [e for e in rec.trace.events() if e["kind"] == "transfer" and e["buffer"] == b.buffer_id]
    assert sum(e["bytes"] for e in mine if e["direction"] == "h2d") == stats["host_to_device_bytes"]
    assert sum(e["bytes"] for e in mine if e["direction"] == "d2h") == stats["device_to_host_bytes"]
    assert len(mine) == stats["host_to_device_copies"] + stats["device_to_host_copies"]
    # Explicit syncs are "sync", accesses "access".
    reasons = {(e["call"], e["reason"]) for e in mine}
    assert reasons <= {
        ("sync_to_device", "sync"),
        ("to_numpy", "sync"),
        (".device", "access"),
        ("sync_to_host_async", "sync"),
        ("mark_device_dirty", "access"),
        (".host", "access"),
        (".host_readonly", "access"),
    }, reasons
    rows = [r for r in rec.trace.summary_rows() if r[0] == b.buffer_id]
    assert sum(r[4] for r in rows) == stats["host_to_device_bytes"] + stats["device_to_host_bytes"]
    assert (f"{b.buffer_id:>8}" in rec.trace.summary()) == bool(rows)

    path = tmp_path / "trace.json"
    lazybuf.trace.dump(path, rec.trace)
    doc = json.loads(path.read_text())
    _check_chrome(doc)
    copies = [e for e in doc["traceEvents"] if e.get("cat") == "transfer" and e["args"]["buffer"] == b.buffer_id]
    assert sum(e["args"]["bytes"] for e in copies) == stats["host_to_device_bytes"] + stats["device_to_host_bytes"]
    states = [e for e in rec.trace.events() if e["kind"] == "state" and e["buffer"] == b.buffer_id]
    assert states and states[0]["to"] == "HOST_ONLY", states
    allocations = [e for e in rec.trace.events() if e["kind"] == "allocate" and e["buffer"] == b.buffer_id]
    assert len(allocations) == stats["allocations"]


def _copy_from_events(device: str, n: int) -> list[tuple]:
    """The events of a new buffer's copy_from (its host block from the pool's cache), and of a
    copy_from over a newer device copy, without sizes, buffers and times."""
    warm = lazybuf.UnifiedBuffer((n,), np.float32, device=device)
    warm.copy_from(np.ones(n, np.float32))
    warm.device  # its device block too goes to the pool's cache
    del warm
    with lazybuf.trace.record() as rec:
        b = lazybuf.UnifiedBuffer((n,), np.float32, device=device)
        b.copy_from(np.ones(n, np.float32))
        b.device
        b.mark_device_dirty()
        b.copy_from(np.full(n, 2, np.float32))
    assert (b.to_numpy() == 2).all()
    assert b.state == lazybuf.BufferState.HOST_DIRTY
    skip = {"time_us", "time_ns", "thread", "stack", "bytes", "buffer", "duration_us", "duration_ns", "op", "stream"}
    return [
        tuple(sorted((k, v) for k, v in e.items() if k not in skip))
        for e in rec.trace.events()
        if e.get("buffer", b.buffer_id) == b.buffer_id
    ]


@pytest.mark.parametrize("device", _devices())
def test_a_small_copy_from_records_what_a_large_one_records(device):
    # Up to 64 KiB a copy_from that waits for nothing is made without releasing the GIL; the
    # recorder must see it as it sees the usual path (a pool hit, the allocation, the state).
    small, large = _copy_from_events(device, 1024), _copy_from_events(device, 40_000)
    assert small == large, (small, large)
    assert [dict(e)["kind"] for e in small][:3] == ["pool", "allocate", "state"], small


def test_the_ring_is_bounded_and_counts_what_it_dropped():
    b = lazybuf.UnifiedBuffer((10,), np.float32)
    lazybuf.trace.start(capacity=3)
    for _ in range(20):
        b.mark_host_dirty()
        b.mark_device_dirty()
    trace = lazybuf.trace.stop()
    assert len(trace) == 3 and trace.dropped > 0
    assert "dropped" in json.loads(trace.to_chrome_json())["otherData"]


def test_stacks_on_request():
    b = lazybuf.UnifiedBuffer((10,), np.float32)
    with lazybuf.trace.record(python_stack=True) as rec:
        b.mark_host_dirty()
    events = rec.trace.events()
    assert events and all("test_stacks_on_request" in (e["stack"] or "") for e in events if e.get("buffer") == b.buffer_id)
    with lazybuf.trace.record() as rec:
        b.mark_device_dirty()
    assert all(e["stack"] is None for e in rec.trace.events())


def test_recording_off_records_nothing_and_bad_calls_are_clear_errors():
    b = lazybuf.UnifiedBuffer((10,), np.float32)
    with pytest.raises(ValueError, match="not recording"):
        lazybuf.trace.stop()
    with pytest.raises(ValueError, match="not recording"):
        lazybuf.trace.snapshot()
    for bad in (0, -1, 2**64):
        with pytest.raises(ValueError, match="capacity"):
            lazybuf.trace.start(capacity=bad)
    for bad in (1.5, True, "10", None):
        with pytest.raises(TypeError, match="int capacity"):
            lazybuf.trace.start(capacity=bad)
        with pytest.raises(TypeError, match="int capacity"):
            lazybuf.trace.record(capacity=bad)
    lazybuf.trace.start()
    with pytest.raises(ValueError, match="already recording"):
        lazybuf.trace.start()
    lazybuf.trace.stop()
    b.mark_host_dirty()
    b.mark_device_dirty()
    lazybuf.trace.start()
    assert len(lazybuf.trace.snapshot()) == 0
    assert len(lazybuf.trace.stop()) == 0


def test_every_thread_is_recorded():
    buffers = [lazybuf.UnifiedBuffer((100,), np.float32) for _ in range(4)]
    with lazybuf.trace.record() as rec:
        threads = [threading.Thread(target=lambda b=b: (b.mark_host_dirty(), b.mark_device_dirty())) for b in buffers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    events = rec.trace.events()
    ids = {b.buffer_id for b in buffers}
    assert {e["buffer"] for e in events if e["kind"] == "state"} >= ids
    assert len({e["thread"] for e in events if e["kind"] == "state" and e["buffer"] in ids}) == 4


def test_transfer_events_carry_every_documented_field():
    """A hostile pass (2026-11-27): `events()` lacked from, to, stream and op, and the JSON
    lacked stream, which OBSERVING.md lists."""
    device = next((d for d in _devices() if not d.startswith("host")), _devices()[0])
    b = lazybuf.UnifiedBuffer((1000,), np.float32, device=device)
    b.copy_from(np.ones(1000, np.float32))
    with lazybuf.trace.record() as rec:
        b.sync_to_device()
    copies = [e for e in rec.trace.events() if e["kind"] == "transfer"]
    for event in copies:
        assert {"buffer", "direction", "bytes", "from", "to", "call", "reason", "stream", "duration_us", "op"} <= set(event)
    doc = json.loads(rec.trace.to_chrome_json())
    for event in (e for e in doc["traceEvents"] if e.get("cat") == "transfer"):
        assert {"from", "to", "stream", "op"} <= set(event["args"]), event


def test_dump_names_what_it_expects(tmp_path):
    with pytest.raises(TypeError, match="trace must be a lazybuf.trace.Trace"):
        lazybuf.trace.dump(tmp_path / "t.json", "hi")
    assert not (tmp_path / "t.json").exists()


def test_dump_without_a_trace_or_a_recording_names_dump(tmp_path):
    """A hostile pass (2026-11-27): trace.dump(path) with the recorder off said "invalid
    argument for trace.snapshot", a call the caller never made."""
    with pytest.raises(ValueError) as raised:
        lazybuf.trace.dump(tmp_path / "t.json")
    message = str(raised.value)
    assert message.startswith("trace.dump:") and "trace.snapshot" not in message, message
    assert "not recording" in message and "stop()" in message and "start()" in message, message
    assert not (tmp_path / "t.json").exists()


def test_a_summary_without_copies_says_so_as_the_cli_does(tmp_path):
    """A trace with no copy (here the host device's syncs, all zero-copy): `Trace.summary()`
    says `(no copies recorded)` under its header, as `lazybuf trace summary` does, rather than
    a bare header that reads as a cut-off table. A trace with a copy has no such line."""
    with lazybuf.trace.record() as rec:
        b = lazybuf.UnifiedBuffer((1000,), np.float32, device="host")
        b.host[:] = 1.0
        b.sync_to_device()
        b.to_numpy()
    assert rec.trace.summary_rows() == []
    lines = rec.trace.summary().splitlines()
    assert lines[0].split() == ["buffer", "direction", "reason", "copies", "bytes"]
    assert lines[1:] == ["(no copies recorded)"], lines
    path = tmp_path / "empty.json"
    lazybuf.trace.dump(path, rec.trace)
    cli = subprocess.run(
        [sys.executable, "-m", "lazybuf", "trace", "summary", str(path)], capture_output=True, text=True, timeout=120
    )
    assert cli.returncode == 0, cli.stderr
    assert "(no copies recorded)" in cli.stdout.splitlines(), cli.stdout

    copying = [d for d in _devices() if d != "host"]
    if not copying:
        pytest.skip("no device with copies (only the host)")
    with lazybuf.trace.record() as rec:
        b = lazybuf.UnifiedBuffer((1000,), np.float32, device=copying[0])  # 4000 B: a real copy
        b.host[:] = 1.0
        b.sync_to_device()
    assert rec.trace.summary_rows(), copying[0]
    assert "(no copies recorded)" not in rec.trace.summary()
