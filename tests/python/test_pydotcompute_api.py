"""PyDotCompute 0.2.0's public API on lazybuf (docs/MIGRATING.md).

Each test is written from what PyDotCompute's own code does (pydotcompute/core/
unified_buffer.py, memory_pool.py, accelerator.py, exceptions.py; its unit tests'
expectations are kept where they hold), with the import changed to lazybuf, and checks the
data and the coherence effect too. Where lazybuf deliberately differs (the seeds win, or the
reference has a bug), the test says so and checks lazybuf's behaviour.

Buffer and pool tests run with the device under test as the *current* device, as PyDotCompute
code makes buffers without naming one: the host, PoCL's OpenCL device, and CUDA (the driver
test double in scripts/test-python.sh; skipped without CUDA unless LAZYBUF_REQUIRE names it).
"""

import asyncio
import builtins
import ctypes

import numpy as np
import pytest

import lazybuf
from conftest import _need, collect
from lazybuf import (
    Accelerator,
    BackendError,
    BackendNotAvailableError,
    BackendUnavailableError,
    BufferNotAllocatedError,
    BufferState,
    BufferSyncError,
    CoherenceError,
    CUDAError,
    CUDARuntimeError,
    Device,
    DeviceProperties,
    DeviceType,
    MemoryPool,
    MetalError,
    MetalUnavailableError,
    PoolStatistics,
    PyDotComputeError,
    UnifiedBuffer,
    configure_memory_pool,
    cuda_available,
    get_accelerator,
    get_memory_pool,
    metal_available,
)

N = 4096  # float32 elements: 16 KiB, a real (not aliased) copy on PoCL


@pytest.fixture(params=["host", "opencl", "cuda"])
def device(request) -> Device:
    if request.param == "host":
        return request.getfixturevalue("host_device")
    if request.param == "opencl":
        return request.getfixturevalue("opencl_device")
    cuda = [d for d in get_accelerator().devices if d.backend == "cuda"]
    if not cuda:
        _need("cuda", f"no CUDA device: {get_accelerator().backend_status}")
    return cuda[0]


@pytest.fixture
def current(device) -> Device:
    """`device` as the current device: buffers made without `device=` go there (conftest puts
    the host back after the test)."""
    get_accelerator().select_device(device)
    return device


@pytest.fixture
def caching_restored():
    """Puts caching by default back as it was (enable()/disable() change it process-wide)."""
    before = lazybuf.caching()
    yield
    lazybuf.set_caching(before)


def no_copies(stats: dict) -> dict:
    return {k: v for k, v in stats.items() if k.endswith("_copies")}


# --- UnifiedBuffer ----------------------------------------------------------------------------


def test_creation(current):
    buf = UnifiedBuffer((100,), dtype=np.float32)
    assert buf.shape == (100,) and buf.dtype == np.float32
    assert buf.state == BufferState.UNINITIALIZED
    assert not buf.is_allocated
    assert UnifiedBuffer(50).shape == (50,)  # an int shape is a 1-tuple
    assert buf.device_handle == current


def test_allocate_makes_both_copies_hold_the_data(current):
    buf = UnifiedBuffer((100,), dtype=np.float32)
    assert buf.allocate() is buf  # chaining
    assert buf.is_allocated
    # Both copies exist and hold the same bytes: PyDotCompute said SYNCHRONIZED over two
    # uninitialised arrays; lazybuf's are zeros (a read of a buffer with no data sees zeros).
    assert buf.state == BufferState.SYNCHRONIZED
    before = no_copies(buf.transfer_stats())
    buf.sync_to_device()
    buf.sync_to_host()
    assert no_copies(buf.transfer_stats()) == before, "allocate() left nothing to copy"
    np.testing.assert_array_equal(buf.to_numpy(), np.zeros(100, np.float32))
    assert buf.host.shape == (100,)


def test_allocate_host_only_and_device_only(current):
    host_only = UnifiedBuffer(100).allocate(host=True, device=False)
    assert host_only.state == BufferState.HOST_ONLY and host_only.is_allocated
    host_only.sync_to_device()
    assert host_only.state == BufferState.SYNCHRONIZED

    device_only = UnifiedBuffer(100).allocate(host=False)
    assert device_only.state == BufferState.DEVICE_ONLY and device_only.is_allocated
    np.testing.assert_array_equal(device_only.to_numpy(), np.zeros(100, np.float32))
    assert device_only.state == BufferState.DEVICE_ONLY  # to_numpy() reads the device copy


def test_allocate_keeps_the_data(current):
    # PyDotCompute's allocate() replaced its arrays, losing the data (its bug 15).
    buf = UnifiedBuffer(N).fill(3.0)
    buf.allocate()
    assert buf.state == BufferState.SYNCHRONIZED
    buf.mark_device_dirty()  # the device copy is what the host reads back now
    np.testing.assert_array_equal(buf.to_numpy(), np.full(N, 3.0, np.float32))


