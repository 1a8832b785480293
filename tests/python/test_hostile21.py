"""What the twenty-first hostile pass (Python 3.12 and 3.13 as a hostile user drives them: the
buffer protocol from Python (PEP 688), `sys.monitoring`, finalization at exit; and processes:
spawn, forkserver, subprocesses) found, each a test that failed before its fix. Each means the
same on every device.
"""

import ctypes
import importlib.util
import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import lazybuf
from conftest import one_selector_per_backend
from lazybuf import BufferState, UnifiedBuffer

# PyBUF_* request flags (inspect.BufferFlags from Python 3.12; the same numbers on 3.11)
PYBUF_WRITABLE, PYBUF_FORMAT, PYBUF_ND, PYBUF_STRIDES = 0x1, 0x4, 0x8, 0x18
PYBUF_F_CONTIGUOUS = 0x40 | PYBUF_STRIDES


class _PyBuffer(ctypes.Structure):
    _fields_ = [
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.c_void_p),  # a reference PyBuffer_Release drops: not for ctypes to own
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.POINTER(ctypes.c_ssize_t)),
        ("strides", ctypes.POINTER(ctypes.c_ssize_t)),
        ("suboffsets", ctypes.POINTER(ctypes.c_ssize_t)),
        ("internal", ctypes.c_void_p),
    ]


def request_buffer(obj, flags):
    """What `PyObject_GetBuffer(obj, view, flags)` gives, as a C consumer (Cython, NumPy) asks
    on every Python version: (shape, len, readonly, format); the view released at once."""
    get = ctypes.pythonapi.PyObject_GetBuffer
    get.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
    release = ctypes.pythonapi.PyBuffer_Release
    release.argtypes = [ctypes.POINTER(_PyBuffer)]
    view = _PyBuffer()
    if get(obj, ctypes.byref(view), flags) != 0:
        raise AssertionError("unreachable: ctypes raises the exception set")
    try:
        shape = tuple(view.shape[i] for i in range(view.ndim)) if view.shape else None
        return shape, view.len, bool(view.readonly), view.format
    finally:
        release(ctypes.byref(view))


