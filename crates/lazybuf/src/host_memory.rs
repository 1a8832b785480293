//! Host memory blocks: the host copy of a buffer, and the memory a host-aliasing device
//! shares with it.
//!
//! A [`HostMemory`] is always initialized (fresh memory reads as zeros), so it can be viewed
//! as `&[u8]` safely. Small blocks come from the global allocator with cache-line alignment;
//! blocks of 64 KiB and more are anonymous `mmap`s (page-aligned, zeroed lazily by the kernel,
//! so a large allocation costs nothing until it is touched). Pinned blocks are `mlock`ed
//! pages, and backends with their own page-locked memory (CUDA, OpenCL) hand theirs in through
//! [`HostMemory::from_foreign`].
//!
//! What does not live here: which kind of host memory a buffer gets (the backend decides in
//! [`crate::backend::Backend::allocate_host`]).

use std::alloc::{self, Layout};
use std::fmt;
use std::ptr::NonNull;

use crate::error::{Error, Result, RuntimeCode};

/// Blocks this large or larger are mapped pages rather than heap allocations.
const MMAP_THRESHOLD: usize = 64 * 1024;
/// Alignment of heap blocks: a cache line, enough for every element type and for SIMD.
const HEAP_ALIGN: usize = 64;

/// A type with the heap alignment, for well-aligned empty blocks.
#[repr(align(64))]
struct CacheLine;

/// Something that owns foreign host memory and frees it when dropped.
pub trait ForeignHostMemory: Send + Sync {}

enum Owner {
    /// Zero bytes: nothing allocated.
    Empty,
    /// From the global allocator with this layout.
    Heap(Layout),
    /// An anonymous mapping of this many bytes (locked when the block is pinned).
    Mapped(usize),
    /// Owned by a runtime; dropping the box frees it.
    Foreign(#[allow(dead_code)] Box<dyn ForeignHostMemory>),
}

/// A block of host memory, zero-initialized when new.
pub struct HostMemory {
    ptr: NonNull<u8>,
    len: usize,
    pinned: bool,
    owner: Owner,
}

// SAFETY: HostMemory owns its block exclusively (no other handle to the bytes exists), and all
// access to the bytes goes through &self / &mut self, so moving or sharing it between threads
// is as safe as for a Box<[u8]>. Foreign owners are required to be Send + Sync.
unsafe impl Send for HostMemory {}
// SAFETY: see Send; &HostMemory only permits reads of the bytes.
unsafe impl Sync for HostMemory {}

impl HostMemory {
    /// Allocates `len` zeroed, pageable bytes.
    pub fn allocate(len: usize) -> Result<HostMemory> {
        if len == 0 {
            return Ok(HostMemory {
                ptr: NonNull::<CacheLine>::dangling().cast(),
                len,
                pinned: false,
                owner: Owner::Empty,
            });
        }
        if len >= MMAP_THRESHOLD {
            return Self::map(len, false);
        }
        let layout = Layout::from_size_align(len, HEAP_ALIGN).map_err(|_| oom(len, None))?;
        // SAFETY: layout has a non-zero size (len > 0 checked above).
        let ptr = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).ok_or_else(|| oom(len, None))?;
        Ok(HostMemory { ptr, len, pinned: false, owner: Owner::Heap(layout) })
    }

    /// Allocates `len` zeroed bytes on whole pages and locks them in RAM (`mlock`). Fails with
    /// [`Error::PinningFailed`] when the lock is refused (for example by `RLIMIT_MEMLOCK`);
    /// it never hands back unlocked memory.
    pub fn allocate_locked(len: usize) -> Result<HostMemory> {
        if len == 0 {
            let mut empty = Self::allocate(0)?;
            empty.pinned = true;
            return Ok(empty);
        }
        Self::map(len, true)
    }

