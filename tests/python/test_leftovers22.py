"""The twenty-second hostile pass (docs/RELIABILITY.md "The twenty-second pass"): each test
failed before its fix. Each means the same on every device."""

import pickle
import threading
import time

import numpy as np
import pytest

import lazybuf
from conftest import collect, events_of, one_selector_per_backend, run_python

N = 16 * 1024


def _spill_host_copy(buf) -> None:
    """Writes `buf`'s host copy (its only copy) to disk: a host memory limit that holds
    nothing more, then a host buffer that needs room."""
    collect()
    lazybuf.trim()
    lazybuf.set_host_memory_limit(lazybuf.host_memory_held())
    try:
        filler = lazybuf.UnifiedBuffer(N, np.float32, device="host")
        filler.copy_from(np.zeros(N, np.float32))
    finally:
        lazybuf.set_host_memory_limit(None)
    del filler
    collect()


@pytest.mark.parametrize("selector", [s for s in one_selector_per_backend() if s != "host"])
def test_an_async_sync_that_fails_under_way_leaves_the_host_copy_on_disk(selector):
    """An asynchronous sync of a buffer whose host copy was spilled to disk read the copy back
    and removed the file when the transfer started; when the copy then failed under way (when
    waited for), the host copy stayed in memory, counted as an allocation, `bytes_from_disk`
    moved. The file is kept until the transfer settles now: once the buffer's next call settles
    the failure, the host copy is on disk again and the counters are as before."""
    testing = pytest.importorskip("lazybuf.testing")
    faulty = testing.FaultyDevice(selector)
    lazybuf.reset_spill_stats(faulty)
    buf = lazybuf.UnifiedBuffer(N, np.float32, device=faulty)
    buf.copy_from(np.arange(N, dtype=np.float32))
    _spill_host_copy(buf)
    assert lazybuf.spill_stats(faulty)["bytes_to_disk"] == N * 4
    stats, from_disk = buf.transfer_stats(), lazybuf.spill_stats(faulty)["bytes_from_disk"]
    faulty.defer_copy_faults(True)
    faulty.fail_copy_in(1)
    try:
        transfer = buf.sync_to_device_async()
        try:
            transfer.wait()
        except RuntimeError as err:
            assert "injected fault" in str(err)
        else:
            assert faulty.copy_fault_armed, "a copy ran and did not fail"
            pytest.skip(f"{selector}: the device copy shares the host block (no upload to fail)")
    finally:
        faulty.disarm()
        faulty.defer_copy_faults(False)
    assert buf.state == lazybuf.BufferState.HOST_ONLY
    # The buffer's next call that depends on the failed transfer settles it (and reports it).
    with pytest.raises(RuntimeError, match="injected fault"):
        buf.sync_to_device()
    assert buf.transfer_stats() == stats
    assert lazybuf.spill_stats(faulty)["bytes_from_disk"] == from_disk
    # On disk again: the next access reads it back.
    buf.sync_to_device()
    assert lazybuf.spill_stats(faulty)["bytes_from_disk"] == from_disk + N * 4
    assert buf.state == lazybuf.BufferState.SYNCHRONIZED
    np.testing.assert_array_equal(buf.to_numpy(), np.arange(N, dtype=np.float32))


