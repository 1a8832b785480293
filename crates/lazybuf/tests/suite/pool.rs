//! The memory pool through its public API: the seeds' "same buffer" reuse, laziness, size
//! classes and keys, the cap, trim and clear, zeroing, foreign releases, failures and
//! out-of-memory, on the host device and on OpenCL.
//!
//! What does not live here: the threaded stress test (`pool_stress.rs`), the shared suite over
//! every memory resource (`resources.rs`), pinned memory (`pinned.rs`).

use std::sync::Arc;

use lazybuf::coherence::Access;
use lazybuf::testing::FaultyDevice;
use lazybuf::{
    BufferOptions, BufferState, Device, DirectResource, Error, LimitingResource, MemoryKind, MemoryPool,
    PoolConfig, PoolStats, PoolUsage, RawBuffer, UnifiedBuffer,
};

fn host_pool(config: PoolConfig) -> MemoryPool {
    MemoryPool::new(&Device::host(), config)
}

fn stats(hits: u64, misses: u64, allocations: u64, in_use: u64, cached: u64, peak: u64) -> PoolStats {
    PoolStats {
        hits,
        misses,
        allocations,
        bytes_in_use: in_use,
        bytes_cached: cached,
        peak_bytes_in_use: peak,
        oom_retries: 0,
    }
}

#[test]
fn same_buffer_on_the_host() {
    let pool = host_pool(PoolConfig::default());
    let mut a = pool.acquire::<f32>(&[1000], false).unwrap();
    assert_eq!(a.state(), BufferState::Uninitialized);
    assert_eq!(pool.stats(), PoolStats::default(), "acquire allocates nothing: memory is taken at first use");
    a.host_mut().unwrap().fill(3.0);
    let first = a.host().unwrap().as_ptr();
    assert_eq!(pool.stats(), stats(0, 1, 1, 4096, 0, 4096));
    pool.release(a).unwrap();
    assert_eq!(pool.stats(), stats(0, 1, 1, 0, 4096, 4096));

    let mut b = pool.acquire::<f32>(&[1000], false).unwrap();
    assert_eq!(b.state(), BufferState::Uninitialized);
    let host = b.host_overwrite().unwrap();
    assert_eq!(host.as_ptr(), first, "the same host block");
    // No hidden memset on reuse: the old bytes are still there (zero_reused clears them).
    assert!(host.iter().all(|&x| x == 3.0));
    assert_eq!(pool.stats(), stats(1, 1, 1, 4096, 0, 4096), "a hit, no new allocation");
}

#[test]
fn an_untouched_buffer_takes_nothing() {
    let pool = host_pool(PoolConfig::default());
    for _ in 0..3 {
        let buf = pool.acquire::<u8>(&[1 << 20], false).unwrap();
        pool.release(buf).unwrap();
    }
    assert_eq!(pool.stats(), PoolStats::default());
}

#[test]
fn a_fitting_size_class_is_reused_whatever_the_element_type() {
    let pool = host_pool(PoolConfig::default());
    let mut a = pool.acquire::<f32>(&[1000], false).unwrap(); // 4000 bytes: class 4096
    let first = a.host_overwrite().unwrap().as_ptr() as usize;
    drop(a);
    let mut b = pool.acquire::<u8>(&[4096], false).unwrap(); // 4096 bytes: class 4096
    assert_eq!(b.host_overwrite().unwrap().as_ptr() as usize, first);
    drop(b);
    let mut c = pool.acquire::<f64>(&[2, 255], false).unwrap(); // 4080 bytes: class 4096
    assert_eq!(c.host_overwrite().unwrap().as_ptr() as usize, first);
    assert_eq!(c.host().unwrap().len(), 510, "a buffer sees its own elements, not its whole block");
    assert_eq!(c.to_vec().unwrap().len(), 510);
    drop(c);
    let mut d = pool.acquire::<u8>(&[4097], false).unwrap(); // class 5120: a miss
    assert_ne!(d.host_overwrite().unwrap().as_ptr() as usize, first);
    drop(d);
    let s = pool.stats();
    assert_eq!((s.hits, s.misses, s.allocations, s.bytes_cached), (2, 2, 2, 4096 + 5120));
}

