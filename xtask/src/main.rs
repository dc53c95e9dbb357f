//! `cargo xtask`: build, test, boot and benchmark automation for pgtable.
//!
//! - `cargo xtask ci`: formatting, clippy (host and both bare-metal targets,
//!   every feature combination of the library crates), tests, docs (host
//!   and both bare-metal targets) and the minimum supported Rust version.
//! - `cargo xtask msrv`: only the MSRV step of `ci` (the libraries built
//!   with exactly the `rust-version` toolchain, installed when missing).
//! - `cargo xtask docs`: only the bare-metal docs step of `ci`.
//! - `cargo xtask qemu-test [--arch arm64|x86|riscv64|all] [--seed N] [--threshold-mb N]`:
//!   builds the tiny kernels, boots them in QEMU, streams their console and
//!   succeeds only on the agreed exit code and a final `N passed, 0 failed`
//!   (the RISC-V kernel once per format: Sv39, Sv48, Sv57).
//! - `cargo xtask bench [--quick]`: the host benchmarks of pgtable-bench
//!   (criterion, pgtable against its peers, and a size sweep), Linux's own
//!   `mremap` of 1 GiB on this machine, and the x86 kernel's in-kernel
//!   benchmarks (booted in QEMU) in the same run, drawn into the report
//!   `target/bench-report/index.html` (with `summary.md`). `--quick`:
//!   shorter measurements and fewer sizes (a few minutes).
//! - `cargo xtask soak [--ops N] [--seed S]`: the model test (random
//!   operation sequences against a reference model) with a million
//!   operations per format (or `N`), optimised with overflow checks and
//!   debug assertions; prints each format's seed, count and time.
//! - `cargo xtask miri [--test NAME]... [--partition K/N]`: every host
//!   test of pgtable-core and of the arch crates (pgtable-arm64,
//!   pgtable-x86, pgtable-riscv; unit tests, the simulator's tests, the
//!   suite and the model test) under Miri, or only those of the named
//!   test binaries (`lib`, the unit tests; each crate also has `model`
//!   and `all`), or the K-th of N slices of them. Skips only the cases
//!   that map, move or walk a GiB of 4 KiB pages (`MIRI_SKIP` in
//!   `miri.rs`, each named with its reason). Under Miri (`cfg(miri)`) the
//!   long loops run fewer steps: the model test one 48-operation episode
//!   per format, the randomized and racing loops a tenth of their rounds,
//!   the exhaustive grids every 29th case, the suite fills and validates
//!   one page of each moved range. Each binary's tests run in batches, one
//!   libtest process under Miri per batch and one batch per CPU at a time;
//!   prints a line per batch, then per binary the tests run, passed,
//!   failed and skipped, and the totals. Installs what is missing: the
//!   nightly toolchain and its `miri` and `rust-src` components. Not part
//!   of `ci`: hours on two cores (each test is interpreted hundreds of
//!   times slower than native code, with Stacked Borrows checking every
//!   table-entry access).
//!
//! Plain `cargo test` works without xtask; xtask only strings commands together.

mod arm64;
mod bench;
mod ci;
mod linux_mremap;
mod miri;
mod qemu;
#[cfg(test)]
mod readme;
mod riscv64;
mod x86;

use std::process::ExitCode;

/// Options of `qemu-test`.
#[derive(Clone, Debug)]
pub struct QemuOpts {
    /// Which kernels to run.
    pub arch: String,
    /// Seed of the suite's pseudo-random fill (printed by the kernel).
    pub seed: Option<u64>,
    /// MiB of each moved range that the suite validates.
    pub threshold_mb: Option<u64>,
    /// Force TCG even when /dev/kvm opens (x86).
    pub no_kvm: bool,
}

