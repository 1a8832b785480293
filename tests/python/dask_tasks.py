"""Functions the Dask tests (test_dask.py) and the Dask benchmark run on workers.

A module of its own so that worker processes import only this (and lazybuf), not pytest and
the test module. Buffers are filled with a position-dependent byte pattern, so a byte that
arrives in the wrong place, or from another buffer, is caught.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import lazybuf
from lazybuf import UnifiedBuffer

CHUNK = 1 << 20


def pattern(seed: int, start: int, count: int) -> np.ndarray:
    """`count` bytes of buffer `seed`'s pattern from byte `start` on."""
    position = np.arange(start, start + count, dtype=np.uint32)
    return ((position * np.uint32(2654435761 + 2 * seed)) >> np.uint32(13)).astype(np.uint8)


def expected_bytes(seed: int, nbytes: int) -> np.ndarray:
    return pattern(seed, 0, nbytes)


def make(seed: int, shape: tuple[int, ...], dtype: str) -> UnifiedBuffer:
    """A buffer on this process's current device holding pattern `seed` (HOST_ONLY)."""
    buf = UnifiedBuffer(shape, dtype)
    flat = buf.host.reshape(-1).view(np.uint8)
    for start in range(0, flat.size, CHUNK):
        count = min(CHUNK, flat.size - start)
        flat[start : start + count] = pattern(seed, start, count)
    return buf


def host_bytes(buf: UnifiedBuffer) -> np.ndarray:
    return buf.host_readonly.reshape(-1).view(np.uint8)


def report(buf: UnifiedBuffer) -> dict[str, Any]:
    """Where a buffer is: its state, device and transfer counters, from the process holding it."""
    return {
        "state": buf.state.name,
        "device": buf.device_handle.backend,
        "stats": buf.transfer_stats(),
        "worker": _worker_address(),
    }


def _worker_address() -> str | None:
    try:
        from distributed import get_worker

        return get_worker().address
    except ValueError:  # not on a worker
        return None


def arrive_and_touch(buf: UnifiedBuffer, seed: int) -> tuple[UnifiedBuffer, dict[str, Any]]:
    """On the receiving worker: reports how the buffer arrived and checks its bytes, then for
    odd seeds uses it on the device and declares a device write (DEVICE_DIRTY), so that the
    next send has to sync it to the host first."""
    arrival = report(buf)
    arrival["bytes_ok"] = bool(np.array_equal(host_bytes(buf), expected_bytes(seed, buf.nbytes)))
    arrival["state_after_check"] = buf.state.name
    if seed % 2:
        buf.sync_to_device()
        buf.mark_device_dirty()
    arrival["left_as"] = buf.state.name
    return buf, arrival


def report_first(pair: tuple[UnifiedBuffer, dict[str, Any]]) -> dict[str, Any]:
    return report(pair[0])


def first(pair: tuple[UnifiedBuffer, dict[str, Any]]) -> UnifiedBuffer:
    return pair[0]


def arrived(buf: UnifiedBuffer) -> tuple[UnifiedBuffer, dict[str, Any]]:
    """On the worker a buffer was moved to: the buffer, and how it arrived."""
    return buf, report(buf)


def frames_of(buf: UnifiedBuffer) -> dict[str, Any]:
    """Serializes `buf` as distributed sends it (serialize_and_split) and says where the data
    frames point: each frame's address and size, and the host copy's address."""
    from distributed.protocol.serialize import serialize_and_split

    before = buf.transfer_stats()
    header, frames = serialize_and_split(buf)
    host = buf.host_readonly.__array_interface__["data"][0]
    spans = [
        (np.frombuffer(f, np.uint8).__array_interface__["data"][0], memoryview(f).nbytes)
        for f in frames
    ]
    return {
        "serializer": header["serializer"],
        "memoryviews": all(isinstance(f, memoryview) for f in frames),
        "spans": spans,
        "host": host,
        "stats_before": before,
        "stats_after": buf.transfer_stats(),
    }


def current_device() -> str:
    return lazybuf.get_accelerator().current_device.selector
