"""Type stubs for lazybuf's extension module (crates/lazybuf-py).

Access rules (what each call does to the buffer's copies):

- ``.host``, ``mark_host_dirty()``, ``copy_from()``, writable buffer-protocol and DLPack
  exports: a *host write*. The host is made current (copied from the device if the device is
  newer), then the device copy is stale. Python cannot see writes through an array it was
  given, so handing out a writable host array counts as the write.
- ``.host_readonly``, ``to_numpy()``, ``sync_to_host()``, ``__array__``, read-only exports:
  a *host read*. The host is made current; nothing becomes stale.
- ``.device_writable``, ``mark_device_dirty()``, ``__cuda_array_interface__``: a *device
  write*. The device is made current, then the host copy is stale (kernels may write it).
- ``.device``, ``sync_to_device()``: a *device read*, as in PyDotCompute's documentation:
  after a kernel writes ``.device``, call ``mark_device_dirty()`` (or use
  ``.device_writable``). On the host device both return the host array itself, whose writes
  reach every copy at once.

Views (NumPy arrays, memoryviews, DLPack capsules, PyOpenCL/CuPy arrays, DeviceMemoryView)
keep the buffer's memory alive: releasing or dropping a buffer never frees memory a view can
still reach. A released buffer raises ``ValueError`` on any use.
"""

from __future__ import annotations  # forward references, for tools that execute stubs (pdoc)

from collections.abc import Coroutine, Generator, Sequence
from types import GenericAlias, TracebackType
from typing import Any, ClassVar, SupportsIndex, TypeAlias, final

from typing_extensions import disjoint_base

import numpy as np
import numpy.typing as npt

from ._pydotcompute import DeviceType, PoolStatistics
from ._state import BufferState
from .exceptions import BackendUnavailableError as BackendUnavailableError
from .exceptions import CoherenceError as CoherenceError

__all__ = [
    "Accelerator",
    "BackendUnavailableError",
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
    "_cli_main",
    "_rebuild_buffer",
    "_rebuild_device",
    "_rebuild_trace",
    "DeviceFrame",
    "_rebuild_buffer_from_bytes",
    "_host_frame",
    "_device_frame",
    "_fill_from_device_pointer",
    "Trace",
    "_transfer_guard_set_thread",
    "_transfer_guard_thread",
    "_transfer_guard_set_global",
    "_transfer_guard_global",
    "_transfer_guard_flush_log",
    "_trace_start",
    "_trace_stop",
    "_trace_snapshot",
    "_trace_recording",
    "_GuardScope",
    "_TraceRecord",
    "get_memory_limit",
    "memory_held",
    "reset_spill_stats",
    "set_memory_limit",
    "spill_stats",
    "get_host_memory_limit",
    "host_memory_held",
    "set_host_memory_limit",
    "_remove_spill_files",
    "_remove_spill_files_at_finalization",
]

_ShapeLike = SupportsIndex | Sequence[SupportsIndex]
_DeviceLike: TypeAlias = "str | Device | None"  # a string: Device is defined below

def set_checking(on: bool) -> None:
    """Turns the coherence checker on or off for the whole process (``LAZYBUF_CHECK=1`` turns
    it on at start). While on, a host read of a SYNCHRONIZED buffer whose device copy was
    handed out by ``.device`` compares the copies and raises ``CoherenceError`` if they differ."""

def checking() -> bool:
    """Whether the coherence checker is on."""

