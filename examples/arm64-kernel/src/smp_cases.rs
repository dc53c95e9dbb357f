//! The `smp_` cases: every CPU sees a change once the pgtable operation
//! that made it returns, judged by the MMU of each CPU while it hammers
//! the range; then the shootdown benchmark.
//!
//! A *round*: CPU 0 clears the secondaries' counters, starts their access
//! loop ([`hammer`]) over the range, waits until each did a few accesses
//! (so its TLB holds the translations), runs the operation through
//! pgtable, then publishes a new *epoch* (release store). A secondary
//! loads the epoch (acquire) before each access and files the access
//! under "after" once it sees it: every access filed "after" started
//! after the operation returned, so it must see the change. CPU 0 waits
//! until each did enough accesses after the epoch and stops the loops.
//!
//! Loop modes (`args[0]` of the command):
//! - [`READ`]: loads from page `i % pages` of A; a loaded value must be
//!   the page's marker;
//! - [`PAIR`]: the same at A and at B;
//! - [`WRITE_RACE`]: secondary `c` stores a rising count to word `c` of
//!   page `c - 1`, through A, or through B if A faults; it remembers the
//!   last store that succeeded;
//! - [`WRITE_PAGES`]: stores to word `c` of page `i % pages` of A,
//!   remembering which pages took a store;
//! - [`ANY`]: loads from A, any outcome (the benchmark's load).
//!
//! Every case prints `ok <name>` or `FAIL <name>: <why>`; the table after
//! them gives, per operation, the TLB maintenance pgtable issued (its
//! stats) and which CPUs observed the change.

use core::arch::asm;
use core::sync::atomic::Ordering::{Acquire, Relaxed, Release};

use aarch64_cpu::registers::{ID_AA64MMFR1_EL1, TTBR0_EL1};
use pgtable_arm64::desc::{is_hw_dirty, SW_DIRTY};
use pgtable_arm64::mmu::{local_flush_tlb_all, Arm64Mmu, Ttbr};
use pgtable_arm64::regs::{ttbr0_value, Asid};
use pgtable_arm64::Arm64;
use pgtable_core::{AddressSpace, MapOptions, Mmu, PhysAddr, Prot, TlbRange, VirtAddr};
use tock_registers::interfaces::Readable;

use crate::memory::{phys_to_virt, KernelTables};
use crate::probe::{self, is_permission_fault, is_translation_fault};
use crate::smp::{wait_for, Op, PerCpu, Smp, CMD, CPUS, FAULT, OK, SLOTS, WRONG};
use crate::{println, timer};

/// Loop mode: loads from A.
pub const READ: u64 = 0;
/// Loop mode: loads from A and from B.
pub const PAIR: u64 = 1;
/// Loop mode: a writer racing a move from A to B.
pub const WRITE_RACE: u64 = 2;
/// Loop mode: stores to every page of A.
pub const WRITE_PAGES: u64 = 3;
/// Loop mode: loads from A, any outcome.
pub const ANY: u64 = 4;

/// Where the cases map, in the lower half (away from the suite's window
/// and the benchmarks').
const WINDOW: u64 = 0xc0_0000_0000;
/// The destination of the moves (another PMD, PUD and root entry).
const MOVED: u64 = 0xc8_0000_0000;
const PAGE: u64 = 4096;
/// Accesses each secondary makes before the operation, and after the
/// epoch, in a round.
const WARM: u64 = 32;
const AFTER: u64 = 32;
/// The marker of page `p` is `MARK ^ p`.
const MARK: u64 = 0x5350_4d00_0000_0000;

/// A space of the cases: untagged or tagged Arm64Mmu, TTBR0_EL1.
type Space = crate::smp::SmpSpace;

