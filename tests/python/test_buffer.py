"""UnifiedBuffer behaviour: element types, shapes, fill, copy_from, to_numpy, what moves.

The transfer counters (``transfer_stats()``) come from the Rust core and show what each
access really did, so these tests check copies, not only states.
"""

import numpy as np
import pytest

from conftest import collect
from lazybuf import BufferState, UnifiedBuffer

DTYPES = [
    np.float16,
    np.float32,
    np.float64,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.uint8,
    np.uint16,
    np.uint32,
    np.uint64,
    np.complex64,
    np.complex128,
]


@pytest.fixture(params=["host", "opencl"])
def device(request):
    if request.param == "opencl":
        return request.getfixturevalue("opencl_device")
    return request.getfixturevalue("host_device")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_every_numpy_dtype_round_trips(dtype, device):
    data = (np.arange(24) % 100).astype(dtype).reshape(2, 3, 4)
    if data.dtype.kind == "c":
        data = data - 1j * data[::-1].astype(dtype)  # distinct imaginary parts
    buf = UnifiedBuffer(data.shape, dtype, device=device)
    assert buf.dtype == np.dtype(dtype)
    assert buf.shape == (2, 3, 4) and buf.size == 24 and buf.ndim == 3
    assert buf.nbytes == data.nbytes
    buf.copy_from(data)
    buf.mark_device_dirty()  # device current, host stale: to_numpy must download
    out = buf.to_numpy()
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out, data)
    buf.fill(7)
    np.testing.assert_array_equal(buf.to_numpy(), np.full((2, 3, 4), 7, dtype=dtype))


def test_a_dtype_argument_is_resolved_anew_when_its_meaning_can_change():
    """The constructor remembers the last dtype argument only when nothing can change what it
    means (dtype objects, built-in types); a class whose `dtype` attribute NumPy reads is
    resolved on every call."""

    class Declared:
        dtype = np.dtype(np.float32)

    assert UnifiedBuffer(4, Declared).dtype == np.float32
    Declared.dtype = np.dtype(np.int16)
    assert UnifiedBuffer(4, Declared).dtype == np.int16
    for dtype in (np.float32, np.float32, np.int16, np.dtype("f8"), np.dtype("f8"), "u1", "u1", float, np.float32):
        assert UnifiedBuffer(4, dtype).dtype == np.dtype(dtype)


def test_bfloat16_with_ml_dtypes():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    buf = UnifiedBuffer(4, "bfloat16")
    assert buf.dtype == np.dtype(ml_dtypes.bfloat16)
    buf.copy_from(np.array([1.0, 2.0, 3.5, -1.0], dtype=ml_dtypes.bfloat16))
    np.testing.assert_array_equal(buf.to_numpy().astype(np.float32), [1.0, 2.0, 3.5, -1.0])
    assert buf.host.dtype == np.dtype(ml_dtypes.bfloat16)
    state = buf.state
    with pytest.raises(AttributeError, match="bfloat16 has no array-interface type string"):
        buf.__array_interface__  # noqa: B018 (NumPy's interface has no bfloat16 type string)
    assert buf.state == state
    buf.fill(0.5)
    assert buf.to_numpy().astype(np.float32).tolist() == [0.5] * 4
    buf2 = UnifiedBuffer(2, ml_dtypes.bfloat16)
    assert buf2.dtype == buf.dtype


def test_int_shape_and_defaults():
    buf = UnifiedBuffer(5)
    assert buf.shape == (5,)
    assert buf.dtype == np.float32
    assert len(buf) == 5
    assert UnifiedBuffer(np.int64(3)).shape == (3,)
    assert UnifiedBuffer([2, np.uint8(3)]).shape == (2, 3)


def test_a_new_buffer_allocates_nothing():
    buf = UnifiedBuffer((1 << 20,))
    assert buf.state == BufferState.UNINITIALIZED
    assert buf.transfer_stats()["allocations"] == 0
    assert not buf.is_pinned


def test_empty_and_scalar_buffers(device):
    empty = UnifiedBuffer((0, 3), np.float64, device=device)
    assert empty.nbytes == 0
    assert empty.host.shape == (0, 3)
    empty.copy_from(np.zeros((0, 3)))
    assert empty.to_numpy().shape == (0, 3)
    empty.device
    empty.fill(1.0)

    scalar = UnifiedBuffer((), np.int32, device=device)
    assert scalar.size == 1 and scalar.ndim == 0
    scalar.fill(42)
    assert scalar.to_numpy() == 42
    assert scalar.host.shape == ()
    with pytest.raises(TypeError, match="0-d"):
        len(scalar)


def test_host_view_is_zero_copy_and_cached():
    buf = UnifiedBuffer((8,), np.int64)
    view = buf.host
    assert buf.host is view
    assert view.base is not None and type(view.base).__name__ == "MemoryOwner"
    view[:] = np.arange(8)
    np.testing.assert_array_equal(buf.host_readonly, np.arange(8))
    assert not buf.host_readonly.flags.writeable
    assert buf.host_readonly.__array_interface__["data"][0] == view.__array_interface__["data"][0]


