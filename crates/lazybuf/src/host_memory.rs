//! Host memory blocks: the host copy of a buffer, and the memory a host-aliasing device
//! shares with it.
//!
//! A [`HostMemory`] is always initialized (fresh memory reads as zeros), so it can be viewed
//! as `&[u8]` safely. Small blocks come from the global allocator with cache-line alignment;
//! blocks of 64 KiB and more are anonymous `mmap`s (page-aligned, zeroed lazily by the kernel,
//! so a large allocation costs nothing until it is touched); blocks of 4 MiB and more are
//! aligned to 2 MiB and `madvise(MADV_HUGEPAGE)`d, so first touches fault once per huge page
//! where the kernel has transparent huge pages. Pinned blocks are `mlock`ed pages, and
//! backends with their own page-locked memory (CUDA, OpenCL) hand theirs in through
//! [`HostMemory::from_foreign`]. A backend may also register a block's pages with its driver
//! later ([`HostMemory::register`]).
//!
//! **Adopted memory.** [`HostMemory::adopt`] wraps bytes another owner lends for the block's
//! lifetime (a frame distributed received off the wire): no copy, any alignment. Such a block
//! is never pooled for reuse ([`HostMemory::is_adopted`]); it goes back to its owner when
//! dropped, and no runtime page-locks it (its pages may hold the owner's other data).
//!
//! **Requests larger than the machine.** A request for more bytes than the machine's physical
//! memory plus swap is refused up front with [`Error::OutOfMemory`], whatever the kernel's
//! overcommit setting: with overcommit a huge `mmap` succeeds and the process dies later,
//! touching it.
//!
//! What does not live here: which kind of host memory a buffer gets (the backend decides in
//! [`crate::backend::Backend::allocate_host`]).

use std::alloc::{self, Layout};
use std::fmt;
use std::ptr::NonNull;
use std::sync::OnceLock;

use crate::error::{BackendKind, Error, Result, RuntimeCode};

/// Blocks this large or larger are mapped pages rather than heap allocations.
const MMAP_THRESHOLD: usize = 64 * 1024;
/// Blocks this large or larger are aligned to huge pages and advised to use them.
const HUGE_THRESHOLD: usize = 4 << 20;
/// The huge page size on x86-64 and most aarch64 kernels.
const HUGE_PAGE: usize = 2 << 20;
/// Alignment of heap blocks: a cache line, enough for every element type and for SIMD.
pub(crate) const HEAP_ALIGN: usize = 64;

/// A type with the heap alignment, for well-aligned empty blocks.
#[repr(align(64))]
struct CacheLine;

/// Something that owns foreign host memory (or a driver's registration of it) and releases
/// it when dropped.
pub trait ForeignHostMemory: Send + Sync {}

/// How a block's pages are kept in RAM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pinning {
    /// Ordinary pageable memory.
    Pageable,
    /// `mlock`ed pages: resident, but not known to any device runtime.
    Locked,
    /// Page-locked memory allocated by a device runtime (`cuMemHostAlloc`, a mapped
    /// `CL_MEM_ALLOC_HOST_PTR` buffer): that runtime's DMA engines use it directly.
    Runtime(BackendKind),
    /// Pageable memory whose pages a device runtime has page-locked and registered
    /// (`cuMemHostRegister`): that runtime's DMA engines use it directly.
    Registered(BackendKind),
}

impl Pinning {
    /// Whether the pages are page-locked at all.
    pub fn is_pinned(self) -> bool {
        self != Pinning::Pageable
    }

    /// Whether `backend`'s DMA engines can use the memory directly.
    pub fn is_dma_ready_for(self, backend: BackendKind) -> bool {
        matches!(self, Pinning::Runtime(b) | Pinning::Registered(b) if b == backend)
    }
}

