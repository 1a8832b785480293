"""lazybuf's Python API against the published pydotcompute 0.2.0 and plain NumPy, side by side
in one process, on the operations both libraries have.

Rows:
- construction of a 1 KiB float32 buffer (NumPy: ``np.empty``, which also allocates);
- round trip at 1 KiB, 1 MiB and 64 MiB: a host write, a device access, a host read into a new
  array (lazybuf: ``b.host[:] = x; b.device; b.to_numpy()``; pydotcompute has no
  ``to_numpy``, so ``b.host.copy()``; NumPy: ``a[:] = x; a.copy()``);
- plain ``.host`` access, and ``.device`` access (NumPy column: reading an attribute that holds
  an array).

Both libraries run on the host device here (no GPU), so the "device" is host memory for both.
Method: each case is a ``timeit`` statement; its loop count is calibrated so one repetition
takes at least 2 ms, then the cases of a row run interleaved, repetition by repetition, and the
median per-call time is reported. Buffers are written once before timing (destinations
pre-touched). pydotcompute is measured as published (its constructor retries two failed imports
on every call; see shared/reference/pydotcompute.md section 6).

Usage: python bench_vs_pydotcompute.py [--reps N]   (prints a markdown table)
"""

import argparse
import platform
import sys
from importlib.metadata import version

import numpy as np
import pydotcompute
import lazybuf
from harness import fmt, run_row

SIZES = {"1 KiB": 1 << 10, "1 MiB": 1 << 20, "64 MiB": 64 << 20}


class Holder:
    """A plain object holding an array: the cost of reading an attribute."""

    def __init__(self, array):
        self.array = array


def buffers(nbytes: int):
    n = nbytes // 4
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    lb = lazybuf.UnifiedBuffer((n,), np.float32)
    pdc = pydotcompute.UnifiedBuffer((n,), np.float32)
    pdc.allocate()  # pydotcompute's .host raises on an unallocated buffer
    dst = np.empty(n, np.float32)
    for b in (lb.host, pdc.host, dst):  # pre-touch every destination
        b[:] = x
    # Each library computes the right thing before it is timed.
    lb.host[:] = x
    lb.device
    assert np.array_equal(lb.to_numpy(), x)
    pdc.host[:] = x
    pdc.device
    assert np.array_equal(pdc.host.copy(), x)
    return x, lb, pdc, dst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=31)
    reps = parser.parse_args().reps

    rows = []
    n = 256
    rows.append(
        (
            "construction",
            "1 KiB",
            run_row(
                {
                    "lazybuf": ("UB((256,), f32)", {"UB": lazybuf.UnifiedBuffer, "f32": np.float32}),
                    "pydotcompute": ("UB((256,), f32)", {"UB": pydotcompute.UnifiedBuffer, "f32": np.float32}),
                    "numpy": ("empty(256, f32)", {"empty": np.empty, "f32": np.float32}),
                },
                reps,
            ),
        )
    )
    for label, nbytes in SIZES.items():
        x, lb, pdc, dst = buffers(nbytes)
        rows.append(
            (
                "host write, device access, host read",
                label,
                run_row(
                    {
                        "lazybuf": ("b.host[:] = x; b.device; b.to_numpy()", {"b": lb, "x": x}),
                        "pydotcompute": ("b.host[:] = x; b.device; b.host.copy()", {"b": pdc, "x": x}),
                        "numpy": ("a[:] = x; a.copy()", {"a": dst, "x": x}),
                    },
                    reps,
                ),
            )
        )
        del x, lb, pdc, dst
    x, lb, pdc, dst = buffers(n * 4)
    holder = Holder(dst)
    for attribute in ("host", "device"):
        rows.append(
            (
                f".{attribute} access",
                "1 KiB",
                run_row(
                    {
                        "lazybuf": (f"b.{attribute}", {"b": lb}),
                        "pydotcompute": (f"b.{attribute}", {"b": pdc}),
                        "numpy": ("h.array", {"h": holder}),
                    },
                    reps,
                ),
            )
        )

    print(
        f"Python {platform.python_version()}, NumPy {np.__version__}, lazybuf {version('lazybuf')}, "
        f"pydotcompute {version('pydotcompute')}; {reps} repetitions, median per call; "
        f"devices: lazybuf {lazybuf.get_accelerator().current_device.selector}, pydotcompute host (no CUDA/Metal)"
    )
    print()
    print("| operation | size | lazybuf | pydotcompute 0.2.0 | NumPy | pydotcompute / lazybuf | lazybuf / NumPy |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for operation, size, t in rows:
        print(
            f"| {operation} | {size} | {fmt(t['lazybuf'])} | {fmt(t['pydotcompute'])} | {fmt(t['numpy'])} "
            f"| {t['pydotcompute'] / t['lazybuf']:.1f}× | {t['lazybuf'] / t['numpy']:.2f}× |"
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
