"""``lazybuf.__version__`` and ``lazybuf.show_config()``: what is installed and what it found."""

from __future__ import annotations

import importlib.metadata
import platform
import sys
from typing import TextIO

from ._lazybuf import get_accelerator


def _version() -> str:
    """The installed distribution's version (the crates' version, as PEP 440 spells it)."""
    try:
        return importlib.metadata.version("lazybuf")
    except importlib.metadata.PackageNotFoundError:  # imported from a source tree, not installed
        return "0+unknown"


__version__ = _version()

# Optional packages lazybuf works with, and the extra that installs each.
_OPTIONAL = (
    ("pyopencl", "opencl"),
    ("ml_dtypes", "bfloat16"),
    ("dask", "dask"),
    ("distributed", "dask"),
    ("cupy", None),
)


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def _package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def show_config(file: TextIO | None = None) -> None:
    """Prints lazybuf's configuration, like ``cupy.show_config()``: the lazybuf, Python and
    NumPy versions, the backends compiled into this build, what each found at run time (a
    device count, or why it found none), every device with its memory, the default device,
    and which optional packages are installed. For bug reports; returns nothing.

    ``file``: where to print (default: ``sys.stdout``).
    """
    import numpy

    out = sys.stdout if file is None else file
    accelerator = get_accelerator()
    status = accelerator.backend_status
    rows = [
        ("lazybuf", __version__),
        ("Python", f"{platform.python_version()} ({platform.python_implementation()}, {sys.platform}, {platform.machine()})"),
        ("NumPy", numpy.__version__),
        ("Backends compiled in", ", ".join(name for name, _ in status)),
    ]
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        print(f"{label:<{width}} : {value}", file=out)

    print("Backends at run time:", file=out)
    name_width = max((len(name) for name, _ in status), default=0)
    for name, found in status:
        if isinstance(found, int):
            text = f"{found} device{'' if found == 1 else 's'}"
        else:
            text = f"unavailable: {found}"
        print(f"  {name:<{name_width}} : {text}", file=out)

    print("Devices:", file=out)
    for index, device in enumerate(accelerator.devices):
        try:
            free, total = device.get_memory_info()
            memory = f"{_gib(free)} free of {_gib(total)} ({device.memory_source})"
        except Exception as err:  # a device whose memory query fails still gets its line
            memory = f"memory unknown: {err}"
        kind = "GPU" if device.is_gpu else ("shares host memory" if device.shares_host_memory else "device")
        print(f"  [{index}] {device.selector}: {device.name} ({device.vendor or 'unknown vendor'}; {kind}; {memory})", file=out)
    print(f"Default device: {accelerator.current_device.selector}", file=out)

    print("Optional packages:", file=out)
    package_width = max(len(name) for name, _ in _OPTIONAL)
    for name, extra in _OPTIONAL:
        version = _package_version(name)
        hint = f" (pip install lazybuf[{extra}])" if version is None and extra else ""
        print(f"  {name:<{package_width}} : {version or 'not installed'}{hint}", file=out)