enum Owner {
    /// Zero bytes: nothing allocated.
    Empty,
    /// From the global allocator with this layout.
    Heap(Layout),
    /// An anonymous mapping of this many bytes (locked when the block is pinned).
    Mapped(usize),
    /// Owned by a runtime; dropping the box frees it.
    Foreign(#[allow(dead_code)] Box<dyn ForeignHostMemory>),
    /// Lent by another owner for the block's lifetime; dropping the box gives it back.
    Adopted(#[allow(dead_code)] Box<dyn ForeignHostMemory>),
}

/// A block of host memory, zero-initialized when new.
pub struct HostMemory {
    ptr: NonNull<u8>,
    len: usize,
    pinning: Pinning,
    /// Whether every byte is still zero (fresh, and never handed out for writing since).
    known_zero: bool,
    /// Transfers this block took part in (backends decide on registration by it).
    transfers: u32,
    /// A driver's registration of the pages; dropped (unregistered) before the memory.
    registration: Option<Box<dyn ForeignHostMemory>>,
    owner: Owner,
}

// SAFETY: HostMemory owns its block exclusively (no other handle to the bytes exists), and all
// access to the bytes goes through &self / &mut self, so moving or sharing it between threads
// is as safe as for a Box<[u8]>. Foreign owners and registrations are required to be
// Send + Sync.
unsafe impl Send for HostMemory {}
// SAFETY: see Send; &HostMemory only permits reads of the bytes.
unsafe impl Sync for HostMemory {}

impl HostMemory {
    fn new(ptr: NonNull<u8>, len: usize, pinning: Pinning, owner: Owner) -> HostMemory {
        HostMemory { ptr, len, pinning, known_zero: true, transfers: 0, registration: None, owner }
    }

    /// Allocates `len` zeroed, pageable bytes.
    pub fn allocate(len: usize) -> Result<HostMemory> {
        if len == 0 {
            return Ok(Self::new(
                NonNull::<CacheLine>::dangling().cast(),
                0,
                Pinning::Pageable,
                Owner::Empty,
            ));
        }
        check_machine_size(len)?;
        if len >= MMAP_THRESHOLD {
            return Self::map(len, false);
        }
        let layout = Layout::from_size_align(len, HEAP_ALIGN).map_err(|_| oom(len, None))?;
        // SAFETY: layout has a non-zero size (len > 0 checked above).
        let ptr = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).ok_or_else(|| oom(len, None))?;
        Ok(Self::new(ptr, len, Pinning::Pageable, Owner::Heap(layout)))
    }

    /// Allocates `len` zeroed bytes on whole pages and locks them in RAM (`mlock`). Fails with
    /// [`Error::PinningFailed`] when the lock is refused (for example by `RLIMIT_MEMLOCK`);
    /// it never hands back unlocked memory.
    pub fn allocate_locked(len: usize) -> Result<HostMemory> {
        if len == 0 {
            let mut empty = Self::allocate(0)?;
            empty.pinning = Pinning::Locked;
            return Ok(empty);
        }
        check_machine_size(len)?;
        Self::map(len, true)
    }

    fn map(len: usize, lock: bool) -> Result<HostMemory> {
        let huge = len >= HUGE_THRESHOLD;
        // Huge blocks map one huge page more, to cut an aligned run out of the mapping.
        let mapped = if huge { len.checked_add(HUGE_PAGE).ok_or_else(|| oom(len, None))? } else { len };
        // SAFETY: an anonymous private mapping with a null hint has no preconditions; the
        // result is checked against MAP_FAILED below.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(oom(len, Some(RuntimeCode::Os(errno()))));
        }
        let mut start = raw.cast::<u8>();
        if huge {
            let head = start.align_offset(HUGE_PAGE);
            let tail = mapped - head - len;
            // SAFETY: [raw, raw + mapped) is the mapping just made; the head and tail runs
            // lie inside it and nothing references them. Failed unmaps only leak address space.
            unsafe {
                if head > 0 {
                    libc::munmap(raw, head);
                }
                start = start.add(head);
                if tail > 0 {
                    libc::munmap(start.add(len).cast(), tail);
                }
                // Advice only: kernels without transparent huge pages answer EINVAL.
                libc::madvise(start.cast(), len, libc::MADV_HUGEPAGE);
            }
        }
        let ptr = NonNull::new(start).ok_or_else(|| oom(len, None))?;
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
        let pinning = if lock { Pinning::Locked } else { Pinning::Pageable };
        Ok(Self::new(ptr, len, pinning, Owner::Mapped(len)))
    }

