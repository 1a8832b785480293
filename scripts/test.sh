#!/usr/bin/env bash
# Installs what is missing, then runs every lazybuf test: formatting and lints, the Rust suites
# on the host device and on a real OpenCL runtime (PoCL's CPU device), the CUDA backend
# through the CUDA driver test double, and the Python package's tests. Fails on any failure.
#
# Usage: bash scripts/test.sh        (from anywhere; needs no input)
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

# --- system packages: PoCL (OpenCL on the CPU) and the ICD loader ---------------------------
missing=()
for pkg in pocl-opencl-icd ocl-icd-opencl-dev clinfo; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
  step "installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
clinfo -l

# --- Rust: lints, one build, then the test binaries from that build ---------------------------
# A missing OpenCL device is a failure here, not a smaller test run.
export LAZYBUF_REQUIRE=opencl
export PROPTEST_CASES="${PROPTEST_CASES:-2000}"

step "cargo fmt --check"
cargo fmt --all -- --check
step "cargo clippy (all targets, all features)"
cargo clippy --workspace --all-targets --all-features -- -D warnings
step "build the tests once"
cargo test --workspace --all-features --no-run
step "Rust tests: host and OpenCL (PoCL)"
cargo test --workspace --all-features

for extra in scripts/test-cuda-double.sh scripts/test-python.sh; do
  if [ -f "$extra" ]; then
    step "$extra"
    bash "$extra"
  fi
done

step "all tests passed"
