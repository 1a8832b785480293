//! Host memory blocks: the host copy of a buffer, and the memory a host-aliasing device
//! shares with it.
//!
//! A [`HostMemory`] is always initialized (fresh memory reads as zeros), so it can be viewed
//! as `&[u8]` safely. Small blocks come from the global allocator with cache-line alignment;
//! blocks of 64 KiB and more are whole pages from the operating system (page-aligned, zeroed
//! lazily by the kernel, so a large allocation costs nothing until it is touched): anonymous
//! `mmap`s on Linux and macOS, `VirtualAlloc` on Windows. On Unix, blocks of 4 MiB and more
//! are aligned to 2 MiB, and on Linux `madvise(MADV_HUGEPAGE)`d, so first touches fault once
//! per huge page where the kernel has transparent huge pages (Windows' large pages need a
//! privilege ordinary processes lack, so Windows blocks are page-aligned only). Pinned blocks
//! are locked pages (`mlock` on Unix; `VirtualLock` on Windows, after growing the process's
//! working set by the block's size, which Windows requires), and backends with their own
//! page-locked memory (CUDA, OpenCL) hand theirs in through [`HostMemory::from_foreign`]. A
//! backend may also register a block's pages with its driver later ([`HostMemory::register`]).
//!
//! The macOS and Windows paths (the `os` module's other halves) are compiled and linted for
//! those targets by `scripts/test.sh`, but have not run: CI has Linux machines only.
//!
//! **Adopted memory.** [`HostMemory::adopt`] wraps bytes another owner lends for the block's
//! lifetime (a frame distributed received off the wire): no copy, any alignment. Such a block
//! is never pooled for reuse ([`HostMemory::is_adopted`]); it goes back to its owner when
//! dropped, and no runtime page-locks it (its pages may hold the owner's other data).
//!
//! **Requests larger than the machine.** A request for more bytes than the machine's physical
//! memory plus swap is refused up front with [`Error::OutOfMemory`], whatever the kernel's
//! overcommit setting: with overcommit a huge `mmap` succeeds and the process dies later,
//! touching it. "Physical memory plus swap" is `sysinfo` on Linux, `hw.memsize` plus
//! `vm.swapusage` on macOS (the swap files that exist now), and the commit limit
//! (`GlobalMemoryStatusEx`'s `ullTotalPageFile`: RAM plus page files) on Windows.
//!
//! What does not live here: which kind of host memory a buffer gets (the backend decides in
//! [`crate::backend::Runtime::allocate`]).

use std::alloc::{self, Layout};
use std::fmt;
use std::ptr::NonNull;

use crate::backend::fork::ForkAwareOnce;
use crate::error::{BackendKind, Error, Result, RuntimeCode};

/// Blocks this large or larger are mapped pages rather than heap allocations.
const MMAP_THRESHOLD: usize = 64 * 1024;
/// Blocks this large or larger are aligned to huge pages and advised to use them (Unix).
#[cfg_attr(not(unix), allow(dead_code))]
const HUGE_THRESHOLD: usize = 4 << 20;
/// The huge page size on x86-64 and most aarch64 kernels.
#[cfg_attr(not(unix), allow(dead_code))]
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
    /// Whole pages from the operating system (`os::map`), locked (`os::lock`) or not.
    Mapped {
        /// The block's length in bytes.
        len: usize,
        /// Whether `os::lock` locked the pages (Windows gives the working set back on free).
        locked: bool,
    },
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
        let ptr = os::map(len).map_err(|code| oom(len, Some(RuntimeCode::Os(code))))?;
        if lock {
            // SAFETY: [ptr, ptr + len) is the block just mapped, which nothing else references.
            if let Err(reason) = unsafe { os::lock(ptr, len) } {
                // SAFETY: the block just mapped (not locked), which nothing references.
                unsafe { os::unmap(ptr, len, false) };
                return Err(Error::PinningFailed { requested: len, reason });
            }
        }
        let pinning = if lock { Pinning::Locked } else { Pinning::Pageable };
        Ok(Self::new(ptr, len, pinning, Owner::Mapped { len, locked: lock }))
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
            Owner::Mapped { len, locked } => {
                // SAFETY: ptr/len is the block `os::map` made in `map`, locked by `os::lock`
                // exactly when `locked`; the block is being dropped, so nothing references it.
                unsafe { os::unmap(self.ptr, len, locked) };
            }
        }
    }
}

