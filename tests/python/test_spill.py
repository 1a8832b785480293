"""Spilling under per-device memory limits from Python, on every device found:
``set_memory_limit`` / ``get_memory_limit`` / ``LAZYBUF_MEMORY_LIMIT``, clean evictions that move
no byte, write-backs of copies that hold the only current data, buffers that are exposed (while
the exposing object lives; test_spill_exposure.py has the scopes) or opted out not evicted, a
failed write-back that changes nothing, ``spill_stats``, and threads racing accesses against
eviction.

Buffers are 64 KiB: below the size at which a host-sharing OpenCL device aliases host memory.
On the host device a buffer's device copy is the host memory itself: it holds no device memory,
so nothing is evicted there, and the tests check that instead. Limits are set relative to what
the device holds already, and removed after each test.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import lazybuf
from conftest import collect
from lazybuf import BufferState

N = 16 * 1024  # float32 elements: 64 KiB
NBYTES = N * 4


def _devices() -> list[lazybuf.Device]:
    return list(lazybuf.get_accelerator().devices)


@pytest.fixture(params=_devices(), ids=lambda d: d.selector)
def device(request):
    d = request.param
    yield d
    lazybuf.set_memory_limit(d, None)


def evicts(device) -> bool:
    """Whether a 64 KiB device copy holds device memory there (so eviction frees some)."""
    return device.backend != "host"


def limit_for(device, copies: int) -> int:
    """Room for `copies` more device copies than `device` holds now. Earlier tests' garbage
    goes first: a buffer in an uncollected cycle (a `pytest.raises(...) as info` traceback
    holds its test's frame) still holds its device copy, which the collector could free in the
    middle of the test (more room than counted) or eviction could pick before the test's own."""
    collect()
    lazybuf.trim()
    limit = lazybuf.memory_held(device) + copies * NBYTES
    lazybuf.set_memory_limit(device, limit)
    lazybuf.reset_spill_stats(device)
    return limit


def holding(device, seed: int, **kwargs) -> lazybuf.UnifiedBuffer:
    buf = lazybuf.UnifiedBuffer(N, np.float32, device=device, **kwargs)
    buf.copy_from(np.arange(N, dtype=np.float32) + seed)
    return buf


def expected(seed: int) -> np.ndarray:
    return np.arange(N, dtype=np.float32) + seed


def test_limits_round_trip_and_bad_input_says_what_was_expected(host_device):
    assert lazybuf.get_memory_limit(host_device) is None
    lazybuf.set_memory_limit(host_device, 1 << 20)
    assert lazybuf.get_memory_limit("host") == 1 << 20
    lazybuf.set_memory_limit("host", "2MiB")
    assert lazybuf.get_memory_limit(host_device) == 2 << 20
    lazybuf.set_memory_limit("host", None)
    assert lazybuf.get_memory_limit("host") is None
    with pytest.raises(ValueError, match="non-negative"):
        lazybuf.set_memory_limit("host", -1)
    with pytest.raises(ValueError, match="expected a size unit") as raised:
        lazybuf.set_memory_limit("host", "lots")
    assert "LAZYBUF_MEMORY_LIMIT" not in str(raised.value)  # no environment variable was used
    # 2**64 - 1 is "no limit" in the core: refused, not read back as None (a hostile script).
    for huge in (2**64 - 1, 2**64):
        with pytest.raises(ValueError, match=r"below 2\*\*64 - 1"):
            lazybuf.set_memory_limit("host", huge)
        with pytest.raises(ValueError, match=r"below 2\*\*64 - 1"):
            lazybuf.set_host_memory_limit(huge)
    with pytest.raises(TypeError, match="nbytes must be an int"):
        lazybuf.set_memory_limit("host", 1.5)
    with pytest.raises(TypeError, match="got a bool"):
        lazybuf.set_memory_limit("host", True)
    with pytest.raises(ValueError, match="no device matches"):
        lazybuf.set_memory_limit("opencl:99", 1)
    assert lazybuf.get_memory_limit("host") is None


def _with_env(value: str, code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "LAZYBUF_DEVICE": "host", "LAZYBUF_MEMORY_LIMIT": value},
    )