def test_a_reshaped_cached_view_is_not_handed_out_again():
    buf = UnifiedBuffer((4, 4))
    view = buf.host
    view.shape = (16,)  # in-place metadata change by the user
    assert buf.host.shape == (4, 4)
    assert buf.host is not view
    readonly = buf.host_readonly
    with pytest.raises(ValueError):
        readonly.flags.writeable = True
    view2 = buf.host
    view2.flags.writeable = False
    assert buf.host.flags.writeable


def test_host_write_then_device_read_uploads_once_on_opencl(opencl_device):
    data = np.arange(256, dtype=np.float32)  # 1 KiB: small buffers are copied, not aliased
    buf = UnifiedBuffer(data.shape, np.float32, device=opencl_device)
    buf.host[:] = data
    buf.sync_to_device()
    buf.sync_to_device()  # already current: nothing moves
    stats = buf.transfer_stats()
    assert stats["host_to_device_copies"] == 1
    assert stats["host_to_device_bytes"] == data.nbytes
    buf.host_readonly  # reading the host copies nothing either
    assert buf.transfer_stats()["device_to_host_copies"] == 0
    buf.mark_device_dirty()
    np.testing.assert_array_equal(buf.to_numpy(), data)
    assert buf.transfer_stats()["device_to_host_copies"] == 1


def test_pyopencl_arrays_of_changing_shapes_have_their_own_layout(pyopencl, opencl_device):
    """PyOpenCL arrays share shape and stride tuples with the last array of the same shape and
    item size (device_view.rs): each array, made in any order of shapes and dtypes, has its
    own shape and NumPy's strides, and the data its buffer holds."""
    layouts = [((4, 3), np.float32), ((4, 3), np.float64), ((3, 4), np.float32), ((4, 3), np.float32), (12, np.int16)]
    views = []
    for shape, dtype in layouts * 2:
        data = np.arange(12, dtype=dtype).reshape(shape)
        buf = UnifiedBuffer(shape, dtype, device=opencl_device)
        buf.copy_from(data)
        view = buf.device
        expected = np.empty(shape, dtype)
        assert (view.shape, view.strides, view.dtype) == (expected.shape, expected.strides, expected.dtype)
        np.testing.assert_array_equal(view.get(), data)
        views.append((view, data))
    for view, data in views:  # the arrays made earlier kept their layout too
        assert (view.shape, view.strides) == (data.shape, data.strides)


def test_host_device_syncs_copy_nothing(host_device):
    buf = UnifiedBuffer(1000, device=host_device)
    buf.host[:] = 1.0
    buf.device_writable
    buf.host
    stats = buf.transfer_stats()
    assert stats["host_to_device_bytes"] == stats["device_to_host_bytes"] == 0
    assert stats["zero_copy_syncs"] == 2


def test_fill_works_where_the_data_is_current(opencl_device):
    buf = UnifiedBuffer(300, np.int16, device=opencl_device)
    buf.host[:] = 1
    buf.mark_device_dirty()
    buf.fill(-3)  # on the device: no transfer
    assert buf.state == BufferState.DEVICE_DIRTY
    assert buf.transfer_stats()["device_to_host_copies"] == 0
    np.testing.assert_array_equal(buf.to_numpy(), np.full(300, -3, dtype=np.int16))


def test_copy_from_casts_like_numpy_same_kind():
    buf = UnifiedBuffer(3, np.float32)
    buf.copy_from([1, 2, 3])  # int64 -> float32
    np.testing.assert_array_equal(buf.to_numpy(), [1, 2, 3])
    buf.copy_from(np.array([0.5, 1.5, 2.5]))  # float64 -> float32 (same kind)
    np.testing.assert_array_equal(buf.to_numpy(), [0.5, 1.5, 2.5])
    buf.copy_from(np.arange(6, dtype=np.float32)[::2])  # non-contiguous source
    np.testing.assert_array_equal(buf.to_numpy(), [0, 2, 4])


def test_copy_from_itself_and_its_own_view():
    buf = UnifiedBuffer(4, np.int32)
    buf.copy_from([1, 2, 3, 4])
    buf.copy_from(buf.host)
    buf.copy_from(buf)
    np.testing.assert_array_equal(buf.to_numpy(), [1, 2, 3, 4])


def test_to_numpy_is_a_copy():
    buf = UnifiedBuffer(3)
    buf.fill(1.0)
    out = buf.to_numpy()
    out[:] = 5
    assert buf.to_numpy().tolist() == [1.0, 1.0, 1.0]
    assert out.flags.owndata


def test_repr_and_handle(host_device):
    buf = UnifiedBuffer((2, 3), np.int8, device=host_device)
    assert repr(buf) == "UnifiedBuffer(shape=(2, 3), dtype=int8, device=host:0, state=UNINITIALIZED)"
    assert buf.device_handle == host_device


