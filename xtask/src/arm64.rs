//! `qemu-test` for the arm64 tiny kernel (examples/arm64-kernel).
//!
//! Builds the kernel once per page-table geometry of [`GEOMETRIES`]
//! (release, `aarch64-unknown-none`, its own workspace and lock file; the
//! geometry is a Cargo feature set of the kernel), boots each on QEMU
//! `virt` with semihosting under a timeout, streams the console, and
//! prints `xtask: arm64: 16K/48-bit run passed (tcg)` for each. A run
//! succeeds only on the kernel's report that it runs the geometry, exit code 33, a
//! final `N passed, 0 failed` line, an `ok` line for every case of
//! [`SPACE_CASES`] and [`SMP_CASES`] (the kernel's own checks of its
//! address-space split and of TLB shootdown across CPUs, which the
//! suite's summary would not miss if the kernel stopped running them),
//! the same for [`CONTPTE_CASES`] (contiguous mappings) and [`MM_CASES`]
//! (a memory manager's in-place replacements), and the kernel's report
//! that all [`CPUS`] CPUs came up.

use std::path::PathBuf;
use std::time::Duration;

use crate::qemu::{boot, cargo, cmdline, ensure_qemu, ensure_target, judge, root, run, Outcome};
use crate::QemuOpts;

/// The Rust target of the kernel.
const TARGET: &str = "aarch64-unknown-none";
/// The QEMU system emulator.
const QEMU: &str = "qemu-system-aarch64";
/// The kernel's exit code when its suite passed (semihosting SYS_EXIT).
const EXIT_SUCCESS: i32 = 33;
/// Guest RAM: the suite's pool needs more than 2 GiB.
const MEMORY: &str = "3G";
/// The kernel's `space_` cases (src/space.rs), each of which must print
/// `ok <name>`: the kernel runs from TTBR1 with no identity map left, its
/// map is W^X, EL0 is isolated from it, and user spaces switched by ASID
/// (no full flush) see only their own memory, also across ASID roll-overs,
/// unmaps in other spaces, fork, moves of swap entries, live protection
/// changes of the kernel map and unmaps that report what they removed;
/// and `mm_prot_none`: a kernel page made `Prot::NONE` faults on every
/// access while its entry still reports the frame.
pub const SPACE_CASES: &[&str] = &[
    "space_no_identity_map",
    "space_kernel_text_executes_and_data_takes_stores",
    "space_kernel_text_write_faults",
    "space_kernel_rodata_write_faults",
    "space_kernel_rodata_exec_faults",
    "space_kernel_data_exec_faults",
    "space_kernel_stack_exec_faults",
    "space_linear_map_exec_faults",
    "space_linear_alias_of_text_write_faults",
    "space_kernel_stack_guard_faults",
    "space_user_roundtrip",
    "space_user_access_to_kernel_faults",
    "space_user_code_write_faults",
    "space_user_data_exec_faults",
    "space_kernel_cannot_execute_user_memory",
    "space_user_space_frees_its_tables",
    "space_table_attrs_kernel_and_user",
    "space_isolation_by_asid",
    "space_no_stale_after_switch",
    "space_no_stale_after_unmap_in_other_space",
    "space_no_stale_after_asid_rollover",
    "space_fork_cow_write_faults",
    "space_swap_entry_survives_move",
    "space_live_kernel_protect",
    "space_unmap_reports",
    "space_asid_spaces_free_their_tables",
    "mm_prot_none",
];

/// The kernel's `mm_` cases (src/space_mm/mm.rs), each of which must
/// print `ok <name>`: `replace_pte` swaps out a whole PTE table while the
/// table allocator refuses every frame (and swaps it in again), and
/// replaces a copy-on-write page by its copy with one page flush, the MMU
/// reading the copy at once.
pub const MM_CASES: &[&str] = &["mm_reclaim_full_table_no_alloc", "mm_cow_replace"];

/// Ok if every case of `cases` printed exactly `ok <name>`.
fn require_ok(outcome: &Outcome, cases: &[&str]) -> Result<(), String> {
    let missing: Vec<&str> = cases
        .iter()
        .copied()
        .filter(|c| {
            !outcome
                .lines
                .iter()
                .any(|l| l.trim_end().strip_prefix("ok ") == Some(*c))
        })
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!("no `ok` line for: {}", missing.join(", ")))
    }
}

