"""What the seventeenth hostile pass (2026-11-28) found, each a test that failed before its fix.
Each means the same on every device (on the host device the copies are one memory).
"""

import numpy as np
import pytest

import lazybuf
from conftest import one_selector_per_backend
from lazybuf import BufferState, UnifiedBuffer
from lazybuf import mr

N = 8


@pytest.fixture(autouse=True)
def _clean():
    yield
    if lazybuf.trace.is_recording():
        lazybuf.trace.stop()
    lazybuf._lazybuf._transfer_guard_set_thread(None, None, None)


DATA = np.arange(N, dtype=np.float32)


def in_state(selector, state):
    """A buffer holding DATA in `state` (its device copy written by no kernel: declared
    current)."""
    buf = UnifiedBuffer((N,), dtype=np.float32, device=selector)
    buf.copy_from(DATA)
    if state != BufferState.HOST_ONLY:
        buf.sync_to_device()
    if state == BufferState.DEVICE_DIRTY:
        buf.mark_device_dirty()
    if state == BufferState.HOST_DIRTY:
        buf.mark_host_dirty()
    assert buf.state == state
    return buf


class Unconvertible:
    def __float__(self):
        raise TypeError("this value has no float")


BAD_ASSIGNMENTS = {
    "a string into float32": (slice(0, 2), "abc"),
    "an object without __float__": (3, object()),
    "a value whose __float__ raises": (1, Unconvertible()),
    "an array that does not broadcast": (slice(0, 2), np.ones(3)),
    "a sequence into one element": (1, [1.0, 2.0]),
    "a list that does not broadcast": (slice(None), [1.0, 2.0, 3.0]),
    "an index out of range": (N + 3, 1.0),
    "a key that is no index": ("a field", 1.0),
    "an integer too large for a float": (0, 10**400),
}


@pytest.mark.parametrize("what", sorted(BAD_ASSIGNMENTS))
@pytest.mark.parametrize(
    "state", [BufferState.SYNCHRONIZED, BufferState.DEVICE_DIRTY, BufferState.HOST_DIRTY, BufferState.HOST_ONLY]
)
@pytest.mark.parametrize("selector", one_selector_per_backend())
def test_a_failed_element_assignment_changes_nothing(selector, state, what):
    """`buf[key] = value` whose value NumPy cannot convert or broadcast (or whose key it cannot
    use) raised NumPy's error after `.host`'s access had synced the host copy and made it the
    current one: a DEVICE_DIRTY or SYNCHRONIZED buffer was left HOST_DIRTY (its device copy
    stale, re-uploaded at the next device access), with a download counted. The contract: a
    failed operation changes nothing. The key and the value are converted to the selection
    before the buffer is touched now."""
    key, value = BAD_ASSIGNMENTS[what]
    buf = in_state(selector, state)
    stats = buf.transfer_stats()
    with pytest.raises((ValueError, TypeError, IndexError, OverflowError)):
        buf[key] = value
    assert buf.state == state
    assert buf.transfer_stats() == stats
    np.testing.assert_array_equal(buf.to_numpy(), DATA)


@pytest.mark.parametrize("selector", one_selector_per_backend())
def test_element_assignments_still_assign_as_numpy_does(selector):
    """The conversion before the write gives NumPy's results: a number over a slice, a
    broadcast row, a fancy index with a repeated position (the last value wins), a boolean
    mask, a 0-d array, strings NumPy converts."""
    buf = in_state(selector, BufferState.DEVICE_DIRTY)
    expected = DATA.copy()
    for key, value in [
        (slice(0, 3), 9.5),
        (slice(2, 6), np.array([1, 2, 3, 4], dtype=np.int64)),
        ([0, 0, 1], [7.0, 8.0, 6.0]),
        (np.arange(N) % 3 == 0, -1.0),
        (-1, np.float64(4.25)),
        (5, np.array(3.0)),
        (slice(6, 8), ["1.5", "2.5"]),
        (Ellipsis, expected * 0 + 2),
    ]:
        buf[key] = value
        expected[key] = value
        np.testing.assert_array_equal(buf.to_numpy(), expected)
    buf2 = UnifiedBuffer((2, 3), dtype=np.int32, device=selector)
    buf2.copy_from(np.zeros((2, 3), np.int32))
    buf2[:, 1] = [5, 6]
    buf2[1] = np.array([[1, 2, 3]])
    np.testing.assert_array_equal(buf2.to_numpy(), [[0, 5, 0], [1, 2, 3]])


