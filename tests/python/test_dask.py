"""Pickling with protocol 5 and the Dask integration (python/lazybuf/_dask.py).

- protocol 5 hands out the host copy itself as a PickleBuffer (checked by address), syncs a
  buffer whose device copy alone is current first (counted), and older protocols still work;
  a payload of the wrong size raises ValueError;
- `import lazybuf` imports neither dask nor distributed; `dask.sizeof` and distributed's
  serializers are registered whatever the import order, in the sending and receiving process;
- the `dask` family's frame is a memoryview over the host copy (no copy: 64 MiB checked by
  address, sizes and lazybuf's transfer counters); the `cuda` family sends a CUDA buffer's
  device copy and the receiver copies it device-to-device (with a CUDA device: the CUDA
  driver test double in CI, or a GPU);
- a real LocalCluster (2 worker processes on the loopback interface) moves 100 buffers of
  mixed dtypes and shapes up to 64 MiB between workers, and back to the client.

The cluster tests start worker processes and move a few hundred MiB: scripts/test-python.sh
runs them in its first pass only and sets LAZYBUF_SKIP_CLUSTER=1 for the others.
"""

from __future__ import annotations

import os
import pickle
import sys
import textwrap

import numpy as np
import pytest

import dask_tasks
import lazybuf
from conftest import _need, _required, collect, run_python
from lazybuf import BufferState, UnifiedBuffer, get_accelerator
from lazybuf._lazybuf import DeviceFrame

try:
    import dask.sizeof
    import distributed
    from distributed.protocol import deserialize, serialize
    from distributed.protocol.serialize import merge_and_deserialize, serialize_and_split
except ImportError as err:  # pragma: no cover - CI installs dask[distributed]
    if _required("dask"):
        raise
    pytest.skip(f"dask[distributed] is not installed ({err})", allow_module_level=True)

MiB = 1 << 20


def address(array) -> int:
    return np.asarray(array).__array_interface__["data"][0]


def buffer_address(frame) -> int:
    return np.frombuffer(frame, np.uint8).__array_interface__["data"][0]


def moved(stats: dict) -> int:
    """Syncs counted in either direction, copied or zero-copy."""
    return stats["host_to_device_copies"] + stats["device_to_host_copies"] + stats["zero_copy_syncs"]


@pytest.fixture(params=["host", "opencl", "cuda"])
def device(request) -> lazybuf.Device:
    """The first device of each backend: the tests below mean the same on every one."""
    found = [d for d in get_accelerator().devices if d.backend == request.param]
    if not found:
        _need(request.param, f"no {request.param} device: {get_accelerator().backend_status}")
    return found[0]


@pytest.fixture
def cuda_device() -> lazybuf.Device:
    found = [d for d in get_accelerator().devices if d.backend == "cuda"]
    if not found:
        _need("cuda", f"no CUDA device: {get_accelerator().backend_status}")
    return found[0]


def filled(shape, dtype, device=None, seed=3) -> UnifiedBuffer:
    buf = UnifiedBuffer(shape, dtype, device=device)
    flat = buf.host.reshape(-1).view(np.uint8)
    flat[:] = dask_tasks.expected_bytes(seed, flat.size)
    return buf


def same_bytes(buf: UnifiedBuffer, seed=3) -> bool:
    return np.array_equal(dask_tasks.host_bytes(buf), dask_tasks.expected_bytes(seed, buf.nbytes))


# --- pickle protocol 5 ----------------------------------------------------------------------


def test_protocol_5_hands_out_the_host_copy_itself(device):
    buf = filled((64, 3), np.float32, device)
    state, stats = buf.state, buf.transfer_stats()
    oob = []
    payload = pickle.dumps(buf, protocol=5, buffer_callback=oob.append)
    assert len(oob) == 1 and isinstance(oob[0], pickle.PickleBuffer)
    raw = oob[0].raw()
    assert raw.readonly and raw.nbytes == buf.nbytes
    assert buffer_address(raw) == address(buf.host_readonly)  # the host copy, not a copy of it
    assert len(payload) < 200  # the data is not in the pickle
    assert buf.state == state and buf.transfer_stats() == stats  # a host read moved nothing
    clone = pickle.loads(payload, buffers=oob)
    assert clone.state == BufferState.HOST_ONLY
    assert (clone.shape, clone.dtype) == ((64, 3), np.float32)
    assert clone.device_handle == device  # the device it was pickled on, which this process has
    assert same_bytes(clone) and address(clone.host_readonly) != address(buf.host_readonly)


