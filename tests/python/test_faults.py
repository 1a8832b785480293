"""Fault injection from Python (`lazybuf.testing.FaultyDevice`, in wheels built with the crate
feature `testing`, as scripts/test-python.sh builds them): a failed allocation or copy raises
(RuntimeError "injected fault", as errors.rs maps runtime failures) and leaves the buffer's
state and every valid byte as they were; the next attempt succeeds.

The wrapped devices: the host, and PoCL below its 4 MiB zero-copy size (separate device
memory, so uploads and downloads are real copies that can fail).
"""

import numpy as np
import pytest

from conftest import _required, collect
from lazybuf import BufferState, Device, UnifiedBuffer, get_memory_pool

try:
    from lazybuf.testing import FaultyDevice
except ImportError:
    # A wheel built without the feature (a release wheel); scripts/test-python.sh names
    # `testing` in LAZYBUF_REQUIRE, so there a missing lazybuf.testing fails the run.
    if _required("testing"):
        raise
    pytest.skip("the wheel was built without the crate feature testing", allow_module_level=True)

# 4000 bytes: below its size class (4096), so the caching resource asks for a class block; an
# injected fault must surface all the same (only a refusal for size is retried at the exact
# size: resource/caching.rs).
N = 1000
DATA = np.arange(N, dtype=np.float32)


@pytest.fixture(params=["host", "opencl"])
def faulty(request) -> "FaultyDevice":
    """A fresh FaultyDevice (its own caches, so every allocation reaches it) over each device."""
    if request.param == "opencl":
        inner = request.getfixturevalue("opencl_device")
    else:
        inner = request.getfixturevalue("host_device")
    return FaultyDevice(inner)


@pytest.fixture
def faulty_opencl(opencl_device) -> "FaultyDevice":
    return FaultyDevice(opencl_device)


def test_a_faulty_device_is_a_device(host_device):
    faulty = FaultyDevice(host_device)
    assert isinstance(faulty, Device)
    assert faulty.inner == host_device and faulty != host_device
    assert faulty.backend == host_device.backend
    assert "FaultyDevice" in repr(faulty)
    assert FaultyDevice("host").inner == host_device
    with pytest.raises(TypeError, match="device must be None"):
        FaultyDevice(3.5)


def test_failed_host_allocation_changes_nothing(faulty):
    buf = UnifiedBuffer(N, np.float32, device=faulty)
    faulty.fail_allocation_in(1)
    with pytest.raises(RuntimeError, match="injected fault: allocation"):
        buf.host
    assert buf.state == BufferState.UNINITIALIZED
    buf.host[:] = DATA  # the next attempt succeeds
    np.testing.assert_array_equal(buf.to_numpy(), DATA)


def test_failed_device_allocation_changes_nothing(faulty_opencl):
    buf = UnifiedBuffer(N, np.float32, device=faulty_opencl)
    buf.host[:] = DATA
    faulty_opencl.fail_allocation_in(1)
    with pytest.raises(RuntimeError, match="injected fault: allocation"):
        buf.sync_to_device()
    assert buf.state == BufferState.HOST_ONLY
    np.testing.assert_array_equal(buf.to_numpy(), DATA)
    buf.sync_to_device()
    assert buf.state == BufferState.SYNCHRONIZED


def test_failed_upload_changes_nothing(faulty_opencl):
    buf = UnifiedBuffer(N, np.float32, device=faulty_opencl)
    buf.host[:] = DATA
    buf.sync_to_device()
    buf.host[:] = DATA + 1  # HOST_DIRTY: the device copy is stale
    faulty_opencl.fail_copy_in(1)
    with pytest.raises(RuntimeError, match="injected fault: copy"):
        buf.sync_to_device()
    assert buf.state == BufferState.HOST_DIRTY
    np.testing.assert_array_equal(buf.host_readonly, DATA + 1)
    buf.sync_to_device()
    buf.mark_device_dirty()  # the device copy is now the only valid one
    np.testing.assert_array_equal(buf.to_numpy(), DATA + 1)


def test_failed_download_changes_nothing(faulty_opencl):
    buf = UnifiedBuffer(N, np.float32, device=faulty_opencl)
    buf.host[:] = DATA
    buf.mark_device_dirty()  # DEVICE_DIRTY: the device holds the data
    faulty_opencl.fail_copy_in(1)
    with pytest.raises(RuntimeError, match="injected fault: copy"):
        buf.to_numpy()
    assert buf.state == BufferState.DEVICE_DIRTY
    np.testing.assert_array_equal(buf.to_numpy(), DATA)  # the device bytes survived
    assert buf.state == BufferState.DEVICE_DIRTY  # to_numpy() reads the device copy directly
    buf.sync_to_host()
    assert buf.state == BufferState.SYNCHRONIZED


