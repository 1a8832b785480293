//! The two small vocabularies of the guard and the recorder, with no dependencies of their
//! own, so the crate's error type can name them: which way a copy goes ([`Direction`]) and what
//! the guard does with it ([`GuardLevel`]; parsing and meaning in [`super::guard`]).

/// Which way a copy goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Direction {
    /// Host memory to device memory.
    HostToDevice,
    /// Device memory to host memory.
    DeviceToHost,
    /// One device's memory to another's.
    DeviceToDevice,
}

impl Direction {
    /// Every direction, in the guard's order.
    pub const ALL: [Direction; 3] =
        [Direction::HostToDevice, Direction::DeviceToHost, Direction::DeviceToDevice];

    /// The short name: `h2d`, `d2h`, `d2d`.
    pub fn name(self) -> &'static str {
        match self {
            Direction::HostToDevice => "h2d",
            Direction::DeviceToHost => "d2h",
            Direction::DeviceToDevice => "d2d",
        }
    }

    pub(super) fn index(self) -> usize {
        self as usize
    }
}

/// What the guard does with a copy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum GuardLevel {
    /// Every copy runs.
    #[default]
    Allow,
    /// Implicit copies are logged; explicit ones run.
    Log,
    /// Implicit copies are refused; explicit ones run.
    Disallow,
    /// Every copy is logged.
    LogExplicit,
    /// Every copy is refused.
    DisallowExplicit,
}

/// The accepted spellings, in order.
pub(super) const NAMES: [&str; 5] = ["allow", "log", "disallow", "log_explicit", "disallow_explicit"];
