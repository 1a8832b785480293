"""Views never read freed memory, and a released buffer cannot be used.

The rule: everything lazybuf hands out that points into a buffer's memory (NumPy views,
memoryviews, DLPack capsules and the arrays made from them, PyOpenCL arrays, device-handle
views) co-owns that memory. Releasing or dropping the buffer gives up only the buffer's own
hold; the memory is freed, or returned to its pool, when the last such view is gone.

How it is observed: on an OpenCL device lazybuf reports the bytes this process holds
(``get_memory_info`` there is total minus held), so the tests see exactly when device
memory is freed; host views are also read after their buffer is gone, in a separate process
for the large case so that a use-after-free would show as a crash, not corrupt this run.
"""

import pickle
import weakref

import numpy as np
import pytest

from conftest import collect, run_python
import lazybuf
from lazybuf import BufferState, UnifiedBuffer

N = 4096  # float32 elements: 16 KiB, a real (not aliased) cl_mem on PoCL


def held(device) -> int:
    """Device bytes in use by buffers and views: what this process holds, less what the
    caching pool keeps for reuse (freed memory goes there first, by default)."""
    free, total = device.get_memory_info()
    assert device.memory_source == "total_minus_process_held"
    return total - free - device.cached_memory


def device_buffer(device) -> UnifiedBuffer:
    buf = UnifiedBuffer(N, np.float32, device=device)
    buf.host[:] = np.arange(N, dtype=np.float32)
    buf.sync_to_device()
    return buf


def test_a_host_view_outlives_its_buffer():
    buf = UnifiedBuffer(1000, np.int32)
    buf.copy_from(np.arange(1000))
    view = buf.host
    readonly = buf.host_readonly
    del buf
    collect()
    others = [UnifiedBuffer(1000, np.int32) for _ in range(50)]
    for other in others:
        other.fill(-1)
    np.testing.assert_array_equal(view, np.arange(1000))
    np.testing.assert_array_equal(readonly, np.arange(1000))


def test_a_large_view_outlives_its_buffer_in_a_fresh_process():
    result = run_python(
        """
        import gc
        import numpy as np
        from lazybuf import UnifiedBuffer
        buf = UnifiedBuffer(4 << 20, np.float32)   # 16 MiB: its own mmap, unmapped when freed
        buf.host[:] = 1.5
        view, exported = buf.host, np.from_dlpack(buf)
        del buf
        gc.collect()
        churn = [UnifiedBuffer(4 << 20, np.float32) for _ in range(4)]
        for c in churn:
            c.fill(0.0)
        assert float(view.sum()) == 1.5 * (4 << 20)
        assert float(exported[-1]) == 1.5
        print("ok")
        """
    )
    assert result.returncode == 0, f"rc={result.returncode}\n{result.stderr}"
    assert result.stdout.strip() == "ok"


@pytest.mark.parametrize("make_view", ["host", "host_readonly", "memoryview", "dlpack", "device_view"])
def test_memory_is_freed_when_the_last_view_is_gone(opencl_device, make_view):
    collect()
    before = held(opencl_device)
    buf = device_buffer(opencl_device)
    assert held(opencl_device) == before + 4 * N
    if make_view == "host":
        view = buf.host
    elif make_view == "host_readonly":
        view = buf.host_readonly
    elif make_view == "memoryview":
        view = memoryview(buf)
    elif make_view == "dlpack":
        view = np.from_dlpack(buf)
    else:
        view = buf.device  # a PyOpenCL array, or a handle view without PyOpenCL
    del buf
    collect()
    assert held(opencl_device) == before + 4 * N, "freed while a view exists"
    if make_view != "device_view":
        assert np.asarray(view)[5] == 5.0
    del view
    collect()
    assert held(opencl_device) == before


