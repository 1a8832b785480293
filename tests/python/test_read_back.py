"""Read-backs move the data once: `to_numpy()`, `to_numpy(out=)` and
`copy_to()` of a buffer whose device copy is newer copy the device copy straight into the
array and leave the buffer as it was (the host copy stale, the state unchanged); a buffer whose
host copy is wanted after such a read (read-modify-write on one buffer) updates the host copy
first from then on. Every test means the same on every device: downloads are counted as
`device_to_host_copies + zero_copy_syncs` (the host device's download is a zero-copy sync), in
deltas around one call that uploads nothing.
"""

import numpy as np
import pytest

from lazybuf import BufferState, UnifiedBuffer

N = 1000


@pytest.fixture(params=["host", "opencl-copied", "opencl-aliased", "cuda"])
def device(request):
    """The host device (zero-copy), PoCL below its zero-copy size (its own memory) and above
    it (aliased), and the CUDA test double where it is installed."""
    if request.param == "host":
        return request.getfixturevalue("host_device")
    if request.param == "cuda":
        import lazybuf

        found = [d for d in lazybuf.get_accelerator().devices if d.backend == "cuda"]
        if not found:
            pytest.skip("no CUDA device")
        return found[0]
    return request.getfixturevalue("opencl_device")


@pytest.fixture
def n(request, device):
    # PoCL aliases host blocks from 4 MiB (test_interop.py): a buffer of 1M float32 there.
    return (1 << 20) if "aliased" in request.node.callspec.id else N


def downloads(buf) -> int:
    stats = buf.transfer_stats()
    return stats["device_to_host_copies"] + stats["zero_copy_syncs"]


def device_dirty(device, n) -> tuple[UnifiedBuffer, np.ndarray]:
    """A buffer whose device copy is current and host copy stale (DEVICE_DIRTY)."""
    data = np.arange(n, dtype=np.float32)
    buf = UnifiedBuffer(n, np.float32, device=device)
    buf.copy_from(data)
    buf.sync_to_device()
    buf.mark_device_dirty()
    assert buf.state == BufferState.DEVICE_DIRTY
    return buf, data


def test_to_numpy_of_a_newer_device_copy_downloads_once_and_changes_no_state(device, n):
    buf, data = device_dirty(device, n)
    before = downloads(buf)
    out = buf.to_numpy()
    np.testing.assert_array_equal(out, data)
    assert downloads(buf) == before + 1
    assert buf.state == BufferState.DEVICE_DIRTY
    out[:] = -1  # the array is the caller's own
    np.testing.assert_array_equal(buf.to_numpy(), data)
    assert downloads(buf) == before + 2  # the host copy is still stale: one more download
    buf.sync_to_host()  # now the host copy is current: a read-back moves no device bytes
    assert buf.state == BufferState.SYNCHRONIZED
    settled = downloads(buf)
    np.testing.assert_array_equal(buf.to_numpy(), data)
    assert downloads(buf) == settled


def test_to_numpy_out_fills_the_callers_array(device, n):
    buf, data = device_dirty(device, n)
    out = np.full(n, -1, np.float32)
    before = downloads(buf)
    assert buf.to_numpy(out=out) is out
    np.testing.assert_array_equal(out, data)
    assert downloads(buf) == before + 1
    assert buf.state == BufferState.DEVICE_DIRTY
    # A current host copy: copied from, no download.
    buf.sync_to_host()
    out[:] = -1
    settled = downloads(buf)
    assert buf.to_numpy(out=out) is out
    np.testing.assert_array_equal(out, data)
    assert downloads(buf) == settled


def test_copy_to_an_array_of_the_same_dtype_downloads_straight_into_it(device, n):
    buf, data = device_dirty(device, n)
    out = np.zeros(n, np.float32)
    before = downloads(buf)
    buf.copy_to(out)
    np.testing.assert_array_equal(out, data)
    assert downloads(buf) == before + 1
    assert buf.state == BufferState.DEVICE_DIRTY


def test_read_modify_write_on_one_buffer_settles_on_one_download_per_batch(device, n):
    """A host write after a direct read has to download the host copy: from then on the
    buffer updates its host copy at the read-back instead, so each later batch downloads once
    (and the next host write is free)."""
    buf = UnifiedBuffer(n, np.float32, device=device)
    per_batch = []
    for i in range(4):
        start = downloads(buf)
        buf.host[:] = i  # read-modify-write: `.host` is a host write of the current data
        host_downloads = downloads(buf) - start
        buf.device  # (an upload: a zero-copy sync where the device aliases the host block)
        buf.mark_device_dirty()
        start = downloads(buf)
        np.testing.assert_array_equal(buf.to_numpy(), np.full(n, i, np.float32))
        per_batch.append(host_downloads + downloads(buf) - start)
        expected = BufferState.DEVICE_DIRTY if i == 0 else BufferState.SYNCHRONIZED
        assert buf.state == expected, i
    assert per_batch == [1, 2, 1, 1]


