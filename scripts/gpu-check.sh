#!/usr/bin/env bash
# The GPU checks that fit one short lease of a GPU machine (about 9 minutes of a 15-minute
# device budget), from what `scripts/test-gpu.sh build` packed here (.gpu, git-ignored) plus
# PyDotCompute's wheels in .gpu/bench-deps (`bash scripts/gpu-check.sh deps` here):
#   1. the seeds' workflows against hand-written CuPy and PyDotCompute (bench_workflows.py) and
#      where a batch's time goes (bench_steps.py), first, while the GPU is otherwise idle, and
#      the 4 KiB rows again with 20 ms repetitions;
#   2. what a child process sees of the devices (scripts/child_devices.py); every Rust test
#      binary with CUDA required, four at a time, beside the Python suite (three shards) with
#      the coherence checker on;
#   3. compute-sanitizer memcheck over the CUDA async suite (caching off, leak check on).
# Run there as `bash scripts/gpu-check.sh`, with `.gpu` carried. Writes $OUT/summary.txt,
# $OUT/gpu-check.md (the bench tables) and $OUT/logs.tar.gz (every log), refreshed after each
# part so a run stopped at its limit still brings back what it did. LAZYBUF_GPU_CHECK_PARTS
# picks parts (default "bench test memcheck"); LAZYBUF_GPU_CHECK_PYTEST_S the Python suite's
# limit in seconds per shard (default 220), LAZYBUF_GPU_CHECK_PY_SHARDS how many shards run at
# once (default 3). For the whole suites and every benchmark, use scripts/test-gpu.sh and
# scripts/bench-gpu.sh.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=gpu-bins.sh
. "$root/scripts/gpu-bins.sh"
if [ "${1:-}" = deps ]; then
    mkdir -p "$root/.gpu/bench-deps"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform any \
        -d "$root/.gpu/bench-deps" pydotcompute==0.2.0 msgpack
    exit
fi
out="${OUT:-$root/.gpu-check}"
logs=$(mktemp -d)
mkdir -p "$out"
parts=" ${LAZYBUF_GPU_CHECK_PARTS:-bench test memcheck} "
summary="$out/summary.txt"
failed=0
note() { echo "$*" | tee -a "$summary"; }
pack_logs() { tar -czf "$out/logs.tar.gz" -C "$logs" . 2>/dev/null; }

: >"$summary"
note "lazybuf $(cat "$root/.gpu/commit" 2>/dev/null || echo '?') on $(hostname), $(date -u +%Y-%m-%dT%H:%MZ)"
note "$(nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current \
    --format=csv,noheader 2>/dev/null || echo 'nvidia-smi: not found')"
python3 -c 'import cupy, numpy; print("CuPy", cupy.__version__, "NumPy", numpy.__version__)' 2>&1 | tee -a "$summary"

# One site for the Python parts: the wheel with the testing feature (the tests need it; the
# benches run the same code), PyOpenCL, dask and PyDotCompute where carried.
site=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$root"/.gpu/wheel/*.whl ||
    note "the wheel did not install"
