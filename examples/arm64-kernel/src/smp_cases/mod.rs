//! The `smp_` cases: every CPU sees a change once the pgtable operation
//! that made it returns, judged by the MMU of each CPU while it hammers
//! the range; then the shootdown benchmark.
//!
//! A *round*: CPU 0 clears the secondaries' counters, starts their access
//! loop ([`hammer()`]) over the range, waits until each did a few accesses
//! (so its TLB holds the translations), runs the operation through
//! pgtable, then publishes a new *epoch* (release store). A secondary
//! loads the epoch (acquire) before each access and files the access
//! under "after" once it sees it: every access filed "after" started
//! after the operation returned, so it must see the change. CPU 0 waits
//! until each did enough accesses after the epoch and stops the loops.
//!
//! Loop modes (`args[0]` of the command):
//! - [`READ`](hammer::READ): loads from page `i % pages` of A; a loaded value must be
//!   the page's marker;
//! - [`PAIR`](hammer::PAIR): the same at A and at B;
//! - [`WRITE_RACE`](hammer::WRITE_RACE): secondary `c` stores a rising count to word `c` of
//!   page `c - 1`, through A, or through B if A faults; it remembers the
//!   last store that succeeded;
//! - [`WRITE_PAGES`](hammer::WRITE_PAGES): stores to word `c` of page `i % pages` of A,
//!   remembering which pages took a store;
//! - [`ANY`](hammer::ANY): loads from A, any outcome (the benchmark's load).
//!
//! Every case prints `ok <name>` or `FAIL <name>: <why>`; the table after
//! them gives, per operation, the TLB maintenance pgtable issued (its
//! stats) and which CPUs observed the change.

mod bench;
mod cases;
mod hammer;

use core::sync::atomic::Ordering::{Relaxed, Release};

use crate::platform::Arm64;
use aarch64_cpu::registers::ID_AA64MMFR1_EL1;
use pgtable_core::contract::{level, Mmu};
use pgtable_core::{AddressSpace, MapOptions, PhysAddr, Prot, VirtAddr};
use tock_registers::interfaces::Readable;

pub use hammer::hammer;

use crate::geom::PAGE;
use crate::memory::{phys_to_virt, KernelTables};
use crate::probe::{self, is_permission_fault, is_translation_fault};
use crate::smp::{wait_for, Op, Smp, CMD, CPUS, FAULT, OK, WRONG};
use crate::{println, timer};

/// Where the cases map, in the lower half (away from the suite's window
/// and the benchmarks').
const WINDOW: u64 = 0xc0_0000_0000;
/// The distance between the cases' places: at least 32 GiB and at least
/// one entry of the level above the PMD (a PUD entry; with 64 KiB pages,
/// whose third level is the root, a root entry), so each place has tables
/// of its own below that level. 32 GiB with 4 KiB pages, 64 GiB with
/// 16 KiB, 4 TiB with 64 KiB.
const STEP: u64 = {
    let pud = level::size::<Arm64>(2);
    if pud > 32 << 30 {
        pud
    } else {
        32 << 30
    }
};
/// The destination of the moves: [`STEP`] higher, under another PUD
/// entry (so the move links the tables it needs there).
const MOVED: u64 = WINDOW + STEP;
/// A third place, where a new mapping takes the table frames an unmap
/// freed.
const REUSE: u64 = WINDOW + 2 * STEP;
/// The pool frames the cases use (frame `i` is `PAGE` bytes at
/// `pool + i * PAGE`).
const FRAMES: u64 = 64;
/// The alignment of the cases' first pool frame: 2 MiB, a multiple of
/// every granule's page.
const POOL_ALIGN: u64 = 2 << 20;
/// Accesses each secondary makes before the operation, and after the
/// epoch, in a round.
const WARM: u64 = 32;
const AFTER: u64 = 32;
/// The marker of page `p` is `MARK ^ p`.
const MARK: u64 = 0x5350_4d00_0000_0000;

/// A space of the cases: untagged or tagged Arm64Mmu, TTBR0_EL1.
type Space = crate::smp::SmpSpace;

/// A failed case's reason (printed at once, with details before it).
type R = Result<(), &'static str>;

/// What one round observed, for the table.
#[derive(Clone, Copy, Default)]
struct Row {
    name: &'static str,
    ticks: u64,
    flush_range: u64,
    flush_all: u64,
    strides: u64,
    /// Bit per CPU that observed the change.
    observed: u64,
    /// Bit per CPU that took part.
    hammering: u64,
}

/// The state of the cases on CPU 0.
struct Cases<'a> {
    smp: &'a mut Smp,
    /// Secondaries' mask.
    all: u64,
    pool: u64,
    passed: u32,
    failed: u32,
    rows: [Row; 8],
    nrows: usize,
}

