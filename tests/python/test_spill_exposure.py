"""Scoped exposure, on every device found: a buffer whose memory an object lazybuf cannot see
uses (a ``.device`` array, a DLPack capsule or the tensor that consumed it, a
``__cuda_array_interface__`` / ``__array_interface__`` export, a ``.host`` view, a buffer-protocol
export) is not evicted, nor written to disk, while that object lives, and is again once it is
gone: ``lazybuf.testing.exposures(buf)`` counts those objects, and eviction follows the count.
Views a buffer caches for its next access never keep it in use by themselves.

As in test_spill.py, buffers are 64 KiB, limits are set relative to what the device holds, and
the host device (whose device copy is the host memory, holding no device memory) evicts nothing:
there the tests check that nothing is evicted and that the counts still follow the objects.
"""

from __future__ import annotations

import ctypes
import gc
import subprocess
import sys
import threading

import numpy as np
import pytest

import lazybuf
from conftest import FAKE_CUPY
from lazybuf import BufferState

testing = pytest.importorskip("lazybuf.testing")

N = 16 * 1024  # float32 elements: 64 KiB
NBYTES = N * 4


def _devices() -> list[lazybuf.Device]:
    return list(lazybuf.get_accelerator().devices)


@pytest.fixture(params=_devices(), ids=lambda d: d.selector)
def device(request):
    d = request.param
    yield d
    lazybuf.set_memory_limit(d, None)


@pytest.fixture
def host_limit():
    """Sets a host memory limit with room for `copies` more host copies; removed afterwards."""

    def room_for(copies: int) -> None:
        gc.collect()  # earlier tests' buffers (a pytest.raises traceback holds its frame)
        lazybuf.trim()
        lazybuf.set_host_memory_limit(lazybuf.host_memory_held() + copies * NBYTES)
        lazybuf.reset_spill_stats("host")

    yield room_for
    lazybuf.set_host_memory_limit(None)


def evicts(device) -> bool:
    """Whether a 64 KiB device copy holds device memory there (so eviction frees some)."""
    return device.backend != "host"


def is_cuda(device) -> bool:
    """Whether buffers on `device` have `__cuda_array_interface__` (asking `hasattr` would call
    the getter: an export)."""
    return device.backend == "cuda"


def exports_device_dlpack(device) -> bool:
    """Whether the buffer's own DLPack device is its device memory (CUDA), not the CPU."""
    return lazybuf.UnifiedBuffer(1, np.float32, device=device).__dlpack_device__()[0] != 1


def limit_for(device, copies: int) -> None:
    """Room for `copies` more device copies than `device` holds now."""
    gc.collect()  # earlier tests' buffers (a pytest.raises traceback holds its frame)
    lazybuf.trim()
    lazybuf.set_memory_limit(device, lazybuf.memory_held(device) + copies * NBYTES)
    lazybuf.reset_spill_stats(device)


def holding(device, seed: int) -> lazybuf.UnifiedBuffer:
    buf = lazybuf.UnifiedBuffer(N, np.float32, device=device)
    buf.copy_from(expected(seed))
    return buf


def expected(seed: int) -> np.ndarray:
    return np.arange(N, dtype=np.float32) + seed


def gone(*_: object) -> None:
    """Collects garbage (the exposing objects were deleted by the caller) and drops the views
    buffers keep for reuse that nothing else references, as spilling does when it needs room
    (`test_a_view_only_its_buffer_keeps_is_dropped_when_spilling_needs_room` shows it)."""
    gc.collect()
    testing.reclaim()


# --- a DLPack consumer in ctypes, for device capsules nothing installed here consumes ------


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device_type", ctypes.c_int32),
        ("device_id", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("dtype_code", ctypes.c_uint8),
        ("dtype_bits", ctypes.c_uint8),
        ("dtype_lanes", ctypes.c_uint16),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]

_api = ctypes.pythonapi
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]


