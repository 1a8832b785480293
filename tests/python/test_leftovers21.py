"""The twenty-first pass's leftovers (docs/RELIABILITY.md "twenty-first pass"), each a test
that failed before its fix: counters a worker process returns as they are, and a spawn
child's own exit handlers reading its buffers spilled to disk. Each means the same on every
device."""

import concurrent.futures
import copy
import multiprocessing
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

import lazybuf
import lazybuf.mr
from conftest import one_selector_per_backend

POOL_FIELDS = ("hits", "misses", "allocations", "bytes_in_use", "bytes_cached", "peak_bytes_in_use", "oom_retries")
STATISTICS_FIELDS = ("current_bytes", "current_count", "peak_bytes", "peak_count", "total_bytes", "total_count")


def _pool_stats_of_a_worker(selector: str) -> lazybuf.PoolStats:
    """A spawn worker's task (module level: the worker imports this module to find it)."""
    pool = lazybuf.MemoryPool(selector)
    for _ in range(3):
        with pool.acquire((1000,), np.float32) as buf:
            buf.fill(1)  # memory is taken at first use
    return pool.stats()


def _statistics_of_a_worker(_: int) -> lazybuf.mr.Statistics:
    """A spawn worker's task: a statistics adaptor's counters after one allocation."""
    mr = lazybuf.mr.StatisticsResourceAdaptor(lazybuf.mr.DirectMemoryResource())
    mr.allocate(4096, device="host")
    return mr.allocation_counts


@pytest.mark.parametrize("selector", one_selector_per_backend())
def test_pool_stats_pickle_as_their_values(selector):
    """`PoolStats` did not pickle ("cannot pickle 'lazybuf.PoolStats' object"), so a worker
    could not return its pool's counters: the parent's future raised. It pickles as its
    values, compares by value, and a spawn worker's counters arrive as they were."""
    pool = lazybuf.MemoryPool(selector)
    for _ in range(2):
        with pool.acquire((1000,), np.float32) as buf:
            buf.fill(1)  # memory is taken at first use
    stats = pool.stats()
    for back in (pickle.loads(pickle.dumps(stats)), copy.copy(stats), copy.deepcopy(stats)):
        assert back == stats
        assert [getattr(back, f) for f in POOL_FIELDS] == [getattr(stats, f) for f in POOL_FIELDS]
    assert (stats.hits, stats.misses) == (1, 1)
    assert stats != lazybuf.PoolStats()
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as workers:
        from_worker = workers.submit(_pool_stats_of_a_worker, selector).result(timeout=300)
    assert isinstance(from_worker, lazybuf.PoolStats)
    assert (from_worker.hits, from_worker.misses, from_worker.allocations) == (2, 1, 1)


def test_statistics_pickle_as_their_values():
    """`lazybuf.mr.Statistics` did not pickle either. Negative current counts (a level that
    freed older memory) round-trip too."""
    values = dict(zip(STATISTICS_FIELDS, (-4096, -1, 8192, 2, 12288, 3)))
    stats = lazybuf.mr.Statistics(**values)
    assert [getattr(stats, f) for f in STATISTICS_FIELDS] == list(values.values())
    for back in (pickle.loads(pickle.dumps(stats)), copy.deepcopy(stats)):
        assert back == stats
    assert lazybuf.mr.Statistics() == lazybuf.mr.Statistics(*[0] * 6)
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as workers:
        from_worker = workers.submit(_statistics_of_a_worker, 0).result(timeout=300)
    assert (from_worker.current_bytes, from_worker.current_count, from_worker.total_count) == (4096, 1, 1)


def test_constructed_pool_stats_hold_what_they_were_given():
    stats = lazybuf.PoolStats(*range(1, 8))
    assert [getattr(stats, f) for f in POOL_FIELDS] == list(range(1, 8))
    assert lazybuf.PoolStats(hits=np.uint64(2**64 - 1)).hits == 2**64 - 1
    assert "hits=1" in repr(stats)


