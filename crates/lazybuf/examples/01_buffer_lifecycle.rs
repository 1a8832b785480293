//! 01: the buffer lifecycle. A buffer allocates nothing until it is used, copies only when a
//! stale copy is about to be used, and says what moved.
//!
//! Run: `cargo run --example 01_buffer_lifecycle` (the default device: a GPU if there is one,
//! else the host; `LAZYBUF_DEVICE=opencl` or `=wgpu` to choose).

use lazybuf::{BufferState, Result, UnifiedBuffer};

fn main() -> Result<()> {
    let device = lazybuf::default_device()?;
    let mut buf = UnifiedBuffer::<f32>::on(&[4, 256], &device)?;
    assert_eq!(buf.state(), BufferState::Uninitialized);
    assert_eq!(buf.transfer_stats().allocations, 0, "nothing allocated yet");

    // A mutable host borrow is a write: the host becomes the only current copy.
    for (i, x) in buf.host_mut()?.iter_mut().enumerate() {
        *x = i as f32;
    }
    assert_eq!(buf.state(), BufferState::HostOnly);

    // A device read uploads once; a second one copies nothing.
    buf.sync_to_device()?;
    buf.sync_to_device()?;
    assert_eq!(buf.state(), BufferState::Synchronized);
    let uploads = buf.transfer_stats().host_to_device.copies + buf.transfer_stats().zero_copy_syncs;
    assert_eq!(uploads, 1, "one upload (or one zero-copy sync on a device that shares memory)");

    // A device write (a kernel through `device_mut()`) leaves the host stale...
    {
        let _view = buf.device_mut()?;
        // hand `unsafe { _view.raw() }` to a kernel here
    }
    assert_eq!(buf.state(), BufferState::DeviceDirty);
    // ...and the next host read downloads, once.
    let sum: f32 = buf.host()?.iter().sum();
    assert_eq!(buf.state(), BufferState::Synchronized);

    // `fill` runs where the data is current and makes every other copy stale.
    buf.fill(0.5)?;
    assert_eq!(buf.to_vec()?.iter().sum::<f32>(), 0.5 * 1024.0);

    let stats = buf.transfer_stats();
    println!(
        "{device}: sum {sum}; {} upload(s), {} download(s), {} zero-copy sync(s), {} allocation(s)",
        stats.host_to_device.copies, stats.device_to_host.copies, stats.zero_copy_syncs, stats.allocations
    );
    Ok(())
}
