//! The command line: subcommands, options and their help (clap derive). Every subcommand's
//! `--help` ends with examples.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::output::{parse_duration, parse_size};

const ABOUT: &str = "What lazybuf sees on this machine: devices, transfer bandwidth, memory, and a \
                     self-check of the coherence contract.";

const EXAMPLES: &str = "\
Examples:
  lazybuf devices                         every device, and why a backend found none
  lazybuf bandwidth --max 64MiB --plot bw.png
  lazybuf watch --device opencl:0         memory of one device, until Ctrl-C
  lazybuf check                           the coherence contract on every device
  lazybuf trace summary trace.json        a trace recorded by lazybuf.trace

Devices are selected as in LAZYBUF_DEVICE: host, gpu, opencl, opencl:1, cuda:0, ...";

/// The `lazybuf` command.
#[derive(Debug, Parser)]
#[command(name = "lazybuf", version, about = ABOUT, after_help = EXAMPLES, propagate_version = true)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Lists every device: backend, name, vendor, memory, zero-copy threshold.
    #[command(after_help = DEVICES_EXAMPLES)]
    Devices(DevicesArgs),
    /// Measures host-to-device and device-to-host rates of lazybuf's syncs against the
    /// runtime's raw copies, over buffer sizes.
    #[command(after_help = BANDWIDTH_EXAMPLES)]
    Bandwidth(BandwidthArgs),
    /// Shows memory in use, cached by lazybuf's pool, and free, refreshed until Ctrl-C.
    #[command(after_help = WATCH_EXAMPLES)]
    Watch(WatchArgs),
    /// Runs the coherence contract on each device: every state transition, a random sequence
    /// against a reference model, injected allocation failures. Exits non-zero on a divergence.
    #[command(after_help = CHECK_EXAMPLES)]
    Check(CheckArgs),
    /// Reads a trace recorded by lazybuf's event recorder (`lazybuf.trace.dump()`): a summary
    /// of its copies, or a plot of memory in use and copies over time.
    #[command(after_help = TRACE_EXAMPLES)]
    Trace(TraceArgs),
}

const TRACE_EXAMPLES: &str = "\
The file is Chrome trace-event JSON as lazybuf.trace.dump(path) writes it (docs/OBSERVING.md);
ui.perfetto.dev opens the same file.

Examples:
  lazybuf trace summary trace.json          copies and bytes per buffer, direction and reason
  lazybuf trace plot trace.json -o timeline.png
  lazybuf trace plot trace.json -o timeline.svg --size 1600x900";

const TRACE_SUMMARY_EXAMPLES: &str = "\
Examples:
  lazybuf trace summary trace.json
  lazybuf trace summary trace.json | grep total";

const TRACE_PLOT_EXAMPLES: &str = "\
Memory in use per device and kind (host or device memory) as step lines on top; each copy as
a bar below (h2d blue, d2h orange, d2d green; height: its bytes).

Examples:
  lazybuf trace plot trace.json -o timeline.png
  lazybuf trace plot trace.json -o timeline.svg --size 1600x900";

/// `lazybuf trace`.
#[derive(Debug, Args)]
pub struct TraceArgs {
    /// What to do with the trace.
    #[command(subcommand)]
    pub command: TraceCommand,
}

/// `lazybuf trace` subcommands.
#[derive(Debug, Subcommand)]
pub enum TraceCommand {
    /// Copies and bytes per buffer, direction and reason; totals; peak memory per device.
    #[command(after_help = TRACE_SUMMARY_EXAMPLES)]
    Summary {
        /// The trace file.
        file: PathBuf,
    },
    /// Memory in use over time per device and kind, and the copies marked by direction.
    #[command(after_help = TRACE_PLOT_EXAMPLES)]
    Plot {
        /// The trace file.
        file: PathBuf,
        /// The plot: FILE.png or FILE.svg.
        #[arg(long, short = 'o', value_name = "FILE")]
        output: PathBuf,
        /// The plot's size in pixels.
        #[arg(long, value_name = "WxH", default_value = "1200x800", value_parser = parse_plot_size)]
        size: (u32, u32),
    },
}

