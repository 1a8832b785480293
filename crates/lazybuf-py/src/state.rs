//! The core's [`lazybuf::BufferState`] as members of the Python `lazybuf.BufferState` enum.
//!
//! The enum itself is pure Python (`python/lazybuf/_state.py`, the seeds' string values); this
//! module looks its members up once and hands out the cached objects.
//!
//! What does not live here: which state a buffer is in (the core's coherence tracking).

use crate::gil_cell::GilOnceCell;
use pyo3::prelude::*;

use lazybuf::BufferState;

/// The enum's members, by core state.
static MEMBERS: GilOnceCell<Vec<(BufferState, Py<PyAny>)>> = GilOnceCell::new();

fn members(py: Python<'_>) -> PyResult<&'static [(BufferState, Py<PyAny>)]> {
    let members = MEMBERS.get_or_try_init(py, || -> PyResult<_> {
        let class = py.import("lazybuf._state")?.getattr("BufferState")?;
        BufferState::ALL.iter().map(|&s| Ok((s, class.call1((s.name(),))?.unbind()))).collect()
    })?;
    Ok(members)
}

/// Looks the members up (at import: `_state.py` imports nothing of lazybuf's).
pub(crate) fn make_ready(py: Python<'_>) -> PyResult<()> {
    members(py).map(drop)
}

/// The Python enum member for `state`.
pub(crate) fn to_python(py: Python<'_>, state: BufferState) -> PyResult<Py<PyAny>> {
    let members = members(py)?;
    let member = members.iter().find(|(s, _)| *s == state).map(|(_, m)| m.clone_ref(py));
    // Every state the core has is in `BufferState::ALL`; a state added to the core later shows by name.
    match member {
        Some(member) => Ok(member),
        None => Ok(state.name().into_pyobject(py)?.into_any().unbind()),
    }
}
