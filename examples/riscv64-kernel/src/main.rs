//! The RISC-V tiny kernel of pgtable.
//!
//! QEMU `virt` starts OpenSBI (`-bios default`), which enters the kernel
//! at `_start` ([`trap`]) in S-mode on one hart with translation off. The
//! kernel prints through the SBI console ([`sbi`]), reads the RAM and the
//! command line from the device tree ([`fdt`]), starts the other three
//! harts through SBI HSM ([`smp`]), builds its address space with
//! pgtable-riscv in the format the command line names (Sv39, Sv48 or
//! Sv57: all RAM at its physical address, [`mem`]) and switches `satp` to
//! it. On it, it runs its own `space_` cases ([`space`]: U-mode round
//! trip, SUM, ASIDs), the `smp_` cases ([`smp_cases`]: a space live on
//! every hart, shot down through SBI RFENCE), stops the other harts, and
//! runs the conformance suite ([`machine`]). It leaves through SBI SRST:
//! shutdown with no reason when everything passed, "system failure"
//! otherwise.
//!
//! Where the device tree lists Svnapot, the `contpte_napot_` cases
//! ([`contpte`]) map 64 KiB NAPOT runs in a space of the Svnapot format
//! and change, store to, move and unmap them on the live hart. The `mm_`
//! cases ([`mm`]) replace PTEs in place with `replace_pte`: a whole PTE
//! table swapped out and in while the table allocator refuses every frame,
//! and a copy-on-write page replaced by its copy.
//!
//! Command line (`-append`): `[mode=sv39|sv48|sv57] [seed=N]
//! [threshold_mb=M] [big] [only=prefix,..] [skip=prefix,..] [verbose]
//! [noshootdown]` (`big`: the suite's 1 GiB and 2 GiB moves;
//! `noshootdown`: no remote fences, to see the `smp_` cases fail).
#![no_std]
#![no_main]

mod cases;
mod contpte;
mod fdt;
mod machine;
mod mem;
mod mm;
mod sbi;
mod smp;
mod smp_cases;
mod space;
mod trap;

use core::cell::UnsafeCell;

use pgtable_core::contract::Format;
use pgtable_core::suite::{self, Config};
use pgtable_core::PhysAddr;
use pgtable_riscv::{probe_asid_bits, Asid, RiscvMmu, RiscvPaging};

use crate::cases::Counts;
use crate::machine::KernelMachine;
use crate::mem::{kernel_space, Frames, POOL_START};

/// Options from the command line.
#[derive(Clone, Copy, Debug)]
struct Options {
    /// Paging levels: 3 (Sv39), 4 (Sv48), 5 (Sv57).
    levels: u32,
    seed: u64,
    threshold_mb: u64,
    big: bool,
    verbose: bool,
    only: &'static [&'static str],
    skip: &'static [&'static str],
}