#[test]
fn pinned_and_pageable_blocks_are_kept_apart() {
    let pool = host_pool(PoolConfig::default());
    let mut a = pool.acquire::<f32>(&[1024], true).unwrap();
    a.host_overwrite().unwrap();
    assert!(a.is_pinned());
    drop(a);
    let mut b = pool.acquire::<f32>(&[1024], false).unwrap();
    b.host_overwrite().unwrap();
    assert!(!b.is_pinned(), "a pageable request never gets the cached pinned block");
    drop(b);
    let mut c = pool.acquire::<f32>(&[1024], true).unwrap();
    c.host_overwrite().unwrap();
    assert!(c.is_pinned());
    let s = pool.stats();
    assert_eq!((s.hits, s.misses, s.allocations), (1, 2, 2));

    // Each kind's share: `c` holds the pinned block (a hit), `b`'s pageable block is cached.
    let pinned = pool.usage(|k| k == MemoryKind::Host { pinned: true });
    assert_eq!(
        pinned,
        PoolUsage { hits: 1, misses: 1, bytes_in_use: 4096, bytes_cached: 0, cached_blocks: 0 }
    );
    let pageable = pool.usage(|k| k == MemoryKind::Host { pinned: false });
    assert_eq!(
        pageable,
        PoolUsage { hits: 0, misses: 1, bytes_in_use: 0, bytes_cached: 4096, cached_blocks: 1 }
    );
    let all = pool.usage(|_| true);
    assert_eq!(
        (all.hits, all.misses, all.bytes_in_use, all.bytes_cached),
        (s.hits, s.misses, s.bytes_in_use, s.bytes_cached)
    );
    assert_eq!(all.cached_blocks, 1);
    assert_eq!(pool.usage(|k| k == MemoryKind::Device), PoolUsage::default());
    pool.clear();
    assert_eq!(pool.usage(|_| true), PoolUsage { bytes_in_use: 4096, ..PoolUsage::default() });
}

#[test]
fn a_limit_bounds_what_the_pool_holds_after_trimming_its_cache() {
    let pool = host_pool(PoolConfig::default());
    assert_eq!(pool.limit(), None);
    pool.set_limit(Some(10_000));
    assert_eq!(pool.limit(), Some(10_000));
    let mut a = pool.acquire::<u8>(&[4096], false).unwrap();
    a.host_overwrite().unwrap();
    drop(a); // cached: 4096
    let mut b = pool.acquire::<u8>(&[8000], false).unwrap();
    b.host_overwrite().unwrap().fill(5); // a block of 8192 fits only once the cache is trimmed
    let s = pool.stats();
    assert_eq!((s.bytes_in_use, s.bytes_cached, s.oom_retries), (8192, 0, 1));

    // 8192 held + 4000 would pass the limit: refused, and the buffer is as it was.
    let mut c = pool.acquire::<u8>(&[4000], false).unwrap();
    let err = c.host_overwrite().unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    assert!(err.to_string().contains("the limit is 10000 bytes; 8192 are held"), "{err}");
    assert_eq!(c.state(), BufferState::Uninitialized);
    assert_eq!(pool.stats().bytes_in_use, 8192);
    let mut empty = pool.acquire::<u8>(&[0], false).unwrap();
    empty.host_overwrite().unwrap(); // empty blocks cost nothing

    // Lowering the limit takes nothing from live buffers; lifting it lets `c` in.
    pool.set_limit(Some(100));
    assert!(b.host().unwrap().iter().all(|&x| x == 5));
    pool.set_limit(None);
    c.host_overwrite().unwrap();
    assert_eq!(pool.stats().bytes_in_use, 8192 + 4096);
}

#[test]
fn the_cap_bounds_cached_bytes_and_trim_frees_them() {
    let pool = host_pool(PoolConfig { max_cached_bytes: 8192, zero_reused: false });
    let mut bufs: Vec<_> = (0..3).map(|_| pool.acquire::<u8>(&[4096], false).unwrap()).collect();
    for buf in &mut bufs {
        buf.host_overwrite().unwrap();
    }
    assert_eq!(pool.stats(), stats(0, 3, 3, 12288, 0, 12288));
    drop(bufs);
    assert_eq!(pool.stats(), stats(0, 3, 3, 0, 8192, 12288), "the third release went upstream");
    assert_eq!(pool.trim(), 8192);
    assert_eq!(pool.trim(), 0);
    assert_eq!(pool.stats().bytes_cached, 0);
    let mut again = pool.acquire::<u8>(&[4096], false).unwrap();
    again.host_overwrite().unwrap();
    assert_eq!(pool.stats().misses, 4, "nothing was left to reuse");
}

