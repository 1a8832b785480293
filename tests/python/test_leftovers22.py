"""The sixteenth session's fixes (docs/RELIABILITY.md "The twenty-second pass"), each a test
that failed before its fix. Each means the same on every device."""


import numpy as np
import pytest

import lazybuf
from conftest import collect, one_selector_per_backend

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
