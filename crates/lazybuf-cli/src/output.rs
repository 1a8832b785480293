//! Plain and terminal output: whether stdout and stderr are terminals, colour (only on a
//! terminal, never with `NO_COLOR` or `TERM=dumb`), aligned tables, and the units the tool
//! reads and prints (sizes in B/KiB/MiB/GiB, durations in ms/s/m).

use std::io::IsTerminal;
use std::time::Duration;

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
/// `250ms`, `1s`, `1.5s`, `2m`. Zero is refused.
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

#[cfg(test)]
mod tests {
    use super::*;

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
        for bad in ["0s", "soon", "1h", "-1s"] {
            assert!(parse_duration(bad).unwrap_err().contains("expected a duration"), "{bad}");
        }
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
