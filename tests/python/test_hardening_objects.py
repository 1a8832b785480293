"""Hardening of memory objects, DeviceBuffer and memory resources: the defects a
hostile tester found, each a test that failed before its fix.

- the default resource is one object per device, and raw allocations live until they are
  deallocated (also when the resource object that made them is collected);
- running out of host memory for a result sized by the user raises MemoryError (no abort, no
  panic, no hang), checked in a subprocess under an address-space limit;
- 100k zero-copy memory objects made from one another, and 100k nested adaptors, do not crash;
- a DeviceBuffer keeps old allocations only while a DLPack tensor holds them;
- arrays are data, never sizes; a size's own `__index__` exception propagates unchanged;
- `__dlpack__(copy=True)` exports a host copy flagged as copied, for every object and device;
- DLPack errors name the real backend; `sys.getsizeof` counts the memory held.

Every test runs on every device lazybuf finds (the host device, PoCL's OpenCL device, wgpu on
lavapipe, and the CUDA driver test double's devices when it is loaded), and means the same on
each: nothing here relies on the host device's memory being host memory.
"""

import ctypes
import gc
import json
import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import lazybuf
import lazybuf.mr as mr
from conftest import run_python
from lazybuf import BufferState, DeviceBuffer, MemoryDevice, MemoryHost, MemoryShared, UnifiedBuffer

TITLES = {"host": "host", "opencl": "OpenCL", "cuda": "CUDA", "wgpu": "wgpu", "loopback": "loopback"}


def _devices():
    return lazybuf.get_accelerator().devices


@pytest.fixture(params=[d.selector for d in _devices()])
def device(request):
    return next(d for d in _devices() if d.selector == request.param)


def _kinds(device):
    """The memory object classes `device` has (wgpu: device memory only; shared memory where
    the device says it has it, `Device.shared_memory`: not NVIDIA's OpenCL, for one)."""
    if device.backend == "wgpu":
        return [MemoryDevice]
    return [MemoryDevice, MemoryHost] + ([MemoryShared] if device.shared_memory else [])


def _pattern(n, seed=0):
    return bytes((i * 31 + seed) % 256 for i in range(n))


def _run(code, *args, timeout=120):
    """Runs `code` in a fresh interpreter with `args`; a hang fails the test (timeout)."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "LAZYBUF_DEVICE": "host"},
    )


# 1. The default resource: one object per device; raw allocations live until deallocated.


def test_default_resource_is_one_object_per_device(device):
    first = mr.get_current_device_resource(device=device)
    assert mr.get_current_device_resource(device=device) is first
    gc.collect()
    assert mr.get_current_device_resource(device=device) is first


def test_raw_allocation_through_the_default_resource_lives_until_deallocated(device):
    ptr = mr.get_current_device_resource(device=device).allocate(4096, device=device)
    gc.collect()
    # The block is not handed out again (before the fix the collected wrapper freed it into
    # the pool, and the next allocation of that size got it).
    others = [MemoryDevice(4096, device=device) for _ in range(4)]
    assert all(m.ptr != ptr for m in others)
    # Given back through another call's object (the same one now).
    mr.get_current_device_resource(device=device).deallocate(ptr, 4096)
    with pytest.raises(ValueError, match="was not allocated by this resource"):
        mr.get_current_device_resource(device=device).deallocate(ptr, 4096)


def test_raw_allocations_outlive_a_collected_resource_object(device):
    stats = mr.StatisticsResourceAdaptor(mr.DirectMemoryResource())
    limited = mr.LimitingResourceAdaptor(stats, 1 << 30)
    ptr = limited.allocate(4096, device=device)
    assert ptr != 0
    del limited
    gc.collect()
    # Nothing can give it back any more, but it is not freed under its user.
    assert stats.allocation_counts.current_bytes == 4096
    assert stats.allocation_counts.current_count == 1


def test_deallocate_checks_the_resource(device):
    a = mr.StatisticsResourceAdaptor(mr.DirectMemoryResource())
    b = mr.StatisticsResourceAdaptor(mr.DirectMemoryResource())
    ptr = a.allocate(256, device=device)
    with pytest.raises(ValueError, match="was not allocated by this resource"):
        b.deallocate(ptr, 256)
    with pytest.raises(ValueError, match="allocated with nbytes=256, not 512"):
        a.deallocate(ptr, 512)
    a.deallocate(ptr, 256)
    assert a.allocation_counts.current_bytes == 0


# 4 and 12. Running out of host memory raises MemoryError.

_OOM = r"""
import json, pickle, re, resource, sys
import numpy as np
import lazybuf
from lazybuf import BufferState, DeviceBuffer, MemoryDevice, MemoryHost, MemoryShared, UnifiedBuffer

