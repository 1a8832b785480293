//! 03: the memory pool and memory resources. A pool hands out buffers by shape and reuses
//! their memory; resources are RMM-style policies, each wrapping an upstream it owns.
//!
//! Run: `cargo run --example 03_pool_and_resources`.

use std::sync::Arc;

use lazybuf::{
    BufferOptions, BufferState, DirectResource, LimitingResource, MemoryPool, MemoryResource, Result,
    StatisticsResource, UnifiedBuffer,
};

fn main() -> Result<()> {
    let device = lazybuf::default_device()?;

    // The pool: acquire, use, release; the second acquire reuses the first one's memory.
    let pool = MemoryPool::for_device(&device);
    for round in 0..2 {
        let mut buf = pool.acquire::<f64>(&[1024], false)?;
        assert_eq!(buf.state(), BufferState::Uninitialized, "a reused buffer starts empty");
        buf.host_overwrite()?.fill(round as f64);
        buf.sync_to_device()?;
        pool.release(buf)?;
    }
    let stats = pool.stats();
    println!("pool: {} hit(s), {} miss(es), {} bytes cached", stats.hits, stats.misses, stats.bytes_cached);

    // Resources: statistics over a 1 MiB limit over the runtimes themselves.
    let limit = Arc::new(LimitingResource::new(DirectResource::shared(), 1 << 20));
    let counted = Arc::new(StatisticsResource::new(limit.clone()));
    let resource: Arc<dyn MemoryResource> = counted.clone();
    let options =
        BufferOptions { device: Some(device.clone()), resource: Some(resource), ..Default::default() };
    let mut small = UnifiedBuffer::<u8>::with_options(&[4096], options.clone())?;
    small.host_overwrite()?.fill(1);
    small.sync_to_device()?;
    println!("statistics: {:?}; the limit holds {} bytes", counted.statistics(), limit.held());

    // Beyond the limit: an error, and nothing changes.
    let mut big = UnifiedBuffer::<u8>::with_options(&[2 << 20], options)?;
    let refused = big.host_overwrite().map(|_| ()).expect_err("2 MiB is over the 1 MiB limit");
    assert!(refused.is_out_of_memory());
    assert_eq!(big.state(), BufferState::Uninitialized);
    println!("refused as expected: {refused}");
    Ok(())
}
