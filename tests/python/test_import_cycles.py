"""No import circles between the modules of the Rust crates (the core and the binding).

A module that imports another which imports it back is one design split over two files;
such circles made the binding hard to change before they were cut. This test resolves every
``crate::``, ``super::`` and ``self::`` path in each crate's sources to the module it names
and fails on any strongly connected group of modules outside the allowlist: a class and its
own serializer (the binding's ``buffer`` and ``wire``) and the closed family of memory
objects (``memory``, ``device_buffer`` and ``foreign``, which converts between them).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

CRATES = Path(__file__).resolve().parents[2] / "crates"

ALLOWED = {
    "lazybuf-py": [{"buffer", "wire"}, {"device_buffer", "foreign", "memory"}],
    "lazybuf": [],
    "lazybuf-cli": [],
}

PATH = re.compile(r"\b((?:crate|super|self)(?:::[A-Za-z_][A-Za-z0-9_]*)+)")
GROUP = re.compile(r"\b((?:crate|super|self)(?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{([^}]*)\}")


def modules(src: Path) -> dict[str, str]:
    found = {}
    for path in src.rglob("*.rs"):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] in ("mod", "lib", "main"):
            parts = parts[:-1]
        text = re.sub(r"//.*", "", path.read_text(encoding="utf-8"))
        # Unit tests may reach anywhere.
        text = re.split(r"#\[cfg\(test\)\]\s*mod tests", text)[0]
        found["::".join(parts)] = text
    return found


def resolve(mods: dict[str, str], current: str, path: str) -> str | None:
    segments = path.split("::")
    if segments[0] == "crate":
        base, segments = [], segments[1:]
    elif segments[0] == "super":
        base, segments = (current.split("::")[:-1] if current else []), segments[1:]
        while segments and segments[0] == "super":
            base, segments = base[:-1], segments[1:]
    else:  # self
        base, segments = (current.split("::") if current else []), segments[1:]
    for i in range(len(segments), -1, -1):
        candidate = "::".join(base + segments[:i])
        if candidate in mods:
            return candidate
    return None


def related(a: str, b: str) -> bool:
    """A module and its own parent or child: not an import between peers."""
    return a == b or a.startswith(b + "::") or b.startswith(a + "::") or not a or not b


def circles(src: Path) -> list[set[str]]:
    mods = modules(src)
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for module, text in mods.items():
        targets = [resolve(mods, module, m.group(1)) for m in PATH.finditer(text)]
        for group in GROUP.finditer(text):
            for item in group.group(2).split(","):
                name = item.strip().split("::")[0].split(" ")[0]
                if name and name != "self":
                    targets.append(resolve(mods, module, f"{group.group(1)}::{name}"))
        edges[module] = {t for t in targets if t is not None and not related(module, t)}
    # Tarjan's strongly connected components.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in mods:
        if v not in index:
            visit(v)
    return found


@pytest.mark.skipif(not CRATES.is_dir(), reason="the crates' sources are not beside the tests")
@pytest.mark.parametrize("crate", sorted(ALLOWED))
def test_no_import_circles(crate: str) -> None:
    found = circles(CRATES / crate / "src")
    stray = [sorted(c) for c in found if c not in ALLOWED[crate]]
    assert not stray, f"import circles in {crate}: {stray}"


def test_the_detector_finds_a_circle(tmp_path: Path) -> None:
    (tmp_path / "lib.rs").write_text("mod a;\nmod b;\n")
    (tmp_path / "a.rs").write_text("use crate::b::B;\npub struct A;\n")
    (tmp_path / "b.rs").write_text("use crate::a::A;\npub struct B;\n")
    (tmp_path / "c.rs").write_text("use super::a::A;\n")
    assert circles(tmp_path) == [{"a", "b"}]
