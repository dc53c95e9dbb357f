//! Tests of `move_page_tables` (mremap for page tables, with `HAVE_MOVE_PMD` / `HAVE_MOVE_PUD`).
//!
//! Run with `--features alloc,stats` (the counters are part of what is
//! checked), and with `--no-default-features --features alloc,stats` for
//! the control variant: the expected counts follow the `move-pmd` /
//! `move-pud` features the build has.
#![cfg(feature = "alloc")]

use std::cell::Cell;

use pgtable_core::contract::{Arena, Mmu, NoopMmu, Slot, Stats, TableAlloc, TlbRange, PAGE_SIZE};
use pgtable_core::test_format::{TestFormat, ACCESSED, DIRTY, WRITE};
use pgtable_core::{
    variants, AddressSpace, Error, MapOptions, Mapping, MoveOptions, PhysAddr, Prot, VirtAddr,
};

const KIB4: u64 = PAGE_SIZE;
const MIB2: u64 = 2 << 20;
const GIB: u64 = 1 << 30;
const PA: PhysAddr = PhysAddr(0x40_0000_0000);

/// Whether the build allows the whole-PUD / whole-PMD fast paths
/// (`TestFormat` sets both arch constants).
const PUD_ON: bool = cfg!(feature = "move-pud");
const PMD_ON: bool = cfg!(feature = "move-pmd");

/// A counting MMU: barriers and flushes, counted independently of `stats`.
#[derive(Default)]
struct CountMmu {
    barriers: Cell<u64>,
    range_flushes: Cell<u64>,
    full_flushes: Cell<u64>,
    writes: Cell<u64>,
}

impl CountMmu {
    fn flushes(&self) -> u64 {
        self.range_flushes.get() + self.full_flushes.get()
    }

    fn reset(&self) {
        self.barriers.set(0);
        self.range_flushes.set(0);
        self.full_flushes.set(0);
        self.writes.set(0);
    }
}

// SAFETY: a host test MMU: no hardware walker uses these tables, or it
// forwards to the simulator, which upholds the contract.
unsafe impl Mmu for CountMmu {
    fn walker_barrier(&self) {
        self.barriers.set(self.barriers.get() + 1);
    }
    fn flush_tlb_range(&self, _range: TlbRange) {
        self.range_flushes.set(self.range_flushes.get() + 1);
    }
    fn flush_tlb_all(&self) {
        self.full_flushes.set(self.full_flushes.get() + 1);
    }
    unsafe fn install_root(&self, _root: PhysAddr) {}
}

/// An MMU that observes every entry write (as the simulator does), which
/// takes the swap-based code paths of the setters.
#[derive(Default)]
struct ObservingMmu {
    writes: Cell<u64>,
    flushes: Cell<u64>,
}

// SAFETY: a host test MMU: no hardware walker uses these tables, or it
// forwards to the simulator, which upholds the contract.
unsafe impl Mmu for ObservingMmu {
    const OBSERVES_WRITES: bool = true;
    fn walker_barrier(&self) {}
    fn flush_tlb_range(&self, _range: TlbRange) {
        self.flushes.set(self.flushes.get() + 1);
    }
    fn flush_tlb_all(&self) {
        self.flushes.set(self.flushes.get() + 1);
    }
    unsafe fn install_root(&self, _root: PhysAddr) {}
    fn entry_written(&self, _slot: &Slot, _old: u64) {
        self.writes.set(self.writes.get() + 1);
    }
}

type Space<M = CountMmu> = AddressSpace<TestFormat, M, Arena>;

fn space() -> Space {
    Space::new(CountMmu::default(), Arena::new()).unwrap()
}

/// Every leaf of the lower half of the address space, in order.
fn listing<A: pgtable_core::contract::Arch, M: Mmu, T: TableAlloc>(
    s: &AddressSpace<A, M, T>,
) -> Vec<Mapping> {
    let mut v = Vec::new();
    let half = 1u64 << (A::VA_BITS - 1);
    s.walk(VirtAddr(0), half, |m| v.push(m)).unwrap();
    v
}

/// Sets `bits` (accessed/dirty) in the leaf at `height` that maps `va`, as
/// the hardware does on an access through it.
fn hw_set(s: &Space<impl Mmu>, va: u64, height: u32, bits: u64) {
    // SAFETY: only the accessed/dirty state of an existing leaf changes, as
    // the hardware changes it; these spaces are never installed.
    let slot = unsafe { s.inspect().slot(VirtAddr(va), height) }.unwrap();
    slot.fetch_or(bits, std::sync::atomic::Ordering::Relaxed);
}

fn leaves_in(s: &Space<impl Mmu>, va: u64, len: u64) -> Vec<Mapping> {
    let mut v = Vec::new();
    s.walk(VirtAddr(va), len, |m| v.push(m)).unwrap();
    v
}

/// Gives some entries of `[va, va + len)` accessed and dirty states the
/// way hardware would, so a move must carry them: every 3rd page accessed,
/// every 5th dirty, every 7th both.
fn age_some_pages(s: &Space<impl Mmu>, va: u64, len: u64) {
    for i in (0..len / KIB4).step_by(3) {
        let bits = match i % 7 {
            0 => ACCESSED | DIRTY,
            _ if i % 5 == 0 => DIRTY,
            _ => ACCESSED,
        };
        hw_set(s, va + i * KIB4, 0, bits);
    }
}

/// Asserts that `after` is `before` moved by `new - old`: same output
/// address, size and raw entry (attributes, accessed/dirty) for every leaf.
fn assert_moved(before: &[Mapping], after: &[Mapping], old: u64, new: u64) {
    assert_eq!(before.len(), after.len(), "number of leaves");
    for (b, a) in before.iter().zip(after) {
        assert_eq!(a.va.0, b.va.0 - old + new, "leaf {b:?} landed at {a:?}");
        assert_eq!(
            (a.pa, a.size, a.entry),
            (b.pa, b.size, b.entry),
            "leaf {b:?}"
        );
    }
}

/// Everything that must be unchanged after a failed move.
#[derive(PartialEq, Debug)]
struct Snapshot {
    leaves: Vec<Mapping>,
    tables: usize,
    live: usize,
}

/// With `stats` on: the entries the last operations wrote and the tables
/// they allocated and freed (since the counters were last reset).
fn assert_counted<M: Mmu>(s: &Space<M>, written: u64, allocated: u64, freed: u64) {
    if Stats::ENABLED {
        assert_eq!(s.stats().entries_written(), written, "entries written");
        assert_eq!(s.stats().tables_allocated(), allocated, "tables allocated");
        assert_eq!(s.stats().tables_freed(), freed, "tables freed");
    }
}

