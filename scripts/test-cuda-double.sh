#!/usr/bin/env bash
# Runs lazybuf's test suite with the CUDA driver-API TEST DOUBLE loaded in place of libcuda,
# so every code path of the CUDA backend runs on machines without a GPU (CI). Builds the
# double first (needs gcc). LAZYBUF_REQUIRE_CUDA=1 turns "no CUDA device, skipped" into a
# failure, so a double that did not load cannot pass silently. Extra arguments go to
# `cargo test`, e.g. `scripts/test-cuda-double.sh --test cuda_faults`.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
out="$root/target/cuda-double"
scripts/build-cuda-double.sh "$out"
export LD_LIBRARY_PATH="$out${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LAZYBUF_REQUIRE_CUDA=1
# The generic suites (contract, model, faults) must find the CUDA devices too, and the tests
# that need the double itself (cuda_situations) must find it.
export LAZYBUF_REQUIRE="${LAZYBUF_REQUIRE:+$LAZYBUF_REQUIRE,}cuda,cuda-double"
cargo test --workspace --all-features "$@"
