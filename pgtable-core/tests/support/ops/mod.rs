//! The kernel-facing single-entry and batched operations on the simulated
//! machine, written once for any format: caller-owned flush batching
//! (`MmuGather`), `unmap_with` reports, accessed/dirty harvesting and the
//! fault-time operations. `tests/ops.rs` of all three crates include this
//! file (`#[path]`) and instantiate every case per format with
//! [`ops_tests!`]. After every operation the machine is checked: no stale
//! TLB entry, no write the walker may not see, no break-before-make
//! conflict.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

use pgtable_core::contract::{Arch, Decoded};
use pgtable_core::sim::{Installed, SimAlloc, SimMachine, SimMmu};
use pgtable_core::{
    AddressSpace, ClearRefs, Error, FaultFlags, LeafEntry, MapOptions, PhysAddr, Prot, VirtAddr,
};

pub const K4: u64 = 4 << 10;
pub const M2: u64 = 2 << 20;
pub const G1: u64 = 1 << 30;
/// Where every test maps: 1 GiB, so 2 MiB and 1 GiB blocks are aligned.
pub const VA: u64 = G1;
/// Physical address of `VA`.
pub const PA: u64 = 0x8000_0000;
/// A non-present, non-zero entry on every format here (bit 0 clear: not
/// valid / not present): what a swap entry looks like to the algorithms.
pub const SWAP: u64 = 0x0000_0012_3400_0002;

pub type Space<A> = Installed<A, SimMmu<A>, SimAlloc>;

/// Kernel read-write.
pub const KRW: Prot = Prot::READ_WRITE;
/// User read-write: created with the accessed/dirty state clean on x86 and
/// the test format (and writable-clean, DBM with AP[2], on arm64), so the
/// hardware still writes these entries.
pub const URW: Prot = Prot::WRITE.union(Prot::USER);

pub fn setup<A: Arch>() -> (SimMachine<A>, Space<A>) {
    let m = SimMachine::<A>::new();
    let s = AddressSpace::<A, _, _>::new(m.mmu(), m.alloc()).unwrap();
    // SAFETY: a simulated MMU.
    (m, unsafe { Installed::new(s) })
}

pub fn map<A: Arch>(s: &mut Space<A>, off: u64, len: u64, prot: Prot, opts: MapOptions) {
    s.map(VirtAddr(VA + off), PhysAddr(PA + off), len, prot, opts)
        .unwrap();
}

/// Every entry of every table reachable from the root, as (height, index
/// path, raw): a snapshot to prove that a failed operation changed nothing.
pub fn snapshot<A: Arch>(
    s: &AddressSpace<A, SimMmu<A>, SimAlloc>,
    va: u64,
    len: u64,
) -> Vec<(u64, u32, u64)> {
    let mut v = Vec::new();
    let mut a = va;
    while a < va + len {
        for h in 0..A::LEVELS {
            if let Some(raw) = s.inspect().entry(VirtAddr(a), h) {
                v.push((a, h, raw));
            }
        }
        a += K4;
    }
    v
}

/// A user-visible record of one report.
#[derive(Clone, Copy, PartialEq, Eq, Debug, PartialOrd, Ord)]
pub struct Rec {
    pub va: u64,
    pub size: u64,
    pub pa: Option<u64>,
    pub present: bool,
    pub dirty: bool,
}

pub fn rec<A: Arch>(r: LeafEntry<A>) -> Rec {
    Rec {
        va: r.va().0,
        size: r.size(),
        pa: r.pa().map(|p| p.0),
        present: r.is_present(),
        dirty: r.dirty(),
    }
}

/// Spins for about `us` microseconds.
pub fn busy(us: u64) {
    let t = std::time::Instant::now();
    while t.elapsed().as_micros() < u128::from(us) {
        std::hint::spin_loop();
    }
}

// ----- unmap_with -----

