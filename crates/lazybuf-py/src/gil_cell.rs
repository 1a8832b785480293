//! Once-cells made while holding the GIL: the binding's only kind, safe across `fork()`.
//!
//! PyO3's `PyOnceLock` (and `intern!` and `import_exception!`, built on it) releases the GIL
//! before it starts making a value and takes it back inside the cell's own once: for the whole
//! making, the cell is *being made by that thread*. Another thread can take the GIL in between
//! and `fork()`; the child inherits a cell being made by a thread that does not exist there,
//! and its first use of the cell waits forever. Making a value often releases the GIL anyway
//! (an import reads files), which widens the window to the whole import. Two such hangs were
//! found by a hostile script in rust-numpy's cells (made at import since, see
//! [`crate::dtype::make_ready`]).
//!
//! [`GilOnceCell`] never holds a cell across a GIL release: the value is made with the GIL
//! held and the cell untouched, then stored under the GIL in one step. A child forked while
//! another thread is making a value finds the cell empty and makes the value itself. Two
//! threads may both make a value (when the making releases the GIL); the first stored wins and
//! every caller gets that one, so an identity handed out is always the same object.
//!
//! `crates/lazybuf-py/clippy.toml` forbids PyO3's kinds in this crate, so a new cell cannot
//! be written the old way. What does not live here: the cells of the crates the binding uses
//! (rust-numpy's are made at import) and lazybuf's own locks held at a fork (PYTHON.md,
//! "Processes").

use std::sync::OnceLock;

use pyo3::Python;

/// A value made once per process, with the GIL held (see the module docs).
pub(crate) struct GilOnceCell<T>(OnceLock<T>);

impl<T> GilOnceCell<T> {
    /// An empty cell.
    pub(crate) const fn new() -> Self {
        GilOnceCell(OnceLock::new())
    }

    /// The value, made by `make` if no thread has stored one yet.
    pub(crate) fn get_or_init(&self, py: Python<'_>, make: impl FnOnce() -> T) -> &T {
        match self.get_or_try_init(py, || Ok::<T, std::convert::Infallible>(make())) {
            Ok(value) => value,
            Err(never) => match never {},
        }
    }

    /// The value, made by `make` if no thread has stored one yet; `make`'s error is returned
    /// and the cell left empty, so a later call tries again.
    pub(crate) fn get_or_try_init<E>(
        &self,
        _py: Python<'_>,
        make: impl FnOnce() -> Result<T, E>,
    ) -> Result<&T, E> {
        if let Some(value) = self.0.get() {
            return Ok(value);
        }
        let value = make()?;
        // With the GIL held no other thread is inside this once (its closure only moves a
        // value and never releases the GIL), so this neither waits nor spans a fork. When
        // another thread stored a value while `make` ran, that one is kept and `value` dropped.
        Ok(self.0.get_or_init(move || value))
    }
}

/// An interned Python `str` for a literal, made once per call site: the binding's `intern!`.
macro_rules! interned {
    ($py:expr, $text:literal) => {{
        static INTERNED: $crate::gil_cell::GilOnceCell<::pyo3::Py<::pyo3::types::PyString>> =
            $crate::gil_cell::GilOnceCell::new();
        INTERNED.get_or_init($py, || ::pyo3::types::PyString::intern($py, $text).unbind()).bind($py)
    }};
}
pub(crate) use interned;
