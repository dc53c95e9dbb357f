//! `replace_pte` (reclaim, copy-on-write, swap-in in place), its gathered
//! form, and `MmuGather::zap_page_range` (an unmap that keeps the tables).

use pgtable_core::contract::{Arch, NewPte};
use pgtable_core::sim::{CheckError, SimMachine};
use pgtable_core::{Error, LeafEntry, MapOptions, PhysAddr, Prot, VirtAddr};

use super::{map, setup, snapshot, Space, G1, K4, M2, PA, URW, VA};

/// A user read-only page: what a copy-on-write fork leaves in the parent.
const URO: Prot = Prot::USER;
/// Where the frames of the swap-ins and copies come from.
const NEW_PA: u64 = PA + 4 * G1;

/// Loads every page of `[VA, VA + n pages)`, stores to every third one:
/// the TLB caches them all, the hardware marks them accessed (and dirty).
fn touch<A: Arch>(m: &SimMachine<A>, n: u64) {
    touch_each(m, 0..n);
}

/// [`touch`] of the pages `pages` (indices from `VA`) only.
fn touch_each<A: Arch>(m: &SimMachine<A>, pages: impl IntoIterator<Item = u64>) {
    for i in pages {
        let va = VirtAddr(VA + i * K4);
        if i % 3 == 0 {
            m.write_u64(va, 0x5000 + i).unwrap();
        } else {
            m.read_u64(va).unwrap();
        }
    }
}

/// The accessed/dirty state of the PTE of `va`, as `ptep_get` reports it.
fn ad<A: Arch>(s: &Space<A>, va: VirtAddr) -> (bool, bool) {
    let e = s.ptep_get(va).expect("mapped");
    (e.young(), e.dirty())
}

/// Swap-out of a whole PTE table with an allocator that refuses every
/// allocation: each page becomes a software entry in place, the entry
/// returned carries its frame and final accessed/dirty state, no table is
/// freed or allocated, and the simulator finds no stale translation.
/// Swap-in then works under the same allocator. The old sequence (unmap,
/// then `install_pte` of `NewPte::Swap`) frees the table and cannot get it back.
pub fn replace_pte_reclaims_a_full_table_without_allocating<A: Arch>() {
    let (m, mut s) = setup::<A>();
    map(&mut s, 0, M2, URW, MapOptions::PAGES.no_contiguous());
    // Every page of the full table natively; under Miri the first four
    // and every 29th (`miri_sample`), the others staying mapped pages.
    let pages: Vec<u64> = (0..512)
        .filter(|&i| i < 4 || crate::miri_sample(i as usize))
        .collect();
    touch_each(&m, pages.iter().copied());
    let states: Vec<_> = pages
        .iter()
        .map(|&i| ad(&s, VirtAddr(VA + i * K4)))
        .collect();
    assert!(states[0].1 && states[3].1, "stores are recorded");
    let tables = m.live_tables();
    m.fail_after(Some(0));
    for (&i, &state) in pages.iter().zip(&states) {
        let va = VirtAddr(VA + i * K4);
        let old = s.replace_pte(va, NewPte::Swap(100 + i)).unwrap();
        assert_eq!(old.pa(), Some(PhysAddr(PA + i * K4)), "page {i}");
        assert_eq!((old.young(), old.dirty()), state, "page {i}");
        assert_eq!(old.dirty(), i % 3 == 0, "page {i}");
        assert!(m.read_u64(va).is_err(), "page {i} still reachable");
    }
    m.check().unwrap();
    assert_eq!(m.live_tables(), tables, "a table was freed or allocated");
    for &i in &pages {
        let e = s.ptep_get(VirtAddr(VA + i * K4)).unwrap();
        assert_eq!(e.swap_value(), Some(100 + i));
    }
    // Swap-in, still without a table to spare.
    for &i in &pages {
        let va = VirtAddr(VA + i * K4);
        let pa = PhysAddr(NEW_PA + i * K4);
        m.phys_write_u64(pa, 0xa000 + i);
        let old = s.replace_pte(va, NewPte::Page { pa, prot: URW }).unwrap();
        assert_eq!((old.swap_value(), old.pa()), (Some(100 + i), None));
        assert_eq!(m.read_u64(va), Ok(0xa000 + i));
    }
    m.check().unwrap();
    assert_eq!(m.live_tables(), tables);
    // What replace_pte replaces: unmapping first frees the table, and the
    // software entry then needs it back.
    let mut old = Vec::new();
    s.unmap_with(VirtAddr(VA), M2, |r| old.push(r)).unwrap();
    assert_eq!(old.len(), 512);
    assert!(m.live_tables() < tables);
    assert_eq!(
        s.install_pte(VirtAddr(VA), NewPte::Swap(1)),
        Err(Error::OutOfMemory)
    );
    m.fail_after(None);
    m.check().unwrap();
}

