//! Test tools: a fault-injecting device wrapper.
//!
//! [`FaultyDevice`] wraps any device and makes its n-th allocation or n-th copy fail, to prove
//! that every failure surfaces as an error and leaves state and valid bytes as they were. A
//! failing copy first scribbles over its destination, as a runtime that dies half-way would.
//! It is a real device for lazybuf (its own identity, the wrapped device's memory), usable in
//! any test suite, not only lazybuf's own.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::backend::{Backend, DeviceMemory, RawDevice};
use crate::device::{Device, DeviceInfo, MemoryInfo};
use crate::error::{Error, Result};
use crate::host_memory::HostMemory;

/// Controls which operation of a [`FaultyDevice`] fails. Counts start at 1; 0 disarms.
#[derive(Debug, Default)]
pub struct FaultPlan {
    allocations: AtomicU64,
    copies: AtomicU64,
    fail_allocation: AtomicU64,
    fail_copy: AtomicU64,
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

    /// Disarms both faults.
    pub fn disarm(&self) {
        self.fail_allocation.store(0, Ordering::SeqCst);
        self.fail_copy.store(0, Ordering::SeqCst);
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

    fn copy_op(&self) -> Result<()> {
        FaultPlan::check(&self.plan.copies, &self.plan.fail_copy, "copy")
    }
}

impl Backend for FaultyDevice {
    fn info(&self) -> &DeviceInfo {
        self.inner.info()
    }

    fn memory_info(&self) -> Result<MemoryInfo> {
        self.inner.memory_info()
    }

    fn allocate_host(&self, bytes: usize, pinned: bool) -> Result<HostMemory> {
        self.allocation()?;
        self.inner.backend().allocate_host(bytes, pinned)
    }

    fn allocate(&self, bytes: usize) -> Result<DeviceMemory> {
        self.allocation()?;
        self.inner.backend().allocate(bytes)
    }

    fn zero_copy(&self, bytes: usize) -> bool {
        self.inner.backend().zero_copy(bytes)
    }

    fn alias_host(&self, host: &mut HostMemory) -> Option<Result<DeviceMemory>> {
        let alias = self.inner.backend().alias_host(host)?;
        Some(self.allocation().and(alias))
    }

    fn upload(&self, src: &[u8], dst: &mut DeviceMemory) -> Result<()> {
        if let Err(err) = self.copy_op() {
            if !dst.is_host_alias() {
                let garbage = vec![0xA5; src.len()];
                self.inner.backend().upload(&garbage, dst)?;
            }
            return Err(err);
        }
        self.inner.backend().upload(src, dst)
    }

    fn download(&self, src: &DeviceMemory, dst: &mut [u8]) -> Result<()> {
        if let Err(err) = self.copy_op() {
            if !src.is_host_alias() {
                dst.fill(0x5A);
            }
            return Err(err);
        }
        self.inner.backend().download(src, dst)
    }

    fn fill(&self, dst: &mut DeviceMemory, pattern: &[u8], bytes: usize) -> Result<()> {
        self.copy_op()?;
        self.inner.backend().fill(dst, pattern, bytes)
    }

    fn copy(&self, src: &DeviceMemory, dst: &mut DeviceMemory, bytes: usize) -> Result<()> {
        self.copy_op()?;
        self.inner.backend().copy(src, dst, bytes)
    }

    fn can_copy_from_peer(&self, src: &Device) -> bool {
        self.inner.backend().can_copy_from_peer(src)
    }

    fn copy_from_peer(
        &self,
        src_device: &Device,
        src: &DeviceMemory,
        dst: &mut DeviceMemory,
        bytes: usize,
    ) -> Option<Result<()>> {
        if !self.inner.backend().can_copy_from_peer(src_device) {
            return None;
        }
        if let Err(err) = self.copy_op() {
            return Some(Err(err));
        }
        self.inner.backend().copy_from_peer(src_device, src, dst, bytes)
    }

    fn synchronize(&self) -> Result<()> {
        self.inner.synchronize()
    }

    fn raw(&self) -> RawDevice {
        self.inner.backend().raw()
    }
}
