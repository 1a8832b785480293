"""The coherence checker from Python: `lazybuf.set_checking`, `lazybuf.checking()`,
`LAZYBUF_CHECK=1`, and `lazybuf.CoherenceError`.

The seeds' pattern: a host write, `.device` (a device read), a kernel that writes that array
in place, then `to_numpy()` with no `mark_device_dirty()`. On a device that does not alias
host memory, the host copy is silently stale; with checking on, the host read raises
CoherenceError instead, naming the missing call. The "kernel" is PyOpenCL's own fill (PoCL,
below its 4 MiB zero-copy size) or a write through the CUDA test double's device pointer
(device pointers are host allocations there).
"""

import ctypes
import os
import subprocess
import sys

import numpy as np
import pytest

import lazybuf
from conftest import _need
from lazybuf import BufferState, CoherenceError, DeviceMemoryView, UnifiedBuffer, get_accelerator

N = 1000  # 4 KB: below PoCL's zero-copy size, so the device copy is separate memory


@pytest.fixture
def checking():
    """Turns the checker on for the test, and back to what it was after."""
    before = lazybuf.checking()
    lazybuf.set_checking(True)
    yield
    lazybuf.set_checking(before)


@pytest.fixture
def not_checking():
    before = lazybuf.checking()
    lazybuf.set_checking(False)
    yield
    lazybuf.set_checking(before)


def _cuda_write(view: DeviceMemoryView, value: int) -> None:
    """A "kernel" on the CUDA test double: writes the device memory through its pointer."""
    assert "test double" in view.device.name, "only the test double's pointers are host memory"
    get_accelerator().synchronize()  # the upload has landed before the "kernel" runs
    interface = view.__cuda_array_interface__
    memory = (ctypes.c_int32 * N).from_address(interface["data"][0])
    np.ctypeslib.as_array(memory)[:] = value


def _kernel(array, value: int) -> None:
    """Writes `value` into every element of a device array, in place, as a kernel would."""
    if isinstance(array, DeviceMemoryView):
        _cuda_write(array, value)
    elif isinstance(array, np.ndarray):
        array[:] = value
    else:  # a PyOpenCL (or CuPy) array
        array.fill(value)


@pytest.fixture(params=["opencl", "cuda"])
def separate_device(request):
    """A device whose memory is not the host's: PoCL below 4 MiB, the CUDA test double."""
    if request.param == "opencl":
        request.getfixturevalue("pyopencl")
        return request.getfixturevalue("opencl_device")
    devices = [d for d in get_accelerator().devices if d.backend == "cuda"]
    if not devices:
        _need("cuda", "no CUDA device")
    if "test double" not in devices[0].name:
        try:
            import cupy  # noqa: F401
        except ImportError:
            pytest.skip("a real GPU without CuPy: no kernel to write the device copy with")
    return devices[0]


def _seed_pattern(device, mark: bool) -> UnifiedBuffer:
    buf = UnifiedBuffer(N, np.int32, device=device)
    buf.host[:] = 1  # host write
    _kernel(buf.device, 3)  # .device is a device read; the kernel writes it in place
    if mark:
        buf.mark_device_dirty()
    return buf


def test_the_switch():
    before = lazybuf.checking()
    try:
        lazybuf.set_checking(True)
        assert lazybuf.checking() is True
        lazybuf.set_checking(False)
        assert lazybuf.checking() is False
    finally:
        lazybuf.set_checking(before)
    assert issubclass(CoherenceError, RuntimeError)


def test_forgotten_mark_raises(checking, separate_device):
    buf = _seed_pattern(separate_device, mark=False)
    with pytest.raises(CoherenceError) as err:
        buf.to_numpy()
    message = str(err.value)
    assert "mark_device_dirty()" in message and ".device_writable" in message
    assert isinstance(err.value, lazybuf.BufferError)  # PyDotCompute's buffer-error base
    # The failed check changed nothing; the mark, late, still gets the kernel's data.
    assert buf.state == BufferState.SYNCHRONIZED
    buf.mark_device_dirty()
    np.testing.assert_array_equal(buf.to_numpy(), np.full(N, 3, np.int32))


