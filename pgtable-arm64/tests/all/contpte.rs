//! Contiguous mappings (Arm ARM D8.6.1 "Contiguous bit"; Linux
//! `arch/arm64/mm/contpte.c`) on the simulator: folding on map, unfolding
//! before a change to part of a run, whole-run changes, accessed/dirty
//! aggregation and moves; `contpte_sim.rs` has the simulator's own checks.

use pgtable_arm64::format::is_contiguous;
use pgtable_arm64::Arm64;
use pgtable_core::contract::{Access, BbmReason, Format, NewPte};
use pgtable_core::{
    sim::{Installed, SimAlloc, SimMachine, SimMmu},
    MoveOptions,
};
use pgtable_core::{
    AddressSpace, ClearRefs, CopyMode, Error, FaultFlags, LeafEntry, LiveOptions, MapOptions,
    MemType, PhysAddr, Prot, VirtAddr,
};

const PAGE: u64 = 4096;
const RUN: u64 = 16 * PAGE;
const PMD_RUN: u64 = 16 * (2 << 20);
const VA: VirtAddr = VirtAddr(1 << 30);
const PA: PhysAddr = PhysAddr(0x4000_0000);

type Space = Installed<Arm64, SimMmu<Arm64>, SimAlloc>;

fn machine() -> (SimMachine<Arm64>, Space) {
    let m = SimMachine::<Arm64>::new();
    let s = AddressSpace::new(m.mmu(), m.alloc()).unwrap();
    // SAFETY: a simulated MMU.
    (m.clone(), unsafe { Installed::new(s) })
}

/// The contiguous hint of the leaf at `height` for every entry of
/// `[va, va + len)`, one flag per entry.
fn hints(s: &Space, va: VirtAddr, len: u64, height: u32) -> Vec<bool> {
    let step = 1u64 << (12 + 9 * height);
    (0..len / step)
        .map(|k| is_contiguous(s.inspect().entry(va.add(k * step), height).unwrap()))
        .collect()
}

#[test]
fn contpte_map_folds_whole_aligned_runs_only() {
    let (m, mut s) = machine();
    // 3 pages before the first run boundary, two whole runs, 5 pages after.
    let va = VA.add(RUN - 3 * PAGE);
    let len = 3 * PAGE + 2 * RUN + 5 * PAGE;
    s.map(
        va,
        PhysAddr(PA.0 + RUN - 3 * PAGE),
        len,
        Prot::READ_WRITE,
        MapOptions::PAGES,
    )
    .unwrap();
    let h = hints(&s, va, len, 0);
    let want: Vec<bool> = (0..len / PAGE).map(|k| (3..35).contains(&k)).collect();
    assert_eq!(h, want);
    // Every page still translates to its own address.
    for k in 0..len / PAGE {
        let (pa, _) = m.access(va.add(k * PAGE), Access::READ).unwrap();
        assert_eq!(pa.0, PA.0 + RUN - 3 * PAGE + k * PAGE);
    }
    m.check().unwrap();
}

#[test]
fn contpte_map_opt_out_and_misaligned_physical_do_not_fold() {
    let (m, mut s) = machine();
    s.map(
        VA,
        PA,
        4 * RUN,
        Prot::READ_WRITE,
        MapOptions::PAGES.no_contiguous(),
    )
    .unwrap();
    assert!(hints(&s, VA, 4 * RUN, 0).iter().all(|&c| !c));
    // Physical address 4 KiB off the run alignment: no run maps an aligned
    // physical run.
    let va2 = VA.add(8 * RUN);
    s.map(
        va2,
        PhysAddr(PA.0 + 64 * RUN + PAGE),
        4 * RUN,
        Prot::READ_WRITE,
        MapOptions::PAGES,
    )
    .unwrap();
    assert!(hints(&s, va2, 4 * RUN, 0).iter().all(|&c| !c));
    // Two halves of one run, mapped by two calls (with different
    // attributes, or not): neither call covers the run, nothing folds.
    let va3 = VA.add(16 * RUN);
    s.map(
        va3,
        PhysAddr(PA.0 + 128 * RUN),
        RUN / 2,
        Prot::READ_WRITE,
        MapOptions::PAGES,
    )
    .unwrap();
    s.map(
        va3.add(RUN / 2),
        PhysAddr(PA.0 + 128 * RUN + RUN / 2),
        RUN / 2,
        Prot::READ_ONLY,
        MapOptions::PAGES,
    )
    .unwrap();
    assert!(hints(&s, va3, RUN, 0).iter().all(|&c| !c));
    m.check().unwrap();
}

#[test]
fn contpte_map_folds_pmd_block_runs() {
    let (m, mut s) = machine();
    // 2 MiB blocks: one block before a 32 MiB boundary, one whole run.
    let va = VirtAddr(PMD_RUN * 4 - (2 << 20));
    let len = (2 << 20) + PMD_RUN;
    s.map(
        va,
        PhysAddr(PMD_RUN * 8 - (2 << 20)),
        len,
        Prot::READ_WRITE,
        MapOptions::BLOCKS,
    )
    .unwrap();
    let h = hints(&s, va, len, 1);
    let want: Vec<bool> = (0..17).map(|k| k > 0).collect();
    assert_eq!(h, want);
    m.check().unwrap();
}

