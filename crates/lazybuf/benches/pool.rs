//! The pool against fresh allocations, and pinned against pageable transfers, in one run.
//!
//! Run: `cargo bench -p lazybuf --bench pool` (about two minutes). Results and ratios are in
//! docs/BENCHMARKS.md ("Memory pool and pinned memory").
//!
//! - `pool_hit`: the pool's own cost on a hit: `resource` is a block taken from and given back
//!   to the pool's resource; `buffer_untouched` is acquire + release of a buffer that is never
//!   used (lazy: it takes no memory); `buffer_take` is acquire + the first access (which takes
//!   the cached block, without touching it) + release. The OpenCL baseline is
//!   `clCreateBuffer` + `clReleaseMemObject`, which PoCL makes cheap by allocating lazily.
//! - `pool_<backend>/*`: a whole cycle: acquire, first use (a fill, so that fresh memory pays
//!   its page faults), release; against a fresh buffer doing the same and the raw runtime
//!   doing the same (`malloc`+`memset`+`free`; `clCreateBuffer`+`clEnqueueFillBuffer`+
//!   `clReleaseMemObject`). A CUDA group runs when a CUDA device is present.
//! - `pinned_<backend>/*`: syncs through pinned and pageable host blocks (all memory touched
//!   beforehand), against the raw runtime's copy.

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkGroup, Criterion, criterion_group, criterion_main, measurement::WallTime};
use lazybuf::{BackendKind, BufferOptions, Device, MemoryPool, PoolConfig, Ticket, UnifiedBuffer};

const SIZES: [(usize, &str); 3] = [(4 << 10, "4KiB"), (1 << 20, "1MiB"), (16 << 20, "16MiB")];

fn first(kind: BackendKind) -> Option<Device> {
    lazybuf::devices().into_iter().find(|d| d.backend_kind() == kind)
}

fn group<'c>(c: &'c mut Criterion, name: &str) -> BenchmarkGroup<'c, WallTime> {
    let mut g = c.benchmark_group(name);
    g.sample_size(10).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(1));
    g
}

fn pool_hit(c: &mut Criterion) {
    let host = Device::host();
    let pool = MemoryPool::new(&host, PoolConfig::default());
    let resource = pool.resource();
    let mut g = group(c, "pool_hit");
    g.sample_size(30);
    drop(resource.allocate_host(&host, 4096, false).unwrap()); // a miss fills the cache
    g.bench_function("host/resource", |b| {
        b.iter(|| {
            let block = resource.allocate_host(&host, black_box(4096), false).unwrap();
            resource.deallocate_host(&host, block, Ticket::done());
        })
    });
    g.bench_function("host/buffer_untouched", |b| {
        b.iter(|| pool.release(pool.acquire::<f32>(black_box(&[1024]), false).unwrap()).unwrap())
    });
    g.bench_function("host/buffer_take", |b| {
        b.iter(|| {
            let mut buf = pool.acquire::<f32>(black_box(&[1024]), false).unwrap();
            black_box(buf.host_overwrite().unwrap().as_ptr());
            pool.release(buf).unwrap();
        })
    });
    #[cfg(feature = "opencl")]
    if let Some(device) = first(BackendKind::OPENCL) {
        let pool = MemoryPool::new(&device, PoolConfig::default());
        let resource = pool.resource();
        let stream = device.stream();
        let first = resource.allocate_device(&device, 4096, &stream).unwrap();
        resource.deallocate_device(&device, first, &stream, Ticket::done());
        g.bench_function("opencl/resource", |b| {
            b.iter(|| {
                let memory = resource.allocate_device(&device, black_box(4096), &stream).unwrap();
                resource.deallocate_device(&device, memory, &stream, Ticket::done());
            })
        });
        g.bench_function("opencl/buffer_take", |b| {
            b.iter(|| {
                let mut buf = pool.acquire::<f32>(black_box(&[1024]), false).unwrap();
                buf.device_overwrite().unwrap();
                pool.release(buf).unwrap();
            })
        });
        let cl = raw_cl::Cl::of(&device);
        g.bench_function("opencl/raw_create_release", |b| b.iter(|| cl.release(cl.create(black_box(4096)))));
    }
    g.finish();
}

