//! Shared helpers of the CUDA test files: finding CUDA devices (or printing a visible skip),
//! telling the driver-API test double from a real GPU, and reaching the double's test hooks.
//!
//! Run these tests with the double through `scripts/test-cuda-double.sh`, which also sets
//! `LAZYBUF_REQUIRE_CUDA=1` so that a double that failed to load fails the run instead of
//! skipping it.

#![allow(dead_code)]

use std::ffi::{CStr, c_void};

use lazybuf::{BackendKind, Device};

/// The name prefix of the test double's devices.
pub const DOUBLE_NAME: &str = "lazybuf CUDA test double";

/// The CUDA devices, or `None` after printing why the test is skipped (a panic instead when
/// `LAZYBUF_REQUIRE_CUDA` is set).
pub fn cuda_devices(test: &str) -> Option<Vec<Device>> {
    let found: Vec<Device> =
        lazybuf::devices().into_iter().filter(|d| d.backend_kind() == BackendKind::CUDA).collect();
    if !found.is_empty() {
        return Some(found);
    }
    let why = lazybuf::backend_status()
        .into_iter()
        .find(|s| s.backend == BackendKind::CUDA)
        .and_then(|s| s.devices.err())
        .unwrap_or_else(|| "no CUDA device".into());
    if std::env::var_os("LAZYBUF_REQUIRE_CUDA").is_some() {
        panic!("{test}: LAZYBUF_REQUIRE_CUDA is set but CUDA is unavailable: {why}");
    }
    eprintln!(
        "SKIPPED {test}: no CUDA device ({why}); run with LD_LIBRARY_PATH=target/cuda-double \
         (scripts/test-cuda-double.sh) or on a GPU"
    );
    None
}

/// Whether `device` is the test double rather than a GPU.
pub fn is_double(device: &Device) -> bool {
    device.name().starts_with(DOUBLE_NAME)
}

/// The CUDA devices if they are the test double, else `None` after printing a skip.
pub fn double_devices(test: &str) -> Option<Vec<Device>> {
    let devices = cuda_devices(test)?;
    if devices.iter().all(is_double) {
        return Some(devices);
    }
    eprintln!("SKIPPED {test}: needs the CUDA test double's hooks; this machine has a real GPU");
    None
}

