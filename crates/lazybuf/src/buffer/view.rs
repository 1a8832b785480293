//! Device views: what a device access hands back. A view borrows the buffer, so nothing can
//! sync or free the memory while the view lives. Raw runtime handles leave only through
//! `unsafe` accessors.
//!
//! **Ordering with the caller's work.** Kernels that use a view's memory belong on the view's
//! stream ([`DeviceView::stream`]): lazybuf's later transfers on that stream run after them,
//! and work on other streams, host writes into memory the copy aliases and the memory's
//! release wait for a marker of it. Work on another stream is ordered by handing lazybuf a
//! ticket of it ([`DeviceViewMut::used_until`], [`DeviceView::used_until`]).

use std::marker::PhantomData;

use super::raw::DeviceCopy;
use crate::backend::{DeviceMemory, HostSpan, RawMemory, Ticket};
use crate::device::{Device, Stream};
use crate::element::Element;
use crate::error::{Error, Result};

/// A read access to a buffer's copy on a device.
#[derive(Debug)]
pub struct DeviceView<'a, T> {
    copy: &'a mut DeviceCopy,
    len: usize,
    _element: PhantomData<&'a [T]>,
}

/// A write access to a buffer's copy on a device.
#[derive(Debug)]
pub struct DeviceViewMut<'a, T> {
    copy: &'a mut DeviceCopy,
    len: usize,
    _element: PhantomData<&'a mut [T]>,
}

/// Copies the copy's first `out.len()` bytes into `out`, waiting for it.
fn read(copy: &DeviceCopy, out: &mut [u8]) -> Result<()> {
    // SAFETY: `out` is exclusively borrowed until the ticket is waited for, here.
    unsafe { copy.stream.download(&copy.memory, HostSpan::of_mut_slice(out))? }.wait()
}

/// The elements of a copy the host can address, `len` of them.
fn host_slice<T: Element>(copy: &DeviceCopy, len: usize) -> Option<(*mut T, usize)> {
    let address = copy.memory.host_address()?;
    // An alias of adopted host memory may be misaligned for T: no slice then.
    let ptr = address.as_ptr().cast::<T>();
    ptr.is_aligned().then_some((ptr, len))
}

impl<'a, T: Element> DeviceView<'a, T> {
    pub(super) fn new(copy: &'a mut DeviceCopy, len: usize) -> Self {
        DeviceView { copy, len, _element: PhantomData }
    }

    /// The device the view is on.
    pub fn device(&self) -> &Device {
        &self.copy.device
    }

    /// The stream lazybuf orders this copy's transfers on: enqueue kernels that use the view
    /// there.
    pub fn stream(&self) -> &Stream {
        &self.copy.stream
    }

    /// Copies the device's elements into `out` (exactly `len()` of them), straight from
    /// device memory. This is I/O, not a sync: the buffer's state does not change.
    pub fn read_into(&self, out: &mut [T]) -> Result<()> {
        check_len("DeviceView::read_into", self.len, out.len())?;
        read(self.copy, bytemuck::cast_slice_mut(out))
    }

    /// Tells lazybuf that work outside the view's stream reads the memory until `ticket`
    /// completes: later writes of this copy and its release wait for it.
    pub fn used_until(&mut self, ticket: Ticket) {
        self.copy.used_until(ticket);
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
        &self.copy.memory
    }

    /// The runtime handle (a `cl_mem`, a `CUdeviceptr`, a host pointer).
    ///
    /// # Safety
    /// The handle is valid while the view lives. Through a read view the memory must only be
    /// read: a write would not be tracked, and stale copies would be used as current.
    pub unsafe fn raw(&self) -> RawMemory {
        // SAFETY: forwarded contract.
        unsafe { self.copy.memory.raw() }
    }

    /// On a device whose memory the host addresses directly (the host device), the view's
    /// elements themselves; `None` elsewhere, and where that memory is misaligned for `T` (an
    /// alias of adopted host memory, see [`crate::RawBuffer::adopt_host`]).
    pub fn as_host_slice(&self) -> Option<&[T]> {
        let (ptr, len) = host_slice::<T>(self.copy, self.len)?;
        // SAFETY: the memory holds at least the buffer's len elements (blocks may be longer;
        // only the view's elements are exposed), initialized, and the view borrows the buffer,
        // so nothing writes them while the returned slice lives.
        Some(unsafe { std::slice::from_raw_parts(ptr, len) })
    }
}

impl<'a, T: Element> DeviceViewMut<'a, T> {
    pub(super) fn new(copy: &'a mut DeviceCopy, len: usize) -> Self {
        DeviceViewMut { copy, len, _element: PhantomData }
    }

    /// The device the view is on.
    pub fn device(&self) -> &Device {
        &self.copy.device
    }

    /// The stream lazybuf orders this copy's transfers on: enqueue kernels that write the
    /// view there.
    pub fn stream(&self) -> &Stream {
        &self.copy.stream
    }

    /// Writes `data` (exactly `len()` elements) into the device's copy, as a kernel would.
    /// The write access that made this view already marked the other copies stale.
    pub fn write_from(&mut self, data: &[T]) -> Result<()> {
        check_len("DeviceViewMut::write_from", self.len, data.len())?;
        let copy = &mut *self.copy;
        let span = HostSpan::of_slice(bytemuck::cast_slice(data));
        // SAFETY: `data` is borrowed until the ticket is waited for, here.
        unsafe { copy.stream.upload(span, &mut copy.memory)? }.wait()
    }

    /// Copies the device's elements into `out` (exactly `len()` of them).
    pub fn read_into(&self, out: &mut [T]) -> Result<()> {
        check_len("DeviceViewMut::read_into", self.len, out.len())?;
        read(self.copy, bytemuck::cast_slice_mut(out))
    }

    /// Tells lazybuf that work outside the view's stream writes the memory until `ticket`
    /// completes (an event of your stream after your kernel): later transfers of this copy
    /// and its release wait for it.
    pub fn used_until(&mut self, ticket: Ticket) {
        self.copy.used_until(ticket);
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
        &self.copy.memory
    }

    /// The runtime handle, for a kernel that writes the buffer.
    ///
    /// # Safety
    /// The handle is valid while the view lives. Work using it must be enqueued on the view's
    /// stream, or declared with [`DeviceViewMut::used_until`].
    pub unsafe fn raw(&self) -> RawMemory {
        // SAFETY: forwarded contract.
        unsafe { self.copy.memory.raw() }
    }

    /// On a device whose memory the host addresses directly (the host device), the view's
    /// elements themselves, for writing; `None` as for [`DeviceView::as_host_slice`].
    pub fn as_host_slice_mut(&mut self) -> Option<&mut [T]> {
        let (ptr, len) = host_slice::<T>(self.copy, self.len)?;
        // SAFETY: the memory holds at least the buffer's len elements, initialized; the view
        // was created from `&mut` of the buffer, so for its lifetime it is the only access to
        // these bytes, and `&mut self` makes the returned slice unique.
        Some(unsafe { std::slice::from_raw_parts_mut(ptr, len) })
    }
}

fn check_len(operation: &'static str, expected: usize, actual: usize) -> Result<()> {
    if expected != actual {
        return Err(Error::LengthMismatch { operation, expected, actual, unit: "elements" });
    }
    Ok(())
}
