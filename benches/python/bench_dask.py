"""Throughput of sending 64 MiB buffers between two local Dask workers: lazybuf
``UnifiedBuffer`` against a NumPy array of the same size (goal: lazybuf within 1.1x).

A ``distributed.LocalCluster`` with 2 worker processes (one thread each) on 127.0.0.1 (TCP).
Each repetition makes a fresh buffer (and a fresh NumPy array) on worker A, waits for it, then
times a task on worker B that depends on it, so B fetches it from A: A serializes it (lazybuf:
a memoryview over the host copy, no copy), the bytes cross the loopback, B deserializes it
(NumPy: an array over the received frame; lazybuf: a buffer whose host copy is the received
frame, adopted without a copy) and runs a task that reads ``nbytes``. Two figures per kind, each as the median and the fastest
of the repetitions (on a shared machine the fastest is the least disturbed), the two kinds
interleaved (alternating which goes first) so load drifts hit both alike:

- ``end to end``: submit on B until its result is back at the client (includes scheduling);
- ``transfer``: the receiving worker's own record of the fetch (``transfer_incoming_log``:
  request, receive and deserialize), the part lazybuf changes.

Usage: python benches/python/bench_dask.py [--reps N] [--mib M] [--device SEL]
  (--device: the workers' LAZYBUF_DEVICE, default host)
Needs lazybuf, numpy and dask[distributed] installed (scripts/test-python.sh's venv has them).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

import lazybuf  # noqa: F401  (registers the serializers in the client too)
from distributed import Client, LocalCluster, wait

MiB = 1 << 20


def make(kind: str, nbytes: int, seed: int):
    """On worker A: a filled lazybuf buffer or NumPy array of `nbytes` (HOST_ONLY)."""
    import numpy as np

    from lazybuf import UnifiedBuffer

    if kind == "lazybuf":
        buf = UnifiedBuffer((nbytes // 4,), np.float32)
        buf.host[:] = seed
        return buf
    array = np.empty(nbytes // 4, np.float32)
    array[:] = seed
    return array


def receive(x) -> tuple[int, str]:
    """On worker B: touches what arrived."""
    return int(x.nbytes), type(x).__name__


def transfer_log(dask_worker) -> list[dict]:
    return [{"keys": list(e["keys"]), "duration": e["duration"]} for e in dask_worker.transfer_incoming_log]


def rate(seconds: float, nbytes: int) -> str:
    return f"{seconds * 1e3:.1f} ms ({nbytes / seconds / 1e9:.2f} GB/s)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--device", default="host", help="the workers' LAZYBUF_DEVICE")
    args = parser.parse_args()
    nbytes = args.mib * MiB
    os.environ["LAZYBUF_DEVICE"] = args.device
    with LocalCluster(
        n_workers=2,
        processes=True,
        threads_per_worker=1,
        host="127.0.0.1",
        dashboard_address=None,
        worker_dashboard_address=None,
    ) as cluster, Client(cluster) as client:
        a, b = sorted(client.scheduler_info()["workers"])
        kinds = ["lazybuf", "numpy"]
        end_to_end: dict[str, list[float]] = {k: [] for k in kinds}
        keys: dict[str, list[str]] = {k: [] for k in kinds}
        for rep in range(args.reps + 1):  # repetition 0 warms up (imports, first allocations)
            order = kinds if rep % 2 == 0 else kinds[::-1]
            for kind in order:
                source = client.submit(make, kind, nbytes, rep, workers=[a], pure=False)
                wait(source)
                start = time.perf_counter()
                size, name = client.submit(receive, source, workers=[b], pure=False).result()
                elapsed = time.perf_counter() - start
                expected = "UnifiedBuffer" if kind == "lazybuf" else "ndarray"
                assert (size, name) == (nbytes, expected), (size, name)
                if rep > 0:
                    end_to_end[kind].append(elapsed)
                    keys[kind].append(source.key)
                del source
        log = client.run(transfer_log, workers=[b])[b]
        durations = {k: [e["duration"] for e in log if set(e["keys"]) & set(keys[k])] for k in kinds}
    print(f"{args.mib} MiB from worker A to worker B, {args.reps} repetitions, workers on {args.device}")
    print()
    print("| figure | statistic | lazybuf | NumPy | lazybuf / NumPy |")
    print("|---|---|---|---|---|")
    for label, samples in (("end to end", end_to_end), ("transfer", durations)):
        for stat_name, stat in (("median", statistics.median), ("fastest", min)):
            lb, np_ = stat(samples["lazybuf"]), stat(samples["numpy"])
            print(f"| {label} | {stat_name} | {rate(lb, nbytes)} | {rate(np_, nbytes)} | {lb / np_:.2f} |")
    print()
    print("samples (ms):")
    for label, samples in (("end to end", end_to_end), ("transfer", durations)):
        for kind in kinds:
            print(f"  {label:10} {kind:7}", " ".join(f"{s * 1e3:.0f}" for s in samples[kind]))


if __name__ == "__main__":
    main()