/// Looks `name` up in the libcuda this process loaded (the double, for its test hooks).
fn double_symbol(name: &CStr) -> *mut c_void {
    for lib in [c"libcuda.so", c"libcuda.so.1"] {
        // SAFETY: RTLD_NOLOAD only returns a handle to an already loaded library (it loads
        // nothing); the handle's reference is dropped again with dlclose.
        let handle = unsafe { libc::dlopen(lib.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
        if handle.is_null() {
            continue;
        }
        // SAFETY: handle is a live library handle; dlsym only looks the name up.
        let symbol = unsafe { libc::dlsym(handle, name.as_ptr()) };
        // SAFETY: drops the reference taken above; cudarc's own handle keeps it loaded.
        unsafe { libc::dlclose(handle) };
        if !symbol.is_null() {
            return symbol;
        }
    }
    panic!("{name:?} not found: is the CUDA test double loaded (LD_LIBRARY_PATH=target/cuda-double)?")
}

fn hook_set(name: &CStr, n: i64) {
    let symbol = double_symbol(name);
    // SAFETY: the double defines this hook as `void hook(long long)`.
    let hook: unsafe extern "C" fn(i64) = unsafe { std::mem::transmute(symbol) };
    // SAFETY: the hook only updates the double's counters under its lock.
    unsafe { hook(n) }
}

fn hook_get(name: &CStr) -> i64 {
    let symbol = double_symbol(name);
    // SAFETY: the double defines this hook as `long long hook(void)`.
    let hook: unsafe extern "C" fn() -> i64 = unsafe { std::mem::transmute(symbol) };
    // SAFETY: the hook only reads the double's counters under its lock.
    unsafe { hook() }
}

/// Makes the double's `n`-th allocation from now fail (0 disarms).
pub fn fail_allocation(n: i64) {
    hook_set(c"lazybuf_cuda_double_fail_allocation", n);
}

/// Makes the double's `n`-th `cuMemFree` from now report a failure (the memory is freed).
pub fn fail_free(n: i64) {
    hook_set(c"lazybuf_cuda_double_fail_free", n);
}

/// Makes the double's `n`-th device write from now fail when its stream runs it, after
/// scribbling: the failure shows at the next event of that stream (0 disarms).
pub fn fail_copy(n: i64) {
    hook_set(c"lazybuf_cuda_double_fail_copy", n);
}

/// As [`fail_copy`], but the call that enqueues the write fails (0 disarms).
pub fn fail_copy_now(n: i64) {
    hook_set(c"lazybuf_cuda_double_fail_copy_now", n);
}

/// Stops (`true`) or restarts every stream of the double: nothing enqueued runs meanwhile.
pub fn hold(on: bool) {
    hook_set(c"lazybuf_cuda_double_hold", i64::from(on));
}

/// Host ranges registered with the double and not yet unregistered.
pub fn registrations() -> i64 {
    hook_get(c"lazybuf_cuda_double_registrations")
}

/// Device and pinned host allocations the double holds.
pub fn live_allocations() -> i64 {
    hook_get(c"lazybuf_cuda_double_live_allocations")
}

/// Device writes (copies and memsets) the double has done.
pub fn copies() -> i64 {
    hook_get(c"lazybuf_cuda_double_copies")
}

/// Host-device copies whose host side was pinned memory.
pub fn pinned_copies() -> i64 {
    hook_get(c"lazybuf_cuda_double_pinned_copies")
}

/// Where the double last prefetched the managed memory at `ptr` to (once its stream got
/// there): a device ordinal, -1 the host, -2 never; -3 if `ptr` is not managed memory.
pub fn prefetch_location(ptr: u64) -> i64 {
    let symbol = double_symbol(c"lazybuf_cuda_double_prefetch_location");
    // SAFETY: the double defines this hook as `long long hook(CUdeviceptr)`.
    let hook: unsafe extern "C" fn(u64) -> i64 = unsafe { std::mem::transmute(symbol) };
    // SAFETY: the hook only reads the double's allocation list under its lock.
    unsafe { hook(ptr) }
}

/// Bytes 0, 1, 2, ... 250, 0, ... (a pattern no fill produces), as `n` bytes.
pub fn ramp(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8).collect()
}

/// `cuMemsetD32Async(ptr, value, count, stream)` on the loaded driver (the double or a GPU's),
/// as a caller's own kernel would write a buffer's device copy.
pub fn memset_d32_async(ptr: u64, value: u32, count: usize, stream: *mut c_void) {
    let symbol = driver_symbol(c"cuMemsetD32Async");
    // SAFETY: the driver defines it as CUresult cuMemsetD32Async(CUdeviceptr, unsigned, size_t,
    // CUstream); callers pass a live allocation of at least count words and a live stream.
    let memset: unsafe extern "C" fn(u64, u32, usize, *mut c_void) -> i32 =
        unsafe { std::mem::transmute(symbol) };
    // SAFETY: see above; the caller's context must be current, which lazybuf leaves as it was:
    // the call is made with the device's context made current by `with_context`.
    assert_eq!(unsafe { memset(ptr, value, count, stream) }, 0, "cuMemsetD32Async failed");
}

/// Runs `f` with `context` current on this thread (driver calls act on the current context).
pub fn with_context<R>(context: *mut c_void, f: impl FnOnce() -> R) -> R {
    let set = driver_symbol(c"cuCtxSetCurrent");
    // SAFETY: the driver defines it as CUresult cuCtxSetCurrent(CUcontext).
    let set: unsafe extern "C" fn(*mut c_void) -> i32 = unsafe { std::mem::transmute(set) };
    // SAFETY: context is a live primary context of an opened device.
    assert_eq!(unsafe { set(context) }, 0);
    let result = f();
    // SAFETY: unbinding (null) is always allowed.
    unsafe { set(std::ptr::null_mut()) };
    result
}

/// A driver entry point from the loaded libcuda.
fn driver_symbol(name: &CStr) -> *mut c_void {
    double_symbol(name)
}

/// Holds back the work queued on a stream until dropped, so a test can see for certain what
/// is still in flight. On the test double it is the double's `hold` hook (every stream waits);
/// on a GPU it is a real kernel on `stream` that spins until a flag in mapped pinned host
/// memory is set, which the drop does (the kernel gives up by itself after about 20 s, so a
/// failing test cannot hang the GPU).
pub struct Gate {
    gpu: Option<GpuGate>,
}

struct GpuGate {
    context: *mut c_void,
    /// 4 bytes of pinned host memory mapped into the device's address space.
    flag: *mut u32,
    module: *mut c_void,
}

/// The gate kernel, in PTX the driver compiles for whatever GPU it runs on: spins until
/// `*flag != 0` or `max_cycles` clock cycles have passed.
const GATE_PTX: &CStr = c"
.version 7.0
.target sm_70
.address_size 64
.visible .entry lazybuf_test_gate(.param .u64 flag, .param .u64 max_cycles)
{
    .reg .pred %p<3>;
    .reg .b32 %r<2>;
    .reg .b64 %rd<6>;
    ld.param.u64 %rd1, [flag];
    ld.param.u64 %rd2, [max_cycles];
    mov.u64 %rd3, %clock64;
WAIT:
    ld.volatile.u32 %r1, [%rd1];
    setp.ne.u32 %p1, %r1, 0;
    @%p1 bra OPEN;
    mov.u64 %rd4, %clock64;
    sub.s64 %rd5, %rd4, %rd3;
    setp.lt.s64 %p2, %rd5, %rd2;
    @%p2 bra WAIT;
OPEN:
    ret;
}
";

/// `CUresult cuLaunchKernel(CUfunction, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY,
/// blockDimZ, sharedMemBytes, CUstream, void **kernelParams, void **extra)`.
type LaunchKernel = unsafe extern "C" fn(
    *mut c_void,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    *mut c_void,
    *mut *mut c_void,
    *mut *mut c_void,
) -> i32;

/// Calls a driver entry point `name` of type `$ty` with `args`, asserting success.
macro_rules! driver {
    ($name:literal as $ty:ty, $($arg:expr),*) => {{
        // SAFETY: (test) `$ty` is the driver's own signature for `$name`; the arguments are
        // live handles and pointers of the right sizes, as each call site says.
        let f: $ty = unsafe { std::mem::transmute(driver_symbol($name)) };
        // SAFETY: (test) as above: the call site's arguments match the signature.
        let status = unsafe { f($($arg),*) };
        assert_eq!(status, 0, "{:?} failed", $name);
    }};
}

impl Gate {
    /// Closes the gate on `stream` of `device` (a GPU), or on every stream (the double).
    pub fn close(device: &Device, stream: *mut c_void) -> Gate {
        if is_double(device) {
            hold(true);
            return Gate { gpu: None };
        }
        let context = cuda_context(device);
        with_context(context, || {
            let mut flag: *mut c_void = std::ptr::null_mut();
            // PORTABLE | DEVICEMAP: with unified addressing the host address is the device's.
            driver!(
                c"cuMemHostAlloc" as unsafe extern "C" fn(*mut *mut c_void, usize, u32) -> i32,
                &mut flag,
                4,
                0x03
            );
            // SAFETY: flag points at 4 writable bytes just allocated.
            unsafe { std::ptr::write_volatile(flag.cast::<u32>(), 0) };
            let mut module: *mut c_void = std::ptr::null_mut();
            driver!(
                c"cuModuleLoadData" as unsafe extern "C" fn(*mut *mut c_void, *const c_void) -> i32,
                &mut module,
                GATE_PTX.as_ptr().cast()
            );
            let mut function: *mut c_void = std::ptr::null_mut();
            driver!(
                c"cuModuleGetFunction"
                    as unsafe extern "C" fn(*mut *mut c_void, *mut c_void, *const std::ffi::c_char) -> i32,
                &mut function,
                module,
                c"lazybuf_test_gate".as_ptr()
            );
            let mut flag_arg = flag as u64;
            let mut max_cycles: u64 = 40_000_000_000; // about 20 s at 2 GHz
            let mut params = [(&raw mut flag_arg).cast::<c_void>(), (&raw mut max_cycles).cast::<c_void>()];
            // One thread; the driver copies the parameters at launch.
            driver!(
                c"cuLaunchKernel" as LaunchKernel,
                function,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                stream,
                params.as_mut_ptr(),
                std::ptr::null_mut()
            );
            Gate { gpu: Some(GpuGate { context, flag: flag.cast(), module }) }
        })
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        let Some(gate) = self.gpu.take() else {
            hold(false);
            return;
        };
        // SAFETY: the flag is live pinned memory until it is freed below.
        unsafe { std::ptr::write_volatile(gate.flag, 1) };
        with_context(gate.context, || {
            // The kernel reads the flag until it sees it set: wait for everything queued so
            // far, then free the flag and unload the module.
            driver!(c"cuCtxSynchronize" as unsafe extern "C" fn() -> i32,);
            driver!(c"cuMemFreeHost" as unsafe extern "C" fn(*mut c_void) -> i32, gate.flag.cast());
            driver!(c"cuModuleUnload" as unsafe extern "C" fn(*mut c_void) -> i32, gate.module);
        });
    }
}

/// The `CUcontext` lazybuf uses for `device`.
pub fn cuda_context(device: &Device) -> *mut c_void {
    // SAFETY: (test) the raw handles are only used while the device is alive.
    match unsafe { device.raw() } {
        lazybuf::backend::RawDevice::Cuda { context, .. } => context,
        other => panic!("{device} is not a CUDA device: {other:?}"),
    }
}

/// A gate handed to another thread, which opens it after a delay.
struct SendGate(Gate);

// SAFETY: (test) the gate's handles are a context, pinned host memory and a module, all of
// which the driver lets any thread use.
unsafe impl Send for SendGate {}

impl Gate {
    /// Opens the gate from another thread after `ms` milliseconds, so the calling thread may
    /// block on the held work meanwhile (the driver's pageable copies can).
    pub fn open_after(self, ms: u64) -> std::thread::JoinHandle<()> {
        let gate = SendGate(self);
        std::thread::spawn(move || {
            let gate = gate;
            std::thread::sleep(std::time::Duration::from_millis(ms));
            drop(gate.0);
        })
    }
}

/// A caller's kernel writing `value` to `count` words at `ptr` on `stream`, done before this
/// returns: `cuMemsetD32Async` and a stream synchronize, with `device`'s context current.
pub fn kernel_fill_u32(device: &Device, ptr: u64, count: usize, value: u32, stream: *mut c_void) {
    with_context(cuda_context(device), || {
        memset_d32_async(ptr, value, count, stream);
        driver!(c"cuStreamSynchronize" as unsafe extern "C" fn(*mut c_void) -> i32, stream);
    });
}
