"""``python -m lazybuf``: the ``lazybuf`` command-line tool (devices, bandwidth, watch, check).

The same as the ``lazybuf`` command that ``pip install lazybuf`` installs: both run
:func:`lazybuf.cli.main`, which runs the Rust code of the ``lazybuf`` executable
(``lazybuf._lazybuf._cli_main``), so the subcommands, options and output are the same.
``python -m lazybuf --help`` lists them.
"""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
