#!/usr/bin/env bash
# Builds the lazybuf Python package once (maturin, release, abi3 wheel), installs it into a
# virtual environment with the test dependencies, and runs the Python tests (tests/python/).
# PyOpenCL is installed so the interop tests run against the same PoCL device as the Rust
# tests. After the first pytest pass it builds the Python API reference (scripts/api-docs.sh,
# pdoc; a warning fails it). Exits non-zero on any failure.
#
# The wheel under test is built with the crate feature `testing` (lazybuf.testing: the
# fault-injecting device, for tests/python/test_faults.py); wheels built from pyproject.toml
# alone (`pip install .`, releases) do not have it. Passes, in order: the release wheel; again
# with the CUDA driver test double; again with the coherence checker on (LAZYBUF_CHECK=1); and
# once with a debug build (overflow checks and debug assertions on), after which the release
# wheel is put back. dask[distributed] is installed for tests/python/test_dask.py; its two
# LocalCluster tests (worker processes, ~10 s) run in the first pass only
# (LAZYBUF_SKIP_CLUSTER=1 in the others).
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
  maturin==1.16.0 numpy==2.4.6 pytest==9.2.0 pyopencl==2026.1.4 ml_dtypes==0.5.4 mypy==2.4.1 \
  "dask[distributed]==2026.8.0" pdoc==16.0.0

# `--features testing`: the test wheel has lazybuf.testing (see above).
step "building the wheel (maturin, release, feature testing)"
wheels=target/wheels-python
rm -rf "$wheels"
"$venv/bin/maturin" build --release --quiet --features testing --out "$wheels" --interpreter "$venv/bin/python"
install() { "$venv/bin/python" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "$1"/lazybuf-*.whl; }
install "$wheels"

# The wheel has lazybuf.testing, and dask[distributed] is installed: their tests must run, not skip.
export LAZYBUF_REQUIRE="${LAZYBUF_REQUIRE:+$LAZYBUF_REQUIRE,}testing,dask"

# Run from the tests folder so `import lazybuf` is the installed wheel, not the source tree.
py="$venv/bin/python"
step "type stubs against the built module (mypy stubtest)"
(cd tests/python && "$py" -m mypy.stubtest lazybuf)
step "pytest tests/python"
(cd tests/python && "$py" -m pytest -q -p no:cacheprovider "$@" .)

# The Python API reference from the installed wheel's docstrings and stubs (pdoc), into
# target/api-docs; any warning fails it (docs/API.md).
step "API reference (pdoc, warnings are errors)"
LAZYBUF_PY_VENV="$venv" bash scripts/api-docs.sh

# Again with the CUDA driver test double standing in for libcuda (machines without a GPU):
# the CUDA paths (DeviceMemoryView, __cuda_array_interface__, DLPack on kDLCUDA) run, and
# everything else must still hold with a CUDA device as the default device.
if [ -f scripts/build-cuda-double.sh ] && command -v gcc >/dev/null; then
  step "pytest tests/python with the CUDA driver test double"
  double="$PWD/target/cuda-double"
  bash scripts/build-cuda-double.sh "$double" >/dev/null
  (cd tests/python && LD_LIBRARY_PATH="$double${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" LAZYBUF_SKIP_CLUSTER=1 \
    LAZYBUF_REQUIRE="${LAZYBUF_REQUIRE:+$LAZYBUF_REQUIRE,}cuda" "$py" -m pytest -q -p no:cacheprovider "$@" .)
fi

# Once more with the coherence checker on (lazybuf.checking() is True at start): every test
# that reads a buffer back must hold with the check, so no test relies on a missing
# mark_device_dirty(). Without the CUDA double, to keep it cheap (about 3 s).
step "pytest tests/python with LAZYBUF_CHECK=1"
(cd tests/python && LAZYBUF_CHECK=1 LAZYBUF_SKIP_CLUSTER=1 "$py" -m pytest -q -p no:cacheprovider "$@" .)

# Once with a debug build of the extension (no --release: overflow checks and debug
# assertions on), so arithmetic on sizes from Python that would wrap in release panics here
# instead (and a panic reaching Python fails the test). Adds one debug build (about 55 s from
# a cold target/ on 2 cores, a few seconds warm) and one pytest pass (about 3 s); the release
# wheel is put back afterwards.
step "pytest tests/python with a debug build of the extension"
debug_wheels=target/wheels-python-debug
rm -rf "$debug_wheels"
"$venv/bin/maturin" build --quiet --features testing --out "$debug_wheels" --interpreter "$venv/bin/python"
install "$debug_wheels"
(cd tests/python && LAZYBUF_SKIP_CLUSTER=1 "$py" -m pytest -q -p no:cacheprovider "$@" .)
install "$wheels"
