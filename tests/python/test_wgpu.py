"""wgpu devices from Python (Mesa's lavapipe Vulkan driver in CI, where LAZYBUF_REQUIRE=wgpu
makes a missing device a failure): `.device` is a DeviceMemoryView over the buffer's storage
buffer, selectors and availability name wgpu and its graphics API, pinned host memory is a
clear error, and `.metal` is a clear BackendUnavailableError where no Metal device exists
(here: Linux) and the Metal device's view where one does (macOS, untested here)."""

import numpy as np
import pytest

import lazybuf
from conftest import _need
from lazybuf import BackendUnavailableError, BufferState, DeviceMemoryView, UnifiedBuffer


@pytest.fixture
def wgpu_device() -> lazybuf.Device:
    devices = [d for d in lazybuf.get_accelerator().devices if d.backend == "wgpu"]
    if not devices:
        _need("wgpu", f"no wgpu device: {lazybuf.get_accelerator().backend_status}")
    return devices[0]


def _metal_devices():
    acc = lazybuf.get_accelerator()
    return acc.is_available("metal")


def test_device_is_a_view_of_the_storage_buffer(wgpu_device):
    buf = UnifiedBuffer((4, 250), np.float32, device=wgpu_device)
    buf.host[:] = np.arange(1000, dtype=np.float32).reshape(4, 250)
    view = buf.device
    assert isinstance(view, DeviceMemoryView)
    assert view.backend == "wgpu"
    assert (view.nbytes, view.shape, view.dtype) == (4000, (4, 250), np.dtype(np.float32))
    assert view.ptr != 0, "the VkBuffer handle on Vulkan"
    assert view.device == wgpu_device
    assert buf.state == BufferState.SYNCHRONIZED
    assert buf.device is view, "the same copy gives the same view"
    # A declared device write makes the host stale; the data comes back unchanged.
    writable = buf.device_writable
    assert writable.ptr == view.ptr
    assert buf.state == BufferState.DEVICE_DIRTY
    np.testing.assert_array_equal(buf.to_numpy(), np.arange(1000, dtype=np.float32).reshape(4, 250))
    assert buf.state == BufferState.DEVICE_DIRTY  # to_numpy() reads the device copy directly


def test_fills_syncs_and_odd_sizes_round_trip(wgpu_device):
    for n in (1, 3, 7, 1001):
        buf = UnifiedBuffer(n, np.uint8, device=wgpu_device)
        data = (np.arange(n) % 251).astype(np.uint8)
        buf.copy_from(data)
        buf.mark_device_dirty()
        np.testing.assert_array_equal(buf.to_numpy(), data)
        buf.mark_device_dirty()
        buf.fill(5)  # on the device, where the data is current
        assert buf.state == BufferState.DEVICE_DIRTY
        np.testing.assert_array_equal(buf.to_numpy(), np.full(n, 5, np.uint8))


def test_selectors_and_availability(wgpu_device):
    acc = lazybuf.get_accelerator()
    assert acc.is_available("wgpu")
    assert acc.is_available("vulkan") == any(d.backend == "wgpu" for d in acc.devices)
    assert not acc.is_available("metal"), "no Metal device on this machine"
    assert UnifiedBuffer(3, device="wgpu:0").device_handle == wgpu_device
    assert UnifiedBuffer(3, device="vulkan").device_handle.backend == "wgpu"
    with pytest.raises(ValueError, match="metal has no device"):
        UnifiedBuffer(3, device="metal")
    status = dict(acc.backend_status)
    assert isinstance(status["wgpu"], int) and status["wgpu"] >= 1
    free, total = wgpu_device.get_memory_info()
    assert 0 < total and free <= total


def test_pinned_host_memory_is_an_error_not_pageable(wgpu_device):
    buf = UnifiedBuffer(64, np.float32, pinned=True, device=wgpu_device)
    with pytest.raises(MemoryError, match="no pinned host memory"):
        buf.host[:] = 1.0
    assert buf.state == BufferState.UNINITIALIZED
    assert not buf.is_pinned


@pytest.mark.skipif(_metal_devices(), reason="a Metal device exists: .metal works there")
def test_metal_is_a_clear_error_without_a_metal_device(wgpu_device):
    buf = UnifiedBuffer(16, np.float32, device=wgpu_device)
    buf.host[:] = 2.0
    state = buf.state
    with pytest.raises(BackendUnavailableError, match="Metal is not available: .*metal") as err:
        buf.metal  # noqa: B018
    assert "wgpu" in str(err.value), "the message names the devices that exist"
    with pytest.raises(BackendUnavailableError, match="Metal is not available"):
        buf.mark_metal_dirty()
    assert buf.state == state, "the failed Metal calls changed nothing"
    np.testing.assert_array_equal(buf.to_numpy(), np.full(16, 2.0, np.float32))


@pytest.mark.skipif(not _metal_devices(), reason="no Metal device (Metal needs macOS)")
def test_metal_is_the_buffer_on_the_metal_device():
    metal = lazybuf.get_accelerator().devices
    buf = UnifiedBuffer(16, np.float32, device="host")
    buf.host[:] = 3.0
    view = buf.metal
    assert isinstance(view, DeviceMemoryView) and view.backend == "wgpu"
    assert any(d == view.device for d in metal)
    buf.mark_metal_dirty()
    np.testing.assert_array_equal(buf.to_numpy(), np.full(16, 3.0, np.float32))


def test_memory_objects_on_wgpu_device_memory_only(wgpu_device):
    """Device memory objects and DeviceBuffers work on wgpu; page-locked host and shared memory,
    which wgpu does not have, are refused with errors that say so."""
    m = lazybuf.MemoryDevice(10, device=wgpu_device)
    assert m.get_usm_type() == "device" and m.ptr != 0, "the VkBuffer handle on Vulkan"
    m.memset(ord("."))
    m.copy_from_host(b"abc")
    assert m.tobytes() == b"abc......."
    other = lazybuf.MemoryDevice(10, device=wgpu_device)
    other.copy_from_device(m)
    assert other.copy_to_host().tobytes() == b"abc......."
    buf = lazybuf.DeviceBuffer.to_device(b"0123456789", device=wgpu_device)
    assert buf.ptr != 0
    buf.resize(20)
    assert buf.tobytes()[:10] == b"0123456789" and buf.capacity() == 20
    buf.shrink_to_fit()
    assert buf.copy().tobytes()[:10] == b"0123456789"
    with pytest.raises(MemoryError, match="no pinned host memory"):
        lazybuf.MemoryHost(10, device=wgpu_device)
    with pytest.raises(ValueError, match="has no shared memory"):
        lazybuf.MemoryShared(10, device=wgpu_device)


def test_memory_resource_statistics_balance_on_wgpu(wgpu_device):
    """The statistics adaptor counts wgpu allocations in and out (their handles are told apart
    like every backend's)."""
    import gc

    import lazybuf.mr as lmr

    mr = lmr.StatisticsResourceAdaptor(lmr.get_current_device_resource(wgpu_device))
    buffers = [lazybuf.DeviceBuffer(size=20, device=wgpu_device, mr=mr) for _ in range(10)]
    assert (mr.allocation_counts.current_bytes, mr.allocation_counts.current_count) == (200, 10)
    del buffers
    gc.collect()
    assert (mr.allocation_counts.current_bytes, mr.allocation_counts.current_count) == (0, 0)
