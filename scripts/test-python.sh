#!/usr/bin/env bash
# Installs the lazybuf Python package into a virtual environment with the test dependencies and
# runs the Python tests (tests/python/) against two builds of the extension:
#   - the release wheel as users get it (maturin, release, abi3; no `testing` feature): given
#     as LAZYBUF_PY_RELEASE_WHEEL (scripts/test.sh passes release.sh's manylinux wheel, so the
#     artifact that ships is the one tested and nothing is compiled again), else built here;
#   - a debug build of the extension with the crate feature `testing` (lazybuf.testing: the
#     fault-injecting device and the loopback devices, for test_faults.py and
#     test_loopback.py): debug assertions and overflow checks on, at cargo's test profile's
#     opt-level 1, so after `cargo test` (scripts/test.sh) it reuses the dependencies that
#     build compiled. Installed into a directory of its own, first on PYTHONPATH.
# PyOpenCL is installed so the interop tests run against the same PoCL device as the Rust
# tests. mypy stubtest checks the stubs against the debug build (the stubs cover
# lazybuf.testing too). Two pytest passes: the release wheel (the tests of lazybuf.testing
# skip), and the debug build with the CUDA driver test double standing in for libcuda and the
# coherence checker on (LAZYBUF_CHECK=1), run as two shards at once (LAZYBUF_PY_SHARD,
# tests/python/conftest.py), one per core. Each process has its own pytest temporary
# directory; its output is printed whole when it ends. It
# builds the Python API reference (scripts/api-docs.sh, pdoc; a warning fails it).
# dask[distributed] is installed for tests/python/test_dask.py; its two LocalCluster tests
# (worker processes, ~10 s) run in the first pass only (LAZYBUF_SKIP_CLUSTER=1 in the others).
# Then the release wheel's pass again under the newest CPython >= 3.12 found, in .venv-newer.
# Exits non-zero on any failure.
#
# Usage: bash scripts/test-python.sh [pytest args...]
#   LAZYBUF_PY_VENV          the virtual environment to use or create (default: .venv)
#   PYTHON                   the interpreter that creates it (default: python3; needs >= 3.11)
#   LAZYBUF_PY_RELEASE_WHEEL the release wheel to test (default: built here into
#                            target/wheels-python, with LAZYBUF_PY_BUILD's arguments)
#   LAZYBUF_PY_BUILD         extra `maturin build` arguments for a release wheel built here
#   LAZYBUF_PY_SERIAL=1      run the passes one after another
#   LAZYBUF_PY_NEWER         the CPython >= 3.12 that runs the release wheel's pass again
#                            (default: the newest found; `none` skips that pass)
set -euo pipefail
cd "$(dirname "$0")/.."

