//! # lazybuf-cli: the `lazybuf` command-line tool
//!
//! What `clinfo`, `nvidia-smi` and CUDA's `bandwidthTest` answer for one runtime each, for
//! every backend lazybuf knows:
//! - [`devices`]: every device, what it reports, and why a backend found nothing;
//! - [`bandwidth`]: host-to-device and device-to-host rates of lazybuf's syncs next to the
//!   runtime's raw copy, as a table, JSON and a log-log plot;
//! - [`watch`]: memory in use, cached by lazybuf's pool, and free, refreshed until Ctrl-C;
//! - [`check`]: a short run of the coherence contract on each device.
//!
//! The crate is a library and a binary: `src/main.rs` is the `lazybuf` executable, and the
//! Python package runs the same [`run`] (`python -m lazybuf`), so both print the same output.
//!
//! Layout: [`cli`] (the arguments, parsed by clap), [`output`] (terminal detection, tables,
//! sizes and durations), one module per subcommand, and [`error`] (the one-line error that
//! ends a run).
//!
//! ## Feature flags
#![doc = document_features::document_features!()]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]

/// `println!` that returns write errors (a closed pipe) instead of panicking: `?` passes them
/// up as a [`CliError`].
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout(), $($arg)*)?
    }};
}

/// `eprintln!` that ignores write errors: a message to a closed stderr has nowhere to go.
macro_rules! errln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

pub mod bandwidth;
pub mod check;
pub mod cli;
pub mod devices;
pub mod error;
pub mod output;
pub mod trace;
pub mod watch;

use std::ffi::OsString;
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use clap::Parser;

pub use error::{CliError, Result};

/// How a run is told that the user asked it to stop (Ctrl-C).
///
/// The binary installs a SIGINT handler that sets a flag ([`Context::with_signal_flag`]); the
/// Python package asks the interpreter instead, so `python -m lazybuf` keeps Python's own
/// handler.
#[derive(Clone)]
pub struct Context {
    interrupted: Arc<dyn Fn() -> bool + Send + Sync>,
}

impl Context {
    /// A context whose interruption is whatever `interrupted` says when asked.
    pub fn new(interrupted: impl Fn() -> bool + Send + Sync + 'static) -> Context {
        Context { interrupted: Arc::new(interrupted) }
    }

    /// A context interrupted when `flag` is set (by a signal handler).
    pub fn with_signal_flag(flag: &'static AtomicBool) -> Context {
        Context::new(move || flag.load(Ordering::SeqCst))
    }

    /// A context that is never interrupted.
    pub fn uninterruptible() -> Context {
        Context::new(|| false)
    }

    /// Whether the user asked the run to stop.
    pub fn interrupted(&self) -> bool {
        (self.interrupted)()
    }
}

/// Runs the tool with `args` (the first one is the program's name, as in `std::env::args`)
/// and returns the process exit status: 0 on success, 1 on an error (one line on stderr) or a
/// failed `check`, 2 on bad arguments (clap's message), 130 for a run stopped by Ctrl-C
/// (`watch` stops cleanly with 0 instead: stopping is how it ends). A closed stdout is an
/// error before any subcommand runs; a pipe whose reader has gone ends the run quietly (0).
pub fn run<I, T>(args: I, context: &Context) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match cli::Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(err) => {
            // --help and --version are "errors" that print to stdout and exit 0: a stdout that
            // takes nothing (`lazybuf --help > /dev/full`) is an error of the run then, as for
            // every subcommand's output (it exited 0: the twenty-second hostile pass), except
            // a reader that went away.
            let printed = err.print().and_then(|()| std::io::stdout().flush());
            return match printed {
                Err(io) if !err.use_stderr() && io.kind() != std::io::ErrorKind::BrokenPipe => {
                    let _ = writeln!(std::io::stderr(), "lazybuf: error: cannot write to stdout: {io}");
                    1
                }
                _ => err.exit_code(),
            };
        }
    };
    // A closed stdout (`lazybuf devices >&-`): refuse before anything opens a file that could
    // take descriptor 1 and receive the output (Rust's stdout would drop it silently).
    let status = if stdout_is_closed() {
        Err(CliError::new("cannot write to stdout: it is closed (Bad file descriptor)"))
    } else {
        Ok(())
    };
    let status = status.and_then(|()| match cli.command {
        cli::Command::Devices(args) => devices::run(&args),
        cli::Command::Bandwidth(args) => bandwidth::run(&args, context),
        cli::Command::Watch(args) => watch::run(&args, context),
        cli::Command::Check(args) => check::run(&args, context),
        cli::Command::Trace(args) => trace::run(&args, context),
    });
    let status = status.and_then(|code| std::io::stdout().flush().map(|()| code).map_err(CliError::from));
    match status {
        Ok(code) => code,
        // A reader that went away (`lazybuf devices | head -1`) is not an error of ours.
        Err(err) if err.is_broken_pipe() => 0,
        Err(err) => {
            let _ = writeln!(std::io::stderr(), "lazybuf: error: {err}");
            err.exit_code()
        }
    }
}

/// Whether the process's standard output is a closed descriptor.
#[cfg(unix)]
fn stdout_is_closed() -> bool {
    use std::os::fd::AsFd;
    // Duplicating a descriptor fails with EBADF exactly when it is not open.
    std::io::stdout().as_fd().try_clone_to_owned().is_err_and(|e| e.raw_os_error() == Some(9))
}

/// Whether the process's standard output is a closed descriptor (only checked on Unix).
#[cfg(not(unix))]
fn stdout_is_closed() -> bool {
    false
}