/// CPUs QEMU gives the guest (`-smp`); the kernel starts them all
/// through PSCI and must report `smp: <CPUS> CPUs online`.
pub const CPUS: u32 = 4;

/// The kernel's `smp_` cases (src/smp_cases.rs), each of which must print
/// `ok <name>`: after a pgtable operation returns, every other CPU sees
/// the change (and a local-only flush is caught not doing so); at the
/// end every secondary turned off (PSCI `CPU_OFF`, checked with
/// `AFFINITY_INFO`) before the suite runs.
pub const SMP_CASES: &[&str] = &[
    "smp_unmap_faults_everywhere",
    "smp_move_readers_follow",
    "smp_writer_races_move",
    "smp_protect_readonly_everywhere",
    "smp_space_live_elsewhere",
    "smp_local_flush_misses_others",
    "smp_secondaries_off",
];

/// Ok if the kernel printed `smp: <cpus> CPUs online` (at the start of a
/// line).
fn require_online(outcome: &Outcome, cpus: u32) -> Result<(), String> {
    let want = format!("smp: {cpus} CPUs online");
    if outcome.lines.iter().any(|l| {
        l.strip_prefix(want.as_str())
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(' '))
    }) {
        Ok(())
    } else {
        Err(format!("no `{want}` line: not every CPU came up"))
    }
}

/// The kernel's `contpte_` cases (src/contpte/), each of which must
/// print `ok <name>`: the linear map is folded into contiguous runs, and a
/// protection change, unmap or move of part of a run unfolds it whole
/// (the hint gone from all 16 entries, the MMU enforcing the change on
/// the one page only) while whole runs stay folded, an in-place change of
/// part of a run is refused, and the accessed/dirty state is gathered
/// over a run, from the hardware's updates (`-cpu max` has FEAT_HAFDBS,
/// which `space_unmap_reports` needs too) and from the kernel's fault
/// path with them turned off.
pub const CONTPTE_CASES: &[&str] = &[
    "contpte_linear_map_folded",
    "contpte_partial_protect",
    "contpte_block_run_split",
    "contpte_partial_unmap",
    "contpte_misaligned_move",
    "contpte_congruent_move",
    "contpte_live_protect_of_part_refused",
    "contpte_access_dirty_aggregation",
    "contpte_access_dirty_aggregation_software",
    "contpte_cases_free_their_tables",
];

/// A page-table geometry the kernel is built and run for.
#[derive(Clone, Copy, Debug)]
pub struct Geometry {
    /// As the kernel prints it (`MMU on (16K/48)`).
    pub name: &'static str,
    /// The kernel's Cargo features that select it.
    pub features: &'static str,
    /// Whether the run includes the in-kernel benchmarks (one geometry:
    /// the others run every case, not the benchmarks).
    pub bench: bool,
}

/// Every geometry of Linux arm64 that QEMU 7.2's `-cpu max` translates
/// (it has FEAT_LPA2, FEAT_LVA and FEAT_LPA): 4 KiB pages with 48- and
/// 52-bit VAs, 16 KiB with 48 and 52, 64 KiB with 48 and 52. 16K/47 is
/// left out: its 47-bit upper half cannot hold the kernel's regions at
/// `0xffff_0000_0000_0000` (the library's 16K/47 format is tested on the
/// simulator).
pub const GEOMETRIES: &[Geometry] = &[
    Geometry {
        name: "4K/48",
        features: "",
        bench: true,
    },
    Geometry {
        name: "4K/52",
        features: "va-52",
        bench: false,
    },
    Geometry {
        name: "16K/48",
        features: "granule-16k",
        bench: false,
    },
    Geometry {
        name: "16K/52",
        features: "granule-16k,va-52",
        bench: false,
    },
    Geometry {
        name: "64K/48",
        features: "granule-64k",
        bench: false,
    },
    Geometry {
        name: "64K/52",
        features: "granule-64k,va-52",
        bench: false,
    },
];