@final
class UnifiedBuffer:
    """An N-d, C-contiguous array whose host and device copies are kept coherent; copies
    happen only when a stale copy is about to be used. A new buffer allocates nothing.

    Threads: every method is safe to call from any thread, and from finalizers (``__del__``)
    that run inside another call; calls that move bytes release the GIL. Writes through NumPy
    views (or other exports) are the caller's to order against other threads' calls.

    Stale host views: when the host copy goes stale (``mark_device_dirty()``,
    ``device_writable``, ``__cuda_array_interface__``, a device DLPack export) or the buffer is
    released, every writable ``.host`` array the buffer handed out becomes read-only, so a
    late write raises ValueError instead of being lost; a new ``.host`` returns a fresh
    writable view. Views derived from a handed-out array (slices, ``.view()``,
    ``.reshape()``), memoryviews and DLPack tensors are not tracked. Buffers are
    weak-referenceable and take part in garbage collection."""

    def __new__(
        cls,
        shape: _ShapeLike,
        dtype: npt.DTypeLike | None = None,
        *,
        pinned: bool = False,
        device: _DeviceLike = None,
        spillable: bool = True,
    ) -> UnifiedBuffer:
        """Create a buffer on ``device`` (default: the current device, see
        ``get_accelerator()``; a selector such as ``"host"`` or ``"opencl:0"``, or a
        ``Device``). ``shape`` is an int or a sequence of ints; ``dtype`` anything
        ``numpy.dtype`` accepts among float16/32/64, (u)int8-64, complex64/128, or
        ``"bfloat16"`` with ``ml_dtypes`` installed (None: float32). ``pinned`` asks for
        page-locked host memory (an error at first use if it cannot be locked, never a silent
        fallback). ``spillable=False`` keeps the device copy from being evicted under a
        memory limit (``set_memory_limit``).

        Raises ValueError (bad or oversized shape, unknown device), TypeError (unsupported
        dtype, non-integer shape)."""

    @property
    def host(self) -> np.ndarray:
        """Writable zero-copy NumPy view of the host copy (cached; ``.base`` keeps the memory
        alive). Syncs from the device if it is newer; counts as a host write. Made read-only
        when the host copy goes stale or the buffer is released (see the class docs)."""

    @property
    def host_readonly(self) -> np.ndarray:
        """Read-only zero-copy NumPy view of the host copy; a host read."""

    @property
    def device(self) -> Any:
        """The buffer on its device, synced first if the host is newer; a device read (the
        buffer is SYNCHRONIZED after it, as in PyDotCompute's documentation). After a kernel
        writes it, call ``mark_device_dirty()`` so the next host access copies the results back.
        Host device: the same ndarray as ``.host``. OpenCL: a ``pyopencl.array.Array`` sharing
        the buffer's cl_mem on lazybuf's queue (PyOpenCL installed). CUDA: a ``cupy.ndarray``
        over the device pointer (CuPy installed). Otherwise a ``DeviceMemoryView``.

        On CUDA it is stream-ordered: an upload it needs is enqueued on the buffer's stream and
        not waited for. The CuPy array is ready for work on CuPy's current stream at this call
        (made to wait for the upload on the device) and on the buffer's stream; a
        ``DeviceMemoryView`` for work on ``queue`` and on the legacy default stream, and
        elsewhere after its ``synchronize()``. ``mark_device_dirty()`` does not wait for the
        upload either; the read-back waits once. If the upload fails, the read-back raises and
        the buffer holds what it held before ``.device``."""

    @property
    def device_writable(self) -> Any:
        """As ``device``, counted as a device write: the host copy becomes stale, so the next
        host access copies kernel results back without ``mark_device_dirty()``."""

    @property
    def metal(self) -> Any:
        """The buffer on a Metal device (a wgpu device on Metal), synced there: what ``device``
        gives on that device; a device read. Raises ``BackendUnavailableError`` where there is
        no Metal device (anywhere but macOS)."""

    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def dtype(self) -> np.dtype[Any]: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def ndim(self) -> int: ...
    @property
    def state(self) -> BufferState:
        """The host copy against the device copy. After the first host write of a new buffer
        this is HOST_ONLY (no device copy exists yet to be stale)."""

    @property
    def pinned(self) -> bool:
        """Whether page-locked host memory was requested."""

    @property
    def spillable(self) -> bool:
        """Whether lazybuf may evict the device copy under a memory limit."""

    @property
    def is_pinned(self) -> bool:
        """Whether the host copy exists and is page-locked."""

    @property
    def device_handle(self) -> Device:
        """The buffer's own device."""

    @property
    def released(self) -> bool: ...
    def sync_to_device(self) -> None:
        """Copy host data to the device if the device copy is stale (a device read)."""

    def sync_to_host(self) -> None:
        """Copy device data to the host if the host copy is stale (a host read)."""

    def sync_to_device_async(self) -> Transfer:
        """As ``sync_to_device()``, asynchronously: enqueues the copies and returns at once;
        ``await`` the transfer, ``wait()`` for it or poll ``is_complete()``."""

    def sync_to_host_async(self) -> Transfer:
        """As ``sync_to_host()``, asynchronously (see ``sync_to_device_async``)."""

    @property
    def stream(self) -> int:
        """The raw handle of the queue/stream lazybuf uses for this buffer (0 on the host
        device and on wgpu, which have none to hand out)."""

    def order_after(self, stream: Any) -> None:
        """Orders lazybuf's next work on the device copy after the work enqueued on ``stream``
        so far (a PyOpenCL CommandQueue, a CuPy Stream, an object with ``__cuda_stream__``, or
        a raw handle of the buffer's device). A raw handle is trusted: it must be a live queue
        or stream of the buffer's device (lazybuf cannot check one; a wrong one is undefined
        behaviour, as with CuPy's ``ExternalStream``)."""

    def mark_host_dirty(self) -> None:
        """Declare a host write: the device copy becomes stale. On a buffer that holds no data
        (UNINITIALIZED) the host copy holds zeros after it, never an earlier buffer's bytes."""

    def mark_device_dirty(self) -> None:
        """Declare a device write (after a kernel): the host copy becomes stale. On a buffer
        that holds no data (UNINITIALIZED) the device copy holds zeros after it (a fill, not a
        transfer), never an earlier buffer's bytes."""

    def mark_metal_dirty(self) -> None:
        """Declare a write on the Metal device ``metal`` uses: every other copy becomes stale.
        Raises ``MetalUnavailableError`` (a ``BackendUnavailableError`` and PyDotCompute's
        ``MetalError``) where there is no Metal device."""

    def fill(self, value: Any) -> UnifiedBuffer:
        """Set every element to ``value`` where the data is current, with no transfer (a
        write there); returns the buffer. ValueError for a non-scalar; NumPy's errors for
        unconvertible values."""

    def allocate(self, *, host: bool = True, device: bool = True) -> UnifiedBuffer:
        """Make the named copies exist now, holding the buffer's data (a host read and/or a
        device read; a buffer with no data yet holds zeros after it); returns the buffer.
        ValueError when neither is asked for."""

    def free(self) -> None:
        """Give the memory back (to the pool or cache it came from) and make the buffer
        UNINITIALIZED; it stays usable and takes memory again at its next use. Views made
        earlier keep the old memory; writable ``.host`` arrays become read-only. Memory whose
        address ``__array_interface__`` or ``__cuda_array_interface__`` handed out stays with
        the buffer object (its consumers hold the object, not the memory): ``free()`` reuses
        it, contents forgotten, instead of taking more (then ``is_allocated`` stays true; the
        ``buffer_id`` is a new one and the counters start at zero, as after any ``free()``),
        so a loop over one buffer holds one memory."""

    @property
    def is_allocated(self) -> bool:
        """Whether the buffer holds memory (host or device) now, or its host copy is spilled
        to disk: false for a new buffer and after ``free()``."""

    def zeros(self) -> UnifiedBuffer:
        """``fill(0)``; returns the buffer."""

    def copy_to(self, out: np.ndarray) -> None:
        """Copy the data into ``out``, a writable array of the buffer's shape whose dtype the
        buffer's casts to under ``same_kind``. TypeError for a non-array or an uncastable dtype,
        ValueError for another shape or a read-only array. Into an array of the buffer's dtype
        that is C-contiguous it is ``to_numpy(out=out)`` (one copy, the state unchanged); else
        a host read followed by ``np.copyto``."""

    def synchronize(self) -> None:
        """Make every copy the buffer holds current (a stale host copy from the device, a stale
        device copy from the host); copies that do not exist are not made."""

    def ensure_on_device(self) -> Coroutine[Any, Any, None]:
        """A coroutine that makes the device copy current (``sync_to_device_async()``, awaited
        without blocking the event loop)."""

    def ensure_on_host(self) -> Coroutine[Any, Any, None]:
        """A coroutine that makes the host copy current (``sync_to_host_async()``)."""

    @classmethod
    def __class_getitem__(cls, item: Any) -> GenericAlias:
        """``UnifiedBuffer[np.float32]`` in annotations; the element type is ``dtype=``."""

    def __getitem__(self, key: Any, /) -> Any:
        """Index the host copy (a host read); slices are read-only views."""

    def __setitem__(self, key: Any, value: Any, /) -> None:
        """Assign into the host copy as NumPy does (a host write). ``buf[:] = x`` and
        ``buf[...] = x`` (an array that is not a view of this buffer's host copy, or a number)
        replace every element: a stale host copy is overwritten, not synced first, and a failed
        conversion changes nothing."""

    def copy_from(self, data: npt.ArrayLike) -> None:
        """Copy ``data`` (exactly the buffer's shape) into the host copy (a host write that
        skips the sync). Arrays must cast under NumPy's ``same_kind`` rule (TypeError
        otherwise); lists and scalars convert as ``a[...] = data`` does. ValueError for a
        different shape. A failed call changes nothing."""

    def to_numpy(self, *, out: np.ndarray | None = None) -> np.ndarray:
        """A copy of the data: a new NumPy array, or ``out`` filled and returned (a writable
        C-contiguous array of the buffer's shape and dtype; TypeError for a non-array or
        another dtype, ValueError for another shape, a strided or a read-only array). One
        copy: from the host copy when it is current, else straight from the device copy,
        leaving the host copy stale and the state unchanged."""

    @property
    def buffer_id(self) -> int:
        """The buffer's id: unique in the process, the name ``TransferGuardError`` and
        recorded events (``lazybuf.trace``) give it. A new id after ``free()``, unless
        ``free()`` kept memory an interface exported (see ``free``)."""

    def transfer_stats(self) -> dict[str, int]:
        """Copies and bytes moved since creation: ``host_to_device_copies``,
        ``host_to_device_bytes``, ``device_to_host_copies``, ``device_to_host_bytes``,
        ``zero_copy_syncs``, ``allocations``."""

    def release(self) -> None:
        """Release the buffer: to its pool if it came from one, else its memory is freed once
        no view of it remains. Any later use raises ValueError (so does a second release)."""

    def __enter__(self) -> UnifiedBuffer: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        """Releases the buffer (see ``release``)."""

    def __len__(self) -> int:
        """The first dimension. The buffer protocol (``memoryview(buf)``, ``np.asarray(buf)``)
        exports the host copy: writable (a host write) when the consumer asks for
        PyBUF_WRITABLE, else read-only (a host read); a request for items is refused for
        bfloat16 (no format). A plain-bytes request (no PyBUF_ND: ``hashlib``, ``readinto``, a
        file's ``write``) gets a 1-d byte view, for every dtype. ``ctypes``'
        ``from_buffer`` asks through a memoryview, which is read-only: pass ``buf.host``."""

    def __sizeof__(self) -> int:
        """The object's size, the memory it holds included (``nbytes`` per allocated copy);
        once released only the object itself (its memory part is 0)."""

    def __array__(self, dtype: npt.DTypeLike | None = None, copy: bool | None = None) -> np.ndarray:
        """A read-only view (a host read), or a copy with ``copy=True``."""

    def __buffer__(self, flags: int, /) -> memoryview:
        """The buffer protocol from Python (PEP 688, Python 3.12+; the slot behind
        ``memoryview(buf)`` on every version): ``inspect.BufferFlags.WRITABLE`` in ``flags`` is
        a host write, else a host read (see ``__len__``). Declared so that type checkers take
        the buffer where a ``collections.abc.Buffer`` is expected."""

    def __release_buffer__(self, buffer: memoryview, /) -> None: ...

    @property
    def __array_interface__(self) -> dict[str, Any]:
        """NumPy array interface v3 over the host copy, read-only (a host read). Consumers
        hold the buffer itself, so the buffer keeps this memory until the buffer object is
        gone, also after ``release()``; ``free()`` reuses it (see ``free``). AttributeError
        for bfloat16 (no type string), before any access."""

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """CUDA array interface v3 over the device copy (a device write); AttributeError unless
        the buffer is on a CUDA device, and for bfloat16 (no type string), before any access.
        The memory stays with the buffer object as for ``__array_interface__``."""

    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any:
        """DLPack capsule, zero-copy (versioned for ``max_version >= (1, 0)``, else legacy):
        the host copy (kDLCPU), or the device copy for a CUDA buffer (kDLCUDA). A write at the
        exported location. ``copy=True`` with ``dl_device=(1, 0)`` exports a fresh host copy for
        the CPU (flagged ``IS_COPIED`` in the versioned ABI); without ``dl_device`` it asks for a
        copy on the buffer's own device: the host copy for a CPU export, a ``BufferError``
        saying to pass ``dl_device=(1, 0)`` for a CUDA buffer. ``stream``: ``None`` for a CPU
        export; for CUDA ``None``, -1, 1, 2 or a stream handle (0 is forbidden by DLPack):
        ``TypeError`` for another type, ``ValueError`` out of range."""

    def __dlpack_device__(self) -> tuple[int, int]: ...
    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickling copies the data through the host; unpickling makes the buffer on the
        current device."""

    def __reduce_ex__(self, protocol: SupportsIndex, /) -> tuple[Any, tuple[Any, ...]]:
        """Protocol 5 and later: the host copy goes out of band as a ``pickle.PickleBuffer``
        over the buffer's own memory (zero-copy; synced from the device first if only the
        device copy is current, counted in ``transfer_stats()``). Older protocols: as
        ``__reduce__``. Unpickling makes the buffer on the current device (HOST_ONLY)."""

@disjoint_base
class Device:
    """One device (not constructible: see ``get_accelerator().devices``)."""

    @property
    def name(self) -> str: ...
    @property
    def backend(self) -> str:
        """``"host"``, ``"opencl"``, ``"cuda"`` or ``"wgpu"``."""

    @property
    def vendor(self) -> str: ...
    @property
    def shares_host_memory(self) -> bool: ...
    @property
    def shared_memory(self) -> bool:
        """Whether the device allocates shared memory (``MemoryShared``): CUDA managed memory,
        OpenCL fine-grained SVM, host memory on the host device; ``False`` on wgpu and where
        the runtime lacks it (NVIDIA's OpenCL has only coarse-grained SVM)."""

    @property
    def is_gpu(self) -> bool: ...
    @property
    def survives_fork(self) -> bool:
        """Whether the device keeps working in a child made by ``os.fork()`` (the host device);
        elsewhere a forked child gets ``ForkedChildError`` (use the ``'spawn'`` start method)."""

    @property
    def total_memory(self) -> int: ...
    @property
    def selector(self) -> str:
        """The selector naming this device (``"opencl:0"``), for ``device=`` and
        ``LAZYBUF_DEVICE``."""

    @property
    def cached_memory(self) -> int:
        """Bytes lazybuf's caches hold for reuse on this device (not free to the runtime)."""
    @property
    def memory_source(self) -> str:
        """Where the free figure comes from: ``"runtime"``, ``"system"`` or
        ``"total_minus_process_held"``."""

    def get_memory_info(self) -> tuple[int, int]:
        """``(free, total)`` bytes now."""

    def synchronize(self) -> None: ...
    def take_deferred_errors(self) -> list[BaseException]:
        """The failures recorded where no caller could be told at once (a buffer dropped with a
        failed transfer nobody waited for, a failed free), as exceptions, oldest first; each is
        returned once."""

    @property
    def device_id(self) -> int | None:
        """The device's index in ``get_accelerator().devices`` (None for a device not listed
        there, such as ``lazybuf.testing.FaultyDevice``)."""

    @property
    def device_type(self) -> DeviceType:
        """The device's backend as a ``DeviceType`` (``CPU`` for the host, ``CUDA``,
        ``OPENCL``, ``WGPU``), except ``METAL`` for a wgpu device on Metal."""

    @property
    def compute_capability(self) -> tuple[int, int] | None:
        """``(major, minor)`` of a CUDA device; None elsewhere."""

    @property
    def compute_capability_str(self) -> str:
        """``"8.9"``, or ``"N/A"`` where there is none."""

    @property
    def total_memory_gb(self) -> float:
        """``total_memory`` in GiB."""

    @property
    def is_available(self) -> bool:
        """True: every listed device can be used."""

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        """Pickles as the selector: unpickled (in a ``multiprocessing`` worker), the device of
        that selector there, or ``ValueError`` naming it where that process has none.
        ``TypeError`` for a device not in ``get_accelerator().devices``."""

    def __copy__(self) -> Device: ...
    def __deepcopy__(self, memo: Any, /) -> Device:
        """The device itself (it names a device and holds no state to copy)."""

    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class Accelerator:
    """The process's devices and the current device (``get_accelerator()``)."""

    def __new__(cls) -> Accelerator:
        """The accelerator: the same object as ``get_accelerator()``."""

    @property
    def devices(self) -> list[Device]:
        """Every device of every available backend, the host last."""

    @property
    def device_count(self) -> int: ...
    @property
    def current_device(self) -> Device:
        """Where buffers created without ``device=`` go: the selected device, else
        ``LAZYBUF_DEVICE``, else the first CUDA GPU, else another GPU, else the host."""

    def select_device(self, device: Device | str | int | None) -> Device:
        """Make ``device`` (a Device, selector, or index into ``devices``; None: the default)
        current. ValueError for an unknown selector, IndexError for a bad index."""

    def get_memory_info(self, device: _DeviceLike = None) -> tuple[int, int]:
        """``(free, total)`` bytes of ``device`` (default: the current device)."""

    @property
    def backend_status(self) -> list[tuple[str, int | str]]:
        """Each compiled-in backend with its device count or why it is unavailable."""

    def is_available(self, backend: str) -> bool: ...
    def synchronize(self) -> None: ...
    def get_device(self, device_id: int) -> Device:
        """``devices[device_id]``; ValueError out of range, TypeError for a non-integer."""

    def set_device(self, device_id: int) -> None:
        """Make ``devices[device_id]`` the current device; ValueError out of range."""

    @property
    def cuda_available(self) -> bool:
        """Whether lazybuf found a CUDA device."""

    @property
    def metal_available(self) -> bool:
        """Whether lazybuf found a Metal device: a wgpu device on Metal (macOS), the device
        ``.metal`` uses."""

def get_accelerator() -> Accelerator:
    """The accelerator, the same object on every call."""

@final
class MemoryPool:
    """A pool of buffer memory on one device: released buffers' memory is reused.

    Threads: every method is safe to call from any thread."""

    def __new__(
        cls,
        device: _DeviceLike = None,
        *,
        max_cached_bytes: int | None = None,
        zero_reused: bool = False,
    ) -> MemoryPool:
        """A private pool on ``device``. With no arguments (no device, no option), the current
        device's process-wide pool: the object ``get_memory_pool()`` returns."""

    def acquire(
        self,
        shape: _ShapeLike,
        dtype: npt.DTypeLike | None = None,
        *,
        pinned: bool = False,
    ) -> UnifiedBuffer:
        """An UNINITIALIZED buffer whose memory comes from this pool (taken at first use).
        Usable as ``with pool.acquire(...) as buf:``, which releases it at the end."""

    def release(self, buffer: UnifiedBuffer) -> None:
        """Return ``buffer``'s memory to the pool (reused once no view of it remains).
        ValueError for a buffer already released or not from this pool (left untouched)."""

    def stats(self) -> PoolStats: ...
    def trim(self) -> int:
        """Free every cached block; returns the bytes freed."""

    def clear(self) -> None:
        """``trim()``, then reset the event counters and the peak."""

    @property
    def device(self) -> Device: ...
    @property
    def max_cached_bytes(self) -> int: ...
    @property
    def zero_reused(self) -> bool: ...
    def get_stats(self) -> PoolStatistics:
        """Bytes in use, bytes held (in use and cached), blocks cached, hits and misses, over
        every kind of memory the pool holds."""

    def get_pinned_stats(self) -> PoolStatistics:
        """As ``get_stats()``, for pinned host memory only."""

    @property
    def enabled(self) -> bool:
        """Whether buffers made without a pool take their memory from this pool: caching by
        default is on and this is a device's process-wide pool."""

    def enable(self) -> None:
        """``set_caching(True)`` (every device). ValueError for a private pool."""

    def disable(self) -> None:
        """``set_caching(False)`` (every device); nothing for a private pool."""

    def free_all_blocks(self) -> int:
        """Free every cached block; returns the bytes freed."""

    def free_all_free(self) -> int:
        """The same as ``free_all_blocks()``."""

    def set_limit(self, size_mb: int | None) -> None:
        """The most MiB the pool may hold, in use and cached (None: no limit); a first use
        beyond it raises MemoryError. TypeError/ValueError for anything but a whole number of
        MiB >= 0 or None."""

    @property
    def limit(self) -> int | None:
        """The limit in bytes, or None."""

@final
class PoolStats:
    """A pool's counters; bytes are whole size-class blocks. Compared by value; pickles as its
    values."""

    __hash__: ClassVar[None] = None  # type: ignore[assignment]  # compared by value, so unhashable

    def __new__(
        cls,
        hits: SupportsIndex | None = None,
        misses: SupportsIndex | None = None,
        allocations: SupportsIndex | None = None,
        bytes_in_use: SupportsIndex | None = None,
        bytes_cached: SupportsIndex | None = None,
        peak_bytes_in_use: SupportsIndex | None = None,
        oom_retries: SupportsIndex | None = None,
    ) -> PoolStats:
        """Counters with these values, each an int >= 0 (0 when not given)."""

    def __reduce__(self) -> tuple[type[PoolStats], tuple[int, int, int, int, int, int, int]]: ...
    @property
    def hits(self) -> int: ...
    @property
    def misses(self) -> int: ...
    @property
    def allocations(self) -> int: ...
    @property
    def bytes_in_use(self) -> int: ...
    @property
    def bytes_cached(self) -> int: ...
    @property
    def peak_bytes_in_use(self) -> int: ...
    @property
    def oom_retries(self) -> int: ...

def get_memory_pool(device: _DeviceLike = None) -> MemoryPool:
    """The process-wide pool of ``device`` (default: the current device): the same object on
    every call for a device."""

@final
class Transfer:
    """An asynchronous sync in flight. While it runs the buffer reports the state it will
    have; a call that needs the memory in flight waits for it; a failed transfer puts the
    buffer back as it was and raises from ``wait()``/``await``. The buffer's ``state`` and
    ``transfer_stats()`` leave a failed copy out at once; its memory is given back when the
    buffer's next call settles the failure (and raises it): until then a host copy read back
    from disk for it stays in memory and counted, its spill file kept."""

    def wait(self) -> None:
        """Blocks until the copies are done (other threads run meanwhile)."""
    def is_complete(self) -> bool:
        """Whether the copies are done; raises the transfer's error if it failed."""
    def __await__(self) -> Generator[Any, None, None]:
        """Waits on a thread of the running event loop's executor; never blocks the loop."""

def caching() -> bool:
    """Whether new buffers take memory from their device's caching pool (default: on)."""

def set_caching(on: bool) -> None:
    """Turns caching by default on or off for buffers made from now on."""

def trim() -> int:
    """Frees every block the default caches hold; returns the bytes freed."""

def set_memory_limit(device: str | Device, nbytes: int | str | None) -> None:
    """Sets the memory limit of ``device`` to ``nbytes`` (an int, or a size string such as
    ``"512MiB"``); ``None`` removes it. Above the limit lazybuf evicts the least recently used
    device copies of buffers not in use before it allocates. A buffer is in use while an
    object lazybuf cannot see uses its device memory (a live ``.device`` array, DLPack capsule
    or tensor, device view; the buffer object itself after ``__cuda_array_interface__``), and
    evictable again once that object is gone (docs/SPILLING.md). Raises ValueError for a
    negative size or a bad size string, TypeError for another type."""

def get_memory_limit(device: str | Device) -> int | None:
    """The memory limit of ``device`` in bytes, or None. Raises ValueError when
    ``LAZYBUF_MEMORY_LIMIT`` is malformed."""

def memory_held(device: str | Device) -> int:
    """The bytes of device memory lazybuf holds on ``device`` (checked against the limit)."""

def spill_stats(device: str | Device) -> dict[str, int | float]:
    """What spilling did on ``device``: evictions, clean_evictions, bytes_written_back,
    bytes_read_back, bytes_to_disk, bytes_from_disk (host copies of its buffers),
    stale_host_frees (stale host copies freed for the host limit, writing nothing),
    spill_requests, spill_failures, seconds."""

def reset_spill_stats(device: str | Device) -> None:
    """Sets the spill counters of ``device`` to zero."""

def set_host_memory_limit(nbytes: int | str | None) -> None:
    """Sets the host memory limit (an int, or a size string such as ``"8GiB"``); ``None``
    removes it. Above it, host copies that are a buffer's only data go to spill files
    (``LAZYBUF_SPILL_DIR``) and come back at the buffer's next use; not while a host view,
    buffer-protocol export or DLPack tensor of the buffer lives (docs/SPILLING.md)."""

def get_host_memory_limit() -> int | None:
    """The host memory limit in bytes, or None."""

def host_memory_held() -> int:
    """The bytes of host memory lazybuf holds (checked against the host limit)."""

def _remove_spill_files() -> int:
    """Removes the spill files this process still has (at the end of a ``multiprocessing``
    child; at interpreter exit through ``_remove_spill_files_at_finalization``)."""

def _remove_spill_files_at_finalization() -> bool:
    """Has the spill files removed once the interpreter has finished (``Py_AtExit``: after
    every ``atexit`` handler and finalizer); false where that cannot be registered."""

@final
class DeviceMemoryView:
    """A buffer's device copy as raw handles (when no array library fits; always on wgpu
    devices, where ``ptr`` is the ``VkBuffer`` on Vulkan); keeps the memory alive, and in use
    (not evicted under a memory limit), while it lives."""

    @property
    def backend(self) -> str: ...
    @property
    def ptr(self) -> int:
        """The ``CUdeviceptr`` (CUDA) or ``cl_mem`` (OpenCL) as an int; 0 when empty."""

    @property
    def nbytes(self) -> int: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def dtype(self) -> np.dtype[Any]: ...
    @property
    def device(self) -> Device: ...
    @property
    def context(self) -> int: ...
    @property
    def queue(self) -> int:
        """The queue or stream lazybuf copies on: enqueue kernels there to order them with
        lazybuf's copies."""

    def synchronize(self) -> None:
        """Waits until the memory holds the buffer's data: the upload ``.device`` enqueued
        without waiting (CUDA) is done. Needed before using ``ptr`` from another stream or
        from the host; kernels on ``queue`` (and on CUDA's legacy default stream) are ordered
        after the upload already. Raises the upload's error if it failed."""

    @property
    def owner(self) -> MemoryOwner: ...
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """CUDA array interface v3 (CUDA devices only). Waits for the upload ``.device``
        enqueued, if any, so it names no stream: its consumers may use any stream."""

@final
class MemoryOwner:
    """Keeps a buffer's memory alive (the ``.base`` of lazybuf's NumPy views, the owner of its
    device arrays), and in use while it lives: the buffer's device copy is not evicted, or its
    host copy not written to disk, until every such owner is gone."""

@final
class HostBlock:
    """Host memory from lazybuf's cache owned by an array ``to_numpy()`` returned (its
    ``.base``, from 1 MiB up); given back to the cache when the array is gone."""

def _rebuild_device(selector: str) -> Device: ...
def _rebuild_trace(version: int, events: tuple[Any, ...], dropped: int) -> Trace: ...
def _rebuild_buffer(
    shape: Any, dtype: Any, pinned: bool, data: Any, origin: tuple[str, str] | None = None
) -> UnifiedBuffer: ...
def _cli_main(argv: list[str]) -> int:
    """Runs the ``lazybuf`` command-line tool with ``argv`` (program name first); returns its
    exit status. ``python -m lazybuf`` calls it."""

# --- Memory objects without coherence tracking ----------------------------------

__all__ += [
    "DeviceBuffer",
    "Memory",
    "MemoryDevice",
    "MemoryHost",
    "MemoryShared",
    "to_device",
    "_rebuild_device_buffer",
    "_rebuild_memory",
]

from typing_extensions import Buffer as _Buffer

@final
class DeviceBuffer:
    """RMM's resizable buffer of device bytes, on every device (CUDA, OpenCL, the host
    device). Every call is synchronous. ``ptr`` and ``__cuda_array_interface__`` addresses are
    valid until the next reallocation (``resize`` beyond the capacity, ``reserve``,
    ``shrink_to_fit``), as in RMM; DLPack tensors keep the memory alive themselves."""

    def __new__(
        cls, *, size: SupportsIndex | None = None, device: _DeviceLike = None, mr: Any = None
    ) -> DeviceBuffer:
        """``size`` uninitialized bytes (``ValueError`` if negative; ``TypeError`` for a bool,
        as in ``resize``/``reserve``) on ``device`` (default: the current device), from ``mr``
        (a ``lazybuf.mr`` resource; default: the device's current resource)."""

    @staticmethod
    def to_device(b: _Buffer, *, device: _DeviceLike = None, mr: Any = None) -> DeviceBuffer:
        """A copy of ``b``, a 1-d contiguous buffer of bytes: ``TypeError`` for objects
        without the buffer protocol, ``ValueError`` for another format, more dimensions or
        gaps."""

    @property
    def buffer_id(self) -> int:
        """The id transfer guard errors (``TransferGuardError.buffer_id``) and recorded
        events give the buffer; kept across reallocations."""

    @property
    def size(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    def __len__(self) -> int: ...
    def __sizeof__(self) -> int:
        """The object's size, the bytes it holds (its capacity) included."""

    def capacity(self) -> int:
        """The bytes the allocation holds (at least ``size``)."""

    def reserve(self, new_capacity: SupportsIndex) -> None:
        """Grows the capacity to exactly ``new_capacity`` if larger (size and contents kept)."""

    def resize(self, new_size: SupportsIndex) -> None:
        """Sets the size, keeping the contents; within the capacity nothing moves, beyond it
        the buffer moves to an allocation of exactly ``new_size`` bytes (new bytes
        uninitialized)."""

    def shrink_to_fit(self) -> None:
        """Moves the contents to an allocation of exactly ``size`` bytes."""

    @property
    def device(self) -> Device: ...
    @property
    def ptr(self) -> int:
        """``CUdeviceptr`` (CUDA), ``cl_mem`` (OpenCL) or address (host device); 0 when the
        capacity is 0. Valid until the next reallocation, as in RMM (a DLPack export holds its
        memory itself)."""

    def copy_to_host(self, ary: _Buffer | None = None) -> Any:
        """Copies into ``ary`` (writable, 1-d bytes, at least ``size`` long) and returns it; a
        new uint8 NumPy array without one."""

    def copy_from_host(self, ary: _Buffer) -> None:
        """Copies ``ary`` (1-d bytes, at most ``size`` long) into the first bytes."""

    def copy_from_device(self, cuda_ary: Any) -> None:
        """Copies device memory (a memory object, a DeviceBuffer, ``__cuda_array_interface__``
        or DLPack; C-contiguous, at most ``size`` bytes) into the first bytes."""

    def tobytes(self) -> bytes: ...
    def __bytes__(self) -> bytes: ...
    def copy(self) -> DeviceBuffer:
        """A copy made on the device, of capacity ``size``."""

    def __copy__(self) -> DeviceBuffer: ...
    def __deepcopy__(self, memo: Any) -> DeviceBuffer: ...
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """CUDA array interface v3 of the bytes (CUDA devices only)."""

    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any:
        """DLPack export of the bytes (see ``Memory.__dlpack__``)."""

    def __dlpack_device__(self) -> tuple[int, int]: ...
    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]: ...

def to_device(b: _Buffer, *, device: _DeviceLike = None, mr: Any = None) -> DeviceBuffer:
    """See ``DeviceBuffer.to_device``."""

def _rebuild_device_buffer(data: Any, device: str) -> DeviceBuffer: ...

@disjoint_base
class Memory:
    """An untyped allocation of one memory kind (dpctl's USM memory): the base class of
    ``MemoryDevice``, ``MemoryHost`` and ``MemoryShared``. Every call is synchronous."""

    @property
    def buffer_id(self) -> int:
        """The id transfer guard errors (``TransferGuardError.buffer_id``) and recorded
        events give the memory (shared by objects made zero-copy from one another)."""

    @property
    def nbytes(self) -> int: ...
    @property
    def size(self) -> int: ...
    def __len__(self) -> int: ...
    def __sizeof__(self) -> int:
        """The object's size, its memory included when it owns it: an object made zero-copy
        from another counts none (its root owner counts it)."""

    def get_usm_type(self) -> str:
        """``"device"``, ``"host"`` or ``"shared"``."""

    @property
    def kind(self) -> str:
        """As ``get_usm_type()``."""

    @property
    def alignment(self) -> int: ...
    @property
    def device(self) -> Device: ...
    @property
    def reference_obj(self) -> Any:
        """The memory object that allocated the memory this one shares (zero-copy; the root
        owner, so chains never nest), else ``None``."""

    @property
    def ptr(self) -> int:
        """Host address (host memory; every kind on the host device), ``CUdeviceptr`` (CUDA)
        or ``cl_mem`` (OpenCL); 0 when empty."""

    def copy_to_host(self, dest: _Buffer | None = None) -> Any:
        """Copies into ``dest`` (writable, 1-d bytes, at least ``nbytes``) and returns it; a new
        uint8 NumPy array without one."""

    def copy_from_host(self, obj: _Buffer) -> None:
        """Copies ``obj`` (1-d bytes, at most ``nbytes``) into the first bytes."""

    def copy_from_device(self, obj: Any) -> None:
        """Copies device memory (a memory object, a DeviceBuffer, ``__cuda_array_interface__``
        or DLPack, producers from before DLPack 1.0 included; C-contiguous, at most
        ``nbytes``) into the first bytes."""

    def memset(self, value: int = 0) -> None:
        """Sets every byte to ``value`` (0 to 255)."""

    def tobytes(self) -> bytes: ...
    def __bytes__(self) -> bytes: ...
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """CUDA array interface v3 (device and shared memory on CUDA devices only)."""

    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any:
        """DLPack export as a 1-d uint8 tensor on the memory's DLPack device (``BufferError``
        for memory DLPack has no device for: OpenCL and wgpu device memory). With
        ``dl_device=(1, 0)`` memory that is not CPU memory is exported as a fresh host copy
        (flagged ``IS_COPIED``) unless ``copy=False`` (``numpy.from_dlpack(obj,
        device="cpu")``); ``copy=True`` always copies. ``stream``: ``None`` for the CPU; for
        CUDA ``None``, -1, 1, 2 or a stream handle (0 is forbidden by DLPack): ``TypeError``
        for another type, ``ValueError`` out of range."""

    def __dlpack_device__(self) -> tuple[int, int]: ...
    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]: ...

