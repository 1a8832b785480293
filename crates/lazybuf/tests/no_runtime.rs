//! A binary built with every backend starts and works where their runtimes are missing:
//! absent runtimes are reported, never panicked on.
//!
//! The parent test re-runs this test binary as a child process in two situations:
//! - the OpenCL ICD loader present but no platform (`OCL_ICD_VENDORS` pointing nowhere);
//! - no loadable libOpenCL at all: a private mount namespace (`unshare -m`, needs root) hides
//!   the library behind /dev/null. Where that is impossible the case says so and is skipped.
//!
//! The child asserts that OpenCL is reported unavailable with a reason, that selecting it is a
//! clear error, and that buffers work on the default device.

use std::path::PathBuf;
use std::process::Command;

use lazybuf::{BackendKind, BufferState, Error, UnifiedBuffer};

const CHILD_ENV: &str = "LAZYBUF_NO_RUNTIME_CHILD";

/// Runs only as the child of the tests below.
#[test]
fn child_without_opencl() {
    let Ok(expected) = std::env::var(CHILD_ENV) else { return };
    let status = lazybuf::backend_status();
    let opencl = status.iter().find(|s| s.backend == BackendKind::OpenCl).expect("OpenCL is compiled in");
    let reason = opencl.devices.clone().expect_err("OpenCL must be unavailable in this child");
    assert!(reason.contains(&expected), "expected {expected:?} in {reason:?}");
    assert!(lazybuf::devices().iter().all(|d| d.backend_kind() != BackendKind::OpenCl));
    let err = lazybuf::select_device("opencl").unwrap_err();
    assert!(matches!(err, Error::DeviceNotFound { .. }), "{err}");
    let mut buf = UnifiedBuffer::<f32>::new(&[16]).unwrap();
    buf.host_mut().unwrap().fill(2.0);
    buf.sync_to_device().unwrap();
    assert_eq!(buf.state(), BufferState::Synchronized);
    assert_eq!(buf.to_vec().unwrap(), vec![2.0; 16]);
    println!("child ok: {reason}");
}

fn child(command: &mut Command, expected: &str) {
    let out = command
        .args(["--exact", "child_without_opencl", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, expected)
        .env_remove("LAZYBUF_REQUIRE")
        .env_remove("LAZYBUF_DEVICE")
        .output()
        .expect("the test binary runs");
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed:\n{text}");
    assert!(text.contains("child ok"), "the child did not run its checks:\n{text}");
    assert!(!text.contains("panicked"), "a panic was printed:\n{text}");
}

#[test]
fn no_opencl_platform_is_reported_not_panicked_on() {
    let exe = std::env::current_exe().unwrap();
    child(Command::new(exe).env("OCL_ICD_VENDORS", "/nonexistent-lazybuf-test"), "no OpenCL platform");
}

fn opencl_library() -> Option<PathBuf> {
    ["/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/lib"]
        .iter()
        .map(|dir| PathBuf::from(dir).join("libOpenCL.so.1"))
        .find(|p| p.exists())
        .and_then(|p| p.canonicalize().ok())
}

#[test]
fn no_opencl_library_is_reported_not_panicked_on() {
    let Some(library) = opencl_library() else {
        // No libOpenCL on this machine: the situation is already the real one.
        let exe = std::env::current_exe().unwrap();
        return child(&mut Command::new(exe), "libOpenCL could not be loaded");
    };
    let probe = Command::new("unshare").args(["-m", "true"]).output();
    if !probe.is_ok_and(|o| o.status.success()) {
        eprintln!("SKIPPED: cannot hide {} (needs `unshare -m`, i.e. root)", library.display());
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let script = format!("mount --bind /dev/null '{}' && exec \"$0\" \"$@\"", library.display());
    child(
        Command::new("unshare").args(["-m", "sh", "-c", &script]).arg(exe),
        "libOpenCL could not be loaded",
    );
}
