//! The one error type of the tool: a message that fits on one line, and the exit status it
//! ends the run with.

use std::fmt;

/// Why a run stopped early. Printed as `lazybuf: error: {message}` on stderr.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CliError {
    message: String,
    exit_code: i32,
    broken_pipe: bool,
}

impl CliError {
    /// An error that ends the run with status 1.
    pub fn new(message: impl Into<String>) -> CliError {
        CliError { message: one_line(&message.into()), exit_code: 1, broken_pipe: false }
    }

    /// The run was stopped by Ctrl-C (status 130, as shells report SIGINT).
    pub fn interrupted() -> CliError {
        CliError { message: "interrupted".into(), exit_code: 130, broken_pipe: false }
    }

    /// The exit status the run ends with.
    pub fn exit_code(&self) -> i32 {
        self.exit_code
    }

    /// Whether the error is a write to a pipe whose reader has gone.
    pub fn is_broken_pipe(&self) -> bool {
        self.broken_pipe
    }

    /// Adds what was being done: `context: message`.
    pub fn context(self, context: impl fmt::Display) -> CliError {
        CliError { message: format!("{context}: {}", self.message), ..self }
    }
}

/// Joins a multi-line message into one line.
fn one_line(message: &str) -> String {
    message.lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join("; ")
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CliError {}

impl From<lazybuf::Error> for CliError {
    fn from(err: lazybuf::Error) -> CliError {
        CliError::new(err.to_string())
    }
}

impl From<std::io::Error> for CliError {
    fn from(err: std::io::Error) -> CliError {
        CliError {
            broken_pipe: err.kind() == std::io::ErrorKind::BrokenPipe,
            ..CliError::new(err.to_string())
        }
    }
}

impl From<serde_json::Error> for CliError {
    fn from(err: serde_json::Error) -> CliError {
        CliError::new(format!("JSON: {err}"))
    }
}

/// The tool's result type.
pub type Result<T, E = CliError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_one_line() {
        let err = CliError::new("first\n  second\n\nthird").context("writing x.png");
        assert_eq!(err.to_string(), "writing x.png: first; second; third");
        assert_eq!(err.exit_code(), 1);
        assert_eq!(CliError::interrupted().exit_code(), 130);
    }
}