/// Pages, a partly covered block, a whole block and a swap entry: each
/// removed entry is reported once, with its address, size and dirty state;
/// the tables end as plain unmap leaves them.
///
/// The counts here are per entry, so the user pages are mapped without the
/// contiguous hint (a folded run reports the run's accessed/dirty state for
/// each of its pages: see `pgtable-arm64/tests/contpte.rs`).
pub fn unmap_with_reports_each_removed_entry<A: Arch>() {
    let (m, mut s) = setup::<A>();
    // [0, 4M): two 2 MiB blocks (pages where the format has none).
    map(&mut s, 0, 2 * M2, KRW, MapOptions::PMD_BLOCKS);
    // [4M, 4M + 64K): 16 pages, then a swap entry in the 17th.
    map(
        &mut s,
        2 * M2,
        16 * K4,
        URW,
        MapOptions::PAGES.no_contiguous(),
    );
    let swap_va = VA + 2 * M2 + 16 * K4;
    // SAFETY: an empty PTE slot of an existing table gets a value that
    // decodes as not present, as `slot` allows.
    unsafe {
        let slot = s.inspect().slot(VirtAddr(swap_va), 0).unwrap();
        assert!(matches!(A::decode(SWAP, 0), Decoded::Invalid));
        slot.store(SWAP, Relaxed);
    }
    // Dirty two pages through the hardware.
    m.hw_touch(VirtAddr(VA + 2 * M2 + 3 * K4), true).unwrap();
    m.hw_touch(VirtAddr(VA + M2 + 5 * K4), true).unwrap();
    let blocks = A::leaf_allowed(1);

    let start = VA + M2 / 2; // inside the first block
    let end = swap_va + K4;
    let mut got = Vec::new();
    s.unmap_with(VirtAddr(start), end - start, |r| got.push(rec(r)))
        .unwrap();
    m.check().unwrap();

    let mut want = Vec::new();
    // The first block, split: its pages from `start` on.
    for a in (start..VA + M2).step_by(K4 as usize) {
        want.push((a, K4, Some(PA + a - VA), true));
    }
    if blocks {
        want.push((VA + M2, M2, Some(PA + M2), true));
    } else {
        for a in (VA + M2..VA + 2 * M2).step_by(K4 as usize) {
            want.push((a, K4, Some(PA + a - VA), true));
        }
    }
    for a in (VA + 2 * M2..swap_va).step_by(K4 as usize) {
        want.push((a, K4, Some(PA + a - VA), true));
    }
    want.push((swap_va, K4, None, false));
    let got_keys: Vec<_> = got
        .iter()
        .map(|r| (r.va, r.size, r.pa, r.present))
        .collect();
    let want: Vec<_> = want
        .into_iter()
        .map(|(va, size, pa, _)| (va, size, pa, pa.is_some()))
        .collect();
    assert_eq!(got_keys, want);
    // Dirty: kernel read-write leaves may be created dirty (x86, arm64);
    // the user pages start clean and exactly the touched one is dirty.
    for r in &got {
        if r.va >= VA + 2 * M2 && r.present {
            assert_eq!(r.dirty, r.va == VA + 2 * M2 + 3 * K4, "{r:?}");
        }
        if r.va == VA + M2 || r.va == VA + M2 + 5 * K4 {
            assert!(r.dirty, "{r:?}");
        }
    }
    for a in (start..end).step_by(K4 as usize) {
        assert!(s.translate(VirtAddr(a)).is_none());
        assert!(s.ptep_get(VirtAddr(a)).is_none());
    }
    // What stayed mapped stayed.
    assert_eq!(s.translate(VirtAddr(VA)).unwrap().pa, PhysAddr(PA));
}

