"""``python -m lazybuf``: the ``lazybuf`` command-line tool (devices, bandwidth, watch, check).

The same as the ``lazybuf`` command that ``pip install lazybuf`` installs: both run
:func:`lazybuf.cli.main`, which runs the Rust code of the ``lazybuf`` executable
(``lazybuf._lazybuf._cli_main``), so the subcommands, options, output and exit statuses are
the same, including on a closed stdout (``python -m lazybuf devices >&-``: one
``lazybuf: error:`` line on stderr, status 1) and a closed pipe (``python -m lazybuf devices |
head -1``: quiet, status 0), never a Python traceback. ``python -m lazybuf --help`` lists the
subcommands.
"""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
