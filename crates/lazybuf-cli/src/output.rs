//! Plain and terminal output: whether stdout and stderr are terminals, colour (only on a
//! terminal, never with `NO_COLOR` or `TERM=dumb`), aligned tables, and the units the tool
//! reads and prints (sizes in B/KiB/MiB/GiB, durations in ms/s/m); text from files made safe
//! to print ([`printable`]); output files written whole or not at all ([`write_file`]).

use std::io::{IsTerminal, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::error::CliError;

/// What the run's output goes to.
#[derive(Clone, Copy, Debug)]
pub struct Terminal {
    /// stdout is a terminal: redraw in place, colour allowed.
    pub stdout: bool,
    /// stderr is a terminal: progress bars allowed.
    pub stderr: bool,
    /// Colour on stdout.
    pub colour: bool,
}

impl Terminal {
    /// Looks at the process's stdout, stderr and environment.
    pub fn detect() -> Terminal {
        let stdout = std::io::stdout().is_terminal();
        let stderr = std::io::stderr().is_terminal();
        let no_colour = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty())
            || std::env::var("TERM").is_ok_and(|t| t == "dumb");
        Terminal { stdout, stderr, colour: stdout && !no_colour }
    }

    /// `text` in green (on a colour terminal).
    pub fn good(&self, text: &str) -> String {
        self.paint(text, "32")
    }

    /// `text` in red (on a colour terminal).
    pub fn bad(&self, text: &str) -> String {
        self.paint(text, "31")
    }

    /// `text` in bold (on a colour terminal).
    pub fn bold(&self, text: &str) -> String {
        self.paint(text, "1")
    }

    fn paint(&self, text: &str, code: &str) -> String {
        if self.colour { format!("\x1b[{code}m{text}\x1b[0m") } else { text.to_string() }
    }
}

/// Formats rows under headers, each column as wide as its widest cell, separated by two
/// spaces; trailing spaces are trimmed.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let columns = headers.len();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate().take(columns) {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut out = String::new();
        for (i, cell) in cells.enumerate() {
            out.push_str(cell);
            if i + 1 < columns {
                out.extend(std::iter::repeat_n(' ', widths[i] - cell.chars().count() + 2));
            }
        }
        out.trim_end().to_string()
    };
    let mut out = line(&mut headers.iter().copied());
    for row in rows {
        out.push('\n');
        out.push_str(&line(&mut row.iter().map(String::as_str)));
    }
    out
}

/// Parses a size: a number and an optional unit (B, KiB, MiB, GiB, TiB; K, M, G are binary
/// too; KB, MB, GB are powers of 10). Case-insensitive; `64KiB`, `1 GiB`, `4096`.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let bad = || format!("expected a size such as 4096, 64KiB, 16MiB or 1GiB, got {text:?}");
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let number: f64 = number.parse().map_err(|_| bad())?;
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024.0 * 1024.0,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        // Every unit `format_bytes` prints is read back (a PiB in a message could not be).
        "p" | "pib" => 1024.0 * 1024.0 * 1024.0 * 1024.0 * 1024.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        "pb" => 1e15,
        _ => return Err(bad()),
    };
    let bytes = number * scale;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 || bytes.fract() != 0.0 {
        return Err(bad());
    }
    Ok(bytes as u64)
}

/// Parses a duration: a number and a unit (`ms`, `s`, `m`; a bare number is seconds), e.g.
/// `250ms`, `1s`, `1.5s`, `2m`. Zero is refused. A duration beyond what [`Duration`] holds
/// (`18446744073709551615s` rounds up past it) is [`Duration::MAX`]: for `watch
/// --interval`, a wait until Ctrl-C.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("expected a duration such as 250ms, 1s or 2m, got {text:?}");
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let number: f64 = number.parse().map_err(|_| bad())?;
    let seconds = match unit.trim() {
        "ms" => number / 1e3,
        "" | "s" => number,
        "m" | "min" => number * 60.0,
        _ => return Err(bad()),
    };
    match Duration::try_from_secs_f64(seconds) {
        Ok(d) if !d.is_zero() => Ok(d),
        // Only digits and dots were parsed: the number is not negative or NaN, so an error
        // for a positive one is an overflow (infinity included).
        Err(_) if seconds > 0.0 => Ok(Duration::MAX),
        _ => Err(bad()),
    }
}

/// A byte count in binary units, three significant digits: `0 B`, `1 KiB`, `1.50 MiB`,
/// `22.9 GiB`.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else if value.fract() == 0.0 {
        format!("{value:.0} {}", UNITS[unit])
    } else if value < 10.0 {
        format!("{value:.2} {}", UNITS[unit])
    } else if value < 100.0 {
        format!("{value:.1} {}", UNITS[unit])
    } else {
        format!("{value:.0} {}", UNITS[unit])
    }
}

