//! The same binary on a machine with no CUDA driver, with a driver but no GPU, with a driver
//! too old for the backend, with GPUs that cannot access each other's memory, and where
//! pinned staging memory cannot be had. Each
//! situation needs its own process (CUDA is probed once per process), so each test here
//! re-runs this test binary with one `#[ignore]`d child test and a different environment;
//! the children run only that way.
//!
//! The situations with a driver use the driver-API test double (its directory must be in
//! LD_LIBRARY_PATH, as `scripts/test-cuda-double.sh` sets it); without it they print a skip.

#![cfg(feature = "cuda")]

mod cuda_common;

use std::path::PathBuf;
use std::process::Command;

use cuda_common::{DOUBLE_NAME, copies, fail_allocation, pinned_copies, ramp};
use lazybuf::backend::cuda::STAGING_CHUNK;
use lazybuf::{BackendKind, BufferState, Device, UnifiedBuffer};

/// Runs the child test `name` in a new process of this binary with `env` changed (`None`
/// removes a variable) and checks that it ran and passed.
fn run_child(name: &str, env: &[(&str, Option<&str>)]) {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command.args([name, "--exact", "--ignored", "--nocapture", "--test-threads=1"]);
    command.env_remove(lazybuf::discovery::DEVICE_ENV);
    for (key, value) in env {
        match value {
            Some(value) => command.env(key, value),
            None => command.env_remove(key),
        };
    }
    let output = command.output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "child {name} failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("1 passed"), "child {name} did not run:\n{stdout}\n{stderr}");
    assert!(!stderr.contains("panicked"), "child {name} panicked:\n{stderr}");
    eprint!("{stderr}");
}

/// The directory holding the test double, from LD_LIBRARY_PATH; `None` after a skip message.
/// These situations need the double (a real driver cannot be told to have no GPU, or an old
/// entry point): without it they skip, visibly, also on a machine with a GPU, and fail only
/// when `LAZYBUF_REQUIRE` names `cuda-double` (as scripts/test-cuda-double.sh does).
fn double_dir(test: &str) -> Option<PathBuf> {
    let path = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
    let found = std::env::split_paths(&path).find(|dir| dir.join("old-driver/libcuda.so.1").exists());
    if found.is_none() {
        let required = std::env::var("LAZYBUF_REQUIRE").unwrap_or_default();
        assert!(
            !required.split(',').any(|name| name.trim() == "cuda-double"),
            "{test}: LAZYBUF_REQUIRE names cuda-double but LD_LIBRARY_PATH holds no CUDA test double"
        );
        eprintln!(
            "SKIPPED {test}: needs the CUDA driver test double in LD_LIBRARY_PATH \
             (scripts/test-cuda-double.sh); a real driver cannot play this situation"
        );
    }
    found
}

fn cuda_status() -> Result<usize, String> {
    let status = lazybuf::backend_status().into_iter().find(|s| s.backend == BackendKind::CUDA);
    status.expect("CUDA is compiled in and always probed").devices
}

/// Whatever CUDA says, the rest of lazybuf works: the host device and its buffers.
fn everything_else_works() {
    let mut buf = UnifiedBuffer::<f32>::new(&[16]).unwrap();
    buf.copy_from(&[1.5; 16]).unwrap();
    buf.sync_to_device().unwrap();
    assert_eq!(buf.to_vec().unwrap(), vec![1.5; 16]);
    assert!(lazybuf::devices().contains(&Device::host()));
    assert!(lazybuf::devices().iter().all(|d| d.backend_kind() != BackendKind::CUDA));
    let err = lazybuf::select_device("cuda").unwrap_err().to_string();
    assert!(err.contains("cuda has no device"), "{err}");
}

#[test]
fn without_a_driver_cuda_is_reported_absent() {
    run_child("child_without_a_driver", &[("LD_LIBRARY_PATH", None)]);
}

#[test]
#[ignore = "run in a child process by without_a_driver_cuda_is_reported_absent"]
fn child_without_a_driver() {
    match cuda_status() {
        Err(reason) => assert!(reason.contains("libcuda could not be loaded"), "{reason}"),
        Ok(_) => {
            let names: Vec<String> = lazybuf::devices().iter().map(|d| d.name().to_string()).collect();
            assert!(!names.iter().any(|n| n.starts_with(DOUBLE_NAME)), "the double loaded: {names:?}");
            eprintln!("SKIPPED child_without_a_driver: this machine has a CUDA driver installed");
            return;
        }
    }
    everything_else_works();
}

#[test]
fn a_driver_without_a_gpu_is_reported_absent() {
    if double_dir("a_driver_without_a_gpu_is_reported_absent").is_some() {
        run_child("child_driver_without_a_gpu", &[("LAZYBUF_CUDA_DOUBLE_DEVICES", Some("0"))]);
    }
}

#[test]
#[ignore = "run in a child process by a_driver_without_a_gpu_is_reported_absent"]
fn child_driver_without_a_gpu() {
    let reason = cuda_status().unwrap_err();
    assert!(reason.contains("reports no device (CUDA_ERROR_NO_DEVICE)"), "{reason}");
    everything_else_works();
}

#[test]
fn a_driver_lacking_an_entry_point_is_reported_absent() {
    let Some(dir) = double_dir("a_driver_lacking_an_entry_point_is_reported_absent") else { return };
    let old = dir.join("old-driver");
    run_child("child_driver_lacking_an_entry_point", &[("LD_LIBRARY_PATH", Some(old.to_str().unwrap()))]);
}

