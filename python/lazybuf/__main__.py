"""``python -m lazybuf``: the ``lazybuf`` command-line tool (devices, bandwidth, watch, check).

It runs the same Rust code as the ``lazybuf`` executable (``lazybuf._lazybuf._cli_main``), so
the subcommands, options, output and exit statuses are the same, including on a closed
stdout (``python -m lazybuf devices >&-``: one ``lazybuf: error:`` line on stderr, status 1)
and a closed pipe (``python -m lazybuf devices | head -1``: quiet, status 0), never a Python
traceback. ``python -m lazybuf --help`` lists the subcommands.
"""

import sys

from ._lazybuf import _cli_main

# The tool's own words for it (lazybuf_cli::run), so both paths print the same line.
_CLOSED_STDOUT = "cannot write to stdout: it is closed (Bad file descriptor)"


def main() -> int:
    """Runs the tool with this process's arguments; returns its exit status."""
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
    return _cli_main(["lazybuf", *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
