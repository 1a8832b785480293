"""Devices, device selection and memory information (get_accelerator())."""

import numpy as np
import pytest

import lazybuf
from conftest import collect, run_python
from lazybuf import Device, UnifiedBuffer, get_accelerator


@pytest.fixture
def acc():
    accelerator = get_accelerator()
    yield accelerator
    accelerator.select_device(None)  # back to the default for the next test


def test_devices_are_listed_with_the_host_last(acc):
    devices = acc.devices
    assert acc.device_count == len(devices) >= 1
    assert devices[-1].backend == "host"
    assert devices == acc.devices  # the same devices every time
    assert len({hash(d) for d in devices}) == len(devices)
    for device in devices:
        assert device.name and device.selector.startswith(device.backend + ":")
        assert device.total_memory > 0
        assert isinstance(device.shares_host_memory, bool) and isinstance(device.is_gpu, bool)
        assert device.selector in repr(device)


def test_host_memory_info_is_the_systems(acc, host_device):
    free, total = host_device.get_memory_info()
    assert 0 < free <= total
    assert host_device.memory_source == "system"
    assert acc.get_memory_info("host") == pytest.approx((free, total), rel=0.05)


def test_opencl_memory_info_counts_what_this_process_holds(acc, opencl_device):
    # What earlier tests left: a pool's cached block of this size would serve the buffer
    # below without changing what is held, and garbage collected in between would.
    collect()
    lazybuf.trim()
    free, total = acc.get_memory_info(opencl_device)
    assert total == opencl_device.total_memory
    assert opencl_device.memory_source == "total_minus_process_held"
    buf = UnifiedBuffer(1 << 16, np.float32, device=opencl_device)  # 256 KiB: a real cl_mem
    buf.mark_device_dirty()
    assert acc.get_memory_info(opencl_device) == (free - (1 << 18), total)


def test_select_device_sets_where_new_buffers_go(acc, opencl_device, host_device):
    assert acc.select_device(opencl_device) == opencl_device
    assert acc.current_device == opencl_device
    assert UnifiedBuffer(3).device_handle == opencl_device
    assert acc.get_memory_info() == opencl_device.get_memory_info()
    assert acc.select_device("host") == host_device
    assert UnifiedBuffer(3).device_handle == host_device
    index = acc.devices.index(opencl_device)
    assert acc.select_device(index) == opencl_device
    assert acc.select_device(None) == acc.current_device


def test_explicit_device_argument(opencl_device, host_device):
    assert UnifiedBuffer(3, device=opencl_device.selector).device_handle == opencl_device
    assert UnifiedBuffer(3, device=opencl_device).device_handle == opencl_device
    assert UnifiedBuffer(3, device="host").device_handle == host_device


def test_environment_variable_picks_the_default_device(opencl_device):
    result = run_python(
        f"""
        import os
        os.environ["LAZYBUF_DEVICE"] = {opencl_device.selector!r}
        import lazybuf
        print(lazybuf.get_accelerator().current_device.selector, lazybuf.UnifiedBuffer(2).device_handle.backend)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [opencl_device.selector, "opencl"]


def test_backend_status_and_availability(acc):
    status = dict(acc.backend_status)
    assert status["host"] == 1
    assert acc.is_available("host")
    assert not acc.is_available("metal")
    assert acc.is_available("opencl") == (isinstance(status.get("opencl"), int) and status["opencl"] > 0)
    assert "Accelerator" in repr(acc)
    acc.synchronize()


def test_device_is_not_constructible_from_python():
    with pytest.raises(TypeError):
        Device()