_MemorySource = SupportsIndex | Memory | DeviceBuffer | Any

@final
class MemoryDevice(Memory):
    """Device memory; not host accessible (no buffer protocol)."""

    def __new__(
        cls, other: _MemorySource, *, alignment: int = 0, device: _DeviceLike = None, copy: bool = False
    ) -> MemoryDevice:
        """``other`` bytes, or the memory of the memory object ``other`` (zero-copy when the
        kind matches, else ``ValueError`` unless ``copy=True``); with ``copy=True`` also a
        copy of a DeviceBuffer, UnifiedBuffer, ``__cuda_array_interface__`` or DLPack
        producer. ``TypeError`` for anything else (a bool is not a size)."""

@final
class MemoryHost(Memory):
    """Page-locked host memory, with the buffer protocol."""

    def __new__(
        cls, other: _MemorySource, *, alignment: int = 0, device: _DeviceLike = None, copy: bool = False
    ) -> MemoryHost: ...
    def __buffer__(self, flags: int, /) -> memoryview:
        """The buffer protocol (PEP 688; the slot behind ``memoryview(mem)`` on every Python):
        the bytes, writable when ``flags`` asks for it."""

    def __release_buffer__(self, buffer: memoryview, /) -> None: ...

@final
class MemoryShared(Memory):
    """Memory the host and the device both address (CUDA managed memory, OpenCL fine-grained
    SVM, host memory on the host device), with the buffer protocol."""

    def __new__(
        cls, other: _MemorySource, *, alignment: int = 0, device: _DeviceLike = None, copy: bool = False
    ) -> MemoryShared: ...
    def __buffer__(self, flags: int, /) -> memoryview:
        """The buffer protocol (PEP 688; the slot behind ``memoryview(mem)`` on every Python):
        the bytes, writable when ``flags`` asks for it."""

    def __release_buffer__(self, buffer: memoryview, /) -> None: ...
    def prefetch(self, to: str = "device") -> None:
        """Moves the pages to ``"device"`` or ``"host"`` and waits (CUDA managed memory)."""


