"""``python -m lazybuf``: the ``lazybuf`` command-line tool (devices, bandwidth, watch, check).

It runs the same Rust code as the ``lazybuf`` executable (``lazybuf._lazybuf._cli_main``), so
the subcommands, options and output are the same. ``python -m lazybuf --help`` lists them.
"""

import sys

from ._lazybuf import _cli_main


def main() -> int:
    """Runs the tool with this process's arguments; returns its exit status."""
    sys.stdout.flush()
    return _cli_main(["lazybuf", *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
