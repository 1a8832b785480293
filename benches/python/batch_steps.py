"""Instructions per step of a 4 KiB batch, counted by callgrind with
collection toggled on only around the step measured (`cg_toggle.c`, through ctypes), in every
one of BATCHES batches after three warm-up batches:

    valgrind --tool=callgrind --collect-atstart=no --callgrind-out-file=/dev/null \\
        python batch_steps.py LOOP DEVICE STEP BATCHES

LOOP: lazybuf (construct, host write `copy_from`, `.device`, `mark_device_dirty`,
`to_numpy`, drop: steps 1-6) or numpy (allocate `np.empty`, write `a[:] = data`, copy out
`a.copy()`, drop: steps 1-4); step 0 toggles around nothing (the toggles' own cost, to
subtract). "Collected" / BATCHES is the step's cost. Every step runs in every batch; only one
is counted per run. With TRACE=on in the environment, lazybuf's event recorder runs (started
after the warm-up batches, no stacks): the recorder's cost per step. Instructions of every thread are counted while collection is on (a
runtime's worker threads too).
"""

import ctypes
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
N = 1024
DATA = np.arange(N, dtype=np.float32)


def toggle_function():
    lib = os.path.join(HERE, "cg_toggle.so")
    if not os.path.exists(lib):
        subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", lib, os.path.join(HERE, "cg_toggle.c")], check=True)
    return ctypes.CDLL(lib).cg_toggle


def main() -> None:
    loop, selector, step, batches = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    toggle = toggle_function()
    if loop == "numpy":
        steps = [
            lambda s: np.empty(N, np.float32),
            lambda s: s[0].__setitem__(slice(None), DATA),
            lambda s: s[0].copy(),
        ]
    else:
        import lazybuf

        device = lazybuf.get_accelerator().select_device(selector)
        steps = [
            lambda s: lazybuf.UnifiedBuffer(N, np.float32, device=device),
            lambda s: s[0].copy_from(DATA),
            lambda s: s[0].device,
            lambda s: s[0].mark_device_dirty(),
            lambda s: s[0].to_numpy(),
        ]
    for i in range(3 + batches):
        measured = i >= 3
        if i == 3 and loop == "lazybuf" and os.environ.get("TRACE") == "on":
            lazybuf.trace.start(capacity=1 << 22)
        state = []
        for k, fn in enumerate(steps, start=1):
            if measured and k == step:
                toggle()
                result = fn(state)
                toggle()
            else:
                result = fn(state)
            if k == 1:
                state.append(result)
            del result
        if measured and step == 0:
            toggle()
            toggle()
        if measured and step == len(steps) + 1:
            toggle()
            state.clear()  # the drop
            toggle()
        else:
            state.clear()


if __name__ == "__main__":
    main()
