"""Spilling with kernels: a read-mostly loop whose working set is twice a device's memory budget,
each visit real kernels on the buffer's `.device` array (CuPy on CUDA, PyOpenCL on OpenCL).

    python bench_spill.py [--device SELECTOR] [--buffers 16] [--mib 64] [--visits 400] [--passes 8]

Each visit picks a buffer (a fixed pseudo-random order), takes `.device` and runs `passes`
kernels that read it (CuPy: a reduction; PyOpenCL: an elementwise `a + a`); one visit in five then scales it in place
and calls `mark_device_dirty()` (a kernel that writes it). Rows, one process each so no state
carries over:

- **in memory**: no budget: every copy stays on the device after its first upload;
- **lazybuf**: a budget of half the working set, coherence-aware eviction (a clean copy is
  dropped moving no byte);
- **write back always**: the same budget, every eviction downloading its copy first, as a spiller
  that does not know which copy is current must (`LAZYBUF_EVICTION_POLICY=write-back-always`,
  for benchmarks only);
- **floor**: the bytes least-recently-used replacement must move under that budget (uploads on
  misses, write-backs of copies written on the device), over the bandwidth this run measured,
  added to the in-memory time.

Goals (on a GPU): lazybuf within 1.25x of the in-memory time and at least 3x faster than write
back always; on any device, lazybuf's bytes within 1.05x of the floor. Managed memory is not a
row: without a budget, managed memory only pages when the working set exceeds the GPU's physical
memory, which this loop's sizes do not (docs/SPILLING.md).
"""

import argparse
import os
import subprocess
import sys
import time

import numpy as np