fn cpus_of(mask: u64) -> impl Iterator<Item = usize> {
    (1..64).filter(move |c| mask & (1 << c) != 0)
}

/// Writes `v` to word `word` of pool frame `pa` through the linear map.
fn poke(pa: u64, word: u64, v: u64) {
    // SAFETY: pool frames hold no Rust object; the linear map maps them
    // read-write.
    unsafe { ((phys_to_virt(pa) + word * 8) as *mut u64).write_volatile(v) };
}

fn peek(pa: u64, word: u64) -> u64 {
    // SAFETY: as `poke`, a load.
    unsafe { ((phys_to_virt(pa) + word * 8) as *const u64).read_volatile() }
}

impl Cases<'_> {
    fn frame(&self, i: u64) -> u64 {
        self.pool + i * PAGE
    }

    fn case(&mut self, name: &str, f: impl FnOnce(&mut Self) -> R) {
        match f(self) {
            Ok(()) => {
                println!("ok {name}");
                self.passed += 1;
            }
            Err(why) => {
                println!("FAIL {name}: {why}");
                self.failed += 1;
            }
        }
    }

    fn push(&mut self, row: Row) {
        if self.nrows < self.rows.len() {
            self.rows[self.nrows] = row;
            self.nrows += 1;
        }
    }

    /// Maps `pages` pool frames from frame `first` at `va`, each page
    /// marked (word 0 = `MARK ^ p`, the other words 0).
    fn map_marked(
        &self,
        s: &mut AddressSpace<Arm64, impl Mmu, KernelTables>,
        va: u64,
        first: u64,
        pages: u64,
        prot: Prot,
    ) -> R {
        for p in 0..pages {
            for w in 0..8 {
                poke(self.frame(first + p), w, 0);
            }
            poke(self.frame(first + p), 0, MARK ^ p);
        }
        s.map(
            VirtAddr(va),
            PhysAddr(self.frame(first)),
            pages * PAGE,
            prot,
            MapOptions::PAGES,
        )
        .map_err(|_| "map failed")
    }

    /// Points TTBR0_EL1 of the CPUs in `mask` at `ttbr0` (each flushes its
    /// own TLB).
    fn ttbr0(&self, mask: u64, ttbr0: u64) -> R {
        self.smp
            .command(Op::Ttbr0, mask, &[ttbr0], true)
            .map(|_| ())
    }

    /// One round (module docs): the secondaries in `mask` hammer in
    /// `mode`, CPU 0 runs `op`. Returns `op`'s ticks.
    fn round(
        &self,
        mask: u64,
        args: [u64; 4],
        op: impl FnOnce() -> R,
    ) -> Result<u64, &'static str> {
        for c in cpus_of(mask) {
            CPUS[c].reset();
        }
        // Relaxed: only CPU 0 writes the epoch.
        let target = CMD.epoch.load(Relaxed) + 1;
        let [mode, a, b, pages] = args;
        self.smp
            .command(Op::Hammer, mask, &[mode, a, b, pages, MARK, target], false)?;
        // Relaxed: progress only.
        let warm = cpus_of(mask).all(|c| wait_for(10, || CPUS[c].iters[0].load(Relaxed) >= WARM));
        let t0 = timer::ticks();
        let r = if warm {
            op()
        } else {
            Err("a secondary did not start its loop")
        };
        let ticks = timer::ticks() - t0;
        // Release: the operation's table writes and flushes before the
        // epoch (the flushes completed with `dsb ish` already).
        CMD.epoch.store(target, Release);
        let after = cpus_of(mask).all(|c| wait_for(10, || CPUS[c].iters[1].load(Relaxed) >= AFTER));
        self.smp.command(Op::Idle, 0, &[], true)?;
        r?;
        if !after {
            return Err("a secondary made no accesses after the operation");
        }
        Ok(ticks)
    }
}

/// Prints a CPU mask as a list.
struct CpuList(u64);

impl core::fmt::Display for CpuList {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        if self.0 == 0 {
            return f.write_str("none");
        }
        let mut first = true;
        for c in 0..64 {
            if self.0 & (1 << c) != 0 {
                if !first {
                    f.write_str(",")?;
                }
                write!(f, "{c}")?;
                first = false;
            }
        }
        Ok(())
    }
}

/// Snapshot of a space's flush stats into a row.
fn row_of<M: Mmu>(
    name: &'static str,
    s: &AddressSpace<Arm64, M, KernelTables>,
    ticks: u64,
    observed: u64,
    hammering: u64,
) -> Row {
    let st = s.stats();
    Row {
        name,
        ticks,
        flush_range: st.flush_range(),
        flush_all: st.flush_all(),
        strides: st.flush_range_pages(),
        observed,
        hammering,
    }
}

