"""The disk tier's spill directory from Python, each case in a child interpreter (the
directory is read once per process, and what happens at exit is part of what is tested):

- a relative ``LAZYBUF_SPILL_DIR`` is resolved once, so a later ``os.chdir`` does not make a
  buffer read back (or the exit hook remove) a file of the same name somewhere else;
- lazybuf's own directory (no ``LAZYBUF_SPILL_DIR``) is made by lazybuf, mode 0700, never
  taken over when its predictable name already exists (a link to another user's directory, an
  open directory), and its files are 0600; files in a named directory are 0600 too;
- a directory the user named is never removed, also when the variable is unset at run time,
  and lazybuf's own goes at exit also when the variable is set at run time.

Found by a hostile script (2026-11-27).
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

N = 16 * 1024  # float32 elements: 64 KiB
NBYTES = N * 4

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX modes, links and fork-free children")

# Spills the first of two host buffers (`a`, all 1.0) to disk; `b` holds 2.0.
SPILL_ONE = f"""
import os, stat, sys, tempfile
import numpy as np, lazybuf
def spill_one(value=1.0):
    lazybuf.trim()
    lazybuf.set_host_memory_limit(lazybuf.host_memory_held() + {NBYTES})
    a = lazybuf.UnifiedBuffer({N}, np.float32, device="host"); a.copy_from(np.full({N}, value, np.float32))
    b = lazybuf.UnifiedBuffer({N}, np.float32, device="host"); b.copy_from(np.full({N}, 2, np.float32))
    lazybuf.set_host_memory_limit(None)
    assert lazybuf.spill_stats("host")["bytes_to_disk"] >= {NBYTES}
    return a, b
def mode(path):
    return stat.S_IMODE(os.lstat(path).st_mode)
"""


def _run(code: str, env: dict, cwd=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "LAZYBUF_DEVICE": "host", **env}
    env = {k: v for k, v in env.items() if v is not None}
    return subprocess.run(
        [sys.executable, "-c", SPILL_ONE + code], capture_output=True, text=True, timeout=120, env=env, cwd=cwd
    )


def test_a_relative_spill_directory_does_not_move_with_the_working_directory(tmp_path):
    (tmp_path / "A" / "rel").mkdir(parents=True)
    (tmp_path / "B" / "rel").mkdir(parents=True)
    code = f"""
a, b = spill_one()
(name,) = os.listdir("rel")                      # a's file, under A
os.chdir({str(tmp_path / "B")!r})
with open(os.path.join("rel", name), "wb") as f:  # an unrelated file of the same name, under B
    f.write(np.full({N}, 7, np.float32).tobytes())
keep = (a, b)
got = a.to_numpy()
assert (got == 1).all(), got[:3]
a2, b2 = spill_one(3.0)                          # spilled after the chdir: still under A
assert os.listdir({str(tmp_path / "A" / "rel")!r}), "spilled into the new working directory"
print("OK")
"""
    done = _run(code, {"LAZYBUF_SPILL_DIR": "rel"}, cwd=tmp_path / "A")
    assert done.returncode == 0 and "OK" in done.stdout, done.stdout + done.stderr
    assert os.listdir(tmp_path / "A" / "rel") == []  # lazybuf's files went at exit
    assert len(os.listdir(tmp_path / "B" / "rel")) == 1  # the other file is not lazybuf's


def test_the_default_spill_directory_is_private_and_never_taken_over(tmp_path):
    tmp, foreign = tmp_path / "tmp", tmp_path / "foreign"
    tmp.mkdir()
    foreign.mkdir()
    foreign.chmod(0o777)
    code = f"""
predicted = os.path.join(tempfile.gettempdir(), f"lazybuf-spill-{{os.getpid()}}")
os.symlink({str(foreign)!r}, predicted)          # the predictable name, taken by a link
a, b = spill_one()
assert os.listdir({str(foreign)!r}) == [], "wrote through someone's link"
(d,) = [e for e in os.listdir(tempfile.gettempdir()) if e.startswith("lazybuf-spill-") and e != os.path.basename(predicted)]
d = os.path.join(tempfile.gettempdir(), d)
assert stat.S_ISDIR(os.lstat(d).st_mode) and mode(d) == 0o700, oct(mode(d))
(f,) = os.listdir(d)
assert mode(os.path.join(d, f)) == 0o600, oct(mode(os.path.join(d, f)))
assert (a.to_numpy() == 1).all()
del a, b
assert not os.path.exists(d), "lazybuf's own directory goes with its last file"
os.remove(predicted)
os.mkdir(predicted, 0o755)                       # taken by an open directory
os.chmod(predicted, 0o755)
a, b = spill_one()
assert os.listdir(predicted) == [], "wrote into a directory lazybuf did not make"
del a, b
os.rmdir(predicted)                              # free: lazybuf makes it, private
keep = spill_one()
assert mode(predicted) == 0o700 and len(os.listdir(predicted)) == 1, oct(mode(predicted))
print("OK")
"""
    done = _run(code, {"LAZYBUF_SPILL_DIR": None, "TMPDIR": str(tmp)})
    assert done.returncode == 0 and "OK" in done.stdout, done.stdout + done.stderr
    assert os.listdir(foreign) == []
    assert os.listdir(tmp) == [], "lazybuf's directories and files went at exit"


def test_a_named_spill_directory_stays_when_the_variable_is_unset(tmp_path):
    named = tmp_path / "named"
    named.mkdir()
    code = """
