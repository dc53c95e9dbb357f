//! The `contpte_napot_` cases: Svnapot 64 KiB runs on the live hart, in a
//! space of the Svnapot format (`RiscvPaging<L, SVNAPOT>`), which the
//! kernel uses only when the device tree's `riscv,isa` lists Svnapot for
//! the harts (without it N is reserved and the hart would fault on every
//! NAPOT PTE; the cases are skipped, and a kernel maps with the plain
//! format, whose maps write plain PTEs).
//!
//! - `map` of two aligned 64 KiB runs writes 32 NAPOT PTEs (N set,
//!   PPN\[0\]\[3:0\] = `0b1000`), and the hart's walker takes each page to
//!   its own frame (it substitutes VPN\[0\]\[3:0\]).
//! - A protection change of one page unfolds its run into 16 plain PTEs
//!   (each with its own PPN): a store to that page faults, its neighbours
//!   still take stores, the other run stays folded.
//! - A store through a clean run makes the hart set D in the one PTE it
//!   walked; `ptep_get` of any page of the run reports the run dirty.
//! - A move to a 64 KiB-aligned address keeps the runs folded, and the
//!   unmap at the end frees every table the space grew.

use pgtable_core::{AddressSpace, MapOptions, MoveOptions, PhysAddr, Prot, VirtAddr};
use pgtable_riscv::bits::N;
use pgtable_riscv::{RiscvMmu, RiscvPaging, SVNAPOT};

use crate::cases::{ensure, fill, Counts, Why, R};
use crate::mem::{case_frame, kernel_space, Frames, CASE_VA};
use crate::trap::{self, CAUSE_STORE_PAGE_FAULT};

type Napot<const L: u32> = AddressSpace<RiscvPaging<L, SVNAPOT>, RiscvMmu, Frames>;
type Kernel<const L: u32> = AddressSpace<RiscvPaging<L>, RiscvMmu, Frames>;

const PAGE: u64 = 4096;
const RUN: u64 = 16 * PAGE;
/// The two runs' virtual addresses (64 KiB aligned), in the cases'
/// gigabyte, and where the move takes them.
const RUNS_VA: u64 = CASE_VA + 0x40_0000;
const MOVED_VA: u64 = CASE_VA + 0x60_0000;
/// The first of the 32 case frames they map (64 KiB aligned:
/// `case_frame(256)` is 0x8610_0000).
const FIRST: u64 = 256;

/// The value the first word of page `k` of the runs holds.
const fn mark(k: u64) -> u64 {
    0x4e50_0000 + k
}

fn pte<const L: u32>(s: &Napot<L>, va: u64) -> u64 {
    s.inspect().entry(VirtAddr(va), 0).unwrap_or(0)
}

/// Whether pages `ks` of the runs at `va` all have N as `folded` says.
fn ensure_n<const L: u32>(s: &Napot<L>, va: u64, ks: core::ops::Range<u64>, folded: bool) -> R {
    for k in ks {
        let raw = pte(s, va + k * PAGE);
        ensure(
            (raw & N != 0) == folded,
            "a PTE of the runs has the wrong N",
            raw,
        )?;
    }
    Ok(())
}

/// Every page of the runs at `va` reads its own frame's mark.
fn reads_own_frames(va: u64) -> R {
    for k in 0..32 {
        let r = trap::read_u64(va + k * PAGE);
        ensure(
            r == Ok(mark(k)),
            "a page of the runs read another frame",
            r.unwrap_or(k),
        )?;
    }
    Ok(())
}

/// Runs `f` with `s` installed, then the kernel's space again.
fn on<const L: u32>(s: &mut Napot<L>, k: &mut Kernel<L>, f: impl FnOnce() -> R) -> R {
    // SAFETY: the space maps all RAM identically, as the kernel's does.
    unsafe { s.install() };
    let r = f();
    // SAFETY: the kernel's space maps everything the kernel touches.
    unsafe { k.install() };
    r
}

fn folds_and_reads<const L: u32>(s: &mut Napot<L>, k: &mut Kernel<L>) -> R {
    for i in 0..32 {
        fill(case_frame(FIRST + i), mark(i));
    }
    s.map(
        VirtAddr(RUNS_VA),
        PhysAddr(case_frame(FIRST)),
        2 * RUN,
        Prot::WRITE,
        MapOptions::PAGES,
    )
    .map_err(|_| Why("map failed", RUNS_VA))?;
    ensure_n(s, RUNS_VA, 0..32, true)?;
    let first = pte(s, RUNS_VA);
    ensure(
        pte(s, RUNS_VA + 9 * PAGE) == first,
        "the run's PTEs differ",
        first,
    )?;
    on(s, k, || reads_own_frames(RUNS_VA))
}