def test_allocate_of_reused_pool_memory_holds_zeros(current):
    pool = MemoryPool(current)
    first = pool.acquire(N, np.float32)
    first.fill(5.0)
    first.sync_to_device()
    pool.release(first)
    again = pool.acquire(N, np.float32)
    again.allocate()
    assert pool.get_stats().hits >= 1  # the same memory, reused
    again.mark_device_dirty()
    np.testing.assert_array_equal(again.to_numpy(), np.zeros(N, np.float32))


def test_allocate_bad_arguments(current):
    buf = UnifiedBuffer(4)
    with pytest.raises(ValueError, match="expected host=True, device=True or both"):
        buf.allocate(host=False, device=False)
    with pytest.raises(TypeError):
        buf.allocate(host=1)
    with pytest.raises(TypeError):
        buf.allocate(True)  # keyword-only, as in PyDotCompute
    assert buf.state == BufferState.UNINITIALIZED and not buf.is_allocated


def test_free_returns_the_memory_and_the_buffer_stays_usable(current):
    pool = MemoryPool(current)
    buf = pool.acquire(N, np.float32)
    buf.host[:] = 1.0
    buf.sync_to_device()
    held = pool.get_stats()
    assert held.used_bytes >= buf.nbytes and held.free_bytes == 0
    assert buf.free() is None
    assert not buf.is_allocated and buf.state == BufferState.UNINITIALIZED
    stats = pool.get_stats()
    assert stats.used_bytes == 0 and stats.free_bytes == held.used_bytes  # back in the pool
    buf.host[:] = 2.0  # usable: takes memory again (the pool's, reused)
    assert buf.is_allocated and buf.state == BufferState.HOST_ONLY
    assert pool.get_stats().hits >= 1
    np.testing.assert_array_equal(buf.to_numpy(), np.full(N, 2.0, np.float32))
    pool.release(buf)  # still the pool's buffer
    assert pool.get_stats().used_bytes == 0


def test_free_keeps_earlier_views_alive_and_read_only(current):
    pool = MemoryPool(current)
    buf = pool.acquire(N, np.float32)
    view = buf.host
    view[:] = 7.0
    buf.free()
    assert not view.flags.writeable  # a write through it would be lost: it raises instead
    with pytest.raises(ValueError):
        view[0] = 1.0
    np.testing.assert_array_equal(view, np.full(N, 7.0, np.float32))  # the old memory, alive
    assert pool.get_stats().used_bytes > 0
    buf.fill(1.0)  # new memory
    np.testing.assert_array_equal(view, np.full(N, 7.0, np.float32))  # detached from the buffer
    both = pool.get_stats().used_bytes
    del view
    collect()
    assert buf.nbytes <= pool.get_stats().used_bytes < both  # the old memory went back


def test_free_of_a_default_buffer(current):
    buf = UnifiedBuffer(N)
    buf.copy_from(np.arange(N, dtype=np.float32))
    buf.free()
    assert not buf.is_allocated
    np.testing.assert_array_equal(buf.to_numpy(), np.zeros(N, np.float32))  # the data is gone
    buf.free()  # freeing a buffer that holds nothing is fine
    buf.release()
    with pytest.raises(ValueError, match="released"):
        buf.free()
    with pytest.raises(ValueError, match="released"):
        buf.is_allocated


def test_host_access_needs_no_allocate(current):
    # PyDotCompute raised BufferNotAllocatedError here; the seeds write `buf.host[:] = ...` on
    # a new buffer, and the seeds win.
    buf = UnifiedBuffer(100)
    buf.host[:] = np.arange(100, dtype=np.float32)
    assert buf.state == BufferState.HOST_ONLY
    np.testing.assert_array_equal(buf.host, np.arange(100))
    buf.device  # noqa: B018 - a device read, no BufferNotAllocatedError either
    assert buf.state == BufferState.SYNCHRONIZED


def test_dirty_state_tracking(current):
    buf = UnifiedBuffer(100).allocate()
    buf.mark_host_dirty()
    assert buf.state == BufferState.HOST_DIRTY
    buf.mark_device_dirty()
    assert buf.state == BufferState.DEVICE_DIRTY


def test_mark_device_dirty_without_a_device_copy_keeps_the_host_data(current):
    # PyDotCompute (with CUDA) then allocated an uninitialised device array and copied it over
    # the host data at the next `.host`.
    buf = UnifiedBuffer(N)
    buf.host[:] = 5.0  # HOST_ONLY: no device copy
    buf.mark_device_dirty()  # uploads first, then the host copy is stale
    assert buf.state == BufferState.DEVICE_DIRTY
    np.testing.assert_array_equal(buf.host, np.full(N, 5.0, np.float32))