    /// Wraps host memory that a runtime allocated.
    ///
    /// # Safety
    /// 1. `ptr` is valid for reads and writes of `len` bytes, all initialized, until `owner`
    ///    is dropped.
    /// 2. Nothing else reads or writes those bytes while the `HostMemory` exists.
    /// 3. `pinning` says truly how the pages are kept (page-locked only if they are).
    /// 4. `known_zero` is true only if every byte is zero.
    pub unsafe fn from_foreign(
        ptr: NonNull<u8>,
        len: usize,
        pinning: Pinning,
        known_zero: bool,
        owner: Box<dyn ForeignHostMemory>,
    ) -> HostMemory {
        let mut block = Self::new(ptr, len, pinning, Owner::Foreign(owner));
        block.known_zero = known_zero;
        block
    }

    /// Adopts `len` pageable bytes at `ptr` that `owner` lends until it is dropped (see the
    /// module docs): no copy, at any alignment. The block is never pooled for reuse.
    ///
    /// # Safety
    /// 1. `ptr` is valid for reads and writes of `len` bytes, all initialized, until `owner`
    ///    is dropped.
    /// 2. Nothing else reads or writes those bytes while the `HostMemory` exists.
    pub unsafe fn adopt(ptr: NonNull<u8>, len: usize, owner: Box<dyn ForeignHostMemory>) -> HostMemory {
        let mut block = Self::new(ptr, len, Pinning::Pageable, Owner::Adopted(owner));
        block.known_zero = false;
        block
    }

    /// Whether the block is adopted memory ([`HostMemory::adopt`]): lent by another owner,
    /// at any alignment, never pooled for reuse and never page-locked by a runtime.
    pub fn is_adopted(&self) -> bool {
        matches!(self.owner, Owner::Adopted(_))
    }

    /// Records that a device runtime registered this block's pages (page-locked them for its
    /// DMA engines); `registration` undoes that when dropped, before the memory is freed.
    ///
    /// # Safety
    /// The pages really are registered with `backend` until `registration` is dropped.
    pub unsafe fn register(&mut self, backend: BackendKind, registration: Box<dyn ForeignHostMemory>) {
        self.registration = Some(registration);
        self.pinning = Pinning::Registered(backend);
    }

    /// The size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the block is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the block is page-locked: `mlock`ed, or a runtime's pinned host memory, or
    /// registered with a runtime (see [`crate::UnifiedBuffer::is_pinned`]).
    pub fn is_pinned(&self) -> bool {
        self.pinning.is_pinned()
    }

    /// How the pages are kept in RAM.
    pub fn pinning(&self) -> Pinning {
        self.pinning
    }

    /// Whether every byte is known to be zero (a fresh block nobody has written).
    pub fn is_known_zero(&self) -> bool {
        self.known_zero
    }

    /// Forgets that the block is all zeros: its bytes are about to be written.
    pub fn mark_written(&mut self) {
        self.known_zero = false;
    }

    /// Counts one more transfer of this block; returns the new count.
    pub fn count_transfer(&mut self) -> u32 {
        self.transfers = self.transfers.saturating_add(1);
        self.transfers
    }

    /// The first byte's address (for runtimes that alias this memory).
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// The first byte's address, for writing.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.known_zero = false;
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
        self.known_zero = false;
        self.bytes_mut()
    }

    /// The bytes, mutably, without forgetting that they are all zeros: for callers that hand
    /// them out for reading only.
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in as_slice, and &mut self makes this the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for HostMemory {
    fn drop(&mut self) {
        // Unregister the pages while the memory is still mapped.
        drop(self.registration.take());
        match self.owner {
            Owner::Empty | Owner::Foreign(_) | Owner::Adopted(_) => {}
            // SAFETY: ptr came from alloc_zeroed with exactly this layout.
            Owner::Heap(layout) => unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) },
            Owner::Mapped(len) => {
                // SAFETY: ptr/len is the mapping made in `map` (after its trim); munmap also
                // drops any lock. Its status is ignored: drop must not panic, and a failed
                // unmap only leaks.
                unsafe { libc::munmap(self.ptr.as_ptr().cast(), len) };
            }
        }
    }
}

impl fmt::Debug for HostMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostMemory").field("len", &self.len).field("pinning", &self.pinning).finish()
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn oom(len: usize, code: Option<RuntimeCode>) -> Error {
    Error::OutOfMemory { device: "host".into(), requested: len, code }
}

