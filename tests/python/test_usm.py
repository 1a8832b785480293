"""dpctl's USM memory tests (dpctl/tests/test_sycl_usm.py), adapted to lazybuf's memory
objects, plus what lazybuf adds (every device, prefetch, exports, pickled devices that are
gone, faults, bad input).

Names: dpctl's MemoryUSMDevice/Host/Shared are lazybuf.MemoryDevice/Host/Shared, `queue=` is
`device=`, `_pointer` is `ptr`, `__sycl_usm_array_interface__` is the CUDA array interface (CUDA
devices) and DLPack. Every test runs on every device lazybuf finds: the host device, PoCL's
OpenCL device, and the CUDA devices of the driver test double when scripts/test-python.sh loads
it. Not adapted, because lazybuf has no SYCL contexts, queues or capsules: the context and queue
cases (test_memory_cpu_context, test_memory_gpu_context, test_usm_type_exceptions,
test_with_constructor, test_cpython_api, test_memory_copy_between_contexts, the syclobj forms of
test_suai_invalid_suai) and zero-copy views of foreign (strided) memory
(test_suai_non_contig_1D/2D: lazybuf copies foreign memory and refuses strided sources, tested
below). Adaptations: `reference_obj` is the memory object shared from (dpctl: None); size 0 is
allowed; get_usm_type() takes no argument and there is no get_usm_type_enum().
"""

import os
import pickle
import subprocess
import sys
import warnings

import numpy as np
import pytest

import lazybuf
from lazybuf import MemoryDevice, MemoryHost, MemoryShared

KINDS = {MemoryDevice: "device", MemoryHost: "host", MemoryShared: "shared"}


def _usm_devices():
    """Devices with all three USM kinds. wgpu devices have device memory only (no page-locked
    host memory, no shared memory): their memory objects and refusals are tested in
    test_wgpu.py. Other devices without shared memory (`Device.shared_memory`: NVIDIA's
    OpenCL has only coarse-grained SVM) are tested by
    test_devices_without_shared_memory_have_the_other_kinds_and_refuse_it_clearly."""
    return [d for d in lazybuf.get_accelerator().devices if d.backend != "wgpu" and d.shared_memory]


def _selectors():
    return [d.selector for d in _usm_devices()]


@pytest.fixture(params=_selectors())
def device(request):
    """Each device in turn, made the current one (so memory objects land there)."""
    accelerator = lazybuf.get_accelerator()
    accelerator.select_device(request.param)
    yield accelerator.current_device
    accelerator.select_device("host")


@pytest.fixture(params=list(KINDS), ids=list(KINDS.values()))
def memory_ctor(request):
    return request.param


def _pattern(n, seed=0):
    return bytes((i * 31 + seed) % 256 for i in range(n))


def test_memory_create(device, memory_ctor):
    nbytes = 1024
    mobj = memory_ctor(nbytes, alignment=64, device=device)
    assert mobj.nbytes == nbytes
    assert mobj.size == nbytes
    assert len(mobj) == nbytes
    assert mobj.device == device
    assert mobj.alignment >= 64
    assert isinstance(repr(mobj), str)
    assert type(bytes(mobj)) is bytes
    assert sys.getsizeof(mobj) >= nbytes
    assert mobj.get_usm_type() == KINDS[memory_ctor] == mobj.kind


def test_memory_create_with_np(device):
    nbytes = 16384
    mobj = MemoryShared(np.int64(nbytes))
    assert mobj.nbytes == nbytes


def test_memory_without_context(device):
    mobj = MemoryShared(1024)
    assert mobj.get_usm_type() == "shared"


@pytest.mark.parametrize("ctor", [MemoryShared, MemoryHost])
def test_buffer_protocol(device, ctor):
    mobj = ctor(1024)
    mv1 = memoryview(mobj)
    mv2 = memoryview(mobj)
    assert mv1 == mv2
    mv1[:3] = b"abc"
    assert mobj.tobytes()[:3] == b"abc", "the view is the memory"
    assert bytes(np.asarray(mobj)[:3]) == b"abc"


def test_device_memory_has_no_buffer_protocol(device):
    with pytest.raises(TypeError):
        memoryview(MemoryDevice(16))


