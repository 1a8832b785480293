//! [`DeferredErrors`]: failures that happen where no caller can be told at once.
//!
//! Dropping memory, rolling back a failed access and freeing a block all run on paths that
//! return nothing (`Drop`, clean-up after another error). A runtime can still fail there (a
//! `cuMemFree` reporting an earlier kernel's fault, a transfer that failed while nobody waited
//! for it). Such a failure is recorded on the device whose work failed, as cudarc records the
//! errors of its drops, and the caller takes them when it wants to know
//! ([`crate::Device::take_deferred_errors`]). Never silently dropped, and never a panic.
//!
//! The record is bounded: it keeps the first [`DeferredErrors::CAPACITY`] errors not yet taken
//! and counts the rest, so a loop that leaks failures cannot grow memory without bound.
//!
//! What does not live here: the paths that record (the buffer engine, the resources, each
//! backend's `Drop`s).

use std::sync::Mutex;
use std::sync::PoisonError;

use crate::error::Error;

/// The failures recorded on one device (or one backend context) and not yet taken.
#[derive(Debug, Default)]
pub struct DeferredErrors {
    state: Mutex<Record>,
}

#[derive(Debug, Default)]
struct Record {
    errors: Vec<Error>,
    /// Errors recorded beyond the capacity since the last take.
    overflowed: u64,
}

impl DeferredErrors {
    /// The most errors kept between two takes; later ones are only counted.
    pub const CAPACITY: usize = 64;

    /// Records `err`. Never blocks for long, never panics (a poisoned record is still a list).
    pub fn record(&self, err: Error) {
        let mut record = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if record.errors.len() < Self::CAPACITY {
            record.errors.push(err);
        } else {
            record.overflowed += 1;
        }
    }

    /// Records the error of `result`, if any.
    pub fn record_err<T>(&self, result: Result<T, Error>) {
        if let Err(err) = result {
            self.record(err);
        }
    }

    /// The errors recorded since the last take, oldest first, and how many more were dropped
    /// beyond [`Self::CAPACITY`]; the record is empty afterwards.
    pub fn take(&self) -> (Vec<Error>, u64) {
        let mut record = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        (std::mem::take(&mut record.errors), std::mem::take(&mut record.overflowed))
    }
}
