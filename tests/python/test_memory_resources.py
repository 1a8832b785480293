"""RMM's memory-resource tests (test_statistics.py, test_tracking_resource_adaptor.py,
test_limiting_resource_adaptor.py, the pool's maximum-size tests, the failure-callback
adaptor), adapted to lazybuf.mr, on every device lazybuf finds.

Adaptations: `rmm.reinitialize(pool_allocator=True, maximum_pool_size=...)` is
`set_current_device_resource(PoolMemoryResource(maximum_pool_size=...))`; RMM's
`CudaMemoryResource` is `DirectMemoryResource`; the `rmm.statistics` module helpers
(`statistics()`, `profiler`) are not offered, the adaptor's own push/pop are; a callback that
always fails is a `LimitingResourceAdaptor` that is full.
"""

import gc

import numpy as np
import pytest

import lazybuf
from conftest import collect
from lazybuf import DeviceBuffer, MemoryDevice, UnifiedBuffer
from lazybuf import mr as lmr


def _selectors():
    return [d.selector for d in lazybuf.get_accelerator().devices]


@pytest.fixture(params=_selectors())
def device(request):
    """Each device in turn, made current; its current resource is restored afterwards."""
    accelerator = lazybuf.get_accelerator()
    accelerator.select_device(request.param)
    device = accelerator.current_device
    yield device
    lmr.set_current_device_resource(None, device)
    accelerator.select_device("host")


@pytest.fixture
def stats_mr(device):
    mr = lmr.StatisticsResourceAdaptor(lmr.get_current_device_resource())
    lmr.set_current_device_resource(mr)
    return mr


def test_statistics(stats_mr):
    buffers = [DeviceBuffer(size=20) for _ in range(10)]
    stats = stats_mr.allocation_counts
    assert (stats.current_bytes, stats.current_count) == (200, 10)
    assert (stats.peak_bytes, stats.peak_count) == (200, 10)
    assert (stats.total_bytes, stats.total_count) == (200, 10)
    del buffers
    gc.collect()
    stats = stats_mr.allocation_counts
    assert (stats.current_bytes, stats.current_count) == (0, 0)
    assert (stats.peak_bytes, stats.total_count) == (200, 10)


def test_counter_stack(stats_mr):
    buffers = [DeviceBuffer(size=10) for _ in range(10)]

    # push returns the stats from the top before the push
    stats = stats_mr.push_counters()  # stats from stack level 0
    assert stats.current_bytes == 100
    assert stats.current_count == 10
    assert stats.peak_bytes == 100
    assert stats.peak_count == 10
    assert stats.total_bytes == 100
    assert stats.total_count == 10

    b1 = DeviceBuffer(size=10)

    stats = stats_mr.push_counters()  # stats from stack level 1
    assert stats.current_bytes == 10
    assert stats.current_count == 1
    assert stats.peak_bytes == 10
    assert stats.peak_count == 1
    assert stats.total_bytes == 10
    assert stats.total_count == 1

    del b1
    gc.collect()

    # pop returns the popped stats
    # Note, the bytes and count can be negative
    stats = stats_mr.pop_counters()  # stats from stack level 2
    assert stats.current_bytes == -10
    assert stats.current_count == -1
    assert stats.peak_bytes == 0
    assert stats.peak_count == 0
    assert stats.total_bytes == 0
    assert stats.total_count == 0

    b2 = DeviceBuffer(size=20)  # in level 1, whose b1 is gone
    stats = stats_mr.pop_counters()  # stats from stack level 1
    assert (stats.current_bytes, stats.current_count) == (20, 1)
    assert (stats.peak_bytes, stats.peak_count) == (20, 1)
    assert (stats.total_bytes, stats.total_count) == (30, 2)

    # level 0 holds everything, its peak the most it ever held at once
    stats = stats_mr.allocation_counts
    assert (stats.current_bytes, stats.current_count) == (120, 11)
    assert (stats.peak_bytes, stats.peak_count) == (120, 11)
    assert (stats.total_bytes, stats.total_count) == (130, 12)

    with pytest.raises(IndexError, match="last counter pair"):
        stats_mr.pop_counters()
    del b2, buffers
    gc.collect()
    assert stats_mr.allocation_counts.current_bytes == 0


