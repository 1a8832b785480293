//! The coherence checker (`lazybuf::checking`): a kernel that writes a device copy handed out
//! as a read, with no `mark_device_dirty()`, leaves the host silently stale on every device
//! that does not alias host memory; with checking on, the next host read says so, names the
//! missing call, and changes nothing.
//!
//! The "kernel" is the caller's own write of the device memory on the view's stream: a fill
//! enqueued on lazybuf's OpenCL queue (PoCL, below the zero-copy size), a `cuMemsetD32Async`
//! on the view's CUDA stream (a GPU, or the driver test double), a `Queue::write_buffer` on a
//! wgpu device's queue (lavapipe). The switch is process-wide, so the tests hold [`LOCK`].

mod common;
#[cfg(feature = "cuda")]
mod cuda_common;

use std::sync::{Mutex, MutexGuard};

use common::pattern;
use lazybuf::testing::FaultyDevice;
use lazybuf::{BufferState, Device, Error, UnifiedBuffer};

static LOCK: Mutex<()> = Mutex::new(());

fn checking(on: bool) -> MutexGuard<'static, ()> {
    let guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    lazybuf::set_checking(on);
    guard
}

/// The seeds' pattern: the device copy taken for reading, then written by "a kernel".
fn write_behind_a_read_view(buf: &mut UnifiedBuffer<u32>, value: u32) {
    let view = buf.device().unwrap();
    kernel_write(&view, value);
}

#[cfg(feature = "opencl")]
fn kernel_write(view: &lazybuf::DeviceView<'_, u32>, value: u32) {
    use lazybuf::backend::{RawMemory, RawStream};
    // SAFETY: (test) the view's memory and stream are live while the view is.
    match unsafe { (view.raw(), view.stream().raw()) } {
        (RawMemory::OpenCl(mem), RawStream::OpenCl(queue)) => {
            let bytes = view.len() * 4;
            // SAFETY: (test) a fill of the view's own memory on its own queue; the pattern is
            // copied at enqueue.
            let event = unsafe {
                cl3::command_queue::enqueue_fill_buffer(
                    queue,
                    mem,
                    (&value as *const u32).cast(),
                    4,
                    0,
                    bytes,
                    0,
                    std::ptr::null(),
                )
            }
            .unwrap();
            cl3::event::wait_for_events(&[event]).unwrap();
            // SAFETY: (test) the fill's event, released once.
            unsafe { cl3::event::release_event(event) }.unwrap();
        }
        (RawMemory::Cuda(ptr), RawStream::Cuda(stream)) => {
            cuda_common::kernel_fill_u32(view.device(), ptr, view.len(), value, stream)
        }
        #[cfg(feature = "wgpu")]
        (RawMemory::Wgpu(buffer), RawStream::Wgpu(queue)) => {
            // SAFETY: (test) the view's buffer and the device's queue are live while the view is.
            let (buffer, queue): (
                &lazybuf::backend::wgpu::wgpu::Buffer,
                &lazybuf::backend::wgpu::wgpu::Queue,
            ) = unsafe { (&*buffer, &*queue) };
            let words = vec![value; view.len()];
            queue.write_buffer(buffer, 0, bytemuck::cast_slice(&words));
            queue.submit([]);
            view.stream().synchronize().unwrap();
        }
        #[cfg(feature = "loopback")]
        (RawMemory::Loopback(address), RawStream::Loopback(_)) => {
            // SAFETY: (test) a loopback device's memory is this process's memory at `address`,
            // `view.len()` u32s long and live while the view is; its stream is immediate.
            let words = unsafe { std::slice::from_raw_parts_mut(address as *mut u32, view.len()) };
            words.fill(value);
        }
        (other, _) => panic!("no kernel for {other:?}"),
    }
}

#[cfg(not(feature = "opencl"))]
fn kernel_write(view: &lazybuf::DeviceView<'_, u32>, value: u32) {
    use lazybuf::backend::{RawMemory, RawStream};
    // SAFETY: (test) the view's memory and stream are live while the view is.
    match unsafe { (view.raw(), view.stream().raw()) } {
        (RawMemory::Cuda(ptr), RawStream::Cuda(stream)) => {
            cuda_common::kernel_fill_u32(view.device(), ptr, view.len(), value, stream)
        }
        #[cfg(feature = "wgpu")]
        (RawMemory::Wgpu(buffer), RawStream::Wgpu(queue)) => {
            // SAFETY: (test) the view's buffer and the device's queue are live while the view is.
            let (buffer, queue): (
                &lazybuf::backend::wgpu::wgpu::Buffer,
                &lazybuf::backend::wgpu::wgpu::Queue,
            ) = unsafe { (&*buffer, &*queue) };
            let words = vec![value; view.len()];
            queue.write_buffer(buffer, 0, bytemuck::cast_slice(&words));
            queue.submit([]);
            view.stream().synchronize().unwrap();
        }
        #[cfg(feature = "loopback")]
        (RawMemory::Loopback(address), RawStream::Loopback(_)) => {
            // SAFETY: (test) a loopback device's memory is this process's memory at `address`,
            // `view.len()` u32s long and live while the view is; its stream is immediate.
            let words = unsafe { std::slice::from_raw_parts_mut(address as *mut u32, view.len()) };
            words.fill(value);
        }
        (other, _) => panic!("no kernel for {other:?}"),
    }
}

