"""What the fifteenth hostile pass (2026-11-28) found, each a test that failed before its fix.
Each means the same on every device (on the host device the copies are one memory).
"""

import ctypes
import subprocess
import sys

import numpy as np
import pytest

import lazybuf
from conftest import one_selector_per_backend
from lazybuf import BufferState, UnifiedBuffer

N = 8
DATA = np.arange(N, dtype=np.float32)


def objects_converting_to(value, action):
    """An array NumPy converts into float32 by calling each element's `__float__` (a
    structured dtype whose one field holds objects), running `action()` each time: user code
    inside a whole assignment's conversion."""

    class Element:
        def __float__(self):
            action()
            return float(value)

    return np.array([(Element(),) for _ in range(N)], dtype=[("a", "O")])


@pytest.fixture
def checking():
    before = lazybuf.checking()
    lazybuf.set_checking(True)
    yield
    lazybuf.set_checking(before)


def synchronized(selector):
    buf = UnifiedBuffer((N,), dtype=np.float32, device=selector)
    buf.copy_from(DATA)
    buf.sync_to_device()
    assert buf.state == BufferState.SYNCHRONIZED
    return buf


def device_bytes(buf):
    """What the device copy holds: declared current (nothing wrote it) and read back."""
    if buf.state in (BufferState.HOST_DIRTY, BufferState.HOST_ONLY):
        buf.sync_to_device()
    buf.mark_device_dirty()
    return buf.to_numpy()


@pytest.mark.parametrize("selector", one_selector_per_backend())
def test_a_whole_assignment_whose_conversion_frees_the_buffer_keeps_the_values(selector):
    """`buf[:] = values` over a stale host copy (an overwrite of every element, the checker
    on or off) whose conversion ran `buf.free()`: the values went into the memory the buffer
    had before the free, which it then dropped (UNINITIALIZED, zeros, no error). The values
    are converted before anything is written, so the free comes first: the memory the buffer
    holds when they are written gets them."""
    buf = synchronized(selector)
    buf.mark_device_dirty()
    freed = []

    def free_once():
        if not freed:
            freed.append(True)
            buf.free()

    buf[:] = objects_converting_to(7, free_once)
    assert freed
    assert buf.state == BufferState.HOST_ONLY
    np.testing.assert_array_equal(buf.to_numpy(), np.full(N, 7, np.float32))
    np.testing.assert_array_equal(device_bytes(buf), np.full(N, 7, np.float32))


@pytest.mark.parametrize("selector", one_selector_per_backend())
def test_a_whole_assignment_whose_conversion_releases_the_buffer_raises_released(selector):
    buf = UnifiedBuffer((N,), dtype=np.float32, device=selector)
    buf.copy_from(DATA)
    buf.sync_to_device()
    buf.mark_device_dirty()
    with pytest.raises(ValueError, match="released"):
        buf[:] = objects_converting_to(7, buf.release)


@pytest.mark.parametrize("selector", one_selector_per_backend())
def test_a_whole_assignment_whose_conversion_uses_the_buffer_otherwise_keeps_the_values(selector):
    """What held: a conversion that marks or syncs the buffer comes before the assignment,
    which then writes every element; both copies read the values."""
    for action in ("sync_to_device", "sync_to_host", "mark_device_dirty"):
        buf = synchronized(selector)
        buf.mark_device_dirty()
        buf[:] = objects_converting_to(7, getattr(buf, action))
        np.testing.assert_array_equal(buf.to_numpy(), np.full(N, 7, np.float32), err_msg=action)
        np.testing.assert_array_equal(device_bytes(buf), np.full(N, 7, np.float32), err_msg=action)


def counting_elements(actions):
    """An array whose conversion into float32 calls `actions[k]()` (if any) at the k-th
    element, then gives 50 + k; NumPy writes each element as it converts it, so an action
    sees the elements before it written."""
    calls = []

    class Element:
        def __float__(self):
            k = len(calls)
            calls.append(k)
            if k in actions:
                actions[k]()
            return 50.0 + k

    return np.array([(Element(),) for _ in range(4)], dtype=[("a", "O")])


