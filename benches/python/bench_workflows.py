"""The seeds' own workflows, end to end: lazybuf against PyDotCompute 0.2.0 and against the
same work written by hand with the device's own Python library, in one process.

Workflows (one timed call = one batch; ``kernel`` is ``d *= 3`` on the device array, and
``d *= -1`` in read-modify-write, whose data persists from batch to batch and must not
overflow):
- ``batch, new buffer``: a new buffer per batch: construct, host write, ``.device``, kernel,
  ``mark_device_dirty()``, ``to_numpy()`` (the seeds' batch-processing loop);
- ``batch, pool``: the same with a buffer acquired from and released to the memory pool;
- ``read-modify-write``: one buffer, a host read-modify-write then a kernel, every batch (both
  directions move every time);
- ``double buffering``: two buffers; the host fills one and starts its upload
  (``sync_to_device_async``) while the other is processed and read back; lazybuf's host write
  is ``buf.host[:] = x`` (``.host`` syncs the stale host copy first: it cannot know the array
  will be overwritten), and again as ``buf[:] = x`` (an assignment to every element, which
  syncs nothing first); on CUDA once more with the kernel, mark and read-back on a
  non-blocking CuPy stream (``double buffering, kernels on a CuPy stream``), where they need not
  wait for the other buffer's upload.

Peers, each doing the same bytes of work:
- PyDotCompute 0.2.0 as published (it has no ``to_numpy``: ``b.host.copy()``; no pool acquire:
  that row is empty); on a machine without CUDA its "device" is host memory;
- by hand on OpenCL (PyOpenCL, lazybuf's device): one reused host array and one reused device
  array (``set``, kernel, ``get(ary=out)``): the fastest way to write it;
- by hand on CUDA (CuPy): pinned host arrays (``cupyx.empty_pinned``) and one device array from
  CuPy's default pool, reused (``set``, kernel, ``get(out=)``).

Method as in bench_vs_pydotcompute.py: each case is calibrated to at least 2 ms a repetition,
cases of a row run interleaved repetition by repetition, the median per call is reported.

Usage: python bench_workflows.py [--device SELECTOR] [--reps N] [--sizes 4KiB,4MiB,64MiB] [--min-ms MS]
"""

import argparse
import platform
import sys
import timeit
from importlib.metadata import version

import numpy as np

import lazybuf
from harness import fmt, run_row

SIZES = {"4 KiB": 4 << 10, "4 MiB": 4 << 20, "64 MiB": 64 << 20}
# Double buffering with lazybuf's host write as `buf[:] = x` instead of `buf.host[:] = x`: the
# peers' row is their double buffering (they have one way to write it).
OVERWRITE = "double buffering, `buf[:] = x`"
# Double buffering on CUDA with the kernel, mark and read-back inside `with cupy.cuda.Stream(
# non_blocking=True):`. lazybuf's stream is a blocking one (so kernels on CuPy's legacy default
# stream are ordered with lazybuf's copies without a call), so a kernel there waits for the
# other buffer's upload; on a non-blocking stream it need not (whether that pays is measured
# here: docs/benchmarks/gpu.md).
ON_A_STREAM = "double buffering, kernels on a CuPy stream"


