"""Interop protocols against real consumers: NumPy (buffer protocol, __array_interface__,
__array__, DLPack), pickle, and PyOpenCL on PoCL sharing the buffer's cl_mem."""

import ctypes
import pickle
import struct

import numpy as np
import pytest

from lazybuf import BufferState, UnifiedBuffer


def address(array) -> int:
    return np.asarray(array).__array_interface__["data"][0]


# --- buffer protocol ------------------------------------------------------------------------


def test_memoryview_is_a_read_only_host_read():
    buf = UnifiedBuffer((2, 3), np.int16)
    buf.copy_from(np.arange(6).reshape(2, 3))
    buf.sync_to_device()
    view = memoryview(buf)
    assert (view.format, view.itemsize, view.shape, view.strides) == ("h", 2, (2, 3), (6, 2))
    assert view.readonly and view.c_contiguous
    assert view.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert buf.state == BufferState.SYNCHRONIZED  # a read changes nothing
    view.release()


def test_numpy_asarray_goes_through_the_buffer_protocol_zero_copy():
    buf = UnifiedBuffer(5, np.float64)
    buf.fill(2.5)
    array = np.asarray(buf)
    assert address(array) == address(buf.host_readonly)
    assert not array.flags.writeable
    np.testing.assert_array_equal(array, np.full(5, 2.5))


def test_a_writable_export_is_a_host_write():
    buf = UnifiedBuffer(4, np.float32)
    buf.fill(1.0)
    buf.sync_to_device()
    assert buf.state == BufferState.SYNCHRONIZED
    struct.pack_into("f", buf, 8, 9.0)  # asks for PyBUF_WRITABLE
    assert buf.state == BufferState.HOST_DIRTY
    np.testing.assert_array_equal(buf.to_numpy(), [1, 1, 9, 1])


def test_consumers_that_do_not_ask_for_writable_get_a_read_only_buffer():
    buf = UnifiedBuffer(4, np.float32)
    buf.fill(1.0)
    with pytest.raises(TypeError, match="not writable"):
        (ctypes.c_float * 4).from_buffer(buf)  # ctypes asks without PyBUF_WRITABLE
    raw = (ctypes.c_float * 4).from_buffer(buf.host)  # `.host` is the writable view
    raw[0] = 5.0
    assert buf.to_numpy()[0] == 5.0


@pytest.mark.parametrize(
    "dtype,fmt",
    [
        (np.float16, "e"),
        (np.float32, "f"),
        (np.float64, "d"),
        (np.int8, "b"),
        (np.uint64, "Q"),
        (np.complex64, "Zf"),
        (np.complex128, "Zd"),
    ],
)
def test_buffer_formats(dtype, fmt):
    view = memoryview(UnifiedBuffer(3, dtype))
    assert view.format == fmt and view.itemsize == np.dtype(dtype).itemsize
    assert np.frombuffer(view, dtype=dtype).shape == (3,)


def test_bfloat16_has_no_buffer_format_but_numpy_still_gets_it():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    buf = UnifiedBuffer(3, "bfloat16")
    buf.fill(1.5)
    with pytest.raises(BufferError, match="bfloat16"):
        memoryview(buf)
    array = np.asarray(buf)  # falls back to __array__
    assert array.dtype == np.dtype(ml_dtypes.bfloat16)
    assert array.astype(np.float32).tolist() == [1.5, 1.5, 1.5]
    assert not hasattr(buf, "__array_interface__")


# --- __array_interface__ and __array__ --------------------------------------------------------


class Holder:
    """A consumer that sees only the array interface."""

    def __init__(self, interface):
        self.__array_interface__ = interface


def test_array_interface_version_3():
    buf = UnifiedBuffer((3, 2), np.uint16)
    buf.copy_from([[1, 2], [3, 4], [5, 6]])
    interface = buf.__array_interface__
    assert interface["version"] == 3
    assert interface["shape"] == (3, 2)
    assert interface["typestr"] == np.dtype(np.uint16).str
    assert interface["strides"] is None
    assert interface["data"] == (address(buf.host_readonly), True)
    array = np.asarray(Holder(interface))
    np.testing.assert_array_equal(array, [[1, 2], [3, 4], [5, 6]])
    assert not array.flags.writeable


def test_dunder_array_copy_and_dtype():
    buf = UnifiedBuffer(3, np.int32)
    buf.copy_from([1, 2, 3])
    copied = np.array(buf, copy=True)
    assert address(copied) != address(buf.host_readonly)
    converted = buf.__array__(dtype=np.float64)
    assert converted.dtype == np.float64 and converted.tolist() == [1.0, 2.0, 3.0]
    with pytest.raises(ValueError, match="copy=False"):
        buf.__array__(dtype=np.float64, copy=False)
    assert buf.__array__(copy=False).flags.writeable is False


# --- DLPack -----------------------------------------------------------------------------------


