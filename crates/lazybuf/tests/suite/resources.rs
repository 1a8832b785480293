//! One suite over every memory resource: the direct one, the pool, the limiting adaptor, and
//! stacks of them. Each must hand out blocks of at least the requested size, of the requested
//! kind (device, shared, pageable and pinned host), that buffers and memory objects can use on
//! every device, and take every block back.
//!
//! What does not live here: behaviour particular to one resource (`pool.rs`).

use std::sync::Arc;

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use lazybuf::resource::FailureCallback;
use lazybuf::{
    AllocationOptions, Block, BufferOptions, CallbackPayload, Device, DeviceAllocation, DeviceBuffer,
    DirectResource, Error, FailureCallbackResource, LimitingResource, MemoryKind, MemoryPool, MemoryResource,
    PoolConfig, StatisticsResource, Ticket, TrackingResource, UnifiedBuffer,
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
    kinds(resource, device);
}

/// Whether `err` is `device`'s clear refusal of a kind of memory it does not have (shared
/// memory where the device says it has none, `DeviceInfo::shared_memory`: wgpu, NVIDIA's
/// OpenCL; page-locked host memory where it cannot be had: wgpu).
fn lacks(device: &Device, kind: MemoryKind, err: &lazybuf::Error) -> bool {
    match (kind, err) {
        (MemoryKind::Shared, lazybuf::Error::InvalidArgument { reason, .. }) => {
            !device.info().shared_memory && reason.contains("shared")
        }
        (MemoryKind::Host { pinned: true }, lazybuf::Error::PinningFailed { .. }) => {
            !device.can_pin_host_memory()
        }
        _ => false,
    }
}

