//! A tiny arm64 kernel for QEMU `virt` that runs pgtable's conformance
//! suite on the real (emulated) MMU, then the arm64 benchmarks.
//!
//! It is split like Linux: two halves (48-bit, T0SZ = T1SZ = 16, or
//! 52-bit, T0SZ = T1SZ = 12), each with its own root. Every address space
//! has the geometry of the build ([`geom`]: 4, 16 or 64 KiB pages, 48- or
//! 52-bit VAs, chosen by Cargo features; `cargo xtask qemu-test` builds
//! and runs all six). The kernel lives in the upper half, translated through
//! TTBR1_EL1 by a kernel space built with pgtable (`new_kernel`: a W^X map
//! of the image, a linear map of all RAM at `PAGE_OFFSET`, the UART); the
//! lower half (TTBR0_EL1) holds the suite's test space and, for the EL0
//! and ASID cases, user spaces (`new_user`) switched by ASID. After boot
//! no identity map is left.
//!
//! Boot sequence (details in `boot.rs`):
//! 1. `_start`, at its physical address with the MMU off: EL2→EL1, FP on,
//!    early tables (4 KiB granule in every build: an identity map of the
//!    first GiB of RAM in TTBR0_EL1; the linear map, the image and the UART
//!    in TTBR1_EL1), MMU on, jump to the upper half;
//! 2. `pgk_kernel_entry`: stack, `.bss`, vectors, `kernel_main`;
//! 3. `kernel_main`: RAM from the device tree (through the linear map),
//!    the kernel map built with pgtable ([`kmap`]), the CPU checked for
//!    the geometry (`check_geometry`), TTBR1_EL1 switched to the kernel
//!    map from the identity map together with TCR_EL1's TTBR1 fields
//!    (granule, T1SZ), then TCR_EL1's TTBR0 fields and the empty test
//!    space installed in TTBR0_EL1 (the identity map is gone);
//! 4. SMP ([`smp`], [`smp_cases`]): every CPU QEMU gives is started
//!    through PSCI (`smp: <N> CPUs online`), the `smp_` cases check that
//!    every CPU sees a change once pgtable returns, the shootdown
//!    benchmark runs, and the secondaries are turned off again;
//! 5. the `space_` cases ([`space`], [`space_mm`]): W^X of the kernel map,
//!    EL0 isolation, user spaces switched by ASID, judged by the MMU;
//! 6. the `contpte_` cases ([`contpte`]): contiguous runs of the linear
//!    map and of the test space, partial changes of runs, moves and the
//!    accessed/dirty state gathered over a run;
//! 7. the suite on the test space (every case but those at the end of
//!    the upper half), then the upper-half cases on the live kernel space;
//! 8. the benchmarks, on the test space and on spaces of their own that
//!    take TTBR0_EL1 in turn.
//!
//! Orientation:
//! - `boot.rs`: entry, EL2→EL1, early tables, MMU on, the TTBR1 switch,
//!   exception vectors, the EL0 entry and return, probes;
//! - `console.rs`, `semihost.rs`, `timer.rs`: PL011 output, exit codes and
//!   the command line through semihosting, the cycle counter;
//! - `probe.rs`: loads, stores and fetches that return faults as values;
//! - `fdt.rs`: the RAM size from the device tree QEMU puts at 0x4000_0000;
//! - `geom.rs`: the build's geometry (format, page, block and run sizes);
//! - `memory.rs`: the virtual and physical layout, the table allocator;
//! - `kmap.rs`: the kernel's own address space, built with pgtable;
//! - `user.rs`: a user space, the user program, running it at EL0;
//! - `space.rs`: the `space_` cases of the kernel map and of EL0;
//! - `asids.rs`: switching user spaces by ASID;
//! - `contpte.rs`: the `contpte_` cases of contiguous mappings (the
//!   contiguous hint) and the count of the linear map's folded runs;
//! - `space_mm/`: the `space_` cases of user spaces switched by ASID
//!   (isolation, stale translations, roll-over, fork, swap entries, live
//!   kernel protection) and the table of switches and flushes;
//! - `psci.rs`: PSCI calls, the conduit and the CPUs from the device tree;
//! - `smp.rs`: secondary bring-up, per-CPU stacks and records, the
//!   command loop;
//! - `smp_cases/`: the `smp_` cases, the secondaries' access loop and the
//!   shootdown benchmark;
//! - `platform.rs`: the names used from `pgtable-arm64`, the MMU handle
//!   that counts its TLB flushes;
//! - `machine.rs`: the suite's `Machine` on this hardware;
//! - `bench.rs`: the benchmark tables.
//!
//! Options come from the kernel command line (`-append "seed=N
//! threshold_mb=M nobench"`; `nobench` leaves the benchmarks out, as
//! xtask does for every geometry but the default 4K/48), read through semihosting `SYS_GET_CMDLINE`, which
//! QEMU answers with the kernel file name followed by the `-append` text:
//! simpler than reading `/chosen/bootargs` from the device tree.
//!
//! The run ends through semihosting with exit code 33 when every suite,
//! `space_`, `smp_` and `contpte_` case passed and 35 otherwise (also on
//! any unexpected exception or panic).
#![no_std]
#![no_main]

