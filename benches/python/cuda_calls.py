"""CUDA driver calls per 4 KiB batch of the seeds' loops, on the CUDA driver test double, which
counts calls per entry point (docs/BENCHMARKS.md, "Driver calls per batch"). Prints, per loop,
the calls of the last of four measured batches after three warm-up batches; the assertions on
them live in tests/python/test_cuda_calls.py.

    bash scripts/build-cuda-double.sh target/cuda-double
    LD_LIBRARY_PATH=$PWD/target/cuda-double python benches/python/cuda_calls.py
"""

import ctypes
import os

import numpy as np

import lazybuf
from lazybuf import UnifiedBuffer

DATA = np.arange(1024, dtype=np.float32)
WARM_UP, MEASURED = 3, 4


def counts(lib) -> dict[str, int]:
    size = lib.lazybuf_cuda_double_call_counts(None, 0) + 1
    text = ctypes.create_string_buffer(size)
    lib.lazybuf_cuda_double_call_counts(text, size)
    return {name: int(n) for name, n in (line.split("=") for line in text.value.decode().split())}


def last_batch(lib, batch) -> dict[str, int]:
    for _ in range(WARM_UP):
        batch()
    calls = {}
    for _ in range(MEASURED):
        before = counts(lib)
        batch()
        calls = {k: n - before.get(k, 0) for k, n in counts(lib).items() if n != before.get(k, 0)}
    return calls


def main() -> None:
    found = [d for d in lazybuf.get_accelerator().devices if d.backend == "cuda"]
    if not found or "test double" not in found[0].name:
        raise SystemExit("needs the CUDA driver test double (LD_LIBRARY_PATH=target/cuda-double)")
    device = found[0]
    lib = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD | os.RTLD_NOW)
    lib.lazybuf_cuda_double_call_counts.restype = ctypes.c_longlong
    lib.lazybuf_cuda_double_call_counts.argtypes = (ctypes.c_char_p, ctypes.c_longlong)
    pool = lazybuf.get_memory_pool(device)
    one = UnifiedBuffer(DATA.shape, DATA.dtype, device=device)
    pair = [UnifiedBuffer(DATA.shape, DATA.dtype, device=device) for _ in range(2)]
    pair[0].host[:] = DATA

    def new():
        buf = UnifiedBuffer(DATA.shape, DATA.dtype, device=device)
        buf.copy_from(DATA)
        buf.device
        buf.mark_device_dirty()
        buf.to_numpy()

    def pooled():
        buf = pool.acquire(DATA.shape, DATA.dtype)
        buf.copy_from(DATA)
        buf.device
        buf.mark_device_dirty()
        buf.to_numpy()
        pool.release(buf)

    def rmw():
        one.host[:] = DATA
        one.device
        one.mark_device_dirty()
        one.to_numpy()

    def double():
        a, b = pair
        a.sync_to_device()
        a.device
        b.host[:] = DATA
        pair.reverse()

    print("| loop | calls per batch | by entry point |")
    print("|---|---:|---|")
    for batch in (new, pooled, rmw, double):
        calls = last_batch(lib, batch)
        listed = ", ".join(f"`{k}` {n}" for k, n in sorted(calls.items()))
        print(f"| {batch.__name__} | {sum(calls.values())} | {listed} |")


if __name__ == "__main__":
    main()
