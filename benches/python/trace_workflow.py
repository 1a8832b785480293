"""Instructions per batch of the seeds' batch workflow as the seed writes it ("Batch
Processing": ``pool.acquire``, ``copy_from``, the work on ``buf.device``, ``to_numpy().copy()``,
``pool.release``), with the event recorder off or on, counted by callgrind with collection
toggled on only around the measured batches (``cg_toggle.c``, through ctypes):

    valgrind --tool=callgrind --collect-atstart=no --callgrind-out-file=/dev/null \\
        python trace_workflow.py DEVICE BATCHES [KERNEL]

DEVICE: a lazybuf device selector (host, opencl). KERNEL (default on): the work on the device
copy is the seed's ``process_on_gpu``, here ``d *= 3`` on ``buf.device`` (NumPy's in-place
multiply on the host device, a PyOpenCL elementwise kernel on PoCL) followed by
``mark_device_dirty()``; ``off`` leaves only ``buf.device`` and ``mark_device_dirty()`` (the
lazybuf calls alone, as ``batch_steps.py`` counts them). With TRACE=on in the environment the
recorder runs (started after the three warm-up batches, no stacks). ELEMENTS in the environment
(default 1024: 4 KiB) sets the batch's float32 elements. The run's "Collected"
divided by BATCHES, less a run of 0 batches, is one batch; ``trace_workflow.sh`` does that.
Every thread's instructions are counted (a runtime's worker threads too).
"""

import os
import sys

import numpy as np

import lazybuf
from batch_steps import toggle_function

N = int(os.environ.get("ELEMENTS", "1024"))
DATA = np.arange(N, dtype=np.float32)


def main() -> None:
    selector, batches = sys.argv[1], int(sys.argv[2])
    kernel = (sys.argv[3] if len(sys.argv) > 3 else "on") == "on"
    toggle = toggle_function()
    device = lazybuf.get_accelerator().select_device(selector)
    pool = lazybuf.get_memory_pool(device)
    results = []

    def batch() -> None:
        buf = pool.acquire((N,), np.float32)
        try:
            buf.copy_from(DATA)
            d = buf.device
            if kernel:
                d *= 3  # process_on_gpu(buf.device)
            buf.mark_device_dirty()
            results.append(buf.to_numpy().copy())
        finally:
            pool.release(buf)
        results.clear()

    for _ in range(3):
        batch()
    if os.environ.get("TRACE") == "on":
        lazybuf.trace.start(capacity=1 << 22)
    toggle()
    for _ in range(batches):
        batch()
    toggle()


if __name__ == "__main__":
    main()
