//! Tests of `change_protection` (mprotect for page tables, Linux "arm64: mm: rework the pmd protect changing flow").
//!
//! Run with `--features alloc,stats`: the counters are part of what is
//! checked.

use std::cell::{Cell, RefCell};
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::time::{Duration, Instant};

use pgtable_testkit::miri_scaled;

use pgtable_core::contract::{
    Access, AccessFault, Arch, Arena, Format, Mmu, Slot, TlbRange, PAGE_SIZE,
};
use pgtable_core::test_format::{TestFormat, ACCESSED, ADDR_MASK, DIRTY, VALID, WRITE, XN};
use pgtable_core::{
    variants::{DeferredBlockProt, GenericBlockProt},
    AddressSpace, Error, MapOptions, Mapping, MemType, PhysAddr, Prot, VirtAddr,
};

const KIB4: u64 = PAGE_SIZE;
const MIB2: u64 = 2 << 20;
const GIB: u64 = 1 << 30;
/// Where the tests map (1 GiB aligned, so 2 MiB and 1 GiB blocks fit).
const BASE: VirtAddr = VirtAddr(16 * GIB);
const PA: PhysAddr = PhysAddr(0x40_0000_0000);

/// One entry write the MMU observed: slot address, old value, new value.
type Write = (usize, u64, u64);

/// A counting MMU: records flushes, barriers and every entry write.
#[derive(Default)]
struct CountMmu {
    ranges: RefCell<Vec<TlbRange>>,
    all: Cell<u64>,
    barriers: Cell<u64>,
    writes: RefCell<Vec<Write>>,
}

impl CountMmu {
    fn flushes(&self) -> u64 {
        self.ranges.borrow().len() as u64 + self.all.get()
    }

    fn reset(&self) {
        self.ranges.borrow_mut().clear();
        self.all.set(0);
        self.barriers.set(0);
        self.writes.borrow_mut().clear();
    }
}

// SAFETY: a host test MMU: no hardware walker uses these tables, or it
// forwards to the simulator, which upholds the contract.
unsafe impl Mmu for CountMmu {
    const OBSERVES_WRITES: bool = true;

    fn walker_barrier(&self) {
        self.barriers.set(self.barriers.get() + 1);
    }

    fn flush_tlb_range(&self, range: TlbRange) {
        self.ranges.borrow_mut().push(range);
    }

    fn flush_tlb_all(&self) {
        self.all.set(self.all.get() + 1);
    }

    unsafe fn install_root(&self, _root: PhysAddr) {}

    fn entry_written(&self, slot: &Slot, old: u64) {
        let new = slot.load(Relaxed);
        self.writes
            .borrow_mut()
            .push((slot as *const Slot as usize, old, new));
    }
}

type Space<A = TestFormat> = AddressSpace<A, CountMmu, Arena>;
/// The test format with its default four levels.
type TF = TestFormat<4>;

fn space<A: Arch>() -> Space<A> {
    AddressSpace::new(CountMmu::default(), Arena::new()).unwrap()
}

/// Every leaf in the lower half, in address order.
fn listing<A: Arch, M: Mmu>(s: &AddressSpace<A, M, Arena>) -> Vec<Mapping> {
    let mut v = Vec::new();
    s.walk(VirtAddr(0), 1 << 47, |m| v.push(m)).unwrap();
    v
}

/// Sets `bits` (accessed/dirty) in the leaf at `height` that maps `va`, as
/// the hardware does on an access through it.
fn hw_set<A: Arch, M: Mmu>(s: &AddressSpace<A, M, Arena>, va: VirtAddr, height: u32, bits: u64) {
    // SAFETY: only the accessed/dirty state of an existing leaf changes, as
    // the hardware changes it; these spaces are never installed.
    let slot = unsafe { s.inspect().slot(va, height) }.unwrap();
    slot.fetch_or(bits, Relaxed);
}

/// The host address of the entry at `height` for `va`, to compare with the
/// slots an MMU saw written.
fn slot_addr<A: Arch, M: Mmu>(s: &AddressSpace<A, M, Arena>, va: VirtAddr, height: u32) -> usize {
    // SAFETY: only the address is taken.
    let slot = unsafe { s.inspect().slot(va, height) }.unwrap();
    (slot as *const Slot).expose_provenance()
}

fn reset<A: Arch>(s: &Space<A>) {
    s.mmu().reset();
    s.stats().reset();
}

// ----- protection semantics -----

