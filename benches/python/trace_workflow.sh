#!/usr/bin/env bash
# The event recorder's cost on the seeds' batch workflow as the seed writes it (pool, host
# write, the work on the device copy, read-back, release: trace_workflow.py), in instructions
# per 4 KiB batch counted by callgrind, recorder off and on, in one run of this script.
# Prints: device | kernel | off | on | on - off | (on - off) / off.
#
# Usage: bash benches/python/trace_workflow.sh DEVICE [PYTHONPATH]
#   DEVICE: host or opencl; PYTHONPATH: where the lazybuf to count is installed
#   PYTHON (default .venv/bin/python), BATCHES (default 200), KERNEL (on, off or both: default both),
#   ELEMENTS (float32 elements per batch, default 1024: 4 KiB)
set -euo pipefail
cd "$(dirname "$0")"
device="$1"
export PYTHONPATH="${2:-}"
export PYTHONHASHSEED=0 OPENBLAS_NUM_THREADS=1
python="${PYTHON:-../../.venv/bin/python}"
batches="${BATCHES:-200}"
ir() {
  valgrind --tool=callgrind --collect-atstart=no --callgrind-out-file=/dev/null \
    "$python" trace_workflow.py "$@" 2>&1 | awk '/Collected/ {print $4}'
}
kernels="${KERNEL:-both}"
[ "$kernels" = both ] && kernels="on off"
for kernel in $kernels; do
  declare -A per
  for trace in off on; do
    base=$(TRACE=$trace ir "$device" 0 "$kernel")
    count=$(TRACE=$trace ir "$device" "$batches" "$kernel")
    per[$trace]=$(( (count - base) / batches ))
  done
  d=$(( per[on] - per[off] ))
  echo "$device | kernel $kernel | ${per[off]} | ${per[on]} | $d | $(awk "BEGIN {printf \"%+.1f%%\", 100 * $d / ${per[off]}}")"
done
