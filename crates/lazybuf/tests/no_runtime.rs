//! A binary built with every backend starts and works where their runtimes are missing:
//! absent runtimes are reported, never panicked on.
//!
//! The parent tests re-run this test binary as a child process in these situations:
//! - the OpenCL ICD loader present but no platform (`OCL_ICD_VENDORS` pointing nowhere,
//!   `OCL_ICD_FILENAMES` cleared, and /etc/OpenCL/vendors hidden where root);
//! - no loadable libOpenCL at all: a private mount namespace (`unshare -m`, needs root) hides
//!   every libOpenCL the dynamic loader could open (its cache, `LD_LIBRARY_PATH`, the default
//!   directories, CUDA toolkits, which ship a copy of their own) behind /dev/null. Where that is
//!   impossible, or a copy still loads, the case says so and is skipped;
//! - (feature `wgpu`) the Vulkan loader present but no driver (`VK_DRIVER_FILES` and
//!   `VK_ICD_FILENAMES` pointing nowhere, the ICD directories hidden where root), and no
//!   loadable libvulkan at all (hidden the same way as libOpenCL).
//!
//! The child asserts that the backend is reported unavailable with a reason, that selecting it
//! is a clear error, and that buffers work on the default device.

use std::path::PathBuf;
use std::process::Command;

use lazybuf::{BufferState, Error, UnifiedBuffer};

const CHILD_ENV: &str = "LAZYBUF_NO_RUNTIME_CHILD";
/// The backend the child must find missing (default `opencl`).
const BACKEND_ENV: &str = "LAZYBUF_NO_RUNTIME_BACKEND";
/// Set when the child may find that OpenCL still loads (a copy of libOpenCL nobody could hide).
const MAY_SKIP_ENV: &str = "LAZYBUF_NO_RUNTIME_MAY_SKIP";

/// Runs only as the child of the tests below.
#[test]
fn child_without_the_runtime() {
    let Ok(expected) = std::env::var(CHILD_ENV) else { return };
    let name = std::env::var(BACKEND_ENV).unwrap_or_else(|_| "opencl".into());
    let status = lazybuf::backend_status();
    let backend = status.iter().find(|s| s.backend.name() == name).expect("the backend is compiled in");
    if backend.devices.is_ok() && std::env::var_os(MAY_SKIP_ENV).is_some() {
        println!("child skipped: {name} still loads despite the hiding: {backend:?}");
        return;
    }
    let reason = backend.devices.clone().expect_err("the backend must be unavailable in this child");
    assert!(reason.contains(&expected), "expected {expected:?} in {reason:?}");
    assert!(lazybuf::devices().iter().all(|d| d.backend_kind() != backend.backend));
    let err = lazybuf::select_device(&name).unwrap_err();
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
        .args(["--exact", "child_without_the_runtime", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, expected)
        .env_remove("LAZYBUF_REQUIRE")
        .env_remove("LAZYBUF_DEVICE")
        .output()
        .expect("the test binary runs");
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed:\n{text}");
    assert!(!text.contains("panicked"), "a panic was printed:\n{text}");
    if let Some(line) = text.lines().find(|l| l.contains("child skipped")) {
        eprintln!("SKIPPED: {line}");
        return;
    }
    assert!(text.contains("child ok"), "the child did not run its checks:\n{text}");
}

/// Whether this process may make a private mount namespace (`unshare -m`, needs root).
fn can_unshare() -> bool {
    Command::new("unshare").args(["-m", "true"]).output().is_ok_and(|o| o.status.success())
}

#[test]
fn no_opencl_platform_is_reported_not_panicked_on() {
    let exe = std::env::current_exe().unwrap();
    if opencl_libraries().is_empty() {
        eprintln!(
            "SKIPPED: no libOpenCL on this machine, so no ICD loader to find no platform (the no-library case covers it)"
        );
        return;
    }
    // ICD loaders find platforms in `OCL_ICD_VENDORS` (else /etc/OpenCL/vendors) and in
    // `OCL_ICD_FILENAMES`, which container runtimes set for NVIDIA's ICD. Point the first
    // nowhere and clear the second; where possible also hide the vendors directory behind an
    // empty tmpfs, for loaders that ignore `OCL_ICD_VENDORS`. Without that, a platform that
    // still shows up is a visible skip.
    let vendors = "/etc/OpenCL/vendors";
    let mut command = if std::path::Path::new(vendors).is_dir() && can_unshare() {
        let script = format!("mount -t tmpfs none {vendors} && exec \"$0\" \"$@\"");
        let mut command = Command::new("unshare");
        command.args(["-m", "sh", "-c", &script]).arg(exe);
        command
    } else {
        let mut command = Command::new(exe);
        command.env(MAY_SKIP_ENV, "1");
        command
    };
    command.env("OCL_ICD_VENDORS", "/nonexistent-lazybuf-test").env_remove("OCL_ICD_FILENAMES");
    child(&mut command, "no OpenCL platform");
}

/// Every libOpenCL the dynamic loader could open, by canonical path (hiding that file hides
/// every name that links to it): the loader's cache, `LD_LIBRARY_PATH`, the default
/// directories, and CUDA toolkits.
fn opencl_libraries() -> Vec<PathBuf> {
    libraries("libOpenCL.so")
}

/// Every library whose file name starts with `prefix` that the dynamic loader could open (see
/// [`opencl_libraries`]).
fn libraries(prefix: &str) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
        "/lib64",
        "/lib",
    ]
    .iter()
    .map(PathBuf::from)
    .collect();
    let search = std::env::var_os("LD_LIBRARY_PATH").unwrap_or_default();
    dirs.extend(std::env::split_paths(&search));
    for entry in std::fs::read_dir("/usr/local").into_iter().flatten().flatten() {
        if entry.file_name().to_string_lossy().starts_with("cuda") {
            dirs.push(entry.path().join("lib64"));
            dirs.extend(
                std::fs::read_dir(entry.path().join("targets"))
                    .into_iter()
                    .flatten()
                    .flatten()
                    .map(|t| t.path().join("lib")),
            );
        }
    }
    let mut found: Vec<PathBuf> = dirs
        .iter()
        .flat_map(|dir| std::fs::read_dir(dir).into_iter().flatten().flatten())
        .filter(|entry| entry.file_name().to_string_lossy().starts_with(prefix))
        .map(|entry| entry.path())
        .collect();
    if let Ok(cache) = Command::new("ldconfig").arg("-p").output() {
        let listing = String::from_utf8_lossy(&cache.stdout).to_string();
        found.extend(
            listing
                .lines()
                .filter(|line| line.trim_start().starts_with(prefix))
                .filter_map(|line| line.split("=>").nth(1))
                .map(|path| PathBuf::from(path.trim())),
        );
    }
    let mut canonical: Vec<PathBuf> = found.iter().filter_map(|p| p.canonicalize().ok()).collect();
    canonical.sort();
    canonical.dedup();
    canonical
}

