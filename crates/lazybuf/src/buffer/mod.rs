//! [`UnifiedBuffer<T>`]: an N-d array whose copies in host and device memory are kept
//! coherent. This is the typed edge over the untyped engine in [`raw`]; the rules it follows
//! are in [`crate::coherence`].
//!
//! Borrows say what an access is: `host()` (a shared slice) is a read, `host_mut()` is a
//! write, `host_overwrite()` is a write that skips the sync because every element will be
//! overwritten. The same three exist for the device. Each may copy first, so each takes
//! `&mut self` and returns a `Result`, and each returns only once its copies are done. The
//! `*_async` syncs return at once with a [`Transfer`] (see [`raw`] for the state of a buffer
//! while a transfer is in flight, and after one fails).
//!
//! The borrow checker enforces the access rules, as rust-numpy's borrows do for arrays. A live
//! device view borrows the buffer, so no host write can change bytes a kernel is using:
//!
//! ```compile_fail
//! # fn main() -> lazybuf::Result<()> {
//! let mut buf = lazybuf::UnifiedBuffer::<f32>::on(&[16], &lazybuf::Device::host())?;
//! let view = buf.device()?; // the kernel's handle comes from here
//! buf.host_mut()?[0] = 1.0; // error: `buf` is still borrowed by `view`
//! drop(view);
//! # Ok(()) }
//! ```
//!
//! and a host slice borrows it too, so no sync can move bytes under it:
//!
//! ```compile_fail
//! # fn main() -> lazybuf::Result<()> {
//! let mut buf = lazybuf::UnifiedBuffer::<f32>::on(&[16], &lazybuf::Device::host())?;
//! let host = buf.host()?;
//! buf.sync_to_device()?; // error: `buf` is still borrowed by `host`
//! println!("{}", host[0]);
//! # Ok(()) }
//! ```
//!
//! Ending the borrow first is what compiles:
//!
//! ```
//! # fn main() -> lazybuf::Result<()> {
//! let mut buf = lazybuf::UnifiedBuffer::<f32>::on(&[16], &lazybuf::Device::host())?;
//! buf.host_mut()?.fill(1.0);
//! {
//!     let _view = buf.device_mut()?; // a kernel writes the device copy here
//! }
//! assert_eq!(buf.host()?[0], 1.0);
//! # Ok(()) }
//! ```

mod inflight;
mod raw;
mod stats;
mod view;

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

pub use raw::{AsCall, RawBuffer};
pub use stats::{Traffic, TransferStats};
pub use view::{DeviceView, DeviceViewMut};

use crate::backend::Ticket;
use crate::coherence::{Access, BufferState, Location, Residency};
use crate::device::{Device, Stream};
use crate::element::{DType, Element};
use crate::error::{Error, Result};
use crate::resource::MemoryResource;
use crate::shape::Shape;

/// Options for a new buffer.
#[derive(Clone, Debug, Default)]
pub struct BufferOptions {
    /// The buffer's own device; `None` for [`crate::default_device`].
    pub device: Option<Device>,
    /// Page-locked host memory (see [`UnifiedBuffer::is_pinned`]).
    pub pinned: bool,
    /// Where memory comes from; `None` for the device's default resource (its pool while
    /// caching by default is on, see [`crate::resource`]).
    pub resource: Option<Arc<dyn MemoryResource>>,
    /// The stream the copy on the buffer's own device uses; `None` for the device's default
    /// stream.
    pub stream: Option<Stream>,
}

/// An asynchronous transfer: wait for it, or poll it. Dropping it does not cancel the
/// transfer; the buffer still settles it at its next call that depends on it.
#[derive(Clone, Debug)]
#[must_use = "a transfer's failure is reported by its handle (or by the buffer's next call that waits for it)"]
pub struct Transfer {
    ticket: Ticket,
    /// The device whose copy it reads or writes (none for a transfer that copies nothing).
    device: Option<Device>,
}

