"""The stream-ordered `.device` on CUDA against a hostile user (a pass of 2026-11-27, on the CUDA
driver test double): a failed upload, the objects `.device` hands out, NumPy's interfaces, fork,
and a CuPy array freed while an exception propagates. Each test failed before its fix.

Runs only with the test double loaded (LD_LIBRARY_PATH=target/cuda-double), whose fault hooks
make an upload fail where its stream runs it.
"""

import ctypes
import os
import random
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import lazybuf
from conftest import FAKE_CUPY, cuda_double
from lazybuf import BufferState, DeviceMemoryView, UnifiedBuffer

N = 1024
DATA = np.arange(N, dtype=np.float32)


@pytest.fixture(scope="module")
def double():
    device, lib = cuda_double()
    lib.lazybuf_cuda_double_fail_copy.argtypes = (ctypes.c_longlong,)
    yield device, lib
    lib.lazybuf_cuda_double_fail_copy(0)


def failing_upload(device, lib):
    """A buffer holding DATA whose `.device` upload fails on the stream (it is enqueued)."""
    buf = UnifiedBuffer(N, np.float32, device=device)
    buf.host[:] = DATA
    lib.lazybuf_cuda_double_fail_copy(1)
    return buf, buf.device


def test_a_cached_view_takes_the_current_upload_not_a_failed_one(double):
    device, lib = double
    buf, view = failing_upload(device, lib)
    with pytest.raises(RuntimeError):
        buf.sync_to_device()  # waits for the upload: its failure, undone
    buf.sync_to_device()  # succeeds: the device copy is current
    again = buf.device
    if isinstance(view, DeviceMemoryView):
        assert again is view  # the buffer's kept view, handed out again
        again.synchronize()  # raised the old failure before the fix
        assert again.__cuda_array_interface__["data"][0] == view.ptr
    np.testing.assert_array_equal(buf.to_numpy(), DATA)


def test_numpy_sees_a_failed_upload_instead_of_the_old_data(double):
    device, lib = double
    buf, _ = failing_upload(device, lib)
    buf.mark_device_dirty()  # a kernel "wrote" the copy that never arrived
    # NumPy drops a buffer-protocol error and tries __array_interface__: the failure must
    # still reach the caller, not the input as if it were the kernel's output.
    with pytest.raises(RuntimeError):
        np.asarray(buf)
    assert buf.state == BufferState.HOST_ONLY  # undone: the host holds the input again
    np.testing.assert_array_equal(np.asarray(buf), DATA)


def test_a_forked_child_does_not_undo_a_transfer_it_cannot_see(double):
    device, _ = double
    if not hasattr(os, "fork"):
        pytest.skip("no fork here")
    buf = UnifiedBuffer(N, np.float32, device=device)
    buf.host[:] = DATA
    view = buf.device  # upload in flight
    buf.mark_device_dirty()
    if isinstance(view, DeviceMemoryView):
        view.synchronize()  # done on the device, not yet settled by lazybuf
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: every call on the parent's device refuses, nothing is undone
        code = 0
        try:
            for _ in range(2):
                try:
                    buf.host  # noqa: B018
                    code |= 1  # a host read returned data the child cannot know
                except lazybuf.ForkedChildError:
                    pass
            if buf.state != BufferState.DEVICE_DIRTY:
                code |= 2
        finally:
            os.write(write, bytes([code]))
            os._exit(0)
    os.close(write)
    code = os.read(read, 1)
    os.waitpid(pid, 0)
    assert code == b"\x00", f"child: {code!r} (1: a host read returned data, 2: the state was undone)"
    np.testing.assert_array_equal(buf.to_numpy(), DATA)


FAKE_CUPY_RAISE = FAKE_CUPY + r"""
import numpy as np
import lazybuf
d = [d for d in lazybuf.get_accelerator().devices if d.backend == "cuda"][0]
def kernel(array, scale):
    pass
for _ in range(3):
    try:
        # The CuPy array is a temporary freed while the ZeroDivisionError propagates.
        kernel(lazybuf.UnifiedBuffer(4, np.float32, device=d).device, 1 / 0)
    except ZeroDivisionError:
        pass
print("ok")
"""