fn snapshot<M: Mmu>(s: &Space<M>) -> Snapshot {
    Snapshot {
        leaves: listing(s),
        tables: s.inspect().count_tables(),
        live: s.alloc().live(),
    }
}

/// Maps `len` bytes of 4 KiB pages at `va` (to `PA`), with aged entries.
fn mapped_pages(va: u64, len: u64) -> Space {
    let mut s = space();
    s.map(VirtAddr(va), PA, len, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    age_some_pages(&s, va, len);
    s.stats().reset();
    s.mmu().reset();
    s
}

/// The expected number of destination entries written for an aligned
/// 1 GiB move of 4 KiB pages with the given fast paths.
fn expected_writes(pud: bool, pmd: bool) -> u64 {
    if pud {
        1
    } else if pmd {
        512
    } else {
        262_144
    }
}

/// Moves 1 GiB of pages between two PUD-aligned ranges with `opts` and
/// checks data equivalence, counters, tables and flushes.
fn move_1g_aligned(opts: MoveOptions) {
    let (old, new) = (GIB, 3 * GIB);
    let mut s = mapped_pages(old, GIB);
    let before = leaves_in(&s, old, GIB);
    let tables_before = s.inspect().count_tables();
    assert_eq!(tables_before, 1 + 1 + 1 + 512);

    s.move_page_tables(VirtAddr(old), VirtAddr(new), GIB, opts)
        .unwrap();

    assert_moved(&before, &leaves_in(&s, new, GIB), old, new);
    assert!(leaves_in(&s, old, GIB).is_empty(), "old range still maps");
    for off in [0, 0x1234, GIB / 2 + 0x5678, GIB - 1] {
        let t = s.translate(VirtAddr(new + off)).unwrap();
        assert_eq!(t.pa, PhysAddr(PA.0 + off));
        assert!(s.translate(VirtAddr(old + off)).is_none());
    }
    assert_eq!(s.mmu().flushes(), 1, "one TLB flush per move");
    assert_eq!(
        s.alloc().live(),
        s.inspect().count_tables(),
        "leaked tables"
    );

    let pud = PUD_ON && opts.allows_pud();
    let pmd = PMD_ON && opts.allows_pmd();
    let writes = expected_writes(pud, pmd);
    // Tables: the PUD path moves the PMD table within the same PUD table;
    // the PMD path needs a new destination PMD table and frees the source
    // one; the PTE path also moves all 512 PTE tables' contents.
    let (allocated, freed) = if pud {
        (0, 0)
    } else if pmd {
        (1, 1)
    } else {
        (513, 513)
    };
    assert_eq!(
        s.inspect().count_tables(),
        tables_before + allocated - freed
    );
    // One barrier per destination table written (1 for the one PUD or PMD
    // table, 512 for the PTE tables, whose last one also covers the links).
    let barriers = if pud || pmd { 1 } else { 512 };
    assert_eq!(s.mmu().barriers.get(), barriers);
    assert_counted(&s, writes, allocated as u64, freed as u64);
    if Stats::ENABLED {
        assert_eq!(s.stats().flushes(), 1);
        assert_eq!(s.stats().barriers(), barriers);
    }
}

#[test]
fn pud_aligned_1g_move_writes_one_entry_when_allowed() {
    move_1g_aligned(MoveOptions::DEFAULT);
}

#[test]
fn pmd_only_1g_move_writes_one_entry_per_2m() {
    move_1g_aligned(variants::PMD_ONLY);
}

#[test]
fn control_options_move_1g_pte_by_pte() {
    move_1g_aligned(variants::PTES_ONLY);
}

#[test]
fn misaligned_1g_move_takes_pte_path() {
    // The destination is 4 KiB past a PMD boundary: no whole-table moves.
    let (old, new) = (GIB, 3 * GIB + KIB4);
    let mut s = mapped_pages(old, GIB);
    let before = leaves_in(&s, old, GIB);
    let tables_before = s.inspect().count_tables();

    s.move_page_tables(VirtAddr(old), VirtAddr(new), GIB, MoveOptions::DEFAULT)
        .unwrap();

    assert_moved(&before, &leaves_in(&s, new, GIB), old, new);
    assert!(leaves_in(&s, old, GIB).is_empty());
    assert_eq!(s.mmu().flushes(), 1);
    assert_eq!(s.alloc().live(), s.inspect().count_tables());
    // Destination: 513 PTE tables and 2 PMD tables (it crosses 4 GiB);
    // source: 512 PTE tables and its PMD table freed.
    let (allocated, freed) = (513 + 2, 512 + 1);
    assert_eq!(
        s.inspect().count_tables(),
        tables_before + allocated - freed
    );
    assert_counted(&s, 262_144, allocated as u64, freed as u64);
}

#[test]
fn move_across_a_pud_boundary_mixes_pmd_and_pud_moves() {
    // 2 MiB before a 1 GiB boundary to 2 MiB after the next one.
    let (old, new, len) = (GIB - MIB2, 5 * GIB - MIB2, GIB + 2 * MIB2);
    let mut s = mapped_pages(old, len);
    let before = leaves_in(&s, old, len);
    s.move_page_tables(VirtAddr(old), VirtAddr(new), len, MoveOptions::DEFAULT)
        .unwrap();
    assert_moved(&before, &leaves_in(&s, new, len), old, new);
    assert!(leaves_in(&s, old, len).is_empty());
    assert_eq!(s.mmu().flushes(), 1);
    assert_eq!(s.alloc().live(), s.inspect().count_tables());
    if Stats::ENABLED {
        let expected = match (PUD_ON, PMD_ON) {
            (true, true) => 1 + 2,
            (true, false) => 1 + 2 * 512,
            (false, true) => 512 + 2,
            (false, false) => len / KIB4,
        };
        assert_eq!(s.stats().entries_written(), expected);
    }
}

#[test]
fn blocks_move_as_one_entry_each() {
    for (opts, len, height, count) in [
        (MapOptions::BLOCKS, GIB, 2, 1u64),
        (MapOptions::PMD_BLOCKS, 8 * MIB2, 1, 8),
    ] {
        let (old, new) = (2 * GIB, 6 * GIB);
        let mut s = space();
        s.map(VirtAddr(old), PA, len, Prot::READ_EXEC, opts)
            .unwrap();
        hw_set(&s, old, height, ACCESSED | DIRTY);
        let before = leaves_in(&s, old, len);
        assert!(before.iter().all(|m| m.height == height));
        s.stats().reset();
        // Blocks move whole even on the control path.
        s.move_page_tables(VirtAddr(old), VirtAddr(new), len, variants::PTES_ONLY)
            .unwrap();
        assert_moved(&before, &leaves_in(&s, new, len), old, new);
        assert!(leaves_in(&s, old, len).is_empty());
        assert_eq!(s.alloc().live(), s.inspect().count_tables());
        if Stats::ENABLED {
            assert_eq!(s.stats().entries_written(), count);
        }
    }
}

#[test]
fn partly_covered_block_is_split_and_the_rest_stays() {
    let (base, new) = (2 * GIB, 6 * GIB);
    let mut s = space();
    s.map(
        VirtAddr(base),
        PA,
        2 * MIB2,
        Prot::READ_WRITE,
        MapOptions::PMD_BLOCKS,
    )
    .unwrap();
    hw_set(&s, base, 1, ACCESSED);
    // Move the middle 2 MiB: the second half of block 0 and the first half
    // of block 1.
    let (old, len) = (base + MIB2 / 2, MIB2);
    s.move_page_tables(VirtAddr(old), VirtAddr(new), len, MoveOptions::DEFAULT)
        .unwrap();
    for off in (0..len).step_by(KIB4 as usize * 61) {
        let t = s.translate(VirtAddr(new + off)).unwrap();
        assert_eq!(t.pa.0, PA.0 + (old - base) + off);
        assert!(s.translate(VirtAddr(old + off)).is_none());
    }
    // The first page of block 0 kept its accessed state through the split.
    let kept = s.translate(VirtAddr(base)).unwrap();
    assert_eq!((kept.pa, kept.height), (PA, 0));
    assert_ne!(kept.entry & ACCESSED, 0);
    let last = s.translate(VirtAddr(base + 2 * MIB2 - KIB4)).unwrap();
    assert_eq!(last.pa.0, PA.0 + 2 * MIB2 - KIB4);
    let moved_total: u64 = leaves_in(&s, new, len).iter().map(|m| m.size).sum();
    assert_eq!(moved_total, len);
    assert_eq!(s.alloc().live(), s.inspect().count_tables());
}

#[test]
fn blocks_to_a_misaligned_destination_are_split_into_pages() {
    let (old, new, len) = (2 * GIB, 6 * GIB + KIB4, 4 * MIB2);
    let mut s = space();
    s.map(
        VirtAddr(old),
        PA,
        len,
        Prot::READ_WRITE,
        MapOptions::PMD_BLOCKS,
    )
    .unwrap();
    s.move_page_tables(VirtAddr(old), VirtAddr(new), len, MoveOptions::DEFAULT)
        .unwrap();
    let after = leaves_in(&s, new, len);
    assert_eq!(after.len() as u64, len / KIB4);
    for (i, m) in after.iter().enumerate() {
        assert_eq!(m.va.0, new + i as u64 * KIB4);
        assert_eq!(m.pa.0, PA.0 + i as u64 * KIB4);
    }
    assert!(leaves_in(&s, old, len).is_empty());
    assert_eq!(s.alloc().live(), s.inspect().count_tables());
}

#[test]
fn source_holes_are_skipped() {
    let (old, new, len) = (GIB, 9 * GIB + 5 * KIB4, 6 * MIB2);
    let mut s = space();
    // Three islands with holes between them, one spanning a PMD boundary.
    for (off, l) in [(0, 3 * KIB4), (MIB2 - KIB4, 2 * KIB4), (4 * MIB2, MIB2)] {
        s.map(
            VirtAddr(old + off),
            PhysAddr(PA.0 + off),
            l,
            Prot::READ_WRITE,
            MapOptions::PAGES,
        )
        .unwrap();
    }
    let before = leaves_in(&s, old, len);
    s.move_page_tables(VirtAddr(old), VirtAddr(new), len, MoveOptions::DEFAULT)
        .unwrap();
    assert_moved(&before, &leaves_in(&s, new, len), old, new);
    assert!(
        s.translate(VirtAddr(new + 3 * KIB4)).is_none(),
        "a hole was filled"
    );
    assert!(leaves_in(&s, old, len).is_empty());
    assert_eq!(s.alloc().live(), s.inspect().count_tables());
    // Only PTE tables that receive entries are allocated (destination PMD
    // entries 0, 1, 4 and 5); the emptied source PMD table is freed.
    assert_eq!(s.inspect().count_tables(), 1 + 1 + 1 + 4);
}

#[test]
fn moving_an_empty_range_changes_nothing() {
    let mut s = space();
    s.map(VirtAddr(GIB), PA, KIB4, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    let before = snapshot(&s);
    s.move_page_tables(
        VirtAddr(2 * GIB),
        VirtAddr(4 * GIB),
        GIB,
        MoveOptions::DEFAULT,
    )
    .unwrap();
    assert_eq!(snapshot(&s), before);
}

#[test]
fn settled_and_unsettled_entries_keep_accessed_and_dirty_state() {
    let (old, new, len) = (GIB + 3 * KIB4, 2 * GIB, 64 * KIB4);
    let mut s = space();
    s.map(
        VirtAddr(old),
        PA,
        len / 2,
        Prot::READ_WRITE,
        MapOptions::PAGES,
    )
    .unwrap();
    s.map(
        VirtAddr(old + len / 2),
        PhysAddr(PA.0 + len / 2),
        len / 2,
        Prot::READ_ONLY,
        MapOptions::PAGES,
    )
    .unwrap();
    // Every combination on writable and read-only pages: settled ones
    // (accessed and dirty, or accessed and read-only) take the plain path.
    for i in 0..len / KIB4 {
        let bits = [0, ACCESSED, DIRTY, ACCESSED | DIRTY][i as usize % 4];
        hw_set(&s, old + i * KIB4, 0, bits);
    }
    let before = leaves_in(&s, old, len);
    let settled = before
        .iter()
        .filter(|m| m.entry & ACCESSED != 0 && (m.entry & DIRTY != 0 || m.entry & WRITE == 0))
        .count();
    assert!(settled > 0 && settled < before.len());
    s.move_page_tables(VirtAddr(old), VirtAddr(new), len, MoveOptions::DEFAULT)
        .unwrap();
    assert_moved(&before, &leaves_in(&s, new, len), old, new);
    assert!(leaves_in(&s, old, len).is_empty());
}

#[test]
fn observing_mmu_sees_every_entry_write_of_a_move() {
    let (old, new, len) = (GIB + KIB4, 3 * GIB, 4 * MIB2);
    let mut s =
        AddressSpace::<TestFormat, _, _>::new(ObservingMmu::default(), Arena::new()).unwrap();
    s.map(VirtAddr(old), PA, len, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    let pages = len / KIB4;
    // Settle half the pages so both source-clear paths run.
    for i in (0..pages).step_by(2) {
        hw_set(&s, old + i * KIB4, 0, ACCESSED | DIRTY);
    }
    let before = leaves_in(&s, old, len);
    s.mmu().writes.set(0);
    s.move_page_tables(VirtAddr(old), VirtAddr(new), len, MoveOptions::DEFAULT)
        .unwrap();
    assert_moved(&before, &leaves_in(&s, new, len), old, new);
    assert_eq!(s.mmu().flushes.get(), 1);
    // A store per page at the destination, and a clear per page at the
    // source except in the 3 whole source PTE tables (PMD 1-3): those are
    // unlinked (one write each) and copied after the flush; only their
    // entries 0 to 3 are cleared, to hold the record of a deferred table
    // (the list link, its address and its two destination tables).
    // Plus the table links (4 destination PTE tables and a PMD table) and
    // the unlinks of the 2 emptied partial source PTE tables and of their
    // PMD table.
    let whole = 3;
    let clears = pages - whole * 508;
    let tables_linked = 4 + 1;
    let tables_unlinked = whole + 2 + 1;
    assert_eq!(
        s.mmu().writes.get(),
        pages + clears + tables_linked + tables_unlinked
    );
}

#[test]
fn move_there_and_back_restores_the_tables() {
    let (a, b, len) = (GIB + 7 * KIB4, 5 * GIB + 300 * KIB4, 3 * MIB2);
    let mut s = mapped_pages(a, len);
    let start = snapshot(&s);
    s.move_page_tables(VirtAddr(a), VirtAddr(b), len, MoveOptions::DEFAULT)
        .unwrap();
    s.move_page_tables(VirtAddr(b), VirtAddr(a), len, MoveOptions::DEFAULT)
        .unwrap();
    assert_eq!(snapshot(&s), start);
}

#[test]
fn lazy_mmu_scope_defers_the_move_barriers_to_its_end() {
    let (old, new, len) = (GIB, 3 * GIB + KIB4, 8 * MIB2);
    let mut s = mapped_pages(old, len);
    s.lazy_mmu(|s| {
        s.move_page_tables(VirtAddr(old), VirtAddr(new), len, MoveOptions::DEFAULT)
            .unwrap();
        assert_eq!(s.mmu().barriers.get(), 0);
    });
    assert_eq!(s.mmu().barriers.get(), 1);
    assert!(s.translate(VirtAddr(new)).is_some());
}

#[test]
fn three_and_five_level_formats_move_whole_puds() {
    fn run<const L: u32>() {
        let (old, new) = (GIB, 5 * GIB);
        let mut s = AddressSpace::<TestFormat<L>, _, _>::new(NoopMmu, Arena::new()).unwrap();
        s.map(
            VirtAddr(old),
            PA,
            GIB + MIB2,
            Prot::READ_WRITE,
            MapOptions::PAGES,
        )
        .unwrap();
        let mut before = Vec::new();
        s.walk(VirtAddr(old), GIB + MIB2, |m| before.push(m))
            .unwrap();
        s.stats().reset();
        s.move_page_tables(
            VirtAddr(old),
            VirtAddr(new),
            GIB + MIB2,
            MoveOptions::DEFAULT,
        )
        .unwrap();
        let mut after = Vec::new();
        s.walk(VirtAddr(new), GIB + MIB2, |m| after.push(m))
            .unwrap();
        assert_moved(&before, &after, old, new);
        assert_eq!(s.alloc().live(), s.inspect().count_tables());
        if Stats::ENABLED {
            let expected = match (PUD_ON, PMD_ON) {
                (true, true) => 2,
                (true, false) => 1 + 512,
                (false, true) => 513,
                (false, false) => (GIB + MIB2) / KIB4,
            };
            assert_eq!(s.stats().entries_written(), expected);
        }
    }
    run::<3>();
    run::<5>();
}

// ----- mutual alignment -----

/// Source and destination 64 KiB into a PMD; the range reaches the next
/// PMD boundary and one PMD further.
const OFF: u64 = 16 * KIB4;
const MA_OLD: u64 = GIB + 4 * MIB2 + OFF;
const MA_NEW: u64 = 3 * GIB + 10 * MIB2 + OFF;
const MA_LEN: u64 = 2 * MIB2 - OFF;

#[test]
fn mutually_aligned_move_aligns_down_and_moves_whole_pmds() {
    let mut s = mapped_pages(MA_OLD, MA_LEN);
    let before = leaves_in(&s, MA_OLD, MA_LEN);
    s.move_page_tables(
        VirtAddr(MA_OLD),
        VirtAddr(MA_NEW),
        MA_LEN,
        MoveOptions::DEFAULT,
    )
    .unwrap();
    assert_moved(&before, &leaves_in(&s, MA_NEW, MA_LEN), MA_OLD, MA_NEW);
    assert!(leaves_in(&s, MA_OLD, MA_LEN).is_empty());
    assert!(s.translate(VirtAddr(MA_NEW - KIB4)).is_none());
    assert_eq!(s.alloc().live(), s.inspect().count_tables());
    if Stats::ENABLED {
        // Aligned down: the partial first PMD moves as one entry, then one
        // whole PMD; without the PMD path every page moves.
        let expected = if PMD_ON { 2 } else { MA_LEN / KIB4 };
        assert_eq!(s.stats().entries_written(), expected);
    }
}

#[test]
fn mutual_alignment_is_not_taken_when_pages_sit_below_the_start() {
    for below_old in [true, false] {
        let mut s = mapped_pages(MA_OLD, MA_LEN);
        // One page between the aligned-down start and the start.
        let (busy, busy_pa) = if below_old {
            (MA_OLD - OFF, PhysAddr(0x7000_0000))
        } else {
            (MA_NEW - OFF, PhysAddr(0x7100_0000))
        };
        s.map(
            VirtAddr(busy),
            busy_pa,
            KIB4,
            Prot::READ_ONLY,
            MapOptions::PAGES,
        )
        .unwrap();
        s.stats().reset();
        let before = leaves_in(&s, MA_OLD, MA_LEN);
        s.move_page_tables(
            VirtAddr(MA_OLD),
            VirtAddr(MA_NEW),
            MA_LEN,
            MoveOptions::DEFAULT,
        )
        .unwrap();
        assert_moved(&before, &leaves_in(&s, MA_NEW, MA_LEN), MA_OLD, MA_NEW);
        // The page below stays exactly where it was.
        assert_eq!(s.translate(VirtAddr(busy)).unwrap().pa, busy_pa);
        assert_eq!(s.alloc().live(), s.inspect().count_tables());
        if Stats::ENABLED {
            // The first partial PMD goes page by page.
            let first = (MIB2 - OFF) / KIB4;
            let expected = if PMD_ON { first + 1 } else { MA_LEN / KIB4 };
            assert_eq!(s.stats().entries_written(), expected);
        }
    }
}

#[test]
fn free_below_claim_is_checked_against_the_tables() {
    let opts = MoveOptions::DEFAULT.free_below();
    // A true claim moves like the automatic rule.
    let mut s = mapped_pages(MA_OLD, MA_LEN);
    let before = leaves_in(&s, MA_OLD, MA_LEN);
    s.move_page_tables(VirtAddr(MA_OLD), VirtAddr(MA_NEW), MA_LEN, opts)
        .unwrap();
    assert_moved(&before, &leaves_in(&s, MA_NEW, MA_LEN), MA_OLD, MA_NEW);

    // A false claim is an error that changes nothing.
    let mut s = mapped_pages(MA_OLD, MA_LEN);
    let busy = MA_NEW - 2 * KIB4;
    s.map(
        VirtAddr(busy),
        PhysAddr(0x7000_0000),
        KIB4,
        Prot::READ_ONLY,
        MapOptions::PAGES,
    )
    .unwrap();
    let snap = snapshot(&s);
    let allocs = s.alloc().allocs();
    let r = s.move_page_tables(VirtAddr(MA_OLD), VirtAddr(MA_NEW), MA_LEN, opts);
    let expected = if PMD_ON {
        Err(Error::AlreadyMapped(VirtAddr(busy)))
    } else {
        // Without the PMD path the rule never applies.
        Ok(())
    };
    assert_eq!(r, expected);
    if r.is_err() {
        assert_eq!(snapshot(&s), snap);
        assert_eq!(s.alloc().allocs(), allocs);
    }
}

// ----- errors -----

/// Runs a move that must fail with `err`, and checks that nothing changed.
fn assert_rejected(s: &mut Space, old: u64, new: u64, len: u64, err: Error) {
    let snap = snapshot(s);
    let allocs = s.alloc().allocs();
    s.mmu().reset();
    assert_eq!(
        s.move_page_tables(VirtAddr(old), VirtAddr(new), len, MoveOptions::DEFAULT),
        Err(err)
    );
    assert_eq!(snapshot(s), snap, "tables changed by a rejected move");
    assert_eq!(s.alloc().allocs(), allocs, "a rejected move allocated");
    assert_eq!(s.mmu().flushes(), 0);
    assert_eq!(s.mmu().barriers.get(), 0);
}

#[test]
fn overlapping_ranges_are_rejected() {
    let (old, len) = (GIB, 4 * MIB2);
    let mut s = mapped_pages(old, len);
    for new in [
        old,
        old + KIB4,
        old + len - KIB4,
        old - len + KIB4,
        old - KIB4,
    ] {
        assert_rejected(&mut s, old, new, len, Error::Overlap);
    }
}

#[test]
fn misaligned_and_empty_input_is_rejected() {
    let (old, new, len) = (GIB, 3 * GIB, 4 * MIB2);
    let mut s = mapped_pages(old, len);
    assert_rejected(
        &mut s,
        old + 1,
        new,
        len,
        Error::MisalignedVirt(VirtAddr(old + 1)),
    );
    assert_rejected(
        &mut s,
        old,
        new + 8,
        len,
        Error::MisalignedVirt(VirtAddr(new + 8)),
    );
    assert_rejected(&mut s, old, new, len - 1, Error::MisalignedLength(len - 1));
    assert_rejected(&mut s, old, new, 0, Error::ZeroLength);
}

#[test]
fn ranges_outside_the_address_space_are_rejected() {
    let (old, len) = (GIB, 4 * MIB2);
    let mut s = mapped_pages(old, len);
    let top = 1u64 << 47;
    // Destination running past the lower half into the hole.
    assert_rejected(
        &mut s,
        old,
        top - MIB2,
        len,
        Error::OutOfRange(VirtAddr(top)),
    );
    // Non-canonical start on either side.
    assert_rejected(
        &mut s,
        top,
        old + len,
        len,
        Error::OutOfRange(VirtAddr(top)),
    );
    assert_rejected(
        &mut s,
        old,
        top + GIB,
        len,
        Error::OutOfRange(VirtAddr(top + GIB)),
    );
}

#[test]
fn occupied_destination_is_rejected_with_the_first_mapped_address() {
    let (old, new, len) = (GIB, 3 * GIB, 4 * MIB2);
    let mut s = mapped_pages(old, len);
    // A page and, further on, a 2 MiB block inside the destination.
    let page = new + MIB2 + 5 * KIB4;
    s.map(
        VirtAddr(page),
        PhysAddr(0x7000_0000),
        KIB4,
        Prot::READ_ONLY,
        MapOptions::PAGES,
    )
    .unwrap();
    s.map(
        VirtAddr(new + 2 * MIB2),
        PhysAddr(0x8000_0000),
        MIB2,
        Prot::READ_ONLY,
        MapOptions::PMD_BLOCKS,
    )
    .unwrap();
    assert_rejected(&mut s, old, new, len, Error::AlreadyMapped(VirtAddr(page)));
    // Starting inside the block reports the start.
    let inside = new + 2 * MIB2 + 8 * KIB4;
    assert_rejected(
        &mut s,
        old,
        inside,
        MIB2,
        Error::AlreadyMapped(VirtAddr(inside)),
    );
}

#[test]
fn allocation_failure_at_every_point_leaves_everything_as_before() {
    // A PTE-path move that needs many tables: 32 MiB to a misaligned
    // destination in an empty part of the space (a new PUD table, a PMD
    // table and 17 PTE tables).
    let (old, new, len) = (GIB, 600 * GIB + KIB4, 16 * MIB2);
    let mut s = mapped_pages(old, len);
    let snap = snapshot(&s);
    let mut k = 0;
    loop {
        s.alloc().fail_after(Some(k));
        let allocs = s.alloc().allocs();
        s.mmu().reset();
        match s.move_page_tables(VirtAddr(old), VirtAddr(new), len, MoveOptions::DEFAULT) {
            Err(e) => {
                assert_eq!(e, Error::OutOfMemory);
                assert_eq!(
                    snapshot(&s),
                    snap,
                    "failure after {k} allocations changed the tables"
                );
                assert_eq!(s.mmu().flushes(), 0);
                // Whatever it allocated it gave back.
                assert_eq!(s.alloc().live(), snap.live);
                assert!(s.alloc().allocs() - allocs <= k);
                k += 1;
            }
            Ok(()) => break,
        }
    }
    s.alloc().fail_after(None);
    // The successful attempt needed exactly `k` tables.
    assert_eq!(k, 1 + 1 + 17);
    assert_eq!(s.alloc().live(), s.inspect().count_tables());
    assert_moved(&snap.leaves, &leaves_in(&s, new, len), old, new);
    assert!(leaves_in(&s, old, len).is_empty());
}

#[test]
fn allocation_failure_in_a_1g_pte_path_move_loses_nothing() {
    let (old, new) = (GIB, 3 * GIB + KIB4);
    let mut s = mapped_pages(old, GIB);
    let snap = snapshot(&s);
    // The move needs 515 tables (513 PTE tables, 2 PMD tables). Fail after
    // every possible number of allocations; compare the full listing at the
    // start, the middle and the end, and cheaper fingerprints everywhere.
    for k in 0..515 {
        s.alloc().fail_after(Some(k));
        s.mmu().reset();
        s.stats().reset();
        let r = s.move_page_tables(VirtAddr(old), VirtAddr(new), GIB, MoveOptions::DEFAULT);
        assert_eq!(r, Err(Error::OutOfMemory), "after {k} allocations");
        assert_eq!(s.alloc().live(), snap.live);
        assert_eq!(s.inspect().count_tables(), snap.tables);
        assert_eq!((s.mmu().flushes(), s.mmu().barriers.get()), (0, 0));
        assert_eq!(s.stats().entries_written(), 0);
        assert_eq!(
            s.translate(VirtAddr(old + k * 2 * KIB4)).unwrap().pa.0,
            PA.0 + k * 2 * KIB4
        );
        assert!(s.translate(VirtAddr(new + k * 2 * KIB4)).is_none());
        if [0, 257, 514].contains(&k) {
            assert_eq!(snapshot(&s), snap);
        }
    }
    s.alloc().fail_after(Some(515));
    s.move_page_tables(VirtAddr(old), VirtAddr(new), GIB, MoveOptions::DEFAULT)
        .unwrap();
    assert_moved(&snap.leaves, &leaves_in(&s, new, GIB), old, new);
    assert_eq!(s.alloc().live(), s.inspect().count_tables());
}

/// A hardware agent that sets accessed and dirty bits in the entries it
/// watches at the moment the TLB flush begins, as a walker that had cached
/// the path to them could (the entries stay reachable to it until the flush
/// completes). It only updates entries that are still valid, as hardware
/// does.
#[derive(Default)]
struct LateAgent {
    watched: std::cell::RefCell<Vec<usize>>,
    updated: Cell<u64>,
    flushes: Cell<u64>,
}

impl LateAgent {
    fn act(&self) {
        for &p in self.watched.borrow().iter() {
            // SAFETY: the watched slots are entries of source tables, which
            // the move frees only after its flush has returned.
            let slot = unsafe { &*(p as *const Slot) };
            let mut cur = slot.load(std::sync::atomic::Ordering::Relaxed);
            while cur & pgtable_core::test_format::VALID != 0 && cur & DIRTY == 0 {
                match slot.compare_exchange(
                    cur,
                    cur | ACCESSED | DIRTY,
                    std::sync::atomic::Ordering::Relaxed,
                    std::sync::atomic::Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        self.updated.set(self.updated.get() + 1);
                        break;
                    }
                    Err(now) => cur = now,
                }
            }
        }
    }
}

// SAFETY: a host test MMU: no hardware walker uses these tables, or it
// forwards to the simulator, which upholds the contract.
unsafe impl Mmu for LateAgent {
    fn walker_barrier(&self) {}
    fn flush_tlb_range(&self, _range: TlbRange) {
        self.act();
        self.flushes.set(self.flushes.get() + 1);
    }
    fn flush_tlb_all(&self) {
        self.act();
        self.flushes.set(self.flushes.get() + 1);
    }
    unsafe fn install_root(&self, _root: PhysAddr) {}
}

#[test]
fn hardware_updates_until_the_flush_reach_the_destination() {
    // Whole source PTE tables (deferred and copied after the flush) and
    // partial ones at both ends (moved entry by entry), on the PTE path.
    let (old, new, len) = (GIB + 64 * KIB4, 3 * GIB + 8 * KIB4, 6 * MIB2);
    let mut s = AddressSpace::<TestFormat, _, _>::new(LateAgent::default(), Arena::new()).unwrap();
    s.map(VirtAddr(old), PA, len, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    let before = leaves_in(&s, old, len);
    let slots: Vec<usize> = (0..len / KIB4)
        .map(|i| {
            // SAFETY: only the address is kept; through it the agent
            // changes accessed/dirty state as the hardware does.
            let slot = unsafe { s.inspect().slot(VirtAddr(old + i * KIB4), 0) };
            slot.unwrap() as *const Slot as usize
        })
        .collect();
    *s.mmu().watched.borrow_mut() = slots;
    s.move_page_tables(VirtAddr(old), VirtAddr(new), len, variants::PTES_ONLY)
        .unwrap();
    assert_eq!(s.mmu().flushes.get(), 1);
    let after = leaves_in(&s, new, len);
    assert_eq!(before.len(), after.len());
    let mut carried = 0;
    for (b, a) in before.iter().zip(&after) {
        assert_eq!((a.va.0, a.pa), (b.va.0 - old + new, b.pa));
        // Either untouched, or exactly the agent's update.
        if a.entry != b.entry {
            assert_eq!(a.entry, b.entry | ACCESSED | DIRTY);
            carried += 1;
        }
    }
    // The agent found the entries of the deferred tables still valid
    // (5 whole tables, less the 4 record slots of each), and every one of
    // its updates arrived at the destination.
    assert_eq!(s.mmu().updated.get(), 5 * 508);
    assert_eq!(carried, s.mmu().updated.get());
    assert_eq!(s.alloc().live(), s.inspect().count_tables());
}

#[test]
fn block_onto_an_existing_empty_destination_table_is_split_into_it() {
    use pgtable_core::contract::Format;
    let (old, new) = (2 * GIB, 6 * GIB + 4 * MIB2);
    let mut s = space();
    s.map(
        VirtAddr(old),
        PA,
        MIB2,
        Prot::READ_WRITE,
        MapOptions::PMD_BLOCKS,
    )
    .unwrap();
    // An empty PTE table already linked at the destination PMD entry (as
    // another user of the tables could leave it), under a PMD table that
    // also maps a page elsewhere.
    let other = 6 * GIB;
    s.map(
        VirtAddr(other),
        PhysAddr(0x7000_0000),
        KIB4,
        Prot::READ_ONLY,
        MapOptions::PAGES,
    )
    .unwrap();
    // SAFETY: the allocator stays; the frame we take is linked below.
    let empty = unsafe { s.alloc_mut() }.alloc_table().unwrap();
    // SAFETY: a table entry for a zeroed frame of this space's allocator,
    // linked nowhere else, into an empty entry; the space is not installed.
    let slot = unsafe { s.inspect().slot(VirtAddr(new), 1) }.unwrap();
    assert_eq!(slot.load(std::sync::atomic::Ordering::Relaxed), 0);
    slot.store(
        TestFormat::<4>::table_entry(empty, 1),
        std::sync::atomic::Ordering::Relaxed,
    );
    assert_eq!(s.alloc().live(), s.inspect().count_tables());

    s.move_page_tables(VirtAddr(old), VirtAddr(new), MIB2, MoveOptions::DEFAULT)
        .unwrap();

    // The block was split into pages that now sit in the existing table.
    let after = leaves_in(&s, new, MIB2);
    assert_eq!(after.len() as u64, MIB2 / KIB4);
    for (i, m) in after.iter().enumerate() {
        assert_eq!(
            (m.va.0, m.pa.0),
            (new + i as u64 * KIB4, PA.0 + i as u64 * KIB4)
        );
    }
    assert_eq!(
        s.inspect().entry(VirtAddr(new), 1),
        Some(TestFormat::<4>::table_entry(empty, 1))
    );
    assert!(leaves_in(&s, old, MIB2).is_empty());
    assert!(s.translate(VirtAddr(other)).is_some());
    assert_eq!(s.alloc().live(), s.inspect().count_tables());
}

// ----- one-step moves (the whole range is one entry or one run) -----

/// Maps one 2 MiB block at `va` (to `pa`).
fn map_block(s: &mut Space, va: u64, pa: u64) {
    s.map(
        VirtAddr(va),
        PhysAddr(pa),
        MIB2,
        Prot::READ_WRITE,
        MapOptions::PMD_BLOCKS,
    )
    .unwrap();
}

#[test]
fn one_block_move_keeps_a_source_table_that_still_maps_something() {
    // Two blocks in one PMD table; the first moves to a fresh part of the
    // space (a PUD table and a PMD table to allocate).
    let (old, other, new) = (2 * GIB, 2 * GIB + MIB2, 600 * GIB);
    let mut s = space();
    map_block(&mut s, old, PA.0);
    map_block(&mut s, other, PA.0 + MIB2);
    s.stats().reset();
    let tables_before = s.inspect().count_tables();

    s.move_page_tables(VirtAddr(old), VirtAddr(new), MIB2, MoveOptions::DEFAULT)
        .unwrap();

    assert_eq!(
        s.translate(VirtAddr(new + 0x1234)).unwrap().pa.0,
        PA.0 + 0x1234
    );
    assert!(s.translate(VirtAddr(old)).is_none());
    assert_eq!(s.translate(VirtAddr(other)).unwrap().pa.0, PA.0 + MIB2);
    assert_eq!(s.inspect().count_tables(), tables_before + 2);
    assert_eq!(
        s.alloc().live(),
        s.inspect().count_tables(),
        "leaked tables"
    );
    assert_eq!(s.mmu().flushes(), 1);
    assert_counted(&s, 1, 2, 0);
}

#[test]
fn one_block_move_frees_the_source_tables_it_empties() {
    // The only mapping under its PUD entry: its PMD table and the PUD
    // table above it (nothing else under that root entry) become empty.
    let (old, new) = (600 * GIB, 2 * GIB);
    let mut s = space();
    map_block(&mut s, old, PA.0);
    // Something under the destination's PUD table, so only the
    // destination PMD table is missing.
    s.map(
        VirtAddr(new + GIB / 2),
        PhysAddr(0x7000_0000),
        KIB4,
        Prot::READ_ONLY,
        MapOptions::PAGES,
    )
    .unwrap();
    s.stats().reset();
    s.mmu().reset();
    let tables_before = s.inspect().count_tables();

    s.move_page_tables(VirtAddr(old), VirtAddr(new), MIB2, MoveOptions::DEFAULT)
        .unwrap();

    assert_eq!(
        s.translate(VirtAddr(new + 0x5678)).unwrap().pa.0,
        PA.0 + 0x5678
    );
    assert!(s.translate(VirtAddr(old)).is_none());
    assert!(
        s.inspect().entry(VirtAddr(old), 2).is_none(),
        "source PUD table kept"
    );
    assert!(s.translate(VirtAddr(new + GIB / 2)).is_some());
    // The destination shares the existing PMD table of the page.
    assert_eq!(s.inspect().count_tables(), tables_before - 2);
    assert_eq!(
        s.alloc().live(),
        s.inspect().count_tables(),
        "leaked tables"
    );
    assert_eq!(s.mmu().flushes(), 1);
    assert_eq!(s.mmu().barriers.get(), 1);
    assert_counted(&s, 1, 0, 2);
}

#[test]
fn one_step_move_onto_a_mapped_destination_is_rejected() {
    let (old, new) = (GIB, 3 * GIB);
    // A whole PUD (or run of PMD entries) onto a page deep inside it.
    let mut s = mapped_pages(old, GIB);
    let page = new + 300 * MIB2 + 7 * KIB4;
    s.map(
        VirtAddr(page),
        PhysAddr(0x7000_0000),
        KIB4,
        Prot::READ_ONLY,
        MapOptions::PAGES,
    )
    .unwrap();
    assert_rejected(&mut s, old, new, GIB, Error::AlreadyMapped(VirtAddr(page)));
    // A block onto a block.
    let mut s = space();
    map_block(&mut s, old, PA.0);
    map_block(&mut s, new, PA.0 + MIB2);
    assert_rejected(&mut s, old, new, MIB2, Error::AlreadyMapped(VirtAddr(new)));
}

#[test]
fn one_step_move_into_an_existing_empty_table_uses_it() {
    use pgtable_core::contract::Format;
    let (old, new) = (GIB, 3 * GIB);
    let mut s = mapped_pages(old, GIB);
    // An empty PMD table already linked at the destination PUD entry: the
    // PUD entry cannot move, the 512 PMD entries move into that table.
    // SAFETY: the allocator stays; the frame we take is linked below.
    let empty = unsafe { s.alloc_mut() }.alloc_table().unwrap();
    // SAFETY: a table entry for a zeroed frame of this space's allocator,
    // linked nowhere else, into an empty entry; the space is not installed.
    let slot = unsafe { s.inspect().slot(VirtAddr(new), 2) }.unwrap();
    assert_eq!(slot.load(std::sync::atomic::Ordering::Relaxed), 0);
    slot.store(
        TestFormat::<4>::table_entry(empty, 2),
        std::sync::atomic::Ordering::Relaxed,
    );
    let before = leaves_in(&s, old, GIB);
    let tables_before = s.inspect().count_tables();

    s.move_page_tables(VirtAddr(old), VirtAddr(new), GIB, MoveOptions::DEFAULT)
        .unwrap();

    assert_moved(&before, &leaves_in(&s, new, GIB), old, new);
    assert!(leaves_in(&s, old, GIB).is_empty());
    assert_eq!(
        s.inspect().entry(VirtAddr(new), 2),
        Some(TestFormat::<4>::table_entry(empty, 2))
    );
    assert_eq!(
        s.alloc().live(),
        s.inspect().count_tables(),
        "leaked tables"
    );
    assert_eq!(s.mmu().flushes(), 1);
    if PMD_ON {
        // The source PMD table is freed, nothing is allocated.
        assert_eq!(s.inspect().count_tables(), tables_before - 1);
        assert_counted(&s, 512, 0, 1);
    }
}

#[test]
fn allocation_failure_in_a_one_step_move_leaves_everything_as_before() {
    // A block to an empty part of the space: a PUD table and a PMD table.
    let (old, new) = (2 * GIB, 600 * GIB);
    let mut s = space();
    map_block(&mut s, old, PA.0);
    let snap = snapshot(&s);
    let mut k = 0;
    loop {
        s.alloc().fail_after(Some(k));
        s.mmu().reset();
        match s.move_page_tables(VirtAddr(old), VirtAddr(new), MIB2, MoveOptions::DEFAULT) {
            Err(e) => {
                assert_eq!(e, Error::OutOfMemory);
                assert_eq!(snapshot(&s), snap, "failure after {k} allocations");
                assert_eq!(s.alloc().live(), snap.live);
                assert_eq!((s.mmu().flushes(), s.mmu().barriers.get()), (0, 0));
                k += 1;
            }
            Ok(()) => break,
        }
    }
    s.alloc().fail_after(None);
    assert_eq!(k, 2);
    assert_eq!(s.translate(VirtAddr(new)).unwrap().pa, PA);
    assert_eq!(s.alloc().live(), s.inspect().count_tables());
}

// ----- whole source PTE tables whose destination tables the move empties -----

/// Moves `[old, old + len)` to `new` with `opts` in a `TestFormat<L>`
/// space holding the 4 KiB pages `pages` (each mapped to `PA` plus its
/// index pages), then checks that every page arrived, the source is empty
/// and no table frame leaked.
fn move_pages<const L: u32>(pages: &[u64], old: u64, new: u64, len: u64, opts: MoveOptions) {
    let mut s = AddressSpace::<TestFormat<L>, _, _>::new(NoopMmu, Arena::new()).unwrap();
    for (i, &va) in pages.iter().enumerate() {
        let pa = PhysAddr(PA.0 + i as u64 * KIB4);
        s.map(VirtAddr(va), pa, KIB4, Prot::READ_WRITE, MapOptions::PAGES)
            .unwrap();
    }
    let r = s.move_page_tables(VirtAddr(old), VirtAddr(new), len, opts);
    assert_eq!(r, Ok(()), "{L} levels, {opts:?}");
    for (i, &va) in pages.iter().enumerate() {
        let pa = PhysAddr(PA.0 + i as u64 * KIB4);
        let at = if (old..old + len).contains(&va) {
            assert!(s.translate(VirtAddr(va)).is_none(), "{va:#x} still mapped");
            va - old + new
        } else {
            va
        };
        let t = s.translate(VirtAddr(at));
        assert_eq!(
            t.map(|t| t.pa),
            Some(pa),
            "{L} levels, {opts:?}: page of {va:#x} at {at:#x}"
        );
    }
    assert_eq!(
        s.alloc().live(),
        s.inspect().count_tables(),
        "{L} levels, {opts:?}: leaked tables"
    );
}

/// Every format depth and move variant.
fn move_pages_everywhere(pages: &[u64], old: u64, new: u64, len: u64) {
    for opts in [
        MoveOptions::DEFAULT,
        variants::PMD_ONLY,
        variants::PTES_ONLY,
    ] {
        move_pages::<3>(pages, old, new, len, opts);
        move_pages::<4>(pages, old, new, len, opts);
        move_pages::<5>(pages, old, new, len, opts);
    }
}

#[test]
fn whole_table_to_a_misaligned_destination_in_the_emptied_pmd_table() {
    // The source PTE table moves whole (copied after the flush); moving it
    // out empties the PMD table (and every table above it) that the
    // destination, 4 MiB further and one page off, hangs from too.
    move_pages_everywhere(&[0x4020_2000], 0x4020_0000, 0x4060_1000, MIB2);
}

#[test]
fn whole_table_into_the_emptied_partly_covered_end_table() {
    // The source ends one page into the PTE table at 0x4040_0000, and the
    // destination starts right after it, in that same table: the whole
    // source table before it lands there, while the page at 0x4040_0000
    // moves out and leaves that table empty.
    move_pages_everywhere(
        &[0x4020_2000, 0x4040_0000],
        0x4020_0000,
        0x4040_1000,
        MIB2 + KIB4,
    );
}
