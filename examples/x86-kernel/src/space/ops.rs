//! `space_` cases of operations on live address spaces, checked on the
//! MMU:
//!
//! - fork with copy-on-write (`copy_page_range`, [`CopyMode::Cow`]): the
//!   parent, installed and holding a writable translation, and the child
//!   both read the page, and a store faults (P = 1, W = 1) in both, at CPL
//!   0 (CR0.WP) and CPL 3;
//! - software (swap) entries survive `move_page_tables`, by one page and
//!   with their whole PTE table (a 2 MiB-aligned move that relinks the
//!   table): `ptep_get(..).swap_value()` finds them at the new address, the old address
//!   faults, and `replace_pte` makes the page present;
//! - `change_protection_live` of a kernel data page and of a page of the
//!   linear map inside a block (split in place) RW → RO: a CPL-0 store
//!   faults (CR0.WP), then RW again;
//! - `MmuGather::unmap_with` (two ranges through one gather): every
//!   removed page is reported with the accessed and dirty state the MMU
//!   set, the swap entry with its value, one TLB flush at `finish`, after
//!   which the pages fault.

use core::sync::atomic::{AtomicU64, Ordering::Relaxed};

use pgtable_core::contract::{Arch, Decoded, NewPte, PAGE_SIZE};
use pgtable_core::{AddressSpace, CopyMode, LeafEntry, LiveOptions, MoveOptions, Prot, VirtAddr};
use pgtable_x86::X86Mmu;

use super::multi::{frame, load_faults, loads, map_page, set_word, word};
use super::switch::{with_users, Switcher};
use super::{
    load_user_program, map_user_program, store_faults, user_run_on, Mode, Tally, Why, PF_I, PF_P,
    PF_RSVD, PF_U, PF_W, USER_EXIT,
};
use crate::mem::{phys_to_virt, Frames};
use crate::println;
use crate::trap;

/// The kernel's address space.
type Kernel<A> = AddressSpace<A, X86Mmu, Frames>;

/// The page the fork case copies (lower half, 200 GiB).
const COW_VA: u64 = 0x32_0000_0000;
/// Where the swap case starts (2 MiB aligned, 204 GiB) and where its
/// table moves to (1 GiB further: another PMD table).
const SWAP_OLD: u64 = 0x33_0000_0000;
const SWAP_NEW: u64 = 0x33_4000_0000;

/// Where the unmap-report case maps its pages (lower half, 208 GiB).
const ZAP_VA: u64 = 0x34_0000_0000;

const MAGIC: u64 = 0x0c0e_0000_0000;

/// Runs the cases.
pub fn run<A: Arch>(kernel: &mut Kernel<A>, t: &mut Tally) {
    t.case("space_fork_cow_write_faults", fork_cow_write_faults(kernel));
    t.case(
        "space_swap_entry_survives_move",
        swap_entry_survives_move(kernel),
    );
    t.case("space_live_kernel_protect", live_kernel_protect(kernel));
    t.case("space_unmap_reports", unmap_reports(kernel));
    t.case("mm_prot_none", prot_none(kernel));
}

/// A CPL-3 store to `va` (the user program's load-add-store on it) faults
/// with P = 1, W = 1, U = 1.
fn user_store_faults(what: &str, va: u64) -> Result<(), Why> {
    let t = user_run_on(va, Mode::Load, USER_EXIT);
    ensure!(
        t.vector == 14
            && t.cs & 3 == 3
            && t.cr2 == va
            && t.error & (PF_P | PF_W | PF_U | PF_RSVD | PF_I) == PF_P | PF_W | PF_U,
        "{what}: ring-3 store to {va:#x}: vector {:#x} error {:#x} CR2 {:#x}, expected a write-protection fault",
        t.vector,
        t.error,
        t.cr2
    );
    Ok(())
}