fn pool_host(c: &mut Criterion) {
    let host = Device::host();
    let pool = MemoryPool::new(&host, PoolConfig::default());
    let mut g = group(c, "pool_host");
    for (n, name) in SIZES {
        g.bench_function(format!("raw_malloc_fill_free/{name}"), |b| {
            b.iter(|| {
                let mut v = Vec::<u8>::with_capacity(n);
                v.resize(n, 1);
                black_box(v.as_ptr());
            })
        });
        g.bench_function(format!("fresh_buffer/{name}"), |b| {
            b.iter(|| {
                let mut buf = UnifiedBuffer::<u8>::on(&[n], &host).unwrap();
                buf.host_overwrite().unwrap().fill(1);
                black_box(buf.host().unwrap().as_ptr());
            })
        });
        g.bench_function(format!("pool_hit/{name}"), |b| {
            b.iter(|| {
                let mut buf = pool.acquire::<u8>(&[n], false).unwrap();
                buf.host_overwrite().unwrap().fill(1);
                black_box(buf.host().unwrap().as_ptr());
                pool.release(buf).unwrap();
            })
        });
    }
    g.finish();
}

/// Acquire (or create), fill on the device, release: fresh against pooled, on any device.
fn device_cycle(g: &mut BenchmarkGroup<'_, WallTime>, device: &Device) {
    let pool = MemoryPool::new(device, PoolConfig::default());
    for (n, name) in SIZES {
        g.bench_function(format!("fresh_buffer/{name}"), |b| {
            b.iter(|| {
                let mut buf = UnifiedBuffer::<u8>::on(&[n], device).unwrap();
                buf.device_overwrite().unwrap();
                buf.fill(1).unwrap();
            })
        });
        g.bench_function(format!("pool_hit/{name}"), |b| {
            b.iter(|| {
                let mut buf = pool.acquire::<u8>(&[n], false).unwrap();
                buf.device_overwrite().unwrap();
                buf.fill(1).unwrap();
                pool.release(buf).unwrap();
            })
        });
    }
}

fn pool_devices(c: &mut Criterion) {
    #[cfg(feature = "opencl")]
    match first(BackendKind::OPENCL) {
        Some(device) => {
            let mut g = group(c, "pool_opencl");
            let cl = raw_cl::Cl::of(&device);
            for (n, name) in SIZES {
                g.bench_function(format!("raw_create_fill_release/{name}"), |b| {
                    b.iter(|| {
                        let mem = cl.create(n);
                        cl.fill(mem, n);
                        cl.release(mem);
                    })
                });
            }
            device_cycle(&mut g, &device);
            g.finish();
        }
        None => println!("pool_opencl: skipped, no OpenCL device"),
    }
    match first(BackendKind::CUDA) {
        Some(device) => {
            let mut g = group(c, "pool_cuda");
            device_cycle(&mut g, &device);
            g.finish();
        }
        None => println!("pool_cuda: skipped, no CUDA device"),
    }
}

fn buffer(device: &Device, n: usize, pinned: bool) -> Option<UnifiedBuffer<u8>> {
    let options = BufferOptions { device: Some(device.clone()), pinned, ..BufferOptions::default() };
    let mut buf = UnifiedBuffer::<u8>::with_options(&[n], options).unwrap();
    match buf.host_overwrite() {
        Ok(host) => host.fill(1),
        Err(err) => {
            println!("pinned: skipped {n} bytes on {device}: {err}");
            return None;
        }
    }
    assert_eq!(buf.is_pinned(), pinned);
    buf.sync_to_device().unwrap(); // touch the device side too
    Some(buf)
}

