"""Splits a callgrind profile of one step of `batch_steps.py` (run with `--separate-threads=yes`;
give the main thread's file, `*-01`) into the runtime's share, PyOpenCL's share and lazybuf's
own, per batch:

    python batch_split.py PROFILE BATCHES

Shares, from callgrind's inclusive counts (`callgrind_annotate --inclusive=yes`):

- the runtime's (PoCL's, through the OpenCL loader): every `cl3::runtime::OpenCl::cl*` call
  lazybuf makes;
- PyOpenCL's: the calls lazybuf makes into PyOpenCL (`.device`'s `Buffer.from_int_ptr` and
  `Array(...)`: pyo3's `call_positional`), and the deallocation of the PyOpenCL array a
  buffer kept (`subtype_dealloc`, Python's deallocation of a class written in Python) less
  lazybuf's own `MemoryOwner` dropped inside it (the array's base, which holds the buffer's
  memory).

Lazybuf's own side of the step is its total (`batch_steps.sh`, the toggles' cost subtracted)
less these shares. Prints `runtime | pyopencl` per batch.
"""

import re
import subprocess
import sys

# The first occurrence of each function, without recursion suffixes ('2).
PATTERNS = {
    "runtime": re.compile(r"^cl3::runtime::OpenCl::cl\w+$"),
    "call": re.compile(r"^<?pyo3::.*call_positional$"),
    "dealloc": re.compile(r"typeobject\.c:subtype_dealloc$"),
    "owner": re.compile(r"^<_lazybuf::views::MemoryOwner as core::ops::drop::Drop>::drop$"),
}


def inclusive(profile: str) -> dict[str, int]:
    out = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--threshold=100", profile],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    sums = {key: 0 for key in PATTERNS}
    seen = set()
    for line in out.splitlines():
        m = re.match(r"^\s*([\d,]+)\s+\([^)]*\)\s+(\S.*?)(?: \[[^\]]*\])?$", line)
        if not m:
            continue
        count, name = int(m.group(1).replace(",", "")), m.group(2)
        # callgrind_annotate lists a function under its file's full path and under the
        # object's relative one: count each name once.
        name = re.sub(r"^\S*?(\w+\.c:)", r"\1", name) if ".c:" in name else re.sub(r"^\?\?\?:", "", name)
        if name in seen:
            continue
        seen.add(name)
        for key, pattern in PATTERNS.items():
            if pattern.search(name):
                sums[key] += count
    return sums


def main() -> None:
    profile, batches = sys.argv[1], int(sys.argv[2])
    s = inclusive(profile)
    runtime = s["runtime"] // batches
    pyopencl = (s["call"] + max(s["dealloc"] - s["owner"], 0)) // batches
    print(f"{runtime} | {pyopencl}")


if __name__ == "__main__":
    main()