def test_protocol_5_syncs_a_buffer_whose_device_copy_alone_is_current(device):
    buf = filled(1000, np.int32, device)
    buf.mark_device_dirty()
    assert buf.state == BufferState.DEVICE_DIRTY
    before = buf.transfer_stats()
    oob = []
    payload = pickle.dumps(buf, protocol=5, buffer_callback=oob.append)
    after = buf.transfer_stats()
    assert moved(after) == moved(before) + 1  # one sync to the host, counted
    assert after["device_to_host_bytes"] - before["device_to_host_bytes"] in (0, buf.nbytes)
    assert buf.state == BufferState.SYNCHRONIZED
    assert buffer_address(oob[0].raw()) == address(buf.host_readonly)
    assert same_bytes(pickle.loads(payload, buffers=oob))


def test_protocol_5_without_a_callback_pickles_the_bytes_in_band():
    buf = filled((5, 7), np.float64)
    payload = pickle.dumps(buf, protocol=5)
    assert len(payload) > buf.nbytes
    assert same_bytes(pickle.loads(payload))


@pytest.mark.parametrize("protocol", [0, 1, 2, 3, 4])
def test_older_protocols_keep_working(protocol):
    buf = filled((3, 4), np.int16)
    clone = pickle.loads(pickle.dumps(buf, protocol=protocol))
    assert clone.state == BufferState.HOST_ONLY and same_bytes(clone)
    with pytest.raises(ValueError):  # out-of-band buffers need protocol 5
        pickle.dumps(buf, protocol=protocol, buffer_callback=list().append)


@pytest.mark.parametrize(
    "shape, dtype",
    [((), np.float64), ((0,), np.float32), ((2, 0, 3), np.int8), ((7,), np.float16),
     ((3, 5), np.uint64), ((4, 1, 2), "bfloat16")],
)
def test_protocol_5_round_trips_every_shape_and_dtype(shape, dtype):
    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes")
    buf = filled(shape, dtype)
    oob = []
    clone = pickle.loads(pickle.dumps(buf, protocol=5, buffer_callback=oob.append), buffers=oob)
    assert clone.shape == buf.shape and clone.dtype == buf.dtype
    assert clone.state == BufferState.HOST_ONLY and same_bytes(clone)


def test_protocol_5_keeps_an_uninitialized_buffer_uninitialized():
    oob = []
    payload = pickle.dumps(UnifiedBuffer((2, 2), np.uint8), protocol=5, buffer_callback=oob.append)
    assert oob == []
    clone = pickle.loads(payload)
    assert clone.state == BufferState.UNINITIALIZED and clone.transfer_stats()["allocations"] == 0


def test_the_pickle_buffer_keeps_the_memory_alive_after_release():
    buf = filled(4096, np.uint8)
    oob = []
    payload = pickle.dumps(buf, protocol=5, buffer_callback=oob.append)
    buf.release()
    del buf
    collect()
    clone = pickle.loads(payload, buffers=oob)
    assert same_bytes(clone)


@pytest.mark.parametrize("delta", [-1, 1, -4096])
def test_a_payload_of_the_wrong_size_raises_value_error(delta):
    buf = filled(4096, np.float32)
    oob = []
    payload = pickle.dumps(buf, protocol=5, buffer_callback=oob.append)
    tampered = bytes(oob[0].raw())[:buf.nbytes + delta] if delta < 0 else bytes(oob[0].raw()) + b"\0"
    with pytest.raises(ValueError, match=r"wrong size: expected 16384 bytes .* got"):
        pickle.loads(payload, buffers=[tampered])


def test_a_payload_that_is_not_bytes_raises_a_clear_error():
    class Forged:
        def __reduce__(self):
            return lazybuf._lazybuf._rebuild_buffer_from_bytes, ((4,), "float32", False, 12345)

    with pytest.raises(TypeError, match="bytes-like"):
        pickle.loads(pickle.dumps(Forged()))
    strided = np.zeros(32, np.uint8)[::2]
    with pytest.raises(ValueError, match="C-contiguous"):
        lazybuf._lazybuf._rebuild_buffer_from_bytes((4,), "float32", False, strided)


