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
- ``.device``, ``sync_to_device()``: a *device read*, as in the seeds: after a kernel writes
  ``.device``, call ``mark_device_dirty()`` (or use ``.device_writable``). On the host device
  both return the host array itself, whose writes reach every copy at once.

Views (NumPy arrays, memoryviews, DLPack capsules, PyOpenCL/CuPy arrays, DeviceMemoryView)
keep the buffer's memory alive: releasing or dropping a buffer never frees memory a view can
still reach. A released buffer raises ``ValueError`` on any use.
"""

from collections.abc import Generator, Sequence
from types import TracebackType
from typing import Any, SupportsIndex, final

from typing_extensions import disjoint_base

import numpy as np
import numpy.typing as npt

from ._state import BufferState

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
    "_rebuild_buffer",
]

_ShapeLike = SupportsIndex | Sequence[SupportsIndex]
_DeviceLike = str | Device | None

class BackendUnavailableError(RuntimeError):
    """A backend (Metal, CUDA, OpenCL) is not installed, not compiled in, or has no device."""

class CoherenceError(RuntimeError):
    """The coherence checker found a device copy written without ``mark_device_dirty()``."""

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
    ) -> UnifiedBuffer:
        """Create a buffer on ``device`` (default: the current device, see
        ``get_accelerator()``; a selector such as ``"host"`` or ``"opencl:0"``, or a
        ``Device``). ``shape`` is an int or a sequence of ints; ``dtype`` anything
        ``numpy.dtype`` accepts among float16/32/64, (u)int8-64, or ``"bfloat16"`` with
        ``ml_dtypes`` installed (None: float32). ``pinned`` asks for page-locked host memory
        (an error at first use if it cannot be locked, never a silent fallback).

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
        buffer is SYNCHRONIZED after it, as in the seeds). After a kernel writes it, call
        ``mark_device_dirty()`` so the next host access copies the results back.
        Host device: the same ndarray as ``.host``. OpenCL: a ``pyopencl.array.Array`` sharing
        the buffer's cl_mem on lazybuf's queue (PyOpenCL installed). CUDA: a ``cupy.ndarray``
        over the device pointer (CuPy installed). Otherwise a ``DeviceMemoryView``."""

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
        """The raw handle of the queue/stream lazybuf uses for this buffer (0 on the host)."""

    def order_after(self, stream: Any) -> None:
        """Orders lazybuf's next work on the device copy after the work enqueued on ``stream``
        so far (a PyOpenCL CommandQueue, a CuPy Stream, an object with ``__cuda_stream__``, or
        a raw handle of the buffer's device)."""

    def mark_host_dirty(self) -> None:
        """Declare a host write: the device copy becomes stale."""

    def mark_device_dirty(self) -> None:
        """Declare a device write (after a kernel): the host copy becomes stale."""

    def mark_metal_dirty(self) -> None:
        """Declare a write on the Metal device ``metal`` uses: every other copy becomes stale.
        Raises ``BackendUnavailableError`` where there is no Metal device."""

    def fill(self, value: Any) -> None:
        """Set every element to ``value`` where the data is current, with no transfer (a
        write there). ValueError for a non-scalar; NumPy's errors for unconvertible values."""

    def copy_from(self, data: npt.ArrayLike) -> None:
        """Copy ``data`` (exactly the buffer's shape) into the host copy (a host write that
        skips the sync). Arrays must cast under NumPy's ``same_kind`` rule (TypeError
        otherwise); lists and scalars convert as ``a[...] = data`` does. ValueError for a
        different shape. A failed call changes nothing."""

    def to_numpy(self) -> np.ndarray:
        """A new NumPy array with a copy of the data (a host read)."""

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
        PyBUF_WRITABLE, else read-only (a host read); not for bfloat16. A plain-bytes request
        (no PyBUF_ND: ``hashlib``, ``readinto``) gets a 1-d byte view. ``ctypes``'
        ``from_buffer`` asks through a memoryview, which is read-only: pass ``buf.host``."""
    def __array__(self, dtype: npt.DTypeLike | None = None, copy: bool | None = None) -> np.ndarray:
        """A read-only view (a host read), or a copy with ``copy=True``."""

    @property
    def __array_interface__(self) -> dict[str, Any]:
        """NumPy array interface v3 over the host copy, read-only (a host read). Consumers
        hold the buffer itself, so after a release the buffer keeps this memory until the
        buffer object is gone."""

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """CUDA array interface v3 over the device copy (a device write); AttributeError unless
        the buffer is on a CUDA device."""

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
        exported location. ``copy=True`` exports a fresh host copy."""

    def __dlpack_device__(self) -> tuple[int, int]: ...
    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickling copies the data through the host; unpickling makes the buffer on the
        current device."""

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
    def is_gpu(self) -> bool: ...
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
    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class Accelerator:
    """The process's devices and the current device (``get_accelerator()``)."""

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

def get_accelerator() -> Accelerator: ...
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
        """A private pool (``get_memory_pool()`` gives the device's shared one)."""

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

@final
class PoolStats:
    """A pool's counters; bytes are whole size-class blocks."""

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
    """The process-wide pool of ``device`` (default: the current device)."""

@final
class Transfer:
    """An asynchronous sync in flight. While it runs the buffer reports the state it will
    have; a call that needs the memory in flight waits for it; a failed transfer puts the
    buffer back as it was and raises from ``wait()``/``await``."""

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

@final
class DeviceMemoryView:
    """A buffer's device copy as raw handles (when no array library fits; always on wgpu
    devices, where ``ptr`` is the ``VkBuffer`` on Vulkan); keeps the memory alive."""

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

    @property
    def owner(self) -> MemoryOwner: ...
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """CUDA array interface v3 (CUDA devices only)."""

@final
class MemoryOwner:
    """Keeps a buffer's memory alive (the ``.base`` of lazybuf's NumPy views)."""

@final
class HostBlock:
    """Host memory from lazybuf's cache owned by an array ``to_numpy()`` returned (its
    ``.base``, from 1 MiB up); given back to the cache when the array is gone."""

def _rebuild_buffer(shape: Any, dtype: Any, pinned: bool, data: Any) -> UnifiedBuffer: ...
