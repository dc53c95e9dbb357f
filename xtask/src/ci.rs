//! `cargo xtask ci`, `cargo xtask msrv`, `cargo xtask docs` and `cargo xtask soak`.

use std::process::Command;

use crate::qemu::{cargo, ensure_target, root, run as sh};

const TARGETS: [&str; 3] = [
    "aarch64-unknown-none",
    "x86_64-unknown-none",
    "riscv64gc-unknown-none-elf",
];

/// Feature sets each library crate is checked with.
const FEATURE_SETS: [&[&str]; 4] = [
    &["--no-default-features"],
    &["--no-default-features", "--features", "move-pmd"],
    &["--no-default-features", "--features", "move-pud"],
    &[],
];

/// The library crates: what is published, what the MSRV and the docs
/// steps build.
pub(crate) const LIBS: [&str; 4] = [
    "pgtable-core",
    "pgtable-arm64",
    "pgtable-x86",
    "pgtable-riscv",
];

/// fmt, clippy (host + bare-metal, every feature combination), tests, the
/// loom models, docs
/// (host and every bare-metal target), the minimum supported Rust
/// version, and `cargo package --workspace`.
pub fn ci() -> Result<(), String> {
    for t in TARGETS {
        ensure_target(t)?;
    }
    sh(cargo().args(["fmt", "--all", "--check"]))?;
    sh(cargo().args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--all-features",
        "--",
        "-D",
        "warnings",
    ]))?;
    for krate in LIBS {
        for fs in FEATURE_SETS {
            sh(cargo()
                .args(["clippy", "-p", krate, "--lib"])
                .args(fs)
                .args(["--", "-D", "warnings"]))?;
            for t in TARGETS {
                sh(cargo()
                    .args(["clippy", "-p", krate, "--lib", "--target", t])
                    .args(fs)
                    .args(["--", "-D", "warnings"]))?;
            }
        }
    }
    for fs in FEATURE_SETS {
        sh(cargo().args(["test", "--workspace"]).args(fs))?;
    }
    sh(cargo().args(["test", "--workspace", "--all-features"]))?;
    loom()?;
    sh(cargo()
        .args(["doc", "--workspace", "--no-deps", "--all-features"])
        .env("RUSTDOCFLAGS", "-D warnings"))?;
    // And with the default features only: no doc link may need an
    // optional feature.
    sh(cargo()
        .args(["doc", "--no-deps"])
        .args(LIBS.iter().flat_map(|l| ["-p", l]))
        .env("RUSTDOCFLAGS", "-D warnings"))?;
    bare_metal_docs()?;
    msrv()?;
    // What crates.io would receive: every package builds from its own
    // tarball (unpublished workspace dependencies from a local registry).
    // `--allow-dirty`: a developer's uncommitted edits are checked too.
    sh(cargo().args(["package", "--workspace", "--allow-dirty"]))?;
    // The tiny kernels are their own workspaces (bare-metal binaries):
    // formatting and clippy for their target.
    for (dir, target) in KERNELS {
        let manifest = root().join(dir).join("Cargo.toml");
        sh(cargo()
            .args(["fmt", "--check", "--manifest-path"])
            .arg(&manifest))?;
        sh(cargo()
            .args(["clippy", "--target", target, "--manifest-path"])
            .arg(&manifest)
            .args(["--", "-D", "warnings"])
            .env("CARGO_TARGET_DIR", root().join("target/kernels")))?;
    }
    // The arm64 kernel once more for each of its other geometries.
    let manifest = root().join("examples/arm64-kernel/Cargo.toml");
    for geo in crate::arm64::GEOMETRIES
        .iter()
        .filter(|g| !g.features.is_empty())
    {
        sh(cargo()
            .args([
                "clippy",
                "--target",
                "aarch64-unknown-none",
                "--manifest-path",
            ])
            .arg(&manifest)
            .args(["--features", geo.features, "--", "-D", "warnings"])
            .env("CARGO_TARGET_DIR", root().join("target/kernels")))?;
    }
    Ok(())
}

/// The loom models (pgtable-core's `tests/loom.rs`, which print the
/// interleavings each explored): built with `--cfg loom`, so the library's
/// lock-free code runs on loom's atomics, optimised as loom advises, in a
/// target directory of their own (the flag rebuilds every crate), and with
/// at most 3 preemptions per execution so the step takes seconds.
fn loom() -> Result<(), String> {
    sh(cargo()
        .args(["test", "-p", "pgtable-core", "--test", "loom", "--release"])
        .args(["--", "--nocapture"])
        .env("RUSTFLAGS", "--cfg loom")
        .env("CARGO_TARGET_DIR", root().join("target/loom"))
        .env("LOOM_MAX_PREEMPTIONS", "3"))
}

/// The libraries' docs for each bare-metal target, warnings denied: what
/// docs.rs builds for the arch crates (`[package.metadata.docs.rs]`: their
/// bare-metal target, where `Arm64Mmu` / `X86Mmu` / `RiscvMmu` exist, with every
/// feature that builds without std).
pub fn bare_metal_docs() -> Result<(), String> {
    for t in TARGETS {
        ensure_target(t)?;
        sh(cargo()
            .args(["doc", "--no-deps", "--target", t])
            .args(LIBS.iter().flat_map(|l| ["-p", l]))
            .args([
                "--features",
                "pgtable-core/alloc,pgtable-core/stats,pgtable-core/suite,\
                 pgtable-arm64/stats,pgtable-x86/stats,pgtable-x86/suite,\
                 pgtable-riscv/stats,pgtable-riscv/suite",
            ])
            .env("RUSTDOCFLAGS", "-D warnings"))?;
    }
    Ok(())
}