#[test]
fn a_zero_cap_caches_nothing() {
    let pool = host_pool(PoolConfig { max_cached_bytes: 0, zero_reused: false });
    for _ in 0..2 {
        let mut buf = pool.acquire::<u8>(&[100], false).unwrap();
        buf.host_overwrite().unwrap();
    }
    assert_eq!(pool.stats(), stats(0, 2, 2, 0, 0, 128));
}

#[test]
fn clear_trims_and_resets_the_counters() {
    let pool = host_pool(PoolConfig::default());
    let mut kept = pool.acquire::<u8>(&[4096], false).unwrap();
    kept.host_overwrite().unwrap();
    for _ in 0..2 {
        let mut buf = pool.acquire::<u8>(&[8192], false).unwrap();
        buf.host_overwrite().unwrap();
    }
    assert_eq!(pool.stats(), stats(1, 2, 2, 4096, 8192, 12288));
    pool.clear();
    assert_eq!(pool.stats(), stats(0, 0, 0, 4096, 0, 4096), "live buffers stay counted");
    drop(kept);
    assert_eq!(pool.stats(), stats(0, 0, 0, 0, 4096, 4096));
}

#[test]
fn an_overwrite_now_takes_only_a_cached_host_block_and_counts_no_miss() {
    let pool = host_pool(PoolConfig::default());
    let device = Device::host();
    let mut a = RawBuffer::with_resource(4000, device.clone(), false, pool.resource());
    assert!(a.host_overwrite_now().is_none(), "nothing cached yet");
    assert_eq!(pool.stats(), PoolStats::default(), "a refused now-allocation counts nothing");
    assert_eq!(a.state(), BufferState::Uninitialized);
    a.host_access(Access::Overwrite).unwrap().fill(5);
    let first = a.host_if_valid().unwrap().as_ptr();
    assert_eq!(pool.stats(), stats(0, 1, 1, 4096, 0, 4096));
    drop(a);

    let mut b = RawBuffer::with_resource(4000, device.clone(), false, pool.resource());
    let host = b.host_overwrite_now().expect("a cached block is ready").unwrap();
    assert_eq!((host.as_ptr(), host.len()), (first, 4000), "the cached block, the buffer's size");
    host.fill(6);
    assert_eq!(b.state(), BufferState::HostOnly);
    assert_eq!(b.transfer_stats().allocations, 1);
    assert_eq!(pool.stats(), stats(1, 1, 1, 4096, 0, 4096), "one hit");
    // Allocated now: every later overwrite is bookkeeping only.
    assert!(b.host_overwrite_now().is_some());
    assert!(b.host_if_valid().unwrap().iter().all(|&x| x == 6));

    // A resource with nothing ready (no cache) allocates nothing now.
    let mut direct = RawBuffer::with_resource(4000, device.clone(), false, DirectResource::shared());
    assert!(direct.host_overwrite_now().is_none());
    assert_eq!(direct.state(), BufferState::Uninitialized);
}

#[test]
fn an_overwrite_now_is_refused_while_a_device_copy_over_the_host_block_is_in_use() {
    // The host device's copy aliases the host block: handed out, a kernel may still use it.
    let pool = host_pool(PoolConfig::default());
    let device = Device::host();
    let mut a = RawBuffer::with_resource(4000, device.clone(), false, pool.resource());
    a.host_access(Access::Overwrite).unwrap();
    a.device_access(&device, Access::Write).unwrap();
    assert!(a.host_overwrite_now().is_none(), "the handed-out device copy is in use");
    assert_eq!(a.state(), BufferState::DeviceDirty, "nothing changed");
    a.host_access(Access::Overwrite).unwrap();
    assert!(a.host_overwrite_now().is_some());
}

