"""The twentieth pass: the nineteenth pass's leftovers (docs/RELIABILITY.md), each a test that
failed before its fix. Each means the same on every device (on the host device the copies are
one memory: nothing to upload, nothing to fail)."""

import pickle

import numpy as np
import pytest

import lazybuf
from conftest import events_of, first_of_five_on_disk, one_selector_per_backend
from lazybuf import BufferState, UnifiedBuffer
from lazybuf import _dask

N = 1000
WITH_MEMORY = [s for s in one_selector_per_backend() if s != "host"]


@pytest.fixture(autouse=True)
def _clean():
    yield
    if lazybuf.trace.is_recording():
        lazybuf.trace.stop()


def recorded_totals(trace, buffer_id):
    """What the trace has of one id, as `transfer_stats()` counts it: copies and bytes each
    way, and allocations less those its rollbacks took back."""
    events = events_of(trace, buffer_id)
    copies = [e for e in events if e["kind"] == "transfer"]
    rolled_back = {e["op"] for e in events if e["kind"] == "rollback" and e.get("op")}
    copies = [e for e in copies if e.get("op") not in rolled_back]
    totals = {}
    for direction, name in (("h2d", "host_to_device"), ("d2h", "device_to_host")):
        mine = [e for e in copies if e["direction"] == direction]
        totals[f"{name}_copies"] = len(mine)
        totals[f"{name}_bytes"] = sum(e["bytes"] for e in mine)
    totals["allocations"] = sum(1 for e in events if e["kind"] == "allocate") - sum(
        e["allocations"] for e in events if e["kind"] == "rollback"
    )
    return totals


def counted_totals(buf):
    stats = buf.transfer_stats()
    return {key: stats[key] for key in recorded_totals_keys()}


def recorded_totals_keys():
    return [
        "host_to_device_copies",
        "host_to_device_bytes",
        "device_to_host_copies",
        "device_to_host_bytes",
        "allocations",
    ]


def _use(buf, seed):
    buf.copy_from(np.full(buf.shape, seed, buf.dtype))
    buf.sync_to_device()
    buf.mark_device_dirty()
    buf.to_numpy()


@pytest.mark.parametrize("selector", one_selector_per_backend())
def test_a_free_that_reuses_exported_memory_takes_a_new_id(selector):
    """`free()` of a buffer whose memory `__array_interface__` handed out reuses that memory
    (its consumer holds the buffer object, not the memory). It kept the buffer's id and reset
    its counters, so the events recorded under that id added up to more than its counters
    (by what came before the `free()`). Reused memory is a new buffer now, as any `free()`
    makes: a new id, counters from zero, and each id's recorded totals are its counters."""
    buf = UnifiedBuffer((N,), np.float32, device=selector)
    with lazybuf.trace.record() as rec:
        _use(buf, 1)
        exported = buf.__array_interface__  # noqa: F841 - keeps the memory with the buffer
        old, before = buf.buffer_id, counted_totals(buf)
        buf.free()
        assert (buf.state, buf.is_allocated) == (BufferState.UNINITIALIZED, True)  # reused
        assert buf.buffer_id != old
        assert counted_totals(buf) == dict.fromkeys(recorded_totals_keys(), 0)
        _use(buf, 2)
    assert recorded_totals(rec.trace, old) == before
    assert recorded_totals(rec.trace, buf.buffer_id) == counted_totals(buf)
    np.testing.assert_array_equal(buf.to_numpy(), np.full(N, 2, np.float32))


@pytest.mark.parametrize("selector", WITH_MEMORY)
def test_a_failed_allocate_after_a_read_back_leaves_the_host_copy_on_disk(selector):
    """`allocate()` of a buffer whose host copy was spilled to disk: its host step read the
    file back into a new block, then its upload failed, and the block stayed (counted, recorded,
    the disk tier's `bytes_from_disk` moved), where a failed call leaves the buffer as it was.
    The file holds the host copy again now, the block given back."""
    testing = pytest.importorskip("lazybuf.testing")
    n = 16 * 1024
    faulty = testing.FaultyDevice(selector)
    with first_of_five_on_disk(faulty, n) as bufs:
        first = bufs[0]
        from_disk, stats = lazybuf.spill_stats(faulty)["bytes_from_disk"], first.transfer_stats()
        with lazybuf.trace.record() as rec:
            faulty.fail_copy_in(1)
            with pytest.raises(RuntimeError, match="injected fault"):
                first.allocate()
            faulty.disarm()
        assert (first.state, first.transfer_stats()) == (BufferState.HOST_ONLY, stats)
        assert lazybuf.spill_stats(faulty)["bytes_from_disk"] == from_disk
        assert recorded_totals(rec.trace, first.buffer_id)["allocations"] == 0, events_of(rec.trace, first.buffer_id)
        first.allocate()  # reads the file back: it was still on disk
        assert lazybuf.spill_stats(faulty)["bytes_from_disk"] == from_disk + n * 4
        assert first.state == BufferState.SYNCHRONIZED
        np.testing.assert_array_equal(first.to_numpy(), np.zeros(n, np.float32))