impl fmt::Debug for HostMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostMemory").field("len", &self.len).field("pinning", &self.pinning).finish()
    }
}

fn oom(len: usize, code: Option<RuntimeCode>) -> Error {
    Error::OutOfMemory { device: "host".into(), requested: len, code }
}

/// The operating system's side of host memory: whole-page blocks, page locking and memory
/// figures, one implementation per system family (Unix: Linux and macOS; Windows).
#[cfg(unix)]
mod os {
    use std::ptr::NonNull;

    use super::{HUGE_PAGE, HUGE_THRESHOLD};

    /// The calling thread's `errno`.
    fn errno() -> i32 {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
    }

    /// Maps `len` (> 0) zeroed, page-aligned bytes of anonymous memory; blocks of
    /// [`HUGE_THRESHOLD`] and more start on a [`HUGE_PAGE`] boundary and, on Linux, are advised
    /// to use transparent huge pages. The error is the `errno`.
    pub(super) fn map(len: usize) -> Result<NonNull<u8>, i32> {
        let huge = len >= HUGE_THRESHOLD;
        // Huge blocks map one huge page more, to cut an aligned run out of the mapping.
        let mapped = if huge { len.checked_add(HUGE_PAGE).ok_or(libc::ENOMEM)? } else { len };
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
            return Err(errno());
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
                #[cfg(any(target_os = "linux", target_os = "android"))]
                libc::madvise(start.cast(), len, libc::MADV_HUGEPAGE);
            }
        }
        NonNull::new(start).ok_or(libc::ENOMEM)
    }

    /// Unmaps a block; `munmap` also drops a lock. Its status is ignored: callers drop the
    /// block (and must not panic), and a failed unmap only leaks.
    ///
    /// # Safety
    /// `[ptr, ptr + len)` is a block [`map`] returned, not unmapped yet, that nothing
    /// references any more.
    pub(super) unsafe fn unmap(ptr: NonNull<u8>, len: usize, _locked: bool) {
        // SAFETY: the caller's contract: the whole mapping, referenced by nothing.
        unsafe { libc::munmap(ptr.as_ptr().cast(), len) };
    }

    /// Locks a block's pages in RAM (`mlock`); the error says why not.
    ///
    /// # Safety
    /// `[ptr, ptr + len)` is a block [`map`] returned and not unmapped yet.
    pub(super) unsafe fn lock(ptr: NonNull<u8>, len: usize) -> Result<(), String> {
        // SAFETY: the caller's contract: mapped memory of this process.
        if unsafe { libc::mlock(ptr.as_ptr().cast(), len) } != 0 {
            return Err(format!(
                "mlock refused: {} (raise RLIMIT_MEMLOCK, `ulimit -l`, or allocate unpinned)",
                std::io::Error::from_raw_os_error(errno())
            ));
        }
        Ok(())
    }

    /// Physical memory plus swap (`sysinfo`).
    #[cfg(any(target_os = "linux", target_os = "android"))]
    pub(super) fn machine_memory() -> Option<u64> {
        // SAFETY: an all-zero `sysinfo` is a valid value of the plain C struct.
        let mut info: libc::sysinfo = unsafe { std::mem::zeroed() };
        // SAFETY: info is a valid out-pointer.
        if unsafe { libc::sysinfo(&mut info) } != 0 {
            return None;
        }
        let unit = u64::from(info.mem_unit.max(1));
        Some((info.totalram as u64).saturating_add(info.totalswap as u64).saturating_mul(unit))
    }

    /// Physical memory (`hw.memsize`) plus the swap files that exist now (`vm.swapusage`).
    #[cfg(target_os = "macos")]
    pub(super) fn machine_memory() -> Option<u64> {
        // SAFETY: every bit pattern is a valid u64 and a valid xsw_usage (integers only).
        let (memory, swap) =
            unsafe { (sysctl::<u64>(c"hw.memsize")?, sysctl::<libc::xsw_usage>(c"vm.swapusage")) };
        Some(memory.saturating_add(swap.map_or(0, |s| s.xsu_total)))
    }

    /// Other Unix systems: unknown (no request is refused up front).
    #[cfg(not(any(target_os = "linux", target_os = "android", target_os = "macos")))]
    pub(super) fn machine_memory() -> Option<u64> {
        None
    }

    /// (available, total) physical memory: macOS's total minus what Activity Monitor counts
    /// as used (app memory, that is internal pages that are not purgeable, plus wired and
    /// compressed pages), from `host_statistics64(HOST_VM_INFO64)`.
    #[cfg(target_os = "macos")]
    pub(super) fn system_memory() -> Option<(u64, u64)> {
        use crate::backend::fork::ForkAwareOnce;
        // One send right to the host port for the process's lifetime (asking again would add
        // a reference each time).
        static HOST: ForkAwareOnce<libc::mach_port_t> = ForkAwareOnce::new();
        // SAFETY: every bit pattern is a valid u64.
        let total = unsafe { sysctl::<u64>(c"hw.memsize")? };
        // libc deprecates its Mach declarations in favour of the `mach2` crate; this one call
        // is the same function, so lazybuf does not take a dependency for it.
        #[allow(deprecated)]
        // SAFETY: mach_host_self has no preconditions.
        let host = *HOST.get_or_init(|| unsafe { libc::mach_host_self() });
        // SAFETY: an all-zero vm_statistics64 is a valid value of the plain C struct.
        let mut stats: libc::vm_statistics64 = unsafe { std::mem::zeroed() };
        let mut count = libc::HOST_VM_INFO64_COUNT;
        // SAFETY: `stats` is valid for `count` integers, as HOST_VM_INFO64 requires; the kernel
        // writes at most that many and says how many in `count`.
        let status = unsafe {
            libc::host_statistics64(host, libc::HOST_VM_INFO64, (&raw mut stats).cast(), &mut count)
        };
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if status != libc::KERN_SUCCESS || page <= 0 {
            return None;
        }
        let used_pages = u64::from(stats.internal_page_count.saturating_sub(stats.purgeable_count))
            .saturating_add(u64::from(stats.wire_count))
            .saturating_add(u64::from(stats.compressor_page_count));
        let used = used_pages.saturating_mul(page as u64);
        Some((total.saturating_sub(used), total))
    }

    /// (available, total) physical memory from `sysconf`, which reports no free figure: the
    /// total twice (the fallback where `/proc/meminfo` cannot be read).
    #[cfg(not(target_os = "macos"))]
    pub(super) fn system_memory() -> Option<(u64, u64)> {
        // SAFETY: sysconf has no preconditions.
        let (page, phys) =
            unsafe { (libc::sysconf(libc::_SC_PAGESIZE), libc::sysconf(libc::_SC_PHYS_PAGES)) };
        if page <= 0 || phys <= 0 {
            return None;
        }
        let total = (page as u64).saturating_mul(phys as u64);
        Some((total, total))
    }

    /// A `sysctlbyname` value of exactly `T`'s size.
    ///
    /// # Safety
    /// Every bit pattern of `size_of::<T>()` bytes is a valid `T` (integers, C structs of them).
    #[cfg(target_os = "macos")]
    unsafe fn sysctl<T>(name: &std::ffi::CStr) -> Option<T> {
        let mut value = std::mem::MaybeUninit::<T>::zeroed();
        let mut size = size_of::<T>();
        // SAFETY: `value` is valid for `size` bytes; sysctlbyname writes at most that many and
        // reports how many; nothing is set (null new value).
        let status = unsafe {
            libc::sysctlbyname(name.as_ptr(), value.as_mut_ptr().cast(), &mut size, std::ptr::null_mut(), 0)
        };
        // SAFETY: all size_of::<T>() bytes were written (or zeroed), and any bytes are a valid
        // T (the caller's contract).
        (status == 0 && size == size_of::<T>()).then(|| unsafe { value.assume_init() })
    }
}