fn fork_cow_write_faults<A: Arch>(kernel: &mut Kernel<A>) -> Result<(), Why> {
    let f = frame(40);
    set_word(f, MAGIC + 40);
    load_user_program();
    with_users::<A, 2>(kernel, |_, [parent, child]| {
        map_user_program(&mut parent.space, false)?;
        map_user_program(&mut child.space, false)?;
        map_page(&mut parent.space, COW_VA, f, Prot::USER | Prot::WRITE)?;
        let mut sw = Switcher::new(12)?;
        sw.switch_user(parent)?;
        // The parent stores at CPL 3: the TLB holds a writable, dirty
        // translation, which the copy must take away.
        let t = user_run_on(COW_VA, Mode::Load, USER_EXIT);
        let want = MAGIC + 41;
        ensure!(
            t.vector == 14 && t.cr2 == USER_EXIT && t.rax == want,
            "parent at CPL 3 before the fork: vector {:#x} CR2 {:#x} rax {:#x}",
            t.vector,
            t.cr2,
            t.rax
        );
        if let Err(e) = parent.space.copy_page_range(
            &mut child.space,
            VirtAddr(COW_VA),
            PAGE_SIZE,
            CopyMode::Cow,
            |_| {},
        ) {
            bail!("copy_page_range: {e}");
        }
        for (who, s) in [("parent", &parent.space), ("child", &child.space)] {
            match s.translate(VirtAddr(COW_VA)) {
                Some(tr) if tr.pa.0 == f && !tr.prot.writable() => {}
                Some(tr) => bail!(
                    "{who}: {COW_VA:#x} -> {:#x} writable {} after the fork",
                    tr.pa.0,
                    tr.prot.writable()
                ),
                None => bail!("{who}: {COW_VA:#x} unmapped after the fork"),
            }
        }
        // The parent is still installed: the write-protection must have
        // been flushed from its TLB.
        loads("parent", COW_VA, want)?;
        store_faults(COW_VA)?;
        user_store_faults("parent", COW_VA)?;
        sw.switch_user(child)?;
        loads("child", COW_VA, want)?;
        store_faults(COW_VA)?;
        user_store_faults("child", COW_VA)?;
        ensure!(word(f) == want, "the shared frame changed: {:#x}", word(f));
        println!(
            "  parent (installed, after a CPL-3 store) forked {COW_VA:#x} copy-on-write: both read {want:#x}; a store faults in both (P = 1, W = 1) at CPL 0 and CPL 3"
        );
        Ok(())
    })
}

/// The table `space`'s PMD entry for `va` links, if any.
fn pmd_table<A: Arch>(space: &AddressSpace<A, X86Mmu, Frames>, va: u64) -> Option<u64> {
    match A::decode(space.inspect().entry(VirtAddr(va), 1)?, 1) {
        Decoded::Table(pa) => Some(pa.0),
        _ => None,
    }
}

