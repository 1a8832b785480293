"""User code that lazybuf runs in the middle of one of its calls (a twelfth hostile pass,
2026-11-28: re-entrancy).

`buf[key] = value` hands NumPy the host copy and NumPy then converts `key` and `value`, which
may run the user's code (`__index__`, `__float__`, `__array__`, a finalizer gc runs there).
Such code that used the same buffer (declared a kernel's write, synced) made the assignment
land in a host copy stale by then (lost, no error) or one the device copy had just been
synced from (SYNCHRONIZED copies that differ). The buffer is now in use across NumPy's call:
such a use raises `ReentrancyError` out of the assignment, which writes nothing. Each test
means the same on every device (on the host device the copies are one memory).
"""

import numpy as np
import pytest

import lazybuf
from conftest import one_selector_per_backend
from lazybuf import BufferState, UnifiedBuffer

N = 8
DATA = np.arange(N, dtype=np.float32)


def synchronized(selector):
    """A small buffer (below any zero-copy size) holding DATA on `selector`, SYNCHRONIZED."""
    buf = UnifiedBuffer((N,), dtype=np.float32, device=selector)
    buf.copy_from(DATA)
    buf.sync_to_device()
    assert buf.state == BufferState.SYNCHRONIZED
    return buf


def device_bytes(buf):
    """What the device copy holds: declared current (nothing wrote it) and read back."""
    if buf.state in (BufferState.HOST_DIRTY, BufferState.HOST_ONLY):
        buf.sync_to_device()
    buf.mark_device_dirty()
    return buf.to_numpy()


@pytest.mark.parametrize("selector", one_selector_per_backend())
def test_a_value_whose_conversion_marks_the_buffer_dirty_is_refused_and_writes_nothing(selector):
    buf = synchronized(selector)

    class Value:
        def __float__(self):
            buf.mark_device_dirty()
            return 99.0

    with pytest.raises(lazybuf.ReentrancyError, match="UnifiedBuffer"):
        buf[0] = Value()
    np.testing.assert_array_equal(buf.to_numpy(), DATA)
    np.testing.assert_array_equal(device_bytes(buf), DATA)


@pytest.mark.parametrize("selector", one_selector_per_backend())
def test_an_index_whose_conversion_marks_the_buffer_dirty_is_refused_and_writes_nothing(selector):
    buf = synchronized(selector)

    class Index:
        def __index__(self):
            buf.mark_device_dirty()
            return 1

    # NumPy turns any error of an index's `__index__` into its own IndexError.
    with pytest.raises((lazybuf.ReentrancyError, IndexError)):
        buf[Index()] = 99.0
    np.testing.assert_array_equal(buf.to_numpy(), DATA)


@pytest.mark.parametrize("selector", one_selector_per_backend())
def test_a_value_whose_conversion_syncs_the_buffer_leaves_no_copies_that_differ(selector):
    buf = synchronized(selector)

    class Values:
        def __array__(self, dtype=None, copy=None):
            buf.sync_to_device()
            return np.full(N - 1, 99.0, dtype=np.float32)

    with pytest.raises(lazybuf.ReentrancyError):
        buf[1:] = Values()
    np.testing.assert_array_equal(buf.to_numpy(), DATA)
    np.testing.assert_array_equal(device_bytes(buf), DATA)


@pytest.mark.parametrize("selector", one_selector_per_backend())
def test_a_conversion_may_use_other_buffers_and_the_assignment_lands(selector):
    buf = synchronized(selector)
    other = synchronized(selector)
    other.mark_device_dirty()

    class Value:
        def __float__(self):
            return float(other.to_numpy()[3]) + 0.5

    buf[0] = Value()
    expected = DATA.copy()
    expected[0] = 3.5
    np.testing.assert_array_equal(buf.to_numpy(), expected)
    np.testing.assert_array_equal(device_bytes(buf), expected)