/// The operating system's side of host memory on Windows (see the Unix module for the contract
/// of each function).
#[cfg(windows)]
mod os {
    use std::ptr::NonNull;
    use std::sync::{Mutex, PoisonError};

    use windows_sys::Win32::Foundation::GetLastError;
    use windows_sys::Win32::System::Memory::{
        MEM_COMMIT, MEM_RELEASE, MEM_RESERVE, PAGE_READWRITE, VirtualAlloc, VirtualFree, VirtualLock,
    };
    use windows_sys::Win32::System::SystemInformation::{GlobalMemoryStatusEx, MEMORYSTATUSEX};
    use windows_sys::Win32::System::Threading::{
        GetCurrentProcess, GetProcessWorkingSetSize, SetProcessWorkingSetSize,
    };

    /// The calling thread's last Windows error code.
    fn last_error() -> i32 {
        // SAFETY: GetLastError has no preconditions.
        unsafe { GetLastError() as i32 }
    }

    /// Commits `len` (> 0) zeroed bytes of fresh pages (`VirtualAlloc`: aligned to the
    /// allocation granularity, 64 KiB). The error is `GetLastError`'s code.
    pub(super) fn map(len: usize) -> Result<NonNull<u8>, i32> {
        // SAFETY: a fresh reservation and commit at an address the system picks has no
        // preconditions; the result is checked for null below.
        let raw = unsafe { VirtualAlloc(std::ptr::null(), len, MEM_RESERVE | MEM_COMMIT, PAGE_READWRITE) };
        NonNull::new(raw.cast::<u8>()).ok_or_else(last_error)
    }

