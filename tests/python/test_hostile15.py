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


@pytest.mark.parametrize("selector", one_selector_per_backend())
@pytest.mark.parametrize("stale_host", [False, True], ids=["host-current", "host-stale"])
def test_a_whole_assignment_whose_conversion_frees_the_buffer_raises_as_any_assignment(selector, stale_host):
    """`buf[:] = values` whose conversion ran `buf.free()`: the values went into the memory
    the buffer had before the free, which it then dropped (UNINITIALIZED, zeros, no error).
    The assignment through `.host` raised for the same thing; the one of every element, taken
    when the host copy is stale (or the checker is on), did not. Both raise now, whatever the
    state, and the buffer is as `free()` left it."""
    buf = UnifiedBuffer((N,), dtype=np.float32, device=selector)
    buf.copy_from(DATA)
    buf.sync_to_device()
    if stale_host:
        buf.mark_device_dirty()
    freed = []

    def free_once():
        if not freed:
            freed.append(True)
            buf.free()

    with pytest.raises(ValueError, match="freed while NumPy converted"):
        buf[:] = objects_converting_to(7, free_once)
    assert buf.state == BufferState.UNINITIALIZED
    np.testing.assert_array_equal(buf.to_numpy(), np.zeros(N, np.float32))
    # The buffer is usable, and the same assignment without the free keeps its values.
    buf[:] = objects_converting_to(7, lambda: None)
    np.testing.assert_array_equal(buf.to_numpy(), np.full(N, 7, np.float32))


@pytest.mark.parametrize("selector", one_selector_per_backend())
def test_a_whole_assignment_whose_conversion_releases_the_buffer_raises_released(selector):
    buf = UnifiedBuffer((N,), dtype=np.float32, device=selector)
    buf.copy_from(DATA)
    buf.sync_to_device()
    buf.mark_device_dirty()
    with pytest.raises(ValueError, match="released"):
        buf[:] = objects_converting_to(7, buf.release)


@pytest.mark.parametrize("selector", one_selector_per_backend())
@pytest.mark.parametrize("stale_host", [False, True], ids=["host-current", "host-stale"])
def test_a_whole_assignment_whose_conversion_uses_the_buffer_otherwise_keeps_the_values(selector, stale_host):
    """What held: a conversion that syncs the buffer (or, when the assignment overwrites a
    stale host copy, marks it) comes before the assignment, which then writes every element;
    both copies read the values. (A mark in the conversion of an assignment through a current
    host copy raises: `test_reentrant_conversions.py`.)"""
    actions = ("sync_to_device", "sync_to_host") + (("mark_device_dirty",) if stale_host else ())
    for action in actions:
        buf = UnifiedBuffer((N,), dtype=np.float32, device=selector)
        buf.copy_from(DATA)
        buf.sync_to_device()
        if stale_host:
            buf.mark_device_dirty()
        buf[:] = objects_converting_to(7, getattr(buf, action))
        np.testing.assert_array_equal(buf.to_numpy(), np.full(N, 7, np.float32), err_msg=action)
        buf.sync_to_device()
        buf.mark_device_dirty()  # nothing wrote the device copy: it must hold the values too
        np.testing.assert_array_equal(buf.to_numpy(), np.full(N, 7, np.float32), err_msg=action)


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