def _rebuild_memory(device: str, kind: str, data: Any) -> Memory: ...

# --- pickling protocol 5 and Dask frames (crates/lazybuf-py/src/wire.rs, lazybuf/_dask.py) ---

@final
class DeviceFrame:
    """A CUDA buffer's device copy as one frame of bytes (Dask's ``cuda`` serializer family);
    keeps the memory alive."""

    @property
    def ptr(self) -> int:
        """The ``CUdeviceptr`` of the first byte (0 when empty)."""

    @property
    def nbytes(self) -> int: ...
    @property
    def device(self) -> Device:
        """The CUDA device whose memory it is."""

    @property
    def owner(self) -> MemoryOwner: ...
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """CUDA array interface v3: shape ``(nbytes,)``, ``|u1``, read-only."""

    def __len__(self) -> int: ...

def _rebuild_buffer_from_bytes(
    shape: Any,
    dtype: Any,
    pinned: bool,
    data: Any,
    device: _DeviceLike = None,
    adopt: bool = False,
    origin: tuple[str, str] | None = None,
    family: str | None = None,
) -> UnifiedBuffer:
    """Unpickles (protocol 5) or deserializes a buffer: a copy of ``data`` (C-contiguous
    bytes of exactly ``nbytes``, else ValueError) as its host copy, or UNINITIALIZED for
    ``None``. ``adopt=True``: a writable frame of 64 KiB or more, at least half of the memory
    actually allocated for it, becomes the host copy itself (no copy; nothing else may write
    it after). The buffer goes to ``device``, else to the device ``origin`` ((selector, name),
    recorded by the pickle) names when this process has it, else to the current device;
    ``pinned`` is dropped on a device that cannot pin host memory. ``family`` (``"dask"``,
    ``"cuda"``): the Dask serializer family deserializing, the call named in the trace and
    guard errors (``dask deserialize``, ``cuda deserialize``); None: ``unpickle``."""

