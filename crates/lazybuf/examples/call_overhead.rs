//! lazybuf's own cost per blocking call, for instruction counting (docs/BENCHMARKS.md,
//! "Blocking-call overhead"): on the host device, whose device copy aliases the host block,
//! a call moves no bytes, so what is left is the bookkeeping.
//!
//! ```text
//! cargo run --release --example call_overhead -- N [dirty|current]
//! ```
//! runs N rounds of `mark_host_dirty()` + `sync_to_device()` (`dirty`, the default) or of
//! `sync_to_device()` on a current copy (`current`). Under
//! `valgrind --tool=callgrind`, (instructions at N) minus (instructions at 0), divided by N, is
//! the cost of one round, free of this machine's timing noise.

use lazybuf::{Device, UnifiedBuffer};

fn main() -> lazybuf::Result<()> {
    let rounds: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(0);
    let current = std::env::args().nth(2).as_deref() == Some("current");
    let mut buf = UnifiedBuffer::<f32>::on(&[256], &Device::host())?;
    buf.host_mut()?.fill(1.0);
    buf.sync_to_device()?;
    for _ in 0..rounds {
        if !current {
            buf.mark_host_dirty()?;
        }
        buf.sync_to_device()?;
    }
    std::hint::black_box(&buf);
    Ok(())
}
