//! The arm64 formats driven through pgtable-core's `AddressSpace`: the
//! seed-004 barrier batching, map / unmap / translate at every level, and
//! break-before-make when a live block is split.

use crate::common::{Counter, Event, Recorder};
use pgtable_arm64::{Arm64, Arm64Va39};
use pgtable_core::contract::{Arena, Format, Level, Mmu, NoopMmu, TlbRange};
use pgtable_core::{
    variants, AddressSpace, Error, MapOptions, MoveOptions, PhysAddr, Prot, VirtAddr,
};

const GIB: u64 = 1 << 30;
const MIB2: u64 = 2 << 20;
const PAGE: u64 = 4096;

fn space<F: pgtable_core::contract::Arch, M: Mmu>(mmu: M) -> AddressSpace<F, M, Arena> {
    AddressSpace::new(mmu, Arena::new()).unwrap()
}

/// A counting arm64 space with `[1 GiB, 2 GiB)` mapped read-write to the
/// same physical range with `opts`.
fn gib_mapped(opts: MapOptions) -> AddressSpace<Arm64, Counter, Arena> {
    let mut s = space::<Arm64, _>(Counter::default());
    s.map(VirtAddr(GIB), PhysAddr(GIB), GIB, Prot::READ_WRITE, opts)
        .unwrap();
    s
}

#[test]
fn linear_map_of_1g_pages_issues_one_barrier_per_table() {
    let s = gib_mapped(MapOptions::PAGES);
    let pages = GIB / PAGE;
    // 512 PTE tables + 1 PMD table + 1 PUD table were filled, and the root
    // got one entry: one barrier each.
    let tables_written = pages / 512 + 1 + 1 + 1;
    assert_eq!(s.inspect().count_tables() as u64, tables_written);
    assert_eq!(s.mmu().barriers.get(), tables_written);
    assert_eq!(s.stats().barriers(), tables_written);
    assert_eq!(tables_written, 515);
    assert_eq!(s.mmu().flushes.get(), 0, "mapping replaces nothing");
}

#[test]
fn barrier_per_entry_variant_issues_one_per_pte() {
    let mut s = space::<Arm64, _>(Counter::default());
    let opts = variants::barrier_per_entry(MapOptions::PAGES);
    s.map(VirtAddr(GIB), PhysAddr(GIB), GIB, Prot::READ_WRITE, opts)
        .unwrap();
    let pages = GIB / PAGE;
    assert_eq!(pages, 262_144);
    let barriers = s.mmu().barriers.get();
    // One per PTE (set_pte_at of a valid entry) plus the per-table ones.
    assert_eq!(barriers, pages + 515);
    assert_eq!(s.stats().barriers(), barriers);
    assert!(barriers / 515 >= 500, "batched is >= 500x fewer");
}

#[test]
fn lazy_mmu_scope_defers_table_barriers_to_one() {
    let mut s = space::<Arm64, _>(Counter::default());
    s.lazy_mmu(|s| {
        s.map(
            VirtAddr(GIB),
            PhysAddr(GIB),
            64 * MIB2,
            Prot::READ_WRITE,
            MapOptions::PAGES,
        )
        .unwrap();
        s.map(
            VirtAddr(4 * GIB),
            PhysAddr(GIB),
            8 * MIB2,
            Prot::READ_ONLY,
            MapOptions::PAGES,
        )
        .unwrap();
    });
    assert_eq!(s.mmu().barriers.get(), 1);
}

#[test]
fn va39_linear_map_counts_one_barrier_per_table_too() {
    let mut s = space::<Arm64Va39, _>(Counter::default());
    s.map(
        VirtAddr(GIB),
        PhysAddr(GIB),
        GIB,
        Prot::READ_WRITE,
        MapOptions::PAGES,
    )
    .unwrap();
    // 512 PTE tables + 1 PMD table + the root (L1).
    assert_eq!(s.inspect().count_tables(), 514);
    assert_eq!(s.mmu().barriers.get(), 514);
}