def test_deferred_copy_fault_changes_nothing(faulty_opencl):
    buf = UnifiedBuffer(N, np.float32, device=faulty_opencl)
    buf.host[:] = DATA
    buf.mark_device_dirty()
    faulty_opencl.defer_copy_faults(True)
    faulty_opencl.fail_copy_in(1)
    with pytest.raises(RuntimeError, match="injected fault: copy"):
        buf.to_numpy()
    assert not faulty_opencl.copy_fault_armed
    assert buf.state == BufferState.DEVICE_DIRTY
    np.testing.assert_array_equal(buf.to_numpy(), DATA)


def test_failed_fill_changes_nothing(faulty_opencl):
    buf = UnifiedBuffer(N, np.float32, device=faulty_opencl)
    buf.host[:] = DATA
    buf.mark_device_dirty()
    faulty_opencl.fail_copy_in(1)  # a fill on the device counts as a copy
    with pytest.raises(RuntimeError, match="injected fault"):
        buf.fill(5.0)
    assert buf.state == BufferState.DEVICE_DIRTY
    np.testing.assert_array_equal(buf.to_numpy(), DATA)


def test_a_failed_fill_of_a_synchronized_buffer_changes_nothing(faulty):
    """A hostile script (2026-11-27): a fill refused before it started still marked the
    device copy stale (SYNCHRONIZED became HOST_DIRTY). Only a fill a runtime abandons
    half-way may do that (the CUDA double's, in the Rust tests)."""
    buf = UnifiedBuffer(N, np.float32, device=faulty)
    buf.host[:] = DATA
    buf.sync_to_device()
    faulty.fail_copy_in(1)
    with pytest.raises(RuntimeError, match="injected fault"):
        buf.fill(5.0)
    assert buf.state == BufferState.SYNCHRONIZED
    np.testing.assert_array_equal(buf.to_numpy(), DATA)


@pytest.mark.parametrize("fault", ["copy", "allocation"])
def test_a_failed_allocate_changes_nothing(faulty, fault):
    """A hostile script (2026-11-27): `allocate()` made the host copy, then failed on the
    device, leaving an UNINITIALIZED buffer HOST_ONLY with an allocation counted. Its device
    step failing now undoes its host step."""
    buf = UnifiedBuffer(N, np.float32, device=faulty)
    stats = buf.transfer_stats()
    if fault == "copy":
        faulty.fail_copy_in(1)  # the device copy's zero-fill or upload
    else:
        faulty.fail_allocation_in(2)  # the host block is the first allocation, the device's the second
    try:
        buf.allocate()
    except RuntimeError as err:
        assert "injected fault" in str(err)
    else:
        faulty.disarm()
        assert faulty.backend == "host", "only the host device may need no second allocation or copy"
        return
    faulty.disarm()
    assert buf.state == BufferState.UNINITIALIZED and not buf.is_allocated
    assert buf.transfer_stats() == stats
    buf.allocate()  # disarmed: the call works and the buffer holds zeros
    np.testing.assert_array_equal(buf.to_numpy(), np.zeros(N, np.float32))


def test_pool_acquire_on_a_faulty_device(faulty):
    pool = get_memory_pool(faulty)
    assert pool.device == faulty
    faulty.fail_allocation_in(1)
    buf = pool.acquire((N,), np.float32)  # allocates nothing yet
    with pytest.raises(RuntimeError, match="injected fault: allocation"):
        buf.host[:] = DATA
    assert buf.state == BufferState.UNINITIALIZED
    buf.host[:] = DATA
    np.testing.assert_array_equal(buf.to_numpy(), DATA)
    pool.release(buf)
    again = pool.acquire((N,), np.float32)
    again.host[:] = DATA * 2
    np.testing.assert_array_equal(again.to_numpy(), DATA * 2)
    pool.release(again)


def test_pinned_allocation_failure(faulty):
    buf = UnifiedBuffer(N, np.float32, pinned=True, device=faulty)
    faulty.fail_allocation_in(1)
    with pytest.raises(RuntimeError, match="injected fault: allocation"):
        buf.host
    assert buf.state == BufferState.UNINITIALIZED and not buf.is_pinned
    try:
        buf.host[:] = DATA
    except MemoryError as err:  # an mlock limit: reported, never a silent pageable fallback
        assert "mlock" in str(err)
        return
    assert buf.is_pinned
    np.testing.assert_array_equal(buf.to_numpy(), DATA)