    /// Releases a block (which also unlocks its pages), then gives a locked block's share of
    /// the working set back. Failures are ignored: a failed release only leaks.
    ///
    /// # Safety
    /// `[ptr, ptr + len)` is a block [`map`] returned, not released yet, that nothing
    /// references any more; `locked` says whether [`lock`] locked it.
    pub(super) unsafe fn unmap(ptr: NonNull<u8>, len: usize, locked: bool) {
        // SAFETY: the caller's contract: the base address of a whole VirtualAlloc block, which
        // MEM_RELEASE (with size 0) frees entirely.
        unsafe { VirtualFree(ptr.as_ptr().cast(), 0, MEM_RELEASE) };
        if locked {
            let _ = resize_working_set(len, false);
        }
    }

    /// Locks a block's pages in RAM (`VirtualLock`). Windows lets a process lock no more than
    /// its minimum working set (a few hundred KiB by default), so the working set's minimum
    /// and maximum first grow by `len`; [`unmap`] shrinks them back.
    ///
    /// # Safety
    /// `[ptr, ptr + len)` is a block [`map`] returned and not released yet.
    pub(super) unsafe fn lock(ptr: NonNull<u8>, len: usize) -> Result<(), String> {
        resize_working_set(len, true).map_err(|code| {
            format!(
                "VirtualLock needs a working set {len} bytes larger, which Windows refused: {}",
                std::io::Error::from_raw_os_error(code)
            )
        })?;
        // SAFETY: the caller's contract: committed pages of this process.
        if unsafe { VirtualLock(ptr.as_ptr().cast(), len) } == 0 {
            let code = last_error();
            let _ = resize_working_set(len, false);
            return Err(format!(
                "VirtualLock refused: {} (free memory, or allocate unpinned)",
                std::io::Error::from_raw_os_error(code)
            ));
        }
        Ok(())
    }

