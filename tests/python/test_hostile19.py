"""What the nineteenth hostile pass (the transfer guard, the event recorder and the trace tools
as a hostile user drives them) found, each a test that failed before its fix. Each means the
same on every device (on the host device the copies are one memory: nothing to refuse).
"""

import collections
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import lazybuf
from conftest import events_of, first_of_five_on_disk, one_selector_per_backend
from lazybuf import BufferState, TransferGuardError, UnifiedBuffer

N = 1000
WITH_MEMORY = [s for s in one_selector_per_backend() if s != "host"]


@pytest.fixture(autouse=True)
def _clean():
    yield
    if lazybuf.trace.is_recording():
        lazybuf.trace.stop()


def recorded_allocations(trace, buffer_id):
    """The buffer's allocations as the trace has them: its allocation events less the blocks
    its rollbacks took back."""
    events = events_of(trace, buffer_id)
    return sum(1 for e in events if e["kind"] == "allocate") - sum(
        e["allocations"] for e in events if e["kind"] == "rollback"
    )


@pytest.mark.parametrize("selector", WITH_MEMORY)
def test_a_refused_allocate_takes_and_records_nothing(selector):
    """`allocate()` of a buffer that holds nothing zero-fills a host copy, then uploads it. The
    guard saw the upload only when the device step was planned: under `disallow_explicit` the
    refused call had taken a host block first (which may spill another buffer for room) and
    recorded an allocation, a free and two state transitions for a call that changed
    nothing; the trace had one allocation more than the counters. The upload is checked
    before the host step now."""
    buf = UnifiedBuffer((N,), np.float32, device=selector)
    stats = buf.transfer_stats()
    with lazybuf.trace.record() as rec:
        with pytest.raises(TransferGuardError, match="host-to-device"):
            with lazybuf.transfer_guard("disallow_explicit"):
                buf.allocate()
    assert (buf.state, buf.is_allocated, buf.transfer_stats()) == (BufferState.UNINITIALIZED, False, stats)
    assert events_of(rec.trace, buf.buffer_id) == []
    # Allowed (explicit), it runs.
    with lazybuf.transfer_guard("disallow"):
        buf.allocate()
    assert buf.state == BufferState.SYNCHRONIZED


def holding_memory_but_no_data(device):
    """A buffer that holds host and device memory but no data: `free()` of a buffer whose
    memory `__array_interface__` exported reuses that memory, its contents forgotten."""
    buf = UnifiedBuffer((N,), np.float32, device=device)
    buf.allocate()
    exported = buf.__array_interface__  # noqa: F841 - the export keeps the memory with the buffer
    buf.free()
    assert (buf.state, buf.is_allocated) == (BufferState.UNINITIALIZED, True)
    return buf


@pytest.mark.parametrize("call", ["allocate", "synchronize"])
@pytest.mark.parametrize("selector", WITH_MEMORY)
def test_a_refused_or_failed_upload_after_a_zero_fill_changes_nothing(selector, call):
    """`allocate()` and `synchronize()` of a buffer that holds memory but no data zero-fill the
    host copy, then upload it. A refused (`disallow_explicit`) or failed upload left the
    buffer HOST_DIRTY, by a call that raised. The zero fill is undone now, and the guard
    sees the upload before it."""
    testing = pytest.importorskip("lazybuf.testing")
    for refused in (True, False):
        faulty = testing.FaultyDevice(selector)
        buf = holding_memory_but_no_data(faulty)
        stats = buf.transfer_stats()
        with lazybuf.trace.record() as rec:
            if refused:
                with pytest.raises(TransferGuardError), lazybuf.transfer_guard("disallow_explicit"):
                    getattr(buf, call)()
            else:
                faulty.fail_copy_in(1)
                with pytest.raises(RuntimeError, match="injected fault"):
                    getattr(buf, call)()
                faulty.disarm()
        assert (buf.state, buf.transfer_stats()) == (BufferState.UNINITIALIZED, stats), refused
        if refused:
            assert events_of(rec.trace, buf.buffer_id) == []
        getattr(buf, call)()
        assert buf.state == BufferState.SYNCHRONIZED
        np.testing.assert_array_equal(buf.to_numpy(), np.zeros(N, np.float32))


