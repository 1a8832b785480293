#!/usr/bin/env bash
# Instructions per step of a 4 KiB batch of the seeds' loop, counted by
# callgrind around each step alone (batch_steps.py; the toggles' own cost, step 0, is
# subtracted). Prints one line per step: device | step | instructions per batch. On opencl,
# each line also splits the step (batch_split.py): | PoCL's share | PyOpenCL's share |
# lazybuf's own, and the last line compares lazybuf's own side with NumPy's host work when
# NUMPY (NumPy's whole batch, from `batch_steps.sh numpy`) is set.
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
profiles=$(mktemp -d)
trap 'rm -rf "$profiles"' EXIT
# Collected instructions of one run; its main thread's profile is left in $profiles/last.
ir() {
  rm -f "$profiles"/cg.*
  valgrind --tool=callgrind --collect-atstart=no --separate-threads=yes \
    --callgrind-out-file="$profiles/cg.%p" "$python" batch_steps.py "$@" 2>&1 | awk '/Collected/ {print $4}'
  mv "$(ls "$profiles"/cg.*-01)" "$profiles/last"
}
if [ "$device" = numpy ]; then
  loop=numpy selector=host names=("allocate (np.empty)" "write (a[:] = data)" "copy out (a.copy())" "drop")
else
  loop=lazybuf selector="$device"
  names=("construct" "host write (copy_from)" ".device" "mark_device_dirty" "to_numpy" "drop")
fi
ir "$loop" "$selector" 0 "$batches" > "$profiles/base"
base=$(cat "$profiles/base")
total=0 own_total=0
for k in $(seq 1 "${#names[@]}"); do
  ir "$loop" "$selector" "$k" "$batches" > "$profiles/count"
  c=$(( ($(cat "$profiles/count") - base) / batches ))
  total=$((total + c))
  if [ "$device" = opencl ]; then
    shares=$("$python" batch_split.py "$profiles/last" "$batches")
    own=$((c - ${shares% | *} - ${shares#* | }))
    own_total=$((own_total + own))
    echo "$device | ${names[k-1]} | $c | $shares | $own"
  else
    echo "$device | ${names[k-1]} | $c"
  fi
done
if [ "$device" = opencl ]; then
  echo "$device | whole batch | $total | | | $own_total"
  if [ -n "${NUMPY:-}" ]; then
    echo "$device | lazybuf's own side / NumPy's host work | $(awk "BEGIN {printf \"%.3f\", $own_total / $NUMPY}")x"
  fi
else
  echo "$device | whole batch | $total"
fi