    /// Grows (or shrinks) the process's minimum and maximum working set by `len` bytes.
    fn resize_working_set(len: usize, grow: bool) -> Result<(), i32> {
        // One resize at a time: each reads the sizes and sets them.
        static RESIZE: Mutex<()> = Mutex::new(());
        let _guard = RESIZE.lock().unwrap_or_else(PoisonError::into_inner);
        // SAFETY: GetCurrentProcess has no preconditions; its pseudo-handle needs no closing.
        let process = unsafe { GetCurrentProcess() };
        let (mut min, mut max) = (0usize, 0usize);
        // SAFETY: both out-pointers are valid usizes; the handle is this process's.
        if unsafe { GetProcessWorkingSetSize(process, &mut min, &mut max) } == 0 {
            return Err(last_error());
        }
        let (min, max) = if grow {
            const ERROR_NOT_ENOUGH_MEMORY: i32 = 8;
            (
                min.checked_add(len).ok_or(ERROR_NOT_ENOUGH_MEMORY)?,
                max.checked_add(len).ok_or(ERROR_NOT_ENOUGH_MEMORY)?,
            )
        } else {
            (min.saturating_sub(len), max.saturating_sub(len))
        };
        // SAFETY: the handle is this process's; sizes are plain numbers the system checks.
        if unsafe { SetProcessWorkingSetSize(process, min, max) } == 0 {
            return Err(last_error());
        }
        Ok(())
    }

    /// The global memory status, or `None` when the call fails.
    fn memory_status() -> Option<MEMORYSTATUSEX> {
        // SAFETY: an all-zero MEMORYSTATUSEX is a valid value of the plain C struct.
        let mut status: MEMORYSTATUSEX = unsafe { std::mem::zeroed() };
        status.dwLength = size_of::<MEMORYSTATUSEX>() as u32;
        // SAFETY: `status` is a valid out-pointer with dwLength set, as the call requires.
        (unsafe { GlobalMemoryStatusEx(&mut status) } != 0).then_some(status)
    }

    /// The commit limit: physical memory plus page files.
    pub(super) fn machine_memory() -> Option<u64> {
        memory_status().map(|s| s.ullTotalPageFile)
    }

    /// (available, total) physical memory.
    pub(super) fn system_memory() -> Option<(u64, u64)> {
        memory_status().map(|s| (s.ullAvailPhys, s.ullTotalPhys))
    }
}

/// The machine's physical memory plus swap, in bytes (`usize::MAX` where unknown; see the
/// module docs for where each system's figure comes from).
pub fn machine_memory() -> usize {
    static TOTAL: ForkAwareOnce<usize> = ForkAwareOnce::new();
    *TOTAL.get_or_init(|| {
        os::machine_memory().map_or(usize::MAX, |total| usize::try_from(total).unwrap_or(usize::MAX))
    })
}

/// The system's available and total physical memory in bytes, from the operating system's
/// own figures, for where `/proc/meminfo` is not there to read (the host device's
/// [`crate::Device::memory_info`] reads that first): `sysconf`'s physical pages on Linux and
/// other Unix systems (which report no free figure, so available is the total), the pages
/// that Activity Monitor does not count as used on macOS (total minus app memory, wired and
/// compressed pages, from `host_statistics64`), `GlobalMemoryStatusEx`'s `ullAvailPhys` on
/// Windows. `None` where the system reports nothing.
pub(crate) fn system_memory() -> Option<(u64, u64)> {
    os::system_memory()
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
/// The most one piece of a split copy moves: larger copies are cut into more pieces than
/// threads, taken from one queue, so a thread the system deschedules holds up at most one
/// piece (the others are copied by whoever is running), and a split copy stays about as fast
/// as one thread's on a machine whose other cores are busy.
const PARALLEL_COPY_MAX_PIECE: usize = 4 << 20;
/// Split copies this large or larger write with non-temporal stores (the data cannot stay in
/// the cache anyway): measured on the development VM, 2 threads with ordinary stores moved
/// 20.6 GB/s at 64 MiB and 13.3 at 256 MiB, with streaming stores 26.3 and 26.6.
const PARALLEL_COPY_STREAMING_MIN: usize = 64 << 20;
/// The most threads one copy uses.
const PARALLEL_COPY_THREADS: usize = 8;

/// Copies `src` into `dst` (equal lengths), on several threads when the copy is large.
///
/// One core's `memcpy` moves 6-12 GB/s on the servers GPUs sit in, a fifth of what a PCIe 5
/// x16 link does, so host-side copies of large arrays (a host write of a whole buffer, a
/// `to_vec`, Python's `to_numpy`) would otherwise cost several times their DMA. Copies of
/// [`PARALLEL_COPY_MIN`] and more are cut into pieces of at least 1 MiB, one per thread, up to
/// the machine's parallelism and at most 8 threads: the calling thread takes one piece and
/// lazybuf's parked copy workers the others (started once and kept, so a copy pays a wake-up,
/// not a thread start; fork-safe: see `copy_workers`); smaller copies, and machines with one
/// core, copy on the calling thread. It is
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
    // Pieces of whole cache lines, so two threads never write one line; at most
    // PARALLEL_COPY_MAX_PIECE each.
    let piece = len.div_ceil(threads).min(PARALLEL_COPY_MAX_PIECE).next_multiple_of(HEAP_ALIGN);
    // Addresses as integers: raw pointers are not Send.
    let (dst, src) = (dst as usize, src as usize);
    // SAFETY: the ranges are valid for len bytes and disjoint (checked above), and nothing
    // else writes them during the call (the caller's contract); split returns when every
    // piece is copied.
    unsafe { copy_workers::split(dst, src, len, piece, threads, len >= PARALLEL_COPY_STREAMING_MIN) }
}

