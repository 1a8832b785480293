"""`buf[key] = array` for a basic selection (slices and ints) and an array of the buffer's
dtype and the selection's shape, which skips the check of the key and value by NumPy's rules
(it cannot fail), and every neighbouring case, which must still be checked: the same result
as NumPy's assignment, or NumPy's error with nothing changed. Each test means the same on
every device (on the host device the copies are one memory).
"""

import numpy as np
import pytest

from conftest import assigned_as_numpy_assigns, one_selector_per_backend
from lazybuf import BufferState, UnifiedBuffer

GRID = np.arange(20, dtype=np.float32).reshape(4, 5)


def device_dirty(selector, data):
    """A buffer holding `data` whose device copy is current and its host copy stale (the
    device copy declared written by a kernel: `mark_device_dirty()`)."""
    buf = UnifiedBuffer(data.shape, dtype=data.dtype, device=selector)
    buf.copy_from(data)
    buf.sync_to_device()
    buf.mark_device_dirty()
    assert buf.state == BufferState.DEVICE_DIRTY
    return buf


BASIC_KEYS = {
    "a slice": (slice(1, 3), (2, 5)),
    "a slice with a negative step": (slice(None, None, -2), (2, 5)),
    "a slice past the end": (slice(2, 99), (2, 5)),
    "an empty slice": (slice(3, 1), (0, 5)),
    "a row and a column slice": ((2, slice(1, 4)), (3,)),
    "a negative row and a stepped slice": ((-1, slice(0, 5, 2)), (3,)),
    "two slices": ((slice(1, 3), slice(None, None, 3)), (2, 2)),
    "a row": (1, (5,)),
    "a row in a tuple": ((3,), (5,)),
    "one element in a tuple": ((3, 4), ()),
}


@pytest.mark.parametrize("what", sorted(BASIC_KEYS))
@pytest.mark.parametrize("selector", one_selector_per_backend())
def test_an_array_of_the_selections_shape_and_dtype_is_assigned_as_numpy_does(selector, what):
    """The values land, the rest of the buffer keeps the device copy's values (the host copy
    is synced first), and the assignment is a host write."""
    key, shape = BASIC_KEYS[what]
    value = (np.arange(int(np.prod(shape)), dtype=np.float32) + 100).reshape(shape)
    buf = device_dirty(selector, GRID)
    assert assigned_as_numpy_assigns(buf, GRID, key, value)
    assert buf.state == BufferState.HOST_DIRTY


@pytest.mark.parametrize("selector", one_selector_per_backend())
def test_a_non_contiguous_array_and_a_view_of_the_buffer_itself_are_assigned(selector):
    buf = device_dirty(selector, GRID)
    assigned_as_numpy_assigns(buf, GRID, slice(0, 2), (GRID * 3)[::2])
    # A view of the buffer's own host copy (overlapping the selection), as NumPy copies it.
    buf = device_dirty(selector, GRID)
    expected = GRID.copy()
    expected[1:3] = expected[0:2].copy()
    buf[1:3] = buf.host[0:2]
    np.testing.assert_array_equal(buf.to_numpy(), expected)


def _swapped():
    return np.ones((2, 5), dtype=np.float32).astype(">f4")


class _Subclass(np.ndarray):
    pass


class _Index:
    """A slice field with `__index__`: user code the key runs."""

    def __init__(self, value):
        self.value = value

    def __index__(self):
        return self.value


class _Refusing:
    def __index__(self):
        raise RuntimeError("no index")


NEIGHBOURS = {
    "a byte-swapped array": (slice(1, 3), _swapped),
    "an array of another dtype": (slice(1, 3), lambda: np.full((2, 5), 7.0)),
    "an array too large for an integer dtype": (slice(1, 3), lambda: np.full((2, 5), 1e10)),
    "an array of the wrong shape": (slice(1, 3), lambda: np.ones((3, 5), np.float32)),
    "an array that broadcasts": (slice(1, 3), lambda: np.ones((1, 5), np.float32)),
    "an array with an extra leading dimension": (slice(1, 3), lambda: np.ones((1, 2, 5), np.float32)),
    "an ndarray subclass": (slice(1, 3), lambda: np.ones((2, 5), np.float32).view(_Subclass)),
    "a slice with a step of 0": (slice(None, None, 0), lambda: np.ones((4, 5), np.float32)),
    "a slice whose field has __index__": (slice(_Index(1), _Index(3)), lambda: np.ones((2, 5), np.float32)),
    "a slice whose field refuses __index__": (slice(_Refusing(), 3), lambda: np.ones((2, 5), np.float32)),
    "a row out of range": ((7, slice(None)), lambda: np.ones(5, np.float32)),
    "a bool row": ((True, slice(None)), lambda: np.ones((1, 5), np.float32)),
    "too many indices": ((1, 2, slice(None)), lambda: np.ones(1, np.float32)),
    "an ellipsis": ((Ellipsis, slice(1, 3)), lambda: np.ones((4, 2), np.float32)),
    "a list": (slice(1, 3), lambda: [[1.0] * 5] * 2),
}


@pytest.mark.parametrize("what", sorted(NEIGHBOURS))
@pytest.mark.parametrize("dtype", [np.float32, np.int8])
@pytest.mark.parametrize("selector", one_selector_per_backend())
def test_every_other_key_and_value_is_still_assigned_or_refused_as_numpy_does(selector, dtype, what):
    """Keys and values next to the unchecked case (another dtype, a shape that broadcasts or
    does not, a subclass, user code in the key): NumPy's result, or its error with nothing
    changed (a failed assignment made after `.host`'s access would have left the device copy
    stale and counted a download)."""
    key, value = NEIGHBOURS[what]
    data = GRID.astype(dtype)
    buf = device_dirty(selector, data)
    assigned_as_numpy_assigns(buf, data, key, value())
