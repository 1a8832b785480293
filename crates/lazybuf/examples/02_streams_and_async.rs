//! 02: streams and asynchronous transfers. Every copy runs on a stream and returns a ticket; an
//! `_async` sync returns at once with a `Transfer`, so copies overlap other work (the seeds'
//! double buffering).
//!
//! Run: `cargo run --example 02_streams_and_async`.

use lazybuf::{BufferOptions, BufferState, Result, UnifiedBuffer};

fn main() -> Result<()> {
    let device = lazybuf::default_device()?;
    // Two buffers on two streams of the same device: their copies are independent.
    let streams = [device.create_stream()?, device.create_stream()?];
    let mut buffers = Vec::new();
    for stream in &streams {
        let options = BufferOptions {
            device: Some(device.clone()),
            stream: Some(stream.clone()),
            ..Default::default()
        };
        buffers.push(UnifiedBuffer::<u32>::with_options(&[1 << 16], options)?);
    }

    for batch in 0..4u32 {
        let (ready, next) = buffers.split_at_mut(1);
        let (current, upcoming) =
            if batch % 2 == 0 { (&mut ready[0], &mut next[0]) } else { (&mut next[0], &mut ready[0]) };
        // Fill the next batch on the host and start its upload without waiting.
        upcoming.host_overwrite()?.fill(batch + 1);
        let transfer = upcoming.sync_to_device_async()?;
        // While it is in flight, the buffer reports the state it will have.
        assert_eq!(upcoming.state(), BufferState::Synchronized);
        // Meanwhile, work on the current batch (here: read it back on the host).
        let seen = current.host()?[0];
        println!("batch {batch}: current holds {seen}, next upload complete: {}", transfer.is_complete()?);
        transfer.wait()?;
    }
    // Blocking calls are the same operations followed by a wait; `finish` settles the rest.
    for buf in &mut buffers {
        buf.finish()?;
    }
    device.synchronize()?;
    Ok(())
}
