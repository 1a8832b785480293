"""The event recorder's cost on the seeds' batch workflow (docs/BENCHMARKS.md).

Runs a batch workflow of ``bench_workflows.py`` ("batch, new buffer": a new buffer, a host
write, a device access with a kernel's write, ``mark_device_dirty()``, ``to_numpy()``; or
"batch, pool", the seed's own, with ``pool.acquire``/``pool.release``) with the recorder off
and on (no stacks), repetition by repetition interleaved, and prints the median time per
batch of each and their ratio.

    python bench_trace.py --device opencl --reps 9 --sizes 4KiB,4MiB [--workflow "batch, pool"]
"""

import argparse
import statistics
import timeit

import numpy as np

import lazybuf
from bench_workflows import lazybuf_cases
from harness import calibrate, fmt

SIZES = {"4KiB": 4 << 10, "64KiB": 64 << 10, "256KiB": 256 << 10, "1MiB": 1 << 20, "4MiB": 4 << 20, "64MiB": 64 << 20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="host")
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--sizes", default="4KiB,4MiB")
    parser.add_argument("--workflow", default="batch, new buffer", choices=["batch, new buffer", "batch, pool"])
    args = parser.parse_args()
    device = lazybuf.get_accelerator().select_device(args.device)
    print(f"lazybuf {lazybuf.__version__} on {device.selector}; {args.reps} repetitions, median per batch\n")
    print("| workflow | size | recorder off | recorder on | on / off |")
    print("|---|---|---:|---:|---:|")
    for size in args.sizes.split(","):
        n = SIZES[size] // 4
        x = np.arange(n, dtype=np.float32)
        batch = lazybuf_cases(device, n, x)[args.workflow]
        timer = timeit.Timer(batch)
        number = calibrate(timer, 2e-3)
        off, on = [], []
        for _ in range(args.reps):
            off.append(timer.timeit(number) / number)
            lazybuf.trace.start(capacity=1 << 22)
            on.append(timer.timeit(number) / number)
            lazybuf.trace.stop()
        off_m, on_m = statistics.median(off), statistics.median(on)
        print(f"| {args.workflow} | {size} | {fmt(off_m)} | {fmt(on_m)} | {on_m / off_m:.3f}× |")


if __name__ == "__main__":
    main()