impl Transfer {
    pub(crate) fn new(ticket: Ticket, device: Option<Device>) -> Transfer {
        Transfer { ticket, device }
    }

    /// Blocks until the transfer is done; `Err` if it failed (the buffer then returns to the
    /// state it had before the transfer at its next call).
    pub fn wait(&self) -> Result<()> {
        self.ticket.wait().map_err(|err| self.named(err))
    }

    /// `Ok(true)` once the transfer is done, `Ok(false)` while it runs, `Err` if it failed.
    pub fn is_complete(&self) -> Result<bool> {
        self.ticket.poll().map_err(|err| self.named(err))
    }

    /// `err` naming the transfer's device where the runtime's ticket could not: a ticket waited
    /// for in a forked child knows its runtime, not which of its devices.
    fn named(&self, err: Error) -> Error {
        match (err, &self.device) {
            (Error::ForkedChild { backend, .. }, Some(device)) => {
                Error::ForkedChild { device: device.name().to_string(), backend }
            }
            (err, _) => err,
        }
    }

    /// The transfer's ticket, to order another stream after it ([`Stream::wait_for`]).
    pub fn ticket(&self) -> &Ticket {
        &self.ticket
    }
}

/// An N-d, C-contiguous array of `T` with coherent copies on the host and on devices.
///
/// **Spilling.** A `UnifiedBuffer` is owned by value and borrowed for every access, so nothing
/// else can reach it: its device copies count against their device's memory limit
/// ([`crate::spill::set_memory_limit`]) but are **never evicted**. To make a buffer evictable
/// under a limit, wrap it in a [`crate::spill::SharedBuffer`]; an allocation that finds no
/// room says so in its [`crate::Error::OutOfMemory`].
///
/// ```
/// use lazybuf::{BufferState, Device, UnifiedBuffer};
/// let mut buf = UnifiedBuffer::<f32>::on(&[4], &Device::host()).unwrap();
/// assert_eq!(buf.state(), BufferState::Uninitialized);
/// buf.host_mut().unwrap().copy_from_slice(&[1.0, 2.0, 3.0, 4.0]);
/// assert_eq!(buf.state(), BufferState::HostOnly);
/// buf.sync_to_device().unwrap();
/// assert_eq!(buf.state(), BufferState::Synchronized);
/// ```
pub struct UnifiedBuffer<T: Element> {
    shape: Shape,
    raw: RawBuffer,
    _element: PhantomData<T>,
}

impl<T: Element> UnifiedBuffer<T> {
    /// A buffer of `shape` on the default device. Allocates nothing.
    pub fn new(shape: &[usize]) -> Result<Self> {
        Self::with_options(shape, BufferOptions::default())
    }

    /// A buffer of `shape` whose own device is `device`. Allocates nothing.
    pub fn on(shape: &[usize], device: &Device) -> Result<Self> {
        Self::with_options(shape, BufferOptions { device: Some(device.clone()), ..BufferOptions::default() })
    }

    /// A buffer with explicit options. Allocates nothing.
    pub fn with_options(shape: &[usize], options: BufferOptions) -> Result<Self> {
        let shape = Shape::new(shape, size_of::<T>())?;
        let device = match options.device {
            Some(device) => device,
            None => crate::discovery::default_device()?,
        };
        let nbytes = shape.len() * size_of::<T>();
        let resource = options.resource.unwrap_or_else(|| crate::resource::default_resource(&device));
        let mut raw = RawBuffer::with_resource(nbytes, device, options.pinned, resource);
        if let Some(stream) = options.stream {
            raw.set_stream(stream)?;
        }
        Ok(UnifiedBuffer { shape, raw, _element: PhantomData })
    }

    /// A 1-d buffer on `device` holding a copy of `data` (state HOST_ONLY).
    pub fn from_slice(data: &[T], device: &Device) -> Result<Self> {
        let mut buf = Self::on(&[data.len()], device)?;
        buf.copy_from(data)?;
        Ok(buf)
    }