/// Upper bound for one run (the release kernel takes 10-20 s under TCG).
const TIMEOUT: Duration = Duration::from_secs(300);

/// Builds the arm64 kernel for `geo` and returns the path of its ELF
/// image (a copy per geometry: every build writes the same output file).
pub fn build_kernel(geo: &Geometry) -> Result<PathBuf, String> {
    let root = root();
    let dir = root.join("examples/arm64-kernel");
    let target_dir = root.join("target/kernels");
    let mut c = cargo();
    c.current_dir(&dir)
        .args(["build", "--release", "--target", TARGET])
        .arg("--target-dir")
        .arg(&target_dir);
    if !geo.features.is_empty() {
        c.args(["--features", geo.features]);
    }
    run(&mut c)?;
    let built = target_dir.join(TARGET).join("release/pgtable-arm64-kernel");
    let copy = target_dir
        .join(TARGET)
        .join(format!("release/pgtable-arm64-kernel-{}", file_name(geo)));
    std::fs::copy(&built, &copy).map_err(|e| format!("{}: {e}", copy.display()))?;
    Ok(copy)
}

/// `16K/48` as a file-name part: `16k-48`.
fn file_name(geo: &Geometry) -> String {
    geo.name.to_ascii_lowercase().replace('/', "-")
}

/// The kernel command line for `geo`: the options, and `nobench` where
/// the benchmarks are not run.
fn geometry_cmdline(opts: &QemuOpts, geo: &Geometry) -> String {
    let mut line = cmdline(opts);
    if !geo.bench {
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str("nobench");
    }
    line
}

/// Ok if the kernel said it runs `geo` (`MMU on (<name>):`).
fn require_geometry(outcome: &Outcome, geo: &Geometry) -> Result<(), String> {
    let want = format!("MMU on ({}):", geo.name);
    if outcome.lines.iter().any(|l| l.starts_with(&want)) {
        Ok(())
    } else {
        Err(format!(
            "the kernel did not report `{want}`: not built for the {} geometry, or it stopped before",
            geo.name
        ))
    }
}

