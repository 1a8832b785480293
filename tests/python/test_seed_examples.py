"""Every example of the seed documents, run with only the import line changed.

Sources: shared/seeds/002 (UnifiedBuffer API reference; 000 is the same page rendered) and
shared/seeds/003 (memory management guide; 001 is the same page rendered, plus a Metal
monitoring example). Names the examples use without defining (``data``, ``gpu_kernel``,
``batches`` ...) are defined here first; the example bodies are the seeds' lines. The seeds'
``print(buf.state)  # X`` comments become assertions.

Where lazybuf's answer differs from a comment, the assertion says why. Two rules cause all
such differences (SPEC section 1):
- a new buffer's first host write leaves it HOST_ONLY, not HOST_DIRTY: no device copy exists
  yet to be stale;
- in Python, ``.host`` hands out a writable array and lazybuf cannot see writes through it,
  so it counts as a host write: after ``.host`` a device copy is stale (HOST_DIRTY) until the
  device is read again. ``.host_readonly`` and ``sync_to_host()`` are host reads. ``.device``
  is a device read, exactly as the seeds define it (SYNCHRONIZED after it; kernels that write
  it are followed by ``mark_device_dirty()``).

Not lazybuf code, so not run: the "traditional approach" snippet (``cuda.to_device``, the
problem the guide describes) and the actor-runtime lines of "Large Data Handling"
(``@message``, ``runtime.send``); that example's buffer code is run.
"""

import asyncio
import ctypes
import uuid

import numpy as np
import pytest

from lazybuf import (
    BackendUnavailableError,
    BufferState,
    DeviceMemoryView,
    UnifiedBuffer,
    get_accelerator,
    get_memory_pool,
)


@pytest.fixture(autouse=True)
def default_device():
    """The examples run on the default device, as a user's would: the host here, a GPU where
    there is one (CuPy arrays on CUDA). Where `.device` would be a bare DeviceMemoryView (no
    array library for that backend installed), the examples' array code cannot run on it, so
    they run on the host; test_cuda.py covers that case."""
    acc = get_accelerator()
    acc.select_device(None)
    if isinstance(UnifiedBuffer(1).device, DeviceMemoryView):
        acc.select_device("host")
    yield
    acc.select_device(None)


def as_numpy(array) -> np.ndarray:
    """A device array's contents (NumPy on the host device; CuPy and PyOpenCL have .get())."""
    return array if isinstance(array, np.ndarray) else array.get()


def host_address(buf: UnifiedBuffer) -> int:
    return buf.host.__array_interface__["data"][0]


# --- 002 / 000: UnifiedBuffer API reference ------------------------------------------------


def test_overview():
    # Create a buffer
    buffer = UnifiedBuffer(shape=(1024,), dtype=np.float32)

    # Work on host
    buffer.host[:] = np.random.randn(1024)

    # Access on device (auto-syncs)
    device_data = buffer.device

    np.testing.assert_array_equal(as_numpy(device_data), buffer.to_numpy())


def test_buffer_state_values():
    assert BufferState.UNINITIALIZED.value == "uninitialized"
    assert BufferState.HOST_ONLY.value == "host_only"
    assert BufferState.DEVICE_ONLY.value == "device_only"
    assert BufferState.SYNCHRONIZED.value == "synchronized"
    assert BufferState.HOST_DIRTY.value == "host_dirty"
    assert BufferState.DEVICE_DIRTY.value == "device_dirty"
    assert str(BufferState.HOST_DIRTY) == "HOST_DIRTY"


def test_basic_usage():
    # Create buffer
    buf = UnifiedBuffer((1000,), dtype=np.float32)

    # Initialize on host
    buf.host[:] = np.arange(1000, dtype=np.float32)

    # Use on device (automatically syncs)
    device_array = buf.device
    # ... GPU computation ...

    # Read back (automatically syncs if device modified)
    result = buf.to_numpy()

    np.testing.assert_array_equal(result, np.arange(1000, dtype=np.float32))
    assert device_array is not None


def test_pinned_memory_for_faster_transfers():
    # Use pinned memory for frequent host-device transfers
    buf = UnifiedBuffer((1024, 1024), dtype=np.float32, pinned=True)

    assert buf.pinned
    try:
        buf.host[:] = 1.0
    except MemoryError as err:  # an mlock limit: reported, never a silent pageable fallback
        assert "mlock" in str(err)
    else:
        assert buf.is_pinned


