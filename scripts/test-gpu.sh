#!/usr/bin/env bash
# Runs every lazybuf test on a machine with an NVIDIA GPU: each Rust test binary with CUDA
# required (LAZYBUF_REQUIRE=cuda), the Python suite with CuPy, and compute-sanitizer memcheck
# over the CUDA suites, then prints one summary table. Exits non-zero on any failure.
#
# The GPU machine may have no Rust toolchain, so there are two steps:
#   bash scripts/test-gpu.sh build [DIR]   # here: test binaries, the wheel and the Python
#                                          # tests into DIR (default .gpu, git-ignored)
#   bash scripts/test-gpu.sh run [DIR]     # there: runs what DIR holds (needs python3 with
#                                          # numpy and pytest; CuPy and compute-sanitizer if
#                                          # present, else those parts say they were skipped)
#   bash scripts/test-gpu.sh [DIR]         # both, on a GPU machine that has cargo
#
# Environment: PROPTEST_CASES (default 1000), LAZYBUF_GPU_TIMEOUT per binary in seconds
# (default 300), LAZYBUF_GPU_MEMCHECK=0 to leave compute-sanitizer out. Logs go to $OUT when it is set (the device tool's output folder), else DIR/logs.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
mode="${1:-all}"
case "$mode" in build | run | all) shift || true ;; *) mode=all ;; esac
dir="${1:-$root/.gpu}"
case "$dir" in /*) ;; *) dir="$root/$dir" ;; esac
# shellcheck source=gpu-bins.sh
. "$root/scripts/gpu-bins.sh"

build() {
    set -e
    cd "$root"
    rm -rf "$dir" && mkdir -p "$dir/bin" "$dir/wheel" "$dir/tests"
    local exclude
    exclude=$(git rev-parse --git-path info/exclude)
    mkdir -p "$(dirname "$exclude")"
    grep -qx "/$(basename "$dir")/" "$exclude" 2>/dev/null || echo "/$(basename "$dir")/" >>"$exclude"
    echo "==> building the test binaries (all features)"
    cargo test --workspace --all-features --no-run --message-format=json 2>/dev/null |
        python3 -c 'import collections, json, sys
found = []
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        crate = m["manifest_path"].rsplit("/", 2)[-2]
        found.append((m["target"]["name"], crate, m["target"]["kind"][0], m["executable"]))
# A name two targets share (the core library and the CLI binary are both `lazybuf`, two crates
# have a `trace` test) is qualified by crate and kind, so neither overwrites the other.
count = collections.Counter(name for name, *_ in found)
for name, crate, kind, path in found:
    print(name if count[name] == 1 else f"{crate}-{name}-{kind}", path)' |
        while read -r name path; do cp "$path" "$dir/bin/test-$name"; done
    # The CLI's tests start this binary from its build path (scripts/gpu-bins.sh, place_cli).
    cp "$root/target/debug/lazybuf" "$dir/bin/lazybuf" && echo "$root/target/debug/lazybuf" >"$dir/cli-path"
    strip --strip-debug "$dir"/bin/* 2>/dev/null || true
    echo "==> packing the test binaries into one .tar.xz (about 2 minutes; scripts/gpu-bins.sh)"
    pack_bins "$dir"
    echo "==> building the wheel (release, with the testing feature)"
    local venv="${LAZYBUF_PY_VENV:-$root/.venv}"
    [ -x "$venv/bin/maturin" ] || { python3 -m venv "$venv" && "$venv/bin/pip" -q install maturin==1.16.0; }
    "$venv/bin/maturin" build --release --quiet --features testing --out "$dir/wheel" --interpreter "$venv/bin/python"
    cp -r "$root/tests/python/." "$dir/tests/"
    rm -rf "$dir/tests/.mypy_cache" "$dir/tests/__pycache__"   # caches stubtest and pytest left here
    echo "==> PyOpenCL and its dependencies for Python 3.12 (the GPU machine's), for NVIDIA's OpenCL"
    mkdir -p "$dir/deps"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform any -d "$dir/deps" pyopencl platformdirs pytools siphash24 2>/dev/null ||
        echo "   (could not download PyOpenCL: its interop tests will be skipped there)"
    echo "==> dask[distributed] and its dependencies for Python 3.12, for tests/python/test_dask.py"
    mkdir -p "$dir/dask"
    python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform any -d "$dir/dask" "dask[distributed]==2026.8.0" 2>/dev/null ||
        echo "   (could not download dask: its tests will be skipped there)"
    git -C "$root" rev-parse --short HEAD >"$dir/commit"
    du -sh "$dir"
    set +e
}

declare -a summary=()
failed=0
note() { summary+=("$1|$2|$3"); }

run_binary() { # run_binary NAME PATH LOG
    local name=$1 path=$2 log=$3 rc
    timeout "${LAZYBUF_GPU_TIMEOUT:-300}" "$path" --test-threads=4 --nocapture >"$log" 2>&1
    rc=$?
    local result
    result=$(grep -E "^test result:" "$log" | tail -1 | sed 's/test result: //; s/; finished.*//')
    local skipped
    skipped=$(grep -c "^SKIPPED" "$log")
    [ "$rc" -eq 0 ] || failed=1
    note "$name" "$([ "$rc" -eq 0 ] && echo pass || echo "FAIL (rc $rc)")" "${result:-no result line}; $skipped skip notices"
}