class CapsuleConsumer:
    """Consumes a legacy DLPack capsule as a library does: renames it "used_dltensor" (its
    destructor then leaves the tensor alone) and calls the tensor's deleter when done."""

    def __init__(self, capsule: object) -> None:
        address = _api.PyCapsule_GetPointer(capsule, b"dltensor")
        assert _api.PyCapsule_SetName(capsule, b"used_dltensor") == 0
        self.tensor = ctypes.cast(address, ctypes.POINTER(_DLManagedTensor))

    def done(self) -> None:
        self.tensor.contents.deleter(self.tensor)


# --- device copies: eviction while exposed, and again after -------------------------------


def _expose_device(buf: lazybuf.UnifiedBuffer, how: str) -> object:
    """An object that uses `buf`'s device copy, made the way `how` says."""
    if how == "device":
        return buf.device
    if how == "device_writable":
        return buf.device_writable
    if how == "dlpack_unconsumed":
        return buf.__dlpack__()
    if how == "dlpack_consumed":
        return CapsuleConsumer(buf.__dlpack__())
    if how == "device_view_cai":
        view = buf.device
        if isinstance(view, lazybuf.DeviceMemoryView):
            # A consumer of the view's interface keeps the view (the exporter).
            return {"exporter": view, "interface": view.__cuda_array_interface__}
        return view
    raise AssertionError(how)


DEVICE_EXPOSURES = ["device", "device_writable", "dlpack_unconsumed", "dlpack_consumed", "device_view_cai"]


@pytest.mark.parametrize("how", DEVICE_EXPOSURES)
def test_an_exposed_device_copy_is_kept_until_the_object_is_gone(device, how):
    if how.startswith("dlpack") and not exports_device_dlpack(device):
        pytest.skip(f"{device.selector} exports its host copy to DLPack, not its device memory")
    if how == "device_view_cai" and not is_cuda(device):
        pytest.skip(f"{device.selector} has no CUDA array interface")
    limit_for(device, 1)
    a = holding(device, 1)
    exposing = _expose_device(a, how)
    assert testing.exposures(a) == (1, 0)
    written = a.state == BufferState.DEVICE_DIRTY  # device_writable and DLPack are device writes
    b = holding(device, 2)
    if evicts(device):
        with pytest.raises(MemoryError, match="memory limit"):
            b.sync_to_device()
        assert b.state == BufferState.HOST_ONLY
        assert lazybuf.spill_stats(device)["evictions"] == 0
    assert a.state == (BufferState.DEVICE_DIRTY if written else BufferState.SYNCHRONIZED)

    if how == "dlpack_consumed":
        exposing.done()  # the consumer's tensor is gone: its deleter ran
    del exposing
    gone()
    assert testing.exposures(a) == (0, 0)
    b.sync_to_device()
    stats = lazybuf.spill_stats(device)
    if evicts(device):
        assert stats["evictions"] == 1
        assert stats["bytes_written_back"] == (NBYTES if written else 0)
        assert a.state == BufferState.HOST_ONLY
    else:
        assert stats["evictions"] == 0
    assert b.state == BufferState.SYNCHRONIZED
    np.testing.assert_array_equal(a.to_numpy(), expected(1))
    np.testing.assert_array_equal(b.to_numpy(), expected(2))


def test_an_exposed_buffer_lets_eviction_take_another(device):
    limit_for(device, 2)
    a, c = holding(device, 1), holding(device, 3)
    view = a.device
    c.sync_to_device()
    holding(device, 2).sync_to_device()  # a is older, but in use: c goes
    if evicts(device):
        assert c.state == BufferState.HOST_ONLY
        assert lazybuf.spill_stats(device)["evictions"] == 1
    assert a.state == BufferState.SYNCHRONIZED
    del view
    np.testing.assert_array_equal(c.to_numpy(), expected(3))


