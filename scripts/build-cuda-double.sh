#!/usr/bin/env bash
# Builds the CUDA driver-API TEST DOUBLE (crates/lazybuf/tests/cuda_double) as libcuda.so.1
# (plus a libcuda.so link) in OUT_DIR, default target/cuda-double, and a variant lacking one
# entry point in OUT_DIR/old-driver. Put OUT_DIR first in LD_LIBRARY_PATH and cudarc loads
# the double instead of a real driver. Needs gcc.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root/target/cuda-double}"
src="$root/crates/lazybuf/tests/cuda_double/cuda_double.c"
build() { # build DIR [extra gcc flags]
    mkdir -p "$1"
    gcc -std=c11 -D_POSIX_C_SOURCE=200809L -O2 -Wall -Wextra -Werror -shared -fPIC \
        -fvisibility=hidden -pthread -Wl,-soname,libcuda.so.1 "${@:2}" -o "$1/libcuda.so.1" "$src"
    ln -sf libcuda.so.1 "$1/libcuda.so"
}
build "$out"
build "$out/old-driver" -DLAZYBUF_CUDA_DOUBLE_OLD_DRIVER
echo "built $out/libcuda.so.1 and $out/old-driver/libcuda.so.1 (lazybuf CUDA test double)"