#[test]
#[ignore = "run in a child process by a_driver_lacking_an_entry_point_is_reported_absent"]
fn child_driver_lacking_an_entry_point() {
    let reason = cuda_status().unwrap_err();
    assert!(reason.contains("lacks cuMemcpyPeerAsync"), "{reason}");
    everything_else_works();
}

#[test]
fn with_gpus_cuda_devices_are_listed_and_used() {
    if double_dir("with_gpus_cuda_devices_are_listed_and_used").is_some() {
        run_child("child_with_gpus", &[("LAZYBUF_CUDA_DOUBLE_DEVICES", Some("3"))]);
    }
}

#[test]
#[ignore = "run in a child process by with_gpus_cuda_devices_are_listed_and_used"]
fn child_with_gpus() {
    assert_eq!(cuda_status(), Ok(3));
    let cuda: Vec<Device> =
        lazybuf::devices().into_iter().filter(|d| d.backend_kind() == BackendKind::CUDA).collect();
    assert_eq!(cuda.len(), 3);
    assert!(cuda.iter().all(|d| d.name().starts_with(DOUBLE_NAME) && d.info().is_gpu));
    assert_eq!(lazybuf::default_device().unwrap(), cuda[0]);
    let mut buf = UnifiedBuffer::<u16>::new(&[3, 5]).unwrap();
    buf.copy_from(&[4; 15]).unwrap();
    buf.sync_to_device().unwrap();
    assert_eq!(buf.transfer_stats().host_to_device.bytes, 30);
}

#[test]
fn without_peer_access_device_copies_go_through_the_host() {
    if double_dir("without_peer_access_device_copies_go_through_the_host").is_some() {
        run_child("child_without_peer_access", &[("LAZYBUF_CUDA_DOUBLE_PEER", Some("0"))]);
    }
}

#[test]
#[ignore = "run in a child process by without_peer_access_device_copies_go_through_the_host"]
fn child_without_peer_access() {
    let cuda: Vec<Device> =
        lazybuf::devices().into_iter().filter(|d| d.backend_kind() == BackendKind::CUDA).collect();
    let [first, second, ..] = &cuda[..] else { panic!("the double has two devices by default") };
    let data = ramp(300_000);
    let mut buf = UnifiedBuffer::from_slice(&data, first).unwrap();
    buf.device_mut().map(drop).unwrap(); // only `first` is valid
    buf.reset_transfer_stats();
    buf.sync_to(second).unwrap();
    let stats = buf.transfer_stats();
    assert_eq!(stats.device_to_device.bytes, 0);
    assert_eq!((stats.device_to_host.bytes, stats.host_to_device.bytes), (300_000, 300_000));
    assert_eq!(buf.state_on(second), BufferState::Synchronized);
    buf.mark_dirty_on(second).unwrap();
    assert_eq!(buf.to_vec().unwrap(), data);
}

#[test]
fn with_peer_access_device_copies_are_direct() {
    if double_dir("with_peer_access_device_copies_are_direct").is_some() {
        run_child("child_with_peer_access", &[("LAZYBUF_CUDA_DOUBLE_PEER", Some("1"))]);
    }
}

#[test]
#[ignore = "run in a child process by with_peer_access_device_copies_are_direct"]
fn child_with_peer_access() {
    let cuda: Vec<Device> =
        lazybuf::devices().into_iter().filter(|d| d.backend_kind() == BackendKind::CUDA).collect();
    let [first, second, ..] = &cuda[..] else { panic!("the double has two devices by default") };
    let data = ramp(300_000);
    let mut buf = UnifiedBuffer::from_slice(&data, first).unwrap();
    buf.device_mut().map(drop).unwrap(); // only `first` is valid
    buf.reset_transfer_stats();
    buf.sync_to(second).unwrap();
    let stats = buf.transfer_stats();
    assert_eq!(stats.device_to_device.bytes, 300_000);
    assert_eq!(stats.device_to_host.bytes + stats.host_to_device.bytes, 0);
    assert_eq!(buf.state_on(second), BufferState::DeviceDirty, "the host stays stale");
    buf.mark_dirty_on(second).unwrap();
    assert_eq!(buf.to_vec().unwrap(), data);
}

#[test]
fn without_pinned_staging_large_transfers_take_the_drivers_path() {
    if double_dir("without_pinned_staging_large_transfers_take_the_drivers_path").is_some() {
        run_child("child_without_pinned_staging", &[]);
    }
}

#[test]
#[ignore = "run in a child process by without_pinned_staging_large_transfers_take_the_drivers_path"]
fn child_without_pinned_staging() {
    let cuda: Vec<Device> =
        lazybuf::devices().into_iter().filter(|d| d.backend_kind() == BackendKind::CUDA).collect();
    let n = 3 * STAGING_CHUNK;
    let mut buf = UnifiedBuffer::from_slice(&ramp(n), &cuda[0]).unwrap();
    // This fresh process has no staging yet: the device allocation succeeds, the staging
    // allocation after it fails, and the upload still arrives, by the driver's own path.
    fail_allocation(2);
    let (all, pinned) = (copies(), pinned_copies());
    buf.sync_to_device().unwrap();
    assert_eq!((copies() - all, pinned_copies() - pinned), (1, 0));
    // The next large transfer of a block moved for the first time gets its staging.
    let mut other = UnifiedBuffer::from_slice(&ramp(n), &cuda[0]).unwrap();
    let (all, pinned) = (copies(), pinned_copies());
    other.sync_to_device().unwrap();
    assert_eq!((copies() - all, pinned_copies() - pinned), (3, 3));
}