@pytest.mark.parametrize("view", ["device", "device_writable"])
def test_a_view_only_its_buffer_keeps_is_dropped_when_spilling_needs_room(device, view):
    """The buffer keeps its last views (the same object comes back, cheaply, for a caller who
    drops it each time), which keeps the memory in use; when eviction finds too little to evict
    it drops every kept view nothing else references and tries again."""
    limit_for(device, 1)
    a = holding(device, 1)
    first = getattr(a, view)
    assert getattr(a, view) is first  # kept: the same object again
    del first
    gc.collect()
    kept = testing.exposures(a)
    assert sum(kept) == 1  # the buffer's own kept view
    b = holding(device, 2)
    b.sync_to_device()  # needs a's room (where copies hold device memory)
    if evicts(device):
        assert testing.exposures(a) == (0, 0)
        assert lazybuf.spill_stats(device)["evictions"] == 1
        assert a.state == BufferState.HOST_ONLY
    np.testing.assert_array_equal(a.to_numpy(), expected(1))
    np.testing.assert_array_equal(b.to_numpy(), expected(2))


def test_a_kept_view_someone_else_references_stays(device):
    """A view the caller still holds (or a view of it) is not dropped by spilling."""
    if not evicts(device):
        pytest.skip(f"{device.selector} copies hold no device memory")
    limit_for(device, 1)
    a = holding(device, 1)
    held = a.device
    view_of_it = a.host[1:]  # a NumPy view of the kept `.host`: the base stays referenced
    b = holding(device, 2)
    with pytest.raises(MemoryError, match="memory limit"):
        b.sync_to_device()
    assert a.device is held
    assert testing.exposures(a) == (1, 1)
    del held, view_of_it
    b.sync_to_device()
    assert a.state == BufferState.HOST_ONLY


def test_a_cached_device_view_does_not_keep_its_buffer_in_use(device):
    limit_for(device, 1)
    a = holding(device, 1)
    first = a.device
    assert a.device is first  # handed out again while the caller has it
    assert testing.exposures(a) == (1, 0)
    del first
    gone()
    assert testing.exposures(a) == (0, 0)  # the buffer's cache alone holds nothing
    holding(device, 2).sync_to_device()
    if evicts(device):
        assert a.state == BufferState.HOST_ONLY
    again = a.device  # a new view over the current copy
    assert testing.exposures(a) == (1, 0)
    assert a.state == BufferState.SYNCHRONIZED
    del again
    np.testing.assert_array_equal(a.to_numpy(), expected(1))


def test_views_count_one_each_and_the_last_one_ends_the_exposure(device):
    a = holding(device, 1)
    objects = [a.device, a.device_writable, a.host_readonly]
    # `.device_writable` hands out the live `.device` object again (same copy): one each.
    assert objects[1] is objects[0]
    assert testing.exposures(a) == (1, 1)
    objects.append(memoryview(a))
    assert testing.exposures(a) == (1, 2)
    objects.pop().release()
    objects.pop()
    gone()
    assert testing.exposures(a) == (1, 0)
    objects.clear()
    gone()
    assert testing.exposures(a) == (0, 0)


def test_an_exposure_in_a_reference_cycle_ends_when_the_collector_frees_it(device):
    a = holding(device, 1)
    cycle: list = [a.device, a.host]
    cycle.append(cycle)
    del cycle
    gone()
    assert testing.exposures(a) == (0, 0)


def test_an_exposure_ends_on_whichever_thread_drops_it(device):
    a = holding(device, 1)
    held = [a.device, a.host_readonly]
    thread = threading.Thread(target=held.clear)
    thread.start()
    thread.join()
    gone()
    assert testing.exposures(a) == (0, 0)


