"""What the twentieth hostile pass (the twelfth session's surface as a hostile user drives it:
memory objects' allocation events, copies outside the plans, the fast path of `buf[key] =
array`, the trace tools) found, each a test that failed before its fix. Each means the same on
every device (on the host device the copies are one memory: nothing to refuse).
"""

import os
import pickle
import shutil
import stat
import tempfile

import numpy as np
import pytest

import lazybuf
from conftest import one_selector_per_backend
from lazybuf import BufferState, TransferGuardError, UnifiedBuffer

N = 1024
WITH_MEMORY = [s for s in one_selector_per_backend() if s != "host"]
KINDS = [lazybuf.MemoryDevice, lazybuf.MemoryHost, lazybuf.MemoryShared]


@pytest.fixture(autouse=True)
def _clean():
    yield
    if lazybuf.trace.is_recording():
        lazybuf.trace.stop()


def _made(kind, *args, **kwargs):
    """A memory object, or None where the device has no such memory (pinned on wgpu, shared
    where the device has none)."""
    try:
        return kind(*args, **kwargs)
    except (ValueError, MemoryError):
        return None


def _memory_events(trace):
    return [e for e in trace.events() if e["kind"] in ("allocate", "free")]


def _sources(selector):
    """Memory on `selector` to copy from: a memory object of each kind it has, a device
    buffer, and a UnifiedBuffer whose device copy alone is current."""
    sources = {}
    for kind in KINDS:
        m = _made(kind, N, device=selector)
        if m is not None:
            m.copy_from_host(np.arange(N, dtype=np.uint8))
            sources[kind.__name__] = m
    sources["DeviceBuffer"] = lazybuf.to_device(np.arange(N, dtype=np.uint8), device=selector)
    ub = UnifiedBuffer((N,), np.uint8, device=selector)
    ub[:] = np.arange(N, dtype=np.uint8)
    ub.sync_to_device()
    ub.mark_device_dirty()
    sources["UnifiedBuffer"] = ub
    return sources


@pytest.mark.parametrize("selector", WITH_MEMORY)
def test_a_refused_copying_constructor_allocates_and_records_nothing(selector):
    """`MemoryDevice(other, copy=True)` (and `MemoryHost`, `MemoryShared`) allocated its memory,
    then asked the guard about the copy: a refused constructor took a block (which may spill
    another buffer for room) and recorded its allocation and its free. The guard decides
    before anything is allocated now."""
    for name, source in _sources(selector).items():
        for kind in KINDS:
            if _made(kind, 1, device=selector) is None:
                continue
            with lazybuf.trace.record() as rec:
                with lazybuf.transfer_guard("disallow_explicit"):
                    try:
                        kind(source, copy=True)
                    except TransferGuardError:
                        pass
                    else:
                        continue  # a copy between host memories: nothing to refuse
            assert _memory_events(rec.trace) == [], (name, kind.__name__)


@pytest.mark.parametrize("selector", WITH_MEMORY)
def test_a_refused_unpickling_allocates_and_records_nothing(selector):
    """Unpickling a memory object uploads its bytes, an implicit copy: it allocated first, so
    a refused `pickle.loads` recorded an allocation and a free."""
    for kind in KINDS:
        m = _made(kind, N, device=selector)
        if m is None:
            continue
        data = pickle.dumps(m)
        with lazybuf.trace.record() as rec:
            with lazybuf.transfer_guard("disallow"):
                try:
                    pickle.loads(data)
                except TransferGuardError:
                    pass
                else:
                    continue  # host memory: nothing to refuse
        assert _memory_events(rec.trace) == [], kind.__name__
        assert pickle.loads(data).tobytes() == m.tobytes()


