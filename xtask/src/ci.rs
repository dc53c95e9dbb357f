//! `cargo xtask ci`, `cargo xtask soak` and `cargo xtask miri`.

use std::process::Command;

use crate::qemu::{cargo, ensure_target, root, run as sh};

const TARGETS: [&str; 2] = ["aarch64-unknown-none", "x86_64-unknown-none"];

/// Feature sets each library crate is checked with.
const FEATURE_SETS: [&[&str]; 4] = [
    &["--no-default-features"],
    &["--no-default-features", "--features", "move-pmd"],
    &["--no-default-features", "--features", "move-pud"],
    &[],
];

/// fmt, clippy (host + bare-metal, every feature combination), tests, docs.
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
    for krate in ["pgtable-core", "pgtable-arm64", "pgtable-x86"] {
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
    sh(cargo()
        .args(["doc", "--workspace", "--no-deps", "--all-features"])
        .env("RUSTDOCFLAGS", "-D warnings"))?;
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
    Ok(())
}

/// The tiny kernels and their targets.
const KERNELS: [(&str, &str); 2] = [
    ("examples/arm64-kernel", "aarch64-unknown-none"),
    ("examples/x86-kernel", "x86_64-unknown-none"),
];

/// Operations per format in a soak run unless `--ops` says otherwise.
const SOAK_OPS: u64 = 1_000_000;

/// The model test's soak run: `ops` random operations per format (every
/// format of the three crates) against the reference model, built with the
/// `soak` profile (optimised, with overflow checks and debug assertions).
/// Each format prints its seed, operation count and time; a failure prints
/// the episode seed that replays it. Without `--ops` / `--seed` the
/// environment's `PGTABLE_SOAK_OPS` / `PGTABLE_SOAK_SEED` apply (see
/// `pgtable-core/tests/support/model/mod.rs`); without either, a million
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

/// Test-name fragments Miri skips: cases that write a GiB or more of
/// entries (hours under Miri) and the timing-driven thread races (Miri's
/// scheduler makes them spin to their time limit). Everything else runs.
const MIRI_SKIP: [&str; 16] = [
    "existing_empty_table",
    "onto_a_mapped_destination",
    "1g",
    "gib",
    "random",
    "racing",
    "non_atomic",
    "every_level",
    "every_k",
    "every_point",
    "big",
    "agent",
    "pud_boundary",
    "there_and_back",
    "defers_the_move",
    "move_whole_puds",
];

/// The host tests of pgtable-core under Miri (nightly toolchain with the
/// `miri` component). The arena hands out host addresses as physical
/// addresses, hence permissive provenance.
pub fn miri() -> Result<(), String> {
    // The rustup proxy (not $CARGO, which is the stable cargo itself)
    // understands `+nightly`.
    let mut c = Command::new("cargo");
    c.current_dir(root());
    c.args([
        "+nightly",
        "miri",
        "test",
        "-p",
        "pgtable-core",
        "--features",
        "alloc,stats",
        "--test",
        "core",
        "--test",
        "protect",
        "--test",
        "moves",
        "--",
    ]);
    for s in MIRI_SKIP {
        c.args(["--skip", s]);
    }
    c.env("MIRIFLAGS", "-Zmiri-permissive-provenance");
    sh(&mut c)
}