/// A rate in GB/s (10^9 bytes per second) with three significant digits.
pub fn format_rate(gb_per_s: f64) -> String {
    if !gb_per_s.is_finite() {
        "-".into()
    } else if gb_per_s >= 100.0 {
        format!("{gb_per_s:.0}")
    } else if gb_per_s >= 10.0 {
        format!("{gb_per_s:.1}")
    } else if gb_per_s >= 0.01 {
        format!("{gb_per_s:.2}")
    } else {
        format!("{gb_per_s:.4}")
    }
}

/// `text` with every control character (C0, DEL, C1) and every bidirectional-text control
/// escaped as `\u{..}` (`\t`, `\n`, `\r` as such), so that text read from a file cannot
/// drive the terminal it is printed on; other text, non-ASCII included, is kept as it is.
pub fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        let bidi = matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
        if c.is_control() || bidi {
            match c {
                '\t' | '\n' | '\r' => out.extend(c.escape_default()),
                _ => out.extend(c.escape_unicode()),
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Writes `bytes` to `path`. A regular file, or a new one, is written whole or not at all:
/// into a new temporary file in the same folder, flushed to the disk, then renamed over it. On
/// any failure the temporary file is removed and an earlier file at `path` is left as it was;
/// the error is one line naming `path` and the system's reason (`writing t.png: No space left
/// on device (os error 28)`). A symbolic link is written through (its target is replaced, the
/// link kept); an existing file keeps its permissions, and one this process may not write
/// (read-only) is refused, as opening it for writing would be.
///
/// Anything else is written in place, never replaced: where the process's own stdout or stderr
/// goes (`/dev/stdout`, `/proc/self/fd/1`, or the file they were redirected to: after what was
/// printed there), a FIFO (opening it waits for a reader, as a shell's redirection does), a
/// character device (`/dev/null`). A folder, or a link to nothing, is refused. Returns where
/// the bytes went, so that a "wrote PATH" line is not printed into the output itself.
pub fn write_file(path: &Path, bytes: &[u8]) -> crate::Result<Written> {
    let error = |e: std::io::Error| CliError::from(e).context(format!("writing {}", path.display()));
    let metadata = match std::fs::metadata(path) {
        Ok(m) => Some(m),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(error(e)),
    };
    let Some(metadata) = metadata else {
        if std::fs::symlink_metadata(path).is_ok() {
            return Err(CliError::new(format!(
                "writing {}: it is a symbolic link to nothing; expected a file, or a link to one",
                path.display()
            )));
        }
        return replace_whole(path, None, bytes).map(|()| Written::File).map_err(error);
    };
    if metadata.is_dir() {
        return Err(CliError::new(format!("writing {}: it is a directory", path.display())));
    }
    if let Some(stream) = standard_stream_at(&metadata) {
        return stream.write(bytes).map(|()| Written::StandardStream).map_err(error);
    }
    if !metadata.is_file() {
        let mut file = std::fs::OpenOptions::new().write(true).open(path).map_err(error)?;
        return file.write_all(bytes).and_then(|()| file.flush()).map(|()| Written::InPlace).map_err(error);
    }
    // Through links to the file itself, so the rename replaces the file and keeps the links.
    let target = std::fs::canonicalize(path).map_err(error)?;
    // Only a file this process may write is replaced, as opening it for writing would be
    // refused (the rename needs only the folder writable: a read-only file was replaced, the
    // twentieth hostile pass). Opened without truncating, to ask, and closed.
    std::fs::OpenOptions::new().write(true).open(&target).map_err(error)?;
    replace_whole(&target, Some(metadata.permissions()), bytes).map(|()| Written::File).map_err(error)
}

/// Where [`write_file`] put the bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Written {
    /// A regular file, new or replaced whole.
    File,
    /// Written in place: a FIFO or a device.
    InPlace,
    /// This process's stdout or stderr.
    StandardStream,
}

impl Written {
    /// Whether a "wrote PATH" line may follow: not when the bytes went to stdout or stderr,
    /// where the line would land in the output itself.
    pub fn may_say_so(self) -> bool {
        self != Written::StandardStream
    }
}

/// Writes `bytes` into a new temporary file beside `target`, then renames it over `target`.
fn replace_whole(
    target: &Path,
    permissions: Option<std::fs::Permissions>,
    bytes: &[u8],
) -> std::io::Result<()> {
    let (temporary, mut file) = temporary_beside(target)?;
    let written = (|| {
        file.write_all(bytes)?;
        if let Some(permissions) = permissions {
            file.set_permissions(permissions)?;
        }
        // Where the file system allocates late, a full disk shows here, not in the write.
        file.sync_all()?;
        drop(file);
        std::fs::rename(&temporary, target)
    })();
    written.inspect_err(|_| {
        let _ = std::fs::remove_file(&temporary);
    })
}

/// The process's stdout or stderr.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(unix), expect(dead_code, reason = "only Unix can tell a path is stdout or stderr"))]
enum StandardStream {
    Stdout,
    Stderr,
}

impl StandardStream {
    fn write(self, bytes: &[u8]) -> std::io::Result<()> {
        match self {
            StandardStream::Stdout => {
                let mut out = std::io::stdout().lock();
                out.write_all(bytes).and_then(|()| out.flush())
            }
            StandardStream::Stderr => std::io::stderr().lock().write_all(bytes),
        }
    }
}

/// Whether the file `metadata` describes is the one this process's stdout or stderr writes to
/// (the same device and inode).
#[cfg(unix)]
fn standard_stream_at(metadata: &std::fs::Metadata) -> Option<StandardStream> {
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;
    let is = |fd: std::os::fd::BorrowedFd<'_>| {
        let Ok(owned) = fd.try_clone_to_owned() else { return false };
        std::fs::File::from(owned)
            .metadata()
            .is_ok_and(|m| m.dev() == metadata.dev() && m.ino() == metadata.ino())
    };
    if is(std::io::stdout().as_fd()) {
        Some(StandardStream::Stdout)
    } else if is(std::io::stderr().as_fd()) {
        Some(StandardStream::Stderr)
    } else {
        None
    }
}