/// A range covering whole tables: they are unlinked, yet every leaf in
/// them is reported, and the frames go back to the allocator.
pub fn unmap_with_reports_leaves_of_whole_tables<A: Arch>() {
    let (m, mut s) = setup::<A>();
    let live0 = m.alloc().live();
    map(
        &mut s,
        0,
        2 * M2 + 8 * K4,
        URW,
        MapOptions::PAGES.no_contiguous(),
    );
    m.hw_touch(VirtAddr(VA + M2 + 7 * K4), true).unwrap();
    let mut got = BTreeSet::new();
    let mut dirty = 0;
    s.unmap_with(VirtAddr(VA), G1, |r| {
        assert!(r.is_present() && r.size() == K4);
        assert_eq!(r.pa().unwrap().0 - PA, r.va().0 - VA);
        dirty += usize::from(r.dirty());
        assert!(got.insert(r.va().0), "reported twice: {r:?}");
    })
    .unwrap();
    m.check().unwrap();
    assert_eq!(got.len(), 2 * 512 + 8);
    assert_eq!(dirty, 1);
    assert_eq!(m.alloc().live(), live0);
    assert_eq!(s.inspect().count_tables(), 1);
}

/// Errors report nothing and change nothing (no frame leaked).
pub fn unmap_with_error_changes_nothing<A: Arch>() {
    let (m, mut s) = setup::<A>();
    if !A::leaf_allowed(1) {
        return;
    }
    map(&mut s, 0, M2, KRW, MapOptions::PMD_BLOCKS);
    let before = snapshot(&s, VA, M2);
    let live = m.alloc().live();
    m.alloc().fail_after(Some(0));
    let mut n = 0;
    let e = s.unmap_with(VirtAddr(VA + K4), K4, |_| n += 1);
    m.alloc().fail_after(None);
    assert_eq!(e, Err(Error::OutOfMemory));
    assert_eq!(n, 0);
    assert_eq!(snapshot(&s, VA, M2), before);
    assert_eq!(m.alloc().live(), live);
    assert_eq!(
        s.unmap_with(VirtAddr(VA + 1), K4, |_| n += 1),
        Err(Error::MisalignedVirt(VirtAddr(VA + 1)))
    );
    assert_eq!(n, 0);
    m.check().unwrap();
}