def order(buffers: int, visits: int) -> list[tuple[int, bool]]:
    x, out = 0x2545F4914F6CDD1D, []
    for _ in range(visits):
        x = (x * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        out.append(((x >> 33) % buffers, (x >> 17) % 5 == 0))
    return out


def floor_bytes(visits: list[tuple[int, bool]], resident: int, nbytes: int) -> int:
    lru, dirty, moved = [], set(), 0
    for b, write in visits:
        if b in lru:
            lru.remove(b)
        else:
            moved += nbytes
            if len(lru) == resident:
                victim = lru.pop(0)
                if victim in dirty:
                    dirty.discard(victim)
                    moved += nbytes
        lru.append(b)
        if write:
            dirty.add(b)
    return moved


def kernels(device):
    """(read, write, synchronize) for `.device` arrays of this device's backend."""
    if device.backend == "cuda":
        import cupy

        return (lambda a: a.sum(), lambda a: a.__imul__(1.0001), lambda: cupy.cuda.Device().synchronize())
    if device.backend == "opencl":
        queue = []

        def read(a):  # an elementwise kernel (PyOpenCL's reductions need Mako)
            queue[:] = [a.queue]
            return a + a

        def write(a):
            queue[:] = [a.queue]
            a *= np.float32(1.0001)

        return read, write, lambda: [q.finish() for q in queue]
    raise SystemExit(f"no kernels for {device.backend} devices: use a CUDA (CuPy) or OpenCL (PyOpenCL) device")


def run_row(args, budget: bool) -> None:
    """One row, in this process: prints `seconds bytes_moved evictions clean_evictions`."""
    import lazybuf

    device = lazybuf.get_accelerator().select_device(args.device)
    read, write, synchronize = kernels(device)
    n = args.mib * (1 << 20) // 4
    nbytes = n * 4
    resident = args.buffers // 2
    # Warm-up on a buffer of its own: kernels compiled (or loaded), the device's first use paid,
    # and the loop then starts from no copy on the device, as the floor's simulation does.
    scratch = lazybuf.UnifiedBuffer(n, np.float32, device=device)
    scratch.host[:] = 1
    warm = scratch.device
    read(warm)
    write(warm)
    synchronize()
    del warm
    scratch.release()
    lazybuf.trim()
    if budget:
        held = lazybuf.memory_held(device)
        lazybuf.set_memory_limit(device, held + resident * nbytes + nbytes // 2)
    bufs = []
    for i in range(args.buffers):
        buf = lazybuf.UnifiedBuffer(n, np.float32, device=device)
        buf.host[:] = i
        bufs.append(buf)
    visits = order(args.buffers, args.visits)
    def moved_so_far() -> int:
        return sum(b.transfer_stats()["host_to_device_bytes"] + b.transfer_stats()["device_to_host_bytes"] for b in bufs)

    moved_before = moved_so_far()
    before = lazybuf.spill_stats(device)
    start = time.perf_counter()
    for b, writes in visits:
        array = bufs[b].device
        for _ in range(args.passes):
            read(array)
        if writes:
            write(array)
        del array  # the exposure ends with the array: the copy may be evicted again
        if writes:
            bufs[b].mark_device_dirty()
    synchronize()
    seconds = time.perf_counter() - start
    moved = moved_so_far() - moved_before
    after = lazybuf.spill_stats(device)
    print(seconds, moved, after["evictions"] - before["evictions"], after["clean_evictions"] - before["clean_evictions"])


def bandwidth(args) -> float:
    """Bytes per second of upload plus download of one buffer, in this process."""
    import lazybuf

    device = lazybuf.get_accelerator().select_device(args.device)
    n = args.mib * (1 << 20) // 4
    buf = lazybuf.UnifiedBuffer(n, np.float32, device=device)
    buf.host[:] = 1
    buf.sync_to_device()
    start = time.perf_counter()
    for _ in range(10):
        buf.mark_host_dirty()
        buf.sync_to_device()
        buf.mark_device_dirty()
        buf.sync_to_host()
    return 20 * n * 4 / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--buffers", type=int, default=16)
    parser.add_argument("--mib", type=int, default=64, help="MiB per buffer")
    parser.add_argument("--visits", type=int, default=400)
    parser.add_argument("--passes", type=int, default=8, help="reading kernels per visit")
    parser.add_argument("--row", choices=["memory", "budget"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.row:
        run_row(args, args.row == "budget")
        return

    def child(row: str, policy: str = "coherence-aware") -> list[float]:
        env = dict(os.environ, LAZYBUF_EVICTION_POLICY=policy)
        argv = [sys.executable, __file__, "--row", row] + sys.argv[1:]
        done = subprocess.run(argv, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"the {row} row ({policy}) failed:\n{done.stderr}")
        return [float(x) for x in done.stdout.split()]

    nbytes = args.mib << 20
    floor = floor_bytes(order(args.buffers, args.visits), args.buffers // 2, nbytes)
    rows = {
        "in memory": child("memory"),
        "lazybuf": child("budget"),
        "write back always": child("budget", "write-back-always"),
    }
    per_second = bandwidth(args)
    memory_seconds = rows["in memory"][0]
    print(
        f"{args.buffers} buffers of {args.mib} MiB on {args.device}, budget {args.buffers // 2} copies, "
        f"{args.visits} visits of {args.passes} reading kernels, 1 in 5 writes; bandwidth {per_second / 1e9:.2f} GB/s\n"
    )
    print("| policy | seconds | / in memory | bytes moved | / floor | evictions (clean) |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, (seconds, moved, evictions, clean) in rows.items():
        print(
            f"| {name} | {seconds:.3f} | {seconds / memory_seconds:.2f} | {int(moved)} | {moved / floor:.3f} "
            f"| {int(evictions)} ({int(clean)}) |"
        )
    floor_seconds = memory_seconds + floor / per_second
    print(f"| floor | {floor_seconds:.3f} | {floor_seconds / memory_seconds:.2f} | {floor} | 1.000 | |")
    lazybuf_s, always_s = rows["lazybuf"][0], rows["write back always"][0]
    print(f"\nwrite back always / lazybuf: {always_s / lazybuf_s:.2f}x (goal on a GPU: >= 3x)")


if __name__ == "__main__":
    main()