def test_other_host_reads_check_too(checking, separate_device):
    buf = _seed_pattern(separate_device, mark=False)
    with pytest.raises(CoherenceError):
        buf.host_readonly
    with pytest.raises(CoherenceError):
        buf.sync_to_host()


def test_a_host_write_that_keeps_the_old_bytes_checks_too(checking, separate_device):
    """`.host` is a host write whose array holds the old bytes: a kernel's unmarked write is
    caught there as at a read (before, only reads checked: `buf.host[0] = 9` then lost the
    kernel's data silently). An overwrite of every element reads no old byte: not checked."""
    buf = _seed_pattern(separate_device, mark=False)
    with pytest.raises(CoherenceError):
        buf.host
    assert buf.state == BufferState.SYNCHRONIZED  # the failed check changed nothing
    buf.mark_device_dirty()
    buf.host[0] = 9
    expected = np.full(N, 3, np.int32)
    expected[0] = 9
    np.testing.assert_array_equal(buf.to_numpy(), expected)
    again = _seed_pattern(separate_device, mark=False)
    again[:] = 5  # every element: nothing to check
    np.testing.assert_array_equal(again.to_numpy(), np.full(N, 5, np.int32))


@pytest.mark.parametrize("handle", ["device", "device_writable"])
def test_a_kept_handle_written_again_after_a_mark_is_caught(checking, separate_device, handle):
    """A hostile pass (2026-11-27): `.device` taken once and kept, a kernel, the mark, a host
    read, then a second kernel through the same array without a second mark: the mark had
    ended the checker's watch, and `to_numpy()` returned the first kernel's data silently. The
    same with a kept `.device_writable` array."""
    buf = UnifiedBuffer(N, np.int32, device=separate_device)
    buf.host[:] = 1
    array = getattr(buf, handle)
    _kernel(array, 3)
    if handle == "device":
        buf.mark_device_dirty()
    np.testing.assert_array_equal(buf.host_readonly, np.full(N, 3, np.int32))  # the host updated
    assert buf.state == BufferState.SYNCHRONIZED
    _kernel(array, 7)  # the mark forgotten this time
    with pytest.raises(CoherenceError):
        buf.to_numpy()
    assert buf.state == BufferState.SYNCHRONIZED
    buf.mark_device_dirty()
    np.testing.assert_array_equal(buf.to_numpy(), np.full(N, 7, np.int32))


def test_correct_pattern_passes(checking, separate_device):
    buf = _seed_pattern(separate_device, mark=True)
    np.testing.assert_array_equal(buf.to_numpy(), np.full(N, 3, np.int32))
    # device_writable needs no mark.
    buf2 = UnifiedBuffer(N, np.int32, device=separate_device)
    buf2.host[:] = 1
    _kernel(buf2.device_writable, 4)
    np.testing.assert_array_equal(buf2.to_numpy(), np.full(N, 4, np.int32))
    # A device read that nobody writes passes the check.
    buf3 = UnifiedBuffer(N, np.int32, device=separate_device)
    buf3.host[:] = 5
    buf3.device
    np.testing.assert_array_equal(buf3.to_numpy(), np.full(N, 5, np.int32))


def test_checking_off_raises_nothing(not_checking, separate_device):
    buf = _seed_pattern(separate_device, mark=False)
    # The bug the checker exists for: the host copy is silently the old one.
    np.testing.assert_array_equal(buf.to_numpy(), np.full(N, 1, np.int32))


def test_host_device_aliases_so_nothing_is_raised(checking, host_device):
    buf = _seed_pattern(host_device, mark=False)
    np.testing.assert_array_equal(buf.to_numpy(), np.full(N, 3, np.int32))


def test_environment_turns_it_on():
    for value, expected in (("1", "True"), ("0", "False"), ("", "False")):
        env = {**os.environ, "LAZYBUF_CHECK": value}
        result = subprocess.run(
            [sys.executable, "-c", "import lazybuf; print(lazybuf.checking())"],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == expected, value