fn check_blocks_and_pages<F: pgtable_core::contract::Arch>() {
    let mut s = space::<F, _>(NoopMmu);
    let prot = Prot::WRITE | Prot::GLOBAL;
    // 1 GiB block at 1 GiB, two 2 MiB blocks at 3 GiB, pages at 4 GiB.
    s.map(
        VirtAddr(GIB),
        PhysAddr(2 * GIB),
        GIB,
        prot,
        MapOptions::BLOCKS,
    )
    .unwrap();
    s.map(
        VirtAddr(3 * GIB),
        PhysAddr(0x8020_0000),
        2 * MIB2,
        Prot::READ_EXEC,
        MapOptions::PMD_BLOCKS,
    )
    .unwrap();
    s.map(
        VirtAddr(4 * GIB),
        PhysAddr(0x9000_0000),
        3 * PAGE,
        Prot::READ_ONLY,
        MapOptions::PAGES,
    )
    .unwrap();

    let t = s.translate(VirtAddr(GIB + 0x1234_5678)).unwrap();
    assert_eq!(t.pa, PhysAddr(2 * GIB + 0x1234_5678));
    assert_eq!((t.height, t.level), (2, Level::at_height(2, F::LEVELS)));
    // Hand-written 1 GiB block: 0x1 | 0x300 | 0x400, DBM | PXN | UXN.
    assert_eq!(t.entry, 0x0068_0000_8000_0701);

    let t = s.translate(VirtAddr(3 * GIB + MIB2 + 0x42)).unwrap();
    assert_eq!(t.pa, PhysAddr(0x8040_0042));
    assert_eq!((t.height, t.level), (1, Level::Pmd));
    // 2 MiB block, kernel RX, not global: 0x1|0x80|0x300|0x400|0x800, UXN.
    assert_eq!(t.entry, 0x0040_0000_8040_0f81);

    let t = s.translate(VirtAddr(4 * GIB + 2 * PAGE + 8)).unwrap();
    assert_eq!(t.pa, PhysAddr(0x9000_2008));
    assert_eq!((t.height, t.level), (0, Level::Pte));
    assert_eq!(t.prot, Prot::READ_ONLY);
    assert!(s.translate(VirtAddr(4 * GIB + 3 * PAGE)).is_none());

    let mut sizes = Vec::new();
    s.walk(VirtAddr(0), 8 * GIB, |m| sizes.push(m.size))
        .unwrap();
    assert_eq!(sizes, vec![GIB, MIB2, MIB2, PAGE, PAGE, PAGE]);

    // Unmap everything: only the root is left, nothing leaks.
    s.unmap(VirtAddr(0), 8 * GIB).unwrap();
    assert!(s.translate(VirtAddr(GIB)).is_none());
    assert_eq!(s.inspect().count_tables(), 1);
    assert_eq!(s.alloc().live(), 1);
}

#[test]
fn blocks_and_pages_map_translate_and_unmap_at_every_level_48bit() {
    check_blocks_and_pages::<Arm64>();
}

#[test]
fn blocks_and_pages_map_translate_and_unmap_at_every_level_39bit() {
    check_blocks_and_pages::<Arm64Va39>();
}

#[test]
fn partial_unmap_of_a_1g_block_splits_it_down_to_pages() {
    let mut s = space::<Arm64, _>(NoopMmu);
    s.map(
        VirtAddr(GIB),
        PhysAddr(GIB),
        GIB,
        Prot::READ_WRITE,
        MapOptions::BLOCKS,
    )
    .unwrap();
    let hole = VirtAddr(GIB + 5 * MIB2 + 3 * PAGE);
    s.unmap(hole, PAGE).unwrap();
    assert!(s.translate(hole).is_none());
    let before = s.translate(VirtAddr(hole.0 - PAGE)).unwrap();
    assert_eq!((before.pa, before.height), (PhysAddr(hole.0 - PAGE), 0));
    let after = s.translate(VirtAddr(hole.0 + PAGE)).unwrap();
    assert_eq!((after.pa, after.height), (PhysAddr(hole.0 + PAGE), 0));
    // The rest of the GiB is still 2 MiB blocks with the same attributes.
    let other = s.translate(VirtAddr(GIB + 9 * MIB2)).unwrap();
    assert_eq!((other.pa, other.height), (PhysAddr(GIB + 9 * MIB2), 1));
    assert_eq!(other.prot, Prot::READ_WRITE);
    assert_eq!(before.prot, Prot::READ_WRITE);
    // Root, one PUD table, the PMD table of the split 1 GiB block and the
    // PTE table of the split 2 MiB block.
    assert_eq!(s.inspect().count_tables(), 4);
    let mut n = 0;
    s.walk(VirtAddr(GIB), GIB, |_| n += 1).unwrap();
    assert_eq!(n, 511 + 511);
}