/// The machine's physical memory plus swap, in bytes (`usize::MAX` where unknown).
pub fn machine_memory() -> usize {
    static TOTAL: OnceLock<usize> = OnceLock::new();
    *TOTAL.get_or_init(|| {
        // SAFETY: sysinfo fills the zeroed struct it is given; no other precondition.
        let mut info: libc::sysinfo = unsafe { std::mem::zeroed() };
        // SAFETY: info is a valid out-pointer.
        if unsafe { libc::sysinfo(&mut info) } != 0 {
            return usize::MAX;
        }
        let unit = u64::from(info.mem_unit.max(1));
        let total = (info.totalram as u64).saturating_add(info.totalswap as u64).saturating_mul(unit);
        usize::try_from(total).unwrap_or(usize::MAX)
    })
}

/// Refuses a request no allocation on this machine can back (see the module docs).
fn check_machine_size(len: usize) -> Result<()> {
    let total = machine_memory();
    if len > total {
        return Err(Error::OutOfMemory {
            device: format!("host (it has {total} bytes of memory and swap in all)"),
            requested: len,
            code: None,
        });
    }
    Ok(())
}

/// Copies of this many bytes or more are split over several threads by [`copy_bytes`].
pub const PARALLEL_COPY_MIN: usize = 2 << 20;
/// The least each thread of a split copy moves.
const PARALLEL_COPY_PIECE: usize = 1 << 20;
/// The most threads one copy uses.
const PARALLEL_COPY_THREADS: usize = 8;

/// Copies `src` into `dst` (equal lengths), on several threads when the copy is large.
///
/// One core's `memcpy` moves 6-12 GB/s on the servers GPUs sit in, a fifth of what a PCIe 5
/// x16 link does, so host-side copies of large arrays (a host write of a whole buffer, a
/// `to_vec`, Python's `to_numpy`) would otherwise cost several times their DMA. Copies of
/// [`PARALLEL_COPY_MIN`] and more are cut into pieces of at least 1 MiB, one per thread, up to
/// the machine's parallelism and at most 8 threads (the calling thread takes one piece);
/// smaller copies, and machines with one core, copy on the calling thread. It is
/// [`copy_bytes_raw`] on the slices' addresses, so it stays correct even where a caller's two
/// slices share bytes (which safe code cannot make, but adopted memory and user pointers can).
///
/// # Panics
/// If the lengths differ (as `copy_from_slice`).
pub fn copy_bytes(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy_bytes: lengths differ");
    // SAFETY: both slices are valid for their (equal) length; copy_bytes_raw allows overlap.
    unsafe { copy_bytes_raw(dst.as_mut_ptr(), src.as_ptr(), src.len()) }
}

/// Copies `len` bytes from `src` to `dst` with `memmove` semantics: the result is what a copy
/// through a temporary would give, however the two ranges overlap. Disjoint ranges are copied
/// as [`copy_bytes`] describes (several threads when large); overlapping ranges are copied on
/// the calling thread by one `memmove` (`ptr::copy`), since pieces copied in parallel would
/// read bytes another piece has already overwritten.
///
/// Use it for every copy between memory whose addresses come from outside (a user's array,
/// an adopted frame, a foreign pointer): such ranges may overlap, and then they must not be
/// turned into a `&mut [u8]` and a `&[u8]` at all.
///
/// # Safety
/// `src` is valid for reads and `dst` for writes of `len` bytes, and no other thread writes
/// either range during the call.
// Not inlined: a caller's slice arguments would give the optimizer `noalias` facts that could
// turn the overlap check or the `memmove` into a `memcpy`.
#[inline(never)]
pub unsafe fn copy_bytes_raw(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: forwarded contract.
    unsafe { copy_bytes_with(dst, src, len, copy_threads(len)) }
}

/// Whether `[a, a + len)` and `[b, b + len)` share a byte.
fn overlaps(a: usize, b: usize, len: usize) -> bool {
    len > 0 && a < b.saturating_add(len) && b < a.saturating_add(len)
}