/// The QEMU arguments that boot `kernel` with `append` as its command line.
fn qemu_args(kernel: &std::path::Path, append: &str) -> Vec<String> {
    let mut args: Vec<String> = [
        "-machine",
        "virt",
        "-cpu",
        "max",
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
    // After "-machine virt -cpu max": every CPU QEMU gives, started by
    // the kernel through PSCI.
    args.splice(4..4, ["-smp".to_string(), CPUS.to_string()]);
    args.push(kernel.display().to_string());
    if !append.is_empty() {
        args.push("-append".into());
        args.push(append.into());
    }
    args
}

/// Builds the arm64 kernel for every geometry, then boots each; Ok only
/// if every run passed.
pub fn qemu_test(opts: &QemuOpts) -> Result<(), String> {
    ensure_target(TARGET)?;
    ensure_qemu(QEMU)?;
    let mut kernels = Vec::new();
    for geo in GEOMETRIES {
        kernels.push((geo, build_kernel(geo)?));
    }
    let mut failures = Vec::new();
    for (geo, kernel) in kernels {
        match run_geometry(opts, geo, &kernel) {
            Ok(()) => eprintln!("xtask: arm64: {}-bit run passed (tcg)", geo.name),
            Err(e) => {
                eprintln!("xtask: arm64: {}-bit run FAILED: {e}", geo.name);
                failures.push(format!("{}: {e}", geo.name));
            }
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("; "))
    }
}

/// Boots `kernel` (built for `geo`) and judges its run.
fn run_geometry(opts: &QemuOpts, geo: &Geometry, kernel: &std::path::Path) -> Result<(), String> {
    let prefix = format!("arm64 {}| ", geo.name);
    let outcome = boot(
        QEMU,
        &qemu_args(kernel, &geometry_cmdline(opts, geo)),
        TIMEOUT,
        &prefix,
    )?;
    require_geometry(&outcome, geo)?;
    judge(&outcome, EXIT_SUCCESS)?;
    require_ok(&outcome, SPACE_CASES)?;
    require_online(&outcome, CPUS)?;
    require_ok(&outcome, SMP_CASES)?;
    require_ok(&outcome, CONTPTE_CASES)?;
    require_ok(&outcome, MM_CASES)
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
        assert!(joined.contains("-smp 4 "), "{joined}");
        assert!(!qemu_args(std::path::Path::new("/k"), "").contains(&"-append".to_string()));
    }

    #[test]
    fn every_space_case_must_print_ok() {
        let o = |lines: &[&str]| Outcome {
            code: Some(EXIT_SUCCESS),
            lines: lines.iter().map(|s| s.to_string()).collect(),
            timed_out: false,
        };
        let all: Vec<String> = SPACE_CASES.iter().map(|c| format!("ok {c}")).collect();
        let all: Vec<&str> = all.iter().map(|s| s.as_str()).collect();
        assert!(require_ok(&o(&all), SPACE_CASES).is_ok());
        // One case missing, failed, or only a prefix of a longer name.
        let err = require_ok(&o(&all[1..]), SPACE_CASES).unwrap_err();
        assert!(err.contains(SPACE_CASES[0]), "{err}");
        let mut failed = all.clone();
        let line = format!("FAIL {}: did not fault", SPACE_CASES[2]);
        failed[2] = &line;
        assert!(require_ok(&o(&failed), SPACE_CASES).is_err());
        assert!(require_ok(
            &o(&["ok space_user_roundtrip_extra"]),
            &["space_user_roundtrip"]
        )
        .is_err());
    }

    #[test]
    fn each_geometry_has_its_own_features_file_and_command_line() {
        let names: Vec<&str> = GEOMETRIES.iter().map(|g| g.name).collect();
        assert_eq!(
            names,
            ["4K/48", "4K/52", "16K/48", "16K/52", "64K/48", "64K/52"]
        );
        let mut files: Vec<String> = GEOMETRIES.iter().map(file_name).collect();
        files.dedup();
        assert_eq!(files.len(), GEOMETRIES.len());
        assert_eq!(file_name(&GEOMETRIES[3]), "16k-52");
        // Exactly one geometry runs the benchmarks.
        assert_eq!(GEOMETRIES.iter().filter(|g| g.bench).count(), 1);
        let opts = QemuOpts {
            arch: "arm64".into(),
            seed: Some(7),
            threshold_mb: None,
            no_kvm: false,
        };
        assert_eq!(geometry_cmdline(&opts, &GEOMETRIES[0]), "seed=7");
        assert_eq!(geometry_cmdline(&opts, &GEOMETRIES[2]), "seed=7 nobench");
        let o = |lines: &[&str]| Outcome {
            code: Some(EXIT_SUCCESS),
            lines: lines.iter().map(|s| s.to_string()).collect(),
            timed_out: false,
        };
        let line = "MMU on (16K/48): TTBR1_EL1=0x40400000";
        assert!(require_geometry(&o(&[line]), &GEOMETRIES[2]).is_ok());
        assert!(require_geometry(&o(&[line]), &GEOMETRIES[3]).is_err());
        assert!(require_geometry(&o(&["MMU on: TTBR1_EL1=0x1"]), &GEOMETRIES[0]).is_err());
    }

    #[test]
    fn every_cpu_must_come_up() {
        let o = |lines: &[&str]| Outcome {
            code: Some(EXIT_SUCCESS),
            lines: lines.iter().map(|s| s.to_string()).collect(),
            timed_out: false,
        };
        assert!(require_online(&o(&["smp: 4 CPUs online (device tree: 4 CPUs)"]), 4).is_ok());
        assert!(require_online(&o(&["smp: 4 CPUs online"]), 4).is_ok());
        assert!(require_online(&o(&["smp: 1 CPUs online"]), 4).is_err());
        assert!(require_online(&o(&["smp: 40 CPUs online"]), 4).is_err());
        assert!(require_online(&o(&["FAIL smp_bring_up: CPU_ON failed"]), 4).is_err());
        let all: Vec<String> = SMP_CASES.iter().map(|c| format!("ok {c}")).collect();
        let all: Vec<&str> = all.iter().map(|s| s.as_str()).collect();
        assert!(require_ok(&o(&all), SMP_CASES).is_ok());
        assert!(require_ok(&o(&all[..5]), SMP_CASES).is_err());
    }
}