/// Static storage for what the boot hart parses once: the command line
/// (copied out of the device tree, which the suite's pool may overwrite)
/// and the `only=` / `skip=` lists.
struct Boot {
    line: [u8; 256],
    only: [&'static str; 8],
    skip: [&'static str; 8],
}

struct BootCell(UnsafeCell<Boot>);

// SAFETY: written once by the boot hart before any other hart starts,
// only read afterwards.
unsafe impl Sync for BootCell {}

static BOOT: BootCell = BootCell(UnsafeCell::new(Boot {
    line: [0; 256],
    only: [""; 8],
    skip: [""; 8],
}));

fn split_list(v: &'static str, dst: &'static mut [&'static str; 8]) -> &'static [&'static str] {
    let mut n = 0;
    for p in v.split(',').filter(|p| !p.is_empty()) {
        if n < dst.len() {
            dst[n] = p;
            n += 1;
        }
    }
    &dst[..n]
}

fn parse_u64(s: &str) -> Option<u64> {
    match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

/// Copies `args` into [`BOOT`] and parses it.
///
/// # Safety
///
/// Called once, on the boot hart, before any other hart starts.
unsafe fn parse_cmdline(args: &str) -> (&'static str, Options) {
    // SAFETY: the only access, once (our caller's promise); afterwards
    // everything is only read through the returned references.
    let boot: &'static mut Boot = unsafe { &mut *BOOT.0.get() };
    let n = args.len().min(boot.line.len());
    boot.line[..n].copy_from_slice(&args.as_bytes()[..n]);
    let line: &'static str = core::str::from_utf8(&boot.line[..n]).unwrap_or("");
    let mut o = Options {
        levels: 3,
        seed: 0x5eed_1234,
        threshold_mb: 4,
        big: false,
        verbose: false,
        only: &[],
        skip: &[],
    };
    let (mut only, mut skip) = ("", "");
    for word in line.split_ascii_whitespace() {
        match word.split_once('=') {
            Some(("mode", "sv39")) => o.levels = 3,
            Some(("mode", "sv48")) => o.levels = 4,
            Some(("mode", "sv57")) => o.levels = 5,
            Some(("seed", v)) => o.seed = parse_u64(v).unwrap_or(o.seed),
            Some(("threshold_mb", v)) => o.threshold_mb = parse_u64(v).unwrap_or(o.threshold_mb),
            Some(("only", v)) => only = v,
            Some(("skip", v)) => skip = v,
            None if word == "big" => o.big = true,
            None if word == "verbose" => o.verbose = true,
            None if word == "noshootdown" => smp::disable_shootdown(),
            _ => println!("ignoring unknown option {word}"),
        }
    }
    o.only = split_list(only, &mut boot.only);
    o.skip = split_list(skip, &mut boot.skip);
    (line, o)
}

/// The boot hart's Rust entry (trap.rs `_start`), with the hart ID and
/// the device tree's physical address.
#[no_mangle]
extern "C" fn kmain(hart: u64, dtb: u64) -> ! {
    let (console, exts) = sbi::init();
    let (major, minor) = sbi::spec_version();
    println!(
        "riscv64-kernel: booted on hart {hart} (S-mode, SBI {major}.{minor}, console: {console})"
    );
    for (name, present) in exts {
        if !present {
            println!("FAIL setup: the SBI firmware lacks the {name} extension");
            println!("0 passed, 1 failed");
            sbi::shutdown(false);
        }
    }
    // SAFETY: OpenSBI passes the device tree's address in a1; QEMU placed
    // it in RAM, which nothing has written yet.
    let Some(info) = (unsafe { fdt::read(dtb) }) else {
        println!("FAIL setup: no device tree at {dtb:#x}");
        println!("0 passed, 1 failed");
        sbi::shutdown(false)
    };
    // SAFETY: once, on the boot hart, before the others start.
    let (line, opts) = unsafe { parse_cmdline(info.bootargs) };
    println!("cmdline: \"{line}\" -> {opts:?}");
    let svinval = info.has_extension("svinval");
    let svpbmt = info.has_extension("svpbmt");
    let svnapot = info.has_extension("svnapot");
    println!(
        "isa: {} (Svinval {}, Svpbmt {}, Svnapot {})",
        info.isa, svinval, svpbmt, svnapot
    );
    let ram = info.ram;
    println!(
        "ram: {:#x}..{:#x} ({} MiB)",
        ram.0,
        ram.0 + ram.1,
        ram.1 >> 20
    );
    if ram.0 > POOL_START || ram.0 + ram.1 < POOL_START + (64 << 20) {
        println!("FAIL setup: RAM must cover {POOL_START:#x} and 64 MiB above it");
        println!("0 passed, 1 failed");
        sbi::shutdown(false);
    }
    if trap::harts_at_start() > 1 {
        println!(
            "boot: {} harts entered _start; all but this one were stopped (hart lottery)",
            trap::harts_at_start()
        );
    }
    match smp::bring_up() {
        Ok(mask) => println!(
            "smp: {} CPUs online (harts {mask:#x}, started with SBI HSM)",
            mask.count_ones()
        ),
        Err((h, e)) => println!("smp: sbi_hart_start of hart {h} failed: {e:?}"),
    }
    let ext = Extensions {
        svinval,
        svpbmt,
        svnapot,
    };
    let ok = match opts.levels {
        3 => run_on::<3>(ram, &opts, ext),
        4 => run_on::<4>(ram, &opts, ext),
        _ => run_on::<5>(ram, &opts, ext),
    };
    sbi::shutdown(ok)
}

/// The optional extensions the device tree lists for the harts (QEMU
/// gives every hart the same `-cpu`).
#[derive(Clone, Copy, Debug)]
struct Extensions {
    svinval: bool,
    svpbmt: bool,
    svnapot: bool,
}

/// Builds the kernel's space in `RiscvPaging<L>`, switches to it and runs
/// every case on it; true when all passed. With Svinval (every hart
/// has it: one `-cpu` for all) the kernel's range flushes, the suite's
/// included, use the Svinval sequence.
fn run_on<const L: u32>(ram: (u64, u64), opts: &Options, ext: Extensions) -> bool {
    let svinval = ext.svinval;
    let mut mmu = RiscvMmu::new::<L, 0>();
    if svinval {
        // SAFETY: the device tree lists Svinval for the harts (QEMU gives
        // every hart the same `-cpu`), and only this hart runs the
        // kernel's space's flushes.
        mmu = unsafe { mmu.with_svinval() };
    }
    let mut k = match kernel_space::<RiscvPaging<L>, _>(ram, mmu) {
        Ok(k) => k,
        Err(e) => {
            println!("FAIL setup: cannot build the kernel's tables: {e}");
            println!("0 passed, 1 failed");
            return false;
        }
    };
    // SAFETY: the tables map all RAM at its physical address: the image,
    // the stacks, the table frames, everything the kernel touches. They
    // live until the machine shuts down (`into_parts` below).
    unsafe { k.install() };
    // SAFETY: translation is on, and the kernel's space maps everything
    // with global mappings, so the probe's moment under another ASID
    // translates the same way.
    let asid_bits = unsafe { probe_asid_bits() };
    println!(
        "paging: {} (satp.MODE {}), root {:#x}, {} tables, ASIDLEN {asid_bits}",
        <RiscvPaging<L> as Format>::NAME,
        RiscvPaging::<L>::SATP_MODE,
        k.root().0,
        k.inspect().count_tables()
    );
    println!(
        "range flushes: {}",
        if svinval {
            "Svinval (SFENCE.W.INVAL, SINVAL.VMA per stride, SFENCE.INVAL.IR)"
        } else {
            "SFENCE.VMA per stride"
        }
    );
    let own = space::run::<L>(&mut k, ram, asid_bits)
        .add(space::svpbmt::<L>(&mut k, ram, ext.svpbmt))
        .add(contpte::run::<L>(&mut k, ram, ext.svnapot))
        .add(mm::run::<L>(&mut k));
    println!();
    let smp_asid = Asid::new(3, asid_bits).ok();
    let smp = smp_cases::run::<L>(ram, smp_asid).add(smp_cases::stop_others());
    println!();
    let end = ram.0 + ram.1;
    let mut mach = KernelMachine {
        ram: (PhysAddr(POOL_START), end - POOL_START),
        exec_page: None,
    };
    // Struct update on purpose: fields the suite adds later keep their
    // defaults.
    #[allow(clippy::needless_update)]
    let cfg = Config {
        seed: opts.seed,
        threshold_bytes: opts.threshold_mb << 20,
        big_moves: opts.big,
        verbose: opts.verbose,
        only: opts.only,
        skip: opts.skip,
        ..Config::DEFAULT
    };
    let start = machine::now();
    let sum = suite::run(&mut k, &mut mach, &cfg);
    println!(
        "suite took {} ms (emulated)",
        (machine::now() - start) / (machine::TIMEBASE_HZ / 1000)
    );
    let live = Frames.live();
    let held = k.inspect().count_tables() as u64;
    let frames_ok = live == held;
    println!(
        "table frames: {live} allocated, {held} in the kernel's tables, peak {}{}",
        Frames.peak(),
        if frames_ok { "" } else { " -- LEAKED FRAMES" }
    );
    if sum.passed == 0 {
        println!("FAIL suite: no case ran");
    }
    let total = Counts {
        passed: sum.passed,
        failed: sum.failed + u32::from(!frames_ok) + u32::from(sum.passed == 0),
    }
    .add(own)
    .add(smp);
    println!();
    println!(
        "{}: {} passed, {} failed",
        <RiscvPaging<L> as Format>::NAME,
        total.passed,
        total.failed
    );
    // The live space is never torn down: the hart walks its tables until
    // the machine shuts down.
    let _kept = k.into_parts();
    total.failed == 0
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo) -> ! {
    println!("PANIC: {info}");
    sbi::shutdown(false)
}
