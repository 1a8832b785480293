"""The ``lazybuf`` command-line tool: devices, bandwidth, watch and check.

``pip install lazybuf`` installs a ``lazybuf`` command that runs :func:`main`; ``python -m
lazybuf`` runs it too. It is the same Rust code as the ``lazybuf`` executable that
``cargo install`` builds (``lazybuf._lazybuf._cli_main``), so the subcommands, options and
output are the same. ``lazybuf --help`` lists them.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence

from ._lazybuf import _cli_main

__all__ = ["main", "watch"]

# The tool's own words for it (lazybuf_cli::run), so every path prints the same line.
_CLOSED_STDOUT = "cannot write to stdout: it is closed (Bad file descriptor)"


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the tool with ``argv`` (default: this process's arguments, without the program
    name) and returns its exit status: 0 on success, non-zero with a one-line error on
    stderr otherwise (a closed stdout included). ``Ctrl-C`` stops ``watch`` and
    ``bandwidth`` cleanly.

    As a console script entry point the return value becomes the process's exit status.
    """
    args = sys.argv[1:] if argv is None else list(argv)
    if sys.stdout is None:
        # Descriptor 1 was closed when Python started: say so here, before the tool runs,
        # since a file opened since then may have been given descriptor 1.
        if sys.stderr is not None:
            print(f"lazybuf: error: {_CLOSED_STDOUT}", file=sys.stderr)
        return 1
    # Python's own buffered output goes first. A reader that has gone, or a descriptor closed
    # under Python, is the tool's to report: it writes to descriptor 1 itself.
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
    return _cli_main(["lazybuf", *args])


def watch(device: str | None = None, *, interval: str | float = "1s", count: int | None = None) -> int:
    """Prints the memory of ``device`` (a selector such as ``"opencl:0"``; default: every
    device) every ``interval`` (seconds as a number, or a duration such as ``"250ms"``), in
    this process, so the pool figures are this process's own; ``count`` refreshes, else until
    ``Ctrl-C``. Returns the tool's exit status (``lazybuf watch``, docs/CLI.md)."""
    args = ["watch"]
    if device is not None:
        args += ["--device", str(device)]
    if isinstance(interval, (int, float)) and not isinstance(interval, bool):
        if not math.isfinite(interval * 1000) or interval <= 0:
            raise ValueError(f"watch: interval must be a positive, finite number of seconds, got {interval!r}")
        args += ["--interval", f"{round(interval * 1000)}ms"]
    else:
        args += ["--interval", str(interval)]
    if count is not None:
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise ValueError(f"watch: count must be a positive int, got {count!r}")
        args += ["--count", str(count)]
    return main(args)