/// The access loop of a secondary (see the module docs), until the next
/// command. `a` = [mode, A, B, pages, marker, epoch].
pub fn hammer(cpu: usize, me: &PerCpu, seq: u64, a: [u64; 6]) {
    let [mode, va_a, va_b, pages, mark, target] = a;
    let pages = pages.max(1);
    let c = cpu as u64;
    let mut counts = [0u64; SLOTS];
    let mut iters = [0u64; 2];
    let mut it = 0u64;
    let mut post_esr = 0;
    let mut written = 0u64;
    // Relaxed: a new command is seen a few iterations late at worst.
    while CMD.seq.load(Relaxed) == seq {
        // Acquire: pairs with CPU 0's release store after the operation
        // returned, so accesses after this load come after it.
        let post = CMD.epoch.load(Acquire) >= target;
        let p = it % pages;
        let mut note = |side: usize, outcome: usize, esr: u64| {
            counts[crate::smp::slot(side, post, outcome)] += 1;
            if post && outcome == FAULT && post_esr == 0 {
                post_esr = esr;
            }
        };
        match mode {
            READ | PAIR | ANY => {
                let sides: &[u64] = if mode == PAIR { &[va_a, va_b] } else { &[va_a] };
                for (side, &base) in sides.iter().enumerate() {
                    match probe::read_u64(base + p * PAGE) {
                        Ok(v) if mode == ANY || v == mark ^ p => note(side, OK, 0),
                        Ok(_) => note(side, WRONG, 0),
                        Err(f) => note(side, FAULT, f.esr),
                    }
                }
            }
            WRITE_RACE => {
                let off = ((c - 1) % pages) * PAGE + c * 8;
                let v = c << 56 | (it + 1);
                // SAFETY: the case maps only pool frames at A and B (or
                // nothing): a store that succeeds lands in a pool frame.
                let at_a = unsafe { probe::write_u64(va_a + off, v) }.is_ok();
                let at_b = !at_a && {
                    // SAFETY: as above.
                    unsafe { probe::write_u64(va_b + off, v) }.is_ok()
                };
                if at_a || at_b {
                    note(usize::from(at_b), OK, 0);
                    // Relaxed: published by the acknowledgement.
                    me.last_write.store(v, Relaxed);
                } else {
                    note(1, FAULT, 0);
                }
            }
            WRITE_PAGES => {
                let v = c << 56 | (it + 1);
                // SAFETY: as above.
                match unsafe { probe::write_u64(va_a + p * PAGE + c * 8, v) } {
                    Ok(()) => {
                        note(0, OK, 0);
                        written |= 1 << (p % 64);
                    }
                    Err(f) => note(0, FAULT, f.esr),
                }
            }
            _ => return,
        }
        iters[post as usize] += 1;
        // Relaxed: progress for CPU 0's waits; the results are published
        // by the acknowledgement (release) after the loop.
        me.iters[post as usize].store(iters[post as usize], Relaxed);
        it += 1;
    }
    for (slot, n) in me.counts.iter().zip(counts) {
        // Relaxed: published by the acknowledgement.
        slot.store(n, Relaxed);
    }
    // Relaxed: as above.
    me.pages_written.store(written, Relaxed);
    me.post_esr.store(post_esr, Relaxed);
}

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

/// A local-only MMU handle: like `Arm64Mmu` (untagged, TTBR0_EL1) but its
/// TLB invalidations are the non-shareable `tlbi vale1` / `vmalle1`
/// completed by `dsb nsh`, which reach only the CPU that issues them.
///
/// This **breaks the shootdown rule** of `pgtable_core::Mmu` on purpose:
/// it exists for `smp_local_flush_misses_others`, which shows that the
/// cases catch it. Its space maps only pool frames and is never freed
/// before every CPU flushed its own TLB.
struct LocalMmu;

// SAFETY: deliberately not upheld for more than one CPU (see above); the
// only space using it is read by the other CPUs and torn down only after
// each of them invalidated its own TLB.
unsafe impl Mmu for LocalMmu {
    fn walker_barrier(&self) {
        // SAFETY: barriers only (as Arm64Mmu's).
        unsafe { asm!("dsb ishst", "isb", options(nostack, preserves_flags)) };
    }

