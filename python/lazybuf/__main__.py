"""``python -m lazybuf``: the ``lazybuf`` command-line tool (devices, bandwidth, watch, check).

The same as the ``lazybuf`` command that ``pip install lazybuf`` installs: both run the Rust
code of the ``lazybuf`` executable (``lazybuf._lazybuf._cli_main``) through
:mod:`lazybuf.cli`, so the subcommands, options, output and exit statuses are the same, with
one exception: a stdout closed when the interpreter started (``python -m lazybuf devices
>&-``) is refused with one ``lazybuf: error:`` line on stderr and status 1, never a Python
traceback, where the ``lazybuf`` command, like the executable, writes to nowhere and ends
with status 0. A closed pipe (``python -m lazybuf devices | head -1``) is quiet, status 0.
``python -m lazybuf --help`` lists the subcommands.
"""

import sys

from .cli import _module_main

if __name__ == "__main__":
    sys.exit(_module_main())