def test_the_environment_sets_limits():
    done = _with_env("host=1.5MiB", "import lazybuf; print(lazybuf.get_memory_limit('host'))")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(3 << 19)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("host", "expected SELECTOR=SIZE"),
        ("host=lots", "expected a size unit"),
        ("=5", "expected a device selector"),
        ("tpu:0=1GiB", "names none"),
        ("host=0.5", "expected a whole number of bytes"),
        ("host:0=1MiB,host:0=2MiB", "expected each device once"),
        ("host=1MiB,host:0=64MiB", "both name"),
    ],
)
def test_a_bad_environment_is_a_clear_error(value, message):
    code = "import lazybuf\ntry:\n    lazybuf.get_memory_limit('host')\nexcept ValueError as e:\n    print(e)\n"
    done = _with_env(value, code)
    assert done.returncode == 0, done.stderr
    assert "LAZYBUF_MEMORY_LIMIT" in done.stdout and message in done.stdout, done.stdout


def test_a_synchronized_copy_is_evicted_moving_no_byte(device):
    limit = limit_for(device, 2)
    bufs = [holding(device, i) for i in range(3)]
    for buf in bufs:
        buf.sync_to_device()
    stats = lazybuf.spill_stats(device)
    if evicts(device):
        assert bufs[0].state == BufferState.HOST_ONLY
        assert (stats["evictions"], stats["clean_evictions"], stats["bytes_written_back"]) == (1, 1, 0)
        assert lazybuf.memory_held(device) <= limit
    else:
        assert stats["evictions"] == 0
        assert bufs[0].state == BufferState.SYNCHRONIZED
    assert all(b.state == BufferState.SYNCHRONIZED for b in bufs[1:])
    bufs[0].sync_to_device()
    np.testing.assert_array_equal(bufs[0].to_numpy(), expected(0))
    if evicts(device):
        assert lazybuf.spill_stats(device)["bytes_read_back"] == NBYTES


def test_a_copy_holding_the_only_current_data_is_written_back_first(device):
    limit_for(device, 1)
    a = holding(device, 1)
    a.sync_to_device()
    a.fill(7.0)  # at the current device copy: the host goes stale
    assert a.state == BufferState.DEVICE_DIRTY
    holding(device, 2).sync_to_device()
    stats = lazybuf.spill_stats(device)
    if evicts(device):
        assert a.state == BufferState.HOST_ONLY
        assert (stats["evictions"], stats["clean_evictions"], stats["bytes_written_back"]) == (1, 0, NBYTES)
    else:
        assert a.state == BufferState.DEVICE_DIRTY
    np.testing.assert_array_equal(a.to_numpy(), np.full(N, 7.0, np.float32))


def test_exposed_and_opted_out_buffers_are_never_evicted(device):
    limit_for(device, 2)
    exposed = holding(device, 1)
    exposed_view = exposed.device  # an object over the device memory, which lazybuf cannot track
    opted_out = holding(device, 2, spillable=False)
    assert not opted_out.spillable and exposed.spillable
    opted_out.sync_to_device()
    newcomer = holding(device, 3)
    if evicts(device):
        with pytest.raises(MemoryError, match="memory limit"):
            newcomer.sync_to_device()
        assert newcomer.state == BufferState.HOST_ONLY
        # (The pool retries a refused allocation once after trimming: one or two failures.)
        assert lazybuf.spill_stats(device)["spill_failures"] >= 1
    else:
        newcomer.sync_to_device()
    assert exposed.state == BufferState.SYNCHRONIZED
    assert opted_out.state == BufferState.SYNCHRONIZED
    del exposed_view
    np.testing.assert_array_equal(opted_out.to_numpy(), expected(2))


def test_memory_objects_count_against_the_limit(device):
    limit_for(device, 2)
    before = lazybuf.memory_held(device)
    held = lazybuf.DeviceBuffer(size=NBYTES, device=device, mr=None)
    assert lazybuf.memory_held(device) >= before + NBYTES
    a = holding(device, 1)
    a.sync_to_device()
    second = lazybuf.DeviceBuffer(size=NBYTES, device=device)
    if evicts(device):
        assert a.state == BufferState.HOST_ONLY  # the buffer made room; the object was not touched
    assert held.size == NBYTES and second.size == NBYTES