mod asids;
mod bench;
mod boot;
mod console;
mod contpte;
mod fdt;
mod geom;
mod kmap;
mod machine;
mod memory;
mod platform;
mod probe;
mod psci;
mod quickstart;
mod semihost;
mod smp;
mod smp_cases;
mod space;
mod space_mm;
mod timer;
mod user;

use core::fmt;
use core::panic::PanicInfo;

use pgtable_core::suite::{self, Config};
use pgtable_core::VaRange;

use crate::kmap::KernelSpace;

/// Options from the kernel command line (`-append "seed=N threshold_mb=M nobench"`).
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Seed of the suite's fill pattern.
    pub seed: u64,
    /// MiB of each moved range the suite validates.
    pub threshold_mb: u64,
    /// Leave the benchmarks out.
    pub nobench: bool,
}

impl Options {
    fn parse(line: &str) -> Options {
        let mut o = Options {
            seed: 0x5eed_2026,
            threshold_mb: 4,
            nobench: false,
        };
        for word in line.split_ascii_whitespace() {
            if word == "nobench" {
                o.nobench = true;
                continue;
            }
            let Some((key, value)) = word.split_once('=') else {
                continue;
            };
            let Some(n) = parse_u64(value) else {
                println!("cmdline: ignoring {word}");
                continue;
            };
            match key {
                "seed" => o.seed = n,
                "threshold_mb" => o.threshold_mb = n,
                _ => {}
            }
        }
        o
    }
}