def test_numpy_from_dlpack_is_zero_copy_and_a_write():
    buf = UnifiedBuffer((4, 2), np.float32)
    buf.fill(3.0)
    buf.sync_to_device()
    array = np.from_dlpack(buf)  # NumPy 2 asks for the versioned ABI
    assert array.shape == (4, 2) and array.dtype == np.float32
    assert address(array) == address(buf.host_readonly)
    assert array.flags.writeable
    assert buf.state == BufferState.HOST_DIRTY  # writable export: counted as a host write
    array[0, 0] = -1.0
    assert buf.to_numpy()[0, 0] == -1.0


def test_dlpack_versioned_and_legacy_capsules():
    buf = UnifiedBuffer(3, np.int64)
    assert "dltensor_versioned" in repr(buf.__dlpack__(max_version=(1, 0)))
    legacy = buf.__dlpack__()
    assert '"dltensor"' in repr(legacy)
    assert buf.__dlpack_device__() == (1, 0)


def test_dlpack_copy_and_devices():
    buf = UnifiedBuffer(3, np.float64)
    buf.copy_from([1.0, 2.0, 3.0])
    copied = np.from_dlpack(buf, copy=True)
    assert address(copied) != address(buf.host_readonly)
    assert copied.tolist() == [1.0, 2.0, 3.0]
    assert np.from_dlpack(buf, device="cpu").tolist() == [1.0, 2.0, 3.0]
    with pytest.raises(BufferError, match="cannot export to DLPack device"):
        buf.__dlpack__(dl_device=(2, 0))


def test_dlpack_of_every_dtype():
    for dtype in (np.float16, np.float64, np.int8, np.uint32, np.complex64, np.complex128):
        buf = UnifiedBuffer((2, 2), dtype)
        buf.fill(1)
        assert np.from_dlpack(buf).dtype == np.dtype(dtype)


def test_no_cuda_array_interface_off_cuda(opencl_device):
    assert not hasattr(UnifiedBuffer(3), "__cuda_array_interface__")
    assert not hasattr(UnifiedBuffer(3, device=opencl_device), "__cuda_array_interface__")


# --- pickle -----------------------------------------------------------------------------------


def test_pickle_copies_through_the_host(opencl_device):
    buf = UnifiedBuffer((2, 3), np.float64, device=opencl_device)
    buf.copy_from(np.arange(6.0).reshape(2, 3))
    buf.mark_device_dirty()
    clone = pickle.loads(pickle.dumps(buf))
    assert clone.shape == (2, 3) and clone.dtype == np.float64
    assert clone.state == BufferState.HOST_ONLY
    np.testing.assert_array_equal(clone.to_numpy(), np.arange(6.0).reshape(2, 3))
    assert address(clone.host_readonly) != address(buf.host_readonly)


def test_pickle_keeps_an_uninitialized_buffer_uninitialized():
    clone = pickle.loads(pickle.dumps(UnifiedBuffer(4, np.int8, pinned=False)))
    assert clone.state == BufferState.UNINITIALIZED
    assert clone.dtype == np.int8 and clone.shape == (4,)


# --- PyOpenCL on PoCL ------------------------------------------------------------------------

KERNEL = "__kernel void twice(__global float *x) { int i = get_global_id(0); x[i] = 2 * x[i]; }"


@pytest.mark.parametrize("n", [256, 1 << 20], ids=["1KiB-copied", "4MiB-aliased"])
def test_the_seed_pattern_device_kernel_mark_dirty_read_back(pyopencl, opencl_device, n):
    """The seeds' read-modify-write: `.device` (a device read, SYNCHRONIZED), a kernel writes
    it, `mark_device_dirty()`, then the host sees the kernel's results."""
    data = np.arange(n, dtype=np.float32)
    buf = UnifiedBuffer(n, np.float32, device=opencl_device)
    buf.host[:] = data
    array = buf.device
    assert buf.state == BufferState.SYNCHRONIZED
    program = pyopencl.Program(array.context, KERNEL).build()
    program.twice(array.queue, (n,), None, array.data)
    array.queue.finish()
    buf.mark_device_dirty()
    assert buf.state == BufferState.DEVICE_DIRTY
    np.testing.assert_array_equal(buf.to_numpy(), data * 2)
    assert buf.state == BufferState.DEVICE_DIRTY  # to_numpy() reads the device copy directly


@pytest.mark.parametrize("n", [256, 1 << 20], ids=["1KiB-copied", "4MiB-aliased"])
def test_pyopencl_array_shares_the_buffer(pyopencl, opencl_device, n):
    import pyopencl.array as cla

    data = np.arange(n, dtype=np.float32)
    buf = UnifiedBuffer(n, np.float32, device=opencl_device)
    buf.host[:] = data
    array = buf.device_writable
    assert isinstance(array, cla.Array)
    assert array.shape == (n,) and array.dtype == np.float32
    np.testing.assert_array_equal(array.get(), data)  # uploaded before it was handed out

    program = pyopencl.Program(array.context, KERNEL).build()
    program.twice(array.queue, (n,), None, array.data)
    array.queue.finish()

    assert buf.state == BufferState.DEVICE_DIRTY  # `.device_writable` counted as a device write
    np.testing.assert_array_equal(buf.to_numpy(), data * 2)
    if n >= 1 << 20:  # at least 4 MiB: PoCL shares the host block, no bytes copied
        stats = buf.transfer_stats()
        assert stats["host_to_device_bytes"] == stats["device_to_host_bytes"] == 0


