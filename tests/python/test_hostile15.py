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