fn swap_entry_survives_move<A: Arch>(kernel: &mut Kernel<A>) -> Result<(), Why> {
    const V1: u64 = 0x5_0a91;
    const V2: u64 = 0x5_0a92;
    let (f, fin) = (frame(41), frame(42));
    set_word(f, MAGIC + 41);
    set_word(fin, MAGIC + 42);
    let p = |i: u64| i * PAGE_SIZE;
    with_users::<A, 1>(kernel, |_, [u]| {
        map_page(&mut u.space, SWAP_OLD, f, Prot::USER | Prot::WRITE)?;
        let s = &mut u.space;
        for (va, v) in [(SWAP_OLD + p(3), V1), (SWAP_OLD + p(5), V2)] {
            if let Err(e) = s.install_pte(VirtAddr(va), NewPte::Swap(v)) {
                bail!("install_pte (software entry) {va:#x}: {e}");
            }
        }
        let mut sw = Switcher::new(12)?;
        sw.switch_user(u)?;
        let s = &mut u.space;
        loads("before the moves", SWAP_OLD, MAGIC + 41)?;
        load_faults("a swap entry", SWAP_OLD + p(3))?;
        // One page, entry by entry (the PTE path).
        if let Err(e) = s.move_page_tables(
            VirtAddr(SWAP_OLD + p(5)),
            VirtAddr(SWAP_OLD + p(9)),
            PAGE_SIZE,
            MoveOptions::DEFAULT,
        ) {
            bail!("move of one page: {e}");
        }
        ensure!(
            s.ptep_get(VirtAddr(SWAP_OLD + p(9)))
                .and_then(|e| e.swap_value())
                == Some(V2)
                && s.ptep_get(VirtAddr(SWAP_OLD + p(5)))
                    .and_then(|e| e.swap_value())
                    .is_none(),
            "after the page move: new {:?}, old {:?}",
            s.ptep_get(VirtAddr(SWAP_OLD + p(9)))
                .and_then(|e| e.swap_value()),
            s.ptep_get(VirtAddr(SWAP_OLD + p(5)))
                .and_then(|e| e.swap_value())
        );
        // The whole PTE table: 2 MiB aligned on both sides.
        let table = pmd_table(s, SWAP_OLD);
        if let Err(e) = s.move_page_tables(
            VirtAddr(SWAP_OLD),
            VirtAddr(SWAP_NEW),
            2 << 20,
            MoveOptions::DEFAULT,
        ) {
            bail!("move of 2 MiB: {e}");
        }
        ensure!(
            table.is_some() && pmd_table(s, SWAP_NEW) == table && pmd_table(s, SWAP_OLD).is_none(),
            "the PTE table {table:x?} was not moved whole: at the new PMD entry {:x?}, at the old {:x?}",
            pmd_table(s, SWAP_NEW),
            pmd_table(s, SWAP_OLD)
        );
        let got = [
            s.ptep_get(VirtAddr(SWAP_NEW + p(3)))
                .and_then(|e| e.swap_value()),
            s.ptep_get(VirtAddr(SWAP_NEW + p(9)))
                .and_then(|e| e.swap_value()),
            s.ptep_get(VirtAddr(SWAP_OLD + p(3)))
                .and_then(|e| e.swap_value()),
            s.ptep_get(VirtAddr(SWAP_OLD + p(9)))
                .and_then(|e| e.swap_value()),
        ];
        ensure!(
            got == [Some(V1), Some(V2), None, None],
            "swap entries after the table move (new 3, new 9, old 3, old 9): {got:x?}"
        );
        load_faults("the old address of the moved page", SWAP_OLD)?;
        loads("the new address of the moved page", SWAP_NEW, MAGIC + 41)?;
        load_faults("a moved swap entry", SWAP_NEW + p(3))?;
        let page_in = NewPte::Page {
            pa: pgtable_core::PhysAddr(fin),
            prot: Prot::USER | Prot::WRITE,
        };
        match s.replace_pte(VirtAddr(SWAP_NEW + p(3)), page_in) {
            Ok(old) => ensure!(
                old.swap_value() == Some(V1),
                "replace_pte returned {old:?}, expected the swap entry {V1:#x}"
            ),
            Err(e) => bail!("replace_pte (swap-in): {e}"),
        }
        loads("the swapped-in page", SWAP_NEW + p(3), MAGIC + 42)?;
        println!(
            "  swap entries {V1:#x}, {V2:#x}: moved by one page, then with their PTE table (at {:#x}) from {SWAP_OLD:#x} to {SWAP_NEW:#x}; found at the new addresses, the old ones fault, replace_pte maps the page",
            table.unwrap_or(0)
        );
        Ok(())
    })
}

/// A page of kernel data nothing else uses.
#[repr(C, align(4096))]
struct DataPage([AtomicU64; 512]);

static LIVE_PAGE: DataPage = DataPage([const { AtomicU64::new(0) }; 512]);

/// A store to `va` succeeds.
fn store_works(what: &str, va: u64) -> Result<(), Why> {
    let v = match trap::read_u64(va) {
        Ok(v) => v,
        Err(f) => bail!("{what}: load from {va:#x} faulted: error {:#x}", f.error),
    };
    // SAFETY: `va` is LIVE_PAGE or the linear-map page of a SPACE_FRAMES
    // frame, which only this case uses; the value stored is the one read.
    match unsafe { trap::write_u64(va, v) } {
        Ok(()) => Ok(()),
        Err(f) => bail!("{what}: store to {va:#x} faulted: error {:#x}", f.error),
    }
}

/// `va` changed to `prot` live, in place.
fn protect_live<A: Arch>(kernel: &mut Kernel<A>, va: u64, prot: Prot) -> Result<(), Why> {
    match kernel.change_protection_live(VirtAddr(va), PAGE_SIZE, prot, LiveOptions::IN_PLACE) {
        Ok(()) => Ok(()),
        Err(e) => bail!("change_protection_live {va:#x}: {e}"),
    }
}

