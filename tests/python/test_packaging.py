"""The installed package as a user gets it: its version, ``show_config()``, the ``lazybuf``
console script and ``lazybuf.cli``, and the metadata pip and PyPI read (licence, extras,
classifiers). Runs against the installed wheel (scripts/test-python.sh installs it)."""

import ast
import importlib.metadata
import io
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import lazybuf

ROOT = Path(__file__).resolve().parents[2]


def cargo_version() -> str:
    """The workspace version from the root Cargo.toml, as PEP 440 writes it (maturin turns
    Cargo's 1.2.0-alpha.3 into 1.2.0a3)."""
    text = (ROOT / "Cargo.toml").read_text()
    version = re.search(r'^version = "([^"]+)"', text, re.MULTILINE).group(1)
    return re.sub(r"-(alpha|beta|rc)\.?(\d+)", lambda m: {"alpha": "a", "beta": "b", "rc": "rc"}[m[1]] + m[2], version)


def test_version_is_the_installed_distributions_and_the_crates():
    assert lazybuf.__version__ == importlib.metadata.version("lazybuf")
    assert lazybuf.__version__ == cargo_version()
    assert re.fullmatch(r"\d+\.\d+\.\d+((a|b|rc)\d+)?", lazybuf.__version__)


def test_show_config_prints_versions_backends_and_the_host_device():
    out = io.StringIO()
    assert lazybuf.show_config(file=out) is None
    text = out.getvalue()
    host = next(d for d in lazybuf.get_accelerator().devices if d.backend == "host")
    assert re.search(rf"^lazybuf +: {re.escape(lazybuf.__version__)}$", text, re.MULTILINE)
    assert re.search(r"^Python +: 3\.", text, re.MULTILINE) and re.search(r"^NumPy +: \d", text, re.MULTILINE)
    compiled = [name for name, _ in lazybuf.get_accelerator().backend_status]
    assert "host" in compiled
    assert f"Backends compiled in : {', '.join(compiled)}" in text
    for name in compiled:  # each backend with its device count or why it has none
        assert re.search(rf"^  {name} +: (\d+ devices?|unavailable: .+)$", text, re.MULTILINE), name
    assert f"{host.selector}: {host.name}" in text
    assert "Default device: " in text


def test_show_config_prints_to_stdout_by_default(capsys):
    lazybuf.show_config()
    assert "Backends at run time:" in capsys.readouterr().out


def test_cli_main_runs_the_tool_in_process(capfd):
    assert lazybuf.cli.main(["--help"]) == 0
    assert "Usage: lazybuf" in capfd.readouterr().out
    assert lazybuf.cli.main(["no-such-command"]) != 0


def test_the_console_script_is_installed_and_runs():
    script = Path(sysconfig.get_path("scripts")) / ("lazybuf.exe" if os.name == "nt" else "lazybuf")
    assert script.exists(), f"pip did not install the console script at {script}"
    result = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "Usage: lazybuf" in result.stdout
    # `python -m lazybuf` is the same tool.
    module = subprocess.run([sys.executable, "-m", "lazybuf", "--help"], capture_output=True, text=True, timeout=120)
    assert module.returncode == 0 and module.stdout == result.stdout


def test_metadata_has_the_licence_files_classifiers_urls_and_extras():
    meta = importlib.metadata.metadata("lazybuf")
    assert meta.get("License-Expression") == "MIT OR Apache-2.0"
    files = {str(f) for f in importlib.metadata.files("lazybuf")}
    for licence in ("LICENSE-MIT", "LICENSE-APACHE"):
        assert any(f.endswith(f".dist-info/licenses/{licence}") for f in files), licence
    classifiers = meta.get_all("Classifier")
    for wanted in ("Typing :: Typed", "Operating System :: POSIX :: Linux", "Programming Language :: Rust"):
        assert wanted in classifiers
    assert any(u.startswith("Repository, ") for u in meta.get_all("Project-URL"))
    assert meta.get("Description-Content-Type").startswith("text/markdown")
    assert set(meta.get_all("Provides-Extra")) >= {"opencl", "dask", "bfloat16", "test"}
    assert "lazybuf/py.typed" in files and "lazybuf/_lazybuf.pyi" in files


def test_the_test_extra_installs_everything_the_tests_import():
    """Every third-party module tests/python imports (at any depth) is in the `test` extra,
    except CuPy, which needs a GPU and skips without one."""
    requires = importlib.metadata.requires("lazybuf") or []
    test_extra = {
        re.split(r"[ \[<>=;]", r, maxsplit=1)[0].lower().replace("-", "_") for r in requires if re.search(r"extra == ['\"]test['\"]", r)
    }
    provided = test_extra | {"numpy"}  # a dependency of the package itself
    if "dask" in test_extra:
        provided.add("distributed")  # dask[distributed]
    local = {p.stem for p in Path(__file__).parent.glob("*.py")} | {"lazybuf", "conftest"}
    imported = set()
    for path in Path(__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "importorskip":
                imported.add(node.args[0].value.split(".")[0])
    third_party = {m for m in imported - local if m not in sys.stdlib_module_names and m != "__future__"}
    assert third_party - provided <= {"cupy"}, f"missing from the test extra: {third_party - provided - {'cupy'}}"


def test_watch_runs_in_process_and_checks_its_arguments(capfd):
    """``lazybuf.watch()``: the ``watch`` command in this process (its pool figures are this
    process's own), public, with Python arguments."""
    assert lazybuf.watch("host", interval=0.01, count=2) == 0
    out = capfd.readouterr().out
    assert "host" in out, out
    assert lazybuf.watch("host", interval="10ms", count=1) == 0
    # (1e308 seconds is finite: taken since the twenty-second hostile pass, as the executable
    # takes an interval beyond what its clock holds; test_leftovers22.py.)
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="interval must be a positive, finite number"):
            lazybuf.watch(interval=bad)
    with pytest.raises(ValueError, match="count must be a positive int"):
        lazybuf.watch(count=0)
    assert lazybuf.watch("no-such-device", count=1) == 1
    assert "lazybuf: error:" in capfd.readouterr().err
