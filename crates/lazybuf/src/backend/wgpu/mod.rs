//! Vulkan, Metal and DirectX 12 devices through `wgpu` (feature `wgpu`). The Vulkan loader is
//! opened at run time by wgpu, so a machine without it, or without a driver, only reports
//! wgpu absent ([`crate::backend_status`]).
//!
//! Every wgpu adapter of the Vulkan, Metal and DX12 backends becomes a device (GL is not
//! compiled in; `WGPU_BACKEND` narrows the set, as in every wgpu program). Each device gets
//! its own `wgpu::Device` with the adapter's full limits, and its one `wgpu::Queue` is every
//! stream: wgpu has a single queue per device, so lazybuf's streams there are handles to the
//! same in-order queue (more ordering than asked for, never less).
//!
//! **Errors never panic.** wgpu reports validation, out-of-memory and internal errors to an
//! error sink whose default handler panics. Every call lazybuf makes runs inside error scopes
//! (`scoped` in `device.rs`) that turn those errors into [`crate::Error`]s; an uncaptured-error
//! handler records what escapes (a user's own work) instead of panicking; a device-lost
//! callback marks the device lost, after which every call returns
//! [`crate::Error::BackendUnavailable`]; and calls that panic on a lost device (`Device::poll`)
//! run under `catch_unwind`, as does the probe.
//!
//! **Completion.** Each operation is recorded into one command buffer and submitted; its ticket
//! is a [`WgpuCompletion`] finished by a wgpu callback: `Queue::on_submitted_work_done` for
//! uploads, fills and copies, the staging buffer's `map_async` callback (after it has copied the
//! bytes out) for downloads. wgpu runs callbacks only inside `Device::poll`, so polling or
//! waiting on a ticket polls the device.
//!
//! Here: probing and opening, the error codes lazybuf names, device memory figures (Vulkan
//! memory heaps and `VK_EXT_memory_budget`), and the registration. The
//! [`Backend`] impl is in `device.rs`; buffers, the stream and
//! completions in `memory.rs`; staging buffers in `staging.rs`; the fill shader in `kernels.rs`.

mod device;
mod kernels;
mod memory;
mod staging;

/// The `wgpu` crate lazybuf is built with, for work on lazybuf's devices and buffers
/// ([`crate::backend::RawMemory::Wgpu`] is a `wgpu::Buffer` of this version).
pub use ::wgpu;
pub use device::{WgpuBackend, WgpuOptions};
pub use memory::{WgpuCompletion, WgpuMemory, WgpuStream};

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use crate::backend::{Backend, Registration};
use crate::error::{BackendKind, Error, Result, RuntimeCode};

impl BackendKind {
    /// Vulkan, Metal and DirectX 12 devices through `wgpu`.
    pub const WGPU: BackendKind = BackendKind::new("wgpu", "wgpu");
}

/// How discovery finds wgpu devices.
pub const REGISTRATION: Registration = Registration { kind: BackendKind::WGPU, open_all };

/// The selector names that pick the wgpu devices of one graphics API (`vulkan:1` is the
/// second Vulkan device), each with the wgpu backend it names.
pub const API_SELECTORS: &[(&str, wgpu::Backend)] =
    &[("vulkan", wgpu::Backend::Vulkan), ("metal", wgpu::Backend::Metal), ("dx12", wgpu::Backend::Dx12)];

/// The graphics APIs lazybuf asks wgpu for: Vulkan, Metal and DX12, narrowed by
/// `WGPU_BACKEND` (wgpu's own variable) when it is set.
fn backends() -> wgpu::Backends {
    let ours = wgpu::Backends::VULKAN | wgpu::Backends::METAL | wgpu::Backends::DX12;
    wgpu::Backends::from_env().map_or(ours, |asked| asked & ours)
}

/// Opens every wgpu adapter, or says why there is none. Never panics.
pub fn open_all() -> Result<Vec<Arc<dyn Backend>>> {
    // wgpu returns errors for missing loaders and drivers; catch_unwind is the last line of
    // defence should a driver make it panic. Unwind safety: on a panic nothing the closure
    // touched is used again.
    match std::panic::catch_unwind(AssertUnwindSafe(open_adapters)) {
        Ok(opened) => opened,
        Err(payload) => {
            Err(unavailable(format!("wgpu panicked while probing: {}", panic_message(&*payload))))
        }
    }
}

