//! The `lazybuf` executable: installs a Ctrl-C (SIGINT) handler that asks the run to stop,
//! then runs the tool ([`lazybuf_cli::run`]) and exits with its status.

use std::sync::atomic::{AtomicBool, Ordering};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

fn main() {
    // Without a handler (it could not be installed) Ctrl-C still ends the process, by the
    // default signal action.
    let _ = ctrlc::set_handler(|| INTERRUPTED.store(true, Ordering::SeqCst));
    let context = lazybuf_cli::Context::with_signal_flag(&INTERRUPTED);
    std::process::exit(lazybuf_cli::run(std::env::args_os(), &context));
}