def test_copy_host_roundtrip(device, memory_ctor):
    mobj = memory_ctor(1024)
    host_src_obj = bytearray(mobj.nbytes)
    for i in range(mobj.nbytes):
        host_src_obj[i] = (i % 32) + ord("a")
    mobj.copy_from_host(host_src_obj)
    host_dest_obj = mobj.copy_to_host()
    del mobj
    assert host_src_obj == host_dest_obj.tobytes()


def test_zero_copy(device, memory_ctor):
    mobj = memory_ctor(32)
    mobj.copy_from_host(_pattern(32))
    mobj2 = type(mobj)(mobj)
    assert mobj2.reference_obj is mobj
    assert mobj2.ptr == mobj.ptr
    mobj2.memset(7)
    assert mobj.tobytes() == b"\x07" * 32, "one memory"
    del mobj
    assert mobj2.tobytes() == b"\x07" * 32, "the source is kept alive"


def test_pickling(device, memory_ctor):
    mobj = memory_ctor(1024, alignment=64)
    host_src_obj = bytearray(mobj.nbytes)
    for i in range(mobj.nbytes):
        host_src_obj[i] = (i % 32) + ord("a")
    mobj.copy_from_host(host_src_obj)

    mobj_reconstructed = pickle.loads(pickle.dumps(mobj))
    assert type(mobj) is type(mobj_reconstructed), "Pickling should preserve type"
    assert mobj.tobytes() == mobj_reconstructed.tobytes(), "Pickling should preserve buffer content"
    assert mobj.ptr != mobj_reconstructed.ptr, "Pickling/unpickling should be changing pointer"
    assert mobj_reconstructed.device == device, "the device is recorded"


def test_pickling_out_of_band(device, memory_ctor):
    mobj = memory_ctor(64)
    mobj.copy_from_host(_pattern(64))
    buffers = []
    data = pickle.dumps(mobj, protocol=5, buffer_callback=buffers.append)
    assert len(buffers) == 1
    assert pickle.loads(data, buffers=buffers).tobytes() == _pattern(64)


def test_pickling_reconstructor_invalid_type(device, memory_ctor):
    mobj = memory_ctor(1024, alignment=64)
    # Fresh memory is uninitialized: it can hold the kind's name (a CI run's PoCL block held
    # "device"), and the search below must find the pickled kind, not the data's bytes.
    mobj.memset(0)
    good_pickle_bytes = pickle.dumps(mobj)
    usm_types = KINDS[memory_ctor].encode("utf-8")
    i = good_pickle_bytes.rfind(usm_types)
    bad_pickle_bytes = good_pickle_bytes[:i] + b"u" + good_pickle_bytes[i + 1 :]
    with pytest.raises(ValueError, match="kind"):
        pickle.loads(bad_pickle_bytes)


def test_pickle_of_a_device_this_process_lacks(device, memory_ctor):
    data = np.frombuffer(b"kept", np.uint8)
    with pytest.warns(RuntimeWarning, match="opencl:9"):
        mobj = lazybuf._lazybuf._rebuild_memory("opencl:9", KINDS[memory_ctor], data)
    assert type(mobj) is memory_ctor
    assert mobj.tobytes() == b"kept"
    assert mobj.device == device, "the current device"


@pytest.mark.parametrize("alignment", [None, 64])
def test_create_with_size_and_alignment_and_device(device, memory_ctor, alignment):
    kwargs = {} if alignment is None else {"alignment": alignment}
    m = memory_ctor(1024, device=device, **kwargs)
    assert m.nbytes == 1024
    assert m.get_usm_type() == KINDS[memory_ctor]
    assert m.alignment >= (alignment or 1)


def test_sycl_usm_array_interface(device, memory_ctor):
    m = memory_ctor(256)
    m2 = MemoryShared(m.nbytes)
    hb = np.random.randint(0, 256, size=256, dtype="|u1")
    m2.copy_from_host(hb)
    # test that USM array interface works with SyclContext as 'syclobj'
    m.copy_from_device(m2)
    assert np.array_equal(m.copy_to_host(), hb)