fn pinned(c: &mut Criterion) {
    let host = Device::host();
    let mut g = group(c, "pinned_host");
    // Same-size copies differ by little: more samples against the noise of a shared machine.
    g.sample_size(20).measurement_time(Duration::from_secs(2));
    let n = 4 << 20;
    let src = vec![7u8; n];
    let mut dst = vec![1u8; n];
    g.bench_function("raw_memcpy/4MiB", |b| b.iter(|| dst.copy_from_slice(black_box(&src))));
    for (pinned, name) in [(false, "pageable"), (true, "pinned")] {
        if let Some(mut buf) = buffer(&host, n, pinned) {
            g.bench_function(format!("copy_from/{name}/4MiB"), |b| {
                b.iter(|| buf.copy_from(black_box(&src)).unwrap())
            });
        }
    }
    g.finish();

    #[cfg(feature = "opencl")]
    if let Some(device) = first(BackendKind::OPENCL) {
        let mut g = group(c, "pinned_opencl");
        g.sample_size(20).measurement_time(Duration::from_secs(2));
        let cl = raw_cl::Cl::of(&device);
        // 256 KiB copies; 4 MiB is above the size where a CPU device aliases host memory.
        for (n, size) in [(256 << 10, "256KiB"), (4 << 20, "4MiB")] {
            let mem = cl.create(n);
            cl.fill(mem, n);
            let mut host = vec![1u8; n];
            g.bench_function(format!("raw_write/{size}"), |b| b.iter(|| cl.write(mem, black_box(&host))));
            g.bench_function(format!("raw_read/{size}"), |b| b.iter(|| cl.read(mem, black_box(&mut host))));
            cl.release(mem);
            for (pinned, name) in [(false, "pageable"), (true, "pinned")] {
                let Some(mut buf) = buffer(&device, n, pinned) else { continue };
                g.bench_function(format!("upload/{name}/{size}"), |b| {
                    b.iter(|| {
                        buf.mark_host_dirty().unwrap();
                        buf.sync_to_device().unwrap();
                    })
                });
                g.bench_function(format!("download/{name}/{size}"), |b| {
                    b.iter(|| {
                        buf.mark_device_dirty().unwrap();
                        buf.sync_to_host().unwrap();
                    })
                });
            }
        }
        g.finish();
    }
}

/// The raw OpenCL runtime on lazybuf's own context and queue: the baseline.
#[cfg(feature = "opencl")]
mod raw_cl {
    use std::ptr;

    use cl3::types::{CL_BLOCKING, cl_command_queue, cl_context, cl_event, cl_mem};
    use lazybuf::Device;
    use lazybuf::backend::RawDevice;

    pub struct Cl {
        context: cl_context,
        queue: cl_command_queue,
    }

    fn done(event: Result<cl_event, i32>) {
        let event = event.expect("an OpenCL enqueue");
        cl3::event::wait_for_events(&[event]).expect("clWaitForEvents");
        // SAFETY: the event returned by the enqueue above, released once.
        unsafe { cl3::event::release_event(event) }.expect("clReleaseEvent");
    }

    impl Cl {
        pub fn of(device: &Device) -> Cl {
            // SAFETY: the handles are only used while `device` (held by the caller) lives.
            match unsafe { device.raw() } {
                RawDevice::OpenCl { context, queue, .. } => Cl { context, queue },
                other => panic!("not an OpenCL device: {other:?}"),
            }
        }

        pub fn create(&self, n: usize) -> cl_mem {
            // SAFETY: a live context, no host pointer.
            unsafe {
                cl3::memory::create_buffer(self.context, cl3::memory::CL_MEM_READ_WRITE, n, ptr::null_mut())
            }
            .expect("clCreateBuffer")
        }

        pub fn fill(&self, mem: cl_mem, n: usize) {
            let pattern = 1u8;
            // SAFETY: mem holds n bytes; the pattern is copied at enqueue time.
            done(unsafe {
                cl3::command_queue::enqueue_fill_buffer(
                    self.queue,
                    mem,
                    (&raw const pattern).cast(),
                    1,
                    0,
                    n,
                    0,
                    ptr::null(),
                )
            });
        }

        pub fn write(&self, mem: cl_mem, src: &[u8]) {
            // SAFETY: mem holds src.len() bytes; the write is blocking.
            done(unsafe {
                cl3::command_queue::enqueue_write_buffer(
                    self.queue,
                    mem,
                    CL_BLOCKING,
                    0,
                    src.len(),
                    src.as_ptr().cast(),
                    0,
                    ptr::null(),
                )
            });
        }

        pub fn read(&self, mem: cl_mem, dst: &mut [u8]) {
            // SAFETY: mem holds dst.len() bytes; the read is blocking.
            done(unsafe {
                cl3::command_queue::enqueue_read_buffer(
                    self.queue,
                    mem,
                    CL_BLOCKING,
                    0,
                    dst.len(),
                    dst.as_mut_ptr().cast(),
                    0,
                    ptr::null(),
                )
            });
        }

        pub fn release(&self, mem: cl_mem) {
            // SAFETY: a buffer made by `create`, released once.
            unsafe { cl3::memory::release_mem_object(mem) }.expect("clReleaseMemObject");
        }
    }
}

criterion_group!(benches, pool_hit, pool_host, pool_devices, pinned);
criterion_main!(benches);
