//! The bodies of the `contpte_` cases on the test space (see the parent
//! module's docs).

// As in space.rs: failures carry their message inline.
#![allow(clippy::result_large_err)]

use pgtable_core::contract::BbmReason;
use pgtable_core::{Error, LiveOptions, MoveOptions};

use super::*;
use crate::space::expect_permission;

/// `contpte_partial_protect`.
pub(super) fn partial_protect(s: &mut KernelSpace, mem: Mem, _: HwAd) -> R {
    const RO: u64 = 5;
    map_marked(s, WINDOW, mem.pages, PAGES)?;
    expect_folded(s, "after map", WINDOW, 0)?;
    expect_folded(s, "after map", WINDOW + CONT_PTE, 0)?;
    // Stores to every page: the TLB holds their writable translations.
    for p in 0..PAGES {
        store_ok("before the change", WINDOW + p * PAGE + 8, p)?;
    }
    let va = WINDOW + RO * PAGE;
    s.change_protection(VirtAddr(va), PAGE, Prot::READ_ONLY)
        .map_err(|e| Why::new(format_args!("change_protection of one page: {e}")))?;
    expect_unfolded(s, "after protecting one page", WINDOW, 0)?;
    expect_folded(s, "the next run", WINDOW + CONT_PTE, 0)?;
    store_faults("a store to the read-only page", va)?;
    for p in (0..RUN).filter(|&p| p != RO) {
        store_ok("a neighbour in the former run", WINDOW + p * PAGE + 8, !p)?;
    }
    reads_markers("after the change", WINDOW, 0, PAGES)?;
    // A whole run: it stays folded, all its entries read-only.
    s.change_protection(VirtAddr(WINDOW + CONT_PTE), CONT_PTE, Prot::READ_ONLY)
        .map_err(|e| Why::new(format_args!("change_protection of a run: {e}")))?;
    expect_folded(s, "after protecting a whole run", WINDOW + CONT_PTE, 0)?;
    for p in RUN..PAGES {
        store_faults("a store to the read-only run", WINDOW + p * PAGE)?;
    }
    reads_markers("after protecting the run", WINDOW + CONT_PTE, RUN, RUN)
}

/// `contpte_block_run_split`: a page made read-only inside a folded run of
/// level-2 blocks; where the pool holds no whole run of blocks (64 KiB
/// pages: 32 x 512 MiB), inside one block, which must split the same way.
pub(super) fn block_run_split(s: &mut KernelSpace, mem: Mem, _: HwAd) -> R {
    let (blocks, split) = if mem.block_run { (RUN_PMD, 6) } else { (1, 0) };
    s.map(
        VirtAddr(BLOCKS_VA),
        PhysAddr(mem.blocks),
        blocks * BLOCK,
        Prot::READ_WRITE,
        MapOptions::PMD_BLOCKS,
    )
    .map_err(|e| Why::new(format_args!("map the blocks: {e}")))?;
    if mem.block_run {
        expect_folded(s, "after map", BLOCKS_VA, 1)?;
    }
    for b in 0..blocks {
        store_ok("before the change", BLOCKS_VA + b * BLOCK + PAGE + 8, b)?;
    }
    // The second page of block `split` becomes read-only.
    let va = BLOCKS_VA + split * BLOCK + PAGE;
    s.change_protection(VirtAddr(va), PAGE, Prot::READ_ONLY)
        .map_err(|e| Why::new(format_args!("change_protection of a page of a block: {e}")))?;
    let e = entries_at(s, BLOCKS_VA, 1, blocks)?;
    ensure!(
        cont_mask(&e) == 0,
        "after the split: entries {:#06x} of the block run still have the contiguous hint",
        cont_mask(&e)
    );
    for (b, &raw) in e.entries().iter().enumerate() {
        ensure!(
            (b as u64 == split) != is_leaf(raw, 1),
            "after the split: PMD entry {b} is {raw:#x}: expected {}",
            if b as u64 == split {
                "a table"
            } else {
                "a block"
            }
        );
    }
    expect_unfolded(
        s,
        "the split block's run of the page",
        va & !(CONT_PTE - 1),
        0,
    )?;
    store_faults("a store to the read-only page", va)?;
    for b in 0..blocks {
        let at = BLOCKS_VA + b * BLOCK;
        load_is("the earlier store", at + PAGE + 8, b)?;
        store_ok("a neighbour in the former block run", at + 2 * PAGE + 16, b)?;
    }
    store_ok("the page before the read-only one", va - PAGE, 1)
}

