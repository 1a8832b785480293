//! Adopted host memory ([`RawBuffer::adopt_host`]) on every device: a buffer whose host copy
//! is another owner's bytes (a frame distributed received) behaves as any HOST_ONLY buffer,
//! at any alignment, copies nothing when it adopts, never hands the block to its resource,
//! and gives the bytes back to their lender when it frees its memory, not before.

use crate::common;

use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::pattern;
use lazybuf::host_memory::{ForeignHostMemory, HostMemory};
use lazybuf::{
    BufferState, Device, DirectResource, Location, MemoryResource, RawBuffer, Residency, StatisticsResource,
    UnifiedBuffer,
};

/// Lends the bytes of a Vec; records when it gets them back.
struct Lender {
    _bytes: Vec<u8>,
    returned: Arc<AtomicBool>,
}

impl ForeignHostMemory for Lender {}

impl Drop for Lender {
    fn drop(&mut self) {
        self.returned.store(true, Ordering::SeqCst);
    }
}

/// A block adopting `data` at byte offset `offset` of the lender's Vec (1: misaligned for
/// every element type wider than a byte), and the flag its return sets.
fn lent(data: &[u8], offset: usize) -> (HostMemory, Arc<AtomicBool>) {
    let returned = Arc::new(AtomicBool::new(false));
    let mut bytes = vec![0xEE; offset + data.len() + 1];
    bytes[offset..offset + data.len()].copy_from_slice(data);
    let ptr = NonNull::new(bytes.as_mut_ptr().wrapping_add(offset)).unwrap();
    let lender = Lender { _bytes: bytes, returned: returned.clone() };
    // SAFETY: ptr addresses data.len() initialized bytes of the Vec's heap buffer, which does
    // not move when the lender does, lives as long as the lender, and only the block uses.
    let block = unsafe { HostMemory::adopt(ptr, data.len(), Box::new(lender)) };
    (block, returned)
}

fn bytes_of(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_ne_bytes()).collect()
}

#[test]
fn an_adopted_block_is_the_host_copy_without_a_copy_on_every_device() {
    for device in common::devices() {
        // 4 MiB and more: PoCL aliases the block (CL_MEM_USE_HOST_PTR) at its odd address.
        for (len, offset) in [(1usize, 1usize), (1000, 3), (1 << 18, 64), (1 << 20, 1)] {
            let data = bytes_of(&pattern(len as u32, len));
            let nbytes = data.len();
            let stats = Arc::new(StatisticsResource::new(Arc::new(DirectResource)));
            let resource: Arc<dyn MemoryResource> = stats.clone();
            let mut raw = RawBuffer::with_resource(nbytes, device.clone(), false, resource);
            let (block, returned) = lent(&data, offset);
            let address = block.as_ptr();
            raw.adopt_host(block).unwrap();
            assert_eq!(raw.state(), BufferState::HostOnly, "{device}");
            assert_eq!(raw.transfer_stats().bytes_moved(), 0);
            assert_eq!(raw.transfer_stats().allocations, 0, "adopting allocates nothing");
            assert_eq!(raw.host_if_valid().unwrap().as_ptr(), address, "the lender's bytes, not a copy");
            assert!(raw.host_if_valid().unwrap() == &data[..]);

            // The device copy is made from the adopted bytes, and a device write comes back.
            raw.sync(Some(&device)).unwrap();
            assert_eq!(raw.state(), BufferState::Synchronized);
            let mut typed = UnifiedBuffer::<u8>::from_raw(&[nbytes], raw).unwrap();
            typed.fill(0x5A).unwrap(); // on the device: its copy is current
            assert_eq!(typed.residency(Location::Host), Residency::Stale, "{device}");
            let mut back = vec![0u8; nbytes];
            typed.copy_to(&mut back).unwrap();
            assert_eq!(typed.residency(Location::Host), Residency::Valid);
            assert!(back.iter().all(|&b| b == 0x5A), "{device}");
            assert_eq!(typed.host().unwrap().as_ptr(), address, "still the lender's bytes");

            assert!(!returned.load(Ordering::SeqCst), "lent until the buffer frees its memory");
            drop(typed);
            assert!(returned.load(Ordering::SeqCst), "given back when the buffer is dropped");
            let counted = stats.statistics();
            assert_eq!(counted.current_bytes, 0, "{device}: {counted:?}");
            let device_bytes = if device.is_zero_copy(nbytes) { 0 } else { nbytes as i64 };
            assert_eq!(counted.total_bytes, device_bytes, "{device}: the resource never saw the host block");
        }
    }
}