def test_copy_from_and_copy_to(current):
    data = np.arange(100, dtype=np.float32)
    buf = UnifiedBuffer(100).allocate()
    buf.copy_from(data)
    assert buf.state == BufferState.HOST_DIRTY
    buf.mark_device_dirty()  # the device copy is current, the host copy stale
    dest = np.zeros(100, dtype=np.float32)
    assert buf.copy_to(dest) is None
    np.testing.assert_array_equal(dest, data)
    # One copy, straight from the device copy into dest: the host copy stays stale.
    assert buf.state == BufferState.DEVICE_DIRTY
    wide = np.zeros(100, dtype=np.float64)  # same_kind casts, as np.copyto does
    buf.copy_to(wide)  # a cast reads the host copy, which is updated first
    np.testing.assert_array_equal(wide, data)
    assert buf.state == BufferState.SYNCHRONIZED


@pytest.mark.parametrize(
    "out,error,match",
    [
        ([0.0] * 100, TypeError, "expected a NumPy array of shape \\(100,\\)"),
        (np.zeros(99, np.float32), ValueError, "expected an array of shape \\(100,\\), got shape \\(99,\\)"),
        (np.zeros((10, 10), np.float32), ValueError, "got shape \\(10, 10\\)"),
        (np.zeros(100, np.int32), TypeError, "cannot cast float32 to int32"),
    ],
    ids=["list", "short", "2-d", "int32"],
)
def test_copy_to_bad_outputs(current, out, error, match):
    buf = UnifiedBuffer(100).fill(2.0)
    buf.sync_to_device()
    before = out.copy() if isinstance(out, np.ndarray) else list(out)
    with pytest.raises(error, match=match):
        buf.copy_to(out)
    np.testing.assert_array_equal(out, before)  # untouched
    assert buf.state == BufferState.SYNCHRONIZED


def test_copy_to_a_strided_array(current):
    buf = UnifiedBuffer(100).fill(2.0)
    out = np.zeros(200, np.float32)
    buf.copy_to(out[::2])
    np.testing.assert_array_equal(out[::2], np.full(100, 2.0))
    assert not out[1::2].any()


def test_copy_to_a_read_only_array(current):
    buf = UnifiedBuffer(4).fill(1.0)
    out = np.zeros(4, np.float32)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="expected a writable array"):
        buf.copy_to(out)
    assert not out.any()


def test_zeros_and_fill_chain_and_fill_where_the_data_is(current):
    buf = UnifiedBuffer(100)
    assert buf.zeros() is buf  # allocates, as in PyDotCompute
    assert buf.is_allocated
    np.testing.assert_array_equal(buf.host, np.zeros(100))
    assert buf.fill(42) is buf
    np.testing.assert_array_equal(buf.host, np.full(100, 42.0))
    # PyDotCompute's fill()/zeros() did nothing on a device-only buffer (its bug 14).
    device_only = UnifiedBuffer(100).allocate(host=False)
    device_only.fill(7.0)
    assert device_only.state == BufferState.DEVICE_ONLY  # filled on the device
    np.testing.assert_array_equal(device_only.to_numpy(), np.full(100, 7.0))
    device_only.mark_device_dirty()
    device_only.zeros()
    assert device_only.state == BufferState.DEVICE_ONLY  # to_numpy() made no host copy
    np.testing.assert_array_equal(device_only.to_numpy(), np.zeros(100))


def test_fill_auto_allocates(current):
    buf = UnifiedBuffer(10, dtype=np.int32)
    buf.fill(7)
    assert buf.is_allocated and buf.host.tolist() == [7] * 10


def test_size_nbytes_len(current):
    buf = UnifiedBuffer((10, 20), dtype=np.float32)
    assert (buf.size, buf.nbytes, len(buf)) == (200, 800, 10)
    cube = UnifiedBuffer((4, 5, 6), dtype=np.float64)
    assert (cube.size, cube.nbytes, len(cube)) == (120, 960, 4)


def test_getitem_is_a_host_read_and_setitem_a_host_write(current):
    buf = UnifiedBuffer((4, 3), np.float32).allocate()
    buf[1] = [1.0, 2.0, 3.0]
    assert buf.state == BufferState.HOST_DIRTY  # setitem: a host write
    np.testing.assert_array_equal(buf[1], [1.0, 2.0, 3.0])
    assert buf[1, 2] == 3.0
    buf.sync_to_device()
    buf.mark_device_dirty()
    buf.fill(9.0)  # on the device; the host copy is stale
    assert buf.state == BufferState.DEVICE_DIRTY
    assert buf[2, 1] == 9.0  # getitem syncs from the device first: a host read
    assert buf.state == BufferState.SYNCHRONIZED
    row = buf[0]
    assert not row.flags.writeable  # a read: write through .host, or buf[...] = ...
    with pytest.raises(ValueError):
        row[0] = 1.0
    buf[0, :] = 5  # setitem writes the host, then the device copy is stale
    assert buf.state == BufferState.HOST_DIRTY
    buf.sync_to_device()
    buf.mark_device_dirty()
    np.testing.assert_array_equal(buf.to_numpy()[0], [5.0, 5.0, 5.0])


