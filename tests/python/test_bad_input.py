"""One test per bad input: the exception NumPy users expect (ValueError for shapes, lengths
and arguments, TypeError for types), with a message that says what was expected, and
nothing already stored is lost."""

import numpy as np
import pytest

from conftest import run_python
import lazybuf
from lazybuf import BufferState, UnifiedBuffer, get_accelerator

# --- shapes -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape,match",
    [
        ((-1,), "negative dimensions are not allowed"),
        (-5, "negative dimensions are not allowed"),
        ((2, -3), "negative dimensions are not allowed"),
        ((1,) * 65, "expected at most 64"),
        ((2**70,), "too large"),
        ((2**40, 2**40, 2**40), "exceed the largest possible allocation"),
        ((0, 2**62, 4), "other than 0"),
        ((2**62, 4, 0), "other than 0"),
        ((2**62,), "exceed the largest possible allocation"),
    ],
)
def test_bad_shape_values(shape, match):
    with pytest.raises(ValueError, match=match):
        UnifiedBuffer(shape, np.float64)


@pytest.mark.parametrize(
    "shape,match",
    [
        (2.5, "shape must be an int or a sequence of ints"),
        ("abc", "shape must be an int or a sequence of ints"),
        (None, "shape must be an int or a sequence of ints"),
        (True, "shape must be an int or a sequence of ints"),
        ((2, "x"), "non-integer dimension"),
        ((2, 1.0), "non-integer dimension"),
        ((2, False), "non-integer dimension"),
    ],
)
def test_bad_shape_types(shape, match):
    with pytest.raises(TypeError, match=match):
        UnifiedBuffer(shape)


# --- dtypes -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype,match",
    [
        pytest.param(
            np.clongdouble,
            np.dtype(np.clongdouble).name,
            marks=pytest.mark.skipif(np.dtype(np.clongdouble).itemsize <= 16, reason="clongdouble is complex128 here"),
        ),
        (np.bool_, "bool"),
        (object, "object"),
        ("U5", "<U5"),
        (">f4", "native byte order"),
        ("not-a-dtype", "not a NumPy dtype"),
        ([("a", np.int32), ("b", np.float32)], "structured"),
        ("datetime64[s]", "datetime64"),
    ],
)
def test_unsupported_dtypes(dtype, match):
    with pytest.raises(TypeError, match=match) as err:
        UnifiedBuffer(4, dtype)
    assert "expected one of float16, float32" in str(err.value)


