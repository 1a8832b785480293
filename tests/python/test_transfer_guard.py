"""lazybuf.transfer_guard on every device: levels per direction, explicit against implicit
calls, a refused copy changing nothing, threads, the process-wide level and
LAZYBUF_TRANSFER_GUARD. Expectations follow transfer_stats(): on the host device a sync moves
no bytes, so nothing is refused or logged there."""

import copy
import logging
import pickle
import sys
import threading

import numpy as np
import pytest

import lazybuf
from conftest import one_selector_per_backend, run_python


def _devices() -> list[str]:
    return one_selector_per_backend()


def _host_only(device: str, n: int = 1000, seed: int = 1) -> lazybuf.UnifiedBuffer:
    b = lazybuf.UnifiedBuffer((n,), np.uint32, device=device)
    b.copy_from(np.arange(n, dtype=np.uint32) * seed)
    return b


def _moves(device: str) -> bool:
    """Whether a host-device sync on `device` moves bytes (not the host device's aliasing)."""
    b = _host_only(device, 16)
    b.sync_to_device()
    return b.transfer_stats()["host_to_device_bytes"] > 0


def _snapshot(b: lazybuf.UnifiedBuffer):
    return (b.state, b.transfer_stats())


@pytest.mark.parametrize("device", _devices())
def test_disallow_refuses_implicit_copies_allows_explicit_ones_and_changes_nothing(device):
    b = _host_only(device, seed=3)
    before = _snapshot(b)
    with lazybuf.transfer_guard("disallow"):
        if _moves(device):
            with pytest.raises(lazybuf.TransferGuardError) as info:
                b.device
            err = info.value
            assert (err.buffer_id, err.direction, err.nbytes, err.call) == (b.buffer_id, "h2d", 4000, ".device")
            assert f"buffer {b.buffer_id}" in str(err) and "4000 bytes" in str(err)
            assert isinstance(err, RuntimeError)
            with pytest.raises(lazybuf.TransferGuardError):
                b.mark_device_dirty()
            assert _snapshot(b) == before
            b.sync_to_device()  # explicit: allowed under "disallow"
            assert b.transfer_stats()["host_to_device_copies"] == 1
        else:
            b.device
            b.sync_to_device()
            assert b.transfer_stats()["host_to_device_bytes"] == 0
    np.testing.assert_array_equal(b.to_numpy(), np.arange(1000, dtype=np.uint32) * 3)


@pytest.mark.parametrize("device", _devices())
def test_disallow_explicit_refuses_every_call_per_direction_including_async(device):
    moves = _moves(device)
    b = _host_only(device, seed=5)
    before = _snapshot(b)
    with lazybuf.transfer_guard(h2d="disallow_explicit"):
        for call in (b.sync_to_device, lambda: b.sync_to_device_async().wait(), lambda: b.device):
            if moves:
                with pytest.raises(lazybuf.TransferGuardError):
                    call()
                assert _snapshot(b) == before
            else:
                call()
    b.mark_device_dirty()
    before = _snapshot(b)
    with lazybuf.transfer_guard_device_to_host("disallow_explicit"):
        out = np.zeros(1000, np.uint32)
        calls = (
            b.sync_to_host,
            lambda: b.sync_to_host_async().wait(),
            b.to_numpy,
            lambda: b.copy_to(out),
            lambda: b.host,
            lambda: b.host_readonly,
        )
        for call in calls:
            if moves:
                with pytest.raises(lazybuf.TransferGuardError) as info:
                    call()
                assert info.value.direction == "d2h"
                assert _snapshot(b) == before
            else:
                call()
        if moves:
            assert not out.any(), "a refused copy_to wrote its output"
        # h2d is not guarded here.
        b.sync_to_device()
    with lazybuf.transfer_guard_device_to_host("disallow"):
        # Explicit calls are allowed under "disallow", implicit accesses are not.
        if moves:
            with pytest.raises(lazybuf.TransferGuardError):
                b.host_readonly
        np.testing.assert_array_equal(b.to_numpy(), np.arange(1000, dtype=np.uint32) * 5)