def test_opencl_device_without_pyopencl_gives_a_handle_view(opencl_device):
    """Without PyOpenCL, `.device` on OpenCL exposes the cl_mem handle (a fresh process in
    which PyOpenCL cannot be imported)."""
    from conftest import run_python

    result = run_python(
        f"""
        import sys
        sys.modules["pyopencl"] = None
        sys.modules["pyopencl.array"] = None
        import numpy as np, lazybuf
        buf = lazybuf.UnifiedBuffer(16, np.float32, device={opencl_device.selector!r})
        buf.host[:] = 2.0
        view = buf.device_writable
        assert type(view).__name__ == "DeviceMemoryView", type(view)
        assert view.backend == "opencl" and view.ptr != 0 and view.nbytes == 64
        assert view.shape == (16,) and view.dtype == np.float32
        assert view.context != 0 and view.queue != 0
        assert view.device.selector == {opencl_device.selector!r}
        assert not hasattr(view, "__cuda_array_interface__")
        assert buf.state == lazybuf.BufferState.DEVICE_DIRTY
        del buf
        assert type(view.owner).__name__ == "MemoryOwner"
        print("ok")
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"



def test_a_plain_bytes_buffer_request_gives_a_1d_byte_view(device):
    import ctypes
    import hashlib
    import io

    buf = UnifiedBuffer((3, 4), np.int32, device=device)
    buf.copy_from(np.arange(12).reshape(3, 4))
    buf.sync_to_device()
    # hashlib asks for PyBUF_SIMPLE: a 1-d run of bytes, whatever the buffer's shape (before:
    # ndim 2, "Buffer must be single dimension"); read-only, so a host read.
    assert hashlib.sha256(buf).hexdigest() == hashlib.sha256(buf.to_numpy().tobytes()).hexdigest()
    assert buf.state == BufferState.SYNCHRONIZED
    # readinto asks for PyBUF_WRITABLE alone: writable bytes, a host write.
    data = np.arange(100, 112, dtype=np.int32)
    assert io.BytesIO(data.tobytes()).readinto(buf) == buf.nbytes
    assert buf.state == BufferState.HOST_DIRTY
    np.testing.assert_array_equal(buf.to_numpy(), data.reshape(3, 4))
    # ctypes' from_buffer goes through a memoryview (read-only, a host read): use .host.
    with pytest.raises(TypeError, match="not writable"):
        ctypes.c_char.from_buffer(buf)
    ctypes.c_int32.from_buffer(buf.host).value = 7
    assert buf.to_numpy()[0, 0] == 7
    with memoryview(buf) as view:  # a full request keeps the shape and format
        assert view.shape == (3, 4) and view.format == "i" and view.itemsize == 4


def test_large_to_numpy_arrays_own_cached_memory_and_give_it_back(device):
    """From 1 MiB, to_numpy() arrays own a block of lazybuf's cache (their .base), so a loop
    of to_numpy() calls reuses pages instead of mapping fresh ones; the array is independent
    of the buffer, and its memory goes back to the cache when it is gone."""
    import gc

    import lazybuf

    # Earlier tests' garbage first: a block of this size class freed by the collection below
    # would go back to the cache after this array's, and be the one the next array takes.
    collect()
    n = (4 << 20) // 4 + 5  # 4 MiB and a bit: not a whole size class
    buf = UnifiedBuffer(n, np.float32, device=device)
    buf.host[:] = np.arange(n, dtype=np.float32)
    buf.mark_device_dirty()  # the device copy is current: to_numpy downloads into the array
    out = buf.to_numpy()
    assert isinstance(out.base, lazybuf.HostBlock) and out.flags.writeable and out.flags.c_contiguous
    np.testing.assert_array_equal(out, np.arange(n, dtype=np.float32))
    assert buf.state == BufferState.DEVICE_DIRTY  # one copy, straight from the device copy
    out[:] = -1  # independent of the buffer
    np.testing.assert_array_equal(buf.host_readonly, np.arange(n, dtype=np.float32))
    pool = lazybuf.get_memory_pool(device)
    address = out.__array_interface__["data"][0]
    in_use = pool.stats().bytes_in_use
    del out
    gc.collect()
    assert pool.stats().bytes_in_use < in_use, "the block went back to the cache"
    again = buf.to_numpy()
    assert again.__array_interface__["data"][0] == address, "the next array reuses it"
    np.testing.assert_array_equal(again, np.arange(n, dtype=np.float32))
    small = UnifiedBuffer(1000, np.float32, device=device).to_numpy()
    assert small.base is None and small.flags.owndata  # NumPy's own memory below 1 MiB


def test_to_numpy_without_caching_still_owns_its_copy(device):
    import lazybuf

    lazybuf.set_caching(False)
    try:
        buf = UnifiedBuffer(1 << 20, np.uint16, device=device)
        buf.fill(7)
        out = buf.to_numpy()
    finally:
        lazybuf.set_caching(True)
    del buf
    np.testing.assert_array_equal(out, np.full(1 << 20, 7, np.uint16))