def test_getitem_setitem_bad_keys_and_values(current):
    buf = UnifiedBuffer((4, 3), np.float32).fill(1.0)
    with pytest.raises(IndexError):
        buf[4]
    with pytest.raises(ValueError):
        buf[0] = np.ones(5)  # NumPy's broadcast error, as in PyDotCompute
    with pytest.raises(IndexError):
        buf[9] = 1.0
    np.testing.assert_array_equal(buf.to_numpy(), np.ones((4, 3)))  # nothing lost


def test_generic_alias_in_annotations(current):
    # PyDotCompute's UnifiedBuffer was Generic[T]: annotations subscript it at run time.
    def scale(buf: UnifiedBuffer[np.float32]) -> UnifiedBuffer[np.float32]:
        return buf

    alias = UnifiedBuffer[np.float32]
    assert alias.__origin__ is UnifiedBuffer and alias.__args__ == (np.float32,)
    assert scale(UnifiedBuffer(3)).shape == (3,)


def test_repr(current):
    text = repr(UnifiedBuffer((10,), dtype=np.float32))
    assert "UnifiedBuffer" in text and "10" in text and "float32" in text


def test_synchronize_makes_every_copy_current(current):
    buf = UnifiedBuffer(N).allocate()
    buf.host[:] = 3.0
    assert buf.state == BufferState.HOST_DIRTY
    buf.synchronize()
    assert buf.state == BufferState.SYNCHRONIZED
    buf.mark_device_dirty()  # nothing to upload: the device copy already holds the 3s
    np.testing.assert_array_equal(buf.to_numpy(), np.full(N, 3.0, np.float32))

    buf.mark_device_dirty()
    buf.fill(4.0)  # on the device
    buf.synchronize()
    assert buf.state == BufferState.SYNCHRONIZED
    before = no_copies(buf.transfer_stats())
    np.testing.assert_array_equal(buf.host_readonly, np.full(N, 4.0, np.float32))
    assert no_copies(buf.transfer_stats()) == before


def test_synchronize_makes_no_new_copies(current):
    fresh = UnifiedBuffer(N)
    fresh.synchronize()
    assert fresh.state == BufferState.UNINITIALIZED and not fresh.is_allocated
    host_only = UnifiedBuffer(N)
    host_only.host[:] = 1.0
    host_only.synchronize()
    assert host_only.state == BufferState.HOST_ONLY
    device_only = UnifiedBuffer(N).allocate(host=False)
    device_only.synchronize()
    assert device_only.state == BufferState.DEVICE_ONLY


def test_synchronize_waits_for_a_sync_in_flight(current):
    buf = UnifiedBuffer(N).fill(6.0)
    buf.sync_to_device_async()
    buf.synchronize()
    assert buf.state == BufferState.SYNCHRONIZED
    buf.mark_device_dirty()
    np.testing.assert_array_equal(buf.to_numpy(), np.full(N, 6.0, np.float32))


def test_ensure_on_device_and_host(current):
    buf = UnifiedBuffer(N).allocate()
    buf.host[:] = 2.0
    coroutine = buf.ensure_on_device()
    assert asyncio.iscoroutine(coroutine)
    asyncio.run(coroutine)
    assert buf.state == BufferState.SYNCHRONIZED
    buf.mark_device_dirty()
    buf.fill(5.0)  # on the device

    async def main():
        await asyncio.create_task(buf.ensure_on_host())  # a real coroutine: tasks take it

    asyncio.run(main())
    assert buf.state == BufferState.SYNCHRONIZED
    np.testing.assert_array_equal(buf.host_readonly, np.full(N, 5.0, np.float32))


def test_an_ensure_never_awaited_does_nothing(current):
    buf = UnifiedBuffer(N).allocate()
    buf.host[:] = 1.0
    buf.ensure_on_device().close()
    assert buf.state == BufferState.HOST_DIRTY


def test_ensure_on_a_released_buffer_raises_when_awaited(current):
    buf = UnifiedBuffer(N)
    buf.release()
    with pytest.raises(ValueError, match="released"):
        asyncio.run(buf.ensure_on_device())
    with pytest.raises(ValueError, match="released"):
        asyncio.run(buf.ensure_on_host())


def test_metal_is_not_available(current):
    if lazybuf.get_accelerator().is_available("metal"):
        pytest.skip("this machine has a Metal device")
    buf = UnifiedBuffer(100).fill(1.0)
    with pytest.raises(MetalError) as err:
        buf.metal  # noqa: B018
    assert isinstance(err.value, BackendUnavailableError) and isinstance(err.value, RuntimeError)
    # Why: no Metal backend in this build, or (with wgpu) no device that runs on Metal, or no
    # wgpu adapter at all (a machine without a Vulkan loader: a GPU machine, 2026-11-27).
    assert err.value.backend_name == "metal"
    reasons = ("no Metal backend", "runs on metal", "wgpu is not available")
    assert any(r in err.value.reason for r in reasons), err.value.reason
    with pytest.raises(MetalUnavailableError):
        buf.mark_metal_dirty()  # no Metal copy to mark; PyDotCompute set DEVICE_DIRTY anyway
    assert buf.state == BufferState.HOST_ONLY


