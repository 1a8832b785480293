"""The seeds' batch loops at 4 KiB, for counting driver calls and instructions per batch
(docs/BENCHMARKS.md says how each count is taken).

    python batch_loops.py LOOP DEVICE BATCHES [STEPS]

LOOP: new (a new buffer per batch), pool (a pooled buffer per batch), rmw (read-modify-write
on one buffer), double (double buffering, no read-back), numpy (NumPy alone: allocate, write,
copy out). DEVICE: a lazybuf device selector (host, opencl, cuda). STEPS (new and numpy only):
how many of the batch's steps to run, in order (new: construct and drop, host write,
`.device`, `mark_device_dirty`, `to_numpy`; numpy: allocate, write, copy out), so that the
difference between runs with k and k-1 steps is step k's cost. Three warm-up batches run
first; BATCHES 0 runs only them.
"""

import sys

import numpy as np

import lazybuf
from lazybuf import UnifiedBuffer

N = 1024
DATA = np.arange(N, dtype=np.float32)


def main() -> None:
    loop, selector, batches = sys.argv[1], sys.argv[2], int(sys.argv[3])
    steps = int(sys.argv[4]) if len(sys.argv) > 4 else 5
    device = None if loop == "numpy" else lazybuf.get_accelerator().select_device(selector)
    bufs = []
    if loop == "rmw":
        bufs = [UnifiedBuffer(N, np.float32, device=device)]
    if loop == "double":
        bufs = [UnifiedBuffer(N, np.float32, device=device) for _ in range(2)]
        bufs[0].host[:] = DATA
    pool = lazybuf.get_memory_pool(device) if loop == "pool" else None

    def batch() -> None:
        if loop == "numpy":
            a = np.empty(N, np.float32)
            if steps >= 2:
                a[:] = DATA
            if steps >= 3:
                a.copy()
        elif loop == "new":
            buf = UnifiedBuffer(N, np.float32, device=device)
            if steps >= 2:
                buf.copy_from(DATA)
            if steps >= 3:
                buf.device
            if steps >= 4:
                buf.mark_device_dirty()
            if steps >= 5:
                buf.to_numpy()
        elif loop == "pool":
            buf = pool.acquire((N,), np.float32)
            buf.copy_from(DATA)
            buf.device
            buf.mark_device_dirty()
            buf.to_numpy()
            pool.release(buf)
        elif loop == "rmw":
            (buf,) = bufs
            buf.host[:] = DATA
            buf.device
            buf.mark_device_dirty()
            buf.to_numpy()
        elif loop == "double":
            a, b = bufs
            a.sync_to_device()
            a.device
            b.host[:] = DATA
            bufs.reverse()

    for _ in range(3 + batches):
        batch()


if __name__ == "__main__":
    main()
