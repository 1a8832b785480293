"""Renders the Python API reference of the installed lazybuf package with pdoc.

Run by scripts/api-docs.sh (see docs/API.md): ``python scripts/api_docs.py OUTPUT_DIR``, from a
folder where ``import lazybuf`` is the installed wheel. Documents ``lazybuf``, ``lazybuf.mr``
and, when the wheel has it, ``lazybuf.testing``. Signatures and docstrings come from the type
stubs where they have them (``_lazybuf.pyi`` for the names ``lazybuf`` re-exports from the
extension module, ``mr.pyi``, ``testing.pyi``), else from the module's own docstrings.

Exits 1, listing them, if pdoc warned about anything (a stub it cannot load, an annotation it
cannot resolve, a docstring it cannot process): every warning is recorded, none is hidden.
"""

import importlib.machinery
import sys
import traceback
import warnings
from unittest import mock
from pathlib import Path

import pdoc
import pdoc.doc
import pdoc.doc_pyi
import pdoc.render

import lazybuf


def main() -> int:
    out = Path(sys.argv[1])
    # The package re-exports the extension module's names, whose stubs are _lazybuf.pyi; pdoc
    # looks for a stub named after the module being documented, so `lazybuf` is patched from
    # _lazybuf.pyi here, as pdoc patches a module from its own stub. The package keeps its own
    # module docstring (the stub's describes the extension module).
    include_typeinfo = pdoc.doc_pyi.include_typeinfo_from_stub_files

    def include(module) -> None:
        if module.modulename != "lazybuf":
            include_typeinfo(module)
            return
        name = "lazybuf._lazybuf"
        try:
            stub = pdoc.doc_pyi._import_stub_file(name, pdoc.doc_pyi.find_stub_file(name))
        except Exception:
            warnings.warn(f"Error parsing type stubs for {name}:\n{traceback.format_exc()}")
            return
        pdoc.doc_pyi._prepare_module(module)
        docstring = module.docstring
        with mock.patch.dict("sys.modules", {name: stub}):
            pdoc.doc_pyi._patch_doc(module, pdoc.doc.Module(stub))
        module.docstring = docstring

    pdoc.doc_pyi.include_typeinfo_from_stub_files = include

    # The extension registers lazybuf.mr and lazybuf.testing in sys.modules with no import
    # spec (and, before the twenty-first hostile pass, with their short __name__, "mr"); pdoc
    # needs both to find and name them. Set here, in this process only.
    for name in ("lazybuf.mr", "lazybuf.testing"):
        if name in sys.modules:
            sys.modules[name].__name__ = name
            if getattr(sys.modules[name], "__spec__", None) is None:
                sys.modules[name].__spec__ = importlib.machinery.ModuleSpec(name, None)

    modules = ["lazybuf"]  # with the submodules it lists in __all__: lazybuf.mr, lazybuf.cli
    if hasattr(lazybuf, "testing"):  # only in wheels built with the crate feature `testing`
        modules.append("lazybuf.testing")
    pdoc.render.configure(docformat="restructuredtext", show_source=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pdoc.pdoc(*modules, output_directory=out)
    for w in caught:
        print(f"api-docs: warning: {w.category.__name__}: {w.message}", file=sys.stderr)
    if caught:
        print(f"api-docs: {len(caught)} warning(s); fix the docstrings or stubs named above", file=sys.stderr)
        return 1
    print(f"api-docs: {', '.join(modules)} -> {out}/index.html")
    return 0


if __name__ == "__main__":
    sys.exit(main())
