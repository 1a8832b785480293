"""lazybuf: one array, one identity, many memories.

A ``UnifiedBuffer`` keeps an array's copies in host memory and device memory coherent and
copies only when a stale copy is about to be used. The implementation is the Rust core
(the ``lazybuf._lazybuf`` extension module); this package re-exports it with the
``BufferState`` enum.
"""

from ._lazybuf import (
    Accelerator,
    BackendUnavailableError,
    Device,
    DeviceMemoryView,
    MemoryOwner,
    MemoryPool,
    PoolStats,
    Transfer,
    UnifiedBuffer,
    caching,
    get_accelerator,
    get_memory_pool,
    set_caching,
    trim,
)
from ._state import BufferState

__all__ = [
    "Accelerator",
    "BackendUnavailableError",
    "BufferState",
    "Device",
    "DeviceMemoryView",
    "MemoryOwner",
    "MemoryPool",
    "PoolStats",
    "Transfer",
    "UnifiedBuffer",
    "caching",
    "get_accelerator",
    "get_memory_pool",
    "set_caching",
    "trim",
]
