//! `cargo xtask bench [--quick]`: runs the benchmarks and saves their
//! figures in `target/bench-report`, then runs pgtable-bench's `report`
//! binary, which reads them and draws the report (`index.html`,
//! `summary.md`).
//!
//! 1. criterion, `cargo bench -p pgtable-bench` (every bench, and the
//!    `contpte` bench with the simulator's fill counts; `--quick`: the
//!    three peer benches, the arm64 granule comparison (`granules`) and
//!    `contpte` only, 10 samples, 0.3 s warm-up and 1 s measurement per
//!    benchmark); the report reads the medians from
//!    criterion's `target/criterion/<group>/<function>/new/estimates.json`;
//! 2. the size sweep and table-memory census, pgtable-bench's `sweep`
//!    binary (same profile as the benches): `sweep.csv`;
//! 3. Linux's own `mremap` of 1 GiB on this machine: `linux-mremap.txt`;
//! 4. the x86 kernel's in-kernel benchmarks, booted in QEMU: `kernel.txt`.
//!
//! Every step's figures are kept even when a later step fails; the report
//! says what is missing and the command fails at the end.

use std::path::Path;
use std::time::Instant;

use crate::qemu::{cargo, root, run as sh};

/// Runs everything, saves each step's figures in `target/bench-report`,
/// has pgtable-bench's `report` binary draw the report, prints where it is.
pub fn run(quick: bool) -> Result<(), String> {
    let t0 = Instant::now();
    let dir = root().join("target/bench-report");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut errors = Vec::new();

    // 1. criterion. The thread's CPU time (see pgtable-bench's harness):
    // the machine may be shared, and time spent waiting for a CPU is not
    // the subjects' cost.
    let stage = Instant::now();
    let mut c = cargo();
    c.args(["bench", "-p", "pgtable-bench"])
        .env("PEERS_CLOCK", "thread");
    if quick {
        c.args([
            "--bench",
            "x86_peers",
            "--bench",
            "arm64_peers",
            "--bench",
            "riscv_peers",
            "--bench",
            "granules",
        ])
        .env("PGTABLE_BENCH_QUICK", "1")
        .args(["--", "--warm-up-time", "0.3", "--measurement-time", "1"]);
    }
    if let Err(e) = sh(&mut c) {
        errors.push(e);
    }
    // The contiguous-hint bench needs the simulator (for its TLB fill
    // counts), which turns pgtable-core's counters on: its own run.
    let mut c = cargo();
    c.args([
        "bench",
        "-p",
        "pgtable-bench",
        "--features",
        "sim",
        "--bench",
        "contpte",
    ])
    .env("PEERS_CLOCK", "thread");
    if quick {
        c.args(["--", "--warm-up-time", "0.3", "--measurement-time", "1"]);
    }
    if let Err(e) = sh(&mut c) {
        errors.push(e);
    }
    let mut stages = vec![("criterion", stage.elapsed().as_secs())];

    // 2. the sweep.
    let stage = Instant::now();
    let mut c = cargo();
    c.env("PEERS_CLOCK", "thread").args([
        "run",
        "-p",
        "pgtable-bench",
        "--profile",
        "bench",
        "--bin",
        "sweep",
        "--",
    ]);
    if quick {
        c.arg("--quick");
    }
    // A failed sweep leaves no CSV (the report shows it missing).
    let _ = std::fs::remove_file(dir.join("sweep.csv"));
    match output(&mut c) {
        Ok(csv) => save(&dir, "sweep.csv", &csv)?,
        Err(e) => errors.push(e),
    }

    stages.push(("sweep", stage.elapsed().as_secs()));

    // 3. Linux's mremap.
    let stage = Instant::now();
    let linux = match crate::linux_mremap::bench(if quick { 3 } else { 10 }) {
        Ok([pud, pmd, pte]) => format!("ok {pud} {pmd} {pte}\n"),
        Err(e) => {
            errors.push(format!("linux mremap: {e}"));
            format!("error {e}\n")
        }
    };
    save(&dir, "linux-mremap.txt", &linux)?;

    stages.push(("linux mremap", stage.elapsed().as_secs()));

    // 4. the x86 kernel.
    let stage = Instant::now();
    let kernel = match crate::x86::bench() {
        Ok((lines, accel)) => format!("accel {accel}\n{}\n", lines.join("\n")),
        Err(e) => {
            errors.push(e.clone());
            format!("error {e}\n")
        }
    };
    save(&dir, "kernel.txt", &kernel)?;
    stages.push(("x86 kernel", stage.elapsed().as_secs()));

    // 5. the report, drawn by pgtable-bench's `report` binary.
    let mut c = cargo();
    c.args(["run", "-p", "pgtable-bench", "--bin", "report", "--"])
        .arg(&dir)
        .arg(root().join("target/criterion"));
    if quick {
        c.arg("--quick");
    }
    sh(&mut c)?;
    let stages: Vec<String> = stages.iter().map(|(n, s)| format!("{n} {s} s")).collect();
    println!(
        "xtask: bench report: {}, {:.0} s ({})",
        dir.join("index.html").display(),
        t0.elapsed().as_secs_f64(),
        stages.join(", ")
    );
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

/// Runs `cmd`, returning its stdout (stderr streams through).
fn output(cmd: &mut std::process::Command) -> Result<String, String> {
    eprintln!("xtask: running {cmd:?}");
    let out = cmd
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("{cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{cmd:?} failed with {}", out.status));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Writes one step's figures to `dir/name` for the report.
fn save(dir: &Path, name: &str, text: &str) -> Result<(), String> {
    let p = dir.join(name);
    std::fs::write(&p, text).map_err(|e| format!("{}: {e}", p.display()))
}
