"""The pure-Python part of PyDotCompute 0.2.0's public API (docs/MIGRATING.md).

``PoolStatistics`` (what ``MemoryPool.get_stats()`` returns), ``DeviceType`` (what
``Device.device_type`` returns), ``configure_memory_pool``, ``cuda_available`` and
``metal_available``. The rest of that API is methods of the extension's classes
(``UnifiedBuffer.allocate``, ``MemoryPool.enable``, ``Accelerator.get_device``...), which use
the classes and helpers here.
"""

from __future__ import annotations

import operator
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._lazybuf import MemoryPool

__all__ = [
    "DeviceType",
    "PoolStatistics",
    "configure_memory_pool",
    "cuda_available",
    "metal_available",
]

_MIB = 1024 * 1024


@dataclass(frozen=True)
class PoolStatistics:
    """A memory pool's figures (``MemoryPool.get_stats()``, ``get_pinned_stats()``), with
    PyDotCompute's fields. Bytes are those of whole blocks.

    ``used_bytes``: held by live buffers. ``total_bytes``: held by the pool, in use and cached
    for reuse. ``n_free_blocks``: blocks cached for reuse. ``hits``/``misses``: requests served
    from the cache / that allocated a new block (lazybuf's addition)."""

    used_bytes: int
    total_bytes: int
    n_free_blocks: int
    hits: int = 0
    misses: int = 0

    @property
    def free_bytes(self) -> int:
        """Bytes the pool holds that no buffer uses (cached for reuse)."""
        return self.total_bytes - self.used_bytes

    @property
    def utilization(self) -> float:
        """``used_bytes / total_bytes``; 0.0 when the pool holds nothing."""
        if self.total_bytes == 0:
            return 0.0
        return self.used_bytes / self.total_bytes

    @property
    def used_mb(self) -> float:
        """``used_bytes`` in MiB."""
        return self.used_bytes / _MIB

    @property
    def total_mb(self) -> float:
        """``total_bytes`` in MiB."""
        return self.total_bytes / _MIB


class DeviceType(Enum):
    """The kind of a device (``Device.device_type``). Each value is the selector name of that
    kind, which ``select_device()`` and ``LAZYBUF_DEVICE`` take: the device's backend
    (``Device.backend``; ``CPU`` is the host), except that a wgpu device on Metal (macOS) is
    ``METAL``, the device ``.metal`` uses (``metal_available()`` is True when there is one).
    Other wgpu devices (Vulkan, DirectX 12) are ``WGPU``.

    A backend this build has that is not listed here (the test suites' loopback devices) gets
    a member of its own on first use, named after it: ``device_type`` never raises."""

    CPU = "host"
    CUDA = "cuda"
    METAL = "metal"
    OPENCL = "opencl"
    WGPU = "wgpu"

    def __str__(self) -> str:
        return self.name

    @classmethod
    def _missing_(cls, value: object) -> DeviceType | None:
        # A backend compiled into this build but not listed above: a member made once, kept
        # with the others (so ``DeviceType("name") is DeviceType("name")``); anything else is
        # Enum's ValueError.
        from ._lazybuf import get_accelerator

        if not isinstance(value, str) or value not in {name for name, _ in get_accelerator().backend_status}:
            return None
        member = object.__new__(cls)
        member._name_ = value.upper()
        member._value_ = value
        found: DeviceType = cls._value2member_map_.setdefault(value, member)  # type: ignore[assignment]
        return found


def _size_mb(name: str, value: object, *, allow_none: bool) -> int | None:
    """``value`` as a whole number of MiB, or a TypeError/ValueError naming ``name``."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool):
        raise TypeError(f"{name}: expected a whole number of MiB, got the bool {value}")
    try:
        mb = operator.index(value)  # type: ignore[arg-type]  # anything with __index__
    except TypeError:
        raise TypeError(
            f"{name}: expected a whole number of MiB{' or None' if allow_none else ''}, "
            f"got {type(value).__name__} {value!r}"
        ) from None
    if mb < 0:
        raise ValueError(f"{name}: expected a size of 0 MiB or more, got {mb}")
    return mb


def configure_memory_pool(
    initial_size_mb: int = 0, max_size_mb: int | None = None, enable: bool = True
) -> MemoryPool:
    """Configures the current device's process-wide pool (``get_memory_pool()``) and returns
    it: ``max_size_mb`` sets its limit (``set_limit``; None leaves the limit as it is), and
    ``enable`` says whether buffers made without a pool take their memory from it
    (``enable()``) or not (``disable()``).

    ``initial_size_mb`` is accepted for PyDotCompute code and has no effect, as in
    PyDotCompute: lazybuf's pools allocate on demand. It must still be a whole number of MiB."""
    from ._lazybuf import get_memory_pool

    _size_mb("configure_memory_pool: initial_size_mb", initial_size_mb, allow_none=False)
    _size_mb("configure_memory_pool: max_size_mb", max_size_mb, allow_none=True)
    if not isinstance(enable, bool):
        raise TypeError(f"configure_memory_pool: expected enable=True or False, got {enable!r}")
    pool = get_memory_pool()
    if max_size_mb is not None:
        pool.set_limit(max_size_mb)
    if enable:
        pool.enable()
    else:
        pool.disable()
    return pool


def cuda_available() -> bool:
    """Whether lazybuf found a CUDA device (``get_accelerator().cuda_available``)."""
    from ._lazybuf import get_accelerator

    return bool(get_accelerator().cuda_available)


def metal_available() -> bool:
    """Whether lazybuf found a Metal device, a wgpu device on Metal (macOS; the device
    ``.metal`` uses): ``get_accelerator().metal_available``."""
    from ._lazybuf import get_accelerator

    return bool(get_accelerator().metal_available)


async def _ensure(start: Callable[[], Awaitable[None]]) -> None:
    """The coroutine behind ``UnifiedBuffer.ensure_on_device()``/``ensure_on_host()``: starts
    the asynchronous sync when it first runs and awaits it (on an executor thread: the event
    loop keeps running)."""
    await start()
