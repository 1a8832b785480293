"""CUDA interop: `.device`, `__cuda_array_interface__` (v3), DLPack on kDLCUDA.

Runs wherever lazybuf finds a CUDA device: a real GPU, or the CUDA driver test double
(LD_LIBRARY_PATH=target/cuda-double, built by scripts/build-cuda-double.sh) that drives the
same code on machines without one. With CuPy installed `.device` is a CuPy array; without it,
a DeviceMemoryView. Skipped without a CUDA device unless LAZYBUF_REQUIRE names cuda.
"""

import pickle
import warnings

import numpy as np
import pytest

import lazybuf

from conftest import _need, collect
from lazybuf import BufferState, DeviceMemoryView, UnifiedBuffer, get_accelerator


@pytest.fixture
def cuda_device():
    devices = [d for d in get_accelerator().devices if d.backend == "cuda"]
    if not devices:
        _need("cuda", f"no CUDA device: {get_accelerator().backend_status}")
    return devices[0]


def to_host(array) -> np.ndarray:
    if isinstance(array, DeviceMemoryView):
        raise TypeError("a DeviceMemoryView has no host copy")
    import cupy

    return cupy.asnumpy(array)


def test_device_view_and_interfaces(cuda_device):
    buf = UnifiedBuffer((4, 3), np.float32, device=cuda_device)
    data = np.arange(12, dtype=np.float32).reshape(4, 3)
    buf.host[:] = data
    view = buf.device_writable
    assert buf.state == BufferState.DEVICE_DIRTY  # `.device_writable` counts as a device write
    interface = buf.__cuda_array_interface__
    assert interface["version"] == 3
    assert interface["shape"] == (4, 3) and interface["typestr"] == "<f4"
    assert interface["strides"] is None and interface["data"][1] is False
    assert interface["data"][0] != 0
    if isinstance(view, DeviceMemoryView):
        assert view.backend == "cuda" and view.nbytes == 48 and view.shape == (4, 3)
        assert view.__cuda_array_interface__ == interface
        assert view.device == cuda_device
    else:
        assert view.__cuda_array_interface__["data"][0] == interface["data"][0]
        np.testing.assert_array_equal(to_host(view), data)
    np.testing.assert_array_equal(buf.to_numpy(), data)
    assert buf.state == BufferState.DEVICE_DIRTY  # read straight from the device copy


def test_dlpack_on_cuda(cuda_device):
    buf = UnifiedBuffer(6, np.int32, device=cuda_device)
    buf.copy_from(np.arange(6))
    assert buf.__dlpack_device__() == (2, 0)
    assert "dltensor_versioned" in repr(buf.__dlpack__(max_version=(1, 0), stream=None))
    assert '"dltensor"' in repr(buf.__dlpack__(dl_device=(2, 0)))
    assert buf.state == BufferState.DEVICE_DIRTY  # the device export counts as a write
    host = np.from_dlpack(buf, device="cpu")  # the host copy, exported zero-copy
    assert host.tolist() == list(range(6))
    assert buf.state == BufferState.HOST_DIRTY
    with pytest.raises(BufferError, match="can export to the CPU"):
        buf.__dlpack__(dl_device=(2, 7))
    with pytest.raises(BufferError, match="only for export to the CPU"):
        buf.__dlpack__(dl_device=(2, 0), copy=True)


def test_device_fill_and_sync(cuda_device):
    buf = UnifiedBuffer(1000, np.float64, device=cuda_device)
    buf.host[:] = 1.0
    buf.sync_to_device()
    buf.mark_device_dirty()
    buf.fill(2.5)  # on the device: no transfer
    stats = buf.transfer_stats()
    assert stats["device_to_host_copies"] == 0
    np.testing.assert_array_equal(buf.to_numpy(), np.full(1000, 2.5))
    assert buf.transfer_stats()["device_to_host_copies"] == 1


def in_use(device) -> int:
    """Device memory this process's lazybuf holds and has not given back to its caches (the
    driver's free figure would count other processes on the GPU: the GPU check runs the suite
    as shards at once)."""
    return lazybuf.memory_held(device) - device.cached_memory


def test_device_view_keeps_memory_alive(cuda_device):
    size = 64 << 20
    collect()
    before = in_use(cuda_device)
    buf = UnifiedBuffer(size, np.uint8, device=cuda_device)
    buf.mark_device_dirty()
    view = buf.device
    pointer = buf.__cuda_array_interface__["data"][0]
    del buf
    collect()
    if isinstance(view, DeviceMemoryView):
        assert view.ptr == pointer
    assert in_use(cuda_device) >= before + size
    del view
    collect()
    assert in_use(cuda_device) == before


