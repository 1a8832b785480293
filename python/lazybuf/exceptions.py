"""lazybuf's exception classes, with PyDotCompute 0.2.0's hierarchy for the memory layer.

PyDotCompute code catches ``PyDotComputeError``, ``BufferError``, ``BackendError``,
``BackendNotAvailableError``, ``CUDAError``, ``MetalError``...; the same classes are here (and
in ``lazybuf``), and lazybuf's own errors derive from them where the meaning matches:

- ``BackendUnavailableError`` (a ``RuntimeError``) is a ``BackendNotAvailableError``: a
  backend is not installed, not compiled in, or has no device;
- ``MetalUnavailableError``, raised by ``.metal`` and ``mark_metal_dirty()`` where there is no
  Metal device (Metal works through wgpu, on macOS), is a ``BackendUnavailableError`` and a
  ``MetalError``;
- ``CUDARuntimeError`` (a ``RuntimeError``), a failed CUDA driver call, is a ``CUDAError``;
- ``CoherenceError`` (a ``RuntimeError``), found by the coherence checker, is a
  ``BufferError``;
- ``ForkedChildError`` (a ``RuntimeError``), a device its runtime cannot carry into a forked
  child, used there, is a ``BackendError``;
- ``TransferGuardError`` (a ``RuntimeError``), a copy the transfer guard refused
  (``lazybuf.transfer_guard``), is a ``BufferError``;
- ``ReentrancyError`` (a ``RuntimeError``), an object used from inside an operation on it on
  the same thread (a failure callback, a finalizer it ran), is a ``BufferError``.

``BufferNotAllocatedError`` and ``BufferSyncError`` exist for ``except`` clauses and
``isinstance`` checks, but lazybuf never raises them: a buffer allocates at first use (the
PyDotCompute examples write ``buf.host[:] = ...`` on a new buffer), and a failed copy raises
the runtime's error (``CUDARuntimeError``, ``RuntimeError``, ``MemoryError``) and changes
nothing.

``BufferError`` here is *not* Python's builtin ``BufferError`` (PyDotCompute's shadows it the
same way); ``lazybuf.__all__`` leaves it out so that ``from lazybuf import *`` does not shadow
the builtin.

The extension module raises the lazybuf classes (``crates/lazybuf-py/src/errors.rs`` imports
them from here), so this module imports nothing from it.
"""

from __future__ import annotations

__all__ = [
    "BackendError",
    "BackendNotAvailableError",
    "BackendUnavailableError",
    "BufferError",
    "BufferNotAllocatedError",
    "BufferSyncError",
    "CUDAError",
    "CUDARuntimeError",
    "CoherenceError",
    "MetalError",
    "MetalUnavailableError",
    "ForkedChildError",
    "PyDotComputeError",
    "ReentrancyError",
    "TransferGuardError",
]


# --- PyDotCompute 0.2.0's classes (pydotcompute.exceptions), same names and constructors -------


def _rebuilt(cls: type[BaseException], args: tuple[object, ...], state: dict[str, object] | None) -> BaseException:
    """Unpickles a lazybuf exception without calling its constructor, whose parameters need
    not match ``args`` (the message alone for ``BufferSyncError``, none for
    ``BufferNotAllocatedError``)."""
    error = cls.__new__(cls, *args)
    error.args = args
    if state:
        error.__dict__.update(state)
    return error


class PyDotComputeError(Exception):
    """Base of every lazybuf-specific exception (PyDotCompute's base class).

    Every one pickles with its message, its attributes and its notes, whatever its
    constructor's parameters: a ``multiprocessing`` or ``concurrent.futures`` worker that
    raises one hands it to its parent (PyDotCompute's ``BufferSyncError`` and others failed
    to unpickle there, which broke a ``ProcessPoolExecutor`` and hung a ``Pool``)."""

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuilt, (type(self), self.args, self.__dict__ or None))


class BufferError(PyDotComputeError):  # noqa: A001 - PyDotCompute's name, shadowing the builtin
    """Base of buffer errors. Not the builtin ``BufferError``."""