def test_explicit_synchronization():
    buf = UnifiedBuffer((1000,), dtype=np.float32)

    # Modify on host
    buf.host[:] = np.random.randn(1000)

    # Explicitly sync before kernel launch
    buf.sync_to_device()
    assert buf.state == BufferState.SYNCHRONIZED

    # After GPU kernel modifies device data
    buf.mark_device_dirty()
    assert buf.state == BufferState.DEVICE_DIRTY

    # Explicitly sync back
    buf.sync_to_host()
    assert buf.state == BufferState.SYNCHRONIZED


def test_state_tracking(capsys):
    buf = UnifiedBuffer((100,), dtype=np.float32)

    print(buf.state)  # UNINITIALIZED

    buf.host[:] = 1.0
    print(buf.state)  # HOST_DIRTY

    buf.sync_to_device()
    print(buf.state)  # SYNCHRONIZED

    # The seed prints HOST_DIRTY second. Under lazybuf's contract a new buffer's first host
    # write leaves it HOST_ONLY: no device copy exists yet, so none can be stale.
    assert capsys.readouterr().out.split() == ["UNINITIALIZED", "HOST_ONLY", "SYNCHRONIZED"]


def test_metal_example():
    buf = UnifiedBuffer((1000,), dtype=np.float32)

    # Initialize on host
    buf.host[:] = np.random.randn(1000).astype(np.float32)
    buf.mark_host_dirty()

    # Access on Metal (automatically syncs from host)
    # "On systems without Metal (non-macOS), metal raises an error"
    with pytest.raises(BackendUnavailableError, match="Metal is not available"):
        metal_array = buf.metal  # Returns MLX array  # noqa: F841

    # After Metal modifies data
    with pytest.raises(BackendUnavailableError, match="Metal is not available"):
        buf.mark_metal_dirty()
    # The failed Metal calls changed nothing.
    assert buf.state == BufferState.HOST_ONLY


def test_notes_device_is_host_without_cuda(host_device):
    # "On systems without CUDA, device returns the same NumPy array as host"
    buf = UnifiedBuffer((10,), dtype=np.float32, device=host_device)
    assert buf.device is buf.host


# --- 003 / 001: memory management guide ----------------------------------------------------


@pytest.fixture(params=["host", "opencl"])
def any_device(request):
    if request.param == "opencl":
        return request.getfixturevalue("opencl_device")
    return request.getfixturevalue("host_device")


def test_state_transitions_table(any_device):
    """The guide's transition table, row by row, with the accessors the seeds use."""
    buf = UnifiedBuffer((1000,), dtype=np.float32, device=any_device)
    assert buf.state == BufferState.UNINITIALIZED
    buf.host[:] = 1.0  # UNINITIALIZED --.host access--> HOST_ONLY
    assert buf.state == BufferState.HOST_ONLY
    buf.device  # HOST_ONLY --.device access--> SYNCHRONIZED
    assert buf.state == BufferState.SYNCHRONIZED
    buf.host[:] = 2.0  # SYNCHRONIZED --host modified--> HOST_DIRTY
    assert buf.state == BufferState.HOST_DIRTY
    buf.device  # HOST_DIRTY --.device access--> SYNCHRONIZED
    assert buf.state == BufferState.SYNCHRONIZED
    buf.mark_device_dirty()  # SYNCHRONIZED --device modified--> DEVICE_DIRTY
    assert buf.state == BufferState.DEVICE_DIRTY
    buf.host_readonly  # DEVICE_DIRTY --.host access--> SYNCHRONIZED
    assert buf.state == BufferState.SYNCHRONIZED
    np.testing.assert_array_equal(buf.to_numpy(), np.full(1000, 2.0, dtype=np.float32))
    # The writing accessors count as writes:
    buf.device_writable
    assert buf.state == BufferState.DEVICE_DIRTY
    buf.host
    assert buf.state == BufferState.HOST_DIRTY


def test_unified_buffer_solution():
    # Create unified buffer
    buf = UnifiedBuffer((1000,), dtype=np.float32)

    # Work on host
    buf.host[:] = np.random.randn(1000)

    # Use on device (auto-syncs)
    device_array = buf.device  # Automatically copies to GPU

    # Read back (auto-syncs if device modified)
    result = buf.to_numpy()

    np.testing.assert_array_equal(result, as_numpy(device_array))


