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