fn open_adapters() -> Result<Vec<Arc<dyn Backend>>> {
    let backends = backends();
    if backends.is_empty() {
        return Err(unavailable("WGPU_BACKEND names none of vulkan, metal, dx12"));
    }
    let mut descriptor = wgpu::InstanceDescriptor::new_without_display_handle();
    descriptor.backends = backends;
    // Validation stays on (wgpu's default in debug builds is more); no debug layers.
    descriptor.flags = wgpu::InstanceFlags::empty();
    let instance = wgpu::Instance::new(descriptor);
    let adapters = pollster::block_on(instance.enumerate_adapters(backends));
    if adapters.is_empty() {
        // request_adapter says why (no loader, no driver, API not compiled in).
        let why = match pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions::default()))
        {
            Err(err) => err.to_string(),
            Ok(_) => "wgpu listed no adapter".into(),
        };
        return Err(unavailable(format!(
            "no Vulkan, Metal or DX12 adapter ({why}); on Linux install a Vulkan loader and driver, \
             e.g. Debian's libvulkan1 and mesa-vulkan-drivers"
        )));
    }
    let mut devices: Vec<Arc<dyn Backend>> = Vec::new();
    let mut failures = Vec::new();
    for adapter in adapters {
        let name = adapter.get_info().name;
        match WgpuBackend::open(adapter) {
            Ok(backend) => devices.push(crate::backend::checked::open(backend)),
            Err(err) => failures.push(format!("{name}: {err}")),
        }
    }
    if devices.is_empty() {
        return Err(unavailable(format!("no wgpu adapter could be opened: {}", failures.join("; "))));
    }
    Ok(devices)
}

/// The graphics API's own handle of the buffer behind `memory` (a `RawMemory::Wgpu`), as an
/// integer: the `VkBuffer` on Vulkan; `None` for an empty allocation and on other APIs. For
/// bindings that hand buffers to code outside Rust (the Python package's `DeviceMemoryView`).
///
/// # Safety
/// `memory` is a `RawMemory::Wgpu` of a live allocation (from a device view, while it lives).
pub unsafe fn native_buffer_handle(memory: crate::backend::RawMemory) -> Option<u64> {
    let crate::backend::RawMemory::Wgpu(buffer) = memory else { return None };
    // SAFETY: the caller's promise: the pointer is null or a live wgpu::Buffer.
    let buffer = unsafe { buffer.as_ref() }?;
    native::buffer_handle(buffer)
}

/// What a caught panic said.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "no message".into())
}

fn unavailable(reason: impl Into<String>) -> Error {
    Error::BackendUnavailable { backend: BackendKind::WGPU, reason: reason.into() }
}

/// The kinds of failure wgpu reports, as lazybuf numbers them (wgpu has no status codes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// `wgpu::Error::OutOfMemory`.
    OutOfMemory = 1,
    /// `wgpu::Error::Internal`.
    Internal = 2,
    /// A buffer mapping failed (`BufferAsyncError`).
    MapFailed = 3,
    /// A wgpu call panicked (caught).
    Panicked = 4,
    /// Waiting for the device failed (`PollError`).
    PollFailed = 5,
}

/// A wgpu failure as lazybuf reports it: its name, and whether freeing memory can help.
pub fn code(status: Status) -> RuntimeCode {
    let (name, retryable) = match status {
        Status::OutOfMemory => ("OutOfMemory", true),
        Status::Internal => ("Internal", false),
        Status::MapFailed => ("BufferAsyncError", false),
        Status::Panicked => ("panicked", false),
        Status::PollFailed => ("PollError", false),
    };
    RuntimeCode::Device { backend: BackendKind::WGPU, value: status as i64, name, retryable }
}

/// Maps a failed wgpu `call` to lazybuf's error.
pub(crate) fn wgpu_error(call: &'static str, status: Status) -> Error {
    Error::Runtime { backend: BackendKind::WGPU, call, code: code(status) }
}

/// The vendor's name from its PCI (or Khronos) id, else the driver's name.
fn vendor_name(info: &wgpu::AdapterInfo) -> String {
    let known = match info.vendor {
        0x1002 => "AMD",
        0x10DE => "NVIDIA",
        0x8086 => "Intel",
        0x106B => "Apple",
        0x13B5 => "ARM",
        0x5143 => "Qualcomm",
        0x1010 => "Imagination Technologies",
        0x14E4 => "Broadcom",
        0x1414 => "Microsoft",
        0x10005 => "Mesa",
        _ => "",
    };
    match (known, info.driver.is_empty()) {
        ("", true) => format!("vendor {:#x}", info.vendor),
        ("", false) => info.driver.clone(),
        (name, true) => name.to_string(),
        (name, false) => format!("{name} ({})", info.driver),
    }
}

