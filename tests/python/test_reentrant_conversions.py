"""User code that lazybuf runs in the middle of one of its calls (the twelfth and thirteenth
hostile passes, 2026-11-28: re-entrancy).

`buf[key] = value` hands NumPy the host copy and NumPy then converts `key` and `value`, which
may run the user's code (`__index__`, `__float__`, `__array__`, a finalizer). Such code that
used the same buffer made the assignment land in a host copy stale by then (lost, no error)
or one the device copy had just been synced from (SYNCHRONIZED copies that differ). Now the
assignment looks at the buffer when NumPy is done: a host copy gone stale raises
`RuntimeError` (the current copy holds none of the values), and a device copy synced from the
host copy meanwhile is marked stale again (the host copy holds the values). The first fix held
the buffer's lock across NumPy's call, which made `buf[key] = buf` raise and two threads
assigning two buffers to each other deadlock (the thirteenth pass). Each test means the same on
every device (on the host device the copies are one memory).
"""

import functools
import os
import weakref
import subprocess
import sys

import numpy as np
import pytest

import lazybuf
from conftest import one_selector_per_backend
from lazybuf import BufferState, UnifiedBuffer

N = 8
DATA = np.arange(N, dtype=np.float32)


def synchronized(selector, data=DATA):
    """A small buffer (below any zero-copy size) holding `data` on `selector`, SYNCHRONIZED."""
    buf = UnifiedBuffer(data.shape, dtype=data.dtype, device=selector)
    buf.copy_from(data)
    buf.sync_to_device()
    assert buf.state == BufferState.SYNCHRONIZED
    return buf


def assert_both_copies_hold(buf, index, value):
    """The buffer reads `value` at `index` (DATA elsewhere), from its host copy and from its
    device copy alike."""
    expected = DATA.copy()
    expected[index] = value
    np.testing.assert_array_equal(buf.to_numpy(), expected)
    np.testing.assert_array_equal(device_bytes(buf), expected)


def device_bytes(buf):
    """What the device copy holds: declared current (nothing wrote it) and read back."""
    if buf.state in (BufferState.HOST_DIRTY, BufferState.HOST_ONLY):
        buf.sync_to_device()
    buf.mark_device_dirty()
    return buf.to_numpy()


@pytest.mark.parametrize("selector", one_selector_per_backend())
def test_a_value_whose_conversion_marks_the_buffer_dirty_comes_first_and_the_value_lands(selector):
    """The value is converted before the buffer is touched (the seventeenth hostile pass: a
    failed conversion must change nothing), so code the conversion runs comes first: its
    `mark_device_dirty()` makes the device copy the current one, and the assignment then syncs
    the host copy from it and writes the value. (Before, the conversion ran after `.host`'s
    access and the assignment raised "host copy went stale".)"""
    buf = synchronized(selector)

    class Value:
        def __float__(self):
            buf.mark_device_dirty()
            return 99.0

    buf[0] = Value()
    assert buf.state == BufferState.HOST_DIRTY
    assert_both_copies_hold(buf, 0, 99.0)


@pytest.mark.parametrize("selector", one_selector_per_backend())
def test_an_index_whose_conversion_marks_the_buffer_dirty_comes_first_and_the_value_lands(selector):
    """The key's `__index__` runs once, before the buffer is touched (the nineteenth hostile
    pass: NumPy runs it once, and lazybuf's check ran it again inside the assignment), so, as
    for a value's conversion above, its `mark_device_dirty()` comes first: the assignment syncs
    the host copy from the device copy and writes the value. (Before, the index ran again after
    `.host`'s access and the assignment raised "host copy went stale".)"""
    buf = synchronized(selector)

    class Index:
        def __index__(self):
            buf.mark_device_dirty()
            return 1

    buf[Index()] = 99.0
    assert buf.state == BufferState.HOST_DIRTY
    assert_both_copies_hold(buf, 1, 99.0)


@pytest.mark.parametrize("selector", one_selector_per_backend())
def test_a_value_whose_conversion_syncs_the_buffer_leaves_no_copies_that_differ(selector):
    buf = synchronized(selector)

    class Values:
        def __array__(self, dtype=None, copy=None):
            buf.sync_to_device()
            return np.full(N - 1, 99.0, dtype=np.float32)

    buf[1:] = Values()
    assert_both_copies_hold(buf, slice(1, None), 99.0)