def test_a_cupy_array_freed_while_an_exception_propagates_keeps_the_exception(double):
    """The owner's drop orders lazybuf after CuPy by calling CuPy: never while an exception is
    set (the interpreter crashed, or the user's error became a SystemError). A child process
    with a stand-in CuPy module (lazybuf probes for CuPy once per process)."""
    done = subprocess.run([sys.executable, "-c", FAKE_CUPY_RAISE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.strip() == "ok", done.stdout + done.stderr[-2000:]


def test_threads_sharing_a_stream_get_each_failure_at_the_transfer_that_failed(double):
    """A failure the double reports to the next event recorded on the stream reaches the copy
    that failed, also when four threads' buffers share the stream (the tenth hostile pass: a
    failed upload kept as a success returned the double's garbage with no error, about 800
    times in 5 s, while another thread got an error for a copy that had succeeded). Only
    blocking calls, beside a thread recording markers on the same stream; the stream's
    enqueue and its event's record are one step, under one lock per raw stream
    (cuda/memory.rs)."""
    device, lib = double
    wrong, raised, armed = [], [0], [0]
    stop = time.monotonic() + 1.5
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)

    def worker(k):
        rng = random.Random(k)
        buf = UnifiedBuffer(1024, np.int32, device=device)
        # 1.5 s, and on until an injected failure was raised (a loaded machine may arm
        # none in 1.5 s), up to a minute.
        while time.monotonic() < stop or (raised[0] == 0 and time.monotonic() < stop + 60):
            value = rng.randrange(1, 1 << 30)
            if k == 0 and rng.random() < 0.3:
                lib.lazybuf_cuda_double_fail_copy(1)
                armed[0] += 1
            try:  # a failure is raised by the call that settles it (with the checker: any)
                buf.host[:] = value
                buf.sync_to_device()
                buf.mark_device_dirty()
                back = buf.to_numpy()
            except RuntimeError:
                raised[0] += 1
                continue
            if not (back == value).all():
                wrong.append((k, hex(int(back[0]) & 0xFFFFFFFF), value))

    def markers():
        # Events recorded on the same stream with no command of their own: a marker for
        # `order_after` of the stream's raw handle (wrapped anew each time) and the device's
        # synchronize (the eleventh pass: each took other threads' copy failures, 900 and 77
        # wrong reads in 3 s).
        other = UnifiedBuffer(16, np.int32, device=device)
        while time.monotonic() < stop:
            try:
                other.order_after(other.stream)
                device.synchronize()
            except RuntimeError:
                pass

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    threads.append(threading.Thread(target=markers))
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(switch)
        lib.lazybuf_cuda_double_fail_copy(0)
    assert armed[0] > 0 and raised[0] > 0
    assert not wrong, f"{len(wrong)} reads returned wrong bytes without an error: {wrong[:3]}"


FAKE_CUPY_NO_BFLOAT16 = FAKE_CUPY.replace(
    "    def __init__(self, shape, dtype, memptr=None):\n",
    "    def __init__(self, shape, dtype, memptr=None):\n"
    "        import numpy as np\n"
    "        if np.dtype(dtype).name == 'bfloat16':\n"
    "            raise TypeError(f'Unsupported dtype {np.dtype(dtype)}')\n",
) + r"""
import numpy as np, ml_dtypes, lazybuf
d = [d for d in lazybuf.get_accelerator().devices if d.backend == "cuda"][0]
b = lazybuf.UnifiedBuffer(8, ml_dtypes.bfloat16, device=d)
b.host[:] = 1
before = (str(b.state), b.transfer_stats()["host_to_device_copies"])
try:
    b.device
    print("returned")
except TypeError as err:
    print("raised", err)
after = (str(b.state), b.transfer_stats()["host_to_device_copies"])
f = lazybuf.UnifiedBuffer(8, np.float32, device=d)
f.host[:] = 2
f.device
print("unchanged" if before == after else f"changed {before} {after}", f.transfer_stats()["host_to_device_copies"])
"""


def test_a_device_object_cupy_cannot_make_is_refused_before_the_upload(double):
    """The tenth hostile pass: `.device` of a dtype CuPy refuses raised after the upload, so the
    failed call had made the device copy current and counted the copy. A stand-in CuPy that
    refuses bfloat16, in a child process (lazybuf probes for CuPy once per process)."""
    pytest.importorskip("ml_dtypes")
    done = subprocess.run([sys.executable, "-c", FAKE_CUPY_NO_BFLOAT16], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.split("\n")
    assert lines[0].startswith("raised Unsupported dtype bfloat16"), done.stdout
    assert lines[1] == "unchanged 1", done.stdout
