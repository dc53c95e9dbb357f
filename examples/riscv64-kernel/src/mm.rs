//! The `mm_` cases: a memory manager's in-place replacements of one PTE
//! (`replace_pte`) in the kernel's installed space, judged by the hart:
//!
//! - `mm_reclaim_full_table_no_alloc`: the 512 pages of one PTE table
//!   swapped out in place while the table allocator refuses every frame
//!   (each returned with its frame and the accessed/dirty state the hart
//!   set, every page then faulting, no table allocated or freed), and
//!   swapped in again, the data there;
//! - `mm_cow_replace`: a read-only page the hart has cached replaced by
//!   its writable copy with one flush: the next load reads the copy (no
//!   stale translation), a store goes through to it, the old frame is
//!   unchanged.

use pgtable_core::contract::NewPte;
use pgtable_core::{AddressSpace, MapOptions, PhysAddr, Prot, VirtAddr};
use pgtable_riscv::{RiscvMmu, RiscvPaging};

use crate::cases::{ensure, Counts, Why, R};
use crate::mem::{case_frame, Frames, CASE_VA};
use crate::space::with_sum;
use crate::trap;

type Kernel<const L: u32> = AddressSpace<RiscvPaging<L>, RiscvMmu, Frames>;

const PAGE: u64 = 4096;
/// User read-write.
const USER_RW: Prot = Prot::WRITE.union(Prot::USER);
/// Where the reclaim case maps its table's 512 pages (2 MiB aligned, in
/// the cases' gigabyte), onto the 512 case frames.
const RECLAIM_VA: u64 = CASE_VA + 0x100_0000;
/// The copy-on-write case's page.
const COW_VA: u64 = CASE_VA + 0x140_0000;

/// Word `i` of the case frame at `pa` (reached at its physical address).
fn word(pa: u64, i: u64) -> u64 {
    // SAFETY: a case frame, RAM nothing else uses while the cases run.
    unsafe { ((pa + 8 * i) as *const u64).read_volatile() }
}

/// Stores `v` into word `i` of the case frame at `pa`.
fn set_word(pa: u64, i: u64, v: u64) {
    // SAFETY: as in `word`.
    unsafe { ((pa + 8 * i) as *mut u64).write_volatile(v) }
}

/// Runs the `mm_` cases on the kernel's installed space `k`.
pub fn run<const L: u32>(k: &mut Kernel<L>) -> Counts {
    let mut c = Counts::default();
    c.case("mm_reclaim_full_table_no_alloc", || reclaim(k));
    c.case("mm_cow_replace", || cow(k));
    c
}

fn reclaim<const L: u32>(k: &mut Kernel<L>) -> R {
    let before = Frames.live();
    // User pages: their writable leaves start clean (a kernel's start
    // dirty), so the D the hart sets shows; the kernel reaches them with
    // SUM set.
    k.map(
        VirtAddr(RECLAIM_VA),
        PhysAddr(case_frame(0)),
        2 << 20,
        USER_RW,
        MapOptions::PAGES,
    )
    .map_err(|_| Why("map of the table's pages failed", RECLAIM_VA))?;
    // Loads from every page (the hart caches them), stores to every third
    // (the hart sets D).
    with_sum(|| {
        for i in 0..512u64 {
            let va = RECLAIM_VA + i * PAGE;
            if i % 3 == 0 {
                // SAFETY: a case frame mapped just above.
                unsafe { trap::write_u64(va + 8, 0xda7a_0000 + i) }
                    .map_err(|c| Why("a store to a page faulted", c))?;
            }
            trap::read_u64(va).map_err(|c| Why("a load from a page faulted", c))?;
        }
        Ok(())
    })?;
    let live = Frames.live();
    Frames.refuse(true);
    let out = swap_out(k);
    Frames.refuse(false);
    out?;
    ensure(
        Frames.live() == live,
        "swap-out changed the table count",
        Frames.live(),
    )?;
    with_sum(|| {
        (0..512u64).try_for_each(|i| {
            let r = trap::read_u64(RECLAIM_VA + i * PAGE);
            ensure(r.is_err(), "a swapped-out page still reads", i)
        })
    })?;
    Frames.refuse(true);
    let back = swap_in(k);
    Frames.refuse(false);
    back?;
    ensure(
        Frames.live() == live,
        "swap-in changed the table count",
        Frames.live(),
    )?;
    with_sum(|| {
        (0..512u64).step_by(3).try_for_each(|i| {
            let r = trap::read_u64(RECLAIM_VA + i * PAGE + 8);
            // The value read, or the fault's cause with bit 63 set.
            let got = r.unwrap_or_else(|c| c | 1 << 63);
            ensure(
                r == Ok(0xda7a_0000 + i),
                "a swapped-in page reads another value",
                got,
            )
        })
    })?;
    k.unmap(VirtAddr(RECLAIM_VA), 2 << 20)
        .map_err(|_| Why("unmap failed", RECLAIM_VA))?;
    ensure(
        Frames.live() <= before,
        "tables left after the case",
        Frames.live(),
    )
}