def test_memory_construction_from_other_memory_objects(device):
    m_sh = MemoryShared(256)
    m_de = MemoryDevice(256)
    m_ho = MemoryHost(256)
    for m in (m_sh, m_de, m_ho):
        m.copy_from_host(_pattern(256, seed=m.nbytes))
    with pytest.raises(ValueError):
        MemoryDevice(m_sh)
    with pytest.raises(ValueError):
        MemoryHost(m_de)
    with pytest.raises(ValueError):
        MemoryShared(m_ho)
    m1 = MemoryDevice(m_sh, copy=True)
    m2 = MemoryHost(m_de, copy=True)
    m3 = MemoryShared(m_de, copy=True)
    assert bytes(m1) == bytes(m_sh)
    assert bytes(m2) == bytes(m_de)
    assert bytes(m3) == bytes(m_de)
    assert m1.reference_obj is None


def test_memset(device):
    m = MemoryDevice(256)
    m.copy_from_host(_pattern(256))
    m.memset()
    assert m.tobytes() == b"\x00" * 256

    m = MemoryShared(256)
    m.memset(ord("j"))
    assert m.tobytes() == b"j" * 256

    m = MemoryHost(256)
    m.memset(ord("7"))
    assert m.tobytes() == b"7" * 256


def test_copy_from_host_prefix_and_validation(device, memory_ctor):
    m = memory_ctor(10)
    m.memset(0)
    m.copy_from_host(b"abc")
    assert m.tobytes() == b"abc" + b"\x00" * 7, "a shorter source fills a prefix"
    m.copy_from_host(b"")
    for source in (b"abc", bytearray(b"abc"), memoryview(b"abc"), np.frombuffer(b"abc", np.uint8)):
        m.copy_from_host(source)
    with pytest.raises(ValueError, match="too large"):
        m.copy_from_host(b"x" * 11)
    with pytest.raises(TypeError, match="buffer protocol"):
        m.copy_from_host("abc")
    with pytest.raises(ValueError, match="format"):
        m.copy_from_host(np.zeros(2, np.uint16))
    with pytest.raises(ValueError, match="contiguous"):
        m.copy_from_host(np.zeros(8, np.uint8)[::2])
    with pytest.raises(ValueError, match="1-d"):
        m.copy_from_host(np.zeros((2, 2), np.uint8))
    assert m.tobytes() == b"abc" + b"\x00" * 7, "rejected calls changed nothing"


def test_copy_to_host_destinations(device, memory_ctor):
    m = memory_ctor(4)
    m.copy_from_host(b"wxyz")
    dest = bytearray(6)
    assert m.copy_to_host(dest) is dest
    assert dest == b"wxyz\x00\x00"
    with pytest.raises(ValueError, match="too small"):
        m.copy_to_host(bytearray(3))
    with pytest.raises(ValueError, match="writable"):
        m.copy_to_host(b"1234")
    with pytest.raises(TypeError):
        m.copy_to_host(1234)


def test_copy_from_device_sources(device, memory_ctor):
    """From memory objects of every kind on every device, DeviceBuffers, and (CUDA) the CUDA
    array interface and DLPack of foreign objects."""
    for other in _usm_devices():
        for ctor in KINDS:
            src = ctor(5, device=other)
            src.copy_from_host(b"12345")
            m = memory_ctor(8)
            m.memset(ord("."))
            m.copy_from_device(src)
            assert m.tobytes() == b"12345...", (other, ctor)
    m = memory_ctor(8)
    m.memset(ord("."))
    m.copy_from_device(lazybuf.DeviceBuffer.to_device(b"ab"))
    assert m.tobytes() == b"ab......"
    with pytest.raises(ValueError, match="too large"):
        m.copy_from_device(lazybuf.DeviceBuffer.to_device(b"x" * 9))
    with pytest.raises(ValueError, match="device memory"):
        m.copy_from_device(bytearray(3))
    m.copy_from_device(m)
    assert m.tobytes() == b"ab......", "onto itself: nothing changes"


class FakeCudaArray:
    def __init__(self, **iface):
        self.__cuda_array_interface__ = iface


GOOD = {"version": 3, "data": (0, False), "shape": (0,), "typestr": "|u1", "strides": None}


