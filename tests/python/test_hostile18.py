"""What the eighteenth hostile pass (2026-11-28) found, each a test that failed before its fix.
Each means the same on every device (on the host device the copies are one memory).
"""

import tracemalloc
import warnings

import numpy as np
import pytest

import lazybuf
from conftest import assigned_as_numpy_assigns, collect, one_selector_per_backend
from lazybuf import BufferState, UnifiedBuffer

N = 8
DATA = np.arange(N, dtype=np.float32)


@pytest.fixture(autouse=True)
def _clean():
    yield
    if lazybuf.trace.is_recording():
        lazybuf.trace.stop()
    lazybuf.set_host_memory_limit(None)


def in_state(selector, state, data=DATA):
    """A buffer holding `data` in `state` (its device copy written by no kernel: declared
    current)."""
    buf = UnifiedBuffer(data.shape, dtype=data.dtype, device=selector)
    buf.copy_from(data)
    if state != BufferState.HOST_ONLY:
        buf.sync_to_device()
    if state == BufferState.DEVICE_DIRTY:
        buf.mark_device_dirty()
    assert buf.state == state
    return buf


ONE_ELEMENT = {
    "an array of one element with a dimension": (3, lambda: np.array([7.0], dtype=np.float32)),
    "an array of one element with two dimensions": (3, lambda: np.array([[7.0]])),
    "a list of one number": (3, lambda: [7.0]),
    "a memoryview of one number": (3, lambda: memoryview(np.array([3.0]))),
    "a NumPy integer key and an array": (np.int64(-2), lambda: np.array([5.0])),
    "a 0-d integer array key and an array": (np.array(2), lambda: np.array([5.0])),
}


@pytest.mark.parametrize("what", sorted(ONE_ELEMENT))
@pytest.mark.parametrize("dtype", [np.float32, np.int8])
@pytest.mark.parametrize("selector", one_selector_per_backend())
def test_one_element_is_assigned_by_numpys_rules_for_one_element(selector, dtype, what):
    """`buf[i] = value` for one element was checked as an assignment to an array of shape ()
    (which broadcasts an array of one element with dimensions, and converts a list or a
    memoryview of one number): NumPy (2.4) refuses `a[i] = np.array([x])`, so the check passed
    and the assignment then failed after `.host`'s access had synced the host copy (a
    DEVICE_DIRTY buffer left HOST_DIRTY, a download counted); a memoryview NumPy refuses was
    assigned, and a list into an integer dtype raised ValueError where NumPy raises TypeError.
    One element is checked by NumPy's own assignment of one element now."""
    key, value = ONE_ELEMENT[what]
    data = DATA.astype(dtype)
    for state in (BufferState.DEVICE_DIRTY, BufferState.SYNCHRONIZED):
        buf = in_state(selector, state, data)
        assigned_as_numpy_assigns(buf, data, key, value())


GRID = np.arange(20, dtype=np.float32).reshape(4, 5)
KEYS_AND_VALUES = {
    "a boolean mask and a 2-d array of one element": (lambda: GRID > 10, lambda: np.array([[7.0]])),
    "a boolean mask and a 2-d list": (lambda: GRID > 10, lambda: [[7.0]]),
    "an all-false mask and a 2-d array": (lambda: np.zeros((4, 5), bool), lambda: np.zeros((2, 5))),
    "a fancy index and a list deeper than its selection": (lambda: [0, 1], lambda: [[[7.0]]]),
    "a fancy column and a deep list": (lambda: (slice(None), [0, 2, 2]), lambda: [[[7.0]]]),
    "an integer and a list index and a 2-d list": (lambda: (1, [2]), lambda: [[7.0]]),
    "a row and a list deeper than the row": (lambda: 1, lambda: [[1, 2, 3, 4, 5]]),
    "a row and an object array with a leading 1": (lambda: 1, lambda: np.array([[1, 2, 3, 4, 5]], dtype=object)),
    "a 0-d index array and a deep list": (lambda: np.array(2), lambda: [[7.0]]),
    "a fancy index and a float too large for the dtype": (lambda: [0, 1], lambda: np.float64(1e300)),
    "a mask and a NumPy float": (lambda: GRID > 10, lambda: np.float64(2.5)),
    "rows by a list and an array with a leading 1": (lambda: [[0, 1], [1, 2]], lambda: np.zeros((1, 2, 2, 5))),
}