#[test]
fn zero_reused_clears_reused_host_blocks() {
    let pool = host_pool(PoolConfig { zero_reused: true, ..PoolConfig::default() });
    let mut a = pool.acquire::<u32>(&[1000], false).unwrap();
    a.host_mut().unwrap().fill(7);
    let first = a.host().unwrap().as_ptr();
    drop(a);
    let mut b = pool.acquire::<u32>(&[1000], false).unwrap();
    let host = b.host_mut().unwrap();
    assert_eq!(host.as_ptr(), first);
    assert!(host.iter().all(|&x| x == 0));
}

#[test]
fn releasing_a_foreign_buffer_is_an_error_and_its_memory_goes_home() {
    let pool = host_pool(PoolConfig::default());
    let other = host_pool(PoolConfig::default());
    let mut foreign = other.acquire::<f32>(&[1000], false).unwrap();
    foreign.host_overwrite().unwrap();
    assert!(other.owns(foreign.raw()));
    assert!(!pool.owns(foreign.raw()));
    let err = pool.release(foreign).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { operation: "MemoryPool::release", .. }), "{err}");
    assert!(err.to_string().contains("expected a buffer acquired from this pool"), "{err}");
    assert_eq!(other.stats().bytes_cached, 4096, "the memory went back to its own pool");
    assert_eq!(pool.stats(), PoolStats::default());

    let mut direct = UnifiedBuffer::<f32>::on(&[10], &Device::host()).unwrap();
    direct.host_overwrite().unwrap();
    assert!(!pool.owns(direct.raw()));
    let err = pool.release(direct).unwrap_err().to_string();
    assert!(err.contains("DirectResource"), "{err}");
}

#[test]
fn buffers_made_with_the_pool_resource_belong_to_the_pool() {
    let pool = host_pool(PoolConfig::default());
    let options = BufferOptions {
        device: Some(Device::host()),
        resource: Some(pool.resource()),
        ..BufferOptions::default()
    };
    let mut buf = UnifiedBuffer::<u16>::with_options(&[300], options).unwrap();
    buf.host_overwrite().unwrap();
    assert!(pool.owns(buf.raw()));
    pool.release(buf).unwrap();
    assert_eq!(pool.stats().bytes_cached, 640);
}

#[test]
fn the_default_pool_is_one_per_device() {
    let host = Device::host();
    let a = MemoryPool::for_device(&host);
    let b = MemoryPool::for_device(&host);
    let buf = a.acquire::<u8>(&[16], false).unwrap();
    assert!(b.owns(buf.raw()));
    assert_eq!(a.device(), &host);
    assert_eq!(a.config(), PoolConfig::for_device(&host));
    assert!(a.config().max_cached_bytes <= lazybuf::resource::DEFAULT_MAX_CACHED_BYTES);
}

#[test]
fn bad_shapes_are_refused_and_change_nothing() {
    let pool = host_pool(PoolConfig::default());
    let err = pool.acquire::<f32>(&[usize::MAX, 2], false).unwrap_err();
    assert!(matches!(err, Error::InvalidShape { .. }), "{err}");
    let err = pool.acquire::<f64>(&[1 << 62], false).unwrap_err();
    assert!(matches!(err, Error::InvalidShape { .. }), "{err}");
    assert_eq!(pool.stats(), PoolStats::default());
}

#[test]
fn empty_buffers_bypass_the_cache() {
    let pool = host_pool(PoolConfig::default());
    let mut buf = pool.acquire::<f32>(&[0, 5], false).unwrap();
    assert!(buf.host_overwrite().unwrap().is_empty());
    buf.sync_to_device().unwrap();
    drop(buf);
    assert_eq!(pool.stats(), PoolStats::default());
}

