//! Asynchronous transfers on CUDA devices, on a GPU or through the driver test double. A
//! [`Gate`] holds a stream's queued work back (on a GPU a real kernel that spins until the
//! gate opens; on the double its `hold` hook, whose streams run on worker threads), so a test
//! can see for certain what is still in flight while the host works.
//!
//! - The seeds' double-buffering pattern overlaps: the transfer of one buffer is in flight
//!   while the host fills the other, pageable (staged) and pinned (direct DMA).
//! - The caller's own stream is ordered before lazybuf's through a ticket
//!   ([`lazybuf::DeviceViewMut::used_until`] with a marker of the caller's stream).
//! - Kernels on the legacy default stream are ordered after lazybuf's queued copies, because
//!   lazybuf's default stream is a blocking one.
//!
//! The double's hold is process-wide, so the tests hold [`LOCK`].

#![cfg(feature = "cuda")]

mod cuda_common;

use std::sync::{Mutex, MutexGuard};

use cuda_common::{Gate, cuda_context, cuda_devices, is_double, memset_d32_async, ramp, with_context};
use lazybuf::backend::cuda::STAGING_MIN_BYTES;
use lazybuf::backend::{RawMemory, RawStream};
use lazybuf::{BufferOptions, BufferState, Device, DirectResource, UnifiedBuffer};

static LOCK: Mutex<()> = Mutex::new(());

fn setup(test: &str) -> Option<(Vec<Device>, MutexGuard<'static, ()>)> {
    let devices = cuda_devices(test)?;
    Some((devices, LOCK.lock().unwrap_or_else(|e| e.into_inner())))
}

/// The raw handle of a stream lazybuf or the caller uses.
fn raw_stream(stream: &lazybuf::Stream) -> *mut std::ffi::c_void {
    // SAFETY: (test) the handle is used while the stream is alive.
    match unsafe { stream.raw() } {
        RawStream::Cuda(raw) => raw,
        other => panic!("not a CUDA stream: {other:?}"),
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

fn words(buf: &mut UnifiedBuffer<u8>) -> Vec<u32> {
    buf.host().unwrap().chunks(4).map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]])).collect()
}

