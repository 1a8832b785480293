//! Device discovery and the default device.
//!
//! Each runtime in [`crate::backend::REGISTERED`] is probed once per process; every call
//! returns the same opened [`Device`]s, so identities are stable. An absent runtime is reported
//! in [`backend_status`], never panicked on. The default device is, in order: the device named
//! by `LAZYBUF_DEVICE`, the first GPU (in the table's order, so CUDA first), the host.
//!
//! Selectors (`LAZYBUF_DEVICE`, [`select_device`]): `host`, `gpu`, a backend name (`opencl`,
//! `cuda`, `wgpu`: its first device), or a backend and an index (`opencl:1`). wgpu devices also
//! answer to the graphics API under them (`vulkan`, `metal`, `dx12`, with an index among the
//! devices of that API: [`crate::backend::SELECTOR_ALIASES`]).

use crate::backend::fork::ForkAwareOnce;
use crate::backend::{REGISTERED, SELECTOR_ALIASES};
use crate::device::Device;
use crate::error::{BackendKind, Error, Result};

/// The environment variable that picks the default device.
pub const DEVICE_ENV: &str = "LAZYBUF_DEVICE";

/// What one backend's probe found.
#[derive(Clone, Debug)]
pub struct BackendStatus {
    /// The backend probed.
    pub backend: BackendKind,
    /// The number of devices it opened, or why it is unavailable.
    pub devices: Result<usize, String>,
}

struct Registry {
    devices: Vec<Device>,
    status: Vec<BackendStatus>,
}

static REGISTRY: ForkAwareOnce<Registry> = ForkAwareOnce::new();

fn registry() -> &'static Registry {
    REGISTRY.get_or_init(|| {
        let mut devices = Vec::new();
        let mut status = Vec::new();
        for registration in REGISTERED {
            let found = (registration.open_all)();
            status.push(BackendStatus {
                backend: registration.kind,
                devices: found.as_ref().map(Vec::len).map_err(ToString::to_string),
            });
            devices.extend(found.unwrap_or_default().into_iter().map(Device::from_backend));
        }
        status.push(BackendStatus { backend: BackendKind::HOST, devices: Ok(1) });
        devices.push(Device::host());
        Registry { devices, status }
    })
}

/// The devices [`devices`] found, if anything asked for them yet; none opened otherwise.
/// For work over the open devices only (trimming), which must not open every backend.
pub(crate) fn devices_found() -> &'static [Device] {
    REGISTRY.get().map_or(&[], |registry| registry.devices.as_slice())
}

/// Every device of every available backend, the host device last.
///
/// ```
/// for device in lazybuf::devices() {
///     let info = device.info();
///     println!("{}: {} ({:?}), {} bytes", device.name(), info.vendor, info.backend, info.total_memory);
/// }
/// assert!(lazybuf::devices().iter().any(|d| d.backend_kind().name() == "host")); // the host is last
/// ```
pub fn devices() -> Vec<Device> {
    registry().devices.clone()
}

/// What each compiled-in backend found (device counts, or why it is unavailable).
pub fn backend_status() -> Vec<BackendStatus> {
    registry().status.clone()
}

/// The default device: `LAZYBUF_DEVICE` if set, else the first GPU (CUDA before others), else
/// the host.
///
/// ```
/// // The first GPU when there is one, else the host (`LAZYBUF_DEVICE=host` forces the host).
/// let device = lazybuf::default_device()?;
/// let mut buf = lazybuf::UnifiedBuffer::<f32>::on(&[256], &device)?;
/// buf.host_overwrite()?.fill(2.0);
/// buf.sync_to_device()?; // uploads (on the host device: nothing to copy)
/// assert_eq!(buf.to_vec()?, vec![2.0; 256]);
/// # Ok::<(), lazybuf::Error>(())
/// ```
pub fn default_device() -> Result<Device> {
    match crate::env::text(DEVICE_ENV)? {
        Some(selector) if !selector.trim().is_empty() => select_device(&selector),
        _ => Ok(preferred()),
    }
}

/// The first GPU in discovery order (which follows the backend table), else the host.
fn preferred() -> Device {
    registry().devices.iter().find(|d| d.info().is_gpu).cloned().unwrap_or_else(Device::host)
}

