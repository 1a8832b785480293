"""Shared fixtures for lazybuf's Python tests.

``LAZYBUF_REQUIRE=opencl`` (set by scripts/test.sh) turns a missing OpenCL device or a
missing PyOpenCL into a failure instead of a skip, so CI cannot silently test less.

``LAZYBUF_PY_SHARD=K/N`` runs the tests whose id's CRC-32 is K modulo N: N processes given
K = 0..N-1 run the whole suite between them, each test once (scripts/test-python.sh
runs one pass as two such shards, one per core).
"""

import contextlib
import gc
import os
import subprocess
import sys
import textwrap
import zlib

import pytest

import lazybuf


def _shard() -> tuple[int, int] | None:
    value = os.environ.get("LAZYBUF_PY_SHARD", "")
    if not value:
        return None
    try:
        k, n = (int(part) for part in value.split("/"))
    except ValueError:
        raise pytest.UsageError(f"LAZYBUF_PY_SHARD must be K/N with 0 <= K < N, got {value!r}") from None
    if not 0 <= k < n:
        raise pytest.UsageError(f"LAZYBUF_PY_SHARD must be K/N with 0 <= K < N, got {value!r}")
    return k, n


def pytest_collection_modifyitems(config, items):
    shard = _shard()
    if shard is None:
        return
    k, n = shard
    # By a checksum of each test's id, not its place in the collection: each test goes to one
    # shard whatever the others collected, and neighbours (a file's tests, a test's devices)
    # are spread, so the shards take about as long as each other.
    mine = [zlib.crc32(item.nodeid.encode()) % n == k for item in items]
    config.hook.pytest_deselected(items=[item for item, keep in zip(items, mine) if not keep])
    items[:] = [item for item, keep in zip(items, mine) if keep]


def _required(name: str) -> bool:
    return name in os.environ.get("LAZYBUF_REQUIRE", "").lower().split(",")


def _need(name: str, why: str) -> None:
    if _required(name):
        pytest.fail(f"LAZYBUF_REQUIRE names {name}, but {why}")
    pytest.skip(why)


@pytest.fixture(autouse=True)
def default_device():
    """Buffers made without `device=` go to the host, so tests mean the same thing on a
    machine with a GPU (test_seed_examples.py overrides this to use the machine's default)."""
    accelerator = lazybuf.get_accelerator()
    accelerator.select_device("host")
    yield
    accelerator.select_device(None)


@pytest.fixture
def opencl_device() -> lazybuf.Device:
    """The first OpenCL device (PoCL's CPU device in CI)."""
    devices = [d for d in lazybuf.get_accelerator().devices if d.backend == "opencl"]
    if not devices:
        _need("opencl", f"no OpenCL device: {lazybuf.get_accelerator().backend_status}")
    return devices[0]


@pytest.fixture
def pyopencl(opencl_device):
    """PyOpenCL, which must find the same PoCL platform lazybuf uses."""
    try:
        import pyopencl as cl
        import pyopencl.array  # noqa: F401
    except ImportError as err:
        _need("opencl", f"PyOpenCL is not installed ({err})")
    return cl


@pytest.fixture
def host_device() -> lazybuf.Device:
    return next(d for d in lazybuf.get_accelerator().devices if d.backend == "host")


def one_selector_per_backend() -> list[str]:
    """"host" and one backend selector per backend with memory of its own ("opencl", "wgpu",
    "cuda", "loopback") that this build has, for tests run once per kind of memory."""
    found = ["host"]
    for d in lazybuf.get_accelerator().devices:
        if d.backend in ("opencl", "wgpu", "cuda", "loopback") and d.backend not in found:
            found.append(d.backend)
    return found


