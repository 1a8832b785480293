//! Test tools (feature `testing`): a fault-injecting device wrapper.
//!
//! [`FaultyDevice`] wraps any device and makes its n-th allocation or n-th copy fail, to prove
//! that every failure surfaces as an error and leaves state and valid bytes as they were. A
//! failing copy first scribbles over its destination, as a runtime that dies half-way would.
//! It is a real device for lazybuf (its own identity, the wrapped device's memory and
//! streams), usable in any test suite, not only lazybuf's own.
//!
//! Completion can be controlled too, for tests of asynchronous transfers:
//! - [`FaultPlan::defer_copy_faults`]: a failing copy is enqueued fine and reports its failure
//!   through its ticket (at wait or poll), as a runtime reports a failure during execution;
//! - [`FaultPlan::hold_completions`]: every copy's ticket stays pending until the test
//!   releases it ([`FaultPlan::release`]) or someone waits on it (waiting releases it), so
//!   tests can complete transfers in any order they like.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::backend::{
    Backend, Completion, DeviceInfo, DeviceMemory, HostSpan, MemoryInfo, RawDevice, RawStream, StreamHandle,
    Ticket,
};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::host_memory::HostMemory;

/// Controls which operation of a [`FaultyDevice`] fails, and when its copies complete. Counts
/// start at 1; 0 disarms.
#[derive(Debug, Default)]
pub struct FaultPlan {
    allocations: AtomicU64,
    copies: AtomicU64,
    fail_allocation: AtomicU64,
    fail_copy: AtomicU64,
    deferred: AtomicBool,
    holding: AtomicBool,
    held: Mutex<Vec<Arc<Gate>>>,
    next_gate: AtomicU64,
    no_native_handles: AtomicBool,
}

impl FaultPlan {
    /// Makes the `n`-th allocation from now fail (host blocks and device memory both count).
    pub fn fail_allocation_in(&self, n: u64) {
        let done = self.allocations.load(Ordering::SeqCst);
        self.fail_allocation.store(if n == 0 { 0 } else { done + n }, Ordering::SeqCst);
    }

    /// Makes the `n`-th copy from now fail (uploads, downloads, device and peer copies, fills).
    pub fn fail_copy_in(&self, n: u64) {
        let done = self.copies.load(Ordering::SeqCst);
        self.fail_copy.store(if n == 0 { 0 } else { done + n }, Ordering::SeqCst);
    }

    /// With `true`, the device's memory has no native handle ([`Device::native_handle`]
    /// returns 0), as wgpu's on Metal and DirectX 12, which expose none.
    pub fn hide_native_handles(&self, hidden: bool) {
        self.no_native_handles.store(hidden, Ordering::SeqCst);
    }

    /// Disarms both faults.
    pub fn disarm(&self) {
        self.fail_allocation.store(0, Ordering::SeqCst);
        self.fail_copy.store(0, Ordering::SeqCst);
    }

    /// With `true`, a failing copy is enqueued fine and fails through its ticket; with
    /// `false` (the default) the enqueue itself fails.
    pub fn defer_copy_faults(&self, deferred: bool) {
        self.deferred.store(deferred, Ordering::SeqCst);
    }

    /// With `true`, copies' tickets stay pending until released or waited on.
    pub fn hold_completions(&self, holding: bool) {
        self.holding.store(holding, Ordering::SeqCst);
    }

    /// The ids of the held tickets not released (or waited on) yet, oldest first.
    pub fn held(&self) -> Vec<u64> {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        held.retain(|gate| !gate.open.load(Ordering::SeqCst));
        held.iter().map(|gate| gate.id).collect()
    }

    /// Releases the held ticket `id` (the work behind it completes); returns whether it was
    /// still held.
    pub fn release(&self, id: u64) -> bool {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        match held.iter().position(|gate| gate.id == id) {
            Some(index) => {
                let gate = held.remove(index);
                !gate.open.swap(true, Ordering::SeqCst)
            }
            None => false,
        }
    }

    /// Releases every held ticket.
    pub fn release_all(&self) {
        let gates = std::mem::take(&mut *self.held.lock().unwrap_or_else(PoisonError::into_inner));
        gates.iter().for_each(|gate| gate.open());
    }

    /// Whether a copy fault is armed (it disarms itself when it fires).
    pub fn copy_fault_armed(&self) -> bool {
        self.fail_copy.load(Ordering::SeqCst) != 0
    }