/// The threads that copy the pieces of split host copies: a few parked workers of lazybuf's
/// own, started on first use (one fewer than the most threads a copy has used, at most
/// [`PARALLEL_COPY_THREADS`] - 1) and kept, so a large copy pays a wake-up, not a thread start
/// and join (33-55 us each). The calling thread copies the first piece and then takes
/// queued pieces itself while no worker has, so a copy waits on a worker only for the piece
/// that worker is copying (at most [`PARALLEL_COPY_MAX_PIECE`]), never for one slow to wake. Fork: `fork` copies only the calling thread, so a child inherits the pool's queue
/// (its lock possibly held by a worker that no longer exists) without its workers. Each pool
/// belongs to the process that made it (its pid): a child never touches its parent's pool and
/// makes a fresh one on its first large copy (the parent's is left alone in the child's memory).
mod copy_workers {
    use std::collections::VecDeque;
    use std::ptr;
    use std::sync::atomic::{AtomicPtr, Ordering};
    use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

    /// One piece of a split copy (addresses as integers), and its copy's latch.
    struct Piece {
        dst: usize,
        src: usize,
        len: usize,
        /// Copy with non-temporal stores ([`copy_streaming`]).
        streaming: bool,
        latch: Arc<Latch>,
    }

    impl Piece {
        /// Copies the piece and counts it done.
        fn run(self) {
            // SAFETY: the piece lies inside the ranges of a copy whose caller waits (in
            // `split`) until every piece of it has counted down, so the ranges stay valid;
            // they are disjoint, and no other piece writes these bytes.
            unsafe {
                let (src, dst) = (self.src as *const u8, self.dst as *mut u8);
                if self.streaming {
                    copy_streaming(dst, src, self.len);
                } else {
                    ptr::copy_nonoverlapping(src, dst, self.len);
                }
            }
            self.latch.count_down();
        }
    }

    /// Copies `len` bytes with non-temporal stores (x86-64: SSE2 `movntdq`, then `sfence`), as
    /// glibc's `memcpy` does for one copy larger than its threshold (about 190 MiB on the
    /// development VM): the pieces of a large split copy are each below that threshold, and
    /// with ordinary stores they ran at half the speed of one thread's streaming `memcpy`.
    /// Elsewhere, an ordinary copy.
    ///
    /// # Safety
    /// `src` is valid for reads and `dst` for writes of `len` bytes; the ranges do not overlap.
    unsafe fn copy_streaming(dst: *mut u8, src: *const u8, len: usize) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
            let head = dst.align_offset(16).min(len);
            // SAFETY: (every block here) offsets stay inside [0, len), valid for both ranges
            // (the caller's contract); the streaming stores are to 16-byte aligned addresses
            // (dst + head is aligned, and i advances by 64); SSE2 is part of x86-64.
            unsafe {
                ptr::copy_nonoverlapping(src, dst, head);
                let mut i = head;
                while i + 64 <= len {
                    for k in [0, 16, 32, 48] {
                        let v = _mm_loadu_si128(src.add(i + k).cast::<__m128i>());
                        _mm_stream_si128(dst.add(i + k).cast::<__m128i>(), v);
                    }
                    i += 64;
                }
                ptr::copy_nonoverlapping(src.add(i), dst.add(i), len - i);
                // The streamed bytes are visible to other threads before the piece counts down.
                _mm_sfence();
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        // SAFETY: the caller's contract.
        unsafe {
            ptr::copy_nonoverlapping(src, dst, len)
        }
    }

