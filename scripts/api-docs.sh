#!/usr/bin/env bash
# Builds the Python API reference (HTML) from the installed lazybuf package's docstrings and
# its type stubs (python/lazybuf/*.pyi) with pdoc, into target/api-docs (not committed; open
# target/api-docs/index.html). docs/API.md says more.
#
# Needs the wheel installed in the virtual environment (scripts/test-python.sh builds and
# installs it, then runs this); installs pdoc there (pinned). Fails (exit 1) on any warning
# pdoc gives: a stub it cannot load, an annotation it cannot resolve, a docstring it cannot
# process (scripts/api_docs.py records them all and lists them), and on anything pdoc prints
# to stderr besides.
#
# Usage: bash scripts/api-docs.sh [OUTPUT_DIR]
#   LAZYBUF_PY_VENV   the virtual environment (default: .venv, as scripts/test-python.sh)
set -euo pipefail
cd "$(dirname "$0")/.."

venv="${LAZYBUF_PY_VENV:-.venv}"
case "$venv" in /*) ;; *) venv="$PWD/$venv" ;; esac
out="${1:-target/api-docs}"
case "$out" in /*) ;; *) out="$PWD/$out" ;; esac
py="$venv/bin/python"

if [ ! -x "$py" ]; then
  echo "api-docs: no virtual environment at $venv: run scripts/test-python.sh first" >&2
  exit 1
fi
"$py" -m pip install -q --disable-pip-version-check pdoc==16.0.0
if ! (cd tests/python && "$py" -c "import lazybuf") 2>/dev/null; then
  echo "api-docs: lazybuf is not installed in $venv: run scripts/test-python.sh first" >&2
  exit 1
fi

rm -rf "$out"
mkdir -p "$out"
stderr="$(mktemp)"
trap 'rm -f "$stderr"' EXIT
# From tests/python, so `import lazybuf` is the installed wheel, not the source tree. Python's
# own warnings (deprecations in pdoc's use of the package, say) are errors too.
status=0
(cd tests/python && "$py" -W error "$OLDPWD/scripts/api_docs.py" "$out") 2>"$stderr" || status=$?
cat "$stderr" >&2
if [ "$status" -ne 0 ]; then
  exit "$status"
fi
# Mesa's Vulkan device-select layer may print its harmless XDG_RUNTIME_DIR line when lazybuf
# looks for devices (docs/BACKENDS.md, known upstream issues); anything else is a warning.
if grep -qv '^error: XDG_RUNTIME_DIR is invalid or not set in the environment\.$' "$stderr"; then
  echo "api-docs: pdoc printed to stderr (above): treated as a warning" >&2
  exit 1
fi