@pytest.mark.parametrize(
    "make,error,match",
    [
        (lambda: lazybuf.PoolStats(hits=-1), ValueError, "PoolStats: hits must not be negative"),
        (lambda: lazybuf.PoolStats(misses=2**64), ValueError, "PoolStats: misses is too large"),
        (lambda: lazybuf.PoolStats(allocations=1.5), TypeError, "PoolStats: allocations must be an int"),
        (lambda: lazybuf.PoolStats(bytes_in_use="3"), TypeError, "PoolStats: bytes_in_use must be an int"),
        (lambda: lazybuf.PoolStats(oom_retries=True), TypeError, "PoolStats: oom_retries must be an int"),
        (lambda: lazybuf.PoolStats(bytes_cached=np.arange(2)), TypeError, "arrays are data"),
        (lambda: lazybuf.PoolStats(1, 2, 3, 4, 5, 6, 7, 8), TypeError, "positional argument"),
        (lambda: lazybuf.PoolStats(hit=1), TypeError, "unexpected keyword argument 'hit'"),
        (lambda: lazybuf.mr.Statistics(peak_bytes=2**63), ValueError, "Statistics: peak_bytes is out of range"),
        (lambda: lazybuf.mr.Statistics(total_count=-(2**63) - 1), ValueError, "Statistics: total_count is out of range"),
        (lambda: lazybuf.mr.Statistics(current_bytes=None), None, None),
        (lambda: lazybuf.mr.Statistics(current_count=[1]), TypeError, "Statistics: current_count must be an int"),
    ],
)
def test_bad_counter_values_are_refused_naming_the_field(make, error, match):
    """Each bad value (an unpickled stream's too: its arguments reach the same constructor)
    raises an error naming the class, the field and what was expected."""
    if error is None:
        assert make() == lazybuf.mr.Statistics()  # None stands for "not given": 0
        return
    with pytest.raises(error, match=match):
        make()


# A spawn child whose target registers an exit handler that reads the buffers it spilled to
# disk (saving results at exit), then returns.
SPAWN_CHILD_READS_AT_EXIT = """
import atexit, multiprocessing as mp, os, sys
def read_at_exit(bufs):
    print("atexit", [float(b.to_numpy()[0]) for b in bufs], flush=True)
def work(selector):
    import numpy as np, lazybuf
    lazybuf.trim()
    lazybuf.set_host_memory_limit(lazybuf.host_memory_held() + (1 << 20))
    bufs = []
    for i in range(4):
        b = lazybuf.UnifiedBuffer((1 << 17,), np.float32, device=selector)
        b.copy_from(np.full(1 << 17, i, np.float32))
        bufs.append(b)
    assert lazybuf.spill_stats(selector)["bytes_to_disk"] > 0
    print("files", len(os.listdir(os.environ["LAZYBUF_SPILL_DIR"])), flush=True)
    atexit.register(read_at_exit, bufs)
if __name__ == "__main__":
    p = mp.get_context("spawn").Process(target=work, args=(sys.argv[1],))
    p.start(); p.join()
    print("exit", p.exitcode, flush=True)
"""


@pytest.mark.parametrize("selector", one_selector_per_backend())
def test_a_spawn_child_reads_its_spilled_buffers_at_exit(tmp_path, selector):
    """A spawn child removed its spill files in multiprocessing's finalizer, which runs when
    the target returns, before the child's own `atexit` handlers: a handler reading a buffer
    spilled to disk failed ("could not read spill file"). A spawn child ends with `sys.exit()`
    and finishes as any interpreter does, so its files go after its handlers (`Py_AtExit`);
    none is left. (Fork and forkserver children end with `os._exit()`, which runs no handler:
    they still remove their files in the finalizer, test_spill_dir.py.)"""
    script = tmp_path / "spawn_child.py"
    script.write_text(SPAWN_CHILD_READS_AT_EXIT)
    spill = tmp_path / "spill"
    spill.mkdir()
    run = subprocess.run(
        [sys.executable, str(script), selector],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "LAZYBUF_SPILL_DIR": str(spill)},
    )
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith("files ") and int(lines[0].split()[1]) >= 1, run.stdout  # spilled
    assert lines[1:] == ["atexit [0.0, 1.0, 2.0, 3.0]", "exit 0"], run.stdout + run.stderr
    assert os.listdir(spill) == []