/// The hardware keeps storing to the pages while they are mapped and
/// unmapped again and again: every dirty state it set is reported (the
/// report is the value the atomic get-and-clear returned, not an earlier
/// load, which would lose a store made between the load and the clear).
pub fn unmap_with_loses_no_dirty_state_under_the_agent<A: Arch + Send>(rounds: usize) {
    let pages = 16u64;
    let (m, mut s) = setup::<A>();
    // Keep the PTE table across rounds (only the pages come and go).
    map(
        &mut s,
        pages * K4,
        K4,
        URW,
        MapOptions::PAGES.no_contiguous(),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let agent = m.spawn_agent(VirtAddr(VA), pages * K4, stop.clone());
    let mut reported = 0u64;
    let t0 = std::time::Instant::now();
    let mut done = 0;
    // At least `rounds`, and until the agent has dirtied pages often
    // (bounded in time: the machine may be busy).
    while done < rounds || (m.stats().dirty_set < 200 && t0.elapsed().as_secs() < 20) {
        done += 1;
        map(
            &mut s,
            0,
            pages * K4,
            URW,
            MapOptions::PAGES.no_contiguous(),
        );
        s.unmap_with(VirtAddr(VA), pages * K4, |r| {
            reported += u64::from(r.dirty());
            // A consumer that takes its time (freeing the page): the
            // hardware's stores go on meanwhile.
            busy(2);
        })
        .unwrap();
    }
    stop.store(true, Relaxed);
    let rep = agent.join().unwrap();
    m.check().unwrap();
    assert!(rep.dirty_set > 0);
    assert_eq!(
        reported, rep.dirty_set,
        "dirty states set by the hardware but not reported"
    );
}

// ----- MmuGather -----

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
    map(&mut s, 0, 4 * M2, KRW, MapOptions::PAGES);
    let live = m.alloc().live();
    let mut tlb = s.tlb_gather_mmu();
    tlb.unmap(VirtAddr(VA), M2).unwrap();
    let before = snapshot(tlb.space(), VA, 4 * M2);
    let queued = tlb.tables_queued();
    let bad = VirtAddr(VA + 1);
    let e = Err(Error::MisalignedVirt(bad));
    assert_eq!(tlb.unmap(bad, M2), e);
    assert_eq!(tlb.unmap_with(bad, M2, |_| panic!("reported")), e);
    assert_eq!(tlb.change_protection(bad, M2, Prot::READ_ONLY), e);
    let what = ClearRefs::ALL;
    assert_eq!(tlb.clear_refs(bad, M2, what, |_| panic!("reported")), e);
    assert_eq!(snapshot(tlb.space(), VA, 4 * M2), before);
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

// ----- harvesting -----

/// `test_and_clear_young` returns the accessed state and clears it, and
/// the flush lets the next access set it again.
pub fn test_and_clear_young_round_trip<A: Arch>() {
    let (m, mut s) = setup::<A>();
    map(&mut s, 0, 4 * K4, URW, MapOptions::PAGES);
    let v = VirtAddr(VA + K4);
    // arm64 leaves are created with AF set; start from old everywhere.
    let _ = s.test_and_clear_young(v).unwrap();
    m.check().unwrap();
    assert!(!s.test_and_clear_young(v).unwrap());
    m.read_u64(v).unwrap();
    assert!(s.ptep_get(v).unwrap().young());
    assert!(s.test_and_clear_young(VirtAddr(v.0 + 8)).unwrap());
    m.check().unwrap();
    assert!(!s.ptep_get(v).unwrap().young());
    // Not cached any more: the next access walks and sets it again.
    m.read_u64(v).unwrap();
    assert!(s.test_and_clear_young(v).unwrap());
    assert!(!s.test_and_clear_young(VirtAddr(VA + 100 * K4)).unwrap());
    assert_eq!(
        s.test_and_clear_young(VirtAddr(1 << 63)),
        Err(Error::OutOfRange(VirtAddr(1 << 63)))
    );
    m.check().unwrap();
}

/// Clearing the dirty state keeps the page writable where the hardware
/// tracks dirtiness: the next store succeeds and marks it dirty again.
pub fn clear_refs_cleans_and_the_next_store_redirties<A: Arch>() {
    let (m, mut s) = setup::<A>();
    map(&mut s, 0, 8 * K4, URW, MapOptions::PAGES);
    m.write_u64(VirtAddr(VA + 2 * K4), 1).unwrap();
    m.write_u64(VirtAddr(VA + 5 * K4), 1).unwrap();
    let mut dirty = Vec::new();
    s.clear_refs(VirtAddr(VA), 8 * K4, ClearRefs::DIRTY, |r| {
        if r.dirty() {
            dirty.push(r.va().0 - VA)
        }
    })
    .unwrap();
    m.check().unwrap();
    assert_eq!(dirty, [2 * K4, 5 * K4]);
    for i in 0..8 {
        let e = s.ptep_get(VirtAddr(VA + i * K4)).unwrap();
        assert!(!e.dirty());
        assert!(e.prot().unwrap().writable());
    }
    let u = m.hw_touch(VirtAddr(VA + 2 * K4), true).unwrap();
    assert!(u.dirty);
    assert!(s.ptep_get(VirtAddr(VA + 2 * K4)).unwrap().dirty());
    // Young: both cleared at once, reported as they were.
    let mut young = 0;
    s.clear_refs(VirtAddr(VA), 8 * K4, ClearRefs::ALL, |r| {
        young += usize::from(r.young())
    })
    .unwrap();
    assert!(young >= 2);
    assert!(!s.ptep_get(VirtAddr(VA + 2 * K4)).unwrap().young());
    m.check().unwrap();
}

/// Bad input: nothing cleared, nothing reported.
pub fn clear_refs_errors_change_nothing<A: Arch>() {
    let (m, mut s) = setup::<A>();
    map(&mut s, 0, 4 * K4, URW, MapOptions::PAGES);
    m.write_u64(VirtAddr(VA), 1).unwrap();
    let before = snapshot(&s, VA, 4 * K4);
    let mut n = 0;
    for (va, len, e) in [
        (VA, 0, Error::ZeroLength),
        (VA + 8, K4, Error::MisalignedVirt(VirtAddr(VA + 8))),
        (VA, K4 + 1, Error::MisalignedLength(K4 + 1)),
    ] {
        assert_eq!(
            s.clear_refs(VirtAddr(va), len, ClearRefs::ALL, |_| n += 1),
            Err(e)
        );
    }
    assert_eq!(n, 0);
    assert_eq!(snapshot(&s, VA, 4 * K4), before);
    m.check().unwrap();
}

/// A block is harvested whole and reported once.
pub fn clear_refs_harvests_blocks_whole<A: Arch>() {
    if !A::leaf_allowed(1) {
        return;
    }
    let (m, mut s) = setup::<A>();
    map(&mut s, 0, M2, URW, MapOptions::PMD_BLOCKS);
    m.write_u64(VirtAddr(VA + 7 * K4), 1).unwrap();
    let mut got = Vec::new();
    s.clear_refs(VirtAddr(VA + K4), K4, ClearRefs::ALL, |r| got.push(rec(r)))
        .unwrap();
    m.check().unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].va, got[0].size, got[0].dirty), (VA, M2, true));
    assert!(!s.ptep_get(VirtAddr(VA)).unwrap().dirty());
}