@pytest.mark.parametrize("selector", one_selector_per_backend())
def test_a_conversion_may_use_other_buffers_and_the_assignment_lands(selector):
    buf = synchronized(selector)
    other = synchronized(selector)
    other.mark_device_dirty()

    class Value:
        def __float__(self):
            return float(other.to_numpy()[3]) + 0.5

    buf[0] = Value()
    assert_both_copies_hold(buf, 0, 3.5)


@pytest.mark.parametrize("selector", one_selector_per_backend())
@pytest.mark.parametrize("key", [slice(None, None, -1), slice(0, N)], ids=["reversed", "every-by-range"])
def test_an_assignment_of_the_buffer_to_itself_is_numpys(selector, key):
    buf = synchronized(selector)
    model = DATA.copy()
    model[key] = model
    buf[key] = buf
    np.testing.assert_array_equal(buf.to_numpy(), model)


@pytest.mark.parametrize("selector", one_selector_per_backend())
def test_an_index_array_that_is_the_buffer_itself_is_numpys(selector):
    data = np.array([3, 0, 5, 1, 7, 2, 6, 4], dtype=np.int64)
    buf = synchronized(selector, data)
    model = data.copy()
    model[model] = 0
    buf[buf] = 0
    np.testing.assert_array_equal(buf.to_numpy(), model)


CROSS_ASSIGNMENT = """
import os, sys, threading, time
import numpy as np
import lazybuf
n = 1 << 12
a = lazybuf.UnifiedBuffer((n,), np.float32, device=sys.argv[1])
b = lazybuf.UnifiedBuffer((n,), np.float32, device=sys.argv[1])
a.copy_from(np.ones(n, np.float32))
b.copy_from(np.full(n, 2.0, np.float32))
end = time.monotonic() + 1.0
def assign(x, y):
    while time.monotonic() < end:
        x[0:n] = y
threads = [threading.Thread(target=assign, args=p, daemon=True) for p in ((a, b), (b, a))]
for t in threads:
    t.start()
for t in threads:
    t.join(20)
print("hung" if any(t.is_alive() for t in threads) else "done", flush=True)
os._exit(0)
"""


@pytest.mark.parametrize("selector", one_selector_per_backend())
def test_two_threads_assigning_two_buffers_to_each_other_do_not_deadlock(selector):
    done = subprocess.run(
        [sys.executable, "-c", CROSS_ASSIGNMENT, selector],
        capture_output=True,
        text=True,
        timeout=90,
        env=os.environ.copy(),
    )
    assert done.stdout.strip() == "done", (done.stdout, done.stderr[-2000:])


@pytest.mark.parametrize("selector", one_selector_per_backend())
def test_a_log_handler_that_syncs_during_an_item_assignment_leaves_no_copies_that_differ(selector):
    import logging

    buf = synchronized(selector)
    buf.mark_device_dirty()  # the assignment downloads: a logged copy where the copies are two
    synced = []

    class Handler(logging.Handler):
        def emit(self, record):
            if not synced:
                synced.append(True)
                buf.sync_to_device()

    handler = Handler()
    logger = logging.getLogger("lazybuf.transfer_guard")
    logger.addHandler(handler)
    try:
        with lazybuf.transfer_guard("log"):
            buf[1] = 99.0
    finally:
        logger.removeHandler(handler)
    assert_both_copies_hold(buf, 1, 99.0)


# The fourteenth pass (2026-11-28): a sync in the window between `.host`'s access and the
# settling (a weakref callback of the replaced `.host` array, another thread), and `free()`
# in the conversion.


@pytest.mark.parametrize("selector", one_selector_per_backend())
def test_a_sync_run_by_the_drop_of_the_replaced_host_view_leaves_no_copies_that_differ(selector):
    """`.host`'s access replaces the stale `.host` array the buffer kept and drops it, so user
    code runs between the access and NumPy's write (here a weakref callback; a finalizer is the
    same). A `sync_to_device()` there made the device copy current before the write, which then
    left SYNCHRONIZED copies that differed; the settling marks the device copy stale again."""
    buf = synchronized(selector)
    host = buf.host
    fired = []

    def synced(_):
        fired.append(True)
        buf.sync_to_device()

    ref = weakref.ref(host, synced)  # noqa: F841 (kept alive until the test ends)
    del host  # the buffer still keeps it as its cached `.host`
    buf.mark_device_dirty()  # the cached `.host` is frozen: the next `.host` replaces it
    buf[1] = 99.0
    assert fired, "the replaced `.host` array was not dropped inside the assignment"
    assert_both_copies_hold(buf, 1, 99.0)