class BufferNotAllocatedError(BufferError):
    """PyDotCompute raised it for a buffer used before ``allocate()``; lazybuf never raises it
    (buffers allocate at first use)."""

    def __init__(self) -> None:
        super().__init__("Buffer has not been allocated. Call allocate() first.")


class BufferSyncError(BufferError):
    """PyDotCompute raised it when a copy between host and device failed; lazybuf never raises
    it (a failed copy raises the runtime's error and changes nothing)."""

    def __init__(self, direction: str, cause: BaseException) -> None:
        self.direction = direction
        self.cause = cause
        super().__init__(f"Failed to sync buffer {direction}: {cause}")


class BackendError(PyDotComputeError):
    """Base of backend errors."""


class BackendNotAvailableError(BackendError):
    """A backend is not available; ``backend_name`` and ``reason`` say which and why."""

    def __init__(self, backend_name: str, reason: str) -> None:
        self.backend_name = backend_name
        self.reason = reason
        super().__init__(f"Backend '{backend_name}' is not available: {reason}")


class CUDAError(BackendError):
    """A CUDA-specific error."""


class MetalError(BackendError):
    """A Metal-specific error."""


# --- lazybuf's own, raised by the extension -------------------------------------------------


class BackendUnavailableError(RuntimeError, BackendNotAvailableError):
    """A backend (Metal, CUDA, OpenCL) is not installed, not compiled in, or has no device.

    A ``RuntimeError`` and PyDotCompute's ``BackendNotAvailableError``: ``backend_name`` is the
    backend's selector name (``"cuda"``, ``"metal"``), ``reason`` why it cannot be used, and
    ``str()`` the whole message."""

    def __init__(self, message: str, backend_name: str = "", reason: str = "") -> None:
        RuntimeError.__init__(self, message)
        self.backend_name = backend_name
        self.reason = reason or message


class MetalUnavailableError(BackendUnavailableError, MetalError):
    """Metal is not available: there is no Metal device (Metal works through wgpu, on macOS;
    ``.metal`` and ``mark_metal_dirty()`` raise it elsewhere). Also a ``MetalError``, which
    PyDotCompute raised."""


class CUDARuntimeError(RuntimeError, CUDAError):
    """A CUDA driver call failed; the message names the call and the driver's ``CUresult``."""


class ForkedChildError(RuntimeError, BackendError):
    """A device of a runtime that does not survive ``fork()`` (OpenCL, CUDA, wgpu) was used in
    a forked child of the process that opened it. Use the ``spawn`` start method
    (``multiprocessing.get_context("spawn")``); the host device works in a forked child."""


class ReentrancyError(RuntimeError, BufferError):
    """A lazybuf object was used by code that runs inside an operation on that same object, on
    the thread performing it: a memory resource's failure callback (or a finalizer that the
    callback's ``gc.collect()`` ran) used the buffer, memory object or device buffer whose
    allocation it serves. The operation holds the object, so the use cannot wait for it; use
    the object after the operation returns. Other threads simply wait."""


class CoherenceError(RuntimeError, BufferError):
    """The coherence checker (``lazybuf.set_checking(True)``, or ``LAZYBUF_CHECK=1``) found a
    device copy written without ``mark_device_dirty()`` after it was handed out by
    ``.device``."""


class TransferGuardError(RuntimeError, BufferError):
    """The transfer guard (``lazybuf.transfer_guard("disallow")``, ``set_transfer_guard``,
    ``LAZYBUF_TRANSFER_GUARD``) refused a copy between memories; the call changed nothing.
    ``buffer_id`` (``UnifiedBuffer.buffer_id``), ``direction`` (``"h2d"``, ``"d2h"``,
    ``"d2d"``), ``nbytes`` and ``call`` say which copy, and the message why."""

    def __init__(self, message: str, buffer_id: int = 0, direction: str = "", nbytes: int = 0, call: str = "") -> None:
        RuntimeError.__init__(self, message)
        self.buffer_id = buffer_id
        self.direction = direction
        self.nbytes = nbytes
        self.call = call