/// Every kind, one after another at one size (a cache keys its blocks by kind, so a block
/// given back is never handed out as another kind), each of the kind asked for.
fn kinds(resource: &dyn MemoryResource, device: &Device) {
    let stream = device.stream();
    for _ in 0..2 {
        for kind in KINDS {
            let block = match resource.allocate(device, kind, 1000, &stream) {
                Ok(block) => block,
                Err(err) if lacks(device, kind, &err) => continue,
                Err(err) => panic!("{resource:?} on {device}: {kind:?}: {err}"),
            };
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

/// Memory objects over the resource: every kind keeps its bytes, a device buffer grows.
fn memory_objects(resource: &Arc<dyn MemoryResource>, device: &Device) {
    let options = || AllocationOptions { resource: Some(resource.clone()), alignment: 0 };
    for kind in KINDS {
        let mut memory = match DeviceAllocation::<u32>::with_options(device, kind, 1000, options()) {
            Ok(memory) => memory,
            Err(err) if lacks(device, kind, &err) => continue,
            Err(err) => panic!("{resource:?} on {device}, {kind:?}: {err}"),
        };
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

/// A pool above hands out blocks rounded up to its size classes: the limit counts the block's
/// real length, and a block that would pass the limit goes back (found by a hostile script:
/// 5,120 bytes held under a limit of 5,000).
#[test]
fn a_limit_over_a_pool_counts_and_refuses_rounded_blocks() {
    let mut rounded_somewhere = false;
    for device in devices() {
        let pool = pool_over(DirectResource::shared());
        let stream = device.stream();
        // What the pool hands out for 5000 bytes on this device.
        let probe = pool.allocate(&device, MemoryKind::Device, 5000, &stream).unwrap();
        let rounded = probe.len();
        pool.deallocate(&device, probe, &stream, Ticket::done());
        rounded_somewhere |= rounded > 5000;
        let limit = Arc::new(LimitingResource::new(pool, 5000));
        match limit.allocate(&device, MemoryKind::Device, 5000, &stream) {
            Ok(block) => {
                assert!(rounded <= 5000, "{device}: a {} byte block under a 5000 byte limit", block.len());
                assert_eq!(limit.held(), block.len() as u64, "{device}");
                limit.deallocate(&device, block, &stream, Ticket::done());
            }
            Err(err) => {
                assert!(rounded > 5000, "{device}: {err}");
                let message = err.to_string();
                assert!(err.is_out_of_memory() && message.contains("the limit is 5000 bytes"), "{err}");
                assert!(message.contains(&format!("block for 5000 bytes is {rounded} bytes long")), "{err}");
            }
        }
        assert_eq!(limit.held(), 0, "{device}: a refused block left bytes held");
        let small = limit.allocate(&device, MemoryKind::Device, 100, &stream).unwrap();
        assert!(limit.held() <= 5000 && limit.held() == small.len() as u64, "{device}");
        limit.deallocate(&device, small, &stream, Ticket::done());
        assert_eq!(limit.held(), 0, "{device}");
    }
    assert!(rounded_somewhere, "no pool rounded 5000 bytes up: the test tested nothing");
}

#[test]
fn statistics() {
    let all: std::sync::Mutex<Vec<Arc<StatisticsResource>>> = Default::default();
    suite(|| {
        let stats = Arc::new(StatisticsResource::new(DirectResource::shared()));
        all.lock().unwrap().push(stats.clone());
        stats
    });
    for stats in all.into_inner().unwrap() {
        let s = stats.statistics();
        assert_eq!((s.current_bytes, s.current_count), (0, 0), "{stats:?} still counts memory");
        assert!(s.total_count > 0 && s.peak_bytes > 0 && s.total_bytes >= s.peak_bytes);
    }
}

#[test]
fn tracking() {
    let all: std::sync::Mutex<Vec<Arc<TrackingResource>>> = Default::default();
    suite(|| {
        let tracking = Arc::new(TrackingResource::new(DirectResource::shared(), false));
        all.lock().unwrap().push(tracking.clone());
        tracking
    });
    for tracking in all.into_inner().unwrap() {
        assert_eq!(tracking.allocated_bytes(), 0, "{tracking:?}");
        assert_eq!(tracking.report(), "");
    }
}

#[test]
fn failure_callback_over_a_pool() {
    suite(|| {
        let never: Arc<FailureCallback> = Arc::new(|_, _| Ok(false));
        Arc::new(FailureCallbackResource::new(pool_over(DirectResource::shared()), never))
    });
}

#[test]
fn adaptors_stacked() {
    limited(|| {
        let tracking = Arc::new(TrackingResource::new(pool_over(DirectResource::shared()), true));
        Arc::new(StatisticsResource::new(tracking))
    });
}

/// RMM's statistics: requested bytes are counted (not the pool's rounded blocks), levels push
/// and pop, and popping the last level is refused.
#[test]
fn statistics_count_requests_on_a_stack_of_levels() {
    let device = Device::host();
    let stats = StatisticsResource::new(pool_over(DirectResource::shared()));
    let stream = device.stream();
    let a: Vec<Block> =
        (0..10).map(|_| stats.allocate(&device, MemoryKind::Device, 10, &stream).unwrap()).collect();
    let before = stats.push_counters();
    assert_eq!((before.current_bytes, before.current_count, before.total_bytes), (100, 10, 100));
    let b = stats.allocate(&device, MemoryKind::Device, 20, &stream).unwrap();
    let mut a = a.into_iter();
    stats.deallocate(&device, a.next().unwrap(), &stream, Ticket::done());
    let inner = stats.pop_counters().unwrap();
    assert_eq!(
        (inner.current_bytes, inner.current_count, inner.peak_bytes, inner.total_bytes),
        (10, 0, 20, 20)
    );
    let outer = stats.statistics();
    assert_eq!(
        (outer.current_bytes, outer.current_count, outer.peak_bytes, outer.total_count),
        (110, 10, 120, 11)
    );
    assert!(stats.pop_counters().is_none(), "the last level stays");
    assert_eq!(stats.depth(), 1);
    stats.deallocate(&device, b, &stream, Ticket::done());
    a.for_each(|block| stats.deallocate(&device, block, &stream, Ticket::done()));
    assert_eq!(stats.statistics().current_bytes, 0);
}

/// Leak hunting: every outstanding block is listed with its size, kind and device (and the
/// call stack when asked for), and disappears when given back.
#[test]
fn tracking_lists_outstanding_allocations() {
    for device in devices() {
        let tracking = TrackingResource::new(DirectResource::shared(), true);
        let stream = device.stream();
        let kept = tracking.allocate(&device, MemoryKind::Device, 300, &stream).unwrap();
        let freed = tracking.allocate(&device, MemoryKind::Host { pinned: false }, 200, &stream).unwrap();
        let empty = tracking.allocate(&device, MemoryKind::Device, 0, &stream).unwrap();
        assert_eq!(tracking.allocated_bytes(), 500);
        tracking.deallocate(&device, freed, &stream, Ticket::done());
        tracking.deallocate(&device, empty, &stream, Ticket::done());
        let outstanding = tracking.outstanding();
        assert_eq!(outstanding.len(), 1, "{device}");
        assert_eq!((outstanding[0].bytes, outstanding[0].kind), (300, MemoryKind::Device));
        assert!(outstanding[0].stack.as_deref().is_some_and(|s| s.contains("tracking_lists")), "{device}");
        let report = tracking.report();
        assert!(report.contains(": 300 B (device on") && report.contains("callstack"), "{report}");
        tracking.deallocate(&device, kept, &stream, Ticket::done());
        assert_eq!((tracking.allocated_bytes(), tracking.report()), (0, String::new()));
    }
}

/// The failure callback decides: retry after freeing memory, give up, or fail itself (its
/// own error comes back unchanged).
#[test]
fn failure_callback_retries_gives_up_or_fails() {
    let device = Device::host();
    let stream = device.stream();
    let limit = Arc::new(LimitingResource::new(DirectResource::shared(), 1000));
    let hog = Arc::new(Mutex::new(Some(limit.allocate(&device, MemoryKind::Device, 900, &stream).unwrap())));
    let calls = Arc::new(AtomicUsize::new(0));
    let cb: Arc<FailureCallback> = {
        let (hog, calls, limit, device) = (hog.clone(), calls.clone(), limit.clone(), device.clone());
        Arc::new(move |bytes, err| {
            assert!(err.is_out_of_memory());
            calls.fetch_add(1, Ordering::SeqCst);
            match hog.lock().unwrap().take() {
                Some(block) => {
                    limit.deallocate(&device, block, &device.stream(), Ticket::done());
                    Ok(true)
                }
                None if bytes == 7777 => Err(Error::Callback {
                    operation: "allocate",
                    message: "refused".into(),
                    payload: CallbackPayload(Arc::new("the callback's own error")),
                }),
                None => Ok(false),
            }
        })
    };
    let resource = FailureCallbackResource::new(limit.clone(), cb);
    let block = resource.allocate(&device, MemoryKind::Device, 500, &stream).unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 1, "called once, then the retry fit");
    let err = resource.allocate(&device, MemoryKind::Device, 600, &stream).unwrap_err();
    assert!(err.is_out_of_memory(), "the callback gave up: {err}");
    let err = resource.allocate(&device, MemoryKind::Device, 7777, &stream).unwrap_err();
    let Error::Callback { payload, .. } = err else { panic!("{err}") };
    assert_eq!(payload.0.downcast_ref::<&str>(), Some(&"the callback's own error"));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    resource.deallocate(&device, block, &stream, Ticket::done());
    assert_eq!(limit.held(), 0);
}

#[cfg(feature = "testing")]
#[test]
fn the_current_resource_serves_buffers_and_memory_made_without_one() {
    let (device, _plan) = lazybuf::testing::FaultyDevice::wrap(&Device::host());
    let stats = Arc::new(StatisticsResource::new(DirectResource::shared()));
    assert!(lazybuf::set_current_resource(&device, Some(stats.clone())).is_none());
    let memory = DeviceAllocation::<u8>::new(&device, MemoryKind::Device, 64).unwrap();
    let options = BufferOptions { device: Some(device.clone()), ..BufferOptions::default() };
    let mut buffer = UnifiedBuffer::<u8>::with_options(&[32], options).unwrap();
    buffer.host_mut().unwrap().fill(1);
    assert_eq!(stats.statistics().current_bytes, 96);
    let previous = lazybuf::set_current_resource(&device, None).unwrap();
    assert!(Arc::ptr_eq(&previous, &(stats.clone() as Arc<dyn MemoryResource>)));
    let other = DeviceAllocation::<u8>::new(&device, MemoryKind::Device, 64).unwrap();
    assert_eq!(stats.statistics().current_bytes, 96, "back to the default");
    drop((memory, buffer, other));
    assert_eq!(stats.statistics().current_bytes, 0);
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