def test_multiple_mr(stats_mr):
    """Stacked adaptors: the outer sees the inner's allocations."""
    inner = lmr.StatisticsResourceAdaptor(lmr.DirectMemoryResource())
    outer = lmr.StatisticsResourceAdaptor(inner)
    buffers = [DeviceBuffer(size=1000, mr=outer) for _ in range(4)]
    assert outer.allocation_counts.current_bytes == inner.allocation_counts.current_bytes == 4000
    assert stats_mr.allocation_counts.current_count == 0, "not through the current resource"
    del buffers
    gc.collect()
    assert outer.allocation_counts.current_bytes == inner.allocation_counts.current_bytes == 0
    assert outer.allocation_counts.peak_bytes == 4000


def test_statistics_see_unified_buffers_and_memory_objects(stats_mr):
    buf = UnifiedBuffer((25,), np.float32)
    buf.host[:] = 1
    mem = MemoryDevice(64)
    assert stats_mr.allocation_counts.current_bytes == 100 + 64
    del buf, mem
    gc.collect()
    assert stats_mr.allocation_counts.current_bytes == 0


def test_tracking_resource_adaptor(device):
    cuda_mr = lmr.DirectMemoryResource()

    mr = lmr.TrackingResourceAdaptor(cuda_mr, capture_stacks=True)

    lmr.set_current_device_resource(mr)

    buffers = [DeviceBuffer(size=1000) for _ in range(10)]

    for i in range(9, 0, -2):
        del buffers[i]

    assert mr.get_allocated_bytes() == 5000

    # Push a new Tracking adaptor
    mr2 = lmr.TrackingResourceAdaptor(mr, capture_stacks=True)
    lmr.set_current_device_resource(mr2)

    for _ in range(2):
        buffers.append(DeviceBuffer(size=1000))

    assert mr2.get_allocated_bytes() == 2000
    assert mr.get_allocated_bytes() == 7000

    # Ensure we get back a non-empty string for the allocations
    report = mr.get_outstanding_allocations_str()
    assert len(report) > 0
    assert report.count(": 1000 B (device on") == 7 and "callstack" in report
    mr.log_outstanding_allocations()

    del buffers
    gc.collect()

    assert mr2.get_allocated_bytes() == 0
    assert mr.get_allocated_bytes() == 0

    # make sure the allocations string is now empty
    assert len(mr2.get_outstanding_allocations_str()) == 0
    assert len(mr.get_outstanding_allocations_str()) == 0


def test_mr_allocate_deallocate(device):
    mr = lmr.TrackingResourceAdaptor(lmr.get_current_device_resource())
    size = 1 << 23
    ptr = mr.allocate(size)
    assert mr.get_allocated_bytes() == 1 << 23
    mr.deallocate(ptr, size)
    assert mr.get_allocated_bytes() == 0
    with pytest.raises(ValueError, match="not allocated"):
        mr.deallocate(ptr, size)
    kept = lmr.TrackingResourceAdaptor(lmr.DirectMemoryResource())
    kept.allocate(100)
    del kept  # what was not given back returns with the resource


def test_mr_allocate_refuses_memory_without_a_handle(device):
    """Memory whose device gives no handle for it (wgpu on Metal or DirectX 12: every
    `allocate` returned 0) is refused with a TypeError naming the device, and given back: a
    second `allocate` took the same key and the registry dropped the first, whose memory its
    caller still used. An allocation made before the handles went missing stays live."""
    testing = pytest.importorskip("lazybuf.testing")
    faulty = testing.FaultyDevice(device)
    mr = lmr.TrackingResourceAdaptor(lmr.DirectMemoryResource())
    first = mr.allocate(4096, device=faulty)
    assert first != 0
    faulty.hide_native_handles(True)
    for _ in range(2):
        with pytest.raises(TypeError, match=r"has no handle to return.*expected a device whose memory has one"):
            mr.allocate(4096, device=faulty)
    # Nothing of the refused calls is held; the first allocation still is, and goes back.
    assert mr.get_allocated_bytes() == 4096
    faulty.hide_native_handles(False)
    mr.deallocate(first, 4096)
    assert mr.get_allocated_bytes() == 0


