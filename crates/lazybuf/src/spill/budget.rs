//! Per-device memory budgets: the limit set for a device, and the bytes of device memory
//! lazybuf holds on it.
//!
//! Every block of device memory ([`crate::MemoryKind::Device`] and
//! [`crate::MemoryKind::Shared`]) that [`crate::DirectResource`] takes from a backend is
//! charged to its device's ledger and released when it goes back: buffers' device copies,
//! blocks a pool keeps cached, memory objects and `DeviceBuffer`s all count. Zero-copy device
//! copies (aliases of a host block) hold no device memory and count nothing.
//!
//! A limit comes from [`set_memory_limit`] or, for devices no call has set, from the
//! environment variable [`MEMORY_LIMIT_ENV`] (`cuda:0=8GiB,opencl:0=512MiB`), read once.
//!
//! What does not live here: making room under a limit (`spill::eviction`).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::backend::MemoryKind;
use crate::backend::fork::ForkAwareMutex;
use crate::backend::fork::ForkAwareOnce;
use crate::coherence::DeviceId;
use crate::device::Device;
use crate::error::{Error, Result};

/// The environment variable that sets budgets: comma-separated `SELECTOR=SIZE` pairs, where
/// SELECTOR is a device selector ([`crate::select_device`]) and SIZE a byte count with an
/// optional unit (`B`, `KB`, `MB`, `GB`, `TB`, `KiB`, `MiB`, `GiB`, `TiB`).
pub const MEMORY_LIMIT_ENV: &str = "LAZYBUF_MEMORY_LIMIT";

/// No limit: a limit of `u64::MAX` bytes means none (the setters say so; Python refuses that
/// value rather than read it back as `None`).
const UNLIMITED: u64 = u64::MAX;

/// One device's budget and the device memory lazybuf holds on it.
#[derive(Debug)]
pub(crate) struct Ledger {
    /// The limit in bytes; [`UNLIMITED`] for none.
    limit: AtomicU64,
    /// Bytes of device memory held (buffers, cached blocks, memory objects).
    used: AtomicU64,
    /// Whether [`set_memory_limit`] set the limit: the environment's limit, and its error,
    /// no longer apply to this device.
    explicit: AtomicBool,
}

impl Ledger {
    /// The limit, `None` for none.
    pub(crate) fn limit(&self) -> Option<u64> {
        Some(self.limit.load(Ordering::Relaxed)).filter(|&l| l != UNLIMITED)
    }

    /// The bytes held now.
    pub(crate) fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Charges `bytes` whether or not they fit (a block larger than asked for).
    pub(crate) fn try_charge_unchecked(&self, bytes: usize) {
        self.used.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// Charges `bytes` if they fit under the limit (checked and charged in one step, so
    /// racing allocations cannot pass the limit together); returns whether they did.
    pub(crate) fn try_charge(&self, bytes: usize) -> bool {
        let limit = self.limit.load(Ordering::Relaxed);
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(bytes as u64).filter(|&total| total <= limit)
            })
            .is_ok()
    }
}

/// The devices' ledgers. A forked child whose parent's thread held the table at the fork goes
/// on without it ([`ForkAwareMutex`]): each lookup there gets a ledger of its own, so device
/// limits are not kept in that child.
fn ledgers() -> &'static ForkAwareMutex<HashMap<DeviceId, Arc<Ledger>>> {
    static LEDGERS: ForkAwareOnce<ForkAwareMutex<HashMap<DeviceId, Arc<Ledger>>>> = ForkAwareOnce::new();
    LEDGERS.get_or_init(ForkAwareMutex::default)
}

#[cfg(feature = "testing")]
/// Runs `f` while this thread holds the table of ledgers
/// ([`crate::testing::with_spill_locks_held`]).
pub(crate) fn with_locked<R>(f: impl FnOnce() -> R) -> R {
    let _held = ledgers().lock();
    f()
}

