"""``BufferState``: which copy of a buffer is current, with PyDotCompute's string values.

Pure Python because an ``Enum`` is the natural Python type; the extension module looks its
members up by value (see ``crates/lazybuf-py/src/state.rs``).
"""

from enum import Enum

__all__ = ["BufferState"]


class BufferState(Enum):
    """The host copy against the buffer's device copy.

    ``str(state)`` is the member name (``print(buf.state)`` shows ``HOST_DIRTY``).
    """

    UNINITIALIZED = "uninitialized"  # nothing valid anywhere
    HOST_ONLY = "host_only"  # host valid, no device copy allocated
    DEVICE_ONLY = "device_only"  # device valid, no host copy allocated
    SYNCHRONIZED = "synchronized"  # both valid, identical
    HOST_DIRTY = "host_dirty"  # host valid, device copy stale
    DEVICE_DIRTY = "device_dirty"  # device valid, host copy stale
    ELSEWHERE = "elsewhere"  # only another device is valid (Rust multi-device use only)

    def __str__(self) -> str:
        return self.name