@pytest.mark.parametrize("upstream", [lmr.DirectMemoryResource, lmr.PoolMemoryResource])
def test_limiting_resource_adaptor(device, upstream):
    cuda_mr = upstream()

    allocation_limit = 1 << 20
    num_buffers = 2
    buffer_size = allocation_limit // num_buffers

    mr = lmr.LimitingResourceAdaptor(cuda_mr, allocation_limit=allocation_limit)
    assert mr.get_allocation_limit() == allocation_limit

    lmr.set_current_device_resource(mr)

    buffers = [DeviceBuffer(size=buffer_size) for _ in range(num_buffers)]

    assert mr.get_allocated_bytes() == sum(b.size for b in buffers)

    with pytest.raises(MemoryError):
        DeviceBuffer(size=1)
    assert [b.size for b in buffers] == [buffer_size] * 2


def test_pool_max_pool_size(device):
    lmr.set_current_device_resource(lmr.PoolMemoryResource(maximum_pool_size=1 << 23))
    DeviceBuffer().resize((1 << 23) - 1)


def test_pool_max_pool_size_exceeded(device):
    pool = lmr.PoolMemoryResource(maximum_pool_size=1 << 23)
    assert pool.maximum_pool_size() == 1 << 23
    lmr.set_current_device_resource(pool)
    with pytest.raises(MemoryError):
        DeviceBuffer().resize(1 << 24)


def test_pool_reuses_and_trims(device):
    pool = lmr.PoolMemoryResource(lmr.DirectMemoryResource())
    b = DeviceBuffer(size=1000, mr=pool)
    ptr = b.ptr
    del b
    gc.collect()
    assert pool.cached_bytes() > 0 and pool.pool_size() == pool.cached_bytes()
    assert DeviceBuffer(size=1000, mr=pool).ptr == ptr, "the same memory again"
    gc.collect()
    assert pool.trim() > 0 and pool.pool_size() == 0


def test_failure_callback_resource_adaptor(device):
    retried = [False]

    def callback(nbytes: int) -> bool:
        if retried[0]:
            return False
        else:
            retried[0] = True
            return True

    full = lmr.LimitingResourceAdaptor(lmr.DirectMemoryResource(), 1000)
    mr = lmr.FailureCallbackResourceAdaptor(full, callback)
    with pytest.raises(MemoryError):
        DeviceBuffer(size=2000, mr=mr)
    assert retried[0]


def test_failure_callback_frees_memory_and_retries(device):
    limit = lmr.LimitingResourceAdaptor(lmr.DirectMemoryResource(), 1000)
    hog = [DeviceBuffer(size=900, mr=limit)]
    sizes = []

    def callback(nbytes):
        sizes.append(nbytes)
        if hog:
            hog.clear()  # frees the memory
            return True
        return False

    mr = lmr.FailureCallbackResourceAdaptor(limit, callback)
    db = DeviceBuffer.to_device(b"x" * 500, mr=mr)
    assert sizes == [500] and db.tobytes() == b"x" * 500
    assert mr.get_upstream() is limit


class Boom(Exception):
    pass


def test_failure_callback_exceptions_propagate(device):
    def callback(nbytes):
        raise Boom(f"no {nbytes} bytes for you")

    full = lmr.LimitingResourceAdaptor(lmr.DirectMemoryResource(), 100)
    mr = lmr.FailureCallbackResourceAdaptor(full, callback)
    with pytest.raises(Boom, match="no 2000 bytes"):
        DeviceBuffer(size=2000, mr=mr)
    lmr.set_current_device_resource(mr)
    with pytest.raises(Boom):
        MemoryDevice(5000)
    buf = UnifiedBuffer((1000,), np.uint8)
    with pytest.raises(Boom):
        buf.host[:] = 1
    assert buf.state == lazybuf.BufferState.UNINITIALIZED, "the failed allocation changed nothing"


def test_current_device_resource(device):
    default = lmr.get_current_device_resource()
    assert isinstance(default, lmr.PoolMemoryResource if lazybuf.caching() else lmr.DirectMemoryResource)
    mr = lmr.StatisticsResourceAdaptor(lmr.DirectMemoryResource())
    lmr.set_current_device_resource(mr)
    assert lmr.get_current_device_resource() is mr
    assert lmr.get_current_device_resource(device) is mr
    other = [d for d in lazybuf.get_accelerator().devices if d != device]
    for d in other:
        assert lmr.get_current_device_resource(d) is not mr, "per device"
    db = DeviceBuffer(size=8)
    lmr.set_current_device_resource(None)
    assert lmr.get_current_device_resource() is not mr
    DeviceBuffer(size=8)
    assert mr.allocation_counts.total_count == 1
    del db


