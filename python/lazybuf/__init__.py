"""lazybuf: one array, one identity, many memories.

A ``UnifiedBuffer`` keeps an array's copies in host memory and device memory coherent and
copies only when a stale copy is about to be used. The implementation is the Rust core
(the ``lazybuf._lazybuf`` extension module); this package re-exports it with the
``BufferState`` enum.

Code written for PyDotCompute 0.2.0 runs with its imports changed to ``lazybuf``: its names
(``PoolStatistics``, ``DeviceType``, ``configure_memory_pool``, the exception classes...) are
here too; docs/MIGRATING.md lists every one and each deliberate difference.
"""

import sys as _sys

# Before the extension: it raises the exception classes defined there.
from .exceptions import (
    BackendError,
    BackendNotAvailableError,
    BackendUnavailableError,
    BufferError,  # PyDotCompute's, not the builtin: left out of __all__
    BufferNotAllocatedError,
    BufferSyncError,
    CoherenceError,
    CUDAError,
    CUDARuntimeError,
    ForkedChildError,
    MetalError,
    MetalUnavailableError,
    PyDotComputeError,
    ReentrancyError,
    TransferGuardError,
)
from ._lazybuf import (
    Accelerator,
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
    get_host_memory_limit,
    get_memory_limit,
    get_memory_pool,
    host_memory_held,
    memory_held,
    reset_spill_stats,
    set_caching,
    set_checking,
    set_host_memory_limit,
    set_memory_limit,
    spill_stats,
    trim,
)
from ._pydotcompute import (
    DeviceType,
    PoolStatistics,
    configure_memory_pool,
    cuda_available,
    metal_available,
)
from ._state import BufferState

# PyDotCompute's name for what a device reports (lazybuf's Device has its fields).
DeviceProperties = Device

# Memory objects without coherence tracking.
from ._lazybuf import DeviceBuffer, Memory, MemoryDevice, MemoryHost, MemoryShared, to_device

mr = _sys.modules["lazybuf.mr"]  # memory resources (RMM's rmm.mr), registered by the extension

# `lazybuf.testing` exists only in wheels built with the crate feature `testing` (the test
# wheel); the extension registers it in sys.modules, and this makes it an attribute too.
if "lazybuf.testing" in _sys.modules:
    testing = _sys.modules["lazybuf.testing"]

# The version (the installed distribution's), `show_config()`, and the command-line tool's
# entry point (`lazybuf.cli.main`, the `lazybuf` console script) and `watch()` in process.
from . import cli
from ._config import __version__, show_config
from .cli import watch

# Dask integration (python/lazybuf/_dask.py): sizes and serializers, registered with dask and
# distributed when they are imported (before or after lazybuf); never imports them itself.
from . import _dask

_dask.install()

# Seeing every copy: the transfer guard and the event recorder (`lazybuf.trace`).
from . import trace
from ._transfer_guard import (
    get_transfer_guard,
    set_transfer_guard,
    transfer_guard,
    transfer_guard_device_to_device,
    transfer_guard_device_to_host,
    transfer_guard_host_to_device,
)

__all__ = [
    "Accelerator",
    "BackendError",
    "BackendNotAvailableError",
    "BackendUnavailableError",
    "BufferNotAllocatedError",
    "BufferState",
    "BufferSyncError",
    "CUDAError",
    "CUDARuntimeError",
    "CoherenceError",
    "Device",
    "DeviceMemoryView",
    "DeviceProperties",
    "DeviceType",
    "ForkedChildError",
    "HostBlock",
    "MemoryOwner",
    "MemoryPool",
    "MetalError",
    "MetalUnavailableError",
    "PoolStatistics",
    "PoolStats",
    "PyDotComputeError",
    "ReentrancyError",
    "Transfer",
    "UnifiedBuffer",
    "caching",
    "checking",
    "configure_memory_pool",
    "cuda_available",
    "get_accelerator",
    "get_memory_pool",
    "metal_available",
    "set_caching",
    "set_checking",
    "trim",
]
__all__ += ["DeviceBuffer", "Memory", "MemoryDevice", "MemoryHost", "MemoryShared", "mr", "to_device"]
__all__ += ["cli", "show_config", "watch"]
__all__ += [
    "TransferGuardError",
    "get_transfer_guard",
    "set_transfer_guard",
    "trace",
    "transfer_guard",
    "transfer_guard_device_to_device",
    "transfer_guard_device_to_host",
    "transfer_guard_host_to_device",
]
__all__ += ["get_memory_limit", "memory_held", "reset_spill_stats", "set_memory_limit", "spill_stats"]
__all__ += ["get_host_memory_limit", "host_memory_held", "set_host_memory_limit"]

