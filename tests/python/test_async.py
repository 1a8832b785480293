"""Asynchronous syncs: ``sync_to_device_async()`` / ``sync_to_host_async()`` return a
``Transfer`` at once, which can be polled, waited on, or awaited without blocking asyncio's
event loop.

A transfer is held in flight for real, not simulated: on PoCL by a marker that waits on a
PyOpenCL user event, enqueued on lazybuf's own in-order queue (every later command waits for
it); through the CUDA driver test double by its `hold` hook (no stream starts a command).
"""

import asyncio
import ctypes
import threading

import numpy as np
import pytest

import lazybuf
from lazybuf import BufferState, Transfer, UnifiedBuffer

N = 4096  # float32 elements: 16 KiB, a real (not aliased) copy on PoCL


def filled(device, value=1.5) -> UnifiedBuffer:
    buf = UnifiedBuffer(N, np.float32, device=device)
    buf.host[:] = value
    return buf


@pytest.fixture(params=["host", "opencl", "cuda"])
def device(request):
    if request.param == "host":
        return request.getfixturevalue("host_device")
    if request.param == "opencl":
        return request.getfixturevalue("opencl_device")
    cuda = [d for d in lazybuf.get_accelerator().devices if d.backend == "cuda"]
    if not cuda:
        pytest.skip("no CUDA device (the CUDA driver test double runs these in scripts/test-python.sh)")
    return cuda[0]


def test_an_async_sync_returns_a_transfer_and_ends_synchronized(device):
    buf = filled(device)
    transfer = buf.sync_to_device_async()
    assert isinstance(transfer, Transfer)
    # In flight or not, the buffer reports the state it will have.
    assert buf.state == BufferState.SYNCHRONIZED
    transfer.wait()
    assert transfer.is_complete()
    buf.mark_device_dirty()
    back = buf.sync_to_host_async()
    back.wait()
    np.testing.assert_array_equal(buf.to_numpy(), np.full(N, 1.5, np.float32))
    assert "complete" in repr(back)


def test_await_an_async_sync(device):
    buf = filled(device, 2.0)

    async def main():
        await buf.sync_to_device_async()
        assert buf.state == BufferState.SYNCHRONIZED
        buf.mark_device_dirty()
        await buf.sync_to_host_async()
        return buf.to_numpy()

    np.testing.assert_array_equal(asyncio.run(main()), np.full(N, 2.0, np.float32))


def test_a_current_copy_needs_no_transfer(device):
    buf = filled(device)
    buf.sync_to_device()
    before = buf.transfer_stats()["host_to_device_copies"]
    transfer = buf.sync_to_device_async()
    assert transfer.is_complete()
    assert asyncio.run(_await(transfer)) is None
    assert buf.transfer_stats()["host_to_device_copies"] == before


async def _await(transfer):
    return await transfer


def _run_while_held(start, hold, release) -> tuple[int, Transfer]:
    """Starts a transfer while `hold()` keeps it from running, then awaits it in an event loop
    that also runs a ticker; `release()` is called from the loop after a few ticks. Returns
    the ticks counted while the transfer was awaited, and the transfer."""
    released = threading.Lock()

    def release_once():
        if released.acquire(blocking=False):
            release()

    hold()
    transfer = start()
    assert not transfer.is_complete(), "the held transfer completed"
    # If awaiting blocked the loop, the ticker would never release the hold: a timer does,
    # so such a bug fails the tick count below instead of hanging the suite. (Generous: a
    # loaded machine that took longer than the timer to run 5 ticks failed the count.)
    fallback = threading.Timer(20.0, release_once)
    fallback.start()

    async def main():
        ticks = 0
        stop = asyncio.Event()

        async def ticker():
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                if ticks == 5:
                    release_once()
                await asyncio.sleep(0.005)

        task = asyncio.create_task(ticker())
        await transfer
        stop.set()
        await task
        return ticks

    try:
        return asyncio.run(main()), transfer
    finally:
        fallback.cancel()


def test_awaiting_does_not_block_the_event_loop_on_pocl(pyopencl, opencl_device):
    buf = filled(opencl_device, 3.0)
    queue = UnifiedBuffer(1, np.float32, device=opencl_device).device.queue  # lazybuf's queue
    gate = pyopencl.UserEvent(queue.context)
    ticks, transfer = _run_while_held(
        buf.sync_to_device_async,
        hold=lambda: pyopencl.enqueue_marker(queue, wait_for=[gate]),
        release=lambda: gate.set_status(pyopencl.command_execution_status.COMPLETE),
    )
    assert ticks >= 5, "the event loop did not run while the transfer was awaited"
    assert transfer.is_complete()
    buf.mark_device_dirty()
    np.testing.assert_array_equal(buf.to_numpy(), np.full(N, 3.0, np.float32))


