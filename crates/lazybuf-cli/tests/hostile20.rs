//! What the twentieth hostile pass found in `lazybuf trace summary|plot`, each a test that
//! failed before its fix.

use std::path::PathBuf;
use std::process::{Command, Output};

/// Held while a test of this file starts a process (or writes an executable it then starts):
/// a copy of the executable still open for writing when another test's thread forks cannot be
/// started ("Text file busy": the child holds the descriptor until it execs).
static SPAWNING: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn spawning() -> std::sync::MutexGuard<'static, ()> {
    SPAWNING.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn lazybuf(args: &[&str]) -> Output {
    let _spawning = spawning();
    Command::new(env!("CARGO_BIN_EXE_lazybuf")).args(args).output().expect("the lazybuf executable runs")
}

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lazybuf-cli-hostile20-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// A trace saved as UTF-32 (with its byte-order mark: the little-endian one begins with
/// UTF-16's) or as UTF-16 without one was "not JSON: expected value at line 1 column 1" or
/// "key must be a string at line 1 column 2": its bytes (NULs between the characters) pass
/// for UTF-8. Both are named now, with the encoding expected, by the summary and the plot.
#[test]
fn utf32_and_unmarked_utf16_traces_are_named_not_called_bad_json() {
    let text = r#"{"traceEvents":[],"otherData":{"dropped":0}}"#;
    let utf32 = |mark: [u8; 4], unit: fn(u32) -> [u8; 4]| {
        let mut bytes = mark.to_vec();
        bytes.extend(text.chars().flat_map(|c| unit(c as u32)));
        bytes
    };
    let utf16 = |unit: fn(u16) -> [u8; 2]| text.encode_utf16().flat_map(unit).collect::<Vec<u8>>();
    let cases: [(&str, Vec<u8>, &str); 5] = [
        ("utf32le.json", utf32([0xff, 0xfe, 0, 0], u32::to_le_bytes), "UTF-32 (little-endian)"),
        ("utf32be.json", utf32([0, 0, 0xfe, 0xff], u32::to_be_bytes), "UTF-32 (big-endian)"),
        ("utf16le-unmarked.json", utf16(u16::to_le_bytes), "a NUL byte at offset 1"),
        ("utf16be-unmarked.json", utf16(u16::to_be_bytes), "a NUL byte at offset 0"),
        ("utf8-nul.json", [text.as_bytes(), b"\0"].concat(), "a NUL byte at offset 44"),
    ];
    for (name, bytes, said) in cases {
        let path = temp(name);
        std::fs::write(&path, bytes).unwrap();
        let png = temp(&format!("{name}.png"));
        for args in [
            vec!["trace", "summary", path.to_str().unwrap()],
            vec!["trace", "plot", path.to_str().unwrap(), "-o", png.to_str().unwrap()],
        ] {
            let out = lazybuf(&args);
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{name} {args:?}: {err}");
            assert!(
                err.contains(said) && err.contains("UTF-8 JSON") && !err.contains("not JSON"),
                "{name}: {err}"
            );
        }
        assert!(!png.exists(), "{name}: a plot of an unread trace");
    }
}

/// `trace plot -o` to a file whose name is long but legal (here 250 bytes; the limit is 255)
/// failed with "File name too long": the temporary file written beside it, then renamed over
/// it, took the whole name and more. It takes a bounded part of it now.
#[test]
fn a_plot_to_a_long_file_name_is_written() {
    let trace = temp("long-name-trace.json");
    std::fs::write(&trace, r#"{"traceEvents":[]}"#).unwrap();
    let name = format!("{}.png", "p".repeat(246));
    assert_eq!(name.len(), 250);
    let out = temp(&name);
    let run = lazybuf(&["trace", "plot", trace.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    assert!(std::fs::metadata(&out).unwrap().len() > 0);
    // Nothing left beside it.
    let left: Vec<_> = std::fs::read_dir(out.parent().unwrap())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// `trace plot FILE -o OUT` where OUT is FILE itself (a trace named `run.svg`, a link to it,
/// a hard link) replaced the trace with its own plot. It is refused, and the trace kept.
#[test]
fn a_plot_over_the_trace_it_reads_is_refused() {
    let text = r#"{"traceEvents":[]}"#;
    let trace = temp("itself.svg");
    std::fs::write(&trace, text).unwrap();
    let link = temp("itself-link.svg");
    let _ = std::fs::remove_file(&link);
    let hard = temp("itself-hard.svg");
    let _ = std::fs::remove_file(&hard);
    std::fs::hard_link(&trace, &hard).unwrap();
    let mut outputs = vec![trace.clone(), hard.clone()];
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(&trace, &link).unwrap();
        outputs.push(link.clone());
    }
    for out in outputs {
        let run = lazybuf(&["trace", "plot", trace.to_str().unwrap(), "-o", out.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&run.stderr);
        assert!(!run.status.success() && err.contains("it is the trace being read"), "{out:?}: {err}");
        assert_eq!(std::fs::read_to_string(&trace).unwrap(), text, "{out:?}");
    }
    // Another file is written.
    let other = temp("itself-other.svg");
    let run = lazybuf(&["trace", "plot", trace.to_str().unwrap(), "-o", other.to_str().unwrap()]);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
}

/// `trace plot -o` over a file the user may not write (read-only) replaced it: the plot is
/// written beside it and renamed over it, which needs only the folder writable. It is refused
/// now, as opening the file for writing is, and the file is left as it was. As root (CI),
/// which may write any file, the tool runs as `nobody` from a copy in a folder anyone may use.
#[cfg(unix)]
#[test]
fn a_plot_over_a_read_only_file_is_refused() {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    use std::os::unix::process::CommandExt as _;
    const NOBODY: u32 = 65534;
    let dir = temp("read-only");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let trace = dir.join("trace.json");
    std::fs::write(&trace, r#"{"traceEvents":[]}"#).unwrap();
    let out = dir.join("kept.png");
    std::fs::write(&out, b"earlier").unwrap();
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o444)).unwrap();
    let root = std::fs::metadata("/proc/self").map(|m| m.uid() == 0).unwrap_or(false);
    // The copy is written and started with no other test of this file starting a process.
    let _spawning = spawning();
    let mut command = if root {
        let copy = dir.join("lazybuf");
        std::fs::copy(env!("CARGO_BIN_EXE_lazybuf"), &copy).unwrap();
        std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut command = Command::new(copy);
        command.uid(NOBODY).gid(NOBODY);
        command
    } else {
        Command::new(env!("CARGO_BIN_EXE_lazybuf"))
    };
    let run = command
        .args(["trace", "plot", trace.to_str().unwrap(), "-o", out.to_str().unwrap()])
        .output()
        .expect("the lazybuf executable runs");
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success(), "a read-only file was replaced: {err}");
    assert!(err.contains("kept.png") && err.contains("ermission denied"), "{err}");
    assert_eq!(std::fs::read(&out).unwrap(), b"earlier");
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}