def run_python(code: str) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter (for crashes that must not take pytest down, and for
    per-process state such as which optional packages import), with the host as its default
    device like the tests here."""
    return subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "LAZYBUF_DEVICE": "host"},
    )


def collect() -> None:
    """Runs the garbage collector until nothing more is freed."""
    while gc.collect():
        pass


def assigned_as_numpy_assigns(buf, data, key, value) -> bool:
    """`buf[key] = value` against NumPy's assignment on a copy of `data` (the buffer's
    contents): the same result, or the same kind of error and nothing changed (state,
    counters, bytes). Returns whether NumPy assigned (else it raised)."""
    import warnings

    import numpy as np

    expected = data.copy()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", RuntimeWarning)
            expected[key] = value
        numpy_error = None
    except Exception as err:
        numpy_error = err
    state, stats = buf.state, buf.transfer_stats()
    if numpy_error is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", RuntimeWarning)
            buf[key] = value
        np.testing.assert_array_equal(buf.to_numpy(), expected)
        return True
    with pytest.raises(type(numpy_error)):
        buf[key] = value
    assert (buf.state, buf.transfer_stats()) == (state, stats), (key, value)
    np.testing.assert_array_equal(buf.to_numpy(), data)
    return False


def cuda_double():
    """The CUDA driver test double's first device and its library (ctypes; its fault hooks and
    call counters), or a skip where the double is not loaded (LD_LIBRARY_PATH=target/cuda-double)."""
    import ctypes

    found = [d for d in lazybuf.get_accelerator().devices if d.backend == "cuda"]
    if not found or "test double" not in found[0].name:
        pytest.skip("needs the CUDA driver test double (LD_LIBRARY_PATH=target/cuda-double)")
    return found[0], ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD | os.RTLD_NOW)


# Just enough of CuPy for lazybuf's `.device` and its ordering after CuPy's current stream, for
# a child process (lazybuf probes for CuPy once per process): `orderings` lists the device ids
# CuPy was asked for its current stream, which is the legacy default stream (handle 0).
FAKE_CUPY = """
import sys, types
cupy, cuda = types.ModuleType("cupy"), types.ModuleType("cupy.cuda")
class UnownedMemory:
    def __init__(self, ptr, size, owner, device_id):
        self.owner = owner
class MemoryPointer:
    def __init__(self, mem, offset):
        self.mem = mem
class ndarray:
    def __init__(self, shape, dtype, memptr=None):
        self.data = memptr
class Stream:
    ptr = 0
orderings = []
def get_current_stream(device_id=None):
    orderings.append(device_id)
    return Stream()
cuda.UnownedMemory, cuda.MemoryPointer, cuda.get_current_stream = UnownedMemory, MemoryPointer, get_current_stream
cupy.cuda, cupy.ndarray = cuda, ndarray
sys.modules["cupy"], sys.modules["cupy.cuda"] = cupy, cuda
"""


def events_of(trace, buffer_id):
    """The events of a recorded trace (`lazybuf.trace.Trace`) that name `buffer_id`."""
    return [e for e in trace.events() if e.get("buffer") == buffer_id]


@contextlib.contextmanager
def first_of_five_on_disk(device, n):
    """Five buffers of `n` float32 on `device`, filled 0 to 4 under a host memory limit of
    three, so that the least recently used, the first, went to disk (`copy_from` hands no
    address out); yields them, and lifts the limit afterwards. Process-wide figures start from
    no garbage (docs/TESTING.md) and the device's spill counters from zero."""
    import numpy as np

    collect()
    lazybuf.trim()
    lazybuf.reset_spill_stats(device)
    lazybuf.set_host_memory_limit(lazybuf.host_memory_held() + 3 * n * 4)
    try:
        bufs = []
        for i in range(5):
            buf = lazybuf.UnifiedBuffer(n, np.float32, device=device)
            buf.copy_from(np.full(n, i, np.float32))
            bufs.append(buf)
        assert lazybuf.spill_stats(device)["bytes_to_disk"] >= n * 4
        yield bufs
    finally:
        lazybuf.set_host_memory_limit(None)