/// Harvesting while the hardware agent keeps touching the pages: every
/// accessed and dirty state the hardware set is either reported by a
/// clear or still in the entry at the end; none is lost.
pub fn clear_refs_loses_no_update_under_the_agent<A: Arch + Send>(rounds: usize) {
    let pages = 64u64;
    let (m, mut s) = setup::<A>();
    map(
        &mut s,
        0,
        pages * K4,
        URW,
        MapOptions::PAGES.no_contiguous(),
    );
    // Start with everything old and clean.
    s.clear_refs(VirtAddr(VA), pages * K4, ClearRefs::ALL, |_| {})
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let agent = m.spawn_agent(VirtAddr(VA), pages * K4, stop.clone());
    let (mut young, mut dirty) = (0u64, 0u64);
    let t0 = std::time::Instant::now();
    let mut done = 0;
    // At least `rounds`, and until the agent has dirtied pages many times
    // over (bounded in time).
    while done < rounds || (m.stats().dirty_set < 4 * pages && t0.elapsed().as_secs() < 20) {
        done += 1;
        s.clear_refs(VirtAddr(VA), pages * K4, ClearRefs::ALL, |r| {
            young += u64::from(r.young());
            dirty += u64::from(r.dirty());
            busy(1);
        })
        .unwrap();
    }
    stop.store(true, Relaxed);
    let rep = agent.join().unwrap();
    m.check().unwrap();
    for i in 0..pages {
        let e = s.ptep_get(VirtAddr(VA + i * K4)).unwrap();
        young += u64::from(e.young());
        dirty += u64::from(e.dirty());
    }
    assert_eq!(rep.faults, 0);
    assert!(rep.dirty_set > 0);
    assert_eq!(dirty, rep.dirty_set, "dirty states lost");
    assert_eq!(young, rep.accessed_set, "accessed states lost");
}

// ----- fault-time operations -----

/// One page into an empty space: only the missing tables, one walker
/// barrier (where the arch needs any), no flush; then one more page in the
/// same table: no table at all.
pub fn install_pte_allocates_only_missing_tables<A: Arch>() {
    let (m, mut s) = setup::<A>();
    let live = m.alloc().live();
    s.stats().reset();
    s.install_pte(VirtAddr(VA + 3 * K4), PhysAddr(PA), URW)
        .unwrap();
    m.check().unwrap();
    assert_eq!(m.alloc().live(), live + (A::LEVELS as usize - 1));
    assert_eq!(s.stats().flushes(), 0);
    assert_eq!(s.stats().barriers(), u64::from(A::NEEDS_WALKER_BARRIER));
    assert_eq!(
        m.translate(VirtAddr(VA + 3 * K4 + 9)).unwrap(),
        PhysAddr(PA + 9)
    );
    s.stats().reset();
    s.install_pte(VirtAddr(VA + 4 * K4), PhysAddr(PA + K4), URW)
        .unwrap();
    m.check().unwrap();
    assert_eq!(m.alloc().live(), live + (A::LEVELS as usize - 1));
    assert_eq!(s.stats().flushes(), 0);
    assert_eq!(s.stats().tables_allocated(), 0);
    assert_eq!(s.stats().barriers(), u64::from(A::NEEDS_WALKER_BARRIER));
}