def lazybuf_cases(device, n, x):
    pool = lazybuf.get_memory_pool(device)
    rmw = lazybuf.UnifiedBuffer(n, np.float32, device=device)
    rmw.host[:] = x
    pair = [lazybuf.UnifiedBuffer(n, np.float32, device=device) for _ in range(2)]
    for b in pair:
        b.host[:] = x
    step = [0]

    def batch_new():
        b = lazybuf.UnifiedBuffer(n, np.float32, device=device)
        b.host[:] = x
        d = b.device
        d *= 3
        b.mark_device_dirty()
        return b.to_numpy()

    def batch_pool():
        b = pool.acquire(n, np.float32)
        b.host[:] = x
        d = b.device
        d *= 3
        b.mark_device_dirty()
        out = b.to_numpy()
        pool.release(b)
        return out

    def read_modify_write():
        rmw.host[:] += 1
        d = rmw.device
        d *= -1
        rmw.mark_device_dirty()

    def double_buffering():
        current, previous = pair[step[0] % 2], pair[(step[0] + 1) % 2]
        step[0] += 1
        current.host[:] = x  # the host's work on one buffer ...
        transfer = current.sync_to_device_async()  # ... whose upload starts at once,
        d = previous.device  # while the other buffer is processed
        d *= 3
        previous.mark_device_dirty()
        out = previous.to_numpy()
        transfer.wait()
        return out

    def double_buffering_overwrite():
        current, previous = pair[step[0] % 2], pair[(step[0] + 1) % 2]
        step[0] += 1
        current[:] = x  # every element assigned: the stale host copy is not synced first
        transfer = current.sync_to_device_async()
        d = previous.device
        d *= 3
        previous.mark_device_dirty()
        out = previous.to_numpy()
        transfer.wait()
        return out

    cases = {
        "batch, new buffer": batch_new,
        "batch, pool": batch_pool,
        "read-modify-write": read_modify_write,
        "double buffering": double_buffering,
        OVERWRITE: double_buffering_overwrite,
    }
    if device.backend == "cuda":
        import cupy

        kernels = cupy.cuda.Stream(non_blocking=True)

        def double_buffering_on_a_stream():
            current, previous = pair[step[0] % 2], pair[(step[0] + 1) % 2]
            step[0] += 1
            current.host[:] = x
            transfer = current.sync_to_device_async()
            with kernels:  # the array is ordered after its upload on this stream, at `.device`
                d = previous.device
                d *= 3
                previous.mark_device_dirty()
                out = previous.to_numpy()
            transfer.wait()
            return out

        cases[ON_A_STREAM] = double_buffering_on_a_stream
    return cases


def pydotcompute_cases(n, x):
    import pydotcompute

    rmw = pydotcompute.UnifiedBuffer((n,), np.float32)
    rmw.allocate()
    rmw.host[:] = x
    pair = [pydotcompute.UnifiedBuffer((n,), np.float32) for _ in range(2)]
    for b in pair:
        b.allocate()
        b.host[:] = x
    step = [0]

    def batch_new():
        b = pydotcompute.UnifiedBuffer((n,), np.float32)
        b.allocate()
        b.host[:] = x
        d = b.device
        d *= 3
        b.mark_device_dirty()
        return b.host.copy()

    def read_modify_write():
        rmw.host[:] += 1
        d = rmw.device
        d *= -1
        rmw.mark_device_dirty()

    def double_buffering():  # no asynchronous sync: the same steps, one after the other
        current, previous = pair[step[0] % 2], pair[(step[0] + 1) % 2]
        step[0] += 1
        current.host[:] = x
        current.device  # noqa: B018 (the upload)
        d = previous.device
        d *= 3
        previous.mark_device_dirty()
        return previous.host.copy()

    return {"batch, new buffer": batch_new, "read-modify-write": read_modify_write, "double buffering": double_buffering,
            OVERWRITE: double_buffering, ON_A_STREAM: double_buffering}


def pyopencl_cases(device, n, x):
    import pyopencl as cl
    import pyopencl.array as cla

    # lazybuf's own queue (a .device array of any buffer on the device carries it).
    queue = lazybuf.UnifiedBuffer(1, np.float32, device=device).device.queue
    host, out = np.empty(n, np.float32), np.empty(n, np.float32)
    d = cla.empty(queue, n, np.float32)
    pair = [cla.empty(queue, n, np.float32) for _ in range(2)]
    hosts = [np.empty(n, np.float32) for _ in range(2)]
    step = [0]

    def batch():  # (d.__imul__: `d *= 3` would rebind the name inside a closure)
        host[:] = x
        d.set(host)
        d.__imul__(3)
        d.get(ary=out)
        return out

    def read_modify_write():
        host[:] += 1
        d.set(host)
        d.__imul__(-1)
        d.get(ary=host)

    def double_buffering():
        i = step[0] % 2
        step[0] += 1
        current, previous = pair[i], pair[1 - i]
        hosts[i][:] = x
        upload = cl.enqueue_copy(queue, current.data, hosts[i], is_blocking=False)
        previous.__imul__(3)
        previous.get(ary=out)
        upload.wait()
        return out

    return {"batch, new buffer": batch, "batch, pool": batch, "read-modify-write": read_modify_write,
            "double buffering": double_buffering, OVERWRITE: double_buffering}


