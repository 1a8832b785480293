#!/usr/bin/env bash
# Benchmarks lazybuf's Python API against the published pydotcompute 0.2.0 (from PyPI) and
# plain NumPy, side by side in one process; prints a markdown table with ratios.
# Uses its own virtual environment (.bench-venv) so pydotcompute never enters the test venv.
#
# Usage: bash scripts/bench-python.sh [--reps N]
#        bash scripts/bench-python.sh workflows [--device SEL] [--reps N] [--sizes 4KiB,4MiB,64MiB]
#          the seeds' workflows (benches/python/bench_workflows.py) against PyDotCompute and the
#          same work by hand with PyOpenCL (OpenCL devices) or CuPy (CUDA devices, if installed)
#   LAZYBUF_BENCH_VENV   the virtual environment to use or create (default: .bench-venv)
#   PYTHON               the interpreter that creates it (default: python3; needs >= 3.11)
set -euo pipefail
cd "$(dirname "$0")/.."

venv="${LAZYBUF_BENCH_VENV:-.bench-venv}"
case "$venv" in /*) ;; *) venv="$PWD/$venv" ;; esac
python="${PYTHON:-python3}"
step() { printf '\n==> %s\n' "$*" >&2; }

if [ ! -x "$venv/bin/python" ]; then
  step "creating $venv"
  "$python" -m venv "$venv"
fi
step "installing pydotcompute 0.2.0, NumPy and maturin into $venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check \
  pydotcompute==0.2.0 numpy==2.4.6 maturin==1.16.0 pyopencl==2026.1.4

step "building the lazybuf wheel (maturin, release)"
wheels=target/wheels-bench
rm -rf "$wheels"
"$venv/bin/maturin" build --release --quiet --out "$wheels" --interpreter "$venv/bin/python" >&2
"$venv/bin/python" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "$wheels"/lazybuf-*.whl

step "benchmark"
cd benches/python
if [ "${1:-}" = workflows ]; then
  shift
  exec "$venv/bin/python" bench_workflows.py "$@"
fi
exec "$venv/bin/python" bench_vs_pydotcompute.py "$@"
