"""What a child process sees of lazybuf's devices, next to what this process sees: the
environment variables the runtimes' discovery set in this process (read from C's `environ`,
which children inherit; Python's `os.environ` is a copy made at start-up), and the devices of a
child started with the inherited environment and of one started with the start-up environment.

On an H200 machine (2026-11-27 and 2026-11-28) a child started after discovery listed NVIDIA's
OpenCL device no more: discovery cut `OCL_ICD_FILENAMES` (`libpocl.so.2:libnvidia-opencl.so.1`)
to its first entry, and a child given `os.environ` kept the device (docs/BACKENDS.md, "A runtime
that changes the process's environment"). `scripts/gpu-check.sh` runs this.

Usage: python scripts/child_devices.py
"""

import ctypes
import os
import subprocess
import sys

LIST = "import lazybuf; print(' '.join(d.selector for d in lazybuf.get_accelerator().devices))"


def c_environ() -> dict[str, str]:
    environ = ctypes.POINTER(ctypes.c_char_p).in_dll(ctypes.CDLL(None), "environ")
    found, i = {}, 0
    while environ[i]:
        key, _, value = environ[i].decode(errors="replace").partition("=")
        found[key] = value
        i += 1
    return found


def child(env: dict[str, str] | None) -> str:
    done = subprocess.run([sys.executable, "-c", LIST], capture_output=True, text=True, env=env, timeout=120)
    return done.stdout.strip() if done.returncode == 0 else f"failed: {done.stderr.strip()[-300:]}"


def main() -> None:
    at_start = dict(os.environ)
    before = c_environ()
    import lazybuf

    here = " ".join(d.selector for d in lazybuf.get_accelerator().devices)
    after = c_environ()
    changed = {k: (before.get(k), after.get(k)) for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    print(f"this process: {here}")
    print(f"set by discovery: {changed or 'nothing'}")
    inherited, fresh = child(None), child(at_start)
    print(f"a child, inherited environment: {inherited}")
    if fresh != inherited:
        print(f"a child, start-up environment:  {fresh}")
    for key in changed:
        without = {k: v for k, v in after.items() if k != key}
        print(f"a child, inherited environment without {key}: {child(without)}")


if __name__ == "__main__":
    main()
