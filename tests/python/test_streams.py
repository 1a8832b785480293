"""lazybuf's stream for the caller (``UnifiedBuffer.stream``) and ordering lazybuf after the
caller's own streams (``UnifiedBuffer.order_after``).

The ordering is shown for real on PoCL: the caller fills the buffer's device copy on a queue of
its own, held back by a PyOpenCL user event that a timer completes later; lazybuf's download
must come after that fill only because it was told (``order_after``).
"""

import threading

import numpy as np
import pytest

import lazybuf
from lazybuf import UnifiedBuffer

N = 4096  # float32: 16 KiB, a real (not aliased) cl_mem on PoCL


def test_the_stream_is_lazybufs_queue_on_opencl(pyopencl, opencl_device):
    buf = UnifiedBuffer(N, np.float32, device=opencl_device)
    assert buf.stream != 0
    assert buf.stream == buf.device.queue.int_ptr  # the PyOpenCL array runs on lazybuf's queue


def test_the_host_device_has_no_stream_and_needs_no_ordering(host_device):
    buf = UnifiedBuffer(N, np.float32, device=host_device)
    assert buf.stream == 0
    buf.order_after(0)  # host work is done when its call returns: nothing to wait for


def test_cuda_buffers_hand_out_their_stream():
    cuda = [d for d in lazybuf.get_accelerator().devices if d.backend == "cuda"]
    if not cuda:
        pytest.skip("no CUDA device (the CUDA driver test double runs this in scripts/test-python.sh)")
    buf = UnifiedBuffer(N, np.float32, device=cuda[0])
    assert buf.stream != 0
    buf.host[:] = 1
    buf.sync_to_device()
    buf.order_after(buf.stream)  # its own stream: a marker of it, harmless
    buf.order_after(0)  # the legacy default stream
    buf.order_after(np.int64(0))  # a NumPy integer is a raw handle too
    np.testing.assert_array_equal(buf.to_numpy(), np.ones(N, np.float32))


def _callers_fill(pyopencl, buf, told: bool) -> np.ndarray:
    cl = pyopencl
    lazybufs_queue = buf.device.queue
    mem = buf.device.data  # the buffer's cl_mem (a device read: SYNCHRONIZED)
    callers = cl.CommandQueue(lazybufs_queue.context)  # the caller's own in-order queue
    gate = cl.UserEvent(lazybufs_queue.context)
    cl.enqueue_fill_buffer(callers, mem, np.float32(7), 0, 4 * N, wait_for=[gate])
    callers.flush()
    buf.mark_device_dirty()  # the caller declares its write, as the contract asks
    if told:
        buf.order_after(callers)
    released = threading.Lock()

    def release():
        if released.acquire(blocking=False):
            gate.set_status(cl.command_execution_status.COMPLETE)

    # Told, the download waits for the fill: the gate opens from a timer while it waits.
    # Not told, the gate stays shut until the download is back: opened by a timer, the fill
    # could run first whenever this thread is held up past the timer (a loaded machine), and
    # the control would read 7s. (Its timer is only a fallback, so a download that wrongly
    # waits fails rather than hangs.)
    timer = threading.Timer(0.05 if told else 30.0, release)
    timer.start()
    try:
        return buf.to_numpy()
    finally:
        timer.cancel()
        release()
        callers.finish()


def test_order_after_a_callers_queue_on_pocl(pyopencl, opencl_device):
    buf = UnifiedBuffer(N, np.float32, device=opencl_device)
    buf.host[:] = 1
    np.testing.assert_array_equal(_callers_fill(pyopencl, buf, told=True), np.full(N, 7, np.float32))


def test_without_order_after_the_download_does_not_wait_for_the_callers_queue(pyopencl, opencl_device):
    # The control: without the call lazybuf cannot know of the caller's queue, so its download
    # runs before the held fill (this is what makes the test above mean something).
    buf = UnifiedBuffer(N, np.float32, device=opencl_device)
    buf.host[:] = 1
    np.testing.assert_array_equal(_callers_fill(pyopencl, buf, told=False), np.ones(N, np.float32))


@pytest.mark.parametrize(
    "stream,error,match",
    [
        ("queue", TypeError, "expected a stream"),
        (True, TypeError, "bool"),
        (-1, ValueError, "non-negative"),
        (object(), TypeError, "got object"),
    ],
)
def test_bad_streams_are_refused(opencl_device, stream, error, match):
    buf = UnifiedBuffer(N, np.float32, device=opencl_device)
    buf.sync_to_device()
    with pytest.raises(error, match=match):
        buf.order_after(stream)


def test_a_queue_of_another_context_is_refused(pyopencl, opencl_device):
    buf = UnifiedBuffer(N, np.float32, device=opencl_device)
    buf.sync_to_device()
    other = pyopencl.CommandQueue(pyopencl.Context(devices=[buf.device.queue.device]))
    with pytest.raises(ValueError, match="another context"):
        buf.order_after(other)


def test_a_released_buffer_refuses_both(opencl_device):
    buf = UnifiedBuffer(N, np.float32, device=opencl_device)
    buf.release()
    with pytest.raises(ValueError, match="released"):
        buf.stream  # noqa: B018
    with pytest.raises(ValueError, match="released"):
        buf.order_after(0)


class _CudaStreamObject:
    """An object of the CUDA stream protocol (as CUDA Python's and CuPy's streams are)."""

    def __init__(self, handle: int) -> None:
        self.handle = handle

    def __cuda_stream__(self):
        return (0, self.handle)


def test_a_stream_object_of_another_runtime_is_refused(opencl_device):
    """A hostile pass (2026-11-27): a CUDA stream object given for an OpenCL buffer was used as
    a cl_command_queue and crashed the interpreter. Objects say their runtime: refused by name."""
    buf = UnifiedBuffer(N, np.float32, device=opencl_device)
    buf.host[:] = 1
    buf.sync_to_device()
    with pytest.raises(TypeError, match="is a CUDA stream, and this buffer's device .* is not a CUDA device"):
        buf.order_after(_CudaStreamObject(0x1234))
    np.testing.assert_array_equal(buf.to_numpy(), np.ones(N, np.float32))


def test_an_opencl_queue_is_refused_for_a_cuda_buffer(pyopencl, opencl_device):
    cuda = [d for d in lazybuf.get_accelerator().devices if d.backend == "cuda"]
    if not cuda:
        pytest.skip("no CUDA device (the CUDA driver test double runs this in scripts/test-python.sh)")
    buf = UnifiedBuffer(N, np.float32, device=cuda[0])
    buf.host[:] = 1
    buf.sync_to_device()
    queue = pyopencl.CommandQueue(UnifiedBuffer(N, np.float32, device=opencl_device).device.queue.context)
    with pytest.raises(TypeError, match="is an OpenCL queue .* is a CUDA device"):
        buf.order_after(queue)
    buf.order_after(_CudaStreamObject(buf.stream))  # its own stream, through the protocol