device = next(d for d in lazybuf.get_accelerator().devices if d.selector == sys.argv[1])
# Above glibc malloc's largest mmap threshold (32 MiB), so every block is mapped on its own and
# a freed one leaves the address space (a smaller one may reuse freed heap, under the limit).
N = 40 << 20
kinds = [MemoryDevice] if device.backend == "wgpu" else [MemoryDevice, MemoryHost]
kinds += [MemoryShared] if device.backend != "wgpu" and device.shared_memory else []

def touched(obj):
    # Written once: runtimes that allocate at first touch (PoCL) have allocated the memory
    # before the limit is set, so only lazybuf's own allocations meet the limit.
    if hasattr(obj, "memset"):
        obj.memset(1)
    else:
        obj.copy_from_host(np.ones(len(obj), dtype=np.uint8))
    return obj

def vm_bytes():
    with open("/proc/self/status") as f:
        return int(re.search(r"VmSize:\s+(\d+) kB", f.read()).group(1)) * 1024

cases = []
for kind in kinds:
    name = kind.__name__
    cases += [
        (f"{name}.tobytes", lambda k=kind: k(N, device=device), lambda m: m.tobytes()),
        (f"bytes({name})", lambda k=kind: k(N, device=device), lambda m: bytes(m)),
        (f"{name}.copy_to_host", lambda k=kind: k(N, device=device), lambda m: m.copy_to_host()),
        (f"pickle {name}", lambda k=kind: k(N, device=device), lambda m: pickle.dumps(m)),
        (f"{name} DLPack copy", lambda k=kind: k(N, device=device),
         lambda m: np.from_dlpack(m, device="cpu", copy=True)),
    ]
    if kind is not MemoryDevice:
        # A copy from a view of itself goes through a temporary copy.
        cases.append((f"{name}.copy_from_host(itself)", lambda k=kind: k(N, device=device),
                      lambda m: m.copy_from_host(memoryview(m))))
cases += [
    ("DeviceBuffer.tobytes", lambda: DeviceBuffer(size=N, device=device), lambda b: b.tobytes()),
    ("DeviceBuffer.copy_to_host", lambda: DeviceBuffer(size=N, device=device), lambda b: b.copy_to_host()),
    ("pickle DeviceBuffer", lambda: DeviceBuffer(size=N, device=device), lambda b: pickle.dumps(b)),
    ("DeviceBuffer DLPack copy", lambda: DeviceBuffer(size=N, device=device),
     lambda b: np.from_dlpack(b, device="cpu", copy=True)),
]

soft, hard = resource.getrlimit(resource.RLIMIT_AS)
results = {}
for name, make, action in cases:
    for headroom in (8 << 20, N + (8 << 20)):
        obj = touched(make())
        resource.setrlimit(resource.RLIMIT_AS, (vm_bytes() + headroom, hard))
        try:
            action(obj)
            outcome = "ok"
        except MemoryError:
            outcome = "MemoryError"
        except BaseException as err:
            outcome = f"{type(err).__name__}: {err}"
        finally:
            resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        del obj
        results[f"{name} (headroom {headroom >> 20} MiB)"] = outcome