venv="${LAZYBUF_PY_VENV:-.venv}"
case "$venv" in /*) ;; *) venv="$PWD/$venv" ;; esac
python="${PYTHON:-python3}"
start=$SECONDS
step() { printf '\n==> [%dm%02ds] %s\n' $(((SECONDS - start) / 60)) $(((SECONDS - start) % 60)) "$*"; }

if [ ! -x "$venv/bin/python" ]; then
  step "creating $venv"
  "$python" -m venv "$venv"
fi
step "installing build and test dependencies into $venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check \
  maturin==1.16.0 numpy==2.4.6 pytest==9.2.0 pyopencl==2026.1.4 ml_dtypes==0.5.4 mypy==2.4.1 \
  "dask[distributed]==2026.8.0" pdoc==16.0.0

# The release wheel: release.sh's, or one built here as `pip install .` builds it.
wheel="${LAZYBUF_PY_RELEASE_WHEEL:-}"
if [ -z "$wheel" ]; then
  step "building the release wheel (maturin, release)"
  wheels=target/wheels-python
  rm -rf "$wheels"
  # shellcheck disable=SC2086 # LAZYBUF_PY_BUILD is a list of arguments
  "$venv/bin/maturin" build --release --quiet --out "$wheels" --interpreter "$venv/bin/python" ${LAZYBUF_PY_BUILD:-}
  wheel=$(ls "$wheels"/lazybuf-*.whl)
fi
step "installing $wheel"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "$wheel"

# dask[distributed] is installed: its tests must run, not skip (and, in the debug build's
# passes, lazybuf.testing's).
export LAZYBUF_REQUIRE="${LAZYBUF_REQUIRE:+$LAZYBUF_REQUIRE,}dask"

py="$venv/bin/python"
# One pass: `run_pass NAME [VAR=value...]` runs pytest from tests/python (so `import lazybuf`
# is the installed wheel, not the source tree) with those variables, output to its log.
logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT
run_pass() {
  local name="$1"
  shift
  (cd tests/python && env "$@" "$py" -m pytest -q -p no:cacheprovider --basetemp="$logs/$name.tmp" \
    "${pytest_args[@]}" .) >"$logs/$name.log" 2>&1
}
pytest_args=("$@")
failed=()
# Starts a pass in the background (or runs it now with LAZYBUF_PY_SERIAL=1).
pids=()
names=()
start_pass() {
  if [ "${LAZYBUF_PY_SERIAL:-0}" = 1 ]; then
    step "pytest tests/python: $1"
    run_pass "$@" || failed+=("$1")
    cat "$logs/$1.log"
    return
  fi
  run_pass "$@" &
  pids+=($!)
  names+=("$1")
}
# Waits for the passes started, prints each one's output, notes failures.
finish_passes() {
  for i in "${!pids[@]}"; do
    local rc=0
    wait "${pids[$i]}" || rc=$?
    step "pytest tests/python: ${names[$i]}"
    cat "$logs/${names[$i]}.log"
    [ "$rc" -eq 0 ] || failed+=("${names[$i]}")
  done
  pids=()
  names=()
}

step "pytest pass: the release wheel"
(cd tests/python && "$py" -c "
import lazybuf
assert not hasattr(lazybuf, 'testing'), 'the release wheel has lazybuf.testing'")
start_pass release

# The debug build (no --release: debug assertions and overflow checks on), so arithmetic on
# sizes from Python that would wrap in release panics here instead (and a panic reaching Python
# fails the test). (Not cargo's `test` profile itself: a cdylib built with it is a test
# harness, which Python cannot load.) The dev profile is given the test profile's opt-level 1
# (Cargo.toml's [profile.test]; debug assertions and overflow checks stay on, as in any dev
# build), so after `cargo test`'s build (scripts/test.sh) the dependencies it compiled are
# reused (wgpu, naga...: only lazybuf's crates, pyo3 and the dependencies only the binding
# has compile, 1:49 instead of 3:42 on the 2-core VM), and the passes run optimized code.
step "building the debug extension (feature testing, opt-level 1)"
debug_wheels=target/wheels-python-debug
debug_site="$logs/debug-site"
rm -rf "$debug_wheels"
# `lazybuf/tracing` too: the core crate then has the features the workspace test build gave it
# (`--all-features`), so its library is reused from that build rather than compiled again
# (about 30 s; the binding's other dependencies differ in features and compile anyway).
CARGO_PROFILE_DEV_OPT_LEVEL=1 "$venv/bin/maturin" build --quiet --features testing,lazybuf/tracing --out "$debug_wheels" \
  --interpreter "$venv/bin/python"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps --target "$debug_site" "$debug_wheels"/lazybuf-*.whl
debug_path="$debug_site${PYTHONPATH:+:$PYTHONPATH}"
(cd tests/python && PYTHONPATH="$debug_path" "$py" -c "
import lazybuf, sys
assert lazybuf.__file__.startswith(sys.argv[1]), f'the debug build is not the one imported: {lazybuf.__file__}'
assert hasattr(lazybuf, 'testing'), 'the debug build has no lazybuf.testing'" "$debug_site")

step "type stubs against the debug build (mypy stubtest)"
(cd tests/python && PYTHONPATH="$debug_path" "$py" -m mypy.stubtest --allowlist stubtest-allowlist.txt --ignore-unused-allowlist lazybuf)

# The CUDA driver test double stands in for libcuda (machines without a GPU): the CUDA paths
# (DeviceMemoryView, __cuda_array_interface__, DLPack on kDLCUDA) run, and everything else
# must still hold with a CUDA device as the default device.
double=""
if [ -f scripts/build-cuda-double.sh ] && command -v gcc >/dev/null; then
  double="$PWD/target/cuda-double"
  bash scripts/build-cuda-double.sh "$double" >/dev/null
fi
# One pass over the debug build, with the coherence checker on (lazybuf.checking() is True at
# start: every test that reads a buffer back must hold with the check, so no test relies on a
# missing mark_device_dirty()) and the CUDA double's device present (everything must hold with
# a CUDA device among the devices; the release pass has none). One pass where there were two
# (the double, and the checker without it): the same tests, once, split in two shards that run
# at once, about 1 minute sooner on 2 cores.
step "pytest pass: the debug build${double:+ with the CUDA driver test double,} with LAZYBUF_CHECK=1 (two shards)"
debug_env=(LAZYBUF_CHECK=1 LAZYBUF_SKIP_CLUSTER=1 PYTHONPATH="$debug_path")
if [ -n "$double" ]; then
  debug_env+=(LD_LIBRARY_PATH="$double${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" LAZYBUF_REQUIRE="$LAZYBUF_REQUIRE,testing,cuda")
else
  debug_env+=(LAZYBUF_REQUIRE="$LAZYBUF_REQUIRE,testing")
fi
start_pass debug-shard-0 "${debug_env[@]}" LAZYBUF_PY_SHARD=0/2
start_pass debug-shard-1 "${debug_env[@]}" LAZYBUF_PY_SHARD=1/2

# The Python API reference from the debug build's docstrings and stubs (pdoc; lazybuf.testing
# included), into target/api-docs; any warning fails it (docs/API.md).
step "API reference (pdoc, warnings are errors)"
PYTHONPATH="$debug_path" LAZYBUF_PY_VENV="$venv" bash scripts/api-docs.sh
finish_passes

# The abi3 release wheel again under the newest other CPython >= 3.12 found (on PATH or in
# pyenv's versions; LAZYBUF_PY_NEWER names one, `none` skips): the wheel claims every Python
# from 3.11, and twice a GPU machine's Python 3.12 found what 3.11 hides (PEP 688's buffer
# protocol, PEP 669's opcode tracing). Its own environment, .venv-newer by default.
newer="${LAZYBUF_PY_NEWER:-}"
if [ -z "$newer" ]; then
  for candidate in $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.1[2-9]*/bin/python 2>/dev/null | sort -V) \
    $(command -v python3.12 python3.13 python3.14 2>/dev/null); do
    "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null && newer="$candidate"
  done
fi
if [ -n "$newer" ] && [ "$newer" != none ]; then
  newer_venv="${LAZYBUF_PY_NEWER_VENV:-$PWD/.venv-newer}"
  step "pytest pass: the release wheel under $("$newer" --version) ($newer)"
  [ -x "$newer_venv/bin/python" ] || "$newer" -m venv "$newer_venv"
  "$newer_venv/bin/python" -m pip install -q --disable-pip-version-check \
    numpy==2.4.6 pytest==9.2.0 pyopencl==2026.1.4 ml_dtypes==0.5.4 "dask[distributed]==2026.8.0"
  "$newer_venv/bin/python" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "$wheel"
  py="$newer_venv/bin/python"
  run_pass release-newer LAZYBUF_SKIP_CLUSTER=1 || failed+=("release-newer")
  cat "$logs/release-newer.log"
else
  step "no CPython >= 3.12 found: the release wheel ran under $("$py" --version) only"
fi

if [ "${#failed[@]}" -gt 0 ]; then
  echo "pytest failed in: ${failed[*]}" >&2
  exit 1
fi
step "the Python tests passed"