const DEVICES_EXAMPLES: &str = "\
Free memory comes from the runtime (CUDA), the system (host: MemAvailable), or, where the
runtime cannot tell (OpenCL), the total minus what this process holds: the FREE FROM column
says which. ZERO-COPY FROM is the smallest buffer whose syncs alias host memory.

Examples:
  lazybuf devices
  lazybuf devices --json | python3 -m json.tool
  LD_LIBRARY_PATH=/opt/cuda/lib64 lazybuf devices";

/// `lazybuf devices`.
#[derive(Debug, Args)]
pub struct DevicesArgs {
    /// Prints JSON (schema `lazybuf.devices/1`, see docs/CLI.md) instead of a table.
    #[arg(long)]
    pub json: bool,
}

const BANDWIDTH_EXAMPLES: &str = "\
Each point is the median of repeated copies of one buffer: a lazybuf sync (the other side
marked stale first, so exactly one copy moves) and the runtime's own copy of the same bytes on
lazybuf's queue or stream (OpenCL clEnqueueWrite/ReadBuffer, CUDA cuMemcpyHtoD/DtoH; on the
host device a memcpy). RATIO is lazybuf / raw: 1.00 is raw speed. Zero-copy syncs move no
bytes and are marked so.

Examples:
  lazybuf bandwidth                                  1 KiB to 1 GiB, pinned and pageable
  lazybuf bandwidth --device opencl:0 --max 64MiB --plot bw.png
  lazybuf bandwidth --pinned --min 1MiB --max 256MiB --json bw.json --plot bw.svg";

/// `lazybuf bandwidth`.
#[derive(Debug, Args)]
pub struct BandwidthArgs {
    /// The device to measure (default: LAZYBUF_DEVICE, else the first GPU, else the first
    /// device that is not the host, else the host).
    #[arg(long, short = 'd', value_name = "SEL")]
    pub device: Option<String>,
    /// The smallest buffer (B, KiB, MiB, GiB; KB, MB, GB are powers of 10).
    #[arg(long, value_name = "SIZE", default_value = "1KiB", value_parser = parse_size)]
    pub min: u64,
    /// The largest buffer; sizes double from --min up to it.
    #[arg(long, value_name = "SIZE", default_value = "1GiB", value_parser = parse_size)]
    pub max: u64,
    /// Page-locked host memory only.
    #[arg(long, group = "memory")]
    pub pinned: bool,
    /// Pageable host memory only.
    #[arg(long, group = "memory")]
    pub pageable: bool,
    /// Both pinned and pageable host memory (the default).
    #[arg(long, group = "memory")]
    pub both: bool,
    /// Writes the results as JSON (schema `lazybuf.bandwidth/1`) to FILE (`-`: stdout, and the
    /// table goes to stderr).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Writes a log-log plot of the rates and of the ratios to raw: FILE.png or FILE.svg.
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    /// The plot's size in pixels.
    #[arg(long, value_name = "WxH", default_value = "1200x800", value_parser = parse_plot_size)]
    pub plot_size: (u32, u32),
    /// How long to repeat each point's copies (at least 3 copies are timed).
    #[arg(long, value_name = "DURATION", default_value = "30ms", value_parser = parse_duration)]
    pub time_per_point: Duration,
}

impl BandwidthArgs {
    /// Which host memory to measure: (pageable, pinned).
    pub fn memory(&self) -> (bool, bool) {
        match (self.pinned, self.pageable) {
            (true, _) => (false, true),
            (_, true) => (true, false),
            _ => (true, true),
        }
    }
}

fn parse_plot_size(text: &str) -> Result<(u32, u32), String> {
    let bad = || format!("expected WIDTHxHEIGHT in pixels, each 200 to 8000 (e.g. 1200x800), got {text:?}");
    let (w, h) = text.split_once(['x', 'X']).ok_or_else(bad)?;
    let (w, h): (u32, u32) = (w.trim().parse().map_err(|_| bad())?, h.trim().parse().map_err(|_| bad())?);
    if !(200..=8000).contains(&w) || !(200..=8000).contains(&h) {
        return Err(bad());
    }
    Ok((w, h))
}