def test_pickle_of_a_cuda_buffer(cuda_device):
    buf = UnifiedBuffer(3, np.float32, device=cuda_device)
    buf.copy_from([1, 2, 3])
    buf.mark_device_dirty()
    clone = pickle.loads(pickle.dumps(buf))
    assert clone.to_numpy().tolist() == [1.0, 2.0, 3.0]


SPIN_FILL = r"""
extern "C" __global__ void spin_fill(float* p, int n, float value, long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {}
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = value;
}
"""


def spin_fill(cupy, array, value, stream):
    """A kernel on `stream` that spins for about 0.1 s, then fills `array` with `value`."""
    kernel = cupy.RawKernel(SPIN_FILL, "spin_fill")
    n = array.size
    with stream:
        kernel(((n + 255) // 256,), (256,), (array, np.int32(n), np.float32(value), np.int64(200_000_000)))


@pytest.mark.parametrize("non_blocking", [True, False])
def test_kernels_on_cupys_current_stream_are_ordered_before_lazybuf(cuda_device, non_blocking):
    """A kernel on a CuPy stream of the caller's writes the `.device` array; inside that
    stream's block, lazybuf's next calls wait for it with no order_after() call."""
    cupy = pytest.importorskip("cupy")
    if cuda_device.name.startswith("lazybuf CUDA test double"):
        pytest.skip("needs a GPU: CuPy cannot launch kernels on the test double")
    buf = UnifiedBuffer(1 << 16, np.float32, device=cuda_device)
    buf.host[:] = 1
    array = buf.device
    stream = cupy.cuda.Stream(non_blocking=non_blocking)
    spin_fill(cupy, array, 7, stream)
    with stream:
        assert not stream.done, "the kernel must still be running for the test to mean anything"
        buf.mark_device_dirty()
        out = buf.to_numpy()
    np.testing.assert_array_equal(out, np.full(1 << 16, 7, np.float32))
    # Again after a host write: `.device` taken inside the stream's block, so its upload is
    # ordered before CuPy's current stream, `stream`.
    buf.host[:] = 2
    with stream:
        array = buf.device
    spin_fill(cupy, array, 9, stream)
    with stream:
        buf.mark_device_dirty()
        np.testing.assert_array_equal(buf.to_numpy(), np.full(1 << 16, 9, np.float32))


def test_kernels_on_cupys_default_stream_need_no_call(cuda_device):
    cupy = pytest.importorskip("cupy")
    if cuda_device.name.startswith("lazybuf CUDA test double"):
        pytest.skip("needs a GPU: CuPy cannot launch kernels on the test double")
    buf = UnifiedBuffer(1 << 16, np.float32, device=cuda_device)
    buf.host[:] = 1
    spin_fill(cupy, buf.device, 5, cupy.cuda.Stream.null)
    buf.mark_device_dirty()
    np.testing.assert_array_equal(buf.to_numpy(), np.full(1 << 16, 5, np.float32))


@pytest.mark.parametrize("non_blocking", [True, False])
def test_device_returns_before_its_upload_and_cupys_stream_waits_for_it(cuda_device, non_blocking):
    """`.device` is in the order of the buffer's stream: it enqueues the upload and returns
    (here while the upload waits behind a kernel that holds lazybuf's stream), and CuPy's
    current stream waits for it on the device, so a reduction there sees the uploaded data."""
    cupy = pytest.importorskip("cupy")
    if cuda_device.name.startswith("lazybuf CUDA test double"):
        pytest.skip("needs a GPU: CuPy cannot launch kernels on the test double")
    n = 1 << 20
    buf = UnifiedBuffer(n, np.float32, device=cuda_device, pinned=True)
    # A raw handle: ExternalStream (CuPy 14 deprecates it for Stream.from_external, which takes
    # an object with __cuda_stream__, not an int: seen on an H200, 2026-11-27).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        lazybufs = cupy.cuda.ExternalStream(buf.stream)
    hold = cupy.zeros(1, np.float32)
    stream = cupy.cuda.Stream(non_blocking=non_blocking)
    for value in (3, 4):
        buf.host[:] = value
        spin_fill(cupy, hold, 0, lazybufs)  # lazybuf's stream is busy for about 0.1 s
        with stream:
            array = buf.device
            assert not lazybufs.done, "the upload is still queued: .device did not wait for it"
            total = float(array.sum())
        assert total == value * n, (value, total)
        buf.mark_device_dirty()
        np.testing.assert_array_equal(buf.to_numpy(), np.full(n, value, np.float32))
