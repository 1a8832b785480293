//! The device backend interface: the storage layer every runtime implements.
//!
//! A backend allocates and frees memory, moves bytes between host and device, fills and copies
//! on the device, and reports what it is. It knows nothing of coherence: the buffer decides
//! *what* to move (see [`crate::coherence`]), a backend only knows *how*.
//!
//! **Completion is explicit.** Every operation is enqueued on a stream (an in-order queue: a
//! CUDA stream, an OpenCL command queue, the host's immediate stream) and returns a
//! [`Ticket`] that completes when the operation has. Work on one stream runs in order; work on
//! different streams is ordered only through [`Backend::wait_on`]. A blocking call is the same
//! operation followed by [`Ticket::wait`].
//!
//! **Two layers.** A runtime implements the typed [`Runtime`] trait, with its own memory and
//! stream types, and sees only validated input. The one generic [`checked::Checked`] layer puts
//! every runtime behind the dynamic [`Backend`] trait the rest of lazybuf uses: it downcasts
//! and ownership-checks every handle once, refuses runtimes in forked children, and wraps
//! allocations ([`checked`]); lengths and fill patterns are checked just above it, by
//! [`crate::Stream`].
//!
//! **One folder per runtime, one table.** Every backend folder has the same files: `mod.rs`
//! (probing, opening, the runtime's error codes, and its [`Registration`]), `device.rs` (the
//! [`Runtime`] impl) and `memory.rs` (its memory, stream and completion types). Runtime calls
//! live in those folders and nowhere else. [`REGISTERED`] lists the backends compiled in:
//! adding a backend is its folder plus one line there (and, for a new kind of raw handle, its
//! variants in [`RawMemory`], [`RawStream`] and [`RawDevice`]).
//!
//! **Forked children.** A runtime that does not survive `fork` ([`Runtime::SURVIVES_FORK`]) is
//! refused in a forked child, with a clear error, by the checked layer; see [`fork`].
//!
//! What does not live here: pools, limits and statistics (policies over a backend, in
//! [`crate::resource`] and [`crate::pool`]), and the public [`crate::Device`] handle.

pub mod checked;
pub mod deferred;
pub mod fork;
mod info;
mod memory;
mod raw;
mod runtime;
mod ticket;

#[cfg(feature = "cuda")]
pub mod cuda;
pub mod host;
#[cfg(feature = "loopback")]
pub mod loopback;
#[cfg(feature = "opencl")]
pub mod opencl;
#[cfg(feature = "wgpu")]
pub mod wgpu;

use std::any::Any;
use std::fmt;
use std::sync::Arc;

pub use checked::Checked;
pub use info::{DeviceInfo, DlpackDevice, DlpackDevices, MemoryInfo, MemorySource};
pub(crate) use memory::check_fits;
pub use memory::{Block, DeviceMemory, HostSpan, MemoryHandle, MemoryKind};
pub use raw::{RawDevice, RawMemory, RawStream};
pub use runtime::{Allocated, Runtime, host_block};
pub use ticket::{Completion, Signal, Ticket};

use crate::error::{BackendKind, Result};
use crate::host_memory::HostMemory;

/// A backend's handle to one of its streams (downcast by the backend that made it).
pub trait StreamHandle: Any + Send + Sync + fmt::Debug {
    /// The runtime's handle, for users who enqueue their own work on it.
    fn raw(&self) -> RawStream;
}

/// One device's runtime operations, as the rest of lazybuf drives them (the dynamic layer).
///
/// Every runtime reaches this trait through [`checked::Checked`]: implement [`Runtime`], not
/// this. (Wrappers that add one concern over another backend, such as the fault-injecting
/// test device, implement it directly and forward.)
///
/// Transfers act on the first bytes of an allocation (a block may be larger than the buffer
/// using it). An operation that fails to *enqueue* returns the error and has done nothing; one
/// that fails while it runs reports the error through its ticket, and its destination's bytes
/// are then unspecified.
///
/// **Checked input.** Callers reach the operations (`upload`, `download`, `fill`, `copy`,
/// `copy_from_peer`, `prefetch`) only through [`crate::Stream`], which checks the arguments
/// once, for every backend: lengths fit the memory (else an [`crate::Error::LengthMismatch`]),
/// a fill's pattern is 1, 2, 4, 8 or 16 bytes and divides its length, and nothing is empty (an
/// empty operation is a completed ticket there, with no call here), and the stream is one this
/// backend made (a [`crate::Stream`] carries its own device's handle). The operations are
/// `unsafe`, and their `# Safety` sections say what the caller checked. The checked layer
/// checks the memory (it is this device's) before its runtime sees it.
pub trait Backend: Any + Send + Sync + fmt::Debug {
    /// What the device is.
    fn info(&self) -> &DeviceInfo;

