//! The runtimes' raw handles that lazybuf hands to users ([`RawDevice`], [`RawStream`],
//! [`RawMemory`]), and each as an integer and back, for foreign code. A backend adds its own
//! variants here (behind its feature); the matches below are exhaustive, so a new backend does
//! not compile until it answers each question.
//!
//! What does not live here: a graphics API's own handle behind a wgpu buffer, which only the
//! backend can read ([`crate::Device::native_handle`]).

use std::ffi::c_void;

/// A runtime's raw handles to a device, for launching kernels on the queue lazybuf uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RawDevice {
    /// The host device has no runtime.
    Host,
    /// OpenCL: the context, the in-order command queue lazybuf enqueues on, and the device.
    OpenCl {
        /// `cl_context`
        context: *mut c_void,
        /// `cl_command_queue`
        queue: *mut c_void,
        /// `cl_device_id`
        device: *mut c_void,
    },
    /// CUDA: the context and the stream lazybuf copies on.
    Cuda {
        /// `CUcontext`
        context: *mut c_void,
        /// `CUstream`
        stream: *mut c_void,
    },
    /// wgpu: the device and its queue (every lazybuf stream of the device is this queue).
    #[cfg(feature = "wgpu")]
    Wgpu {
        /// The `wgpu::Device`.
        device: *const wgpu::Device,
        /// The `wgpu::Queue`.
        queue: *const wgpu::Queue,
    },
    /// A test-only loopback device ([`crate::backend::loopback`]): its identity.
    #[cfg(feature = "loopback")]
    Loopback {
        /// The device's identity in this process.
        device: u64,
    },
}

impl RawDevice {
    /// The context as an integer, for foreign code that wraps it (`cl_context`, `CUcontext`);
    /// 0 on the host (no runtime) and on wgpu (no C handle).
    pub fn context_int(&self) -> usize {
        match *self {
            RawDevice::Host => 0,
            RawDevice::OpenCl { context, .. } => context as usize,
            RawDevice::Cuda { context, .. } => context as usize,
            #[cfg(feature = "wgpu")]
            RawDevice::Wgpu { .. } => 0,
            #[cfg(feature = "loopback")]
            RawDevice::Loopback { device } => device as usize,
        }
    }

    /// The queue lazybuf enqueues on, as an integer (`cl_command_queue`, `CUstream`); 0 on
    /// the host and on wgpu.
    pub fn queue_int(&self) -> usize {
        match *self {
            RawDevice::Host => 0,
            RawDevice::OpenCl { queue, .. } => queue as usize,
            RawDevice::Cuda { stream, .. } => stream as usize,
            #[cfg(feature = "wgpu")]
            RawDevice::Wgpu { .. } => 0,
            #[cfg(feature = "loopback")]
            RawDevice::Loopback { device } => device as usize,
        }
    }

    /// A stream of this device's runtime from the integer handle foreign code holds (what
    /// [`RawStream::as_int`] gives: a `cl_command_queue`, a `CUstream`), for
    /// [`crate::Device::wrap_stream`]; the immediate [`RawStream::Host`] on the host device;
    /// `None` where streams have no integer handle (wgpu).
    pub fn stream_from_int(&self, handle: usize) -> Option<RawStream> {
        match *self {
            RawDevice::Host => Some(RawStream::Host),
            RawDevice::OpenCl { .. } => Some(RawStream::OpenCl(handle as *mut c_void)),
            RawDevice::Cuda { .. } => Some(RawStream::Cuda(handle as *mut c_void)),
            #[cfg(feature = "wgpu")]
            RawDevice::Wgpu { .. } => None,
            #[cfg(feature = "loopback")]
            RawDevice::Loopback { .. } => Some(RawStream::Loopback(handle as u64)),
        }
    }

    /// Memory of this device's runtime from the integer foreign code holds (what
    /// [`RawMemory::as_int`] gives: a host address, a `cl_mem`, a `CUdeviceptr`), for
    /// [`crate::Memory::borrowed`]; `None` where memory has no integer handle (wgpu).
    pub fn memory_from_int(&self, handle: usize) -> Option<RawMemory> {
        match *self {
            RawDevice::Host => Some(RawMemory::Host(handle as *mut u8)),
            RawDevice::OpenCl { .. } => Some(RawMemory::OpenCl(handle as *mut c_void)),
            RawDevice::Cuda { .. } => Some(RawMemory::Cuda(handle as u64)),
            #[cfg(feature = "wgpu")]
            RawDevice::Wgpu { .. } => None,
            #[cfg(feature = "loopback")]
            RawDevice::Loopback { .. } => Some(RawMemory::Loopback(handle as u64)),
        }
    }
}