def cupy_cases(n, x):
    import cupy as cp
    import cupyx

    host, out = cupyx.empty_pinned(n, np.float32), cupyx.empty_pinned(n, np.float32)
    d = cp.empty(n, np.float32)
    pair = [cp.empty(n, np.float32) for _ in range(2)]
    hosts = [cupyx.empty_pinned(n, np.float32) for _ in range(2)]
    copy_stream = cp.cuda.Stream(non_blocking=True)
    step = [0]

    def batch():  # (d.__imul__: `d *= 3` would rebind the name inside a closure)
        host[:] = x
        d.set(host)
        d.__imul__(3)
        d.get(out=out)
        return out

    def read_modify_write():
        host[:] += 1
        d.set(host)
        d.__imul__(-1)
        d.get(out=host)

    def double_buffering():
        i = step[0] % 2
        step[0] += 1
        current, previous = pair[i], pair[1 - i]
        hosts[i][:] = x
        current.set(hosts[i], stream=copy_stream)
        previous.__imul__(3)
        previous.get(out=out)
        copy_stream.synchronize()
        return out

    return {"batch, new buffer": batch, "batch, pool": batch, "read-modify-write": read_modify_write,
            "double buffering": double_buffering, OVERWRITE: double_buffering, ON_A_STREAM: double_buffering}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="lazybuf device selector (default: the default device)")
    parser.add_argument("--reps", type=int, default=11)
    parser.add_argument("--sizes", default=",".join(SIZES))
    parser.add_argument("--min-ms", type=float, default=2.0,
                        help="each case's repetition runs at least this long (default 2 ms)")
    args = parser.parse_args()
    device = lazybuf.get_accelerator().select_device(args.device) if args.device else (
        lazybuf.get_accelerator().current_device
    )
    by_hand = {"opencl": "PyOpenCL by hand", "cuda": "CuPy by hand (pinned)"}.get(device.backend)
    kernels_from = {"opencl": "pyopencl", "cuda": "cupy"}.get(device.backend)
    if kernels_from is not None:
        try:
            __import__(kernels_from)
        except ImportError:
            print(f"bench_workflows: the kernel step needs {kernels_from} on {device.selector} "
                  f"(.device is a {kernels_from} array there); it is not installed, nothing measured")
            return
    try:
        import pydotcompute  # noqa: F401

        have_pdc = True
    except ImportError:
        have_pdc = False

    rows = []
    for size in args.sizes.split(","):
        size = size.strip().replace("KiB", " KiB").replace("MiB", " MiB").replace("  ", " ")
        n = SIZES[size] // 4
        x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
        cases = {"lazybuf": lazybuf_cases(device, n, x)}
        if have_pdc:
            cases["PyDotCompute 0.2.0"] = pydotcompute_cases(n, x)
        try:
            if device.backend == "opencl":
                cases[by_hand] = pyopencl_cases(device, n, x)
            elif device.backend == "cuda":
                cases[by_hand] = cupy_cases(n, x)
        except ImportError as err:  # the peer's library is not installed: its column stays empty
            print(f"({by_hand} skipped: {err})", file=sys.stderr)
        for workflow in cases["lazybuf"]:
            row = {name: (fns[workflow], {}) for name, fns in cases.items() if workflow in fns}
            rows.append((workflow, size, run_row(row, args.reps, args.min_ms / 1e3)))

    names = ["lazybuf"] + (["PyDotCompute 0.2.0"] if have_pdc else []) + ([by_hand] if by_hand else [])
    print(
        f"Python {platform.python_version()}, NumPy {np.__version__}, lazybuf {version('lazybuf')} on "
        f"{device.selector} ({device.name}); {args.reps} repetitions, median per batch"
    )
    print()
    header = " | ".join(names)
    ratios = " | ".join(f"{name} / lazybuf" for name in names[1:])
    print(f"| workflow | size | {header} | {ratios} |")
    print("|---|---|" + "---:|" * (len(names) + len(names) - 1))
    for workflow, size, t in rows:
        cells = " | ".join(fmt(t[name]) if name in t else "—" for name in names)
        rel = " | ".join(f"{t[name] / t['lazybuf']:.2f}×" if name in t else "—" for name in names[1:])
        print(f"| {workflow} | {size} | {cells} | {rel} |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
