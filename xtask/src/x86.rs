//! `qemu-test` for the x86 tiny kernel (examples/x86-kernel).
//!
//! Builds the kernel (release, `x86_64-unknown-none`, into
//! `target/kernels`), boots it with `qemu-system-x86_64 -kernel` (PVH) on
//! the q35 machine under KVM when `/dev/kvm` opens read-write (TCG
//! otherwise, or with `--no-kvm`), streams the serial console and succeeds
//! only on the agreed isa-debug-exit code (0x10, so QEMU exits with 33), a
//! final `N passed, 0 failed` line and an `ok` line for each case of
//! [`ALWAYS`] (the kernel's own `space_` cases among them: W^X of the
//! upper-half kernel and ring 3 on the real MMU).
//!
//! When the CPU model has 5-level paging (TCG's `max` has it; KVM only if
//! the host CPU does), a second boot runs the suite with LA57 enabled
//! (`la57` on the kernel command line); otherwise the kernel reports why it
//! stayed with 4 levels.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::qemu::{boot, cargo, cmdline, ensure_qemu, ensure_target, judge, root, run, Outcome};
use crate::QemuOpts;

const TARGET: &str = "x86_64-unknown-none";
const QEMU: &str = "qemu-system-x86_64";
/// `isa-debug-exit` turns the kernel's 0x10 into `(0x10 << 1) | 1`.
const SUCCESS_CODE: i32 = 33;
/// Generous: under nested KVM every page-table write may trap.
const TIMEOUT: Duration = Duration::from_secs(40 * 60);

/// The accelerator a run uses.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Accel {
    /// Hardware virtualisation: native TSC timings.
    Kvm,
    /// KVM provided by `kvm_pvm` (pagetable-based virtualisation, no
    /// VMX/SVM): a kernel that is not a PVM guest is emulated by the
    /// hypervisor, so timings are emulated too (and slow).
    KvmPvm,
    /// Emulation: timings are emulated.
    Tcg,
}

impl Accel {
    fn name(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::KvmPvm => "kvm-pvm",
            Accel::Tcg => "tcg",
        }
    }

    fn qemu_args(self) -> [&'static str; 4] {
        match self {
            Accel::KvmPvm => Accel::Kvm.qemu_args(),
            // `-arch-capabilities`: QEMU 7.2 aborts on newer host kernels
            // that refuse its IA32_ARCH_CAPABILITIES value (MSR 0x10a); the
            // kernel does not use that MSR. `+invtsc`: with an invariant
            // TSC QEMU publishes the TSC frequency in CPUID 0x40000010.
            Accel::Kvm => ["-accel", "kvm", "-cpu", "host,-arch-capabilities,+invtsc"],
            Accel::Tcg => ["-accel", "tcg", "-cpu", "max"],
        }
    }
}

/// KVM when `/dev/kvm` opens read-write and `no_kvm` is not set.
pub fn pick_accel(no_kvm: bool) -> Accel {
    if no_kvm {
        eprintln!("xtask: x86: --no-kvm: using TCG (emulated timings)");
        return Accel::Tcg;
    }
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
    {
        Ok(_) if std::path::Path::new("/sys/module/kvm_pvm").exists() => {
            eprintln!(
                "xtask: x86: /dev/kvm opens, but it is kvm_pvm (no VMX/SVM): using it; \
                 the kernel runs emulated and slowly, its timings are not native"
            );
            Accel::KvmPvm
        }
        Ok(_) => {
            eprintln!("xtask: x86: /dev/kvm opens: using KVM");
            Accel::Kvm
        }
        Err(e) => {
            eprintln!("xtask: x86: /dev/kvm: {e}: using TCG (emulated timings)");
            Accel::Tcg
        }
    }
}

/// Builds the kernel and returns the path of its ELF.
pub fn build_kernel() -> Result<PathBuf, String> {
    ensure_target(TARGET)?;
    let dir = root().join("examples/x86-kernel");
    let target_dir = root().join("target/kernels");
    // The kernel's own .cargo/config.toml sets the target and the static
    // relocation model; flags from the environment would override them.
    run(cargo()
        .current_dir(&dir)
        .args(["build", "--release", "--target", TARGET])
        .env("CARGO_TARGET_DIR", &target_dir)
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("CARGO_BUILD_TARGET"))?;
    Ok(target_dir.join(TARGET).join("release/x86-kernel"))
}