    /// Whether the runtime keeps working in a child made by `fork` of a process that opened
    /// the device ([`Runtime::SURVIVES_FORK`]; where not, the checked layer refuses the device
    /// in a forked child, see [`fork`]).
    fn survives_fork(&self) -> bool {
        false
    }

    /// Whether an upload can complete in its stream's order ([`Runtime::ORDERED_UPLOADS`]).
    fn ordered_uploads(&self) -> bool {
        false
    }

    /// `Ok` where the device may be used in this process: always where its runtime survives
    /// `fork`, else only in the process that opened it ([`crate::Error::ForkedChild`] in a
    /// forked child). Asked before a device access that may need no runtime call (a copy
    /// already current handed out again), so that no handle of the parent's runtime reaches a
    /// child, where using it hangs.
    fn check_usable(&self) -> Result<()> {
        Ok(())
    }

    /// Free and total memory, with where the figure comes from (`cached` is left at 0: the
    /// device handle adds what lazybuf's caches hold).
    fn memory_info(&self) -> Result<MemoryInfo>;

    /// The stream lazybuf uses on this device unless told otherwise.
    fn default_stream(&self) -> Arc<dyn StreamHandle>;

    /// A new stream on this device, independent of the others.
    fn create_stream(&self) -> Result<Arc<dyn StreamHandle>>;

    /// A handle to a stream the caller made on this device (a CUDA stream of its context, an
    /// OpenCL queue of its context), so lazybuf's work can be ordered with the caller's.
    /// lazybuf never destroys it (OpenCL: it holds one reference, released on drop).
    ///
    /// # Safety
    /// `raw` is a live stream of this device's context and stays alive while the returned
    /// handle is used.
    unsafe fn wrap_stream(&self, raw: RawStream) -> Result<Arc<dyn StreamHandle>> {
        Err(crate::Error::invalid(
            "wrap_stream",
            format!("expected a stream of {}, got {raw:?}", self.info().name),
        ))
    }

    /// Whether [`Backend::allocate`] can give page-locked host memory (false where pinned host
    /// memory has no meaning, as for wgpu: asking for it there is an error).
    fn pins_host_memory(&self) -> bool {
        true
    }

    /// Allocates `bytes` of `kind` with unspecified contents: a host block for a buffer that
    /// lives on this device (page-locked when pinned: an error if that is impossible, never a
    /// silent pageable fallback), device memory, or shared memory ([`MemoryKind::Shared`]: the
    /// host and the device both address it; an error naming why where the device has none).
    fn allocate(&self, kind: MemoryKind, bytes: usize) -> Result<Block>;

    /// Device memory over `len` bytes at `raw` that the caller owns and lazybuf did not
    /// allocate (a CUDA pointer into this device's memory, a `cl_mem` of this device's
    /// context, host memory on the host device), for copies to and from it; dropping it frees
    /// nothing. An error naming what was expected when `raw` is not this device's memory.
    ///
    /// # Safety
    /// `raw` stays valid for `len` bytes, and is not freed, while the returned memory lives.
    unsafe fn borrow(&self, raw: RawMemory, len: usize) -> Result<DeviceMemory> {
        let _ = len;
        Err(crate::Error::invalid(
            "borrow",
            format!("{} cannot use memory it did not allocate; got {raw:?}", self.info().name),
        ))
    }

    /// The alignment in bytes every allocation of `kind` on this device is guaranteed to have
    /// (a power of two): of the address where the host or the device addresses it, of the
    /// `cl_mem`'s device address for OpenCL device memory. Pageable host memory: 64.
    fn alignment(&self, kind: MemoryKind) -> usize {
        let _ = kind;
        crate::host_memory::HEAP_ALIGN
    }