/// Checks that every CPU in `mask` saw side `side` gone after the epoch
/// (faults, a translation fault first, no load or store that succeeded)
/// and used it before (a control). Returns the CPUs that observed it.
fn check_gone(mask: u64, side: usize, what: &str, perm: bool) -> Result<u64, &'static str> {
    let mut seen = 0;
    for c in cpus_of(mask) {
        let r = &CPUS[c];
        let (pre_ok, post_ok, post_fault) = (
            r.count(side, false, OK),
            r.count(side, true, OK),
            r.count(side, true, FAULT),
        );
        // Relaxed: after the acknowledgement (acquire).
        let esr = r.post_esr.load(Relaxed);
        let kind_ok = if perm {
            is_permission_fault(esr)
        } else {
            is_translation_fault(esr)
        };
        if post_ok != 0 || post_fault == 0 || (side == 0 && !kind_ok) {
            println!("  CPU {c}: {what}: {post_ok} accesses succeeded and {post_fault} faulted (first ESR {esr:#x}) after the operation returned");
            return Err("a CPU still used the old translation after the operation returned");
        }
        if pre_ok == 0 {
            println!("  CPU {c}: {what}: no access succeeded before the operation");
            return Err("a CPU never used the mapping before the operation (no control)");
        }
        seen |= 1 << c;
    }
    Ok(seen)
}

fn no_wrong(mask: u64) -> R {
    for c in cpus_of(mask) {
        for side in 0..2 {
            for post in [false, true] {
                if CPUS[c].count(side, post, WRONG) != 0 {
                    println!(
                        "  CPU {c}: {} loads returned a wrong value (side {side}, after {post})",
                        CPUS[c].count(side, post, WRONG)
                    );
                    return Err("a CPU read data that was not the page's");
                }
            }
        }
    }
    Ok(())
}

/// Runs the `smp_` cases and the shootdown benchmark with the CPUs of
/// `smp`, then turns the secondaries off. `pool` is RAM the cases may map
/// ([`FRAMES`] pages from its first [`POOL_ALIGN`] boundary);
/// `test_root` is the suite's test space, installed again in TTBR0_EL1
/// at the end. Returns (passed, failed).
pub fn run(smp: &mut Smp, pool: (u64, u64), test_root: PhysAddr) -> (u32, u32) {
    let all = smp.mask_first(smp.online - 1);
    let first = pool.0.next_multiple_of(POOL_ALIGN);
    if first.saturating_add(FRAMES * PAGE) > pool.1 {
        println!(
            "FAIL smp_setup: the pool {:#x}..{:#x} has no {FRAMES} pages of {PAGE:#x} bytes",
            pool.0, pool.1
        );
        return (0, 1);
    }
    let mut a = match Space::new(crate::smp::ttbr0_mmu(), KernelTables) {
        Ok(s) => s,
        Err(_) => {
            println!("FAIL smp_setup: no table for the cases' space");
            return (0, 1);
        }
    };
    // SAFETY: the space is empty; the kernel runs on TTBR1_EL1.
    unsafe { a.install() };
    let mut k = Cases {
        smp,
        all,
        pool: first,
        passed: 0,
        failed: 0,
        rows: [Row::default(); 8],
        nrows: 0,
    };
    if k.ttbr0(all, a.root().0).is_err() {
        println!("FAIL smp_setup: the secondaries did not install the cases' space");
        // SAFETY: as at the end of this function; the cases' space is
        // left active, so it is never freed (a secondary may run on it).
        unsafe { crate::smp::ttbr0_mmu().install_root(test_root) };
        return (0, 1);
    }
    let hd = (ID_AA64MMFR1_EL1.get() & 0xf) >= 2;
    println!(
        "smp cases: CPU 0 operates through pgtable, CPUs {} hammer; FEAT_HAFDBS dirty-state management {}",
        CpuList(all),
        if hd { "on (TCR_EL1.HD)" } else { "absent" }
    );
    println!(
        "smp cases: geometry {}, pages of {} KiB, moves {} GiB apart",
        crate::geom::NAME,
        PAGE >> 10,
        STEP >> 30
    );

    k.case("smp_unmap_faults_everywhere", |k| {
        cases::unmap_faults_everywhere(k, &mut a)
    });
    k.case("smp_move_readers_follow", |k| {
        cases::move_readers_follow(k, &mut a)
    });
    k.case("smp_writer_races_move", |k| {
        cases::writer_races_move(k, &mut a)
    });
    k.case("smp_protect_readonly_everywhere", |k| {
        cases::protect_readonly_everywhere(k, &mut a, hd)
    });
    k.case("smp_space_live_elsewhere", |k| {
        cases::space_live_elsewhere(k, &mut a)
    });
    k.case("smp_local_flush_misses_others", |k| {
        cases::local_flush_misses_others(k, &mut a)
    });

    println!();
    println!("smp: TLB maintenance per operation (pgtable stats) and the CPUs that observed the change (EMULATED ticks)");
    println!(
        "{:<28} {:>10} {:>11} {:>9} {:>8} {:>10} {:>9}",
        "operation", "range TLBI", "full flush", "strides", "ticks", "hammering", "observed"
    );
    for r in &k.rows[..k.nrows] {
        println!(
            "{:<28} {:>10} {:>11} {:>9} {:>8} {:>10} {:>9}",
            r.name,
            r.flush_range,
            r.flush_all,
            r.strides,
            r.ticks,
            CpuList(r.hammering).to_string_buf().as_str(),
            CpuList(r.observed).to_string_buf().as_str()
        );
    }

    if let Err(e) = bench::bench(&mut k, &mut a) {
        println!("FAIL smp_bench: {e}");
        k.failed += 1;
    }
    let (mut passed, mut failed) = (k.passed, k.failed);
    let parked = k.smp.park_from(1);
    // SAFETY: the test space maps nothing the kernel uses; installing it
    // (with a full TLB flush) makes the cases' space unreachable from
    // CPU 0.
    unsafe { crate::smp::ttbr0_mmu().install_root(test_root) };
    match parked {
        Ok(()) => {
            // SAFETY: CPU 0 has the test space again, the secondaries are
            // off, and the install flushed every TLB.
            unsafe { a.deactivate() };
            println!("ok smp_secondaries_off");
            passed += 1;
        }
        Err(e) => {
            // A secondary may still run on the cases' space: it stays
            // active, so dropping it never frees its tables.
            println!("FAIL smp_secondaries_off: {e}");
            failed += 1;
        }
    }
    drop(a);
    (passed, failed)
}

