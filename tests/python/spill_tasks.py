"""Functions the Dask spilling test (test_spill.py) runs on workers: a module of its own so
that worker processes import only this and lazybuf, not pytest and the test module."""

from __future__ import annotations

import numpy as np

import lazybuf
from lazybuf import UnifiedBuffer


def make_on_device(seed: int, n: int) -> UnifiedBuffer:
    """A buffer on this worker's current device holding `seed + arange(n)`, synced to the
    device; one in five is then written on the device (`fill(-seed)`), so that only its device
    copy is current."""
    buf = UnifiedBuffer(n, np.float32)
    buf.copy_from(np.arange(n, dtype=np.float32) + seed)
    buf.sync_to_device()
    if seed % 5 == 0:
        buf.fill(float(-seed))
    return buf


def expected_total(seed: int, n: int) -> float:
    if seed % 5 == 0:
        return float(-seed) * n
    return float((np.arange(n, dtype=np.float64) + seed).sum())


def total(buf: UnifiedBuffer) -> float:
    """Reads the buffer on the device (reloading it if it was evicted), then on the host."""
    buf.sync_to_device()
    return float(buf.to_numpy().astype(np.float64).sum())


def spill_report() -> dict:
    device = lazybuf.get_accelerator().current_device
    report = dict(lazybuf.spill_stats(device))
    report["limit"] = lazybuf.get_memory_limit(device)
    report["held"] = lazybuf.memory_held(device)
    report["backend"] = device.backend
    return report