/// Errors: an occupied slot (page, swap entry, block), bad input, and a
/// failed table allocation leave the tables and the allocator unchanged.
pub fn install_pte_errors_change_nothing<A: Arch>() {
    let (m, mut s) = setup::<A>();
    map(&mut s, 0, K4, URW, MapOptions::PAGES);
    // SAFETY: an empty PTE slot of an existing table gets a not-present
    // value, as `slot` allows.
    unsafe {
        s.inspect()
            .slot(VirtAddr(VA + K4), 0)
            .unwrap()
            .store(SWAP, Relaxed)
    };
    let before = snapshot(&s, VA, 4 * K4);
    let live = m.alloc().live();
    // `ptep_get` shows the software entry as a non-present leaf entry.
    let e = s.ptep_get(VirtAddr(VA + K4)).unwrap();
    assert_eq!(
        (e.raw(), e.is_present(), e.pa(), e.dirty()),
        (SWAP, false, None, false)
    );
    assert!(s.ptep_get(VirtAddr(VA)).unwrap().is_present());
    assert!(s.ptep_get(VirtAddr(VA + 2 * K4)).is_none());
    for v in [VA, VA + K4] {
        assert_eq!(
            s.install_pte(VirtAddr(v), PhysAddr(PA), URW),
            Err(Error::AlreadyMapped(VirtAddr(v)))
        );
    }
    assert_eq!(
        s.install_pte(VirtAddr(VA + 5), PhysAddr(PA), URW),
        Err(Error::MisalignedVirt(VirtAddr(VA + 5)))
    );
    assert_eq!(
        s.install_pte(VirtAddr(VA + 2 * K4), PhysAddr(PA + 5), URW),
        Err(Error::MisalignedPhys(PhysAddr(PA + 5)))
    );
    assert_eq!(snapshot(&s, VA, 4 * K4), before);
    if A::leaf_allowed(1) {
        map(&mut s, M2, M2, URW, MapOptions::PMD_BLOCKS);
        assert_eq!(
            s.install_pte(VirtAddr(VA + M2 + K4), PhysAddr(PA), URW),
            Err(Error::AlreadyMapped(VirtAddr(VA + M2 + K4)))
        );
    }
    // Needs LEVELS - 1 tables far away; only one can be had.
    let live = m.alloc().live().max(live);
    let far = VirtAddr(VA + (1 << (A::VA_BITS - 2)));
    let tables = s.inspect().count_tables();
    m.alloc().fail_after(Some(1));
    let e = s.install_pte(far, PhysAddr(PA), URW);
    m.alloc().fail_after(None);
    assert_eq!(e, Err(Error::OutOfMemory));
    assert_eq!(m.alloc().live(), live);
    assert_eq!(s.inspect().count_tables(), tables);
    assert!(s.ptep_get(far).is_none());
    m.check().unwrap();
}