#[test]
fn splitting_a_live_block_uses_break_before_make() {
    let mut s = space::<Arm64, _>(Recorder::default());
    s.map(
        VirtAddr(GIB),
        PhysAddr(GIB),
        MIB2,
        Prot::READ_WRITE,
        MapOptions::BLOCKS,
    )
    .unwrap();
    let block = s.translate(VirtAddr(GIB)).unwrap().entry;
    s.mmu().take();
    s.unmap(VirtAddr(GIB), PAGE).unwrap();
    let log = s.mmu().take();
    // Break (block -> 0), flush the whole block, then make (0 -> table)
    // with its barrier, before the page is cleared.
    assert_eq!(log[0], Event::Write { old: block, new: 0 });
    assert_eq!(
        log[1],
        Event::Flush(TlbRange {
            start: VirtAddr(GIB),
            end: VirtAddr(GIB + MIB2),
            stride_shift: 21,
            last_level: true
        })
    );
    assert!(matches!(log[2], Event::Write { old: 0, .. }));
    assert_eq!(log[3], Event::Barrier);
    assert!(s.translate(VirtAddr(GIB)).is_none());
    assert_eq!(
        s.translate(VirtAddr(GIB + PAGE)).unwrap().pa,
        PhysAddr(GIB + PAGE)
    );
}

#[test]
fn bad_input_is_a_typed_error_and_changes_nothing() {
    let mut s = space::<Arm64, _>(NoopMmu);
    s.map(
        VirtAddr(GIB),
        PhysAddr(GIB),
        MIB2,
        Prot::READ_WRITE,
        MapOptions::BLOCKS,
    )
    .unwrap();
    let tables = s.inspect().count_tables();
    assert!(matches!(
        s.map(
            VirtAddr(GIB + PAGE),
            PhysAddr(0),
            PAGE,
            Prot::READ_WRITE,
            MapOptions::PAGES
        ),
        Err(Error::AlreadyMapped(_))
    ));
    // The hole between the canonical halves.
    assert!(matches!(
        s.map(
            VirtAddr(1 << 47),
            PhysAddr(0),
            PAGE,
            Prot::READ_WRITE,
            MapOptions::PAGES
        ),
        Err(Error::OutOfRange(_))
    ));
    assert_eq!(
        s.map(
            VirtAddr(0),
            PhysAddr(1 << 48),
            PAGE,
            Prot::READ_WRITE,
            MapOptions::PAGES
        ),
        Err(Error::PhysOutOfRange(PhysAddr(1 << 48)))
    );
    let mut s39 = space::<Arm64Va39, _>(NoopMmu);
    assert!(matches!(
        s39.map(
            VirtAddr(1 << 38),
            PhysAddr(0),
            PAGE,
            Prot::READ_WRITE,
            MapOptions::PAGES
        ),
        Err(Error::OutOfRange(_))
    ));
    assert_eq!(s.inspect().count_tables(), tables);
    assert_eq!(s.alloc().live(), tables);
    assert_eq!(s39.inspect().count_tables(), 1);
}

#[test]
fn high_half_addresses_use_the_upper_root_entries() {
    let mut s = space::<Arm64, _>(NoopMmu);
    let hi = VirtAddr(0xffff_8000_0000_0000);
    s.map(
        hi,
        PhysAddr(GIB),
        MIB2,
        Prot::READ_WRITE,
        MapOptions::BLOCKS,
    )
    .unwrap();
    s.map(
        VirtAddr(0),
        PhysAddr(2 * GIB),
        MIB2,
        Prot::READ_WRITE,
        MapOptions::BLOCKS,
    )
    .unwrap();
    assert_eq!(s.translate(hi).unwrap().pa, PhysAddr(GIB));
    assert_eq!(s.translate(VirtAddr(0)).unwrap().pa, PhysAddr(2 * GIB));
    // Root entry 256 is the first one of the TTBR1 half.
    assert!(s.inspect().entry(hi, 3).is_some_and(|e| e != 0));
    assert_eq!(Arm64::VA_BITS, 48);
}

