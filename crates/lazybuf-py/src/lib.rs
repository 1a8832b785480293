//! The `lazybuf` Python package's extension module, `lazybuf._lazybuf`.
//!
//! It binds the core's untyped buffer engine ([`lazybuf::RawBuffer`]) with a run-time
//! element type, so Python gets the seeds' `UnifiedBuffer` API with zero-copy NumPy views,
//! plus devices, memory pools and the interop protocols NumPy, CuPy and PyOpenCL expect. No
//! coherence logic lives here: each Python call is one access on the core buffer.
//!
//! Layout:
//! - [`buffer`]: `UnifiedBuffer` and its access rules;
//! - [`views`]: sharing Rust-owned memory with Python (every raw pointer, and the rule that
//!   views keep memory alive);
//! - [`device_view`]: what `.device` returns on each backend;
//! - [`interop`]: every export to other libraries, one of each: the buffer protocol, DLPack
//!   (through dlpark) and the CUDA array interface;
//! - [`accelerator`]: devices, `get_accelerator()`, the current device;
//! - [`pool`]: `MemoryPool` and `get_memory_pool()` over the core's pool;
//! - [`memory`]: dpctl's memory objects (`MemoryDevice`, `MemoryHost`, `MemoryShared`);
//! - [`mr`]: `lazybuf.mr`, RMM's memory resources (pool, adaptors, the current resource);
//! - [`device_buffer`]: RMM's resizable `DeviceBuffer`; [`hostbuf`] and [`foreign`]: the host
//!   buffers and device sources of memory objects;
//! - [`transfer`]: `Transfer`, an asynchronous sync in flight (awaitable);
//! - [`observe`]: the transfer guard and the event recorder (`lazybuf.transfer_guard`,
//!   `lazybuf.trace`);
//! - [`streams`]: lazybuf's stream for the caller, and ordering after the caller's streams;
//! - [`wire`]: pickling with out-of-band buffers (protocol 5) and the frames of the Dask
//!   serializers (`python/lazybuf/_dask.py`);
//! - [`dtype`], [`args`]: argument validation; [`errors`]: exception mapping; [`state`]:
//!   `BufferState` members; [`gil_cell`]: the once-cells (made with the GIL held, fork-safe);
//! - `testing` (crate feature `testing`): `lazybuf.testing`, the fault-injecting device.
//!
//! The pure-Python side (`python/lazybuf/`) holds the `BufferState` enum, stubs and
//! `py.typed`.

mod accelerator;
mod args;
mod buffer;
mod cupy_stream;
mod device_buffer;
mod device_view;
mod dtype;
mod errors;
mod foreign;
mod gil_cell;
mod hostbuf;
mod interop;
mod lock;
mod memory;
mod mr;
mod observe;
mod pool;
mod spill;
mod spill_state;
mod state;
mod streams;
#[cfg(feature = "testing")]
mod testing;
mod trace_pickle;
mod transfer;
mod views;
mod wire;

use pyo3::prelude::*;

#[pymodule]
fn _lazybuf(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // NumPy's import failure (or a Ctrl-C during it) as raised, never a panic.
    dtype::make_ready(m.py())?;
    // The exception classes' module is imported by the package first; import it here too so
    // that its failure is raised as it is, and a panic in making the classes' cells (PyO3's
    // `import_exception!` panics where the module cannot be had) is an ImportError.
    m.py().import("lazybuf.exceptions")?;
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| errors::make_ready(m.py()))).map_err(|_| {
        pyo3::exceptions::PyImportError::new_err(
            "lazybuf could not load its exception classes from lazybuf.exceptions; expected the \
             lazybuf package's own lazybuf/exceptions.py next to the extension",
        )
    })?;
    // The state enum's members, looked up now rather than at a buffer's first `state`, which
    // may come from a finalizer late in the interpreter's shutdown, when imports fail.
    state::make_ready(m.py())?;
    // The per-object locks tell a forked child that their holder was not copied (`lock.rs`).
    lazybuf::backend::fork::watch_every_fork();
    m.add_class::<buffer::UnifiedBuffer>()?;
    m.add_class::<accelerator::PyDevice>()?;
    m.add_class::<accelerator::Accelerator>()?;
    m.add_class::<device_view::DeviceMemoryView>()?;
    m.add_class::<views::MemoryOwner>()?;
    m.add_class::<views::HostBlock>()?;
    m.add_class::<pool::PyMemoryPool>()?;
    m.add_class::<pool::PyPoolStats>()?;
    m.add_class::<transfer::PyTransfer>()?;
    m.add_function(wrap_pyfunction!(pool::get_memory_pool, m)?)?;
    m.add_function(wrap_pyfunction!(pool::caching, m)?)?;
    m.add_function(wrap_pyfunction!(pool::set_caching, m)?)?;
    m.add_function(wrap_pyfunction!(pool::trim, m)?)?;
    m.add_function(wrap_pyfunction!(accelerator::get_accelerator, m)?)?;
    m.add_function(wrap_pyfunction!(accelerator::_rebuild_device, m)?)?;
    m.add_function(wrap_pyfunction!(buffer::_rebuild_buffer, m)?)?;
    m.add_class::<device_buffer::PyDeviceBuffer>()?;
    m.add_function(wrap_pyfunction!(device_buffer::to_device, m)?)?;
    m.add_function(wrap_pyfunction!(device_buffer::_rebuild_device_buffer, m)?)?;
    m.add_class::<memory::PyMemory>()?;
    m.add_class::<memory::PyMemoryDevice>()?;
    m.add_class::<memory::PyMemoryHost>()?;
    m.add_class::<memory::PyMemoryShared>()?;
    m.add_function(wrap_pyfunction!(memory::_rebuild_memory, m)?)?;
    mr::register(m)?;
    m.add_class::<wire::DeviceFrame>()?;
    m.add_function(wrap_pyfunction!(wire::_rebuild_buffer_from_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(wire::_host_frame, m)?)?;
    m.add_function(wrap_pyfunction!(wire::_device_frame, m)?)?;
    m.add_function(wrap_pyfunction!(wire::_fill_from_device_pointer, m)?)?;
    m.add("BackendUnavailableError", m.py().get_type::<errors::BackendUnavailableError>())?;
    #[cfg(feature = "testing")]
    testing::register(m)?;
    m.add("CoherenceError", m.py().get_type::<errors::CoherenceError>())?;
    m.add_function(wrap_pyfunction!(errors::set_checking, m)?)?;
    m.add_function(wrap_pyfunction!(errors::checking, m)?)?;
    m.add_function(wrap_pyfunction!(_cli_main, m)?)?;
    observe::register(m)?;
    spill::add(m)?;
    lazybuf::spill::registry::set_reclaim_hook(buffer::reclaim_kept_views);
    Ok(())
}

/// Runs the `lazybuf` command-line tool (`python -m lazybuf`) with `argv` (the program name
/// first) and returns its exit status. The GIL is released while it runs; Ctrl-C is Python's
/// (checked between refreshes and measurements), so the interpreter's own handler stays. The
/// arguments are taken as the operating system gave them (`os.fsencode`'s bytes): a file name
/// that is not UTF-8 is a file name, as for the executable (a `str` with the surrogates
/// `surrogateescape` made raised `UnicodeEncodeError`: the twenty-second hostile pass).
#[pyfunction]
fn _cli_main(py: Python<'_>, argv: Vec<std::ffi::OsString>) -> i32 {
    let context = lazybuf_cli::Context::new(|| Python::attach(|py| py.check_signals().is_err()));
    py.detach(|| lazybuf_cli::run(argv, &context))
}