    fn flush_tlb_range(&self, range: TlbRange) {
        // SAFETY: barriers and a local TLB invalidation; no memory effects.
        unsafe { asm!("dsb ishst", options(nostack, preserves_flags)) };
        let mut va = range.start.0;
        for _ in 0..range.strides().min(512) {
            let x = (va >> 12) & ((1 << 44) - 1);
            // SAFETY: as above.
            unsafe { asm!("tlbi vae1, {}", in(reg) x, options(nostack, preserves_flags)) };
            va += 1 << range.stride_shift;
        }
        // SAFETY: as above.
        unsafe { asm!("dsb nsh", "isb", options(nostack, preserves_flags)) };
    }

    fn flush_tlb_all(&self) {
        local_flush_tlb_all();
    }

    unsafe fn install_root(&self, root: PhysAddr) {
        // SAFETY: the caller's promise (tables complete and alive).
        unsafe {
            Arm64Mmu::new()
                .installing_into(Ttbr::Ttbr0)
                .install_root(root)
        }
    }
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
/// (64 frames, 2 MiB aligned); `test_root` is the suite's test space,
/// installed again in TTBR0_EL1 at the end. Returns (passed, failed).
pub fn run(smp: &mut Smp, pool: (u64, u64), test_root: PhysAddr) -> (u32, u32) {
    let all = smp.mask_first(smp.online - 1);
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
        pool: pool.0.next_multiple_of(2 << 20),
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

    k.case("smp_unmap_faults_everywhere", |k| {
        k.map_marked(&mut a, WINDOW, 0, 16, Prot::READ_WRITE)?;
        a.stats().reset();
        let t = k.round(k.all, [READ, WINDOW, 0, 16], || {
            a.unmap(VirtAddr(WINDOW), 16 * PAGE)
                .map_err(|_| "unmap failed")
        })?;
        no_wrong(k.all)?;
        let seen = check_gone(k.all, 0, "load from the unmapped range", false)?;
        k.push(row_of("unmap 16 pages", &a, t, seen, k.all));
        Ok(())
    });

    k.case("smp_move_readers_follow", |k| {
        k.map_marked(&mut a, WINDOW, 0, 16, Prot::READ_WRITE)?;
        a.stats().reset();
        let t = k.round(k.all, [PAIR, WINDOW, MOVED, 16], || {
            a.move_page_tables(VirtAddr(WINDOW), VirtAddr(MOVED), 16 * PAGE).map_err(|_| "move failed")
        })?;
        let row = row_of("move 16 pages", &a, t, 0, k.all);
        let r = (|| {
            no_wrong(k.all)?;
            let seen = check_gone(k.all, 0, "load from the old address", false)?;
            for c in cpus_of(k.all) {
                let (ok, fault) = (CPUS[c].count(1, true, OK), CPUS[c].count(1, true, FAULT));
                if ok == 0 || fault != 0 {
                    println!("  CPU {c}: after the move, {ok} loads at the new address saw the data and {fault} faulted");
                    return Err("a CPU did not find the data at the new address");
                }
            }
            Ok(seen)
        })();
        a.unmap(VirtAddr(MOVED), 16 * PAGE).map_err(|_| "unmap failed")?;
        k.push(Row { observed: r?, ..row });
        Ok(())
    });

    k.case("smp_writer_races_move", |k| {
        k.map_marked(&mut a, WINDOW, 16, 16, Prot::READ_WRITE)?;
        a.stats().reset();
        let t = k.round(k.all, [WRITE_RACE, WINDOW, MOVED, 16], || {
            a.move_page_tables(VirtAddr(WINDOW), VirtAddr(MOVED), 16 * PAGE).map_err(|_| "move failed")
        })?;
        let row = row_of("move 16 pages (writers)", &a, t, 0, k.all);
        let mut seen = 0;
        for c in cpus_of(k.all) {
            let r = &CPUS[c];
            let (old_after, new_after) = (r.count(0, true, OK), r.count(1, true, OK));
            if old_after != 0 || new_after == 0 {
                println!("  CPU {c}: after the move {old_after} stores went through the old address, {new_after} through the new one");
                a.unmap(VirtAddr(MOVED), 16 * PAGE).map_err(|_| "unmap failed")?;
                return Err("a writer used the old translation after the move returned");
            }
            // The frame behind both addresses holds the last store that
            // reported success: none was lost.
            let frame = k.frame(16 + (c as u64 - 1) % 16);
            let (want, got) = (r.last_write.load(Relaxed), peek(frame, c as u64));
            if want != got {
                println!("  CPU {c}: its last successful store wrote {want:#x}, the frame holds {got:#x}");
                a.unmap(VirtAddr(MOVED), 16 * PAGE).map_err(|_| "unmap failed")?;
                return Err("a store that succeeded is not in the frame (lost write)");
            }
            seen |= 1 << c;
        }
        // The frames are freed (unmapped) and refilled: no writer may
        // reach them through either address any more.
        a.unmap(VirtAddr(MOVED), 16 * PAGE).map_err(|_| "unmap failed")?;
        const FILL: u64 = 0xf111_f111_f111_f111;
        for p in 0..16 {
            for w in 0..8 {
                poke(k.frame(16 + p), w, FILL);
            }
        }
        k.round(k.all, [WRITE_RACE, WINDOW, MOVED, 16], || Ok(()))?;
        for c in cpus_of(k.all) {
            let ok = CPUS[c].count(0, false, OK) + CPUS[c].count(0, true, OK) + CPUS[c].count(1, false, OK) + CPUS[c].count(1, true, OK);
            if ok != 0 {
                println!("  CPU {c}: {ok} stores succeeded after the frames were unmapped");
                return Err("a writer reached a freed frame");
            }
        }
        for p in 0..16 {
            for w in 0..8 {
                if peek(k.frame(16 + p), w) != FILL {
                    println!("  frame {p} word {w} is {:#x} after refilling", peek(k.frame(16 + p), w));
                    return Err("a store landed in a freed and refilled frame");
                }
            }
        }
        k.push(Row { observed: seen, ..row });
        Ok(())
    });

    k.case("smp_protect_readonly_everywhere", |k| {
        // With HD, user pages start clean (DBM, read-only): the first store
        // of a secondary makes the hardware set the dirty state. Page 31 is
        // never written: it must stay clean (a control for the check).
        let (rw, ro) = if hd {
            (Prot::new(Prot::WRITE | Prot::USER), Prot::new(Prot::USER))
        } else {
            (Prot::READ_WRITE, Prot::READ_ONLY)
        };
        k.map_marked(&mut a, WINDOW, 32, 32, rw)?;
        a.stats().reset();
        let t = k.round(k.all, [WRITE_PAGES, WINDOW, 0, 31], || {
            a.change_protection(VirtAddr(WINDOW), 32 * PAGE, ro)
                .map_err(|_| "change_protection failed")
        })?;
        let row = row_of("protect 32 pages RO", &a, t, 0, k.all);
        let r = (|| {
            let seen = check_gone(k.all, 0, "store to the read-only range", true)?;
            let mut written = 0u64;
            for c in cpus_of(k.all) {
                // Relaxed: after the acknowledgement.
                written |= CPUS[c].pages_written.load(Relaxed);
            }
            for p in 0..32u64 {
                let Some(raw) = a.entry(VirtAddr(WINDOW + p * PAGE), 0) else {
                    return Err("a page lost its entry");
                };
                let dirty = is_hw_dirty(raw) || raw & SW_DIRTY != 0;
                if written & (1 << p) != 0 && !dirty {
                    println!("  page {p} took a store but its entry {raw:#x} is clean");
                    return Err("a dirty bit set by another CPU was lost");
                }
                if hd && p == 31 && dirty {
                    println!("  page 31 took no store but its entry {raw:#x} is dirty");
                    return Err("the dirty check cannot fail: an unwritten page is dirty");
                }
            }
            if written == 0 {
                return Err("no store succeeded before the change (no control)");
            }
            println!(
                "  {} of 31 pages took stores from CPUs 1-3 before the change, each entry dirty after it; page 31 (no store) {}",
                written.count_ones(),
                if hd { "clean" } else { "not checked (no HD)" }
            );
            Ok(seen)
        })();
        a.unmap(VirtAddr(WINDOW), 32 * PAGE)
            .map_err(|_| "unmap failed")?;
        k.push(Row {
            observed: r?,
            ..row
        });
        Ok(())
    });

    k.case("smp_space_live_elsewhere", |k| {
        // A space tagged with ASID 9, live on the secondaries only.
        const ASID: u8 = 9;
        let mut b = Space::new(Arm64Mmu::with_asid(ASID), KernelTables).map_err(|_| "no root")?;
        k.map_marked(&mut b, WINDOW, 0, 16, Prot::READ_WRITE)?;
        let r = (|| {
            k.ttbr0(k.all, ttbr0_value(b.root().0, Asid::from_u8(ASID)))?;
            if TTBR0_EL1.get() & 0xffff_ffff_fffe == b.root().0 {
                return Err("the space is live on CPU 0");
            }
            b.stats().reset();
            let t = k.round(k.all, [READ, WINDOW, 0, 16], || {
                b.unmap(VirtAddr(WINDOW), 16 * PAGE)
                    .map_err(|_| "unmap failed")
            })?;
            no_wrong(k.all)?;
            let seen = check_gone(k.all, 0, "load from the unmapped range", false)?;
            Ok(row_of("unmap, space not on CPU 0", &b, t, seen, k.all))
        })();
        // Back to the cases' space (each secondary flushes its TLB), then
        // the space can go.
        k.ttbr0(k.all, a.root().0)?;
        drop(b);
        k.push(r?);
        Ok(())
    });

    k.case("smp_local_flush_misses_others", |k| {
        // Negative control: the same unmap with a local-only TLBI. The case
        // passes when another CPU is seen still using the translation.
        let mut c = AddressSpace::<Arm64, LocalMmu, KernelTables>::new(LocalMmu, KernelTables).map_err(|_| "no root")?;
        // Two pages, one unmapped: the table stays (nothing freed under a
        // stale walk).
        k.map_marked(&mut c, WINDOW, 0, 2, Prot::READ_WRITE)?;
        let r = (|| {
            k.ttbr0(k.all, c.root().0)?;
            c.stats().reset();
            let t = k.round(k.all, [READ, WINDOW, 0, 1], || c.unmap(VirtAddr(WINDOW), PAGE).map_err(|_| "unmap failed"))?;
            no_wrong(k.all)?;
            let mut stale = 0;
            for cpu in cpus_of(k.all) {
                if CPUS[cpu].count(0, true, OK) != 0 {
                    stale |= 1 << cpu;
                }
            }
            Ok((row_of("unmap, local-only TLBI", &c, t, k.all & !stale, k.all), stale))
        })();
        k.ttbr0(k.all, a.root().0)?;
        drop(c);
        let (row, stale) = r?;
        k.push(row);
        if stale == 0 {
            return Err("no CPU kept the stale translation: the cases could not tell a local flush from a shootdown");
        }
        println!(
            "  expected: after a local-only `tlbi vae1` on CPU 0, CPUs {} still loaded through the unmapped translation (stale TLB entry)",
            CpuList(stale)
        );
        Ok(())
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

    if let Err(e) = bench(&mut k, &mut a) {
        println!("FAIL smp_bench: {e}");
        k.failed += 1;
    }
    let (passed, failed) = (k.passed, k.failed);
    let smp = k.smp;
    if let Err(e) = smp.park_from(1) {
        println!("FAIL smp_park: {e}");
        return (passed, failed + 1);
    }
    // SAFETY: the test space maps nothing the kernel uses; installing it
    // (with a full TLB flush) makes the cases' space unreachable.
    unsafe {
        Arm64Mmu::new()
            .installing_into(Ttbr::Ttbr0)
            .install_root(test_root)
    };
    // SAFETY: CPU 0 has the test space again, the secondaries are off, and
    // the install flushed every TLB.
    unsafe { a.deactivate() };
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

fn median<const N: usize>(mut xs: [u64; N]) -> u64 {
    xs.sort_unstable();
    xs[N / 2]
}

/// The shootdown cost per operation against the CPUs running: 4 (3
/// hammering), 2 (1 hammering), 1 (the others off), each operation
/// [`REPS`] times on 16 pages.
///
/// Under QEMU TCG with one thread per CPU, a broadcast TLBI is carried
/// out on every CPU before the issuing one goes on (QEMU's
/// `tlb_flush_*_all_cpus_synced`), so the cost grows with the CPUs
/// running, and with how the host schedules their threads: the ticks are
/// EMULATED and noisy, the counts exact.
fn bench(k: &mut Cases, a: &mut Space) -> Result<(), &'static str> {
    const PAGES: u64 = 16;
    const COUNTS: [usize; 3] = [4, 2, 1];
    println!();
    println!(
        "smp shootdown cost: {REPS} operations on 16 pages each, the other CPUs loading from the range, EMULATED ticks"
    );
    println!(
        "{:<14} {:>5} {:>10} {:>10} {:>10} {:>8} {:>8} {:>14}",
        "operation", "CPUs", "hammering", "median", "min", "TLBI/op", "strides", "median/1 CPU"
    );
    // [op][column] = (median ticks, min ticks, flushes, strides)
    let mut table = [[(0u64, 0u64, 0u64, 0u64); 3]; 3];
    let names = ["unmap", "protect RO/RW", "move"];
    for (col, ncpus) in COUNTS.into_iter().enumerate() {
        k.smp.park_from(ncpus)?;
        if k.smp.online != ncpus {
            return Err("fewer CPUs online than the benchmark needs");
        }
        let mask = k.smp.mask_first(ncpus - 1);
        for (op, row) in table.iter_mut().enumerate() {
            let mut ticks = [0u64; REPS];
            let (mut flushes, mut strides) = (0, 0);
            k.map_marked(a, WINDOW, 0, PAGES, Prot::READ_WRITE)?;
            let mut at = WINDOW;
            for (i, t) in ticks.iter_mut().enumerate() {
                a.stats().reset();
                let mut run = || -> R {
                    match op {
                        0 => a
                            .unmap(VirtAddr(WINDOW), PAGES * PAGE)
                            .map_err(|_| "unmap failed"),
                        1 => {
                            let p = if i % 2 == 0 {
                                Prot::READ_ONLY
                            } else {
                                Prot::READ_WRITE
                            };
                            a.change_protection(VirtAddr(WINDOW), PAGES * PAGE, p)
                                .map_err(|_| "protect failed")
                        }
                        _ => {
                            let to = if at == WINDOW { MOVED } else { WINDOW };
                            let r = a
                                .move_page_tables(VirtAddr(at), VirtAddr(to), PAGES * PAGE)
                                .map_err(|_| "move failed");
                            at = to;
                            r
                        }
                    }
                };
                *t = if mask == 0 {
                    let t0 = timer::ticks();
                    run()?;
                    timer::ticks() - t0
                } else {
                    k.round(mask, [ANY, WINDOW, 0, PAGES], run)?
                };
                flushes = a.stats().flushes();
                strides = a.stats().flush_range_pages();
                if op == 0 {
                    a.map(
                        VirtAddr(WINDOW),
                        PhysAddr(k.frame(0)),
                        PAGES * PAGE,
                        Prot::READ_WRITE,
                        MapOptions::PAGES,
                    )
                    .map_err(|_| "map failed")?;
                }
            }
            a.unmap(VirtAddr(at), PAGES * PAGE)
                .map_err(|_| "unmap failed")?;
            let min = ticks.iter().copied().min().unwrap_or(0);
            row[col] = (median(ticks), min, flushes, strides);
        }
    }
    for (op, row) in table.iter().enumerate() {
        for (col, ncpus) in COUNTS.into_iter().enumerate() {
            let (med, min, f, st) = row[col];
            let centi = med * 100 / row[2].0.max(1);
            println!(
                "{:<14} {:>5} {:>10} {:>10} {:>10} {:>8} {:>8} {:>11}.{:02}x",
                names[op],
                ncpus,
                ncpus - 1,
                med,
                min,
                f,
                st,
                centi / 100,
                centi % 100
            );
        }
    }
    Ok(())
}

/// Operations per row of the benchmark.
const REPS: usize = 10;

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