def test_a_refused_trace_stream_interns_no_call_name():
    """Call names read back were interned as each event was decoded, also for a stream refused
    later, and their length was not bounded: a process that refused enough hostile streams
    (4,096 names) could no longer read back a trace lazybuf itself had pickled, and each
    refused name's text stayed in memory. Names are interned only once the whole stream is
    accepted now, at most 1,024 bytes each. (In a fresh interpreter: the names are
    process-wide.)"""
    done = run_python(
        """
        import pickle
        import numpy as np
        import lazybuf
        from lazybuf._lazybuf import _rebuild_trace

        with lazybuf.trace.record() as rec:
            buf = lazybuf.UnifiedBuffer((10,), np.float32)
            buf.copy_from(np.zeros(10, np.float32))
            buf.sync_to_device()
        genuine = pickle.dumps(rec.trace)

        def state(i, name):
            return (i, 0, 1, None, "state", (1, "host_only", "synchronized", name))

        # 5,000 distinct names, refused at their last event: none is interned.
        names = tuple(state(i, f"hostile{i}") for i in range(5000))
        try:
            _rebuild_trace(1, names + ((0, 0, 1, None, "bogus", ()),), 0)
        except ValueError as err:
            assert "event 5000: kind must be one of" in str(err), err
        # 5,000 distinct names in a stream otherwise good: refused whole, none interned.
        try:
            _rebuild_trace(1, names, 0)
        except ValueError as err:
            assert "more than 4096 distinct call names" in str(err), err
        else:
            raise AssertionError("5,000 names were taken")
        # A name longer than 1,024 bytes is refused, saying so.
        try:
            _rebuild_trace(1, (state(0, "x" * 1025),), 0)
        except ValueError as err:
            assert "call must be a name of at most 1024 bytes" in str(err), err
        else:
            raise AssertionError("a long name was taken")
        back = pickle.loads(genuine)
        assert [e.get("call") for e in back.events()] == [e.get("call") for e in rec.trace.events()]
        # 4,000 new names in accepted streams still fit beside lazybuf's own.
        for start in range(0, 4000, 1000):
            _rebuild_trace(1, tuple(state(i, f"name{i}") for i in range(start, start + 1000)), 0)
        pickle.loads(genuine)
        print("ok")
        """
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


@pytest.mark.parametrize("selector", one_selector_per_backend())
def test_a_buffers_state_events_chain_while_another_thread_assigns_into_it(selector):
    """`buf[key] = value` settles its write with a second transition after NumPy's assignment,
    made outside the buffer's lock; when another thread synced the buffer in between, that
    transition carried the call's first clock reading, and the merged trace put it before the
    other thread's: the buffer's state events did not chain (each one's `from` the previous
    one's `to`). The settle reads the clock anew now."""
    buf = lazybuf.UnifiedBuffer((256,), np.float32, device=selector)
    buf.copy_from(np.ones(256, np.float32))
    stop = time.monotonic() + 1.5

    def writer():
        while time.monotonic() < stop:
            buf[3] = 1.0

    def syncer():
        while time.monotonic() < stop:
            buf.sync_to_device()

    with lazybuf.trace.record(capacity=5_000_000) as rec:
        threads = [threading.Thread(target=writer), threading.Thread(target=syncer)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert rec.trace.dropped == 0
    states = [e for e in events_of(rec.trace, buf.buffer_id) if e["kind"] == "state"]
    assert len(states) > 10
    breaks = [(a, b) for a, b in zip(states, states[1:]) if a["to"] != b["from"]]
    assert breaks == [], breaks[:3]


def test_a_stack_through_a_file_whose_name_cannot_be_encoded_is_kept():
    """`python_stack=True` kept no stack for an event whose stack passed through code whose
    file name holds a lone surrogate the file system's encoding cannot take (`\\ud800`, unlike
    the `\\udcff` of `surrogateescape`): `traceback.format_stack()` raised looking up the source
    line. The stack is kept now, without source lines, the name's bad character replaced."""
    buf = lazybuf.UnifiedBuffer((10,), np.float32)
    for name in ("plain_file.py", "\udcff_file.py", "\ud800_file.py"):
        namespace = {}
        exec(compile("def go(buf):\n    buf.host[:] = 1\n    buf.sync_to_device()\n", name, "exec"), namespace)
        with lazybuf.trace.record(python_stack=True) as rec:
            namespace["go"](buf)
        stacks = [e["stack"] for e in rec.trace.events()]
        assert stacks and all(s is not None for s in stacks), (ascii(name), rec.trace.events())
        assert all("_file.py" in s and "test_a_stack_through" in s for s in stacks), stacks


def test_small_things_of_the_pass():
    """A decoded trace refuses a bool as a count (as `PoolStats` does) and keeps an
    `__index__`'s own error as the cause; an error quotes at most 200 characters of a value (a
    huge tuple was quoted whole); `transfer_guard`'s repr is Python (it showed Rust's
    `Some("log")`)."""
    from lazybuf._lazybuf import _rebuild_trace

    def transfer(bytes_):
        return ((0, 0, 1, None, "transfer", (1, "h2d", bytes_, "host", "d", "c", "sync", 5, None, 1)),)

    with pytest.raises(TypeError, match="bytes must be an int"):
        _rebuild_trace(1, transfer(True), 0)

    class Raises:
        def __index__(self):
            raise ZeroDivisionError("from __index__")

    with pytest.raises(TypeError, match="bytes must be an int") as refused:
        _rebuild_trace(1, transfer(Raises()), 0)
    cause = refused.value.__cause__
    while cause is not None and not isinstance(cause, ZeroDivisionError):
        cause = cause.__cause__
    assert isinstance(cause, ZeroDivisionError)
    with pytest.raises(TypeError) as huge:
        _rebuild_trace(1, transfer(tuple(range(1_000_000))), 0)
    assert len(str(huge.value)) < 400
    assert repr(lazybuf.transfer_guard(h2d="log")) == "lazybuf.transfer_guard(h2d='log', d2h=None, d2d=None)"
    assert pickle.loads(pickle.dumps(_rebuild_trace(1, transfer(7), 0))).events()[0]["bytes"] == 7


@pytest.mark.parametrize("selector", [s for s in one_selector_per_backend() if s != "host"])
def test_a_failed_reload_of_an_evicted_copy_is_not_counted(selector):
    """`spill_stats()["bytes_read_back"]` counted the upload that reloads an evicted device copy
    when it was enqueued, also one that then failed under way (an asynchronous sync whose copy
    fails when waited for), and the upload that succeeded later was not counted: the counter
    told of a reload that never happened. A failed reload is uncounted now, and the one that
    succeeds is counted, once."""
    testing = pytest.importorskip("lazybuf.testing")
    faulty = testing.FaultyDevice(selector)
    n = 16 * 1024
    lazybuf.reset_spill_stats(faulty)
    lazybuf.set_memory_limit(faulty, n * 4)  # room for one device copy
    try:
        a = lazybuf.UnifiedBuffer(n, np.float32, device=faulty)
        a.copy_from(np.arange(n, dtype=np.float32))
        a.sync_to_device()
        b = lazybuf.UnifiedBuffer(n, np.float32, device=faulty)
        b.copy_from(np.ones(n, np.float32))
        b.sync_to_device()  # evicts a's copy
        if lazybuf.spill_stats(faulty)["evictions"] != 1:
            pytest.skip(f"{selector}: no device copy to evict (it shares the host block)")
        b.release()
        collect()
        faulty.defer_copy_faults(True)
        faulty.fail_copy_in(1)
        try:
            with pytest.raises(RuntimeError, match="injected fault"):
                a.sync_to_device_async().wait()
        finally:
            faulty.disarm()
            faulty.defer_copy_faults(False)
        with pytest.raises(RuntimeError, match="injected fault"):
            a.sync_to_device()  # settles the failed transfer, reporting it
        assert lazybuf.spill_stats(faulty)["bytes_read_back"] == 0
        a.sync_to_device()
        assert lazybuf.spill_stats(faulty)["bytes_read_back"] == n * 4
        assert a.state == lazybuf.BufferState.SYNCHRONIZED
        np.testing.assert_array_equal(a.to_numpy(), np.arange(n, dtype=np.float32))
    finally:
        lazybuf.set_memory_limit(faulty, None)


@pytest.mark.parametrize("selector", one_selector_per_backend())
def test_a_copying_constructor_whose_source_is_resized_meanwhile_makes_nothing(selector):
    """`MemoryDevice(src, copy=True)` learnt the source's size, let its lock go to allocate,
    then copied the source's size at that moment: a source resized meanwhile (here by the
    allocation's own failure callback, as another thread can) gave a copy of its first bytes
    followed by uninitialized memory, and no error. The constructor refuses now, making
    nothing."""
    import gc

    import lazybuf.mr as mr

    limited = mr.LimitingResourceAdaptor(mr.DirectMemoryResource(), 1 << 20)
    state = {"calls": 0}

    def on_oom(nbytes):
        state["calls"] += 1
        if state["calls"] > 1:
            return False
        src.resize(16)
        src.shrink_to_fit()
        state.pop("hog")
        gc.collect()
        return True

    mr.set_current_device_resource(mr.FailureCallbackResourceAdaptor(limited, on_oom), selector)
    try:
        src = lazybuf.DeviceBuffer.to_device(bytes(range(256)) * 16, device=selector)
        state["hog"] = lazybuf.DeviceBuffer(size=(1 << 20) - limited.get_allocated_bytes() - 1000, device=selector)
        with pytest.raises(RuntimeError, match="the source was resized while it was being copied"):
            lazybuf.MemoryDevice(src, copy=True)
        assert state["calls"] >= 1
        assert src.tobytes() == bytes(range(16))
    finally:
        mr.set_current_device_resource(None, selector)


@pytest.mark.parametrize("selector", one_selector_per_backend())
def test_fill_and_copy_from_whose_conversion_frees_the_buffer_write_its_new_memory(selector):
    """`fill(x)` whose `x.__float__` calls `free()`, and `copy_from(obj)` whose `obj.__array__`
    does, wrote into the memory `free()` gave up and returned normally: the buffer read zeros
    (`buf[:] = obj` got this right since the fourteenth pass). The memory the buffer has after
    the conversion gets the values now; a conversion that releases the buffer makes the call
    raise, as `copy_from` and `buf[:] =` did."""
    buf = lazybuf.UnifiedBuffer((4,), np.float32, device=selector)
    buf.fill(1)

    class FreeingFloat:
        def __float__(self):
            buf.free()
            return 2.0

    class FreeingArray:
        def __array__(self, *args, **kwargs):
            buf.free()
            return np.full(4, 3, np.float32)

    buf.fill(FreeingFloat())
    np.testing.assert_array_equal(buf.to_numpy(), np.full(4, 2, np.float32))
    buf.copy_from(FreeingArray())
    np.testing.assert_array_equal(buf.to_numpy(), np.full(4, 3, np.float32))

    class ReleasingFloat:
        def __float__(self):
            buf.release()
            return 2.0

    with pytest.raises(ValueError, match="released"):
        buf.fill(ReleasingFloat())
    pool = lazybuf.MemoryPool(selector)
    pooled = pool.acquire((4,), np.float32)
    pooled.fill(1)

    class PoolReleasingArray:
        def __array__(self, *args, **kwargs):
            pool.release(pooled)
            return np.full(4, 3, np.float32)

    with pytest.raises(ValueError, match="released"):
        pooled.copy_from(PoolReleasingArray())


def test_a_memory_resource_refuses_a_bool_as_a_size():
    """`lazybuf.mr`'s `allocate(True)` allocated 1 byte and `deallocate(h, True)` took `True`
    as 1, where every other size argument refuses a bool. Every size refuses one now (the
    check is in the one size parser)."""
    import lazybuf.mr as mr

    direct = mr.DirectMemoryResource()
    with pytest.raises(TypeError, match="a bool is not a size"):
        direct.allocate(True, device="host")
    handle = direct.allocate(1, device="host")
    with pytest.raises(TypeError, match="a bool is not a size"):
        direct.deallocate(handle, True)
    direct.deallocate(handle, 1)


def test_the_cuda_family_receives_a_frame_of_another_cuda_device_in_process():
    """A buffer on a second CUDA device, sent through distributed's `cuda` family and received
    in the same process (as distributed's in-process transfers do), went to the first CUDA
    device, whose borrow refused the frame's pointer ("not memory of ... CUDA device 0"). A
    `DeviceFrame` of this process now says its device, and the buffer is received there."""
    pytest.importorskip("distributed")
    from distributed.protocol import deserialize, serialize

    cuda = [d for d in lazybuf.get_accelerator().devices if d.backend == "cuda"]
    if len(cuda) < 2:
        pytest.skip("fewer than two CUDA devices")
    buf = lazybuf.UnifiedBuffer((7,), np.float32, device=cuda[1])
    buf.copy_from(np.arange(7, dtype=np.float32))
    buf.mark_device_dirty()
    header, frames = serialize(buf, serializers=["cuda", "dask"], on_error="raise")
    assert header["serializer"] == "cuda" and frames[0].device == cuda[1]
    clone = deserialize(header, frames)
    assert clone.device_handle == cuda[1]
    assert clone.state == lazybuf.BufferState.DEVICE_ONLY
    np.testing.assert_array_equal(clone.to_numpy(), np.arange(7, dtype=np.float32))


def test_a_dask_header_whose_shape_holds_no_ints_is_refused():
    """A tampered header's shape `[1.5]` became `(1,)` and `[True, 2]` `(1, 2)` (`int(d)`):
    refused now, as the docs promise for a bad header."""
    pytest.importorskip("distributed")
    import lazybuf._dask

    buf = lazybuf.UnifiedBuffer((2,), np.float32)
    buf.copy_from(np.ones(2, np.float32))
    header, frames = lazybuf._dask.dask_dumps(buf)
    for shape in ([1.5], [True, 2], ["2"]):
        with pytest.raises(ValueError, match="not the header of a serialized lazybuf.UnifiedBuffer"):
            lazybuf._dask.dask_loads({**header, "shape": shape}, frames)
    np.testing.assert_array_equal(lazybuf._dask.dask_loads(header, frames).to_numpy(), np.ones(2, np.float32))


def test_the_cli_reads_a_file_whose_name_is_not_utf8(tmp_path):
    """`python -m lazybuf trace summary FILE` with a file name that is not UTF-8 (as the
    operating system gives it) ended in a `UnicodeEncodeError` traceback: the arguments were
    passed on as `str`. They go as the system's bytes now, as the executable takes them."""
    import os
    import subprocess
    import sys

    with lazybuf.trace.record() as rec:
        buf = lazybuf.UnifiedBuffer((10,), np.float32)
        buf.copy_from(np.zeros(10, np.float32))
    name = os.fsencode(str(tmp_path)) + b"/\xff\xfe.json"
    try:
        lazybuf.trace.dump(name, rec.trace)
    except (OSError, UnicodeError):
        pytest.skip("the file system takes no name that is not UTF-8")
    done = subprocess.run(
        [sys.executable, "-m", "lazybuf", "trace", "summary", name],
        capture_output=True,
        timeout=120,
        env={**os.environ, "LAZYBUF_DEVICE": "host"},
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert b"Traceback" not in done.stderr


def test_watch_takes_an_interval_under_a_millisecond(capfd):
    """`lazybuf.watch(interval=1e-4)` rounded the interval to whole milliseconds, "0ms", which
    the tool refused naming a value the user never typed. It goes to the nanosecond now, and
    one under a nanosecond is refused in the user's own words."""
    assert lazybuf.watch("host", interval=1e-4, count=2) == 0
    assert "0ms" not in capfd.readouterr().err
    with pytest.raises(ValueError, match="interval must be at least 1 ns, got 1e-12"):
        lazybuf.watch("host", interval=1e-12, count=1)


def test_errors_about_huge_values_are_short_and_clean(capfd):
    """From the pass over this pass's fixes: a size with more digits than Python prints
    (`10**5000`) printed an "Exception ignored" traceback before its error (the message
    formatted the int with `str()`, which raised); a limit of `2**200` was refused as "not an
    int"; a pickled trace's version took `True` as 1; a bad name in a pickled trace was quoted
    whole (a megabyte)."""
    from lazybuf._lazybuf import _rebuild_trace

    with pytest.raises(ValueError, match="size is too large"):
        lazybuf.DeviceBuffer(size=10**5000)
    assert "Exception ignored" not in capfd.readouterr().err
    with pytest.raises(ValueError, match="below 2\\*\\*64 - 1"):
        lazybuf.set_memory_limit("host", 2**200)
    event = (0, 1, 1, None, "state", (1, "uninitialized", "host_only", "c"))
    assert len(_rebuild_trace(1, (event,), 0)) == 1
    with pytest.raises(ValueError, match="cannot unpickle format True"):
        _rebuild_trace(True, (event,), 0)
    huge = "x" * 1_000_000
    for bad in ((0, 1, 1, None, huge, ()), (0, 1, 1, None, "state", (1, "uninitialized", huge, "c"))):
        with pytest.raises(ValueError) as refused:
            _rebuild_trace(1, (bad,), 0)
        assert len(str(refused.value)) < 500


def test_watch_takes_any_real_number_of_seconds():
    """`watch(interval=np.float32(1e-4))` and `Fraction(1, 10000)` passed their `str()` on
    ("1e-04", "1/10000"), which the tool refused; `True` went on as "True"; 1.7e308 was called
    not finite (the check overflowed). Any real number of seconds is taken now, a bool
    refused."""
    from fractions import Fraction

    for interval in (np.float32(1e-4), Fraction(1, 10000), 1.7e308):
        assert lazybuf.watch("host", interval=interval, count=1) == 0, interval
    with pytest.raises(ValueError, match="interval must be a number of seconds"):
        lazybuf.watch("host", interval=True, count=1)