fn live_kernel_protect<A: Arch>(kernel: &mut Kernel<A>) -> Result<(), Why> {
    let data = &raw const LIVE_PAGE as u64;
    LIVE_PAGE.0[0].store(MAGIC, Relaxed);
    let linear = phys_to_virt(frame(50));
    let neighbour = phys_to_virt(frame(51));
    let height = |k: &Kernel<A>, va| k.translate(VirtAddr(va)).map(|t| t.height);
    let block = height(kernel, linear);
    ensure!(
        matches!(block, Some(h) if h > 0),
        "the linear map's page {linear:#x} is not in a block: height {block:?}"
    );
    for va in [data, linear] {
        store_works("before", va)?;
        protect_live(kernel, va, Prot::GLOBAL)?;
        loads("read-only", va, trap::read_u64(va).unwrap_or(!0))?;
        store_faults(va)?;
        if va == linear {
            ensure!(
                height(kernel, va) == Some(0),
                "{va:#x} was not split to a page: height {:?}",
                height(kernel, va)
            );
            store_works("the neighbour in the split block", neighbour)?;
        }
        protect_live(kernel, va, Prot::WRITE | Prot::GLOBAL)?;
        store_works("writable again", va)?;
    }
    ensure!(
        LIVE_PAGE.0[0].load(Relaxed) == MAGIC,
        "the data page changed"
    );
    println!(
        "  kernel data page {data:#x} and linear-map page {linear:#x} (in a height-{} block, split in place): RW -> RO (a CPL-0 store faults, CR0.WP) -> RW",
        block.unwrap_or(0)
    );
    Ok(())
}

/// `mprotect(PROT_NONE)` of a kernel data page and back (Linux
/// `PAGE_NONE`: P clear, `_PAGE_PROTNONE` in bit 8): CPL-0 loads and
/// stores take not-present faults (P = 0 in the error code: the writable
/// translation the TLB held is flushed and the entry is not present to
/// the walker), while `ptep_get` and `translate` still report the page's
/// frame; the change back finds the data.
fn prot_none<A: Arch>(kernel: &mut Kernel<A>) -> Result<(), Why> {
    let page = &raw const LIVE_PAGE as u64;
    let va = page + 8;
    let Some(before) = kernel.translate(VirtAddr(page)) else {
        bail!("{page:#x} is not mapped");
    };
    LIVE_PAGE.0[1].store(MAGIC + 1, Relaxed);
    // The TLB holds the writable translation.
    store_works("before", va)?;
    let protect = |kernel: &mut Kernel<A>, prot: Prot| match kernel.change_protection(
        VirtAddr(page),
        PAGE_SIZE,
        prot,
    ) {
        Ok(()) => Ok(()),
        Err(e) => bail!("change_protection {page:#x} to {prot:?}: {e}"),
    };
    protect(kernel, Prot::NONE)?;
    let closed = (|| {
        load_faults("the PROT_NONE page", va)?;
        // SAFETY: LIVE_PAGE is atomics only the cases touch, and the value
        // stored is the one already there.
        match unsafe { trap::write_u64(va, MAGIC + 1) } {
            Ok(()) => bail!("a store to the PROT_NONE page at {va:#x} went through"),
            Err(f) => super::expect_fault(f, va, PF_W, PF_P | PF_U | PF_RSVD | PF_I)?,
        }
        Ok(())
    })();
    let e = kernel.ptep_get(VirtAddr(page));
    let reported = e.map(|e| (e.is_present(), e.prot(), e.pa()));
    let t = kernel.translate(VirtAddr(page)).map(|t| (t.pa, t.prot));
    let back = protect(kernel, Prot::WRITE | Prot::GLOBAL);
    closed?;
    back?;
    ensure!(
        reported == Some((true, Some(Prot::NONE), Some(before.pa))),
        "ptep_get of the PROT_NONE page: {reported:x?}, expected present, NONE, {:#x}",
        before.pa.0
    );
    ensure!(
        t == Some((before.pa, Prot::NONE)),
        "translate of the PROT_NONE page: {t:x?}"
    );
    loads("opened again", va, MAGIC + 1)?;
    store_works("opened again", va)?;
    println!("  kernel data page {page:#x}: RW -> PROT_NONE (CPL-0 loads and stores fault not-present, the frame still reported) -> RW");
    Ok(())
}

/// What one report of `unmap_with` said: `(va, present, pa, young, dirty,
/// swap value)`.
type Report = (u64, bool, Option<u64>, bool, bool, Option<u64>);