    /// A buffer of `shape` on `device` holding `data` (its length must be the shape's).
    pub fn from_vec(data: Vec<T>, shape: &[usize], device: &Device) -> Result<Self> {
        let mut buf = Self::on(shape, device)?;
        buf.copy_from_as(&data, "from_vec")?;
        Ok(buf)
    }

    /// The dimensions.
    pub fn shape(&self) -> &[usize] {
        self.shape.dims()
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.shape.len()
    }

    /// Whether the buffer has no element.
    pub fn is_empty(&self) -> bool {
        self.shape.is_empty()
    }

    /// The size in bytes.
    pub fn nbytes(&self) -> usize {
        self.raw.nbytes()
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        T::DTYPE
    }

    /// The buffer's own device.
    pub fn device_handle(&self) -> &Device {
        self.raw.home()
    }

    /// The state of the host against the buffer's own device.
    pub fn state(&self) -> BufferState {
        self.raw.state()
    }

    /// The state of the host against another device.
    pub fn state_on(&self, device: &Device) -> BufferState {
        self.raw.state_on(device)
    }

    /// The residency of one location.
    pub fn residency(&self, at: Location) -> Residency {
        self.raw.residency(at)
    }

    /// Whether the host copy is pinned memory as its device's backend provides it (SPEC
    /// section 3): `mlock`ed pages for the host device, page-locked memory for CUDA, and
    /// runtime-allocated mapped memory (`CL_MEM_ALLOC_HOST_PTR`) for OpenCL. False until the
    /// host copy exists; never true for a pageable block (a pin that fails is an error).
    pub fn is_pinned(&self) -> bool {
        self.raw.is_pinned()
    }

    /// Bytes moved and allocations made so far.
    pub fn transfer_stats(&self) -> TransferStats {
        self.raw.transfer_stats()
    }

    /// Sets the transfer counters to zero.
    pub fn reset_transfer_stats(&mut self) {
        self.raw.reset_transfer_stats();
    }

    /// Reads on the host: syncs from a device if the host is stale.
    pub fn host(&mut self) -> Result<&[T]> {
        typed("host", self.raw.host_access(Access::Read)?).map(|s| &*s)
    }

    /// Writes on the host: syncs first, then every device copy is stale.
    pub fn host_mut(&mut self) -> Result<&mut [T]> {
        typed("host_mut", self.raw.host_access(Access::Write)?)
    }

    /// Writes every element on the host without syncing first: contents are unspecified
    /// until you overwrite them; then every device copy is stale.
    pub fn host_overwrite(&mut self) -> Result<&mut [T]> {
        typed("host_overwrite", self.raw.host_access(Access::Overwrite)?)
    }

    /// The host data if it is current, with no sync (and without `&mut self`); `None` also
    /// for a host copy misaligned for `T` (adopted memory, see [`RawBuffer::adopt_host`]).
    pub fn host_if_valid(&self) -> Option<&[T]> {
        self.raw.host_if_valid().and_then(|bytes| bytemuck::try_cast_slice(bytes).ok())
    }