    /// Allocations attempted so far.
    pub fn allocations(&self) -> u64 {
        self.allocations.load(Ordering::SeqCst)
    }

    /// Copies attempted so far.
    pub fn copies(&self) -> u64 {
        self.copies.load(Ordering::SeqCst)
    }

    fn check(count: &AtomicU64, target: &AtomicU64, operation: &'static str) -> Result<()> {
        let n = count.fetch_add(1, Ordering::SeqCst) + 1;
        if target.load(Ordering::SeqCst) == n {
            target.store(0, Ordering::SeqCst);
            return Err(Error::InjectedFault { operation, count: n });
        }
        Ok(())
    }

    /// The ticket a copy hands out: `inner` (the wrapped device's), failing with `fault`,
    /// held if the plan holds completions.
    fn ticket(&self, inner: Ticket, fault: Option<Error>) -> Ticket {
        if !self.holding.load(Ordering::SeqCst) {
            return match fault {
                None => inner,
                Some(fault) => Ticket::all([inner, Ticket::finished(Err(fault))]),
            };
        }
        let id = self.next_gate.fetch_add(1, Ordering::SeqCst);
        let gate = Arc::new(Gate { id, open: AtomicBool::new(false), inner, fault });
        self.held.lock().unwrap_or_else(PoisonError::into_inner).push(gate.clone());
        Ticket::new(gate)
    }
}

/// A held completion: pending until opened (by the test or by a wait), then the wrapped
/// ticket's outcome, or the injected fault.
#[derive(Debug)]
struct Gate {
    id: u64,
    open: AtomicBool,
    inner: Ticket,
    fault: Option<Error>,
}

impl Gate {
    fn open(&self) {
        self.open.store(true, Ordering::SeqCst);
    }

    fn outcome(&self) -> Result<()> {
        self.inner.wait()?;
        self.fault.clone().map_or(Ok(()), Err)
    }
}

impl Completion for Gate {
    fn poll(&self) -> Result<bool> {
        if !self.open.load(Ordering::SeqCst) {
            return Ok(false);
        }
        self.outcome().map(|()| true)
    }

    fn wait(&self) -> Result<()> {
        self.open();
        self.outcome()
    }
}

/// A device that forwards to another and fails where its [`FaultPlan`] says.
#[derive(Debug)]
pub struct FaultyDevice {
    inner: Device,
    plan: Arc<FaultPlan>,
}

impl FaultyDevice {
    /// Wraps `inner`; returns the new device and the plan that controls it.
    pub fn wrap(inner: &Device) -> (Device, Arc<FaultPlan>) {
        let plan = Arc::new(FaultPlan::default());
        let device =
            Device::from_backend(Arc::new(FaultyDevice { inner: inner.clone(), plan: plan.clone() }));
        (device, plan)
    }

    fn allocation(&self) -> Result<()> {
        FaultPlan::check(&self.plan.allocations, &self.plan.fail_allocation, "allocation")
    }

    /// Counts a copy: `Err` if it must fail now, `Ok(Some)` if it must fail through its
    /// ticket, `Ok(None)` if it succeeds.
    fn copy_op(&self) -> Result<Option<Error>> {
        match FaultPlan::check(&self.plan.copies, &self.plan.fail_copy, "copy") {
            Ok(()) => Ok(None),
            Err(fault) if self.plan.deferred.load(Ordering::SeqCst) => Ok(Some(fault)),
            Err(fault) => Err(fault),
        }
    }

    fn backend(&self) -> &dyn Backend {
        self.inner.backend()
    }
}

impl Backend for FaultyDevice {
    fn info(&self) -> &DeviceInfo {
        self.inner.info()
    }

    fn survives_fork(&self) -> bool {
        self.backend().survives_fork()
    }

    fn ordered_uploads(&self) -> bool {
        self.backend().ordered_uploads()
    }

    fn check_usable(&self) -> Result<()> {
        self.backend().check_usable()
    }

    fn memory_info(&self) -> Result<MemoryInfo> {
        self.backend().memory_info()
    }

    fn default_stream(&self) -> Arc<dyn StreamHandle> {
        self.backend().default_stream()
    }

    fn create_stream(&self) -> Result<Arc<dyn StreamHandle>> {
        self.backend().create_stream()
    }

    unsafe fn wrap_stream(&self, raw: RawStream) -> Result<Arc<dyn StreamHandle>> {
        // SAFETY: forwarded contract.
        unsafe { self.backend().wrap_stream(raw) }
    }