@pytest.mark.parametrize("device", _devices())
def test_the_export_protocols_name_themselves_and_a_refusal_changes_nothing(device):
    exports = [
        ("buffer protocol", lambda b: memoryview(b)),
        ("__array_interface__", lambda b: b.__array_interface__),
        # A host export (a CUDA buffer's default export is its device copy: no copy there).
        ("__dlpack__", lambda b: b.__dlpack__(dl_device=(1, 0))),
        # Pickling, every protocol: implicit (a hostile pass, 2026-11-27: protocols 0-4, the
        # default before Python 3.14, downloaded as an explicit `read_into` that `disallow`
        # let through, and protocol 5 was named `host`).
        ("__reduce_ex__", lambda b: pickle.dumps(b, protocol=4)),
        ("__reduce_ex__", lambda b: pickle.dumps(b, protocol=5)),
        ("__reduce_ex__", lambda b: copy.copy(b)),
        ("__reduce__", lambda b: b.__reduce__()),
    ]
    for call, export in exports:
        b = _host_only(device, seed=7)
        b.device
        b.mark_device_dirty()
        before = _snapshot(b)
        with lazybuf.transfer_guard(d2h="disallow"):
            if _moves(device):
                with pytest.raises(lazybuf.TransferGuardError) as info:
                    export(b)
                assert (info.value.direction, info.value.call) == ("d2h", call)
                assert _snapshot(b) == before
            else:
                export(b)  # the host device: no copy to refuse
        np.testing.assert_array_equal(b.to_numpy(), np.arange(1000, dtype=np.uint32) * 7)


def _logged(caplog, b: lazybuf.UnifiedBuffer) -> list[str]:
    """The guard's records about `b` so far (and forgets every record)."""
    lines = [
        r.getMessage()
        for r in caplog.records
        if r.name == "lazybuf.transfer_guard" and f"of buffer {b.buffer_id}," in r.getMessage()
    ]
    assert all(r.levelname == "WARNING" for r in caplog.records if r.name == "lazybuf.transfer_guard")
    caplog.clear()
    return lines


@pytest.mark.parametrize("device", _devices())
def test_log_levels_log_each_copy_the_counters_count(device, caplog):
    caplog.set_level("WARNING", logger="lazybuf.transfer_guard")
    b = _host_only(device)
    with lazybuf.transfer_guard("log"):
        b.device  # implicit: logged
        # A record is made when the call that copied returns, not when the block ends.
        lines = _logged(caplog, b)
        b.mark_device_dirty()
        b.sync_to_host()  # explicit: not logged under "log"
        assert _logged(caplog, b) == []
    stats = b.transfer_stats()
    assert len(lines) == stats["host_to_device_copies"], lines
    assert all(line.startswith("lazybuf transfer guard (log): ") for line in lines), lines
    assert all("implicit .device" in line for line in lines), lines
    with lazybuf.transfer_guard("log_explicit"):
        b.mark_device_dirty()
        b.sync_to_host()
    lines = _logged(caplog, b)
    assert len(lines) == b.transfer_stats()["device_to_host_copies"] - stats["device_to_host_copies"], lines
    assert all("explicit sync_to_host" in line for line in lines), lines


def test_a_raising_log_handler_changes_nothing_for_the_call(caplog):
    device = next((d for d in _devices() if _moves(d)), None)
    if device is None:
        pytest.skip("no device that copies")

    def refuse(record):
        raise RuntimeError("a handler that raises")

    logger = logging.getLogger("lazybuf.transfer_guard")
    logger.addFilter(refuse)
    unraisable = []
    previous_hook = sys.unraisablehook
    sys.unraisablehook = unraisable.append
    try:
        b = _host_only(device, seed=3)
        with lazybuf.transfer_guard("log"):
            b.device
            b.mark_device_dirty()
        np.testing.assert_array_equal(b.to_numpy(), np.arange(1000, dtype=np.uint32) * 3)
        assert b.transfer_stats()["host_to_device_copies"] == 1
    finally:
        sys.unraisablehook = previous_hook
        logger.removeFilter(refuse)
    assert [type(u.exc_value) for u in unraisable] == [RuntimeError], unraisable
    # Its traceback holds this frame, and so `b` with its device copy, past the test: later
    # tests that count a device's evictions would evict it.
    unraisable.clear()


