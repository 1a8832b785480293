#!/usr/bin/env bash
# Installs what is missing, then runs every lazybuf test: formatting and lints, the Rust suites
# on the host device, on a real OpenCL runtime (PoCL's CPU device) and on a real Vulkan driver
# through wgpu (Mesa's lavapipe), the CUDA backend through the CUDA driver test double, and the
# Python package's tests. Fails on any failure.
#
# Usage: bash scripts/test.sh        (from anywhere; needs no input)
set -euo pipefail
cd "$(dirname "$0")/.."

# Each step says how long the run has taken so far, so a slow step is plain in CI's log.
step() { printf '\n==> [%dm%02ds] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*"; }

# --- system packages: PoCL (OpenCL on the CPU), the ICD loader, lavapipe (Vulkan on the CPU) and
# the Vulkan loader, valgrind --------------------------------------------------------------------
missing=()
for pkg in pocl-opencl-icd ocl-icd-opencl-dev clinfo mesa-vulkan-drivers libvulkan1 valgrind; do
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
# The run needs about 4 GB of disk (docs/TESTING.md); say what there is, so a full disk is plain.
df -h . | tail -n 1
ls /usr/share/vulkan/icd.d/
# Mesa's device-select Vulkan layer prints "error: XDG_RUNTIME_DIR is invalid or not set" on
# stderr whenever a process opens Vulkan without that variable, as on a CI machine; give it a
# private runtime directory, as a login session would, so tools' stderr is their own.
if [ -z "${XDG_RUNTIME_DIR:-}" ]; then
  XDG_RUNTIME_DIR="$(mktemp -d)"
  chmod 700 "$XDG_RUNTIME_DIR"
  export XDG_RUNTIME_DIR
fi

# --- Rust: lints, one build, then the test binaries from that build ---------------------------
# A missing OpenCL or wgpu (lavapipe) device is a failure here, not a smaller test run; so is a
# missing loopback device (the test-only backend the `testing` feature registers).
export LAZYBUF_REQUIRE=opencl,wgpu,loopback
export PROPTEST_CASES="${PROPTEST_CASES:-2000}"
# One build per run: incremental caches would only add ~1.5 GB of disk (CI machines' disks can
# be small; see docs/RELIABILITY.md).
export CARGO_INCREMENTAL=0

step "cargo fmt --check"
cargo fmt --all -- --check
step "cargo clippy (all targets, all features)"
cargo clippy --workspace --all-targets --all-features -- -D warnings
# The libraries and binaries as users build them, with default features: code only the
# `testing` feature uses must be gated by it (a release wheel warned of six such functions).
step "cargo clippy (libraries and binaries, default features)"
cargo clippy --workspace --lib --bins -- -D warnings
# macOS and Windows: compiled and linted, not run (about 5 min from a cold target/cross on 2
# cores when the targets' std is built from source, seconds warm; docs/RELEASING.md).
step "scripts/cross-check.sh: clippy for aarch64-apple-darwin and x86_64-pc-windows-msvc (compiled, not run)"
bash scripts/cross-check.sh
step "cargo doc (all features, private items too: the module docs' links; warnings are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --all-features --no-deps --document-private-items
step "build the tests once"
cargo test --workspace --all-features --no-run
step "Rust tests: host, OpenCL (PoCL) and wgpu (lavapipe)"
cargo test --workspace --all-features
# The CLI's tests again as on a machine with no font (an H200 machine had none, and three of its
# plot tests failed there): LAZYBUF_PLOT_FONT naming no file is what finding no font is. From
# the build above (`--test` names; the core's `trace` and `hostile20` run again too).
step "the CLI's tests again, with no font"
LAZYBUF_PLOT_FONT=/nonexistent/no-font.ttf cargo test --workspace --all-features --test cli --test trace --test hostile20

# The numbered examples (crates/lazybuf/examples/0*.rs), from the build above, on every device
# kind they run on: each asserts what it shows.
step "examples: 01-05 on the host, PoCL and lavapipe"
examples=$(cargo test --workspace --all-features --no-run --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and "example" in m["target"]["kind"] and m["target"]["name"][:1] == "0":
        print(m["executable"])' | sort)
[ "$(echo "$examples" | wc -w)" -ge 5 ] || { echo "expected 5 numbered examples, found: $examples"; exit 1; }
for example in $examples; do
  for device in host opencl wgpu; do
    echo "$(basename "$example") on $device"
    LAZYBUF_DEVICE=$device "$example" >/dev/null
  done
done

step "scripts/test-cuda-double.sh: the Rust suite again on the CUDA driver test double"
# Without the doctests, which ran above: rustdoc compiles them anew each time (about 35 s).
# (`--tests`, not `--lib`: that would build the Python binding's library, which has no tests.)
bash scripts/test-cuda-double.sh --tests

# --- valgrind: the contract, fault, pool and adopted-memory suites, with the host, PoCL, lavapipe and the CUDA double
# With lavapipe too (about 25 s more on 2 cores; one suppression for a leak inside the driver).
step "valgrind: contract, faults, pool, adopted (0 errors; definite leaks count as errors), beside release.sh"
double="$PWD/target/cuda-double"
# The suites are modules of the `suite` test binary (crates/lazybuf/tests/suite/), from the
# workspace build above (the same command: no second build); each runs on its own, picked by
# its module's name (`contract::` matches only the tests of tests/suite/contract.rs).
suite=$(cargo test --workspace --all-features --no-run --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "suite":
        print(m["executable"])')
[ -x "$suite" ] || { echo "no suite test binary found: $suite" >&2; exit 1; }
# Each valgrind run is one thread (valgrind serializes a process's threads): all four run at
# once, each into its own log, printed when it ends. They run beside release.sh's build (the
# faults run alone takes as long as the other three together, which would leave a core idle),
# and are waited for after it.
vg_logs="$(mktemp -d)"
vg_pids=()
for module in contract faults pool adopted; do
  LD_LIBRARY_PATH="$double${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" LAZYBUF_REQUIRE=opencl,cuda,wgpu \
    valgrind -q --suppressions=scripts/valgrind.supp --error-exitcode=1 --leak-check=full --show-leak-kinds=definite \
    --errors-for-leak-kinds=definite "$suite" --test-threads=1 -q "$module::" >"$vg_logs/$module.log" 2>&1 &
  vg_pids+=("$!:$module")
done

# The release artifacts as users get them: the sdist and the manylinux_2_28 abi3 wheel (zig
# links against glibc 2.28), checked with auditwheel, licences, stubs and console script
# (about 4 min from cold on 2 cores, seconds warm). The Python tests then run on that very
# wheel (where this machine can load it: x86_64 Linux), and on a debug build of the extension
# with the `testing` feature, which reuses the dependencies the Rust test build compiled.
step "scripts/release.sh: sdist and manylinux_2_28 wheel, auditwheel"
bash scripts/release.sh target/release-check

step "valgrind: the four runs"
vg_failed=0
for entry in "${vg_pids[@]}"; do
  rc=0
  wait "${entry%%:*}" || rc=$?
  echo "valgrind ${entry#*:}: exit status $rc"
  cat "$vg_logs/${entry#*:}.log"
  [ "$rc" -eq 0 ] || vg_failed=1
done
rm -rf "$vg_logs"
[ "$vg_failed" -eq 0 ] || { echo "valgrind found errors (above)" >&2; exit 1; }

host_target=$(rustc -vV | sed -n 's/^host: //p')
release_wheel=""
if [ "$host_target" = x86_64-unknown-linux-gnu ]; then
  release_wheel=$(ls target/release-check/lazybuf-*manylinux_2_28_x86_64*.whl 2>/dev/null || true)
fi

step "scripts/test-python.sh"
LAZYBUF_PY_RELEASE_WHEEL="$release_wheel" bash scripts/test-python.sh

step "all tests passed"