@pytest.mark.parametrize("selector", one_selector_per_backend())
def test_deallocate_refuses_a_size_other_than_the_allocated_one(selector):
    """`mr.deallocate(ptr, nbytes)` with an `nbytes` smaller than the allocation gave the
    block back (the sixteenth pass left it): RMM's resources are given the allocated size, and
    a caller passing another has a bug. Any other size is refused now, naming both, and the
    block is kept for the right call."""
    resource = mr.StatisticsResourceAdaptor(mr.DirectMemoryResource())
    ptr = resource.allocate(1000, device=selector)
    for wrong in (999, 1, 1001, 1024):
        with pytest.raises(ValueError, match=rf"allocated with nbytes=1000, not {wrong}\b"):
            resource.deallocate(ptr, wrong)
        assert resource.allocation_counts.current_bytes == 1000
    resource.deallocate(ptr, 1000)
    assert resource.allocation_counts.current_bytes == 0
    # A pool rounds the block up; the size to give back is still the one asked for.
    pool = mr.PoolMemoryResource(mr.DirectMemoryResource())
    ptr = pool.allocate(1000, device=selector)
    with pytest.raises(ValueError, match="allocated with nbytes=1000"):
        pool.deallocate(ptr, 1024)
    pool.deallocate(ptr, 1000)


class Interrupt(BaseException):
    """What a signal handler raises (as KeyboardInterrupt is), between two bytecodes."""