/// Boots the kernel once with `append` as its command line.
pub fn boot_kernel(kernel: &Path, accel: Accel, append: &str) -> Result<Outcome, String> {
    let mut args: Vec<String> = ["-machine", "q35", "-m", "4G", "-smp", SMP_CPUS]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(accel.qemu_args().iter().map(|s| s.to_string()));
    args.extend(
        [
            "-nographic",
            "-no-reboot",
            "-device",
            "isa-debug-exit,iobase=0xf4,iosize=0x04",
            "-kernel",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    args.push(kernel.display().to_string());
    args.push("-append".into());
    args.push(
        format!("{append} accel={}", accel.name())
            .trim()
            .to_string(),
    );
    boot(QEMU, &args, TIMEOUT, "x86| ")
}

fn booted(o: &Outcome) -> bool {
    o.lines.iter().any(|l| l.contains("x86-kernel: booted"))
}

/// The kernel command line: `extra`, then the words for the options.
fn append(opts: &QemuOpts, extra: &str) -> String {
    format!("{extra} {}", cmdline(opts)).trim().to_string()
}

/// Boots with KVM when chosen; if QEMU cannot start the KVM guest at all
/// (no kernel output), falls back to TCG and says so.
fn boot_with_fallback(
    kernel: &Path,
    accel: Accel,
    append: &str,
) -> Result<(Outcome, Accel), String> {
    let o = boot_kernel(kernel, accel, append)?;
    if accel != Accel::Tcg && !booted(&o) && !o.timed_out {
        eprintln!(
            "xtask: x86: the KVM guest did not start (QEMU exit {:?}); retrying under TCG (emulated timings)",
            o.code
        );
        return Ok((boot_kernel(kernel, Accel::Tcg, append)?, Accel::Tcg));
    }
    Ok((o, accel))
}

/// Whether the CPU model of `accel` has LA57: TCG's `max` does; under KVM
/// the guest sees the host's flag.
fn la57_available(accel: Accel) -> bool {
    match accel {
        Accel::Tcg => true,
        Accel::Kvm | Accel::KvmPvm => std::fs::read_to_string("/proc/cpuinfo")
            .map(|s| s.split_whitespace().any(|w| w == "la57"))
            .unwrap_or(false),
    }
}

/// Builds and boots the x86 kernel; Ok only if its suite passed.
pub fn qemu_test(opts: &QemuOpts) -> Result<(), String> {
    ensure_qemu(QEMU)?;
    let kernel = build_kernel()?;
    let accel = pick_accel(opts.no_kvm);
    let mut extra = String::new();
    if accel == Accel::KvmPvm {
        // Every guest instruction is emulated there (about a microsecond
        // each): keep the run bounded. The TCG runs cover the big moves.
        eprintln!("xtask: x86: kvm_pvm: 1 GiB / 2 GiB moves left to the TCG (5-level) run");
        extra.push_str("nobig");
        if opts.threshold_mb.is_none() {
            eprintln!(
                "xtask: x86: kvm_pvm: validating 1 MiB per moved range (--threshold-mb overrides)"
            );
            extra.push(' ');
            extra.push_str(PVM_THRESHOLD);
        }
    }
    let (o, used) = boot_with_fallback(&kernel, accel, &append(opts, &extra))?;
    judge(&o, SUCCESS_CODE)
        .and_then(|()| passed_cases(&o.lines, ALWAYS))
        .and_then(|()| passed_one_of(&o.lines, ISOLATION))
        .and_then(|()| smp_passed(&o.lines))
        .map_err(|e| format!("4-level run ({}): {e}", used.name()))?;
    eprintln!("xtask: x86: 4-level run passed ({})", used.name());

    // 5-level paging: the suite again with CR4.LA57 (benchmarks skipped).
    let la57_accel = if la57_available(used) {
        used
    } else {
        eprintln!(
            "xtask: x86: the {} CPU model has no LA57; running the 5-level suite under TCG (-cpu max has it)",
            used.name()
        );
        Accel::Tcg
    };
    let o = boot_kernel(&kernel, la57_accel, &append(opts, "la57 nobench"))?;
    let la57 = o.lines.iter().any(|l| l.starts_with("paging: 5-level"));
    judge(&o, SUCCESS_CODE)
        .and_then(|()| passed_cases(&o.lines, ALWAYS))
        .and_then(|()| passed_one_of(&o.lines, ISOLATION))
        .and_then(|()| smp_passed(&o.lines))
        .and_then(|()| {
            if la57 {
                passed_cases(&o.lines, ABOVE_2_47)
            } else {
                Ok(())
            }
        })
        .map_err(|e| format!("5-level run ({}): {e}", la57_accel.name()))?;
    if la57 {
        eprintln!(
            "xtask: x86: 5-level (LA57) run passed ({})",
            la57_accel.name()
        );
    } else {
        eprintln!("xtask: x86: LA57 was not available in the guest; the kernel ran 4-level again (see its skip line)");
    }
    Ok(())
}

/// The CPUs every x86 boot has (`-smp`): the kernel brings them all up
/// and its `smp_` cases hammer ranges from CPUs 1-3 while CPU 0 changes
/// them.
const SMP_CPUS: &str = "4";

/// The line the kernel prints once every CPU reported in.
const SMP_ONLINE: &str = "smp: 4 CPUs online";

/// The `smp_` cases every run must pass: with the other CPUs hammering
/// the range, an unmap, a move (readers and writers) and a protection
/// change are seen by every CPU once the operation returns, a space live
/// only on other CPUs is flushed there, and each operation costs one IPI
/// round reaching exactly the CPUs the space is live on.
const SMP_CASES: &[&str] = &[
    "smp_unmap_faults_everywhere",
    "smp_move_readers_follow",
    "smp_writer_races_move",
    "smp_protect_readonly_everywhere",
    "smp_space_live_elsewhere",
    "smp_shootdown_counted",
];

/// Ok when the kernel brought up every CPU and passed the `smp_` cases.
fn smp_passed(lines: &[String]) -> Result<(), String> {
    if !lines.iter().any(|l| l.trim() == SMP_ONLINE) {
        return Err(format!("no `{SMP_ONLINE}` line"));
    }
    passed_cases(lines, SMP_CASES)
}

/// Cases every run must pass, not skip: the suite's instruction-fetch
/// case (EFER.NXE, the fetch probe), and the kernel's own `space_` cases:
/// it runs in the upper half with W^X (stores to its text, rodata and the
/// linear map's text alias fault, fetches from its data and the linear map
/// fault), ring 3 in a user address space sharing the kernel half
/// (a round trip through `int 0x80`, a CPL-3 load of a kernel address and
/// fetch of kernel text fault, the kernel cannot fetch user memory), no
/// stale translation after address-space switches, an unmap in a space
/// that is not installed and PCID roll-overs, fork with copy-on-write
/// (stores fault in parent and child), swap entries moved with their
/// table, live protection changes of kernel pages, the reports of a
/// gathered unmap, the `mm_` cases of `replace_pte`: a whole PTE table
/// swapped out and in while the table allocator refuses every frame, and
/// a copy-on-write page replaced by its copy with one page flush, and a
/// kernel page made `Prot::NONE` (`mm_prot_none`: every access faults
/// not-present, the entry still reports the frame; plus one of
/// [`ISOLATION`]).
const ALWAYS: &[&str] = &[
    "protect_execute_never",
    "space_lower_half_is_empty",
    "space_kernel_text_write_faults",
    "space_kernel_rodata_write_faults",
    "space_kernel_data_exec_faults",
    "space_linear_map_exec_faults",
    "space_linear_alias_of_text_write_faults",
    "space_user_roundtrip",
    "space_user_access_to_kernel_faults",
    "space_user_cannot_execute_kernel_text",
    "space_kernel_cannot_execute_user_memory",
    "space_user_space_shares_the_kernel_half",
    "space_no_stale_after_switch",
    "space_no_stale_after_unmap_in_other_space",
    "space_no_stale_after_pcid_rollover",
    "space_fork_cow_write_faults",
    "space_swap_entry_survives_move",
    "space_live_kernel_protect",
    "space_unmap_reports",
    "mm_reclaim_full_table_no_alloc",
    "mm_cow_replace",
    "mm_prot_none",
];

/// The isolation case of several address spaces: named after what
/// switches them (PCIDs when the guest CPU has them, CR3 writes
/// otherwise); every run must pass one of the two.
const ISOLATION: &[&str] = &["space_isolation_by_pcid", "space_isolation_by_cr3"];

/// Suite cases the 5-level run must pass: with LA57 they map, protect, move
/// and unmap above 2^47, where a flush of a 48-bit truncated address
/// leaves stale translations.
const ABOVE_2_47: &[&str] = &[
    "last_entries_of_the_lower_half_change_protection",
    "last_entries_of_the_lower_half_move",
    "last_entries_of_the_lower_half_unmap",
];

/// Ok when every case of `cases` printed its `ok <case>` line.
fn passed_cases(lines: &[String], cases: &[&str]) -> Result<(), String> {
    let missing: Vec<&str> = cases
        .iter()
        .copied()
        .filter(|c| !lines.iter().any(|l| l.strip_prefix("ok ") == Some(*c)))
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!("no `ok` line for {}", missing.join(", ")))
    }
}