def test_pinned_flag(current):
    buf = UnifiedBuffer(100, pinned=True)
    assert buf.pinned
    buf.allocate()
    assert buf.is_pinned  # pinned for real, never silently pageable


@pytest.mark.parametrize(
    "dtype", [np.float32, np.float64, np.int32, np.int64, np.uint8, np.complex64, np.complex128]
)
def test_various_dtypes(current, dtype):
    buf = UnifiedBuffer(100, dtype=dtype).allocate()
    assert buf.dtype == np.dtype(dtype) and buf.host.dtype == np.dtype(dtype)
    data = np.arange(100).astype(dtype)
    if np.dtype(dtype).kind == "c":
        data = data + 1j * np.arange(100)[::-1]
    buf.copy_from(data)
    buf.sync_to_device()
    buf.mark_device_dirty()
    np.testing.assert_array_equal(buf.to_numpy(), data)


def test_complex_fill_on_the_device(current):
    buf = UnifiedBuffer(N, np.complex128).allocate(host=False)
    buf.fill(1.5 - 2j)  # a 16-byte pattern, on the device
    assert buf.state == BufferState.DEVICE_ONLY
    np.testing.assert_array_equal(buf.to_numpy(), np.full(N, 1.5 - 2j))


# --- exceptions -------------------------------------------------------------------------------


def test_exception_hierarchy():
    assert issubclass(BufferNotAllocatedError, lazybuf.BufferError)
    assert issubclass(BufferSyncError, lazybuf.BufferError)
    assert issubclass(lazybuf.BufferError, PyDotComputeError)
    assert lazybuf.BufferError is not builtins.BufferError
    assert not issubclass(lazybuf.BufferError, builtins.BufferError)  # as in PyDotCompute
    assert issubclass(BackendNotAvailableError, BackendError)
    assert issubclass(CUDAError, BackendError) and issubclass(MetalError, BackendError)
    assert issubclass(BackendError, PyDotComputeError)
    # lazybuf's own, where the meaning matches:
    assert issubclass(BackendUnavailableError, BackendNotAvailableError)
    assert issubclass(BackendUnavailableError, RuntimeError)
    assert issubclass(MetalUnavailableError, BackendUnavailableError)
    assert issubclass(MetalUnavailableError, MetalError)
    assert issubclass(CUDARuntimeError, CUDAError) and issubclass(CUDARuntimeError, RuntimeError)
    assert issubclass(CoherenceError, lazybuf.BufferError) and issubclass(CoherenceError, RuntimeError)
    assert lazybuf.exceptions.BufferError is lazybuf.BufferError


def test_exception_constructors_as_in_pydotcompute():
    err = BufferNotAllocatedError()
    assert str(err) == "Buffer has not been allocated. Call allocate() first."
    cause = OSError("link down")
    sync = BufferSyncError("host->device", cause)
    assert (sync.direction, sync.cause) == ("host->device", cause)
    assert str(sync) == "Failed to sync buffer host->device: link down"
    missing = BackendNotAvailableError("cuda", "no driver")
    assert (missing.backend_name, missing.reason) == ("cuda", "no driver")
    assert str(missing) == "Backend 'cuda' is not available: no driver"
    message = "OpenCL is not available: no platform"
    ours = BackendUnavailableError(message, "opencl", "no platform")
    assert (str(ours), ours.backend_name, ours.reason) == (message, "opencl", "no platform")


def test_star_import_does_not_shadow_the_builtin_buffer_error():
    namespace: dict = {}
    exec("from lazybuf import *", namespace)
    assert "BufferError" not in namespace
    assert "BufferNotAllocatedError" in namespace and "PyDotComputeError" in namespace


def _cuda_double_hook(name: str):
    try:
        lib = ctypes.CDLL("libcuda.so.1", mode=getattr(ctypes, "RTLD_NOLOAD", 4))
        hook = getattr(lib, name)
    except (OSError, AttributeError):
        return None
    hook.argtypes = [ctypes.c_longlong]
    return hook


def test_a_failed_cuda_call_is_a_cuda_error(device):
    if device.backend != "cuda":
        pytest.skip("a CUDA driver call")
    fail_now = _cuda_double_hook("lazybuf_cuda_double_fail_copy_now")
    if fail_now is None:
        pytest.skip("a real CUDA driver: its calls cannot be made to fail from a test")
    buf = UnifiedBuffer(N, np.float32, device=device)
    buf.host[:] = 1.0
    fail_now(1)
    try:
        with pytest.raises(CUDAError) as err:
            buf.sync_to_device()
    finally:
        fail_now(0)
    assert isinstance(err.value, CUDARuntimeError) and isinstance(err.value, RuntimeError)
    assert "CUDA" in str(err.value)
    assert buf.state == BufferState.HOST_ONLY  # nothing changed
    buf.sync_to_device()
    buf.mark_device_dirty()
    np.testing.assert_array_equal(buf.to_numpy(), np.full(N, 1.0, np.float32))


