//! `MmuGather`: one flush for a batch, frees deferred to the finish,
//! and a gather dropped unfinished (or while unwinding) still finished.

use pgtable_core::contract::Arch;
use pgtable_core::{ClearRefs, Error, MapOptions, Prot, VirtAddr};

use super::{map, setup, snapshot, K4, KRW, M2, VA};

/// Two unmaps, a reporting unmap and a protection change in one gather:
/// one flush for all, and the emptied tables are freed only when it is
/// finished.
pub fn gather_batches_one_flush_and_defers_frees<A: Arch>() {
    let (m, mut s) = setup::<A>();
    let live0 = m.alloc().live();
    map(&mut s, 0, 8 * M2, KRW, MapOptions::PAGES);
    for i in 0..8 {
        m.read_u64(VirtAddr(VA + i * M2)).unwrap();
    }
    let flushes = s.stats().flushes();
    let mut tlb = s.tlb_gather_mmu();
    assert!(tlb.is_empty());
    tlb.change_protection(VirtAddr(VA + 6 * M2), M2, Prot::READ_ONLY)
        .unwrap();
    tlb.unmap(VirtAddr(VA), 2 * M2).unwrap();
    tlb.unmap(VirtAddr(VA + 3 * M2), M2).unwrap();
    let mut n = 0;
    tlb.unmap_with(VirtAddr(VA + 4 * M2), M2, |_| n += 1)
        .unwrap();
    assert_eq!(n, 512);
    assert_eq!(
        tlb.space().stats().flushes(),
        flushes,
        "nothing flushed before finish"
    );
    assert_eq!(tlb.tables_queued(), 4);
    let live = m.alloc().live();
    // The stale translations are still there: the gather owns them.
    assert!(m.check_tlb().is_err());
    tlb.finish();
    assert_eq!(s.stats().flushes(), flushes + 1);
    assert_eq!(m.alloc().live(), live - 4);
    m.check().unwrap();
    assert!(s.translate(VirtAddr(VA + M2)).is_none());
    assert_eq!(
        s.translate(VirtAddr(VA + 6 * M2)).unwrap().prot,
        Prot::READ_ONLY
    );
    s.unmap(VirtAddr(VA), 8 * M2).unwrap();
    assert_eq!(m.alloc().live(), live0);
}

/// A gather's operations that fail change nothing, and what the gather
/// holds from earlier operations is still flushed and freed at the end.
pub fn gather_errors_change_nothing<A: Arch>() {
    let (m, mut s) = setup::<A>();
    // Under Miri the unmapped PTE table and one more (each step of the
    // snapshots is interpreted), natively four.
    let len = if cfg!(miri) { 2 * M2 } else { 4 * M2 };
    map(&mut s, 0, len, KRW, MapOptions::PAGES);
    let live = m.alloc().live();
    let mut tlb = s.tlb_gather_mmu();
    tlb.unmap(VirtAddr(VA), M2).unwrap();
    let before = snapshot(tlb.space(), VA, len);
    let queued = tlb.tables_queued();
    let bad = VirtAddr(VA + 1);
    let e = Err(Error::MisalignedVirt(bad));
    assert_eq!(tlb.unmap(bad, M2), e);
    assert_eq!(tlb.unmap_with(bad, M2, |_| panic!("reported")), e);
    assert_eq!(tlb.change_protection(bad, M2, Prot::READ_ONLY), e);
    let what = ClearRefs::ALL;
    assert_eq!(tlb.clear_refs(bad, M2, what, |_| panic!("reported")), e);
    assert_eq!(snapshot(tlb.space(), VA, len), before);
    assert_eq!(tlb.tables_queued(), queued);
    tlb.finish();
    assert_eq!(m.alloc().live(), live - queued);
    m.check().unwrap();
}

/// Dropping an unfinished gather finishes it: its translations are
/// flushed and its emptied tables freed (nothing leaks, no stale TLB
/// entry stays); an empty one flushes nothing.
pub fn dropping_an_unfinished_gather_finishes_it<A: Arch>() {
    let (m, mut s) = setup::<A>();
    map(&mut s, 0, M2, KRW, MapOptions::PAGES);
    m.read_u64(VirtAddr(VA)).unwrap();
    let flushes = s.stats().flushes();
    drop(s.tlb_gather_mmu());
    assert_eq!(s.stats().flushes(), flushes);
    let live = m.alloc().live();
    let mut tlb = s.tlb_gather_mmu();
    tlb.unmap(VirtAddr(VA), M2).unwrap();
    let queued = tlb.tables_queued();
    assert!(queued > 0);
    assert!(m.check_tlb().is_err(), "the unmapped page is still cached");
    drop(tlb);
    assert_eq!(s.stats().flushes(), flushes + 1);
    assert_eq!(m.alloc().live(), live - queued);
    m.check().unwrap();
}

/// A gather dropped while a panic unwinds (here: from a report callback)
/// still flushes, so no stale translation survives, and keeps its queued
/// frames allocated; the unwind does not turn into an abort.
pub fn a_gather_dropped_while_unwinding_still_flushes<A: Arch>() {
    let (m, mut s) = setup::<A>();
    map(&mut s, 0, 2 * M2, KRW, MapOptions::PAGES);
    m.read_u64(VirtAddr(VA)).unwrap();
    let live = m.alloc().live();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut tlb = s.tlb_gather_mmu();
        tlb.unmap(VirtAddr(VA), M2).unwrap();
        let _ = tlb.unmap_with(VirtAddr(VA + M2), K4, |_| panic!("a report panics"));
    }));
    assert!(r.is_err());
    m.check_tlb().unwrap();
    assert_eq!(m.alloc().live(), live, "the queued frames are kept");
    assert!(s.translate(VirtAddr(VA)).is_none());
}