@pytest.mark.parametrize("selector", one_selector_per_backend())
def test_an_assignment_that_fails_part_way_after_a_sync_leaves_no_copies_that_differ(selector):
    """`buf[0:4] = values` whose conversion syncs the buffer at the second element and fails
    at the third: NumPy had written the first two elements into the host copy, the second
    after the sync, and the assignment raised without settling: SYNCHRONIZED, the device copy
    without the second element (the host copy 51, the device copy 1). Now a failed assignment
    settles what it wrote too: whatever the host copy holds, the device copy matches it once
    synced."""
    buf = synchronized(selector)

    def fail():
        raise ValueError("the user's conversion fails")

    with pytest.raises(ValueError, match="conversion fails"):
        buf[0:4] = counting_elements({1: buf.sync_to_device, 2: fail})
    host = buf.to_numpy()
    np.testing.assert_array_equal(host[4:], DATA[4:])
    np.testing.assert_array_equal(device_bytes(buf), host)


@pytest.mark.parametrize("selector", one_selector_per_backend())
def test_a_host_read_in_the_middle_of_an_assignment_is_no_coherence_error(selector, checking):
    """With the checker on, `buf[0:4] = values` whose conversion hands out `.device` at the
    second element (a sync of the host copy as NumPy had written it so far) and reads the host
    copy at the third: the read compared the copies, found the second element NumPy had
    written since, and raised `CoherenceError` blaming a kernel's unmarked write (no kernel
    ran; another thread's `.device` and host read in the middle of an assignment did the same).
    The checker does not compare while lazybuf's own write through the host copy is landing;
    afterwards the host copy holds the values and is the current one."""
    buf = synchronized(selector)
    seen = []
    buf[0:4] = counting_elements({1: lambda: buf.device, 2: lambda: seen.append(buf.host_readonly[:4].copy())})
    np.testing.assert_array_equal(buf.to_numpy()[:4], [50, 51, 52, 53])
    np.testing.assert_array_equal(buf.to_numpy()[4:], DATA[4:])
    np.testing.assert_array_equal(device_bytes(buf), buf.to_numpy())
    assert len(seen) == 1


def _cuda_double_loaded():
    try:
        lib = ctypes.CDLL("libcuda.so.1", mode=getattr(ctypes, "RTLD_NOLOAD", 4))
        return lib.lazybuf_cuda_double_hold is not None
    except (OSError, AttributeError):
        return False


HOLDS = {
    "cuda": """
lib = ctypes.CDLL("libcuda.so.1")
lib.lazybuf_cuda_double_hold.argtypes = [ctypes.c_longlong]
hold, release = (lambda: lib.lazybuf_cuda_double_hold(1)), (lambda: lib.lazybuf_cuda_double_hold(0))
""",
    "opencl": """
import pyopencl
queue = UnifiedBuffer(1, np.float32, device=dev).device.queue
gate = pyopencl.UserEvent(queue.context)
hold = lambda: pyopencl.enqueue_marker(queue, wait_for=[gate])
release = lambda: gate.set_status(pyopencl.command_execution_status.COMPLETE)
""",
}

EXPORTS = {
    # A memoryview's export holds the memory; the buffer is released, then the view.
    "memoryview": ("m = memoryview(buf)", "buf.release()", "m.release()"),
    # __array_interface__'s memory stays with the buffer object; released, then dropped.
    "array_interface": ("d = buf.__array_interface__", "buf.release()", "del buf"),
    # The same after free(): the export holds the earlier memory.
    "memoryview_free": ("m = memoryview(buf)", "buf.free()", "m.release()"),
    # A DLPack consumer's deleter, which NumPy runs with the GIL held.
    "dlpack": ("a = np.from_dlpack(buf)", "buf.release()", "del a"),
}