def test_cuda_array_interface_keeps_the_copy_while_the_buffer_object_lives(device):
    if not is_cuda(device):
        pytest.skip(f"{device.selector} has no CUDA array interface")
    limit_for(device, 1)
    a = holding(device, 1)
    interface = a.__cuda_array_interface__
    a.__cuda_array_interface__  # noqa: B018 - a second export of the same memory adds nothing
    assert testing.exposures(a) == (1, 0)
    b = holding(device, 2)
    with pytest.raises(MemoryError, match="memory limit"):
        b.sync_to_device()
    assert a.state == BufferState.DEVICE_DIRTY  # the interface is a device write
    # The consumer holds the buffer object (the exporter): the memory lives as long as it.
    a.release()
    with pytest.raises(MemoryError, match="memory limit"):
        b.sync_to_device()
    del a, interface
    gone()
    b.sync_to_device()  # the memory went with the object
    np.testing.assert_array_equal(b.to_numpy(), expected(2))


def test_a_device_frame_keeps_the_copy_while_it_lives(device):
    if not is_cuda(device):
        pytest.skip(f"{device.selector} has no device frames (CUDA only)")
    a = holding(device, 1)
    a.sync_to_device()
    frame = lazybuf._lazybuf._device_frame(a)
    assert testing.exposures(a) == (1, 0)
    del frame
    gone()
    assert testing.exposures(a) == (0, 0)


# --- host copies: the disk tier while exposed, and again after -------------------------------


def _expose_host(buf: lazybuf.UnifiedBuffer, how: str) -> object:
    if how == "host":
        return buf.host
    if how == "host_readonly":
        return buf.host_readonly
    if how == "memoryview":
        return memoryview(buf)
    if how == "dlpack_numpy":
        return np.from_dlpack(buf)
    if how == "dlpack_unconsumed":
        return buf.__dlpack__(max_version=(1, 0))
    raise AssertionError(how)


HOST_EXPOSURES = ["host", "host_readonly", "memoryview", "dlpack_numpy", "dlpack_unconsumed"]


@pytest.mark.parametrize("how", HOST_EXPOSURES)
def test_an_exposed_host_copy_goes_to_disk_once_the_object_is_gone(host_limit, how):
    host_limit(1)
    a = holding("host", 1)
    exposing = _expose_host(a, how)
    assert sum(testing.exposures(a)) == 1
    if how == "host":
        exposing[0] = -1.0  # a write through the view, which the disk must keep
    with pytest.raises(MemoryError, match="host"):
        holding("host", 2)
    assert lazybuf.spill_stats("host")["bytes_to_disk"] == 0

    if how == "memoryview":
        exposing.release()
    del exposing
    gone()
    assert testing.exposures(a) == (0, 0)
    b = holding("host", 2)
    assert lazybuf.spill_stats("host")["bytes_to_disk"] == NBYTES
    want = expected(1)
    if how == "host":
        want[0] = -1.0
    np.testing.assert_array_equal(a.to_numpy(), want)  # read back from disk
    np.testing.assert_array_equal(b.to_numpy(), expected(2))


def test_array_interface_keeps_the_host_copy_while_the_buffer_object_lives(host_limit):
    host_limit(1)
    a = holding("host", 1)
    a.__array_interface__  # noqa: B018 - the consumer holds `a`, the exporter
    a.__array_interface__  # noqa: B018
    assert testing.exposures(a) == (0, 1)
    with pytest.raises(MemoryError, match="host"):
        holding("host", 2)
    np.testing.assert_array_equal(a.to_numpy(), expected(1))
    del a
    gone()
    np.testing.assert_array_equal(holding("host", 2).to_numpy(), expected(2))


@pytest.mark.parametrize("view", ["host", "host_readonly"])
def test_a_host_view_only_its_buffer_keeps_is_dropped_when_the_disk_tier_needs_room(host_limit, view):
    """As for device views: the disk tier drops kept host views nothing else references."""
    host_limit(1)
    a = holding("host", 1)
    first = getattr(a, view)
    assert getattr(a, view) is first
    del first
    gc.collect()
    assert testing.exposures(a) == (0, 1)  # the buffer's own kept view
    b = holding("host", 2)  # needs a's host room: a's copy goes to disk
    assert testing.exposures(a) == (0, 0)
    assert lazybuf.spill_stats("host")["bytes_to_disk"] == NBYTES
    np.testing.assert_array_equal(a.to_numpy(), expected(1))
    np.testing.assert_array_equal(b.to_numpy(), expected(2))


