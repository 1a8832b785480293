"""Fault injection for tests: present only in wheels built with the crate feature ``testing``
(``maturin build --features testing``; scripts/test-python.sh builds its wheel so). Release
wheels have no ``lazybuf.testing``."""

from __future__ import annotations  # forward references, for tools that execute stubs (pdoc)

from typing import final

from ._lazybuf import Device, UnifiedBuffer

# As in _lazybuf.pyi (spelled out here: the extension module has no such name at run time).
_DeviceLike = str | Device | None

__all__ = ["FaultyDevice", "exposures", "reclaim"]

def exposures(buf: UnifiedBuffer) -> tuple[int, int]:
    """The live exposures of ``buf``'s memory, ``(device, host)``: how many objects lazybuf
    cannot see (device arrays, host views, DLPack capsules, exports) use its device copies and
    its host copy now, which keeps them from eviction and from disk (docs/SPILLING.md), the
    views the buffer keeps for reuse included until spilling (or ``reclaim()``) drops them.
    ``ValueError`` once the buffer is released."""

@final
class FaultyDevice(Device):
    """A ``lazybuf.Device`` over another device whose n-th allocation or n-th copy fails
    (``RuntimeError``, "injected fault"), leaving state and data as before. Use it as any
    device: ``UnifiedBuffer(..., device=faulty)``, ``get_memory_pool(faulty)``."""

    def __new__(cls, inner: _DeviceLike = None) -> FaultyDevice: ...
    @property
    def inner(self) -> Device:
        """The wrapped device."""

    def fail_allocation_in(self, n: int) -> None:
        """The n-th allocation from now (host or device) fails; 0 disarms."""

    def fail_copy_in(self, n: int) -> None:
        """The n-th copy from now fails (after scribbling over its destination); 0 disarms."""

    def hide_native_handles(self, hidden: bool) -> None:
        """With True, the device's memory has no native handle (0), as wgpu's on Metal and
        DirectX 12, which expose none."""

    def disarm(self) -> None: ...
    def defer_copy_faults(self, deferred: bool) -> None:
        """True: a failing copy fails when waited for, not when enqueued."""

    @property
    def copy_fault_armed(self) -> bool: ...
    @property
    def allocations(self) -> int:
        """Allocations attempted so far."""

    @property
    def copies(self) -> int:
        """Copies attempted so far."""

def reclaim() -> int:
    """Drops every view a buffer keeps for reuse (its last ``.host``, ``.host_readonly`` and
    ``.device``) that nothing else references, as spilling does when it needs room; returns how
    many it dropped."""