def test_counters(faulty_opencl):
    before = (faulty_opencl.allocations, faulty_opencl.copies)
    buf = UnifiedBuffer(N, np.float32, device=faulty_opencl)
    buf.host[:] = DATA
    buf.sync_to_device()
    assert faulty_opencl.allocations > before[0]
    assert faulty_opencl.copies > before[1]
    faulty_opencl.fail_copy_in(5)
    assert faulty_opencl.copy_fault_armed
    faulty_opencl.disarm()
    assert not faulty_opencl.copy_fault_armed



def test_a_failure_nobody_waited_for_is_taken_from_its_device(faulty):
    """A transfer that fails while nobody waits for it, on a buffer dropped before any call
    settles it: the failure is recorded on the device (a drop cannot raise) and taken once."""
    import gc

    faulty.defer_copy_faults(True)
    buf = UnifiedBuffer((1000,), np.uint8, device=faulty)
    buf.host[:] = 3
    assert faulty.take_deferred_errors() == []
    faulty.fail_copy_in(1)
    buf.sync_to_device_async()  # the transfer handle is dropped unobserved
    del buf
    gc.collect()
    errors = faulty.take_deferred_errors()
    assert any(isinstance(e, RuntimeError) and "injected fault" in str(e) for e in errors), errors
    assert faulty.take_deferred_errors() == [], "taken once"


def test_a_failed_read_back_gives_its_cached_block_back(faulty_opencl):
    """to_numpy() arrays from 1 MiB take a block of the cache: a read-back that fails returns
    it (the pool's bytes in use are as before) and changes nothing."""
    import lazybuf

    n = 1 << 19  # 2 MiB: a cached block for the array; PoCL copies (it aliases from 4 MiB)
    data = np.arange(n, dtype=np.float32)
    buf = UnifiedBuffer(n, np.float32, device=faulty_opencl)
    buf.host[:] = data
    buf.mark_device_dirty()
    pool = lazybuf.get_memory_pool(faulty_opencl)
    collect()  # earlier tests' garbage, freed in between, would change the figure
    in_use = pool.stats().bytes_in_use
    faulty_opencl.fail_copy_in(1)
    with pytest.raises(RuntimeError, match="injected fault: copy"):
        buf.to_numpy()
    assert pool.stats().bytes_in_use == in_use
    assert buf.state == BufferState.DEVICE_DIRTY
    np.testing.assert_array_equal(buf.to_numpy(), data)


def test_the_buffer_protocol_is_not_stuck_on_an_upload_failure_the_host_copy_does_not_depend_on(faulty_opencl):
    """A failed asynchronous upload, reported by `Transfer.wait()`: the host copy is current,
    so exports of it work (the tenth hostile pass: `bytes(buf)` raised the failure forever)."""
    buf = UnifiedBuffer(N, np.float32, device=faulty_opencl)
    buf.host[:] = DATA
    faulty_opencl.defer_copy_faults(True)
    faulty_opencl.fail_copy_in(1)
    transfer = buf.sync_to_device_async()
    with pytest.raises(RuntimeError, match="injected fault: copy"):
        transfer.wait()
    # The coherence checker (LAZYBUF_CHECK=1) settles transfers into device copies before it
    # compares them: there the first export reports the failure again, once.
    raised = 0
    for _ in range(3):
        try:
            assert bytes(buf) == DATA.tobytes()
            np.testing.assert_array_equal(np.frombuffer(memoryview(buf), np.float32), DATA)
        except RuntimeError as err:
            assert "injected fault: copy" in str(err)
            raised += 1
    assert raised <= 1, raised
    assert bytes(buf) == DATA.tobytes()
    assert buf.state == BufferState.HOST_ONLY


def test_the_buffer_protocol_raises_a_failure_it_depends_on_once_then_settles(faulty_opencl):
    """A failed download the export waits for: raised without settling once (NumPy drops this
    slot's errors, and its next interface settles and raises it), then settled by the next
    export, which raises it where nothing drops it; the export after that works."""
    buf = UnifiedBuffer(N, np.float32, device=faulty_opencl)
    buf.host[:] = DATA
    buf.sync_to_device()
    buf.mark_device_dirty()
    faulty_opencl.defer_copy_faults(True)
    faulty_opencl.fail_copy_in(1)
    transfer = buf.sync_to_host_async()
    raised = 0
    for _ in range(4):
        try:
            assert bytes(buf) == DATA.tobytes()
        except RuntimeError as err:
            assert "injected fault: copy" in str(err)
            raised += 1
    assert raised == 2, raised
    del transfer
    assert buf.state == BufferState.SYNCHRONIZED
