"""Edge cases of issue 20, each found by a hostile tester: copies between overlapping memory,
the command-line tool's bad sizes and closed stdout, devices used in a forked child, the
Dask adoption rule for small views of large arrays, NumPy integers as device ids, and pickles
that remember their device. Every test runs on every device lazybuf finds (host, PoCL's
OpenCL device, lavapipe through wgpu, the CUDA test double when loaded)."""

from __future__ import annotations

import gc
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import weakref

import numpy as np
import pytest

import lazybuf
from conftest import collect
from lazybuf import BufferState, UnifiedBuffer, get_accelerator

MIB = 1 << 20


def devices() -> list:
    return list(get_accelerator().devices)


def address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


def buffer_address(obj) -> int:
    return address(np.frombuffer(obj, np.uint8))


def ramp(n: int, seed: int = 0) -> np.ndarray:
    """n bytes that differ at every MiB-sized shift (a period of 251, prime): byte i is
    (7 i + seed) mod 251, one period repeated (no n-sized temporaries of int64)."""
    return np.resize(((np.arange(251) * 7 + seed) % 251).astype(np.uint8), n)


# --- 2. copies between overlapping memory -----------------------------------------------


@pytest.mark.parametrize("device", devices(), ids=str)
@pytest.mark.parametrize("source_first", [True, False], ids=["source-below", "source-above"])
def test_copy_from_a_source_overlapping_an_adopted_frame_is_numpy_assignment(device, source_first):
    """The tester's repro at 64 MiB: the frame is adopted (the buffer's host copy is its
    bytes), and the source overlaps it 1 MiB away, below or above. Split over threads without
    regard to overlap, about 1 MiB came out wrong; the result must be NumPy's `a[...] = b`."""
    get_accelerator().select_device(device)
    n = 64 * MIB
    header, _ = lazybuf._dask.dask_dumps(UnifiedBuffer((n,), np.uint8))
    header["initialized"] = True
    backing = bytearray(2 * n)
    np.frombuffer(backing, np.uint8)[:] = ramp(2 * n)
    frame_at, source_at = (n, n - MIB) if source_first else (0, MIB)
    buf = lazybuf._dask.dask_loads(header, [memoryview(backing)[frame_at : frame_at + n]])
    assert address(buf.host_readonly) == buffer_address(backing) + frame_at, "the frame is adopted"
    source = np.frombuffer(backing, np.uint8, count=n, offset=source_at)
    expected = source.copy()
    buf.copy_from(source)
    assert buf.state == BufferState.HOST_ONLY
    got = buf.to_numpy()
    wrong = np.flatnonzero(got != expected)
    assert wrong.size == 0, f"{wrong.size} wrong bytes, the first at {wrong[:1]}"


def memory_objects(nbytes: int):
    """(device, kind, memory object) for each host-readable memory kind of each device."""
    for device in devices():
        for kind in (lazybuf.MemoryHost, lazybuf.MemoryShared):
            try:
                memory = kind(nbytes, device=device)
            except (ValueError, MemoryError, lazybuf.BackendUnavailableError):
                continue  # the device has no memory of this kind (wgpu: no host memory)
            yield device, kind.__name__, memory


@pytest.mark.parametrize("nbytes", [4096, 8 * MIB + 64])
def test_memory_objects_copy_between_overlapping_views_of_themselves_as_numpy_does(nbytes):
    shift = 1 * MIB + 3 if nbytes > MIB else 5
    checked = 0
    for device, kind, memory in memory_objects(nbytes):
        what = f"{kind} on {device}"
        memory.copy_from_host(ramp(nbytes, seed=1))
        # Source above the destination: the memory's own bytes from `shift` on.
        expected = ramp(nbytes, seed=1)
        expected[: nbytes - shift] = expected[shift:].copy()
        memory.copy_from_host(memoryview(memory)[shift:])
        assert np.array_equal(memory.copy_to_host(), expected), what
        # A prefix of itself into itself (the same first address), and the whole of a
        # second memory object over the same bytes.
        memory.copy_from_host(ramp(nbytes, seed=2))
        memory.copy_from_host(memoryview(memory)[: nbytes - shift])
        assert np.array_equal(memory.copy_to_host(), ramp(nbytes, seed=2)), what
        alias = type(memory)(memory)
        memory.copy_from_device(alias)
        assert np.array_equal(memory.copy_to_host(), ramp(nbytes, seed=2)), what
        checked += 1
    assert checked >= 1, "the host device has host memory"