# Spill files of buffers still alive at exit (the interpreter need not finalize them) go too:
# once the interpreter has finished (Py_AtExit: after every atexit handler, also those
# registered before this import, and the modules' finalizers, which may still read spilled
# buffers; an atexit handler of its own removed them first until the twenty-first hostile
# pass), and at the end of every multiprocessing child that ends with os._exit() after
# multiprocessing's own finalizers, never running atexit (workers started by fork and
# forkserver; a spawn child ends with sys.exit() and finishes as any interpreter does:
# docs/SPILLING.md "The host tier and the disk").
import atexit as _atexit
import os as _os
import typing as _typing

if _typing.TYPE_CHECKING:
    from multiprocessing.util import Finalize as _Finalize
    from types import FrameType as _FrameType

from ._lazybuf import _remove_spill_files, _remove_spill_files_at_finalization

if not _remove_spill_files_at_finalization():
    _atexit.register(_remove_spill_files)


def _remove_spill_files_at_child_exit() -> None:
    """The finalizer ``_ChildCleanup`` registers: removes the spill files, unless this child was
    started by spawn. A spawn child's start (``multiprocessing.spawn.spawn_main``, on this
    thread's stack when multiprocessing runs the finalizer) ends with ``sys.exit()``: the
    interpreter then finishes as any does, runs the child's own ``atexit`` handlers, which may
    still read its spilled buffers, and removes the files after them (``Py_AtExit``, or the
    ``atexit`` fallback above). Fork and forkserver children end with ``os._exit()``, which runs
    neither: they remove the files here."""
    spawn = _sys.modules.get("multiprocessing.spawn")
    spawn_main = getattr(getattr(spawn, "spawn_main", None), "__code__", None)
    frame: "_FrameType | None" = _sys._getframe(1)
    while spawn_main is not None and frame is not None:
        if frame.f_code is spawn_main:
            return
        frame = frame.f_back
    _remove_spill_files()


class _ChildCleanup:
    """Registers ``_remove_spill_files`` as a ``multiprocessing.util.Finalize`` of this process,
    once: multiprocessing runs such finalizers (those with an exit priority) when a child's
    target returns, before its ``os._exit()``. Its priority is low, so it runs after
    multiprocessing's own (a pool's, a queue's), which may still use buffers."""

    EXIT_PRIORITY = -100

    def __init__(self) -> None:
        self.finalizer: "_Finalize | None" = None
        self.pid: int | None = None

    def register(self) -> None:
        util = _sys.modules.get("multiprocessing.util")
        if util is None:
            return
        # Finalizers made by another process (a parent's, inherited) do nothing here, and a
        # child's start clears the registry: register again unless this process's still stands.
        if self.pid == _os.getpid() and self.finalizer is not None and self.finalizer.still_active():
            return
        self.finalizer = util.Finalize(None, _remove_spill_files_at_child_exit, exitpriority=self.EXIT_PRIORITY)
        self.pid = _os.getpid()

    def after_fork(self) -> None:
        # A child's start (BaseProcess._bootstrap) clears the finalizers inherited or made
        # before it, then runs the "after fork" callbacks: register from one of those.
        util = _sys.modules.get("multiprocessing.util")
        if util is not None:
            util.register_after_fork(self, _ChildCleanup.register)


_child_cleanup = _ChildCleanup()
# Forked children (multiprocessing's fork start method, and the forkserver's children).
if hasattr(_os, "register_at_fork"):
    _os.register_at_fork(after_in_child=_child_cleanup.after_fork)
# Imported by a child that multiprocessing is starting (spawn, forkserver: the target's module
# is unpickled before the child's start), or by one that has started (an import in its target).
_child_cleanup.after_fork()
_mp_process = _sys.modules.get("multiprocessing.process")
if _mp_process is not None and _mp_process.parent_process() is not None:
    _child_cleanup.register()
del _mp_process