def test_a_failed_write_back_changes_nothing():
    testing = pytest.importorskip("lazybuf.testing")
    for inner in [d for d in _devices() if evicts(d)]:
        faulty = testing.FaultyDevice(inner)
        try:
            limit_for(faulty, 1)
            a = holding(faulty, 1)
            a.sync_to_device()
            a.fill(5.0)
            b = holding(faulty, 2)
            faulty.fail_copy_in(1)
            with pytest.raises(RuntimeError, match="injected fault"):
                b.sync_to_device()
            faulty.disarm()
            assert a.state == BufferState.DEVICE_DIRTY
            assert b.state == BufferState.HOST_ONLY
            assert lazybuf.spill_stats(faulty)["evictions"] == 0
            np.testing.assert_array_equal(a.to_numpy(), np.full(N, 5.0, np.float32))
            b.sync_to_device()  # disarmed: a is synchronized now, and evicted for free
            assert a.state == BufferState.HOST_ONLY
            np.testing.assert_array_equal(b.to_numpy(), expected(2))
        finally:
            lazybuf.set_memory_limit(faulty, None)


def test_a_write_back_is_an_eviction_whatever_call_needed_the_room(device):
    """Found by a hostile script (2026-11-27): the write-back an explicit ``sync_to_device()``
    caused was recorded as that call's explicit copy (reason ``sync``) and let through
    ``transfer_guard(d2h="disallow")``, which refuses implicit device-to-host copies; spilling's
    copies are ``evict``'s, reason ``eviction``, in whichever call they happen."""
    if not evicts(device):
        pytest.skip("the host device's copies hold no device memory: nothing is evicted")
    limit_for(device, 1)
    a = holding(device, 1)
    a.sync_to_device()
    a.fill(7.0)  # DEVICE_DIRTY: evicting it writes it back
    b = holding(device, 2)
    with lazybuf.transfer_guard(d2h="disallow"):
        with pytest.raises(lazybuf.TransferGuardError, match="evict"):
            b.sync_to_device()
    assert a.state == BufferState.DEVICE_DIRTY and b.state == BufferState.HOST_ONLY
    with lazybuf.trace.record() as recording:
        b.sync_to_device()  # evicts a: its write-back, then b's upload
    copies = [e for e in recording.trace.events() if e.get("kind") == "transfer"]
    write_backs = [e for e in copies if e["direction"] == "d2h"]
    assert len(write_backs) == 1, copies
    assert write_backs[0]["reason"] == "eviction" and write_backs[0]["call"] == "evict", write_backs
    uploads = [e for e in copies if e["direction"] == "h2d"]
    assert [(e["reason"], e["call"]) for e in uploads] == [("sync", "sync_to_device")], uploads
    np.testing.assert_array_equal(a.to_numpy(), np.full(N, 7.0, np.float32))
    np.testing.assert_array_equal(b.to_numpy(), expected(2))


def test_a_buffer_whose_asynchronous_sync_was_waited_for_can_be_evicted(device):
    """Found by a hostile script (2026-11-27): a buffer that had an asynchronous sync stayed
    "in use" for eviction until its next device call, even after ``Transfer.wait()``, so
    PYTHON.md's own batch loop with ``await buf.sync_to_device_async()`` ran out of memory
    under a limit. A finished transfer no longer keeps a buffer busy."""
    if not evicts(device):
        pytest.skip("the host device's copies hold no device memory: nothing is evicted")
    limit_for(device, 1)
    a = holding(device, 1)
    a.sync_to_device_async().wait()
    b = holding(device, 2)
    b.sync_to_device()  # room for one copy: a's (clean) is evicted, no byte moved
    assert a.state == BufferState.HOST_ONLY and b.state == BufferState.SYNCHRONIZED
    assert lazybuf.spill_stats(device)["evictions"] == 1
    np.testing.assert_array_equal(a.to_numpy(), expected(1))
    np.testing.assert_array_equal(b.to_numpy(), expected(2))


def test_threads_race_accesses_against_eviction(device):
    # Four threads each hold one buffer's lock while it allocates: room for five copies always
    # leaves one to evict, and eight buffers make eviction constant.
    limit_for(device, 5)
    bufs = [holding(device, i) for i in range(8)]
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            for round_ in range(30):
                buf = bufs[t * 2 + round_ % 2]  # each thread writes its own two buffers
                value = float(t * 1000 + round_)
                if round_ % 3 == 0:
                    buf.copy_from(np.full(N, value, np.float32))
                else:
                    buf.sync_to_device()
                    buf.fill(value)  # on the device copy: only the device holds it now
                buf.sync_to_device()
                np.testing.assert_array_equal(buf.to_numpy(), np.full(N, value, np.float32))
        except BaseException as err:  # noqa: BLE001 - reported by the main thread
            errors.append(err)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    if evicts(device):
        assert lazybuf.spill_stats(device)["evictions"] > 0