fn unmap_reports<A: Arch>(kernel: &mut Kernel<A>) -> Result<(), Why> {
    const SWAP: u64 = 0x5_0a93;
    // Accessed and dirty (Intel SDM vol. 3A §4.8).
    const ACCESSED: u64 = 1 << 5;
    const DIRTY: u64 = 1 << 6;
    let p = |i: u64| ZAP_VA + i * PAGE_SIZE;
    for i in 0..4 {
        set_word(frame(60 + i), MAGIC + 60 + i);
    }
    with_users::<A, 1>(kernel, |_, [u]| {
        for i in 0..4 {
            map_page(&mut u.space, p(i), frame(60 + i), Prot::USER | Prot::WRITE)?;
        }
        if let Err(e) = u.space.install_pte(VirtAddr(p(5)), NewPte::Swap(SWAP)) {
            bail!("install_pte (software entry): {e}");
        }
        let fresh: [u64; 3] = core::array::from_fn(|i| {
            u.space
                .inspect()
                .entry(VirtAddr(p(i as u64)), 0)
                .unwrap_or(0)
        });
        let mut sw = Switcher::new(12)?;
        sw.switch_user(u)?;
        // Page 0 loaded, page 1 stored to, page 2 untouched: the MMU sets
        // the accessed and dirty bits, which the reports must carry.
        loads("page 0", p(0), MAGIC + 60)?;
        // SAFETY: page 1 of ZAP_VA maps a SPACE_FRAMES frame of this case.
        if let Err(f) = unsafe { trap::write_u64(p(1), MAGIC + 0x100) } {
            bail!("store to {:#x} faulted: error {:#x}", p(1), f.error);
        }
        loads("page 3", p(3), MAGIC + 63)?;
        let s = &mut u.space;
        let mut rep: [Report; 8] = [(0, false, None, false, false, None); 8];
        let mut n = 0;
        let mut note = |r: LeafEntry<A>| {
            if n < rep.len() {
                rep[n] = (
                    r.va().0,
                    r.is_present(),
                    r.pa().map(|a| a.0),
                    r.young(),
                    r.dirty(),
                    A::swp_value(r.raw()),
                );
            }
            n += 1;
        };
        let flushes = s.stats().flushes();
        let mut tlb = s.tlb_gather_mmu();
        let r = tlb
            .unmap_with(VirtAddr(p(0)), 3 * PAGE_SIZE, &mut note)
            .and_then(|()| tlb.unmap_with(VirtAddr(p(4)), 2 * PAGE_SIZE, &mut note));
        let flushes_before_finish = tlb.space().stats().flushes() - flushes;
        tlb.finish();
        if let Err(e) = r {
            bail!("MmuGather::unmap_with: {e}");
        }
        let flushed = s.stats().flushes() - flushes;
        ensure!(
            flushes_before_finish == 0 && flushed == 1,
            "{flushes_before_finish} flushes before finish, {flushed} in all (expected 0 and 1)"
        );
        for i in [0, 1, 2, 4, 5] {
            load_faults("after the unmap", p(i))?;
        }
        loads("page 3 (not unmapped)", p(3), MAGIC + 63)?;
        let a_fresh = fresh.iter().all(|&e| e & (ACCESSED | DIRTY) == 0);
        let want: [Report; 4] = [
            (p(0), true, Some(frame(60)), true, false, None),
            (p(1), true, Some(frame(61)), true, true, None),
            (p(2), true, Some(frame(62)), !a_fresh, false, None),
            (p(5), false, None, false, false, Some(SWAP)),
        ];
        ensure!(
            n == 4 && rep[..4] == want,
            "{n} reports {:x?}, expected {want:x?}",
            &rep[..n.min(8)]
        );
        ensure!(
            word(frame(61)) == MAGIC + 0x100,
            "the store to page 1 did not reach its frame"
        );
        println!(
            "  MmuGather::unmap_with of 3 pages and a swap entry, one flush at finish: reports {} (accessed/dirty as the MMU set them{}), then every page faults",
            "page 0 accessed, page 1 accessed+dirty, page 2 clean, swap entry 0x50a93",
            if a_fresh { ", from clear entries" } else { "" }
        );
        Ok(())
    })
}