def test_a_read_back_of_a_new_or_released_buffer(device, n):
    empty = UnifiedBuffer(0, np.float32, device=device)
    assert empty.to_numpy(out=np.empty(0, np.float32)).shape == (0,)
    fresh = UnifiedBuffer(n, np.float32, device=device)
    out = np.full(n, 3, np.float32)
    fresh.to_numpy(out=out)  # nothing written yet: zeros
    assert not out.any()
    fresh.release()
    with pytest.raises(ValueError, match="released"):
        fresh.to_numpy(out=out)


def test_to_numpy_out_into_the_buffers_own_host_view(device, n):
    buf = UnifiedBuffer(n, np.float32, device=device)
    host = buf.host  # a host write: the host copy is current
    host[:] = 5
    assert buf.to_numpy(out=host) is host
    assert (host == 5).all()


OUT_ERRORS = [
    (lambda: [0.0] * 4, TypeError, r"to_numpy: expected a NumPy array of shape \(4,\) to copy into, got list"),
    (lambda: np.zeros(5, np.float32), ValueError, r"to_numpy: expected an array of shape \(4,\), got shape \(5,\)"),
    (lambda: np.zeros((2, 2), np.float32), ValueError, r"got shape \(2, 2\)"),
    (lambda: np.zeros(4, np.float64), TypeError, r"to_numpy: expected out of dtype float32, got float64"),
    (lambda: np.zeros(4, ">f4"), TypeError, r"expected out of dtype float32, got >f4"),
    (lambda: np.zeros(8, np.float32)[::2], ValueError, r"to_numpy: expected a C-contiguous out array"),
    (lambda: np.zeros(4, np.float32), ValueError, r"to_numpy: expected a writable array, got a read-only one"),
]


@pytest.mark.parametrize(
    "make,error,match",
    OUT_ERRORS,
    ids=["list", "short", "2-d", "float64", "big-endian", "strided", "read-only"],
)
def test_to_numpy_out_bad_arrays_change_nothing(device, make, error, match):
    buf, _ = device_dirty(device, 4)
    out = make()
    if match.endswith("read-only one"):
        out.flags.writeable = False
    before = out.copy() if isinstance(out, np.ndarray) else list(out)
    stats = buf.transfer_stats()
    with pytest.raises(error, match=match):
        buf.to_numpy(out=out)
    np.testing.assert_array_equal(out, before)
    assert buf.state == BufferState.DEVICE_DIRTY
    assert buf.transfer_stats() == stats


def test_to_numpy_out_is_keyword_only():
    buf = UnifiedBuffer(4)
    with pytest.raises(TypeError):
        buf.to_numpy(np.zeros(4, np.float32))


# --- an assignment to every element overwrites: the stale host copy is not synced first ----


def _kernel_fill(buf: UnifiedBuffer, value: float) -> None:
    """A kernel's write of `value` into every element of the buffer's device copy, in place
    (`device_writable`: the host copy is stale afterwards, on every device)."""
    array = buf.device_writable
    if isinstance(array, np.ndarray):  # the host device
        array[:] = value
    elif hasattr(array, "fill"):  # a PyOpenCL array, on lazybuf's queue
        array.fill(value)
    else:  # a DeviceMemoryView of the CUDA test double: its pointers are host memory
        import ctypes

        if "test double" not in array.device.name:
            pytest.skip("a kernel on a real CUDA device needs CuPy (its arrays have .fill)")
        array.synchronize()
        address = array.__cuda_array_interface__["data"][0]
        np.ctypeslib.as_array((ctypes.c_float * buf.size).from_address(address))[:] = value


@pytest.mark.parametrize("key", [slice(None), Ellipsis], ids=["colon", "ellipsis"])
@pytest.mark.parametrize(
    "make",
    [
        lambda data: data * 2,  # the buffer's dtype and shape
        lambda data: (data * 2).astype(np.float64),  # converted as NumPy's assignment converts
        lambda data: (data * 2)[::-1].copy()[::-1],  # not contiguous
        lambda data: np.float32(5),  # a number, broadcast
        lambda data: 5,
    ],
    ids=["same", "float64", "strided", "numpy-scalar", "int"],
)
def test_assigning_every_element_of_a_stale_host_copy_downloads_nothing(device, n, key, make):
    """`buf[:] = x` reads none of the old bytes: the host copy is overwritten where `.host`
    would sync it from the device first (SYCL's `no_init`); then the device copy is stale."""
    buf, data = device_dirty(device, n)
    value = make(data)
    before = downloads(buf)
    buf[key] = value
    assert downloads(buf) == before
    assert buf.state == BufferState.HOST_DIRTY
    expected = np.broadcast_to(np.asarray(value, dtype=np.float32), (n,))
    np.testing.assert_array_equal(buf.to_numpy(), expected)
    buf.sync_to_device()  # the device copy gets the assigned bytes
    buf.mark_device_dirty()
    np.testing.assert_array_equal(buf.to_numpy(), expected)