/// The ledger of `device`, made at the first call (with the environment's limit for it, if
/// any: one the environment names but cannot be matched is left unset; [`memory_limit`]
/// reports the environment's errors).
pub(crate) fn ledger(device: &Device) -> Arc<Ledger> {
    if let Some(ledger) = ledgers().lock().and_then(|ledgers| ledgers.get(&device.id()).cloned()) {
        return ledger;
    }
    // Resolving the environment's selectors opens the device registry: not under the lock.
    let from_env = env_limit_for(device).ok().flatten().unwrap_or(UNLIMITED);
    if from_env != UNLIMITED {
        ANY_DEVICE_LIMIT.store(true, Ordering::Relaxed);
    }
    let new = || {
        let limit = AtomicU64::new(from_env);
        Arc::new(Ledger { limit, used: AtomicU64::new(0), explicit: AtomicBool::new(false) })
    };
    let Some(mut ledgers) = ledgers().lock() else { return new() };
    Arc::clone(ledgers.entry(device.id()).or_insert_with(new))
}

/// The host's ledger: host blocks lazybuf takes from backends (buffers' host copies, cached
/// host blocks, pinned memory), against the host memory limit.
pub(crate) fn host_ledger() -> &'static Ledger {
    static HOST: Ledger =
        Ledger { limit: AtomicU64::new(UNLIMITED), used: AtomicU64::new(0), explicit: AtomicBool::new(true) };
    &HOST
}

/// Sets (`Some`) or clears (`None`) the host memory limit in bytes: above it, lazybuf writes
/// host copies that hold the only current data of shared buffers to spill files
/// ([`crate::spill::disk`]) before it allocates more host memory. `Some(u64::MAX)` is no
/// limit, as `None` is.
pub fn set_host_memory_limit(limit: Option<u64>) {
    host_ledger().limit.store(limit.unwrap_or(UNLIMITED), Ordering::Relaxed);
}

/// The host memory limit (`None`: no limit).
pub fn host_memory_limit() -> Option<u64> {
    host_ledger().limit()
}

/// The bytes of host memory lazybuf holds (what the host limit is checked against).
pub fn host_memory_held() -> u64 {
    host_ledger().used()
}

/// Counts `bytes` of host memory given back.
pub(crate) fn release_host(bytes: usize) {
    let ledger = host_ledger();
    let _ = ledger
        .used
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| Some(u.saturating_sub(bytes as u64)));
}

/// Counts `bytes` of device memory taken on `device`.
pub(crate) fn charge(device: &Device, bytes: usize) {
    ledger(device).used.fetch_add(bytes as u64, Ordering::Relaxed);
}

/// Counts `bytes` of device memory given back on `device`.
pub(crate) fn release(device: &Device, bytes: usize) {
    let ledger = ledger(device);
    // Never below zero, whatever the order of racing calls.
    let _ = ledger
        .used
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| Some(u.saturating_sub(bytes as u64)));
}

/// Sets (`Some`) or clears (`None`) the memory limit of `device`, in bytes. Above it, lazybuf
/// evicts device copies before it allocates (see [`crate::spill`]); a limit below what is held
/// now takes effect at the next allocation. Overrides the environment's limit for `device`,
/// `None` included, and so its error: where [`MEMORY_LIMIT_ENV`] is malformed, this device
/// has the limit set here (its [`memory_limit`] and allocations work again), while devices
/// no call has set still report the variable's error. `Some(u64::MAX)` is no limit, as
/// `None` is.
///
/// ```
/// let host = lazybuf::Device::host();
/// lazybuf::spill::set_memory_limit(&host, Some(1 << 30));
/// assert_eq!(lazybuf::spill::memory_limit(&host)?, Some(1 << 30));
/// lazybuf::spill::set_memory_limit(&host, None);
/// assert_eq!(lazybuf::spill::memory_limit(&host)?, None);
/// # Ok::<(), lazybuf::Error>(())
/// ```
pub fn set_memory_limit(device: &Device, limit: Option<u64>) {
    let ledger = ledger(device);
    let limit = limit.unwrap_or(UNLIMITED);
    if limit != UNLIMITED {
        ANY_DEVICE_LIMIT.store(true, Ordering::Relaxed);
    }
    ledger.limit.store(limit, Ordering::Relaxed);
    ledger.explicit.store(true, Ordering::Relaxed);
}

/// The memory limit of `device` (`None`: no limit). An error when [`MEMORY_LIMIT_ENV`] is set
/// but malformed, or names a device that does not exist, unless [`set_memory_limit`] set this
/// device's limit.
pub fn memory_limit(device: &Device) -> Result<Option<u64>> {
    let ledger = ledger_checked(device)?;
    Ok(ledger.limit())
}