print(json.dumps(results))
"""


def test_running_out_of_host_memory_raises_memory_error(device):
    """Each path that sizes host memory from the user, under an address-space limit just
    above what the process has mapped: MemoryError with little headroom; with room for one
    result (but not two), the result (the old code made a vector, then a second copy, and
    panicked or hung). Before the fix: SIGABRT ("memory allocation ... failed"), a
    PanicException, or a hang."""
    if not hasattr(__import__("resource"), "RLIMIT_AS") or not os.path.exists("/proc/self/status"):
        pytest.skip("needs RLIMIT_AS and /proc (Linux)")
    done = _run(_OOM, device.selector, timeout=300)
    assert done.returncode == 0, f"rc {done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}"
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert results, "no case ran"
    for case, outcome in results.items():
        if "(headroom 8 MiB)" in case:
            assert outcome == "MemoryError", f"{device.selector} {case}: {outcome}"
        else:
            assert outcome in ("ok", "MemoryError"), f"{device.selector} {case}: {outcome}"


# 6. Long chains.


def test_a_chain_of_zero_copy_memory_objects_does_not_nest(device):
    m = MemoryDevice(16, device=device)
    root = m
    for _ in range(10):
        m = MemoryDevice(m)
    assert m.reference_obj is root, "a zero-copy object references the root owner"
    assert m.ptr == root.ptr

    done = _run(
        """
        import sys, lazybuf
        device = next(d for d in lazybuf.get_accelerator().devices if d.selector == sys.argv[1])
        m = lazybuf.MemoryDevice(16, device=device)
        m.memset(7)
        for _ in range(100_000):
            m = lazybuf.MemoryDevice(m)
        assert m.tobytes() == bytes([7]) * 16
        del m
        print("done")
        """,
        device.selector,
    )
    assert done.returncode == 0 and done.stdout.strip() == "done", (done.returncode, done.stderr[-2000:])


def test_nested_adaptors_are_refused_beyond_the_limit_and_work_below_it(device):
    done = _run(
        """
        import sys, lazybuf, lazybuf.mr as mr
        device = next(d for d in lazybuf.get_accelerator().devices if d.selector == sys.argv[1])
        resource = mr.DirectMemoryResource()
        depth = 1
        deepest = None
        for _ in range(100_000):
            try:
                resource = mr.StatisticsResourceAdaptor(resource)
            except ValueError as err:
                assert "at most 256" in str(err), err
                break
            depth += 1
        print(depth)
        ptr = resource.allocate(64, device=device)
        resource.deallocate(ptr, 64)
        assert resource.allocation_counts.total_count == 1
        m = lazybuf.DeviceBuffer(size=64, device=device, mr=resource)
        del m, resource
        print("done")
        """,
        device.selector,
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.split() == ["256", "done"]


# 10. DeviceBuffer reallocation after addresses were handed out.


def _tracked_buffer(device, size):
    tracking = mr.TrackingResourceAdaptor(mr.DirectMemoryResource())
    return tracking, DeviceBuffer(size=size, device=device, mr=tracking)


def test_a_ptr_read_does_not_keep_old_allocations(device):
    tracking, db = _tracked_buffer(device, 1 << 16)
    assert db.ptr != 0
    for i in range(2, 42):
        db.resize(i << 16)
    assert tracking.get_allocated_bytes() == db.capacity() == 41 << 16
    del db
    gc.collect()
    assert tracking.get_allocated_bytes() == 0


class _Export:
    """Hands one DLPack capsule taken earlier to a consumer (lazybuf's copy_from_device)."""

    def __init__(self, capsule, dl_device):
        self.capsule, self.dl_device = capsule, dl_device

    def __dlpack__(self, **_):
        return self.capsule

    def __dlpack_device__(self):
        return self.dl_device


def _dlpack_device_or_skip(db):
    try:
        return db.__dlpack_device__()
    except BufferError as err:
        pytest.skip(f"no zero-copy DLPack export on this device ({err})")


def test_dlpack_exports_hold_their_allocation_only_while_they_live(device):
    tracking, db = _tracked_buffer(device, 4096)
    dl_device = _dlpack_device_or_skip(db)
    db.copy_from_host(_pattern(4096))

    # A dropped export keeps nothing.
    capsule = db.__dlpack__(max_version=(1, 0), dl_device=dl_device)
    del capsule
    for i in range(2, 12):
        db.resize(i << 12)
    assert tracking.get_allocated_bytes() == db.capacity()

    # A live export keeps its allocation valid through reallocations, until it is consumed.
    db.resize(4096)
    db.shrink_to_fit()
    db.copy_from_host(_pattern(4096, seed=3))
    capsule = db.__dlpack__(max_version=(1, 0), dl_device=dl_device)
    for i in range(2, 12):
        db.resize(i << 12)
    db.copy_from_host(bytes(db.size))  # the new allocation changes, the held one does not
    assert tracking.get_allocated_bytes() == db.capacity() + 4096
    out = DeviceBuffer(size=4096, device=device)
    out.copy_from_device(_Export(capsule, dl_device))
    assert out.tobytes() == _pattern(4096, seed=3)
    del capsule
    gc.collect()
    assert tracking.get_allocated_bytes() == db.capacity(), "the consumed export let go of it"


# 13 and 14. Sizes and sources.


def test_an_array_is_a_source_not_a_size(device):
    data = np.arange(64, dtype=np.uint8)
    for kind in _kinds(device):
        m = kind(data, copy=True, device=device)
        assert m.nbytes == 64 and m.tobytes() == data.tobytes()
        # A 0-d integer array is 8 bytes of data, not a size of 4096.
        zero_d = kind(np.array(4096, dtype=np.int64), copy=True, device=device)
        assert zero_d.nbytes == 8 and zero_d.tobytes() == np.array(4096, dtype=np.int64).tobytes()
        with pytest.raises(ValueError, match="copy=True"):
            kind(np.array(4096), device=device)
        # NumPy integer scalars are sizes.
        assert kind(np.int64(48), device=device).nbytes == 48
        assert kind(np.uint16(16), device=device).nbytes == 16


def test_arrays_are_refused_as_sizes(device):
    db = DeviceBuffer(size=8, device=device)
    for array in (np.array(16), np.arange(3)):
        with pytest.raises(TypeError, match="arrays are data, not sizes"):
            DeviceBuffer(size=array, device=device)
        with pytest.raises(TypeError, match="arrays are data, not sizes"):
            db.resize(array)
        with pytest.raises(TypeError, match="arrays are data, not sizes"):
            db.reserve(array)
        with pytest.raises(TypeError, match="arrays are data, not sizes"):
            mr.DirectMemoryResource().allocate(array, device=device)
    assert db.size == 8
    db.resize(np.int32(32))
    assert db.size == 32
    with pytest.raises(TypeError, match="must be an int"):
        db.resize(3.0)


class _Boom(Exception):
    pass


class _Index:
    def __init__(self, error):
        self.error = error

    def __index__(self):
        raise self.error


@pytest.mark.parametrize("error", [_Boom("from __index__"), KeyboardInterrupt(), RecursionError("deep")])
def test_exceptions_from_index_propagate_unchanged(device, error):
    db = DeviceBuffer(size=8, device=device)
    calls = [
        lambda: MemoryDevice(_Index(error), device=device),
        lambda: DeviceBuffer(size=_Index(error), device=device),
        lambda: db.resize(_Index(error)),
        lambda: db.reserve(_Index(error)),
        lambda: mr.DirectMemoryResource().allocate(_Index(error), device=device),
    ]
    for call in calls:
        with pytest.raises(type(error)) as raised:
            call()
        assert raised.value is error
    with pytest.raises(_Boom):
        bytearray(_Index(_Boom()))  # the behaviour matched
    assert db.size == 8


# 16. __dlpack__(copy=True).

_IS_COPIED = 1 << 1


def _versioned_flags(capsule):
    """The `flags` of a DLManagedTensorVersioned capsule (version, manager_ctx, deleter come
    first: 8 + 8 + 8 bytes)."""
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    address = get(capsule, b"dltensor_versioned")
    return ctypes.c_uint64.from_address(address + 24).value


def _objects(device):
    """Every kind of lazybuf object on `device`, each holding _pattern(64)."""
    objects = []
    for kind in _kinds(device):
        m = kind(64, device=device)
        m.copy_from_host(_pattern(64))
        objects.append(m)
    db = DeviceBuffer(size=64, device=device)
    db.copy_from_host(_pattern(64))
    ub = UnifiedBuffer(64, np.uint8, device=device)
    ub.copy_from(np.frombuffer(_pattern(64), dtype=np.uint8))
    return objects + [db, ub]


def test_dlpack_copy_is_a_flagged_host_copy(device):
    for obj in _objects(device):
        name = type(obj).__name__
        copy = np.from_dlpack(obj, device="cpu", copy=True)
        assert copy.tobytes() == _pattern(64), name
        copy[:] = 0  # a copy: the object keeps its bytes
        data = obj.to_numpy().tobytes() if isinstance(obj, UnifiedBuffer) else obj.tobytes()
        assert data == _pattern(64), name
        capsule = obj.__dlpack__(max_version=(1, 0), dl_device=(1, 0), copy=True)
        assert _versioned_flags(capsule) & _IS_COPIED, name
        legacy = obj.__dlpack__(dl_device=(1, 0), copy=True)
        assert "dltensor" in repr(legacy), name
        with pytest.raises(BufferError, match=r"\(2, 0\)"):
            obj.__dlpack__(max_version=(1, 0), dl_device=(2, 0), copy=True)


def test_dlpack_copy_without_dl_device_copies_on_the_objects_own_device_or_says_what_to_pass(device):
    """A hostile pass (2026-11-27): `copy=True` without `dl_device` on CUDA objects was refused
    naming a device "asked for" that nobody asked for. DLPack reads it as a copy on the
    object's own device: the host copy where that is the CPU, else a refusal that says to pass
    dl_device=(1, 0)."""
    for obj in _objects(device):
        name = type(obj).__name__
        try:
            own = obj.__dlpack_device__()
        except (BufferError, ValueError):
            own = None  # memory with no DLPack device of its own: its copy goes to the CPU
        if own is None or own[0] == 1:
            capsule = obj.__dlpack__(max_version=(1, 0), copy=True)
            assert _versioned_flags(capsule) & _IS_COPIED, name
            continue
        with pytest.raises(BufferError, match=r"without dl_device .* pass dl_device=\(1, 0\)") as raised:
            obj.__dlpack__(max_version=(1, 0), copy=True)
        assert "was asked for" not in str(raised.value), name


def test_zero_copy_dlpack_exports_are_not_flagged_as_copies(device):
    for obj in _objects(device):
        try:
            dl_device = obj.__dlpack_device__()
        except BufferError:
            continue  # device memory DLPack has no device for (tested below)
        capsule = obj.__dlpack__(max_version=(1, 0), dl_device=dl_device)
        assert _versioned_flags(capsule) & _IS_COPIED == 0, type(obj).__name__


# 17. DLPack errors name the backend.


def test_dlpack_errors_name_the_backend(device):
    for obj in (MemoryDevice(16, device=device), DeviceBuffer(size=16, device=device)):
        try:
            obj.__dlpack_device__()
        except BufferError as err:
            assert f"{TITLES[device.backend]} device memory" in str(err), err
            with pytest.raises(BufferError, match=f"{TITLES[device.backend]} device memory"):
                obj.__dlpack__()
        else:
            obj.__dlpack__()  # exportable: no error to name anything


# 18. sys.getsizeof counts the memory held.


def test_getsizeof_counts_the_memory_held(device):
    n = 1 << 20
    for kind in _kinds(device):
        assert sys.getsizeof(kind(n, device=device)) >= n
    db = DeviceBuffer(size=0, device=device)
    small = sys.getsizeof(db)
    db.reserve(n)
    assert sys.getsizeof(db) >= small + n, "the capacity is memory held"
    ub = UnifiedBuffer(n, np.uint8, device=device)
    assert sys.getsizeof(ub) < n, "nothing is allocated yet"
    ub.host[:] = 1
    assert sys.getsizeof(ub) >= n
    ub.sync_to_device()
    assert sys.getsizeof(ub) >= n


# 18. A UnifiedBuffer as the source of a memory-object copy is read, never written.


@pytest.mark.parametrize("dirty_on", ["host", "device"])
def test_a_unified_buffer_source_is_read_in_place_and_a_refused_copy_changes_nothing(device, dirty_on):
    """A hostile pass (2026-11-27): a CUDA UnifiedBuffer given to a memory object or
    `DeviceBuffer.copy_from_device` was probed through its `__cuda_array_interface__`, a device
    write: uploaded, made DEVICE_DIRTY and its host views made read-only, also by calls that
    then failed. It is read where it is current now (through a staging copy on wgpu, which
    cannot borrow its own memory), and a refused call reads nothing."""
    values = np.arange(16, dtype=np.float32)
    u = UnifiedBuffer(16, np.float32, device=device)
    u.copy_from(values)
    if dirty_on == "device":
        u.sync_to_device()
        u.mark_device_dirty()  # the device copy is the current one (same bytes)
    view = u.host_readonly if dirty_on == "host" else None
    before = (u.state, u.transfer_stats())
    refused = [
        lambda: MemoryDevice(u),  # zero-copy from a buffer: refused
        lambda: DeviceBuffer(size=4, device=device).copy_from_device(u),  # too large
    ]
    for call in refused:
        with pytest.raises(ValueError):
            call()
        assert (u.state, u.transfer_stats()) == before
    with lazybuf.trace.record() as rec:
        copies = [kind(u, copy=True, device=device).tobytes() for kind in _kinds(device)]
        db = DeviceBuffer(size=64, device=device)
        db.copy_from_device(u)
    copies.append(db.tobytes())
    for copy in copies:
        assert copy == values.tobytes()
    # A read in place moves nothing; a staged one (wgpu) is the buffer's own download into
    # outside memory, as to_numpy()'s: recorded and counted (the twentieth hostile pass), and
    # it changes no state either.
    downloads = [e for e in rec.trace.events() if e["kind"] == "transfer" and e["buffer"] == u.buffer_id]
    assert all(e["direction"] == "d2h" for e in downloads), downloads
    stats = dict(before[1])
    stats["device_to_host_copies"] += len(downloads)
    stats["device_to_host_bytes"] += sum(e["bytes"] for e in downloads)
    assert (u.state, u.transfer_stats()) == (before[0], stats), "a read moves only what is recorded"
    if view is not None:
        np.testing.assert_array_equal(view, values)
    np.testing.assert_array_equal(u.to_numpy(), values)


# A hostile pass (objects, 9th): each test failed before its fix.


def _interfaces(device):
    """The interfaces that hand out a raw address of a UnifiedBuffer on `device`."""
    return ["__array_interface__"] + (["__cuda_array_interface__"] if device.backend == "cuda" else [])


def test_free_after_an_interface_export_keeps_memory_bounded(device):
    """`free()` after `__array_interface__`/`__cuda_array_interface__` kept every batch's
    memory until the buffer object died (a consumer holds the object and a raw address, so the
    memory cannot be given back): a loop reusing one buffer grew without bound. The exported
    memory is now the buffer's own for its next batch, its contents forgotten."""
    stats = mr.StatisticsResourceAdaptor(mr.DirectMemoryResource())
    mr.set_current_device_resource(stats, device=device)
    try:
        buf = UnifiedBuffer((1 << 16,), np.float32, device=device)
        for batch in range(1, 21):
            buf.fill(batch)
            for name in _interfaces(device):
                getattr(buf, name)
            buf.free()
            assert buf.state == BufferState.UNINITIALIZED
            assert not buf.to_numpy().any(), "the contents are gone: a read sees zeros"
        counts = stats.allocation_counts
        assert counts.current_bytes <= 2 * buf.nbytes, counts.current_bytes
        assert buf.transfer_stats()["host_to_device_bytes"] == 0, "the counters start over"
        del buf
        gc.collect()
        assert stats.allocation_counts.current_count == 0, "the object gone, its memory goes"
    finally:
        mr.set_current_device_resource(None, device=device)


def test_free_keeps_memory_a_view_holds_and_reuses_it_once_the_view_is_gone(device):
    stats = mr.StatisticsResourceAdaptor(mr.DirectMemoryResource())
    mr.set_current_device_resource(stats, device=device)
    try:
        buf = UnifiedBuffer((1 << 16,), np.float32, device=device)
        for batch in range(1, 21):
            buf.fill(batch)
            view = buf.host_readonly  # the previous batch's view goes here
            buf.__array_interface__  # noqa: B018
            buf.free()
            buf.fill(-1)
            np.testing.assert_array_equal(view, batch)  # its memory was not reused
        assert stats.allocation_counts.current_bytes <= 4 * buf.nbytes
    finally:
        mr.set_current_device_resource(None, device=device)


@pytest.mark.parametrize("mark", ["mark_device_dirty", "mark_host_dirty"])
def test_marking_a_buffer_that_holds_no_data_dirty_gives_zeros(device, mark):
    """An UNINITIALIZED buffer marked dirty took a cached block as it was and marked it valid:
    a read then returned an earlier buffer's bytes (CONTRACT.md: a read of a buffer that holds
    no data sees zeros). The zero-fill moves no bytes."""
    expected = BufferState.DEVICE_ONLY if mark == "mark_device_dirty" else BufferState.HOST_ONLY
    for _ in range(3):
        old = UnifiedBuffer((1031,), np.int32, device=device)
        old.copy_from(np.full(1031, 0x5A5A5A5A, np.int32))
        old.sync_to_device()
        del old  # both blocks go back to the cache
        buf = UnifiedBuffer((1031,), np.int32, device=device)
        getattr(buf, mark)()
        assert buf.state == expected
        stats = buf.transfer_stats()
        assert stats["host_to_device_bytes"] == stats["device_to_host_bytes"] == 0, stats
        assert not buf.to_numpy().any(), "an earlier buffer's bytes"


def test_a_refused_cuda_array_interface_changes_nothing(device):
    """On CUDA, `__cuda_array_interface__` of a bfloat16 buffer (no type string) uploaded and
    marked the buffer DEVICE_DIRTY before it failed, so `hasattr` froze the host views."""
    pytest.importorskip("ml_dtypes")
    buf = UnifiedBuffer((4,), "bfloat16", device=device)
    view = buf.host
    view[:] = 1
    before = (buf.state, buf.transfer_stats())
    assert not hasattr(buf, "__cuda_array_interface__")
    assert (buf.state, buf.transfer_stats()) == before
    view[0] = 2  # still writable


class _LegacyProducer:
    """A DLPack producer from before DLPack 1.0: `__dlpack__` takes only `stream`."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, stream=None):
        return self.array.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


def test_producers_from_before_dlpack_1_are_imported(device):
    data = np.frombuffer(_pattern(16), dtype=np.uint8).copy()  # writable: legacy DLPack has no read-only flag
    source = _LegacyProducer(data)
    for kind in _kinds(device):
        m = kind(16, device=device)
        m.copy_from_device(source)
        assert m.tobytes() == _pattern(16)
        assert kind(source, copy=True, device=device).tobytes() == _pattern(16)
    db = DeviceBuffer(size=16, device=device)
    db.copy_from_device(source)
    assert db.tobytes() == _pattern(16)


def test_dlpack_to_the_cpu_without_copy_exports_a_host_copy_where_needed(device):
    """`numpy.from_dlpack(obj, device="cpu")` passes copy=None, which lets the producer copy:
    memory objects and DeviceBuffer off the CPU refused it (UnifiedBuffer did not)."""
    for obj in _objects(device):
        name = type(obj).__name__
        assert np.from_dlpack(obj, device="cpu").tobytes() == _pattern(64), name
        capsule = obj.__dlpack__(max_version=(1, 0), dl_device=(1, 0))
        try:
            own = obj.__dlpack_device__()
        except BufferError:
            own = None
        if not isinstance(obj, UnifiedBuffer):
            # A copy exactly where the memory is not the CPU's, flagged as one.
            assert bool(_versioned_flags(capsule) & _IS_COPIED) == (own != (1, 0)), name


def test_memory_objects_say_what_they_expected_with_a_type_error(device):
    for kind in _kinds(device):
        for bad in (None, "16", 16.0, True, object()):
            with pytest.raises(TypeError, match=r"expected a number of bytes \(an int\) or a memory object") as raised:
                kind(bad, device=device)
            assert str(raised.value).count("expected") == 1, raised.value
    with pytest.raises(TypeError, match="a bool is not a size"):
        MemoryDevice(True, device=device)
    with pytest.raises(TypeError, match="a bool is not a size"):
        DeviceBuffer(size=True, device=device)
    db = DeviceBuffer(size=4, device=device)
    for call in (db.resize, db.reserve):
        with pytest.raises(TypeError, match="a bool is not a size"):
            call(True)
    assert (db.size, db.capacity()) == (4, 4)


def test_getsizeof_counts_shared_memory_once(device):
    n = 1 << 20
    for kind in _kinds(device):
        owner = kind(n, device=device)
        views = [kind(owner) for _ in range(3)]
        assert sys.getsizeof(owner) >= n
        assert sum(map(sys.getsizeof, views)) < n, "zero-copy objects hold no memory of their own"


class _ReturnsAnInt:
    def __dlpack__(self, **_):
        return 5

    def __dlpack_device__(self):
        return (1, 0)


def test_dlpack_arguments_are_checked(device):
    """`__dlpack__` took any `stream` on CUDA (0, which DLPack forbids there, a str, 2**70), and
    a producer returning an int was reported as a capsule with neither ABI."""
    for obj in _objects(device):
        name = type(obj).__name__
        with pytest.raises(TypeError, match="stream must be None, -1"):
            obj.__dlpack__(stream="not a stream")
        with pytest.raises(TypeError, match="stream must be None, -1"):
            obj.__dlpack__(stream=True)
        with pytest.raises(ValueError, match="out of range"):
            obj.__dlpack__(stream=2**70)
        # 0: "must be None" for the CPU, forbidden by DLPack for CUDA; never taken.
        with pytest.raises(ValueError, match="stream"):
            obj.__dlpack__(stream=0)
        assert obj.__dlpack__(dl_device=(1, 0), copy=True) is not None, name
    with pytest.raises(TypeError, match=r"returned int 5, not a DLPack capsule"):
        DeviceBuffer(size=8, device=device).copy_from_device(_ReturnsAnInt())


def test_fill_and_a_first_state_work_in_a_finalizer_late_in_shutdown():
    # A finalizer of an object kept in sys.modules runs after sys.meta_path is cleared, when
    # imports fail: `fill` imported NumPy on every call and a buffer's first `state` imported
    # lazybuf._state, both ImportErrors there.
    result = run_python(
        """
        import sys, numpy as np, lazybuf
        filled = lazybuf.UnifiedBuffer((16,), dtype=np.float32)
        fresh = lazybuf.UnifiedBuffer((16,), dtype=np.float32)
        class Late:
            def __del__(self):
                for name, f in [("fill", lambda: filled.fill(2)), ("state", lambda: fresh.state),
                                ("values", lambda: float(filled.to_numpy()[3]))]:
                    try:
                        print(name, "ok", f())
                    except BaseException as e:
                        print(name, type(e).__name__, e)
        sys.modules["__late__"] = Late()
        """
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert any(line.startswith("fill ok UnifiedBuffer(") for line in lines), result.stdout
    assert "state ok UNINITIALIZED" in lines, result.stdout
    assert "values ok 2.0" in lines, result.stdout
