//! `cargo xtask ci`, `cargo xtask soak` and `cargo xtask miri`.

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
const LIBS: [&str; 4] = [
    "pgtable-core",
    "pgtable-arm64",
    "pgtable-x86",
    "pgtable-riscv",
];

/// fmt, clippy (host + bare-metal, every feature combination), tests, docs
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
fn with_toolchain(toolchain: &str, program: &str) -> Command {
    let mut c = Command::new("rustup");
    c.current_dir(root())
        .args(["run", toolchain, program])
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("RUSTC")
        .env_remove("RUSTDOC")
        .env_remove("CARGO");
    c
}

/// Installs `toolchain` (minimal profile) with every bare-metal target
/// unless it is there already.
fn ensure_toolchain(toolchain: &str) -> Result<(), String> {
    let installed = with_toolchain(toolchain, "rustc")
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !installed {
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

/// The crates whose host test binaries run under Miri: pgtable-core and
/// the three arch crates, each with every feature (the simulator, the
/// suite and the model test included).
const MIRI_CRATES: [&str; LIBS.len()] = LIBS;

/// Test-name fragments Miri skips: only cases that map, move or walk a GiB
/// of 4 KiB pages (262,144 entries or more, hours each under Miri). The
/// same code paths run in the other cases at MiB scale. Each fragment
/// matches the named tests only (of every crate's test binaries).
const MIRI_SKIP: [&str; 11] = [
    // pgtable-core `moves::{pud_aligned,pmd_only,misaligned}_1g_move_*`:
    // 1 GiB of pages moved whole, by PMDs, and PTE by PTE.
    "1g_move",
    // pgtable-core `moves::control_options_move_1g_pte_by_pte`: the same
    // GiB moved with whole-table moves off.
    "move_1g",
    // pgtable-core `moves::allocation_failure_in_a_1g_pte_path_move_*`: the
    // GiB moved 515 times, failing after each allocation.
    "1g_pte_path",
    // arm64 `aspace::linear_map_of_1g_pages_*`: a GiB of pages mapped.
    "of_1g_pages",
    // arm64 `aspace::barrier_per_entry_variant_issues_one_per_pte`: a GiB
    // of pages mapped with a barrier per entry.
    "barrier_per_entry_variant",
    // arm64 `aspace::moving_a_pud_aligned_gib_*` and
    // `contpte::contpte_tlb_fills_of_a_gib_*` (a GiB of pages mapped and
    // touched page by page, twice); pgtable-core
    // `engine::mapping_1gib_of_pages_*`.
    "gib",
    // pgtable-core `moves::move_across_a_pud_boundary_*`: 1 GiB + 4 MiB of
    // pages moved.
    "pud_boundary",
    // pgtable-core `moves::three_and_five_level_formats_move_whole_puds`:
    // 1 GiB + 2 MiB of pages mapped and moved at 3 and 5 levels.
    "move_whole_puds",
    // pgtable-core `moves::one_step_move_onto_a_mapped_destination_*` and
    // `moves::one_step_move_into_an_existing_empty_table_*`: a GiB of pages
    // mapped as the source.
    "onto_a_mapped_destination",
    "existing_empty_table",
    // pgtable-core `conformance::suite_big_moves_*`: the suite's 1 and 2 GiB
    // moves.
    "big_moves",
];

/// The nightly components `cargo miri` needs.
const MIRI_COMPONENTS: [&str; 2] = ["miri", "rust-src"];

/// Installs what `cargo miri` needs when it is missing: the nightly
/// toolchain (minimal profile, with [`MIRI_COMPONENTS`]), or on a nightly
/// that is there each of [`MIRI_COMPONENTS`] it lacks (checked one by
/// one: a minimal nightly has neither, and `miri` without `rust-src`
/// cannot build its sysroot).
fn ensure_miri() -> Result<(), String> {
    let installed = with_toolchain("nightly", "rustc")
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !installed {
        let mut c = Command::new("rustup");
        c.args(["toolchain", "install", "nightly", "--profile", "minimal"]);
        for comp in MIRI_COMPONENTS {
            c.args(["--component", comp]);
        }
        return sh(&mut c);
    }
    let out = Command::new("rustup")
        .args(["component", "list", "--installed", "--toolchain", "nightly"])
        .output()
        .map_err(|e| format!("rustup: {e}"))?;
    let have = String::from_utf8_lossy(&out.stdout).into_owned();
    for comp in MIRI_COMPONENTS {
        if !has_component(&have, comp) {
            sh(Command::new("rustup").args(["component", "add", comp, "--toolchain", "nightly"]))?;
        }
    }
    Ok(())
}

/// Whether `rustup component list --installed` printed `comp`: listed as
/// `miri-<host triple>`, or bare (`rust-src`); no other component's name
/// starts with `miri-` or `rust-src-`.
fn has_component(listed: &str, comp: &str) -> bool {
    listed
        .lines()
        .map(str::trim)
        .any(|l| l == comp || l.starts_with(&format!("{comp}-")))
}

/// Installs `cargo-nextest` (from crates.io, `--locked`) unless `cargo
/// nextest` runs already.
fn ensure_nextest() -> Result<(), String> {
    let there = Command::new("cargo")
        .args(["nextest", "--version"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if there {
        return Ok(());
    }
    sh(Command::new("cargo").args(["install", "cargo-nextest", "--locked"]))
}

/// What `cargo xtask miri` runs: every test, or only those of the named
/// integration test binaries, and all of them or one slice.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct MiriOpts {
    /// `--test NAME`: integration test binaries (`model`, `all`).
    pub tests: Vec<String>,
    /// `--partition K/N`: the K-th of N slices of the tests (1-based), so
    /// a run can be split over machines or sessions.
    pub partition: Option<(u32, u32)>,
}

/// The nextest filter expression of a Miri run: the named binaries (or
/// all), without the tests whose names contain a [`MIRI_SKIP`] fragment.
fn miri_filter(tests: &[String]) -> String {
    let skip = format!("not test(/{}/)", MIRI_SKIP.join("|"));
    if tests.is_empty() {
        return skip;
    }
    let bins: Vec<String> = tests.iter().map(|t| format!("binary({t})")).collect();
    format!("({}) and {skip}", bins.join(" | "))
}

/// Every host test (unit and integration tests, not doctests) of
/// pgtable-core and of the arch crates ([`MIRI_CRATES`]) under Miri, with
/// every feature, on the nightly toolchain ([`ensure_miri`] installs it and
/// its components when missing), skipping only [`MIRI_SKIP`] (the GiB
/// cases). The tests run through `cargo nextest` ([`ensure_nextest`]
/// installs it), one interpreter per test and one per CPU at a time:
/// libtest under Miri runs a binary's tests one after another on one core.
///
/// The tests themselves scale their long loops down under `cfg(miri)`,
/// keeping every code path and every per-step check:
///
/// - the model test runs one episode of `MIRI_OPS` operations per format
///   (and leaves the check that every documented outcome was reached to
///   the native run);
/// - the randomized and racing loops run a tenth of their rounds
///   (`miri_scaled`) and only their first seed (`miri_first`); the ASID
///   model's 12-bit run, which checks all of its 5000 spaces at every
///   step, a hundredth; the protection-change races 48 leaves instead of
///   2048;
/// - the exhaustive grids run every 29th case (`miri_sample`), the
///   reservation grids of thousands of cases every 1009th
///   (`miri_sample_sparse`), and `replace_pte` of a full table the first
///   four pages and every 29th;
/// - the conformance suite fills and validates one page of each moved
///   range and, in a run of every case, runs every fourth case and one
///   case of its move matrix, from offsets that follow the format and the
///   machine (`suite::Summary::unsampled` counts the others, printed as
///   `unsampled <name>`), so the suite's runs on the different formats
///   cover different cases.
///
/// The arena hands out host addresses as physical addresses, hence
/// permissive provenance. Leaks are not checked: the SMP and race tests
/// leak their `'static` handles on purpose (`Box::leak` of the
/// `Shootdown`, `MmCpus` and slots their threads share), and the
/// simulator's frame counts already check that the library frees every
/// table. `--no-fail-fast`: every test runs and reports.
pub fn miri(opts: &MiriOpts) -> Result<(), String> {
    ensure_miri()?;
    ensure_nextest()?;
    let jobs = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut c = with_toolchain("nightly", "cargo");
    c.args(["miri", "nextest", "run", "--all-features", "--no-fail-fast"])
        .args(["-j", &jobs.to_string()])
        .args(MIRI_CRATES.iter().flat_map(|k| ["-p", k]))
        .args(["-E", &miri_filter(&opts.tests)]);
    if let Some((k, n)) = opts.partition {
        c.args(["--partition", &format!("count:{k}/{n}")]);
    }
    c.env(
        "MIRIFLAGS",
        "-Zmiri-permissive-provenance -Zmiri-ignore-leaks",
    );
    sh(&mut c)
}

#[cfg(test)]
mod tests {
    use super::{has_component, miri_filter, MIRI_COMPONENTS, MIRI_SKIP};

    #[test]
    fn the_miri_filter_skips_every_fragment_and_selects_the_binaries() {
        let all = miri_filter(&[]);
        assert!(all.starts_with("not test(/"), "{all}");
        for s in MIRI_SKIP {
            assert!(all.contains(s), "{s} not skipped: {all}");
        }
        let two = miri_filter(&["model".into(), "all".into()]);
        assert!(
            two.starts_with("(binary(model) | binary(all)) and not test(/"),
            "{two}"
        );
    }

    #[test]
    fn components_are_found_with_and_without_the_host_triple() {
        let minimal = "cargo-x86_64-unknown-linux-gnu\nrust-std-x86_64-unknown-linux-gnu\n\
                       rustc-x86_64-unknown-linux-gnu\n";
        let full = format!("{minimal}miri-x86_64-unknown-linux-gnu\nrust-src\n");
        for comp in MIRI_COMPONENTS {
            assert!(!has_component(minimal, comp), "{comp} in a minimal nightly");
            assert!(has_component(&full, comp), "{comp} not found");
        }
        // Only `miri` missing: `rust-src` is found, `miri` is not.
        let no_miri = format!("{minimal}rust-src\n");
        assert!(has_component(&no_miri, "rust-src"));
        assert!(!has_component(&no_miri, "miri"));
    }
}
