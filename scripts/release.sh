#!/usr/bin/env bash
# Builds lazybuf's Linux release artifacts into dist/ and checks them:
#   - the sdist (maturin sdist): the Rust workspace, the Python sources, README, licences;
#   - abi3 wheels (CPython 3.11 and later) for manylinux_2_28 x86_64, and aarch64 where the
#     Rust target aarch64-unknown-linux-gnu is installed (`rustup target add
#     aarch64-unknown-linux-gnu`): built with `maturin build --zig`, which links against
#     glibc 2.28's symbols through zig (the `ziglang` PyPI package) whatever the build
#     machine's glibc is, so the wheels install on any manylinux_2_28 system (RHEL 8+,
#     Debian 10+, Ubuntu 18.10+);
#   - `auditwheel show` on each wheel: it must be manylinux_2_28-compatible and bundle or need
#     no shared library beyond the manylinux set (libOpenCL, libcuda and the Vulkan loader
#     are opened at run time, never linked);
#   - the licence files, the type stubs and the `lazybuf` console script are in every wheel,
#     and the licence files in the sdist.
# macOS and Windows wheels are built by .github/workflows/release.yml (docs/RELEASING.md).
#
# Usage: bash scripts/release.sh [OUT]      (OUT defaults to dist/; it is emptied first)
#   LAZYBUF_RELEASE_VENV  the virtual environment with maturin, ziglang and auditwheel
#                         (default: .release-venv; created when missing)
#   LAZYBUF_RELEASE_ARCHS the architectures to build (default: x86_64, plus aarch64 when its
#                         Rust target is installed)
set -euo pipefail
cd "$(dirname "$0")/.."

out="${1:-dist}"
venv="${LAZYBUF_RELEASE_VENV:-.release-venv}"
step() { printf '\n==> %s\n' "$*"; }
start=$SECONDS

if [ ! -x "$venv/bin/python" ]; then
  step "creating $venv"
  "${PYTHON:-python3}" -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check maturin==1.16.0 ziglang==0.14.1 auditwheel==6.8.2
# maturin finds zig as `python3 -m ziglang`: the environment's interpreter comes first.
case "$venv" in /*) ;; *) venv="$PWD/$venv" ;; esac
export PATH="$venv/bin:$PATH"

# The crates' licence files are copies of the root's (cargo packages each crate on its own):
# they must not drift.
for crate in crates/*/; do
  for licence in LICENSE-MIT LICENSE-APACHE; do
    cmp -s "$licence" "$crate$licence" || { echo "$crate$licence differs from ./$licence" >&2; exit 1; }
  done
done

archs="${LAZYBUF_RELEASE_ARCHS:-x86_64}"
if [ -z "${LAZYBUF_RELEASE_ARCHS:-}" ] && rustup target list --installed 2>/dev/null | grep -qx aarch64-unknown-linux-gnu; then
  archs="x86_64 aarch64"
fi

rm -rf "$out"
mkdir -p "$out"
step "sdist"
"$venv/bin/maturin" sdist --out "$out"

for arch in $archs; do
  step "abi3 wheel for manylinux_2_28 $arch (maturin --zig)"
  "$venv/bin/maturin" build --release --zig --compatibility manylinux_2_28 \
    --target "$arch-unknown-linux-gnu" --out "$out"
done
if [[ " $archs " != *" aarch64 "* ]]; then
  echo "(no aarch64 wheel: the Rust target aarch64-unknown-linux-gnu is not installed)"
fi

step "checking the artifacts"
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
sdist=$(ls "$out"/lazybuf-*.tar.gz)
listing=$(tar -tzf "$sdist")
for file in LICENSE-MIT LICENSE-APACHE README.md pyproject.toml crates/lazybuf/LICENSE-MIT python/lazybuf/py.typed; do
  grep -q "^lazybuf-$version/$file\$" <<<"$listing" || { echo "$sdist lacks $file" >&2; exit 1; }
done
echo "$sdist: $(wc -l <<<"$listing") files, licences included"
for wheel in "$out"/lazybuf-*.whl; do
  "$venv/bin/auditwheel" show "$wheel" | tee "$out/.auditwheel"
  # (auditwheel wraps its lines: join them first.)
  tr -s ' \n' '  ' <"$out/.auditwheel" | grep -q 'is consistent with the following platform tag: "manylinux_2_28_' ||
    { echo "$wheel is not manylinux_2_28" >&2; exit 1; }
  rm "$out/.auditwheel"
  contents=$("$venv/bin/python" -m zipfile -l "$wheel" | awk 'NR > 1 { print $1 }')
  for file in "lazybuf-$version.dist-info/licenses/LICENSE-MIT" "lazybuf-$version.dist-info/licenses/LICENSE-APACHE" \
    "lazybuf-$version.dist-info/entry_points.txt" lazybuf/_lazybuf.pyi lazybuf/py.typed lazybuf/cli.py; do
    grep -qx "$file" <<<"$contents" || { echo "$wheel lacks $file" >&2; exit 1; }
  done
  "$venv/bin/python" -m zipfile -e "$wheel" "$out/.check" >/dev/null
  grep -Eq '^lazybuf ?= ?lazybuf\.cli:main$' "$out/.check/lazybuf-$version.dist-info/entry_points.txt" ||
    { echo "$wheel has no lazybuf console script" >&2; exit 1; }
  rm -rf "$out/.check"
  echo "$wheel: licences, stubs and the lazybuf console script included"
done

step "done in $((SECONDS - start)) s"
ls -l "$out"
