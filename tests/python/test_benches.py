"""The Python benchmark scripts (`benches/python`) still run against the package: each with its
smallest settings, on the host device (PoCL where a script needs kernels), checked for a clean
exit and its table's last row (the callgrind scripts run outside callgrind: their toggle, built
with gcc on first use, does nothing there). They measure nothing here; they broke silently before
(`bench_trace.py` passed a selector where `bench_workflows.lazybuf_cases` had come to expect a
device, and its documented command raised: the fifteenth session)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import lazybuf

BENCHES = Path(__file__).resolve().parents[2] / "benches" / "python"

# (script and arguments, what the output's last line starts with; None: no output to check)
SCRIPTS = [
    (["bench_trace.py", "--device", "host", "--reps", "1", "--sizes", "4KiB", "--workflow", "batch, pool"], "| batch, pool | 4KiB |"),
    (["bench_trace.py", "--device", "host", "--reps", "1", "--sizes", "4KiB"], "| batch, new buffer | 4KiB |"),
    (["bench_workflows.py", "--device", "host", "--reps", "1", "--sizes", "4KiB", "--min-ms", "0.2"], "| double buffering"),
    (["bench_steps.py", "--device", "host", "--reps", "1", "--sizes", "4KiB"], "| **sum** |"),
    (["bench_host_copy.py", "--reps", "1", "--sizes", "4KiB"], "| 4KiB |"),
    (["bench_read_back.py", "--device", "host", "--sizes", "64KiB", "--reps", "1"], "| 64KiB |"),
    (["trace_workflow.py", "host", "2", "on"], None),
    (["batch_steps.py", "lazybuf", "host", "2", "3"], None),
    (["batch_steps.py", "numpy", "host", "2", "3"], None),
    (["batch_loops.py", "lazybuf", "host", "3"], None),
]


def _run(args: list[str]) -> subprocess.CompletedProcess:
    # The lazybuf under test, wherever it is installed (a wheel's target directory, a venv).
    package_root = str(Path(lazybuf.__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "OPENBLAS_NUM_THREADS": "1"}
    env.pop("TRACE", None)
    return subprocess.run(
        [sys.executable, *args], cwd=BENCHES, capture_output=True, text=True, timeout=300, env=env
    )


@pytest.mark.parametrize("args,last", SCRIPTS, ids=[" ".join(a[:2]) for a, _ in SCRIPTS])
def test_a_benchmark_script_runs(args, last):
    done = _run(args)
    assert done.returncode == 0, done.stdout + done.stderr
    if last is not None:
        assert done.stdout.strip().splitlines()[-1].startswith(last), done.stdout


def test_the_spill_benchmark_runs_on_a_device_with_kernels():
    if not any(d.backend == "opencl" for d in lazybuf.get_accelerator().devices):
        pytest.skip("no OpenCL device: the spill benchmark's kernels need PyOpenCL or CuPy")
    pytest.importorskip("pyopencl")
    done = _run(["bench_spill.py", "--device", "opencl", "--buffers", "2", "--mib", "1", "--visits", "4", "--passes", "1"])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "lazybuf" in done.stdout, done.stdout