fn usage() -> ExitCode {
    eprintln!(
        "usage: cargo xtask <ci | msrv | docs | qemu-test [--arch arm64|x86|riscv64|all] [--seed N] [--threshold-mb N] [--no-kvm] | bench [--quick] | soak [--ops N] [--seed S] | miri [--test NAME]... [--partition K/N]>"
    );
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(cmd) = args.first() else {
        return usage();
    };
    let result = match cmd.as_str() {
        "ci" => ci::ci(),
        "msrv" => ci::msrv(),
        "docs" => ci::bare_metal_docs(),
        "qemu-test" => match parse_qemu_opts(&args[1..]) {
            Ok(opts) => qemu_test(&opts),
            Err(e) => Err(e),
        },
        "bench" => match args[1..] {
            [] => bench::run(false),
            [ref q] if q == "--quick" => bench::run(true),
            _ => return usage(),
        },
        "soak" => match parse_soak_opts(&args[1..]) {
            Ok((ops, seed)) => ci::soak(ops, seed),
            Err(e) => Err(e),
        },
        "miri" => match parse_miri_opts(&args[1..]) {
            Ok(opts) => miri::miri(&opts),
            Err(e) => Err(e),
        },
        _ => return usage(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn parse_qemu_opts(args: &[String]) -> Result<QemuOpts, String> {
    let mut opts = QemuOpts {
        arch: "all".into(),
        seed: None,
        threshold_mb: None,
        no_kvm: false,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match a.as_str() {
            "--arch" => opts.arch = value("--arch")?,
            "--seed" => {
                opts.seed = Some(
                    value("--seed")?
                        .parse()
                        .map_err(|e| format!("--seed: {e}"))?,
                )
            }
            "--threshold-mb" => {
                opts.threshold_mb = Some(
                    value("--threshold-mb")?
                        .parse()
                        .map_err(|e| format!("--threshold-mb: {e}"))?,
                )
            }
            "--no-kvm" => opts.no_kvm = true,
            other => return Err(format!("unknown option {other}")),
        }
    }
    if !["arm64", "x86", "riscv64", "all"].contains(&opts.arch.as_str()) {
        return Err(format!(
            "--arch must be arm64, x86, riscv64 or all, not {}",
            opts.arch
        ));
    }
    Ok(opts)
}

/// `--ops N` and `--seed S` of `soak` (decimal, or hex with `0x`).
fn parse_soak_opts(args: &[String]) -> Result<(Option<u64>, Option<u64>), String> {
    let (mut ops, mut seed) = (None, None);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let v = it.next().ok_or_else(|| format!("{a} needs a value"))?;
        let n = match v.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16),
            None => v.parse(),
        }
        .map_err(|e| format!("{a}: {e}"))?;
        match a.as_str() {
            "--ops" => ops = Some(n),
            "--seed" => seed = Some(n),
            other => return Err(format!("unknown option {other}")),
        }
    }
    Ok((ops, seed))
}

/// `--test NAME` (repeatable) and `--partition K/N` of `miri`.
fn parse_miri_opts(args: &[String]) -> Result<miri::MiriOpts, String> {
    let mut opts = miri::MiriOpts::default();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--test" => opts
                .tests
                .push(it.next().ok_or("--test needs a value")?.clone()),
            "--partition" => {
                let v = it.next().ok_or("--partition needs K/N")?;
                let bad = || format!("--partition {v}: expected K/N with 1 <= K <= N");
                let (k, n) = v.split_once('/').ok_or_else(bad)?;
                let k: u32 = k.parse().map_err(|_| bad())?;
                let n: u32 = n.parse().map_err(|_| bad())?;
                if k == 0 || k > n {
                    return Err(bad());
                }
                opts.partition = Some((k, n));
            }
            other => return Err(format!("unknown option {other}")),
        }
    }
    Ok(opts)
}

fn qemu_test(opts: &QemuOpts) -> Result<(), String> {
    let mut failures = Vec::new();
    if opts.arch == "arm64" || opts.arch == "all" {
        if let Err(e) = arm64::qemu_test(opts) {
            failures.push(format!("arm64: {e}"));
        }
    }
    if opts.arch == "x86" || opts.arch == "all" {
        if let Err(e) = x86::qemu_test(opts) {
            failures.push(format!("x86: {e}"));
        }
    }
    if opts.arch == "riscv64" || opts.arch == "all" {
        if let Err(e) = riscv64::qemu_test(opts) {
            failures.push(format!("riscv64: {e}"));
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::parse_miri_opts;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn miri_options_take_binaries_and_one_partition() {
        let o = parse_miri_opts(&args(&["--test", "model", "--partition", "2/3"])).unwrap();
        assert_eq!(o.tests, ["model"]);
        assert_eq!(o.partition, Some((2, 3)));
        assert_eq!(parse_miri_opts(&[]).unwrap().partition, None);
        for bad in ["0/3", "4/3", "2", "a/b"] {
            assert!(
                parse_miri_opts(&args(&["--partition", bad])).is_err(),
                "{bad}"
            );
        }
        assert!(parse_miri_opts(&args(&["--jobs"])).is_err());
    }
}
