//! End to end on real OpenCL: a kernel compiled and run by the user on lazybuf's queue writes
//! the device copy, and the host reads the kernel's result through lazybuf.
//!
//! Runs on every OpenCL device found (PoCL's CPU device in CI, where `LAZYBUF_REQUIRE=opencl`
//! makes its absence a failure), for a buffer that copies and one that aliases host memory.

#![cfg(feature = "opencl")]

use crate::common;

use std::ffi::{CStr, c_void};
use std::ptr;

use cl3::types::cl_event;
use lazybuf::backend::{RawDevice, RawMemory};
use lazybuf::{BackendKind, BufferState, Device, UnifiedBuffer};

const SOURCE: &str = r#"
__kernel void scale_add(__global float* x, const float a, const float b) {
    size_t i = get_global_id(0);
    x[i] = x[i] * a + b;
}
"#;

/// Compiles `source` for `device` and enqueues its kernel `name` over `n` work items on the
/// device's queue, with `mem` as argument 0 and the bytes of each of `scalars` after it;
/// returns the launch's event (the caller waits for and releases it).
fn enqueue(
    device: &Device,
    source: &str,
    name: &CStr,
    mem: RawMemory,
    n: usize,
    scalars: &[&[u8]],
) -> cl_event {
    // SAFETY: (test) the handles are lazybuf's own context/queue/device, alive while `device`
    // lives; nothing here releases them.
    let RawDevice::OpenCl { context, queue, device: device_id } = (unsafe { device.raw() }) else {
        panic!("{device} is not an OpenCL device");
    };
    let RawMemory::OpenCl(cl_mem) = mem else { panic!("not an OpenCL allocation: {mem:?}") };
    let program = cl3::program::create_program_with_source(context, &[source]).unwrap();
    cl3::program::build_program(program, &[device_id], c"", None, ptr::null_mut()).unwrap();
    let kernel = cl3::kernel::create_kernel(program, name).unwrap();
    // SAFETY: (test) argument sizes and pointers match the kernel's parameters; the cl_mem is
    // alive while the buffer lives (the caller keeps it until the event completed). The kernel
    // and program are released at once: OpenCL keeps them alive while the launch needs them.
    unsafe {
        cl3::kernel::set_kernel_arg(kernel, 0, size_of::<*mut c_void>(), (&raw const cl_mem).cast()).unwrap();
        for (i, scalar) in scalars.iter().enumerate() {
            cl3::kernel::set_kernel_arg(kernel, i as u32 + 1, scalar.len(), scalar.as_ptr().cast()).unwrap();
        }
        let global = [n];
        let event = cl3::command_queue::enqueue_nd_range_kernel(
            queue,
            kernel,
            1,
            ptr::null(),
            global.as_ptr(),
            ptr::null(),
            0,
            ptr::null(),
        )
        .unwrap();
        cl3::command_queue::flush(queue).unwrap();
        cl3::kernel::release_kernel(kernel).unwrap();
        cl3::program::release_program(program).unwrap();
        event
    }
}

/// Waits for and releases `event`.
fn finish(event: cl_event) {
    cl3::event::wait_for_events(&[event]).unwrap();
    // SAFETY: (test) the event is the caller's own, waited for above, released once.
    unsafe { cl3::event::release_event(event).unwrap() };
}

/// Runs `scale_add(mem, a, b)` over `n` elements on the device's queue, waiting for it.
fn run_scale_add(device: &Device, mem: RawMemory, n: usize, a: f32, b: f32) {
    finish(enqueue(device, SOURCE, c"scale_add", mem, n, &[&a.to_ne_bytes(), &b.to_ne_bytes()]));
}

fn opencl_devices() -> Vec<Device> {
    common::devices_of(BackendKind::OPENCL)
}

#[test]
fn a_kernel_writes_the_device_copy_and_the_host_reads_it() {
    for device in opencl_devices() {
        // 1000 floats copy; 1 Mi floats (4 MiB) alias host memory on a host-sharing device.
        for n in [1000usize, 1 << 20] {
            let input: Vec<f32> = (0..n).map(|i| i as f32).collect();
            let mut buf = UnifiedBuffer::from_slice(&input, &device).unwrap();
            {
                let view = buf.device_mut().unwrap();
                // SAFETY: (test) the kernel finishes before the view is dropped.
                run_scale_add(&device, unsafe { view.raw() }, n, 2.0, 1.0);
            }
            assert_eq!(buf.state(), BufferState::DeviceDirty);
            let host = buf.host().unwrap();
            for (i, x) in host.iter().enumerate() {
                assert_eq!(*x, i as f32 * 2.0 + 1.0, "element {i} of {n} on {device}");
            }
            assert_eq!(buf.state(), BufferState::Synchronized);
        }
    }
}

