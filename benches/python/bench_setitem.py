"""Per-call time of `buf[key] = value` (the binding's partial assignment) against NumPy's own
element assignment, best of 7 repetitions of 20,000 calls each, on one device:

    python bench_setitem.py DEVICE     # host, opencl, ...

The assignment checks the key and value by NumPy's rules before the buffer is touched (a failed
assignment changes nothing), except for a plain number into one element whose conversion cannot
fail (docs/RELIABILITY.md, the seventeenth and eighteenth passes).
"""

import sys, timeit
import numpy as np
import lazybuf
dev = lazybuf.get_accelerator().select_device(sys.argv[1])
b = lazybuf.UnifiedBuffer(1024, np.float32, device=dev)
b.copy_from(np.zeros(1024, np.float32))
a = np.zeros(1024, np.float32)
row = np.ones(4, np.float32)
cases = {
    "b[i] = 1.5": lambda: b.__setitem__(3, 1.5),
    "b[i] = np.float32": (lambda v=np.float32(2.0): b.__setitem__(3, v)),
    "b[2:6] = array": lambda: b.__setitem__(slice(2, 6), row),
    "b[[1,2]] = 1.0": lambda: b.__setitem__([1, 2], 1.0),
    "numpy a[i] = 1.5": lambda: a.__setitem__(3, 1.5),
}
for name, fn in cases.items():
    n = 20000
    best = min(timeit.repeat(fn, number=n, repeat=7)) / n * 1e6
    print(f"{name:22s} {best:.3f} us")