# --- 5 and 18. the command-line tool: sizes from user input, and a closed stdout ----------


def run_cli(
    *args: str, stdout=subprocess.PIPE, shell_suffix: str = "", setup: str = ""
) -> subprocess.CompletedProcess:
    """`python -m lazybuf ARGS`, with stderr less the Vulkan loader's and Mesa's own notices
    (lavapipe prints one about XDG_RUNTIME_DIR in containers)."""
    if shell_suffix or setup:
        command = setup + "\nexec " + " ".join([sys.executable, "-m", "lazybuf", *args]) + " " + shell_suffix
        result = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=120)
    else:
        result = subprocess.run(
            [sys.executable, "-m", "lazybuf", *args],
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    noise = ("XDG_RUNTIME_DIR", "MESA", "WARNING: lavapipe")
    result.stderr = "".join(
        line for line in result.stderr.splitlines(keepends=True) if not any(n in line for n in noise)
    )
    return result


@pytest.mark.parametrize(
    "sizes,words",
    [
        (["--min", "100GiB", "--max", "100GiB"], "needs"),
        (["--min", "18446744073709551615", "--max", "18446744073709551615"], "needs"),
        (["--min", "1KiB", "--max", "18446744073709551615"], "needs"),
    ],
    ids=["100GiB", "u64-max", "max-only"],
)
def test_bandwidth_sizes_beyond_the_machine_are_one_error_line_not_an_abort(sizes, words):
    result = run_cli("bandwidth", "--device", "host", *sizes)
    assert result.returncode == 1, result
    assert result.stderr.startswith("lazybuf: error: --max"), result.stderr
    assert words in result.stderr and "memory and swap" in result.stderr, result.stderr
    assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stdout == ""


def test_an_allocation_refused_by_the_address_space_limit_is_one_error_line():
    """4 GiB blocks fit the machine's memory but not a 4 GiB address space that also holds the
    interpreter, NumPy and the runtimes: an error line, never an abort."""
    args = ("bandwidth", "--device", "host", "--pageable", "--min", "4GiB", "--max", "4GiB")
    result = run_cli(*args, setup="ulimit -v 4194304")
    assert result.returncode == 1, result
    assert result.stderr.startswith("lazybuf: error: out of memory on host"), result.stderr
    assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr, result.stderr


COMMANDS = [
    ["devices"],
    ["devices", "--json"],
    ["bandwidth", "--device", "host", "--min", "1KiB", "--max", "1KiB", "--time-per-point", "1ms"],
    ["watch", "--device", "host", "--count", "1"],
    ["check", "--device", "host", "--steps", "1"],
]


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_a_closed_stdout_is_one_error_line_and_status_1_never_a_traceback(args):
    result = run_cli(*args, shell_suffix=">&-")
    assert result.returncode == 1, result
    assert result.stderr == "lazybuf: error: cannot write to stdout: it is closed (Bad file descriptor)\n", result


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_a_stdout_pipe_closed_by_its_reader_ends_quietly(args):
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the tool writes a byte
    try:
        result = run_cli(*args, stdout=write)
    finally:
        os.close(write)
    assert result.returncode == 0, result
    assert "Traceback" not in result.stderr and "Exception" not in result.stderr, result.stderr
    assert result.stderr == "", result.stderr


# --- 9. devices used in a forked child ----------------------------------------------------

FORK_CHILD = """
import os, sys, time
import numpy as np
import lazybuf
from lazybuf import UnifiedBuffer, get_accelerator

device = [d for d in get_accelerator().devices if d.selector == sys.argv[1]][0]
survives = device.survives_fork
parent_buf = UnifiedBuffer((4096,), np.uint32, device=device)
parent_buf.host[:] = np.arange(4096, dtype=np.uint32)
parent_buf.sync_to_device()  # the parent uses the device: its runtime runs its threads
parent_buf.mark_device_dirty()
# An asynchronous upload of the parent's, waited for in the child (a ticket knows its runtime,
# not its device: the transfer names it).
pending_buf = UnifiedBuffer((4096,), np.uint32, device=device)
pending_buf.host[:] = 7
pending = pending_buf.sync_to_device_async()

def child() -> int:
    outcomes = []
    def upload():
        buf = UnifiedBuffer((16,), np.float32, device=device)
        buf.host[:] = 1.0
        buf.sync_to_device()
        assert buf.to_numpy().sum() == 16.0

    for attempt in (
        upload,
        lambda: parent_buf.to_numpy(),
        device.get_memory_info,
        pending.wait,
        # The parent's current device copy handed out again needs no runtime call, but its
        # handle is the parent runtime's: using it hung the child (a hostile pass, 2026-11-27).
        lambda: parent_buf.device,
        lambda: parent_buf.device_writable,
    ):
        try:
            attempt()
            outcomes.append("ok")
        except lazybuf.ForkedChildError as err:
            message = str(err)
            good = (device.name in message and "forked child" in message and "'spawn'" in message)
            outcomes.append("refused" if good else "wrong: " + message)
        except Exception as err:
            outcomes.append("wrong: " + repr(err))
    global parent_buf
    del parent_buf  # dropping the parent's device memory must not hang either
    import gc; gc.collect()
    expected = ["ok"] * 6 if survives else ["refused"] * 6
    if device.backend == "wgpu" and outcomes[3] == "ok":
        expected[3] = "ok"  # wgpu's transfers complete before the fork: nothing to wait for
    print(outcomes, file=sys.stderr)
    return 0 if outcomes == expected else 3

pid = os.fork()
if pid == 0:
    try:
        status = child()
    except BaseException as err:
        print("child raised", repr(err), file=sys.stderr)
        status = 4
    os._exit(status)
deadline = time.monotonic() + 30
while True:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done == pid:
        sys.exit(os.waitstatus_to_exitcode(status))
    if time.monotonic() > deadline:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        sys.exit(5)  # the child hung
    time.sleep(0.02)
"""


@pytest.mark.parametrize("device", devices(), ids=str)
def test_a_forked_child_gets_a_clear_error_on_a_device_its_runtime_does_not_survive(device):
    """os.fork() after the parent used the device: OpenCL, CUDA and wgpu devices raise a
    RuntimeError naming the device and the 'spawn' start method in the child (without the
    check the child hangs, killed here after 30 s: status 5); devices that survive fork (the
    host device, the test-only loopback devices) work there."""
    result = subprocess.run(
        [sys.executable, "-c", FORK_CHILD, device.selector], capture_output=True, text=True, timeout=90
    )
    assert result.returncode == 0, f"status {result.returncode}: {result.stderr}"


# Prepended to the fork scripts below: waits for a child, killing it (and failing with
# `hung`) if it has not exited after 20 s.
WAIT_FOR_CHILD = r"""
import os, sys, time
def wait_for_child(pid, hung):
    deadline = time.monotonic() + 20
    while (done := os.waitpid(pid, os.WNOHANG)) == (0, 0):
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            sys.exit(hung)
        time.sleep(0.01)
    return done[1]
"""

FORK_DURING_FIRST_USE = WAIT_FOR_CHILD + r"""
import os, sys, threading, time
import numpy as np
import lazybuf

# The forks go on for 2 s and at least 5 times (a loaded machine forks slowly), while the
# other thread makes buffers.
stop = time.monotonic() + 2
forks = 0
def first_use():
    # This thread's first buffers, while the main thread forks: what lazybuf makes at first
    # use (NumPy's C API table and API version) must not be half made in a child.
    while time.monotonic() < stop or forks < 5:
        b = lazybuf.UnifiedBuffer(64, np.float32, device=sys.argv[1])
        b.copy_from(np.ones(64, np.float32))
thread = threading.Thread(target=first_use)
thread.start()
while time.monotonic() < stop or forks < 5:
    pid = os.fork()
    if pid == 0:
        b = lazybuf.UnifiedBuffer(16, np.float32, device="host")
        b.copy_from(np.full(16, 2.0, np.float32))
        os._exit(0 if float(b.to_numpy().sum()) == 32.0 else 3)
    status = wait_for_child(pid, f"a child forked while another thread made its first buffers hung (fork {forks})")
    assert status == 0, f"child status {status}"
    forks += 1
    time.sleep(0.02)
thread.join()
print("forks", forks)
"""


@pytest.mark.parametrize("device", [d for d in devices() if d.survives_fork], ids=str)
def test_a_child_forked_while_another_thread_makes_its_first_buffers_works(device):
    """The hostile repro (2026-11-27): a child forked while another thread made its first
    buffer waited forever for NumPy's C API table, which that thread was making when the fork
    copied the process (5 runs of 6 of the hostile script hung), and then, more rarely, for
    NumPy's API version (this test, 3 devices of 3 in one pass). PyO3 releases the GIL before
    it starts making a once-cell's value, so the forking thread runs in between. Both are made
    when lazybuf is imported now."""
    result = subprocess.run(
        [sys.executable, "-c", FORK_DURING_FIRST_USE, device.selector], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, f"status {result.returncode}: {result.stdout}{result.stderr}"
    assert int(result.stdout.split()[-1]) >= 5, result.stdout


FORK_WHILE_A_CELL_IS_MADE = WAIT_FOR_CHILD + r"""
import builtins, os, sys, threading, time
import numpy as np
import lazybuf

# The first call of each kind makes one of the binding's once-cells by an import (NumPy,
# pickle's PickleBuffer; the BufferState enum's members are made at import since a buffer's
# first `state` could come from a finalizer late in shutdown). While the "maker" thread is
# inside that import (held there, with the GIL released, as a slow import would be), the main
# thread forks; the child then makes the same call.
buf = lazybuf.UnifiedBuffer(4, np.float32, device="host")
calls = {
    "copy_from": lambda: buf.copy_from(np.ones(4, np.float32)),
    "pickle out of band": lambda: buf.__reduce_ex__(5),
}
parent = os.getpid()
inside, release = threading.Event(), threading.Event()
real_import = builtins.__import__
def held_import(*args, **kwargs):
    if threading.current_thread().name == "maker" and os.getpid() == parent and not inside.is_set():
        inside.set()
        release.wait(30)
    return real_import(*args, **kwargs)
builtins.__import__ = held_import
for what, call in calls.items():
    inside.clear(); release.clear()
    maker = threading.Thread(target=call, name="maker")
    maker.start()
    assert inside.wait(30), f"{what}: made no cell by an import (made already?)"
    pid = os.fork()
    if pid == 0:
        try:
            call()
            os._exit(0)
        except BaseException as err:
            print(what, "in the child:", repr(err), flush=True)
            os._exit(4)
    release.set()
    maker.join()
    status = wait_for_child(pid, f"{what}: the child waited for the cell the other thread was making")
    assert status == 0, f"{what}: child status {status}"
    print("forked while making:", what)
"""


def test_a_child_forked_while_another_thread_makes_a_cell_makes_it_itself():
    """The cause of the fork hangs, made deterministic: PyO3's once-cells release the GIL while
    a value is made and keep the cell "being made" throughout, so a child forked then waited
    forever for it. The binding's cells (`gil_cell.rs`) are made with the GIL held and stay
    empty until stored; the child makes its own. The calls use the host device: the cells are
    the binding's, the same for every device."""
    result = subprocess.run(
        [sys.executable, "-c", FORK_WHILE_A_CELL_IS_MADE], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, f"status {result.returncode}: {result.stdout}{result.stderr}"
    assert result.stdout.count("forked while making") == 2, result.stdout


FORK_WHILE_A_BUFFER_IS_IN_USE = WAIT_FOR_CHILD + r"""
import os, sys, threading, time
import numpy as np
import lazybuf
import lazybuf.mr as lmr

# Another thread holds the buffer's lock across its allocation: a failure callback (run inside
# it) waits there, with the GIL released, while the main thread forks.
HELD = (1 << 20) - 8192
limit = lmr.LimitingResourceAdaptor(lmr.DirectMemoryResource(), 1 << 20)
held = limit.allocate(HELD, device="host")
inside, release = threading.Event(), threading.Event()
parent = os.getpid()
def callback(nbytes):
    if os.getpid() == parent:
        inside.set()
        release.wait(30)
    limit.deallocate(held, HELD)
    return True
lmr.set_current_device_resource(lmr.FailureCallbackResourceAdaptor(limit, callback), device="host")
buf = lazybuf.UnifiedBuffer((16384,), np.uint8, device="host")
user = threading.Thread(target=lambda: buf.host)  # allocates the host copy through the callback
user.start()
assert inside.wait(30)
pid = os.fork()
if pid == 0:
    try:
        buf.to_numpy()
        print("the child used a buffer whose lock a parent's thread held", flush=True)
        os._exit(3)
    except lazybuf.ForkedChildError as err:
        ok = "in use by another thread when this process was forked" in str(err) and "'spawn'" in str(err)
        print("child:", err, flush=True)
        # A buffer the child makes itself works.
        mine = lazybuf.UnifiedBuffer((4,), np.float32, device="host")
        mine.copy_from(np.arange(4, dtype=np.float32))
        os._exit(0 if ok and mine.to_numpy().sum() == 6.0 else 4)
    except BaseException as err:
        print("child:", repr(err), flush=True)
        os._exit(5)
release.set()
user.join()
status = wait_for_child(pid, "the child waited forever for a lock a thread of its parent held at the fork")
assert status == 0, f"child status {status}"
assert buf.to_numpy().shape == (16384,)  # the parent's thread finished and released it
print("DONE")
"""


def test_a_child_gets_forked_child_error_for_a_buffer_another_thread_held_at_the_fork():
    """`fork` copies only the forking thread: a buffer's lock that another thread held at that
    moment is never released in the child, whose first use of the buffer waited forever. The
    binding's lock records the fork generation it was taken in; the child gets
    ForkedChildError naming the object, and its own buffers work. Host device: the lock is the
    binding's, the same on every device."""
    result = subprocess.run(
        [sys.executable, "-c", FORK_WHILE_A_BUFFER_IS_IN_USE], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, f"status {result.returncode}: {result.stdout}{result.stderr}"
    assert "DONE" in result.stdout, result.stdout + result.stderr


def _use_in_child(selector: str, queue) -> None:
    try:
        buf = UnifiedBuffer((8,), np.float32, device=selector)
        buf.host[:] = 2.0
        buf.sync_to_device()
        queue.put(("ok", float(buf.to_numpy().sum())))
    except lazybuf.ForkedChildError as err:
        queue.put(("refused", str(err)))


@pytest.mark.parametrize("device", devices(), ids=str)
def test_a_multiprocessing_fork_worker_is_refused_and_a_spawn_worker_works(device):
    import multiprocessing

    used = UnifiedBuffer((8,), np.float32, device=device)
    used.host[:] = 1.0
    used.sync_to_device()
    selector = device.selector
    for method in ("fork", "spawn"):
        context = multiprocessing.get_context(method)
        queue = context.Queue()
        worker = context.Process(target=_use_in_child, args=(selector, queue))
        worker.start()
        worker.join(60)
        if worker.is_alive():
            worker.kill()
            worker.join()
            pytest.fail(f"a {method} worker using {device} hung")
        outcome, detail = queue.get(timeout=10)
        if method == "spawn" or device.survives_fork:
            assert outcome == "ok" and detail == 16.0, (method, detail)
        else:
            assert outcome == "refused", (method, detail)
            assert device.name in detail and "'spawn'" in detail, detail


# --- 11. Dask adoption: a small view of a large array is copied ---------------------------


@pytest.mark.parametrize("device", devices(), ids=str)
def test_a_small_view_of_a_large_array_is_copied_and_the_array_freed(device):
    get_accelerator().select_device(device)
    n = 1 * MIB
    header, _ = lazybuf._dask.dask_dumps(UnifiedBuffer((n,), np.uint8))
    header["initialized"] = True
    large = np.zeros(64 * MIB, np.uint8)
    large[:n] = ramp(n)
    freed = weakref.ref(large)
    frame = memoryview(large[:n])  # writable, 1 MiB: only its base says it lies in 64 MiB
    buf = lazybuf._dask.dask_loads(header, [frame])
    assert address(buf.host_readonly) != buffer_address(frame), "copied, not adopted"
    assert np.array_equal(buf.host_readonly, ramp(n))
    del large, frame
    collect()
    assert freed() is None, "the buffer does not keep the large array alive"
    assert np.array_equal(buf.to_numpy(), ramp(n))


def test_a_view_of_a_view_is_measured_at_the_allocation():
    n = 1 * MIB
    header, _ = lazybuf._dask.dask_dumps(UnifiedBuffer((n,), np.uint8))
    header["initialized"] = True
    # Half of a bytearray, through a NumPy view and a memoryview of it: adopted.
    backing = bytearray(2 * n)
    frame = memoryview(np.frombuffer(backing, np.uint8)[n:])
    adopted = lazybuf._dask.dask_loads(header, [frame])
    assert address(adopted.host_readonly) == buffer_address(frame)
    # A view whose chain ends in a much larger array: copied.
    from numpy.lib.stride_tricks import as_strided

    owner = np.zeros(4 * n, np.uint8)
    orphan = as_strided(owner[:n])  # its .base chain ends at `owner`, 4 times its size
    copied = lazybuf._dask.dask_loads(header, [memoryview(orphan)])
    assert address(copied.host_readonly) != address(orphan)


# --- 15. NumPy integers as device ids -----------------------------------------------------


class Index:
    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value


@pytest.mark.parametrize("kind", [np.int64, np.int32, np.uint8, np.intp, Index], ids=lambda k: k.__name__)
def test_get_device_and_set_device_take_any_integer_with_index(kind):
    acc = get_accelerator()
    for i, device in enumerate(acc.devices):
        assert acc.get_device(kind(i)) == device
        acc.set_device(kind(i))
        assert acc.current_device == device
    with pytest.raises(ValueError, match="got -1"):
        acc.get_device(np.int64(-1))
    with pytest.raises(ValueError, match=f"got {len(acc.devices)}"):
        acc.set_device(np.int64(len(acc.devices)))


@pytest.mark.parametrize("bad", [True, np.True_, np.float64(0.0), "0", None], ids=repr)
def test_device_ids_that_are_not_integers_are_type_errors(bad):
    acc = get_accelerator()
    before = acc.current_device
    with pytest.raises(TypeError, match="expected a device_id"):
        acc.get_device(bad)
    with pytest.raises(TypeError, match="expected a device_id"):
        acc.set_device(bad)
    assert acc.current_device == before


# --- 17. a pickle remembers its device ----------------------------------------------------


def other_device():
    """A device other than the host to make current while unpickling: wgpu (no pinned host
    memory), else OpenCL, else any, else the host itself."""
    all_ = devices()
    for backend in ("wgpu", "opencl", "cuda"):
        for device in all_:
            if device.backend == backend:
                return device
    return next(d for d in all_ if d.backend == "host")


def pickled(buf, protocol=5):
    buffers: list = []
    callback = buffers.append if protocol >= 5 else None
    data = pickle.dumps(buf, protocol=protocol, buffer_callback=callback)
    return data, buffers


@pytest.mark.parametrize("protocol", [2, 4, 5])
@pytest.mark.parametrize("device", devices(), ids=str)
def test_a_pinned_buffer_unpickles_onto_its_own_device_whatever_is_current(device, protocol):
    buf = UnifiedBuffer((1000,), np.float32, device=device, pinned=True)
    if device.backend == "wgpu":
        with pytest.raises(MemoryError, match="no pinned host memory"):
            buf.host[:] = 0  # wgpu devices refuse pinned host copies: nothing to pickle
        return
    buf.host[:] = np.arange(1000, dtype=np.float32)
    data, buffers = pickled(buf, protocol)
    get_accelerator().select_device(other_device())
    clone = pickle.loads(data, buffers=buffers)
    assert clone.device_handle == device, (clone.device_handle, device)
    assert clone.pinned
    assert np.array_equal(clone.to_numpy(), np.arange(1000, dtype=np.float32))


def test_a_pickle_of_a_device_this_process_lacks_goes_to_the_current_device():
    data = np.arange(64, dtype=np.float32).tobytes()
    for current in devices():
        get_accelerator().select_device(current)
        clone = lazybuf._lazybuf._rebuild_buffer_from_bytes(
            (64,), "float32", True, data, None, False, ("cuda:97", "a device of another machine")
        )
        assert clone.device_handle == current
        # Pinned where the device can pin host memory; pageable where it cannot (wgpu).
        assert clone.pinned == (current.backend != "wgpu"), current
        assert np.array_equal(clone.to_numpy(), np.arange(64, dtype=np.float32))
    # The recorded device, found by selector, must also have the recorded name.
    host = next(d for d in devices() if d.backend == "host")
    get_accelerator().select_device(other_device())
    clone = lazybuf._lazybuf._rebuild_buffer_from_bytes(
        (64,), "float32", False, data, None, False, ("host:0", "not the host's name")
    )
    assert clone.device_handle == other_device(), "a selector naming another device is not followed"
    get_accelerator().select_device(host)
