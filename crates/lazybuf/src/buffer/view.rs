//! Device views: what a device access hands back. A view borrows the buffer, so nothing can
//! sync or free the memory while the view lives. Raw runtime handles leave only through
//! `unsafe` accessors.

use std::marker::PhantomData;

use crate::backend::host::HostDeviceMemory;
use crate::backend::{DeviceMemory, RawMemory};
use crate::device::Device;
use crate::element::Element;
use crate::error::{Error, Result};

/// A read access to a buffer's copy on a device.
#[derive(Debug)]
pub struct DeviceView<'a, T> {
    device: Device,
    memory: &'a DeviceMemory,
    len: usize,
    _element: PhantomData<&'a [T]>,
}

/// A write access to a buffer's copy on a device.
#[derive(Debug)]
pub struct DeviceViewMut<'a, T> {
    device: Device,
    memory: &'a mut DeviceMemory,
    len: usize,
    _element: PhantomData<&'a mut [T]>,
}

impl<'a, T: Element> DeviceView<'a, T> {
    pub(super) fn new(device: Device, memory: &'a DeviceMemory, len: usize) -> Self {
        DeviceView { device, memory, len, _element: PhantomData }
    }

    /// The device the view is on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Copies the device's elements into `out` (exactly `len()` of them), straight from
    /// device memory. This is I/O, not a sync: the buffer's state does not change.
    pub fn read_into(&self, out: &mut [T]) -> Result<()> {
        check_len("DeviceView::read_into", self.len, out.len())?;
        self.device.backend().download(self.memory, bytemuck::cast_slice_mut(out))
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the view is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device memory.
    pub fn memory(&self) -> &'a DeviceMemory {
        self.memory
    }

    /// The runtime handle (a `cl_mem`, a `CUdeviceptr`, a host pointer).
    ///
    /// # Safety
    /// The handle is valid while the view lives. Through a read view the memory must only be
    /// read: a write would not be tracked, and stale copies would be used as current.
    pub unsafe fn raw(&self) -> RawMemory {
        // SAFETY: forwarded contract.
        unsafe { self.memory.raw() }
    }

    /// On the host device, the elements themselves.
    pub fn as_host_slice(&self) -> Option<&'a [T]> {
        let host = self.memory.handle::<HostDeviceMemory>()?;
        // SAFETY: the view borrows the buffer shared for 'a, so nothing writes these bytes.
        Some(bytemuck::cast_slice(unsafe { host.bytes() }))
    }
}

impl<'a, T: Element> DeviceViewMut<'a, T> {
    pub(super) fn new(device: Device, memory: &'a mut DeviceMemory, len: usize) -> Self {
        DeviceViewMut { device, memory, len, _element: PhantomData }
    }

    /// The device the view is on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Writes `data` (exactly `len()` elements) into the device's copy, as a kernel would.
    /// The write access that made this view already marked the other copies stale.
    pub fn write_from(&mut self, data: &[T]) -> Result<()> {
        check_len("DeviceViewMut::write_from", self.len, data.len())?;
        self.device.backend().upload(bytemuck::cast_slice(data), self.memory)
    }

    /// Copies the device's elements into `out` (exactly `len()` of them).
    pub fn read_into(&self, out: &mut [T]) -> Result<()> {
        check_len("DeviceViewMut::read_into", self.len, out.len())?;
        self.device.backend().download(self.memory, bytemuck::cast_slice_mut(out))
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the view is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device memory.
    pub fn memory(&self) -> &DeviceMemory {
        &*self.memory
    }

    /// The runtime handle, for a kernel that writes the buffer.
    ///
    /// # Safety
    /// The handle is valid while the view lives; any work using it must be complete (or
    /// ordered before lazybuf's next operation on the device's queue) when the view is dropped.
    pub unsafe fn raw(&self) -> RawMemory {
        // SAFETY: forwarded contract.
        unsafe { self.memory.raw() }
    }

    /// On the host device, the elements themselves, for writing.
    pub fn as_host_slice_mut(&mut self) -> Option<&mut [T]> {
        let host = self.memory.handle::<HostDeviceMemory>()?;
        // SAFETY: the view was created from `&mut` of the buffer, so for its lifetime it is
        // the only access to these bytes; `&mut self` makes the returned slice unique.
        Some(bytemuck::cast_slice_mut(unsafe { host.bytes_mut() }))
    }
}

fn check_len(operation: &'static str, expected: usize, actual: usize) -> Result<()> {
    if expected != actual {
        return Err(Error::LengthMismatch { operation, expected, actual });
    }
    Ok(())
}
