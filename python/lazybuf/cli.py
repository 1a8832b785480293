"""The ``lazybuf`` command-line tool: devices, bandwidth, watch and check.

``pip install lazybuf`` installs a ``lazybuf`` command that runs :func:`main`; ``python -m
lazybuf`` runs it too. It is the same Rust code as the ``lazybuf`` executable that
``cargo install`` builds (``lazybuf._lazybuf._cli_main``), so the subcommands, options and
output are the same. ``lazybuf --help`` lists them.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from ._lazybuf import _cli_main

__all__ = ["main"]

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
