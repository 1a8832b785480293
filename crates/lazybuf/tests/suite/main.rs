//! The integration suites that need no process of their own, in one test binary (one build
//! and one link instead of one per file). Each module is one suite, with its own docs; a test
//! is named by its module, e.g. `contract::fill_on_the_device`, so
//! `cargo test --test suite contract::` runs one suite.
//!
//! What may live here: tests that touch no process-wide switch (the coherence checker, the
//! transfer guard, the recorder and its `tracing` events, spilling's budgets and eviction
//! policy, the pools' global trim, the CUDA test double's hooks) and do not count what the
//! whole process holds (locked memory, one backend's allocations), because the tests of all
//! these modules run at once on the harness's threads. A test that reads a device's free
//! memory as this process's own count reads it again until no other test moved it meanwhile
//! (`contract::a_new_buffer_allocates_nothing`, `wgpu::free_memory_follows_allocations`).
//! Per-device switches are set only on a device of the test's own
//! (`lazybuf::testing::FaultyDevice::wrap`). The suites that need a process of their own stay
//! files of their own in `tests/` (see docs/TESTING.md).

#[path = "../common/mod.rs"]
mod common;
#[path = "../cuda_common/mod.rs"]
mod cuda_common;

mod adopted;
mod bad_input;
mod contract;
mod cuda;
#[cfg(feature = "testing")]
mod faults;
mod loopback;
mod memory;
mod memory_observed;
mod opencl_kernel;
#[cfg(feature = "testing")]
mod pool;
mod pool_stress;
mod read_into;
mod resources;
#[cfg(feature = "testing")]
mod spill_model;
#[cfg(feature = "testing")]
mod streams;
mod wgpu;