@pytest.mark.parametrize(
    "change",
    [
        {"version": 4},
        {"version": "x"},
        {"data": ()},
        {"shape": (-1,)},
        {"shape": None},
        {"typestr": "invalid"},
        {"typestr": "O"},
        {"strides": Ellipsis},
        {"shape": (4,), "strides": (2,)},
        {"mask": object()},
    ],
)
def test_invalid_cuda_array_interface(device, change):
    with pytest.raises(ValueError):
        MemoryDevice(16).copy_from_device(FakeCudaArray(**{**GOOD, **change}))


def test_cuda_array_interface_pointer_must_be_device_memory(device):
    iface = {**GOOD, "data": (12345678, False), "shape": (4,)}
    with pytest.raises(ValueError, match="not memory of any CUDA device"):
        MemoryDevice(16).copy_from_device(FakeCudaArray(**iface))


def test_foreign_memory_needs_copy(device):
    db = lazybuf.DeviceBuffer.to_device(b"abc")
    with pytest.raises(ValueError, match="copy=True"):
        MemoryDevice(db)
    m = MemoryDevice(db, copy=True)
    assert m.tobytes() == b"abc"
    # Not memory and not a size: a TypeError saying what was expected.
    with pytest.raises(TypeError, match="expected"):
        MemoryDevice("abc")
    with pytest.raises(TypeError, match="expected"):
        MemoryDevice(1.5)


def test_exports(device, memory_ctor):
    m = memory_ctor(3)
    m.copy_from_host(b"dlp")
    # Host memory, and shared memory everywhere but CUDA (managed memory), is CPU memory.
    cpu = memory_ctor is MemoryHost or device.backend == "host" or (
        memory_ctor is MemoryShared and device.backend != "cuda"
    )
    if cpu:
        assert m.__dlpack_device__() == (1, 0)
        array = np.from_dlpack(m)
        assert array.tobytes() == b"dlp"
        del m
        assert array.tobytes() == b"dlp", "the tensor keeps the memory alive"
    elif device.backend == "cuda":
        kind = 2 if memory_ctor is MemoryDevice else 13
        assert m.__dlpack_device__() == (kind, int(device.selector.split(":")[1]))
        iface = m.__cuda_array_interface__
        assert iface["data"] == (m.ptr, False) and iface["shape"] == (3,)
        copy = MemoryHost(3)
        copy.copy_from_device(m)
        assert copy.tobytes() == b"dlp"
    else:
        title = {"opencl": "OpenCL", "loopback": "loopback"}[device.backend]
        with pytest.raises(BufferError, match=title):
            m.__dlpack__()
    if device.backend != "cuda":
        with pytest.raises(AttributeError):
            MemoryDevice(1).__cuda_array_interface__


def test_prefetch(device):
    m = MemoryShared(4096)
    m.copy_from_host(_pattern(4096))
    m.prefetch("device")
    m.prefetch(to="host")
    assert m.tobytes() == _pattern(4096)
    with pytest.raises(ValueError, match="device"):
        m.prefetch("elsewhere")


def test_bad_input(device):
    with pytest.raises(ValueError, match="negative"):
        MemoryDevice(-1)
    with pytest.raises(ValueError, match="power of two"):
        MemoryDevice(16, alignment=3)
    with pytest.raises(ValueError, match="exceeds"):
        MemoryDevice(16, alignment=1 << 30)
    m = MemoryShared(4)
    with pytest.raises(ValueError, match="byte"):
        m.memset(256)
    with pytest.raises(ValueError, match="byte"):
        m.memset(-1)
    with pytest.raises(TypeError):
        lazybuf.Memory(4)


@pytest.mark.parametrize("alignment", [1 << 63, 1 << 64, 1 << 200])
def test_an_alignment_too_large_is_a_value_error_naming_it(device, memory_ctor, alignment):
    """A hostile pass (2026-11-27): 2**63 and above raised OverflowError ("Python int too large
    to convert to C long"), naming no argument."""
    with pytest.raises(ValueError, match="alignment"):
        memory_ctor(16, alignment=alignment)


@pytest.mark.parametrize("alignment", ["64", 64.0, True, np.zeros(1, np.int64)])
def test_an_alignment_that_is_no_int_is_a_type_error_naming_it(device, memory_ctor, alignment):
    with pytest.raises(TypeError, match="alignment"):
        memory_ctor(16, alignment=alignment)