/// Copy-on-write: a read-only page replaced by its private copy. The
/// translation moves to the new frame with one flush, no TLB keeps the
/// old one, the old frame is returned, and the copy is writable.
pub fn replace_pte_cow_moves_the_page_to_its_copy<A: Arch>() {
    let (m, mut s) = setup::<A>();
    map(&mut s, 0, 4 * K4, URO, MapOptions::PAGES);
    let va = VirtAddr(VA + K4);
    m.phys_write_u64(PhysAddr(PA + K4), 0x1111);
    assert_eq!(m.read_u64(va), Ok(0x1111));
    assert!(m.write_u64(va, 1).is_err(), "read-only before the copy");
    let copy = PhysAddr(NEW_PA);
    m.phys_write_u64(copy, 0x1111);
    let flushes = s.stats().flushes();
    let tables = m.live_tables();
    m.fail_after(Some(0));
    let old = s
        .replace_pte(
            va,
            NewPte::Page {
                pa: copy,
                prot: URW,
            },
        )
        .unwrap();
    m.fail_after(None);
    assert_eq!(s.stats().flushes(), flushes + 1, "one flush");
    assert_eq!(old.pa(), Some(PhysAddr(PA + K4)));
    assert_eq!(old.prot().map(|p| p.writable()), Some(false));
    assert!(old.young(), "the load marked it accessed");
    assert_eq!(m.live_tables(), tables);
    m.check().unwrap();
    assert_eq!(s.translate(va).unwrap().pa, copy);
    m.write_u64(va, 0x2222).unwrap();
    assert_eq!(m.phys_read_u64(copy), 0x2222);
    assert_eq!(
        m.phys_read_u64(PhysAddr(PA + K4)),
        0x1111,
        "old frame unchanged"
    );
    // The neighbours are untouched.
    assert_eq!(s.translate(VirtAddr(VA)).unwrap().pa, PhysAddr(PA));
    assert_eq!(s.translate(va.add(K4)).unwrap().pa, PhysAddr(PA + 2 * K4));
    m.check().unwrap();
}