def test_type_checkers_take_the_buffer_protocols_objects_as_buffers(tmp_path):
    """`memoryview(buf)`, `bytes(buf)` and `hashlib.sha256(buf)` work at run time for a
    UnifiedBuffer, a MemoryHost and a MemoryShared, but the stubs declared no `__buffer__`
    (PEP 688), so mypy rejected each ("incompatible type "UnifiedBuffer"; expected
    "Buffer""). They declare it now; a MemoryDevice, which has no buffer protocol, is still
    refused."""
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("needs mypy")
    source = tmp_path / "uses_buffers.py"
    source.write_text(
        textwrap.dedent(
            """\
            import hashlib
            import numpy as np
            import lazybuf
            buf = lazybuf.UnifiedBuffer((4,), np.float32)
            a = memoryview(buf)
            b = bytes(buf)
            c = hashlib.sha256(buf)
            d = memoryview(lazybuf.MemoryHost(16))
            e = memoryview(lazybuf.MemoryShared(16))
            f = bytearray(buf)
            g = memoryview(lazybuf.MemoryDevice(16))  # line 11: no buffer protocol
            """
        )
    )
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "--cache-dir", os.devnull, str(source)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    errors = [line for line in run.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 1 and "uses_buffers.py:11:" in errors[0] and "MemoryDevice" in errors[0], run.stdout


@pytest.mark.parametrize("selector", one_selector_per_backend())
@pytest.mark.parametrize("shape", [(0, 3, 4), (3, 0, 4), (2, 0)])
def test_an_empty_buffer_is_exported_fortran_contiguous(selector, shape):
    """A Fortran-contiguous request (`buf.__buffer__(inspect.BufferFlags.F_CONTIGUOUS)`, a
    Cython `double[::1, :]` memoryview) of a buffer with no element was refused ("the buffer
    is C-contiguous, not Fortran-contiguous"), where CPython calls every empty buffer both (as
    NumPy serves it). It is served; a non-empty 2-d one is still refused, with the state as it
    was."""
    buf = UnifiedBuffer(shape, np.float32, device=selector)
    for flags in (PYBUF_F_CONTIGUOUS, PYBUF_F_CONTIGUOUS | PYBUF_WRITABLE | PYBUF_FORMAT):
        assert request_buffer(buf, flags) == (shape, 0, not flags & PYBUF_WRITABLE, b"f" if flags & PYBUF_FORMAT else None)
        if sys.version_info >= (3, 12):
            view = buf.__buffer__(flags)
            assert (view.shape, view.f_contiguous, view.c_contiguous) == (shape, True, True)
            buf.__release_buffer__(view)
    assert request_buffer(np.zeros(shape, np.float32), PYBUF_F_CONTIGUOUS)[0] == shape  # as NumPy
    full = UnifiedBuffer((2, 3), np.float32, device=selector)
    full.fill(1)
    full.sync_to_device()
    full.mark_device_dirty()
    with pytest.raises(BufferError, match="not Fortran-contiguous"):
        request_buffer(full, PYBUF_F_CONTIGUOUS)
    assert full.state == BufferState.DEVICE_DIRTY
    np.testing.assert_array_equal(full.to_numpy(), np.ones((2, 3), np.float32))


def _raise_buffer_sync_error(direction):
    """A spawn worker's task (module level: the worker imports this module to find it)."""
    raise lazybuf.BufferSyncError(direction, RuntimeError("copy failed"))


def test_every_lazybuf_exception_survives_a_pickle():
    """`BufferSyncError`, `BackendNotAvailableError` and `BufferNotAllocatedError` (PyDotCompute's
    constructors: two, two and no arguments) failed to unpickle ("__init__() missing 1
    required positional argument"), so a spawn worker that raised one broke a
    `ProcessPoolExecutor` ("a process ... was terminated abruptly") and hung a
    `multiprocessing.Pool` (its result thread died). Each class, with its attributes and
    notes, comes back as it was."""
    from lazybuf import exceptions

    made = {
        exceptions.BufferNotAllocatedError: (),
        exceptions.BufferSyncError: ("to device", "copy failed"),
        exceptions.BackendNotAvailableError: ("cuda", "no driver"),
        exceptions.BackendUnavailableError: ("no metal", "metal", "not macOS"),
        exceptions.MetalUnavailableError: ("no metal", "metal", "not macOS"),
        exceptions.TransferGuardError: ("refused", 7, "d2h", 64, "to_numpy"),
    }
    classes = [getattr(exceptions, name) for name in exceptions.__all__]
    for cls in classes:
        error = cls(*made.get(cls, ("message",)))
        error.add_note("a note")
        back = pickle.loads(pickle.dumps(error))
        assert type(back) is cls and back.args == error.args and str(back) == str(error), cls
        assert vars(back) == vars(error), cls
    import concurrent.futures
    import multiprocessing

    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        with pytest.raises(lazybuf.BufferSyncError, match="to device: copy failed") as raised:
            pool.submit(_raise_buffer_sync_error, "to device").result(timeout=120)
    assert raised.value.direction == "to device"


def _device_seen_by_a_worker(device):
    """A spawn worker's task: the device it was given, used."""
    buf = UnifiedBuffer((4,), np.float32, device=device)
    buf.fill(2)
    buf.sync_to_device()
    buf.mark_device_dirty()
    return device.selector, device.name, buf.device_handle == device, buf.to_numpy().tolist()


def test_a_device_pickles_as_its_selector():
    """`pool.map(work, get_accelerator().devices)` (a `multiprocessing` or `concurrent.futures`
    worker per device) failed: "cannot pickle 'lazybuf.Device' object", and so did
    `copy.deepcopy` of anything holding a device. A device pickles as its selector, the one a
    pickled buffer records: a spawn worker gets that device of its own; a process without it
    raises the `ValueError` that `device=` raises; a copy is the device itself."""
    import concurrent.futures
    import copy
    import multiprocessing

    devices = lazybuf.get_accelerator().devices
    for device in devices:
        assert copy.copy(device) is device and copy.deepcopy({"d": device})["d"] is device
        for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
            back = pickle.loads(pickle.dumps(device, protocol))
            assert type(back) is lazybuf.Device and back == device and back.selector == device.selector
        elsewhere = pickle.dumps(device).replace(device.selector.encode(), device.selector[:-1].encode() + b"9")
        with pytest.raises(ValueError, match=f"no device matches .{device.selector[:-1]}9"):
            pickle.loads(elsewhere)
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        seen = list(pool.map(_device_seen_by_a_worker, devices, timeout=300))
    assert seen == [(d.selector, d.name, True, [2.0] * 4) for d in devices]
    if hasattr(lazybuf, "testing"):
        faulty = lazybuf.testing.FaultyDevice("host")
        with pytest.raises(TypeError, match="not one of get_accelerator"):
            pickle.dumps(faulty)


SPILLED_READ_AT_EXIT = """
import atexit, os, sys
def read_at_exit():  # registered before lazybuf's import: it runs after lazybuf's own at exit
    print("atexit", [float(b.to_numpy()[0]) for b in BUFS], flush=True)
atexit.register(read_at_exit)
import numpy as np, lazybuf
class ReadAtTeardown:  # a module global's finalizer, after every atexit handler
    def __del__(self):
        print("teardown", [float(b.to_numpy()[0]) for b in self.bufs], flush=True)
lazybuf.trim()
lazybuf.set_host_memory_limit(lazybuf.host_memory_held() + (1 << 20))
BUFS = []
for i in range(4):
    b = lazybuf.UnifiedBuffer((1 << 17,), np.float32, device=sys.argv[1])
    b.copy_from(np.full(1 << 17, i, np.float32))
    BUFS.append(b)
KEEP = ReadAtTeardown()
KEEP.bufs = BUFS
print("files", len(os.listdir(os.environ["LAZYBUF_SPILL_DIR"])), flush=True)
"""


@pytest.mark.parametrize("selector", one_selector_per_backend())
def test_buffers_spilled_to_disk_are_read_at_exit(tmp_path, selector):
    """lazybuf removed its spill files in an `atexit` handler, which runs before the handlers
    registered before `import lazybuf` and before the modules' finalizers: a handler that
    saved results at exit (`np.save(path, buf.to_numpy())`) lost every buffer spilled to disk
    ("could not read spill file ...: No such file or directory"). The files go once the
    interpreter has finished (`Py_AtExit`), after every handler and finalizer; none is left."""
    run = subprocess.run(
        [sys.executable, "-c", SPILLED_READ_AT_EXIT, selector],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "LAZYBUF_SPILL_DIR": str(tmp_path)},
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert int(lines[0].split()[1]) >= 1, run.stdout  # spilled while it ran
    assert lines[1:] == ["atexit [0.0, 1.0, 2.0, 3.0]", "teardown [0.0, 1.0, 2.0, 3.0]"], run.stdout + run.stderr
    assert os.listdir(tmp_path) == []


def _current_resource_of_a_worker():
    """A spawn worker's task: the type of its current device resource."""
    return type(lazybuf.mr.get_current_device_resource()).__name__


def test_lazybuf_mr_functions_and_the_trace_class_pickle_by_reference():
    """`lazybuf.mr.get_current_device_resource` and `set_current_device_resource` said their
    module was "mr", so they did not pickle ("import of module 'mr' failed"): a
    `ProcessPoolExecutor(initializer=lazybuf.mr.set_current_device_resource, initargs=(None,))`
    failed to start its workers, and `inspect.getmodule` found no module for them; so did
    `lazybuf.trace.Trace` as a class ("attribute lookup Trace on lazybuf failed"). Each names
    its real module now."""
    import concurrent.futures
    import inspect
    import multiprocessing

    from lazybuf import mr

    for function in (mr.get_current_device_resource, mr.set_current_device_resource):
        assert function.__module__ == "lazybuf.mr" and inspect.getmodule(function) is mr
        assert pickle.loads(pickle.dumps(function)) is function
    assert pickle.loads(pickle.dumps(lazybuf.trace.Trace)) is lazybuf.trace.Trace
    if hasattr(lazybuf, "testing"):
        for function in (lazybuf.testing.exposures, lazybuf.testing.reclaim):
            assert pickle.loads(pickle.dumps(function)) is function
    with concurrent.futures.ProcessPoolExecutor(
        1,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=mr.set_current_device_resource,
        initargs=(None,),
    ) as pool:
        assert pool.submit(_current_resource_of_a_worker).result(timeout=120).endswith("MemoryResource")