#[test]
fn double_buffering_overlaps_the_transfer_of_one_buffer_with_the_fill_of_the_other() {
    let Some((devices, _lock)) = setup("double_buffering_overlaps") else { return };
    let device = &devices[0];
    let stream = raw_stream(&device.stream());
    // Staged (large pageable), direct (pinned) and, on the double, the driver's pageable path
    // (small): a GPU's driver may finish a small pageable copy before returning, as CUDA's
    // documented synchronization behaviour allows, so there it cannot be held in flight.
    let mut cases = vec![(STAGING_MIN_BYTES * 2, false), (STAGING_MIN_BYTES, true)];
    if is_double(device) {
        cases.push((4096, false));
    }
    for (n, pinned) in cases {
        let (mut a, mut b) = (buffer(device, n, pinned), buffer(device, n, pinned));
        a.copy_from(&ramp(n)).unwrap();
        let held = Gate::close(device, stream);
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
        let held = Gate::close(device, stream);
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
    let callers = device.create_stream().unwrap();
    let caller_stream = raw_stream(&callers);
    // SAFETY: the stream is a live stream of this device's context (made just above).
    let wrapped = unsafe { device.wrap_stream(RawStream::Cuda(caller_stream)) }.unwrap();
    let n = 1 << 16;
    // Pinned: its download is truly asynchronous on a GPU too.
    let mut buf = buffer(device, n * 4, true);
    buf.copy_from(&vec![1; n * 4]).unwrap();
    let held;
    {
        let mut view = buf.device_mut().unwrap();
        // From here on the caller's stream runs nothing until the gate opens, so the order of
        // the queued work decides.
        held = Gate::close(device, caller_stream);
        // SAFETY: (test) the pointer is used by the memset below, while the view lives.
        let RawMemory::Cuda(ptr) = (unsafe { view.raw() }) else { panic!("a device pointer") };
        // The caller's "kernel" on its own stream, which lazybuf's stream knows nothing of.
        with_context(cuda_context(device), || memset_d32_async(ptr, 0x0bad_f00d, n, caller_stream));
        view.used_until(wrapped.marker().unwrap());
    }
    let opener = held.open_after(50);
    // lazybuf's download runs on its own stream, after the caller's memset.
    let transfer = buf.sync_to_host_async().unwrap();
    transfer.wait().unwrap();
    opener.join().unwrap();
    assert!(words(&mut buf).iter().all(|&w| w == 0x0bad_f00d), "the download ran before the caller's kernel");
}

#[test]
fn kernels_on_the_legacy_default_stream_are_ordered_with_lazybufs_copies() {
    let Some((devices, _lock)) = setup("kernels_on_the_legacy_default_stream") else { return };
    let device = &devices[0];
    let n = 1 << 14;
    let mut buf = buffer(device, n * 4, true);
    buf.copy_from(&vec![1; n * 4]).unwrap();
    let ptr = {
        let view = buf.device().unwrap();
        // SAFETY: (test) the pointer is used while the buffer lives, and the use is declared.
        let RawMemory::Cuda(ptr) = (unsafe { view.raw() }) else { panic!("a device pointer") };
        ptr
    };
    // A host write makes the device copy stale; its upload is queued on lazybuf's stream
    // behind the closed gate, which opens a little later from another thread.
    buf.host_mut().unwrap().fill(2);
    let opener = Gate::close(device, raw_stream(&device.stream())).open_after(50);
    let upload = buf.sync_to_device_async().unwrap();
    // The caller's "kernel" on the legacy default stream (where CuPy, PyTorch and Numba launch
    // by default), with no event or ticket: it must still run after lazybuf's queued upload,
    // because lazybuf's default stream is a blocking one.
    with_context(cuda_context(device), || memset_d32_async(ptr, 0x0bad_f00d, n, std::ptr::null_mut()));
    opener.join().unwrap();
    upload.wait().unwrap();
    buf.mark_device_dirty().unwrap();
    assert!(
        words(&mut buf).iter().all(|&w| w == 0x0bad_f00d),
        "the kernel on the legacy stream ran before lazybuf's queued upload (which then overwrote it)"
    );
}

/// The stream-ordered device access (`RawBuffer::device_access_ordered`, Python's `.device`):
/// the upload is enqueued and not waited for, a declared kernel write after it
/// (`mark_written`) does not wait either, and the read-back into outside memory, enqueued on
/// the same stream, waits once and settles the upload. A staged upload (a worker thread's, not
/// in the stream's order) is waited for instead.
#[test]
fn the_stream_ordered_device_access_leaves_its_upload_in_flight_for_the_read_back() {
    let Some((devices, _lock)) = setup("the_stream_ordered_device_access") else { return };
    let device = &devices[0];
    let stream = raw_stream(&device.stream());
    // Pinned: its upload is truly asynchronous on a GPU too.
    let n = 1 << 16;
    let data = ramp(n);
    let mut buf = buffer(device, n, true);
    buf.copy_from(&data).unwrap();
    let held = Gate::close(device, stream);
    let raw = buf.raw_mut();
    let (_, ticket) = raw.device_access_ordered(device).unwrap();
    assert!(!ticket.poll().unwrap(), "the upload waits behind the gate: the call did not wait for it");
    raw.mark_written(Some(device)).unwrap();
    assert!(raw.is_busy(), "the declared write did not wait for the upload");
    assert_eq!(raw.state(), BufferState::DeviceDirty);
    let opener = held.open_after(50);
    let mut out = lazybuf::host_memory::HostMemory::allocate(n).unwrap();
    raw.read_into(&mut out).unwrap();
    opener.join().unwrap();
    assert!(out.as_slice()[..n] == data[..], "the read-back ran after the upload");
    assert!(!raw.is_busy(), "the read-back settled the upload");
    assert!(ticket.poll().unwrap());
    assert_eq!(raw.state(), BufferState::DeviceDirty);

    // A current copy with no upload in flight: nothing to order after.
    let (_, again) = raw.device_access_ordered(device).unwrap();
    assert!(again.is_trivially_done());

    // Staged: waited for, the ticket done.
    let big = STAGING_MIN_BYTES * 2;
    let mut staged = buffer(device, big, false);
    staged.copy_from(&ramp(big)).unwrap();
    let (_, ticket) = staged.raw_mut().device_access_ordered(device).unwrap();
    assert!(ticket.is_trivially_done(), "a staged upload is waited for");
    assert!(!staged.raw().is_busy());
    assert_eq!(staged.state(), BufferState::Synchronized);
}