def _cuda():
    found = [d for d in lazybuf.get_accelerator().devices if d.backend == "cuda"]
    if not found:
        pytest.skip(f"no CUDA device: {lazybuf.get_accelerator().backend_status}")
    return found[0]


def _state_calls(trace, buf):
    return [e["call"] for e in events_of(trace, buf.buffer_id) if e["kind"] == "state"]


@pytest.mark.parametrize("n", [N, 64 * 1024])  # a small frame is copied, a large one adopted
def test_every_deserialized_frame_is_named_for_its_deserialization(n):
    """A received frame's buffer records its state event under the call that made it, named for
    what the user's code did, as the sending side's `dask serialize` is: `dask deserialize`
    (it said `host`, or `adopt_host` for an adopted frame), `cuda deserialize` (it said
    `device`, the engine's access), `unpickle` (it said `host`, where the memory objects'
    unpickling says `unpickle`)."""
    buf = UnifiedBuffer((n,), np.float32)
    buf.copy_from(np.arange(n, dtype=np.float32))
    header, frames = _dask.dask_dumps(buf)
    with lazybuf.trace.record() as rec:
        received = _dask.dask_loads(header, [memoryview(bytearray(f)) for f in frames])
        unpickled = pickle.loads(pickle.dumps(buf, protocol=5))
        unpickled_in_band = pickle.loads(pickle.dumps(buf, protocol=4))
    assert _state_calls(rec.trace, received) == ["dask deserialize"]
    assert _state_calls(rec.trace, unpickled) == ["unpickle"]
    assert _state_calls(rec.trace, unpickled_in_band) == ["unpickle"]
    np.testing.assert_array_equal(received.to_numpy(), buf.to_numpy())

    cuda = _cuda()
    on_cuda = UnifiedBuffer((n,), np.float32, device=cuda)
    on_cuda.copy_from(np.arange(n, dtype=np.float32))
    on_cuda.sync_to_device()
    with lazybuf.trace.record() as rec:
        header, frames = _dask.cuda_dumps(on_cuda)
        received = _dask.cuda_loads(header, frames)
    assert received.state == BufferState.DEVICE_ONLY
    assert _state_calls(rec.trace, received) == ["cuda deserialize"]
    np.testing.assert_array_equal(received.to_numpy(), np.arange(n, dtype=np.float32))


class Counted:
    """A value whose `__float__` counts its calls."""

    calls = 0

    def __init__(self, value):
        self.value = value

    def __float__(self):
        Counted.calls += 1
        return float(self.value)


def _conversions(target, key, make):
    Counted.calls = 0
    value = make()
    try:
        target[key] = value
        outcome = None
    except (ValueError, TypeError, IndexError) as err:
        outcome = type(err)
    return Counted.calls, outcome


@pytest.mark.parametrize(
    "key,make",
    [
        ([0, 1], lambda: [[Counted(1), Counted(2)]]),  # a fancy index: broadcast, NumPy assigns
        ([0, 1], lambda: [[[Counted(1), Counted(2)]]]),
        (np.array([True, True, False, False]), lambda: [[Counted(1), Counted(2)]]),  # NumPy raises
        (np.array([True, True, False, False]), lambda: [[Counted(1)], [Counted(2)]]),
        (slice(0, 2), lambda: [Counted(1), Counted(2)]),
        ([0, 1], lambda: [Counted(1), Counted(2)]),
    ],
)
@pytest.mark.parametrize("selector", one_selector_per_backend())
def test_a_sequence_deeper_than_its_selection_is_converted_once(selector, key, make):
    """`buf[key] = value` with a list nested deeper than a fancy index's or a mask's selection
    converted it twice (`asarray`, then NumPy's verdict on the value itself), so each
    element's `__float__` ran twice where NumPy's assignment runs it once. NumPy's verdict is
    on the same nesting of the converted elements now: converted once."""
    data = np.arange(4, dtype=np.float32)
    expected = data.copy()
    numpy_calls, numpy_outcome = _conversions(expected, key, make)
    buf = UnifiedBuffer((4,), np.float32, device=selector)
    buf.copy_from(data)
    calls, outcome = _conversions(buf, key, make)
    assert (calls, outcome) == (numpy_calls, numpy_outcome)
    np.testing.assert_array_equal(buf.to_numpy(), expected)


@pytest.mark.parametrize("selector", one_selector_per_backend())
def test_a_sequence_deeper_than_a_view_is_converted_at_most_once(selector):
    """A sequence deeper than a view: NumPy raises while it finds the value's shape, running no
    `__float__`; lazybuf converts it once (to learn its depth) before NumPy's verdict, never
    twice, and nothing changes."""
    buf = UnifiedBuffer((4,), np.float32, device=selector)
    buf.copy_from(np.arange(4, dtype=np.float32))
    stats = buf.transfer_stats()
    calls, outcome = _conversions(buf, slice(0, 2), lambda: [[Counted(1), Counted(2)]])
    assert (calls, outcome) == (2, ValueError)
    assert buf.transfer_stats() == stats
    np.testing.assert_array_equal(buf.to_numpy(), np.arange(4, dtype=np.float32))