@pytest.mark.skipif(
    os.environ.get("LAZYBUF_SKIP_CLUSTER") == "1",
    reason="LAZYBUF_SKIP_CLUSTER=1 (scripts/test-python.sh runs the cluster tests once)",
)
def test_a_dask_cluster_finishes_a_job_twice_its_device_budget():
    """One worker process whose device (PoCL's OpenCL device) has a 1 MiB limit
    (LAZYBUF_MEMORY_LIMIT in its environment) holds 32 buffers of 64 KiB (2 MiB), one in five
    written on the device, and reads each one again: the job finishes, every sum is right, and
    the worker evicted (and wrote back the device-written buffers it evicted)."""
    distributed = pytest.importorskip("distributed")
    if not any(d.backend == "opencl" for d in _devices()):
        from conftest import _need

        _need("opencl", "no OpenCL device: the host device's copies hold no device memory to spill")
    import spill_tasks

    saved = {k: os.environ.get(k) for k in ("LAZYBUF_DEVICE", "LAZYBUF_MEMORY_LIMIT")}
    os.environ["LAZYBUF_DEVICE"] = "opencl"
    os.environ["LAZYBUF_MEMORY_LIMIT"] = "opencl:0=1MiB"
    try:
        with distributed.LocalCluster(
            n_workers=1,
            processes=True,
            threads_per_worker=2,
            host="127.0.0.1",
            dashboard_address=None,
            worker_dashboard_address=None,
        ) as cluster, distributed.Client(cluster) as client:
            made = [client.submit(spill_tasks.make_on_device, seed, N, pure=False) for seed in range(32)]
            distributed.wait(made)  # all 32 made (2 MiB of device copies) before any is read
            sums = client.gather([client.submit(spill_tasks.total, m, pure=False) for m in made])
            assert sums == [spill_tasks.expected_total(seed, N) for seed in range(32)]
            (report,) = client.run(spill_tasks.spill_report).values()
            del made
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    assert report["backend"] == "opencl" and report["limit"] == 1 << 20, report
    assert report["held"] <= report["limit"], report
    assert report["evictions"] > 0 and report["bytes_written_back"] > 0, report
    assert report["bytes_read_back"] > 0, report


# --- the disk tier ----------------------------------------------------------------------------


@pytest.fixture
def host_limit():
    """A host memory limit helper that removes the limit afterwards. Earlier tests' garbage
    goes first (see `limit_for`): every buffer has a host copy, so any one an earlier test left
    in a cycle would be written to disk before the test's own, or freed mid-test."""

    def room_for(copies: int) -> None:
        collect()
        lazybuf.trim()
        lazybuf.set_host_memory_limit(lazybuf.host_memory_held() + copies * NBYTES)

    yield room_for
    lazybuf.set_host_memory_limit(None)


def test_host_limits_round_trip_and_bad_input_says_what_was_expected():
    assert lazybuf.get_host_memory_limit() is None
    lazybuf.set_host_memory_limit("1GiB")
    assert lazybuf.get_host_memory_limit() == 1 << 30
    lazybuf.set_host_memory_limit(None)
    assert lazybuf.get_host_memory_limit() is None
    with pytest.raises(ValueError, match="non-negative"):
        lazybuf.set_host_memory_limit(-5)
    with pytest.raises(TypeError, match="nbytes must be an int"):
        lazybuf.set_host_memory_limit([1])


def test_host_copies_go_to_disk_and_come_back(host_limit):
    lazybuf.reset_spill_stats("host")
    host_limit(3)
    bufs = [holding("host", i) for i in range(5)]  # copy_from hands no address out
    stats = lazybuf.spill_stats("host")
    assert stats["bytes_to_disk"] == 2 * NBYTES
    assert lazybuf.host_memory_held() <= lazybuf.get_host_memory_limit()
    assert all(b.state == BufferState.HOST_ONLY for b in bufs)
    np.testing.assert_array_equal(bufs[0].to_numpy(), expected(0))  # read back from disk
    assert lazybuf.spill_stats("host")["bytes_from_disk"] == NBYTES
    lazybuf.set_host_memory_limit(None)
    for i, buf in enumerate(bufs):
        np.testing.assert_array_equal(buf.to_numpy(), expected(i))