/// `contpte_partial_unmap`.
pub(super) fn partial_unmap(s: &mut KernelSpace, mem: Mem, _: HwAd) -> R {
    const HOLE: u64 = 9;
    map_marked(s, WINDOW, mem.pages, PAGES)?;
    expect_folded(s, "after map", WINDOW, 0)?;
    reads_markers("before the unmap", WINDOW, 0, PAGES)?;
    let va = WINDOW + HOLE * PAGE;
    s.unmap(VirtAddr(va), PAGE)
        .map_err(|e| Why::new(format_args!("unmap of one page: {e}")))?;
    let e = run_entries(s, WINDOW, 0)?;
    ensure!(
        cont_mask(&e) == 0,
        "after unmapping one page: entries {:#06x} of its run still have the contiguous hint",
        cont_mask(&e)
    );
    ensure!(
        e.raw[HOLE as usize] == 0,
        "the unmapped entry is {:#x}",
        e.raw[HOLE as usize]
    );
    expect_folded(s, "the next run", WINDOW + CONT_PTE, 0)?;
    load_faults("the unmapped page", va)?;
    for p in (0..RUN).filter(|&p| p != HOLE) {
        load_is("a neighbour in the former run", WINDOW + p * PAGE, MARK ^ p)?;
        store_ok("a neighbour in the former run", WINDOW + p * PAGE + 8, p)?;
    }
    reads_markers("the next run", WINDOW + CONT_PTE, RUN, RUN)?;
    // A whole run goes at once.
    s.unmap(VirtAddr(WINDOW + CONT_PTE), CONT_PTE)
        .map_err(|e| Why::new(format_args!("unmap of a run: {e}")))?;
    for p in RUN..PAGES {
        load_faults("the unmapped run", WINDOW + p * PAGE)?;
    }
    Ok(())
}

/// `contpte_misaligned_move`.
pub(super) fn misaligned_move(s: &mut KernelSpace, mem: Mem, _: HwAd) -> R {
    // Not congruent with the frames modulo a run (they are run aligned).
    const DST: u64 = MOVED + PAGE;
    map_marked(s, WINDOW, mem.pages, PAGES)?;
    expect_folded(s, "after map", WINDOW, 0)?;
    expect_folded(s, "after map", WINDOW + CONT_PTE, 0)?;
    reads_markers("before the move", WINDOW, 0, PAGES)?;
    s.move_page_tables(
        VirtAddr(WINDOW),
        VirtAddr(DST),
        PAGES * PAGE,
        MoveOptions::DEFAULT,
    )
    .map_err(|e| Why::new(format_args!("move_page_tables: {e}")))?;
    // The destination spans three runs there, none of which may fold.
    for r in 0..3 {
        expect_unfolded(s, "the destination", MOVED + r * CONT_PTE, 0)?;
    }
    reads_markers("at the destination", DST, 0, PAGES)?;
    for p in 0..PAGES {
        load_faults("the source", WINDOW + p * PAGE)?;
    }
    store_ok("at the destination", DST + 8, 1)
}

