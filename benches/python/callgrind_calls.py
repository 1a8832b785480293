"""Calls into a shared library's exported functions, from a callgrind output file: for each
function whose name starts with PREFIX in an object whose path contains LIB, the calls made
to it from other objects (callgrind's `calls=` lines). Used to count OpenCL calls (the ICD
loader's `cl*` entry points, called by lazybuf) per batch: docs/BENCHMARKS.md.

    python callgrind_calls.py FILE [LIB] [PREFIX]      (defaults: libOpenCL, cl)
"""

import collections
import re
import sys


def calls(path: str, lib: str, prefix: str) -> dict[str, int]:
    names: dict[str, dict[str, str]] = {"ob": {}, "fn": {}}
    ob = fn = cob = cfn = None
    counted: collections.Counter[str] = collections.Counter()

    def name(kind: str, value: str) -> str:
        match = re.match(r"\((\d+)\)(?: (.*))?", value)
        if not match:
            return value
        key, text = match.groups()
        table = names["ob" if kind in ("ob", "cob") else "fn"]
        if text is not None:
            table[key] = text
        return table.get(key, key)

    with open(path, errors="replace") as lines:
        for line in lines:
            key, _, value = line.rstrip("\n").partition("=")
            if key in ("ob", "fl", "fi", "fe", "fn", "cob", "cfn", "cfi", "cfl", "calls"):
                if key == "ob":
                    ob = name("ob", value)
                elif key == "fn":
                    fn = name("fn", value)
                    cob = None
                elif key == "cob":
                    cob = name("cob", value)
                elif key == "cfn":
                    cfn = name("cfn", value)
                elif key == "calls":
                    callee_ob = cob if cob is not None else ob
                    if callee_ob and lib in callee_ob and lib not in (ob or "") and cfn and cfn.startswith(prefix):
                        counted[cfn] += int(value.split()[0])
                    cob = None
    return dict(counted)


if __name__ == "__main__":
    path = sys.argv[1]
    lib = sys.argv[2] if len(sys.argv) > 2 else "libOpenCL"
    prefix = sys.argv[3] if len(sys.argv) > 3 else "cl"
    for function, n in sorted(calls(path, lib, prefix).items()):
        print(f"{function}={n}")
