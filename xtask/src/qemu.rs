//! Shared pieces of `qemu-test`: installing the tools, building a kernel,
//! booting it under a timeout while streaming its console, and judging the
//! result.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::QemuOpts;

/// The workspace root (the parent of `xtask/`).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

/// A `cargo` command (the cargo running xtask, when there is one) in the
/// workspace root.
pub fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(root());
    c
}

/// Runs a command, failing with its description when it exits non-zero.
pub fn run(cmd: &mut Command) -> Result<(), String> {
    eprintln!("xtask: running {cmd:?}");
    let status = cmd.status().map_err(|e| format!("{cmd:?}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?} failed with {status}"))
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// Makes sure the Rust target is installed (through rustup).
pub fn ensure_target(target: &str) -> Result<(), String> {
    let out = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .map_err(|e| format!("rustup: {e}"))?;
    if String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l.trim() == target)
    {
        return Ok(());
    }
    run(Command::new("rustup").args(["target", "add", target]))
}

/// The apt command that installs the QEMU system emulators (Debian 12's
/// QEMU 7.2; the machine's newer qemu-utils must be downgraded to match).
/// `qemu-system-misc` has `qemu-system-riscv64`; its OpenSBI firmware
/// (`-bios default`) comes with `qemu-system-data`, which it depends on.
pub const QEMU_INSTALL: &str = "apt-get update && apt-get install -y --no-install-recommends \
     --allow-downgrades qemu-system-x86 qemu-system-arm qemu-system-misc qemu-utils/bookworm";

/// Makes sure `binary` (a QEMU system emulator) is on the PATH, installing
/// QEMU when running as root, otherwise explaining how.
pub fn ensure_qemu(binary: &str) -> Result<(), String> {
    let found = Command::new(binary)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if found {
        return Ok(());
    }
    if !is_root() {
        return Err(format!(
            "{binary} is not installed; install it as root with:\n  {QEMU_INSTALL}"
        ));
    }
    eprintln!("xtask: {binary} not found, installing QEMU");
    run(Command::new("sh")
        .args(["-c", QEMU_INSTALL])
        .env("DEBIAN_FRONTEND", "noninteractive"))
}

/// The kernel command-line words for the suite options (`seed=N`,
/// `threshold_mb=N`), space-separated; empty when none is given.
pub fn cmdline(opts: &QemuOpts) -> String {
    let mut words = Vec::new();
    if let Some(seed) = opts.seed {
        words.push(format!("seed={seed}"));
    }
    if let Some(mb) = opts.threshold_mb {
        words.push(format!("threshold_mb={mb}"));
    }
    words.join(" ")
}

/// What a kernel run produced.
pub struct Outcome {
    /// QEMU's exit code (None if killed by the timeout).
    pub code: Option<i32>,
    /// Every console line.
    pub lines: Vec<String>,
    /// Whether the timeout killed it.
    pub timed_out: bool,
}

/// Boots QEMU with `args`, streaming its console (stdout) to ours with a
/// prefix, killing it after `timeout`.
pub fn boot(
    qemu: &str,
    args: &[String],
    timeout: Duration,
    prefix: &str,
) -> Result<Outcome, String> {
    eprintln!("xtask: {qemu} {}", args.join(" "));
    let mut child = Command::new(qemu)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("{qemu}: {e}"))?;
    let stdout = child.stdout.take().expect("piped");
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let start = Instant::now();
    let mut lines = Vec::new();
    let mut timed_out = false;
    let mut out = std::io::stdout();
    loop {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(line) => {
                let _ = writeln!(out, "{prefix}{line}");
                lines.push(line);
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        if start.elapsed() > timeout {
            timed_out = true;
            let _ = child.kill();
            break;
        }
    }
    let status = child
        .wait()
        .map_err(|e| format!("waiting for {qemu}: {e}"))?;
    let _ = reader.join();
    while let Ok(line) = rx.try_recv() {
        let _ = writeln!(out, "{prefix}{line}");
        lines.push(line);
    }
    Ok(Outcome {
        code: status.code(),
        lines,
        timed_out,
    })
}

/// Success means: not timed out, the agreed exit code, and a last summary
/// line `N passed, 0 failed` with N > 0.
pub fn judge(outcome: &Outcome, expected_code: i32) -> Result<(), String> {
    if outcome.timed_out {
        return Err("timed out".into());
    }
    let summary = outcome
        .lines
        .iter()
        .rev()
        .find_map(|l| parse_summary(l))
        .ok_or("no `N passed, N failed` line on the console")?;
    if summary.1 != 0 {
        return Err(format!("{} passed, {} failed", summary.0, summary.1));
    }
    if summary.0 == 0 {
        return Err("the suite ran no case".into());
    }
    match outcome.code {
        Some(c) if c == expected_code => Ok(()),
        other => Err(format!(
            "QEMU exited with {other:?}, expected {expected_code} (anything else, a triple fault included, is a failure)"
        )),
    }
}

/// Parses `N passed, M failed` (optionally after one word and a colon).
pub fn parse_summary(line: &str) -> Option<(u64, u64)> {
    let line = line.trim();
    let body = match line.split_once(": ") {
        Some((w, rest)) if !w.contains(' ') => rest,
        _ => line,
    };
    let (p, rest) = body.split_once(" passed, ")?;
    let f = rest
        .strip_suffix(" failed")
        .or_else(|| rest.split_once(" failed,").map(|(f, _)| f))?;
    Some((p.trim().parse().ok()?, f.trim().parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cmdline_passes_seed_and_threshold() {
        let opts = QemuOpts {
            arch: "arm64".into(),
            seed: Some(7),
            threshold_mb: Some(16),
            no_kvm: false,
        };
        assert_eq!(cmdline(&opts), "seed=7 threshold_mb=16");
        let none = QemuOpts {
            seed: None,
            threshold_mb: None,
            ..opts
        };
        assert_eq!(cmdline(&none), "");
    }

    #[test]
    fn summary_lines_are_parsed() {
        assert_eq!(parse_summary("12 passed, 0 failed"), Some((12, 0)));
        assert_eq!(parse_summary("suite: 3 passed, 1 failed"), Some((3, 1)));
        assert_eq!(parse_summary("3 passed, 1 failed, 2 skipped"), Some((3, 1)));
        assert_eq!(parse_summary("case move-1G passed"), None);
    }

    #[test]
    fn judge_rejects_wrong_code_and_failures() {
        let o = |code, lines: &[&str]| Outcome {
            code,
            lines: lines.iter().map(|s| s.to_string()).collect(),
            timed_out: false,
        };
        assert!(judge(&o(Some(33), &["5 passed, 0 failed"]), 33).is_ok());
        assert!(judge(&o(Some(0), &["5 passed, 0 failed"]), 33).is_err());
        assert!(judge(&o(Some(33), &["5 passed, 1 failed"]), 33).is_err());
        assert!(judge(&o(Some(33), &["0 passed, 0 failed"]), 33).is_err());
        assert!(judge(&o(Some(33), &["booted"]), 33).is_err());
    }
}