# --- memory pool ------------------------------------------------------------------------------


def test_pool_statistics():
    stats = PoolStatistics(used_bytes=1000, total_bytes=4000, n_free_blocks=5)
    assert (stats.used_bytes, stats.total_bytes, stats.n_free_blocks) == (1000, 4000, 5)
    assert stats.free_bytes == 3000 and stats.utilization == 0.25
    assert (stats.hits, stats.misses) == (0, 0)
    assert PoolStatistics(0, 0, 0).utilization == 0.0
    assert PoolStatistics(1024 * 1024, 2 * 1024 * 1024, 0).used_mb == 1.0
    assert PoolStatistics(1024 * 1024, 2 * 1024 * 1024, 0).total_mb == 2.0
    large = PoolStatistics(used_bytes=8 << 30, total_bytes=16 << 30, n_free_blocks=1)
    assert large.utilization == 0.5 and large.used_mb == 8192.0 and large.total_mb == 16384.0
    full = PoolStatistics(used_bytes=4096, total_bytes=4096, n_free_blocks=0)
    assert full.utilization == 1.0 and full.free_bytes == 0


def test_get_memory_pool_is_one_object(current, host_device):
    pool = get_memory_pool()
    assert get_memory_pool() is pool  # identity, not only shared state
    assert isinstance(pool, MemoryPool)
    assert MemoryPool() is pool  # PyDotCompute's MemoryPool() was its singleton
    assert get_memory_pool(current) is pool and pool.device == current
    if current != host_device:
        assert get_memory_pool(host_device) is not pool  # one pool per device
    assert MemoryPool(current) is not pool  # with arguments: a new, private pool


def test_get_stats_counts_what_the_pool_holds(current):
    pool = MemoryPool(current)
    assert pool.get_stats() == PoolStatistics(0, 0, 0, 0, 0)
    buf = pool.acquire(N, np.float32)
    buf.host[:] = 1.0
    buf.sync_to_device()
    stats = pool.get_stats()
    assert isinstance(stats, PoolStatistics)
    assert stats.used_bytes >= buf.nbytes and stats.total_bytes == stats.used_bytes
    assert stats.misses >= 1 and stats.hits == 0 and stats.utilization == 1.0
    pool.release(buf)
    cached = pool.get_stats()
    assert cached.used_bytes == 0 and cached.free_bytes == stats.used_bytes
    assert cached.n_free_blocks >= 1 and cached.utilization == 0.0
    again = pool.acquire(N, np.float32)
    again.host[:] = 2.0
    assert pool.get_stats().hits >= 1  # the same memory, reused
    assert pool.get_stats().used_mb == pool.get_stats().used_bytes / 2**20


def test_get_pinned_stats_counts_pinned_memory_only(current):
    pool = MemoryPool(current)
    pageable = pool.acquire(N, np.float32)
    pageable.host[:] = 1.0
    assert pool.get_pinned_stats() == PoolStatistics(0, 0, 0, 0, 0)
    pinned = pool.acquire(N, np.float32, pinned=True)
    pinned.host[:] = 1.0
    assert pinned.is_pinned
    stats = pool.get_pinned_stats()
    assert stats.used_bytes >= pinned.nbytes and stats.misses == 1 and stats.hits == 0
    assert pool.get_stats().used_bytes >= stats.used_bytes + pageable.nbytes
    pool.release(pinned)
    released = pool.get_pinned_stats()
    assert released.used_bytes == 0 and released.n_free_blocks == 1
    assert released.free_bytes == stats.used_bytes


def test_enable_disable_route_default_buffers_through_the_pool(current, caching_restored):
    pool = get_memory_pool()
    assert pool.enabled is lazybuf.caching()
    pool.disable()
    assert not pool.enabled and not lazybuf.caching()
    collect()  # earlier tests' buffers give their memory back now, not during the test
    before = pool.get_stats()
    direct = UnifiedBuffer(N)
    direct.host[:] = 1.0
    assert pool.get_stats().used_bytes == before.used_bytes  # not from the pool
    pool.enable()
    assert pool.enabled and lazybuf.caching()
    pooled = UnifiedBuffer(N)
    pooled.host[:] = 1.0
    assert pool.get_stats().used_bytes >= before.used_bytes + pooled.nbytes
    assert "enabled=True" in repr(pool) and "MemoryPool" in repr(pool)


def test_a_private_pool_is_never_enabled(current, caching_restored):
    pool = MemoryPool(current)
    assert not pool.enabled
    with pytest.raises(ValueError, match="private pool"):
        pool.enable()
    before = lazybuf.caching()
    pool.disable()  # nothing to do: it never serves buffers made without a pool
    assert lazybuf.caching() is before and not pool.enabled
    assert "enabled=False" in repr(pool)


