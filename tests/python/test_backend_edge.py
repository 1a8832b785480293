"""The binding asks the core about backends instead of matching on them.

Backend facts (handles as integers, the CUDA ordinal, the DLPack device of each memory kind)
are answered by the core (``crates/lazybuf/src/backend/info.rs`` and each backend's
``DeviceInfo``), with exhaustive matches there: a new backend then fails to compile until it
answers them. A match on a backend in ``crates/lazybuf-py/src`` compiles for a new backend and
silently gives it a wrong answer (handle 0), so this test fails on any such match outside the
allowlist below. Each allowlisted line says why it cannot ask the core.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "crates" / "lazybuf-py" / "src"

# What matches a backend: a variant of the core's raw-handle enums, a backend kind constant,
# or a path into one backend's folder.
BACKEND_MATCH = re.compile(
    r"Raw(Memory|Device|Stream)::(Cuda|OpenCl|Wgpu|Host|Loopback)"
    r"|BackendKind::(CUDA|OPENCL|WGPU|HOST|LOOPBACK)"
    r"|backend::(cuda|opencl|wgpu|loopback)::"
)

# (file, text the line contains) -> why it stays. Matching by text rather than by line
# number keeps the list valid when code moves; a new match fails even in an allowlisted file.
ALLOWED: dict[tuple[str, str], str] = {
    ("device_view.rs", "if let (RawMemory::OpenCl(_), RawDevice::OpenCl { .. }) = (handle, raw_device)"): (
        "PyOpenCL-specific: PyOpenCL wraps OpenCL handles only (Buffer.from_int_ptr, "
        "CommandQueue.from_int_ptr)"
    ),
}


def backend_matches() -> list[tuple[str, int, str]]:
    found = []
    for path in sorted(SRC.glob("*.rs")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if BACKEND_MATCH.search(line):
                found.append((path.name, number, line.strip()))
    return found


def allowed(name: str, line: str) -> bool:
    return any(name == file and text in line for file, text in ALLOWED)


@pytest.mark.skipif(not SRC.is_dir(), reason="the binding's sources are not beside the tests")
def test_the_binding_does_not_match_on_backends() -> None:
    stray = [f"{name}:{number}: {line}" for name, number, line in backend_matches() if not allowed(name, line)]
    assert not stray, (
        "the binding matches on a backend; ask the core instead (RawMemory::as_int, "
        "RawDevice::context_int/queue_int/stream_from_int/memory_from_int, DeviceInfo::ordinal, "
        "DeviceInfo::dlpack_device), or allowlist the line with a reason:\n" + "\n".join(stray)
    )


@pytest.mark.skipif(not SRC.is_dir(), reason="the binding's sources are not beside the tests")
def test_every_allowlisted_line_still_exists() -> None:
    lines = [(name, line) for name, _, line in backend_matches()]
    stale = [f"{file}: {text}" for file, text in ALLOWED if not any(n == file and text in ln for n, ln in lines)]
    assert not stale, "allowlisted lines that no longer match (remove them):\n" + "\n".join(stale)


@pytest.mark.skipif(not SRC.is_dir(), reason="the binding's sources are not beside the tests")
def test_no_binding_file_names_the_test_only_backend() -> None:
    """The loopback backend (test_loopback.py) runs through the binding untouched: its proof
    that a new backend is its folder and one registry line."""
    named = [
        f"{path.name}:{number}"
        for path in sorted(SRC.glob("*.rs"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if "loopback" in line.lower()
    ]
    assert not named, f"binding lines naming the loopback backend: {named}"


@pytest.mark.skipif(not SRC.is_dir(), reason="the binding's sources are not beside the tests")
def test_the_binding_does_not_call_a_runtime_itself() -> None:
    """Runtime calls live in the core's backend folders: the binding depends on no runtime
    crate (the Dask receive path copies through the core, from borrowed memory)."""
    import tomllib

    manifest = tomllib.loads((SRC.parent / "Cargo.toml").read_text(encoding="utf-8"))
    dependencies = set(manifest.get("dependencies", {})) | set(manifest.get("dev-dependencies", {}))
    runtimes = dependencies & {"cudarc", "cl3", "wgpu", "ash"}
    assert not runtimes, f"lazybuf-py depends on runtime crates: {sorted(runtimes)}"
    assert "lazybuf" in dependencies, "the manifest was not read"