@pytest.mark.parametrize("selector", WITH_MEMORY)
def test_a_copy_of_a_unified_buffer_goes_to_its_device_whichever_copy_is_current(selector):
    """`MemoryDevice(buf, copy=True)` without `device=` went to the device the copy was read
    from: the buffer's own device when its device copy alone was current, the host device when
    its host copy was. It goes to the buffer's device, as a copy of a memory object or a device
    buffer goes to theirs."""
    buf = UnifiedBuffer((N,), np.float32, device=selector)
    buf[:] = 1.5
    assert buf.state in (BufferState.HOST_ONLY, BufferState.HOST_DIRTY)
    from_host = lazybuf.MemoryDevice(buf, copy=True)
    buf.sync_to_device()
    buf.mark_device_dirty()
    from_device = lazybuf.MemoryDevice(buf, copy=True)
    assert from_host.device == from_device.device
    assert from_host.device.backend == selector
    for m in (from_host, from_device):
        assert np.array_equal(np.frombuffer(m.tobytes(), np.float32), np.full(N, 1.5, np.float32))


def test_a_dump_to_a_long_file_name_is_written(tmp_path):
    """`trace.dump` to a file whose name is long but legal (250 bytes; the limit is 255)
    failed with "File name too long", naming a temporary file the caller never asked for: the
    file written beside it, then renamed over it, took the whole name and more."""
    lazybuf.trace.start()
    trace = lazybuf.trace.stop()
    path = tmp_path / ("d" * 245 + ".json")
    lazybuf.trace.dump(path, trace)
    assert path.read_text(encoding="utf-8") == trace.to_chrome_json()
    path.write_text("earlier", encoding="utf-8")
    lazybuf.trace.dump(path, trace)  # over an earlier file too
    assert path.read_text(encoding="utf-8") == trace.to_chrome_json()
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


@pytest.mark.parametrize("selector", WITH_MEMORY)
def test_a_copy_read_off_a_unified_buffers_device_is_seen(selector):
    """A copy from a UnifiedBuffer whose device copy alone is current reads that copy in place,
    or, where the backend cannot lend its memory (wgpu), downloads it into a staging block
    first: that download was neither asked of the guard nor recorded (a device-to-host copy
    that `d2h="disallow_explicit"` let through, and a trace that never saw the bytes leave the
    device). It is the buffer's own download into outside memory now, as `to_numpy()`'s is."""
    buf = UnifiedBuffer((N,), np.float32, device=selector)
    buf[:] = 2.5
    buf.sync_to_device()
    buf.mark_device_dirty()
    with lazybuf.trace.record() as rec:
        buf.sync_to_host()
    (copy,) = [e for e in rec.trace.events() if e["kind"] == "transfer"]
    device_name = copy["from"]
    buf.mark_device_dirty()
    calls = (
        lambda: lazybuf.MemoryDevice(buf, copy=True),
        lambda: lazybuf.MemoryDevice(N * 4, device=selector).copy_from_device(buf),
    )
    for call in calls:
        with lazybuf.transfer_guard(h2d="allow", d2h="disallow_explicit", d2d="disallow_explicit"):
            with pytest.raises(TransferGuardError):
                call()
        assert buf.state == BufferState.DEVICE_DIRTY
        with lazybuf.trace.record() as rec:
            call()
        read = [e for e in rec.trace.events() if e["kind"] == "transfer" and e["from"] == device_name]
        assert [e["bytes"] for e in read] == [N * 4], rec.trace.events()
    m = lazybuf.MemoryDevice(buf, copy=True)
    assert np.array_equal(np.frombuffer(m.tobytes(), np.float32), np.full(N, 2.5, np.float32))


