//! Pinned host memory: `is_pinned()` tells the truth, pinned buffers work on every backend,
//! and a pin the system refuses is an error, never a silent pageable block.
//!
//! The host device pins with `mlock`; the kernel's count of this process's locked memory
//! (`VmLck`) shows whether a block really is locked. The lock limit is tested in a child
//! process that runs under a small `RLIMIT_MEMLOCK` and without `CAP_IPC_LOCK` (which would
//! lift the limit), set up with util-linux's `prlimit` and `setpriv`.

use std::process::Command;

use lazybuf::{BufferOptions, BufferState, Device, Error, MemoryPool, PoolConfig, UnifiedBuffer};

/// A field of /proc/self/status.
fn status_field(name: &str) -> String {
    let status = std::fs::read_to_string("/proc/self/status").expect("Linux /proc");
    let line = status.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("no {name}"));
    line[name.len()..].trim().to_string()
}

/// Bytes this process has locked in RAM.
fn locked_bytes() -> u64 {
    let kib: u64 = status_field("VmLck:").trim_end_matches("kB").trim().parse().unwrap();
    kib * 1024
}

/// Whether this process may lock memory beyond its limit (`CAP_IPC_LOCK`, capability 14).
fn may_ignore_lock_limit() -> bool {
    let caps = u64::from_str_radix(&status_field("CapEff:"), 16).unwrap();
    caps & (1 << 14) != 0
}

/// A pinned buffer whose memory comes straight from the device (freed when it goes).
fn pinned_on(device: &Device, shape: &[usize]) -> UnifiedBuffer<u8> {
    let options = BufferOptions {
        device: Some(device.clone()),
        pinned: true,
        resource: Some(lazybuf::DirectResource::shared()),
        ..BufferOptions::default()
    };
    UnifiedBuffer::with_options(shape, options).unwrap()
}

/// The only test in this binary that locks memory in this process, so `VmLck` moves only
/// because of it.
#[test]
fn host_pinned_blocks_really_are_locked() {
    const N: usize = 1 << 20;
    let before = locked_bytes();
    let mut buf = pinned_on(&Device::host(), &[N]);
    assert!(!buf.is_pinned(), "nothing is allocated, so nothing is pinned yet");
    buf.host_overwrite().unwrap().fill(1);
    assert!(buf.is_pinned());
    assert!(locked_bytes() >= before + N as u64, "VmLck {} -> {}", before, locked_bytes());
    drop(buf);
    assert_eq!(locked_bytes(), before);

    let mut pageable = UnifiedBuffer::<u8>::on(&[N], &Device::host()).unwrap();
    pageable.host_overwrite().unwrap().fill(1);
    assert!(!pageable.is_pinned());
    assert_eq!(locked_bytes(), before);

    // Caching by default keeps a pinned block locked for the next pinned buffer, until trim.
    let options = BufferOptions { device: Some(Device::host()), pinned: true, ..BufferOptions::default() };
    let mut cached = UnifiedBuffer::<u8>::with_options(&[N], options.clone()).unwrap();
    cached.host_overwrite().unwrap().fill(2);
    let address = cached.host().unwrap().as_ptr();
    drop(cached);
    assert!(locked_bytes() >= before + N as u64, "the pool keeps the block locked");
    let mut again = UnifiedBuffer::<u8>::with_options(&[N], options).unwrap();
    assert_eq!(again.host_overwrite().unwrap().as_ptr(), address, "the next pinned buffer reuses it");
    assert!(again.is_pinned());
    drop(again);
    lazybuf::trim();
    assert_eq!(locked_bytes(), before);
}

