"""`import lazybuf` where it cannot work raises what went wrong, never a Rust panic.

A hostile pass (2026-11-27): with NumPy unimportable (missing, broken, or a Ctrl-C while it
loads), the extension's import reached rust-numpy, which panics where it cannot have NumPy's C
API: the user got `pyo3_runtime.PanicException: Failed to access NumPy array API capsule`.
NumPy is imported first now, and its error is raised as NumPy raised it. Each case runs in a
fresh interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

REPORT = """
try:
    import lazybuf
except BaseException as err:
    print("RAISED", type(err).__module__, type(err).__name__, err)
else:
    print("IMPORTED")
"""


def _run(prelude: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(prelude) + REPORT],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def _raised(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PanicException" not in done.stdout + done.stderr and "panicked" not in done.stderr, done.stdout + done.stderr
    (line,) = [line for line in done.stdout.splitlines() if line.startswith(("RAISED", "IMPORTED"))]
    return line


def test_numpy_blocked_in_sys_modules_raises_its_import_error():
    line = _raised(_run("import sys\nsys.modules['numpy'] = None\n"))
    assert line.startswith("RAISED builtins ModuleNotFoundError") and "numpy" in line, line


def _with_stand_in_numpy(tmp_path, source: str) -> str:
    """The outcome of `import lazybuf` with a package `numpy` of `source` first on the path."""
    broken = tmp_path / "numpy"
    broken.mkdir()
    (broken / "__init__.py").write_text(source)
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH", "")) if p)
    return _raised(_run("", {"PYTHONPATH": path}))


def test_a_numpy_that_fails_to_import_raises_its_own_error(tmp_path):
    line = _with_stand_in_numpy(tmp_path, "raise ImportError('this NumPy is broken (a test stand-in)')\n")
    assert line == "RAISED builtins ImportError this NumPy is broken (a test stand-in)", line


def test_a_keyboard_interrupt_while_numpy_loads_is_raised_as_such():
    # A Ctrl-C while NumPy loads, made certain: NumPy's import raises KeyboardInterrupt.
    prelude = """
    import builtins, sys
    real_import = builtins.__import__
    def interrupted(name, *args, **kwargs):
        if name == "numpy" or name.startswith("numpy."):
            raise KeyboardInterrupt
        return real_import(name, *args, **kwargs)
    builtins.__import__ = interrupted
    """
    line = _raised(_run(prelude))
    assert line.startswith("RAISED builtins KeyboardInterrupt"), line


def test_the_import_still_works():
    assert _raised(_run("")) == "IMPORTED"


def test_a_numpy_without_its_c_api_is_an_import_error_without_a_panic_message(tmp_path):
    # Importable, but not NumPy's C API behind it (a stand-in, or a build without it): found
    # before rust-numpy looks, which would print its panic's message first.
    line = _with_stand_in_numpy(tmp_path, "__version__ = '2.1.0'\nempty = None\n")
    assert line.startswith("RAISED builtins ImportError lazybuf could not load NumPy's C API"), line
    assert "numpy.lib" in line, line