    /// Enqueues a move of shared memory's pages to the device (`to_device`) or to the host,
    /// so the next accesses there do not fault; other memory needs nothing.
    fn prefetch(&self, stream: &dyn StreamHandle, memory: &DeviceMemory, to_device: bool) -> Result<Ticket>;

    /// Whether a buffer of `bytes` on this device aliases its host block, so that its syncs
    /// move no bytes. [`Backend::alias_host`] must alias exactly when this is true.
    fn zero_copy(&self, bytes: usize) -> bool {
        let _ = bytes;
        false
    }

    /// Device memory that aliases the first `bytes` of `host` (zero-copy) when
    /// [`Backend::zero_copy`] says so for `bytes`; `None` to use [`Backend::allocate`]. The
    /// block may be larger (a pool's size class); the alias covers what the buffer uses.
    /// Uploads and downloads between an alias and its own host block move no bytes; with any
    /// other host memory they copy as usual.
    fn alias_host(&self, host: &mut HostMemory, bytes: usize) -> Option<Result<DeviceMemory>> {
        let _ = (host, bytes);
        None
    }

    /// Whether `memory` is memory of this device (of its type, and of its context): the
    /// check [`crate::Stream`]'s operations make before handing memory to the operations
    /// below. No runtime call.
    fn owns(&self, memory: &DeviceMemory) -> bool;

    /// Enqueues a copy of all of `src` into the first `src.len()` bytes of `dst`.
    ///
    /// # Safety
    /// `src` must stay valid for reads, and unwritten, until the returned ticket is complete.
    /// `stream` is one this backend made. The input is checked ([`crate::Stream::upload`]):
    /// `src` is not empty and not longer than `dst`.
    unsafe fn upload(
        &self,
        stream: &dyn StreamHandle,
        src: HostSpan,
        dst: &mut DeviceMemory,
    ) -> Result<Ticket>;

    /// Enqueues a copy of the first `dst.len()` bytes of `src` into all of `dst`.
    ///
    /// # Safety
    /// `dst` must stay valid for writes, and otherwise untouched, until the returned ticket
    /// is complete. `stream` is one this backend made. The input is checked
    /// ([`crate::Stream::download`]): `dst` is not empty and not longer than `src`.
    unsafe fn download(&self, stream: &dyn StreamHandle, src: &DeviceMemory, dst: HostSpan)
    -> Result<Ticket>;

    /// Enqueues a fill of the first `bytes` of `dst` with repetitions of `pattern`.
    ///
    /// # Safety
    /// `stream` is one this backend made. The input is checked ([`crate::Stream::fill`]):
    /// `bytes` is not 0 and at most `dst.len()`, `pattern` is one element of 1, 2, 4, 8 or 16
    /// bytes and divides `bytes`.
    unsafe fn fill(
        &self,
        stream: &dyn StreamHandle,
        dst: &mut DeviceMemory,
        pattern: &[u8],
        bytes: usize,
    ) -> Result<Ticket>;

    /// Enqueues a copy of the first `bytes` of `src` into `dst`, both on this device.
    ///
    /// # Safety
    /// `stream` is one this backend made. The input is checked ([`crate::Stream::copy`]):
    /// `bytes` is not 0 and at most the length of each.
    unsafe fn copy(
        &self,
        stream: &dyn StreamHandle,
        src: &DeviceMemory,
        dst: &mut DeviceMemory,
        bytes: usize,
    ) -> Result<Ticket>;

    /// Whether [`Backend::copy_from_peer`] can copy memory of `src` (another device) into
    /// this device's memory without staging through the host.
    fn can_copy_from_peer(&self, src: &dyn Backend) -> bool {
        let _ = src;
        false
    }

    /// Enqueues a copy of the first `bytes` of `src`, memory of the device `src_backend`
    /// drives, into `dst`, memory of this device, without the host; `None` when this pair
    /// cannot copy directly. The caller orders `stream` after the source's last writer.
    ///
    /// # Safety
    /// `stream` is one this backend made. The input is checked
    /// ([`crate::Stream::copy_from_peer`]): `bytes` is not 0 and at most the length of each,
    /// `dst` is this device's memory and `src` is `src_backend`'s.
    unsafe fn copy_from_peer(
        &self,
        stream: &dyn StreamHandle,
        src_backend: &dyn Backend,
        src: &DeviceMemory,
        dst: &mut DeviceMemory,
        bytes: usize,
    ) -> Option<Result<Ticket>> {
        let _ = (stream, src_backend, src, dst, bytes);
        None
    }