#[cfg(feature = "opencl")]
#[test]
fn opencl_pinned_buffers_are_mapped_runtime_memory_and_work() {
    let device = lazybuf::devices()
        .into_iter()
        .find(|d| d.backend_kind() == lazybuf::BackendKind::OPENCL)
        .expect("this test needs an OpenCL device (CI installs Debian's pocl-opencl-icd)");
    // Below the alias threshold a sync copies; above it the device aliases the host block.
    for n in [4096, 4 << 20] {
        let mut buf = pinned_on(&device, &[n]);
        assert!(buf.host_overwrite().unwrap().iter().all(|&b| b == 0), "a new pinned block reads as zeros");
        assert!(buf.is_pinned());
        let data: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
        buf.copy_from(&data).unwrap();
        buf.sync_to_device().unwrap();
        buf.mark_device_dirty().unwrap();
        assert_eq!(buf.to_vec().unwrap(), data);
        buf.device_overwrite().unwrap();
        buf.fill(9).unwrap();
        assert!(buf.to_vec().unwrap().iter().all(|&b| b == 9));
        assert!(buf.is_pinned());
    }
    let pool = MemoryPool::new(&device, PoolConfig::default());
    let mut a = pool.acquire::<u8>(&[4096], true).unwrap();
    a.host_overwrite().unwrap();
    assert!(a.is_pinned());
    drop(a);
    let mut b = pool.acquire::<u8>(&[4096], false).unwrap();
    b.host_overwrite().unwrap();
    assert!(!b.is_pinned());
    assert_eq!(pool.stats().hits, 0, "a pageable request never gets the cached pinned block");
}

const CHILD: &str = "LAZYBUF_TEST_LOCK_LIMIT_CHILD";
const LIMIT: usize = 256 << 10;

#[test]
fn pinning_beyond_the_lock_limit_is_an_error_never_a_fallback() {
    if std::env::var_os(CHILD).is_some() {
        return beyond_the_lock_limit();
    }
    let limit = format!("--memlock={LIMIT}:{LIMIT}");
    let mut command = if may_ignore_lock_limit() {
        let mut c = Command::new("setpriv");
        c.args(["--bounding-set=-ipc_lock", "--inh-caps=-ipc_lock", "prlimit", &limit]);
        c
    } else {
        let mut c = Command::new("prlimit");
        c.arg(&limit);
        c
    };
    let name = "pinning_beyond_the_lock_limit_is_an_error_never_a_fallback";
    command.arg(std::env::current_exe().unwrap()).args(["--exact", name, "--nocapture", "--test-threads=1"]);
    let out = command.env(CHILD, "1").output().expect("util-linux's prlimit and setpriv run this test");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the child failed:\n{text}");
    assert!(text.contains("lock-limit checks passed"), "the child did not run the checks:\n{text}");
}

/// Runs in the child, under a 256 KiB lock limit it cannot lift.
fn beyond_the_lock_limit() {
    assert!(!may_ignore_lock_limit(), "the child must run without CAP_IPC_LOCK");
    let host = Device::host();

    // Directly: a clear error, the buffer unchanged, and pageable memory only when asked for.
    let mut buf = pinned_on(&host, &[1 << 20]);
    let err = buf.host_overwrite().unwrap_err();
    assert!(matches!(err, Error::PinningFailed { requested, .. } if requested == 1 << 20), "{err}");
    assert!(err.to_string().contains("mlock"), "{err}");
    assert_eq!(buf.state(), BufferState::Uninitialized);
    assert!(!buf.is_pinned());
    let mut pageable = UnifiedBuffer::<u8>::on(&[1 << 20], &host).unwrap();
    pageable.host_overwrite().unwrap();
    assert!(!pageable.is_pinned());

    // Through a pool: cached pinned blocks hold locked memory, so a refused pin trims and
    // retries once.
    let pool = MemoryPool::new(&host, PoolConfig::default());
    let mut a = pool.acquire::<u8>(&[128 << 10], true).unwrap();
    a.host_overwrite().unwrap();
    assert!(a.is_pinned());
    drop(a); // cached, still locked: 128 KiB
    let mut b = pool.acquire::<u8>(&[192 << 10], true).unwrap();
    b.host_overwrite().unwrap(); // 128 + 192 > 256: refused, trimmed, retried
    assert!(b.is_pinned());
    let s = pool.stats();
    assert_eq!((s.oom_retries, s.bytes_cached, s.bytes_in_use), (1, 0, 192 << 10));
    let mut c = pool.acquire::<u8>(&[128 << 10], true).unwrap();
    let err = c.host_overwrite().unwrap_err(); // 192 + 128 > 256 with nothing to trim
    assert!(matches!(err, Error::PinningFailed { .. }), "{err}");
    assert_eq!(c.state(), BufferState::Uninitialized);
    assert!(!c.is_pinned());
    assert_eq!(pool.stats().oom_retries, 2);
    println!("lock-limit checks passed");
}