def test_free_all_blocks(current):
    pool = MemoryPool(current)
    buf = pool.acquire(N, np.float32)
    buf.host[:] = 1.0
    pool.release(buf)
    cached = pool.get_stats().free_bytes
    assert cached > 0
    assert pool.free_all_blocks() == cached
    stats = pool.get_stats()
    assert stats.free_bytes == 0 and stats.n_free_blocks == 0 and stats.total_bytes == 0
    again = pool.acquire(N, np.float32)
    again.host[:] = 1.0
    pool.release(again)
    assert pool.free_all_free() > 0  # PyDotCompute's other name for it
    assert pool.get_stats().free_bytes == 0


def test_set_limit_caps_what_the_pool_holds(current):
    pool = MemoryPool(current)
    assert pool.limit is None
    pool.set_limit(1)  # MiB
    assert pool.limit == 1 << 20
    big = pool.acquire(3 << 18, np.float32)  # 3 MiB
    with pytest.raises(MemoryError, match="limit is 1048576 bytes"):
        big.host[:] = 1.0
    assert big.state == BufferState.UNINITIALIZED and not big.is_allocated
    small = pool.acquire(N, np.float32)
    small.host[:] = 1.0  # 16 KiB fits
    pool.set_limit(None)
    assert pool.limit is None
    big.host[:] = 2.0
    np.testing.assert_array_equal(big.to_numpy()[:3], [2.0, 2.0, 2.0])


def test_set_limit_on_the_shared_pool_limits_default_buffers(current):
    pool = get_memory_pool()
    pool.free_all_blocks()
    try:
        pool.set_limit(0)
        buf = UnifiedBuffer(N)
        with pytest.raises(MemoryError, match="limit"):
            buf.host[:] = 1.0
    finally:
        pool.set_limit(None)
    buf.host[:] = 1.0


@pytest.mark.parametrize(
    "size,error,match",
    [
        (-1, ValueError, "expected a whole number of MiB"),
        (1.5, TypeError, "got float 1.5"),
        (True, TypeError, "got the bool True"),
        ("10", TypeError, "got str '10'"),
        (2**60, ValueError, "fits in 64 bits"),
    ],
)
def test_set_limit_bad_sizes(size, error, match):
    pool = MemoryPool("host")
    pool.set_limit(5)
    with pytest.raises(error, match=match):
        pool.set_limit(size)
    assert pool.limit == 5 << 20  # unchanged


def test_configure_memory_pool(current, caching_restored):
    pool = configure_memory_pool()
    assert pool is get_memory_pool() and pool.enabled
    try:
        assert configure_memory_pool(max_size_mb=128) is pool and pool.limit == 128 << 20
        assert configure_memory_pool(enable=False) is pool and not pool.enabled
        assert pool.limit == 128 << 20  # max_size_mb=None leaves the limit as it was
        assert configure_memory_pool(64, 256, True).enabled  # positional, as PyDotCompute's
    finally:
        pool.set_limit(None)


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"initial_size_mb": -1}, ValueError, "initial_size_mb: expected a size of 0 MiB or more"),
        ({"initial_size_mb": "64"}, TypeError, "initial_size_mb: expected a whole number of MiB"),
        ({"max_size_mb": 1.5}, TypeError, "max_size_mb: expected a whole number of MiB or None"),
        ({"max_size_mb": -2}, ValueError, "max_size_mb: expected a size of 0 MiB or more"),
        ({"enable": "yes"}, TypeError, "expected enable=True or False"),
    ],
)
def test_configure_memory_pool_bad_arguments(kwargs, error, match, caching_restored):
    pool = get_memory_pool()
    before = (pool.limit, pool.enabled)
    with pytest.raises(error, match=match):
        configure_memory_pool(**kwargs)
    assert (pool.limit, pool.enabled) == before  # nothing changed


# --- accelerator ------------------------------------------------------------------------------


def test_device_type():
    assert {DeviceType.CPU, DeviceType.CUDA, DeviceType.METAL} <= set(DeviceType)
    assert {DeviceType.OPENCL, DeviceType.WGPU} <= set(DeviceType)  # lazybuf's other backends
    assert str(DeviceType.CUDA) == "CUDA"
    assert DeviceType("wgpu") is DeviceType.WGPU and DeviceType("host") is DeviceType.CPU
    for bogus in ("nonsense", "vulkan", "", 1):
        with pytest.raises(ValueError):
            DeviceType(bogus)


