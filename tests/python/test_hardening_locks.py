"""An object whose allocation is in progress, used by everything that can run meanwhile.

A memory resource's failure callback runs Python code from inside an allocation, while the
allocating call holds the object it allocates for. From there, and from a finalizer that the
callback's ``gc.collect()`` runs, and from any other thread, every method of that object must
give a result or a clear error (``lazybuf.ReentrancyError`` on the allocating thread), never a
hang: the binding's lock (crates/lazybuf-py/src/lock.rs) is never waited for with the GIL held,
nor by the thread that holds it.

The same for a ``DeviceBuffer`` whose resize allocates through the callback (reading its
``size`` there raises ``ReentrancyError``; other threads wait and then see the new size).

Each scenario runs in a fresh interpreter with a timeout, so a regression fails instead of
hanging the suite. The tables below must name every public method: a new method without a
row fails ``test_the_tables_name_every_method``.

Also here: a host read of a buffer on a zero-copy device (PoCL from 4 MiB) while a kernel that
writes its device copy without ``mark_device_dirty()`` runs is never torn, with and without
the coherence checker; and the checker's own copy of a large device buffer raises
``MemoryError`` when memory runs out, instead of aborting.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

import lazybuf
from conftest import run_python

# Every public method and property of UnifiedBuffer, called on a buffer (`b`) of 16384 uint8.
# `None`: not called (it needs something the scenario does not have) with the reason.
UNIFIED_CALLS: dict[str, str | None] = {
    "host": "b.host",
    "host_readonly": "b.host_readonly",
    "device": "b.device",
    "device_writable": "b.device_writable",
    "metal": "b.metal",
    "shape": "b.shape",
    "dtype": "b.dtype",
    "nbytes": "b.nbytes",
    "size": "b.size",
    "ndim": "b.ndim",
    "state": "b.state",
    "pinned": "b.pinned",
    "spillable": "b.spillable",
    "is_pinned": "b.is_pinned",
    "device_handle": "b.device_handle",
    "released": "b.released",
    "sync_to_device": "b.sync_to_device()",
    "sync_to_host": "b.sync_to_host()",
    "sync_to_device_async": "b.sync_to_device_async().wait()",
    "sync_to_host_async": "b.sync_to_host_async().wait()",
    "stream": "b.stream",
    "order_after": None,  # needs a stream of the device's runtime
    "mark_host_dirty": "b.mark_host_dirty()",
    "mark_device_dirty": "b.mark_device_dirty()",
    "mark_metal_dirty": "b.mark_metal_dirty()",
    "fill": "b.fill(3)",
    "allocate": "b.allocate()",
    "free": "b.free()",
    "is_allocated": "b.is_allocated",
    "zeros": "b.zeros()",
    "copy_to": "b.copy_to(np.empty(b.shape, b.dtype))",
    "synchronize": "b.synchronize()",
    "ensure_on_device": "b.ensure_on_device().close()",
    "ensure_on_host": "b.ensure_on_host().close()",
    "copy_from": "b.copy_from(np.ones(b.shape, b.dtype))",
    "to_numpy": "b.to_numpy()",
    "transfer_stats": "b.transfer_stats()",
    "buffer_id": "b.buffer_id",
    "release": None,  # ends the buffer: covered by `free`, which keeps it usable
    "__getitem__": "b[0]",
    "__setitem__": "b.__setitem__(0, 1)",
    "__delitem__": "b.__delitem__(0)",
    "__len__": "len(b)",
    "__repr__": "repr(b)",
    "__array__": "np.asarray(b)",
    "__array_interface__": "b.__array_interface__",
    "__cuda_array_interface__": "b.__cuda_array_interface__",
    "__dlpack__": "b.__dlpack__()",
    "__dlpack_device__": "b.__dlpack_device__()",
    "__reduce__": "b.__reduce__()",
    "__reduce_ex__": "pickle.dumps(b, protocol=5)",
    "__sizeof__": "sys.getsizeof(b)",
    "memoryview": "memoryview(b)",
}

# Every public method and property of DeviceBuffer, called on a buffer (`b`) being resized.
DEVICE_BUFFER_CALLS: dict[str, str | None] = {
    "buffer_id": "b.buffer_id",
    "capacity": "b.capacity()",
    "copy": "b.copy()",
    "copy_from_device": "b.copy_from_device(lazybuf.DeviceBuffer(size=16, device=device))",
    "copy_from_host": "b.copy_from_host(bytes(16))",
    "copy_to_host": "b.copy_to_host()",
    "device": "b.device",
    "nbytes": "b.nbytes",
    "ptr": "b.ptr",
    "reserve": "b.reserve(8192)",
    "resize": "b.resize(64)",
    "shrink_to_fit": "b.shrink_to_fit()",
    "size": "b.size",
    "to_device": "lazybuf.DeviceBuffer.to_device(bytes(8), device=device)",
    "tobytes": "b.tobytes()",
    "__repr__": "repr(b)",
    "__len__": "len(b)",
    "__sizeof__": "sys.getsizeof(b)",
    "__bytes__": "bytes(b)",
    "__copy__": "copy.copy(b)",
    "__deepcopy__": "copy.deepcopy(b)",
    "__dlpack__": "b.__dlpack__()",
    "__dlpack_device__": "b.__dlpack_device__()",
    "__reduce__": "pickle.dumps(b)",
    "__cuda_array_interface__": "b.__cuda_array_interface__",
}

# Methods every Python object has, or that make no sense on a live buffer.
# `__buffer__` and `__release_buffer__`: the buffer protocol's slots as Python 3.12 shows them
# (PEP 688); the table's "memoryview" entry is that protocol.
NOT_METHODS = {
    "__class_getitem__", "__enter__", "__exit__", "__init__", "__module__", "__new__",
    "__buffer__", "__release_buffer__",
}

SCENARIO = """
import copy, gc, pickle, sys, threading
import numpy as np
import lazybuf
import lazybuf.mr as lmr

