"""The per-call cost of lazybuf's Python accessors on every device found (issue 9's goals:
``.device`` of an unchanged buffer and ``.host``/``.host_readonly`` at <= 0.3 µs each,
``to_numpy()`` of 4 KiB <= 2 µs, construction <= ``numpy.empty`` + 1 µs).

Each figure is the best of 7 repetitions of 20,000 calls (the floor of this machine's noise),
on a 4 KiB float32 buffer that is current on its device. Run it with the CUDA driver test
double on ``LD_LIBRARY_PATH`` to include (fake) CUDA devices, whose accessors take the same
code path as on a GPU (no driver call happens when nothing is stale).

Usage: python bench_access.py
"""

import platform
import timeit

import numpy as np

import lazybuf


def best_ns(stmt: str, names: dict, number: int = 20000) -> float:
    return min(timeit.Timer(stmt, globals=names).repeat(7, number)) / number * 1e9


def main() -> None:
    print(f"Python {platform.python_version()}, NumPy {np.__version__}; best of 7 x 20,000 calls, 4 KiB float32\n")
    print("| device | .device | .host_readonly | .host | to_numpy() | construction | numpy.empty |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for device in lazybuf.get_accelerator().devices:
        buf = lazybuf.UnifiedBuffer(1024, np.float32, device=device)
        buf.host[:] = 1
        buf.sync_to_device()
        names = {"b": buf, "np": np, "lazybuf": lazybuf, "d": device}
        cells = [
            best_ns(stmt, names)
            for stmt in (
                "b.device",
                "b.host_readonly",
                "b.host",
                "b.to_numpy()",
                "lazybuf.UnifiedBuffer(1024, np.float32, device=d)",
                "np.empty(1024, np.float32)",
            )
        ]
        print(f"| {device.selector} | " + " | ".join(f"{c:.0f} ns" for c in cells) + " |")
    held_views()
    fresh_buffer_steps()


def held_views() -> None:
    """The same accessors while the caller still holds the last object handed out: the buffer
    caches it weakly (a strong cache would keep the buffer from eviction, docs/SPILLING.md), so
    it is handed out again only while someone holds it; the table above rebuilds it per call."""
    print("\nWith the last object still held (best of 7 x 20,000 calls):\n")
    print("| device | .device | .host_readonly | .host |")
    print("|---|---:|---:|---:|")
    for device in lazybuf.get_accelerator().devices:
        buf = lazybuf.UnifiedBuffer(1024, np.float32, device=device)
        buf.host[:] = 1
        buf.sync_to_device()
        cells = []
        for name in ("device", "host_readonly", "host"):
            names = {"b": buf, "held": getattr(buf, name)}
            cells.append(best_ns(f"b.{name}", names))
        print(f"| {device.selector} | " + " | ".join(f"{c:.0f} ns" for c in cells) + " |")


def fresh_buffer_steps() -> None:
    """The seeds' batch step by step on a *new* 4 KiB buffer each call, cumulatively, so each
    difference is one step's cost: the copies, and making the device array object."""
    steps = [
        ("new + host write", "b = U(1024, np.float32, device=d); b.host[:] = x"),
        ("+ sync_to_device()", "b = U(1024, np.float32, device=d); b.host[:] = x; b.sync_to_device()"),
        ("+ .device instead", "b = U(1024, np.float32, device=d); b.host[:] = x; b.device"),
        ("+ mark_device_dirty() + to_numpy()",
         "b = U(1024, np.float32, device=d); b.host[:] = x; b.device; b.mark_device_dirty(); b.to_numpy()"),
    ]
    print("\nA new 4 KiB buffer per call, cumulative steps (best of 7 x 2,000 calls):\n")
    print("| device | " + " | ".join(name for name, _ in steps) + " |")
    print("|---|" + "---:|" * len(steps))
    for device in lazybuf.get_accelerator().devices:
        names = {"U": lazybuf.UnifiedBuffer, "np": np, "d": device, "x": np.ones(1024, np.float32)}
        cells = [best_ns(stmt, names, number=2000) / 1000 for _, stmt in steps]
        print(f"| {device.selector} | " + " | ".join(f"{c:.1f} µs" for c in cells) + " |")


if __name__ == "__main__":
    main()