const WATCH_EXAMPLES: &str = "\
IN USE is total minus free as the FREE FROM source counts it (the whole machine for the host
and CUDA, this process for OpenCL); POOL IN USE and POOL CACHED are the memory lazybuf's pool
holds in THIS process (run from Python, `lazybuf._lazybuf._cli_main([\"lazybuf\", \"watch\"])`
in a thread shows the interpreter's own pool). On a terminal the lines are redrawn in place;
otherwise one line per device per refresh.

Examples:
  lazybuf watch                               every device, once a second, until Ctrl-C
  lazybuf watch --device cuda:0 --interval 250ms
  lazybuf watch --count 5 --interval 2s > memory.log";

/// `lazybuf watch`.
#[derive(Debug, Args)]
pub struct WatchArgs {
    /// The device to watch (default: every device).
    #[arg(long, short = 'd', value_name = "SEL")]
    pub device: Option<String>,
    /// Time between refreshes (ms, s, m).
    #[arg(long, short = 'i', value_name = "DURATION", default_value = "1s", value_parser = parse_duration)]
    pub interval: Duration,
    /// Stops after N refreshes (default: until Ctrl-C).
    #[arg(long, short = 'n', value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub count: Option<u64>,
}

const CHECK_EXAMPLES: &str = "\
Three parts per device, each compared step by step with a reference model of the contract
(state, data, bytes moved each way, zero-copy syncs, allocations):
  transitions  every operation from every one of the six states (a small buffer, and one
               of the device's zero-copy size where it has one);
  random       random sequences of operations, on buffer sizes from empty to zero-copy sizes;
  faults       each allocation of each transition (small buffer) made to fail in turn: the
               error must surface and the state, counters and data stay as they were; and
               no operation may allocate more than the contract needs.
The first divergence is printed and the exit status is 1.

Examples:
  lazybuf check
  lazybuf check --device opencl:0 --steps 2000
  lazybuf check --seed 42                     repeat a run's random sequences";

/// `lazybuf check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The device to check (default: every device).
    #[arg(long, short = 'd', value_name = "SEL")]
    pub device: Option<String>,
    /// Operations per random sequence.
    #[arg(long, value_name = "N", default_value_t = 200)]
    pub steps: u64,
    /// The random sequences' seed (default: from the clock; printed, to repeat a run).
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,
    /// Test suites only: run on a deliberately broken device (lazybuf's FaultyDevice) whose
    /// N-th copy or allocation fails: `copy:N` or `allocation:N`.
    #[cfg(feature = "testing")]
    #[arg(long, value_name = "KIND:N", hide = true)]
    pub inject_fault: Option<String>,
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn plot_sizes_parse_and_bad_ones_say_what_was_expected() {
        assert_eq!(parse_plot_size("1200x800"), Ok((1200, 800)));
        assert!(parse_plot_size("12x8").unwrap_err().contains("200 to 8000"));
        assert!(parse_plot_size("big").unwrap_err().contains("WIDTHxHEIGHT"));
    }

    #[test]
    fn memory_flags_choose_pinned_pageable_or_both() {
        let parse = |extra: &[&str]| {
            let args = ["lazybuf", "bandwidth"].iter().chain(extra).copied();
            match Cli::try_parse_from(args).unwrap().command {
                Command::Bandwidth(args) => args.memory(),
                _ => unreachable!(),
            }
        };
        assert_eq!(parse(&[]), (true, true));
        assert_eq!(parse(&["--pinned"]), (false, true));
        assert_eq!(parse(&["--pageable"]), (true, false));
        assert_eq!(parse(&["--both"]), (true, true));
        assert!(Cli::try_parse_from(["lazybuf", "bandwidth", "--pinned", "--pageable"]).is_err());
    }
}