def test_lazy_synchronization():
    data = np.random.randn(1000).astype(np.float32)

    buf = UnifiedBuffer((1000,), dtype=np.float32)

    # Write on host
    buf.host[:] = data  # State: HOST_DIRTY

    # No sync yet - still HOST_DIRTY
    print(buf.state)  # HOST_DIRTY
    # A new buffer: HOST_ONLY (no device copy exists yet to be stale).
    assert buf.state == BufferState.HOST_ONLY

    # Access device - triggers sync
    device_data = buf.device  # Sync: host → device
    print(buf.state)  # SYNCHRONIZED
    assert buf.state == BufferState.SYNCHRONIZED
    np.testing.assert_array_equal(as_numpy(device_data), data)


def test_explicit_synchronization_guide():
    data = np.arange(1000, dtype=np.float32)

    def my_kernel(device_array):
        device_array *= 2  # NumPy on the host device, CuPy on CUDA

    buf = UnifiedBuffer((1000,), dtype=np.float32)

    # Prepare data
    buf.host[:] = data

    # Explicitly sync before kernel launch
    buf.sync_to_device()

    # Run GPU kernel (modifies device data)
    my_kernel(buf.device)

    # Mark device as modified
    buf.mark_device_dirty()

    # Explicitly sync before reading
    buf.sync_to_host()

    # Now safe to read
    result = buf.host[:]

    np.testing.assert_array_equal(result, data * 2)


def test_pinned_memory_guide():
    data = np.random.randn(1000).astype(np.float32)

    # Pinned memory for frequent transfers
    buf = UnifiedBuffer((1000,), dtype=np.float32, pinned=True)

    try:
        # Transfers are faster due to DMA
        buf.host[:] = data
        device_view = buf.device  # Faster copy
    except MemoryError as err:  # an mlock limit: reported, never a silent pageable fallback
        assert "mlock" in str(err)
        return
    np.testing.assert_array_equal(as_numpy(device_view), data)
    assert buf.is_pinned


def test_memory_pooling():
    data = np.random.randn(1000).astype(np.float32)
    processed = []

    def process(device_array):
        processed.append(float(as_numpy(device_array).sum()))

    pool = get_memory_pool()

    # Acquire from pool (fast if cached)
    buf = pool.acquire((1000,), dtype=np.float32)

    # Use buffer...
    buf.host[:] = data
    first_address = host_address(buf)
    process(buf.device)

    # Release back to pool (not deallocated)
    pool.release(buf)

    # Next acquire may reuse the buffer
    buf2 = pool.acquire((1000,), dtype=np.float32)  # Same buffer!

    assert host_address(buf2) == first_address
    assert processed == [pytest.approx(float(data.sum()), rel=1e-5)]
    pool.release(buf2)


def test_large_data_handling():
    large_array = np.random.randn(4096).astype(np.float32)

    # Shared buffer registry
    buffers: dict[str, UnifiedBuffer] = {}

    def create_work_buffer(data: np.ndarray) -> str:
        buf_id = str(uuid.uuid4())
        buf = UnifiedBuffer(data.shape, data.dtype)
        buf.copy_from(data)
        buffers[buf_id] = buf
        return buf_id

    # Send just the reference
    buf_id = create_work_buffer(large_array)

    np.testing.assert_array_equal(buffers[buf_id].to_numpy(), large_array)
    assert buffers[buf_id].state == BufferState.HOST_ONLY


def test_read_modify_write():
    input_data = np.arange(1000, dtype=np.float32)

    def gpu_kernel(device_array):
        device_array += 1

    buf = UnifiedBuffer((1000,), dtype=np.float32)

    # Read on host
    buf.host[:] = input_data  # HOST_DIRTY

    # Modify on device
    gpu_kernel(buf.device)  # Syncs, then SYNCHRONIZED
    buf.mark_device_dirty()  # DEVICE_DIRTY
    assert buf.state == BufferState.DEVICE_DIRTY

    # Read on host
    result = buf.to_numpy()  # Syncs back

    np.testing.assert_array_equal(result, input_data + 1)
    # The data comes back; the host copy does not: to_numpy() copies the current device copy
    # straight into the new array (one copy instead of two) and changes no state.
    assert buf.state == BufferState.DEVICE_DIRTY