def test_a_handler_whose_calls_copy_logs_their_copies_at_the_next_return(caplog):
    device = next((d for d in _devices() if _moves(d)), None)
    if device is None:
        pytest.skip("no device that copies")
    caplog.set_level("WARNING", logger="lazybuf.transfer_guard")
    b, other = _host_only(device, seed=1), _host_only(device, seed=2)

    class Copying(logging.Handler):
        def emit(self, record):
            # Every line about `b` makes a logged copy of `other`: handed on later, not from
            # inside this handler (which would recurse for as long as lines come).
            if f"of buffer {b.buffer_id}," in record.getMessage():
                other.mark_host_dirty()
                other.device

    handler = Copying()
    logger = logging.getLogger("lazybuf.transfer_guard")
    logger.addHandler(handler)
    try:
        with lazybuf.transfer_guard("log"):
            b.device
            assert len(_logged(caplog, b)) == 1
            assert _logged(caplog, other) == []
            b.mark_device_dirty()  # its return hands `other`'s line on
            assert len(_logged(caplog, other)) == 1
    finally:
        logger.removeHandler(handler)
    np.testing.assert_array_equal(other.to_numpy(), np.arange(1000, dtype=np.uint32) * 2)


def test_copies_logged_on_other_threads_are_recorded_there(caplog):
    device = next((d for d in _devices() if _moves(d)), None)
    if device is None:
        pytest.skip("no device that copies")
    caplog.set_level("WARNING", logger="lazybuf.transfer_guard")
    buffers = [_host_only(device, seed=s) for s in range(4)]

    def work(b):
        with lazybuf.transfer_guard("log"):
            b.device

    threads = [threading.Thread(target=work, args=(b,), name=f"guarded-{i}") for i, b in enumerate(buffers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, b in enumerate(buffers):
        records = [r for r in caplog.records if f"of buffer {b.buffer_id}," in r.getMessage()]
        assert len(records) == 1, [r.getMessage() for r in caplog.records]
        assert records[0].threadName.startswith("guarded-"), records[0].threadName


def test_logged_copies_reach_logging_at_the_latest_at_exit():
    device = next((d for d in _devices() if _moves(d)), None)
    if device is None:
        pytest.skip("no device that copies")
    # LAZYBUF_TRANSFER_GUARD=log, `logging` not configured: Python's last-resort handler prints
    # each WARNING on standard error.
    code = f"""
        import os
        os.environ["LAZYBUF_TRANSFER_GUARD"] = "log"
        import numpy as np, lazybuf
        b = lazybuf.UnifiedBuffer((1000,), np.uint32, device={device!r})
        b.copy_from(np.arange(1000, dtype=np.uint32))
        b.device
        b.mark_device_dirty()
        print(int(np.asarray(b).sum()), flush=True)
    """
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(sum(range(1000))), result.stdout
    lines = [line for line in result.stderr.splitlines() if line.startswith("lazybuf transfer guard (log): ")]
    assert any("host-to-device copy of 4000 bytes" in line for line in lines), result.stderr
    assert any("device-to-host copy of 4000 bytes" in line for line in lines), result.stderr


def test_a_threads_guard_stays_on_its_thread():
    device = next((d for d in _devices() if d != "host" and _moves(d)), None)
    if device is None:
        pytest.skip("no device that copies")
    inside, done = threading.Event(), threading.Event()
    results = {}

    def other():
        inside.wait()
        try:
            _host_only(device).device
            results["other"] = "ok"
        except lazybuf.TransferGuardError as err:
            results["other"] = err
        done.set()

    t = threading.Thread(target=other)
    t.start()
    with lazybuf.transfer_guard("disallow_explicit"):
        inside.set()
        done.wait()
        with pytest.raises(lazybuf.TransferGuardError):
            _host_only(device).sync_to_device()
        assert lazybuf.get_transfer_guard() == {"h2d": "disallow_explicit", "d2h": "disallow_explicit", "d2d": "disallow_explicit"}
    t.join()
    assert results["other"] == "ok"
    assert lazybuf.get_transfer_guard() == {"h2d": "allow", "d2h": "allow", "d2d": "allow"}


def test_the_process_wide_level_reaches_other_threads_and_a_thread_level_wins():
    device = next((d for d in _devices() if d != "host" and _moves(d)), None)
    if device is None:
        pytest.skip("no device that copies")
    results = []
    lazybuf.set_transfer_guard(h2d="disallow")
    try:
        t = threading.Thread(target=lambda: results.append(_try(lambda: _host_only(device).device)))
        t.start()
        t.join()
        with lazybuf.transfer_guard(h2d="allow"):
            _host_only(device).device
    finally:
        lazybuf.set_transfer_guard("allow")
    assert isinstance(results[0], lazybuf.TransferGuardError), results
    _host_only(device).device


def _try(f):
    try:
        return f()
    except Exception as err:  # noqa: BLE001 - returned for the assertion
        return err


@pytest.mark.parametrize(
    "call",
    [
        lambda: lazybuf.transfer_guard("nope"),
        lambda: lazybuf.transfer_guard(h2d="disalow"),
        lambda: lazybuf.transfer_guard(),
        lambda: lazybuf.set_transfer_guard(d2d=3),
        lambda: lazybuf.transfer_guard_host_to_device("forbid"),
    ],
)
def test_bad_levels_are_a_clear_value_error(call):
    with pytest.raises(ValueError, match="allow, log, disallow, log_explicit, disallow_explicit"):
        call()
    assert lazybuf.get_transfer_guard() == {"h2d": "allow", "d2h": "allow", "d2d": "allow"}


def test_the_environment_variable_sets_the_process_wide_level():
    device = next((d for d in _devices() if d != "host" and _moves(d)), None)
    if device is None:
        pytest.skip("no device that copies")
    code = f"""
        import os
        os.environ["LAZYBUF_TRANSFER_GUARD"] = "h2d=disallow"
        import numpy as np, lazybuf
        print(lazybuf.get_transfer_guard())
        b = lazybuf.UnifiedBuffer((10,), np.float32, device={device!r})
        b.copy_from(np.ones(10, np.float32))
        try:
            b.device
        except lazybuf.TransferGuardError as err:
            print("REFUSED", err.direction)
        b.sync_to_device()
        print("DONE")
    """
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert "'h2d': 'disallow'" in result.stdout and "REFUSED h2d" in result.stdout, result.stdout
    assert "DONE" in result.stdout


def test_a_malformed_environment_variable_is_a_clear_error():
    code = """
        import os
        os.environ["LAZYBUF_TRANSFER_GUARD"] = "disalow"
        import numpy as np, lazybuf
        try:
            lazybuf.get_transfer_guard()
        except ValueError as err:
            print("GET", err)
        b = lazybuf.UnifiedBuffer((10,), np.float32)
        try:
            b.host
        except ValueError as err:
            print("USE", err)
        try:  # a hostile pass (2026-11-27): it returned as if the level were set
            lazybuf.set_transfer_guard("allow")
        except ValueError as err:
            print("SET", err)
    """
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    for prefix in ("GET", "USE", "SET"):
        line = next(line for line in result.stdout.splitlines() if line.startswith(prefix))
        assert "LAZYBUF_TRANSFER_GUARD" in line and "disallow_explicit" in line and "'disalow'" not in line, line
        assert '"disalow"' in line, line


@pytest.mark.parametrize("device", _devices())
def test_a_read_back_straight_from_the_device_is_guarded_and_recorded(device):
    """to_numpy() and to_numpy(out=) of a buffer whose device copy is newer copy it straight
    into the array (not through the plans): the guard sees that download as the explicit
    copy it is, and the recorder records it."""
    b = _host_only(device, seed=5)
    b.sync_to_device()
    b.mark_device_dirty()
    expected = np.arange(1000, dtype=np.uint32) * 5
    before = _snapshot(b)
    out = np.zeros(1000, np.uint32)
    if _moves(device):
        with lazybuf.transfer_guard(d2h="disallow_explicit"):
            with pytest.raises(lazybuf.TransferGuardError) as info:
                b.to_numpy()
            assert (info.value.direction, info.value.call) == ("d2h", "to_numpy")
            with pytest.raises(lazybuf.TransferGuardError):
                b.to_numpy(out=out)
        assert _snapshot(b) == before and not out.any()
    with lazybuf.transfer_guard(d2h="disallow"), lazybuf.trace.record() as recording:
        np.testing.assert_array_equal(b.to_numpy(out=out), expected)  # explicit: allowed
    copies = [e for e in recording.trace.events() if e["kind"] == "transfer" and e["buffer"] == b.buffer_id]
    assert len(copies) == b.transfer_stats()["device_to_host_copies"] - before[1]["device_to_host_copies"]
    assert len(copies) == (1 if _moves(device) else 0)


@pytest.mark.parametrize("device", _devices())
def test_copy_to_a_converting_or_strided_array_is_explicit(device):
    """A hostile pass (2026-11-27): copy_to into an array of another dtype or layout took the
    host view through `.host_readonly`, whose cause replaced copy_to's: "disallow" refused it
    as implicit, although copy_to is documented as explicit."""
    b = lazybuf.UnifiedBuffer((64,), np.int32, device=device)
    b.copy_from(np.arange(64, dtype=np.int32))
    b.sync_to_device()
    b.mark_device_dirty()
    with lazybuf.transfer_guard("disallow"):
        wide = np.empty(64, np.int64)
        b.copy_to(wide)
        strided = np.empty(128, np.int32)[::2]
        b.copy_to(strided)
    np.testing.assert_array_equal(wide, np.arange(64))
    np.testing.assert_array_equal(strided, np.arange(64))


def test_a_direction_named_twice_in_the_environment_variable_is_refused():
    """A hostile pass (2026-11-27): `h2d=disallow,d2h=disallow,h2d=allow` set h2d to `allow`,
    the later entry silently winning, so a `disallow` asked for was off. A direction named
    twice is an error, as a device named twice in LAZYBUF_MEMORY_LIMIT is."""
    code = """
        import os
        os.environ["LAZYBUF_TRANSFER_GUARD"] = "h2d=disallow,d2h=disallow,h2d=allow"
        import numpy as np, lazybuf
        try:
            print("GOT", lazybuf.get_transfer_guard())
        except ValueError as err:
            print("GET", err)
        b = lazybuf.UnifiedBuffer((10,), np.float32)
        try:
            b.host
        except ValueError as err:
            print("USE", err)
    """
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert "GOT" not in result.stdout, result.stdout
    for prefix in ("GET", "USE"):
        line = next(line for line in result.stdout.splitlines() if line.startswith(prefix))
        assert "LAZYBUF_TRANSFER_GUARD" in line and "expected each direction once" in line, line
        assert "h2d twice" in line and "h2d=disallow" in line and "h2d=allow" in line, line


@pytest.mark.parametrize("device", _devices())
def test_calls_made_through_other_calls_are_named_after_what_the_user_called(device):
    """A hostile pass (2026-11-27): `b[3]` was refused as `.host_readonly`, `b[3] = v` as
    `.host`, `__array__(copy=True)` as an explicit `to_numpy` (so `disallow` let it through),
    `synchronize()` as `sync_to_host`: the outermost call names the copy, and its reason."""
    import asyncio

    if not _moves(device):
        pytest.skip("the host device: its syncs move no bytes")
    device_dirty = [
        ("__getitem__", False, lambda b: b[3]),
        ("__setitem__", False, lambda b: b.__setitem__(3, 9)),
        ("__array__", False, lambda b: b.__array__(copy=True)),
        ("synchronize", True, lambda b: b.synchronize()),
        ("ensure_on_host", True, lambda b: asyncio.run(b.ensure_on_host())),
    ]
    for call, explicit, use in device_dirty:
        b = _host_only(device, seed=3)
        b.device
        b.mark_device_dirty()
        before = _snapshot(b)
        with lazybuf.transfer_guard(d2h="disallow_explicit" if explicit else "disallow"):
            with pytest.raises(lazybuf.TransferGuardError) as info:
                use(b)
        assert (info.value.direction, info.value.call) == ("d2h", call)
        assert _snapshot(b) == before
        if explicit:  # `disallow` lets an explicit call through
            with lazybuf.transfer_guard(d2h="disallow"):
                use(b)
            np.testing.assert_array_equal(b.host_readonly, np.arange(1000, dtype=np.uint32) * 3)
    b = _host_only(device, seed=3)
    with lazybuf.transfer_guard(h2d="disallow_explicit"):
        with pytest.raises(lazybuf.TransferGuardError) as info:
            asyncio.run(b.ensure_on_device())
    assert (info.value.direction, info.value.call) == ("h2d", "ensure_on_device")


@pytest.mark.parametrize("device", _devices())
def test_an_assignment_to_every_element_is_no_copy_and_a_partial_one_is_refused(device):
    """`buf[:] = x` reads no old byte: under `d2h="disallow"` it overwrites a stale host copy
    (nothing to refuse), while `buf[1:] = x` needs the device copy first and is refused."""
    if not _moves(device):
        pytest.skip("the host device: its syncs move no bytes")
    values = np.arange(1000, dtype=np.uint32) * 7
    b = _host_only(device, seed=3)
    b.device
    b.mark_device_dirty()
    before = _snapshot(b)
    with lazybuf.transfer_guard(d2h="disallow"):
        with pytest.raises(lazybuf.TransferGuardError) as info:
            b[1:] = values[1:]
        assert (info.value.direction, info.value.call) == ("d2h", "__setitem__")
        assert _snapshot(b) == before
        b[:] = values
    np.testing.assert_array_equal(b.to_numpy(), values)
