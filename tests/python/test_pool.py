"""Memory pools from Python: reuse ("same buffer!"), statistics, the context-manager form,
trim and clear, and the release rules (double and foreign releases are refused; views of a
released buffer keep its memory until they are gone)."""

import numpy as np
import pytest

from conftest import collect
from lazybuf import BufferState, MemoryPool, UnifiedBuffer, get_memory_pool


def address(array) -> int:
    return array.__array_interface__["data"][0]


@pytest.fixture(params=["host", "opencl"])
def device(request):
    if request.param == "opencl":
        return request.getfixturevalue("opencl_device")
    return request.getfixturevalue("host_device")


def test_release_then_acquire_reuses_the_memory(device):
    pool = MemoryPool(device)
    buf = pool.acquire((1000,), dtype=np.float32)
    assert buf.state == BufferState.UNINITIALIZED
    assert pool.stats().allocations == 0  # memory is taken at first use
    buf.host[:] = 1.0
    buf.sync_to_device()
    first = address(buf.host_readonly)
    pool.release(buf)
    again = pool.acquire((1000,), dtype=np.float32)
    assert again.state == BufferState.UNINITIALIZED  # a reused buffer starts uninitialized
    assert address(again.host) == first  # same buffer!
    stats = pool.stats()
    assert stats.hits >= 1 and stats.misses >= 1
    assert stats.allocations == stats.misses
    assert stats.bytes_in_use > 0 and stats.peak_bytes_in_use >= stats.bytes_in_use


def test_a_smaller_request_reuses_a_cached_block():
    pool = MemoryPool("host")
    buf = pool.acquire(1000, np.float64)
    buf.fill(0.0)
    first = address(buf.host)
    pool.release(buf)
    smaller = pool.acquire((10, 99), np.float64)  # 990 elements: the same size class
    assert address(smaller.host) == first
    assert smaller.shape == (10, 99)


def test_context_manager_releases_to_the_pool():
    pool = MemoryPool("host")
    with pool.acquire((256,), np.int32) as buf:
        buf.copy_from(np.arange(256))
        first = address(buf.host_readonly)
    assert buf.released
    assert pool.stats().bytes_cached > 0
    with pool.acquire((256,), np.int32) as buf2:
        assert address(buf2.host) == first


def test_buffer_release_goes_back_to_its_pool():
    pool = MemoryPool("host")
    buf = pool.acquire(64)
    buf.fill(1.0)
    buf.release()
    assert buf.released and pool.stats().bytes_in_use == 0 and pool.stats().bytes_cached > 0


def test_views_of_a_released_buffer_keep_its_memory():
    pool = MemoryPool("host")
    buf = pool.acquire(1024, np.float32)
    buf.fill(3.0)
    view = buf.host
    pool.release(buf)
    in_use = pool.stats().bytes_in_use
    assert in_use > 0  # still held by the view
    other = pool.acquire(1024, np.float32)
    other.fill(-1.0)
    assert address(other.host) != address(view)  # not handed out again while viewed
    assert float(view.sum()) == 3.0 * 1024
    pool.release(other)
    del view
    collect()
    assert pool.stats().bytes_in_use == 0


def test_double_release_is_refused():
    pool = MemoryPool("host")
    buf = pool.acquire(8)
    pool.release(buf)
    with pytest.raises(ValueError, match="was released"):
        pool.release(buf)
    with pytest.raises(ValueError, match="was released"):
        buf.release()


def test_a_with_block_whose_buffer_was_released_inside_exits_quietly():
    pool = MemoryPool("host")
    with pool.acquire(8) as buf:
        buf.fill(1.0)
        pool.release(buf)
    assert buf.released and pool.stats().bytes_in_use == 0


def test_foreign_release_is_refused_and_leaves_the_buffer_intact():
    pool, other = MemoryPool("host"), MemoryPool("host")
    mine = other.acquire(4, np.int64)
    mine.copy_from([1, 2, 3, 4])
    with pytest.raises(ValueError, match="expected a buffer acquired from this pool.*another pool"):
        pool.release(mine)
    plain = UnifiedBuffer(4, np.int64)
    plain.fill(9)
    with pytest.raises(ValueError, match="came from no pool"):
        pool.release(plain)
    assert mine.to_numpy().tolist() == [1, 2, 3, 4] and plain.to_numpy().tolist() == [9] * 4
    other.release(mine)