/// [`copy_bytes_raw`] on at most `threads` threads (for disjoint ranges).
///
/// # Safety
/// As [`copy_bytes_raw`].
unsafe fn copy_bytes_with(dst: *mut u8, src: *const u8, len: usize, threads: usize) {
    if len == 0 || std::ptr::eq(dst.cast_const(), src) {
        return;
    }
    if threads <= 1 || overlaps(dst as usize, src as usize, len) {
        // SAFETY: both ranges are valid for len bytes (the caller's contract); ptr::copy
        // allows them to overlap.
        unsafe { std::ptr::copy(src, dst, len) };
        return;
    }
    // Pieces of whole cache lines, so two threads never write one line.
    let piece = len.div_ceil(threads).next_multiple_of(HEAP_ALIGN);
    // Addresses as integers: raw pointers are not Send.
    let (dst, src) = (dst as usize, src as usize);
    let copy_piece = move |offset: usize| {
        let n = piece.min(len - offset);
        // SAFETY: [offset, offset + n) lies inside both ranges, which are valid for len bytes
        // and do not overlap (checked above), and each piece is written by one thread only.
        unsafe { std::ptr::copy_nonoverlapping((src + offset) as *const u8, (dst + offset) as *mut u8, n) }
    };
    std::thread::scope(|scope| {
        for offset in (piece..len).step_by(piece) {
            scope.spawn(move || copy_piece(offset));
        }
        copy_piece(0);
    });
}

/// How many threads [`copy_bytes`] uses for `len` bytes.
fn copy_threads(len: usize) -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    if len < PARALLEL_COPY_MIN {
        return 1;
    }
    let cores = *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    (len / PARALLEL_COPY_PIECE).min(cores).clamp(1, PARALLEL_COPY_THREADS)
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
mod tests {
    #[test]
    fn copy_bytes_copies_every_byte_at_every_size() {
        for len in [0, 1, 63, 4096, super::PARALLEL_COPY_MIN - 1, super::PARALLEL_COPY_MIN, (9 << 20) + 13] {
            let src: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let mut dst = vec![0xff; len];
            super::copy_bytes(&mut dst, &src);
            assert!(dst == src, "len {len}");
        }
    }