/// The exact toolchain of the workspace's `rust-version`: "1.85" means
/// 1.85.0. (rustup's "1.85" is the newest point release, and 1.85.1 was
/// shipped without the standard library for `aarch64-unknown-none`.)
fn msrv_toolchain() -> Result<String, String> {
    let manifest = root().join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest).map_err(|e| format!("{manifest:?}: {e}"))?;
    let version = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("rust-version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .ok_or_else(|| format!("no rust-version in {manifest:?}"))?;
    Ok(match version.split('.').count() {
        2 => format!("{version}.0"),
        _ => version.to_string(),
    })
}

/// A command that runs `program` from `toolchain` (through rustup, which
/// also sets the toolchain for the cargo it starts), with the variables
/// the cargo running xtask set for it removed.
pub(crate) fn with_toolchain(toolchain: &str, program: &str) -> Command {
    let mut c = Command::new("rustup");
    c.current_dir(root())
        .args(["run", toolchain, program])
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("RUSTC")
        .env_remove("RUSTDOC")
        .env_remove("CARGO");
    c
}

/// Whether rustup has `toolchain` (its `rustc` runs).
pub(crate) fn has_toolchain(toolchain: &str) -> bool {
    with_toolchain(toolchain, "rustc")
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// Installs `toolchain` (minimal profile) with every bare-metal target
/// unless it is there already.
fn ensure_toolchain(toolchain: &str) -> Result<(), String> {
    if !has_toolchain(toolchain) {
        let mut c = Command::new("rustup");
        c.args(["toolchain", "install", toolchain, "--profile", "minimal"]);
        for t in TARGETS {
            c.args(["--target", t]);
        }
        return sh(&mut c);
    }
    let out = Command::new("rustup")
        .args(["target", "list", "--installed", "--toolchain", toolchain])
        .output()
        .map_err(|e| format!("rustup: {e}"))?;
    let have = String::from_utf8_lossy(&out.stdout).into_owned();
    for t in TARGETS {
        if !have.lines().any(|l| l.trim() == t) {
            sh(Command::new("rustup").args(["target", "add", "--toolchain", toolchain, t]))?;
        }
    }
    Ok(())
}

/// The minimum supported Rust version: the libraries build with exactly
/// the `rust-version` toolchain (installed through rustup when missing),
/// on the host (every feature set of the clippy step, and all features)
/// and on every bare-metal target (every feature set). `cargo check` of the
/// libraries only, in their own target directory.
pub fn msrv() -> Result<(), String> {
    let toolchain = msrv_toolchain()?;
    ensure_toolchain(&toolchain)?;
    let check = |target: Option<&str>, fs: &[&str]| {
        let mut c = with_toolchain(&toolchain, "cargo");
        c.args(["check", "--lib"])
            .args(LIBS.iter().flat_map(|l| ["-p", l]))
            .args(fs)
            .env("CARGO_TARGET_DIR", root().join("target/msrv"));
        if let Some(t) = target {
            c.args(["--target", t]);
        }
        sh(&mut c)
    };
    for fs in FEATURE_SETS {
        check(None, fs)?;
        for t in TARGETS {
            check(Some(t), fs)?;
        }
    }
    check(None, &["--all-features"])
}

/// The tiny kernels and their targets.
const KERNELS: [(&str, &str); 3] = [
    ("examples/arm64-kernel", "aarch64-unknown-none"),
    ("examples/x86-kernel", "x86_64-unknown-none"),
    ("examples/riscv64-kernel", "riscv64gc-unknown-none-elf"),
];

/// Operations per format in a soak run unless `--ops` says otherwise.
const SOAK_OPS: u64 = 1_000_000;

/// The model test's soak run: `ops` random operations per format (every
/// format of the four crates) against the reference model, built with the
/// `soak` profile (optimised, with overflow checks and debug assertions).
/// Each format prints its seed, operation count and time; a failure prints
/// the episode seed that replays it. Without `--ops` / `--seed` the
/// environment's `PGTABLE_SOAK_OPS` / `PGTABLE_SOAK_SEED` apply (see
/// `testkit/src/model/mod.rs`); without either, a million
/// operations from a fresh seed.
pub fn soak(ops: Option<u64>, seed: Option<u64>) -> Result<(), String> {
    let mut c = cargo();
    // --no-fail-fast: every format runs and reports, whichever fails.
    c.args([
        "test",
        "--profile",
        "soak",
        "--all-features",
        "--no-fail-fast",
    ])
    .args([
        "-p",
        "pgtable-core",
        "-p",
        "pgtable-arm64",
        "-p",
        "pgtable-x86",
        "-p",
        "pgtable-riscv",
    ])
    .args(["--test", "model", "--", "--nocapture"]);
    match ops {
        Some(n) => {
            c.env("PGTABLE_SOAK_OPS", n.to_string());
        }
        None if std::env::var_os("PGTABLE_SOAK_OPS").is_none() => {
            c.env("PGTABLE_SOAK_OPS", SOAK_OPS.to_string());
        }
        None => {}
    }
    if let Some(s) = seed {
        c.env("PGTABLE_SOAK_SEED", s.to_string());
    }
    sh(&mut c)
}