def test_an_exposed_host_copy_is_never_written_to_disk(host_limit):
    lazybuf.reset_spill_stats("host")
    host_limit(1)
    exposed = holding("host", 1)
    view = exposed.host_readonly  # a NumPy array over the host copy
    with pytest.raises(MemoryError, match="host"):
        holding("host", 2)
    np.testing.assert_array_equal(view, expected(1))
    assert lazybuf.spill_stats("host")["bytes_to_disk"] == 0
    assert exposed.state == BufferState.HOST_ONLY


@pytest.mark.parametrize("device_view", [False, True], ids=["", "device view alive"])
def test_a_stale_host_copy_is_freed_for_the_host_limit_writing_nothing(device, host_limit, device_view):
    """The twenty-first hostile pass: under a tight host limit the stale host blocks of
    DEVICE_DIRTY buffers were never given back (only a host copy that is a buffer's only data
    went to disk), so the next host copy raised MemoryError while they held no current data.
    The least recently used one is freed now, writing nothing: DEVICE_DIRTY becomes DEVICE_ONLY
    and the next read downloads the device's data, also while a device view of it lives. A
    device copy that is the host block itself (the host device's) frees nothing."""
    bufs = [holding(device, i) for i in range(3)]
    views = []
    for buf in bufs:
        buf.sync_to_device()
        if device_view:
            views.append(buf.device)
        buf.mark_device_dirty()  # the device's copy is the newer one now
    lazybuf.reset_spill_stats(device)
    host_limit(0)
    if evicts(device):
        holding(device, 9)
        stats = lazybuf.spill_stats(device)
        assert (stats["stale_host_frees"], stats["bytes_to_disk"]) == (1, 0)
        assert [b.state for b in bufs] == [BufferState.DEVICE_ONLY] + [BufferState.DEVICE_DIRTY] * 2
    else:
        with pytest.raises(MemoryError, match="host"):
            holding(device, 9)
        assert lazybuf.spill_stats(device)["stale_host_frees"] == 0
        assert all(b.state == BufferState.DEVICE_DIRTY for b in bufs)
    lazybuf.set_host_memory_limit(None)
    for i, buf in enumerate(bufs):
        np.testing.assert_array_equal(buf.to_numpy(), expected(i))


def test_a_host_request_larger_than_the_whole_limit_writes_nothing_to_disk(host_limit):
    """A hostile pass (2026-11-27): it wrote every spillable host copy to disk first, and then
    raised MemoryError; it raises at once now."""
    lazybuf.reset_spill_stats("host")
    host_limit(4)
    bufs = [holding("host", i) for i in range(3)]
    big = lazybuf.UnifiedBuffer(5 * N, np.float32, device="host")
    with pytest.raises(MemoryError, match="the request alone exceeds its memory limit"):
        big.copy_from(np.zeros(5 * N, np.float32))
    assert lazybuf.spill_stats("host")["bytes_to_disk"] == 0
    for i, buf in enumerate(bufs):
        np.testing.assert_array_equal(buf.to_numpy(), expected(i))


@pytest.mark.parametrize("device", [d for d in _devices() if d.selector.startswith(("opencl", "loopback"))], ids=str)
def test_an_async_sync_the_guard_refuses_reads_nothing_back_from_disk(device, host_limit):
    """A hostile pass (2026-11-27): `sync_to_device_async()` under `disallow_explicit` read its
    spilled host copy back from disk (writing another buffer to disk to make room) before the
    guard refused it. The guard sees its copies first, as for every other call."""
    lazybuf.reset_spill_stats(device)
    host_limit(1)
    spilled = holding(device, 1)
    holding_room = holding(device, 2)  # writes `spilled`'s host copy to disk
    before = lazybuf.spill_stats(device)
    assert before["bytes_to_disk"] == NBYTES
    with lazybuf.transfer_guard(h2d="disallow_explicit"):
        with pytest.raises(lazybuf.TransferGuardError):
            spilled.sync_to_device_async()
    assert lazybuf.spill_stats(device) == before
    lazybuf.set_host_memory_limit(None)
    np.testing.assert_array_equal(spilled.to_numpy(), expected(1))
    np.testing.assert_array_equal(holding_room.to_numpy(), expected(2))


def _spilling_on_host(code: str, spill_dir) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter on the host device, spilling to `spill_dir`."""
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "LAZYBUF_DEVICE": "host", "LAZYBUF_SPILL_DIR": str(spill_dir)},
    )


def test_spill_files_are_removed_at_exit(tmp_path):
    code = f"""
