//! `cargo xtask miri`: every host test of the libraries under Miri.
//!
//! Each test binary is interpreted once per batch of tests (libtest in one
//! Miri process), not once per test: Miri's start-up (loading the MIR of
//! the binary and its dependencies) is paid per batch, and batches run one
//! per CPU.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::Instant;

use crate::ci::{has_toolchain, with_toolchain, LIBS};
use crate::qemu::{root, run as sh};

/// The crates whose host test binaries run under Miri: pgtable-core and
/// the three arch crates, each with every feature (the simulator, the
/// suite and the model test included).
const MIRI_CRATES: [&str; LIBS.len()] = LIBS;

/// Test-name fragments Miri skips: only cases that map, move or walk a GiB
/// of 4 KiB pages (262,144 entries or more, hours each under Miri). The
/// same code paths run in the other cases at MiB scale. A test is skipped
/// when its full name (`module::test`) contains a fragment; each fragment
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

/// The arena hands out host addresses as physical addresses, hence
/// permissive provenance. Leaks are not checked: the SMP and race tests
/// leak their `'static` handles on purpose (`Box::leak` of the
/// `Shootdown`, `MmCpus` and slots their threads share), and the
/// simulator's frame counts already check that the library frees every
/// table.
const MIRIFLAGS: &str = "-Zmiri-permissive-provenance -Zmiri-ignore-leaks";

/// Tests per Miri process. Small enough that the batches of the big
/// `all` binaries spread over the CPUs, large enough that start-up (a few
/// seconds) stays a small part of each batch.
const BATCH: usize = 8;

/// The test binary whose tests each run for minutes under Miri (the model
/// test: one episode per format). Its tests run first and one per batch,
/// so that the run does not end with one CPU working through them alone.
const LONG: &str = "model";

/// The indices of `bins`, those of [`LONG`] binaries first.
fn first_the_long(bins: &[Binary]) -> Vec<usize> {
    let (mut long, short): (Vec<usize>, Vec<usize>) =
        (0..bins.len()).partition(|&i| bins[i].target == LONG);
    long.extend(short);
    long
}

/// The nightly components `cargo miri` needs.
const MIRI_COMPONENTS: [&str; 2] = ["miri", "rust-src"];

/// Installs what `cargo miri` needs when it is missing: the nightly
/// toolchain (minimal profile, with [`MIRI_COMPONENTS`]), or on a nightly
/// that is there each of [`MIRI_COMPONENTS`] it lacks (checked one by
/// one: a minimal nightly has neither, and `miri` without `rust-src`
/// cannot build its sysroot).
fn ensure_miri() -> Result<(), String> {
    if !has_toolchain("nightly") {
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

/// What `cargo xtask miri` runs: every test, or only those of the named
/// test binaries, and all of them or one slice.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct MiriOpts {
    /// `--test NAME`: test binaries (`lib`, the unit tests; `model`; `all`).
    pub tests: Vec<String>,
    /// `--partition K/N`: the K-th of N slices of the tests (1-based), so
    /// a run can be split over machines or sessions.
    pub partition: Option<(u32, u32)>,
}

/// One host test binary: a crate's unit tests (`lib`) or one of its
/// integration tests.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Binary {
    krate: &'static str,
    /// `lib`, or the integration test's name.
    target: String,
}

impl Binary {
    /// `cargo miri test` of this binary alone, with every feature.
    fn cargo(&self) -> Command {
        let mut c = with_toolchain("nightly", "cargo");
        c.args([
            "miri",
            "test",
            "--quiet",
            "--all-features",
            "-p",
            self.krate,
        ]);
        if self.target == "lib" {
            c.arg("--lib");
        } else {
            c.args(["--test", &self.target]);
        }
        c.env("MIRIFLAGS", MIRIFLAGS);
        c
    }

    fn label(&self) -> String {
        format!("{} {}", self.krate, self.target)
    }
}

/// The integration tests of the crate in `dir`, as cargo finds them:
/// `tests/NAME.rs` and `tests/NAME/main.rs`, sorted.
fn integration_tests(dir: &Path) -> Result<Vec<String>, String> {
    let tests = dir.join("tests");
    let rd = std::fs::read_dir(&tests).map_err(|e| format!("{}: {e}", tests.display()))?;
    let mut names = Vec::new();
    for entry in rd {
        let path = entry
            .map_err(|e| format!("{}: {e}", tests.display()))?
            .path();
        let stem = path.file_stem().and_then(|s| s.to_str()).map(str::to_owned);
        let is_test = if path.is_dir() {
            path.join("main.rs").is_file()
        } else {
            path.extension().is_some_and(|e| e == "rs")
        };
        if let (true, Some(stem)) = (is_test, stem) {
            names.push(stem);
        }
    }
    names.sort();
    Ok(names)
}