def test_a_stack_through_a_file_whose_name_is_not_utf8_is_kept(tmp_path):
    """`trace.start(python_stack=True)` attached no stack at all to an event whose Python
    stack passed through a module whose file name is not UTF-8 (a lone surrogate in the str):
    the whole stack was dropped. It is kept, the name's bad bytes replaced."""
    import importlib.util
    import os

    name = os.fsdecode(b"hostile20_mod\xff.py")
    try:
        path = tmp_path / name
        path.write_text("def go(buf):\n    buf[:] = 3.0\n", encoding="utf-8")
    except (OSError, UnicodeEncodeError):
        pytest.skip("the file system takes no name that is not UTF-8")
    spec = importlib.util.spec_from_file_location("hostile20_mod", str(path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    buf = UnifiedBuffer((8,), np.float32)
    lazybuf.trace.start(python_stack=True)
    try:
        module.go(buf)
    finally:
        trace = lazybuf.trace.stop()
    stacks = [e["stack"] for e in trace.events() if e.get("stack") is not None]
    assert stacks, trace.events()
    assert all("hostile20_mod" in s and "test_a_stack_through" in s for s in stacks), stacks


@pytest.mark.parametrize("selector", WITH_MEMORY)
def test_an_assignment_that_another_thread_made_stale_says_so(selector):
    """`buf[key] = array` while another thread makes the device copy current (which makes the
    host view read-only) or frees the memory: the write was refused with NumPy's "assignment
    destination is read-only", naming no cause, where the same race caught a moment later says
    the host copy went stale. The buffer's own reasons are raised first now. (Runs until both
    threads are done with their counts: the race is hit or not, never waited for.)"""
    import threading

    buf = UnifiedBuffer((64, 8), np.float32, device=selector)
    buf[...] = 0
    done = threading.Event()
    said = set()

    def assign():
        row = np.ones((4, 8), np.float32)
        for i in range(3000):
            try:
                buf[i % 60 : i % 60 + 4] = row
                buf[i % 60, 1:3] = row[0, :2]
            except (ValueError, RuntimeError) as e:
                said.add(str(e))
        done.set()

    def disturb():
        i = 0
        while not done.is_set():
            i += 1
            if i % 5 == 0:
                buf.free()
            else:
                buf.sync_to_device()
                buf.mark_device_dirty()

    threads = [threading.Thread(target=assign), threading.Thread(target=disturb)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not [s for s in said if "read-only" in s], said
    assert all("went stale" in s or "was freed" in s for s in said), said


def test_a_call_made_inside_another_keeps_the_threads_time_going_forward():
    """A call the user's code made while lazybuf ran another (NumPy's conversion running a
    `__float__` that makes and drops a buffer) put the enclosing call's time back when it
    returned, so the enclosing call's later events (the dropped buffer's free) were stamped
    before the nested call's (its allocation): the trace held a free before its allocation, and
    a memory timeline drawn from it went below zero. The enclosing call's events go on from the
    nested call's latest time now."""
    made = []

    class Value:
        def __float__(self):
            t = UnifiedBuffer((4,), np.float32)
            t[:] = 1.0  # a call of its own: the host block's allocation
            made.append(t.buffer_id)
            del t  # its free, inside the enclosing assignment
            return 2.0

    buf = UnifiedBuffer((4,), np.float32)
    buf[...] = 0
    with lazybuf.trace.record() as rec:
        buf[0:2] = np.array([Value(), Value()], dtype=object)
    assert np.array_equal(buf.to_numpy(), [2, 2, 0, 0])
    events = rec.trace.events()
    times = [e["time_us"] for e in events if e.get("thread") == events[0]["thread"]]
    assert times == sorted(times)
    for i in made:
        kinds = [(e["kind"], e["time_us"]) for e in events if e.get("buffer") == i and e["kind"] in ("allocate", "free")]
        assert [k for k, _ in kinds] == ["allocate", "free"], (i, kinds)
        assert kinds[0][1] <= kinds[1][1], (i, kinds)


@pytest.mark.parametrize("selector", WITH_MEMORY)
def test_a_refused_copy_from_a_unified_buffer_reads_nothing(selector):
    """The copy into memory from a UnifiedBuffer whose device copy alone is current, refused by
    the guard (the copy into the memory, not the read of the buffer) or too large for the
    memory, changes nothing of the buffer: on wgpu the buffer's own staging download (seen and
    counted since this pass) ran first and was counted and recorded for a call that then
    failed."""
    buf = UnifiedBuffer((N,), np.float32, device=selector)
    buf[:] = 2.5
    buf.sync_to_device()
    buf.mark_device_dirty()
    before = (buf.state, buf.transfer_stats())
    calls = [
        lambda: lazybuf.MemoryDevice(buf, copy=True),
        lambda: lazybuf.MemoryDevice(N * 4, device=selector).copy_from_device(buf),
        lambda: lazybuf.DeviceBuffer(size=N * 4, device=selector).copy_from_device(buf),
    ]
    for call in calls:
        with lazybuf.trace.record() as rec:
            with lazybuf.transfer_guard(h2d="disallow_explicit", d2h="allow", d2d="disallow_explicit"):
                with pytest.raises(TransferGuardError):
                    call()
        assert (buf.state, buf.transfer_stats()) == before
        assert [e for e in rec.trace.events() if e.get("buffer") == buf.buffer_id] == []
    for small in (lazybuf.MemoryDevice(N, device=selector), lazybuf.DeviceBuffer(size=N, device=selector)):
        with lazybuf.trace.record() as rec:
            with pytest.raises(ValueError, match="too large"):
                small.copy_from_device(buf)
        assert (buf.state, buf.transfer_stats()) == before
        assert [e for e in rec.trace.events() if e.get("buffer") == buf.buffer_id] == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="runs the write as another user in a child")
def test_a_dump_over_a_read_only_file_is_refused():
    """`trace.dump` over a file the user may not write (read-only) replaced it: the dump is
    written beside it and renamed over it, which needs only the folder writable. It raises
    `PermissionError` now, as `open(path, "w")` would, and leaves the file as it was. As root
    (CI), which may write any file, the dump runs as `nobody` in a forked child."""
    lazybuf.trace.start()
    trace = lazybuf.trace.stop()
    folder = tempfile.mkdtemp(prefix="lazybuf-read-only-")
    try:
        os.chmod(folder, 0o777)
        path = os.path.join(folder, "kept.json")
        with open(path, "w", encoding="utf-8") as f:
            f.write("earlier")
        os.chmod(path, stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)

        def dump_refused() -> bool:
            try:
                lazybuf.trace.dump(path, trace)
            except PermissionError:
                return True
            return False

        if os.geteuid() == 0:
            pid = os.fork()
            if pid == 0:  # the child: as nobody, which may not write the file
                code = 2
                try:
                    os.setgid(65534)
                    os.setuid(65534)
                    code = 0 if dump_refused() else 1
                finally:
                    os._exit(code)
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0, "a read-only file was replaced"
        else:
            assert dump_refused(), "a read-only file was replaced"
        with open(path, encoding="utf-8") as f:
            assert f.read() == "earlier"
        assert sorted(os.listdir(folder)) == ["kept.json"]
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_dump_to_a_link_to_nothing_is_refused(tmp_path):
    """`trace.dump` to a symbolic link whose target does not exist replaced the link itself with
    the file (the rename over the link's name), where `open(path, "w")` fails or writes the
    target and the CLI's `plot -o` refuses a link to nothing. It is refused now, the link kept."""
    lazybuf.trace.start()
    trace = lazybuf.trace.stop()
    link = tmp_path / "trace.json"
    link.symlink_to(tmp_path / "missing" / "trace.json")
    with pytest.raises(FileNotFoundError, match="a symbolic link to nothing"):
        lazybuf.trace.dump(link, trace)
    assert link.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.json"]


@pytest.mark.parametrize("name", ["", "missing/trace.json", "trace.json/"])
def test_a_failed_dump_names_the_file_asked_for(tmp_path, name):
    """A dump that cannot be written (an empty name, a folder that does not exist, a name ending
    in a slash) raised an error naming the temporary file it writes first (".trace.json.12-0.tmp"),
    a file the caller never named, or made that file in the working folder before failing. It
    names the file asked for now, as `open(path, "w")` does, and leaves nothing behind."""
    lazybuf.trace.start()
    trace = lazybuf.trace.stop()
    path = os.path.join(str(tmp_path), name) if name else ""  # (pathlib would drop the slash)
    with pytest.raises(OSError) as raised:
        lazybuf.trace.dump(path, trace)
    # (The temporary file is `.NAME.PID-N.tmp`; pytest's own folder may end in `.tmp`.)
    assert raised.value.filename == path and f".{os.getpid()}-" not in str(raised.value), raised.value
    assert list(tmp_path.iterdir()) == []