def test_a_cached_host_view_does_not_keep_its_buffer_in_use(host_limit):
    host_limit(1)
    a = holding("host", 1)
    view = a.host_readonly
    assert a.host_readonly is view
    del view
    gone()
    holding("host", 2)  # a's host copy goes to disk: the buffer's cache does not hold it
    assert lazybuf.spill_stats("host")["bytes_to_disk"] == NBYTES
    np.testing.assert_array_equal(a.host_readonly, expected(1))


# --- threads ---------------------------------------------------------------------------------


def test_threads_take_and_drop_exposures_while_another_allocates_under_a_budget(device):
    # Three threads each hold one copy in use at a time, a fourth allocates: a refused
    # allocation (all other copies in use or locked at that moment) is a clear MemoryError.
    limit_for(device, 4)
    bufs = [holding(device, i) for i in range(6)]
    errors: list[BaseException] = []
    refused = [0]
    stop = threading.Event()

    def expose(t: int) -> None:
        try:
            for round_ in range(40):
                buf = bufs[t * 2 + round_ % 2]  # each thread its own two buffers
                try:
                    held = [buf.device, buf.host_readonly, memoryview(buf)]
                except MemoryError as err:  # every other copy in use at that moment
                    assert "memory limit" in str(err)
                    refused[0] += 1
                    continue
                if round_ % 4 == 0:
                    held.append(buf.__dlpack__())
                np.testing.assert_array_equal(held[1], expected(t * 2 + round_ % 2))
                held[2].release()
                held.clear()
        except BaseException as err:  # noqa: BLE001 - reported by the main thread
            errors.append(err)

    def allocate() -> None:
        try:
            seed = 100
            while not stop.is_set():
                try:
                    fresh = holding(device, seed)
                    fresh.sync_to_device()
                    np.testing.assert_array_equal(fresh.to_numpy(), expected(seed))
                except MemoryError as err:  # every other copy in use at that moment
                    assert "memory limit" in str(err)
                    refused[0] += 1
                seed += 1
        except BaseException as err:  # noqa: BLE001
            errors.append(err)

    allocator = threading.Thread(target=allocate)
    allocator.start()
    threads = [threading.Thread(target=expose, args=(t,)) for t in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stop.set()
    allocator.join()
    assert not errors, errors
    gone()
    assert all(testing.exposures(b) == (0, 0) for b in bufs)
    if evicts(device):  # copies whose exposures ended were evicted meanwhile
        assert lazybuf.spill_stats(device)["evictions"] > 0
    # Nothing is in use now: a new copy always finds room.
    holding(device, 7).sync_to_device()
    for i, buf in enumerate(bufs):
        np.testing.assert_array_equal(buf.to_numpy(), expected(i))


# --- bad input -------------------------------------------------------------------------------


def test_a_refused_export_leaves_no_exposure_and_the_buffer_unchanged(device):
    a = holding(device, 1)
    state = a.state
    with pytest.raises(BufferError, match="cannot export to DLPack device"):
        a.__dlpack__(dl_device=(99, 0))
    if not exports_device_dlpack(device):
        with pytest.raises(ValueError, match="stream must be None"):
            a.__dlpack__(stream=1)
    if not is_cuda(device):
        with pytest.raises(AttributeError, match="exists only for buffers on a CUDA device"):
            a.__cuda_array_interface__  # noqa: B018
    assert testing.exposures(a) == (0, 0)
    assert a.state == state
    np.testing.assert_array_equal(a.to_numpy(), expected(1))


def test_exposures_takes_a_live_buffer():
    with pytest.raises(TypeError):
        testing.exposures(42)
    buf = lazybuf.UnifiedBuffer(4, np.float32)
    buf.release()
    with pytest.raises(ValueError, match="released"):
        testing.exposures(buf)


# --- CuPy: a dropped array's kernels may still be pending ------------------------------------

FAKE_CUPY_SCENARIO = FAKE_CUPY + '''
import gc
import numpy as np

import lazybuf, lazybuf.testing
N = 16 * 1024
d = [d for d in lazybuf.get_accelerator().devices if d.backend == "cuda"][0]
lazybuf.trim()
lazybuf.set_memory_limit(d, lazybuf.memory_held(d) + N * 4)
a = lazybuf.UnifiedBuffer(N, np.float32, device=d)
a.copy_from(np.arange(N, dtype=np.float32))
b = lazybuf.UnifiedBuffer(N, np.float32, device=d)
b.copy_from(np.ones(N, np.float32))

def b_fits():
    try:
        b.sync_to_device()
        return True
    except MemoryError:
        return False

arr = a.device
assert isinstance(arr, ndarray), type(arr)
assert lazybuf.testing.exposures(a) == (1, 0)
assert not b_fits(), "evicted while its CuPy array lives"
before = len(orderings)
del arr
gc.collect()
lazybuf.testing.reclaim()  # the view the buffer kept, as spilling drops it when it needs room
# The array's owner, when it went, ordered lazybuf after CuPy's current stream: evictable now,
# with no call on the buffer in between (before: kept until one).
assert len(orderings) > before, "the owner's drop asked CuPy for its current stream"
assert lazybuf.testing.exposures(a) == (0, 0)
assert b_fits(), "kept after the CuPy array and lazybuf's ordering after CuPy were done"
assert lazybuf.spill_stats(d)["evictions"] == 1
assert a.state == lazybuf.BufferState.HOST_ONLY
np.testing.assert_array_equal(a.to_numpy(), np.arange(N, dtype=np.float32))
print("ok")
'''


def test_a_dropped_cupy_array_orders_lazybuf_after_cupy_and_leaves_the_copy_evictable():
    if not any(is_cuda(d) for d in _devices()):
        pytest.skip("no CUDA device (run with the CUDA driver test double)")
    # A child process: lazybuf probes for CuPy once per process, and this one is a stand-in.
    done = subprocess.run([sys.executable, "-c", FAKE_CUPY_SCENARIO], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_the_reclaim_hook_waits_for_the_interpreter_without_deadlock(device):
    """Eviction that needs the reclaim hook runs on a thread without the interpreter's lock
    (the copy is made with it released) and waits for it, while other threads hold it: busy
    Python code, and threads taking this and other buffers' views and locks."""
    if not evicts(device):
        pytest.skip(f"{device.selector} copies hold no device memory")
    limit_for(device, 1)
    a = holding(device, 1)
    kept = a.device  # kept by the buffer once dropped: only the reclaim hook can free a's room
    del kept
    gc.collect()
    others = [holding(device, 10 + i) for i in range(3)]
    stop = threading.Event()

    def busy():
        x = 0
        while not stop.is_set():
            x += 1  # pure Python: holds the interpreter between switches

    def viewing(buf):
        while not stop.is_set():
            buf.host_readonly  # noqa: B018 - takes the buffer's lock and the fields' lock
            buf.spillable  # noqa: B018

    threads = [threading.Thread(target=busy)] + [threading.Thread(target=viewing, args=(o,)) for o in others]
    for t in threads:
        t.start()
    try:
        results = []
        worker = threading.Thread(target=lambda: results.append(holding(device, 2).sync_to_device()))
        worker.start()
        worker.join(timeout=60)
        assert not worker.is_alive(), "the allocation that needed the reclaim hook did not finish"
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert results == [None]
    assert a.state == BufferState.HOST_ONLY
    np.testing.assert_array_equal(a.to_numpy(), expected(1))