/// Every test binary of [`MIRI_CRATES`], or those named in `only`.
fn binaries(only: &[String]) -> Result<Vec<Binary>, String> {
    let mut out = Vec::new();
    for krate in MIRI_CRATES {
        let mut targets = vec!["lib".to_string()];
        targets.extend(integration_tests(&root().join(krate))?);
        for target in targets {
            if only.is_empty() || only.contains(&target) {
                out.push(Binary { krate, target });
            }
        }
    }
    if out.is_empty() {
        return Err(format!("no test binary is named {only:?}"));
    }
    Ok(out)
}

/// The test names of libtest's `--list --format terse` output.
fn parse_list(out: &str) -> Vec<String> {
    out.lines()
        .filter_map(|l| l.strip_suffix(": test"))
        .map(str::to_owned)
        .collect()
}

/// The tests of `b` (listed under Miri, as `cfg(miri)` builds them).
fn list(b: &Binary) -> Result<Vec<String>, String> {
    let mut c = b.cargo();
    c.args(["--", "--list", "--format", "terse"]);
    let out = c.output().map_err(|e| format!("{c:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "listing {}: {}\n{}",
            b.label(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(parse_list(&String::from_utf8_lossy(&out.stdout)))
}

/// Whether Miri skips the test `name` ([`MIRI_SKIP`]).
fn skipped(name: &str) -> bool {
    MIRI_SKIP.iter().any(|f| name.contains(f))
}

/// The K-th of N slices (1-based) of `items`: every N-th, starting at the
/// K-th, so each slice takes a share of every binary.
fn slice<T>(items: Vec<T>, partition: Option<(u32, u32)>) -> Vec<T> {
    let Some((k, n)) = partition else {
        return items;
    };
    items
        .into_iter()
        .enumerate()
        .filter(|(i, _)| *i as u64 % u64::from(n) == u64::from(k - 1))
        .map(|(_, t)| t)
        .collect()
}

/// Tests of one binary that one Miri process runs.
#[derive(Debug, PartialEq, Eq)]
struct Batch {
    bin: usize,
    tests: Vec<String>,
}

/// What one Miri process printed of its batch.
#[derive(Debug, Default, PartialEq, Eq)]
struct Outcome {
    passed: Vec<String>,
    failed: Vec<String>,
    /// Miri reported undefined behaviour (it then stops the process).
    ub: bool,
}

/// libtest's `test NAME ... ok` / `... FAILED` lines, and whether Miri
/// reported undefined behaviour.
fn parse_run(out: &str) -> Outcome {
    let mut o = Outcome::default();
    for l in out.lines() {
        let Some(rest) = l.strip_prefix("test ") else {
            continue;
        };
        if let Some(name) = rest.strip_suffix(" ... ok") {
            o.passed.push(name.to_owned());
        } else if let Some(name) = rest.strip_suffix(" ... FAILED") {
            o.failed.push(name.to_owned());
        }
    }
    o.ub = out.contains("Undefined Behavior");
    o
}

/// Runs `batch` of `b` in one Miri process, its output saved in `log`.
fn run_batch(b: &Binary, tests: &[String], log: &Path) -> Result<Outcome, String> {
    let mut c = b.cargo();
    // `--test-threads 1`: Miri interprets every thread on one core, so more
    // threads only interleave the tests' output.
    c.args(["--", "--exact", "--test-threads", "1", "--format", "pretty"])
        .args(tests);
    let out = c.output().map_err(|e| format!("{c:?}: {e}"))?;
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(log, &text).map_err(|e| format!("{}: {e}", log.display()))?;
    Ok(parse_run(&text))
}

/// Calls `f` on every item, `jobs` at a time; the results in order.
fn par_map<T: Sync, R: Send>(items: &[T], jobs: usize, f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let next = Mutex::new(0usize);
    let results: Mutex<Vec<Option<R>>> = Mutex::new(items.iter().map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..jobs.max(1) {
            s.spawn(|| loop {
                let i = {
                    let mut n = next.lock().unwrap_or_else(|e| e.into_inner());
                    let i = *n;
                    *n += 1;
                    i
                };
                let Some(item) = items.get(i) else { break };
                let r = f(item);
                results.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(r);
            });
        }
    });
    results
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .into_iter()
        .flatten()
        .collect()
}

/// Per binary: tests run, passed, failed, skipped, and seconds in Miri.
#[derive(Debug, Default)]
struct Tally {
    run: usize,
    passed: usize,
    failed: Vec<String>,
    skipped: usize,
    secs: f64,
    ub: usize,
}

/// Every host test of pgtable-core and of the arch crates ([`MIRI_CRATES`])
/// under Miri, with every feature, on the nightly toolchain
/// ([`ensure_miri`] installs it and its components when missing), skipping
/// only [`MIRI_SKIP`] (the GiB cases).
///
/// Each binary's tests are listed under Miri, then run in batches of
/// [`BATCH`] (one libtest process under Miri each, `--exact` names; the
/// [`LONG`] binaries first, a test per batch), one batch per CPU at a
/// time. A batch that Miri stops (undefined behaviour)
/// is reported with its log, and the tests it did not reach run in a batch
/// of their own. Every batch runs; the summary gives per binary the tests
/// run, passed, failed and skipped, and the seconds spent, then one line
/// of totals. Logs are in `target/miri-logs`.
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
pub fn miri(opts: &MiriOpts) -> Result<(), String> {
    let t0 = Instant::now();
    ensure_miri()?;
    let bins = binaries(&opts.tests)?;
    let mut build = with_toolchain("nightly", "cargo");
    build
        .args(["miri", "test", "--all-features", "--no-run"])
        .args(MIRI_CRATES.iter().flat_map(|k| ["-p", k]))
        .env("MIRIFLAGS", MIRIFLAGS);
    sh(&mut build)?;

    let jobs = std::thread::available_parallelism().map_or(1, |n| n.get());
    let lists = par_map(&bins, jobs, list);
    let mut tally: Vec<Tally> = bins.iter().map(|_| Tally::default()).collect();
    let mut all = Vec::new();
    for (i, l) in lists.into_iter().enumerate() {
        for name in l? {
            if skipped(&name) {
                tally[i].skipped += 1;
            } else {
                all.push((i, name));
            }
        }
    }
    let mine = slice(all, opts.partition);
    let mut queue = VecDeque::new();
    for i in first_the_long(&bins) {
        let tests: Vec<String> = mine
            .iter()
            .filter(|(b, _)| *b == i)
            .map(|(_, n)| n.clone())
            .collect();
        let per_batch = if bins[i].target == LONG { 1 } else { BATCH };
        for chunk in tests.chunks(per_batch) {
            queue.push_back(Batch {
                bin: i,
                tests: chunk.to_vec(),
            });
        }
    }
    let logs = root().join("target/miri-logs");
    std::fs::create_dir_all(&logs).map_err(|e| format!("{}: {e}", logs.display()))?;
    eprintln!(
        "xtask: miri: {} tests of {} binaries in {} batches, {jobs} at a time",
        mine.len(),
        bins.len(),
        queue.len()
    );
    run_queue(&bins, queue, jobs, &logs, &mut tally)?;
    summarize(&bins, &tally, t0)
}

/// The work of a run: batches left, batches handed out so far, batches
/// in all (a batch that Miri stopped adds one for the tests it did not
/// reach).
struct Work {
    queue: VecDeque<Batch>,
    started: usize,
    total: usize,
}

/// Runs every batch of `queue`, `jobs` at a time, into `tally`.
fn run_queue(
    bins: &[Binary],
    queue: VecDeque<Batch>,
    jobs: usize,
    logs: &Path,
    tally: &mut [Tally],
) -> Result<(), String> {
    let total = queue.len();
    let work = Mutex::new(Work {
        queue,
        started: 0,
        total,
    });
    let shared = Mutex::new(tally);
    let errors = Mutex::new(Vec::new());
    let worker = || loop {
        let (batch, k) = {
            let mut w = work.lock().unwrap_or_else(|e| e.into_inner());
            let Some(b) = w.queue.pop_front() else { break };
            w.started += 1;
            (b, w.started)
        };
        let b = &bins[batch.bin];
        let log: PathBuf = logs.join(format!("{}-{}-{k}.log", b.krate, b.target));
        let start = Instant::now();
        let o = match run_batch(b, &batch.tests, &log) {
            Ok(o) => o,
            Err(e) => {
                errors.lock().unwrap_or_else(|e| e.into_inner()).push(e);
                continue;
            }
        };
        let secs = start.elapsed().as_secs_f64();
        // The tests libtest did not report: Miri stopped in the first and
        // never reached the others.
        let unreported: Vec<String> = batch
            .tests
            .iter()
            .filter(|t| !o.passed.contains(t) && !o.failed.contains(t))
            .cloned()
            .collect();
        let mut line = format!(
            "xtask: miri: [{k}/{}] {}: {} passed, {} failed in {secs:.0} s",
            work.lock().unwrap_or_else(|e| e.into_inner()).total,
            b.label(),
            o.passed.len(),
            o.failed.len()
        );
        if let Some(stopped) = unreported.first() {
            let _ = write!(
                line,
                "; Miri stopped{} in {stopped} (log {})",
                if o.ub { " on undefined behaviour" } else { "" },
                log.display()
            );
        }
        eprintln!("{line}");
        {
            let mut t = shared.lock().unwrap_or_else(|e| e.into_inner());
            let t = &mut t[batch.bin];
            t.run += o.passed.len() + o.failed.len() + unreported.len().min(1);
            t.passed += o.passed.len();
            t.failed.extend(o.failed);
            t.failed.extend(unreported.first().cloned());
            t.ub += usize::from(o.ub);
            t.secs += secs;
        }
        if unreported.len() > 1 {
            let mut w = work.lock().unwrap_or_else(|e| e.into_inner());
            w.total += 1;
            w.queue.push_back(Batch {
                bin: batch.bin,
                tests: unreported[1..].to_vec(),
            });
        }
    };
    std::thread::scope(|s| {
        for _ in 0..jobs.max(1) {
            s.spawn(worker);
        }
    });
    let errors = errors.into_inner().unwrap_or_else(|e| e.into_inner());
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

/// Prints the table of binaries and the totals; an error when a test
/// failed or Miri reported undefined behaviour.
fn summarize(bins: &[Binary], tally: &[Tally], t0: Instant) -> Result<(), String> {
    eprintln!("xtask: miri: binary | run | passed | failed | skipped | seconds");
    let mut sum = Tally::default();
    for (b, t) in bins.iter().zip(tally) {
        eprintln!(
            "xtask: miri: {} | {} | {} | {} | {} | {:.0}",
            b.label(),
            t.run,
            t.passed,
            t.failed.len(),
            t.skipped,
            t.secs
        );
        sum.run += t.run;
        sum.passed += t.passed;
        sum.failed
            .extend(t.failed.iter().map(|f| format!("{} {f}", b.label())));
        sum.skipped += t.skipped;
        sum.ub += t.ub;
        sum.secs += t.secs;
    }
    eprintln!(
        "xtask: miri: {} passed, {} failed, {} skipped, undefined behaviour in {} batches; \
         {:.0} s in Miri, {:.0} s in all",
        sum.passed,
        sum.failed.len(),
        sum.skipped,
        sum.ub,
        sum.secs,
        t0.elapsed().as_secs_f64()
    );
    if sum.failed.is_empty() && sum.ub == 0 {
        Ok(())
    } else {
        Err(format!("under Miri, failed: {}", sum.failed.join(", ")))
    }
}

#[cfg(test)]
mod tests {
    use super::{
        first_the_long, has_component, parse_list, parse_run, skipped, slice, Binary,
        MIRI_COMPONENTS,
    };

    #[test]
    fn gib_cases_are_skipped_and_others_are_not() {
        for name in [
            "moves::pud_aligned_1g_move_writes_one_entry",
            "engine::mapping_1gib_of_pages_issues_one_barrier_per_table",
            "conformance::suite_big_moves_on_arm64",
            "aspace::barrier_per_entry_variant_issues_one_per_pte",
        ] {
            assert!(skipped(name), "{name}");
        }
        for name in [
            "moves::pmd_aligned_2m_move_writes_one_entry",
            "conformance::suite_on_arm64",
            "asid::bad_widths_and_cpu_numbers_are_typed_errors",
        ] {
            assert!(!skipped(name), "{name}");
        }
    }

    #[test]
    fn the_model_binaries_run_first() {
        let bin = |krate, target: &str| Binary {
            krate,
            target: target.to_string(),
        };
        let bins = [
            bin("a", "lib"),
            bin("a", "all"),
            bin("a", "model"),
            bin("b", "all"),
            bin("b", "model"),
        ];
        assert_eq!(first_the_long(&bins), [2, 4, 0, 1, 3]);
    }

    #[test]
    fn listed_tests_are_read_and_benches_are_not() {
        let out = "a::one: test\nb::two: test\nc::bench: benchmark\n\n2 tests, 1 benchmark\n";
        assert_eq!(parse_list(out), ["a::one", "b::two"]);
    }

    #[test]
    fn a_run_reports_passes_failures_and_undefined_behaviour() {
        let out = "running 3 tests\ntest a::one ... ok\ntest a::two ... FAILED\n\
                   test a::three ... error: Undefined Behavior: out-of-bounds\n";
        let o = parse_run(out);
        assert_eq!(o.passed, ["a::one"]);
        assert_eq!(o.failed, ["a::two"]);
        assert!(o.ub);
        let clean = parse_run("test a::one ... ok\ntest result: ok. 1 passed; 0 failed");
        assert!(!clean.ub);
        assert_eq!(clean.passed.len(), 1);
    }

    #[test]
    fn slices_partition_the_tests_round_robin() {
        let all: Vec<u32> = (0..10).collect();
        let mut seen: Vec<u32> = (1..=3)
            .flat_map(|k| slice(all.clone(), Some((k, 3))))
            .collect();
        assert_eq!(slice(all.clone(), Some((2, 3))), [1, 4, 7]);
        seen.sort();
        assert_eq!(seen, all);
        assert_eq!(slice(all.clone(), None), all);
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