@pytest.mark.parametrize("selector", one_selector_per_backend())
def test_another_thread_waits_for_an_assignment_whose_conversion_runs_python(selector):
    import threading

    buf = synchronized(selector)
    started, release = threading.Event(), threading.Event()
    seen = []

    class Value:
        def __float__(self):
            started.set()  # the assignment holds the buffer from here
            release.wait(0.3)  # time for the reader to reach the buffer and wait for it
            return 42.0

    def reader():
        started.wait(5)
        seen.append(buf.to_numpy())  # waits for the assignment (without the GIL)

    t = threading.Thread(target=reader)
    t.start()
    buf[2] = Value()
    t.join(10)
    assert not t.is_alive()
    expected = DATA.copy()
    expected[2] = 42.0
    np.testing.assert_array_equal(seen[0], expected)


# --- the guard's and the recorder's names for calls the user's code makes in the middle ---
#
# A lazybuf call that the user's code makes while lazybuf runs that code inside another call
# (NumPy's conversion of a value calling its `__float__`, a DLPack producer's `__dlpack__`) is
# the user's own call: its copies are judged by its own cause, not the outer call's. (Before,
# the outer call named them: an explicit `to_numpy()` there was refused under `disallow` as
# "implicit __setitem__", and an implicit `.host` inside `copy_from_device` let through.)


@pytest.mark.parametrize("selector", one_selector_per_backend())
def test_an_explicit_read_back_made_by_user_code_inside_an_item_assignment_is_explicit(selector):
    buf = synchronized(selector)
    other = synchronized(selector)
    other.mark_device_dirty()
    read = []

    class Value:
        def __float__(self):
            read.append(other.to_numpy())  # explicit: allowed under "disallow"
            return 5.0

    with lazybuf.transfer_guard("disallow"):
        buf[0] = Value()
    np.testing.assert_array_equal(read[0], DATA)


@pytest.mark.parametrize("selector", one_selector_per_backend())
def test_an_implicit_download_made_by_user_code_inside_an_item_assignment_is_refused(selector):
    if selector == "host":
        pytest.skip("nothing is refused on the host device: the copies are one memory")
    buf = synchronized(selector)
    other = synchronized(selector)
    other.mark_device_dirty()

    class Value:
        def __float__(self):
            return float(other.host[3])  # implicit: refused under "disallow"

    with lazybuf.transfer_guard("disallow"):
        with pytest.raises(lazybuf.TransferGuardError, match="__getattribute__|host"):
            buf[0] = Value()
    np.testing.assert_array_equal(buf.to_numpy(), DATA)


@pytest.mark.parametrize("selector", one_selector_per_backend())
def test_the_recorder_names_a_call_made_by_user_code_after_itself(selector):
    buf = synchronized(selector)
    other = synchronized(selector)
    other.mark_device_dirty()

    class Value:
        def __float__(self):
            other.sync_to_host()
            return 5.0

    lazybuf.trace.start()
    try:
        buf[0] = Value()
    finally:
        trace = lazybuf.trace.stop()
    mine = [e for e in trace.events() if e.get("buffer") == other.buffer_id and e["kind"] == "state"]
    assert [e["call"] for e in mine] == ["sync_to_host"], mine
    outer = [e for e in trace.events() if e.get("buffer") == buf.buffer_id and e["kind"] == "state"]
    assert outer and all(e["call"] in ("__setitem__",) for e in outer), outer


@pytest.mark.parametrize("selector", one_selector_per_backend())
def test_an_implicit_download_made_by_user_code_inside_copy_from_device_is_refused(selector):
    source = lazybuf.DeviceBuffer.to_device(bytes(N), device=selector)
    try:
        source.__dlpack__()
    except BufferError:
        pytest.skip("this device's memory has no DLPack export, so no user __dlpack__ runs")
    other = synchronized(selector)
    other.mark_device_dirty()  # `.host` downloads where the copies are two

    class Producer:  # a DLPack producer whose export reads another buffer's host copy first
        def __dlpack__(self, **kwargs):
            other.host
            return source.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return source.__dlpack_device__()

    destination = lazybuf.DeviceBuffer(size=N, device=selector)
    with lazybuf.transfer_guard("disallow"):
        try:
            other.host
            direct_refused = False
        except lazybuf.TransferGuardError:
            direct_refused = True
        if not direct_refused:
            pytest.skip("nothing is refused on this device (its copies are one memory)")
        # The same implicit copy, made by user code inside an explicit call of another
        # object: before the fix it ran (named "explicit copy_from_device").
        with pytest.raises(lazybuf.TransferGuardError):
            destination.copy_from_device(Producer())