#[test]
fn contpte_partial_protect_unfolds_the_run_whole_run_protect_keeps_it() {
    let (m, mut s) = machine();
    s.map(VA, PA, 4 * RUN, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    // Fill the TLB with the runs' translations.
    for k in 0..4 * RUN / PAGE {
        m.access(VA.add(k * PAGE), Access::READ).unwrap();
    }
    // One page of the first run: that run is unfolded, the others stay.
    s.change_protection(VA.add(PAGE), PAGE, Prot::READ_ONLY)
        .unwrap();
    m.check().unwrap();
    let h = hints(&s, VA, 4 * RUN, 0);
    assert!(h[..16].iter().all(|&c| !c), "{h:?}");
    assert!(h[16..].iter().all(|&c| c), "{h:?}");
    assert_eq!(s.translate(VA.add(PAGE)).unwrap().prot, Prot::READ_ONLY);
    assert_eq!(s.translate(VA).unwrap().prot, Prot::READ_WRITE);
    // Two whole runs: all 32 entries change and keep the hint.
    s.change_protection(VA.add(RUN), 2 * RUN, Prot::READ_ONLY)
        .unwrap();
    m.check().unwrap();
    let h = hints(&s, VA, 4 * RUN, 0);
    assert!(h[16..].iter().all(|&c| c), "{h:?}");
    for k in 16..48 {
        assert_eq!(s.translate(VA.add(k * PAGE)).unwrap().prot, Prot::READ_ONLY);
    }
    assert_eq!(
        s.translate(VA.add(48 * PAGE)).unwrap().prot,
        Prot::READ_WRITE
    );
}

fn user_rw() -> Prot {
    Prot::USER | Prot::WRITE
}

/// Loads every page of `[va, va + len)` through the simulated TLB.
fn touch(m: &SimMachine<Arm64>, va: VirtAddr, len: u64) {
    for k in 0..len / PAGE {
        m.access(va.add(k * PAGE), Access::READ).unwrap();
    }
}

/// Every entry of the tables below `va` (PTE level), for byte-exact
/// comparisons.
fn ptes(s: &Space, va: VirtAddr, len: u64) -> Vec<Option<u64>> {
    (0..len / PAGE)
        .map(|k| s.inspect().entry(va.add(k * PAGE), 0))
        .collect()
}

#[test]
fn contpte_partial_unmap_unfolds_the_run_and_keeps_the_rest() {
    let (m, mut s) = machine();
    s.map(VA, PA, 2 * RUN, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    touch(&m, VA, 2 * RUN);
    assert!(m.tlb_holds_run(VA));
    s.unmap(VA.add(5 * PAGE), PAGE).unwrap();
    m.check().unwrap();
    let h = hints(&s, VA, 2 * RUN, 0);
    assert!(h[..16].iter().all(|&c| !c), "{h:?}");
    assert!(h[16..].iter().all(|&c| c), "{h:?}");
    assert!(s.translate(VA.add(5 * PAGE)).is_none());
    for k in (0..32).filter(|&k| k != 5) {
        assert_eq!(s.translate(VA.add(k * PAGE)).unwrap().pa.0, PA.0 + k * PAGE);
    }
    touch(&m, VA.add(16 * PAGE), RUN);
    // A whole run unmapped whole: nothing left, nothing to unfold.
    s.unmap(VA.add(RUN), RUN).unwrap();
    m.check().unwrap();
    assert!(s.translate(VA.add(RUN)).is_none());
}

#[test]
fn contpte_block_split_unfolds_the_pmd_run() {
    let (m, mut s) = machine();
    let va = VirtAddr(PMD_RUN * 2);
    s.map(
        va,
        PhysAddr(PMD_RUN * 4),
        PMD_RUN,
        Prot::READ_WRITE,
        MapOptions::BLOCKS,
    )
    .unwrap();
    assert!(hints(&s, va, PMD_RUN, 1).iter().all(|&c| c));
    // Touch every block (one TLB entry for the 32 MiB run).
    for k in 0..16 {
        m.access(va.add(k * (2 << 20)), Access::READ).unwrap();
    }
    assert!(m.tlb_holds_run(va));
    // One page in the third block: that block is split into pages, and
    // its 15 siblings lose the hint too.
    let at = va.add(2 * (2 << 20) + PAGE);
    s.change_protection(at, PAGE, Prot::READ_ONLY).unwrap();
    m.check().unwrap();
    assert_eq!(s.translate(at).unwrap().height, 0);
    for k in (0..16).filter(|&k| k != 2) {
        let raw = s.inspect().entry(va.add(k * (2 << 20)), 1).unwrap();
        assert!(!is_contiguous(raw), "sibling block {k} keeps the hint");
    }
    assert!(hints(&s, va.add(2 * (2 << 20)), 2 << 20, 0)
        .iter()
        .all(|&c| !c));
    assert_eq!(s.translate(at).unwrap().prot, Prot::READ_ONLY);
    assert_eq!(s.translate(at.add(PAGE)).unwrap().prot, Prot::READ_WRITE);
}

#[test]
fn contpte_dirty_on_one_entry_is_reported_for_the_whole_run() {
    let (m, mut s) = machine();
    s.map(VA, PA, 2 * RUN, user_rw(), MapOptions::PAGES)
        .unwrap();
    // The hardware (FEAT_HAFDBS) marks the one entry it walked: page 7.
    let u = m.hw_touch(VA.add(7 * PAGE), true).unwrap();
    assert!(u.dirty);
    assert!(Arm64::is_dirty(
        s.inspect().entry(VA.add(7 * PAGE), 0).unwrap()
    ));
    assert!(!Arm64::is_dirty(
        s.inspect().entry(VA.add(3 * PAGE), 0).unwrap()
    ));
    for k in 0..16 {
        let e = s.ptep_get(VA.add(k * PAGE)).unwrap();
        assert!(e.dirty() && e.young(), "page {k}");
        assert!(Arm64::is_dirty(
            s.translate(VA.add(k * PAGE)).unwrap().entry
        ));
    }
    // The other run is clean.
    assert!(!s.ptep_get(VA.add(RUN)).unwrap().dirty());
    let mut walked = 0;
    s.walk(VA, 2 * RUN, |mp| {
        walked += u64::from(Arm64::is_dirty(mp.entry))
    })
    .unwrap();
    assert_eq!(walked, 16);
    // unmap_with reports every page of the run dirty (a whole table and a
    // partial one, both paths).
    let mut dirty = Vec::new();
    s.unmap_with(VA, 2 * RUN, |r| dirty.push((r.va(), r.dirty())))
        .unwrap();
    m.check().unwrap();
    dirty.sort();
    assert_eq!(dirty.len(), 32);
    for (k, (va, d)) in dirty.iter().enumerate() {
        assert_eq!(*va, VA.add(k as u64 * PAGE));
        assert_eq!(*d, k < 16, "page {k}");
    }
}

#[test]
fn contpte_unmap_with_of_a_whole_table_reports_the_run_state() {
    let (m, mut s) = machine();
    // A whole PTE table (2 MiB of pages): unmapped by unlinking the table.
    let va = VirtAddr(1 << 30);
    s.map(va, PA, 2 << 20, user_rw(), MapOptions::PAGES)
        .unwrap();
    m.hw_touch(va.add(9 * PAGE), true).unwrap();
    m.hw_touch(va.add(20 * RUN + 3 * PAGE), true).unwrap();
    let mut dirty = Vec::new();
    s.unmap_with(va, 2 << 20, |r| {
        if r.dirty() {
            dirty.push(r.va())
        }
    })
    .unwrap();
    m.check().unwrap();
    dirty.sort();
    let want: Vec<VirtAddr> = (0..16)
        .map(|k| va.add(k * PAGE))
        .chain((0..16).map(|k| va.add(20 * RUN + k * PAGE)))
        .collect();
    assert_eq!(dirty, want);
}

#[test]
fn contpte_harvesting_clears_young_over_the_run() {
    let (m, mut s) = machine();
    s.map(VA, PA, 2 * RUN, user_rw(), MapOptions::PAGES)
        .unwrap();
    // New leaves are young; clear one page: the whole run turns old.
    assert!(s.test_and_clear_young(VA.add(4 * PAGE)).unwrap());
    m.check().unwrap();
    for k in 0..16 {
        assert!(
            !Arm64::is_young(s.inspect().entry(VA.add(k * PAGE), 0).unwrap()),
            "page {k}"
        );
        assert!(!s.ptep_get(VA.add(k * PAGE)).unwrap().young());
    }
    assert!(s.ptep_get(VA.add(RUN)).unwrap().young());
    assert!(hints(&s, VA, 2 * RUN, 0).iter().all(|&c| c));
    // The hardware sets AF on the page it touches; the run reads young.
    m.hw_touch(VA.add(11 * PAGE), false).unwrap();
    assert!(s.ptep_get(VA.add(2 * PAGE)).unwrap().young());
    // clear_refs of one page reports it young, clears the whole run.
    let mut seen = Vec::new();
    s.clear_refs(VA.add(2 * PAGE), PAGE, ClearRefs::YOUNG, |e| {
        seen.push((e.va(), e.young()))
    })
    .unwrap();
    m.check().unwrap();
    assert_eq!(seen, vec![(VA.add(2 * PAGE), true)]);
    for k in 0..16 {
        assert!(
            !Arm64::is_young(s.inspect().entry(VA.add(k * PAGE), 0).unwrap()),
            "page {k}"
        );
    }
    // And the next access through the run sets it again.
    m.hw_touch(VA.add(PAGE), false).unwrap();
    assert!(s.test_and_clear_young(VA.add(15 * PAGE)).unwrap());
    m.check().unwrap();
}

#[test]
fn contpte_set_access_flags_applies_to_the_whole_run() {
    let (m, mut s) = machine();
    s.map(VA, PA, RUN, user_rw(), MapOptions::PAGES).unwrap();
    touch(&m, VA, RUN);
    assert!(s
        .ptep_set_access_flags(VA.add(3 * PAGE), FaultFlags::WRITE)
        .unwrap());
    m.check().unwrap();
    for k in 0..16 {
        let raw = s.inspect().entry(VA.add(k * PAGE), 0).unwrap();
        assert!(Arm64::is_dirty(raw) && is_contiguous(raw), "page {k}");
    }
    // Nothing left to do: a spurious fault.
    assert!(!s
        .ptep_set_access_flags(VA.add(9 * PAGE), FaultFlags::WRITE)
        .unwrap());
}

#[test]
fn contpte_congruent_move_keeps_runs_folded() {
    let (m, mut s) = machine();
    let len = 3 * RUN;
    s.map(VA, PA, len, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    touch(&m, VA, len);
    // 64 KiB-congruent but not 2 MiB-congruent: entries are moved one by
    // one, and the runs stay folded.
    let dst = VA.add(64 << 20).add(5 * RUN);
    s.move_page_tables(VA, dst, len, MoveOptions::DEFAULT)
        .unwrap();
    m.check().unwrap();
    assert!(hints(&s, dst, len, 0).iter().all(|&c| c));
    touch(&m, dst, len);
    assert!(m.tlb_holds_run(dst.add(RUN)));
    for k in 0..len / PAGE {
        assert_eq!(
            s.translate(dst.add(k * PAGE)).unwrap().pa.0,
            PA.0 + k * PAGE
        );
    }
    // Part of a run, congruent: the source run is unfolded first.
    let dst2 = dst.add(128 << 20);
    s.move_page_tables(
        dst.add(RUN + 4 * PAGE),
        dst2.add(RUN + 4 * PAGE),
        RUN,
        MoveOptions::DEFAULT,
    )
    .unwrap();
    m.check().unwrap();
    assert!(hints(&s, dst2.add(RUN + 4 * PAGE), RUN, 0)
        .iter()
        .all(|&c| !c));
    assert!(hints(&s, dst, RUN + 4 * PAGE, 0)
        .iter()
        .skip(16)
        .all(|&c| !c));
    assert!(hints(&s, dst, RUN, 0).iter().all(|&c| c));
}

#[test]
fn contpte_non_congruent_move_unfolds_runs() {
    let (m, mut s) = machine();
    let len = 3 * RUN;
    s.map(VA, PA, len, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    touch(&m, VA, len);
    let dst = VA.add(64 << 20).add(3 * PAGE);
    s.move_page_tables(VA, dst, len, MoveOptions::DEFAULT)
        .unwrap();
    m.check().unwrap();
    assert!(hints(&s, dst, len, 0).iter().all(|&c| !c));
    touch(&m, dst, len);
    for k in 0..len / PAGE {
        assert_eq!(
            s.translate(dst.add(k * PAGE)).unwrap().pa.0,
            PA.0 + k * PAGE
        );
    }
    m.check().unwrap();
}

#[test]
fn contpte_memory_type_change_of_whole_runs_breaks_the_run_at_once() {
    let (m, mut s) = machine();
    s.map(VA, PA, 2 * RUN, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    touch(&m, VA, 2 * RUN);
    let nc = Prot::READ_WRITE.with_mem(MemType::NormalNonCacheable);
    s.change_protection(VA, 2 * RUN, nc).unwrap();
    m.check().unwrap();
    assert!(hints(&s, VA, 2 * RUN, 0).iter().all(|&c| c));
    touch(&m, VA, 2 * RUN);
    assert_eq!(s.translate(VA.add(7 * PAGE)).unwrap().prot, nc);
    m.check().unwrap();
}

#[test]
fn contpte_live_change_of_part_of_a_run_needs_break_before_make() {
    let (m, mut s) = machine();
    s.map(VA, PA, 2 * RUN, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    touch(&m, VA, 2 * RUN);
    let before = ptes(&s, VA, 2 * RUN);
    assert_eq!(
        s.change_protection_live(VA.add(PAGE), PAGE, Prot::READ_ONLY, LiveOptions::IN_PLACE),
        Err(Error::BreakBeforeMake(
            VA.add(PAGE),
            BbmReason::ContiguousRun
        ))
    );
    assert_eq!(ptes(&s, VA, 2 * RUN), before);
    // Whole runs: in place, folded.
    s.change_protection_live(VA, 2 * RUN, Prot::READ_ONLY, LiveOptions::IN_PLACE)
        .unwrap();
    m.check().unwrap();
    assert!(hints(&s, VA, 2 * RUN, 0).iter().all(|&c| c));
    // Allowed: the run is unfolded with break-before-make.
    s.change_protection_live(VA.add(PAGE), PAGE, Prot::READ_WRITE, LiveOptions::ALLOW_BBM)
        .unwrap();
    m.check().unwrap();
    assert!(hints(&s, VA, RUN, 0).iter().all(|&c| !c));
    assert_eq!(s.translate(VA.add(PAGE)).unwrap().prot, Prot::READ_WRITE);
}

/// A live change refused for break-before-make names the first address in
/// walk order that cannot be changed in place: here the whole first run
/// (a memory-type change), before the partly covered second run.
#[test]
fn contpte_live_refusal_names_the_first_address_in_walk_order() {
    let (m, mut s) = machine();
    let va = VirtAddr(0x4000_0000);
    let nc = Prot::READ_WRITE.with_mem(MemType::NormalNonCacheable);
    s.map(va, PA, 2 * RUN, nc, MapOptions::PAGES).unwrap();
    touch(&m, va, 2 * RUN);
    let before = ptes(&s, va, 2 * RUN);
    assert_eq!(
        s.change_protection_live(va, RUN + PAGE, Prot::WRITE, LiveOptions::IN_PLACE),
        Err(Error::BreakBeforeMake(va, BbmReason::MemoryType))
    );
    assert_eq!(ptes(&s, va, 2 * RUN), before);
    // A partly covered run before a whole one: its first covered address.
    assert_eq!(
        s.change_protection_live(
            va.add(RUN - PAGE),
            RUN + PAGE,
            Prot::WRITE,
            LiveOptions::IN_PLACE
        ),
        Err(Error::BreakBeforeMake(
            va.add(RUN - PAGE),
            BbmReason::ContiguousRun
        ))
    );
    assert_eq!(ptes(&s, va, 2 * RUN), before);
    m.check().unwrap();
}

#[test]
fn contpte_fork_of_part_of_a_run_gives_the_child_no_partial_run() {
    let (m, mut s) = machine();
    let m2 = SimMachine::<Arm64>::new();
    let mut child = AddressSpace::new(m2.mmu(), m2.alloc()).unwrap();
    s.map(VA, PA, 2 * RUN, user_rw(), MapOptions::PAGES)
        .unwrap();
    touch(&m, VA, 2 * RUN);
    s.copy_page_range(&mut child, VA.add(8 * PAGE), RUN, CopyMode::Cow, |_| {})
        .unwrap();
    m.check().unwrap();
    for k in 8..24 {
        let raw = child.inspect().entry(VA.add(k * PAGE), 0).unwrap();
        assert!(!is_contiguous(raw), "child page {k}");
        assert!(
            !is_contiguous(s.inspect().entry(VA.add(k * PAGE), 0).unwrap()),
            "parent page {k}"
        );
    }
    // A whole run copies folded, consistently in both.
    let mut child2 = AddressSpace::new(m2.mmu(), m2.alloc()).unwrap();
    s.map(
        VA.add(4 * RUN),
        PhysAddr(PA.0 + 4 * RUN),
        RUN,
        user_rw(),
        MapOptions::PAGES,
    )
    .unwrap();
    s.copy_page_range(&mut child2, VA.add(4 * RUN), RUN, CopyMode::Cow, |_| {})
        .unwrap();
    m.check().unwrap();
    assert!(hints(&s, VA.add(4 * RUN), RUN, 0).iter().all(|&c| c));
    for k in 0..16 {
        let raw = child2
            .inspect()
            .entry(VA.add(4 * RUN + k * PAGE), 0)
            .unwrap();
        assert!(is_contiguous(raw) && !Arm64::leaf_prot(raw, 0).writable());
    }
}

#[test]
fn contpte_failed_operations_leave_the_tables_unchanged() {
    let (m, mut s) = machine();
    // Blocks (a folded PMD run) and a folded PTE run.
    let va = VirtAddr(PMD_RUN * 2);
    s.map(
        va,
        PhysAddr(PMD_RUN * 4),
        PMD_RUN,
        Prot::READ_WRITE,
        MapOptions::BLOCKS,
    )
    .unwrap();
    s.map(VA, PA, 2 * RUN, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    let blocks = |s: &Space| -> Vec<u64> {
        (0..16)
            .map(|k| s.inspect().entry(va.add(k * (2 << 20)), 1).unwrap())
            .collect()
    };
    let (b0, p0) = (blocks(&s), ptes(&s, VA, 2 * RUN));
    let tables = s.inspect().count_tables();
    // Splitting a block needs a table: none left.
    m.fail_after(Some(0));
    let at = va.add(PAGE);
    assert_eq!(
        s.change_protection(at, PAGE, Prot::READ_ONLY),
        Err(Error::OutOfMemory)
    );
    assert_eq!(s.unmap(at, PAGE), Err(Error::OutOfMemory));
    // A move that needs destination tables.
    assert_eq!(
        s.move_page_tables(
            VA.add(PAGE),
            VirtAddr(1 << 38).add(PAGE),
            RUN,
            MoveOptions::DEFAULT
        ),
        Err(Error::OutOfMemory)
    );
    m.fail_after(None);
    assert_eq!(blocks(&s), b0);
    assert_eq!(ptes(&s, VA, 2 * RUN), p0);
    assert_eq!(s.inspect().count_tables(), tables);
    m.check().unwrap();
}

#[test]
fn contpte_tlb_fills_of_a_gib_are_16_times_fewer_folded() {
    let gib = 1u64 << 30;
    let fills = |opts: MapOptions| {
        let (m, mut s) = machine();
        s.map(VA, PA, gib, Prot::READ_WRITE, opts).unwrap();
        let before = m.stats().tlb_fills;
        touch(&m, VA, gib);
        let n = m.stats().tlb_fills - before;
        m.check().unwrap();
        n
    };
    let folded = fills(MapOptions::PAGES);
    let unfolded = fills(MapOptions::PAGES.no_contiguous());
    assert_eq!(unfolded, gib / PAGE);
    assert_eq!(folded, gib / RUN);
    assert_eq!(unfolded, 16 * folded);
}

#[test]
fn contpte_gather_operations_unfold_partial_runs_too() {
    let (m, mut s) = machine();
    s.map(VA, PA, 4 * RUN, user_rw(), MapOptions::PAGES)
        .unwrap();
    touch(&m, VA, 4 * RUN);
    let mut tlb = s.tlb_gather_mmu();
    tlb.change_protection(VA.add(PAGE), PAGE, Prot::USER)
        .unwrap();
    m.hw_touch(VA.add(RUN + 2 * PAGE), true).unwrap();
    let mut removed = Vec::new();
    tlb.unmap_with(VA.add(RUN + 4 * PAGE), 2 * RUN, |r| {
        removed.push((r.va(), r.dirty()))
    })
    .unwrap();
    tlb.finish();
    m.check().unwrap();
    let h = hints(&s, VA, 4 * RUN, 0);
    assert!(h.iter().take(16).all(|&c| !c), "{h:?}");
    assert!(h.iter().skip(16).take(4).all(|&c| !c), "{h:?}");
    assert!(h.iter().skip(52).all(|&c| !c), "{h:?}");
    // The partly unmapped run kept its gathered dirty state when unfolded,
    // so pages 20..32 are reported dirty, pages 36..52 (a whole clean run
    // and part of the next) clean.
    removed.sort();
    assert_eq!(removed.len(), 32);
    for (va, d) in removed {
        let k = (va.0 - VA.0) / PAGE;
        assert_eq!(d, k < 32, "page {k}");
    }
    assert!(Arm64::is_dirty(s.inspect().entry(VA.add(RUN), 0).unwrap()));
}

#[test]
fn contpte_swap_entry_never_replaces_part_of_a_run() {
    let (m, mut s) = machine();
    s.map(VA, PA, RUN, user_rw(), MapOptions::PAGES).unwrap();
    let before = ptes(&s, VA, RUN);
    // A software entry goes only where nothing is mapped: never into a run.
    assert_eq!(
        s.install_pte(VA.add(3 * PAGE), NewPte::Swap(7)),
        Err(Error::AlreadyMapped(VA.add(3 * PAGE)))
    );
    assert_eq!(ptes(&s, VA, RUN), before);
    // After unmapping one page (which unfolds the run) it may.
    s.unmap(VA.add(3 * PAGE), PAGE).unwrap();
    s.install_pte(VA.add(3 * PAGE), NewPte::Swap(7)).unwrap();
    assert!(hints(&s, VA, RUN, 0).iter().all(|&c| !c));
    m.check().unwrap();
}

/// A user store at `va`, through the simulated TLB.
const USER_STORE: Access = Access {
    write: true,
    exec: false,
    user: true,
};

/// The pages of `[va, va + len)` a user store reaches through the
/// simulated MMU (TLB included), as page indices.
fn storable(m: &SimMachine<Arm64>, va: VirtAddr, len: u64, step: u64) -> Vec<u64> {
    (0..len / step)
        .filter(|&k| m.access(va.add(k * step), USER_STORE).is_ok())
        .collect()
}

/// Linux `contpte_ptep_set_access_flags`: a write fault that makes one
/// page of a write-protected folded run writable unfolds the run first and
/// changes that page alone; the others stay shared read-only with the
/// child.
#[test]
fn contpte_write_fault_on_a_cow_run_makes_only_that_page_writable() {
    let (m, mut s) = machine();
    let m2 = SimMachine::<Arm64>::new();
    let mut child = AddressSpace::new(m2.mmu(), m2.alloc()).unwrap();
    s.map(VA, PA, 2 * RUN, user_rw(), MapOptions::PAGES)
        .unwrap();
    s.copy_page_range(&mut child, VA, 2 * RUN, CopyMode::Cow, |_| {})
        .unwrap();
    let child_before = (0..32)
        .map(|k| child.inspect().entry(VA.add(k * PAGE), 0))
        .collect::<Vec<_>>();
    // The read-only run is cached whole.
    touch(&m, VA, 2 * RUN);
    assert!(m.tlb_holds_run(VA));
    assert_eq!(storable(&m, VA, 2 * RUN, PAGE), Vec::<u64>::new());
    // An access fault (accessed state only) keeps the run folded.
    assert!(s.test_and_clear_young(VA.add(PAGE)).unwrap());
    assert!(s
        .ptep_set_access_flags(VA.add(5 * PAGE), FaultFlags::ACCESS)
        .unwrap());
    assert!(hints(&s, VA, RUN, 0).iter().all(|&c| c));
    // The write fault on page 3.
    assert!(s
        .ptep_set_access_flags(VA.add(3 * PAGE), FaultFlags::WRITE)
        .unwrap());
    m.check().unwrap();
    for k in 0..16 {
        let raw = s.inspect().entry(VA.add(k * PAGE), 0).unwrap();
        assert_eq!(Arm64::leaf_prot(raw, 0).writable(), k == 3, "page {k}");
        assert!(!is_contiguous(raw), "page {k} keeps the hint");
        assert_eq!(s.translate(VA.add(k * PAGE)).unwrap().pa.0, PA.0 + k * PAGE);
    }
    // The other run is untouched and still folded.
    assert!(hints(&s, VA.add(RUN), RUN, 0).iter().all(|&c| c));
    assert_eq!(storable(&m, VA, 2 * RUN, PAGE), vec![3]);
    let child_after = (0..32)
        .map(|k| child.inspect().entry(VA.add(k * PAGE), 0))
        .collect::<Vec<_>>();
    assert_eq!(child_after, child_before);
    m.check().unwrap();
}

/// The same rule for a folded run of 2 MiB blocks: a write fault on one
/// block unfolds the 32 MiB run and makes that block alone writable.
#[test]
fn contpte_write_fault_on_a_read_only_block_run_makes_only_that_block_writable() {
    let (m, mut s) = machine();
    let va = VirtAddr(0x4000_0000);
    let block = 2u64 << 20;
    s.map(
        va,
        PhysAddr(0x4000_0000),
        PMD_RUN,
        Prot::USER,
        MapOptions::PMD_BLOCKS,
    )
    .unwrap();
    assert!(hints(&s, va, PMD_RUN, 1).iter().all(|&c| c));
    for k in 0..16 {
        m.access(va.add(k * block), Access::READ).unwrap();
    }
    assert!(m.tlb_holds_run(va));
    assert!(s
        .ptep_set_access_flags(va.add(3 * block + PAGE), FaultFlags::WRITE)
        .unwrap());
    m.check().unwrap();
    for k in 0..16 {
        let raw = s.inspect().entry(va.add(k * block), 1).unwrap();
        assert_eq!(Arm64::leaf_prot(raw, 1).writable(), k == 3, "block {k}");
        assert!(!is_contiguous(raw), "block {k} keeps the hint");
    }
    assert_eq!(storable(&m, va, PMD_RUN, block), vec![3]);
    // A dirty fault on a writable block of a folded run stays whole-run.
    let va2 = va.add(2 * PMD_RUN);
    s.map(
        va2,
        PhysAddr(0x4000_0000 + 2 * PMD_RUN),
        PMD_RUN,
        Prot::USER | Prot::WRITE,
        MapOptions::PMD_BLOCKS,
    )
    .unwrap();
    s.ptep_set_access_flags(va2.add(7 * block), FaultFlags::DIRTY)
        .unwrap();
    assert!(hints(&s, va2, PMD_RUN, 1).iter().all(|&c| c));
    for k in 0..16 {
        assert!(s.ptep_get(va2.add(k * block)).unwrap().dirty(), "block {k}");
    }
    m.check().unwrap();
}

/// `clear_refs` of part of a folded run of 2 MiB blocks, from an address
/// inside a block: the whole run is cleared, and every block the range
/// touches is reported once, with the run's state.
#[test]
fn contpte_clear_refs_of_part_of_a_block_run_reports_each_block_once() {
    let (m, mut s) = machine();
    let va = VirtAddr(0x4000_0000);
    let block = 2u64 << 20;
    s.map(
        va,
        PhysAddr(0x4000_0000),
        PMD_RUN,
        Prot::READ_WRITE,
        MapOptions::PMD_BLOCKS,
    )
    .unwrap();
    m.hw_touch(va.add(9 * block), true).unwrap();
    let mut seen = Vec::new();
    s.clear_refs(va.add(PAGE), PAGE, ClearRefs::YOUNG, |e| {
        seen.push((e.va(), e.height(), e.young()))
    })
    .unwrap();
    m.check().unwrap();
    assert_eq!(seen, vec![(va, 1, true)]);
    for k in 0..16 {
        assert!(!s.ptep_get(va.add(k * block)).unwrap().young(), "block {k}");
    }
    // 4 MiB from inside the first block: three blocks touched.
    m.hw_touch(va.add(9 * block), true).unwrap();
    let mut seen = Vec::new();
    s.clear_refs(va.add(PAGE), 4 << 20, ClearRefs::ALL, |e| {
        seen.push((e.va(), e.young(), e.dirty()))
    })
    .unwrap();
    m.check().unwrap();
    assert_eq!(
        seen,
        vec![
            (va, true, true),
            (va.add(block), true, true),
            (va.add(2 * block), true, true)
        ]
    );
    for k in 0..16 {
        let e = s.ptep_get(va.add(k * block)).unwrap();
        assert!(!e.young() && !e.dirty(), "block {k}");
    }
    assert!(hints(&s, va, PMD_RUN, 1).iter().all(|&c| c));
}

/// `unmap_with` through a caller's gather, finished at once (the one place
/// this file's new checks use the gathered form).
fn unmap_with_gathered(s: &mut Space, va: VirtAddr, len: u64, f: impl FnMut(LeafEntry<Arm64>)) {
    let mut tlb = s.tlb_gather_mmu();
    tlb.unmap_with(va, len, f).unwrap();
    tlb.finish();
}

/// `unmap_with` of whole folded runs of 2 MiB blocks reports every block
/// with the run's accessed/dirty state (Linux `huge_ptep_get`): the
/// hardware marks the one entry it walked, so a store through the last
/// block of a run dirties the whole run's report. A run within a PMD
/// table, a PMD table unmapped whole, and the gathered form; and the same
/// for a whole table of pages in the gathered form.
#[test]
fn contpte_unmap_with_of_a_block_run_reports_the_run_state() {
    let block = 2u64 << 20;
    let dirty_blocks = |s: &mut Space, va: VirtAddr, len: u64, gathered: bool| {
        let mut dirty = Vec::new();
        let f = |r: LeafEntry<Arm64>| {
            assert_eq!(r.height(), 1);
            if r.dirty() {
                dirty.push((r.va().0 - va.0) / block)
            }
        };
        if gathered {
            unmap_with_gathered(s, va, len, f);
        } else {
            s.unmap_with(va, len, f).unwrap();
        }
        dirty.sort();
        dirty
    };
    for gathered in [false, true] {
        let (m, mut s) = machine();
        // One run inside a PMD table.
        let va = VirtAddr(0x4000_0000);
        s.map(
            va,
            PhysAddr(0x4000_0000),
            PMD_RUN,
            user_rw(),
            MapOptions::PMD_BLOCKS,
        )
        .unwrap();
        m.write_u64(va.add(31 << 20), 1).unwrap();
        assert_eq!(
            dirty_blocks(&mut s, va, PMD_RUN, gathered),
            (0..16).collect::<Vec<_>>(),
            "gathered: {gathered}"
        );
        m.check().unwrap();
        // A PMD table (1 GiB, 32 runs) unmapped whole; run 5 stored to.
        let va = VirtAddr(1 << 31);
        s.map(
            va,
            PhysAddr(1 << 31),
            1 << 30,
            user_rw(),
            MapOptions::PMD_BLOCKS,
        )
        .unwrap();
        m.write_u64(va.add(5 * PMD_RUN + 9 * block), 1).unwrap();
        assert_eq!(
            dirty_blocks(&mut s, va, 1 << 30, gathered),
            (80..96).collect::<Vec<_>>(),
            "gathered: {gathered}"
        );
        m.check().unwrap();
    }
    // Pages: a whole PTE table in the gathered form.
    let (m, mut s) = machine();
    s.map(VA, PA, 2 << 20, user_rw(), MapOptions::PAGES)
        .unwrap();
    m.write_u64(VA.add(3 * RUN + 15 * PAGE), 1).unwrap();
    let mut dirty = Vec::new();
    unmap_with_gathered(&mut s, VA, 2 << 20, |r| {
        if r.dirty() {
            dirty.push((r.va().0 - VA.0) / PAGE)
        }
    });
    dirty.sort();
    assert_eq!(dirty, (48..64).collect::<Vec<_>>());
    m.check().unwrap();
}

/// The single-entry installs (`install_pte` of a page or a software entry, and
/// `replace_pte` of a software entry) only fill an entry that is none or a
/// software entry, which a folded run never holds: on a page of a run
/// `install_pte` refuses and changes nothing; in the hole that a partial
/// unmap leaves (which unfolded the run) they work and fold nothing.
#[test]
fn contpte_single_entry_installs_never_change_a_folded_run() {
    let (m, mut s) = machine();
    s.map(VA, PA, RUN, user_rw(), MapOptions::PAGES).unwrap();
    let before = ptes(&s, VA, RUN);
    let at = VA.add(6 * PAGE);
    assert_eq!(
        s.install_pte(
            at,
            NewPte::Page {
                pa: PhysAddr(0x9000_0000),
                prot: user_rw()
            }
        ),
        Err(Error::AlreadyMapped(at))
    );
    assert_eq!(ptes(&s, VA, RUN), before);
    s.unmap(at, PAGE).unwrap();
    s.install_pte(at, NewPte::Swap(3)).unwrap();
    let back = NewPte::Page {
        pa: PhysAddr(PA.0 + 6 * PAGE),
        prot: user_rw(),
    };
    assert_eq!(s.replace_pte(at, back).unwrap().swap_value(), Some(3));
    s.unmap(at, PAGE).unwrap();
    s.install_pte(
        at,
        NewPte::Page {
            pa: PhysAddr(PA.0 + 6 * PAGE),
            prot: user_rw(),
        },
    )
    .unwrap();
    assert!(hints(&s, VA, RUN, 0).iter().all(|&c| !c));
    m.check().unwrap();
}

/// A software entry whose value sets the bit where a leaf has the
/// contiguous hint is no folded run: `unmap_with` reports it with its own
/// value (so the caller can release the swap slot) and the page beside it
/// with its own state, not ORed over 16 entries.
#[test]
fn contpte_a_software_entry_with_the_hint_bit_set_is_not_a_run() {
    let (m, mut s) = machine();
    // Value bit 40 is descriptor bit 52, the contiguous hint of a leaf.
    let value = (1u64 << 40) | 5;
    s.install_pte(VA, NewPte::Swap(value)).unwrap();
    s.install_pte(
        VA.add(2 * PAGE),
        NewPte::Page {
            pa: PhysAddr(PA.0 + 2 * PAGE),
            prot: user_rw(),
        },
    )
    .unwrap();
    // A store elsewhere in the run's range would dirty a real run.
    s.install_pte(
        VA.add(5 * PAGE),
        NewPte::Page {
            pa: PhysAddr(PA.0 + 5 * PAGE),
            prot: user_rw(),
        },
    )
    .unwrap();
    m.write_u64(VA.add(5 * PAGE), 1).unwrap();
    let mut got = Vec::new();
    s.unmap_with(VA, RUN, |r| {
        got.push((
            (r.va().0 - VA.0) / PAGE,
            Arm64::swp_value(r.raw()),
            r.dirty(),
        ))
    })
    .unwrap();
    got.sort();
    assert_eq!(
        got,
        vec![(0, Some(value), false), (2, None, false), (5, None, true)]
    );
    m.check().unwrap();
}

/// `replace_pte` of a page inside a folded run (swap-out, then a
/// copy-on-write copy in another run) unfolds the run first.
#[test]
fn contpte_replace_pte_unfolds_the_run() {
    pgtable_testkit::ops::replace_pte_in_a_folded_run_unfolds_it::<Arm64>();
}