def _host_frame(buf: UnifiedBuffer) -> memoryview | None:
    """A read-only memoryview over the host copy's bytes (a host read), None without data."""

def _device_frame(buf: UnifiedBuffer) -> DeviceFrame | None:
    """The device copy of a CUDA buffer as a frame (a device read), None without data."""

def _fill_from_device_pointer(
    buf: UnifiedBuffer, ptr: int, nbytes: int, stream: int | None = None
) -> None:
    """Copies ``nbytes`` of device memory at ``ptr`` into an UNINITIALIZED CUDA buffer's device
    copy (device-to-device, after the work enqueued on ``stream`` so far); the buffer is then
    DEVICE_ONLY."""

# --- the transfer guard and the event recorder (python/lazybuf/_transfer_guard.py, trace.py) ---

_GuardNames = tuple[str | None, str | None, str | None]

def _transfer_guard_set_thread(h2d: str | None, d2h: str | None, d2d: str | None) -> _GuardNames: ...
def _transfer_guard_thread() -> _GuardNames: ...
def _transfer_guard_set_global(h2d: str | None, d2h: str | None, d2d: str | None) -> None: ...
def _transfer_guard_global() -> _GuardNames: ...
def _transfer_guard_flush_log() -> None: ...
def _trace_start(capacity: int, python_stack: bool, rust_backtrace: bool) -> None: ...
def _trace_stop() -> Trace: ...
def _trace_snapshot() -> Trace: ...
def _trace_recording() -> bool: ...
@disjoint_base
class _GuardScope:
    """``transfer_guard(...)``'s context manager (native: see python/lazybuf/_transfer_guard.py)."""

    def __new__(cls, h2d: str | None, d2h: str | None, d2d: str | None) -> _GuardScope: ...
    def __enter__(self) -> None: ...
    def __exit__(self, *exc: object) -> bool: ...

