//! 04: memory objects. One allocation of one kind, no coherence tracking: every operation
//! moves bytes straight in or out (dpctl's USM memory, RMM's `DeviceBuffer`).
//!
//! Run: `cargo run --example 04_memory_objects`.

use lazybuf::{DeviceAllocation, DeviceBuffer, MemoryKind, Result};

fn main() -> Result<()> {
    let device = lazybuf::default_device()?;

    // A typed device allocation: upload, fill, download.
    let mut weights = DeviceAllocation::<f32>::new(&device, MemoryKind::Device, 1000)?;
    weights.copy_from_host(&vec![0.25; 1000])?;
    weights.fill_prefix(10, 1.0)?;
    let back = weights.to_vec()?;
    assert_eq!((back[0], back[999]), (1.0, 0.25));

    // A copy into host memory (page-locked where the device has it), which the host reads
    // directly.
    let pinned = device.can_pin_host_memory();
    let host = weights.to(&device, MemoryKind::Host { pinned })?;
    assert!(host.is_host_accessible());
    let total: f32 = host.host_slice()?.iter().sum();
    println!("{device}: {} elements in host memory (pinned: {pinned}), sum {total}", host.len());

    // RMM's resizable device buffer: resizing keeps the contents.
    let mut bytes = DeviceBuffer::from_host(&device, b"lazybuf")?;
    bytes.resize(16)?;
    assert_eq!(&bytes.to_vec()?[..7], b"lazybuf");
    println!("device buffer: size {}, capacity {}", bytes.size(), bytes.capacity());
    Ok(())
}