def test_bfloat16_without_ml_dtypes_is_a_clear_type_error():
    result = run_python(
        """
        import sys
        sys.modules["ml_dtypes"] = None   # ml_dtypes cannot be imported
        import lazybuf
        try:
            lazybuf.UnifiedBuffer(4, "bfloat16")
        except TypeError as err:
            assert "ml_dtypes" in str(err) and "pip install ml_dtypes" in str(err), err
            print("ok")
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


# --- devices and flags -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "device,match",
    [
        (
            "tpu",
            r"expected one of gpu, cuda\[:N\], opencl\[:N\], "
            r"(wgpu\[:N\], vulkan\[:N\], metal\[:N\], dx12\[:N\], )?(loopback\[:N\], )?host\[:N\]",
        ),
        ("host:7", "out of range"),
        ("host:x", "non-negative integer"),
        ("cuda", "cuda has no device"),
    ],
)
def test_bad_device_selectors(device, match):
    if device == "cuda" and get_accelerator().is_available("cuda"):
        pytest.skip("this machine has a CUDA device")
    with pytest.raises(ValueError, match=match):
        UnifiedBuffer(4, device=device)


def test_bad_device_type():
    with pytest.raises(TypeError, match="device must be None, a selector string"):
        UnifiedBuffer(4, device=3.5)


def test_pinned_must_be_a_bool():
    with pytest.raises(TypeError):
        UnifiedBuffer(4, pinned="yes")


def test_bad_select_device_arguments():
    acc = get_accelerator()
    with pytest.raises(IndexError, match="out of range"):
        acc.select_device(99)
    with pytest.raises(TypeError, match="select_device expects"):
        acc.select_device(1.5)
    with pytest.raises(ValueError, match="no device matches"):
        acc.select_device("nope")
    with pytest.raises(ValueError, match="no device matches"):
        acc.get_memory_info("nope")
    assert acc.current_device.backend in ("host", "opencl", "cuda")


# --- copies and fills --------------------------------------------------------------------------


@pytest.fixture
def stored() -> UnifiedBuffer:
    buf = UnifiedBuffer((2, 3), np.float32)
    buf.copy_from(np.arange(6).reshape(2, 3))
    buf.sync_to_device()
    return buf


def unchanged(buf: UnifiedBuffer) -> None:
    assert buf.state == BufferState.SYNCHRONIZED
    np.testing.assert_array_equal(buf.to_numpy(), np.arange(6).reshape(2, 3))


@pytest.mark.parametrize(
    "data,match",
    [
        (np.zeros(6), r"expected data of shape \(2, 3\), got shape \(6,\)"),
        (np.zeros((3, 2)), r"expected data of shape \(2, 3\), got shape \(3, 2\)"),
        (np.zeros((2, 3, 1)), r"got shape \(2, 3, 1\)"),
        (1.0, "use fill"),
    ],
)
def test_copy_from_wrong_length(stored, data, match):
    with pytest.raises(ValueError, match=match):
        stored.copy_from(data)
    unchanged(stored)


def test_copy_from_ragged_data(stored):
    with pytest.raises(ValueError):
        stored.copy_from([[1, 2, 3], [4, 5]])
    unchanged(stored)


@pytest.mark.parametrize("data", [np.zeros((2, 3), np.complex64), np.full((2, 3), "x"), np.zeros((2, 3), object)])
def test_copy_from_uncastable_dtype(stored, data):
    with pytest.raises(TypeError, match="cannot cast .* under the same_kind rule"):
        stored.copy_from(data)
    unchanged(stored)


def test_copy_from_float_into_int_buffer():
    buf = UnifiedBuffer(3, np.int32)
    buf.copy_from([1, 2, 3])
    with pytest.raises(TypeError, match="float64 to int32"):
        buf.copy_from(np.array([1.5, 2.5, 3.5]))
    assert buf.to_numpy().tolist() == [1, 2, 3]


def test_fill_with_an_array(stored):
    with pytest.raises(ValueError, match="expected a scalar"):
        stored.fill([1.0, 2.0])
    unchanged(stored)


def test_fill_with_a_non_number(stored):
    with pytest.raises(ValueError):
        stored.fill("abc")
    unchanged(stored)


def test_fill_out_of_range():
    buf = UnifiedBuffer(3, np.uint8)
    buf.fill(7)
    with pytest.raises(OverflowError):
        buf.fill(300)
    assert buf.to_numpy().tolist() == [7, 7, 7]


# --- sizes the memory cannot hold ---------------------------------------------------------------


def test_allocation_larger_than_the_host_is_memory_error():
    buf = UnifiedBuffer((1 << 46,), np.uint8)  # 64 TiB: construction allocates nothing
    with pytest.raises(MemoryError, match="could not allocate 70368744177664 bytes"):
        buf.host
    assert buf.state == BufferState.UNINITIALIZED


def test_allocation_larger_than_the_device(opencl_device):
    too_big = opencl_device.total_memory * 2
    buf = UnifiedBuffer((too_big,), np.uint8, device=opencl_device)
    with pytest.raises((MemoryError, ValueError), match=str(too_big)):
        buf.mark_device_dirty()
    assert buf.state == BufferState.UNINITIALIZED


# --- DLPack arguments ------------------------------------------------------------------------


def test_dlpack_bad_device_id():
    with pytest.raises(ValueError, match="non-negative"):
        UnifiedBuffer(3).__dlpack__(dl_device=(1, -1))


def test_dlpack_versions_and_devices_out_of_range_name_their_argument():
    """A hostile script (2026-11-27): these raised OverflowError ("out of range integral type
    conversion attempted") naming no argument, on every object that exports DLPack."""
    exporters = [UnifiedBuffer(3), lazybuf.DeviceBuffer(size=8), lazybuf.MemoryDevice(8)]
    for exporter in exporters:
        for bad in [(-1, -1), (2**64, 0), (0, 2**40)]:
            with pytest.raises(ValueError, match=r"max_version must be \(major, minor\)"):
                exporter.__dlpack__(max_version=bad)
        for bad in [(-1, 0), (1, 2**31)]:
            with pytest.raises(ValueError, match=r"dl_device must be \(device_type, device_id\)"):
                exporter.__dlpack__(dl_device=bad)
        for bad in [(1,), "ab", (1.0, 0), (True, 0), 5]:
            with pytest.raises(TypeError, match="max_version must be"):
                exporter.__dlpack__(max_version=bad)
        exporter.__dlpack__(max_version=(np.int64(1), np.uint8(0)))  # NumPy integers are ints


def test_dlpack_to_an_unknown_device():
    with pytest.raises(BufferError, match="can export to the CPU"):
        UnifiedBuffer(3).__dlpack__(dl_device=(4, 0))


def test_dlpack_stream_on_the_cpu_must_be_none():
    # NumPy's rule for CPU exports: the CPU has no streams.
    buf = UnifiedBuffer(3, np.int32)
    buf.fill(4)
    for stream in (5, 0, -1):
        with pytest.raises(ValueError, match="stream must be None for an export to the CPU"):
            buf.__dlpack__(stream=stream)
    with pytest.raises(ValueError, match="stream must be None"):
        buf.__dlpack__(stream=1, dl_device=(1, 0))
    assert buf.state == BufferState.HOST_ONLY
    assert np.from_dlpack(buf).tolist() == [4, 4, 4]


# --- issue 8: endless, oversized and non-sequence shapes; bools as devices; fill; bytes ---------


def test_endless_iterable_shape_is_rejected_at_once():
    import itertools

    with pytest.raises(TypeError, match="shape must be an int or a sequence of ints"):
        UnifiedBuffer(itertools.count())
    with pytest.raises(TypeError, match="sequence of ints"):
        UnifiedBuffer(iter([2, 3]))
    with pytest.raises(TypeError, match="sequence of ints"):
        UnifiedBuffer(n for n in (2, 3))


def test_endless_sequence_shape_reads_at_most_65_items():
    class Endless:
        """A sequence that claims a huge length and never ends."""

        read = 0

        def __len__(self):
            return 2**62

        def __getitem__(self, index):
            Endless.read += 1
            return 1

    with pytest.raises(ValueError, match="expected at most 64"):
        UnifiedBuffer(Endless())
    assert Endless.read <= 65


def test_sized_sequences_are_shapes():
    assert UnifiedBuffer(range(2, 4)).shape == (2, 3)
    assert UnifiedBuffer(np.array([2, 3])).shape == (2, 3)


@pytest.mark.parametrize("shape", [{2: 1}, {}, {2, 3}, frozenset([4])])
def test_mappings_and_sets_are_not_shapes(shape):
    with pytest.raises(TypeError, match="shape must be an int or a sequence of ints"):
        UnifiedBuffer(shape)


@pytest.mark.parametrize(
    "shape,position,dim",
    [
        ((0, 2**63), 1, 2**63),
        ((2**63, 0), 0, 2**63),
        ((0, 2**64 - 1), 1, 2**64 - 1),
        (2**63, 0, 2**63),
    ],
)
def test_every_dimension_above_isize_max_is_rejected(shape, position, dim):
    with pytest.raises(ValueError, match=f"dimension {position} of shape .* is {dim}, which is too large"):
        UnifiedBuffer(shape)
    with pytest.raises(ValueError):
        np.empty(shape)  # as NumPy does


def test_isize_max_itself_is_a_dimension():
    assert UnifiedBuffer((0, 2**63 - 1), np.uint8).shape == (0, 2**63 - 1)


def test_negative_dimension_is_named():
    with pytest.raises(ValueError, match="dimension 1 of shape .* is -4"):
        UnifiedBuffer((0, -4))


def test_bools_are_not_device_indices():
    acc = get_accelerator()
    before = acc.current_device
    for flag in (True, False):
        with pytest.raises(TypeError, match="a bool is not a device index"):
            acc.select_device(flag)
    assert acc.current_device == before


_FILL_DTYPES = [
    "int8",
    "uint8",
    "int16",
    "int32",
    "int64",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
    "complex64",
    "complex128",
]
_FILL_VALUES = [
    np.int64(2**40),
    np.uint64(2**64 - 1),
    np.int8(-5),
    np.float64(1e300),
    np.float32(2.5),
    np.complex128(1 + 2j),
    np.bool_(True),
    2**40,
    2**64,
    -1,
    1.7,
    -2.5,
    float("nan"),
    float("inf"),
    True,
    1 + 2j,
    "3",
    None,
]


def _numpy_fill(dtype, value):
    """What `np.empty(1, dtype).fill(value)` stores, or the exception type it raises."""
    target = np.empty(1, dtype)
    try:
        target.fill(value)
    except Exception as err:  # noqa: BLE001 - comparing exception types
        return type(err)
    return target


@pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::numpy.exceptions.ComplexWarning")
@pytest.mark.parametrize("dtype", _FILL_DTYPES)
def test_fill_follows_ndarray_fill(dtype):
    for value in _FILL_VALUES:
        expected = _numpy_fill(dtype, value)
        buf = UnifiedBuffer(3, dtype)
        buf.fill(7)
        if isinstance(expected, type):
            with pytest.raises(expected):
                buf.fill(value)
            assert buf.to_numpy().tolist() == [7, 7, 7], (dtype, value)
        else:
            buf.fill(value)
            np.testing.assert_array_equal(buf.to_numpy(), np.repeat(expected, 3), err_msg=f"{dtype} {value!r}")


def test_fill_numpy_scalars_that_do_not_fit():
    small = UnifiedBuffer(2, np.int8)
    small.fill(1)
    with pytest.raises(OverflowError):
        small.fill(np.int64(2**40))  # was silently 0
    wide = UnifiedBuffer(2, np.int64)
    wide.fill(1)
    with pytest.raises(OverflowError):
        wide.fill(np.uint64(2**64 - 1))  # was silently -1
    assert small.to_numpy().tolist() == [1, 1] and wide.to_numpy().tolist() == [1, 1]


def test_fill_with_a_0d_array():
    buf = UnifiedBuffer(2, np.float32)
    buf.fill(np.array(2.5))
    assert buf.to_numpy().tolist() == [2.5, 2.5]


@pytest.mark.parametrize("wrap", [bytes, bytearray, lambda b: memoryview(bytearray(b))])
def test_copy_from_bytes_is_raw_bytes(wrap):
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    buf = UnifiedBuffer((2, 3), np.float32)
    buf.copy_from(wrap(data.tobytes()))
    np.testing.assert_array_equal(buf.to_numpy(), data)
    assert buf.to_numpy().tolist() == np.frombuffer(data.tobytes(), np.float32).reshape(2, 3).tolist()


def test_copy_from_bytes_of_the_wrong_size(stored):
    for data in (b"", b"\x00" * 23, b"\x00" * 25, bytearray(6)):
        with pytest.raises(ValueError, match="expected exactly 24 bytes"):
            stored.copy_from(data)
    unchanged(stored)


def test_copy_from_typed_memoryview_is_values():
    buf = UnifiedBuffer(3, np.float64)
    buf.copy_from(memoryview(np.array([1, 2, 3], dtype=np.int32)))
    assert buf.to_numpy().tolist() == [1.0, 2.0, 3.0]