/// The ledger of `device`, or the environment's error when [`MEMORY_LIMIT_ENV`] is malformed
/// and no [`set_memory_limit`] call overrode it for `device`.
pub(crate) fn ledger_checked(device: &Device) -> Result<Arc<Ledger>> {
    let ledger = ledger(device);
    if !ledger.explicit.load(Ordering::Relaxed) {
        env_limits()?;
    }
    Ok(ledger)
}

/// The bytes of device memory lazybuf holds on `device` now: device copies, cached pool
/// blocks, memory objects (what a limit is checked against).
pub fn memory_held(device: &Device) -> u64 {
    ledger(device).used()
}

/// Whether any device has had a limit (set, or from the environment): until one has, a pool's
/// cache hit asks no ledger ([`over_limit`]).
static ANY_DEVICE_LIMIT: AtomicBool = AtomicBool::new(false);

/// Whether memory of `kind` for `device` is held beyond its limit now (a limit lowered below
/// what is held). A pool must not hand out a cached block then: the allocation would leave the
/// memory held above the limit. Its cached blocks go back instead, and the allocation takes
/// the budgeted path, which evicts or refuses. One relaxed load while no device has a limit.
pub(crate) fn over_limit(device: &Device, kind: MemoryKind) -> bool {
    let over = |ledger: &Ledger| ledger.used() > ledger.limit.load(Ordering::Relaxed);
    match kind {
        MemoryKind::Host { .. } => over(host_ledger()),
        MemoryKind::Device | MemoryKind::Shared => {
            ANY_DEVICE_LIMIT.load(Ordering::Relaxed) && over(&ledger(device))
        }
    }
}

/// The environment's limits, parsed and resolved to devices once: an error when the variable
/// is malformed or names a device that does not exist.
pub(crate) fn env_limits() -> Result<&'static [(Device, u64)]> {
    static RESOLVED: ForkAwareOnce<Result<Vec<(Device, u64)>>> = ForkAwareOnce::new();
    let resolved = RESOLVED.get_or_init(|| {
        let text = crate::env::text(MEMORY_LIMIT_ENV)?.unwrap_or_default();
        let bad = |why: String| Error::invalid("LAZYBUF_MEMORY_LIMIT", why);
        let mut resolved: Vec<(Device, u64, String)> = Vec::new();
        for (selector, limit) in parse_memory_limits(&text)? {
            let device = crate::discovery::select_device(&selector).map_err(|err| {
                bad(format!(
                    "expected SELECTOR=SIZE pairs naming existing devices; {selector:?} names none: {err}"
                ))
            })?;
            // Two selectors of one device (`opencl` and `opencl:0`) would leave which limit
            // holds to their order.
            if let Some((_, _, first)) = resolved.iter().find(|(seen, ..)| *seen == device) {
                return Err(bad(format!(
                    "expected each device once; {first:?} and {selector:?} both name {device}"
                )));
            }
            resolved.push((device, limit, selector));
        }
        Ok(resolved.into_iter().map(|(device, limit, _)| (device, limit)).collect())
    });
    resolved.as_deref().map_err(Error::clone)
}

/// The environment's limit for `device`, if it names it.
fn env_limit_for(device: &Device) -> Result<Option<u64>> {
    Ok(env_limits()?.iter().find(|(named, _)| named == device).map(|&(_, limit)| limit))
}

/// Parses [`MEMORY_LIMIT_ENV`]'s syntax: comma-separated `SELECTOR=SIZE` pairs (empty text:
/// none). The selectors are not resolved here.
///
/// ```
/// let limits = lazybuf::spill::parse_memory_limits("cuda:0=8GiB, opencl:0=512MiB")?;
/// assert_eq!(limits, [("cuda:0".to_string(), 8 << 30), ("opencl:0".to_string(), 512 << 20)]);
/// assert!(lazybuf::spill::parse_memory_limits("cuda:0=lots").is_err());
/// # Ok::<(), lazybuf::Error>(())
/// ```
pub fn parse_memory_limits(text: &str) -> Result<Vec<(String, u64)>> {
    let bad = |why: String| Error::invalid("LAZYBUF_MEMORY_LIMIT", why);
    let mut limits = Vec::new();
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((selector, size)) = pair.split_once('=') else {
            return Err(bad(format!("expected SELECTOR=SIZE (like cuda:0=8GiB), got {pair:?}")));
        };
        let selector = selector.trim();
        if selector.is_empty() {
            return Err(bad(format!("expected a device selector before '=' (like cuda:0), got {pair:?}")));
        }
        let size = parse_size(size).map_err(|err| match err {
            Error::InvalidArgument { reason, .. } => bad(reason),
            other => other,
        })?;
        let selector = selector.to_ascii_lowercase();
        if limits.iter().any(|(seen, _)| *seen == selector) {
            return Err(bad(format!("expected each device once, got {selector:?} twice in {text:?}")));
        }
        limits.push((selector, size));
    }
    Ok(limits)
}

