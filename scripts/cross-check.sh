#!/usr/bin/env bash
# Compiles and lints lazybuf for macOS and Windows from Linux: `cargo clippy -D warnings` (a
# `cargo check` plus the lints: any compile error fails it) of lazybuf, lazybuf-cli and
# lazybuf-py, with every feature, for aarch64-apple-darwin and x86_64-pc-windows-msvc. Nothing
# is linked or run: this proves the code compiles there, not that it works (README: which
# platforms have run).
#
# Libraries and binaries only: the tests and benches depend on criterion, whose `alloca`
# build script needs a C compiler for the target (Apple's SDK, MSVC), which Linux lacks.
#
# The standard library for those targets comes from rustup (`rustup target add`, done here
# when missing on CI machines, where CI is set). Where rustup has no such targets and cannot
# fetch them (a machine that downloads only from the package registries), the script falls
# back to Debian's rustc-web toolchain and its
# standard library sources (`apt-get download`, unpacked under target/, nothing installed),
# and builds the targets' std from source with -Zbuild-std.
#
# Usage: bash scripts/cross-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."

targets=(aarch64-apple-darwin x86_64-pc-windows-msvc)
packages=(-p lazybuf -p lazybuf-cli -p lazybuf-py)
# Separate from the host build: other targets never share its artifacts anyway.
target_dir="$PWD/target/cross"

missing=()
for t in "${targets[@]}"; do
  rustup target list --installed 2>/dev/null | grep -qx "$t" || missing+=("$t")
done
# On CI machines (CI set) rustup fetches missing targets; elsewhere nothing is downloaded from
# outside the package registries, and the Debian fallback below is used.
if [ "${#missing[@]}" -gt 0 ] && [ -n "${CI:-}" ]; then
  rustup target add "${missing[@]}" || true
fi
have_targets=1
for t in "${targets[@]}"; do
  rustup target list --installed 2>/dev/null | grep -qx "$t" || have_targets=0
done

# Both targets in one cargo call: one job queue keeps both cores busy to the end (two calls in
# turn each leave a core idle while their last crates compile).
target_args=()
for t in "${targets[@]}"; do target_args+=(--target "$t"); done

if [ "$have_targets" = 1 ]; then
  echo "cargo clippy ${target_args[*]}"
  cargo clippy "${packages[@]}" --all-features "${target_args[@]}" --target-dir "$target_dir" -- -D warnings
  exit 0
fi

# --- fallback: Debian's rustc-web and its std sources, -Zbuild-std ---------------------------
echo "rustup has no std for ${targets[*]} here; using Debian's rustc-web with -Zbuild-std"
toolchain="$PWD/target/cross-toolchain"
root="$toolchain/usr"
if [ ! -x "$root/bin/clippy-driver" ]; then
  command -v apt-get >/dev/null || { echo "no rustup targets and no apt-get: cannot cross-check" >&2; exit 1; }
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  apt-cache show rust-web-src >/dev/null 2>&1 || $sudo apt-get update -qq
  libstd=$(apt-cache depends libstd-rust-web-dev | sed -n 's/^ *Depends: \(libstd-rust-web-[0-9.]*\)$/\1/p' | head -n 1)
  llvm=$(apt-cache depends "$libstd" | sed -n 's/^ *Depends: \(libllvm[0-9]*\)$/\1/p' | head -n 1)
  rm -rf "$toolchain"
  mkdir -p "$toolchain/debs"
  # apt-get download writes to the current directory (as root it warns about the _apt sandbox).
  (cd "$toolchain/debs" && apt-get download -q rustc-web rust-web-clippy rust-web-src libstd-rust-web-dev "$libstd" "$llvm" 2>&1 |
    grep -v "^W: Download is performed unsandboxed" || true)
  for deb in "$toolchain"/debs/*.deb; do dpkg-deb -x "$deb" "$toolchain"; done
  rm -rf "$toolchain/debs"
  # -Zbuild-std looks for the sources in the sysroot.
  mkdir -p "$root/lib/rustlib/src"
  ln -sfn "$(ls -d "$root"/src/rustc-*)" "$root/lib/rustlib/src/rust"
fi
export LD_LIBRARY_PATH="$root/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export RUSTC="$root/bin/rustc" RUSTDOC="$root/bin/rustdoc" RUSTC_BOOTSTRAP=1
"$RUSTC" --version
echo "cargo clippy ${target_args[*]} (Debian rustc-web, -Zbuild-std)"
"$root/bin/cargo-clippy" clippy -Zbuild-std=std,panic_abort "${packages[@]}" --all-features "${target_args[@]}" \
  --target-dir "$target_dir" -- -D warnings