/// Selector names of the backends this build was compiled without, and the cargo feature that
/// brings each in: a selector naming one is "not compiled in", not "no such device".
const NOT_COMPILED_IN: &[(&str, &str)] = &[
    #[cfg(not(feature = "opencl"))]
    ("opencl", "opencl"),
    #[cfg(not(feature = "cuda"))]
    ("cuda", "cuda"),
    #[cfg(not(feature = "wgpu"))]
    ("wgpu", "wgpu"),
    #[cfg(not(feature = "wgpu"))]
    ("vulkan", "wgpu"),
    #[cfg(not(feature = "wgpu"))]
    ("metal", "wgpu"),
    #[cfg(not(feature = "wgpu"))]
    ("dx12", "wgpu"),
];

/// Finds a device by selector (see the module docs).
///
/// ```
/// let host = lazybuf::select_device("host")?;
/// assert!(host.info().shares_host_memory);
/// // A selector no device matches is an error that lists the devices there are.
/// assert!(lazybuf::select_device("opencl:99").is_err());
/// # Ok::<(), lazybuf::Error>(())
/// ```
pub fn select_device(selector: &str) -> Result<Device> {
    let registry = registry();
    let wanted = selector.trim().to_ascii_lowercase();
    let not_found = |reason: String| Error::DeviceNotFound { selector: selector.to_string(), reason };
    let known = || {
        registry
            .devices
            .iter()
            .map(|d| format!("{} ({})", d.backend_kind(), d.name()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if wanted == "gpu" {
        return registry
            .devices
            .iter()
            .find(|d| d.info().is_gpu)
            .cloned()
            .ok_or_else(|| not_found(format!("no GPU found; devices: {}", known())));
    }
    let (name, index) = match wanted.split_once(':') {
        Some((name, index)) => {
            let index = index.parse::<usize>().map_err(|_| {
                not_found(format!("expected BACKEND:INDEX with a non-negative integer index, got {index:?}"))
            })?;
            (name.to_string(), index)
        }
        None => (wanted.clone(), 0),
    };
    // A backend's name picks its devices; an alias (`vulkan`) the devices of its backend that
    // answer to it.
    let alias = SELECTOR_ALIASES.iter().find(|(alias, _)| *alias == name).map(|&(_, kind)| kind);
    if let Some((_, feature)) = NOT_COMPILED_IN.iter().find(|(backend, _)| *backend == name) {
        return Err(not_found(format!(
            "{name} is not compiled in: this build of lazybuf lacks the cargo feature `{feature}` \
             (build with `--features {feature}`)"
        )));
    }
    let backend = crate::backend::kinds().find(|b| b.name() == name).or(alias).ok_or_else(|| {
        // Each backend's name, then the aliases of its devices.
        let names: Vec<String> = crate::backend::kinds()
            .flat_map(|kind| {
                std::iter::once(kind.name())
                    .chain(SELECTOR_ALIASES.iter().filter(move |(_, k)| *k == kind).map(|(alias, _)| *alias))
            })
            .map(|b| format!("{b}[:N]"))
            .collect();
        not_found(format!("expected one of gpu, {}; got {name:?}", names.join(", ")))
    })?;
    let of_backend: Vec<&Device> = registry
        .devices
        .iter()
        .filter(|d| d.backend_kind() == backend && (alias.is_none() || d.answers_to(&name)))
        .collect();
    if of_backend.is_empty() {
        let why = registry
            .status
            .iter()
            .find(|s| s.backend == backend)
            .and_then(|s| s.devices.clone().err())
            .unwrap_or_else(|| match alias {
                Some(_) => format!("none of {backend}'s devices runs on {name}; devices: {}", known()),
                None => "no device found".into(),
            });
        return Err(not_found(format!("{name} has no device: {why}")));
    }
    of_backend.get(index).map(|d| (*d).clone()).ok_or_else(|| {
        not_found(format!("{name} has {} device(s), index {index} is out of range", of_backend.len()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_is_always_listed_and_selectable() {
        assert!(devices().iter().any(|d| d.backend_kind() == BackendKind::HOST));
        assert_eq!(devices().last(), Some(&Device::host()));
        assert_eq!(select_device("host").unwrap(), Device::host());
        assert_eq!(select_device(" HOST:0 ").unwrap(), Device::host());
    }

    #[test]
    fn bad_selectors_say_what_was_expected() {
        let err = select_device("tpu").unwrap_err().to_string();
        assert!(err.contains("expected one of gpu,") && err.contains("host[:N]"), "{err}");
        let err = select_device("host:x").unwrap_err().to_string();
        assert!(err.contains("non-negative integer"), "{err}");
        let err = select_device("host:3").unwrap_err().to_string();
        assert!(err.contains("out of range"), "{err}");
    }

    #[test]
    fn devices_are_opened_once() {
        assert_eq!(devices(), devices());
    }
}