#[test]
fn out_of_memory_trims_and_retries_once_then_errors() {
    let limit = Arc::new(LimitingResource::new(DirectResource::shared(), 8192));
    let pool = MemoryPool::with_upstream(&Device::host(), PoolConfig::default(), limit.clone());
    let mut a = pool.acquire::<u8>(&[4096], false).unwrap();
    a.host_overwrite().unwrap();
    drop(a);
    assert_eq!((limit.held(), pool.stats().bytes_cached), (4096, 4096));

    // 4096 cached + 5120 more > 8192: the upstream refuses, the pool trims, the retry succeeds.
    let mut b = pool.acquire::<u8>(&[5000], false).unwrap();
    b.host_overwrite().unwrap();
    let s = pool.stats();
    assert_eq!((s.oom_retries, s.bytes_cached, s.allocations, s.bytes_in_use), (1, 0, 2, 5120));
    assert_eq!(limit.held(), 5120);

    // Nothing cached to free: trim, retry, then the upstream's own error.
    let mut c = pool.acquire::<u8>(&[4096], false).unwrap();
    let err = c.host_overwrite().unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    assert!(err.to_string().contains("the limit is 8192 bytes"), "{err}");
    assert_eq!(c.state(), BufferState::Uninitialized);
    let s = pool.stats();
    assert_eq!((s.oom_retries, s.allocations, s.bytes_in_use), (2, 2, 5120));
    drop(b);
    c.host_overwrite().unwrap();
    assert_eq!(pool.stats().hits, 0, "class 4096 was never cached, so this is a fresh block");
}

#[test]
fn a_failure_that_is_not_out_of_memory_is_not_retried() {
    // 256 bytes is a size class of its own; 1000 bytes is served by a 1024-byte class block,
    // whose refusal for lack of memory (only) is retried at the exact size.
    for (len, class) in [(64, 256), (250, 1024)] {
        let (device, plan) = FaultyDevice::wrap(&Device::host());
        let pool = MemoryPool::new(&device, PoolConfig::default());
        let mut buf = pool.acquire::<f32>(&[len], false).unwrap();
        plan.fail_allocation_in(1);
        let err = buf.host_mut().unwrap_err();
        assert!(matches!(err, Error::InjectedFault { .. }), "{len} elements: {err}");
        assert_eq!(plan.allocations(), 1, "{len} elements: the failed allocation was retried");
        assert_eq!(buf.state(), BufferState::Uninitialized);
        assert_eq!(pool.stats(), stats(0, 1, 0, 0, 0, 0));
        buf.host_mut().unwrap().fill(1.0);
        assert_eq!(pool.stats(), stats(0, 2, 1, class, 0, class));
    }
}

#[cfg(feature = "opencl")]
mod opencl {
    use super::*;
    use lazybuf::BackendKind;

    fn device() -> Device {
        lazybuf::devices()
            .into_iter()
            .find(|d| d.backend_kind() == BackendKind::OPENCL)
            .expect("these tests need an OpenCL device (CI installs Debian's pocl-opencl-icd)")
    }

    /// The `cl_mem` of a device copy, from its debug form (identity only, never dereferenced).
    fn cl_mem(buf: &mut UnifiedBuffer<f32>) -> String {
        let text = format!("{:?}", buf.device().unwrap().memory());
        let start = text.find("mem: ").expect("an OpenCL memory handle");
        text[start..].split(',').next().unwrap().to_string()
    }

    #[test]
    fn same_buffer_on_opencl() {
        let device = device();
        let pool = MemoryPool::new(&device, PoolConfig::default());
        let data: Vec<f32> = (0..1000).map(|i| i as f32).collect();
        let mut a = pool.acquire::<f32>(&[1000], false).unwrap();
        a.copy_from(&data).unwrap();
        a.sync_to_device().unwrap();
        let (host, mem) = (a.host().unwrap().as_ptr(), cl_mem(&mut a));
        assert_eq!(pool.stats(), stats(0, 2, 2, 8192, 0, 8192), "a host block and device memory");
        pool.release(a).unwrap();

        let mut b = pool.acquire::<f32>(&[1000], false).unwrap();
        assert_eq!(b.state(), BufferState::Uninitialized);
        let doubled: Vec<f32> = data.iter().map(|x| 2.0 * x).collect();
        b.copy_from(&doubled).unwrap();
        b.sync_to_device().unwrap();
        assert_eq!((b.host().unwrap().as_ptr(), cl_mem(&mut b)), (host, mem), "the same allocations");
        assert_eq!(pool.stats(), stats(2, 2, 2, 8192, 0, 8192));
        b.mark_device_dirty().unwrap();
        assert_eq!(b.to_vec().unwrap(), doubled);
    }