def test_a_pyopencl_array_outlives_its_buffer(pyopencl, opencl_device):
    collect()
    before = held(opencl_device)
    buf = device_buffer(opencl_device)
    array = buf.device
    del buf
    collect()
    np.testing.assert_array_equal(array.get(), np.arange(N, dtype=np.float32))
    sub = array[10:20]  # derived arrays share the same cl.Buffer, which holds the owner
    del array
    collect()
    assert held(opencl_device) == before + 4 * N
    np.testing.assert_array_equal(sub.get(), np.arange(10, 20, dtype=np.float32))
    del sub
    collect()
    assert held(opencl_device) == before


def test_release_with_live_views_keeps_the_memory_until_they_are_gone(opencl_device):
    collect()
    before = held(opencl_device)
    buf = device_buffer(opencl_device)
    view = buf.host_readonly
    buf.release()
    assert buf.released
    assert held(opencl_device) == before + 4 * N
    assert view[7] == 7.0
    del view
    collect()
    assert held(opencl_device) == before


def test_release_without_views_frees_at_once(opencl_device):
    collect()
    before = held(opencl_device)
    buf = device_buffer(opencl_device)
    buf.host  # cached inside the buffer only
    buf.release()
    assert held(opencl_device) == before


def test_array_interface_consumers_hold_the_buffer_object(opencl_device):
    """A consumer of `__array_interface__` keeps the buffer object, not a view: after a
    release the buffer keeps the memory until the buffer object itself is gone."""

    class Consumer:
        def __init__(self, obj):
            self.obj = obj
            self.array = np.asarray(type("Interface", (), {"__array_interface__": obj.__array_interface__})())

    collect()
    before = held(opencl_device)
    buf = device_buffer(opencl_device)
    consumer = Consumer(buf)
    buf.release()
    del buf
    collect()
    assert held(opencl_device) == before + 4 * N
    assert consumer.array[3] == 3.0
    del consumer
    collect()
    assert held(opencl_device) == before


def test_with_block_releases_and_views_survive():
    with UnifiedBuffer(10, np.int16) as buf:
        buf.fill(4)
        view = buf.host
    assert buf.released
    assert view.tolist() == [4] * 10


RELEASED_CALLS = {
    "host": lambda b: b.host,
    "host_readonly": lambda b: b.host_readonly,
    "device": lambda b: b.device,
    "device_writable": lambda b: b.device_writable,
    "metal": lambda b: b.metal,
    "state": lambda b: b.state,
    "is_pinned": lambda b: b.is_pinned,
    "sync_to_device": lambda b: b.sync_to_device(),
    "sync_to_host": lambda b: b.sync_to_host(),
    "mark_host_dirty": lambda b: b.mark_host_dirty(),
    "mark_device_dirty": lambda b: b.mark_device_dirty(),
    "mark_metal_dirty": lambda b: b.mark_metal_dirty(),
    "fill": lambda b: b.fill(1),
    "copy_from": lambda b: b.copy_from(np.zeros(3, np.float32)),
    "to_numpy": lambda b: b.to_numpy(),
    "transfer_stats": lambda b: b.transfer_stats(),
    "memoryview": lambda b: memoryview(b),
    "asarray": lambda b: b.__array__(),
    "array_interface": lambda b: b.__array_interface__,
    "dlpack": lambda b: b.__dlpack__(),
    "pickle": lambda b: pickle.dumps(b),
    "release_again": lambda b: b.release(),
    "with": lambda b: b.__enter__(),
}


@pytest.mark.parametrize("name", sorted(RELEASED_CALLS))
def test_every_use_after_release_is_a_clear_error(name):
    buf = UnifiedBuffer(3, np.float32)
    buf.fill(1.0)
    buf.release()
    with pytest.raises(ValueError, match="was released"):
        RELEASED_CALLS[name](buf)
    assert "RELEASED" in repr(buf)
    assert buf.shape == (3,)  # metadata stays readable


