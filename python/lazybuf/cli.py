"""The ``lazybuf`` command-line tool: devices, bandwidth, watch and check.

``pip install lazybuf`` installs a ``lazybuf`` command that runs :func:`main`; ``python -m
lazybuf`` runs it too. It is the same Rust code as the ``lazybuf`` executable that
``cargo install`` builds (``lazybuf._lazybuf._cli_main``), so the subcommands, options,
output and exit statuses are the same, a closed stdout included (the output goes nowhere,
status 0); only ``python -m lazybuf`` refuses a closed stdout (status 1).
``lazybuf --help`` lists them.
"""

from __future__ import annotations

import math
import numbers
import os
import sys
from collections.abc import Sequence

from ._lazybuf import _cli_main

__all__ = ["main", "watch"]

# The tool's own words for it (lazybuf_cli::run), so every path prints the same line.
_CLOSED_STDOUT = "cannot write to stdout: it is closed (Bad file descriptor)"


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the tool with ``argv`` (default: this process's arguments, without the program
    name) and returns its exit status: 0 on success, non-zero with a one-line error on
    stderr otherwise. ``Ctrl-C`` stops ``watch`` and ``bandwidth`` cleanly.

    As a console script entry point (the ``lazybuf`` command ``pip install`` puts on PATH)
    the return value becomes the process's exit status, and a closed stdout (``lazybuf
    devices >&-``) is what it is for the ``lazybuf`` executable, whose runtime opens
    ``/dev/null`` on it: the output goes nowhere and the status is the run's (0).
    """
    args = sys.argv[1:] if argv is None else list(argv)
    if sys.stdout is None:
        # Descriptor 1 was closed when Python started. A file opened since may hold it now:
        # the tool writes to /dev/null, as the executable does, and that file is left alone.
        return _run_on_devnull(args)
    _flush_stdout()
    return _cli_main(["lazybuf", *args])


def _module_main() -> int:
    """``python -m lazybuf``: as :func:`main`, except that a stdout closed when Python started
    is refused before any subcommand runs (one ``lazybuf: error:`` line, status 1)."""
    if sys.stdout is None:
        if sys.stderr is not None:
            print(f"lazybuf: error: {_CLOSED_STDOUT}", file=sys.stderr)
        return 1
    return main()


def _flush_stdout() -> None:
    """Python's own buffered output goes first. A reader that has gone, or a descriptor
    closed under Python, is the tool's to report: it writes to descriptor 1 itself."""
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        pass


def _run_on_devnull(args: list[str]) -> int:
    """Runs the tool with descriptor 1 on the null device, then puts descriptor 1 back as it
    was (closed, or the file that held it)."""
    try:
        held = os.dup(1)
    except OSError:
        held = None  # closed
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        if null != 1:
            os.dup2(null, 1)
        return _cli_main(["lazybuf", *args])
    finally:
        if held is not None:
            os.dup2(held, 1)
            os.close(held)
        else:
            os.close(1)
        if null != 1:
            os.close(null)


def watch(device: str | None = None, *, interval: str | float = "1s", count: int | None = None) -> int:
    """Prints the memory of ``device`` (a selector such as ``"opencl:0"``; default: every
    device) every ``interval`` (seconds as a number, or a duration such as ``"250ms"``), in
    this process, so the pool figures are this process's own; ``count`` refreshes, else until
    ``Ctrl-C``. Returns the tool's exit status (``lazybuf watch``, docs/CLI.md)."""
    args = ["watch"]
    if device is not None:
        args += ["--device", str(device)]
    if isinstance(interval, bool):
        raise ValueError(f"watch: interval must be a number of seconds or a duration such as '250ms', got {interval!r}")
    if isinstance(interval, numbers.Real):
        # Any real number (a NumPy float, a Fraction), as a float: its str() ("1e-04",
        # "1/10000") was passed on and refused by the tool (the twenty-second hostile pass).
        seconds = float(interval)
        if not math.isfinite(seconds) or seconds <= 0:
            raise ValueError(f"watch: interval must be a positive, finite number of seconds, got {interval!r}")
        interval = seconds
        # Seconds to the nanosecond (the tool's resolution): rounded to whole milliseconds, an
        # interval under 0.5 ms became "0ms", which the tool refused as if the user had
        # written it (the twenty-second hostile pass).
        text = f"{interval:.9f}".rstrip("0").rstrip(".")
        if float(text) == 0:
            raise ValueError(f"watch: interval must be at least 1 ns, got {interval!r}")
        args += ["--interval", f"{text}s"]
    else:
        args += ["--interval", str(interval)]
    if count is not None:
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise ValueError(f"watch: count must be a positive int, got {count!r}")
        args += ["--count", str(count)]
    return main(args)
