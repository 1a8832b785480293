//! Shared helpers for the integration tests: the devices under test and data patterns.
//!
//! Every suite runs on every device lazybuf finds (the host, PoCL's OpenCL device, lavapipe's
//! Vulkan device through wgpu, CUDA when a driver or the CUDA test double is loaded).
//! `LAZYBUF_REQUIRE=opencl,wgpu,cuda` makes a missing backend a failure instead of a smaller
//! run, so CI cannot pass by finding nothing.

#![allow(dead_code)]

use lazybuf::{BackendKind, BufferOptions, Device, DirectResource, UnifiedBuffer};

/// Every device to test, after checking `LAZYBUF_REQUIRE`: every device lazybuf found, and,
/// for each wgpu device that transfers by mapping its buffers, the same adapter opened with
/// staging transfers (so both wgpu paths run every suite). The host stays last.
pub fn devices() -> Vec<Device> {
    let mut devices = lazybuf::devices();
    let host = devices.pop();
    devices.extend(staging_twins());
    devices.extend(host);
    if let Ok(required) = std::env::var("LAZYBUF_REQUIRE") {
        // Backend names; `cuda-double` (the CUDA test double itself) is checked where it matters.
        for name in required.split(',').map(str::trim).filter(|n| !n.is_empty() && *n != "cuda-double") {
            assert!(
                devices.iter().any(|d| d.backend_kind().name() == name),
                "LAZYBUF_REQUIRE names {name}, but lazybuf found no {name} device: {:?}",
                lazybuf::backend_status()
            );
        }
    }
    devices
}

/// The name libtest gives the test function `name` of the module whose `module_path!()` is
/// `module` (the path without the test binary's crate), for re-running this binary with
/// `--exact` on that one test in a child process: a test in `tests/suite/wgpu.rs` is
/// `wgpu::name`, one in `tests/fork.rs` just `name`.
pub fn test_name(module: &str, name: &str) -> String {
    match module.split_once("::") {
        Some((_, path)) => format!("{path}::{name}"),
        None => name.to_string(),
    }
}

/// The devices of one backend.
pub fn devices_of(kind: BackendKind) -> Vec<Device> {
    devices().into_iter().filter(|d| d.backend_kind() == kind).collect()
}

/// A deterministic, seed-dependent pattern of `n` values.
pub fn pattern(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| i.wrapping_mul(2_654_435_761).wrapping_add(seed.wrapping_mul(40_503))).collect()
}

/// Buffer lengths (in u32 elements) that cover empty, tiny, odd, and the zero-copy sizes
/// (4 MiB and more alias host memory on host-sharing OpenCL devices).
pub const LENGTHS: [usize; 5] = [0, 1, 7, 1000, 1_100_000];

/// A buffer of `len` u32 elements on `device` whose every allocation goes to the device itself
/// (no pool), so each one reaches a fault-injecting or counting backend.
pub fn direct(device: &Device, len: usize) -> UnifiedBuffer<u32> {
    let options = BufferOptions {
        device: Some(device.clone()),
        resource: Some(DirectResource::shared()),
        ..BufferOptions::default()
    };
    UnifiedBuffer::with_options(&[len], options).unwrap()
}

/// For each wgpu device that transfers by mapping its buffers, the same adapter opened with
/// staging transfers: one device per adapter for the whole test binary.
#[cfg(feature = "wgpu")]
pub fn staging_twins() -> Vec<Device> {
    use lazybuf::backend::wgpu::{WgpuBackend, WgpuOptions};
    static TWINS: std::sync::OnceLock<Vec<Device>> = std::sync::OnceLock::new();
    TWINS
        .get_or_init(|| {
            lazybuf::devices()
                .iter()
                .filter_map(|d| d.backend_as::<WgpuBackend>())
                .filter(|backend| backend.maps_for_transfers())
                .map(|backend| {
                    let options = WgpuOptions { mapped_transfers: false };
                    let twin = WgpuBackend::open_with(backend.adapter().clone(), options).unwrap();
                    Device::open(twin)
                })
                .collect()
        })
        .clone()
}

#[cfg(not(feature = "wgpu"))]
pub fn staging_twins() -> Vec<Device> {
    Vec::new()
}

/// `bytes` of `device`'s memory straight from its backend (no cache), for the tests of
/// [`lazybuf::Stream`]'s operations.
pub fn device_memory(device: &Device, bytes: usize) -> lazybuf::backend::DeviceMemory {
    use lazybuf::MemoryResource;
    match DirectResource.allocate(device, lazybuf::MemoryKind::Device, bytes, &device.stream()).unwrap() {
        lazybuf::Block::Device(memory) => memory,
        lazybuf::Block::Host(_) => panic!("{device} gave host memory for device memory"),
    }
}

/// A buffer's allocations as the trace has them: its allocation events, less what its
/// rollbacks took back (so they compare with its `transfer_stats().allocations`).
pub fn recorded_allocations(recorded: &lazybuf::observe::trace::Trace, id: u64) -> i64 {
    use lazybuf::observe::trace::EventKind;
    recorded
        .events
        .iter()
        .map(|e| match &e.kind {
            EventKind::Allocate { buffer, .. } if *buffer == id => 1,
            EventKind::Rollback { buffer, allocations, .. } if *buffer == id => -(*allocations as i64),
            _ => 0,
        })
        .sum()
}