import numpy as np, lazybuf
lazybuf.trim()
lazybuf.set_host_memory_limit(lazybuf.host_memory_held() + {NBYTES})
keep = [lazybuf.UnifiedBuffer({N}, np.float32, device="host") for _ in range(3)]
for b in keep:
    b.copy_from(np.ones({N}, np.float32))
import os
print(len(os.listdir({str(tmp_path)!r})))
"""
    done = _spilling_on_host(code, tmp_path)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.strip()) == 2  # two of the three were on disk while it ran
    assert os.listdir(tmp_path) == []  # and the files went at exit


SHARED_SPILL_DIR_CHILD = f"""
import os, sys, time
import numpy as np, lazybuf
seed = int(sys.argv[1])
# A file a killed process of this pid could have left, with the name the first spill would take.
stale = os.path.join(os.environ["LAZYBUF_SPILL_DIR"], f"{{os.getpid()}}-0.bin")
open(stale, "wb").write(b"left behind")
lazybuf.trim()
lazybuf.set_host_memory_limit(lazybuf.host_memory_held() + {NBYTES})
bufs = []
for i in range(6):
    b = lazybuf.UnifiedBuffer({N}, np.float32, device="host")
    b.copy_from(np.full({N}, seed * 100 + i, np.float32))
    bufs.append(b)
    time.sleep(0.01)
assert lazybuf.spill_stats("host")["bytes_to_disk"] >= 5 * {NBYTES}
for i, b in enumerate(bufs):
    got = b.to_numpy()
    assert (got == seed * 100 + i).all(), (seed, i, got[:2])