@pytest.mark.parametrize("what", sorted(KEYS_AND_VALUES))
@pytest.mark.parametrize("dtype", [np.float32, np.int8])
@pytest.mark.parametrize("selector", one_selector_per_backend())
def test_each_kind_of_key_keeps_numpys_rules(selector, dtype, what):
    """The check assigned the value to an array of the selection's shape, whose rules are a
    view's: a boolean mask's (a value of at most one dimension) and a fancy index's (a
    sequence of any depth whose leading dimensions are 1) differ. `buf[mask] = np.array([[x]])`
    passed the check and failed after `.host`'s access (a DEVICE_DIRTY buffer left HOST_DIRTY,
    a download counted), and assignments NumPy makes (`buf[[0, 1]] = [[[x]]]`) were refused.
    The check is NumPy's assignment with the same key now, to a stand-in of one element."""
    key, value = KEYS_AND_VALUES[what]
    data = GRID.astype(dtype)
    buf = in_state(selector, BufferState.DEVICE_DIRTY, data)
    assigned_as_numpy_assigns(buf, data, key(), value())


@pytest.mark.parametrize("selector", one_selector_per_backend())
def test_a_zero_dimensional_buffer_takes_its_element_by_numpys_rules(selector):
    data = np.array(4.0, dtype=np.float32)
    for key in [(), Ellipsis]:
        for value in [np.array([7.0]), [7.0], 2.5]:
            buf = in_state(selector, BufferState.DEVICE_DIRTY, data)
            assigned_as_numpy_assigns(buf, data, key, value)


@pytest.mark.parametrize("selector", one_selector_per_backend())
def test_an_assignment_makes_no_copy_of_the_selection(selector):
    """A value that is neither an array nor a number was converted into an array of the
    selection's shape before the assignment: `buf[:] = [0]` made a copy of the whole buffer,
    and a key of broadcast index arrays one as large as the key selects
    (`buf[np.broadcast_to(0, (3000, 3000))] = [1.0]`: 36 MB for a buffer of 8 elements; NumPy's
    own assignment needs none). It is converted in its own shape now."""
    big = np.zeros(1 << 20, dtype=np.float32)
    cases = [
        (DATA, np.broadcast_to(np.intp(0), (3000, 3000)), [1.0]),
        (DATA, (np.broadcast_to(np.intp(1), (2000, 2000)),), (2.0,)),
        (big, slice(None), [2.0]),
        (big, slice(1, None), [3.0]),
    ]
    for data, key, value in cases:
        buf = in_state(selector, BufferState.SYNCHRONIZED, data)
        expected = data.copy()
        expected[key] = value
        collect()
        tracemalloc.start()
        try:
            buf[key] = value
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 1 << 20, (key, peak)
        np.testing.assert_array_equal(buf.to_numpy(), expected)


SCALARS = [0, 1, -1, 127, 128, -129, 255, 256, 65504, 65505, 2**31, 2**63 - 1, 2**63, -(2**63), 10**400]
SCALARS += [True, False, 0.0, -0.0, 1.5, -2.25, 65504.0, 70000.0, 1e-7, 1e-30, 1e-45, 1e-300]
SCALARS += [3.4e38, 3.5e38, 1e300, float("inf"), float("-inf"), float("nan")]
DTYPES = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64]
DTYPES += [np.float16, np.float32, np.float64, np.complex64, np.complex128]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_a_plain_number_into_one_element_is_assigned_or_refused_as_numpy_does(dtype):
    """`buf[i] = number` skips the checked assignment when the number's conversion cannot fail
    nor warn, or the number is a NumPy scalar of the buffer's dtype (the fast path): every
    boundary value is assigned as NumPy assigns it, and one NumPy refuses, warns of or raises on
    (`np.errstate(all="raise")`, warnings as errors) is refused with nothing changed, on a
    buffer whose device copy is the current one."""
    selector = one_selector_per_backend()[-1]  # memory of its own where there is one
    data = np.arange(N).astype(dtype)
    for strict in (False, True):
        for value in [*SCALARS, np.dtype(dtype).type(5), np.float64(2.5), np.int64(-3)]:
            buf = in_state(selector, BufferState.DEVICE_DIRTY, data)
            expected = data.copy()
            with warnings.catch_warnings(), np.errstate(all="raise" if strict else "ignore"):
                warnings.simplefilter("error" if strict else "ignore")
                try:
                    expected[3] = value
                    numpy_error = None
                except Exception as err:
                    numpy_error = err
                state, stats = buf.state, buf.transfer_stats()
                if numpy_error is None:
                    buf[3] = value
                else:
                    with pytest.raises(type(numpy_error)):
                        buf[3] = value
            if numpy_error is None:
                np.testing.assert_array_equal(buf.to_numpy(), expected, err_msg=repr(value))
            else:
                assert (buf.state, buf.transfer_stats()) == (state, stats), value
                np.testing.assert_array_equal(buf.to_numpy(), data, err_msg=repr(value))


