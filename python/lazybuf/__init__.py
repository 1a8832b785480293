"""lazybuf: one array, one identity, many memories.

A ``UnifiedBuffer`` keeps an array's copies in host memory and device memory coherent and
copies only when a stale copy is about to be used. The implementation is the Rust core
(the ``lazybuf._lazybuf`` extension module); this package re-exports it with the
``BufferState`` enum.
"""

import sys as _sys

from ._lazybuf import (
    Accelerator,
    BackendUnavailableError,
    CoherenceError,
    Device,
    DeviceMemoryView,
    HostBlock,
    MemoryOwner,
    MemoryPool,
    PoolStats,
    Transfer,
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

# `lazybuf.testing` exists only in wheels built with the crate feature `testing` (the test
# wheel); the extension registers it in sys.modules, and this makes it an attribute too.
if "lazybuf.testing" in _sys.modules:
    testing = _sys.modules["lazybuf.testing"]

# Dask integration (python/lazybuf/_dask.py): sizes and serializers, registered with dask and
# distributed when they are imported (before or after lazybuf); never imports them itself.
from . import _dask

_dask.install()

__all__ = [
    "Accelerator",
    "BackendUnavailableError",
    "BufferState",
    "CoherenceError",
    "Device",
    "DeviceMemoryView",
    "HostBlock",
    "MemoryOwner",
    "MemoryPool",
    "PoolStats",
    "Transfer",
    "UnifiedBuffer",
    "caching",
    "checking",
    "get_accelerator",
    "get_memory_pool",
    "set_caching",
    "set_checking",
    "trim",
]
