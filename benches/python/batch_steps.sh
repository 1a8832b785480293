#!/usr/bin/env bash
# Instructions per step of a 4 KiB batch of the seeds' loop (issue 24, item 3), counted by
# callgrind: for k = 1..5 steps (construct+drop, host write, .device, mark_device_dirty,
# to_numpy) the batch runs LO and HI times; (Ir(HI) - Ir(LO)) / (HI - LO) is the cost of a
# batch of k steps, and the difference between k and k-1 is step k's. NumPy's host work
# (allocate, write, copy out) is counted the same way.
#
# Usage: bash benches/python/batch_steps.sh DEVICE [PYTHONPATH]   (DEVICE: host, opencl)
#   PYTHONPATH: where the lazybuf to count is installed (default: the interpreter's own)
#   PYTHON (default .venv/bin/python), LO (100), HI (1100)
set -euo pipefail
cd "$(dirname "$0")"
device="$1"
export PYTHONPATH="${2:-}"
python="${PYTHON:-../../.venv/bin/python}"
lo="${LO:-100}" hi="${HI:-1100}"
export PYTHONHASHSEED=0  # the same dict layouts in every run: counts that differ only by the batches
ir() { valgrind --tool=callgrind --callgrind-out-file=/dev/null "$python" batch_loops.py "$@" 2>&1 | awk '/Collected/ {print $4}'; }
per_batch() { local a b; a=$(ir "$1" "$device" "$lo" "$2"); b=$(ir "$1" "$device" "$hi" "$2"); echo $(( (b - a) / (hi - lo) )); }
if [ "$device" = numpy ]; then
  names=("allocate (np.empty)" "write (a[:] = data)" "copy out (a.copy())")
  prev=0
  for k in 1 2 3; do c=$(per_batch numpy "$k"); echo "numpy | ${names[k-1]} | $((c - prev)) | cumulative $c"; prev=$c; done
  exit 0
fi
names=("construct + drop" "host write (copy_from)" ".device" "mark_device_dirty" "to_numpy")
prev=0
for k in 1 2 3 4 5; do c=$(per_batch new "$k"); echo "$device | ${names[k-1]} | $((c - prev)) | cumulative $c"; prev=$c; done