    /// Orders work enqueued on `stream` from now on after `ticket`: on the device where the
    /// runtime can (an event wait), else by waiting for it here.
    fn wait_on(&self, stream: &dyn StreamHandle, ticket: &Ticket) -> Result<()> {
        let _ = stream;
        ticket.wait()
    }

    /// A ticket that completes when everything enqueued on `stream` so far has.
    fn marker(&self, stream: &dyn StreamHandle) -> Result<Ticket>;

    /// Waits until all work queued on the device is done.
    fn synchronize(&self) -> Result<()>;

    /// The runtime handles of the device and its default stream, for users who launch their
    /// own kernels.
    fn raw(&self) -> RawDevice;

    /// The handle foreign code uses for `memory`, as an integer: [`RawMemory::as_int`], except
    /// where the runtime's handle wraps another API's (a wgpu buffer: its `VkBuffer` on Vulkan,
    /// 0 on other graphics APIs and when empty).
    ///
    /// # Safety
    /// `memory` is live memory of this device.
    unsafe fn native_handle(&self, memory: RawMemory) -> usize {
        memory.as_int()
    }

    /// Whether a selector name other than the backend's own picks this device (wgpu's
    /// `vulkan`, `metal`, `dx12`: the graphics API under it). See [`SELECTOR_ALIASES`].
    fn answers_to(&self, selector: &str) -> bool {
        let _ = selector;
        false
    }

    /// Lets the backend prepare a host block that is about to take part in a transfer (CUDA
    /// registers large, often-transferred pageable blocks with the driver; see its docs).
    fn prepare_host(&self, host: &mut HostMemory) {
        let _ = host;
    }

    /// Gives back memory the backend keeps for its own transfers (staging). It is made again
    /// when needed.
    fn trim(&self) {}

    /// The failures the backend's own drop and free paths recorded (a failed `cuMemFree`, say)
    /// and that were not taken yet ([`deferred`]); each is returned once.
    fn take_deferred_errors(&self) -> (Vec<crate::error::Error>, u64) {
        (Vec::new(), 0)
    }

    /// The backend this one wraps, for a wrapper that adds one concern over another backend
    /// and drives that backend's memory (so a peer copy can recognise the runtime under it);
    /// `None` for a runtime's own [`checked::Checked`] layer.
    fn wrapped(&self) -> Option<&dyn Backend> {
        None
    }
}

/// How discovery finds the devices of one backend.
pub struct Registration {
    /// The backend.
    pub kind: BackendKind,
    /// Opens every device the runtime has, or says why it is unavailable. Never panics.
    pub open_all: fn() -> Result<Vec<Arc<dyn Backend>>>,
}

/// The runtimes compiled into this build, in the order discovery lists their devices (and the
/// default device prefers their GPUs). The host device, always present, comes after them.
pub static REGISTERED: &[Registration] = &[
    #[cfg(feature = "cuda")]
    cuda::REGISTRATION,
    #[cfg(feature = "opencl")]
    opencl::REGISTRATION,
    #[cfg(feature = "wgpu")]
    wgpu::REGISTRATION,
    #[cfg(feature = "loopback")]
    loopback::REGISTRATION,
];

/// Selector names that pick a subset of one backend's devices, each with that backend: its
/// devices answer to them through [`Backend::answers_to`] (`vulkan:1` is the second wgpu
/// device on Vulkan).
pub static SELECTOR_ALIASES: &[(&str, BackendKind)] = &[
    #[cfg(feature = "wgpu")]
    ("vulkan", BackendKind::WGPU),
    #[cfg(feature = "wgpu")]
    ("metal", BackendKind::WGPU),
    #[cfg(feature = "wgpu")]
    ("dx12", BackendKind::WGPU),
];

/// Every backend kind this build knows, the host's included.
pub fn kinds() -> impl Iterator<Item = BackendKind> {
    REGISTERED.iter().map(|r| r.kind).chain(std::iter::once(BackendKind::HOST))
}
