//! lazybuf's environment variables, read as text: one reader, so that a value that is not
//! Unicode is never taken for an unset variable.
//!
//! `std::env::var` returns the same `Err` for an unset variable and for one whose value is not
//! valid Unicode, and `.ok()`, `unwrap_or_default()` or a `match` on `Ok` read both as unset:
//! before the nineteenth hostile pass, `LAZYBUF_TRANSFER_GUARD=$'\xff'disallow` left the guard
//! off (a guard that was asked for, silently off), and `LAZYBUF_MEMORY_LIMIT`,
//! `LAZYBUF_DEVICE` and `LAZYBUF_EVICTION_POLICY` the same way fell back to no limit, the
//! default device and the default policy, where a malformed value is an error.
//! `process_wide_settings_read_the_environment_through_one_reader`
//! (`tests/hostile19.rs`) fails on any other `std::env::var` in the crate's sources.

use crate::error::{Error, Result};

/// The value of `name`: `None` when it is unset, an error naming it when it is not Unicode.
pub(crate) fn text(name: &'static str) -> Result<Option<String>> {
    match std::env::var_os(name) {
        None => Ok(None),
        Some(value) => value.into_string().map(Some).map_err(|value| {
            Error::invalid(
                name,
                format!(
                    "expected UTF-8 text, got {:?} (the bytes that are not UTF-8 shown as U+FFFD)",
                    value.to_string_lossy()
                ),
            )
        }),
    }
}

/// A switch's value: `None` when it is unset or not Unicode (a switch takes the values it
/// names and reads anything else as its default, so such a value is its default too).
pub(crate) fn switch(name: &'static str) -> Option<String> {
    text(name).ok().flatten()
}