/// Parses a byte count with an optional unit: `512`, `512B`, `1.5GB`, `8GiB`.
///
/// The number is digits with at most one decimal point (`1.`, `.5`), no sign or exponent; the
/// unit is `B`, `KB`/`MB`/`GB`/`TB` (powers of 1000) or `KiB`/`MiB`/`GiB`/`TiB` (powers of 1024),
/// in any case. The value is scaled exactly, in integers: it must be a whole number of bytes
/// (`4.1MB` is 4,100,000 bytes; `1.5B` is refused) below 2**64 - 1, which the setters read as
/// no limit.
pub fn parse_size(text: &str) -> Result<u64> {
    let text = text.trim();
    if let Some(sign) = text.chars().next().filter(|c| matches!(c, '-' | '+')) {
        let why = match sign {
            '-' => "a size cannot be negative",
            _ => "a size takes no sign",
        };
        return Err(Error::invalid(
            "a size",
            format!(
                "expected a non-negative number of bytes without a sign (like 512MiB): {why}, got {text:?}"
            ),
        ));
    }
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len());
    let (number, unit) = (&text[..split], text[split..].trim());
    let scale: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        _ => {
            return Err(Error::invalid(
                "a size",
                format!(
                    "expected a size unit B, KB, MB, GB, TB, KiB, MiB, GiB or TiB, got {unit:?} in {text:?}"
                ),
            ));
        }
    };
    // `number` is ASCII digits and points (the split above): a number has at most one point
    // and at least one digit.
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if fraction.contains('.') || (whole.is_empty() && fraction.is_empty()) {
        return Err(Error::invalid(
            "a size",
            format!("expected a non-negative number of bytes (like 512MiB), got {text:?}"),
        ));
    }
    // The bytes exactly: all the digits as one integer, times the scale, with the point put
    // back `fraction.len()` digits from the right. Decimal digits of any length, so nothing
    // is rounded however many digits are given.
    let digits = times_scale(whole.bytes().chain(fraction.bytes()).map(|digit| digit - b'0'), scale);
    let (bytes, below_one) = digits.split_at(digits.len() - fraction.len());
    let bytes = &bytes[bytes.iter().position(|&d| d != 0).unwrap_or(bytes.len())..];
    let below_one = &below_one[..below_one.iter().rposition(|&d| d != 0).map_or(0, |last| last + 1)];
    // 20 digits hold every u64 (and fit a u128); more are 10**20 or above.
    let bytes = (bytes.len() <= 20)
        .then(|| bytes.iter().fold(0u128, |value, &digit| value * 10 + u128::from(digit)))
        .and_then(|value| u64::try_from(value).ok())
        .filter(|&value| value != u64::MAX)
        .ok_or_else(|| {
            Error::invalid("a size", format!("expected a size below 16 EiB (2**64 - 1 bytes), got {text:?}"))
        })?;
    if !below_one.is_empty() {
        let below_one: String = below_one.iter().map(|&digit| char::from(b'0' + digit)).collect();
        return Err(Error::invalid(
            "a size",
            format!("expected a whole number of bytes, got {text:?} ({bytes}.{below_one} bytes)"),
        ));
    }
    Ok(bytes)
}