@pytest.mark.parametrize("export", sorted(EXPORTS))
@pytest.mark.parametrize("backend", ["opencl", "cuda"])
def test_an_export_dropping_the_last_reference_with_a_transfer_in_flight_waits_without_the_gil(backend, export):
    """An export (a buffer-protocol view, an `__array_interface__` address) that outlived the
    buffer's `release()` or `free()` held the last reference to its memory; dropping it waited
    for the upload in flight with the GIL held, so the thread that was to let the upload
    finish never ran: the program hung (`Storage::drop_last` covered the buffer's own drop
    and `release()`, not these). In a subprocess, so a hang fails."""
    if not any(d.backend == backend for d in lazybuf.get_accelerator().devices):
        pytest.skip(f"no {backend} device")
    if backend == "cuda" and not _cuda_double_loaded():
        pytest.skip("a real CUDA driver: transfers cannot be held from a test")
    if backend == "opencl":
        pytest.importorskip("pyopencl")
    if backend == "cuda" and export == "dlpack":
        pytest.skip("NumPy imports no CUDA memory")
    take, give_up, drop = EXPORTS[export]
    code = f"""
import ctypes, threading, time
import numpy as np
import lazybuf
from lazybuf import UnifiedBuffer
dev = [d for d in lazybuf.get_accelerator().devices if d.backend == "{backend}"][0]
{HOLDS[backend]}
buf = UnifiedBuffer(4096, np.float32, device=dev)
buf.host[:] = 1.5
{take}
hold()
transfer = buf.sync_to_device_async()
del transfer
{give_up}
def releaser():
    time.sleep(0.2)  # the main thread is in the drop's wait by then
    release()
threading.Thread(target=releaser).start()
{drop}
print("dropped")
"""
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the export's drop waited for the transfer with the GIL held: the releasing thread never ran")
    assert done.returncode == 0, done.stderr
    assert "dropped" in done.stdout


def test_a_call_whose_reference_is_the_last_after_another_thread_released_the_buffer_waits_without_the_gil():
    """A method holds a reference to the buffer's memory for its call. Another thread's
    `release()` meanwhile left it the last one, and the method, returning with a transfer in
    flight (`sync_to_host_async()`), dropped it and waited for that transfer with the GIL
    held: the thread that was to let the transfer finish never ran, and the program hung.
    PoCL: PyOpenCL user events hold the queue (the first while the method waits for the
    buffer's lock, the second behind the transfer it enqueues). In a subprocess."""
    pytest.importorskip("pyopencl")
    if not any(d.backend == "opencl" for d in lazybuf.get_accelerator().devices):
        pytest.skip("no OpenCL device")
    code = """
import threading, time
import numpy as np, lazybuf, pyopencl
from lazybuf import UnifiedBuffer
dev = [d for d in lazybuf.get_accelerator().devices if d.backend == "opencl"][0]
queue = UnifiedBuffer(1, np.float32, device=dev).device.queue
gate1, gate2 = pyopencl.UserEvent(queue.context), pyopencl.UserEvent(queue.context)
buf = UnifiedBuffer(4096, np.float32, device=dev)  # 16 KiB: a copy of its own on PoCL
buf.copy_from(np.ones(4096, np.float32))
buf.sync_to_device()
buf.mark_device_dirty()
pyopencl.enqueue_marker(queue, wait_for=[gate1])
reader = threading.Thread(target=buf.to_numpy)  # holds the buffer's lock, behind gate1
reader.start()
time.sleep(0.2)
pyopencl.enqueue_marker(queue, wait_for=[gate2])
syncer = threading.Thread(target=buf.sync_to_host_async)  # waits for the lock; its download goes behind gate2
syncer.start()
time.sleep(0.2)
buf.release()
def releaser():
    time.sleep(0.2)
    gate1.set_status(pyopencl.command_execution_status.COMPLETE)
    time.sleep(0.3)
    gate2.set_status(pyopencl.command_execution_status.COMPLETE)
threading.Thread(target=releaser).start()
reader.join()
syncer.join()
print("returned")
"""
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the call's last reference waited for its transfer with the GIL held")
    assert done.returncode == 0, done.stderr
    assert "returned" in done.stdout
