#!/usr/bin/env bash
# Instructions per step of a 4 KiB batch of the seeds' loop, counted by
# callgrind around each step alone (batch_steps.py; the toggles' own cost, step 0, is
# subtracted). Prints one line per step: device | step | instructions per batch.
#
# Usage: bash benches/python/batch_steps.sh DEVICE [PYTHONPATH]
#   DEVICE: host, opencl (lazybuf's steps) or numpy (NumPy's own host work)
#   PYTHONPATH: where the lazybuf to count is installed (default: the interpreter's own)
#   PYTHON (default .venv/bin/python), BATCHES (300), TRACE (on: the event recorder runs)
set -euo pipefail
cd "$(dirname "$0")"
device="$1"
export PYTHONPATH="${2:-}"
export PYTHONHASHSEED=0
python="${PYTHON:-../../.venv/bin/python}"
batches="${BATCHES:-300}"
ir() {
  valgrind --tool=callgrind --collect-atstart=no --callgrind-out-file=/dev/null \
    "$python" batch_steps.py "$@" 2>&1 | awk '/Collected/ {print $4}'
}
if [ "$device" = numpy ]; then
  loop=numpy selector=host names=("allocate (np.empty)" "write (a[:] = data)" "copy out (a.copy())" "drop")
else
  loop=lazybuf selector="$device"
  names=("construct" "host write (copy_from)" ".device" "mark_device_dirty" "to_numpy" "drop")
fi
base=$(ir "$loop" "$selector" 0 "$batches")
total=0
for k in $(seq 1 "${#names[@]}"); do
  c=$(( ($(ir "$loop" "$selector" "$k" "$batches") - base) / batches ))
  total=$((total + c))
  echo "$device | ${names[k-1]} | $c"
done
echo "$device | whole batch | $total"
