"""Read-back of a buffer whose device copy is newer: `to_numpy()` and, where
the build has it, `to_numpy(out=)`, against NumPy's copy of the same bytes and a single-thread
memcpy, in one process.

Each round makes the device copy current and the host copy stale (`mark_device_dirty()`, no
bytes moved) and reads it back; the time is the median over `--reps` rounds of the read-back
alone. On the CUDA driver test double (LD_LIBRARY_PATH=target/cuda-double) "device" memory is
host memory and a download is one memcpy on the stream's worker, so the count of copies shows
as time: before the one-copy read-back, a read-back was a download into the host copy and a copy out (two),
now it is one.

Usage: python bench_read_back.py [--device cuda] [--sizes 4MiB,64MiB] [--reps N]
"""

import argparse
import ctypes
import statistics
import time

import numpy as np

import lazybuf

UNITS = {"KiB": 1 << 10, "MiB": 1 << 20}


def parse_size(text: str) -> int:
    for unit, factor in UNITS.items():
        if text.endswith(unit):
            return int(text[: -len(unit)]) * factor
    return int(text)


def median(fn, reps: int, before=None) -> float:
    times = []
    for _ in range(reps + 2):
        if before:
            before()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times[2:])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--sizes", default="64KiB,4MiB,64MiB")
    parser.add_argument("--reps", type=int, default=21)
    args = parser.parse_args()
    device = lazybuf.get_accelerator().select_device(args.device)
    print(f"device {device}")
    print()
    print("| size | memcpy 1 thread (ms) | NumPy copy() (ms) | to_numpy() (ms) | to_numpy(out=) (ms) "
          "| to_numpy() / NumPy | to_numpy(out=) / memcpy | state after |")
    print("|---|---|---|---|---|---|---|---|")
    for text in args.sizes.split(","):
        n = parse_size(text)
        data = np.frombuffer(np.random.default_rng(2).bytes(n), np.uint8).copy()
        out = np.empty(n, np.uint8)
        buf = lazybuf.UnifiedBuffer(n, np.uint8, device=device)
        buf.copy_from(data)
        buf.sync_to_device()
        stale = buf.mark_device_dirty
        t_memcpy = median(lambda: ctypes.memmove(out.ctypes.data, data.ctypes.data, n), args.reps)
        t_numpy = median(lambda: data.copy(), args.reps)
        t_new = median(buf.to_numpy, args.reps, stale)
        try:
            t_out = median(lambda: buf.to_numpy(out=out), args.reps, stale)
            assert (out == data).all()
        except TypeError:
            t_out = float("nan")  # a build before to_numpy(out=)
        stale()
        assert (buf.to_numpy() == data).all()
        state = buf.state.value
        ms = [t * 1e3 for t in (t_memcpy, t_numpy, t_new, t_out)]
        print(
            f"| {text} | {ms[0]:.3f} | {ms[1]:.3f} | {ms[2]:.3f} | {ms[3]:.3f} "
            f"| {t_new / t_numpy:.2f} | {t_out / t_memcpy:.2f} | {state} |"
        )


if __name__ == "__main__":
    main()