/// Every page of the reclaim case's table to a swap entry (slot `i`).
fn swap_out<const L: u32>(k: &mut Kernel<L>) -> R {
    for i in 0..512u64 {
        let va = VirtAddr(RECLAIM_VA + i * PAGE);
        let old = k
            .replace_pte(va, NewPte::Swap(i))
            .map_err(|_| Why("replace_pte (swap-out) failed", va.0))?;
        ensure(
            old.pa() == Some(PhysAddr(case_frame(i))) && old.young(),
            "swap-out returned another page, or not accessed",
            i,
        )?;
        ensure(
            old.dirty() == (i % 3 == 0),
            "swap-out returned the wrong dirty state",
            i,
        )?;
        let now = k.ptep_get(va).and_then(|e| e.swap_value());
        ensure(now == Some(i), "the PTE holds another swap slot", i)?;
    }
    Ok(())
}

/// Every swap entry of the reclaim case back to its frame.
fn swap_in<const L: u32>(k: &mut Kernel<L>) -> R {
    for i in 0..512u64 {
        let va = VirtAddr(RECLAIM_VA + i * PAGE);
        let page = NewPte::Page {
            pa: PhysAddr(case_frame(i)),
            prot: USER_RW,
        };
        let old = k
            .replace_pte(va, page)
            .map_err(|_| Why("replace_pte (swap-in) failed", va.0))?;
        ensure(
            old.swap_value() == Some(i),
            "swap-in replaced another entry",
            i,
        )?;
    }
    Ok(())
}

fn cow<const L: u32>(k: &mut Kernel<L>) -> R {
    const DATA: u64 = 0x0c0e_0000_0777;
    const MARK: u64 = 0x0c0b_0000_0001;
    let (f, copy) = (case_frame(0), case_frame(1));
    let before = Frames.live();
    for i in 0..512 {
        set_word(f, i, 0);
    }
    set_word(f, 0, DATA);
    k.map(
        VirtAddr(COW_VA),
        PhysAddr(f),
        PAGE,
        Prot::READ_ONLY,
        MapOptions::PAGES,
    )
    .map_err(|_| Why("map of the shared page failed", COW_VA))?;
    ensure(
        trap::read_u64(COW_VA) == Ok(DATA),
        "the shared page reads wrong",
        f,
    )?;
    // SAFETY: a case frame; the store (which must fault) writes what is there.
    let r = unsafe { trap::write_u64(COW_VA, DATA) };
    ensure(r.is_err(), "a store to the read-only page went through", f)?;
    for i in 0..512 {
        set_word(copy, i, word(f, i));
    }
    set_word(copy, 3, MARK);
    let tables = Frames.live();
    let flushes = k.stats().flushes();
    let new = NewPte::Page {
        pa: PhysAddr(copy),
        prot: Prot::WRITE,
    };
    let old = k
        .replace_pte(VirtAddr(COW_VA), new)
        .map_err(|_| Why("replace_pte (copy-on-write) failed", COW_VA))?;
    let flushed = k.stats().flushes() - flushes;
    ensure(
        old.pa() == Some(PhysAddr(f)),
        "replace_pte returned another frame",
        f,
    )?;
    ensure(
        flushed == 1,
        "the copy-on-write replace did not flush once",
        flushed,
    )?;
    ensure(
        Frames.live() == tables,
        "replace_pte changed the table count",
        Frames.live(),
    )?;
    ensure(
        trap::read_u64(COW_VA + 24) == Ok(MARK),
        "a load read the old frame: stale",
        copy,
    )?;
    // SAFETY: the copy, a case frame.
    unsafe { trap::write_u64(COW_VA + 16, 0x5707e) }
        .map_err(|c| Why("a store to the copy faulted", c))?;
    ensure(
        word(copy, 2) == 0x5707e && word(f, 2) == 0,
        "the store went to the wrong frame",
        word(f, 2),
    )?;
    k.unmap(VirtAddr(COW_VA), PAGE)
        .map_err(|_| Why("unmap failed", COW_VA))?;
    ensure(
        Frames.live() <= before,
        "tables left after the case",
        Frames.live(),
    )
}