    /// Overlapping copies, both directions, at sizes the split copy would cut into pieces,
    /// with 2 to 8 threads whatever this machine's core count: the result is `memmove`'s
    /// (a copy through a temporary), as NumPy's `a[...] = b` gives.
    #[test]
    fn overlapping_copies_are_memmove_at_every_size_and_thread_count() {
        let len = (16 << 20) + 4099;
        let total = len + (3 << 20);
        let original: Vec<u8> = (0..total).map(|i: usize| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
        for shift in [1usize, 63, 4096, 1 << 20, (1 << 20) + 17, 3 << 20] {
            for threads in [2, 3, 8] {
                for forward in [true, false] {
                    let mut bytes = original.clone();
                    let (dst, src) = if forward { (shift, 0) } else { (0, shift) };
                    let mut expected = original.clone();
                    expected.copy_within(src..src + len, dst);
                    let base = bytes.as_mut_ptr();
                    // SAFETY: both ranges lie inside `bytes` (shift + len <= total), which
                    // nothing else touches.
                    unsafe { super::copy_bytes_with(base.add(dst), base.add(src), len, threads) };
                    assert!(
                        bytes == expected,
                        "shift {shift}, {threads} threads, dst {} src: first wrong byte {:?}",
                        if forward { "after" } else { "before" },
                        bytes.iter().zip(&expected).position(|(a, b)| a != b)
                    );
                }
            }
        }
        // The public entry point, on this machine's thread count.
        let mut bytes = original.clone();
        let mut expected = original.clone();
        expected.copy_within(0..len, 1 << 20);
        // SAFETY: as above.
        unsafe { super::copy_bytes_raw(bytes.as_mut_ptr().add(1 << 20), bytes.as_ptr(), len) };
        assert!(bytes == expected);
    }

    #[test]
    fn disjoint_copies_split_over_threads_copy_every_byte() {
        for threads in [2, 3, 8] {
            for len in [super::PARALLEL_COPY_MIN, (9 << 20) + 13] {
                let src: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
                let mut dst = vec![0xff; len];
                // SAFETY: two distinct vectors of len bytes.
                unsafe { super::copy_bytes_with(dst.as_mut_ptr(), src.as_ptr(), len, threads) };
                assert!(dst == src, "len {len}, {threads} threads");
            }
        }
    }

    #[test]
    #[should_panic(expected = "lengths differ")]
    fn copy_bytes_refuses_different_lengths() {
        super::copy_bytes(&mut [0; 3], &[0; 4]);
    }

    use super::*;

    #[test]
    fn fresh_memory_is_zero_and_aligned() {
        for len in [0, 1, 100, MMAP_THRESHOLD - 1, MMAP_THRESHOLD, 1 << 20, HUGE_THRESHOLD + 12345] {
            let mut m = HostMemory::allocate(len).unwrap();
            assert_eq!(m.len(), len);
            assert!(m.is_known_zero());
            assert!(m.as_slice().iter().all(|&b| b == 0));
            assert_eq!(m.as_ptr() as usize % HEAP_ALIGN, 0);
            if len >= HUGE_THRESHOLD {
                assert_eq!(m.as_ptr() as usize % HUGE_PAGE, 0, "huge blocks start on a huge page");
            }
            m.as_mut_slice().fill(7);
            assert!(!m.is_known_zero());
            assert!(m.as_slice().iter().all(|&b| b == 7));
            assert!(!m.is_pinned());
        }
    }

    struct Lender(Vec<u8>, std::sync::Arc<std::sync::atomic::AtomicBool>);
    impl ForeignHostMemory for Lender {}
    impl Drop for Lender {
        fn drop(&mut self) {
            self.1.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }

    #[test]
    fn adopted_memory_is_the_lenders_bytes_at_any_alignment_until_dropped() {
        let returned = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut lender = Lender((0..100u8).collect(), returned.clone());
        let ptr = NonNull::new(lender.0.as_mut_ptr().wrapping_add(3)).unwrap();
        // SAFETY: the 90 bytes at offset 3 live in the lender's Vec, which the block owns (the
        // Vec's heap buffer does not move when the lender does) and nothing else touches.
        let mut block = unsafe { HostMemory::adopt(ptr, 90, Box::new(lender)) };
        assert!(block.is_adopted() && !block.is_known_zero() && !block.is_pinned());
        assert_eq!(block.pinning(), Pinning::Pageable);
        assert_eq!(block.as_slice()[0], 3, "no copy: the lender's bytes");
        assert_eq!(block.as_ptr(), ptr.as_ptr().cast_const());
        block.as_mut_slice()[89] = 7;
        assert!(!returned.load(std::sync::atomic::Ordering::SeqCst));
        drop(block);
        assert!(returned.load(std::sync::atomic::Ordering::SeqCst), "dropping gives the bytes back");
        assert!(!HostMemory::allocate(10).unwrap().is_adopted());
    }

    #[test]
    fn impossible_sizes_are_out_of_memory() {
        let err = HostMemory::allocate(isize::MAX as usize).unwrap_err();
        assert!(err.is_out_of_memory(), "{err}");
    }

    #[test]
    fn more_than_the_machine_is_refused_up_front_whatever_the_overcommit_setting() {
        let beyond = machine_memory().saturating_add(1);
        if beyond == usize::MAX {
            return;
        }
        for result in [HostMemory::allocate(beyond), HostMemory::allocate_locked(beyond)] {
            let err = result.unwrap_err();
            assert!(err.is_out_of_memory(), "{err}");
            assert!(err.to_string().contains(&format!("could not allocate {beyond} bytes")), "{err}");
            assert!(err.to_string().contains("memory and swap"), "{err}");
        }
    }

    #[test]
    fn locked_memory_is_pinned_or_a_clear_error() {
        match HostMemory::allocate_locked(1 << 16) {
            Ok(m) => assert_eq!(m.pinning(), Pinning::Locked),
            Err(Error::PinningFailed { reason, .. }) => assert!(reason.contains("mlock")),
            Err(other) => panic!("unexpected error {other}"),
        }
    }

    #[test]
    fn fills_any_pattern() {
        let mut b = vec![0u8; 24];
        fill_pattern(&mut b, &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&b[16..], &[1, 2, 3, 4, 5, 6, 7, 8]);
        fill_pattern(&mut b, &[9, 9]);
        assert!(b.iter().all(|&x| x == 9));
        fill_pattern(&mut [], &[1, 2]);
    }
}