    fn map(len: usize, lock: bool) -> Result<HostMemory> {
        // SAFETY: an anonymous private mapping with a null hint has no preconditions; the
        // result is checked against MAP_FAILED below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(oom(len, Some(RuntimeCode::Os(errno()))));
        }
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| oom(len, None))?;
        if lock {
            // SAFETY: [ptr, ptr + len) is the mapping just created.
            if unsafe { libc::mlock(ptr.as_ptr().cast(), len) } != 0 {
                let code = errno();
                // SAFETY: unmapping the mapping created above, which nothing else references.
                unsafe { libc::munmap(ptr.as_ptr().cast(), len) };
                return Err(Error::PinningFailed {
                    requested: len,
                    reason: format!(
                        "mlock refused: {} (raise RLIMIT_MEMLOCK, `ulimit -l`, or allocate unpinned)",
                        std::io::Error::from_raw_os_error(code)
                    ),
                });
            }
        }
        Ok(HostMemory { ptr, len, pinned: lock, owner: Owner::Mapped(len) })
    }

    /// Wraps host memory that a runtime allocated.
    ///
    /// # Safety
    /// 1. `ptr` is valid for reads and writes of `len` bytes, all initialized, until `owner`
    ///    is dropped.
    /// 2. Nothing else reads or writes those bytes while the `HostMemory` exists.
    /// 3. `pinned` is true only if the memory really is page-locked.
    pub unsafe fn from_foreign(
        ptr: NonNull<u8>,
        len: usize,
        pinned: bool,
        owner: Box<dyn ForeignHostMemory>,
    ) -> HostMemory {
        HostMemory { ptr, len, pinned, owner: Owner::Foreign(owner) }
    }

    /// The size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the block is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the block is pinned: `mlock`ed, or a runtime's pinned host memory (see
    /// [`crate::UnifiedBuffer::is_pinned`]).
    pub fn is_pinned(&self) -> bool {
        self.pinned
    }

    /// The first byte's address (for runtimes that alias this memory).
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// The first byte's address, for writing.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialized bytes while self lives (HostMemory's
        // invariant), and &self forbids concurrent writes through this type.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, for writing.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in as_slice, and &mut self makes this the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for HostMemory {
    fn drop(&mut self) {
        match self.owner {
            Owner::Empty | Owner::Foreign(_) => {}
            // SAFETY: ptr came from alloc_zeroed with exactly this layout.
            Owner::Heap(layout) => unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) },
            Owner::Mapped(len) => {
                // SAFETY: ptr/len is the mapping made in `map`; munmap also drops any lock.
                // Its status is ignored: drop must not panic, and a failed unmap only leaks.
                unsafe { libc::munmap(self.ptr.as_ptr().cast(), len) };
            }
        }
    }
}

impl fmt::Debug for HostMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostMemory").field("len", &self.len).field("pinned", &self.pinned).finish()
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn oom(len: usize, code: Option<RuntimeCode>) -> Error {
    Error::OutOfMemory { device: "host".into(), requested: len, code }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_memory_is_zero_and_aligned() {
        for len in [0, 1, 100, MMAP_THRESHOLD - 1, MMAP_THRESHOLD, 1 << 20] {
            let mut m = HostMemory::allocate(len).unwrap();
            assert_eq!(m.len(), len);
            assert!(m.as_slice().iter().all(|&b| b == 0));
            assert_eq!(m.as_ptr() as usize % HEAP_ALIGN, 0);
            m.as_mut_slice().fill(7);
            assert!(m.as_slice().iter().all(|&b| b == 7));
            assert!(!m.is_pinned());
        }
    }

    #[test]
    fn impossible_sizes_are_out_of_memory() {
        let err = HostMemory::allocate(isize::MAX as usize).unwrap_err();
        assert!(err.is_out_of_memory(), "{err}");
    }

    #[test]
    fn locked_memory_is_pinned_or_a_clear_error() {
        match HostMemory::allocate_locked(1 << 16) {
            Ok(m) => assert!(m.is_pinned()),
            Err(Error::PinningFailed { reason, .. }) => assert!(reason.contains("mlock")),
            Err(other) => panic!("unexpected error {other}"),
        }
    }
}

/// Fills `bytes` with repetitions of `pattern` (whose length divides `bytes.len()`), by
/// doubling copies so it runs at memcpy speed for any pattern length.
pub(crate) fn fill_pattern(bytes: &mut [u8], pattern: &[u8]) {
    if pattern.len() == 1 || pattern.iter().all(|&b| b == pattern[0]) {
        bytes.fill(pattern.first().copied().unwrap_or(0));
        return;
    }
    let n = pattern.len().min(bytes.len());
    bytes[..n].copy_from_slice(&pattern[..n]);
    let mut filled = n;
    while filled < bytes.len() {
        let chunk = filled.min(bytes.len() - filled);
        bytes.copy_within(..chunk, filled);
        filled += chunk;
    }
}

#[cfg(test)]
mod fill_tests {
    #[test]
    fn fills_any_pattern() {
        let mut b = vec![0u8; 24];
        super::fill_pattern(&mut b, &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&b[16..], &[1, 2, 3, 4, 5, 6, 7, 8]);
        super::fill_pattern(&mut b, &[9, 9]);
        assert!(b.iter().all(|&x| x == 9));
        super::fill_pattern(&mut [], &[1, 2]);
    }
}