fn parse_u64(s: &str) -> Option<u64> {
    match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

/// The TCR_EL1 values of the switch from the early map to pgtable's
/// tables: `early` (the boot code's, checked), `mid` (TTBR1 walks in the
/// build's geometry, TTBR0 walks still the early map's) and `last`.
struct Tcrs {
    mid: u64,
    last: u64,
}

/// Checks that the CPU implements the build's geometry (granule, 52-bit
/// VA and PA: [`pgtable_arm64::check_geometry`]), and that TCR_EL1 (set
/// by the boot code from [`boot::EARLY_TCR`]) is pgtable's 4 KiB value
/// for this CPU (T0SZ = T1SZ = 16, DS as the geometry needs) without the
/// hardware access-flag and dirty-state bits and with 8-bit ASIDs. Gives
/// pgtable's value for the geometry (HA and HD on where the CPU has them,
/// TCR_EL1.AS for 16-bit ASIDs where it has those, as
/// `enable_mmu_separate_halves` would) and the value between the two
/// switches. Only ASID 0 has been used so far.
fn tcrs() -> Result<Tcrs, fmt::Arguments<'static>> {
    use aarch64_cpu::registers::{ID_AA64MMFR0_EL1, ID_AA64MMFR1_EL1, ID_AA64MMFR2_EL1, TCR_EL1};
    use pgtable_arm64::granule::{check_geometry, Granule};
    use pgtable_arm64::regs::{tcr_value_for_separate_halves, TcrGeometry};
    use pgtable_arm64::{AsidBits, TcrConfig};
    use tock_registers::interfaces::Readable;

    let mmfr0 = ID_AA64MMFR0_EL1.get();
    let mmfr2 = ID_AA64MMFR2_EL1.get();
    let pa_bits = if geom::VA_BITS == 52 { 52 } else { 48 };
    if let Err(e) = check_geometry(geom::GRANULE, geom::VA_BITS, pa_bits, mmfr0, mmfr2) {
        println!("FAIL: {} geometry unsupported by this CPU: {e}", geom::NAME);
        return Err(format_args!("FAIL: the CPU lacks the build's geometry"));
    }
    let hafdbs = ID_AA64MMFR1_EL1.get() & 0xf;
    let cfg = TcrConfig {
        va_bits: geom::VA_BITS,
        ttbr1: true,
        pa_range: mmfr0 & 0xf,
        hw_access_flag: hafdbs >= 1,
        hw_dirty: hafdbs >= 2,
        asid16: AsidBits::from_mmfr0(mmfr0) == AsidBits::Bits16,
    };
    let last = tcr_value_for_separate_halves(TcrGeometry {
        cfg,
        granule: geom::GRANULE,
        ds: geom::DS,
    });
    let early = tcr_value_for_separate_halves(TcrGeometry {
        cfg: TcrConfig {
            va_bits: 48,
            hw_access_flag: false,
            hw_dirty: false,
            asid16: false,
            ..cfg
        },
        granule: Granule::K4,
        ds: geom::DS,
    });
    let (Ok(last), Ok(early)) = (last, early) else {
        return Err(format_args!("FAIL: no TCR_EL1 value for the geometry"));
    };
    let now = TCR_EL1.get();
    if now != early || early & !(0b111 << 32) != boot::EARLY_TCR {
        println!(
            "FAIL: the boot code's TCR_EL1 {now:#x} is not pgtable's {early:#x} (without HA/HD)"
        );
        return Err(format_args!("FAIL: early TCR_EL1"));
    }
    let t0 = boot::TCR_TTBR0_FIELDS;
    Ok(Tcrs {
        mid: (last & !t0) | (early & t0),
        last,
    })
}