def test_alignments_take_numpy_integers_and_non_positive_ones_ask_for_the_kinds_own(device, memory_ctor):
    assert memory_ctor(16, alignment=np.int64(64)).alignment >= 64
    for alignment in (0, -1, -(1 << 70)):
        assert memory_ctor(16, alignment=alignment).alignment >= 1


def test_empty_memory(device, memory_ctor):
    m = memory_ctor(0)
    assert (m.nbytes, m.tobytes(), m.ptr) == (0, b"", 0)
    m.copy_from_host(b"")
    assert m.copy_to_host().size == 0


def test_faults_raise_and_keep_what_was_not_written(device, memory_ctor):
    testing = pytest.importorskip("lazybuf.testing")
    faulty = testing.FaultyDevice(device)
    faulty.fail_allocation_in(1)
    with pytest.raises(RuntimeError, match="injected fault"):
        memory_ctor(40_001, device=faulty)
    m = memory_ctor(100, device=faulty)
    m.memset(5)
    if memory_ctor is not MemoryHost:  # host memory is copied by the host, not the device
        faulty.fail_copy_in(1)
        with pytest.raises(RuntimeError, match="injected fault"):
            m.copy_from_host(b"\x01" * 10)
        assert m.tobytes()[10:] == b"\x05" * 90
        faulty.fail_copy_in(1)
        with pytest.raises(RuntimeError, match="injected fault"):
            m.tobytes()
    faulty.disarm()
    assert m.tobytes()[10:] == b"\x05" * 90


def _double_loaded():
    return any(d.backend == "cuda" and "test double" in d.name for d in lazybuf.get_accelerator().devices)


def test_shared_memory_where_a_device_has_none_is_a_clear_error():
    """The CUDA double without managed memory (as a GPU without it): MemoryShared says why."""
    if not _double_loaded():
        pytest.skip("needs the CUDA test double (scripts/test-python.sh loads it)")
    code = (
        "import lazybuf\n"
        "try:\n"
        "    lazybuf.MemoryShared(64, device='cuda:0')\n"
        "except ValueError as e:\n"
        "    print('ValueError', e)\n"
    )
    env = {**os.environ, "LAZYBUF_CUDA_DOUBLE_MANAGED": "0"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.startswith("ValueError") and "managed" in out.stdout, out.stdout + out.stderr


def test_unpickling_with_warnings_as_errors_on_a_present_device(device, memory_ctor):
    m = memory_ctor(4)
    m.copy_from_host(b"same")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert pickle.loads(pickle.dumps(m)).tobytes() == b"same"


@pytest.mark.parametrize("ctor", [MemoryShared, MemoryHost])
def test_copies_between_a_memory_and_a_view_of_itself(device, ctor):
    """Overlapping copies (the memory and a view of it) copy through a temporary."""
    m = ctor(16)
    m.copy_from_host(bytes(range(16)))
    m.copy_from_host(memoryview(m)[4:12])
    assert m.tobytes() == bytes([4, 5, 6, 7, 8, 9, 10, 11, 8, 9, 10, 11, 12, 13, 14, 15])
    before = m.tobytes()
    assert m.copy_to_host(memoryview(m)) is not None
    assert m.tobytes() == before
    view = np.from_dlpack(m)[2:6]
    m.copy_from_device(view)
    assert m.tobytes()[:4] == before[2:6] and m.tobytes()[4:] == before[4:]


def test_devices_without_shared_memory_have_the_other_kinds_and_refuse_it_clearly():
    """A device that says it has no shared memory (`Device.shared_memory`) refuses
    MemoryShared with a ValueError saying so, and has device and host memory objects; one that
    says it has it allocates it. wgpu (device memory only) is test_wgpu.py's."""
    for device in lazybuf.get_accelerator().devices:
        if device.backend == "wgpu":
            assert not device.shared_memory
            continue
        if device.shared_memory:
            assert MemoryShared(64, device=device).nbytes == 64
            continue
        with pytest.raises(ValueError, match="shared memory"):
            MemoryShared(64, device=device)
        for ctor in (MemoryDevice, MemoryHost):
            m = ctor(5, device=device)
            m.copy_from_host(b"12345")
            assert m.tobytes() == b"12345", (device, ctor)
