# Sourced by scripts/test-gpu.sh and scripts/bench-gpu.sh: the binaries a GPU machine runs travel
# as one .tar.xz. Stripped, each lazybuf binary is ~6-9 MB (wgpu and ash are in every one): the
# 23 test binaries are ~190 MB, over the 64 MiB a GPU machine is sent in one call. They share most
# of their code, so one xz stream (its 64 MiB window spans several binaries) takes them to
# ~17 MB. Python's tarfile does both ends, so neither machine needs the xz tool.

# pack_bins DIR: DIR/bin -> DIR/bin.tar.xz (about 2 minutes for the test binaries).
pack_bins() {
    python3 - "$1" <<'PY'
import pathlib, shutil, sys, tarfile
d = pathlib.Path(sys.argv[1])
with tarfile.open(d / "bin.tar.xz", "w:xz", preset=9) as archive:
    archive.add(d / "bin", arcname="bin")
shutil.rmtree(d / "bin")
PY
}

# unpack_bins DIR: DIR/bin.tar.xz -> DIR/bin, unless DIR/bin is there already.
unpack_bins() {
    [ -d "$1/bin" ] || [ ! -f "$1/bin.tar.xz" ] && return 0
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1] + "/bin.tar.xz").extractall(sys.argv[1], filter="data")' "$1"
}

# place_cli DIR: the CLI's tests start the `lazybuf` binary from the path it was built at
# (`CARGO_BIN_EXE_lazybuf`, compiled in), which the GPU machine lacks: the build step packs the
# binary as DIR/bin/lazybuf and its path as DIR/cli-path, and this puts it there (as root) when
# nothing is. Returns non-zero when the CLI's tests cannot run.
place_cli() {
    local want
    want=$(cat "$1/cli-path" 2>/dev/null) && [ -n "$want" ] && [ -x "$1/bin/lazybuf" ] || return 1
    [ -e "$want" ] && return 0
    mkdir -p "$(dirname "$want")" && cp "$1/bin/lazybuf" "$want"
}
