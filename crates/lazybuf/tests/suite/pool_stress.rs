//! Many threads acquiring and releasing through one pool: no block is ever handed to two live
//! buffers at once, none is lost, and the counters balance at the end.
//!
//! Each live buffer writes its own id over all of its memory, yields, and checks the id is
//! still there before it goes back; a registry of live host addresses catches any block
//! handed out twice. A limiting adaptor under the pool counts what the upstream really holds,
//! which must equal the pool's cached bytes once every buffer is gone, and zero after trim.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use lazybuf::{Device, DirectResource, LimitingResource, MemoryPool, PoolConfig, UnifiedBuffer};

const THREADS: u64 = 8;
const ROUNDS: u64 = 400;
/// Element counts (u64) spanning several size classes, with neighbours that share a class.
const SIZES: [usize; 6] = [1, 30, 32, 500, 512, 9000];

/// A tiny deterministic generator (xorshift), one per thread.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Takes a buffer's memory, claims its address, and stamps `id` over it.
fn claim(buf: &mut UnifiedBuffer<u64>, id: u64, live: &Mutex<HashSet<usize>>) -> usize {
    let host = buf.host_overwrite().unwrap();
    host.fill(id);
    let addr = host.as_ptr() as usize;
    assert!(live.lock().unwrap().insert(addr), "block {addr:#x} handed to two live buffers");
    addr
}

/// Checks the stamp survived, then gives up the address.
fn unclaim(buf: &mut UnifiedBuffer<u64>, id: u64, addr: usize, live: &Mutex<HashSet<usize>>) {
    assert!(buf.host().unwrap().iter().all(|&x| x == id), "buffer {id} was overwritten by another");
    assert!(live.lock().unwrap().remove(&addr));
}

fn stress(config: PoolConfig) {
    let upstream = Arc::new(LimitingResource::new(DirectResource::shared(), u64::MAX));
    let pool = MemoryPool::with_upstream(&Device::host(), config, upstream.clone());
    let live = Mutex::new(HashSet::new());
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let (pool, live) = (&pool, &live);
            scope.spawn(move || {
                let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (t + 1));
                for round in 0..ROUNDS {
                    let id = (t << 32) | round;
                    let size = SIZES[(rng.next() % SIZES.len() as u64) as usize];
                    let pinned = rng.next().is_multiple_of(8);
                    let mut a = pool.acquire::<u64>(&[size], pinned).unwrap();
                    let addr_a = claim(&mut a, id, live);
                    // Sometimes hold a second buffer at the same time.
                    let second = rng.next().is_multiple_of(3).then(|| {
                        let mut b = pool.acquire::<u64>(&[size], false).unwrap();
                        let addr = claim(&mut b, id | 1 << 31, live);
                        (b, addr)
                    });
                    std::thread::yield_now();
                    unclaim(&mut a, id, addr_a, live);
                    if round % 2 == 0 {
                        pool.release(a).unwrap()
                    } else {
                        drop(a)
                    }
                    if let Some((mut b, addr)) = second {
                        unclaim(&mut b, id | 1 << 31, addr, live);
                        pool.release(b).unwrap();
                    }
                }
            });
        }
    });
    let s = pool.stats();
    assert!(live.lock().unwrap().is_empty());
    assert_eq!(s.bytes_in_use, 0, "{s:?}");
    assert!(s.bytes_cached <= config.max_cached_bytes, "{s:?}");
    assert_eq!(s.misses, s.allocations, "no allocation failed: {s:?}");
    assert!(s.hits + s.misses >= THREADS * ROUNDS, "{s:?}");
    assert!(s.hits > 0, "{s:?}");
    assert_eq!(upstream.held(), s.bytes_cached, "what the upstream holds is exactly what is cached");
    assert_eq!(pool.trim(), s.bytes_cached);
    assert_eq!(upstream.held(), 0, "nothing was lost");
}

#[test]
fn many_threads_never_share_or_lose_a_block() {
    stress(PoolConfig::default());
}

#[test]
fn many_threads_under_a_small_cap() {
    // Releases beyond 64 KiB go upstream while other threads allocate.
    stress(PoolConfig { max_cached_bytes: 64 << 10, zero_reused: false });
}

#[test]
fn many_threads_with_zeroing() {
    stress(PoolConfig { zero_reused: true, ..PoolConfig::default() });
}
