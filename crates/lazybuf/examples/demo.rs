//! The buffer lifecycle on the default device (or `LAZYBUF_DEVICE`), printing each state and
//! what was copied. Run: `cargo run --release --example demo`.

use lazybuf::{BufferState, Device, Result, UnifiedBuffer};

fn step(buf: &mut UnifiedBuffer<f32>, what: &str) {
    let stats = buf.transfer_stats();
    let moved = if stats.zero_copy_syncs > 0 {
        format!("{} zero-copy sync(s)", stats.zero_copy_syncs)
    } else if stats.bytes_moved() > 0 {
        format!(
            "copied {} B host->device, {} B device->host",
            stats.host_to_device.bytes, stats.device_to_host.bytes
        )
    } else {
        "nothing copied".to_string()
    };
    println!("{what:<44} state {:<14} {moved}", buf.state().to_string());
    buf.reset_transfer_stats();
}

/// Errors are printed for people (`demo: error: ...`, exit status 1), not as Rust structs.
fn main() {
    if let Err(err) = run() {
        eprintln!("demo: error: {err}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    println!("devices:");
    for device in lazybuf::devices() {
        let info = device.info();
        let mem = device.memory_info()?;
        println!(
            "  {:<7} {:<40} vendor {:<22} shares host memory: {:<5} memory {:.1} GiB free of {:.1} GiB ({:?})",
            info.backend.to_string(),
            info.name,
            info.vendor,
            info.shares_host_memory,
            mem.free as f64 / (1u64 << 30) as f64,
            mem.total as f64 / (1u64 << 30) as f64,
            mem.source,
        );
    }
    for status in lazybuf::backend_status() {
        if let Err(reason) = &status.devices {
            println!("  {:<7} unavailable: {reason}", status.backend.to_string());
        }
    }
    let device: Device = lazybuf::default_device()?;
    println!(
        "\ndefault device: {device} (choose with LAZYBUF_DEVICE=gpu, host, cuda[:N], opencl[:N], wgpu[:N], \
         vulkan[:N], metal[:N] or dx12[:N])\n"
    );

    let mut buf = UnifiedBuffer::<f32>::on(&[1024], &device)?;
    step(&mut buf, "new buffer (allocates nothing)");
    buf.host_mut()?.iter_mut().enumerate().for_each(|(i, x)| *x = i as f32);
    step(&mut buf, "write on host");
    buf.sync_to_device()?;
    step(&mut buf, "sync_to_device");
    buf.sync_to_device()?;
    step(&mut buf, "sync_to_device again (already current)");
    buf.host_mut()?[0] = 42.0;
    step(&mut buf, "write on host again");
    let _view = buf.device()?;
    step(&mut buf, "device view (syncs the stale device)");
    buf.mark_device_dirty()?;
    step(&mut buf, "mark_device_dirty (a kernel wrote it)");
    let first = buf.host()?[0];
    step(&mut buf, "read on host");
    buf.fill(7.0)?;
    step(&mut buf, "fill(7.0) on the device, no transfer");
    let sum: f32 = buf.host()?.iter().sum();
    step(&mut buf, "read on host");
    assert_eq!(first, 42.0);
    assert_eq!(sum, 7.0 * 1024.0);
    assert_eq!(buf.state(), BufferState::Synchronized);
    println!("\nhost[0] after the round trip: {first}; sum after fill: {sum}");
    Ok(())
}
