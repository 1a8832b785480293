"""The transfer guard: allow, log or refuse the copies lazybuf would make between memories.

As JAX's ``jax.transfer_guard``: a level per direction (``h2d`` host to device, ``d2h`` device
to host, ``d2d`` device to device), per thread (``transfer_guard(...)``, a context manager) and
process-wide (``set_transfer_guard(...)``, initially from ``LAZYBUF_TRANSFER_GUARD``). JAX's
levels and meanings:

- ``"allow"``: every copy runs;
- ``"log"``: implicit copies are logged, explicit ones run;
- ``"disallow"``: implicit copies raise ``TransferGuardError``, explicit ones run;
- ``"log_explicit"``: every copy is logged;
- ``"disallow_explicit"``: every copy raises ``TransferGuardError``.

*Explicit* copies are those of calls whose job is the copy: ``sync_to_device()``,
``sync_to_host()``, their ``_async`` forms, ``to_numpy()``, ``copy_to()``, ``allocate()``.
*Implicit* ones are made for an access: ``.host``, ``.host_readonly``, ``.device``,
``.device_writable``, ``mark_*_dirty()``, the buffer protocol (``"buffer protocol"`` in
errors and events), ``__array_interface__``, ``__cuda_array_interface__``, ``__dlpack__``
(explicit with ``copy=True``). A refused copy changes
nothing: the buffer's state and data are as before the call. A sync on a device whose copy is
host memory itself (the host device) moves no bytes and is not a copy.

A logged copy is a WARNING on the ``lazybuf.transfer_guard`` logger of Python's ``logging``
(``lazybuf transfer guard (log): host-to-device copy of 4096 bytes (host -> ...) of buffer 7,
caused by implicit .device``; with ``logging`` not configured, Python prints it on standard
error). The guard decides while lazybuf's locks are held, often without the GIL, so the record
is made when the call that copies returns to Python (a ``UnifiedBuffer`` method or export
protocol), or at the latest when a guard level changes (leaving a ``transfer_guard`` block) or
the interpreter exits. A handler's exception goes to ``sys.unraisablehook``; the call that copied is unaffected.
"""

from __future__ import annotations

import atexit
import contextlib
import logging  # noqa: F401 - before the atexit hook below: logging's shutdown then runs after it

from . import _lazybuf

__all__ = [
    "get_transfer_guard",
    "set_transfer_guard",
    "transfer_guard",
    "transfer_guard_device_to_device",
    "transfer_guard_device_to_host",
    "transfer_guard_host_to_device",
]

LEVELS = ("allow", "log", "disallow", "log_explicit", "disallow_explicit")

# Copies logged by calls that did not return to Python since (module docs) are logged at exit.
atexit.register(_lazybuf._transfer_guard_flush_log)
_Levels = tuple[str | None, str | None, str | None]


def _level(call: str, name: str, value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or value not in LEVELS:
        raise ValueError(f"{call}: {name} expected one of {', '.join(LEVELS)}, got {value!r}")
    return value


def _levels(call: str, level: object, h2d: object, d2h: object, d2d: object) -> _Levels:
    if level is None and h2d is None and d2h is None and d2d is None:
        raise ValueError(f"{call}: expected a level ({', '.join(LEVELS)}) or h2d=, d2h=, d2d=; got none")
    default = _level(call, "level", level)
    return (
        _level(call, "h2d", h2d) or default,
        _level(call, "d2h", d2h) or default,
        _level(call, "d2d", d2d) or default,
    )


class _Scope(_lazybuf._GuardScope, contextlib.ContextDecorator):
    """A ``transfer_guard`` block, also usable as a decorator. ``__enter__`` and ``__exit__``
    are the native base's: the levels are set and restored each in one call no Python code
    interrupts (a generator's bytecode between the setting and its ``try`` let a signal's
    exception leave them set for good)."""


def _scope(levels: _Levels) -> contextlib.AbstractContextManager[None]:
    return _Scope(*levels)


def transfer_guard(
    level: str | None = None, *, h2d: str | None = None, d2h: str | None = None, d2d: str | None = None
) -> contextlib.AbstractContextManager[None]:
    """A context manager that sets this thread's guard: ``level`` for every direction, or per
    direction (``h2d=``, ``d2h=``, ``d2d=``, which win over ``level``). Other threads keep
    theirs; on leaving, the levels before it come back. ``ValueError`` for an unknown level."""
    return _scope(_levels("transfer_guard", level, h2d, d2h, d2d))


def transfer_guard_host_to_device(level: str) -> contextlib.AbstractContextManager[None]:
    """``transfer_guard(h2d=level)``."""
    return _scope(_levels("transfer_guard_host_to_device", None, level, None, None))


def transfer_guard_device_to_host(level: str) -> contextlib.AbstractContextManager[None]:
    """``transfer_guard(d2h=level)``."""
    return _scope(_levels("transfer_guard_device_to_host", None, None, level, None))


def transfer_guard_device_to_device(level: str) -> contextlib.AbstractContextManager[None]:
    """``transfer_guard(d2d=level)``."""
    return _scope(_levels("transfer_guard_device_to_device", None, None, None, level))


def set_transfer_guard(
    level: str | None = None, *, h2d: str | None = None, d2h: str | None = None, d2d: str | None = None
) -> None:
    """Sets the process-wide level (every thread without a level of its own for that
    direction): ``level`` for every direction, or per direction."""
    _lazybuf._transfer_guard_set_global(*_levels("set_transfer_guard", level, h2d, d2h, d2d))


def get_transfer_guard() -> dict[str, str]:
    """The level that applies on this thread, per direction: ``{"h2d": ..., "d2h": ...,
    "d2d": ...}``. ``ValueError`` when ``LAZYBUF_TRANSFER_GUARD`` is malformed."""
    process = _lazybuf._transfer_guard_global()
    thread = _lazybuf._transfer_guard_thread()
    return {
        name: own if own is not None else str(shared)
        for name, own, shared in zip(("h2d", "d2h", "d2d"), thread, process)
    }