#[test]
fn change_protection_of_blocks_flushes_once_not_per_block() {
    use pgtable_core::variants::GenericBlockProt;
    let len = 64 << 20;
    let mut s = space::<Arm64, _>(Counter::default());
    s.map(
        VirtAddr(GIB),
        PhysAddr(GIB),
        len,
        Prot::READ_WRITE,
        MapOptions::PMD_BLOCKS,
    )
    .unwrap();
    s.change_protection(VirtAddr(GIB), len, Prot::READ_ONLY)
        .unwrap();
    assert_eq!(
        s.mmu().flushes.get(),
        1,
        "pmdp_modify_prot_start: one deferred flush"
    );
    assert_eq!(
        s.translate(VirtAddr(GIB + 0x1234)).unwrap().prot,
        Prot::READ_ONLY
    );

    // Control: the generic pmdp_modify_prot_start flushes every block too.
    let mut g = space::<GenericBlockProt<Arm64>, _>(Counter::default());
    g.map(
        VirtAddr(GIB),
        PhysAddr(GIB),
        len,
        Prot::READ_WRITE,
        MapOptions::PMD_BLOCKS,
    )
    .unwrap();
    g.change_protection(VirtAddr(GIB), len, Prot::READ_ONLY)
        .unwrap();
    assert_eq!(g.mmu().flushes.get(), len / MIB2 + 1);
}

#[test]
fn change_protection_keeps_hardware_dirty_state() {
    let user_rw = Prot::WRITE | Prot::USER;
    let user_ro = Prot::USER;
    let mut s = space::<Arm64, _>(NoopMmu);
    s.map(
        VirtAddr(GIB),
        PhysAddr(GIB),
        2 * PAGE,
        user_rw,
        MapOptions::PAGES,
    )
    .unwrap();
    // The walker dirties the first page (FEAT_HAFDBS clears AP[2]).
    // SAFETY: the leaf gets the update the hardware makes; the space is
    // never installed.
    let slot = unsafe { s.inspect().slot(VirtAddr(GIB), 0) }.unwrap();
    let e = slot.load(std::sync::atomic::Ordering::Relaxed);
    let write = pgtable_core::contract::Access {
        write: true,
        exec: false,
        user: true,
    };
    slot.store(
        Arm64::hw_access(e, 0, write).unwrap(),
        std::sync::atomic::Ordering::Relaxed,
    );
    s.change_protection(VirtAddr(GIB), 2 * PAGE, user_ro)
        .unwrap();
    let dirty = s.translate(VirtAddr(GIB)).unwrap();
    let clean = s.translate(VirtAddr(GIB + PAGE)).unwrap();
    assert_eq!((dirty.prot, clean.prot), (user_ro, user_ro));
    assert!(Arm64::is_dirty(dirty.entry));
    assert!(!Arm64::is_dirty(clean.entry));
    // Writable again: the dirty page is hardware dirty, the clean one clean.
    s.change_protection(VirtAddr(GIB), 2 * PAGE, user_rw)
        .unwrap();
    let dirty = s.translate(VirtAddr(GIB)).unwrap();
    assert!(pgtable_arm64::format::is_hw_dirty(dirty.entry));
    assert!(!Arm64::is_dirty(
        s.translate(VirtAddr(GIB + PAGE)).unwrap().entry
    ));
}

#[test]
fn moving_a_pud_aligned_gib_moves_one_entry_with_move_pud() {
    let mut s = gib_mapped(MapOptions::PAGES);
    let tables = s.inspect().count_tables();
    s.stats().reset();
    s.move_page_tables(VirtAddr(GIB), VirtAddr(4 * GIB), GIB, MoveOptions::DEFAULT)
        .unwrap();
    assert!(s.translate(VirtAddr(GIB + 0x5000)).is_none());
    let t = s.translate(VirtAddr(4 * GIB + 0x5000)).unwrap();
    assert_eq!((t.pa, t.height), (PhysAddr(GIB + 0x5000), 0));
    assert_eq!(s.inspect().count_tables(), tables);
    // The core counts the destination entries that carry a moved mapping
    // or table: one PUD entry, or 512 PMD entries, or 262,144 PTEs.
    let want = if cfg!(feature = "move-pud") {
        1
    } else if cfg!(feature = "move-pmd") {
        512
    } else {
        GIB / PAGE
    };
    assert_eq!(s.stats().entries_written(), want);
}
