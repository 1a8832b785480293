"""Memory resources, as RMM's ``rmm.mr`` has them (registered by the extension as
``lazybuf.mr``). Sources: ``DirectMemoryResource``, ``PoolMemoryResource``; adaptors, one
concern each over an upstream they keep alive: ``LimitingResourceAdaptor``,
``StatisticsResourceAdaptor``, ``TrackingResourceAdaptor``, ``FailureCallbackResourceAdaptor``.
``set_current_device_resource`` makes a resource the one buffers, memory objects and device
buffers on a device take their memory from when given none."""

from __future__ import annotations  # forward references, for tools that execute stubs (pdoc)

from collections.abc import Callable
from typing import Any, ClassVar, SupportsIndex, final

from typing_extensions import disjoint_base

from ._lazybuf import Device

# As in _lazybuf.pyi (spelled out here: the extension module has no such name at run time).
_DeviceLike = str | Device | None

__all__ = [
    "DirectMemoryResource",
    "FailureCallbackResourceAdaptor",
    "LimitingResourceAdaptor",
    "MemoryResource",
    "PoolMemoryResource",
    "Statistics",
    "StatisticsResourceAdaptor",
    "TrackingResourceAdaptor",
    "get_current_device_resource",
    "set_current_device_resource",
]

@disjoint_base
class MemoryResource:
    """A memory resource (device-independent: one resource serves every device)."""

    def get_upstream(self) -> MemoryResource | None:
        """The resource this one forwards to (``None`` for sources)."""

    def allocate(self, nbytes: SupportsIndex, *, device: _DeviceLike = None) -> int:
        """``nbytes`` of device memory outside any buffer; its handle as an int. It lives until
        ``deallocate`` (also when this object is collected). ``TypeError`` on a device whose
        memory has no handle (wgpu on Metal or DirectX 12), allocating nothing."""

    def deallocate(self, ptr: int, nbytes: int) -> None:
        """Gives back what ``allocate`` on this resource returned (``ValueError`` for anything
        else)."""

@final
class DirectMemoryResource(MemoryResource):
    """The runtimes themselves."""

    def __new__(cls) -> DirectMemoryResource: ...

@final
class PoolMemoryResource(MemoryResource):
    """lazybuf's caching pool over ``upstream_mr`` (default: the runtimes);
    ``maximum_pool_size`` caps what it holds (in use and cached)."""

    def __new__(
        cls,
        upstream_mr: MemoryResource | None = None,
        *,
        maximum_pool_size: int | None = None,
        max_cached_bytes: int | None = None,
    ) -> PoolMemoryResource: ...
    def pool_size(self) -> int:
        """Bytes held: in use and cached."""

    def cached_bytes(self) -> int: ...
    def maximum_pool_size(self) -> int | None: ...
    def trim(self) -> int:
        """Frees every cached block; returns the bytes freed."""

@final
class LimitingResourceAdaptor(MemoryResource):
    """Refuses allocations beyond ``allocation_limit`` bytes outstanding (``MemoryError``)."""

    def __new__(cls, upstream_mr: MemoryResource, allocation_limit: int) -> LimitingResourceAdaptor: ...
    def get_allocated_bytes(self) -> int: ...
    def get_allocation_limit(self) -> int: ...

@final
class Statistics:
    """One level of counters. Compared by value; pickles as its values."""

    __hash__: ClassVar[None] = None  # type: ignore[assignment]  # compared by value, so unhashable

    def __new__(
        cls,
        current_bytes: SupportsIndex | None = None,
        current_count: SupportsIndex | None = None,
        peak_bytes: SupportsIndex | None = None,
        peak_count: SupportsIndex | None = None,
        total_bytes: SupportsIndex | None = None,
        total_count: SupportsIndex | None = None,
    ) -> Statistics:
        """Counters with these values, each an int from -2**63 to 2**63 - 1 (0 when not given)."""

    def __reduce__(self) -> tuple[type[Statistics], tuple[int, int, int, int, int, int]]: ...

    @property
    def current_bytes(self) -> int: ...
    @property
    def current_count(self) -> int: ...
    @property
    def peak_bytes(self) -> int: ...
    @property
    def peak_count(self) -> int: ...
    @property
    def total_bytes(self) -> int: ...
    @property
    def total_count(self) -> int: ...

@final
class StatisticsResourceAdaptor(MemoryResource):
    """Counts bytes asked for and allocations (current, peak, total) on a stack of levels."""

    def __new__(cls, upstream_mr: MemoryResource) -> StatisticsResourceAdaptor: ...
    @property
    def allocation_counts(self) -> Statistics: ...
    def push_counters(self) -> Statistics:
        """Starts a new level; returns the level below as it was."""

    def pop_counters(self) -> Statistics:
        """Ends the level and folds it into the one below (``IndexError`` for the last)."""

@final
class TrackingResourceAdaptor(MemoryResource):
    """Records every outstanding allocation, for leak hunting."""

    def __new__(cls, upstream_mr: MemoryResource, capture_stacks: bool = False) -> TrackingResourceAdaptor: ...
    def get_allocated_bytes(self) -> int: ...
    def get_outstanding_allocations_str(self) -> str: ...
    def log_outstanding_allocations(self) -> None: ...

@final
class FailureCallbackResourceAdaptor(MemoryResource):
    """Calls ``callback(nbytes)`` when an allocation runs out of memory: true retries, false
    raises the ``MemoryError``; the callback's exceptions propagate."""

    def __new__(
        cls, upstream_mr: MemoryResource, callback: Callable[[int], Any]
    ) -> FailureCallbackResourceAdaptor: ...

def get_current_device_resource(device: _DeviceLike = None) -> MemoryResource:
    """The resource set for the device, else its default (the same object on every call)."""
def set_current_device_resource(mr: MemoryResource | None, device: _DeviceLike = None) -> None: ...