def test_bad_arguments(device):
    with pytest.raises(TypeError, match="upstream_mr"):
        lmr.StatisticsResourceAdaptor(None)
    with pytest.raises(TypeError, match="upstream_mr"):
        lmr.LimitingResourceAdaptor(object(), 10)
    with pytest.raises(TypeError, match="callable"):
        lmr.FailureCallbackResourceAdaptor(lmr.DirectMemoryResource(), 3)
    with pytest.raises(TypeError, match="mr"):
        DeviceBuffer(size=3, mr="pool")
    with pytest.raises(TypeError, match="mr"):
        lmr.set_current_device_resource("pool")
    with pytest.raises(ValueError, match="positive"):
        lmr.DirectMemoryResource().allocate(0)



@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: lmr.LimitingResourceAdaptor(lmr.DirectMemoryResource(), -1), "allocation_limit must not be negative"),
        (lambda: lmr.LimitingResourceAdaptor(lmr.DirectMemoryResource(), 2**64), "allocation_limit is too large"),
        (lambda: lmr.PoolMemoryResource(maximum_pool_size=-5), "maximum_pool_size must not be negative"),
        (lambda: lmr.PoolMemoryResource(max_cached_bytes=-5), "max_cached_bytes must not be negative"),
        (lambda: lmr.PoolMemoryResource(max_cached_bytes=2**70), "max_cached_bytes is too large"),
        (lambda: lmr.DirectMemoryResource().deallocate(-1, 8), "ptr must not be negative"),
        (lambda: lmr.DirectMemoryResource().deallocate(2**70, 8), "ptr is too large"),
        (lambda: lmr.DirectMemoryResource().deallocate(64, -8), "nbytes must not be negative"),
    ],
)
def test_integer_arguments_out_of_range_are_value_errors_naming_them(call, match):
    """A hostile pass (2026-11-27): these raised a bare OverflowError naming nothing."""
    with pytest.raises(ValueError, match=match):
        call()


def test_integer_arguments_take_numpy_integers_and_none_where_optional():
    pool = lmr.PoolMemoryResource(maximum_pool_size=np.int64(1 << 20), max_cached_bytes=None)
    assert pool.maximum_pool_size() == 1 << 20
    assert lmr.LimitingResourceAdaptor(lmr.DirectMemoryResource(), np.uint64(1 << 20)).get_allocation_limit() == 1 << 20
    with pytest.raises(TypeError, match="allocation_limit"):
        lmr.LimitingResourceAdaptor(lmr.DirectMemoryResource(), 1.5)

def test_spilling_trims_a_pool_memory_resource_before_it_evicts_a_copy(device):
    """A hostile pass (2026-11-27): a `lmr.PoolMemoryResource`'s cached blocks counted against
    the device's limit, but spilling never trimmed them: it evicted a live copy (or, with the
    copy not spillable, refused the allocation) while the pool still cached 512 KiB. Such pools
    are trimmed first now, as every MemoryPool is."""
    collect()  # earlier tests' garbage, freed in the middle, would leave room without a trim
    lazybuf.trim()
    held = lazybuf.memory_held(device)
    probe = UnifiedBuffer(16 * 1024, np.float32, device=device)
    probe.sync_to_device()
    if lazybuf.memory_held(device) == held:
        pytest.skip("device copies on this device are host memory: no device memory to limit")
    del probe
    lazybuf.trim()
    KiB = 1024
    pool = lmr.PoolMemoryResource()
    ptr = pool.allocate(512 * KiB, device=device)
    pool.deallocate(ptr, 512 * KiB)
    assert pool.cached_bytes() >= 512 * KiB
    old = UnifiedBuffer(256 * KiB // 4, np.float32, device=device, spillable=False)
    old.host[:] = 1
    old.sync_to_device()
    base = lazybuf.memory_held(device) - pool.cached_bytes()
    try:
        lazybuf.set_memory_limit(device, base + 512 * KiB + 64 * KiB)
        new = UnifiedBuffer(512 * KiB // 4, np.float32, device=device)
        new.sync_to_device()  # fits once the pool's cache is given back
        assert pool.cached_bytes() == 0
        assert old.state == lazybuf.BufferState.SYNCHRONIZED
        assert lazybuf.memory_held(device) <= base + 512 * KiB + 64 * KiB
    finally:
        lazybuf.set_memory_limit(device, None)