for extra in "$root"/.gpu/deps "$root"/.gpu/dask "$root"/.gpu/bench-deps; do
    ls "$extra"/*.whl >/dev/null 2>&1 &&
        { python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$extra"/*.whl ||
            note "wheels of $(basename "$extra") did not install"; }
done
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

if [[ $parts == *" bench "* ]]; then
    report="$out/gpu-check.md"
    echo "# GPU check at $(cat "$root/.gpu/commit" 2>/dev/null || echo '?'), $(date -u +%Y-%m-%d)" >"$report"
    (cd "$root/benches/python" && timeout 170 python3 bench_workflows.py --reps 7) >"$logs/workflows.log" 2>&1
    note "bench_workflows rc=$?"
    { echo; echo "## Python workflows (bench_workflows.py --reps 7)"; echo; cat "$logs/workflows.log"; } >>"$report"
    # The 4 KiB rows again with 20 ms repetitions: on 2026-11-28 the batch loop measured 0.71
    # of CuPy in the table and 0.86 timed alone (docs/benchmarks/gpu.md).
    (cd "$root/benches/python" && timeout 60 python3 bench_workflows.py --sizes 4KiB --reps 11 --min-ms 20) \
        >"$logs/workflows-4k.log" 2>&1
    note "bench_workflows 4 KiB, 20 ms repetitions rc=$?"
    { echo; echo "## The 4 KiB rows with 20 ms repetitions (bench_workflows.py --sizes 4KiB --reps 11 --min-ms 20)"; echo; cat "$logs/workflows-4k.log"; } >>"$report"
    (cd "$root/benches/python" && timeout 50 python3 bench_steps.py --reps 11) >"$logs/steps.log" 2>&1
    note "bench_steps rc=$?"
    { echo; echo "## Where a batch's time goes (bench_steps.py --reps 11)"; echo; cat "$logs/steps.log"; } >>"$report"
    pack_logs
fi

if [[ $parts == *" test "* ]]; then
    # What a child process sees of the devices (NVIDIA's OpenCL went missing in children here).
    note "$(timeout 300 python3 "$root/scripts/child_devices.py" 2>&1)"
    unpack_bins "$root/.gpu" || note "could not unpack .gpu/bin.tar.xz"
    export LAZYBUF_REQUIRE=cuda LAZYBUF_REQUIRE_CUDA=1 PROPTEST_CASES="${PROPTEST_CASES:-128}"
    # The Python suite as LAZYBUF_GPU_CHECK_PY_SHARDS shards at once (tests/python/conftest.py's
    # LAZYBUF_PY_SHARD): one process took 218 s for 2,100 tests on an H200, and it has grown.
    shards=${LAZYBUF_GPU_CHECK_PY_SHARDS:-3}
    pids=()
    : >"$logs/pytest.rc"
    for ((k = 0; k < shards; k++)); do
        (cd "$root/.gpu/tests" && LAZYBUF_CHECK=1 LAZYBUF_PY_SHARD="$k/$shards" \
            timeout "${LAZYBUF_GPU_CHECK_PYTEST_S:-220}" python3 -m pytest -q -rs -p no:cacheprovider \
            --basetemp="$(mktemp -d)/shard-$k" . >"$logs/pytest-checker-$k.log" 2>&1
            echo "pytest shard $k/$shards (checker on) rc=$? $(tail -1 "$logs/pytest-checker-$k.log")" >>"$logs/pytest.rc") &
        pids+=($!)
    done
    # Four binaries at a time, the whole part within 220 s (a binary cut off shows rc=124).
    # shellcheck disable=SC2016
    # The CLI's tests run the command-line binary from the path it was built at (place_cli).
    # no_runtime hides the OpenCL vendor files (as root) and cuda_gpu measures the GPU's free
    # memory: beside the others they made the Python suite's child processes miss NVIDIA's
    # OpenCL and the free memory move (an H200, 2026-11-27), so they run alone afterwards.
    cli_skip='/test-cli$'
    if place_cli "$root/.gpu"; then cli_skip='^$'; else
        note "the CLI's tests skipped (no lazybuf binary at its build path)"; fi
    alone="test-no_runtime test-cuda_gpu"
    ls "$root"/.gpu/bin/test-* | grep -v -e "$cli_skip" -e '/test-no_runtime$' -e '/test-cuda_gpu$' | timeout 220 xargs -P 4 -I{} bash -c \
        'n=$(basename {}); timeout 200 {} --test-threads=4 >"$0/$n.log" 2>&1; rc=$?;
         echo "$n rc=$rc $(grep -E "^test result:" "$0/$n.log" | tail -1 | sed "s/; finished.*//")"' "$logs" \
        >"$logs/rust.rc"
    wait "${pids[@]}"
    for n in $alone; do
        [ -x "$root/.gpu/bin/$n" ] || continue
        timeout 120 "$root/.gpu/bin/$n" --test-threads=1 >"$logs/$n.log" 2>&1
        echo "$n rc=$? $(grep -E "^test result:" "$logs/$n.log" | tail -1 | sed "s/; finished.*//")" >>"$logs/rust.rc"
    done
    sort "$logs/rust.rc" | tee -a "$summary"
    tee -a "$summary" <"$logs/pytest.rc"
    grep -q "rc=[^0]" "$logs/rust.rc" "$logs/pytest.rc" && failed=1
    pack_logs
fi

if [[ $parts == *" memcheck "* ]] && command -v compute-sanitizer >/dev/null && [ -x "$root/.gpu/bin/test-cuda_async" ]; then
    LAZYBUF_CACHE=0 timeout 60 compute-sanitizer --tool memcheck --leak-check full --error-exitcode 1 \
        "$root/.gpu/bin/test-cuda_async" --test-threads=1 >"$logs/memcheck-cuda_async.log" 2>&1
    rc=$?
    note "memcheck cuda_async rc=$rc $(grep -E 'ERROR SUMMARY' "$logs/memcheck-cuda_async.log" | tail -1)"
    [ "$rc" -eq 0 ] || failed=1
    pack_logs
fi

[ "$failed" -eq 0 ] && note "all GPU checks passed" || note "SOME GPU CHECKS FAILED (logs.tar.gz)"
exit "$failed"