/// Device memory figures the graphics API reports, where lazybuf can ask it.
pub(crate) mod native {
    /// Bytes of device-local memory: the sum of the Vulkan device-local heaps.
    pub(crate) fn total_memory(adapter: &wgpu::Adapter) -> Option<u64> {
        vulkan::heaps(adapter).map(|heaps| heaps.iter().map(|h| h.size).sum())
    }

    /// Free device-local bytes from `VK_EXT_memory_budget` (budget minus usage, every process's
    /// usage included), where the driver has the extension.
    pub(crate) fn free_memory(adapter: &wgpu::Adapter) -> Option<u64> {
        vulkan::heaps(adapter)?
            .iter()
            .map(|h| h.budget.map(|(budget, usage)| budget.saturating_sub(usage)))
            .sum()
    }

    /// The graphics API's own handle of `buffer` as an integer: the `VkBuffer` on Vulkan;
    /// `None` on other APIs (lazybuf has not run on them).
    pub(crate) fn buffer_handle(buffer: &wgpu::Buffer) -> Option<u64> {
        vulkan::buffer_handle(buffer)
    }

    /// One device-local heap: its size, and (budget, usage) where the driver reports them.
    pub(crate) struct Heap {
        pub(crate) size: u64,
        pub(crate) budget: Option<(u64, u64)>,
    }

    // Where wgpu has its Vulkan backend (`wgpu::hal::api::Vulkan`): the platforms its
    // `vulkan` feature covers. Apple platforms (Metal; Vulkan only through MoltenVK with
    // wgpu's `vulkan-portability`, which lazybuf does not enable) get the version below.
    #[cfg(any(windows, target_os = "linux", target_os = "android", target_os = "freebsd"))]
    mod vulkan {
        use ash::vk;
        use ash::vk::Handle;

        use super::Heap;

        pub(crate) fn buffer_handle(buffer: &wgpu::Buffer) -> Option<u64> {
            // SAFETY: the hal buffer is only read (its handle, returned as a number); nothing
            // is destroyed through it, and the guard is dropped before returning.
            let hal = unsafe { buffer.as_hal::<wgpu::hal::api::Vulkan>() }?;
            // SAFETY: the handle is not destroyed here (raw_handle's only requirement).
            Some(unsafe { hal.raw_handle() }.as_raw())
        }

        /// The device-local heaps of a Vulkan adapter; `None` for other APIs.
        pub(crate) fn heaps(adapter: &wgpu::Adapter) -> Option<Vec<Heap>> {
            // SAFETY: the hal adapter is only read (its physical device and instance), and
            // the guard keeps it alive while it is used; nothing is destroyed through it.
            let hal = unsafe { adapter.as_hal::<wgpu::hal::api::Vulkan>() }?;
            let instance = hal.shared_instance();
            let raw = instance.raw_instance();
            let physical = hal.raw_physical_device();
            let has_budget =
                hal.physical_device_capabilities().supports_extension(ash::ext::memory_budget::NAME)
                    && instance.instance_api_version() >= vk::API_VERSION_1_1;
            let mut budget = vk::PhysicalDeviceMemoryBudgetPropertiesEXT::default();
            let properties = if has_budget {
                let mut properties2 = vk::PhysicalDeviceMemoryProperties2::default().push_next(&mut budget);
                // SAFETY: `physical` belongs to `raw` (the adapter's own instance), Vulkan 1.1
                // is checked above, and the budget structure is chained as the extension
                // (which the device supports) defines.
                unsafe { raw.get_physical_device_memory_properties2(physical, &mut properties2) };
                properties2.memory_properties
            } else {
                // SAFETY: `physical` belongs to `raw`, the adapter's own instance.
                unsafe { raw.get_physical_device_memory_properties(physical) }
            };
            let count = (properties.memory_heap_count as usize).min(vk::MAX_MEMORY_HEAPS);
            Some(
                (0..count)
                    .filter(|&i| properties.memory_heaps[i].flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL))
                    .map(|i| Heap {
                        size: properties.memory_heaps[i].size,
                        budget: has_budget.then(|| (budget.heap_budget[i], budget.heap_usage[i])),
                    })
                    .collect(),
            )
        }
    }

    /// No Vulkan backend in wgpu here (macOS and other Apple platforms): no Vulkan figures.
    #[cfg(not(any(windows, target_os = "linux", target_os = "android", target_os = "freebsd")))]
    mod vulkan {
        pub(crate) fn heaps(_: &wgpu::Adapter) -> Option<Vec<super::Heap>> {
            None
        }

        pub(crate) fn buffer_handle(_: &wgpu::Buffer) -> Option<u64> {
            None
        }
    }
}
