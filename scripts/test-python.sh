#!/usr/bin/env bash
# Builds the lazybuf Python package once (maturin, release, abi3 wheel), installs it into a
# virtual environment with the test dependencies, and runs the Python tests (tests/python/).
# PyOpenCL is installed so the interop tests run against the same PoCL device as the Rust
# tests. Exits non-zero on any failure.
#
# Usage: bash scripts/test-python.sh [pytest args...]
#   LAZYBUF_PY_VENV   the virtual environment to use or create (default: .venv)
#   PYTHON            the interpreter that creates it (default: python3; needs >= 3.11)
set -euo pipefail
cd "$(dirname "$0")/.."

venv="${LAZYBUF_PY_VENV:-.venv}"
case "$venv" in /*) ;; *) venv="$PWD/$venv" ;; esac
python="${PYTHON:-python3}"
step() { printf '\n==> %s\n' "$*"; }

if [ ! -x "$venv/bin/python" ]; then
  step "creating $venv"
  "$python" -m venv "$venv"
fi
step "installing build and test dependencies into $venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check \
  maturin==1.16.0 numpy==2.4.6 pytest==9.2.0 pyopencl==2026.1.4 ml_dtypes==0.5.4 mypy==2.4.1

step "building the wheel (maturin, release)"
wheels=target/wheels-python
rm -rf "$wheels"
"$venv/bin/maturin" build --release --quiet --out "$wheels" --interpreter "$venv/bin/python"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "$wheels"/lazybuf-*.whl

# Run from the tests folder so `import lazybuf` is the installed wheel, not the source tree.
py="$venv/bin/python"
step "type stubs against the built module (mypy stubtest)"
(cd tests/python && "$py" -m mypy.stubtest lazybuf)
step "pytest tests/python"
(cd tests/python && "$py" -m pytest -q -p no:cacheprovider "$@" .)

# Again with the CUDA driver test double standing in for libcuda (machines without a GPU):
# the CUDA paths (DeviceMemoryView, __cuda_array_interface__, DLPack on kDLCUDA) run, and
# everything else must still hold with a CUDA device as the default device.
if [ -f scripts/build-cuda-double.sh ] && command -v gcc >/dev/null; then
  step "pytest tests/python with the CUDA driver test double"
  double="$PWD/target/cuda-double"
  bash scripts/build-cuda-double.sh "$double" >/dev/null
  (cd tests/python && LD_LIBRARY_PATH="$double${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    LAZYBUF_REQUIRE="${LAZYBUF_REQUIRE:+$LAZYBUF_REQUIRE,}cuda" "$py" -m pytest -q -p no:cacheprovider "$@" .)
fi