#[test]
fn release_memory_gives_the_block_back_and_the_buffer_allocates_its_own_afterwards() {
    for device in common::devices() {
        let data = bytes_of(&pattern(9, 4096));
        let mut raw = RawBuffer::new(data.len(), device.clone(), false);
        let (block, returned) = lent(&data, 5);
        raw.adopt_host(block).unwrap();
        raw.sync(Some(&device)).unwrap();
        raw.release_memory();
        assert!(returned.load(Ordering::SeqCst), "{device}");
        assert_eq!(raw.state(), BufferState::Uninitialized);
        assert!(raw.host_access(lazybuf::coherence::Access::Read).unwrap().iter().all(|&b| b == 0));
        // A second adoption after releasing is allowed.
        raw.release_memory();
        let (block, _) = lent(&data, 2);
        raw.adopt_host(block).unwrap();
        assert!(raw.host_if_valid().unwrap() == &data[..]);
    }
}

#[test]
fn typed_access_refuses_a_misaligned_host_copy_with_an_error() {
    for device in common::devices() {
        let data = bytes_of(&pattern(3, 256));
        let mut raw = RawBuffer::new(data.len(), device.clone(), false);
        let (block, _) = lent(&data, 1);
        raw.adopt_host(block).unwrap();
        let mut buf = UnifiedBuffer::<u32>::from_raw(&[256], raw).unwrap();
        assert!(buf.host_if_valid().is_none(), "no misaligned slice");
        let err = buf.host().unwrap_err().to_string();
        assert!(err.contains("not aligned for uint32") && err.contains("4-byte alignment"), "{err}");
        assert!(buf.host_mut().is_err() && buf.host_overwrite().is_err());
        // Whole-buffer copies work at any alignment, and so does the device copy.
        let mut out = vec![0u32; 256];
        buf.copy_to(&mut out).unwrap();
        assert_eq!(out, pattern(3, 256));
        let view = buf.device_on(&device).unwrap();
        if device.is_zero_copy(data.len()) {
            assert!(view.as_host_slice().is_none(), "{device}: an alias of misaligned memory");
        }
        assert_eq!(buf.to_vec().unwrap(), pattern(3, 256));
    }
}

#[test]
fn adoption_is_refused_with_a_clear_error_and_the_bytes_given_back() {
    let device: Device = lazybuf::default_device().unwrap();
    let data = vec![7u8; 64];
    let given_back = |returned: &AtomicBool| returned.load(Ordering::SeqCst);

    let mut short = RawBuffer::new(65, device.clone(), false);
    let (block, returned) = lent(&data, 1);
    let err = short.adopt_host(block).unwrap_err().to_string();
    assert!(err.contains("at least 65 bytes, got 64"), "{err}");
    assert!(given_back(&returned), "a refused block goes back to its lender");
    assert_eq!(short.state(), BufferState::Uninitialized);

    let mut holding = RawBuffer::new(64, device.clone(), false);
    holding.fill(&[1]).unwrap();
    let (block, returned) = lent(&data, 1);
    let err = holding.adopt_host(block).unwrap_err().to_string();
    assert!(err.contains("holds no memory yet"), "{err}");
    assert!(given_back(&returned));
    assert!(holding.host_if_valid().unwrap().iter().all(|&b| b == 1), "its own data untouched");

    let mut pinned = RawBuffer::new(64, device.clone(), true);
    let (block, returned) = lent(&data, 1);
    let err = pinned.adopt_host(block).unwrap_err().to_string();
    assert!(err.contains("page-locked memory for a pinned buffer"), "{err}");
    assert!(given_back(&returned));
    assert_eq!(pinned.state(), BufferState::Uninitialized);
}