#[test]
fn no_opencl_library_is_reported_not_panicked_on() {
    let libraries = opencl_libraries();
    let exe = std::env::current_exe().unwrap();
    if libraries.is_empty() {
        // No libOpenCL on this machine: the situation is already the real one.
        return child(&mut Command::new(exe), "libOpenCL could not be loaded");
    }
    if !can_unshare() {
        eprintln!("SKIPPED: cannot hide {libraries:?} (needs `unshare -m`, i.e. root)");
        return;
    }
    child_hiding(&libraries, "opencl", "libOpenCL could not be loaded");
}

/// Runs the child in a private mount namespace with `libraries` hidden behind /dev/null.
fn child_hiding(libraries: &[PathBuf], backend: &str, expected: &str) {
    let exe = std::env::current_exe().unwrap();
    let binds: Vec<String> =
        libraries.iter().map(|library| format!("mount --bind /dev/null '{}'", library.display())).collect();
    let script = format!("{} && exec \"$0\" \"$@\"", binds.join(" && "));
    child(
        Command::new("unshare")
            .args(["-m", "sh", "-c", &script])
            .arg(exe)
            .env(MAY_SKIP_ENV, "1")
            .env(BACKEND_ENV, backend),
        expected,
    );
}

#[cfg(feature = "wgpu")]
#[test]
fn no_vulkan_library_is_reported_not_panicked_on() {
    let libraries = libraries("libvulkan.so");
    let exe = std::env::current_exe().unwrap();
    if libraries.is_empty() {
        return child(Command::new(exe).env(BACKEND_ENV, "wgpu"), "no Vulkan, Metal or DX12 adapter");
    }
    if !can_unshare() {
        eprintln!("SKIPPED: cannot hide {libraries:?} (needs `unshare -m`, i.e. root)");
        return;
    }
    child_hiding(&libraries, "wgpu", "no Vulkan, Metal or DX12 adapter");
}

#[cfg(feature = "wgpu")]
#[test]
fn no_vulkan_driver_is_reported_not_panicked_on() {
    let exe = std::env::current_exe().unwrap();
    if libraries("libvulkan.so").is_empty() {
        eprintln!(
            "SKIPPED: no libvulkan on this machine, so no loader to find no driver (the no-library case covers it)"
        );
        return;
    }
    // The loader finds drivers through `VK_DRIVER_FILES`/`VK_ICD_FILENAMES` (pointed nowhere
    // here) and the ICD directories, hidden behind empty tmpfs mounts where possible.
    let dirs: Vec<&str> = ["/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d", "/usr/local/share/vulkan/icd.d"]
        .into_iter()
        .filter(|dir| std::path::Path::new(dir).is_dir())
        .collect();
    let mut command = if can_unshare() && !dirs.is_empty() {
        let mounts: Vec<String> = dirs.iter().map(|dir| format!("mount -t tmpfs none {dir}")).collect();
        let script = format!("{} && exec \"$0\" \"$@\"", mounts.join(" && "));
        let mut command = Command::new("unshare");
        command.args(["-m", "sh", "-c", &script]).arg(exe);
        command
    } else {
        let mut command = Command::new(exe);
        command.env(MAY_SKIP_ENV, "1");
        command
    };
    command
        .env(BACKEND_ENV, "wgpu")
        .env("VK_DRIVER_FILES", "/nonexistent-lazybuf-test.json")
        .env("VK_ICD_FILENAMES", "/nonexistent-lazybuf-test.json")
        .env_remove("VK_ADD_DRIVER_FILES");
    child(&mut command, "no Vulkan, Metal or DX12 adapter");
}