/// Every refusal of `replace_pte` (and of its gathered form) leaves the
/// tables exactly as they were.
pub fn replace_pte_errors_change_nothing<A: Arch>() {
    let (m, mut s) = setup::<A>();
    map(&mut s, 0, 2 * K4, URW, MapOptions::PAGES);
    let block = A::leaf_allowed(1);
    if block {
        map(&mut s, M2, M2, URW, MapOptions::BLOCKS);
    }
    let before = snapshot(&s, VA, 2 * M2);
    let tables = m.live_tables();
    let page = NewPte::Page {
        pa: PhysAddr(NEW_PA),
        prot: URW,
    };
    let wide = 1u64 << A::SWP_VALUE_BITS;
    let empty = VirtAddr(VA + 2 * K4);
    let no_table = VirtAddr(VA + 8 * G1);
    let mut cases = vec![
        (
            VirtAddr(VA + 1),
            page,
            Error::MisalignedVirt(VirtAddr(VA + 1)),
        ),
        (
            VirtAddr(VA),
            NewPte::Page {
                pa: PhysAddr(NEW_PA + 8),
                prot: URW,
            },
            Error::MisalignedPhys(PhysAddr(NEW_PA + 8)),
        ),
        (
            VirtAddr(VA),
            NewPte::Swap(wide),
            Error::SwapValueTooWide(wide),
        ),
        (empty, page, Error::NotMapped(empty)),
        (empty, NewPte::Swap(1), Error::NotMapped(empty)),
        (no_table, NewPte::Swap(1), Error::NotMapped(no_table)),
    ];
    if block {
        let inside = VirtAddr(VA + M2 + 5 * K4);
        cases.push((inside, NewPte::Swap(1), Error::BlockMapped(inside)));
        cases.push((inside, page, Error::BlockMapped(inside)));
    }
    for &(va, new, e) in &cases {
        assert_eq!(s.replace_pte(va, new).map(|_| ()), Err(e), "{va} {new:?}");
        assert_eq!(snapshot(&s, VA, 2 * M2), before, "{va} {new:?}");
    }
    let mut tlb = s.tlb_gather_mmu();
    for &(va, new, e) in &cases {
        assert_eq!(tlb.replace_pte(va, new).map(|_| ()), Err(e), "{va} {new:?}");
    }
    assert!(tlb.is_empty());
    tlb.finish();
    assert_eq!(snapshot(&s, VA, 2 * M2), before);
    assert_eq!(m.live_tables(), tables);
    m.check().unwrap();
}

/// The gathered swap-out defers its flush to the gather's end (the
/// simulator sees the stale translations until then), with the final
/// dirty state already returned; a gathered copy-on-write flushes its page
/// at once; and a swap-out then swap-in of one page in one gather flushes
/// before the new frame is written.
pub fn gathered_replace_pte_defers_only_the_swap_out_flush<A: Arch>() {
    let (m, mut s) = setup::<A>();
    map(&mut s, 0, 32 * K4, URW, MapOptions::PAGES.no_contiguous());
    touch(&m, 32);
    let flushes = s.stats().flushes();
    let mut tlb = s.tlb_gather_mmu();
    let mut dirty = Vec::new();
    for i in 0..16 {
        let old = tlb
            .replace_pte(VirtAddr(VA + i * K4), NewPte::Swap(i))
            .unwrap();
        dirty.push(old.dirty());
    }
    assert_eq!(dirty, (0..16).map(|i| i % 3 == 0).collect::<Vec<_>>());
    assert_eq!(tlb.space().stats().flushes(), flushes, "flushed early");
    assert!(matches!(m.check(), Err(CheckError::Stale(_))));
    tlb.finish();
    assert_eq!(s.stats().flushes(), flushes + 1);
    m.check().unwrap();

    // Copy-on-write in a gather: flushed at once, before the new frame.
    let flushes = s.stats().flushes();
    let mut tlb = s.tlb_gather_mmu();
    let va = VirtAddr(VA + 20 * K4);
    let copy = NewPte::Page {
        pa: PhysAddr(NEW_PA),
        prot: URW,
    };
    let old = tlb.replace_pte(va, copy).unwrap();
    assert_eq!(old.pa(), Some(PhysAddr(PA + 20 * K4)));
    assert_eq!(tlb.space().stats().flushes(), flushes + 1);
    m.check().unwrap();
    // Out and in again before the gather ends: the pending flush goes
    // first.
    let va = VirtAddr(VA + 21 * K4);
    tlb.replace_pte(va, NewPte::Swap(7)).unwrap();
    let back = NewPte::Page {
        pa: PhysAddr(NEW_PA + K4),
        prot: URW,
    };
    assert_eq!(tlb.replace_pte(va, back).unwrap().swap_value(), Some(7));
    m.check().unwrap();
    tlb.finish();
    m.check().unwrap();
    assert_eq!(s.translate(va).unwrap().pa, PhysAddr(NEW_PA + K4));
}