    /// Reads on the buffer's own device.
    pub fn device(&mut self) -> Result<DeviceView<'_, T>> {
        let device = self.raw.home().clone();
        self.device_on(&device)
    }

    /// Writes on the buffer's own device (syncs first; the host becomes stale).
    pub fn device_mut(&mut self) -> Result<DeviceViewMut<'_, T>> {
        let device = self.raw.home().clone();
        self.device_mut_on(&device)
    }

    /// Overwrites on the buffer's own device, without syncing first.
    pub fn device_overwrite(&mut self) -> Result<DeviceViewMut<'_, T>> {
        let device = self.raw.home().clone();
        self.device_overwrite_on(&device)
    }

    /// Reads on any device.
    pub fn device_on(&mut self, device: &Device) -> Result<DeviceView<'_, T>> {
        let len = self.shape.len();
        Ok(DeviceView::new(self.raw.hand_out(device, Access::Read)?, len))
    }

    /// Writes on any device.
    pub fn device_mut_on(&mut self, device: &Device) -> Result<DeviceViewMut<'_, T>> {
        let len = self.shape.len();
        Ok(DeviceViewMut::new(self.raw.hand_out(device, Access::Write)?, len))
    }

    /// Overwrites on any device, without syncing first.
    pub fn device_overwrite_on(&mut self, device: &Device) -> Result<DeviceViewMut<'_, T>> {
        let len = self.shape.len();
        Ok(DeviceViewMut::new(self.raw.hand_out(device, Access::Overwrite)?, len))
    }

    /// Makes the buffer's own device current (copies only if it is stale).
    pub fn sync_to_device(&mut self) -> Result<()> {
        let device = self.raw.home().clone();
        self.raw.sync(Some(&device))
    }

    /// Makes `device` current (copies only if it is stale).
    pub fn sync_to(&mut self, device: &Device) -> Result<()> {
        crate::observe::call(crate::observe::Cause::sync("sync_to"), || self.raw.sync(Some(device)))
    }

    /// Makes the host current (copies only if it is stale).
    pub fn sync_to_host(&mut self) -> Result<()> {
        self.raw.sync(None)
    }

    /// As [`Self::sync_to_device`], returning as soon as the copy is enqueued.
    pub fn sync_to_device_async(&mut self) -> Result<Transfer> {
        let device = self.raw.home().clone();
        self.raw.sync_async(Some(&device))
    }

    /// As [`Self::sync_to`], returning as soon as the copies are enqueued.
    pub fn sync_to_async(&mut self, device: &Device) -> Result<Transfer> {
        self.raw.sync_async(Some(device))
    }

    /// As [`Self::sync_to_host`], returning as soon as the copy is enqueued.
    pub fn sync_to_host_async(&mut self) -> Result<Transfer> {
        self.raw.sync_async(None)
    }

    /// Whether transfers of this buffer are in flight.
    pub fn is_busy(&self) -> bool {
        self.raw.is_busy()
    }

    /// Settles the transfers that are done, without waiting: undoes failed ones and returns
    /// the first failure.
    pub fn poll(&mut self) -> Result<()> {
        self.raw.poll()
    }

    /// Waits for every transfer in flight: undoes failed ones and returns the first failure.
    pub fn finish(&mut self) -> Result<()> {
        self.raw.finish()
    }

    /// The stream the copy on the buffer's own device uses.
    pub fn stream(&self) -> &Stream {
        self.raw.stream()
    }

    /// Declares that the host copy was written: it is made current first, then every device
    /// copy is stale. On a buffer that holds no data (UNINITIALIZED) the host copy holds zeros
    /// after it, as a read sees them, never an earlier user's bytes of a reused block.
    pub fn mark_host_dirty(&mut self) -> Result<()> {
        self.raw.mark_written(None)
    }

    /// Declares that the buffer's own device copy was written (by a kernel): it is made
    /// current first, then the host and other devices are stale.
    pub fn mark_device_dirty(&mut self) -> Result<()> {
        let device = self.raw.home().clone();
        self.mark_dirty_on(&device)
    }

    /// As [`Self::mark_device_dirty`], for any device. On a buffer that holds no data
    /// (UNINITIALIZED) that copy holds zeros after it (see [`Self::mark_host_dirty`]).
    pub fn mark_dirty_on(&mut self, device: &Device) -> Result<()> {
        self.raw.mark_written(Some(device))
    }

    /// Sets every element to `value` where the data is current, with no transfer (on the
    /// device when only the device is current; on the host when nothing is).
    pub fn fill(&mut self, value: T) -> Result<()> {
        self.raw.fill(bytemuck::bytes_of(&value))
    }

    /// Copies `data` into the buffer on the host (exactly `len()` elements, else an error).
    pub fn copy_from(&mut self, data: &[T]) -> Result<()> {
        self.copy_from_as(data, "copy_from")
    }

    /// [`Self::copy_from`], its length error naming `operation` (the call the user made).
    fn copy_from_as(&mut self, data: &[T], operation: &'static str) -> Result<()> {
        if data.len() != self.len() {
            return Err(Error::LengthMismatch {
                operation,
                expected: self.len(),
                actual: data.len(),
                unit: "elements",
            });
        }
        // Bytes, not elements: works for a host copy at any alignment (adopted memory).
        crate::host_memory::copy_bytes(self.raw.host_access(Access::Overwrite)?, bytemuck::cast_slice(data));
        Ok(())
    }

    /// Copies the buffer into `out` (exactly `len()` elements, else an error).
    pub fn copy_to(&mut self, out: &mut [T]) -> Result<()> {
        if out.len() != self.len() {
            return Err(Error::LengthMismatch {
                operation: "copy_to",
                expected: self.len(),
                actual: out.len(),
                unit: "elements",
            });
        }
        // An explicit transfer for the transfer guard, as sync_to_host() is.
        let raw = &mut self.raw;
        crate::observe::call(crate::observe::Cause::sync("copy_to"), || {
            crate::host_memory::copy_bytes(bytemuck::cast_slice_mut(out), raw.host_access(Access::Read)?);
            Ok(())
        })
    }

    /// A copy of the data, read on the host.
    pub fn to_vec(&mut self) -> Result<Vec<T>> {
        let mut out = vec![T::zeroed(); self.len()];
        self.copy_to(&mut out)?;
        Ok(out)
    }

    /// Frees every copy; the buffer is UNINITIALIZED and holds no memory.
    pub fn release_memory(&mut self) {
        self.raw.release_memory();
    }

    /// Forgets the contents (UNINITIALIZED) but keeps every allocation for reuse.
    pub fn invalidate(&mut self) {
        self.raw.invalidate();
    }

    /// Wraps an untyped buffer whose size is `shape`'s for `T`.
    pub fn from_raw(shape: &[usize], raw: RawBuffer) -> Result<Self> {
        let shape = Shape::new(shape, size_of::<T>())?;
        if shape.len() * size_of::<T>() != raw.nbytes() {
            return Err(Error::LengthMismatch {
                operation: "from_raw",
                expected: raw.nbytes(),
                actual: shape.len() * size_of::<T>(),
                unit: "bytes",
            });
        }
        Ok(UnifiedBuffer { shape, raw, _element: PhantomData })
    }

    /// Unwraps the untyped engine.
    pub fn into_raw(self) -> RawBuffer {
        self.raw
    }

    /// The untyped engine, for bindings that work with run-time element types.
    pub fn raw(&self) -> &RawBuffer {
        &self.raw
    }

    /// The untyped engine, mutably.
    pub fn raw_mut(&mut self) -> &mut RawBuffer {
        &mut self.raw
    }
}

/// The host bytes as elements; an error for bytes misaligned for `T` (a host copy adopted
/// from another owner, see [`RawBuffer::adopt_host`]): lazybuf's own blocks are aligned.
fn typed<'a, T: Element>(operation: &'static str, bytes: &'a mut [u8]) -> Result<&'a mut [T]> {
    let address = bytes.as_ptr() as usize;
    bytemuck::try_cast_slice_mut(bytes).map_err(|_| {
        Error::invalid(
            operation,
            format!(
                "the host copy at 0x{address:x} is not aligned for {} ({}-byte alignment expected); \
                 it is adopted memory: use the untyped RawBuffer",
                T::DTYPE.name(),
                align_of::<T>()
            ),
        )
    })
}

impl<T: Element> fmt::Debug for UnifiedBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UnifiedBuffer")
            .field("shape", &self.shape())
            .field("dtype", &T::DTYPE)
            .field("device", self.raw.home())
            .field("state", &self.state())
            .finish()
    }
}