/// `contpte_congruent_move`.
pub(super) fn congruent_move(s: &mut KernelSpace, mem: Mem, _: HwAd) -> R {
    const PART: (u64, u64) = (6, 4);
    map_marked(s, WINDOW, mem.pages, PAGES)?;
    reads_markers("before the move", WINDOW, 0, PAGES)?;
    s.move_page_tables(
        VirtAddr(WINDOW),
        VirtAddr(MOVED),
        PAGES * PAGE,
        MoveOptions::DEFAULT,
    )
    .map_err(|e| Why::new(format_args!("move_page_tables: {e}")))?;
    expect_folded(s, "after a congruent move", MOVED, 0)?;
    expect_folded(s, "after a congruent move", MOVED + CONT_PTE, 0)?;
    reads_markers("at the destination", MOVED, 0, PAGES)?;
    for p in 0..PAGES {
        load_faults("the source", WINDOW + p * PAGE)?;
    }
    // Part of the first run moves on: the rest of it unfolds.
    let from = MOVED + PART.0 * PAGE;
    let to = MOVED2 + PART.0 * PAGE;
    s.move_page_tables(
        VirtAddr(from),
        VirtAddr(to),
        PART.1 * PAGE,
        MoveOptions::DEFAULT,
    )
    .map_err(|e| Why::new(format_args!("move of part of a run: {e}")))?;
    expect_unfolded(s, "the rest of the run", MOVED, 0)?;
    expect_folded(s, "the other run", MOVED + CONT_PTE, 0)?;
    reads_markers("the moved part", to, PART.0, PART.1)?;
    for p in 0..RUN {
        let va = MOVED + p * PAGE;
        if (PART.0..PART.0 + PART.1).contains(&p) {
            load_faults("the moved part's old address", va)?;
        } else {
            load_is("the rest of the run", va, MARK ^ p)?;
            store_ok("the rest of the run", va + 8, p)?;
        }
    }
    Ok(())
}

/// Bit `i`: entry `i` of the run at `va` has the hardware dirty state
/// (`young == false`) or the access flag (`young == true`).
fn ad_mask(s: &KernelSpace, va: u64, young: bool) -> Result<Mask, Why> {
    let e = run_entries(s, va, 0)?;
    Ok(e.entries().iter().enumerate().fold(0, |m, (i, &r)| {
        let set = if young {
            r & AF != 0
        } else {
            is_hw_dirty(r) || r & SW_DIRTY != 0
        };
        m | (Mask::from(set) << i)
    }))
}

/// What pgtable says about the page at `va`: (young, dirty).
fn library_ad(s: &KernelSpace, va: u64) -> Result<(bool, bool), Why> {
    match s.ptep_get(VirtAddr(va)) {
        Some(e) if e.is_present() => Ok((e.young(), e.dirty())),
        _ => fail!("ptep_get({va:#x}) found no present page"),
    }
}

/// A store to page `p` of the run at [`WINDOW`]: the hardware marks an
/// entry of the run dirty, or (`hardware == false`, TCR_EL1.HD clear) the
/// store to the clean page faults and the write fault's software path
/// (`ptep_set_access_flags`) marks it dirty before the store is made
/// again, as a kernel without FEAT_HAFDBS does.
fn dirtying_store(s: &mut KernelSpace, p: u64, v: u64, hardware: bool) -> R {
    let va = WINDOW + p * PAGE + 8;
    if !hardware {
        // SAFETY: the window maps only pool frames of the cases.
        let r = unsafe { probe::write_u64(va, v) };
        expect_permission(
            "a store to a clean page without TCR_EL1.HD",
            r,
            EC_DABT_CUR,
            va,
            true,
        )?;
        s.ptep_set_access_flags(VirtAddr(va & !(PAGE - 1)), FaultFlags::DIRTY)
            .map_err(|e| Why::new(format_args!("ptep_set_access_flags (write): {e}")))?;
    }
    store_ok("a store", va, v)
}