/// The decimal digits (most significant first) of the integer `digits` spell, times `scale`:
/// at least as many digits as were given, leading zeros kept.
fn times_scale(digits: impl DoubleEndedIterator<Item = u8>, scale: u64) -> Vec<u8> {
    let mut product = Vec::new();
    let mut carry = 0u128;
    for digit in digits.rev() {
        let value = u128::from(digit) * u128::from(scale) + carry;
        product.push((value % 10) as u8);
        carry = value / 10;
    }
    while carry != 0 {
        product.push((carry % 10) as u8);
        carry /= 10;
    }
    product.reverse();
    product
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fractions_of_a_byte_and_a_device_named_twice_are_refused() {
        // A hostile pass (2026-11-27): "0.5" was a limit of 0 bytes, "1.9B" one of 1, and the
        // first of two limits for one device held silently.
        for text in ["0.5", "1.9B", "0.0003KB"] {
            let err = parse_size(text).unwrap_err().to_string();
            assert!(err.contains("expected a whole number of bytes"), "{text}: {err}");
        }
        assert_eq!(parse_size("1.5KiB").unwrap(), 1536);
        assert_eq!(parse_size("0.5MB").unwrap(), 500_000);
        let err = parse_memory_limits("opencl:0=1MiB,OpenCL:0=2MiB").unwrap_err().to_string();
        assert!(err.contains("expected each device once") && err.contains("LAZYBUF_MEMORY_LIMIT"), "{err}");
    }

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse_size("512").unwrap(), 512);
        assert_eq!(parse_size(" 2KiB ").unwrap(), 2048);
        assert_eq!(parse_size("1.5GB").unwrap(), 1_500_000_000);
        assert_eq!(parse_size("8gib").unwrap(), 8 << 30);
        assert_eq!(parse_size("0").unwrap(), 0);
    }

    #[test]
    fn bad_sizes_say_what_was_expected() {
        for (text, expected) in [
            ("lots", "expected a size unit"),
            ("", "expected a non-negative number"),
            ("-1MiB", "a size cannot be negative"),
            ("-1", "a size cannot be negative"),
            ("+5", "a size takes no sign"),
            (" -0.5GB", "a size cannot be negative"),
            ("1..2GB", "expected a non-negative number"),
            ("99999999TiB", "below 16 EiB"),
        ] {
            let err = parse_size(text).unwrap_err().to_string();
            assert!(err.contains(expected) && err.contains("invalid argument for a size"), "{text:?}: {err}");
            // In the environment variable, the same reason names the variable.
            let err = parse_memory_limits(&format!("host={text}")).unwrap_err().to_string();
            assert!(err.contains(expected) && err.contains("LAZYBUF_MEMORY_LIMIT"), "{text:?}: {err}");
        }
    }

    /// The exact bytes of `hundredths / 100` of `scale`, or `None` when not a whole number.
    fn exact(hundredths: u64, scale: u64) -> Option<u64> {
        let product = u128::from(hundredths) * u128::from(scale);
        (product % 100 == 0).then(|| u64::try_from(product / 100).unwrap())
    }

    #[test]
    fn decimal_sizes_are_scaled_exactly() {
        // A hostile pass: parsed as f64, "4.1MB" was 4099999.9999999995 bytes and refused, as
        // were 170 of the 3,960 spellings of 0.01 to 9.99 with one or two decimals in KB to TB.
        assert_eq!(parse_size("4.1MB").unwrap(), 4_100_000);
        assert_eq!(parse_memory_limits("host=4.1MB").unwrap(), [("host".to_string(), 4_100_000)]);
        let units = [
            ("KB", 1_000),
            ("MB", 1_000_000),
            ("GB", 1_000_000_000),
            ("TB", 1_000_000_000_000),
            ("KiB", 1 << 10),
            ("MiB", 1 << 20),
            ("GiB", 1 << 30),
            ("TiB", 1 << 40),
        ];
        let mut checked = 0;
        for hundredths in 1..=999u64 {
            let (whole, fraction) = (hundredths / 100, hundredths % 100);
            let mut spellings = vec![format!("{whole}.{fraction:02}")];
            if fraction % 10 == 0 {
                spellings.push(format!("{whole}.{}", fraction / 10));
            }
            for (unit, scale) in units {
                for number in &spellings {
                    let text = format!("{number}{unit}");
                    match exact(hundredths, scale) {
                        Some(bytes) => assert_eq!(parse_size(&text).unwrap(), bytes, "{text}"),
                        None => {
                            let err = parse_size(&text).unwrap_err().to_string();
                            let product = hundredths * scale;
                            let below_one = format!("{:02}", product % 100);
                            let bytes = format!("{}.{}", product / 100, below_one.trim_end_matches('0'));
                            assert!(
                                err.contains("expected a whole number of bytes")
                                    && err.contains(&format!("({bytes} bytes)")),
                                "{text}: {err}"
                            );
                        }
                    }
                    checked += 1;
                }
            }
        }
        assert_eq!(checked, 8 * (999 + 99));
    }

    #[test]
    fn large_sizes_are_exact_up_to_the_no_limit_value() {
        // Above 2**53 an f64 changed the value: this was 9007199254740992.
        assert_eq!(parse_size("9007199254740993").unwrap(), 9_007_199_254_740_993);
        assert_eq!(parse_size("9007199254740993B").unwrap(), 9_007_199_254_740_993);
        assert_eq!(parse_size("18446744073709550591").unwrap(), 18_446_744_073_709_550_591);
        assert_eq!(parse_size(&(u64::MAX - 1).to_string()).unwrap(), u64::MAX - 1);
        assert_eq!(parse_size("16777215TiB").unwrap(), 16_777_215 << 40);
        assert_eq!(parse_size("18446744073709551.614KB").unwrap(), u64::MAX - 1);
        // u64::MAX is the setters' "no limit": refused, as Python refuses that int.
        for text in [
            u64::MAX.to_string(),
            "18446744073709551616".to_string(),
            "16777216TiB".to_string(),
            "18446744073709551.615KB".to_string(),
            "99999999999999999999.5".to_string(),
            format!("1{}", "0".repeat(400)),
        ] {
            let err = parse_size(&text).unwrap_err().to_string();
            assert!(err.contains("expected a size below 16 EiB (2**64 - 1 bytes)"), "{text}: {err}");
        }
    }

    #[test]
    fn fractions_of_a_byte_are_named_exactly() {
        for (text, bytes) in [
            ("1.5B", "1.5"),
            ("0.5", "0.5"),
            ("0.001KiB", "1.024"),
            ("1.0000001KB", "1000.0001"),
            ("16777215.999999TiB", "18446744073708452104.372224"),
            ("9007199254740992.5", "9007199254740992.5"),
        ] {
            let err = parse_size(text).unwrap_err().to_string();
            assert!(
                err.contains("expected a whole number of bytes") && err.contains(&format!("({bytes} bytes)")),
                "{text}: {err}"
            );
        }
        // However many digits: nothing is rounded to a whole number.
        let tiny = format!("0.{}1", "0".repeat(400));
        assert!(parse_size(&tiny).unwrap_err().to_string().contains("expected a whole number of bytes"));
    }

    #[test]
    fn the_grammar_is_the_one_f64_parsing_accepted() {
        for (text, bytes) in [
            ("1.", 1),
            (".5KiB", 512),
            ("1.5 GiB", 3 << 29),
            ("\t2 kb ", 2000),
            ("000000000000000000000000000042", 42),
            ("1.000000000000000000000000000000000000000000000000", 1),
            ("0.0000000000009094947017729282379150390625TiB", 1),
        ] {
            assert_eq!(parse_size(text).unwrap(), bytes, "{text:?}");
        }
        for (text, expected) in [
            (".", "expected a non-negative number"),
            ("1.2.3", "expected a non-negative number"),
            ("..5", "expected a non-negative number"),
            ("KiB", "expected a non-negative number"),
            ("1e5", "expected a size unit"),
            ("1.5e3MB", "expected a size unit"),
            ("inf", "expected a size unit"),
            ("5 5", "expected a size unit"),
        ] {
            let err = parse_size(text).unwrap_err().to_string();
            assert!(err.contains(expected), "{text:?}: {err}");
        }
    }

    #[test]
    fn pairs_parse_and_bad_pairs_are_named() {
        assert_eq!(parse_memory_limits("").unwrap(), []);
        assert_eq!(parse_memory_limits("HOST=1KiB,").unwrap(), [("host".to_string(), 1024)]);
        let err = parse_memory_limits("cuda:0").unwrap_err().to_string();
        assert!(err.contains("expected SELECTOR=SIZE"), "{err}");
        let err = parse_memory_limits("=5").unwrap_err().to_string();
        assert!(err.contains("expected a device selector"), "{err}");
    }
}
