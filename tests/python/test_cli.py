"""``python -m lazybuf``: the command-line tool from the Python package.

It runs the same Rust code as the ``lazybuf`` executable (``lazybuf._lazybuf._cli_main``),
so these tests check that the package reaches it with the same subcommands and output: the
JSON of ``devices --json`` against the documented schema (docs/CLI.md) and against what the
package itself reports, a short ``bandwidth --json -``, ``check`` on the host device, help and
errors. The Rust suite (crates/lazybuf-cli/tests/cli.rs) covers every option on every device.
"""

import json
import os
import shlex
import subprocess
import sys

import pytest

import lazybuf

DEVICE_KEYS = {
    "selector",
    "backend",
    "name",
    "vendor",
    "is_gpu",
    "shares_host_memory",
    "total_bytes",
    "free_bytes",
    "free_source",
    "cached_bytes",
    "zero_copy_min_bytes",
    "compute_capability",
    "memory_error",
}


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "lazybuf", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_COLOR": "1", **(env or {})},
    )


def test_devices_json_follows_the_schema_and_matches_the_package():
    result = run_cli("devices", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["schema"] == "lazybuf.devices/1"
    devices = lazybuf.get_accelerator().devices
    assert [d["selector"] for d in report["devices"]] == [d.selector for d in devices]
    for entry, device in zip(report["devices"], devices):
        assert set(entry) == DEVICE_KEYS
        assert entry["name"] == device.name
        assert entry["backend"] == device.backend
        assert entry["vendor"] == device.vendor
        assert entry["is_gpu"] == device.is_gpu
        assert entry["shares_host_memory"] == device.shares_host_memory
        if device.backend == "opencl" and not device.is_gpu:
            # PoCL's CPU device derives its global memory from the memory available when the
            # process opens it: another process sees another figure (seen on a GPU machine,
            # 6.9 against 5.9 GB, 2026-11-27).
            assert entry["total_bytes"] > 0 and device.total_memory > 0
        else:
            assert entry["total_bytes"] == device.total_memory
        assert entry["free_source"] == device.memory_source
        assert isinstance(entry["free_bytes"], int) and 0 <= entry["free_bytes"] <= entry["total_bytes"]
        assert entry["memory_error"] is None
    host = report["devices"][-1]
    assert (host["selector"], host["zero_copy_min_bytes"]) == ("host:0", 0)
    status = dict(lazybuf.get_accelerator().backend_status)
    assert [b["backend"] for b in report["backends"]] == list(status)
    for backend in report["backends"]:
        assert set(backend) == {"backend", "available", "devices", "reason"}
        found = status[backend["backend"]]
        if isinstance(found, int) and found > 0:
            assert (backend["available"], backend["devices"], backend["reason"]) == (True, found, None)
        else:
            assert backend["available"] is False and isinstance(backend["reason"], str)


def test_devices_table_is_the_tools_plain_table():
    result = run_cli("devices")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("DEVICE  ")
    assert "\x1b" not in result.stdout
    for device in lazybuf.get_accelerator().devices:
        assert f"\n{device.selector} " in result.stdout


def test_bandwidth_json_on_the_host():
    result = run_cli("bandwidth", "--device", "host", "--max", "4KiB", "--pageable", "--time-per-point", "1ms", "--json", "-")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["schema"] == "lazybuf.bandwidth/1"
    assert report["sizes"] == [1024, 2048, 4096]
    assert len(report["measurements"]) == 3 * 2 * 2
    assert {(m["method"], m["zero_copy"]) for m in report["measurements"]} == {("lazybuf", True), ("raw", False)}
    assert "lazybuf bandwidth on host:0 (" in result.stderr


def test_check_passes_on_the_host():
    result = run_cli("check", "--device", "host", "--steps", "30", "--seed", "5")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1] == "PASS: the coherence contract holds on 1 device(s)"