fn partial_change_unfolds<const L: u32>(s: &mut Napot<L>, k: &mut Kernel<L>) -> R {
    s.change_protection(VirtAddr(RUNS_VA + 5 * PAGE), PAGE, Prot::empty())
        .map_err(|_| Why("change_protection failed", RUNS_VA))?;
    ensure_n(s, RUNS_VA, 0..16, false)?;
    ensure_n(s, RUNS_VA, 16..32, true)?;
    on(s, k, || {
        reads_own_frames(RUNS_VA)?;
        // SAFETY: a case frame (page 5 of the runs), nothing else uses it.
        let r = unsafe { trap::write_u64(RUNS_VA + 5 * PAGE, mark(5)) };
        ensure(
            r == Err(CAUSE_STORE_PAGE_FAULT),
            "a store to the read-only page did not fault",
            0,
        )?;
        // SAFETY: as above; it stores the mark the page holds.
        let r = unsafe { trap::write_u64(RUNS_VA + 6 * PAGE, mark(6)) };
        ensure(
            r.is_ok(),
            "a store to a neighbour of the read-only page faulted",
            6,
        )
    })
}

fn dirty_over_the_run<const L: u32>(s: &mut Napot<L>, k: &mut Kernel<L>) -> R {
    // The second run again, clean: user writable leaves start with D
    // clear (the kernel reaches them with SUM set).
    let run2 = RUNS_VA + RUN;
    s.unmap(VirtAddr(run2), RUN)
        .map_err(|_| Why("unmap failed", run2))?;
    let user = Prot::WRITE | Prot::USER;
    s.map(
        VirtAddr(run2),
        PhysAddr(case_frame(FIRST + 16)),
        RUN,
        user,
        MapOptions::PAGES,
    )
    .map_err(|_| Why("map failed", run2))?;
    ensure_n(s, run2, 0..16, true)?;
    ensure(
        !s.ptep_get(VirtAddr(run2)).is_some_and(|e| e.dirty()),
        "a new user run is dirty",
        0,
    )?;
    on(s, k, || {
        crate::space::with_sum(|| {
            // SAFETY: a case frame (page 9 of the second run).
            unsafe { trap::write_u64(run2 + 9 * PAGE, mark(25)) }
                .map_err(|c| Why("the store faulted", c))
        })
    })?;
    // The hart set D in the PTE it walked (page 9's); every page of the
    // run reports the run dirty.
    for p in 0..16 {
        let e = s.ptep_get(VirtAddr(run2 + p * PAGE));
        ensure(
            e.is_some_and(|e| e.dirty()),
            "a page of the stored-to run is not dirty",
            p,
        )?;
    }
    Ok(())
}

fn move_and_unmap<const L: u32>(s: &mut Napot<L>, k: &mut Kernel<L>) -> R {
    s.move_page_tables(
        VirtAddr(RUNS_VA),
        VirtAddr(MOVED_VA),
        2 * RUN,
        MoveOptions::DEFAULT,
    )
    .map_err(|_| Why("move_page_tables failed", RUNS_VA))?;
    ensure_n(s, MOVED_VA, 16..32, true)?;
    // The second run is a user run now: the kernel reads it with SUM set.
    on(s, k, || {
        crate::space::with_sum(|| reads_own_frames(MOVED_VA))
    })?;
    s.unmap(VirtAddr(MOVED_VA), 2 * RUN)
        .map_err(|_| Why("unmap failed", MOVED_VA))?;
    on(s, k, || {
        let r = trap::read_u64(MOVED_VA);
        ensure(
            r.is_err(),
            "a page of the unmapped runs still reads",
            r.unwrap_or(0),
        )
    })
}

/// Runs the `contpte_napot_` cases when `has_svnapot` (the device tree
/// lists Svnapot), with the kernel's space `k` installed before and after.
pub fn run<const L: u32>(k: &mut Kernel<L>, ram: (u64, u64), has_svnapot: bool) -> Counts {
    let mut c = Counts::default();
    if !has_svnapot {
        crate::println!("skip contpte_napot_ cases: the harts lack Svnapot (riscv,isa)");
        return c;
    }
    let before = Frames.live();
    let mut s = match kernel_space::<RiscvPaging<L, SVNAPOT>, _>(ram, RiscvMmu::new::<L, SVNAPOT>())
    {
        Ok(s) => s,
        Err(_) => {
            c.case("contpte_napot_setup", || {
                Err(Why("cannot build the Svnapot space", 0))
            });
            return c;
        }
    };
    c.case(
        "contpte_napot_map_folds_and_each_page_reads_its_frame",
        || folds_and_reads(&mut s, k),
    );
    c.case("contpte_napot_partial_change_unfolds_the_run", || {
        partial_change_unfolds(&mut s, k)
    });
    c.case("contpte_napot_store_dirties_the_whole_run", || {
        dirty_over_the_run(&mut s, k)
    });
    c.case("contpte_napot_move_keeps_runs_and_unmap_faults", || {
        move_and_unmap(&mut s, k)
    });
    // SAFETY: the kernel's space is installed (an untagged install fences
    // everything), and no other hart runs this one.
    unsafe { s.deactivate() };
    drop(s);
    c.case("contpte_napot_space_frees_its_tables", || {
        ensure(
            Frames.live() <= before,
            "table frames left after the cases",
            Frames.live(),
        )
    });
    c
}