    fn pins_host_memory(&self) -> bool {
        self.backend().pins_host_memory()
    }

    fn allocate(&self, kind: crate::backend::MemoryKind, bytes: usize) -> Result<crate::backend::Block> {
        self.allocation()?;
        self.backend().allocate(kind, bytes)
    }

    unsafe fn borrow(&self, raw: crate::backend::RawMemory, len: usize) -> Result<DeviceMemory> {
        // SAFETY: forwarded contract.
        unsafe { self.backend().borrow(raw, len) }
    }

    fn alignment(&self, kind: crate::backend::MemoryKind) -> usize {
        self.backend().alignment(kind)
    }

    fn prefetch(&self, stream: &dyn StreamHandle, memory: &DeviceMemory, to_device: bool) -> Result<Ticket> {
        self.backend().prefetch(stream, memory, to_device)
    }

    fn zero_copy(&self, bytes: usize) -> bool {
        self.backend().zero_copy(bytes)
    }

    fn alias_host(&self, host: &mut HostMemory, bytes: usize) -> Option<Result<DeviceMemory>> {
        let alias = self.backend().alias_host(host, bytes)?;
        Some(self.allocation().and(alias))
    }

    fn owns(&self, memory: &DeviceMemory) -> bool {
        self.backend().owns(memory)
    }

    unsafe fn upload(
        &self,
        stream: &dyn StreamHandle,
        src: HostSpan,
        dst: &mut DeviceMemory,
    ) -> Result<Ticket> {
        let fault = match self.copy_op() {
            Ok(fault) => fault,
            Err(err) => {
                scribble(self.backend(), stream, dst, src.len());
                return Err(err);
            }
        };
        if fault.is_some() {
            scribble(self.backend(), stream, dst, src.len());
            return Ok(self.plan.ticket(Ticket::done(), fault));
        }
        // SAFETY: forwarded contract.
        let inner = unsafe { self.backend().upload(stream, src, dst) }?;
        Ok(self.plan.ticket(inner, None))
    }

    unsafe fn download(
        &self,
        stream: &dyn StreamHandle,
        src: &DeviceMemory,
        dst: HostSpan,
    ) -> Result<Ticket> {
        let fault = match self.copy_op() {
            Ok(fault) => fault,
            Err(err) => {
                if !src.is_host_alias() {
                    // SAFETY: dst is writable until the ticket completes (the caller's promise);
                    // it completes (fails) before this returns.
                    unsafe { dst.bytes_mut() }.fill(0x5A);
                }
                return Err(err);
            }
        };
        if fault.is_some() {
            if !src.is_host_alias() {
                // SAFETY: dst is writable until the ticket completes (the caller's promise).
                unsafe { dst.bytes_mut() }.fill(0x5A);
            }
            return Ok(self.plan.ticket(Ticket::done(), fault));
        }
        // SAFETY: forwarded contract.
        let inner = unsafe { self.backend().download(stream, src, dst) }?;
        Ok(self.plan.ticket(inner, None))
    }

    unsafe fn fill(
        &self,
        stream: &dyn StreamHandle,
        dst: &mut DeviceMemory,
        pattern: &[u8],
        bytes: usize,
    ) -> Result<Ticket> {
        // Fills fail before they start (a fill abandoned half-way is covered by the CUDA
        // test double).
        if let Some(fault) = self.copy_op()? {
            return Err(fault);
        }
        // SAFETY: forwarded contract.
        let inner = unsafe { self.backend().fill(stream, dst, pattern, bytes) }?;
        Ok(self.plan.ticket(inner, None))
    }

    unsafe fn copy(
        &self,
        stream: &dyn StreamHandle,
        src: &DeviceMemory,
        dst: &mut DeviceMemory,
        bytes: usize,
    ) -> Result<Ticket> {
        if let Some(fault) = self.copy_op()? {
            return Err(fault);
        }
        // SAFETY: forwarded contract.
        let inner = unsafe { self.backend().copy(stream, src, dst, bytes) }?;
        Ok(self.plan.ticket(inner, None))
    }

    fn can_copy_from_peer(&self, src: &dyn Backend) -> bool {
        self.backend().can_copy_from_peer(src)
    }