@pytest.mark.parametrize("selector", one_selector_per_backend())
def test_a_sync_from_another_thread_during_an_item_assignment_leaves_no_copies_that_differ(selector):
    """The same window, from another thread: a `sync_to_device()` waiting for the buffer's
    lock while `.host`'s access downloads uploads the host copy before NumPy's write (before
    the fix, SYNCHRONIZED copies differed about one iteration in four on PoCL and the CUDA
    double, one in fifty on lavapipe and loopback)."""
    import threading
    import time

    buf = synchronized(selector, np.zeros(N, np.float32))
    deadline = time.monotonic() + 3
    differing = []
    for it in range(1, 3001):
        buf.mark_device_dirty()  # the assignment's `.host` downloads
        stop = threading.Event()

        def spin():
            while not stop.is_set():
                buf.sync_to_device()

        t = threading.Thread(target=spin)
        t.start()
        time.sleep(0.001)
        buf[1] = float(it)
        stop.set()
        t.join()
        if buf.state == BufferState.SYNCHRONIZED:
            host = buf.to_numpy()
            buf.mark_device_dirty()  # declares the device copy current: read it back
            device = buf.to_numpy()
            if host[1] != device[1]:
                differing.append((it, host[1], device[1]))
                break
        if time.monotonic() > deadline:
            break
    assert not differing, f"SYNCHRONIZED copies differ after the assignment (iteration, host, device): {differing}"


@pytest.mark.parametrize("selector", one_selector_per_backend())
def test_a_value_whose_conversion_frees_the_buffer_does_not_lose_the_write_silently(selector):
    """`free()` run by the conversion of the assigned value (docs/MIGRATING.md: after `free()`
    "a write that would be lost raises `ValueError`"). NumPy checked the `.host` array's
    writeability before converting, so it writes into the memory `free()` gave up; the
    settling looks at that old memory's state (unchanged), so the assignment returns with no
    error and the buffer holds none of the value. Expected: the value lands in the buffer, or
    the assignment raises (as it does for `mark_device_dirty()` there)."""
    buf = synchronized(selector)

    class Value:
        def __float__(self):
            buf.free()
            return 99.0

    try:
        buf[1] = Value()
    except (RuntimeError, ValueError):
        return
    assert buf.to_numpy()[1] == 99.0, "the assignment returned, but the write was lost"


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


@pytest.mark.parametrize("selector", one_selector_per_backend())
def test_the_recorder_names_a_call_made_by_c_implemented_user_code_after_itself(selector):
    buf = synchronized(selector)
    other = synchronized(selector)
    other.mark_device_dirty()

    class Value:
        # The user's conversion, without a Python frame: it syncs `other` and returns None.
        __float__ = staticmethod(functools.partial(other.sync_to_host))

    lazybuf.trace.start()
    try:
        with pytest.raises(TypeError):  # None is no float
            buf[0] = Value()
    finally:
        trace = lazybuf.trace.stop()
    mine = [e for e in trace.events() if e.get("buffer") == other.buffer_id and e["kind"] == "state"]
    assert [e["call"] for e in mine] == ["sync_to_host"], mine


@pytest.mark.parametrize("selector", one_selector_per_backend())
def test_an_explicit_read_back_by_c_implemented_user_code_inside_an_assignment_is_explicit(selector):
    import itertools
    import operator

    buf = synchronized(selector)
    other = synchronized(selector)
    other.mark_device_dirty()
    reads = map(float, map(operator.itemgetter(3), map(operator.call, itertools.repeat(other.to_numpy))))

    class Value:
        __float__ = staticmethod(functools.partial(next, reads))

    with lazybuf.transfer_guard("disallow"):
        buf[0] = Value()
    expected = DATA.copy()
    expected[0] = 3.0
    np.testing.assert_array_equal(buf.to_numpy(), expected)
