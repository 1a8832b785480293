"""Large host copies: lazybuf's host copy against one thread's memcpy and
NumPy's copy, in one process, per size.

- `memcpy (1 thread)`: `ctypes.memmove` between two preallocated arrays (libc, one call);
- `NumPy copyto`: `np.copyto(dst, src)` between the same arrays;
- `lazybuf to_numpy(out=)`: a host-device buffer whose host copy is current, copied into the
  same preallocated array (`host_memory::copy_bytes_raw` behind it);
- `lazybuf copy_from`: the array copied into the buffer's host copy (`copy_bytes`);
- `to_numpy()` against `src.copy()`: a new array each call (lazybuf's from its host cache
  from 1 MiB, NumPy's from malloc).

Each time is the median of `--reps` calls after warm-up (every page touched first); the
table gives GB/s and the ratios lazybuf / memcpy and lazybuf / NumPy (above 1: lazybuf is
faster). Usage: python bench_host_copy.py [--reps N] [--sizes 64KiB,1MiB,...]
"""

import argparse
import ctypes
import statistics
import time

import numpy as np

import lazybuf

UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
DEFAULT_SIZES = "64KiB,256KiB,1MiB,2MiB,4MiB,8MiB,16MiB,32MiB,64MiB,256MiB"


def parse_size(text: str) -> int:
    for unit, factor in UNITS.items():
        if text.endswith(unit):
            return int(text[: -len(unit)]) * factor
    return int(text)


def median_seconds(fn, reps: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=31)
    parser.add_argument("--sizes", default=DEFAULT_SIZES)
    args = parser.parse_args()
    host = next(d for d in lazybuf.get_accelerator().devices if d.backend == "host")
    print(f"lazybuf {getattr(lazybuf, '__version__', '?')}, NumPy {np.__version__}, device {host}")
    print()
    print("| size | memcpy 1 thread GB/s | NumPy copyto GB/s | lazybuf to_numpy(out=) GB/s | lazybuf copy_from GB/s "
          "| to_numpy(out=) / memcpy | to_numpy(out=) / NumPy | copy_from / memcpy | copy_from / NumPy "
          "| NumPy copy() GB/s | to_numpy() GB/s | to_numpy() / copy() |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for text in args.sizes.split(","):
        n = parse_size(text)
        src = np.frombuffer(np.random.default_rng(1).bytes(n), np.uint8).copy()
        dst = np.ones(n, np.uint8)
        buf = lazybuf.UnifiedBuffer(n, np.uint8, device=host)
        buf.copy_from(src)
        src_ptr, dst_ptr = src.ctypes.data, dst.ctypes.data
        has_out = True
        try:
            buf.to_numpy(out=dst)
        except TypeError:
            has_out = False  # a build before to_numpy(out=)
        reps = args.reps if n < (64 << 20) else max(7, args.reps // 3)
        t_memcpy = median_seconds(lambda: ctypes.memmove(dst_ptr, src_ptr, n), reps)
        t_numpy = median_seconds(lambda: np.copyto(dst, src), reps)
        t_out = median_seconds(lambda: buf.to_numpy(out=dst), reps) if has_out else float("nan")
        t_from = median_seconds(lambda: buf.copy_from(src), reps)
        t_copy = median_seconds(lambda: src.copy(), reps)
        t_new = median_seconds(lambda: buf.to_numpy(), reps)
        assert (buf.host_readonly == src).all() and (not has_out or (dst == src).all())
        gbs = [n / t / 1e9 for t in (t_memcpy, t_numpy, t_out, t_from, t_copy, t_new)]
        print(
            f"| {text} | {gbs[0]:.1f} | {gbs[1]:.1f} | {gbs[2]:.1f} | {gbs[3]:.1f} "
            f"| {t_memcpy / t_out:.2f} | {t_numpy / t_out:.2f} | {t_memcpy / t_from:.2f} | {t_numpy / t_from:.2f} "
            f"| {gbs[4]:.1f} | {gbs[5]:.1f} | {t_copy / t_new:.2f} |"
        )
        del buf


if __name__ == "__main__":
    main()
