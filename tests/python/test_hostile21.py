"""What the twenty-first hostile pass (Python 3.12 and 3.13 as a hostile user drives them: the
buffer protocol from Python (PEP 688), `sys.monitoring`, finalization at exit; and processes:
spawn, forkserver, subprocesses) found, each a test that failed before its fix. Each means the
same on every device.
"""

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

import lazybuf


def test_type_checkers_take_the_buffer_protocols_objects_as_buffers(tmp_path):
    """`memoryview(buf)`, `bytes(buf)` and `hashlib.sha256(buf)` work at run time for a
    UnifiedBuffer, a MemoryHost and a MemoryShared, but the stubs declared no `__buffer__`
    (PEP 688), so mypy rejected each ("incompatible type "UnifiedBuffer"; expected
    "Buffer""). They declare it now; a MemoryDevice, which has no buffer protocol, is still
    refused."""
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("needs mypy")
    source = tmp_path / "uses_buffers.py"
    source.write_text(
        textwrap.dedent(
            """\
            import hashlib
            import numpy as np
            import lazybuf
            buf = lazybuf.UnifiedBuffer((4,), np.float32)
            a = memoryview(buf)
            b = bytes(buf)
            c = hashlib.sha256(buf)
            d = memoryview(lazybuf.MemoryHost(16))
            e = memoryview(lazybuf.MemoryShared(16))
            f = bytearray(buf)
            g = memoryview(lazybuf.MemoryDevice(16))  # line 11: no buffer protocol
            """
        )
    )
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "--cache-dir", os.devnull, str(source)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    errors = [line for line in run.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 1 and "uses_buffers.py:11:" in errors[0] and "MemoryDevice" in errors[0], run.stdout