/// A load from page `p` of the run at [`WINDOW`]. Without TCR_EL1.HA
/// (`hardware == false`), a load through an entry whose access flag is
/// clear takes an Access flag fault, and the fault's software path
/// (`ptep_set_access_flags`) sets it before the load is made again.
fn accessing_load(s: &mut KernelSpace, p: u64, hardware: bool) -> R {
    let va = WINDOW + p * PAGE;
    if !hardware
        && s.inspect()
            .entry(VirtAddr(va), 0)
            .is_some_and(|e| e & AF == 0)
    {
        match probe::read_u64(va) {
            Ok(v) => fail!("a load from {va:#x} with the access flag clear and TCR_EL1.HA clear did not fault (read {v:#x})"),
            Err(f) => ensure!(
                f.class() == EC_DABT_CUR && f.esr & 0x3c == 0x08 && f.far == va,
                "a load from {va:#x} with the access flag clear: ESR {:#x} FAR {:#x}, expected an Access flag fault",
                f.esr,
                f.far
            ),
        }
        s.ptep_set_access_flags(VirtAddr(va), FaultFlags::ACCESS)
            .map_err(|e| Why::new(format_args!("ptep_set_access_flags (read): {e}")))?;
    }
    load_is("a load", va, MARK ^ p)
}

/// `contpte_access_dirty_aggregation` (`hardware`) and
/// `contpte_access_dirty_aggregation_software`.
pub(super) fn access_dirty(s: &mut KernelSpace, mem: Mem, hardware: bool) -> R {
    const STORE: u64 = 7;
    const LOAD: u64 = 12;
    const ASK: u64 = 2;
    let ask = WINDOW + ASK * PAGE;
    // User read-write: created clean (writable through DBM, AP[2] set), so
    // the first store needs the dirty-state update. The kernel reaches
    // user pages at EL1 (PAN is off).
    map_marked_prot(s, WINDOW, mem.pages, RUN, USER_RW)?;
    expect_folded(s, "after map", WINDOW, 0)?;
    let dirty0 = ad_mask(s, WINDOW, false)?;
    ensure!(
        dirty0 == 0,
        "entries {dirty0:#06x} are dirty right after map"
    );
    // The TLB gets the load's translation; the store marks an entry of
    // the run dirty.
    accessing_load(s, LOAD, hardware)?;
    dirtying_store(s, STORE, 1, hardware)?;
    let dirty = ad_mask(s, WINDOW, false)?;
    ensure!(dirty != 0, "no entry of the run became dirty after a store");
    let (_, d) = library_ad(s, ask)?;
    ensure!(
        d,
        "ptep_get of page {ASK} says clean, but entries {dirty:#06x} of its run are dirty"
    );
    // The accessed state is cleared over the whole run, and the run
    // flushed: the load's cached translation is gone, so the next load
    // sets the access flag again.
    let was = s
        .test_and_clear_young(VirtAddr(ask))
        .map_err(|e| Why::new(format_args!("test_and_clear_young: {e}")))?;
    ensure!(
        was,
        "test_and_clear_young of page {ASK}: not young after map and accesses"
    );
    let young0 = ad_mask(s, WINDOW, true)?;
    ensure!(
        young0 == 0,
        "after test_and_clear_young entries {young0:#06x} still have the access flag"
    );
    ensure!(
        !library_ad(s, WINDOW + LOAD * PAGE)?.0,
        "ptep_get says young right after test_and_clear_young"
    );
    accessing_load(s, LOAD, hardware)?;
    let young = ad_mask(s, WINDOW, true)?;
    ensure!(
        young != 0,
        "no entry of the run has the access flag after a load (a stale TLB entry?)"
    );
    ensure!(
        library_ad(s, ask)?.0,
        "ptep_get of page {ASK} says old, but entries {young:#06x} of its run have the access flag"
    );
    // The dirty state is cleared over the run and the run flushed: the
    // next store to the same page marks it dirty again.
    s.clear_refs(VirtAddr(WINDOW), CONT_PTE, ClearRefs::DIRTY, |_| {})
        .map_err(|e| Why::new(format_args!("clear_refs: {e}")))?;
    let clean = ad_mask(s, WINDOW, false)?;
    ensure!(
        clean == 0,
        "entries {clean:#06x} are dirty after clear_refs"
    );
    ensure!(
        !library_ad(s, ask)?.1,
        "ptep_get says dirty after clear_refs"
    );
    dirtying_store(s, STORE, 2, hardware)?;
    let dirty2 = ad_mask(s, WINDOW, false)?;
    ensure!(
        dirty2 != 0 && library_ad(s, ask)?.1,
        "after clear_refs a store to page {STORE} left the run clean (entries {dirty2:#06x} dirty; a stale writable TLB entry?)"
    );
    println!(
        "contpte: A/D by {}: a store to page {STORE} dirtied entries {dirty:#06x}, a load from page {LOAD} set the access flag in {young:#06x}; pgtable reports page {ASK} young and dirty",
        if hardware {
            "the hardware (TCR_EL1.HA/HD)"
        } else {
            "the fault path (ptep_set_access_flags)"
        }
    );
    expect_folded(s, "after the accessed/dirty updates", WINDOW, 0)?;
    // Unmapping the run reports every page with the run's state: one
    // entry was marked dirty, but which page was written is not known.
    let mut seen: Mask = 0;
    let mut bad: Option<(u64, Option<PhysAddr>, bool)> = None;
    s.unmap_with(VirtAddr(WINDOW), CONT_PTE, |x| {
        let p = (x.va().0 - WINDOW) / PAGE;
        if p < RUN && x.pa() == Some(PhysAddr(mem.pages + p * PAGE)) && x.dirty() {
            seen |= 1 << p;
        } else {
            bad.get_or_insert((x.va().0, x.pa(), x.dirty()));
        }
    })
    .map_err(|e| Why::new(format_args!("unmap_with: {e}")))?;
    if let Some((va, pa, d)) = bad {
        fail!(
            "unmap_with reported {va:#x} -> {pa:x?}, dirty {d}: expected a dirty page of the run"
        );
    }
    ensure!(
        seen == full(RUN),
        "unmap_with reported pages {seen:#06x} of the run dirty, expected all {RUN}"
    );
    load_faults("the unmapped run", WINDOW + STORE * PAGE)
}

