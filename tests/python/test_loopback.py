"""The test-only loopback backend through the Python package, with no binding line naming it.

The loopback devices (cargo feature ``loopback``, which the test wheel's ``testing`` feature
turns on) keep device memory of their own on the host: every sync moves its bytes, as on a
discrete GPU, and the host never addresses a device copy. They are registered exactly as a
real backend is (crates/lazybuf/src/backend/loopback/ and one registry line), so everything
here runs through the binding's generic paths: the same paths a new backend would take.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import lazybuf
from conftest import _need
from lazybuf import BufferState, UnifiedBuffer


@pytest.fixture
def loopbacks() -> list[lazybuf.Device]:
    found = [d for d in lazybuf.get_accelerator().devices if d.backend == "loopback"]
    if len(found) != 2:
        if not hasattr(lazybuf, "testing"):
            pytest.skip("a wheel without the testing feature has no loopback devices")
        _need("testing", f"the test wheel lists {len(found)} loopback devices, expected 2")
    return found


DTYPES = [np.float16, np.float32, np.float64, np.int8, np.uint16, np.int32, np.uint64, np.complex128]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_every_dtype_round_trips_and_each_sync_moves_its_bytes(loopbacks, dtype):
    device = loopbacks[0]
    data = (np.arange(60) % 97).astype(dtype).reshape(3, 4, 5)
    buf = UnifiedBuffer(data.shape, dtype, device=device)
    buf.copy_from(data)
    buf.sync_to_device()
    assert buf.state == BufferState.SYNCHRONIZED
    buf.mark_device_dirty()  # as if a kernel wrote the device copy
    assert buf.state == BufferState.DEVICE_DIRTY
    np.testing.assert_array_equal(buf.to_numpy(), data)
    stats = buf.transfer_stats()
    assert stats["host_to_device_copies"] == 1 and stats["host_to_device_bytes"] == data.nbytes
    assert stats["device_to_host_copies"] == 1 and stats["device_to_host_bytes"] == data.nbytes
    assert stats["zero_copy_syncs"] == 0


def test_a_host_write_after_a_sync_is_uploaded_again(loopbacks):
    buf = UnifiedBuffer(1000, np.float32, device=loopbacks[1])
    buf.host[:] = 1.0
    view = buf.device  # the device copy, as raw handles (no array library fits this backend)
    assert isinstance(view, lazybuf.DeviceMemoryView)
    assert view.backend == "loopback" and view.nbytes == 4000 and view.ptr != 0
    assert view.device == loopbacks[1]
    buf.host[:10] = 2.0  # a host write: the device copy is stale
    assert buf.state == BufferState.HOST_DIRTY
    buf.sync_to_device()
    assert buf.transfer_stats()["host_to_device_copies"] == 2
    expected = np.ones(1000, np.float32)
    expected[:10] = 2.0
    np.testing.assert_array_equal(buf.to_numpy(), expected)


def test_selectors_memory_figures_and_pickles(loopbacks):
    for index, device in enumerate(loopbacks):
        assert device.selector == f"loopback:{index}"
        assert not device.shares_host_memory and not device.is_gpu
        free, total = device.get_memory_info()
        assert 0 <= free <= total == device.total_memory
    buf = UnifiedBuffer(16, np.int32, device="loopback:1")
    buf.copy_from(np.arange(16, dtype=np.int32))
    buf.sync_to_device()
    buf.mark_device_dirty()
    clone = pickle.loads(pickle.dumps(buf))
    assert clone.to_numpy().tolist() == list(range(16))
    assert clone.to_numpy().tolist() == buf.to_numpy().tolist()


def test_memory_objects_and_device_buffers_on_a_loopback_device(loopbacks):
    data = np.arange(256, dtype=np.uint8)
    device_buffer = lazybuf.to_device(data, device=loopbacks[0])
    np.testing.assert_array_equal(np.frombuffer(device_buffer.copy_to_host(), np.uint8), data)
    memory = lazybuf.MemoryDevice(256, device=loopbacks[0])
    memory.copy_from_host(data)
    out = np.zeros(256, np.uint8)
    memory.copy_to_host(out)
    np.testing.assert_array_equal(out, data)


def test_out_of_memory_on_a_loopback_device_changes_nothing(loopbacks):
    device = loopbacks[0]
    _, total = device.get_memory_info()
    buf = UnifiedBuffer(total // 8 + 1, np.float64, device=device)  # more than the device holds
    buf.host[:3] = [1.0, 2.0, 3.0]
    with pytest.raises(MemoryError):
        buf.sync_to_device()
    assert buf.state == BufferState.HOST_ONLY
    assert buf.to_numpy()[:3].tolist() == [1.0, 2.0, 3.0]