@pytest.mark.parametrize("selector", WITH_MEMORY)
def test_a_refused_allocate_of_a_host_copy_on_disk_reads_nothing_back(selector):
    """`allocate()` of a buffer whose host copy was spilled to disk: its host step read the
    file back into a new block (counted and recorded as an allocation, the disk tier's
    counters moved), and then the guard refused its upload (`disallow_explicit`), so the
    refused call had changed the counters and the memory held (found by a random sequence
    under a host memory limit). The upload is checked before the host step now, as an
    asynchronous sync's was by the fourth pass."""
    n = 16 * 1024
    with first_of_five_on_disk(selector, n) as bufs:
        first = bufs[0]
        spilled = lazybuf.spill_stats(selector)["bytes_from_disk"]
        stats, held = first.transfer_stats(), lazybuf.host_memory_held()
        with lazybuf.trace.record() as rec:
            with pytest.raises(TransferGuardError, match="host-to-device"):
                with lazybuf.transfer_guard("disallow_explicit"):
                    first.allocate()
        assert (first.state, first.transfer_stats()) == (BufferState.HOST_ONLY, stats)
        assert (lazybuf.spill_stats(selector)["bytes_from_disk"], lazybuf.host_memory_held()) == (spilled, held)
        assert events_of(rec.trace, first.buffer_id) == []
        first.allocate()  # reads the file back: it was the buffer on disk
        assert lazybuf.spill_stats(selector)["bytes_from_disk"] == spilled + n * 4
        np.testing.assert_array_equal(first.to_numpy(), np.zeros(n, np.float32))


@pytest.mark.parametrize("deferred", [False, True])
@pytest.mark.parametrize("selector", WITH_MEMORY)
def test_a_failed_plans_blocks_are_rolled_back_in_the_trace_as_in_the_counters(selector, deferred):
    """A plan whose upload failed after its device block was taken recorded the block's
    allocation and free while the counters took the allocation back: the trace had one
    allocation more than `transfer_stats()` and nothing to tell it apart (the eighteenth pass's
    leftover). The rollback event counts the blocks the undone work took now (`allocations`),
    for a blocking sync and for an asynchronous one that fails when waited for."""
    testing = pytest.importorskip("lazybuf.testing")
    faulty = testing.FaultyDevice(selector)
    buf = UnifiedBuffer((N,), np.float32, device=faulty)
    buf.copy_from(np.arange(N, dtype=np.float32))
    stats = buf.transfer_stats()
    with lazybuf.trace.record() as rec:
        faulty.defer_copy_faults(deferred)
        faulty.fail_copy_in(1)
        with pytest.raises(RuntimeError, match="injected fault"):
            if deferred:
                buf.sync_to_device_async().wait()
            else:
                buf.sync_to_device()
        faulty.disarm()
        assert buf.state == BufferState.HOST_ONLY
        if deferred:
            # The buffer's first call that waits for the failed transfer reports it too
            # (docs/PYTHON.md), and settles it: its rollback is recorded then.
            with pytest.raises(RuntimeError, match="injected fault"):
                buf.sync_to_device()
        buf.sync_to_device()
    counted = buf.transfer_stats()["allocations"] - stats["allocations"]
    allocations = [e for e in events_of(rec.trace, buf.buffer_id) if e["kind"] == "allocate"]
    if faulty.inner.shares_host_memory and not allocations:
        pytest.skip(f"{selector}: a zero-copy device (no device block)")
    assert len(allocations) == 2, events_of(rec.trace, buf.buffer_id)
    assert recorded_allocations(rec.trace, buf.buffer_id) == counted == 1
    np.testing.assert_array_equal(buf.to_numpy(), np.arange(N, dtype=np.float32))


def _finalise_on_another_thread(generator):
    """Closes `generator` on a thread of its own (its `finally` and `with` exits run there), as
    the garbage collector may finalise it."""
    box = [generator]
    del generator
    errors = []

    def close():
        try:
            box.pop().close()
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    thread = threading.Thread(target=close)
    thread.start()
    thread.join()
    assert errors == []


def test_a_transfer_guard_block_finalised_on_another_thread_restores_its_thread():
    """A generator holding a `transfer_guard` block, suspended inside it and finalised on
    another thread: the block's exit there found no entry of that thread and left nothing, so
    the levels stayed on the thread that entered it for good (the eighteenth pass's leftover:
    every later implicit copy on it refused). The exit leaves the block's scope on the thread
    that entered it now, and the other thread's levels are untouched."""

    def guarded():
        with lazybuf.transfer_guard("disallow"):
            yield

    before = lazybuf.get_transfer_guard()
    generator = guarded()
    next(generator)
    assert lazybuf.get_transfer_guard()["h2d"] == "disallow"
    _finalise_on_another_thread(generator)
    assert lazybuf.get_transfer_guard() == before
    # Nothing is refused on this thread any more.
    buf = UnifiedBuffer((N,), np.float32, device=WITH_MEMORY[0] if WITH_MEMORY else "host")
    buf.copy_from(np.ones(N, np.float32))
    buf.device


