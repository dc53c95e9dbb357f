//! `qemu-test` for the arm64 tiny kernel (examples/arm64-kernel).
//!
//! Builds the kernel (release, `aarch64-unknown-none`, its own workspace
//! and lock file), boots it on QEMU `virt` with semihosting under a
//! timeout, streams the console, and succeeds only on exit code 33 and a
//! final `N passed, 0 failed` line.

use std::path::PathBuf;
use std::time::Duration;

use crate::qemu::{boot, cargo, cmdline, ensure_qemu, ensure_target, judge, root, run};
use crate::QemuOpts;

/// The Rust target of the kernel.
const TARGET: &str = "aarch64-unknown-none";
/// The QEMU system emulator.
const QEMU: &str = "qemu-system-aarch64";
/// The kernel's exit code when its suite passed (semihosting SYS_EXIT).
const EXIT_SUCCESS: i32 = 33;
/// Guest RAM: the suite's pool needs more than 2 GiB.
const MEMORY: &str = "3G";
/// Upper bound for one run (the release kernel takes 10-20 s under TCG).
const TIMEOUT: Duration = Duration::from_secs(300);

/// Builds the arm64 kernel and returns the path of its ELF image.
pub fn build_kernel() -> Result<PathBuf, String> {
    let root = root();
    let dir = root.join("examples/arm64-kernel");
    let target_dir = root.join("target/kernels");
    run(cargo()
        .current_dir(&dir)
        .args(["build", "--release", "--target", TARGET])
        .arg("--target-dir")
        .arg(&target_dir))?;
    Ok(target_dir.join(TARGET).join("release/pgtable-arm64-kernel"))
}

/// The QEMU arguments that boot `kernel` with `append` as its command line.
fn qemu_args(kernel: &std::path::Path, append: &str) -> Vec<String> {
    let mut args: Vec<String> = [
        "-machine",
        "virt",
        "-cpu",
        "max",
        "-smp",
        "1",
        "-m",
        MEMORY,
        "-nographic",
        "-monitor",
        "none",
        "-semihosting",
        "-kernel",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.push(kernel.display().to_string());
    if !append.is_empty() {
        args.push("-append".into());
        args.push(append.into());
    }
    args
}

/// Builds and boots the arm64 kernel; Ok only if its suite passed.
pub fn qemu_test(opts: &QemuOpts) -> Result<(), String> {
    ensure_target(TARGET)?;
    ensure_qemu(QEMU)?;
    let kernel = build_kernel()?;
    let outcome = boot(
        QEMU,
        &qemu_args(&kernel, &cmdline(opts)),
        TIMEOUT,
        "arm64| ",
    )?;
    judge(&outcome, EXIT_SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qemu_args_use_semihosting_and_the_kernel() {
        let args = qemu_args(std::path::Path::new("/k.elf"), "seed=1");
        let joined = args.join(" ");
        assert!(joined.contains("-machine virt"));
        assert!(joined.contains("-semihosting"));
        assert!(joined.contains("-kernel /k.elf"));
        assert!(joined.ends_with("-append seed=1"));
        assert!(!qemu_args(std::path::Path::new("/k"), "").contains(&"-append".to_string()));
    }
}
