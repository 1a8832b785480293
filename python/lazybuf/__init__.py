"""lazybuf: one array, one identity, many memories.

A ``UnifiedBuffer`` keeps an array's copies in host memory and device memory coherent and
copies only when a stale copy is about to be used. The implementation is the Rust core
(the ``lazybuf._lazybuf`` extension module); this package re-exports it with the
``BufferState`` enum.
"""

from ._lazybuf import (
    Accelerator,
    BackendUnavailableError,
    CoherenceError,
    Device,
    DeviceMemoryView,
    MemoryOwner,
    MemoryPool,
    PoolStats,
    UnifiedBuffer,
    caching,
    checking,
    get_accelerator,
    get_memory_pool,
    set_caching,
    set_checking,
    trim,
)
from ._state import BufferState

__all__ = [
    "Accelerator",
    "BackendUnavailableError",
    "BufferState",
    "CoherenceError",
    "Device",
    "DeviceMemoryView",
    "MemoryOwner",
    "MemoryPool",
    "PoolStats",
    "UnifiedBuffer",
    "caching",
    "checking",
    "get_accelerator",
    "get_memory_pool",
    "set_caching",
    "set_checking",
    "trim",
]
