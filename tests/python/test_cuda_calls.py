"""Driver calls per batch of the PyDotCompute examples' loops, counted by the CUDA driver test
double per entry point (`lazybuf_cuda_double_call_counts`).

Steady state (after warm-up batches), per batch: no allocation, no pinning or registration,
no event created or destroyed (a context keeps the events of finished tickets for the next
ones), exactly one upload and one download (none for double buffering, which reads nothing
back), and the waits counted below. The minimum is one wait, the read-back's, and the seeds'
loop (a new or pooled buffer per batch) makes just that: `.device` enqueues its upload in the
order of the buffer's stream and does not wait for it, `mark_device_dirty()` is ordered after
it, and `to_numpy()` downloads on the same stream and waits once, for its own download.
Read-modify-write on one buffer waits twice: its read-back updates the host copy, which the
upload reads and which must still hold the data if the upload fails, so it waits for the
upload first. Double buffering waits once, in `sync_to_device()` (a blocking call; the seeds
then wait for their kernel). docs/BENCHMARKS.md ("Driver calls per batch") lists every entry
point against the minimum. The counts are exact, so a change that adds driver work fails here.

Runs only with the test double loaded (LD_LIBRARY_PATH=target/cuda-double); its devices are
host memory, so no kernel runs: `mark_device_dirty()` stands for one.
"""

import ctypes
import gc

import numpy as np
import pytest

import lazybuf
from conftest import collect, cuda_double
from lazybuf import UnifiedBuffer

N = 1024  # 4 KiB of float32
WARM_UP = 3
MEASURED = 4

ALLOCATIONS = ("cuMemAlloc_v2", "cuMemAllocManaged", "cuMemHostAlloc", "cuMemFree_v2", "cuMemFreeHost")
PINNING = ("cuMemHostRegister_v2", "cuMemHostUnregister", "cuMemHostAlloc")
WAITS = ("cuStreamSynchronize", "cuEventSynchronize", "cuCtxSynchronize")
UPLOAD, DOWNLOAD = "cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2"
EVENTS_MADE = ("cuEventCreate", "cuEventDestroy", "cuEventDestroy_v2")


@pytest.fixture(scope="module")
def double():
    device, lib = cuda_double()
    lib.lazybuf_cuda_double_call_counts.restype = ctypes.c_longlong
    lib.lazybuf_cuda_double_call_counts.argtypes = (ctypes.c_char_p, ctypes.c_longlong)
    # The counts are the loops' own: the coherence checker (on in one of the test script's
    # runs) adds a download to compare at each checked host access.
    checking = lazybuf.checking()
    lazybuf.set_checking(False)
    yield device, lib
    lazybuf.set_checking(checking)


def counts(lib) -> dict[str, int]:
    size = lib.lazybuf_cuda_double_call_counts(None, 0) + 1
    text = ctypes.create_string_buffer(size)
    lib.lazybuf_cuda_double_call_counts(text, size)
    return {name: int(n) for name, n in (line.split("=") for line in text.value.decode().split())}


def per_batch(lib, batch) -> list[dict[str, int]]:
    """The calls of each measured batch, after the warm-up batches. Without the collector:
    an earlier test's CUDA buffer left in a cycle, freed by a collection in the middle of a
    batch, adds its own calls (an event recorded, sometimes one created) to that batch's."""
    collect()
    gc.disable()
    try:
        for _ in range(WARM_UP):
            batch()
        measured = []
        for _ in range(MEASURED):
            before = counts(lib)
            batch()
            after = counts(lib)
            measured.append({k: n - before.get(k, 0) for k, n in after.items() if n != before.get(k, 0)})
    finally:
        gc.enable()
    return measured


def total(calls: dict[str, int], names) -> int:
    return sum(calls.get(name, 0) for name in names)


def check_minimum(measured, uploads, downloads, waits):
    for i, calls in enumerate(measured):
        assert total(calls, ALLOCATIONS) == 0, (i, calls)
        assert total(calls, PINNING) == 0, (i, calls)
        assert total(calls, EVENTS_MADE) == 0, (i, calls)
        # Device 0's context stays current on a thread that had none (no bind and restore).
        assert calls.get("cuCtxSetCurrent", 0) == 0, (i, calls)
        assert calls.get(UPLOAD, 0) == uploads, (i, calls)
        assert calls.get(DOWNLOAD, 0) == downloads, (i, calls)
        assert total(calls, WAITS) == waits, (i, calls)
    # Steady: every measured batch makes the same calls.
    assert all(calls == measured[0] for calls in measured), measured


DATA = np.arange(N, dtype=np.float32)


def test_new_buffer_per_batch(double):
    device, lib = double

    def batch():
        buf = UnifiedBuffer(DATA.shape, DATA.dtype, device=device)
        buf.copy_from(DATA)
        buf.device
        buf.mark_device_dirty()
        np.testing.assert_array_equal(buf.to_numpy(), DATA)
        del buf

    check_minimum(per_batch(lib, batch), uploads=1, downloads=1, waits=1)


def test_pooled_buffer_per_batch(double):
    device, lib = double
    pool = lazybuf.get_memory_pool(device)

    def batch():
        buf = pool.acquire(DATA.shape, DATA.dtype)
        try:
            buf.copy_from(DATA)
            buf.device
            buf.mark_device_dirty()
            np.testing.assert_array_equal(buf.to_numpy(), DATA)
        finally:
            pool.release(buf)

    check_minimum(per_batch(lib, batch), uploads=1, downloads=1, waits=1)


def test_read_modify_write_on_one_buffer(double):
    device, lib = double
    buf = UnifiedBuffer(DATA.shape, DATA.dtype, device=device)

    def batch():
        buf.host[:] = DATA
        buf.device
        buf.mark_device_dirty()
        np.testing.assert_array_equal(buf.to_numpy(), DATA)

    check_minimum(per_batch(lib, batch), uploads=1, downloads=1, waits=1)


def test_double_buffering(double):
    device, lib = double
    bufs = [UnifiedBuffer(DATA.shape, DATA.dtype, device=device) for _ in range(2)]
    bufs[0].host[:] = DATA

    def batch():
        a, b = bufs
        a.sync_to_device()
        a.device  # the kernel's argument
        b.host[:] = DATA  # meanwhile, the next batch
        bufs.reverse()

    check_minimum(per_batch(lib, batch), uploads=1, downloads=0, waits=1)
