"""Dask integration: ``UnifiedBuffer`` sizes and serializers, registered with dask and
distributed when they are imported, without lazybuf ever importing them.

What is registered (docs/DISTRIBUTED.md has the user's view):

- ``dask.sizeof``: a buffer's size is its data bytes (``nbytes``), not the Python object.
- distributed's ``dask`` serializer family: the header (shape, dtype name, pinned, whether
  it holds data) and one frame, a read-only ``memoryview`` over the buffer's own host copy
  (zero-copy; a host read, so a buffer whose device copy alone is current is synced to the
  host first, counted in ``transfer_stats()``). The receiver makes a buffer on its current
  device whose host copy is the received frame itself (HOST_ONLY): distributed hands each
  received frame, writable, to one deserializer, as its NumPy deserializer relies on too.
  Small, read-only or pinned frames are copied.
- distributed's ``cuda`` family (used by GPU comms such as UCX, as for CuPy arrays): a CUDA
  buffer whose device copy is current is sent as one frame over its device memory (a
  ``DeviceFrame`` with ``__cuda_array_interface__``), with no host round trip; the receiver
  makes a buffer on its CUDA device and copies the frame there device-to-device
  (DEVICE_ONLY). A buffer whose host copy alone is current, or that is not on a CUDA device,
  is left to the ``dask`` family (its host frame), so no copy is made just to send it.

Registration works whatever the import order, in the sending and the receiving process:
``install()`` (run by ``import lazybuf``) registers at once with whichever of ``dask.sizeof``
and ``distributed.protocol`` is already imported, and puts a finder on ``sys.meta_path`` that
registers with the others right after they are imported later (and removes itself once
nothing is left). A receiving worker that has never imported lazybuf imports it when it
unpickles the type named in the header, which registers the deserializers before distributed
looks them up. lazybuf deliberately does not use dask's ``dask.sizeof`` entry-point group:
that would import lazybuf (and its extension) in every process that imports dask, and a
lazybuf that fails to import would then break ``import dask``.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

from . import _lazybuf
from ._lazybuf import UnifiedBuffer, get_accelerator
from ._state import BufferState

__all__ = ["install"]

# --- sizes --------------------------------------------------------------------------------


def sizeof_buffer(buf: UnifiedBuffer) -> int:
    """``dask.sizeof`` of a buffer: its data bytes."""
    return int(buf.nbytes)


def _register_sizeof(module: ModuleType) -> None:
    module.sizeof.register(UnifiedBuffer)(sizeof_buffer)


# --- the dask family: the host frame ------------------------------------------------------


def _header(buf: UnifiedBuffer, initialized: bool) -> dict[str, Any]:
    return {
        "shape": list(buf.shape),
        "dtype": buf.dtype.name,
        "pinned": buf.pinned,
        "initialized": initialized,
    }


def _parse_header(header: Any, frames: Sequence[Any]) -> tuple[tuple[int, ...], str, bool, Any]:
    """The shape, dtype name, pinned flag and the one data frame (or None) of a header that
    `_header` wrote; ValueError for anything else."""
    try:
        raw_shape, pinned, initialized = header["shape"], header["pinned"], header["initialized"]
        # What `_header` writes, exactly: a string shape would split into characters, and
        # bool("no") is True.
        if not isinstance(raw_shape, (list, tuple)):
            raise TypeError(f"shape must be a list of ints, got {type(raw_shape).__name__}")
        if not isinstance(pinned, bool) or not isinstance(initialized, bool):
            raise TypeError("pinned and initialized must be bools")
        # Ints only: int() took 1.5 as 1 and True as 1 (the twenty-second hostile pass).
        if not all(isinstance(d, int) and not isinstance(d, bool) for d in raw_shape):
            raise TypeError(f"shape must be a list of ints, got {list(raw_shape)!r}")
        shape = tuple(raw_shape)
        dtype = str(header["dtype"])
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(
            f"not the header of a serialized lazybuf.UnifiedBuffer ({err!r}): expected the keys "
            f"shape, dtype, pinned and initialized, got {header!r}"
        ) from None
    expected = 1 if initialized else 0
    if len(frames) != expected:
        raise ValueError(
            f"a serialized lazybuf.UnifiedBuffer has {expected} data frame(s), got {len(frames)}"
        )
    if initialized and frames[0] is None:
        raise TypeError("the data frame of a serialized lazybuf.UnifiedBuffer must be bytes-like, got None")
    return shape, dtype, pinned, frames[0] if initialized else None


def dask_dumps(buf: UnifiedBuffer) -> tuple[dict[str, Any], list[memoryview]]:
    """The ``dask`` family: the header and a zero-copy memoryview of the host copy."""
    frame = _lazybuf._host_frame(buf)
    return _header(buf, frame is not None), [] if frame is None else [frame]


def dask_loads(header: dict[str, Any], frames: Sequence[Any]) -> UnifiedBuffer:
    """A new buffer on the current device whose host copy is the received frame itself when
    distributed handed a writable one (as its NumPy deserializer makes an array over it), else
    a copy of it (HOST_ONLY either way)."""
    shape, dtype, pinned, data = _parse_header(header, frames)
    return _lazybuf._rebuild_buffer_from_bytes(shape, dtype, pinned, data, adopt=True, family="dask")


# --- the cuda family: the device frame ----------------------------------------------------

_HOST_CURRENT_ONLY = (BufferState.HOST_ONLY, BufferState.HOST_DIRTY)


def cuda_dumps(buf: UnifiedBuffer) -> tuple[dict[str, Any], list[Any]]:
    """The ``cuda`` family: the header and a ``DeviceFrame`` over the device copy.
    ``NotImplementedError`` (distributed then tries its next family, ``dask``) for a buffer
    that is not on a CUDA device or whose device copy is not current."""
    if buf.device_handle.backend != "cuda":
        raise NotImplementedError("lazybuf sends device frames only for buffers on CUDA devices")
    if buf.state in _HOST_CURRENT_ONLY:
        raise NotImplementedError("only the host copy is current: the host frame is sent instead")
    frame = _lazybuf._device_frame(buf)
    return _header(buf, frame is not None), [] if frame is None else [frame]


def _cuda_home() -> Any:
    """The CUDA device a received device frame goes to: the current device if it is a CUDA
    device, else the first CUDA device."""
    accelerator = get_accelerator()
    current = accelerator.current_device
    if current.backend == "cuda":
        return current
    for device in accelerator.devices:
        if device.backend == "cuda":
            return device
    raise _lazybuf.BackendUnavailableError(
        "a lazybuf.UnifiedBuffer arrived as a CUDA device frame, but this process has no CUDA "
        f"device ({accelerator.backend_status})"
    )


def _device_extent(interface: dict[str, Any]) -> tuple[int, int]:
    """The pointer and size in bytes of C-contiguous memory described by a CUDA Array
    Interface; ValueError for strided or masked memory."""
    import numpy as np

    shape = tuple(int(d) for d in interface["shape"])
    itemsize = np.dtype(interface["typestr"]).itemsize
    strides = interface.get("strides")
    if strides is not None:
        expected = []
        step = itemsize
        for d in reversed(shape):
            expected.append(step)
            step *= d
        if tuple(strides) != tuple(reversed(expected)) and 0 not in shape:
            raise ValueError(f"a device frame must be C-contiguous, got strides {strides}")
    if interface.get("mask") is not None:
        raise ValueError("a device frame must not have a mask")
    count = 1
    for d in shape:
        count *= d
    return int(interface["data"][0]), count * itemsize


def cuda_loads(header: dict[str, Any], frames: Sequence[Any]) -> UnifiedBuffer:
    """A new buffer on this process's CUDA device holding a device-to-device copy of the
    frame (DEVICE_ONLY); on the frame's own device when it is a ``DeviceFrame`` of this
    process. A frame that arrived as host bytes is copied to the host copy."""
    shape, dtype, pinned, frame = _parse_header(header, frames)
    # A frame lazybuf made in this process (distributed's in-process transfers pass it as it
    # is) is memory of its own device: the buffer goes there, where the copy can borrow it
    # (on another device the borrow refused the pointer: the twenty-second hostile pass).
    device = frame.device if isinstance(frame, _lazybuf.DeviceFrame) else _cuda_home()
    if frame is None or not hasattr(frame, "__cuda_array_interface__"):
        return _lazybuf._rebuild_buffer_from_bytes(shape, dtype, pinned, frame, device, family="cuda")
    interface = frame.__cuda_array_interface__
    ptr, nbytes = _device_extent(interface)
    buf = UnifiedBuffer(shape, dtype, pinned=pinned, device=device)
    stream = interface.get("stream")  # the producer's stream, which CAI v3 asks to order after
    _lazybuf._fill_from_device_pointer(buf, ptr, nbytes, None if stream is None else int(stream))
    return buf


# --- registration -------------------------------------------------------------------------


def _register_distributed(module: ModuleType) -> None:
    module.dask_serialize.register(UnifiedBuffer)(dask_dumps)
    module.dask_deserialize.register(UnifiedBuffer)(dask_loads)
    module.cuda_serialize.register(UnifiedBuffer)(cuda_dumps)
    module.cuda_deserialize.register(UnifiedBuffer)(cuda_loads)


_HOOKS: dict[str, Callable[[ModuleType], None]] = {
    "dask.sizeof": _register_sizeof,
    "distributed.protocol": _register_distributed,
}
_pending: set[str] = set(_HOOKS)
_lock = threading.RLock()
_finding: set[str] = set()


def _ready(name: str) -> ModuleType | None:
    """The module `name` once it has finished importing, else None."""
    module = sys.modules.get(name)
    spec = getattr(module, "__spec__", None)
    if module is None or getattr(spec, "_initializing", False):
        return None
    return module


def _register(name: str, module: ModuleType) -> None:
    """Runs the hook of `name` once. Never raises: a failure must not break the import of
    dask or distributed; it is reported as a warning instead."""
    with _lock:
        if name not in _pending:
            return
        _pending.discard(name)
        try:
            _HOOKS[name](module)
        except Exception as err:  # noqa: BLE001 - reported, never raised into an import
            warnings.warn(
                f"lazybuf could not register its {name} integration: {err!r}",
                RuntimeWarning,
                stacklevel=2,
            )
        if not _pending and _FINDER in sys.meta_path:
            sys.meta_path.remove(_FINDER)


def _register_ready() -> None:
    for name in list(_pending):
        module = _ready(name)
        if module is not None:
            _register(name, module)


class _RegisteringLoader:
    """Wraps the loader of a module lazybuf registers with; runs the hook right after the
    module has executed, and puts the original loader back on the module."""

    def __init__(self, loader: Any, name: str) -> None:
        self._loader = loader
        self._name = name

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        _register(self._name, module)

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self._loader, attribute)


class _Finder:
    """A ``sys.meta_path`` finder that finds nothing itself: for the modules lazybuf waits for
    it returns the spec the other finders return, with a loader that registers after the
    module executed. Every lookup also registers with any awaited module that finished
    importing meanwhile (one that was mid-import when lazybuf was imported)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        if _pending:
            _register_ready()
        if fullname not in _pending or fullname in _finding:
            return None
        _finding.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            _finding.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _RegisteringLoader(spec.loader, fullname)  # type: ignore[assignment]
        return spec


_FINDER = _Finder()


def install() -> None:
    """Registers with dask and distributed: now for what is imported, later for the rest.
    Imports neither. Idempotent."""
    with _lock:
        _register_ready()
        if _pending and _FINDER not in sys.meta_path:
            sys.meta_path.insert(0, _FINDER)