@pytest.mark.parametrize(
    "value, error",
    [
        (lambda n: np.zeros(n + 1, np.float32), ValueError),  # no broadcast to the shape
        (lambda n: np.array(["x"] * n), ValueError),  # no conversion to float32
    ],
    ids=["shape", "strings"],
)
def test_a_whole_assignment_that_fails_changes_nothing(device, n, value, error):
    buf, data = device_dirty(device, n)
    before = downloads(buf)
    with pytest.raises(error):
        buf[:] = value(n)
    assert downloads(buf) == before
    assert buf.state == BufferState.DEVICE_DIRTY
    np.testing.assert_array_equal(buf.to_numpy(), data)


@pytest.mark.parametrize(
    "dtype, value",
    [
        (np.float32, 2.5),
        (np.int16, -3),
        (np.uint8, np.uint8(200)),
        (np.int32, 3.9),  # truncated, as NumPy's assignment does
        (np.complex64, 1 - 2j),
        (np.float16, 1.0 / 3.0),
        (np.int64, np.int8(-1)),
        (np.float64, 0.0),  # zero bytes: a memset
    ],
    ids=["f32", "i16", "u8", "f-to-i", "c64", "f16", "i8-to-i64", "zero"],
)
def test_assigning_a_number_to_every_element_matches_numpy(device, dtype, value):
    """A number assigned to every element is converted as NumPy converts it, and written over
    the host copy without an array of the buffer's size (the element's bytes repeated)."""
    shape = (3, 37)
    buf = UnifiedBuffer(shape, dtype, device=device)
    expected = np.zeros(shape, dtype)
    buf.copy_from(expected)
    buf.sync_to_device()
    buf.mark_device_dirty()
    before = downloads(buf)
    buf[...] = value
    expected[...] = value
    assert downloads(buf) == before
    np.testing.assert_array_equal(buf.to_numpy(), expected)
    assert buf.to_numpy().tobytes() == expected.tobytes()


@pytest.mark.parametrize("value, error", [(300, OverflowError), (-1, OverflowError)], ids=["over", "under"])
def test_a_number_that_does_not_convert_changes_nothing(device, n, value, error):
    buf = UnifiedBuffer(n, np.uint8, device=device)
    data = np.arange(n, dtype=np.uint8)
    buf.copy_from(data)
    buf.sync_to_device()
    buf.mark_device_dirty()
    with pytest.raises(error):
        buf[:] = value
    assert buf.state == BufferState.DEVICE_DIRTY
    np.testing.assert_array_equal(buf.to_numpy(), data)


def test_assigning_a_number_to_every_element_makes_no_array_of_the_buffers_size(device):
    """(It made one of the buffer's size before: peak host memory twice the buffer's.)"""
    import tracemalloc

    n = 4 << 20
    buf = UnifiedBuffer(n, np.uint8, device=device)
    buf.copy_from(np.ones(n, np.uint8))
    buf.sync_to_device()
    buf.mark_device_dirty()
    tracemalloc.start()
    try:
        buf[:] = 9
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < n // 8, peak  # NumPy's allocations are traced; lazybuf's host block is not
    assert (buf.to_numpy() == 9).all()


def test_assigning_a_view_of_the_buffers_own_stale_host_copy_sees_the_sync(device, n):
    """NumPy's assignment reads the view after `.host` synced the block it views: the kernel's
    values, not the stale bytes the view showed before."""
    buf = UnifiedBuffer(n, np.float32, device=device)
    buf.copy_from(np.arange(n, dtype=np.float32))
    stale = buf.host_readonly
    _kernel_fill(buf, 7)
    buf[:] = stale[::-1]
    np.testing.assert_array_equal(buf.to_numpy(), np.full(n, 7, np.float32))


def test_a_partial_assignment_still_syncs_the_host_copy(device, n):
    buf, data = device_dirty(device, n)
    before = downloads(buf)
    buf[1:] = 0
    assert downloads(buf) == before + 1
    expected = np.zeros(n, np.float32)
    expected[0] = data[0]
    np.testing.assert_array_equal(buf.to_numpy(), expected)