# Where CPython runs a pending signal's handler (its "eval breaker" checks): right after a
# call returns, at a backward jump, and when a function starts. A handler's exception is raised
# there, so those are the places a signal can interrupt Python code.
SIGNAL_POINTS_AFTER = {"CALL", "CALL_FUNCTION_EX", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT"}


def interrupted_at(k, armed, block):
    """Runs `block()` with an `Interrupt` raised at the `k`-th point where CPython would run a
    signal handler (after a call, at a backward jump, at a function's start), counted from
    when `armed()` first became true: as a signal arriving there would raise it. Returns
    whether it was raised (false: the block had finished first)."""
    import dis
    import sys

    state = {"count": None, "raised": False}
    last = {}

    def local(frame, event, arg):
        if event != "opcode" or state["raised"]:
            return local
        code = frame.f_code.co_code
        op = dis.opname[code[frame.f_lasti]]
        previous = last.get(id(frame))
        last[id(frame)] = op
        point = previous in SIGNAL_POINTS_AFTER or op == "RESUME"
        if state["count"] is None and armed():
            state["count"] = 0
        if point and state["count"] is not None:
            state["count"] += 1
            if state["count"] == k:
                state["raised"] = True
                raise Interrupt()
        return local

    def trace(frame, event, arg):
        frame.f_trace_opcodes = True
        return local

    if sys.version_info >= (3, 12):
        # From 3.12 (PEP 669's instrumentation) a code object gets opcode events only from its
        # second traced run (on 3.13 after each interrupted one too): this run, uninterrupted,
        # is the first.
        def first_run(frame, event, arg):
            frame.f_trace_opcodes = True

        sys.settrace(first_run)
        try:
            block()
        finally:
            sys.settrace(None)

    sys.settrace(trace)
    try:
        block()
    except Interrupt:
        pass
    finally:
        sys.settrace(None)
    return state["raised"]


def test_a_signal_inside_a_transfer_guard_block_never_leaves_its_levels_set():
    """`with transfer_guard("disallow"):` was a generator-based context manager: its bytecode
    between setting this thread's levels and entering its `try` (and between its `finally` and
    the restoring call) ran with the levels set, so a signal's exception (Ctrl-C's
    `KeyboardInterrupt`) arriving there left the thread's guard at `disallow` for good, every
    later implicit copy refused. The scope is native now: set and restored each in one call.
    Interrupted at every point where a signal can be, after the levels change, the levels are
    back each time."""
    before = lazybuf.get_transfer_guard()
    assert before == {"h2d": "allow", "d2h": "allow", "d2d": "allow"}

    def changed():
        return lazybuf._lazybuf._transfer_guard_thread() != (None, None, None)

    def block():
        with lazybuf.transfer_guard("disallow"):
            abs(1)
            abs(2)
        with lazybuf.transfer_guard_device_to_host("log"):
            abs(3)

    k = 1
    while interrupted_at(k, changed, block):
        assert lazybuf.get_transfer_guard() == before, f"interrupted at signal point {k}"
        k += 1
    assert k > 3


def test_a_signal_inside_a_record_block_never_leaves_the_recorder_running():
    """The same window in `trace.record()` (a generator too): interrupted between its
    `start()` and its `try`, the recorder kept running, and the next `record()` or `start()`
    raised "already recording"."""

    def block():
        with lazybuf.trace.record() as rec:
            abs(1)
            abs(2)
        assert rec.trace is not None

    k = 1
    while interrupted_at(k, lazybuf.trace.is_recording, block):
        assert not lazybuf.trace.is_recording(), f"interrupted at signal point {k}"
        k += 1
    assert k > 3


def test_a_record_block_that_raises_after_stopping_the_recording_raises_its_own_error():
    """`with trace.record(): ...; trace.stop(); raise KeyError` replaced the block's
    `KeyError` with record()'s own `ValueError` ("not recording") from its exit: the user's
    error hidden behind the context manager's. The block's exception propagates now; a block
    that ends normally after stopping the recording still gets the `ValueError`."""
    with pytest.raises(KeyError, match="the block's own"):
        with lazybuf.trace.record() as rec:
            lazybuf.trace.stop()
            raise KeyError("the block's own")
    assert rec.trace is None
    assert not lazybuf.trace.is_recording()
    with pytest.raises(ValueError, match="not recording"):
        with lazybuf.trace.record():
            lazybuf.trace.stop()
    # Reused and nested scopes restore last in, first out.
    scope = lazybuf.transfer_guard("disallow")
    with scope:
        with lazybuf.transfer_guard(h2d="log"):
            with scope:
                assert lazybuf.get_transfer_guard()["h2d"] == "disallow"
            assert lazybuf.get_transfer_guard() == {"h2d": "log", "d2h": "disallow", "d2d": "disallow"}
    assert lazybuf.get_transfer_guard() == {"h2d": "allow", "d2h": "allow", "d2d": "allow"}


def test_dump_refuses_a_file_descriptor_and_never_closes_it(tmp_path):
    """`trace.dump(fd, trace)` passed the int to `open()`, which took it as a file descriptor,
    wrote the JSON there and closed it: `dump(1, t)` (or `dump(True, t)`) closed the process's
    standard output. A path must be a file name; anything else is a `TypeError` naming
    trace.dump, and the descriptor stays open."""
    import os

    with lazybuf.trace.record() as rec:
        pass
    r, w = os.pipe()
    try:
        for bad in (w, True, None, 3.5, ["x"]):
            with pytest.raises(TypeError, match=r"trace\.dump: path must be a file name"):
                lazybuf.trace.dump(bad, rec.trace)
        assert os.write(w, b"open") == 4
    finally:
        os.close(r)
        os.close(w)
    lazybuf.trace.dump(tmp_path / "t.json", rec.trace)
    lazybuf.trace.dump(os.fsencode(tmp_path / "b.json"), rec.trace)
    assert (tmp_path / "t.json").read_text() == (tmp_path / "b.json").read_text()


def test_one_guard_scope_object_entered_by_several_threads_restores_each_threads_levels():
    """A scope object kept and entered by several threads at once (`GUARD =
    transfer_guard("disallow")` at module level, `with GUARD:` in each worker) restores on each
    thread the levels that thread had: an exit never hands one thread another's levels."""
    import threading

    scope = lazybuf.transfer_guard("disallow")
    # (The timeout only keeps a failing worker from hanging the other.)
    entered = threading.Barrier(2, timeout=120)
    seen = {}

    def worker(name, own):
        try:
            with lazybuf.transfer_guard(own):
                with scope:
                    entered.wait()
                    seen[name, "inside"] = lazybuf.get_transfer_guard()["h2d"]
                    entered.wait()
                seen[name, "after"] = lazybuf.get_transfer_guard()["h2d"]
        except BaseException as err:
            entered.abort()
            seen[name, "error"] = repr(err)

    threads = [threading.Thread(target=worker, args=(n, own)) for n, own in (("a", "log"), ("b", "log_explicit"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == {("a", "inside"): "disallow", ("b", "inside"): "disallow", ("a", "after"): "log", ("b", "after"): "log_explicit"}


def test_scopes_left_out_of_order_by_asyncio_tasks_leave_no_level_behind():
    """Two asyncio tasks on one thread, each in a `transfer_guard` block across an `await`, the
    first entered leaving first: each scope restored what it had found, so the second, leaving
    last, restored the first's `disallow`, and the event loop's thread refused every implicit
    copy from then on (docs/OBSERVING.md said the levels would be those the first to leave had
    found). A scope left out of order now takes its own levels away and leaves the others';
    once both have left, the thread's levels are back."""
    import asyncio

    seen = {}

    async def task(level, entered, leave):
        with lazybuf.transfer_guard(level):
            entered.set()
            await leave.wait()

    async def main():
        a_in, a_out, b_in, b_out = (asyncio.Event() for _ in range(4))
        first = asyncio.create_task(task("disallow", a_in, a_out))
        await a_in.wait()
        second = asyncio.create_task(task("log", b_in, b_out))
        await b_in.wait()
        seen["both open"] = lazybuf.get_transfer_guard()["h2d"]
        a_out.set()
        await first
        seen["second open"] = lazybuf.get_transfer_guard()["h2d"]
        b_out.set()
        await second
        seen["both left"] = lazybuf.get_transfer_guard()

    asyncio.run(main())
    assert seen == {
        "both open": "log",
        "second open": "log",
        "both left": {"h2d": "allow", "d2h": "allow", "d2d": "allow"},
    }


def test_transfer_guard_and_record_still_decorate_functions():
    """Native, `transfer_guard(...)` and `trace.record()` are still what `contextlib` made them:
    decorators too (`@lazybuf.transfer_guard("disallow")`), each call of the function in the
    block, and re-entered by a recursive call."""

    @lazybuf.transfer_guard("disallow")
    def guarded(depth):
        assert lazybuf.get_transfer_guard()["h2d"] == "disallow"
        return guarded(depth - 1) if depth else lazybuf.trace.is_recording()

    @lazybuf.trace.record()
    def recorded():
        return guarded(3)

    assert recorded() is True
    assert lazybuf.get_transfer_guard() == {"h2d": "allow", "d2h": "allow", "d2d": "allow"}
    assert not lazybuf.trace.is_recording()
    with pytest.raises(KeyError):
        lazybuf.transfer_guard("log")(lambda: {}["missing"])()
    assert lazybuf.get_transfer_guard()["h2d"] == "allow"