/// The hardware rule `replace_pte` relies on, broken: a new frame written
/// over a present page that a TLB caches, without the clear and flush
/// first, or after a gathered swap-out before the gather's flush. The
/// simulator reports both (a stale translation, or on arm64 a
/// break-before-make conflict), where `replace_pte` passes.
pub fn replace_without_the_flush_is_caught<A: Arch>() {
    let (m, mut s) = setup::<A>();
    map(&mut s, 0, 2 * K4, URW, MapOptions::PAGES);
    m.read_u64(VirtAddr(VA)).unwrap();
    m.read_u64(VirtAddr(VA + K4)).unwrap();
    let new = A::leaf(PhysAddr(NEW_PA), URW, 0);
    // SAFETY: the entry is a PTE of this space; the new value is a leaf
    // of this format mapping a page the simulated RAM holds.
    let slot = unsafe { s.inspect().slot(VirtAddr(VA), 0) }.unwrap();
    A::set_pte_at(s.mmu(), VirtAddr(VA), slot, new);
    let e = m.check();
    assert!(
        matches!(e, Err(CheckError::Stale(_) | CheckError::Conflict(_))),
        "not caught: {e:?}"
    );
    // Broken across two gathered calls: a swap-out whose flush waits for
    // the gather, then the new frame written before that flush (what the
    // gathered swap-in must not do).
    let (m, mut s) = setup::<A>();
    map(&mut s, 0, 2 * K4, URW, MapOptions::PAGES);
    m.read_u64(VirtAddr(VA)).unwrap();
    let mut tlb = s.tlb_gather_mmu();
    tlb.replace_pte(VirtAddr(VA), NewPte::Swap(3)).unwrap();
    // SAFETY: as above.
    let slot = unsafe { tlb.space().inspect().slot(VirtAddr(VA), 0) }.unwrap();
    A::set_pte_at(tlb.space().mmu(), VirtAddr(VA), slot, new);
    let e = m.check();
    assert!(
        matches!(e, Err(CheckError::Stale(_) | CheckError::Conflict(_))),
        "not caught: {e:?}"
    );
    tlb.finish();
    // The correct sequence beside it, on the other page.
    let (m, mut s) = setup::<A>();
    map(&mut s, 0, 2 * K4, URW, MapOptions::PAGES);
    m.read_u64(VirtAddr(VA)).unwrap();
    let page = NewPte::Page {
        pa: PhysAddr(NEW_PA),
        prot: URW,
    };
    s.replace_pte(VirtAddr(VA), page).unwrap();
    m.check().unwrap();
}