run() {
    cd "$dir" || { echo "no $dir: run the build step first"; exit 2; }
    unpack_bins "$dir" || { echo "could not unpack $dir/bin.tar.xz"; exit 2; }
    local logs="${OUT:-$dir/logs}"
    mkdir -p "$logs"
    echo "lazybuf $(cat commit 2>/dev/null || echo '?') on $(hostname), $(date -u +%Y-%m-%dT%H:%MZ)"
    nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current \
        --format=csv,noheader 2>/dev/null || echo "nvidia-smi: not found (no NVIDIA GPU here?)"
    export LAZYBUF_REQUIRE=cuda LAZYBUF_REQUIRE_CUDA=1 PROPTEST_CASES="${PROPTEST_CASES:-1000}"
    place_cli "$dir" || echo "no lazybuf binary at its build path: the CLI's tests will fail"
    for path in bin/test-*; do
        local name=${path#bin/test-}
        echo "==> $name"
        run_binary "$name" "$path" "$logs/$name.log"
    done

    echo "==> Python suite (CuPy if installed)"
    local site
    site=$(mktemp -d)
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" wheel/*.whl
    # PyOpenCL (carried as wheels) where the machine lacks it, for NVIDIA's OpenCL device.
    if ! python3 -c 'import pyopencl' 2>/dev/null && ls deps/*.whl >/dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" deps/*.whl ||
            note "pytest" "note" "PyOpenCL wheels did not install"
    fi
    # dask[distributed] (carried as wheels) where the machine lacks it: the Dask serializers,
    # the cuda family with real device memory, and the LocalCluster tests.
    if ! python3 -c 'import distributed' 2>/dev/null && ls dask/*.whl >/dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" dask/*.whl ||
            note "pytest" "note" "dask wheels did not install: test_dask.py skipped"
    fi
    # Twice: as it is, and with the coherence checker on (as scripts/test.sh does on the CPU).
    for check in 0 1; do
        local log="$logs/pytest.log"
        [ "$check" = 1 ] && log="$logs/pytest-checker.log"
        (cd tests && PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 LAZYBUF_CHECK=$check \
            timeout 600 python3 -m pytest -q -rs -p no:cacheprovider . >"$log" 2>&1)
        local rc=$?
        [ "$rc" -eq 0 ] || failed=1
        note "pytest$([ "$check" = 1 ] && echo ' (checker on)')" "$([ "$rc" -eq 0 ] && echo pass || echo "FAIL (rc $rc)")" "$(tail -1 "$log")"
    done
    if python3 -c 'import cupy' 2>/dev/null; then :; else note "pytest" "note" "CuPy is not installed: CuPy interop tests skipped"; fi

    if [ "${LAZYBUF_GPU_MEMCHECK:-1}" = 0 ]; then
        note "memcheck" "skipped" "LAZYBUF_GPU_MEMCHECK=0"
    elif command -v compute-sanitizer >/dev/null; then
        # Caching off, so every allocation is freed before exit and a leak is a leak.
        # cuda, contract and streams are modules of the suite binary (crates/lazybuf/tests/suite/),
        # picked by their module's name; the others are binaries of their own.
        for name in cuda cuda_gpu cuda_async checker contract streams; do
            local binary="bin/test-$name" filter=()
            if [ ! -x "$binary" ] && [ -x bin/test-suite ]; then
                binary=bin/test-suite
                filter=("$name::")
            fi
            [ -x "$binary" ] || continue
            echo "==> compute-sanitizer memcheck $name"
            LAZYBUF_CACHE=0 PROPTEST_CASES=50 timeout 600 compute-sanitizer --tool memcheck --leak-check full \
                --error-exitcode 1 "$binary" --test-threads=1 "${filter[@]}" >"$logs/memcheck-$name.log" 2>&1
            rc=$?
            [ "$rc" -eq 0 ] || failed=1
            note "memcheck $name" "$([ "$rc" -eq 0 ] && echo pass || echo "FAIL (rc $rc)")" \
                "$(grep -E "ERROR SUMMARY" "$logs/memcheck-$name.log" | tail -1)"
        done
    else
        note "memcheck" "skipped" "compute-sanitizer is not on PATH"
    fi

    echo
    echo "| what | result | detail |"
    echo "|---|---|---|"
    for line in "${summary[@]}"; do
        IFS='|' read -r what result detail <<<"$line"
        echo "| $what | $result | $detail |"
    done
    echo
    [ "$failed" -eq 0 ] && echo "all GPU tests passed" || echo "SOME GPU TESTS FAILED (logs in $logs)"
    return "$failed"
}

case "$mode" in
    build) build ;;
    run) run ;;
    all) build && run ;;
esac