def test_a_host_copy_read_back_from_disk_records_and_counts_its_block():
    """A host copy spilled to disk and read back: the spill recorded the old block's free, the
    read-back recorded nothing of the block it took (nor counted it in `allocations`), so a
    trace held more host frees than allocations for the buffer. The read-back's block is
    recorded and counted now."""
    n = 16 * 1024
    collect()
    lazybuf.trim()
    lazybuf.reset_spill_stats("host")
    lazybuf.set_host_memory_limit(lazybuf.host_memory_held() + 3 * n * 4)
    with lazybuf.trace.record() as rec:
        bufs = []
        for i in range(5):
            buf = UnifiedBuffer(n, np.float32, device="host")
            buf.copy_from(np.full(n, i, np.float32))
            bufs.append(buf)
        first = bufs[0]
        # (copy_from hands no address out: the two least recently used went to disk.)
        assert lazybuf.spill_stats("host")["bytes_to_disk"] == 2 * n * 4
        np.testing.assert_array_equal(first.to_numpy(), np.zeros(n, np.float32))  # read back
        assert lazybuf.spill_stats("host")["bytes_from_disk"] == n * 4
        stats = first.transfer_stats()
        ident = first.buffer_id
        first.free()
    lazybuf.set_host_memory_limit(None)
    host = [
        e["kind"]
        for e in rec.trace.events()
        if e.get("buffer") == ident and e["kind"] in ("allocate", "free") and e["memory"] == "host"
    ]
    assert host == ["allocate", "free"] * (len(host) // 2) and host, host
    assert host.count("allocate") == stats["allocations"], (host, stats)


def test_a_record_block_stops_its_own_recording_and_no_other():
    """`record()`'s exit stopped whatever recording ran: a block whose recording another
    thread stopped (and then started its own) took that thread's recording and its events,
    and the thread's own `stop()` then failed. The exit stops the recording its block started
    and no other: the other runs on, and the block that ends normally gets "stopped already"."""
    import threading

    def another_thread(action):
        done = []
        t = threading.Thread(target=lambda: done.append(action()))
        t.start()
        t.join()
        return done[0]

    with pytest.raises(ValueError, match="stopped already"):
        with lazybuf.trace.record() as rec:
            another_thread(lazybuf.trace.stop)
            another_thread(lazybuf.trace.start)
            buf = UnifiedBuffer(N, np.float32, device="host")
            buf.copy_from(DATA)
    assert rec.trace is None
    assert lazybuf.trace.is_recording()
    theirs = another_thread(lazybuf.trace.stop)
    assert any(e.get("buffer") == buf.buffer_id for e in theirs.events())

    # A block that raises keeps its own exception, the other recording still running.
    with pytest.raises(KeyError):
        with lazybuf.trace.record():
            another_thread(lazybuf.trace.stop)
            another_thread(lazybuf.trace.start)
            raise KeyError("the block's")
    assert lazybuf.trace.is_recording()
    lazybuf.trace.stop()

    # One record() object entered by two threads: each exit is its own thread's.
    shared = lazybuf.trace.record()
    with pytest.raises(ValueError, match="stopped already"):
        with shared:
            another_thread(lazybuf.trace.stop)
            another_thread(shared.__enter__)
    assert lazybuf.trace.is_recording()
    lazybuf.trace.stop()
