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


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the tool with ``argv`` (default: this process's arguments, without the program
    name) and returns its exit status: 0 on success, non-zero with a one-line error on
    stderr otherwise. ``Ctrl-C`` stops ``watch`` and ``bandwidth`` cleanly.

    As a console script entry point the return value becomes the process's exit status.
    """
    args = sys.argv[1:] if argv is None else list(argv)
    sys.stdout.flush()
    return _cli_main(["lazybuf", *args])