/// `contpte_live_protect_of_part_refused`.
pub(super) fn live_protect_refused(s: &mut KernelSpace, mem: Mem, _: HwAd) -> R {
    const IN_RUN: u64 = 3;
    map_marked(s, WINDOW, mem.pages, RUN)?;
    expect_folded(s, "after map", WINDOW, 0)?;
    let before = run_entries(s, WINDOW, 0)?;
    // In place, one page of a folded run cannot change: its entries
    // would disagree while the hint is set, and unfolding them needs
    // break-before-make, which an in-place change does not allow.
    let va = WINDOW + IN_RUN * PAGE;
    let r = s.change_protection_live(VirtAddr(va), PAGE, Prot::READ_ONLY, LiveOptions::IN_PLACE);
    ensure!(
        r == Err(Error::BreakBeforeMake(
            VirtAddr(va),
            BbmReason::ContiguousRun
        )),
        "protecting one page of a folded run in place: {r:?}, expected BreakBeforeMake({va:#x})"
    );
    let after = run_entries(s, WINDOW, 0)?;
    ensure!(
        before == after,
        "the refused change wrote the run: {before:x?} before, {after:x?} after"
    );
    store_ok("the page after the refused change", va + 8, 1)?;
    // With break-before-make allowed, the run is unfolded and the page
    // changed.
    s.change_protection_live(VirtAddr(va), PAGE, Prot::READ_ONLY, LiveOptions::ALLOW_BBM)
        .map_err(|e| Why::new(format_args!("change_protection_live with BBM: {e}")))?;
    expect_unfolded(s, "after the change with BBM", WINDOW, 0)?;
    store_faults("a store to the page made read-only", va)?;
    store_ok("a neighbour", va + PAGE + 8, 1)?;
    reads_markers("the run", WINDOW, 0, RUN)
}