@disjoint_base
class _TraceRecord:
    """``trace.record()``'s context manager: ``__enter__`` starts the recorder and returns
    ``recording``, ``__exit__`` stops it into ``recording.trace``."""

    def __new__(cls, capacity: int, python_stack: bool, rust_backtrace: bool, recording: object) -> _TraceRecord: ...
    def __enter__(self) -> Any: ...
    def __exit__(self, exc_type: object, exc_value: object, traceback: object) -> bool: ...

@final
class Trace:
    """Recorded events (``lazybuf.trace.stop()``, ``snapshot()``)."""

    def __len__(self) -> int: ...
    @property
    def dropped(self) -> int:
        """Events dropped because the ring was full."""

    def to_chrome_json(self) -> str:
        """The events as Chrome trace-event JSON (ui.perfetto.dev, chrome://tracing)."""

    def summary(self) -> str:
        """Copies and bytes per buffer, direction and reason, as text; ``(no copies
        recorded)`` under the header when the trace has none."""

    def summary_rows(self) -> list[tuple[int, str, str, int, int]]:
        """The summary as rows ``(buffer, direction, reason, copies, bytes)``."""

    def events(self) -> list[dict[str, Any]]:
        """The events as dicts (``kind``: transfer, allocate, free, pool, state, rollback,
        checker_read; an allocation's and a free's ``memory``: device, host, pinned or
        shared)."""

    def __reduce__(self) -> tuple[Any, tuple[int, tuple[Any, ...], int]]:
        """Pickles as its events' values: a worker returns the trace it recorded as it is."""

    def __copy__(self) -> Trace: ...
    def __deepcopy__(self, memo: Any, /) -> Trace: ...