/// A runtime's raw handle to one stream (in-order queue) of a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RawStream {
    /// The host device's immediate stream: work is done when the call returns.
    Host,
    /// An OpenCL `cl_command_queue` (in order).
    OpenCl(*mut c_void),
    /// A CUDA `CUstream`.
    Cuda(*mut c_void),
    /// A `wgpu::Queue` (a wgpu device's one queue).
    #[cfg(feature = "wgpu")]
    Wgpu(*const wgpu::Queue),
    /// A loopback device's stream (immediate): the device's identity.
    #[cfg(feature = "loopback")]
    Loopback(u64),
}

impl RawStream {
    /// The handle as an integer, for foreign code that wraps it (`cl_command_queue`,
    /// `CUstream`); 0 on the host (work is done when each call returns) and on wgpu (no C
    /// handle).
    pub fn as_int(&self) -> usize {
        match *self {
            RawStream::Host => 0,
            RawStream::OpenCl(queue) => queue as usize,
            RawStream::Cuda(stream) => stream as usize,
            #[cfg(feature = "wgpu")]
            RawStream::Wgpu(_) => 0,
            #[cfg(feature = "loopback")]
            RawStream::Loopback(device) => device as usize,
        }
    }

    /// Whether work on the stream is done when each call returns (the host's): nothing to
    /// order after.
    pub fn is_immediate(&self) -> bool {
        match *self {
            RawStream::Host => true,
            RawStream::OpenCl(_) | RawStream::Cuda(_) => false,
            #[cfg(feature = "wgpu")]
            RawStream::Wgpu(_) => false,
            #[cfg(feature = "loopback")]
            RawStream::Loopback(_) => true,
        }
    }
}

/// A runtime's raw handle to a device allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RawMemory {
    /// Host memory (the host device): the address of the first byte; null when empty.
    Host(*mut u8),
    /// An OpenCL `cl_mem`; null when the buffer is empty (OpenCL has no empty buffers).
    OpenCl(*mut c_void),
    /// A CUDA `CUdeviceptr`; 0 when empty.
    Cuda(u64),
    /// A `wgpu::Buffer` (a storage buffer, at least as long as the allocation rounded up to 4
    /// bytes); null when the allocation is empty.
    #[cfg(feature = "wgpu")]
    Wgpu(*const wgpu::Buffer),
    /// Loopback device memory: its address, which only the device uses; 0 when empty.
    #[cfg(feature = "loopback")]
    Loopback(u64),
}

impl RawMemory {
    /// The handle as a number that tells live allocations of one device apart (the address,
    /// `cl_mem`, `CUdeviceptr`, or the address of the `wgpu::Buffer`), for bookkeeping keyed
    /// by allocation; 0 when empty. Never a way to reach the memory.
    pub fn identity(&self) -> usize {
        self.as_int()
    }

    /// The handle as an integer: the host address, the `cl_mem`, the `CUdeviceptr`, the
    /// address of the `wgpu::Buffer`; 0 when empty.
    pub fn as_int(&self) -> usize {
        match *self {
            RawMemory::Host(p) => p as usize,
            RawMemory::OpenCl(mem) => mem as usize,
            RawMemory::Cuda(ptr) => ptr as usize,
            #[cfg(feature = "wgpu")]
            RawMemory::Wgpu(buffer) => buffer as usize,
            #[cfg(feature = "loopback")]
            RawMemory::Loopback(address) => address as usize,
        }
    }

    /// The host address of host memory (the host device's); `None` for device memory of a
    /// runtime.
    pub fn host_ptr(&self) -> Option<*mut u8> {
        match *self {
            RawMemory::Host(p) => Some(p),
            RawMemory::OpenCl(_) | RawMemory::Cuda(_) => None,
            #[cfg(feature = "wgpu")]
            RawMemory::Wgpu(_) => None,
            #[cfg(feature = "loopback")]
            RawMemory::Loopback(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_as_integers() {
        let cuda = RawDevice::Cuda { context: 0x10 as *mut c_void, stream: 0x20 as *mut c_void };
        assert_eq!((cuda.context_int(), cuda.queue_int()), (0x10, 0x20));
        assert_eq!((RawDevice::Host.context_int(), RawDevice::Host.queue_int()), (0, 0));
        let stream = cuda.stream_from_int(0x30).expect("CUDA streams have integer handles");
        assert_eq!(stream, RawStream::Cuda(0x30 as *mut c_void));
        assert_eq!(stream.as_int(), 0x30);
        assert!(!stream.is_immediate());
        assert_eq!(RawDevice::Host.stream_from_int(5), Some(RawStream::Host));
        assert!(RawStream::Host.is_immediate());
        assert_eq!(RawStream::Host.as_int(), 0);
        let memory = cuda.memory_from_int(0x4000).expect("CUDA memory has integer handles");
        assert_eq!(memory, RawMemory::Cuda(0x4000));
        assert_eq!((memory.as_int(), memory.identity(), memory.host_ptr()), (0x4000, 0x4000, None));
        let host = RawDevice::Host.memory_from_int(0x5000).expect("host memory has addresses");
        assert_eq!(host.host_ptr(), Some(0x5000 as *mut u8));
    }
}