/// The seeds' pattern: sync, run the kernel on `.device`, then `mark_device_dirty()`.
#[test]
fn the_seed_pattern_sync_kernel_mark_dirty_read_back() {
    for device in opencl_devices() {
        let n = 4096;
        let mut buf = UnifiedBuffer::<f32>::on(&[n], &device).unwrap();
        buf.host_mut().unwrap().fill(3.0);
        buf.sync_to_device().unwrap();
        let raw = {
            let view = buf.device().unwrap();
            // SAFETY: (test) the handle is used while the buffer is not touched, and the
            // write is declared right after with mark_device_dirty.
            unsafe { view.raw() }
        };
        run_scale_add(&device, raw, n, 10.0, 0.0);
        buf.mark_device_dirty().unwrap();
        assert_eq!(buf.state(), BufferState::DeviceDirty);
        buf.sync_to_host().unwrap();
        assert!(buf.host().unwrap().iter().all(|&x| x == 30.0));
        // Host writes after the kernel reach the device on the next device access.
        buf.host_mut().unwrap()[0] = -1.0;
        {
            let view = buf.device_mut().unwrap();
            // SAFETY: (test) as above.
            run_scale_add(&device, unsafe { view.raw() }, n, 1.0, 1.0);
        }
        let host = buf.host().unwrap();
        assert_eq!(host[0], 0.0);
        assert_eq!(host[1], 31.0);
    }
}

const SLOW_SOURCE: &str = r#"
__kernel void slow_fill(__global float* x, const float value, const int rounds) {
    size_t i = get_global_id(0);
    float acc = x[i];
    for (int r = 0; r < rounds; r++) {
        acc = acc * 0.5f + value * 0.5f;
    }
    x[i] = value + (acc - acc);
}
"#;

/// Enqueues `slow_fill(mem, value, rounds)` over `n` elements (every element becomes `value`,
/// slowly) and returns its event without waiting.
fn enqueue_slow_fill(device: &Device, mem: RawMemory, n: usize, value: f32, rounds: i32) -> cl_event {
    enqueue(device, SLOW_SOURCE, c"slow_fill", mem, n, &[&value.to_ne_bytes(), &rounds.to_ne_bytes()])
}

/// A kernel on lazybuf's queue writes a device copy handed out for *reading* (the caller forgot
/// `mark_device_dirty()`), and the host reads while the kernel may still run. Where the device
/// copy is a separate memory, the host keeps its own (stale) bytes; where it aliases the host
/// block (a zero-copy device: PoCL from 4 MiB), the read waits for the kernel and sees its
/// whole result. Never a torn mix of the two, on any device and for any read (`host()`,
/// `to_vec()`, `host_if_valid()`).
#[test]
fn a_host_read_after_an_undeclared_kernel_write_is_never_torn() {
    for device in opencl_devices() {
        // 1000 floats copy; 2 Mi floats (8 MiB) alias host memory on a host-sharing device.
        for n in [1000usize, 2 << 20] {
            for read in ["host", "to_vec", "host_if_valid"] {
                let mut buf = UnifiedBuffer::from_slice(&vec![1.0f32; n], &device).unwrap();
                let event = {
                    let view = buf.device().unwrap();
                    // SAFETY: (test) the kernel's event is waited for before the buffer goes.
                    enqueue_slow_fill(&device, unsafe { view.raw() }, n, 7.0, 1000)
                };
                let seen: Option<Vec<f32>> = match read {
                    "host" => Some(buf.host().unwrap().to_vec()),
                    "to_vec" => Some(buf.to_vec().unwrap()),
                    _ => buf.host_if_valid().map(<[f32]>::to_vec),
                };
                let finished =
                    cl3::event::get_event_info(event, cl3::event::CL_EVENT_COMMAND_EXECUTION_STATUS)
                        .map(|status| status.to_int() == cl3::event::CL_COMPLETE)
                        .unwrap();
                finish(event);
                let aliased = device.is_zero_copy(n * 4);
                let Some(seen) = seen else {
                    assert!(aliased, "host_if_valid of a copying buffer on {device} returns the host copy");
                    continue;
                };
                let all_new = seen.iter().all(|&x| x == 7.0);
                let all_old = seen.iter().all(|&x| x == 1.0);
                assert!(all_new || all_old, "a torn read ({read}) of {n} floats on {device}");
                if aliased {
                    assert!(
                        all_new && finished,
                        "{read} of an aliased buffer on {device} waits for the kernel"
                    );
                } else {
                    assert!(all_old, "{read}: the host keeps its own bytes on {device}");
                }
            }
        }
    }
}