def test_every_device_has_a_device_type():
    """Every device every backend reports (wgpu's, and the test suites' loopback devices)
    maps to a DeviceType: the backend's own, METAL for a wgpu device on Metal."""
    acc = get_accelerator()
    seen = set()
    for device in acc.devices:
        kind = device.device_type
        assert isinstance(kind, DeviceType), (device, kind)
        if kind is DeviceType.METAL:
            assert device.backend == "wgpu" and metal_available()
        else:
            assert kind.value == device.backend, (device, kind)
        assert DeviceType(kind.value) is kind and str(kind) == kind.name
        assert kind.name == ("CPU" if kind is DeviceType.CPU else kind.value.upper())
        assert device.device_type is kind  # the same member on every read
        seen.add(kind)
    named = {"host": DeviceType.CPU, "opencl": DeviceType.OPENCL, "cuda": DeviceType.CUDA, "wgpu": DeviceType.WGPU}
    for device in acc.devices:
        if device.backend in named and device.device_type is not DeviceType.METAL:
            assert device.device_type is named[device.backend]
    assert DeviceType.CPU in seen  # the host is always listed


def test_device_properties(device):
    assert isinstance(device, DeviceProperties)  # PyDotCompute's name for what a device reports
    assert device.device_type == DeviceType(device.backend)
    kinds = {"host": DeviceType.CPU, "opencl": DeviceType.OPENCL, "cuda": DeviceType.CUDA}
    assert device.device_type == kinds[device.backend]
    assert isinstance(device.name, str) and device.name
    assert device.total_memory > 0  # PyDotCompute said 0 for the CPU
    assert device.total_memory_gb == device.total_memory / 2**30
    assert device.is_available
    assert get_accelerator().get_device(device.device_id) == device
    if hasattr(lazybuf, "testing"):  # a device of its own, listed nowhere
        assert lazybuf.testing.FaultyDevice(device).device_id is None
    if device.backend == "cuda":
        major, minor = device.compute_capability
        assert device.compute_capability_str == f"{major}.{minor}"
    else:
        assert device.compute_capability is None and device.compute_capability_str == "N/A"


def test_accelerator_is_one_object():
    acc = get_accelerator()
    assert get_accelerator() is acc and Accelerator() is acc
    assert isinstance(acc, Accelerator)


def test_devices_and_current_device():
    acc = get_accelerator()
    assert acc.device_count >= 1 and acc.device_count == len(acc.devices)
    devices = acc.devices
    devices.clear()  # a copy
    assert len(acc.devices) == acc.device_count
    assert isinstance(acc.current_device, DeviceProperties) and acc.current_device.is_available
    assert [d.device_id for d in acc.devices] == list(range(acc.device_count))


def test_get_device_and_set_device(device):
    acc = get_accelerator()
    assert acc.get_device(0) == acc.devices[0]
    assert acc.set_device(device.device_id) is None
    assert acc.current_device == device
    assert UnifiedBuffer(3).device_handle == device  # new buffers go there


@pytest.mark.parametrize(
    "device_id,error,match",
    [
        (-1, ValueError, "expected a device_id, an index 0 <= device_id <"),
        (1000, ValueError, "got 1000"),
        (True, TypeError, "got the bool True"),
        ("0", TypeError, "got str '0'"),
        (0.0, TypeError, "got float 0.0"),
    ],
)
def test_get_device_and_set_device_bad_ids(device_id, error, match):
    acc = get_accelerator()
    before = acc.current_device
    with pytest.raises(error, match=match):
        acc.get_device(device_id)
    with pytest.raises(error, match=match):
        acc.set_device(device_id)
    assert acc.current_device == before


def test_synchronize_memory_info_and_repr(current):
    acc = get_accelerator()
    buf = UnifiedBuffer(N).fill(1.0)
    buf.sync_to_device_async()
    assert acc.synchronize() is None
    # PyDotCompute returned a dict; the seeds (and lazybuf) say `free, total = ...`.
    free, total = acc.get_memory_info()
    assert 0 <= free <= total and total > 0
    assert "Accelerator" in repr(acc) and "devices=" in repr(acc)


def test_cuda_and_metal_available():
    acc = get_accelerator()
    has_cuda = any(d.backend == "cuda" for d in acc.devices)
    assert cuda_available() is has_cuda and acc.cuda_available is has_cuda
    # Metal is a graphics API under wgpu: a Metal device is a wgpu device on Metal (macOS).
    has_metal = any(d.device_type is DeviceType.METAL for d in acc.devices)
    assert metal_available() is has_metal and acc.metal_available is has_metal
    assert has_metal is acc.is_available("metal")


def test_every_name_is_exported():
    names = {
        # unified_buffer.py
        "BufferState",
        "UnifiedBuffer",
        # memory_pool.py
        "PoolStatistics",
        "MemoryPool",
        "get_memory_pool",
        "configure_memory_pool",
        # accelerator.py
        "DeviceType",
        "DeviceProperties",
        "Accelerator",
        "get_accelerator",
        "cuda_available",
        "metal_available",
        # exceptions.py, the memory layer's
        "PyDotComputeError",
        "BufferNotAllocatedError",
        "BufferSyncError",
        "BackendError",
        "BackendNotAvailableError",
        "CUDAError",
        "MetalError",
    }
    assert names <= set(lazybuf.__all__)
    assert hasattr(lazybuf, "BufferError")