def test_double_buffering():
    batches = [np.full(1000, i, dtype=np.float32) for i in range(5)]
    sums = []

    def data_available():
        return bool(batches)

    def get_next_batch():
        return batches.pop(0)

    def kernel(device_array):
        sums.append(float(as_numpy(device_array).sum()))

    def launch_async(fn, device_array):
        return asyncio.get_running_loop().run_in_executor(None, fn, device_array)

    async def main():
        # Two buffers for overlap
        buf_a = UnifiedBuffer((1000,), dtype=np.float32)
        buf_b = UnifiedBuffer((1000,), dtype=np.float32)
        buf_a.host[:] = get_next_batch()

        while data_available():
            # Process buf_a on GPU while filling buf_b on CPU
            buf_a.sync_to_device()
            gpu_task = launch_async(kernel, buf_a.device)

            # Meanwhile, fill buf_b on host
            buf_b.host[:] = get_next_batch()

            # Wait for GPU
            await gpu_task

            # Swap buffers
            buf_a, buf_b = buf_b, buf_a

    asyncio.run(main())
    assert sums == [i * 1000.0 for i in range(4)]


def _times_two(device_array):
    """The seeds' ``device_array *= 2`` on whatever ``.device`` returned: NumPy, CuPy and
    PyOpenCL arrays do it themselves; a DeviceMemoryView of the CUDA driver test double (whose
    device pointers are host allocations) is written through its pointer, as a kernel would."""
    if not isinstance(device_array, DeviceMemoryView):
        device_array *= 2
        return
    assert "test double" in device_array.device.name, "a real GPU needs CuPy for this example"
    interface = device_array.__cuda_array_interface__
    count = int(np.prod(interface["shape"]))
    memory = (ctypes.c_float * count).from_address(interface["data"][0])
    view = np.ctypeslib.as_array(memory).reshape(interface["shape"])
    get_accelerator().synchronize()  # the upload is done before the "kernel" runs
    view *= 2


@pytest.fixture(params=["default", "opencl", "cuda"])
def batch_device(request):
    """The default device (the host, or a GPU with its array library), and the devices that do
    not alias host memory here: PoCL below its zero-copy size, and the CUDA test double."""
    if request.param == "default":
        return None
    if request.param == "opencl":
        request.getfixturevalue("pyopencl")
        return request.getfixturevalue("opencl_device")
    devices = [d for d in get_accelerator().devices if d.backend == "cuda"]
    if not devices:
        pytest.skip("no CUDA device")
    if isinstance(UnifiedBuffer(1, device=devices[0]).device, DeviceMemoryView) and (
        "test double" not in devices[0].name
    ):
        pytest.skip("a real GPU without CuPy: the example's kernel cannot run")
    return devices[0]


def test_batch_processing(batch_device):
    batches = [np.random.randn(16, 8).astype(np.float32) for _ in range(4)]

    def process_on_gpu(device_array):
        _times_two(device_array)  # device_array *= 2

    pool = get_memory_pool(batch_device)
    results = []

    for batch in batches:
        buf = pool.acquire(batch.shape, batch.dtype)
        try:
            buf.copy_from(batch)
            process_on_gpu(buf.device)
            # The seed omits this line. `.device` is a device read (the seeds' state table:
            # SYNCHRONIZED after it), so a kernel that writes it must say so; without the mark
            # to_numpy() returns the host copy from before the kernel on every device that
            # does not alias host memory (a GPU; PoCL and the CUDA test double here).
            buf.mark_device_dirty()
            results.append(buf.to_numpy().copy())
        finally:
            pool.release(buf)

    for batch, result in zip(batches, results, strict=True):
        np.testing.assert_array_equal(result, batch * 2)


def test_gpu_memory_monitoring(capsys):
    acc = get_accelerator()

    # Before allocation
    free_before, total = acc.get_memory_info()

    # Allocate
    buf = UnifiedBuffer((10_000_000,), dtype=np.float32)
    _ = buf.device  # Force device allocation

    # After allocation
    free_after, _ = acc.get_memory_info()

    print(f"Allocated: {(free_before - free_after) / 1e6:.1f} MB")

    assert capsys.readouterr().out.startswith("Allocated: ")
    assert 0 < free_after <= total and 0 < free_before <= total


def test_metal_memory_monitoring(capsys):
    acc = get_accelerator()

    # Metal memory info includes cache and peak usage
    free, total = acc.get_memory_info()
    print(f"Memory: {free / 1e9:.1f} GB free / {total / 1e9:.1f} GB total")

    # Allocate
    buf = UnifiedBuffer((10_000_000,), dtype=np.float32)
    with pytest.raises(BackendUnavailableError):
        _ = buf.metal  # Force Metal allocation (virtually free on unified memory)

    assert capsys.readouterr().out.startswith("Memory: ")
