//! Asynchronous transfers on CUDA devices, through the driver test double, whose streams run
//! their work on worker threads: the double's `hold` hook keeps every stream from starting
//! anything, so a test can see for certain what is still in flight while the host works.
//!
//! - The seeds' double-buffering pattern overlaps: the transfer of one buffer is in flight
//!   while the host fills the other, pageable (staged) and pinned (direct DMA).
//! - The caller's own stream is ordered before lazybuf's through a ticket
//!   ([`lazybuf::DeviceViewMut::used_until`] with a marker of the caller's stream).
//!
//! The hooks are process-wide, so the tests hold [`LOCK`]; on a real GPU they print a skip.

#![cfg(feature = "cuda")]

mod cuda_common;

use std::sync::{Mutex, MutexGuard};

use cuda_common::{double_devices, hold, memset_d32_async, ramp, with_context};
use lazybuf::backend::cuda::STAGING_MIN_BYTES;
use lazybuf::backend::{RawDevice, RawMemory, RawStream};
use lazybuf::{BufferOptions, BufferState, Device, DirectResource, UnifiedBuffer};

static LOCK: Mutex<()> = Mutex::new(());

fn setup(test: &str) -> Option<(Vec<Device>, MutexGuard<'static, ()>)> {
    let devices = double_devices(test)?;
    Some((devices, LOCK.lock().unwrap_or_else(|e| e.into_inner())))
}

/// Releases the double's streams even when the test fails half-way.
struct Held;

impl Held {
    fn start() -> Held {
        hold(true);
        Held
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        hold(false);
    }
}

fn buffer(device: &Device, n: usize, pinned: bool) -> UnifiedBuffer<u8> {
    let options = BufferOptions {
        device: Some(device.clone()),
        pinned,
        resource: Some(DirectResource::shared()),
        ..BufferOptions::default()
    };
    UnifiedBuffer::with_options(&[n], options).unwrap()
}

#[test]
fn double_buffering_overlaps_the_transfer_of_one_buffer_with_the_fill_of_the_other() {
    let Some((devices, _lock)) = setup("double_buffering_overlaps") else { return };
    let device = &devices[0];
    // Staged (large pageable), direct (pinned) and the driver's pageable path (small).
    for (n, pinned) in [(STAGING_MIN_BYTES * 2, false), (STAGING_MIN_BYTES, true), (4096, false)] {
        let (mut a, mut b) = (buffer(device, n, pinned), buffer(device, n, pinned));
        a.copy_from(&ramp(n)).unwrap();
        let held = Held::start();
        let transfer = a.sync_to_device_async().unwrap();
        assert_eq!(a.state(), BufferState::Synchronized, "the state the transfer will leave");
        // The host fills `b` while `a`'s transfer is still in flight.
        b.host_overwrite().unwrap().iter_mut().enumerate().for_each(|(i, x)| *x = (i % 7) as u8);
        assert!(!transfer.is_complete().unwrap(), "n={n} pinned={pinned}: nothing may have run yet");
        drop(held);
        transfer.wait().unwrap();
        a.mark_device_dirty().unwrap();
        assert!(a.host().unwrap() == &ramp(n)[..], "n={n} pinned={pinned}");
        // And the other way round: `b` goes while `a` is refilled.
        let held = Held::start();
        let transfer = b.sync_to_device_async().unwrap();
        a.host_mut().unwrap().fill(3);
        assert!(!transfer.is_complete().unwrap());
        drop(held);
        transfer.wait().unwrap();
        b.mark_device_dirty().unwrap();
        assert!(b.host().unwrap().iter().enumerate().all(|(i, &x)| x == (i % 7) as u8));
    }
}

#[test]
fn the_callers_own_stream_is_ordered_before_lazybuf_through_a_ticket() {
    let Some((devices, _lock)) = setup("the_callers_own_stream_is_ordered_before_lazybuf") else { return };
    let device = &devices[0];
    let RawDevice::Cuda { context, .. } = (unsafe { device.raw() }) else { panic!("a CUDA device") };
    let callers = device.create_stream().unwrap();
    let RawStream::Cuda(raw_stream) = (unsafe { callers.raw() }) else { panic!("a CUDA stream") };
    // SAFETY: the stream is a live stream of this device's context (made just above).
    let wrapped = unsafe { device.wrap_stream(RawStream::Cuda(raw_stream)) }.unwrap();
    let n = 1 << 16;
    let mut buf = buffer(device, n * 4, false);
    buf.copy_from(&vec![1; n * 4]).unwrap();
    let held;
    {
        let mut view = buf.device_mut().unwrap();
        // From here on nothing runs until the end, so the order of the queued work decides.
        held = Held::start();
        let RawMemory::Cuda(ptr) = (unsafe { view.raw() }) else { panic!("a device pointer") };
        // The caller's "kernel" on its own stream, which lazybuf's stream knows nothing of.
        with_context(context, || memset_d32_async(ptr, 0x0bad_f00d, n, raw_stream));
        view.used_until(wrapped.marker().unwrap());
    }
    // lazybuf's download runs on its own stream, after the caller's memset.
    let transfer = buf.sync_to_host_async().unwrap();
    drop(held);
    transfer.wait().unwrap();
    let words: Vec<u32> =
        buf.host().unwrap().chunks(4).map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]])).collect();
    assert!(words.iter().all(|&w| w == 0x0bad_f00d), "the download ran before the caller's kernel");
}

#[test]
fn kernels_on_the_legacy_default_stream_are_ordered_with_lazybufs_copies() {
    let Some((devices, _lock)) = setup("kernels_on_the_legacy_default_stream") else { return };
    let device = &devices[0];
    let RawDevice::Cuda { context, .. } = (unsafe { device.raw() }) else { panic!("a CUDA device") };
    let n = 1 << 14;
    let mut buf = buffer(device, n * 4, false);
    buf.copy_from(&vec![1; n * 4]).unwrap();
    let ptr = {
        let view = buf.device().unwrap();
        let RawMemory::Cuda(ptr) = (unsafe { view.raw() }) else { panic!("a device pointer") };
        ptr
    };
    // A host write makes the device copy stale; its upload is queued on lazybuf's stream
    // while the double's streams are held.
    buf.host_mut().unwrap().fill(2);
    let held = Held::start();
    let upload = buf.sync_to_device_async().unwrap();
    // The streams are released a little later, from another thread.
    let releaser = std::thread::spawn(|| {
        std::thread::sleep(std::time::Duration::from_millis(50));
        hold(false);
    });
    // The caller's "kernel" on the legacy default stream (where CuPy, PyTorch and Numba launch
    // by default), with no event or ticket: it must still run after lazybuf's queued upload,
    // because lazybuf's default stream is a blocking one.
    with_context(context, || memset_d32_async(ptr, 0x0bad_f00d, n, std::ptr::null_mut()));
    releaser.join().unwrap();
    drop(held);
    upload.wait().unwrap();
    buf.mark_device_dirty().unwrap();
    let words: Vec<u32> =
        buf.host().unwrap().chunks(4).map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]])).collect();
    assert!(
        words.iter().all(|&w| w == 0x0bad_f00d),
        "the kernel on the legacy stream ran before lazybuf's queued upload (which then overwrote it)"
    );
}
