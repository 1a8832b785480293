//! One suite over every memory resource: the direct one, the pool, the limiting adaptor, and
//! stacks of them. Each must hand out blocks of at least the requested size, of the requested
//! kind, that buffers can use on every device, and take every block back.
//!
//! What does not live here: behaviour particular to one resource (`pool.rs`).

use std::sync::Arc;

use lazybuf::{
    BufferOptions, Device, DirectResource, LimitingResource, MemoryPool, MemoryResource, PoolConfig, Ticket,
    UnifiedBuffer,
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
    match resource.allocate_host(device, 4096, true) {
        Ok(pinned) => {
            assert!(pinned.is_pinned(), "{resource:?} on {device}: a pinned request got a pageable block");
            resource.deallocate_host(device, pinned, Ticket::done());
        }
        // A device without pinned host memory (wgpu) refuses, saying so.
        Err(err) => assert!(
            !device.can_pin_host_memory() && matches!(err, lazybuf::Error::PinningFailed { .. }),
            "{resource:?} on {device}: {err}"
        ),
    }
}

/// Buffers over the resource: data survives a round trip through each device's memory.
fn buffers(resource: &Arc<dyn MemoryResource>, device: &Device) {
    for n in SIZES.map(|n| n.div_ceil(4)) {
        // Pinned host copies where the device has them (not on wgpu, see `blocks`).
        for pinned in [false, true].into_iter().filter(|&p| !p || device.can_pin_host_memory()) {
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

fn suite(make: impl Fn() -> Arc<dyn MemoryResource>) {
    for device in devices() {
        let resource = make();
        blocks(&*resource, &device);
        buffers(&resource, &device);
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