def _workload_trace(selector: str, faults: bool) -> "tuple[lazybuf.trace.Trace, int]":
    """A trace of every kind of event this device makes: pool lookups, allocations, frees,
    state transitions, copies with and without a wait; with `faults` (a FaultyDevice, the
    checker on) rollbacks and the checker's reads too. Returns the trace and the uploads one
    buffer's counters counted."""
    testing = pytest.importorskip("lazybuf.testing") if faults else None
    device = testing.FaultyDevice(selector) if faults else selector
    was_checking = lazybuf.checking()
    with lazybuf.trace.record(capacity=1 << 16) as rec:
        pool = lazybuf.MemoryPool(device)
        with pool.acquire((1000,), np.float32) as buf:
            buf.copy_from(np.arange(1000, dtype=np.float32))
            buf.sync_to_device_async().wait()
            buf.fill(2.0)
            buf.to_numpy()
        other = lazybuf.UnifiedBuffer((1000,), np.float32, device=device)
        other.copy_from(np.ones(1000, np.float32))
        other.sync_to_device()
        if faults:
            third = lazybuf.UnifiedBuffer((1000,), np.float32, device=device)
            third.copy_from(np.ones(1000, np.float32))
            device.fail_copy_in(1)  # its first upload, after its device block was taken
            with pytest.raises(RuntimeError, match="injected fault"):
                third.sync_to_device()
            device.disarm()
            third.release()
            lazybuf.set_checking(True)  # its reads of device copies are recorded
            other.mark_host_dirty()
            other.sync_to_device()
        copies = other.transfer_stats()["host_to_device_copies"]
        other.release()
    lazybuf.set_checking(was_checking)
    return rec.trace, copies


def _returned_by_a_worker(selector: str) -> "lazybuf.trace.Trace":
    """A spawn worker's task: the trace of a workload it recorded."""
    return _workload_trace(selector, faults=False)[0]


def _same_trace(a, b) -> None:
    assert len(a) == len(b) and a.dropped == b.dropped
    assert a.events() == b.events()
    assert a.to_chrome_json() == b.to_chrome_json()
    assert a.summary() == b.summary() and a.summary_rows() == b.summary_rows()


@pytest.mark.parametrize("selector", one_selector_per_backend())
@pytest.mark.parametrize("faults", [False, True], ids=["plain", "faults"])
def test_a_trace_pickles_as_its_events(selector, faults):
    """`Trace` did not pickle, so a worker could not return the trace it recorded ("cannot
    pickle 'Trace' object"). It pickles as its events' values: the unpickled trace has the
    same events, the same Chrome JSON and the same summary, stacks included."""
    trace, copies = _workload_trace(selector, faults)
    kinds = {e["kind"] for e in trace.events()}
    assert {"pool", "allocate", "free", "state"} <= kinds, kinds
    # Copies where the counters count them (none where the copies are one memory), and then a
    # failed upload's rollback too.
    assert ("transfer" in kinds) == (copies > 0), (kinds, copies)
    if faults and copies:
        assert "rollback" in kinds, kinds
    for back in (pickle.loads(pickle.dumps(trace)), copy.deepcopy(trace)):
        _same_trace(trace, back)
    with lazybuf.trace.record(python_stack=True) as rec:
        buf = lazybuf.UnifiedBuffer((10,), np.float32, device=selector)
        buf.copy_from(np.zeros(10, np.float32))
    stacked = pickle.loads(pickle.dumps(rec.trace))
    _same_trace(rec.trace, stacked)
    assert any(e["stack"] for e in stacked.events()), stacked.events()