/// Ok when one case of `cases` printed its `ok <case>` line.
fn passed_one_of(lines: &[String], cases: &[&str]) -> Result<(), String> {
    if lines
        .iter()
        .any(|l| l.strip_prefix("ok ").is_some_and(|c| cases.contains(&c)))
    {
        Ok(())
    } else {
        Err(format!("no `ok` line for any of {}", cases.join(", ")))
    }
}

/// The kernel option that lowers the validated bytes under kvm_pvm.
const PVM_THRESHOLD: &str = "threshold_mb=1";

/// `cargo xtask bench`'s x86 part: boots the kernel and runs its
/// benchmarks, after the suite's map and protect cases only (the whole
/// suite is `qemu-test`'s job). Returns the console lines and the
/// accelerator used.
pub fn bench() -> Result<(Vec<String>, &'static str), String> {
    ensure_qemu(QEMU)?;
    let kernel = build_kernel()?;
    let accel = pick_accel(false);
    let (o, used) = boot_with_fallback(&kernel, accel, "only=map_,protect_")?;
    judge(&o, SUCCESS_CODE).map_err(|e| format!("x86 kernel benchmarks ({}): {e}", used.name()))?;
    Ok((o.lines, used.name()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cmdline_passes_seed_threshold_and_extra_words() {
        let opts = QemuOpts {
            arch: "x86".into(),
            seed: Some(42),
            threshold_mb: Some(16),
            no_kvm: false,
        };
        assert_eq!(
            append(&opts, "la57 nobench"),
            "la57 nobench seed=42 threshold_mb=16"
        );
        let none = QemuOpts {
            seed: None,
            threshold_mb: None,
            ..opts
        };
        assert_eq!(append(&none, ""), "");
    }

    #[test]
    fn a_skipped_required_case_fails_the_run() {
        let lines = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let mut ok: Vec<String> = ALWAYS.iter().map(|c| format!("ok {c}")).collect();
        ok.push(format!("{} passed, 0 failed", ALWAYS.len()));
        assert!(passed_cases(&ok, ALWAYS).is_ok());
        let failed = lines(&[
            "ok protect_execute_never",
            "FAIL space_kernel_text_write_faults: store to 0xffffffff80109000 succeeded",
        ]);
        let e = passed_cases(&failed, ALWAYS).unwrap_err();
        assert!(e.contains("space_kernel_text_write_faults"), "{e}");
        assert!(!e.contains("protect_execute_never"), "{e}");
        let skipped = lines(&[
            "skip protect_execute_never: the machine cannot test instruction fetches",
            "0 passed, 0 failed",
        ]);
        assert_eq!(
            passed_cases(&skipped, &ALWAYS[..1]),
            Err("no `ok` line for protect_execute_never".into())
        );
        assert!(passed_cases(&ok, ABOVE_2_47).is_err());
        assert!(passed_one_of(&ok, ISOLATION).is_err());
        let by_cr3 = lines(&["ok space_isolation_by_cr3"]);
        assert!(passed_one_of(&by_cr3, ISOLATION).is_ok());
        let failed = lines(&["FAIL space_isolation_by_pcid: space 1 (round 0): load from 0x3000000000 read 0x5ace00000000"]);
        assert_eq!(
            passed_one_of(&failed, ISOLATION),
            Err("no `ok` line for any of space_isolation_by_pcid, space_isolation_by_cr3".into())
        );
    }

    #[test]
    fn a_run_without_every_cpu_or_an_smp_case_fails() {
        let mut ok: Vec<String> = SMP_CASES.iter().map(|c| format!("ok {c}")).collect();
        ok.insert(0, "smp: 4 CPUs online".into());
        assert!(smp_passed(&ok).is_ok());
        let mut one_cpu = ok.clone();
        one_cpu[0] = "smp: 1 CPUs online".into();
        assert_eq!(
            smp_passed(&one_cpu),
            Err("no `smp: 4 CPUs online` line".into())
        );
        let mut failed = ok.clone();
        failed[1] = "FAIL smp_unmap_faults_everywhere: CPU 1: 3 probes saw the old state".into();
        let e = smp_passed(&failed).unwrap_err();
        assert!(e.contains("smp_unmap_faults_everywhere"), "{e}");
    }

    #[test]
    fn no_kvm_forces_tcg_with_the_max_cpu() {
        assert_eq!(pick_accel(true), Accel::Tcg);
        assert_eq!(Accel::Tcg.qemu_args(), ["-accel", "tcg", "-cpu", "max"]);
        assert_eq!(Accel::Kvm.qemu_args()[1], "kvm");
    }
}