def _cuda_double():
    try:
        lib = ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_NOLOAD if hasattr(ctypes, "RTLD_NOLOAD") else 4)
        return lib.lazybuf_cuda_double_hold
    except (OSError, AttributeError):
        return None


def test_awaiting_does_not_block_the_event_loop_on_the_cuda_double(device):
    if device.backend != "cuda":
        pytest.skip("CUDA only")
    hold = _cuda_double()
    if hold is None:
        pytest.skip("a real CUDA driver: transfers cannot be held from a test")
    hold.argtypes = [ctypes.c_longlong]
    buf = filled(device, 4.0)
    ticks, transfer = _run_while_held(buf.sync_to_device_async, hold=lambda: hold(1), release=lambda: hold(0))
    assert ticks >= 5, "the event loop did not run while the transfer was awaited"
    buf.mark_device_dirty()
    np.testing.assert_array_equal(buf.to_numpy(), np.full(N, 4.0, np.float32))


def test_wait_lets_other_threads_run(pyopencl, opencl_device):
    buf = filled(opencl_device)
    queue = UnifiedBuffer(1, np.float32, device=opencl_device).device.queue
    gate = pyopencl.UserEvent(queue.context)
    pyopencl.enqueue_marker(queue, wait_for=[gate])
    transfer = buf.sync_to_device_async()
    released = threading.Event()

    def release():
        released.set()
        gate.set_status(pyopencl.command_execution_status.COMPLETE)

    # wait() releases the GIL: the releasing thread runs while this one waits.
    timer = threading.Timer(0.05, release)
    timer.start()
    transfer.wait()
    timer.join()
    assert released.is_set() and transfer.is_complete()


def test_async_syncs_of_a_released_buffer_are_refused():
    buf = UnifiedBuffer(4, np.float32)
    buf.release()
    with pytest.raises(ValueError, match="released"):
        buf.sync_to_device_async()
    with pytest.raises(ValueError, match="released"):
        buf.sync_to_host_async()


def test_awaiting_outside_an_event_loop_is_an_error():
    transfer = filled("host").sync_to_device_async()
    with pytest.raises(RuntimeError, match="no running event loop"):
        transfer.__await__()


@pytest.mark.parametrize("end", ["del buf", "buf.release()", "buf.free()"], ids=["drop", "release", "free"])
@pytest.mark.parametrize("backend", ["opencl", "cuda"])
def test_dropping_a_buffer_with_a_transfer_in_flight_waits_without_the_gil(backend, end):
    """The last drop of a buffer waits for its transfers in flight: with the GIL released, so
    another thread runs meanwhile, one that must act for the transfer to finish included. (It
    waited with the GIL held, and such a program hung.) In a subprocess, so a hang fails."""
    if backend == "cuda":
        if not any(d.backend == "cuda" for d in lazybuf.get_accelerator().devices):
            pytest.skip("no CUDA device (the CUDA driver test double runs these in scripts/test-python.sh)")
        if _cuda_double() is None:
            pytest.skip("a real CUDA driver: transfers cannot be held from a test")
        hold = """
lib = ctypes.CDLL("libcuda.so.1")
lib.lazybuf_cuda_double_hold.argtypes = [ctypes.c_longlong]
hold, release = (lambda: lib.lazybuf_cuda_double_hold(1)), (lambda: lib.lazybuf_cuda_double_hold(0))
"""
    else:
        pytest.importorskip("pyopencl")
        if not any(d.backend == "opencl" for d in lazybuf.get_accelerator().devices):
            pytest.skip("no OpenCL device")
        hold = """
import pyopencl
queue = UnifiedBuffer(1, np.float32, device=dev).device.queue
gate = pyopencl.UserEvent(queue.context)
hold = lambda: pyopencl.enqueue_marker(queue, wait_for=[gate])
release = lambda: gate.set_status(pyopencl.command_execution_status.COMPLETE)
"""
    code = f"""
import ctypes, threading, time
import numpy as np
import lazybuf
from lazybuf import UnifiedBuffer
dev = [d for d in lazybuf.get_accelerator().devices if d.backend == "{backend}"][0]
{hold}
buf = UnifiedBuffer({N}, np.float32, device=dev)
buf.host[:] = 1.5
hold()
transfer = buf.sync_to_device_async()
del transfer
def releaser():
    time.sleep(0.2)  # the main thread is in the drop's wait by then
    release()
threading.Thread(target=releaser).start()
{end}
print("dropped")
"""
    import subprocess
    import sys

    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the drop waited for its transfer with the GIL held: the thread to release it never ran")
    assert done.returncode == 0, done.stderr
    assert "dropped" in done.stdout