def test_a_record_block_finalised_on_another_thread_stops_its_recording():
    """The same for `trace.record()`: its exit on the other thread stopped nothing, the
    recorder ran on for good (every later `record()` and `start()`: "already recording"), and
    the block's `Recording` never got its trace."""

    def recorded():
        with lazybuf.trace.record() as rec:
            yield rec

    generator = recorded()
    rec = next(generator)
    assert lazybuf.trace.is_recording()
    _finalise_on_another_thread(generator)
    assert not lazybuf.trace.is_recording()
    assert rec.trace is not None
    with lazybuf.trace.record():
        pass


Pair = collections.namedtuple("Pair", "first second")


class CountedIndex:
    """An index whose `__index__` counts its calls."""

    calls = 0

    def __init__(self, value):
        self.value = value

    def __index__(self):
        CountedIndex.calls += 1
        return self.value


KEYS = {
    "an index": lambda: CountedIndex(1),
    "an index in a tuple": lambda: (CountedIndex(1),),
    "an index after a slice": lambda: (slice(None), CountedIndex(2)),
    "slice bounds": lambda: slice(CountedIndex(0), CountedIndex(2)),
    "a step": lambda: slice(None, None, CountedIndex(2)),
    "an index and an int": lambda: (CountedIndex(1), 2),
    "an index too large": lambda: CountedIndex(99),
    "a named tuple of indices": lambda: Pair(CountedIndex(1), CountedIndex(0)),
}
VALUES = {
    "a number": lambda: 5.0,
    "an array": lambda: np.full(1, 6.0, np.float32),
    "a list": lambda: [7.0],
}


@pytest.mark.parametrize("value", sorted(VALUES))
@pytest.mark.parametrize("key", sorted(KEYS))
@pytest.mark.parametrize("shape", [(4,), (4, 3)])
def test_a_keys_index_runs_once_as_numpy_runs_it(shape, key, value):
    """`buf[key] = value` used the key up to three times (NumPy's verdict on a stand-in, the
    selection's shape, the assignment), running the user's `__index__` each time, where NumPy's
    assignment runs it once (the eighteenth pass's leftover): code with effects ran again, one
    that used lazybuf copied again. The key's indices are converted once now, as NumPy does,
    with the same result or the same error."""
    data = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    expected = data.copy()
    CountedIndex.calls = 0
    try:
        expected[KEYS[key]()] = VALUES[value]()
        numpy_error = None
    except Exception as err:  # noqa: BLE001 - compared below
        numpy_error = type(err)
    numpy_calls = CountedIndex.calls

    buf = UnifiedBuffer(shape, np.float32, device="host")
    buf.copy_from(data)
    CountedIndex.calls = 0
    if numpy_error is None:
        buf[KEYS[key]()] = VALUES[value]()
        np.testing.assert_array_equal(buf.to_numpy(), expected)
    else:
        with pytest.raises(numpy_error):
            buf[KEYS[key]()] = VALUES[value]()
        np.testing.assert_array_equal(buf.to_numpy(), data)
    assert CountedIndex.calls == numpy_calls


def test_an_index_that_copies_copies_once():
    """What the repeated `__index__` cost a user whose index reads another buffer (written
    again by a kernel after each read): its download ran once per use of the key, two or three
    copies counted (and recorded) for one assignment."""
    other = UnifiedBuffer((4,), np.int64, device=WITH_MEMORY[0] if WITH_MEMORY else "host")
    other.copy_from(np.array([2, 0, 0, 0]))

    class FromBuffer:
        def __index__(self):
            index = int(other.to_numpy()[0])
            other.mark_device_dirty()  # a kernel wrote it again
            return index

    buf = UnifiedBuffer((4,), np.float32, device="host")
    buf.copy_from(np.zeros(4, np.float32))
    other.sync_to_device()
    other.mark_device_dirty()
    before = other.transfer_stats()["device_to_host_copies"]
    buf[FromBuffer()] = 1.0
    assert other.transfer_stats()["device_to_host_copies"] - before == (0 if not WITH_MEMORY else 1)
    np.testing.assert_array_equal(buf.to_numpy(), [0, 0, 1, 0])


