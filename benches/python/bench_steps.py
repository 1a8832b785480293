"""Where one batch of the seeds' batch loop spends its time, step by step: lazybuf (a new
buffer per batch) next to the same work by hand with the device's Python library.

Each step is timed on its own (``time.perf_counter``), the device synchronized after the
kernel so its time is not charged to the next step; the median of ``--reps`` batches is
reported per step. The steps' sum is a little more than a batch in bench_workflows.py, which
does not synchronize.

Usage: python bench_steps.py [--device SELECTOR] [--reps N] [--sizes 4KiB,4MiB,64MiB]
"""

import argparse
import gc
import statistics
import time

import numpy as np

import lazybuf
from harness import fmt

SIZES = {"4KiB": 4 << 10, "4MiB": 4 << 20, "64MiB": 64 << 20}


def lazybuf_steps(device, n, x, sync):
    t = {}
    t0 = time.perf_counter()
    b = lazybuf.UnifiedBuffer(n, np.float32, device=device)
    t1 = time.perf_counter()
    b.host[:] = x
    t2 = time.perf_counter()
    d = b.device
    t3 = time.perf_counter()
    d *= 3
    sync()
    t4 = time.perf_counter()
    b.mark_device_dirty()
    t5 = time.perf_counter()
    out = b.to_numpy()
    t6 = time.perf_counter()
    del d, b
    t7 = time.perf_counter()
    del out
    t8 = time.perf_counter()
    for name, a, z in [("construct", t0, t1), ("host write", t1, t2), (".device", t2, t3), ("kernel", t3, t4),
                       ("mark_device_dirty", t4, t5), ("to_numpy", t5, t6), ("drop buffer", t6, t7),
                       ("drop result", t7, t8)]:
        t[name] = z - a
    return t


def cupy_steps(n, x):
    import cupy as cp
    import cupyx

    host, out = cupyx.empty_pinned(n, np.float32), cupyx.empty_pinned(n, np.float32)
    d = cp.empty(n, np.float32)

    def steps(device, n_, x_, sync):
        t0 = time.perf_counter()
        host[:] = x
        t1 = time.perf_counter()
        d.set(host)
        t2 = time.perf_counter()
        d.__imul__(3)
        sync()
        t3 = time.perf_counter()
        d.get(out=out)
        t4 = time.perf_counter()
        return {"host write": t1 - t0, ".device": t2 - t1, "kernel": t3 - t2, "to_numpy": t4 - t3}

    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None)
    parser.add_argument("--reps", type=int, default=31)
    parser.add_argument("--sizes", default=",".join(SIZES))
    args = parser.parse_args()
    acc = lazybuf.get_accelerator()
    device = acc.select_device(args.device) if args.device else acc.current_device
    sync = lambda: None  # noqa: E731
    if device.backend == "cuda":
        import cupy as cp

        sync = cp.cuda.Device().synchronize
    print(f"lazybuf on {device.selector} ({device.name}); median of {args.reps} batches per step")
    for size in args.sizes.split(","):
        n = SIZES[size.strip()] // 4
        x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
        cases = {"lazybuf": lazybuf_steps}
        if device.backend == "cuda":
            cases["CuPy by hand (pinned)"] = cupy_steps(n, x)
        samples = {name: {} for name in cases}
        for name, fn in cases.items():
            fn(device, n, x, sync)  # warm-up
        for _ in range(args.reps):
            for name, fn in cases.items():
                gc.collect()
                for step, seconds in fn(device, n, x, sync).items():
                    samples[name].setdefault(step, []).append(seconds)
        print(f"\n{size}:\n")
        names = list(cases)
        print("| step | " + " | ".join(names) + " |")
        print("|---|" + "---:|" * len(names))
        steps = list(samples["lazybuf"])
        for step in steps:
            cells = [fmt(statistics.median(samples[nm][step])) if step in samples[nm] else "—" for nm in names]
            print(f"| {step} | " + " | ".join(cells) + " |")
        totals = [fmt(sum(statistics.median(v) for v in samples[nm].values())) for nm in names]
        print("| **sum** | " + " | ".join(totals) + " |")


if __name__ == "__main__":
    main()