    unsafe fn copy_from_peer(
        &self,
        stream: &dyn StreamHandle,
        src_backend: &dyn Backend,
        src: &DeviceMemory,
        dst: &mut DeviceMemory,
        bytes: usize,
    ) -> Option<Result<Ticket>> {
        if !self.backend().can_copy_from_peer(src_backend) {
            return None;
        }
        let fault = match self.copy_op() {
            Ok(fault) => fault,
            Err(err) => return Some(Err(err)),
        };
        if fault.is_some() {
            scribble(self.backend(), stream, dst, bytes);
            return Some(Ok(self.plan.ticket(Ticket::done(), fault)));
        }
        // SAFETY: forwarded contract.
        let inner = unsafe { self.backend().copy_from_peer(stream, src_backend, src, dst, bytes) }?;
        Some(inner.map(|inner| self.plan.ticket(inner, None)))
    }

    fn wait_on(&self, stream: &dyn StreamHandle, ticket: &Ticket) -> Result<()> {
        self.backend().wait_on(stream, ticket)
    }

    fn marker(&self, stream: &dyn StreamHandle) -> Result<Ticket> {
        self.backend().marker(stream)
    }

    fn synchronize(&self) -> Result<()> {
        self.inner.synchronize()
    }

    fn raw(&self) -> RawDevice {
        self.backend().raw()
    }

    fn prepare_host(&self, host: &mut HostMemory) {
        self.backend().prepare_host(host);
    }

    unsafe fn native_handle(&self, memory: crate::backend::RawMemory) -> usize {
        if self.plan.no_native_handles.load(Ordering::SeqCst) {
            return 0;
        }
        // SAFETY: forwarded contract.
        unsafe { self.backend().native_handle(memory) }
    }

    fn answers_to(&self, selector: &str) -> bool {
        self.backend().answers_to(selector)
    }

    fn trim(&self) {
        self.backend().trim();
    }

    fn take_deferred_errors(&self) -> (Vec<Error>, u64) {
        self.backend().take_deferred_errors()
    }

    /// The faults are injected here; the memory is the wrapped device's.
    fn wrapped(&self) -> Option<&dyn Backend> {
        Some(self.backend())
    }
}

/// Writes garbage over the first `bytes` of `dst` (not over host aliases: their bytes are the
/// host copy's), as a runtime that dies half-way through a copy would leave it.
fn scribble(backend: &dyn Backend, stream: &dyn StreamHandle, dst: &mut DeviceMemory, bytes: usize) {
    if dst.is_host_alias() || bytes == 0 || dst.is_empty() {
        return;
    }
    let garbage = vec![0xA5; bytes.min(dst.len())];
    // SAFETY: garbage lives until the ticket is waited for, here.
    let written = unsafe { backend.upload(stream, HostSpan::of_slice(&garbage), dst) };
    if let Ok(ticket) = written {
        let _ = ticket.wait();
    }
}

/// Runs `f` while this thread holds the event recorder's process-wide lock: a test forks in
/// another thread meanwhile, as a process whose recorder is busy at the fork would.
pub fn with_recorder_locked<R>(f: impl FnOnce() -> R) -> R {
    crate::observe::with_recorder_locked(f)
}

/// Runs `f` while this thread holds the lock of the event recorder's table of device and
/// call names: a test forks in another thread meanwhile.
pub fn with_recorder_names_locked<R>(f: impl FnOnce() -> R) -> R {
    crate::observe::with_recorder_names_locked(f)
}

/// Runs `f` while this thread holds the lock of `device`'s default pool's cache: a test forks
/// in another thread meanwhile, as a process whose pool is busy at the fork would.
pub fn with_pool_locked<R>(device: &Device, f: impl FnOnce() -> R) -> R {
    crate::resource::default_memory_pool(device).with_cache_locked(f)
}

/// Runs `f` while this thread holds the process-wide table of current resources (see
/// [`with_pool_locked`]).
pub fn with_current_resources_locked<R>(f: impl FnOnce() -> R) -> R {
    crate::resource::with_current_resources_locked(f)
}

/// Runs `f` while this thread holds the process-wide table of default pools (see
/// [`with_pool_locked`]).
pub fn with_default_pools_locked<R>(f: impl FnOnce() -> R) -> R {
    crate::resource::with_default_pools_locked(f)
}

/// Runs `f` while this thread holds spilling's process-wide locks: the list of eviction
/// candidates, the disk tier's state and the table of device ledgers (see [`with_pool_locked`]).
pub fn with_spill_locks_held<R>(f: impl FnOnce() -> R) -> R {
    crate::spill::registry::with_locked(|| {
        crate::spill::disk::with_locked(|| crate::spill::budget::with_locked(f))
    })
}