/// The Rust entry point, called by `pgk_kernel_entry` on the boot core at
/// EL1, in the upper half, on the early map (see boot.rs).
#[no_mangle]
extern "C" fn kernel_main() -> ! {
    println!(
        "pgtable arm64 kernel: booted at EL1, running in the upper half at {:#x} (early map)",
        kernel_main as *const () as usize
    );
    let mut buf = [0u8; 256];
    let line = semihost::cmdline(&mut buf)
        .and_then(|n| core::str::from_utf8(&buf[..n]).ok())
        .unwrap_or("");
    let opts = Options::parse(line);
    if boot::linked_kimage_offset() != memory::KIMAGE_OFFSET {
        fail(format_args!(
            "FAIL: link.ld's KIMAGE_OFFSET {:#x} is not memory::KIMAGE_OFFSET {:#x}",
            boot::linked_kimage_offset(),
            memory::KIMAGE_OFFSET
        ));
    }
    let img = kmap::Image::get();
    // SAFETY: QEMU virt puts the device tree at the base of RAM, below the
    // kernel image, in the first GiB of RAM that the early linear map
    // covers; it is only read.
    let fdt = unsafe { fdt::Fdt::at(memory::phys_to_virt(memory::RAM_BASE)) };
    let Some((ram_base, ram_size)) = fdt.and_then(|f| f.memory()) else {
        fail(format_args!(
            "FAIL: no device tree with a /memory node at the base of RAM"
        ));
    };
    let Some(layout) = memory::Layout::new(ram_base, ram_size, (img.start_pa, img.end_pa())) else {
        fail(format_args!("FAIL: RAM too small for the table pool"));
    };
    println!(
        "RAM {:#x}..{:#x}, kernel {:#x}..{:#x}, tables {:#x}..{:#x}, pool {:#x}..{:#x}",
        layout.ram.0,
        layout.ram.1,
        layout.kernel.0,
        layout.kernel.1,
        layout.tables.0,
        layout.tables.1,
        layout.pool.0,
        layout.pool.1
    );
    // The early map reaches the first GiB of RAM only (boot.rs).
    if layout.tables.1 > memory::RAM_BASE + (1 << 30) {
        fail(format_args!(
            "FAIL: the table pool ends beyond the early map's first GiB of RAM"
        ));
    }
    // SAFETY: once, before any allocation; `Layout` puts the table pool in
    // RAM after the kernel image, 4 KiB aligned, in the first GiB (checked
    // above), and gives it to nothing else.
    unsafe { memory::init_tables(layout.tables.0, layout.tables.1) };

    let mut kspace =
        kmap::build(&layout, &img).unwrap_or_else(|e| fail(format_args!("FAIL: kernel map: {e}")));
    // The secondaries' stack guard pages (smp.rs), before the map is live.
    smp::unmap_stack_guards(&mut kspace)
        .unwrap_or_else(|e| fail(format_args!("FAIL: smp stack guards: {e}")));
    let tcrs = tcrs().unwrap_or_else(|e| fail(e));
    let tcr = tcrs.last;
    // SAFETY: TTBR0_EL1 holds the early identity map, whose TCR_EL1
    // fields `mid` keeps; the kernel map is of the geometry `mid` gives
    // TTBR1_EL1, maps the image (code, data, stack) at the addresses the
    // early map did, the UART, and the linear map of all RAM (the tables,
    // the device tree), and lives until the run exits (this function
    // never returns).
    unsafe { boot::switch_ttbr1(kspace.root().0, tcrs.mid) };
    // SAFETY: the same root again (no translation changes): this marks the
    // space active, so it is never freed under the MMU.
    unsafe { kspace.install() };
    // The suite's test space replaces the early identity map in TTBR0_EL1.
    // It is a lower-half space (TTBR0_EL1 translates `[0, 2^48)`) without
    // the user table attributes: the suite executes its pages at EL1.
    let mut test = KernelSpace::new_in(VaRange::Lower, platform::lower_mmu(), memory::KernelTables)
        .unwrap_or_else(|e| fail(format_args!("FAIL: test space: {e}")));
    // SAFETY: the kernel uses nothing in the lower half any more, and
    // `last` differs from `mid` (TCR_EL1 now) in the TTBR0 fields only.
    unsafe { boot::switch_ttbr0_tcr(tcrs.last) };
    // SAFETY: the test space is empty, of the geometry TCR_EL1 now gives
    // TTBR0_EL1.
    unsafe { test.install() };
    println!(
        "MMU on ({}): TTBR1_EL1={:#x} (kernel space, {:?}, T1SZ {}) TTBR0_EL1={:#x} (test space, T0SZ {}) TCR_EL1={tcr:#x}",
        geom::NAME,
        kspace.root().0,
        kspace.va_range(),
        pgtable_arm64::regs::tcr_t1sz(tcr),
        test.root().0,
        pgtable_arm64::regs::tcr_t0sz(tcr)
    );
    // The MMU now translates through the kernel map: the UART must be
    // where the map says.
    if probe::translate(console::UART_VA) != Some(console::UART_BASE) {
        fail(format_args!(
            "FAIL: the UART does not translate through the kernel map"
        ));
    }
    // The kernel half as Linux's /sys/kernel/debug/kernel_page_tables shows it.
    let va = pgtable_core::VirtAddr;
    let regions = [
        (va(memory::PAGE_OFFSET), "Linear Mapping"),
        (va(memory::KIMAGE_OFFSET), "Kernel Image"),
        (va(memory::DEVICE_OFFSET), "Devices"),
    ];
    print!(
        "ptdump of the kernel space (TTBR1_EL1):\n{}",
        kspace.ptdump().markers(&regions)
    );

    // SMP (smp.rs, smp_cases/): every CPU QEMU gives comes up, the
    // `smp_` cases and the shootdown benchmark run, then the secondaries
    // are turned off for the rest of the run.
    let (smp_passed, smp_failed) = smp_cases::phase(layout.pool, test.root());

    let mut tally = space::Tally::default();
    space::kernel_cases(&mut tally, &img);
    space::user_cases(&mut tally, &kspace, &mut test, layout.pool.0);
    space_mm::cases(&mut tally, &mut kspace, &mut test, &img, layout.pool);
    let mut cont = space::Tally::default();
    contpte::cases(&mut cont, &kspace, &mut test, layout.pool);

    let cfg = Config {
        seed: opts.seed,
        threshold_bytes: opts.threshold_mb << 20,
        big_moves: true,
        ..Config::DEFAULT
    };
    let mut mach = machine::KernelMachine {
        pool: layout.pool,
        window: machine::WINDOW,
        accesses: 0,
        faults: 0,
    };
    let (live_before, _) = memory::tables_live();
    let t0 = timer::ticks();
    // The test space (TTBR0_EL1) takes every case but those of the upper
    // half, which the kernel's space (TTBR1_EL1) takes: the upper half is
    // the kernel's.
    const UPPER: &[&str] = &["last_entries_of_the_upper_half"];
    let low = suite::run(&mut test, &mut mach, &Config { skip: UPPER, ..cfg });
    mach.window = machine::KERNEL_SPACE_WINDOW;
    let high = suite::run(&mut kspace, &mut mach, &Config { only: UPPER, ..cfg });
    let t = timer::ticks() - t0;
    let (live, peak) = memory::tables_live();
    println!(
        "suite on the emulated MMU: {} probe accesses, {} faults caught, {} EMULATED ticks; table frames live {live} (before {live_before}), peak {peak}",
        mach.accesses, mach.faults, t
    );
    let passed = low.passed + high.passed + tally.passed + smp_passed + cont.passed;
    let mut failed = low.failed + high.failed + tally.failed + smp_failed + cont.failed;
    if live != live_before {
        println!(
            "FAIL suite_frees_its_tables: {live_before} table frames live before, {live} after"
        );
        failed += 1;
    }
    if high.passed == 0 {
        println!("FAIL suite_upper_half: no case ran on the kernel's space");
        failed += 1;
    }
    if opts.nobench {
        println!("benchmarks: not run (nobench)");
    } else if let Err(e) = bench::run(&mut test, layout.pool) {
        println!("FAIL benchmarks: {e}");
        failed += 1;
    }
    // The judge reads the last summary line: the total of the suite's two
    // runs and the space cases.
    println!();
    println!(
        "space cases: {} passed, {} failed; suite: {} + {} passed, {} + {} failed",
        tally.passed, tally.failed, low.passed, high.passed, low.failed, high.failed
    );
    println!("smp cases: {smp_passed} passed, {smp_failed} failed");
    println!(
        "contpte cases: {} passed, {} failed",
        cont.passed, cont.failed
    );
    println!("{passed} passed, {failed} failed");
    if failed == 0 && passed > 0 {
        semihost::exit(semihost::EXIT_SUCCESS)
    } else {
        semihost::exit(semihost::EXIT_FAILURE)
    }
}

/// Ends the run as failed: prints `why` and a summary line counting one
/// failure.
fn fail(why: fmt::Arguments) -> ! {
    println!("{why}");
    println!("0 passed, 1 failed");
    semihost::exit(semihost::EXIT_FAILURE)
}

/// Called by the vectors for every exception that is not a probe fault.
#[no_mangle]
extern "C" fn unexpected_exception(vector: u64, esr: u64, far: u64, elr: u64) -> ! {
    fail(format_args!(
        "UNEXPECTED EXCEPTION: vector {vector} ESR_EL1={esr:#x} (EC {:#x}) FAR_EL1={far:#x} ELR_EL1={elr:#x}",
        esr >> 26
    ))
}

#[panic_handler]
fn panic(info: &PanicInfo) -> ! {
    fail(format_args!("PANIC: {info}"))
}