device = {device!r}
CALLS = {calls!r}
HELD = (1 << 20) - 8192
limit = lmr.LimitingResourceAdaptor(lmr.DirectMemoryResource(), 1 << 20)
held = [limit.allocate(HELD, device=device)]
outcomes = {{}}
threads = []
b = None
names = {{"np": np, "pickle": pickle, "sys": sys, "copy": copy, "lazybuf": lazybuf, "device": device}}

def call(name, where):
    try:
        exec(CALLS[name], {{**names, "b": b}})
        outcomes[(name, where)] = "ok"
    except lazybuf.ReentrancyError as err:
        assert where != "thread", f"{{name}} raised ReentrancyError on another thread"
        assert "in use by an operation in progress" in str(err), err
        outcomes[(name, where)] = "reentrancy"
    except Exception as err:  # a clear error of another kind is allowed (e.g. .metal)
        outcomes[(name, where)] = type(err).__name__

class Finalized:
    def __init__(self):
        self.cycle = self
    def __del__(self):
        for name in CALLS:
            call(name, "finalizer")

callbacks = []

def callback(nbytes):
    callbacks.append((nbytes, len(held)))
    if held:
        Finalized()
        gc.collect()
        for name in CALLS:
            call(name, "callback")
        for name in CALLS:
            t = threading.Thread(target=call, args=(name, "thread"), daemon=True)
            t.start()
            threads.append(t)
        limit.deallocate(held.pop(), HELD)
        return True
    return False

mr = lmr.FailureCallbackResourceAdaptor(limit, callback)
{allocate}
for t in threads:
    t.join(60)
    assert not t.is_alive(), "a thread is still waiting"
for where in ("callback", "finalizer", "thread"):
    missing = [n for n in CALLS if (n, where) not in outcomes]
    assert not missing, (where, missing, "callbacks (bytes, held):", callbacks, limit.get_allocated_bytes())
for where in ("callback", "finalizer"):
    assert outcomes[({reentrant!r}, where)] == "reentrancy", outcomes
print("DONE", sorted(set(outcomes.values())))
"""

# What allocates through the callback, and a method that must raise ReentrancyError there.
UNIFIED_ALLOCATION = """
lmr.set_current_device_resource(mr, device=device)
b = lazybuf.UnifiedBuffer((16384,), np.uint8, device=device)  # more than the limit leaves
host = b.host  # allocates through the callback
try:
    host[:] = 7
except ValueError:
    pass  # another thread made the host copy stale meanwhile: the view was made read-only