def test_pyopencl_arrays_use_lazybufs_queue(pyopencl, opencl_device):
    a = UnifiedBuffer(8, device=opencl_device)
    b = UnifiedBuffer(8, device=opencl_device)
    a.fill(1.0)
    b.fill(2.0)
    qa, qb = a.device.queue, b.device.queue
    assert qa is qb
    assert a.device is a.device  # cached while the device copy is the same
    assert (a.device + b.device).get().tolist() == [3.0] * 8


@pytest.mark.parametrize(
    "shape,dtype",
    [((7,), np.float32), ((3, 5), np.int16), ((2, 1, 4), np.float64), ((1, 1), np.uint8), ((4, 3, 2, 2), np.complex64)],
)
def test_pyopencl_arrays_match_pyopencls_own_constructor(pyopencl, opencl_device, shape, dtype):
    """`.device` builds PyOpenCL arrays through PyOpenCL's fast constructor (it skips the checks):
    every attribute must be what PyOpenCL's checked constructor gives for the same memory."""
    import pyopencl.array as cla

    data = np.arange(np.prod(shape)).astype(dtype).reshape(shape)
    buf = UnifiedBuffer(shape, dtype, device=opencl_device)
    buf.copy_from(data)
    made = buf.device
    checked = cla.Array(made.queue, shape, np.dtype(dtype), data=made.base_data)
    for name in ("shape", "strides", "size", "nbytes", "dtype", "offset", "ndim"):
        assert getattr(made, name) == getattr(checked, name), name
    assert made.context.int_ptr == checked.context.int_ptr
    assert made.flags.c_contiguous and checked.flags.c_contiguous
    np.testing.assert_array_equal(made.get(), data)
    np.testing.assert_array_equal((made + made).get(), data + data)  # a PyOpenCL kernel on it


def test_pyopencl_array_classes_swapped_in_or_with_their_own_new_get_arrays_of_their_type(
    pyopencl, opencl_device, monkeypatch
):
    """Whichever class `pyopencl.array.Array` is now gets the array (the fast constructor's
    arguments are passed by position when its `__init__` is PyOpenCL's, checked per
    `__init__`), and a class with its own `__new__` is called as Python calls it."""
    import pyopencl.array as cla

    original = cla.Array
    news = []

    class WithNew(original):
        def __new__(cls, *args, **kwargs):
            news.append(cls)
            return super().__new__(cls)

    class Plain(original):
        pass

    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    for cls in (Plain, WithNew, original, Plain):
        monkeypatch.setattr(cla, "Array", cls)
        buf = UnifiedBuffer((2, 3), np.float32, device=opencl_device)
        buf.copy_from(data)
        array = buf.device
        assert type(array) is cls
        assert (array.shape, array.strides, array.size) == ((2, 3), (12, 4), 6)
        np.testing.assert_array_equal(array.get(), data)
    assert news == [WithNew]


def test_an_array_init_with_other_parameters_gets_its_arguments_by_keyword(pyopencl, opencl_device, monkeypatch):
    """An `__init__` whose parameters are not PyOpenCL's in PyOpenCL's order (here `data` and
    `offset` swapped) is never given the fast constructor's arguments by position, which would
    bind them to the wrong parameters."""
    import pyopencl.array as cla

    original = cla.Array
    seen = []

    class Reordered(original):
        def __init__(self, cq, shape, dtype, order="C", allocator=None, offset=0, data=None, strides=None,
                     events=None, _flags=None, _fast=False, _size=None, _context=None, _queue=None):
            seen.append((offset, data is not None))
            super().__init__(cq, shape, dtype, order=order, allocator=allocator, data=data, offset=offset,
                             strides=strides, events=events, _flags=_flags, _fast=_fast, _size=_size,
                             _context=_context, _queue=_queue)

    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    for cls in (Reordered, original, Reordered):
        monkeypatch.setattr(cla, "Array", cls)
        buf = UnifiedBuffer((2, 3), np.float32, device=opencl_device)
        buf.copy_from(data)
        array = buf.device
        assert type(array) is cls
        np.testing.assert_array_equal(array.get(), data)
    assert seen == [(0, True), (0, True)]


def test_pyopencl_without_the_fast_constructor_gets_the_checked_one(pyopencl, opencl_device, monkeypatch):
    """A PyOpenCL whose `Array` takes no `_fast` arguments still gets correct arrays."""
    import pyopencl.array as cla

    calls = []

    class Checked(cla.Array):
        def __init__(self, cq, shape, dtype, data=None):
            calls.append(shape)
            super().__init__(cq, shape, dtype, data=data)

    monkeypatch.setattr(cla, "Array", Checked)
    buf = UnifiedBuffer((2, 3), np.float32, device=opencl_device)
    buf.copy_from(np.arange(6, dtype=np.float32).reshape(2, 3))
    array = buf.device
    assert isinstance(array, Checked) and calls == [(2, 3)]
    assert array.strides == (12, 4)
    np.testing.assert_array_equal(array.get(), np.arange(6, dtype=np.float32).reshape(2, 3))