/// `ptep_set_access_flags`: accessed alone (no flush), dirty, and the
/// write upgrade of a read-only page cached in the TLB (one page flushed,
/// and the store then goes through).
pub fn set_access_flags_relaxes_in_place<A: Arch>() {
    let (m, mut s) = setup::<A>();
    let ro = Prot::USER;
    map(&mut s, 0, 2 * K4, ro, MapOptions::PAGES);
    let v = VirtAddr(VA + K4);
    let _ = s.test_and_clear_young(v).unwrap();
    s.stats().reset();
    assert!(s.ptep_set_access_flags(v, FaultFlags::ACCESS).unwrap());
    assert_eq!(s.stats().flushes(), 0);
    assert!(s.ptep_get(v).unwrap().young());
    assert!(!s.ptep_set_access_flags(v, FaultFlags::ACCESS).unwrap());
    m.check().unwrap();
    // Cache the read-only translation, fault on a store, upgrade.
    m.read_u64(v).unwrap();
    assert!(m.write_u64(v, 7).is_err());
    s.stats().reset();
    assert!(s.ptep_set_access_flags(v, FaultFlags::WRITE).unwrap());
    assert_eq!(s.stats().flushes(), 1);
    m.check().unwrap();
    let e = s.ptep_get(v).unwrap();
    assert!(e.prot().unwrap().writable() && e.dirty() && e.young());
    m.write_u64(v, 7).unwrap();
    assert_eq!(m.phys_read_u64(PhysAddr(PA + K4)), 7);
    // The other page kept its protection.
    assert!(!s.ptep_get(VirtAddr(VA)).unwrap().prot().unwrap().writable());
    assert_eq!(
        s.ptep_set_access_flags(VirtAddr(VA + 9 * K4), FaultFlags::DIRTY),
        Err(Error::NotMapped(VirtAddr(VA + 9 * K4)))
    );
    m.check().unwrap();
}

/// Instantiates every case above for one format.
#[macro_export]
macro_rules! ops_tests {
    ($m:ident, $a:ident) => {
        mod $m {
            type A = super::$a;

            #[test]
            fn unmap_with_reports_each_removed_entry() {
                super::ops::unmap_with_reports_each_removed_entry::<A>();
            }
            #[test]
            fn unmap_with_reports_leaves_of_whole_tables() {
                super::ops::unmap_with_reports_leaves_of_whole_tables::<A>();
            }
            #[test]
            fn unmap_with_error_changes_nothing() {
                super::ops::unmap_with_error_changes_nothing::<A>();
            }
            #[test]
            fn unmap_with_loses_no_dirty_state_under_the_agent() {
                super::ops::unmap_with_loses_no_dirty_state_under_the_agent::<A>(1000);
            }
            #[test]
            fn gather_batches_one_flush_and_defers_frees() {
                super::ops::gather_batches_one_flush_and_defers_frees::<A>();
            }
            #[test]
            fn gather_errors_change_nothing() {
                super::ops::gather_errors_change_nothing::<A>();
            }
            #[test]
            fn dropping_an_unfinished_gather_finishes_it() {
                super::ops::dropping_an_unfinished_gather_finishes_it::<A>();
            }
            #[test]
            fn a_gather_dropped_while_unwinding_still_flushes() {
                super::ops::a_gather_dropped_while_unwinding_still_flushes::<A>();
            }
            #[test]
            fn test_and_clear_young_round_trip() {
                super::ops::test_and_clear_young_round_trip::<A>();
            }
            #[test]
            fn clear_refs_cleans_and_the_next_store_redirties() {
                super::ops::clear_refs_cleans_and_the_next_store_redirties::<A>();
            }
            #[test]
            fn clear_refs_errors_change_nothing() {
                super::ops::clear_refs_errors_change_nothing::<A>();
            }
            #[test]
            fn clear_refs_harvests_blocks_whole() {
                super::ops::clear_refs_harvests_blocks_whole::<A>();
            }
            #[test]
            fn clear_refs_loses_no_update_under_the_agent() {
                super::ops::clear_refs_loses_no_update_under_the_agent::<A>(200);
            }
            #[test]
            fn install_pte_allocates_only_missing_tables() {
                super::ops::install_pte_allocates_only_missing_tables::<A>();
            }
            #[test]
            fn install_pte_errors_change_nothing() {
                super::ops::install_pte_errors_change_nothing::<A>();
            }
            #[test]
            fn set_access_flags_relaxes_in_place() {
                super::ops::set_access_flags_relaxes_in_place::<A>();
            }
        }
    };
}