def test_a_spawn_worker_returns_its_trace():
    selector = one_selector_per_backend()[-1]
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as workers:
        trace = workers.submit(_returned_by_a_worker, selector).result(timeout=300)
    assert isinstance(trace, lazybuf.trace.Trace) and len(trace) > 0
    assert {"pool", "allocate", "free", "state"} <= {e["kind"] for e in trace.events()}


def _state_of(trace):
    return pickle.loads(pickle.dumps(trace)).__reduce__()[1]


@pytest.mark.parametrize(
    "mutate,error,match",
    [
        (lambda v, ev, d: (2, ev, d), ValueError, "cannot unpickle format 2"),
        (lambda v, ev, d: (v, list(ev), d), TypeError, "events must be a tuple"),
        (lambda v, ev, d: (v, ev, -1), ValueError, "Trace: dropped must not be negative"),
        (lambda v, ev, d: (v, ev, 2**70), ValueError, "Trace: dropped is too large"),
        (lambda v, ev, d: (v, ev, "3"), TypeError, "Trace: dropped must be an int"),
        (lambda v, ev, d: (v, ev[:1] + ((0, 0, 0, None, "state"),), d), TypeError, "event 1: an event must be a tuple of 6"),
        (lambda v, ev, d: (v, ((0, 0, 0, None, "bogus", ()),), d), ValueError, "event 0: kind must be one of"),
        (lambda v, ev, d: (v, ((0, -1, 0, None, "pool", (True, "host", 1)),), d), TypeError, "event 0: time_ns must be"),
        (lambda v, ev, d: (v, ((0, 0, 0, 5, "pool", (True, "host", 1)),), d), TypeError, "event 0: stack must be"),
        (lambda v, ev, d: (v, ((0, 0, 0, None, "pool", (True, "host")),), d), TypeError, "pool lookup's fields must be a tuple of 3"),
        (lambda v, ev, d: (v, ((0, 0, 0, None, "state", (1, "host_only", "sideways", "x")),), d), ValueError, "event 0: to must be one of"),
        (lambda v, ev, d: (v, ((0, 0, 0, None, "allocate", (1, "d", "gpu", 4, "cache")),), d), ValueError, "memory must be one of"),
        (lambda v, ev, d: (v, ((0, 0, 0, None, "allocate", (1, "d", "host", 4, "attic")),), d), ValueError, "source must be one of"),
        (lambda v, ev, d: (v, ((0, 0, 0, None, "free", ("x", "d", "host", 4)),), d), TypeError, "event 0: buffer must be"),
        (
            lambda v, ev, d: (v, ((0, 0, 0, None, "transfer", (1, "up", 4, "host", "d", "c", "sync", 0, None, 0)),), d),
            ValueError,
            "direction must be one of",
        ),
        (
            lambda v, ev, d: (v, ((0, 0, 0, None, "transfer", (1, "h2d", 4, "host", "d", "c", "whim", 0, None, 0)),), d),
            ValueError,
            "reason must be one of",
        ),
        (
            lambda v, ev, d: (v, ((0, 0, 0, None, "checker_read", (1, "d", 4, 2**100)),), d),
            ValueError,
            "duration_ns is too large",
        ),
        (lambda v, ev, d: (v, ((0, 0, 0, None, "rollback", (1, 2, 3, None)),), d), TypeError, "event 0: call must be"),
    ],
)
def test_a_bad_pickled_trace_is_refused_naming_the_event_and_field(mutate, error, match):
    """An unpickled stream from elsewhere is checked field by field: each bad value raises an
    error naming the event, the field and what was expected, and makes nothing."""
    with lazybuf.trace.record() as rec:
        buf = lazybuf.UnifiedBuffer((10,), np.float32, device="host")
        buf.copy_from(np.zeros(10, np.float32))
    version, events, dropped = _state_of(rec.trace)
    with pytest.raises(error, match=match):
        lazybuf._lazybuf._rebuild_trace(*mutate(version, events, dropped))