keep = [spill_one(float(i)) for i in range(2)]
files = os.listdir(os.environ["LAZYBUF_SPILL_DIR"])
modes = sorted({oct(mode(os.path.join(os.environ["LAZYBUF_SPILL_DIR"], f))) for f in files})
del os.environ["LAZYBUF_SPILL_DIR"]             # e.g. a library restoring the environment
print("OK", len(files), *modes)
"""
    done = _run(code, {"LAZYBUF_SPILL_DIR": str(named)})
    assert done.returncode == 0 and "OK" in done.stdout, done.stdout + done.stderr
    assert named.is_dir(), "a directory the user named is never removed"
    assert os.listdir(named) == []  # the files went at exit
    assert done.stdout.split()[1:] == ["2", "0o600"], done.stdout  # its files were private


def test_lazybufs_own_directory_goes_at_exit_when_the_variable_is_set_later(tmp_path):
    tmp, other = tmp_path / "tmp", tmp_path / "other"
    tmp.mkdir()
    other.mkdir()
    code = f"""
keep = spill_one()
os.environ["LAZYBUF_SPILL_DIR"] = {str(other)!r}
print("OK")
"""
    done = _run(code, {"LAZYBUF_SPILL_DIR": None, "TMPDIR": str(tmp)})
    assert done.returncode == 0 and "OK" in done.stdout, done.stdout + done.stderr
    assert os.listdir(tmp) == [] and os.listdir(other) == []


# A multiprocessing child that spills and keeps its spilled buffers alive until it ends (a
# worker-level cache). `late`: lazybuf is imported by the child's target, not by the parent.
MP_CHILDREN = f"""
import glob, os, sys, tempfile
import multiprocessing as mp
KEEP = []
def work(_=None):
    import numpy as np, lazybuf
    lazybuf.trim()
    lazybuf.set_host_memory_limit(lazybuf.host_memory_held() + {NBYTES})
    for value in range(3):
        b = lazybuf.UnifiedBuffer({N}, np.float32, device="host"); b.copy_from(np.full({N}, value, np.float32))
        KEEP.append(b)
    lazybuf.set_host_memory_limit(None)
    assert lazybuf.spill_stats("host")["bytes_to_disk"] >= 2 * {NBYTES}
    root = os.environ.get("LAZYBUF_SPILL_DIR") or tempfile.gettempdir()
    return len(glob.glob(os.path.join(root, "**", f"{{os.getpid()}}-*.bin"), recursive=True))
def work_and_check():
    spilled = work()
    assert spilled >= 2, spilled                     # the child had files on disk when it ended
if __name__ == "__main__":
    method, kind, late = sys.argv[1:4]
    if late != "late":
        import lazybuf
    ctx = mp.get_context(method)
    if kind == "pool":
        pool = ctx.Pool(2)
        spilled = pool.map(work, range(4))
        pool.close()                                 # a clean shutdown (terminate() kills)
        pool.join()
        assert sum(spilled) >= 2, spilled            # the workers had files on disk when they ended
    else:
        p = ctx.Process(target=work_and_check)
        p.start(); p.join()
        assert p.exitcode == 0, p.exitcode
    print("OK")
"""


@pytest.mark.parametrize(
    "method,kind,late",
    [
        ("fork", "pool", "early"),
        ("fork", "process", "early"),
        ("fork", "process", "late"),
        ("forkserver", "process", "early"),
        ("spawn", "process", "early"),
    ],
)
@pytest.mark.parametrize("named", [False, True], ids=["own-dir", "named-dir"])
def test_multiprocessing_children_remove_their_spill_files_when_they_end(tmp_path, method, kind, late, named):
    """A hostile pass (2026-11-27): a multiprocessing child (fork or forkserver) that spilled
    and ended normally left its spill files (and lazybuf's directory) behind: such children end
    with os._exit(), which runs no atexit hook. The package also registers its cleanup as a
    multiprocessing finalizer in every child, which multiprocessing runs before os._exit()."""
    if method not in __import__("multiprocessing").get_all_start_methods():
        pytest.skip(f"no {method} start method here")
    tmp, named_dir = tmp_path / "tmp", tmp_path / "named"
    tmp.mkdir()
    named_dir.mkdir()
    script = tmp_path / "mp_children.py"
    script.write_text(MP_CHILDREN)
    env = {**os.environ, "LAZYBUF_DEVICE": "host", "TMPDIR": str(tmp)}
    env.pop("LAZYBUF_SPILL_DIR", None)
    if named:
        env["LAZYBUF_SPILL_DIR"] = str(named_dir)
    done = subprocess.run(
        [sys.executable, str(script), method, kind, late], capture_output=True, text=True, timeout=240, env=env
    )
    assert done.returncode == 0 and "OK" in done.stdout, done.stdout + done.stderr
    # No file, and no directory of lazybuf's, of any process is left (the forkserver's own
    # helper files go with it before the run returns).
    left = [str(p.relative_to(tmp_path)) for p in tmp.rglob("*")] + [str(p.relative_to(tmp_path)) for p in named_dir.rglob("*")]
    assert not [p for p in left if "lazybuf-spill" in p or p.endswith(".bin")], left
    assert named_dir.is_dir()  # a named directory stays