del bufs, b
assert open(stale, "rb").read() == b"left behind", "a stale file was overwritten"
os.remove(stale)
print("OK", seed)
"""


def test_processes_sharing_a_spill_directory_keep_their_own_files(tmp_path):
    """Found by a hostile script (2026-11-27): spill files were named by a per-process counter
    only and created with truncation, so two processes sharing ``LAZYBUF_SPILL_DIR`` (Dask
    workers) overwrote each other's files (silent corruption) or removed them (lost data).
    Names now carry the pid and files are created exclusively: a file already there (another
    process's, or one a killed process left) is never taken over."""
    env = {**os.environ, "LAZYBUF_DEVICE": "host", "LAZYBUF_SPILL_DIR": str(tmp_path)}
    children = [
        subprocess.Popen(
            [sys.executable, "-c", SHARED_SPILL_DIR_CHILD, str(seed)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for seed in (1, 2, 3)
    ]
    for seed, child in zip((1, 2, 3), children):
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0 and f"OK {seed}" in out, out + err
    assert os.listdir(tmp_path) == []


FORKED_CHILD_AND_SPILL_FILES = f"""
import os
import numpy as np, lazybuf
lazybuf.trim()
lazybuf.set_host_memory_limit(lazybuf.host_memory_held() + {NBYTES})
bufs = []
for i in range(3):
    b = lazybuf.UnifiedBuffer({N}, np.float32, device="host")
    b.copy_from(np.full({N}, i, np.float32))
    bufs.append(b)
assert lazybuf.spill_stats("host")["bytes_to_disk"] >= 2 * {NBYTES}
pid = os.fork()
if pid == 0:
    # The child reads one of the parent's spilled buffers, drops another, and exits normally
    # (running the package's exit hook): none of it may remove the parent's files.
    ok = (bufs[0].to_numpy() == 0).all()
    del bufs[1]
    import sys
    sys.exit(0 if ok else 3)
_, status = os.waitpid(pid, 0)
assert status == 0, status
for i, b in enumerate(bufs):
    assert (b.to_numpy() == i).all(), i
print("OK")
"""


def test_a_forked_child_leaves_its_parents_spill_files_alone(tmp_path):
    """Found by a hostile script (2026-11-27): a forked child that exited normally removed
    every spill file it inherited (the package's exit hook), and one that dropped an inherited
    buffer removed that buffer's file, so the parent lost the data. A spill file is removed only
    by the process that wrote it."""
    done = _spilling_on_host(FORKED_CHILD_AND_SPILL_FILES, tmp_path)
    assert done.returncode == 0 and "OK" in done.stdout, done.stdout + done.stderr
    assert os.listdir(tmp_path) == []


def test_an_unwritable_spill_directory_is_a_clear_error_and_nothing_is_lost():
    code = f"""
import numpy as np, lazybuf
lazybuf.trim()
lazybuf.set_host_memory_limit(lazybuf.host_memory_held() + {NBYTES})
first = lazybuf.UnifiedBuffer({N}, np.float32, device="host")
first.copy_from(np.full({N}, 3, np.float32))
try:
    lazybuf.UnifiedBuffer({N}, np.float32, device="host").copy_from(np.ones({N}, np.float32))
except OSError as err:  # an I/O failure, with the system's errno, as a read-back's is
    assert err.errno is not None, err
    print(err)
lazybuf.set_host_memory_limit(None)
assert (first.to_numpy() == 3).all() and str(first.state) == "HOST_ONLY", first.state
"""
    done = _spilling_on_host(code, "/proc/lazybuf-cannot-be-made")
    assert done.returncode == 0, done.stderr
    assert "could not create the directory" in done.stdout and "keeps its host copy" in done.stdout, done.stdout


EVICTION_POLICY_CHILD = """
import numpy as np, lazybuf
d = lazybuf.get_accelerator().select_device("loopback:0")
n = 16 * 1024
lazybuf.set_memory_limit(d, lazybuf.memory_held(d) + 4 * n)
a = lazybuf.UnifiedBuffer(n, np.float32, device=d)
a.copy_from(np.ones(n, np.float32))
b = lazybuf.UnifiedBuffer(n, np.float32, device=d)
b.copy_from(np.ones(n, np.float32))
try:
    a.sync_to_device()  # SYNCHRONIZED: a clean copy (the first allocation under the budget)
    b.sync_to_device()  # evicts a's copy
except ValueError as err:
    print("error", err)
else:
    print("written_back", lazybuf.spill_stats(d)["bytes_written_back"])
"""


@pytest.mark.parametrize(
    "policy,expected",
    [("coherence-aware", "written_back 0"), ("write-back-always", f"written_back {16 * 1024 * 4}"), ("sometimes", "error")],
)
def test_the_eviction_policy_environment_variable(policy, expected):
    """`LAZYBUF_EVICTION_POLICY` (for benchmarks): a clean copy is evicted moving nothing, or
    written back first under `write-back-always`; any other value is a clear error."""
    if "loopback:0" not in [d.selector for d in lazybuf.get_accelerator().devices]:
        pytest.skip("needs the loopback devices (a wheel built with the testing feature)")
    env = dict(os.environ, LAZYBUF_EVICTION_POLICY=policy)
    env.pop("LAZYBUF_MEMORY_LIMIT", None)
    done = subprocess.run([sys.executable, "-c", EVICTION_POLICY_CHILD], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(expected), done.stdout
    if expected == "error":
        assert "LAZYBUF_EVICTION_POLICY" in done.stdout and "write-back-always" in done.stdout


@pytest.mark.parametrize(
    ("size", "message"),
    [("-1", "a size cannot be negative"), ("-1MiB", "a size cannot be negative"), ("+5", "a size takes no sign")],
)
def test_a_signed_size_is_refused_as_signed_not_as_a_bad_unit(size, message):
    """A hostile pass (2026-11-27): `-1` and `+5` were "expected a size unit ..., got \"-1\"":
    the sign is what is wrong, and the error says so."""
    with pytest.raises(ValueError, match=message) as raised:
        lazybuf.set_memory_limit("host", size)
    assert "expected a size unit" not in str(raised.value)
    done = _with_env(f"host={size}", "import lazybuf\ntry:\n    lazybuf.get_memory_limit('host')\nexcept ValueError as e:\n    print(e)\n")
    assert done.returncode == 0, done.stderr
    assert "LAZYBUF_MEMORY_LIMIT" in done.stdout and message in done.stdout, done.stdout
    assert "expected a size unit" not in done.stdout, done.stdout


EXPLICIT_LIMIT_OVER_A_BAD_ENVIRONMENT = """
import numpy as np, lazybuf
devices = [d.selector for d in lazybuf.get_accelerator().devices if d.selector.startswith("loopback")]
first, second = devices[:2]
lazybuf.set_memory_limit(first, "1MiB")
print("LIMIT", lazybuf.get_memory_limit(first))
b = lazybuf.UnifiedBuffer(16, np.float32, device=first)
b.copy_from(np.ones(16, np.float32))
b.sync_to_device()
print("ALLOCATED", lazybuf.memory_held(first) > 0)
try:
    lazybuf.UnifiedBuffer(1 << 19, np.float32, device=first).sync_to_device()   # 2 MiB: over 1 MiB
except MemoryError as err:
    print("OVER", "limit" in str(err))
for call in (lambda: lazybuf.get_memory_limit(second), lambda: lazybuf.UnifiedBuffer(16, np.float32, device=second).sync_to_device()):
    try:
        call()
    except ValueError as err:
        print("OTHER", err)
lazybuf.set_memory_limit(second, None)                # no limit, explicitly: also an override
print("SECOND", lazybuf.get_memory_limit(second))
lazybuf.UnifiedBuffer(16, np.float32, device=second).sync_to_device()
print("DONE")
"""


def test_an_explicit_limit_overrides_a_malformed_environment_for_its_device():
    """A hostile pass (2026-11-27): with LAZYBUF_MEMORY_LIMIT malformed, set_memory_limit()
    returned, yet get_memory_limit() and every allocation on that device still failed with the
    variable's error: the limit could not be set at all. SPILLING.md: a call of
    set_memory_limit overrides the variable for its device; devices no call set still report
    the variable's error."""
    if len([d for d in lazybuf.get_accelerator().devices if d.selector.startswith("loopback")]) < 2:
        pytest.skip("needs two loopback devices (a wheel built with the testing feature)")
    done = _with_env("host=lots", EXPLICIT_LIMIT_OVER_A_BAD_ENVIRONMENT)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert f"LIMIT {1 << 20}" in lines and "ALLOCATED True" in lines and "OVER True" in lines, done.stdout
    others = [line for line in lines if line.startswith("OTHER")]
    assert len(others) == 2 and all("LAZYBUF_MEMORY_LIMIT" in line and "lots" in line for line in others), done.stdout
    assert "SECOND None" in lines and "DONE" in lines, done.stdout


READ_BACK_OF_A_REPLACED_FILE = f"""
import os, sys
import numpy as np, lazybuf
lazybuf.trim()
lazybuf.set_host_memory_limit(lazybuf.host_memory_held() + {NBYTES})
a = lazybuf.UnifiedBuffer({N}, np.float32, device="host"); a.copy_from(np.full({N}, 5, np.float32))
b = lazybuf.UnifiedBuffer({N}, np.float32, device="host"); b.copy_from(np.full({N}, 6, np.float32))
lazybuf.set_host_memory_limit(None)
spill_dir = os.environ["LAZYBUF_SPILL_DIR"]
(name,) = os.listdir(spill_dir)
path = os.path.join(spill_dir, name)
os.rename(path, path + ".aside")
replacement = sys.argv[1]
if replacement == "fifo":
    os.mkfifo(path)
try:
    a.to_numpy()
except Exception as err:
    print("ERROR", type(err).__name__, err)
print("STATE", a.state)
if replacement == "fifo":
    os.remove(path)
os.rename(path + ".aside", path)
print("BACK", bool((a.to_numpy() == 5).all()))
"""


@pytest.mark.skipif(sys.platform == "win32", reason="FIFOs")
@pytest.mark.parametrize("replacement", ["missing", "fifo"])
def test_a_spill_file_gone_or_replaced_is_an_io_error_and_changes_nothing(tmp_path, replacement):
    """A hostile pass (2026-11-27): a spill file replaced by a FIFO made the next access wait in
    open() forever; a missing one was "invalid argument for read back from disk". Both are I/O
    errors now (OSError, not ValueError), the FIFO refused at once, and the buffer is
    unchanged: with its file back, it reads back."""
    spill_dir = tmp_path / "spill"
    spill_dir.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", READ_BACK_OF_A_REPLACED_FILE, replacement],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "LAZYBUF_DEVICE": "host", "LAZYBUF_SPILL_DIR": str(spill_dir)},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (error,) = [line for line in done.stdout.splitlines() if line.startswith("ERROR")]
    # OSError with the system's errno where there is one (a missing file: FileNotFoundError).
    expected = "FileNotFoundError [Errno 2] " if replacement == "missing" else "OSError "
    assert error.startswith(f"ERROR {expected}read back from disk failed: could not read spill file"), error
    assert "invalid argument" not in error and "the buffer is unchanged" in error, error
    assert ("found a FIFO in its place" if replacement == "fifo" else "No such file or directory") in error, error
    assert "STATE HOST_ONLY" in done.stdout and "BACK True" in done.stdout, done.stdout
    assert os.listdir(spill_dir) == []
