#!/usr/bin/env bash
# Measures lazybuf on a machine with an NVIDIA GPU and writes docs/benchmarks/gpu.md: CUDA
# bandwidth against raw driver copies (pinned, pageable repeated, pageable first sync), the
# pool's CUDA path, the double-buffering overlap, and the Python workflows of the seeds
# (against PyDotCompute 0.2.0 and hand-written CuPy). Meant to finish in under 8 minutes.
#
# The GPU machine may have no Rust toolchain, so there are two steps:
#   bash scripts/bench-gpu.sh build [DIR]   # here: bench binaries, the wheel, the Python
#                                           # benches and PyDotCompute's wheels into DIR
#                                           # (default .gpu-bench, git-ignored)
#   bash scripts/bench-gpu.sh run [DIR]     # there: runs them; writes DIR/gpu.md, and
#                                           # $OUT/gpu.md when $OUT is set (the device tool)
#   bash scripts/bench-gpu.sh [DIR]         # both, on a GPU machine that has cargo
# LAZYBUF_GPU_BENCHES picks parts (default "bandwidth pool spill python").
# Copy the resulting gpu.md to docs/benchmarks/gpu.md. CPU results live in docs/BENCHMARKS.md.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
mode="${1:-all}"
case "$mode" in build | run | all) shift || true ;; *) mode=all ;; esac
dir="${1:-$root/.gpu-bench}"
case "$dir" in /*) ;; *) dir="$root/$dir" ;; esac
# shellcheck source=gpu-bins.sh
. "$root/scripts/gpu-bins.sh"

build() {
    set -e
    cd "$root"
    rm -rf "$dir" && mkdir -p "$dir/bin" "$dir/wheel" "$dir/python" "$dir/deps"
    local exclude
    exclude=$(git rev-parse --git-path info/exclude)
    mkdir -p "$(dirname "$exclude")"
    grep -qx "/$(basename "$dir")/" "$exclude" 2>/dev/null || echo "/$(basename "$dir")/" >>"$exclude"
    echo "==> building the benches (release)"
    cargo bench -p lazybuf --all-features --no-run --message-format=json 2>/dev/null |
        python3 -c 'import json, sys
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and "bench" in m["target"]["kind"]:
        print(m["target"]["name"], m["executable"])' |
        while read -r name path; do cp "$path" "$dir/bin/bench-$name"; done
    echo "==> building the spilling benchmark (examples/spill_read_mostly.rs, release)"
    cargo build --release -q -p lazybuf --features wgpu --example spill_read_mostly
    cp "$root/target/release/examples/spill_read_mostly" "$dir/bin/example-spill_read_mostly"
    strip "$dir"/bin/* 2>/dev/null || true
    echo "==> packing the bench binaries into one .tar.xz (scripts/gpu-bins.sh)"
    pack_bins "$dir"
    echo "==> building the wheel (release)"
    local venv="${LAZYBUF_PY_VENV:-$root/.venv}"
    [ -x "$venv/bin/maturin" ] || { python3 -m venv "$venv" && "$venv/bin/pip" -q install maturin==1.16.0; }
    "$venv/bin/maturin" build --release --quiet --out "$dir/wheel" --interpreter "$venv/bin/python"
    cp "$root"/benches/python/*.py "$dir/python/" 2>/dev/null || true
    echo "==> PyDotCompute 0.2.0 and its dependency, for Python 3.12 (the GPU machine's)"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform any \
        -d "$dir/deps" pydotcompute==0.2.0 msgpack 2>/dev/null ||
        echo "   (could not download PyDotCompute's wheels: that comparison will be skipped)"
    git -C "$root" rev-parse --short HEAD >"$dir/commit"
    du -sh "$dir"
    set +e
}

run() {
    cd "$dir" || { echo "no $dir: run the build step first"; exit 2; }
    unpack_bins "$dir" || { echo "could not unpack $dir/bin.tar.xz"; exit 2; }
    local report="$dir/gpu.md" log="${OUT:-$dir}"
    local gpu driver
    gpu=$(nvidia-smi --query-gpu=name,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader 2>/dev/null || echo "no NVIDIA GPU found")
    driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)
    {
        echo "# lazybuf on a GPU"
        echo
        echo "Measured by \`bash scripts/bench-gpu.sh\` at commit $(cat commit 2>/dev/null || echo '?'), $(date -u +%Y-%m-%d)."
        echo "GPU: $gpu; driver ${driver:-?}; $(nproc) CPUs. Each table's goal is stated with it."
        echo
    } >"$report"

    local only=" ${LAZYBUF_GPU_BENCHES:-bandwidth pool spill python} "
    if [[ $only == *" bandwidth "* ]]; then
    echo "==> CUDA bandwidth (lazybuf syncs vs raw cuMemcpy)"
    timeout 240 bin/bench-cuda_bandwidth --bench --warm-up-time 0.2 --measurement-time 0.5 >"$log/bandwidth.log" 2>&1
    {
        echo "## Host-device bandwidth (GB/s)"
        echo
        echo "Goals from 64 MiB: pinned syncs >= 0.95 of raw pinned copies; repeated pageable syncs"
        echo ">= 0.8 of raw pinned (their host block is registered from its second transfer); the"
        echo "first pageable sync of a fresh block no slower than before (staged)."
        echo
        echo '```'
        sed -n '/GB\/s (mean/,$p' "$log/bandwidth.log"
        echo '```'
        echo
    } >>"$report"
    fi

    if [[ $only == *" pool "* ]]; then
    echo "==> pool (CUDA path) and overlap"
    timeout 120 bin/bench-pool --bench 'pool_cuda|pinned' --warm-up-time 0.2 --measurement-time 0.5 >"$log/pool.log" 2>&1
    LAZYBUF_BENCH_SIZES_MIB=4,64 LAZYBUF_BENCH_ROUNDS=20 timeout 120 bin/bench-overlap >"$log/overlap.log" 2>&1
    {
        echo "## Pool and pinned transfers"
        echo
        echo '```'
        grep -E "time:|^pool|^pinned" "$log/pool.log" | head -60
        echo '```'
        echo
        echo "## Double buffering (goal: loop <= 1.1 x the larger of transfers and host work)"
        echo
        grep "^|" "$log/overlap.log"
        echo
    } >>"$report"
    fi

    if [[ $only == *" spill "* ]]; then
    echo "==> spilling: a read-mostly loop over twice the device budget"
    timeout 180 bin/example-spill_read_mostly >"$log/spill.log" 2>&1
    {
        echo "## Spilling (examples/spill_read_mostly.rs)"
        echo
        echo "Goals: lazybuf moves the floor's bytes (1.00x; clean evictions move 0 bytes) and beats"
        echo "\"write back always\" by its extra bytes. Each visit makes a copy current on the device and"
        echo "runs no kernel, so the seconds are transfer time: the in-memory row is the no-budget cost."
        echo
        cat "$log/spill.log"
        echo
    } >>"$report"
    fi

    [[ $only == *" python "* ]] || { [ -n "${OUT:-}" ] && cp "$report" "$OUT/gpu.md"; echo "wrote $report"; return; }
    echo "==> Python workflows (lazybuf vs PyDotCompute 0.2.0 vs CuPy by hand)"
    local site
    site=$(mktemp -d)
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" wheel/*.whl deps/*.whl 2>/dev/null ||
        python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" wheel/*.whl
    if [ -f python/bench_workflows.py ]; then
        PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" timeout 240 python3 python/bench_workflows.py --reps 7 \
            >"$log/workflows.log" 2>&1
        { echo "## Python workflows (the seeds' own)"; echo; cat "$log/workflows.log"; echo; } >>"$report"
        PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" timeout 120 python3 python/bench_steps.py --reps 21 \
            >"$log/steps.log" 2>&1
        { echo "## Where a batch's time goes (bench_steps.py)"; echo; cat "$log/steps.log"; echo; } >>"$report"
        (cd python && PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" timeout 300 python3 bench_spill.py --device cuda \
            >"$log/spill-python.log" 2>&1)
        { echo "## Spilling with CuPy kernels (bench_spill.py; goals: lazybuf <= 1.25x in memory, >= 3x faster than write back always)"; echo; cat "$log/spill-python.log"; echo; } >>"$report"
        (cd python && PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" timeout 120 python3 bench_access.py \
            >"$log/access.log" 2>&1)
        { echo "## Per-call access cost (bench_access.py)"; echo; cat "$log/access.log"; echo; } >>"$report"
    else
        echo "(no benches/python/bench_workflows.py in this build)" >>"$report"
    fi
    [ -n "${OUT:-}" ] && cp "$report" "$OUT/gpu.md"
    echo "wrote $report"
}

case "$mode" in
    build) build ;;
    run) run ;;
    all) build && run ;;
esac