    /// Counts the pieces of one copy that are not done yet.
    struct Latch {
        remaining: Mutex<usize>,
        done: Condvar,
    }

    impl Latch {
        fn count_down(&self) {
            let mut remaining = lock(&self.remaining);
            *remaining -= 1;
            if *remaining == 0 {
                self.done.notify_all();
            }
        }

        fn wait(&self) {
            let mut remaining = lock(&self.remaining);
            while *remaining > 0 {
                remaining = self.done.wait(remaining).unwrap_or_else(PoisonError::into_inner);
            }
        }
    }

    struct Queue {
        pieces: VecDeque<Piece>,
        /// Workers started.
        workers: usize,
    }

    /// The workers of one process.
    struct Pool {
        pid: u32,
        queue: Mutex<Queue>,
        work: Condvar,
    }

    /// The pool of the process that made it; leaked (a few bytes, once per process).
    static POOL: AtomicPtr<Pool> = AtomicPtr::new(ptr::null_mut());

    /// Nothing panics while these locks are held (a piece is copied outside them), so a
    /// poisoned one is still consistent.
    fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
        mutex.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// This process's pool: made on first use, and again in a forked child.
    fn pool() -> &'static Pool {
        let pid = std::process::id();
        loop {
            let current = POOL.load(Ordering::Acquire);
            // SAFETY: a non-null POOL points to a leaked Box<Pool>, never freed.
            if let Some(pool) = unsafe { current.as_ref() }
                && pool.pid == pid
            {
                return pool;
            }
            let queue = Mutex::new(Queue { pieces: VecDeque::new(), workers: 0 });
            let fresh = Box::into_raw(Box::new(Pool { pid, queue, work: Condvar::new() }));
            match POOL.compare_exchange(current, fresh, Ordering::AcqRel, Ordering::Acquire) {
                // SAFETY: just leaked; never freed.
                Ok(_) => return unsafe { &*fresh },
                // Another thread of this process installed one first: use that (next loop).
                // SAFETY: `fresh` came from Box::into_raw above and was never shared.
                Err(_) => drop(unsafe { Box::from_raw(fresh) }),
            }
        }
    }

    impl Pool {
        /// Starts workers until there are `wanted` (as many as the system gives).
        fn ensure_workers(&'static self, queue: &mut Queue, wanted: usize) {
            while queue.workers < wanted {
                let started = std::thread::Builder::new()
                    .name("lazybuf-copy".into())
                    .stack_size(64 << 10)
                    .spawn(move || self.work_loop());
                if started.is_err() {
                    // No thread to be had: the calling thread copies what no worker takes.
                    return;
                }
                queue.workers += 1;
            }
        }

        fn work_loop(&self) {
            loop {
                let piece = {
                    let mut queue = lock(&self.queue);
                    loop {
                        if let Some(piece) = queue.pieces.pop_front() {
                            break piece;
                        }
                        queue = self.work.wait(queue).unwrap_or_else(PoisonError::into_inner);
                    }
                };
                piece.run();
            }
        }
    }

    /// Copies `len` bytes from `src` to `dst` in pieces of `piece` bytes on `threads` threads
    /// at most: the first piece on the calling thread, the others on `threads - 1` workers or
    /// on the calling thread, whichever takes them first; returns when every piece is done.
    ///
    /// # Safety
    /// The ranges are valid for `len` bytes, do not overlap, and nothing else writes them
    /// during the call.
    /// With `streaming`, the pieces are copied with non-temporal stores ([`copy_streaming`]).
    pub(super) unsafe fn split(
        dst: usize,
        src: usize,
        len: usize,
        piece: usize,
        threads: usize,
        streaming: bool,
    ) {
        let count = len.div_ceil(piece);
        let latch = Arc::new(Latch { remaining: Mutex::new(count), done: Condvar::new() });
        let make = |offset: usize| Piece {
            dst: dst + offset,
            src: src + offset,
            len: piece.min(len - offset),
            streaming,
            latch: Arc::clone(&latch),
        };
        let pool = pool();
        {
            let mut queue = lock(&pool.queue);
            pool.ensure_workers(&mut queue, threads.min(count) - 1);
            queue.pieces.extend((piece..len).step_by(piece).map(make));
        }
        for _ in 1..threads.min(count) {
            pool.work.notify_one();
        }
        make(0).run();
        // Help: copy the pieces no worker has taken yet (any copy's: each stays valid until
        // its own caller's latch is done, which needs that piece).
        loop {
            let next = lock(&pool.queue).pieces.pop_front();
            match next {
                Some(piece) => piece.run(),
                None => break,
            }
        }
        latch.wait();
    }
}