/// (Windows has no inode to compare: `-` is how to write to stdout there.)
#[cfg(not(unix))]
fn standard_stream_at(_metadata: &std::fs::Metadata) -> Option<StandardStream> {
    None
}

/// A new file beside `path` (same folder, so a rename replaces `path` in one step), named
/// `.NAME.PID-N.tmp`.
fn temporary_beside(path: &Path) -> std::io::Result<(PathBuf, std::fs::File)> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let folder = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    // At most 32 characters of the file's name (at most 128 bytes), so that the temporary
    // name is not too long where the file's own is not: a name of about 240 to 255 bytes failed
    // with "File name too long" (the twentieth hostile pass).
    let name: String =
        path.file_name().map(|n| n.to_string_lossy().chars().take(32).collect()).unwrap_or_default();
    loop {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let temporary = folder.join(format!(".{name}.{}-{n}.tmp", std::process::id()));
        match std::fs::OpenOptions::new().write(true).create_new(true).open(&temporary) {
            Ok(file) => return Ok((temporary, file)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => continue,
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printable_escapes_control_characters_only() {
        assert_eq!(printable("\x1b]0;pwned\x07\x1b[2J"), "\\u{1b}]0;pwned\\u{7}\\u{1b}[2J");
        assert_eq!(printable("a\tb\nc\u{9b}d\u{7f}"), "a\\tb\\nc\\u{9b}d\\u{7f}");
        assert_eq!(printable("x\u{202e}y"), "x\\u{202e}y");
        assert_eq!(printable("GPU café 設備 ü"), "GPU café 設備 ü");
    }

    #[test]
    fn files_are_replaced_whole_or_not_at_all() {
        let dir = std::env::temp_dir().join(format!("lazybuf-cli-output-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("out.json");
        write_file(&path, b"first").unwrap();
        write_file(&path, b"second").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"second");
        // A folder in the way of the file: refused, the folder left as it was.
        let err = write_file(&dir, b"x").unwrap_err().to_string();
        assert!(err.ends_with("it is a directory"), "{err}");
        // Its folder is a file: the temporary file cannot be made; one line naming the path.
        let err = write_file(&path.join("x.png"), b"x").unwrap_err().to_string();
        assert!(err.starts_with(&format!("writing {}: ", path.join("x.png").display())), "{err}");
        assert!(err.contains("os error"), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), b"second");
        let names: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["out.json"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn links_are_written_through_and_special_files_in_place_never_replaced() {
        use std::os::unix::fs::FileTypeExt;
        let dir = std::env::temp_dir().join(format!("lazybuf-cli-special-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // A link to a file: the file is replaced, the link stays a link.
        let file = dir.join("real.json");
        let link = dir.join("link.json");
        std::fs::write(&file, b"old").unwrap();
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert_eq!(write_file(&link, b"new").unwrap(), Written::File);
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
        assert_eq!(std::fs::read(&file).unwrap(), b"new");
        // A link to nothing: refused, nothing made.
        let dangling = dir.join("dangling.json");
        std::os::unix::fs::symlink(dir.join("missing.json"), &dangling).unwrap();
        let err = write_file(&dangling, b"x").unwrap_err().to_string();
        assert!(err.contains("a symbolic link to nothing"), "{err}");
        assert!(!dir.join("missing.json").exists());
        // A FIFO: its reader gets the bytes; it stays a FIFO.
        let fifo = dir.join("fifo");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || std::fs::read(fifo).unwrap())
        };
        assert_eq!(write_file(&fifo, b"through the fifo").unwrap(), Written::InPlace);
        assert_eq!(reader.join().unwrap(), b"through the fifo");
        assert!(std::fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());
        // A character device: written to, still a device.
        assert_eq!(write_file(Path::new("/dev/null"), b"nothing").unwrap(), Written::InPlace);
        assert!(std::fs::symlink_metadata("/dev/null").unwrap().file_type().is_char_device());
        // A link to a character device: the same.
        let null_link = dir.join("null-link");
        std::os::unix::fs::symlink("/dev/null", &null_link).unwrap();
        write_file(&null_link, b"nothing").unwrap();
        assert!(std::fs::symlink_metadata(&null_link).unwrap().file_type().is_symlink());
        assert!(std::fs::symlink_metadata("/dev/null").unwrap().file_type().is_char_device());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn sizes_parse_in_binary_and_decimal_units() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("1KiB"), Ok(1024));
        assert_eq!(parse_size("64kib"), Ok(65536));
        assert_eq!(parse_size("1 GiB"), Ok(1 << 30));
        assert_eq!(parse_size("16M"), Ok(16 << 20));
        assert_eq!(parse_size("1.5KiB"), Ok(1536));
        assert_eq!(parse_size("2MB"), Ok(2_000_000));
        assert_eq!(parse_size("1PiB"), Ok(1 << 50));
        assert_eq!(parse_size("3PB"), Ok(3_000_000_000_000_000));
        // What `format_bytes` prints reads back.
        for bytes in [1u64 << 50, 16 << 50, 5 << 40, 3 << 20] {
            assert_eq!(parse_size(&format_bytes(bytes)), Ok(bytes), "{}", format_bytes(bytes));
        }
        for bad in ["", "KiB", "12 parsecs", "-1", "0.3B", "1e3"] {
            assert!(parse_size(bad).unwrap_err().contains("expected a size"), "{bad}");
        }
    }

    #[test]
    fn durations_parse_and_zero_is_refused() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        for bad in ["0s", "soon", "1h", "-1s", ".", "0.0000000001ms"] {
            assert!(parse_duration(bad).unwrap_err().contains("expected a duration"), "{bad}");
        }
    }

    #[test]
    fn durations_beyond_what_a_duration_holds_saturate() {
        let u64_max = u64::MAX.to_string();
        for long in [format!("{u64_max}s"), u64_max.clone(), format!("{u64_max}m"), "9".repeat(400)] {
            assert_eq!(parse_duration(&long), Ok(Duration::MAX), "{long}");
        }
        // The largest f64 below 2^64 seconds still fits: the value itself.
        assert_eq!(
            parse_duration("18446744073709549568s"),
            Ok(Duration::from_secs(18_446_744_073_709_549_568))
        );
    }

    #[test]
    fn bytes_and_rates_print_with_three_significant_digits() {
        assert_eq!(format_bytes(0), "0 B");
        assert_eq!(format_bytes(1023), "1023 B");
        assert_eq!(format_bytes(1024), "1 KiB");
        assert_eq!(format_bytes(1536 << 10), "1.50 MiB");
        assert_eq!(format_bytes(24_591_000_000), "22.9 GiB");
        assert_eq!(format_rate(12.345), "12.3");
        assert_eq!(format_rate(0.5), "0.50");
        assert_eq!(format_rate(f64::INFINITY), "-");
    }

    #[test]
    fn tables_align_columns() {
        let rows = vec![vec!["opencl".to_string(), "PoCL".to_string()], vec!["host".into(), "x".into()]];
        assert_eq!(table(&["BACKEND", "NAME"], &rows), "BACKEND  NAME\nopencl   PoCL\nhost     x");
    }

    #[test]
    fn plain_output_has_no_escape_codes() {
        let plain = Terminal { stdout: false, stderr: false, colour: false };
        assert_eq!(plain.good("PASS"), "PASS");
        let colour = Terminal { colour: true, ..plain };
        assert_eq!(colour.bad("FAIL"), "\x1b[31mFAIL\x1b[0m");
    }
}