def test_failed_calls_change_nothing():
    buf = UnifiedBuffer(4, np.float32)
    buf.copy_from([1, 2, 3, 4])
    buf.sync_to_device()
    for bad in (lambda: buf.copy_from([1, 2]), lambda: buf.copy_from(["a"] * 4), lambda: buf.fill([1, 2])):
        with pytest.raises((ValueError, TypeError)):
            bad()
        assert buf.state == BufferState.SYNCHRONIZED
        assert buf.to_numpy().tolist() == [1, 2, 3, 4]


# --- a write through a host view made before the host went stale is never lost ---------

ZERO_COPY_BYTES = 4 << 20  # PoCL shares host memory with buffers of this size and above


@pytest.fixture(params=["host", "opencl"])
def any_device(request):
    if request.param == "opencl":
        return request.getfixturevalue("opencl_device")
    return request.getfixturevalue("host_device")


def _cuda_or_skip():
    from conftest import _need
    from lazybuf import get_accelerator

    devices = [d for d in get_accelerator().devices if d.backend == "cuda"]
    if not devices:
        _need("cuda", f"no CUDA device: {get_accelerator().backend_status}")
    return devices[0]


STALE_HOST = {
    "mark_device_dirty": lambda b: b.mark_device_dirty(),
    "device_writable": lambda b: b.device_writable,
}


@pytest.mark.parametrize("nbytes", [16 << 10, 2 * ZERO_COPY_BYTES], ids=["small", "zero-copy-size"])
@pytest.mark.parametrize("how", sorted(STALE_HOST))
def test_a_stale_host_view_becomes_read_only(any_device, nbytes, how):
    n = nbytes // 4
    buf = UnifiedBuffer(n, np.float32, device=any_device)
    view = buf.host
    view[:] = 1
    STALE_HOST[how](buf)
    assert buf.state == BufferState.DEVICE_DIRTY
    assert not view.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        view[0] = 5  # before: kept or lost depending on the device and the size
    fresh = buf.host
    assert fresh is not view and fresh.flags.writeable
    fresh[0] = 5
    data = buf.to_numpy()
    assert data[0] == 5 and (data[1:] == 1).all()


def test_a_host_view_of_a_released_pool_buffer_becomes_read_only(any_device):
    pool = lazybuf.MemoryPool(any_device)
    buf = pool.acquire(1000, np.float32)
    view = buf.host
    view[:] = 2
    pool.release(buf)
    with pytest.raises(ValueError, match="read-only"):
        view[0] = 5
    assert (view == 2).all()  # still readable


def test_a_stale_host_view_becomes_read_only_on_cuda():
    device = _cuda_or_skip()
    for stale in (lambda b: b.__cuda_array_interface__, lambda b: b.__dlpack__(), STALE_HOST["device_writable"]):
        buf = UnifiedBuffer(100, np.float32, device=device)
        view = buf.host
        view[:] = 1
        stale(buf)
        assert buf.state == BufferState.DEVICE_DIRTY
        with pytest.raises(ValueError, match="read-only"):
            view[0] = 5


def test_views_of_fresh_hosts_stay_writable_and_derived_views_are_not_tracked(any_device):
    buf = UnifiedBuffer(10, np.float32, device=any_device)
    view = buf.host
    buf.sync_to_device()
    buf.mark_host_dirty()
    assert view.flags.writeable  # the host never went stale
    part = view[2:5]  # derived from a handed-out view: not tracked (documented)
    buf.mark_device_dirty()
    assert not view.flags.writeable
    assert part.flags.writeable


# --- the garbage collector and weak references -----------------------------------------


def test_a_buffer_is_weak_referenceable():
    buf = UnifiedBuffer(10, np.float32)
    ref = weakref.ref(buf)
    assert ref() is buf
    del buf
    collect()
    assert ref() is None


def test_a_cycle_through_a_buffer_is_collected(pyopencl, opencl_device):
    buf = UnifiedBuffer(N, np.float32, device=opencl_device)
    buf.fill(1)
    array = buf.device  # a PyOpenCL array the buffer caches
    array.back = buf  # buffer -> array -> buffer
    ref = weakref.ref(buf)
    del buf, array
    collect()
    assert ref() is None