def test_help_and_errors_are_the_tools():
    result = run_cli("bandwidth", "--help")
    assert result.returncode == 0
    assert "Usage: lazybuf bandwidth [OPTIONS]" in result.stdout and "Examples:" in result.stdout
    result = run_cli("watch", "--device", "tpu")
    assert result.returncode == 1
    # Without XDG_RUNTIME_DIR (scripts/test.sh sets one), Mesa's Vulkan layer says so first.
    stderr = _stderr_without_driver_notices(result.stderr)
    assert stderr.startswith('lazybuf: error: no device matches "tpu"'), result.stderr
    assert stderr.count("\n") == 1, result.stderr
    result = run_cli("frobnicate")
    assert result.returncode == 2
    assert "unrecognized subcommand" in result.stderr


def test_watch_runs_in_process_and_returns_its_status(capfd):
    # The function behind `python -m lazybuf`, called in this interpreter: it reports this
    # process's own pool.
    status = lazybuf._lazybuf._cli_main(["lazybuf", "watch", "--device", "host", "--count", "2", "--interval", "10ms"])
    assert status == 0
    lines = capfd.readouterr().out.splitlines()
    assert lines[0].startswith("TIME") and len(lines) == 3
    assert all(line.split()[1] == "host:0" for line in lines[1:])


# What pip writes for the `lazybuf` console script (pyproject.toml: lazybuf = "lazybuf.cli:main").
CONSOLE_SCRIPT = """\
import re
import sys
from lazybuf.cli import main
if __name__ == '__main__':
    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])
    sys.exit(main())
"""


def _stderr_without_driver_notices(text: str) -> str:
    noise = ("XDG_RUNTIME_DIR", "MESA", "WARNING: lavapipe")
    return "".join(line for line in text.splitlines(keepends=True) if not any(n in line for n in noise))


def test_the_console_script_is_lazybuf_cli_main():
    import tomllib
    from pathlib import Path

    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    scripts = tomllib.loads(pyproject.read_text())["project"]["scripts"]
    assert scripts == {"lazybuf": "lazybuf.cli:main"}


@pytest.mark.parametrize(
    "args",
    [
        ["devices"],
        ["devices", "--json"],
        ["watch", "--device", "host", "--count", "1"],
        ["check", "--device", "host", "--steps", "1"],
    ],
    ids=lambda a: " ".join(a[:2]),
)
def test_the_pip_installed_command_on_a_closed_stdout_ends_with_0_as_the_executable(args, tmp_path):
    """`lazybuf devices >&-` with the command pip installs: as the cargo-built executable
    (docs/CLI.md), the output goes nowhere and the status is 0, with nothing on stderr.
    (`python -m lazybuf` refuses instead: tests/python/test_hardening_edges.py.)"""
    script = tmp_path / "lazybuf"
    script.write_text(CONSOLE_SCRIPT)
    command = shlex.join([sys.executable, str(script), *args]) + " >&-"
    result = subprocess.run(["sh", "-c", "exec " + command], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result
    assert _stderr_without_driver_notices(result.stderr) == "", result.stderr


def test_a_closed_stdout_never_sends_the_output_to_the_file_that_took_its_descriptor(tmp_path):
    """With descriptor 1 closed at start, a file opened later gets it: `main()` writes to the
    null device meanwhile, and the file keeps its descriptor and gets only its own lines."""
    program = tmp_path / "prog.py"
    target = tmp_path / "mine.txt"
    program.write_text(
        "import os, sys\n"
        "f = open(sys.argv[1], 'w')\n"
        "assert f.fileno() == 1, f.fileno()\n"
        "from lazybuf.cli import main\n"
        "status = main(['devices'])\n"
        "f.write('mine\\n')\n"
        "f.close()\n"
        "sys.exit(status)\n"
    )
    command = "exec " + shlex.join([sys.executable, str(program), str(target)]) + " >&-"
    result = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result
    assert _stderr_without_driver_notices(result.stderr) == "", result.stderr
    assert target.read_text() == "mine\n"