def _run_with(var, value):
    # (A limit applies to device memory: the buffer is on a device with memory of its own.)
    code = (
        "import lazybuf, numpy as np\n"
        "try:\n"
        "    lazybuf.get_transfer_guard()\n"
        "    b = lazybuf.UnifiedBuffer((4,), np.float32)\n"
        "    b.copy_from(np.ones(4, np.float32))\n"
        "    b.sync_to_device()\n"
        "    print('unread')\n"
        "except ValueError as err:\n"
        "    print('refused:', err)\n"
    )
    env = {k: v for k, v in os.environb.items() if k != var.encode()}
    env[var.encode()] = value
    if var != "LAZYBUF_DEVICE":
        env[b"LAZYBUF_DEVICE"] = (WITH_MEMORY[0] if WITH_MEMORY else "host").encode()
    return subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120, env=env)


@pytest.mark.skipif(sys.platform == "win32", reason="environment values are Unicode on Windows")
@pytest.mark.parametrize("var", ["LAZYBUF_TRANSFER_GUARD", "LAZYBUF_MEMORY_LIMIT", "LAZYBUF_DEVICE"])
def test_a_setting_that_is_not_utf8_is_malformed_not_unset(var):
    """`LAZYBUF_TRANSFER_GUARD=$'\\xff'disallow` left the guard off, silently (OBSERVING.md: a
    guard that was asked for is never silently off): the value was read with `std::env::var`,
    whose error for a value that is not Unicode the reader took for an unset variable; so did
    `LAZYBUF_MEMORY_LIMIT` (no limit) and `LAZYBUF_DEVICE` (the default device). Such a value is
    malformed now: the error names the variable, as for any malformed value."""
    done = _run_with(var, b"\xffdisallow" if var == "LAZYBUF_TRANSFER_GUARD" else b"\xff")
    out = done.stdout.decode(errors="replace")
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert out.startswith("refused:") and var in out and "UTF-8" in out, out


@pytest.mark.skipif(sys.platform == "win32", reason="RLIMIT_FSIZE is POSIX")
def test_a_dump_that_fails_leaves_the_earlier_file_as_it_was(tmp_path):
    """`trace.dump(path, trace)` opened `path` for writing, which empties it first: a dump that
    failed part way (a full disk; here the file size limit) left a cut JSON file in place of
    the good trace that was there (and `lazybuf trace summary` then said "not JSON"). The dump
    is written beside it and renamed over it now, as `lazybuf trace plot -o` writes."""
    earlier = tmp_path / "trace.json"
    earlier.write_text('{"traceEvents":[]}')
    os.chmod(earlier, 0o640)
    code = f"""
import resource, signal, numpy as np, lazybuf
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
with lazybuf.trace.record() as rec:
    buf = lazybuf.UnifiedBuffer((1000,), np.float32, device="host")
    for i in range(200):
        buf.host[:] = i
        buf.mark_device_dirty()
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
try:
    lazybuf.trace.dump({str(earlier)!r}, rec.trace)
except OSError as err:
    print("failed:", err.errno)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("failed:"), (done.stdout, done.stderr)
    assert earlier.read_text() == '{"traceEvents":[]}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.json"]
    # Written whole, it replaces the file and keeps its permissions.
    with lazybuf.trace.record() as rec:
        UnifiedBuffer((4,), np.float32, device="host").fill(1)
    lazybuf.trace.dump(earlier, rec.trace)
    assert earlier.read_text() == rec.trace.to_chrome_json()
    assert (os.stat(earlier).st_mode & 0o777, sorted(p.name for p in tmp_path.iterdir())) == (0o640, ["trace.json"])


def test_a_numpy_integer_capacity_is_taken_as_every_size_is():
    """`trace.start(capacity=np.int64(n))` was a `TypeError`, where every size lazybuf takes
    (shapes, `nbytes`, `resize`) accepts a NumPy integer or anything with `__index__`. It is
    taken now; bools, floats and arrays are still refused."""
    lazybuf.trace.start(capacity=np.int64(3))
    for _ in range(3):
        UnifiedBuffer((4,), np.float32, device="host").fill(1)
    assert len(lazybuf.trace.stop()) == 3
    with lazybuf.trace.record(capacity=np.uint32(5)) as rec:
        pass
    assert rec.trace is not None
    for bad in (True, 3.0, np.array(3), "3"):
        with pytest.raises(TypeError, match="expected an int capacity"):
            lazybuf.trace.start(capacity=bad)
    with pytest.raises(ValueError, match="at least 1 event"):
        lazybuf.trace.start(capacity=np.int8(-1))
    assert not lazybuf.trace.is_recording()