/// Devices whose small buffers are real device memory (not aliases of the host block).
fn non_aliasing() -> Vec<Device> {
    common::devices().into_iter().filter(|d| !d.is_zero_copy(4000)).collect()
}

#[test]
fn an_undeclared_kernel_write_is_caught_at_the_next_host_read() {
    let _on = checking(true);
    for device in non_aliasing() {
        let mut buf = common::direct(&device, 1000);
        buf.copy_from(&pattern(1, 1000)).unwrap();
        write_behind_a_read_view(&mut buf, 7);
        assert_eq!(buf.state(), BufferState::Synchronized);
        let stats = buf.transfer_stats();
        let err = buf.host().unwrap_err();
        assert!(matches!(err, Error::Coherence { first_difference: 0, nbytes: 4000, .. }), "{device}: {err}");
        let text = err.to_string();
        assert!(text.contains("mark_device_dirty()") && text.contains(".device_writable"), "{text}");
        assert_eq!(
            (buf.state(), buf.transfer_stats()),
            (BufferState::Synchronized, stats),
            "nothing changed"
        );
        // Declaring the write is the fix: the kernel's result comes back.
        buf.mark_device_dirty().unwrap();
        assert_eq!(buf.to_vec().unwrap(), vec![7; 1000], "{device}");
    }
}

/// A host write that keeps the bytes it does not change (`host_mut`, Python's `.host`) is
/// checked as a read is: before, only reads were, and `host_mut()[0] = 1` lost the kernel's
/// undeclared write silently. An overwrite of every byte reads none: not checked.
#[test]
fn an_undeclared_kernel_write_is_caught_at_the_next_host_write_but_not_at_an_overwrite() {
    let _on = checking(true);
    for device in non_aliasing() {
        let mut buf = common::direct(&device, 1000);
        buf.copy_from(&pattern(1, 1000)).unwrap();
        write_behind_a_read_view(&mut buf, 7);
        let stats = buf.transfer_stats();
        let err = buf.host_mut().map(|_| ()).unwrap_err();
        assert!(matches!(err, Error::Coherence { first_difference: 0, .. }), "{device}: {err}");
        assert_eq!(
            (buf.state(), buf.transfer_stats()),
            (BufferState::Synchronized, stats),
            "nothing changed"
        );
        buf.host_overwrite().unwrap().fill(5);
        assert_eq!(buf.to_vec().unwrap(), vec![5; 1000], "{device}");
    }
}

#[test]
fn declared_writes_and_untouched_reads_pass_the_check() {
    let _on = checking(true);
    for device in common::devices() {
        let mut buf = common::direct(&device, 1000);
        buf.copy_from(&pattern(2, 1000)).unwrap();
        buf.device().map(|_view| ()).unwrap(); // handed out, not written
        assert_eq!(buf.to_vec().unwrap(), pattern(2, 1000), "{device}");
        {
            let mut view = buf.device_mut().unwrap(); // a declared write
            view.write_from(&pattern(3, 1000)).unwrap();
        }
        assert_eq!(buf.to_vec().unwrap(), pattern(3, 1000), "{device}");
        buf.host_mut().unwrap()[0] = 1; // the host is newer: the device copy is stale, no check
        assert_eq!(buf.host().unwrap()[0], 1);
    }
}

#[test]
fn aliasing_devices_need_no_check() {
    let _on = checking(true);
    for device in common::devices().into_iter().filter(|d| d.is_zero_copy(4000)) {
        let mut buf = common::direct(&device, 1000);
        buf.copy_from(&pattern(4, 1000)).unwrap();
        // On the host device the device copy is the host memory: a write through it is seen.
        buf.device_mut().unwrap().as_host_slice_mut().unwrap().fill(9);
        assert_eq!(buf.to_vec().unwrap(), vec![9; 1000]);
    }
}

#[test]
fn the_check_costs_a_copy_only_for_copies_handed_out_for_reading() {
    let _on = checking(true);
    for base in non_aliasing() {
        let (device, plan) = FaultyDevice::wrap(&base);
        let mut buf = common::direct(&device, 1000);
        buf.copy_from(&pattern(5, 1000)).unwrap();
        buf.sync_to_device().unwrap(); // synchronized, never handed out
        let copies = plan.copies();
        buf.host().unwrap();
        assert_eq!(plan.copies(), copies, "{base}: no hand-out, no check");
        buf.device().map(|_view| ()).unwrap();
        buf.host().unwrap();
        assert_eq!(plan.copies(), copies + 1, "{base}: one device-to-host copy to compare");
    }
}

#[test]
fn without_the_checker_the_same_mistake_reads_stale_data() {
    let _off = checking(false);
    for device in non_aliasing() {
        let mut buf = common::direct(&device, 1000);
        buf.copy_from(&pattern(6, 1000)).unwrap();
        write_behind_a_read_view(&mut buf, 8);
        // The documented hazard the checker exists for: the kernel's result is not seen.
        assert_eq!(buf.to_vec().unwrap(), pattern(6, 1000), "{device}");
    }
}
