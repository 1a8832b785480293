//! Staging buffers: the host-visible buffers every transfer goes through, kept for reuse.
//!
//! wgpu moves bytes between the host and a storage buffer only through buffers the host can
//! map (`MAP_WRITE | COPY_SRC` for uploads, `MAP_READ | COPY_DST` for downloads). Making a new
//! one per transfer costs an allocation and, for large ones, the first-touch page faults of
//! fresh memory; this is what `Queue::write_buffer` does, and why lazybuf keeps its own.
//!
//! - An upload takes a write buffer that is **mapped** (a new one is mapped at creation),
//!   copies the bytes in, unmaps it and records the GPU copy; after the submission it asks
//!   wgpu to map the buffer again (`map_async(Write)`), and the mapping's callback puts it back
//!   on the free list. A buffer whose callback has not fired yet is simply not reused.
//! - A download takes an unmapped read buffer, records the copy into it, and maps it after
//!   the submission; the mapping's callback copies the bytes to the host, unmaps the buffer
//!   and puts it back.
//!
//! Buffers are kept per size class (powers of two from [`MIN_CLASS`]), at most
//! [`MAX_CACHED`] bytes per direction (the longest kept go first); [`Staging::trim`] drops them
//! all.
//!
//! What does not live here: the copies themselves (`device.rs`).

use std::sync::{Arc, Mutex, PoisonError};

use super::memory::Context;

/// The smallest staging buffer, in bytes.
pub(super) const MIN_CLASS: u64 = 64 << 10;
/// The most bytes of staging buffers kept for reuse, per direction.
pub(super) const MAX_CACHED: u64 = 256 << 20;

/// Which way a staging buffer moves bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Direction {
    /// Host to device: `MAP_WRITE | COPY_SRC`, kept mapped.
    Upload,
    /// Device to host: `MAP_READ | COPY_DST`, kept unmapped.
    Download,
}

/// The free staging buffers of one device.
#[derive(Debug, Default)]
pub(super) struct Staging {
    uploads: Mutex<Vec<wgpu::Buffer>>,
    downloads: Mutex<Vec<wgpu::Buffer>>,
}

/// The size class of a transfer of `bytes` (a multiple of 4).
pub(super) fn class(bytes: u64) -> u64 {
    bytes.next_power_of_two().max(MIN_CLASS)
}

impl Staging {
    fn list(&self, direction: Direction) -> &Mutex<Vec<wgpu::Buffer>> {
        match direction {
            Direction::Upload => &self.uploads,
            Direction::Download => &self.downloads,
        }
    }

    /// A free buffer of `bytes`' class, if one is kept.
    pub(super) fn take(&self, direction: Direction, bytes: u64) -> Option<wgpu::Buffer> {
        let class = class(bytes);
        let mut list = self.list(direction).lock().unwrap_or_else(PoisonError::into_inner);
        let at = list.iter().position(|b| b.size() == class)?;
        Some(list.remove(at))
    }

    /// Keeps `buffer` (mapped for an upload, unmapped for a download) for the next transfer,
    /// dropping the buffers kept longest as needed to stay within [`MAX_CACHED`] bytes (a
    /// buffer larger than that is not kept).
    pub(super) fn give_back(&self, direction: Direction, buffer: wgpu::Buffer) {
        if buffer.size() > MAX_CACHED {
            return;
        }
        let mut list = self.list(direction).lock().unwrap_or_else(PoisonError::into_inner);
        let mut kept: u64 = list.iter().map(wgpu::Buffer::size).sum();
        while kept + buffer.size() > MAX_CACHED && !list.is_empty() {
            kept -= list.remove(0).size();
        }
        list.push(buffer);
    }

    /// Drops every kept buffer.
    pub(super) fn trim(&self) {
        let uploads = std::mem::take(&mut *self.uploads.lock().unwrap_or_else(PoisonError::into_inner));
        let downloads = std::mem::take(&mut *self.downloads.lock().unwrap_or_else(PoisonError::into_inner));
        drop((uploads, downloads));
    }

    /// A new staging buffer of `bytes`' class (mapped when it is for uploads), inside the
    /// caller's error scope.
    pub(super) fn create(context: &Context, direction: Direction, bytes: u64) -> wgpu::Buffer {
        let (usage, mapped) = match direction {
            Direction::Upload => (wgpu::BufferUsages::MAP_WRITE | wgpu::BufferUsages::COPY_SRC, true),
            Direction::Download => (wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST, false),
        };
        context.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("lazybuf staging"),
            size: class(bytes),
            usage,
            mapped_at_creation: mapped,
        })
    }

    /// After the submission that read an upload buffer: maps it again, and keeps it once the
    /// mapping is done. Inside the caller's error scope.
    pub(super) fn recycle_upload(self: &Arc<Self>, buffer: wgpu::Buffer) {
        let staging = Arc::downgrade(self);
        let kept = buffer.clone();
        buffer.map_async(wgpu::MapMode::Write, .., move |mapped| {
            if let (Ok(()), Some(staging)) = (mapped, staging.upgrade()) {
                staging.give_back(Direction::Upload, kept);
            }
        });
    }
}