/// How many threads [`copy_bytes`] uses for `len` bytes.
fn copy_threads(len: usize) -> usize {
    static CORES: ForkAwareOnce<usize> = ForkAwareOnce::new();
    if len < PARALLEL_COPY_MIN {
        return 1;
    }
    let cores = *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    (len / PARALLEL_COPY_PIECE).min(cores).clamp(1, PARALLEL_COPY_THREADS)
}

/// Fills `bytes` with repetitions of `pattern` (whose length divides `bytes.len()`), by
/// doubling copies so it runs at memcpy speed for any pattern length (a pattern of one
/// repeated byte is a `memset`).
pub fn fill_pattern(bytes: &mut [u8], pattern: &[u8]) {
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
    /// Copies from many threads at once share the workers: pieces of different copies are
    /// queued together, and each copy returns only when all of its own bytes are there.
    #[test]
    fn concurrent_split_copies_each_get_every_byte() {
        let handles: Vec<_> = (0..6u8)
            .map(|t| {
                std::thread::spawn(move || {
                    let len = (3 << 20) + 64 * t as usize + 5;
                    let src: Vec<u8> = (0..len).map(|i| (i % 241) as u8 ^ t).collect();
                    for round in 0..20 {
                        let mut dst = vec![0xff; len];
                        // SAFETY: two distinct vectors of len bytes.
                        unsafe { super::copy_bytes_with(dst.as_mut_ptr(), src.as_ptr(), len, 2 + round % 7) };
                        assert!(dst == src, "thread {t}, round {round}");
                    }
                })
            })
            .collect();
        for handle in handles {
            handle.join().unwrap();
        }
    }

    /// Split copies with non-temporal stores (large copies): every byte, at every alignment of
    /// the destination and lengths that leave a head and a tail around the streamed blocks.
    #[test]
    fn streaming_split_copies_copy_every_byte_at_any_alignment() {
        let total = (5 << 20) + 300;
        let src: Vec<u8> = (0..total).map(|i: usize| (i.wrapping_mul(2654435761) >> 11) as u8).collect();
        for (offset, len, piece, threads) in [
            (0, 1 << 20, 1 << 18, 2),
            (1, (3 << 20) + 77, 1 << 20, 3),
            (15, 100, 64, 2),
            (33, 5 << 20, 3 << 20, 2),
        ] {
            let mut dst = vec![0xffu8; total + 64];
            let start = dst.as_mut_ptr().wrapping_add(offset) as usize;
            // SAFETY: dst holds offset + len bytes and src len bytes; two distinct vectors.
            unsafe { super::copy_workers::split(start, src.as_ptr() as usize, len, piece, threads, true) };
            assert!(dst[offset..offset + len] == src[..len], "offset {offset}, len {len}");
            assert!(dst[..offset].iter().chain(&dst[offset + len..]).all(|&b| b == 0xff), "outside");
        }
    }

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
            if len >= MMAP_THRESHOLD {
                assert_eq!(m.as_ptr() as usize % 4096, 0, "mapped blocks are whole pages");
            }
            if cfg!(unix) && len >= HUGE_THRESHOLD {
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
            Err(Error::PinningFailed { reason, .. }) => {
                assert!(reason.contains(if cfg!(windows) { "VirtualLock" } else { "mlock" }), "{reason}")
            }
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