/// A short fixed buffer for formatting into a column.
struct Buf {
    b: [u8; 32],
    n: usize,
}

impl Buf {
    fn as_str(&self) -> &str {
        core::str::from_utf8(&self.b[..self.n]).unwrap_or("?")
    }
}

impl core::fmt::Write for Buf {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        let take = s.len().min(self.b.len() - self.n);
        self.b[self.n..self.n + take].copy_from_slice(&s.as_bytes()[..take]);
        self.n += take;
        Ok(())
    }
}

impl CpuList {
    fn to_string_buf(&self) -> Buf {
        let mut b = Buf { b: [0; 32], n: 0 };
        let _ = core::fmt::Write::write_fmt(&mut b, format_args!("{self}"));
        b
    }
}

/// The SMP phase: finds the CPUs in the device tree, starts them, prints
/// `smp: <N> CPUs online`, runs the cases and the benchmark, and leaves
/// only CPU 0 running with `test_root` in TTBR0_EL1. Returns (passed,
/// failed).
pub fn phase(pool: (u64, u64), test_root: PhysAddr) -> (u32, u32) {
    // SAFETY: QEMU virt's device tree at the base of RAM, read-only,
    // through the linear map (as kernel_main reads it).
    let fdt = unsafe { crate::fdt::Fdt::at(phys_to_virt(crate::memory::RAM_BASE)) };
    let Some(cpus) = fdt.and_then(|f| crate::psci::from_fdt(f.raw())) else {
        println!("FAIL smp_bring_up: no CPUs in the device tree");
        return (0, 1);
    };
    let mut smp = match crate::smp::bring_up(&cpus) {
        Ok(s) => s,
        Err(e) => {
            println!("FAIL smp_bring_up: {e}");
            return (0, 1);
        }
    };
    println!(
        "smp: {} CPUs online (device tree: {} CPUs, PSCI conduit {:?})",
        smp.online, cpus.count, smp.conduit
    );
    for (cpu, r) in CPUS.iter().enumerate().take(smp.online).skip(1) {
        let (guard, _, top) = crate::smp::stack_of(cpu);
        // Relaxed: published by the CPU's release of `online`, which
        // bring_up read with acquire.
        println!(
            "  CPU {cpu}: MPIDR {:#x}, EL{}, sp {:#x} (stack top {top:#x}, guard page {guard:#x} unmapped: {}), VBAR_EL1 {:#x}, TCR_EL1 {:#x}",
            r.mpidr.load(Relaxed),
            r.el.load(Relaxed),
            r.sp.load(Relaxed),
            probe::translate(guard).is_none(),
            r.vbar.load(Relaxed),
            r.tcr.load(Relaxed)
        );
    }
    if smp.online < 2 {
        println!("smp: one CPU only, no smp_ case can run");
        return (0, 0);
    }
    run(&mut smp, pool, test_root)
}