def test_call_names_read_back_are_interned_once():
    """A trace read back many times names its calls with the same interned strings (no new
    memory per load), and a hand-made event's new name is kept too."""
    event = (0, 5, 1, None, "state", (7, "uninitialized", "host_only", "a_call_name_from_elsewhere"))
    for _ in range(100):
        trace = lazybuf._lazybuf._rebuild_trace(1, (event,), 0)
    assert trace.events()[0]["call"] == "a_call_name_from_elsewhere"
    assert trace.events()[0]["time_us"] == pytest.approx(0.005)


@pytest.mark.parametrize("selector", one_selector_per_backend())
def test_every_event_of_a_call_carries_the_python_stack_on_request(selector):
    """`copy_from`, `fill` and `release` (a buffer's own, and a pool's) recorded their
    allocations, frees and state changes without the Python stack that
    `record(python_stack=True)` asks for on every event: they make no copy between memories,
    so they did not run as observed calls. Each event of the buffers now carries the stack of
    the line that caused it."""
    pool = lazybuf.MemoryPool(selector)
    with lazybuf.trace.record(python_stack=True) as rec:
        buf = lazybuf.UnifiedBuffer((1000,), np.float32, device=selector)
        buf.copy_from(np.arange(1000, dtype=np.float32))
        buf.fill(3.0)
        ids = {buf.buffer_id}
        buf.release()
        pooled = pool.acquire((1000,), np.float32)
        pooled.copy_from(np.ones(1000, np.float32))
        ids.add(pooled.buffer_id)
        pool.release(pooled)
    events = [e for e in rec.trace.events() if e.get("buffer") in ids]
    assert {"allocate", "free", "state"} <= {e["kind"] for e in events}, events
    here = "test_every_event_of_a_call_carries_the_python_stack_on_request"
    assert [e for e in events if here not in (e["stack"] or "")] == []


def test_a_trace_read_back_with_huge_counts_sums_them_without_overflow():
    """A trace read back from elsewhere may hold any byte counts: its summary's totals hold at
    2**64 - 1 (a hostile stream's two copies of 2**64 - 1 bytes made the summary panic in a
    build with overflow checks, and wrap in one without)."""
    huge = 2**64 - 1
    copy = ("transfer", (1, "h2d", huge, "host", "d", "sync_to_device", "sync", 0, None, 7))
    events = tuple((i, i, 1, None, *copy) for i in range(2))
    trace = lazybuf._lazybuf._rebuild_trace(1, events, 0)
    assert trace.summary_rows() == [(1, "h2d", "sync", 2, huge)]
    assert str(huge) in trace.summary()
    assert '"bytes":18446744073709551615' in trace.to_chrome_json()


@pytest.mark.parametrize("selector", one_selector_per_backend())
def test_a_bfloat16_buffer_serves_plain_bytes_requests(selector, tmp_path):
    """A bfloat16 buffer refused every buffer-protocol request, plain-bytes ones (`hashlib`, a
    file's `write`) too, although those need no format of the elements (NumPy serves them for
    its bfloat16 arrays). They get the bytes now; a request for items (`memoryview`, `bytes()`,
    which ask for the format) is still refused, changing nothing."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    import hashlib

    data = np.array([1.0, -2.5, 3.25, 0.0, 7.0], dtype=ml_dtypes.bfloat16)
    buf = lazybuf.UnifiedBuffer((5,), "bfloat16", device=selector)
    buf.copy_from(data)
    assert hashlib.sha256(buf).hexdigest() == hashlib.sha256(data).hexdigest()
    path = tmp_path / "bf16.bin"
    with open(path, "wb") as f:
        assert f.write(buf) == data.nbytes
    assert path.read_bytes() == data.tobytes()
    back = lazybuf.UnifiedBuffer((5,), "bfloat16", device=selector)
    with open(path, "rb") as f:
        assert f.readinto(back) == data.nbytes  # a writable plain-bytes request: a host write
    np.testing.assert_array_equal(back.to_numpy(), data)
    state = buf.state
    for items in (memoryview, bytes):
        with pytest.raises(BufferError, match="bfloat16 has no buffer-protocol format"):
            items(buf)
    assert buf.state == state
