//! `lazybuf.testing` (crate feature `testing`, test builds of the wheel only): the core's
//! fault-injecting device ([`lazybuf::testing::FaultyDevice`]) for Python tests.
//!
//! `lazybuf.testing.FaultyDevice(inner)` wraps a device (a `Device`, a selector string, or
//! `None` for the current device) and is itself a `lazybuf.Device`: buffers
//! (`UnifiedBuffer(..., device=faulty)`), pools (`get_memory_pool(faulty)`) and pinned host
//! memory on it work as on the wrapped device, except that the operation its plan names fails
//! (`fail_allocation_in(n)`, `fail_copy_in(n)`), so a test can check that the failure raises and
//! leaves state and data as they were. Injected faults raise `RuntimeError` ("injected
//! fault: ..."), as [`crate::errors`] maps every runtime failure that is not out-of-memory.
//!
//! `lazybuf.testing.exposures(buf)` counts the objects that hold a buffer's memory in use
//! (the spilling tests check that each one's scope ends with it).
//!
//! What does not live here: the fault injection itself (the core's `testing` module).

use std::sync::Arc;

use pyo3::prelude::*;

use lazybuf::testing::{FaultPlan, FaultyDevice};

use crate::accelerator::PyDevice;

/// A device whose n-th allocation or n-th copy fails; a `lazybuf.Device` wrapping another.
#[pyclass(name = "FaultyDevice", module = "lazybuf.testing", extends = PyDevice, frozen)]
pub(crate) struct PyFaultyDevice {
    inner: lazybuf::Device,
    plan: Arc<FaultPlan>,
}

#[pymethods]
impl PyFaultyDevice {
    /// Wraps `inner` (a `Device`, a selector string, or `None`: the current device). Each
    /// FaultyDevice is a new device (its own identity, pool and caches) over `inner`'s memory.
    #[new]
    #[pyo3(signature = (inner=None))]
    fn py_new(inner: Option<&Bound<'_, PyAny>>) -> PyResult<PyClassInitializer<Self>> {
        let inner = crate::accelerator::device_arg(inner)?;
        let (device, plan) = FaultyDevice::wrap(&inner);
        Ok(PyClassInitializer::from(PyDevice::new(device)).add_subclass(PyFaultyDevice { inner, plan }))
    }

    /// The wrapped device.
    #[getter]
    fn inner(&self) -> PyDevice {
        PyDevice::new(self.inner.clone())
    }

    /// Makes the `n`-th allocation from now fail (host and device memory both count); 0
    /// disarms.
    fn fail_allocation_in(&self, n: u64) {
        self.plan.fail_allocation_in(n);
    }

    /// Makes the `n`-th copy from now fail (uploads, downloads, device copies, fills); 0
    /// disarms. A failing copy first scribbles over its destination, as a runtime that dies
    /// half-way would.
    fn fail_copy_in(&self, n: u64) {
        self.plan.fail_copy_in(n);
    }

    /// With `True`, the device's memory has no native handle (0), as wgpu's on Metal and
    /// DirectX 12, which expose none.
    fn hide_native_handles(&self, hidden: bool) {
        self.plan.hide_native_handles(hidden);
    }

    /// Disarms both faults.
    fn disarm(&self) {
        self.plan.disarm();
    }

    /// With `True`, a failing copy is enqueued fine and fails when it is waited for, as a
    /// runtime reports a failure during execution; with `False` (the default) the enqueue
    /// fails.
    fn defer_copy_faults(&self, deferred: bool) {
        self.plan.defer_copy_faults(deferred);
    }

    /// Whether a copy fault is armed (it disarms itself when it fires).
    #[getter]
    fn copy_fault_armed(&self) -> bool {
        self.plan.copy_fault_armed()
    }

    /// Allocations attempted so far.
    #[getter]
    fn allocations(&self) -> u64 {
        self.plan.allocations()
    }

    /// Copies attempted so far.
    #[getter]
    fn copies(&self) -> u64 {
        self.plan.copies()
    }

    fn __repr__(slf: PyRef<'_, Self>) -> String {
        format!(
            "<lazybuf.testing.FaultyDevice over {:?} allocations={} copies={}>",
            slf.inner.name(),
            slf.plan.allocations(),
            slf.plan.copies()
        )
    }
}

/// The live exposures of `buf`'s memory, `(device, host)`: how many objects lazybuf cannot
/// see use its device copies and its host copy now (which keeps them from eviction and from
/// disk; see docs/SPILLING.md), the views the buffer keeps for reuse included until spilling
/// (or [`reclaim`]) drops them. `ValueError` once the buffer is released.
#[pyfunction]
fn exposures(buf: &Bound<'_, crate::buffer::UnifiedBuffer>) -> PyResult<(usize, usize)> {
    Ok(buf.get().storage_unordered()?.spill().exposures())
}

/// Drops every view a buffer keeps for reuse that nothing else references, as spilling does
/// when it needs room (the binding's reclaim hook); returns how many it dropped.
#[pyfunction]
fn reclaim() -> usize {
    crate::buffer::reclaim_kept_views()
}

/// Builds the `lazybuf.testing` module and registers it in `sys.modules` as `lazybuf.testing`
/// (so `import lazybuf.testing` works).
pub(crate) fn register(parent: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = parent.py();
    // Its full name, which its functions take as their `__module__` (see `mr::register`).
    let module = PyModule::new(py, "lazybuf.testing")?;
    module
        .setattr("__doc__", "Fault injection for tests (wheels built with the crate feature `testing`).")?;
    module.add_class::<PyFaultyDevice>()?;
    module.add_function(wrap_pyfunction!(exposures, &module)?)?;
    module.add_function(wrap_pyfunction!(reclaim, &module)?)?;
    // Not added to the extension's attributes (nor its `__all__`): `lazybuf/__init__.py`
    // makes it `lazybuf.testing` when it is there.
    py.import("sys")?.getattr("modules")?.set_item("lazybuf.testing", &module)?;
    Ok(())
}