#[test]
fn pages_become_read_only_then_writable_again_at_the_same_addresses() {
    let mut s = space::<TestFormat>();
    let n = 40;
    s.map(BASE, PA, n * KIB4, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    s.change_protection(BASE, n * KIB4, Prot::READ_ONLY)
        .unwrap();
    for i in 0..n {
        let t = s.translate(BASE.add(i * KIB4 + 0x123)).unwrap();
        assert_eq!(t.prot, Prot::READ_ONLY, "page {i}");
        assert_eq!(t.pa, PhysAddr(PA.0 + i * KIB4 + 0x123));
        assert_eq!(t.height, 0);
        assert_eq!(
            TF::hw_access(t.entry, 0, Access::WRITE),
            Err(AccessFault::Write)
        );
    }
    s.change_protection(BASE, n * KIB4, Prot::READ_WRITE)
        .unwrap();
    for i in 0..n {
        let t = s.translate(BASE.add(i * KIB4)).unwrap();
        assert_eq!(t.prot, Prot::READ_WRITE, "page {i}");
        assert_eq!(t.pa, PhysAddr(PA.0 + i * KIB4));
        assert!(TF::hw_access(t.entry, 0, Access::WRITE).is_ok());
    }
}

#[test]
fn execute_permission_is_granted_and_taken_away() {
    let mut s = space::<TestFormat>();
    s.map(BASE, PA, 4 * KIB4, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    assert_eq!(
        TF::hw_access(s.translate(BASE).unwrap().entry, 0, Access::EXEC),
        Err(AccessFault::Exec)
    );
    s.change_protection(BASE, 4 * KIB4, Prot::READ_EXEC)
        .unwrap();
    let t = s.translate(BASE.add(3 * KIB4)).unwrap();
    assert_eq!(t.prot, Prot::READ_EXEC);
    assert_eq!(t.entry & XN, 0);
    assert!(TF::hw_access(t.entry, 0, Access::EXEC).is_ok());
    // Execute-never again (and writable).
    s.change_protection(BASE, 4 * KIB4, Prot::READ_WRITE)
        .unwrap();
    let t = s.translate(BASE.add(3 * KIB4)).unwrap();
    assert_ne!(t.entry & XN, 0);
    assert_eq!(
        TF::hw_access(t.entry, 0, Access::EXEC),
        Err(AccessFault::Exec)
    );
}

#[test]
fn whole_blocks_change_in_place_without_splitting() {
    let mut s = space::<TestFormat>();
    s.map(
        BASE,
        PA,
        GIB + 2 * MIB2,
        Prot::READ_WRITE,
        MapOptions::BLOCKS,
    )
    .unwrap();
    let tables = s.inspect().count_tables();
    s.change_protection(BASE, GIB + 2 * MIB2, Prot::READ_ONLY)
        .unwrap();
    assert_eq!(s.inspect().count_tables(), tables);
    let l = listing(&s);
    assert_eq!(l.len(), 3);
    assert_eq!((l[0].height, l[1].height, l[2].height), (2, 1, 1));
    for m in &l {
        assert_eq!(m.prot, Prot::READ_ONLY);
        assert_eq!(m.pa.0 - PA.0, m.va.0 - BASE.0);
    }
}

#[test]
fn partly_covered_block_is_split_and_the_rest_keeps_its_protection() {
    let mut s = space::<TestFormat>();
    s.map(BASE, PA, MIB2, Prot::READ_WRITE, MapOptions::BLOCKS)
        .unwrap();
    let tables = s.inspect().count_tables();
    let (lo, hi) = (5, 8);
    s.change_protection(BASE.add(lo * KIB4), (hi - lo) * KIB4, Prot::READ_ONLY)
        .unwrap();
    assert_eq!(s.inspect().count_tables(), tables + 1);
    for i in 0..512 {
        let t = s.translate(BASE.add(i * KIB4)).unwrap();
        assert_eq!(t.height, 0, "page {i} is a 4 KiB page now");
        assert_eq!(t.pa, PhysAddr(PA.0 + i * KIB4), "page {i} keeps its PA");
        let want = if (lo..hi).contains(&i) {
            Prot::READ_ONLY
        } else {
            Prot::READ_WRITE
        };
        assert_eq!(t.prot, want, "page {i}");
    }
}

#[test]
fn partly_covered_pud_block_splits_down_two_levels() {
    let mut s = space::<TestFormat>();
    s.map(BASE, PA, GIB, Prot::READ_WRITE, MapOptions::BLOCKS)
        .unwrap();
    assert_eq!(s.translate(BASE).unwrap().height, 2);
    let tables = s.inspect().count_tables();
    // Two whole 2 MiB blocks plus one page of the block after them.
    let va = BASE.add(3 * MIB2);
    s.change_protection(va, 2 * MIB2 + KIB4, Prot::READ_EXEC)
        .unwrap();
    // One PMD table for the PUD block, one PTE table for the PMD block.
    assert_eq!(s.inspect().count_tables(), tables + 2);
    let l = listing(&s);
    assert_eq!(l.len(), 512 - 1 + 512);
    for m in &l {
        assert_eq!(m.pa.0 - PA.0, m.va.0 - BASE.0, "{m:?}");
        let inside = m.va >= va && m.va < va.add(2 * MIB2 + KIB4);
        let want = if inside {
            Prot::READ_EXEC
        } else {
            Prot::READ_WRITE
        };
        assert_eq!(m.prot, want, "{m:?}");
        let height = if m.va >= BASE.add(5 * MIB2) && m.va < BASE.add(6 * MIB2) {
            0
        } else {
            1
        };
        assert_eq!(m.height, height, "{m:?}");
    }
}

#[test]
fn block_with_the_requested_protection_is_not_split() {
    let mut s = space::<TestFormat>();
    s.map(BASE, PA, MIB2, Prot::READ_ONLY, MapOptions::BLOCKS)
        .unwrap();
    let tables = s.inspect().count_tables();
    reset(&s);
    s.change_protection(BASE.add(KIB4), KIB4, Prot::READ_ONLY)
        .unwrap();
    assert_eq!(s.inspect().count_tables(), tables);
    assert_eq!(s.translate(BASE).unwrap().height, 1);
    assert_eq!(s.stats().entries_written(), 0);
    assert_eq!(s.mmu().flushes(), 0);
    assert_eq!(s.stats().tables_allocated(), 0);
}

#[test]
fn accessed_and_dirty_state_survives_protection_changes() {
    let mut s = space::<TestFormat>();
    s.map(BASE, PA, MIB2, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    s.map(
        BASE.add(MIB2),
        PhysAddr(PA.0 + MIB2),
        MIB2,
        Prot::READ_WRITE,
        MapOptions::BLOCKS,
    )
    .unwrap();
    let ad = |i: u64| [0, ACCESSED, ACCESSED | DIRTY, DIRTY][(i % 4) as usize];
    for i in 0..512 {
        hw_set(&s, BASE.add(i * KIB4), 0, ad(i));
    }
    hw_set(&s, BASE.add(MIB2), 1, ACCESSED | DIRTY);
    for prot in [Prot::READ_ONLY, Prot::READ_EXEC, Prot::READ_WRITE] {
        s.change_protection(BASE, 2 * MIB2, prot).unwrap();
        for i in 0..512 {
            let t = s.translate(BASE.add(i * KIB4)).unwrap();
            assert_eq!(t.prot, prot);
            assert_eq!(
                t.entry & (ACCESSED | DIRTY),
                ad(i),
                "page {i} after {prot:?}"
            );
        }
        let b = s.translate(BASE.add(MIB2)).unwrap();
        assert_eq!((b.height, b.prot), (1, prot));
        assert_eq!(b.entry & (ACCESSED | DIRTY), ACCESSED | DIRTY);
    }
}

#[test]
fn split_children_inherit_accessed_and_dirty_state() {
    let mut s = space::<TestFormat>();
    s.map(BASE, PA, MIB2, Prot::READ_WRITE, MapOptions::BLOCKS)
        .unwrap();
    hw_set(&s, BASE, 1, ACCESSED | DIRTY);
    s.change_protection(BASE, KIB4, Prot::READ_ONLY).unwrap();
    for i in [0, 1, 511] {
        let t = s.translate(BASE.add(i * KIB4)).unwrap();
        assert_eq!(t.entry & (ACCESSED | DIRTY), ACCESSED | DIRTY, "page {i}");
    }
}

#[test]
fn unchanged_entries_are_not_written_and_not_flushed() {
    let mut s = space::<TestFormat>();
    s.map(BASE, PA, 64 * KIB4, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    reset(&s);
    s.change_protection(BASE, 64 * KIB4, Prot::READ_WRITE)
        .unwrap();
    assert_eq!(s.stats().entries_written(), 0);
    assert_eq!(s.stats().flushes(), 0);
    assert_eq!(s.stats().barriers(), 0);
    assert!(s.mmu().writes.borrow().is_empty());

    // Pages 10..20 read-only already: the second change writes the other 54.
    s.change_protection(BASE.add(10 * KIB4), 10 * KIB4, Prot::READ_ONLY)
        .unwrap();
    reset(&s);
    s.change_protection(BASE, 64 * KIB4, Prot::READ_ONLY)
        .unwrap();
    assert_eq!(s.stats().entries_written(), 54);
    let written: Vec<usize> = s.mmu().writes.borrow().iter().map(|w| w.0).collect();
    for i in 10..20 {
        let a = slot_addr(&s, BASE.add(i * KIB4), 0);
        assert!(!written.contains(&a), "page {i} was rewritten");
    }
    // Only the span between the first and last changed page is flushed.
    reset(&s);
    s.change_protection(BASE.add(5 * KIB4), 3 * KIB4, Prot::READ_WRITE)
        .unwrap();
    s.change_protection(BASE, 64 * KIB4, Prot::READ_WRITE)
        .unwrap();
    let r = s.mmu().ranges.borrow().clone();
    assert_eq!(r.len(), 1, "{r:?}");
    // The first call changed pages 5..8 only, so it flushed just them; the
    // second changed the other 61 (past the ceiling: one full flush).
    assert_eq!(r[0].start, BASE.add(5 * KIB4));
    assert_eq!(r[0].end, BASE.add(8 * KIB4));
    assert_eq!(s.mmu().all.get(), 1);
}

#[test]
fn small_change_flushes_exactly_its_pages_at_last_level() {
    let mut s = space::<TestFormat>();
    s.map(BASE, PA, 16 * KIB4, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    reset(&s);
    s.change_protection(BASE.add(2 * KIB4), 3 * KIB4, Prot::READ_ONLY)
        .unwrap();
    let r = s.mmu().ranges.borrow().clone();
    assert_eq!(
        r,
        vec![TlbRange {
            start: BASE.add(2 * KIB4),
            end: BASE.add(5 * KIB4),
            stride_shift: 12,
            last_level: true,
        }]
    );
    assert_eq!(s.mmu().all.get(), 0);
}

#[test]
fn holes_in_the_range_are_skipped() {
    let mut s = space::<TestFormat>();
    s.map(BASE, PA, 4 * KIB4, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    let far = BASE.add(GIB + 7 * MIB2);
    s.map(far, PA, MIB2, Prot::READ_WRITE, MapOptions::BLOCKS)
        .unwrap();
    let tables = s.inspect().count_tables();
    s.change_protection(BASE, 2 * GIB, Prot::READ_ONLY).unwrap();
    assert_eq!(
        s.inspect().count_tables(),
        tables,
        "no tables made for holes"
    );
    let l = listing(&s);
    assert_eq!(l.len(), 5);
    assert!(l.iter().all(|m| m.prot == Prot::READ_ONLY));
    assert!(s.translate(BASE.add(4 * KIB4)).is_none());
    // A range with nothing mapped at all is not an error and does nothing.
    reset(&s);
    s.change_protection(BASE.add(8 * GIB), GIB, Prot::READ_EXEC)
        .unwrap();
    assert_eq!(s.stats().entries_written(), 0);
    assert_eq!(s.mmu().flushes(), 0);
}

#[test]
fn pte_tables_get_one_walker_barrier_each() {
    let mut s = space::<TestFormat>();
    // 1000 pages starting mid-table: three PTE tables.
    let va = BASE.add(300 * KIB4);
    s.map(va, PA, 1000 * KIB4, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    reset(&s);
    s.change_protection(va, 1000 * KIB4, Prot::READ_ONLY)
        .unwrap();
    assert_eq!(s.stats().barriers(), 3);
    assert_eq!(s.stats().entries_written(), 1000);
    // One gathered flush: past the ceiling of 33 pages, a full flush.
    assert_eq!(s.mmu().flushes(), 1);
    assert_eq!(s.mmu().all.get(), 1);
}

#[test]
fn lazy_mmu_scope_defers_the_table_barriers_to_its_end() {
    let mut s = space::<TestFormat>();
    s.map(BASE, PA, 1024 * KIB4, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    reset(&s);
    s.lazy_mmu(|s| {
        s.change_protection(BASE, 1024 * KIB4, Prot::READ_ONLY)
            .unwrap();
        assert_eq!(s.stats().barriers(), 0);
    });
    assert_eq!(s.stats().barriers(), 1);
}

#[test]
fn settled_entries_are_stored_once_others_go_through_a_clear() {
    let mut s = space::<TestFormat>();
    s.map(BASE, PA, 3 * KIB4, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    // Page 0 clean, page 1 accessed only (may still become dirty),
    // page 2 accessed and dirty (settled).
    hw_set(&s, BASE.add(KIB4), 0, ACCESSED);
    hw_set(&s, BASE.add(2 * KIB4), 0, ACCESSED | DIRTY);
    assert!(!TF::is_settled(
        s.translate(BASE.add(KIB4)).unwrap().entry,
        0
    ));
    assert!(TF::is_settled(
        s.translate(BASE.add(2 * KIB4)).unwrap().entry,
        0
    ));
    let addr = |s: &Space, i: u64| slot_addr(s, BASE.add(i * KIB4), 0);
    reset(&s);
    s.change_protection(BASE, 3 * KIB4, Prot::READ_ONLY)
        .unwrap();
    let writes = s.mmu().writes.borrow().clone();
    for i in 0..2 {
        let w: Vec<Write> = writes
            .iter()
            .copied()
            .filter(|w| w.0 == addr(&s, i))
            .collect();
        assert_eq!(w.len(), 2, "page {i}: clear, then commit: {w:x?}");
        assert_eq!(w[0].2, 0, "page {i}: the start clears the entry");
        assert_eq!(w[1].1, 0);
    }
    let w: Vec<Write> = writes
        .iter()
        .copied()
        .filter(|w| w.0 == addr(&s, 2))
        .collect();
    assert_eq!(w.len(), 1, "settled page: one plain store: {w:x?}");
    assert_eq!(w[0].2 & (ACCESSED | DIRTY | WRITE), ACCESSED | DIRTY);
    // Read-only and accessed is settled too (it cannot become dirty).
    reset(&s);
    s.change_protection(BASE, 3 * KIB4, Prot::READ_WRITE)
        .unwrap();
    let writes = s.mmu().writes.borrow().clone();
    assert_eq!(writes.iter().filter(|w| w.0 == addr(&s, 0)).count(), 2);
    assert_eq!(writes.iter().filter(|w| w.0 == addr(&s, 1)).count(), 1);
    assert_eq!(writes.iter().filter(|w| w.0 == addr(&s, 2)).count(), 1);
}

#[test]
fn memory_type_change_breaks_before_making_each_entry() {
    let device = Prot::READ_WRITE.with_mem(MemType::Device);
    let mut s = space::<DeferredBlockProt<TestFormat>>();
    s.map(BASE, PA, 4 * KIB4, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    s.map(
        BASE.add(MIB2),
        PA,
        2 * MIB2,
        Prot::READ_WRITE,
        MapOptions::PMD_BLOCKS,
    )
    .unwrap();
    reset(&s);
    s.change_protection(BASE, 3 * MIB2, device).unwrap();
    let r = s.mmu().ranges.borrow().clone();
    // One immediate flush per entry (4 pages, 2 blocks), in address
    // order, then the gathered one (past the ceiling: a full flush).
    assert_eq!(r.len(), 6, "{r:?}");
    for (i, f) in r[..4].iter().enumerate() {
        assert_eq!(
            (f.start, f.end),
            (BASE.add(i as u64 * KIB4), BASE.add((i as u64 + 1) * KIB4))
        );
    }
    assert_eq!((r[4].start, r[4].end), (BASE.add(MIB2), BASE.add(2 * MIB2)));
    assert_eq!(
        (r[5].start, r[5].end),
        (BASE.add(2 * MIB2), BASE.add(3 * MIB2))
    );
    assert_eq!(s.mmu().all.get(), 1);
    for va in [BASE, BASE.add(3 * KIB4), BASE.add(MIB2), BASE.add(2 * MIB2)] {
        assert_eq!(s.translate(va).unwrap().prot, device);
    }
    // Each entry went through none: cleared, then written.
    let w = s.mmu().writes.borrow().clone();
    assert_eq!(w.len(), 12);
    assert!(w
        .chunks(2)
        .all(|p| p[0].2 == 0 && p[1].1 == 0 && p[0].0 == p[1].0));
    // A permission change alone is still made in place, flushed once.
    reset(&s);
    s.change_protection(BASE, 3 * MIB2, Prot::READ_ONLY.with_mem(MemType::Device))
        .unwrap();
    assert_eq!(s.mmu().flushes(), 1);
}

// ----- the block paths: deferred (pmdp_modify_prot_start) versus generic -----

/// Maps `blocks` 2 MiB blocks, changes them all, returns (flushes, TLB
/// flush calls during the change) and checks the result.
fn protect_blocks<A: Arch>(blocks: u64) -> (u64, Vec<TlbRange>) {
    let mut s = space::<A>();
    s.map(
        BASE,
        PA,
        blocks * MIB2,
        Prot::READ_WRITE,
        MapOptions::PMD_BLOCKS,
    )
    .unwrap();
    reset(&s);
    s.change_protection(BASE, blocks * MIB2, Prot::READ_ONLY)
        .unwrap();
    let l = listing(&s);
    assert_eq!(l.len() as u64, blocks);
    assert!(l.iter().all(|m| m.height == 1 && m.prot == Prot::READ_ONLY));
    assert_eq!(s.stats().entries_written(), blocks);
    let ranges = s.mmu().ranges.borrow().clone();
    (s.mmu().flushes(), ranges)
}

#[test]
fn deferred_block_path_flushes_once_for_the_whole_operation() {
    for blocks in [1, 32, 256] {
        let (flushes, ranges) = protect_blocks::<DeferredBlockProt<TestFormat>>(blocks);
        assert_eq!(flushes, 1, "{blocks} blocks");
        if blocks <= 33 {
            assert_eq!(ranges.len(), 1);
            assert_eq!(ranges[0].start, BASE);
            assert_eq!(ranges[0].end, BASE.add(blocks * MIB2));
            assert_eq!(ranges[0].stride_shift, 21);
        }
    }
}

#[test]
fn generic_block_path_flushes_every_block_and_once_more_at_the_end() {
    for blocks in [1, 32, 256] {
        let (flushes, ranges) = protect_blocks::<GenericBlockProt<TestFormat>>(blocks);
        assert_eq!(flushes, blocks + 1, "{blocks} blocks");
        // The per-block flushes cover one block each, in order.
        for (i, r) in ranges.iter().take(blocks as usize).enumerate() {
            assert_eq!(r.start, BASE.add(i as u64 * MIB2));
            assert_eq!(r.end, BASE.add((i as u64 + 1) * MIB2));
        }
        // The test format keeps the generic fallback, like the wrapper.
        let (plain, _) = protect_blocks::<TestFormat>(blocks);
        assert_eq!(plain, flushes);
    }
}

#[test]
fn deferred_block_path_keeps_block_accessed_and_dirty_state() {
    let mut s = space::<DeferredBlockProt<TestFormat>>();
    s.map(BASE, PA, 2 * MIB2, Prot::READ_WRITE, MapOptions::PMD_BLOCKS)
        .unwrap();
    hw_set(&s, BASE, 1, ACCESSED);
    hw_set(&s, BASE.add(MIB2), 1, ACCESSED | DIRTY);
    s.change_protection(BASE, 2 * MIB2, Prot::READ_EXEC)
        .unwrap();
    assert_eq!(
        s.translate(BASE).unwrap().entry & (ACCESSED | DIRTY),
        ACCESSED
    );
    assert_eq!(
        s.translate(BASE.add(MIB2)).unwrap().entry & (ACCESSED | DIRTY),
        ACCESSED | DIRTY
    );
    assert_eq!(s.translate(BASE).unwrap().prot, Prot::READ_EXEC);
}

// ----- errors: typed, tables unchanged, nothing leaked -----

/// Maps a 2 MiB block at `BASE + 2 MiB` and a 1 GiB block at `BASE + 1 GiB`.
fn map_two_blocks(s: &mut Space) {
    s.map(
        BASE.add(MIB2),
        PA,
        MIB2,
        Prot::READ_WRITE,
        MapOptions::BLOCKS,
    )
    .unwrap();
    s.map(BASE.add(GIB), PA, GIB, Prot::READ_WRITE, MapOptions::BLOCKS)
        .unwrap();
}

/// Runs `f` on a space with pages, a 2 MiB block and a 1 GiB block mapped,
/// and checks it fails with `want` leaving everything as it was.
fn fails_unchanged(want: Error, f: impl FnOnce(&mut Space) -> Result<(), Error>) {
    let mut s = space::<TestFormat>();
    s.map(BASE, PA, 8 * KIB4, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    map_two_blocks(&mut s);
    let before = listing(&s);
    let (tables, live) = (s.inspect().count_tables(), s.alloc().live());
    reset(&s);
    assert_eq!(f(&mut s), Err(want));
    assert_eq!(listing(&s), before);
    assert_eq!(s.inspect().count_tables(), tables);
    assert_eq!(s.alloc().live(), live, "leaked table frames");
    assert_eq!(s.mmu().flushes(), 0);
    assert!(s.mmu().writes.borrow().is_empty());
}

#[test]
fn zero_length_is_rejected() {
    fails_unchanged(Error::ZeroLength, |s| {
        s.change_protection(BASE, 0, Prot::READ_ONLY)
    });
}

#[test]
fn misaligned_address_is_rejected() {
    fails_unchanged(Error::MisalignedVirt(BASE.add(0x10)), |s| {
        s.change_protection(BASE.add(0x10), KIB4, Prot::READ_ONLY)
    });
}

#[test]
fn misaligned_length_is_rejected() {
    fails_unchanged(Error::MisalignedLength(KIB4 + 1), |s| {
        s.change_protection(BASE, KIB4 + 1, Prot::READ_ONLY)
    });
}

#[test]
fn range_outside_the_address_space_is_rejected() {
    // Starts non-canonical.
    fails_unchanged(Error::OutOfRange(VirtAddr(1 << 47)), |s| {
        s.change_protection(VirtAddr(1 << 47), KIB4, Prot::READ_ONLY)
    });
    // Runs into the non-canonical hole.
    fails_unchanged(Error::OutOfRange(VirtAddr(1 << 47)), |s| {
        s.change_protection(VirtAddr((1 << 47) - KIB4), 2 * KIB4, Prot::READ_ONLY)
    });
    // Wraps around the top of the 64-bit space.
    fails_unchanged(Error::OutOfRange(VirtAddr(u64::MAX - 0xfff)), |s| {
        s.change_protection(VirtAddr(u64::MAX - 0xfff), 2 * KIB4, Prot::READ_ONLY)
    });
}

#[test]
fn failed_split_allocation_leaves_tables_unchanged() {
    // The 2 MiB block needs one table; none can be had.
    fails_unchanged(Error::OutOfMemory, |s| {
        s.alloc().fail_after(Some(0));
        s.change_protection(BASE.add(MIB2 + KIB4), KIB4, Prot::READ_ONLY)
    });
    // The 1 GiB block needs two (PMD and PTE tables); only the first is had.
    fails_unchanged(Error::OutOfMemory, |s| {
        s.alloc().fail_after(Some(1));
        s.change_protection(BASE.add(GIB + MIB2 + KIB4), KIB4, Prot::READ_ONLY)
    });
    // Both ends of one range partly cover a block: three tables, two had.
    fails_unchanged(Error::OutOfMemory, |s| {
        s.alloc().fail_after(Some(2));
        s.change_protection(BASE.add(MIB2 + KIB4), GIB, Prot::READ_ONLY)
    });
}

#[test]
fn split_reservation_is_exact_when_memory_suffices() {
    let mut s = space::<TestFormat>();
    map_two_blocks(&mut s);
    let live = s.alloc().live();
    // Exactly three tables: the attempt with two fails, with three succeeds.
    s.alloc().fail_after(Some(3));
    s.change_protection(BASE.add(MIB2 + KIB4), GIB, Prot::READ_ONLY)
        .unwrap();
    assert_eq!(s.alloc().live(), live + 3);
    assert_eq!(s.stats().tables_freed(), 0);
    assert_eq!(s.translate(BASE.add(MIB2)).unwrap().prot, Prot::READ_WRITE);
    assert_eq!(
        s.translate(BASE.add(MIB2 + KIB4)).unwrap().prot,
        Prot::READ_ONLY
    );
    let last = BASE.add(GIB + MIB2 + KIB4);
    assert_eq!(
        s.translate(VirtAddr(last.0 - KIB4)).unwrap().prot,
        Prot::READ_ONLY
    );
    assert_eq!(s.translate(last).unwrap().prot, Prot::READ_WRITE);
    assert_eq!(s.translate(last).unwrap().pa, PhysAddr(PA.0 + MIB2 + KIB4));
}

// ----- races with a hardware agent -----

/// Pages of the race tests: 2048, 48 under Miri (where every agent sweep
/// and every change is interpreted; the once-per-round pause still makes
/// each round hit the window).
const RACE_PAGES: u64 = if cfg!(miri) { 48 } else { 2048 };

/// What one round of a race saw.
#[derive(Default)]
struct RaceOutcome {
    /// Pages whose dirty bit the agent set and which lost it.
    lost: usize,
    /// Times the agent found an entry not present (between a start and its
    /// commit) or lost a compare-exchange: the window was hit.
    contended: usize,
    /// Dirty bits the agent set.
    dirtied: usize,
}

/// The hardware agent of one round: performs one store through every leaf
/// (as hardware would: only through a present entry, setting
/// accessed/dirty with a compare-exchange), retrying pages that are not
/// present, and returns the leaves whose dirty bit it set and how often it
/// was contended.
fn agent_round(slots: &[usize], height: u32) -> (Vec<usize>, usize) {
    let mut done = vec![false; slots.len()];
    let mut left = slots.len();
    let mut dirtied = Vec::new();
    let mut contended = 0;
    while left > 0 {
        // Against the direction of the protection change, so they cross.
        for i in (0..slots.len()).rev() {
            if done[i] {
                continue;
            }
            // The first leaf (the first the change takes out) waits for
            // the changer's window of this round (see `pause_in_window`).
            if i == 0 {
                wait_until(&WINDOW_OPEN, |open| open == 1);
            }
            // SAFETY: the address came from a `&Slot` of a table frame that
            // stays allocated until the address space is dropped, after
            // this thread is joined; all accesses to it are atomic.
            let slot = unsafe { &*std::ptr::with_exposed_provenance::<AtomicU64>(slots[i]) };
            // Relaxed: like the hardware's read-modify-write, only
            // atomicity matters here; the round barriers order the rest.
            let raw = slot.load(Relaxed);
            if raw & VALID == 0 {
                contended += 1;
                continue;
            }
            match TF::hw_access(raw, height, Access::WRITE) {
                Ok(new) if new == raw => {
                    done[i] = true;
                    left -= 1;
                }
                // Relaxed: as above.
                Ok(new) => match slot.compare_exchange(raw, new, Relaxed, Relaxed) {
                    Ok(_) => {
                        if raw & DIRTY == 0 {
                            dirtied.push(i);
                        }
                        done[i] = true;
                        left -= 1;
                    }
                    Err(_) => contended += 1,
                },
                Err(_) => {
                    done[i] = true;
                    left -= 1;
                }
            }
        }
        // Release: a changer paused in `RaceMmu` sees every access of this
        // sweep done once it sees the count.
        AGENT_SWEEPS.fetch_add(1, Release);
    }
    (dirtied, contended)
}

/// Sweeps the agent has finished (see [`pause_in_window`]).
static AGENT_SWEEPS: AtomicUsize = AtomicUsize::new(0);

/// Whether this round's window is open (1) or closed (0): closed by the harness before each
/// round (the agent is parked then), opened by the changer's first pause
/// or, if the change never paused, after it. Until then the agent keeps
/// off leaf 0.
static WINDOW_OPEN: AtomicUsize = AtomicUsize::new(0);

/// Opens the round's window unless it is open already, and then holds the
/// changer inside it until the agent has swept every leaf at least once
/// after this call (two finished sweeps), or for 2 s at most. So each round
/// hits the window at least once whatever the scheduler does; the
/// free-running rest of the round hits it by chance.
fn pause_in_window() {
    // Release: the cleared (or loaded) entry is written before the agent
    // is let at it.
    if WINDOW_OPEN.swap(1, Release) == 1 {
        return;
    }
    // Acquire: pairs with the agent's Release increment.
    let s0 = AGENT_SWEEPS.load(Acquire);
    let t0 = Instant::now();
    while AGENT_SWEEPS.load(Acquire) < s0 + 2 && t0.elapsed() < Duration::from_secs(2) {
        std::thread::yield_now();
    }
}

/// The race tests' MMU: does nothing, except that once per round (armed by
/// the harness) it pauses right after an entry is cleared, the window of a
/// protection-change transaction, until the agent has been through it.
struct RaceMmu;

// SAFETY: a host test MMU: no hardware walker uses these tables, or it
// forwards to the simulator, which upholds the contract.
unsafe impl Mmu for RaceMmu {
    const OBSERVES_WRITES: bool = true;

    fn walker_barrier(&self) {}
    fn flush_tlb_range(&self, _range: TlbRange) {}
    fn flush_tlb_all(&self) {}
    unsafe fn install_root(&self, _root: PhysAddr) {}

    fn entry_written(&self, slot: &Slot, _old: u64) {
        // Relaxed: the entry was written by this thread.
        if slot.load(Relaxed) == 0 {
            pause_in_window();
        }
    }
}

/// Runs rounds of `change` against the agent on `RACE_PAGES` leaves at
/// `height` (pages or 2 MiB blocks) until `stop` says so; every round
/// resets the leaves to a mix of clean, accessed-only and settled (accessed
/// and dirty) entries.
/// The race tests run one at a time: each needs both of a small machine's
/// cores (the changer and the agent) to hit the window within its limit.
static RACE_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn race<A: Arch>(
    height: u32,
    mut change: impl FnMut(&mut AddressSpace<A, RaceMmu, Arena>, Prot),
    mut stop: impl FnMut(usize, &RaceOutcome) -> bool,
) -> (usize, RaceOutcome) {
    // A race test that failed still releases the machine for the others.
    let _one_at_a_time = RACE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let step = if height == 0 { KIB4 } else { MIB2 };
    let opts = if height == 0 {
        MapOptions::PAGES
    } else {
        MapOptions::PMD_BLOCKS
    };
    let mut s = AddressSpace::<A, _, _>::new(RaceMmu, Arena::new()).unwrap();
    s.map(BASE, PA, RACE_PAGES * step, Prot::READ_WRITE, opts)
        .unwrap();
    let slots: Vec<usize> = (0..RACE_PAGES)
        .map(|i| slot_addr(&s, BASE.add(i * step), height))
        .collect();
    // Round handshake by spinning, so both threads are running when the
    // change starts (a sleeping barrier wakes the agent too late).
    let go = AtomicUsize::new(0);
    let ready = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let agent_dirtied = std::sync::Mutex::new(Vec::new());
    let agent_contended = AtomicUsize::new(0);
    let mut total = RaceOutcome::default();
    let mut rounds = 0;
    std::thread::scope(|scope| {
        scope.spawn(|| {
            for r in 1.. {
                wait_until(&go, |g| g >= r);
                // Acquire (in `wait_until`): the reset entries are visible.
                if go.load(Acquire) == QUIT {
                    return;
                }
                // Release: pairs with the main thread's wait on `ready`.
                ready.store(r, Release);
                let (d, c) = agent_round(&slots, height);
                *agent_dirtied.lock().unwrap() = d;
                agent_contended.store(c, Relaxed);
                // Release: publishes the results and the agent's writes.
                done.store(r, Release);
            }
        });
        let mut prot = Prot::READ_WRITE;
        loop {
            // Reset while the agent waits: both protections are writable,
            // so the agent can set dirty bits whenever an entry is present.
            for (i, &a) in slots.iter().enumerate() {
                // SAFETY: as in `agent_round`; the agent is parked.
                let slot = unsafe { &*std::ptr::with_exposed_provenance::<AtomicU64>(a) };
                let ad = [0, ACCESSED, ACCESSED | DIRTY][i % 3];
                let pa = PhysAddr(PA.0 + i as u64 * step);
                // Relaxed: published to the agent by the start barrier.
                slot.store(A::leaf(pa, prot, height) | ad, Relaxed);
            }
            prot = if prot == Prot::READ_WRITE {
                Prot::WRITE | Prot::EXEC
            } else {
                Prot::READ_WRITE
            };
            rounds += 1;
            // Relaxed: the agent is parked; `go` publishes it.
            WINDOW_OPEN.store(0, Relaxed);
            // Release: publishes the reset entries to the agent.
            go.store(rounds, Release);
            wait_until(&ready, |r| r == rounds);
            change(&mut s, prot);
            // Release: a change that never paused lets the agent at leaf 0
            // now, after all its writes.
            WINDOW_OPEN.store(1, Release);
            wait_until(&done, |d| d == rounds);
            let dirtied = std::mem::take(&mut *agent_dirtied.lock().unwrap());
            let mut round = RaceOutcome {
                contended: agent_contended.load(Relaxed),
                dirtied: dirtied.len(),
                ..RaceOutcome::default()
            };
            // Read the entries through the slots (a walk per page would
            // make the rounds, and so the races per second, fewer).
            let entry = |i: usize| {
                // SAFETY: as in `agent_round`; the agent is parked.
                let slot = unsafe { &*std::ptr::with_exposed_provenance::<AtomicU64>(slots[i]) };
                // Relaxed: the agent's writes were published by `done`.
                slot.load(Relaxed)
            };
            for &i in &dirtied {
                if entry(i) & DIRTY == 0 {
                    round.lost += 1;
                }
            }
            // The protection changed, and the accessed/dirty state set
            // before the round survived too.
            for i in 0..slots.len() {
                let e = entry(i);
                assert_eq!(A::leaf_prot(e, height), prot, "page {i}");
                assert_eq!(e & ADDR_MASK, PA.0 + i as u64 * step, "page {i}");
                let had = [0, ACCESSED, ACCESSED | DIRTY][i % 3];
                if round.lost == 0 {
                    assert_eq!(e & had, had, "page {i}");
                }
            }
            total.lost += round.lost;
            total.contended += round.contended;
            total.dirtied += round.dirtied;
            if stop(rounds, &total) {
                // Release: as above; the agent reads it and returns.
                go.store(QUIT, Release);
                break;
            }
        }
    });
    (rounds, total)
}

/// The round number that tells the agent to return.
const QUIT: usize = usize::MAX;

/// Spins (yielding now and then) until `f` holds for `a`.
fn wait_until(a: &AtomicUsize, f: impl Fn(usize) -> bool) {
    let mut spins = 0u32;
    // Acquire: what the other thread wrote before its store is visible.
    while !f(a.load(Acquire)) {
        spins += 1;
        if spins % 1024 == 0 {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

/// Stops after `min` rounds once the race was observed `want` times (or
/// after a time budget, so a machine that never runs the two threads at
/// once ends the test).
fn until(
    min: usize,
    want: impl Fn(&RaceOutcome) -> bool,
) -> impl FnMut(usize, &RaceOutcome) -> bool {
    // The clock starts with the first round, not while waiting for
    // `RACE_LOCK`.
    let mut t0 = None;
    move |rounds, o| {
        let t0 = *t0.get_or_insert_with(Instant::now);
        (rounds >= min && want(o)) || t0.elapsed() > Duration::from_secs(20)
    }
}

/// Races the agent against `change_protection` on leaves at `height`.
fn change_protection_race<A: Arch>(height: u32, what: &str) {
    let len = RACE_PAGES * if height == 0 { KIB4 } else { MIB2 };
    let (rounds, o) = race::<A>(
        height,
        |s, prot| s.change_protection(BASE, len, prot).unwrap(),
        // A tenth of the rounds and contended accesses under Miri.
        until(miri_scaled(2000) as usize, |o| {
            o.contended as u64 >= miri_scaled(100)
        }),
    );
    eprintln!(
        "change_protection race ({what}): {rounds} rounds, {} dirty bits set by the agent, \
         {} contended accesses, {} lost",
        o.dirtied, o.contended, o.lost
    );
    assert!(o.dirtied > 0, "the agent never ran");
    assert!(o.contended > 0, "the agent never hit an entry mid-change");
    assert_eq!(o.lost, 0, "dirty bits lost");
}

#[test]
fn racing_hardware_dirty_updates_are_never_lost() {
    change_protection_race::<TestFormat>(0, "4 KiB pages");
}

#[test]
fn racing_hardware_dirty_updates_on_blocks_are_never_lost_with_the_deferred_start() {
    change_protection_race::<DeferredBlockProt<TestFormat>>(1, "2 MiB blocks, deferred");
}

#[test]
fn non_atomic_protection_change_loses_dirty_bits() {
    // The control: load, modify, plain store. The same check must catch it.
    let broken = |s: &mut AddressSpace<TestFormat, RaceMmu, Arena>, prot: Prot| {
        for i in 0..RACE_PAGES {
            // SAFETY: the store below puts back the same page with another
            // protection (a leaf); the space is never installed. That it
            // can lose a dirty bit is what this control shows.
            let slot = unsafe { s.inspect().slot(BASE.add(i * KIB4), 0) }.unwrap();
            // Relaxed: deliberately not a read-modify-write.
            let raw = slot.load(Relaxed);
            // The same once-per-round pause as the transaction gets, here
            // between the load and the store.
            pause_in_window();
            // Widen the load-to-store window (as an interrupt or a cache
            // miss would) so the race is hit within the time limit even on
            // a loaded machine.
            for _ in 0..64 {
                std::hint::spin_loop();
            }
            slot.store(TF::modify_prot(raw, prot, 0), Relaxed);
        }
    };
    let (rounds, o) = race::<TestFormat>(0, broken, until(1, |o| o.lost > 0));
    eprintln!(
        "non-atomic race: {rounds} rounds, {} dirty bits set by the agent, {} lost",
        o.dirtied, o.lost
    );
    assert!(o.lost > 0, "the check never saw a lost dirty bit");
}

// ----- on the simulated machine: no stale TLB entry, no lost A/D state -----

#[cfg(feature = "sim")]
mod sim {
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    use pgtable_core::sim::{Installed, SimAlloc, SimFaultKind, SimMachine, SimMmu};

    use super::*;

    type SimSpace<A> = Installed<A, SimMmu<A>, SimAlloc>;

    fn sim_space<A: Arch>() -> (SimMachine<A>, SimSpace<A>) {
        let m = SimMachine::<A>::new();
        let s = AddressSpace::new(m.mmu(), m.alloc()).unwrap();
        // SAFETY: a simulated MMU.
        (m, unsafe { Installed::new(s) })
    }

    fn write_faults<A: Arch>(m: &SimMachine<A>, va: VirtAddr) -> bool {
        matches!(
            m.write_u64(va, 1),
            Err(e) if e.kind == SimFaultKind::Permission(AccessFault::Write)
        )
    }

    /// Pages and blocks, written through (so the TLB caches writable,
    /// dirty translations), made read-only, then one page of a block made
    /// writable again: the TLB agrees with memory after every step.
    fn no_stale_translations<A: Arch>() {
        let (m, mut s) = sim_space::<A>();
        s.map(BASE, PA, 4 * KIB4, Prot::READ_WRITE, MapOptions::PAGES)
            .unwrap();
        let blk = BASE.add(2 * MIB2);
        s.map(
            blk,
            PhysAddr(PA.0 + MIB2),
            2 * MIB2,
            Prot::READ_WRITE,
            MapOptions::PMD_BLOCKS,
        )
        .unwrap();
        let vas = [BASE, BASE.add(3 * KIB4), blk, blk.add(MIB2 + 5 * KIB4)];
        for va in vas {
            m.write_u64(va, va.0).unwrap();
        }
        m.check().unwrap();
        s.change_protection(BASE, 4 * MIB2, Prot::READ_ONLY)
            .unwrap();
        m.check().unwrap();
        for va in vas {
            assert!(write_faults(&m, va), "{va:?} still writable");
            assert_eq!(m.read_u64(va).unwrap(), va.0);
        }
        let page = blk.add(MIB2 + 5 * KIB4);
        s.change_protection(page, KIB4, Prot::READ_WRITE).unwrap();
        m.check().unwrap();
        m.write_u64(page, 7).unwrap();
        assert!(write_faults(&m, page.add(KIB4)));
        assert_eq!(m.read_u64(blk.add(MIB2)).unwrap(), 0);
        m.check().unwrap();
    }

    #[test]
    fn sim_protection_changes_leave_no_stale_tlb_entries_generic_blocks() {
        no_stale_translations::<GenericBlockProt<TestFormat>>();
    }

    #[test]
    fn sim_protection_changes_leave_no_stale_tlb_entries_deferred_blocks() {
        no_stale_translations::<DeferredBlockProt<TestFormat>>();
    }

    /// The simulator's own hardware agent touches the pages (alternating
    /// loads and stores) while the protection toggles between two writable
    /// protections. The change never clears a dirty state, so each page
    /// gets its dirty state set at most once; a lost one would be set
    /// again (or be missing at the end): the count the agent reports must
    /// equal the dirty pages in memory.
    #[test]
    fn sim_agent_dirty_bits_survive_protection_changes() {
        let pages = 64;
        let (m, mut s) = sim_space::<DeferredBlockProt<TestFormat>>();
        s.map(BASE, PA, pages * KIB4, Prot::READ_WRITE, MapOptions::PAGES)
            .unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let agent = m.spawn_agent(BASE, pages * KIB4, stop.clone());
        let rwx = Prot::WRITE | Prot::EXEC;
        // At least 400 changes, and on until the hardware thread has
        // dirtied something (it may be starved on a loaded machine),
        // bounded in time.
        let t0 = std::time::Instant::now();
        let mut i = 0;
        while i < 400 || (m.stats().dirty_set == 0 && t0.elapsed().as_secs() < 30) {
            let prot = if i % 2 == 0 { rwx } else { Prot::READ_WRITE };
            s.change_protection(BASE, pages * KIB4, prot).unwrap();
            if i >= 400 {
                std::thread::yield_now();
            }
            i += 1;
        }
        // Relaxed: the join below orders everything the agent did.
        stop.store(true, Relaxed);
        let report = agent.join().unwrap();
        m.check().unwrap();
        let dirty = (0..pages)
            .filter(|&i| s.translate(BASE.add(i * KIB4)).unwrap().entry & DIRTY != 0)
            .count() as u64;
        eprintln!("sim agent: {report:?}, dirty pages {dirty}");
        assert!(report.dirty_set > 0, "the agent never stored");
        assert_eq!(
            report.dirty_set, dirty,
            "a dirty state was lost and set again"
        );
    }
}