"""
DEVICE_BUFFER_ALLOCATION = """
b = lazybuf.DeviceBuffer(size=16, device=device, mr=mr)
b.resize(64 << 10)  # grows through the callback
"""


def _devices() -> list[str]:
    found = ["host"]
    for d in lazybuf.get_accelerator().devices:
        if d.backend in ("opencl", "wgpu", "cuda") and d.backend not in found:
            found.append(d.backend)
    return found


@pytest.mark.parametrize(
    ("cls", "table"), [(lazybuf.UnifiedBuffer, UNIFIED_CALLS), (lazybuf.DeviceBuffer, DEVICE_BUFFER_CALLS)]
)
def test_the_tables_name_every_method(cls, table):
    public = {n for n in dir(cls) if not n.startswith("_")}
    dunder = {n for n in vars(cls) if n.startswith("__") and n not in NOT_METHODS | {"__doc__"}}
    dunder -= set(dir(object)) - {"__repr__", "__reduce__", "__reduce_ex__", "__sizeof__"}
    missing = (public | dunder) - set(table)
    assert not missing, f"add these to the table of {cls.__name__}: {sorted(missing)}"


@pytest.mark.parametrize("device", _devices())
def test_every_device_buffer_method_during_a_resize_in_a_failure_callback(device):
    calls = {name: code for name, code in DEVICE_BUFFER_CALLS.items() if code is not None}
    code = SCENARIO.format(device=device, calls=calls, allocate=DEVICE_BUFFER_ALLOCATION, reentrant="size")
    result = run_python(code)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "DONE" in result.stdout, result.stdout + result.stderr


@pytest.mark.parametrize("device", _devices())
def test_every_method_during_an_allocation_in_a_failure_callback(device):
    calls = {name: code for name, code in UNIFIED_CALLS.items() if code is not None}
    result = run_python(SCENARIO.format(device=device, calls=calls, allocate=UNIFIED_ALLOCATION, reentrant="state"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "DONE" in result.stdout, result.stdout + result.stderr


ZERO_COPY_KERNEL = """
__kernel void slow_fill(__global float* x, const float value, const int rounds) {
    size_t i = get_global_id(0);
    float acc = x[i];
    for (int r = 0; r < rounds; r++) {
        acc = acc * 0.5f + value * 0.5f;
    }
    x[i] = value + (acc - acc);
}
"""


@pytest.mark.parametrize("check", [False, True])
@pytest.mark.parametrize("read", ["to_numpy", "host_readonly", "array"])
def test_a_host_read_during_an_undeclared_kernel_write_is_never_torn(opencl_device, pyopencl, check, read):
    cl = pyopencl
    n = 2 << 20  # 8 MiB of float32: PoCL aliases host memory from 4 MiB
    buf = lazybuf.UnifiedBuffer((n,), np.float32, device=opencl_device)
    buf.host[:] = 1.0
    arr = buf.device  # a device *read*: the kernel's write below is not declared
    program = cl.Program(arr.context, ZERO_COPY_KERNEL).build()
    was = lazybuf.checking()
    lazybuf.set_checking(check)
    try:
        program.slow_fill(arr.queue, (n,), None, arr.data, np.float32(7.0), np.int32(1000))
        try:
            if read == "to_numpy":
                seen = buf.to_numpy()
            elif read == "host_readonly":
                seen = buf.host_readonly.copy()
            else:
                seen = np.array(buf, copy=True)
        except lazybuf.CoherenceError:
            # Only where the device copy is a memory of its own: the checker compared them.
            assert check and not opencl_device.shares_host_memory, "the checker is off, or the copy is aliased"
            return
        finally:
            arr.queue.finish()
    finally:
        lazybuf.set_checking(was)
    new, old = bool((seen == 7.0).all()), bool((seen == 1.0).all())
    assert new or old, f"a torn read: {np.count_nonzero(seen == 7.0)} of {n} elements written"
    if opencl_device.shares_host_memory:
        # PoCL's CPU device: the device copy is the host block from 4 MiB.
        assert new, "the read waited for the kernel"


def test_the_checkers_copy_of_a_large_buffer_raises_memory_error_when_memory_runs_out():
    devices = [d for d in lazybuf.get_accelerator().devices if d.backend in ("wgpu", "opencl", "cuda")]
    if not devices:
        pytest.skip("needs a device whose copy is not the host block")
    for device in devices:
        code = textwrap.dedent(
            f"""
            import re, resource
            import numpy as np
            import lazybuf
            device = {device.selector!r}
            # 3 MiB: a device copy of its own on every device (PoCL aliases from 4 MiB).
            b = lazybuf.UnifiedBuffer((3 << 20,), np.uint8, device=device)
            b.host[:] = 1
            b.sync_to_device()
            b.device  # handed out: a host read with the checker on compares the copies
            lazybuf.set_checking(True)
            vm = int(re.search(r"VmSize:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) * 1024
            resource.setrlimit(resource.RLIMIT_AS, (vm + (1 << 20), resource.RLIM_INFINITY))
            try:
                b.host_readonly
                print("NO-ERROR")
            except MemoryError as err:
                print("MemoryError:", err)
            """
        )
        result = run_python(code)
        assert result.returncode == 0, f"{device.selector}: " + result.stdout + result.stderr
        assert "MemoryError: out of memory" in result.stdout, f"{device.selector}: " + result.stdout + result.stderr


def test_replacing_the_current_resource_runs_finalizers_outside_its_lock():
    """Found by a lock audit (2026-11-27): the replaced current resource was released with the
    lock of the current resources held, so its finalizers ran under it. A finalizer that
    released the GIL (here: a failure callback's last reference, whose ``__del__`` sleeps) let
    another thread wait for that lock with the GIL held: both waited forever."""
    result = run_python(
        """
        import faulthandler, sys, threading, time
        import lazybuf.mr as mr
        faulthandler.dump_traceback_later(30, exit=True)  # a deadlock exits with status 1

        finalizing = threading.Event()

        class Slow:
            def __del__(self):
                finalizing.set()
                time.sleep(0.5)  # releases the GIL inside the replacement
                print("finalized", flush=True)

        def adaptor():
            slow = Slow()
            return mr.FailureCallbackResourceAdaptor(mr.DirectMemoryResource(), lambda n, s=slow: False)

        mr.set_current_device_resource(adaptor())
        seen = []
        def reader():
            # While the replaced resource's finalizer runs (a sleep could end before the
            # replacement began, on a loaded machine, and read the old resource).
            finalizing.wait(30)
            seen.append(mr.get_current_device_resource())
        thread = threading.Thread(target=reader)
        thread.start()
        replacement = mr.DirectMemoryResource()
        mr.set_current_device_resource(replacement)
        thread.join()
        assert seen and seen[0] is replacement, seen
        print("DONE")
        """
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "finalized" in result.stdout and "DONE" in result.stdout, result.stdout + result.stderr