def test_release_needs_a_buffer():
    with pytest.raises(TypeError):
        MemoryPool("host").release(np.zeros(3))


def test_trim_clear_and_stats():
    pool = MemoryPool("host")
    for _ in range(3):
        with pool.acquire(4096, np.uint8) as buf:
            buf.fill(1)
    stats = pool.stats()
    assert (stats.misses, stats.hits, stats.allocations) == (1, 2, 1)
    assert stats.bytes_cached >= 4096 and stats.oom_retries == 0
    assert "hits=2" in repr(stats)
    assert pool.trim() == stats.bytes_cached
    assert pool.stats().bytes_cached == 0
    pool.clear()
    cleared = pool.stats()
    assert (cleared.hits, cleared.misses, cleared.allocations, cleared.peak_bytes_in_use) == (0, 0, 0, 0)
    assert "MemoryPool host:0" in repr(pool)


def test_cap_zero_caches_nothing():
    pool = MemoryPool("host", max_cached_bytes=0)
    assert pool.max_cached_bytes == 0
    with pool.acquire(100) as buf:
        buf.fill(0.0)
    assert pool.stats().bytes_cached == 0
    with pool.acquire(100) as buf:
        buf.fill(0.0)
    assert pool.stats().misses == 2


def test_zero_reused_clears_old_contents():
    pool = MemoryPool("host", zero_reused=True)
    assert pool.zero_reused
    with pool.acquire(100, np.int32) as buf:
        buf.fill(77)
    with pool.acquire(100, np.int32) as buf:
        assert not buf.host.any()


def test_default_pool_per_device(opencl_device, host_device):
    assert get_memory_pool("host").device == host_device
    assert get_memory_pool(opencl_device).device == opencl_device
    pool = get_memory_pool(opencl_device)
    buf = pool.acquire(16)
    get_memory_pool(opencl_device).release(buf)  # the same process-wide pool
    assert buf.device_handle == opencl_device
    with pytest.raises(ValueError, match="another pool"):
        get_memory_pool("host").release(get_memory_pool(opencl_device).acquire(4))


def test_pinned_pooled_buffer():
    pool = MemoryPool("host")
    buf = pool.acquire(1 << 16, np.uint8, pinned=True)
    try:
        buf.fill(1)
    except MemoryError as err:
        assert "mlock" in str(err)
        return
    assert buf.is_pinned
    pool.release(buf)


def test_bad_acquire_arguments():
    pool = MemoryPool("host")
    with pytest.raises(ValueError, match="negative"):
        pool.acquire(-1)
    with pytest.raises(TypeError, match="unsupported dtype"):
        pool.acquire(3, np.bool_)
    with pytest.raises(ValueError, match="no device matches"):
        MemoryPool("tpu")


@pytest.mark.parametrize("read", ["host_readonly", "to_numpy", "device", "memoryview"])
def test_a_reused_uninitialized_buffer_never_shows_the_previous_users_bytes(device, read):
    # Issue 8, item 15: without zero_reused, a reused block holds the last user's data; a read
    # of an UNINITIALIZED buffer must still see zeros. A write access (`.host`) gets
    # unspecified contents, as numpy.empty does (zero_reused=True clears those too).
    pool = MemoryPool(device)
    with pool.acquire((1000,), np.int32) as buf:
        buf.fill(-7)
        buf.sync_to_device()
        first = address(buf.host_readonly)
    again = pool.acquire((1000,), np.int32)
    assert again.state == BufferState.UNINITIALIZED
    if read == "host_readonly":
        data = np.array(again.host_readonly)
    elif read == "to_numpy":
        data = again.to_numpy()
    elif read == "device":
        again.sync_to_device()
        data = again.to_numpy()
    else:
        data = np.frombuffer(memoryview(again), dtype=np.int32)
    assert address(again.host_readonly) == first  # the same block was reused
    assert not data.any(), "a read of an uninitialized buffer showed a previous user's bytes"
    pool.release(again)


@pytest.mark.parametrize(
    "value,error,match",
    [
        (-1, ValueError, "max_cached_bytes must not be negative"),
        (2**70, ValueError, "max_cached_bytes is too large"),
        (1.5, TypeError, "max_cached_bytes must be an int"),
    ],
)
def test_a_bad_max_cached_bytes_names_the_argument(value, error, match):
    """A hostile pass (2026-11-27): these raised bare conversion errors naming nothing."""
    with pytest.raises(error, match=match):
        MemoryPool(max_cached_bytes=value)