/// `zap_page_range` clears and reports every entry but frees no table:
/// the range is refilled without an allocation, and an ordinary unmap
/// afterwards frees the emptied tables, back to the count before the map.
pub fn zap_page_range_keeps_the_tables_for_a_refill<A: Arch>() {
    let (m, mut s) = setup::<A>();
    let base = m.live_tables();
    map(&mut s, 0, 2 * M2, URW, MapOptions::PAGES.no_contiguous());
    touch(&m, 1024);
    let mapped = m.live_tables();
    let mut got: Vec<LeafEntry<A>> = Vec::new();
    let mut tlb = s.tlb_gather_mmu();
    tlb.zap_page_range(VirtAddr(VA), 2 * M2, |r| got.push(r))
        .unwrap();
    assert_eq!(tlb.tables_queued(), 0);
    tlb.finish();
    m.check().unwrap();
    assert_eq!(got.len(), 1024);
    got.sort_by_key(|r| r.va().0);
    for (i, r) in got.iter().enumerate() {
        let i = i as u64;
        assert_eq!(r.pa(), Some(PhysAddr(PA + i * K4)), "page {i}");
        assert_eq!(r.dirty(), i % 3 == 0, "page {i}");
    }
    assert_eq!(m.live_tables(), mapped, "a table was freed");
    assert_eq!(s.inspect().count_tables(), mapped);
    assert!(s.translate(VirtAddr(VA)).is_none());
    // Refilled with no table to spare.
    m.fail_after(Some(0));
    for i in 0..1024 {
        let va = VirtAddr(VA + i * K4);
        s.install_pte(
            va,
            NewPte::Page {
                pa: PhysAddr(NEW_PA + i * K4),
                prot: URW,
            },
        )
        .unwrap();
    }
    m.fail_after(None);
    m.check().unwrap();
    // A zap that empties them, then the ordinary unmap frees them.
    let mut tlb = s.tlb_gather_mmu();
    tlb.zap_page_range(VirtAddr(VA), 2 * M2, |_| {}).unwrap();
    tlb.finish();
    assert_eq!(m.live_tables(), mapped);
    s.unmap(VirtAddr(VA), 2 * M2).unwrap();
    assert_eq!(m.live_tables(), base, "emptied tables not freed");
    assert_eq!(s.inspect().count_tables(), base);
    m.check().unwrap();
}

/// A page of a folded contiguous run (arm64 contiguous hint, RISC-V
/// Svnapot) replaced by a software entry and by another frame: the run is
/// unfolded first, the entry returned carries the run's accessed/dirty
/// state, the other pages keep their translations, and the simulator finds
/// no misprogrammed run or stale translation. For formats with runs.
pub fn replace_pte_in_a_folded_run_unfolds_it<A: Arch>() {
    let n = u64::from(A::cont_entries(0));
    assert!(n > 1, "{}: no contiguous runs", A::NAME);
    let run = n * K4;
    let (m, mut s) = setup::<A>();
    map(&mut s, 0, 2 * run, URW, MapOptions::PAGES);
    let folded = |s: &Space<A>, va: u64| A::is_cont(s.inspect().entry(VirtAddr(va), 0).unwrap(), 0);
    assert!(folded(&s, VA) && folded(&s, VA + run));
    // A store to the first page of each run marks the run dirty.
    m.write_u64(VirtAddr(VA), 1).unwrap();
    m.write_u64(VirtAddr(VA + run), 1).unwrap();
    let at = VirtAddr(VA + 5 * K4);
    m.read_u64(at).unwrap();
    let old = s.replace_pte(at, NewPte::Swap(9)).unwrap();
    assert_eq!(old.pa(), Some(PhysAddr(PA + 5 * K4)));
    assert!(old.dirty(), "the run's dirty state");
    m.check().unwrap();
    assert!(
        (0..n).all(|k| k == 5 || !folded(&s, VA + k * K4)),
        "still folded"
    );
    for k in (0..n).filter(|&k| k != 5) {
        let va = VirtAddr(VA + k * K4);
        assert_eq!(s.translate(va).unwrap().pa, PhysAddr(PA + k * K4));
    }
    assert!(m.read_u64(at).is_err());
    // Copy-on-write inside the second run.
    let at = VirtAddr(VA + run + 3 * K4);
    m.read_u64(at).unwrap();
    let copy = NewPte::Page {
        pa: PhysAddr(NEW_PA),
        prot: URW,
    };
    let old = s.replace_pte(at, copy).unwrap();
    assert_eq!(old.pa(), Some(PhysAddr(PA + run + 3 * K4)));
    assert!(old.dirty(), "the run's dirty state");
    m.check().unwrap();
    assert_eq!(s.translate(at).unwrap().pa, PhysAddr(NEW_PA));
    assert!(
        (0..n).all(|k| !folded(&s, VA + run + k * K4)),
        "still folded"
    );
    m.write_u64(at, 2).unwrap();
    m.check().unwrap();
}
