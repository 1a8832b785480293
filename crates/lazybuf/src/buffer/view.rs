//! Device views: what a device access hands back. A view borrows the buffer, so nothing can
//! sync or free the memory while the view lives. Raw runtime handles leave only through
//! `unsafe` accessors.

use std::marker::PhantomData;

use crate::backend::host::HostDeviceMemory;
use crate::backend::{DeviceMemory, RawMemory};
use crate::element::Element;

/// A read access to a buffer's copy on a device.
#[derive(Debug)]
pub struct DeviceView<'a, T> {
    memory: &'a DeviceMemory,
    len: usize,
    _element: PhantomData<&'a [T]>,
}

/// A write access to a buffer's copy on a device.
#[derive(Debug)]
pub struct DeviceViewMut<'a, T> {
    memory: &'a DeviceMemory,
    len: usize,
    _element: PhantomData<&'a mut [T]>,
}

impl<'a, T: Element> DeviceView<'a, T> {
    pub(super) fn new(memory: &'a DeviceMemory, len: usize) -> Self {
        DeviceView { memory, len, _element: PhantomData }
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
    pub(super) fn new(memory: &'a DeviceMemory, len: usize) -> Self {
        DeviceViewMut { memory, len, _element: PhantomData }
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
        self.memory
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