# --- dask and distributed are optional and never imported by lazybuf ------------------------


def test_import_lazybuf_imports_neither_dask_nor_distributed():
    result = run_python(
        """
        import sys
        import numpy as np
        import lazybuf
        buf = lazybuf.UnifiedBuffer(4, np.float32)
        buf.fill(1.0)
        import pickle
        pickle.loads(pickle.dumps(buf, protocol=5))
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("dask", "distributed"))
        print("loaded:", loaded)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "loaded: []"


ORDERS = {
    "lazybuf, then dask and distributed": "import lazybuf\nimport dask.sizeof\nimport distributed",
    "dask and distributed, then lazybuf": "import dask.sizeof\nimport distributed\nimport lazybuf",
    "distributed.protocol alone, then lazybuf": "import distributed.protocol\nimport lazybuf",
    "dask, then lazybuf, then distributed": "import dask\nimport lazybuf\nimport distributed",
}


@pytest.mark.parametrize("order", list(ORDERS))
def test_registration_holds_in_every_import_order(order):
    result = run_python(
        ORDERS[order]
        + """
import sys
import numpy as np
from dask.sizeof import sizeof
from distributed.protocol import serialize, deserialize
buf = lazybuf.UnifiedBuffer((256, 4), np.float64)
buf.fill(2.0)
header, frames = serialize(buf)
clone = deserialize(header, frames)
print(sizeof(buf), header["serializer"], type(frames[0]).__name__, clone.to_numpy().sum(),
      lazybuf._dask._FINDER in sys.meta_path)
"""
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["8192", "dask", "memoryview", "2048.0", "False"]


def test_registration_holds_when_lazybuf_is_imported_while_dask_is_importing(tmp_path):
    """A dask.sizeof plugin (another package's entry point) that imports lazybuf runs while
    dask.sizeof is still being imported: the registration waits for it to finish."""
    (tmp_path / "lazybuf_probe.py").write_text("import lazybuf\n\ndef register(sizeof):\n    pass\n")
    info = tmp_path / "lazybuf_probe-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: lazybuf-probe\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[dask.sizeof]\nprobe = lazybuf_probe:register\n")
    result = run_python(
        f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        import dask
        import lazybuf
        assert sys.modules["lazybuf_probe"], "the plugin did not run"
        import numpy as np
        from dask.sizeof import sizeof
        print(sizeof(lazybuf.UnifiedBuffer(1000, np.int16)))
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "2000"


@pytest.mark.parametrize("lazybuf_first", [False, True], ids=["distributed-only", "lazybuf-first"])
def test_a_receiver_deserializes_whatever_it_imported(tmp_path, lazybuf_first):
    """The receiving process may never have imported lazybuf: unpickling the type named in the
    header imports it, and that registers the deserializer before distributed looks it up."""
    buf = filled((300, 3), np.uint16)
    header, frames = serialize(buf)
    message = tmp_path / "message.pickle"
    message.write_bytes(pickle.dumps((header, [bytes(f) for f in frames])))
    result = run_python(
        f"""
        import pickle, sys
        {"import lazybuf" if lazybuf_first else ""}
        import distributed.protocol
        had_lazybuf = "lazybuf" in sys.modules
        header, frames = pickle.loads(open({str(message)!r}, "rb").read())
        clone = distributed.protocol.deserialize(header, frames)
        import numpy as np
        print(had_lazybuf, type(clone).__name__, clone.state, clone.shape,
              int(clone.to_numpy().astype(np.int64).sum()))
        """
    )
    assert result.returncode == 0, result.stderr
    total = int(buf.to_numpy().astype(np.int64).sum())
    assert result.stdout.split() == [str(lazybuf_first), "UnifiedBuffer", "HOST_ONLY", "(300,", "3)", str(total)]


# --- sizeof and the dask family ----------------------------------------------------------


def test_sizeof_is_the_data_bytes():
    assert dask.sizeof.sizeof(UnifiedBuffer((1000, 3), np.float64)) == 24000
    assert dask.sizeof.sizeof(UnifiedBuffer((), np.int8)) == 1
    assert dask.sizeof.sizeof([UnifiedBuffer(MiB, np.uint8)] * 2) >= 2 * MiB


def test_the_dask_family_sends_the_host_copy_without_copying(device):
    buf = filled((128, 8), np.float32, device)
    state, stats = buf.state, buf.transfer_stats()
    header, frames = serialize(buf)
    assert header["serializer"] == "dask" and header["type"] == "lazybuf.UnifiedBuffer"
    assert len(frames) == 1 and isinstance(frames[0], memoryview) and frames[0].readonly
    assert buffer_address(frames[0]) == address(buf.host_readonly) and frames[0].nbytes == buf.nbytes
    assert buf.state == state and buf.transfer_stats() == stats
    clone = deserialize(header, frames)
    assert clone.state == BufferState.HOST_ONLY and same_bytes(clone)
    assert moved(clone.transfer_stats()) == 0


def test_the_dask_family_syncs_a_device_only_buffer_once(device):
    buf = filled(3000, np.float64, device)
    buf.mark_device_dirty()
    before = buf.transfer_stats()
    header, frames = serialize(buf)
    assert moved(buf.transfer_stats()) == moved(before) + 1
    assert buf.state == BufferState.SYNCHRONIZED
    assert buffer_address(frames[0]) == address(buf.host_readonly)
    assert same_bytes(deserialize(header, frames))


def test_a_64_mib_buffer_is_framed_without_an_extra_host_copy():
    buf = filled((16 * MiB,), np.float32)
    stats = buf.transfer_stats()
    start = address(buf.host_readonly)
    header, frames = serialize_and_split(buf)  # what distributed's comms send
    assert header["serializer"] == "dask"
    assert all(isinstance(f, memoryview) for f in frames)
    assert sum(f.nbytes for f in frames) == buf.nbytes == 64 * MiB
    offset = 0
    for frame in frames:  # consecutive pieces of the host copy itself
        assert buffer_address(frame) == start + offset
        offset += frame.nbytes
    assert buf.transfer_stats() == stats and buf.state == BufferState.HOST_ONLY
    clone = merge_and_deserialize(header, frames)
    assert same_bytes(clone) and moved(clone.transfer_stats()) == 0


def received(frame, offset: int = 1) -> tuple[np.ndarray, memoryview]:
    """A copy of `frame` as distributed's TCP comm hands it to a deserializer: a writable
    memoryview into a NumPy uint8 array it was read into, here at `offset` bytes in (as
    after a message's header: frames arrive at any alignment)."""
    data = np.frombuffer(frame, np.uint8)
    backing = np.empty(data.size + offset, np.uint8)
    backing[offset:] = data
    return backing, memoryview(backing)[offset:]


def test_the_receiver_adopts_a_writable_frame_as_the_host_copy(device):
    get_accelerator().select_device(device)  # the receiver's device (the fixture resets it)
    buf = filled((1000, 33), np.float64, device)  # 264,000 bytes
    header, frames = serialize(buf)
    backing, frame = received(frames[0], offset=1)
    clone = deserialize(header, [frame])
    assert clone.device_handle == device and clone.state == BufferState.HOST_ONLY
    assert address(clone.host_readonly) == address(backing) + 1  # the frame itself, no copy
    assert not clone.host_readonly.flags.aligned  # float64 at an odd address, as NumPy's would be
    assert clone.transfer_stats()["allocations"] == 0 and moved(clone.transfer_stats()) == 0
    assert same_bytes(clone) and np.array_equal(clone.host_readonly, buf.host_readonly)
    # It behaves as any buffer: a device write comes back into the adopted bytes.
    clone.sync_to_device()
    clone.fill(2.5)  # on the device, where the data is current
    assert clone.state in (BufferState.DEVICE_ONLY, BufferState.DEVICE_DIRTY)
    assert np.all(clone.to_numpy() == 2.5) and np.all(clone.host_readonly == 2.5)
    assert address(clone.host_readonly) == address(backing) + 1
    clone.host[0, 0] = -1.0
    assert clone.to_numpy()[0, 0] == -1.0 and np.frombuffer(backing[1:9], np.float64)[0] == -1.0


def test_an_adopted_frame_lives_as_long_as_its_buffer():
    import gc
    import weakref

    header, frames = serialize(filled(100_000, np.int32))
    backing, frame = received(frames[0], offset=3)
    alive = weakref.ref(backing)
    clone = deserialize(header, [frame])
    del backing, frame, frames
    gc.collect()
    assert alive() is not None and same_bytes(clone)
    view = clone.host  # a view keeps the buffer's memory, and so the frame, alive too
    del clone
    gc.collect()
    assert alive() is not None and int(view[-1]) == int(np.frombuffer(alive()[-4:], np.int32)[0])
    del view
    gc.collect()
    assert alive() is None, "the frame is given back once the buffer and its views are gone"


def test_the_receiver_copies_frames_it_must_not_adopt():
    buf = filled(64 * 1024, np.float32)  # 256 KiB
    header, frames = serialize(buf)
    cases = {
        "read-only (the sender's own memory)": frames[0],
        "bytes": bytes(frames[0]),
        "a small part of a larger allocation": memoryview(
            np.concatenate([np.frombuffer(frames[0], np.uint8), np.zeros(buf.nbytes * 2, np.uint8)])
        )[: buf.nbytes],
    }
    for why, frame in cases.items():
        clone = deserialize(header, [frame])
        assert address(clone.host_readonly) != buffer_address(frame), why
        assert clone.transfer_stats()["allocations"] == 1 and same_bytes(clone), why
    small_header, small_frames = serialize(filled(1000, np.float32))  # under 64 KiB
    _, small = received(small_frames[0])
    clone = deserialize(small_header, [small])
    assert address(clone.host_readonly) != buffer_address(small) and same_bytes(clone)
    pinned = UnifiedBuffer((64 * 1024,), np.float32, pinned=True)
    pinned.host[:] = 1.5
    pinned_header, pinned_frames = serialize(pinned)
    _, frame = received(pinned_frames[0])
    clone = deserialize(pinned_header, [frame])
    assert address(clone.host_readonly) != buffer_address(frame), "a pinned buffer gets page-locked memory"
    assert clone.pinned and np.all(clone.host_readonly == 1.5)


def test_the_same_frame_is_never_adopted_twice():
    header, frames = serialize(filled(100_000, np.float32))
    _, frame = received(frames[0])
    first = deserialize(header, [frame])
    second = deserialize(header, [frame])  # a second deserialization copies
    assert address(first.host_readonly) == buffer_address(frame)
    assert address(second.host_readonly) != buffer_address(frame)
    second.host[:] = 0
    assert same_bytes(first), "the two buffers never share bytes"
    del first
    import gc

    gc.collect()
    third = deserialize(header, [frame])  # free again once the first buffer is gone
    assert address(third.host_readonly) == buffer_address(frame)


def test_pickle_never_adopts_the_buffers_it_is_given():
    buf = filled(100_000, np.float32)
    buffers: list = []
    data = pickle.dumps(buf, protocol=5, buffer_callback=buffers.append)
    _, frame = received(buffers[0].raw())
    clone = pickle.loads(data, buffers=[frame])
    assert address(clone.host_readonly) != buffer_address(frame) and same_bytes(clone)


def test_an_uninitialized_buffer_travels_without_frames():
    header, frames = serialize(UnifiedBuffer((3, 3), np.int64))
    assert header["serializer"] == "dask" and frames == []
    clone = deserialize(header, frames)
    assert clone.state == BufferState.UNINITIALIZED and clone.shape == (3, 3)


def test_a_tampered_dask_message_raises_value_error():
    header, frames = serialize(filled(100, np.int32))
    header["sub-header"]["shape"] = [101]
    with pytest.raises(ValueError, match="wrong size: expected 404 bytes"):
        deserialize(header, frames)
    header["sub-header"]["shape"] = [100]
    with pytest.raises(ValueError, match="1 data frame"):
        deserialize(header, frames + frames)
    del header["sub-header"]["dtype"]
    with pytest.raises(ValueError, match="not the header of a serialized lazybuf.UnifiedBuffer"):
        deserialize(header, frames)


def test_a_header_is_read_as_written_and_a_missing_frame_is_a_type_error():
    """Found by a hostile script (2026-11-27): a ``None`` data frame under a header that says
    the buffer holds data gave an empty (UNINITIALIZED) buffer, silently; a string shape was
    split into characters ("16": shape (1, 6)); ``"initialized": "no"`` read as true."""
    header, frames = lazybuf._dask.dask_dumps(filled(16, np.float32))
    with pytest.raises(TypeError, match="bytes-like, got None"):
        lazybuf._dask.dask_loads(header, [None])
    for key, value in [("shape", "16"), ("initialized", "no"), ("pinned", 0)]:
        tampered = {**header, key: value}
        with pytest.raises(ValueError, match="not the header of a serialized lazybuf.UnifiedBuffer"):
            lazybuf._dask.dask_loads(tampered, frames)
    clone = lazybuf._dask.dask_loads(header, frames)  # the untouched header still reads
    np.testing.assert_array_equal(clone.to_numpy(), filled(16, np.float32).to_numpy())


# --- the cuda family ---------------------------------------------------------------------


def device_pointer(buf: UnifiedBuffer) -> int:
    return buf.device.__cuda_array_interface__["data"][0]


def test_the_cuda_family_sends_the_device_copy(cuda_device):
    buf = filled((500, 2), np.float32, cuda_device)
    buf.mark_device_dirty()  # only the device copy is current
    before = buf.transfer_stats()
    header, frames = serialize(buf, serializers=("cuda", "dask", "pickle"))
    assert header["serializer"] == "cuda"
    (frame,) = frames
    assert isinstance(frame, DeviceFrame) and frame.nbytes == buf.nbytes
    interface = frame.__cuda_array_interface__
    assert interface["shape"] == (buf.nbytes,) and interface["typestr"] == "|u1"
    assert interface["data"] == (device_pointer(buf), True) and interface["version"] == 3
    assert buf.state == BufferState.DEVICE_DIRTY and buf.transfer_stats() == before  # no host trip
    clone = deserialize(header, frames)
    assert clone.device_handle.backend == "cuda"
    assert clone.state == BufferState.DEVICE_ONLY  # copied device-to-device
    assert moved(clone.transfer_stats()) == 0
    assert same_bytes(clone)


class OnStream:
    """A device frame whose producer names its stream (as CuPy arrays do in their interface)."""

    def __init__(self, frame, stream: int):
        self.frame, self.nbytes = frame, frame.nbytes
        self.__cuda_array_interface__ = {**frame.__cuda_array_interface__, "stream": stream}


def test_a_device_frame_that_names_its_stream_is_copied_after_that_stream(cuda_device):
    source = filled((40, 25), np.uint16, cuda_device)
    source.sync_to_device()
    producer = UnifiedBuffer(1, np.uint8, device=cuda_device)  # lazybuf's stream, as a producer's
    header, frames = serialize(source, serializers=("cuda",))
    clone = deserialize(header, [OnStream(frames[0], producer.stream)])
    assert clone.state == BufferState.DEVICE_ONLY and same_bytes(clone)


def test_the_cuda_family_leaves_host_current_buffers_to_the_host_frame(cuda_device):
    buf = filled(64, np.int64, cuda_device)  # HOST_ONLY: sending the device copy would upload
    header, frames = serialize(buf, serializers=("cuda", "dask", "pickle"))
    assert header["serializer"] == "dask" and isinstance(frames[0], memoryview)
    assert moved(buf.transfer_stats()) == 0 and buf.state == BufferState.HOST_ONLY


def test_the_cuda_family_is_only_for_cuda_buffers():
    header, _ = serialize(filled(8, np.uint8), serializers=("cuda", "dask", "pickle"))
    assert header["serializer"] == "dask"
    with pytest.raises(TypeError, match="CUDA device"):
        lazybuf._lazybuf._device_frame(filled(8, np.uint8))


def test_a_cuda_frame_of_the_wrong_size_raises_value_error(cuda_device):
    buf = filled(256, np.float64, cuda_device)
    buf.sync_to_device()
    header, frames = serialize(buf, serializers=("cuda",))
    header["sub-header"]["shape"] = [255]
    with pytest.raises(ValueError, match="wrong size: expected 2040 bytes"):
        deserialize(header, frames)
    full = UnifiedBuffer(256, np.float64, device=cuda_device)
    full.fill(1.0)
    with pytest.raises(ValueError, match="holds no data"):
        lazybuf._lazybuf._fill_from_device_pointer(full, frames[0].ptr, frames[0].nbytes)
    np.testing.assert_array_equal(full.to_numpy(), np.ones(256))


def test_an_uninitialized_cuda_buffer_travels_without_frames(cuda_device):
    header, frames = serialize(UnifiedBuffer(10, np.float32, device=cuda_device), serializers=("cuda",))
    assert header["serializer"] == "cuda" and frames == []
    clone = deserialize(header, frames)
    assert clone.state == BufferState.UNINITIALIZED and clone.device_handle.backend == "cuda"


# --- a real LocalCluster -----------------------------------------------------------------

skip_cluster = pytest.mark.skipif(
    os.environ.get("LAZYBUF_SKIP_CLUSTER") == "1",
    reason="LAZYBUF_SKIP_CLUSTER=1 (scripts/test-python.sh runs the cluster tests once)",
)


def specs() -> list[tuple[int, tuple[int, ...], str]]:
    """100 buffers of mixed dtypes and shapes, from empty to 64 MiB (about 190 MiB in all)."""
    rng = np.random.default_rng(15)
    dtypes = ["float32", "float64", "int8", "uint16", "int32", "float16", "uint64", "int64", "uint8"]
    try:
        import ml_dtypes  # noqa: F401

        dtypes.append("bfloat16")
    except ImportError:
        pass
    out = []
    for i in range(100):
        dtype = dtypes[i % len(dtypes)]
        itemsize = np.dtype(dtype).itemsize if dtype != "bfloat16" else 2
        if i in (0, 1):
            shape: tuple[int, ...] = (64 * MiB // itemsize,) if i == 0 else (1024, 64 * 1024 // itemsize)
        elif i == 2:
            shape = ()
        elif i == 3:
            shape = (0, 5)
        elif i % 10 == 4:
            shape = (int(rng.integers(1, 8 * MiB)) // itemsize,)
        else:
            elements = int(rng.integers(1, 64 * 1024))
            ndim = int(rng.integers(1, 4))
            dims = [int(rng.integers(1, 40)) for _ in range(ndim - 1)]
            shape = (*dims, max(1, elements // max(1, int(np.prod(dims)))))
        out.append((i, shape, dtype))
    return out


@pytest.fixture(scope="module")
def cluster():
    """Two worker processes, one thread each, on 127.0.0.1; workers use the OpenCL device
    when there is one (so buffers really have device copies), else the host. The active
    memory manager is off, so a worker keeps the replicas the tests inspect."""
    has_opencl = any(d.backend == "opencl" for d in get_accelerator().devices)
    previous = os.environ.get("LAZYBUF_DEVICE")
    os.environ["LAZYBUF_DEVICE"] = "opencl" if has_opencl else "host"
    try:
        with dask.config.set({"distributed.scheduler.active-memory-manager.start": False}), distributed.LocalCluster(
            n_workers=2,
            processes=True,
            threads_per_worker=1,
            host="127.0.0.1",
            dashboard_address=None,
            worker_dashboard_address=None,
        ) as local, distributed.Client(local) as client:
            yield client, os.environ["LAZYBUF_DEVICE"]
    finally:
        if previous is None:
            os.environ.pop("LAZYBUF_DEVICE", None)
        else:
            os.environ["LAZYBUF_DEVICE"] = previous


@skip_cluster
def test_a_local_cluster_moves_100_buffers_between_workers(cluster):
    client, backend = cluster
    a, b = sorted(client.scheduler_info()["workers"])
    assert client.run(dask_tasks.current_device) == {a: f"{backend}:0", b: f"{backend}:0"}
    work = specs()
    made = [client.submit(dask_tasks.make, i, shape, dtype, workers=[a], pure=False) for i, shape, dtype in work]
    # A -> B: each buffer moves to worker B, which checks it and leaves odd ones DEVICE_DIRTY.
    touched = [
        client.submit(dask_tasks.arrive_and_touch, m, i, workers=[b], pure=False)
        for m, (i, _, _) in zip(made, work)
    ]
    # B -> A: each moves back (odd ones synced to the host on B first) and reports its arrival.
    back = [client.submit(dask_tasks.first, t, workers=[b], pure=False) for t in touched]
    returned = [client.submit(dask_tasks.arrived, x, workers=[a], pure=False) for x in back]
    results = client.gather(returned)  # A -> client, once every buffer has moved back to A
    # The buffers B sent, reported through `touched`, which holds the same objects on B (and
    # stays there, whatever the scheduler does with the replicas of `back`).
    on_b = client.gather([client.submit(dask_tasks.report_first, t, workers=[b], pure=False) for t in touched])
    touched_info = client.gather([client.submit(lambda t: t[1], t, workers=[b], pure=False) for t in touched])
    sizes = client.nbytes(summary=False)
    assert len(results) == 100
    for (i, shape, dtype), (buf, arrival), at_b, sent, m in zip(work, results, touched_info, on_b, made):
        assert isinstance(buf, UnifiedBuffer) and buf.shape == shape and buf.dtype.name == dtype
        assert buf.state == BufferState.HOST_ONLY, i  # rebuilt on the client from a host frame
        assert same_bytes(buf, seed=i), f"buffer {i} ({shape}, {dtype}) differs"
        # On B: arrived from A as a host copy, with nothing synced on the way.
        assert at_b["worker"] == b and at_b["bytes_ok"] and at_b["state"] == "HOST_ONLY", (i, at_b)
        assert moved(at_b["stats"]) == 0, (i, at_b)
        assert at_b["left_as"] == ("DEVICE_DIRTY" if i % 2 else "HOST_ONLY"), (i, at_b)
        # On B after sending to A: odd buffers were synced to the host once, for the send.
        assert sent["worker"] == b and sent["device"] == backend
        assert sent["state"] == ("SYNCHRONIZED" if i % 2 else "HOST_ONLY"), (i, sent)
        assert moved(sent["stats"]) == (2 if i % 2 else 0), (i, sent)
        # On A: arrived back from B as a host copy.
        assert arrival["worker"] == a and arrival["state"] == "HOST_ONLY" and moved(arrival["stats"]) == 0
        assert sizes[m.key] == buf.nbytes  # dask.sizeof on the worker: the data bytes


@skip_cluster
def test_a_64_mib_buffer_moves_between_workers_without_an_extra_copy(cluster):
    client, _ = cluster
    a, b = sorted(client.scheduler_info()["workers"])
    source = client.submit(dask_tasks.make, 64, (16 * MiB,), "float32", workers=[a], pure=False)
    frames = client.submit(dask_tasks.frames_of, source, workers=[a], pure=False).result()
    assert frames["serializer"] == "dask" and frames["memoryviews"]
    assert sum(size for _, size in frames["spans"]) == 64 * MiB
    offset = 0
    for start, size in frames["spans"]:
        assert start == frames["host"] + offset  # the host copy itself, not a copy of it
        offset += size
    assert frames["stats_after"] == frames["stats_before"]
    arrived, arrival = client.submit(dask_tasks.arrived, source, workers=[b], pure=False).result()
    assert arrival["worker"] == b and arrival["state"] == "HOST_ONLY"
    # Adopted on arrival: the received frame is the host copy (no host block allocated, no copy).
    assert moved(arrival["stats"]) == 0 and arrival["stats"]["allocations"] == 0
    sender = client.submit(dask_tasks.report, source, workers=[a], pure=False).result()
    assert sender["state"] == "HOST_ONLY" and moved(sender["stats"]) == 0  # sending copied nothing
    assert client.nbytes(summary=False)[source.key] == 64 * MiB
    assert same_bytes(arrived, seed=64)



def test_the_dask_familys_download_is_an_implicit_transfer_named_dask_serialize():
    """A hostile pass (2026-11-27): the `dask` family's host frame of a DEVICE_DIRTY buffer
    was refused under `disallow` as the engine's `host` access: it names what the user did."""
    devices = [d for d in get_accelerator().devices if d.backend in ("opencl", "cuda", "wgpu", "loopback")]
    if not devices:
        _need("opencl", "no device with memory of its own")
    from lazybuf import _dask

    buf = UnifiedBuffer((1000,), np.float32, device=devices[0])
    buf.host[:] = 1
    buf.device_writable
    before = (buf.state, buf.transfer_stats())
    with lazybuf.transfer_guard(d2h="disallow"):
        with pytest.raises(lazybuf.TransferGuardError) as info:
            _dask.dask_dumps(buf)
    assert (info.value.direction, info.value.call) == ("d2h", "dask serialize")
    assert (buf.state, buf.transfer_stats()) == before
    header, frames = _dask.dask_dumps(buf)
    np.testing.assert_array_equal(np.frombuffer(frames[0], np.float32), np.ones(1000, np.float32))