    /// A device-only buffer, filled with `value` on the device, then dropped into the pool.
    fn leave_on_device(pool: &MemoryPool, value: f32) {
        let mut a = pool.acquire::<f32>(&[1000], false).unwrap();
        a.device_overwrite().unwrap();
        a.fill(value).unwrap();
        assert_eq!(a.state(), BufferState::DeviceOnly);
    }

    #[test]
    fn zero_reused_clears_reused_device_memory() {
        for zero_reused in [false, true] {
            let pool = MemoryPool::new(&device(), PoolConfig { zero_reused, ..PoolConfig::default() });
            leave_on_device(&pool, 7.0);
            let mut b = pool.acquire::<f32>(&[1000], false).unwrap();
            // An overwrite takes the cached memory and copies nothing: its old bytes show
            // unless zero_reused cleared them.
            let mut seen = vec![-1.0f32; 1000];
            b.device_overwrite().unwrap().read_into(&mut seen).unwrap();
            let expected = if zero_reused { 0.0 } else { 7.0 };
            assert!(seen.iter().all(|&x| x == expected), "zero_reused={zero_reused}: saw {:?}", &seen[..4]);
            assert_eq!(pool.stats().allocations, 1, "zero_reused={zero_reused}: reused, not allocated");
        }
    }

    #[test]
    fn a_failed_zero_fill_returns_the_block_and_changes_nothing() {
        let (device, plan) = FaultyDevice::wrap(&device());
        let pool = MemoryPool::new(&device, PoolConfig { zero_reused: true, ..PoolConfig::default() });
        leave_on_device(&pool, 7.0);
        let mut b = pool.acquire::<f32>(&[1000], false).unwrap();
        plan.fail_copy_in(1);
        let err = b.device_overwrite().unwrap_err();
        assert!(matches!(err, Error::InjectedFault { .. }), "{err}");
        assert_eq!(b.state(), BufferState::Uninitialized);
        let s = pool.stats();
        // Only the device block exists: a device-only access allocates no host block.
        assert_eq!((s.bytes_in_use, s.bytes_cached, s.allocations), (0, 4096, 1));
        b.device_overwrite().unwrap();
        assert!(b.to_vec().unwrap().iter().all(|&x| x == 0.0));
        assert_eq!(pool.stats().allocations, 2);
    }

    #[test]
    fn blocks_are_keyed_by_device() {
        let pool = host_pool(PoolConfig::default());
        let device = device();
        let mut a = pool.acquire::<f32>(&[1000], false).unwrap();
        a.copy_from(&[1.0; 1000]).unwrap();
        a.sync_to(&device).unwrap();
        drop(a);
        assert_eq!(pool.stats(), stats(0, 2, 2, 0, 8192, 8192), "a host block and OpenCL memory");
        let mut b = pool.acquire::<f32>(&[1000], false).unwrap();
        b.copy_from(&[2.0; 1000]).unwrap();
        b.sync_to(&device).unwrap();
        assert_eq!(pool.stats(), stats(2, 2, 2, 8192, 0, 8192));
        b.mark_dirty_on(&device).unwrap();
        assert_eq!(b.to_vec().unwrap(), vec![2.0; 1000]);
    }
}

#[test]
fn a_refused_class_block_falls_back_to_the_exact_size_and_errors_name_the_request() {
    // The limit lets 4097 bytes through but not their class (5120).
    let limit = Arc::new(LimitingResource::new(lazybuf::DirectResource::shared(), 5000));
    let pool = MemoryPool::with_upstream(&Device::host(), PoolConfig::default(), limit.clone());
    let mut buf = pool.acquire::<u8>(&[4097], false).unwrap();
    buf.host_overwrite().unwrap().fill(1);
    assert_eq!(limit.held(), 4097, "the exact size was allocated");
    assert_eq!(pool.stats().oom_retries, 1);
    drop(buf);
    // Too large for the limit either way: the error names the bytes asked for.
    let mut big = pool.acquire::<u8>(&[6000], false).unwrap();
    let err = big.host_overwrite().unwrap_err();
    assert!(err.is_out_of_memory() && err.to_string().contains("could not allocate 6000 bytes"), "{err}");
}
