//! One suite over every memory resource: the direct one, the pool, the limiting adaptor, and
//! stacks of them. Each must hand out blocks of at least the requested size, of the requested
//! kind (device, shared, pageable and pinned host), that buffers and memory objects can use on
//! every device, and take every block back.
//!
//! What does not live here: behaviour particular to one resource (`pool.rs`).

use std::sync::Arc;

use lazybuf::{
    AllocationOptions, Block, BufferOptions, Device, DeviceAllocation, DeviceBuffer, DirectResource,
    LimitingResource, MemoryKind, MemoryPool, MemoryResource, PoolConfig, Ticket, UnifiedBuffer,
};

const SIZES: [usize; 7] = [0, 1, 100, 4096, 70_000, 1 << 20, (1 << 20) + 3];

fn devices() -> Vec<Device> {
    let devices = lazybuf::devices();
    #[cfg(feature = "opencl")]
    assert!(
        devices.iter().any(|d| d.backend_kind() == lazybuf::BackendKind::OPENCL),
        "the suite needs an OpenCL device (CI installs Debian's pocl-opencl-icd)"
    );
    devices
}

/// Raw blocks: sizes, kinds, writable bytes, and all of them taken back.
fn blocks(resource: &dyn MemoryResource, device: &Device) {
    for n in SIZES {
        let mut block = resource.allocate_host(device, n, false).unwrap();
        assert!(block.len() >= n, "{resource:?}: {} bytes for a request of {n}", block.len());
        assert!(!block.is_pinned());
        block.as_mut_slice()[..n].fill(0xAB);
        assert!(block.as_slice()[..n].iter().all(|&b| b == 0xAB));
        resource.deallocate_host(device, block, Ticket::done());

        let stream = device.stream();
        let memory = resource.allocate_device(device, n, &stream).unwrap();
        assert!(memory.len() >= n, "{resource:?}: {} device bytes for a request of {n}", memory.len());
        resource.deallocate_device(device, memory, &stream, Ticket::done());
    }
    let pinned = resource.allocate_host(device, 4096, true).unwrap();
    assert!(pinned.is_pinned(), "{resource:?} on {device}: a pinned request got a pageable block");
    resource.deallocate_host(device, pinned, Ticket::done());
    kinds(resource, device);
}

/// Every kind, one after another at one size (a cache keys its blocks by kind, so a block
/// given back is never handed out as another kind), each of the kind asked for.
fn kinds(resource: &dyn MemoryResource, device: &Device) {
    let stream = device.stream();
    for _ in 0..2 {
        for kind in KINDS {
            let block = resource.allocate(device, kind, 1000, &stream).unwrap();
            assert_eq!(block.kind(), kind, "{resource:?} on {device}");
            assert!(block.len() >= 1000);
            if let Block::Device(memory) = &block {
                assert_eq!(
                    memory.host_address().is_some(),
                    kind == MemoryKind::Shared || device.backend_kind() == lazybuf::BackendKind::HOST
                );
            }
            resource.deallocate(device, block, &stream, Ticket::done());
        }
    }
}

const KINDS: [MemoryKind; 4] = [
    MemoryKind::Device,
    MemoryKind::Shared,
    MemoryKind::Host { pinned: false },
    MemoryKind::Host { pinned: true },
];

/// Buffers over the resource: data survives a round trip through each device's memory.
fn buffers(resource: &Arc<dyn MemoryResource>, device: &Device) {
    for n in SIZES.map(|n| n.div_ceil(4)) {
        for pinned in [false, true] {
            let options = BufferOptions {
                device: Some(device.clone()),
                pinned,
                resource: Some(resource.clone()),
                ..BufferOptions::default()
            };
            let mut buf = UnifiedBuffer::<u32>::with_options(&[n], options).unwrap();
            let data: Vec<u32> = (0..n as u32).map(|i| i.wrapping_mul(2_654_435_761)).collect();
            buf.copy_from(&data).unwrap();
            assert_eq!(buf.is_pinned(), pinned, "{resource:?} on {device}, {n} elements");
            buf.sync_to_device().unwrap();
            buf.mark_device_dirty().unwrap(); // the host copy is stale now: read back from the device
            assert_eq!(buf.to_vec().unwrap(), data, "{resource:?} on {device}, {n} elements");
        }
    }
}

/// Memory objects over the resource: every kind keeps its bytes, a device buffer grows.
fn memory_objects(resource: &Arc<dyn MemoryResource>, device: &Device) {
    let options = || AllocationOptions { resource: Some(resource.clone()), alignment: 0 };
    for kind in KINDS {
        let mut memory = DeviceAllocation::<u32>::with_options(device, kind, 1000, options()).unwrap();
        let data: Vec<u32> = (0..1000).collect();
        memory.copy_from_host(&data).unwrap();
        assert_eq!(memory.to_vec().unwrap(), data, "{resource:?} on {device}, {kind:?}");
    }
    let mut buffer = DeviceBuffer::with_options(device, MemoryKind::Device, 3, options()).unwrap();
    buffer.copy_from_host(b"abc").unwrap();
    buffer.resize(100_000).unwrap();
    assert_eq!(&buffer.to_vec().unwrap()[..3], b"abc", "{resource:?} on {device}");
}

fn suite(make: impl Fn() -> Arc<dyn MemoryResource>) {
    for device in devices() {
        let resource = make();
        blocks(&*resource, &device);
        buffers(&resource, &device);
        memory_objects(&resource, &device);
    }
}

/// Checks that a limit over the resource ends with nothing held.
fn limited(make: impl Fn() -> Arc<dyn MemoryResource>) {
    let limits: std::sync::Mutex<Vec<Arc<LimitingResource>>> = Default::default();
    suite(|| {
        let limit = Arc::new(LimitingResource::new(make(), 1 << 30));
        limits.lock().unwrap().push(limit.clone());
        limit
    });
    for limit in limits.into_inner().unwrap() {
        assert_eq!(limit.held(), 0, "{limit:?} still holds memory");
    }
}

fn pool_over(upstream: Arc<dyn MemoryResource>) -> Arc<dyn MemoryResource> {
    MemoryPool::with_upstream(&Device::host(), PoolConfig::default(), upstream).resource()
}

#[test]
fn direct() {
    suite(DirectResource::shared);
}

#[test]
fn pool() {
    suite(|| pool_over(DirectResource::shared()));
}

#[test]
fn pool_that_caches_nothing() {
    let config = PoolConfig { max_cached_bytes: 0, zero_reused: true };
    suite(|| MemoryPool::with_upstream(&Device::host(), config, DirectResource::shared()).resource());
}

#[test]
fn limiting() {
    limited(DirectResource::shared);
}

#[test]
fn limiting_over_a_pool() {
    limited(|| pool_over(DirectResource::shared()));
}

#[test]
fn pool_over_a_limit_gives_everything_back_on_trim() {
    let limit = Arc::new(LimitingResource::new(DirectResource::shared(), 1 << 30));
    let pool = MemoryPool::with_upstream(&Device::host(), PoolConfig::default(), limit.clone());
    suite(|| pool.resource());
    assert!(limit.held() > 0, "the pool caches what the suite gave back");
    assert_eq!(limit.held(), pool.stats().bytes_cached);
    pool.trim();
    assert_eq!(limit.held(), 0);
}
