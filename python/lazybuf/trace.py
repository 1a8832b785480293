"""``lazybuf.trace``: record what lazybuf does to memory, and export it.

``start()`` begins recording into a bounded ring (``capacity`` events; the oldest are dropped
and counted when it is full), ``stop()`` ends it and returns a ``Trace``, ``snapshot()`` copies
the events so far, ``record()`` is the context manager, ``dump(path)`` writes Chrome
trace-event JSON that ui.perfetto.dev and chrome://tracing open.

Recorded: every copy between memories that ``transfer_stats()`` counts (direction, bytes, the
call and reason that caused it: ``access``, ``sync`` or ``eviction``, the stream, and its
duration when the call waited for it), the memory buffers, memory objects (``MemoryDevice``,
``MemoryHost``, ``MemoryShared``, ``DeviceBuffer``, ``mr.allocate``) take and give back (device,
kind: ``device``, ``host``, ``pinned`` or ``shared``, bytes, from a pool's cache or upstream),
pool hits and misses, and state transitions.
``python_stack=True`` attaches the Python stack of the call to each event,
``rust_backtrace=True`` the Rust backtrace (both slow). ``Trace.summary()`` is the plain
summary: copies and bytes per buffer (``UnifiedBuffer.buffer_id``), direction and reason.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import numbers
import operator
import os
import stat

from . import _lazybuf
from ._lazybuf import Trace

__all__ = ["Recording", "Trace", "dump", "is_recording", "record", "snapshot", "start", "stop"]


def start(*, capacity: int = 1 << 20, python_stack: bool = False, rust_backtrace: bool = False) -> None:
    """Starts recording. ``ValueError`` when already recording or ``capacity`` is not positive,
    ``TypeError`` when it is not an integer (an ``int``, a NumPy integer, anything with
    ``__index__`` but a bool or an array, as lazybuf's sizes)."""
    _lazybuf._trace_start(_capacity(capacity), bool(python_stack), bool(rust_backtrace))


def _capacity(capacity: object) -> int:
    """``capacity`` as an ``int``, checked. (A NumPy integer was refused before the nineteenth
    hostile pass, where every size lazybuf takes accepts one.)"""
    value = None
    # (A NumPy integer is an `Integral`; an array, whose 0-d form has `__index__`, is data.)
    array = hasattr(capacity, "__array_interface__") and not isinstance(capacity, numbers.Integral)
    if not isinstance(capacity, bool) and not array:
        with contextlib.suppress(TypeError):
            value = operator.index(capacity)  # type: ignore[arg-type]
    if value is None:
        raise TypeError(f"trace.start: expected an int capacity (events), got {type(capacity).__name__}: {capacity!r}")
    if not 1 <= value < 1 << 63:
        raise ValueError(f"trace.start: expected a capacity of at least 1 event (below 2**63), got {capacity!r}")
    return value


def stop() -> Trace:
    """Stops recording and returns the events. ``ValueError`` when not recording."""
    return _lazybuf._trace_stop()


def snapshot() -> Trace:
    """The events so far, recording on. ``ValueError`` when not recording."""
    return _lazybuf._trace_snapshot()


def is_recording() -> bool:
    """Whether the recorder runs."""
    return _lazybuf._trace_recording()


class Recording:
    """What ``record()`` yields: ``trace`` is the ``Trace`` once the block has ended."""

    trace: Trace | None = None


def record(
    *, capacity: int = 1 << 20, python_stack: bool = False, rust_backtrace: bool = False
) -> contextlib.AbstractContextManager[Recording]:
    """Records for the duration of the block: ``with lazybuf.trace.record() as rec: ...``,
    then ``rec.trace``. When the block raises after the recording was stopped inside it, the
    block's exception propagates (``rec.trace`` stays ``None``)."""
    capacity = _capacity(capacity)
    # Native: started and stopped each in one call no Python code interrupts (a signal's
    # exception between a generator's start and its ``try`` left the recorder running).
    return _Record(capacity, bool(python_stack), bool(rust_backtrace), Recording())


class _Record(_lazybuf._TraceRecord, contextlib.ContextDecorator):
    """A ``record()`` block, also usable as a decorator; ``__enter__`` and ``__exit__`` are the
    native base's (see ``record``)."""


def dump(path: str | os.PathLike[str], trace: Trace | None = None) -> None:
    """Writes ``trace`` (else a snapshot of the recording in progress) to ``path`` as Chrome
    trace-event JSON. ``ValueError`` when no trace is given and the recorder is not recording."""
    if isinstance(path, int) or not isinstance(path, (str, bytes, os.PathLike)):
        # open() takes an int as a file descriptor and closes it when done: dump(1) closed
        # the process's standard output (and dump(True) too).
        raise TypeError(f"trace.dump: path must be a file name (str, bytes or os.PathLike), got {path!r}")
    if trace is not None and not isinstance(trace, Trace):
        raise TypeError(f"dump: trace must be a lazybuf.trace.Trace (what stop() returns) or None, got {trace!r}")
    if trace is None:
        try:
            trace = snapshot()
        except ValueError:
            # snapshot()'s own error would name trace.snapshot, which the caller never called.
            raise ValueError(
                "trace.dump: expected a Trace to write (dump(path, rec.trace), what stop() returns) or a "
                "recording in progress to snapshot; the recorder is not recording (start() it first)"
            ) from None
    _write_whole(os.fsdecode(os.fspath(path)), trace.to_chrome_json())


def _write_whole(path: str, data: str) -> None:
    """Writes ``data`` to ``path`` whole or not at all, as ``lazybuf trace plot -o`` does: a
    regular file (or a new one) is written into a new file beside it, flushed to the disk, then
    renamed over it, so that a failure (a full disk) leaves an earlier file as it was and no
    temporary file behind; a link is written through (a link to nothing is refused, as the
    CLI refuses it), an existing file keeps its permissions,
    and one this process may not write raises ``PermissionError``, as ``open(path, "w")`` would.
    Anything else (``/dev/stdout``, a FIFO, a device) is written in place. (``open(path, "w")``
    emptied the earlier file first: a dump that failed replaced a good trace with a cut one,
    the nineteenth hostile pass.) An error names ``path``, never the temporary file."""
    if not path:
        # As open(""): the rename would fail only after a temporary file was made here.
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
        if os.path.islink(path):
            # As the CLI's writer: a link to nothing is refused (the rename replaced the link
            # itself with the file, where open(path, "w") would have failed or written its target).
            raise FileNotFoundError(
                errno.ENOENT, "trace.dump: a symbolic link to nothing; expected a file, or a link to one", path
            ) from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        with open(path, "w", encoding="utf-8") as f:  # a directory raises IsADirectoryError here
            f.write(data)
        return
    target = os.path.realpath(path) if st is not None else path
    try:
        if st is not None:
            # Only a file this process may write is replaced, as open(path, "w") would refuse it
            # (the rename needs only the folder writable: a read-only file was replaced, the
            # twentieth hostile pass). Opened without truncating, to ask, and closed.
            os.close(os.open(target, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0)))
        _replace_whole(target, data.encode("utf-8"), st)
    except OSError as e:
        # Named for the file asked for, as open(path, "w")'s errors are: a missing folder said
        # "No such file or directory: '.../.t.json.12-0.tmp'", a file the caller never named.
        raise OSError(e.errno, e.strerror, path) from e


def _replace_whole(target: str, encoded: bytes, st: os.stat_result | None) -> None:
    """``encoded`` into a new temporary file beside ``target``, flushed to the disk, then renamed
    over it (``_write_whole``); ``st``: the status of the file it replaces, if any."""
    folder, name = os.path.split(target)
    # The temporary file's name takes at most 32 characters of the file's (at most 128 bytes),
    # so that it is not too long where the file's own name is not: a name of about 240 to 255 bytes
    # failed with "File name too long" (the twentieth hostile pass).
    for attempt in itertools.count():
        temporary = os.path.join(folder, f".{name[:32]}.{os.getpid()}-{next(_TEMPORARY)}.tmp")
        try:
            # 0o666 less the umask, as open() creates a file.
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
            break
        except FileExistsError:
            if attempt >= 1000:
                raise
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(encoded)
            f.flush()
            if st is not None:
                os.chmod(f.fileno() if os.chmod in os.supports_fd else temporary, stat.S_IMODE(st.st_mode))
            # Where the file system allocates late, a full disk shows here, not in the write.
            os.fsync(f.fileno())
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


_TEMPORARY = itertools.count()
