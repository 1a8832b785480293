"""The names of a call's events when the call names itself on its buffer (`.device`,
`mark_device_dirty()`, `mark_host_dirty()`, `to_numpy()`: while only the recorder runs, these
set nothing on the thread, docs/OBSERVING.md "Cost"): the same names, reasons and events as
when the call is named on the thread (a guard level set, or stacks asked for), also for a call
made by user code inside another call. Each means the same on every device (on the host
device the copies are one memory: no transfer to name)."""

import logging

import numpy as np
import pytest

import lazybuf
from conftest import one_selector_per_backend

N = 1000


@pytest.fixture(autouse=True)
def _not_recording():
    yield
    if lazybuf.trace.is_recording():
        lazybuf.trace.stop()


def _seed_batch(pool: lazybuf.MemoryPool, data: np.ndarray) -> tuple[int, np.ndarray, dict]:
    """The seeds' batch: acquire, host write, the device copy used and declared written,
    read back, release. Returns the buffer's id, what was read and its transfer counters."""
    buf = pool.acquire((N,), np.float32)
    buf_id = buf.buffer_id
    try:
        buf.copy_from(data)
        buf.device  # noqa: B018 - the access is the point
        buf.mark_device_dirty()
        buf.mark_host_dirty()
        buf.mark_device_dirty()
        out = buf.to_numpy()
        buf.to_numpy(out=np.empty(N, np.float32))
        stats = buf.transfer_stats()
    finally:
        pool.release(buf)
    return buf_id, out, stats


def _named(trace, buffer_id):
    """The buffer's events without times or threads: what names them."""
    keep = ("kind", "call", "reason", "direction", "from", "to", "bytes", "memory")
    return [tuple(e.get(k) for k in keep) for e in trace.events() if e.get("buffer") == buffer_id]


@pytest.mark.parametrize("selector", one_selector_per_backend())
def test_a_call_named_on_its_buffer_records_what_a_call_named_on_the_thread_records(selector, caplog):
    pool = lazybuf.MemoryPool(selector)
    data = np.arange(N, dtype=np.float32)
    _seed_batch(pool, data)  # the pool's block cached: both runs hit it
    with lazybuf.trace.record() as on_buffer:
        first, out, stats = _seed_batch(pool, data)
    np.testing.assert_array_equal(out, data)
    # A guard level set anywhere names every call on the thread ("log" logs, refuses nothing).
    with caplog.at_level(logging.CRITICAL, logger="lazybuf.transfer_guard"):
        with lazybuf.transfer_guard("log"), lazybuf.trace.record() as on_thread:
            second, out, _ = _seed_batch(pool, data)
    np.testing.assert_array_equal(out, data)
    with lazybuf.trace.record(python_stack=True) as with_stacks:
        third, _, _ = _seed_batch(pool, data)
    named = _named(on_buffer.trace, first)
    assert named == _named(on_thread.trace, second) == _named(with_stacks.trace, third)
    calls = [e[1] for e in named if e[0] == "state"]
    assert calls[:2] == ["copy_from", ".device"] and calls[-1] == "release_memory", named
    assert {"mark_device_dirty", "mark_host_dirty"} <= set(calls), named  # (to_numpy changes no state)
    # The copies the counters count, each named by its call (none where the copies are one
    # memory).
    transfers = sorted((e[1], e[2], e[3]) for e in named if e[0] == "transfer")
    h2d = [t for t in transfers if t[2] == "h2d"]
    d2h = [t for t in transfers if t[2] == "d2h"]
    assert (len(h2d), len(d2h)) == (stats["host_to_device_copies"], stats["device_to_host_copies"]), stats
    if transfers:
        assert h2d == [(".device", "access", "h2d"), ("mark_device_dirty", "access", "h2d")], h2d
        assert d2h == [("mark_host_dirty", "access", "d2h")] + [("to_numpy", "sync", "d2h")] * 2, d2h


@pytest.mark.parametrize("selector", one_selector_per_backend())
def test_a_call_user_code_makes_inside_another_names_its_own_events(selector):
    """A `to_numpy()`, `.device` or `mark_device_dirty()` that user code makes inside another
    lazybuf call (here a value's `__float__` run by `buf[0] = value`) names its own events,
    not the call that ran the user's code."""
    buf = lazybuf.UnifiedBuffer((N,), np.float32, device=selector)
    buf.copy_from(np.zeros(N, np.float32))
    other = lazybuf.UnifiedBuffer((N,), np.float32, device=selector)
    other.copy_from(np.arange(N, dtype=np.float32))
    other.sync_to_device()
    other.mark_device_dirty()

    class Value:
        def __float__(self):
            read = other.to_numpy()
            other.device  # noqa: B018 - the access is the point
            other.mark_device_dirty()
            return float(read[5])

    with lazybuf.trace.record() as rec:
        buf[0] = Value()
    assert buf.to_numpy()[0] == 5.0
    mine = [e for e in rec.trace.events() if e.get("buffer") == other.buffer_id]
    assert {e["call"] for e in mine if e["kind"] == "state"} <= {"to_numpy", ".device", "mark_device_dirty"}, mine
    assert [e["call"] for e in mine if e["kind"] == "transfer"] in ([], ["to_numpy"]), mine
    assert all(e["call"] == "__setitem__" for e in rec.trace.events() if e.get("buffer") == buf.buffer_id and "call" in e)
